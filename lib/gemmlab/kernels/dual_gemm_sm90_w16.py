"""Chapter 11 on Hopper, the W16 route: the weights converted to FP16 inside the call, then chapter 07's GEMM gated.

What it teaches
    The A16 twin (:mod:`gemmlab.kernels.dual_gemm_sm90_a16`) converts each weight element once per 128-row tile of C,
    in a converter warpgroup beside the tensor cores. At large M that is ``M / 128`` conversions of every weight
    element, and the converter, not the tensor cores, sets the pace. This route converts every weight element exactly
    once per call and spends nothing on conversion inside the GEMM:

    * **A**: the A16 twin's pre-pass (:func:`~gemmlab.kernels.dual_gemm_sm90_a16.launch_prepass`), NVFP4 A to an
      (M, K) FP16 workspace.
    * **The weights**: :func:`weights_kernel`, the same streaming conversion on B1 and B2 into one (2 N, K) FP16
      workspace ``W`` whose rows interleave the two in blocks of ``h = tile_n / 2``: rows ``[2 h j, 2 h j + h)`` are B1's
      rows ``[h j, h (j + 1))`` and the next ``h`` rows B2's. Every e2m1 x e4m3 product is exact in FP16
      (:mod:`gemmlab.fp4_dequant`), so ``W`` holds the NVFP4 values exactly.
    * **The GEMM**: chapter 07's persistent kernel (:mod:`gemmlab.kernels.gemm_sm90`) on ``A16 @ W^T`` with its
      ``gated`` epilogue: a ``tile_n``-wide tile of ``W``'s rows is one block of B1 then the same block of B2, so a
      thread's accumulator holds ``A B1^T`` in the tile's first ``h`` columns and ``A B2^T`` in the next ``h``, and the
      epilogue stores ``silu(first) * second`` (FP32, then FP16), an ``h``-wide tile of C, through its TMA store.
      Clusters, TMA multicast and the grouped raster come with it.

    Nothing stays between calls: both workspaces come from torch's caching allocator per call (the weights stay FP4 in
    memory; a BF16 copy of them would be 3.6 times the bytes).

The price: the weight pass reads ``N K`` packed bytes and ``N K / 8`` scale bytes of B1 and B2 and writes ``4 N K``
bytes of FP16 (45 us for 4096 x 7168 weights at an H100's datasheet 3.35 TB/s; measured 56.3 us, 2.67 TB/s, and 42.5
us on an H200: ``results/<device>/dual_gemm_w16_parts.json``), and the GEMM then streams ``W`` (``4 N K`` bytes)
from HBM once per wave of panels. So the route wins where the A16 twin's conversions cost more than the passes: at
large M (on the wide weights measured, from 768 to 1536 rows on, by shape and GPU) and on narrow weights where the A16
twin's grid is one thin wave (256 x 1024 x 7168: 41.4 against 54.2 us on the H100). The public call decides by the
models (:func:`~gemmlab.family.heuristic_gated.choose_sm90`; up to 1024 rows the swap twin's too). Measured apart, the route's GEMM (with the launch
gaps) runs within 1 to 4 % of cuBLAS's BF16 GEMM on the same shape: the passes are its whole cost over the BF16 path.
"""
from __future__ import annotations

import functools

import cutlass
import cutlass.cute as cute
import cuda.bindings.driver as cuda
from cutlass import Float16, Int32, Int64, Uint8

from ..family.configs import W16Config
from ..family.problem import check_gated_sizes
from .. import nvfp4 as fp4
from ..ldst import st_global_v4
from .dual_gemm_sm90 import check_devices, check_sm90_target, operands_2d, pointer_views
from .dual_gemm_sm90_a16 import PREPASS_THREADS, PREPASS_UNITS, convert_loaded, launch_prepass, load_units

# --------------------------------------------------------------------------------------
# The weight pass: B1, B2 -> one FP16 W, rows interleaved in blocks of h
# --------------------------------------------------------------------------------------


def w_row(row: int, which: int, h: int) -> int:
    """Row of ``W`` that row ``row`` of B1 (``which`` 0) or B2 (``which`` 1) lands in: blocks of ``h`` rows, B1's
    block ``j`` then B2's block ``j`` (the host-side statement of what :func:`weights_kernel` computes)."""
    return (row // h * 2 + which) * h + row % h


@cute.kernel
def weights_kernel(b1: cute.Tensor, sfb1: cute.Tensor, b2: cute.Tensor, sfb2: cute.Tensor, w: cute.Tensor,
                   units: cutlass.Constexpr, per_row: cutlass.Constexpr, h: cutlass.Constexpr):
    """Unit ``u`` (8 values) of B1 (grid y 0) or B2 (grid y 1): packed word ``u``, scale byte ``u // 2``, as the A
    pre-pass; its FP16 chunk goes to row :func:`w_row` of ``W`` (``per_row`` = K / 8 units a row), same column.
    Thread ``i`` of CTA ``b`` converts units ``b 256 U + i + 256 j``, ``j < U``: all loads first."""
    tidx, _, _ = cute.arch.thread_idx()
    bidx, which, _ = cute.arch.block_idx()
    first = bidx * (PREPASS_THREADS * PREPASS_UNITS) + tidx
    pb = b1.iterator
    ps = sfb1.iterator
    if which == 1:
        pb = b2.iterator
        ps = sfb2.iterator
    po = cute.recast_ptr(w.iterator, dtype=Uint8)
    for u, ok, x, sw in load_units(pb, ps, first, units):
        row = u // per_row
        out_row = (row // h * 2 + which) * h + row % h
        st_global_v4(po + (Int64(out_row) * per_row + (u - row * per_row)) * 16, *convert_loaded(u, x, sw), pred=ok)


@cute.jit
def launch_weights(b1: cute.Tensor, sfb1: cute.Tensor, b2: cute.Tensor, sfb2: cute.Tensor, w: cute.Tensor,
                   stream: cuda.CUstream, h: cutlass.Constexpr):
    """``b1``/``b2`` (N, K/2) packed bytes, ``sfb1``/``sfb2`` (N, K/16) scale bytes, ``w`` (2 N, K) FP16: row-major."""
    n = cute.size(b1, mode=[0])
    k = cute.size(b1, mode=[1]) * 2
    check_whole_blocks(n, h)  # static shapes: while tracing (a partial block of B2 would land past W's 2 N rows)
    units = n * k // 8
    per_cta = PREPASS_THREADS * PREPASS_UNITS
    weights_kernel(b1, sfb1, b2, sfb2, w, units, k // 8, h).launch(
        grid=((units + per_cta - 1) // per_cta, 2, 1), block=(PREPASS_THREADS, 1, 1), stream=stream)


@cute.jit
def launch_w16(a: cute.Tensor, b1: cute.Tensor, b2: cute.Tensor, sfa: cute.Tensor, sfb1: cute.Tensor,
               sfb2: cute.Tensor, a16: cute.Tensor, w: cute.Tensor, c: cute.Tensor, max_clusters: Int32,
               stream: cuda.CUstream, cfg: cutlass.Constexpr):
    """The three launches on one stream: A's pre-pass into ``a16`` (M, K), the weight pass into ``w`` (2 N, K), then
    the gated GEMM ``c = silu(a16 B1^T) * (a16 B2^T)`` on a persistent grid of at most ``max_clusters`` clusters."""
    from .gemm_sm90 import launch_gemm

    launch_prepass(a, sfa, a16, stream)
    launch_weights(b1, sfb1, b2, sfb2, w, stream, cfg.gemm.out_tile_n)
    k = cute.size(w, mode=[1])
    w_kn = cute.make_tensor(w.iterator, cute.make_layout((k, cute.size(w, mode=[0])), stride=(1, k)))  # K x 2N view
    launch_gemm(a16, w_kn, c, None, None, Int32(1), Int32(0), max_clusters, stream, cfg.gemm)


# --------------------------------------------------------------------------------------
# Host side
# --------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def w16_host(cfg: W16Config, m: int, n: int, k: int):
    """A host function for the public call's plan: the six inputs and the two FP16 workspaces (A: (M, K); W: (2 N, K))
    as bare global pointers, ``out`` the (M, N, 1) tensor, then ``max_clusters`` (the GPU's SMs over the cluster size)
    and the stream; M, N, K fixed at compile time (the layouts follow from them, as
    :func:`~gemmlab.kernels.dual_gemm_sm90.pointer_host`'s)."""
    @cute.jit
    def dual_gemm_sm90_w16_pointers(pa: cute.Pointer, pb1: cute.Pointer, pb2: cute.Pointer, psfa: cute.Pointer,
                                    psfb1: cute.Pointer, psfb2: cute.Pointer, pa16: cute.Pointer, pw: cute.Pointer,
                                    out: cute.Tensor, max_clusters: Int32, stream: cuda.CUstream):
        ops = pointer_views(m, n, k, pa, pb1, pb2, psfa, psfb1, psfb2, out)
        launch_w16(*ops[:6], cute.make_tensor(pa16, cute.make_layout((m, k), stride=(k, 1))),
                   cute.make_tensor(pw, cute.make_layout((2 * n, k), stride=(k, 1))), ops[6], max_clusters, stream,
                   cfg)

    return dual_gemm_sm90_w16_pointers


@functools.lru_cache(maxsize=None)
def w16_tensor_host(cfg: W16Config):
    """The tensor-taking host function (static shapes): ``(a, b1, b2, sfa, sfb1, sfb2, a16, w, c, max_clusters,
    stream)``, :func:`~gemmlab.kernels.dual_gemm_sm90.operands_2d`'s operands with the two workspaces before ``c``
    (what the emulator runs; the plan calls :func:`w16_host`, whose kernels are the same)."""

    @cute.jit
    def dual_gemm_sm90_w16_host(a: cute.Tensor, b1: cute.Tensor, b2: cute.Tensor, sfa: cute.Tensor,
                                sfb1: cute.Tensor, sfb2: cute.Tensor, a16: cute.Tensor, w: cute.Tensor,
                                c: cute.Tensor, max_clusters: Int32, stream: cuda.CUstream):
        launch_w16(a, b1, b2, sfa, sfb1, sfb2, a16, w, c, max_clusters, stream, cfg)

    return dual_gemm_sm90_w16_host


def compile_w16(target: str, cfg: W16Config, m: int, n: int, k: int):
    """:func:`w16_tensor_host` compiled for an M x N x K problem without a GPU."""
    from ..compile import compile_for, fake_stream, fake_tensor
    from .dual_gemm_sm90 import fake_operands

    check_sm90_target(target)
    m, n, k = check_w16_sizes(cfg, m, n, k)
    ops = fake_operands(m, n, k)
    ws = (fake_tensor(Float16, (m, k), stride_order=(1, 0)), fake_tensor(Float16, (2 * n, k), stride_order=(1, 0)))
    return compile_for(target, w16_tensor_host(cfg), *ops[:6], *ws, ops[6], Int32(1), fake_stream())


@functools.lru_cache(maxsize=None)
def weights_host(h: int):
    """The weight pass alone for blocks of ``h`` rows (static shapes): :func:`launch_weights`."""

    @cute.jit
    def dual_gemm_sm90_w16_weights(b1: cute.Tensor, sfb1: cute.Tensor, b2: cute.Tensor, sfb2: cute.Tensor,
                                   w: cute.Tensor, stream: cuda.CUstream):
        launch_weights(b1, sfb1, b2, sfb2, w, stream, h)

    return dual_gemm_sm90_w16_weights


def compile_weights(target: str, n: int, k: int, h: int):
    """The weight pass alone compiled for N x K weights and blocks of ``h`` rows, without a GPU:
    ``(b1, sfb1, b2, sfb2, w, stream)``."""
    from ..checks import check_int
    from ..compile import compile_for, fake_stream, fake_tensor
    from .dual_gemm_sm90 import fake_operands

    check_sm90_target(target)
    _, n, k = check_gated_sizes(8, n, k)
    check_whole_blocks(n, check_int("h", h, lo=8, multiple_of=8))
    ops = fake_operands(8, n, k)
    return compile_for(target, weights_host(h), ops[1], ops[4], ops[2], ops[5],
                       fake_tensor(Float16, (2 * n, k), stride_order=(1, 0)), fake_stream())


def check_whole_blocks(n: int, h: int, what: str = "h") -> None:
    """A ``ValueError`` unless N is a whole number of ``h``-row blocks (``what`` names ``h`` in it): W interleaves B1
    and B2 in such blocks, and a partial block of B2 would land past W's 2 N rows."""
    if n % h:
        raise ValueError(f"N must be a multiple of {what} = {h} (whole blocks of B1 and B2 rows in W); got N={n}")


def check_w16_sizes(cfg: W16Config, m: int, n: int, k: int) -> tuple[int, int, int]:
    """The gated sizes' rules (:func:`~gemmlab.family.problem.check_gated_sizes`), and N a multiple of ``tile_n / 2``
    (whole interleaved blocks of W)."""
    m, n, k = check_gated_sizes(m, n, k)
    if not isinstance(cfg, W16Config):
        raise TypeError(f"cfg must be a W16Config; got {type(cfg).__name__}")
    check_whole_blocks(n, cfg.gemm.out_tile_n, "tile_n / 2")
    return m, n, k


def compile_w16_ptrs(target: str, cfg: W16Config, m: int, n: int, k: int, out_stride: tuple = None):
    """:func:`w16_host` compiled through TVM-FFI without a GPU. Call the result as ``fn(a, b1, b2, sfa, sfb1, sfb2,
    a16, w pointers, out, max_clusters)``: it launches on torch's current stream."""
    from cutlass.cute.runtime import make_fake_tensor, make_ptr

    from ..compile import compile_for, fake_stream

    check_sm90_target(target)
    m, n, k = check_w16_sizes(cfg, m, n, k)
    out_stride = tuple(out_stride) if out_stride is not None else (n, 1, 1)
    ptr = make_ptr(Uint8, 0, cute.AddressSpace.gmem, assumed_align=16)
    f16 = make_ptr(Float16, 0, cute.AddressSpace.gmem, assumed_align=16)
    out = make_fake_tensor(Float16, (m, n, 1), out_stride, assumed_align=16)
    return compile_for(target, w16_host(cfg, m, n, k), *[ptr] * 6, f16, f16, out, Int32(1), fake_stream(env=True),
                       tvm_ffi=True)


@functools.lru_cache(maxsize=64)
def _compiled_ptrs(cfg: W16Config, m: int, n: int, k: int, out_stride: tuple):
    """:func:`compile_w16_ptrs`, once per configuration, shape and output strides (for
    :func:`gated_dual_gemm_w16`; the public call's plans keep their own)."""
    return compile_w16_ptrs("sm_90a", cfg, m, n, k, out_stride)


def workspaces(m: int, n: int, k: int, device):
    """The route's two FP16 workspaces, ``(a16 (M, K), w (2 N, K))``, from torch's caching allocator."""
    import torch

    return (torch.empty((m, k), dtype=torch.float16, device=device),
            torch.empty((2 * n, k), dtype=torch.float16, device=device))


def gated_dual_gemm_w16(a, b1, b2, sfa, sfb1, sfb2, out=None, cfg: W16Config | None = None):
    """``silu(A B1^T) * (A B2^T)`` in FP16 on an H100/H200 by the W16 route (arguments as the simple twin's; ``cfg``
    forced or the heuristic's :func:`~gemmlab.family.heuristic_gated.choose_w16`). Checks every argument before
    anything compiles or launches; allocates both workspaces per call. Returns ``out``."""
    import torch

    from .. import hardware
    from ..family.heuristic_gated import choose_w16
    from ..tiers import require_tier
    from .dual_gemm_sm90 import check_twin_arguments
    from .dual_gemm_sm90_pipelined import check_compact_out

    m, n, k = check_twin_arguments(a, b1, b2, sfa, sfb1, sfb2, out)
    check_compact_out(out, n)
    if cfg is not None:
        m, n, k = check_w16_sizes(cfg, m, n, k)  # a forced configuration's rules, before the machine's
    require_tier("sm90", "gemmlab.kernels.dual_gemm_sm90_w16.gated_dual_gemm_w16")
    check_devices(a, b1, b2, sfa, sfb1, sfb2, out)
    sms = hardware.sm_count(a.device)
    if cfg is None:  # the public call's model of this GPU (its SMs and HBM)
        from ..family.heuristic_sm90 import model_for

        cfg = choose_w16(m, n, k, sms, model_for(hardware.spec_of(a.device)))
    if out is None:
        out = torch.empty((m, n, 1), dtype=torch.float16, device=a.device)
    fn = _compiled_ptrs(cfg, m, n, k, tuple(out.stride()))
    a16, w = workspaces(m, n, k, a.device)
    ops = operands_2d(a, b1, b2, sfa, sfb1, sfb2, out)
    fn(*(t.data_ptr() for t in ops[:6]), a16.data_ptr(), w.data_ptr(), out, cfg.gemm.clusters_on(sms))
    return out
