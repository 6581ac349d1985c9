"""Chapter 07's persistent Hopper GEMM: PTX of every variant (any machine), results on sm90."""
import re

import pytest
import torch

from gemmlab import gemm, splitk
from gemmlab.compile import ptx_instructions, ptx_lines, ptx_opcodes
from gemmlab.family import plan as P
from gemmlab.family.configs import Sm90Config
from gemmlab.kernels.gemm_sm90 import compile_gemm
from gemmlab.tiers import TierError, detect_tier

# ---------------------------------------------------------------- compile-only (any machine)

C144 = Sm90Config(tile_n=144, stages=6, epi_n=16)  # the heuristic's tile for 4096 x 576 x 7168
SWAP = Sm90Config(tile_m=64, tile_n=64, stages=8, cluster=(1, 1), swap_ab=True)
SPLIT = Sm90Config(tile_m=128, tile_n=64, stages=8, cluster=(1, 1), swap_ab=True, splits=7)


@pytest.fixture(scope="module")
def ptx_144():
    return compile_gemm("sm_90a", C144)


def test_ptx_has_the_chapter_instructions(ptx_144):
    ops = ptx_opcodes(ptx_144, r"^wgmma\.mma_async", r"^setmaxnreg", r"^cp\.async\.bulk\.tensor", r"^mbarrier\.try_wait",
                      r"^stmatrix", r"^mapa")
    assert "wgmma.mma_async.sync.aligned.m64n144k16.f32.bf16.bf16" in ops  # the chosen N
    assert "setmaxnreg.dec.sync.aligned.u32" in ops and "setmaxnreg.inc.sync.aligned.u32" in ops
    assert any(o.startswith("cp.async.bulk.tensor.2d.shared::cluster.global") and ".multicast::cluster" in o
               for o in ops)
    assert any(o.startswith("cp.async.bulk.tensor.2d.global.shared::cta") for o in ops)  # the TMA store
    assert any(o.startswith("mbarrier.try_wait.parity") for o in ops)
    assert "mapa.shared::cluster.u32" in ops  # the remote empty-barrier arrive
    assert "stmatrix.sync.aligned.m8n8.x4.shared.b16" in ops  # row-major C: no .trans


def test_register_split_and_threads(ptx_144):
    dec = ptx_lines(ptx_144, r"^setmaxnreg\.dec")
    inc = ptx_lines(ptx_144, r"^setmaxnreg\.inc")
    assert dec and all(re.search(r"\b40;", line) for line in dec)
    assert inc and all(re.search(r"\b232;", line) for line in inc)
    assert ptx_lines(ptx_144, r"^\.reqntid 384")


def test_epilogue_meets_one_warpgroup_at_a_time(ptx_144):
    bars = ptx_lines(ptx_144, r"^bar\.sync")
    assert bars and all(line.rstrip(";").endswith("128") for line in bars)


def test_sizes_are_run_time_values(ptx_144):
    # One compiled kernel for every M, N, K: the tensor maps are 2-D whatever M is (an extent of 1
    # is no longer folded away, as it was with static shapes), and the k-loop bound is a register.
    assert all(".2d." in o for o in ptx_opcodes(ptx_144, r"^cp\.async\.bulk\.tensor"))


def test_swap_ab_stores_c_transposed():
    c = compile_gemm("sm_90a", SWAP, "n")
    ops = ptx_opcodes(c, r"^wgmma\.mma_async", r"^stmatrix", r"^setmaxnreg")
    assert "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16" in ops
    assert "stmatrix.sync.aligned.m8n8.x4.trans.shared.b16" in ops  # C' = C^T is M-major
    assert ptx_lines(c, r"^\.reqntid 256")  # tile_m = 64: one consumer warpgroup
    assert not ptx_lines(c, r"\.multicast::cluster")


def test_token_tiles_step_by_eight():
    # 200 tokens swapped are one 200-wide token tile (WGMMA's N steps by 8), its 64 x 200 slab stored as five 40-column
    # sub-tiles: two-matrix stmatrix (16 rows x 8 columns a warp, transposed: C' is M-major), five per sub-tile
    c = compile_gemm("sm_90a", Sm90Config(tile_m=128, tile_n=200, stages=4, cluster=(1, 1), swap_ab=True, epi_n=40))
    assert ptx_opcodes(c, r"^wgmma\.mma_async", r"^stmatrix") == [
        "wgmma.mma_async.sync.aligned.m64n200k16.f32.bf16.bf16", "stmatrix.sync.aligned.m8n8.x2.trans.shared.b16"]
    assert len(ptx_lines(c, r"^cp\.async\.bulk\.tensor\.2d\.global\.shared::cta")) == 5
    assert len(ptx_lines(c, r"^stmatrix")) == 25
    # two token tiles of 104 on a 192-row weight tile: three consumer warpgroups, the weight multicast to the pair;
    # 104 = 8 x 13, so thirteen 8-column sub-tiles
    c = compile_gemm("sm_90a", Sm90Config(tile_m=192, tile_n=104, stages=5, cluster=(1, 2), swap_ab=True, epi_n=8,
                                          epi_stages=2))
    assert "wgmma.mma_async.sync.aligned.m64n104k16.f32.bf16.bf16" in ptx_opcodes(c, r"^wgmma\.mma_async")
    assert ptx_lines(c, r"^\.reqntid 512") and ptx_lines(c, r"\.multicast::cluster")
    assert len(ptx_lines(c, r"^cp\.async\.bulk\.tensor\.2d\.global\.shared::cta")) == 13


@pytest.mark.parametrize("cluster,a_mc,b_mc", [((2, 1), False, True), ((1, 4), True, False), ((2, 2), True, True),
                                              ((4, 2), True, True)])
def test_a_cluster_multicasts_the_panels_it_shares(cluster, a_mc, b_mc):
    # CN > 1: CTAs along N' share the A' panel; CM > 1: along M' the B' panel. The A' load comes first in the PTX.
    # (Which ranks each slice goes to is checked by running: the emulator's 2x2 and 2x4 cases, the GPU tests.)
    c = compile_gemm("sm_90a", Sm90Config(tile_m=64, tile_n=64, stages=8, cluster=cluster))
    loads = ptx_lines(c, r"^cp\.async\.bulk\.tensor\.2d\.shared::cluster\.global|^cp\.async\.bulk\.tensor\.2d\.shared::cta")
    assert [".multicast::cluster" in l for l in loads[:2]] == [a_mc, b_mc]


def test_split_k_reduces_in_the_same_launch():
    c = compile_gemm("sm_90a", SPLIT)
    # One kernel: every unit publishes its partial tile, the tile's last one adds them and stores C by TMA.
    assert len(ptx_lines(c, r"^\.visible \.entry")) == 1
    assert any(o.startswith("cp.async.bulk.tensor.2d.global.shared::cta") for o in
               ptx_opcodes(c, r"^cp\.async\.bulk\.tensor"))  # the normal epilogue's TMA store
    assert ptx_lines(c, r"^st\.global\.v4\.f32")  # partial fragments, 16 bytes a store
    assert ptx_lines(c, r"ld\.global\.cg\.v4\.f32")  # read back through L2 only
    assert ptx_lines(c, r"^atom\.global\.add\.u32") and ptx_lines(c, r"^fence\.acq_rel\.gpu")


def test_whole_tiles_and_reducers_share_one_epilogue():
    # dp_tiles is a run-time value: one compiled kernel serves every grid, and the hybrid's whole tiles and the
    # split tail's reducers run the same TMA-store epilogue (no copy of it per path); split-K adds only the
    # protocol's two barriers over the consumer warpgroups (bar.sync 4, 256).
    plain, split = (compile_gemm("sm_90a", Sm90Config(tile_n=128, stages=6, cluster=(1, 2), splits=s)) for s in (1, 3))
    for pattern in (r"^cp\.async\.bulk\.tensor\.2d\.global\.shared::cta", r"^stmatrix"):
        assert len(ptx_lines(split, pattern)) == len(ptx_lines(plain, pattern)) > 0
    assert len(ptx_lines(split, r"^bar\.sync")) == len(ptx_lines(plain, r"^bar\.sync")) + 2
    assert len(ptx_lines(split, r"^bar\.sync\s+4, 256;")) == 2


def test_one_warpgroup_holds_a_128_row_tile():
    # wg_rows = 128: one consumer warpgroup issues both 64-row WGMMAs of every k-step into two accumulators, and
    # stores the two slabs one after the other through its one ring of epilogue buffers.
    one, two = (compile_gemm("sm_90a", Sm90Config(tile_n=128, stages=6, cluster=(1, 2), swap_ab=True, wg_rows=w))
                for w in (128, 64))
    assert ptx_lines(one, r"^\.reqntid 256") and ptx_lines(two, r"^\.reqntid 384")
    mma = r"^wgmma\.mma_async\.sync\.aligned\.m64n128k16"
    assert len(ptx_lines(one, mma)) == 2 * len(ptx_lines(two, mma)) == 16  # 2 x 4 a k-block, peeled and in the loop
    stores = r"^cp\.async\.bulk\.tensor\.2d\.global\.shared::cta"
    assert len(ptx_lines(one, stores)) == 2 * len(ptx_lines(two, stores)) == 8  # two slabs of 4 sub-tiles
    assert all(line.rstrip(";").endswith("128") for line in ptx_lines(one, r"^bar\.sync"))
    assert ptx_lines(one, r"^setmaxnreg\.inc\.sync\.aligned\.u32\s+232;")


def test_pingpong_warpgroups_take_turns():
    # pingpong: two consumer warpgroups of 128 rows, each its own tiles; a stage is read by one of them (the empty
    # barrier counts 4 warps per CTA of the cluster), and two more mbarriers pass the turn (128 arrivals each)
    c = compile_gemm("sm_90a", Sm90Config(tile_n=192, stages=4, cluster=(2, 1), wg_rows=128, pingpong=True))
    assert ptx_lines(c, r"^\.reqntid 384")
    assert len(ptx_lines(c, r"^wgmma\.mma_async\.sync\.aligned\.m64n192k16")) == 16
    assert len(ptx_lines(c, r"^cp\.async\.bulk\.tensor\.2d\.global\.shared::cta")) == 2 * 192 // 32
    plain = compile_gemm("sm_90a", Sm90Config(tile_n=192, stages=4, cluster=(2, 1), wg_rows=128))
    assert len(ptx_lines(c, r"^mbarrier\.init")) == len(ptx_lines(plain, r"^mbarrier\.init")) + 2 == 2 * 4 + 2
    with pytest.raises(ValueError, match="pingpong .* needs wg_rows=128 and splits 1"):
        Sm90Config(tile_n=128, pingpong=True)
    with pytest.raises(ValueError, match="pingpong"):
        Sm90Config(tile_n=128, wg_rows=128, pingpong=True, splits=2)


@pytest.mark.parametrize("cfg", [Sm90Config(), Sm90Config(tile_n=128, stages=6, cluster=(1, 2)),
                                 Sm90Config(tile_m=64, tile_n=192, stages=6, cluster=(2, 1)),
                                 Sm90Config(tile_n=176, stages=4, splits=3, cluster=(2, 1), epi_n=16),
                                 Sm90Config(tile_m=192, tile_n=192, stages=4, cluster=(2, 1), epi_stages=2)])
@pytest.mark.parametrize("b_major", ["k", "n"])
def test_variants_compile(cfg, b_major):
    c = compile_gemm("sm_90a", cfg, b_major)
    assert ptx_lines(c, rf"^wgmma\.mma_async\.sync\.aligned\.m64n{cfg.tile_n}k16")
    assert bool(ptx_lines(c, r"\.multicast::cluster")) == (cfg.cluster != (1, 1))
    assert ptx_lines(c, rf"^\.reqntid {cfg.threads}")
    # setmaxnreg: the producer gives registers back, the consumers take what the SM's 64 K then leave them
    want = 152 if cfg.consumers == 3 else 232
    assert ptx_lines(c, r"^setmaxnreg\.dec\.sync\.aligned\.u32\s+40;")
    assert ptx_lines(c, rf"^setmaxnreg\.inc\.sync\.aligned\.u32\s+{want};")
    assert 128 * 40 + 128 * cfg.consumers * want <= 65536


def test_fp16_out_from_bf16_in():
    c = compile_gemm("sm_90a", Sm90Config(tile_n=128, stages=6, out_dtype="float16", splits=2))
    assert ptx_instructions(c, r"cvt\.rn\.f16x2\.f32") and not ptx_instructions(c, r"cvt\.rn\.bf16x2\.f32")


def test_compile_gemm_bad_args():
    with pytest.raises(ValueError, match="target"):
        compile_gemm("sm_80")
    with pytest.raises(ValueError, match="needs target sm_90a"):
        compile_gemm("sm_100a")
    with pytest.raises(TypeError, match="cfg must be an Sm90Config"):
        compile_gemm("sm_90a", (128, 256))
    with pytest.raises(ValueError, match="b_major"):
        compile_gemm("sm_90a", Sm90Config(), "m")


def test_reduce_kernel_ptx():
    for dt, cvt in (("bfloat16", "cvt.rn.bf16x2.f32"), ("float16", "cvt.rn.f16x2.f32")):
        c = splitk.compile_reduce("sm_90a", dt)
        assert ptx_instructions(c, r"ld\.global\.v4\.f32") == ["ld.global.v4.f32"]
        assert ptx_instructions(c, r"cvt\.rn\.\w+\.f32") == [cvt]
        assert ptx_opcodes(c, r"^st\.global") == ["st.global.v4.u32"]


def test_reduce_model_sums_in_fp32():
    ws = torch.tensor([[[1.0, 2.0]], [[0.5, -2.0]], [[2.0 ** -9, 0.0]]])  # (splits, M, N)
    out = splitk.reduce_model(ws, torch.bfloat16)
    # 1 + 0.5 + 2^-9 rounds once (to 1.5 in BF16, 8 bits of mantissa); 2 - 2 + 0 is exactly 0.
    assert out.tolist() == [[1.5, 0.0]] and out.dtype == torch.bfloat16


def test_gemm_refuses_on_cpu():
    if detect_tier() != "cpu":
        pytest.skip("this machine has a GPU")
    a = torch.zeros(24, 40, dtype=torch.bfloat16)
    b = torch.zeros(16, 40, dtype=torch.bfloat16).t()
    with pytest.raises(TierError, match="gemmlab.gemm"):
        gemm(a, b)


# ---------------------------------------------------------------- on the GPU


def _cuda_ab(m, n, k, dtype=torch.bfloat16, k_major=True, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    a = torch.randn(m, k, device="cuda", dtype=dtype, generator=g)
    if k_major:
        b = torch.randn(n, k, device="cuda", dtype=dtype, generator=g).t()
    else:
        b = torch.randn(k, n, device="cuda", dtype=dtype, generator=g)
    return a, b


def _rel(out, a, b):
    ref = a.float() @ b.float()
    return ((out.float() - ref).norm() / ref.norm()).item()


def _poisoned(m, n, dtype=torch.bfloat16):
    return torch.full((m, n), float("nan"), device="cuda", dtype=dtype)


RANDOM_SHAPES = [(1, 8, 8), (17, 24, 8), (129, 136, 72), (300, 200, 264), (1000, 1032, 520), (777, 1608, 1112),
                 (2000, 3000, 1000), (64, 2112, 7168), (128, 576, 7168), (255, 4104, 64)]


@pytest.mark.gpu
@pytest.mark.sm90
@pytest.mark.parametrize("m,n,k", RANDOM_SHAPES)
@pytest.mark.parametrize("k_major", [True, False])
def test_gemm_matches_fp32(m, n, k, k_major):
    a, b = _cuda_ab(m, n, k, k_major=k_major, seed=m + n + k)
    out = _poisoned(m, n)
    assert gemm(a, b, out) is out
    torch.cuda.synchronize()
    assert not out.isnan().any()
    assert _rel(out, a, b) <= 1e-2


VARIANTS = [Sm90Config(), Sm90Config(tile_n=144, stages=6, cluster=(1, 2), epi_n=16),
            Sm90Config(tile_n=176, stages=4, cluster=(1, 1), epi_n=16),
            Sm90Config(tile_m=64, tile_n=128, stages=8, cluster=(2, 1)),
            Sm90Config(tile_n=256, stages=4, epi_n=64, epi_stages=2),
            Sm90Config(tile_m=64, tile_n=16, stages=8, cluster=(1, 1), swap_ab=True, epi_n=16),
            Sm90Config(tile_m=128, tile_n=112, stages=6, cluster=(2, 1), swap_ab=True, epi_n=16),
            Sm90Config(tile_m=128, tile_n=96, stages=6, cluster=(1, 2), swap_ab=True),
            Sm90Config(tile_m=128, tile_n=160, stages=5, cluster=(2, 1), swap_ab=True, splits=2),
            Sm90Config(tile_n=256, stages=4, cluster=(2, 1), splits=3),
            Sm90Config(tile_n=128, stages=6, cluster=(1, 2), splits=5),
            Sm90Config(tile_m=128, tile_n=64, stages=8, cluster=(1, 1), swap_ab=True, splits=7),
            Sm90Config(tile_m=192, tile_n=192, stages=4, cluster=(2, 1), epi_stages=2),
            Sm90Config(tile_m=192, tile_n=112, stages=5, cluster=(1, 2), epi_n=16, epi_stages=2),
            Sm90Config(tile_m=192, tile_n=128, stages=5, cluster=(1, 1), epi_stages=2, splits=3),
            Sm90Config(tile_n=128, stages=6, cluster=(1, 2), swap_ab=True, wg_rows=128),
            Sm90Config(tile_n=192, stages=5, cluster=(2, 1), wg_rows=128),
            Sm90Config(tile_n=144, stages=6, cluster=(2, 1), epi_n=16, wg_rows=128, splits=3),
            Sm90Config(tile_n=112, stages=7, cluster=(1, 1), epi_n=16, swap_ab=True, wg_rows=128, splits=2),
            Sm90Config(tile_n=192, stages=4, cluster=(2, 1), wg_rows=128, pingpong=True),
            Sm90Config(tile_n=128, stages=6, cluster=(1, 2), swap_ab=True, wg_rows=128, pingpong=True),
            # token tiles a multiple of 8 wide (two-matrix stmatrix sub-tiles), 192-row weight tiles swapped
            Sm90Config(tile_m=128, tile_n=200, stages=4, cluster=(1, 1), swap_ab=True, epi_n=40),
            Sm90Config(tile_m=128, tile_n=200, stages=4, cluster=(1, 1), swap_ab=True, epi_n=40, splits=3),
            Sm90Config(tile_m=128, tile_n=104, stages=7, cluster=(1, 2), swap_ab=True, epi_n=8),
            Sm90Config(tile_m=128, tile_n=104, stages=7, cluster=(1, 2), swap_ab=True, epi_n=8, wg_rows=128),
            Sm90Config(tile_m=64, tile_n=104, stages=8, cluster=(1, 1), swap_ab=True, epi_n=8, splits=3),
            Sm90Config(tile_m=192, tile_n=104, stages=5, cluster=(1, 2), swap_ab=True, epi_n=8, epi_stages=2),
            Sm90Config(tile_m=192, tile_n=160, stages=4, cluster=(2, 1), swap_ab=True, epi_stages=2),
            Sm90Config(tile_m=192, tile_n=168, stages=4, cluster=(1, 1), swap_ab=True, epi_n=56, epi_stages=2,
                       splits=2)]
#: Clusters of 4 and 8 CTAs: each CTA multicasts its part of the A' panel to the CTAs of its column of the cluster
#: and its part of the B' panel to those of its row.
WIDE_CLUSTER_VARIANTS = [
    Sm90Config(tile_m=128, tile_n=128, stages=6, cluster=(2, 2)),
    Sm90Config(tile_m=64, tile_n=64, stages=8, cluster=(1, 4)),
    Sm90Config(tile_m=64, tile_n=64, stages=8, cluster=(4, 1)),
    Sm90Config(tile_m=64, tile_n=64, stages=8, cluster=(4, 2)),
    Sm90Config(tile_m=128, tile_n=96, stages=6, cluster=(2, 4)),
    Sm90Config(tile_m=192, tile_n=128, stages=4, cluster=(2, 2), epi_stages=2),
    Sm90Config(tile_n=144, stages=6, cluster=(2, 2), epi_n=16, splits=4),
    Sm90Config(tile_n=128, stages=6, cluster=(2, 2), wg_rows=128),
    Sm90Config(tile_m=128, tile_n=64, stages=8, cluster=(2, 2), swap_ab=True, splits=3),
    Sm90Config(tile_m=64, tile_n=104, stages=8, cluster=(1, 4), swap_ab=True, epi_n=8),
    Sm90Config(tile_m=128, tile_n=96, stages=6, cluster=(4, 2), swap_ab=True)]
VARIANTS += WIDE_CLUSTER_VARIANTS

PINGPONG = [c for c in VARIANTS if c.pingpong] + [
    Sm90Config(tile_n=144, stages=5, cluster=(1, 1), epi_n=16, wg_rows=128, pingpong=True)]


@pytest.mark.gpu
@pytest.mark.sm90
@pytest.mark.parametrize("cfg", VARIANTS, ids=lambda c: c.name.replace(" ", "_"))
@pytest.mark.parametrize("k_major", [True, False])
def test_every_variant_on_partial_tiles(cfg, k_major):
    for m, n, k in ((1000, 1232, 520), (72, 2120, 1600)):
        a, b = _cuda_ab(m, n, k, k_major=k_major, seed=7)
        out = _poisoned(m, n)
        P.prepare(a, b, out, cfg)()
        torch.cuda.synchronize()
        assert not out.isnan().any()
        assert _rel(out, a, b) <= 1e-2


@pytest.mark.gpu
@pytest.mark.sm90
@pytest.mark.parametrize("cfg", PINGPONG, ids=lambda c: c.name.replace(" ", "_"))
@pytest.mark.parametrize("sms", [2, 6, 9])
def test_pingpong_on_a_few_sms(cfg, sms):
    # On a grid of a few SMs every CTA runs many tiles, so the two warpgroups take turns many times (an odd count of
    # tiles for some CTAs: the last turn has no partner).
    _check_on_a_few_sms(cfg, sms, seed=11)


def _check_on_a_few_sms(cfg, sms, seed):
    """``cfg``'s plan for a GPU of ``sms`` SMs (the persistent grid it launches) on two partial-tile shapes, poisoned
    outputs, against FP32."""
    for m, n, k in ((1000, 1232, 520), (300, 2120, 1600)):
        a, b = _cuda_ab(m, n, k, k_major=True, seed=seed)
        out = _poisoned(m, n)
        problem = P.problem_of(a, b, out)
        P.Plan(problem, cfg, "sm90", sms)(*P.canonical_operands(a, b, out, problem.b_major))
        torch.cuda.synchronize()
        assert not out.isnan().any()
        assert _rel(out, a, b) <= 1e-2


@pytest.mark.gpu
@pytest.mark.sm90
@pytest.mark.parametrize("cfg", WIDE_CLUSTER_VARIANTS, ids=lambda c: c.name.replace(" ", "_"))
@pytest.mark.parametrize("sms", [8, 16])
def test_wide_clusters_on_a_few_sms(cfg, sms):
    # One or two clusters of up to 8 CTAs take every tile in turn: each CTA's ring is refilled across many tiles, so
    # a stage freed in the wrong CTA of the cluster (or a slice multicast to the wrong ones) shows up as a wrong tile.
    _check_on_a_few_sms(cfg, sms, seed=13)


@pytest.mark.gpu
@pytest.mark.sm90
def test_fp16_and_default_out():
    a, b = _cuda_ab(333, 200, 264, dtype=torch.float16)
    out = gemm(a, b)
    assert out.dtype == torch.float16 and out.shape == (333, 200)
    assert _rel(out, a, b) <= 1e-2
    out_bf = _poisoned(333, 200)
    gemm(a, b, out_bf)
    assert _rel(out_bf, a, b) <= 1e-2


def test_sizes_that_share_a_config_share_its_kernel():
    from gemmlab.family.heuristic_sm90 import choose
    from gemmlab.family.problem import GemmProblem

    keys = {choose(GemmProblem(m, 1024, 1024), 132).kernel_key for m in (3500, 3600, 4000)}
    assert len(keys) == 1  # the premise of the GPU test below


@pytest.mark.gpu
@pytest.mark.sm90
def test_new_sizes_reuse_compiled_kernels():
    gemm(*_cuda_ab(3500, 1024, 1024))
    n = len(P._KERNELS)
    for m in (3600, 4000):  # other sizes, same configuration: nothing compiles
        a, b = _cuda_ab(m, 1024, 1024, seed=m)
        out = gemm(a, b)
        torch.cuda.synchronize()
        assert _rel(out, a, b) <= 1e-2
    assert len(P._KERNELS) == n


@pytest.mark.gpu
@pytest.mark.sm90
def test_size_one_dimensions_with_odd_strides():
    k, n = 64, 48
    a = torch.randn(k, 1, device="cuda", dtype=torch.bfloat16).t()  # 1 x K, strides (1, 1)
    b = torch.randn(n, k, device="cuda", dtype=torch.bfloat16).t()
    out = torch.full((n, 1), float("nan"), device="cuda", dtype=torch.bfloat16).t()  # 1 x N, strides (1, 1)
    gemm(a, b, out)
    torch.cuda.synchronize()
    assert _rel(out, a, b) <= 1e-2


@pytest.mark.gpu
@pytest.mark.sm90
def test_launches_on_torchs_current_stream():
    a, b = _cuda_ab(256, 512, 512)
    out = _poisoned(256, 512)
    gemm(a, b, out)  # compile first
    out.fill_(float("nan"))
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        torch.cuda._sleep(int(2e8))  # ~0.1 s of work queued ahead of the GEMM on s
        gemm(a, b, out)
    torch.cuda.current_stream().synchronize()  # the default stream knows nothing of s
    assert out.isnan().all().item(), "the GEMM ran before the work queued ahead of it on its stream"
    s.synchronize()
    assert _rel(out, a, b) <= 1e-2


@pytest.mark.gpu
@pytest.mark.sm90
def test_gpu_rejects_cpu_tensors_and_mixed_devices():
    a = torch.zeros(24, 40, dtype=torch.bfloat16)
    b = torch.zeros(16, 40, dtype=torch.bfloat16).t()
    with pytest.raises(ValueError, match="a must be on a cuda device"):
        gemm(a, b)
    with pytest.raises(ValueError, match="b must be on a cuda device"):
        gemm(a.cuda(), b)


@pytest.mark.gpu
@pytest.mark.sm90
def test_first_call_times_the_models_best_and_runs_the_fastest(monkeypatch):
    """With GEMMLAB_TUNE=4, gemmlab.gemm's first call of a new problem times the model's best four configurations on
    the caller's tensors (gemmlab.family.tune) and its plan runs the fastest; the output is still right (poisoned
    first)."""
    from gemmlab.family import api, tune
    from gemmlab.family.problem import problem_of

    monkeypatch.setenv("GEMMLAB_TUNE", "4")
    torch.manual_seed(3)
    m, n, k = 520, 2112, 1472  # a problem no other test makes
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, k, device="cuda", dtype=torch.bfloat16).t()
    out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    gemm(a, b, out=out)
    torch.cuda.synchronize()
    ref = a.float() @ b.float()
    assert ((out.float() - ref).norm() / ref.norm()).item() <= 1e-2
    problem = problem_of(a, b, out)
    timed = tune.choices()[(problem, a.device)]
    assert 2 <= len(timed) <= 4 and all(us > 0 for _, us in timed)
    plan = next(p for p in api.plans() if p.problem == problem)
    assert plan.config == tune.pick_fastest(timed)
    out2 = torch.full_like(out, float("nan"))
    gemm(a, b, out=out2)  # the same plan: no second timing
    torch.cuda.synchronize()
    assert torch.equal(out, out2) and tune.choices()[(problem, a.device)] is timed
