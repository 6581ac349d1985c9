"""Chapter 10: the persistent 2-CTA GEMM for sm_100a (compile-only here; sm100 tests launch it)."""
import pytest
import torch

import gemmlab
from gemmlab.kernels import gemm_sm100 as g
from gemmlab import hardware, tiers
from gemmlab import sm100_model as sm
from gemmlab.compile import ptx_lines, ptx_opcodes
from gemmlab.family import api, configs, heuristic_sm100, plan
from gemmlab.family.configs import Sm100Config
from gemmlab.family.heuristic_sm100 import choose, heuristic_configs, padded_work
from gemmlab.family.problem import GemmProblem, problem_of
from gemmlab.measure.gemm_family import CHAPTER07_SHAPES
from gemmlab.tiers import TierError, detect_tier

SHAPES = list(CHAPTER07_SHAPES) + [(512, 512, 512), (300, 200, 136)]

# Every configuration the heuristic can return for the course's shapes, plus the other
# dtype and B layout at the default tile (compile cost: a few seconds each).
CONFIGS = heuristic_configs(SHAPES) + [
    choose(GemmProblem(4096, 4096, 4096, "float16", "float16", "n")),
    choose(GemmProblem(512, 512, 512, "float16", "float16", "k")),
]


def _ids(cfg):
    return f"bn{cfg.block_n}-s{cfg.ab_stages}-{cfg.dtype}-{cfg.b_major}"


@pytest.fixture(scope="module")
def compiled():
    cache = {}

    def get(cfg, shape=(1000, 1000, 1000)):
        key = (cfg, shape)
        if key not in cache:
            cache[key] = g.compile_gemm_sm100("sm_100a", cfg, *shape)
        return cache[key]

    return get


# ---------------------------------------------------------------- heuristic and budgets


def test_heuristic_choices():
    assert {c.block_n for c in heuristic_configs(CHAPTER07_SHAPES)} == {256}
    assert choose(GemmProblem(512, 512, 512)).block_n == 128  # 4 tiles of 256 vs 8 of 128: one wave either way
    assert choose(GemmProblem(4096, 7168, 2048)).block_n == 256  # 7 vs 13 waves: only 7% less padded work
    assert padded_work(4096, 7168, 256) == 7 * 256 and padded_work(4096, 7168, 128) == 13 * 128


def test_heuristic_keeps_dtype_and_b_layout():
    cfg = choose(GemmProblem(4096, 4096, 4096, "float16", "float16", "n"))
    assert (cfg.dtype, cfg.b_major, cfg.block_n) == ("float16", "n", 256)
    assert choose(GemmProblem(4096, 4096, 4096)) == Sm100Config(block_n=256, ab_stages=6)
    assert sm.choose_config(600, 1000, 448) == choose(GemmProblem(600, 1000, 448))  # the CPU model's wrapper


@pytest.mark.parametrize("shape", SHAPES)
def test_configs_fit_smem_and_tmem(shape):
    cfg = choose(GemmProblem(*shape))
    assert cfg.smem_bytes <= hardware.SMEM_PER_BLOCK == 227 * 1024
    assert cfg.tmem_columns <= configs.TMEM_COLUMNS == g.TMEM_COLUMNS == 512
    deeper = Sm100Config(block_n=cfg.block_n, ab_stages=cfg.ab_stages + 1)
    assert deeper.smem_bytes > hardware.SMEM_PER_BLOCK  # the ring is as deep as it can be
    assert cfg.ab_stages == configs.max_ab_stages(cfg.block_n)
    assert cfg.check_fits() is cfg
    with pytest.raises(ValueError, match="shared memory"):
        deeper.check_fits()


def test_check_fits_rejects_overflows(monkeypatch):
    with pytest.raises(ValueError, match="shared memory"):
        Sm100Config(block_n=256, ab_stages=7).check_fits()
    with pytest.raises(ValueError, match="block_n"):
        Sm100Config(block_n=192)  # not a tile width of the kernel: refused when the config is made
    with pytest.raises(ValueError, match="ab_stages"):
        Sm100Config(block_n=256, ab_stages=1).check_fits()  # a ring of one stage cannot overlap anything
    monkeypatch.setattr(configs, "TMEM_COLUMNS", 256)  # an SM with half the TMEM: 2 x 256 columns overflow
    with pytest.raises(ValueError, match="TMEM"):
        Sm100Config(block_n=256, ab_stages=6).check_fits()
    Sm100Config(block_n=128, ab_stages=8).check_fits()  # 2 x 128 columns still fit


def test_stage_bytes():
    cfg = Sm100Config(block_n=256, ab_stages=6)
    assert (cfg.a_stage_bytes, cfg.b_stage_bytes, cfg.tx_bytes) == (16384, 16384, 65536)
    assert cfg.smem_bytes == 1024 + 6 * 32768 + 2 * 8192 == 214016
    assert cfg.tmem_columns == 512


# ---------------------------------------------------------------- compiled for sm_100a


@pytest.mark.parametrize("cfg", CONFIGS, ids=_ids)
def test_ptx_has_the_kernels_instructions(compiled, cfg):
    c = compiled(cfg)
    ops = ptx_opcodes(c, r"^tcgen05\.", r"^cp\.async\.bulk")
    assert any(o.startswith("tcgen05.mma.cta_group::2.kind::f16") for o in ops), ops
    assert any(o.startswith("tcgen05.alloc.cta_group::2") for o in ops)
    assert any(o.startswith("tcgen05.dealloc.cta_group::2") for o in ops)
    commits = [o for o in ops if o.startswith("tcgen05.commit")]
    assert commits and all("cta_group::2" in o and "multicast" in o for o in commits)
    assert any(o.startswith("tcgen05.ld.sync.aligned.32x32b") for o in ops)
    loads = [o for o in ops if o.startswith("cp.async.bulk.tensor") and ".shared::cluster.global" in o]
    stores = [o for o in ops if o.startswith("cp.async.bulk.tensor") and ".global.shared::cta" in o]
    assert loads and all("cta_group::2" in o for o in loads)  # the 2-CTA TMA: bytes counted at the leader
    assert stores


@pytest.mark.parametrize("cfg", CONFIGS, ids=_ids)
def test_smem_and_tmem_of_the_compiled_kernel(compiled, cfg):
    c = compiled(cfg)
    assert g.launch_smem_bytes(c) == cfg.smem_bytes <= 232448
    assert g.tmem_alloc_columns(c) == cfg.tmem_columns <= 512


@pytest.mark.parametrize("cfg", CONFIGS, ids=_ids)
def test_tvm_ffi_compile(cfg):
    """The call path the plans use (gemmlab.family.plan): TVM-FFI, torch tensors in, no stream argument."""
    pytest.importorskip("tvm_ffi")
    c = g.compile_gemm_sm100("sm_100a", cfg, 1000, 1000, 1000, tvm_ffi=True)
    assert hasattr(c, "__tvm_ffi_object__")
    assert ptx_lines(c, r"^tcgen05\.mma\.cta_group::2")
    assert g.launch_smem_bytes(c) == cfg.smem_bytes


def test_mma_count_and_multicast_mask(compiled):
    cfg = choose(GemmProblem(4096, 4096, 4096))
    c = compiled(cfg)
    assert len(ptx_lines(c, r"^tcgen05\.mma")) == g.BLOCK_K // g.MMA_K  # one k-block per loop trip
    commits = ptx_lines(c, r"^tcgen05\.commit")
    assert len(commits) == 2  # ab_empty[s] per k-block, tmem_full[a] per tile
    ptx = c.__ptx__
    for line in commits:
        mask_reg = line.split(",")[-1].strip().rstrip(";")
        assert f"mov.b16 \t{mask_reg}, 3;" in ptx  # both CTAs of the pair


def test_roles_and_barrier_counts(compiled):
    cfg = choose(GemmProblem(4096, 4096, 4096))
    ptx = compiled(cfg).__ptx__
    assert ".reqntid 192, 1, 1" in ptx
    inits = ptx_lines(ptx, r"^mbarrier\.init")
    assert len(inits) == 2 * cfg.ab_stages + 2 * g.ACC_STAGES
    assert "mov.b32 \t%r" in ptx and "mbarrier.arrive.expect_tx" in ptx
    assert str(cfg.tx_bytes) in ptx  # the leader expects both CTAs' bytes
    assert "mapa.shared::cluster" in ptx  # epilogue warps arrive on the leader's tmem_empty
    assert len(ptx_lines(ptx, r"^barrier\.cluster\.arrive")) == 2  # after init, before dealloc


def test_compile_rejects_other_targets():
    with pytest.raises(ValueError, match="sm_100a"):
        g.compile_gemm_sm100(target="sm_90a")


# ---------------------------------------------------------------- argument checks (any tier)


def _cpu(*shape, dtype=torch.bfloat16):
    return torch.zeros(*shape, dtype=dtype)


def test_sm100_path_uses_the_public_contract():
    """One contract for every GEMM of the course: ``gemmlab.family.problem.problem_of`` (torch's meaning)."""
    assert api.problem_of is problem_of and plan.problem_of is problem_of  # gemmlab.gemm and prepare
    # b is K x N: row-major (N-contiguous) or the w.t() view of a row-major N x K weight.
    assert problem_of(_cpu(64, 32), _cpu(32, 48)) == GemmProblem(64, 48, 32, b_major="n")
    assert problem_of(_cpu(64, 32), _cpu(48, 32).t()) == GemmProblem(64, 48, 32, b_major="k")
    # A square B is read as K x N, never silently transposed.
    assert problem_of(_cpu(64, 32), _cpu(32, 32)) == GemmProblem(64, 32, 32, b_major="n")
    assert problem_of(_cpu(64, 32, dtype=torch.float16), _cpu(32, 48, dtype=torch.float16)) == \
        GemmProblem(64, 48, 32, "float16", "float16", "n")


def test_sm100_plan_runs_the_heuristics_config(monkeypatch):
    """problem -> heuristic_sm100 -> plan: what gemmlab.gemm does on a B200, compiled here without one."""
    pytest.importorskip("tvm_ffi")
    monkeypatch.setattr(tiers, "detect_tier", lambda: "sm100")
    monkeypatch.setattr(hardware, "sm_count", lambda device=None: 8)  # 4 clusters: 512 x 512 prefers 256
    problem = problem_of(_cpu(512, 512), _cpu(512, 512).t())
    p = plan.make_plan(problem)
    assert p.arch == "sm100" and p.num_sms == 8
    assert p.config == heuristic_sm100.choose(problem, 8) == Sm100Config(block_n=256, ab_stages=6, num_sms=8)
    assert heuristic_sm100.choose(problem).block_n == 128  # on 148 SMs the heuristic would differ
    assert callable(p.launch)
    with pytest.raises(TypeError, match="Sm100Config"):
        plan.make_plan(problem, config=configs.Sm90Config())


@pytest.mark.parametrize("a,b,exc,msg", [
    (_cpu(64, 32, dtype=torch.float32), _cpu(32, 48), TypeError, "a must have dtype"),
    (_cpu(64, 32), _cpu(32, 48, dtype=torch.float16), TypeError, "same dtype"),
    (_cpu(64, 32), _cpu(48, 40), ValueError, "K x N"),
    (_cpu(64, 36), _cpu(36, 48), ValueError, "K must be a multiple of 8"),
    (_cpu(64, 32), _cpu(32, 44), ValueError, "N must be a multiple of 8"),
])
def test_gemm_rejects_before_the_device_check(a, b, exc, msg):
    with pytest.raises(exc, match=msg):
        gemmlab.gemm(a, b)


@pytest.mark.skipif(detect_tier() != "cpu", reason="this machine has a GPU")
def test_gemm_needs_a_gpu():
    """The order of the checks: the arguments (any machine), then the tier, then the devices."""
    with pytest.raises(TierError, match="gemmlab.gemm needs tier sm90 or sm100"):
        gemmlab.gemm(_cpu(64, 32), _cpu(32, 48))
    with pytest.raises(TypeError, match="a must have dtype"):  # argument checks come first
        gemmlab.gemm(_cpu(64, 32, dtype=torch.float32), _cpu(32, 48))
    with pytest.raises(TierError, match="gemmlab.gemm needs tier sm90 or sm100"):
        plan.make_plan(GemmProblem(64, 48, 32, b_major="n"))


@pytest.mark.skipif(detect_tier() == "cpu", reason="needs a GPU machine")
def test_gemm_needs_cuda_tensors():
    with pytest.raises(ValueError, match="a must be on a cuda device; got cpu"):
        gemmlab.gemm(_cpu(64, 32), _cpu(32, 48))


# ---------------------------------------------------------------- on a B200


def _reference(a, b_nk):
    return (a.float() @ b_nk.float().T)


GPU_SHAPES = [(256, 256, 64), (300, 200, 136), (1000, 1064, 520), (4096, 4096, 4096), (2048, 576, 7168),
              (513, 2056, 1032), (128, 8, 8)]


@pytest.mark.gpu
@pytest.mark.sm100
@pytest.mark.parametrize("shape", GPU_SHAPES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gemm_sm100_matches_torch(shape, dtype):
    m, n, k = shape
    torch.manual_seed(m + n + k)
    a = torch.randn(m, k, device="cuda", dtype=dtype)
    b = torch.randn(n, k, device="cuda", dtype=dtype)
    out = torch.full((m, n), float("nan"), device="cuda", dtype=dtype)  # poisoned
    got = gemmlab.gemm(a, b.t(), out=out)  # b is an N x K weight: pass its K x N view
    torch.cuda.synchronize()
    assert got.data_ptr() == out.data_ptr() and not torch.isnan(got).any()
    ref = _reference(a, b)
    err = (got.float() - ref).abs().max().item()
    assert err <= 2e-2 * ref.abs().max().item() + 1e-2, err


@pytest.mark.gpu
@pytest.mark.sm100
def test_gemm_sm100_k_by_n_b():
    torch.manual_seed(0)
    a = torch.randn(777, 264, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(264, 520, device="cuda", dtype=torch.bfloat16)  # K x N, N contiguous
    got = gemmlab.gemm(a, b)
    ref = a.float() @ b.float()
    assert (got.float() - ref).abs().max().item() <= 2e-2 * ref.abs().max().item() + 1e-2


@pytest.mark.gpu
@pytest.mark.sm100
def test_gemm_sm100_integer_inputs_exact():
    a, b = sm.integer_operands(600, 1000, 448)
    ta = torch.from_numpy(a).to("cuda", torch.bfloat16)
    tb = torch.from_numpy(b).to("cuda", torch.bfloat16)
    got = gemmlab.gemm(ta, tb.t()).float().cpu()  # the model's b is N x K
    model = torch.from_numpy(sm.run_model(a, b).c)  # exact FP32 sums; the kernel rounds once to bf16
    assert torch.equal(got, model.bfloat16().float())


@pytest.mark.gpu
@pytest.mark.sm100
def test_prepared_launch_runs_chapter_10s_kernel():
    torch.manual_seed(1)
    a = torch.randn(1000, 520, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(1064, 520, device="cuda", dtype=torch.bfloat16)
    out = torch.full((1000, 1064), float("nan"), device="cuda", dtype=torch.bfloat16)
    run = plan.prepare(a, b.t(), out)
    assert run.plan.arch == "sm100"
    assert run.plan.config == choose(problem_of(a, b.t(), out), hardware.sm_count(a.device))
    run()
    torch.cuda.synchronize()
    ref = _reference(a, b)
    assert (out.float() - ref).abs().max().item() <= 2e-2 * ref.abs().max().item() + 1e-2
