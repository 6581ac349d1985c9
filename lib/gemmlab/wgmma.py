"""Chapter 06: Hopper tensor cores, ``wgmma.mma_async``, and a first TMA + WGMMA GEMM.

Chapters 01-05 moved bytes: registers, shared memory, mbarriers, bulk copies,
TMA, pipelines. This chapter finally multiplies them. Hopper's tensor-core
instruction is ``wgmma.mma_async``: one *warpgroup* (four consecutive warps,
128 threads) computes ``D[64 x N] (+)= A[64 x 16] * B[16 x N]`` for BF16/FP16
inputs (``m64nNk16``, N a multiple of 8 up to 256), accumulating in FP32
registers spread over the 128 threads.

What it teaches

* **Operands come from shared memory through descriptors.** A and B are not
  passed as registers but as 64-bit *matrix descriptors*: start address,
  leading/stride byte offsets and swizzle mode of a tile laid out in one of a
  few canonical shared-memory patterns (the same 128-byte swizzle that TMA
  writes, chapter 04). :func:`encode_smem_desc` / :func:`decode_smem_desc`
  take one apart field by field; :func:`describe_for_layout` computes what the
  DSL uses for K-major, 128B-swizzled BF16 tiles, and the tests find that
  very constant in the compiled PTX.
* **The accumulator lives in registers, in a fixed pattern.** Thread ``t`` of
  the warpgroup holds N/2 FP32 values; warp ``w`` owns rows 16w..16w+15 and,
  inside a warp, the pattern repeats ``mma.m16n8`` every 8 columns.
  :func:`acc_fragment_map` is that model; :func:`run_fragment_probe` checks
  it element by element on the GPU with a product whose every entry encodes
  its own (row, col).
* **Asynchrony, three instructions.** ``wgmma.fence`` (before the first
  wgmma, and whenever the accumulator registers were touched by ordinary
  instructions: the tensor core reads them asynchronously),
  ``wgmma.commit_group`` (close the wgmmas issued so far into a group) and
  ``wgmma.wait_group N`` (until at most N groups are in flight: only then may
  the registers be read, or the shared-memory stage they read be refilled).
* **A first GEMM.** :func:`gemm_nt` (``C = a @ b.T``, B given as N x K): a
  TMA producer warp fills a ring of shared-memory stages (chapter 05's
  full/empty mbarriers and :class:`~gemmlab.pipeline.DevicePipelineState`),
  one consumer warpgroup issues ``wgmma`` over each stage, keeps one wgmma
  group in flight while it waits for the next stage, and finally writes BF16
  C straight from its registers to global memory.

What it adds over chapter 05
    The consumer of the TMA ring is no longer a copy loop but the tensor core.
    Chapter 07 then makes this GEMM fast: persistent tiles, two consumer
    warpgroups, ``setmaxnreg``, clusters with multicast and a TMA-store epilogue.

Kernels use the DSL's warpgroup MMA atom (``cute.nvgpu.warpgroup.MmaF16BF16Op``
through ``cute.gemm``), which builds the descriptors itself; the chapter's
job is to make what it builds visible. Static shapes only (the DSL bakes the
extents into the code).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import BFloat16, Constexpr, Float16, Float32, Int64
from cutlass.cute.nvgpu import OperandMajorMode, cpasync, warpgroup
from cutlass.memory import SmemAllocator

from .checks import check_choice, check_int, check_tensor
from .compile import check_target, compile_for, fake_stream, fake_tensor, launcher
from .hardware import SMEM_PER_BLOCK
from .pipeline import DevicePipelineState
from .tiers import require_tier

# ---------------------------------------------------------------------------
# The shared-memory matrix descriptor (PTX ISA: "Matrix Descriptor Format")
# ---------------------------------------------------------------------------

#: Swizzle mode names and their 2-bit codes in bits 62-63 of the descriptor.
SWIZZLE_CODES = {"none": 0, "128B": 1, "64B": 2, "32B": 3}
#: Bytes in one swizzled row (the width of the repeating 8-row pattern).
SWIZZLE_BYTES = {"128B": 128, "64B": 64, "32B": 32}

#: ``(field, first bit, width, how the value is stored)`` for every field of the descriptor.
#: Addresses and offsets drop their 4 low bits (everything is 16-byte granular).
DESC_FIELDS = (
    ("start_addr", 0, 14, "shared address >> 4 (low 18 bits of the address)"),
    ("lbo", 16, 14, "leading-dimension byte offset >> 4"),
    ("sbo", 32, 14, "stride-dimension byte offset >> 4"),
    ("base_offset", 49, 3, "pattern phase when the tile is not aligned to the swizzle repeat"),
    ("swizzle", 62, 2, "0 none, 1 128B, 2 64B, 3 32B"),
)


@dataclass(frozen=True)
class SmemDesc:
    """A decoded wgmma shared-memory descriptor, in bytes (not the >> 4 encodings)."""

    start_addr: int
    lbo: int
    sbo: int
    swizzle: str
    base_offset: int = 0

    @property
    def value(self) -> int:
        return encode_smem_desc(self.start_addr, self.lbo, self.sbo, self.swizzle, self.base_offset)

    def raw_fields(self) -> dict:
        """The integer stored in each field of :data:`DESC_FIELDS`."""
        v = self.value
        return {name: (v >> lo) & ((1 << width) - 1) for name, lo, width, _ in DESC_FIELDS}

    def __str__(self) -> str:
        return (f"start_addr={self.start_addr:#x} lbo={self.lbo} sbo={self.sbo} "
                f"swizzle={self.swizzle} base_offset={self.base_offset}")


def _check_byte_field(name: str, value) -> int:
    return check_int(name, value, lo=0, hi=(1 << 18) - 16, multiple_of=16)


def encode_smem_desc(start_addr: int, lbo: int, sbo: int, swizzle: str = "128B", base_offset: int = 0) -> int:
    """The 64-bit descriptor ``wgmma.mma_async`` takes for a shared-memory operand.

    ``start_addr``: the tile's shared-memory address in bytes; ``lbo`` /
    ``sbo``: leading / stride byte offsets (between core matrices along K and
    along M/N); all multiples of 16 below 256 KiB. ``swizzle``: one of
    ``"none"``, ``"128B"``, ``"64B"``, ``"32B"``. ``base_offset``: 0..7.
    """
    start_addr = _check_byte_field("start_addr", start_addr)
    lbo = _check_byte_field("lbo", lbo)
    sbo = _check_byte_field("sbo", sbo)
    check_choice("swizzle", swizzle, tuple(SWIZZLE_CODES))
    base_offset = check_int("base_offset", base_offset, lo=0, hi=7)
    return ((start_addr >> 4) | ((lbo >> 4) << 16) | ((sbo >> 4) << 32) | (base_offset << 49)
            | (SWIZZLE_CODES[swizzle] << 62))


def decode_smem_desc(value: int) -> SmemDesc:
    """Take a 64-bit descriptor apart (accepts the signed form PTX prints, e.g. ``-4611686...``)."""
    value = check_int("value", value)
    if not -(1 << 63) <= value < (1 << 64):
        raise ValueError(f"value must fit in 64 bits; got {value}")
    v = value & ((1 << 64) - 1)
    used = 0
    for _, lo, width, _ in DESC_FIELDS:
        used |= ((1 << width) - 1) << lo
    if v & ~used:
        raise ValueError(f"value {v:#018x} sets reserved bits {v & ~used:#018x}")
    names = {c: n for n, c in SWIZZLE_CODES.items()}
    return SmemDesc(start_addr=(v & 0x3FFF) << 4, lbo=((v >> 16) & 0x3FFF) << 4, sbo=((v >> 32) & 0x3FFF) << 4,
                    swizzle=names[v >> 62], base_offset=(v >> 49) & 7)


@dataclass(frozen=True)
class OperandLayout:
    """What :func:`describe_for_layout` finds for one K-major operand tile in shared memory."""

    rows: int  # M (operand A) or N (operand B)
    k: int  # K elements per stage
    elem_bytes: int
    swizzle: str
    row_bytes: int  # one swizzled row: the K-contiguous bytes of 8 ... 64 elements
    sbo: int  # bytes from one 8-row group to the next (the "stride" dimension, M/N)
    lbo: int  # leading-dimension offset: unused by swizzled K-major layouts, conventionally 16
    k_step_bytes: int  # how far the start address moves for the next k16 slice
    descriptors: tuple[int, ...]  # one per k16 slice of the tile (8-row group 0)

    @property
    def tile_bytes(self) -> int:
        return self.rows * self.k * self.elem_bytes


def describe_for_layout(rows: int = 128, k: int = 64, *, dtype: str = "bf16", swizzle: str = "128B",
                        start_addr: int = 0) -> OperandLayout:
    """The descriptors of a K-major ``rows x k`` tile stored as the DSL (and TMA) lay it out.

    K-major with swizzle ``S`` bytes: every row of the tile holds ``S`` bytes
    of K (``S / 2`` BF16 elements); 8 consecutive rows form one swizzle atom
    (``8 * S`` bytes, inside which 16-byte chunks are XOR-permuted by the row
    index); atoms stack along M/N at ``SBO = 8 * S`` bytes. One wgmma reads
    k = 16 elements (32 bytes), which never leaves a swizzled row, so LBO is
    not used (the DSL writes 16). The next k16 slice starts 32 bytes later:
    the hardware applies the XOR to the *address*, which is why tiles must be
    aligned to the 1024-byte atom (then ``base_offset`` is 0).
    """
    check_choice("dtype", dtype, ("bf16", "fp16"))
    check_choice("swizzle", swizzle, tuple(SWIZZLE_BYTES))
    elem = 2
    row_bytes = SWIZZLE_BYTES[swizzle]
    check_int("rows", rows, lo=8, multiple_of=8)
    check_int("k", k, lo=row_bytes // elem, multiple_of=row_bytes // elem)
    check_int("start_addr", start_addr, lo=0, multiple_of=8 * row_bytes)
    sbo = 8 * row_bytes
    k_step = 16 * elem
    descs = []
    for kk in range(k // 16):
        atom, within = divmod(kk * k_step, row_bytes)  # K beyond one swizzled row: the next atom column
        descs.append(encode_smem_desc(start_addr + atom * rows * row_bytes + within, 16, sbo, swizzle))
    return OperandLayout(rows, k, elem, swizzle, row_bytes, sbo, 16, k_step, tuple(descs))


def sw128_chunk_map(rows: int = 8) -> list[list[int]]:
    """Where each logical 16-byte chunk of a K-major 128B-swizzled row lands: ``[row][chunk] -> physical chunk``.

    Chunk ``c`` of row ``r`` (elements ``8c..8c+7`` of K for BF16) is stored at
    chunk ``c XOR (r % 8)`` of that row: the ``Swizzle<3,4,3>`` of CuTe, the
    pattern TMA writes with ``SWIZZLE_128B`` and wgmma reads with mode 1.
    """
    check_int("rows", rows, lo=1)
    return [[c ^ (r % 8) for c in range(8)] for r in range(rows)]


def draw_smem_desc(value: int, name: str = "06_smem_descriptor", title: str | None = None) -> str:
    """Draw the 64 bits of descriptor ``value``, field by field; return the figure's path."""
    from matplotlib.patches import Rectangle

    from .figures import new_figure, save

    d = decode_smem_desc(value)
    raw = d.raw_fields()
    shown = {"start_addr": f"{d.start_addr:#x} B", "lbo": f"{d.lbo} B", "sbo": f"{d.sbo} B",
             "base_offset": f"{d.base_offset}", "swizzle": d.swizzle}
    colors = {"start_addr": "#4C72B0", "lbo": "#55A868", "sbo": "#C44E52", "base_offset": "#8172B2",
              "swizzle": "#DD8452"}
    fig, ax = new_figure(figsize=(12, 2.9))
    v = value & ((1 << 64) - 1)
    for bit in range(64):
        x = 63 - bit  # bit 63 on the left, as the ISA draws it
        owner = next((n for n, lo, w, _ in DESC_FIELDS if lo <= bit < lo + w), None)
        ax.add_patch(Rectangle((x, 0), 1, 1, fc=colors.get(owner, "#eeeeee"), ec="white", alpha=0.85 if owner else 1))
        ax.text(x + 0.5, 0.5, str((v >> bit) & 1), ha="center", va="center", fontsize=7,
                color="white" if owner else "#999999")
        if bit % 8 == 0 or bit == 63:
            ax.text(x + 0.5, -0.25, str(bit), ha="center", va="top", fontsize=6, color="#555555")
    for n, lo, w, meaning in DESC_FIELDS:
        x0, x1 = 63 - (lo + w - 1), 63 - lo + 1
        ax.annotate("", xy=(x0, 1.15), xytext=(x1, 1.15), arrowprops=dict(arrowstyle="<->", color=colors[n], lw=1))
        ax.text((x0 + x1) / 2, 1.3, f"{n} [{lo}:{lo + w - 1}]\nfield {raw[n]} = {shown[n]}", ha="center",
                va="bottom", fontsize=7.5, color=colors[n])
    ax.set_xlim(-0.5, 64.5)
    ax.set_ylim(-0.9, 2.4)
    ax.axis("off")
    ax.set_title(title or f"wgmma shared-memory descriptor {v:#018x}", fontsize=10)
    return str(save(fig, name))


def draw_sw128_tile(rows: int = 16, name: str = "06_sw128_tile") -> str:
    """A K-major BF16 tile, 64 K-elements wide, as stored with the 128-byte swizzle; returns the path.

    Left: the logical tile (row r, 16-byte chunk c = K elements 8c..8c+7),
    colored by the k16 slice (one wgmma) that reads it. Right: the same
    chunks at their physical place in shared memory. The brackets mark the
    1024-byte atoms that SBO steps over.
    """
    from matplotlib.patches import Rectangle

    from .figures import new_figure, save

    check_int("rows", rows, lo=8, hi=64, multiple_of=8)
    cmap = ["#4C72B0", "#55A868", "#C44E52", "#8172B2"]
    phys = sw128_chunk_map(rows)
    fig, axes = new_figure(1, 2, figsize=(11, 0.32 * rows + 1.6))
    for ax, physical in zip(axes, (False, True)):
        for r in range(rows):
            for c in range(8):
                x = phys[r][c] if physical else c
                ax.add_patch(Rectangle((x, r), 1, 1, fc=cmap[c // 2], ec="white"))
                ax.text(x + 0.5, r + 0.5, f"k{8 * c}", ha="center", va="center", fontsize=6.5, color="white")
        for g in range(rows // 8):
            ax.annotate("", xy=(8.25, 8 * g), xytext=(8.25, 8 * g + 8),
                        arrowprops=dict(arrowstyle="-", color="#555555"))
            ax.text(8.4, 8 * g + 4, f"atom {g}\n{1024 * g}-{1024 * g + 1023} B", va="center", fontsize=7)
        ax.set_xlim(0, 10)
        ax.set_ylim(rows, 0)
        ax.set_xticks([c + 0.5 for c in range(8)])
        ax.set_xticklabels([f"{16 * c}" if physical else f"{c}" for c in range(8)], fontsize=7)
        ax.set_xlabel("byte offset in the 128-byte row" if physical else "logical 16-byte chunk (K elements)")
        ax.set_yticks(range(0, rows, 4))
        ax.set_ylabel("row (M or N)")
        ax.set_title("in shared memory (chunk c of row r at c XOR r%8)" if physical
                     else "logical tile: color = the k16 slice one wgmma reads", fontsize=9)
    return str(save(fig, name))


# ---------------------------------------------------------------------------
# The accumulator fragment: which thread holds which element of C
# ---------------------------------------------------------------------------

WARPGROUP = 128  # threads


def _check_n(n) -> int:
    return check_int("n", n, lo=8, hi=256, multiple_of=8)


def acc_coord(thread: int, reg: int, n: int = 128) -> tuple[int, int]:
    """``(row, col)`` of C held by accumulator register ``reg`` of warpgroup thread ``thread`` (m64nNk16, FP32).

    Warp ``w = thread // 32`` owns rows ``16w .. 16w + 15``. Inside a warp,
    registers come in groups of four per 8 columns, exactly the C fragment of
    ``mma.m16n8``: ``r % 2`` picks one of two neighbouring columns,
    ``(r // 2) % 2`` the upper or lower 8 rows, ``r // 4`` the 8-column block.
    """
    _check_n(n)
    check_int("thread", thread, lo=0, hi=WARPGROUP - 1)
    check_int("reg", reg, lo=0, hi=n // 2 - 1)
    warp, lane = divmod(thread, 32)
    row = 16 * warp + lane // 4 + 8 * ((reg // 2) % 2)
    col = 8 * (reg // 4) + 2 * (lane % 4) + reg % 2
    return row, col


def acc_fragment_map(n: int = 128):
    """Two ``64 x n`` integer arrays: the thread and the register that hold each element of C."""
    import numpy as np

    _check_n(n)
    thread = np.full((64, n), -1, dtype=np.int32)
    reg = np.full((64, n), -1, dtype=np.int32)
    for t in range(WARPGROUP):
        for r in range(n // 2):
            i, j = acc_coord(t, r, n)
            if thread[i, j] != -1:
                raise AssertionError(f"C[{i},{j}] held twice")  # the model must be a bijection
            thread[i, j], reg[i, j] = t, r
    return thread, reg


def expected_probe(n: int = 128):
    """What :func:`run_fragment_probe` must return, by the model: ``[thread, reg] -> (row, col)``, ``(128, n/2, 2)``."""
    import numpy as np

    _check_n(n)
    out = np.zeros((WARPGROUP, n // 2, 2), dtype=np.int64)
    for t in range(WARPGROUP):
        for r in range(n // 2):
            out[t, r] = acc_coord(t, r, n)
    return out


def draw_acc_fragment(n: int = 64, name: str = "06_acc_fragment") -> str:
    """The accumulator of ``m64n{n}k16``: owner of every C element, and a labelled zoom; returns the path."""
    import numpy as np
    from matplotlib.patches import Rectangle

    from .figures import new_figure, save

    thread, reg = acc_fragment_map(n)
    warp_colors = np.array([[0.30, 0.45, 0.69], [0.33, 0.66, 0.41], [0.77, 0.31, 0.32], [0.51, 0.45, 0.70]])
    fig, (ax0, ax1) = new_figure(1, 2, figsize=(13, 5.6), gridspec_kw={"width_ratios": [1.1, 1]})
    rgb = np.zeros((64, n, 3))
    for i in range(64):
        for j in range(n):
            lane = thread[i, j] % 32
            shade = 0.55 + 0.45 * ((lane % 4) / 3)  # the 4 threads of a quad in 4 shades
            rgb[i, j] = warp_colors[thread[i, j] // 32] * shade + (1 - shade)
    ax0.imshow(rgb, aspect="auto", interpolation="nearest")
    for w in range(4):
        ax0.text(n + 0.5, 16 * w + 8, f"warp {w}\nthreads {32 * w}-{32 * w + 31}", va="center", fontsize=8)
    ax0.set_xlim(-0.5, n + 10)
    ax0.set_title(f"m64n{n}k16, FP32 accumulator: owner of C[row, col]\n(color = warp, shade = thread % 4)",
                  fontsize=9)
    ax0.set_xlabel("col")
    ax0.set_ylabel("row")
    ax0.add_patch(Rectangle((-0.5, -0.5), 16, 16, fill=False, ec="black", lw=1.5))
    zr, zc = 16, 16
    for i in range(zr):
        for j in range(zc):
            t, r = thread[i, j], reg[i, j]
            ax1.add_patch(Rectangle((j, i), 1, 1, fc=rgb[i, j], ec="white"))
            ax1.text(j + 0.5, i + 0.5, f"T{t}\nr{r}", ha="center", va="center", fontsize=5.8)
    ax1.set_xlim(0, zc)
    ax1.set_ylim(zr, 0)
    ax1.set_xticks([j + 0.5 for j in range(zc)])
    ax1.set_xticklabels(range(zc), fontsize=7)
    ax1.set_yticks([i + 0.5 for i in range(zr)])
    ax1.set_yticklabels(range(zr), fontsize=7)
    ax1.set_title("zoom on C[0:16, 0:16] (warp 0): thread T, register r", fontsize=9)
    return str(save(fig, name))


# ---------------------------------------------------------------------------
# Shared pieces of the kernels
# ---------------------------------------------------------------------------

def make_tiled_mma(ab_dtype, n: int):
    """The DSL's warpgroup MMA for ``m64n{n}k16``: A and B from shared memory, both K-major, FP32 accumulator.

    Call inside a ``@cute.jit`` function compiled for ``sm_90a`` (the op checks the target).
    """
    op = warpgroup.MmaF16BF16Op(ab_dtype, Float32, (64, n, 16), warpgroup.OperandSource.SMEM,
                                OperandMajorMode.K, OperandMajorMode.K)
    return cute.make_tiled_mma(cute.make_mma_atom(op))


def k_major_smem_layout(dtype, rows: int, k: int, stages: int, kind):
    """``(rows, k, stages)`` in shared memory, K-major, built from the swizzle atom ``kind`` (e.g. ``K_SW128``).

    ``tile_to_shape`` repeats the 8-row atom down M/N first, then along K,
    then over stages: exactly the layout :func:`describe_for_layout` models.
    """
    atom = warpgroup.make_smem_layout_atom(kind, dtype)
    return cute.tile_to_shape(atom, (rows, k, stages), order=(0, 1, 2))


# ---------------------------------------------------------------------------
# Kernel 1: the fragment probe (one warpgroup, one wgmma)
# ---------------------------------------------------------------------------


@cute.kernel
def fragment_probe_kernel(a: cute.Tensor, b: cute.Tensor, out: cute.Tensor, tiled_mma: cute.TiledMma,
                          a_layout: cute.ComposedLayout, b_layout: cute.ComposedLayout):
    """One warpgroup: stage A (64 x 16) and B (N x 16) in shared memory, one wgmma, dump every register.

    ``out[t, r]`` = accumulator register ``r`` of thread ``t``: the raw
    fragment, before any layout algebra puts it back in (row, col) order.
    """
    tidx, _, _ = cute.arch.thread_idx()
    smem = SmemAllocator()
    # One k16 slice is 32 bytes of K per row: the 32-byte swizzle atom.
    sA = smem.allocate_tensor(a.element_type, a_layout.outer, byte_alignment=1024, swizzle=a_layout.inner)
    sB = smem.allocate_tensor(b.element_type, b_layout.outer, byte_alignment=1024, swizzle=b_layout.inner)
    for i in cutlass.range_constexpr(cute.size(a) // WARPGROUP):
        e = tidx + WARPGROUP * i
        sA[e // 16, e % 16] = a[e // 16, e % 16]
    for i in cutlass.range_constexpr(cute.size(b) // WARPGROUP):
        e = tidx + WARPGROUP * i
        sB[e // 16, e % 16] = b[e // 16, e % 16]
    # Threads wrote shared memory (generic proxy); wgmma reads it through the
    # async proxy: fence, then make every thread's fence happen before any wgmma.
    cute.arch.fence_proxy("async.shared", space="cta")
    cute.arch.sync_threads()

    thr_mma = tiled_mma.get_slice(tidx)
    tCrA = tiled_mma.make_fragment_A(thr_mma.partition_A(sA))  # descriptors, not data
    tCrB = tiled_mma.make_fragment_B(thr_mma.partition_B(sB))
    acc = cute.make_rmem_tensor(thr_mma.partition_shape_C((64, cute.size(b, mode=[0]))), Float32)

    tiled_mma.set(warpgroup.Field.ACCUMULATE, False)  # D = A*B: the registers' old contents are ignored
    warpgroup.fence()  # order earlier register accesses before the asynchronous wgmma
    cute.gemm(tiled_mma, acc, tCrA[None, None, 0], tCrB[None, None, 0], acc)
    warpgroup.commit_group()
    warpgroup.wait_group(0)  # the result is in the registers only after this
    for r in cutlass.range(cute.size(acc), unroll_full=True):
        out[tidx, r] = acc[r]


@functools.lru_cache(maxsize=None)
def _probe_host(n: int):
    @cute.jit
    def fragment_probe_host(a: cute.Tensor, b: cute.Tensor, out: cute.Tensor, stream: cuda.CUstream):
        tiled_mma = make_tiled_mma(a.element_type, n)
        kind = warpgroup.SmemLayoutAtomKind.K_SW32
        a_layout = cute.slice_(k_major_smem_layout(a.element_type, 64, 16, 1, kind), (None, None, 0))
        b_layout = cute.slice_(k_major_smem_layout(a.element_type, n, 16, 1, kind), (None, None, 0))
        fragment_probe_kernel(a, b, out, tiled_mma, a_layout, b_layout).launch(
            grid=(1, 1, 1), block=(WARPGROUP, 1, 1), stream=stream)

    return fragment_probe_host


def probe_inputs(n: int = 128, device: str = "cuda"):
    """A (64 x 16) and B (n x 16), BF16, such that ``(A @ B.T)[i, j] = 256 * i + j`` exactly.

    A[i, 0] = i, A[i, 1] = 1; B[j, 0] = 256, B[j, 1] = j; zeros elsewhere.
    Every product and sum is an integer below 2^15, exact in BF16 inputs and
    FP32 accumulation, so each register's value names the element it holds.
    """
    import torch

    _check_n(n)
    a = torch.zeros(64, 16, dtype=torch.bfloat16, device=device)
    b = torch.zeros(n, 16, dtype=torch.bfloat16, device=device)
    a[:, 0] = torch.arange(64, dtype=torch.bfloat16, device=device)
    a[:, 1] = 1
    b[:, 0] = 256
    b[:, 1] = torch.arange(n, device=device).to(torch.bfloat16)
    return a, b


def run_fragment_probe(n: int = 128):
    """Launch :func:`fragment_probe_kernel`; return ``(128, n/2, 2)``: the (row, col) each register holds."""
    _check_n(n)
    require_tier("sm90", "gemmlab.wgmma.run_fragment_probe")
    import torch

    a, b = probe_inputs(n)
    out = torch.full((WARPGROUP, n // 2), -1.0, dtype=torch.float32, device="cuda")  # poisoned
    launcher(_probe_host(n), a, b, out)()
    torch.cuda.synchronize()
    v = out.to(torch.int64).cpu()
    return torch.stack([v // 256, v % 256], dim=-1).numpy()


def compile_fragment_probe(target: str = "sm_90a", n: int = 128):
    """Compile the probe without a GPU (sm_90a only: wgmma does not exist on other targets)."""
    check_target(target)
    if target != "sm_90a":
        raise ValueError(f"wgmma is Hopper-only: target must be 'sm_90a'; got {target!r}")
    _check_n(n)
    return compile_for(target, _probe_host(n), fake_tensor(BFloat16, (64, 16), stride_order=(1, 0)),
                       fake_tensor(BFloat16, (n, 16), stride_order=(1, 0)),
                       fake_tensor(Float32, (WARPGROUP, n // 2), stride_order=(1, 0)), fake_stream())


# ---------------------------------------------------------------------------
# Kernel 2: the first TMA + WGMMA GEMM
# ---------------------------------------------------------------------------

TILE_K = 64  # one 128-byte swizzled row of BF16/FP16: a TMA box row and 4 wgmma k16 slices
#: (tile_m, tile_n) this kernel supports: one warpgroup holds tile_m * tile_n / 128 FP32 accumulators
#: per thread, at most 128 of the 255 registers a thread can have.
TILE_SHAPES = ((64, 64), (64, 128), (64, 256), (128, 64), (128, 128))
CONSUMER_WARPS = 4  # one warpgroup: warps 0-3
PRODUCER_WARP = 4  # the TMA warp
THREADS = 32 * (CONSUMER_WARPS + 1)


def stage_bytes(tile_m: int, tile_n: int, elem_bytes: int = 2) -> int:
    """Bytes one stage of the ring holds: an A tile and a B tile of TILE_K columns."""
    return (tile_m + tile_n) * TILE_K * elem_bytes


def default_stages(tile_m: int, tile_n: int) -> int:
    """As many stages as fit in shared memory, at most 6 (more buys nothing measurable at 4096^3).

    Shared memory: :data:`gemmlab.hardware.SMEM_PER_BLOCK` (227 KiB on H100/H200), less 1 KiB of margin
    (the mbarriers, the 1024-byte alignment of the swizzled tiles), as :func:`_check_config` counts it.
    """
    return min(6, (SMEM_PER_BLOCK - 1024) // stage_bytes(tile_m, tile_n))


def _check_config(tile_m, tile_n, stages) -> tuple[int, int, int]:
    tile_m = check_int("tile_m", tile_m)
    tile_n = check_int("tile_n", tile_n)
    if (tile_m, tile_n) not in TILE_SHAPES:
        raise ValueError(f"(tile_m, tile_n) must be one of {', '.join(map(str, TILE_SHAPES))}; "
                         f"got {(tile_m, tile_n)}")
    stages = check_int("stages", stages, lo=2, hi=8)
    need = stages * stage_bytes(tile_m, tile_n) + 1024
    if need > SMEM_PER_BLOCK:
        raise ValueError(f"stages={stages} with a {tile_m}x{tile_n} tile needs {need} bytes of shared memory; "
                         f"at most {SMEM_PER_BLOCK} fit in one block")
    return tile_m, tile_n, stages


def _check_shape(m, n, k, tile_m, tile_n) -> tuple[int, int, int]:
    out = []
    for name, v, t in (("M", m, tile_m), ("N", n, tile_n), ("K", k, TILE_K)):
        v = check_int(name, v)
        if v <= 0 or v % t:
            raise ValueError(f"{name} must be a positive multiple of {t} (the tile; this kernel has no partial "
                             f"tiles); got {v}")
        out.append(v)
    return tuple(out)


@cute.kernel
def gemm_kernel(tma_a: cute.CopyAtom, mA: cute.Tensor, tma_b: cute.CopyAtom, mB: cute.Tensor, mC: cute.Tensor,
                tiled_mma: cute.TiledMma, a_layout: cute.ComposedLayout, b_layout: cute.ComposedLayout,
                tile_m: Constexpr, tile_n: Constexpr, stages: Constexpr, inflight: Constexpr):
    """C tile (tile_m x tile_n) = A rows x B rows^T, K in TILE_K steps through a ring of ``stages``.

    Roles: warp 4 = TMA producer, warps 0-3 = the consumer warpgroup (wgmma).
    Barriers: ``full[s]`` (count 1: the producer's arrive + the TMA bytes) and
    ``empty[s]`` (count 4: one arrival per consumer warp, once its wgmmas
    reading stage s are complete).
    ``inflight``: wgmma groups left running while the next stage is awaited
    (1, the kernel; 0, the slower variant the notebook times against it).
    """
    warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
    tidx, _, _ = cute.arch.thread_idx()
    bm, bn, _ = cute.arch.block_idx()
    k_tiles = cute.size(mA, mode=[1]) // TILE_K

    ab = mC.element_type  # mA and mB are TMA coordinate tensors: C carries the data type
    smem = SmemAllocator()
    # 1024-byte alignment: the 128B swizzle repeats every 8 rows x 128 bytes (base_offset stays 0).
    sA = smem.allocate_tensor(ab, a_layout.outer, byte_alignment=1024, swizzle=a_layout.inner)
    sB = smem.allocate_tensor(ab, b_layout.outer, byte_alignment=1024, swizzle=b_layout.inner)
    full = smem.allocate_array(Int64, stages, byte_alignment=8)  # "stage s holds A and B of one k-tile"
    empty = smem.allocate_array(Int64, stages, byte_alignment=8)  # "stage s may be overwritten"
    if tidx == 0:
        for s in cutlass.range_constexpr(stages):
            cute.arch.mbarrier_init(full + s, 1)
            cute.arch.mbarrier_init(empty + s, CONSUMER_WARPS)
        cute.arch.mbarrier_init_fence()
    cute.arch.sync_threads()

    # This CTA's row of A tiles and row of B tiles, one per k-tile: (tile, TILE_K, k_tiles).
    gA = cute.local_tile(mA, (tile_m, TILE_K), (bm, None))
    gB = cute.local_tile(mB, (tile_n, TILE_K), (bn, None))

    if warp == PRODUCER_WARP:
        # ---------------- producer: TMA loads into the ring ----------------
        tAsA, tAgA = cpasync.tma_partition(tma_a, 0, cute.make_layout(1), cute.group_modes(sA, 0, 2),
                                           cute.group_modes(gA, 0, 2))
        tBsB, tBgB = cpasync.tma_partition(tma_b, 0, cute.make_layout(1), cute.group_modes(sB, 0, 2),
                                           cute.group_modes(gB, 0, 2))
        tx_bytes = stage_bytes(tile_m, tile_n, ab.width // 8)
        prod = DevicePipelineState.producer(stages)  # phase 1: fresh 'empty' barriers pass at once
        for k in cutlass.range(k_tiles, unroll=1):
            cute.arch.mbarrier_wait(empty + prod.index, prod.phase)
            with cute.arch.elect_one():
                cute.arch.mbarrier_arrive_and_expect_tx(full + prod.index, tx_bytes)
            cute.copy(tma_a, tAgA[(None, k)], tAsA[(None, prod.index)], tma_bar_ptr=full + prod.index)
            cute.copy(tma_b, tBgB[(None, k)], tBsB[(None, prod.index)], tma_bar_ptr=full + prod.index)
            prod.advance()

    if warp < CONSUMER_WARPS:
        # ---------------- consumer warpgroup: wgmma over the ring ----------------
        thr_mma = tiled_mma.get_slice(tidx)
        tCrA = tiled_mma.make_fragment_A(thr_mma.partition_A(sA))  # (MMA, MMA_M, MMA_K, stages) descriptors
        tCrB = tiled_mma.make_fragment_B(thr_mma.partition_B(sB))
        gC = cute.local_tile(mC, (tile_m, tile_n), (bm, bn))
        tCgC = thr_mma.partition_C(gC)
        acc = cute.make_rmem_tensor(tCgC.shape, Float32)
        k_blocks = cute.size(tCrA, mode=[2])  # TILE_K / 16 wgmmas per k-tile (per 64-row block of A)
        lane = cute.arch.lane_idx()

        cons = DevicePipelineState.consumer(stages)
        # k-tile 0: the first wgmma overwrites the accumulator (scale-d = 0), the rest add.
        tiled_mma.set(warpgroup.Field.ACCUMULATE, False)
        cute.arch.mbarrier_wait(full + cons.index, cons.phase)
        warpgroup.fence()  # the accumulator registers are about to be written asynchronously
        for kb in cutlass.range_constexpr(k_blocks):
            cute.gemm(tiled_mma, acc, tCrA[None, None, kb, cons.index], tCrB[None, None, kb, cons.index], acc)
            tiled_mma.set(warpgroup.Field.ACCUMULATE, True)
        warpgroup.commit_group()
        if cutlass.const_expr(inflight == 0):
            warpgroup.wait_group(0)
            if lane == 0:
                cute.arch.mbarrier_arrive(empty + cons.index)
        cons.advance()

        for k in cutlass.range(1, k_tiles, unroll=1):
            cute.arch.mbarrier_wait(full + cons.index, cons.phase)
            warpgroup.fence()
            for kb in cutlass.range_constexpr(k_blocks):
                cute.gemm(tiled_mma, acc, tCrA[None, None, kb, cons.index], tCrB[None, None, kb, cons.index], acc)
            warpgroup.commit_group()
            # inflight = 1: the group just issued keeps running; the previous
            # k-tile's group is complete, so its stage can be refilled while
            # the tensor cores work on this one. inflight = 0: wait for
            # everything, release this very stage (the tensor core idles
            # while we wait for the next stage).
            warpgroup.wait_group(inflight)
            if lane == 0:
                cute.arch.mbarrier_arrive(empty + (cons.index + stages - inflight) % stages)
            cons.advance()
        warpgroup.wait_group(0)  # every wgmma done: the registers hold C

        # Epilogue: FP32 -> BF16 in registers, then straight to global memory
        # (each thread writes the pairs of neighbouring columns it holds).
        out = cute.make_rmem_tensor(acc.shape, mC.element_type)
        out.store(acc.load().to(mC.element_type))
        cute.autovec_copy(out, tCgC)


@functools.lru_cache(maxsize=None)
def _gemm_host(tile_m: int, tile_n: int, stages: int, inflight: int = 1):
    @cute.jit
    def gemm_host(a: cute.Tensor, b: cute.Tensor, c: cute.Tensor, stream: cuda.CUstream):
        ab = a.element_type
        tiled_mma = make_tiled_mma(ab, tile_n)
        kind = warpgroup.SmemLayoutAtomKind.K_SW128
        a_layout = k_major_smem_layout(ab, tile_m, TILE_K, stages, kind)
        b_layout = k_major_smem_layout(ab, tile_n, TILE_K, stages, kind)
        # The TMA boxes are one stage of the ring; the tensor maps carry the same 128B swizzle.
        tma_a, tma_ta = cpasync.make_tiled_tma_atom(cpasync.CopyBulkTensorTileG2SOp(), a,
                                                    cute.slice_(a_layout, (None, None, 0)), (tile_m, TILE_K))
        tma_b, tma_tb = cpasync.make_tiled_tma_atom(cpasync.CopyBulkTensorTileG2SOp(), b,
                                                    cute.slice_(b_layout, (None, None, 0)), (tile_n, TILE_K))
        grid = (cute.size(c, mode=[0]) // tile_m, cute.size(c, mode=[1]) // tile_n, 1)
        gemm_kernel(tma_a, tma_ta, tma_b, tma_tb, c, tiled_mma, a_layout, b_layout, tile_m, tile_n, stages,
                    inflight).launch(
            grid=grid, block=(THREADS, 1, 1), stream=stream)

    return gemm_host


def _check_gemm_args(a, b, out, tile_m, tile_n, stages):
    import torch

    _check_config(tile_m, tile_n, stages)
    dtypes = (torch.bfloat16, torch.float16)
    check_tensor("a", a, dtypes=dtypes, ndim=2, device=None)
    check_tensor("b", b, dtypes=dtypes, ndim=2, device=None)
    if a.dtype != b.dtype:
        raise TypeError(f"a and b must have the same dtype; got {a.dtype} and {b.dtype}")
    (m, k), (n, kb) = a.shape, b.shape
    if k != kb:
        raise ValueError(f"a is M x K and b is N x K (C = a @ b.T): their K must match; got {k} and {kb}")
    _check_shape(m, n, k, tile_m, tile_n)
    if out is not None:
        check_tensor("out", out, dtypes=(a.dtype,), ndim=2, device=None)
        if tuple(out.shape) != (m, n):
            raise ValueError(f"out must have shape {(m, n)}; got {tuple(out.shape)}")
    # TMA reads from 16-byte aligned global addresses with 16-byte multiple row strides.
    for name, t in (("a", a), ("b", b), ("out", out)):
        if t is not None:
            check_tensor(name, t, device="cuda", align_bytes=16)


def prepare_gemm_nt(a, b, out, *, tile_m: int = 128, tile_n: int = 128, stages: int | None = None,
                    inflight: int = 1):
    """Check, compile once, return ``run()`` computing ``out = a @ b.T`` (for timing loops).

    ``a`` is M x K, ``b`` is N x K (the NT convention, as :func:`gemm_nt`).

    ``inflight``: wgmma groups the consumer leaves running while it waits for
    the next stage (1, or 0 to see what overlapping buys). ``stages``:
    default :func:`default_stages`.
    """
    if stages is None and (tile_m, tile_n) in TILE_SHAPES:
        stages = default_stages(tile_m, tile_n)
    _check_gemm_args(a, b, out, tile_m, tile_n, stages)
    check_choice("inflight", inflight, (0, 1))
    require_tier("sm90", "gemmlab.wgmma.gemm_nt")
    return launcher(_gemm_host(tile_m, tile_n, stages, inflight), a, b, out)


def gemm_nt(a, b, out=None, *, tile_m: int = 128, tile_n: int = 128, stages: int | None = None):
    """``C = a @ b.T`` on the tensor cores: ``a`` is M x K, ``b`` is N x K (both K-major, like ``nn.Linear``).

    The NT convention of BLAS: A row-major, B given as N x K (hence the
    ``_nt``; the course's :func:`gemmlab.gemm` computes ``a @ b``, torch's meaning).

    BF16 or FP16 in, FP32 accumulation, C in the input dtype. M, N and K must
    be multiples of the tile (``tile_m``, ``tile_n``, 64): no partial tiles.
    """
    import torch

    if out is None and isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dim() == 2 and b.dim() == 2:
        out = torch.empty(a.shape[0], b.shape[0], dtype=a.dtype, device=a.device)
    prepare_gemm_nt(a, b, out, tile_m=tile_m, tile_n=tile_n, stages=stages)()
    return out


def compile_gemm_nt(target: str = "sm_90a", m: int = 256, n: int = 256, k: int = 256, *, tile_m: int = 128,
                    tile_n: int = 128, stages: int | None = None, dtype: str = "bf16", inflight: int = 1):
    """Compile :func:`gemm_nt`'s kernel without a GPU, for static M, N, K (sm_90a only).

    The kernel computes ``C (M x N) = A (M x K) @ B.T`` with B given as N x K.
    """
    check_target(target)
    if target != "sm_90a":
        raise ValueError(f"wgmma is Hopper-only: target must be 'sm_90a'; got {target!r}")
    check_choice("dtype", dtype, ("bf16", "fp16"))
    check_choice("inflight", inflight, (0, 1))
    if stages is None and (tile_m, tile_n) in TILE_SHAPES:
        stages = default_stages(tile_m, tile_n)
    tile_m, tile_n, stages = _check_config(tile_m, tile_n, stages)
    m, n, k = _check_shape(m, n, k, tile_m, tile_n)
    t = BFloat16 if dtype == "bf16" else Float16
    host = _gemm_host(tile_m, tile_n, stages, inflight)
    return compile_for(target, host, fake_tensor(t, (m, k), stride_order=(1, 0)),
                       fake_tensor(t, (n, k), stride_order=(1, 0)), fake_tensor(t, (m, n), stride_order=(1, 0)),
                       fake_stream())


# ---------------------------------------------------------------------------
# Reading the descriptors back out of the PTX
# ---------------------------------------------------------------------------


def ptx_desc_constants(compiled) -> list[int]:
    """The constant parts of the wgmma descriptors in ``compiled``'s PTX, as unsigned 64-bit ints.

    The DSL builds each descriptor at run time as ``(shared address >> 4) |
    constant``: the constant carries LBO, SBO and the swizzle mode, which are
    known when compiling. They appear as ``or.b64 %rd, %rd, <constant>;``.
    """
    import re

    from .compile import ptx_lines

    found: dict[int, None] = {}
    for line in ptx_lines(compiled, r"^or\.b64\s"):
        m = re.search(r",\s*(-?\d+);$", line)
        if m:
            v = int(m.group(1)) & ((1 << 64) - 1)
            if v >> 62 or (v >> 32) & 0x3FFF:  # a swizzle mode or an SBO: a descriptor, not an address mask
                found.setdefault(v, None)
    return list(found)


# ---------------------------------------------------------------------------
# The GEMM's structure, drawn; and its measurement against cuBLAS
# ---------------------------------------------------------------------------


def draw_gemm_roles(stages: int = 6, name: str = "06_gemm_roles") -> str:
    """The first GEMM's roles, ring and barriers as a diagram; returns the figure's path."""
    from matplotlib.patches import FancyBboxPatch

    from .figures import new_figure, save

    check_int("stages", stages, lo=2, hi=8)
    fig, ax = new_figure(figsize=(11, 4.6))

    def box(x, y, w, h, text, fc, fs=8.5, ec="#555555", pad=0.02):
        ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle=f"round,pad={pad}", fc=fc, ec=ec))
        ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=fs)

    def arrow(x0, y0, x1, y1, text="", color="#333333", dy=0.04):
        ax.annotate("", xy=(x1, y1), xytext=(x0, y0), arrowprops=dict(arrowstyle="->", color=color, lw=1.3))
        if text:
            ax.text((x0 + x1) / 2, (y0 + y1) / 2 + dy, text, ha="center", va="bottom", fontsize=7.5, color=color)

    box(0.0, 0.62, 0.16, 0.3, "global memory\nA: M x K\nB: N x K\n(K-major)", "#eeeeee")
    box(0.0, 0.05, 0.16, 0.25, "global memory\nC: M x N (BF16)", "#eeeeee")
    box(0.24, 0.62, 0.18, 0.3, "warp 4: producer\nwait empty[s]\narrive.expect_tx(full[s])\n2 x TMA load", "#dce6f2")
    w = 0.36 / stages
    for s in range(stages):
        box(0.47 + s * w + 0.005, 0.55, w - 0.02, 0.42, f"stage {s}\n\nA tile\nB tile", "#e2f0d9", fs=7, pad=0.005)
        ax.text(0.47 + s * w + w * 0.45, 0.5, f"full[{s}]\nempty[{s}]", ha="center", va="top", fontsize=6.5)
    box(0.4, 0.05, 0.43, 0.28, "warps 0-3: consumer warpgroup\nwait full[s], wgmma.fence,\n"
        "8 x wgmma (A, B by descriptor),\ncommit_group, wait_group 1,\narrive empty[s - 1]", "#fde0c5")
    box(0.865, 0.05, 0.135, 0.28, "registers:\nFP32 accumulator,\n128 per thread", "#f2dcdb", fs=7.5)
    arrow(0.16, 0.77, 0.24, 0.77, "TMA")
    arrow(0.42, 0.77, 0.47, 0.77)
    arrow(0.65, 0.55 - 0.13, 0.65, 0.33, "descriptors: tensor core reads smem", dy=0.0)
    arrow(0.83, 0.19, 0.87, 0.19)
    arrow(0.93, 0.04, 0.16, 0.12, "", color="#c0504d")
    ax.text(0.2, 0.15, "epilogue: cvt to BF16, st.global", fontsize=7.5, color="#c0504d")
    ax.set_xlim(-0.01, 1.01)
    ax.set_ylim(-0.05, 1.0)
    ax.axis("off")
    ax.set_title(f"The first Hopper GEMM: one CTA = one 128 x 128 tile of C, a ring of {stages} stages "
                 "(each A + B tile 128B-swizzled)", fontsize=10)
    return str(save(fig, name))


def wgmma_operands(compiled) -> list[dict]:
    """The operands of each distinct ``wgmma.mma_async`` in the PTX, named (registers renumber, so only counts).

    PTX: ``wgmma.mma_async.sync.aligned.shape.dtype.atype.btype {d0, ..., dN}, desc-a, desc-b, scale-d,
    imm-scale-a, imm-scale-b, imm-trans-a, imm-trans-b;``
    """
    import re

    from .compile import ptx_lines

    out, seen = [], set()
    for line in ptx_lines(compiled, r"^wgmma\.mma_async"):
        m = re.match(r"^(\S+)\s+\{([^}]*)\},\s*(.*?);?\s*$", line)
        if not m:
            continue
        tail = [t.strip() for t in m.group(3).split(",")]
        row = {"instruction": m.group(1), "accumulator registers": len(m.group(2).split(",")),
               "desc-a": "64-bit register" if tail[0].startswith("%rd") else tail[0],
               "desc-b": "64-bit register" if tail[1].startswith("%rd") else tail[1],
               "scale-d": "predicate (0: D = A*B, 1: D += A*B)" if not tail[2].isdigit() else tail[2],
               "imm-scale-a": tail[3], "imm-scale-b": tail[4], "imm-trans-a": tail[5], "imm-trans-b": tail[6]}
        key = tuple(row.items())
        if key not in seen:
            seen.add(key)
            out.append(row)
    return out
