"""Chapter 05: the warp-specialized TMA pipeline (row scale + cast).

CPU: the PTX of both designs holds the TMA loads and stores, expect_tx and
try_wait.parity, in the order the pipeline needs, and the spin variant's
clock loop sits between the wait on a stage and its release; every bad input
raises before any launch. GPU: both designs (with and without synthetic
compute) against torch on random data with partial tiles, outputs poisoned
before each run.
"""
from __future__ import annotations

import re

import pytest
import torch

from gemmlab import figures
from gemmlab import tma_pipeline as tp
from gemmlab.measure import tma_pipeline as mtp
from gemmlab.compile import ptx_lines, ptx_of, ptx_opcodes
from gemmlab.compile import line_index as _index

# ---------------------------------------------------------------------------
# CPU: compile-only PTX
# ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ptx():
    return {d: ptx_of(tp.compile_row_scale("sm_90a", shape=(77, 1000), design=d)) for d in tp.DESIGNS}


def _norm(lines):
    """PTX lines with runs of whitespace (tabs) as one space."""
    return [re.sub(r"\s+", " ", line) for line in lines]




@pytest.mark.parametrize("design", tp.DESIGNS)
def test_ptx_has_tma_pipeline_instructions(ptx, design):
    ops = ptx_opcodes(ptx[design], r"^cp\.async\.bulk", r"^mbarrier", r"^fence", r"^bar\.sync", r"^elect")
    assert any(re.match(r"cp\.async\.bulk\.tensor\.2d\.shared::cta\.global\.tile\.mbarrier::complete_tx::bytes", o)
               for o in ops), ops
    assert any(re.match(r"cp\.async\.bulk\.tensor\.2d\.global\.shared::cta\.tile\.bulk_group", o) for o in ops), ops
    for op in ("mbarrier.init.shared.b64", "mbarrier.arrive.expect_tx.shared.b64", "mbarrier.try_wait.parity.shared.b64",
               "mbarrier.arrive.shared.b64", "fence.proxy.async.shared::cta;", "cp.async.bulk.commit_group;",
               "cp.async.bulk.wait_group.read", "cp.async.bulk.wait_group", "elect.sync"):
        assert op in ops, op
    # With two y buffers the storing thread waits until no older store still reads shared memory.
    assert set(_norm(ptx_lines(ptx[design], r"^cp\.async\.bulk\.wait_group\.read"))) == {
        "cp.async.bulk.wait_group.read 0;"}
    # The consumers synchronise among themselves on named barrier 1 (128 threads), never on barrier 0 in the loop.
    assert "bar.sync 1, 128;" in _norm(ptx_lines(ptx[design], r"^bar\.sync"))


@pytest.mark.parametrize("design", tp.DESIGNS)
def test_ptx_orders_consumer_writes_fence_barrier_store(ptx, design):
    lines = _norm(ptx_lines(ptx[design], r"."))
    first_ld = _index(lines, r"^ld\.shared\.v4")
    # The consumer's wait on full[s] is the last try_wait before it reads the stage.
    wait = max(i for i in range(first_ld) if lines[i].startswith("mbarrier.try_wait"))
    release = _index(lines, r"^mbarrier\.arrive\.shared", first_ld)
    st = _index(lines, r"^st\.shared\.v4", release)
    fence = _index(lines, r"^fence\.proxy\.async\.shared::cta", st)
    bar = _index(lines, r"^bar\.sync\s+1, 128", fence)
    _index(lines, r"^cp\.async\.bulk\.tensor\.2d\.global\.shared::cta", bar)
    assert wait < first_ld < release < st < fence < bar
    # The kernel ends by waiting for every store to complete.
    assert _norm(ptx_lines(ptx[design], r"^cp\.async\.bulk\.wait_group\s"))[-1] == "cp.async.bulk.wait_group 0;"


def test_unrolled_design_has_constant_stages_and_dummy_arrives(ptx):
    # Unrolled with 1000 columns = 4 k-iterations of 256 for 4 stages: no tail, four loads per group.
    carried = ptx_lines(ptx["carried"], r"^cp\.async\.bulk\.tensor\.2d\.shared::cta")
    unrolled = ptx_lines(ptx["unrolled"], r"^cp\.async\.bulk\.tensor\.2d\.shared::cta")
    assert len(carried) == 1 and len(unrolled) == 4
    # k_tiles = 5 (1200 columns) with 4 stages: 5 loads and 3 arrives on full without data in the producer.
    tail = tp.compile_row_scale("sm_90a", shape=(77, 1200), design="unrolled")
    assert len(ptx_lines(tail, r"^cp\.async\.bulk\.tensor\.2d\.shared::cta")) == 5
    assert len(ptx_lines(tail, r"^mbarrier\.arrive\.expect_tx")) == 5
    # The consumers' arrives on empty: 5 real (each after reading) + 3 for the empty tail slots.
    assert len(ptx_lines(tail, r"^mbarrier\.arrive\.shared")) >= 5 + 3 + 3


@pytest.mark.parametrize("design", tp.DESIGNS)
def test_spin_variant_holds_each_stage_before_reading_it(design):
    # spin_cycles > 0: after the wait on full[s], a %clock64 loop, then the stage is read and released.
    c = tp.compile_row_scale("sm_90a", shape=(77, 1200), design=design, spin_cycles=1000)
    lines = _norm(ptx_lines(c, r"."))
    clocks = [i for i, line in enumerate(lines) if "%clock64" in line]
    # Two reads per spin loop (start, then in the loop); one loop per k-iteration in the code.
    assert len(clocks) == 2 * (1 if design == "carried" else 5)
    assert any(re.match(r"setp\.lt\.s64 .*, 1000;", line) for line in lines)
    first = clocks[0]
    wait = max(i for i in range(first) if lines[i].startswith("mbarrier.try_wait"))
    read = _index(lines, r"^ld\.shared\.v4", first)
    release = _index(lines, r"^mbarrier\.arrive\.shared", read)
    assert wait < first < read < release
    # Without spin there is no clock read at all: spin_cycles = 0 is the plain kernel.
    assert ptx_lines(tp.compile_row_scale("sm_90a", shape=(77, 1200), design=design), r"%clock64") == []


def test_row_scales_are_prefetched_a_tile_ahead(ptx):
    # The consumers load the first tile's scales before the loop and the next tile's in it: 2 x passes
    # global loads, passes = 32 x 256 bfloat16 per box / (8 per 16-byte read x 128 threads) = 8.
    assert len(ptx_lines(ptx["carried"], r"^ld\.global")) == 2 * 8


def test_spin_errors():
    with pytest.raises(ValueError, match="spin_cycles must be >= 0"):
        tp.compile_row_scale("sm_90a", spin_cycles=-1)
    with pytest.raises(TypeError, match="spin_cycles must be an int"):
        tp.compile_row_scale("sm_90a", spin_cycles=1.5)
    with pytest.raises(ValueError, match="spin_cycles must be <= "):
        tp.compile_row_scale("sm_90a", spin_cycles=tp.MAX_SPIN_CYCLES + 1)


def test_casts_compile_to_vector_shared_accesses():
    f32_to_bf16 = tp.compile_row_scale("sm_90a", shape=(64, 512), dtype="float32", out_dtype="bfloat16")
    ops = ptx_opcodes(f32_to_bf16, r"^ld\.shared", r"^st\.shared", r"^cvt\.rn")
    assert ops == ["ld.shared.v4.b32", "cvt.rn.bf16x2.f32", "st.shared.v2.b32"]
    f16 = tp.compile_row_scale("sm_90a", shape=(64, 512), dtype="float16")
    assert "ld.shared.v4.b32" in ptx_opcodes(f16, r"^ld\.shared")


def test_compiles_for_sm100():
    ops = ptx_opcodes(tp.compile_row_scale("sm_100a", shape=(64, 512)), r"^cp\.async\.bulk\.tensor")
    assert len(ops) == 2


# ---------------------------------------------------------------------------
# CPU: configuration and bad input, before any launch
# ---------------------------------------------------------------------------


def test_default_block_is_16k_and_fits():
    for dt in tp.DTYPES:
        bm, bn = tp.default_block(dt)
        assert bn == 256 and bm * bn * tp.DTYPES[dt].width // 8 == 16384
        tp.check_config(dt, dt, (bm, bn), 4, "carried", 2)
    assert tp.smem_bytes("bfloat16", "bfloat16", (32, 256), 4) == 4 * 16384 + 2 * 16384 + 64
    assert tp.fitting_ctas_per_sm("bfloat16", "bfloat16", (32, 256), 4) == 2
    assert tp.fitting_ctas_per_sm("bfloat16", "bfloat16", (32, 256), 8) == 1
    assert tp.fitting_ctas_per_sm("float16", "float32", (32, 256), 4) == 1


def test_smem_limits_come_from_the_hardware_module():
    from gemmlab.hardware import SMEM_PER_BLOCK

    # Same numbers as the literals they replace: 227 KiB less 1 KiB of margin per CTA, 228 KiB per SM.
    assert tp.MAX_SMEM_BYTES == SMEM_PER_BLOCK - 1024 == 227 * 1024 - 1024
    assert tp.SMEM_PER_SM == 228 * 1024
    # The largest ring of 16 KiB x stages that fits one CTA: smem_bytes at the limit passes, one more stage fails.
    fits = max(s for s in range(1, 17) if tp.smem_bytes("bfloat16", "bfloat16", (32, 256), s) <= tp.MAX_SMEM_BYTES)
    tp.check_config("bfloat16", "bfloat16", (32, 256), fits, "carried")
    with pytest.raises(ValueError, match=f"at most {tp.MAX_SMEM_BYTES} fit"):
        tp.check_config("bfloat16", "bfloat16", (32, 256), fits + 1, "carried")


def test_config_errors():
    with pytest.raises(ValueError, match="block_n must be <= 256"):
        tp.check_config("bfloat16", "bfloat16", (32, 512), 4, "carried")
    with pytest.raises(ValueError, match="block_m must be <= 256"):
        tp.check_config("bfloat16", "bfloat16", (300, 8), 4, "carried")
    with pytest.raises(ValueError, match="multiple of 16 bytes"):
        tp.check_config("bfloat16", "bfloat16", (256, 4), 4, "carried")
    with pytest.raises(ValueError, match="multiple of 1024"):
        tp.check_config("bfloat16", "bfloat16", (2, 256), 4, "carried")
    with pytest.raises(ValueError, match="needs .* bytes of shared memory"):
        tp.check_config("float32", "float32", (64, 256), 4, "carried")
    with pytest.raises(ValueError, match="do not fit one SM"):
        tp.check_config("bfloat16", "bfloat16", (32, 256), 8, "carried", 2)
    with pytest.raises(ValueError, match="design must be one of"):
        tp.check_config("bfloat16", "bfloat16", (32, 256), 4, "reset")
    with pytest.raises(ValueError, match="stages must be >= 1"):
        tp.check_config("bfloat16", "bfloat16", (32, 256), 0, "carried")
    with pytest.raises(ValueError, match="x dtype must be one of"):
        tp.check_config("int8", "bfloat16", (32, 256), 4, "carried")
    with pytest.raises(TypeError, match="block must be a"):
        tp.check_config("bfloat16", "bfloat16", 256, 4, "carried")


def test_compile_errors():
    with pytest.raises(ValueError, match="target must be one of"):
        tp.compile_row_scale("sm_80")
    with pytest.raises(ValueError, match="not a multiple of 16 bytes"):
        tp.compile_row_scale("sm_90a", shape=(10, 1001))
    with pytest.raises(ValueError, match="block_n must be <= 256"):
        tp.compile_row_scale("sm_90a", block=(8, 512))


def test_api_errors_on_any_machine():
    ok = torch.zeros(64, 256, dtype=torch.bfloat16)
    s = torch.ones(64)
    with pytest.raises(TypeError, match="x must be a torch.Tensor"):
        tp.row_scale([1, 2], s)
    with pytest.raises(TypeError, match="x must have dtype float32, bfloat16, float16; got int32"):
        tp.row_scale(torch.zeros(64, 256, dtype=torch.int32), s)
    with pytest.raises(TypeError, match="x must have dtype .* got float64"):
        tp.row_scale(torch.zeros(64, 256, dtype=torch.float64), s)
    with pytest.raises(ValueError, match="x must have at least 2 rows"):
        tp.row_scale(torch.zeros(1, 256, dtype=torch.bfloat16), torch.ones(1))
    with pytest.raises(ValueError, match="x must be 2-D"):
        tp.row_scale(torch.zeros(64, dtype=torch.bfloat16), s)
    # TMA rules: the row stride (1001 x 2 bytes) is not a multiple of 16 bytes.
    with pytest.raises(ValueError, match="x's row stride must be a multiple of 16 bytes for TMA; got 1001 elements"):
        tp.row_scale(torch.zeros(64, 1001, dtype=torch.bfloat16), s)
    # A padded view is fine for the stride (1024 x 2 bytes)... but a base 2 bytes in is not.
    big = torch.zeros(64, 1024, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="x must start at a 16-byte aligned address for TMA; its data pointer is 2"):
        tp.row_scale(big[:, 1:1001], s)
    with pytest.raises(ValueError, match="unit column stride"):
        tp.row_scale(ok.t(), torch.ones(256))
    with pytest.raises(ValueError, match="block_n must be <= 256"):
        tp.row_scale(ok, s, block=(4, 512))
    with pytest.raises(TypeError, match="scale must have dtype float32"):
        tp.row_scale(ok, s.double())
    with pytest.raises(ValueError, match="scale must be a contiguous 1-D tensor of x.shape\\[0\\] = 64"):
        tp.row_scale(ok, torch.ones(63))
    with pytest.raises(ValueError, match="x and out must have the same shape"):
        tp.row_scale(ok, s, torch.zeros(64, 128, dtype=torch.bfloat16))
    with pytest.raises(TypeError, match="out_dtype must be one of"):
        tp.row_scale(ok, s, out_dtype=torch.int8)
    with pytest.raises(ValueError, match="out's row stride must be a multiple of 16 bytes"):
        tp.row_scale(torch.zeros(64, 4, dtype=torch.float32), s, out_dtype=torch.bfloat16)
    # Everything valid but on the CPU: the device check is the last one.
    with pytest.raises(ValueError, match="x must be on a cuda device"):
        tp.row_scale(ok, s)


def test_draw_stage_sweep(tmp_path, monkeypatch):
    monkeypatch.setattr(figures, "FIGURES_DIR", tmp_path)
    rows = [{"stages": s, "KiB/stage": kib, "ctas/SM": c, "GB/s": 1000.0 * s, "vs torch": 0.25 * s, "ms": 1.0}
            for kib, c in ((16, 1), (16, 2), (4, 1)) for s in (1, 2, 4)]
    p = mtp.draw_stage_sweep(rows, "05_sweep_test")
    assert p.endswith("05_sweep_test.png") and (tmp_path / "05_sweep_test.png").stat().st_size > 1000


# ---------------------------------------------------------------------------
# GPU: against torch, random data, partial tiles, poisoned outputs
# ---------------------------------------------------------------------------

CASES = [
    ("bfloat16", None, (77, 1000)),      # partial tile in rows and columns, 4 k-iterations
    ("bfloat16", None, (4096, 1280)),    # 5 k-iterations per tile: the unrolled design's tail
    ("bfloat16", None, (33, 8)),         # one narrow column chunk, box mostly out of bounds
    ("float32", None, (2, 4)),           # two rows of 16 bytes
    ("float32", "bfloat16", (300, 1288)),  # row scale + cast down
    ("float16", "float32", (513, 2048)),   # cast up: 32 KiB y tiles, one CTA per SM
]


def _poisoned(shape, dtype):
    return torch.full(shape, float("nan"), device="cuda", dtype=dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,out_dtype,shape", CASES)
@pytest.mark.parametrize("design", tp.DESIGNS)
@pytest.mark.parametrize("stages", [1, 3, 4])
def test_row_scale_matches_torch(dtype, out_dtype, shape, design, stages):
    x = torch.randn(shape, device="cuda").to(getattr(torch, dtype))
    scale = torch.rand(shape[0], device="cuda") + 0.5
    out = _poisoned(shape, getattr(torch, out_dtype or dtype))
    got = tp.row_scale(x, scale, out, stages=stages, design=design)
    torch.cuda.synchronize()
    assert got is out
    assert torch.equal(out, tp.reference(x, scale, out.dtype))


@pytest.mark.gpu
def test_row_scale_padded_view_and_new_output():
    big = torch.randn(100, 1024, device="cuda").to(torch.bfloat16)
    x = big[:, :1000]  # row stride 1024 elements: the tensor map carries it
    scale = torch.rand(100, device="cuda")
    out = tp.row_scale(x, scale, out_dtype=torch.float32)
    torch.cuda.synchronize()
    assert out.dtype == torch.float32 and torch.equal(out, tp.reference(x, scale, torch.float32))
    # Running twice into a re-poisoned buffer gives the same answer (no state leaks between launches).
    out2 = _poisoned((100, 1000), torch.float32)
    tp.row_scale(x, scale, out2, stages=2, ctas_per_sm=1)
    torch.cuda.synchronize()
    assert torch.equal(out2, out)


@pytest.mark.gpu
def test_persistent_tiles_more_than_ctas():
    # 132 SMs x 2 CTAs = 264 CTAs for 2000 tiles: every CTA loops over ~8 tiles, carrying its ring state.
    x = torch.randn(64_000, 1280, device="cuda").to(torch.bfloat16)
    scale = torch.rand(64_000, device="cuda")
    for design in tp.DESIGNS:
        out = _poisoned(x.shape, x.dtype)
        tp.row_scale(x, scale, out, stages=4, design=design, ctas_per_sm=2)
        torch.cuda.synchronize()
        assert torch.equal(out, tp.reference(x, scale)), design


@pytest.mark.gpu
def test_small_grid_and_small_boxes():
    # Fewer CTAs than SMs (each loops over many tiles) and 4 KiB boxes: the configurations the measurements use.
    x = torch.randn(10_000, 1280, device="cuda").to(torch.bfloat16)
    scale = torch.rand(10_000, device="cuda")
    for design in tp.DESIGNS:
        out = _poisoned(x.shape, x.dtype)
        tp.row_scale(x, scale, out, block=(8, 256), stages=6, design=design, ctas=7)
        torch.cuda.synchronize()
        assert torch.equal(out, tp.reference(x, scale)), design


@pytest.mark.gpu
@pytest.mark.parametrize("design", tp.DESIGNS)
@pytest.mark.parametrize("stages,shape", [(2, (4099, 768)), (3, (4099, 1200)), (4, (77, 1280))])
def test_spin_variant_matches_torch(design, stages, shape):
    # Synthetic compute changes the timing, never the result: k = stages + 1 (the tail) and partial tiles,
    # few CTAs each running many tiles (the tail-bubble experiment's configuration), output poisoned.
    x = torch.randn(shape, device="cuda").to(torch.bfloat16)
    scale = torch.rand(shape[0], device="cuda") + 0.5
    out = _poisoned(shape, torch.bfloat16)
    tp.row_scale(x, scale, out, stages=stages, design=design, ctas=7, spin_cycles=500)
    torch.cuda.synchronize()
    assert torch.equal(out, tp.reference(x, scale))


@pytest.mark.gpu
def test_api_errors_on_gpu():
    buf = torch.zeros(64 * 1024 + 8, dtype=torch.bfloat16, device="cuda")
    s = torch.ones(64, device="cuda")
    with pytest.raises(ValueError, match="x must start at a 16-byte aligned address"):
        tp.row_scale(buf[1:1 + 64 * 1024].view(64, 1024), s)
    with pytest.raises(ValueError, match="scale must be on a cuda device"):
        tp.row_scale(buf[:64 * 1024].view(64, 1024), torch.ones(64))
    with pytest.raises(ValueError, match="ctas must be >= 1"):
        tp.row_scale(buf[:64 * 1024].view(64, 1024), s, ctas=0)
    with pytest.raises(ValueError, match="spin_cycles must be >= 0"):
        tp.row_scale(buf[:64 * 1024].view(64, 1024), s, spin_cycles=-5)


def test_draw_tail_bubble(tmp_path, monkeypatch):
    monkeypatch.setattr(figures, "FIGURES_DIR", tmp_path)
    rows = [{"spin": 0, "stages": s, "k": k, "extra us": 0.3 * (k - s), "model extra us": 0.4 * (k - s),
             "net extra us": 0.3 if k > s else float("nan")} for s in (2, 4) for k in (s, s + 1)]
    p = mtp.draw_tail_bubble(rows, "05_bubble_test")
    assert p.endswith("05_bubble_test.png") and (tmp_path / "05_bubble_test.png").stat().st_size > 1000
