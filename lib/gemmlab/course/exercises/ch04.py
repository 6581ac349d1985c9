"""Chapter 04's exercises (tensor maps, swizzle, CuTe layouts): checkers and worked solutions."""
from __future__ import annotations

from . import verdict


def check_swizzle_64b(answer) -> bool:
    """Predict, then run: the physical byte offset of logical byte 300 of a tile stored with the 64B swizzle."""
    return verdict("64B swizzle of byte 300", answer, solution_swizzle_64b(),
                   "300 = line 2 (bytes 256-383), chunk 2, byte 12 of the chunk. 64B XORs the chunk index with the "
                   "low 2 bits of the line index (swizzle.swizzle_offset).")


def solution_swizzle_64b():
    from ...swizzle import swizzle_offset

    return int(swizzle_offset("64B", 300))  # chunk 2 ^ 2 = 0: 256 + 12 = 268


def check_unswizzled_64b_rows(answer) -> bool:
    """Break it, then explain: ways of the bank conflict when 8 threads read chunk 0 of 8 consecutive 64-byte rows, unswizzled."""
    return verdict("64-byte rows without swizzle", answer, solution_unswizzled_64b_rows(),
                   "Two 64-byte rows share one 128-byte line, so chunk 0 of the 8 rows falls in bank groups 0 and 4 "
                   "only (swizzle.column_read_ways).")


def solution_unswizzled_64b_rows():
    from ...swizzle import column_read_ways

    return column_read_ways("none", 64, chunk=0)  # 4


def explain_unswizzled_64b_rows() -> str:
    """Which swizzle removes the conflict of 64-byte rows, and why not the 128B one."""
    return ("Unswizzled, two 64-byte rows share each 128-byte line, so chunk 0 of rows 0..7 lies at bytes "
            "0, 64, 128, ...: bank groups 0, 4, 0, 4, ..., four rows on each: 4-way. The 64B swizzle, whose "
            "span is the row length, XORs the chunk index with two bits of the line index, so chunk 0 of the "
            "8 rows lands in 8 different bank groups: conflict-free, with no byte wasted. The 128B swizzle "
            "would also read conflict-free, but its span is 128 bytes: TMA gives every 64-byte row a whole "
            "128-byte line (swizzle.row_pitch('128B', 64) == 128), so the tile takes twice its bytes of shared "
            "memory (swizzle.smem_bytes), and a buffer sized by the tile's bytes overflows. Pick the swizzle "
            "whose span equals the row.")


def check_local_tile_element(answer) -> bool:
    """Predict: ``local_tile(coords, (128, 64), (1, None))`` of a 256 x 512 coordinate tensor; which coordinate is element ``(5, 3, 2)``?"""
    return verdict("an element of a local tile", answer, solution_local_tile_element(),
                   "(1, None) picks row-tile 1 and keeps every column tile: the result is (128, 64, 8). Element "
                   "(i, j, t) is row 128 * 1 + i, column 64 * t + j. Answer (row, col).")


def solution_local_tile_element():
    from ...layouts import algebra_examples

    text = algebra_examples()["local_tile(...)[(5, 3, 2)]"]  # "(133, 131)", printed by CuTe
    return tuple(int(v) for v in text.strip("()").split(","))


def check_partial_box_bytes(answer) -> bool:
    """Predict: how many bytes does a TMA load of a 64 x 64 fp16 box announce on its mbarrier when only 36 x 8 of it lie inside the tensor?"""
    return verdict("expect_tx of a partial box", answer, solution_partial_box_bytes(),
                   "The copy engine completes the whole box, zero-filled outside the tensor "
                   "(tma.describe_tensor_map(...)['expect_tx_bytes']).")


def solution_partial_box_bytes():
    import torch

    from ...tma import describe_tensor_map

    return describe_tensor_map((100, 72), torch.float16, box=(64, 64), swizzle="none")["expect_tx_bytes"]  # 8192
