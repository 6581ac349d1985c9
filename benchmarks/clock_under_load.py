"""The SM clock a Hopper GPU holds *while* it runs the chapter 07 GEMM: the number the calibration needs.

    python benchmarks/clock_under_load.py        (an H100 or H200; about one minute)

The stored benchmark (``results/<device>/gemm_family.json``) read the clock once, with nvidia-smi, after each
shape's timed rounds, when the GPU may already have relaxed or throttled further. :mod:`gemmlab.measure.calibration`
therefore fits an effective tensor clock instead of reading one. This script measures the clock during the
work: for each of chapter 07's ten shapes it launches the prepared GEMM back to back for ``SECONDS``
seconds while ``nvidia-smi -lms 100`` samples the SM clock and the power, and records the median of the
samples taken while the GPU was busy, with the TFLOP/s of the same window. It writes
``results/<device>/gemm_clocks.json``, which :func:`gemmlab.measure.calibration.measured_points` reads (``held_mhz``)
so that the fitted clocks can be compared with measured ones.
"""
from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))

SECONDS = 4.0


def measure(shape, seconds: float = SECONDS) -> dict:
    import torch

    from gemmlab.family.plan import prepare

    m, n, k = shape
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, k, device="cuda", dtype=torch.bfloat16).t()
    out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    run = prepare(a, b, out)
    run()
    torch.cuda.synchronize()
    smi = subprocess.Popen(["nvidia-smi", "--query-gpu=clocks.sm,power.draw,utilization.gpu",
                            "--format=csv,noheader,nounits", "-i", "0", "-lms", "100"],
                           stdout=subprocess.PIPE, text=True)
    launches, t0 = 0, time.time()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    while time.time() - t0 < seconds:
        for _ in range(20):
            run()
        launches += 20
        torch.cuda.synchronize()
    stop.record()
    torch.cuda.synchronize()
    smi.terminate()
    samples = []
    for line in smi.stdout.read().splitlines():
        try:
            mhz, watts, util = (float(x) for x in line.split(","))
        except ValueError:
            continue
        if util >= 90:  # the GPU was busy with our launches
            samples.append((mhz, watts))
    ms = start.elapsed_time(stop)
    return {"shape": list(shape), "config": run.plan.config.name, "launches": launches, "busy_samples": len(samples),
            "held_mhz": statistics.median(s[0] for s in samples) if samples else None,
            "power_w": statistics.median(s[1] for s in samples) if samples else None,
            "tflops": 2 * m * n * k * launches / (ms * 1e-3) / 1e12}


def main() -> int:
    from gemmlab.measure.bench import write_results
    from gemmlab.measure.gemm_family import CHAPTER07_SHAPES
    from gemmlab.tiers import require_tier

    require_tier("sm90", "benchmarks/clock_under_load.py")
    rows = []
    for shape in CHAPTER07_SHAPES:
        r = measure(shape)
        print(f"{'x'.join(map(str, shape)):>16}  {r['config']:<22} held {r['held_mhz']} MHz at {r['power_w']} W, "
              f"{r['tflops']:.0f} TFLOP/s ({r['busy_samples']} samples)", flush=True)
        rows.append(r)
    path = write_results("gemm_clocks", rows, method=f"nvidia-smi -lms 100 during {SECONDS} s of back-to-back "
                         "prepared launches; median over samples with utilization >= 90 %")
    print(f"written {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
