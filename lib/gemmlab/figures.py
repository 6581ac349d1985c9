"""Where figures go, how notebooks show them, and the fixed-width text tables printed beside them.

Library code draws every figure, saves it under ``figures/`` at the repository
root and returns the path; notebooks display the saved file, so what the reader
sees on the web is exactly what is in ``figures/``. Tables of numbers are text
(:func:`format_table`), so nbval compares them.
"""
from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
FIGURES_DIR = Path(os.environ.get("GEMMLAB_FIGURES", REPO_ROOT / "figures"))


def save(fig, name: str) -> Path:
    """Save matplotlib ``fig`` as ``figures/<name>.png`` and close it."""
    import matplotlib.pyplot as plt

    FIGURES_DIR.mkdir(parents=True, exist_ok=True)
    path = FIGURES_DIR / f"{name}.png"
    # Fixed metadata keeps the file byte-stable between runs with the same data.
    fig.savefig(path, dpi=110, bbox_inches="tight", metadata={"Software": None})
    plt.close(fig)
    return path


def show(path) -> None:
    """Display a saved figure inline (its text form is stable for nbval)."""
    from IPython.display import Image, display

    display(Image(filename=str(path)))


def new_figure(*args, **kwargs):
    """``plt.subplots`` on the non-interactive Agg canvas (works headless)."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    return plt.subplots(*args, **kwargs)


def format_table(rows: list[dict], columns: list[tuple[str, str, str]]) -> str:
    """A fixed-width text table. ``columns``: (key, header, format spec)."""
    heads = [h for _, h, _ in columns]
    cells = [[format(r[k], f) if f else str(r[k]) for k, _, f in columns] for r in rows]
    widths = [max(len(h), *(len(c[i]) for c in cells)) if cells else len(h) for i, h in enumerate(heads)]
    line = "  ".join(h.rjust(w) for h, w in zip(heads, widths))
    out = [line, "  ".join("-" * w for w in widths)]
    out += ["  ".join(c.rjust(w) for c, w in zip(row, widths)) for row in cells]
    return "\n".join(out)
