"""Chapter 11 on Blackwell: the NVFP4 gated dual GEMM, C = silu(A B1^T) * (A B2^T), on sm_100a.

Status: ran on the emulator; never on a B200
    This kernel compiles for sm_100a here, and ``tests/test_dual_gemm_sm100.py`` reads its
    PTX (the block-scaled MMA, ``tcgen05.cp``, the TMEM columns, the instruction
    descriptor field by field, the set-up order, the barrier counts). The compiled kernel
    runs on the course's PTX emulator (:mod:`gemmlab.emulator`, chapter 12) and matches
    :func:`gemmlab.nvfp4.reference` at rtol = atol = 1e-3 on GPU MODE's test shapes and on
    256 x 3072 x 4096 (``tests/test_emulator_blackwell.py``, chapter 11's emulator cells).
    It has **not run on a B200**: the GPU correctness test is marked ``sm100`` and waits for
    one. The data flow is the one the CPU model :mod:`gemmlab.dual_gemm_model` executes.

What it teaches
    Blackwell's tensor cores multiply FP4 directly and apply the block scales
    themselves (``tcgen05.mma.kind::mxf4nvf4.block_scale.scale_vec::4X``; the DSL's PTX
    spells the qualifier ``.block16``, the PTX ISA 8.8 name for the same thing: one e4m3
    scale per 16 values, four per row of a K = 64 MMA): the scales are a fourth and fifth
    MMA operand, read from tensor memory (TMEM). The kernel is
    chapter 10's structure with one CTA per tile (``cta_group::1``) and two GEMMs sharing
    the A tile:

    ======  =========================  ========================================================
    warp    role                       per tile
    ======  =========================  ========================================================
    0-3     epilogue (warp 0 also      wait ``tmem_full``; for each 32-column slice: tcgen05.ld
            allocates TMEM)            of both accumulators, tcgen05.wait::ld, silu(acc1) * acc2,
                                       FP16 -> this warp's own staging buffer -> its own TMA
                                       store; then arrive on ``tmem_empty``
    4       MMA warp                   wait ``tmem_empty``; per k-block: wait ``ab_full[s]``,
                                       ``tcgen05.cp`` SFA, SFB1, SFB2 to TMEM, four MMAs per
                                       GEMM (SFB switched between them; ACCUMULATE off for the
                                       tile's first), commit ``ab_empty[s]``; commit ``tmem_full``
    5       TMA warp + tile scheduler  per k-block: wait ``ab_empty[s]``, ``expect_tx``, six TMA
                                       loads (A, B1, B2, SFA, SFB1, SFB2) into stage ``s``
    ======  =========================  ========================================================

    * **Persistent**: ``num_ctas`` CTAs walk the tiles ``cta, cta + num_ctas, ...`` in
      chapter 07's grouped order (:func:`gemmlab.scheduler.device_tile`, our scheduler;
      every role computes the same sequence).
    * **TMEM plan** (:func:`gemmlab.family.configs.tmem_columns`): acc1 at column 0,
      acc2 at ``tile_n``, then SFA, SFB1, SFB2. One accumulator stage (two stages of two
      accumulators plus the scales do not fit in 512 columns at ``tile_n`` = 128).
    * **Scales of B at ``tile_n`` = 64**: the TMA loads scales in whole 128-row atoms, so
      two neighbouring tiles load the same atom and an odd tile points its MMAs' SFB
      operand 2 TMEM columns further (rows 64..127 of the atom), as NVIDIA's block-scaled
      example does and as the CPU model's ``sfb_not_shifted`` case shows is needed.
    * **Epilogue without a CTA-wide barrier**: warp ``w`` owns rows ``32 w .. 32 w + 31``
      (the TMEM lanes it may read) and a staging buffer of its own, so it stores its
      32 x 32 FP16 boxes with its own TMA stores and bulk groups; the only
      synchronisation per tile is the ``tmem_full`` / ``tmem_empty`` mbarrier pair.
    * **Set-up and teardown in chapter 10's order**: barrier init, cluster barrier (a
      cluster of one), TMEM alloc by warp 0, the address published with a fenced CTA
      barrier, the roles, producer tails (TMA warp: every ``ab_empty``; MMA warp:
      ``tmem_empty``), the final barrier, relinquish and dealloc.

What it does not do (yet)
    ``tile_n`` is 128 or 64 (192 would load SFB atoms split over two tiles; 256 leaves no
    TMEM for the scales); no 2-CTA MMA, no multicast, no
    overlap of one tile's epilogue with the next tile's main loop (one accumulator
    stage); the staging buffer is not swizzled (bank conflicts on the FP16 writes);
    :func:`gated_dual_gemm_sm100` permutes the three scale tensors on every call (a
    caller holding pre-permuted scales would skip that work; not offered yet).
"""
from __future__ import annotations

import functools
import re

import cutlass
import cutlass.cute as cute
import cutlass.utils as utils
import cutlass.utils.blockscaled_layout as blockscaled
import cuda.bindings.driver as cuda
from cutlass import Float16, Float32, Int32, Int64, Uint8
from cutlass.cute.nvgpu import cpasync, tcgen05

from .. import nvfp4 as fp4
from ..family.configs import (DUAL_SM100_TILE_NS as TILE_N_SUPPORTED, EPI_C_STAGES as C_STAGES, EPI_N,  # noqa: F401
                              EPILOGUE_WARPS, GATED_TILE_M as TILE_M, GROUP_M, K_BLOCK, MMA_K_FP4 as MMA_K, RASTER,
                              STEPS, DualSm100Config)
from ..checks import check_int
from ..family.problem import check_gated_sizes
from ..pipeline import DevicePipelineState
from ..scheduler import device_tile
from ..tmem import tcgen05_fence_after_thread_sync, tcgen05_fence_before_thread_sync

# --------------------------------------------------------------------------------------
# Fixed shape of the kernel
# --------------------------------------------------------------------------------------

MMA_WARP = 4
TMA_WARP = 5
THREADS = 32 * 6
WARP_ROWS = 32  #: rows of C each epilogue warp owns (its TMEM lanes)
SMEM_ALIGN = 1024
SF_ATOM_ROWS = fp4.ATOM_MN  #: rows of one scale atom (128): the TMA loads SFB in whole atoms


# --------------------------------------------------------------------------------------
# The instruction descriptor of tcgen05.mma .kind::mxf4nvf4 (our encoder, for the tests)
# --------------------------------------------------------------------------------------

#: (name, low bit, width) of the 32-bit block-scaled instruction descriptor (PTX ISA,
#: "Instruction descriptor" for .kind::mxf8f6f4 / mxf4 / mxf4nvf4).
BLOCK_SCALED_IDESC_FIELDS = (
    ("sparse_id2", 0, 2), ("sparse", 2, 1), ("b_sf_id", 4, 2), ("a_format", 7, 3), ("b_format", 10, 3),
    ("negate_a", 13, 1), ("negate_b", 14, 1), ("a_major", 15, 1), ("b_major", 16, 1), ("n_dim", 17, 6),
    ("scale_format", 23, 1), ("m_dim", 24, 5), ("a_sf_id", 29, 2), ("k_size", 31, 1),
)
E2M1_FORMAT = 1  #: a_format / b_format code of E2M1 for .kind::mxf4nvf4
SCALE_UE4M3 = 0  #: scale_format: 0 = UE4M3 (NVFP4), 1 = UE8M0 (MXFP4)


def encode_block_scaled_idesc(m: int = TILE_M, n: int = 128, *, scale_format: int = SCALE_UE4M3,
                              a_sf_id: int = 0, b_sf_id: int = 0) -> int:
    """The 32-bit descriptor of a dense K-major E2M1 x E2M1 block-scaled MMA of M x N x 64."""
    check_int("m", m, lo=64, hi=256, multiple_of=16)
    check_int("n", n, lo=8, hi=256, multiple_of=8)
    vals = dict(a_format=E2M1_FORMAT, b_format=E2M1_FORMAT, n_dim=n >> 3, m_dim=m >> 4,
                scale_format=scale_format, a_sf_id=a_sf_id, b_sf_id=b_sf_id)
    out = 0
    for name, lo, width in BLOCK_SCALED_IDESC_FIELDS:
        v = vals.get(name, 0)
        if not 0 <= v < (1 << width):
            raise ValueError(f"{name} must fit in {width} bits; got {v}")
        out |= v << lo
    return out


def decode_block_scaled_idesc(value: int) -> dict:
    """Every field of a block-scaled instruction descriptor, plus ``M`` and ``N`` and the reserved bits."""
    check_int("value", value, lo=0, hi=(1 << 32) - 1)
    out = {name: (value >> lo) & ((1 << width) - 1) for name, lo, width in BLOCK_SCALED_IDESC_FIELDS}
    used = sum(((1 << w) - 1) << lo for _, lo, w in BLOCK_SCALED_IDESC_FIELDS)
    out["reserved"] = value & ~used & 0xFFFFFFFF
    out["M"] = out["m_dim"] << 4
    out["N"] = out["n_dim"] << 3
    return out


def sfb_atom_and_shift(n_tile, tile_n: int):
    """Which 128-row scale atom of B tile ``n_tile`` loads, and how many TMEM columns its MMAs' SFB
    address moves past the copied atom's first column.

    Rows ``32 c .. 32 c + 31`` of an atom sit in column ``c`` of each MMA step's 4 columns, so a
    tile whose first row is row ``r`` of its atom starts at column ``r // 32``. Plain integer
    arithmetic: the kernel calls it with a device ``Int32`` tile index, the tests with Python ints
    (and compare it with :mod:`gemmlab.dual_gemm_model`'s row arithmetic).
    """
    per_atom = SF_ATOM_ROWS // tile_n  # tiles per atom: 1 at tile_n 128, 2 at 64
    return n_tile // per_atom, (n_tile % per_atom) * ((tile_n // 32) % 4)


# --------------------------------------------------------------------------------------
# The three roles
# --------------------------------------------------------------------------------------


@cute.jit
def tma_worker(tma_a, tAg, tAs, tma_b1, tB1g, tB1s, tma_b2, tB2g, tB2s,
               tma_sfa, tSAg, tSAs, tma_sfb1, tSB1g, tSB1s, tma_sfb2, tSB2g, tSB2s,
               ab_full, ab_empty, cta, my_tiles, m_tiles: cutlass.Constexpr, n_tiles: cutlass.Constexpr,
               k_blocks: cutlass.Constexpr, stages: cutlass.Constexpr, num_ctas: cutlass.Constexpr,
               tx_bytes: cutlass.Constexpr, tile_n: cutlass.Constexpr):
    """TMA warp: the tile scheduler and the six loads of every k-block into the ring.

    The scales of B come in whole 128-row atoms: with ``tile_n`` = 64 an atom holds the
    scales of two neighbouring tiles, and both load it (the MMA picks its half).
    """
    ring = DevicePipelineState.producer(stages)  # phase 1: a fresh ab_empty reads as "empty"
    for i in cutlass.range(my_tiles, unroll=1):
        m_tile, n_tile = device_tile(cta + i * num_ctas, m_tiles, n_tiles, RASTER, GROUP_M)
        for kb in cutlass.range(k_blocks, unroll=1):
            cute.arch.mbarrier_wait(ab_empty + ring.index, ring.phase)
            bar = ab_full + ring.index
            with cute.arch.elect_one():
                cute.arch.mbarrier_arrive_and_expect_tx(bar, tx_bytes)
            cute.copy(tma_a, tAg[(None, m_tile, kb)], tAs[(None, ring.index)], tma_bar_ptr=bar)
            cute.copy(tma_b1, tB1g[(None, n_tile, kb)], tB1s[(None, ring.index)], tma_bar_ptr=bar)
            cute.copy(tma_b2, tB2g[(None, n_tile, kb)], tB2s[(None, ring.index)], tma_bar_ptr=bar)
            cute.copy(tma_sfa, tSAg[(None, m_tile, kb)], tSAs[(None, ring.index)], tma_bar_ptr=bar)
            sf_tile, _ = sfb_atom_and_shift(n_tile, tile_n)  # tile_n 64: two tiles share one 128-row atom
            cute.copy(tma_sfb1, tSB1g[(None, sf_tile, kb)], tSB1s[(None, ring.index)], tma_bar_ptr=bar)
            cute.copy(tma_sfb2, tSB2g[(None, sf_tile, kb)], tSB2s[(None, ring.index)], tma_bar_ptr=bar)
            ring.advance()
    # Producer tail: every stage filled has been released by the MMAs' commits before teardown.
    for _ in cutlass.range(stages, unroll=1):
        cute.arch.mbarrier_wait(ab_empty + ring.index, ring.phase)
        ring.advance()


@cute.jit
def mma_worker(tiled_mma: cute.TiledMma, acc1: cute.Tensor, acc2: cute.Tensor, tCrA: cute.Tensor,
               tCrB1: cute.Tensor, tCrB2: cute.Tensor, tCtSFA: cute.Tensor, tCtSFB1: cute.Tensor,
               tCtSFB2: cute.Tensor, s2t_sfa, s2t_sfa_src, s2t_sfa_dst, s2t_sfb, s2t_sfb1_src, s2t_sfb1_dst,
               s2t_sfb2_src, s2t_sfb2_dst, ab_full, ab_empty, tmem_full, tmem_empty, cta, my_tiles,
               m_tiles: cutlass.Constexpr, n_tiles: cutlass.Constexpr, num_ctas: cutlass.Constexpr,
               k_blocks: cutlass.Constexpr, stages: cutlass.Constexpr, tile_n: cutlass.Constexpr):
    """MMA warp: scales to TMEM with tcgen05.cp, then four block-scaled MMAs per k-block and GEMM.

    With ``tile_n`` = 64 the copied SFB atom holds 128 rows of B, two tiles' worth; an odd
    tile's rows start at row 64 of the atom, i.e. 2 columns further in TMEM (rows
    ``32 c .. 32 c + 31`` sit in column ``c`` of each MMA step's 4), so the MMA's SFB
    address moves by 2 columns (``sfb_not_shifted`` among :data:`gemmlab.dual_gemm_model.BUGS`).
    """
    ring = DevicePipelineState.consumer(stages)
    acc = DevicePipelineState.producer(1)  # one accumulator pair; phase 1: free at the start
    for i in cutlass.range(my_tiles, unroll=1):
        sfb1_mma, sfb2_mma = tCtSFB1, tCtSFB2
        if cutlass.const_expr(tile_n < SF_ATOM_ROWS):
            _, n_tile = device_tile(cta + i * num_ctas, m_tiles, n_tiles, RASTER, GROUP_M)
            _, shift = sfb_atom_and_shift(n_tile, tile_n)  # TMEM columns (32-bit words)
            # move in columns (a 32-bit pointer): on an 8-bit TMEM pointer + 2 would mean byte 2 of the word
            sf_t = tCtSFB1.element_type
            sfb1_mma = cute.make_tensor(cute.recast_ptr(cute.recast_ptr(tCtSFB1.iterator, dtype=Float32) + shift,
                                                        dtype=sf_t), tCtSFB1.layout)
            sfb2_mma = cute.make_tensor(cute.recast_ptr(cute.recast_ptr(tCtSFB2.iterator, dtype=Float32) + shift,
                                                        dtype=sf_t), tCtSFB2.layout)
        cute.arch.mbarrier_wait(tmem_empty + acc.index, acc.phase)
        tcgen05_fence_after_thread_sync()
        tiled_mma.set(tcgen05.Field.ACCUMULATE, False)  # the tile's first MMA overwrites (TMEM holds garbage)
        for kb in cutlass.range(k_blocks, unroll=1):
            cute.arch.mbarrier_wait(ab_full + ring.index, ring.phase)
            s = ring.index
            # shared memory -> TMEM: tcgen05.cp.cta_group::1.32x128b.warpx4 of every 512-byte atom
            cute.copy(s2t_sfa, s2t_sfa_src[(None, None, None, None, s)], s2t_sfa_dst)
            cute.copy(s2t_sfb, s2t_sfb1_src[(None, None, None, None, s)], s2t_sfb1_dst)
            cute.copy(s2t_sfb, s2t_sfb2_src[(None, None, None, None, s)], s2t_sfb2_dst)
            for step in cutlass.range_constexpr(STEPS):
                tiled_mma.set(tcgen05.Field.SFA, tCtSFA[(None, None, step)].iterator)
                tiled_mma.set(tcgen05.Field.SFB, sfb1_mma[(None, None, step)].iterator)
                cute.gemm(tiled_mma, acc1, tCrA[(None, None, step, s)], tCrB1[(None, None, step, s)], acc1)
                tiled_mma.set(tcgen05.Field.SFB, sfb2_mma[(None, None, step)].iterator)  # GEMM 2: switch SFB
                cute.gemm(tiled_mma, acc2, tCrA[(None, None, step, s)], tCrB2[(None, None, step, s)], acc2)
                tiled_mma.set(tcgen05.Field.ACCUMULATE, True)
            with cute.arch.elect_one():  # stage s is free once these MMAs (and copies) have read it
                tcgen05.commit(ab_empty + s)
            ring.advance()
        with cute.arch.elect_one():  # both accumulators complete
            tcgen05.commit(tmem_full + acc.index)
        acc.advance()
    # Producer tail: the epilogue has drained the accumulators before teardown frees TMEM.
    cute.arch.mbarrier_wait(tmem_empty + acc.index, acc.phase)


@cute.jit
def epilogue_worker(warp, tiled_t2r: cute.TiledCopy, t2r_acc1: cute.Tensor, t2r_acc2: cute.Tensor,
                    t2r_smem: cute.Tensor, r_acc1: cute.Tensor, r_acc2: cute.Tensor, r_out: cute.Tensor,
                    tma_c: cute.CopyAtom, bSG_sC: cute.Tensor, bSG_gC: cute.Tensor, tmem_full, tmem_empty,
                    cta, my_tiles, m_tiles: cutlass.Constexpr, n_tiles: cutlass.Constexpr,
                    num_ctas: cutlass.Constexpr, slices: cutlass.Constexpr):
    """Epilogue warp ``warp``: its 32 rows of both accumulators -> silu(acc1) * acc2 -> FP16 -> TMA store."""
    acc = DevicePipelineState.consumer(1)
    stage_c = DevicePipelineState.producer(C_STAGES)  # index only: bulk groups, not mbarriers
    lane = cute.arch.lane_idx()
    for i in cutlass.range(my_tiles, unroll=1):
        m_tile, n_tile = device_tile(cta + i * num_ctas, m_tiles, n_tiles, RASTER, GROUP_M)
        cute.arch.mbarrier_wait(tmem_full + acc.index, acc.phase)
        tcgen05_fence_after_thread_sync()
        for sl in cutlass.range_constexpr(slices):
            cute.copy(tiled_t2r, t2r_acc1[(None, None, None, 0, sl)], r_acc1)  # tcgen05.ld 32x32b
            cute.copy(tiled_t2r, t2r_acc2[(None, None, None, 0, sl)], r_acc2)
            # tcgen05.ld is asynchronous: tcgen05.wait::ld orders its reads before what follows, in particular
            # before this warp tells the MMA warp (tmem_empty) that it has finished reading the accumulators
            cute.arch.fence_view_async_tmem_load()
            for j in cutlass.range_constexpr(cute.size(r_acc1)):
                x = r_acc1[j]
                # silu(x) = x * sigmoid(x); exp and the reciprocal are the fast approximations (ex2, rcp)
                sig = cute.arch.rcp_approx(Float32(1.0) + cute.math.exp(-x, fastmath=True))
                r_out[j] = (x * sig * r_acc2[j]).to(Float16)
            # this warp's staging buffer is free once the store issued C_STAGES slices ago has read it
            if lane == 0:
                cute.arch.cp_async_bulk_wait_group(C_STAGES - 1, read=True)
            cute.arch.sync_warp()
            cute.autovec_copy(r_out, t2r_smem[(None, None, None, stage_c.index)])
            cute.arch.fence_proxy("async.shared", space="cta")  # generic-proxy writes -> TMA reads
            cute.arch.sync_warp()
            if lane == 0:
                cute.copy(tma_c, bSG_sC[(None, warp, stage_c.index)],
                          bSG_gC[(None, m_tile * (TILE_M // WARP_ROWS) + warp, n_tile * slices + sl)])
                cute.arch.cp_async_bulk_commit_group()
            stage_c.advance()
        # both accumulators read by this warp: tell the MMA warp
        tcgen05_fence_before_thread_sync()
        with cute.arch.elect_one():
            cute.arch.mbarrier_arrive(tmem_empty + acc.index)
        acc.advance()
    if lane == 0:
        cute.arch.cp_async_bulk_wait_group(0, read=False)  # every store has landed


# --------------------------------------------------------------------------------------
# The kernel
# --------------------------------------------------------------------------------------


@cute.kernel
def dual_kernel(tiled_mma: cute.TiledMma, tiled_mma_sfb: cute.TiledMma,
                tma_a: cute.CopyAtom, mA: cute.Tensor, tma_b1: cute.CopyAtom, mB1: cute.Tensor,
                tma_b2: cute.CopyAtom, mB2: cute.Tensor, tma_sfa: cute.CopyAtom, mSFA: cute.Tensor,
                tma_sfb1: cute.CopyAtom, mSFB1: cute.Tensor, tma_sfb2: cute.CopyAtom, mSFB2: cute.Tensor,
                tma_c: cute.CopyAtom, mC: cute.Tensor,
                a_layout: cute.ComposedLayout, b_layout: cute.ComposedLayout,
                sfa_layout: cute.Layout, sfb_layout: cute.Layout, c_layout: cute.Layout,
                mma_tiler: cutlass.Constexpr, mma_tiler_sfb: cutlass.Constexpr, tile_n: cutlass.Constexpr,
                stages: cutlass.Constexpr,
                m_tiles: cutlass.Constexpr, n_tiles: cutlass.Constexpr, k_blocks: cutlass.Constexpr,
                num_ctas: cutlass.Constexpr, tx_bytes: cutlass.Constexpr, cols: cutlass.Constexpr):
    warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
    tidx, _, _ = cute.arch.thread_idx()
    cta, _, _ = cute.arch.block_idx()
    num_tiles = m_tiles * n_tiles
    my_tiles = (num_tiles - cta + num_ctas - 1) // num_ctas  # tiles cta, cta + num_ctas, ...

    # 1. Descriptor prefetch.
    if warp == TMA_WARP:
        for atom in (tma_a, tma_b1, tma_b2, tma_sfa, tma_sfb1, tma_sfb2, tma_c):
            cpasync.prefetch_descriptor(atom)

    # 2. Shared memory: barriers, the TMEM address, then the ring and the C staging buffers.
    smem = cutlass.memory.SmemAllocator()
    ab_full = smem.allocate_array(Int64, stages)  # "stage s holds A, B1, B2 and their scales"
    ab_empty = smem.allocate_array(Int64, stages)  # "stage s may be overwritten"
    tmem_full = smem.allocate_array(Int64, 1)  # "acc1 and acc2 are complete"
    tmem_empty = smem.allocate_array(Int64, 1)  # "acc1 and acc2 have been read"
    tmem_addr = smem.allocate_array(Int32, 1)
    sA = smem.allocate_tensor(cutlass.Float4E2M1FN, a_layout.outer, byte_alignment=SMEM_ALIGN,
                              swizzle=a_layout.inner)
    sB1 = smem.allocate_tensor(cutlass.Float4E2M1FN, b_layout.outer, byte_alignment=SMEM_ALIGN,
                               swizzle=b_layout.inner)
    sB2 = smem.allocate_tensor(cutlass.Float4E2M1FN, b_layout.outer, byte_alignment=SMEM_ALIGN,
                               swizzle=b_layout.inner)
    sSFA = smem.allocate_tensor(cutlass.Float8E4M3FN, sfa_layout, byte_alignment=128)
    sSFB1 = smem.allocate_tensor(cutlass.Float8E4M3FN, sfb_layout, byte_alignment=128)
    sSFB2 = smem.allocate_tensor(cutlass.Float8E4M3FN, sfb_layout, byte_alignment=128)
    sC = smem.allocate_tensor(Float16, c_layout, byte_alignment=128)  # (128, EPI_N, C_STAGES), row-major

    # 3. Barrier init (one thread), then the cluster barrier (a cluster of one CTA).
    if warp == TMA_WARP:
        with cute.arch.elect_one():
            for s in cutlass.range_constexpr(stages):
                cute.arch.mbarrier_init(ab_full + s, 1)  # the TMA warp's arrive.expect_tx (+ bytes)
                cute.arch.mbarrier_init(ab_empty + s, 1)  # one tcgen05.commit
            cute.arch.mbarrier_init(tmem_full, 1)  # one tcgen05.commit
            cute.arch.mbarrier_init(tmem_empty, EPILOGUE_WARPS)  # every epilogue warp
            cute.arch.mbarrier_init_fence()
    cute.arch.cluster_arrive()
    cute.arch.cluster_wait()

    # 4. TMEM allocation: epilogue warp 0 allocates; the address is published with a fenced CTA barrier.
    if warp == 0:
        cute.arch.alloc_tmem(cols["alloc"], tmem_addr)
    tcgen05_fence_before_thread_sync()
    cute.arch.barrier()
    tcgen05_fence_after_thread_sync()

    # 5. Views: k-block tiles of the operands, the accumulators and the scales in TMEM.
    thr_mma = tiled_mma.get_slice(0)
    tile_a = cute.slice_(mma_tiler, (None, 0, None))
    tile_b = cute.slice_(mma_tiler, (0, None, None))
    gA = cute.local_tile(mA, tile_a, (None, None, 0))  # (128, 256, m_tiles, k_blocks)
    gB1 = cute.local_tile(mB1, tile_b, (None, None, 0))
    gB2 = cute.local_tile(mB2, tile_b, (None, None, 0))
    gSFA = cute.local_tile(mSFA, tile_a, (None, None, 0))
    tile_sfb = cute.slice_(mma_tiler_sfb, (0, None, None))  # whole 128-row atoms of B's scales
    gSFB1 = cute.local_tile(mSFB1, tile_sfb, (None, None, 0))
    gSFB2 = cute.local_tile(mSFB2, tile_sfb, (None, None, 0))
    thr_mma_sfb = tiled_mma_sfb.get_slice(0)
    one = cute.make_layout(1)

    def part(atom, s_tensor, g_tensor, scales):
        s_part, g_part = cpasync.tma_partition(atom, 0, one, cute.group_modes(s_tensor, 0, 3),
                                               cute.group_modes(g_tensor, 0, 3))
        if cutlass.const_expr(scales):
            return cute.filter_zeros(g_part), cute.filter_zeros(s_part)
        return g_part, s_part

    tAg, tAs = part(tma_a, sA, thr_mma.partition_A(gA), False)
    tB1g, tB1s = part(tma_b1, sB1, thr_mma.partition_B(gB1), False)
    tB2g, tB2s = part(tma_b2, sB2, thr_mma.partition_B(gB2), False)
    tSAg, tSAs = part(tma_sfa, sSFA, thr_mma.partition_A(gSFA), True)
    tSB1g, tSB1s = part(tma_sfb1, sSFB1, thr_mma_sfb.partition_B(gSFB1), True)
    tSB2g, tSB2s = part(tma_sfb2, sSFB2, thr_mma_sfb.partition_B(gSFB2), True)
    tCrA = tiled_mma.make_fragment_A(sA)  # shared-memory descriptors (MMA, MMA_M, MMA_K, STAGE)
    tCrB1 = tiled_mma.make_fragment_B(sB1)
    tCrB2 = tiled_mma.make_fragment_B(sB2)
    acc_shape = tiled_mma.partition_shape_C(mma_tiler[:2])
    tmem_ptr = cute.arch.retrieve_tmem_ptr(Float32, alignment=16, ptr_to_buffer_holding_addr=tmem_addr)
    acc_pair = cute.make_tensor(tmem_ptr, tiled_mma.make_fragment_C(cute.append(acc_shape, 2)).layout)
    acc1 = acc_pair[(None, None, None, 0)]  # columns cols["acc1"] ..
    acc2 = acc_pair[(None, None, None, 1)]  # columns cols["acc2"] ..
    sfa_tmem = blockscaled.make_tmem_layout_sfa(tiled_mma, mma_tiler, fp4.SF_VEC,
                                                cute.slice_(sfa_layout, (None, None, None, 0)))
    sfb_tmem = blockscaled.make_tmem_layout_sfb(tiled_mma, mma_tiler, fp4.SF_VEC,
                                                cute.slice_(sfb_layout, (None, None, None, 0)))
    tCtSFA = cute.make_tensor(cute.recast_ptr(tmem_ptr + cols["sfa"], dtype=cutlass.Float8E4M3FN), sfa_tmem)
    tCtSFB1 = cute.make_tensor(cute.recast_ptr(tmem_ptr + cols["sfb1"], dtype=cutlass.Float8E4M3FN), sfb_tmem)
    tCtSFB2 = cute.make_tensor(cute.recast_ptr(tmem_ptr + cols["sfb2"], dtype=cutlass.Float8E4M3FN), sfb_tmem)

    # 6. The roles.
    if warp == TMA_WARP:
        tma_worker(tma_a, tAg, tAs, tma_b1, tB1g, tB1s, tma_b2, tB2g, tB2s,
                   tma_sfa, tSAg, tSAs, tma_sfb1, tSB1g, tSB1s, tma_sfb2, tSB2g, tSB2s,
                   ab_full, ab_empty, cta, my_tiles, m_tiles, n_tiles, k_blocks, stages, num_ctas, tx_bytes,
                   tile_n)
    if warp == MMA_WARP:
        # tcgen05.cp 32x128b.warpx4: each 512-byte atom of scales -> 4 columns of all 4 sub-partitions
        s2t_atom = cute.make_copy_atom(tcgen05.Cp4x32x128bOp(tcgen05.CtaGroup.ONE), cutlass.Float8E4M3FN)
        s2t_sfa = tcgen05.make_s2t_copy(s2t_atom, cute.filter_zeros(tCtSFA))
        thr_sfa = s2t_sfa.get_slice(0)
        sfa_src = tcgen05.get_s2t_smem_desc_tensor(s2t_sfa, thr_sfa.partition_S(cute.filter_zeros(sSFA)))
        sfa_dst = thr_sfa.partition_D(cute.filter_zeros(tCtSFA))
        s2t_sfb = tcgen05.make_s2t_copy(s2t_atom, cute.filter_zeros(tCtSFB1))
        thr_sfb = s2t_sfb.get_slice(0)
        sfb1_src = tcgen05.get_s2t_smem_desc_tensor(s2t_sfb, thr_sfb.partition_S(cute.filter_zeros(sSFB1)))
        sfb1_dst = thr_sfb.partition_D(cute.filter_zeros(tCtSFB1))
        sfb2_src = tcgen05.get_s2t_smem_desc_tensor(s2t_sfb, thr_sfb.partition_S(cute.filter_zeros(sSFB2)))
        sfb2_dst = thr_sfb.partition_D(cute.filter_zeros(tCtSFB2))
        mma_worker(tiled_mma, acc1, acc2, tCrA, tCrB1, tCrB2, tCtSFA, tCtSFB1, tCtSFB2, s2t_sfa, sfa_src, sfa_dst,
                   s2t_sfb, sfb1_src, sfb1_dst, sfb2_src, sfb2_dst, ab_full, ab_empty, tmem_full, tmem_empty,
                   cta, my_tiles, m_tiles, n_tiles, num_ctas, k_blocks, stages, tile_n)
    if warp < EPILOGUE_WARPS:
        # TMEM -> registers: tcgen05.ld 32x32b, thread t of the 128 reads lane t (row t of the tile)
        epi = (TILE_M, EPI_N)
        t2r_atom = cute.make_copy_atom(tcgen05.Ld32x32bOp(tcgen05.Repetition.x32, tcgen05.Pack.NONE), Float32)
        e1 = cute.flat_divide(acc1[((None, None), 0, 0)], epi)  # (128, EPI_N, 1, slices)
        e2 = cute.flat_divide(acc2[((None, None), 0, 0)], epi)
        tiled_t2r = tcgen05.make_tmem_copy(t2r_atom, e1[(None, None, 0, 0)])
        thr_t2r = tiled_t2r.get_slice(tidx)
        t2r_acc1 = thr_t2r.partition_S(e1)
        t2r_acc2 = thr_t2r.partition_S(e2)
        t2r_smem = thr_t2r.partition_D(sC)  # each thread: its row of the staging buffer
        r_acc1 = cute.make_rmem_tensor(t2r_smem[(None, None, None, 0)].shape, Float32)
        r_acc2 = cute.make_rmem_tensor(t2r_smem[(None, None, None, 0)].shape, Float32)
        r_out = cute.make_rmem_tensor(t2r_smem[(None, None, None, 0)].shape, Float16)
        # shared -> global: warp w stores rows 32w .. 32w+31 of the slice as one 32 x EPI_N box
        sC_boxes = cute.make_tensor(sC.iterator, cute.make_layout(
            ((WARP_ROWS, EPI_N), EPILOGUE_WARPS, C_STAGES),
            stride=((EPI_N, 1), WARP_ROWS * EPI_N, TILE_M * EPI_N)))
        gC = cute.local_tile(mC, (WARP_ROWS, EPI_N), (None, None))  # (32, EPI_N, M/32, N/EPI_N)
        bSG_sC, bSG_gC = cpasync.tma_partition(tma_c, 0, one, sC_boxes, cute.group_modes(gC, 0, 2))
        epilogue_worker(warp, tiled_t2r, t2r_acc1, t2r_acc2, t2r_smem, r_acc1, r_acc2, r_out, tma_c, bSG_sC,
                        bSG_gC, tmem_full, tmem_empty, cta, my_tiles, m_tiles, n_tiles, num_ctas,
                        tile_n // EPI_N)

    # 7. Teardown: producer tails are done; final barrier; warp 0 gives the columns back.
    tcgen05_fence_before_thread_sync()
    cute.arch.barrier()
    if warp == 0:
        tcgen05_fence_after_thread_sync()
        cute.arch.relinquish_tmem_alloc_permit()
        cute.arch.dealloc_tmem(tmem_ptr, cols["alloc"])


# --------------------------------------------------------------------------------------
# Host side
# --------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def dual_host(cfg: DualSm100Config, m: int, n: int, k: int):
    """The ``@cute.jit`` host function for ``cfg`` and a static problem M x N x K (L = 1).

    It takes ``a`` (M, K/2), ``b1``/``b2`` (N, K/2): packed FP4 bytes, K-major;
    ``sfa``/``sfb1``/``sfb2``: the *permuted* scales' bytes in memory order
    (:func:`gemmlab.nvfp4.blocked_bytes`); ``c`` (M, N) FP16, row-major.
    """
    tile_n, stages = cfg.tile_n, cfg.stages
    m_tiles, n_tiles, k_blocks = fp4.ceil_div(m, TILE_M), fp4.ceil_div(n, tile_n), k // K_BLOCK
    num_ctas = min(cfg.num_ctas, m_tiles * n_tiles)
    cols = cfg.tmem
    tx_bytes = cfg.tx_bytes

    @cute.jit
    def dual_gemm_sm100_host(a: cute.Tensor, b1: cute.Tensor, b2: cute.Tensor, sfa: cute.Tensor,
                             sfb1: cute.Tensor, sfb2: cute.Tensor, c: cute.Tensor, stream: cuda.CUstream):
        fp4_t, sf_t = cutlass.Float4E2M1FN, cutlass.Float8E4M3FN

        def fp4_view(t, rows):  # packed bytes -> (rows, K, 1) FP4, K contiguous
            return cute.make_tensor(cute.recast_ptr(t.iterator, dtype=fp4_t),
                                    cute.make_layout((rows, k, 1), stride=(k, 1, rows * k)))

        def sf_view(t, rows):  # permuted bytes -> ((32, 4, rest), (16, 4, rest_k), 1): cuBLAS's blocked layout
            return cute.make_tensor(cute.recast_ptr(t.iterator, dtype=sf_t),
                                    blockscaled.tile_atom_to_shape_SF((rows, k, 1), fp4.SF_VEC))

        mA, mB1, mB2 = fp4_view(a, m), fp4_view(b1, n), fp4_view(b2, n)
        mSFA, mSFB1, mSFB2 = sf_view(sfa, m), sf_view(sfb1, n), sf_view(sfb2, n)
        mma_op = tcgen05.MmaMXF4NVF4Op(sf_t, (TILE_M, tile_n, MMA_K), tcgen05.CtaGroup.ONE,
                                       tcgen05.OperandSource.SMEM)
        tiled_mma = cute.make_tiled_mma(mma_op)
        mma_tiler = (TILE_M, tile_n, K_BLOCK)
        # B's scales are loaded in whole 128-row atoms: a second MMA shape of N = 128 describes that load
        tile_n_sfb = fp4.ceil_div(tile_n, SF_ATOM_ROWS) * SF_ATOM_ROWS
        tiled_mma_sfb = cute.make_tiled_mma(tcgen05.MmaMXF4NVF4Op(sf_t, (TILE_M, tile_n_sfb, MMA_K),
                                                                  tcgen05.CtaGroup.ONE, tcgen05.OperandSource.SMEM))
        mma_tiler_sfb = (TILE_M, tile_n_sfb, K_BLOCK)
        a_layout = utils.sm100.make_smem_layout_a(tiled_mma, mma_tiler, fp4_t, stages)
        b_layout = utils.sm100.make_smem_layout_b(tiled_mma, mma_tiler, fp4_t, stages)
        sfa_layout = blockscaled.make_smem_layout_sfa(tiled_mma, mma_tiler, fp4.SF_VEC, stages)
        sfb_layout = blockscaled.make_smem_layout_sfb(tiled_mma, mma_tiler, fp4.SF_VEC, stages)
        c_layout = cute.make_layout((TILE_M, EPI_N, C_STAGES), stride=(EPI_N, 1, TILE_M * EPI_N))
        vmnk = cute.tiled_divide(cute.make_layout((1, 1, 1)), (tiled_mma.thr_id.shape,)).shape
        g2s = cpasync.CopyBulkTensorTileG2SOp(tcgen05.CtaGroup.ONE)

        def stage0(layout):
            return cute.slice_(layout, (None, None, None, 0))

        tma_a, tA = cute.nvgpu.make_tiled_tma_atom_A(g2s, mA, stage0(a_layout), mma_tiler, tiled_mma, vmnk)
        tma_b1, tB1 = cute.nvgpu.make_tiled_tma_atom_B(g2s, mB1, stage0(b_layout), mma_tiler, tiled_mma, vmnk)
        tma_b2, tB2 = cute.nvgpu.make_tiled_tma_atom_B(g2s, mB2, stage0(b_layout), mma_tiler, tiled_mma, vmnk)
        tma_sfa, tSFA = cute.nvgpu.make_tiled_tma_atom_A(g2s, mSFA, stage0(sfa_layout), mma_tiler, tiled_mma, vmnk,
                                                         internal_type=cutlass.Int16)
        tma_sfb1, tSFB1 = cute.nvgpu.make_tiled_tma_atom_B(g2s, mSFB1, stage0(sfb_layout), mma_tiler_sfb,
                                                           tiled_mma_sfb, vmnk, internal_type=cutlass.Int16)
        tma_sfb2, tSFB2 = cute.nvgpu.make_tiled_tma_atom_B(g2s, mSFB2, stage0(sfb_layout), mma_tiler_sfb,
                                                           tiled_mma_sfb, vmnk, internal_type=cutlass.Int16)
        # what ab_full[s] expects must be what the six TMA boxes bring (else the barrier never completes)
        dsl_bytes = (cute.size_in_bytes(fp4_t, stage0(a_layout)) + 2 * cute.size_in_bytes(fp4_t, stage0(b_layout))
                     + cute.size_in_bytes(sf_t, stage0(sfa_layout)) + 2 * cute.size_in_bytes(sf_t, stage0(sfb_layout)))
        if cutlass.const_expr(dsl_bytes != tx_bytes):
            raise RuntimeError(f"the TMA boxes of a stage hold {dsl_bytes} bytes; the model's budget says {tx_bytes}")
        box = cute.make_layout((WARP_ROWS, EPI_N), stride=(EPI_N, 1))
        tma_c, tC = cpasync.make_tiled_tma_atom(cpasync.CopyBulkTensorTileS2GOp(), c, box, (WARP_ROWS, EPI_N))
        kernel = dual_kernel(tiled_mma, tiled_mma_sfb, tma_a, tA, tma_b1, tB1, tma_b2, tB2, tma_sfa, tSFA,
                             tma_sfb1, tSFB1, tma_sfb2, tSFB2, tma_c, tC, a_layout, b_layout, sfa_layout, sfb_layout,
                             c_layout, mma_tiler, mma_tiler_sfb, tile_n, stages, m_tiles, n_tiles, k_blocks, num_ctas,
                             tx_bytes, cols)
        kernel.launch(grid=(num_ctas, 1, 1), block=(THREADS, 1, 1), cluster=(1, 1, 1), stream=stream)

    return dual_gemm_sm100_host


def _check_shape(m, n, k) -> tuple[int, int, int]:
    return check_gated_sizes(m, n, k)  # N a multiple of 8: the FP16 output's rows are TMA-stored in 16-byte pieces


def _fake_operands(m: int, n: int, k: int):
    from ..compile import fake_tensor

    row = (1, 0)
    sf_bytes = [fp4.ATOM_BYTES * fp4.ceil_div(rows, fp4.ATOM_MN) * fp4.ceil_div(k // fp4.SF_VEC, fp4.ATOM_K)
                for rows in (m, n, n)]
    return ([fake_tensor(Uint8, (m, k // 2), stride_order=row),
             fake_tensor(Uint8, (n, k // 2), stride_order=row), fake_tensor(Uint8, (n, k // 2), stride_order=row)]
            + [fake_tensor(Uint8, (b,)) for b in sf_bytes]
            + [fake_tensor(Float16, (m, n), stride_order=row)])


def compile_dual_sm100(target: str, cfg: DualSm100Config | None, m: int, n: int, k: int):
    """Compile the kernel of ``cfg`` (None: the default :class:`DualSm100Config`) for an M x N x K problem (static
    shapes) without a GPU; returns the compiled function.

    K must be a multiple of 256 (a k-block), N a multiple of 8 (the FP16 output's rows
    are TMA-stored), ``target`` must be ``sm_100a``.
    """
    from ..compile import check_target, compile_for, fake_stream

    check_target(target)
    if target != "sm_100a":
        raise ValueError(f"the tcgen05 dual GEMM needs target sm_100a (tcgen05.mma kind::mxf4nvf4); got {target!r}")
    m, n, k = _check_shape(m, n, k)  # as Python ints: the DSL takes nothing else
    cfg = cfg or DualSm100Config()
    if not isinstance(cfg, DualSm100Config):
        raise TypeError(f"cfg must be a DualSm100Config; got {type(cfg).__name__}")
    return compile_for(target, dual_host(cfg, m, n, k), *_fake_operands(m, n, k), fake_stream())


def gated_dual_gemm_sm100(a, b1, b2, sfa, sfb1, sfb2, out=None, cfg: DualSm100Config | None = None):
    """``silu(A B1^T) * (A B2^T)`` in FP16 on a B200 from NVFP4 operands (GPU MODE's shapes, L = 1).

    ``a`` (M, K/2, 1), ``b1``/``b2`` (N, K/2, 1): packed FP4 (uint8 or ``float4_e2m1fn_x2``);
    ``sfa`` (M, K/16, 1), ``sfb1``/``sfb2`` (N, K/16, 1): plain e4m3 scales (permuted here,
    on the device, to the layout the kernel reads); ``out`` (M, N, 1) FP16 or None.
    Returns ``out``. Every argument is checked before anything compiles or launches;
    a machine that is not tier sm100 gets :class:`gemmlab.tiers.TierError`.
    Ran on the emulator, never on a B200 (see the module's status).
    """
    import torch

    from ..checks import check_tensor
    from ..compile import launcher
    from ..tiers import require_tier

    m, n, k, l = fp4.check_operands(a, b1, b2, sfa, sfb1, sfb2)
    if l != 1:
        raise ValueError(f"L must be 1 (the kernel's batch); got L={l}")
    _check_shape(m, n, k)
    cfg = cfg or DualSm100Config()
    if not isinstance(cfg, DualSm100Config):
        raise TypeError(f"cfg must be a DualSm100Config; got {type(cfg).__name__}")
    if out is not None:
        check_tensor("out", out, dtypes=(torch.float16,), ndim=3, contiguous=False, device=None)
        if tuple(out.shape) != (m, n, 1):
            raise ValueError(f"out must have shape {(m, n, 1)}; got {tuple(out.shape)}")
        if out[..., 0].stride(1) != 1 or out[..., 0].stride(0) != n:
            raise ValueError(f"out must be row-major (strides ({n}, 1) over M, N); got strides {out.stride()}")
    require_tier("sm100", "gemmlab.kernels.dual_gemm_sm100.gated_dual_gemm_sm100")
    for name, t in (("a", a), ("b1", b1), ("b2", b2), ("sfa", sfa), ("sfb1", sfb1), ("sfb2", sfb2)):
        if t.device.type != "cuda":
            raise ValueError(f"{name} must be on a cuda device; got {t.device}")
    if out is None:
        out = torch.empty((m, n, 1), dtype=torch.float16, device=a.device)
    packed = [fp4.as_bytes(t)[..., 0].contiguous() for t in (a, b1, b2)]
    scales = [fp4.blocked_bytes(fp4.permute_scales(t)).contiguous() for t in (sfa, sfb1, sfb2)]
    run = launcher(dual_host(cfg, m, n, k), *packed, *scales, out[..., 0])
    run()
    return out


# --------------------------------------------------------------------------------------
# Reading the compiled kernel back
# --------------------------------------------------------------------------------------

def _code_lines(ptx: str) -> list[str]:
    return [ln.strip() for ln in ptx.splitlines() if ln.strip() and not ln.strip().startswith("//")]


def _trace(lines: list[str], upto: int, operand: str):
    """Value of ``operand`` at line ``upto`` as ``(leaves, constant)``: the sum of a constant and of
    registers it cannot resolve further (``leaves``: the TMEM base address loaded from shared memory,
    a run-time offset).

    Follows ``mov``, ``add``, ``or`` (constants only), ``and`` of constants, ``selp`` (its
    false arm: the DSL's run-time MMA fields are off unless a kernel turns them on) and
    ``[reg+imm]`` operands.
    """
    operand = operand.strip().strip("[]")
    if re.fullmatch(r"-?\d+", operand):
        return frozenset(), int(operand)
    if re.fullmatch(r"0[xX][0-9a-fA-F]+", operand):
        return frozenset(), int(operand, 16)
    mt = re.fullmatch(r"(%\w+)\+(\d+)", operand)
    if mt:
        leaves, val = _trace(lines, upto, mt.group(1))
        return leaves, val + int(mt.group(2))
    d = _def_of(lines, upto, operand)
    if d is None:
        return frozenset({operand}), 0
    i, op, args = d
    if op.startswith("mov.") and len(args) == 1:
        return _trace(lines, i, args[0])
    if op == "selp.b32":
        return _trace(lines, i, args[1])
    if op in ("add.s32", "add.u32", "or.b32", "and.b32"):
        (l0, v0), (l1, v1) = _trace(lines, i, args[0]), _trace(lines, i, args[1])
        if not l0 and not l1:
            return frozenset(), (v0 + v1 if op.startswith("add") else v0 | v1 if op == "or.b32" else v0 & v1)
        if op.startswith("add"):
            return l0 | l1, v0 + v1
    return frozenset({operand}), 0


def _def_of(lines: list[str], upto: int, reg: str):
    """The instruction (index, opcode, operands) that last defined ``reg`` before line ``upto``."""
    for i in range(upto - 1, -1, -1):
        mt = re.match(r"^(\S+)\s+" + re.escape(reg) + r",\s*(.+?);\s*$", lines[i])
        if mt:
            return i, mt.group(1), [x.strip() for x in mt.group(2).split(",")]
    return None


def _idesc_parts(lines: list[str], upto: int, operand: str):
    """Split the descriptor operand into its constant part and its run-time parts.

    The DSL ORs a constant (the ``selp`` of the negate bits: its false arm) with the
    scale-factor IDs taken from the SFA / SFB TMEM addresses,
    ``(addr >> shift) & mask``. Returns ``(constant, [(source register, shift, mask), ...])``.
    """
    const, runtime = 0, []

    def walk(reg, at):
        nonlocal const
        leaves, val = _trace(lines, at, reg)
        if not leaves:
            const |= val
            return
        d = _def_of(lines, at, reg)
        if d is None:
            raise RuntimeError(f"cannot follow {reg} in the instruction descriptor")
        i, op, args = d
        if op == "or.b32":
            walk(args[0], i)
            walk(args[1], i)
        elif op == "and.b32" and re.fullmatch(r"-?\d+", args[1]):
            src = _def_of(lines, i, args[0])
            if src and src[1] == "shr.u32":
                runtime.append((src[2][0], int(src[2][1]), int(args[1]) & 0xFFFFFFFF))
            else:
                runtime.append((args[0], 0, int(args[1]) & 0xFFFFFFFF))
        else:
            raise RuntimeError(f"unexpected {op} in the instruction descriptor")

    walk(operand, upto)
    return const, runtime


def static_evidence(compiled) -> dict:
    """What the PTX of the compiled kernel says, decoded (compile-only evidence, no GPU).

    * ``mma``: the opcode of every ``tcgen05.mma`` and, per MMA, the decoded instruction
      descriptor and the TMEM column offsets (from the TMEM base address) of D, SFA and SFB;
    * ``mma_per_k_block``: MMAs in the k-block loop body (the loop is not unrolled, so
      each sits once in the code);
    * ``tcgen05_cp``: the ``tcgen05.cp`` instructions (opcode) and their TMEM column offsets;
    * ``barrier_counts``: arrival count of every ``mbarrier.init`` by byte offset;
    * ``expect_tx``: byte counts announced with ``mbarrier.arrive.expect_tx``;
    * ``tma_loads``, ``tma_stores``: counts of bulk tensor copies in the code;
    * ``tmem_alloc``: the column count of ``tcgen05.alloc``;
    * ``order``: line numbers of the set-up and teardown steps in program order.
    """
    from ..compile import ptx_of

    lines = _code_lines(ptx_of(compiled) if not isinstance(compiled, str) else compiled)

    def where(pattern):
        return [i for i, ln in enumerate(lines) if re.search(pattern, ln)]

    def col(i, operand):  # TMEM column offset from the base address (the constant part)
        leaves, off = _trace(lines, i, operand)
        return off if leaves else None

    def has_runtime(i, operand):  # a run-time term besides the base address (the SFB shift of tile_n 64)
        return len(_trace(lines, i, operand)[0]) > 1

    ev = {"mma": [], "tcgen05_cp": [], "barrier_counts": {}, "expect_tx": []}
    for i in where(r"^tcgen05\.mma"):
        opcode, rest = lines[i].split(None, 1)
        ops = [o.strip() for o in re.sub(r"[\[\];]", "", rest).split(",")]
        idesc, runtime = _idesc_parts(lines, i, ops[3])
        sf_id_from = {}
        for reg, shift, mask in runtime:  # which operand's address each run-time field comes from
            who = "sfa" if reg == ops[4] else "sfb" if reg == ops[5] else reg
            sf_id_from[who] = (shift, mask)
        ev["mma"].append({"opcode": opcode, "idesc": idesc, "fields": decode_block_scaled_idesc(idesc),
                          "sf_id_from": sf_id_from, "accumulate": sorted(set(
                              int(v) for v in re.findall(r"^mov\.pred\s+" + re.escape(ops[6]) + r",\s*(-?\d+);",
                                                         "\n".join(lines), re.M))),
                          "d_col": col(i, ops[0]), "sfa_col": col(i, ops[4]), "sfb_col": col(i, ops[5]),
                          "sfb_runtime_shift": has_runtime(i, ops[5]),
                          "runtime_terms": any(has_runtime(i, ops[j]) for j in (0, 4))})
    for i in where(r"^tcgen05\.cp"):
        opcode, rest = lines[i].split(None, 1)
        dst = rest.split(",")[0].strip()
        ev["tcgen05_cp"].append({"opcode": opcode, "col": col(i, dst), "runtime": has_runtime(i, dst)})
    for i in where(r"^mbarrier\.init"):
        mt = re.match(r"^mbarrier\.init\.shared(?:::cta)?\.b64\s+\[(%r\d+)(?:\+(\d+))?\],\s*(\S+);", lines[i])
        _, reg_off = _trace(lines, i, mt.group(1))  # the register may be the base plus an offset
        ev["barrier_counts"][reg_off + int(mt.group(2) or 0)] = _trace(lines, i, mt.group(3))[1]
    for i in where(r"^mbarrier\.arrive\.expect_tx"):
        ev["expect_tx"].append(_trace(lines, i, lines[i].rstrip(";").split(",")[-1])[1])
    ev["mma_per_k_block"] = len(where(r"^tcgen05\.mma"))
    ev["tma_loads"] = len(where(r"^cp\.async\.bulk\.tensor.*\.shared::\w+\.global"))
    ev["tma_stores"] = len(where(r"^cp\.async\.bulk\.tensor.*\.global\.shared::cta"))
    alloc = where(r"^tcgen05\.alloc")
    ev["tmem_alloc"] = [_trace(lines, i, lines[i].rstrip(";").split(",")[-1])[1] for i in alloc]
    ev["order"] = {name: where(pattern) for name, pattern in (
        ("mbarrier.init", r"^mbarrier\.init"), ("barrier.cluster.wait", r"^barrier\.cluster\.wait"),
        ("tcgen05.alloc", r"^tcgen05\.alloc"), ("bar.sync 0", r"^bar(rier)?\.sync\s+0;"),
        ("tcgen05.cp", r"^tcgen05\.cp"), ("tcgen05.mma", r"^tcgen05\.mma"), ("tcgen05.ld", r"^tcgen05\.ld"),
        ("tcgen05.wait::ld", r"^tcgen05\.wait::ld"), ("tmem_empty arrive", r"^mbarrier\.arrive\.shared"),
        ("tcgen05.relinquish_alloc_permit", r"^tcgen05\.relinquish"), ("tcgen05.dealloc", r"^tcgen05\.dealloc"))}
    return ev


def setup_order(compiled) -> list[str]:
    """The set-up and teardown steps in PTX program order (names only, for the notebook)."""
    order = static_evidence(compiled)["order"]
    steps = []
    for name in ("mbarrier.init", "barrier.cluster.wait", "tcgen05.alloc", "bar.sync 0",
                 "tcgen05.relinquish_alloc_permit", "tcgen05.dealloc"):
        idx = order[name]
        for i in ((idx[-1],) if name == "mbarrier.init" else idx):
            steps.append((i, name + (" (last)" if name == "mbarrier.init" else "")))
    return [name for _, name in sorted(steps)]


def evidence_summary(compiled) -> list[str]:
    """:func:`static_evidence` as short lines for a reader (what the notebook prints)."""
    ev = static_evidence(compiled)
    first = ev["mma"][0]
    f = first["fields"]
    fmt = {E2M1_FORMAT: "E2M1"}
    major = {0: "K-major", 1: "MN-major"}

    def sfb(mmas):
        return (", ".join(str(m["sfb_col"]) for m in mmas)
                + (" + a run-time shift" if any(m["sfb_runtime_shift"] for m in mmas) else ""))

    lines = [f"{first['opcode']}: {ev['mma_per_k_block']} per k-block (4 steps x 2 GEMMs)",
             f"instruction descriptor 0x{first['idesc']:08x}: M {f['M']}, N {f['N']}, "
             f"A {fmt.get(f['a_format'], f['a_format'])} {major[f['a_major']]}, "
             f"B {fmt.get(f['b_format'], f['b_format'])} {major[f['b_major']]}, "
             f"scales {'UE4M3' if f['scale_format'] == SCALE_UE4M3 else 'UE8M0'}, "
             f"{'sparse' if f['sparse'] else 'dense'}, negate A/B {f['negate_a']}/{f['negate_b']}, "
             f"SF IDs ORed in at run time from the scale addresses' bits 31:30",
             "accumulators at TMEM columns " + ", ".join(str(m["d_col"]) for m in ev["mma"][:2]),
             "SFA columns " + ", ".join(str(m["sfa_col"]) for m in ev["mma"][::2]),
             "SFB columns (GEMM 1) " + sfb(ev["mma"][::2]),
             "SFB columns (GEMM 2) " + sfb(ev["mma"][1::2]),
             f"{len(ev['tcgen05_cp'])} x {ev['tcgen05_cp'][0]['opcode']} per k-block, to columns "
             + ", ".join(str(c["col"]) for c in ev["tcgen05_cp"]),
             f"tcgen05.alloc {ev['tmem_alloc'][0]} columns; expect_tx {ev['expect_tx'][0]} bytes per stage; "
             f"{ev['tma_loads']} TMA loads per k-block, {ev['tma_stores']} TMA stores per tile and warp",
             "mbarrier arrival counts (by byte offset): "
             + ", ".join(f"{k}: {v}" for k, v in sorted(ev["barrier_counts"].items()))]
    return lines
