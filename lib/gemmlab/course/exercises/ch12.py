"""Chapter 12's exercises (the emulator): checkers, worked solutions and worked explanations."""
from __future__ import annotations

from . import verdict

#: The hand-written kernel of exercise 1: lanes below 8 add 10 to their lane id, the others double it;
#: every lane then adds 1 and stores. The notebook prints it.
DIVERGE_PTX_BODY = """
    ld.param.u64 %rd1, [out];
    mov.u32 %r1, %tid.x;
    mul.wide.u32 %rd2, %r1, 4;
    add.s64 %rd3, %rd1, %rd2;
    setp.lt.u32 %p1, %r1, 8;
    @!%p1 bra BIG;
    add.u32 %r2, %r1, 10;
    bra.uni JOIN;
BIG:
    shl.b32 %r2, %r1, 1;
JOIN:
    add.u32 %r2, %r2, 1;
    st.global.u32 [%rd3], %r2;
    ret;
"""


def diverge_ptx() -> str:
    return (".version 8.7\n.target sm_90a\n.address_size 64\n"
            ".visible .entry diverge(.param .u64 out)\n{\n"
            ".reg .pred %p<2>;\n.reg .b32 %r<4>;\n.reg .b64 %rd<4>;\n" + DIVERGE_PTX_BODY + "}\n")


def check_divergent_lanes(answer):
    """Predict, then run: what do lanes 3 and 20 store?"""
    return verdict("lanes 3 and 20", answer, solution_divergent_lanes(),
                   "Follow each lane through the branch: which arm does a lane below 8 take, which one the others, "
                   "and what runs after JOIN for every lane? Answer (lane 3, lane 20).")


def solution_divergent_lanes():
    import torch

    from ...emulator.run import run_ptx

    out = torch.full((32,), -1, dtype=torch.int32)
    run_ptx(diverge_ptx(), out, block=(32, 1, 1))
    return (int(out[3]), int(out[20]))  # (14, 41)


def check_mma_count(answer):
    """Predict, then count: tcgen05.mma instructions chapter 10's kernel issues for 256 x 256 x 512 (block_n 256)."""
    return verdict("tcgen05.mma count", answer, solution_mma_count(),
                   "How many pair tiles (256 x block_n) cover the output, how many 64-wide k-blocks does K hold, and "
                   "how many K = 16 MMAs does one k-block take? Only the leader CTA of a pair issues them.")


def solution_mma_count():
    import torch

    from ...emulator.run import run_on_emulator
    from ...emulator.trace import Trace
    from ...family.configs import Sm100Config
    from ...kernels.gemm_sm100 import compile_gemm_sm100

    m = n = 256
    k = 512
    compiled = compile_gemm_sm100("sm_100a", Sm100Config(block_n=256, ab_stages=4, num_sms=2), m, n, k)
    tr = Trace()
    a = torch.randn(m, k).bfloat16()
    w = torch.randn(n, k).bfloat16()
    run_on_emulator(compiled, a, w.t(), torch.empty(m, n).bfloat16(), trace=tr)
    return sum(1 for _, _, label in tr.ops if label.startswith("tcgen05.mma"))  # 1 tile x 8 k-blocks x 4 = 32


def check_missing_fence_error(answer):
    """Break it: which error class does the emulator raise without ``fence.proxy.async`` before the TMA store?"""
    return verdict("the error without fence.proxy.async", answer, solution_missing_fence_error(),
                   "The threads wrote shared memory with st.shared (the generic proxy); the TMA store reads it "
                   "through the async proxy. Which kind of rule of the memory model is broken? Answer the class "
                   "name as a string, e.g. 'MemoryFault'.")


def solution_missing_fence_error():
    import torch

    from ... import nvfp4 as fp4
    from ...emulator import errors
    from ...emulator.inject import mutate
    from ...emulator.run import run_on_emulator
    from ...kernels.dual_gemm_sm100 import DualSm100Config, compile_dual_sm100

    m, n, k = 128, 128, 256
    compiled = compile_dual_sm100("sm_100a", DualSm100Config(tile_n=128, stages=3, num_ctas=1), m, n, k)
    ops = fp4.generate(m, n, k, seed=0)
    packed = [fp4.as_bytes(x)[..., 0].contiguous() for x in (ops.a, ops.b1, ops.b2)]
    scales = [fp4.blocked_bytes(fp4.permute_scales(x)).contiguous() for x in (ops.sfa, ops.sfb1, ops.sfb2)]
    try:
        run_on_emulator(compiled, *packed, *scales, torch.empty(m, n, dtype=torch.float16),
                        ptx=mutate(compiled.__ptx__, drop=r"^fence\.proxy\.async"))
    except errors.EmulatorError as e:
        return type(e).__name__  # 'RaceError'
    return None


def explain_missing_fence_error() -> str:
    return ("The epilogue converts the accumulator and writes it into shared memory with ordinary st.shared "
            "instructions: those writes belong to the generic proxy. The TMA store that follows reads the same "
            "bytes through the async proxy, a different path to memory with its own ordering. The PTX memory model "
            "orders the two only through a proxy fence: each writing thread executes fence.proxy.async after its "
            "writes, then the threads synchronise (a named barrier) and one thread issues the store. Without the "
            "fence nothing guarantees the TMA engine sees the new bytes rather than older ones, so on a GPU the "
            "output can silently hold stale data, some of the time. The emulator remembers which thread wrote each "
            "shared byte through the generic proxy and has not fenced it; when an async-proxy reader (a TMA store, "
            "a WGMMA or tcgen05.mma operand) touches such a byte it raises RaceError naming the writer's warp and "
            "lane and the PTX line of the store, instead of letting the race go unseen.")


def check_latest_seed(answer):
    """Explain: among seeds 0-3, which one lets asynchronous operations complete the latest?"""
    return verdict("the seed with the latest completions", answer, solution_latest_seed(),
                   "Each seed picks a latency scale for the asynchronous operations (Machine.latency): "
                   "read it for seeds 0 to 3.")


def solution_latest_seed():
    from ...emulator.machine import LATENCY_SCALES

    return max(range(4), key=lambda s: LATENCY_SCALES[s % len(LATENCY_SCALES)])  # 3: up to 16384 steps


def explain_latest_seed() -> str:
    return ("A missing wait is only wrong when the operation it should have waited for is still in flight. With "
            "seed 0 the emulator completes asynchronous operations within at most 16 warp instructions, so a kernel "
            "that forgets to wait for a TMA store's reads before overwriting the buffer usually gets away with it: "
            "the store has already read the bytes. With seed 3 an operation may wait up to 16384 warp instructions, "
            "long enough for the epilogue to overwrite the buffer first, and the output is wrong. The same is true "
            "on a GPU, where how long an operation takes depends on everything else running: a kernel that is "
            "right on one interleaving and wrong on another has a race, and running a handful of seeds (prompt to "
            "very late completions) is how the emulator looks for it.")
