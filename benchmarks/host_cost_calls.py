"""Host microseconds per call of the four public calls on tiny shapes (run on an H100/H200 at both commits).

    PYTHONPATH=<checkout>/lib python benchmarks/host_cost_calls.py

Works before and after the issue-25 redesign (base 270922b) (the public calls are gemmlab.gemm, grouped_gemm, grouped_gemm_list,
gated_dual_gemm at both; the harness is gemmlab.bench or gemmlab.measure.bench).
"""
import functools

import torch

import gemmlab
from gemmlab import nvfp4 as fp4

try:
    from gemmlab.measure.bench import host_us
except ImportError:
    from gemmlab.bench import host_us

dev = "cuda"
a = torch.randn(128, 1024, device=dev, dtype=torch.bfloat16)
b = torch.randn(1024, 1024, device=dev, dtype=torch.bfloat16)
c = torch.empty(128, 1024, device=dev, dtype=torch.bfloat16)

sizes = [16, 0, 40, 8] * 2  # 8 experts, 128 tokens
ga = torch.randn(sum(sizes), 512, device=dev, dtype=torch.bfloat16)
gb = torch.randn(len(sizes), 256, 512, device=dev, dtype=torch.bfloat16).transpose(1, 2)
offs = torch.tensor(torch.tensor(sizes).cumsum(0).tolist(), dtype=torch.int32, device=dev)
gc = torch.empty(sum(sizes), 256, device=dev, dtype=torch.bfloat16)

pairs = [(torch.randn(m, 256, device=dev, dtype=torch.bfloat16),
          torch.randn(256, 256, device=dev, dtype=torch.bfloat16)) for m in (64, 0, 32, 128)]
outs = [torch.empty(x.shape[0], w.shape[1], device=dev, dtype=torch.bfloat16) for x, w in pairs]

ops = fp4.generate(128, 256, 512, seed=1, device=dev)

calls = {
    "gemm": functools.partial(gemmlab.gemm, a, b, c),
    # validate=False: the call as it was measured before (270922b read offs back by default: a wait, not a host cost)
    "grouped_gemm validate=False": functools.partial(gemmlab.grouped_gemm, ga, gb, offs, gc, validate=False),
    "grouped_gemm_list": functools.partial(gemmlab.grouped_gemm_list, pairs, outs),
    "gated_dual_gemm": functools.partial(gemmlab.gated_dual_gemm, *ops.inputs(), out=ops.c),
}
for fn in calls.values():  # compile and make the plans first
    fn()
torch.cuda.synchronize()
for name, us in host_us(calls, per_round=100).items():
    print(f"{name:>28}: {us:6.1f} us per call")
base = {"torch.matmul": functools.partial(torch.matmul, a, b, out=c)}
if hasattr(torch, "_grouped_mm"):
    base["torch._grouped_mm"] = functools.partial(torch._grouped_mm, ga, gb, offs=offs)
for fn in base.values():
    fn()
torch.cuda.synchronize()
for name, us in host_us(base, per_round=100).items():
    print(f"{name:>28}: {us:6.1f} us per call (baseline)")
