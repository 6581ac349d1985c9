"""The emulator against the GPU: every sm_90a kernel of chapters 01-08 at small shapes, on the same inputs.

    python benchmarks/emulator_vs_gpu.py [--jobs N] [--only TEXT] [--out DIR]

For each case of :mod:`gemmlab.emulator.sm90_cases` (one kernel, one configuration, one small shape)
it makes one set of random inputs on the CPU, runs the kernel through the course's GPU path on a
copy of them, and runs the same kernel (compiled by its module's ``compile_*`` function for sm_90a)
on the emulator, in a pool of CPU processes while the GPU half runs. Then it compares:

* data movement (copies, ldmatrix/stmatrix, the mbarrier probes and the ring's trace, async and bulk
  copies, TMA boxes and the swizzled shared-memory images chapter 04's kernel dumps, the TMA pipeline,
  the split-K reduction, the tile order): bit for bit;
* MMAs: FP32 accumulators (chapter 06's probe registers, chapter 07's split-K workspace) within
  ``2 K 2^-23 sum_k |a_k b_k|`` of each other, outputs rounded to BF16/FP16 within one ulp of the output
  type on top of that. The emulator sums a WGMMA's exact products in FP32 in torch's order, the tensor
  core in its own; each is within ``K 2^-23 sum |a_k b_k|`` of the exact sum (recursive summation, FP32,
  truncation included), so the two are within twice that of each other, and a rounding boundary between
  them makes the outputs one ulp apart (see :mod:`gemmlab.emulator.sm90_cases`);
* chapter 08's unfenced descriptor rewrite (``fences=False``): wrong on the emulator (stale tensor maps),
  and whether it was wrong on the GPU too;
* the bank-conflict kernel: no defined output (it XORs uninitialised shared memory); it completes.

Each side is also checked against the course's CPU model or an FP64 torch product (columns ``emu/model``,
``gpu/model``), so a disagreement says which side is wrong.

On an H100/H200 (tier sm90, or ``GEMMLAB_TIER=sm90``) the GPU half is mandatory: a case whose GPU run
fails is a failure. On a machine without a GPU only the emulator half runs (against the models) and the
script says that the GPU half was skipped. Writes ``results/<device>/emulator_vs_gpu.json`` on a GPU
(or into ``--out``), and prints the table last. Exit status 1 if any case fails.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "lib"))

NAME = "emulator_vs_gpu"


# ---------------------------------------------------------------------------------------------
# The emulator half (runs in worker processes; never touches CUDA)
# ---------------------------------------------------------------------------------------------


def _worker_init():
    import torch

    torch.set_num_threads(1)


_CASES = None


def _case(name):
    global _CASES
    from gemmlab.emulator import sm90_cases as S

    if _CASES is None:
        _CASES = {c.name: c for c in S.all_cases()}
    return _CASES[name]


def emulate_job(name: str, inputs: dict, seed: int = 0) -> dict:
    """Run one case on the emulator; returns its outputs and what the run cost (or the error)."""
    from gemmlab.emulator import sm90_cases as S

    try:
        outs, reports, compile_s, emu_s = S.run_emulator(_case(name), inputs, seed)
    except Exception:
        return {"error": traceback.format_exc(limit=4)}
    return {"outputs": outs, "compile_s": compile_s, "emulator_s": emu_s,
            "warp_instructions": sum(r.warp_instructions for r in reports),
            "async_ops": sum(r.async_ops for r in reports),
            "launches": [f"grid {r.grid} block {r.block} cluster {r.cluster}" for r in reports],
            "notes": sorted({n.split(" used ")[0] + " ..." if n.startswith("stale") else n
                             for r in reports for n in r.notes})}


# ---------------------------------------------------------------------------------------------
# Comparing
# ---------------------------------------------------------------------------------------------


def _summary(verdicts: dict) -> tuple[bool, str, float, str, float | None]:
    ok = all(v.ok for v in verdicts.values())
    comparisons = sorted({v.comparison for v in verdicts.values()})
    diff = max((v.max_diff for v in verdicts.values()), default=0.0)
    detail = "; ".join(f"{k}: {v.detail}" for k, v in verdicts.items() if v.detail)
    ratios = [v.of_bound for v in verdicts.values() if v.of_bound is not None]
    return ok, " / ".join(comparisons), diff, detail, max(ratios) if ratios else None


def compare_case(case, inputs, emu: dict, gpu_out, gpu_error, gpu_mode: bool) -> dict:
    from gemmlab.emulator import sm90_cases as S

    row = {"chapter": case.chapter, "kernel": case.kernel, "config": case.config, "shape": case.shape}
    if "error" in emu:
        row.update(ok=False, comparison="emulator run failed", max_diff=None, detail=emu["error"].strip()[-600:])
        return row
    row.update({k: emu[k] for k in ("compile_s", "emulator_s", "warp_instructions", "async_ops", "launches")})
    if emu["notes"]:
        row["emulator_notes"] = emu["notes"]
    ref = case.reference(inputs)
    broken = any(isinstance(c, S.Broken) for c in case.checks.values())
    emu_model = S.check_outputs(case, emu["outputs"], ref, inputs, sides=1)
    row["emu_vs_model"] = all(v.ok for v in emu_model.values())
    if not gpu_mode:
        ok, comparison, diff, detail, ratio = _summary(emu_model)
        row.update(ok=ok, comparison=comparison + " (emulator vs model; GPU skipped)", max_diff=diff, detail=detail,
                   of_bound=ratio)
        return row
    if gpu_error is not None:
        row.update(ok=False, comparison="GPU run failed", max_diff=None, detail=gpu_error.strip()[-600:])
        return row
    gpu_model = S.check_outputs(case, gpu_out, ref, inputs, sides=1)
    row["gpu_vs_model"] = all(v.ok for v in gpu_model.values())
    if broken:
        # Both should be wrong; the emulator's must be wrong for the modelled reason (stale tensor maps).
        stale = any(n.startswith("stale tensor map") for n in emu["notes"])
        row.update(ok=row["emu_vs_model"] and stale, comparison="wrong on the emulator (stale tensor maps)",
                   max_diff=None, detail=(f"GPU output {'also wrong' if row['gpu_vs_model'] else 'right this time'}; "
                                          f"emulator {'wrong' if row['emu_vs_model'] else 'right'}"
                                          f"{' with stale tensor-map notes' if stale else ''}"))
        return row
    if "c_artifact" in gpu_out:  # split-K: the emulator's artifact on the GPU must equal the plan's output
        same = S.Exact().compare(gpu_out["c_artifact"], gpu_out["c"], inputs)
        row["gpu_artifact_equals_plan"] = same.ok
    vs_gpu = S.check_outputs(case, emu["outputs"], gpu_out, inputs, sides=2)
    ok, comparison, diff, detail, ratio = _summary(vs_gpu)
    ok = ok and row.get("gpu_artifact_equals_plan", True)
    row.update(ok=ok, comparison=comparison, max_diff=diff, detail=detail, of_bound=ratio)
    return row


# ---------------------------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------------------------


def gpu_mode() -> tuple[bool, str]:
    """(run the GPU half?, why). Mandatory on tier sm90 or when $GEMMLAB_TIER says sm90."""
    from gemmlab.tiers import detect_tier, required_tier

    tier, declared = detect_tier(), required_tier()
    if tier == "sm90" or declared == "sm90":
        return True, f"tier {tier}" + (f" (GEMMLAB_TIER={declared})" if declared else "")
    import shutil

    import torch

    if torch.cuda.is_available():
        raise SystemExit(f"{NAME}: the GPU half needs an H100/H200 (tier sm90: the kernels are sm_90a); this "
                         f"machine's GPU ({torch.cuda.get_device_name(0)}) is tier {tier}")
    if os.path.exists("/dev/nvidiactl") or shutil.which("nvidia-smi"):
        raise SystemExit(f"{NAME}: this machine has an NVIDIA driver but torch sees no GPU (torch {torch.__version__}, "
                         f"CUDA {torch.version.cuda}): refusing to skip the GPU half")
    return False, f"no GPU (tier {tier})"


def _fmt(x, spec):
    return format("-", ">" + spec.split(".")[0]) if x is None else format(x, spec)


def table(rows: list[dict]) -> str:
    head = (f"{'ch':>2}  {'kernel':<26} {'config':<46} {'shape':<30} {'comparison':<44} {'max diff':>9} "
            f"{'of bound':>8}  pass")
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r['chapter']:>2}  {r['kernel'][:26]:<26} {r['config'][:46]:<46} {r['shape'][:30]:<30} "
                     f"{r['comparison'][:44]:<44} {_fmt(r.get('max_diff'), '9.3g')} {_fmt(r.get('of_bound'), '8.3f')}"
                     f"  {'PASS' if r['ok'] else 'FAIL'}")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=None, help="emulator processes (default: CPUs - 2, at most 14)")
    parser.add_argument("--only", default="", help="run the cases whose name contains this text")
    parser.add_argument("--out", default=None, help="write the JSON here instead of results/<device>/")
    args = parser.parse_args(argv)

    t_start = time.perf_counter()
    use_gpu, why = gpu_mode()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from gemmlab.emulator import sm90_cases as S

    cases = [c for c in S.all_cases() if args.only in c.name]
    if not cases:
        print(f"{NAME}: no case matches {args.only!r}")
        return 2
    inputs = {c.name: c.make(0) for c in cases}
    jobs = args.jobs or max(1, min((os.cpu_count() or 2) - 2, 14))
    if use_gpu:
        from gemmlab.measure.bench import device_name

        why += f", {device_name()}"
    print(f"{NAME}: {len(cases)} cases; GPU half {'on (' + why + ')' if use_gpu else 'SKIPPED: ' + why}; "
          f"emulator half in {jobs} process{'es' if jobs > 1 else ''}", flush=True)

    # The emulator half starts first (in other processes) and runs while the GPU half runs here.
    order = sorted(cases, key=lambda c: -_expected_seconds(c))
    emu: dict = {}
    pool = None
    if jobs > 1:
        import multiprocessing as mp
        from concurrent.futures import ProcessPoolExecutor

        pool = ProcessPoolExecutor(max_workers=jobs, mp_context=mp.get_context("spawn"), initializer=_worker_init)
        futures = {c.name: pool.submit(emulate_job, c.name, inputs[c.name], 0) for c in order}

    gpu_out, gpu_err, gpu_s = {}, {}, {}
    if use_gpu:
        for c in cases:
            t0 = time.perf_counter()
            try:
                gpu_out[c.name] = c.gpu(inputs[c.name])
                gpu_err[c.name] = None
            except Exception:
                gpu_out[c.name], gpu_err[c.name] = None, traceback.format_exc(limit=4)
            gpu_s[c.name] = time.perf_counter() - t0
            print(f"  gpu {gpu_s[c.name]:6.2f} s  {'ok ' if gpu_err[c.name] is None else 'ERR'}  {c.name}", flush=True)

    if pool is None:
        for c in order:
            emu[c.name] = emulate_job(c.name, inputs[c.name], 0)
            print(f"  emulator {emu[c.name].get('emulator_s', 0):6.2f} s  {c.name}", flush=True)
    else:
        for name, f in futures.items():
            emu[name] = f.result()
        pool.shutdown()

    rows = []
    for c in cases:
        row = compare_case(c, inputs[c.name], emu[c.name], gpu_out.get(c.name), gpu_err.get(c.name), use_gpu)
        if use_gpu:
            row["gpu_s"] = round(gpu_s[c.name], 3)
        rows.append(row)
    wall = time.perf_counter() - t_start
    failed = [r for r in rows if not r["ok"]]

    if use_gpu or args.out:
        from gemmlab.measure.bench import write_results

        path = write_results(NAME, rows, out_dir=args.out, gpu_half=use_gpu, why=why, jobs=jobs,
                             wall_s=round(wall, 1), passed=len(rows) - len(failed), failed=len(failed),
                             method=__doc__.split("\n\n", 2)[2].split("\n\nEach side")[0])
        print(f"wrote {path}")
    if not use_gpu:
        print(f"GPU half skipped ({why}): each case was compared with the course's model / an FP64 product only")
    emu_total = sum(r.get("emulator_s") or 0 for r in rows)
    print(f"{len(rows) - len(failed)} of {len(rows)} cases pass; wall {wall:.0f} s "
          f"(emulator {emu_total:.0f} s of CPU in {jobs} process{'es' if jobs > 1 else ''})")
    print(table(rows))
    for r in failed:
        print(f"FAIL {r['kernel']} [{r['config']}]: {r['comparison']}: {r.get('detail', '')}")
    return 1 if failed else 0


def _expected_seconds(case) -> float:
    """A rough cost, to start the longest emulator runs first."""
    return {1: 1, 2: 0.3, 3: 0.3, 4: 0.4, 5: 0.6, 6: 0.5, 7: 2, 8: 2.5}[case.chapter] + \
        (8 if case.kernel.startswith("banks") else 0)


if __name__ == "__main__":
    sys.exit(main())
