"""The emulated GPU: clusters of CTAs of warps executing one kernel's PTX, and the asynchronous units.

Execution model (functional, never timing):

* **Warps** execute one instruction at a time for the lanes that sit at the same
  program counter. A warp whose lanes diverge runs the group with the lowest PC
  first; lanes meet again where their PCs meet (the code ``cute.compile`` emits lays
  out if/else and loops so that this is where the branches join). Warp-synchronous
  instructions (``.sync.aligned``, ``shfl.sync`` with a full mask, ...) need their lanes
  together and report a divergent warp otherwise.
* **Scheduling** is seeded and random: which warp runs next, for how many
  instructions, and when an asynchronous operation completes. A kernel that is only
  right under one interleaving shows it on some seed.
* **Asynchronous units** (TMA, bulk copies, ``cp.async``, WGMMA, tcgen05) turn an
  issued instruction into an operation that completes later; operations of one
  in-order unit (a warpgroup's WGMMAs, a CTA pair's tcgen05 MMAs and commits) complete
  in issue order, others in any order.
* **Waiting** never spins the emulator: a warp that waits on an mbarrier phase, a
  named barrier, a cluster barrier or a wait_group sleeps until what it waits for
  changes. ``mbarrier.try_wait`` is a *bounded* wait (PTX ISA: the thread may be
  suspended until the phase completes or a time limit passes, then it answers):
  its lanes sleep until the phase moves or until nothing else in the machine can
  run, which is when its time limit runs out; a probe then reads ``false`` and goes
  on. When every warp sleeps, no operation is left and waking the bounded waits
  again would only bring them back to where they were, that is a deadlock, and
  the report lists each warp's PC and every mbarrier's state.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field

import numpy as np

from . import ptx as ptxmod
from .errors import BarrierError, Deadlock, EmulatorError, RaceError
from .memory import GlobalMemory, SharedMemory, TMEM_COLUMNS, TMEM_LANES, shared_base, split_cluster

FULL = np.ones(32, dtype=np.bool_)
#: How late (in warp instructions executed meanwhile) an asynchronous operation may complete, by seed % 4.
LATENCY_SCALES = (16, 256, 2048, 16384)
LANES = np.arange(32, dtype=np.uint32)


class NeedConvergence(Exception):
    """Raised by a warp-synchronous instruction when not all of its lanes are at it yet."""


# ---------------------------------------------------------------------------------------------
# Synchronisation objects
# ---------------------------------------------------------------------------------------------


@dataclass
class MBarrier:
    """An mbarrier object (PTX ISA "mbarrier"): the current phase's pending arrivals and transaction count.

    The ISA keeps the object opaque; what it specifies is the behaviour: ``init`` sets the
    expected arrival count; an arrive decrements the pending count; ``expect_tx`` raises
    and ``complete_tx`` lowers the transaction count; the phase completes when both
    reach zero, after which the pending count resets to the expected count.
    """

    cta: object
    addr: int
    expected: int
    pending: int
    tx: int = 0
    phase: int = 0  # completed phases so far (parity = phase & 1)
    waiters: set = field(default_factory=set)  # warps parked on this barrier (woken when a phase completes)

    def where(self) -> str:
        return f"mbarrier at shared 0x{self.addr:x} of {self.cta.name}"

    def state(self) -> str:
        return (f"{self.where()}: phase {self.phase} (parity {self.phase & 1}), {self.pending} of "
                f"{self.expected} arrivals pending, tx-count {self.tx}")

    def arrive(self, count: int = 1, who: str = ""):
        if self.pending - count < 0:
            raise BarrierError(f"{count} arrival(s) on {self.where()} whose current phase expects only "
                               f"{self.pending} more (expected count {self.expected}); {who}")
        self.pending -= count
        self._maybe_complete()

    def expect_tx(self, nbytes: int):
        self.tx += nbytes

    def complete_tx(self, nbytes: int):
        self.tx -= nbytes
        self._maybe_complete()

    def _maybe_complete(self):
        if self.pending == 0 and self.tx == 0:
            self.phase += 1
            self.pending = self.expected
            m = self.cta.machine
            m.wake(self.waiters)
            self.waiters = set()
            if m.trace is not None:
                m.trace.phase(self, m.steps)
        elif self.pending == 0 and self.tx < 0:
            raise BarrierError(f"{self.where()}: more bytes completed than expected (tx-count {self.tx})")

    def parity_done(self, parity: int) -> bool:
        """``try_wait.parity P`` is true once the phase with parity ``P`` has completed (ISA: the parity of the
        *current* phase differs from ``P``)."""
        return (self.phase & 1) != (parity & 1)


@dataclass
class NamedBarrier:
    arrived: int = 0  # threads arrived in the current generation
    expected: int = 0
    generation: int = 0


# ---------------------------------------------------------------------------------------------
# Asynchronous operations
# ---------------------------------------------------------------------------------------------


class AsyncOp:
    """An issued asynchronous operation. ``unit``: operations with the same unit complete in issue order."""

    unit = None
    label = "async op"

    def ready(self) -> bool:
        return True

    def complete(self, machine: "Machine"):  # pragma: no cover - interface
        raise NotImplementedError


# ---------------------------------------------------------------------------------------------
# Warps, CTAs, clusters
# ---------------------------------------------------------------------------------------------


class Warp:
    def __init__(self, cta: "CTA", index: int, nregs: int):
        self.cta = cta
        self.machine = cta.machine
        self.index = index
        first = index * 32
        nthreads = cta.nthreads
        tids = first + np.arange(32)
        self.valid = tids < nthreads
        self.tid_linear = tids.astype(np.uint32)
        bx, by, _ = self.machine.launch_block
        self.tid = (tids % bx, (tids // bx) % by, tids // (bx * by))
        self.exited = ~self.valid
        self.regs = np.zeros((nregs, 32), dtype=np.uint64)
        self.pending = np.zeros(nregs, dtype=np.bool_)  # registers waiting for an async result
        self.pending_why: dict[int, str] = {}
        self.pc = 0
        self.pcs = None  # per-lane PCs while the warp is diverged
        self.parked: list = []  # [(lanes, still_waiting(), why)]: lane groups that wait for something
        self.done = not self.valid.any()
        self.steps = 0
        # per-thread asynchronous group state
        self.cp_async_open = [[] for _ in range(32)]  # ops of the open cp.async group, per lane
        self.cp_async_groups = [[] for _ in range(32)]  # committed groups (lists of ops), oldest first
        self.bulk_open = [[] for _ in range(32)]
        self.bulk_groups = [[] for _ in range(32)]
        self.wgmma_issued = 0  # wgmma.mma_async instructions issued (warpgroup-collective sequence)
        self.wgmma_groups: list = []  # committed wgmma groups (lists of ops), oldest first
        self.wgmma_open: list = []
        self.tcgen05_ld_pending = False
        self.maxnreg = None

    @property
    def name(self) -> str:
        return f"{self.cta.name} warp {self.index}"

    @property
    def active(self) -> np.ndarray:
        return ~self.exited

    def block(self, lanes: np.ndarray, still_waiting, why: str, obj=None):
        """Park ``lanes`` (which have moved past the waiting instruction) while ``still_waiting()`` is true.

        Other lane groups of a divergent warp keep running, as with independent thread scheduling:
        a lane that spins on an mbarrier does not stop the lane that will make it arrive. ``obj``: what
        is waited on (an :class:`MBarrier`), for the trace."""
        tr = self.machine.trace
        rec = tr.wait(self, obj, why) if tr is not None else None
        if obj is not None and hasattr(obj, "waiters"):
            obj.waiters.add(self)
        self.parked.append((lanes.copy(), still_waiting, why, None, rec))

    def wait_for_lanes(self, lanes: np.ndarray, others: np.ndarray, why: str):
        """Park ``lanes`` (still at their warp-synchronous instruction) until one of ``others`` is free."""
        self.parked.append((lanes.copy(), None, why, others.copy(), None))

    def free(self) -> np.ndarray:
        """Active lanes that are not parked (re-checking every parked group's condition)."""
        act = ~self.exited
        if self.parked:
            kept, waiting = [], []
            for entry in self.parked:
                if entry[1] is None:
                    waiting.append(entry)
                elif entry[1]():
                    kept.append(entry)
                    act = act & ~entry[0]
                elif entry[4] is not None:
                    self.machine.trace.resume(entry[4], self.machine.steps)
            for entry in waiting:  # lanes waiting for their warp's other lanes: free once one of those is
                if (act & entry[3] & ~entry[0]).any():
                    continue
                kept.append(entry)
                act = act & ~entry[0]
            self.parked = kept
        return act

    def current(self):
        """``(pc, lanes)``: the lanes to run next (the lowest PC among free lanes), or ``(None, None)``."""
        act = self.free()
        if not act.any():
            return None, None
        if self.pcs is None:
            return self.pc, act
        pcs = self.pcs
        pc = int(pcs[act].min())
        return pc, act & (pcs == pc)

    def groups(self):
        """Distinct PCs of the free lanes, lowest first (for a divergent warp)."""
        act = self.free()
        if self.pcs is None:
            return [(self.pc, act)] if act.any() else []
        return [(int(p), act & (self.pcs == p)) for p in np.unique(self.pcs[act])]

    @property
    def waiting_for(self) -> str:
        return "; ".join(entry[2] for entry in self.parked)

    def advance(self, pc: int, mask: np.ndarray, target=None):
        """Lanes ``mask`` at ``pc`` go to ``pc + 1``, or to ``target`` (an int, or per-lane where ``target`` is
        an array of PCs)."""
        act = ~self.exited
        if self.pcs is None and mask is act or (self.pcs is None and np.array_equal(mask, act)):
            if target is None:
                self.pc = pc + 1
                return
            if isinstance(target, (int, np.integer)):
                self.pc = int(target)
                return
            t = target[act]
            if (t == t[0]).all():
                self.pc = int(t[0])
                return
        if self.pcs is None:
            self.pcs = np.full(32, self.pc, dtype=np.int64)
        if target is None:
            self.pcs[mask] = pc + 1
        elif isinstance(target, (int, np.integer)):
            self.pcs[mask] = int(target)
        else:
            self.pcs[mask] = target[mask]
        p = self.pcs[act]
        if len(p) and (p == p[0]).all():
            self.pc = int(p[0])
            self.pcs = None

    def exit_lanes(self, mask: np.ndarray):
        from .isa.sync import on_warp_exit

        self.exited = self.exited | mask
        if self.exited.all():
            self.done = True
            self.machine.wake((self,))
            if self.machine.trace is not None:
                self.machine.trace.exited(self)
            self.cta.warp_done(self)
        on_warp_exit(self.cta)

    def where(self, pc: int | None = None, lanes=None) -> str:
        kernel = self.machine.kernel
        if pc is None and not self.done:
            pc = self.pc if self.pcs is None else int(self.pcs[~self.exited].min())
        lane_txt = ""
        if lanes is not None:
            ls = np.flatnonzero(lanes)
            lane_txt = f", lane {ls[0]}" if len(ls) == 1 else f", lanes {ls[0]}..{ls[-1]}" if len(ls) else ""
        if pc is None or pc >= len(kernel.body):
            return f"{self.name}{lane_txt} (exited)"
        inst = kernel.body[pc]
        return f"{self.name}{lane_txt}, PC {pc}, PTX line {inst.line}: {inst.text.strip()[:120]}"

    def runnable(self) -> bool:
        if self.done:
            return False
        return bool(self.free().any()) if self.parked else True

    # ---- registers
    def check_pending(self, idx: int, name: str, pc: int):
        if self.pending[idx]:
            raise RaceError(f"register {name} is read before {self.pending_why.get(idx, 'its async result')} "
                            f"is waited for", where=self.where(pc))

    def set_pending(self, idxs, why: str):
        for i in idxs:
            self.pending[i] = True
            self.pending_why[i] = why

    def clear_pending(self, idxs):
        for i in idxs:
            self.pending[i] = False
            self.pending_why.pop(i, None)


class CTA:
    def __init__(self, machine: "Machine", cluster: "Cluster", rank: int, ctaid: tuple, linear: int):
        self.machine = machine
        self.cluster = cluster
        self.rank = rank
        self.ctaid = ctaid
        self.linear = linear
        self.nthreads = machine.launch_block[0] * machine.launch_block[1] * machine.launch_block[2]
        self.smem = SharedMemory(machine.smem_total, shared_base(rank))
        # shared memory starts with whatever an earlier CTA left: a seeded pattern, not zeros
        self.smem.data[:] = machine.poison_bytes(len(self.smem.data))
        self.mbarriers: dict[int, MBarrier] = {}
        self.named: dict[int, NamedBarrier] = {}
        self.warps = [Warp(self, w, machine.nregs) for w in range(-(-self.nthreads // 32))]
        self.tmem = None  # created on first tcgen05 use (sm_100 kernels only)
        self.tmem_written = np.zeros((TMEM_LANES, TMEM_COLUMNS), dtype=np.bool_)
        self.tmem_alloc: dict[int, int] = {}  # column -> number of columns
        self.tmem_relinquished = False
        self.exited = False
        self.tensormap_cache: dict[int, bytes] = {}

    @property
    def name(self) -> str:
        x, y, z = self.ctaid
        return f"CTA ({x},{y},{z})" + (f" [cluster rank {self.rank}]" if self.cluster.size > 1 else "")

    def tensor_memory(self) -> np.ndarray:
        if self.tmem is None:
            self.tmem = np.zeros((TMEM_LANES, TMEM_COLUMNS), dtype=np.uint32)
        return self.tmem

    def mbarrier(self, addr: int, who: str = "") -> MBarrier:
        mb = self.mbarriers.get(addr)
        if mb is None:
            raise BarrierError(f"mbarrier at shared 0x{addr:x} of {self.name} is used before mbarrier.init",
                               where=who)
        return mb

    def warp_done(self, warp: Warp):
        if all(w.done for w in self.warps):
            self.exited = True
            self.machine.cta_exited(self)


class Cluster:
    def __init__(self, index: int, ctas: list):
        self.index = index
        self.ctas = ctas
        self.barrier_arrived = 0
        self.barrier_generation = 0

    @property
    def size(self) -> int:
        return len(self.ctas)

    def threads(self) -> int:
        return sum(c.nthreads for c in self.ctas)


# ---------------------------------------------------------------------------------------------
# The machine
# ---------------------------------------------------------------------------------------------


class Machine:
    """One kernel launch on the emulator (see :func:`gemmlab.emulator.run.run_launch`)."""

    def __init__(self, module: ptxmod.Module, kernel: ptxmod.Kernel, launch, memory: GlobalMemory, *,
                 seed: int = 0, arch: str = "sm_90a", max_steps: int = 50_000_000, trace=None,
                 async_bias: float = 0.35, burst: int = 24, latency: int | None = None):
        from .isa import compile_kernel

        self.module = module
        self.kernel = kernel
        self.launch = launch
        self.arch = arch
        self.memory = memory
        self.rng = random.Random(seed)
        self.trace = trace
        self.async_bias = async_bias
        self.burst = burst
        #: the most warp instructions an asynchronous operation may wait before completing (by seed, when not
        #: given: LATENCY_SCALES, so a handful of seeds covers prompt and very late completions)
        self.latency = latency if latency is not None else LATENCY_SCALES[seed % len(LATENCY_SCALES)]
        self.max_steps = max_steps
        self.launch_block = tuple(launch.block)
        self.grid = tuple(launch.grid)
        self.cluster_dims = tuple(launch.cluster)
        self.param = np.frombuffer(b"".join(self._param_bytes()), dtype=np.uint8).copy()
        self.param_offsets = kernel.param_offsets()
        self.shared_symbols, self.smem_total = self._shared_layout(launch.smem)
        # registers: one row per declared register
        self.reg_index = {name: i for i, name in enumerate(kernel.regs)}
        self.reg_type = [kernel.regs[n] for n in kernel.regs]
        self.nregs = max(len(self.reg_index), 1)
        self.program = compile_kernel(self)
        self.pending: list[AsyncOp] = []
        self._poison = np.random.default_rng(seed).integers(0, 256, size=256 * 1024, dtype=np.uint8)
        self._dirty: set = set()
        self._running = None
        self.steps = 0
        self.clock = 0
        self._woken = True
        self.wakes = 0  # state changes that may end a wait (phases, barriers, completed operations)
        self.timeout_epoch = 0  # bumped when the bounded waits (try_wait) time out
        self._timeouts_seen: set = set()
        self.notes: list[str] = []  # what instructions observed that a run's report should mention
        self.clusters: list[Cluster] = []
        self.ctas: list[CTA] = []
        self._build_grid()

    # ---- set-up
    def _param_bytes(self):
        out, off = [], 0
        for (name, size, align), raw in zip(self.kernel.params, self.launch.params):
            pad = -off % align
            out.append(b"\0" * pad)
            off += pad
            if len(raw) != size:
                raise EmulatorError(f"parameter {name} has {len(raw)} bytes; the kernel declares {size}")
            out.append(bytes(raw))
            off += size
        return out

    def _shared_layout(self, dynamic: int):
        """Offsets of the module's shared variables in a CTA's shared memory: static ones first, then the
        dynamic (extern) one; and the bytes a CTA needs."""
        symbols, off = {}, 0
        externs = []
        for name, (align, size) in self.module.shared.items():
            if size is None:
                externs.append((name, align))
                continue
            off = -(-off // align) * align
            symbols[name] = off
            off += size
        for name, align in externs:
            off = -(-off // max(align, 16)) * max(align, 16)
            symbols[name] = off
        total = off + dynamic
        return symbols, total

    def _build_grid(self):
        gx, gy, gz = self.grid
        cx, cy, cz = self.cluster_dims
        if gx % cx or gy % cy or gz % cz:
            raise EmulatorError(f"grid {self.grid} is not a whole number of clusters {self.cluster_dims}")
        index = 0
        for z0 in range(0, gz, cz):
            for y0 in range(0, gy, cy):
                for x0 in range(0, gx, cx):
                    cluster = Cluster(index, [])
                    rank = 0
                    for dz in range(cz):
                        for dy in range(cy):
                            for dx in range(cx):
                                x, y, z = x0 + dx, y0 + dy, z0 + dz
                                cta = CTA(self, cluster, rank, (x, y, z), x + gx * (y + gy * z))
                                cluster.ctas.append(cta)
                                self.ctas.append(cta)
                                rank += 1
                    self.clusters.append(cluster)
                    index += 1

    def poison_bytes(self, n: int) -> np.ndarray:
        reps = -(-n // len(self._poison))
        return np.tile(self._poison, reps)[:n]

    # ---- running
    def wake(self, warps=None):
        """Something changed: re-check ``warps`` (all warps when None) before the next choice."""
        self.wakes += 1
        if warps is None:
            self._woken = True
        else:
            self._dirty.update(warps)

    def time_out_waits(self, live) -> bool:
        """Nothing can run: let the bounded waits (``mbarrier.try_wait``) time out, unless that was already
        tried from this very state (same lanes waiting at the same PCs, no wake since), which is a deadlock."""
        sig = []
        for w in live:
            for entry in w.parked:
                if getattr(entry[1], "timed", False):
                    pcs = (w.pc,) if w.pcs is None else tuple(int(p) for p in w.pcs)
                    sig.append((w.cta.linear, w.index, pcs, entry[0].tobytes()))
        if not sig:
            return False
        key = (self.wakes, tuple(sig))
        if key in self._timeouts_seen:
            return False
        if not any(k[0] == self.wakes for k in self._timeouts_seen):
            self._timeouts_seen = set()
        self._timeouts_seen.add(key)
        self.timeout_epoch += 1
        return True

    def issue(self, op: AsyncOp):
        # each operation takes a random time (in warp instructions executed meanwhile) before it may
        # complete; the seed's latency scale ranges from "at once" to "very late", so missing waits show
        op.due = self.steps + self.rng.randint(0, self.latency)
        if getattr(op, "owners", None) is None:
            op.owners = (self._running,) if self._running is not None else None
        self.pending.append(op)

    def eligible_ops(self) -> list[AsyncOp]:
        seen_units = set()
        out = []
        for op in self.pending:
            if op.unit is not None:
                if op.unit in seen_units:
                    continue
                seen_units.add(op.unit)
            if op.ready():
                out.append(op)
        return out

    def complete_op(self, op: AsyncOp):
        self.pending.remove(op)
        if self.trace is not None:
            self.trace.op_done(self, op)
        op.complete(self)
        self.wake(op.owners)

    def run(self):
        warps = [w for c in self.ctas for w in c.warps if not w.done]
        rng = self.rng
        runnable: list = []
        in_runnable: set = set()
        checked_all = False
        self._woken = True
        while True:
            if self._woken:  # re-check every warp
                self._woken = False
                self._dirty.clear()
                warps = [w for w in warps if not w.done]
                runnable = [w for w in warps if w.runnable()]
                in_runnable = set(map(id, runnable))
            elif self._dirty:  # re-check the warps an event concerned
                # in a fixed order (set order follows memory addresses): the same seed, the same run
                for w in sorted(self._dirty, key=lambda w: (w.cta.linear, w.index)):
                    ok = w.runnable()
                    if ok and id(w) not in in_runnable:
                        runnable.append(w)
                        in_runnable.add(id(w))
                    elif not ok and id(w) in in_runnable:
                        runnable.remove(w)
                        in_runnable.discard(id(w))
                self._dirty.clear()
                if any(w.done for w in warps):
                    warps = [w for w in warps if not w.done]
            if not warps and not self.pending:
                break
            if self.pending and (not runnable or rng.random() < self.async_bias):
                ops = self.eligible_ops()
                if not runnable:
                    if not ops:
                        if not warps:
                            raise Deadlock("asynchronous operations remain that can never complete:\n  " +
                                           "\n  ".join(op.label for op in self.pending))
                        if self.time_out_waits(warps):
                            self._woken = True
                            continue
                        raise Deadlock(self.deadlock_report(warps))
                    self.complete_op(min(ops, key=lambda o: o.due))  # nothing else can happen: the earliest
                    continue
                due = [o for o in ops if o.due <= self.steps]
                if due:
                    self.complete_op(due[rng.randrange(len(due))])
                    continue
            if not runnable:
                if not self.pending:  # a state change nobody announced? re-check everything once
                    if not checked_all:
                        checked_all = self._woken = True
                    elif self.time_out_waits(warps):  # then let bounded waits time out, then give up
                        self._woken = True
                    else:
                        raise Deadlock(self.deadlock_report(warps))
                continue
            checked_all = False
            warp = runnable[rng.randrange(len(runnable))]
            self._running = warp
            self.run_warp(warp, rng.randint(1, self.burst))
            self._running = None
            if warp.done or not warp.runnable():
                if id(warp) in in_runnable:
                    runnable.remove(warp)
                    in_runnable.discard(id(warp))
            if self.steps > self.max_steps:
                raise EmulatorError(f"the kernel ran more than {self.max_steps} warp instructions; "
                                    "raise max_steps if that is expected")
        self.finish()

    def run_warp(self, warp: Warp, budget: int):
        program = self.program
        for _ in range(budget):
            if warp.done:
                return
            pc, mask = warp.current()
            if pc is None:
                return
            if pc >= len(program):
                raise EmulatorError("fell off the end of the kernel without ret/exit", where=warp.where(pc, mask))
            try:
                program[pc](warp, pc, mask)
            except NeedConvergence:
                if not self._run_other_group(warp, pc):
                    # the other lanes are parked elsewhere: wait for them here
                    warp.wait_for_lanes(mask, ~warp.exited & ~mask,
                                        f"its other lanes, to execute a warp-synchronous instruction together (PC {pc})")
                    return
            except EmulatorError as e:
                if not e.where:
                    e.where = warp.where(pc, mask)
                    e.args = (f"{e.message}\n  at {e.where}",)
                raise
            warp.steps += 1
            self.steps += 1
            self.clock += 1

    def _run_other_group(self, warp: Warp, blocked_pc: int) -> bool:
        """A divergent warp: run a lane group other than the one waiting at a warp-synchronous instruction."""
        for pc, mask in warp.groups():
            if pc == blocked_pc:
                continue
            if self.program is None:
                return False
            try:
                self.program[pc](warp, pc, mask)
                return True
            except NeedConvergence:
                continue
        return False

    def finish(self):
        if self.trace is not None:
            self.trace.finish(self)
        for cta in self.ctas:
            if cta.tmem_alloc:
                cols = ", ".join(f"{n} columns at column {c}" for c, n in sorted(cta.tmem_alloc.items()))
                from .errors import TmemError

                raise TmemError(f"{cta.name} exited with tensor memory still allocated ({cols}): every "
                                "tcgen05.alloc needs its tcgen05.dealloc before the CTA exits")

    def cta_exited(self, cta: CTA):
        for op in self.pending:
            reads = getattr(op, "reads_smem_of", None)
            if reads is cta:
                raise RaceError(f"{cta.name} exited while {op.label} may still be reading its shared memory: "
                                "wait for the bulk group's reads (cp.async.bulk.wait_group.read) before exiting")

    def deadlock_report(self, live) -> str:
        lines = ["every warp is waiting and no asynchronous operation can complete:"]
        for w in live:
            why = w.waiting_for or "blocked"
            lines.append(f"  {w.where()}  -- waiting on {why}")
        for cta in self.ctas:
            for mb in cta.mbarriers.values():
                lines.append("  " + mb.state())
        return "\n".join(lines)

    # ---- the async-proxy rule (fence.proxy.async)
    def check_async_read(self, cta: CTA, addr: int, nbytes: int, what: str):
        """Shared memory read by the async proxy (TMA store, WGMMA/UMMA operands) must not hold generic-proxy
        writes that their writer has not fenced (PTX ISA, "Proxies": fence.proxy.async)."""
        sm = cta.smem
        if not sm.unfenced_any:
            return
        off = addr - sm.base
        seg = sm.unfenced[max(off, 0):off + nbytes]
        if seg.any():
            t = int(seg[seg > 0][0]) - 1
            raise RaceError(f"{what} reads shared memory at 0x{addr:x} that thread {t} ({cta.name} warp {t // 32}, "
                            f"lane {t % 32}) wrote with ordinary stores and has not yet ordered for the async proxy "
                            "with fence.proxy.async")

    def fence_proxy_async(self, cta: CTA, threads: np.ndarray):
        sm = cta.smem
        if sm.unfenced_any:
            hit = np.isin(sm.unfenced, threads.astype(np.int32) + 1)
            sm.unfenced[hit] = 0
            sm.unfenced_any = bool(sm.unfenced.any())

    # ---- helpers for instructions
    def shared_window(self, cta: CTA, addr: int):
        """A ``shared::cluster`` address -> (the CTA that owns it, its shared::cta address)."""
        rank, a = split_cluster(addr, cta.rank)
        if rank >= cta.cluster.size:
            from .errors import MemoryFault

            raise MemoryFault(f"shared::cluster address 0x{addr:x} names CTA rank {rank}; the cluster has "
                              f"{cta.cluster.size}")
        target = cta.cluster.ctas[rank]
        if target.exited and target is not cta:
            raise RaceError(f"access to the shared memory of {target.name}, which has exited")
        return target, a
