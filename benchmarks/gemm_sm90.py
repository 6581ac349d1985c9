"""Benchmark chapter 07's persistent Hopper GEMM against torch.matmul (cuBLAS), BF16.

Usage (on an H100/H200): ``python benchmarks/gemm_sm90.py [--shapes M,N,K ...]``.
Writes ``results/<device>/gemm_sm90.json`` and prints the table last.
"""
import argparse

from gemmlab.bench import write_results
from gemmlab.gemm_sm90 import BENCH_SHAPES, METHOD, benchmark, benchmark_table, geomean


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--shapes", nargs="*", help="M,N,K triples (default: the chapter's ten shapes)")
    p.add_argument("--rounds", type=int, default=10, help="rounds of ours / cuBLAS, alternating")
    p.add_argument("--per-round", type=int, default=10, help="timed launches of each per round")
    args = p.parse_args()
    shapes = [tuple(int(x) for x in s.split(",")) for s in args.shapes] if args.shapes else BENCH_SHAPES
    rows = benchmark(shapes, rounds=args.rounds, per_round=args.per_round)
    path = write_results("gemm_sm90", rows, geomean_ratio=geomean(r["ratio"] for r in rows),
                         method=METHOD)
    print(f"wrote {path}")
    print(benchmark_table(rows))


if __name__ == "__main__":
    main()
