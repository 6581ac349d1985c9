"""Run All on any machine: cells whose tier this machine lacks print one line instead of failing.

Cells that launch kernels carry a cell tag (``gpu``, ``sm90``, ``sm100``) that
pytest/nbval and ``make run`` read. Jupyter frontends do not send tags to the
kernel, so each tagged cell also names its tier in its first line::

    # tier: sm90

:func:`setup` (called by every chapter's first code cell) registers an IPython
input transformer: a cell whose marker names a tier this machine lacks is
replaced by a print of one line, ``skipped: needs tier sm90; this machine is
tier cpu``, and Run All goes on. Every other cell runs unchanged. Where
``$GEMMLAB_TIER`` says the machine has the tier, nothing is skipped (a broken
GPU run fails loudly, as in the tests).

In JupyterLab (which tells the kernel its notebook's path) a skipped cell also
shows again the outputs stored in the notebook file for it, from the run on a
machine of that tier (:func:`skipped`): saving the notebook after Run All on a
laptop then keeps the H100/H200 results instead of replacing them with the
"skipped" line.

``python -m gemmlab.course.notebook --mark notebooks/*.ipynb`` makes the markers agree
with the tags (adds or fixes the marker of tagged cells, removes markers from
untagged cells, adds the setup call to the first code cell); ``--check`` lists
every disagreement and exits 1. The marker is a comment, so a cell's outputs do
not change when it is added.
"""
from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path

from ..figures import REPO_ROOT
from ..tiers import TIERS, detect_tier, required_tier, tier_satisfies

#: Where the course's notebooks are: ``notebooks/`` of the checkout this package runs from.
NOTEBOOKS = REPO_ROOT / "notebooks"
#: What the runner and ``--mark``/``--check`` import besides gemmlab: the ``notebooks`` extra of pyproject.toml.
NOTEBOOK_MODULES = ("nbformat", "nbclient", "jupyter_client", "ipykernel")

#: Cell tags that name a tier, most demanding first (a cell tagged gpu and sm100 needs sm100).
TIER_WORDS = ("sm100", "sm90", "gpu")
MARKER_RE = re.compile(r"^#\s*tier:\s*(\S*)\s*$")
#: What ``--mark`` adds to a first code cell that does not call :func:`setup` yet.
SETUP_LINE = "import gemmlab.course.notebook; gemmlab.course.notebook.setup()  # cells for a GPU this machine lacks print 'skipped'"
_SETUP_RE = re.compile(r"gemmlab\.course\.notebook\.setup\(|^from gemmlab\.course\.notebook import[^\n]*\bsetup\b", re.M)


def cell_tags(cell) -> list:
    """A cell's ``metadata.tags``: a list of strings (``[]`` when absent); ``ValueError`` for anything else.

    A string (``"gpu"``) or ``null`` there is a hand-edited notebook: read as a list of letters or as
    nothing, it would run a GPU cell on a CPU machine, so it is an error that names the cell's tags.
    """
    tags = cell.get("metadata", {}).get("tags", [])
    if not isinstance(tags, (list, tuple)) or not all(isinstance(t, str) for t in tags):
        raise ValueError(f"metadata.tags must be a list of strings; got {tags!r}")
    return list(tags)


def needed_tier(tags) -> str | None:
    """The most demanding tier word among a cell's ``tags`` (``None``: any machine runs it)."""
    if not isinstance(tags, (list, tuple, set, frozenset)):
        raise ValueError(f"tags must be a list of strings; got {tags!r}")
    for w in TIER_WORDS:
        if w in tags:
            return w
    return None


def marker(need: str) -> str:
    """The first-line comment of a cell that needs tier ``need``."""
    if need not in TIER_WORDS:
        raise ValueError(f"need must be one of {', '.join(TIER_WORDS)}; got {need!r}")
    return f"# tier: {need}"


def skip_message(need: str, have: str) -> str:
    """The one line a skipped cell prints: ``skipped: needs tier sm90; this machine is tier cpu``."""
    wanted = "sm90 or sm100" if need == "gpu" else need
    return f"skipped: needs tier {wanted}; this machine is tier {have}"


def _marker_index(lines: list[str]) -> int | None:
    """Index of the line that may hold the marker: the first non-blank one, or the one after a ``%%`` magic."""
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        if line.startswith("%%"):
            j = i + 1
            return j if j < len(lines) else None
        return i
    return None


def cell_marker(source: str) -> str | None:
    """The tier word of ``source``'s marker (``""`` for ``# tier:`` with no word), or ``None`` without one."""
    lines = source.splitlines()
    i = _marker_index(lines)
    if i is None:
        return None
    m = MARKER_RE.match(lines[i].strip())
    return m.group(1) if m else None


# ---------------------------------------------------------------------------
# The kernel side: an IPython input transformer
# ---------------------------------------------------------------------------


def tier_gate(have: str, declared: str | None = None):
    """The input transformer for a machine of tier ``have`` (``declared``: ``$GEMMLAB_TIER``, if any).

    It takes and returns a cell's lines (IPython's contract for
    ``input_transformers_cleanup``): unchanged, unless the marker names a tier
    neither ``have`` nor ``declared`` satisfies; then one ``print``.
    """
    if have not in TIERS:
        raise ValueError(f"have must be one of {', '.join(TIERS)}; got {have!r}")
    if declared is not None and declared not in TIERS:
        raise ValueError(f"declared must be one of {', '.join(TIERS)} or None; got {declared!r}")

    def gate(lines: list[str]) -> list[str]:
        need = cell_marker("".join(lines))
        if need is None:
            return lines
        if need not in TIER_WORDS:
            msg = f"the first line '# tier: {need}' must name one of {', '.join(TIER_WORDS)}"
            return [f"raise ValueError({msg!r})\n"]
        if tier_satisfies(have, need) or (declared is not None and tier_satisfies(declared, need)):
            return lines
        return [f"__import__('gemmlab.course.notebook').course.notebook.skipped({need!r}, {have!r}, {''.join(lines)!r})\n"]

    gate._gemmlab_tier_gate = True
    return gate


#: The line a skipped cell prints before the outputs stored for it (those of a machine of its tier).
STORED_NOTE = "(below: this cell's output stored in the notebook, from a machine of that tier; saving keeps it)"


def _notebook_file() -> Path | None:
    """The notebook this kernel runs, where the frontend says (JupyterLab's ``$JPY_SESSION_NAME``), else None."""
    name = os.environ.get("JPY_SESSION_NAME", "")
    if not name.endswith(".ipynb"):
        return None
    p = Path(name)
    for cand in ([p] if p.is_absolute() else [Path.cwd() / p.name, Path.cwd() / p]):
        if cand.is_file():
            return cand
    return None


def _own_line(line: str) -> bool:
    return line.startswith("skipped: needs tier ") or line.strip() == STORED_NOTE


def stored_outputs(source: str, path) -> list:
    """The outputs stored in notebook ``path`` for the code cell whose source is ``source`` (``[]`` if none),
    without the lines :func:`skipped` itself printed there on an earlier run."""
    import nbformat

    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code" and cell.source.rstrip() == source.rstrip():
            out = []
            for o in cell.get("outputs", []):
                if o.get("output_type") == "stream":
                    text = "".join(x for x in str(o.get("text", "")).splitlines(keepends=True) if not _own_line(x))
                    if not text:
                        continue
                    o = nbformat.v4.new_output("stream", name=o.get("name", "stdout"), text=text)
                out.append(o)
            return out
    return []


def skipped(need: str, have: str, source: str = "") -> None:
    """What a cell whose tier this machine lacks runs instead: the ``skipped`` line, then (in JupyterLab) the
    outputs stored in the notebook file for this cell, shown again so that saving the notebook keeps them."""
    print(skip_message(need, have))
    path = _notebook_file()
    if path is None or not source:
        return
    try:
        outputs = stored_outputs(source, path)
    except Exception:  # an unreadable or half-saved file: the skipped line alone, as without a frontend
        return
    if not outputs:
        return
    from IPython.display import publish_display_data

    print(STORED_NOTE, flush=True)
    for o in outputs:
        kind = o.get("output_type")
        if kind == "stream":
            stream = sys.stderr if o.get("name") == "stderr" else sys.stdout
            stream.write(o["text"])
            stream.flush()
        elif kind in ("display_data", "execute_result"):
            publish_display_data(data=dict(o.get("data", {})), metadata=dict(o.get("metadata", {})))
        elif kind == "error":
            sys.stderr.write("\n".join(o.get("traceback", [])) + "\n")


def setup(shell=None, have: str | None = None) -> None:
    """Make this IPython kernel skip cells whose ``# tier:`` marker names a tier this machine lacks.

    Called once by each notebook's first code cell; calling it again replaces
    the earlier transformer. ``shell``: the IPython shell (default: the running
    one; outside IPython this does nothing). ``have``: the machine's tier
    (default :func:`gemmlab.tiers.detect_tier`).
    """
    declared = required_tier()  # a bad $GEMMLAB_TIER fails here, in the first cell
    if shell is None:
        try:
            from IPython import get_ipython
        except ImportError:
            return
        shell = get_ipython()
        if shell is None:
            return
    gate = tier_gate(have if have is not None else detect_tier(), declared)
    cleanup = shell.input_transformers_cleanup
    cleanup[:] = [t for t in cleanup if not getattr(t, "_gemmlab_tier_gate", False)]
    cleanup.insert(0, gate)


# ---------------------------------------------------------------------------
# The notebook side: markers that agree with the tags
# ---------------------------------------------------------------------------


def _with_marker(source: str, need: str | None) -> str:
    """``source`` with its marker set to ``need`` (``None``: removed); other lines untouched."""
    if need is not None and not source.strip():
        return marker(need)
    lines = source.split("\n")
    i = _marker_index(lines)
    has = i is not None and MARKER_RE.match(lines[i].strip()) is not None
    if need is None:
        if has:
            del lines[i]
        return "\n".join(lines)
    if has:
        lines[i] = marker(need)
    else:
        at = 0
        first = next((k for k, line in enumerate(lines) if line.strip()), None)
        if first is not None and lines[first].startswith("%%"):
            at = first + 1
        lines.insert(at, marker(need))
    return "\n".join(lines)


def _with_setup(source: str) -> str:
    """``source`` with :data:`SETUP_LINE` inserted before its code (after a ``%%`` magic and ``__future__`` imports)."""
    lines = source.split("\n")
    at = 0
    while at < len(lines) and (not lines[at].strip() or lines[at].startswith("%%") and at == 0
                               or lines[at].startswith("from __future__ import")):
        at += 1
    while at > 0 and not lines[at - 1].strip():  # keep blank lines after the insertion
        at -= 1
    lines.insert(at, SETUP_LINE)
    return "\n".join(lines)


def _code_cells(nb):
    return [c for c in nb.cells if c.cell_type == "code"]


def problems(nb) -> list[str]:
    """Where a notebook's markers and setup call disagree with its tags (empty: all agree)."""
    out = []
    code = _code_cells(nb)
    bad = []
    for n, cell in enumerate(code, 1):
        try:
            cell_tags(cell)
        except ValueError as exc:
            bad.append(f"code cell {n}: {exc}")
    if bad:  # nothing else can be judged until the tags are lists
        return bad
    if code:
        first = code[0]
        if needed_tier(first.metadata.get("tags", [])):
            out.append("code cell 1 is tagged for a tier: the setup call needs an untagged first code cell")
        elif not _SETUP_RE.search(first.source):
            out.append("code cell 1 does not call gemmlab.course.notebook.setup()")
    for n, cell in enumerate(code, 1):
        need = needed_tier(cell.metadata.get("tags", []))
        have = cell_marker(cell.source)
        if need is None and have is not None:
            out.append(f"code cell {n}: untagged but its first line is a marker ('# tier: {have}')")
        elif need is not None and have is None:
            out.append(f"code cell {n}: tagged {need} but its first line is not '{marker(need)}'")
        elif need is not None and have != need:
            out.append(f"code cell {n}: tagged {need} but its marker says '# tier: {have}'")
    return out


def mark(nb) -> list[str]:
    """Make ``nb``'s markers and setup call agree with its tags, in place; returns what changed."""
    import nbformat

    changes = []
    code = _code_cells(nb)
    for n, cell in enumerate(code, 1):
        try:
            cell_tags(cell)
        except ValueError as exc:
            raise ValueError(f"code cell {n}: {exc}; fix the tags by hand first") from None
    if code and (needed_tier(code[0].metadata.get("tags", [])) or not _SETUP_RE.search(code[0].source)):
        if needed_tier(code[0].metadata.get("tags", [])):
            cell = nbformat.v4.new_code_cell(SETUP_LINE)
            nb.cells.insert(nb.cells.index(code[0]), cell)
            changes.append("inserted an untagged first code cell with the setup call")
        else:
            code[0].source = _with_setup(code[0].source)
            changes.append("code cell 1: added the setup call")
        code = _code_cells(nb)
    for n, cell in enumerate(code, 1):
        need = needed_tier(cell.metadata.get("tags", []))
        if cell_marker(cell.source) == need:
            continue
        new = _with_marker(cell.source, need)
        if new != cell.source:
            cell.source = new
            changes.append(f"code cell {n}: " + (f"marker set to '{marker(need)}'" if need else "stray marker removed"))
    return changes


def missing_notebook_modules() -> str | None:
    """``None`` when the notebook stack imports; else one line naming what is missing and how to install it."""
    import importlib
    import importlib.util

    missing = []
    for m in NOTEBOOK_MODULES:  # found and importable: a broken install counts as missing
        try:
            if importlib.util.find_spec(m) is None:
                missing.append(m)
            else:
                importlib.import_module(m)
        except ImportError:
            missing.append(m)
    if not missing:
        return None
    return (f"running notebooks needs {', '.join(missing)}, which this Python ({sys.executable}) lacks: install "
            "the notebooks extra (pip install 'gemmlab[notebooks]', or pip install -r requirements.lock in a "
            "checkout)")


class NoNotebooks(FileNotFoundError):
    """The course's notebooks are not where this copy of gemmlab looks for them."""


def notebook_paths(names) -> list[Path] | None:
    """The command-line tools' notebooks: ``names`` as paths, or :func:`default_notebooks` when there are none.
    None (after printing why) if the notebook stack is missing (:func:`missing_notebook_modules`) or there is no
    notebook to take: the tools then exit 2."""
    missing = missing_notebook_modules()
    if missing:
        print(f"error: {missing}", file=sys.stderr)
        return None
    try:
        return [Path(p) for p in names] or default_notebooks()
    except NoNotebooks as exc:
        print(f"error: {exc}", file=sys.stderr)
        return None


def default_notebooks() -> list[Path]:
    """``notebooks/*.ipynb`` of the checkout this package runs from; :class:`NoNotebooks` if there is none."""
    found = sorted(NOTEBOOKS.glob("*.ipynb")) if NOTEBOOKS.is_dir() else []
    if not found:
        raise NoNotebooks(
            f"no notebooks found in {NOTEBOOKS}: gemmlab looks for the course's notebooks next to its own "
            f"source ({Path(__file__).resolve().parent}), and this copy is not inside a checkout of the "
            "repository (`pip install .` copies the library only). Run from a checkout (`make run`, or "
            "`pip install -e .` there), or pass the notebook paths."
        )
    return found


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m gemmlab.course.notebook",
        description="Keep each tagged cell's first-line '# tier:' marker and the setup call in agreement with the tags.")
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--mark", action="store_true", help="fix the notebooks in place (idempotent)")
    mode.add_argument("--check", action="store_true", help="list disagreements; exit 1 if there are any")
    ap.add_argument("notebooks", nargs="*", help="notebook paths (default: the repository's notebooks/*.ipynb)")
    args = ap.parse_args(argv)

    paths = notebook_paths(args.notebooks)
    if paths is None:
        return 2
    import nbformat

    bad = 0
    for p in paths:
        try:
            nb = nbformat.read(p, as_version=4)
        except Exception as exc:  # missing file, not JSON, not a notebook
            print(f"{p}: cannot read: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
            bad += 1
            continue
        if args.mark:
            try:
                changes = mark(nb)
            except ValueError as exc:
                print(f"{p}: {exc}")
                bad += 1
                continue
        if args.check:
            found = problems(nb)
            for msg in found:
                print(f"{p}: {msg}")
            bad += bool(found)
        else:
            if changes:
                nbformat.write(nb, p)
                for msg in changes:
                    print(f"{p}: {msg}")
    if bad:
        what = "disagree with their tags or could not be read" if args.check else "could not be read or have tags that are not lists"
        print(f"{bad} of {len(paths)} notebook(s) {what}")
        return 1
    print(f"{len(paths)} notebook(s): markers agree with tags" if args.check else f"{len(paths)} notebook(s) marked")
    return 0


if __name__ == "__main__":
    sys.exit(main())
