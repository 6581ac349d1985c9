"""Chapter 11's W16 route (A and the weights converted to FP16 workspaces per call, then chapter 07's GEMM with its
gated epilogue): configuration, the heuristic's choice between it and the A16 twin, refusals, PTX (any machine),
correctness of the three kernels on the emulator (any machine), and on an H100 / H200 (sm90)."""
import re
from dataclasses import replace

import pytest

torch = pytest.importorskip("torch")

from cutlass import Int32  # noqa: E402

from gemmlab import nvfp4 as fp4  # noqa: E402
from gemmlab.compile import ptx_of  # noqa: E402
from gemmlab.emulator.run import run_on_emulator  # noqa: E402
from gemmlab.family import heuristic_gated as hg  # noqa: E402
from gemmlab.family import plan as P  # noqa: E402
from gemmlab.family.configs import A16Config, Sm90Config, W16Config, check_grouped_config  # noqa: E402
from gemmlab.family.heuristic_sm90 import MODEL  # noqa: E402
from gemmlab.family.problem import GatedProblem, GemmProblem  # noqa: E402
from gemmlab.kernels import dual_gemm_sm90_w16 as w  # noqa: E402
from gemmlab.kernels.dual_gemm_sm90 import operands_2d  # noqa: E402


def gated(tile_m=128, tile_n=128, stages=3, cluster=(1, 1), epi_n=32, **kw):
    return Sm90Config(tile_m=tile_m, tile_n=tile_n, stages=stages, cluster=cluster, epi_n=epi_n, dtype="float16",
                      out_dtype="float16", gated=True, **kw)


# ---------------------------------------------------------------- configuration


def test_gated_config_name_round_trips_and_halves_the_output_tile():
    g = gated(tile_n=256, stages=4, cluster=(2, 1))
    assert g.name == "128x256 c2x1 m8 s4 gated"
    assert Sm90Config(**Sm90Config.parse_name(g.name), dtype="float16", out_dtype="float16") == g
    assert "gated" not in Sm90Config.parse_name(replace(g, gated=False).name)
    assert (g.out_tile_n, replace(g, gated=False).out_tile_n) == (128, 256)
    # the epilogue ring is walked by the output tile's sub-tiles: 128 / 32 = 4 of them, a ring of 4
    assert g.epi_ring_aligned and not replace(g, epi_stages=3).epi_ring_aligned


@pytest.mark.parametrize("kwargs, match", [
    (dict(swap_ab=True), "gated needs swap_ab False and splits 1"),
    (dict(splits=2), "gated needs swap_ab False and splits 1"),
    (dict(tile_n=96, epi_n=32), r"gated: epi_n must divide tile_n / 2 = 48"),
    (dict(tile_n=64, epi_n=64), r"gated: epi_n must divide tile_n / 2 = 32"),
])
def test_gated_config_rejects_what_its_epilogue_cannot_pair(kwargs, match):
    with pytest.raises(ValueError, match=match):
        gated(**kwargs)


@pytest.mark.parametrize("value", [1, "yes", None])
def test_gated_must_be_a_bool(value):
    with pytest.raises((TypeError, ValueError), match="gated must be one of"):
        Sm90Config(gated=value)


def test_w16_config_needs_a_gated_fp16_gemm():
    assert W16Config(gated()).gemm.tile_n == 128
    with pytest.raises(TypeError, match="gemm must be an Sm90Config"):
        W16Config((128, 128))
    with pytest.raises(ValueError, match="gemm must be gated with dtype and out_dtype float16"):
        W16Config(replace(gated(), gated=False))
    with pytest.raises(ValueError, match="gemm must be gated with dtype and out_dtype float16"):
        W16Config(replace(gated(), dtype="bfloat16", out_dtype="bfloat16"))


def test_other_kernels_refuse_a_gated_config(monkeypatch):
    """chapter 07's public GEMM and the grouped kernel compute a @ b: a gated config would store half the columns."""
    with pytest.raises(ValueError, match="not gated"):
        check_grouped_config(gated(cluster=(2, 1)))
    monkeypatch.setattr(P, "arch_of_machine", lambda *a: "sm90")
    monkeypatch.setattr(P.hardware, "sm_count", lambda *a: 132)
    with pytest.raises(ValueError, match="a gated config stores silu"):
        P.make_plan(GemmProblem(256, 256, 256, "float16", "float16"), None, gated())


def test_w_row_interleaves_blocks_of_b1_and_b2():
    # h = 2: W = [B1 0-1; B2 0-1; B1 2-3; B2 2-3; ...]
    assert [w.w_row(r, 0, 2) for r in range(6)] == [0, 1, 4, 5, 8, 9]
    assert [w.w_row(r, 1, 2) for r in range(6)] == [2, 3, 6, 7, 10, 11]
    rows = sorted(w.w_row(r, s, 64) for s in (0, 1) for r in range(192))
    assert rows == list(range(384))  # a permutation of W's rows


# ---------------------------------------------------------------- the heuristic


def test_w16_pass_is_priced_at_the_models_hbm_rate():
    # (M + 2 N) K values, each 1/2 packed + 1/16 scale + 2 FP16 bytes, at 3.35 TB/s x 0.85
    m, n, k = 2048, 4096, 7168
    want = (m + 2 * n) * k * 2.5625 / (MODEL.hbm_tbps * MODEL.hbm_efficiency * 1e6)
    assert hg.w16_pass_us(m, n, k) == pytest.approx(want)
    assert 64 < want < 67  # 188 MB at 2.85 TB/s


def test_choice_follows_the_models_between_a16_and_w16():
    """At large M the A16 twin converts each weight element M / 128 times and its model grows with the waves; the W16
    route pays one pass: the model switches between 1024 and 2048 rows on 4096 x 7168 weights (H100's SMs)."""
    for m, n, k in [(512, 4096, 7168), (256, 3072, 4096), (1024, 4096, 7168)]:
        a16 = hg.choose_a16(m, n, k)
        assert hg.w16_time(m, n, k) >= hg.a16_time(m, n, k, a16.tile_n, converters=a16.converters)
        assert not isinstance(hg.choose_sm90(GatedProblem(m, n, k)), W16Config)
    for m, n, k in [(2048, 4096, 7168), (2048, 14336, 4096)]:
        cfg = hg.choose_sm90(GatedProblem(m, n, k))
        assert isinstance(cfg, W16Config) and cfg == hg.choose_w16(m, n, k)
        a16 = hg.choose_a16(m, n, k)
        assert hg.w16_time(m, n, k) < hg.a16_time(m, n, k, a16.tile_n, converters=a16.converters)
        g = cfg.gemm
        assert g.gated and not g.swap_ab and not g.split_k and g.tile_n % 64 == 0 and n % (g.tile_n // 2) == 0


def test_w16_has_no_candidate_where_chapter_07_swaps_or_n_does_not_tile():
    assert hg.w16_candidate(200, 4096, 7168) is None  # chapter 07 models only swapped tiles at M <= 200
    assert hg.w16_candidate(2048, 40, 4096) is None  # 40 is no multiple of 32, 64 or 128
    with pytest.raises(ValueError, match="the W16 route has no configuration for M=200"):
        hg.choose_w16(200, 4096, 7168)
    assert isinstance(hg.choose_sm90(GatedProblem(2048, 40, 4096)), A16Config)


def test_w16_heuristic_rejects_bad_arguments():
    with pytest.raises(ValueError, match="m must be >= 1"):
        hg.w16_candidate(0, 64, 256)
    with pytest.raises(TypeError, match="num_sms must be an int"):
        hg.w16_candidate(256, 64, 256, 132.0)


# ---------------------------------------------------------------- refusals, before any compile


@pytest.mark.parametrize("target, cfg, m, n, k, exc, match", [
    ("sm_100a", W16Config(gated()), 256, 128, 512, ValueError, "needs target sm_90a"),
    ("sm_90a", gated(), 256, 128, 512, TypeError, "cfg must be a W16Config"),
    ("sm_90a", W16Config(gated()), 256, 96, 512, ValueError, r"N must be a multiple of tile_n / 2 = 64"),
    ("sm_90a", W16Config(gated()), 256, 128, 384, ValueError, "K must be a multiple of 256"),
])
def test_compile_rejects_bad_arguments(no_compile, target, cfg, m, n, k, exc, match):
    with pytest.raises(exc, match=match):
        w.compile_w16(target, cfg, m, n, k)
    with pytest.raises(exc, match=match):
        w.compile_w16_ptrs(target, cfg, m, n, k)


def test_call_rejects_bad_input_before_the_tier_check(no_compile):
    ops = fp4.generate(64, 64, 256)
    with pytest.raises(ValueError, match=r"out must have shape \(64, 64, 1\)"):
        w.gated_dual_gemm_w16(*ops.inputs(), out=torch.empty(64, 72, 1, dtype=torch.float16))
    with pytest.raises(TypeError, match="sfb2 must have dtype float8_e4m3fn"):
        a, b1, b2, sfa, sfb1, sfb2 = ops.inputs()
        w.gated_dual_gemm_w16(a, b1, b2, sfa, sfb1, sfb2.float())


# ---------------------------------------------------------------- PTX

_COMPILED = {}


def compiled(m, n, k, cfg):
    key = (m, n, k, cfg)
    if key not in _COMPILED:
        _COMPILED[key] = w.compile_w16("sm_90a", cfg, m, n, k)
    return _COMPILED[key]


def entries(ptx: str) -> dict:
    parts = re.split(r"(?=^\.visible \.entry )", ptx, flags=re.M)[1:]
    out = {}
    for p in parts:
        name = p.split("(", 1)[0]
        out["prepass" if "prepass_kernel" in name else "weights" if "weights_kernel" in name else "gemm"] = p
    return out


def test_ptx_three_kernels_and_the_gate_only_in_the_gemm():
    e = entries(ptx_of(compiled(130, 128, 256, W16Config(gated(cluster=(2, 1))))))
    assert sorted(e) == ["gemm", "prepass", "weights"]
    for name in ("prepass", "weights"):  # streaming conversions: e4m3 bit moves, no tensor cores
        assert "cvt.rn.f16x2.e4m3x2" in e[name] and "wgmma" not in e[name]
    assert "wgmma.mma_async" in e["gemm"] and "cvt.rn.f16x2.e4m3x2" not in e["gemm"]
    assert re.search(r"ex2\.approx", e["gemm"])  # silu's exponential
    plain = ptx_of(P.compiled(("gemm_ptx_plain_f16",), lambda: __import__(
        "gemmlab.kernels.gemm_sm90", fromlist=["compile_gemm"]).compile_gemm(
            "sm_90a", replace(gated(cluster=(2, 1)), gated=False))))
    assert "ex2.approx" not in plain


# ---------------------------------------------------------------- the emulator

EMULATED = [
    # (M, N, K, config, clusters, seed): tile_n 128 (h 64) in a 2x1 cluster, M past the tile; N of 3 output tiles
    # in a 1x2 cluster (the last cluster's second CTA wholly past N); one 64-row consumer, 64-wide tiles (h 32, epi 16)
    # on 3 clusters of 1; tile_n 256 (h 128), one cluster walking every tile; a 192-row tile
    (130, 128, 256, gated(cluster=(2, 1)), 2, 0),
    (130, 192, 256, gated(cluster=(1, 2)), 2, 1),
    (40, 96, 512, gated(tile_m=64, tile_n=64, epi_n=16), 3, 2),
    (200, 256, 256, gated(tile_n=256, cluster=(2, 1)), 1, 3),
    (250, 128, 512, gated(tile_m=192, epi_stages=2), 2, 4),  # three consumer warpgroups
]


@pytest.mark.parametrize("m, n, k, g, clusters, seed", EMULATED,
                         ids=[f"{m}x{n}x{k}-{g.name.replace(' ', '-')}-x{c}" for m, n, k, g, c, _ in EMULATED])
def test_emulator_matches_reference_and_workspaces_are_exact(m, n, k, g, clusters, seed):
    cfg = W16Config(g)
    ops = fp4.generate(m, n, k, seed=seed + 5)
    assert torch.isnan(ops.c.float()).all()  # poisoned output
    a16 = torch.full((m, k), float("nan"), dtype=torch.float16)
    ws = torch.full((2 * n, k), float("nan"), dtype=torch.float16)
    args = operands_2d(*ops.inputs(), ops.c)
    reports = run_on_emulator(compiled(m, n, k, cfg), *args[:6], a16, ws, args[6], Int32(clusters), seed=seed)
    assert [name in r.kernel for r, name in zip(reports, ("prepass_kernel", "weights_kernel", "gemm_kernel"))] == \
        [True] * 3
    m_tiles = -(-m // g.tile_m)
    units = -(-m_tiles // g.cluster[0]) * -(-(n // (g.tile_n // 2)) // g.cluster[1])  # output tiles h wide
    assert reports[2].grid == (min(clusters, units) * g.cluster_size, 1, 1)
    res = fp4.check_close(ops.c, fp4.reference(*ops.inputs()))
    assert res.ok, f"{m}x{n}x{k} {g.name}: {res}"
    assert torch.equal(a16.float(), fp4.dequantize(ops.a, ops.sfa)[..., 0])
    assert torch.equal(ws.float(), _weights_want(ops, n, k, g.out_tile_n))  # every value exact, in its interleaved row


# ---------------------------------------------------------------- on an H100 / H200

GPU_SHAPES = [(2048, 4096, 7168), (2048, 14336, 4096), (1024, 4096, 7168), (300, 3072, 4096), (1000, 1024, 1536)]
GPU_CONFIGS = ["heuristic", gated(tile_n=256, stages=4, cluster=(2, 1)), gated(tile_n=128, stages=6, cluster=(1, 2)),
               gated(tile_m=64, tile_n=64, stages=8, epi_n=16), gated(tile_m=192, tile_n=128, stages=4)]


@pytest.mark.gpu
@pytest.mark.sm90
@pytest.mark.parametrize("shape", GPU_SHAPES, ids=[f"{m}x{n}x{k}" for m, n, k in GPU_SHAPES])
@pytest.mark.parametrize("form", GPU_CONFIGS, ids=[f if isinstance(f, str) else f.name for f in GPU_CONFIGS])
def test_gpu_matches_reference_with_poisoned_output(shape, form):
    m, n, k = shape
    cfg = None if form == "heuristic" else W16Config(form)
    if cfg is None and hg.w16_candidate(m, n, k) is None:
        pytest.skip("no W16 candidate")
    out, returned, res = fp4.run_poisoned(lambda *ins, out: w.gated_dual_gemm_w16(*ins, out=out, cfg=cfg), m, n, k,
                                          seed=23 + m)
    assert returned is out
    assert res.ok, f"{shape} {cfg}: {res}"


@pytest.mark.gpu
@pytest.mark.sm90
def test_gpu_public_call_takes_w16_at_2048_rows_and_repeats_bitwise():
    import gemmlab

    first, second, res = fp4.run_twice(gemmlab.gated_dual_gemm, 2048, 4096, 7168, seed=9)
    plan = [p for p in gemmlab.family.api.gated_plans() if (p.problem.m, p.problem.n) == (2048, 4096)][-1]
    assert isinstance(plan.config, W16Config)
    assert torch.equal(first, second)
    assert res.ok


def _weights_want(ops, n, k, h):
    b1, b2 = (fp4.dequantize(b, s)[..., 0].cpu() for b, s in ((ops.b1, ops.sfb1), (ops.b2, ops.sfb2)))
    return torch.stack([b1.view(n // h, h, k), b2.view(n // h, h, k)], dim=1).reshape(2 * n, k)


def test_emulator_weight_pass_alone_writes_every_value_exactly():
    """The weight pass alone (what the benchmark times apart): 192 rows of each, blocks of 64, K = 512."""
    n, k, h = 192, 512, 64
    ops = fp4.generate(8, n, k, seed=1)
    o = operands_2d(*ops.inputs(), ops.c)
    ws = torch.full((2 * n, k), float("nan"), dtype=torch.float16)
    run_on_emulator(w.compile_weights("sm_90a", n, k, h), o[1], o[4], o[2], o[5], ws)
    assert torch.equal(ws.float(), _weights_want(ops, n, k, h))


def test_compile_weights_rejects_bad_arguments(no_compile):
    with pytest.raises(ValueError, match="N must be a multiple of h = 64"):
        w.compile_weights("sm_90a", 96, 512, 64)
    with pytest.raises(ValueError, match="h must be a multiple of 8"):
        w.compile_weights("sm_90a", 96, 512, 12)
    with pytest.raises(ValueError, match="needs target sm_90a"):
        w.compile_weights("sm_100a", 128, 512, 64)


@pytest.mark.gpu
@pytest.mark.sm90
@pytest.mark.parametrize("n, k, h", [(192, 768, 64), (4096, 7168, 128)], ids=["192x768-h64", "4096x7168-h128"])
def test_gpu_weight_pass_is_exact(n, k, h):
    from gemmlab.compile import launcher

    ops = fp4.generate(8, n, k, seed=n, device="cuda")
    o = operands_2d(*ops.inputs(), ops.c)
    ws = torch.full((2 * n, k), float("nan"), dtype=torch.float16, device="cuda")
    launcher(w.weights_host(h), o[1], o[4], o[2], o[5], ws)()
    torch.cuda.synchronize()
    assert torch.equal(ws.float().cpu(), _weights_want(ops, n, k, h))


def test_plan_passes_the_persistent_grid_after_out(monkeypatch):
    """The W16 plan's extra argument: the GPU's SMs over the GEMM's cluster size, at least one cluster."""
    monkeypatch.setattr(P, "gated_kernel", lambda *a, **k: object())
    monkeypatch.setattr(P, "raw_function", lambda fn: fn)
    prob = GatedProblem(2048, 4096, 7168)
    for cluster, sms, want in (((2, 1), 132, 66), ((1, 2), 132, 66), ((1, 1), 132, 132), ((2, 1), 1, 1)):
        plan = P.GatedPlan(prob, W16Config(gated(cluster=cluster)), "sm90", None, sms)
        assert plan._tail == (want,) and plan._workspace
    assert P.GatedPlan(prob, A16Config(), "sm90", None, 132)._tail == ()


def test_dense_compile_and_weight_launch_refuse_what_they_cannot_run(no_compile):
    import cutlass.cute as cute
    from cutlass import Float16

    from gemmlab.compile import fake_stream, fake_tensor
    from gemmlab.kernels import gemm_sm90
    from gemmlab.kernels.dual_gemm_sm90 import fake_operands

    with pytest.raises(ValueError, match="a gated config reads a B' of 2 N rows"):
        gemm_sm90.compile_gemm("sm_90a", gated())
    # below the public checks, the weight pass's own guard, while tracing: N = 96 in blocks of 64 would write B2's
    # last half block past W's 192 rows
    ops = fake_operands(8, 96, 512)
    with pytest.raises(Exception, match="N must be a multiple of h = 64"):
        cute.compile(w.weights_host(64), ops[1], ops[4], ops[2], ops[5],
                     fake_tensor(Float16, (192, 512), stride_order=(1, 0)), fake_stream())
