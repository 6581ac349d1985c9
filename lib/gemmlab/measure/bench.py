"""The course's one timing harness, and where benchmark results are written.

Rules every chapter follows: warm up first, time each repetition with CUDA
events, report the median, and always time the baseline (torch's own copy or
cuBLAS) side by side in the same run. Results are written as JSON under
``results/<device>/`` with the device name inside.

* :func:`time_ms`: the median of one launch, alone.
* :func:`time_interleaved`: several competitors in rotating rounds on the same
  rotated input sets (:func:`input_sets` spans a multiple of L2), so a clock
  drop under the power cap hits all alike. Chapters 07 and 10 use it (chapter 05 times one
  kernel at a time with :func:`time_ms`).
* :func:`host_us`: the CPU time one call costs (Python, argument conversion,
  the driver's launch), measured while the GPU is kept busy.
* :func:`gpu_clocks`: SM clock, temperature and power, stored with results.
* :func:`measured_ceilings`: this GPU's two ceilings, measured in the run that
  uses them (a large device-to-device copy, a large cuBLAS GEMM): datasheet
  rates are leads, these are what a roofline should be drawn with.
"""
from __future__ import annotations

import json
import os
import platform
import re
import statistics
import time
from pathlib import Path

from ..figures import REPO_ROOT

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


def input_sets(set_bytes: int, l2_bytes: int, *, l2_multiple: int = 4, cap: int = 16) -> int:
    """How many copies of a benchmark's inputs to rotate so that together they span ``l2_multiple`` x L2.

    One copy if a set alone is that large (then nothing of a launch's inputs is
    left in L2 by the launch before, except what any real workload would also have).
    """
    from ..checks import check_int

    check_int("set_bytes", set_bytes, lo=1)
    check_int("l2_bytes", l2_bytes, lo=1)
    return max(1, min(cap, -(-l2_multiple * l2_bytes // set_bytes)))


def time_interleaved(launches: dict, *, rounds: int = 10, per_round: int = 10, warmup: int = 5,
                     gpu_only: bool = False) -> dict:
    """Time several competitors fairly; returns ``{name: {"median_ms", "round_ms": [...]}}``.

    ``launches[name]`` is a list of zero-argument launches, one per input set
    (every competitor gets the same sets, in the same rotation). In each of
    ``rounds`` rounds every competitor runs ``per_round`` launches back to back
    (one untimed launch first, then a pair of CUDA events around the batch: an
    event per launch would add its own host cost to every call); the order of
    the competitors rotates from round to round, so drift in clocks or
    temperature hits all alike. The statistic is the same for all: the median
    over rounds of the mean time per launch. ``round_ms`` keeps each round's, to
    show the spread.

    Two questions, two modes. By default a launch whose host work outlasts the
    kernel leaves the GPU idle between the events, so this measures what a
    caller waits for in a loop: Python overhead included when the launches are
    public calls. ``gpu_only=True`` first queues ``torch.cuda._sleep`` on the
    stream, so the host enqueues the whole round before the GPU reaches it and
    the events measure the kernels alone (back to back, launch gaps included).
    """
    import torch

    names = list(launches)
    for name in names:
        for i in range(warmup):
            launches[name][i % len(launches[name])]()
    torch.cuda.synchronize()
    rounds_ms = {name: [] for name in names}
    for r in range(rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for name in order:
            fns = launches[name]
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            if gpu_only:
                # ~10 ms at up to 2 GHz: the host enqueues the whole round before the GPU reaches it, even when
                # one launch is a chain of torch operations costing hundreds of microseconds of Python
                torch.cuda._sleep(int(2e7))
            fns[r % len(fns)]()  # untimed: the switch from the other competitor
            start.record()
            for i in range(per_round):
                fns[(r + i) % len(fns)]()
            end.record()
            end.synchronize()
            rounds_ms[name].append(start.elapsed_time(end) / per_round)
    return {name: {"median_ms": statistics.median(rounds_ms[name]), "round_ms": rounds_ms[name]} for name in names}


def host_us(calls: dict, *, rounds: int = 7, per_round: int = 200, busy_ms: float = 50.0) -> dict:
    """CPU microseconds one call of each competitor costs; returns ``{name: median over rounds}``.

    The GPU is first given ``busy_ms`` of work (``torch.cuda._sleep``), so the
    calls only enqueue: the host clock then measures Python, argument
    conversion and the driver's launch, not the kernel. ``per_round`` must stay
    well under the launch queue's depth (about a thousand launches). Rounds
    rotate the order of the competitors like :func:`time_interleaved`.
    """
    import torch

    names = list(calls)
    cycles = int(busy_ms * 1e-3 * 2e9)  # at most ~2 GHz: at least busy_ms of sleeping
    for name in names:
        for _ in range(5):
            calls[name]()
    torch.cuda.synchronize()
    out = {name: [] for name in names}
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            fn = calls[name]
            torch.cuda._sleep(cycles)
            t0 = time.perf_counter()
            for _ in range(per_round):
                fn()
            out[name].append((time.perf_counter() - t0) / per_round * 1e6)
            torch.cuda.synchronize()
    return {name: statistics.median(v) for name, v in out.items()}


def gpu_clocks() -> dict | None:
    """SM clock (MHz), temperature (C) and power (W) from ``nvidia-smi``; None where it cannot be read."""
    import subprocess

    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm,temperature.gpu,power.draw",
                              "--format=csv,noheader,nounits", "-i", "0"],
                             capture_output=True, text=True, timeout=10).stdout.strip().splitlines()[0]
        sm, temp, power = (x.strip() for x in out.split(","))
        return {"sm_mhz": int(float(sm)), "temp_c": int(float(temp)), "power_w": float(power)}
    except Exception:  # no nvidia-smi, or a field it cannot report: the table goes on without it
        return None


def measured_ceilings(*, copy_bytes: int = 1 << 30, gemm_size: int = 8192, rounds: int = 5) -> dict:
    """This GPU's memory and tensor ceilings as measured now: ``{"copy_tbs", "gemm_tflops", ...}``.

    ``copy_tbs``: torch's device-to-device copy of ``copy_bytes`` (bytes read plus bytes written, TB/s);
    ``gemm_tflops``: ``torch.matmul`` of two random BF16 ``gemm_size``-square matrices (cuBLAS). Both timed
    side by side in :func:`time_interleaved` rounds; the copy runs over two buffer pairs, each far beyond
    L2. A benchmark calls this in the same run as its kernels, so the roofline it draws belongs to the
    clocks and the memory of that machine (two H100s of one day can differ by a few percent).
    """
    import torch

    elems = copy_bytes // 2
    src = [torch.randn(elems, device="cuda", dtype=torch.bfloat16) for _ in range(2)]
    dst = [torch.empty_like(x) for x in src]
    a = torch.randn(gemm_size, gemm_size, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(gemm_size, gemm_size, device="cuda", dtype=torch.bfloat16)
    c = torch.empty(gemm_size, gemm_size, device="cuda", dtype=torch.bfloat16)
    t = time_interleaved({
        "copy": [lambda i=i: dst[i].copy_(src[i]) for i in range(2)],
        "gemm": [lambda: torch.matmul(a, b, out=c)],
    }, rounds=rounds, per_round=5, warmup=3, gpu_only=True)
    copy_ms, gemm_ms = t["copy"]["median_ms"], t["gemm"]["median_ms"]
    out = {"copy_tbs": copy_bandwidth_gbs(2 * elems * 2, copy_ms) / 1e3,
           "gemm_tflops": 2 * gemm_size ** 3 / (gemm_ms * 1e-3) / 1e12,
           "copy_bytes": copy_bytes, "gemm_size": gemm_size}
    del src, dst, a, b, c
    torch.cuda.empty_cache()
    return out


def geomean(values) -> float:
    """The geometric mean (of speed ratios: the mean that treats 2x and 0.5x symmetrically)."""
    import math

    values = list(values)
    if not values or any(not v > 0 for v in values):
        raise ValueError(f"values must be a non-empty list of positive numbers; got {values!r}")
    return math.exp(sum(math.log(v) for v in values) / len(values))


def line_fit(points) -> tuple[float, float]:
    """Least squares ``y = intercept + slope * x`` through ``[(x, y), ...]`` (two distinct x at least)."""
    pts = list(points)
    if len({x for x, _ in pts}) < 2:
        raise ValueError(f"points must hold at least two distinct x values; got {pts!r}")
    n = len(pts)
    mx = sum(x for x, _ in pts) / n
    my = sum(y for _, y in pts) / n
    slope = sum((x - mx) * (y - my) for x, y in pts) / sum((x - mx) ** 2 for x, _ in pts)
    return my - slope * mx, slope


def device_name() -> str:
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"


def measured_on(doc: dict | None = None) -> str:
    """"<device>, <date>" for a figure that shows a measurement.

    ``doc``: a stored result (:func:`load_results`), whose device and date it names; None: this
    machine's GPU and today (a figure drawn right after measuring).
    """
    if doc is not None:
        return f"{doc['device']}, {str(doc['date'])[:10]}"
    return f"{device_name()}, {time.strftime('%Y-%m-%d')}"


def device_slug(name: str | None = None) -> str:
    name = name or device_name()
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def copy_bandwidth_gbs(nbytes_moved: int, ms: float) -> float:
    """GB/s (1e9 bytes/s) counting every byte read plus every byte written."""
    return nbytes_moved / (ms * 1e-3) / 1e9


def write_results(name: str, rows: list[dict], *, out_dir=None, **meta) -> Path:
    """Write ``rows`` as ``results/<device-slug>/<name>.json`` (or into ``out_dir``); return the path.

    ``out_dir``: a folder to write to instead, e.g. a lent GPU machine's ``$OUT``
    (the benchmarks' ``--out``); the file is the same.
    """
    import torch

    dev = device_name()
    out_dir = Path(out_dir) if out_dir else RESULTS_DIR / device_slug(dev)
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
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")  # written whole, then renamed: never half a file
    try:
        tmp.write_text(json.dumps(doc, indent=2) + "\n")
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    return path


def write_doc(name: str, doc: dict, out_dir=None) -> Path:
    """:func:`write_results` for a whole document: its ``rows`` and the rest as metadata."""
    doc = dict(doc)
    rows = doc.pop("rows", [])
    return write_results(name, rows, out_dir=out_dir, **doc)


def load_results(name: str, device: str | None = None) -> dict | None:
    """The stored results of benchmark ``name`` for ``device`` (default: the first found)."""
    if device:
        p = RESULTS_DIR / device_slug(device) / f"{name}.json"
        return json.loads(p.read_text()) if p.exists() else None
    for p in sorted(RESULTS_DIR.glob(f"*/{name}.json")):
        return json.loads(p.read_text())
    return None
