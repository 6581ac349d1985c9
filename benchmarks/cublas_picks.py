"""Which kernel cuBLAS runs for ``torch.matmul`` on given shapes (name, grid, block, time), beside the config
``gemmlab.gemm`` chooses: the first step of profiling a shape where the family loses (issue 28).

    PYTHONPATH=lib python benchmarks/cublas_picks.py [--out DIR] [--worst N]

Shapes: the N weakest rows of this device's ``results/<device>/gemm_family_wide.json`` (public ratio), else
issue 28's examples. cuBLAS's kernel names carry its tile (``tilesize``), cluster and scheduling (e.g.
``stream-K``/``segment_k``); torch.profiler's trace carries each launch's grid and block. Writes
``results/<device>/cublas_picks.json``.
"""
import argparse
import json
import os
import tempfile
from pathlib import Path

import torch

from gemmlab.family import api
from gemmlab.measure import bench
from gemmlab.measure.gemm_family import weakest_wide

FALLBACK = [(384, 29568, 8192), (384, 8192, 8192), (384, 3584, 18944), (640, 4096, 14336)]


def shapes(worst: int):
    return weakest_wide(torch.cuda.get_device_name(), worst) or FALLBACK


def kernels_of(fn, reps=5):
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as tmp:
        trace = os.path.join(tmp, "t.json")
        prof.export_chrome_trace(trace)
        events = json.loads(Path(trace).read_text())["traceEvents"]
    out = {}
    for e in events:
        if e.get("cat") != "kernel":
            continue
        k = out.setdefault(e["name"], {"name": e["name"], "grid": e.get("args", {}).get("grid"),
                                       "block": e.get("args", {}).get("block"), "us": []})
        k["us"].append(e["dur"])
    for k in out.values():
        k["launches"] = len(k["us"])
        k["us"] = sorted(k["us"])[len(k["us"]) // 2]
    return list(out.values())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=None)
    ap.add_argument("--worst", type=int, default=12)
    args = ap.parse_args()
    rows = []
    for m, n, k in shapes(args.worst):
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(n, k, device="cuda", dtype=torch.bfloat16).t()
        c = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        api.gemm(a, b, c)
        plan = next(p for p in api.plans() if (p.problem.m, p.problem.n, p.problem.k) == (m, n, k))
        rows.append({"m": m, "n": n, "k": k, "ours": plan.config.name,
                     "ours_kernels": kernels_of(lambda: api.gemm(a, b, c)),
                     "cublas": kernels_of(lambda: torch.matmul(a, b, out=c))})
    path = bench.write_results("cublas_picks", rows, out_dir=args.out,
                               method="torch.profiler (CUDA activity) over 5 calls each, median kernel duration; "
                                      "grid/block from the exported trace")
    print(f"wrote {path}")
    for r in rows:
        cub = "; ".join(f"{k['name'][:110]} grid {k['grid']} {k['us']:.0f} us" for k in r["cublas"])
        ours = "; ".join(f"grid {k['grid']} {k['us']:.0f} us" for k in r["ours_kernels"])
        print(f"{r['m']}x{r['n']}x{r['k']}: ours {r['ours']} {ours}\n    cuBLAS {cub}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
