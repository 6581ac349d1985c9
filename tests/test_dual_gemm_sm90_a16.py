"""Chapter 11's A16 twin (A converted to FP16 once by a pre-pass; SS WGMMA over stacked [B1; B2]): configuration,
refusals, PTX and ptxas (any machine), correctness of both kernels on the emulator (any machine: the sm_90a PTX run
on the CPU), and on an H100 / H200 (sm90)."""
import re
import shutil
import subprocess

import pytest

torch = pytest.importorskip("torch")

from gemmlab import nvfp4 as fp4  # noqa: E402
from gemmlab.compile import ptx_lines, ptx_of, ptx_opcodes  # noqa: E402
from gemmlab.emulator import errors  # noqa: E402
from gemmlab.emulator.inject import mutate  # noqa: E402
from gemmlab.emulator.run import run_on_emulator  # noqa: E402
from gemmlab.family.configs import A16Config, a16_max_stages  # noqa: E402
from gemmlab.hardware import SMEM_PER_BLOCK  # noqa: E402
from gemmlab.kernels import dual_gemm_sm90_a16 as d  # noqa: E402
from gemmlab.kernels.dual_gemm_sm90 import operands_2d  # noqa: E402
from gemmlab.tiers import TierError, detect_tier  # noqa: E402

_COMPILED = {}


def compiled(m, n, k, cfg):
    """One compile per (shape, config) for the whole file (PTX tests and emulator runs share them)."""
    key = (m, n, k, cfg)
    if key not in _COMPILED:
        _COMPILED[key] = d.compile_a16("sm_90a", cfg, m, n, k)
    return _COMPILED[key]


def compiled_prepass(m, k):
    key = ("prepass", m, k)
    if key not in _COMPILED:
        _COMPILED[key] = d.compile_prepass("sm_90a", m, k)
    return _COMPILED[key]


def entries(ptx: str) -> dict:
    """PTX text per kernel entry: ``{"prepass": ..., "main": ...}``."""
    parts = re.split(r"(?=^\.visible \.entry )", ptx, flags=re.M)[1:]
    out = {}
    for p in parts:
        name = p.split("(", 1)[0]
        out["prepass" if "prepass_kernel" in name else "main"] = p
    return out


def emulate(m, n, k, cfg, seed, *, data_seed=7):
    """Fresh random operands, NaN-poisoned output and workspace, one emulated run of both kernels; returns
    (out, reference, a16, reports)."""
    ops = fp4.generate(m, n, k, seed=data_seed)
    assert torch.isnan(ops.c.float()).all()  # poisoned: an element the kernel does not write fails the check
    a16 = torch.full((m, k), float("nan"), dtype=torch.float16)
    args = operands_2d(*ops.inputs(), ops.c)
    reports = run_on_emulator(compiled(m, n, k, cfg), *args[:6], a16, args[6], seed=seed)
    return ops.c, fp4.reference(*ops.inputs()), a16, reports


# ---------------------------------------------------------------- configuration


def test_config_defaults_sizes_and_smem():
    cfg = A16Config()
    assert (cfg.tile_n, cfg.stages, cfg.buffers, cfg.threads) == (128, 5, 2, 384)
    assert cfg.b_stage_bytes() == 2 * 128 * (128 + 16)
    assert cfg.buffer_bytes() == 2 * 256 * 128 == 4 * 128 * 128  # 64 KiB of FP16 [B1; B2] at either tile_n
    assert cfg.smem_bytes() == 65536 + 5 * 16384 + 2 * 36864 + 1024 + 256 <= SMEM_PER_BLOCK
    assert A16Config(64, 7).buffers == 4
    assert (a16_max_stages(64), a16_max_stages(128)) == (7, 5)
    for tile_n in (64, 128):
        assert A16Config(tile_n, a16_max_stages(tile_n)).smem_bytes() <= SMEM_PER_BLOCK
        with pytest.raises(ValueError, match="shared memory"):
            A16Config(tile_n, a16_max_stages(tile_n) + 1)


@pytest.mark.parametrize("kwargs, match", [
    (dict(tile_n=32), "tile_n must be one of 48, 64, 80, 96, 112, 128"),
    (dict(tile_n=72), "tile_n must be one of 48, 64, 80, 96, 112, 128"),  # a multiple of 8, not of 16
    (dict(tile_n=256), "tile_n must be one of 48, 64, 80, 96, 112, 128"),
    (dict(tile_n=96, stages=7, mma_converts=True), "mma_converts needs tile_n 64 or 128"),
    (dict(tile_n=48, stages=3, mma_converts=True), "mma_converts needs tile_n 64 or 128"),
    (dict(tile_n=128, stages=5, converters=2), "converters=2 needs tile_n 64 or 96"),
    (dict(tile_n=48, stages=3, converters=2), "converters=2 needs tile_n 64 or 96"),
    (dict(tile_n=64, stages=3, mma_converts=True, converters=2), "converters=2 needs tile_n 64 or 96"),
    (dict(tile_n=64, stages=3, converters=3), "converters must be one of 1, 2"),
    (dict(stages=1), "stages must be >= 2"),
    (dict(stages=0), "stages must be >= 2"),
    (dict(tile_n=128, stages=6), r"stages must be at most 5 for tile_n=128"),
    (dict(tile_n=64, stages=8), r"stages must be at most 7 for tile_n=64"),
])
def test_config_rejects_bad_fields(kwargs, match):
    with pytest.raises(ValueError, match=match):
        A16Config(**kwargs)


@pytest.mark.parametrize("kwargs, match", [
    (dict(tile_n=64.0), "tile_n must be one of"),
    (dict(tile_n="128"), "tile_n must be one of"),
    (dict(stages=3.0), "stages must be an int"),
    (dict(stages=True), "stages must be an int"),
    (dict(stages="4"), "stages must be an int"),
    (dict(mma_converts=1), "mma_converts must be a bool"),
    (dict(mma_converts="yes"), "mma_converts must be a bool"),
])
def test_config_rejects_bad_types(kwargs, match):
    with pytest.raises((TypeError, ValueError), match=match) as info:
        A16Config(**kwargs)
    if kwargs.get("tile_n") != "128":  # a string is simply not one of the choices
        assert info.type is TypeError


def test_config_cluster_sizes_smem_and_repr():
    """cluster_m 2 keeps one half of [B1; B2] packed per CTA: half the TMA bytes per k-block, half the packed ring,
    so the A ring may be deeper; the repr names cluster_m only when it is not 1 (recorded results keep their names)."""
    assert A16Config().cluster_m == 1
    cfg = A16Config(128, 7, cluster_m=2)
    assert cfg.b_stage_bytes() == A16Config().b_stage_bytes() // 2 == 128 * (128 + 16)
    assert cfg.buffer_bytes() == A16Config().buffer_bytes()  # the FP16 buffers hold both halves, as before
    assert cfg.smem_bytes() == 65536 + 7 * 16384 + 2 * 18432 + 1024 + 256 <= SMEM_PER_BLOCK
    assert cfg.threads == 384
    assert [a16_max_stages(tile_n, 2) for tile_n in (64, 96, 128)] == [8, 9, 7]
    assert [a16_max_stages(tile_n) for tile_n in (64, 96, 128)] == [7, 7, 5]
    for tile_n in (64, 96, 128):
        A16Config(tile_n, a16_max_stages(tile_n, 2), cluster_m=2)
        with pytest.raises(ValueError, match=rf"stages must be at most {a16_max_stages(tile_n, 2)} for "
                                             rf"tile_n={tile_n}, cluster_m=2"):
            A16Config(tile_n, a16_max_stages(tile_n, 2) + 1, cluster_m=2)
    assert repr(A16Config(64, 7)) == "A16Config(tile_n=64, stages=7, mma_converts=False, converters=1)"
    assert repr(cfg) == "A16Config(tile_n=128, stages=7, mma_converts=False, converters=1, cluster_m=2)"
    assert cfg != A16Config(128, 5) and cfg != A16Config(64, 7, cluster_m=2)


@pytest.mark.parametrize("kwargs, match", [
    (dict(cluster_m=3), "cluster_m must be one of 1, 2"),
    (dict(cluster_m=0), "cluster_m must be one of 1, 2"),
    (dict(tile_n=48, stages=3, cluster_m=2), "cluster_m=2 needs tile_n 64, 96 or 128"),
    (dict(tile_n=112, stages=3, cluster_m=2), "cluster_m=2 needs tile_n 64, 96 or 128"),
    (dict(tile_n=64, stages=3, converters=2, cluster_m=2), "cluster_m=2 needs .* converters=1"),
    (dict(tile_n=128, stages=3, mma_converts=True, cluster_m=2), "cluster_m=2 needs .* mma_converts off"),
])
def test_config_rejects_bad_cluster(kwargs, match):
    with pytest.raises(ValueError, match=match):
        A16Config(**kwargs)


@pytest.mark.parametrize("value", [2.0, True, "2"])
def test_config_rejects_bad_cluster_types(value):
    with pytest.raises((TypeError, ValueError), match="cluster_m must be one of 1, 2"):
        A16Config(128, 5, cluster_m=value)


def test_config_fields_are_plain_ints():
    import numpy as np

    cfg = A16Config(np.int64(64), np.int32(3))
    assert type(cfg.tile_n) is int and type(cfg.stages) is int and cfg == A16Config(64, 3)


# ---------------------------------------------------------------- refusals, before any compile


@pytest.mark.parametrize("target, cfg, m, n, k, exc, match", [
    ("sm_100a", None, 256, 128, 512, ValueError, "needs target sm_90a"),
    ("sm_90", None, 256, 128, 512, ValueError, "target must be one of|needs target sm_90a"),
    ("sm_90a", None, 256, 132, 512, ValueError, "N must be a multiple of 8"),
    ("sm_90a", None, 256, 128, 384, ValueError, "K must be a multiple of 256"),
    ("sm_90a", None, 0, 128, 512, ValueError, "M must be >= 1"),
    ("sm_90a", (128, 5), 256, 128, 512, TypeError, "cfg must be an A16Config"),
])
def test_compile_rejects_bad_arguments(no_compile, target, cfg, m, n, k, exc, match):
    with pytest.raises(exc, match=match):
        d.compile_a16(target, cfg, m, n, k)


def test_compile_prepass_rejects_bad_arguments(no_compile):
    with pytest.raises(ValueError, match="needs target sm_90a"):
        d.compile_prepass("sm_100a", 128, 512)
    with pytest.raises(ValueError, match="K must be a multiple of 256"):
        d.compile_prepass("sm_90a", 128, 300)


def test_call_rejects_bad_input_before_the_tier_check(no_compile):
    ops = fp4.generate(64, 64, 256)
    with pytest.raises(TypeError, match="cfg must be an A16Config"):
        d.gated_dual_gemm_a16(*ops.inputs(), cfg=(128, 5))
    with pytest.raises(ValueError, match="out must be compact"):
        d.gated_dual_gemm_a16(*ops.inputs(), out=torch.empty(64, 128, 1, dtype=torch.float16)[:, :64])
    with pytest.raises(ValueError, match=r"out must have shape \(64, 64, 1\)"):
        d.gated_dual_gemm_a16(*ops.inputs(), out=torch.empty(64, 72, 1, dtype=torch.float16))
    with pytest.raises(TypeError, match="out must have dtype float16"):
        d.gated_dual_gemm_a16(*ops.inputs(), out=torch.empty(64, 64, 1, dtype=torch.float32))
    a, b1, b2, sfa, sfb1, sfb2 = fp4.generate(64, 64, 512).inputs()
    with pytest.raises(ValueError, match="K must be a multiple of 256"):  # K = 384
        d.gated_dual_gemm_a16(*(fp4.as_bytes(t)[:, :192] for t in (a, b1, b2)),
                              *(s[:, :24] for s in (sfa, sfb1, sfb2)))
    with pytest.raises(TypeError, match="sfb2 must have dtype float8_e4m3fn"):
        d.gated_dual_gemm_a16(a, b1, b2, sfa, sfb1, sfb2.float())
    ops = fp4.generate(64, 132, 256)
    with pytest.raises(ValueError, match="N must be a multiple of 8"):
        d.gated_dual_gemm_a16(*ops.inputs())


def test_prepass_call_rejects_bad_input_before_the_tier_check(no_compile):
    a, _, _, sfa, _, _ = fp4.generate(64, 64, 512).inputs()
    with pytest.raises(ValueError, match=r"out must have shape \(64, 512\)"):
        d.prepass_a16(a, sfa, out=torch.empty(64, 256, dtype=torch.float16))
    with pytest.raises(TypeError, match="out must have dtype float16"):
        d.prepass_a16(a, sfa, out=torch.empty(64, 512, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="sfa must have shape"):
        d.prepass_a16(a, sfa[:32])


@pytest.mark.skipif(detect_tier() != "cpu", reason="checks the CPU tier's refusal")
def test_cpu_tier_refuses_to_launch():
    ops = fp4.generate(128, 64, 256)
    with pytest.raises(TierError):
        d.gated_dual_gemm_a16(*ops.inputs())
    with pytest.raises(TierError):
        d.prepass_a16(ops.a, ops.sfa)


# ---------------------------------------------------------------- PTX (compile only)

PTX_CASES = [  # (m, n, k, cfg)
    (200, 136, 1536, A16Config(64, 7)),
    (200, 136, 2048, A16Config(128, 5)),
    (200, 136, 1536, A16Config(96, 7, converters=2)),
    # cluster_m 2 at each of its widths, deepest ring
    (200, 136, 1536, A16Config(64, 8, cluster_m=2)),
    (200, 136, 1536, A16Config(96, 9, cluster_m=2)),
    (200, 136, 2048, A16Config(128, 7, cluster_m=2)),
]
CLUSTER_PTX_CASES = [c for c in PTX_CASES if c[3].cluster_m == 2]


def case_id(x):
    if not hasattr(x, "tile_n"):
        return str(x)
    return (f"n{x.tile_n}s{x.stages}" + ("-2conv" if x.converters == 2 else "")
            + ("-cl2" if x.cluster_m == 2 else ""))


@pytest.mark.parametrize("m, n, k, cfg", PTX_CASES, ids=case_id)
def test_ptx_main_kernel_is_ss_wgmma_over_stacked_b(m, n, k, cfg):
    parts = entries(ptx_of(compiled(m, n, k, cfg)))
    main, pre = parts["main"], parts["prepass"]
    # one WGMMA shape: f16 inputs, f32 accumulators, N = 2 tile_n (B1 and B2 stacked)
    assert ptx_opcodes(main, r"wgmma\.mma_async") == [
        f"wgmma.mma_async.sync.aligned.m64n{2 * cfg.tile_n}k16.f32.f16.f16"]
    mmas = ptx_lines(main, r"wgmma\.mma_async")
    assert len(mmas) == 4 * 4  # 4 slices x 4 k-steps per k-block (the k-block loop is not unrolled), one GEMM pair each
    for line in mmas:
        acc, rest = line.split("}", 1)
        assert len(acc.split("{", 1)[1].split(",")) == cfg.tile_n  # 64 x 2 tile_n FP32 / 128 threads
        # SS form: A and B are both 64-bit shared-memory descriptors, no register fragment for A
        assert re.match(r"\s*,\s*%rd\d+,\s*%rd\d+,", rest), line
    waits = sorted({w.split()[1].rstrip(";") for w in ptx_lines(main, r"wgmma\.wait_group")})
    assert waits == ["0", "1"]
    assert not ptx_lines(main, r"^ld\.global")  # every operand of the main kernel arrives by TMA
    assert "cvt.rn.f16x2.e4m3x2" in ptx_opcodes(main, r"cvt\.rn\.f16x2")  # the converter's B
    # TMA: converter warp 0 loads B (10 boxes: B1 and B2 as four 32-byte slices, 2 scale boxes) before the loop and
    # in it; each MMA warpgroup's first warp loads its A (one 64 x 64 box) before the loop and in it
    tma = ptx_lines(main, r"cp\.async\.bulk\.tensor")
    assert len(tma) == 2 * 10 + cfg.stages + 4  # A: stages slots first, then one refill per slice of a k-block
    # the pre-pass: no WGMMA, no shared memory, vector stores of FP16
    assert not ptx_lines(pre, r"wgmma")
    assert not ptx_lines(pre, r"\.shared")
    assert len(ptx_lines(pre, r"st\.global\.v4\.u32")) == d.PREPASS_UNITS
    assert len(ptx_lines(pre, r"cvt\.rn\.f16x2\.e4m3x2")) == d.PREPASS_UNITS * (4 + 1)  # 4 pairs + the scale


def test_ptx_prepass_alone_has_no_wgmma():
    c = compiled_prepass(200, 768)
    assert list(entries(ptx_of(c))) == ["prepass"]
    assert not ptx_lines(c, r"wgmma|mbarrier|cp\.async")


@pytest.mark.parametrize("m, n, k, cfg", PTX_CASES, ids=case_id)
def test_ptx_without_cluster_has_no_cluster_traffic(m, n, k, cfg):
    """cluster_m 1 (every form before the option existed): no DSMEM store, no mapa, no cluster barrier, no
    cluster-scope arrive or wait; only the mbarrier init fence (release.cluster is the only form PTX offers)."""
    if cfg.cluster_m != 1:
        pytest.skip("the cluster form: test_ptx_cluster_form")
    main = entries(ptx_of(compiled(m, n, k, cfg)))["main"]
    assert not ptx_lines(main, r"shared::cluster|mapa|barrier\.cluster|acquire\.cluster")
    assert len(ptx_lines(main, r"fence\.proxy\.async\.shared::cta")) == 4  # one per slice of a k-block


@pytest.mark.parametrize("m, n, k, cfg", CLUSTER_PTX_CASES, ids=case_id)
def test_ptx_cluster_form(m, n, k, cfg):
    """cluster_m 2: the converter stores its half of each slice into its own buffer only (tile_n / 32 units a thread
    and slice, two 16-byte chunks each; the slice loop unrolled over a k-block's 4 slices), then, after its 128 threads
    meet on named barrier 1, one thread copies the half (tile_n 128-byte rows) to the peer with one bulk copy that
    completes on the peer's hfull, which warp 0 armed with expect_tx. No per-chunk DSMEM store, no cluster-scope
    release or acquire: waits and the proxy fence are CTA-scope as for TMA data, the MMA warps' remote release of
    hempty has the default semantics. Three cluster barriers bracket the kernel (after the barrier inits; at each
    role's end)."""
    main = entries(ptx_of(compiled(m, n, k, cfg)))["main"]
    per = cfg.tile_n // 32
    assert len(ptx_lines(main, r"^st\.shared\.v4\.u32")) == 4 * per * 2
    assert not ptx_lines(main, r"^st\.shared::cluster")
    copies = ptx_lines(main, r"^cp\.async\.bulk\.shared::cluster\.shared::cta\.mbarrier::complete_tx::bytes ")
    assert len(copies) == 4  # one a slice
    assert all(re.search(rf"\], {cfg.tile_n * 128}, \[", c) for c in copies), copies  # the half: tile_n rows
    assert len(ptx_lines(main, r"^bar\.sync\s+1, 128;")) == 4  # the converter warpgroup, before each copy
    assert len(ptx_lines(main, r"^fence\.proxy\.async\.shared::cta;")) == 4
    assert not ptx_lines(main, r"fence\.proxy\.async\.shared::cluster")
    # expect_tx: the hfull arming of each slice, and the TMA loads' (packed B: prologue and loop; A: stages + 4)
    assert len(ptx_lines(main, r"^mbarrier\.arrive\.expect_tx")) == 4 + 2 + cfg.stages + 4
    # three mapa: the peer's half of the buffers, its hfull and its hempty barriers
    assert len(ptx_lines(main, r"^mapa\.shared::cluster\.u32")) == 3
    # remote arrivals: the MMA warps' on the peer's hempty, once per unrolled slice, default (CTA-scope) release
    assert len(ptx_lines(main, r"^mbarrier\.arrive\.shared::cluster\.b64 _,")) == 4
    assert not ptx_lines(main, r"release\.cluster\.shared::cluster|acquire\.cluster")
    assert len(ptx_lines(main, r"^barrier\.cluster\.arrive;")) == len(ptx_lines(main, r"^barrier\.cluster\.wait;")) == 3
    # the packed ring: this CTA's half alone, so expect_tx counts half a k-block's bytes (moved into a register)
    tx = {int(x) for x in re.findall(r"^\s*mov\.b32\s+%r\d+, (\d+);", main, re.M)}
    assert cfg.b_stage_bytes() in tx and 2 * cfg.b_stage_bytes() not in tx
    # each rank's branch loads its half: B1 or B2 as four 32-byte slices and one scale box, in the prologue and the loop
    assert len(ptx_lines(main, r"cp\.async\.bulk\.tensor")) == 2 * 2 * 5 + cfg.stages + 4


@pytest.mark.parametrize("m, n, k, cfg", PTX_CASES, ids=case_id)
def test_ptx_registers_roles(m, n, k, cfg):
    main = entries(ptx_of(compiled(m, n, k, cfg)))["main"]
    conv, mma = d.REGS[cfg.converters]
    assert [" ".join(x.split()) for x in ptx_lines(main, r"setmaxnreg")] == [
        f"setmaxnreg.dec.sync.aligned.u32 {conv};", f"setmaxnreg.inc.sync.aligned.u32 {mma};"]
    assert re.search(r"^\.minnctapersm 1$", main, re.M)  # ptxas honours setmaxnreg only with it
    assert re.search(rf"^\.reqntid {cfg.threads}, 1, 1$", main, re.M)


def test_setmaxnreg_asks_for_no_more_registers_than_the_cta_starts_with():
    """setmaxnreg moves registers between a CTA's warpgroups and cannot add any: 384 threads start with 168 each
    (ptxas's entry count: 65,536 / 384 rounded down to a multiple of 8), 512 threads with 128."""
    assert set(d.REGS) == {1, 2}
    for converters, (conv, mma) in d.REGS.items():
        threads = A16Config(64, 3, converters=converters).threads
        assert threads == 128 * (converters + 2)
        entry = min(255, 65536 // threads // 8 * 8)
        assert entry == {1: 168, 2: 128}[converters]
        assert 128 * (converters * conv + 2 * mma) <= threads * entry
        assert conv % 8 == 0 and mma % 8 == 0 and 24 <= conv <= mma <= 256
        assert mma >= 96 + 64  # the accumulators of tile_n 96 (two converters' widest) and room for the rest
    # an m64n256k16 WGMMA (tile_n 128) needs at least 154 registers at entry, which a fourth warpgroup would not leave
    assert 65536 // 512 < 154 <= 168


def _ptxas(ptx: str, tmp_path) -> str:
    src = tmp_path / "k.ptx"
    src.write_text(re.sub(r"^\.version 9\.[0-9]*", ".version 9.0", ptx, flags=re.M))
    r = subprocess.run(["ptxas", "-arch=sm_90a", "-v", str(src), "-o", str(tmp_path / "k.cubin")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return r.stdout + r.stderr


@pytest.mark.skipif(shutil.which("ptxas") is None, reason="needs ptxas")
@pytest.mark.parametrize("m, n, k, cfg", PTX_CASES, ids=case_id)
def test_ptxas_no_spills_no_warnings(m, n, k, cfg, tmp_path):
    report = _ptxas(ptx_of(compiled(m, n, k, cfg)), tmp_path)
    assert "warning" not in report.lower(), report  # e.g. C7508 (setmaxnreg ignored), C7510/C7513 (WGMMA serialized)
    spills = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", report)
    assert len(spills) == 2 and all(s == ("0", "0") for s in spills), report
    used = {int(x) for x in re.findall(r"Used (\d+) registers", report)}
    assert {1: 168, 2: 128}[cfg.converters] in used  # the main kernel's count at entry (384 or 512 threads)
    assert min(used) <= 64  # the pre-pass: a streaming kernel, many CTAs per SM


# ---------------------------------------------------------------- correctness on the emulator

EMULATED = [  # (m, n, k, (tile_n, stages[, mma_converts]), seeds)
    # M not a multiple of 128, N not of tile_n, 24 slices over a ring of 7 (and 6 k-blocks over 2 packed stages)
    (200, 136, 1536, (64, 7), [0]),
    (200, 136, 2048, (128, 5), [1]),  # 32 slices over a ring of 5; two FP16 B buffers
    (128, 72, 1024, (64, 2), [2, 3]),  # the shallowest ring: each slot refilled as soon as it is read
    (64, 64, 512, (128, 2), [4]),  # M = 64: the second MMA warpgroup's rows are all past M (zero-filled boxes)
    (1, 64, 256, (128, 3), [5]),  # one row, one k-block (fewer slices than slots)
    # the narrower and in-between widths: WGMMA N = 96, 160, 192, 224; N not a multiple of tile_n
    (200, 200, 1536, (96, 7), [11]),
    (130, 104, 1024, (48, 10), [12]),
    (64, 88, 512, (80, 8), [13]),
    (200, 120, 768, (112, 6), [14]),
    # two converter warpgroups (512 threads), splitting each slice's units between them
    (130, 136, 1024, (64, 7, False, 2), [15]),
    (200, 200, 1536, (96, 7, False, 2), [16]),
    # mma_converts: the MMA warpgroups convert half of every slice (12 warps on hfull and pempty)
    (200, 136, 1536, (64, 7, True), [6, 7]),
    (200, 136, 2048, (128, 5, True), [8]),
    (128, 72, 1024, (64, 2, True), [9]),
    (1, 64, 256, (128, 3, True), [10]),  # one k-block: the MMA warps convert slice 0 before their first WGMMA
    # cluster_m 2: two CTAs share the FP16 [B1; B2] buffers (each converts one half, bulk-copies it to the peer)
    (300, 136, 1024, (128, 7, False, 1, 2), [17]),  # M tiles 3 -> 4: the last CTA wholly past M; 16 slices, ring 7
    (200, 200, 1536, (96, 9, False, 1, 2), [18]),  # the second CTA partly past M; 24 slices over a ring of 9
    # M = 64: the second CTA wholly past M, the shallowest ring. Seeds 3 and 7 interleave the CTAs so that, without
    # the MMA warps' arrivals on the peer's hempty, a bulk copy overwrites a buffer the peer still reads: both fail then
    # (test_emulator_cluster_form_catches_injected_bugs)
    (64, 72, 1024, (64, 2, False, 1, 2), [3, 7]),
    (1, 64, 256, (128, 2, False, 1, 2), [19]),  # one row, one k-block
]


def emulated_id(m, n, k, f):
    return (f"{m}x{n}x{k}-n{f[0]}s{f[1]}" + ("-mma" if f[2:3] == (True,) else "")
            + ("-2conv" if f[3:4] == (2,) else "") + ("-cl2" if f[4:5] == (2,) else ""))


@pytest.mark.parametrize("m, n, k, fields, seeds", EMULATED, ids=[emulated_id(m, n, k, f) for m, n, k, f, _ in EMULATED])
def test_emulator_matches_reference(m, n, k, fields, seeds):
    cfg = A16Config(*fields)
    cl = cfg.cluster_m
    for seed in seeds:
        out, ref, a16, reports = emulate(m, n, k, cfg, seed)
        res = fp4.check_close(out, ref)
        assert res.ok, f"{m}x{n}x{k} {cfg} seed {seed}: {res}"
        assert [r.kernel.split("_")[2] for r in reports] == ["prepass", "a16"]
        # cluster_m 2: M tiles rounded up to whole clusters of 2 along M
        assert reports[1].block == (cfg.threads, 1, 1) and reports[1].cluster == (cl, 1, 1)
        assert reports[1].grid == (-(-m // (128 * cl)) * cl, -(-n // cfg.tile_n), 1)
        assert reports[1].smem <= cfg.smem_bytes() <= SMEM_PER_BLOCK
        assert not torch.isnan(a16.float()).any()  # the pre-pass wrote every element of the workspace


def _emulate_ptx(m, n, k, cfg, seed, ptx):
    ops = fp4.generate(m, n, k, seed=7)
    a16 = torch.full((m, k), float("nan"), dtype=torch.float16)
    args = operands_2d(*ops.inputs(), ops.c)
    run_on_emulator(compiled(m, n, k, cfg), *args[:6], a16, args[6], seed=seed, ptx=ptx)
    return fp4.check_close(ops.c, fp4.reference(*ops.inputs()))


def test_emulator_cluster_form_catches_injected_bugs():
    """The cluster form's two new hazards, each injected into its PTX: the bulk copy issued before the other converter
    warps have stored (and fenced) their rows of the half (the named barrier dropped), and a buffer refilled by the
    peer's copy while our WGMMAs may still read it (the MMA warps' remote hempty arrivals dropped, the count lowered
    to our 8 warps so that nothing deadlocks)."""
    cfg = A16Config(128, 2, cluster_m=2)
    ptx = mutate(ptx_of(compiled(1, 64, 256, cfg)), drop=r"^bar\.sync\s+1, 128;")
    with pytest.raises(errors.RaceError, match=r"cp\.async\.bulk \(shared to shared::cluster\) reads shared memory"):
        _emulate_ptx(1, 64, 256, cfg, 0, ptx)

    cfg = A16Config(64, 2, cluster_m=2)
    ptx = ptx_of(compiled(64, 72, 1024, cfg))
    assert len(re.findall(r"^\s*mov\.b32\s+%r\d+, 16;", ptx, re.M)) == 1  # hempty's count, 8 x 2 MMA warps
    ptx = mutate(ptx, replace=(r"^mov\.b32\s+(%r\d+), 16;$", r"mov.b32 \1, 8;"))
    ptx = mutate(ptx, drop=r"^mbarrier\.arrive\.shared::cluster\.b64")
    for seed in (3, 7):
        assert not _emulate_ptx(64, 72, 1024, cfg, seed, ptx).ok


def test_emulator_default_config():
    m, n, k = 136, 136, 512
    assert ptx_of(compiled(m, n, k, None)) == ptx_of(compiled(m, n, k, A16Config()))
    out, ref, _, _ = emulate(m, n, k, None, seed=1, data_seed=3)
    assert fp4.check_close(out, ref).ok


def _emulate_prepass(m, k, seed=0):
    ops = fp4.generate(m, 8, k, seed=seed)
    a16 = torch.full((m, k), float("nan"), dtype=torch.float16)
    args = operands_2d(*ops.inputs(), ops.c)
    run_on_emulator(compiled_prepass(m, k), args[0], args[3], a16, seed=seed)
    return a16, fp4.dequantize(ops.a, ops.sfa)[..., 0]


# 200 x 768: 19,200 units, not a multiple of a CTA's 1,024 (the last CTA's tail is predicated off); 3 x 256: 96 units
PREPASS_SHAPES = [(200, 768), (3, 256)]


@pytest.mark.parametrize("m, k", PREPASS_SHAPES, ids=[f"{m}x{k}" for m, k in PREPASS_SHAPES])
def test_emulator_prepass_writes_every_value_exactly(m, k):
    """Every FP16 value of the workspace is the exact NVFP4 value (e2m1 x e4m3), in its place, written once."""
    a16, want = _emulate_prepass(m, k)
    assert not torch.isnan(a16.float()).any()
    assert torch.equal(a16.float(), want)


# ---------------------------------------------------------------- on an H100 / H200

GPU_SHAPES = list(fp4.TEST_SHAPES) + list(fp4.BENCHMARK_SHAPES) + [(2048, 14336, 4096)]
GPU_CONFIGS = ["default", (64, a16_max_stages(64)), (128, a16_max_stages(128)), (64, 2), (128, 5, True), (64, 7, True)]
# the widths between: GPU MODE's test shapes (odd M, N not a multiple of tile_n) and two benchmark shapes
GPU_WIDTHS = [(tile_n, a16_max_stages(tile_n)) for tile_n in (48, 80, 96, 112)] + [(96, 2)]
GPU_WIDTHS += [(64, 7, False, 2), (96, 7, False, 2), (96, 2, False, 2)]  # two converter warpgroups
GPU_WIDTH_SHAPES = list(fp4.TEST_SHAPES) + [(512, 3072, 7168), (384, 4096, 7168)]
# cluster_m 2 at each of its widths (deepest ring, and the shallowest at 128): GPU MODE's test shapes, two benchmark
# shapes, and M = 640 (5 tiles: the last cluster's second CTA wholly past M) and 1024 (NCU's shape of the module)
GPU_CLUSTERS = [(tile_n, a16_max_stages(tile_n, 2), False, 1, 2) for tile_n in (64, 96, 128)] + [(128, 2, False, 1, 2)]
GPU_CLUSTER_SHAPES = list(fp4.TEST_SHAPES) + [(256, 4096, 7168), (512, 3072, 7168), (640, 4096, 7168),
                                              (1024, 4096, 7168)]

@pytest.mark.gpu
@pytest.mark.sm90
@pytest.mark.parametrize("shape", GPU_SHAPES, ids=[f"{m}x{n}x{k}" for m, n, k in GPU_SHAPES])
@pytest.mark.parametrize("form", GPU_CONFIGS, ids=[str(f) for f in GPU_CONFIGS])
def test_gpu_matches_reference_with_poisoned_output(shape, form):
    cfg = None if form == "default" else A16Config(*form)
    out, returned, res = fp4.run_poisoned(lambda *ins, out: d.gated_dual_gemm_a16(*ins, out=out, cfg=cfg), *shape,
                                          seed=17 + shape[0])
    assert returned is out
    assert res.ok, f"{shape} {cfg}: {res}"


@pytest.mark.gpu
@pytest.mark.sm90
@pytest.mark.parametrize("shape", GPU_WIDTH_SHAPES, ids=[f"{m}x{n}x{k}" for m, n, k in GPU_WIDTH_SHAPES])
@pytest.mark.parametrize("form", GPU_WIDTHS, ids=[str(f) for f in GPU_WIDTHS])
def test_gpu_every_width_matches_reference(shape, form):
    test_gpu_matches_reference_with_poisoned_output(shape, form)


@pytest.mark.gpu
@pytest.mark.sm90
@pytest.mark.parametrize("shape", GPU_CLUSTER_SHAPES, ids=[f"{m}x{n}x{k}" for m, n, k in GPU_CLUSTER_SHAPES])
@pytest.mark.parametrize("form", GPU_CLUSTERS, ids=[str(f) for f in GPU_CLUSTERS])
def test_gpu_cluster_matches_reference(shape, form):
    test_gpu_matches_reference_with_poisoned_output(shape, form)


@pytest.mark.gpu
@pytest.mark.sm90
def test_gpu_cluster_repeat_calls_agree_with_one_cta():
    """The cluster form on NCU's shape: bitwise the same result on repeated calls (no state leaks between
    launches through the peer's barriers), and bitwise the one-CTA form's: the same FP16 B values (whichever CTA
    converted them) go through the same WGMMAs in the same K order."""
    ops = fp4.generate(1024, 4096, 7168, seed=11, device="cuda")
    cfg = A16Config(128, a16_max_stages(128, 2), cluster_m=2)
    first = d.gated_dual_gemm_a16(*ops.inputs(), cfg=cfg)
    second = d.gated_dual_gemm_a16(*ops.inputs(), cfg=cfg)
    alone = d.gated_dual_gemm_a16(*ops.inputs(), cfg=A16Config(128, 5))
    torch.cuda.synchronize()
    assert torch.equal(first, second)
    assert fp4.check_close(first, fp4.reference(*ops.inputs())).ok
    assert torch.equal(first, alone)


@pytest.mark.gpu
@pytest.mark.sm90
@pytest.mark.parametrize("m, k", [(200, 768), (3, 256), (2048, 4096)], ids=["200x768", "3x256", "2048x4096"])
def test_gpu_prepass_is_exact(m, k):
    ops = fp4.generate(m, 8, k, seed=m, device="cuda")
    out = torch.full((m, k), float("nan"), dtype=torch.float16, device="cuda")
    assert d.prepass_a16(ops.a, ops.sfa, out=out) is out
    torch.cuda.synchronize()
    assert torch.equal(out.float(), fp4.dequantize(ops.a, ops.sfa)[..., 0])


@pytest.mark.gpu
@pytest.mark.sm90
def test_gpu_default_config_and_repeat_calls_agree():
    first, second, res = fp4.run_twice(d.gated_dual_gemm_a16, 512, 4096, 7168, seed=5)
    assert torch.equal(first, second)  # no state leaks between launches
    assert res.ok
