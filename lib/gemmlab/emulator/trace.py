"""A record of an emulated run: which warp waited on what, when phases completed, when operations landed.

Time is the emulator's step count (warp instructions executed so far, across the whole
launch): it orders events, it is not a measure of GPU time. Pass a :class:`Trace` to
:func:`gemmlab.emulator.run.run_on_emulator` and draw it with :func:`draw_trace`: the
warp-specialised pipeline of a real kernel, made visible (the TMA warp waiting on an
``empty`` barrier while the MMA warp waits on ``full``, the epilogue waiting on the
accumulator, ...).
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Wait:
    cta: int  # linear CTA index
    warp: int
    start: int
    end: int | None
    what: tuple  # ("mbarrier", cta rank, offset in shared memory) or ("barrier", description)


@dataclass
class Trace:
    waits: list = field(default_factory=list)
    phases: list = field(default_factory=list)  # (step, cta linear, offset, phase)
    ops: list = field(default_factory=list)  # (step, cta linear, label)
    exits: dict = field(default_factory=dict)  # (cta, warp) -> step
    steps: int = 0

    # ---- hooks called by the machine
    def wait(self, warp, obj, why: str) -> Wait:
        if obj is not None and hasattr(obj, "addr"):
            what = ("mbarrier", obj.cta.linear, obj.addr - obj.cta.smem.base)
        else:
            what = ("barrier", why.split(" (")[0])
        w = Wait(warp.cta.linear, warp.index, warp.machine.steps, None, what)
        self.waits.append(w)
        return w

    def resume(self, wait: Wait, step: int):
        if wait.end is None:
            wait.end = step

    def phase(self, mb, step: int):
        self.phases.append((step, mb.cta.linear, mb.addr - mb.cta.smem.base, mb.phase))

    def op_done(self, machine, op):
        self.ops.append((machine.steps, getattr(getattr(op, "cta", None), "linear", None), op.label))

    def exited(self, warp):
        self.exits[(warp.cta.linear, warp.index)] = warp.machine.steps

    def finish(self, machine):
        self.steps = machine.steps
        for w in self.waits:
            if w.end is None:
                w.end = machine.steps

    # ---- reading it
    def waits_of(self, cta: int, warp: int) -> list:
        return [w for w in self.waits if w.cta == cta and w.warp == warp]

    def summary(self, names: dict | None = None) -> dict:
        """Steps each warp spent waiting, by what it waited on (``names``: ``{offset: name}`` of mbarriers)."""
        out: dict = {}
        for w in self.waits:
            key = _label(w.what, names)
            out.setdefault((w.cta, w.warp), {}).setdefault(key, 0)
            out[(w.cta, w.warp)][key] += w.end - w.start
        return out


def _label(what: tuple, names: dict | None) -> str:
    if what[0] == "mbarrier":
        off = what[2]
        return (names or {}).get(off, f"mbarrier +0x{off:x}")
    return what[1]


def draw_trace(trace: Trace, *, ctas=(0,), roles: dict | None = None, names: dict | None = None,
               title: str = "", name: str = "emulated_run"):
    """One row per warp of ``ctas``: bars where the warp waits, coloured by what it waits on; ticks where an
    mbarrier completes a phase. ``roles``: ``{warp index: role}``; ``names``: ``{mbarrier offset: name}``.
    Saved under ``figures/`` (:func:`gemmlab.figures.save`); returns the path."""
    import matplotlib.pyplot as plt

    from ..figures import save

    rows = sorted({(w.cta, w.warp) for w in trace.waits if w.cta in ctas} |
                  {k for k in trace.exits if k[0] in ctas})
    labels = sorted({_label(w.what, names) for w in trace.waits if w.cta in ctas})
    cmap = plt.get_cmap("tab20")
    colour = {lab: cmap(i % 20) for i, lab in enumerate(labels)}
    fig, ax = plt.subplots(figsize=(10, 0.42 * len(rows) + 1.6))
    for y, (cta, warp) in enumerate(rows):
        end = trace.exits.get((cta, warp), trace.steps)
        ax.barh(y, end, left=0, height=0.18, color="0.85")
        for w in trace.waits_of(cta, warp):
            lab = _label(w.what, names)
            ax.barh(y, max(w.end - w.start, 1), left=w.start, height=0.7, color=colour[lab])
    for lab in labels:
        ax.barh(0, 0, color=colour[lab], label=f"waits on {lab}")
    role = roles or {}
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([(f"CTA {c} " if len(ctas) > 1 else "") + f"warp {w}" + (f" ({role[w]})" if w in role else "")
                        for c, w in rows])
    ax.invert_yaxis()
    ax.set_xlabel("emulator steps (warp instructions executed, all warps): an order of events, not GPU time")
    ax.set_title(title or "Who waits on what: an emulated run")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=3, fontsize=8, frameon=False)
    fig.tight_layout()
    return save(fig, name)
