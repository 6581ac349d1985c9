"""Chapter 11 on Hopper: the NVFP4 gated dual GEMM, C = silu(A B1^T) * (A B2^T), on sm_90a (a first draft).

What it teaches
    Hopper has no FP4 tensor cores: WGMMA multiplies BF16 (or FP8), and there is no
    tensor memory. The twin of the SM100 kernel therefore moves the NVFP4 bytes as
    they are (a quarter of BF16's traffic) and dequantizes them *on chip*:

    * **TMA** brings each k-block (256 FP4 values, 128 bytes a row) of A, B1 and B2,
      packed, and their plain e4m3 scales (16 bytes a row per k-block) into a ring of
      ``stages`` shared-memory stages (``full`` / ``empty`` mbarriers, as chapter 07).
    * **Dequantize in shared memory**: for each 64-wide slice of the k-block the two
      consumer warpgroups turn the packed bytes into BF16 tiles in the 128-byte
      swizzled layout WGMMA reads. Each e2m1 value times its e4m3 scale is exact in
      BF16 (at most 6 significant bits, BF16 has 8), so nothing is lost before the
      FP32 accumulation. The decoding is integer arithmetic (sm_90 has no
      ``cvt`` from e2m1): ``(m + 2 [e > 0]) << max(e, 1)`` quarters for the value,
      ``(M + 8 [E > 0]) << (max(E, 1) - 1)`` 512ths for the scale.
    * **WGMMA with two accumulators sharing the A tile**: each consumer warpgroup owns
      64 rows and keeps both 64 x ``tile_n`` FP32 accumulators in registers (where the
      SM100 kernel keeps them in TMEM).
    * **Epilogue**: ``silu(acc1) * acc2`` in FP32, FP16, stored straight from the
      registers (predicated on M and N).

    Where it differs from the SM100 kernel, and why: no FP4 tensor cores (dequantize
    first, BF16 MMA), no TMEM (accumulators and scales in registers / shared memory),
    no ``tcgen05.cp`` (the scales are applied while dequantizing), and plain scales
    instead of the permuted layout (the scales never go to a tensor core, so the
    128x4 layout buys nothing here).

Status
    The simple form, kept as the first rung of chapter 11's Hopper ladder: correct on an
    H100 and an H200 (``tests/test_dual_gemm_sm90.py``, compute-sanitizer clean), and 7 to
    16 times slower there than :mod:`gemmlab.kernels.dual_gemm_sm90_pipelined`, which the public
    call runs. One CTA per 128 x ``tile_n`` tile (not persistent), scalar dequantization,
    and the WGMMAs of a slice wait for its dequantization (no overlap inside a CTA beyond
    the TMA ring).

Roles (128 threads per warpgroup)::

    warpgroup 0  warp 0   producer: per k-block: wait empty[s] -> expect_tx(full[s]) -> TMA A, B1, B2, SFA, SFB1, SFB2
    warpgroups 1, 2       consumers: per k-block: wait full[s]; per 64-wide slice: dequantize A, B1, B2 -> BF16
                          smem; barrier; wgmma into acc1 (A, B1) and acc2 (A, B2); wait; barrier;
                          then release stage s. Epilogue: silu(acc1) * acc2 -> FP16 -> global.
"""
from __future__ import annotations

import functools

import cutlass
import cutlass.cute as cute
import cutlass.utils as utils
import cutlass.utils.hopper_helpers as sm90_utils
import cuda.bindings.driver as cuda
from cutlass import BFloat16, Float16, Float32, Int32, Int64, Uint8
from cutlass.cute.nvgpu import cpasync, warpgroup
from cutlass.memory import SmemAllocator

from .. import nvfp4 as fp4
from ..family.configs import GATED_TILE_M as TILE_M, KB_BYTES, SF_BYTES, SLICE_K, SLICES, DualSm90Config
from ..family.problem import check_gated_sizes
from ..pipeline import DevicePipelineState

PRODUCER_REGS = 40
CONSUMER_REGS = 232
CONSUMER_THREADS = 256
CONSUMER_BARRIER = 1  # named barrier id of the two consumer warpgroups (0 is __syncthreads)
WG_ROWS = 64


# --------------------------------------------------------------------------------------
# Dequantization (integer arithmetic: sm_90 has no e2m1 conversion)
# --------------------------------------------------------------------------------------


def e2m1_parts(code):
    """e2m1 ``code`` (0..15) as ``(quarters, sign)``: value = (1 - 2 sign) quarters / 4.

    ``quarters = (m + 2 [e > 0]) << max(e, 1)`` with ``e`` the 2-bit exponent, ``m`` the
    mantissa bit; branch-free integer arithmetic, so the same function runs on Python
    ints (tests) and on device ``Int32`` values (the kernel).
    """
    m = code & 1
    e = (code >> 1) & 3
    nz = (e | (e >> 1)) & 1  # e > 0
    return (m + 2 * nz) << (e + 1 - nz), (code >> 3) & 1


def e4m3_parts(byte):
    """e4m3 ``byte`` as ``(units, sign)``: value = (1 - 2 sign) units / 512 (0x7f / 0xff, NaN, not handled).

    ``units = (M + 8 [E > 0]) << (max(E, 1) - 1)``: normal numbers (8 + M) 2^(E - 7) / 8,
    subnormals M 2^-9. Same on Python ints and device ``Int32``.
    """
    mm = byte & 7
    ee = (byte >> 3) & 15
    nz = (ee + 15) >> 4  # E > 0
    return (mm + 8 * nz) << (ee - nz), (byte >> 7) & 1


@cute.jit
def e2m1_value(code: Int32) -> Float32:
    """e2m1 ``code`` as FP32 on the device (:func:`e2m1_parts`)."""
    q, sign = e2m1_parts(code)
    return Float32(q) * Float32(0.25) * Float32(1 - 2 * sign)


@cute.jit
def e4m3_value(byte: Int32) -> Float32:
    """e4m3 ``byte`` as FP32 on the device (:func:`e4m3_parts`)."""
    u, sign = e4m3_parts(byte)
    return Float32(u) * Float32(1.0 / 512.0) * Float32(1 - 2 * sign)


@cute.jit
def dequant_slice(packed: cute.Tensor, scales: cute.Tensor, out: cute.Tensor, rows: cutlass.Constexpr,
                  stage: Int32, sl: cutlass.Constexpr, ctid: Int32):
    """Consumers turn slice ``sl`` (64 values) of ``rows`` packed rows into BF16 ``out`` (rows, 64).

    Each of the 256 threads takes one byte (two values, low nibble first) per step;
    its scale is byte ``4 sl + byte // 8`` of the row's 16 (one scale per 16 values).
    """
    for it in cutlass.range_constexpr(rows * (SLICE_K // 2) // CONSUMER_THREADS):
        lin = ctid + it * CONSUMER_THREADS
        r = lin // (SLICE_K // 2)
        b = lin % (SLICE_K // 2)
        v = Int32(packed[(r, sl * (SLICE_K // 2) + b, stage)])
        s = e4m3_value(Int32(scales[(r, sl * (SLICE_K // fp4.SF_VEC) + b // 8, stage)]))
        out[(r, 2 * b, 0)] = (e2m1_value(v & 15) * s).to(BFloat16)
        out[(r, 2 * b + 1, 0)] = (e2m1_value(v >> 4) * s).to(BFloat16)


@cute.jit
def tma_copies(operands, bn: cutlass.Constexpr, m_tile, n_tile):
    """The six loads of a k-block, as ``(atom, global k-block tiles, shared stages, tile index)``.

    ``operands``: ``(atom, global tensor, shared staged tensor)`` for A, B1, B2, SFA, SFB1, SFB2, in that
    order. Global tiles are (rows, bytes of a k-block) and indexed ``[(None, tile, k-block)]``, shared
    stages ``[(None, stage)]``; A's rows follow the CTA's M tile, the others' its N tile. Both Hopper twins
    load through it.
    """
    out = []
    for i, (atom, g, s) in enumerate(operands):
        rows = TILE_M if i % 3 == 0 else bn
        width = KB_BYTES if i < 3 else SF_BYTES
        tiles = cute.local_tile(g, (rows, width), (None, None))
        dst, src = cpasync.tma_partition(atom, 0, cute.make_layout(1), cute.group_modes(s, 0, 2),
                                         cute.group_modes(tiles, 0, 2))
        out.append((atom, src, dst, m_tile if i % 3 == 0 else n_tile))
    return tuple(out)


@cute.jit
def tma_atoms(tensors, pa: cute.Layout, pb: cute.Layout, sa: cute.Layout, sb: cute.Layout, bn: cutlass.Constexpr):
    """TMA load atoms and their global views for A, B1, B2, SFA, SFB1, SFB2 (in that order).

    ``pa``/``pb``/``sa``/``sb``: the staged shared-memory layouts of packed A, packed B, A's scales and
    B's scales; one stage of each is the box. Both Hopper twins build their loads here.
    """
    g2s = cpasync.CopyBulkTensorTileG2SOp()
    out = []
    for i, t in enumerate(tensors):
        layout = (pa, pb, pb, sa, sb, sb)[i]
        rows = TILE_M if i % 3 == 0 else bn
        width = KB_BYTES if i < 3 else SF_BYTES
        out.append(cpasync.make_tiled_tma_atom(g2s, t, cute.slice_(layout, (None, None, 0)), (rows, width)))
    return tuple(out)


@cute.jit
def with_runtime_rows(t: cute.Tensor, rows) -> cute.Tensor:
    """Row-major ``t`` (rows, bytes) with its row count ``rows`` as a run-time ``Int32``. A static extent of 1 is
    folded away, so a one-row operand's TMA copies would lose their row coordinate (a 1-d copy against a 2-d tensor
    map: the GPU faults, the emulator refuses it); a run-time extent keeps it."""
    width = cute.size(t, mode=[1])
    return cute.make_tensor(t.iterator, cute.make_layout((Int32(rows), width), stride=(width, 1)))


@cute.jit
def gate_epilogue(thr_mma, acc1: cute.Tensor, acc2: cute.Tensor, mC: cute.Tensor, m_tile, n_tile,
                  bn: cutlass.Constexpr):
    """``silu(acc1) * acc2`` in FP32, FP16 out, stored from the registers, predicated on M and N (both twins)."""
    shape_c = (cute.size(mC, mode=[0]), cute.size(mC, mode=[1]))
    gC = cute.local_tile(mC, (TILE_M, bn), (m_tile, n_tile))
    cC = cute.local_tile(cute.make_identity_tensor(shape_c), (TILE_M, bn), (m_tile, n_tile))
    tCgC = thr_mma.partition_C(gC)
    tCcC = thr_mma.partition_C(cC)
    for i in cutlass.range(cute.size(acc1), unroll_full=True):
        if cute.elem_less(tCcC[i], shape_c):
            x = acc1[i]
            gate = x / (Float32(1.0) + cute.math.exp(-x, fastmath=True))
            tCgC[i] = (gate * acc2[i]).to(Float16)


# --------------------------------------------------------------------------------------
# The kernel
# --------------------------------------------------------------------------------------


@cute.kernel
def dual_kernel(
    tma_a: cute.CopyAtom, mA: cute.Tensor, tma_b1: cute.CopyAtom, mB1: cute.Tensor,
    tma_b2: cute.CopyAtom, mB2: cute.Tensor, tma_sa: cute.CopyAtom, mSA: cute.Tensor,
    tma_sb1: cute.CopyAtom, mSB1: cute.Tensor, tma_sb2: cute.CopyAtom, mSB2: cute.Tensor,
    mC: cute.Tensor, tiled_mma: cute.TiledMma,
    pa_layout: cute.Layout, pb_layout: cute.Layout, sa_layout: cute.Layout, sb_layout: cute.Layout,
    bfa_layout: cute.ComposedLayout, bfb_layout: cute.ComposedLayout,
    k_blocks: Int32, cfg: cutlass.Constexpr,
):
    BN = cfg.tile_n
    stages = cfg.stages
    tidx, _, _ = cute.arch.thread_idx()
    warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
    wg = warp // 4
    m_tile, n_tile, _ = cute.arch.block_idx()

    smem = SmemAllocator()
    pA = smem.allocate_tensor(Uint8, pa_layout, byte_alignment=128)
    pB1 = smem.allocate_tensor(Uint8, pb_layout, byte_alignment=128)
    pB2 = smem.allocate_tensor(Uint8, pb_layout, byte_alignment=128)
    sSA = smem.allocate_tensor(Uint8, sa_layout, byte_alignment=128)
    sSB1 = smem.allocate_tensor(Uint8, sb_layout, byte_alignment=128)
    sSB2 = smem.allocate_tensor(Uint8, sb_layout, byte_alignment=128)
    bA = smem.allocate_tensor(BFloat16, bfa_layout.outer, byte_alignment=1024, swizzle=bfa_layout.inner)
    bB1 = smem.allocate_tensor(BFloat16, bfb_layout.outer, byte_alignment=1024, swizzle=bfb_layout.inner)
    bB2 = smem.allocate_tensor(BFloat16, bfb_layout.outer, byte_alignment=1024, swizzle=bfb_layout.inner)
    full = smem.allocate_array(Int64, stages, byte_alignment=8)
    empty = smem.allocate_array(Int64, stages, byte_alignment=8)

    if warp == 0:
        for atom in (tma_a, tma_b1, tma_b2, tma_sa, tma_sb1, tma_sb2):
            cpasync.prefetch_descriptor(atom)
        with cute.arch.elect_one():
            for s in cutlass.range_constexpr(stages):
                cute.arch.mbarrier_init(full + s, 1)
                cute.arch.mbarrier_init(empty + s, CONSUMER_THREADS // 32)
            cute.arch.mbarrier_init_fence()
    cute.arch.sync_threads()

    copies = tma_copies(((tma_a, mA, pA), (tma_b1, mB1, pB1), (tma_b2, mB2, pB2), (tma_sa, mSA, sSA),
                         (tma_sb1, mSB1, sSB1), (tma_sb2, mSB2, sSB2)), BN, m_tile, n_tile)
    stage_bytes = (TILE_M + 2 * BN) * (KB_BYTES + SF_BYTES)

    if wg == 0:
        # ============================================================ producer
        cute.arch.warpgroup_reg_dealloc(PRODUCER_REGS)
        if warp == 0:
            state = DevicePipelineState.producer(stages)
            for kb in cutlass.range(k_blocks, unroll=1):
                cute.arch.mbarrier_wait(empty + state.index, state.phase)
                with cute.arch.elect_one():
                    cute.arch.mbarrier_arrive_and_expect_tx(full + state.index, stage_bytes)
                for atom, src, dst, tile in copies:
                    cute.copy(atom, src[(None, tile, kb)], dst[(None, state.index)], tma_bar_ptr=full + state.index)
                state.advance()
    else:
        # ============================================================ consumers
        cute.arch.warpgroup_reg_alloc(CONSUMER_REGS)
        ctid = tidx - 128
        thr_mma = tiled_mma.get_slice(ctid)
        tCrA = tiled_mma.make_fragment_A(thr_mma.partition_A(bA))
        tCrB1 = tiled_mma.make_fragment_B(thr_mma.partition_B(bB1))
        tCrB2 = tiled_mma.make_fragment_B(thr_mma.partition_B(bB2))
        acc1 = cute.make_rmem_tensor(tiled_mma.partition_shape_C((TILE_M, BN)), Float32)
        acc2 = cute.make_rmem_tensor(tiled_mma.partition_shape_C((TILE_M, BN)), Float32)
        acc1.fill(0.0)
        acc2.fill(0.0)
        tiled_mma.set(warpgroup.Field.ACCUMULATE, True)
        k_steps = cute.size(tCrA, mode=[2])

        read = DevicePipelineState.consumer(stages)
        for kb in cutlass.range(k_blocks, unroll=1):
            cute.arch.mbarrier_wait(full + read.index, read.phase)
            for sl in cutlass.range_constexpr(SLICES):
                dequant_slice(pA, sSA, bA, TILE_M, read.index, sl, ctid)
                dequant_slice(pB1, sSB1, bB1, BN, read.index, sl, ctid)
                dequant_slice(pB2, sSB2, bB2, BN, read.index, sl, ctid)
                # generic-proxy stores must be visible to wgmma (async proxy) reads of shared memory
                cute.arch.fence_proxy("async.shared", space="cta")
                cute.arch.barrier(barrier_id=CONSUMER_BARRIER, number_of_threads=CONSUMER_THREADS)
                warpgroup.fence()
                for ks in cutlass.range_constexpr(k_steps):
                    cute.gemm(tiled_mma, acc1, tCrA[(None, None, ks, 0)], tCrB1[(None, None, ks, 0)], acc1)
                    cute.gemm(tiled_mma, acc2, tCrA[(None, None, ks, 0)], tCrB2[(None, None, ks, 0)], acc2)
                warpgroup.commit_group()
                warpgroup.wait_group(0)
                # every wgmma of both warpgroups has read the slice before anyone overwrites it
                cute.arch.barrier(barrier_id=CONSUMER_BARRIER, number_of_threads=CONSUMER_THREADS)
            if cute.arch.lane_idx() == 0:
                cute.arch.mbarrier_arrive(empty + read.index)
            read.advance()

        # ---- epilogue: the gate in FP32, FP16 out, predicated stores straight from the registers
        gate_epilogue(thr_mma, acc1, acc2, mC, m_tile, n_tile, BN)


# --------------------------------------------------------------------------------------
# Host side
# --------------------------------------------------------------------------------------


@cute.jit
def launch_dual(a: cute.Tensor, b1: cute.Tensor, b2: cute.Tensor, sfa: cute.Tensor, sfb1: cute.Tensor,
                sfb2: cute.Tensor, c: cute.Tensor, stream: cuda.CUstream, cfg: cutlass.Constexpr):
    """Views, TMA descriptors and the launch of C = silu(A B1^T) * (A B2^T).

    ``a`` (M, K/2), ``b1``/``b2`` (N, K/2): packed FP4 bytes (uint8), K-major;
    ``sfa`` (M, K/16), ``sfb1``/``sfb2`` (N, K/16): plain e4m3 scales as bytes; ``c`` (M, N) FP16.
    """
    BN = cfg.tile_n
    S = cfg.stages
    k_major = utils.LayoutEnum.ROW_MAJOR.sm90_mma_major_mode()
    tiled_mma = sm90_utils.make_trivial_tiled_mma(BFloat16, BFloat16, k_major, k_major, Float32, (2, 1, 1),
                                                  tiler_mn=(WG_ROWS, BN))
    tile = (TILE_M, BN, SLICE_K)
    bfa = sm90_utils.make_smem_layout_a(utils.LayoutEnum.ROW_MAJOR, tile, BFloat16, 1)
    bfb = sm90_utils.make_smem_layout_b(utils.LayoutEnum.ROW_MAJOR, tile, BFloat16, 1)
    pa = cute.make_layout((TILE_M, KB_BYTES, S), stride=(KB_BYTES, 1, TILE_M * KB_BYTES))
    pb = cute.make_layout((BN, KB_BYTES, S), stride=(KB_BYTES, 1, BN * KB_BYTES))
    sa = cute.make_layout((TILE_M, SF_BYTES, S), stride=(SF_BYTES, 1, TILE_M * SF_BYTES))
    sb = cute.make_layout((BN, SF_BYTES, S), stride=(SF_BYTES, 1, BN * SF_BYTES))
    (tma_a, tA), (tma_b1, tB1), (tma_b2, tB2), (tma_sa, tSA), (tma_sb1, tSB1), (tma_sb2, tSB2) = tma_atoms(
        (a, b1, b2, sfa, sfb1, sfb2), pa, pb, sa, sb, BN)
    m = cute.size(c, mode=[0])
    n = cute.size(c, mode=[1])
    k_blocks = cute.size(a, mode=[1]) // KB_BYTES
    dual_kernel(tma_a, tA, tma_b1, tB1, tma_b2, tB2, tma_sa, tSA, tma_sb1, tSB1, tma_sb2, tSB2, c, tiled_mma,
                pa, pb, sa, sb, bfa, bfb, k_blocks, cfg).launch(
        grid=((m + TILE_M - 1) // TILE_M, (n + BN - 1) // BN, 1), block=(384, 1, 1), stream=stream)


@functools.lru_cache(maxsize=None)
def dual_host(cfg: DualSm90Config):
    """The ``@cute.jit`` host function of ``cfg`` (shapes are static: one compile per problem size)."""

    @cute.jit
    def dual_gemm_sm90_host(a: cute.Tensor, b1: cute.Tensor, b2: cute.Tensor, sfa: cute.Tensor, sfb1: cute.Tensor,
                            sfb2: cute.Tensor, c: cute.Tensor, stream: cuda.CUstream):
        launch_dual(a, b1, b2, sfa, sfb1, sfb2, c, stream, cfg)

    return dual_gemm_sm90_host


def pointer_views(m: int, n: int, k: int, pa, pb1, pb2, psfa, psfb1, psfb2, out) -> tuple:
    """Inside a host function being traced: the seven 2-D views :func:`operands_2d` makes in torch, rebuilt from the
    six inputs' bare pointers and ``out`` (an (M, N, 1) tensor) for an M x N x K problem (packed rows; row-major)."""
    kb, ks = k // 2, k // fp4.SF_VEC
    return (cute.make_tensor(pa, cute.make_layout((m, kb), stride=(kb, 1))),
            cute.make_tensor(pb1, cute.make_layout((n, kb), stride=(kb, 1))),
            cute.make_tensor(pb2, cute.make_layout((n, kb), stride=(kb, 1))),
            cute.make_tensor(psfa, cute.make_layout((m, ks), stride=(ks, 1))),
            cute.make_tensor(psfb1, cute.make_layout((n, ks), stride=(ks, 1))),
            cute.make_tensor(psfb2, cute.make_layout((n, ks), stride=(ks, 1))),
            cute.make_tensor(out.iterator, cute.make_layout((m, n), stride=(n, 1))))


@functools.lru_cache(maxsize=None)
def pointer_host(launch, cfg, m: int, n: int, k: int, workspace: bool = False):
    """A host function for a public call's plan: the six inputs as bare global pointers (16-byte aligned) and ``out``
    as the (M, N, 1) tensor it is, for an M x N x K problem fixed at compile time; it rebuilds the 2-D views
    :func:`operands_2d` makes in torch and calls ``launch`` (a twin's ``@cute.jit`` launch function, arguments
    ``(a, b1, b2, sfa, sfb1, sfb2, c, stream, cfg)``). ``workspace``: one more pointer after the six, an (M, K) FP16
    row-major workspace passed to ``launch`` before ``c`` (the A16 twin's converted A).

    The layouts of every operand follow from M, N and K (the call's checks require packed rows), so a call passes
    ``t.data_ptr()`` (a tenth of a microsecond) instead of seven torch views (microseconds each). ``out`` stays a
    tensor: TVM-FFI takes the stream to launch on from a tensor's device. The kernel is the one the tensor-taking
    host function launches (its PTX is identical).
    """
    def views(pa, pb1, pb2, psfa, psfb1, psfb2, out):
        return pointer_views(m, n, k, pa, pb1, pb2, psfa, psfb1, psfb2, out)

    if not workspace:
        @cute.jit
        def dual_gemm_sm90_pointers(pa: cute.Pointer, pb1: cute.Pointer, pb2: cute.Pointer, psfa: cute.Pointer,
                                    psfb1: cute.Pointer, psfb2: cute.Pointer, out: cute.Tensor, stream: cuda.CUstream):
            launch(*views(pa, pb1, pb2, psfa, psfb1, psfb2, out), stream, cfg)

        return dual_gemm_sm90_pointers

    @cute.jit
    def dual_gemm_sm90_pointers_ws(pa: cute.Pointer, pb1: cute.Pointer, pb2: cute.Pointer, psfa: cute.Pointer,
                                   psfb1: cute.Pointer, psfb2: cute.Pointer, pws: cute.Pointer, out: cute.Tensor,
                                   stream: cuda.CUstream):
        ops = views(pa, pb1, pb2, psfa, psfb1, psfb2, out)
        ws = cute.make_tensor(pws, cute.make_layout((m, k), stride=(k, 1)))
        launch(*ops[:6], ws, ops[6], stream, cfg)

    return dual_gemm_sm90_pointers_ws


def compile_with_pointers(target: str, launch, cfg, m: int, n: int, k: int, out_stride: tuple = None,
                          workspace: bool = False):
    """Compile :func:`pointer_host` through TVM-FFI (package ``apache-tvm-ffi``) without a GPU. Call the result as
    ``fn(a.data_ptr(), b1.data_ptr(), b2.data_ptr(), sfa.data_ptr(), sfb1.data_ptr(), sfb2.data_ptr(), out)``
    (``workspace``: the (M, K) FP16 workspace's pointer before ``out``): it launches on torch's current stream.
    ``out_stride``: the strides of the (M, N, 1) outputs it will be called with (default compact, ``(N, 1, 1)``).
    The caller has checked ``target`` and the sizes."""
    from cutlass.cute.runtime import make_fake_tensor, make_ptr

    from ..compile import compile_for, fake_stream

    out_stride = tuple(out_stride) if out_stride is not None else (n, 1, 1)
    if len(out_stride) != 3 or any(not isinstance(s, int) or isinstance(s, bool) for s in out_stride):
        raise ValueError(f"out_stride must be three ints (the (M, N, 1) output's strides); got {out_stride!r}")
    ptr = make_ptr(Uint8, 0, cute.AddressSpace.gmem, assumed_align=16)
    ws = [make_ptr(Float16, 0, cute.AddressSpace.gmem, assumed_align=16)] if workspace else []
    out = make_fake_tensor(Float16, (m, n, 1), out_stride, assumed_align=16)
    return compile_for(target, pointer_host(launch, cfg, m, n, k, workspace), *[ptr] * 6, *ws, out,
                       fake_stream(env=True), tvm_ffi=True)


def check_sm90_target(target: str) -> str:
    """Both Hopper twins compile for sm_90a only (wgmma, setmaxnreg)."""
    from ..compile import check_target

    check_target(target)
    if target != "sm_90a":
        raise ValueError(f"the Hopper dual GEMM needs target sm_90a (wgmma, setmaxnreg); got {target!r}")
    return target


def fake_operands(m: int, n: int, k: int) -> list:
    """Compile-time stand-ins for both twins' arguments: packed bytes, scale bytes (row-major), FP16 C."""
    from ..compile import fake_tensor

    row = (1, 0)
    return [fake_tensor(Uint8, (m, k // 2), stride_order=row),
            fake_tensor(Uint8, (n, k // 2), stride_order=row), fake_tensor(Uint8, (n, k // 2), stride_order=row),
            fake_tensor(Uint8, (m, k // fp4.SF_VEC), stride_order=row),
            fake_tensor(Uint8, (n, k // fp4.SF_VEC), stride_order=row),
            fake_tensor(Uint8, (n, k // fp4.SF_VEC), stride_order=row),
            fake_tensor(Float16, (m, n), stride_order=row)]


def operands_2d(a, b1, b2, sfa, sfb1, sfb2, out) -> list:
    """Both twins' kernel arguments: packed and scale bytes as uint8 (rows, bytes), ``out`` as (M, N)."""
    return [operand_2d(i, t) for i, t in enumerate((a, b1, b2, sfa, sfb1, sfb2, out))]


def operand_2d(i: int, t):
    """Argument ``i`` of :func:`operands_2d` (0-2 packed FP4, 3-5 scales, 6 out) as its kernel operand."""
    import torch

    if i < 3:
        return fp4.as_bytes(t)[..., 0]
    return (t.view(torch.uint8) if i < 6 else t)[..., 0]


def check_devices(a, b1, b2, sfa, sfb1, sfb2, out=None):
    """Every tensor on a cuda device (after :func:`check_twin_arguments` and the tier check)."""
    for name, t in (("a", a), ("b1", b1), ("b2", b2), ("sfa", sfa), ("sfb1", sfb1), ("sfb2", sfb2), ("out", out)):
        if t is not None and t.device.type != "cuda":
            raise ValueError(f"{name} must be on a cuda device; got {t.device}")


def compile_dual(target: str, cfg: DualSm90Config | None, m: int, n: int, k: int):
    """Compile the Hopper twin of ``cfg`` (None: the default :class:`DualSm90Config`) for an M x N x K problem without
    a GPU (static shapes); returns the compiled function."""
    from ..compile import compile_for, fake_stream

    check_sm90_target(target)
    m, n, k = check_gated_sizes(m, n, k)  # N a multiple of 8 too, before the DSL sees it
    cfg = cfg or DualSm90Config()
    if not isinstance(cfg, DualSm90Config):
        raise TypeError(f"cfg must be a DualSm90Config; got {type(cfg).__name__}")
    return compile_for(target, dual_host(cfg), *fake_operands(m, n, k), fake_stream())


def check_twin_arguments(a, b1, b2, sfa, sfb1, sfb2, out=None) -> tuple:
    """Both Hopper twins' checks (before anything compiles or launches); returns ``(M, N, K)``."""
    import torch

    from ..checks import check_tensor

    m, n, k, l = fp4.check_operands(a, b1, b2, sfa, sfb1, sfb2)
    if l != 1:
        raise ValueError(f"L must be 1 (the kernel's batch); got L={l}")
    if out is not None:
        check_tensor("out", out, dtypes=(torch.float16,), ndim=3, contiguous=False, device=None)
        if tuple(out.shape) != (m, n, 1):
            raise ValueError(f"out must have shape {(m, n, 1)}; got {tuple(out.shape)}")
        if out[..., 0].stride(1) != 1:
            raise ValueError(f"out must be N-major (stride 1 along N); got strides {out.stride()}")
    if n % 8:
        raise ValueError(f"N must be a multiple of 8 (16-byte rows of the FP16 output); got N={n}")
    return m, n, k


def gated_dual_gemm_sm90(a, b1, b2, sfa, sfb1, sfb2, out=None, cfg: DualSm90Config | None = None):
    """``silu(A B1^T) * (A B2^T)`` in FP16 on an H100/H200 from NVFP4 operands (GPU MODE's shapes, L = 1).

    ``a`` (M, K/2, 1), ``b1``/``b2`` (N, K/2, 1): packed FP4 (uint8 or ``float4_e2m1fn_x2``);
    ``sfa`` (M, K/16, 1), ``sfb1``/``sfb2`` (N, K/16, 1): plain e4m3 scales; ``out`` (M, N, 1)
    FP16 or None. Returns ``out``. Checks every argument before anything compiles or launches.
    """
    import torch

    from ..compile import launcher
    from ..tiers import require_tier

    m, n, k = check_twin_arguments(a, b1, b2, sfa, sfb1, sfb2, out)
    cfg = cfg or DualSm90Config()
    if not isinstance(cfg, DualSm90Config):
        raise TypeError(f"cfg must be a DualSm90Config; got {type(cfg).__name__}")
    require_tier("sm90", "gemmlab.kernels.dual_gemm_sm90.gated_dual_gemm_sm90")
    check_devices(a, b1, b2, sfa, sfb1, sfb2)
    if out is None:
        out = torch.empty((m, n, 1), dtype=torch.float16, device=a.device)
    launcher(dual_host(cfg), *operands_2d(a, b1, b2, sfa, sfb1, sfb2, out))()
    return out
