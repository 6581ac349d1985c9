"""Chapter 02: the mbarrier wrappers, the CPU model and the phase demo."""
import pytest

from gemmlab import figures, mbarrier as mb
from gemmlab.compile import ptx_lines
from gemmlab.tiers import TierError, detect_tier

# ---------------------------------------------------------------- the CPU model


def test_init_state_and_first_probes():
    bar = mb.Mbarrier(3)
    assert (bar.count, bar.pending, bar.tx, bar.phase, bar.parity) == (3, 3, 0, 0, 0)
    # Phase 0 is running; the "phase before it" (parity 1) reads as complete.
    assert bar.try_wait_parity(0) is False
    assert bar.try_wait_parity(1) is True


def test_arrivals_complete_a_phase_and_rearm():
    bar = mb.Mbarrier(3)
    bar.arrive()
    bar.arrive()
    assert (bar.pending, bar.phase) == (1, 0)
    assert not bar.try_wait_parity(0)
    bar.arrive()  # the third arrival completes phase 0
    assert (bar.pending, bar.phase, bar.parity) == (3, 1, 1)
    assert bar.try_wait_parity(0) and not bar.try_wait_parity(1)
    for _ in range(3):
        bar.arrive()
    assert (bar.phase, bar.parity) == (2, 0)
    assert not bar.try_wait_parity(0) and bar.try_wait_parity(1)


def test_tx_bytes_hold_the_phase_open():
    bar = mb.Mbarrier(2)
    bar.arrive_expect_tx(100)
    bar.arrive()
    assert (bar.pending, bar.tx, bar.phase) == (0, 100, 0)  # all arrived, bytes missing
    assert not bar.try_wait_parity(0)
    bar.complete_tx(60)
    assert (bar.tx, bar.phase) == (40, 0)
    bar.complete_tx(40)
    assert (bar.pending, bar.tx, bar.phase) == (2, 0, 1)


def test_bytes_may_land_before_they_are_expected():
    # A copy engine can complete bytes before the expect_tx of the same phase:
    # tx-count goes negative and the phase still waits for the arrival.
    bar = mb.Mbarrier(1)
    bar.complete_tx(64)
    assert (bar.tx, bar.phase) == (-64, 0)
    bar.arrive_expect_tx(64)
    assert (bar.tx, bar.phase, bar.pending) == (0, 1, 1)


def test_expect_tx_without_arrive():
    bar = mb.Mbarrier(1)
    bar.expect_tx(32)
    bar.arrive()
    assert bar.phase == 0 and bar.tx == 32
    bar.complete_tx(32)
    assert bar.phase == 1


def test_model_rejects_bad_use():
    with pytest.raises(ValueError, match="count"):
        mb.Mbarrier(0)
    with pytest.raises(TypeError, match="count"):
        mb.Mbarrier(2.0)
    bar = mb.Mbarrier(1)
    with pytest.raises(ValueError, match="parity"):
        bar.try_wait_parity(2)
    with pytest.raises(ValueError, match="tx_bytes"):
        bar.expect_tx(-1)
    bar.expect_tx(8)
    bar.arrive()  # pending 0, tx 8: a second arrival would overflow the count
    with pytest.raises(RuntimeError, match="more arrivals"):
        bar.arrive()


# ---------------------------------------------------------------- the phase demo, on the model

# Worked by hand: (pending, tx, phase, try_wait.parity(0), try_wait.parity(1)) per step.
HAND_DEMO = [
    (64, 0, 0, False, True),  # init
    (32, 256, 0, False, True),  # r0 first half, tx registered
    (0, 256, 0, False, True),  # r0 all arrived, bytes missing
    (64, 0, 1, True, False),  # r0 complete_tx: phase 0 done
    (32, 256, 1, True, False),
    (0, 256, 1, True, False),
    (64, 0, 2, False, True),
    (32, 256, 2, False, True),
    (0, 256, 2, False, True),
    (64, 0, 3, True, False),
]


def test_phase_demo_model_matches_hand_worked_table():
    probes = mb.phase_demo_model(3)
    assert [(p.pending, p.tx, p.phase, p.wait0, p.wait1) for p in probes] == HAND_DEMO
    assert mb.model_pairs(probes) == [(w0, w1) for *_, w0, w1 in HAND_DEMO]
    assert len(mb.phase_demo_steps(3)) == 10
    assert "expect_tx + arrive" in mb.phase_demo_steps(3)[4]


def test_phase_demo_table_text():
    text = mb.phase_demo_table(mb.phase_demo_model(1))
    lines = text.splitlines()
    assert len(lines) == 5 and lines[0].startswith("step")
    assert lines[-1].split()[-2:] == ["True", "False"]


def test_phase_bit_figure_data(tmp_path, monkeypatch):
    monkeypatch.setattr(figures, "FIGURES_DIR", tmp_path)
    path, data = mb.draw_phase_bit(mb.phase_demo_model(3))
    assert path.exists() and path.name == "02_phase_bit.png"
    assert data["pending"].tolist() == [r[0] for r in HAND_DEMO]
    assert data["tx"].tolist() == [r[1] for r in HAND_DEMO]
    assert data["parity"].tolist() == [r[2] % 2 for r in HAND_DEMO]
    assert data["wait0"].tolist() == [int(r[3]) for r in HAND_DEMO]
    path, cyc = mb.draw_phase_cycle()
    assert path.exists()
    assert cyc == {0: {"try_wait.parity(0)": False, "try_wait.parity(1)": True},
                   1: {"try_wait.parity(0)": True, "try_wait.parity(1)": False}}


# ---------------------------------------------------------------- PTX


def test_wrappers_emit_each_instruction():
    names = mb.mbarrier_instructions(mb.compile_wrappers("sm_90a"))
    assert names == [
        "mbarrier.init.shared::cta.b64",
        "fence.mbarrier_init.release.cluster",
        "mbarrier.arrive.expect_tx.shared::cta.b64",
        "mbarrier.expect_tx.relaxed.cta.shared::cta.b64",
        "mbarrier.arrive.shared::cta.b64",
        "mbarrier.complete_tx.relaxed.cta.shared::cta.b64",
        "mbarrier.try_wait.parity.shared::cta.b64",
    ]
    c = mb.compile_wrappers("sm_90a")
    # the spin loop: a probe and a backward branch inside one asm block
    loop = [line for line in ptx_lines(c, r"WAIT_PARITY")]
    assert len(loop) == 1 and "@!p bra WAIT_PARITY" in loop[0]
    assert "selp.u32" in ptx_lines(c, r"try_wait")[0]


def test_dsl_twins_emit_the_same_instruction_families():
    ours = mb.mbarrier_instructions(mb.compile_wrappers("sm_90a"))
    dsl = mb.mbarrier_instructions(mb.compile_wrappers("sm_90a", dsl=True))

    def family(names):
        return {n.split(".shared")[0].replace(".relaxed.cta", "").replace(".acquire.cta", "") for n in names}

    assert family(dsl) <= family(ours)
    assert {"mbarrier.init", "mbarrier.arrive", "mbarrier.try_wait.parity"} <= family(dsl)
    assert set(mb.DSL_EQUIVALENTS) == {
        "mbarrier_init", "fence_mbarrier_init", "mbarrier_arrive", "mbarrier_arrive_expect_tx",
        "mbarrier_expect_tx", "mbarrier_complete_tx", "mbarrier_try_wait_parity", "mbarrier_wait_parity"}


@pytest.mark.parametrize("rounds", [1, 3, 4])
def test_phase_demo_ptx(rounds):
    c = mb.compile_phase_demo("sm_90a", rounds)
    assert len(ptx_lines(c, r"mbarrier\.try_wait\.parity")) == 2 * (1 + 3 * rounds)
    assert len(ptx_lines(c, r"mbarrier\.complete_tx")) == rounds
    assert len(ptx_lines(c, r"mbarrier\.arrive\.expect_tx")) == (rounds + 1) // 2
    assert len(ptx_lines(c, r"mbarrier\.expect_tx")) == rounds // 2
    assert ptx_lines(c, r"mbarrier\.init")[0].endswith(f", {mb.PHASE_DEMO_THREADS};")


def test_phase_demo_compiles_for_sm100():
    assert "mbarrier.complete_tx.relaxed.cta.shared::cta.b64" in mb.mbarrier_instructions(
        mb.compile_phase_demo("sm_100a", 1))


def test_bad_arguments():
    with pytest.raises(ValueError, match="target"):
        mb.compile_phase_demo("sm_80")
    with pytest.raises(ValueError, match="rounds"):
        mb.compile_phase_demo("sm_90a", 0)
    with pytest.raises(TypeError, match="rounds"):
        mb.run_phase_demo("3")
    with pytest.raises(ValueError, match="rounds"):
        mb.run_phase_demo(0)
    with pytest.raises(ValueError, match="target"):
        mb.compile_wrappers("sm_70")


@pytest.mark.skipif(detect_tier() != "cpu", reason="checks the CPU refusal")
def test_run_needs_a_gpu():
    with pytest.raises(TierError, match="run_phase_demo"):
        mb.run_phase_demo(3)


# ---------------------------------------------------------------- on the GPU


@pytest.mark.gpu
@pytest.mark.parametrize("rounds", [3, 4])
def test_phase_demo_on_gpu_matches_model(rounds):
    assert mb.run_phase_demo(rounds) == mb.model_pairs(mb.phase_demo_model(rounds))
