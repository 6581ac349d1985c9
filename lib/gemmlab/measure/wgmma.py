"""Chapter 06's measurement: the first TMA + WGMMA GEMM against cuBLAS, 4096^3 BF16, in one run."""
from __future__ import annotations

from ..checks import check_int
from ..figures import format_table
from ..tiers import require_tier
from ..wgmma import prepare_gemm_nt
from .bench import device_name, time_ms, write_results


#: The configurations :func:`bench_gemm` times: (label, tile_m, tile_n, stages, inflight).
BENCH_CONFIGS = (
    ("128x128, 6 stages, wait_group 1", 128, 128, 6, 1),
    ("128x128, 6 stages, wait_group 0", 128, 128, 6, 0),
    ("128x128, 2 stages, wait_group 1", 128, 128, 2, 1),
    ("64x256, 5 stages, wait_group 1", 64, 256, 5, 1),
    ("128x64, 6 stages, wait_group 1", 128, 64, 6, 1),
)


def bench_gemm(size: int = 4096, configs=BENCH_CONFIGS, *, rep: int = 30, name: str | None = "gemm_wgmma_first"):
    """TFLOP/s of :func:`gemmlab.wgmma.gemm_nt` for each configuration and of ``torch.matmul`` (cuBLAS), in the same run.

    Square ``size``^3 BF16 problem. Each configuration is first checked
    against an FP32 reference on the same random data with a poisoned
    output. Rows: ``kernel``, ``ms``, ``TFLOP/s``, ``vs torch``, ``rel err``;
    written to ``results/<device>/<name>.json``.
    """
    import torch

    check_int("size", size, lo=256, multiple_of=256)
    require_tier("sm90", "gemmlab.measure.wgmma.bench_gemm")
    torch.manual_seed(0)
    a = torch.randn(size, size, device="cuda").to(torch.bfloat16)
    b = torch.randn(size, size, device="cuda").to(torch.bfloat16)
    ref = a.float() @ b.float().T
    flop = 2 * size ** 3
    out = torch.empty(size, size, dtype=torch.bfloat16, device="cuda")
    rows = []
    for label, tm, tn, st, inf in configs:
        run = prepare_gemm_nt(a, b, out, tile_m=tm, tile_n=tn, stages=st, inflight=inf)
        out.fill_(float("nan"))
        run()
        torch.cuda.synchronize()
        rel = ((out.float() - ref).norm() / ref.norm()).item()
        if not rel < 5e-3:
            raise AssertionError(f"{label}: relative error {rel:.2e}")
        ms = time_ms(run, rep=rep)
        rows.append({"kernel": label, "ms": ms, "TFLOP/s": flop / ms / 1e9, "rel err": rel})
    torch_ms = time_ms(lambda: torch.matmul(a, b.T, out=out), rep=rep)
    rows.append({"kernel": "torch.matmul (cuBLAS)", "ms": torch_ms, "TFLOP/s": flop / torch_ms / 1e9, "rel err": 0.0})
    for r in rows:
        r["vs torch"] = torch_ms / r["ms"]
    if name:
        write_results(name, rows, size=size, dtype="bf16", note="C = A @ B.T, A and B K-major; TFLOP/s = 2*M*N*K/time")
    return rows


def bench_table(rows) -> str:
    return f"device: {device_name()}\n" + format_table(rows, [
        ("kernel", "kernel", ""), ("ms", "ms", ".3f"), ("TFLOP/s", "TFLOP/s", ".0f"), ("vs torch", "vs torch", ".2f"),
        ("rel err", "rel. err", ".1e")])
