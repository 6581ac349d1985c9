"""Chapter 11: choosing the gated NVFP4 kernels' configuration for a problem.

On Hopper the fast twin (:mod:`gemmlab.kernels.dual_gemm_sm90_pipelined`) has one decision: the
width of its tile, ``tile_n`` (32, 48 or 64 columns of each GEMM). Narrow tiles cost more
dequantization per MMA (each CTA converts its own B rows and all 128 of its A rows), so the
widest tile whose grid fills the GPU wins (:func:`choose_tile_n`). The decode twin
(:mod:`gemmlab.kernels.dual_gemm_sm90_decode`, M <= 128) has its own choice (:func:`choose_decode_config`),
which the public call takes only up to :data:`DECODE_UP_TO` rows (none until a GPU run has timed it). On
Blackwell the SM100 kernel runs its default :class:`~gemmlab.family.configs.DualSm100Config` (compile-verified
only: no B200 timed a choice).
"""
from __future__ import annotations

import functools

from ..hardware import H100
from .. import nvfp4 as fp4
from .configs import (DECODE_SPLITS, DECODE_TOKEN_MULTIPLE, DECODE_WG_ROWS, GATED_TILE_M,
                      PIPELINED_TILE_NS, DecodeConfig, DualSm100Config, PipelinedConfig, decode_max_stages)
from .problem import GatedProblem

#: The share of the last wave's SMs a tile width must keep busy to be taken (else the best-filled one).
FILL = 0.9


@functools.lru_cache(maxsize=1024)
def choose_tile_n(m: int, n: int, num_sms: int = H100.sms) -> int:
    """The widest ``tile_n`` whose grid uses at least 90% of the SMs of its last wave (else the best filled).

    Narrow tiles cost more dequantization per MMA (each CTA converts its own B rows and all
    its A rows), so the widest tile that fills the machine wins.
    """
    def fill(bn):
        tiles = -(-m // GATED_TILE_M) * -(-n // bn)
        waves = -(-tiles // num_sms)
        return tiles / (waves * num_sms)

    for bn in sorted(PIPELINED_TILE_NS, reverse=True):
        if fill(bn) >= FILL:
            return bn
    return max(sorted(PIPELINED_TILE_NS, reverse=True), key=fill)


def choose_sm90(problem: GatedProblem, num_sms: int = H100.sms) -> PipelinedConfig | DecodeConfig:
    """The Hopper configuration for ``problem`` on ``num_sms`` SMs: the decode twin's
    (:func:`choose_decode_config`) up to :data:`DECODE_UP_TO` rows (none yet), else the fast twin's."""
    if problem.m <= DECODE_UP_TO:
        return choose_decode_config(problem.m, problem.n, problem.k, num_sms)
    return PipelinedConfig(tile_n=choose_tile_n(problem.m, problem.n, num_sms))


#: The most rows of A for which the public call runs the decode twin; 0: never, for now. The decode twin takes up to
#: DECODE_MAX_TOKENS rows and is correct on the emulator at every configuration, and on an H200 with one MMA
#: warpgroup without split-K (2026-11-27); its two-warpgroup form hung there (setmaxnreg asked for more registers than
#: the CTA started with, since fixed but not yet run on a GPU), and no timing of it exists. It is chosen here once a
#: GPU run has shown it correct in every form and faster than the fast twin (``benchmarks/dual_gemm.py bf16``).
DECODE_UP_TO = 0


def choose_decode_config(m: int, n: int, k: int, num_sms: int = H100.sms) -> DecodeConfig:
    """A configuration for an M x N x K decode (M <= 128), from a model of a weight stream, not from timings.

    ``tokens``: M rounded up to 16; two MMA warpgroups (128 weight rows a CTA) up to 64 tokens, where they keep
    four stages, one above. ``split``: the one of 1, 2, 4 that minimises waves x k-blocks per CTA (every CTA
    streams its own weights; a wave of CTAs shares the GPU's bandwidth), the smaller on a tie (less to reduce).
    ``stages``: as deep as shared memory allows (at most 6).
    """
    tokens = -(-m // DECODE_TOKEN_MULTIPLE) * DECODE_TOKEN_MULTIPLE
    wgs = 2 if tokens <= 64 else 1
    blocks = -(-n // (DECODE_WG_ROWS * wgs))
    k_blocks = k // fp4.K_MULTIPLE

    def cost(s):
        return -(-blocks * s // num_sms) * -(-k_blocks // s)

    split = min((s for s in DECODE_SPLITS if s <= k_blocks), key=lambda s: (cost(s), s))
    return DecodeConfig(tokens, wgs, split, decode_max_stages(tokens, wgs, split))


def choose_sm100(problem: GatedProblem, num_sms: int | None = None) -> DualSm100Config:
    """The SM100 kernel's configuration: its defaults (one persistent CTA per SM; ``num_sms`` None: a B200's)."""
    return DualSm100Config() if num_sms is None else DualSm100Config(num_ctas=num_sms)
