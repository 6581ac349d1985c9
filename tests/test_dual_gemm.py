"""Chapter 11's public call (gemmlab.family.api.gated_dual_gemm), its baselines and bounds (gemmlab.measure.dual_gemm):
CPU tests everywhere, the launches on sm90."""
import math

import numpy as np

import pytest

torch = pytest.importorskip("torch")

from gemmlab.family import api, plan  # noqa: E402
from gemmlab.family.configs import A16Config, Sm90Config, W16Config, a16_max_stages  # noqa: E402
from gemmlab.measure import dual_gemm as dg  # noqa: E402
from gemmlab import nvfp4 as fp4  # noqa: E402
from gemmlab.hardware import B200, H100, H200  # noqa: E402
from gemmlab.tiers import TierError, detect_tier  # noqa: E402


@pytest.fixture(scope="module")
def small():
    return fp4.generate(200, 136, 768, seed=3)


# ---------------------------------------------------------------- argument checks and dispatch (any machine)


def test_bad_input_is_rejected_before_the_tier(small):
    a, b1, b2, sfa, sfb1, sfb2 = small.inputs()
    with pytest.raises(TypeError, match="sfa must have dtype float8_e4m3fn"):
        api.gated_dual_gemm(a, b1, b2, sfa.float(), sfb1, sfb2)
    with pytest.raises(TypeError, match="a must hold packed FP4"):
        api.gated_dual_gemm(fp4.dequantize(a, sfa), b1, b2, sfa, sfb1, sfb2)
    with pytest.raises(ValueError, match="K must be a multiple of 256"):
        k = 384  # 192 packed bytes
        api.gated_dual_gemm(*(fp4.as_bytes(t)[:, :k // 2] for t in (a, b1, b2)),
                            *(t[:, :k // 16] for t in (sfa, sfb1, sfb2)))
    with pytest.raises(ValueError, match="sfb2 must have shape"):
        api.gated_dual_gemm(a, b1, b2, sfa, sfb1, sfb2[:, :-1])
    with pytest.raises(ValueError, match="out must have shape"):
        api.gated_dual_gemm(a, b1, b2, sfa, sfb1, sfb2, out=torch.empty(200, 128, 1, dtype=torch.float16))
    with pytest.raises(TypeError, match="out must have dtype float16"):
        api.gated_dual_gemm(a, b1, b2, sfa, sfb1, sfb2, out=torch.empty(200, 136, 1))
    with pytest.raises(ValueError, match="out must be N-major"):
        api.gated_dual_gemm(a, b1, b2, sfa, sfb1, sfb2,
                            out=torch.empty(1, 136, 200, dtype=torch.float16).permute(2, 1, 0))
    with pytest.raises(ValueError, match="N must be a multiple of 8"):
        ops = fp4.generate(128, 100, 256)
        api.gated_dual_gemm(*ops.inputs())
    with pytest.raises(ValueError, match="L must be 1"):
        ops = fp4.generate(128, 128, 256, l=2)
        api.gated_dual_gemm(*ops.inputs())


@pytest.mark.skipif(detect_tier() != "cpu", reason="the cpu tier's refusal")
def test_cpu_tier_raises_tier_error_after_the_checks(small):
    with pytest.raises(TierError, match="gemmlab.gated_dual_gemm needs tier sm90 or sm100"):
        api.gated_dual_gemm(*small.inputs())
    with pytest.raises(TierError):
        plan.prepare_gated(*small.inputs(), out=small.c)


def test_dispatch_follows_the_tier(small, monkeypatch):
    from gemmlab.kernels import dual_gemm_sm90

    calls = []

    class FakePlan:
        def __init__(self, problem, config, arch, out_stride=None, num_sms=None):
            self.arch = arch

        def __call__(self, *tensors):
            calls.append(self.arch)
            return tensors[-1]  # out

    monkeypatch.setattr(plan, "GatedPlan", FakePlan)
    monkeypatch.setattr(dual_gemm_sm90, "check_devices", lambda *tensors: None)  # the CPU tensors stand in
    monkeypatch.setattr(plan.hardware, "sm_count", lambda device=None: 132)  # and an H100's SMs and clusters
    monkeypatch.setattr(plan.hardware, "max_active_clusters", lambda size, device=None: (132, 66, 30)[size // 2])
    for tier in ("sm90", "sm100"):
        monkeypatch.setattr(plan.tiers, "detect_tier", lambda tier=tier: tier)
        monkeypatch.setattr(api, "_GATED", {})  # a plan per signature: the same tensors on another tier
        assert api.gated_dual_gemm(*small.inputs(), out=small.c) is small.c
    assert calls == ["sm90", "sm100"]
    # bad input never reaches a kernel, whatever the tier
    with pytest.raises(ValueError):
        api.gated_dual_gemm(*small.inputs(), out=torch.empty(1, 1, 1, dtype=torch.float16))
    assert calls == ["sm90", "sm100"]


def test_sm100_without_its_module_says_so(small, monkeypatch):
    monkeypatch.setattr(plan.tiers, "detect_tier", lambda: "sm100")
    monkeypatch.setattr(plan, "sm100_kernels", lambda: None)
    monkeypatch.setattr(api, "_GATED", {})
    with pytest.raises(RuntimeError, match="needs gemmlab.kernels.dual_gemm_sm100"):
        api.gated_dual_gemm(*small.inputs())


def test_sm100_module_import_is_lazy_and_optional():
    mod = plan.sm100_kernels()
    assert mod is None or hasattr(mod, "gated_dual_gemm_sm100")


# ---------------------------------------------------------------- the baselines agree with the reference (CPU)


@pytest.mark.parametrize("shape", fp4.TEST_SHAPES)
def test_baselines_match_the_reference(shape):
    ops = fp4.generate(*shape, seed=sum(shape))
    ref = fp4.reference(*ops.inputs())
    out = torch.full_like(ref, float("nan"))
    assert dg.reference_pipeline(*ops.inputs(), out=out) is out
    assert fp4.check_close(out, ref).ok
    w = dg.prepare_stock(ops.b1, ops.b2, ops.sfb1, ops.sfb2)
    out_b = torch.full_like(ref, float("nan"))
    assert dg.stock_path(ops.a, ops.sfa, w, out=out_b) is out_b
    res = fp4.check_close(out_b, ref)
    assert res.ok, res
    assert not torch.isnan(out_b).any()


def test_stock_weights_are_exact_bf16():
    ops = fp4.generate(128, 256, 512, seed=1)
    w = dg.prepare_stock(ops.b1, ops.b2, ops.sfb1, ops.sfb2)
    assert w.w1.dtype == torch.bfloat16 and tuple(w.w1.shape) == (256, 512)
    assert torch.equal(w.w1.float(), fp4.dequantize(ops.b1, ops.sfb1)[..., 0])
    assert torch.equal(w.w2.float(), fp4.dequantize(ops.b2, ops.sfb2)[..., 0])
    # BF16 weights take 2 bytes a value; NVFP4 half a byte plus a byte per 16
    assert w.nbytes / (2 * (256 * 256 + 256 * 512 // 16)) == pytest.approx(2 / (0.5 + 1 / 16))


def test_baselines_catch_a_wrong_answer():
    # the checker the baselines are held to is not vacuous: one flipped scale is a mismatch
    ops = fp4.generate(128, 128, 256, seed=2)
    ref = fp4.reference(*ops.inputs())
    sfb2 = ops.sfb2.clone()
    sfb2[5, 3, 0] = torch.tensor(float(sfb2[5, 3, 0].float()) * 2).to(torch.float8_e4m3fn)
    w = dg.prepare_stock(ops.b1, ops.b2, ops.sfb1, sfb2)
    res = fp4.check_close(dg.stock_path(ops.a, ops.sfa, w), ref)
    assert not res.ok and 0 < res.bad <= 128  # column 5 only


def test_stock_path_rejects_bad_input():
    ops = fp4.generate(128, 128, 512)
    w = dg.prepare_stock(ops.b1, ops.b2, ops.sfb1, ops.sfb2)
    with pytest.raises(TypeError, match="weights must be a StockWeights"):
        dg.stock_path(ops.a, ops.sfa, (w.w1, w.w2))
    other = fp4.generate(128, 128, 256)
    with pytest.raises(ValueError, match="weights must be one \\(2N, K=256\\)"):
        dg.stock_path(other.a, other.sfa, w)
    with pytest.raises(ValueError, match="sfa must have shape"):
        dg.stock_path(ops.a, other.sfa, w)
    with pytest.raises(ValueError, match="b1 and b2 must have the same shape"):
        dg.prepare_stock(ops.b1, other.b2, ops.sfb1, ops.sfb2)
    with pytest.raises(TypeError, match="sfb1 must have dtype"):
        dg.prepare_stock(ops.b1, ops.b2, ops.sfb1.float(), ops.sfb2)


# ---------------------------------------------------------------- bounds


def test_roofline_by_hand():
    # 128 x 256 x 512: A 128*256 B, B1 and B2 256*256 B each, scales (128 + 512) * 32 B, C 2*128*256 B
    b = dg.problem_bytes(128, 256, 512)
    assert (b["a"], b["b1"], b["b2"], b["scales"], b["c"]) == (32768, 65536, 65536, 20480, 65536)
    assert b["total"] == 249856
    r = dg.roofline(128, 256, 512, H100)
    assert r["flops"] == 4 * 128 * 256 * 512 == 67108864
    assert r["peak"] == "bf16"  # Hopper: no FP4 tensor cores
    assert r["memory_us"] == pytest.approx(249856 / 3.35e12 * 1e6)
    assert r["compute_us"] == pytest.approx(67108864 / 989.4e12 * 1e6)
    assert r["bound"] == "memory" and r["bound_us"] == r["memory_us"]
    r = dg.roofline(512, 4096, 7168)  # B200 by default: FP4 peak
    assert r["gpu"] == "B200" and r["peak"] == "fp4" and r["bound"] == "compute"
    assert r["compute_us"] == pytest.approx(4 * 512 * 4096 * 7168 / 9000e12 * 1e6)


def test_roofline_reproduces_the_memory_bound_speed_of_light():
    rows = dg.roofline_table()
    assert [r["sol_us"] for r in rows] == list(fp4.SOL_US)
    assert math.exp(sum(math.log(s) for s in fp4.SOL_US) / 4) == pytest.approx(4.886, abs=5e-4)
    for r in rows:
        if r["bound"] == "memory":  # GPU MODE's figure is bytes at 7.68 TB/s: 0.3 % under our 7.7
            assert r["sol_us"] == pytest.approx(r["memory_us"], rel=5e-3)
            assert r["sol_tbps"] == pytest.approx(7.68, abs=0.01)
        assert r["sol_us"] >= r["memory_us"]  # no bound beats the bytes
    compute = [r for r in rows if r["bound"] == "compute"]
    assert [(r["m"], r["n"]) for r in compute] == [(512, 4096), (512, 3072)]
    for r in compute:  # their compute-bound figures imply the same 6.9 PFLOP/s
        assert r["sol_pflops"] == pytest.approx(6.90, abs=0.01)


def test_roofline_hopper_is_compute_bound_for_bf16():
    for spec in (H100, H200):
        for r in dg.roofline_table(spec):
            assert r["peak"] == "bf16" and r["bound"] == "compute"
    with pytest.raises(TypeError, match="spec must be"):
        dg.roofline(128, 128, 256, "B200")
    with pytest.raises(ValueError, match="K must be a multiple of 256"):
        dg.roofline(128, 128, 320)


def test_prediction_is_a_range_above_the_roofline():
    rows = dg.prediction_table()
    assert len(rows) == 2 * len(fp4.BENCHMARK_SHAPES)
    for r in rows:
        assert r["roofline_us"] <= r["low_us"] <= r["predicted_us"] <= r["high_us"]
        assert r["smem_bytes"] <= B200.smem_per_block_kib * 1024
        assert r["tiles"] == -(-r["m"] // 128) * -(-r["n"] // r["tile_n"])
        assert r["ctas"] == min(148, r["tiles"])
    # a CTA per tile: more, narrower tiles keep more SMs busy on the 256-row shapes
    by = {(r["m"], r["n"], r["k"], r["tile_n"]): r for r in rows}
    assert by[(256, 4096, 7168, 64)]["predicted_us"] < by[(256, 4096, 7168, 128)]["predicted_us"]
    with pytest.raises(ValueError, match="tile_n must be one of"):
        dg.predict_b200((256, 4096, 7168), tile_n=256)
    with pytest.raises(ValueError, match="stages"):
        dg.predict_b200((256, 4096, 7168), stages=99)
    with pytest.raises(ValueError, match="shape must be"):
        dg.predict_b200((256, 4096))


def test_plan_launches_with_the_inputs_pointers_and_out_itself(small):
    from gemmlab.family.problem import check_gated_pointers, spans

    calls = []
    p = plan.GatedPlan.__new__(plan.GatedPlan)  # no compile: launch() needs only its slots
    p.problem, p.arch, p._pointers, p._workspace = plan.GatedProblem(200, 136, 768), "sm90", True, False
    p.config, p._tail = A16Config(), ()
    p.fn = lambda *args: calls.append(args)
    out = torch.empty(200, 136, 1, dtype=torch.float16)
    tensors = (*small.inputs(), out)
    ptrs = check_gated_pointers(tensors, spans(*tensors))
    assert ptrs == tuple(t.data_ptr() for t in tensors[:6])
    assert p.launch(ptrs, *tensors) is out
    assert calls[-1][:6] == ptrs and calls[-1][6] is out and len(calls[-1]) == 7
    # out=None: the plan allocates a compact (M, N, 1) FP16 output and passes that tensor
    got = p.launch(ptrs, *tensors[:6])
    assert calls[-1][6] is got and got.shape == (200, 136, 1) and got.stride() == (136, 1, 1)
    assert got.dtype == torch.float16
    # a prepared launch reads the pointers once, when bound
    run = p.bind(*tensors)
    run()
    assert calls[-1][:6] == ptrs and calls[-1][6] is out
    # the A16 twin's plan passes an (M, K) FP16 workspace's pointer after the inputs: a fresh one per call
    p._workspace = True
    seen = []
    real = p.workspace  # the plan's own, bound before the class is patched to record what it hands out
    plan.GatedPlan.workspace, saved = (lambda self, a: seen.append(real(a)) or seen[-1]), plan.GatedPlan.workspace
    try:
        assert p.launch(ptrs, *tensors) is out
        assert len(calls[-1]) == 8 and calls[-1][:6] == ptrs and calls[-1][7] is out
        (a16,) = seen[-1]
        assert calls[-1][6] == a16.data_ptr() and a16.shape == (200, 768) and a16.dtype == torch.float16
        p.bind(*tensors)()
        assert calls[-1][6] == seen[-1][0].data_ptr() and len(seen) == 2
        # the W16 route: the A and the (2 N, K) weight workspaces after the inputs, the persistent grid after out
        p.config = W16Config(Sm90Config(tile_n=128, stages=4, dtype="float16", out_dtype="float16", gated=True))
        p._tail = (66,)
        assert p.launch(ptrs, *tensors) is out
        a16, w16 = seen[-1]
        assert (a16.shape, w16.shape, w16.dtype) == ((200, 768), (272, 768), torch.float16)
        assert calls[-1][:6] == ptrs and calls[-1][6:8] == (a16.data_ptr(), w16.data_ptr())
        assert calls[-1][8] is out and calls[-1][9:] == (66,)
    finally:
        plan.GatedPlan.workspace = saved


def test_gated_key_tells_apart_what_a_plan_depends_on(small):
    ins = small.inputs()
    out = torch.empty(200, 136, 1, dtype=torch.float16)
    key = api.gated_key(*ins, out)
    assert key == api.gated_key(*(t.clone() for t in ins), torch.empty_like(out))  # other memory, same signature
    assert key != api.gated_key(*ins) and api.gated_key(*ins)[-1] is None  # out given or not
    assert key != api.gated_key(fp4.as_bytes(ins[0]), *ins[1:], out)  # a's dtype
    assert key != api.gated_key(*ins, out.transpose(0, 1).contiguous().transpose(0, 1))  # out's strides
    assert api.gated_key(*ins[:5], "sfb2", out) is None  # not a tensor: the slow path names it


def test_the_decode_twin_takes_decode_rows_and_the_plan_compiles_it():
    pytest.importorskip("tvm_ffi")
    from gemmlab.family import heuristic_gated as hg
    from gemmlab.family.configs import A16Config, DecodeConfig, SwapConfig

    # the public call takes the decode twin below SWAP_FROM rows, the swap twin from there to DECODE_UP_TO (timed
    # faster than the decode twin on an H100), and above it the fastest by the models
    assert hg.DECODE_UP_TO == 128 and hg.A16_FROM == hg.DECODE_UP_TO + 1 and hg.SWAP_FROM == 64
    for m in (1, 40, 63, 64, 65, 100, 128):
        cfg = hg.choose_sm90(plan.GatedProblem(m, 4096, 7168))
        assert isinstance(cfg, DecodeConfig if m < 64 else SwapConfig)
    assert isinstance(hg.choose_sm90(plan.GatedProblem(383, 4096, 7168)), A16Config)
    for m in (1, 40, 64, 100, 128):
        cfg = hg.choose_decode_config(m, 4096, 7168)
        assert cfg.tokens >= m and cfg.tokens - m < 16
    # 4096 weight rows on 64-row CTAs: 64 row blocks, split 2: 64 pairs of the H100's 66 at once
    assert hg.choose_decode_config(64, 4096, 7168) == DecodeConfig(64, 1, 2, hg.decode_max_stages(64, 1, 2))
    fn = plan.gated_kernel(hg.choose_decode_config(40, 256, 1024), 40, 256, 1024)
    assert "barrier.cluster" in fn.__ptx__ and "wgmma.mma_async" in fn.__ptx__


def test_the_pointer_host_compiles_the_same_kernel():
    """The plan's host function (bare pointers, out as a tensor) launches the very kernel the tensor-taking one does:
    the kernels' PTX is identical, only the host code differs."""
    pytest.importorskip("tvm_ffi")
    import re

    from gemmlab.family.configs import PipelinedConfig
    from gemmlab.kernels import dual_gemm_sm90_pipelined as mod

    cfg = PipelinedConfig(tile_n=32)
    by_ptr = mod.compile_pipelined_ptrs("sm_90a", cfg, 128, 256, 512)
    by_tensor = mod.compile_pipelined("sm_90a", cfg, 128, 256, 512)

    def kernel(ptx):
        body = ptx[ptx.index(".entry"):]
        return re.sub(r"kernel_cutlass_\w+", "KERNEL", body)

    assert kernel(by_ptr.__ptx__) == kernel(by_tensor.__ptx__)
    assert "cvt.rn.f16x2.e4m3x2" in by_ptr.__ptx__
    with pytest.raises(ValueError, match="out_stride must be three ints"):
        mod.compile_pipelined_ptrs("sm_90a", cfg, 128, 256, 512, out_stride=(256, 1))
    with pytest.raises(ValueError, match="target sm_90a"):
        mod.compile_pipelined_ptrs("sm_100a", cfg, 128, 256, 512)


def test_the_a16_pointer_host_compiles_the_same_kernels():
    """The A16 twin through the plan: the FP16 workspace's pointer joins the six inputs; the pre-pass and the main
    kernel are the tensor-taking compile's, byte for byte."""
    pytest.importorskip("tvm_ffi")
    import re

    from gemmlab.family.configs import A16Config
    from gemmlab.kernels import dual_gemm_sm90_a16 as mod

    cfg = A16Config(64, 3)
    by_ptr = mod.compile_a16_ptrs("sm_90a", cfg, 200, 136, 512)
    by_tensor = mod.compile_a16("sm_90a", cfg, 200, 136, 512)

    def kernels(ptx):
        return [re.sub(r"kernel_cutlass_\w+", "KERNEL", body) for body in ptx.split(".entry")[1:]]

    assert len(kernels(by_ptr.__ptx__)) == 2  # the pre-pass and the main kernel
    assert kernels(by_ptr.__ptx__) == kernels(by_tensor.__ptx__)
    with pytest.raises(ValueError, match="target sm_90a"):
        mod.compile_a16_ptrs("sm_100a", cfg, 200, 136, 512)


@pytest.mark.parametrize("m, n, k, want", [
    (40, 4096, 7168, "DecodeConfig"), (64, 4096, 7168, "SwapConfig"), (128, 4096, 7168, "SwapConfig"),
    # the decisions the H100 swap sweep timed: the swap twin where its grid is one full wave, the A16 twin where the
    # swap twin's 160 CTAs leave a second wave nearly empty (results/nvidia-h100-80gb-hbm3/dual_gemm_swap.json)
    (512, 4096, 7168, "SwapConfig"), (640, 4096, 7168, "A16Config"), (1024, 4096, 7168, "SwapConfig"),
    # 2 x 64 = 128 CTAs of 64 columns: one wave, 7 x (2.94 + 11.89 / 2) + 4.26 = 66.5 us; 48 takes 2 x 86 = 172: two
    # (x 0.843 with two converter warpgroups = 56.0)
    (129, 4096, 7168, (64, 2)),
    (384, 4096, 7168, (96, 2)),  # 3 x 43 = 129 CTAs: one wave; 128 wide would make 96 CTAs, each 4/3 as long
    (512, 3072, 7168, (96, 2)),  # 4 x 32 = 128: one wave (128 wide: 96 CTAs, 108 us against 87)
    (640, 4096, 7168, (80, 1)),  # 5 x 52 = 260: two waves of 80 columns beat two of 96 (215 CTAs) and 128 (160)
    # 4 x 22 = 88 CTAs: every width fits one wave; 48 (one converter, 56.05 us) and 64 with two (66.46 x 0.843 =
    # 56.02) all but tie, and the model's 0.03 us goes to the second
    (512, 1024, 7168, (64, 2)),
    (2048, 14336, 7168, (128, 1)),  # 16 x 112 = 1792 CTAs: 14 waves; the widest per-column rate wins
])
def test_choose_sm90_by_rows(m, n, k, want):
    from gemmlab.family import heuristic_gated as hg

    cfg = hg.choose_sm90(plan.GatedProblem(m, n, k))
    if isinstance(want, str):
        assert type(cfg).__name__ == want
    else:  # the A16 width; the public call takes two converter warpgroups where the model finds them faster
        assert hg.A16_PUBLIC_CONVERTERS == 2
        a16 = hg.choose_a16(m, n, k)
        assert (a16.tile_n, a16.converters, a16.stages, a16.mma_converts) == (*want, a16_max_stages(want[0]), False)
        # and the A16 twin is the call's choice unless the W16 route's or the swap twin's model is faster
        times = {a16: hg.a16_time(m, n, k, a16.tile_n, converters=a16.converters)}
        w16 = hg.w16_candidate(m, n, k)
        if w16 is not None:
            times[w16[0]] = w16[1]
        swap = hg.choose_swap(m, n, k) if m <= hg.SWAP_UP_TO else None
        if swap is not None:
            times[swap] = hg.swap_time(swap, m, n, k)
        assert cfg == min(times, key=times.get)


@pytest.mark.parametrize("m, n, k, want", [
    # 2 x 64 = 128 CTAs of 64: one wave, 66.5 us x 0.843 with two converter warpgroups = 56.1; 48 takes two waves
    (129, 4096, 7168, (64, 2)),
    (256, 3072, 4096, (64, 2)),   # 64 x2: 4 x (2.94 + 5.95) + 4.26 = 39.8 x 0.843 = 33.6 us against 48's 33.9
    (384, 4096, 7168, (96, 2)),   # 3 x 43 = 129 CTAs: one wave; x 0.958
    (640, 4096, 7168, (80, 1)),   # 5 x 52 = 260: two waves of 80 columns beat 64 x2 (320 CTAs: three waves)
    (2048, 14336, 7168, (128, 1)),  # 14 waves at 128: no second converter fits beside its m64n256k16
])
def test_choose_a16_with_two_converters(m, n, k, want):
    from gemmlab.family import heuristic_gated as hg

    cfg = hg.choose_a16(m, n, k, max_converters=2)
    assert (cfg.tile_n, cfg.converters, cfg.stages) == (*want, a16_max_stages(want[0]))
    assert hg.choose_a16(m, n, k) == cfg  # the public call's default
    assert hg.choose_a16(m, n, k, max_converters=1).converters == 1


def test_a16_time_model_by_hand():
    from gemmlab.family import heuristic_gated as hg

    per_kilo, per_kilo_col, fixed = hg.A16_COST
    # 512 x 3072 x 7168 at tile_n 96: 4 x 32 = 128 CTAs, one wave on 132 SMs, 7 x 1024 of K
    assert hg.a16_time(512, 3072, 7168, 96) == pytest.approx(7 * (per_kilo + per_kilo_col * 0.75) + fixed)
    # on 100 SMs the same grid takes two waves: twice the per-wave time
    assert hg.a16_time(512, 3072, 7168, 96, 100) - fixed == pytest.approx(2 * (hg.a16_time(512, 3072, 7168, 96) - fixed))
    # one more row starts a fifth row of tiles: 5 x 32 = 160 CTAs, two waves
    assert hg.a16_time(513, 3072, 7168, 96) - fixed == pytest.approx(2 * (hg.a16_time(512, 3072, 7168, 96) - fixed))


def test_a16_cluster_hook_is_empty_until_timed(monkeypatch):
    """The cluster form (A16Config(cluster_m=2)) has no measured factor: a16_time refuses it and choose_a16 never
    returns it. With a factor, its waves count clusters of two 128-row tiles (M rounded up to 256 rows) on
    num_sms / 2 cluster slots, and only the per-wave time is scaled."""
    from gemmlab.family import heuristic_gated as hg

    assert hg.A16_CLUSTER == {}
    with pytest.raises(ValueError, match="no factor for cluster_m=2 at tile_n=128"):
        hg.a16_time(1024, 4096, 7168, 128, cluster_m=2)
    with pytest.raises(ValueError, match="cluster_m must be one of 1, 2"):
        hg.a16_time(1024, 4096, 7168, 128, cluster_m=4)
    for m, n, k in [(200, 4096, 7168), (1024, 4096, 7168), (2048, 14336, 4096)]:
        assert hg.choose_a16(m, n, k).cluster_m == 1
    monkeypatch.setitem(hg.A16_CLUSTER, 128, 0.5)
    per_kilo, per_kilo_col, fixed = hg.A16_COST
    one = hg.a16_time(1024, 4096, 7168, 128) - fixed  # 8 x 32 = 256 CTAs: two waves of 132
    assert hg.a16_time(1024, 4096, 7168, 128, cluster_m=2) - fixed == pytest.approx(0.5 * one)  # 128 clusters of 66
    # M = 640: 5 tiles become 3 clusters (6 CTAs) per column: 96 clusters, two waves, as the 160 one-CTA tiles
    assert hg.a16_time(640, 4096, 7168, 128, cluster_m=2) - fixed == pytest.approx(
        0.5 * (hg.a16_time(640, 4096, 7168, 128) - fixed))
    # 128 x 4 = 2 clusters; 130 SMs give 65 cluster slots: 1 wave either way, the factor alone
    assert hg.a16_time(256, 512, 7168, 128, 130, cluster_m=2) - fixed == pytest.approx(
        0.5 * 7 * (per_kilo + per_kilo_col))


@pytest.mark.parametrize("kwargs, exc, match", [
    (dict(m=0, n=3072, k=7168), ValueError, "m must be"),
    (dict(m=512, n=3072.0, k=7168), TypeError, "n must be"),
    (dict(m=512, n=3072, k=7168, num_sms=0), ValueError, "num_sms must be"),
    (dict(m=512, n=3072, k=7168, max_converters=3), ValueError, "max_converters must be"),
])
def test_choose_a16_rejects_bad_input(kwargs, exc, match):
    from gemmlab.family import heuristic_gated as hg

    with pytest.raises(exc, match=match):
        hg.choose_a16(**kwargs)


def test_choose_a16_takes_numpy_ints():
    from gemmlab.family import heuristic_gated as hg

    assert hg.choose_a16(np.int64(512), np.int32(3072), np.int64(7168)) == hg.choose_a16(512, 3072, 7168)


@pytest.mark.parametrize("device, shapes", [("nvidia-h100-80gb-hbm3", 24), ("nvidia-h200", 12)])
def test_a16_model_picks_the_sweeps_fastest_width(device, shapes):
    """On the stored sweeps (every width timed with one converter warpgroup, kernels alone; the model was fitted on
    the H100's) the model's width is the fastest one timed, or within 3 % of it, and the A16 twin's best width beats
    the fast twin on every shape (so the public call gives the fast twin no rows)."""
    from gemmlab.family import heuristic_gated as hg
    from gemmlab.measure import dual_gemm_tables as tables
    from gemmlab.measure.bench import load_results

    doc = load_results("dual_gemm_a16", device)
    if doc is None:
        pytest.skip(f"no stored A16 sweep for {device}")
    rows = tables.a16_sweep_rows(doc)
    assert len(rows) >= shapes and all("error" not in r for r in rows)
    for r in rows:
        widths = {int(c[1:]): t for c, t in r.items() if c[0] == "n" and c[1:].isdigit()}
        m, n, k = (int(x) for x in r["shape"].split("x"))
        assert m >= hg.A16_FROM and r["pick"] != "fast", r
        model = min(widths, key=lambda bn: (hg.a16_time(m, n, k, bn), -bn))
        assert widths[model] <= 1.03 * min(widths.values()), r
        assert min(widths.values()) < r["fast_us"], r
        assert r["all_ok"], r


def test_two_converter_warpgroups_factor_matches_its_run():
    """A16_TWO_CONVERTERS is what the H100 measured: two converter warpgroups faster than one at 64 and 96 on every
    shape timed, each ratio within 0.02 of the factor."""
    import re

    from gemmlab.family import heuristic_gated as hg
    from gemmlab.measure.bench import load_results

    doc = load_results("dual_gemm_a16_converters", "nvidia-h100-80gb-hbm3")
    if doc is None:
        pytest.skip("no stored converters run")
    assert len(doc["shapes"]) >= 6
    for shape in doc["shapes"]:
        t = {}
        for r in shape["rows"]:
            assert r["ok"], r
            t[(int(re.search(r"tile_n=(\d+)", r["config"]).group(1)),
               int(re.search(r"converters=(\d+)", r["config"]).group(1)))] = r["kernel_us"]
        for tile_n, factor in hg.A16_TWO_CONVERTERS.items():
            ratio = t[(tile_n, 2)] / t[(tile_n, 1)]
            assert ratio < 1 and abs(ratio - factor) < 0.02, (shape["m"], shape["n"], shape["k"], tile_n, ratio)


@pytest.mark.parametrize("sweep", ["sweep_decode", "sweep_a16"])
def test_sweeps_check_before_the_tier(sweep):
    fn = getattr(dg, sweep)
    with pytest.raises(ValueError, match="K must be a multiple of 256"):
        fn(128, 128, 384)
    with pytest.raises(ValueError, match="rounds"):
        fn(128, 128, 256, rounds=0)
    with pytest.raises(TypeError, match="M must be"):
        fn(128.0, 128, 256)
    if detect_tier() == "cpu":
        with pytest.raises(TierError, match=sweep):
            fn(np.int64(128), 128, 256)


def test_time_vs_bf16_checks_before_the_tier_and_the_bf16_path_is_the_gate():
    with pytest.raises(ValueError, match="K must be a multiple of 256"):
        dg.time_vs_bf16(128, 128, 384)
    with pytest.raises(ValueError, match="per_round"):
        dg.time_vs_bf16(128, 128, 256, per_round=0)
    if detect_tier() == "cpu":
        with pytest.raises(TierError, match="time_vs_bf16"):
            dg.time_vs_bf16(128, 128, 256)
    assert len(set(dg.BF16_PATH_SHAPES)) == len(dg.BF16_PATH_SHAPES)
    assert set(fp4.BENCHMARK_SHAPES) <= set(dg.BF16_PATH_SHAPES)
    # the BF16 path computes the gate of one GEMM over [B1; B2] (checked here in FP32 on the CPU)
    g = torch.Generator().manual_seed(5)
    x, w = torch.randn(8, 64, generator=g), torch.randn(48, 64, generator=g)
    h = torch.empty(8, 48)
    got = dg.bf16_path(x, w, h, 24)
    want = torch.nn.functional.silu(x @ w[:24].T) * (x @ w[24:].T)
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-5)


def test_time_case_checks_before_the_tier():
    with pytest.raises(ValueError, match="K must be a multiple of 256"):
        dg.time_case(128, 128, 384)
    with pytest.raises(ValueError, match="rounds"):
        dg.time_case(128, 128, 256, rounds=0)
    if detect_tier() == "cpu":
        with pytest.raises(TierError, match="time_case"):
            dg.time_case(128, 128, 256)


def test_tables_summarize_and_format():
    from gemmlab.measure import dual_gemm_tables as t

    rows = [dict(m=256, n=4096, k=7168, ok=True, gemmlab_us=40.0, prepared_us=36.0, stock_b_us=48.0,
                 reference_a_us=400.0, prepared_kernel_us=35.0, stock_b_kernels_us=42.0, roofline_us=30.4,
                 vs_a=10.0, vs_b=1.2, vs_b_prepared=48 / 36, vs_b_kernel=1.2, of_roofline=30.4 / 35),
            dict(m=512, n=4096, k=7168, ok=True, gemmlab_us=80.0, prepared_us=70.0, stock_b_us=80.0,
                 reference_a_us=800.0, prepared_kernel_us=70.0, stock_b_kernels_us=77.0, roofline_us=60.8,
                 vs_a=10.0, vs_b=1.0, vs_b_prepared=80 / 70, vs_b_kernel=1.1, of_roofline=60.8 / 70),
            dict(m=256, n=3072, k=4096, ok=False, error="Traceback ...\nRuntimeError: launch failed\n")]
    s = t.summarize(rows)
    assert s["ran"] == 2 and s["shapes"] == 3 and s["all_correct"] is False
    assert s["geomean_vs_b"] == pytest.approx(math.sqrt(1.2 * 1.0))
    assert s["goal_vs_b"] is False  # 1.095 < 1.10
    assert s["goal_vs_a"] is True
    text = t.format_bench({"device": "TEST GPU", "rows": rows, "summary": s})
    assert "256x3072x4096: FAILED: RuntimeError: launch failed" in text
    assert "x1.10 over (b) (goal 1.1: NOT met)" in text
    assert t.summarize([])["geomean_vs_b"] is None


def test_figures_draw_from_rows(tmp_path, monkeypatch):
    from gemmlab.measure import dual_gemm_tables as t
    from gemmlab import figures

    monkeypatch.setattr(figures, "FIGURES_DIR", tmp_path)
    path, data = t.draw_prediction(dg.prediction_table(), name="pred")
    assert path.exists() and path.parent == tmp_path
    assert [d[:3] for d in data] == list(fp4.BENCHMARK_SHAPES)  # the best tile of each shape, in order
    row = dict(m=256, n=4096, k=7168, ok=True, gemmlab_us=40.0, prepared_kernel_us=35.0, stock_b_us=48.0,
               reference_a_us=400.0, roofline_us=30.4)
    path, data = t.draw_benchmark([{"device": "TEST GPU", "rows": [row, {"m": 1, "n": 8, "k": 256, "error": "x"}]}],
                                  name="bench")
    assert path.exists() and list(data) == ["TEST GPU"] and len(data["TEST GPU"]) == 1
    with pytest.raises(ValueError, match="docs must hold"):
        t.draw_benchmark([None, {"rows": [{"error": "x"}]}])


def test_prepare_needs_an_output(small):
    with pytest.raises(ValueError, match="out must be a tensor"):
        plan.prepare_gated(*small.inputs(), out=None)


def test_chapter11_exercise_solutions_by_hand():
    from gemmlab.course.exercises import ch11

    assert ch11.solution_sol_megabytes() == round((256 * 7168 / 2 + 2 * 4096 * 7168 / 2 + (256 + 2 * 4096) * 448
                                                    + 2 * 256 * 4096) / 1e6, 2) == 36.16
    assert ch11.solution_permuted_offset() == (1 * 112 + 1) * 512 + (200 % 32) * 16 + 2 * 4 + 1 == 57993
    assert ch11.solution_stock_weight_ratio() == round(2 / (0.5 + 1 / 16), 2) == 3.56
    assert ch11.solution_unshifted_tiles() == (1, 3)  # the tiles that start at row 64 of a 128-row atom


# ---------------------------------------------------------------- on a Hopper GPU


def _gpu_ops(shape, seed=0):
    return fp4.generate(*shape, seed=seed, device="cuda")


@pytest.mark.gpu
@pytest.mark.sm90
@pytest.mark.parametrize("shape", fp4.TEST_SHAPES + fp4.BENCHMARK_SHAPES[2:3])
def test_public_call_matches_reference_with_poisoned_output(shape):
    ops = _gpu_ops(shape, seed=7)
    assert torch.isnan(ops.c.float()).all()
    out = api.gated_dual_gemm(*ops.inputs(), out=ops.c)
    torch.cuda.synchronize()
    assert out is ops.c
    res = fp4.check_close(out, fp4.reference(*ops.inputs()))
    assert res.ok, res


@pytest.mark.gpu
@pytest.mark.sm90
def test_public_call_allocates_and_prepared_launch_matches():
    ops = _gpu_ops((256, 256, 512), seed=8)
    ref = fp4.reference(*ops.inputs())
    out = api.gated_dual_gemm(*ops.inputs())
    assert out.dtype == torch.float16 and tuple(out.shape) == (256, 256, 1) and out.is_cuda
    assert fp4.check_close(out, ref).ok
    run = plan.prepare_gated(*ops.inputs(), out=ops.c)
    run()
    torch.cuda.synchronize()
    assert fp4.check_close(ops.c, ref).ok


@pytest.mark.gpu
@pytest.mark.sm90
def test_public_call_with_fresh_activations_and_kept_weights():
    # the plan reuses the weights' operands: fresh a / out (new objects, often at a freed one's address) and a
    # tensor moved with set_ must each be read where they are now
    ops = _gpu_ops((256, 256, 512), seed=10)
    a, b1, b2, sfa, sfb1, sfb2 = ops.inputs()
    for seed in (11, 12, 13):
        fresh = _gpu_ops((256, 256, 512), seed=seed)
        out = torch.full((256, 256, 1), float("nan"), dtype=torch.float16, device="cuda")
        api.gated_dual_gemm(fresh.a, b1, b2, fresh.sfa, sfb1, sfb2, out=out)
        torch.cuda.synchronize()
        assert fp4.check_close(out, fp4.reference(fresh.a, b1, b2, fresh.sfa, sfb1, sfb2)).ok, seed
        del fresh, out
    other = _gpu_ops((256, 256, 512), seed=14)
    a.set_(other.a.clone())  # same object, other memory
    out = torch.full((256, 256, 1), float("nan"), dtype=torch.float16, device="cuda")
    api.gated_dual_gemm(a, b1, b2, sfa, sfb1, sfb2, out=out)
    torch.cuda.synchronize()
    assert fp4.check_close(out, fp4.reference(a, b1, b2, sfa, sfb1, sfb2)).ok


@pytest.mark.gpu
@pytest.mark.sm90
def test_time_case_runs_and_reports():
    row = dg.time_case(256, 256, 512, rounds=2, per_round=2)
    assert row["ok"] and row["stock_ok"]
    for name in ("gemmlab", "prepared", "reference_a", "stock_b", "prepared_kernel", "stock_b_kernels"):
        assert row[f"{name}_us"] > 0 and len(row[f"{name}_round_us"]) == 2
    assert row["vs_b"] == pytest.approx(row["stock_b_us"] / row["gemmlab_us"])


@pytest.mark.gpu
@pytest.mark.sm90
@pytest.mark.parametrize("shape", [(200, 136, 768), (256, 3072, 4096)])
def test_baselines_on_the_gpu(shape):
    ops = _gpu_ops(shape, seed=9)
    ref = fp4.reference(*ops.inputs())  # FP32 on the GPU
    a = dg.reference_pipeline(*ops.inputs())
    w = dg.prepare_stock(ops.b1, ops.b2, ops.sfb1, ops.sfb2)
    b = dg.stock_path(ops.a, ops.sfa, w)
    assert fp4.check_close(a, ref).ok
    assert fp4.check_close(b, ref).ok


def test_the_gated_plan_asks_the_device_for_its_cluster_capacity(monkeypatch):
    """Up to SWAP_UP_TO rows the plan's choice uses the clusters the driver says fit (a GPU whose pairs are scarce
    gets no split), above it none are asked for."""
    from gemmlab.family.configs import DecodeConfig

    asked = []

    def clusters(size, device=None):
        asked.append(size)
        return {1: 132, 2: 20, 4: 30}[size]

    monkeypatch.setattr(plan.hardware, "sm_count", lambda device=None: 132)
    monkeypatch.setattr(plan.hardware, "max_active_clusters", clusters)
    cfg = plan.gated_sm90_config(plan.GatedProblem(1, 4096, 7168), "cuda:0")
    assert asked == [1, 2, 4] and isinstance(cfg, DecodeConfig) and cfg.split == 1
    monkeypatch.setattr(plan.hardware, "max_active_clusters", lambda size, device=None: (132, 66, 30)[size // 2])
    assert plan.gated_sm90_config(plan.GatedProblem(1, 4096, 7168), "cuda:0").split == 2  # an H100's: pairs fit
    asked.clear()
    monkeypatch.setattr(plan.hardware, "max_active_clusters", clusters)
    plan.gated_sm90_config(plan.GatedProblem(512, 4096, 7168), "cuda:0")
    assert asked == [1, 2, 4]
    asked.clear()
    plan.gated_sm90_config(plan.GatedProblem(1025, 4096, 7168), "cuda:0")
    assert asked == []


def test_a16_sweep_rows_leave_cluster_forms_out():
    """A sweep row of the cluster form (same width, one converter) must not stand in for the one-CTA width's time."""
    from gemmlab.family.configs import A16Config, PipelinedConfig, a16_max_stages
    from gemmlab.measure import dual_gemm_tables as tables

    one, cl = A16Config(128, a16_max_stages(128)), A16Config(128, a16_max_stages(128, 2), cluster_m=2)
    rows = [dict(config=repr(PipelinedConfig(tile_n=64)), ok=True, kernel_us=250.0),
            dict(config=repr(one), ok=True, kernel_us=204.6), dict(config=repr(cl), ok=True, kernel_us=290.7),
            dict(config="bf16_path", ok=True, kernel_us=173.8)]
    for order in (rows, rows[::-1]):
        r, = tables.a16_sweep_rows({"shapes": [dict(m=1024, n=4096, k=7168, sms=132, rows=order)]})
        assert r["n128"] == 204.6 and r["best"] == "n128"
