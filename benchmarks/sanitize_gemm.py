"""Run chapter 07's GEMM on small, partial-tile shapes: the program compute-sanitizer checks.

    compute-sanitizer --tool memcheck  --report-api-errors no python benchmarks/sanitize_gemm.py
    compute-sanitizer --tool racecheck python benchmarks/sanitize_gemm.py

(`make sanitize` runs both and writes the summaries to results/<device>/gemm_sm90_sanitizer.txt.)
Two configurations: 2x1 cluster with B multicast, and 1x2 with A multicast and a narrow epilogue;
M, N, K are not multiples of any tile, so TMA's zero fill and clipped stores are exercised.
Without ``--report-api-errors no`` memcheck also lists host-side cuGetProcAddress probes made
by the libraries at start-up, which are not kernel errors.
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))

import torch  # noqa: E402

from gemmlab.gemm_api import sm90_launch  # noqa: E402
from gemmlab.gemm_sm90 import GemmConfig  # noqa: E402


def main() -> int:
    torch.manual_seed(0)
    m, n, k = 300, 400, 264
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, k, device="cuda", dtype=torch.bfloat16).t()  # K x N view of an N x K weight
    ref = a.float() @ b.float()
    worst = 0.0
    for cfg in (GemmConfig(tile_n=256, stages=4, cluster=(2, 1)),
                GemmConfig(tile_n=144, stages=6, cluster=(1, 2), epi_n=16)):
        out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)  # poisoned
        sm90_launch(a, b, out, cfg)()
        torch.cuda.synchronize()
        err = ((out.float() - ref).norm() / ref.norm()).item()
        worst = max(worst, err)
        print(f"{m}x{n}x{k} tile_n={cfg.tile_n} cluster={cfg.cluster}: rel. Frobenius error {err:.2e}")
    return 0 if worst <= 1e-2 else 1


if __name__ == "__main__":
    sys.exit(main())
