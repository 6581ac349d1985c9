"""Every benchmark of the course, in one run on this GPU; results under results/<device>/.

    python benchmarks/run.py            (make bench; part of make gpu-check)

Each benchmark times its kernels side by side with the baseline (torch's own
device-to-device copy) in the same run and writes JSON with the device name.
Copies (chapters 01, 03; bar: >= 0.85 of torch's copy for the v4 load/store
and the cp.async.bulk kernels), shared-memory bank conflicts (01), the TMA
pipeline (05; bar 0.90) and, on Hopper, the GEMM family against torch.matmul (07).
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))

from gemmlab import async_copy, banks, ldst  # noqa: E402
from gemmlab.measure import tma_pipeline  # noqa: E402
from gemmlab.measure.bench import write_results  # noqa: E402
from gemmlab.measure.copybench import copy_table, measure_copies  # noqa: E402
from gemmlab.tiers import detect_tier, require_tier  # noqa: E402

#: The kernels the issue holds to a bandwidth bar, and the bar.
COPY_BAR = 0.85
PIPE_BAR = 0.90  # chapter 05's TMA pipeline


def main() -> int:
    require_tier("gpu", "benchmarks/run.py")
    copiers = {**ldst.copiers(), **async_copy.copiers()}
    rows = measure_copies(copiers, name="copy_bandwidth")
    write_results("bank_conflicts", banks.measure_bank_conflicts())
    pipe_rows = tma_pipeline.benchmark()  # writes results/<device>/05_tma_pipeline.json
    gemm_rows = None
    if detect_tier() == "sm90":  # chapter 07's kernels are Hopper-only (wgmma)
        from gemmlab.measure.bench import host_us
        from gemmlab.measure import gemm_family as fb, gemm_tables as tables

        gemm_rows = fb.run()
        write_results("gemm_family", gemm_rows, summary=fb.summary(gemm_rows), method=fb.METHOD)
        write_results("gemm_family_host", [fb.host_cost()], method=host_us.__doc__.split("\n\n")[1].strip())
    print(copy_table(rows))
    print(copy_table(pipe_rows))
    if gemm_rows:
        print(tables.family_table(gemm_rows))
        print(fb.summary(gemm_rows))
    held = [(r, COPY_BAR) for r in rows if r["kernel"] in (ldst.BENCH_KERNEL, async_copy.BENCH_KERNEL)]
    held += [(r, PIPE_BAR) for r in pipe_rows[1:]]
    for r, bar in held:
        verdict = "meets" if r["vs torch"] >= bar else "MISSES"
        print(f"{r['kernel']}: {r['vs torch']:.3f} of torch's copy ({verdict} the {bar:.2f} bar)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
