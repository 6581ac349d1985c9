"""Warp-wide 8x8 matrix moves between shared memory and registers: ``ldmatrix`` and ``stmatrix``.

PTX ISA sections "Warp Level Matrix Load Instruction: ldmatrix" and "Warp Level
Matrix Store Instruction: stmatrix" (shape ``.m8n8``, type ``.b16``, ``.x1``/``.x2``/
``.x4``, optional ``.trans``). What the ISA's fragment figures for ``.m8n8`` say:

* **Addresses.** Each 8x8 matrix is 8 rows of 16 contiguous bytes (8 elements of
  16 bits); every row has its own 16-byte-aligned address. The lanes of the warp
  supply them: lanes ``0-7`` the rows of matrix 0, ``8-15`` of matrix 1, ``16-23``
  of matrix 2, ``24-31`` of matrix 3; ``.x1`` reads only lanes 0-7 and ``.x2``
  lanes 0-15 (the other lanes' address operands are ignored).
* **Fragments.** Matrix ``i`` lives in register ``d_i`` (``r_i`` for stmatrix) of
  every lane. Lane ``t`` holds row ``t / 4``, columns ``2 (t % 4)`` (the low 16 bits)
  and ``2 (t % 4) + 1`` (the high 16 bits). With ``.trans`` the matrix is read
  (written) column by column: lane ``t`` holds column ``t / 4``, rows ``2 (t % 4)``
  (low) and ``2 (t % 4) + 1`` (high) of the rows in memory.

Both instructions are ``.sync.aligned``: the whole warp executes them together.
Other shapes (``.m16n16``, ``.m8n16`` with ``.b8`` and the packed 6-/4-bit
formats of sm_100) are refused.
"""
from __future__ import annotations

import numpy as np

from ..errors import MemoryFault
from ..memory import GENERIC_SHARED
from ..ptx import Vec
from . import handler, require_converged

ROW_BYTES = 16
_LANE = np.arange(32)


def fragment_positions(trans: bool):
    """``(row, column)`` in its 8x8 matrix of the element each lane holds, low half and high half:
    arrays of shape (32, 2) (lane, half)."""
    group, pair = _LANE // 4, _LANE % 4
    first = 2 * pair[:, None] + np.arange(2)[None, :]  # the two consecutive elements
    other = np.repeat(group[:, None], 2, axis=1)
    return (first, other) if trans else (other, first)


def _parse(ctx):
    """Shape, count, transpose and state space of ``ldmatrix``/``stmatrix``; refuses what is not ``.m8n8.b16``."""
    parts = ctx.parts
    num = next((int(p[1:]) for p in parts if p in ("x1", "x2", "x4")), None)
    ctx.need({"sync", "aligned", "m8n8", "x1", "x2", "x4", "trans", "shared", "shared::cta", "b16"})
    if "m8n8" not in parts or "b16" not in parts or num is None:
        ctx.unsupported("a shape/type other than .m8n8 .x1/.x2/.x4 .b16 of")
    generic = not any(p.startswith("shared") for p in parts)
    return num, "trans" in parts, generic


def _row_addresses(warp, addrs: np.ndarray, num: int, generic: bool, what: str) -> np.ndarray:
    """The shared::cta addresses of the ``8 num`` rows (lanes ``0 .. 8 num - 1``), checked for 16-byte alignment."""
    rows = addrs[:8 * num].astype(np.uint64)
    if generic:
        top = rows & np.uint64(0xF000_0000_0000_0000)
        if (top != np.uint64(GENERIC_SHARED)).any():
            bad = int(rows[top != np.uint64(GENERIC_SHARED)][0])
            raise MemoryFault(f"{what}: generic address 0x{bad:x} is not in the shared window")
        rows = rows - np.uint64(GENERIC_SHARED)
    if (rows % np.uint64(ROW_BYTES)).any():
        bad = int(rows[rows % np.uint64(ROW_BYTES) != 0][0])
        lane = int(np.flatnonzero(rows % np.uint64(ROW_BYTES) != 0)[0])
        raise MemoryFault(f"{what}: lane {lane}'s row address 0x{bad:x} is not 16-byte aligned (each matrix row "
                          "is 16 contiguous bytes)")
    return rows


def _setup(ctx, regs, address, role: str):
    """What both instructions take from their operands: ``(num, generic, registers, address, (rows_of, cols_of),
    opcode)``; refuses a register count other than the ``.x`` count (``role``: destination or source)."""
    num, trans, generic = _parse(ctx)
    items = regs.items if isinstance(regs, Vec) else (regs,)
    if len(items) != num:
        ctx.unsupported(f"{len(items)} {role} registers for .x{num} in")
    return num, generic, items, ctx.addr(address), fragment_positions(trans), ctx.inst.opcode


@handler("ldmatrix")
def h_ldmatrix(ctx):
    d, a = ctx.inst.operands
    num, generic, items, addr, (rows_of, cols_of), what = _setup(ctx, d, a, "destination")
    writers = [ctx.dst(x, "b32") for x in items]

    def run(warp, mask):
        require_converged(warp, mask)
        rows = _row_addresses(warp, addr(warp), num, generic, what)
        data = warp.cta.smem.gather(rows, ROW_BYTES, what)  # (8 num, 16) bytes
        mats = np.ascontiguousarray(data).view(np.uint16).reshape(num, 8, 8)  # [matrix, row, column]
        for i, w in enumerate(writers):
            halves = mats[i][rows_of, cols_of].astype(np.uint32)  # (32, 2)
            w(warp, mask, halves[:, 0] | (halves[:, 1] << np.uint32(16)))
    return run


@handler("stmatrix")
def h_stmatrix(ctx):
    a, v = ctx.inst.operands
    num, generic, items, addr, (rows_of, cols_of), what = _setup(ctx, v, a, "source")
    readers = [ctx.src(x, "b32") for x in items]

    def run(warp, mask):
        require_converged(warp, mask)
        rows = _row_addresses(warp, addr(warp), num, generic, what)
        mats = np.zeros((num, 8, 8), np.uint16)
        for i, r in enumerate(readers):
            regs = r(warp).astype(np.uint32)
            mats[i][rows_of[:, 0], cols_of[:, 0]] = (regs & 0xFFFF).astype(np.uint16)
            mats[i][rows_of[:, 1], cols_of[:, 1]] = (regs >> 16).astype(np.uint16)
        data = mats.reshape(8 * num, 8).view(np.uint8).reshape(8 * num, ROW_BYTES)
        # generic-proxy writes: row r of matrix i is attributed to the lane that gave its address
        writers = warp.index * 32 + np.arange(8 * num)
        warp.cta.smem.scatter(rows, data, what, writer=writers)
    return run
