"""Chapter 11 on Hopper, the swap twin: the decode twin's weights in registers, the A16 twin's FP16 tokens, any M.

What it teaches
    The A16 twin (:mod:`gemmlab.kernels.dual_gemm_sm90_a16`) converts [B1; B2] into FP16 in shared memory, and its
    WGMMAs read it back from there (the SS form). On an H100 (2026-11-27, ``benchmarks/conversion_probe.py``,
    ``results/nvidia-h100-80gb-hbm3/dual_gemm_conversion_probe.txt``) taking the conversion's arithmetic out of that
    kernel altogether (the converter storing the packed words unconverted) made it only 4 to 5 % faster (512 x 4096 x
    7168: 107.5 against 103.2 us): the conversion's arithmetic is not what sets its pace. The probe leaves in place the
    FP16 [B1; B2] slices stored into shared memory, the barriers around them and both MMA warpgroups' SS WGMMAs reading
    them back; which of these sets the pace was not profiled. This twin does away with all three:

    * **Weights on WGMMA's M side, in registers** (as the decode twin, :mod:`gemmlab.kernels.dual_gemm_sm90_decode`):
      each MMA thread converts exactly its RS fragment of W1 and of W2 from the packed bytes TMA brought, and the
      WGMMAs read them from its registers (the RS form). A CTA computes ``D^T`` for ``rows`` weight rows of both GEMMs
      (64 per MMA warpgroup, two accumulators each) and one tile of ``tokens`` rows of A.
    * **Tokens as FP16 by TMA**: A is converted once per call by the A16 twin's pre-pass
      (:func:`~gemmlab.kernels.dual_gemm_sm90_a16.launch_prepass`) into an (M, K) FP16 workspace; each k-block's four
      token slices (``tokens`` x 64 values, WGMMA's 128B-swizzled K-major B layout) arrive by TMA in the same ring
      stage as the packed weights, so no warp converts tokens and no mbarrier but the ring's is needed. Rows past M
      arrive as zeros (TMA fills a box past the tensor's end with zeros) and no store reads them.
    * **Any M**: the grid's y covers M in tiles of ``tokens`` rows; its x the weight rows; its z the ``split``-K
      CTAs of a cluster, reduced through distributed shared memory as in the decode twin.

Measured (H100, 2026-11-27, kernels alone, ``results/nvidia-h100-80gb-hbm3/dual_gemm_swap.json``: 84 configurations on
24 shapes, M = 64 to 1024). Its best form beat the A16 twin's pick at 512 x 4096 x 7168 (95.6 against 106.1 us), 1024
x 4096 x 7168 (182.3 against 206.0) and 640 x 3072 x 4096 (58.8 against 70.3), and the decode twin's pick on all six
shapes with M = 64 and 128 (128 x 14336 x 4096: 61.5 against 83.7 us). It lost to the A16 twin's pick on five:
640 x 4096 x 7168 (179.8 against 145.2 us: 160 CTAs of 132; 172.1 with 112-token tiles, 192 CTAs), on N = 3072 at
384, 512 and 1024 rows (its best grids: 96 CTAs, one wave with 36 SMs idle, or 192 at 1024 rows), and at
384 x 4096 x 7168, whose one-wave grid needs 96-token tiles (86.8 against 83.6 us: three quarters of the 128-token
CTA's work in 0.91 of its time at 512 rows). Nsight Compute at 512 x 4096 x 7168, ``(128, 2, 1)`` (before the staged
epilogue; ``dual_gemm_swap_ncu.txt``): the busiest pipeline the shared pipeline (which its tensor sub-pipeline
dominates) at 69.9 % of the elapsed cycles, the SMs active 93 % of them (128 CTAs on 132 SMs), 0.56 eligible warps per
scheduler, L2 39 % of its throughput. Each weight element is still converted once per token tile (M / tokens times),
but in registers, where the A16 twin stored and reread it. The GPU runs (tests, sanitizer, sweep, benchmarks) were of
commit dda6c9f; the helpers shared with the decode twin since then leave this kernel's PTX the same up to the
placement of the split-K reduction's address computations (checked by diffing the PTX) and the store rounds' clamp.

Roles (128 threads per warpgroup)::

    warpgroup 0     warp 0: per k-block kb: wait empty[kb % S]; expect_tx(full[kb % S]); 14 TMA boxes (W1 and W2
                    packed as four 32-byte slices each, their two scale boxes, 4 FP16 token slices). Warps 1-3 only
                    take part in the split's barriers.
    warpgroups 1-2  per k-block: wait full[s]; per slice j: convert W1(j) and W2(j) into registers (the next slice's
                    bytes loading meanwhile); wgmma.fence; 4 x (acc1 += W1 A^T, acc2 += W2 A^T); commit;
                    slice 1: wgmma.wait_group 1 shows k-block kb - 1's last slice read -> arrive empty[(kb - 1) % S]
                    epilogue: split 1: named barrier of the MMA threads (the ring is free); silu(acc1) * acc2 ->
                      FP16 -> a (tokens, rows) tile of C in shared memory; named barrier; 16-byte stores to C
                      (predicated); split > 1: the decode twin's reduction over the cluster, each CTA staging and
                      storing its share of the token columns
"""
from __future__ import annotations

import functools

import cutlass
import cutlass.cute as cute
import cutlass.utils.hopper_helpers as sm90_utils
import cuda.bindings.driver as cuda
from cutlass import Float16, Float32, Int32, Int64, Uint8
from cutlass.cute.nvgpu import OperandMajorMode, cpasync, warpgroup
from cutlass.memory import SmemAllocator
from cutlass.tensor_utils import LayoutEnum

from ..family.configs import DECODE_WG_ROWS as WG_ROWS, KB_BYTES, SF_BYTES, SLICE_K, SLICES, SwapConfig
from ..family.problem import check_gated_sizes
from ..ldst import ld_shared_v4, st_global_v4
from .dual_gemm_sm90 import check_sm90_target, compile_with_pointers, fake_operands, with_runtime_rows
from .dual_gemm_sm90_a16 import _fake_a16, call_with_a_workspace, launch_prepass
from .dual_gemm_sm90_decode import (SLICE_BYTES, convert_slice, enter_stage, exchange_partials, follow_exchange,
                                    gate, k_share, mma_slice, mma_thread, reduce_value)

#: setmaxnreg per role, by MMA warpgroups: (load warpgroup, MMA). 128 x (load + w x MMA) must not exceed the threads x
#: the registers at entry (256 x 255 alone; 384 x 168 = 64,512 beside a second MMA warpgroup).
REGS = {1: (96, 256), 2: (40, 224)}


@cute.kernel
def swap_kernel(
    tma_w1: cute.CopyAtom, mW1: cute.Tensor, tma_w2: cute.CopyAtom, mW2: cute.Tensor,
    tma_sw1: cute.CopyAtom, mSW1: cute.Tensor, tma_sw2: cute.CopyAtom, mSW2: cute.Tensor,
    tma_x: cute.CopyAtom, mX: cute.Tensor, mCt: cute.Tensor, tiled_mma: cute.TiledMma,
    pw_layout: cute.Layout, sw_layout: cute.Layout, fx_layout: cute.ComposedLayout, k_blocks: Int32,
    cfg: cutlass.Constexpr,
):
    R = cfg.rows
    T = cfg.tokens
    S = cfg.stages
    SPLIT = cfg.split
    MT = cfg.mma_warpgroups * 128  # MMA threads
    tidx, _, _ = cute.arch.thread_idx()
    warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
    wg = warp // 4
    n_blk, m_blk, kz = cute.arch.block_idx()
    kb0, nkb = k_share(kz, k_blocks, SPLIT)  # this CTA's k-blocks

    smem = SmemAllocator()
    raw = smem.allocate_tensor(Uint8, cute.make_layout(cfg.ring_bytes()), byte_alignment=1024)
    full = smem.allocate_array(Int64, S, byte_alignment=8)
    empty = smem.allocate_array(Int64, S, byte_alignment=8)

    # the ring: FP16 token slices (S x SLICES buffers of T rows x 128 bytes), packed W1 then W2, their scales
    fRaw = raw.iterator
    pWRaw = fRaw + S * cfg.token_bytes()
    sWRaw = pWRaw + S * 2 * R * KB_BYTES
    pW1 = cute.make_tensor(pWRaw, pw_layout)
    pW2 = cute.make_tensor(pWRaw + R * KB_BYTES, pw_layout)
    sW1 = cute.make_tensor(sWRaw, sw_layout)
    sW2 = cute.make_tensor(sWRaw + R * SF_BYTES, sw_layout)
    fX = cute.make_tensor(cute.recast_ptr(fRaw, fx_layout.inner, Float16), fx_layout.outer)  # (T, 64, S x SLICES)

    if warp == 0:
        for atom in (tma_w1, tma_w2, tma_sw1, tma_sw2, tma_x):
            cpasync.prefetch_descriptor(atom)
        with cute.arch.elect_one():
            for s in cutlass.range_constexpr(S):
                cute.arch.mbarrier_init(full + s, 1)
                cute.arch.mbarrier_init(empty + s, 4 * cfg.mma_warpgroups)  # every MMA warp
            cute.arch.mbarrier_init_fence()
    cute.arch.sync_threads()

    if wg == 0:
        # ============================================================ loads
        cute.arch.warpgroup_reg_dealloc(REGS[cfg.mma_warpgroups][0])
        if warp == 0:
            w_copies = []
            for atom, gl, s, width in ((tma_w1, mW1, pW1, KB_BYTES), (tma_w2, mW2, pW2, KB_BYTES),
                                       (tma_sw1, mSW1, sW1, SF_BYTES), (tma_sw2, mSW2, sW2, SF_BYTES)):
                tiles = cute.local_tile(gl, (R, width), (None, None))
                dst, src = cpasync.tma_partition(atom, 0, cute.make_layout(1), cute.group_modes(s, 0, 2),
                                                 cute.group_modes(tiles, 0, 2))
                w_copies.append((atom, src, dst))
            gX = cute.local_tile(mX, (T, SLICE_K), (None, None))
            tXs, tXg = cpasync.tma_partition(tma_x, 0, cute.make_layout(1), cute.group_modes(fX, 0, 2),
                                             cute.group_modes(gX, 0, 2))
            for kb in cutlass.range(nkb, unroll=1):
                stage = kb % S
                cute.arch.mbarrier_wait(empty + stage, ((kb // S) & 1) ^ 1)
                with cute.arch.elect_one():
                    cute.arch.mbarrier_arrive_and_expect_tx(full + stage, cfg.stage_bytes())
                for atom, src, dst in w_copies:
                    cute.copy(atom, src[(None, n_blk, kb0 + kb)], dst[(None, stage)], tma_bar_ptr=full + stage)
                for sl in cutlass.range_constexpr(SLICES):
                    cute.copy(tma_x, tXg[(None, m_blk, (kb0 + kb) * SLICES + sl)], tXs[(None, stage * SLICES + sl)],
                              tma_bar_ptr=full + stage)
        if cutlass.const_expr(SPLIT > 1):
            follow_exchange()
    else:
        # ============================================================ MMA warpgroups: weights into registers
        cute.arch.warpgroup_reg_alloc(REGS[cfg.mma_warpgroups][1])
        ctid = tidx - 128
        lane = cute.arch.lane_idx()
        thr_mma, selector, row0, frag1, frag2, fw1, fw2, acc1, acc2, k_steps = mma_thread(tiled_mma, ctid, warp, R, T)
        tCrX = tiled_mma.make_fragment_B(thr_mma.partition_B(fX))  # (MMA, MMA_N, MMA_K, S x SLICES)

        for kb in cutlass.range(nkb, unroll=1):
            # half-slice pipeline: W1(j) converts while W2(j) loads, W2(j) while W1(j + 1) loads
            stage, stage_w, stage_sw, cur = enter_stage(full, pWRaw, sWRaw, kb, row0, S, R)
            for sl in cutlass.range_constexpr(SLICES):
                # this warpgroup's WGMMAs of slice j - 2 are done: fragments j % 2 are free again
                if cutlass.const_expr(sl >= 2):
                    warpgroup.wait_group(1)
                elif cutlass.const_expr(sl == 1):
                    warpgroup.wait_group(1)  # the previous k-block's last slice is read: its stage is free
                    if kb > 0:
                        if lane == 0:
                            cute.arch.mbarrier_arrive(empty + (kb + S - 1) % S)
                cur = convert_slice(fw1, fw2, cur, stage_w, stage_sw, row0, selector, sl, R)
                warpgroup.fence()
                mma_slice(tiled_mma, acc1, acc2, frag1[sl % 2], frag2[sl % 2], tCrX, stage * SLICES + sl, k_steps)
                warpgroup.commit_group()
            # slice 2's WGMMAs are done (fragments 0 free for the next k-block's slice 0). Waiting inside the loop
            # body, not at the top of the next k-block, keeps ptxas from serializing every WGMMA (C7513; see the
            # decode twin)
            warpgroup.wait_group(1)
        warpgroup.wait_group(0)

        # ---- epilogue: accumulator row r, column c is C[m = m_blk T + c, n = n_blk R + r]. The gate's FP16 values
        # go to a (T, R) tile in shared memory (row-major, as C), then out in 16-byte chunks of C's rows
        tCsC = None
        c0 = 0  # the first token column of the tile this CTA stores (split: its share of the columns)
        if cutlass.const_expr(SPLIT == 1):
            # the other MMA warpgroup's last WGMMAs may still read the ring, where the tile goes
            cute.arch.barrier(barrier_id=EPILOGUE_BARRIER, number_of_threads=MT)
            tCsC = thr_mma.partition_C(c_tile(fRaw, R, T))
            for i in cutlass.range(cute.size(acc1), unroll_full=True):
                tCsC[i] = gate(acc1[i], acc2[i]).to(Float16)
        else:
            # the CTA barrier first: every TMA write into the ring was waited for (full) and every WGMMA read of it is
            # complete (wait_group 0) before the partials overwrite it
            rank, share, peers = exchange_partials(fRaw, acc1, acc2, ctid, MT, SPLIT)
            # value j of a thread's fragment lies in token column group j // 4 (8 columns each): our share of the
            # values, ranks in order, is token columns [rank T / SPLIT, (rank + 1) T / SPLIT) of every weight row
            c0 = rank * (T // SPLIT)
            tCsC = thr_mma.partition_C(c_tile(fRaw + cfg.partial_bytes(), R, T))  # past the partials the peers read
            for jj in cutlass.range_constexpr(share):
                j = rank * share + jj
                x, y = reduce_value(peers, j, cute.size(acc1), MT, SPLIT)
                tCsC[j] = gate(x, y).to(Float16)
        cute.arch.barrier(barrier_id=EPILOGUE_BARRIER, number_of_threads=MT)
        tile = fRaw if cutlass.const_expr(SPLIT == 1) else fRaw + cfg.partial_bytes()
        store_rows(tile, mCt, n_blk, m_blk, c0, ctid, R, T, T // SPLIT, MT)
        if cutlass.const_expr(SPLIT > 1):
            # our shared memory must outlive the peers' reads of it
            cute.arch.cluster_arrive()
            cute.arch.cluster_wait()


#: The named barrier of the MMA warpgroups' epilogue (0 is the CTA's).
EPILOGUE_BARRIER = 1


@cute.jit
def c_tile(base, rows: cutlass.Constexpr, tokens: cutlass.Constexpr) -> cute.Tensor:
    """The (rows, tokens) accumulator view of a tile of C staged in shared memory at ``base``: weight row r, token
    column c at FP16 element ``c rows + r`` (row-major in C's sense: a token's ``rows`` outputs are contiguous)."""
    return cute.make_tensor(cute.recast_ptr(base, dtype=Float16), cute.make_layout((rows, tokens), stride=(1, rows)))


@cute.jit
def store_rows(tile, mCt: cute.Tensor, n_blk, m_blk, c0, ctid, rows: cutlass.Constexpr, tokens: cutlass.Constexpr,
               count: cutlass.Constexpr, threads: cutlass.Constexpr):
    """Token columns ``[c0, c0 + count)`` of the staged tile (:func:`c_tile`) to C in 16-byte chunks (8 outputs of
    one token), thread ``ctid`` of ``threads`` taking chunks ``ctid``, ``ctid + threads``, ...; each predicated on
    its token row m < M and its first column n < N (N is a multiple of 8, so a chunk lies wholly inside or out)."""
    n_size = cute.size(mCt, mode=[0])
    m_size = cute.size(mCt, mode=[1])
    per_row = rows // 8
    chunks = count * per_row
    gC = cute.recast_ptr(mCt.iterator, dtype=Uint8)
    for i in cutlass.range_constexpr((chunks + threads - 1) // threads):
        if cutlass.const_expr((i * threads) // per_row >= m_size):
            # every row of this round lies past M whatever the block and thread (M < tokens): LLVM folds the predicate
            # to a constant, which the predicated store's PTX cannot take ("@0"), so the round is left out
            continue
        idx = ctid + i * threads
        row = c0 + idx // per_row
        ch = idx % per_row
        m = m_blk * tokens + row
        n = n_blk * rows + ch * 8
        ok = (m < m_size) & (n < n_size)
        src = row * rows + ch * 8
        if cutlass.const_expr((i + 1) * threads > chunks):
            # a partial last round: the spare threads store nothing and read the tile's last chunk, not past it
            ok = ok & (idx < chunks)
            src = cutlass.min(src, (c0 + count) * rows - 8)
        w0, w1, w2, w3 = ld_shared_v4(tile + src * 2)
        st_global_v4(gC + (Int64(m) * n_size + n) * 2, w0, w1, w2, w3, pred=ok)


# --------------------------------------------------------------------------------------
# Host side
# --------------------------------------------------------------------------------------


def smem_layouts(cfg: SwapConfig):
    """Per-stage layouts of the ring: packed weights slice-major (W2 after W1), scales row-major, and the FP16 token
    slices (WGMMA's 128B-swizzled K-major B, ``SLICES`` a stage)."""
    R, T, S = cfg.rows, cfg.tokens, cfg.stages
    pw = cute.make_layout((R, (SLICE_BYTES, SLICES), S), stride=(SLICE_BYTES, (1, R * SLICE_BYTES), 2 * R * KB_BYTES))
    sw = cute.make_layout((R, SF_BYTES, S), stride=(SF_BYTES, 1, 2 * R * SF_BYTES))
    fx = sm90_utils.make_smem_layout_b(LayoutEnum.ROW_MAJOR, (R, T, SLICE_K), Float16, S * SLICES)
    return pw, sw, fx


@cute.jit
def launch_swap(a16: cute.Tensor, b1: cute.Tensor, b2: cute.Tensor, sfb1: cute.Tensor, sfb2: cute.Tensor,
                c: cute.Tensor, stream: cuda.CUstream, cfg: cutlass.Constexpr):
    """The main kernel: ``a16`` (M, K) FP16 row-major (the pre-pass's output), ``b1``/``b2`` (N, K/2) packed bytes,
    ``sfb1``/``sfb2`` (N, K/16) scale bytes, ``c`` (M, N) FP16."""
    R, T = cfg.rows, cfg.tokens
    tiled_mma = sm90_utils.make_trivial_tiled_mma(Float16, Float16, OperandMajorMode.K, OperandMajorMode.K, Float32,
                                                  (cfg.mma_warpgroups, 1, 1), tiler_mn=(WG_ROWS, T),
                                                  a_source=warpgroup.OperandSource.RMEM)
    pw, sw, fx = smem_layouts(cfg)
    g2s = cpasync.CopyBulkTensorTileG2SOp()
    m = cute.size(c, mode=[0])
    n = cute.size(c, mode=[1])
    a16 = with_runtime_rows(a16, m)  # M = 1 would lose the row coordinate of the token copies
    tma_w1, tW1 = cpasync.make_tiled_tma_atom(g2s, b1, cute.slice_(pw, (None, None, 0)), (R, KB_BYTES))
    tma_w2, tW2 = cpasync.make_tiled_tma_atom(g2s, b2, cute.slice_(pw, (None, None, 0)), (R, KB_BYTES))
    tma_sw1, tSW1 = cpasync.make_tiled_tma_atom(g2s, sfb1, cute.slice_(sw, (None, None, 0)), (R, SF_BYTES))
    tma_sw2, tSW2 = cpasync.make_tiled_tma_atom(g2s, sfb2, cute.slice_(sw, (None, None, 0)), (R, SF_BYTES))
    tma_x, tX = cpasync.make_tiled_tma_atom(g2s, a16, cute.slice_(fx, (None, None, 0)), (T, SLICE_K))
    ct = cute.make_tensor(c.iterator, cute.make_layout((n, m), stride=(1, n)))  # C^T: the accumulators' view
    k_blocks = cute.size(b1, mode=[1]) // KB_BYTES
    kernel = swap_kernel(tma_w1, tW1, tma_w2, tW2, tma_sw1, tSW1, tma_sw2, tSW2, tma_x, tX, ct, tiled_mma,
                         pw, sw, fx, k_blocks, cfg)
    grid = ((n + R - 1) // R, (m + T - 1) // T, cfg.split)
    # one CTA per SM (.minnctapersm 1): ptxas then knows the register count at entry and honours setmaxnreg
    if cutlass.const_expr(cfg.split == 1):
        kernel.launch(grid=grid, block=(cfg.threads, 1, 1), min_blocks_per_mp=1, stream=stream)
    else:
        kernel.launch(grid=grid, block=(cfg.threads, 1, 1), cluster=(1, 1, cfg.split), min_blocks_per_mp=1,
                      stream=stream)


@cute.jit
def launch_both(a: cute.Tensor, b1: cute.Tensor, b2: cute.Tensor, sfa: cute.Tensor, sfb1: cute.Tensor,
                sfb2: cute.Tensor, a16: cute.Tensor, c: cute.Tensor, stream: cuda.CUstream, cfg: cutlass.Constexpr):
    """The A16 twin's pre-pass into ``a16`` (the FP16 A workspace), then the swap kernel, on one stream."""
    launch_prepass(a, sfa, a16, stream)
    launch_swap(a16, b1, b2, sfb1, sfb2, c, stream, cfg)


@functools.lru_cache(maxsize=None)
def swap_host(cfg: SwapConfig):
    """The ``@cute.jit`` host function of ``cfg``: :func:`launch_both` (static shapes: one compile per problem size)."""

    @cute.jit
    def dual_gemm_sm90_swap_host(a: cute.Tensor, b1: cute.Tensor, b2: cute.Tensor, sfa: cute.Tensor,
                                 sfb1: cute.Tensor, sfb2: cute.Tensor, a16: cute.Tensor, c: cute.Tensor,
                                 stream: cuda.CUstream):
        launch_both(a, b1, b2, sfa, sfb1, sfb2, a16, c, stream, cfg)

    return dual_gemm_sm90_swap_host


def _config(cfg):
    cfg = SwapConfig() if cfg is None else cfg
    if not isinstance(cfg, SwapConfig):
        raise TypeError(f"cfg must be a SwapConfig; got {type(cfg).__name__}")
    return cfg


def compile_swap(target: str, cfg: SwapConfig | None, m: int, n: int, k: int):
    """Compile the swap twin of ``cfg`` (None: the default :class:`SwapConfig`), pre-pass and main kernel in one host
    function, for an M x N x K problem without a GPU (static shapes); arguments as
    :func:`~gemmlab.kernels.dual_gemm_sm90_a16.compile_a16`'s. Every argument is checked before the DSL sees it."""
    from ..compile import compile_for, fake_stream

    check_sm90_target(target)
    m, n, k = check_gated_sizes(m, n, k)
    cfg = _config(cfg)
    ops = fake_operands(m, n, k)
    return compile_for(target, swap_host(cfg), *ops[:6], _fake_a16(m, k), ops[6], fake_stream())


def compile_swap_ptrs(target: str, cfg: SwapConfig | None, m: int, n: int, k: int, out_stride: tuple = None):
    """The swap twin compiled through TVM-FFI with the inputs and the FP16 A workspace as bare pointers: what the
    public call's plan launches, as ``fn(a, b1, b2, sfa, sfb1, sfb2, a16 workspace pointers, out)``."""
    check_sm90_target(target)
    m, n, k = check_gated_sizes(m, n, k)
    return compile_with_pointers(target, launch_both, _config(cfg), m, n, k, out_stride, workspace=True)


def gated_dual_gemm_swap(a, b1, b2, sfa, sfb1, sfb2, out=None, cfg: SwapConfig | None = None):
    """``silu(A B1^T) * (A B2^T)`` in FP16 on an H100/H200 with the swap twin (arguments as the simple twin's;
    ``cfg`` forced or the default), its FP16 A workspace allocated per call
    (:func:`~gemmlab.kernels.dual_gemm_sm90_a16.call_with_a_workspace`). Returns ``out``."""
    return call_with_a_workspace(lambda c: swap_host(_config(c)),
                                 "gemmlab.kernels.dual_gemm_sm90_swap.gated_dual_gemm_swap",
                                 a, b1, b2, sfa, sfb1, sfb2, out, cfg)
