"""Tests for chapter 07: the persistent Hopper GEMM (compile-only on CPU, launched on sm90)."""
import re

import pytest
import torch

from gemmlab import compile as gc
from gemmlab.compile import ptx_lines, ptx_opcodes
from gemmlab.gemm_api import check_gemm_args, gemm
from gemmlab.gemm_sm90 import SMEM_LIMIT, GemmConfig, compile_gemm
from gemmlab.tiers import TierError, detect_tier

# ---------------------------------------------------------------- compile-only (any machine)


@pytest.fixture(scope="module")
def ptx_576():
    return compile_gemm("sm_90a", 4096, 576, 7168)  # the heuristic's 128 x 144 tile, cluster 2 x 1


def test_ptx_has_the_chapter_instructions(ptx_576):
    ops = ptx_opcodes(ptx_576, r"^wgmma\.mma_async", r"^setmaxnreg", r"^cp\.async\.bulk\.tensor", r"^mbarrier\.try_wait",
                      r"^stmatrix", r"^mapa")
    assert "wgmma.mma_async.sync.aligned.m64n144k16.f32.bf16.bf16" in ops  # the chosen N
    assert "setmaxnreg.dec.sync.aligned.u32" in ops and "setmaxnreg.inc.sync.aligned.u32" in ops
    assert any(o.startswith("cp.async.bulk.tensor.2d.shared::cluster.global") and ".multicast::cluster" in o
               for o in ops)
    assert any(o.startswith("cp.async.bulk.tensor.2d.global.shared::cta") for o in ops)  # the TMA store
    assert any(o.startswith("mbarrier.try_wait.parity") for o in ops)
    assert "mapa.shared::cluster.u32" in ops  # the remote empty-barrier arrive
    assert any(o.startswith("stmatrix") for o in ops)


def test_epilogue_per_warpgroup(ptx_576):
    # Each consumer warpgroup meets only its own 128 threads; the 256-thread variant still compiles.
    bars = ptx_lines(ptx_576, r"^bar\.sync")
    assert bars and all(l.rstrip(";").endswith("128") for l in bars)
    old = GemmConfig(tile_n=256, stages=4, epi_per_wg=False)
    assert all(l.rstrip(";").endswith("256") for l in ptx_lines(compile_gemm("sm_90a", 300, 512, 128, old), r"^bar\.sync"))


def test_register_split(ptx_576):
    dec = ptx_lines(ptx_576, r"^setmaxnreg\.dec")
    inc = ptx_lines(ptx_576, r"^setmaxnreg\.inc")
    assert dec and all(re.search(r"\b40;", l) for l in dec)
    assert inc and all(re.search(r"\b232;", l) for l in inc)
    assert ptx_lines(ptx_576, r"^\.reqntid 384")


@pytest.mark.parametrize("tile_n,cluster,b_k_major", [(256, (2, 1), True), (128, (1, 2), False), (192, (1, 1), True)])
def test_variants_compile(tile_n, cluster, b_k_major):
    from gemmlab.heuristic import epi_shape_for, max_stages

    en, es = epi_shape_for(tile_n)
    cfg = GemmConfig(tile_n=tile_n, stages=max_stages(tile_n), cluster=cluster, epi_n=en, epi_stages=es)
    c = compile_gemm("sm_90a", 300, 200, 264, cfg, b_k_major=b_k_major, num_clusters=3)
    assert ptx_lines(c, rf"^wgmma\.mma_async\.sync\.aligned\.m64n{tile_n}k16")
    mcast = ptx_lines(c, r"\.multicast::cluster")
    assert bool(mcast) == (cluster != (1, 1))
    assert cfg.smem_bytes() <= SMEM_LIMIT


def test_config_rules():
    with pytest.raises(ValueError, match="tile_n"):
        GemmConfig(tile_n=100)
    with pytest.raises(ValueError, match="cluster"):
        GemmConfig(cluster=(2, 2))
    with pytest.raises(ValueError, match="shared memory"):
        GemmConfig(tile_n=256, stages=5)
    with pytest.raises(ValueError, match="epi_n"):
        GemmConfig(tile_n=144, epi_n=32)
    with pytest.raises(ValueError, match="epi_per_wg"):
        GemmConfig(tile_n=144, stages=4, epi_n=48)  # 48 columns: a 64-row half is not contiguous
    assert GemmConfig(tile_n=144, stages=4, epi_n=48, epi_stages=3, epi_per_wg=False).epi_ring_aligned
    c = GemmConfig(tile_n=256, stages=4)
    assert c.stage_bytes() == (128 + 256) * 64 * 2
    assert c.smem_bytes() <= SMEM_LIMIT and c.epi_ring_aligned
    assert not GemmConfig(tile_n=144, stages=4, epi_n=16, epi_stages=4).epi_ring_aligned
    assert c.tiles(4096, 2112) == (32, 9) and c.cluster_tiles(4096, 2112) == (16, 9)
    assert c.cluster_tiles(129, 8) == (1, 1)


def test_compile_gemm_bad_args():
    with pytest.raises(ValueError, match="target"):
        compile_gemm("sm_80")
    with pytest.raises(ValueError, match="m must be"):
        compile_gemm("sm_90a", 0, 8, 8)


# ---------------------------------------------------------------- argument checks (any machine)


def _ab(m, n, k, dtype=torch.bfloat16, k_major=True):
    a = torch.zeros(m, k, dtype=dtype)
    b = torch.zeros(n, k, dtype=dtype).t() if k_major else torch.zeros(k, n, dtype=dtype)
    return a, b


def test_check_accepts_both_b_layouts():
    a, b = _ab(24, 16, 40)
    assert check_gemm_args(a, b) == (24, 16, 40, True)
    a, b = _ab(24, 16, 40, k_major=False)
    assert check_gemm_args(a, b) == (24, 16, 40, False)


def test_check_rejects_bad_input():
    a, b = _ab(24, 16, 40)
    with pytest.raises(TypeError, match="a must have dtype"):
        check_gemm_args(a.float(), b)
    with pytest.raises(TypeError, match="same dtype"):
        check_gemm_args(a, b.half())
    with pytest.raises(ValueError, match="b must be K x N"):
        check_gemm_args(a, b.t())  # N x K passed without .t()
    with pytest.raises(ValueError, match="multiple of 8"):
        check_gemm_args(*_ab(24, 16, 36))  # K = 36: 72 bytes per row
    with pytest.raises(ValueError, match="N must be a multiple of 8"):
        check_gemm_args(*_ab(24, 12, 40, k_major=False))
    with pytest.raises(ValueError, match="output's contiguous dimension"):
        check_gemm_args(*_ab(24, 12, 40))
    with pytest.raises(ValueError, match="a must be K-contiguous"):
        check_gemm_args(torch.zeros(40, 24, dtype=torch.bfloat16).t(), b)
    with pytest.raises(ValueError, match="b must be N-contiguous"):
        check_gemm_args(a, torch.zeros(40, 32, dtype=torch.bfloat16)[:, ::2])
    with pytest.raises(ValueError, match="out must have shape"):
        check_gemm_args(a, b, torch.zeros(16, 24, dtype=torch.bfloat16))
    with pytest.raises(TypeError, match="out must have dtype"):
        check_gemm_args(a, b, torch.zeros(24, 16))


def test_gemm_refuses_on_cpu():
    if detect_tier() != "cpu":
        pytest.skip("this machine has a GPU")
    with pytest.raises(TierError, match="gemmlab.gemm"):
        gemm(*_ab(24, 16, 40))


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


RANDOM_SHAPES = [(1, 8, 8), (17, 24, 8), (129, 136, 72), (300, 200, 264), (1000, 1032, 520), (777, 1608, 1112),
                 (2000, 3000, 1000), (4096, 576, 7168), (255, 4104, 64)]


@pytest.mark.gpu
@pytest.mark.sm90
@pytest.mark.parametrize("m,n,k", RANDOM_SHAPES)
@pytest.mark.parametrize("k_major", [True, False])
def test_gemm_matches_fp32(m, n, k, k_major):
    a, b = _cuda_ab(m, n, k, k_major=k_major, seed=m + n + k)
    out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)  # poisoned
    assert gemm(a, b, out) is out
    torch.cuda.synchronize()
    assert not out.isnan().any()
    assert _rel(out, a, b) <= 1e-2


@pytest.mark.gpu
@pytest.mark.sm90
@pytest.mark.parametrize("tile_n,cluster,epi", [(256, (2, 1), {}), (256, (1, 2), {}), (144, (2, 1), {}),
                                                (176, (1, 2), {}), (128, (1, 1), {}), (192, (2, 1), {}),
                                                (256, (2, 1), {"epi_per_wg": False}),
                                                (256, (2, 1), {"epi_n": 64, "epi_stages": 2}),
                                                (144, (2, 1), {"epi_n": 48, "epi_stages": 3, "epi_per_wg": False})])
def test_every_config_on_partial_tiles(tile_n, cluster, epi):
    from gemmlab.gemm_api import sm90_launch
    from gemmlab.heuristic import epi_shape_for, max_stages

    en, es = epi_shape_for(tile_n)
    kw = {"epi_n": en, "epi_stages": es, **epi}
    stages = max_stages(tile_n) - (1 if kw["epi_n"] * kw["epi_stages"] > en * es else 0)
    cfg = GemmConfig(tile_n=tile_n, stages=stages, cluster=cluster, **kw)
    a, b = _cuda_ab(1000, 1232, 520)
    out = torch.full((1000, 1232), float("nan"), device="cuda", dtype=torch.bfloat16)
    sm90_launch(a, b, out, cfg)()
    torch.cuda.synchronize()
    assert _rel(out, a, b) <= 1e-2


@pytest.mark.gpu
@pytest.mark.sm90
def test_fp16_and_default_out():
    a, b = _cuda_ab(333, 200, 264, dtype=torch.float16)
    out = gemm(a, b)
    assert out.dtype == torch.float16 and out.shape == (333, 200)
    assert _rel(out, a, b) <= 1e-2
    out_bf = torch.empty(333, 200, device="cuda", dtype=torch.bfloat16)
    gemm(a, b, out_bf)
    assert _rel(out_bf, a, b) <= 1e-2


@pytest.mark.gpu
@pytest.mark.sm90
def test_second_call_does_not_compile():
    a, b = _cuda_ab(520, 264, 136)
    gemm(a, b)
    n = len(gc._CACHE)
    a2, b2 = _cuda_ab(520, 264, 136, seed=1)
    out = gemm(a2, b2)
    assert len(gc._CACHE) == n
    assert _rel(out, a2, b2) <= 1e-2


@pytest.mark.gpu
@pytest.mark.sm90
def test_gpu_rejects_cpu_tensors():
    with pytest.raises(ValueError, match="cuda"):
        gemm(*_ab(24, 16, 40))


def test_static_extent_one_folds_to_a_1d_tensor_map():
    # Why gemm() pads M = 1 to two rows: with M = 1 the DSL drops the unit mode and
    # builds 1-D TMA copies for A and C; from M = 2 on they are 2-D boxes.
    one = ptx_opcodes(compile_gemm("sm_90a", 1, 8, 8, num_clusters=1), r"^cp\.async\.bulk\.tensor")
    two = ptx_opcodes(compile_gemm("sm_90a", 2, 8, 8, num_clusters=1), r"^cp\.async\.bulk\.tensor")
    assert any(".1d." in o for o in one)
    assert all(".2d." in o for o in two)
