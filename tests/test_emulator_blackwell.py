"""The course's Blackwell kernels (chapters 10 and 11) on the emulator: right answers, and bugs caught.

CPU tier: compiled for sm_100a here, run by :mod:`gemmlab.emulator` ("ran on the emulator",
never "ran on a B200"). Each correctness case poisons the output first and compares with an
FP32 / NVFP4 reference on fresh random data; each injected bug is a one-instruction change of
the compiled PTX (:func:`gemmlab.emulator.inject.mutate`) that the emulator must report.
"""
from __future__ import annotations

import pytest
import torch

from gemmlab import nvfp4 as fp4
from gemmlab.emulator import errors
from gemmlab.emulator.inject import mutate
from gemmlab.emulator.run import run_on_emulator


def _gemm(m, n, k, block_n=256, sms=4, stages=4):
    from gemmlab.family.configs import Sm100Config
    from gemmlab.kernels.gemm_sm100 import compile_gemm_sm100

    return compile_gemm_sm100("sm_100a", Sm100Config(block_n=block_n, ab_stages=stages, num_sms=sms), m, n, k)


def _gemm_operands(m, n, k, seed):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(m, k, generator=g).bfloat16()
    w = torch.randn(n, k, generator=g).bfloat16()
    out = torch.full((m, n), float("nan")).bfloat16()
    return a, w, out


def _rel_err(out, ref):
    return ((out.float() - ref).norm() / ref.norm()).item()


@pytest.mark.parametrize("m,n,k,block_n,sms,seed", [
    (256, 256, 256, 256, 4, 0),  # one pair tile, four k-blocks (the 256^3)
    (512, 512, 320, 256, 2, 1),  # four tiles on one cluster: both accumulator stages reused; K = 5 k-blocks
    (200, 136, 64, 128, 4, 2),   # partial tiles in M and N, one k-block
])
def test_chapter10_gemm_matches_fp32(m, n, k, block_n, sms, seed):
    compiled = _gemm(m, n, k, block_n, sms)
    a, w, out = _gemm_operands(m, n, k, seed)
    (report,) = run_on_emulator(compiled, a, w.t(), out, seed=seed)
    assert report.cluster == (2, 1, 1) and report.block == (192, 1, 1)
    assert not out.isnan().any()
    assert _rel_err(out, a.float() @ w.float().t()) < 3e-3  # BF16 output rounding: ~1.7e-3


def _dual(m, n, k, tile_n=128, ctas=2):
    from gemmlab.kernels.dual_gemm_sm100 import DualSm100Config, compile_dual_sm100

    return compile_dual_sm100("sm_100a", DualSm100Config(tile_n=tile_n, stages=3, num_ctas=ctas), m, n, k)


def _dual_operands(m, n, k, seed):
    ops = fp4.generate(m, n, k, seed=seed)
    packed = [fp4.as_bytes(x)[..., 0].contiguous() for x in (ops.a, ops.b1, ops.b2)]
    scales = [fp4.blocked_bytes(fp4.permute_scales(x)).contiguous() for x in (ops.sfa, ops.sfb1, ops.sfb2)]
    out = torch.full((m, n), float("nan"), dtype=torch.float16)
    ref = fp4.reference(ops.a, ops.b1, ops.b2, ops.sfa, ops.sfb1, ops.sfb2)
    return packed, scales, out, ref


@pytest.mark.parametrize("m,n,k,tile_n,ctas,seed", [
    (128, 128, 256, 128, 2, 0),  # GPU MODE's smallest-like: one tile, one k-block
    (256, 256, 512, 128, 3, 1),  # four tiles on three CTAs, two k-blocks
    (200, 192, 256, 64, 4, 2),   # partial tiles, the 64-wide tile (odd tiles shift their B scales)
])
def test_chapter11_gated_kernel_matches_nvfp4_reference(m, n, k, tile_n, ctas, seed):
    compiled = _dual(m, n, k, tile_n, ctas)
    packed, scales, out, ref = _dual_operands(m, n, k, seed)
    run_on_emulator(compiled, *packed, *scales, out, seed=seed)
    assert fp4.check_close(out[..., None], ref).ok


# --------------------------------------------------------------------------------------------
# Injected bugs: each one-instruction change of the compiled kernel is caught
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def dual128():
    return _dual(128, 128, 512, 128, 2)


def _run_dual(compiled, ptx, seed=0):
    packed, scales, out, ref = _dual_operands(128, 128, 512, seed)
    run_on_emulator(compiled, *packed, *scales, out, seed=seed, ptx=ptx)
    return fp4.check_close(out[..., None], ref)


def test_the_unchanged_ptx_passes(dual128):
    assert _run_dual(dual128, dual128.__ptx__).ok


def test_missing_wait_ld_is_reported(dual128, monkeypatch):
    """Without ``tcgen05.wait::ld`` the epilogue's TMEM reads are not ordered before the dealloc (or the next
    tile's MMA) of those columns (PTX ISA 9.7.16.6.4.4). Reading the loaded registers before the wait is not
    the bug: the ISA does not forbid it (unlike wgmma's accumulators), ptxas honours the dependency, and
    NVIDIA's own DSL epilogues never wait. The emulator notes the unordered read in the launch report, and
    raises in strict mode (``tcgen05.STRICT_LD_ORDER``)."""
    from gemmlab.emulator.isa import tcgen05

    packed, scales, out, ref = _dual_operands(128, 128, 512, 0)
    (report,) = run_on_emulator(dual128, *packed, *scales, out, seed=0)
    assert report.notes == []
    ptx = mutate(dual128.__ptx__, drop=r"^tcgen05\.wait::ld")
    (report,) = run_on_emulator(dual128, *packed, *scales, out, seed=0, ptx=ptx)
    assert any("without a tcgen05.wait::ld" in n for n in report.notes), report.notes
    monkeypatch.setattr(tcgen05, "STRICT_LD_ORDER", True)
    with pytest.raises(errors.RaceError, match=r"without a tcgen05\.wait::ld") as e:
        _run_dual(dual128, ptx)
    assert "PTX line" in str(e.value) and "warp" in str(e.value)


def test_accumulate_left_on_for_the_first_mma_is_reported(dual128):
    # the first MMAs of a tile clear the accumulator: their enable-input-d predicate is set to 0 just before
    ptx = mutate(dual128.__ptx__, replace=(r"^mov\.pred\s+(%p\d+), 0;", r"mov.pred \1, -1;"))
    with pytest.raises(errors.TmemError, match="enable-input-d"):
        _run_dual(dual128, ptx)


def test_scales_not_advanced_give_a_wrong_answer(dual128):
    # every MMA of a k-block reads the first MMA step's scale-factor columns ([%rA], [%rB] of the first MMA)
    import re

    lines = [ln for ln in dual128.__ptx__.splitlines() if "tcgen05.mma" in ln]
    first = re.search(r"(\[%r\d+\]), (\[%r\d+\]), %p\d+;", lines[0]).group(1)
    later = {re.search(r"(\[%r\d+\]), \[%r\d+\], %p\d+;", ln).group(1) for ln in lines} - {first}
    assert later, "the kernel should read other scale columns in later MMA steps"
    ptx = dual128.__ptx__
    for reg in later:
        ptx = mutate(ptx, replace=(r"tcgen05\.mma.*" + re.escape(reg), lambda mt, r=reg: mt.group(0).replace(r, first)))
    result = _run_dual(dual128, ptx)
    assert not result.ok


def test_tensor_memory_freed_before_the_epilogue_is_reported(dual128):
    # the allocating warp frees the accumulator's columns before it reads them back
    ptx = mutate(dual128.__ptx__, before=(r"^tcgen05\.ld\.",
                                          "tcgen05.dealloc.cta_group::1.sync.aligned.b32 %r14, 512;"))
    with pytest.raises(errors.TmemError, match="not allocated|has not completed|not an allocation"):
        _run_dual(dual128, ptx)


def test_missing_proxy_fence_before_the_tma_store_is_reported(dual128):
    ptx = mutate(dual128.__ptx__, drop=r"^fence\.proxy\.async")
    with pytest.raises(errors.RaceError, match="fence.proxy.async"):
        _run_dual(dual128, ptx)


def test_chapter10_store_without_waiting_for_the_smem_reads_is_caught():
    """Without ``cp.async.bulk.wait_group.read`` before reusing an SMEM-C buffer, some interleaving stores a
    buffer the epilogue is already overwriting (or exits while a store still reads): never silently right."""
    compiled = _gemm(256, 256, 128, 256, 4)
    ptx = mutate(compiled.__ptx__, drop=r"^cp\.async\.bulk\.wait_group")
    caught = 0
    for seed in range(4):
        a, w, out = _gemm_operands(256, 256, 128, seed)
        try:
            run_on_emulator(compiled, a, w.t(), out, seed=seed, ptx=ptx)
        except errors.EmulatorError:
            caught += 1
            continue
        if torch.isnan(out.float()).any() or _rel_err(out, a.float() @ w.float().t()) > 3e-3:
            caught += 1
    assert caught >= 1


def test_mutate_refuses_an_edit_that_matches_nothing(dual128):
    with pytest.raises(ValueError, match="nothing was injected"):
        mutate(dual128.__ptx__, drop=r"^no\.such\.instruction")


def test_the_same_seed_gives_the_same_run():
    """A seed fixes the interleaving (which warp runs, when each operation lands): two runs agree step for step."""
    compiled = _gemm(256, 256, 128, 256, 4)
    runs = []
    for _ in range(2):
        a, w, out = _gemm_operands(256, 256, 128, 5)
        (report,) = run_on_emulator(compiled, a, w.t(), out, seed=3)
        runs.append((report.warp_instructions, report.async_ops, out.clone()))
    assert runs[0][:2] == runs[1][:2] and torch.equal(runs[0][2], runs[1][2])
