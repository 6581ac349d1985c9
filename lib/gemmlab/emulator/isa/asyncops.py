"""Asynchronous copies: ``cp.async``, ``cp.async.bulk`` (and its bulk groups), the tensor form (TMA) and
the tensor-map instructions (``tensormap.replace``, ``tensormap.cp_fenceproxy``, ``prefetch.tensormap``,
``fence.proxy.tensormap::generic``).

PTX ISA sections "cp.async", "cp.async.bulk", "cp.async.bulk.tensor",
"cp.async.bulk.commit_group / wait_group", "tensormap.replace",
"tensormap.cp_fenceproxy", "Tensor Map" and "Proxies". Issued copies complete later,
in any order, as the ISA allows; each completion then does what the ISA says: write
the destination, signal the mbarrier's transaction count (``complete_tx``), or close
its bulk group. A TMA store reads shared memory in one step and writes global memory
in a later one, so ``wait_group.read`` is weaker than ``wait_group`` here as on the GPU.

Tensor maps are read through a per-CTA cache, filled on first use (or by
``prefetch.tensormap``) and dropped by ``fence.proxy.tensormap::generic.acquire``:
a kernel that rewrites a descriptor in global memory and uses it without that
fence keeps using the stale one, as chapter 08 measured on the H100 and H200.
"""
from __future__ import annotations

import numpy as np

from ..errors import EmulatorError, MemoryFault, Unsupported
from ..machine import AsyncOp
from ..memory import GENERIC_PARAM, GENERIC_SHARED
from ..ptx import Addr, Imm
from . import handler, require_converged, generic_to_space
from .mem import Access
from .sync import resolve_mbarrier


# ---------------------------------------------------------------------------------------------
# Tensor maps
# ---------------------------------------------------------------------------------------------


def read_generic(warp, addr: int, nbytes: int) -> np.ndarray:
    space, a = generic_to_space(addr)
    if space == "param":
        return Access.read(warp, "param", np.array([a], np.uint64), nbytes)[0]
    if space == "shared":
        return Access.read(warp, "shared::cluster", np.array([a], np.uint64), nbytes)[0]
    return warp.machine.memory.read(addr, nbytes)


def tensor_map(warp, addr: int):
    """The decoded tensor map at generic address ``addr``, through the CTA's descriptor cache."""
    from .. import tensormap as tm

    cache = warp.cta.tensormap_cache
    raw = cache.get(addr)
    if raw is None:
        if addr % 64:
            raise MemoryFault(f"tensor map address 0x{addr:x} is not 64-byte aligned")
        raw = bytes(read_generic(warp, addr, 128))
        cache[addr] = raw
    elif generic_to_space(addr)[0] == "global":
        _note_if_stale(warp, addr, raw)
    return tm.decode(raw)


def _note_if_stale(warp, addr: int, cached: bytes):
    """A use of a cached map that global memory no longer holds: the run's report says so (it is what a kernel
    that rewrites a descriptor without ``fence.proxy.tensormap::generic.acquire`` gets)."""
    from .. import tensormap as tm

    current = bytes(warp.machine.memory.read(addr, 128))
    if current == cached:
        return
    try:
        old, new = tm.decode(cached), tm.decode(current)
        fields = [f for f in ("global_address", "global_dim", "global_stride", "box_dim", "elemtype", "swizzle")
                  if getattr(old, f) != getattr(new, f)]
        what = "its " + ", ".join(fields) if fields else "other bytes"
    except Exception:  # the bytes in memory are not (yet) a valid map
        what = "bytes that do not decode as a tensor map"
    seen = warp.machine.__dict__.setdefault("_stale_tensormaps", set())
    if (warp.cta.linear, warp.index, addr, what) in seen:
        return
    seen.add((warp.cta.linear, warp.index, addr, what))
    warp.machine.notes.append(
        f"stale tensor map: {warp.name} used its cached copy of the map at 0x{addr:x}, but global memory now "
        f"holds a different one ({what} changed) and no fence.proxy.tensormap::generic.acquire dropped the copy")


def tensormap_prefetch(ctx):
    addr = ctx.addr(ctx.inst.operands[0])

    def run(warp, mask):
        for i in np.flatnonzero(mask):
            a = int(addr(warp)[i])
            if generic_to_space(a)[0] != "shared":
                tensor_map(warp, a)
    return run


def tensormap_fence(ctx):
    """``fence.proxy.tensormap::generic.{release,acquire}.scope [addr], 128``: acquire drops the cached copy."""
    acquire = "acquire" in ctx.parts
    ops = ctx.inst.operands
    addr = ctx.addr(ops[0]) if ops else None

    def run(warp, mask):
        if acquire and addr is not None:
            for i in np.flatnonzero(mask):
                warp.cta.tensormap_cache.pop(int(addr(warp)[i]), None)
    return run


@handler("tensormap")
def h_tensormap(ctx):
    parts = ctx.parts
    if parts[1] == "replace":
        return _tensormap_replace(ctx)
    if parts[1] == "cp_fenceproxy":
        dst, src, size = ctx.inst.operands
        rdst, rsrc = ctx.addr(dst), ctx.addr(src)
        if not isinstance(size, Imm) or size.value != 128:
            ctx.unsupported("a size other than 128 in")

        def cp(warp, mask):
            if "aligned" in parts:
                require_converged(warp, mask)
            for i in np.flatnonzero(mask):
                data = warp.cta.smem.read(int(rsrc(warp)[i]), 128, "tensormap.cp_fenceproxy")
                warp.machine.memory.write(int(rdst(warp)[i]), data)
        return cp
    ctx.unsupported()


def _tensormap_replace(ctx):
    from .. import tensormap as tm

    parts = ctx.parts
    if parts[2] != "tile":
        ctx.unsupported("a non-tile mode of")
    field = parts[3]
    ops = ctx.inst.operands
    addr = ctx.addr(ops[0])
    has_ordinal = len(ops) == 3
    rord = ctx.src(ops[1], "u32") if has_ordinal else None
    vtype = "b64" if parts[-1] == "b64" else "b32"
    rval = ctx.src(ops[-1], vtype)
    space = "shared" if any(p.startswith("shared") for p in parts) else "global"

    def run(warp, mask):
        for i in np.flatnonzero(mask):
            a = int(addr(warp)[i])
            if space == "shared":
                raw = warp.cta.smem.read(a, 128, "tensormap.replace")
            else:
                raw = warp.machine.memory.read(a, 128)
            new = tm.replace(bytes(raw), field, int(rord(warp)[i]) if has_ordinal else None, int(rval(warp)[i]))
            if space == "shared":
                warp.cta.smem.write(a, np.frombuffer(new, np.uint8))
            else:
                warp.machine.memory.write(a, np.frombuffer(new, np.uint8))
    return run


# ---------------------------------------------------------------------------------------------
# Operations
# ---------------------------------------------------------------------------------------------


class Copy(AsyncOp):
    """A copy that ends by signalling an mbarrier (``complete_tx``) or by closing a bulk/cp.async group."""

    def __init__(self, label, do, *, tx=None, reads_smem_of=None):
        self.label = label
        self._do = do
        self.tx = tx or []  # [(mbarrier, bytes)]
        self.reads_smem_of = reads_smem_of
        self.done = False

    def complete(self, machine):
        self._do()
        self.done = True
        for mb, n in self.tx:
            mb.complete_tx(n)


class Store(AsyncOp):
    """A store from shared memory (TMA store, bulk S2G): reads shared memory, later writes global memory."""

    def __init__(self, label, read, write, cta):
        self.label = label
        self._read, self._write = read, write
        self.reads_smem_of = cta
        self.read_done = False
        self.done = False
        self.buffer = None

    def complete(self, machine):
        if not self.read_done:
            self.buffer = self._read()
            self.read_done = True
            self.reads_smem_of = None
            machine.issue(self)  # the global write completes later still
            return
        self._write(self.buffer)
        self.done = True


def _write_async(cta, local_addr: int, data: np.ndarray):
    """Bytes written into shared memory by the async proxy (they carry no unfenced generic write)."""
    cta.smem.write(local_addr, data, "async copy")
    if cta.smem.unfenced_any:
        off = local_addr - cta.smem.base
        cta.smem.unfenced[off:off + len(data)] = 0


def _open_bulk(warp, lane, op):
    warp.bulk_open[lane].append(op)


@handler("cp")
def h_cp(ctx):
    parts = ctx.parts
    if parts[1] != "async":
        if parts[1] == "reduce":
            ctx.unsupported()
        ctx.unsupported()
    if len(parts) > 2 and parts[2] == "bulk":
        if len(parts) > 3 and parts[3] == "tensor":
            return _tma(ctx)
        if len(parts) > 3 and parts[3] in ("commit_group", "wait_group"):
            return _bulk_group(ctx)
        if len(parts) > 3 and parts[3] == "prefetch":
            return lambda warp, mask: None
        return _bulk(ctx)
    if len(parts) > 2 and parts[2] in ("commit_group", "wait_group", "wait_all"):
        return _cp_async_group(ctx)
    if len(parts) > 2 and parts[2] == "mbarrier":
        return _cp_async_mbarrier(ctx)
    return _cp_async(ctx)


# ---- cp.async (per thread, 4/8/16 bytes)

def _cp_async(ctx):
    ops = ctx.inst.operands
    dst, src, size = ops[0], ops[1], ops[2]
    rdst, rsrc = ctx.addr(dst), ctx.addr(src)
    if not isinstance(size, Imm) or size.value not in (4, 8, 16):
        ctx.unsupported("a copy size other than 4, 8, 16 in")
    n = int(size.value)
    rsrcsize = ctx.src(ops[3], "u32") if len(ops) > 3 and not isinstance(ops[3], Addr) and \
        not (isinstance(ops[3], Imm) and False) and "L2::cache_hint" not in ctx.parts else None
    if len(ops) > 3 and "L2::cache_hint" in ctx.parts and len(ops) == 4:
        rsrcsize = None

    def run(warp, mask):
        d, s = rdst(warp), rsrc(warp)
        ss = rsrcsize(warp) if rsrcsize is not None else None
        for i in np.flatnonzero(mask):
            da, sa, k = int(d[i]), int(s[i]), (int(ss[i]) if ss is not None else n)
            if da % n or sa % n:
                raise MemoryFault(f"cp.async of {n} bytes needs {n}-byte aligned addresses")
            cta = warp.cta

            def do(da=da, sa=sa, k=k, cta=cta):
                data = np.zeros(n, np.uint8)
                if k:
                    data[:k] = warp.machine.memory.read(sa, min(k, n))
                cta.smem.write(da, data, "cp.async")
            op = Copy(f"cp.async of {n} bytes by {warp.name} lane {i}", do)
            warp.cp_async_open[i].append(op)
            warp.machine.issue(op)
    return run


def _commit(open_ops, groups, lanes):
    """``commit_group``: each lane's open operations become its newest group (an empty group too)."""
    for i in lanes:
        groups[i].append(open_ops[i])
        open_ops[i] = []


def _wait_groups(warp, mask, groups, keep, finished, why):
    """``wait_group N``: park the lanes until at most ``keep`` of each lane's groups hold an unfinished operation
    (groups complete in any order; the wait counts from the oldest)."""
    lanes = np.flatnonzero(mask)

    def still():
        for i in lanes:
            mine = groups[i]
            while mine and all(finished(op) for op in mine[0]):
                mine.pop(0)
            if len(mine) > keep:
                return True
        return False
    if still():
        warp.block(mask, still, why)


def _cp_async_group(ctx):
    kind = ctx.parts[2]
    ops = ctx.inst.operands
    rn = ctx.src(ops[0], "u32") if ops else None

    def run(warp, mask):
        lanes = np.flatnonzero(mask)
        if kind in ("commit_group", "wait_all"):  # wait_all commits the open group first
            _commit(warp.cp_async_open, warp.cp_async_groups, lanes)
        if kind == "commit_group":
            return
        keep = 0 if kind == "wait_all" else int(rn(warp)[lanes[0]])
        _wait_groups(warp, mask, warp.cp_async_groups, keep, lambda op: op.done, f"cp.async.wait_group {keep}")
    return run


def _cp_async_mbarrier(ctx):
    """``cp.async.mbarrier.arrive{.noinc}.shared.b64 [mbar]``: arrive once this thread's cp.asyncs complete."""
    noinc = "noinc" in ctx.parts
    addr = ctx.addr(ctx.inst.operands[0])
    space = "shared::cluster" if "shared::cluster" in ctx.parts else "shared"

    def run(warp, mask):
        for i in np.flatnonzero(mask):
            mb = resolve_mbarrier(warp, int(addr(warp)[i]), space, warp.where())
            if not noinc:
                mb.pending += 1
                mb.expected += 0
            prior = [op for g in warp.cp_async_groups[i] for op in g] + list(warp.cp_async_open[i])

            class Arrive(AsyncOp):
                label = f"cp.async.mbarrier.arrive by {warp.name} lane {i}"

                def ready(self, prior=prior):
                    return all(op.done for op in prior)

                def complete(self, machine, mb=mb):
                    mb.arrive(1, self.label)
            warp.machine.issue(Arrive())
    return run


# ---- cp.async.bulk (no tensor map)

def _bulk(ctx):
    parts = ctx.parts
    ops = ctx.inst.operands
    dst_space, src_space = parts[3], parts[4]
    mbar = "mbarrier::complete_tx::bytes" in parts
    multicast = "multicast::cluster" in parts
    rdst, rsrc, rsize = ctx.addr(ops[0]), ctx.addr(ops[1]), ctx.src(ops[2], "u32")
    rbar = ctx.addr(ops[3]) if mbar else None
    rmask = ctx.src(ops[4], "u16") if multicast else None
    if dst_space.startswith("shared") and src_space == "global":
        kind = "g2s"
    elif dst_space.startswith("shared") and src_space.startswith("shared"):
        kind = "s2s"
    elif dst_space == "global" and src_space.startswith("shared"):
        kind = "s2g"
    else:
        ctx.unsupported()

    def run(warp, mask):
        m = warp.machine
        for i in np.flatnonzero(mask):
            d, s, n = int(rdst(warp)[i]), int(rsrc(warp)[i]), int(rsize(warp)[i])
            if n % 16 or d % 16 or s % 16:
                raise MemoryFault(f"cp.async.bulk needs 16-byte aligned addresses and a size that is a multiple "
                                  f"of 16; got dst 0x{d:x}, src 0x{s:x}, size {n}")
            cta = warp.cta
            if kind == "s2g":
                m.check_async_read(cta, s, n, "cp.async.bulk (shared to global)")

                def read(s=s, n=n, cta=cta):
                    return cta.smem.read(s, n, "cp.async.bulk")

                def write(buf, d=d):
                    m.memory.write(d, buf)
                op = Store(f"cp.async.bulk shared->global of {n} bytes by {warp.name}", read, write, cta)
                _open_bulk(warp, i, op)
                m.issue(op)
                continue
            if kind == "g2s":
                targets = [cta.cluster.ctas[r] for r in range(cta.cluster.size)
                           if int(rmask(warp)[i]) >> r & 1] if multicast else [m.shared_window(cta, d)[0]]
            else:
                m.check_async_read(cta, s, n, "cp.async.bulk (shared to shared::cluster)")
                targets = [m.shared_window(cta, d)[0]]
            local = d & 0xFFFFFF
            bar = int(rbar(warp)[i])
            tx = []
            for t in targets:
                if multicast:  # the mbarrier at the same offset in every destination CTA
                    mb = t.mbarrier((t.rank << 24) | (bar & 0xFFFFFF), warp.where())
                else:
                    owner, local_bar = m.shared_window(cta, bar)
                    mb = owner.mbarrier(local_bar, warp.where())
                tx.append((mb, n))

            def do(s=s, n=n, local=local, targets=targets, cta=cta):
                data = cta.smem.read(s, n, "cp.async.bulk") if kind == "s2s" else m.memory.read(s, n)
                for t in targets:
                    _write_async(t, (t.rank << 24) | local, data)
            m.issue(Copy(f"cp.async.bulk {kind} of {n} bytes by {warp.name}", do, tx=tx,
                         reads_smem_of=cta if kind == "s2s" else None))
    return run


def _bulk_group(ctx):
    kind = ctx.parts[3]
    read_only = "read" in ctx.parts
    ops = ctx.inst.operands
    rn = ctx.src(ops[0], "u32") if ops else None

    def run(warp, mask):
        lanes = np.flatnonzero(mask)
        if kind == "commit_group":
            _commit(warp.bulk_open, warp.bulk_groups, lanes)
            return
        keep = int(rn(warp)[lanes[0]])

        def finished(op):
            return op.read_done if read_only and isinstance(op, Store) else op.done
        _wait_groups(warp, mask, warp.bulk_groups, keep, finished,
                     f"cp.async.bulk.wait_group{'.read' if read_only else ''} {keep}")
    return run


# ---- the tensor form (TMA)

def _tm_call(fn, *args, **kwargs):
    """Call the tensor-map model; its ValueError / NotImplementedError become the emulator's errors."""
    try:
        return fn(*args, **kwargs)
    except NotImplementedError as e:
        raise Unsupported(str(e)) from None
    except ValueError as e:
        raise MemoryFault(str(e)) from None


def _tma(ctx):
    from .. import tensormap as tm

    parts = ctx.parts
    dim = parts[4]
    if not (dim.endswith("d") and dim[:-1].isdigit()):
        ctx.unsupported()
    dst_space, src_space = parts[5], parts[6]
    rest = set(parts[7:])
    if "tile" not in rest and "im2col" not in rest:
        rest.add("tile")
    if "tile" not in rest:
        ctx.unsupported("the im2col mode of")
    allowed = {"tile", "mbarrier::complete_tx::bytes", "bulk_group", "multicast::cluster", "L2::cache_hint",
               "cta_group::1", "cta_group::2"}
    if rest - allowed:
        ctx.unsupported("the modifier(s) ." + ", .".join(sorted(rest - allowed)) + " of")
    ops = ctx.inst.operands
    load = src_space == "global"
    if load:
        dst, tmap = ops[0], ops[1]
        rbar = ctx.addr(ops[2])
        multicast = "multicast::cluster" in rest
        rmask = ctx.src(ops[3], "u16") if multicast else None
        pair = "cta_group::2" in rest
    else:
        tmap, src = ops[0], ops[1]
    rmap = ctx.addr(Addr(tmap.base, 0))
    coord_readers = [ctx.src(c, "s32") for c in tmap.coords]
    rlocal = ctx.addr(dst if load else src)
    ndim = int(dim[:-1])
    if len(coord_readers) != ndim:
        ctx.unsupported(f"{len(coord_readers)} coordinates for a {ndim}-d copy in")

    def run(warp, mask):
        m = warp.machine
        cta = warp.cta
        maps = rmap(warp)
        coords = [r(warp) for r in coord_readers]
        locs = rlocal(warp)
        for i in np.flatnonzero(mask):
            tmap_ = tensor_map(warp, int(maps[i]))
            if tmap_.rank != ndim:
                raise EmulatorError(f"a {ndim}-d TMA copy with a rank-{tmap_.rank} tensor map")
            c = tuple(int(x[i]) for x in coords)
            if load:
                d = int(locs[i])
                _tm_call(tm.check_smem_address, tmap_, d & 0xFFFFFF)
                nbytes = tm.tile_bytes(tmap_)
                span = tm.smem_span(tmap_)
                if multicast:
                    cmask = int(rmask(warp)[i])
                    targets = [cta.cluster.ctas[r] for r in range(cta.cluster.size) if cmask >> r & 1]
                    if not targets:
                        raise EmulatorError("TMA multicast with an empty CTA mask")
                else:
                    targets = [m.shared_window(cta, d)[0]]
                bar = int(rbar(warp)[i])
                tx = []
                for t in targets:
                    if multicast:
                        rank = t.rank & ~1 if pair else t.rank
                        owner = t.cluster.ctas[rank]
                        mb = owner.mbarrier(((rank << 24) | (bar & 0xFFFFFF)), warp.where())
                    else:
                        owner, local_bar = m.shared_window(cta, bar)
                        mb = owner.mbarrier(local_bar, warp.where())
                    tx.append((mb, nbytes))
                local = d & 0xFFFFFF

                def do(tmap_=tmap_, c=c, targets=targets, local=local, span=span):
                    for t in targets:
                        addr = (t.rank << 24) | local
                        current = t.smem.read(addr, span, "TMA load")  # bytes between padded rows stay as they are
                        data = _tm_call(tm.load_tile, tmap_, c, m.memory.read, smem_addr=local, into=current)
                        _write_async(t, addr, data)
                m.issue(Copy(f"TMA load {c} by {warp.name}", do, tx=tx))
            else:
                s = int(locs[i])
                _tm_call(tm.check_smem_address, tmap_, s & 0xFFFFFF)
                nbytes = tm.smem_span(tmap_)
                m.check_async_read(cta, s, nbytes, "TMA store")

                def read(s=s, nbytes=nbytes):
                    return cta.smem.read(s, nbytes, "TMA store")

                def write(buf, tmap_=tmap_, c=c, s=s):
                    _tm_call(tm.store_tile, tmap_, c, buf,
                             lambda a, data: m.memory.write(a, np.frombuffer(bytes(data), np.uint8)),
                             smem_addr=s & 0xFFFFFF)
                op = Store(f"TMA store {c} by {warp.name}", read, write, cta)
                _open_bulk(warp, i, op)
                m.issue(op)
    return run
