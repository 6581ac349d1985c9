"""Chapter 10: the persistent 2-CTA GEMM for sm_100a (compile-only here; sm100 tests launch it)."""
import pytest
import torch

from gemmlab import gemm_sm100 as g
from gemmlab import sm100_model as sm
from gemmlab.compile import ptx_lines, ptx_opcodes
from gemmlab.tiers import TierError, detect_tier

SHAPES = sm.PART3_SHAPES + [(512, 512, 512), (300, 200, 136)]

# Every configuration the heuristic can return for the course's shapes, plus the other
# dtype and B layout at the default tile (compile cost: a few seconds each).
CONFIGS = g.heuristic_configs(SHAPES) + [
    g.choose_config(4096, 4096, 4096, dtype="float16", b_major="n"),
    g.choose_config(512, 512, 512, dtype="float16", b_major="k"),
]


def _ids(cfg):
    return f"bn{cfg.block_n}-s{cfg.ab_stages}-{cfg.dtype}-{cfg.b_major}"


@pytest.fixture(scope="module")
def compiled():
    cache = {}

    def get(cfg, shape=(1000, 1000, 1000)):
        key = (cfg, shape)
        if key not in cache:
            cache[key] = g.compile_gemm_sm100(cfg, *shape)
        return cache[key]

    return get


# ---------------------------------------------------------------- heuristic and budgets


def test_heuristic_choices():
    assert {c.block_n for c in g.heuristic_configs(sm.PART3_SHAPES)} == {256}
    assert g.choose_config(512, 512, 512).block_n == 128  # 4 tiles of 256 vs 8 of 128: one wave either way
    assert g.choose_config(4096, 7168, 2048).block_n == 256  # 7 vs 13 waves: only 7% less padded work
    assert g.padded_work(4096, 7168, 256) == 7 * 256 and g.padded_work(4096, 7168, 128) == 13 * 128


@pytest.mark.parametrize("shape", SHAPES)
def test_configs_fit_smem_and_tmem(shape):
    cfg = g.choose_config(*shape)
    assert cfg.smem_bytes <= g.SMEM_CAPACITY == 227 * 1024
    assert cfg.tmem_columns <= g.TMEM_COLUMNS == 512
    deeper = g.Sm100Config(block_n=cfg.block_n, ab_stages=cfg.ab_stages + 1)
    assert deeper.smem_bytes > g.SMEM_CAPACITY  # the ring is as deep as it can be
    g.check_config(cfg)


def test_check_config_rejects_overflows():
    with pytest.raises(ValueError, match="shared memory"):
        g.check_config(g.Sm100Config(block_n=256, ab_stages=7))
    with pytest.raises(ValueError, match="block_n"):
        g.check_config(g.Sm100Config(block_n=192))


def test_stage_bytes():
    cfg = g.Sm100Config(block_n=256, ab_stages=6)
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


def test_mma_count_and_multicast_mask(compiled):
    cfg = g.choose_config(4096, 4096, 4096)
    c = compiled(cfg)
    assert len(ptx_lines(c, r"^tcgen05\.mma")) == g.BLOCK_K // g.MMA_K  # one k-block per loop trip
    commits = ptx_lines(c, r"^tcgen05\.commit")
    assert len(commits) == 2  # ab_empty[s] per k-block, tmem_full[a] per tile
    ptx = c.__ptx__
    for line in commits:
        mask_reg = line.split(",")[-1].strip().rstrip(";")
        assert f"mov.b16 \t{mask_reg}, 3;" in ptx  # both CTAs of the pair


def test_roles_and_barrier_counts(compiled):
    cfg = g.choose_config(4096, 4096, 4096)
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


def test_gemm_sm100_shares_the_public_contract():
    """One contract for every GEMM of the course: chapter 07's ``check_gemm_args`` (torch's meaning)."""
    from gemmlab.gemm_api import check_gemm_args

    assert g.check_gemm_args is check_gemm_args
    # b is K x N: row-major (N-contiguous) or the w.t() view of a row-major N x K weight.
    assert g.check_gemm_args(_cpu(64, 32), _cpu(32, 48)) == (64, 48, 32, False)
    assert g.check_gemm_args(_cpu(64, 32), _cpu(48, 32).t()) == (64, 48, 32, True)
    # A square B is read as K x N, never silently transposed.
    assert g.check_gemm_args(_cpu(64, 32), _cpu(32, 32)) == (64, 32, 32, False)


@pytest.mark.parametrize("a,b,exc,msg", [
    (_cpu(64, 32, dtype=torch.float32), _cpu(32, 48), TypeError, "a must have dtype"),
    (_cpu(64, 32), _cpu(32, 48, dtype=torch.float16), TypeError, "same dtype"),
    (_cpu(64, 32), _cpu(48, 40), ValueError, "K x N"),
    (_cpu(64, 36), _cpu(36, 48), ValueError, "multiple of 8"),
    (_cpu(64, 32), _cpu(32, 44), ValueError, "multiple of 8"),
])
def test_gemm_sm100_rejects_before_the_tier_check(a, b, exc, msg):
    with pytest.raises(exc, match=msg):
        g.gemm_sm100(a, b)


@pytest.mark.skipif(detect_tier() == "sm100", reason="launches on this machine")
def test_gemm_sm100_needs_blackwell():
    with pytest.raises(TierError, match="sm100"):
        g.gemm_sm100(_cpu(64, 32), _cpu(32, 48))
    with pytest.raises(TypeError):  # argument checks come first
        g.gemm_sm100(_cpu(64, 32, dtype=torch.float32), _cpu(32, 48))


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
    got = g.gemm_sm100(a, b.t(), out=out)  # b is an N x K weight: pass its K x N view
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
    got = g.gemm_sm100(a, b)
    ref = a.float() @ b.float()
    assert (got.float() - ref).abs().max().item() <= 2e-2 * ref.abs().max().item() + 1e-2


@pytest.mark.gpu
@pytest.mark.sm100
def test_gemm_sm100_integer_inputs_exact():
    a, b = sm.integer_operands(600, 1000, 448)
    ta = torch.from_numpy(a).to("cuda", torch.bfloat16)
    tb = torch.from_numpy(b).to("cuda", torch.bfloat16)
    got = g.gemm_sm100(ta, tb.t()).float().cpu()  # the model's b is N x K
    model = torch.from_numpy(sm.run_model(a, b).c)  # exact FP32 sums; the kernel rounds once to bf16
    assert torch.equal(got, model.bfloat16().float())
