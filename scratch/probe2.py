import sys, os, traceback
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
import torch
import cutlass, cutlass.cute as cute
import cuda.bindings.driver as cuda
from cutlass import Int32, Uint32
from cutlass.cute.runtime import from_dlpack
from gemmlab.compile import compile_for, fake_tensor, fake_stream, current_stream

@cute.kernel
def kp(src: cute.Tensor, dst: cute.Tensor):
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    i = (bidx * 256 + tidx) * 4
    a,b,c,d = cute.arch.inline_ptx("ld.global.v4.u32 {{$w0}, {$w1}, {$w2}, {$w3}}, [{$r0}];", write_only_types=[Uint32]*4, read_only_args=[src.iterator + i])
    cute.arch.inline_ptx("st.global.v4.u32 [{$r0}], {{$r1}, {$r2}, {$r3}, {$r4}};", read_only_args=[dst.iterator + i, a,b,c,d])

@cute.kernel
def kn(src: cute.Tensor, dst: cute.Tensor):
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    i = (bidx * 256 + tidx) * 4
    for j in cutlass.range_constexpr(4):
        dst[i + j] = src[i + j]

def mk(kern, const_grid):
    @cute.jit
    def host(src: cute.Tensor, dst: cute.Tensor, stream: cuda.CUstream):
        n = cute.size(src)
        if cutlass.const_expr(const_grid):
            kern(src, dst).launch(grid=(4, 1, 1), block=(256, 1, 1), stream=stream)
        else:
            kern(src, dst).launch(grid=(n // 1024, 1, 1), block=(256, 1, 1), stream=stream)
    return host

x = torch.arange(4096, dtype=torch.int32, device="cuda"); y = torch.zeros_like(x)
for kname, kern in [("ptx", kp), ("noptx", kn)]:
    for cg in [True, False]:
        for fake in [True, False]:
            host = mk(kern, cg)
            y.zero_()
            try:
                if fake:
                    n = cute.sym_int(divisibility=1024)
                    c = compile_for("sm_90a", host, fake_tensor(cutlass.Int32,(n,)), fake_tensor(cutlass.Int32,(n,)), fake_stream())
                else:
                    c = cute.compile(host, from_dlpack(x, assumed_align=16), from_dlpack(y, assumed_align=16), current_stream())
                c(from_dlpack(x, assumed_align=16), from_dlpack(y, assumed_align=16), current_stream())
                torch.cuda.synchronize(); print(kname, "constgrid", cg, "fake", fake, "ok", torch.equal(x, y))
            except Exception as e:
                print(kname, "constgrid", cg, "fake", fake, "FAILED", str(e).replace("\n"," | ")[-700:])
