"""Chapter 07: split-K, the FP32 partial sums and the kernel that adds them up.

What it teaches
    A GEMM whose output has fewer tiles than the GPU has SMs leaves SMs idle:
    M = 64, N = 2112 is 17 tiles of 128 x 64 for 132 SMs. Split-K cuts K into
    ``splits`` slices and makes every (tile, slice) pair a work unit, so
    17 x 7 = 119 units keep 119 SMs streaming the weight. Each unit writes
    the FP32 partial sum of its slice to a workspace of ``splits x M x N``
    floats; this module's kernel then adds the slices and converts to the
    output dtype.

    The cost is the workspace traffic (``4 * splits`` bytes written and read per
    output element, against ``2 * K`` bytes of inputs read per output row and
    column) and one more launch; the heuristic
    (:mod:`gemmlab.family.heuristic_sm90`) weighs it against the idle SMs.

The code, in the chapter modules' order
    * PTX wrappers: ``ld.global.v4.f32`` (four floats, 16 bytes) and
      ``cvt.rn.bf16x2.f32`` / ``cvt.rn.f16x2.f32`` (two floats into one packed
      32-bit word; the first operand lands in the upper half).
    * CPU model: :func:`reduce_model`, the same sum in torch.
    * The kernel: one thread per 8 output elements, a loop over the slices with
      two 16-byte loads each, one 16-byte store.
    * Host side: :func:`launch_reduce` (called from the GEMM's ``@cute.jit``
      host function, same stream, right after the GEMM) and
      :func:`compile_reduce` for compile-only cells.

Both tensors are row-major and packed, so slice ``s`` of the workspace and the
output share one flat index: element ``i`` of the output is the sum of
elements ``s * M * N + i``. N is a multiple of 8 (the GEMM's contract), so
M * N is too: every thread has eight whole elements.
"""
from __future__ import annotations

import functools

import cutlass
import cutlass.cute as cute
import cuda.bindings.driver as cuda
from cutlass import Float32, Int32

from .ldst import st_global_v4

THREADS = 256
VEC = 8  # output elements per thread: 8 x 2 bytes = one 16-byte store

# --------------------------------------------------------------------------------------
# PTX wrappers
# --------------------------------------------------------------------------------------


def ld_global_v4_f32(ptr):
    """``ld.global.v4.f32``: four floats from a 16-byte aligned global address."""
    return cute.arch.inline_ptx("ld.global.v4.f32 {{$w0}, {$w1}, {$w2}, {$w3}}, [{$r0}];",
                                write_only_types=[Float32] * 4, read_only_args=[ptr])


def cvt_pack(hi, lo, c_type):
    """``cvt.rn.{bf16,f16}x2.f32``: two floats rounded to nearest into one 32-bit word (``lo`` in bits 0-15)."""
    kind = "bf16x2" if c_type is cutlass.BFloat16 else "f16x2"
    return cute.arch.inline_ptx(f"cvt.rn.{kind}.f32 {{$w0}}, {{$r0}}, {{$r1}};",
                                write_only_types=[Int32], read_only_args=[Float32(hi), Float32(lo)])


# --------------------------------------------------------------------------------------
# CPU model
# --------------------------------------------------------------------------------------


def reduce_model(ws, out_dtype):
    """What the kernel computes: the FP32 sum over slices (dim 0), rounded once to ``out_dtype``."""
    return ws.float().sum(dim=0).to(out_dtype)


# --------------------------------------------------------------------------------------
# The kernel
# --------------------------------------------------------------------------------------


@cute.kernel
def reduce_kernel(ws: cute.Tensor, c: cute.Tensor, splits: Int32, plane: Int32, c_type: cutlass.Constexpr):
    """``c[i] = sum_s ws[s, i]`` for this thread's 8 elements; ``plane`` = M * N."""
    tid, _, _ = cute.arch.thread_idx()
    bid, _, _ = cute.arch.block_idx()
    v = bid * THREADS + tid
    if v * VEC < plane:
        acc = cute.make_rmem_tensor((VEC,), Float32)
        acc.fill(0.0)
        for s in cutlass.range(splits, unroll=1):
            base = ws.iterator + (s * plane + v * VEC)
            for half in cutlass.range_constexpr(2):
                x = ld_global_v4_f32(base + 4 * half)
                for j in cutlass.range_constexpr(4):
                    acc[4 * half + j] = acc[4 * half + j] + x[j]
        words = [cvt_pack(acc[2 * j + 1], acc[2 * j], c_type) for j in range(VEC // 2)]
        st_global_v4(c.iterator + v * VEC, *words)


# --------------------------------------------------------------------------------------
# Host side
# --------------------------------------------------------------------------------------


@cute.jit
def launch_reduce(ws: cute.Tensor, c: cute.Tensor, splits: Int32, stream: cuda.CUstream):
    """Launch :func:`reduce_kernel` for workspace ``ws`` (splits, M, N) FP32 into ``c`` (M, N)."""
    plane = cute.size(c)
    blocks = (plane // VEC + THREADS - 1) // THREADS
    reduce_kernel(ws, c, splits, plane, c.element_type).launch(grid=(blocks, 1, 1), block=(THREADS, 1, 1),
                                                               stream=stream)


@functools.lru_cache(maxsize=None)
def _reduce_host():
    @cute.jit
    def reduce_host(ws: cute.Tensor, c: cute.Tensor, splits: Int32, stream: cuda.CUstream):
        launch_reduce(ws, c, splits, stream)

    return reduce_host


def compile_reduce(target: str = "sm_90a", out_dtype: str = "bfloat16"):
    """Compile the reduction alone for ``target`` (no GPU needed); sizes are run-time values."""
    from .compile import check_target, compile_for, fake_stream, fake_tensor
    from .checks import check_choice

    check_target(target)
    check_choice("out_dtype", out_dtype, ("bfloat16", "float16"))
    ct = cutlass.BFloat16 if out_dtype == "bfloat16" else cutlass.Float16
    m, n, s = cute.sym_int(), cute.sym_int(divisibility=VEC), cute.sym_int()
    ws = fake_tensor(Float32, (s, m, n), stride_order=(2, 1, 0))
    c = fake_tensor(ct, (m, n), stride_order=(1, 0))
    return compile_for(target, _reduce_host(), ws, c, Int32(2), fake_stream())
