"""Where the A16 twin's first cluster form (2 CTAs sharing the converted B through per-thread st.shared::cluster stores
and cluster-scope barriers) spent its time: one variant per process, each patching one of the kernel module's PTX
wrappers before it compiles, timed over 20 back-to-back calls (pre-pass and main kernel) with CUDA events.

    python benchmarks/a16_cluster_probe.py VARIANT [M N K]      (default 1024 4096 7168; tile_n 128)

VARIANT: ``base1`` (one CTA), ``cl`` (the cluster form as built). With the first design (commit 4594d43), ``cl`` plus
any of ``ctawait`` (waits acquire at
CTA scope), ``ctafence`` (the proxy fence at CTA scope), ``arrcta`` (remote arrives with the default semantics,
release at CTA scope), ``nostore`` (no remote stores: wrong results, the stores' cost), ``fast`` (ctawait + ctafence +
arrcta), ``s3`` (``cl_s3``: 3 A stages). A variant that weakens what correctness needs says ``correct=False`` when the
GPU shows it. Results: ``results/nvidia-h100-80gb-hbm3/dual_gemm_a16_cluster_probe.txt``.
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import torch
from gemmlab import nvfp4 as fp4
from gemmlab.family.configs import A16Config, a16_max_stages
from gemmlab.kernels import dual_gemm_sm90_a16 as d

v = sys.argv[1]
if v not in ("base1", "cl"):
    # the variants patched the first design's wrappers (st_cluster_v4, arrive_cluster, wait_cluster), which the bulk-copy
    # design replaced: check out commit 4594d43 to run them
    sys.exit(f"VARIANT must be base1 or cl with this kernel (the other variants need commit 4594d43); got {v!r}")
m, n, k = (int(x) for x in sys.argv[2:5]) if len(sys.argv) > 4 else (1024, 4096, 7168)
tn = 128
cfg = A16Config(tn, a16_max_stages(tn)) if v == "base1" else A16Config(tn, a16_max_stages(tn, 2), cluster_m=2)
ops = fp4.generate(m, n, k, seed=5, device="cuda")
ref = fp4.reference(*ops.inputs())
out = d.gated_dual_gemm_a16(*ops.inputs(), cfg=cfg)
torch.cuda.synchronize()
ok = fp4.check_close(out, ref).ok
for _ in range(3):
    d.gated_dual_gemm_a16(*ops.inputs(), out=out, cfg=cfg)
s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
s.record()
for _ in range(20):
    d.gated_dual_gemm_a16(*ops.inputs(), out=out, cfg=cfg)
e.record(); torch.cuda.synchronize()
print(f"RESULT {v:<14} {m}x{n}x{k} {cfg!r}: {s.elapsed_time(e) / 20 * 1e3:8.1f} us/call  correct={ok}", flush=True)
