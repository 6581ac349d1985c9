"""Chapter 02 (part 2): the producer/consumer ring and the ``PipelineState`` every later kernel uses.

What it teaches
    A *ring* of S shared-memory stages, each guarded by two mbarriers:
    ``full[s]`` ("stage s holds an item": the producer arrives, consumers wait)
    and ``empty[s]`` ("stage s may be overwritten": consumers arrive, the
    producer waits). Each side walks the ring with a :class:`PipelineState`:
    the stage ``index`` it is at and the ``phase`` bit it expects, flipped each
    time the index wraps. The producer starts at phase 1, so its first wait on
    each fresh ``empty`` barrier passes at once (the parity rule of
    :meth:`gemmlab.mbarrier.Mbarrier.try_wait_parity`).

    The state is created once per kernel and advanced across *every* loop,
    tiles included; it is never reset per tile. Resetting it breaks as soon as
    the number of items per tile is not a multiple of 2 x stages: the
    simulation below shows the stale reads it causes.

What it adds over the mbarrier chapter's first half
    Many phases on many barriers, driven by two roles in different warps (warp
    0 produces, warps 1..W consume), persistent across several tiles.

The code
    * :class:`PipelineState`: the plain-Python state machine (CPU models, tests).
    * :class:`DevicePipelineState`: its device twin, carried through dynamic
      ``cutlass.range`` loops because it declares its run-time values
      (``__extract_mlir_values__`` / ``__new_from_mlir_values__``).
    * :func:`simulate_ring`: a tick-by-tick CPU simulation of the ring on the
      :class:`~gemmlab.mbarrier.Mbarrier` model (order, stale reads, deadlock).
    * :func:`ring_copy`: the ring on the GPU; every consumer warp copies its
      slice of each stage to the output and logs the (stage, phase) it used.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field

import cutlass
import cutlass.cute as cute
import cuda.bindings.driver as cuda
from cutlass import Int32, Int64

from .checks import check_choice, check_int, check_tensor
from .compile import check_target, compile_for, fake_stream, fake_tensor, launcher
from .mbarrier import Mbarrier, fence_mbarrier_init, mbarrier_arrive, mbarrier_init, mbarrier_wait_parity
from .tiers import require_tier

# --------------------------------------------------------------------------------------
# PipelineState: the CPU class and its device twin (same arithmetic)
# --------------------------------------------------------------------------------------


class PipelineState:
    """Where one role is in the ring: stage ``index``, expected ``phase``, items done (``count``).

    ``advance()`` moves to the next stage; when the index wraps to 0 the phase
    flips, because every barrier of the ring has completed one more phase by
    the time this role comes back to it. Create it once per kernel; never reset
    it per tile.
    """

    def __init__(self, stages: int, index: int = 0, phase: int = 0, count: int = 0):
        stages = check_int("stages", stages, lo=1)
        index = check_int("index", index, lo=0, hi=stages - 1)
        phase = check_choice("phase", phase, (0, 1))
        count = check_int("count", count, lo=0)
        self.stages, self.index, self.phase, self.count = stages, index, phase, count

    @classmethod
    def producer(cls, stages: int) -> "PipelineState":
        """The producer waits on ``empty`` barriers: phase 1, which a fresh barrier reports complete."""
        return cls(stages, 0, 1)

    @classmethod
    def consumer(cls, stages: int) -> "PipelineState":
        """The consumer waits on ``full`` barriers: phase 0, complete once the producer has arrived."""
        return cls(stages, 0, 0)

    def advance(self) -> None:
        nxt = self.index + 1
        self.phase ^= nxt // self.stages  # 1 exactly when the index wraps
        self.index = nxt % self.stages
        self.count += 1

    def as_tuple(self) -> tuple[int, int, int]:
        return (self.index, self.phase, self.count)

    def __eq__(self, other) -> bool:
        return isinstance(other, PipelineState) and (self.stages, *self.as_tuple()) == (other.stages, *other.as_tuple())

    def __repr__(self) -> str:
        return f"PipelineState(stages={self.stages}, index={self.index}, phase={self.phase}, count={self.count})"


class DevicePipelineState:
    """The device twin of :class:`PipelineState`, for ``@cute.kernel`` / ``@cute.jit`` code.

    ``stages`` is a Python int (known when the kernel is compiled), so the
    ``//`` and ``%`` below become a compare and a select. ``index``, ``phase``
    and ``count`` are run-time ``Int32`` values. A dynamic loop (``cutlass.range``,
    ``while``) can carry this object from one iteration to the next because it
    tells the compiler which values are its state: ``__extract_mlir_values__``
    flattens it to three IR values, ``__new_from_mlir_values__`` rebuilds it
    from the loop's block arguments.
    """

    def __init__(self, stages: int, index, phase, count=0):
        self.stages = stages
        self.index = Int32(index)
        self.phase = Int32(phase)
        self.count = Int32(count)

    @staticmethod
    def producer(stages: int) -> "DevicePipelineState":
        return DevicePipelineState(stages, 0, 1)

    @staticmethod
    def consumer(stages: int) -> "DevicePipelineState":
        return DevicePipelineState(stages, 0, 0)

    def advance(self) -> None:
        nxt = self.index + 1
        self.phase = self.phase ^ (nxt // self.stages)  # same arithmetic as the CPU class
        self.index = nxt % self.stages
        self.count = self.count + 1

    def next(self) -> "DevicePipelineState":
        """A new state one step ahead (for loops in helper functions, which must rebind what they carry)."""
        nxt = DevicePipelineState(self.stages, self.index, self.phase, self.count)
        nxt.advance()
        return nxt

    # The loop-carry protocol: which values follow run-time control flow.
    def __extract_mlir_values__(self):
        return [self.index.ir_value(), self.phase.ir_value(), self.count.ir_value()]

    def __new_from_mlir_values__(self, values):
        return DevicePipelineState(self.stages, Int32(values[0]), Int32(values[1]), Int32(values[2]))


def state_sequence(stages: int, steps: int, start_phase: int = 0) -> list[tuple[int, int, int]]:
    """``(index, phase, count)`` before each of ``steps`` advances (the CPU class)."""
    check_int("steps", steps, lo=0)
    st = PipelineState(stages, 0, start_phase)
    out = []
    for _ in range(steps):
        out.append(st.as_tuple())
        st.advance()
    return out


@cute.kernel
def state_trace_kernel(out: cute.Tensor, stages: cutlass.Constexpr, tiles: cutlass.Constexpr,
                       k_tiles: cutlass.Constexpr, start_phase: cutlass.Constexpr):
    """One thread walks ``tiles`` x ``k_tiles`` steps, writing (index, phase, count) before each."""
    state = DevicePipelineState(stages, 0, start_phase)
    for tile in cutlass.range(tiles):
        for k in cutlass.range(k_tiles):
            step = tile * k_tiles + k
            out[3 * step] = state.index
            out[3 * step + 1] = state.phase
            out[3 * step + 2] = state.count
            state.advance()


@functools.lru_cache(maxsize=None)
def _state_trace_host(stages: int, tiles: int, k_tiles: int, start_phase: int):
    @cute.jit
    def state_trace_host(out: cute.Tensor, stream: cuda.CUstream):
        state_trace_kernel(out, stages, tiles, k_tiles, start_phase).launch(
            grid=(1, 1, 1), block=(1, 1, 1), stream=stream)

    return state_trace_host


def _check_trace_args(stages, tiles, k_tiles, start_phase):
    check_int("stages", stages, lo=1, hi=64)
    check_int("tiles", tiles, lo=1, hi=64)
    check_int("k_tiles", k_tiles, lo=1, hi=64)
    check_choice("start_phase", start_phase, (0, 1))


def compile_state_trace(target: str = "sm_90a", stages: int = 3, tiles: int = 3, k_tiles: int = 5,
                        start_phase: int = 0):
    """Compile :func:`state_trace_kernel` without a GPU.

    With every bound known, the compiler unrolls the loops and folds the whole
    sequence into constant stores: the PTX itself lists the device twin's states.
    """
    check_target(target)
    _check_trace_args(stages, tiles, k_tiles, start_phase)
    return compile_for(target, _state_trace_host(stages, tiles, k_tiles, start_phase),
                       fake_tensor(Int32, (3 * tiles * k_tiles,)), fake_stream())


def run_state_trace(stages: int = 3, tiles: int = 3, k_tiles: int = 5, start_phase: int = 0):
    """Launch :func:`state_trace_kernel`; return its ``(index, phase, count)`` list."""
    _check_trace_args(stages, tiles, k_tiles, start_phase)
    require_tier("gpu", "gemmlab.pipeline.run_state_trace")
    import torch

    out = torch.full((3 * tiles * k_tiles,), -1, dtype=torch.int32, device="cuda")  # poisoned
    launcher(_state_trace_host(stages, tiles, k_tiles, start_phase), out)()
    torch.cuda.synchronize()
    return [tuple(r) for r in out.view(-1, 3).tolist()]


# --------------------------------------------------------------------------------------
# The ring, simulated on the CPU
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RingEvent:
    """One piece of an agent's timeline: ``[start, end)`` ticks."""

    agent: str  # "producer" or "consumer c"
    kind: str  # "fill", "drain" or "wait"
    start: int
    end: int
    stage: int
    phase: int  # the parity this agent waited for
    item: int  # the item it meant to move
    seen: int | None = None  # drain only: the item actually found in the stage


@dataclass
class RingRun:
    """What :func:`simulate_ring` saw."""

    stages: int
    k_tiles: int
    tiles: int
    consumers: int
    reset_per_tile: bool
    events: list[RingEvent] = field(default_factory=list)
    consumed: list[list[int]] = field(default_factory=list)  # per consumer, the items it read
    deadlock: bool = False
    ticks: int = 0
    overwritten: list[int] = field(default_factory=list)  # items the producer overwrote before all consumers read them
    full_parity: list[list[int]] = field(default_factory=list)  # [tick][stage]
    empty_parity: list[list[int]] = field(default_factory=list)

    @property
    def items(self) -> int:
        return self.k_tiles * self.tiles

    @property
    def ok(self) -> bool:
        """No deadlock, nothing overwritten unread, every consumer read items 0, 1, 2, ... in order."""
        want = list(range(self.items))
        return not self.deadlock and not self.overwritten and all(c == want for c in self.consumed)

    def stale_reads(self) -> list[RingEvent]:
        return [e for e in self.events if e.kind == "drain" and e.seen != e.item]


class _Agent:
    """One role: a fixed list of steps (wait on a barrier, work, arrive on another)."""

    def __init__(self, name, steps, duration):
        self.name, self.steps, self.duration = name, steps, duration
        self.pos = 0  # next step
        self.busy_until = None  # tick at which the current work ends
        self.wait_since = None

    @property
    def done(self):
        return self.pos == len(self.steps) and self.busy_until is None


def _role_steps(role, stages, k_tiles, tiles, reset_per_tile):
    """(stage, phase, item) for each item, from a PipelineState kept (or reset) across tiles."""
    make = PipelineState.producer if role == "producer" else PipelineState.consumer
    state = make(stages)
    steps = []
    for tile in range(tiles):
        if reset_per_tile:
            state = make(stages)  # the bug this chapter warns about
        for k in range(k_tiles):
            steps.append((state.index, state.phase, tile * k_tiles + k))
            state.advance()
    return steps


def simulate_ring(stages: int = 4, k_tiles: int = 5, tiles: int = 3, *, consumers: int = 1,
                  fill_ticks: int = 1, drain_ticks: int = 2, reset_per_tile: bool = False,
                  max_ticks: int = 100_000) -> RingRun:
    """Run the ring tick by tick on :class:`~gemmlab.mbarrier.Mbarrier` models.

    One producer fills each stage in ``fill_ticks`` ticks, then arrives on
    ``full[s]`` (count 1). Each of ``consumers`` consumers reads every item:
    it waits ``full[s]``, reads the stage at the start of its ``drain_ticks``
    ticks of work, then arrives on ``empty[s]`` (count ``consumers``). Waits
    are checked at the start of a tick, arrivals land at its end. The run
    stops when everyone is done, or with ``deadlock=True`` when nobody works
    and no wait can pass.
    """
    for name, v, lo in (("stages", stages, 1), ("k_tiles", k_tiles, 1), ("tiles", tiles, 1),
                        ("consumers", consumers, 1), ("fill_ticks", fill_ticks, 1), ("drain_ticks", drain_ticks, 1)):
        check_int(name, v, lo=lo)
    full = [Mbarrier(1) for _ in range(stages)]
    empty = [Mbarrier(consumers) for _ in range(stages)]
    buffer: list[int | None] = [None] * stages  # which item each stage holds
    unread: list[set] = [set() for _ in range(stages)]  # consumers that have not read it yet
    run = RingRun(stages, k_tiles, tiles, consumers, reset_per_tile, consumed=[[] for _ in range(consumers)])

    producer = _Agent("producer", _role_steps("producer", stages, k_tiles, tiles, reset_per_tile), fill_ticks)
    eaters = [_Agent(f"consumer {c}", _role_steps("consumer", stages, k_tiles, tiles, reset_per_tile), drain_ticks)
              for c in range(consumers)]
    agents = [producer, *eaters]
    seen: dict[tuple[int, int], int | None] = {}

    t = 0
    while not all(a.done for a in agents):
        if t >= max_ticks:
            raise RuntimeError(f"simulation did not finish in {max_ticks} ticks")
        run.full_parity.append([b.parity for b in full])
        run.empty_parity.append([b.parity for b in empty])
        progressed = False
        # Waits, against the barriers as they are at the start of the tick.
        for a in agents:
            if a.busy_until is not None or a.pos == len(a.steps):
                continue
            stage, phase, item = a.steps[a.pos]
            bar = empty[stage] if a is producer else full[stage]
            if not bar.try_wait_parity(phase):
                if a.wait_since is None:
                    a.wait_since = t
                continue
            if a.wait_since is not None:
                run.events.append(RingEvent(a.name, "wait", a.wait_since, t, stage, phase, item))
                a.wait_since = None
            a.busy_until = t + a.duration
            progressed = True
            if a is not producer:  # a consumer reads the stage as its work starts
                seen[(agents.index(a), a.pos)] = buffer[stage]
                unread[stage].discard(agents.index(a))
        # Work that ends this tick: write (producer), then arrive.
        for a in agents:
            if a.busy_until is None or a.busy_until != t + 1:
                continue
            stage, phase, item = a.steps[a.pos]
            if a is producer:
                if unread[stage]:
                    run.overwritten.append(buffer[stage])
                buffer[stage] = item
                unread[stage] = set(range(1, consumers + 1))
                run.events.append(RingEvent(a.name, "fill", t + 1 - a.duration, t + 1, stage, phase, item))
                full[stage].arrive()
            else:
                c = agents.index(a) - 1
                got = seen.pop((c + 1, a.pos))
                run.consumed[c].append(got)
                run.events.append(RingEvent(a.name, "drain", t + 1 - a.duration, t + 1, stage, phase, item, got))
                empty[stage].arrive()
            a.pos += 1
            a.busy_until = None
            progressed = True
        t += 1
        if not progressed and all(a.busy_until is None for a in agents):
            if not all(a.done for a in agents):
                run.deadlock = True
                for a in agents:
                    if a.wait_since is not None:
                        stage, phase, item = a.steps[a.pos]
                        run.events.append(RingEvent(a.name, "wait", a.wait_since, t, stage, phase, item))
            break
    run.ticks = t
    return run


def ring_table(run: RingRun, agent: str = "consumer 0") -> str:
    """One agent's items as text: item, stage, phase it waited for, item it found."""
    lines = [f"{agent}: item  stage  phase  found"]
    for e in run.events:
        if e.agent == agent and e.kind in ("fill", "drain"):
            found = "" if e.seen is None else str(e.seen) + ("" if e.seen == e.item else "  <- stale")
            lines.append(f"{'':>{len(agent)}}  {e.item:>4}  {e.stage:>5}  {e.phase:>5}  {found}")
    if run.deadlock:
        lines.append("DEADLOCK: nobody can move")
    return "\n".join(lines)


def draw_ring_timeline(run: RingRun, name: str = "02_ring_timeline", title: str | None = None):
    """Draw ``run``: a lane per agent (boxes coloured by stage and labelled with the
    item, hatched grey while waiting), and below it the phase parity of every
    ``full[s]`` and ``empty[s]`` barrier over time. Red boxes are the bugs: a
    consumer that found another item in the stage ("6 (1)": item 6 expected,
    item 1 read) and a producer fill that destroyed an unread item ("11 (x6)").

    Returns ``(path, data)``; ``data`` holds the arrays behind the picture:
    ``full_parity`` and ``empty_parity`` (ticks x stages) and ``boxes``
    (agent, kind, start, end, stage, phase, item, seen) rows.
    """
    import numpy as np
    from matplotlib.patches import Rectangle

    from .figures import new_figure, save

    agents = ["producer"] + [f"consumer {c}" for c in range(run.consumers)]
    full_p = np.array(run.full_parity, dtype=int).reshape(-1, run.stages)
    empty_p = np.array(run.empty_parity, dtype=int).reshape(-1, run.stages)
    boxes = [(e.agent, e.kind, e.start, e.end, e.stage, e.phase, e.item, e.seen) for e in run.events]
    colors = ["#4C72B0", "#55A868", "#C44E52", "#8172B2", "#CCB974", "#64B5CD", "#DD8452", "#937860"]

    n_rows = len(agents)
    fig, (ax, axb) = new_figure(2, 1, figsize=(max(9, run.ticks * 0.32), 1.8 + 0.55 * n_rows + 0.25 * 2 * run.stages),
                                sharex=True, gridspec_kw={"height_ratios": [n_rows + 0.6, 0.45 * 2 * run.stages]})
    # Fills that destroyed an item some consumer had not read yet.
    clobbers = {}  # item written -> item it destroyed
    fills = [e for e in run.events if e.kind == "fill"]
    for e in fills:
        prev = [f for f in fills if f.stage == e.stage and f.end <= e.start]
        if prev and prev[-1].item in run.overwritten:
            clobbers[e.item] = prev[-1].item
    for e in run.events:
        y = agents.index(e.agent)
        if e.kind == "wait":
            ax.add_patch(Rectangle((e.start, y - 0.3), e.end - e.start, 0.6, facecolor="#DDDDDD",
                                   hatch="///", edgecolor="#999999", lw=0.5))
            continue
        stale = (e.kind == "drain" and e.seen != e.item) or (e.kind == "fill" and e.item in clobbers)
        ax.add_patch(Rectangle((e.start, y - 0.4), e.end - e.start, 0.8, facecolor=colors[e.stage % len(colors)],
                               edgecolor="red" if stale else "black", lw=2.5 if stale else 0.6))
        if not stale:
            label = f"{e.item}"
        elif e.kind == "drain":
            label = f"{e.item}\n({e.seen})"
        else:
            label = f"{e.item}\n(x{clobbers[e.item]})"
        ax.text((e.start + e.end) / 2, y, label, ha="center", va="center", fontsize=7 if e.end - e.start > 1 else 6,
                color="white", fontweight="bold")
    ax.set_yticks(range(n_rows))
    ax.set_yticklabels(agents)
    ax.set_ylim(n_rows - 0.4, -0.6)
    ax.set_xlim(0, max(run.ticks, 1))
    handles = [Rectangle((0, 0), 1, 1, facecolor=colors[s % len(colors)]) for s in range(run.stages)]
    handles.append(Rectangle((0, 0), 1, 1, facecolor="#DDDDDD", hatch="///", edgecolor="#999999"))
    ax.legend(handles, [f"stage {s}" for s in range(run.stages)] + ["waiting"], ncol=run.stages + 1,
              loc="lower left", bbox_to_anchor=(0, 1.0), fontsize=7, frameon=False)
    if title is None:
        how = "reset per tile" if run.reset_per_tile else "carried across tiles"
        title = (f"{run.stages} stages, {run.tiles} tiles x {run.k_tiles} items, PipelineState {how}"
                 + (" -- DEADLOCK" if run.deadlock else "")
                 + (f" -- {len(run.stale_reads())} stale read(s)" if run.stale_reads() else "")
                 + (f" -- {len(run.overwritten)} item(s) overwritten unread" if run.overwritten else ""))
    ax.set_title(title, pad=22, fontsize=10)
    # Tile boundaries in the producer's lane.
    for e in run.events:
        if e.agent == "producer" and e.kind == "fill" and e.item % run.k_tiles == 0 and e.item:
            ax.axvline(e.start, color="black", ls=":", lw=0.8)

    grid = np.concatenate([full_p.T, empty_p.T], axis=0)  # rows: full[0..S-1], empty[0..S-1]
    axb.imshow(grid, aspect="auto", cmap="Greys", vmin=0, vmax=1.8, interpolation="nearest",
               extent=(0, grid.shape[1], grid.shape[0] - 0.5, -0.5))
    axb.set_yticks(range(2 * run.stages))
    axb.set_yticklabels([f"full[{s}]" for s in range(run.stages)] + [f"empty[{s}]" for s in range(run.stages)],
                        fontsize=7)
    axb.set_xlabel("tick  (barrier rows: phase parity, grey = 1)")
    path = save(fig, name)
    return path, {"full_parity": full_p, "empty_parity": empty_p, "boxes": boxes}


# --------------------------------------------------------------------------------------
# The ring on the GPU
# --------------------------------------------------------------------------------------

ITEM_WORDS = 128  # int32 words per item (512 bytes): 32 producer lanes x 4 words
PRODUCER_THREADS = 32  # warp 0; every lane arrives on full[s] after its own stores
CONSUMER_WARP_CHOICES = (1, 2, 4)  # consumer threads must split ITEM_WORDS evenly


@cute.jit
def producer_warp(src: cute.Tensor, ring: cute.Tensor, full_bars, empty_bars, lane,
                  stages: cutlass.Constexpr, k_tiles: cutlass.Constexpr, tiles: cutlass.Constexpr):
    """Warp 0: wait until a stage is empty, fill it from global memory, mark it full."""
    state = DevicePipelineState.producer(stages)  # phase 1: fresh empty barriers read as complete
    for tile in cutlass.range(tiles, unroll=1):  # real loops: a persistent kernel's tile count is not small
        for k in cutlass.range(k_tiles, unroll=1):
            item = tile * k_tiles + k
            mbarrier_wait_parity(empty_bars + state.index, state.phase)
            for j in cutlass.range_constexpr(ITEM_WORDS // PRODUCER_THREADS):
                w = lane * (ITEM_WORDS // PRODUCER_THREADS) + j
                ring[state.index * ITEM_WORDS + w] = src[item * ITEM_WORDS + w]
            # Every lane arrives (count 32): each release covers that lane's own stores.
            mbarrier_arrive(full_bars + state.index)
            state.advance()  # carried into the next tile: never reset


@cute.jit
def consumer_warp(dst: cute.Tensor, trace: cute.Tensor, ring: cute.Tensor, full_bars, empty_bars, ctid,
                  stages: cutlass.Constexpr, k_tiles: cutlass.Constexpr, tiles: cutlass.Constexpr,
                  consumer_threads: cutlass.Constexpr):
    """Warps 1..W: wait until a stage is full, copy this thread's slice out, mark it empty."""
    state = DevicePipelineState.consumer(stages)
    for tile in cutlass.range(tiles, unroll=1):  # real loops: a persistent kernel's tile count is not small
        for k in cutlass.range(k_tiles, unroll=1):
            item = tile * k_tiles + k
            mbarrier_wait_parity(full_bars + state.index, state.phase)
            for j in cutlass.range_constexpr(ITEM_WORDS // consumer_threads):
                w = ctid + j * consumer_threads
                dst[item * ITEM_WORDS + w] = ring[state.index * ITEM_WORDS + w]
            if ctid == 0:  # the log the host compares with the CPU PipelineState
                trace[2 * item] = state.index
                trace[2 * item + 1] = state.phase
            # Every consumer thread arrives (count 32 W): its reads are done before reuse.
            mbarrier_arrive(empty_bars + state.index)
            state.advance()


@cute.kernel
def ring_kernel(src: cute.Tensor, dst: cute.Tensor, trace: cute.Tensor, stages: cutlass.Constexpr,
                k_tiles: cutlass.Constexpr, tiles: cutlass.Constexpr, consumer_warps: cutlass.Constexpr):
    """One CTA: warp 0 produces, warps 1..``consumer_warps`` consume, through ``stages`` stages."""
    consumer_threads = 32 * consumer_warps
    smem = cutlass.memory.SmemAllocator()
    full_bars = smem.allocate_array(Int64, stages)  # "stage s holds an item"
    empty_bars = smem.allocate_array(Int64, stages)  # "stage s may be overwritten"
    ring = smem.allocate_tensor(Int32, cute.make_layout(stages * ITEM_WORDS), byte_alignment=16)

    tidx, _, _ = cute.arch.thread_idx()
    warp = tidx // 32
    if tidx == 0:
        for s in cutlass.range_constexpr(stages):
            mbarrier_init(full_bars + s, PRODUCER_THREADS)
            mbarrier_init(empty_bars + s, consumer_threads)
        fence_mbarrier_init()
    cute.arch.barrier()  # nobody touches a barrier before it is initialised

    if warp == 0:
        producer_warp(src, ring, full_bars, empty_bars, tidx, stages, k_tiles, tiles)
    else:
        consumer_warp(dst, trace, ring, full_bars, empty_bars, tidx - 32, stages, k_tiles, tiles,
                      consumer_threads)


@functools.lru_cache(maxsize=None)
def _ring_host(stages: int, k_tiles: int, tiles: int, consumer_warps: int):
    @cute.jit
    def ring_host(src: cute.Tensor, dst: cute.Tensor, trace: cute.Tensor, stream: cuda.CUstream):
        ring_kernel(src, dst, trace, stages, k_tiles, tiles, consumer_warps).launch(
            grid=(1, 1, 1), block=(32 * (1 + consumer_warps), 1, 1), stream=stream)

    return ring_host


def _check_ring_config(stages, k_tiles, consumer_warps):
    check_int("stages", stages, lo=1, hi=16)
    check_int("k_tiles", k_tiles, lo=1)
    check_choice("consumer_warps", consumer_warps, CONSUMER_WARP_CHOICES)


def compile_ring(target: str = "sm_90a", stages: int = 4, items: int = 15, *, k_tiles: int = 5,
                 consumer_warps: int = 2):
    """Compile the ring for ``target`` without a GPU (``items`` = tiles x ``k_tiles``)."""
    check_target(target)
    _check_ring_config(stages, k_tiles, consumer_warps)
    check_int("items", items, lo=1)
    if items % k_tiles:
        raise ValueError(f"items must be a multiple of k_tiles ({k_tiles}); got {items}")
    host = _ring_host(stages, k_tiles, items // k_tiles, consumer_warps)
    return compile_for(target, host, fake_tensor(Int32, (items * ITEM_WORDS,)),
                       fake_tensor(Int32, (items * ITEM_WORDS,)), fake_tensor(Int32, (2 * items,)), fake_stream())


POISON = -0x5A5A5A5B  # written into every output before a launch


def ring_copy(src, stages: int = 4, *, k_tiles: int = 5, consumer_warps: int = 2):
    """Copy ``src`` (int32, shape ``(items, 128)``, on the GPU) through the ring.

    ``items`` = tiles x ``k_tiles``: the kernel walks ``items // k_tiles`` tiles of
    ``k_tiles`` items each, carrying both PipelineStates across tiles. Returns
    ``(dst, trace)``: the copy, and per item the ``(stage, phase)`` the
    consumers used (compare with :func:`expected_trace`).
    """
    import torch

    check_tensor("src", src, dtypes=(torch.int32,), ndim=2, device=None, align_bytes=16)
    if src.shape[1] != ITEM_WORDS:
        raise ValueError(f"src must have {ITEM_WORDS} columns (one item per row); got shape {tuple(src.shape)}")
    _check_ring_config(stages, k_tiles, consumer_warps)
    items = src.shape[0]
    if items % k_tiles:
        raise ValueError(f"src must hold a multiple of k_tiles ({k_tiles}) rows; got {items}")
    check_tensor("src", src, device="cuda")
    require_tier("gpu", "gemmlab.pipeline.ring_copy")

    dst = torch.full_like(src, POISON)
    trace = torch.full((items, 2), POISON, dtype=torch.int32, device=src.device)
    run = launcher(_ring_host(stages, k_tiles, items // k_tiles, consumer_warps),
                   src.view(-1), dst.view(-1), trace.view(-1))
    run()
    torch.cuda.synchronize()
    return dst, trace


def expected_trace(items: int, stages: int) -> list[tuple[int, int]]:
    """The consumer's ``(stage, phase)`` per item, from the CPU :class:`PipelineState`."""
    return [(i, p) for i, p, _ in state_sequence(stages, items, start_phase=0)]
