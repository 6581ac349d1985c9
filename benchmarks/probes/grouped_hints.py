"""Probe (run from the repository root with OUT set; needs the experiment flags of the commit that added it, with the
mixed order of 854111e re-applied): L2 eviction hints for the weights of single-M-tile experts (evict-first B),
and evict-last A, with and without the mixed order. Each variant checked against FP32 first."""
import json, os, sys, math
sys.path.insert(0, os.path.join(os.getcwd(), "lib")); sys.path.insert(0, os.path.join(os.getcwd(), "benchmarks"))
import torch
from gemmlab import bench, grouped
import grouped_gemm as gg

out_dir = os.environ.get("OUT", "/tmp")
VARIANTS = {"default": {}, "bfirst": {"_experiment": "bfirst"}, "bfirst_alast": {"_experiment": "bfirst_alast"},
            "mixed": {"mixed": 128}, "mixed_bfirst": {"mixed": 128, "_experiment": "bfirst"},
            "mixed_bfirst_alast": {"mixed": 128, "_experiment": "bfirst_alast"}}
rows = []
for row, sizes, a, b, offs in gg.moe_sets(gg.MOE_SHAPES, (32, 64, 128), (4096, 16384)):
    T, n, k, G = row["tokens"], row["n"], row["k"], row["groups"]
    cfg = grouped.default_config(T, G, n, k, a.device)
    out = torch.empty((T, n), device="cuda", dtype=a.dtype)
    ref = grouped.reference(a, b, offs)
    errs = {}
    for name, kw in VARIANTS.items():
        out.fill_(float("nan")); grouped.grouped_gemm(a, b, offs, out=out, validate=False, **kw)
        errs[name] = gg.rel_err(out, ref, T)
    del ref
    row["max_rel_err"] = max(errs.values())
    L = {name: [lambda kw=kw: grouped.grouped_gemm(a, b, offs, out=out, validate=False, **kw)] for name, kw in VARIANTS.items()}
    L["torch"] = [lambda: torch._grouped_mm(a, b, offs=offs)]
    t = bench.time_interleaved(L, rounds=5, per_round=5, warmup=2, gpu_only=True)
    row.update({"config": cfg.name, **{f"{k2}_ms": v["median_ms"] for k2, v in t.items()}})
    for v in VARIANTS:
        row[f"{v}_gain"] = row["default_ms"] / row[f"{v}_ms"]
    row["vs_torch"] = row["torch_ms"] / row["default_ms"]
    rows.append(row)
    print(f"{row['shape'][:14]:14s} G={G:3d} T={T:5d} err={row['max_rel_err']:.1e} def={row['default_ms']:.3f} "
          + " ".join(f"{v}={row[v + '_gain']:.3f}" for v in list(VARIANTS)[1:]) + f" vs_torch={row['vs_torch']:.3f}", flush=True)
    del a, b, out
g = lambda xs: math.exp(sum(map(math.log, xs)) / len(xs))
summ = {v: g([r[f"{v}_gain"] for r in rows]) for v in VARIANTS}
summ["vs_torch"] = g([r["vs_torch"] for r in rows])
summ["worst_err"] = max(r["max_rel_err"] for r in rows)
json.dump({"device": torch.cuda.get_device_name(), "rows": rows, "summary": summ}, open(f"{out_dir}/exp_h.json", "w"), indent=1)
print(summ)
