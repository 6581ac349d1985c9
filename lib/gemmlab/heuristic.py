"""Chapter 07: choosing the kernel configuration from (M, N, K) and the SM count.

The persistent kernel of :mod:`gemmlab.gemm_sm90` has four knobs that
depend on the problem. Each is decided by one rule, written so that the
notebook can print the reasoning next to the choice:

1. **Tile N** (tile M is fixed at 128: two consumer warpgroups of 64 rows).
   Bigger tiles reuse each loaded byte for more math (a 128 x 256 tile does
   85 FLOP per byte of A+B loaded, 128 x 128 only 64), but they leave SMs
   idle in the last *wave* of tiles and waste work on partial tiles. For
   each candidate the rule computes the fraction of the machine's
   tile-slots doing useful work::

       useful = M * N / (waves * num_sms * 128 * tile_n),   waves = ceil(tiles / num_sms)

   and multiplies it by the tile's relative efficiency (its arithmetic
   intensity against the largest tile's, to a small power: larger tiles run
   closer to peak but the difference is modest). The best score wins;
   a tile smaller than 128 x 256 must win by 3 %.
2. **Cluster shape.** ``(2, 1)``: two CTAs on neighbouring M tiles share
   the B panel, which each loads half of and multicasts. Chosen whenever
   there are at least two M tiles; otherwise ``(1, 2)`` (share A) when
   there are two N tiles; otherwise no cluster.
3. **Raster order and group.** Bands of ``group = 8`` cluster tiles along
   the dimension with more tiles, so a wave of ~132 CTAs reads few panels
   of each operand (see :mod:`gemmlab.scheduler`).
4. **Stages.** As many A/B ring stages as fit in 227 KB next to the
   epilogue buffers: deeper rings hide more TMA latency. One measured
   exception (:data:`STAGES_MEASURED`): 128 x 176 runs 4 stages, not 5.
   On an H200, 4096 x 2112 x 7168 ran at 0.91-0.92x cuBLAS with 5 stages
   and 0.975x with 4 (interleaved in the same run), and Nsight Compute
   showed the tensor pipe busy 84 % of the time with 5 stages, 90 % with 4.
   128 x 144 showed the opposite (6 stages 0.935x, 4 stages 0.914x), so
   the rule is not "fewer is better"; it is what was measured.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

from .checks import check_int
from .gemm_sm90 import SMEM_LIMIT, GemmConfig

#: SMs of an H100 SXM / H200 (the compile-only default).
H100_SMS = 132
#: Tile N candidates: every multiple of 16 from 128 to 256 (WGMMA takes any N multiple of 8).
TILE_NS = tuple(range(256, 127, -16))
#: How much faster a bigger tile runs per useful FLOP, as a power of its arithmetic intensity.
INTENSITY_POWER = 0.5
#: A tile other than 128 x 256 must beat it by this factor: its partial edge tiles and
#: odd-sized TMA boxes cost more than the model counts (measured: 240 lost to 256 on
#: 4096 x 24576 x 1536 although the model gave it 1.3 %).
SMALLER_TILE_MARGIN = 1.03


def intensity(tile_m: int, tile_n: int) -> float:
    """FLOP per byte of A and B loaded for one output tile (BF16, per k step)."""
    return 2 * tile_m * tile_n / (2 * (tile_m + tile_n))


@dataclass(frozen=True)
class Candidate:
    tile_n: int
    tiles: int  # CTA tiles (clusters x cluster size)
    waves: int
    useful: float  # fraction of tile-slots doing useful work
    score: float


def candidates(m: int, n: int, k: int, num_sms: int = H100_SMS) -> list[Candidate]:
    """Every tile-N candidate with its wave count, useful fraction and score (best first)."""
    for name, v in (("m", m), ("n", n), ("k", k)):
        check_int(name, v, lo=1)
    check_int("num_sms", num_sms, lo=1)
    best_int = intensity(128, max(TILE_NS))
    out = []
    for tn in TILE_NS:
        mt, nt = -(-m // 128), -(-n // tn)
        tiles = mt * nt
        waves = -(-tiles // num_sms)
        useful = m * n / (waves * num_sms * 128 * tn)
        score = useful * (intensity(128, tn) / best_int) ** INTENSITY_POWER
        out.append(Candidate(tn, tiles, waves, useful, score))
    # Best score first; on a tie the bigger tile. The largest tile gets the margin.
    return sorted(out, key=lambda c: (-c.score * (SMALLER_TILE_MARGIN if c.tile_n == max(TILE_NS) else 1), -c.tile_n))


#: Stage counts measured to beat :func:`max_stages` for a tile N (see rule 4 above).
STAGES_MEASURED = {176: 4}


def stages_for(tile_n: int) -> int:
    """The A/B ring depth :func:`choose` uses: the measured exception, else the deepest that fits."""
    return STAGES_MEASURED.get(tile_n, max_stages(tile_n))


def max_stages(tile_n: int, cap: int = 8) -> int:
    """The deepest A/B ring that fits in shared memory next to the epilogue buffers."""
    epi_n, epi_stages = epi_shape_for(tile_n)
    s = cap
    while s > 2:
        try:
            GemmConfig(tile_n=tile_n, stages=s, cluster=(1, 1), epi_n=epi_n, epi_stages=epi_stages)
            return s
        except ValueError:
            s -= 1
    return s


def epi_shape_for(tile_n: int) -> tuple[int, int]:
    """``(epi_n, epi_stages)``: 32-column sub-tiles when they divide the tile, else 16; a ring of 4."""
    return (32 if tile_n % 32 == 0 else 16), 4


@functools.lru_cache(maxsize=None)
def choose(m: int, n: int, k: int, num_sms: int = H100_SMS) -> GemmConfig:
    """The configuration :func:`gemmlab.gemm` uses for an (M, N, K) problem on ``num_sms`` SMs."""
    best = candidates(m, n, k, num_sms)[0]
    tn = best.tile_n
    mt, nt = -(-m // 128), -(-n // tn)
    if mt >= 2:
        cluster = (2, 1)
    elif nt >= 2:
        cluster = (1, 2)
    else:
        cluster = (1, 1)
    cmt, cnt = -(-mt // cluster[0]), -(-nt // cluster[1])
    raster = "m" if cmt >= cnt else "n"
    epi_n, epi_stages = epi_shape_for(tn)
    return GemmConfig(tile_n=tn, stages=stages_for(tn), cluster=cluster, raster=raster, group=8,
                      epi_n=epi_n, epi_stages=epi_stages)


def explain(m: int, n: int, k: int, num_sms: int = H100_SMS) -> str:
    """The reasoning behind :func:`choose`, as text (the notebook prints it)."""
    cfg = choose(m, n, k, num_sms)
    lines = [f"(M, N, K) = ({m}, {n}, {k}) on {num_sms} SMs"]
    for c in candidates(m, n, k, num_sms):
        mark = "<- chosen" if c.tile_n == cfg.tile_n else ""
        lines.append(f"  tile 128x{c.tile_n:<3}: {c.tiles:5d} tiles, {c.waves:3d} wave(s), "
                     f"useful {c.useful:6.1%}, score {c.score:.3f} {mark}".rstrip())
    mt, nt = cfg.tiles(m, n)
    lines.append(f"  cluster {cfg.cluster}: {mt} M tiles x {nt} N tiles"
                 + (" -> pairs along M share (multicast) B" if cfg.cluster == (2, 1) else
                    " -> pairs along N share (multicast) A" if cfg.cluster == (1, 2) else " -> no partner"))
    cmt, cnt = cfg.cluster_tiles(m, n)
    lines.append(f"  raster {cfg.raster!r}, group {cfg.group}: bands along the longer side "
                 f"({cmt} x {cnt} cluster tiles)")
    why = "measured best for this tile" if cfg.tile_n in STAGES_MEASURED else "the deepest ring that fits"
    lines.append(f"  stages {cfg.stages} ({why}): {cfg.smem_bytes()} of {SMEM_LIMIT} bytes of shared memory")
    return "\n".join(lines)
