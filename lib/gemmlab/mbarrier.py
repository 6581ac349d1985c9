"""Chapter 02: the mbarrier, the synchronisation object behind every Hopper and Blackwell pipeline.

What it teaches
    An *mbarrier* is a 64-bit object in shared memory. It counts arrivals
    (threads saying "I am done") and, since sm_90, *transaction bytes* (bytes
    an asynchronous copy promised to deliver). When both counts reach zero the
    barrier's current *phase* completes, the barrier flips to the next phase and
    re-arms itself with the same arrival count. Waiters never read a counter:
    they ask "has the phase with parity p completed?" (``try_wait.parity``),
    so one bit of state per waiter is all a pipeline needs.

What it adds over chapter 01
    Chapter 01 moved data with single ``ld``/``st`` instructions inside one
    warp. Here threads of *different* warps hand data to each other through
    shared memory, and the mbarrier says when a hand-off is complete. Chapter 03
    lets the copy engine (``cp.async.bulk``) do the arriving with ``complete_tx``.

The code
    * Small wrappers, one per PTX instruction (``mbarrier_init``,
      ``mbarrier_arrive``, ``mbarrier_arrive_expect_tx``, ``mbarrier_expect_tx``,
      ``mbarrier_complete_tx``, ``mbarrier_try_wait_parity``,
      ``mbarrier_wait_parity``, ``fence_mbarrier_init``), written with
      ``cute.arch.inline_ptx`` in their ``shared::cta`` forms.
    * :class:`Mbarrier`: a CPU model of one barrier (pending arrivals,
      tx-count, phase) with the exact ``try_wait.parity`` rule.
    * A one-CTA *phase demo* kernel whose recorded ``try_wait.parity`` answers
      are compared, bit for bit, with the model (:func:`phase_demo_model`).

The course's decision
    Later chapters call the DSL's own ``cute.arch.mbarrier_*`` operations
    (:data:`DSL_EQUIVALENTS`): NVIDIA maintains them and the DSL's pipelines use
    them. This chapter's wrappers exist to show the PTX underneath them; both
    compile to the same ``mbarrier.*`` instructions.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
import cuda.bindings.driver as cuda
from cutlass import Int32, Int64, Uint32

from .checks import check_int
from .compile import check_target, compile_for, fake_stream, fake_tensor, launcher
from .tiers import require_tier

# --------------------------------------------------------------------------------------
# One wrapper per PTX instruction. ``bar`` is a shared-memory pointer to an Int64
# (``SmemAllocator().allocate_array(Int64, n)``); inline_ptx passes it as a 32-bit
# shared-window address. The ``shared::cta`` forms name this CTA's own barrier.
# --------------------------------------------------------------------------------------


def mbarrier_init(bar, count):
    """``mbarrier.init``: phase 0, ``count`` arrivals pending, tx-count 0.

    One thread initialises; the others may touch the barrier only after a
    ``fence_mbarrier_init`` and a CTA barrier (``cute.arch.barrier()``).
    """
    cute.arch.inline_ptx(
        "mbarrier.init.shared::cta.b64 [{$r0}], {$r1};",
        read_only_args=[bar, Int32(count)],
    )


def fence_mbarrier_init():
    """``fence.mbarrier_init``: make this thread's ``mbarrier.init`` visible before any arrive.

    The only ``.sem``/``.scope`` PTX offers is ``release.cluster``: inits must be
    visible to other CTAs of a cluster (and to the TMA unit) before they arrive.
    """
    cute.arch.inline_ptx("fence.mbarrier_init.release.cluster;")


def mbarrier_arrive(bar):
    """``mbarrier.arrive``: one arrival. With no ``.sem``/``.scope`` written, PTX
    means ``.release.cta``: this thread's earlier memory accesses are visible to
    whoever sees the phase complete.

    The instruction returns a 64-bit *state token* (the phase it arrived in),
    used by the older token-based ``test_wait``/``try_wait``. Parity waits need
    no token, so we write the sink ``_`` instead of a register.
    """
    cute.arch.inline_ptx("mbarrier.arrive.shared::cta.b64 _, [{$r0}];", read_only_args=[bar])


def mbarrier_arrive_expect_tx(bar, tx_bytes):
    """``mbarrier.arrive.expect_tx``: add ``tx_bytes`` to the tx-count, then arrive.

    The phase now also needs ``tx_bytes`` of transactions to complete
    (``complete_tx``, done by the copy engine in chapter 03) before it can end.
    """
    cute.arch.inline_ptx(
        "mbarrier.arrive.expect_tx.shared::cta.b64 _, [{$r0}], {$r1};",
        read_only_args=[bar, Int32(tx_bytes)],
    )


def mbarrier_expect_tx(bar, tx_bytes):
    """``mbarrier.expect_tx``: add ``tx_bytes`` to the tx-count without arriving."""
    cute.arch.inline_ptx(
        "mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [{$r0}], {$r1};",
        read_only_args=[bar, Int32(tx_bytes)],
    )


def mbarrier_complete_tx(bar, tx_bytes):
    """``mbarrier.complete_tx`` (PTX ISA 8.0, sm_90): subtract ``tx_bytes`` from the tx-count.

    What the copy engine does when bytes land; a thread can do it too, which is
    how the phase demo shows a phase waiting for its bytes. The DSL has no
    wrapper for it.
    """
    cute.arch.inline_ptx(
        "mbarrier.complete_tx.relaxed.cta.shared::cta.b64 [{$r0}], {$r1};",
        read_only_args=[bar, Int32(tx_bytes)],
    )


def mbarrier_try_wait_parity(bar, parity):
    """One probe: has the phase with parity ``parity`` completed? (``Int32`` 1 or 0)

    ``try_wait`` may suspend the thread for a short, hardware-chosen time while
    the phase is incomplete, then answers; ``test_wait`` would answer at once.
    With no ``.sem``/``.scope`` written, PTX means ``.acquire.cta``: after a
    true answer, memory written by the threads that arrived is visible here.
    PTX returns a predicate; ``selp`` turns it into a register we can store.
    """
    return Int32(
        cute.arch.inline_ptx(
            "{ .reg .pred p; "
            "mbarrier.try_wait.parity.shared::cta.b64 p, [{$r0}], {$r1}; "
            "selp.u32 {$w0}, 1, 0, p; }",
            write_only_types=[Uint32],
            read_only_args=[bar, Int32(parity)],
        )
    )


def mbarrier_wait_parity(bar, parity):
    """Spin until the phase with parity ``parity`` has completed.

    The loop is written in PTX, inside one inline-asm block: probe, branch back
    while the predicate is false. The PTX ``{ }`` scope makes the ``.reg`` and
    the labels local, so many waits can sit in one kernel. A DSL ``while``
    around :func:`mbarrier_try_wait_parity` would work too, but it would carry a
    loop condition through the compiler's control flow for nothing: the PTX
    loop is exactly what CUTLASS's C++ ``ClusterBarrier::wait`` emits, and it
    needs no DSL state.
    """
    cute.arch.inline_ptx(
        "{ .reg .pred p; "
        "WAIT_PARITY: "
        "mbarrier.try_wait.parity.shared::cta.b64 p, [{$r0}], {$r1}; "
        "@!p bra WAIT_PARITY; }",
        read_only_args=[bar, Int32(parity)],
    )


#: Our wrapper -> the DSL operation later chapters call instead (same PTX underneath).
DSL_EQUIVALENTS = {
    "mbarrier_init": "cute.arch.mbarrier_init(bar, count)",
    "fence_mbarrier_init": "cute.arch.mbarrier_init_fence()",
    "mbarrier_arrive": "cute.arch.mbarrier_arrive(bar)",
    "mbarrier_arrive_expect_tx": "cute.arch.mbarrier_arrive_and_expect_tx(bar, tx_bytes)",
    "mbarrier_expect_tx": "cute.arch.mbarrier_expect_tx(bar, tx_bytes)",
    "mbarrier_complete_tx": "(none: the copy engine does it)",
    "mbarrier_try_wait_parity": "cute.arch.mbarrier_try_wait(bar, parity)",
    "mbarrier_wait_parity": "cute.arch.mbarrier_wait(bar, parity)",
}


# --------------------------------------------------------------------------------------
# The CPU model
# --------------------------------------------------------------------------------------


class Mbarrier:
    """A CPU model of one mbarrier: what ``try_wait.parity`` will answer, and why.

    State: ``count`` (arrivals per phase, set by init), ``pending`` (arrivals
    still missing in the current phase), ``tx`` (transaction bytes still
    missing; may go negative when bytes land before they were expected, as on
    hardware) and ``phase`` (how many phases have completed; its parity is the
    bit the hardware keeps). A phase completes the moment ``pending == 0`` and
    ``tx == 0``; the barrier then re-arms: ``pending = count``.
    """

    def __init__(self, count: int):
        check_int("count", count, lo=1, hi=(1 << 20) - 1)
        self.count = count
        self.pending = count
        self.tx = 0
        self.phase = 0

    @property
    def parity(self) -> int:
        """The current (incomplete) phase's parity: the one bit the hardware flips."""
        return self.phase & 1

    def _maybe_complete(self) -> None:
        if self.pending == 0 and self.tx == 0:
            self.phase += 1
            self.pending = self.count

    def arrive(self) -> None:
        if self.pending == 0:  # only reachable while tx is outstanding
            raise RuntimeError("more arrivals than the barrier's count in one phase")
        self.pending -= 1
        self._maybe_complete()

    def expect_tx(self, tx_bytes: int) -> None:
        check_int("tx_bytes", tx_bytes, lo=0)
        self.tx += tx_bytes
        self._maybe_complete()

    def arrive_expect_tx(self, tx_bytes: int) -> None:
        # expect first, then arrive: the phase cannot complete between the two.
        check_int("tx_bytes", tx_bytes, lo=0)
        self.tx += tx_bytes
        self.arrive()

    def complete_tx(self, tx_bytes: int) -> None:
        check_int("tx_bytes", tx_bytes, lo=0)
        self.tx -= tx_bytes
        self._maybe_complete()

    def try_wait_parity(self, parity: int) -> bool:
        """True iff the phase with parity ``parity`` has completed.

        The hardware keeps only the current phase's parity, so "the phase with
        parity p" means the current phase (not complete: False) or the one
        just before it (complete: True). Hence: True iff ``parity != self.parity``.
        Right after init the current phase is 0, so parity 1 reads as complete:
        that is why a producer waiting on an *empty* stage starts with phase 1.
        """
        if parity not in (0, 1):
            raise ValueError(f"parity must be 0 or 1; got {parity!r}")
        return parity != self.parity

    def __repr__(self) -> str:
        return f"Mbarrier(count={self.count}, pending={self.pending}, tx={self.tx}, phase={self.phase})"


# --------------------------------------------------------------------------------------
# The phase demo: one CTA, one barrier, arrivals in rounds, probes recorded
# --------------------------------------------------------------------------------------

PHASE_DEMO_THREADS = 64  # two warps; the barrier's arrival count
PHASE_DEMO_TX = 256  # transaction bytes each round expects (and then completes)
_HALF = PHASE_DEMO_THREADS // 2


@dataclass(frozen=True)
class Probe:
    """One row of the phase demo: what happened, the model's state, both probes."""

    step: str
    pending: int
    tx: int
    phase: int
    wait0: bool  # try_wait.parity(0)
    wait1: bool  # try_wait.parity(1)


def phase_demo_steps(rounds: int) -> list[str]:
    """The demo's script, one label per probe. Even rounds use ``arrive.expect_tx``,
    odd rounds ``expect_tx`` followed by a plain ``arrive`` (same effect)."""
    check_int("rounds", rounds, lo=1, hi=64)
    steps = ["init"]
    for r in range(rounds):
        first = "arrive.expect_tx" if r % 2 == 0 else "expect_tx + arrive"
        steps += [
            f"r{r}: threads 0-{_HALF - 1} arrive (t0: {first})",
            f"r{r}: threads {_HALF}-{PHASE_DEMO_THREADS - 1} arrive",
            f"r{r}: t0 complete_tx({PHASE_DEMO_TX})",
        ]
    return steps


def phase_demo_model(rounds: int = 3) -> list[Probe]:
    """Run the demo's script on :class:`Mbarrier`; one :class:`Probe` per step."""
    steps = phase_demo_steps(rounds)
    bar = Mbarrier(PHASE_DEMO_THREADS)
    out = []

    def probe(label):
        out.append(Probe(label, bar.pending, bar.tx, bar.phase, bar.try_wait_parity(0), bar.try_wait_parity(1)))

    probe(steps[0])
    for r in range(rounds):
        if r % 2 == 0:
            bar.arrive_expect_tx(PHASE_DEMO_TX)
        else:
            bar.expect_tx(PHASE_DEMO_TX)
            bar.arrive()
        for _ in range(_HALF - 1):
            bar.arrive()
        probe(steps[1 + 3 * r])
        for _ in range(_HALF):
            bar.arrive()
        probe(steps[2 + 3 * r])
        bar.complete_tx(PHASE_DEMO_TX)
        probe(steps[3 + 3 * r])
    return out


def phase_demo_table(probes: list[Probe]) -> str:
    """The model's probes as a fixed-width text table."""
    width = max(len(p.step) for p in probes)
    lines = [f"{'step':<{width}}  pending   tx  phase  try_wait.parity(0)  (1)"]
    for p in probes:
        lines.append(
            f"{p.step:<{width}}  {p.pending:>7}  {p.tx:>3}  {p.phase:>5}  {str(p.wait0):>18}  {str(p.wait1):>5}"
        )
    return "\n".join(lines)


@cute.jit
def record_probe(records: cute.Tensor, bar, tidx, i: cutlass.Constexpr):
    """Thread 0 records both ``try_wait.parity`` answers for step ``i``; then all sync."""
    if tidx == 0:
        records[2 * i] = mbarrier_try_wait_parity(bar, 0)
        records[2 * i + 1] = mbarrier_try_wait_parity(bar, 1)
    cute.arch.barrier()


@cute.kernel
def phase_demo_kernel(records: cute.Tensor, rounds: cutlass.Constexpr):
    """Threads arrive in halves each round; thread 0 probes both parities after every step.

    ``records[2*i]``/``records[2*i+1]`` = try_wait.parity(0)/(1) after step i.
    Every step is fenced by ``bar.sync`` so the probe sees all of its arrivals.
    """
    smem = cutlass.memory.SmemAllocator()
    bar = smem.allocate_array(Int64, 1)
    tidx, _, _ = cute.arch.thread_idx()

    if tidx == 0:
        mbarrier_init(bar, PHASE_DEMO_THREADS)
        fence_mbarrier_init()
    cute.arch.barrier()

    record_probe(records, bar, tidx, 0)
    for r in cutlass.range_constexpr(rounds):
        # Step 1: the first half arrives; thread 0 also registers the round's bytes.
        if tidx == 0:
            if cutlass.const_expr(r % 2 == 0):
                mbarrier_arrive_expect_tx(bar, PHASE_DEMO_TX)
            else:
                mbarrier_expect_tx(bar, PHASE_DEMO_TX)
                mbarrier_arrive(bar)
        elif tidx < _HALF:
            mbarrier_arrive(bar)
        cute.arch.barrier()
        record_probe(records, bar, tidx, 1 + 3 * r)
        # Step 2: the second half arrives: all arrivals are in, the bytes are not.
        if tidx >= _HALF:
            mbarrier_arrive(bar)
        cute.arch.barrier()
        record_probe(records, bar, tidx, 2 + 3 * r)
        # Step 3: the bytes "land": the phase completes and the barrier flips.
        if tidx == 0:
            mbarrier_complete_tx(bar, PHASE_DEMO_TX)
        cute.arch.barrier()
        record_probe(records, bar, tidx, 3 + 3 * r)


@functools.lru_cache(maxsize=None)
def _phase_demo_host(rounds: int):
    @cute.jit
    def phase_demo_host(records: cute.Tensor, stream: cuda.CUstream):
        phase_demo_kernel(records, rounds).launch(grid=(1, 1, 1), block=(PHASE_DEMO_THREADS, 1, 1), stream=stream)

    return phase_demo_host


def compile_phase_demo(target: str = "sm_90a", rounds: int = 3):
    """Compile the phase demo for ``target`` without a GPU (read ``.__ptx__``)."""
    check_target(target)
    check_int("rounds", rounds, lo=1, hi=64)
    return compile_for(target, _phase_demo_host(rounds), fake_tensor(Int32, (2 * (1 + 3 * rounds),)), fake_stream())


def run_phase_demo(rounds: int = 3) -> list[tuple[bool, bool]]:
    """Launch the phase demo; return ``(try_wait.parity(0), try_wait.parity(1))`` per step."""
    check_int("rounds", rounds, lo=1, hi=64)
    require_tier("gpu", "gemmlab.mbarrier.run_phase_demo")
    import torch

    records = torch.full((2 * (1 + 3 * rounds),), -1, dtype=torch.int32, device="cuda")  # poisoned
    launcher(_phase_demo_host(rounds), records)()
    torch.cuda.synchronize()
    values = records.view(-1, 2).tolist()
    for i, pair in enumerate(values):
        if any(v not in (0, 1) for v in pair):
            raise AssertionError(f"phase demo step {i} was not recorded: {pair}")
    return [(bool(a), bool(b)) for a, b in values]


def model_pairs(probes: list[Probe]) -> list[tuple[bool, bool]]:
    """The model's probes in :func:`run_phase_demo`'s format."""
    return [(p.wait0, p.wait1) for p in probes]


# --------------------------------------------------------------------------------------
# Our wrappers next to the DSL's own operations, compiled for the same target
# --------------------------------------------------------------------------------------


@cute.kernel
def wrappers_kernel(out: cute.Tensor):
    """Every wrapper once, so its PTX can be read (not meant to be launched)."""
    smem = cutlass.memory.SmemAllocator()
    bar = smem.allocate_array(Int64, 1)
    tidx, _, _ = cute.arch.thread_idx()
    if tidx == 0:
        mbarrier_init(bar, 1)
        fence_mbarrier_init()
    cute.arch.barrier()
    mbarrier_arrive_expect_tx(bar, 16)
    mbarrier_expect_tx(bar, 16)
    mbarrier_arrive(bar)
    mbarrier_complete_tx(bar, 32)
    out[tidx] = mbarrier_try_wait_parity(bar, 0)
    mbarrier_wait_parity(bar, 0)


@cute.kernel
def dsl_twins_kernel(out: cute.Tensor):
    """The same sequence written with the DSL's ``cute.arch.mbarrier_*`` operations."""
    smem = cutlass.memory.SmemAllocator()
    bar = smem.allocate_array(Int64, 1)
    tidx, _, _ = cute.arch.thread_idx()
    if tidx == 0:
        cute.arch.mbarrier_init(bar, 1)
        cute.arch.mbarrier_init_fence()
    cute.arch.barrier()
    cute.arch.mbarrier_arrive_and_expect_tx(bar, 16)
    cute.arch.mbarrier_expect_tx(bar, 16)
    cute.arch.mbarrier_arrive(bar)
    out[tidx] = Int32(cute.arch.mbarrier_try_wait(bar, 0))
    cute.arch.mbarrier_wait(bar, 0)


@cute.jit
def wrappers_host(out: cute.Tensor, stream: cuda.CUstream):
    wrappers_kernel(out).launch(grid=(1, 1, 1), block=(32, 1, 1), stream=stream)


@cute.jit
def dsl_twins_host(out: cute.Tensor, stream: cuda.CUstream):
    dsl_twins_kernel(out).launch(grid=(1, 1, 1), block=(32, 1, 1), stream=stream)


def mbarrier_instructions(compiled) -> list[str]:
    """The ``mbarrier.*`` / ``fence.mbarrier_init`` instruction names in a kernel's PTX, in order, once each.

    Also inside inline-asm ``{ ... }`` blocks, where our probes and spin loop live.
    """
    from .compile import ptx_instructions

    return ptx_instructions(compiled, r"(?:fence\.)?mbarrier[\w.:]*")


def compile_wrappers(target: str = "sm_90a", dsl: bool = False):
    """Compile :func:`wrappers_kernel` (or, with ``dsl=True``, :func:`dsl_twins_kernel`)."""
    check_target(target)
    host = dsl_twins_host if dsl else wrappers_host
    return compile_for(target, host, fake_tensor(Int32, (32,)), fake_stream())


# --------------------------------------------------------------------------------------
# Figure: the phase bit
# --------------------------------------------------------------------------------------


def draw_phase_bit(probes: list[Probe] | None = None, name: str = "02_phase_bit"):
    """Draw the phase demo: barrier state per step and both ``try_wait.parity`` answers.

    Returns ``(path, data)``: ``data`` has the arrays behind the figure
    (``pending``, ``tx``, ``parity``, ``wait0``, ``wait1``), one entry per step.
    """
    import numpy as np

    from .figures import new_figure, save

    probes = probes if probes is not None else phase_demo_model()
    data = {
        "pending": np.array([p.pending for p in probes]),
        "tx": np.array([p.tx for p in probes]),
        "parity": np.array([p.phase & 1 for p in probes]),
        "wait0": np.array([int(p.wait0) for p in probes]),
        "wait1": np.array([int(p.wait1) for p in probes]),
    }
    n = len(probes)
    fig, axes = new_figure(4, 1, figsize=(max(8, 0.75 * n), 6.2), sharex=True,
                           gridspec_kw={"height_ratios": [1.3, 1.3, 0.8, 1.2]})
    x = np.arange(n)
    ax = axes[0]
    ax.bar(x, data["pending"], color="#4C72B0")
    ax.set_ylabel("pending\narrivals")
    ax.set_title(f"one mbarrier, count {PHASE_DEMO_THREADS}: arrivals and bytes complete a phase")
    ax = axes[1]
    ax.bar(x, data["tx"], color="#DD8452")
    ax.set_ylabel("tx-count\n(bytes)")
    ax = axes[2]
    ax.imshow(data["parity"][None, :], aspect="auto", cmap="Greys", vmin=0, vmax=1.6,
              extent=(-0.5, n - 0.5, 0, 1))
    for i, v in enumerate(data["parity"]):
        ax.text(i, 0.5, str(v), ha="center", va="center", color="white" if v else "black")
    ax.set_yticks([])
    ax.set_ylabel("phase\nparity")
    ax = axes[3]
    grid = np.stack([data["wait0"], data["wait1"]])
    ax.imshow(grid, aspect="auto", cmap="RdYlGn", vmin=-0.3, vmax=1.3, extent=(-0.5, n - 0.5, 1.5, -0.5))
    for i in range(n):
        for j in range(2):
            ax.text(i, j, "T" if grid[j, i] else "F", ha="center", va="center")
    ax.set_yticks([0, 1])
    ax.set_yticklabels(["parity(0)", "parity(1)"])
    ax.set_ylabel("try_wait")
    ax.set_xticks(x)
    ax.set_xticklabels([p.step.replace(": ", ":\n", 1) for p in probes], rotation=60, ha="right", fontsize=7)
    return save(fig, name), data


def draw_phase_cycle(count: int = 2, name: str = "02_phase_cycle"):
    """The phase bit as a two-state machine, with ``try_wait.parity`` answers in each state.

    The answers are asked of :class:`Mbarrier` (not typed in): ``data`` maps
    each parity to ``{"try_wait.parity(0)": bool, "try_wait.parity(1)": bool}``.
    Returns ``(path, data)``.
    """
    from matplotlib.patches import Circle, FancyArrowPatch

    from .figures import new_figure, save

    bar = Mbarrier(count)
    data = {}
    for _ in range(2):
        data[bar.parity] = {f"try_wait.parity({p})": bar.try_wait_parity(p) for p in (0, 1)}
        for _ in range(count):
            bar.arrive()
    fig, ax = new_figure(figsize=(8.5, 3.6))
    centers = {0: (2.0, 1.6), 1: (7.0, 1.6)}
    for parity, (x, y) in centers.items():
        ax.add_patch(Circle((x, y), 1.2, facecolor="white" if parity == 0 else "#DDDDDD", edgecolor="black"))
        ans = data[parity]
        ax.text(x, y + 0.45, f"current phase\nparity {parity}", ha="center", va="center", fontsize=10,
                fontweight="bold")
        ax.text(x, y - 0.4, "try_wait.parity\n" + "\n".join(
            f"({k[-2]}) -> {'true' if v else 'false'}" for k, v in ans.items()),
                ha="center", va="center", fontsize=8, family="monospace")
    label = "pending arrivals = 0\nand tx-count = 0:\nphase completes, re-arm"
    ax.add_patch(FancyArrowPatch((3.1, 2.1), (5.9, 2.1), connectionstyle="arc3,rad=-0.3",
                                 arrowstyle="-|>", mutation_scale=15))
    ax.add_patch(FancyArrowPatch((5.9, 1.1), (3.1, 1.1), connectionstyle="arc3,rad=-0.3",
                                 arrowstyle="-|>", mutation_scale=15))
    ax.text(4.5, 3.05, label, ha="center", va="center", fontsize=8)
    ax.text(4.5, 0.15, label, ha="center", va="center", fontsize=8)
    ax.text(2.0, 0.05, "after mbarrier.init", ha="center", fontsize=8, style="italic")
    ax.set_xlim(0.5, 8.5)
    ax.set_ylim(-0.3, 3.6)
    ax.set_aspect("equal")
    ax.axis("off")
    ax.set_title("try_wait.parity(p) is true iff p != the current phase's parity", fontsize=10)
    return save(fig, name), data
