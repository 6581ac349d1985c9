import sys, os, traceback
import torch
import cutlass, cutlass.cute as cute
import cuda.bindings.driver as cuda
from cutlass import Int32
from cutlass.cute.runtime import from_dlpack
print("stream handle", torch.cuda.current_stream().cuda_stream)
x = torch.arange(1024, dtype=torch.int32, device="cuda"); y = torch.zeros_like(x)

@cute.kernel
def k(src: cute.Tensor, dst: cute.Tensor):
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    dst[bidx * 128 + tidx] = src[bidx * 128 + tidx]

@cute.jit
def h1(src: cute.Tensor, dst: cute.Tensor):
    k(src, dst).launch(grid=(8, 1, 1), block=(128, 1, 1))

@cute.jit
def h2(src: cute.Tensor, dst: cute.Tensor, stream: cuda.CUstream):
    k(src, dst).launch(grid=(8, 1, 1), block=(128, 1, 1), stream=stream)

@cute.jit
def h3(src: cute.Tensor, dst: cute.Tensor, stream: cuda.CUstream):
    k(src, dst).launch(grid=(cute.size(src) // 128, 1, 1), block=(128, 1, 1), stream=stream)

for name, fn, extra in [("h1", h1, []), ("h2", h2, [cuda.CUstream(torch.cuda.current_stream().cuda_stream)]),
                        ("h2-new-stream", h2, [cuda.CUstream(torch.cuda.Stream().cuda_stream)]), ("h3", h3, [cuda.CUstream(0)])]:
    y.zero_()
    try:
        fn(from_dlpack(x), from_dlpack(y), *extra)  # jit call compiles+runs
        torch.cuda.synchronize(); print(name, "ok", torch.equal(x, y))
    except Exception as e:
        print(name, "FAILED", repr(e)[:1500])
for opt in ["--gpu-arch sm_90a", ""]:
    try:
        c = cute.compile(h1, from_dlpack(x), from_dlpack(y), options=opt)
        y.zero_(); c(from_dlpack(x), from_dlpack(y)); torch.cuda.synchronize(); print("compiled", opt, torch.equal(x,y))
    except Exception as e:
        print("compiled", opt, "FAILED", repr(e)[:800])
