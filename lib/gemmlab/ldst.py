"""Chapter 01: inline PTX loads and stores, and a copy kernel at HBM speed.

What this teaches
-----------------
* How ``cute.arch.inline_ptx`` turns a PTX string into an ``asm`` statement:
  ``{$r0}`` read-only inputs, ``{$w0}`` write-only outputs, an optional
  predicate that becomes ``@p`` in front of the instruction. The operand's
  type picks the ``asm`` constraint: 32-bit integers ``"r"``, 64-bit ``"l"``,
  ``Float32`` ``"f"``; a global pointer travels as a 64-bit address (``"l"``)
  and a shared-memory pointer as a 32-bit shared-window address (``"r"``).
* ``ld``/``st`` on global and shared memory with one, two or four 32-bit words
  per instruction (``.u32``, ``.v2.u32``, ``.v4.u32``): one small named
  function per instruction, used by every later chapter's hand-written PTX.
* A device-to-device copy built from them. Each thread issues ``unroll``
  independent loads before its first store, so ``unroll x width x 4`` bytes
  per thread are in flight at once. On an H200 (``results/nvidia-h200/copy_ldst.json``)
  16 bytes a thread was enough: one 16-byte load (``unroll=1``, the default) or
  four 4-byte ones ran at 0.99 of torch's copy; 64 bytes (``v4``, ``unroll=4``)
  ran at 0.94, the slowest of the variants with 16 bytes or more in flight.

This is the first kernel chapter; it adds PTX to the course. Chapter 02 adds
the mbarrier, chapter 03 asynchronous copies that move data without passing
through registers at all.

Tail handling: every access is predicated on ``index < n`` (``@p ld`` /
``@p st``), so a copy may hold any whole number of access granules
(4, 8 or 16 bytes); the last CTA simply switches its extra lanes off.
"""
from __future__ import annotations

import functools

import cutlass
import cutlass.cute as cute
import cuda.bindings.driver as cuda
from cutlass import Int32

from .checks import check_choice, check_int, check_tensor

#: Threads per CTA of the copy kernels: 8 warps, enough CTAs per SM to hide latency.
THREADS = 256
#: Access widths in 32-bit words: ``ld.global.u32``, ``.v2.u32``, ``.v4.u32``.
WIDTHS = (1, 2, 4)
#: Loads each thread issues before its first store in the public ``copy``: with 16-byte loads, 1 was the
#: fastest measured (0.99 of torch's copy on an H200; 4 gave 0.94).
DEFAULT_UNROLL = 1
#: The copy kernels index words with 32-bit integers.
MAX_WORDS = 2**31 - 1


def _vec(prefix: str, n: int, first: int = 0) -> str:
    """PTX vector operand ``{{$w0}, {$w1}}`` (or a bare ``{$w0}`` when ``n == 1``)."""
    regs = ", ".join("{$%s%d}" % (prefix, first + i) for i in range(n))
    return "{" + regs + "}" if n > 1 else regs


# --- global memory ----------------------------------------------------------
# The pointer argument is a global-memory ``cute`` pointer (``tensor.iterator + i``);
# inline_ptx passes it as a 64-bit register (constraint "l"). ``pred`` (a
# Boolean, or None) guards the instruction: a lane whose predicate is false
# neither reads nor writes memory, and its load results are left undefined.

def ld_global_b32(ptr, pred=None):
    """``ld.global.u32``: one 32-bit word."""
    return cute.arch.inline_ptx("ld.global.u32 {$w0}, [{$r0}];",
                                write_only_types=[Int32], read_only_args=[ptr], predicate=pred)


def ld_global_volatile_b32(ptr, pred=None):
    """``ld.volatile.global.u32``: one 32-bit word that ``ptxas`` may not merge with another load of it."""
    return cute.arch.inline_ptx("ld.volatile.global.u32 {$w0}, [{$r0}];",
                                write_only_types=[Int32], read_only_args=[ptr], predicate=pred)


def ld_global_v2(ptr, pred=None):
    """``ld.global.v2.u32``: two words from an 8-byte aligned address."""
    return cute.arch.inline_ptx("ld.global.v2.u32 " + _vec("w", 2) + ", [{$r0}];",
                                write_only_types=[Int32] * 2, read_only_args=[ptr], predicate=pred)


def ld_global_v4(ptr, pred=None):
    """``ld.global.v4.u32``: four words (16 bytes) from a 16-byte aligned address."""
    return cute.arch.inline_ptx("ld.global.v4.u32 " + _vec("w", 4) + ", [{$r0}];",
                                write_only_types=[Int32] * 4, read_only_args=[ptr], predicate=pred)


def st_global_b32(ptr, a, pred=None):
    """``st.global.u32``: one 32-bit word."""
    cute.arch.inline_ptx("st.global.u32 [{$r0}], {$r1};", read_only_args=[ptr, a], predicate=pred)


def st_global_v2(ptr, a, b, pred=None):
    """``st.global.v2.u32``: two words to an 8-byte aligned address."""
    cute.arch.inline_ptx("st.global.v2.u32 [{$r0}], " + _vec("r", 2, 1) + ";",
                         read_only_args=[ptr, a, b], predicate=pred)


def st_global_v4(ptr, a, b, c, d, pred=None):
    """``st.global.v4.u32``: four words (16 bytes) to a 16-byte aligned address."""
    cute.arch.inline_ptx("st.global.v4.u32 [{$r0}], " + _vec("r", 4, 1) + ";",
                         read_only_args=[ptr, a, b, c, d], predicate=pred)


# --- shared memory ----------------------------------------------------------
# Same instructions in the .shared state space. A shared-memory pointer
# (from ``SmemAllocator``) is passed as a 32-bit address (constraint "r"):
# shared memory is a window of at most 228 KiB, so 32 bits address it.

def ld_shared_b32(ptr):
    """``ld.shared.u32``: one 32-bit word."""
    return cute.arch.inline_ptx("ld.shared.u32 {$w0}, [{$r0}];",
                                write_only_types=[Int32], read_only_args=[ptr])


def ld_shared_v2(ptr):
    """``ld.shared.v2.u32``: two words from an 8-byte aligned address."""
    return cute.arch.inline_ptx("ld.shared.v2.u32 " + _vec("w", 2) + ", [{$r0}];",
                                write_only_types=[Int32] * 2, read_only_args=[ptr])


def ld_shared_v4(ptr):
    """``ld.shared.v4.u32``: four words from a 16-byte aligned address."""
    return cute.arch.inline_ptx("ld.shared.v4.u32 " + _vec("w", 4) + ", [{$r0}];",
                                write_only_types=[Int32] * 4, read_only_args=[ptr])


def st_shared_b32(ptr, a):
    """``st.shared.u32``: one 32-bit word."""
    cute.arch.inline_ptx("st.shared.u32 [{$r0}], {$r1};", read_only_args=[ptr, a])


def st_shared_v2(ptr, a, b):
    """``st.shared.v2.u32``: two words to an 8-byte aligned address."""
    cute.arch.inline_ptx("st.shared.v2.u32 [{$r0}], " + _vec("r", 2, 1) + ";", read_only_args=[ptr, a, b])


def st_shared_v4(ptr, a, b, c, d):
    """``st.shared.v4.u32``: four words to a 16-byte aligned address."""
    cute.arch.inline_ptx("st.shared.v4.u32 [{$r0}], " + _vec("r", 4, 1) + ";", read_only_args=[ptr, a, b, c, d])


def ld_global_words(ptr, width: int, pred=None) -> tuple:
    """``width`` (1, 2 or 4) words with one instruction, always as a tuple."""
    if width == 1:
        return (ld_global_b32(ptr, pred),)
    if width == 2:
        return ld_global_v2(ptr, pred)
    return ld_global_v4(ptr, pred)


def st_global_words(ptr, words: tuple, pred=None) -> None:
    """Store a tuple of 1, 2 or 4 words with one instruction."""
    if len(words) == 1:
        st_global_b32(ptr, words[0], pred)
    elif len(words) == 2:
        st_global_v2(ptr, *words, pred=pred)
    else:
        st_global_v4(ptr, *words, pred=pred)


# --- what "volatile" does, and where it stops --------------------------------------

#: The loads :func:`twice_kernel` can read ``src[i]`` twice with.
TWICE_LOADS = (False, True, "volatile")


@cute.kernel
def twice_kernel(src: cute.Tensor, dst: cute.Tensor, use_ptx: cutlass.Constexpr):
    """dst[i] = src[i] + src[i], reading src[i] twice: with inline PTX or a plain DSL load.

    The DSL's own loads are ordinary LLVM loads: the compiler sees that both
    read the same address and keeps one. ``inline_ptx`` emits an ``asm`` with
    side effects (``asm volatile`` in CUDA C++): LLVM never merges, moves or
    deletes it, so the PTX keeps both ``ld.global.u32``. That guarantee ends at
    the PTX: ``ptxas`` sees two identical plain loads of one address and makes
    one ``LDG`` of them (chapter 01 shows the SASS). What forces a real second
    load is the load itself: ``ld.volatile`` (``use_ptx="volatile"``, kept as two
    ``LDG``), a ``.relaxed``/``.acquire`` load with a scope, or different addresses.
    """
    i, _, _ = cute.arch.thread_idx()
    if cutlass.const_expr(use_ptx == "volatile"):
        a = ld_global_volatile_b32(src.iterator + i)
        b = ld_global_volatile_b32(src.iterator + i)
    elif cutlass.const_expr(use_ptx):  # decided while tracing: different kernels
        a = ld_global_b32(src.iterator + i)
        b = ld_global_b32(src.iterator + i)
    else:
        a = src[i]
        b = src[i]
    dst[i] = a + b


@functools.lru_cache(maxsize=None)
def twice_host(use_ptx: bool):
    @cute.jit
    def host(src: cute.Tensor, dst: cute.Tensor, stream: cuda.CUstream):
        twice_kernel(src, dst, use_ptx).launch(grid=(1, 1, 1), block=(32, 1, 1), stream=stream)

    return host


def compile_twice(target: str, use_ptx):
    """Compile :func:`twice_kernel` for ``target``; count its ``ld.global`` lines (PTX) or ``LDG`` (SASS).

    ``use_ptx``: False (the DSL's loads), True (``ld.global.u32``) or ``"volatile"`` (``ld.volatile.global.u32``).
    """
    from .compile import check_target, compile_for, fake_stream, fake_tensor

    check_target(target)
    if use_ptx != "volatile":
        use_ptx = bool(use_ptx)
    return compile_for(target, twice_host(use_ptx), fake_tensor(Int32, (32,)), fake_tensor(Int32, (32,)),
                       fake_stream())


# --- the copy kernel ----------------------------------------------------------

@cute.kernel
def copy_kernel(src: cute.Tensor, dst: cute.Tensor, width: cutlass.Constexpr, unroll: cutlass.Constexpr):
    """Copy 32-bit words, ``width`` per access, ``unroll`` accesses per thread.

    A CTA owns ``THREADS * unroll`` consecutive vectors. At step ``j`` its
    threads touch vectors ``j*THREADS + tid``: neighbouring lanes read
    neighbouring 4/8/16-byte pieces, so a warp's access is one contiguous,
    fully coalesced 128/256/512-byte span.
    """
    tid, _, _ = cute.arch.thread_idx()
    bid, _, _ = cute.arch.block_idx()
    nvec = cute.size(src) // width  # static: the kernel is specialised on the size
    first = bid * (THREADS * unroll) + tid

    # All loads first: they are independent, so the memory system has
    # `unroll` requests of this thread in flight before anything waits.
    held = []
    for j in cutlass.range_constexpr(unroll):
        v = first + j * THREADS
        held.append(ld_global_words(src.iterator + v * width, width, pred=v < nvec))
    # Then the stores; each waits only for its own load.
    for j in cutlass.range_constexpr(unroll):
        v = first + j * THREADS
        st_global_words(dst.iterator + v * width, held[j], pred=v < nvec)


@functools.lru_cache(maxsize=None)
def copy_host(width: int, unroll: int):
    """The ``@cute.jit`` host function that launches ``copy_kernel`` for one configuration.

    ``width`` and ``unroll`` are baked in here (a closure) rather than passed
    as ``Constexpr`` arguments, so the compiled function's arguments are just
    (src, dst, stream).
    """

    @cute.jit
    def host(src: cute.Tensor, dst: cute.Tensor, stream: cuda.CUstream):
        per_cta = THREADS * width * unroll  # words one CTA moves
        grid = (cute.size(src) + per_cta - 1) // per_cta
        copy_kernel(src, dst, width, unroll).launch(grid=(grid, 1, 1), block=(THREADS, 1, 1), stream=stream)

    return host


def _check_config(width, unroll):
    check_choice("width", width, WIDTHS)
    check_int("unroll", unroll, lo=1, hi=16)


def compile_copy(target: str, width: int = 4, nwords: int = 1 << 20, unroll: int = DEFAULT_UNROLL):
    """Compile the copy of ``nwords`` 32-bit words for ``target`` without a GPU.

    Returns the compiled function; read its PTX with
    ``gemmlab.compile.ptx_opcodes(compiled, r"ld\\.global")``.
    """
    from .compile import check_target, compile_for, fake_stream, fake_tensor

    check_target(target)
    _check_config(width, unroll)
    check_int("nwords", nwords, lo=width, hi=MAX_WORDS, multiple_of=width)
    return compile_for(target, copy_host(width, unroll),
                       fake_tensor(Int32, (nwords,)), fake_tensor(Int32, (nwords,)), fake_stream())


def _as_words(t):
    """The bytes of contiguous ``t`` as a 1-D int32 tensor (a view, no copy)."""
    import torch

    return t.reshape(-1).view(torch.uint8).view(torch.int32)


def _check_pair(src, dst, width: int):
    granule = 4 * width
    # Every rule but the device first, so that each is checkable on any machine.
    check_tensor("src", src, device=None, align_bytes=16)
    check_tensor("dst", dst, device=None, align_bytes=16)
    if src.dtype != dst.dtype:
        raise TypeError(f"src and dst must have the same dtype; got {src.dtype} and {dst.dtype}")
    if src.numel() != dst.numel():
        raise ValueError(f"src and dst must hold the same number of elements; got {src.numel()} and {dst.numel()}")
    if src.device != dst.device:
        raise ValueError(f"src and dst must be on the same device; got {src.device} and {dst.device}")
    nbytes = src.numel() * src.element_size()
    if nbytes % granule:
        raise ValueError(f"src must hold a multiple of {granule} bytes for width={width} "
                         f"({width} x 4-byte words per access); got {nbytes} bytes")
    if nbytes // 4 > MAX_WORDS:
        raise ValueError(f"src must hold at most {MAX_WORDS} 32-bit words (32-bit indexing); got {nbytes // 4}")
    check_tensor("src", src, device="cuda")


def prepare_copy(src, dst, width: int = 4, unroll: int = DEFAULT_UNROLL):
    """Check the arguments, compile once, return ``run()`` that copies ``src`` into ``dst``."""
    from .compile import launcher
    from .tiers import require_tier

    _check_config(width, unroll)
    _check_pair(src, dst, width)
    require_tier("gpu", "gemmlab.ldst.copy")
    return launcher(copy_host(width, unroll), _as_words(src), _as_words(dst))


def copy(src, dst, width: int = 4, unroll: int = DEFAULT_UNROLL):
    """Copy ``src`` into ``dst`` (CUDA tensors) with ``width``-word PTX loads and stores.

    Any dtype; both contiguous, same dtype and element count, 16-byte aligned,
    and the byte size a multiple of ``4 * width``. Launches on torch's current
    stream and returns ``dst``.
    """
    prepare_copy(src, dst, width, unroll)()
    return dst


#: The configurations the notebook and the benchmark time: (width, unroll).
COPIERS = {
    "ld/st.u32 x1": (1, 1),
    "ld/st.u32 x4": (1, 4),
    "ld/st.v2 x1": (2, 1),
    "ld/st.v2 x4": (2, 4),
    "ld/st.v4 x1": (4, 1),
    "ld/st.v4 x4": (4, 4),
}

#: The copy kernel the course holds to the bandwidth bar (>= 85% of torch's copy).
BENCH_KERNEL = "ld/st.v4 x4"


def copiers() -> dict:
    """name -> ``prepare(src, dst) -> run`` for :func:`gemmlab.measure.copybench.measure_copies`."""
    return {name: functools.partial(_prepare_for_bench, width=w, unroll=u) for name, (w, u) in COPIERS.items()}


def _prepare_for_bench(src, dst, *, width, unroll):
    return prepare_copy(src, dst, width, unroll)


# --- the same 16-byte access through a DSL copy atom (compile-only demo) ---------

@cute.kernel
def dsl_v4_kernel(src: cute.Tensor, dst: cute.Tensor):
    """Lane ``i`` copies words ``4i .. 4i+3`` with ``CopyUniversalOp`` at 128 bits per copy.

    The tensors are 16-byte aligned and each lane's piece is 4 contiguous
    words, so the atom may use one 16-byte access: the PTX holds
    ``ld.global.v4.b32`` / ``st.global.v4.b32``, the same access as
    :func:`ld_global_v4` (``.b32`` instead of ``.u32``: untyped bits).
    """
    tid, _, _ = cute.arch.thread_idx()
    atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), Int32, num_bits_per_copy=128)
    piece_src = cute.zipped_divide(src, (4,))[None, tid]  # this lane's 4 words
    piece_dst = cute.zipped_divide(dst, (4,))[None, tid]
    regs = cute.make_rmem_tensor(cute.make_layout(4), Int32)
    cute.copy(atom, piece_src, regs)
    cute.copy(atom, regs, piece_dst)


@cute.jit
def dsl_v4_host(src: cute.Tensor, dst: cute.Tensor, stream: cuda.CUstream):
    dsl_v4_kernel(src, dst).launch(grid=(1, 1, 1), block=(32, 1, 1), stream=stream)


def compile_dsl_v4(target: str):
    """Compile :func:`dsl_v4_kernel` (128 words, one warp) for ``target``."""
    from .compile import check_target, compile_for, fake_stream, fake_tensor

    check_target(target)
    return compile_for(target, dsl_v4_host, fake_tensor(Int32, (128,)), fake_tensor(Int32, (128,)), fake_stream())
