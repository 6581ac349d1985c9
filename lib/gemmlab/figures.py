"""Where figures go, how notebooks show them, and the fixed-width text tables printed beside them.

Library code draws every figure, saves it under ``figures/`` at the repository
root and returns the path; notebooks display the saved file, so what the reader
sees on the web is exactly what is in ``figures/``. Tables of numbers are text
(:func:`format_table`), so nbval compares them.
"""
from __future__ import annotations

import os
import threading
from pathlib import Path

def is_checkout(folder: Path) -> bool:
    """Whether ``folder`` is the root of a checkout of the course: its ``notebooks/``, ``results/`` and ``figures/``."""
    return all((Path(folder) / d).is_dir() for d in ("notebooks", "results", "figures"))


def _repo_root() -> Path:
    """The checkout whose ``figures/`` and ``results/`` the library uses.

    ``$GEMMLAB_ROOT`` if set; else the checkout this package is installed from (``pip install -e .``,
    or ``lib/`` on ``PYTHONPATH``). A ``pip install .`` copy lives in site-packages, where nothing
    may be written: it uses the checkout it runs in (the current folder, or its parent when that is a
    checkout's ``notebooks/``), else the current folder itself.
    """
    if os.environ.get("GEMMLAB_ROOT"):
        return Path(os.environ["GEMMLAB_ROOT"]).resolve()
    here = Path(__file__).resolve().parents[2]
    if is_checkout(here) or (here / "lib" / "gemmlab").is_dir():
        return here
    cwd = Path.cwd()
    return next((d for d in (cwd, cwd.parent) if is_checkout(d)), cwd)


REPO_ROOT = _repo_root()
FIGURES_DIR = Path(os.environ.get("GEMMLAB_FIGURES", REPO_ROOT / "figures"))


def save(fig, name: str) -> Path:
    """Save matplotlib ``fig`` as ``figures/<name>.png`` and close it.

    The PNG is written to a temporary file beside it and renamed over the old one, so a reader
    (another notebook, a browser) never sees half a file.
    """
    FIGURES_DIR.mkdir(parents=True, exist_ok=True)
    path = FIGURES_DIR / f"{name}.png"
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        # Fixed metadata keeps the file byte-stable between runs with the same data.
        fig.savefig(tmp, dpi=110, bbox_inches="tight", metadata={"Software": None}, format="png")
        os.replace(tmp, path)
    finally:
        _close(fig)
        if tmp.exists():
            tmp.unlink()
    return path


def _close(fig) -> None:
    """Release ``fig``: pyplot's figures are closed; a :func:`new_figure` one is not pyplot's to close."""
    if getattr(fig.canvas, "manager", None) is not None:  # made by pyplot
        import matplotlib.pyplot as plt

        plt.close(fig)


def show(path) -> None:
    """Display a saved figure inline (its text form is stable for nbval)."""
    from IPython.display import Image, display

    display(Image(filename=str(path)))


#: The keyword arguments of ``plt.subplots`` that go to the grid of axes rather than to the figure.
_SUBPLOTS_KEYS = ("sharex", "sharey", "squeeze", "width_ratios", "height_ratios", "subplot_kw", "gridspec_kw")


def new_figure(*args, **kwargs):
    """``plt.subplots(*args, **kwargs)`` without pyplot: ``(fig, axes)`` of a figure that works headless.

    The figure is not registered with pyplot and no backend is switched, so drawing a library figure
    leaves a notebook's own ``plt.show()`` (inline) working; :func:`save` writes it as PNG.
    """
    from matplotlib.figure import Figure

    grid = {k: kwargs.pop(k) for k in _SUBPLOTS_KEYS if k in kwargs}
    fig = Figure(**kwargs)
    return fig, fig.subplots(*args, **grid)


def format_table(rows: list[dict], columns: list[tuple[str, str, str]]) -> str:
    """A fixed-width text table. ``columns``: (key, header, format spec); a value of None (not measured) prints as
    ``-``."""
    heads = [h for _, h, _ in columns]
    cells = [["-" if r[k] is None else format(r[k], f) if f else str(r[k]) for k, _, f in columns] for r in rows]
    widths = [max(len(h), *(len(c[i]) for c in cells)) if cells else len(h) for i, h in enumerate(heads)]
    line = "  ".join(h.rjust(w) for h, w in zip(heads, widths))
    out = [line, "  ".join("-" * w for w in widths)]
    out += ["  ".join(c.rjust(w) for c, w in zip(row, widths)) for row in cells]
    return "\n".join(out)
