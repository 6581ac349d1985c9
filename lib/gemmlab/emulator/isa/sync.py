"""Barriers and fences: named CTA barriers, the cluster barrier, mbarriers, and the fence family.

PTX ISA sections "bar, barrier", "barrier.cluster", "mbarrier" (init, arrive,
arrive.expect_tx, expect_tx, complete_tx, test_wait/try_wait with a state or a
phase parity, inval) and "membar/fence" (incl. ``fence.proxy.async`` and
``fence.proxy.tensormap::generic``).

Counting: ``bar.sync``/``barrier.sync.aligned`` count a whole warp per arrival
(the ISA: "operate on a per-warp basis", the count grows by the warp size);
``barrier.cluster.arrive`` and ``mbarrier.arrive`` count each executing thread.
Barriers that expect every thread of the CTA (or cluster) consider threads that
have exited as arrived.
"""
from __future__ import annotations

import numpy as np

from ..errors import BarrierError, Unsupported
from ..machine import MBarrier
from ..ptx import Imm, Sink
from . import handler, require_converged


# ---------------------------------------------------------------------------------------------
# Named barriers (bar / barrier)
# ---------------------------------------------------------------------------------------------


def _bar_state(cta, bid):
    st = cta.named.get(bid)
    if st is None:
        from ..machine import NamedBarrier

        st = cta.named[bid] = NamedBarrier()
    return st


def _bar_try_complete(cta, bid):
    st = cta.named[bid]
    if st.expected:
        done = st.arrived >= st.expected
    else:  # every (non-exited) thread of the CTA
        done = all(w.done or getattr(w, "_bar_gen", {}).get(bid) == st.generation for w in cta.warps)
    if done:
        st.generation += 1
        st.arrived = 0
        st.expected = 0
        cta.machine.wake(cta.warps)


@handler("bar", "barrier")
def h_bar(ctx):
    parts = ctx.parts
    if len(parts) > 1 and parts[1] == "cluster":
        return _cluster_barrier(ctx)
    if "warp" in parts:  # bar.warp.sync membermask: a convergence point
        def warp_sync(warp, mask):
            from .alu import _member_mask

            members = _member_mask(ctx.src(ctx.inst.operands[0], "u32")(warp)[np.flatnonzero(mask)[0]])
            if (members & ~warp.exited & ~mask).any():
                from ..machine import NeedConvergence

                raise NeedConvergence()
        return warp_sync
    kind = next((p for p in parts[1:] if p in ("sync", "arrive", "red")), None)
    if kind is None or kind == "red":
        ctx.unsupported()
    aligned = parts[0] == "bar" or "aligned" in parts
    ops = ctx.inst.operands
    rid = ctx.src(ops[0], "u32")
    rcount = ctx.src(ops[1], "u32") if len(ops) > 1 else None

    def run(warp, mask):
        if aligned:
            require_converged(warp, mask)
        bid = int(rid(warp)[np.flatnonzero(mask)[0]])
        cta = warp.cta
        st = _bar_state(cta, bid)
        count = int(rcount(warp)[np.flatnonzero(mask)[0]]) if rcount is not None else 0
        if count and count % 32:
            raise BarrierError(f"barrier {bid}: thread count {count} is not a multiple of the warp size")
        if st.expected and count and st.expected != count:
            raise BarrierError(f"barrier {bid} used with thread counts {st.expected} and {count} in one phase")
        st.expected = count or st.expected
        gens = warp.__dict__.setdefault("_bar_gen", {})
        if gens.get(bid) == st.generation and kind == "sync":
            raise BarrierError(f"{warp.name} arrives twice at barrier {bid} in one phase")
        gens[bid] = st.generation
        st.arrived += 32 if aligned else int(mask.sum())
        gen = st.generation
        _bar_try_complete(cta, bid)
        if kind == "sync" and st.generation == gen:
            warp.block(mask, lambda: st.generation == gen, f"named barrier {bid} ({st.arrived} of {st.expected or cta.nthreads} threads arrived)")
    return run


def on_warp_exit(cta):
    """Called when a warp exits: barriers that count every thread may now be complete."""
    for bid in list(cta.named):
        st = cta.named[bid]
        if not st.expected and any(getattr(w, "_bar_gen", {}).get(bid) == st.generation for w in cta.warps):
            _bar_try_complete(cta, bid)
    _cluster_try_complete(cta.cluster)


# ---------------------------------------------------------------------------------------------
# barrier.cluster
# ---------------------------------------------------------------------------------------------


def _cluster_try_complete(cluster):
    gen = cluster.barrier_generation
    arrived_any = False
    for cta in cluster.ctas:
        for w in cta.warps:
            g = getattr(w, "_cl_gen", None)
            live = ~w.exited
            if g is None:
                if live.any():
                    return
                continue
            if (g[live] != gen).any():
                return
            arrived_any = arrived_any or (g == gen).any()
    if not arrived_any:
        return
    cluster.barrier_generation += 1
    cluster.ctas[0].machine.wake([w for c in cluster.ctas for w in c.warps])


def _cluster_barrier(ctx):
    parts = ctx.parts
    kind = parts[2] if len(parts) > 2 else ""
    if kind not in ("arrive", "wait"):
        ctx.unsupported()
    aligned = "aligned" in parts

    def run(warp, mask):
        if aligned:
            require_converged(warp, mask)
        cluster = warp.cta.cluster
        g = warp.__dict__.get("_cl_gen")
        if g is None:
            g = warp._cl_gen = np.full(32, -1, dtype=np.int64)
        lanes = mask
        if kind == "arrive":
            if (g[lanes] == cluster.barrier_generation).any():
                raise BarrierError("barrier.cluster.arrive twice in one phase of the cluster barrier "
                                   "(each arrive needs its barrier.cluster.wait)")
            g[lanes] = cluster.barrier_generation
            _cluster_try_complete(cluster)
            return
        if (g[lanes] < 0).any():
            raise BarrierError("barrier.cluster.wait without a preceding barrier.cluster.arrive")
        waits_for = int(g[lanes].max())
        if cluster.barrier_generation <= waits_for:
            warp.block(mask, lambda: cluster.barrier_generation <= waits_for, "the cluster barrier")
    return run


# ---------------------------------------------------------------------------------------------
# mbarrier
# ---------------------------------------------------------------------------------------------


def _mbar_space(ctx):
    for p in ctx.parts[1:]:
        if p.startswith("shared"):
            return "shared::cluster" if p == "shared::cluster" else "shared"
    return "generic"


def resolve_mbarrier(warp, addr: int, space: str, who: str = "") -> MBarrier:
    """The mbarrier at ``addr`` (a shared::cta, shared::cluster or generic address)."""
    from ..memory import GENERIC_SHARED

    if space == "generic":
        if (addr & 0xF000_0000_0000_0000) != GENERIC_SHARED:
            raise BarrierError(f"mbarrier address 0x{addr:x} is not in shared memory")
        addr -= GENERIC_SHARED
        space = "shared::cluster"
    if space == "shared::cluster":
        cta, local = warp.machine.shared_window(warp.cta, addr)
    else:
        cta, local = warp.cta, addr
    if local % 8:
        raise BarrierError(f"mbarrier address 0x{local:x} is not 8-byte aligned")
    return cta.mbarrier(local, who)


@handler("mbarrier")
def h_mbarrier(ctx):
    parts = ctx.parts
    op = parts[1]
    space = _mbar_space(ctx)
    ops = ctx.inst.operands
    if op == "init":
        addr, rcount = ctx.addr(ops[0]), ctx.src(ops[1], "u32")

        def init(warp, mask):
            for i in np.flatnonzero(mask):
                a = int(addr(warp)[i])
                cta = warp.cta
                if space == "shared::cluster":
                    cta, a = warp.machine.shared_window(cta, a)
                n = int(rcount(warp)[i])
                if not 1 <= n <= (1 << 20) - 1:
                    raise BarrierError(f"mbarrier.init count {n} outside 1..2^20-1")
                cta.mbarriers[a] = MBarrier(cta, a, n, n)
                cta.smem.write(a, np.zeros(8, np.uint8))
        return init
    if op == "inval":
        addr = ctx.addr(ops[0])

        def inval(warp, mask):
            for i in np.flatnonzero(mask):
                warp.cta.mbarriers.pop(int(addr(warp)[i]), None)
        return inval
    if op in ("arrive", "arrive_drop"):
        expect = "expect_tx" in parts
        if "noComplete" in parts:
            ctx.unsupported()
        state = ops[0]
        addr = ctx.addr(ops[1])
        rest = ops[2:]
        rtx = ctx.src(rest[0], "u32") if expect else None
        rcount = ctx.src(rest[1 if expect else 0], "u32") if len(rest) > (1 if expect else 0) else None
        wstate = ctx.dst(state, "b64") if not isinstance(state, Sink) else None
        drop = op == "arrive_drop"

        def arrive(warp, mask):
            a = addr(warp)
            tokens = np.zeros(32, np.uint64)
            start = {}
            for i in np.flatnonzero(mask):
                mb = resolve_mbarrier(warp, int(a[i]), space, warp.where())
                start.setdefault(id(mb), (mb, mb.phase))
                if expect:
                    mb.expect_tx(int(rtx(warp)[i]))
                n = int(rcount(warp)[i]) if rcount is not None else 1
                tokens[i] = mb.phase
                if drop:
                    mb.expected -= n
                mb.arrive(n, f"{warp.name} lane {i}")
            for mb, phase in start.values():
                if mb.phase - phase > 1:
                    raise BarrierError(f"one arrive by {int(mask.sum())} lanes completed {mb.phase - phase} phases of "
                                       f"{mb.where()}, which expects {mb.expected} arrivals per phase: arrive from "
                                       "one elected lane, or initialise the barrier with the number of arriving threads")
            if wstate is not None:
                wstate(warp, mask, tokens)
        return arrive
    if op in ("expect_tx", "complete_tx"):
        addr, rtx = ctx.addr(ops[0]), ctx.src(ops[1], "u32")

        def tx(warp, mask):
            a = addr(warp)
            for i in np.flatnonzero(mask):
                mb = resolve_mbarrier(warp, int(a[i]), space, warp.where())
                (mb.expect_tx if op == "expect_tx" else mb.complete_tx)(int(rtx(warp)[i]))
        return tx
    if op in ("test_wait", "try_wait"):
        parity = "parity" in parts
        wdone = ctx.dst(ops[0], "pred")
        addr = ctx.addr(ops[1])
        rphase = ctx.src(ops[2], "u32" if parity else "b64")

        def wait(warp, mask):
            a = addr(warp)
            ph = rphase(warp)
            done = np.zeros(32, dtype=np.bool_)
            first = None
            for i in np.flatnonzero(mask):
                mb = resolve_mbarrier(warp, int(a[i]), space, warp.where())
                first = first or mb
                if parity:
                    done[i] = mb.parity_done(int(ph[i]))
                else:
                    done[i] = mb.phase > int(ph[i])
            wdone(warp, mask, done)
            if op == "try_wait" and not done[mask].any() and first is not None:
                # "try_wait": the thread may be suspended until the phase completes or a time limit passes
                # (PTX ISA, mbarrier.test_wait/try_wait). Sleep until the phase moves or the machine has
                # nothing else to run (the time limit; Machine.time_out_waits). A spin loop then tries again;
                # a probe (chapter 02's phase demo) goes on with its false.
                seen = first.phase
                m = warp.machine
                epoch = m.timeout_epoch

                def still():
                    return first.phase == seen and m.timeout_epoch == epoch
                still.timed = True
                warp.block(mask, still, first.state(), first)
        return wait
    if op == "pending_count":
        ctx.unsupported()
    ctx.unsupported()


# ---------------------------------------------------------------------------------------------
# Fences
# ---------------------------------------------------------------------------------------------


@handler("fence", "membar")
def h_fence(ctx):
    parts = ctx.parts
    if len(parts) > 1 and parts[1] == "proxy":
        kind = parts[2] if len(parts) > 2 else ""
        if kind.startswith("async"):
            def fence_async(warp, mask):
                warp.machine.fence_proxy_async(warp.cta, warp.index * 32 + np.flatnonzero(mask))
            return fence_async
        if kind.startswith("tensormap::generic"):
            from .asyncops import tensormap_fence

            return tensormap_fence(ctx)
        if kind in ("alias",):
            return lambda warp, mask: None
        ctx.unsupported()
    # fence.sc / fence.acq_rel / fence.mbarrier_init / membar: the emulator's memory is sequentially
    # consistent, so these order nothing further
    return lambda warp, mask: None


@handler("griddepcontrol")
def h_griddep(ctx):
    return lambda warp, mask: None
