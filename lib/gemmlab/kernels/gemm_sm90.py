"""Chapter 07: the persistent, warp-specialized Hopper GEMM (the production kernel).

What it adds over chapter 06
    Chapter 06 built the first TMA + WGMMA GEMM: one CTA per output tile, one
    consumer warpgroup, a k-loop fed by a TMA ring. This kernel keeps that
    core and adds what the fast Hopper GEMMs (CUTLASS, DeepGEMM) add:

    * **Warp specialization with register reallocation.** Warpgroup 0 is the
      *producer*: one warp issues every TMA load. The other warpgroups (one,
      two or three: ``tile_m`` = 64, 128 or 192) are the *consumers*: each owns
      64 rows of the tile and runs WGMMA. The producer needs almost no registers,
      so ``setmaxnreg`` gives 40 of its per-thread registers back and the
      consumers take 232: room for a 64 x 256 FP32 accumulator (128 registers
      per thread); three consumers share what is left, 152 each, so their
      tiles are at most 192 wide (96 accumulator registers). With
      ``wg_rows = 128`` one consumer owns a whole 128-row tile: it issues two
      64-row WGMMAs a k-step into two accumulators (``tile_n`` registers a
      thread, so at most 192 wide) and stores the two slabs in turn
      (:func:`slab_views`). Where the heuristic picks it, it ran up to 6.5 %
      faster than two warpgroups of 64 rows (chapter 07, section 5). With
      ``pingpong`` two such warpgroups take the CTA's tiles in turn: each
      skips the other's ring stages (:func:`skipped`), and two more mbarriers
      (``turn``) start a warpgroup's main loop only once the other's has
      consumed its tile, so one stores while the other computes. Correct on
      an H200 (tests and compute-sanitizer, 2026-11-28), but no faster than
      the picks on the large shapes timed there (0.90x at 4096 x 4096 x 7168
      against 128 x 256 tiles): the heuristic does not pick it.
    * **A persistent grid.** One CTA per SM (one cluster per SM pair); each
      walks work units ``cluster, cluster + num_clusters, ...`` in the grouped
      order of :class:`gemmlab.scheduler.TileScheduler`.
    * **One pipeline across all tiles.** The ring of ``stages`` shared-memory
      stages (``full`` / ``empty`` mbarriers) is walked with
      :class:`gemmlab.pipeline.DevicePipelineState`, created once and never
      reset: the producer runs ahead into the next tile's k-blocks while the
      consumers still finish the current one.
    * **Clusters with TMA multicast.** Two CTAs of a cluster compute
      neighbouring tiles that share an operand panel. Each loads half of the
      shared panel and multicasts it to both, halving that operand's L2 -> SM
      traffic. A consumer then frees a stage in *both* CTAs (a remote mbarrier
      arrive), because the peer's producer writes into its shared memory.
      The kernel also runs 2-D clusters of 4 and 8 CTAs (``cluster`` (2, 2),
      (4, 1), (1, 4), (4, 2), (2, 4); rank = rank_m + CM x rank_n): each CTA
      loads 1 / CN of its A' panel for the CN CTAs of its cluster column and
      1 / CM of its B' panel for the CM of its row (masks ``a_mask`` and
      ``b_mask``), and frees each stage in every CTA of the cluster. Correct
      on an H200 (GPU tests, compute-sanitizer, the emulator), but no faster
      than the pairs on the 16 weakest shapes of the families (2026-12-02,
      ``results/nvidia-h200/gemm_family_clusters.json``), and a GH100 runs
      only 30 clusters of 4 or 15 of 8 at once (120 of its 132 SMs): the
      heuristic keeps to pairs.
    * **A TMA-store epilogue that overlaps the next tile.** Each consumer
      warpgroup converts its 64 rows to BF16/FP16, writes them with
      ``stmatrix`` into its own ring of shared-memory sub-tiles and stores them
      by TMA, meeting only its own 128 threads at a named barrier. It waits for a
      sub-tile buffer to be *read* before reusing it, so a tile's last stores
      drain while the next tile's k-loop already runs.

    And, for the shapes real models use (the heuristic in
    :mod:`gemmlab.family.heuristic_sm90` picks among them):

    * **Sizes at run time.** M, N, K are arguments of the compiled kernel, not
      constants baked into it: one compiled kernel per configuration serves
      every problem size, and a call only binds tensors (see
      :mod:`gemmlab.family.plan`).
    * **Swap A/B** (host-side views, no copies): ``C^T = B^T A^T``, so a small M
      (a decode batch) becomes WGMMA's N, which may be any multiple of 8, while
      the weight fills the 64-row M side. The output is then written M-major
      (the TMA store and ``stmatrix ... .trans`` handle it).
    * **Split-K in one launch.** When the output has too few tiles to fill the
      SMs, K is cut into ``splits`` slices and each (tile, slice) is a work
      unit. A unit writes its FP32 accumulator fragment to a workspace as the
      registers hold it and counts itself on the tile's counter; the unit that
      arrives last adds all slices in split order (the same bits whatever the
      arrival order), resets the counter and runs the normal epilogue. Nothing
      waits for another CTA (:mod:`gemmlab.splitk` has the protocol).
    * **Whole waves, then a split tail.** A grid of more tiles than clusters
      (296 tiles on 132 SMs: two full waves, then 32 tiles for 132 SMs) splits
      only the partial last wave. The first ``dp_tiles`` units are whole tiles
      (all of K, the normal epilogue, no workspace: the data-parallel waves);
      the other tiles' slices follow, and only they use the workspace and the
      counters, indexed by the tail tile (``tile - dp_tiles``). ``dp_tiles`` is
      a run-time argument (0: every tile split, as on a grid of one wave), so
      one compiled kernel serves every grid, and which branch a unit takes is
      the whole CTA's, so the protocol's named barriers stay uniform
      (:func:`gemmlab.family.configs.hybrid_tiles` says how many run whole).
    * **A gated epilogue** (``gated``, for chapter 11's W16 route,
      :mod:`gemmlab.kernels.dual_gemm_sm90_w16`): B' holds two weight
      matrices interleaved in blocks of ``tile_n / 2`` rows, so a tile's first
      half of columns is one GEMM and its second half the other, in the same
      thread's registers (a sub-tile of 64 x ``epi_n`` and the one
      ``tile_n / 2`` columns later); the epilogue stores ``silu(first) *
      second``, a tile of C half as wide. No swap, no split-K.

Roles at a glance (128 threads per warpgroup)::

    warpgroup 0  warp 0     producer: for each work unit, for each of its k-blocks:
                              wait empty[s] -> expect_tx(full[s]) -> TMA A', TMA B' (multicast)
                 warps 1-3  idle (they give their registers away and wait at the end)
    warpgroup 1(, 2)        consumers, 64 rows each: for each work unit: for each k-block:
                              wait full[s] -> 4 x wgmma 64xNx16 -> release stage s-1 (all CTAs of the cluster)
                            then the epilogue: acc -> bf16 -> stmatrix -> TMA store (own 64 rows)
                            split-K, a tail unit: acc -> FP32 workspace; count the unit on the tile's
                            counter; the tile's last unit adds every slice to acc, then the same epilogue
                            (a whole tile of the first dp_tiles goes straight to the epilogue)

Pipelines, named after what they carry
    * ``full[s]`` / ``empty[s]`` (stage ring, ``stages`` deep): A' and B' k-blocks.
    * per consumer warpgroup, the bulk-async group of its TMA stores
      (``epi_stages`` deep): C sub-tiles.

Partial tiles need no code in the main loop: TMA loads fill out-of-bounds
elements with zero and TMA stores drop them (the split-K workspace holds whole
tiles, padding included, so its stores need no predicate either).
"""
from __future__ import annotations

import functools

import cutlass
import cutlass.cute as cute
import cutlass.utils as utils
import cutlass.utils.hopper_helpers as sm90_utils
import cuda.bindings.driver as cuda
from cutlass import Float32, Int32, Int64
from cutlass.cute.nvgpu import cpasync, warpgroup
from cutlass.memory import SmemAllocator

from ..family.configs import Sm90Config
from ..pipeline import DevicePipelineState
from ..scheduler import device_tile
from ..splitk import add_partials, arrive, reduce_group, store_partial

PRODUCER_REGS = 40  # setmaxnreg.dec: TMA issue needs a handful of registers
CONSUMER_REGS = 232  # setmaxnreg.inc: 128 accumulator registers + operands; 128*40 + 256*232 <= 64K
CONSUMER_REGS_3 = 152  # three consumer warpgroups (tile_m = 192): 128*40 + 384*152 <= 64K


def consumer_regs(consumers: int) -> int:
    """``setmaxnreg.inc`` of the consumer warpgroups: what the 64 K registers leave them after the producer's 40."""
    return CONSUMER_REGS if consumers <= 2 else CONSUMER_REGS_3
EPI_BARRIER = 1  # named barrier ids: 1 + consumer warpgroup index; 0 is __syncthreads
SPLIT_BARRIER = 4  # split-K: all consumer warpgroups of the CTA (after EPI_BARRIER + 0 .. 2)
WG_ROWS = 64  # rows of C one consumer warpgroup owns (WGMMA's M)


# --------------------------------------------------------------------------------------
# The kernel
# --------------------------------------------------------------------------------------


@cute.jit
def release_stage(empty_bar, stage: Int32, cluster_size: cutlass.Constexpr):
    """A consumer warp frees ring stage ``stage`` in every CTA of its cluster.

    One lane per destination CTA arrives (``mapa`` + remote ``mbarrier.arrive``
    when the cluster has 2 CTAs): the peer's producer multicasts into our
    shared memory, so it must hear from us too. ``empty`` counts
    ``consumer warps x cluster_size`` arrivals per phase.
    """
    lane = cute.arch.lane_idx()
    if cutlass.const_expr(cluster_size == 1):
        if lane == 0:
            cute.arch.mbarrier_arrive(empty_bar + stage)
    else:
        if lane < cluster_size:
            cute.arch.mbarrier_arrive(empty_bar + stage, lane)


@cute.jit
def unit_coords(linear: Int32, m_ctiles: Int32, n_ctiles: Int32, k_tiles: Int32, splits: Int32, dp_tiles: Int32,
                raster: cutlass.Constexpr, group: cutlass.Constexpr, split_k: cutlass.Constexpr):
    """Work unit ``linear`` -> ``(mc, nc, first k-block, k-blocks, tile, split)``.

    ``tile`` is the cluster tile's place in the grouped raster order. Without
    split-K unit ``t`` is tile ``t``, all of K. With split-K the first
    ``dp_tiles`` units are whole tiles ``0 .. dp_tiles - 1`` (the full waves:
    all of K, ``split`` 0); the other ``tail = tiles - dp_tiles`` tiles are cut
    into K slices, numbered slice-major: unit ``dp_tiles + s * tail + j`` is
    tile ``dp_tiles + j`` of slice ``s``, so the clusters running together
    share a slice's panels. A slice is ``ceil(k_tiles / splits)`` k-blocks, the
    last one what is left; the host passes a ``splits`` that leaves none empty
    (:func:`gemmlab.family.configs.effective_splits`) and ``dp_tiles`` from
    :func:`gemmlab.family.configs.hybrid_tiles` (0: every tile split).
    """
    tile = linear
    split = Int32(0)
    k0 = Int32(0)
    kc = k_tiles
    if cutlass.const_expr(split_k):
        if linear >= dp_tiles:
            tail = m_ctiles * n_ctiles - dp_tiles
            j = linear - dp_tiles
            split = j // tail
            tile = dp_tiles + (j - split * tail)
            per = (k_tiles + splits - 1) // splits
            k0 = split * per
            kc = cutlass.min(per, k_tiles - k0)
    mc, nc = device_tile(tile, m_ctiles, n_ctiles, raster, group)
    return mc, nc, k0, kc, tile, split


@cute.jit
def mma_tile(tiled_mma: cute.TiledMma, acc: cute.Tensor, tCrA: cute.Tensor, tCrB: cute.Tensor, full, empty,
             read: DevicePipelineState, release: DevicePipelineState, kc: Int32, cluster_size: cutlass.Constexpr):
    """One tile's main loop: ``kc`` k-blocks into ``acc``; returns the advanced ``(read, release)`` states.

    The caller zeroes ``acc`` and sets ``ACCUMULATE`` first: a helper may not
    change ``tiled_mma``'s fields (the DSL then builds invalid IR), and must
    rebind, not mutate, the pipeline states its loop carries.

    One wgmma batch stays in flight: after issuing k-block ``i`` the warpgroup
    waits for batch ``i - 1`` only, then frees that k-block's stage (in every
    CTA of the cluster). The first k-block is peeled so that the loop body
    always has a previous batch to wait for.
    """
    k_blocks = cute.size(tCrA, mode=[2])
    warpgroup.fence()
    cute.arch.mbarrier_wait(full + read.index, read.phase)
    for kb in cutlass.range_constexpr(k_blocks):
        cute.gemm(tiled_mma, acc, tCrA[(None, None, kb, read.index)], tCrB[(None, None, kb, read.index)], acc)
    warpgroup.commit_group()
    read.advance()
    for k in cutlass.range(1, kc, unroll=1):
        cute.arch.mbarrier_wait(full + read.index, read.phase)
        for kb in cutlass.range_constexpr(k_blocks):
            cute.gemm(tiled_mma, acc, tCrA[(None, None, kb, read.index)], tCrB[(None, None, kb, read.index)], acc)
        warpgroup.commit_group()
        warpgroup.wait_group(1)  # the previous k-block's wgmmas are done...
        release_stage(empty, release.index, cluster_size)  # ...so its stage may be refilled
        release = release.next()
        read = read.next()
    warpgroup.wait_group(0)
    release_stage(empty, release.index, cluster_size)
    release.advance()
    return read, release


def mma_operands(tiled_mma: cute.TiledMma, sA: cute.Tensor, sB: cute.Tensor, ctid, bm: int, bn: int):
    """A consumer thread's view of the MMA: its slice, its A/B fragments of every stage, its accumulator."""
    thr_mma = tiled_mma.get_slice(ctid)
    tCrA = tiled_mma.make_fragment_A(thr_mma.partition_A(sA))
    tCrB = tiled_mma.make_fragment_B(thr_mma.partition_B(sB))
    acc = cute.make_rmem_tensor(tiled_mma.partition_shape_C((bm, bn)), Float32)
    return thr_mma, tCrA, tCrB, acc


def skipped(state: DevicePipelineState, n) -> DevicePipelineState:
    """``state`` advanced by ``n`` stages at once (ping-pong: the other warpgroup's tile): the index wraps, and the
    phase flips once per wrap."""
    nxt = state.index + n
    return DevicePipelineState(state.stages, nxt % state.stages, state.phase ^ ((nxt // state.stages) % 2),
                               state.count + n)


def slab_views(acc: cute.Tensor, epi_mma: cute.TiledMma, bn: int, slabs: int) -> list:
    """A consumer's accumulator as ``slabs`` 64-row accumulators (``wg_rows = 128``: two).

    The accumulator's layout is ``(values, MMA_M, MMA_N)``, compact with the values first and ``MMA_N = 1`` (one
    WGMMA spans the tile's N), so slab ``s`` is the ``s``-th run of ``size(values)`` registers.
    """
    if slabs == 1:
        return [acc]
    layout = cute.make_layout(epi_mma.partition_shape_C((WG_ROWS, bn)))
    per = cute.size(layout)
    return [cute.make_tensor(acc.iterator + s * per, layout) for s in range(slabs)]


def epilogue_operands(epi_mma: cute.TiledMma, acc: cute.Tensor, sC: cute.Tensor, ctid, c_type, c_major_m: bool,
                      epi_n: int = 16):
    """What :func:`store_tile` moves: registers -> shared (stmatrix) copies of a warpgroup's slab.

    A warpgroup's accumulator fragment is laid out as in a single 64-row MMA,
    so the 64-row ``epi_mma`` partitions its own slab of the output. Returns
    ``(r2s, tRS_acc, tRS_sC, sub_f32, sub_out)``: the copy, the accumulator and
    the ring buffers as it sees them (``tRS_sC``: (R2S, R2S_M, R2S_N, consumers *
    epi_stages)), and the registers of one sub-tile in FP32 and in ``c_type``.

    ``epi_n``: the sub-tile's columns. A warp's ``stmatrix`` writes four 8 x 8 matrices, 16 rows by 16 columns of the
    slab, where ``epi_n`` is a multiple of 16; otherwise (a token tile 8 columns wider than a multiple of 16, as a
    200-wide one is) two, 16 rows by 8 columns.
    """
    matrices = 4 if epi_n % 16 == 0 else 2
    st_atom = cute.make_copy_atom(cute.nvgpu.warp.StMatrix8x8x16bOp(c_major_m, matrices), c_type)
    r2s = cute.make_tiled_copy_S(st_atom, cute.make_tiled_copy_C_atom(st_atom, epi_mma))
    thr_r2s = r2s.get_slice(ctid % 128)
    tRS_sC = thr_r2s.partition_D(sC)
    tRS_acc = r2s.retile(acc)
    sub_shape = cute.shape(thr_r2s.partition_S(sC))[:3]
    return r2s, tRS_acc, tRS_sC, cute.make_rmem_tensor(sub_shape, Float32), cute.make_rmem_tensor(sub_shape, c_type)


@cute.jit
def gate(x: Float32, y: Float32) -> Float32:
    """``silu(x) * y`` in FP32: the gated epilogue's value (the NVFP4 twins' :func:`~.dual_gemm_sm90.gate_epilogue`
    computes the same)."""
    return x / (Float32(1.0) + cute.math.exp(-x, fastmath=True)) * y


@cute.jit
def store_tile(tma_c: cute.CopyAtom, sC: cute.Tensor, gC_tile: cute.Tensor, r2s: cute.TiledCopy, tRS_acc: cute.Tensor,
               tRS_sC: cute.Tensor, sub_f32: cute.Tensor, sub_out: cute.Tensor, half, store_warp,
               cfg: cutlass.Constexpr, c_type: cutlass.Constexpr, desc=None, slab=None):
    """The TMA-store epilogue of one warpgroup: 64 rows of the tile, sub-tile by sub-tile through its ring.

    ``half``: the warpgroup (its ring of buffers and its named barrier); ``slab``: which 64-row slab of the tile
    the values are (None: ``half``, the warpgroup's own; a warpgroup of ``wg_rows = 128`` stores two).
    ``desc``: a descriptor in global memory to store through (chapter 08's
    rewritten descriptors) instead of the kernel parameter's.
    """
    sub_size = cute.size(sub_f32)
    gC_epi = cute.zipped_divide(gC_tile, (WG_ROWS, cfg.epi_n))
    bSG_sC, bSG_gC = cpasync.tma_partition(tma_c, 0, cute.make_layout(1), cute.group_modes(sC, 0, 2), gC_epi)
    epi_count = cfg.out_tile_n // cfg.epi_n
    row = half if cutlass.const_expr(slab is None) else slab
    for e in cutlass.range_constexpr(epi_count):
        buf = half * cfg.epi_stages + e % cfg.epi_stages
        # sub-tile e's values; gated: sub-tile e of the tile's first half of columns and sub-tile e of its second
        for v in cutlass.range_constexpr(sub_size):
            if cutlass.const_expr(cfg.gated):
                sub_f32[v] = gate(tRS_acc[e * sub_size + v], tRS_acc[(e + epi_count) * sub_size + v])
            else:
                sub_f32[v] = tRS_acc[e * sub_size + v]
        # to the output type, then stmatrix into the ring buffer
        sub_out.store(sub_f32.load().to(c_type))
        cute.copy(r2s, sub_out, tRS_sC[(None, None, None, buf)])
        # Generic-proxy writes must be visible to the TMA (async proxy) read.
        cute.arch.fence_proxy("async.shared", space="cta")
        cute.arch.barrier(barrier_id=EPI_BARRIER + half, number_of_threads=128)
        if store_warp:
            if cutlass.const_expr(desc is None):
                cute.copy(tma_c, bSG_sC[(None, buf)], bSG_gC[(None, (row, e))])
            else:
                cute.copy(tma_c, bSG_sC[(None, buf)], bSG_gC[(None, (row, e))], tma_desc_ptr=desc)
            cute.arch.cp_async_bulk_commit_group()
            # Buffer reuse: the store issued epi_stages-1 ago must have *read*
            # its buffer; the newer ones stay in flight (and drain during the
            # next tile's main loop).
            cute.arch.cp_async_bulk_wait_group(cfg.epi_stages - 1, read=True)
            if cutlass.const_expr(e == epi_count - 1 and not cfg.epi_ring_aligned):
                # The next tile restarts at buffer 0, which a store still in
                # flight may be reading: drain (only for unaligned rings).
                cute.arch.cp_async_bulk_wait_group(0, read=True)
        cute.arch.barrier(barrier_id=EPI_BARRIER + half, number_of_threads=128)


@cute.kernel
def gemm_kernel(
    tma_a: cute.CopyAtom, mA: cute.Tensor,
    tma_b: cute.CopyAtom, mB: cute.Tensor,
    tma_c: cute.CopyAtom, mC: cute.Tensor,
    mW: cute.Tensor, mCount: cute.Tensor,
    tiled_mma: cute.TiledMma, epi_mma: cute.TiledMma,
    a_smem: cute.ComposedLayout, b_smem: cute.ComposedLayout, c_smem: cute.ComposedLayout,
    m_ctiles: Int32, n_ctiles: Int32, k_tiles: Int32, splits: Int32, dp_tiles: Int32,
    cfg: cutlass.Constexpr, ab_type: cutlass.Constexpr, c_type: cutlass.Constexpr,
    c_major_m: cutlass.Constexpr,
):
    BM, BN, BK = cfg.tile_m, cfg.tile_n, cfg.tile_k
    CM, CN = cfg.cluster
    CS = CM * CN
    stages = cfg.stages
    consumers = cfg.consumers
    num_units = m_ctiles * n_ctiles
    if cutlass.const_expr(cfg.split_k):
        num_units = dp_tiles + (num_units - dp_tiles) * splits  # whole tiles, then the tail's tiles x slices

    tidx, _, _ = cute.arch.thread_idx()
    warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
    wg = warp // 4
    bid, _, _ = cute.arch.block_idx()
    grid, _, _ = cute.arch.grid_dim()
    cluster_id = bid // CS
    num_clusters = grid // CS
    rank = cute.arch.make_warp_uniform(cute.arch.block_idx_in_cluster())
    # Where this CTA sits in its CM x CN cluster (ranks run along M first: rank = rank_m + CM * rank_n). A pair or a
    # line of CTAs takes rank itself, with no % or //, so the 1-D clusters' PTX is what it was before 2-D ones.
    rank_m, rank_n = 0, 0
    if cutlass.const_expr(CN == 1):
        rank_m = rank if cutlass.const_expr(CM > 1) else 0
    else:
        rank_n = rank if cutlass.const_expr(CM == 1) else rank // CM
        rank_m = 0 if cutlass.const_expr(CM == 1) else rank % CM

    # ---------------------------------------------------------------- shared memory
    smem = SmemAllocator()
    sA = smem.allocate_tensor(ab_type, a_smem.outer, byte_alignment=1024, swizzle=a_smem.inner)
    sB = smem.allocate_tensor(ab_type, b_smem.outer, byte_alignment=1024, swizzle=b_smem.inner)
    # One ring of epi_stages sub-tiles per consumer warpgroup: buffer wg*epi_stages + i.
    sC = smem.allocate_tensor(c_type, c_smem.outer, byte_alignment=1024, swizzle=c_smem.inner)
    full = smem.allocate_array(Int64, stages, byte_alignment=8)  # "stage s holds A and B": TMA bytes
    empty = smem.allocate_array(Int64, stages, byte_alignment=8)  # "stage s may be refilled": consumer warps
    # Ping-pong: each stage is consumed by one warpgroup only, and "turn[w]: warpgroup w may start its main loop"
    # (the other one has consumed all of its tile's stages, so w's next stages are at most one phase ahead).
    readers = cfg.tile_warpgroups
    if cutlass.const_expr(cfg.pingpong):
        turn = smem.allocate_array(Int64, 2, byte_alignment=8)
    if cutlass.const_expr(cfg.split_k):
        # Split-K: "this unit is its tile's last", from the thread that counted it to the others.
        last_flag = smem.allocate_tensor(Int32, cute.make_layout(1), byte_alignment=4)

    if warp == 0:
        cpasync.prefetch_descriptor(tma_a)
        cpasync.prefetch_descriptor(tma_b)
        cpasync.prefetch_descriptor(tma_c)
        with cute.arch.elect_one():
            for s in cutlass.range_constexpr(stages):
                cute.arch.mbarrier_init(full + s, 1)
                cute.arch.mbarrier_init(empty + s, 4 * readers * CS)
            if cutlass.const_expr(cfg.pingpong):
                for w in cutlass.range_constexpr(2):
                    cute.arch.mbarrier_init(turn + w, 128)  # every thread of the other warpgroup
            cute.arch.mbarrier_init_fence()
    # Every CTA of the cluster must see its peers' barriers initialised before
    # a multicast or a remote arrive can touch them.
    if cutlass.const_expr(CS > 1):
        cute.arch.cluster_arrive_relaxed()
        cute.arch.cluster_wait()
    else:
        cute.arch.sync_threads()

    # ---------------------------------------------------------------- global tiles
    gA = cute.local_tile(mA, (BM, BK), (None, None))  # (BM, BK, m_tiles, k_tiles)
    gB = cute.local_tile(mB, (BN, BK), (None, None))  # (BN, BK, n_tiles, k_tiles)

    # A multicast panel is split across the CTAs that share it: each loads its
    # slice and sends it to all of them. An A' panel (tile m_tile) is shared by
    # the CN CTAs of the cluster with our rank_m, a B' panel by the CM CTAs with
    # our rank_n (a pair: mask 0b11 either way).
    a_parts = CN  # CTAs sharing an A panel (cluster along N)
    b_parts = CM  # CTAs sharing a B panel (cluster along M)
    tAsA, tAgA = cpasync.tma_partition(tma_a, rank_n, cute.make_layout(a_parts),
                                       cute.group_modes(sA, 0, 2), cute.group_modes(gA, 0, 2))
    tBsB, tBgB = cpasync.tma_partition(tma_b, rank_m, cute.make_layout(b_parts),
                                       cute.group_modes(sB, 0, 2), cute.group_modes(gB, 0, 2))
    # A pair (or a line of CTAs) sends to the whole cluster; in a 2-D cluster an A' slice goes to ranks rank_m,
    # rank_m + CM, ... and a B' slice to ranks CM rank_n .. CM rank_n + CM - 1.
    a_mask = cutlass.Int16((1 << CS) - 1)
    b_mask = cutlass.Int16((1 << CS) - 1)
    if cutlass.const_expr(CM > 1 and CN > 1):
        a_mask = cutlass.Int16(sum(1 << (CM * j) for j in range(CN))) << rank_m
        b_mask = cutlass.Int16((1 << CM) - 1) << (CM * rank_n)
    stage_bytes = cute.size_in_bytes(ab_type, cute.select(a_smem, mode=[0, 1])) + \
        cute.size_in_bytes(ab_type, cute.select(b_smem, mode=[0, 1]))

    if wg == 0:
        # ============================================================ producer warpgroup
        cute.arch.warpgroup_reg_dealloc(PRODUCER_REGS)
        if warp == 0:
            state = DevicePipelineState.producer(stages)  # carried across all work units
            linear = cluster_id
            while linear < num_units:
                mc, nc, k0, kc, _, _ = unit_coords(linear, m_ctiles, n_ctiles, k_tiles, splits, dp_tiles,
                                                   cfg.raster, cfg.group, cfg.split_k)
                m_tile = mc * CM + rank_m
                n_tile = nc * CN + rank_n
                for k in cutlass.range(kc, unroll=1):
                    cute.arch.mbarrier_wait(empty + state.index, state.phase)
                    with cute.arch.elect_one():
                        # Our barrier expects the whole stage: our own loads plus
                        # the slices the peer multicasts to us.
                        cute.arch.mbarrier_arrive_and_expect_tx(full + state.index, stage_bytes)
                    if cutlass.const_expr(a_parts > 1):
                        cute.copy(tma_a, tAgA[(None, m_tile, k0 + k)], tAsA[(None, state.index)],
                                  tma_bar_ptr=full + state.index, mcast_mask=a_mask)
                    else:
                        cute.copy(tma_a, tAgA[(None, m_tile, k0 + k)], tAsA[(None, state.index)],
                                  tma_bar_ptr=full + state.index)
                    if cutlass.const_expr(b_parts > 1):
                        cute.copy(tma_b, tBgB[(None, n_tile, k0 + k)], tBsB[(None, state.index)],
                                  tma_bar_ptr=full + state.index, mcast_mask=b_mask)
                    else:
                        cute.copy(tma_b, tBgB[(None, n_tile, k0 + k)], tBsB[(None, state.index)],
                                  tma_bar_ptr=full + state.index)
                    state.advance()
                linear = linear + num_clusters
            # Tail: before this CTA may exit, every consumer of the cluster must
            # have released every stage (their remote arrives target our barriers).
            for _ in cutlass.range_constexpr(stages):
                cute.arch.mbarrier_wait(empty + state.index, state.phase)
                state.advance()
    else:
        # ============================================================ consumer warpgroups
        cute.arch.warpgroup_reg_alloc(consumer_regs(consumers))
        ctid = tidx - 128  # 0 .. 128 * consumers - 1
        half = wg - 1  # which 64-row slab of the tile this warpgroup owns (ping-pong: which tiles)
        thr_mma, tCrA, tCrB, acc = mma_operands(tiled_mma, sA, sB, ctid % (128 * readers), BM, BN)

        # Epilogue copies: registers -> shared (stmatrix), shared -> global (TMA).
        # A warpgroup's accumulator fragment is laid out as in a single 64-row
        # MMA, so the 64-row epi_mma partitions its own slab of the output.
        # wg_rows = 128: the warpgroup's accumulator is two 64-row slabs (one per WGMMA of a k-step), stored one after
        # the other through its ring; each slab is seen as a 64-row accumulator of its own.
        slabs = cfg.wg_rows // WG_ROWS
        slab_acc = slab_views(acc, epi_mma, BN, slabs)
        r2s, tRS_acc, tRS_sC, sub_f32, sub_out = epilogue_operands(epi_mma, slab_acc[0], sC, ctid, c_type, c_major_m,
                                                                       cfg.epi_n)
        tRS_slabs = [tRS_acc] + [r2s.retile(a) for a in slab_acc[1:]]
        gC = cute.local_tile(mC, (BM, cfg.out_tile_n), (None, None))  # (BM, out_tile_n, m_tiles, n_tiles)

        read = DevicePipelineState.consumer(stages)  # next stage to compute on
        release = DevicePipelineState.consumer(stages)  # next stage to hand back
        linear = cluster_id
        step = num_clusters  # the CTA's units: cluster_id, + num_clusters, ...
        first_slab = half * slabs  # the warpgroup's own slab(s) of the tile
        if cutlass.const_expr(cfg.pingpong):
            # Warpgroup w takes the CTA's units w, w + 2, ...: the other one's stages are skipped, not read.
            step = 2 * num_clusters
            first_slab = 0
            linear = cluster_id + half * num_clusters
            skip = Int32(0)
            if half == 1:
                skip = k_tiles  # warpgroup 0's first tile
            read, release = skipped(read, skip), skipped(release, skip)
            turn_phase = Int32(0)
        while linear < num_units:
            mc, nc, k0, kc, tile, split = unit_coords(linear, m_ctiles, n_ctiles, k_tiles, splits, dp_tiles,
                                                      cfg.raster, cfg.group, cfg.split_k)
            m_tile = mc * CM + rank_m
            n_tile = nc * CN + rank_n

            if cutlass.const_expr(cfg.pingpong):
                if linear >= 2 * num_clusters or half == 1:  # not the CTA's first tile: wait for the other's main loop
                    cute.arch.mbarrier_wait(turn + half, turn_phase)
                    turn_phase = turn_phase ^ 1
            # ---- main loop: keep one wgmma batch in flight, free the stage before it
            acc.fill(0.0)
            tiled_mma.set(warpgroup.Field.ACCUMULATE, True)
            read, release = mma_tile(tiled_mma, acc, tCrA, tCrB, full, empty, read, release, kc, CS)
            if cutlass.const_expr(cfg.pingpong):
                cute.arch.mbarrier_arrive(turn + (1 - half))  # the other warpgroup's turn; then our epilogue
                skip = Int32(0)
                if linear + num_clusters < num_units:
                    skip = k_tiles  # the other warpgroup's next tile
                read, release = skipped(read, skip), skipped(release, skip)

            if cutlass.const_expr(not cfg.split_k):
                # ---- epilogue: this warpgroup's rows, sub-tiles of 64 x epi_n through its ring
                for sl in cutlass.range_constexpr(slabs):
                    store_tile(tma_c, sC, gC[(None, None, m_tile, n_tile)], r2s, tRS_slabs[sl], tRS_sC, sub_f32,
                               sub_out, half, warp % 4 == 0, cfg, c_type, slab=first_slab + sl)
            else:
                # ---- split-K epilogue: a whole tile (the full waves) stores C at once; a tail unit publishes its
                # slice's partial tile, and the tile's last unit adds them all and stores C. The branch is the whole
                # CTA's (every thread has the same unit), so arrive()'s named barriers are met by all or none.
                last = cutlass.Boolean(True)
                if tile >= dp_tiles:
                    ctile = (tile - dp_tiles) * CS + rank  # this CTA's tail tile: its workspace tiles and counter
                    part = mW.iterator + (Int64(ctile * splits) * (BM * BN) + ctid * 4)  # this thread, slice 0
                    store_partial(acc, part + split * (BM * BN), 128 * consumers)
                    last = arrive(mCount.iterator + ctile, last_flag, splits, ctid, 128 * consumers, SPLIT_BARRIER)
                    if last:
                        add_partials(acc, part, split, splits, BM * BN, 128 * consumers,
                                     reduce_group(cute.size(acc), consumers))
                if last:
                    for sl in cutlass.range_constexpr(slabs):
                        store_tile(tma_c, sC, gC[(None, None, m_tile, n_tile)], r2s, tRS_slabs[sl], tRS_sC, sub_f32,
                                   sub_out, half, warp % 4 == 0, cfg, c_type, slab=first_slab + sl)
            linear = linear + step
        if warp % 4 == 0:  # each warpgroup's store warp drains its stores before the CTA exits
            cute.arch.cp_async_bulk_wait_group(0, read=True)


# --------------------------------------------------------------------------------------
# The host side: views, TMA descriptors, the launch (all sizes are run-time values)
# --------------------------------------------------------------------------------------


def mma_and_smem_layouts(kA: cute.Tensor, kB: cute.Tensor, kC: cute.Tensor, cfg: Sm90Config):
    """The WGMMA tilings and the shared-memory layouts for A' (M' x K), B' (N' x K) and C' (M' x N').

    ``tiled_mma``: one 64-row WGMMA atom per consumer warpgroup, stacked along M;
    ``epi_mma``: one atom, to partition a warpgroup's own 64-row slab in the
    epilogue. Also returns C's layout enum (the epilogue's stmatrix needs it).
    """
    ab_type = kA.element_type
    a_layout = utils.LayoutEnum.from_tensor(kA)
    b_layout = utils.LayoutEnum.from_tensor(kB)
    c_layout = utils.LayoutEnum.from_tensor(kC)
    tile = (cfg.tile_m, cfg.tile_n, cfg.tile_k)
    tiled_mma = sm90_utils.make_trivial_tiled_mma(
        ab_type, ab_type, a_layout.sm90_mma_major_mode(), b_layout.sm90_mma_major_mode(),
        Float32, (cfg.tile_warpgroups, 1, 1), tiler_mn=(WG_ROWS, cfg.tile_n))
    epi_mma = sm90_utils.make_trivial_tiled_mma(
        ab_type, ab_type, a_layout.sm90_mma_major_mode(), b_layout.sm90_mma_major_mode(),
        Float32, (1, 1, 1), tiler_mn=(WG_ROWS, cfg.tile_n))
    a_smem = sm90_utils.make_smem_layout_a(a_layout, tile, ab_type, cfg.stages)
    b_smem = sm90_utils.make_smem_layout_b(b_layout, tile, ab_type, cfg.stages)
    c_smem = sm90_utils.make_smem_layout_epi(kC.element_type, c_layout, (WG_ROWS, cfg.epi_n),
                                             cfg.consumers * cfg.epi_stages)
    return tiled_mma, epi_mma, a_smem, b_smem, c_smem, c_layout


@cute.jit
def launch_gemm(a: cute.Tensor, b: cute.Tensor, c: cute.Tensor, ws, counters, splits: Int32, dp_tiles: Int32,
                max_clusters: Int32, stream: cuda.CUstream, cfg: cutlass.Constexpr):
    """Build the kernel's views and TMA descriptors for ``c = a @ b`` and launch the persistent grid.

    ``a`` is M x K (row-major), ``b`` K x N (either major), ``c`` M x N
    (row-major). With split-K, ``ws`` is the flat FP32 workspace of
    :meth:`~gemmlab.family.configs.Sm90Config.workspace_floats` and ``counters``
    the int32 tile counters (:meth:`~gemmlab.family.configs.Sm90Config.split_tiles`
    of them, zero), both for the tail's tiles: ``dp_tiles`` cluster tiles run
    whole first (:func:`~gemmlab.family.configs.hybrid_tiles`); without split-K
    ws and counters are None and dp_tiles is unused. The kernel computes ``C' = A' @ B'^T``
    (B' is N' x K); with ``cfg.swap_ab`` the roles of a and b are exchanged and
    C' is the transposed view of c.
    """
    ab_type = a.element_type
    b_nk = cute.make_tensor(b.iterator, cute.select(b.layout, mode=[1, 0]))  # N x K view of b
    if cutlass.const_expr(cfg.swap_ab):
        kA, kB = b_nk, a
        kC = cute.make_tensor(c.iterator, cute.select(c.layout, mode=[1, 0]))  # N x M, M-major
    else:
        kA, kB, kC = a, b_nk, c
    tiled_mma, epi_mma, a_smem, b_smem, c_smem, c_layout = mma_and_smem_layouts(kA, kB, kC, cfg)
    epi_tile = (WG_ROWS, cfg.epi_n)

    cm, cn = cfg.cluster
    a_op = cpasync.CopyBulkTensorTileG2SMulticastOp() if cn > 1 else cpasync.CopyBulkTensorTileG2SOp()
    b_op = cpasync.CopyBulkTensorTileG2SMulticastOp() if cm > 1 else cpasync.CopyBulkTensorTileG2SOp()
    # One stage's layout: its first two modes. (``cute.slice_(layout, (None, None, 0))`` says the same, but the DSL
    # 4.8.1 aborts the process slicing a swizzled layout of an odd number of 8-row atoms: a 104-wide token tile.)
    tma_a, tA = cpasync.make_tiled_tma_atom(a_op, kA, cute.select(a_smem, mode=[0, 1]),
                                            (cfg.tile_m, cfg.tile_k), num_multicast=cn)
    tma_b, tB = cpasync.make_tiled_tma_atom(b_op, kB, cute.select(b_smem, mode=[0, 1]),
                                            (cfg.tile_n, cfg.tile_k), num_multicast=cm)
    tma_c, tC = cpasync.make_tiled_tma_atom(cpasync.CopyBulkTensorTileS2GOp(), kC,
                                            cute.select(c_smem, mode=[0, 1]), epi_tile)

    rows, cols = cute.size(kC, mode=[0]), cute.size(kC, mode=[1])
    k = cute.size(kA, mode=[1])
    m_ctiles = ((rows + cfg.tile_m - 1) // cfg.tile_m + cm - 1) // cm
    n_ctiles = ((cols + cfg.out_tile_n - 1) // cfg.out_tile_n + cn - 1) // cn  # gated: B' has 2 columns of C's
    k_tiles = (k + cfg.tile_k - 1) // cfg.tile_k
    if cutlass.const_expr(not cfg.split_k):
        ws, counters = kC, kC  # unused by the kernel in this mode
    units = dp_tiles + (m_ctiles * n_ctiles - dp_tiles) * splits if cutlass.const_expr(cfg.split_k) \
        else m_ctiles * n_ctiles
    clusters = cutlass.min(units, max_clusters)
    gemm_kernel(tma_a, tA, tma_b, tB, tma_c, tC, ws, counters, tiled_mma, epi_mma, a_smem, b_smem, c_smem,
                m_ctiles, n_ctiles, k_tiles, splits, dp_tiles, cfg, ab_type, c.element_type,
                c_layout.is_m_major_c()).launch(
        grid=(clusters * cfg.cluster_size, 1, 1), block=(cfg.threads, 1, 1),
        cluster=(cfg.cluster_size, 1, 1), stream=stream)


@functools.lru_cache(maxsize=None)
def gemm_host(cfg: Sm90Config):
    """The ``@cute.jit`` host function of ``cfg.kernel_key`` (one per compiled variant).

    Arguments (all sizes are read from the tensors at run time): ``a`` (M, K),
    ``b`` (K, N), ``c`` (M, N), with split-K the flat FP32 workspace ``ws``,
    the int32 tile ``counters`` (zero; the kernel leaves them zero), the
    run-time ``splits`` and ``dp_tiles`` (the cluster tiles run whole before the
    split tail); then ``max_clusters`` (the persistent grid: SMs / cluster size)
    and the stream.
    """
    cfg = cfg.kernel_key
    if cfg.split_k:
        @cute.jit
        def gemm_sm90_split_host(a: cute.Tensor, b: cute.Tensor, c: cute.Tensor, ws: cute.Tensor,
                                 counters: cute.Tensor, splits: Int32, dp_tiles: Int32, max_clusters: Int32,
                                 stream: cuda.CUstream):
            launch_gemm(a, b, c, ws, counters, splits, dp_tiles, max_clusters, stream, cfg)

        return gemm_sm90_split_host

    @cute.jit
    def gemm_sm90_host(a: cute.Tensor, b: cute.Tensor, c: cute.Tensor, max_clusters: Int32,
                       stream: cuda.CUstream):
        launch_gemm(a, b, c, None, None, Int32(1), Int32(0), max_clusters, stream, cfg)

    return gemm_sm90_host


# --------------------------------------------------------------------------------------
# Compiling (any machine)
# --------------------------------------------------------------------------------------

_CUTLASS_TYPES = {"bfloat16": cutlass.BFloat16, "float16": cutlass.Float16}


def compile_gemm(target: str = "sm_90a", cfg: Sm90Config | None = None, b_major: str = "k", *,
                 tvm_ffi: bool = False):
    """Compile the kernel of ``cfg`` for ``target`` without a GPU; returns the compiled function.

    M, N and K are symbolic (N and K multiples of 8, the contract's alignment),
    so the result serves every problem size; ``b_major`` ("k" or "n") is B's
    layout. ``tvm_ffi=True`` compiles the plans' call path (torch tensors in,
    torch's current stream implied); the PTX is the same either way.
    """
    from ..checks import check_choice
    from ..compile import check_target, compile_for, fake_stream, fake_tensor

    check_target(target)
    if target != "sm_90a":
        raise ValueError(f"the Hopper GEMM needs target sm_90a (wgmma, setmaxnreg); got {target!r}")
    cfg = cfg or Sm90Config()
    if not isinstance(cfg, Sm90Config):
        raise TypeError(f"cfg must be an Sm90Config; got {type(cfg).__name__}")
    if cfg.gated:
        raise ValueError(f"cfg {cfg.name}: a gated config reads a B' of 2 N rows and stores N columns; it is compiled by "
                         f"the W16 route (gemmlab.kernels.dual_gemm_sm90_w16), not as c = a @ b: pass gated=False")
    check_choice("b_major", b_major, ("k", "n"))
    if not isinstance(tvm_ffi, bool):
        raise TypeError(f"tvm_ffi must be a bool; got {type(tvm_ffi).__name__}")
    dt, ct = _CUTLASS_TYPES[cfg.dtype], _CUTLASS_TYPES[cfg.out_dtype]
    m, n, k = cute.sym_int(), cute.sym_int(divisibility=8), cute.sym_int(divisibility=8)
    a = fake_tensor(dt, (m, k), stride_order=(1, 0))
    b = fake_tensor(dt, (k, n), stride_order=(1, 0) if b_major == "n" else (0, 1))
    c = fake_tensor(ct, (m, n), stride_order=(1, 0))
    args = [a, b, c]
    if cfg.split_k:
        args += [fake_tensor(Float32, (cute.sym_int(),)), fake_tensor(Int32, (cute.sym_int(),), align=4), Int32(2),
                 Int32(0)]
    return compile_for(target, gemm_host(cfg), *args, Int32(1), fake_stream(env=tvm_ffi), tvm_ffi=tvm_ffi)
