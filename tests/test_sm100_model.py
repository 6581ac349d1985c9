"""Chapter 10 on the CPU: the schedule model of the persistent 2-CTA GEMM, and the prediction."""
import numpy as np
import pytest

from gemmlab import sm100_model as sm
from gemmlab.family.configs import ACC_STAGES, Sm100Config
from gemmlab.family.heuristic_sm100 import choose
from gemmlab.family.problem import GemmProblem
from gemmlab.scheduler import TileScheduler

SMALL_256 = sm.small_config(block_n=256, ab_stages=3, num_sms=4)  # 2 clusters, 5 k-blocks % 3 stages != 0
SMALL_128 = sm.small_config(block_n=128, ab_stages=4, num_sms=6)  # 3 clusters


# ---------------------------------------------------------------- the tile order


@pytest.mark.parametrize("shape", [(300, 520), (1000, 2000), (100, 72), (4096, 7168)])
@pytest.mark.parametrize("cfg", [SMALL_256, SMALL_128, Sm100Config()])
def test_every_tile_exactly_once(shape, cfg):
    m, n = shape
    seen = [t for cl in range(sm.num_clusters_for(m, n, cfg)) for t in sm.cluster_tiles(m, n, cfg, cl)]
    sched = sm.tile_scheduler(m, n, cfg)
    assert sorted(seen) == sorted((i, j) for i in range(sched.m_tiles) for j in range(sched.n_tiles))


def test_tile_order_is_chapter_07s():
    cfg = SMALL_256
    sched = sm.tile_scheduler(1000, 2000, cfg)
    assert sched == TileScheduler(4, 8, "m", 8)
    assert sm.cluster_tiles(1000, 2000, cfg, 1) == sched.tiles_for(1, 2)
    assert sm.cluster_tiles(1000, 2000, cfg, 1)[:3] == [(1, 0), (3, 0), (1, 1)]  # down M in a band, then next N


def test_owner_grid_matches_cluster_lists():
    owner, order, acc = sm.tile_owner_grid(1000, 2000, SMALL_256)
    for cl in range(2):
        for i, (mt, nt) in enumerate(sm.cluster_tiles(1000, 2000, SMALL_256, cl)):
            assert (owner[mt, nt], order[mt, nt], acc[mt, nt]) == (cl, i, i % ACC_STAGES)
    assert (owner >= 0).all()


# ---------------------------------------------------------------- the schedule table


def test_schedule_rows_hand_worked():
    # k = 320: 5 k-blocks per tile, 3 SMEM-AB stages: tile 1 starts in stage 2, not 0.
    rows = sm.schedule_rows(300, 520, 320, SMALL_256, cluster=0)
    tma = [(r["tile"], r["ab_stage"], r["ab_phase"]) for r in rows if r["role"] == "tma"]
    assert tma[:10] == [(0, 0, 1), (0, 1, 1), (0, 2, 1), (0, 0, 0), (0, 1, 0),
                        (1, 2, 0), (1, 0, 1), (1, 1, 1), (1, 2, 1), (1, 0, 0)]
    mma_k = [(r["ab_stage"], r["ab_phase"]) for r in rows if r["role"] == "mma" and r["k"] is not None]
    assert mma_k[:6] == [(0, 0), (1, 0), (2, 0), (0, 1), (1, 1), (2, 1)]
    mma_acc = [(r["acc"], r["acc_phase"]) for r in rows if r["role"] == "mma" and r["k"] is None]
    epi_acc = [(r["acc"], r["acc_phase"]) for r in rows if r["role"] == "epilogue" and r["sub"] == 0]
    assert mma_acc == [(0, 1), (1, 1), (0, 0)][:len(mma_acc)]
    assert epi_acc == [(0, 0), (1, 0), (0, 1)][:len(epi_acc)]
    epi = [r for r in rows if r["role"] == "epilogue"]
    assert [r["c_stage"] for r in epi[:5]] == [0, 1, 0, 1, 0]
    assert epi[0]["rows"] == (0, 256) and epi[0]["cols"] == (0, 32)
    assert epi[7]["cols"] == (224, 256)


def test_format_schedule_is_text():
    text = sm.format_schedule(sm.schedule_rows(300, 520, 320, SMALL_256), limit=3)
    assert text.splitlines()[0].split() == ["tma", "tile", "0", "(0,0)", "k=0", "SMEM-AB", "stage", "0", "wait",
                                            "empty", "parity", "1"]


# ---------------------------------------------------------------- the executed model


SHAPES = [(300, 520, 320), (256, 256, 64), (100, 72, 40), (700, 300, 200), (513, 136, 8)]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("cfg", [SMALL_256, SMALL_128], ids=["bn256", "bn128"])
@pytest.mark.parametrize("seed", [0, 1])
def test_model_reproduces_a_at_b_exactly(shape, cfg, seed):
    m, n, k = shape
    a, b = sm.integer_operands(m, n, k, seed)
    run = sm.run_model(a, b, cfg, seed=seed)
    assert run.ok, (run.deadlocks, run.aliased[:3])
    assert not (run.c == sm.POISON).any()  # every element written
    assert np.array_equal(run.c, a @ b.T)  # small integers: FP32 sums are exact in any order


def test_model_with_the_real_configuration():
    a, b = sm.integer_operands(600, 1000, 448, 3)
    cfg = choose(GemmProblem(600, 1000, 448))  # what chapter 10's kernel runs for this problem
    assert sm.choose_config(600, 1000, 448) == cfg
    run = sm.run_model(a, b, cfg, seed=3)
    assert run.cfg == cfg
    assert run.ok and np.array_equal(run.c, a @ b.T)


def test_model_accepts_torch():
    torch = pytest.importorskip("torch")
    a, b = sm.integer_operands(130, 64, 72)
    run = sm.run_model(torch.from_numpy(a).bfloat16(), torch.from_numpy(b).bfloat16(), SMALL_128)
    assert np.array_equal(run.c, a @ b.T)


@pytest.mark.parametrize("stages", [2, 3, 4, 5])
@pytest.mark.parametrize("k_tiles", [1, 2, 3, 5, 7, 8])
def test_no_deadlock_for_any_k_tiles_and_stages(stages, k_tiles):
    cfg = sm.small_config(block_n=128, ab_stages=stages, num_sms=2)  # one cluster: 3 tiles in a row
    a, b = sm.integer_operands(260, 256, 64 * k_tiles, stages)
    run = sm.run_model(a, b, cfg, seed=k_tiles)
    assert not run.deadlocks and not run.aliased
    assert np.array_equal(run.c, a @ b.T)


def test_trace_follows_the_schedule_table():
    m, n, k = 300, 520, 320
    a, b = sm.integer_operands(m, n, k)
    run = sm.run_model(a, b, SMALL_256, seed=5)
    for cl, crun in enumerate(run.clusters):
        rows = sm.schedule_rows(m, n, k, SMALL_256, cl)
        for role, keys in (("tma", ("tile", "k", "ab_stage", "ab_phase")),
                           ("mma", ("tile", "k", "ab_stage", "ab_phase", "acc")),
                           ("epilogue", ("tile", "sub", "acc", "acc_phase", "c_stage"))):
            want = [tuple(r.get(x) for x in keys) for r in rows if r["role"] == role]
            for cta in ((0, 1) if role != "mma" else (0,)):
                got = [tuple(t.get(x) for x in keys) for t in crun.trace if t["role"] == role and t["cta"] == cta]
                assert got == want, (cl, role, cta)


def test_stores_cover_c_once():
    m, n, k = 300, 520, 320
    a, b = sm.integer_operands(m, n, k)
    run = sm.run_model(a, b, SMALL_256)
    hits = np.zeros((m, n), dtype=int)
    for crun in run.clusters:
        for _, (r0, r1), (c0, c1) in crun.stores:
            hits[r0:r1, c0:c1] += 1
    assert (hits == 1).all()


@pytest.mark.parametrize("seed", range(4))
def test_reset_per_tile_is_caught(seed):
    a, b = sm.integer_operands(300, 520, 320, seed)
    run = sm.run_model(a, b, SMALL_256, seed=seed, bug="reset_per_tile")
    assert run.deadlocks or run.aliased
    assert not np.array_equal(run.c, a @ b.T)


@pytest.mark.parametrize("seed", range(4))
def test_missing_store_wait_corrupts_c(seed):
    a, b = sm.integer_operands(300, 520, 320, seed)
    run = sm.run_model(a, b, SMALL_256, seed=seed, bug="no_store_wait")
    assert not np.array_equal(run.c, a @ b.T)


@pytest.mark.parametrize("seed", range(4))
def test_unflipped_accumulator_phase_is_caught(seed):
    a, b = sm.integer_operands(300, 520, 320, seed)
    run = sm.run_model(a, b, SMALL_256, seed=seed, bug="one_acc_phase")
    assert run.deadlocks or run.aliased


def test_deadlock_is_reported_with_the_stuck_wait():
    a, b = sm.integer_operands(300, 520, 320)
    stuck = []
    for seed in range(8):
        run = sm.run_model(a, b, SMALL_256, seed=seed, bug="one_acc_phase")
        stuck += [s for r in run.deadlocks for s in r.stuck]
    assert stuck and all("waits parity" in s or "wait_group" in s for s in stuck)


def test_bad_bug_name():
    a, b = sm.integer_operands(8, 8, 8)
    with pytest.raises(ValueError, match="bug"):
        sm.run_model(a, b, SMALL_256, bug="typo")
    with pytest.raises(ValueError, match="same K"):
        sm.run_model(a, b[:, :4], SMALL_256)


# ---------------------------------------------------------------- figures


def test_schedule_figure_data(tmp_path, monkeypatch):
    from gemmlab import figures

    monkeypatch.setattr(figures, "FIGURES_DIR", tmp_path)
    path, data = sm.draw_schedule(1000, 2000, 320, SMALL_256, name="10_test_schedule")
    assert path.exists()
    owner, order, acc = sm.tile_owner_grid(1000, 2000, SMALL_256)
    assert (data["owner"] == owner).all()
    rows = sm.schedule_rows(1000, 2000, 320, SMALL_256, 0)
    tma = [(r["ab_stage"], r["ab_phase"]) for r in rows if r["role"] == "tma" and r["tile"] < 4]
    assert data["lanes"]["TMA: SMEM-AB stage"] == tma


# ---------------------------------------------------------------- no silent wrong answers


@pytest.mark.parametrize("block_n", [100, 64, 512])
def test_model_rejects_an_invalid_config(block_n):
    a, b = sm.integer_operands(300, 520, 320)
    cfg = sm.small_config()
    object.__setattr__(cfg, "block_n", block_n)  # a config altered after it was checked
    with pytest.raises(ValueError, match="block_n must be one of"):
        sm.run_model(a, b, cfg)
    with pytest.raises(TypeError, match="cfg must be an Sm100Config"):
        sm.run_model(a, b, {"block_n": 256})


def test_unwritten_output_is_not_ok(monkeypatch):
    a, b = sm.integer_operands(300, 520, 320)
    real = sm.simulate_cluster
    # A cluster that never runs (as a grid one cluster too small would leave): its tiles stay poisoned.
    monkeypatch.setattr(sm, "simulate_cluster",
                        lambda a, b, c, cfg, cl, **kw: real(a, b, c, cfg, cl, **kw) if cl == 0 else sm.ClusterRun(cl))
    run = sm.run_model(a, b, SMALL_256)
    assert all(r.ok for r in run.clusters)  # no role saw anything wrong ...
    assert run.unwritten > 0 and not run.ok
    assert run.unwritten == int((run.c == sm.POISON).sum())


def test_model_rejects_empty_operands():
    with pytest.raises(ValueError, match="must not be empty"):
        sm.run_model(np.zeros((0, 8), np.float32), np.zeros((8, 8), np.float32), SMALL_256)


# ---------------------------------------------------------------- producer tails


def test_tails_leave_no_late_arrival():
    a, b = sm.integer_operands(300, 520, 320)
    for seed in range(6):
        run = sm.run_model(a, b, SMALL_256, seed=seed)
        assert run.ok and not run.late


def test_without_tails_the_peer_signals_a_finished_leader():
    a, b = sm.integer_operands(300, 520, 320)
    runs = [sm.run_model(a, b, SMALL_256, seed=s, bug="no_tail") for s in range(12)]
    late = [w for r in runs for w in r.late]
    assert late and all("after all its roles finished" in w for w in late)
    assert any("epi1 tmem_empty" in w for w in late)  # the peer's epilogue arrives on the leader
    assert all(np.array_equal(r.c, a @ b.T) for r in runs)  # C is right: the hazard is the teardown's


def test_chapter10_exercise_solutions_by_hand():
    from gemmlab.course.exercises import ch10

    assert ch10.solution_tx_bytes() == 2 * (128 + 64) * 64 * 2 == 49152
    assert ch10.solution_late_arrival_barrier() == "tmem_empty"
    assert ch10.solution_held_clock_effect() == pytest.approx(1.83 / 1.51, abs=0.02)
