"""Execute the course's notebooks headless and report what ran.

``python -m gemmlab.course.runner`` (what ``make run`` calls) executes every notebook
into ``build/notebooks/`` on whatever hardware is present: cells tagged for a
tier this machine lacks are skipped (and counted), everything else runs. It
ends with a table (notebook, cells run, cells skipped and the tier they need,
failures, wall time) and a totals line, and exits non-zero on any failure. A
notebook that cannot be read, a missing path, a timeout or a dead kernel is one
failed row; the run goes on with the next notebook.

In ``build/notebooks/`` a skipped cell's stored outputs (from the last GPU run)
are replaced by one line, ``skipped: needs tier sm90; this machine is tier
cpu``, so nothing there looks like a result of this machine.

``--inplace`` writes the executed notebooks back over the inputs: how the GPU
command refreshes the stored outputs after a full run. There a skipped cell
keeps its stored outputs (on a CPU machine, the GPU results stay in the
notebook; on an H100, the Blackwell cells keep their B200 outputs).
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

from ..figures import REPO_ROOT
from ..tiers import detect_tier, tier_satisfies
from . import notebook
from .notebook import TIER_WORDS, NoNotebooks, default_notebooks, needed_tier, notebook_paths, skip_message  # noqa: F401

BUILD = REPO_ROOT / "build" / "notebooks"  # in a checkout; elsewhere build/notebooks/ of the current folder
SKIP_TAG = "skip-execution"  # nbclient's own tag for "leave this cell alone"

__all__ = ["TIER_WORDS", "needed_tier", "default_notebooks", "output_paths", "run_notebook", "format_report", "main"]


def output_paths(paths: list[Path], out_dir: Path) -> list[Path]:
    """Where each executed notebook goes under ``out_dir``: its file name, or as many parent folders as
    it takes to keep two inputs with the same name from overwriting each other."""
    resolved = [Path(os.path.abspath(p)) for p in paths]
    parts = [p.parts[1:] for p in resolved]  # without the root
    out = []
    for i, mine in enumerate(parts):
        k = 1
        while k < len(mine) and any(j != i and other[-k:] == mine[-k:] for j, other in enumerate(parts)):
            k += 1
        out.append(out_dir.joinpath(*mine[-k:]))
    return out


def _kernel_env() -> dict:
    """The kernel runs this interpreter, sees lib/ (in a checkout) and no pytest variables."""
    env = dict(os.environ)
    env.pop("PYTEST_CURRENT_TEST", None)
    lib = REPO_ROOT / "lib"
    if (lib / "gemmlab").is_dir():
        env["PYTHONPATH"] = str(lib) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
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


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"[:200]


def _failed_row(path: Path, error: str) -> dict:
    return {"notebook": path.stem, "run": 0, "skipped": 0, "skipped_tiers": "-", "failures": 1,
            "error": error, "errors": [], "wall_s": 0.0, "output": None}


def run_notebook(path: Path, out_path: Path, have: str, timeout: int, *, keep_skipped_outputs: bool = False) -> dict:
    """Execute the notebook at ``path`` on a machine of tier ``have``; write it to ``out_path``; return its row.

    Cells needing a tier ``have`` lacks are not executed. ``keep_skipped_outputs``:
    they keep their stored outputs (``--inplace``); otherwise each gets the one
    line of :func:`gemmlab.course.notebook.skip_message`. Code cells are numbered from 1
    in messages, counting code cells only.
    """
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellTimeoutError, DeadKernelError

    path = Path(path)
    if not path.is_file():
        return _failed_row(path, f"no such notebook: {path}")
    try:
        nb = nbformat.read(path, as_version=4)
    except Exception as exc:  # not JSON, not a notebook, unreadable
        return _failed_row(path, f"cannot read {path}: {_first_line(exc)}")
    code_cells = [c for c in nb.cells if c.cell_type == "code"]
    code_number = {id(c): n for n, c in enumerate(code_cells, 1)}
    skipped_cells = []
    skipped: dict[str, int] = {}
    for cell in code_cells:
        tags = cell.metadata.setdefault("tags", [])
        need = needed_tier(tags)
        if need and not tier_satisfies(have, need):
            skipped[need] = skipped.get(need, 0) + 1
            skipped_cells.append((cell, need, SKIP_TAG not in tags))
            if SKIP_TAG not in tags:
                tags.append(SKIP_TAG)
    current: dict = {"executed": 0}

    def on_cell_execute(cell, cell_index, **_):
        current["n"] = code_number.get(id(cell), cell_index + 1)
        current["executed"] += 1

    client = NotebookClient(
        nb, timeout=timeout, kernel_name="python3", allow_errors=True,
        resources={"metadata": {"path": str(path.parent)}}, on_cell_execute=on_cell_execute,
    )
    t0 = time.perf_counter()
    error = None
    old = dict(os.environ)
    try:
        os.environ.update(_kernel_env())
        os.environ.pop("PYTEST_CURRENT_TEST", None)
        os.environ["JUPYTER_PATH"] = _kernelspec_dir()
        client.execute()
    except CellTimeoutError:
        error = f"code cell {current.get('n', '?')}: timed out after {timeout} s (--timeout)"
    except DeadKernelError as exc:
        error = f"code cell {current.get('n', '?')}: the kernel died ({_first_line(exc)})"
    except Exception as exc:  # the kernel did not start, or nbclient failed otherwise
        error = _first_line(exc)
    finally:
        os.environ.clear()
        os.environ.update(old)
    wall = time.perf_counter() - t0
    stopped = current.get("n") if error else None  # its error output is the interrupt, already reported
    errors = [
        f"code cell {n}: {o.get('ename')}: {str(o.get('evalue', ''))[:160]}"
        for n, c in enumerate(code_cells, 1) if n != stopped
        for o in c.get("outputs", []) if o.get("output_type") == "error"
    ]
    # Give the notebook its own tags back; outside --inplace, say what a skipped cell did here.
    for cell, need, added in skipped_cells:
        if added:
            cell.metadata["tags"].remove(SKIP_TAG)
        if not keep_skipped_outputs:
            cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text=skip_message(need, have) + "\n")]
            cell.execution_count = None
    try:
        out_path.parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, out_path)
    except OSError as exc:
        errors.append(f"cannot write {out_path}: {_first_line(exc)}")
    n_skipped = sum(skipped.values())
    return {
        "notebook": path.stem,
        "run": current["executed"],
        "skipped": n_skipped,
        "skipped_tiers": ",".join(sorted(skipped)) or "-",
        "failures": len(errors) + (1 if error else 0),
        "error": error,
        "errors": errors,
        "wall_s": wall,
        "output": out_path,
    }


def format_report(rows: list[dict], have: str) -> str:
    """The table ``make run`` ends with, and a totals line."""
    from ..figures import format_table

    table = format_table(rows, [
        ("notebook", "notebook", ""), ("run", "cells run", "d"), ("skipped", "skipped", "d"),
        ("skipped_tiers", "needs tier", ""), ("failures", "failures", "d"), ("wall_s", "wall s", ".1f"),
    ])
    failed = sum(1 for r in rows if r["failures"])
    failures = sum(r["failures"] for r in rows)
    total = (f"total: {len(rows)} notebook(s), {sum(r['run'] for r in rows)} code cells run, "
             f"{sum(r['skipped'] for r in rows)} skipped, "
             + (f"{failures} failure(s) in {failed} notebook(s)" if failures else "no failures")
             + f", {sum(r['wall_s'] for r in rows):.1f} s")
    return f"tier of this machine: {have}\n{table}\n{total}"


def _positive_seconds(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number of seconds; got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1 second per cell (there is no 'no limit'); got {value}")
    return value


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m gemmlab.course.runner", description=__doc__.splitlines()[0])
    ap.add_argument("notebooks", nargs="*", help="notebook paths (default: the repository's notebooks/*.ipynb)")
    where = ap.add_mutually_exclusive_group()
    where.add_argument("--inplace", action="store_true",
                       help="write executed notebooks back over the inputs (skipped cells keep their stored outputs)")
    where.add_argument("--out", type=Path, default=None,
                       help="folder for the executed notebooks (default: build/notebooks/ of the repository)")
    ap.add_argument("--timeout", type=_positive_seconds, default=900, help="seconds per cell, at least 1 (default 900)")
    args = ap.parse_args(argv)
    paths = notebook_paths(args.notebooks)
    if paths is None:
        return 2
    unique: dict[str, Path] = {}
    for p in paths:  # the same file named twice runs once
        unique.setdefault(os.path.abspath(p), p)
    paths = list(unique.values())
    out_dir = args.out or (BUILD if notebook.NOTEBOOKS.is_dir() else Path.cwd() / "build" / "notebooks")
    outs = paths if args.inplace else output_paths(paths, out_dir)
    have = detect_tier()
    rows = []
    for p, out in zip(paths, outs):
        print(f"running {p.name} ...", flush=True)
        row = run_notebook(p, out, have, args.timeout, keep_skipped_outputs=args.inplace)
        for msg in ([row["error"]] if row["error"] else []) + row["errors"]:
            print(f"  FAILED {msg}", flush=True)
        rows.append(row)
    if args.inplace:
        print("executed notebooks written back in place (skipped cells keep their stored outputs)")
    else:
        written = [r["output"] for r in rows if r["output"] is not None]
        folder = os.path.commonpath([str(w.parent) for w in written]) if written else str(out_dir)
        print(f"executed notebooks written to {folder}/ (skipped cells say so in their output)")
    print(format_report(rows, have))
    return 1 if any(r["failures"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
