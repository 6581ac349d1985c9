"""Chapter 08's exercises (the grouped GEMM, descriptors rewritten on the device): checkers and worked solutions."""
from __future__ import annotations

from . import verdict

#: The grouped problem of exercise 1: rows per group, N, tile, CTAs.
ORDER_PROBLEM = dict(m_sizes=[300, 0, 70, 520], n=512, tile_m=128, tile_n=128, grid=5)


def check_tiles_and_rewrites(answer) -> bool:
    """Predict, then run: ``(tiles in all, descriptor rewrites by CTA 0)`` for :data:`ORDER_PROBLEM`."""
    return verdict("tiles and rewrites", answer, solution_tiles_and_rewrites(),
                   "Count ceil(M / 128) x ceil(512 / 128) tiles per group (an empty group has none), number them "
                   "group after group, largest group first, M fastest; give CTA 0 tiles 0, 5, 10, ...; it rewrites "
                   "its descriptors each time its next tile lies in another group than the previous one (and for "
                   "its first).")


def solution_tiles_and_rewrites():
    # 3 x 4 + 0 + 1 x 4 + 5 x 4 = 36 tiles, largest group first: tiles 0-19 are group 3 (520 rows),
    # 20-31 group 0 (300), 32-35 group 2 (70). CTA 0 takes 0, 5, ..., 35, so it enters group 3 (tile 0),
    # group 0 (tile 20) and group 2 (tile 35).
    from ...grouped_model import descriptor_updates, tile_order

    p = ORDER_PROBLEM
    order = tile_order(p["m_sizes"], p["n"], p["tile_m"], p["tile_n"], p["grid"])
    return (sum(len(t) for t in order), descriptor_updates(**p)[0])  # (36, 3)


def check_fence_instructions(answer) -> bool:
    """Break it: which two PTX instructions vanish when the kernel is compiled with ``fences=False``?

    Answer with a set of the two instruction names up to their first operand-free dot suffixes, e.g.
    ``{"tensormap.cp_fenceproxy", "fence.proxy.tensormap::generic.acquire"}``-like strings.
    """
    if isinstance(answer, (list, tuple, set, frozenset)):  # a set of names, in any container
        answer = {a.strip().rstrip(";") if isinstance(a, str) else a for a in answer}
    return verdict("vanished instructions", answer, solution_fence_instructions(),
                   "Compare ptx_opcodes of the two compiles: the release that copies the descriptor to global "
                   "memory and the acquire before the first TMA that uses it.")


def solution_fence_instructions():
    return {"tensormap.cp_fenceproxy", "fence.proxy.tensormap::generic.acquire"}


def explain_fence_instructions() -> str:
    """What goes wrong without each of the two instructions fences=False removes."""
    return ("tensormap.cp_fenceproxy...release copies the rewritten descriptor to the CTA's global slot and "
            "makes that write visible to the tensormap proxy, the path through which the TMA unit reads "
            "descriptors. Plain stores go through the generic proxy only: the TMA unit may read the slot "
            "before the new bytes reach it, i.e. the previous group's address and sizes. "
            "fence.proxy.tensormap::generic.acquire, by the thread that issues the TMA, makes its following "
            "TMA instructions see the published bytes; without it the TMA unit may use a descriptor it cached "
            "earlier for the same slot. Either way a tile is loaded from, or stored to, another group's "
            "tensors. What happens is not defined by PTX: a run may be right by luck (section 6's broken "
            "variant reports what happened on its machine).")


def check_decode_floor_us(answer) -> bool:
    """Count the floor: 23 non-empty experts of DeepSeek-V3's gate/up (N = 4096, K = 7168, BF16) at 3.35 TB/s, in us."""
    return verdict("decode floor (us)", answer, solution_decode_floor_us(), tolerance=2, hint=
                   "Only the experts that got tokens are read: 23 x 4096 x 7168 x 2 bytes; the 64 tokens' rows "
                   "are negligible. Divide by 3.35e12 bytes/s.")


def solution_decode_floor_us():
    return round(23 * 4096 * 7168 * 2 / 3.35e12 * 1e6)  # 403


#: The grouped problem of exercise 4: rows per group, N, tile, CTAs, in clusters of two CTAs along M.
PAIR_PROBLEM = dict(m_sizes=[520, 70, 300], n=512, tile_m=128, tile_n=128, grid=6, cluster=2)


def check_pair_waste(answer) -> bool:
    """Pairs past the rows: of the tiles the CTAs of :data:`PAIR_PROBLEM` are handed, how many lie wholly past
    their group's rows (TMA zero-fills their A, their store is dropped: tensor-core work for nothing)?"""
    return verdict("tiles past the rows", answer, solution_pair_waste(),
                   "Count each group's M-tiles and the pairs they make (grouped_model.tile_order(**ch08.PAIR_PROBLEM) "
                   "hands them out); a tile is past the rows when it starts at or after the group's last row.")


def solution_pair_waste():
    # 520 rows: 5 M-tiles in 3 pairs, 70 rows: 1 in 1 pair, 300 rows: 3 in 2 pairs -> one empty slot per
    # group, times 4 N-tiles each: 12 of the 48 tiles handed out.
    from ...grouped_model import tile_order

    p = PAIR_PROBLEM
    handed = [t for cta in tile_order(**p) for t in cta]
    return sum(1 for g, m_tile, _ in handed if m_tile * p["tile_m"] >= p["m_sizes"][g])  # 12


#: Exercise 5: a decode launch's fixed cost (us), the rate its weights stream at (a fraction of the datasheet
#: bandwidth) and the fraction of the datasheet roofline asked for (section 7's tail benchmark, H200-like).
LAUNCH_PROBLEM = dict(fixed_us=16.0, stream_fraction=0.90, target=0.85)


def check_roofline_launch_us(answer) -> bool:
    """Long enough for the roofline: the shortest launch (us, kernel time) of :data:`LAUNCH_PROBLEM` that reaches
    ``target`` of the datasheet roofline."""
    return verdict("shortest launch (us)", answer, solution_roofline_launch_us(), tolerance=3, hint=
                   "Call x the time the bytes take at the datasheet bandwidth. The launch takes fixed + x / "
                   "stream_fraction and reaches x / (fixed + x / stream_fraction) of the roofline; solve that "
                   "= target for x, then give the launch's time.")


def solution_roofline_launch_us():
    # x / (F + x / s) = f  =>  x (1 - f / s) = f F  =>  x = 0.85 * 16 / (1 - 0.85 / 0.90) = 244.8 us of bytes,
    # and the launch takes 16 + 244.8 / 0.90 = 288 us.
    p = LAUNCH_PROBLEM
    f, s, fixed = p["target"], p["stream_fraction"], p["fixed_us"]
    x = f * fixed / (1 - f / s)
    return round(fixed + x / s)  # 288
