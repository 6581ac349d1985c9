"""Chapter 11 on Hopper, the fast twin: conversion overlapped with WGMMA, A from registers.

The simple twin (:mod:`gemmlab.kernels.dual_gemm_sm90`) is correct but spends more than 30 PTX
instructions on every FP4 value and lets the tensor cores wait for each dequantized slice
(7 to 16 times slower than this kernel on an H100). This kernel keeps its data flow (packed
NVFP4 bytes and plain scales arrive by TMA; FP16 tiles feed WGMMA; two FP32 accumulators
share A) and changes five things:

* **Conversion** in 19 instructions per 8 values, plus two register-splitting ``mov``
  (:mod:`gemmlab.fp4_dequant`): e2m1 bits moved into e4m3 bytes, ``cvt.rn.f16x2.e4m3x2``,
  one ``mul.rn.f16x2`` by the scale. FP16, not BF16: every product is exact in FP16, and
  sm_90's conversion from e4m3 produces FP16.
* **A goes to registers, not to shared memory.** Each MMA thread converts exactly the bytes
  its WGMMA A fragment holds (rows ``g`` and ``g + 8`` of its warp's 16, K pairs ``2t`` and
  ``2t + 8``), so WGMMA runs in its RS form (A from registers, B from shared memory). That
  halves the shared-memory traffic of the MMAs, and the one A fragment serves both GEMMs.
* **Slices in flight.** The FP16 B slices (64 K values of B1 and B2) have four buffers and
  the A fragments two register sets: slice j + 1 converts while the WGMMAs of slice j run.
  Every thread issues a slice's loads before converting it, and the next slice's loads
  before converting this one (:func:`load_a` / :func:`convert_a`), so load latency overlaps.
* **Packed bytes slice-major in shared memory.** TMA writes each k-block as four slices of
  32 bytes per row, so a warp's loads of a slice read contiguous bytes instead of rows that
  are 128 bytes apart and fall on the same banks.
* **Roles** (``split=True``, the default): warpgroup 0 converts B and its warp 0 issues the
  TMA loads two k-blocks ahead; the MMA warpgroups convert A. Per FP16 buffer, ``bfull``
  (the 4 converter warps arrive after ``fence.proxy.async``) and ``bempty`` (the 8 MMA warps
  arrive once ``wgmma.wait_group 1`` shows their WGMMAs of that slice done) replace a
  barrier of all MMA threads per slice, which ``split=False`` keeps (there the MMA
  warpgroups convert both operands and warp 0 only loads).

Tile: 128 rows of C (two MMA warpgroups of 64) by ``tile_n`` columns of each GEMM (32, 48
or 64), chosen so that the grid fills the GPU's SMs (:func:`gemmlab.family.heuristic_gated.choose_tile_n`).

Roles with ``split=True`` (128 threads per warpgroup)::

    warpgroup 0     warp 0 first: load k-block kb + stages - 2 (wait empty[s]; expect_tx(full[s]); 15 TMA boxes)
                    all 4 warps, per k-block: wait full[s]; per slice j: load B(j + 1) bytes; wait bempty[j % 4];
                      convert B(j) into buffer j % 4; fence.proxy.async; arrive bfull[j % 4];
                      after the 4 slices: arrive empty[s]
    warpgroups 1, 2 per k-block: wait full[s]; per slice j: wgmma.wait_group 1 -> arrive bempty[(j - 2) % 4]
                      -> load A(j + 1) bytes (same k-block), convert A(j) into registers (last: arrive empty[s])
                      -> wait bfull[j % 4] -> wgmma.fence; 4 x (acc1 += A B1, acc2 += A B2); commit
                    epilogue: wait 0; silu(acc1) * acc2 -> FP16 -> global (predicated)
"""
from __future__ import annotations

import functools

import cutlass
import cutlass.cute as cute
import cutlass.utils.hopper_helpers as sm90_utils
import cuda.bindings.driver as cuda
from cutlass import Float16, Float32, Int32, Int64, Uint8, Uint32
from cutlass.cute.nvgpu import OperandMajorMode, cpasync, warpgroup
from cutlass.memory import SmemAllocator
from cutlass.tensor_utils import LayoutEnum

from .. import nvfp4 as fp4
from ..family.configs import GATED_TILE_M as TILE_M, KB_BYTES, SF_BYTES, SLICE_K, SLICES, PipelinedConfig
from ..family.heuristic_gated import choose_tile_n
from ..family.problem import check_gated_sizes
from .dual_gemm_sm90 import (check_devices, check_sm90_target, compile_with_pointers, fake_operands, gate_epilogue,
                             operands_2d, tma_atoms, tma_copies, with_runtime_rows)
from ..fp4_dequant import fp4x8_to_f16, gather_bytes, scale_f16x2
from ..ldst import ld_shared_b32, ld_shared_v2, ld_shared_v4, st_shared_v4
from ..pipeline import DevicePipelineState

SLICE_BYTES = SLICE_K // 2  #: packed bytes of a slice per row
PRODUCER_REGS = 40
CONSUMER_REGS = 232
CONVERTER_REGS = 96  # split: 128 x 96 + 256 x 208 = 64 K registers
SPLIT_CONSUMER_REGS = 208
CONSUMER_THREADS = 256
CONSUMER_BARRIER = 1


# --------------------------------------------------------------------------------------
# Dequantization, by the consumers
# --------------------------------------------------------------------------------------


@cute.jit
def load_a(pA, sA, row: Int32, sl: cutlass.Constexpr):
    """Shared-memory loads for one A row of slice ``sl``: the row's 32 packed bytes (8 words) and its 4 scales.

    Loads are separate from conversion so that a thread issues all its loads of a slice first and the
    conversions of several rows and units then overlap their latencies (ptxas does not move a load
    above an earlier shared-memory store it cannot prove disjoint).
    """
    base = pA + (sl * TILE_M * SLICE_BYTES + row * SLICE_BYTES)
    w0, w1, w2, w3 = ld_shared_v4(base)
    w4, w5, w6, w7 = ld_shared_v4(base + 16)
    sw = ld_shared_b32(sA + (row * SF_BYTES + sl * 4))
    return w0, w1, w2, w3, w4, w5, w6, w7, sw


@cute.jit
def convert_a(frag: cute.Tensor, loaded, selector: Int32, half: cutlass.Constexpr):
    """This thread's A fragment words for one of its two rows (``half`` 0: row g, 1: row g + 8).

    ``frag``: the FP16 fragment seen as 16 words, word ``half + 2 hi + 4 kk`` holding the pair
    (row, K ``16 kk + 2t + 8 hi``), which is packed byte ``8 kk + 4 hi + t`` of the slice row;
    ``loaded``: :func:`load_a`'s nine words.
    """
    sw = loaded[8]
    s = (scale_f16x2(sw, 0), scale_f16x2(sw, 1), scale_f16x2(sw, 2), scale_f16x2(sw, 3))
    for part in cutlass.range_constexpr(2):
        w = loaded[4 * part: 4 * part + 4]
        x = gather_bytes(w[0], w[1], w[2], w[3], selector)  # [kk lo, kk hi, kk+1 lo, kk+1 hi], kk = 2 part
        h = fp4x8_to_f16(x, s[2 * part], s[2 * part + 1])
        for i in cutlass.range_constexpr(4):
            kk = 2 * part + i // 2
            frag[half + 2 * (i % 2) + 4 * kk] = h[i]


@cute.jit
def load_b(pB, sB, unit: Int32, sl: cutlass.Constexpr, bn: cutlass.Constexpr):
    """Shared-memory loads for one unit of the B slice: 8 packed bytes (16 values) and the scale word.

    A unit is row ``unit // 4`` of [B1; B2], bytes ``8 (unit % 4)`` onwards of the slice row.
    Packed layout per stage: B1 slice-major (``sl * bn * 32 + row * 32``), then B2.
    """
    row = unit // 4
    is_b2 = Int32(row >= bn)
    src = pB + (sl * bn * SLICE_BYTES + row * SLICE_BYTES + (unit % 4) * 8 + is_b2 * (bn * (KB_BYTES - SLICE_BYTES)))
    x0, x1 = ld_shared_v2(src)
    sw = ld_shared_b32(sB + (row * SF_BYTES + sl * 4))
    return x0, x1, sw


@cute.jit
def convert_b(fB, loaded, unit: Int32, buf: cutlass.Constexpr, bn: cutlass.Constexpr):
    """One unit of :func:`load_b` to FP16 in buffer ``buf``: two 16-byte chunks of a 128B-swizzled row.

    FP16 buffers: four of B1 (``bn`` rows of 128 bytes each), then four of B2, so that WGMMA's
    descriptors step through them with one stride; chunk c of row r sits at chunk ``c ^ (r % 8)``.
    """
    row = unit // 4
    is_b2 = Int32(row >= bn)
    convert_unit(fB + (buf * bn * 128 + row * 128 + is_b2 * ((SLICES - 1) * bn * 128)), loaded, unit)


@cute.jit
def convert_unit(dst_row, loaded, unit: Int32):
    """Unit ``unit`` (row ``unit // 4`` of a slice, its 16 values ``16 (unit % 4)`` onwards: 8 packed bytes and the
    slice's scale word, as :func:`load_b` loads them) to FP16 in the 128-byte row at ``dst_row`` of a 128B-swizzled
    buffer (WGMMA's K-major layout): two 16-byte chunks, chunk c of row r at chunk ``c ^ (r % 8)``. The fast twin's
    B, the decode twin's tokens and the A16 twin's stacked [B1; B2] differ only in where the row lies."""
    row = unit // 4
    q = unit % 4
    x0, x1, sw = loaded
    sc = scale_f16x2(sw >> (q * 8), 0)  # the unit's 16 values share scale byte q of the slice's four
    h0 = fp4x8_to_f16(x0, sc, sc)
    h1 = fp4x8_to_f16(x1, sc, sc)
    r8 = row % 8
    st_shared_v4(dst_row + ((2 * q) ^ r8) * 16, *h0)
    st_shared_v4(dst_row + ((2 * q + 1) ^ r8) * 16, *h1)


@cute.jit
def load_stage(copies, full, kb: Int32, stage: Int32, cfg: cutlass.Constexpr):
    """One k-block of packed A, B1, B2 and their scales into ring stage ``stage`` (after its empty wait)."""
    with cute.arch.elect_one():
        cute.arch.mbarrier_arrive_and_expect_tx(full + stage, cfg.stage_bytes())
    for atom, src, dst, tile in copies:
        cute.copy(atom, src[(None, tile, kb)], dst[(None, stage)], tma_bar_ptr=full + stage)


# --------------------------------------------------------------------------------------
# The kernel
# --------------------------------------------------------------------------------------


@cute.kernel
def pipelined_kernel(
    tma_a: cute.CopyAtom, mA: cute.Tensor, tma_b1: cute.CopyAtom, mB1: cute.Tensor,
    tma_b2: cute.CopyAtom, mB2: cute.Tensor, tma_sa: cute.CopyAtom, mSA: cute.Tensor,
    tma_sb1: cute.CopyAtom, mSB1: cute.Tensor, tma_sb2: cute.CopyAtom, mSB2: cute.Tensor,
    mC: cute.Tensor, tiled_mma: cute.TiledMma,
    pa_layout: cute.Layout, pb_layout: cute.Layout, sa_layout: cute.Layout, sb_layout: cute.Layout,
    fb_layout: cute.ComposedLayout, k_blocks: Int32, cfg: cutlass.Constexpr,
):
    BN = cfg.tile_n
    S = cfg.stages
    tidx, _, _ = cute.arch.thread_idx()
    warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
    wg = warp // 4
    m_tile, n_tile, _ = cute.arch.block_idx()

    smem = SmemAllocator()
    f16_bytes = SLICES * 2 * BN * SLICE_K * 2
    fRaw = smem.allocate_tensor(Uint8, cute.make_layout(f16_bytes), byte_alignment=1024)
    pARaw = smem.allocate_tensor(Uint8, cute.make_layout(S * TILE_M * KB_BYTES), byte_alignment=128)
    pBRaw = smem.allocate_tensor(Uint8, cute.make_layout(S * 2 * BN * KB_BYTES), byte_alignment=128)
    sARaw = smem.allocate_tensor(Uint8, cute.make_layout(S * TILE_M * SF_BYTES), byte_alignment=128)
    sBRaw = smem.allocate_tensor(Uint8, cute.make_layout(S * 2 * BN * SF_BYTES), byte_alignment=128)
    full = smem.allocate_array(Int64, S, byte_alignment=8)
    empty = smem.allocate_array(Int64, S, byte_alignment=8)
    bfull = smem.allocate_array(Int64, SLICES, byte_alignment=8)  # split: FP16 B buffer written
    bempty = smem.allocate_array(Int64, SLICES, byte_alignment=8)  # split: FP16 B buffer read by the WGMMAs

    # TMA views of the ring: packed operands slice-major, scales row-major, B2 after B1
    pA = cute.make_tensor(pARaw.iterator, pa_layout)
    pB1 = cute.make_tensor(pBRaw.iterator, pb_layout)
    pB2 = cute.make_tensor(pBRaw.iterator + BN * KB_BYTES, pb_layout)
    sSA = cute.make_tensor(sARaw.iterator, sa_layout)
    sSB1 = cute.make_tensor(sBRaw.iterator, sb_layout)
    sSB2 = cute.make_tensor(sBRaw.iterator + BN * SF_BYTES, sb_layout)

    if warp == 0:
        for atom in (tma_a, tma_b1, tma_b2, tma_sa, tma_sb1, tma_sb2):
            cpasync.prefetch_descriptor(atom)
        with cute.arch.elect_one():
            for s in cutlass.range_constexpr(S):
                cute.arch.mbarrier_init(full + s, 1)
                # split: released by each converter warp (B) and each MMA warp (A); else by one thread
                cute.arch.mbarrier_init(empty + s, 12 if cfg.split else 1)
            for b in cutlass.range_constexpr(SLICES):
                cute.arch.mbarrier_init(bfull + b, 4)
                cute.arch.mbarrier_init(bempty + b, 8)
            cute.arch.mbarrier_init_fence()
    cute.arch.sync_threads()

    copies = tma_copies(((tma_a, mA, pA), (tma_b1, mB1, pB1), (tma_b2, mB2, pB2), (tma_sa, mSA, sSA),
                         (tma_sb1, mSB1, sSB1), (tma_sb2, mSB2, sSB2)), BN, m_tile, n_tile)
    units = 2 * BN * (SLICE_BYTES // 8)  # 8-byte units of a B slice (B1 and B2)

    if wg == 0:
        if cutlass.const_expr(not cfg.split):
            # ============================================================ producer (warp 0)
            cute.arch.warpgroup_reg_dealloc(PRODUCER_REGS)
            if warp == 0:
                state = DevicePipelineState.producer(S)
                for kb in cutlass.range(k_blocks, unroll=1):
                    cute.arch.mbarrier_wait(empty + state.index, state.phase)
                    load_stage(copies, full, kb, state.index, cfg)
                    state.advance()
        else:
            # ============================================================ converter: B to FP16; warp 0 loads
            cute.arch.warpgroup_reg_dealloc(CONVERTER_REGS)
            lane = cute.arch.lane_idx()
            ahead = S - 2  # k-blocks loaded ahead: stage kb - 2 is long released when k-block kb starts
            if warp == 0:
                for i in cutlass.range_constexpr(S - 2):
                    if i < k_blocks:
                        cute.arch.mbarrier_wait(empty + i, 1)
                        load_stage(copies, full, Int32(i), Int32(i), cfg)
            for kb in cutlass.range(k_blocks, unroll=1):
                if warp == 0:
                    nxt = kb + ahead
                    if nxt < k_blocks:
                        cute.arch.mbarrier_wait(empty + nxt % S, ((nxt // S) & 1) ^ 1)
                        load_stage(copies, full, nxt, nxt % S, cfg)
                stage = kb % S
                cute.arch.mbarrier_wait(full + stage, (kb // S) & 1)
                stage_b = pBRaw.iterator + stage * (2 * BN * KB_BYTES)
                stage_sb = sBRaw.iterator + stage * (2 * BN * SF_BYTES)
                per = units // 128
                loaded = [load_b(stage_b, stage_sb, tidx + i * 128, 0, BN) for i in range(per)]
                for sl in cutlass.range_constexpr(SLICES):
                    cute.arch.mbarrier_wait(bempty + sl, (kb & 1) ^ 1)  # the WGMMAs of k-block kb - 1 read it
                    nxt = loaded
                    if cutlass.const_expr(sl + 1 < SLICES):  # the next slice's loads overlap this one's conversion
                        nxt = [load_b(stage_b, stage_sb, tidx + i * 128, sl + 1, BN) for i in range(per)]
                    if cutlass.const_expr(cfg.probe != "no_convert"):
                        for i in cutlass.range_constexpr(per):
                            convert_b(fRaw.iterator, loaded[i], tidx + i * 128, sl, BN)
                    loaded = nxt
                    cute.arch.fence_proxy("async.shared", space="cta")
                    cute.arch.sync_warp()
                    if lane == 0:
                        cute.arch.mbarrier_arrive(bfull + sl)
                if lane == 0:
                    cute.arch.mbarrier_arrive(empty + stage)
    else:
        # ============================================================ consumers
        cute.arch.warpgroup_reg_alloc(SPLIT_CONSUMER_REGS if cfg.split else CONSUMER_REGS)
        ctid = tidx - 128
        lane = cute.arch.lane_idx()
        g = lane // 4
        t = lane % 4
        selector = t | ((t + 4) << 4)
        row0 = (warp - 4) * 16 + g  # rows g and g + 8 of this warp's 16 (warps 4..11 cover the 128 rows)
        thr_mma = tiled_mma.get_slice(ctid)
        fB1 = cute.make_tensor(cute.recast_ptr(fRaw.iterator, fb_layout.inner, Float16), fb_layout.outer)
        fB2 = cute.make_tensor(cute.recast_ptr(fRaw.iterator + SLICES * BN * SLICE_K * 2, fb_layout.inner, Float16),
                               fb_layout.outer)
        tCrB1 = tiled_mma.make_fragment_B(thr_mma.partition_B(fB1))
        tCrB2 = tiled_mma.make_fragment_B(thr_mma.partition_B(fB2))
        tCrA = [tiled_mma.make_fragment_A(thr_mma.partition_shape_A((TILE_M, SLICE_K))) for _ in range(2)]
        aw = [cute.recast_tensor(f, Uint32) for f in tCrA]
        acc1 = cute.make_rmem_tensor(tiled_mma.partition_shape_C((TILE_M, BN)), Float32)
        acc2 = cute.make_rmem_tensor(tiled_mma.partition_shape_C((TILE_M, BN)), Float32)
        acc1.fill(0.0)
        acc2.fill(0.0)
        tiled_mma.set(warpgroup.Field.ACCUMULATE, True)
        k_steps = cute.size(tCrA[0], mode=[2])

        if cutlass.const_expr(not cfg.split):
            read = DevicePipelineState.consumer(S)
            for kb in cutlass.range(k_blocks, unroll=1):
                cute.arch.mbarrier_wait(full + read.index, read.phase)
                stage_a = pARaw.iterator + read.index * (TILE_M * KB_BYTES)
                stage_sa = sARaw.iterator + read.index * (TILE_M * SF_BYTES)
                stage_b = pBRaw.iterator + read.index * (2 * BN * KB_BYTES)
                stage_sb = sBRaw.iterator + read.index * (2 * BN * SF_BYTES)
                for sl in cutlass.range_constexpr(SLICES):
                    # the WGMMAs of slice j - 2 (this warpgroup's) have read A buffer j % 2 and B buffer (j - 2) % 4
                    warpgroup.wait_group(1)
                    if cutlass.const_expr(cfg.probe != "no_convert"):
                        la = (load_a(stage_a, stage_sa, row0, sl), load_a(stage_a, stage_sa, row0 + 8, sl))
                        whole = units // CONSUMER_THREADS  # units every thread converts; a partial round after
                        lb = [load_b(stage_b, stage_sb, ctid + i * CONSUMER_THREADS, sl, BN) for i in range(whole)]
                        frag = aw[sl % 2]
                        convert_a(frag, la[0], selector, 0)
                        convert_a(frag, la[1], selector, 1)
                        for i in cutlass.range_constexpr(whole):
                            convert_b(fRaw.iterator, lb[i], ctid + i * CONSUMER_THREADS, sl, BN)
                        if cutlass.const_expr(units % CONSUMER_THREADS):
                            unit = ctid + whole * CONSUMER_THREADS
                            if unit < units:
                                convert_b(fRaw.iterator, load_b(stage_b, stage_sb, unit, sl, BN), unit, sl, BN)
                    # generic-proxy stores must be visible to the async proxy (wgmma) before anyone issues
                    cute.arch.fence_proxy("async.shared", space="cta")
                    cute.arch.barrier(barrier_id=CONSUMER_BARRIER, number_of_threads=CONSUMER_THREADS)
                    if cutlass.const_expr(sl == SLICES - 1):
                        if ctid == 0:
                            cute.arch.mbarrier_arrive(empty + read.index)  # every thread has read stage s
                    if cutlass.const_expr(cfg.probe != "no_mma"):
                        warpgroup.fence()
                        for ks in cutlass.range_constexpr(k_steps):
                            a_ks = tCrA[sl % 2][(None, None, ks)]
                            cute.gemm(tiled_mma, acc1, a_ks, tCrB1[(None, None, ks, sl)], acc1)
                            cute.gemm(tiled_mma, acc2, a_ks, tCrB2[(None, None, ks, sl)], acc2)
                        warpgroup.commit_group()
                read.advance()
        else:
            # ---- split roles: A into registers, then the WGMMAs of both GEMMs, per slice
            for kb in cutlass.range(k_blocks, unroll=1):
                stage = kb % S
                cute.arch.mbarrier_wait(full + stage, (kb // S) & 1)
                stage_a = pARaw.iterator + stage * (TILE_M * KB_BYTES)
                stage_sa = sARaw.iterator + stage * (TILE_M * SF_BYTES)
                la = (load_a(stage_a, stage_sa, row0, 0), load_a(stage_a, stage_sa, row0 + 8, 0))
                for sl in cutlass.range_constexpr(SLICES):
                    # this warpgroup's WGMMAs of slice j - 2 are done: A registers j % 2 and B buffer (j - 2) % 4 free
                    warpgroup.wait_group(1)
                    if cutlass.const_expr(sl >= 2):
                        if lane == 0:
                            cute.arch.mbarrier_arrive(bempty + (sl - 2))
                    else:
                        if kb > 0:
                            if lane == 0:
                                cute.arch.mbarrier_arrive(bempty + (sl + 2))
                    nxt = la
                    if cutlass.const_expr(sl + 1 < SLICES):  # the next slice's loads overlap this one's conversion
                        nxt = (load_a(stage_a, stage_sa, row0, sl + 1), load_a(stage_a, stage_sa, row0 + 8, sl + 1))
                    if cutlass.const_expr(cfg.probe != "no_convert"):
                        frag = aw[sl % 2]
                        convert_a(frag, la[0], selector, 0)
                        convert_a(frag, la[1], selector, 1)
                    la = nxt
                    if cutlass.const_expr(sl == SLICES - 1):
                        cute.arch.sync_warp()
                        if lane == 0:
                            cute.arch.mbarrier_arrive(empty + stage)  # this warp has read stage s's A
                    cute.arch.mbarrier_wait(bfull + sl, kb & 1)
                    if cutlass.const_expr(cfg.probe != "no_mma"):
                        warpgroup.fence()
                        for ks in cutlass.range_constexpr(k_steps):
                            cute.gemm(tiled_mma, acc1, tCrA[sl % 2][(None, None, ks)], tCrB1[(None, None, ks, sl)],
                                      acc1)
                            cute.gemm(tiled_mma, acc2, tCrA[sl % 2][(None, None, ks)], tCrB2[(None, None, ks, sl)],
                                      acc2)
                        warpgroup.commit_group()
        warpgroup.wait_group(0)

        # ---- epilogue: the gate in FP32, FP16 out, predicated stores straight from the registers
        gate_epilogue(thr_mma, acc1, acc2, mC, m_tile, n_tile, BN)


# --------------------------------------------------------------------------------------
# Host side
# --------------------------------------------------------------------------------------


def smem_layouts(cfg: PipelinedConfig):
    """Per-stage TMA layouts of the ring (packed A and B slice-major, scales row-major) and the FP16 B buffers."""
    BN, S = cfg.tile_n, cfg.stages
    pa = cute.make_layout((TILE_M, (SLICE_BYTES, SLICES), S),
                          stride=(SLICE_BYTES, (1, TILE_M * SLICE_BYTES), TILE_M * KB_BYTES))
    pb = cute.make_layout((BN, (SLICE_BYTES, SLICES), S),
                          stride=(SLICE_BYTES, (1, BN * SLICE_BYTES), 2 * BN * KB_BYTES))
    sa = cute.make_layout((TILE_M, SF_BYTES, S), stride=(SF_BYTES, 1, TILE_M * SF_BYTES))
    sb = cute.make_layout((BN, SF_BYTES, S), stride=(SF_BYTES, 1, 2 * BN * SF_BYTES))
    fb = sm90_utils.make_smem_layout_b(LayoutEnum.ROW_MAJOR, (TILE_M, BN, SLICE_K), Float16, SLICES)
    return pa, pb, sa, sb, fb


@cute.jit
def launch_pipelined(a: cute.Tensor, b1: cute.Tensor, b2: cute.Tensor, sfa: cute.Tensor, sfb1: cute.Tensor,
                     sfb2: cute.Tensor, c: cute.Tensor, stream: cuda.CUstream, cfg: cutlass.Constexpr):
    """Views, TMA descriptors and the launch of C = silu(A B1^T) * (A B2^T) (arguments as the simple twin's)."""
    BN = cfg.tile_n
    tiled_mma = sm90_utils.make_trivial_tiled_mma(Float16, Float16, OperandMajorMode.K, OperandMajorMode.K, Float32,
                                                  (2, 1, 1), tiler_mn=(64, BN), a_source=warpgroup.OperandSource.RMEM)
    pa, pb, sa, sb, fb = smem_layouts(cfg)
    if cutlass.const_expr(cute.size(a, mode=[0]) == 1):  # one row only: other M keep the PTX the GPUs ran
        a, sfa = with_runtime_rows(a, 1), with_runtime_rows(sfa, 1)
    (tma_a, tA), (tma_b1, tB1), (tma_b2, tB2), (tma_sa, tSA), (tma_sb1, tSB1), (tma_sb2, tSB2) = tma_atoms(
        (a, b1, b2, sfa, sfb1, sfb2), pa, pb, sa, sb, BN)
    m = cute.size(c, mode=[0])
    n = cute.size(c, mode=[1])
    k_blocks = cute.size(a, mode=[1]) // KB_BYTES
    pipelined_kernel(tma_a, tA, tma_b1, tB1, tma_b2, tB2, tma_sa, tSA, tma_sb1, tSB1, tma_sb2, tSB2, c, tiled_mma,
                     pa, pb, sa, sb, fb, k_blocks, cfg).launch(
        grid=((m + TILE_M - 1) // TILE_M, (n + BN - 1) // BN, 1), block=(384, 1, 1), stream=stream)


@functools.lru_cache(maxsize=None)
def pipelined_host(cfg: PipelinedConfig):
    """The ``@cute.jit`` host function of ``cfg`` (static shapes: one compile per problem size)."""

    @cute.jit
    def dual_gemm_sm90_pipelined_host(a: cute.Tensor, b1: cute.Tensor, b2: cute.Tensor, sfa: cute.Tensor,
                                      sfb1: cute.Tensor, sfb2: cute.Tensor, c: cute.Tensor, stream: cuda.CUstream):
        launch_pipelined(a, b1, b2, sfa, sfb1, sfb2, c, stream, cfg)

    return dual_gemm_sm90_pipelined_host


def compile_pipelined_ptrs(target: str, cfg: PipelinedConfig | None, m: int, n: int, k: int,
                           out_stride: tuple = None):
    """The fast twin compiled through TVM-FFI with the inputs as bare pointers
    (:func:`~gemmlab.kernels.dual_gemm_sm90.compile_with_pointers`): what the public call's plan launches."""
    check_sm90_target(target)
    m, n, k = check_gated_sizes(m, n, k)
    return compile_with_pointers(target, launch_pipelined, _config(m, n, cfg), m, n, k, out_stride)


def rs_a_layouts(tile_n: int = 64) -> dict:
    """CuTe's layouts of the RS A operand for two MMA warpgroups along M (what :func:`convert_a` writes).

    ``"tv"``: (thread, value) -> ``m + 128 k`` in the 128 x 64 slice; ``"fragment"``: one thread's
    FP16 registers. Compiled for sm_90a without a GPU (a trace, nothing launched).
    """
    seen = {}

    @cute.jit
    def probe():
        tm = sm90_utils.make_trivial_tiled_mma(Float16, Float16, OperandMajorMode.K, OperandMajorMode.K, Float32,
                                               (2, 1, 1), tiler_mn=(64, tile_n),
                                               a_source=warpgroup.OperandSource.RMEM)
        seen["tv"] = str(tm.tv_layout_A_tiled)
        frag = tm.make_fragment_A(tm.get_slice(0).partition_shape_A((TILE_M, SLICE_K)))
        seen["fragment"] = str(frag.type).split('"')[1]

    from ..compile import COMPILE_LOCK

    with COMPILE_LOCK:  # one compile at a time (gemmlab.compile.COMPILE_LOCK)
        cute.compile(probe, options="--gpu-arch sm_90a")
    return seen


def _config(m: int, n: int, cfg):
    cfg = cfg or PipelinedConfig(tile_n=choose_tile_n(m, n))
    if not isinstance(cfg, PipelinedConfig):
        raise TypeError(f"cfg must be a PipelinedConfig; got {type(cfg).__name__}")
    return cfg


def compile_pipelined(target: str, cfg: PipelinedConfig | None, m: int, n: int, k: int, *, tvm_ffi: bool = False):
    """Compile the fast twin of ``cfg`` (None: :func:`~gemmlab.family.heuristic_gated.choose_tile_n`'s) for an
    M x N x K problem without a GPU (static shapes)."""
    from ..compile import compile_for, fake_stream

    check_sm90_target(target)
    m, n, k = check_gated_sizes(m, n, k)  # N a multiple of 8 too, before the DSL sees it
    cfg = _config(m, n, cfg)
    return compile_for(target, pipelined_host(cfg), *fake_operands(m, n, k), fake_stream(env=tvm_ffi),
                       tvm_ffi=tvm_ffi)


def check_compact_out(out, n: int) -> None:
    """The fast twin writes C with row stride N: ``out`` (when given) must be compact."""
    if out is not None and out[..., 0].stride(0) != n:
        raise ValueError(f"out must be compact (row stride N={n}) for the fast twin; got strides {out.stride()}")


def gated_dual_gemm_pipelined(a, b1, b2, sfa, sfb1, sfb2, out=None, cfg: PipelinedConfig | None = None):
    """``silu(A B1^T) * (A B2^T)`` in FP16 on an H100/H200 with the fast twin (arguments as the simple twin's).

    This kernel alone, with ``cfg`` forced or chosen (:func:`~gemmlab.family.heuristic_gated.choose_tile_n`),
    launched through :func:`gemmlab.compile.launcher`; :func:`gemmlab.gated_dual_gemm` runs the same kernel
    through its cached plan (:class:`gemmlab.family.plan.GatedPlan`).
    """
    import torch

    from ..compile import launcher
    from ..tiers import require_tier
    from .dual_gemm_sm90 import check_twin_arguments

    m, n, _ = check_twin_arguments(a, b1, b2, sfa, sfb1, sfb2, out)
    if cfg is not None and not isinstance(cfg, PipelinedConfig):
        raise TypeError(f"cfg must be a PipelinedConfig; got {type(cfg).__name__}")
    check_compact_out(out, n)
    cfg = _config(m, n, cfg)
    require_tier("sm90", "gemmlab.kernels.dual_gemm_sm90_pipelined.gated_dual_gemm_pipelined")
    check_devices(a, b1, b2, sfa, sfb1, sfb2, out)
    if out is None:
        out = torch.empty((m, n, 1), dtype=torch.float16, device=a.device)
    launcher(pipelined_host(cfg), *operands_2d(a, b1, b2, sfa, sfb1, sfb2, out))()
    return out
