"""Chapter 06's exercises (wgmma, descriptors, the accumulator fragment): checkers and worked solutions."""
from __future__ import annotations

from . import verdict


def check_descriptor(answer) -> bool:
    """Predict: the 64-bit descriptor of k16 slice 2 of a 128 x 64 BF16 tile (K-major, 128B swizzle) at shared address 0x4000."""
    return verdict("descriptor of k16 slice 2", answer, solution_descriptor(),
                   "Start address (0x4000 + 2 * 32) >> 4 in bits 0-13, LBO 16 >> 4 in bits 16-29, SBO 1024 >> 4 in "
                   "bits 32-45, swizzle code 1 (128B) in bits 62-63 (wgmma.encode_smem_desc). Answer an int.")


def solution_descriptor():
    from ...wgmma import encode_smem_desc

    return encode_smem_desc(0x4000 + 2 * 32, 16, 1024, "128B")  # 0x4000004000010404


def check_acc_element(answer) -> bool:
    """Predict: which ``(row, col)`` of the 64 x 128 accumulator does thread 37 hold in register 5?"""
    return verdict("thread 37, register 5", answer, solution_acc_element(),
                   "Warp w = 37 // 32, lane l = 37 % 32; row = 16w + l // 4 + 8 * ((r // 2) % 2), "
                   "col = 8 * (r // 4) + 2 * (l % 4) + r % 2 (wgmma.acc_coord).")


def solution_acc_element():
    from ...wgmma import acc_coord

    return tuple(int(v) for v in acc_coord(37, 5, 128))  # (17, 11)


def check_fence_points(answer) -> bool:
    """Which of these places does the PTX ISA require a ``wgmma.fence`` at? Answer the letters, e.g. ``"bd"``.

    a. before the first ``wgmma.mma_async`` of the warpgroup;
    b. between k-tile k's wgmmas and k-tile k + 1's, when only wgmmas of the same shape touch the accumulator;
    c. after the threads have zeroed (or read) the accumulator registers, before the next wgmma that uses them;
    d. after a TMA load has filled a stage (and the mbarrier wait saw it), before a wgmma reads that stage.
    """
    if isinstance(answer, (str, set, frozenset, list, tuple)):  # "ac", "a, c", "a;c", ["c", "a"]: the letters
        answer = "".join(sorted({ch for x in answer if isinstance(x, str) for ch in x.lower() if ch.isalpha()}))
    return verdict("where wgmma.fence is required", answer, solution_fence_points(),
                   "wgmma.fence orders *register* accesses (the accumulator, A fragments in registers) against "
                   "wgmma; accumulations of the same shape into the same registers are ordered by default; "
                   "shared memory written by the async proxy (TMA) is ordered by the mbarrier, and only generic "
                   "writes need fence.proxy.async.")


def solution_fence_points():
    return "ac"


def check_one_warpgroup_128x256(answer) -> bool:
    """Break it, then explain: FP32 accumulator registers per thread if one warpgroup computed a 128 x 256 tile."""
    return verdict("a 128 x 256 tile on one warpgroup", answer, solution_one_warpgroup_128x256(),
                   "Two m64n256 blocks, each 64 * 256 / 128 FP32 registers per thread; a thread has at most 255 "
                   "registers in all.")


def solution_one_warpgroup_128x256():
    return 2 * 64 * 256 // 128  # 256: more than a thread can hold, hence chapter 07's two consumer warpgroups


def explain_one_warpgroup_128x256() -> str:
    """Why one warpgroup cannot hold a 128 x 256 FP32 accumulator."""
    return ("A 128 x 256 FP32 accumulator is 32768 values; a warpgroup has 128 threads, so each would hold 256 "
            "of them in registers (two m64n256 blocks of 128 each). A thread can address at most 255 registers, "
            "and it also needs registers for addresses, loop counters and the epilogue: it cannot be done. 64 x "
            "256 and 128 x 128 need 128 accumulator registers per thread. Chapter 07 gets the 128 x 256 tile by "
            "giving it two consumer warpgroups, 64 rows (128 registers per thread) each.")
