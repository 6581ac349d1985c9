"""A timeline simulator for producer/consumer pipelines (chapter 05; reused by chapter 10).

Every pipelined kernel of the course has the same skeleton: a **producer**
(one warp issuing TMA loads) fills a ring of ``stages`` shared-memory buffers,
one or more **consumers** (warps doing the work: an elementwise op, WGMMA,
tcgen05.mma) drain them, and two mbarriers per stage say "full" and "empty".
How long such a kernel takes is decided by a handful of numbers: how long a
load is in flight, how long the consumer holds a stage, how many stages there
are, and how the stage index is walked across tiles. This module computes the
schedule those numbers imply, exactly, and draws it.

The model
---------
* Work is a list of **tiles**; tile ``t`` has ``tiles[t]`` k-iterations, and
  each k-iteration needs one stage of the ring (one load, one compute).
* The **producer** walks its slots in order. For a slot in stage ``s`` it
  waits until ``empty[s]`` has been released by every consumer for the
  previous use of ``s`` (a fresh ring is empty), is busy ``issue_time``
  issuing the load, and the data lands ``load_time`` later, but never sooner
  than ``transfer_time`` after the previous load landed (``transfer_time`` is
  the stage size over the bandwidth the SM gets; 0 = unlimited bandwidth).
  The landing completes ``full[s]``.
* Each of ``consumers`` consumers walks the same slots: waits on ``full[s]``,
  computes for ``compute_time`` holding the stage, then arrives on
  ``empty[s]`` (the stage is free once *all* consumers have arrived). After a
  tile's last k-iteration the consumer runs its epilogue (``epilogue_time``):

  - ``epilogue="inline"``: the consumer itself, before its next tile;
  - ``epilogue="overlapped"``: a separate epilogue agent (epilogue warps), fed
    through a second ring of ``acc_stages`` accumulator buffers: the
    consumer may start tile ``t`` once the epilogue of tile
    ``t - acc_stages`` has freed its buffer (Blackwell's TMEM double buffer).

* ``design`` says how the stage index moves:

  - ``"carried"``: one :class:`~gemmlab.pipeline.PipelineState` per role,
    advanced at every k-iteration and never reset, so tile ``t + 1`` starts
    in whatever stage tile ``t`` ended on. No slot is wasted.
  - ``"unrolled"``: the k-loop is unrolled by ``stages`` so the stage index is
    a compile-time constant, and every tile starts at stage 0. When
    ``k % stages != 0`` the last group of a tile has ``stages - k % stages``
    unused slots; producer and consumer still walk them (the producer arrives
    on ``full`` without data, the consumer arrives on ``empty`` without
    work), so the next tile's loads cannot start until the tail has drained.
    That re-synchronisation costs a **bubble** at every tile boundary.

Everything is deterministic and in order (each role executes its slots
one after another, as the warps do), so the schedule is computed slot by slot
rather than by an event queue; times are in whatever unit the inputs use.

The API
-------
* :func:`simulate` -> :class:`Timeline` (``.total``, ``.events``,
  ``.bubbles``, ``.bubble_time``, ``.busy(who)``, ``.summary()``).
* :func:`draw_timeline` draws one or several timelines, one above the other
  on a shared time axis, and saves the figure.
* :func:`sweep_stages`: totals for a range of stage counts.
* :func:`fit_ring`: ``load_time`` and ``compute_time`` from two measurements
  (one stage, a deep ring); :func:`predict_designs`: both designs' totals and
  the unrolled design's extra time per tile.

Closed forms the tests check (``issue_time = 0`` unless said, ``n`` slots):

* 1 stage: ``total = n * (issue + load + compute)``: nothing overlaps.
* stages >= n: ``total = issue + load + compute + (n - 1) * max(issue, compute)``.
* ``"unrolled"`` with ``k = 5``, ``stages = 4``: one real slot in the tail
  group, so each tile boundary costs ``load`` (+ ``issue``) of idle consumer,
  when the ring was otherwise just deep enough.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterable, Sequence

from .checks import check_choice, check_int, check_real

DESIGNS = ("carried", "unrolled")
EPILOGUES = ("inline", "overlapped")
#: The most ring slots (k-iterations, the unrolled design's empty ones included) one simulation walks:
#: each costs a few events of memory (about 1 KB) and a few microseconds, so this bounds a run to
#: seconds and a few hundred MB. Larger problems: simulate one CTA's share, or fewer tiles.
MAX_SLOTS = 200_000
#: The most stages a ring may have (far more than any shared memory holds).
MAX_STAGES = 1024

#: Colours per stage in the drawings (cycled).
STAGE_COLOURS = ("#4C72B0", "#DD8452", "#55A868", "#8172B2", "#937860", "#DA8BC3", "#8C8C8C", "#CCB974")


@dataclass(frozen=True)
class Event:
    """One interval of one lane of the timeline.

    ``who``: ``"producer"``, ``"tma"`` (loads in flight), ``"consumer c"`` or
    ``"epilogue"``. ``what``: ``"wait"`` (blocked on a barrier), ``"issue"``,
    ``"load"``, ``"compute"``, ``"epilogue"`` or ``"skip"`` (an unused slot
    of the unrolled design, zero length). ``stage``/``phase``: the ring slot and
    the parity the role waited for (``None`` where meaningless).
    ``tile``/``k``: which work item (``k`` is ``None`` for an epilogue).
    """

    who: str
    what: str
    start: float
    end: float
    stage: int | None = None
    phase: int | None = None
    tile: int | None = None
    k: int | None = None

    @property
    def duration(self) -> float:
        return self.end - self.start


@dataclass
class Timeline:
    """The schedule :func:`simulate` computed, with its parameters."""

    stages: int
    tiles: list[int]
    design: str
    consumers: int
    load_time: float
    compute_time: float
    issue_time: float
    transfer_time: float
    epilogue_time: float
    epilogue: str
    acc_stages: int
    events: list[Event] = field(default_factory=list)

    @property
    def total(self) -> float:
        """When the last piece of work ends."""
        return max((e.end for e in self.events), default=0.0)

    @property
    def n_slots(self) -> int:
        """Real k-iterations (loads) over all tiles."""
        return sum(self.tiles)

    def lane(self, who: str) -> list[Event]:
        return [e for e in self.events if e.who == who]

    def busy(self, who: str) -> float:
        """Time ``who`` spends working (not waiting, not skipping)."""
        return sum(e.duration for e in self.lane(who) if e.what in ("issue", "compute", "epilogue"))

    @property
    def bubbles(self) -> list[Event]:
        """Consumer waits after that consumer's first compute: the ring ran dry.

        The wait for the very first load (filling the pipeline) is not a
        bubble; it is the latency every schedule pays once.
        """
        out = []
        for c in range(self.consumers):
            who = f"consumer {c}"
            started = False
            for e in self.lane(who):
                if e.what == "compute":
                    started = True
                elif e.what == "wait" and started and e.duration > 0:
                    out.append(e)
        return out

    @property
    def bubble_time(self) -> float:
        """Total bubble time per consumer (every consumer sees the same schedule)."""
        return sum(e.duration for e in self.bubbles) / self.consumers

    @property
    def ideal(self) -> float:
        """A lower bound: the fill latency plus the busiest resource's work."""
        per_slot = max(self.compute_time, self.issue_time, self.transfer_time)
        epi = self.epilogue_time * len(self.tiles)
        work = self.n_slots * per_slot + (epi if self.epilogue == "inline" else 0.0)
        return self.issue_time + self.load_time + work

    def summary(self) -> str:
        return (f"{self.design:>8}, {self.stages} stage(s), {len(self.tiles)} tile(s) x k={_k_text(self.tiles)}: "
                f"total {self.total:g}, bubbles {self.bubble_time:g}")


def _k_text(tiles: list[int]) -> str:
    return str(tiles[0]) if len(set(tiles)) == 1 else "/".join(map(str, tiles))


def _number(name: str, v, *, positive: bool = False) -> float:
    return check_real(name, v, lo=0, lo_open=positive)


def _tiles_list(tiles) -> list[int]:
    """``tiles`` as a list of k-iterations per tile (``(n_tiles, k)`` expanded), numpy and torch ints as ``int``."""
    if isinstance(tiles, tuple) and len(tiles) == 2:
        n_tiles = check_int("tiles[0] (number of tiles)", tiles[0], lo=1)
        k = check_int("tiles[1] (k-iterations per tile)", tiles[1], lo=1)
        check_work(n_tiles, k)
        return [k] * n_tiles
    if isinstance(tiles, (list, tuple)) and tiles:
        if len(tiles) > MAX_SLOTS:
            raise ValueError(f"tiles lists {len(tiles)} tiles; the simulator walks at most {MAX_SLOTS} slots")
        out = [check_int("tiles[i] (k-iterations of a tile)", k, lo=1) for k in tiles]
        check_work(len(out), max(out), total=sum(out))
        return out
    raise TypeError("tiles must be (n_tiles, k_tiles) or a non-empty list of k-iterations per tile; "
                    f"got {tiles!r}")


def check_work(n_tiles: int, k_per_tile: int, stages: int = 1, *, total: int | None = None) -> None:
    """Refuse (``ValueError``) a simulation of more than :data:`MAX_SLOTS` ring slots before anything is built.

    ``n_tiles`` tiles of ``k_per_tile`` k-iterations (``total``: their sum, when the tiles differ); with
    ``stages`` > 1 the unrolled design's padding of each tile's last group counts too.
    """
    slots = (n_tiles * k_per_tile if total is None else total) + n_tiles * (stages - 1)
    if slots > MAX_SLOTS:
        raise ValueError(f"{n_tiles} tile(s) of up to {k_per_tile} k-iterations with {stages} stage(s) are about "
                         f"{slots} ring slots; the simulator walks at most {MAX_SLOTS} (MAX_SLOTS): simulate one "
                         "CTA's share of the work, or fewer tiles")


def _slots(tiles: list[int], stages: int, design: str):
    """The slots both roles walk, in order: (stage, use, tile, k or None for an unused slot, last).

    ``use`` counts the uses of that stage so far (0, 1, 2, ...); the parity a
    role waits for is derived from it. ``last``: the tile's final slot.
    """
    uses = [0] * stages
    out = []
    if design == "carried":
        s = 0
        for t, k_tiles in enumerate(tiles):
            for k in range(k_tiles):
                out.append((s, uses[s], t, k, k == k_tiles - 1))
                uses[s] += 1
                s = (s + 1) % stages
    else:  # unrolled: every tile starts at stage 0 and pads its last group
        for t, k_tiles in enumerate(tiles):
            groups = -(-k_tiles // stages)
            for g in range(groups):
                for s in range(stages):
                    k = g * stages + s
                    last = g == groups - 1 and s == stages - 1
                    out.append((s, uses[s], t, k if k < k_tiles else None, last))
                    uses[s] += 1
    return out


def simulate(stages: int, tiles, load_time: float, compute_time: float, *, issue_time: float = 0.0,
             transfer_time: float = 0.0, design: str = "carried", consumers: int = 1,
             epilogue_time: float = 0.0, epilogue: str = "inline", acc_stages: int = 2) -> Timeline:
    """Schedule a producer/consumer ring; return the :class:`Timeline`.

    ``stages``: buffers in the ring (>= 1). ``tiles``: ``(n_tiles, k_tiles)``
    or a list of k-iterations per tile (what one persistent CTA processes).
    ``load_time``: from the end of a load's issue to its data in shared
    memory (latency). ``compute_time``: how long each consumer holds a stage.
    ``issue_time``: producer time per load. ``transfer_time``: minimum gap
    between two landings (bandwidth). ``design``: ``"carried"`` or
    ``"unrolled"`` (module docstring). ``consumers``: consumers that all
    read every stage. ``epilogue_time``/``epilogue``/``acc_stages``: per-tile
    work after the last k-iteration, inline or on an overlapped agent.
    """
    stages = check_int("stages", stages, lo=1, hi=MAX_STAGES)
    check_choice("design", design, DESIGNS)
    tiles = _tiles_list(tiles)
    check_work(len(tiles), max(tiles), stages if design == "unrolled" else 1, total=sum(tiles))
    load_time = _number("load_time", load_time)
    compute_time = _number("compute_time", compute_time)
    issue_time = _number("issue_time", issue_time)
    transfer_time = _number("transfer_time", transfer_time)
    epilogue_time = _number("epilogue_time", epilogue_time)
    check_choice("epilogue", epilogue, EPILOGUES)
    consumers = check_int("consumers", consumers, lo=1, hi=8)
    acc_stages = check_int("acc_stages", acc_stages, lo=1, hi=MAX_STAGES)

    tl = Timeline(stages, tiles, design, consumers, load_time, compute_time, issue_time, transfer_time,
                  epilogue_time, epilogue, acc_stages)
    ev = tl.events
    # full_at[s][u] / empty_at[s][u]: when use u of stage s was filled / released by all consumers.
    full_at: list[list[float]] = [[] for _ in range(stages)]
    empty_at: list[list[float]] = [[] for _ in range(stages)]
    prod_free = 0.0
    last_land = None
    cons_free = [0.0] * consumers
    # Overlapped epilogue: when each tile's epilogue ends (frees its accumulator buffer).
    epi_free = 0.0
    epi_end: list[float] = []

    for stage, use, tile, k, last_slot_of_tile in _slots(tiles, stages, design):
        # ---- producer: wait empty[stage] (phase 1 first: a fresh barrier passes), then issue
        ready = empty_at[stage][use - 1] if use else 0.0
        start = max(prod_free, ready)
        pphase = (use + 1) & 1
        if start > prod_free:
            ev.append(Event("producer", "wait", prod_free, start, stage, pphase, tile, k))
        if k is None:
            # Unused slot of the unrolled design: arrive on full without data.
            ev.append(Event("producer", "skip", start, start, stage, pphase, tile, None))
            full_at[stage].append(start)
            prod_free = start
        else:
            issue_end = start + issue_time
            if issue_time:
                ev.append(Event("producer", "issue", start, issue_end, stage, pphase, tile, k))
            land = issue_end + load_time
            if last_land is not None:
                land = max(land, last_land + transfer_time)
            last_land = land
            ev.append(Event("tma", "load", issue_end, land, stage, None, tile, k))
            full_at[stage].append(land)
            prod_free = issue_end

        # ---- consumers: wait full[stage] (phase 0 first), compute, arrive on empty
        cphase = use & 1
        releases = []
        first_k = k == 0
        for c in range(consumers):
            who = f"consumer {c}"
            t0 = cons_free[c]
            ready = full_at[stage][use]
            if first_k and epilogue == "overlapped" and tile >= acc_stages:
                # The accumulator buffer this tile uses must have been drained by the epilogue.
                ready = max(ready, epi_end[tile - acc_stages])
            begin = max(t0, ready)
            if begin > t0:
                ev.append(Event(who, "wait", t0, begin, stage, cphase, tile, k))
            if k is None:
                ev.append(Event(who, "skip", begin, begin, stage, cphase, tile, None))
                end = begin
            else:
                end = begin + compute_time
                ev.append(Event(who, "compute", begin, end, stage, cphase, tile, k))
            releases.append(end)
            cons_free[c] = end
        empty_at[stage].append(max(releases))

        # ---- end of a tile: its epilogue
        if last_slot_of_tile and epilogue_time > 0:
            if epilogue == "inline":
                for c in range(consumers):
                    b = cons_free[c]
                    ev.append(Event(f"consumer {c}", "epilogue", b, b + epilogue_time, None, None, tile, None))
                    cons_free[c] = b + epilogue_time
            else:
                b = max(epi_free, max(cons_free))
                if b > epi_free:
                    ev.append(Event("epilogue", "wait", epi_free, b, None, None, tile, None))
                ev.append(Event("epilogue", "epilogue", b, b + epilogue_time, None, None, tile, None))
                epi_free = b + epilogue_time
                epi_end.append(epi_free)
        elif last_slot_of_tile:
            epi_end.append(max(cons_free))
    return tl


def fit_ring(one_stage_item: float, deep_ring_item: float) -> tuple[float, float]:
    """``(load_time, compute_time)`` from two measured times per k-iteration.

    With one stage nothing overlaps, so an item costs ``load + compute``;
    with a ring deep enough to cover the latency the consumer runs back to
    back, so an item costs ``compute``. (A kernel whose consumers release a
    stage before they finish with it gets an effective ``load_time`` shortened
    by the work after the release; the model with these two numbers
    reproduces both measurements and the tail bubble.)
    """
    one = _number("one_stage_item", one_stage_item, positive=True)
    deep = _number("deep_ring_item", deep_ring_item, positive=True)
    if deep > one:
        raise ValueError(f"deep_ring_item must be <= one_stage_item (a deeper ring is never slower); "
                         f"got {deep} > {one}")
    return one - deep, deep


def predict_designs(stages: int, tiles, load_time: float, compute_time: float, **kw) -> dict:
    """Both designs' totals for the same work; the unrolled design's extra time, in total and per tile.

    Returns ``{"carried": total, "unrolled": total, "extra": unrolled - carried,
    "extra per tile": extra / number of tiles}``. ``kw`` goes to :func:`simulate`.
    """
    c = simulate(stages, tiles, load_time, compute_time, design="carried", **kw).total
    u = simulate(stages, tiles, load_time, compute_time, design="unrolled", **kw).total
    n = len(_tiles_list(tiles))
    return {"carried": c, "unrolled": u, "extra": u - c, "extra per tile": (u - c) / n}


def sweep_stages(stage_counts: Iterable[int], tiles, load_time: float, compute_time: float, **kw) -> list[dict]:
    """``simulate`` for each stage count (both designs); rows ``stages``, ``design``, ``total``, ``bubbles``."""
    rows = []
    for s in stage_counts:
        for d in DESIGNS:
            tl = simulate(s, tiles, load_time, compute_time, design=d, **kw)
            rows.append({"stages": s, "design": d, "total": tl.total, "bubbles": tl.bubble_time})
    return rows


def draw_timeline(timelines, name: str, *, titles: Sequence[str] | None = None, time_unit: str = "time") -> str:
    """Draw one timeline (or several, stacked on a shared time axis); save as ``figures/<name>.png``.

    Lanes, top to bottom: the producer (issue, waits in grey), the loads in
    flight (one row per stage, coloured by stage), each consumer (compute
    coloured by stage, bubbles hatched red) and the epilogue agent when
    overlapped. Tile boundaries are dotted lines on the consumer lane.
    Returns the figure's path.
    """
    from matplotlib.patches import Patch

    from .figures import new_figure, save

    if isinstance(timelines, Timeline):
        timelines = [timelines]
    timelines = list(timelines)
    if not timelines or not all(isinstance(t, Timeline) for t in timelines):
        raise TypeError("timelines must be a Timeline or a list of Timelines")
    if titles is not None and len(titles) != len(timelines):
        raise ValueError(f"titles must have one entry per timeline ({len(timelines)}); got {len(titles)}")

    def lanes_of(tl):
        lanes = ["producer"] + [f"load s{s}" for s in range(tl.stages)] + [f"consumer {c}" for c in range(tl.consumers)]
        if tl.epilogue == "overlapped" and tl.epilogue_time > 0:
            lanes.append("epilogue")
        return lanes

    heights = [len(lanes_of(t)) for t in timelines]
    fig, axes = new_figure(len(timelines), 1, figsize=(10, 0.9 + 0.38 * sum(heights) + 0.5 * len(timelines)),
                           sharex=True, squeeze=False, gridspec_kw={"height_ratios": heights})
    end = max(t.total for t in timelines)
    bubble_bars = []
    for i, (ax, tl) in enumerate(zip(axes[:, 0], timelines)):
        lanes = lanes_of(tl)
        y = {name_: j for j, name_ in enumerate(lanes)}
        for e in tl.events:
            if e.what == "skip" or e.duration <= 0:
                if e.what == "skip" and e.who.startswith("consumer"):
                    ax.plot([e.start], [y[e.who]], marker="x", color="#c0504d", ms=5)
                continue
            col = STAGE_COLOURS[e.stage % len(STAGE_COLOURS)] if e.stage is not None else "#555555"
            if e.who == "tma":
                ax.barh(y[f"load s{e.stage}"], e.duration, left=e.start, height=0.6, color=col, alpha=0.55)
                ax.text(e.start + e.duration / 2, y[f"load s{e.stage}"], f"{e.tile}.{e.k}", ha="center",
                        va="center", fontsize=6)
            elif e.what == "wait":
                is_bubble = e in tl.bubbles
                bar = ax.barh(y[e.who], e.duration, left=e.start, height=0.6,
                              color="#f4cccc" if is_bubble else "#eeeeee",
                              hatch="///" if is_bubble else None, edgecolor="#c0504d" if is_bubble else "#cccccc")
                if is_bubble:
                    bubble_bars.append(bar)
            elif e.what == "epilogue":
                ax.barh(y[e.who], e.duration, left=e.start, height=0.6, color="#333333")
            else:  # issue / compute
                ax.barh(y[e.who], e.duration, left=e.start, height=0.6, color=col)
                if e.what == "compute" and e.duration >= end / 60:
                    ax.text(e.start + e.duration / 2, y[e.who], f"{e.tile}.{e.k}", ha="center", va="center",
                            fontsize=6, color="white")
        # Tile boundaries as seen by consumer 0.
        seen = set()
        for e in tl.lane("consumer 0"):
            if e.what == "compute" and e.k == 0 and e.tile not in seen and e.tile > 0:
                seen.add(e.tile)
                ax.axvline(e.start, color="#999999", ls=":", lw=0.8)
        ax.set_yticks(range(len(lanes)))
        ax.set_yticklabels(lanes, fontsize=8)
        ax.invert_yaxis()
        ax.set_xlim(0, end * 1.01)
        title = titles[i] if titles else tl.summary()
        ax.set_title(title, fontsize=9, loc="left")
    axes[-1, 0].set_xlabel(f"{time_unit}   (labels: tile.k; loads coloured by stage; red hatched = consumer bubble)")
    handles = [Patch(color=STAGE_COLOURS[s % len(STAGE_COLOURS)], label=f"stage {s}")
               for s in range(max(t.stages for t in timelines))]
    handles.append(Patch(facecolor="#f4cccc", hatch="///", edgecolor="#c0504d", label="bubble"))
    # Above the first panel, right-aligned, so it never hides a bar.
    axes[0, 0].legend(handles=handles, loc="lower right", bbox_to_anchor=(1.0, 1.0), fontsize=7,
                      ncol=min(len(handles), 9), frameon=False)
    return str(save(fig, name))


def draw_stage_model(rows: list[dict], name: str, *, title: str = "") -> str:
    """Total time against stages, one line per design (rows from :func:`sweep_stages`); returns the path."""
    from .figures import new_figure, save

    fig, ax = new_figure(figsize=(6.0, 3.6))
    for d, marker in zip(DESIGNS, ("o", "s")):
        pts = sorted((r["stages"], r["total"]) for r in rows if r["design"] == d)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=marker, label=d)
    ax.set_xlabel("stages")
    ax.set_ylabel("total time (model units)")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8)
    if title:
        ax.set_title(title, fontsize=10)
    return str(save(fig, name))
