"""Bad input gets a clear error naming the argument and the rule, or the answer Python ints give: never a wrong one.

One test (or a few) per finding of a new user's probes of the public calls, models and encoders: numpy
and torch scalars are numbers, floats and bools are not ints, out-of-range values are refused, and work
too large to finish is refused with the limit named.
"""
import math
import re

import numpy as np
import pytest
import torch

from gemmlab import checks


# ---------------------------------------------------------------- the checks themselves


@pytest.mark.parametrize("value", [7, np.int64(7), np.int8(7), np.uint16(7), torch.tensor(7), np.array(7)])
def test_check_int_takes_numpy_and_torch_integers_and_returns_a_python_int(value):
    got = checks.check_int("x", value, lo=1)
    assert got == 7 and type(got) is int


@pytest.mark.parametrize("value", [7.0, np.float32(7), True, np.bool_(True), torch.tensor(7.0), "7", None, [7]])
def test_check_int_refuses_floats_bools_and_others_naming_the_type(value):
    with pytest.raises(TypeError, match=r"^x must be an int; got "):
        checks.check_int("x", value)


def test_check_int_message_names_an_int64_an_int_not_a_non_number():
    with pytest.raises(ValueError, match=r"^x must be >= 1; got -3$"):
        checks.check_int("x", np.int64(-3), lo=1)


@pytest.mark.parametrize("value", [1.5, np.float32(1.5), np.float64(1.5), torch.tensor(1.5), 3, np.int64(3)])
def test_check_real_takes_numpy_and_torch_numbers(value):
    got = checks.check_real("r", value)
    assert got == float(value) and type(got) is float


@pytest.mark.parametrize("value,exc", [(float("nan"), ValueError), (float("inf"), ValueError), (True, TypeError),
                                       ("1", TypeError), (None, TypeError)])
def test_check_real_refuses_nan_inf_bool_and_strings(value, exc):
    with pytest.raises(exc, match="^r must be a"):
        checks.check_real("r", value)


def test_check_choice_is_exact_about_kinds():
    assert checks.check_choice("t", np.int64(128), (64, 128)) == 128
    assert checks.check_choice("c", [2, 1], ((1, 1), (2, 1))) == (2, 1)
    for value, choices in ((128.0, (64, 128)), (1, (False, True)), (True, (0, 1)), ((2.0, 1), ((2, 1),))):
        with pytest.raises(TypeError, match="of another type"):
            checks.check_choice("x", value, choices)
    with pytest.raises(ValueError, match="must be one of"):
        checks.check_choice("x", np.array([64, 128]), (64, 128))


# ---------------------------------------------------------------- silent wrong answers


def test_simulate_reads_a_pair_of_numpy_ints_as_tiles_and_k():
    from gemmlab.simulator import predict_designs, simulate

    assert simulate(4, (np.int64(8), np.int64(6)), 3, 1).total == simulate(4, (8, 6), 3, 1).total == 51.0
    assert predict_designs(4, (np.int64(8), np.int64(6)), 3, 1) == predict_designs(4, (8, 6), 3, 1)
    assert simulate(np.int64(4), [np.int32(6)] * 8, np.float32(3), torch.tensor(1)).total == 51.0


@pytest.mark.parametrize("tiles", [(8.0, 6), (8, 6.5), [6, 2.0], (True, 6)])
def test_simulate_refuses_float_tile_counts(tiles):
    from gemmlab.simulator import simulate

    with pytest.raises(TypeError, match="tiles"):
        simulate(4, tiles, 3, 1)


@pytest.mark.parametrize("args,match", [
    ((10 ** 9, (8, 6), 3, 1), "stages must be <= 1024"),
    ((4, (10 ** 5, 10 ** 4), 3, 1), "the simulator walks at most 200000"),
    ((4, [10 ** 6], 3, 1), "the simulator walks at most 200000"),
    ((4, (10, 100), 3, 1, {"consumers": 10 ** 6}), "consumers must be <= 8"),
])
def test_simulate_refuses_unbounded_work_naming_the_limit(args, match):
    from gemmlab.simulator import simulate

    kw = args[4] if len(args) > 4 else {}
    with pytest.raises(ValueError, match=match):
        simulate(*args[:4], **kw)


def test_gemm_problem_stores_python_ints():
    from gemmlab.family.problem import GemmProblem

    p = GemmProblem(np.int64(2 ** 40), np.int64(4096), np.int64(8192))
    assert type(p.m) is int and p.flops == 2 * 2 ** 40 * 4096 * 8192
    assert p == GemmProblem(2 ** 40, 4096, 8192) and hash(p) == hash(GemmProblem(2 ** 40, 4096, 8192))
    with pytest.raises(TypeError, match="m must be an int; got float"):
        GemmProblem(256.0, 256, 256)


def test_pack_fp4_refuses_codes_outside_a_nibble_and_floats():
    from gemmlab import nvfp4 as f

    for bad in ([16, 3], [-1, 3]):
        with pytest.raises(ValueError, match="codes 0..15; got values from"):
            f.pack_fp4(torch.tensor(bad))
    with pytest.raises(TypeError, match="integer dtype"):
        f.pack_fp4(torch.tensor([1.0, 3.0]))
    with pytest.raises(TypeError, match="torch.Tensor"):
        f.pack_fp4([1, 3])
    assert f.pack_fp4(torch.tensor([15, 3], dtype=torch.int64)).tolist() == [0x3F]


def test_unpack_fp4_and_decode_refuse_what_is_not_fp4():
    from gemmlab import nvfp4 as f

    for dtype in (torch.int32, torch.float32):
        with pytest.raises(TypeError, match="packed must have dtype uint8"):
            f.unpack_fp4(torch.tensor([0x21], dtype=dtype))
    with pytest.raises(ValueError, match="codes 0..15"):
        f.e2m1_decode(torch.tensor([16, 17, 31]))
    with pytest.raises(TypeError, match="integer dtype"):
        f.e2m1_decode(torch.tensor([1.7]))


def test_dequantize_refuses_scale_bytes_read_as_integers():
    from gemmlab import nvfp4 as f

    packed = torch.full((1, 8), 0x22, dtype=torch.uint8)  # sixteen 1.0s
    sf = torch.tensor([[3.0]]).to(torch.float8_e4m3fn)
    assert f.dequantize(packed, sf).max().item() == 3.0
    with pytest.raises(TypeError, match=r"raw e4m3 bytes\? pass sf.view\(torch.float8_e4m3fn\)"):
        f.dequantize(packed, sf.view(torch.uint8))  # its byte 0x44 read as 68 gave 68.0 (the probe: 288 vs 3.0)
    assert f.dequantize(packed, sf.view(torch.uint8).view(torch.float8_e4m3fn)).max().item() == 3.0


def test_permuted_offsets_and_unpermute_refuse_rows_and_columns_outside_the_scales():
    from gemmlab import nvfp4 as f

    assert f.permuted_offset(np.int64(200), 5, 256, 448) == f.permuted_offset(200, 5, 256, 448) == 57993
    for args, match in (((256, 0, 256, 8), "i must be <= 255"), ((0, 8, 256, 8), "j must be <= 7"),
                        ((-1, 0, 256, 8), "i must be >= 0"), ((0, 0, 256, 8, -1), "l must be >= 0")):
        with pytest.raises(ValueError, match=match):
            f.permuted_offset(*args)
    with pytest.raises(TypeError, match="i must be an int; got float"):
        f.permuted_offset(1.5, 0, 256, 8)
    perm = f.permute_scales(torch.ones(200, 12, 1).to(torch.float8_e4m3fn))  # (32, 4, 2, 4, 3, 1)
    assert f.unpermute_scales(perm, 256, 12).shape == (256, 12, 1)
    for args, match in (((257, 12), "mn must be <= 256"), ((200, 13), "sf_k must be <= 12"), ((0, 12), "mn must be >= 1"),
                        ((200.0, 12), "mn must be an int")):
        with pytest.raises((TypeError, ValueError), match=match):
            f.unpermute_scales(perm, *args)
    with pytest.raises(ValueError, match=r"perm must have shape \(32, 4, rest_mn, 4, rest_k, L\)"):
        f.blocked_bytes(torch.zeros(128, 4, dtype=torch.uint8))


def test_check_close_reports_the_tolerances_it_used_and_refuses_bad_ones():
    from gemmlab import nvfp4 as f

    out, ref = torch.zeros(4), torch.full((4,), 0.05)
    r = f.check_close(out, ref, rtol=0.1, atol=0.1)
    assert r.ok and "rtol = atol = 0.1)" in str(r)
    assert "rtol = 0.01, atol = 0.2" in str(f.check_close(out, ref, rtol=0.01, atol=0.2))
    assert "rtol = atol = 0.001" in str(f.check_close(out, out))
    for bad in (-1e-3, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="rtol must be"):
            f.check_close(out, ref, rtol=bad)
    with pytest.raises(TypeError, match="atol must be a number"):
        f.check_close(out, ref, atol="1e-3")


def test_split_ranges_refuses_counts_that_leave_slices_empty_or_negative():
    from gemmlab.family.configs import split_ranges

    with pytest.raises(ValueError, match=r"effective_splits\(10, 20\) = 10"):
        split_ranges(10, 20)  # returned empty and negative slices: (10, 0), (11, -1), ...
    assert split_ranges(np.int64(10), np.int64(5)) == split_ranges(10, 5) == [(0, 2), (2, 2), (4, 2), (6, 2), (8, 2)]


def test_describe_tensor_map_refuses_what_the_driver_rejects():
    from gemmlab.tma import describe_tensor_map

    with pytest.raises(ValueError, match="at most 2\\^32 elements"):
        describe_tensor_map((2 ** 32 + 1, 64), torch.float16, (64, 64))
    with pytest.raises(ValueError, match="below 2\\^40 bytes"):
        describe_tensor_map((4, 64), torch.float16, (4, 64), strides=(2 ** 39, 1))
    assert describe_tensor_map((2 ** 32, 64), torch.float16, (64, 64))["globalDim"] == (64, 2 ** 32)
    assert describe_tensor_map((np.int64(100), 72), torch.float16, (64, 64), "none")["expect_tx_bytes"] == 8192


@pytest.mark.parametrize("config", ["128x999 c2x1 m8 s4", "128x256 c2x1 m8 s99", "128x256 c3x1 m8 s4",
                                    "0x256 c2x1 m8 s4", "128x0 c2x1 m8 s4", "128x256 c2x1 m8 s1"])
def test_predict_sm90_refuses_configs_no_kernel_has(config):
    from gemmlab.measure.calibration import predict_sm90

    with pytest.raises(ValueError, match="is not a chapter 07 kernel"):
        predict_sm90((4096, 4096, 4096), config, "nvidia-h200")


@pytest.mark.parametrize("eff", [0, 0.0, -0.5, 7.5, float("nan")])
def test_calibration_refuses_an_hbm_efficiency_outside_zero_to_one(eff):
    from gemmlab.measure.calibration import Calibration

    with pytest.raises(ValueError, match="hbm_efficiency must be"):
        Calibration({}, hbm_efficiency=eff)


def test_predict_sm90_takes_numpy_numbers():
    from gemmlab.measure.calibration import predict_sm90

    plain = predict_sm90((8192, 8192, 8192), "128x256 c2x1 m8 s4", "nvidia-h200", ghz=1.5)
    assert predict_sm90((np.int64(8192), 8192, np.int32(8192)), "128x256 c2x1 m8 s4", "nvidia-h200",
                        ghz=np.float32(1.5)) == pytest.approx(plain)


# ---------------------------------------------------------------- raw errors where a clear one belongs


def test_wgmma_descriptor_takes_numpy_ints():
    from gemmlab.wgmma import decode_smem_desc, encode_smem_desc

    for swizzle in ("64B", "128B", "32B", "none"):
        want = encode_smem_desc(0x4000, 16, 1024, swizzle)
        assert encode_smem_desc(np.int64(0x4000), np.int64(16), np.int32(1024), swizzle) == want
        assert decode_smem_desc(np.uint64(want)).value == want


def test_tcgen05_descriptors_take_numpy_ints_and_refuse_non_bools():
    from gemmlab.tcgen05 import InstrDesc, SmemDesc

    want = SmemDesc(0, 16, 1024, "32B").encode()
    assert SmemDesc(np.int64(0), np.int64(16), np.int64(1024), "32B").encode() == want
    assert type(SmemDesc(np.int64(0), 16, 1024).start_addr) is int
    for field in ("negate_a", "negate_b", "saturate", "sparse"):
        with pytest.raises((TypeError, ValueError), match=f"{field} must be one of False, True"):
            InstrDesc(**{field: 2})
    assert InstrDesc(m=np.int64(128), n=np.int64(256)).encode() == InstrDesc(m=128, n=256).encode()


def test_configs_refuse_floats_and_store_python_ints():
    from gemmlab.family.configs import Sm90Config, Sm100Config

    with pytest.raises(TypeError, match="tile_m must be one of 64, 128, 192; got float 128.0"):
        Sm90Config(tile_m=128.0)
    with pytest.raises(TypeError, match="tile_k must be an int"):
        Sm90Config(tile_k=64.0)
    with pytest.raises(TypeError, match="swap_ab must be one of False, True"):
        Sm90Config(swap_ab=1)
    cfg = Sm90Config(tile_m=np.int64(128), tile_n=np.int32(256), cluster=[2, 1])
    assert cfg == Sm90Config() and type(cfg.tile_n) is int and cfg.cluster == (2, 1)
    assert Sm100Config(block_n=np.int64(128)) == Sm100Config(block_n=128)


def test_banks_and_pipeline_state_refuse_float_choices():
    from gemmlab.banks import wavefronts
    from gemmlab.pipeline import PipelineState

    with pytest.raises(TypeError, match="width must be one of 4, 8, 16; got float 4.0"):
        wavefronts([0] * 32, width=4.0)
    with pytest.raises(TypeError, match="phase must be one of 0, 1; got float 1.0"):
        PipelineState(4, phase=1.0)
    st = PipelineState(np.int64(4), phase=np.int64(1))
    assert type(st.stages) is int and st == PipelineState(4, phase=1)


def test_compile_multicast_blames_clusters():
    from gemmlab.tma import compile_multicast

    for bad in (-1, 0):
        with pytest.raises(ValueError, match="^clusters must be >= 1"):
            compile_multicast("sm_90a", clusters=bad)
    with pytest.raises(TypeError, match="^clusters must be an int"):
        compile_multicast("sm_90a", clusters=2.0)


def test_dual_gemm_prediction_refuses_work_it_cannot_finish():
    from gemmlab.measure.dual_gemm import predict_b200

    with pytest.raises(ValueError, match="the simulator walks at most"):
        predict_b200((2 ** 40, 4096, 7168))  # ran 10 minutes to 14.7 GB
    small = predict_b200((np.int64(256), np.int64(4096), np.int64(7168)), tile_n=np.int64(128))
    assert small == predict_b200((256, 4096, 7168), tile_n=128) and type(small["m"]) is int
    with pytest.raises(TypeError, match="tile_n must be one of"):
        predict_b200((256, 4096, 7168), tile_n=128.0)


@pytest.mark.parametrize("kwargs,exc,match", [
    (dict(m=np.int64(256)), None, None),
    (dict(m=256.0), TypeError, "M must be an int"),
    (dict(m=0), ValueError, "M must be a positive multiple"),
    (dict(tile_m=128.0), TypeError, "tile_m must be an int"),
])
def test_compile_gemm_nt_checks_before_the_dsl(kwargs, exc, match):
    from gemmlab.wgmma import compile_gemm_nt

    if exc is None:
        assert compile_gemm_nt("sm_90a", **kwargs).__ptx__
    else:
        with pytest.raises(exc, match=match):
            compile_gemm_nt("sm_90a", **kwargs)


@pytest.mark.parametrize("m", [0, -1, 256.0])
def test_compile_gemm_sm100_checks_sizes_before_the_dsl(m):
    from gemmlab.family.configs import Sm100Config
    from gemmlab.kernels.gemm_sm100 import compile_gemm_sm100

    with pytest.raises((TypeError, ValueError), match="^m must be"):
        compile_gemm_sm100("sm_100a", Sm100Config(), m=m, n=256, k=256)


# ---------------------------------------------------------------- the family's four public calls
# Every check below fires on the CPU tier before the TierError, and on a (faked) GPU tier before anything
# compiles: the compile is patched to raise Compiled, so a call that got past the checks says so.

BF = torch.bfloat16


class Compiled(Exception):
    """Raised by the patched compile: the call passed every check and went on to compile."""


@pytest.fixture
def machine(monkeypatch):
    """``machine(tier)``: this process as a machine of ``tier`` on which nothing compiles (the family's one compile
    cache and ``compile_for`` raise :class:`Compiled`), with empty plan caches. On a GPU tier the CPU tensors stand
    in for CUDA ones (the device-kind checks after the tier are switched off)."""
    import gemmlab.compile as gc
    from gemmlab import hardware, tiers
    from gemmlab.family import api, plan
    from gemmlab.kernels import dual_gemm_sm90

    def no_compile(*args, **kwargs):
        raise Compiled()

    monkeypatch.setattr(gc, "compile_for", no_compile)
    monkeypatch.setattr(plan, "compiled", lambda key, build: no_compile())
    for cache in ("_PLANS", "_BY_PROBLEM", "_GROUPED", "_GATED"):
        monkeypatch.setattr(api, cache, {})

    def use(tier):
        monkeypatch.setattr(tiers, "detect_tier", lambda: tier)
        if tier != "cpu":
            monkeypatch.setattr(api, "check_devices", lambda *tensors: None)
            monkeypatch.setattr(api, "grouped_machine", lambda device, caller="gemmlab.grouped_gemm":
                                tiers.require_tier("sm90", caller))
            monkeypatch.setattr(dual_gemm_sm90, "check_devices", lambda *tensors: None)
            monkeypatch.setattr(hardware, "sm_count", lambda device=None: 132)
            monkeypatch.setattr(hardware, "max_active_clusters",
                                lambda size, device=None: {1: 132, 2: 66, 4: 30}[size])
    return use


def _refused(tier, exc, match, call):
    """``call()`` raises ``exc`` matching ``match`` on a machine of ``tier`` (never TierError or Compiled first)."""
    with pytest.raises(exc, match=match):
        call()


def _accepted(tier, call):
    """``call()`` passes every argument check: TierError on the CPU tier, a compile on a GPU tier."""
    from gemmlab.tiers import TierError

    with pytest.raises(TierError if tier == "cpu" else Compiled):
        call()


def _dense(m=64, n=64, k=64):
    return torch.zeros(m, k, dtype=BF), torch.zeros(n, k, dtype=BF).t()


JUNK = {"ndarray": np.zeros((64, 64), np.float32), "list": [[1.0] * 64] * 64, "None": None, "int": 3,
        "int64": np.int64(3), "str": "a"}


@pytest.mark.parametrize("tier", ["cpu", "sm90", "sm100"])
@pytest.mark.parametrize("which,junk", [(w, j) for w in ("a", "b", "out") for j in JUNK if (w, j) != ("out", "None")])
def test_gemm_names_an_argument_that_is_not_a_tensor(machine, tier, which, junk):
    """It was an AttributeError from building the plan-cache key ('numpy.ndarray' object has no attribute
    'stride'); now the key's failure sends the call to the checks, which name the argument (out=None: the default)."""
    import gemmlab

    junk = JUNK[junk]
    machine(tier)
    a, b = _dense()
    args = {"a": a, "b": b, "out": torch.zeros(64, 64, dtype=BF), which: junk}
    _refused(tier, TypeError, f"^{which} must be a torch.Tensor; got ", lambda: gemmlab.gemm(**args))


def test_plan_key_covers_every_operands_device_and_layout():
    """The dense plan cache keyed on a.device only: a cache hit skipped the device checks of b and out."""
    from gemmlab.family.api import plan_key

    a, b = _dense()
    out = torch.zeros(64, 64, dtype=BF)
    key = plan_key(a, b, out)
    a2, b2 = _dense()  # same signature, other memory: the same plan
    assert plan_key(a2, b2, torch.zeros(64, 64, dtype=BF)) == key and hash(plan_key(a2, b2, out)) == hash(key)
    meta = {"a": a.to("meta"), "b": b.to("meta"), "out": out.to("meta")}
    for name in ("a", "b", "out"):
        args = {"a": a, "b": b, "out": out, name: meta[name]}
        assert plan_key(**args) != key, f"{name}'s device is not in the key"
    assert plan_key(a, b.contiguous(), out) != key  # b's layout (N-contiguous against the w.t() view)
    assert plan_key(a, b, torch.zeros(64, 128, dtype=BF)[:, :64]) != key  # out's strides
    assert plan_key(a, b, out.half()) != key and plan_key(a, b) != key  # out's dtype; out or none
    with pytest.raises(AttributeError):  # not a tensor: gemm sends the call to the checks, which name it
        plan_key([1], b)


def test_a_plan_cache_hit_still_checks_where_b_and_out_are(machine, monkeypatch):
    from gemmlab.family import api, plan

    machine("sm90")
    calls = []
    monkeypatch.setattr(plan, "compiled_kernel", lambda problem, cfg, arch: lambda *args: calls.append(args))

    def check_devices(a, b, out=None):  # the real rule with meta standing for a second device
        for name, t in (("b", b), ("out", out)):
            if t is not None and t.device != a.device:
                raise ValueError(f"{name} must be on a's device")

    monkeypatch.setattr(api, "check_devices", check_devices)
    a, b = _dense()
    out = torch.zeros(64, 64, dtype=BF)
    api.gemm(a, b, out)
    api.gemm(a, b, out)
    assert len(calls) == 2
    with pytest.raises(ValueError, match="^b must be on a's device"):
        api.gemm(a, b.to("meta"), out)
    with pytest.raises(ValueError, match="^out must be on a's device"):
        api.gemm(a, b, out.to("meta"))
    assert len(calls) == 2


@pytest.mark.gpu
@pytest.mark.sm90
def test_gemm_cache_hit_checks_b_and_out_devices_on_the_gpu():
    import gemmlab

    a = torch.randn(128, 256, device="cuda", dtype=BF)
    b = torch.randn(256, 192, device="cuda", dtype=BF)
    out = torch.empty(128, 192, device="cuda", dtype=BF)
    gemmlab.gemm(a, b)
    gemmlab.gemm(a, b, out)  # both signatures now have plans
    with pytest.raises(ValueError, match="^b must be on a cuda device"):
        gemmlab.gemm(a, b.cpu())
    with pytest.raises(ValueError, match="^out must be on a cuda device"):
        gemmlab.gemm(a, b, out.cpu())


@pytest.mark.parametrize("tier", ["cpu", "sm90"])
def test_gemm_refuses_an_out_that_overlaps_an_input(machine, tier):
    import gemmlab

    machine(tier)
    x, w_t = _dense(64, 64, 64)  # N == K: out=x has the right shape
    _refused(tier, ValueError, "^out overlaps a in memory", lambda: gemmlab.gemm(x, w_t, out=x))
    store = torch.zeros(64 * 64 + 64 * 64, dtype=BF)  # b is w.t() of rows 0..63; out a view reaching into them
    b = store[:64 * 64].view(64, 64).t()
    _refused(tier, ValueError, "^out overlaps b in memory",
             lambda: gemmlab.gemm(x, b, out=store[32 * 64:96 * 64].view(64, 64)))
    _accepted(tier, lambda: gemmlab.gemm(x, b, out=store[64 * 64:].view(64, 64)))  # a disjoint slice: fine


def test_gemm_checks_out_against_the_inputs_on_every_call(machine, monkeypatch):
    from gemmlab.family import api, plan

    machine("sm90")
    calls = []
    monkeypatch.setattr(plan, "compiled_kernel", lambda problem, cfg, arch: lambda *args: calls.append(args))
    x, w_t = _dense()
    api.gemm(x, w_t, torch.zeros(64, 64, dtype=BF))  # the plan of this signature
    with pytest.raises(ValueError, match="^out overlaps a in memory"):
        api.gemm(x, w_t, out=x)  # same signature: a cache hit
    with pytest.raises(ValueError, match="^out overlaps b in memory"):
        api.gemm(x, w_t, out=w_t.t())
    assert len(calls) == 1


@pytest.mark.gpu
@pytest.mark.sm90
def test_gemm_out_aliasing_an_input_is_refused_on_the_gpu():
    import gemmlab

    x = torch.randn(128, 256, device="cuda", dtype=BF)
    w = torch.randn(256, 256, device="cuda", dtype=BF)
    gemmlab.gemm(x, w.t(), out=torch.empty_like(x))  # a plan for the signature
    with pytest.raises(ValueError, match="^out overlaps a in memory"):
        gemmlab.gemm(x, w.t(), out=x)
    store = torch.empty(2 * 128 * 256, device="cuda", dtype=BF)
    a, out = store[:128 * 256].view(128, 256), store[128 * 256:].view(128, 256)
    a.copy_(x)
    gemmlab.gemm(a, w.t(), out=out)  # a disjoint slice of one storage
    ref = x.float() @ w.float().t()
    assert ((out.float() - ref).norm() / ref.norm()).item() < 1e-2


# ---- grouped_gemm, grouped_gemm_list


def _ragged(rows=32, groups=2, k=64, n=64, dtype=BF):
    a = torch.zeros(rows, k, dtype=dtype)
    b = torch.zeros(groups, n, k, dtype=dtype).transpose(1, 2)
    offs = torch.tensor([rows // 2, rows][:groups], dtype=torch.int32)
    return a, b, offs


def _misaligned(shape, dtype=BF, offset=1):
    """A packed tensor of ``shape`` that starts ``offset`` elements past a 16-byte boundary."""
    n = math.prod(shape)
    return torch.zeros(n + 16, dtype=dtype)[offset:offset + n].view(shape)


GROUPED_REFUSED = [
    (dict(offs=[16, 32]), TypeError, "^offs must be a torch.Tensor"),
    (dict(offs=np.array([16, 32], np.int32)), TypeError, "^offs must be a torch.Tensor"),
    (dict(b=_misaligned((2, 64, 64))), ValueError, "^b must start at a 16-byte aligned address"),
    (dict(out=torch.zeros(1, 64, dtype=BF).expand(32, 64)), ValueError, r"^out's rows overlap \(row stride 0"),
    (dict(out=torch.zeros(40 * 64, dtype=BF).as_strided((32, 64), (8, 1))), ValueError, "^out's rows overlap"),
    (dict(out="a"), ValueError, "^out overlaps a in memory"),
    (dict(config="128x128"), TypeError, "^config must be an Sm90Config"),
    (dict(config="SMALL_FP16"), ValueError, "^config is for float16 -> float16; the tensors are bfloat16"),
    (dict(config="MEDIUM_C2", mixed=64), ValueError, "^mixed=64: the mixed order cannot run with config"),
    (dict(mixed=-1), ValueError, "^mixed must be >= 0; got -1"),
    (dict(mixed=2 ** 31), ValueError, "^mixed must be <= 2147483647"),
    (dict(mixed=128.0), TypeError, "^mixed must be an int; got float"),
    (dict(mixed=True), TypeError, "^mixed must be an int; got bool"),
    (dict(mixed=np.float32(64)), TypeError, "^mixed must be an int"),
    (dict(mixed="64"), TypeError, "^mixed must be an int"),
    (dict(mixed=64, dynamic=False), ValueError, "^mixed=64: the mixed order cannot run with dynamic=False"),
    (dict(mixed=64, by_size=False), ValueError, "^mixed=64: the mixed order cannot run with by_size=False"),
    (dict(burst=0), ValueError, "^burst must be >= 1"),
    (dict(burst=2.0), TypeError, "^burst must be an int"),
    (dict(burst=np.bool_(True)), TypeError, "^burst must be an int"),
    (dict(fences=1), TypeError, "^fences must be one of False, True"),
    (dict(dynamic="yes"), ValueError, "^dynamic must be one of False, True"),
    (dict(by_size=0), TypeError, "^by_size must be one of False, True"),
    (dict(overlap_store=[]), ValueError, "^overlap_store must be one of False, True"),
    (dict(l2_promotion=4), ValueError, "^l2_promotion must be one of None, 0, 1, 2, 3"),
    (dict(l2_promotion=3.0), TypeError, "^l2_promotion must be one of"),
    (dict(validate="no"), ValueError, "^validate must be one of False, True"),
    (dict(validate=1), TypeError, "^validate must be one of False, True"),
]


def _grouped_call(kw):
    from dataclasses import replace

    from gemmlab.family import api, configs

    a, b, offs = _ragged()
    kw = dict(kw)
    if kw.get("out") == "a":
        a, b, offs = _ragged(k=64, n=64)
        kw["out"] = a
    if kw.get("config") == "SMALL_FP16":
        kw["config"] = replace(configs.SMALL, dtype="float16", out_dtype="float16")
    elif kw.get("config") == "MEDIUM_C2":
        kw["config"] = configs.MEDIUM_C2
    args = dict(a=a, b=b, offs=offs)
    for name in ("a", "b", "offs", "out"):
        if name in kw:
            args[name] = kw.pop(name)
    return lambda: api.grouped_gemm(args["a"], args["b"], args["offs"], args.get("out"), **kw)


@pytest.mark.parametrize("tier", ["cpu", "sm90"])
@pytest.mark.parametrize("kw,exc,match", GROUPED_REFUSED, ids=[m.strip("^")[:40] for _, _, m in GROUPED_REFUSED])
def test_grouped_gemm_refuses_bad_arguments_before_the_tier_and_any_compile(machine, tier, kw, exc, match):
    machine(tier)
    _refused(tier, exc, match, _grouped_call(kw))


@pytest.mark.parametrize("tier", ["cpu", "sm90"])
@pytest.mark.parametrize("kw", [dict(), dict(mixed=np.int64(128), burst=np.int32(5), by_size=np.bool_(True)),
                                dict(mixed=0, dynamic=False), dict(burst=np.int64(3)), dict(l2_promotion=None),
                                dict(l2_promotion=np.int64(2)), dict(fences=np.bool_(False)), dict(validate=False),
                                dict(config="MEDIUM_C2")])
def test_grouped_gemm_takes_numpy_numbers_and_good_options(machine, tier, kw):
    machine(tier)
    _accepted(tier, _grouped_call(kw))


def test_grouped_gemm_options_are_in_the_key_with_their_types(machine, monkeypatch):
    """64.0 == 64 and 1 == True: a plan made for mixed=64 must not answer for mixed=64.0."""
    from gemmlab.family import api, plan

    machine("sm90")
    calls = []
    monkeypatch.setattr(plan, "grouped_kernel", lambda *args, **kw: lambda *t: calls.append(t))
    call = _grouped_call(dict(mixed=64, dynamic=True, fences=True))
    call()
    call()
    assert len(calls) == 2
    with pytest.raises(TypeError, match="^mixed must be an int; got float"):
        _grouped_call(dict(mixed=64.0, dynamic=True, fences=True))()
    with pytest.raises(TypeError, match="^fences must be one of False, True"):
        _grouped_call(dict(mixed=64, dynamic=True, fences=1))()
    assert len(calls) == 2


def test_grouped_gemm_offs_checked_by_the_kernel_and_raised_by_the_next_call(machine, monkeypatch):
    """validate=True hands the kernel the report's address (it checks offs on the GPU, nothing waits); a finding
    in the report is raised by the next validate=True call, before its launch, and emptied; False and "sync" hand
    it 0 (sync checks offs on the host, at once)."""
    from gemmlab.family import api, plan

    machine("sm90")
    calls = []
    monkeypatch.setattr(plan, "grouped_kernel", lambda *args, **kw: lambda *t: calls.append(t))
    a, b, offs = _ragged()
    api.grouped_gemm(a, b, offs)
    report = plan.offs_report(a.device)
    assert calls[-1][-1] == report.address != 0
    api.grouped_gemm(a, b, offs, validate=False)
    api.grouped_gemm(a, b, offs, validate="sync")
    assert [c[-1] for c in calls[1:]] == [0, 0]
    with pytest.raises(ValueError, match=r"^offs\[-1\] = 99 is past the 32 rows"):
        api.grouped_gemm(a, b, torch.tensor([16, 99], dtype=torch.int32), validate="sync")
    report.view[:] = (2, 99, 16, 32)  # what the kernel writes for offs = [16, 99]
    api.grouped_gemm(a, b, offs, validate=False)  # not asked: the finding waits
    with pytest.raises(ValueError, match=r"an earlier gemmlab.grouped_gemm call on cpu had a bad offs "
                                         r"\(offs\[1\] = 99 is past the 32 rows of a\)"):
        api.grouped_gemm(a, b, offs)
    assert len(calls) == 4 and not report.view.any()  # raised before the launch, the report emptied
    api.grouped_gemm(a, b, offs)
    assert len(calls) == 5
    with pytest.raises(ValueError, match="^validate must be one of False, True, 'sync'"):
        api.grouped_gemm(a, b, offs, validate="host")


@pytest.mark.parametrize("words, rule", [
    ((2, 20, 30, 128), r"offs must be non-decreasing from 0: offs\[1\] = 20 < offs\[0\] = 30"),
    ((1, -5, 0, 128), r"offs\[0\] = -5 < 0"),
    ((3, 10000, 100, 128), r"offs\[2\] = 10000 is past the 128 rows of a"),
])
def test_offs_report_says_what_the_kernel_found(words, rule):
    from gemmlab.family.plan import OffsReport

    r = OffsReport(torch.device("cpu"))
    assert r.take() is None
    r.view[:] = words
    err = r.take()
    assert isinstance(err, ValueError) and re.search(rule, str(err)) and "validate='sync'" in str(err)
    assert r.take() is None


def test_only_the_ragged_kernel_checks_offs():
    from gemmlab.compile import ptx_of
    from gemmlab.family import configs
    from gemmlab.kernels.grouped_sm90 import compile_grouped

    ragged = ptx_of(compile_grouped("sm_90a", configs.SMALL, "ragged", "k"))
    table = ptx_of(compile_grouped("sm_90a", configs.SMALL, "table", "k"))
    assert ragged.count("vote.sync.ballot.b32") == 1 and "vote.sync.ballot" not in table
    # the report: the three words, a system-scope fence, then the flag the host reads (in that order)
    lines = [ln.strip() for ln in ragged.splitlines()]
    fence = next(i for i, ln in enumerate(lines) if ln.startswith("fence.acq_rel.sys"))
    assert any(ln.startswith("st.global") for ln in lines[fence - 8:fence])
    assert lines[fence + 1].startswith("st.global.b32") or lines[fence + 2].startswith("st.global.b32")


def test_grouped_gemm_checks_where_the_tensors_are_on_every_call(machine, monkeypatch):
    from gemmlab.family import api, plan

    machine("sm90")
    calls = []
    monkeypatch.setattr(plan, "grouped_kernel", lambda *args, **kw: lambda *t: calls.append(t))
    a, b, offs = _ragged()
    api.grouped_gemm(a, b, offs, torch.zeros(32, 64, dtype=BF))  # the plan of this signature
    assert len(calls) == 1
    with pytest.raises(ValueError, match="^b must start at a 16-byte aligned address"):
        api.grouped_gemm(a, _misaligned((2, 64, 64)).transpose(1, 2), offs, torch.zeros(32, 64, dtype=BF))
    with pytest.raises(ValueError, match="^out overlaps a in memory"):
        api.grouped_gemm(a, b, offs, a)
    assert len(calls) == 1


def test_grouped_fp16_runs_a_tile_compiled_for_fp16(machine, monkeypatch):
    """The heuristic's tiles are BF16 configs: FP16 tensors were handed to a BF16 kernel (TVM-FFI's dtype error)."""
    from gemmlab.family import api, plan

    machine("sm90")
    asked = []
    monkeypatch.setattr(plan, "grouped_kernel", lambda cfg, *args, **kw: asked.append(cfg) or (lambda *t: None))
    api.grouped_gemm(*_ragged(dtype=torch.float16))
    api.grouped_gemm_list([(torch.zeros(16, 64, dtype=torch.float16), torch.zeros(64, 32, dtype=torch.float16))])
    assert [(c.dtype, c.out_dtype) for c in asked] == [("float16", "float16")] * 2


def test_grouped_gemm_is_hopper_only(machine):
    from gemmlab.tiers import TierError

    machine("sm100")  # it compiled an sm_90a kernel and launched it on the B200
    with pytest.raises(TierError, match="gemmlab.grouped_gemm needs tier sm90"):
        _grouped_call({})()
    with pytest.raises(TierError, match="gemmlab.grouped_gemm_list needs tier sm90"):
        from gemmlab.family import api
        api.grouped_gemm_list([(torch.zeros(16, 64, dtype=BF), torch.zeros(64, 32, dtype=BF))])


def _pairs(n=2):
    return [(torch.zeros(16, 64, dtype=BF), torch.zeros(64, 32, dtype=BF)) for _ in range(n)]


LIST_REFUSED = [
    (dict(pairs=None), TypeError, r"^pairs must be a list of \(a, b\) pairs of tensors; got NoneType"),
    (dict(pairs=5), TypeError, "^pairs must be a list of .*; got int"),
    (dict(pairs=[5]), TypeError, r"^pairs\[0\] must be an \(a, b\) pair of tensors; got int"),
    (dict(pairs="ab"), TypeError, "^pairs must be a list of .*; got str"),
    (dict(pairs="one"), TypeError, r"^pairs\[0\] must be an \(a, b\) pair of tensors; got tuple of 1"),
    (dict(pairs="three"), TypeError, r"^pairs\[1\] must be an \(a, b\) pair of tensors; got tuple of 3"),
    (dict(outs=5), TypeError, "^outs must be a list of output tensors; got int"),
    (dict(outs=[None, None]), TypeError, r"^outs\[0\] must be a torch.Tensor; got NoneType"),
    (dict(b1="misaligned"), ValueError, r"^pairs\[1\]\[1\] must start at a 16-byte aligned address"),
    (dict(outs="stride0"), ValueError, r"^outs\[1\]'s rows overlap"),
    (dict(outs="a0"), ValueError, r"^outs\[0\] overlaps pairs\[0\]\[0\] in memory"),
    (dict(outs="each other"), ValueError, r"^outs\[1\] overlaps outs\[0\] in memory"),
    (dict(config="128x128"), TypeError, "^config must be an Sm90Config"),
]


def _list_call(kw):
    from gemmlab.family import api

    pairs, outs = _pairs(), None
    kw = dict(kw)
    if "pairs" in kw:
        pairs = kw.pop("pairs")
        if pairs == "one":
            pairs = [(_pairs()[0][0],)]
        elif pairs == "three":
            pairs = [_pairs()[0], (*_pairs()[0], _pairs()[0][0])]
    if kw.pop("b1", None):
        pairs[1] = (pairs[1][0], _misaligned((64, 32)))
    if "outs" in kw:
        outs = kw.pop("outs")
        if outs == "stride0":
            outs = [torch.zeros(16, 32, dtype=BF), torch.zeros(1, 32, dtype=BF).expand(16, 32)]
        elif outs == "a0":  # 16 x 32 over the first 512 elements of pairs[0]'s a (16 x 64)
            outs = [pairs[0][0].view(-1)[:512].view(16, 32), torch.zeros(16, 32, dtype=BF)]
        elif outs == "each other":
            store = torch.zeros(16 * 32 + 256, dtype=BF)
            outs = [store[:512].view(16, 32), store[256:768].view(16, 32)]
    return lambda: api.grouped_gemm_list(pairs, outs, **kw)


@pytest.mark.parametrize("tier", ["cpu", "sm90"])
@pytest.mark.parametrize("kw,exc,match", LIST_REFUSED, ids=[m.strip("^")[:40] for _, _, m in LIST_REFUSED])
def test_grouped_gemm_list_refuses_bad_arguments_before_the_tier_and_any_compile(machine, tier, kw, exc, match):
    machine(tier)
    _refused(tier, exc, match, _list_call(kw))


@pytest.mark.parametrize("tier", ["cpu", "sm90"])
def test_grouped_gemm_list_takes_disjoint_outputs_of_one_storage(machine, tier):
    from gemmlab.family import api

    machine(tier)
    store = torch.zeros(2 * 16 * 32, dtype=BF)
    _accepted(tier, lambda: api.grouped_gemm_list(_pairs(), [store[:512].view(16, 32), store[512:].view(16, 32)]))


def test_grouped_gemm_list_checks_where_the_tensors_are_on_every_call(machine, monkeypatch):
    from gemmlab.family import api, plan

    machine("sm90")
    calls = []
    monkeypatch.setattr(plan, "grouped_kernel", lambda *args, **kw: lambda *t: calls.append(t))
    pairs = _pairs()
    api.grouped_gemm_list(pairs, [torch.zeros(16, 32, dtype=BF) for _ in pairs])
    api.grouped_gemm_list(pairs)
    assert len(calls) == 2
    with pytest.raises(ValueError, match=r"^outs\[0\] overlaps pairs\[0\]\[0\] in memory"):
        api.grouped_gemm_list(pairs, [pairs[0][0].view(-1)[:512].view(16, 32), torch.zeros(16, 32, dtype=BF)])
    with pytest.raises(ValueError, match=r"^pairs\[1\]\[1\] must start at a 16-byte aligned address"):
        api.grouped_gemm_list([pairs[0], (pairs[1][0], _misaligned((64, 32)))])
    assert len(calls) == 2


@pytest.mark.gpu
@pytest.mark.sm90
def test_grouped_refuses_misaligned_b_and_aliased_out_on_the_gpu():
    from gemmlab.family import api

    a = torch.randn(256, 128, device="cuda", dtype=BF)
    b = torch.randn(4, 128, 128, device="cuda", dtype=BF)
    offs = torch.tensor([64, 128, 192, 256], device="cuda", dtype=torch.int32)
    api.grouped_gemm(a, b, offs, out=torch.empty(256, 128, device="cuda", dtype=BF))  # a plan for the signature
    with pytest.raises(ValueError, match="^out overlaps a in memory"):
        api.grouped_gemm(a, b, offs, out=a)
    store = torch.empty(b.numel() + 8, device="cuda", dtype=BF)
    with pytest.raises(ValueError, match="^b must start at a 16-byte aligned address"):
        api.grouped_gemm(a, store[1:1 + b.numel()].view(4, 128, 128), offs,
                         out=torch.empty(256, 128, device="cuda", dtype=BF))


@pytest.mark.gpu
@pytest.mark.sm90
def test_grouped_fp16_matches_the_reference():
    from gemmlab import grouped_model as gm
    from gemmlab.family import api

    g = torch.Generator(device="cuda").manual_seed(0)
    sizes = [40, 0, 130, 7]
    a = torch.randn(sum(sizes), 256, device="cuda", dtype=torch.float16, generator=g)
    b = torch.randn(len(sizes), 256, 192, device="cuda", dtype=torch.float16, generator=g)
    offs = gm.offsets_of(sizes)
    out = api.grouped_gemm(a, b, offs)
    ref = gm.reference(a, b, offs)
    assert out.dtype == torch.float16
    assert ((out.float() - ref).norm() / ref.norm()).item() < 1e-2
    outs = api.grouped_gemm_list([(a[:40], b[0]), (a[40:170], b[2])])
    for (x, w), c in zip([(a[:40], b[0]), (a[40:170], b[2])], outs):
        r = x.float() @ w.float()
        assert ((c.float() - r).norm() / r.norm()).item() < 1e-2


# ---- gated_dual_gemm


@pytest.fixture(scope="module")
def gated_ops():
    from gemmlab import nvfp4 as fp4

    return fp4.generate(128, 64, 256, seed=1)  # M, N, K: K/2 = 128 packed bytes a row, K/16 = 16 scales


def _gated_call(ops, **kw):
    from gemmlab.family import api

    args = dict(zip(("a", "b1", "b2", "sfa", "sfb1", "sfb2"), ops.inputs()), out=None)
    args.update(kw)
    return lambda: api.gated_dual_gemm(**args)


def _padded_rows(t, pad=16):
    """``t`` (rows, width, 1) with rows ``pad`` elements apart more than packed: an unpacked view."""
    rows, width, _ = t.shape
    wide = torch.zeros(rows, width + pad, 1, dtype=t.dtype)
    wide[:, :width] = t
    return wide[:, :width]


@pytest.mark.parametrize("tier", ["cpu", "sm90", "sm100"])
def test_gated_dual_gemm_refuses_unpacked_rows_and_column_major_scales(machine, gated_ops, tier):
    from gemmlab import nvfp4 as fp4

    machine(tier)
    ops = gated_ops
    a_bytes = fp4.as_bytes(ops.a)
    _refused(tier, ValueError, r"^a must be row-major with packed rows \(K/2 packed bytes a row: strides \(128, 1\)",
             _gated_call(ops, a=_padded_rows(a_bytes)))
    _refused(tier, ValueError, "^b2 must be row-major with packed rows", _gated_call(ops, b2=_padded_rows(
        fp4.as_bytes(ops.b2))))
    column_major = ops.sfa.permute(2, 1, 0).contiguous().permute(2, 1, 0)  # (M, K/16, 1) with strides (1, M, ...)
    assert torch.equal(column_major.float(), ops.sfa.float())
    _refused(tier, ValueError, r"^sfa must be row-major with packed rows \(K/16 scales a row: strides \(16, 1\)",
             _gated_call(ops, sfa=column_major))
    transposed = ops.sfb1[..., 0].t().contiguous().t().unsqueeze(-1)
    _refused(tier, ValueError, "^sfb1 must be row-major", _gated_call(ops, sfb1=transposed))
    _refused(tier, ValueError, r"^out must be compact \(row stride N=64\)",
             _gated_call(ops, out=torch.empty(128, 72, 1, dtype=torch.float16)[:, :64]))
    if tier != "sm100":  # (the B200's call checks its devices itself: the CPU tensors cannot stand in there)
        _accepted(tier, _gated_call(ops, a=_padded_rows(a_bytes).contiguous()))  # the fix the message names


@pytest.mark.parametrize("tier", ["cpu", "sm90"])
def test_gated_dual_gemm_refuses_misaligned_tensors_and_an_out_over_an_input(machine, gated_ops, tier):
    from gemmlab import nvfp4 as fp4

    machine(tier)
    ops = gated_ops
    a_bytes = fp4.as_bytes(ops.a)
    shifted = _misaligned(tuple(a_bytes.shape), torch.uint8, offset=8)
    shifted.copy_(a_bytes)
    _refused(tier, ValueError, "^a must start at a 16-byte aligned address", _gated_call(ops, a=shifted))
    store = torch.zeros(2 * 128 * 128, dtype=torch.uint8)  # a's 16 KiB, then 16 KiB more
    a = store[:128 * 128].view(128, 128, 1)
    a.copy_(a_bytes)
    over = store[:128 * 64 * 2].view(torch.float16).view(128, 64, 1)
    _refused(tier, ValueError, "^out overlaps a in memory", _gated_call(ops, a=a, out=over))
    apart = store[128 * 128:].view(torch.float16).view(128, 64, 1)
    _accepted(tier, _gated_call(ops, a=a, out=apart))


def test_gated_dual_gemm_checks_where_the_tensors_are_on_every_call(machine, gated_ops, monkeypatch):
    from gemmlab.family import api, plan

    machine("sm90")
    calls = []

    class FakePlan:
        def __init__(self, problem, config, arch, out_stride=None, num_sms=None):
            pass

        def __call__(self, *tensors):
            calls.append(tensors)
            return tensors[-1]

        def launch(self, ptrs, *tensors):
            assert ptrs == tuple(t.data_ptr() for t in tensors[:6])
            return self(*tensors)

    monkeypatch.setattr(plan, "GatedPlan", FakePlan)
    ops = gated_ops
    out = torch.empty(128, 64, 1, dtype=torch.float16)
    _gated_call(ops, out=out)()
    store = torch.zeros(128 * 128, dtype=torch.uint8)
    from gemmlab import nvfp4 as fp4
    a = store.view(128, 128, 1)
    a.copy_(fp4.as_bytes(ops.a))
    _gated_call(ops, a=a, out=out)()  # a uint8 a: its own signature
    assert len(calls) == 2
    with pytest.raises(ValueError, match="^out overlaps a in memory"):
        _gated_call(ops, a=a, out=store.view(torch.float16).view(128, 64, 1))()
    assert len(calls) == 2


@pytest.mark.gpu
@pytest.mark.sm90
def test_gated_dual_gemm_refuses_an_out_over_an_input_on_the_gpu():
    from gemmlab import nvfp4 as fp4
    from gemmlab.family import api

    ops = fp4.generate(128, 128, 256, seed=2, device="cuda")  # a: 128 x 128 bytes; out: 128 x 128 FP16
    store = torch.zeros(128 * 128 + 128 * 128 * 2, dtype=torch.uint8, device="cuda")
    a = store[:128 * 128].view(128, 128, 1)
    a.copy_(fp4.as_bytes(ops.a))
    inputs = (a, ops.b1, ops.b2, ops.sfa, ops.sfb1, ops.sfb2)
    out = api.gated_dual_gemm(*inputs, out=store[128 * 128:].view(torch.float16).view(128, 128, 1))
    torch.cuda.synchronize()
    res = fp4.check_close(out, fp4.reference(*inputs))
    assert res.ok, res
    with pytest.raises(ValueError, match="^out overlaps a in memory"):  # the same signature: a cache hit
        api.gated_dual_gemm(*inputs, out=store[:128 * 128 * 2].view(torch.float16).view(128, 128, 1))


# ---- the kernels' compiles: N a multiple of 8 before the DSL sees it


@pytest.fixture
def no_dsl(monkeypatch):
    import gemmlab.compile as gc
    from gemmlab.kernels import gemm_sm100

    def no_compile(*args, **kwargs):
        raise AssertionError("reached the DSL")

    monkeypatch.setattr(gc, "compile_for", no_compile)
    monkeypatch.setattr(gemm_sm100, "compile_for", no_compile)


@pytest.mark.parametrize("which", ["dual", "pipelined", "dual_sm100", "gemm_sm100", "gemm_sm100 cfg"])
@pytest.mark.parametrize("n", [100, 4, 1028])
def test_compiles_refuse_n_not_a_multiple_of_8_before_the_dsl(no_dsl, which, n):
    """compile_dual and compile_pipelined handed N = 100 to the DSL; compile_gemm_sm100 with a cfg did too."""
    from gemmlab.family.configs import Sm100Config
    from gemmlab.kernels import dual_gemm_sm90, dual_gemm_sm90_pipelined, dual_gemm_sm100, gemm_sm100

    calls = {
        "dual": lambda: dual_gemm_sm90.compile_dual("sm_90a", None, 256, n, 256),
        "pipelined": lambda: dual_gemm_sm90_pipelined.compile_pipelined("sm_90a", None, 256, n, 256),
        "dual_sm100": lambda: dual_gemm_sm100.compile_dual_sm100("sm_100a", None, 256, n, 256),
        "gemm_sm100": lambda: gemm_sm100.compile_gemm_sm100("sm_100a", None, 256, n, 256),
        "gemm_sm100 cfg": lambda: gemm_sm100.compile_gemm_sm100("sm_100a", Sm100Config(), 256, n, 256),
    }
    with pytest.raises(ValueError, match=r"^N must be a multiple of 8 \(16-byte rows of the "):
        calls[which]()


@pytest.mark.parametrize("cfg", [None, "cfg"])
def test_compile_gemm_sm100_refuses_k_not_a_multiple_of_8_before_the_dsl(no_dsl, cfg):
    from gemmlab.family.configs import Sm100Config
    from gemmlab.kernels.gemm_sm100 import compile_gemm_sm100

    with pytest.raises(ValueError, match=r"^K must be a multiple of 8 \(16-byte rows of a\)"):
        compile_gemm_sm100("sm_100a", Sm100Config() if cfg else None, 256, 256, 100)


def test_compile_grouped_takes_numpy_ints_and_refuses_floats_before_the_dsl(no_dsl):
    from gemmlab.family import configs
    from gemmlab.kernels.grouped_sm90 import compile_grouped

    with pytest.raises(AssertionError, match="reached the DSL"):  # np.int64 burst was "not an int >= 1"
        compile_grouped("sm_90a", configs.LARGE, dynamic=True, mixed=np.int64(128), burst=np.int64(5))
    for kw, exc, match in ((dict(mixed=128.0), TypeError, "^mixed must be an int"),
                           (dict(burst=2.0), TypeError, "^burst must be an int"),
                           (dict(dynamic=1), TypeError, "^dynamic must be one of False, True"),
                           (dict(mixed=-1), ValueError, "^mixed must be >= 0")):
        with pytest.raises(exc, match=match):
            compile_grouped("sm_90a", configs.LARGE, **{"dynamic": True, **kw})


# ---- the dense plan on Blackwell


def test_sm100_plans_refuse_what_chapter_10s_kernel_cannot_write(machine):
    """Chapter 10's kernel stores C in A's dtype and is compiled for one B layout: an FP16 out of a BF16 product, or
    a forced config of the other layout, went to the kernel (a TVM-FFI dtype error, or B read transposed)."""
    import gemmlab
    from gemmlab.family import plan
    from gemmlab.family.configs import Sm100Config
    from gemmlab.family.problem import GemmProblem

    machine("sm100")
    a, b = _dense()
    with pytest.raises(TypeError, match="^out must have a's dtype bfloat16 on Blackwell"):
        gemmlab.gemm(a, b, out=torch.zeros(64, 64, dtype=torch.float16))
    with pytest.raises(ValueError, match="^config is for bfloat16 with b n-major; the problem is bfloat16 with b k"):
        plan.make_plan(GemmProblem(64, 64, 64), None, Sm100Config(b_major="n"))
    _accepted("sm100", lambda: gemmlab.gemm(a, b))


def test_sizes_past_32_bits_are_refused_naming_the_limit():
    """The kernels take sizes as 32-bit ints (TVM-FFI's int32 range, the DSL's sym_int()); meta tensors: no memory."""
    import gemmlab
    from gemmlab.family import api

    big = torch.empty(2 ** 31, 64, dtype=BF, device="meta")
    with pytest.raises(ValueError, match=r"^a has shape \(2147483648, 64\): the kernels take sizes as 32-bit ints"):
        gemmlab.gemm(big, torch.empty(64, 64, dtype=BF, device="meta"))
    with pytest.raises(ValueError, match=r"^a has shape \(2147483648, 64\)"):
        api.grouped_gemm(big, torch.empty(2, 64, 64, dtype=BF, device="meta"),
                         torch.empty(2, dtype=torch.int32, device="meta"), validate=False)
