"""Chapter 03's exercises (cp.async, bulk copies, the async proxy): checkers and worked solutions."""
from __future__ import annotations

from . import verdict


def check_missing_fence(answer) -> bool:
    """Break it, then explain: compile ``fenced_store_kernel`` with ``with_fence=False``. Which PTX instruction is gone?"""
    return verdict("the instruction with_fence=False removes", answer, solution_missing_fence(),
                   "Compare ptx_opcodes of async_copy.compile_fenced_store('sm_90a', fence=True) and fence=False; "
                   "answer the instruction name as the PTX spells it, without the semicolon.")


def solution_missing_fence():
    from ...async_copy import compile_fenced_store
    from ...compile import ptx_opcodes

    with_fence = ptx_opcodes(compile_fenced_store("sm_90a", fence=True), r".")
    without = set(ptx_opcodes(compile_fenced_store("sm_90a", fence=False), r"."))
    (gone,) = [op for op in with_fence if op not in without]
    return gone.rstrip(";")  # fence.proxy.async.shared::cta


def explain_missing_fence() -> str:
    """Why the barrier after the threads' writes is not enough for the bulk store."""
    return ("fence.proxy.async.shared::cta disappears. The threads wrote shared memory with st.shared, through "
            "the generic proxy; the bulk store reads it through the async proxy. bar.sync orders the threads "
            "with each other: after it every thread's writes are visible to the other threads, which also use "
            "the generic proxy. The PTX memory model does not extend that ordering to the async proxy: without "
            "the fence the copy engine may read the bytes from before the writes. Each writing thread must "
            "fence after its writes, then the CTA synchronises, then one thread issues the copy.")


def check_kib_loading(answer) -> bool:
    """Count: KiB that the bulk copy keeps loading per SM with 6 stages of 16 KiB and 2 CTAs per SM."""
    return verdict("KiB loading per SM", answer, solution_kib_loading(),
                   "Each CTA's loop keeps stages - 1 chunks loading (one stage is being stored); multiply by the "
                   "stage size and by the CTAs on one SM.")


def solution_kib_loading():
    return (6 - 1) * 16 * 2  # 160, the last row of the stage sweep


def check_stages_per_cta(answer) -> bool:
    """Count: how many 16 KiB stages fit in the shared memory one CTA may use on an H100 or H200 (ignore the barriers)."""
    return verdict("16 KiB stages in one CTA", answer, solution_stages_per_cta(),
                   "One block may opt in to 227 KiB of the SM's 228 KiB (hardware.SMEM_PER_BLOCK); that is also the "
                   "most one bulk copy could ever write into one CTA's shared memory.")


def solution_stages_per_cta():
    from ...hardware import SMEM_PER_BLOCK

    return SMEM_PER_BLOCK // (16 * 1024)  # 227 // 16 = 14
