"""Property-based tests (hypothesis): every public model and entry point under any argument a user may pass.

The property, for each entry point: with one argument replaced by another value, the call either gives
**the same answer as with the Python number of the same value** (numpy and torch scalars, 0-d arrays are
numbers) or raises a **clear** ``TypeError``/``ValueError`` (non-empty message; a value that is not a
number of the argument's kind always gets one). No other exception, no silent reinterpretation, and no
unbounded work: huge values are refused with the limit named, quickly.

Kept fast for CI's two cores: few examples per entry point, no deadline (the first call imports).
"""
from __future__ import annotations

import math
import numbers

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.configuration import set_hypothesis_home_dir

from gemmlab.compile import scratch_dir

# Nothing written into the checkout: hypothesis keeps its caches in this process's temporary folder
# (removed at exit), and no example database (the examples are derandomized anyway).
set_hypothesis_home_dir(scratch_dir("hypothesis"))
SETTINGS = settings(max_examples=30, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])

# ---------------------------------------------------------------- values a user may pass


def _boxes(v):
    """The same number in every box a user may hand over."""
    out = [v]
    if isinstance(v, int) and not isinstance(v, bool):
        if -2 ** 63 <= v < 2 ** 63:
            out += [np.int64(v), torch.tensor(v), np.array(v)]
        if -2 ** 31 <= v < 2 ** 31:
            out.append(np.int32(v))
    elif isinstance(v, float):
        out += [np.float64(v), torch.tensor(v, dtype=torch.float64), np.array(v)]
        if math.isfinite(v) and abs(v) < 1e38 and float(np.float32(v)) == v:
            out.append(np.float32(v))
    return out


JUNK = st.sampled_from([None, "4", b"4", [4], (4,), {}, object(), True, False, np.bool_(True), 1j,
                        torch.tensor([4, 4]), np.array([4, 4])])
HUGE_INTS = st.sampled_from([2 ** 31, 2 ** 32 + 1, 2 ** 40, 2 ** 62, 2 ** 63, 2 ** 70, -2 ** 63, -(2 ** 70)])
ODD_FLOATS = st.sampled_from([float("nan"), float("inf"), -float("inf"), 0.5, 1e300, -0.0, 128.0])


def variants(valid):
    """Values to put in place of an argument whose valid Python value ``valid`` was drawn."""
    return st.one_of(
        st.sampled_from(_boxes(valid)) if not isinstance(valid, (list, tuple)) else st.just(valid),
        st.integers(-3, 3).flatmap(lambda i: st.sampled_from(_boxes(i))),
        st.integers(-(2 ** 20), 2 ** 20),
        HUGE_INTS, ODD_FLOATS, JUNK,
        st.floats(allow_nan=True, allow_infinity=True).flatmap(lambda f: st.sampled_from(_boxes(f))),
    )


def as_python(value, kind):
    """The Python number ``value`` stands for, as an argument of ``kind`` (``"int"``/``"real"``); None for junk."""
    mod = type(value).__module__ or ""
    if mod.startswith(("numpy", "torch")) and getattr(value, "ndim", None) == 0:
        value = value.item()
    if isinstance(value, bool) or type(value).__name__ == "bool_":
        return None
    if isinstance(value, numbers.Integral):
        return int(value)
    if kind == "real" and isinstance(value, numbers.Real) and math.isfinite(float(value)):
        return float(value)
    return None


def same(a, b) -> bool:
    """Equal answers (NaN equal to NaN; numpy arrays and tensors elementwise; Timelines by their totals)."""
    if hasattr(a, "total") and hasattr(a, "events"):
        return same(a.total, b.total) and len(a.events) == len(b.events)
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and np.array_equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == b and type(a) is type(b)


def call(fn):
    try:
        return "ok", fn()
    except (TypeError, ValueError) as exc:
        assert str(exc).strip(), f"{type(exc).__name__} without a message"
        return type(exc).__name__, str(exc)


def check_property(fn, args: dict, name: str, kind: str, value):
    """``fn(**args)`` with ``args[name]`` replaced by ``value``: the Python-number answer, or a clear error."""
    got = call(lambda: fn(**{**args, name: value}))  # any other exception fails the test here
    py = as_python(value, kind.rstrip("?"))
    if value is None and kind.endswith("?"):  # None is this argument's default: the same as leaving it out
        want = call(lambda: fn(**{**args, name: None}))
        assert got[0] == want[0] and (got[0] != "ok" or same(got[1], want[1]))
        return
    if py is None:
        assert got[0] != "ok", f"{name}={value!r} (not a number of kind {kind}) was accepted: {got[1]!r}"
        return
    want = call(lambda: fn(**{**args, name: py}))
    assert got[0] == want[0], f"{name}={value!r}: {got} but with {py!r}: {want}"
    if got[0] == "ok":
        assert same(got[1], want[1]), f"{name}={value!r} gave {got[1]!r}, with {py!r} {want[1]!r}"


# ---------------------------------------------------------------- the entry points
# name -> (callable, valid arguments, {argument: kind}); hypothesis replaces one argument at a time.


def _entry_points():
    from gemmlab import banks, hardware, nvfp4, pipeline, simulator, tcgen05, tma, wgmma
    from gemmlab.measure import calibration, dual_gemm
    from gemmlab.family import configs, problem

    def pipeline_state(**kw):
        st_ = pipeline.PipelineState(**kw)
        for _ in range(5):
            st_.advance()
        return st_.as_tuple()

    return {
        "simulate": (lambda **kw: simulator.simulate(kw["stages"], (kw["n_tiles"], kw["k"]), kw["load"],
                                                     kw["compute"], issue_time=kw["issue"],
                                                     transfer_time=kw["transfer"], consumers=kw["consumers"],
                                                     acc_stages=kw["acc_stages"]).total,
                     dict(stages=4, n_tiles=8, k=6, load=3, compute=1, issue=0.0, transfer=0.5, consumers=2,
                          acc_stages=2),
                     dict(stages="int", n_tiles="int", k="int", load="real", compute="real", issue="real",
                          transfer="real", consumers="int", acc_stages="int")),
        "predict_designs": (lambda **kw: simulator.predict_designs(kw["stages"], [kw["k"], 3, 5], kw["load"], 1),
                            dict(stages=4, k=6, load=3), dict(stages="int", k="int", load="real")),
        "GemmProblem": (lambda **kw: problem.GemmProblem(**kw).flops, dict(m=4096, n=4096, k=7168),
                        dict(m="int", n="int", k="int")),
        "Sm90Config": (lambda **kw: configs.Sm90Config(**kw).smem_bytes(),
                       dict(tile_m=128, tile_n=192, stages=5, group=8, epi_stages=4, splits=2),
                       dict(tile_m="int", tile_n="int", stages="int", group="int", epi_stages="int", splits="int")),
        "Sm100Config": (lambda **kw: configs.Sm100Config(**kw).stage_bytes(), dict(block_n=128, ab_stages=6),
                        dict(block_n="int", ab_stages="int")),
        "split_ranges": (configs.split_ranges, dict(k_tiles=112, splits=14), dict(k_tiles="int", splits="int")),
        "effective_splits": (configs.effective_splits, dict(k_tiles=112, splits=15),
                             dict(k_tiles="int", splits="int")),
        "permuted_offset": (nvfp4.permuted_offset, dict(i=200, j=5, mn=256, sf_k=448, l=0),
                            dict(i="int", j="int", mn="int", sf_k="int", l="int")),
        "permuted_index": (nvfp4.permuted_index, dict(i=200, j=5), dict(i="int", j="int")),
        "permuted_shape": (nvfp4.permuted_shape, dict(mn=200, sf_k=12, l=1), dict(mn="int", sf_k="int", l="int")),
        "unpermute_scales": (lambda **kw: nvfp4.unpermute_scales(_PERM, **kw), dict(mn=200, sf_k=12),
                             dict(mn="int", sf_k="int?")),
        "check_close": (lambda **kw: nvfp4.check_close(_OUT, _REF, **kw), dict(rtol=1e-3, atol=1e-3),
                        dict(rtol="real", atol="real")),
        "check_problem": (nvfp4.check_problem, dict(m=256, n=4096, k=7168, l=1),
                          dict(m="int", n="int", k="int", l="int")),
        "problem_bytes": (dual_gemm.problem_bytes, dict(m=256, n=4096, k=7168), dict(m="int", n="int", k="int")),
        "predict_b200 (dual)": (lambda **kw: dual_gemm.predict_b200((kw["m"], kw["n"], kw["k"]), tile_n=kw["tile_n"]),
                                dict(m=256, n=3072, k=4096, tile_n=128),
                                dict(m="int", n="int", k="int", tile_n="int")),
        "predict_sm90": (lambda **kw: calibration.predict_sm90((kw["m"], kw["n"], kw["k"]), "128x256 c2x1 m8 s4",
                                                               "nvidia-h200", ghz=kw["ghz"]),
                         dict(m=4096, n=4096, k=4096, ghz=1.5), dict(m="int", n="int", k="int", ghz="real?")),
        "Calibration": (lambda **kw: calibration.Calibration({"nvidia-h200": kw.pop("ghz")}, **kw),
                        dict(ghz=1.5, subtile_cycles=250.0, kblock_cycles=650.0, hbm_efficiency=0.85),
                        dict(ghz="real", subtile_cycles="real", kblock_cycles="real", hbm_efficiency="real")),
        "describe_tensor_map": (lambda **kw: tma.describe_tensor_map((kw["rows"], kw["cols"]), torch.float16,
                                                                     (kw["box_rows"], kw["box_cols"]), "128B",
                                                                     strides=(kw["stride"], 1)),
                                dict(rows=1000, cols=64, box_rows=64, box_cols=64, stride=128),
                                dict(rows="int", cols="int", box_rows="int", box_cols="int", stride="int")),
        "encode_smem_desc": (wgmma.encode_smem_desc, dict(start_addr=0x4000, lbo=16, sbo=1024, base_offset=0),
                             dict(start_addr="int", lbo="int", sbo="int", base_offset="int")),
        "decode_smem_desc": (lambda **kw: str(wgmma.decode_smem_desc(**kw)), dict(value=0x4000004000010404),
                             dict(value="int")),
        "tcgen05.SmemDesc": (lambda **kw: tcgen05.SmemDesc(**kw).encode(),
                             dict(start_addr=0x4000, lbo=16, sbo=1024, base_offset=0),
                             dict(start_addr="int", lbo="int", sbo="int", base_offset="int")),
        "InstrDesc": (lambda **kw: tcgen05.InstrDesc(**kw).encode(), dict(m=128, n=256, sparse_id2=0, max_shift=0),
                      dict(m="int", n="int", sparse_id2="int", max_shift="int")),
        "strided_addresses": (banks.strided_addresses, dict(stride=2, width=8, lanes=32),
                              dict(stride="int", width="int", lanes="int")),
        "wavefronts": (lambda **kw: banks.wavefronts(banks.strided_addresses(2, 8), **kw), dict(width=8),
                       dict(width="int")),
        "PipelineState": (pipeline_state, dict(stages=4, index=1, phase=1, count=3),
                          dict(stages="int", index="int", phase="int", count="int")),
        "gemm_intensity": (hardware.gemm_intensity, dict(M=16, N=4096, K=4096, bytes_per_elem=2),
                           dict(M="int", N="int", K="int", bytes_per_elem="real")),
    }


_PERM = _OUT = _REF = None
POINTS = None


def setup_module():
    global _PERM, _OUT, _REF, POINTS
    from gemmlab import nvfp4

    _PERM = nvfp4.permute_scales(torch.arange(200 * 12, dtype=torch.float32).reshape(200, 12, 1))
    _OUT, _REF = torch.zeros(4), torch.full((4,), 5e-4)
    POINTS = _entry_points()


NAMES = ["simulate", "predict_designs", "GemmProblem", "Sm90Config", "Sm100Config", "split_ranges",
         "effective_splits", "permuted_offset", "permuted_index", "permuted_shape", "unpermute_scales", "check_close",
         "check_problem", "problem_bytes", "predict_b200 (dual)", "predict_sm90", "Calibration",
         "describe_tensor_map", "encode_smem_desc", "decode_smem_desc", "tcgen05.SmemDesc", "InstrDesc",
         "strided_addresses", "wavefronts", "PipelineState", "gemm_intensity"]


def test_the_list_covers_every_entry_point():
    assert sorted(NAMES) == sorted(POINTS)


@pytest.mark.parametrize("point", NAMES)
@SETTINGS
@given(data=st.data())
def test_any_argument_gives_the_python_answer_or_a_clear_error(point, data):
    fn, args, kinds = POINTS[point]
    name = data.draw(st.sampled_from(sorted(kinds)), label="argument")
    value = data.draw(variants(args[name]), label=name)
    check_property(fn, args, name, kinds[name], value)


# ---------------------------------------------------------------- tensors in, tensors out: the NVFP4 helpers


@SETTINGS
@given(codes=st.lists(st.integers(-20, 40), min_size=2, max_size=16).filter(lambda c: len(c) % 2 == 0),
       dtype=st.sampled_from([torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float32,
                              torch.bool]))
def test_fp4_packing_is_exact_or_refuses(codes, dtype):
    from gemmlab import nvfp4

    if dtype in (torch.uint8, torch.int8) and not all(np.iinfo(np.int8 if dtype == torch.int8 else np.uint8).min
                                                      <= c <= np.iinfo(np.int8 if dtype == torch.int8 else np.uint8).max
                                                      for c in codes):
        return  # not representable in that dtype at all
    t = torch.tensor(codes, dtype=torch.int64).to(dtype)
    ok = dtype not in (torch.float32, torch.bool) and all(0 <= c <= 15 for c in codes)
    if not ok:
        with pytest.raises((TypeError, ValueError)):
            nvfp4.pack_fp4(t)
        with pytest.raises((TypeError, ValueError)):
            nvfp4.e2m1_decode(t)
        return
    packed = nvfp4.pack_fp4(t)
    assert nvfp4.unpack_fp4(packed).tolist() == codes
    assert nvfp4.e2m1_decode(t).tolist() == [nvfp4.E2M1_VALUES[c] for c in codes]


@SETTINGS
@given(dtype=st.sampled_from([torch.uint8, torch.int8, torch.int32, torch.float32, torch.float16]))
def test_unpack_and_dequantize_take_fp4_bytes_and_e4m3_scales_only(dtype):
    from gemmlab import nvfp4

    raw = torch.full((1, 8), 0x22, dtype=torch.uint8)
    if dtype == torch.uint8:
        assert nvfp4.unpack_fp4(raw).tolist() == [[2] * 16]
    else:
        with pytest.raises(TypeError, match="packed must have dtype"):
            nvfp4.unpack_fp4(raw.to(dtype))
    sf = torch.tensor([[2.0]]).to(torch.float8_e4m3fn)
    scales = sf.view(torch.uint8).to(dtype) if not dtype.is_floating_point else sf.float().to(dtype)
    if dtype.is_floating_point:
        assert nvfp4.dequantize(raw, scales).tolist() == [[2.0] * 16]
    else:
        with pytest.raises(TypeError, match="sf must hold e4m3 scales"):
            nvfp4.dequantize(raw, scales)


# ---------------------------------------------------------------- compiles: refused before the DSL sees anything


BAD_SIZES = st.one_of(st.sampled_from([0, -1, -256, 256.0, float("nan"), "256", None, True, 2 ** 70]),
                      st.integers(-(2 ** 40), 0))


@settings(max_examples=15, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(m=BAD_SIZES, which=st.sampled_from(["nt", "sm100", "dual", "multicast"]))
def test_compiles_refuse_bad_sizes_before_compiling(m, which, monkeypatch):
    import gemmlab.compile as gc

    def no_compile(*a, **k):
        raise AssertionError("reached the DSL with a bad size")

    monkeypatch.setattr(gc, "compile_for", no_compile)
    from gemmlab import tma, wgmma
    from gemmlab.kernels import dual_gemm_sm90, gemm_sm100

    for mod in (dual_gemm_sm90, gemm_sm100, tma, wgmma):
        if hasattr(mod, "compile_for"):
            monkeypatch.setattr(mod, "compile_for", no_compile)
    from gemmlab.family.configs import Sm100Config

    calls = {
        "nt": lambda: wgmma.compile_gemm_nt("sm_90a", m=m),
        "sm100": lambda: gemm_sm100.compile_gemm_sm100("sm_100a", Sm100Config(), m=m, n=256, k=256),
        "dual": lambda: dual_gemm_sm90.compile_dual("sm_90a", None, m, 256, 256),
        "multicast": lambda: tma.compile_multicast("sm_90a", clusters=m),
    }
    with pytest.raises((TypeError, ValueError)):
        calls[which]()


# ---------------------------------------------------------------- exercise checkers: any answer, a verdict


@settings(max_examples=40, deadline=None, derandomize=True, database=None)
@given(answer=st.one_of(st.none(), st.integers(), st.floats(), st.text(max_size=8), st.booleans(),
                        st.lists(st.integers(-5, 5), max_size=4), st.sets(st.text(max_size=3), max_size=3),
                        st.integers(-5, 5).map(np.int64), st.floats(-5, 5).map(np.float32),
                        st.integers(-5, 5).map(torch.tensor)))
def test_verdict_never_raises_and_is_true_only_for_the_answer(answer):
    import contextlib
    import io

    from gemmlab.course.exercises import verdict

    with contextlib.redirect_stdout(io.StringIO()) as out:
        right = verdict("x", answer, 403, "hint")
    assert bool(right) == (as_python(answer, "real") is not None and as_python(answer, "real") == 403)
    assert out.getvalue().startswith("x: ")


# ---------------------------------------------------------------- the family's public calls, on the CPU tier
# gemm, grouped_gemm, grouped_gemm_list, gated_dual_gemm: any argument replaced by any value gives a clear
# TypeError/ValueError naming it, or, arguments all good, the TierError of a machine without a GPU (the tier is
# faked to cpu, so this runs the same everywhere). Options that are numbers: the Python number's outcome.

BF = torch.bfloat16


def outcome(fn):
    """("TierError" | "TypeError" | "ValueError", message); any other exception fails the test."""
    from gemmlab.tiers import TierError

    try:
        fn()
    except TierError as exc:
        return "TierError", str(exc)
    except (TypeError, ValueError) as exc:
        assert str(exc).strip(), f"{type(exc).__name__} without a message"
        return type(exc).__name__, str(exc)
    raise AssertionError("a public call returned on the cpu tier")


def as_bool(value):
    """The Python bool ``value`` stands for (numpy bools and 0-d bool tensors count); None for anything else."""
    mod = type(value).__module__ or ""
    if mod.startswith(("numpy", "torch")) and getattr(value, "ndim", None) == 0:
        value = value.item()
    return bool(value) if isinstance(value, bool) or type(value).__name__ == "bool_" else None


@pytest.fixture
def cpu_tier(monkeypatch):
    from gemmlab import tiers
    from gemmlab.family import api

    monkeypatch.setattr(tiers, "detect_tier", lambda: "cpu")
    for cache in ("_PLANS", "_BY_PROBLEM", "_GROUPED", "_GATED"):
        monkeypatch.setattr(api, cache, {})


def _public_calls():
    import gemmlab
    from gemmlab import nvfp4
    from gemmlab.family import api, configs

    a, b = torch.zeros(64, 64, dtype=BF), torch.zeros(48, 64, dtype=BF).t()
    ga, gb = torch.zeros(32, 64, dtype=BF), torch.zeros(2, 48, 64, dtype=BF).transpose(1, 2)
    offs = torch.tensor([16, 32], dtype=torch.int32)
    ops = nvfp4.generate(128, 64, 256)
    opts = ("config", "validate", "fences", "by_size", "l2_promotion", "dynamic", "overlap_store", "mixed", "burst")
    return {
        "gemm": (lambda **kw: gemmlab.gemm(kw["a"], kw["b"], kw["out"]),
                 dict(a=a, b=b, out=torch.zeros(64, 48, dtype=BF)), dict(a="tensor", b="tensor", out="tensor?")),
        "grouped_gemm": (lambda **kw: api.grouped_gemm(kw["a"], kw["b"], kw["offs"], kw["out"],
                                                       **{k: kw[k] for k in opts}),
                         dict(a=ga, b=gb, offs=offs, out=None, config=None, validate=True, fences=True, by_size=None,
                              l2_promotion=3, dynamic=True, overlap_store=None, mixed=64, burst=None),
                         dict(a="tensor", b="tensor", offs="tensor", out="tensor?", config="config?", validate="bool",
                              fences="bool", by_size="bool?", l2_promotion="int?", dynamic="bool?",
                              overlap_store="bool?", mixed="int?", burst="int?")),
        "grouped_gemm (config)": (lambda **kw: api.grouped_gemm(ga, gb, offs, config=kw["config"]),
                                  dict(config=configs.LARGE), dict(config="config?")),
        "grouped_gemm_list": (lambda **kw: api.grouped_gemm_list(kw["pairs"], kw["outs"], config=kw["config"]),
                              dict(pairs=[(ga, gb[0]), (ga[:8], gb[1])], outs=None, config=None),
                              dict(pairs="list", outs="list?", config="config?")),
        "gated_dual_gemm": (lambda **kw: api.gated_dual_gemm(**kw),
                            dict(zip(("a", "b1", "b2", "sfa", "sfb1", "sfb2"), ops.inputs()), out=None),
                            dict(a="tensor", b1="tensor", b2="tensor", sfa="tensor", sfb1="tensor", sfb2="tensor",
                                 out="tensor?")),
    }


_PUBLIC = None
PUBLIC_NAMES = ["gemm", "grouped_gemm", "grouped_gemm (config)", "grouped_gemm_list", "gated_dual_gemm"]
TENSORISH = st.sampled_from([torch.zeros(8), torch.zeros(8, 8, 8, 8), torch.zeros(64, 64, dtype=torch.float32),
                             torch.zeros(64, 64, dtype=torch.int32), torch.zeros(0, 64, dtype=BF), np.zeros((64, 64)),
                             torch.zeros(64, 64, dtype=BF)[:, ::2], torch.tensor(3)])


def _public():
    global _PUBLIC
    if _PUBLIC is None:
        _PUBLIC = _public_calls()
    return _PUBLIC


def test_the_public_list_covers_the_four_calls():
    import gemmlab

    assert sorted(PUBLIC_NAMES) == sorted(_public())
    for name in ("gemm", "grouped_gemm", "grouped_gemm_list", "gated_dual_gemm"):
        assert name in PUBLIC_NAMES and callable(getattr(gemmlab, name))


@pytest.mark.parametrize("point", PUBLIC_NAMES)
@SETTINGS
@given(data=st.data())
def test_public_calls_give_a_clear_error_or_the_tier_error(point, data, cpu_tier):
    fn, args, kinds = _public()[point]
    name = data.draw(st.sampled_from(sorted(kinds)), label="argument")
    kind = kinds[name]
    value = data.draw(st.one_of(variants(args[name]) if not isinstance(args[name], (torch.Tensor, list)) else JUNK,
                                JUNK, TENSORISH, st.just(args[name])), label=name)
    got = outcome(lambda: fn(**{**args, name: value}))
    base = kind.rstrip("?")
    if value is None and kind.endswith("?"):
        return  # the default (None stands for the rule): outcome() already required a clear error or TierError
    if base in ("tensor", "list", "config"):
        if value is args[name]:
            assert got[0] == "TierError", got
            return
        assert got[0] != "TierError", f"{name}={value!r} was accepted"
        if base == "tensor" and not isinstance(value, torch.Tensor):
            assert got[0] == "TypeError" and got[1].startswith(f"{name} must be a torch.Tensor"), got
        elif base == "config":
            assert got[1].startswith("config "), got
        elif base == "list":
            assert got[1].startswith(name), got
        return
    py = as_bool(value) if base == "bool" else as_python(value, "int")
    if py is None:  # not a number of the option's kind: refused, naming the option
        assert got[0] in ("TypeError", "ValueError") and got[1].startswith(name), got
        return
    want = outcome(lambda: fn(**{**args, name: py}))
    assert got[0] == want[0], f"{name}={value!r}: {got} but with {py!r}: {want}"


# ---- gemm on generated tensors: the TierError exactly when the contract holds


LAYOUTS = ["packed"] * 6 + ["transposed", "padded", "expanded", "offset", "meta"]


@st.composite
def matrices(draw, rows, cols, dtypes=(BF,) * 6 + (torch.float16, torch.float32)):
    dtype = draw(st.sampled_from(dtypes))
    layout = draw(st.sampled_from(LAYOUTS))
    if layout == "transposed":
        return torch.zeros(cols, rows, dtype=dtype).t()
    if layout == "padded":
        return torch.zeros(rows, cols + 8, dtype=dtype)[:, :cols]
    if layout == "expanded":
        return torch.zeros(1, cols, dtype=dtype).expand(rows, cols)
    if layout == "offset":
        return torch.zeros(rows * cols + 8, dtype=dtype)[1:1 + rows * cols].view(rows, cols)
    return torch.zeros(rows, cols, dtype=dtype, device="meta" if layout == "meta" else "cpu")


@st.composite
def weights(draw, g, k, n):
    """(G, K, N) weights in the layouts a user may hand over, good and bad."""
    dtype = draw(st.sampled_from([BF, BF, torch.float16, torch.float32]))
    layout = draw(st.sampled_from(["k", "n", "n", "strided", "offset", "meta", "shared"]))
    if layout == "k":
        return torch.zeros(g, n, k, dtype=dtype).transpose(1, 2)
    if layout == "strided":
        return torch.zeros(g, k, 2 * n, dtype=dtype)[:, :, ::2]
    if layout == "offset":
        return torch.zeros(g * k * n + 8, dtype=dtype)[1:1 + g * k * n].view(g, k, n)
    if layout == "shared":  # one expert's weights for every group (stride 0): read-only, allowed
        return torch.zeros(1, k, n, dtype=dtype).expand(g, k, n)
    return torch.zeros(g, k, n, dtype=dtype, device="meta" if layout == "meta" else "cpu")


def gemm_contract(a, b, out) -> bool:
    """The dense contract, written with torch's own notion of contiguity (it ignores the strides of size-1
    dimensions, as the contract does): what ``gemmlab.gemm`` must accept, and nothing else."""
    ok = {torch.bfloat16, torch.float16}
    (m, k), (kb, n) = a.shape, b.shape
    if a.dtype not in ok or b.dtype != a.dtype or (out is not None and out.dtype not in ok):
        return False
    if kb != k or 0 in (m, k, n) or k % 8 or n % 8:
        return False
    if not a.is_contiguous() or not (b.is_contiguous() or b.t().is_contiguous()):
        return False
    if out is not None and (tuple(out.shape) != (m, n) or not out.is_contiguous()):
        return False
    if any(t.data_ptr() % 16 for t in (a, b, out) if t is not None):
        return False
    if out is not None:
        lo, hi = out.data_ptr(), out.data_ptr() + out.numel() * out.element_size()
        for t in (a, b):
            start = t.data_ptr()
            end = start + (sum((s - 1) * st_ for s, st_ in zip(t.shape, t.stride())) + 1) * t.element_size()
            if lo < end and start < hi and t.device == out.device:
                return False
    return True


@settings(max_examples=80, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(data=st.data(), m=st.sampled_from([1, 2, 24]), k=st.sampled_from([8, 16, 40, 12]),
       n=st.sampled_from([8, 16, 20]))
def test_gemm_accepts_exactly_its_contract(data, m, k, n, cpu_tier):
    import gemmlab

    a = data.draw(matrices(m, k), label="a")
    kb = data.draw(st.sampled_from([k, k, k, k + 8]), label="b rows")
    b = data.draw(st.one_of(matrices(kb, n), matrices(n, kb).map(lambda w: w.t())), label="b")
    out_kind = data.draw(st.sampled_from(["none", "fresh", "fresh", "over a", "over a", "over b", "over b", "wrong"]),
                         label="out")
    out = {"none": None, "wrong": torch.zeros(n, m, dtype=BF)}.get(out_kind)
    if out_kind == "fresh":
        out = data.draw(matrices(m, n, (BF, torch.float16, torch.float32)), label="out")
    elif out_kind.startswith("over"):  # an M x N row-major view from where a (or b) starts, when its memory holds one
        src = a if out_kind == "over a" else b
        room = (src.untyped_storage().nbytes() // src.element_size() - src.storage_offset()
                if src.device.type == "cpu" else 0)
        out = torch.as_strided(src, (m, n), (n, 1)) if room >= m * n else None
    got = outcome(lambda: gemmlab.gemm(a, b, out))
    want = gemm_contract(a, b, out)
    assert (got[0] == "TierError") == want, f"contract {'holds' if want else 'broken'}, gemm said {got}"


# ---- grouped and gated calls on generated tensors: a clear error or the TierError, never another exception


@settings(max_examples=40, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(data=st.data(), t=st.sampled_from([0, 1, 32]), g=st.sampled_from([1, 3]), k=st.sampled_from([8, 12, 64]),
       n=st.sampled_from([8, 20, 64]))
def test_grouped_calls_on_any_tensors_give_a_clear_error(data, t, g, k, n, cpu_tier):
    from gemmlab.family import api

    a = data.draw(matrices(t, k), label="a")
    b = data.draw(weights(g, k, n), label="b")
    offs = data.draw(st.sampled_from([torch.tensor([t] * g, dtype=torch.int32), torch.tensor([t] * g),
                                      torch.arange(g, dtype=torch.int32), torch.zeros(g + 1, dtype=torch.int32)]),
                     label="offs")
    out = data.draw(st.one_of(st.none(), matrices(t, n), st.just(a)), label="out")
    outcome(lambda: api.grouped_gemm(a, b, offs, out))
    pairs = [(a, b[i]) for i in range(g)]
    outs = data.draw(st.one_of(st.none(), st.just([out] * g)), label="outs")
    outcome(lambda: api.grouped_gemm_list(pairs, outs))


@settings(max_examples=25, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_gated_dual_gemm_on_any_tensors_gives_a_clear_error(data, cpu_tier):
    from gemmlab import nvfp4
    from gemmlab.family import api

    ops = _gated_ops()
    args = dict(zip(("a", "b1", "b2", "sfa", "sfb1", "sfb2"), ops.inputs()), out=None)
    name = data.draw(st.sampled_from(sorted(args)), label="argument")
    t = args[name] if args[name] is not None else torch.zeros(128, 64, 1, dtype=torch.float16)
    how = data.draw(st.sampled_from(["transposed", "padded", "offset", "float", "bytes", "squeezed", "meta"]),
                    label="how")
    raw = nvfp4.as_bytes(t) if t.dtype in nvfp4.fp4_packed_dtypes() else t
    if how == "transposed":
        bad = raw.permute(1, 0, 2)
    elif how == "padded":
        bad = torch.zeros(raw.shape[0], raw.shape[1] + 16, 1, dtype=raw.dtype)[:, :raw.shape[1]]
    elif how == "offset":
        nbytes = raw.numel() * raw.element_size()
        bad = torch.zeros(nbytes + 16, dtype=torch.uint8)[8:8 + nbytes].view(raw.dtype).view(raw.shape)
    elif how == "float":
        bad = torch.zeros(raw.shape)
    elif how == "bytes":
        bad = raw.view(torch.uint8)
    elif how == "squeezed":
        bad = raw[..., 0]
    else:
        bad = raw.to("meta")
    outcome(lambda: api.gated_dual_gemm(**{**args, name: bad}))


_GATED_OPS = None


def _gated_ops():
    global _GATED_OPS
    if _GATED_OPS is None:
        from gemmlab import nvfp4

        _GATED_OPS = nvfp4.generate(128, 64, 256, seed=4)
    return _GATED_OPS
