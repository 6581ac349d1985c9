"""Chapter 01: shared-memory banks, a model of bank conflicts, and a measurement.

What this teaches
-----------------
Shared memory is split into 32 banks, each 4 bytes wide: byte address ``a``
lives in bank ``(a // 4) % 32``. Each clock, shared memory serves one
*wavefront*: at most one 4-byte word from each bank (128 bytes). The model
used throughout the course (:func:`wavefronts`):

1. A warp's request with an access width of ``w`` bytes (4, 8 or 16) is
   split into phases of ``128 // w`` consecutive lanes (32, 16 or 8 lanes):
   one phase can at best use every bank once. Phases never conflict with
   each other; a wide access simply needs more phases.
2. Inside a phase, each lane touches ``w // 4`` consecutive words. Lanes that
   touch the *same word* share it (broadcast, no cost). Distinct words in the
   same bank must be served in separate wavefronts.
3. The phase costs ``max over banks of (distinct words in that bank)``
   wavefronts; the request costs the sum over its phases.

The *conflict degree* is wavefronts divided by the best case for that width
(one per phase): 1 means conflict-free. Reading a 32-bit word per lane with a
stride of ``s`` words is ``gcd(s, 32)``-way conflicted: stride 32 (a column
of a 32x32 float tile) puts all 32 lanes in bank 0, and padding each row to
33 words spreads them over all 32 banks again.

:func:`measure_bank_conflicts` tests the model on the GPU: 32 warps hammer
shared memory with one stride each, and the cycles per warp-wide load are
set against the model's degree (the figure:
:func:`gemmlab.measure.banks.draw_bank_conflicts`).

This adds the cost model for every shared-memory access pattern in later
chapters: ldmatrix rows, the swizzles of chapter 04 (TMA) and the
shared-memory layouts of WGMMA operands are all designed to keep it at 1.
"""
from __future__ import annotations

import functools
import math
import numbers

import numpy as np

import cutlass
import cutlass.cute as cute
import cuda.bindings.driver as cuda
from cutlass import Int32

from .checks import check_choice, check_int
from .ldst import ld_shared_b32, ld_shared_v2, ld_shared_v4, st_global_b32

BANKS = 32
BANK_BYTES = 4
WAVEFRONT_BYTES = BANKS * BANK_BYTES  # 128
WIDTHS = (4, 8, 16)


def _check_address(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int (a byte address); got {type(value).__name__}")
    if value < 0:
        raise ValueError(f"{name} must be a non-negative byte address; got {value}")
    return int(value)


def bank_of(byte_address: int) -> int:
    """The bank holding ``byte_address`` (a non-negative int)."""
    return (_check_address("byte_address", byte_address) // BANK_BYTES) % BANKS


def lanes_per_phase(width: int) -> int:
    """Lanes served together: 32 for 4-byte, 16 for 8-byte, 8 for 16-byte accesses."""
    check_choice("width", width, WIDTHS)
    return WAVEFRONT_BYTES // width


def _check_addresses(addresses, width):
    check_choice("width", width, WIDTHS)
    if isinstance(addresses, (str, bytes)) or not hasattr(addresses, "__iter__"):
        raise TypeError(f"addresses must be a sequence of byte addresses, one per lane; got {type(addresses).__name__}")
    addresses = [_check_address(f"addresses[{lane}]", a) for lane, a in enumerate(addresses)]
    if not 1 <= len(addresses) <= 32:
        raise ValueError(f"addresses must hold 1 to 32 lane addresses (one warp); got {len(addresses)}")
    for lane, a in enumerate(addresses):
        if a % width:
            raise ValueError(f"addresses must be multiples of width={width} (aligned accesses); "
                             f"lane {lane} has {a}")
    return addresses


def phase_wavefronts(addresses, width: int = 4) -> list[int]:
    """Wavefronts of each phase of a warp's access (see the module docstring)."""
    addresses = _check_addresses(addresses, width)
    per = lanes_per_phase(width)
    out = []
    for start in range(0, len(addresses), per):
        words_in_bank: dict[int, set] = {}
        for a in addresses[start:start + per]:
            for k in range(width // BANK_BYTES):
                word = a // BANK_BYTES + k
                words_in_bank.setdefault(word % BANKS, set()).add(word)
        out.append(max(len(w) for w in words_in_bank.values()))
    return out


def wavefronts(addresses, width: int = 4) -> int:
    """Shared-memory wavefronts one warp-wide access needs.

    ``addresses``: the byte address each lane accesses (up to 32 lanes, in
    lane order); ``width``: bytes per lane (4, 8 or 16).
    """
    return sum(phase_wavefronts(addresses, width))


def conflict_degree(addresses, width: int = 4) -> float:
    """Wavefronts over the conflict-free minimum (one per phase); 1.0 means no conflict."""
    phases = phase_wavefronts(addresses, width)
    return sum(phases) / len(phases)


def strided_addresses(stride: int, width: int = 4, lanes: int = 32) -> list[int]:
    """Byte addresses of lanes reading ``width``-byte pieces ``stride`` pieces apart."""
    stride = check_int("stride", stride, lo=0)
    width = check_choice("width", width, WIDTHS)
    lanes = check_int("lanes", lanes, lo=1, hi=32)  # one warp
    return [lane * stride * width for lane in range(lanes)]


def stride_degrees(strides=range(1, 33), width: int = 4) -> np.ndarray:
    """Conflict degree for each stride (in units of ``width``-byte pieces)."""
    return np.array([conflict_degree(strided_addresses(int(s), width), width) for s in strides])


# --- figures -------------------------------------------------------------------

def stride_figure(name: str = "01_bank_conflicts_stride"):
    """Conflict degree vs stride for 4-, 8- and 16-byte accesses; return (path, {width: degrees})."""
    from .figures import new_figure, save

    strides = np.arange(1, 33)
    data = {w: stride_degrees(strides, w) for w in WIDTHS}
    fig, ax = new_figure(figsize=(8, 3.6))
    for w, marker in zip(WIDTHS, "osD"):
        ax.plot(strides, data[w], marker=marker, ms=4, label=f"{w}-byte accesses (phases of {lanes_per_phase(w)} lanes)")
    ax.set_xlabel("stride between neighbouring lanes (in accesses of that width)")
    ax.set_ylabel("conflict degree (wavefronts / minimum)")
    ax.set_xticks(strides)
    ax.tick_params(axis="x", labelsize=7)
    ax.set_yscale("log", base=2)
    ax.set_yticks([1, 2, 4, 8, 16, 32])
    ax.set_yticklabels(["1", "2", "4", "8", "16", "32"])
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title("Bank-conflict model: a strided warp access")
    return save(fig, name), data


def padding_figure(name: str = "01_bank_conflicts_padding"):
    """A 32x32 float tile, unpadded and padded to 33 words a row, coloured by bank.

    Highlights column 0 (what lane ``i`` reads when a warp reads a column:
    row ``i``). Returns (path, {row_words: degree of the column read}).
    """
    from matplotlib.patches import Rectangle

    from .figures import new_figure, save

    fig, axes = new_figure(1, 2, figsize=(11, 5.4))
    degrees = {}
    for ax, row_words in zip(axes, (32, 33)):
        banks = np.array([[bank_of(4 * (r * row_words + c)) for c in range(32)] for r in range(32)])
        column = [4 * r * row_words for r in range(32)]
        degrees[row_words] = conflict_degree(column, 4)
        ax.imshow(banks, cmap="viridis", vmin=0, vmax=31, alpha=0.7)
        for r in range(32):
            ax.add_patch(Rectangle((-0.5, r - 0.5), 1, 1, fill=False, lw=1.2, ec="black"))
            ax.text(0, r, str(banks[r, 0]), ha="center", va="center", fontsize=5.5)
        verdict = "conflict-free" if degrees[row_words] == 1 else f"{int(degrees[row_words])}-way conflicted"
        ax.set_title(f"row = {row_words} words{' (1-word pad)' if row_words == 33 else ''}: "
                     f"reading column 0 is {verdict}", fontsize=9)
        ax.set_xlabel("column (float)")
        ax.set_ylabel("row = lane that reads it")
    fig.suptitle("A warp reading one column of a 32x32 float tile; colour = bank, column 0 labelled with its bank")
    fig.tight_layout()
    return save(fig, name), degrees


# --- the measurement -------------------------------------------------------------

#: Threads of the measuring CTA (32 warps keep shared memory busy every clock).
MEASURE_THREADS = 1024
#: Loads per thread in one run: ITERATIONS x UNROLL.
ITERATIONS, UNROLL = 64, 16
#: Words of shared memory the measuring kernel reads from (stride up to 64 x 16 bytes).
SMEM_WORDS = 8192


@cute.kernel
def bank_kernel(out: cute.Tensor, stride: Int32, width: cutlass.Constexpr):
    """Every warp reads shared memory at ``lane * stride`` pieces of ``width`` bytes, over and over.

    ``out[0]``: clock cycles between the first and the last barrier, read by
    thread 0; ``out[1 + tid]``: an xor of everything loaded (so no load is
    dead, and the timed region cannot be reordered away).
    """
    tid, _, _ = cute.arch.thread_idx()
    lane = tid % 32
    smem = cutlass.memory.SmemAllocator()
    buf = smem.allocate_array(Int32, SMEM_WORDS, byte_alignment=16)
    base = lane * stride * (width // 4)
    acc = Int32(0)
    cute.arch.sync_threads()
    start = cute.arch.clock64()
    cute.arch.sync_threads()
    for i in cutlass.range(ITERATIONS, unroll=1):
        for k in cutlass.range_constexpr(UNROLL):  # independent loads: throughput, not latency
            # Each load moves on by 32 words (one full row of banks): every lane
            # keeps its bank, so the conflict pattern is unchanged, but no two
            # loads share an address. With a fixed address ptxas merges the
            # loads and hoists them out of the loop (inline PTX is not volatile
            # to ptxas), and the "measurement" times an empty loop.
            addr = buf + ((base + (i * UNROLL + k) * 32) & (SMEM_WORDS - 1))
            if cutlass.const_expr(width == 4):
                acc = acc ^ ld_shared_b32(addr)
            elif cutlass.const_expr(width == 8):
                a, b = ld_shared_v2(addr)
                acc = acc ^ a ^ b
            else:
                a, b, c, d = ld_shared_v4(addr)
                acc = acc ^ a ^ b ^ c ^ d
    cute.arch.sync_threads()
    stop = cute.arch.clock64()
    if tid == 0:
        st_global_b32(out.iterator, Int32(stop - start))
    st_global_b32(out.iterator + 1 + tid, acc)


@functools.lru_cache(maxsize=None)
def bank_host(width: int):
    """``@cute.jit`` launch of :func:`bank_kernel`: one CTA of 1024 threads; stride is a runtime argument."""

    @cute.jit
    def host(out: cute.Tensor, stride: Int32, stream: cuda.CUstream):
        bank_kernel(out, stride, width).launch(grid=(1, 1, 1), block=(MEASURE_THREADS, 1, 1), stream=stream)

    return host


def compile_bank_kernel(target: str, width: int = 4):
    """Compile the measuring kernel for ``target`` (no GPU needed)."""
    from .compile import check_target, compile_for, fake_stream, fake_tensor

    check_target(target)
    check_choice("width", width, WIDTHS)
    return compile_for(target, bank_host(width), fake_tensor(Int32, (1 + MEASURE_THREADS,)), Int32(1), fake_stream())


def measure_bank_conflicts(strides=tuple(range(1, 34)), width: int = 4, repeats: int = 3) -> list[dict]:
    """Measure cycles per warp-wide shared load for each stride; return rows with the model beside them.

    Rows: ``stride``, ``width``, ``model degree``, ``cycles/access`` (best of
    ``repeats`` runs: clock cycles of the timed loop divided by the loads
    each warp issued times the warps sharing the SM). With one wavefront per
    clock, a conflict-free 4-byte access costs about 1 cycle and a d-way
    conflicted one about d.
    """
    import torch

    from .compile import launcher
    from .tiers import require_tier

    check_choice("width", width, WIDTHS)
    strides = [check_int("stride", s, lo=0, hi=64) for s in strides]
    check_int("repeats", repeats, lo=1)
    require_tier("gpu", "gemmlab.banks.measure_bank_conflicts")
    out = torch.zeros(1 + MEASURE_THREADS, dtype=torch.int32, device="cuda")
    warps = MEASURE_THREADS // 32
    loads_per_warp = ITERATIONS * UNROLL
    rows = []
    for s in strides:
        run = launcher(bank_host(width), out, Int32(s))
        best = math.inf
        for _ in range(repeats + 1):  # first run warms up (instruction cache, clocks)
            run()
            torch.cuda.synchronize()
            best = min(best, int(out[0].item()))
        rows.append({
            "stride": s, "width": width,
            "model degree": conflict_degree(strided_addresses(s, width), width),
            "model wavefronts": wavefronts(strided_addresses(s, width), width),
            "cycles/access": best / (loads_per_warp * warps),
        })
    return rows
