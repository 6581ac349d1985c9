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


def explain_tail_cost() -> str:
    """Where the unrolled ring's 14 extra time units come from."""
    return ("With 6 k-iterations and 4 stages the unrolled ring runs each tile as two groups of 4 slots: the "
            "second group holds items 4 and 5 in stages 0 and 1, and stages 2 and 3 are walked empty (plain "
            "arrives on full and empty). The next tile starts again at stage 0, so its first load waits until "
            "the consumer has released stage 0, i.e. finished item 4. That load then takes its whole latency "
            "(3) while the consumer, done with item 5 one unit later, has nothing to do: 2 units lost at each "
            "of the 7 tile boundaries, 14 in all (65 against 51). The carried ring puts the next tile's first "
            "item in stage 2, free long before, so its load was issued early and the consumer never waits.")


def check_stages_two_ctas(answer) -> bool:
    """Count: with the default bfloat16 block (16 KiB stages), the most stages for which two CTAs still fit on one SM."""
    return verdict("stages with 2 CTAs per SM", answer, solution_stages_two_ctas(),
                   "Each stage holds one x box; each CTA also keeps two y buffers and its barriers. Two CTAs must fit "
                   "in 228 KiB with 1 KiB reserved per CTA (tma_pipeline.smem_bytes, fitting_ctas_per_sm).")


def solution_stages_two_ctas():
    from ...tma_pipeline import default_block, fitting_ctas_per_sm

    block = default_block("bfloat16")
    return max(s for s in range(1, 9) if fitting_ctas_per_sm("bfloat16", "bfloat16", block, s) >= 2)  # 5


def explain_stages_two_ctas() -> str:
    """What else each CTA keeps in shared memory, and why 5 stages is the limit with two CTAs."""
    return ("Besides its x stages (one 16 KiB box each), each CTA keeps the two y buffers the consumers write "
            "and the TMA store reads (2 x 16 KiB for bfloat16 out) and two 8-byte mbarriers per stage; CUDA also "
            "reserves 1 KiB per CTA. With 5 stages a CTA needs 5 x 16 + 32 KiB + 80 bytes = 114768 bytes, two "
            "of them with their reserve 231584 bytes: within the SM's 228 KiB (233472). With 6 stages one CTA "
            "needs 131168 bytes and two no longer fit.")
