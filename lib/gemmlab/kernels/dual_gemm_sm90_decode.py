"""Chapter 11 on Hopper, the decode twin: weights on WGMMA's M side ("swap AB"), split-K over a cluster.

What it teaches
    At decode (M <= 128 tokens) the gated dual GEMM is a weight stream: B1 and B2 are N x K
    NVFP4 (half a byte a value), the tokens' A is small. The fast twin
    (:mod:`gemmlab.kernels.dual_gemm_sm90_pipelined`) tiles 128 token rows by ``tile_n``
    weight rows; at decode that is wrong twice. Every CTA along N converts the same token
    tile in registers (N / tile_n times in all), and M = 64 pads its 128-row tile to twice
    the work. This kernel swaps the operands and converts each weight byte exactly once:

    * **Weights on the M side.** It computes the transposed tile ``D^T[n, m] = sum_k W[n, k] A[m, k]``
      for both GEMMs: WGMMA's A operand (64 rows per warpgroup) is weight rows, its N is
      the tokens padded to ``tokens`` (T, a multiple of 16 up to 128). Each MMA thread
      converts exactly its RS fragment of W1 and of W2 (rows ``g`` and ``g + 8`` of its
      warp's 16, K pairs ``2t`` and ``2t + 8``: the fast twin's :func:`load_a` /
      :func:`convert_a` positions), so every weight byte is read from shared memory and
      converted once, by the thread that multiplies it. ``acc1 += W1 x A^T`` and
      ``acc2 += W2 x A^T`` read the same FP16 token tile from shared memory.
    * **Tokens into shared memory** as FP16, in WGMMA's 128B-swizzled K-major B layout
      (T rows x 64 K per slice), by the converter warpgroup, as the fast twin converts its
      B (four FP16 buffers with ``bfull`` / ``bempty`` mbarriers). Rows past M arrive as
      zeros (TMA fills a box past the tensor's end with zeros; a zero scale times a zero
      code is +0), so the padded columns of D^T hold zeros, and no store reads them.
    * **The whole GPU at decode: split-K over a cluster.** A CTA covers ``rows`` weight rows
      (64 per MMA warpgroup) of both GEMMs and one ``split``-th of the k-blocks. The
      ``split`` CTAs of a row block are one cluster along the grid's third dimension;
      after the main loop each leaves its FP32 partial sums in its own shared memory (the
      ring's space, in fragment order: value j of MMA thread i at word ``j * threads + i``),
      a cluster barrier, then every CTA reduces a ``1 / split`` share of the fragment
      values over the cluster's CTAs (``mapa`` + ``ld.shared::cluster``: distributed
      shared memory), applies ``silu(acc1) * acc2`` in FP32 and stores FP16 to
      ``C[m, n]`` (predicated on m < M and n < N), and a second cluster barrier keeps
      every CTA's shared memory alive until its peers have read it.

What it changes relative to the fast twin, and why
    The fast twin converts its A (tokens) in the MMA warpgroups and its B (weights) in the
    converter warpgroup; here the roles swap with the operands: the weights, the big
    operand, are converted in registers where they are multiplied (no FP16 copy of the
    weights in shared memory at all), and the tokens, converted once per CTA, go to shared
    memory. The grid covers N / rows x split CTAs instead of M / 128 x N / tile_n, so a
    decode of N = 4096 spreads over 128 CTAs with ``rows = 128`` and ``split = 4``.

Limits
    M <= 128 (one token tile; larger M is the swap, A16 and W16 routes' job). Registers fit every token tile
    (an MMA thread holds two accumulators of ``tokens / 2`` FP32 registers, the W1 and W2
    fragments of two slices, 64 registers, and the next loads: no spills with 224 registers
    a thread beside a second MMA warpgroup, 256 alone). Shared memory does not: two MMA
    warpgroups take at most 112 tokens (128 tokens need 232,704 bytes at three stages, 256
    more than a block has), so ``tokens = 128`` runs with one.

Two facts of ptxas (12.x/13.0, sm_90a) the kernel is shaped by
    * The launch asks for one CTA per SM (``min_blocks_per_mp=1``: ``.minnctapersm 1``). Without
      it ptxas reports "setmaxnreg ignored; unable to determine register count at entry" (C7508)
      and holds every thread to the launch's 168 registers (384 threads).
    * The MMA warpgroups wait for slice 2's WGMMAs (``wgmma.wait_group 1``) as the last statement of
      the k-block loop's body, not as the first of the next k-block: with that wait at the top,
      ptxas serializes every WGMMA of the kernel (C7513, "non wgmma instructions defining input
      registers of a wgmma between start and end of the pipeline stage"), though no register of a
      WGMMA in flight is written. (The fast twin escapes it because each of its A fragments feeds
      two WGMMAs.)

Roles (128 threads per warpgroup; warpgroups 1 .. ``mma_warpgroups`` multiply)::

    warpgroup 0     warp 0 first: load k-block kb + stages - 2 (wait empty[s]; expect_tx(full[s]); 15 TMA boxes)
                    all 4 warps, per k-block: wait full[s]; per slice j: load A(j + 1) bytes; wait bempty[j];
                      convert A(j) into FP16 buffer j; fence.proxy.async; arrive bfull[j];
                      after the 4 slices: arrive empty[s]; split > 1: a CTA barrier, both cluster barriers
    warpgroups 1-2  per k-block: wait full[s]; per slice j >= 1: wgmma.wait_group 1 -> arrive bempty[(j - 2) % 4]
                      -> convert W1(j) while W2(j) loads, W2(j) while W1(j + 1) loads (last: arrive empty[s])
                      -> wait bfull[j] -> wgmma.fence; 4 x (acc1 += W1 A^T, acc2 += W2 A^T); commit
                    end of the k-block: wgmma.wait_group 1 -> arrive bempty[2]
                    split = 1: wait 0; silu(acc1) * acc2 -> FP16 -> C^T (predicated)
                    split > 1: wait 0; CTA barrier (the converter's writes are done); partials -> own shared memory;
                      cluster barrier; reduce this CTA's share over the cluster (ld.shared::cluster)
                      -> gate -> C^T; cluster barrier
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
from ..async_copy import mapa_shared_cluster
from ..family.configs import DECODE_LOAD_LAG as LOAD_LAG, DECODE_MAX_TOKENS as MAX_TOKENS, DECODE_WG_ROWS as WG_ROWS
from ..family.configs import KB_BYTES, SF_BYTES, SLICE_K, SLICES, DecodeConfig
from ..family.heuristic_gated import choose_decode_config
from ..family.problem import check_gated_sizes
from ..ldst import ld_shared_b32, ld_shared_v2, ld_shared_v4
from .dual_gemm_sm90 import (check_devices, check_sm90_target, compile_with_pointers, fake_operands, operands_2d,
                             with_runtime_rows)
from .dual_gemm_sm90_pipelined import convert_a, convert_unit

SLICE_BYTES = SLICE_K // 2  #: packed bytes of a slice per row
CONVERTER_THREADS = 128
#: setmaxnreg per role, by MMA warpgroups: (converter, MMA). setmaxnreg only moves registers the CTA started with:
#: 128 x (converter + w x MMA) must not exceed threads x the entry count (384 x 168 = 64,512 with two MMA
#: warpgroups). (64, 224) asked for 65,536 and hung on an H200 (the MMA warps waited forever in setmaxnreg.inc);
#: the emulator has no register pool, so it cannot see this.
REGS = {1: (96, 256), 2: (64, 216)}  #: 256 x 255 and 384 x 168 at entry


# --------------------------------------------------------------------------------------
# PTX wrappers: distributed shared memory
# --------------------------------------------------------------------------------------


def ld_shared_cluster_f32(addr):
    """``ld.shared::cluster.f32``: one FP32 word at a ``shared::cluster`` address (from ``mapa``)."""
    return cute.arch.inline_ptx("ld.shared::cluster.f32 {$w0}, [{$r0}];", write_only_types=[Float32],
                                read_only_args=[addr])


def st_shared_f32(ptr, value):
    """``st.shared.f32``: one FP32 word to our own shared memory."""
    cute.arch.inline_ptx("st.shared.f32 [{$r0}], {$r1};", read_only_args=[ptr, value])


# --------------------------------------------------------------------------------------
# Dequantization
# --------------------------------------------------------------------------------------


@cute.jit
def load_w(pW, sW, row: Int32, sl: cutlass.Constexpr, rows: cutlass.Constexpr):
    """Shared-memory loads for one weight row of slice ``sl``: its 32 packed bytes (8 words) and 4 scales.

    ``pW``/``sW``: one matrix's packed bytes (slice-major: ``sl * rows * 32 + row * 32``) and scales
    (row-major, 16 a row) in the current stage. What :func:`~.dual_gemm_sm90_pipelined.convert_a` takes.
    """
    base = pW + (sl * rows * SLICE_BYTES + row * SLICE_BYTES)
    w0, w1, w2, w3 = ld_shared_v4(base)
    w4, w5, w6, w7 = ld_shared_v4(base + 16)
    sw = ld_shared_b32(sW + (row * SF_BYTES + sl * 4))
    return w0, w1, w2, w3, w4, w5, w6, w7, sw


@cute.jit
def load_x(pX, sX, unit: Int32, sl: cutlass.Constexpr, tokens: cutlass.Constexpr):
    """Shared-memory loads for one unit of a token slice: 8 packed bytes (16 values) and the row's scale word.

    A unit is row ``unit // 4``, bytes ``8 (unit % 4)`` onwards of the slice row (slice-major packing).
    """
    row = unit // 4
    x0, x1 = ld_shared_v2(pX + (sl * tokens * SLICE_BYTES + row * SLICE_BYTES + (unit % 4) * 8))
    sw = ld_shared_b32(sX + (row * SF_BYTES + sl * 4))
    return x0, x1, sw


def x_unit(tidx, i: int, units: int):
    """The unit converter thread ``tidx`` loads in round ``i``; in a partial last round (``units % 128``) the
    spare threads load the last unit again (and store nothing)."""
    unit = tidx + i * CONVERTER_THREADS
    if (i + 1) * CONVERTER_THREADS <= units:
        return unit
    return cutlass.min(unit, units - 1)


@cute.jit
def convert_x(fX, loaded, unit: Int32, buf: cutlass.Constexpr, tokens: cutlass.Constexpr):
    """One unit of :func:`load_x` to FP16 in buffer ``buf``: two 16-byte chunks of a 128B-swizzled row
    (chunk c of row r at chunk ``c ^ (r % 8)``: WGMMA's K-major B layout)."""
    convert_unit(fX + (buf * tokens * 128 + (unit // 4) * 128), loaded, unit)


@cute.jit
def load_stage(copies, full, kb: Int32, stage: Int32, stage_bytes: cutlass.Constexpr):
    """One k-block (global index ``kb``) of packed W1, W2, A and their scales into ring stage ``stage``."""
    with cute.arch.elect_one():
        cute.arch.mbarrier_arrive_and_expect_tx(full + stage, stage_bytes)
    for atom, src, dst, tile in copies:
        cute.copy(atom, src[(None, tile, kb)], dst[(None, stage)], tma_bar_ptr=full + stage)


@cute.jit
def gate(x: Float32, y: Float32) -> Float32:
    """``silu(x) * y`` in FP32."""
    return x / (Float32(1.0) + cute.math.exp(-x, fastmath=True)) * y


@cute.jit
def k_share(kz, k_blocks, split: cutlass.Constexpr):
    """Split-K: the k-blocks ``[kb0, kb0 + nkb)`` of the ``kz``-th of ``split`` CTAs (a share may be empty when K is
    short). Returns ``(kb0, nkb)``."""
    kb0 = (kz * k_blocks) // split
    return kb0, ((kz + 1) * k_blocks) // split - kb0


@cute.jit
def mma_thread(tiled_mma, ctid, warp, rows: cutlass.Constexpr, tokens: cutlass.Constexpr):
    """An MMA thread's state: its MMA slice, the selector and first weight row its fragments load with (rows ``g``
    and ``g + 8`` of its warp's 16; ``warp`` counts from the first MMA warp's 4), two slices' W1 and W2 fragments
    (and their 32-bit views, which the conversion writes) and both accumulators, zeroed, with ACCUMULATE set.
    Returns ``(thr_mma, selector, row0, frag1, frag2, fw1, fw2, acc1, acc2, k_steps)``."""
    lane = cute.arch.lane_idx()
    g = lane // 4
    t = lane % 4
    selector = t | ((t + 4) << 4)
    row0 = (warp - 4) * 16 + g
    thr_mma = tiled_mma.get_slice(ctid)
    frag1 = [tiled_mma.make_fragment_A(thr_mma.partition_shape_A((rows, SLICE_K))) for _ in range(2)]
    frag2 = [tiled_mma.make_fragment_A(thr_mma.partition_shape_A((rows, SLICE_K))) for _ in range(2)]
    fw1 = [cute.recast_tensor(f, Uint32) for f in frag1]
    fw2 = [cute.recast_tensor(f, Uint32) for f in frag2]
    acc1 = cute.make_rmem_tensor(tiled_mma.partition_shape_C((rows, tokens)), Float32)
    acc2 = cute.make_rmem_tensor(tiled_mma.partition_shape_C((rows, tokens)), Float32)
    acc1.fill(0.0)
    acc2.fill(0.0)
    tiled_mma.set(warpgroup.Field.ACCUMULATE, True)
    return thr_mma, selector, row0, frag1, frag2, fw1, fw2, acc1, acc2, cute.size(frag1[0], mode=[2])


@cute.jit
def enter_stage(full, pw_base, sw_base, kb, row0, stages: cutlass.Constexpr, rows: cutlass.Constexpr):
    """An MMA thread's start of k-block ``kb``: wait for its ring stage, then load slice 0's W1 bytes (the first half
    of :func:`convert_slice`'s pipeline). Returns ``(stage, stage_w, stage_sw, cur)``: the stage, its packed weights and
    scales, and the loads."""
    stage = kb % stages
    cute.arch.mbarrier_wait(full + stage, (kb // stages) & 1)
    stage_w = pw_base + stage * (2 * rows * KB_BYTES)
    stage_sw = sw_base + stage * (2 * rows * SF_BYTES)
    return stage, stage_w, stage_sw, (load_w(stage_w, stage_sw, row0, 0, rows), load_w(stage_w, stage_sw, row0 + 8,
                                                                                      0, rows))


@cute.jit
def convert_slice(fw1, fw2, cur, stage_w, stage_sw, row0, selector, sl: cutlass.Constexpr, rows: cutlass.Constexpr):
    """An MMA thread's W1 and W2 fragments of slice ``sl`` (rows ``row0`` and ``row0 + 8``) from ring stage
    ``stage_w`` / ``stage_sw``, half a slice ahead: W1(j) converts while W2(j) loads, W2(j) while W1(j + 1) loads.
    ``cur``: W1(j)'s loads; returns W1(j + 1)'s (on the last slice, W2(j)'s, unused). Into fragments ``j % 2``."""
    w2 = stage_w + rows * KB_BYTES
    s2 = stage_sw + rows * SF_BYTES
    nxt = (load_w(w2, s2, row0, sl, rows), load_w(w2, s2, row0 + 8, sl, rows))
    convert_a(fw1[sl % 2], cur[0], selector, 0)
    convert_a(fw1[sl % 2], cur[1], selector, 1)
    cur = nxt
    if cutlass.const_expr(sl + 1 < SLICES):
        nxt = (load_w(stage_w, stage_sw, row0, sl + 1, rows), load_w(stage_w, stage_sw, row0 + 8, sl + 1, rows))
    convert_a(fw2[sl % 2], cur[0], selector, 0)
    convert_a(fw2[sl % 2], cur[1], selector, 1)
    return nxt


@cute.jit
def mma_slice(tiled_mma, acc1, acc2, frag1, frag2, tCrX, buf, k_steps: cutlass.Constexpr):
    """One slice's WGMMAs: ``acc1 += W1 x A^T``, ``acc2 += W2 x A^T`` over its ``k_steps`` K16 steps, A^T being token
    buffer ``buf`` of ``tCrX``."""
    for ks in cutlass.range_constexpr(k_steps):
        cute.gemm(tiled_mma, acc1, frag1[(None, None, ks)], tCrX[(None, None, ks, buf)], acc1)
        cute.gemm(tiled_mma, acc2, frag2[(None, None, ks)], tCrX[(None, None, ks, buf)], acc2)


@cute.jit
def store_partials(part, acc1, acc2, ctid, threads: cutlass.Constexpr):
    """Split-K: both accumulators' FP32 values into our shared memory at ``part``, in fragment order (value j of MMA
    thread i at word ``j threads + i``; acc2's after acc1's)."""
    V = cute.size(acc1)
    for j in cutlass.range(V, unroll_full=True):
        st_shared_f32(part + (j * threads + ctid), acc1[j])
        st_shared_f32(part + ((V + j) * threads + ctid), acc2[j])


@cute.jit
def exchange_partials(base, acc1, acc2, ctid, threads: cutlass.Constexpr, split: cutlass.Constexpr):
    """Split-K, after the main loop: a CTA barrier (every write into the ring and every WGMMA read of it done), both
    accumulators into our shared memory at ``base`` (:func:`store_partials`), a cluster barrier (every CTA's too).
    Returns ``(rank, share, peers)``: our rank in the cluster, the fragment values each CTA reduces, and every CTA's
    partials for this thread as ``shared::cluster`` addresses (for :func:`reduce_value`)."""
    cute.arch.sync_threads()
    part = cute.recast_ptr(base, dtype=Float32)
    store_partials(part, acc1, acc2, ctid, threads)
    cute.arch.cluster_arrive()
    cute.arch.cluster_wait()
    rank = cute.arch.block_idx_in_cluster()
    return rank, cute.size(acc1) // split, [mapa_shared_cluster(part + ctid, r) for r in range(split)]


@cute.jit
def follow_exchange():
    """Split-K, in the warpgroup that does not multiply: the barriers :func:`exchange_partials` and the final cluster
    barrier count (every thread of the CTA, every thread of the cluster), taken part in rather than left to exited
    threads: the CTA barrier, the cluster barrier before the reduction, the one after it."""
    cute.arch.sync_threads()
    cute.arch.cluster_arrive()
    cute.arch.cluster_wait()
    cute.arch.cluster_arrive()
    cute.arch.cluster_wait()


@cute.jit
def reduce_value(peers, j, values: cutlass.Constexpr, threads: cutlass.Constexpr, split: cutlass.Constexpr):
    """Split-K: value ``j`` of both accumulators summed over the cluster's CTAs (``peers``: each CTA's ``part + ctid``
    as a ``shared::cluster`` address; ``values`` per thread and accumulator)."""
    x = Float32(0.0)
    y = Float32(0.0)
    for r in cutlass.range_constexpr(split):
        x = x + ld_shared_cluster_f32(peers[r] + j * (threads * 4))
        y = y + ld_shared_cluster_f32(peers[r] + (values + j) * (threads * 4))
    return x, y


# --------------------------------------------------------------------------------------
# The kernel
# --------------------------------------------------------------------------------------


@cute.kernel
def decode_kernel(
    tma_w1: cute.CopyAtom, mW1: cute.Tensor, tma_w2: cute.CopyAtom, mW2: cute.Tensor,
    tma_x: cute.CopyAtom, mX: cute.Tensor, tma_sw1: cute.CopyAtom, mSW1: cute.Tensor,
    tma_sw2: cute.CopyAtom, mSW2: cute.Tensor, tma_sx: cute.CopyAtom, mSX: cute.Tensor,
    mCt: cute.Tensor, tiled_mma: cute.TiledMma,
    pw_layout: cute.Layout, px_layout: cute.Layout, sw_layout: cute.Layout, sx_layout: cute.Layout,
    fx_layout: cute.ComposedLayout, k_blocks: Int32, cfg: cutlass.Constexpr,
):
    R = cfg.rows
    T = cfg.tokens
    S = cfg.stages
    SPLIT = cfg.split
    MT = cfg.mma_warpgroups * 128  # MMA threads
    tidx, _, _ = cute.arch.thread_idx()
    warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
    wg = warp // 4
    n_blk, _, kz = cute.arch.block_idx()
    kb0, nkb = k_share(kz, k_blocks, SPLIT)  # this CTA's k-blocks

    smem = SmemAllocator()
    region = max(cfg.buffer_bytes() + S * cfg.stage_bytes(), cfg.partial_bytes())
    raw = smem.allocate_tensor(Uint8, cute.make_layout(region), byte_alignment=1024)
    full = smem.allocate_array(Int64, S, byte_alignment=8)
    empty = smem.allocate_array(Int64, S, byte_alignment=8)
    bfull = smem.allocate_array(Int64, SLICES, byte_alignment=8)  # FP16 token buffer written (converter warps)
    bempty = smem.allocate_array(Int64, SLICES, byte_alignment=8)  # FP16 token buffer read by the WGMMAs

    # carve the region: FP16 buffers, packed weights (W1 then W2 per stage), packed tokens, their scales
    fRaw = raw.iterator
    pWRaw = fRaw + cfg.buffer_bytes()
    pXRaw = pWRaw + S * 2 * R * KB_BYTES
    sWRaw = pXRaw + S * T * KB_BYTES
    sXRaw = sWRaw + S * 2 * R * SF_BYTES
    pW1 = cute.make_tensor(pWRaw, pw_layout)
    pW2 = cute.make_tensor(pWRaw + R * KB_BYTES, pw_layout)
    pX = cute.make_tensor(pXRaw, px_layout)
    sW1 = cute.make_tensor(sWRaw, sw_layout)
    sW2 = cute.make_tensor(sWRaw + R * SF_BYTES, sw_layout)
    sX = cute.make_tensor(sXRaw, sx_layout)

    if warp == 0:
        for atom in (tma_w1, tma_w2, tma_x, tma_sw1, tma_sw2, tma_sx):
            cpasync.prefetch_descriptor(atom)
        with cute.arch.elect_one():
            for s in cutlass.range_constexpr(S):
                cute.arch.mbarrier_init(full + s, 1)
                cute.arch.mbarrier_init(empty + s, 4 + 4 * cfg.mma_warpgroups)  # every warp that reads stage s
            for b in cutlass.range_constexpr(SLICES):
                cute.arch.mbarrier_init(bfull + b, 4)
                cute.arch.mbarrier_init(bempty + b, 4 * cfg.mma_warpgroups)
            cute.arch.mbarrier_init_fence()
    cute.arch.sync_threads()

    copies = decode_copies(((tma_w1, mW1, pW1), (tma_w2, mW2, pW2), (tma_x, mX, pX), (tma_sw1, mSW1, sW1),
                            (tma_sw2, mSW2, sW2), (tma_sx, mSX, sX)), R, T, n_blk)

    if wg == 0:
        # ============================================================ converter: tokens to FP16; warp 0 loads
        cute.arch.warpgroup_reg_dealloc(REGS[cfg.mma_warpgroups][0])
        lane = cute.arch.lane_idx()
        units = T * (SLICE_BYTES // 8)  # 8-byte units of a token slice
        per = (units + CONVERTER_THREADS - 1) // CONVERTER_THREADS
        ahead = S - LOAD_LAG  # k-blocks loaded ahead: stage kb - 2 is long released when k-block kb starts
        if warp == 0:
            for i in cutlass.range_constexpr(S - LOAD_LAG):
                if i < nkb:
                    cute.arch.mbarrier_wait(empty + i, 1)
                    load_stage(copies, full, kb0 + i, Int32(i), cfg.stage_bytes())
        for kb in cutlass.range(nkb, unroll=1):
            if warp == 0:
                nxt = kb + ahead
                if nxt < nkb:
                    cute.arch.mbarrier_wait(empty + nxt % S, ((nxt // S) & 1) ^ 1)
                    load_stage(copies, full, kb0 + nxt, nxt % S, cfg.stage_bytes())
            stage = kb % S
            cute.arch.mbarrier_wait(full + stage, (kb // S) & 1)
            stage_x = pXRaw + stage * (T * KB_BYTES)
            stage_sx = sXRaw + stage * (T * SF_BYTES)
            loaded = [load_x(stage_x, stage_sx, x_unit(tidx, i, units), 0, T) for i in range(per)]
            for sl in cutlass.range_constexpr(SLICES):
                cute.arch.mbarrier_wait(bempty + sl, (kb & 1) ^ 1)  # the WGMMAs of k-block kb - 1 read it
                nxt = loaded
                if cutlass.const_expr(sl + 1 < SLICES):  # the next slice's loads overlap this one's conversion
                    nxt = [load_x(stage_x, stage_sx, x_unit(tidx, i, units), sl + 1, T) for i in range(per)]
                for i in cutlass.range_constexpr(per):
                    if cutlass.const_expr((i + 1) * CONVERTER_THREADS <= units):
                        convert_x(fRaw, loaded[i], tidx + i * CONVERTER_THREADS, sl, T)
                    else:
                        if tidx + i * CONVERTER_THREADS < units:
                            convert_x(fRaw, loaded[i], tidx + i * CONVERTER_THREADS, sl, T)
                loaded = nxt
                cute.arch.fence_proxy("async.shared", space="cta")
                cute.arch.sync_warp()
                if lane == 0:
                    cute.arch.mbarrier_arrive(bfull + sl)
            if lane == 0:
                cute.arch.mbarrier_arrive(empty + stage)
        if cutlass.const_expr(SPLIT > 1):
            # every FP16 buffer write of ours is done before the MMA warpgroups write their partials over the buffers
            # (the mbarriers already order them; the CTA barrier makes it plain, and compute-sanitizer's racecheck
            # sees it)
            follow_exchange()
    else:
        # ============================================================ MMA warpgroups: weights into registers
        cute.arch.warpgroup_reg_alloc(REGS[cfg.mma_warpgroups][1])
        ctid = tidx - CONVERTER_THREADS
        lane = cute.arch.lane_idx()
        thr_mma, selector, row0, frag1, frag2, fw1, fw2, acc1, acc2, k_steps = mma_thread(tiled_mma, ctid, warp, R, T)
        fX = cute.make_tensor(cute.recast_ptr(fRaw, fx_layout.inner, Float16), fx_layout.outer)
        tCrX = tiled_mma.make_fragment_B(thr_mma.partition_B(fX))

        for kb in cutlass.range(nkb, unroll=1):
            # half-slice pipeline: W1(j) converts while W2(j) loads, W2(j) while W1(j + 1) loads
            stage, stage_w, stage_sw, cur = enter_stage(full, pWRaw, sWRaw, kb, row0, S, R)
            for sl in cutlass.range_constexpr(SLICES):
                # this warpgroup's WGMMAs of slice j - 2 are done: fragments j % 2 and buffer (j - 2) % 4 free
                # (slice 0's wait is the previous k-block's last statement)
                if cutlass.const_expr(sl >= 2):
                    warpgroup.wait_group(1)
                    if lane == 0:
                        cute.arch.mbarrier_arrive(bempty + (sl - 2))
                elif cutlass.const_expr(sl == 1):
                    warpgroup.wait_group(1)
                    if kb > 0:
                        if lane == 0:
                            cute.arch.mbarrier_arrive(bempty + 3)
                cur = convert_slice(fw1, fw2, cur, stage_w, stage_sw, row0, selector, sl, R)
                if cutlass.const_expr(sl == SLICES - 1):
                    cute.arch.sync_warp()
                    if lane == 0:
                        cute.arch.mbarrier_arrive(empty + stage)  # this warp has read stage s's weights
                cute.arch.mbarrier_wait(bfull + sl, kb & 1)
                warpgroup.fence()
                mma_slice(tiled_mma, acc1, acc2, frag1[sl % 2], frag2[sl % 2], tCrX, sl, k_steps)
                warpgroup.commit_group()
            # slice 2's WGMMAs are done: buffer 2 free, fragments 0 free for the next k-block's slice 0. Waiting here,
            # inside the loop body, and not at the top of the next k-block keeps ptxas from serializing every WGMMA
            # (C7513: with the wait at the top, ptxas sees the last group of the body still open across the back edge)
            warpgroup.wait_group(1)
            if lane == 0:
                cute.arch.mbarrier_arrive(bempty + 2)
        warpgroup.wait_group(0)

        # ---- epilogue: accumulator row r, column c is C[m = c, n = n_blk R + r]; mCt is C^T (N, M)
        shape = (cute.size(mCt, mode=[0]), cute.size(mCt, mode=[1]))
        tCgC = thr_mma.partition_C(cute.local_tile(mCt, (R, T), (n_blk, 0)))
        tCcC = thr_mma.partition_C(cute.local_tile(cute.make_identity_tensor(shape), (R, T), (n_blk, 0)))
        if cutlass.const_expr(SPLIT == 1):
            for i in cutlass.range(cute.size(acc1), unroll_full=True):
                if cute.elem_less(tCcC[i], shape):
                    tCgC[i] = gate(acc1[i], acc2[i]).to(Float16)
        else:
            # the CTA barrier first: the converter's last FP16 writes and the other MMA warpgroup's last reads of the
            # ring and the buffers come before the partials overwrite them
            rank, share, peers = exchange_partials(fRaw, acc1, acc2, ctid, MT, SPLIT)
            for jj in cutlass.range_constexpr(share):
                j = rank * share + jj
                x, y = reduce_value(peers, j, cute.size(acc1), MT, SPLIT)
                if cute.elem_less(tCcC[j], shape):
                    tCgC[j] = gate(x, y).to(Float16)
            # our shared memory must outlive the peers' reads of it
            cute.arch.cluster_arrive()
            cute.arch.cluster_wait()


# --------------------------------------------------------------------------------------
# Host side
# --------------------------------------------------------------------------------------


@cute.jit
def decode_copies(operands, rows: cutlass.Constexpr, tokens: cutlass.Constexpr, n_blk):
    """The six loads of a k-block, as ``(atom, global k-block tiles, shared stages, tile index)``.

    ``operands``: ``(atom, global tensor, shared staged tensor)`` for W1, W2, A, SW1, SW2, SA; the weights'
    tiles follow the CTA's row block ``n_blk``, the tokens' tile is the one tile of ``tokens`` rows.
    """
    out = []
    for i, (atom, gl, s) in enumerate(operands):
        box_rows = tokens if i % 3 == 2 else rows
        width = KB_BYTES if i < 3 else SF_BYTES
        tiles = cute.local_tile(gl, (box_rows, width), (None, None))
        dst, src = cpasync.tma_partition(atom, 0, cute.make_layout(1), cute.group_modes(s, 0, 2),
                                         cute.group_modes(tiles, 0, 2))
        out.append((atom, src, dst, 0 if i % 3 == 2 else n_blk))
    return tuple(out)


def smem_layouts(cfg: DecodeConfig):
    """Per-stage TMA layouts of the ring (packed weights and tokens slice-major, scales row-major; W2 after W1 in
    every stage) and the FP16 token buffers (WGMMA's 128B-swizzled K-major B, one slice per buffer)."""
    R, T, S = cfg.rows, cfg.tokens, cfg.stages
    pw = cute.make_layout((R, (SLICE_BYTES, SLICES), S), stride=(SLICE_BYTES, (1, R * SLICE_BYTES), 2 * R * KB_BYTES))
    px = cute.make_layout((T, (SLICE_BYTES, SLICES), S), stride=(SLICE_BYTES, (1, T * SLICE_BYTES), T * KB_BYTES))
    sw = cute.make_layout((R, SF_BYTES, S), stride=(SF_BYTES, 1, 2 * R * SF_BYTES))
    sx = cute.make_layout((T, SF_BYTES, S), stride=(SF_BYTES, 1, T * SF_BYTES))
    fx = sm90_utils.make_smem_layout_b(LayoutEnum.ROW_MAJOR, (R, T, SLICE_K), Float16, SLICES)
    return pw, px, sw, sx, fx


@cute.jit
def launch_decode(a: cute.Tensor, b1: cute.Tensor, b2: cute.Tensor, sfa: cute.Tensor, sfb1: cute.Tensor,
                  sfb2: cute.Tensor, c: cute.Tensor, stream: cuda.CUstream, cfg: cutlass.Constexpr):
    """Views, TMA descriptors and the launch of C = silu(A B1^T) * (A B2^T) with the weights on WGMMA's M side."""
    R, T = cfg.rows, cfg.tokens
    tiled_mma = sm90_utils.make_trivial_tiled_mma(Float16, Float16, OperandMajorMode.K, OperandMajorMode.K, Float32,
                                                  (cfg.mma_warpgroups, 1, 1), tiler_mn=(WG_ROWS, T),
                                                  a_source=warpgroup.OperandSource.RMEM)
    pw, px, sw, sx, fx = smem_layouts(cfg)
    g2s = cpasync.CopyBulkTensorTileG2SOp()
    m = cute.size(c, mode=[0])
    n = cute.size(c, mode=[1])
    # the tokens' row extent as a run-time value, at every M (M = 1 would lose A's and SFA's row coordinate)
    a_bytes = cute.size(a, mode=[1])
    a, sfa = with_runtime_rows(a, m), with_runtime_rows(sfa, m)
    atoms = []
    for i, tns in enumerate((b1, b2, a, sfb1, sfb2, sfa)):
        layout = (pw, pw, px, sw, sw, sx)[i]
        box_rows = T if i % 3 == 2 else R
        width = KB_BYTES if i < 3 else SF_BYTES
        atoms.append(cpasync.make_tiled_tma_atom(g2s, tns, cute.slice_(layout, (None, None, 0)), (box_rows, width)))
    (tma_w1, tW1), (tma_w2, tW2), (tma_x, tX), (tma_sw1, tSW1), (tma_sw2, tSW2), (tma_sx, tSX) = atoms
    ct = cute.make_tensor(c.iterator, cute.make_layout((n, m), stride=(1, n)))  # C^T: the accumulators' view
    k_blocks = a_bytes // KB_BYTES
    kernel = decode_kernel(tma_w1, tW1, tma_w2, tW2, tma_x, tX, tma_sw1, tSW1, tma_sw2, tSW2, tma_sx, tSX, ct,
                           tiled_mma, pw, px, sw, sx, fx, k_blocks, cfg)
    grid = ((n + R - 1) // R, 1, cfg.split)
    # one CTA per SM (.minnctapersm 1): ptxas then knows the register count at entry and honours setmaxnreg
    if cutlass.const_expr(cfg.split == 1):
        kernel.launch(grid=grid, block=(cfg.threads, 1, 1), min_blocks_per_mp=1, stream=stream)
    else:
        kernel.launch(grid=grid, block=(cfg.threads, 1, 1), cluster=(1, 1, cfg.split), min_blocks_per_mp=1,
                      stream=stream)


@functools.lru_cache(maxsize=None)
def decode_host(cfg: DecodeConfig):
    """The ``@cute.jit`` host function of ``cfg`` (static shapes: one compile per problem size)."""

    @cute.jit
    def dual_gemm_sm90_decode_host(a: cute.Tensor, b1: cute.Tensor, b2: cute.Tensor, sfa: cute.Tensor,
                                   sfb1: cute.Tensor, sfb2: cute.Tensor, c: cute.Tensor, stream: cuda.CUstream):
        launch_decode(a, b1, b2, sfa, sfb1, sfb2, c, stream, cfg)

    return dual_gemm_sm90_decode_host


def check_decode_m(m: int) -> int:
    """The decode twin takes one token tile: M <= 128."""
    if m > MAX_TOKENS:
        raise ValueError(f"M must be <= {MAX_TOKENS} for the decode twin (one token tile; larger M is the swap, "
                         f"A16 and W16 routes', gemmlab.gated_dual_gemm chooses); got M={m}")
    return m


def _config(m: int, n: int, k: int, cfg):
    if cfg is None:
        return choose_decode_config(m, n, k)
    if not isinstance(cfg, DecodeConfig):
        raise TypeError(f"cfg must be a DecodeConfig; got {type(cfg).__name__}")
    if m > cfg.tokens:
        raise ValueError(f"M must be <= cfg.tokens ({cfg.tokens}: the token tile); got M={m}")
    return cfg


def compile_decode(target: str, cfg: DecodeConfig | None, m: int, n: int, k: int):
    """Compile the decode twin of ``cfg`` (None: :func:`choose_decode_config`'s) for an M x N x K problem without
    a GPU (static shapes); every argument is checked before the DSL sees it."""
    from ..compile import compile_for, fake_stream

    check_sm90_target(target)
    m, n, k = check_gated_sizes(m, n, k)  # N a multiple of 8 too
    check_decode_m(m)
    cfg = _config(m, n, k, cfg)
    return compile_for(target, decode_host(cfg), *fake_operands(m, n, k), fake_stream())


def compile_decode_ptrs(target: str, cfg: DecodeConfig | None, m: int, n: int, k: int, out_stride: tuple = None):
    """The decode twin compiled through TVM-FFI with the inputs as bare pointers
    (:func:`~gemmlab.kernels.dual_gemm_sm90.compile_with_pointers`): what the public call's plan launches."""
    check_sm90_target(target)
    m, n, k = check_gated_sizes(m, n, k)
    check_decode_m(m)
    return compile_with_pointers(target, launch_decode, _config(m, n, k, cfg), m, n, k, out_stride)


def gated_dual_gemm_decode(a, b1, b2, sfa, sfb1, sfb2, out=None, cfg: DecodeConfig | None = None):
    """``silu(A B1^T) * (A B2^T)`` in FP16 on an H100/H200 with the decode twin, M <= 128 (arguments as the
    simple twin's; ``cfg`` forced or :func:`choose_decode_config`'s), launched through
    :func:`gemmlab.compile.launcher`."""
    import torch

    from ..compile import launcher
    from ..tiers import require_tier
    from .dual_gemm_sm90 import check_twin_arguments
    from .dual_gemm_sm90_pipelined import check_compact_out

    m, n, k = check_twin_arguments(a, b1, b2, sfa, sfb1, sfb2, out)
    check_decode_m(m)
    check_compact_out(out, n)
    cfg = _config(m, n, k, cfg)
    require_tier("sm90", "gemmlab.kernels.dual_gemm_sm90_decode.gated_dual_gemm_decode")
    check_devices(a, b1, b2, sfa, sfb1, sfb2, out)
    if out is None:
        out = torch.empty((m, n, 1), dtype=torch.float16, device=a.device)
    launcher(decode_host(cfg), *operands_2d(a, b1, b2, sfa, sfb1, sfb2, out))()
    return out
