"""Chapter 09's exercises (tcgen05, tensor memory, descriptors): checkers and worked solutions, CPU only."""
from __future__ import annotations

from . import verdict


def check_idesc(answer) -> bool:
    """Predict: the instruction descriptor (an int) of a BF16 x BF16 -> F32, K-major, M=256, N=128 pair MMA."""
    return verdict("instruction descriptor", answer, solution_idesc(),
                   "Add up the fields: D f32 = 1 at bit 4, A and B bf16 = 1 at bits 7 and 10, N >> 3 at bit 17, "
                   "M >> 4 at bit 24 (tcgen05.INSTR_DESC_FIELDS).")


def solution_idesc():
    # 1 << 4 | 1 << 7 | 1 << 10 | (128 >> 3) << 17 | (256 >> 4) << 24 = 0x10200490
    from ...tcgen05 import InstrDesc

    return InstrDesc(m=256, n=128, cta_group=2).encode()


def check_sm90_descriptor_on_sm100(answer) -> bool:
    """Break it, then explain: XOR of a Hopper K-major SW128 descriptor and the SM100 one with the same fields."""
    return verdict("Hopper descriptor on SM100", answer, solution_sm90_descriptor_on_sm100(),
                   "Encode both with start 0, LBO 16, SBO 1024, 128B swizzle (gemmlab.wgmma.encode_smem_desc and "
                   "tcgen05.SmemDesc): the swizzle bits agree (code 1 at 62-63 is code 2 at 61-63); what differs?")


def solution_sm90_descriptor_on_sm100():
    from ...tcgen05 import SmemDesc
    from ...wgmma import encode_smem_desc

    return encode_smem_desc(0, 16, 1024, "128B") ^ SmemDesc(0, 16, 1024, "128B").encode()  # 1 << 46: the version


def explain_sm90_descriptor_on_sm100() -> str:
    """Which field a Hopper descriptor gets wrong on SM100, and why the swizzle code is not it."""
    return ("The XOR is 1 << 46: the descriptor version, bits 46-47, which SM100's shared-memory descriptor "
            "requires to be 1 and Hopper's wgmma descriptor leaves 0. The swizzle fields look different but "
            "agree: Hopper puts its 2-bit code at bits 62-63 (1 = 128B), SM100 a 3-bit code at bits 61-63 "
            "(2 = 128B), and bit 61 being 0, code 2 at 61-63 is the same bits as code 1 at 62-63. What a "
            "tcgen05.mma does with a version-0 descriptor is not documented by the PTX ISA: do not rely on "
            "any particular failure; write version 1.")


def check_ld_row(answer) -> bool:
    """Predict: the accumulator row thread 7 of warp 5 receives from ``tcgen05.ld 32x32b`` (M = 128)."""
    return verdict("tcgen05.ld row", answer, solution_ld_row(),
                   "Warp w reaches TMEM lanes 32 * (w % 4) to 32 * (w % 4) + 31, one lane per thread; "
                   "an M = 128 accumulator keeps row i in lane i.")


def solution_ld_row():
    from ...tmem import accumulator_coords

    return int(accumulator_coords(warp=5, num=1, col0=0)[7, 0, 0])  # 32 * (5 % 4) + 7 = 39
