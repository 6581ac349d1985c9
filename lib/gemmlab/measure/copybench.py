"""Device-to-device copy benchmark: our copy kernels against torch's own copy (chapters 01 and 03).

Used by notebooks 00, 01 and 03 and by ``benchmarks/run.py``: :func:`measure_copies` (each copier checked,
then timed), :func:`stage_sweep` (chapter 03's bulk copy, ring by ring), :func:`measured_copy_tbps` (the
best copy stored per device, for chapter 00's roofline). Every kernel is timed
side by side with ``dst.copy_(src)`` in the same run, on a buffer far larger
than L2 (1 GiB by default against 50-60 MB of L2 on H100/H200), after checking
on fresh random data, with the output poisoned first, that it copies correctly.

Bandwidth counts bytes read plus bytes written (2 x size), the convention of
the device-to-device copy that torch reports.
"""
from __future__ import annotations

from typing import Callable

from ..async_copy import BULK_ALIGN, MAX_COPY_BYTES, prepare_bulk_copy
from ..checks import check_int
from ..figures import format_table, new_figure, save
from ..hardware import H100
from ..tiers import require_tier
from . import bench
from .bench import copy_bandwidth_gbs, device_name, time_ms, write_results

#: A copier gets (src, dst) torch tensors and returns a zero-argument launch.
Copier = Callable[["object", "object"], Callable[[], None]]

POISON = 0x7F  # byte pattern written into dst before each correctness check


def check_copier(name: str, prepare: Copier, nbytes: int, dtype=None) -> None:
    """Run ``name`` once on fresh random data into a poisoned buffer; raise if wrong."""
    import torch

    dtype = dtype or torch.uint8
    n = nbytes // torch.empty((), dtype=dtype).element_size()
    src = torch.randint(0, 255, (n * torch.empty((), dtype=dtype).element_size(),), dtype=torch.uint8, device="cuda").view(dtype)
    dst = torch.full((n * src.element_size(),), POISON, dtype=torch.uint8, device="cuda").view(dtype)
    prepare(src, dst)()
    torch.cuda.synchronize()
    if not torch.equal(src.view(torch.uint8), dst.view(torch.uint8)):
        bad = (src.view(torch.uint8) != dst.view(torch.uint8)).nonzero()
        raise AssertionError(f"{name}: {bad.numel()} of {nbytes} bytes wrong, first at byte {int(bad[0])}")


def measure_copies(copiers: dict[str, Copier], *, nbytes: int = 1 << 30, dtype=None,
                   rep: int = 30, name: str | None = "copy_bandwidth", check_bytes: int = 64 << 20) -> list[dict]:
    """Check and time each copier against torch's copy; return table rows.

    Rows: ``kernel``, ``ms``, ``GB/s``, ``vs torch`` (our bytes/s over torch's,
    timed in the same run). When ``name`` is given the rows are also written to
    ``results/<device>/<name>.json``.
    """
    import torch

    dtype = dtype or torch.uint8
    for kname, prep in copiers.items():
        check_copier(kname, prep, check_bytes, dtype)
    elem = torch.empty((), dtype=dtype).element_size()
    src = torch.randint(0, 255, (nbytes,), dtype=torch.uint8, device="cuda").view(dtype)
    dst = torch.empty_like(src)
    assert src.numel() * elem == nbytes
    moved = 2 * nbytes
    base_ms = time_ms(lambda: dst.copy_(src), rep=rep)
    rows = [{"kernel": "torch copy_", "ms": base_ms, "GB/s": copy_bandwidth_gbs(moved, base_ms), "vs torch": 1.0}]
    for kname, prep in copiers.items():
        run = prep(src, dst)
        ms = time_ms(run, rep=rep)
        # Re-time the baseline right after each kernel: clocks drift over a run.
        base_again = time_ms(lambda: dst.copy_(src), rep=rep)
        base = min(base_ms, base_again)
        rows.append({"kernel": kname, "ms": ms, "GB/s": copy_bandwidth_gbs(moved, ms), "vs torch": base / ms})
    if name:
        write_results(name, rows, bytes=nbytes, note="GB/s counts bytes read + bytes written")
    return rows


def copy_table(rows: list[dict]) -> str:
    return f"device: {device_name()}\n" + format_table(
        rows, [("kernel", "kernel", ""), ("ms", "ms", ".3f"), ("GB/s", "GB/s", ".0f"), ("vs torch", "vs torch", ".3f")]
    )


def measured_copy_tbps() -> dict[str, float] | None:
    """Best stored device-to-device copy bandwidth per device, TB/s, if any was measured.

    Reads ``results/<device>/copy_bandwidth.json`` (written by chapters 01/03
    via :func:`measure_copies`); ``None`` when no results are stored.
    """
    found = {}
    for path in sorted(bench.RESULTS_DIR.glob("*/copy_bandwidth.json")):
        doc = bench.load_results("copy_bandwidth", path.parent.name)
        if not doc or not doc.get("rows"):
            continue
        best = max(float(r["GB/s"]) for r in doc["rows"])
        found[doc.get("device", path.parent.name)] = best / 1000
    return found or None


# --------------------------------------------------------------------------------------
# Chapter 03: the bulk copy's ring, stage by stage
# --------------------------------------------------------------------------------------


def _smem_fits(stages: int, stage_bytes: int, ctas_per_sm: int, smem_per_sm: int = H100.smem_per_sm_kib * 1024) -> bool:
    """Whether ``ctas_per_sm`` rings (plus the 1 KiB each CTA reserves) fit one SM's shared memory."""
    return ctas_per_sm * (stages * stage_bytes + 8 * stages + 1024) <= smem_per_sm


def stage_sweep(stage_counts=(2, 3, 4, 6, 8), *, stage_bytes: int = 16384, ctas_per_sm=(1, 2),
                nbytes: int = 1 << 30, rep: int = 20, name: str | None = "copy_bulk_stages") -> list[dict]:
    """GB/s of :func:`gemmlab.async_copy.bulk_copy` for each ring size (and CTAs per SM) against torch's copy, same run.

    Each configuration first copies fresh random bytes into a poisoned
    ``dst`` and is checked exactly. Configurations whose rings do not fit
    one SM are skipped. Rows: ``stages``, ``ctas/SM``, ``KiB in flight/SM``,
    ``GB/s``, ``vs torch``; written to ``results/<device>/<name>.json``.
    """
    import torch

    check_int("stage_bytes", stage_bytes, lo=BULK_ALIGN, multiple_of=BULK_ALIGN)
    check_int("nbytes", nbytes, lo=BULK_ALIGN, hi=MAX_COPY_BYTES, multiple_of=BULK_ALIGN)
    for s in stage_counts:
        check_int("stage_counts[i]", s, lo=2, hi=16)
    for c in ctas_per_sm:
        check_int("ctas_per_sm[i]", c, lo=1, hi=4)
    require_tier("gpu", "gemmlab.measure.copybench.stage_sweep")
    src = torch.randint(0, 256, (nbytes,), dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    base = time_ms(lambda: dst.copy_(src), rep=rep)
    rows = []
    for c in ctas_per_sm:
        for s in stage_counts:
            if not _smem_fits(s, stage_bytes, c):
                continue
            run = prepare_bulk_copy(src, dst, stages=s, stage_bytes=stage_bytes, ctas_per_sm=c)
            dst.fill_(POISON)
            run()
            torch.cuda.synchronize()
            if not torch.equal(src, dst):
                raise AssertionError(f"bulk_copy with {s} stages, {c} CTAs/SM copied wrong bytes")
            ms = time_ms(run, rep=rep)
            base = min(base, time_ms(lambda: dst.copy_(src), rep=rep))
            rows.append({"stages": s, "ctas/SM": c, "KiB in flight/SM": c * (s - 1) * stage_bytes // 1024,
                         "ms": ms, "GB/s": copy_bandwidth_gbs(2 * nbytes, ms)})
    for r in rows:
        r["vs torch"] = base / r["ms"]
    if name:
        write_results(name, rows, bytes=nbytes, stage_bytes=stage_bytes, torch_ms=base,
                      note="GB/s counts bytes read + bytes written")
    return rows


def sweep_table(rows: list[dict]) -> str:
    return f"device: {device_name()}\n" + format_table(rows, [
        ("stages", "stages", ""), ("ctas/SM", "CTAs/SM", ""), ("KiB in flight/SM", "KiB loading/SM", ""),
        ("ms", "ms", ".3f"), ("GB/s", "GB/s", ".0f"), ("vs torch", "vs torch", ".3f")])


def draw_stage_sweep(rows: list[dict], *, stage_bytes: int = 16384, measured_on: str | None = None) -> str:
    """GB/s against the number of stages, one line per CTAs/SM; returns the figure's path.

    ``measured_on``: "device, date" for the title (default: this GPU, today: :func:`gemmlab.measure.bench.measured_on`).
    """
    fig, ax = new_figure(figsize=(6.5, 3.8))
    for c in sorted({r["ctas/SM"] for r in rows}):
        pts = sorted((r["stages"], r["GB/s"]) for r in rows if r["ctas/SM"] == c)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=f"{c} CTA(s)/SM")
    if rows:
        torch_gbs = rows[0]["GB/s"] / rows[0]["vs torch"]
        ax.axhline(torch_gbs, color="gray", ls="--", label="torch copy_")
    ax.set_xlabel(f"stages in the ring ({stage_bytes // 1024} KiB each)")
    ax.set_ylabel("GB/s (read + write)")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8)
    ax.set_title(f"cp.async.bulk copy, 1 GiB ({measured_on or bench.measured_on()})", fontsize=10)
    return str(save(fig, "03_bulk_stages"))
