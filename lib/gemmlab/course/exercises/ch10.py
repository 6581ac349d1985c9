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


def explain_late_arrival_barrier() -> str:
    """Who arrives late without the producer tails, why C is still right, and what holds the leader back."""
    return ("The late arrivals land on the leader's tmem_empty: the peer CTA's epilogue warps tell the leader's "
            "MMA warp that they have drained an accumulator stage. Without the MMA warp's tail (one more wait "
            "on every tmem_empty stage) the leader's roles can all finish while the peer is still reading its "
            "last accumulator, so the peer's arrival reaches a CTA that may already be freeing its tensor "
            "memory or exiting. C is still right in the model because the arrival only reports that a stage "
            "is free; nothing is read after it, and every tile was already computed and stored. The tail of the "
            "MMA warp (on tmem_empty) prevents it; the TMA warp's tail on ab_empty guards the other direction, "
            "the MMA's commits landing in each CTA. In the teardown the final cluster barrier, which both CTAs "
            "must reach before the dealloc, would also hold the leader until the peer has finished.")


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


def explain_held_clock_effect() -> str:
    """Why the prediction grows a little less than the ratio of the clocks."""
    return ("The ratio of the clocks is 1.83 / 1.51 = 1.212; the prediction grows by 1.21. 8192^3 is compute "
            "bound, and in the calibrated model the tensor-core work, the consumers' per-k-block round trip and "
            "the epilogue's sub-tiles are counted in SM cycles, which take 1 / clock. A few terms are counted in "
            "seconds and do not shrink with the clock: the launch (calibration.CALIBRATION.launch_s), the "
            "latency of a TMA load in flight (load_latency_s) and HBM's bandwidth. They are a small part of a "
            "millisecond-long kernel, so the speed-up is a little less than the clock ratio.")
