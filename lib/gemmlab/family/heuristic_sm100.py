"""Chapter 10: choosing the Blackwell kernel's configuration for a problem.

Chapter 10's kernel has one tile shape decision: ``block_n`` = 256 (each A
k-block feeds twice the MMA work of a 128-wide tile: less shared-memory traffic
per FLOP) unless 128-wide tiles cut the *padded work* (waves x ``block_n``: the
N-columns one cluster computes, partial tiles and idle clusters included) by
20 %; then the deepest SMEM-AB ring that fits. Like the Hopper heuristic it
takes a :class:`gemmlab.family.problem.GemmProblem` and an SM count.
"""
from __future__ import annotations

import functools

from ..checks import check_int
from ..hardware import B200
from .configs import PAIR_M, Sm100Config, max_ab_stages
from .problem import GemmProblem

#: block_n = 128 must cut the padded work to <= this fraction of block_n = 256's.
WAVE_GAIN = 0.8


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def padded_work(m: int, n: int, block_n: int, num_sms: int = B200.sms) -> int:
    """Waves x ``block_n``: the N-columns one cluster computes, partial tiles and idle clusters included."""
    tiles = ceil_div(m, PAIR_M) * ceil_div(n, block_n)
    return ceil_div(tiles, num_sms // 2) * block_n


@functools.lru_cache(maxsize=4096)
def choose(problem: GemmProblem, num_sms: int = B200.sms) -> Sm100Config:
    """The configuration chapter 10's kernel runs for ``problem`` on ``num_sms`` SMs."""
    if not isinstance(problem, GemmProblem):
        raise TypeError(f"problem must be a GemmProblem; got {type(problem).__name__}")
    check_int("num_sms", num_sms, lo=2)
    m, n = problem.m, problem.n
    wide, narrow = padded_work(m, n, 256, num_sms), padded_work(m, n, 128, num_sms)
    block_n = 128 if narrow <= WAVE_GAIN * wide else 256
    return Sm100Config(block_n=block_n, ab_stages=max_ab_stages(block_n, dtype=problem.dtype), num_sms=num_sms,
                       dtype=problem.dtype, b_major=problem.b_major)


def heuristic_configs(shapes, *, num_sms: int = B200.sms, dtypes=("bfloat16",), b_majors=("k",)):
    """The distinct configurations :func:`choose` returns for ``shapes`` ((m, n, k) triples)."""
    seen = {}
    for dt in dtypes:
        for bm in b_majors:
            for m, n, k in shapes:
                seen.setdefault(choose(GemmProblem(m, n, k, dt, dt, bm), num_sms), None)
    return list(seen)
