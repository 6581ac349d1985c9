"""Chapter 11: choosing the gated NVFP4 kernels' configuration for a problem.

On Hopper the fast twin (:mod:`gemmlab.kernels.dual_gemm_sm90_pipelined`) has one decision: the
width of its tile, ``tile_n`` (32, 48 or 64 columns of each GEMM). Narrow tiles cost more
dequantization per MMA (each CTA converts its own B rows and all 128 of its A rows), so the
widest tile whose grid fills the GPU wins (:func:`choose_tile_n`). On Blackwell the SM100 kernel
runs its default :class:`~gemmlab.family.configs.DualSm100Config` (compile-verified only: no
B200 timed a choice).
"""
from __future__ import annotations

import functools

from ..hardware import H100
from .configs import GATED_TILE_M, PIPELINED_TILE_NS, DualSm100Config, PipelinedConfig
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


def choose_sm90(problem: GatedProblem, num_sms: int = H100.sms) -> PipelinedConfig:
    """The fast Hopper twin's configuration for ``problem`` on ``num_sms`` SMs."""
    return PipelinedConfig(tile_n=choose_tile_n(problem.m, problem.n, num_sms))


def choose_sm100(problem: GatedProblem, num_sms: int | None = None) -> DualSm100Config:
    """The SM100 kernel's configuration: its defaults (one persistent CTA per SM; ``num_sms`` None: a B200's)."""
    return DualSm100Config() if num_sms is None else DualSm100Config(num_ctas=num_sms)
