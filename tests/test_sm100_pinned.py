"""Chapter 10's kernel, pinned: the static evidence that it is built like the Blackwell GEMMs known to work.

No machine here has a Blackwell GPU, so these CPU-tier tests are what stands between a change and a kernel
that hangs or computes garbage on its first B200. Each expected value is derived from the hardware's rules
(the PTX ISA, our encoders in :mod:`gemmlab.tcgen05`), not copied from the PTX, and the comment next to it
names the working kernel that shows the same value:

* NVIDIA's CuTe DSL example ``examples/python/CuTeDSL/blackwell/dense_gemm_persistent.py`` (BF16, FP32
  accumulate, 2-CTA, 256 x 256 MMA, cluster 2 x 1, TMA store), compiled for sm_100a with DSL 4.8.1 at
  M = N = K = 4096: "the example" below;
* CUTLASS C++ ``sm100_gemm_tma_warpspecialized`` and its ``cute/arch/copy_sm100_tma.hpp``;
* DeepGEMM ``sm100_bf16_gemm.cuh``.
"""
import pytest

from gemmlab.kernels import gemm_sm100 as g
from gemmlab import tcgen05 as t5
from gemmlab.family.configs import ACC_STAGES, BLOCK_K, CTA_M, MMA_K, Sm100Config

#: The heuristic's choice at 4096^3 (and the configuration compared with the example), the narrow tile,
#: FP16, and B stored K x N (N contiguous: the MMA reads B MN-major).
CONFIGS = [Sm100Config(block_n=256, ab_stages=6), Sm100Config(block_n=128, ab_stages=8),
           Sm100Config(block_n=256, ab_stages=6, dtype="float16"), Sm100Config(block_n=256, ab_stages=6, b_major="n")]
IDS = ["bf16-bn256", "bf16-bn128", "fp16-bn256", "bf16-bn256-B-n"]


@pytest.fixture(scope="module", params=list(zip(CONFIGS, IDS)), ids=IDS)
def case(request):
    cfg, _ = request.param
    return cfg, g.static_evidence(g.compile_gemm_sm100("sm_100a", cfg, 4096, 4096, 4096))


def test_instruction_descriptor(case):
    cfg, ev = case
    # kind::f16 idesc (PTX ISA, "Instruction descriptor"): D f32 = 1 at bits 4-5, A/B bf16 = 1 (f16 = 0) at
    # 7-9 / 10-12, B MN-major = 1 at bit 16, N >> 3 at 17-22, M >> 4 at 24-28. M = 256: the pair's MMA.
    ab = 1 if cfg.dtype == "bfloat16" else 0
    want = 1 << 4 | ab << 7 | ab << 10 | (cfg.b_major == "n") << 16 | (cfg.block_n >> 3) << 17 | (256 >> 4) << 24
    assert ev["idesc"] == [want] * (BLOCK_K // MMA_K)
    assert want == t5.InstrDesc(m=256, n=cfg.block_n, a_dtype="bf16" if ab else "f16", b_dtype="bf16" if ab else "f16",
                                b_major="MN" if cfg.b_major == "n" else "K", cta_group=2).encode()
    if cfg == CONFIGS[0]:
        assert want == 0x10400490  # the example's tcgen05.mma carries the same descriptor


def test_shared_memory_descriptor(case):
    cfg, ev = case
    # SM100 descriptor of a K-major, 128B-swizzled operand, start address 0: LBO 16 (field 1 at bit 16),
    # SBO 1024 = one 8-row atom (64 at bit 32), version 1 at bits 46-48, swizzle 128B = 2 at bits 61-63.
    kmajor = 1 << 16 | 64 << 32 | 1 << 46 | 2 << 61
    assert kmajor == t5.smem_desc_kmajor_sw128(0) == 0x4000404000010000  # the example: the same constant
    if cfg.b_major == "k":
        assert ev["smem_desc_or"] == [kmajor, kmajor]  # A's and B's: both K-major
    else:
        assert kmajor in ev["smem_desc_or"] and len(ev["smem_desc_or"]) == 2
        b = t5.SmemDesc.decode(next(x for x in ev["smem_desc_or"] if x != kmajor))
        assert (b.version, b.swizzle, b.base_offset) == (1, "128B", 0)  # still SM100 format, 128B swizzle


def test_tma_barrier_address_mask(case):
    _, ev = case
    # A 2-CTA TMA load signals the *leader's* barrier: in a shared::cluster address bit 24 selects the CTA of
    # the pair, so clearing it names CTA 0's barrier (CUTLASS C++: Sm100MmaPeerBitMask = 0xFEFFFFFF in
    # copy_sm100_tma.hpp); the DSL also clears the 3 low bits (an mbarrier is 8-byte aligned).
    mask = 0xFFFFFFFF & ~(1 << 24) & ~0b111
    assert mask == 0xFEFFFFF8
    assert ev["tma_bar_mask"] and set(ev["tma_bar_mask"]) == {mask}  # the example: the same and.b32, -16777224


def test_barrier_arrival_counts(case):
    cfg, ev = case
    s = cfg.ab_stages
    # Shared memory opens with ab_full[S], ab_empty[S], tmem_full[2], tmem_empty[2], 8 bytes each.
    names = ["ab_full"] * s + ["ab_empty"] * s + ["tmem_full"] * ACC_STAGES + ["tmem_empty"] * ACC_STAGES
    got = {}
    for off, count in ev["barrier_counts"].items():
        got.setdefault(names[off // 8], set()).add(count)
    # ab_full: the leader's one arrive.expect_tx (the bytes do the rest); ab_empty, tmem_full: one
    # tcgen05.commit; tmem_empty: one elected lane of each of 4 epilogue warps in each of 2 CTAs.
    # The example initialises the same 1 / 1 / 1 / 8 (its acc consumer group: 4 warps x 2 CTAs).
    assert got == {"ab_full": {1}, "ab_empty": {1}, "tmem_full": {1}, "tmem_empty": {2 * 4}}
    assert sorted(ev["barrier_counts"]) == [8 * i for i in range(2 * s + 2 * ACC_STAGES)]


def test_commits_multicast_to_both_ctas(case):
    _, ev = case
    assert ev["commit_masks"] == [0b11, 0b11]  # ab_empty[s], tmem_full[a]: CTAs 0 and 1; the example: 3


def test_per_k_block_counts_and_bytes(case):
    cfg, ev = case
    # One k-block = 64 of K = BLOCK_K / MMA_K = 4 tcgen05.mma (K = 16 each) by the leader, one commit
    # releasing the stage (plus one per tile for the accumulator), and in each CTA one 2-CTA TMA load per
    # 128B-swizzle box: a box row is 128 bytes = 64 elements of the contiguous dimension, so K-major A and B
    # take one box each, and an MN-major B (block_n / 2 rows of N per CTA) takes block_n / 2 / 64.
    # The leader's ab_full expects both CTAs' bytes: 2 x (128 + block_n / 2) x 64 x 2 bytes.
    b_boxes = 1 if cfg.b_major == "k" else cfg.block_n // 2 // 64
    assert ev["per_k_block"] == {"mma": 4, "commit": 2, "tma_load": 1 + b_boxes}
    assert ev["expect_tx"] == [2 * (CTA_M + cfg.block_n // 2) * BLOCK_K * 2] == [cfg.tx_bytes]
    if cfg == CONFIGS[0]:
        assert cfg.tx_bytes == 65536  # the example's num_tma_load_bytes at this configuration


def test_setup_and_teardown_order(case):
    _, ev = case
    o = ev["order"]
    # barrier init -> cluster sync -> TMEM alloc (one warp) -> publish (fenced CTA barrier) -> MMAs ...
    # -> final cluster barrier -> relinquish -> dealloc: the order of the example (pipeline_init_wait before
    # tmem.allocate), of CUTLASS C++ and of DeepGEMM (cluster sync after barrier init, then allocate).
    assert len(o["barrier.cluster.wait"]) == 2 and len(o["tcgen05.alloc"]) == 1
    first_wait, last_wait = o["barrier.cluster.wait"]
    assert max(o["mbarrier.init"]) < first_wait < o["tcgen05.alloc"][0] < o["bar.sync 0"][0] < min(o["tcgen05.mma"])
    assert max(o["tcgen05.mma"]) < last_wait < o["tcgen05.relinquish_alloc_permit"][0] < o["tcgen05.dealloc"][0]


def test_producer_tails(case):
    _, ev = case
    # mbarrier waits: TMA warp ab_empty (loop + tail), MMA warp tmem_empty (loop + tail) and ab_full,
    # epilogue tmem_full: 6. Without the two tails (the example's ab_producer.tail() and
    # acc_pipeline.producer_tail(); DeepGEMM's wait on the last accumulator-empty) there would be 4.
    assert ev["waits"] == 6


def test_evidence_reader_rejects_what_it_cannot_read():
    with pytest.raises(RuntimeError, match="PTX"):
        g.static_evidence(type("Compiled", (), {"__ptx__": ""})())


@pytest.mark.parametrize("cfg", CONFIGS[:2], ids=IDS[:2])
def test_epilogue_waits_for_its_tmem_loads(cfg):
    # tcgen05.ld is asynchronous (PTX ISA, "tcgen05.wait"): tcgen05.wait::ld must follow the loads before
    # their registers are read and before tmem_empty tells the MMA warp it may overwrite the accumulator.
    # NVIDIA's dense_gemm_persistent example does the same (fence_view_async_tmem_load after the copy).
    from gemmlab.compile import ptx_of

    lines = [ln.strip() for ln in ptx_of(g.compile_gemm_sm100("sm_100a", cfg, 4096, 4096, 4096)).splitlines()]
    loads = [i for i, ln in enumerate(lines) if ln.startswith("tcgen05.ld")]
    waits = [i for i, ln in enumerate(lines) if ln.startswith("tcgen05.wait::ld")]
    assert loads and len(waits) >= 1
    for i in loads:  # every load has a wait after it, before the next load's registers are converted
        assert any(w > i for w in waits), f"no tcgen05.wait::ld after the load at PTX line {i}"
    arrive = max(i for i, ln in enumerate(lines) if ln.startswith("mbarrier.arrive") and i > loads[-1])
    assert any(loads[-1] < w < arrive for w in waits)
