"""Chapter 11's fast Hopper twin: configuration, fragment layout and PTX (any machine), correctness (sm90)."""
import pytest

torch = pytest.importorskip("torch")

from gemmlab.kernels import dual_gemm_sm90_pipelined as p  # noqa: E402
from gemmlab import nvfp4 as fp4  # noqa: E402
from gemmlab.compile import ptx_lines, ptx_opcodes  # noqa: E402
from gemmlab.family.configs import PipelinedConfig  # noqa: E402
from gemmlab.family.heuristic_gated import choose_tile_n  # noqa: E402
from gemmlab.hardware import SMEM_PER_BLOCK  # noqa: E402
from gemmlab.tiers import TierError, detect_tier  # noqa: E402


def test_config_limits_and_smem():
    cfg = PipelinedConfig()
    assert (cfg.tile_n, cfg.stages, cfg.split) == (64, 4, True)
    assert cfg.stage_bytes() == (128 + 128) * (128 + 16)
    assert cfg.smem_bytes() == 4 * 256 * 144 + 4 * 128 * 128 + 1024 + 256 <= SMEM_PER_BLOCK
    with pytest.raises(ValueError, match="shared memory"):
        PipelinedConfig(stages=5)
    with pytest.raises(ValueError, match="tile_n must be one of"):
        PipelinedConfig(tile_n=128)
    with pytest.raises(ValueError, match="stages must be >= 3"):
        PipelinedConfig(stages=2)  # the converter loads two k-blocks ahead of the one it converts
    assert PipelinedConfig(stages=2, split=False).stages == 2
    with pytest.raises(ValueError, match="probe must be one of"):
        PipelinedConfig(probe="fast")


@pytest.mark.parametrize("m, n, want", [
    (256, 4096, 64),   # 2 x 64 = 128 tiles: 97% of 132 SMs
    (512, 4096, 64),   # 256 tiles, two waves at 97%
    (256, 3072, 48),   # 64-wide: 96 tiles (73%); 48-wide: 128 tiles
    (512, 3072, 48),   # 64-wide: 192 tiles, 1.45 waves; 48-wide: 256
    (128, 128, 32),    # tiny: no width fills the GPU, the narrowest fills it best
])
def test_choose_tile_n_fills_the_gpu(m, n, want):
    assert choose_tile_n(m, n) == want


@pytest.fixture(scope="module")
def ptx64():
    return p.compile_pipelined("sm_90a", PipelinedConfig(tile_n=64), 256, 256, 512)


@pytest.fixture(scope="module")
def ptx64_joint():
    return p.compile_pipelined("sm_90a", PipelinedConfig(tile_n=64, split=False), 256, 256, 512)


def test_ptx_wgmma_takes_a_from_registers_and_shares_it(ptx64):
    mmas = ptx_lines(ptx64, r"wgmma\.mma_async")
    assert len(mmas) == 4 * 4 * 2  # 4 slices x 4 k-steps x 2 GEMMs (the k-block loop is not unrolled)
    assert ptx_opcodes(ptx64, r"wgmma\.mma_async") == ["wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16"]
    a_regs = [m.split("}, {")[1].split("}")[0] for m in mmas]  # the second brace group: A's four registers
    assert all(len(r.split(",")) == 4 for r in a_regs)  # RS form: A is 4 registers, not a descriptor
    assert all(a_regs[i] == a_regs[i + 1] for i in range(0, len(mmas), 2))  # acc1 and acc2 read the same A


def test_ptx_split_roles(ptx64):
    # warp 0 of the converter warpgroup loads: two k-blocks before the loop, one per iteration
    loads = ptx_lines(ptx64, r"cp\.async\.bulk\.tensor")
    assert len(loads) == (2 + 1) * (3 * 4 + 3)  # A, B1, B2 as four 32-byte slices each, three scale tiles
    ops = ptx_opcodes(ptx64, r"cvt\.rn\.f16x2|fence\.proxy|bar\.sync|setmaxnreg")
    assert "cvt.rn.f16x2.e4m3x2" in ops and "fence.proxy.async.shared::cta;" in ops
    assert not [x for x in ptx_lines(ptx64, r"bar\.sync") if x.split()[1].rstrip(",") == "1"]  # mbarriers only
    waits = ptx_lines(ptx64, r"wgmma\.wait_group")
    assert sorted({w.split()[1].rstrip(";") for w in waits}) == ["0", "1"]
    assert not ptx_lines(ptx64, r"^ld\.global")


def test_ptx_joint_roles(ptx64_joint):
    loads = ptx_lines(ptx64_joint, r"cp\.async\.bulk\.tensor")
    assert len(loads) == 3 * 4 + 3
    named = [x for x in ptx_lines(ptx64_joint, r"bar\.sync") if x.split()[1].rstrip(",") == "1"]
    assert len(named) == 4 and all("256" in x for x in named)  # one barrier of the MMA warpgroups per slice
    assert len(ptx_lines(ptx64_joint, r"wgmma\.mma_async")) == 32


@pytest.mark.parametrize("tile_n", [48, 32])
def test_ptx_narrow_tiles(tile_n):
    c = p.compile_pipelined("sm_90a", PipelinedConfig(tile_n=tile_n, stages=3), 200, 136, 768)
    assert ptx_opcodes(c, r"wgmma\.mma_async") == [f"wgmma.mma_async.sync.aligned.m64n{tile_n}k16.f32.f16.f16"]


def test_a_fragment_layout_is_what_convert_a_writes():
    # convert_a writes word (half + 2 hi + 4 kk) for row g + 8 half, K pair 16 kk + 2t + 8 hi;
    # that is CuTe's RS A layout for two warpgroups along M: (thread, value) -> m + 128 k
    seen = p.rs_a_layouts()
    assert seen["tv"] == "((4,8,8),((2,2,2),(1,1))):((256,1,16),((128,8,1024),(0,0)))"
    assert seen["fragment"] == "((2,2,2),1,4):((1,2,4),0,8)"


def test_bad_input_is_rejected_before_the_tier_check():
    ops = fp4.generate(128, 128, 512)
    a, b1, b2, sfa, sfb1, sfb2 = ops.inputs()
    with pytest.raises(ValueError, match="K must be a multiple of 256"):
        p.gated_dual_gemm_pipelined(*(fp4.as_bytes(t)[:, :192] for t in (a, b1, b2)),
                                    *(s[:, :24] for s in (sfa, sfb1, sfb2)))
    with pytest.raises(ValueError, match="out must be compact"):
        p.gated_dual_gemm_pipelined(a, b1, b2, sfa, sfb1, sfb2,
                                    out=torch.empty(128, 256, 1, dtype=torch.float16)[:, :128])
    with pytest.raises(TypeError, match="cfg must be a PipelinedConfig"):
        p.gated_dual_gemm_pipelined(a, b1, b2, sfa, sfb1, sfb2, cfg=(64, 4))
    with pytest.raises(ValueError, match="needs target sm_90a"):
        p.compile_pipelined("sm_100a", None, 256, 256, 512)


@pytest.mark.skipif(detect_tier() != "cpu", reason="checks the CPU tier's refusal")
def test_cpu_tier_refuses_to_launch():
    with pytest.raises(TierError):
        p.gated_dual_gemm_pipelined(*fp4.generate(128, 128, 256).inputs())


# ---------------------------------------------------------------- on an H100 / H200

GPU_SHAPES = list(fp4.TEST_SHAPES) + list(fp4.BENCHMARK_SHAPES)


@pytest.mark.gpu
@pytest.mark.sm90
@pytest.mark.parametrize("shape", GPU_SHAPES, ids=[f"{m}x{n}x{k}" for m, n, k in GPU_SHAPES])
@pytest.mark.parametrize("tile_n", [64, 48, 32])
@pytest.mark.parametrize("split", [True, False], ids=["split", "joint"])
def test_matches_reference_with_poisoned_output(shape, tile_n, split):
    if (tile_n != 64 or not split) and shape in fp4.BENCHMARK_SHAPES[1:]:
        pytest.skip("narrow tiles and the joint form are checked on the small shapes and the first benchmark shape")
    cfg = PipelinedConfig(tile_n=tile_n, split=split)
    _, _, res = fp4.run_poisoned(lambda *ins, out: p.gated_dual_gemm_pipelined(*ins, out=out, cfg=cfg), *shape,
                                 seed=13 + tile_n)
    assert res.ok, f"{shape} tile_n={tile_n} split={split}: {res}"


@pytest.mark.gpu
@pytest.mark.sm90
def test_default_config_and_repeat_calls_agree():
    first, second, res = fp4.run_twice(p.gated_dual_gemm_pipelined, 256, 3072, 1024, seed=3)
    assert torch.equal(first, second)  # no state leaks between launches (barriers, buffers)
    assert res.ok


@pytest.mark.parametrize("m,n,k,tile_n", [(1, 64, 256, 32), (1, 136, 512, 32), (40, 136, 512, 48)])
def test_one_row_and_ragged_n_run_on_the_emulator(m, n, k, tile_n):
    """M = 1: a static extent of 1 would fold A's and SFA's TMA copies to 1-d against a 2-d tensor map (the emulator
    refuses that copy, as the GPU faults on it); the launch gives them a run-time row count. N = 136 makes the
    compiler use dp2a in the epilogue's addressing. Poisoned output against the NVFP4 reference."""
    from gemmlab.emulator.run import run_on_emulator
    from gemmlab.kernels.dual_gemm_sm90 import operands_2d

    ops = fp4.generate(m, n, k, seed=m + n)
    assert torch.isnan(ops.c.float()).all()
    run_on_emulator(p.compile_pipelined("sm_90a", PipelinedConfig(tile_n=tile_n), m, n, k),
                    *operands_2d(*ops.inputs(), ops.c), seed=m % 4)
    res = fp4.check_close(ops.c, fp4.reference(*ops.inputs()))
    assert res.ok, res


def test_one_row_tma_copies_stay_two_dimensional():
    """At M = 1 the copies of A and SFA keep their row coordinate (2-d copies, none 1-d), as at M = 2. (The
    run-time row count is taken only at M = 1; at M = 128 and 200 the kernel's PTX was compared before and after
    the change and is byte-identical up to the kernel's name.)"""
    two = p.compile_pipelined("sm_90a", PipelinedConfig(tile_n=32), 2, 64, 256).__ptx__
    one = p.compile_pipelined("sm_90a", PipelinedConfig(tile_n=32), 1, 64, 256).__ptx__
    assert "cp.async.bulk.tensor.2d" in one and "cp.async.bulk.tensor.1d" not in one
    assert "cp.async.bulk.tensor.1d" not in two
