"""Chapter 07: the persistent, warp-specialized Hopper GEMM (the production kernel).

What it adds over chapter 06
    Chapter 06 built the first TMA + WGMMA GEMM: one CTA per output tile, one
    consumer warpgroup, a k-loop fed by a TMA ring. This kernel keeps that
    core and adds what the fast Hopper GEMMs (CUTLASS, DeepGEMM) add:

    * **Warp specialization with register reallocation.** Warpgroup 0 is the
      *producer*: one warp issues every TMA load. Warpgroups 1 and 2 are the
      *consumers*: each owns 64 rows of the 128-row tile and runs WGMMA. The
      producer needs almost no registers, so ``setmaxnreg`` gives 40 of its
      per-thread registers back (``warpgroup_reg_dealloc``) and the consumers
      take 232 (``warpgroup_reg_alloc``): room for a 64 x 256 FP32
      accumulator (128 registers per thread) plus addresses.
    * **A persistent grid.** One CTA per SM (one cluster per SM pair); each
      walks output tiles ``cluster, cluster + num_clusters, ...`` in the
      grouped order of :class:`gemmlab.scheduler.TileScheduler`.
    * **One pipeline across all tiles.** The ring of ``stages`` shared-memory
      stages (``full`` / ``empty`` mbarriers) is walked with
      :class:`gemmlab.pipeline.DevicePipelineState`, created once and never
      reset: the producer runs ahead into the next tile's k-blocks while the
      consumers still finish the current one.
    * **Clusters with TMA multicast.** Two CTAs of a cluster compute
      neighbouring tiles that share an operand panel (the same B columns
      when the cluster spans M). Each loads half of the shared panel and
      multicasts it to both, halving that operand's L2 -> SM traffic. A
      consumer then frees a stage in *both* CTAs (a remote mbarrier arrive),
      because the peer's producer writes into its shared memory.
    * **A TMA-store epilogue that overlaps the next tile.** The accumulator is
      converted to BF16/FP16, written to a small ring of shared-memory
      sub-tiles with ``stmatrix``, and stored by TMA. Each consumer warpgroup
      stores its own 64 rows (its own named barrier, its own TMA store), so
      the two warpgroups never wait for each other. They only wait for a
      sub-tile buffer to be *read* before reusing it, so the last stores of a
      tile drain while the next tile's k-loop already runs (and the producer
      has been prefetching that tile all along).

Roles at a glance (384 threads per CTA)::

    warpgroup 0  warp 0     producer: for each tile, for each k-block:
                              wait empty[s] -> expect_tx(full[s]) -> TMA A, TMA B (multicast)
                 warps 1-3  idle (they give their registers away and wait at the end)
    warpgroups 1, 2         consumers: for each tile: for each k-block:
                              wait full[s] -> 4 x wgmma 64xNx16 -> release stage s-1 (all CTAs of the cluster)
                            then epilogue: acc -> bf16 -> stmatrix to sC[buf] -> TMA store (own 64 rows)

Pipelines, named after what they carry
    * ``full[s]`` / ``empty[s]`` (stage ring, ``stages`` deep): A and B k-blocks.
    * the bulk-async group of the TMA stores (``epi_stages`` deep, one per
      consumer warpgroup): C sub-tiles.

Partial tiles need no code: TMA loads fill out-of-bounds elements with zero
and TMA stores drop them.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
import cutlass.utils as utils
import cutlass.utils.hopper_helpers as sm90_utils
import cuda.bindings.driver as cuda
from cutlass import Float32, Int32, Int64
from cutlass.cute.nvgpu import cpasync, warpgroup
from cutlass.memory import SmemAllocator

from .checks import check_choice, check_int
from .pipeline import DevicePipelineState
from .scheduler import RASTERS, device_tile

#: Shared memory a Hopper CTA may use (227 KB), in bytes.
SMEM_LIMIT = 227 * 1024
#: Threads: one producer warpgroup + two consumer warpgroups.
THREADS = 384
PRODUCER_REGS = 40  # setmaxnreg.dec: TMA issue needs a handful of registers
CONSUMER_REGS = 232  # setmaxnreg.inc: 128 accumulator registers + operands; 128*40 + 256*232 <= 64K
CONSUMER_WARPS = 8
EPI_BARRIER = 1  # named barrier ids: 1 (+1 for the second consumer warpgroup); 0 is __syncthreads


@dataclass(frozen=True)
class GemmConfig:
    """One compiled variant of the kernel.

    ``tile_n``: N of the CTA tile (M is always 128: two consumer warpgroups
    of 64 rows). ``cluster``: ``(cluster_m, cluster_n)``, ``(2, 1)`` pairs
    two CTAs along M (they share B, which is multicast), ``(1, 2)`` along N
    (they share A). ``raster``/``group``: the tile order of
    :class:`gemmlab.scheduler.TileScheduler`, over *cluster* tiles.
    ``epi_per_wg`` (default): each consumer warpgroup stores its own 64-row
    half of every sub-tile (a 64 x ``epi_n`` TMA box, a 128-thread named
    barrier per warpgroup); ``False``: both warpgroups meet at 256-thread
    barriers and one warp stores the whole 128-row sub-tile.
    """

    tile_n: int = 256
    stages: int = 4
    cluster: tuple = (2, 1)
    raster: str = "m"
    group: int = 8
    tile_m: int = 128
    tile_k: int = 64
    epi_n: int = 32
    epi_stages: int = 4
    epi_per_wg: bool = True

    def __post_init__(self):
        check_int("tile_n", self.tile_n, lo=64, hi=256, multiple_of=16)
        check_choice("tile_m", self.tile_m, (128,))
        check_choice("tile_k", self.tile_k, (64,))
        check_int("stages", self.stages, lo=2, hi=12)
        check_choice("cluster", tuple(self.cluster), ((1, 1), (2, 1), (1, 2)))
        check_choice("raster", self.raster, RASTERS)
        check_int("group", self.group, lo=1)
        check_choice("epi_n", self.epi_n, (16, 32, 48, 64))
        check_int("epi_stages", self.epi_stages, lo=1, hi=8)
        check_choice("epi_per_wg", self.epi_per_wg, (False, True))
        if self.tile_n % self.epi_n:
            raise ValueError(f"epi_n must divide tile_n={self.tile_n}; got epi_n={self.epi_n}")
        if self.epi_per_wg and self.epi_n == 48:
            # 48 columns are three 16-column swizzle atoms side by side, so a 64-row half of
            # a sub-tile is not one contiguous block: it cannot be a TMA box of its own.
            raise ValueError("epi_per_wg needs epi_n in (16, 32, 64): the rows of a 64-row half must be contiguous")
        if self.smem_bytes() > SMEM_LIMIT:
            raise ValueError(f"stages={self.stages} with tile_n={self.tile_n} needs {self.smem_bytes()} bytes "
                             f"of shared memory; a CTA may use {SMEM_LIMIT}")

    @property
    def epi_ring_aligned(self) -> bool:
        """Whether each tile's sub-tiles fill the epilogue ring a whole number of times.

        Then sub-tile ``e`` always uses buffer ``e % epi_stages`` and the last
        stores of a tile may still be in flight when the next tile's epilogue
        starts. Otherwise the epilogue drains its stores at the end of each tile.
        """
        return (self.tile_n // self.epi_n) % self.epi_stages == 0

    @property
    def cluster_size(self) -> int:
        return self.cluster[0] * self.cluster[1]

    def stage_bytes(self, elem_bytes: int = 2) -> int:
        """Bytes one ring stage holds: an A block (tile_m x tile_k) and a B block (tile_n x tile_k)."""
        return (self.tile_m + self.tile_n) * self.tile_k * elem_bytes

    def smem_bytes(self, elem_bytes: int = 2) -> int:
        """Shared memory per CTA: the A/B ring, the C sub-tile ring, the mbarriers (plus alignment slack)."""
        ring = self.stages * self.stage_bytes(elem_bytes)
        epi = self.epi_stages * self.tile_m * self.epi_n * elem_bytes
        return ring + epi + 2 * self.stages * 8 + 1024

    def tiles(self, m: int, n: int) -> tuple[int, int]:
        """CTA tiles along M and N (partial tiles count)."""
        return -(-m // self.tile_m), -(-n // self.tile_n)

    def cluster_tiles(self, m: int, n: int) -> tuple[int, int]:
        mt, nt = self.tiles(m, n)
        return -(-mt // self.cluster[0]), -(-nt // self.cluster[1])


# --------------------------------------------------------------------------------------
# The kernel
# --------------------------------------------------------------------------------------


@cute.jit
def release_stage(empty_bar, stage: Int32, cluster_size: cutlass.Constexpr):
    """A consumer warp frees ring stage ``stage`` in every CTA of its cluster.

    One lane per destination CTA arrives (``mapa`` + remote ``mbarrier.arrive``
    when the cluster has 2 CTAs): the peer's producer multicasts into our
    shared memory, so it must hear from us too. ``empty`` counts
    ``CONSUMER_WARPS x cluster_size`` arrivals per phase.
    """
    lane = cute.arch.lane_idx()
    if cutlass.const_expr(cluster_size == 1):
        if lane == 0:
            cute.arch.mbarrier_arrive(empty_bar + stage)
    else:
        if lane < cluster_size:
            cute.arch.mbarrier_arrive(empty_bar + stage, lane)


@cute.kernel
def gemm_kernel(
    tma_a: cute.CopyAtom, mA: cute.Tensor,
    tma_b: cute.CopyAtom, mB: cute.Tensor,
    tma_c: cute.CopyAtom, mC: cute.Tensor,
    tiled_mma: cute.TiledMma,
    a_smem: cute.ComposedLayout, b_smem: cute.ComposedLayout, c_smem: cute.ComposedLayout,
    cfg: cutlass.Constexpr, m_ctiles: cutlass.Constexpr, n_ctiles: cutlass.Constexpr,
    k_tiles: cutlass.Constexpr, ab_type: cutlass.Constexpr, c_type: cutlass.Constexpr,
    c_major_m: cutlass.Constexpr,
):
    BM, BN, BK = cfg.tile_m, cfg.tile_n, cfg.tile_k
    CM, CN = cfg.cluster
    CS = CM * CN
    stages = cfg.stages
    num_tiles = m_ctiles * n_ctiles

    tidx, _, _ = cute.arch.thread_idx()
    warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
    wg = warp // 4
    bid, _, _ = cute.arch.block_idx()
    grid, _, _ = cute.arch.grid_dim()
    cluster_id = bid // CS
    num_clusters = grid // CS
    rank = cute.arch.make_warp_uniform(cute.arch.block_idx_in_cluster())
    # Which neighbour this CTA is inside its cluster: along M or along N.
    rank_m = rank if cutlass.const_expr(CM > 1) else 0
    rank_n = rank if cutlass.const_expr(CN > 1) else 0

    # ---------------------------------------------------------------- shared memory
    smem = SmemAllocator()
    sA = smem.allocate_tensor(ab_type, a_smem.outer, byte_alignment=1024, swizzle=a_smem.inner)
    sB = smem.allocate_tensor(ab_type, b_smem.outer, byte_alignment=1024, swizzle=b_smem.inner)
    sC = smem.allocate_tensor(c_type, c_smem.outer, byte_alignment=1024, swizzle=c_smem.inner)
    full = smem.allocate_array(Int64, stages, byte_alignment=8)  # "stage s holds A and B": TMA bytes
    empty = smem.allocate_array(Int64, stages, byte_alignment=8)  # "stage s may be refilled": consumer warps

    if warp == 0:
        cpasync.prefetch_descriptor(tma_a)
        cpasync.prefetch_descriptor(tma_b)
        cpasync.prefetch_descriptor(tma_c)
        with cute.arch.elect_one():
            for s in cutlass.range_constexpr(stages):
                cute.arch.mbarrier_init(full + s, 1)
                cute.arch.mbarrier_init(empty + s, CONSUMER_WARPS * CS)
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
    gC = cute.local_tile(mC, (BM, BN), (None, None))  # (BM, BN, m_tiles, n_tiles)

    # The multicast operand is split across the CTAs that share it: each loads
    # its slice and sends it to all of them (mask 0b11).
    a_parts = CN  # CTAs sharing an A panel (cluster along N)
    b_parts = CM  # CTAs sharing a B panel (cluster along M)
    tAsA, tAgA = cpasync.tma_partition(tma_a, rank_n, cute.make_layout(a_parts),
                                       cute.group_modes(sA, 0, 2), cute.group_modes(gA, 0, 2))
    tBsB, tBgB = cpasync.tma_partition(tma_b, rank_m, cute.make_layout(b_parts),
                                       cute.group_modes(sB, 0, 2), cute.group_modes(gB, 0, 2))
    mcast_mask = cutlass.Int16((1 << CS) - 1)  # every CTA of the cluster receives the slice
    stage_bytes = cute.size_in_bytes(ab_type, cute.slice_(a_smem, (None, None, 0))) + \
        cute.size_in_bytes(ab_type, cute.slice_(b_smem, (None, None, 0)))

    if wg == 0:
        # ============================================================ producer warpgroup
        cute.arch.warpgroup_reg_dealloc(PRODUCER_REGS)
        if warp == 0:
            state = DevicePipelineState.producer(stages)  # carried across all tiles
            linear = cluster_id
            while linear < num_tiles:
                mc, nc = device_tile(linear, m_ctiles, n_ctiles, cfg.raster, cfg.group)
                m_tile = mc * CM + rank_m
                n_tile = nc * CN + rank_n
                for k in cutlass.range(k_tiles, unroll=1):
                    cute.arch.mbarrier_wait(empty + state.index, state.phase)
                    with cute.arch.elect_one():
                        # Our barrier expects the whole stage: our own loads plus
                        # the slices the peer multicasts to us.
                        cute.arch.mbarrier_arrive_and_expect_tx(full + state.index, stage_bytes)
                    if cutlass.const_expr(a_parts > 1):
                        cute.copy(tma_a, tAgA[(None, m_tile, k)], tAsA[(None, state.index)],
                                  tma_bar_ptr=full + state.index, mcast_mask=mcast_mask)
                    else:
                        cute.copy(tma_a, tAgA[(None, m_tile, k)], tAsA[(None, state.index)],
                                  tma_bar_ptr=full + state.index)
                    if cutlass.const_expr(b_parts > 1):
                        cute.copy(tma_b, tBgB[(None, n_tile, k)], tBsB[(None, state.index)],
                                  tma_bar_ptr=full + state.index, mcast_mask=mcast_mask)
                    else:
                        cute.copy(tma_b, tBgB[(None, n_tile, k)], tBsB[(None, state.index)],
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
        cute.arch.warpgroup_reg_alloc(CONSUMER_REGS)
        ctid = tidx - 128  # 0..255 over the two consumer warpgroups
        thr_mma = tiled_mma.get_slice(ctid)
        tCsA = thr_mma.partition_A(sA)
        tCsB = thr_mma.partition_B(sB)
        tCrA = tiled_mma.make_fragment_A(tCsA)
        tCrB = tiled_mma.make_fragment_B(tCsB)
        acc = cute.make_rmem_tensor(thr_mma.partition_C(gC).shape[:3], Float32)
        k_blocks = cute.size(tCrA, mode=[2])

        # Epilogue copies: registers -> shared (stmatrix), shared -> global (TMA).
        st_atom = cute.make_copy_atom(cute.nvgpu.warp.StMatrix8x8x16bOp(c_major_m, 4), c_type)
        r2s = cute.make_tiled_copy_S(st_atom, cute.make_tiled_copy_C_atom(st_atom, tiled_mma))
        thr_r2s = r2s.get_slice(ctid)
        tRS_sC = thr_r2s.partition_D(sC)  # (R2S, R2S_M, R2S_N, epi_stages)
        tRS_acc = r2s.retile(acc)
        sub_shape = cute.shape(thr_r2s.partition_S(sC))[:3]
        sub_f32 = cute.make_rmem_tensor(sub_shape, Float32)
        sub_out = cute.make_rmem_tensor(sub_shape, c_type)
        sub_size = cute.size(sub_f32)
        epi_tile = (BM, cfg.epi_n)
        epi_count = BN // cfg.epi_n

        read = DevicePipelineState.consumer(stages)  # next stage to compute on
        release = DevicePipelineState.consumer(stages)  # next stage to hand back
        linear = cluster_id
        while linear < num_tiles:
            mc, nc = device_tile(linear, m_ctiles, n_ctiles, cfg.raster, cfg.group)
            m_tile = mc * CM + rank_m
            n_tile = nc * CN + rank_n

            # ---- main loop: keep one wgmma batch in flight, free the stage before it
            acc.fill(0.0)
            tiled_mma.set(warpgroup.Field.ACCUMULATE, True)
            warpgroup.fence()
            cute.arch.mbarrier_wait(full + read.index, read.phase)
            for kb in cutlass.range_constexpr(k_blocks):
                cute.gemm(tiled_mma, acc, tCrA[(None, None, kb, read.index)],
                          tCrB[(None, None, kb, read.index)], acc)
            warpgroup.commit_group()
            read.advance()
            for k in cutlass.range(1, k_tiles, unroll=1):
                cute.arch.mbarrier_wait(full + read.index, read.phase)
                for kb in cutlass.range_constexpr(k_blocks):
                    cute.gemm(tiled_mma, acc, tCrA[(None, None, kb, read.index)],
                              tCrB[(None, None, kb, read.index)], acc)
                warpgroup.commit_group()
                warpgroup.wait_group(1)  # the previous k-block's wgmmas are done...
                release_stage(empty, release.index, CS)  # ...so its stage may be refilled
                release.advance()
                read.advance()
            warpgroup.wait_group(0)
            release_stage(empty, release.index, CS)
            release.advance()

            # ---- epilogue: sub-tiles of BM x epi_n through a ring of epi_stages buffers
            gC_tile = gC[(None, None, m_tile, n_tile)]
            if cutlass.const_expr(cfg.epi_per_wg):
                # Each warpgroup stores its own 64 rows: (64, epi_n) boxes, its own barrier.
                half = wg - 1
                gC_epi = cute.zipped_divide(gC_tile, (BM // 2, cfg.epi_n))  # ((64,en),(2,epi_count))
                sC_half = cute.zipped_divide(sC, (BM // 2, cfg.epi_n))  # ((64,en),(2,1,epi_stages))
                bSG_sC, bSG_gC = cpasync.tma_partition(tma_c, 0, cute.make_layout(1), sC_half, gC_epi)
            else:
                gC_epi = cute.zipped_divide(gC_tile, epi_tile)
                bSG_sC, bSG_gC = cpasync.tma_partition(tma_c, 0, cute.make_layout(1),
                                                       cute.group_modes(sC, 0, 2), gC_epi)
            for e in cutlass.range_constexpr(epi_count):
                buf = e % cfg.epi_stages  # static: e is a compile-time index
                for v in cutlass.range_constexpr(sub_size):
                    sub_f32[v] = tRS_acc[e * sub_size + v]
                sub_out.store(sub_f32.load().to(c_type))
                cute.copy(r2s, sub_out, tRS_sC[(None, None, None, buf)])
                # Generic-proxy writes must be visible to the TMA (async proxy) read.
                cute.arch.fence_proxy("async.shared", space="cta")
                if cutlass.const_expr(cfg.epi_per_wg):
                    cute.arch.barrier(barrier_id=EPI_BARRIER + half, number_of_threads=128)
                    if warp % 4 == 0:
                        cute.copy(tma_c, bSG_sC[(None, (half, 0, buf))], bSG_gC[(None, (half, e))])
                        cute.arch.cp_async_bulk_commit_group()
                        cute.arch.cp_async_bulk_wait_group(cfg.epi_stages - 1, read=True)
                        if cutlass.const_expr(e == epi_count - 1 and not cfg.epi_ring_aligned):
                            cute.arch.cp_async_bulk_wait_group(0, read=True)
                    cute.arch.barrier(barrier_id=EPI_BARRIER + half, number_of_threads=128)
                else:
                    cute.arch.barrier(barrier_id=EPI_BARRIER, number_of_threads=256)
                    if warp == 4:
                        cute.copy(tma_c, bSG_sC[(None, buf)], bSG_gC[(None, (0, e))])
                        cute.arch.cp_async_bulk_commit_group()
                        # Buffer reuse: the store issued epi_stages-1 ago must have *read*
                        # its buffer; the newer ones stay in flight (and drain during the
                        # next tile's main loop).
                        cute.arch.cp_async_bulk_wait_group(cfg.epi_stages - 1, read=True)
                        if cutlass.const_expr(e == epi_count - 1 and not cfg.epi_ring_aligned):
                            # The next tile restarts at buffer 0, which a store still in
                            # flight may be reading: drain (only for unaligned rings).
                            cute.arch.cp_async_bulk_wait_group(0, read=True)
                    cute.arch.barrier(barrier_id=EPI_BARRIER, number_of_threads=256)
            linear = linear + num_clusters
        if warp % 4 == 0:  # the store warp(s): warp 4 (and warp 8 with epi_per_wg)
            cute.arch.cp_async_bulk_wait_group(0, read=True)


# --------------------------------------------------------------------------------------
# The host side
# --------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def gemm_host(cfg: GemmConfig, num_clusters: int):
    """The ``@cute.jit`` host function of ``cfg`` with a grid of ``num_clusters`` clusters.

    Takes ``a`` (M, K), ``b`` (N, K) with either K or N contiguous, ``c``
    (M, N) row-major, and the stream. Everything else is derived from the
    tensors at compile time.
    """

    @cute.jit
    def gemm_sm90_host(a: cute.Tensor, b: cute.Tensor, c: cute.Tensor, stream: cuda.CUstream):
        ab_type = a.element_type
        a_layout = utils.LayoutEnum.from_tensor(a)
        b_layout = utils.LayoutEnum.from_tensor(b)
        c_layout = utils.LayoutEnum.from_tensor(c)
        tile = (cfg.tile_m, cfg.tile_n, cfg.tile_k)
        # Two 64-row WGMMA atoms stacked along M: one per consumer warpgroup.
        tiled_mma = sm90_utils.make_trivial_tiled_mma(
            ab_type, ab_type, a_layout.sm90_mma_major_mode(), b_layout.sm90_mma_major_mode(),
            Float32, (2, 1, 1), tiler_mn=(64, cfg.tile_n))
        a_smem = sm90_utils.make_smem_layout_a(a_layout, tile, ab_type, cfg.stages)
        b_smem = sm90_utils.make_smem_layout_b(b_layout, tile, ab_type, cfg.stages)
        epi_tile = (cfg.tile_m, cfg.epi_n)
        c_smem = sm90_utils.make_smem_layout_epi(c.element_type, c_layout, epi_tile, cfg.epi_stages)

        cm, cn = cfg.cluster
        a_op = cpasync.CopyBulkTensorTileG2SMulticastOp() if cn > 1 else cpasync.CopyBulkTensorTileG2SOp()
        b_op = cpasync.CopyBulkTensorTileG2SMulticastOp() if cm > 1 else cpasync.CopyBulkTensorTileG2SOp()
        tma_a, tA = cpasync.make_tiled_tma_atom(a_op, a, cute.slice_(a_smem, (None, None, 0)),
                                                (cfg.tile_m, cfg.tile_k), num_multicast=cn)
        tma_b, tB = cpasync.make_tiled_tma_atom(b_op, b, cute.slice_(b_smem, (None, None, 0)),
                                                (cfg.tile_n, cfg.tile_k), num_multicast=cm)
        if cutlass.const_expr(cfg.epi_per_wg):  # one 64-row half per warpgroup
            half_tile = (cfg.tile_m // 2, cfg.epi_n)
            c_half = sm90_utils.make_smem_layout_epi(c.element_type, c_layout, half_tile, 1)
            tma_c, tC = cpasync.make_tiled_tma_atom(cpasync.CopyBulkTensorTileS2GOp(), c,
                                                    cute.slice_(c_half, (None, None, 0)), half_tile)
        else:
            tma_c, tC = cpasync.make_tiled_tma_atom(cpasync.CopyBulkTensorTileS2GOp(), c,
                                                    cute.slice_(c_smem, (None, None, 0)), epi_tile)

        m, n = cute.size(c, mode=[0]), cute.size(c, mode=[1])
        k = cute.size(a, mode=[1])
        m_ctiles = -(-(-(-m // cfg.tile_m)) // cm)
        n_ctiles = -(-(-(-n // cfg.tile_n)) // cn)
        k_tiles = -(-k // cfg.tile_k)
        gemm_kernel(tma_a, tA, tma_b, tB, tma_c, tC, tiled_mma, a_smem, b_smem, c_smem,
                    cfg, m_ctiles, n_ctiles, k_tiles, ab_type, c.element_type,
                    c_layout.is_m_major_c()).launch(
            grid=(num_clusters * cfg.cluster_size, 1, 1), block=(THREADS, 1, 1),
            cluster=(cfg.cluster_size, 1, 1), stream=stream)

    return gemm_sm90_host


# --------------------------------------------------------------------------------------
# Compile-only (any machine) and measurement (sm90)
# --------------------------------------------------------------------------------------


def compile_gemm(target: str = "sm_90a", m: int = 1000, n: int = 1032, k: int = 520, cfg: GemmConfig | None = None,
                 b_k_major: bool = True, num_clusters: int = 66):
    """Compile the kernel for ``(m, n, k)`` BF16 without a GPU; returns the compiled function (``.__ptx__``)."""
    from cutlass import BFloat16

    from .compile import check_target, compile_for, fake_stream, fake_tensor
    from .heuristic import choose

    check_target(target)
    for name, v in (("m", m), ("n", n), ("k", k)):
        check_int(name, v, lo=1)
    check_int("num_clusters", num_clusters, lo=1)
    cfg = cfg or choose(m, n, k)
    a = fake_tensor(BFloat16, (m, k), stride_order=(1, 0))
    b = fake_tensor(BFloat16, (n, k), stride_order=(1, 0) if b_k_major else (0, 1))
    c = fake_tensor(BFloat16, (m, n), stride_order=(1, 0))
    return compile_for(target, gemm_host(cfg, num_clusters), a, b, c, fake_stream())


#: The shapes of the issue's benchmark: (M, N, K).
BENCH_SHAPES = [(4096, 2112, 7168), (4096, 576, 7168), (4096, 24576, 1536), (4096, 32768, 512),
                (4096, 7168, 16384), (4096, 4096, 7168), (4096, 7168, 2048), (4096, 4096, 4096),
                (8192, 8192, 8192), (2048, 2048, 8192)]
#: Dense BF16 tensor-core peak of an H100/H200 SXM, TFLOP/s.
PEAK_TFLOPS = 989.0


#: How :func:`benchmark` times, in one line (stored with the results).
METHOD = ("ours and torch.matmul interleaved in rounds (order rotated each round) on the same rotated input sets "
          "(>= 4 x L2 in total when a set is smaller), each launch timed by CUDA events back to back; "
          "median of all timed launches for both")


def rel_error(out, a, b) -> float:
    """Relative Frobenius error of ``out`` against the FP32 product of ``a`` and ``b``."""
    ref = a.float() @ b.float()
    return ((out.float() - ref).norm() / ref.norm()).item()


def input_sets(set_bytes: int, l2_bytes: int, *, l2_multiple: int = 4, cap: int = 16) -> int:
    """How many copies of (A, B, C) to rotate so that together they span ``l2_multiple`` x L2.

    One copy if a set alone is that large (then nothing of a launch's inputs is
    left in L2 by the launch before, except what any real workload would also have).
    """
    check_int("set_bytes", set_bytes, lo=1)
    check_int("l2_bytes", l2_bytes, lo=1)
    return max(1, min(cap, -(-l2_multiple * l2_bytes // set_bytes)))


def time_interleaved(launches: dict, *, rounds: int = 10, per_round: int = 10, warmup: int = 5) -> dict:
    """Time several competitors fairly; returns ``{name: {"median_ms", "round_ms": [...]}}``.

    ``launches[name]`` is a list of zero-argument launches, one per input set
    (every competitor gets the same sets, in the same rotation). In each of
    ``rounds`` rounds every competitor runs ``per_round`` launches back to back
    (each timed by its own pair of CUDA events, the GPU never idle between
    them, one untimed launch first); the order of the competitors rotates
    from round to round, so drift in clocks or temperature hits all alike.
    The statistic is the same for all: the median over every timed launch.
    ``round_ms`` keeps each round's median, to show the spread.
    """
    import statistics

    import torch

    names = list(launches)
    for name in names:
        for i in range(warmup):
            launches[name][i % len(launches[name])]()
    torch.cuda.synchronize()
    times = {name: [] for name in names}
    rounds_ms = {name: [] for name in names}
    for r in range(rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for name in order:
            fns = launches[name]
            fns[r % len(fns)]()  # untimed: the switch from the other competitor
            ev = [torch.cuda.Event(enable_timing=True) for _ in range(per_round + 1)]
            ev[0].record()
            for i in range(per_round):
                fns[(r + i) % len(fns)]()
                ev[i + 1].record()
            ev[-1].synchronize()
            t = [ev[i].elapsed_time(ev[i + 1]) for i in range(per_round)]
            times[name] += t
            rounds_ms[name].append(statistics.median(t))
    return {name: {"median_ms": statistics.median(times[name]), "round_ms": rounds_ms[name]} for name in names}


def gpu_clocks() -> dict | None:
    """SM clock (MHz), temperature (C) and power (W) from ``nvidia-smi``; None where it cannot be read."""
    import subprocess

    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm,temperature.gpu,power.draw",
                              "--format=csv,noheader,nounits", "-i", "0"],
                             capture_output=True, text=True, timeout=10).stdout.strip().splitlines()[0]
        sm, temp, power = (x.strip() for x in out.split(","))
        return {"sm_mhz": int(float(sm)), "temp_c": int(float(temp)), "power_w": float(power)}
    except Exception:  # no nvidia-smi, or a field it cannot report: the table goes on without it
        return None


def benchmark(shapes=None, *, rounds: int = 10, per_round: int = 10, configs: dict | None = None) -> list[dict]:
    """Time :func:`gemmlab.gemm` against ``torch.matmul`` (cuBLAS) on each shape, BF16, in one run.

    Fair by construction (:func:`time_interleaved`): ours and cuBLAS alternate
    in rounds, on the same rotated input sets (together at least 4 x L2 when
    a set is smaller, :func:`input_sets`), and both are reported as the
    median of every timed launch. Each row also holds the relative error of
    our output against FP32, the spread of the round medians and the SM
    clock / temperature / power read right after the shape (when
    ``nvidia-smi`` is there). ``configs`` may override the heuristic per shape.
    """
    import torch

    from .gemm_api import sm90_launch
    from .heuristic import choose
    from .tiers import require_tier

    shapes = list(shapes or BENCH_SHAPES)
    require_tier("sm90", "gemmlab.gemm_sm90.benchmark")
    props = torch.cuda.get_device_properties(0)
    rows = []
    for m, n, k in shapes:
        sets = input_sets(2 * (m * k + k * n + m * n), props.L2_cache_size)
        data = []
        for _ in range(sets):
            a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            b = torch.randn(n, k, device="cuda", dtype=torch.bfloat16).t()  # K-contiguous B (a weight)
            data.append((a, b, torch.empty(m, n, device="cuda", dtype=torch.bfloat16)))
        cfg = (configs or {}).get((m, n, k)) or choose(m, n, k, props.multi_processor_count)
        ours = [sm90_launch(a, b, c, cfg) for a, b, c in data]
        a0, b0, c0 = data[0]
        c0.fill_(float("nan"))  # poisoned
        ours[0]()
        err = rel_error(c0, a0, b0)
        cublas = [functools.partial(torch.matmul, a, b, out=c) for a, b, c in data]
        t = time_interleaved({"ours": ours, "cublas": cublas}, rounds=rounds, per_round=per_round)
        t_ours, t_torch = t["ours"]["median_ms"], t["cublas"]["median_ms"]
        flop = 2 * m * n * k
        rows.append({"m": m, "n": n, "k": k, "config": config_name(cfg),
                     "ours_tflops": flop / t_ours / 1e9, "torch_tflops": flop / t_torch / 1e9,
                     "ratio": t_torch / t_ours, "peak_pct": 100 * flop / t_ours / 1e9 / PEAK_TFLOPS,
                     "ours_round_tflops": [flop / x / 1e9 for x in t["ours"]["round_ms"]],
                     "torch_round_tflops": [flop / x / 1e9 for x in t["cublas"]["round_ms"]],
                     "rel_err": err, "input_sets": sets, "gpu": gpu_clocks()})
        del data, ours, cublas
    return rows


def config_name(cfg: GemmConfig) -> str:
    """A short name: ``128x256 c2x1 m8 s4`` (+ `` wgepi`` for the per-warpgroup epilogue)."""
    return (f"{cfg.tile_m}x{cfg.tile_n} c{cfg.cluster[0]}x{cfg.cluster[1]} {cfg.raster}{cfg.group} s{cfg.stages}"
            + (" wgepi" if cfg.epi_per_wg else ""))


def geomean(values) -> float:
    import math

    values = list(values)
    return math.exp(sum(math.log(v) for v in values) / len(values))


def benchmark_table(rows: list[dict]) -> str:
    """The benchmark rows as a text table, with the geometric mean of the ratios last."""
    from .bench import format_table

    def spread(xs):
        return f"{min(xs):.0f}-{max(xs):.0f}" if xs else "-"

    table = format_table([{**r, "shape": f"{r['m']}x{r['n']}x{r['k']}",
                           "ours_rng": spread(r.get("ours_round_tflops", [])),
                           "torch_rng": spread(r.get("torch_round_tflops", []))} for r in rows], [
        ("shape", "M x N x K", ""), ("config", "config", ""), ("ours_tflops", "ours TFLOP/s", ".0f"),
        ("torch_tflops", "cuBLAS TFLOP/s", ".0f"), ("ratio", "ours/cuBLAS", ".3f"),
        ("peak_pct", "% of 989", ".1f"), ("ours_rng", "ours rounds", ""), ("torch_rng", "cuBLAS rounds", ""),
        ("rel_err", "rel. error", ".1e")])
    return table + f"\ngeometric mean ours/cuBLAS = {geomean(r['ratio'] for r in rows):.3f}"


def plot_benchmark(rows: list[dict], name: str = "07_gemm_vs_cublas"):
    """Bars of TFLOP/s per shape (ours, cuBLAS) with the ratio written above; returns the path."""
    from .figures import new_figure, save

    fig, ax = new_figure(figsize=(11, 4.2))
    xs = range(len(rows))
    w = 0.4
    ax.bar([x - w / 2 for x in xs], [r["ours_tflops"] for r in rows], w, label="gemmlab (this chapter)")
    ax.bar([x + w / 2 for x in xs], [r["torch_tflops"] for r in rows], w, label="torch.matmul (cuBLAS)")
    for x, r in zip(xs, rows):
        ax.text(x, max(r["ours_tflops"], r["torch_tflops"]) + 12, f"{r['ratio']:.2f}x", ha="center", fontsize=8)
    ax.axhline(PEAK_TFLOPS, color="gray", ls="--", lw=1)
    ax.text(len(rows) - 0.5, PEAK_TFLOPS - 40, "dense BF16 peak 989", ha="right", fontsize=8, color="gray")
    ax.set_xticks(list(xs))
    ax.set_xticklabels([f"{r['m']}x{r['n']}\nx{r['k']}" for r in rows], fontsize=7)
    ax.set_ylabel("TFLOP/s")
    ax.set_ylim(0, PEAK_TFLOPS * 1.12)
    ax.set_title(f"BF16 GEMM: ours vs cuBLAS, geometric mean {geomean(r['ratio'] for r in rows):.3f}x")
    ax.legend(loc="lower left", fontsize=8)
    return save(fig, name)


def profile_table(doc: dict) -> str:
    """The stored Nsight Compute numbers (``results/<device>/gemm_sm90_profile.json``) as a text table."""
    from .bench import format_table

    rows = []
    for shape, recs in doc["shapes"].items():
        for r in recs:
            st = r["stalls_per_issue"]
            rows.append({"shape": shape, "who": r["kernel"] if r["kernel"] == "cublas" else f"ours {r['config'].split(' (')[0]}",
                         "kernel": r["name"][:34] if r["kernel"] == "cublas" else "", "time": r["time_us"],
                         "clock": r["sm_clock_ghz"], "tensor": r["tensor_pipe_active_pct"], "dram": r["dram_tbs"],
                         "l2": r["l2_throughput_pct"], "occ": r["achieved_occupancy_warps_pct"],
                         "stalls": f"bar {st['barrier']:.1f} lsb {st['long_scoreboard']:.1f} gmma {st['gmma']:.1f} "
                                   f"disp {st['dispatch_stall']:.1f}"})
    return format_table(rows, [("shape", "M x N x K", ""), ("who", "kernel", ""), ("kernel", "cuBLAS kernel", ""),
                               ("time", "time us", ".1f"), ("clock", "SM GHz", ".2f"),
                               ("tensor", "tensor pipe %", ".1f"), ("dram", "DRAM TB/s", ".2f"),
                               ("l2", "L2 %", ".1f"), ("occ", "warps %", ".1f"),
                               ("stalls", "stalls per issue", "")])


def tuning_table(doc: dict) -> str:
    """The stored tuning sweeps (``results/<device>/gemm_sm90_tuning.json``): ratio to cuBLAS per variant."""
    lines = []
    for run in doc["runs"]:
        lines.append(run["name"])
        for r in run["rows"]:
            cells = "  ".join(f"{k} {v['ratio']:.3f}" for k, v in r["variants"].items())
            lines.append(f"  {r['shape']:>15}  cuBLAS {r['cublas_tflops']:4.0f}  {cells}")
    base = doc.get("baseline_fair_runs")
    if base:
        lines.append(f"chapter-start kernel, fair benchmark run twice: geometric mean {base['geomean']['run1']:.3f} "
                     f"and {base['geomean']['run2']:.3f}")
    return "\n".join(lines)
