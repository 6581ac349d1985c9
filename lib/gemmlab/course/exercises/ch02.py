"""Chapter 02's exercises (mbarrier phases, the ring, PipelineState): checkers and worked solutions."""
from __future__ import annotations

from . import verdict


def check_parity_probe(answer) -> bool:
    """Predict, then run: a barrier of count 2 gets ``arrive()`` then ``arrive_expect_tx(64)``. What do
    ``try_wait.parity(0)`` and ``try_wait.parity(1)`` answer now?"""
    return verdict("parity after two arrivals", answer, solution_parity_probe(),
                   "Both arrivals are in, but 64 transaction bytes are still expected: has phase 0 completed? "
                   "try_wait.parity(p) is true iff p is not the current phase's parity. Answer (parity 0, parity 1).")


def solution_parity_probe():
    from ...mbarrier import Mbarrier

    bar = Mbarrier(2)
    bar.arrive()
    bar.arrive_expect_tx(64)  # pending 0, tx 64: phase 0 still open
    return (bar.try_wait_parity(0), bar.try_wait_parity(1))  # (False, True)


def check_state_after(answer) -> bool:
    """Predict: ``(index, phase)`` of ``PipelineState(stages=4)`` after 10 advances."""
    return verdict("PipelineState after 10 advances", answer, solution_state_after(),
                   "The index is the count modulo the stages; the phase flips at every wrap to 0, so it is the "
                   "parity of count // stages.")


def solution_state_after():
    from ...pipeline import PipelineState

    st = PipelineState(stages=4)
    for _ in range(10):
        st.advance()
    return (st.index, st.phase)  # 10 = 2 laps + 2: (2, 0)


def check_safe_resets(answer) -> bool:
    """Break it, then explain: with 3 stages, for which ``k_tiles`` in 1..12 does a ring whose states are reset per tile still run correctly?"""
    return verdict("harmless resets with 3 stages", answer, solution_safe_resets(),
                   "A reset is harmless only when each state is back at (0, start phase) at the end of a tile: the "
                   "index after a multiple of 3 items, the phase after an even number of laps. Answer a tuple, "
                   "smallest first; check with pipeline.simulate_ring(3, k, 3, reset_per_tile=True).ok.")


def solution_safe_resets():
    from ...pipeline import simulate_ring

    return tuple(k for k in range(1, 13) if simulate_ring(3, k, 3, reset_per_tile=True).ok)  # (6, 12)


def explain_safe_resets() -> str:
    """Why only k_tiles = 6 and 12 survive per-tile resets with 3 stages, and why tests with them miss the bug."""
    return ("A reset puts both states back at stage 0 with their starting phases. That is what carrying them "
            "would have given only if the ring has come back to the same place and the same phase: the index "
            "repeats after 3 items, the phase bit after 2 laps, so only after a multiple of 2 x 3 = 6 items: "
            "k_tiles = 6 and 12. For every other k_tiles the reset consumer waits for a parity the barrier "
            "has already passed (it reads a stage before it is refilled: a stale read) or one that never "
            "comes (a deadlock). A test suite whose shapes all have k_tiles a multiple of 2 x stages (for "
            "example K a multiple of 6 x 64 with 3 stages) runs the broken kernel correctly every time: the bug "
            "shows only on other K, which is why the course carries one state across every tile.")
