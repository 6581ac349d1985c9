"""Execute the course's notebooks headless and report what ran.

``python -m gemmlab.runner`` (what ``make run`` calls) executes every notebook
into ``build/`` on whatever hardware is present: cells tagged for a tier this
machine lacks are skipped (and counted), everything else runs. It ends with a
table (notebook, cells run, cells skipped and the tier they need, failures,
wall time) and exits non-zero on any failure.

``--inplace`` writes the executed notebooks back over ``notebooks/``: how the
GPU command refreshes the stored outputs after a full run.
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from .figures import REPO_ROOT
from .tiers import detect_tier, tier_satisfies

NOTEBOOKS = REPO_ROOT / "notebooks"
BUILD = REPO_ROOT / "build" / "notebooks"
TIER_WORDS = ("sm100", "sm90", "gpu")
SKIP_TAG = "skip-execution"  # nbclient's own tag for "leave this cell alone"


def needed_tier(tags) -> str | None:
    for w in TIER_WORDS:
        if w in tags:
            return w
    return None


def _kernel_env() -> dict:
    """The kernel runs this interpreter, sees lib/ and no pytest variables."""
    env = dict(os.environ)
    env.pop("PYTEST_CURRENT_TEST", None)
    lib = str(REPO_ROOT / "lib")
    env["PYTHONPATH"] = lib + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("MPLBACKEND", "Agg")
    return env


@functools.lru_cache(maxsize=None)
def _kernelspec_dir() -> str:
    """A private kernelspec named python3 that runs ``sys.executable`` (one per process)."""
    root = Path(tempfile.mkdtemp(prefix="gemmlab-kernels-"))
    spec = root / "kernels" / "python3"
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Python 3 (gemmlab)", "language": "python",
    }))
    return str(root)


def run_notebook(path: Path, out_path: Path, have: str, timeout: int) -> dict:
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    skipped: dict[str, int] = {}
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        tags = cell.metadata.setdefault("tags", [])
        need = needed_tier(tags)
        if need and not tier_satisfies(have, need):
            skipped[need] = skipped.get(need, 0) + 1
            if SKIP_TAG not in tags:
                tags.append(SKIP_TAG)
    code_cells = [c for c in nb.cells if c.cell_type == "code"]
    client = NotebookClient(
        nb, timeout=timeout, kernel_name="python3", allow_errors=True,
        resources={"metadata": {"path": str(path.parent)}},
    )
    t0 = time.perf_counter()
    error = None
    old = dict(os.environ)
    try:
        os.environ.update(_kernel_env())
        os.environ.pop("PYTEST_CURRENT_TEST", None)
        os.environ["JUPYTER_PATH"] = _kernelspec_dir()
        client.execute()
    except Exception as exc:  # kernel died, timeout: counts as a failure
        error = f"{type(exc).__name__}: {exc}".splitlines()[0][:200]
    finally:
        os.environ.clear()
        os.environ.update(old)
    wall = time.perf_counter() - t0
    errors = [
        f"cell {i}: {o.get('ename')}: {str(o.get('evalue', ''))[:160]}"
        for i, c in enumerate(nb.cells) if c.cell_type == "code"
        for o in c.get("outputs", []) if o.get("output_type") == "error"
    ]
    failures = len(errors)
    # Remove our skip marks again so the written notebook keeps its own tags.
    for c in code_cells:
        tags = c.metadata.get("tags", [])
        if SKIP_TAG in tags and needed_tier(tags):
            tags.remove(SKIP_TAG)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, out_path)
    n_skipped = sum(skipped.values())
    return {
        "notebook": path.stem,
        "run": len(code_cells) - n_skipped,
        "skipped": n_skipped,
        "skipped_tiers": ",".join(sorted(skipped)) or "-",
        "failures": failures + (1 if error else 0),
        "error": error,
        "errors": errors,
        "wall_s": wall,
    }


def format_report(rows: list[dict], have: str) -> str:
    from .bench import format_table

    table = format_table(rows, [
        ("notebook", "notebook", ""), ("run", "cells run", "d"), ("skipped", "skipped", "d"),
        ("skipped_tiers", "needs tier", ""), ("failures", "failures", "d"), ("wall_s", "wall s", ".1f"),
    ])
    return f"tier of this machine: {have}\n{table}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("notebooks", nargs="*", help="notebook paths (default: notebooks/*.ipynb)")
    ap.add_argument("--inplace", action="store_true", help="write executed notebooks back over the inputs")
    ap.add_argument("--timeout", type=int, default=900, help="seconds per cell")
    args = ap.parse_args(argv)
    paths = [Path(p) for p in args.notebooks] or sorted(NOTEBOOKS.glob("*.ipynb"))
    have = detect_tier()
    rows = []
    for p in paths:
        out = p if args.inplace else BUILD / p.name
        print(f"running {p.name} ...", flush=True)
        row = run_notebook(p.resolve(), out, have, args.timeout)
        for msg in ([row["error"]] if row["error"] else []) + row["errors"]:
            print(f"  FAILED {msg}", flush=True)
        rows.append(row)
    print(format_report(rows, have))
    return 1 if any(r["failures"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
