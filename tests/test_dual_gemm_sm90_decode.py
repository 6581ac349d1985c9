"""Chapter 11's decode twin (weights on WGMMA's M side, split-K over a cluster): configuration, PTX and refusals
(any machine), correctness on the emulator (any machine: the sm_90a kernel's PTX run on the CPU), and on an H100 /
H200 (sm90)."""
import re

import pytest

torch = pytest.importorskip("torch")

from gemmlab import nvfp4 as fp4  # noqa: E402
from gemmlab.compile import ptx_lines, ptx_of, ptx_opcodes  # noqa: E402
from gemmlab.emulator.errors import RaceError  # noqa: E402
from gemmlab.emulator.run import run_on_emulator  # noqa: E402
from gemmlab.family.configs import decode_max_stages  # noqa: E402
from gemmlab.hardware import SMEM_PER_BLOCK  # noqa: E402
from gemmlab.kernels import dual_gemm_sm90_decode as d  # noqa: E402
from gemmlab.kernels.dual_gemm_sm90 import operands_2d  # noqa: E402
from gemmlab.tiers import TierError, detect_tier  # noqa: E402

DecodeConfig = d.DecodeConfig

_COMPILED = {}


def compiled(m, n, k, cfg):
    """One compile per (shape, config) for the whole file (PTX tests and emulator runs share them)."""
    key = (m, n, k, cfg)
    if key not in _COMPILED:
        _COMPILED[key] = d.compile_decode("sm_90a", cfg, m, n, k)
    return _COMPILED[key]


def emulate(m, n, k, cfg, seed, *, data_seed=7, ptx=None):
    """Fresh random operands, NaN-poisoned output, one emulated launch; returns (out, reference)."""
    ops = fp4.generate(m, n, k, seed=data_seed)
    assert torch.isnan(ops.c.float()).all()  # poisoned: an element the kernel does not write fails the check
    run_on_emulator(compiled(m, n, k, cfg), *operands_2d(*ops.inputs(), ops.c), seed=seed, ptx=ptx)
    return ops.c, fp4.reference(*ops.inputs())


# ---------------------------------------------------------------- configuration


def test_config_defaults_sizes_and_smem():
    cfg = DecodeConfig()
    assert (cfg.tokens, cfg.mma_warpgroups, cfg.split, cfg.stages) == (64, 2, 1, 4)
    assert (cfg.rows, cfg.threads) == (128, 384)
    assert cfg.stage_bytes() == (2 * 128 + 64) * (128 + 16)
    assert cfg.buffer_bytes() == 4 * 64 * 64 * 2
    assert cfg.smem_bytes() == 4 * 320 * 144 + 4 * 64 * 128 + 1024 + 256 <= SMEM_PER_BLOCK
    # split-K partials reuse the ring: 2 accumulators x rows x tokens x 4 bytes fit in what the ring already takes
    big = DecodeConfig(tokens=128, mma_warpgroups=1, split=4, stages=4)
    assert big.partial_bytes() == 2 * 64 * 128 * 4 < big.smem_bytes() <= SMEM_PER_BLOCK
    assert DecodeConfig(tokens=112, mma_warpgroups=2, stages=3).smem_bytes() <= SMEM_PER_BLOCK


@pytest.mark.parametrize("kwargs, match", [
    (dict(tokens=24), "tokens must be a multiple of 16"),
    (dict(tokens=0), "tokens must be >= 16"),
    (dict(tokens=144), "tokens must be <= 128"),
    (dict(mma_warpgroups=3), "mma_warpgroups must be one of 1, 2"),
    (dict(split=3), "split must be one of 1, 2, 4"),
    (dict(split=8), "split must be one of 1, 2, 4"),
    (dict(stages=2), "stages must be >= 3"),
    (dict(stages=9), "shared memory"),
    # two MMA warpgroups and 128 tokens: 232,704 bytes at the fewest stages
    (dict(tokens=128, mma_warpgroups=2, stages=3), "shared memory"),
])
def test_config_rejects_bad_fields(kwargs, match):
    with pytest.raises(ValueError, match=match):
        DecodeConfig(**kwargs)


@pytest.mark.parametrize("kwargs", [dict(tokens=64.0), dict(split=True), dict(stages="4"), dict(mma_warpgroups=1.0)])
def test_config_rejects_bad_types(kwargs):
    with pytest.raises(TypeError):
        DecodeConfig(**kwargs)


@pytest.mark.parametrize("m, n, k, clusters, want", [
    # 64 row blocks of one warpgroup, split 2: 64 pairs fit the H100's 66 at once, 14 k-blocks each: 22.9 us modelled;
    # two warpgroups, split 4 would need 32 quads where 30 fit (two waves): 41.1 us
    (1, 4096, 7168, None, (16, 1, 2)),
    # only 20 pairs at once: split 2 takes 4 waves; no split, 28 k-blocks a CTA, one wave is best (31.4 us)
    (1, 4096, 7168, (132, 20, 30), (16, 1, 1)),
    (64, 14336, 4096, None, (64, 2, 1)),   # 112 row blocks of 128 already fill the GPU
    (1, 64, 256, None, (16, 1, 1)),        # one k-block: nothing to split; one row block
    (128, 4096, 7168, None, (128, 1, 2)),  # two warpgroups at 128 tokens fit no ring
])
def test_choose_decode_config(m, n, k, clusters, want):
    cfg = d.choose_decode_config(m, n, k, clusters=clusters)
    assert (cfg.tokens, cfg.mma_warpgroups, cfg.split) == want
    assert cfg.stages == decode_max_stages(cfg.tokens, cfg.mma_warpgroups, cfg.split)


def test_decode_cost_worked_example():
    from gemmlab.family.heuristic_gated import DECODE_COST, decode_cost

    c0, c_work, c_tokens, c_wave, c_split = DECODE_COST
    # 4096 rows / 64 = 64 row blocks, 64 pairs fit at once: one wave of 7168 / 256 / 2 = 14 k-blocks, 16 tokens
    got = decode_cost(DecodeConfig(16, 1, 2, 6), 4096, 7168, (132, 66, 30))
    assert got == pytest.approx(c0 + 14 * (c_work + c_tokens / 4) + c_wave + c_split)
    # 65 pairs fit at most 64: halve the pairs, two waves
    got2 = decode_cost(DecodeConfig(16, 1, 2, 6), 4096, 7168, (132, 32, 30))
    assert got2 == pytest.approx(c0 + 28 * (c_work + c_tokens / 4) + 2 * c_wave + c_split)


def test_decode_choice_against_the_h100_sweep():
    """On every shape the H100 sweep timed, the model's pick (on that GPU's cluster capacity, from the driver) ran
    within 25 % of the sweep's fastest configuration, and it beat the fast twin at every M the decode twin takes (up to
    DECODE_UP_TO: the public call runs it below SWAP_FROM rows, and up to DECODE_UP_TO where the swap twin has no
    configuration)."""
    import json
    from pathlib import Path

    from gemmlab.family.heuristic_gated import DECODE_UP_TO
    from gemmlab.measure.dual_gemm_tables import decode_sweep_rows

    doc = json.loads((Path(__file__).parents[1] / "results/nvidia-h100-80gb-hbm3/dual_gemm_decode.json").read_text())
    rows = decode_sweep_rows(doc)
    assert len(rows) >= 9 and all("error" not in r for r in rows)
    for shape, r in zip(doc["shapes"], rows):
        assert r["pick_us"] is not None and r["pick_us"] <= 1.25 * r["best_us"], r
        if shape["m"] <= DECODE_UP_TO:
            assert r["pick_us"] < r["fast_us"], r


# ---------------------------------------------------------------- refusals, before any compile


@pytest.mark.parametrize("target, cfg, m, n, k, exc, match", [
    ("sm_100a", None, 64, 128, 512, ValueError, "needs target sm_90a"),
    ("sm_90a", None, 129, 128, 512, ValueError, "M must be <= 128"),
    ("sm_90a", DecodeConfig(tokens=32), 33, 128, 512, ValueError, r"M must be <= cfg.tokens \(32"),
    ("sm_90a", None, 64, 132, 512, ValueError, "N must be a multiple of 8"),
    ("sm_90a", None, 64, 128, 384, ValueError, "K must be a multiple of 256"),
    ("sm_90a", (64, 2, 1, 4), 64, 128, 512, TypeError, "cfg must be a DecodeConfig"),
])
def test_compile_rejects_bad_arguments(no_compile, target, cfg, m, n, k, exc, match):
    with pytest.raises(exc, match=match):
        d.compile_decode(target, cfg, m, n, k)


def test_call_rejects_bad_input_before_the_tier_check(no_compile):
    ops = fp4.generate(129, 64, 256)
    with pytest.raises(ValueError, match="M must be <= 128"):
        d.gated_dual_gemm_decode(*ops.inputs())
    ops = fp4.generate(64, 64, 256)
    with pytest.raises(ValueError, match=r"M must be <= cfg.tokens \(48"):
        d.gated_dual_gemm_decode(*ops.inputs(), cfg=DecodeConfig(tokens=48))
    with pytest.raises(TypeError, match="cfg must be a DecodeConfig"):
        d.gated_dual_gemm_decode(*ops.inputs(), cfg=(64, 2, 1, 4))
    with pytest.raises(ValueError, match="out must be compact"):
        d.gated_dual_gemm_decode(*ops.inputs(), out=torch.empty(64, 128, 1, dtype=torch.float16)[:, :64])
    a, b1, b2, sfa, sfb1, sfb2 = fp4.generate(64, 64, 512).inputs()
    with pytest.raises(ValueError, match="K must be a multiple of 256"):  # K = 384
        d.gated_dual_gemm_decode(*(fp4.as_bytes(t)[:, :192] for t in (a, b1, b2)),
                                 *(s[:, :24] for s in (sfa, sfb1, sfb2)))


@pytest.mark.skipif(detect_tier() != "cpu", reason="checks the CPU tier's refusal")
def test_cpu_tier_refuses_to_launch():
    with pytest.raises(TierError):
        d.gated_dual_gemm_decode(*fp4.generate(16, 64, 256).inputs())


# ---------------------------------------------------------------- PTX (compile only)

PTX_CASES = [  # (m, n, k, cfg)
    (16, 136, 512, DecodeConfig(tokens=16, mma_warpgroups=1, split=1, stages=3)),
    (40, 136, 512, DecodeConfig(tokens=48, mma_warpgroups=2, split=2, stages=4)),
    (128, 64, 1024, DecodeConfig(tokens=128, mma_warpgroups=1, split=4, stages=4)),
]


@pytest.mark.parametrize("m, n, k, cfg", PTX_CASES, ids=lambda x: getattr(x, "tokens", x))
def test_ptx_wgmma_rs_form_with_tokens_as_n(m, n, k, cfg):
    c = compiled(m, n, k, cfg)
    mmas = ptx_lines(c, r"wgmma\.mma_async")
    assert ptx_opcodes(c, r"wgmma\.mma_async") == [f"wgmma.mma_async.sync.aligned.m64n{cfg.tokens}k16.f32.f16.f16"]
    assert len(mmas) == 4 * 4 * 2  # 4 slices x 4 k-steps x 2 GEMMs (the k-block loop is not unrolled)
    a_regs = [m_.split("}, {")[1].split("}")[0] for m_ in mmas]  # the second brace group: A's four registers
    assert all(len(r.split(",")) == 4 for r in a_regs)  # RS form: the weights come from registers
    assert len(set(a_regs)) == len(a_regs)  # W1 and W2 have fragments of their own (one read each)
    assert "cvt.rn.f16x2.e4m3x2" in ptx_opcodes(c, r"cvt\.rn\.f16x2")
    waits = sorted({w.split()[1].rstrip(";") for w in ptx_lines(c, r"wgmma\.wait_group")})
    assert waits == ["0", "1"]
    assert not ptx_lines(c, r"^ld\.global")  # every operand arrives by TMA
    # warp 0 of the converter: stages - 2 k-blocks before the loop, one per iteration; 15 boxes a k-block
    # (W1, W2 and A as four 32-byte slices each, three scale boxes)
    assert len(ptx_lines(c, r"cp\.async\.bulk\.tensor")) == (cfg.stages - 2 + 1) * (3 * 4 + 3)


@pytest.mark.parametrize("m, n, k, cfg", PTX_CASES, ids=lambda x: getattr(x, "tokens", x))
def test_ptx_registers_and_cluster(m, n, k, cfg):
    c = compiled(m, n, k, cfg)
    conv, mma = d.REGS[cfg.mma_warpgroups]
    assert conv + cfg.mma_warpgroups * mma <= 512  # 128 x (sum) <= 64 K registers
    assert [" ".join(x.split()) for x in ptx_lines(c, r"setmaxnreg")] == [
        f"setmaxnreg.dec.sync.aligned.u32 {conv};", f"setmaxnreg.inc.sync.aligned.u32 {mma};"]
    assert re.search(r"^\.minnctapersm 1$", ptx_of(c), re.M)  # ptxas honours setmaxnreg only with it
    cluster = ptx_lines(c, r"mapa|shared::cluster|barrier\.cluster")
    if cfg.split == 1:
        assert not cluster
        return
    assert len(ptx_lines(c, r"^mapa\.shared::cluster")) == cfg.split  # one peer base per rank
    share = cfg.tokens // 2 // cfg.split  # fragment values this CTA reduces, of each accumulator
    assert len(ptx_lines(c, r"^ld\.shared::cluster\.f32")) == 2 * share * cfg.split
    # two cluster barriers, in the converter warpgroup and in the MMA warpgroups
    assert ptx_opcodes(c, r"barrier\.cluster") == ["barrier.cluster.arrive;", "barrier.cluster.wait;"]
    assert len(ptx_lines(c, r"barrier\.cluster\.arrive")) == len(ptx_lines(c, r"barrier\.cluster\.wait")) == 4


# ---------------------------------------------------------------- correctness on the emulator

EMULATED = [  # (m, n, k, (tokens, mma_warpgroups, split, stages), seeds)
    (1, 64, 256, (16, 1, 1, 3), [0]),          # one token: A's TMA box is 16 rows, 15 of them zero-filled
    (16, 136, 512, (16, 2, 2, 5), [1]),        # N not a multiple of the 128-row block
    (40, 136, 1024, (48, 2, 4, 4), [2]),       # M not a multiple of 16, a cluster of four
    (64, 136, 512, (64, 1, 2, 4), [0, 1, 2, 3]),
    (16, 64, 1024, (16, 1, 4, 3), [0, 1, 2, 3]),
    (64, 64, 1024, (64, 2, 1, 4), [3]),        # N = 64 < 128 rows: the weight box is half zeros
    (128, 64, 256, (128, 1, 1, 4), [1]),
    (128, 136, 1024, (128, 1, 4, 4), [0]),
    (100, 136, 512, (112, 2, 2, 3), [2]),      # the widest token tile two MMA warpgroups take
    (16, 64, 256, (16, 2, 2, 5), [0]),         # K = 256 split 2: one CTA of the cluster has no k-block
]


@pytest.mark.parametrize("m, n, k, fields, seeds", EMULATED,
                         ids=[f"{m}x{n}x{k}-T{f[0]}w{f[1]}s{f[2]}" for m, n, k, f, _ in EMULATED])
def test_emulator_matches_reference(m, n, k, fields, seeds):
    cfg = DecodeConfig(*fields)
    for seed in seeds:
        out, ref = emulate(m, n, k, cfg, seed)
        res = fp4.check_close(out, ref)
        assert res.ok, f"{m}x{n}x{k} {cfg} seed {seed}: {res}"


def test_emulator_default_config():
    m, n, k = 40, 136, 1024
    cfg = d.choose_decode_config(m, n, k)
    assert compiled(m, n, k, None).__ptx__ == compiled(m, n, k, cfg).__ptx__
    out, ref = emulate(m, n, k, None, seed=1, data_seed=3)
    assert fp4.check_close(out, ref).ok


def _without_cluster_barrier(ptx: str, which: int) -> str:
    """``ptx`` without cluster barrier ``which`` (0: before the reduction, 1: before exit), in every warpgroup."""
    lines = ptx.splitlines()
    at = [i for i, ln in enumerate(lines) if re.match(r"\s*barrier\.cluster\.(arrive|wait)", ln)]
    assert len(at) == 8  # arrive, wait, arrive, wait in the converter warpgroup and in the MMA warpgroups
    drop = {at[i] for i in range(8) if (i // 2) % 2 == which}
    return "\n".join(ln for i, ln in enumerate(lines) if i not in drop) + "\n"


def test_emulator_needs_both_cluster_barriers():
    m, n, k, cfg = 16, 64, 512, DecodeConfig(tokens=16, mma_warpgroups=1, split=2, stages=3)
    ptx = ptx_of(compiled(m, n, k, cfg))
    # without the first, a CTA reads its peer's partial sums before they are written
    out, ref = emulate(m, n, k, cfg, seed=0, ptx=_without_cluster_barrier(ptx, 0))
    assert not fp4.check_close(out, ref).ok
    # without the second, a CTA may exit while its peer still reads its shared memory
    with pytest.raises(RaceError, match="exited"):
        for seed in range(4):
            emulate(m, n, k, cfg, seed=seed, ptx=_without_cluster_barrier(ptx, 1))


# ---------------------------------------------------------------- on an H100 / H200

GPU_SHAPES = [(1, 4096, 7168), (16, 4096, 7168), (40, 3072, 4096), (64, 4096, 7168), (128, 4096, 7168),
              (100, 136, 512), (64, 96, 1024), (8, 64, 256)]  # the last: split 2 and 4 leave CTAs without a k-block
GPU_CONFIGS = ["default", (1, 1), (1, 2), (1, 4), (2, 1), (2, 2), (2, 4)]  # forced: (mma_warpgroups, split)


def _gpu_config(m, form):
    if form == "default":
        return None
    wgs, split = form
    tokens = -(-m // 16) * 16
    if wgs == 2 and tokens > 112:
        pytest.skip("two MMA warpgroups take at most 112 tokens")
    return DecodeConfig(tokens, wgs, split, decode_max_stages(tokens, wgs, split))


@pytest.mark.gpu
@pytest.mark.sm90
@pytest.mark.parametrize("shape", GPU_SHAPES, ids=[f"{m}x{n}x{k}" for m, n, k in GPU_SHAPES])
@pytest.mark.parametrize("form", GPU_CONFIGS, ids=[str(f) for f in GPU_CONFIGS])
def test_gpu_matches_reference_with_poisoned_output(shape, form):
    m, n, k = shape
    cfg = _gpu_config(m, form)
    _, _, res = fp4.run_poisoned(lambda *ins, out: d.gated_dual_gemm_decode(*ins, out=out, cfg=cfg), *shape,
                                 seed=29 + m)
    assert res.ok, f"{shape} {cfg}: {res}"


@pytest.mark.gpu
@pytest.mark.sm90
def test_gpu_default_config_and_repeat_calls_agree():
    first, second, res = fp4.run_twice(d.gated_dual_gemm_decode, 32, 4096, 7168, seed=5)
    assert torch.equal(first, second)  # no state leaks between launches (barriers, buffers, the cluster reduction)
    assert res.ok


def test_setmaxnreg_asks_for_no_more_registers_than_the_cta_starts_with():
    """setmaxnreg moves registers between a CTA's warpgroups; it cannot add any. A CTA of T threads starts with
    T x (65,536 / T rounded down to a multiple of 8, at most 255) registers (ptxas's entry count: 168 for 384
    threads, 255 for 256); an increase the decreases cannot pay for waits forever. (64, 224) with two MMA
    warpgroups asked for 65,536 of 64,512 and hung on an H200; the emulator has no register pool to see it."""
    for wgs, (conv, mma) in d.REGS.items():
        threads = 128 * (1 + wgs)
        entry = min(255, 65536 // threads // 8 * 8)
        assert 128 * (conv + wgs * mma) <= threads * entry, (wgs, conv, mma)
        assert conv % 8 == 0 and mma % 8 == 0 and 24 <= conv <= mma <= 256  # setmaxnreg's rules



@pytest.mark.parametrize("clusters, exc, match", [
    ((132, 66), ValueError, r"clusters must be a tuple of 3 counts"),
    ([132, 66, 30], ValueError, r"clusters must be a tuple of 3 counts"),
    ((132, 0, 30), ValueError, r"clusters\[1\] must be >= 1"),
    ((132, 66.0, 30), TypeError, r"clusters\[1\] must be an int"),
])
def test_choose_decode_config_rejects_bad_cluster_counts(clusters, exc, match):
    with pytest.raises(exc, match=match):
        d.choose_decode_config(1, 4096, 7168, clusters=clusters)
    with pytest.raises(ValueError, match="m must be <= 128"):  # past the decode twin's token tile
        d.choose_decode_config(129, 4096, 7168)


def test_choose_decode_config_takes_numpy_cluster_counts():
    import numpy as np

    got = d.choose_decode_config(1, 4096, 7168, clusters=tuple(np.int64(c) for c in (132, 20, 30)))
    assert got == d.choose_decode_config(1, 4096, 7168, clusters=(132, 20, 30))
