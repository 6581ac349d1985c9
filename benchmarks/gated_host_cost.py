"""Host microseconds per call of ``gemmlab.gated_dual_gemm`` (issue 29's first goal: no more than torch's per-call
cost of the stock path's GEMM), with its parts, on a GPU machine:

    PYTHONPATH=lib python benchmarks/gated_host_cost.py [--out DIR]

* the public call with the same tensors every call (a benchmark loop), with the weights kept but fresh
  activations, scales and outputs each call (an inference loop: a pool of four sets, cycled), and with
  ``out=None`` (the call allocates);
* the plan's kernel alone on pointers read once (this design's floor: the compiled host function takes the inputs'
  data pointers and ``out`` itself), and the tensor-taking compile of the same kernel called with the seven 2-D
  views made every call (the design before the pointers);
* torch's stock path at the same shape: its one GEMM (``torch.matmul`` of BF16 A and [B1; B2] into a preallocated
  output) and the whole path (GEMM, then silu * mul).

The GPU is kept busy while the host enqueues (:func:`gemmlab.measure.bench.host_us`), so these are host costs.
Writes ``results/<device>/gated_host_cost.json`` and prints a table.
"""
import argparse
import functools

import torch

import gemmlab
from gemmlab import nvfp4 as fp4
from gemmlab.family import api, plan
from gemmlab.kernels.dual_gemm_sm90 import operands_2d
from gemmlab.kernels.dual_gemm_sm90_pipelined import compile_pipelined
from gemmlab.measure import bench

SHAPES = [(128, 256, 512), (256, 3072, 4096)]  # tiny (host-bound) and GPU MODE's smallest benchmark shape


def calls_for(m, n, k):
    dev = "cuda"
    ops = fp4.generate(m, n, k, seed=1, device=dev)
    a, b1, b2, sfa, sfb1, sfb2 = ops.inputs()
    pool = [fp4.generate(m, n, k, seed=2 + i, device=dev) for i in range(4)]
    outs = [torch.empty(m, n, 1, dtype=torch.float16, device=dev) for _ in pool]
    step = iter(range(10 ** 9))

    def fresh():
        i = next(step) % len(pool)
        return gemmlab.gated_dual_gemm(pool[i].a, b1, b2, pool[i].sfa, sfb1, sfb2, out=outs[i])

    gemmlab.gated_dual_gemm(a, b1, b2, sfa, sfb1, sfb2, out=ops.c)  # compile, make the plan
    p = next(q for q in api.gated_plans() if (q.problem.m, q.problem.n, q.problem.k) == (m, n, k))
    a16 = torch.randn(m, k, dtype=torch.bfloat16, device=dev)
    w16 = torch.randn(k, 2 * n, dtype=torch.bfloat16, device=dev)
    h = torch.empty(m, 2 * n, dtype=torch.bfloat16, device=dev)

    fn_views = plan.raw_function(compile_pipelined("sm_90a", p.config, m, n, k, tvm_ffi=True))
    ptrs = [t.data_ptr() for t in (a, b1, b2, sfa, sfb1, sfb2)]

    def stock_path():
        torch.matmul(a16, w16, out=h)
        g, u = h.split(n, dim=1)
        return torch.nn.functional.silu(g) * u

    return {
        "gated_dual_gemm, same tensors": functools.partial(gemmlab.gated_dual_gemm, a, b1, b2, sfa, sfb1, sfb2,
                                                           out=ops.c),
        "gated_dual_gemm, fresh a/sfa/out": fresh,
        "gated_dual_gemm, out=None": functools.partial(gemmlab.gated_dual_gemm, a, b1, b2, sfa, sfb1, sfb2),
        "kernel alone (pointers read once)": lambda: p.fn(*ptrs, ops.c),
        "tensor-taking kernel, 2-D views every call": lambda: fn_views(*operands_2d(a, b1, b2, sfa, sfb1, sfb2,
                                                                                     ops.c)),
        "stock: torch.matmul (its GEMM)": functools.partial(torch.matmul, a16, w16, out=h),
        "stock: whole path": stock_path,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=None, help="results folder (default results/<device>/)")
    args = ap.parse_args()
    rows = []
    for m, n, k in SHAPES:
        for name, us in bench.host_us(calls_for(m, n, k), per_round=100).items():
            rows.append({"m": m, "n": n, "k": k, "call": name, "host_us": round(us, 2)})
    path = bench.write_results("gated_host_cost", rows, out_dir=args.out,
                               method="gemmlab.measure.bench.host_us: median of 7 rounds of 100 calls, the GPU kept "
                                      "busy (torch.cuda._sleep) so the host clock measures enqueueing only")
    print(f"wrote {path}")
    for r in rows:
        print(f"{r['m']:>5}x{r['n']:<5}x{r['k']:<5} {r['call']:>36}: {r['host_us']:7.1f} us")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
