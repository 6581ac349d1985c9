"""Benchmark chapter 07's persistent Hopper GEMM against torch.matmul (cuBLAS), BF16.

Usage (on an H100/H200): ``python benchmarks/gemm_sm90.py [--shapes M,N,K ...]``.
Writes ``results/<device>/gemm_sm90.json`` and prints the table last.
"""
import argparse

from gemmlab.bench import write_results
from gemmlab.gemm_sm90 import BENCH_SHAPES, benchmark, benchmark_table, geomean


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--shapes", nargs="*", help="M,N,K triples (default: the chapter's ten shapes)")
    p.add_argument("--rep", type=int, default=50)
    args = p.parse_args()
    shapes = [tuple(int(x) for x in s.split(",")) for s in args.shapes] if args.shapes else BENCH_SHAPES
    rows = benchmark(shapes, rep=args.rep)
    path = write_results("gemm_sm90", rows, geomean_ratio=geomean(r["ratio"] for r in rows),
                         method="CUDA-event median, warm, inputs rotated when a set fits in L2")
    print(f"wrote {path}")
    print(benchmark_table(rows))


if __name__ == "__main__":
    main()
