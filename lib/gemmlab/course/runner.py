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
notebook; on an H100, the Blackwell cells keep their B200 outputs). Without
``--inplace`` no input is ever written: an ``--out`` that would put an executed
notebook over an input (or two over each other) is refused before anything runs.

Ctrl-C or SIGTERM stops the run: the current kernel is interrupted, no further
cell or notebook runs, the table of what ran is printed and the exit status is
130 (143 for SIGTERM); a notebook interrupted midway is not written in place.
A second Ctrl-C kills the kernel at once.
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import signal
import sys
import time
from pathlib import Path

from ..compile import scratch_dir
from ..figures import REPO_ROOT
from ..tiers import detect_tier, tier_satisfies
from . import notebook
from .notebook import (NOTEBOOK_MODULES, TIER_WORDS, NoNotebooks, cell_tags, default_notebooks,  # noqa: F401
                       missing_notebook_modules, needed_tier, notebook_paths, skip_message)

BUILD = REPO_ROOT / "build" / "notebooks"  # in a checkout; elsewhere build/notebooks/ of the current folder
SKIP_TAG = "skip-execution"  # nbclient's own tag for "leave this cell alone"

__all__ = ["TIER_WORDS", "needed_tier", "default_notebooks", "output_paths", "run_notebook", "format_report", "main"]


class Interrupted(Exception):
    """Ctrl-C or SIGTERM arrived: the run stops after the current cell."""


def check_outputs(paths: list[Path], outs: list[Path]) -> str | None:
    """``None`` when every output path is distinct and none is an input; else why not (one line)."""
    def key(p):
        return os.path.normcase(os.path.realpath(p))

    inputs = {key(p): p for p in paths}
    seen: dict[str, Path] = {}
    for p, out in zip(paths, outs):
        k = key(out)
        if k in inputs:
            return (f"the executed {p} would be written over the input {inputs[k]}: choose an --out folder "
                    "other than the notebooks' own, or pass --inplace to write over the inputs")
        if k in seen:
            return f"{seen[k]} and {p} would both be written to {out}: rename one, or run them separately"
        seen[k] = p
    return None


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
    """The kernel runs this interpreter, sees lib/ (in a checkout) and no pytest variables.

    Its connection file and sockets go to this process's temporary folder
    (:func:`gemmlab.compile.scratch_dir`), removed at exit.
    """
    env = dict(os.environ)
    env.pop("PYTEST_CURRENT_TEST", None)
    lib = REPO_ROOT / "lib"
    if (lib / "gemmlab").is_dir():
        env["PYTHONPATH"] = str(lib) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("MPLBACKEND", "Agg")
    env["JUPYTER_PATH"] = _kernelspec_dir()
    env["JUPYTER_RUNTIME_DIR"] = scratch_dir("runtime")
    return env


def _transport() -> str:
    """``ipc`` (Unix sockets: no "running over TCP without encryption" warning per kernel) where the socket
    paths fit the OS limit (~104 bytes), else ``tcp``."""
    if os.name != "posix" or len(scratch_dir("runtime")) + len("/kernel-65535") > 100:
        return "tcp"
    return "ipc"


@functools.lru_cache(maxsize=None)
def _kernelspec_dir() -> str:
    """A private kernelspec named python3 that runs ``sys.executable`` (in this process's temporary folder)."""
    root = Path(scratch_dir("kernels"))
    spec = root / "kernels" / "python3"
    spec.mkdir(parents=True, exist_ok=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Python 3 (gemmlab)", "language": "python",
    }))
    return str(root)


def _execute_in_thread(client) -> None:
    """``client.execute()`` in a worker thread, waiting here.

    nbclient replaces the process's SIGINT/SIGTERM handlers while it executes (its own only shut the
    kernel down, and the run went on) and resets them to the defaults afterwards; outside the main
    thread it installs none, so the runner's own handlers (:class:`_Stop`) stay in force.
    """
    import threading

    box: dict = {}

    def work():
        try:
            client.execute()
        except BaseException as exc:  # handed to the caller's thread
            box["exc"] = exc

    t = threading.Thread(target=work, name="gemmlab-notebook", daemon=True)
    t.start()
    while t.is_alive():
        t.join(0.2)  # short waits: the main thread runs signal handlers between them
    if "exc" in box:
        raise box["exc"]


def _write_atomically(nb, out_path: Path) -> None:
    """Write ``nb`` to a temporary file beside ``out_path``, then rename it over: a reader never sees half."""
    import nbformat

    out_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_path.with_name(f".{out_path.name}.{os.getpid()}.tmp")
    try:
        nbformat.write(nb, tmp)
        os.replace(tmp, out_path)
    finally:
        if tmp.exists():
            tmp.unlink()


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"[:200]


def _failed_row(path: Path, error: str) -> dict:
    return {"notebook": path.stem, "run": 0, "skipped": 0, "skipped_tiers": "-", "failures": 1,
            "error": error, "errors": [], "wall_s": 0.0, "output": None}


def run_notebook(path: Path, out_path: Path, have: str, timeout: int, *, keep_skipped_outputs: bool = False,
                 stop=None) -> dict:
    """Execute the notebook at ``path`` on a machine of tier ``have``; write it to ``out_path``; return its row.

    Cells needing a tier ``have`` lacks are not executed. ``keep_skipped_outputs``:
    they keep their stored outputs (``--inplace``); otherwise each gets the one
    line of :func:`gemmlab.course.notebook.skip_message`. Code cells are numbered from 1
    in messages, counting code cells only. ``stop``: a :class:`_Stop` whose flag,
    once set (by a signal), ends the run before the next cell. A notebook
    interrupted midway is written only when ``out_path`` is not ``path``.
    """
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellTimeoutError, DeadKernelError
    from traitlets.config import Config

    path = Path(path)
    if not path.is_file():
        return _failed_row(path, f"no such notebook: {path}")
    try:
        nb = nbformat.read(path, as_version=4)
    except Exception as exc:  # not JSON, not a notebook, unreadable
        return _failed_row(path, f"cannot read {path}: {_first_line(exc)}")
    code_cells = [c for c in nb.cells if c.cell_type == "code"]
    code_number = {id(c): n for n, c in enumerate(code_cells, 1)}
    for n, cell in enumerate(code_cells, 1):
        try:
            cell_tags(cell)
        except ValueError as exc:  # a string or null for tags: nothing of this notebook runs
            return _failed_row(path, f"code cell {n}: {exc}")
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
        if stop is not None and stop.reason:
            raise Interrupted(stop.reason)
        current["n"] = code_number.get(id(cell), cell_index + 1)
        current["executed"] += 1

    config = Config()
    config.KernelManager.transport = _transport()
    if config.KernelManager.transport == "ipc":  # absolute: the kernel runs in the notebook's folder
        config.KernelManager.ip = os.path.join(scratch_dir("runtime"), "kernel")
    client = NotebookClient(
        nb, timeout=timeout, kernel_name="python3", allow_errors=True, config=config,
        resources={"metadata": {"path": str(path.parent)}}, on_cell_execute=on_cell_execute,
    )
    if stop is not None:
        stop.client = client
    t0 = time.perf_counter()
    error = None
    interrupted = False
    old = dict(os.environ)
    try:
        os.environ.update(_kernel_env())
        os.environ.pop("PYTEST_CURRENT_TEST", None)
        _execute_in_thread(client)
        if stop is not None and stop.reason:  # the signal came during the last cell
            raise Interrupted(stop.reason)
    except Interrupted as exc:
        interrupted = True
        error = f"code cell {current.get('n', '?')}: interrupted ({exc}); the rest of the notebook did not run"
    except CellTimeoutError:
        error = f"code cell {current.get('n', '?')}: timed out after {timeout} s (--timeout)"
    except DeadKernelError as exc:
        error = f"code cell {current.get('n', '?')}: the kernel died ({_first_line(exc)})"
    except Exception as exc:  # the kernel did not start, or nbclient failed otherwise
        error = _first_line(exc)
    finally:
        os.environ.clear()
        os.environ.update(old)
        if stop is not None:
            stop.client = None
    wall = time.perf_counter() - t0
    stopped = current.get("n") if error else None  # its error output is the interrupt, already reported
    not_run = {id(cell) for cell, _, _ in skipped_cells}  # their outputs are stored, not made here
    errors = [
        f"code cell {n}: {o.get('ename')}: {str(o.get('evalue', ''))[:160]}"
        for n, c in enumerate(code_cells, 1) if n != stopped and id(c) not in not_run
        for o in c.get("outputs", []) if o.get("output_type") == "error"
    ]
    # Give the notebook its own tags back; outside --inplace, say what a skipped cell did here.
    for cell, need, added in skipped_cells:
        if added:
            cell.metadata["tags"].remove(SKIP_TAG)
        if not keep_skipped_outputs:
            cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text=skip_message(need, have) + "\n")]
            cell.execution_count = None
    written = None
    if interrupted and os.path.realpath(out_path) == os.path.realpath(path):
        pass  # never a half-run notebook over its input
    else:
        try:
            _write_atomically(nb, Path(out_path))
            written = out_path
        except Exception as exc:  # a folder in the way, no permission, a full disk
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
        "output": written,
        "interrupted": interrupted,
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


class _Stop:
    """What a SIGINT/SIGTERM handler sets: the reason, and the client whose kernel it interrupts."""

    def __init__(self):
        self.reason: str | None = None
        self.signum: int | None = None
        self.client = None

    def kernel_pid(self) -> int | None:
        km = getattr(self.client, "km", None)
        prov = getattr(km, "provisioner", None)
        return getattr(prov, "pid", None)

    def handler(self, signum, frame):
        pid = self.kernel_pid()
        if self.reason is not None:  # a second signal: kill the kernel now
            if pid:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            return
        self.signum = signum
        self.reason = signal.Signals(signum).name
        print(f"\n{self.reason}: stopping after the current cell (again to kill the kernel now)", file=sys.stderr,
              flush=True)
        if pid:  # the kernel runs in a session of its own: Ctrl-C in the terminal does not reach it
            try:
                os.kill(pid, signal.SIGINT)
            except OSError:
                pass


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
        unique.setdefault(os.path.realpath(p), p)
    paths = list(unique.values())
    out_dir = args.out or (BUILD if notebook.NOTEBOOKS.is_dir() else Path.cwd() / "build" / "notebooks")
    outs = paths if args.inplace else output_paths(paths, out_dir)
    if not args.inplace:
        clash = check_outputs(paths, outs)
        if clash:
            print(f"error: {clash}", file=sys.stderr)
            return 2
    have = detect_tier()
    rows = []
    stop = _Stop()
    handlers = {}
    if threading_main():
        for sig in (signal.SIGINT, signal.SIGTERM):
            handlers[sig] = signal.signal(sig, stop.handler)
    try:
        for p, out in zip(paths, outs):
            if stop.reason:
                break
            print(f"running {p.name} ...", flush=True)
            row = run_notebook(p, out, have, args.timeout, keep_skipped_outputs=args.inplace, stop=stop)
            for msg in ([row["error"]] if row["error"] else []) + row["errors"]:
                print(f"  FAILED {msg}", flush=True)
            rows.append(row)
    finally:
        for sig, old in handlers.items():
            signal.signal(sig, old)
    written = [r["output"] for r in rows if r["output"] is not None]
    if args.inplace and written:
        print("executed notebooks written back in place (skipped cells keep their stored outputs)")
    elif written:
        folder = os.path.commonpath([str(Path(w).parent) for w in written])
        print(f"executed notebooks written to {folder}/ (skipped cells say so in their output)")
    unwritten = [r["notebook"] for r in rows if r["output"] is None]
    if unwritten:
        print(f"not written: {', '.join(unwritten)}")
    print(format_report(rows, have))
    if stop.reason:
        left = len(paths) - len(rows)
        print(f"interrupted by {stop.reason}: {left} notebook(s) not run", file=sys.stderr)
        return 128 + stop.signum
    return 1 if any(r["failures"] for r in rows) else 0


def threading_main() -> bool:
    """Signal handlers can only be installed from the main thread."""
    import threading

    return threading.current_thread() is threading.main_thread()


if __name__ == "__main__":
    sys.exit(main())
