"""Chapter 10: the persistent 2-CTA BF16 GEMM for Blackwell (sm_100a).

What it teaches
    One kernel, three roles, three pipelines, in the shape of DeepGEMM's sm100
    BF16 GEMM (simplified: no split-K, no swap-AB, one output dtype per input dtype).

    * A **cluster of two CTAs** (a *CTA pair*) owns one 256 x ``block_n`` tile of C.
      Each CTA loads 128 rows of A and half of B's ``block_n`` rows; one
      ``tcgen05.mma.cta_group::2`` issued by the *leader* CTA multiplies the
      pair's shared-memory operands into both CTAs' tensor memory (TMEM).
    * **Roles** (warps of each 192-thread CTA):

      ======  =========================  ========================================
      warp    role                       runs in
      ======  =========================  ========================================
      0-3     epilogue warpgroup         both CTAs: TMEM -> registers -> SMEM -> TMA store
      4       MMA warp                   leader CTA only (the peer's warp 4 idles)
      5       TMA-load warp              both CTAs (one elected lane issues)
      ======  =========================  ========================================

    * **Pipelines**, each walked with a :class:`gemmlab.pipeline.DevicePipelineState`
      that is created once and carried across tiles and k-iterations:

      ==========  =====================  ==================================================
      pipeline    carries                barriers (who arrives -> who waits)
      ==========  =====================  ==================================================
      SMEM-AB     A/B k-blocks, S stages ``ab_full[s]``: TMA bytes (both CTAs) -> MMA;
                                         ``ab_empty[s]``: ``tcgen05.commit`` multicast -> TMA
      TMEM-C      accumulators, 2 stages ``tmem_full[a]``: ``tcgen05.commit`` multicast -> epilogue;
                                         ``tmem_empty[a]``: 8 epilogue warps (2 CTAs) -> MMA
      SMEM-C      output staging, 2      TMA-store bulk groups (``cp.async.bulk.wait_group.read``)
      ==========  =====================  ==================================================

      Two accumulator stages of 256 fp32 columns fill TMEM's 512 columns, so
      the epilogue of tile *i* overlaps the main loop of tile *i + 1*.
    * **Set-up and teardown in the order of the working kernels** (NVIDIA's CuTe DSL
      ``dense_gemm_persistent``, CUTLASS C++ ``sm100_gemm_tma_warpspecialized``,
      DeepGEMM ``sm100_bf16_gemm``): barrier init, cluster barrier, TMEM alloc
      (``cta_group::2`` is one operation of the pair, so both CTAs must be set up
      first), a fenced CTA barrier publishing the address, the roles, *producer
      tails* (the TMA warp waits out every ``ab_empty``, the MMA warp every
      ``tmem_empty``), the final cluster barrier, relinquish and dealloc.
      :func:`static_evidence` reads these points back from the PTX;
      ``tests/test_sm100_pinned.py`` pins them.
    * A **persistent grid**: ``num_sms / 2`` clusters walk the output tiles
      (on a real B200 the grid should be sized by the clusters that can be
      resident at once, ``cudaOccupancyMaxActiveClusters``, as CUTLASS's
      ``KernelHardwareInfo::query_device_max_active_clusters`` does: a cluster
      must fit in one GPC, so not every SM need find a partner; with the static
      tile walk below extra clusters only run later, they cannot deadlock)
      ``cluster, cluster + clusters, ...`` in chapter 07's grouped raster order
      (:class:`gemmlab.scheduler.TileScheduler`; on the device
      :func:`tile_coord_device`).

What it adds over chapter 09 (tcgen05_tmem) and Part III (persistent_gemm_sm90)
    Chapter 09 issued single tcgen05 instructions; here they form a full
    pipelined GEMM. Over the Hopper kernel of chapter 07 it swaps WGMMA's
    register accumulators for TMEM (so the MMA warp is one thread and the
    epilogue is a separate role with its own pipeline), uses the 2-CTA MMA in
    place of chapter 07's TMA multicast between the CTAs of a cluster (each
    CTA of a pair loads half of B, and one MMA reads both halves), and adds the
    TMEM-C pipeline. The CPU model of the schedule is :mod:`gemmlab.sm100_model`.

Proof on the CPU tier
    :func:`compile_gemm_sm100` compiles the kernel for sm_100a at every
    configuration the heuristic (:func:`gemmlab.family.heuristic_sm100.choose`)
    can return; tests read the PTX.

Where it sits
    This module holds the kernel and its ``@cute.jit`` host code only. The
    configuration is :class:`gemmlab.family.configs.Sm100Config`; launches go
    through the public :func:`gemmlab.gemm` (or :func:`gemmlab.family.plan.prepare`
    for timing loops), which on a B200 walks the family's layers: the problem
    (:mod:`gemmlab.family.problem`), the heuristic, the plan (this kernel compiled
    once per config and shape, through TVM-FFI when ``apache-tvm-ffi`` is
    installed), the launch (``sm100`` tests and cells only).
"""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
import cutlass.utils as utils
import cuda.bindings.driver as cuda
from cutlass import Float32, Int32, Int64
from cutlass.cute.nvgpu import cpasync, tcgen05

from ..checks import check_int
from ..compile import check_target, compile_for, fake_stream, fake_tensor
from ..family.configs import (ACC_STAGES, BARRIER_RESERVE, BLOCK_K, C_STAGES, CTA_M, EPILOGUE_WARPS,  # noqa: F401
                              GROUP_M, MMA_K, PAIR_M, RASTER, Sm100Config)
from ..hardware import TMEM_COLUMNS  # noqa: F401
from ..family.heuristic_sm100 import ceil_div, choose
from ..family.problem import GemmProblem
from ..pipeline import DevicePipelineState
from ..scheduler import device_tile
from ..tmem import tcgen05_fence_after_thread_sync, tcgen05_fence_before_thread_sync  # chapter 09's wrappers

# --------------------------------------------------------------------------------------
# The fixed shape of the kernel (sizes: gemmlab.family.configs; heuristic: gemmlab.family.heuristic_sm100)
# --------------------------------------------------------------------------------------

MMA_WARP = 4
TMA_WARP = 5
THREADS = 32 * 6
EPILOGUE_THREADS = 32 * EPILOGUE_WARPS
EPILOGUE_BARRIER_ID = 1  # named barrier of the epilogue warpgroup (0 is __syncthreads)
SMEM_ALIGN = 1024  # 128B-swizzled tiles start on 1024-byte boundaries

_TORCH_TO_CUTLASS = {"bfloat16": cutlass.BFloat16, "float16": cutlass.Float16}


# --------------------------------------------------------------------------------------
# Small device helpers
# --------------------------------------------------------------------------------------


@cute.jit
def tile_coord_device(linear: Int32, m_tiles: cutlass.Constexpr, n_tiles: cutlass.Constexpr):
    """Linear tile -> ``(m_tile, n_tile)`` on the device: chapter 07's grouped raster order.

    Bands of ``GROUP_M`` M-tiles, walked down M first, so the clusters running
    at the same time share a few B column-blocks and A row-blocks (L2 reuse).
    The CPU model uses the same scheduler (:class:`gemmlab.scheduler.TileScheduler`).
    """
    return device_tile(linear, m_tiles, n_tiles, RASTER, GROUP_M)


# --------------------------------------------------------------------------------------
# The three workers. Each loops over this cluster's tiles with its own PipelineStates.
# --------------------------------------------------------------------------------------


@cute.jit
def tma_load_worker(tma_atom_a: cute.CopyAtom, tAgA: cute.Tensor, tAsA: cute.Tensor,
                    tma_atom_b: cute.CopyAtom, tBgB: cute.Tensor, tBsB: cute.Tensor,
                    ab_full, ab_empty, is_leader, cluster, my_tiles,
                    m_tiles: cutlass.Constexpr, n_tiles: cutlass.Constexpr, k_tiles: cutlass.Constexpr,
                    ab_stages: cutlass.Constexpr, num_clusters: cutlass.Constexpr, tx_bytes: cutlass.Constexpr):
    """TMA-load warp (both CTAs): fill SMEM-AB stage by stage.

    Each CTA loads its 128 rows of A and its half of B. The 2-CTA TMA signals
    the *leader's* ``ab_full[s]``, so only the leader announces the bytes
    (both CTAs' worth) with ``arrive.expect_tx``. Each CTA waits on its own
    ``ab_empty[s]``, which the MMA's multicast commit releases in both.
    """
    smem_ab = DevicePipelineState.producer(ab_stages)  # phase 1: fresh ab_empty reads as "empty"
    for i in cutlass.range(my_tiles, unroll=1):
        m_tile, n_tile = tile_coord_device(cluster + i * num_clusters, m_tiles, n_tiles)
        for k in cutlass.range(k_tiles, unroll=1):
            cute.arch.mbarrier_wait(ab_empty + smem_ab.index, smem_ab.phase)
            if is_leader:
                with cute.arch.elect_one():
                    cute.arch.mbarrier_arrive_and_expect_tx(ab_full + smem_ab.index, tx_bytes)
            cute.copy(tma_atom_a, tAgA[(None, m_tile, k)], tAsA[(None, smem_ab.index)],
                      tma_bar_ptr=ab_full + smem_ab.index)
            cute.copy(tma_atom_b, tBgB[(None, n_tile, k)], tBsB[(None, smem_ab.index)],
                      tma_bar_ptr=ab_full + smem_ab.index)
            smem_ab.advance()  # carried into the next tile: never reset
    # Producer tail: wait until the MMAs have released every stage this warp filled, so no
    # tcgen05.commit arrives on this CTA's ab_empty after the CTA has moved on to its teardown.
    for _ in cutlass.range(ab_stages, unroll=1):
        cute.arch.mbarrier_wait(ab_empty + smem_ab.index, smem_ab.phase)
        smem_ab.advance()


@cute.jit
def mma_worker(tiled_mma: cute.TiledMma, tCtAcc: cute.Tensor, tCrA: cute.Tensor, tCrB: cute.Tensor,
               ab_full, ab_empty, tmem_full, tmem_empty, my_tiles,
               k_tiles: cutlass.Constexpr, ab_stages: cutlass.Constexpr):
    """MMA warp (leader CTA only): consume SMEM-AB, produce TMEM-C.

    Per tile: wait until accumulator stage ``a`` is drained, then per k-block
    wait ``ab_full[s]``, issue four ``tcgen05.mma.cta_group::2`` (K = 16 each)
    and commit to ``ab_empty[s]`` of *both* CTAs (multicast mask ``0b11``).
    After the last k-block, commit to ``tmem_full[a]`` of both CTAs. After
    the last tile, the *producer tail* waits until every accumulator is drained.
    """
    smem_ab = DevicePipelineState.consumer(ab_stages)
    tmem_c = DevicePipelineState.producer(ACC_STAGES)  # phase 1: both accumulators start free
    for i in cutlass.range(my_tiles, unroll=1):
        cute.arch.mbarrier_wait(tmem_empty + tmem_c.index, tmem_c.phase)
        tcgen05_fence_after_thread_sync()
        acc = tCtAcc[(None, None, None, tmem_c.index)]
        tiled_mma.set(tcgen05.Field.ACCUMULATE, False)  # the first MMA of a tile overwrites
        for k in cutlass.range(k_tiles, unroll=1):
            cute.arch.mbarrier_wait(ab_full + smem_ab.index, smem_ab.phase)
            for kb in cutlass.range_constexpr(BLOCK_K // MMA_K):
                cute.gemm(tiled_mma, acc, tCrA[(None, None, kb, smem_ab.index)],
                          tCrB[(None, None, kb, smem_ab.index)], acc)
                tiled_mma.set(tcgen05.Field.ACCUMULATE, True)
            with cute.arch.elect_one():  # stage s is free once these MMAs have read it
                tcgen05.commit(ab_empty + smem_ab.index, 0b11, tcgen05.CtaGroup.TWO)
            smem_ab.advance()
        with cute.arch.elect_one():  # accumulator a is complete once every MMA of the tile is done
            tcgen05.commit(tmem_full + tmem_c.index, 0b11, tcgen05.CtaGroup.TWO)
        tmem_c.advance()
    # Producer tail: wait until both CTAs' epilogues have drained every accumulator stage, so the
    # last remote arrivals on tmem_empty have landed before the teardown frees TMEM.
    for _ in cutlass.range(ACC_STAGES, unroll=1):
        cute.arch.mbarrier_wait(tmem_empty + tmem_c.index, tmem_c.phase)
        tmem_c.advance()


@cute.jit
def epilogue_worker(tidx, tiled_copy_t2r: cute.TiledCopy, tTR_tAcc: cute.Tensor, tTR_rAcc: cute.Tensor,
                    tiled_copy_r2s: cute.TiledCopy, tRS_rC: cute.Tensor, tRS_sC: cute.Tensor,
                    tma_atom_c: cute.CopyAtom, bSG_sC: cute.Tensor, bSG_gC: cute.Tensor,
                    tmem_full, tmem_empty, cluster, my_tiles,
                    m_tiles: cutlass.Constexpr, n_tiles: cutlass.Constexpr, num_clusters: cutlass.Constexpr,
                    subtiles: cutlass.Constexpr):
    """Epilogue warpgroup (both CTAs): consume TMEM-C, produce SMEM-C, store C with TMA.

    Per tile: wait ``tmem_full[a]``; per 128 x ``epi_n`` sub-tile, ``tcgen05.ld``
    the fp32 accumulator into registers, convert to the output type, wait
    until the TMA store that last read staging buffer ``c`` has finished
    reading (``wait_group.read``), write the buffer, fence the async proxy and
    let one thread issue the TMA store. Then every warp tells the leader's
    MMA warp (remote arrive on ``tmem_empty[a]``) that accumulator ``a`` is free.
    """
    tmem_c = DevicePipelineState.consumer(ACC_STAGES)
    smem_c = DevicePipelineState.producer(C_STAGES)  # only the index is used: bulk groups, not mbarriers
    for i in cutlass.range(my_tiles, unroll=1):
        m_tile, n_tile = tile_coord_device(cluster + i * num_clusters, m_tiles, n_tiles)
        cute.arch.mbarrier_wait(tmem_full + tmem_c.index, tmem_c.phase)
        tcgen05_fence_after_thread_sync()
        for sub in cutlass.range_constexpr(subtiles):
            # TMEM -> registers, fp32 -> output type. tcgen05.ld is asynchronous: tcgen05.wait::ld
            # orders its reads before what follows (the conversion, and tmem_empty telling the MMA
            # warp it may overwrite the accumulator).
            cute.copy(tiled_copy_t2r, tTR_tAcc[(None, None, None, 0, sub, tmem_c.index)], tTR_rAcc)
            cute.arch.fence_view_async_tmem_load()
            tRS_rC.store(tiled_copy_r2s.retile(tTR_rAcc).load().to(tRS_rC.element_type))
            # SMEM-C: staging buffer c is free once the store issued C_STAGES stores ago has read it
            if tidx == 0:
                cute.arch.cp_async_bulk_wait_group(C_STAGES - 1, read=True)
            cute.arch.barrier(barrier_id=EPILOGUE_BARRIER_ID, number_of_threads=EPILOGUE_THREADS)
            cute.copy(tiled_copy_r2s, tRS_rC, tRS_sC[(None, None, None, smem_c.index)])
            cute.arch.fence_proxy("async.shared", space="cta")  # generic-proxy writes -> TMA reads
            cute.arch.barrier(barrier_id=EPILOGUE_BARRIER_ID, number_of_threads=EPILOGUE_THREADS)
            if tidx == 0:
                cute.copy(tma_atom_c, bSG_sC[(None, smem_c.index)], bSG_gC[(None, 0, sub, m_tile, n_tile)])
                cute.arch.cp_async_bulk_commit_group()
            smem_c.advance()
        # TMEM-C: this warp has read accumulator a; tell the leader CTA's MMA warp
        tcgen05_fence_before_thread_sync()
        with cute.arch.elect_one():
            cute.arch.mbarrier_arrive(tmem_empty + tmem_c.index, 0)
        tmem_c.advance()
    if tidx == 0:
        cute.arch.cp_async_bulk_wait_group(0, read=False)  # every store has landed in global memory


# --------------------------------------------------------------------------------------
# The kernel: set-up in the order of the notes, then the roles
# --------------------------------------------------------------------------------------


@cute.kernel
def gemm_kernel(tiled_mma: cute.TiledMma,
                tma_atom_a: cute.CopyAtom, mA: cute.Tensor,
                tma_atom_b: cute.CopyAtom, mB: cute.Tensor,
                tma_atom_c: cute.CopyAtom, mC: cute.Tensor,
                a_smem_layout: cute.ComposedLayout, b_smem_layout: cute.ComposedLayout,
                c_smem_layout: cute.ComposedLayout, epi_tile: cute.Tile,
                block_n: cutlass.Constexpr, ab_stages: cutlass.Constexpr, tmem_columns: cutlass.Constexpr,
                m_tiles: cutlass.Constexpr, n_tiles: cutlass.Constexpr, k_tiles: cutlass.Constexpr,
                num_clusters: cutlass.Constexpr, tx_bytes: cutlass.Constexpr,
                ab_dtype: cutlass.Constexpr, c_dtype: cutlass.Constexpr):
    warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    cta_rank = cute.arch.make_warp_uniform(cute.arch.block_idx_in_cluster())  # 0: leader, 1: peer
    is_leader = cta_rank == 0
    cluster = bidx // 2
    num_tiles = m_tiles * n_tiles
    my_tiles = (num_tiles - cluster + num_clusters - 1) // num_clusters  # tiles cluster, cluster + C, ...

    # 1. Descriptor prefetch: pull the three TMA descriptors into the cache early.
    if warp == TMA_WARP:
        cpasync.prefetch_descriptor(tma_atom_a)
        cpasync.prefetch_descriptor(tma_atom_b)
        cpasync.prefetch_descriptor(tma_atom_c)

    # 2. Shared memory: barriers first (8 bytes each), the TMEM address, then the tiles.
    smem = cutlass.memory.SmemAllocator()
    ab_full = smem.allocate_array(Int64, ab_stages)  # SMEM-AB: "stage s holds A and B" (leader's counts)
    ab_empty = smem.allocate_array(Int64, ab_stages)  # SMEM-AB: "stage s may be overwritten"
    tmem_full = smem.allocate_array(Int64, ACC_STAGES)  # TMEM-C: "accumulator a is complete"
    tmem_empty = smem.allocate_array(Int64, ACC_STAGES)  # TMEM-C: "accumulator a has been read" (leader's)
    tmem_addr = smem.allocate_array(Int32, 1)  # where tcgen05.alloc writes the TMEM base address
    sA = smem.allocate_tensor(ab_dtype, a_smem_layout.outer, byte_alignment=SMEM_ALIGN,
                              swizzle=a_smem_layout.inner)  # (MMA, MMA_M, MMA_K, STAGE)
    sB = smem.allocate_tensor(ab_dtype, b_smem_layout.outer, byte_alignment=SMEM_ALIGN,
                              swizzle=b_smem_layout.inner)  # (MMA, MMA_N, MMA_K, STAGE)
    sC = smem.allocate_tensor(c_dtype, c_smem_layout.outer, byte_alignment=SMEM_ALIGN,
                              swizzle=c_smem_layout.inner)  # (EPI_M, EPI_N, C_STAGE)

    # 3. Barrier init (one thread per CTA), then the cluster barrier: both CTAs are running,
    #    their barriers are initialised and visible cluster-wide before anything else happens.
    if warp == TMA_WARP:
        with cute.arch.elect_one():
            for s in cutlass.range_constexpr(ab_stages):
                cute.arch.mbarrier_init(ab_full + s, 1)  # the leader's arrive.expect_tx (+ bytes)
                cute.arch.mbarrier_init(ab_empty + s, 1)  # one tcgen05.commit
            for a in cutlass.range_constexpr(ACC_STAGES):
                cute.arch.mbarrier_init(tmem_full + a, 1)  # one tcgen05.commit
                cute.arch.mbarrier_init(tmem_empty + a, 2 * EPILOGUE_WARPS)  # every epilogue warp of the pair
            cute.arch.mbarrier_init_fence()
    cute.arch.cluster_arrive()
    cute.arch.cluster_wait()

    # 4. TMEM allocation, after the cluster barrier: tcgen05.alloc.cta_group::2 is one operation of the
    #    pair (warp 0 of each CTA takes part), so both CTAs must be past their set-up. Then publish the
    #    address: fence, CTA barrier, fence, and every warp may read it from shared memory.
    if warp == 0:
        cute.arch.alloc_tmem(tmem_columns, tmem_addr, is_two_cta=True)
    tcgen05_fence_before_thread_sync()
    cute.arch.barrier()
    tcgen05_fence_after_thread_sync()

    # 5. Views: this CTA's slice of the pair's MMA, tiles of A, B, C, and the accumulators in TMEM.
    thr_mma = tiled_mma.get_slice(cta_rank)
    gA = cute.local_tile(mA, (PAIR_M, BLOCK_K), (None, None))  # (PAIR_M, BLOCK_K, m_tiles, k_tiles)
    gB = cute.local_tile(mB, (block_n, BLOCK_K), (None, None))  # (block_n, BLOCK_K, n_tiles, k_tiles)
    gC = cute.local_tile(mC, (PAIR_M, block_n), (None, None))  # (PAIR_M, block_n, m_tiles, n_tiles)
    tCgA = thr_mma.partition_A(gA)  # this CTA's 128 rows of A
    tCgB = thr_mma.partition_B(gB)  # this CTA's half of B
    tCgC = thr_mma.partition_C(gC)  # this CTA's 128 rows of C
    tAsA, tAgA = cpasync.tma_partition(tma_atom_a, 0, cute.make_layout(1), cute.group_modes(sA, 0, 3),
                                       cute.group_modes(tCgA, 0, 3))
    tBsB, tBgB = cpasync.tma_partition(tma_atom_b, 0, cute.make_layout(1), cute.group_modes(sB, 0, 3),
                                       cute.group_modes(tCgB, 0, 3))
    tCrA = tiled_mma.make_fragment_A(sA)  # smem descriptors, (MMA, MMA_M, MMA_K, STAGE)
    tCrB = tiled_mma.make_fragment_B(sB)
    acc_shape = tiled_mma.partition_shape_C((PAIR_M, block_n))
    acc_layout = tiled_mma.make_fragment_C(cute.append(acc_shape, ACC_STAGES)).layout
    tmem_ptr = cute.arch.retrieve_tmem_ptr(Float32, alignment=16, ptr_to_buffer_holding_addr=tmem_addr)
    tCtAcc = cute.make_tensor(tmem_ptr, acc_layout)  # (MMA, MMA_M, MMA_N, ACC_STAGE) in TMEM

    # 6. The roles: one program per warp role, each looping over this cluster's tiles.
    if warp == TMA_WARP:
        tma_load_worker(tma_atom_a, tAgA, tAsA, tma_atom_b, tBgB, tBsB, ab_full, ab_empty, is_leader, cluster,
                        my_tiles, m_tiles, n_tiles, k_tiles, ab_stages, num_clusters, tx_bytes)
    if warp == MMA_WARP:
        if is_leader:
            mma_worker(tiled_mma, tCtAcc, tCrA, tCrB, ab_full, ab_empty, tmem_full, tmem_empty, my_tiles,
                       k_tiles, ab_stages)
    if warp < EPILOGUE_WARPS:
        # TMEM -> registers: a tcgen05.ld 32x32b copy, each thread one TMEM lane (one row of C)
        t2r_atom = utils.sm100.get_tmem_load_op((CTA_M, block_n, BLOCK_K), utils.LayoutEnum.ROW_MAJOR,
                                                c_dtype, Float32, epi_tile, True)
        tAcc_epi = cute.flat_divide(tCtAcc[((None, None), 0, 0, None)], epi_tile)  # (EM, EN, 1, subtiles, STAGE)
        tiled_copy_t2r = tcgen05.make_tmem_copy(t2r_atom, tAcc_epi[(None, None, 0, 0, 0)])
        thr_t2r = tiled_copy_t2r.get_slice(tidx)
        tTR_tAcc = thr_t2r.partition_S(tAcc_epi)
        gC_epi = cute.flat_divide(tCgC[((None, None), 0, 0, None, None)], epi_tile)  # (EM, EN, 1, sub, mt, nt)
        tTR_gC = thr_t2r.partition_D(gC_epi)
        tTR_rAcc = cute.make_rmem_tensor(tTR_gC[(None, None, None, 0, 0, 0, 0)].shape, Float32)
        tTR_rC = cute.make_rmem_tensor(tTR_rAcc.shape, c_dtype)
        # registers -> shared memory, matching the TMEM copy's register layout
        r2s_atom = utils.sm100.get_smem_store_op(utils.LayoutEnum.ROW_MAJOR, c_dtype, Float32,
                                                 tiled_copy_t2r)
        tiled_copy_r2s = cute.make_tiled_copy_D(r2s_atom, tiled_copy_t2r)
        tRS_sC = tiled_copy_r2s.get_slice(tidx).partition_D(sC)
        tRS_rC = tiled_copy_r2s.retile(tTR_rC)
        # shared memory -> global memory: one TMA store per sub-tile
        bSG_sC, bSG_gC = cpasync.tma_partition(tma_atom_c, 0, cute.make_layout(1), cute.group_modes(sC, 0, 2),
                                               cute.group_modes(gC_epi, 0, 2))
        epilogue_worker(tidx, tiled_copy_t2r, tTR_tAcc, tTR_rAcc, tiled_copy_r2s, tRS_rC, tRS_sC, tma_atom_c,
                        bSG_sC, bSG_gC, tmem_full, tmem_empty, cluster, my_tiles, m_tiles, n_tiles, num_clusters,
                        block_n // cute.size(epi_tile[1]))

    # 7. Teardown: the producers' tails have run, both CTAs pass the final cluster barrier (every MMA
    #    and every TMEM read of the pair is done), then warp 0 of each CTA gives up the allocation
    #    permit and frees the columns (both are pair operations too).
    tcgen05_fence_before_thread_sync()
    cute.arch.cluster_arrive()
    cute.arch.cluster_wait()
    if warp == 0:
        tcgen05_fence_after_thread_sync()
        cute.arch.relinquish_tmem_alloc_permit(is_two_cta=True)
        cute.arch.dealloc_tmem(tmem_ptr, tmem_columns, is_two_cta=True)


# --------------------------------------------------------------------------------------
# Host side: layouts, TMA descriptors, the launch
# --------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def _gemm_host(cfg: Sm100Config, m: int, n: int, k: int):
    """The ``@cute.jit`` host function for ``cfg`` and a static problem shape.

    It takes ``a`` (M x K), ``b`` (K x N, either major: the layout ``cfg.b_major``
    names) and ``c`` (M x N), the contract of :mod:`gemmlab.family.problem`, and
    builds the N x K view of ``b`` the MMA reads.
    """
    block_n, ab_stages = cfg.block_n, cfg.ab_stages
    b_mode = tcgen05.OperandMajorMode.K if cfg.b_major == "k" else tcgen05.OperandMajorMode.MN
    m_tiles, n_tiles, k_tiles = ceil_div(m, PAIR_M), ceil_div(n, block_n), ceil_div(k, BLOCK_K)
    num_clusters = min(cfg.num_clusters, m_tiles * n_tiles)

    @cute.jit
    def gemm_host(a: cute.Tensor, b_kn: cute.Tensor, c: cute.Tensor, stream: cuda.CUstream):
        b = cute.make_tensor(b_kn.iterator, cute.select(b_kn.layout, mode=[1, 0]))  # N x K view
        ab_dtype = a.element_type
        tiled_mma = utils.sm100.make_trivial_tiled_mma(ab_dtype, ab_dtype, tcgen05.OperandMajorMode.K, b_mode,
                                                       Float32, tcgen05.CtaGroup.TWO, (PAIR_M, block_n))
        mma_tiler = (PAIR_M, block_n, BLOCK_K)
        a_smem_layout = utils.sm100.make_smem_layout_a(tiled_mma, mma_tiler, ab_dtype, ab_stages)
        b_smem_layout = utils.sm100.make_smem_layout_b(tiled_mma, mma_tiler, ab_dtype, ab_stages)
        epi_tile = (CTA_M, cfg.epi_n)
        c_smem_layout = utils.sm100.make_smem_layout_epi(c.element_type, utils.LayoutEnum.ROW_MAJOR, epi_tile,
                                                         C_STAGES)
        cluster_vmnk = cute.tiled_divide(cute.make_layout((2, 1, 1)), (tiled_mma.thr_id.shape,))
        # 2-CTA TMA loads: each CTA fills its own SMEM, completion goes to the leader's barrier
        load_op = cpasync.CopyBulkTensorTileG2SOp(tcgen05.CtaGroup.TWO)
        tma_atom_a, tma_a = cute.nvgpu.make_tiled_tma_atom_A(
            load_op, a, cute.slice_(a_smem_layout, (None, None, None, 0)), mma_tiler, tiled_mma, cluster_vmnk.shape)
        tma_atom_b, tma_b = cute.nvgpu.make_tiled_tma_atom_B(
            load_op, b, cute.slice_(b_smem_layout, (None, None, None, 0)), mma_tiler, tiled_mma, cluster_vmnk.shape)
        tma_atom_c, tma_c = cpasync.make_tiled_tma_atom(
            cpasync.CopyBulkTensorTileS2GOp(), c, cute.select(c_smem_layout, mode=[0, 1]), epi_tile)
        gemm_kernel(tiled_mma, tma_atom_a, tma_a, tma_atom_b, tma_b, tma_atom_c, tma_c,
                    a_smem_layout, b_smem_layout, c_smem_layout, epi_tile,
                    block_n, ab_stages, cfg.tmem_columns, m_tiles, n_tiles, k_tiles, num_clusters,
                    cfg.tx_bytes, ab_dtype, c.element_type).launch(grid=(2 * num_clusters, 1, 1), block=(THREADS, 1, 1),
                                         cluster=(2, 1, 1), stream=stream)

    return gemm_host


def _fake_operands(cfg: Sm100Config, m: int, n: int, k: int):
    """Stand-ins for ``a`` (M x K), ``b`` (K x N in the layout ``cfg.b_major``) and ``c`` (M x N)."""
    dt = _TORCH_TO_CUTLASS[cfg.dtype]
    a = fake_tensor(dt, (m, k), stride_order=(1, 0))  # row-major: K contiguous
    # K x N: N contiguous ("n"), or the K-contiguous transpose view of a row-major N x K weight ("k")
    b = fake_tensor(dt, (k, n), stride_order=(1, 0) if cfg.b_major == "n" else (0, 1))
    c = fake_tensor(dt, (m, n), stride_order=(1, 0))
    return a, b, c


def compile_gemm_sm100(target: str = "sm_100a", cfg: Sm100Config | None = None, m: int = 4096, n: int = 4096,
                       k: int = 4096, *, tvm_ffi: bool = False):
    """Compile the kernel for ``cfg`` and shape (m, n, k), no GPU needed.

    ``cfg`` defaults to the heuristic's choice for a BF16 problem with B a weight's
    ``w.t()`` view (:func:`gemmlab.family.heuristic_sm100.choose`); it must pass
    :meth:`Sm100Config.check_fits`.

    ``tvm_ffi``: compile the cheap call path the plans use (:mod:`gemmlab.family.plan`):
    torch tensors in, torch's current stream implied.
    """
    check_target(target)
    if target != "sm_100a":
        raise ValueError(f"the tcgen05 GEMM needs target sm_100a; got {target!r}")
    m, n, k = (check_int(name, v, lo=1) for name, v in (("m", m), ("n", n), ("k", k)))  # before the DSL sees them
    if cfg is not None and not isinstance(cfg, Sm100Config):
        raise TypeError(f"cfg must be an Sm100Config; got {type(cfg).__name__}")
    # The contract's rules (K and N multiples of 8: 16-byte TMA rows), for cfg's dtype and layout when given
    problem = GemmProblem(m, n, k) if cfg is None else GemmProblem(m, n, k, cfg.dtype, cfg.dtype, cfg.b_major)
    cfg = cfg or choose(problem)
    cfg.check_fits()
    return compile_for(target, _gemm_host(cfg, m, n, k), *_fake_operands(cfg, m, n, k),
                       fake_stream(env=tvm_ffi), tvm_ffi=tvm_ffi)


# --------------------------------------------------------------------------------------
# Reading the compiled kernel back: shared memory per CTA, TMEM columns
# --------------------------------------------------------------------------------------


def barrier_names(cfg: Sm100Config) -> dict:
    """``{offset in shared memory: name}`` of the kernel's mbarriers, in the order :func:`gemm_kernel` allocates
    them (``ab_full[S]``, ``ab_empty[S]``, ``tmem_full[2]``, ``tmem_empty[2]``, 8 bytes each, from the start of
    dynamic shared memory): how a trace of an emulated run names what a warp waits on."""
    names, off = {}, 0
    for group, count in (("ab_full", cfg.ab_stages), ("ab_empty", cfg.ab_stages), ("tmem_full", ACC_STAGES),
                         ("tmem_empty", ACC_STAGES)):
        for i in range(count):
            names[off] = f"{group}[{i}]"
            off += 8
    return names


def launch_smem_bytes(compiled) -> int:
    """The dynamic shared memory the compiled host function asks for at launch.

    The DSL sums the kernel's ``SmemAllocator`` requests and stores the total
    in the launch configuration (``CUlaunchConfig.sharedMemBytes``, the third
    field of the struct the host code fills); this reads that constant from
    the host IR, so it is what the launch will really request.
    """
    import re

    ir = str(compiled.ir_module)
    gep = re.search(r"(%\d+) = llvm\.getelementptr %\d+\[0, 2\] : \(!llvm\.ptr\) -> !llvm\.ptr, "
                    r"!llvm\.struct<\(array<3 x i32>, array<3 x i32>, i64", ir)
    if not gep:
        raise RuntimeError("no launch configuration found in the host IR")
    store = re.search(r"llvm\.store (%\d+), " + re.escape(gep.group(1)) + r" : i64", ir[gep.end():])
    if not store:
        raise RuntimeError("the launch configuration's sharedMemBytes is never stored")
    const = re.search(re.escape(store.group(1)) + r" = llvm\.mlir\.constant\((\d+) : i64\)", ir)
    if not const:
        raise RuntimeError("sharedMemBytes is not a compile-time constant")
    return int(const.group(1))


def tmem_alloc_columns(compiled) -> int:
    """The column count of the kernel's ``tcgen05.alloc`` (read from the PTX)."""
    import re

    from ..compile import ptx_of

    ptx = ptx_of(compiled)
    alloc = re.search(r"tcgen05\.alloc\.cta_group::2\S*\s+\[[^\]]+\],\s*(%r\d+|\d+);", ptx)
    if not alloc:
        raise RuntimeError("no tcgen05.alloc.cta_group::2 in the PTX")
    operand = alloc.group(1)
    if operand.isdigit():
        return int(operand)
    movs = re.findall(r"mov\.b32\s+" + re.escape(operand) + r",\s*(\d+);", ptx[:alloc.start()])
    if not movs:
        raise RuntimeError(f"cannot find the value of {operand}")
    return int(movs[-1])


# --------------------------------------------------------------------------------------
# Reading the compiled kernel back: the constants and the order of the set-up and teardown
# --------------------------------------------------------------------------------------

_DEF = re.compile(r"^(mov\.b32|mov\.u32|mov\.b16|or\.b32|selp\.b32|and\.b32)\s+(%\w+),\s*(.+?);")


def _ptx_code_lines(ptx: str) -> list[str]:
    return [ln.strip() for ln in ptx.splitlines() if ln.strip() and not ln.strip().startswith("//")]


def _value(lines: list[str], upto: int, operand: str) -> int | None:
    """The value of ``operand`` at line ``upto``: an immediate, or a register traced back through
    ``mov``, ``or`` and ``and`` with immediates, and ``selp`` (its *false* arm: the DSL's run-time MMA
    fields, negate A/B, are off unless a kernel turns them on). None when not a constant."""
    operand = operand.strip()
    if re.fullmatch(r"-?\d+", operand):
        return int(operand)
    for i in range(upto - 1, -1, -1):
        mt = _DEF.match(lines[i])
        if not mt or mt.group(2) != operand:
            continue
        op, args = mt.group(1), [a.strip() for a in mt.group(3).split(",")]
        if op.startswith("mov"):
            return _value(lines, i, args[0])
        if op == "selp.b32":
            return _value(lines, i, args[1])
        vals = [_value(lines, i, a) for a in args]
        if None in vals:
            return None
        return (vals[0] | vals[1]) if op == "or.b32" else (vals[0] & vals[1])
    return None


def static_evidence(compiled) -> dict:
    """What the compiled kernel's PTX says about the points that decide whether it can work on a B200.

    Read from the PTX text, with register values traced back to their immediates:

    * ``idesc``: the instruction descriptor of every ``tcgen05.mma`` (negation off);
    * ``smem_desc_or``: the 64-bit constants ORed onto ``address >> 4`` to form the shared-memory
      descriptors (the SM100 fields other than the start address);
    * ``tma_bar_mask``: the mask ANDed onto the barrier address of every 2-CTA TMA load;
    * ``barrier_counts``: arrival count of every ``mbarrier.init`` by byte offset in shared memory;
    * ``commit_masks``: the CTA mask of every multicast ``tcgen05.commit``;
    * ``expect_tx``: the byte counts announced with ``mbarrier.arrive.expect_tx``;
    * ``per_k_block``: the MMAs, commits and TMA loads in the code (each sits once in its loop body);
    * ``waits``: the number of ``mbarrier.try_wait`` sites (loop waits and tails);
    * ``order``: line numbers (in PTX program order) of the set-up and teardown steps.
    """
    from ..compile import ptx_of

    lines = _ptx_code_lines(ptx_of(compiled) if not isinstance(compiled, str) else compiled)

    def where(pattern):
        return [i for i, ln in enumerate(lines) if re.search(pattern, ln)]

    ev = {"idesc": [], "smem_desc_or": [], "tma_bar_mask": [], "barrier_counts": {}, "commit_masks": [],
          "expect_tx": []}
    for i in where(r"^tcgen05\.mma"):
        ops = [o.strip() for o in lines[i].split(None, 1)[1].split(",")]
        ev["idesc"].append(_value(lines, i, ops[3]))
    for i in where(r"^or\.b64"):
        imm = int(lines[i].rstrip(";").split(",")[-1])
        if imm >= 1 << 32:
            ev["smem_desc_or"].append(imm & (1 << 64) - 1)
    loads = where(r"^cp\.async\.bulk\.tensor.*shared::cluster\.global.*cta_group::2")
    for i in loads:
        bar = re.findall(r"\[(%r\d+)\]", lines[i])[-1]
        mask = None
        for j in range(i - 1, -1, -1):
            mt = re.match(r"^and\.b32\s+" + re.escape(bar) + r",\s*%r\d+,\s*(-?\d+);", lines[j])
            if mt:
                mask = int(mt.group(1)) & 0xFFFFFFFF
                break
            if re.match(r"^\S+\s+" + re.escape(bar) + r",", lines[j]):
                break
        ev["tma_bar_mask"].append(mask)
    for i in where(r"^mbarrier\.init"):
        mt = re.match(r"^mbarrier\.init\.shared\.b64\s+\[%r\d+(?:\+(\d+))?\],\s*(\S+);", lines[i])
        ev["barrier_counts"][int(mt.group(1) or 0)] = _value(lines, i, mt.group(2))
    for i in where(r"^tcgen05\.commit.*multicast"):
        ev["commit_masks"].append(_value(lines, i, lines[i].rstrip(";").split(",")[-1]))
    for i in where(r"^mbarrier\.arrive\.expect_tx"):
        ev["expect_tx"].append(_value(lines, i, lines[i].rstrip(";").split(",")[-1]))
    ev["per_k_block"] = {"mma": len(where(r"^tcgen05\.mma")), "commit": len(where(r"^tcgen05\.commit")),
                         "tma_load": len(loads)}
    ev["waits"] = sum(ln.count("mbarrier.try_wait") for ln in lines)
    ev["order"] = {name: where(pattern) for name, pattern in (
        ("mbarrier.init", r"^mbarrier\.init"), ("barrier.cluster.wait", r"^barrier\.cluster\.wait"),
        ("tcgen05.alloc", r"^tcgen05\.alloc"), ("bar.sync 0", r"^bar(rier)?\.sync\s+0;"),
        ("tcgen05.mma", r"^tcgen05\.mma"), ("tcgen05.relinquish_alloc_permit", r"^tcgen05\.relinquish"),
        ("tcgen05.dealloc", r"^tcgen05\.dealloc"))}
    return ev


def setup_order(compiled) -> list[str]:
    """The set-up and teardown steps of the kernel in PTX program order (names only, for the notebook)."""
    order = static_evidence(compiled)["order"]
    first_last = []
    for name, idx in order.items():
        if name == "tcgen05.mma":
            continue
        for i in ((idx[-1],) if name == "mbarrier.init" else idx):
            first_last.append((i, name + (" (last)" if name == "mbarrier.init" else "")))
    return [name for _, name in sorted(first_last)]
