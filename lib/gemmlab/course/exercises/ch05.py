"""Chapter 05's exercises (the warp-specialized TMA pipeline and its simulator): checkers and worked solutions."""
from __future__ import annotations

from . import verdict


def check_min_stages(answer) -> bool:
    """Predict, then run: load 5, compute 2, one tile of 20 k-iterations. The fewest stages with the best total time?"""
    return verdict("stages to cover the latency", answer, solution_min_stages(),
                   "While one load is in flight the consumer needs other stages to work on: S * compute >= load + "
                   "compute. Check with simulator.sweep_stages(range(1, 8), (1, 20), 5, 2).")


def solution_min_stages():
    from ...simulator import simulate

    totals = {s: simulate(s, (1, 20), 5, 2).total for s in range(1, 8)}
    best = min(totals.values())
    return min(s for s, t in totals.items() if t == best)  # 4: 4 * 2 >= 5 + 2


def check_tail_cost(answer) -> bool:
    """Predict, then run: 8 tiles of 6 k-iterations, 4 stages, load 3, compute 1. How much longer is the unrolled design than the carried one?"""
    return verdict("the unrolled ring's tail", answer, solution_tail_cost(),
                   "Each tile ends with a group of 2 real slots and 2 empty ones; the next tile's first load waits for "
                   "the tail to drain. simulator.simulate(4, (8, 6), 3, 1, design=...) for both designs.")


def solution_tail_cost():
    from ...simulator import simulate

    carried, unrolled = (simulate(4, (8, 6), 3, 1, design=d).total for d in ("carried", "unrolled"))
    return round(unrolled - carried)  # 65 - 51 = 14


def check_stages_two_ctas(answer) -> bool:
    """Count: with the default bfloat16 block (16 KiB stages), the most stages for which two CTAs still fit on one SM."""
    return verdict("stages with 2 CTAs per SM", answer, solution_stages_two_ctas(),
                   "Each stage holds one x box; each CTA also keeps two y buffers and its barriers. Two CTAs must fit "
                   "in 228 KiB with 1 KiB reserved per CTA (tma_pipeline.smem_bytes, fitting_ctas_per_sm).")


def solution_stages_two_ctas():
    from ...tma_pipeline import default_block, fitting_ctas_per_sm

    block = default_block("bfloat16")
    return max(s for s in range(1, 9) if fitting_ctas_per_sm("bfloat16", "bfloat16", block, s) >= 2)  # 5
