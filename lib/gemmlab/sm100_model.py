"""Chapter 10 on the CPU: the persistent 2-CTA GEMM's schedule, executed step by step.

What it models
    Everything :mod:`gemmlab.kernels.gemm_sm100` decides, with numbers instead of
    hardware: which CTA pair (cluster) takes which output tile in which order,
    the k-loop, which accumulator stage and which SMEM-AB / TMEM-C / SMEM-C
    stage and phase every role uses at every step, and where the epilogue
    stores. Three views of it:

    * :func:`schedule_rows`: the schedule as a table, from the plain
      :class:`~gemmlab.pipeline.PipelineState` walks (what every role *should*
      see).
    * :func:`simulate_cluster` / :func:`run_model`: the kernel *executed*. Each
      role (TMA-load warp of each CTA, the leader's MMA warp, the epilogue
      warpgroup of each CTA) is a program that waits on barriers modelled by
      :class:`~gemmlab.mbarrier.Mbarrier` (the exact ``try_wait.parity`` rule),
      and the asynchronous units (TMA loads, the tensor pipe, TMA stores)
      finish their work at moments picked by a seeded random scheduler. Data
      really moves: TMA writes the stage buffers, the MMA reads them when it
      *completes* (the worst case), the epilogue reads TMEM and TMA stores
      read the staging buffers when they complete. A wrong stage, a wrong
      phase or a missing wait therefore shows up as a wrong C, a barrier
      waited on with a phase it never reaches (deadlock) or a wait that
      passed on an older phase than it needed (an aliased wait).

    The prediction of the kernel's TFLOP/s on a B200 (chapter 05's timeline simulator,
    calibrated on the chapter 07 measurements of an H100 and an H200, a range, never a
    measurement) is :func:`gemmlab.measure.calibration.predict_b200`.

What it adds over chapter 07's CPU model
    Three pipelines instead of one, two CTAs sharing barriers (the leader's
    ``ab_full`` counts both CTAs' bytes; commits multicast to both CTAs), and
    accumulator stages that outlive the k-loop.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field, replace

import numpy as np

from .checks import check_choice
from .family.configs import ACC_STAGES, BLOCK_K, C_STAGES, CTA_M, EPILOGUE_WARPS, GROUP_M, PAIR_M, RASTER, Sm100Config
from .family.heuristic_sm100 import ceil_div
from .family.heuristic_sm100 import choose as _choose
from .family.problem import GemmProblem
from .hardware import B200
from .mbarrier import Mbarrier
from .pipeline import PipelineState
from .scheduler import TileScheduler

BUGS = (None, "reset_per_tile", "no_store_wait", "one_acc_phase", "no_tail")


def choose_config(m: int, n: int, k: int, num_sms: int = B200.sms) -> Sm100Config:
    """The configuration chapter 10's heuristic picks for a BF16 problem with B a weight's view."""
    return _choose(GemmProblem(m, n, k), num_sms)


def tile_scheduler(m: int, n: int, cfg: Sm100Config) -> TileScheduler:
    """The order of the pair tiles (256 x ``block_n``): chapter 07's grouped raster."""
    return TileScheduler(ceil_div(m, PAIR_M), ceil_div(n, cfg.block_n), RASTER, GROUP_M)


def num_clusters_for(m: int, n: int, cfg: Sm100Config) -> int:
    """Clusters launched: one per SM pair, never more than there are tiles."""
    return min(cfg.num_clusters, tile_scheduler(m, n, cfg).num_tiles)


def cluster_tiles(m: int, n: int, cfg: Sm100Config, cluster: int) -> list[tuple[int, int]]:
    """The tiles ``(m_tile, n_tile)`` cluster ``cluster`` computes, in order."""
    return tile_scheduler(m, n, cfg).tiles_for(cluster, num_clusters_for(m, n, cfg))


# --------------------------------------------------------------------------------------
# The schedule as a table (PipelineState walks, no interleaving)
# --------------------------------------------------------------------------------------


def schedule_rows(m: int, n: int, k: int, cfg: Sm100Config | None = None, cluster: int = 0) -> list[dict]:
    """Every step of one cluster, in each role's program order.

    Rows: ``role`` (``"tma"``, ``"mma"``, ``"epilogue"``), ``tile`` (this
    cluster's i-th tile), ``m_tile``, ``n_tile``, ``k`` (k-block, for tma/mma),
    ``sub`` (store sub-tile, epilogue), and the pipeline ``stage``/``phase``
    the role waits with: SMEM-AB for tma/mma k-steps (``ab_stage``,
    ``ab_phase``), TMEM-C per tile (``acc``, ``acc_phase``), SMEM-C per store
    (``c_stage``), plus the rows/columns of C each store writes.
    """
    cfg = cfg or choose_config(m, n, k)
    k_tiles = ceil_div(k, BLOCK_K)
    subtiles = cfg.block_n // cfg.epi_n
    tma_ab = PipelineState.producer(cfg.ab_stages)
    mma_ab = PipelineState.consumer(cfg.ab_stages)
    mma_acc = PipelineState.producer(ACC_STAGES)
    epi_acc = PipelineState.consumer(ACC_STAGES)
    epi_c = PipelineState.producer(C_STAGES)
    rows = []
    for i, (mt, nt) in enumerate(cluster_tiles(m, n, cfg, cluster)):
        for kb in range(k_tiles):
            rows.append(dict(role="tma", tile=i, m_tile=mt, n_tile=nt, k=kb, ab_stage=tma_ab.index,
                             ab_phase=tma_ab.phase))
            tma_ab.advance()
        rows.append(dict(role="mma", tile=i, m_tile=mt, n_tile=nt, k=None, acc=mma_acc.index,
                         acc_phase=mma_acc.phase))
        for kb in range(k_tiles):
            rows.append(dict(role="mma", tile=i, m_tile=mt, n_tile=nt, k=kb, ab_stage=mma_ab.index,
                             ab_phase=mma_ab.phase, acc=mma_acc.index))
            mma_ab.advance()
        mma_acc.advance()
        for sub in range(subtiles):
            col0 = nt * cfg.block_n + sub * cfg.epi_n
            rows.append(dict(role="epilogue", tile=i, m_tile=mt, n_tile=nt, sub=sub, acc=epi_acc.index,
                             acc_phase=epi_acc.phase, c_stage=epi_c.index,
                             rows=(mt * PAIR_M, min(m, mt * PAIR_M + PAIR_M)), cols=(col0, min(n, col0 + cfg.epi_n))))
            epi_c.advance()
        epi_acc.advance()
    return rows


def format_schedule(rows: list[dict], roles=("tma", "mma", "epilogue"), limit: int | None = None) -> str:
    """``rows`` of :func:`schedule_rows` as fixed-width text (deterministic, for notebooks)."""
    out = []
    for r in rows:
        if r["role"] not in roles:
            continue
        head = f"{r['role']:>8}  tile {r['tile']} ({r['m_tile']},{r['n_tile']})"
        if r["role"] == "tma":
            out.append(f"{head}  k={r['k']:<3} SMEM-AB stage {r['ab_stage']} wait empty parity {r['ab_phase']}")
        elif r["role"] == "mma" and r["k"] is None:
            out.append(f"{head}  TMEM-C acc {r['acc']} wait empty parity {r['acc_phase']}")
        elif r["role"] == "mma":
            out.append(f"{head}  k={r['k']:<3} SMEM-AB stage {r['ab_stage']} wait full parity {r['ab_phase']}"
                       f" -> acc {r['acc']}")
        else:
            out.append(f"{head}  sub {r['sub']}  TMEM-C acc {r['acc']} wait full parity {r['acc_phase']}  "
                       f"SMEM-C buf {r['c_stage']}  -> C rows {r['rows'][0]}:{r['rows'][1]} (128 per CTA), "
                       f"cols {r['cols'][0]}:{r['cols'][1]}")
        if limit is not None and len(out) >= limit:
            break
    return "\n".join(out)


# --------------------------------------------------------------------------------------
# The kernel executed: roles as programs, barriers as Mbarrier models, random timing
# --------------------------------------------------------------------------------------


@dataclass
class Wait:
    """A role blocked until ``ready()``; ``barrier``/``parity``/``need`` for barrier waits."""

    what: str
    ready: callable
    barrier: Mbarrier | None = None
    parity: int | None = None
    need: int | None = None  # completed phases this wait really needs (from a visit counter)


@dataclass
class ClusterRun:
    """What :func:`simulate_cluster` saw."""

    cluster: int
    steps: int = 0
    deadlock: bool = False
    stuck: list[str] = field(default_factory=list)  # the waits nobody could satisfy
    aliased: list[str] = field(default_factory=list)  # waits that passed on a phase older than needed
    trace: list[dict] = field(default_factory=list)  # every role step with its stage/phase (as schedule_rows)
    stores: list[tuple] = field(default_factory=list)  # (cta, rows, cols) of every TMA store, in completion order
    late: list[str] = field(default_factory=list)  # arrivals on a CTA's barrier after all its roles had finished

    @property
    def ok(self) -> bool:
        return not self.deadlock and not self.aliased and not self.late


class _Cluster:
    """The state of one CTA pair: barriers, shared memory, TMEM, queues."""

    def __init__(self, cfg: Sm100Config):
        s = cfg.ab_stages
        self.ab_full = [[Mbarrier(1) for _ in range(s)] for _ in range(2)]  # only the leader's is used
        self.ab_empty = [[Mbarrier(1) for _ in range(s)] for _ in range(2)]
        self.tmem_full = [[Mbarrier(1) for _ in range(ACC_STAGES)] for _ in range(2)]
        self.tmem_empty = [[Mbarrier(2 * EPILOGUE_WARPS) for _ in range(ACC_STAGES)] for _ in range(2)]
        self.smem_a = [[None] * s for _ in range(2)]
        self.smem_b = [[None] * s for _ in range(2)]
        self.tmem = [[None] * ACC_STAGES for _ in range(2)]
        self.staging = [[None] * C_STAGES for _ in range(2)]
        self.loads: list = []  # TMA loads in flight: finish in any order
        self.tensor_pipe: list = []  # MMAs and commits: finish in order
        self.stores: list[list] = [[], []]  # TMA stores per CTA: bulk groups finish in order


def _padded(x: np.ndarray, r0: int, rows: int, c0: int, cols: int) -> np.ndarray:
    """``x[r0:r0+rows, c0:c0+cols]`` with zeros outside ``x`` (TMA's out-of-bounds fill)."""
    out = np.zeros((rows, cols), dtype=np.float32)
    blk = x[r0:r0 + rows, c0:c0 + cols]
    out[:blk.shape[0], :blk.shape[1]] = blk
    return out


def simulate_cluster(a: np.ndarray, b: np.ndarray, c: np.ndarray, cfg: Sm100Config, cluster: int, *,
                     seed: int = 0, bug: str | None = None, max_steps: int = 10_000_000) -> ClusterRun:
    """Execute cluster ``cluster``'s share of ``c = a @ b.T`` (a: M x K, b: N x K, fp32), in place.

    ``bug`` injects a known mistake (the tests prove the model catches each):
    ``"reset_per_tile"`` (SMEM-AB PipelineStates re-created every tile),
    ``"no_store_wait"`` (the epilogue overwrites a staging buffer without
    ``cp.async.bulk.wait_group.read``), ``"one_acc_phase"`` (the MMA warp
    never flips its TMEM-C phase), ``"no_tail"`` (the TMA and MMA warps skip their producer tails).

    A *late arrival* is an arrival on a CTA's barrier after every role of that CTA has finished: that CTA
    may already be tearing down (freeing TMEM, exiting) while the other CTA still signals it. The producer
    tails exist to make that impossible; ``no_tail`` shows what they prevent.
    """
    check_choice("bug", bug, BUGS)
    cfg = _checked_config(cfg)
    m, k = a.shape
    n = b.shape[0]
    S, bn, en = cfg.ab_stages, cfg.block_n, cfg.epi_n
    k_tiles = ceil_div(k, BLOCK_K)
    tiles = cluster_tiles(m, n, cfg, cluster)
    st = _Cluster(cfg)
    run = ClusterRun(cluster)
    rng = random.Random(seed * 7919 + cluster)
    visits: dict = {}

    def wait(bar: Mbarrier, parity: int, name: str, empty_side: bool) -> Wait:
        key = id(bar)
        need = visits.get(key, 0) + (0 if empty_side else 1)
        return Wait(name, lambda: bar.try_wait_parity(parity), bar, parity, need)

    def passed(w: Wait):
        if w.barrier is not None:
            visits[id(w.barrier)] = visits.get(id(w.barrier), 0) + 1
            if w.barrier.phase != w.need:
                run.aliased.append(f"{w.what}: passed with {w.barrier.phase} phases complete, needed {w.need}")

    # ---- TMA-load warp of CTA ``cta``
    def tma_role(cta):
        ab = PipelineState.producer(S)
        for i, (mt, nt) in enumerate(tiles):
            if bug == "reset_per_tile":
                ab = PipelineState.producer(S)
            for kb in range(k_tiles):
                s = ab.index
                yield wait(st.ab_empty[cta][s], ab.phase, f"tma{cta} ab_empty[{s}] (tile {i}, k {kb})", True)
                run.trace.append(dict(role="tma", cta=cta, tile=i, m_tile=mt, n_tile=nt, k=kb, ab_stage=s,
                                      ab_phase=ab.phase))
                if cta == 0:
                    st.ab_full[0][s].arrive_expect_tx(cfg.tx_bytes)
                a_blk = _padded(a, mt * PAIR_M + cta * CTA_M, CTA_M, kb * BLOCK_K, BLOCK_K)
                b_blk = _padded(b, nt * bn + cta * (bn // 2), bn // 2, kb * BLOCK_K, BLOCK_K)
                st.loads.append((cta, s, a_blk, b_blk))
                ab.advance()
        if bug != "no_tail":  # producer tail: every stage this CTA filled has been released
            for _ in range(S):
                yield wait(st.ab_empty[cta][ab.index], ab.phase, f"tma{cta} tail ab_empty[{ab.index}]", True)
                ab.advance()

    def cta_done(cta):
        return all(r in done for r in (("tma0", "mma", "epi0") if cta == 0 else ("tma1", "epi1")))

    def arrive_on(cta, bar, what):
        if cta_done(cta):
            run.late.append(f"{what} arrives on CTA {cta} after all its roles finished")
        bar.arrive()

    def finish_load(load):
        cta, s, a_blk, b_blk = load
        st.smem_a[cta][s], st.smem_b[cta][s] = a_blk, b_blk
        if cta_done(0):
            run.late.append(f"TMA load of CTA {cta} completes on CTA 0's ab_full[{s}] after all its roles finished")
        st.ab_full[0][s].complete_tx(cfg.stage_bytes)  # the 2-CTA TMA signals the leader's barrier

    # ---- MMA warp (leader CTA)
    def mma_role():
        ab = PipelineState.consumer(S)
        acc = PipelineState.producer(ACC_STAGES)
        for i, (mt, nt) in enumerate(tiles):
            if bug == "reset_per_tile":
                ab = PipelineState.consumer(S)
            yield wait(st.tmem_empty[0][acc.index], acc.phase, f"mma tmem_empty[{acc.index}] (tile {i})", True)
            run.trace.append(dict(role="mma", cta=0, tile=i, m_tile=mt, n_tile=nt, k=None, acc=acc.index,
                                  acc_phase=acc.phase))
            for kb in range(k_tiles):
                s = ab.index
                yield wait(st.ab_full[0][s], ab.phase, f"mma ab_full[{s}] (tile {i}, k {kb})", False)
                run.trace.append(dict(role="mma", cta=0, tile=i, m_tile=mt, n_tile=nt, k=kb, ab_stage=s,
                                      ab_phase=ab.phase, acc=acc.index))
                st.tensor_pipe.append(("mma", s, acc.index, kb > 0))
                st.tensor_pipe.append(("commit", [st.ab_empty[0][s], st.ab_empty[1][s]], f"commit ab_empty[{s}]"))
                ab.advance()
            st.tensor_pipe.append(("commit", [st.tmem_full[0][acc.index], st.tmem_full[1][acc.index]],
                                   f"commit tmem_full[{acc.index}]"))
            if bug == "one_acc_phase":
                acc.index = (acc.index + 1) % ACC_STAGES  # moves the stage but never flips the phase
                acc.count += 1
            else:
                acc.advance()
        if bug != "no_tail":  # producer tail: both epilogues have drained every accumulator
            for _ in range(ACC_STAGES):
                yield wait(st.tmem_empty[0][acc.index], acc.phase, f"mma tail tmem_empty[{acc.index}]", True)
                acc.advance()

    def finish_tensor_op(op):
        if op[0] == "mma":
            _, s, ai, accumulate = op
            b_pair = np.concatenate([st.smem_b[0][s], st.smem_b[1][s]], axis=0)  # block_n x 64
            for cta in (0, 1):
                prod = st.smem_a[cta][s] @ b_pair.T
                st.tmem[cta][ai] = st.tmem[cta][ai] + prod if accumulate else prod
        else:
            for cta, bar in enumerate(op[1]):  # the multicast commit: one arrival in each CTA of the pair
                arrive_on(cta, bar, op[2])

    # ---- epilogue warpgroup of CTA ``cta``
    def epilogue_role(cta):
        acc = PipelineState.consumer(ACC_STAGES)
        cst = PipelineState.producer(C_STAGES)
        for i, (mt, nt) in enumerate(tiles):
            yield wait(st.tmem_full[cta][acc.index], acc.phase, f"epi{cta} tmem_full[{acc.index}] (tile {i})",
                       False)
            for sub in range(bn // en):
                regs = st.tmem[cta][acc.index][:, sub * en:(sub + 1) * en].copy()  # tcgen05.ld
                if bug != "no_store_wait":
                    yield Wait(f"epi{cta} wait_group.read {C_STAGES - 1}",
                               lambda: len(st.stores[cta]) <= C_STAGES - 1)
                r0, c0 = mt * PAIR_M + cta * CTA_M, nt * bn + sub * en
                run.trace.append(dict(role="epilogue", cta=cta, tile=i, m_tile=mt, n_tile=nt, sub=sub,
                                      acc=acc.index, acc_phase=acc.phase, c_stage=cst.index,
                                      rows=(r0, min(m, r0 + CTA_M)), cols=(c0, min(n, c0 + en))))
                st.staging[cta][cst.index] = regs
                st.stores[cta].append((cst.index, r0, c0))
                cst.advance()
            for _ in range(EPILOGUE_WARPS):  # one elected lane per warp, remote arrive on the leader
                arrive_on(0, st.tmem_empty[0][acc.index], f"epi{cta} tmem_empty[{acc.index}]")
            acc.advance()
        yield Wait(f"epi{cta} wait_group 0", lambda: not st.stores[cta])

    def finish_store(cta):
        ci, r0, c0 = st.stores[cta].pop(0)
        blk = st.staging[cta][ci]
        r1, c1 = min(m, r0 + CTA_M), min(n, c0 + en)
        if r1 > r0 and c1 > c0:  # TMA clips the box at the tensor's edge
            c[r0:r1, c0:c1] = blk[:r1 - r0, :c1 - c0]
            run.stores.append((cta, (r0, r1), (c0, c1)))

    roles = {"tma0": tma_role(0), "tma1": tma_role(1), "mma": mma_role(), "epi0": epilogue_role(0),
             "epi1": epilogue_role(1)}
    pending: dict[str, Wait | None] = {name: None for name in roles}
    done: set[str] = set()

    def step_role(name):
        try:
            pending[name] = next(roles[name])
        except StopIteration:
            done.add(name)
            pending[name] = None

    for name in roles:  # run every role to its first wait
        step_role(name)
    while run.steps < max_steps:
        choices = []
        for name in roles:
            if name not in done and pending[name] is not None and pending[name].ready():
                choices.append(("role", name))
        if st.loads:
            choices.append(("load", None))
        if st.tensor_pipe:
            choices.append(("tensor", None))
        for cta in (0, 1):
            if st.stores[cta]:
                choices.append(("store", cta))
        if not choices:
            break
        kind, arg = rng.choice(choices)
        run.steps += 1
        if kind == "role":
            passed(pending[arg])
            step_role(arg)
        elif kind == "load":
            finish_load(st.loads.pop(rng.randrange(len(st.loads))))
        elif kind == "tensor":
            finish_tensor_op(st.tensor_pipe.pop(0))
        else:
            finish_store(arg)
    if len(done) != len(roles):
        run.deadlock = True
        for name in roles:
            w = pending[name]
            if name not in done and w is not None:
                extra = "" if w.barrier is None else (f": waits parity {w.parity}, barrier has completed "
                                                      f"{w.barrier.phase} phase(s)")
                run.stuck.append(f"{w.what}{extra}")
    return run


@dataclass
class ModelRun:
    """The result of :func:`run_model`: C, and one :class:`ClusterRun` per cluster."""

    c: np.ndarray
    clusters: list[ClusterRun]
    cfg: Sm100Config
    written: np.ndarray | None = None  # which elements of C a store wrote

    @property
    def unwritten(self) -> int:
        """Elements of C that no TMA store wrote (still poisoned)."""
        return int((~self.written).sum()) if self.written is not None else 0

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.clusters) and self.unwritten == 0

    @property
    def late(self) -> list[str]:
        return [w for r in self.clusters for w in r.late]

    @property
    def deadlocks(self) -> list[ClusterRun]:
        return [r for r in self.clusters if r.deadlock]

    @property
    def aliased(self) -> list[str]:
        return [w for r in self.clusters for w in r.aliased]


POISON = np.float32(-12345.0)  # the model's output starts poisoned, like the GPU tests' outputs


def _checked_config(cfg) -> Sm100Config:
    """``cfg`` re-validated: an ``Sm100Config`` whose fields pass every rule (also one altered after creation)."""
    if not isinstance(cfg, Sm100Config):
        raise TypeError(f"cfg must be an Sm100Config (gemmlab.family.configs); got {type(cfg).__name__}")
    return replace(cfg).check_fits() if cfg.ab_stages >= 2 else replace(cfg)


def run_model(a, b, cfg: Sm100Config | None = None, *, seed: int = 0, bug: str | None = None) -> ModelRun:
    """Run every cluster of the kernel on the CPU for ``a @ b.T`` (``a``: M x K, ``b``: N x K).

    ``a``/``b`` are numpy arrays or torch tensors (converted to fp32).
    """
    a = np.asarray(a.float().cpu() if hasattr(a, "float") else a, dtype=np.float32)
    b = np.asarray(b.float().cpu() if hasattr(b, "float") else b, dtype=np.float32)
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[1]:
        raise ValueError(f"a must be M x K and b N x K with the same K; got {a.shape} and {b.shape}")
    m, k = a.shape
    n = b.shape[0]
    if min(m, n, k) < 1:
        raise ValueError(f"a and b must not be empty; got {a.shape} and {b.shape}")
    cfg = _checked_config(cfg if cfg is not None else choose_config(m, n, k))
    c = np.full((m, n), POISON, dtype=np.float32)
    runs = [simulate_cluster(a, b, c, cfg, cl, seed=seed, bug=bug) for cl in range(num_clusters_for(m, n, cfg))]
    written = np.zeros((m, n), dtype=bool)
    for r in runs:
        for _, (r0, r1), (c0, c1) in r.stores:
            written[r0:r1, c0:c1] = True
    return ModelRun(c, runs, cfg, written)


def small_config(block_n: int = 256, ab_stages: int = 3, num_sms: int = 4, epi_n: int = 32) -> Sm100Config:
    """A configuration for CPU runs: few clusters (so each takes several tiles), a short ring."""
    return Sm100Config(block_n=block_n, ab_stages=ab_stages, epi_n=epi_n, num_sms=num_sms)


def integer_operands(m: int, n: int, k: int, seed: int = 0):
    """Small-integer A (M x K) and B (N x K): every FP32 sum is exact, so any order gives A @ B bit for bit."""
    rng = np.random.default_rng(seed)
    a = rng.integers(-3, 4, size=(m, k)).astype(np.float32)
    b = rng.integers(-3, 4, size=(n, k)).astype(np.float32)
    return a, b


# --------------------------------------------------------------------------------------
# Pictures: which pair takes which tile, and the stage/phase walk of one cluster
# --------------------------------------------------------------------------------------


def tile_owner_grid(m: int, n: int, cfg: Sm100Config):
    """Arrays (m_tiles x n_tiles): the cluster that computes each tile, its position in that
    cluster's list, and the TMEM-C accumulator stage it uses."""
    sched = tile_scheduler(m, n, cfg)
    owner = np.full((sched.m_tiles, sched.n_tiles), -1, dtype=int)
    order = np.full_like(owner, -1)
    acc = np.full_like(owner, -1)
    for cl in range(num_clusters_for(m, n, cfg)):
        for i, (mt, nt) in enumerate(cluster_tiles(m, n, cfg, cl)):
            owner[mt, nt], order[mt, nt], acc[mt, nt] = cl, i, i % ACC_STAGES
    return owner, order, acc


def draw_schedule(m: int, n: int, k: int, cfg: Sm100Config, name: str = "10_schedule", cluster: int = 0,
                  max_tiles: int = 4):
    """Two panels: the tile grid (colour = cluster, label = order/accumulator stage) and, for the
    first ``max_tiles`` tiles of ``cluster``, the stage of each pipeline at every step.
    Returns ``(path, data)``."""
    from .figures import new_figure, save

    owner, order, acc = tile_owner_grid(m, n, cfg)
    rows = [r for r in schedule_rows(m, n, k, cfg, cluster) if r["tile"] < max_tiles]
    fig, (ax, bx) = new_figure(1, 2, figsize=(14, 4.6), gridspec_kw={"width_ratios": [1, 1.5]})
    fig.subplots_adjust(wspace=0.42)
    cmap = __import__("matplotlib").colormaps["tab20"]
    for mt in range(owner.shape[0]):
        for nt in range(owner.shape[1]):
            cl = owner[mt, nt]
            ax.add_patch(__import__("matplotlib").patches.Rectangle(
                (nt, mt), 1, 1, facecolor=cmap(cl % 20), edgecolor="white", lw=1.5,
                hatch="//" if acc[mt, nt] else None))
            ax.text(nt + 0.5, mt + 0.5, f"c{cl}\n#{order[mt, nt]}", ha="center", va="center", fontsize=7)
    ax.set_xlim(0, owner.shape[1])
    ax.set_ylim(owner.shape[0], 0)
    ax.set_xlabel(f"n_tile ({cfg.block_n} columns)")
    ax.set_ylabel(f"m_tile ({PAIR_M} rows = 2 CTAs)")
    ax.set_title(f"M={m}, N={n}: cluster c, position #i (hatched: accumulator stage 1)", fontsize=9)
    ax.set_aspect("equal")

    lanes = [("tma", "ab_stage", "TMA: SMEM-AB stage"), ("mma", "ab_stage", "MMA: SMEM-AB stage"),
             ("mma", "acc", "MMA: TMEM-C stage"), ("epilogue", "acc", "epilogue: TMEM-C stage"),
             ("epilogue", "c_stage", "epilogue: SMEM-C buffer")]
    data = {}
    for y, (role, key, label) in enumerate(lanes):
        seq = [r for r in rows if r["role"] == role and (role != "mma" or (r["k"] is not None))]
        vals = [r[key] for r in seq]
        phases = [r.get("ab_phase" if key == "ab_stage" else "acc_phase", 0) for r in seq]
        data[label] = list(zip(vals, phases))
        for x, (v, p) in enumerate(zip(vals, phases)):
            bx.add_patch(__import__("matplotlib").patches.Rectangle(
                (x, y - 0.4), 1, 0.8, facecolor=cmap(2 * v % 20), edgecolor="black", lw=0.3,
                alpha=1.0 if p == 0 or key == "c_stage" else 0.55))
            if len(vals) <= 48:
                bx.text(x + 0.5, y, str(v), ha="center", va="center", fontsize=6)
        tile_starts = [x for x, r in enumerate(seq) if (r.get("k") == 0 or r.get("sub") == 0)]
        for x in tile_starts[1:]:
            bx.plot([x, x], [y - 0.45, y + 0.45], color="black", lw=1.5)
    bx.set_yticks(range(len(lanes)))
    bx.set_yticklabels([lbl for _, _, lbl in lanes], fontsize=8)
    bx.set_ylim(len(lanes) - 0.4, -0.6)
    bx.set_xlim(0, max(len(v) for v in data.values()))
    bx.set_xlabel("step of this role (black bar: next tile; pale: the role waits with parity 1)")
    bx.set_title(f"cluster {cluster}, first {max_tiles} tiles: {ceil_div(k, BLOCK_K)} k-blocks per tile, {cfg.ab_stages} SMEM-AB stages, "
                 f"{ACC_STAGES} TMEM-C, {C_STAGES} SMEM-C", fontsize=9)
    path = save(fig, name)
    return path, {"owner": owner, "order": order, "acc": acc, "lanes": data}
