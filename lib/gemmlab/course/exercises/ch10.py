"""Chapter 10's exercises (the persistent 2-CTA GEMM, its CPU model, the prediction): checkers and solutions."""
from __future__ import annotations

from . import verdict


def check_tx_bytes(answer) -> bool:
    """Predict: the bytes the leader's ``ab_full`` barrier waits for per stage with ``block_n`` = 128 (BF16)."""
    return verdict("expect_tx bytes", answer, solution_tx_bytes(),
                   "Each CTA loads 128 rows of A and block_n / 2 rows of B, 64 elements of K each, 2 bytes an "
                   "element; the 2-CTA TMA of *both* CTAs completes on the leader's barrier.")


def solution_tx_bytes():
    from ...family.configs import Sm100Config

    return Sm100Config(block_n=128, ab_stages=8).tx_bytes  # 2 x (128 + 64) x 64 x 2 = 49152


def check_late_arrival_barrier(answer) -> bool:
    """Break it, then explain: with ``bug="no_tail"``, which barrier receives the late arrivals
    (``"ab_full"``, ``"ab_empty"``, ``"tmem_full"`` or ``"tmem_empty"``)?"""
    return verdict("late arrivals without tails", answer, solution_late_arrival_barrier(),
                   "Run sm100_model.run_model(a, b, cfg, seed=s, bug='no_tail') for a few seeds and read .late: "
                   "who signals the leader after the leader's own roles are done?")


def solution_late_arrival_barrier():
    from ...sm100_model import integer_operands, run_model, small_config

    a, b = integer_operands(300, 520, 320)
    late = [w for s in range(12) for w in run_model(a, b, small_config(), seed=s, bug="no_tail").late]
    names = {name for name in ("ab_full", "ab_empty", "tmem_full", "tmem_empty") for w in late if name + "[" in w}
    return names.pop() if len(names) == 1 else sorted(names)  # "tmem_empty": the peer's epilogue warps


def check_held_clock_effect(answer) -> bool:
    """Predict, then run: by what factor (two decimals) does the calibrated 8192^3 prediction on the H200
    change if the GPU held its datasheet clock (1.83 GHz) instead of the fitted 1.51 GHz?"""
    return verdict("held clock", answer, solution_held_clock_effect(),
                   "8192^3 is compute bound: time scales with 1 / clock, except for the fixed costs. Use "
                   "calibration.predict_sm90 with calibration.with_clock(CALIBRATION, 'nvidia-h200', 1.83).")


def solution_held_clock_effect():
    from ...measure.calibration import CALIBRATION, predict_sm90, with_clock

    base = predict_sm90((8192, 8192, 8192), "128x256 c2x1 m8 s4", "nvidia-h200")
    fast = predict_sm90((8192, 8192, 8192), "128x256 c2x1 m8 s4", "nvidia-h200",
                        with_clock(CALIBRATION, "nvidia-h200", 1.83))
    return round(fast / base, 2)
