import time, sys, os
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
import torch
import cutlass, cutlass.cute as cute
import cuda.bindings.driver as cuda
from cutlass import Int32, Uint32
from cutlass.cute.runtime import from_dlpack
from gemmlab.compile import compile_for, fake_tensor, fake_stream, ptx_lines, current_stream
from gemmlab.tiers import detect_tier
from gemmlab.bench import time_ms
print("tier", detect_tier(), torch.cuda.get_device_name(0), torch.__version__, cutlass.__version__)

@cute.kernel
def k(src: cute.Tensor, dst: cute.Tensor):
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    i = (bidx * 256 + tidx) * 4
    a,b,c,d = cute.arch.inline_ptx("ld.global.v4.u32 {{$w0}, {$w1}, {$w2}, {$w3}}, [{$r0}];", write_only_types=[Uint32]*4, read_only_args=[src.iterator + i])
    cute.arch.inline_ptx("st.global.v4.u32 [{$r0}], {{$r1}, {$r2}, {$r3}, {$r4}};", read_only_args=[dst.iterator + i, a,b,c,d])

@cute.jit
def host(src: cute.Tensor, dst: cute.Tensor, stream: cuda.CUstream):
    n = cute.size(src)
    k(src, dst).launch(grid=(n // 1024, 1, 1), block=(256, 1, 1), stream=stream)

n = cute.sym_int(divisibility=1024)
t0 = time.time()
c = compile_for("sm_90a", host, fake_tensor(cutlass.Uint32,(n,)), fake_tensor(cutlass.Uint32,(n,)), fake_stream())
print("compile s", time.time()-t0)
N = 1 << 28  # 1 GiB of uint32
x = torch.randint(-2**31, 2**31-1, (N,), dtype=torch.int32, device="cuda").view(torch.uint32) if hasattr(torch,'uint32') else None
y = torch.full_like(x, 7)
def run():
    c(from_dlpack(x, assumed_align=16), from_dlpack(y, assumed_align=16), current_stream())
for variant in ["small", "direct"]:
    try:
        if variant == "small":
            xx = x[:1<<20]; yy = y[:1<<20]
            c(from_dlpack(xx, assumed_align=16), from_dlpack(yy, assumed_align=16), current_stream()); torch.cuda.synchronize(); print("small ok", torch.equal(xx, yy))
        else:
            xi = x.view(torch.int32); yi = y.view(torch.int32)
            c2 = cute.compile(host, from_dlpack(xi, assumed_align=16).mark_layout_dynamic(), from_dlpack(yi, assumed_align=16).mark_layout_dynamic(), current_stream())
            c2(from_dlpack(xi, assumed_align=16), from_dlpack(yi, assumed_align=16), current_stream()); torch.cuda.synchronize(); print("direct ok", torch.equal(xi, yi))
    except Exception as e:
        print(variant, "FAILED", str(e)[:300])
run(); torch.cuda.synchronize()
print("equal", torch.equal(x, y))
xs = from_dlpack(x, assumed_align=16); ys = from_dlpack(y, assumed_align=16); st = current_stream()
ms = time_ms(lambda: c(xs, ys, st))
ms_t = time_ms(lambda: y.copy_(x))
t0=time.time(); 
for _ in range(100): from_dlpack(x, assumed_align=16)
print("from_dlpack us", (time.time()-t0)*1e4)
print(f"v4 copy {2*N*4/ms/1e6:.0f} GB/s, torch {2*N*4/ms_t/1e6:.0f} GB/s ratio {ms_t/ms:.3f}")
os.system("which nvdisasm cuobjdump ncu compute-sanitizer; nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv")
try:
    print("sass", (c.__sass__ or "")[:200])
except Exception as e: print("sass err", e)
