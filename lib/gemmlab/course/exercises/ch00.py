"""Chapter 00's exercises (the machines and the roofline): checkers and worked solutions."""
from __future__ import annotations

from . import verdict


def check_ridge_h200(answer) -> bool:
    """Predict: the H200's BF16 ridge point, in FLOP/byte, rounded to a whole number."""
    return verdict("H200 ridge point", answer, solution_ridge_h200(),
                   "The ridge is peak / bandwidth: dense BF16 TFLOP/s over HBM TB/s (both from hardware.spec_table()); "
                   "TFLOP/s over TB/s is FLOP/byte.")


def solution_ridge_h200():
    from ...hardware import H200, ridge_point

    return round(ridge_point(H200, "bf16"))  # 989 / 4.8 = 206


def check_decode_roof(answer) -> bool:
    """Predict, then run: the attainable TFLOP/s of a 16 x 4096 x 4096 BF16 GEMM on an H200, rounded."""
    return verdict("decode GEMM on an H200", answer, solution_decode_roof(),
                   "Intensity first: 2*M*N*K FLOP over the bytes of A, B and C read or written once (2 bytes each). "
                   "Below the ridge the roof is bandwidth x intensity (hardware.roofline).")


def solution_decode_roof():
    from ...hardware import H200, gemm_intensity, roofline

    # 2 * 16 * 4096^2 / (2 * (16*4096 + 4096^2 + 16*4096)) = 15.9 FLOP/byte, x 4.8 TB/s = 76 TFLOP/s.
    return round(roofline(H200, "bf16", gemm_intensity(16, 4096, 4096, 2)))


def check_compute_bound_m(answer) -> bool:
    """Predict: the smallest M in (64, 128, 256, 512, 1024) for which M x 4096 x 4096 BF16 is compute-bound on an H100."""
    return verdict("first compute-bound M", answer, solution_compute_bound_m(),
                   "Compare hardware.gemm_intensity(M, 4096, 4096, 2) with the H100's BF16 ridge (989 / 3.35 FLOP/byte); "
                   "for M much smaller than N = K the intensity grows about like M.")


def solution_compute_bound_m():
    from ...hardware import H100, gemm_intensity, ridge_point

    ridge = ridge_point(H100, "bf16")  # 295 FLOP/byte
    return next(m for m in (64, 128, 256, 512, 1024) if gemm_intensity(m, 4096, 4096, 2) >= ridge)  # 512 (410)


def explain_compute_bound_m() -> str:
    """Why a larger batch makes the same weights cheaper per token (the "why" half of exercise 3)."""
    return ("M x 4096 x 4096 BF16 does 2 M 4096^2 FLOPs and moves the 32 MiB of weights once, plus only "
            "2 x 4096 x 2 bytes per token (its activation row in, its output row out). For M much smaller than "
            "4096 the intensity is therefore about M FLOP/byte: 228 at M = 256, below the H100's ridge "
            "(989 / 3.35 = 295), and 410 at M = 512, above it. Below the ridge the time is the bytes over the "
            "bandwidth, and the bytes are almost all weights, read once whatever M is: eight requests batched "
            "into one GEMM take about the time of one, so each token pays an eighth of the weight traffic. "
            "That holds until the GEMM becomes compute-bound; from then on time grows with M.")
