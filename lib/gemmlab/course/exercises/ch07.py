"""Chapter 07's exercises (persistent Hopper GEMM, the GEMM family): checkers and worked solutions."""
from __future__ import annotations

from . import verdict


def check_units_and_waves(answer) -> bool:
    """Predict, then run: ``(units, waves)`` of the 128 x 256 kernel, cluster 2 x 1, on 2048 x 2112 x 7168, 132 SMs."""
    return verdict("units and waves", answer, solution_units_and_waves(),
                   "A work unit is a cluster tile: count 128-row tiles along M and 256-column tiles along N "
                   "(partial tiles count), pair the M tiles, then divide by the 66 clusters and round up.")


def solution_units_and_waves():
    # M: 2048 / 128 = 16 tiles -> 8 cluster rows; N: ceil(2112 / 256) = 9 tiles (the last 64 wide).
    # 8 x 9 = 72 units on 132 / 2 = 66 clusters: 2 waves, the second with 6 units (91 % of the SMs idle).
    return (72, 2)


def explain_units_and_waves() -> str:
    """Why, among 128-row tiles, the model prefers 128 x 144 for 2048 x 2112 x 7168."""
    return ("With 128 x 256 tiles the 72 units fill the 66 clusters once and then 6 more: the second wave leaves "
            "60 of 66 clusters idle, so only half of the two waves' capacity does work (h.predict: useful 0.50, "
            "about 150 us). 128 x 144 tiles cut N into 15 tiles (14 x 144 + 96): 8 x 15 = 120 units, still two "
            "waves, but each unit is about 144 / 256 of the work, and the second wave is 54 of 66 clusters full "
            "(useful 0.89). The heuristic's model then predicts about 98 us, bound by L2 traffic rather than by "
            "the idle second wave; the narrower tile also leaves room for 6 stages instead of 4. (With every tile "
            "height and cluster shape open to it, the heuristic picks a 192 x 176 tile in 1 x 2 clusters here: "
            "11 x 12 = 132 CTAs, one full wave, and a B tile feeding 192 rows; measured on an H100 at 1.03x "
            "cuBLAS where 128 x 144 ran at 0.83x.)")


def check_slices(answer) -> bool:
    """Predict: 112 k-blocks asked to split into 15 slices. How many slices does the kernel get, and how long is the last?"""
    return verdict("split-K slices", answer, solution_slices(),
                   "Slices are ceil(112 / 15) k-blocks long and the last takes what is left; a slice with "
                   "nothing left is dropped (gemmlab.family.configs.effective_splits).")


def solution_slices():
    # ceil(112 / 15) = 8 k-blocks a slice: 14 slices cover all 112 exactly, the 15th would be empty.
    from ...family.configs import effective_splits, split_ranges

    s = effective_splits(112, 15)
    return (s, split_ranges(112, s)[-1][1])  # (14, 8)


def explain_slices() -> str:
    """Why 15 slices become 14, and what an empty slice would break."""
    return ("Each slice gets ceil(112 / 15) = 8 k-blocks; 14 slices of 8 cover all 112, so the 15th would have "
            "none. The consumer's main loop (gemm_sm90.mma_tile) peels the first k-block of its range: it waits "
            "on full[s] and issues that k-block's wgmmas before the loop over the rest, so it consumes at least "
            "one stage per unit. The producer loads nothing for an empty range, so that consumer would take the "
            "next unit's first stage: from then on the two roles would be one stage out of step (wrong partial "
            "sums, and at the end a wait nobody satisfies). gemmlab.family.configs.effective_splits prevents "
            "it: it lowers the slice count until no slice is empty (15 -> 14), and the last slice gets 8 "
            "k-blocks.")


def check_l2_megabytes(answer) -> bool:
    """Count: MB (1e6 bytes) that L2 delivers to the SMs for 4096 x 576 x 7168 with 128 x 144 tiles, cluster 2 x 1."""
    return verdict("L2 traffic", answer, solution_l2_megabytes(),
                   "Per k-block each CTA reads 128 rows of A' and half of B''s 144 rows (its peer multicasts the "
                   "other half), 128 bytes a row; multiply by the tiles and the k-blocks, round to whole MB.")


def solution_l2_megabytes():
    # 32 x 4 tiles, 112 k-blocks, (128 + 144 / 2) rows x 128 bytes per k-block per CTA.
    return round(32 * 4 * 112 * (128 + 72) * 128 / 1e6)  # 367


def check_barrier_counts(answer) -> bool:
    """Read the kernel: ``(arrivals, bytes)`` one phase of ``empty[s]`` and of ``full[s]`` waits for, in ``Sm90Config()``."""
    return verdict("barrier counts", answer, solution_barrier_counts(),
                   "empty[s] is initialised with one arrival per consumer warp of every CTA of the cluster; "
                   "full[s] is armed with the bytes of a whole stage (an A' block and a B' block of one "
                   "k-block), including the half its peer multicasts.")


def solution_barrier_counts():
    # 128 x 256 tile: 2 consumer warpgroups = 8 warps, in each of the cluster's 2 CTAs: 16 arrivals.
    # A stage: (128 + 256) rows x 64 BF16 = 49152 bytes, whoever loaded which half.
    from ...family.configs import Sm90Config

    cfg = Sm90Config()
    return (4 * cfg.consumers * cfg.cluster_size, cfg.stage_bytes())  # (16, 49152)


def explain_barrier_counts() -> str:
    """Which barrier count changes without the cluster, and why the other does not."""
    return ("empty[s] waits for one arrival per consumer warp of every CTA that reads the stage: 8 warps in each "
            "of the pair's 2 CTAs, 16. With cluster=(1, 1) only the CTA's own 8 warps read it: 8. full[s] expects "
            "the bytes that land in *this* CTA's stage, and those do not change: each CTA of a pair loads only half "
            "of B', but the multicast writes that half into both CTAs and performs complete-tx on the barrier at "
            "the same offset in each, so every CTA still receives its A' block and all of B': 49152 bytes, "
            "whoever issued which load.")


def check_token_tiles(answer) -> bool:
    """Cut the batch: ``(token tile width, CTAs)`` of the one cut of M = 384 that fills 132 SMs best in one wave,
    swapped onto 128-row weight tiles of a 4096-wide layer (N = 4096)."""
    return verdict("token tiles", answer, solution_token_tiles(),
                   "h.swap_token_tiles(384) lists the widths; the weight gives 4096 / 128 = 32 tiles along M', "
                   "each width ceil(384 / width) tiles along N'. Keep the largest product that is at most 132.")


def solution_token_tiles():
    # 384 rows cut in 2, 3 or 4 tiles: 192, 128 or 96 wide -> 32 x 2 = 64, 32 x 3 = 96, 32 x 4 = 128 CTAs.
    from ...family.heuristic_sm90 import swap_token_tiles

    ctas = {w: 32 * -(-384 // w) for w in swap_token_tiles(384)}  # 32 weight tiles x ceil(384 / w) token tiles
    best = max((w for w in ctas if ctas[w] <= 132), key=ctas.get)
    return (best, ctas[best])  # (96, 128)


def explain_token_tiles() -> str:
    """Why the pick pairs the four token tiles (1 x 2), and why three token tiles are never paired that way."""
    return ("Four 96-wide token tiles on 32 weight tiles make 128 CTAs, one wave with no padded row; cuBLAS runs this "
            "shape the same way on the H100 (128 weight rows by 96 tokens, 128 CTAs). A 1 x 2 cluster pairs two "
            "neighbouring token tiles, which read the same 128 rows of the weight: each CTA loads half of that "
            "panel and multicasts it to both, halving the traffic of the operand more than ten times the tokens' size "
            "(4096 x 4096 against 384 x 4096). Among variants the model finds equal, the heuristic prefers it for that "
            "reason, and on the H100 sweep it beat the 2 x 1 pairing on 13 of 15 tiles. With three token tiles "
            "(640 rows cut into 224-wide tiles) a 1 x 2 cluster would cover a fourth, empty tile in every pair: "
            "one CTA in four computes padding, and at 640 x 8192 x 28672 that ran 728 us against 414 for 2 x 1 "
            "clusters along the weight's 64 tiles (an even count; with two K slices), so swapped grids pair only "
            "along an even count.")


def check_accumulators(answer) -> bool:
    """One warpgroup, two accumulators: ``(registers with wg_rows=64, registers with wg_rows=128)``, the FP32
    accumulator registers one consumer thread holds for a 128 x 160 tile."""
    return verdict("accumulator registers", answer, solution_accumulators(),
                   "A warpgroup is 128 threads; its accumulator is the rows it owns x 160 FP32 values, spread evenly "
                   "over them.")


def solution_accumulators():
    # wg_rows = 64: two warpgroups, each 64 x 160 = 10240 values over 128 threads -> 80 registers a thread.
    # wg_rows = 128: one warpgroup holds all 128 x 160 = 20480 values -> 160 registers a thread (two WGMMAs of 80).
    return (64 * 160 // 128, 128 * 160 // 128)


def explain_accumulators() -> str:
    """Why the config refuses one warpgroup for a 128 x 224 tile, and why the heuristic does not use it on an
    unswapped grid of two waves."""
    return ("With one warpgroup a thread holds tile_n accumulators: 224 for a 128 x 224 tile. The kernel's "
            "setmaxnreg gives a consumer thread 232 registers, and the WGMMA "
            "descriptors, the pipeline state and the epilogue's conversions need a few dozen more: ptxas puts the "
            "128 x 192 form, 192 accumulators, at 218 registers a thread, so 224 accumulators would leave too few and "
            "spill to local memory; the config stops at 192 (Sm90Config's MAX_TILE_N_WG128). On a grid with more tiles than clusters, each CTA "
            "stores a tile and then starts the next: two warpgroups store their two 64-row slabs at the same time, one "
            "warpgroup stores both in turn, so its epilogue takes about twice as long while the tensor cores wait. "
            "Measured on an H100 (benchmarks/gemm_family.py w128): 1000 x 6144 x 4096 on 128 x 192 tiles, two waves, "
            "ran 70.1 us with one warpgroup against 68.7 with two, where one-wave grids ran up to 1.065x faster with "
            "one. A ping-pong schedule (two warpgroups, each holding a whole 128-row tile, one storing while the other "
            "computes: Sm90Config(pingpong=True)) hides that epilogue: on an H200 it ran that shape's 128 x 192 tiles "
            "in 67.2 us against the pick's 68.2, but 128 x 192 tiles lose to 128 x 256 ones on the largest shapes, so "
            "the heuristic does not pick it yet.")
