"""Chapter 01: ``ldmatrix`` and ``stmatrix``, the warp-wide 8x8 fragment moves.

What this teaches
-----------------
``ldmatrix.sync.aligned.m8n8.{x1,x2,x4}{.trans}.shared.b16`` loads one, two or
four 8x8 matrices of 16-bit elements from shared memory into the registers of
a whole warp, already laid out the way the ``mma`` tensor-core instructions
want their operands. ``stmatrix`` (sm_90+) is the same move backwards. Two
maps describe them, and :func:`ldmatrix_model` / :func:`stmatrix_model` are
those maps written in numpy:

* who supplies the addresses: each matrix row is 16 contiguous bytes (8
  elements) starting at a 16-byte aligned address, and lane ``8*m + r``
  supplies the address of row ``r`` of matrix ``m``. With ``.x1`` only lanes
  0-7 are read, with ``.x2`` lanes 0-15, with ``.x4`` all 32. Rows need not be
  contiguous: each is its own address.
* who receives the data: register ``m`` of every lane holds two elements of
  matrix ``m``. Lane ``l`` holds row ``l // 4``, columns ``2*(l % 4)`` (low 16
  bits) and ``2*(l % 4) + 1`` (high 16 bits): four lanes share a row. With
  ``.trans`` the matrix is read column-major: lane ``l`` then holds column
  ``l // 4``, rows ``2*(l % 4)`` (low) and ``2*(l % 4) + 1`` (high).

Compared with chapter 01's plain ``ld.shared``, one ``ldmatrix.x4`` replaces
four 4-byte loads per lane plus the shuffles that would put the pieces where
the tensor core expects them. The GPU functions here check both maps on the
hardware element by element. Later chapters use the DSL's copy atoms
(``cute.nvgpu.warp.LdMatrix8x8x16bOp`` / ``StMatrix8x8x16bOp``), which emit
exactly these instructions; this module is how to read what they do.
"""
from __future__ import annotations

import functools

import numpy as np

import cutlass
import cutlass.cute as cute
import cuda.bindings.driver as cuda
from cutlass import Int32

from .checks import check_choice
from .ldst import ld_global_b32, ld_global_v4, ld_shared_v4, st_global_b32, st_global_v4, st_shared_v4

NUMS = (1, 2, 4)
#: The test tile: 32 rows of 16 bytes (8 x 16-bit elements) in shared memory.
ROWS, ROW_ELEMS = 32, 8
#: The row each lane points at in the GPU runs: a permutation (7 is odd), so
#: the check also proves that rows are gathered by address, not by position.
LANE_ROWS = np.array([(7 * lane + 3) % ROWS for lane in range(32)], dtype=np.int32)
#: What ``stmatrix`` runs write over shared memory first: rows it must not touch keep it.
POISON16 = 0x7F7F


# --- the model ---------------------------------------------------------------

def _check_num_trans(num, trans):
    check_choice("num", num, NUMS)
    if not isinstance(trans, bool):
        raise TypeError(f"trans must be a bool; got {type(trans).__name__}")


def fragment_position(lane: int, half: int, trans: bool) -> tuple[int, int]:
    """(row, col) inside its 8x8 matrix of the element that ``lane`` holds in ``half`` (0 low, 1 high)."""
    group, pair = lane // 4, lane % 4
    if trans:
        return 2 * pair + half, group
    return group, 2 * pair + half


def owners(num: int, trans: bool) -> np.ndarray:
    """``owner[m, r, c] = (lane, register, half)`` holding element (r, c) of matrix m."""
    _check_num_trans(num, trans)
    out = np.zeros((num, 8, 8, 3), dtype=np.int32)
    for m in range(num):
        for lane in range(32):
            for half in range(2):
                r, c = fragment_position(lane, half, trans)
                out[m, r, c] = (lane, m, half)
    return out


def address_lane(m: int, r: int) -> int:
    """The lane whose address operand gives row ``r`` of matrix ``m``."""
    return 8 * m + r


def _check_smem(name: str, smem) -> np.ndarray:
    """Shared memory as a 1-D uint16 array of whole 16-byte rows (the values must fit in 16 bits)."""
    arr = np.asarray(smem)
    if arr.ndim != 1 or arr.size == 0 or arr.size % ROW_ELEMS or arr.dtype.kind not in "iu":
        raise ValueError(f"{name} must be a 1-D integer array of whole {ROW_ELEMS}-element rows (uint16 values); "
                         f"got {arr.dtype} of shape {arr.shape}")
    if arr.min() < 0 or arr.max() > 0xFFFF:
        raise ValueError(f"{name} must hold 16-bit values (0..65535); got values from {arr.min()} to {arr.max()}")
    return arr.astype(np.uint16)


def _check_rows(rows, num: int, smem_rows: int) -> np.ndarray:
    """``rows``: one row index per lane (32 entries); the rows lanes ``0 .. 8*num-1`` name must lie in ``smem``."""
    arr = np.asarray(rows)
    if arr.shape != (32,) or arr.dtype.kind not in "iu":
        raise ValueError(f"rows must be a 1-D integer array with one row per lane (32 entries); "
                         f"got {arr.dtype} of shape {arr.shape}")
    used = arr[:8 * num]
    bad = np.flatnonzero((used < 0) | (used >= smem_rows))
    if bad.size:
        lane = int(bad[0])
        raise ValueError(f"rows[lane] must be a row of smem, 0..{smem_rows - 1} (16-byte rows), for the lanes "
                         f"0..{8 * num - 1} that x{num} reads; lane {lane} has {int(used[lane])}")
    return arr


def _matrices_from_smem(smem: np.ndarray, rows: np.ndarray, num: int) -> np.ndarray:
    """The ``num`` 8x8 matrices that lanes' row addresses select (rows in 16-byte units)."""
    mats = np.zeros((num, 8, 8), dtype=np.uint16)
    for m in range(num):
        for r in range(8):
            start = int(rows[address_lane(m, r)]) * ROW_ELEMS
            mats[m, r] = smem[start:start + ROW_ELEMS]
    return mats


def ldmatrix_model(smem, rows, num: int, trans: bool) -> np.ndarray:
    """What ``ldmatrix...x{num}{.trans}.shared.b16`` leaves in the warp's registers.

    ``smem``: shared memory as a 1-D array of uint16. ``rows[lane]``: the row
    (in 16-byte units from the start of ``smem``) that lane's address points
    at. Returns ``regs[lane, m]`` (uint32): low 16 bits the first element of
    the pair, high 16 bits the second.
    """
    _check_num_trans(num, trans)
    smem = _check_smem("smem", smem)
    mats = _matrices_from_smem(smem, _check_rows(rows, num, smem.size // ROW_ELEMS), num)
    regs = np.zeros((32, num), dtype=np.uint32)
    for lane in range(32):
        for m in range(num):
            lo = mats[m][fragment_position(lane, 0, trans)]
            hi = mats[m][fragment_position(lane, 1, trans)]
            regs[lane, m] = np.uint32(lo) | (np.uint32(hi) << np.uint32(16))
    return regs


def stmatrix_model(regs, rows, num: int, trans: bool, smem) -> np.ndarray:
    """Shared memory (uint16) after ``stmatrix...x{num}{.trans}.shared.b16`` over ``smem``.

    ``regs[lane, m]``: the warp's registers (uint32). ``rows[lane]``: the row
    each lane's address points at (16-byte units). The exact inverse of
    :func:`ldmatrix_model` on the rows it writes; every other byte is kept.
    """
    _check_num_trans(num, trans)
    out = _check_smem("smem", smem).copy()
    rows = _check_rows(rows, num, out.size // ROW_ELEMS)
    regs = np.asarray(regs)
    if regs.shape != (32, num) or regs.dtype.kind not in "iu":
        raise ValueError(f"regs must be an integer array of shape (32, {num}): lanes x registers; "
                         f"got {regs.dtype} of shape {regs.shape}")
    if regs.min() < 0 or regs.max() > 0xFFFFFFFF:
        raise ValueError(f"regs must hold 32-bit values; got values from {regs.min()} to {regs.max()}")
    regs = regs.astype(np.uint32)
    for m in range(num):
        mat = np.zeros((8, 8), dtype=np.uint16)
        for lane in range(32):
            mat[fragment_position(lane, 0, trans)] = regs[lane, m] & 0xFFFF
            mat[fragment_position(lane, 1, trans)] = regs[lane, m] >> 16
        for r in range(8):
            start = int(rows[address_lane(m, r)]) * ROW_ELEMS
            out[start:start + ROW_ELEMS] = mat[r]
    return out


# --- the figure --------------------------------------------------------------

def fragment_figure(num: int = 4, name: str = "01_ldmatrix_fragments"):
    """Draw which lane holds each element, plain and ``.trans``; return (path, owners plain, owners trans).

    One panel per matrix; a cell shows ``T<lane>`` and ``lo``/``hi`` (which
    half of register ``m`` it lands in), coloured by lane. The left margin
    names the lane that supplies each row's address.
    """
    import matplotlib
    from matplotlib.colors import ListedColormap

    from .figures import new_figure, save

    maps = {t: owners(num, t) for t in (False, True)}
    fig, axes = new_figure(2, num, figsize=(3.3 * num + 0.6, 7.0), squeeze=False)
    # 32 distinguishable colours, one per lane.
    cmap = ListedColormap(list(matplotlib.colormaps["tab20"].colors) + list(matplotlib.colormaps["tab20b"].colors)[:12])
    for row, trans in enumerate((False, True)):
        for m in range(num):
            ax = axes[row][m]
            own = maps[trans][m]
            lanes = own[..., 0]
            ax.imshow(lanes, cmap=cmap, vmin=-0.5, vmax=31.5, alpha=0.55)
            for r in range(8):
                for c in range(8):
                    lane, _, half = own[r, c]
                    ax.text(c, r, f"T{lane}\n{'hi' if half else 'lo'}", ha="center", va="center", fontsize=6.5)
            ax.set_xticks(range(8))
            ax.set_yticks(range(8))
            ax.set_yticklabels([f"T{address_lane(m, r)}\u2192r{r}" for r in range(8)], fontsize=7)
            ax.tick_params(axis="x", labelsize=7)
            kind = ".trans" if trans else ""
            ax.set_title(f"x{num}{kind}: matrix {m} \u2192 register {m}", fontsize=9)
            ax.set_xlabel("column (element in the 16-byte row)", fontsize=7)
    fig.suptitle("ldmatrix.m8n8.b16: who supplies each row address (left) and who receives each element",
                 fontsize=10)
    fig.tight_layout()
    return save(fig, name), maps[False], maps[True]


# --- the GPU kernels -----------------------------------------------------------

def ldmatrix_ptx(num: int, trans: bool) -> str:
    """The PTX string: ``num`` write-only registers, one read-only 32-bit shared address."""
    regs = "{" + ", ".join("{$w%d}" % i for i in range(num)) + "}"
    return f"ldmatrix.sync.aligned.m8n8.x{num}{'.trans' if trans else ''}.shared.b16 {regs}, [{{$r0}}];"


def stmatrix_ptx(num: int, trans: bool) -> str:
    """The PTX string: the 32-bit shared address, then ``num`` read-only registers."""
    regs = "{" + ", ".join("{$r%d}" % (i + 1) for i in range(num)) + "}"
    return f"stmatrix.sync.aligned.m8n8.x{num}{'.trans' if trans else ''}.shared.b16 [{{$r0}}], {regs};"


def ldmatrix(row_ptr, num: int, trans: bool) -> tuple:
    """Warp-wide ``ldmatrix``: this lane's row address in, this lane's ``num`` registers out."""
    out = cute.arch.inline_ptx(ldmatrix_ptx(num, trans), write_only_types=[Int32] * num, read_only_args=[row_ptr])
    return (out,) if num == 1 else out


def stmatrix(row_ptr, regs: tuple, num: int, trans: bool) -> None:
    """Warp-wide ``stmatrix``: this lane's row address and its ``num`` registers."""
    cute.arch.inline_ptx(stmatrix_ptx(num, trans), read_only_args=[row_ptr, *regs])


@cute.kernel
def ldmatrix_kernel(tile: cute.Tensor, rows: cute.Tensor, out: cute.Tensor,
                    num: cutlass.Constexpr, trans: cutlass.Constexpr):
    """One warp: tile (global) -> shared memory -> ldmatrix -> out[lane, m] (global)."""
    lane, _, _ = cute.arch.thread_idx()
    smem = cutlass.memory.SmemAllocator()
    buf = smem.allocate_array(Int32, ROWS * 4, byte_alignment=16)  # 32 rows x 16 bytes
    # Each lane fills one 16-byte row: a v4 load from global, a v4 store to shared.
    a, b, c, d = ld_global_v4(tile.iterator + lane * 4)
    st_shared_v4(buf + lane * 4, a, b, c, d)
    cute.arch.sync_threads()  # every row written before any lane reads others' rows

    row = ld_global_b32(rows.iterator + lane)  # the row this lane points at
    regs = ldmatrix(buf + row * 4, num, trans)
    for m in cutlass.range_constexpr(num):
        st_global_b32(out.iterator + lane * num + m, regs[m])


@cute.kernel
def stmatrix_kernel(regs_in: cute.Tensor, rows: cute.Tensor, out: cute.Tensor,
                    num: cutlass.Constexpr, trans: cutlass.Constexpr):
    """One warp: poison shared memory, regs_in[lane, m] -> stmatrix -> all of shared memory -> out."""
    lane, _, _ = cute.arch.thread_idx()
    smem = cutlass.memory.SmemAllocator()
    buf = smem.allocate_array(Int32, ROWS * 4, byte_alignment=16)
    poison = Int32(POISON16 | (POISON16 << 16))
    st_shared_v4(buf + lane * 4, poison, poison, poison, poison)
    cute.arch.sync_threads()

    row = ld_global_b32(rows.iterator + lane)
    regs = []
    for m in cutlass.range_constexpr(num):
        regs.append(ld_global_b32(regs_in.iterator + lane * num + m))
    stmatrix(buf + row * 4, regs, num, trans)
    cute.arch.sync_threads()  # every lane's rows stored before anyone copies them out

    a, b, c, d = ld_shared_v4(buf + lane * 4)
    st_global_v4(out.iterator + lane * 4, a, b, c, d)


@functools.lru_cache(maxsize=None)
def ldmatrix_host(num: int, trans: bool):
    """``@cute.jit`` launch of :func:`ldmatrix_kernel` with (num, trans) baked in: one warp, one CTA."""

    @cute.jit
    def host(tile: cute.Tensor, rows: cute.Tensor, out: cute.Tensor, stream: cuda.CUstream):
        ldmatrix_kernel(tile, rows, out, num, trans).launch(grid=(1, 1, 1), block=(32, 1, 1), stream=stream)

    return host


@functools.lru_cache(maxsize=None)
def stmatrix_host(num: int, trans: bool):
    """``@cute.jit`` launch of :func:`stmatrix_kernel` with (num, trans) baked in."""

    @cute.jit
    def host(regs_in: cute.Tensor, rows: cute.Tensor, out: cute.Tensor, stream: cuda.CUstream):
        stmatrix_kernel(regs_in, rows, out, num, trans).launch(grid=(1, 1, 1), block=(32, 1, 1), stream=stream)

    return host


def compile_ldmatrix(target: str, num: int = 4, trans: bool = False):
    """Compile the ldmatrix test kernel for ``target`` (no GPU needed)."""
    from .compile import check_target, compile_for, fake_stream, fake_tensor

    check_target(target)
    _check_num_trans(num, trans)
    return compile_for(target, ldmatrix_host(num, trans), fake_tensor(Int32, (ROWS * 4,)),
                       fake_tensor(Int32, (32,)), fake_tensor(Int32, (32 * num,)), fake_stream())


def compile_stmatrix(target: str, num: int = 4, trans: bool = False):
    """Compile the stmatrix test kernel for ``target`` (``stmatrix`` needs sm_90 or later)."""
    from .compile import check_target, compile_for, fake_stream, fake_tensor

    check_target(target)
    _check_num_trans(num, trans)
    return compile_for(target, stmatrix_host(num, trans), fake_tensor(Int32, (32 * num,)),
                       fake_tensor(Int32, (32,)), fake_tensor(Int32, (ROWS * 4,)), fake_stream())


def _u16_tile(tile):
    if tile is None:
        return np.arange(ROWS * ROW_ELEMS, dtype=np.uint16)  # element value = its index
    tile = np.asarray(tile)
    if tile.dtype != np.uint16 or tile.shape != (ROWS * ROW_ELEMS,):
        raise ValueError(f"tile must be a uint16 array of shape ({ROWS * ROW_ELEMS},); got {tile.dtype} {tile.shape}")
    return tile


def run_ldmatrix(num: int = 4, trans: bool = False, tile=None) -> np.ndarray:
    """Run ``ldmatrix`` on the GPU; return the registers it produced, ``regs[lane, m]`` (uint32).

    Shared memory holds ``tile`` (256 uint16; default: element value = its
    index) as 32 rows of 8; lane ``l`` points at row ``LANE_ROWS[l]``.
    Compare with ``ldmatrix_model(tile, LANE_ROWS, num, trans)``.
    """
    import torch

    from .compile import launcher
    from .tiers import require_tier

    _check_num_trans(num, trans)
    tile = _u16_tile(tile)
    require_tier("gpu", "gemmlab.ldmatrix.run_ldmatrix")
    tile_d = torch.from_numpy(tile.view(np.int32).copy()).cuda()
    rows_d = torch.from_numpy(LANE_ROWS.copy()).cuda()
    out = torch.full((32 * num,), -0x21524111, dtype=torch.int32, device="cuda")  # 0xDEADBEEF poison
    launcher(ldmatrix_host(num, trans), tile_d, rows_d, out)()
    torch.cuda.synchronize()
    return out.cpu().numpy().view(np.uint32).reshape(32, num)


def run_stmatrix(num: int = 4, trans: bool = False, regs=None) -> np.ndarray:
    """Run ``stmatrix`` on the GPU; return the whole 512-byte shared tile it left (256 uint16).

    ``regs[lane, m]`` (uint32; default: a pattern whose halves name lane,
    register and half) are the warp's registers; lane ``l`` points at row
    ``LANE_ROWS[l]``; shared memory starts as ``POISON16``. Compare with
    ``stmatrix_model(regs, LANE_ROWS, num, trans, poisoned)``.
    """
    import torch

    from .compile import launcher
    from .tiers import require_tier

    _check_num_trans(num, trans)
    if regs is None:
        regs = default_registers(num)
    regs = np.asarray(regs)
    if regs.dtype != np.uint32 or regs.shape != (32, num):
        raise ValueError(f"regs must be a uint32 array of shape (32, {num}); got {regs.dtype} {regs.shape}")
    require_tier("gpu", "gemmlab.ldmatrix.run_stmatrix")
    regs_d = torch.from_numpy(regs.reshape(-1).view(np.int32).copy()).cuda()
    rows_d = torch.from_numpy(LANE_ROWS.copy()).cuda()
    out = torch.full((ROWS * 4,), -0x21524111, dtype=torch.int32, device="cuda")
    launcher(stmatrix_host(num, trans), regs_d, rows_d, out)()
    torch.cuda.synchronize()
    return out.cpu().numpy().view(np.uint16).copy()


def default_registers(num: int) -> np.ndarray:
    """Registers whose 16-bit halves say where they came from: ``lane*8 + m*2 + half``."""
    lanes = np.arange(32, dtype=np.uint32)[:, None]
    ms = np.arange(num, dtype=np.uint32)[None, :]
    lo = lanes * 8 + ms * 2
    return (lo | ((lo + 1) << 16)).astype(np.uint32)


def poisoned_smem() -> np.ndarray:
    """The shared tile ``run_stmatrix`` starts from."""
    return np.full(ROWS * ROW_ELEMS, POISON16, dtype=np.uint16)


# --- the same load through the DSL's copy atom ----------------------------------

@cute.kernel
def dsl_ldmatrix_kernel(tile: cute.Tensor, out: cute.Tensor):
    """One warp: a 16x16 fp16 tile through ``LdMatrix8x8x16bOp(num_matrices=4)``.

    The atom knows the fragment layout, so ``make_tiled_copy_A`` pairs it with
    the ``mma.m16n8k16`` A-operand layout that ``ldmatrix.x4`` was designed
    for. Writing each thread's registers back through the same MMA partition
    must give the tile unchanged: that checks the atom's bookkeeping, not
    just the instruction.
    """
    tid, _, _ = cute.arch.thread_idx()
    smem = cutlass.memory.SmemAllocator()
    s_tile = smem.allocate_tensor(cutlass.Float16, cute.make_layout((16, 16), stride=(16, 1)), byte_alignment=16)
    for i in cutlass.range_constexpr(8):  # 256 elements, 8 per lane, by coordinate
        s_tile[tid * 8 + i] = tile[tid * 8 + i]
    cute.arch.sync_threads()

    tiled_mma = cute.make_tiled_mma(cute.nvgpu.warp.MmaF16BF16Op(cutlass.Float16, cutlass.Float32, (16, 8, 16)))
    atom = cute.make_copy_atom(cute.nvgpu.warp.LdMatrix8x8x16bOp(transpose=False, num_matrices=4), cutlass.Float16)
    tiled_copy = cute.make_tiled_copy_A(atom, tiled_mma)
    thr_mma = tiled_mma.get_slice(tid)
    thr_copy = tiled_copy.get_slice(tid)
    frag = tiled_mma.make_fragment_A(thr_mma.partition_A(s_tile))  # this lane's registers
    cute.copy(tiled_copy, thr_copy.partition_S(s_tile), thr_copy.retile(frag))  # -> one ldmatrix.x4
    cute.autovec_copy(frag, thr_mma.partition_A(out))


@cute.jit
def dsl_ldmatrix_host(tile: cute.Tensor, out: cute.Tensor, stream: cuda.CUstream):
    dsl_ldmatrix_kernel(tile, out).launch(grid=(1, 1, 1), block=(32, 1, 1), stream=stream)


def compile_dsl_ldmatrix(target: str):
    """Compile the copy-atom version for ``target``: its PTX holds the same ``ldmatrix.x4``."""
    from .compile import check_target, compile_for, fake_stream, fake_tensor

    check_target(target)
    return compile_for(target, dsl_ldmatrix_host, fake_tensor(cutlass.Float16, (16, 16), stride_order=(1, 0)),
                       fake_tensor(cutlass.Float16, (16, 16), stride_order=(1, 0)), fake_stream())


def run_dsl_ldmatrix(tile):
    """Run the copy-atom version on a (16, 16) float16 CUDA tensor; return the tile it wrote back."""
    import torch

    from .checks import check_tensor
    from .compile import launcher
    from .tiers import require_tier

    check_tensor("tile", tile, dtypes=(torch.float16,), ndim=2, device=None)
    if tuple(tile.shape) != (16, 16):
        raise ValueError(f"tile must have shape (16, 16); got {tuple(tile.shape)}")
    check_tensor("tile", tile, device="cuda")
    require_tier("gpu", "gemmlab.ldmatrix.run_dsl_ldmatrix")
    out = torch.full_like(tile, float("nan"))
    launcher(dsl_ldmatrix_host, tile, out)()
    torch.cuda.synchronize()
    return out
