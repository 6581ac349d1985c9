"""The NVFP4 gated dual GEMM (chapter 11) on this GPU: correctness, and the benchmark against both baselines.

    python benchmarks/dual_gemm.py check    # public call vs the FP32 reference on the test and benchmark shapes
    python benchmarks/dual_gemm.py bench    # the four GPU MODE shapes: gemmlab vs baselines (a) and (b)
    python benchmarks/dual_gemm.py all
    python benchmarks/dual_gemm.py probe    # where the fast twin's time goes: its variants, kernels alone
    python benchmarks/dual_gemm.py bf16     # against the BF16 path a Hopper user would otherwise take (10 shapes)
    python benchmarks/dual_gemm.py decode   # every decode-twin configuration beside the fast twin, M <= 128
    python benchmarks/dual_gemm.py a16      # every A16-twin width beside the fast twin and the BF16 path, M >= 200
    python benchmarks/dual_gemm.py w16      # the A16 twin beside the W16 route and the BF16 path, M = 512 to 4096
    python benchmarks/dual_gemm.py w16_narrow  # the same on narrower weights (N = 1024 to 2048)
    python benchmarks/dual_gemm.py w16_parts   # the W16 route's two passes and the rest, kernels alone

``check``: every output poisoned with NaN first, rtol = atol = 1e-3 (``gemmlab.nvfp4.check_close``); baseline
(b) is held to the same check. ``bench``: the public call (Python included), its prepared launch, (a) the
reference pipeline (dequantize everything on every call, FP32 matmuls) and (b) the stock path (BF16 weights
made once as one (2N, K) matrix, then per call A to BF16, one cuBLAS BF16 GEMM, silu and mul), timed side by
side with ``gemmlab.measure.bench.time_interleaved`` on input sets rotated over 4x the L2; then the prepared launch, (b)
and chapter 11's simple twin (the first draft of the Hopper kernel) again with the queue primed (kernels
alone). Each shape is tried alone: a failure becomes a row with its error and the run goes on.

Results go to ``results/<device>/dual_gemm*.json`` (``--out DIR`` writes there instead); the table comes last.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
import traceback

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))

import torch  # noqa: E402

import gemmlab  # noqa: E402
from gemmlab.measure import bench  # noqa: E402
from gemmlab import hardware  # noqa: E402
from gemmlab.measure import dual_gemm as dg  # noqa: E402
from gemmlab.measure import dual_gemm_tables as tables  # noqa: E402
from gemmlab import nvfp4 as fp4  # noqa: E402


# --------------------------------------------------------------------------------------
# check
# --------------------------------------------------------------------------------------


def check(out_dir=None, shapes=None):
    shapes = list(shapes or (list(fp4.TEST_SHAPES) + list(fp4.BENCHMARK_SHAPES)))
    rows = []
    for i, (m, n, k) in enumerate(shapes):
        row = {"m": m, "n": n, "k": k}
        try:
            ops = fp4.generate(m, n, k, seed=100 + i, device="cuda")
            ref = fp4.reference(*ops.inputs())
            assert torch.isnan(ops.c.float()).all()  # poisoned: an element never written fails the check
            gemmlab.gated_dual_gemm(*ops.inputs(), out=ops.c)
            torch.cuda.synchronize()
            res = fp4.check_close(ops.c, ref)
            row.update(ok=res.ok, max_abs_err=res.max_abs_err, bad=res.bad, total=res.total)
            out_b = torch.full_like(ops.c, float("nan"))
            dg.stock_path(ops.a, ops.sfa, dg.prepare_stock(ops.b1, ops.b2, ops.sfb1, ops.sfb2), out=out_b)
            res_b = fp4.check_close(out_b, ref)
            row.update(stock_ok=res_b.ok, stock_max_abs_err=res_b.max_abs_err)
        except Exception:  # noqa: BLE001 - one failed shape is one failed row
            row["error"] = traceback.format_exc()[-1500:]
            row["ok"] = False
        rows.append(row)
        print(f"{m:>5} x {n:>5} x {k:>5}: ok={row['ok']} max|err|={row.get('max_abs_err')} bad={row.get('bad')} "
              f"stock ok={row.get('stock_ok')}" + ("" if "error" not in row else "\n" + row["error"]), flush=True)
        torch.cuda.empty_cache()
    passed = sum(bool(r["ok"]) for r in rows)
    _write("dual_gemm_check", {"rows": rows, "passed": passed, "total": len(rows), "rtol": fp4.RTOL,
                               "atol": fp4.ATOL}, out_dir)
    print(f"check: {passed} / {len(rows)} passed")
    return passed == len(rows)


# --------------------------------------------------------------------------------------
# bench
# --------------------------------------------------------------------------------------


def bench_shapes(out_dir=None, shapes=fp4.BENCHMARK_SHAPES, rounds=10, per_round=5, simple=True):
    spec = hardware.device_spec(torch.cuda.current_device()) or hardware.H100
    rows = []
    for i, (m, n, k) in enumerate(shapes):
        try:
            row = dg.time_case(m, n, k, rounds=rounds, per_round=per_round, seed=200 + i, simple=simple)
            print(f"{m} x {n} x {k}: ok={row['ok']} gemmlab {row['gemmlab_us']:.1f} us, prepared "
                  f"{row['prepared_us']:.1f}, (a) {row['reference_a_us']:.1f}, (b) {row['stock_b_us']:.1f}; "
                  f"kernels: ours {row['prepared_kernel_us']:.1f}, (b) {row['stock_b_kernels_us']:.1f}; "
                  f"x{row['vs_b']:.2f} vs (b), x{row['vs_a']:.1f} vs (a)", flush=True)
        except Exception:  # noqa: BLE001 - one failed shape is one failed row
            row = {"m": m, "n": n, "k": k, "ok": False, "error": traceback.format_exc()[-1500:]}
            print(f"{m} x {n} x {k}: FAILED\n{row['error']}", flush=True)
        rows.append(row)
        torch.cuda.empty_cache()
    summary = tables.summarize(rows)
    doc = {"rows": rows, "summary": summary, "clocks": bench.gpu_clocks(), "gpu": spec.short,
           "hbm_tbps": spec.hbm_tbps, "bf16_tflops": spec.bf16_tflops, "rounds": rounds, "per_round": per_round,
           "stock_path": "A to BF16 per call (byte-pair table, one multiply by the scales); one torch.mm(bf16, "
                         "bf16 [B1; B2], out_dtype=float32) (cuBLAS); silu in place; torch.mul writing FP16",
           "reference_path": "dequantize A, B1, B2 to FP32 per call; two FP32 torch.matmul; silu * mul; FP16"}
    path = _write("dual_gemm", doc, out_dir)
    print(json.dumps(summary, indent=1))
    print(tables.format_bench({**doc, "device": bench.device_name()}))
    return path


# --------------------------------------------------------------------------------------
# bf16: against BF16 activations and BF16 weights made once (what a Hopper user would otherwise run)
# --------------------------------------------------------------------------------------


def bench_bf16(out_dir=None, shapes=dg.BF16_PATH_SHAPES, rounds=10, per_round=5):
    spec = hardware.device_spec(torch.cuda.current_device()) or hardware.H100
    rows = []
    for i, (m, n, k) in enumerate(shapes):
        try:
            row = dg.time_vs_bf16(m, n, k, rounds=rounds, per_round=per_round, seed=300 + i)
            print(f"{m} x {n} x {k}: ok={row['ok']} call {row['gemmlab_us']:.1f} us, prepared {row['prepared_us']:.1f}, "
                  f"BF16 path {row['bf16_path_us']:.1f} (its GEMM {row['bf16_gemm_us']:.1f}); kernels: ours "
                  f"{row['prepared_kernel_us']:.1f}, BF16 path {row['bf16_path_kernel_us']:.1f}; "
                  f"x{row['vs_bf16_path']:.2f} (call), x{row['vs_bf16_path_kernel']:.2f} (kernels)"
                  + (f"; fast twin's kernel {row['fast_twin_kernel_us']:.1f} us" if "fast_twin_kernel_us" in row else "")
                  + (f"; decode twin's kernel {row['decode_twin_kernel_us']:.1f} us" if "decode_twin_kernel_us" in row
                     else "")
                  + (f"; other form's kernel {row['other_form_kernel_us']:.1f} us ({row['other_form']['config']})"
                     if "other_form_kernel_us" in row else "")
                  + f"; {row['config']}", flush=True)
        except Exception:  # noqa: BLE001 - one failed shape is one failed row
            row = {"m": m, "n": n, "k": k, "ok": False, "error": traceback.format_exc()[-1500:]}
            print(f"{m} x {n} x {k}: FAILED\n{row['error']}", flush=True)
        rows.append(row)
        torch.cuda.empty_cache()
    good = [r for r in rows if r.get("ok")]
    gpu_mode = [r for r in good if (r["m"], r["n"], r["k"]) in fp4.BENCHMARK_SHAPES]
    summary = {
        "shapes": len(rows), "correct": len(good),
        "gpu_mode_call_geomean": bench.geomean([r["vs_bf16_path"] for r in gpu_mode]) if gpu_mode else None,
        "gpu_mode_kernel_geomean": bench.geomean([r["vs_bf16_path_kernel"] for r in gpu_mode]) if gpu_mode else None,
        "all_call_geomean": bench.geomean([r["vs_bf16_path"] for r in good]) if good else None,
        "below_1": [f"{r['m']}x{r['n']}x{r['k']}" for r in good if r["vs_bf16_path"] < 1.0],
    }
    doc = {"rows": rows, "summary": summary, "clocks": bench.gpu_clocks(), "gpu": spec.short,
           "hbm_tbps": spec.hbm_tbps, "bf16_tflops": spec.bf16_tflops, "rounds": rounds, "per_round": per_round,
           "bf16_path": "BF16 activations given; [B1; B2] dequantized once to one BF16 (2N, K); per call "
                        "F.linear (cuBLAS) into a preallocated (M, 2N) BF16, then F.silu(g) * u in BF16"}
    path = _write("dual_gemm_bf16", doc, out_dir)
    print(json.dumps(summary, indent=1))
    print(f"{'M x N x K':>18} {'call us':>8} {'prep us':>8} {'bf16 us':>8} {'gemm us':>8} {'ker us':>7} "
          f"{'bf16 ker':>8} {'x call':>7} {'x ker':>6} {'floor':>6}")
    for r in good:
        print(f"{r['m']:>5}x{r['n']:>5}x{r['k']:>5} {r['gemmlab_us']:8.1f} {r['prepared_us']:8.1f} "
              f"{r['bf16_path_us']:8.1f} {r['bf16_gemm_us']:8.1f} {r['prepared_kernel_us']:7.1f} "
              f"{r['bf16_path_kernel_us']:8.1f} {r['vs_bf16_path']:7.2f} {r['vs_bf16_path_kernel']:6.2f} "
              f"{r['of_floor']:6.2f}")
    return path


# --------------------------------------------------------------------------------------
# decode: every decode-twin configuration beside the fast twin (kernels alone)
# --------------------------------------------------------------------------------------


def bench_decode(out_dir=None, shapes=dg.DECODE_SWEEP_SHAPES, rounds=5, per_round=5):
    return _bench_sweep("dual_gemm_decode", dg.sweep_decode, shapes, 400, out_dir, rounds, per_round)


def bench_a16(out_dir=None, shapes=dg.A16_SWEEP_SHAPES, rounds=5, per_round=5):
    path = _bench_sweep("dual_gemm_a16", dg.sweep_a16, shapes, 500, out_dir, rounds, per_round)
    print(tables.format_a16_sweep(json.loads(path.read_text())))
    return path


def bench_swap(out_dir=None, shapes=dg.SWAP_SWEEP_SHAPES, rounds=5, per_round=5, name="dual_gemm_swap"):
    return _bench_sweep(name, dg.sweep_swap, shapes, 800, out_dir, rounds, per_round)


def bench_w16(out_dir=None, shapes=dg.W16_SWEEP_SHAPES, rounds=5, per_round=5, name="dual_gemm_w16"):
    return _bench_sweep(name, dg.sweep_w16, shapes, 600, out_dir, rounds, per_round)


def bench_w16_parts(out_dir=None, shapes=dg.W16_PARTS_SHAPES, rounds=5, per_round=5):
    rows = []
    for i, (m, n, k) in enumerate(shapes):
        try:
            row = dg.time_w16_parts(m, n, k, rounds=rounds, per_round=per_round, seed=700 + i)
        except Exception:  # noqa: BLE001 - one failed shape is one failed row
            row = {"m": m, "n": n, "k": k, "ok": False, "error": traceback.format_exc()[-1500:]}
        rows.append(row)
        if "error" in row:
            print(f"{m} x {n} x {k}: FAILED\n{row['error']}", flush=True)
        else:
            print(f"{m:>5}x{n:>5}x{k:>5} ok={row['ok']} W16 {row['w16_us']:7.1f} us = A pass {row['prepass_us']:6.1f} "
                  f"({row['prepass_tbps']:.2f} TB/s) + weight pass {row['weights_us']:6.1f} ({row['weights_tbps']:.2f} "
                  f"TB/s) + rest {row['rest_us']:6.1f}; BF16 GEMM alone {row['bf16_gemm_us']:7.1f}", flush=True)
        torch.cuda.empty_cache()
    return _write("dual_gemm_w16_parts", {"rows": rows, "clocks": bench.gpu_clocks(), "rounds": rounds,
                                          "per_round": per_round}, out_dir)


def _bench_sweep(name, sweep, shapes, seed, out_dir, rounds, per_round):
    """``sweep`` on every shape, the JSON rewritten after each one (a run cut short keeps the shapes it timed)."""
    docs, path = [], None
    for i, (m, n, k) in enumerate(shapes):
        try:
            doc = sweep(m, n, k, rounds=rounds, per_round=per_round, seed=seed + i)
        except Exception:  # noqa: BLE001 - one failed shape is one failed row
            doc = {"m": m, "n": n, "k": k, "rows": [], "error": traceback.format_exc()[-1500:]}
            print(f"{m} x {n} x {k}: FAILED\n{doc['error']}", flush=True)
        docs.append(doc)
        for r in doc["rows"]:
            mark = " <- chosen" if r["config"] == doc.get("chosen") else ""
            us = f"{r['kernel_us']:8.1f}" if "kernel_us" in r else "    --  "
            print(f"{m:>4}x{n:>5}x{k:>5} {us} us ok={r['ok']} {r['config']}{mark}", flush=True)
        torch.cuda.empty_cache()
        path = _write(name, {"shapes": docs, "clocks": bench.gpu_clocks(), "rounds": rounds,
                             "per_round": per_round, "complete": i + 1 == len(shapes)}, out_dir)
    return path


# --------------------------------------------------------------------------------------
# probe: the fast twin's variants and its two halves alone
# --------------------------------------------------------------------------------------


def probe(out_dir=None, shapes=fp4.BENCHMARK_SHAPES, launches=20):
    """Kernel time (CUDA graph of ``launches`` launches) of the fast twin's variants on each shape.

    ``no_mma`` converts but skips the WGMMAs, ``no_convert`` runs the WGMMAs on unconverted buffers: both
    give wrong results and exist only to show which half bounds the kernel.
    """
    from gemmlab.family.configs import PIPELINED_TILE_NS, PipelinedConfig
    from gemmlab.family.heuristic_gated import choose_tile_n
    from gemmlab.family.plan import prepare_gated

    variants = {"chosen": {}, "joint roles": {"split": False}, "3 stages": {"stages": 3},
                "convert only (no_mma)": {"probe": "no_mma"}, "MMA only (no_convert)": {"probe": "no_convert"}}
    rows = []
    for m, n, k in shapes:
        ops = fp4.generate(m, n, k, seed=1, device="cuda")
        chosen = choose_tile_n(m, n)
        row = {"m": m, "n": n, "k": k, "tile_n": chosen}
        for name, extra in variants.items():
            row[name] = _graph_us(prepare_gated(*ops.inputs(), ops.c, config=PipelinedConfig(tile_n=chosen, **extra)),
                                  launches)
        for bn in PIPELINED_TILE_NS:
            row[f"tile_n {bn}"] = _graph_us(prepare_gated(*ops.inputs(), ops.c, config=PipelinedConfig(tile_n=bn)),
                                            launches)
        rows.append(row)
        print({k: (round(v, 1) if isinstance(v, float) else v) for k, v in row.items()}, flush=True)
        torch.cuda.empty_cache()
    _write("dual_gemm_probe", {"rows": rows, "launches_per_graph": launches, "clocks": bench.gpu_clocks(),
                               "method": "one CUDA graph of back-to-back launches, one replay timed with events"},
           out_dir)
    print(tables.format_probe({"rows": rows, "device": bench.device_name()}))


def _graph_us(launch, launches):
    for _ in range(3):
        launch()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(launches):
            launch()
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / launches * 1e3


def _write(name, doc, out_dir):
    return bench.write_doc(name, doc, out_dir)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("what", choices=("check", "bench", "all", "probe", "bf16", "decode", "a16", "w16", "w16_narrow",
                                         "w16_parts", "swap"))
    p.add_argument("--out", default=None, help="write the JSON here instead of results/<device>/")
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--decode-only", action="store_true", help="bf16: only the shapes with M <= 128")
    p.add_argument("--part", default=None, help="swap: shapes i:j of the sweep (a run of one call each)")
    args = p.parse_args(argv)
    if args.part is not None and not re.fullmatch(r"\d+:\d+", args.part):
        p.error(f"--part must be i:j (shapes i to j - 1 of the swap sweep's {len(dg.SWAP_SWEEP_SHAPES)}); "
                f"got {args.part!r}")
    if not torch.cuda.is_available():
        print("needs a CUDA GPU (an H100/H200 runs the Hopper twin, a B200 the tcgen05 kernel)")
        return 2
    ok = True
    if args.what in ("check", "all"):
        ok = check(args.out)
    if args.what in ("bench", "all"):
        bench_shapes(args.out, rounds=args.rounds)
    if args.what == "probe":
        probe(args.out)
    if args.what == "bf16":
        shapes = [s for s in dg.BF16_PATH_SHAPES if s[0] <= 128 or not args.decode_only]
        bench_bf16(args.out, shapes=shapes, rounds=args.rounds)
    if args.what == "decode":
        bench_decode(args.out)
    if args.what == "a16":
        bench_a16(args.out)
    if args.what == "w16":
        bench_w16(args.out)
    if args.what == "swap":
        i, j = (int(x) for x in (args.part or f"0:{len(dg.SWAP_SWEEP_SHAPES)}").split(":"))
        name = "dual_gemm_swap" + (f"_{i}_{j}" if args.part else "")
        bench_swap(args.out, shapes=dg.SWAP_SWEEP_SHAPES[i:j], name=name)
    if args.what == "w16_parts":
        bench_w16_parts(args.out)
    if args.what == "w16_narrow":
        bench_w16(args.out, shapes=dg.W16_NARROW_SHAPES, name="dual_gemm_w16_narrow")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
