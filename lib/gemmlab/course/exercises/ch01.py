"""Chapter 01's exercises (loads and stores, ldmatrix, shared-memory banks): checkers and worked solutions."""
from __future__ import annotations

from . import verdict


def check_v2_stride2(answer) -> bool:
    """Predict, then run: wavefronts of a warp's 8-byte shared loads, lane ``i`` at byte ``16 * i``."""
    return verdict("8-byte loads, 16 bytes apart", answer, solution_v2_stride2(),
                   "8-byte accesses are served 16 lanes per phase (two phases). Within a phase, count how many "
                   "different words each bank must supply; add the phases (banks.wavefronts).")


def solution_v2_stride2():
    from ...banks import strided_addresses, wavefronts

    # Lane i touches words 4i and 4i + 1; 16 lanes cover banks 0, 1, 4, 5, ... twice each: 2 per phase, 2 phases.
    return wavefronts(strided_addresses(2, 8), 8)  # 4


def check_pad_by_two(answer) -> bool:
    """Break it, then explain: conflict degree of reading one column of a 32 x 32 float tile whose rows are padded to 34 words."""
    return verdict("rows of 34 words", answer, solution_pad_by_two(),
                   "Lane i reads word 34 * i, in bank (34 * i) % 32 = (2 * i) % 32: how many lanes share each bank? "
                   "The degree of a stride s is gcd(s, 32).")


def solution_pad_by_two():
    from ...banks import conflict_degree

    return int(conflict_degree([34 * 4 * lane for lane in range(32)], 4))  # gcd(34, 32) = 2


def explain_pad_by_two() -> str:
    """Why rows of 34 words give a 2-way conflict and why an odd row length is the rule."""
    return ("Lane i reads word 34 i, in bank (34 i) % 32 = (2 i) % 32: only the 16 even banks are used, each by "
            "two lanes (i and i + 16) reading different words, so the column takes 2 wavefronts: a 2-way "
            "conflict. In general lane i of a stride-s column is in bank (s i) % 32, and the lanes spread over "
            "32 / gcd(s, 32) banks: the degree is gcd(s, 32). An odd row length is coprime with 32, so "
            "gcd = 1 and all 32 lanes hit different banks; any even length shares at least the factor 2.")


def check_ldmatrix_trans(answer) -> bool:
    """Predict: with ``ldmatrix .x1.trans``, which ``(row, col)`` of the 8 x 8 matrix is in the low half of lane 13's register?"""
    return verdict("ldmatrix .trans, lane 13", answer, solution_ldmatrix_trans(),
                   "With .trans lane l gets column l // 4, rows 2 * (l % 4) (low half) and 2 * (l % 4) + 1 (high half); "
                   "answer as (row, col).")


def solution_ldmatrix_trans():
    from ...ldmatrix import fragment_position

    return tuple(int(v) for v in fragment_position(13, 0, True))  # (2, 3)
