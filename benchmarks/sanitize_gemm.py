"""Run chapter 07's GEMM variants on small, partial-tile shapes: the program compute-sanitizer checks.

    compute-sanitizer --tool memcheck  --report-api-errors no python benchmarks/sanitize_gemm.py
    compute-sanitizer --tool racecheck python benchmarks/sanitize_gemm.py

(`make sanitize` runs both and writes the summaries to results/<device>/gemm_sm90_sanitizer.txt.)
Every kernel variant the heuristic can pick: 2x1 cluster with B multicast, 1x2 with A multicast and a
narrow epilogue, a 64-row tile, 192-row tiles (three consumer warpgroups), swap A/B (M-major output through
stmatrix.trans; a batch of several token tiles, paired along either side), split-K (each unit's FP32 partial
tile in the workspace, the tile counters, the last unit's reduction inside the same launch), swap with
split-K, a 128-row tile held by one consumer warpgroup, two such warpgroups taking tiles in turn
(ping-pong), and clusters of 4 and 8 CTAs multicasting along both sides. Each split-K and ping-pong variant also runs on a persistent grid of
a few SMs (:data:`HYBRID_SMS`), where the tiles outnumber the clusters: for split-K whole tiles in whole waves,
then only the tail split, its workspace and counters sized for the tail; for ping-pong several tiles a CTA, so
both warpgroups take turns; a split-K plan also launches twice, the second time on the workspace and counters the
first left. ``--only TEXT`` (repeatable) runs the configs whose name contains any TEXT. M, N, K
are not multiples of any tile, so TMA's
zero fill and clipped stores are exercised. Without
``--report-api-errors no`` memcheck also lists host-side cuGetProcAddress probes made by the
libraries at start-up, which are not kernel errors.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))

import torch  # noqa: E402

from gemmlab.family.configs import Sm90Config  # noqa: E402
from gemmlab.family.plan import Plan, prepare  # noqa: E402
from gemmlab.family.problem import canonical_operands, problem_of  # noqa: E402

CONFIGS = (
    Sm90Config(tile_n=256, stages=4, cluster=(2, 1)),
    Sm90Config(tile_n=144, stages=6, cluster=(1, 2), epi_n=16),
    Sm90Config(tile_m=64, tile_n=128, stages=8, cluster=(2, 1)),
    Sm90Config(tile_m=64, tile_n=64, stages=8, cluster=(1, 1), swap_ab=True),
    Sm90Config(tile_n=128, stages=6, cluster=(2, 1), splits=3),
    Sm90Config(tile_m=128, tile_n=64, stages=8, cluster=(1, 1), swap_ab=True, splits=4),
    # three consumer warpgroups (192-row tiles): paired along M and along N, and with split-K
    Sm90Config(tile_m=192, tile_n=192, stages=4, cluster=(2, 1), epi_stages=2),
    Sm90Config(tile_m=192, tile_n=112, stages=5, cluster=(1, 2), epi_n=16, epi_stages=2),
    Sm90Config(tile_m=192, tile_n=128, stages=5, cluster=(1, 1), epi_stages=2, splits=3),
    # a swapped batch cut into several token tiles, paired along them (weight multicast) and along the weight
    Sm90Config(tile_m=128, tile_n=96, stages=6, cluster=(1, 2), swap_ab=True),
    Sm90Config(tile_m=128, tile_n=160, stages=5, cluster=(2, 1), swap_ab=True, splits=2),
    # one consumer warpgroup holding a 128-row tile (two accumulators, two slabs stored in turn): swapped and paired
    # along the token tiles, paired along M, and with split-K
    Sm90Config(tile_n=128, stages=6, cluster=(1, 2), swap_ab=True, wg_rows=128),
    Sm90Config(tile_n=192, stages=5, cluster=(2, 1), wg_rows=128),
    Sm90Config(tile_n=144, stages=6, cluster=(2, 1), epi_n=16, wg_rows=128, splits=3),
    # ping-pong: two warpgroups taking whole 128-row tiles in turn (also on a few SMs, so each CTA runs several)
    Sm90Config(tile_n=192, stages=4, cluster=(2, 1), wg_rows=128, pingpong=True),
    Sm90Config(tile_n=128, stages=6, cluster=(1, 2), swap_ab=True, wg_rows=128, pingpong=True),
    Sm90Config(tile_n=144, stages=5, cluster=(1, 1), epi_n=16, wg_rows=128, pingpong=True),
    # token tiles a multiple of 8 wide (sub-tiles of 40 and 8 columns: two-matrix stmatrix), with split-K, paired
    # along the token tiles, in one warpgroup; 192-row weight tiles swapped (three consumer warpgroups)
    Sm90Config(tile_m=128, tile_n=200, stages=4, cluster=(1, 1), swap_ab=True, epi_n=40, splits=3),
    Sm90Config(tile_m=128, tile_n=104, stages=7, cluster=(1, 2), swap_ab=True, epi_n=8),
    Sm90Config(tile_m=128, tile_n=104, stages=7, cluster=(1, 2), swap_ab=True, epi_n=8, wg_rows=128),
    Sm90Config(tile_m=192, tile_n=104, stages=5, cluster=(1, 2), swap_ab=True, epi_n=8, epi_stages=2),
    Sm90Config(tile_m=192, tile_n=168, stages=4, cluster=(1, 1), swap_ab=True, epi_n=56, epi_stages=2, splits=2),
    # clusters of 4 and 8 CTAs: each CTA multicasts its part of an A' panel along its cluster column and of a B'
    # panel along its row (with split-K, swapped, a line of 4)
    Sm90Config(tile_n=128, stages=6, cluster=(2, 2)),
    Sm90Config(tile_n=144, stages=6, cluster=(2, 2), epi_n=16, splits=4),
    Sm90Config(tile_m=64, tile_n=64, stages=8, cluster=(4, 2)),
    Sm90Config(tile_m=128, tile_n=96, stages=6, cluster=(2, 4), swap_ab=True),
    Sm90Config(tile_m=64, tile_n=64, stages=8, cluster=(1, 4), swap_ab=True, splits=3),
    Sm90Config(tile_m=64, tile_n=64, stages=8, cluster=(4, 1)),
    # the H200's split picks since a 64-row tile's split launch was repriced (2026-12-02): 64-row tiles in two slices,
    # swapped and paired along the token tiles, unswapped and paired along M, swapped alone
    Sm90Config(tile_m=64, tile_n=128, stages=8, cluster=(1, 2), swap_ab=True, splits=2),
    Sm90Config(tile_m=64, tile_n=144, stages=8, cluster=(2, 1), epi_n=16, splits=2),
    Sm90Config(tile_m=64, tile_n=96, stages=8, cluster=(1, 1), swap_ab=True, splits=2),
)


#: The SMs of the small persistent grids the split-K variants also run on: 2 to 6 clusters, fewer than the tiles.
HYBRID_SMS = 6


def main(argv=None) -> int:
    args = argparse.ArgumentParser(description=__doc__)
    args.add_argument("--only", action="append", default=[],
                      help="run only the configs whose name contains this (e.g. 'pp'); repeat it for several")
    args = args.parse_args(argv)
    torch.manual_seed(0)
    worst = 0.0
    for m, n, k in ((300, 400, 264), (72, 296, 520)):
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(n, k, device="cuda", dtype=torch.bfloat16).t()  # K x N view of an N x K weight
        ref = a.float() @ b.float()
        for cfg in (c for c in CONFIGS if not args.only or any(o in c.name for o in args.only)):
            for sms in (None, HYBRID_SMS) if cfg.split_k or cfg.pingpong else (None,):
                out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)  # poisoned
                if sms is None:
                    run = prepare(a, b, out, cfg)
                    run()
                    if cfg.split_k:
                        run()  # the plan's workspace and counters again: a second launch reuses them
                    grid = ""
                else:  # a plan for a GPU of a few SMs: the same kernel on a hybrid grid
                    problem = problem_of(a, b, out)
                    plan = Plan(problem, cfg, "sm90", sms)
                    plan(*canonical_operands(a, b, out, problem.b_major))
                    grid = f" on {sms} SMs ({plan.launch.dp_tiles} tiles whole)" if cfg.split_k else f" on {sms} SMs"
                torch.cuda.synchronize()
                err = ((out.float() - ref).norm() / ref.norm()).item()
                worst = max(worst, err)
                print(f"{m}x{n}x{k} {cfg.name}{grid}: rel. Frobenius error {err:.2e}")
    return 0 if worst <= 1e-2 else 1


if __name__ == "__main__":
    sys.exit(main())
