"""WGMMA (sm_90a): warpgroup-wide asynchronous MMAs (PTX ISA "Asynchronous Warpgroup Level Matrix
Multiply-Accumulate Instructions": wgmma.fence, wgmma.mma_async, wgmma.commit_group, wgmma.wait_group).

``wgmma.mma_async`` is executed by the four warps of a warpgroup together
(``.sync.aligned``): each warp names its own accumulator registers, and the
operation exists once all four have issued their n-th ``mma_async``. It runs
later, in issue order within the warpgroup (the accumulator chain of a k-loop
depends on it), reading A and B from shared memory through their descriptors (or
A from the registers snapshotted at issue) and the accumulators from the four
warps' registers. Until ``wgmma.wait_group`` says the operation is done, its
accumulator registers are pending: reading or writing one is reported.

Numerics: the products of BF16/FP16 (exact in FP32) are summed in FP32 by torch,
in an order that is not the tensor core's, so results agree with the GPU within
FP32 summation error (a bound per output of about ``K * 2^-24 * sum |a_k b_k|``),
not bit for bit.
"""
from __future__ import annotations

import numpy as np

from ..errors import EmulatorError, RaceError, Unsupported
from ..machine import AsyncOp
from ..operands import read_operand, to_float
from ..ptx import Imm, Vec
from ..values import from_raw
from . import handler, require_converged

SM90_SWIZZLE = {0: 0, 1: 128, 2: 64, 3: 32}  # descriptor bits 62-63


def decode_desc(value: int) -> dict:
    """A WGMMA matrix descriptor (PTX ISA "Matrix Descriptor Format"): byte addresses and offsets."""
    value = int(value)
    base_offset = (value >> 49) & 7
    if base_offset:
        raise Unsupported(f"a WGMMA descriptor with matrix base offset {base_offset} (only 0 is implemented)")
    return {"start": (value & 0x3FFF) << 4, "lbo": ((value >> 16) & 0x3FFF) << 4,
            "sbo": ((value >> 32) & 0x3FFF) << 4, "swizzle": SM90_SWIZZLE[(value >> 62) & 3]}


def acc_coords(n: int):
    """For accumulator register ``r`` of thread ``t`` (0..127) of an m64nN tile: its (row, column).
    ISA figure "WGMMA .m64nNk16 register fragment layout for accumulator matrix D"."""
    t = np.arange(128)[:, None]
    r = np.arange(n // 2)[None, :]
    row = (t // 32) * 16 + (t % 32) // 4 + 8 * ((r // 2) % 2)
    col = 8 * (r // 4) + 2 * (t % 4) + (r % 2)
    return row, col


def a_reg_coords():
    """For A fragment element ``e`` (0..7; register e // 2, half e % 2) of thread ``t``: its (row, k) in the
    m64k16 tile. ISA figure "WGMMA .m64nNk16 register fragment layout for matrix A"."""
    t = np.arange(128)[:, None]
    e = np.arange(8)[None, :]
    reg = e // 2
    row = (t // 32) * 16 + (t % 32) // 4 + 8 * (reg % 2)
    col = 8 * (reg // 2) + 2 * (t % 4) + (e % 2)
    return row, col


class Wgmma(AsyncOp):
    label = "wgmma.mma_async"

    def __init__(self, group_key, warps, shape, fmts, descs, a_regs, trans, scale_d, scale_ab, d_idx, cta):
        self.unit = group_key
        self.warps = warps  # the four warps, by warp index within the warpgroup
        self.m, self.n, self.k = shape
        self.dfmt, self.afmt, self.bfmt = fmts
        self.adesc, self.bdesc = descs
        self.a_regs = a_regs  # (128, 8) float32 of A from registers, or None
        self.trans_a, self.trans_b = trans
        self.scale_d = scale_d
        self.scale_a, self.scale_b = scale_ab
        self.d_idx = d_idx  # per warp: register indices of its accumulators
        self.cta = cta
        self.done = False
        self.label = f"wgmma.mma_async m{self.m}n{self.n}k{self.k} of {cta.name} warpgroup {warps[0].index // 4}"

    def complete(self, machine):
        m, n, k = self.m, self.n, self.k
        sm = self.cta.smem
        if self.a_regs is None:
            d = self.adesc
            machine.check_async_read(self.cta, d["start"] | (self.cta.rank << 24), 1, "wgmma (A operand)")
            a = to_float(read_operand(sm, (self.cta.rank << 24) | d["start"], m, k, bits(self.afmt),
                                      "MN" if self.trans_a else "K", d["lbo"], d["sbo"], d["swizzle"]), self.afmt)
        else:
            a = self.a_regs
        d = self.bdesc
        machine.check_async_read(self.cta, d["start"] | (self.cta.rank << 24), 1, "wgmma (B operand)")
        b = to_float(read_operand(sm, (self.cta.rank << 24) | d["start"], n, k, bits(self.bfmt),
                                  "MN" if self.trans_b else "K", d["lbo"], d["sbo"], d["swizzle"]), self.bfmt)
        prod = (a.astype(np.float32) * self.scale_a) @ (b.astype(np.float32) * self.scale_b).T  # (m, n)
        row, col = acc_coords(n)
        for w, warp in enumerate(self.warps):
            idx = self.d_idx[w]
            rows, cols = row[32 * w:32 * (w + 1)], col[32 * w:32 * (w + 1)]
            vals = prod[rows, cols]  # (32, n/2)
            if self.dfmt != "f32":
                raise Unsupported(f"wgmma with .{self.dfmt} accumulators")
            regs = warp.regs[idx]  # (n/2, 32)
            old = regs.astype(np.uint32).view(np.float32).T
            new = vals + old if self.scale_d[w] else vals
            warp.regs[idx] = new.astype(np.float32).T.view(np.uint32).astype(np.uint64)
        self.done = True


def bits(fmt: str) -> int:
    return {"f16": 16, "bf16": 16, "tf32": 32, "e4m3": 8, "e5m2": 8}[fmt]


@handler("wgmma")
def h_wgmma(ctx):
    op = ctx.parts[1]
    if op == "fence":
        return lambda warp, mask: require_converged(warp, mask)
    if op == "commit_group":
        def commit(warp, mask):
            require_converged(warp, mask)
            warp.wgmma_groups.append(warp.wgmma_open)
            warp.wgmma_open = []
        return commit
    if op == "wait_group":
        (nop,) = ctx.inst.operands
        if not isinstance(nop, Imm):
            ctx.unsupported()
        keep = int(nop.value)

        def wait(warp, mask):
            require_converged(warp, mask)
            groups = warp.wgmma_groups

            def still():
                while len(groups) > keep and all(o.done for o in groups[0]):
                    for o in groups.pop(0):
                        warp.clear_pending(o.d_idx[o.warps.index(warp)])
                return len(groups) > keep
            if still():
                warp.block(mask, still, f"wgmma.wait_group {keep}")
        return wait
    if op != "mma_async":
        ctx.unsupported()
    return _mma_async(ctx)


def _mma_async(ctx):
    parts = ctx.parts
    shape = next(p for p in parts if p.startswith("m64n"))
    m, n, k = (int(x) for x in shape[1:].replace("n", " ").replace("k", " ").split())
    types = parts[parts.index(shape) + 1:]
    if len(types) != 3 or "sp" in parts:
        ctx.unsupported()
    dfmt, afmt, bfmt = types
    ops = ctx.inst.operands
    d_op = ops[0]
    if not isinstance(d_op, Vec) or len(d_op.items) != n // 2:
        ctx.unsupported(f"an accumulator vector of {len(getattr(d_op, 'items', ()))} registers (want {n // 2}) in")
    d_idx = np.array([ctx.reg_index(r) for r in d_op.items])
    a_from_regs = isinstance(ops[1], Vec)
    ra = ctx.vec_src(ops[1], "b32") if a_from_regs else ctx.src(ops[1], "b64")
    rb = ctx.src(ops[2], "b64")
    rscale_d = ctx.src(ops[3], "pred")
    imms = ops[4:]
    if not all(isinstance(x, Imm) for x in imms):
        ctx.unsupported("non-immediate scale/transpose operands in")
    vals = [int(x.value) for x in imms]
    scale_a, scale_b = vals[0], vals[1]
    if a_from_regs:
        trans_a, trans_b = 0, (vals[2] if len(vals) > 2 else 0)
    else:
        trans_a, trans_b = (vals[2] if len(vals) > 2 else 0), (vals[3] if len(vals) > 3 else 0)

    def issue(warp, mask):
        require_converged(warp, mask)
        cta = warp.cta
        wg = warp.index // 4
        seq = warp.wgmma_issued
        warp.wgmma_issued += 1
        lane0 = int(np.flatnonzero(mask)[0])
        entry = {
            "adesc": None if a_from_regs else int(ra(warp)[lane0]),
            "bdesc": int(rb(warp)[lane0]),
            "a_regs": [r.copy() for r in ra(warp)] if a_from_regs else None,
            "scale_d": bool(rscale_d(warp)[lane0]),
        }
        for i in d_idx:
            if warp.pending[i] and not any(i in o.d_idx[o.warps.index(warp)] for g in warp.wgmma_groups + [warp.wgmma_open] for o in g):
                raise RaceError(f"wgmma.mma_async accumulates into a register whose earlier async result is "
                                "not waited for")
        table = cta.__dict__.setdefault("_wgmma_issue", {})
        slot = table.setdefault((wg, seq), {})
        slot[warp.index % 4] = (warp, entry)
        warp.set_pending(d_idx, "the wgmma.mma_async that writes it (wgmma.wait_group)")
        if len(slot) < 4:
            warp.wgmma_open.append(_Pending(slot, d_idx))
            return
        del table[(wg, seq)]
        warps = [slot[i][0] for i in range(4)]
        entries = [slot[i][1] for i in range(4)]
        b0 = entries[0]
        for e in entries[1:]:
            if e["bdesc"] != b0["bdesc"] or e["adesc"] != b0["adesc"]:
                raise EmulatorError("the four warps of a warpgroup issued one wgmma.mma_async with different "
                                    "descriptors")
        a_vals = None
        if a_from_regs:
            from ..operands import to_float as tf

            row, col = a_reg_coords()
            a_vals = np.zeros((64, k), dtype=np.float32)
            for w, e in enumerate(entries):
                regs = np.stack(e["a_regs"])  # (4, 32) b32: two 16-bit elements each
                halves = np.stack([regs & 0xFFFF, regs >> 16], axis=-1).reshape(4, 32, 2)
                for r in range(4):
                    for h in range(2):
                        el = r * 2 + h
                        t = np.arange(32) + 32 * w
                        a_vals[row[t, el], col[t, el]] = tf(halves[r, :, h], afmt)
        op = Wgmma((cta, "wgmma", wg), warps, (m, n, k), (dfmt, afmt, bfmt),
                   (None if a_from_regs else decode_desc(b0["adesc"]), decode_desc(b0["bdesc"])),
                   a_vals, (trans_a, trans_b), [e["scale_d"] for e in entries], (scale_a, scale_b),
                   [d_idx] * 4, cta)
        # the earlier warps hold a placeholder in their open group: swap in the operation
        for w in warps:
            if w is warp:
                w.wgmma_open.append(op)
            else:
                for i, o in enumerate(w.wgmma_open):
                    if isinstance(o, _Pending) and o.slot is slot:
                        w.wgmma_open[i] = op
                for g in w.wgmma_groups:
                    for i, o in enumerate(g):
                        if isinstance(o, _Pending) and o.slot is slot:
                            g[i] = op
        op.owners = tuple(warps)
        warp.machine.issue(op)
    return issue


class _Pending:
    """A warp's share of a wgmma whose warpgroup has not fully issued it yet."""

    def __init__(self, slot, d_idx):
        self.slot = slot
        self.d_idx_own = d_idx
        self.done = False

    @property
    def warps(self):
        return [v[0] for v in self.slot.values()]

    @property
    def d_idx(self):
        return [self.d_idx_own] * 4
