"""Loads, stores, atomics and address conversion (PTX ISA "Data Movement and Conversion Instructions":
ld, st, cvta, mapa, prefetch, createpolicy; "Parallel Synchronization and Communication": atom, red).

Every access checks its address: global ones against the allocations handed to
the run, shared ones against the CTA's shared memory, and alignment to the access
size (the ISA requires naturally aligned addresses). Memory-ordering qualifiers
(``.relaxed``, ``.acquire``, ``.volatile``, scopes, cache hints) are accepted and
have no further effect: the emulator's memory is sequentially consistent, so it
cannot show a missing acquire (it shows missing *proxy* fences and missing waits).
"""
from __future__ import annotations

import numpy as np

from ..errors import MemoryFault, Unsupported
from ..memory import GENERIC_PARAM, GENERIC_SHARED, SHARED_BASE, cluster_address, split_cluster
from ..ptx import Sink, Vec
from ..values import bits_of, from_raw, to_raw
from . import handler, type_of

_SPACES = ("global", "shared", "shared::cta", "shared::cluster", "param", "param::entry", "local", "const")
_IGNORED = {"weak", "volatile", "relaxed", "acquire", "release", "acq_rel", "mmio", "cta", "cluster", "gpu", "sys",
            "ca", "cg", "cs", "lu", "cv", "wb", "wt", "nc", "L2::cache_hint", "L1::evict_normal",
            "L1::evict_unchanged", "L1::evict_first", "L1::evict_last", "L1::no_allocate", "L2::evict_normal",
            "L2::evict_first", "L2::evict_last", "L2::64B", "L2::128B", "L2::256B", "sync", "aligned"}


def _space(ctx) -> str:
    for p in ctx.parts[1:]:
        if p in _SPACES:
            return p.split("::")[0] if p != "shared::cluster" else p
    return "generic"


def _vec(ctx) -> int:
    for p in ctx.parts[1:]:
        if p in ("v2", "v4", "v8"):
            return int(p[1])
    return 1


class Access:
    """Reads and writes of ``size`` bytes at per-lane addresses in one state space, for one warp."""

    @staticmethod
    def check_align(addrs, size, warp):
        if 1 < size <= 32:
            bad = addrs % np.uint64(size) != 0
            if bad.any():
                raise MemoryFault(f"misaligned {size}-byte access at 0x{int(addrs[bad][0]):x} (the ISA requires "
                                  f"addresses aligned to the access size)")

    @staticmethod
    def read(warp, space: str, addrs: np.ndarray, size: int) -> np.ndarray:
        """``(len(addrs), size)`` bytes."""
        m = warp.machine
        Access.check_align(addrs, size, warp)
        if space == "global":
            return m.memory.gather(addrs, size)
        if space == "shared":
            return warp.cta.smem.gather(addrs, size)
        if space == "shared::cluster":
            out = np.zeros((len(addrs), size), np.uint8)
            for i, a in enumerate(addrs):
                cta, local = m.shared_window(warp.cta, int(a))
                out[i] = cta.smem.read(local, size, "ld.shared::cluster")
            return out
        if space == "param":
            off = addrs.astype(np.int64)
            if len(off) and (off.min() < 0 or off.max() + size > len(m.param)):
                raise MemoryFault(f"parameter access at offset {int(off.max())} past the {len(m.param)}-byte "
                                  "parameter buffer")
            return m.param[off[:, None] + np.arange(size)]
        if space == "generic":
            out = np.zeros((len(addrs), size), np.uint8)
            kinds = addrs & np.uint64(0xF000_0000_0000_0000)
            for kind in np.unique(kinds):
                sel = kinds == kind
                sub = addrs[sel]
                if kind == np.uint64(GENERIC_SHARED):
                    out[sel] = Access.read(warp, "shared::cluster", sub - np.uint64(GENERIC_SHARED), size)
                elif kind == np.uint64(GENERIC_PARAM):
                    out[sel] = Access.read(warp, "param", sub - np.uint64(GENERIC_PARAM), size)
                else:
                    out[sel] = Access.read(warp, "global", sub, size)
            return out
        raise Unsupported(f"loads from the .{space} state space")

    @staticmethod
    def write(warp, space: str, addrs: np.ndarray, data: np.ndarray, writers=None):
        m = warp.machine
        size = data.shape[1]
        Access.check_align(addrs, size, warp)
        if space == "global":
            m.memory.scatter(addrs, data)
        elif space == "shared":
            warp.cta.smem.scatter(addrs, data, "st.shared", writer=writers)
        elif space == "shared::cluster":
            for i, a in enumerate(addrs):
                cta, local = m.shared_window(warp.cta, int(a))
                cta.smem.scatter(np.array([local], np.uint64), data[i:i + 1], "st.shared::cluster",
                                 writer=None if writers is None or cta is not warp.cta else writers[i:i + 1])
        elif space == "generic":
            kinds = addrs & np.uint64(0xF000_0000_0000_0000)
            for kind in np.unique(kinds):
                sel = kinds == kind
                if kind == np.uint64(GENERIC_SHARED):
                    Access.write(warp, "shared::cluster", addrs[sel] - np.uint64(GENERIC_SHARED), data[sel],
                                 None if writers is None else writers[sel])
                elif kind == np.uint64(GENERIC_PARAM):
                    raise MemoryFault("store to the kernel's parameter space through a generic address")
                else:
                    Access.write(warp, "global", addrs[sel], data[sel])
        else:
            raise Unsupported(f"stores to the .{space} state space")


def _bytes_of(values: np.ndarray, typ: str) -> np.ndarray:
    """Per-lane values of ``typ`` -> (n, bytes) little-endian."""
    raw = to_raw(values, typ)
    nb = max(bits_of(typ) // 8, 1)
    return np.ascontiguousarray(raw.astype({1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[nb])) \
        .view(np.uint8).reshape(-1, nb)


def _values_of(b: np.ndarray, typ: str) -> np.ndarray:
    nb = max(bits_of(typ) // 8, 1)
    raw = np.ascontiguousarray(b).view({1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[nb]).reshape(-1)
    return from_raw(raw.astype(np.uint64), typ)


@handler("ld", "ldu")
def h_ld(ctx):
    typ = type_of(ctx.parts)
    space = _space(ctx)
    vec = _vec(ctx)
    ctx.need({typ, f"v{vec}", *_SPACES, *_IGNORED}, prefixes=("L2::", "L1::"))
    d, a = ctx.inst.operands[:2]
    addr = ctx.addr(a)
    ebytes = max(bits_of(typ) // 8, 1)
    items = d.items if isinstance(d, Vec) else (d,)
    if len(items) != vec:
        ctx.unsupported("a vector operand whose length does not match the .v modifier in")
    writers = [ctx.dst(x, typ) if not isinstance(x, Sink) else None for x in items]

    def run(warp, mask):
        lanes = np.flatnonzero(mask)
        addrs = addr(warp)[lanes]
        data = Access.read(warp, space, addrs, ebytes * vec)
        for k, w in enumerate(writers):
            if w is None:
                continue
            vals = np.zeros(32, dtype=np.uint64)
            full = _values_of(data[:, k * ebytes:(k + 1) * ebytes], typ)
            out = np.zeros(32, dtype=full.dtype)
            out[lanes] = full
            w(warp, mask, out)
    return run


@handler("st")
def h_st(ctx):
    typ = type_of(ctx.parts)
    space = _space(ctx)
    vec = _vec(ctx)
    ctx.need({typ, f"v{vec}", *_SPACES, *_IGNORED}, prefixes=("L2::", "L1::"))
    a, v = ctx.inst.operands[:2]
    addr = ctx.addr(a)
    items = v.items if isinstance(v, Vec) else (v,)
    readers = [ctx.src(x, typ) for x in items]
    shared = space in ("shared", "shared::cluster", "generic")

    def run(warp, mask):
        lanes = np.flatnonzero(mask)
        addrs = addr(warp)[lanes]
        data = np.concatenate([_bytes_of(r(warp)[lanes], typ) for r in readers], axis=1)
        writers = (warp.index * 32 + lanes) if shared else None
        Access.write(warp, space, addrs, data, writers)
    return run


@handler("cvta")
def h_cvta(ctx):
    typ = type_of(ctx.parts)
    to = "to" in ctx.parts
    space = next((p for p in ctx.parts[1:] if p in _SPACES), None)
    if space is None:
        ctx.unsupported()
    d, a = ctx.inst.operands
    ra, w = ctx.src(a, typ), ctx.dst(d, typ)
    base = {"shared": GENERIC_SHARED, "shared::cta": GENERIC_SHARED, "shared::cluster": GENERIC_SHARED,
            "param": GENERIC_PARAM, "param::entry": GENERIC_PARAM, "global": 0}.get(space)
    if base is None:
        ctx.unsupported(f"the .{space} window of")

    def run(warp, mask):
        v = ra(warp).astype(np.uint64)
        if to:
            r = v - np.uint64(base) if base else v
            if base and (((v & np.uint64(0xF000_0000_0000_0000)) != np.uint64(base)) & mask).any():
                raise MemoryFault(f"cvta.to.{space}: the generic address is not in the {space} window")
        else:
            r = v + np.uint64(base)
        w(warp, mask, r.astype(np.uint32) if typ.endswith("32") else r)
    return run


@handler("mapa")
def h_mapa(ctx):
    """``mapa.shared::cluster.u32 d, a, rank``: the address of the same shared variable in CTA ``rank``."""
    typ = type_of(ctx.parts)
    generic = "shared::cluster" not in ctx.parts
    d, a, b = ctx.inst.operands
    ra, rb, w = ctx.src(a, typ), ctx.src(b, "u32"), ctx.dst(d, typ)

    def run(warp, mask):
        addrs = ra(warp).astype(np.uint64)
        ranks = rb(warp)
        out = np.zeros(32, np.uint64)
        size = warp.cta.cluster.size
        for i in np.flatnonzero(mask):
            x = int(addrs[i])
            if generic:
                x -= GENERIC_SHARED
            _, local = split_cluster(x, warp.cta.rank)
            if int(ranks[i]) >= size:
                raise MemoryFault(f"mapa to CTA rank {int(ranks[i])}; the cluster has {size} CTAs")
            y = cluster_address(int(ranks[i]), local)
            out[i] = y + GENERIC_SHARED if generic else y
        w(warp, mask, out.astype(np.uint32) if typ.endswith("32") else out)
    return run


@handler("prefetch", "prefetchu", "applypriority", "discard")
def h_prefetch(ctx):
    """Cache hints: no functional effect, except ``prefetch.tensormap`` which may fill the CTA's
    tensor-map cache (see :mod:`gemmlab.emulator.isa.asyncops`)."""
    if "tensormap" in ctx.parts:
        from .asyncops import tensormap_prefetch

        return tensormap_prefetch(ctx)
    return lambda warp, mask: None


@handler("createpolicy")
def h_createpolicy(ctx):
    d = ctx.inst.operands[0]
    w = ctx.dst(d, "b64")
    return lambda warp, mask: w(warp, mask, np.full(32, 0x1000_0000_0000_0000, np.uint64))


@handler("isspacep")
def h_isspacep(ctx):
    space = ctx.parts[1]
    d, a = ctx.inst.operands
    ra, w = ctx.src(a, "u64"), ctx.dst(d, "pred")
    base = {"shared": GENERIC_SHARED, "param": GENERIC_PARAM}.get(space.split("::")[0])

    def run(warp, mask):
        top = ra(warp) & np.uint64(0xF000_0000_0000_0000)
        if space == "global":
            w(warp, mask, (top != np.uint64(GENERIC_SHARED)) & (top != np.uint64(GENERIC_PARAM)))
        else:
            w(warp, mask, top == np.uint64(base))
    return run


def _atomic_op(op: str, typ: str):
    is_float = typ.startswith("f")

    def f(old, b, c=None):
        if op == "add":
            return old + b
        if op == "exch":
            return b
        if op == "cas":
            return c if old == b else old
        if op == "and":
            return old & b
        if op == "or":
            return old | b
        if op == "xor":
            return old ^ b
        if op == "min":
            return min(old, b)
        if op == "max":
            return max(old, b)
        if op == "inc":
            return 0 if old >= b else old + 1
        if op == "dec":
            return b if (old == 0 or old > b) else old - 1
        raise Unsupported(f"atomic .{op}")
    return f, is_float


@handler("atom", "red")
def h_atom(ctx):
    typ = type_of(ctx.parts)
    space = _space(ctx)
    op = next((p for p in ctx.parts[1:] if p in ("add", "exch", "cas", "and", "or", "xor", "min", "max",
                                                 "inc", "dec")), None)
    if op is None:
        ctx.unsupported()
    ctx.need({typ, op, *_SPACES, *_IGNORED, "noftz"}, prefixes=("L2::",))
    is_red = ctx.parts[0] == "red"
    ops = ctx.inst.operands
    d = None if is_red else ops[0]
    a = ops[0] if is_red else ops[1]
    rest = ops[1:] if is_red else ops[2:]
    addr = ctx.addr(a)
    readers = [ctx.src(x, typ) for x in rest]
    w = ctx.dst(d, typ) if d is not None else None
    fn, is_float = _atomic_op(op, typ)
    nb = bits_of(typ) // 8

    def run(warp, mask):
        lanes = np.flatnonzero(mask)
        addrs = addr(warp)
        args = [r(warp) for r in readers]
        olds = np.zeros(32, dtype=np.uint64)
        for i in lanes:  # one lane at a time, in lane order (any order is a valid outcome)
            a1 = np.array([addrs[i]], np.uint64)
            cur = _values_of(Access.read(warp, space, a1, nb), typ)[0]
            new = fn(cur, *(x[i] for x in args))
            Access.write(warp, space, a1, _bytes_of(np.array([new], dtype=cur.dtype), typ))
            olds[i] = to_raw(np.array([cur]), typ).astype(np.uint64)[0]
        if w is not None:
            w(warp, mask, from_raw(olds, typ))
    return run
