"""One launch of ours and one of cuBLAS per shape, for Nsight Compute: where the GEMM family loses, and why.

    ncu --clock-control none --metrics gpu__time_duration.sum,lts__t_bytes.sum,dram__bytes_read.sum,\
sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_elapsed,lts__throughput.avg.pct_of_peak_sustained_elapsed \
        --csv python benchmarks/profile_gemm_family.py > profile.csv

Everything is compiled and warmed up first; the profiled launches are the last two of each shape
(NVTX-free: ncu sees the kernels in launch order, ours then cuBLAS's). The chapter 07 notebook reads
the summary stored under results/<device>/gemm_family_profile.json.
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))

import torch  # noqa: E402

from gemmlab.family.plan import prepare  # noqa: E402

SHAPES = ((2048, 2112, 7168), (512, 576, 7168), (1024, 7168, 16384))


def main() -> int:
    for m, n, k in SHAPES:
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(n, k, device="cuda", dtype=torch.bfloat16).t()
        c = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        run = prepare(a, b, c)
        for _ in range(3):
            run()
            torch.matmul(a, b, out=c)
        torch.cuda.synchronize()
        print(f"{m}x{n}x{k}: {run.plan.config.name}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
