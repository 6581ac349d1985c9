"""Chapter 09 (part 1): tensor memory (TMEM), the accumulator store of Blackwell's tensor cores.

What it teaches
    Every SM100 SM has 256 KiB of *tensor memory*: 128 **lanes** (rows) x 512
    **columns** of 32-bit cells. ``tcgen05.mma`` writes its accumulator there
    instead of into registers (Hopper's ``wgmma``), which frees the registers
    of the epilogue warps and lets MMA and epilogue overlap.

    * **Allocation** is by columns (all 128 lanes come with them), in powers of
      two from 32 to 512: ``tcgen05.alloc`` (one whole warp) writes the
      address of the allocation into shared memory. ``tcgen05.dealloc`` frees
      it; every allocation must be freed before the CTA exits.
      ``tcgen05.relinquish_alloc_permit``: the CTA gives up its right to
      allocate (the PTX ISA: a later ``tcgen05.alloc`` by it is illegal).
      What for is CUTLASS's word, not the ISA's: its kernels relinquish before
      their deallocations "so that the next CTA can rasterize", i.e. a CTA
      waiting to allocate (of the same kernel or another) may start.
    * A TMEM **address** is 32 bits: lane in bits 31-16, column in bits 15-0.
    * **Who may touch which lanes**: warp ``w`` of the CTA may access only
      lanes ``32*(w%4) .. 32*(w%4)+31``. An epilogue of one warpgroup (4 warps)
      covers all 128 lanes; a second warpgroup sees the same lanes again.
    * ``tcgen05.ld.sync.aligned.32x32b.xN`` (one warp): thread ``t`` receives
      lane ``base+t`` and ``N`` consecutive columns, register ``j`` holding
      column ``col+j`` (:func:`tmem_ld_32x32b_model`). With an M=128 MMA whose
      accumulator row ``i`` lives in lane ``i``, thread ``t`` of warp ``w``
      therefore owns row ``32*(w%4)+t`` of the tile: one row per thread.
      Row ``i`` in lane ``i`` holds for M = 128 on one CTA and for each CTA's
      128 rows of a pair's M = 256 (the PTX ISA's data-path layouts D and A),
      not for M = 64 on one CTA (16 rows in each warp's 32 lanes, layout F)
      nor for a pair's M = 128 (64 rows a CTA, layout B); the course uses
      neither, and :func:`accumulator_coords` models only the first two.
      ``tcgen05.ld`` is asynchronous: ``tcgen05.wait::ld`` waits until every
      load this thread issued has completed, which orders the tensor-memory
      reads before what follows (an arrive telling the MMA warp it may
      overwrite those columns, a dealloc). The course waits before using the
      registers; the PTX ISA does not forbid reading them earlier (NVIDIA's
      own DSL epilogues do), what it requires is the ordering.

What it adds over chapters 01-08
    A third memory next to registers and shared memory, owned by the tensor
    core and reached only through ``tcgen05`` instructions.

The code
    * CPU side: :func:`tmem_addr` / :func:`tmem_addr_fields`,
      :func:`warp_lanes`, :func:`check_alloc_columns`, :class:`TmemModel` (the
      column bookkeeping), :func:`tmem_ld_32x32b_model` and
      :func:`accumulator_coords` (who receives what), and the figure
      :func:`draw_tmem_ld`.
    * Device side: one wrapper per PTX instruction (``tmem_alloc``,
      ``tmem_relinquish_alloc_permit``, ``tmem_dealloc``, ``tmem_ld_32x32b``,
      ``tmem_wait_ld``, ``tcgen05_fence_before_thread_sync``,
      ``tcgen05_fence_after_thread_sync``), each with a ``cta_group``
      parameter where PTX has one. :data:`DSL_EQUIVALENTS` names the DSL's own
      operations (``cute.arch.alloc_tmem`` ...), which emit the same PTX.
    * :func:`run_tmem_alloc` (``sm100``): allocations of several sizes, the
      addresses the hardware returned.
"""
from __future__ import annotations

import functools

import numpy as np

import cutlass
import cutlass.cute as cute
import cuda.bindings.driver as cuda
from cutlass import Int32

from .checks import check_choice, check_int
from .compile import check_target, compile_for, fake_stream, fake_tensor, launcher
from .hardware import TMEM_COLUMNS, TMEM_LANES  # noqa: F401  (tensor memory per SM: 128 lanes x 512 columns of 32 bits)
from .tiers import require_tier

#: Smallest allocation (columns); allocations are powers of two from here to 512.
TMEM_MIN_ALLOC = 32
#: ``tcgen05.ld/st`` shapes ``32x32b.xN``: N = registers per thread = columns read.
LD_32X32B_NUMS = (1, 2, 4, 8, 16, 32, 64, 128)

# --------------------------------------------------------------------------------------
# Addresses, lanes, allocation rules (CPU)
# --------------------------------------------------------------------------------------


def tmem_addr(lane: int, column: int) -> int:
    """The 32-bit TMEM address of (``lane``, ``column``): lane in bits 31-16, column in 15-0."""
    check_int("lane", lane, lo=0, hi=TMEM_LANES - 1)
    check_int("column", column, lo=0, hi=TMEM_COLUMNS - 1)
    return (lane << 16) | column


def tmem_addr_fields(addr: int) -> tuple[int, int]:
    """``(lane, column)`` of a TMEM address (the inverse of :func:`tmem_addr`)."""
    check_int("addr", addr, lo=0, hi=0xFFFFFFFF)
    lane, column = addr >> 16, addr & 0xFFFF
    if lane >= TMEM_LANES or column >= TMEM_COLUMNS:
        raise ValueError(f"addr must hold a lane 0..{TMEM_LANES - 1} in bits 31-16 and a column "
                         f"0..{TMEM_COLUMNS - 1} in bits 15-0; got {addr:#x} (lane {lane}, column {column})")
    return lane, column


def warp_lanes(warp: int) -> range:
    """The TMEM lanes warp ``warp`` of a CTA may access: ``32*(warp%4)`` .. ``+31``.

    The hardware splits the 128 lanes into four sub-partitions of 32, one per
    SM sub-partition (scheduler); a warp is tied to the sub-partition
    ``warp % 4`` and can only reach its lanes.
    """
    check_int("warp", warp, lo=0, hi=31)
    base = 32 * (warp % 4)
    return range(base, base + 32)


def check_alloc_columns(ncols, name: str = "ncols") -> int:
    """``ncols`` is a valid ``tcgen05.alloc`` size: a power of two in 32..512."""
    check_int(name, ncols, lo=TMEM_MIN_ALLOC, hi=TMEM_COLUMNS, power_of_two=True)
    return ncols


def alloc_columns_for(n: int) -> int:
    """The smallest valid allocation holding ``n`` fp32 accumulator columns."""
    check_int("n", n, lo=1, hi=TMEM_COLUMNS)
    cols = TMEM_MIN_ALLOC
    while cols < n:
        cols *= 2
    return cols


class TmemModel:
    """Column bookkeeping of one SM's tensor memory (a CPU model).

    ``alloc(ncols)`` returns the lowest free column range of that size aligned
    to its size, or ``None`` where the hardware ``tcgen05.alloc`` would *block*
    until another CTA frees columns (which is why a CTA that will not allocate
    again relinquishes its permit). The real allocator may pick other columns:
    tests on the GPU only rely on "in range, lane 0, disjoint".
    """

    def __init__(self):
        self.used = np.zeros(TMEM_COLUMNS, dtype=bool)
        self.allocations: dict[int, int] = {}  # start column -> ncols

    def alloc(self, ncols: int) -> int | None:
        check_alloc_columns(ncols)
        for start in range(0, TMEM_COLUMNS, ncols):
            if not self.used[start:start + ncols].any():
                self.used[start:start + ncols] = True
                self.allocations[start] = ncols
                return tmem_addr(0, start)
        return None

    def dealloc(self, addr: int, ncols: int) -> None:
        check_alloc_columns(ncols)
        lane, start = tmem_addr_fields(addr)
        if lane != 0 or self.allocations.get(start) != ncols:
            raise ValueError(f"no allocation of {ncols} columns at address {addr:#x}")
        del self.allocations[start]
        self.used[start:start + ncols] = False

    @property
    def free_columns(self) -> int:
        return int((~self.used).sum())


# --------------------------------------------------------------------------------------
# tcgen05.ld 32x32b: which thread receives which cell
# --------------------------------------------------------------------------------------


def tmem_ld_32x32b_model(num: int) -> np.ndarray:
    """Who receives what in ``tcgen05.ld.sync.aligned.32x32b.x{num}`` (one warp).

    Returns an int array of shape ``(32, num, 2)``: ``[t, j] = (lane offset,
    column offset)`` of the cell that lands in register ``j`` of thread ``t``,
    relative to the address the warp passed (its lane base and first column).
    For this shape it is ``(t, j)``: 32 lanes, one per thread, ``num``
    consecutive 32-bit columns per thread.
    """
    check_choice("num", num, LD_32X32B_NUMS)
    out = np.zeros((32, num, 2), dtype=np.int64)
    out[:, :, 0] = np.arange(32)[:, None]
    out[:, :, 1] = np.arange(num)[None, :]
    return out


def accumulator_coords(warp: int, num: int, col0: int = 0) -> np.ndarray:
    """``(row, column)`` of the M=128 accumulator held by register ``j`` of thread ``t``.

    Warp ``warp`` loads with ``tcgen05.ld 32x32b.x{num}`` from address
    ``tmem_base + (32*(warp%4) << 16) + col0``. An M=128 ``cta_group::1`` MMA
    (and each CTA's half of an M=256 ``cta_group::2`` MMA) keeps row ``i`` of
    D in lane ``i`` and column ``n`` in column ``n`` of the allocation, so the
    lane is the row. Shape ``(32, num, 2)``.
    """
    check_choice("num", num, LD_32X32B_NUMS)
    lanes = warp_lanes(warp)
    check_int("col0", col0, lo=0, hi=TMEM_COLUMNS - num)
    out = tmem_ld_32x32b_model(num)
    out[:, :, 0] += lanes.start
    out[:, :, 1] += col0
    return out


def registers_to_tile(regs: np.ndarray, num: int) -> np.ndarray:
    """Place the registers of a 128-thread epilogue into the (128, N) accumulator tile.

    ``regs[tid, c*num + j]`` is register ``j`` of thread ``tid`` after the
    ``c``-th ``32x32b.x{num}`` load (columns ``c*num ..``). Uses only the model
    (:func:`accumulator_coords`), so a wrong model scrambles the tile.
    Works on numpy arrays and torch tensors.
    """
    check_choice("num", num, LD_32X32B_NUMS)
    if len(getattr(regs, "shape", ())) != 2:
        raise ValueError(f"regs must be a 2-D array (128 threads x registers); got shape {getattr(regs, 'shape', None)}")
    rows, n = regs.shape
    check_int("regs.shape[0]", rows, lo=128, hi=128)
    check_int("regs.shape[1]", n, lo=num, multiple_of=num)
    tile = regs.new_zeros(regs.shape) if hasattr(regs, "new_zeros") else np.zeros_like(regs)
    for w in range(4):
        for c in range(n // num):
            coords = accumulator_coords(w, num, c * num)
            for t in range(32):
                r = coords[t, :, 0]
                cols = coords[t, :, 1]
                tile[r[0], cols[0]:cols[-1] + 1] = regs[32 * w + t, c * num:(c + 1) * num]
    return tile


def draw_tmem_ld(num: int = 4, name: str = "09_tmem_ld_32x32b"):
    """TMEM as seen by one warpgroup's ``tcgen05.ld 32x32b.x{num}``: who gets which cell.

    Left: the 128 x 512 grid, lanes coloured by the warp (``w % 4``) allowed to
    touch them. Right: warp 1's view, zoomed: each cell shows ``t{thread}/r{reg}``.
    Returns ``(path, data)``; ``data["owner"]`` is the (128, num) warp index
    of each cell of the first ``num`` columns, ``data["thread"]`` and
    ``data["reg"]`` say which thread/register receives it.
    """
    from matplotlib.patches import Rectangle

    from .figures import new_figure, save

    owner = np.zeros((TMEM_LANES, num), dtype=np.int64)
    thread = np.zeros_like(owner)
    reg = np.zeros_like(owner)
    for w in range(4):
        coords = accumulator_coords(w, num)
        for t in range(32):
            for j in range(num):
                lane, col = coords[t, j]
                owner[lane, col] = w
                thread[lane, col] = 32 * w + t
                reg[lane, col] = j

    colors = ["#8FB9E3", "#F2B880", "#9ED39E", "#E3A0C8"]
    fig, (ax0, ax1) = new_figure(1, 2, figsize=(12, 5.2), gridspec_kw={"width_ratios": [1.25, 1]})
    for w in range(4):
        ax0.add_patch(Rectangle((0, 32 * w), TMEM_COLUMNS, 32, facecolor=colors[w], edgecolor="black", lw=0.6))
        ax0.text(TMEM_COLUMNS / 2, 32 * w + 16, f"lanes {32 * w}-{32 * w + 31}: warps {w}, {w + 4}, {w + 8}, ...",
                 ha="center", va="center", fontsize=9)
    ax0.add_patch(Rectangle((0, 0), num * 8, TMEM_LANES, fill=False, edgecolor="red", lw=1.5, ls="--"))
    ax0.text(num * 8 + 4, 126, f"x{num}: columns 0-{num - 1}\n(widened to be seen)", color="red", fontsize=8,
             va="bottom")
    ax0.set_xlim(0, TMEM_COLUMNS)
    ax0.set_ylim(TMEM_LANES, 0)
    ax0.set_xlabel("column (32-bit cells)")
    ax0.set_ylabel("lane")
    ax0.set_xticks([0, 128, 256, 384, 512])
    ax0.set_yticks([0, 32, 64, 96, 128])
    ax0.set_title("tensor memory: 128 lanes x 512 columns per SM")

    lanes_shown = 8
    w = 1
    for i in range(lanes_shown):
        for j in range(num):
            lane = 32 * w + i
            ax1.add_patch(Rectangle((j, i), 1, 1, facecolor=colors[w], edgecolor="black", lw=0.6))
            ax1.text(j + 0.5, i + 0.5, f"t{thread[lane, j] % 32}/r{reg[lane, j]}", ha="center", va="center",
                     fontsize=8)
    ax1.set_xlim(0, num)
    ax1.set_ylim(lanes_shown + 0.6, 0)
    ax1.text(num / 2, lanes_shown + 0.35, "... down to lane 63 (thread 31)", ha="center", fontsize=8)
    ax1.set_xticks(np.arange(num) + 0.5)
    ax1.set_xticklabels([f"col {j}" for j in range(num)], fontsize=8)
    ax1.set_yticks(np.arange(lanes_shown) + 0.5)
    ax1.set_yticklabels([f"lane {32 * w + i}" for i in range(lanes_shown)], fontsize=8)
    ax1.set_title(f"warp 1, tcgen05.ld 32x32b.x{num}: thread t / register r")
    return save(fig, name), {"owner": owner, "thread": thread, "reg": reg}


# --------------------------------------------------------------------------------------
# One wrapper per PTX instruction
# --------------------------------------------------------------------------------------


def _group(cta_group: int) -> str:
    if cta_group not in (1, 2):
        raise ValueError(f"cta_group must be 1 or 2; got {cta_group!r}")
    return f"cta_group::{cta_group}"


def tmem_alloc(dst, ncols: int, cta_group: int = 1):
    """``tcgen05.alloc``: a whole warp allocates ``ncols`` columns; the address lands in shared memory.

    ``dst`` is a shared-memory pointer to an ``Int32``. The result is written
    asynchronously to shared memory, so readers need
    ``tcgen05.fence::before_thread_sync`` / bar.sync / ``after_thread_sync``.
    With ``cta_group=2`` one warp in *each* CTA of the pair executes it and
    both get the same columns (the pair's MMA writes both CTAs' TMEM).
    """
    check_alloc_columns(ncols)
    cute.arch.inline_ptx(
        f"tcgen05.alloc.{_group(cta_group)}.sync.aligned.shared::cta.b32 [{{$r0}}], {{$r1}};",
        read_only_args=[dst, Int32(ncols)],
    )


def tmem_relinquish_alloc_permit(cta_group: int = 1):
    """``tcgen05.relinquish_alloc_permit``: this CTA gives up the right to allocate (one warp; a later alloc is illegal)."""
    cute.arch.inline_ptx(f"tcgen05.relinquish_alloc_permit.{_group(cta_group)}.sync.aligned;")


def tmem_dealloc(taddr, ncols: int, cta_group: int = 1):
    """``tcgen05.dealloc``: free ``ncols`` columns at ``taddr`` (one warp, the same size as allocated)."""
    check_alloc_columns(ncols)
    cute.arch.inline_ptx(
        f"tcgen05.dealloc.{_group(cta_group)}.sync.aligned.b32 {{$r0}}, {{$r1}};",
        read_only_args=[Int32(taddr), Int32(ncols)],
    )


def tmem_ld_32x32b(taddr, num: int):
    """``tcgen05.ld.sync.aligned.32x32b.x{num}.b32``: one warp reads 32 lanes x ``num`` columns.

    ``taddr`` must name the warp's own lane quarter (:func:`warp_lanes`).
    Returns ``num`` ``Float32`` values (register ``j`` = column ``col+j`` of
    lane ``base+t``). The load is asynchronous: call :func:`tmem_wait_ld`
    before using them.
    """
    check_choice("num", num, LD_32X32B_NUMS)
    regs = ", ".join(f"{{$w{j}}}" for j in range(num))
    out = cute.arch.inline_ptx(
        f"tcgen05.ld.sync.aligned.32x32b.x{num}.b32 {{{regs}}}, [{{$r0}}];",
        write_only_types=[cutlass.Float32] * num,
        read_only_args=[Int32(taddr)],
    )
    return (out,) if num == 1 else tuple(out)


def tmem_wait_ld():
    """``tcgen05.wait::ld``: every ``tcgen05.ld`` this thread issued has landed in registers."""
    cute.arch.inline_ptx("tcgen05.wait::ld.sync.aligned;")


def tcgen05_fence_before_thread_sync():
    """``tcgen05.fence::before_thread_sync``: order this thread's earlier tcgen05 ops before a sync.

    Place it before a bar.sync / mbarrier arrive / cluster barrier that tells
    another thread "my tcgen05 work (alloc, ld, ...) is done".
    """
    cute.arch.inline_ptx("tcgen05.fence::before_thread_sync;")


def tcgen05_fence_after_thread_sync():
    """``tcgen05.fence::after_thread_sync``: order later tcgen05 ops after a sync just waited on.

    Place it after the bar.sync / mbarrier wait, before the tcgen05 op (ld,
    mma, dealloc) that depends on what the other thread did.
    """
    cute.arch.inline_ptx("tcgen05.fence::after_thread_sync;")


#: Our wrapper -> the DSL operation chapter 10 calls instead (same PTX underneath).
DSL_EQUIVALENTS = {
    "tmem_alloc": "cute.arch.alloc_tmem(ncols, smem_ptr, is_two_cta=...)",
    "tmem_relinquish_alloc_permit": "cute.arch.relinquish_tmem_alloc_permit(is_two_cta=...)",
    "tmem_dealloc": "cute.arch.dealloc_tmem(tmem_ptr, ncols, is_two_cta=...)",
    "tmem_ld_32x32b": "cute.copy(tcgen05.make_tmem_copy(Ld32x32bOp(Repetition.xN)), ...)",
    "tmem_wait_ld": "cute.arch.fence_view_async_tmem_load()",
    "tcgen05_fence_before_thread_sync": "(not in cute.arch 4.8.1; cutlass.experimental has tcgen05_fence)",
    "tcgen05_fence_after_thread_sync": "(not in cute.arch 4.8.1; cutlass.experimental has tcgen05_fence)",
}


# --------------------------------------------------------------------------------------
# Allocation on the GPU: where did the columns go?
# --------------------------------------------------------------------------------------

ALLOC_THREADS = 128


@cute.kernel
def alloc_kernel(out: cute.Tensor, sizes: cutlass.Constexpr):
    """Warp 0 allocates ``sizes[0]``, ``sizes[1]``, ... columns, records each address, frees them all.

    ``out[i]`` = the address of allocation ``i``. Every thread reads the
    addresses back after the fence / bar.sync / fence sequence the PTX
    memory model asks for between ``tcgen05.alloc`` and a reader.
    """
    smem = cutlass.memory.SmemAllocator()
    holders = smem.allocate_array(Int32, len(sizes))
    held = cute.make_tensor(holders, cute.make_layout(len(sizes)))
    warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
    tidx, _, _ = cute.arch.thread_idx()
    if warp == 0:
        for i in cutlass.range_constexpr(len(sizes)):
            tmem_alloc(holders + i, sizes[i])
        tmem_relinquish_alloc_permit()
    tcgen05_fence_before_thread_sync()
    cute.arch.barrier()
    tcgen05_fence_after_thread_sync()
    if tidx < len(sizes):
        out[tidx] = held[tidx]
    cute.arch.barrier()
    if warp == 0:
        for i in cutlass.range_constexpr(len(sizes)):
            tmem_dealloc(held[i], sizes[i])


@functools.lru_cache(maxsize=None)
def _alloc_host(sizes: tuple):
    @cute.jit
    def alloc_host(out: cute.Tensor, stream: cuda.CUstream):
        alloc_kernel(out, sizes).launch(grid=(1, 1, 1), block=(ALLOC_THREADS, 1, 1), stream=stream)

    return alloc_host


def _check_sizes(sizes) -> tuple:
    sizes = tuple(sizes)
    if not 1 <= len(sizes) <= 8:
        raise ValueError(f"sizes must hold 1 to 8 allocation sizes; got {len(sizes)}")
    for i, s in enumerate(sizes):
        check_alloc_columns(s, f"sizes[{i}]")
    if sum(sizes) > TMEM_COLUMNS:
        raise ValueError(f"sizes must add up to at most {TMEM_COLUMNS} columns; got {sum(sizes)}")
    return sizes


def compile_alloc(target: str = "sm_100a", sizes=(128, 64)):
    """Compile :func:`alloc_kernel` for ``target`` without a GPU (read ``.__ptx__``)."""
    check_target(target)
    sizes = _check_sizes(sizes)
    return compile_for(target, _alloc_host(sizes), fake_tensor(Int32, (len(sizes),)), fake_stream())


def run_tmem_alloc(sizes=(128, 64, 32)) -> list[int]:
    """Allocate ``sizes`` columns one after the other on the GPU; return the addresses."""
    sizes = _check_sizes(sizes)
    require_tier("sm100", "gemmlab.tmem.run_tmem_alloc")
    import torch

    out = torch.full((len(sizes),), -1, dtype=torch.int32, device="cuda")  # poisoned
    launcher(_alloc_host(sizes), out)()
    torch.cuda.synchronize()
    return [v & 0xFFFFFFFF for v in out.tolist()]


def check_alloc_addresses(addrs, sizes) -> list[str]:
    """Problems with hardware-returned addresses: lane 0, in range, disjoint. ``[]`` if none."""
    problems = []
    spans = []
    for a, n in zip(addrs, sizes):
        lane, col = tmem_addr_fields(a)
        if lane != 0:
            problems.append(f"address {a:#x}: lane field {lane}, expected 0")
        if col + n > TMEM_COLUMNS:
            problems.append(f"address {a:#x}: columns {col}..{col + n - 1} run past {TMEM_COLUMNS}")
        spans.append((col, col + n))
    spans.sort()
    for (s0, e0), (s1, e1) in zip(spans, spans[1:]):
        if s1 < e0:
            problems.append(f"allocations [{s0},{e0}) and [{s1},{e1}) overlap")
    return problems
