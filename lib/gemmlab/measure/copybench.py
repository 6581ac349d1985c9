"""Device-to-device copy benchmark: our copy kernels against torch's own copy.

Used by notebooks 01 and 03 and by ``benchmarks/run.py``. Every kernel is timed
side by side with ``dst.copy_(src)`` in the same run, on a buffer far larger
than L2 (1 GiB by default against 50-60 MB of L2 on H100/H200), after checking
on fresh random data, with the output poisoned first, that it copies correctly.

Bandwidth counts bytes read plus bytes written (2 x size), the convention of
the device-to-device copy that torch reports.
"""
from __future__ import annotations

from typing import Callable

from .bench import copy_bandwidth_gbs, device_name, format_table, time_ms, write_results

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
