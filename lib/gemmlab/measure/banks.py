"""Chapter 01's bank-conflict measurement as a figure: the model's wavefronts against the cycles measured.

The measurement itself is the chapter's kernel (:func:`gemmlab.banks.measure_bank_conflicts`); the figure names
the GPU and the date it was measured on (:func:`gemmlab.measure.bench.measured_on`), so it lives here.
"""
from __future__ import annotations

from ..figures import new_figure, save
from .bench import measured_on as _measured_on


def draw_bank_conflicts(rows: list[dict], name: str = "01_bank_conflicts_measured", *,
                        measured_on: str | None = None):
    """Measured cycles per warp-wide access (rows of :func:`gemmlab.banks.measure_bank_conflicts`) against the
    model's wavefronts; return the path.

    ``measured_on``: "device, date" for the title (default: this GPU, today: :func:`gemmlab.measure.bench.measured_on`).
    """
    fig, ax = new_figure(figsize=(8, 3.6))
    s = [r["stride"] for r in rows]
    ax.plot(s, [r["model wavefronts"] for r in rows], "o-", ms=4, label="model: wavefronts per access")
    ax.plot(s, [r["cycles/access"] for r in rows], "s--", ms=4, label="measured: cycles per warp-wide access")
    ax.set_xlabel(f"stride (in {rows[0]['width']}-byte accesses)")
    ax.set_ylabel("per warp-wide access")
    ax.set_xticks(s)
    ax.tick_params(axis="x", labelsize=7)
    ax.set_yscale("log", base=2)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(f"Shared-memory bank conflicts: model vs measured ({measured_on or _measured_on()})")
    return save(fig, name)
