"""Timing on the GPU, and where benchmark results are written.

Rules the course follows (METHOD.md of the course): warm up first, time each
repetition with CUDA events, report the median, and always time the baseline
(torch's own copy or cuBLAS) side by side in the same run. Results are written
as JSON under ``results/<device>/`` with the device name inside.
"""
from __future__ import annotations

import json
import platform
import re
import statistics
import time
from pathlib import Path

from .figures import REPO_ROOT

RESULTS_DIR = REPO_ROOT / "results"


def time_ms(fn, *, warmup: int = 5, rep: int = 30) -> float:
    """Median milliseconds of ``fn()`` on the current CUDA stream, timed with events."""
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(rep):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def device_name() -> str:
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"


def device_slug(name: str | None = None) -> str:
    name = name or device_name()
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def copy_bandwidth_gbs(nbytes_moved: int, ms: float) -> float:
    """GB/s (1e9 bytes/s) counting every byte read plus every byte written."""
    return nbytes_moved / (ms * 1e-3) / 1e9


def write_results(name: str, rows: list[dict], **meta) -> Path:
    """Write ``rows`` as ``results/<device-slug>/<name>.json``; return the path."""
    import torch

    dev = device_name()
    out_dir = RESULTS_DIR / device_slug(dev)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{name}.json"
    doc = {
        "benchmark": name,
        "device": dev,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "host": platform.node(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        **meta,
        "rows": rows,
    }
    path.write_text(json.dumps(doc, indent=2) + "\n")
    return path


def load_results(name: str, device: str | None = None) -> dict | None:
    """The stored results of benchmark ``name`` for ``device`` (default: the first found)."""
    if device:
        p = RESULTS_DIR / device_slug(device) / f"{name}.json"
        return json.loads(p.read_text()) if p.exists() else None
    for p in sorted(RESULTS_DIR.glob(f"*/{name}.json")):
        return json.loads(p.read_text())
    return None


def format_table(rows: list[dict], columns: list[tuple[str, str, str]]) -> str:
    """A fixed-width text table. ``columns``: (key, header, format spec)."""
    heads = [h for _, h, _ in columns]
    cells = [[format(r[k], f) if f else str(r[k]) for k, _, f in columns] for r in rows]
    widths = [max(len(h), *(len(c[i]) for c in cells)) if cells else len(h) for i, h in enumerate(heads)]
    line = "  ".join(h.rjust(w) for h, w in zip(heads, widths))
    out = [line, "  ".join("-" * w for w in widths)]
    out += ["  ".join(c.rjust(w) for c, w in zip(row, widths)) for row in cells]
    return "\n".join(out)
