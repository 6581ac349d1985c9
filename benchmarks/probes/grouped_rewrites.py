"""Probe (run from the repository root with OUT set; needs the experiment flags of the commit that added it):
what the descriptor rewrites cost. Timing-only variants, their outputs not checked: ``skip_c`` never rewrites the C
descriptor after the first group (stores land in the wrong rows), ``fences=False`` publishes without fences."""
import json, os, sys, math
sys.path.insert(0, os.path.join(os.getcwd(), "lib")); sys.path.insert(0, os.path.join(os.getcwd(), "benchmarks"))
import torch
from gemmlab import bench, grouped
import grouped_gemm as gg

out_dir = os.environ.get("OUT", "/tmp")
rows = []
for row, sizes, a, b, offs in gg.moe_sets(gg.MOE_SHAPES, (8, 32, 64, 128), (4096, 16384)):
    T, n, k, G = row["tokens"], row["n"], row["k"], row["groups"]
    cfg = grouped.default_config(T, G, n, k, a.device)
    out = torch.empty((T, n), device="cuda", dtype=a.dtype)
    ref = grouped.reference(a, b, offs)
    out.fill_(float("nan")); grouped.grouped_gemm(a, b, offs, out=out, validate=False)
    row["rel_err"] = gg.rel_err(out, ref, T); del ref
    L = {"default": [lambda: grouped.grouped_gemm(a, b, offs, out=out, validate=False)],
         "nofence": [lambda: grouped.grouped_gemm(a, b, offs, out=out, validate=False, fences=False)],
         "skip_c": [lambda: grouped.grouped_gemm(a, b, offs, out=out, validate=False, _experiment="skip_c")],
         "torch": [lambda: torch._grouped_mm(a, b, offs=offs)]}
    t = bench.time_interleaved(L, rounds=5, per_round=5, warmup=2, gpu_only=True)
    row.update({"config": cfg.name, **{f"{k2}_ms": v["median_ms"] for k2, v in t.items()}})
    for v in ("nofence", "skip_c"):
        row[f"{v}_gain"] = row["default_ms"] / row[f"{v}_ms"]
    row["vs_torch"] = row["torch_ms"] / row["default_ms"]
    rows.append(row)
    print(f"{row['shape']:20s} G={G:3d} T={T:5d} {cfg.name:18s} err={row['rel_err']:.1e} def={row['default_ms']:.3f} "
          f"nofence={row['nofence_gain']:.3f} skip_c={row['skip_c_gain']:.3f} vs_torch={row['vs_torch']:.3f}", flush=True)
    del a, b, out
g = lambda xs: math.exp(sum(map(math.log, xs)) / len(xs))
summ = {v: g([r[f"{v}_gain"] for r in rows]) for v in ("nofence", "skip_c")}
summ["vs_torch"] = g([r["vs_torch"] for r in rows])
json.dump({"device": torch.cuda.get_device_name(), "rows": rows, "summary": summ}, open(f"{out_dir}/exp_c.json", "w"), indent=1)
print(summ)
