"""One command for the first B200 owner: does the course's Blackwell code work on this machine?

    make sm100-check            (or: python benchmarks/sm100_check.py)

On a machine of tier sm100 (B200 / GB200) it runs, in this order, each step with a time limit so the whole
check stays under five minutes:

1. the sm100 unit tests as mandatory (``GEMMLAB_TIER=sm100``: a test that cannot find the GPU fails instead
   of skipping): chapter 09's tcgen05 tiles and tensor memory, chapter 10's GEMM against torch and against
   the CPU model, and the pinned static evidence;
2. chapters 09 and 10 executed top to bottom, their ``sm100`` cells included (into ``build/sm100_check/``;
   the committed notebooks are not touched);
3. a short benchmark of chapter 10's kernel against cuBLAS (``torch.matmul``) with chapter 07's fair method
   (:func:`gemmlab.measure.gemm_family.time_case`), next to the calibrated prediction's range;

then prints one verdict table and writes it to ``results/<device>/sm100_check.json``: contribute that file
(and nothing else from the run) to the repository.

On any other machine it prints one line naming the tier it needs and exits with status 2.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "lib"))

TESTS = ["tests/test_tcgen05.py", "tests/test_tmem.py", "tests/test_gemm_sm100.py", "tests/test_sm100_pinned.py"]
NOTEBOOKS = ["notebooks/09_tcgen05_tmem.ipynb", "notebooks/10_persistent_gemm_sm100.ipynb"]
BENCH_SHAPES = [(4096, 4096, 4096), (8192, 8192, 8192), (4096, 2112, 7168), (4096, 7168, 2048)]
TEST_TIMEOUT_S = 150
NOTEBOOK_TIMEOUT_S = 300  # per cell
BUDGET_S = 300


def needs_sm100() -> str | None:
    """None on a B200-class machine; otherwise the one line to print."""
    from gemmlab.tiers import detect_tier

    tier = detect_tier()
    if tier == "sm100":
        return None
    return f"sm100-check needs a GPU of tier sm100 (B200 / GB200); this machine is tier {tier}"


def run_tests() -> dict:
    """The sm100 tests, mandatory; ``{"step", "ok", "detail", "seconds"}``."""
    t0 = time.time()
    env = {**os.environ, "GEMMLAB_TIER": "sm100", "PYTHONPATH": str(ROOT / "lib"), "MPLBACKEND": "Agg"}
    try:
        out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *TESTS], cwd=ROOT, env=env,
                             capture_output=True, text=True, timeout=TEST_TIMEOUT_S)
        tail = [ln for ln in out.stdout.splitlines() if re.search(r"\d+ (passed|failed|error)", ln)]
        detail = tail[-1].strip("= ") if tail else (out.stdout + out.stderr).strip().splitlines()[-1]
        ok = out.returncode == 0
        if not ok:
            detail += "; " + "; ".join(ln[7:] for ln in out.stdout.splitlines() if ln.startswith("FAILED "))[:400]
    except subprocess.TimeoutExpired:
        ok, detail = False, f"did not finish in {TEST_TIMEOUT_S} s"
    return {"step": "unit tests (sm100 mandatory)", "ok": ok, "detail": detail, "seconds": time.time() - t0}


def run_notebooks() -> list[dict]:
    """Chapters 09 and 10, every cell, into build/sm100_check/."""
    from gemmlab.course.runner import run_notebook

    rows = []
    for nb in NOTEBOOKS:
        t0 = time.time()
        path = ROOT / nb
        row = run_notebook(path, ROOT / "build" / "sm100_check" / path.name, "sm100", NOTEBOOK_TIMEOUT_S)
        problems = ([row["error"]] if row.get("error") else []) + list(row.get("errors") or [])
        rows.append({"step": f"notebook {path.stem}", "ok": not row["failures"] and not problems,
                     "detail": "; ".join(problems)[:400] or "every cell ran, sm100 cells included",
                     "seconds": time.time() - t0})
    return rows


def run_benchmark() -> list[dict]:
    """Chapter 10's kernel against cuBLAS, chapter 07's fair method, and the prediction's range."""
    from gemmlab.measure.gemm_family import Case, time_case
    from gemmlab.measure.calibration import predict_b200

    rows = []
    for shape in BENCH_SHAPES:
        t0 = time.time()
        r = time_case(Case(*shape), rounds=5, per_round=5)
        p = predict_b200(shape)
        ok = r["rel_err"] < 1e-2
        rows.append({"step": "benchmark " + "x".join(map(str, shape)), "ok": ok, "seconds": time.time() - t0,
                     "config": r["config"], "rel_err": r["rel_err"], "ours_tflops": r["prepared_tflops"],
                     "cublas_tflops": r["torch_gpu_tflops"], "ratio": r["ratio_prepared"],
                     "predicted_low": p["low_tflops"], "predicted_high": p["high_tflops"], "gpu": r.get("gpu"),
                     "detail": (f"ours {r['prepared_tflops']:.0f} TFLOP/s, cuBLAS {r['torch_gpu_tflops']:.0f} "
                                f"(ratio {r['ratio_prepared']:.3f}); predicted {p['low_tflops']:.0f}-"
                                f"{p['high_tflops']:.0f}; rel. error {r['rel_err']:.1e}")})
    return rows


def verdict_table(rows: list[dict]) -> str:
    """One line per step: PASS/FAIL, seconds, what it found."""
    out = [f"{'step':<40} {'verdict':<7} {'s':>5}  detail"]
    for r in rows:
        out.append(f"{r['step']:<40} {'PASS' if r['ok'] else 'FAIL':<7} {r['seconds']:5.0f}  {r['detail']}")
    passed = sum(r["ok"] for r in rows)
    out.append(f"{passed} of {len(rows)} steps passed")
    return "\n".join(out)


def main() -> int:
    why = needs_sm100()
    if why:
        print(why, file=sys.stderr)
        return 2
    from gemmlab.measure.bench import write_results

    t0 = time.time()
    rows = [run_tests()]
    rows += run_notebooks()
    if time.time() - t0 < BUDGET_S:
        rows += run_benchmark()
    else:
        rows.append({"step": "benchmark", "ok": False, "seconds": 0.0,
                     "detail": f"skipped: the steps before it used the {BUDGET_S} s budget"})
    print(verdict_table(rows))
    path = write_results("sm100_check", rows, seconds=time.time() - t0,
                         method="benchmarks/sm100_check.py; benchmark: gemmlab.measure.gemm_family.time_case")
    print(f"written {path.relative_to(ROOT)}: please contribute it (results/<device>/) to the repository")
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
