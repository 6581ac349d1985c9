"""Every benchmark of the course, in one run on this GPU; results under results/<device>/.

    python benchmarks/run.py            (make bench; part of make gpu-check)

Each benchmark times its kernels side by side with the baseline (torch's own
device-to-device copy) in the same run and writes JSON with the device name.
The closing table is the copy benchmark: the issue's bar is >= 0.85 of torch's
copy for the v4 load/store kernel and the cp.async.bulk kernel.
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))

from gemmlab import async_copy, banks, ldst  # noqa: E402
from gemmlab.copybench import copy_table, measure_copies  # noqa: E402
from gemmlab.tiers import require_tier  # noqa: E402

#: The kernels the issue holds to a bandwidth bar, and the bar.
COPY_BAR = 0.85


def main() -> int:
    require_tier("gpu", "benchmarks/run.py")
    copiers = {**ldst.copiers(), **async_copy.copiers()}
    rows = measure_copies(copiers, name="copy_bandwidth")
    bank_rows = banks.measure_bank_conflicts()
    from gemmlab.bench import write_results

    write_results("bank_conflicts", bank_rows)
    print(copy_table(rows))
    worst = {r["kernel"]: r["vs torch"] for r in rows if r["kernel"] in (ldst.BENCH_KERNEL, async_copy.BENCH_KERNEL)}
    for k, v in worst.items():
        print(f"{k}: {v:.3f} of torch's copy ({'meets' if v >= COPY_BAR else 'MISSES'} the {COPY_BAR:.2f} bar)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
