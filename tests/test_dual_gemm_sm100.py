"""Chapter 11's SM100 kernel: compile-verified for sm_100a here (PTX read back); correctness on a B200 only.

What these tests prove without a B200: the kernel compiles for sm_100a at every shape used
(the test shapes and the four benchmark shapes), and its PTX holds the block-scaled MMA
with the instruction descriptor we expect field by field, the scale copies to TMEM at the
columns of :func:`gemmlab.dual_gemm_model.tmem_columns`, two accumulators at distinct
columns, ACCUMULATE off at a tile's first MMAs, the barrier counts and the set-up order.
What they cannot prove: that the numbers are right. ``test_matches_reference_with_poisoned_output``
(marked ``sm100``) checks that on a B200; it has not run yet.
"""
import pytest

torch = pytest.importorskip("torch")

from gemmlab import dual_gemm_model as model  # noqa: E402
from gemmlab.kernels import dual_gemm_sm100 as d  # noqa: E402
from gemmlab import nvfp4 as fp4  # noqa: E402
from gemmlab.compile import ptx_lines  # noqa: E402
from gemmlab.family.configs import DualSm100Config  # noqa: E402
from gemmlab.tiers import TierError, detect_tier  # noqa: E402

SHAPES = list(fp4.TEST_SHAPES) + list(fp4.BENCHMARK_SHAPES)
CFG = DualSm100Config()
CONFIGS = [CFG, DualSm100Config(tile_n=64, stages=model.max_stages(64))]
CASES = [(cfg, shape) for cfg in CONFIGS for shape in SHAPES]
CASE_IDS = [f"n{cfg.tile_n}s{cfg.stages}-{m}x{n}x{k}" for cfg, (m, n, k) in CASES]

# NVIDIA's CuTe DSL example examples/python/CuTeDSL/cute/blackwell/kernel/blockscaled_gemm/
# dense_blockscaled_gemm_persistent.py (NVIDIA/cutlass, commit 7107b0553), compiled here for sm_100a with
# the same configuration (NVF4: Float4E2M1FN, Float8E4M3FN scales, sf_vec_size 16, mma_tiler 128 x 128,
# cluster 1 x 1, FP16 C) and read with static_evidence, gives:
#   opcode   tcgen05.mma.cta_group::1.kind::mxf4nvf4.block_scale.block16.collector::a::discard
#   idesc    0x08200480 (constant part; a_sf_id / b_sf_id ORed in at run time as (sfa >> 1) & 0x60000000
#            and (sfb >> 26) & 0x30, i.e. bits 31:30 of the scale TMEM addresses)
#   SFA at TMEM column 256 + 4 * step, SFB at 272 + 4 * step (after 256 accumulator columns),
#   tcgen05.cp.cta_group::1.32x128b.warpx4 to columns 256, 260, 264, 268 (SFA) and 272 .. 284 (SFB),
#   tcgen05.alloc of 512 columns.
# Our kernel at tile_n = 128 has the same opcode, descriptor, run-time SF-ID fields and the same SFA and
# SFB1 columns (its 256 accumulator columns are acc1 and acc2); SFB2 follows at 288.
# The same example at mma_tiler 128 x 64 gives idesc 0x08100480, SFA at 128 + 4 * step, SFB at 144 + 4 * step
# plus a run-time term (n_tile % 2) * 2 (PTX: rem of the tile index, shl 1, added to the SFB address), loads
# 128-row SFB atoms (its second MMA shape of N 128); ours at tile_n = 64 has the same descriptor, columns and
# shift (sfb_atom_and_shift), with SFB2 at 160.
NVIDIA_EXAMPLE_IDESC_128x128 = 0x08200480
NVIDIA_EXAMPLE_SFA_COLS = (256, 260, 264, 268)
NVIDIA_EXAMPLE_SFB_COLS = (272, 276, 280, 284)
NVIDIA_EXAMPLE_IDESC_128x64 = 0x08100480
NVIDIA_EXAMPLE_SFA_COLS_N64 = (128, 132, 136, 140)
NVIDIA_EXAMPLE_SFB_COLS_N64 = (144, 148, 152, 156)


@pytest.fixture(scope="module")
def evidence():
    cache = {}

    def get(shape, cfg=CFG):
        if (cfg, shape) not in cache:
            cache[cfg, shape] = d.static_evidence(d.compile_dual_sm100("sm_100a", cfg, *shape))
        return cache[cfg, shape]

    return get


# ---------------------------------------------------------------- the descriptor encoder


def test_idesc_encoder_field_by_field():
    v = d.encode_block_scaled_idesc(128, 128)
    assert v == NVIDIA_EXAMPLE_IDESC_128x128
    f = d.decode_block_scaled_idesc(v)
    assert (f["a_format"], f["b_format"]) == (d.E2M1_FORMAT, d.E2M1_FORMAT) == (1, 1)
    assert f["scale_format"] == d.SCALE_UE4M3 == 0  # e4m3 scales (NVFP4), not e8m0
    assert (f["M"], f["N"], f["m_dim"], f["n_dim"]) == (128, 128, 8, 16)
    assert f["a_major"] == f["b_major"] == 0  # both K-major
    assert f["negate_a"] == f["negate_b"] == f["sparse"] == f["k_size"] == 0  # dense, K = 64
    assert f["a_sf_id"] == f["b_sf_id"] == f["reserved"] == 0
    assert d.decode_block_scaled_idesc(d.encode_block_scaled_idesc(128, 64))["N"] == 64
    assert d.encode_block_scaled_idesc(128, 128, a_sf_id=2, b_sf_id=1) == v | (2 << 29) | (1 << 4)
    assert d.decode_block_scaled_idesc(v | (2 << 29) | (1 << 4)) == {**f, "a_sf_id": 2, "b_sf_id": 1}
    assert d.decode_block_scaled_idesc(v | (1 << 23))["scale_format"] == 1  # UE8M0 (MXFP4) would set bit 23
    assert d.decode_block_scaled_idesc(v | (1 << 6))["reserved"] == 1 << 6


def test_idesc_encoder_rejects_bad_fields():
    with pytest.raises(ValueError, match="n must be a multiple of 8"):
        d.encode_block_scaled_idesc(128, 100)
    with pytest.raises(ValueError, match="m must be"):
        d.encode_block_scaled_idesc(32, 128)
    with pytest.raises(ValueError, match="a_sf_id must fit in 2 bits"):
        d.encode_block_scaled_idesc(128, 128, a_sf_id=4)
    with pytest.raises(ValueError, match="value must be"):
        d.decode_block_scaled_idesc(1 << 32)


# ---------------------------------------------------------------- configuration


def test_config_is_validated_against_the_model_budget():
    assert CFG.tile_n == 128 and CFG.stages <= model.max_stages(128)
    assert CFG.tmem == model.tmem_columns(128)
    assert CFG.tx_bytes == 128 * 128 + 2 * 128 * 128 + 3 * 4 * fp4.ATOM_BYTES  # A, B1, B2 + 12 scale atoms
    DualSm100Config(stages=model.max_stages(128))
    with pytest.raises(ValueError, match="stages must be at most"):
        DualSm100Config(stages=model.max_stages(128) + 1)
    with pytest.raises(ValueError, match="stages must be >= 1"):
        DualSm100Config(stages=0)
    assert DualSm100Config(tile_n=64).tmem == model.tmem_columns(64)
    for tile_n in (192, 256, 96):
        with pytest.raises(ValueError, match=r"tile_n must be one of \(64, 128\)"):
            DualSm100Config(tile_n=tile_n)
    with pytest.raises(ValueError, match="tile_n must be a multiple of 16"):
        DualSm100Config(tile_n=100)
    with pytest.raises(ValueError, match="num_ctas must be >= 1"):
        DualSm100Config(num_ctas=0)


def test_compile_rejects_bad_arguments():
    with pytest.raises(ValueError, match="needs target sm_100a"):
        d.compile_dual_sm100("sm_90a", None, 256, 256, 512)
    with pytest.raises(ValueError, match="target must be one of"):
        d.compile_dual_sm100("sm_120a", None, 256, 256, 512)
    with pytest.raises(ValueError, match="K must be a multiple of 256"):
        d.compile_dual_sm100("sm_100a", None, 256, 256, 320)
    with pytest.raises(ValueError, match="N must be a multiple of 8"):
        d.compile_dual_sm100("sm_100a", None, 256, 100, 512)
    with pytest.raises(ValueError, match="M must be >= 1"):
        d.compile_dual_sm100("sm_100a", None, 0, 256, 512)
    with pytest.raises(TypeError, match="cfg must be a DualSm100Config"):
        d.compile_dual_sm100("sm_100a", (128, 3), 256, 256, 512)


# ---------------------------------------------------------------- the PTX, at every shape used


@pytest.mark.parametrize("cfg,shape", CASES, ids=CASE_IDS)
def test_block_scaled_mmas_descriptor_and_tmem_columns(evidence, cfg, shape):
    ev = evidence(shape, cfg)
    cols = model.tmem_columns(cfg.tile_n)
    mmas = ev["mma"]
    # per k-block: 4 MMA steps (K = 64 each) x 2 GEMMs, A shared, SFB switched
    assert ev["mma_per_k_block"] == len(mmas) == 2 * model.STEPS
    for m in mmas:
        # .block16 is the PTX ISA 8.8 spelling of scale_vec::4X for mxf4nvf4: one e4m3 scale per 16 values,
        # four per row of a K = 64 MMA (accepted: either spelling)
        assert m["opcode"].startswith("tcgen05.mma.cta_group::1.kind::mxf4nvf4.block_scale.")
        assert m["opcode"].split(".")[5] in ("block16", "scale_vec::4X"), m["opcode"]
        assert m["idesc"] == d.encode_block_scaled_idesc(model.TILE_M, cfg.tile_n)
        assert d.decode_block_scaled_idesc(m["idesc"])["N"] == cfg.tile_n
        # the SF-ID fields come from bits 31:30 of the scale addresses (0 for our lane-0 addresses)
        assert m["sf_id_from"] == {"sfa": (1, 0x60000000), "sfb": (26, 0x30)}
        assert not m["runtime_terms"]  # D and SFA at fixed columns
        # tile_n 64: an odd tile's B rows are rows 64..127 of the loaded scale atom -> SFB moved at run time
        assert m["sfb_runtime_shift"] == (cfg.tile_n == 64)
    for step in range(model.STEPS):
        g1, g2 = mmas[2 * step], mmas[2 * step + 1]
        assert (g1["d_col"], g2["d_col"]) == (cols["acc1"], cols["acc2"]) == (0, cfg.tile_n)  # two accumulators
        assert g1["sfa_col"] == g2["sfa_col"] == cols["sfa"] + 4 * step  # the same A scales for both GEMMs
        assert g1["sfb_col"] == cols["sfb1"] + 4 * step
        assert g2["sfb_col"] == cols["sfb2"] + 4 * step  # SFB switched for GEMM 2
    # the configurations compiled from NVIDIA's example (see the top of this file)
    idesc, sfa_cols, sfb_cols = {128: (NVIDIA_EXAMPLE_IDESC_128x128, NVIDIA_EXAMPLE_SFA_COLS, NVIDIA_EXAMPLE_SFB_COLS),
                                 64: (NVIDIA_EXAMPLE_IDESC_128x64, NVIDIA_EXAMPLE_SFA_COLS_N64,
                                      NVIDIA_EXAMPLE_SFB_COLS_N64)}[cfg.tile_n]
    assert all(m["idesc"] == idesc for m in mmas)
    assert [m["sfa_col"] for m in mmas[::2]] == list(sfa_cols)
    assert [m["sfb_col"] for m in mmas[::2]] == list(sfb_cols)


@pytest.mark.parametrize("cfg,shape", CASES, ids=CASE_IDS)
def test_accumulate_off_only_at_the_tiles_first_mmas(evidence, cfg, shape):
    mmas = evidence(shape, cfg)["mma"]
    k_blocks = shape[2] // model.K_BLOCK
    first = [0] if k_blocks == 1 else [-1, 0]  # a loop-carried predicate: 0 at the tile's start, then true
    assert mmas[0]["accumulate"] == mmas[1]["accumulate"] == first
    assert all(m["accumulate"] == [-1] for m in mmas[2:])


@pytest.mark.parametrize("cfg,shape", CASES, ids=CASE_IDS)
def test_scales_copied_to_tmem_with_tcgen05_cp(evidence, cfg, shape):
    ev = evidence(shape, cfg)
    cols = model.tmem_columns(cfg.tile_n)
    cps = ev["tcgen05_cp"]
    assert {c["opcode"] for c in cps} == {"tcgen05.cp.cta_group::1.32x128b.warpx4"}
    # one 512-byte atom (32 lanes x 4 columns, replicated to the 4 sub-partitions) per MMA step and scale tensor
    want = [base + 4 * s for base in (cols["sfa"], cols["sfb1"], cols["sfb2"]) for s in range(model.STEPS)]
    assert [c["col"] for c in cps] == want and not any(c["runtime"] for c in cps)
    assert max(want) + 4 == cols["used"] <= cols["alloc"] == ev["tmem_alloc"][0]


@pytest.mark.parametrize("cfg,shape", CASES, ids=CASE_IDS)
def test_barriers_loads_and_stores(evidence, cfg, shape):
    ev = evidence(shape, cfg)
    s = cfg.stages
    # ab_full[s], ab_empty[s]: 1 each (expect_tx; one tcgen05.commit); tmem_full: 1; tmem_empty: 4 epilogue warps
    assert ev["barrier_counts"] == {**{8 * i: 1 for i in range(2 * s + 1)}, 8 * (2 * s + 1): d.EPILOGUE_WARPS}
    assert ev["expect_tx"] == [cfg.tx_bytes] == [model.budget(cfg.tile_n, s).smem_stage_bytes]
    assert ev["tma_loads"] == 6  # A, B1, B2, SFA, SFB1, SFB2
    assert ev["tma_stores"] == cfg.tile_n // model.EPI_N  # one 32 x 32 box per warp per slice
    assert len(ev["order"]["tcgen05.ld"]) == 2 * (cfg.tile_n // model.EPI_N)  # both accumulators per slice


def test_set_up_and_teardown_order(evidence):
    o = evidence(SHAPES[1])["order"]
    assert len(o["tcgen05.alloc"]) == len(o["tcgen05.relinquish_alloc_permit"]) == len(o["tcgen05.dealloc"]) == 1
    assert len(o["bar.sync 0"]) == 2  # publish the TMEM address; the final barrier. None per sub-tile.
    assert max(o["mbarrier.init"]) < o["barrier.cluster.wait"][0] < o["tcgen05.alloc"][0] < o["bar.sync 0"][0]
    assert o["bar.sync 0"][0] < min(o["tcgen05.cp"]) < min(o["tcgen05.mma"]) < min(o["tcgen05.ld"])
    assert max(o["tcgen05.ld"]) < o["bar.sync 0"][1] < o["tcgen05.relinquish_alloc_permit"][0] \
        < o["tcgen05.dealloc"][0]


@pytest.mark.parametrize("cfg", CONFIGS, ids=[f"n{c.tile_n}" for c in CONFIGS])
def test_tmem_loads_are_waited_for_before_use_and_release(evidence, cfg):
    o = evidence(SHAPES[1], cfg)["order"]
    lds, waits, arrive = o["tcgen05.ld"], o["tcgen05.wait::ld"], o["tmem_empty arrive"]
    assert len(waits) == len(lds) // 2 == cfg.tile_n // model.EPI_N  # one wait per slice (acc1 and acc2 loads)
    for j, w in enumerate(waits):
        assert lds[2 * j] < lds[2 * j + 1] < w  # both loads of the slice, then the wait
        assert j + 1 == len(waits) or w < lds[2 * j + 2]
    assert len(arrive) == 1 and waits[-1] < arrive[0]  # accumulators read completely before tmem_empty


def test_epilogue_has_no_cta_wide_barrier_per_subtile():
    c = d.compile_dual_sm100("sm_100a", None, 256, 256, 512)
    assert all(x.split()[1].rstrip(";,") == "0" for x in ptx_lines(c, r"^bar(rier)?\.sync"))  # no named barriers
    assert ptx_lines(c, r"^bar\.warp\.sync")  # each epilogue warp syncs only itself before its TMA store
    assert ptx_lines(c, r"^fence\.proxy\.async\.shared::cta")
    assert ptx_lines(c, r"^cp\.async\.bulk\.wait_group\.read\s+1;")  # C_STAGES - 1 stores in flight per warp
    assert ptx_lines(c, r"^cp\.async\.bulk\.wait_group\s+0;")  # every store has landed before the CTA exits


# ---------------------------------------------------------------- the public function: checks first


def test_bad_input_is_rejected_before_the_tier_check():
    ops = fp4.generate(128, 128, 512)
    a, b1, b2, sfa, sfb1, sfb2 = ops.inputs()
    with pytest.raises(TypeError, match="sfa must have dtype float8_e4m3fn"):
        d.gated_dual_gemm_sm100(a, b1, b2, sfa.float(), sfb1, sfb2)
    with pytest.raises(TypeError, match="a must hold packed FP4"):
        d.gated_dual_gemm_sm100(fp4.as_bytes(a).float(), b1, b2, sfa, sfb1, sfb2)
    with pytest.raises(ValueError, match="K must be a multiple of 256"):
        d.gated_dual_gemm_sm100(*(fp4.as_bytes(t)[:, :192] for t in (a, b1, b2)),  # K = 384
                                *(s[:, :24] for s in (sfa, sfb1, sfb2)))
    with pytest.raises(ValueError, match="N must be a multiple of 8"):
        d.gated_dual_gemm_sm100(a, *(fp4.as_bytes(t)[:100] for t in (b1, b2)), sfa, sfb1[:100], sfb2[:100])
    with pytest.raises(ValueError, match="out must have shape"):
        d.gated_dual_gemm_sm100(a, b1, b2, sfa, sfb1, sfb2, out=torch.empty(128, 64, 1, dtype=torch.float16))
    with pytest.raises(TypeError, match="out must have dtype float16"):
        d.gated_dual_gemm_sm100(a, b1, b2, sfa, sfb1, sfb2, out=torch.empty(128, 128, 1))
    with pytest.raises(ValueError, match="out must be row-major"):
        d.gated_dual_gemm_sm100(a, b1, b2, sfa, sfb1, sfb2,
                                out=torch.empty(128, 128, 1, dtype=torch.float16).transpose(0, 1))
    with pytest.raises(TypeError, match="cfg must be a DualSm100Config"):
        d.gated_dual_gemm_sm100(a, b1, b2, sfa, sfb1, sfb2, cfg="fast")


@pytest.mark.skipif(detect_tier() == "sm100", reason="checks the refusal on a machine without a B200")
def test_other_tiers_refuse_to_launch():
    ops = fp4.generate(128, 128, 256)
    with pytest.raises(TierError, match="tier sm100"):
        d.gated_dual_gemm_sm100(*ops.inputs())


# ---------------------------------------------------------------- on a B200 (not run yet)


@pytest.mark.gpu
@pytest.mark.sm100
@pytest.mark.parametrize("cfg,shape", CASES, ids=CASE_IDS)
def test_matches_reference_with_poisoned_output(cfg, shape):
    ops = fp4.generate(*shape, seed=11, device="cuda")
    out = ops.c  # NaN everywhere: an element the kernel does not write fails the check
    assert torch.isnan(out.float()).all()
    d.gated_dual_gemm_sm100(*ops.inputs(), out=out, cfg=cfg)
    torch.cuda.synchronize()
    ref = fp4.reference(*ops.inputs())
    res = fp4.check_close(out, ref)
    assert res.ok, f"{shape}: {res}"


# ---------------------------------------------------------------- agreement with the CPU model


@pytest.mark.parametrize("tile_n,stages", [(128, 1), (128, 2), (128, 3), (64, 5)])
def test_shared_memory_requested_fits_the_models_budget(tile_n, stages):
    from gemmlab.kernels.gemm_sm100 import launch_smem_bytes

    cfg = DualSm100Config(tile_n=tile_n, stages=stages)
    b = model.budget(cfg.tile_n, stages)
    got = launch_smem_bytes(d.compile_dual_sm100("sm_100a", cfg, 256, 256, 512))
    assert stages * b.smem_stage_bytes + b.smem_c_bytes <= got <= b.smem_total  # ring + C staging + barriers
    assert d.EPILOGUE_WARPS * model.C_STAGES * d.WARP_ROWS * model.EPI_N * 2 == b.smem_c_bytes  # per-warp staging


def test_tile_order_and_sizes_are_the_models():
    import inspect

    defaults = inspect.signature(model.run_model).parameters
    assert (d.RASTER, d.GROUP_M) == (defaults["raster"].default, defaults["group"].default)
    assert (d.TILE_M, d.K_BLOCK, d.MMA_K, d.STEPS) == (model.TILE_M, model.K_BLOCK, model.MMA_K, model.STEPS)
    assert (d.EPI_N, d.C_STAGES) == (model.EPI_N, model.C_STAGES)


def test_gate_uses_fast_exp_and_reciprocal_then_fp16():
    c = d.compile_dual_sm100("sm_100a", None, 256, 256, 512)
    slices = CFG.tile_n // model.EPI_N
    per_thread = slices * model.EPI_N  # one row of the tile per thread
    assert len(ptx_lines(c, r"^ex2\.approx\.ftz\.f32")) == per_thread
    assert len(ptx_lines(c, r"^rcp\.approx\.ftz\.f32")) == per_thread
    assert not ptx_lines(c, r"^div\.rn\.f32")  # no IEEE division in the epilogue
    assert ptx_lines(c, r"^cvt\.rn\.f16x2\.f32|^cvt\.rn\.f16\.f32")


def test_compile_refuses_when_expect_tx_differs_from_the_tma_boxes(monkeypatch):
    # the host compares the model's bytes per stage with the DSL's TMA boxes; a mismatch would hang ab_full
    monkeypatch.setattr(DualSm100Config, "tx_bytes", property(lambda self: 55296 + 16))
    d.dual_host.cache_clear()
    try:
        with pytest.raises(Exception, match="the TMA boxes of a stage hold 55296 bytes"):
            d.compile_dual_sm100("sm_100a", None, 128, 64, 256)
    finally:
        d.dual_host.cache_clear()


def test_notebook_helpers():
    c = d.compile_dual_sm100("sm_100a", None, 256, 256, 512)
    assert d.setup_order(c) == ["mbarrier.init (last)", "barrier.cluster.wait", "tcgen05.alloc", "bar.sync 0",
                                "bar.sync 0", "tcgen05.relinquish_alloc_permit", "tcgen05.dealloc"]
    text = "\n".join(d.evidence_summary(c))
    assert "0x08200480: M 128, N 128, A E2M1 K-major, B E2M1 K-major, scales UE4M3, dense" in text
    assert "SFB columns (GEMM 2) 288, 292, 296, 300" in text and "run-time shift" not in text
    from gemmlab.course.show import numbered_sections, show_numbered_section

    secs = numbered_sections(d.dual_kernel)
    assert [t.split(".")[0] for t in secs] == [str(i) for i in range(8)]
    assert "alloc_tmem" in secs["4. TMEM allocation"] and "tma_worker" in secs["6. The roles"]
    with pytest.raises(ValueError, match="no section 9"):
        show_numbered_section(d.dual_kernel, 9)


@pytest.mark.parametrize("tile_n", d.TILE_N_SUPPORTED)
def test_sfb_atom_and_shift_is_the_models_row_arithmetic(tile_n):
    # dual_gemm_model.run_model: row_block_b = nt * tile_n // 128, shift = (nt * tile_n) % 128 rows, and the
    # MMA reads row n of the tile from column (shift + n) % 128 // 32 of the step's 4
    for nt in range(12):
        atom, cols = d.sfb_atom_and_shift(nt, tile_n)
        assert atom == nt * tile_n // fp4.ATOM_MN
        assert cols == (nt * tile_n) % fp4.ATOM_MN // 32
    assert [d.sfb_atom_and_shift(nt, 64)[1] for nt in range(4)] == [0, 2, 0, 2]
