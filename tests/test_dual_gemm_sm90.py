"""Chapter 11's Hopper twin: the decoding arithmetic and the PTX (any machine), correctness on sm90."""
import pytest

torch = pytest.importorskip("torch")

from gemmlab.kernels import dual_gemm_sm90 as d  # noqa: E402
from gemmlab import nvfp4 as fp4  # noqa: E402
from gemmlab.compile import ptx_lines, ptx_opcodes  # noqa: E402
from gemmlab.family.configs import DualSm90Config  # noqa: E402
from gemmlab.hardware import SMEM_PER_BLOCK  # noqa: E402
from gemmlab.tiers import TierError, detect_tier  # noqa: E402


# ---------------------------------------------------------------- the decoding arithmetic (CPU)


def test_e2m1_parts_decode_every_code():
    for code in range(16):
        q, sign = d.e2m1_parts(code)
        assert (1 - 2 * sign) * q / 4 == fp4.E2M1_VALUES[code]
        assert sign == (code >= 8)


def test_e4m3_parts_decode_every_byte():
    ref = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    for byte in range(256):
        if byte in (0x7F, 0xFF):  # NaN: never a scale
            continue
        u, sign = d.e4m3_parts(byte)
        assert (1 - 2 * sign) * u / 512 == ref[byte].item(), hex(byte)


def test_products_are_exact_in_bf16():
    # every e2m1 value times every finite e4m3 scale survives the BF16 tile unchanged
    vals = torch.tensor(fp4.E2M1_VALUES)
    sc = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    sc = sc[torch.isfinite(sc)]
    prod = vals[:, None] * sc[None, :]
    assert torch.equal(prod.bfloat16().float(), prod)


# ---------------------------------------------------------------- configuration


def test_config_smem_and_limits():
    assert DualSm90Config().smem_bytes() == 2 * (128 * 128 + 2 * 128 * 128 + 128 * 16 + 2 * 128 * 16) \
        + (128 + 256) * 64 * 2 + 1024
    assert DualSm90Config(stages=3).smem_bytes() <= SMEM_PER_BLOCK
    with pytest.raises(ValueError, match="shared memory"):
        DualSm90Config(stages=4)
    with pytest.raises(ValueError, match="tile_n must be 64 or 128"):
        DualSm90Config(tile_n=96)
    with pytest.raises(ValueError, match="stages must be >= 1"):
        DualSm90Config(stages=0)


# ---------------------------------------------------------------- the PTX (compile-only, any machine)


@pytest.fixture(scope="module")
def ptx_128():
    return d.compile_dual("sm_90a", None, 256, 256, 512)


def test_ptx_tma_loads_of_packed_operands_and_scales(ptx_128):
    loads = ptx_lines(ptx_128, r"cp\.async\.bulk\.tensor")
    assert len(loads) == 6  # A, B1, B2, SFA, SFB1, SFB2
    assert all(".2d.shared::cta.global" in x and "complete_tx::bytes" in x for x in loads)
    assert not ptx_lines(ptx_128, r"^ld\.global")  # every operand arrives by TMA


def test_ptx_two_accumulators_share_a(ptx_128):
    # 4 slices x 4 k-steps x 2 GEMMs, BF16 in, FP32 accumulation, 64 rows per warpgroup
    mmas = ptx_lines(ptx_128, r"wgmma\.mma_async")
    assert len(mmas) == 32
    assert ptx_opcodes(ptx_128, r"wgmma\.mma_async") == ["wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16"]
    assert ptx_opcodes(ptx_128, r"wgmma\.(fence|commit|wait)") == [
        "wgmma.fence.sync.aligned;", "wgmma.commit_group.sync.aligned;", "wgmma.wait_group.sync.aligned"]


def test_ptx_roles_barriers_and_epilogue(ptx_128):
    ops = ptx_opcodes(ptx_128, r"setmaxnreg|fence\.proxy|ex2|st\.global|tcgen05")
    assert "setmaxnreg.dec.sync.aligned.u32" in ops and "setmaxnreg.inc.sync.aligned.u32" in ops
    assert "fence.proxy.async.shared::cta;" in ops  # dequantized tiles made visible to wgmma
    assert "ex2.approx.ftz.f32" in ops  # silu's exponential
    assert "st.global.b16" in ops  # FP16 output
    assert not any(o.startswith("tcgen05") for o in ops)
    named = [x for x in ptx_lines(ptx_128, r"bar\.sync") if x.split()[1].rstrip(",") == "1"]
    assert named and all("256" in x for x in named)  # the two consumer warpgroups meet at barrier 1


def test_ptx_tile_n_64():
    c = d.compile_dual("sm_90a", DualSm90Config(tile_n=64, stages=3), 200, 136, 768)
    assert ptx_opcodes(c, r"wgmma\.mma_async") == ["wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16"]


def test_compile_rejects_bad_arguments():
    with pytest.raises(ValueError, match="needs target sm_90a"):
        d.compile_dual("sm_100a", None, 256, 256, 512)
    with pytest.raises(ValueError, match="K must be a multiple of 256"):
        d.compile_dual("sm_90a", None, 256, 256, 320)
    with pytest.raises(TypeError, match="cfg must be a DualSm90Config"):
        d.compile_dual("sm_90a", (128, 2), 256, 256, 512)


# ---------------------------------------------------------------- the public function: checks first


def test_bad_input_is_rejected_before_the_tier_check():
    ops = fp4.generate(128, 128, 512)
    a, b1, b2, sfa, sfb1, sfb2 = ops.inputs()
    with pytest.raises(TypeError, match="sfa must have dtype float8_e4m3fn"):
        d.gated_dual_gemm_sm90(a, b1, b2, sfa.float(), sfb1, sfb2)
    with pytest.raises(ValueError, match="K must be a multiple of 256"):
        d.gated_dual_gemm_sm90(*(fp4.as_bytes(t)[:, :192] for t in (a, b1, b2)),  # K = 384
                               *(s[:, :24] for s in (sfa, sfb1, sfb2)))
    with pytest.raises(ValueError, match="out must have shape"):
        d.gated_dual_gemm_sm90(a, b1, b2, sfa, sfb1, sfb2, out=torch.empty(128, 64, 1, dtype=torch.float16))
    with pytest.raises(TypeError, match="out must have dtype float16"):
        d.gated_dual_gemm_sm90(a, b1, b2, sfa, sfb1, sfb2, out=torch.empty(128, 128, 1))
    with pytest.raises(TypeError, match="cfg must be a DualSm90Config"):
        d.gated_dual_gemm_sm90(a, b1, b2, sfa, sfb1, sfb2, cfg="fast")


@pytest.mark.skipif(detect_tier() != "cpu", reason="checks the CPU tier's refusal")
def test_cpu_tier_refuses_to_launch():
    ops = fp4.generate(128, 128, 256)
    with pytest.raises(TierError):
        d.gated_dual_gemm_sm90(*ops.inputs())


# ---------------------------------------------------------------- on an H100 / H200


GPU_SHAPES = list(fp4.TEST_SHAPES) + list(fp4.BENCHMARK_SHAPES)


@pytest.mark.gpu
@pytest.mark.sm90
@pytest.mark.parametrize("shape", GPU_SHAPES, ids=[f"{m}x{n}x{k}" for m, n, k in GPU_SHAPES])
@pytest.mark.parametrize("tile_n", [128, 64])
def test_matches_reference_with_poisoned_output(shape, tile_n):
    if tile_n == 64 and shape in fp4.BENCHMARK_SHAPES[1:]:
        pytest.skip("tile_n=64 is checked on the small shapes and the first benchmark shape")
    ops = fp4.generate(*shape, seed=11, device="cuda")
    out = ops.c  # NaN everywhere: an element the kernel does not write fails the check
    assert torch.isnan(out.float()).all()
    d.gated_dual_gemm_sm90(*ops.inputs(), out=out, cfg=DualSm90Config(tile_n=tile_n))
    torch.cuda.synchronize()
    ref = fp4.reference(*ops.inputs())
    res = fp4.check_close(out, ref)
    assert res.ok, f"{shape}: {res}"
