"""Chapter 07's feature ladder on this GPU: what each feature of the persistent kernel buys.

    python benchmarks/gemm_ladder.py                         # both shapes, every rung
    python benchmarks/gemm_ladder.py --shapes 8192x8192x8192 --rungs ch06,persistent,cluster
    python benchmarks/gemm_ladder.py --out DIR               # write DIR/gemm_ladder.json instead

The rungs are :data:`gemmlab.measure.gemm_ladder.RUNGS`: chapter 06's kernel, chapter 07's kernel with one
knob changed per rung up to its default configuration, variations of that top rung, and the configuration
``gemmlab.gemm`` picks. On every shape of :data:`~gemmlab.measure.gemm_ladder.LADDER_SHAPES` each rung is first
checked (poisoned output against an FP32 product, relative Frobenius error at most 1e-2) and then timed
against cuBLAS (``torch.matmul``) in the same interleaved run, kernels alone (``gemmlab.measure.bench.time_interleaved``
with ``gpu_only=True``: :data:`gemmlab.measure.gemm_ladder.METHOD`, as chapter 07's kernel ratio is measured). A rung that fails
to compile, to run or to compute the right answer is recorded as a failed row with its error, and the run
goes on. Results go to ``results/<device>/gemm_ladder.json``; the table comes last. Exit status 1 if a rung
failed, 2 on a machine that is not a Hopper GPU.
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time
import traceback

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))

from gemmlab.measure import gemm_ladder as ladder  # noqa: E402

NAME = "gemm_ladder"


def parse_shapes(text: str) -> list[tuple[int, int, int]]:
    """``"8192x8192x8192,4096x7168x2048"`` -> ``[(8192, 8192, 8192), (4096, 7168, 2048)]``."""
    shapes = []
    for part in text.split(","):
        dims = part.strip().lower().split("x")
        if len(dims) != 3 or not all(d.isdigit() and int(d) > 0 for d in dims):
            raise argparse.ArgumentTypeError(f"--shapes: each shape is MxNxK with positive integers; got {part!r}")
        shapes.append(tuple(int(d) for d in dims))
    return shapes


def parse_rungs(text: str) -> list:
    keys = [k.strip() for k in text.split(",") if k.strip()]
    known = {r.key: r for r in ladder.RUNGS}
    bad = [k for k in keys if k not in known]
    if bad or not keys:
        raise argparse.ArgumentTypeError(f"--rungs: names from {', '.join(known)}; got {text!r}")
    return [known[k] for k in keys]


def _operands(m, n, k, sets, seed=0):
    """``sets`` input sets (a: M x K, w: N x K, both K-major like nn.Linear; c: M x N), BF16."""
    import torch

    g = torch.Generator(device="cuda").manual_seed(seed)
    return [(torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=g),
             torch.randn(n, k, device="cuda", dtype=torch.bfloat16, generator=g),
             torch.empty(m, n, device="cuda", dtype=torch.bfloat16)) for _ in range(sets)]


def _launches(rung, data):
    """One zero-argument launch per input set, and the configuration's name as run."""
    if rung.kernel == "ch06":
        from gemmlab.wgmma import prepare_gemm_nt

        tm, tn, st = rung.tile
        return [prepare_gemm_nt(a, w, c, tile_m=tm, tile_n=tn, stages=st) for a, w, c in data], rung.config_name
    from gemmlab.family.plan import prepare

    runs = [prepare(a, w.t(), c, rung.config) for a, w, c in data]  # c = a @ w.t(): the weight's K x N view
    return runs, ladder.config_label(runs[0].plan.config)


def time_rung(rung, shape, data, ref, *, rounds, per_round) -> dict:
    """Check one rung on poisoned output, then time it against cuBLAS in one interleaved run."""
    import torch

    from gemmlab.measure.bench import gpu_clocks, time_interleaved

    m, n, k = shape
    row = {"rung": rung.key, "m": m, "n": n, "k": k, "ok": False}
    runs, row["config"] = _launches(rung, data)
    a0, w0, c0 = data[0]
    c0.fill_(float("nan"))
    runs[0]()
    torch.cuda.synchronize()
    if c0.isnan().any():
        raise AssertionError("unwritten outputs: the poisoned NaNs are still there")
    row["rel_err"] = ((c0.float() - ref).norm() / ref.norm()).item()
    if not row["rel_err"] <= ladder.MAX_REL_ERR:
        raise AssertionError(f"relative error {row['rel_err']:.2e} > {ladder.MAX_REL_ERR}")
    cublas = [functools.partial(torch.matmul, a, w.t(), out=c) for a, w, c in data]
    t = time_interleaved({"ours": runs, "cublas": cublas}, rounds=rounds, per_round=per_round, gpu_only=True)
    flop = 2 * m * n * k
    us, cublas_us = t["ours"]["median_ms"] * 1e3, t["cublas"]["median_ms"] * 1e3
    row.update(ok=True, us=us, tflops=flop / us / 1e6, cublas_us=cublas_us, cublas_tflops=flop / cublas_us / 1e6,
               round_us=[x * 1e3 for x in t["ours"]["round_ms"]],
               cublas_round_us=[x * 1e3 for x in t["cublas"]["round_ms"]], gpu=gpu_clocks())
    return row


def measure(shapes, rungs, *, rounds=10, per_round=10, progress=print) -> list[dict]:
    """Every rung on every shape; a failure is a row with ``ok: False`` and its error."""
    import torch

    from gemmlab.measure.bench import input_sets

    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    rows = []
    for shape in shapes:
        m, n, k = shape
        sets = input_sets(2 * (m * k + n * k + m * n), l2)
        data = _operands(m, n, k, sets)
        ref = data[0][0].float() @ data[0][1].float().t()  # FP32 product, TF32 off (set in main)
        for rung in rungs:
            t0 = time.time()
            try:
                row = time_rung(rung, shape, data, ref, rounds=rounds, per_round=per_round)
            except Exception as e:  # one broken rung must not hide the others
                traceback.print_exc()
                row = {"rung": rung.key, "m": m, "n": n, "k": k, "ok": False, "config": rung.config_name,
                       "error": f"{type(e).__name__}: {str(e)[:300]}"}
            row["seconds"] = time.time() - t0
            rows.append(row)
            if progress:
                what = (f"{row['tflops']:7.1f} TFLOP/s ({row['us']:9.1f} us), cuBLAS {row['cublas_tflops']:7.1f}, "
                        f"err {row['rel_err']:.1e}" if row["ok"] else f"FAILED {row['error']}")
                progress(f"{m}x{n}x{k} {rung.key:<14} {row['config']:<32} {what}")
        del data, ref
        torch.cuda.empty_cache()
    return rows


def write(rows, rungs, shapes, out_dir, *, rounds, per_round) -> str:
    import torch

    from gemmlab.measure import bench

    meta = {"method": ladder.METHOD,
            "rungs": [r.meta() for r in rungs], "shapes": [list(s) for s in shapes],
            "max_rel_err": ladder.MAX_REL_ERR, "rounds": rounds, "per_round": per_round}
    if out_dir:
        os.makedirs(out_dir, exist_ok=True)
        path = os.path.join(out_dir, f"{NAME}.json")
        with open(path, "w") as f:
            json.dump({"benchmark": NAME, "device": bench.device_name(), "torch": torch.__version__,
                       "cuda": torch.version.cuda, "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), **meta,
                       "rows": rows}, f, indent=1)
        return path
    return str(bench.write_results(NAME, rows, **meta))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", type=parse_shapes, default=list(ladder.LADDER_SHAPES),
                   help="comma-separated MxNxK (default: %(default)s)")
    p.add_argument("--rungs", type=parse_rungs, default=list(ladder.RUNGS),
                   help="comma-separated rung names (default: all): " + ", ".join(r.key for r in ladder.RUNGS))
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--per-round", type=int, default=10)
    p.add_argument("--out", default=None, help="write JSON here instead of results/<device>/")
    args = p.parse_args(argv)
    if args.rounds < 1 or args.per_round < 1:
        p.error(f"--rounds and --per-round must be at least 1; got {args.rounds} and {args.per_round}")

    from gemmlab.tiers import detect_tier

    tier = detect_tier()
    if tier != "sm90":
        print(f"gemm_ladder needs a Hopper GPU (tier sm90: H100 / H200); this machine is tier {tier}")
        return 2
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False  # the FP32 reference in FP32
    t0 = time.time()
    rows = measure(args.shapes, args.rungs, rounds=args.rounds, per_round=args.per_round)
    path = write(rows, args.rungs, args.shapes, args.out, rounds=args.rounds, per_round=args.per_round)
    with open(path) as f:
        doc = json.load(f)
    print(f"written {path} in {time.time() - t0:.0f} s\n")
    print(ladder.ladder_table(doc))
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
