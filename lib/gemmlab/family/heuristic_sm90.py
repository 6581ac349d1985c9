"""Chapter 07: choosing the Hopper kernel's configuration for a problem.

The persistent kernel of :mod:`gemmlab.kernels.gemm_sm90` has knobs that depend on
(M, N, K). The heuristic enumerates the variants worth considering, predicts
each one's time with a small model of the machine, and keeps the fastest.
The model is what the notebook prints next to the choice, so every decision
has a reason a reader can check:

* **Tiles and waves.** A persistent grid runs ``units`` work units on
  ``num_sms`` CTAs; ``waves = ceil(units / CTAs)`` rounds of them. The last
  wave may leave SMs idle, and partial edge tiles compute padding. Both are
  counted: a unit's time is paid ``waves`` times.
* **A unit's time** is its k-blocks times the slower of (a) the tensor cores
  on the tile, ``2 * tile_m * tile_n * 64`` FLOP at the SM's share of the peak
  times an efficiency that grows with the tile's intensity, and (b) the bytes
  of the k-block, ``(tile_m + tile_n) * 64 * 2``, at what one SM can pull
  from L2/HBM; plus a fixed epilogue cost.
* **HBM.** Nothing beats ``min_bytes / bandwidth`` (A and B read once, C
  written once; with split-K also the FP32 workspace, written back once).
* **L2.** Every CTA reads its own A' and B' blocks out of L2 (a multicast block
  once per cluster), so a tiling moves ``tiles x k-blocks x (tile_m + tile_n)
  x 128`` bytes from L2 to the SMs, and L2 delivers about 7 TB/s to all of them
  together on an H100. A B' panel that every CTA reads (one tile along N', as a
  swapped decode batch is) counts half (:attr:`MachineModel.l2_shared_boost`).
  Small tiles re-read the operands more often: this is what makes 128 x 144
  tiles lose to cuBLAS at 2048 x 2112 x 7168 (688 MB through L2, 100 us
  measured).
* **Split-K** (``splits`` slices of K, each a unit) multiplies the units
  when the output has too few tiles. The slices are added inside the same
  launch (:mod:`gemmlab.splitk`): every unit stores its FP32 partial tile and
  waits for its release fence before its next unit (``splitk_publish``: the
  tile's bytes at one SM's store rate plus a fixed hand-off), the tile's last
  unit reads the other S - 1 partial tiles back (``splitk_tail``, once per wave),
  and the workspace passes through L2 (written and read) and is written back to
  HBM once; a split launch also pays a fixed cost. The three split-K constants
  were fitted on an H100 on launches that split every tile; a 64-row tile's
  fixed cost was refitted on an H200 after the reducer's grouped reads
  (:attr:`MachineModel.splitk_fixed_64_us`).
* **Data-parallel waves + split-K tail.** On a grid with more tiles than
  clusters only the partial last wave's tiles are split
  (:func:`~gemmlab.family.configs.hybrid_tiles`): the whole waves run whole
  tiles (all of K, no workspace, no hand-off), then the ``tail x splits``
  units of the tail run in ``ceil(tail x splits / clusters)`` waves of
  ``K / splits`` each, and only they pay the split-K costs above (hand-offs,
  reducers' reads, the tail's workspace, the fixed cost). It is priced with the
  constants fitted on split-every-tile grids; timed on 15 shapes on an H100 and
  an H200 (``results/<device>/splitk_hybrid.json``), it over-prices most tails
  by 3 to 7 us and misses some wins (640 x 29568 x 8192, where the L2 floor
  binds).
* **Swap A/B** puts a small M on WGMMA's N (a multiple of 8), so a
  64-row decode batch is a 64-wide tile instead of half of a 128-row one,
  and 200 tokens a 200-wide one, not 208. It is modelled up to
  :data:`SWAP_TILED_MAX_M` rows: the batch in one token tile up to
  :data:`SWAP_MAX_M` (or, from 177 rows, in two), cut into several above it
  (:func:`swap_token_tiles`). Weight tiles are 64 or 128 rows, and 192 for a
  batch in several token tiles; a batch of at most :data:`SWAP_MAX_M` rows cut
  in two takes no 128-row weight tile (:func:`_tile_choices` says what each rule
  measured; :class:`Forms` switches the newer forms off for a benchmark).
* **One consumer warpgroup** may hold a 128-row tile up to 192 wide
  (``wg_rows = 128``, :func:`wg_rows_for`): its main loop runs
  :attr:`MachineModel.wg128_gain` faster and its epilogue, storing both
  64-row slabs, twice as long. It is modelled only for swapped batches and
  grids of one tile per cluster, with at most two K slices, where it measured
  faster (:func:`_one_warpgroup_worth_modelling`); on ties one warpgroup takes an
  unswapped tile up to 160 wide, and two the rest (:func:`_prefers_one_warpgroup`).

Predicted time = ``max(sum over waves of max(unit time, the wave's share of the HBM
time), L2 time) + split waves x split-K tail + the split launch's fixed cost``: a wave's units
move their share of the bytes (a whole tile's, or a slice's ``1 / splits`` of it), at HBM
speed or at their own pace, whichever is slower, so a partial last wave (few SMs
pulling) is not hidden under the full waves. On an H100, 96 x 10240 x 8192 swapped on
64-row tiles (160 units: a full wave, then 28) took 75.6 us where 128-row tiles (80
units, one wave) took 64.6; the wave sum predicts 79.4 and 60.2, where ``max(waves x unit,
HBM)`` had called them equal. The constants (:data:`MODEL`) were fitted to measurements
on an H100 and an H200 (see chapter 07); the model ranks variants, it does not promise a
TFLOP/s.

Rules that are not the model's:

* **Cluster.** Without swap, every cluster the grid allows is modelled:
  ``(2, 1)`` (two CTAs on neighbouring M tiles share, and multicast, the B
  panel), ``(1, 2)`` (neighbouring N tiles share A) and none. A cluster
  covers whole pairs of tiles, so ``(2, 1)`` on an odd number of M tiles
  runs a CTA of padding in every cluster of the last M pair: at M = 384 on
  128-row tiles (3 M tiles) a quarter of the CTAs compute nothing, and
  ``(1, 2)`` wastes nothing when N has many tiles. The model counts that
  padding in its waves; among variants within 1 % of each other the rule's
  old preference stands (``(2, 1)``, then ``(1, 2)``, then none). A swapped
  batch in one token tile takes no cluster (no two tiles share its weight,
  A'); one cut into several token tiles (:func:`swap_token_tiles`) pairs
  tiles only along an even count, and prefers ``(1, 2)``, which multicasts
  the weight, then ``(2, 1)``, then none (:data:`SWAP_CLUSTERS`).
* **Raster and group.** Bands of ``group = 8`` cluster tiles along the
  dimension with more tiles, so a wave reads few panels of each operand
  (:mod:`gemmlab.scheduler`).
* **Stages.** The deepest A/B ring that fits in 227 KiB next to the epilogue
  buffers, except where measurement said otherwise (:data:`STAGES_MEASURED`).
"""
from __future__ import annotations

import functools
import math
import numbers
from dataclasses import dataclass, replace

from ..checks import check_choice, check_int
from ..hardware import H100
from .configs import MAX_TILE_N_192, MAX_TILE_N_WG128, Sm90Config, effective_splits
from .problem import GemmProblem

#: Tile N candidates without swap: every multiple of 16 from 64 to 256 (WGMMA takes any multiple of 8).
TILE_NS = tuple(range(256, 63, -16))
#: Swap A/B is considered up to this M (above it M fills 128-row tiles well) ...
SWAP_MAX_M = 256
#: ... and is the only layout considered up to this one: on an H100 every M <= 128 shape measured
#: (N = 576 to 32768, K = 512 to 16384) ran faster swapped than with the model's best unswapped tile, and so did
#: 18 of the 20 shapes at M = 160 and 200 of ``benchmarks/gemm_family.py swap`` (ten LLM layers; the two others
#: within 1.08x), while at M = 256 the unswapped tile won 8 of 10 (``results/<device>/gemm_family_swap.json``).
SWAP_ONLY_M = 200
#: Above :data:`SWAP_MAX_M` and up to this M the swapped layout is still modelled, with the batch cut into several
#: token tiles of equal width (:func:`swap_token_tiles`): M = 384 as four 96-wide tiles, M = 640 as four 160-wide ones,
#: so a grid of 128-row weight tiles fills the SMs without padding M to a multiple of 64 or 128 rows. cuBLAS does
#: the same on the H100 at 384 x 4096 x 4096 and 640 x 4096 x 4096 (``results/nvidia-h100-80gb-hbm3/cublas_picks.json``:
#: 128 weight rows by 96 and by 160 tokens, 128 CTAs each).
SWAP_TILED_MAX_M = 1024
#: The token tiles a swapped batch may be cut into (:func:`swap_token_tiles`) ...
SWAP_TOKEN_TILES = range(2, 9)
#: ... each at least this wide. Narrower ones re-read the weight panel too often: on the H100's sweep
#: (``results/nvidia-h100-80gb-hbm3/gemm_family_swap_tiled_first.json``, kernels alone) 64- and 80-wide token tiles
#: lost to the previous pick on all 9 shapes from M = 200 up, by up to 2x (200 x 29568 x 8192: 377 us against 190);
#: at M = 128 (two 64-wide tiles) their best beat it on 3 of 7 shapes (up to 1.19x, 128 x 576 x 7168) and lost on 4
#: (down to 0.90x). M <= 256 keeps its one whole-batch tile: cut in two 112-wide ones at M = 200, the best form beat
#: it on four of seven shapes (by 0.1 % to 1.18x) and lost on three (by up to 8 %), and the model could not tell which.
SWAP_MIN_TOKEN_TILE = 96
#: The most K slices split-K may use.
MAX_SPLITS = 16


@dataclass(frozen=True)
class Forms:
    """Which families of tiles :func:`candidates` enumerates for a swapped batch (the rest is the model's to rank).

    ``token_step``: a token tile's width is rounded up to a multiple of this: 8, WGMMA's N step (200 tokens are one
    200-wide tile, or two of 104, as cuBLAS cuts them: ``results/nvidia-h100-80gb-hbm3/cublas_picks_weak.json``), or
    16, as the kernel's epilogue first required. ``tall_swap``: weight tiles of 192 rows (three consumer warpgroups)
    too, where the token tile is at most :data:`~gemmlab.family.configs.MAX_TILE_N_192` wide. ``cut_small``: a batch
    of at most :data:`SWAP_MAX_M` rows may also be cut into token tiles at least :data:`SWAP_MIN_TOKEN_TILE` wide (200
    rows into two of 104). :data:`FORMS` is what the heuristic uses; :data:`FORMS_BEFORE_TOKEN8` the forms before
    these three, which ``benchmarks/gemm_family.py token8`` times against it.
    """

    token_step: int = 8
    tall_swap: bool = True
    cut_small: bool = True

    def __post_init__(self):  # each field stored as the checked Python value, as Sm90Config does (np.int64(8) -> 8)
        for name, choices in (("token_step", (8, 16)), ("tall_swap", (False, True)), ("cut_small", (False, True))):
            object.__setattr__(self, name, check_choice(name, getattr(self, name), choices))


FORMS = Forms()
FORMS_BEFORE_TOKEN8 = Forms(token_step=16, tall_swap=False, cut_small=False)


@dataclass(frozen=True)
class MachineModel:
    """The constants of the time model (per SM unless said otherwise)."""

    peak_tflops: float = H100.bf16_tflops  # dense BF16, the whole GPU
    hbm_tbps: float = H100.hbm_tbps
    hbm_efficiency: float = 0.85  # fraction of the datasheet bandwidth a streaming kernel reaches
    sm_gbps: float = 90.0  # what one SM's TMA ring pulls from L2/HBM at most, GB/s
    l2_tbps: float = 7.0  # what L2 delivers to all SMs together, TB/s
    # A B' panel that every CTA reads (one tile along N': a swapped decode batch) crosses L2 this many times faster.
    # Fitted on the H100's stored sweeps (gemm_family_sweep*.json, gemm_family_swap.json; 2026-11-27): with 1 the
    # model priced swapped 64-row tiles at M = 200 up to 1.4x slower than they ran (200 x 37888 x 3584: 165 us
    # predicted, 117 measured); any value from 2 up gives the same picks (regret on the wide sweep 1.037 -> 1.027,
    # on the swap sweep 1.006 -> 1.000, the other two unchanged).
    l2_shared_boost: float = 2.0
    mma_efficiency: float = 0.84  # fraction of peak the main loop reaches on a 128 x 256 tile
    intensity_power: float = 0.5  # efficiency ~ (tile intensity / 128x256's) ** power
    epilogue_us: float = 0.6  # a unit's epilogue, not hidden behind the next unit's main loop
    # Split-K in one launch (gemmlab.splitk). Fitted on an H100 (2026-11-27, build/splitk_gpu.sh ->
    # results/nvidia-h100-80gb-hbm3/splitk_gpu.json: 25 split-K kernels on 11 shapes, each against the rest of the
    # model's error on the same tile without split where that was timed): 3.4 us rms. A split-K launch costs about
    # 8 us more than its partial tiles' traffic and hand-offs say. Where it goes (H200, 2026-12-02,
    # results/nvidia-h200/splitk_fixed_cost_probe.txt): 1024 x 576 x 7168 in 4 slices on 128 x 144 tiles ran 21.8 us,
    # the same 128 units of 28 k-blocks unsplit (4096 x 576 x 1792) 15.6 us, so the split epilogue costs 6.2 us, not
    # the launch or the main loop; Nsight Compute counted 3.5 K more active cycles on the average SM (the partial
    # tile's stores and the release fence every unit pays) and 8.8 K more on the busiest (a reducer reading three
    # partial tiles after its own). Refitting this constant and the two above on every stored sweep of both GPUs
    # moved the geomean regret by under 0.1 % (1.0066 -> 1.0060; the timed pairs of
    # results/nvidia-h200/gemm_family_model_*.json), so they stay. Those launches split every tile; a multi-wave grid's
    # split tail after whole waves (configs.hybrid_tiles) is priced with the same three constants (timed since:
    # results/<device>/splitk_hybrid.json; not refitted).
    splitk_sm_gbps: float = 80.0  # what one SM's 16-byte stores (or .cg loads) of FP32 partial tiles move, GB/s
    splitk_sync_us: float = 0.5  # a unit's hand-off: barrier, release fence (its stores drained), atomic
    splitk_fixed_us: float = 8.0  # once per split-K launch: what the timings show beyond the two terms above
    # The same for a tile of 64 rows (one consumer warpgroup of 64). Fitted on an H200 (2026-12-02, after the grouped
    # reducer of gemmlab.splitk, which the constant above predates): on every shape of both families up to M = 1024
    # where split-K is near the model's best (benchmarks/gemm_family.py split_sweep, 36 shapes,
    # results/nvidia-h200/gemm_family_split_sweep.json) and on the weakest shapes' cluster-tile search
    # (gemm_family_cluster_tiles.json), the fastest variant of 6 shapes was a 64-row tile in two K slices the model
    # had priced 5 to 15 us too slow (200 x 4096 x 14336 on 64 x 200 tiles: 53.0 us predicted, 43.2 measured). With 4
    # the geomean regret over every stored sweep of both GPUs went 1.0104 -> 1.0080 (H200 1.0133 -> 1.0079; H100
    # 1.0069 -> 1.0081, all of its sweeps timed before the grouped reducer). It changes six H200 picks of the
    # families; five were timed old against new in one run (gemm_family_model_splitk_fixed_one_us3_sm_shared_boost1p25
    # .json and the split sweep): 256 x 2112 x 7168 23.0 -> 18.9 us, 64 x 4096 x 7168 23.2 -> 20.7, 1024 x 576 x 7168
    # 21.8 -> 20.8, 96 x 4096 x 4096 15.7 -> 15.2, 96 x 37888 x 3584 75.3 -> 74.6; 64 x 576 x 7168 (11 slices -> 10)
    # ran 10.4 us both ways in the family runs.
    splitk_fixed_64_us: float = 4.0
    # 192-row tiles (three consumer warpgroups) take this much longer than the rest of the model says. Fitted on
    # ``benchmarks/gemm_family.py tall`` (H100, 60 shapes, the model's best 192-row variant against its best other):
    # without it the model picked 192 rows on 37 shapes and lost 0.4 % overall (the 192-row kernels alone: 13 of
    # 60 faster, 0.955x geomean); with it, on 16, 0.8 % faster than never picking them (in-sample: the same 60).
    tall_tile_penalty: float = 1.05
    # A 128-row tile held by one consumer warpgroup (``wg_rows = 128``: two 64-row WGMMAs a k-step, two accumulators)
    # runs its main loop this much faster than two warpgroups of 64 rows each; its epilogue stores both slabs, so it
    # costs twice :attr:`epilogue_us`. Fitted on an H200 (2026-11-28, results/nvidia-h200/gemm_family_w128_first.json,
    # the same configs with both forms in the same run): one tile per CTA, 1.018x to 1.052x faster on the five
    # compute-bound shapes (512 x 4096 x 7168: 44.1 us -> 41.9); 4096^3 on 128 x 192 tiles (5.3 waves) and the
    # split-K decode shapes within 1 %. Modelled only where it won (:func:`_one_warpgroup_worth_modelling`). cuBLAS's
    # kernel at 512 x 4096 x 7168 (nvjet ..._128x128_64x6_2x1) issues both halves' WGMMAs from one warpgroup too
    # (Nsight Compute's source view: results/nvidia-h200/gemm_family_ncu_vs_cublas.txt).
    wg128_gain: float = 1.03


MODEL = MachineModel()


def model_for(spec) -> MachineModel:
    """The model with a GPU's own datasheet peak and HBM bandwidth (the rest was fitted on an H100).

    An H200 has the H100's SMs and L2 but 4.8 TB/s of HBM instead of 3.35: its HBM floor is lower,
    which changes the best variant of memory-bound (decode) shapes.
    """
    if spec is None:
        return MODEL
    return replace(MODEL, peak_tflops=spec.bf16_tflops, hbm_tbps=spec.hbm_tbps)


def intensity(tile_m: int, tile_n: int) -> float:
    """FLOP per byte of A and B loaded for one output tile (BF16, per k step)."""
    return 2 * tile_m * tile_n / (2 * (tile_m + tile_n))


@dataclass(frozen=True)
class Candidate:
    """One variant with the model's numbers for it."""

    config: Sm90Config
    units: int
    waves: int
    useful: float  # fraction of the CTA-slots of all waves doing useful (unpadded) work
    unit_us: float  # a split unit's time with split-K (a slice of K, its hand-off included), else a whole tile's
    hbm_us: float
    l2_us: float  # all CTAs' A' and B' blocks through L2
    extra_us: float  # split-K: every split wave's hand-offs (publish) + reducers' reads (tail) + the fixed launch cost
    time_us: float
    dp_tiles: int = 0  # split-K: cluster tiles run whole before the split tail (configs.hybrid_tiles)
    whole_us: float = 0.0  # a whole tile's time (all of K): the data-parallel waves' units


@functools.lru_cache(maxsize=1024)
def _stages(tile_m: int, tile_n: int, split: bool, dtype: str, out_dtype: str, cap: int = 8, wg_rows: int = 64) -> int:
    """The deepest A/B ring that fits, up to ``cap`` stages (or the measured exception). Cached: :func:`candidates`
    asks for the same tiles many times, and each try builds (and checks) a config.

    The cap of 8 is measured, not a limit of the kernel: on an H200 (2026-11-28, ``benchmarks/gemm_family.py stages``,
    ``results/nvidia-h200/gemm_family_stages.json``) the deepest ring that fits was no faster on the 15 picks where it
    is deeper than 8 (narrow 64-row tiles: 13 stages of 64 x 64), 0.935x to 1.015x, slower on 10 of them
    (64 x 7168 x 16384: 59.9 us with 8 stages, 64.0 with 13).
    """
    if (tile_m, tile_n, split) in STAGES_MEASURED:
        return STAGES_MEASURED[(tile_m, tile_n, split)]
    epi_n, epi_stages = epi_shape_for(tile_n, tile_m)
    for s in range(cap, 1, -1):
        try:
            # (a tile no multiple of 16 wide is a token tile: swapped; the bytes are the same either way)
            Sm90Config(tile_m=tile_m, tile_n=tile_n, stages=s, cluster=(1, 1), epi_n=epi_n, epi_stages=epi_stages,
                       splits=2 if split else 1, dtype=dtype, out_dtype=out_dtype, wg_rows=wg_rows,
                       swap_ab=tile_n % 16 != 0)
            return s
        except ValueError:
            continue
    raise ValueError(f"no A/B ring fits a {tile_m} x {tile_n} tile")


#: Stage counts measured to beat the deepest ring, by (tile_m, tile_n, split-K).
#: 128 x 176: on an H200, 4096 x 2112 x 7168 ran at 0.91-0.92x cuBLAS with 5 stages and
#: 0.975x with 4 (interleaved in the same run); Nsight Compute showed the tensor pipe busy
#: 84 % of the time with 5 stages, 90 % with 4. 128 x 144 showed the opposite (6 stages
#: 0.935x, 4 stages 0.914x), so the rule is not "fewer is better"; it is what was measured.
STAGES_MEASURED = {(128, 176, False): 4}


def epi_shape_for(tile_n: int, tile_m: int = 128) -> tuple[int, int]:
    """``(epi_n, epi_stages)``: 32-column sub-tiles when they divide the tile, else 16; a token tile that is no
    multiple of 16 wide (swapped only) takes the widest multiple of 8 up to 64 that divides it (200: 40, 104: 8). A
    ring of 4 per consumer warpgroup, of 2 with three of them (``tile_m = 192``: their rings would otherwise cost the
    A/B ring a stage)."""
    if tile_n % 16:
        epi_n = max(w for w in range(8, 65, 8) if tile_n % w == 0)
    else:
        epi_n = 32 if tile_n % 32 == 0 else 16
    return epi_n, (2 if tile_m == 192 else 4)


#: The clusters the heuristic models, in the order it prefers among equals. Not those of 4 and 8 CTAs the kernel also
#: runs (:data:`~gemmlab.family.configs.SM90_CLUSTERS`): on an H200 (2026-12-02, ``benchmarks/gemm_family.py clusters``,
#: ``results/nvidia-h200/gemm_family_clusters.json``) the model's pick on the 16 shapes the families lose most, each
#: with every wider cluster its tile cuts into, was never beaten by more than 2 % (640 x 3584 x 18944: 122.9 us in
#: 2 x 4 against 125.5 in 1 x 2) and mostly slower, up to 1.8x where a cluster of 4 leaves 12 SMs idle
#: (:data:`~gemmlab.family.configs.ACTIVE_CLUSTERS`; 1024 x 576 x 7168: 36.6 us in 2 x 2 against 22.1). cuBLAS runs
#: 2 x 4 and 4 x 2 on several of those shapes; what it gains there is not the L2 traffic multicast saves.
CLUSTERS = ((2, 1), (1, 2), (1, 1))
#: The same for a swapped batch cut into token tiles: the weight (A') is the big operand, and ``(1, 2)``
#: multicasts it. On the H100's sweep ``(1, 2)`` beat ``(2, 1)`` on 13 of the 15 tiles where both ran (same shape, tile
#: and splits; 512 x 4096 x 7168 on 128 x 128 tiles: 44.5 us against 50.5; ``gemm_family_swap_tiled_picks.json``);
#: where the token tiles are odd and only ``(2, 1)`` pairs, it beat none on 5 of 6 (1000 x 4608 x 3584: 50.4 us
#: against 56.6).
SWAP_CLUSTERS = ((1, 2), (2, 1), (1, 1))


def clusters_for(swap: bool, mt: int, nt: int, num_sms: int = H100.sms) -> tuple[tuple[int, int], ...]:
    """The clusters worth modelling for an ``mt x nt`` grid of tiles, the preferred one first.

    A pair along a dimension needs two tiles along it; a cluster needs as many SMs as CTAs. A swapped batch
    in one token tile takes none (its weight, A', is shared by no two tiles, and its token panel is small);
    one cut into several token tiles pairs them too: ``(1, 2)`` multicasts the weight panel to two token
    tiles, ``(2, 1)`` the token panel to two weight tiles.
    """
    if swap and nt < 2:
        return ((1, 1),)
    # A swapped grid pairs tiles only along an even count: a padded CTA in every cluster of the last pair measured
    # far worse than the waves it adds (H100, 640 x 8192 x 28672 on 128 x 224 swapped tiles, three token tiles:
    # (1, 2) 728 us, (1, 1) 500, (2, 1) over 64 weight tiles 414 with two K slices, 422 without).
    def pairs(count: int) -> bool:  # whether a pair of tiles fits along a dimension of ``count`` tiles
        return count >= 2 and not (swap and count % 2)

    return tuple(c for c in CLUSTERS if (c[0] == 1 or pairs(mt)) and (c[1] == 1 or pairs(nt))
                 and c[0] * c[1] <= num_sms)


def make_config(problem: GemmProblem, tile_m: int, tile_n: int, *, swap: bool = False, splits: int = 1,
                num_sms: int = H100.sms, cluster: tuple[int, int] | None = None, wg_rows: int = 64) -> Sm90Config:
    """The full config for a tile choice: cluster, raster, stages and epilogue by the rules above.

    ``cluster``: one of :func:`clusters_for`'s; ``None`` takes its first (the preferred one). ``wg_rows``: 128 for a
    128-row tile held by one consumer warpgroup (:func:`wg_rows_for`).
    """
    m, n = (problem.n, problem.m) if swap else (problem.m, problem.n)
    mt, nt = -(-m // tile_m), -(-n // tile_n)
    allowed = clusters_for(swap, mt, nt, num_sms)
    if cluster is None:
        cluster = allowed[0]
    elif tuple(cluster) not in allowed:
        raise ValueError(f"cluster must be one of {allowed} for {mt} x {nt} tiles"
                         f"{' (swap A/B)' if swap else ''} on {num_sms} SMs; got {cluster}")
    cluster = tuple(cluster)
    cmt, cnt = -(-mt // cluster[0]), -(-nt // cluster[1])
    k_tiles = -(-problem.k // 64)
    splits = effective_splits(k_tiles, splits)
    epi_n, epi_stages = epi_shape_for(tile_n, tile_m)
    return Sm90Config(tile_m=tile_m, tile_n=tile_n,
                      stages=_stages(tile_m, tile_n, splits > 1, problem.dtype, problem.out_dtype, wg_rows=wg_rows),
                      cluster=cluster, raster="m" if cmt >= cnt else "n", group=8, epi_n=epi_n,
                      epi_stages=epi_stages, swap_ab=swap, splits=splits, dtype=problem.dtype,
                      out_dtype=problem.out_dtype, wg_rows=wg_rows)


def _check_args(problem, num_sms, model, cfg=None) -> int:
    """Validate the heuristic's arguments (``TypeError``/``ValueError`` naming the rule); return ``num_sms`` as an int."""
    if not isinstance(problem, GemmProblem):
        raise TypeError(f"problem must be a GemmProblem; got {type(problem).__name__}")
    if isinstance(num_sms, bool) or not isinstance(num_sms, numbers.Integral):
        raise TypeError(f"num_sms must be an int; got {type(num_sms).__name__}")
    if num_sms < 1:
        raise ValueError(f"num_sms must be >= 1; got {num_sms}")
    if not isinstance(model, MachineModel):
        raise TypeError(f"model must be a MachineModel (see model_for); got {type(model).__name__}")
    if cfg is not None:
        if not isinstance(cfg, Sm90Config):
            raise TypeError(f"cfg must be an Sm90Config; got {type(cfg).__name__}")
        if cfg.cluster_size > num_sms:
            raise ValueError(f"num_sms must be >= cfg's cluster size ({cfg.cluster_size}): the CTAs of a cluster "
                             f"run on different SMs at the same time; got {num_sms}")
    return int(num_sms)


def predict(problem: GemmProblem, cfg: Sm90Config, num_sms: int = H100.sms, model: MachineModel = MODEL) -> Candidate:
    """The model's time for ``cfg`` on ``problem`` (microseconds), with the numbers behind it.

    With split-K the grid runs ``dp_tiles`` whole tiles in whole waves, then the tail's tiles in slices
    (:meth:`~gemmlab.family.configs.Sm90Config.hybrid` on ``num_sms / cluster size`` clusters); only the tail's
    units pay the split-K costs (:func:`splitk_costs`, :attr:`MachineModel.splitk_fixed_us`).
    """
    num_sms = _check_args(problem, num_sms, model, cfg)
    m, n, k = problem.m, problem.n, problem.k
    clusters = cfg.clusters_on(num_sms)
    dp, tail = cfg.hybrid(m, n, clusters)
    split_units = tail * cfg.splits
    units = dp + split_units
    whole_full, whole_last = divmod(dp, clusters)  # no partial whole wave with split-K: dp is whole waves
    split_full, split_last = divmod(split_units, clusters)
    split_waves = split_full + (split_last > 0)
    waves = whole_full + (whole_last > 0) + split_waves
    mt, nt = cfg.tiles(m, n)
    k_tiles = -(-k // cfg.tile_k)
    kb = -(-k_tiles // cfg.splits)  # a split unit's k-blocks (its slice)
    slots = clusters * cfg.cluster_size * cfg.tile_m * cfg.tile_n * cfg.tile_k
    useful = (m * n * k) / (slots * ((waves - split_waves) * k_tiles + split_waves * kb))
    sm_flops = model.peak_tflops * 1e12 / num_sms
    eff = model.mma_efficiency * (intensity(cfg.tile_m, cfg.tile_n) / intensity(128, 256)) ** model.intensity_power
    t_mma = 2 * cfg.tile_m * cfg.tile_n * cfg.tile_k / (sm_flops * eff)
    if cfg.wg_rows == 128:
        t_mma /= model.wg128_gain  # one warpgroup's two WGMMAs a k-step ...
    epilogue_us = model.epilogue_us * (cfg.wg_rows // 64)  # ... and its epilogue storing both slabs
    t_load = cfg.stage_bytes() / (model.sm_gbps * 1e9)
    kblock_us = max(t_mma, t_load) * 1e6
    whole_us = k_tiles * kblock_us + epilogue_us
    unit_us = kb * kblock_us + epilogue_us
    bw = model.hbm_tbps * 1e12 * model.hbm_efficiency
    hbm_bytes = problem.min_bytes()
    # Every CTA reads its A' and B' blocks from L2 (a multicast block once per cluster).
    # A B' panel all CTAs share (one tile along N') counts l2_shared_boost times less; so does a swapped batch's in
    # several token tiles (each read by every weight tile; without it the model ranked 128 x 112 unswapped tiles over
    # four 96-wide token tiles at 384 x 4096 x 4096, 26.2 us measured against 24.0 on the H100).
    b_share = model.l2_shared_boost if (nt == 1 or cfg.swap_ab) else 1.0
    per_kblock = cfg.tile_k * 2 * (cfg.tile_m / cfg.cluster[1] + cfg.tile_n / cfg.cluster[0] / b_share)
    l2_bytes = mt * nt * k_tiles * per_kblock
    publish_us = tail_us = fixed_us = 0.0
    if split_units:
        publish_us, tail_us = splitk_costs(cfg, model)
        unit_us += publish_us  # every split unit, the reducer too, stores its partial tile and fences
        ws_bytes = 4 * cfg.workspace_floats(m, n, clusters=clusters)  # one partial tile per tail CTA tile and slice
        hbm_bytes += ws_bytes  # written back once (the reducer reads it from L2 soon after)
        l2_bytes += ws_bytes * (2 * cfg.splits - 1) / cfg.splits  # S tiles written, S - 1 read back
        fixed_us = model.splitk_fixed_64_us if cfg.tile_m == 64 else model.splitk_fixed_us
    hbm_us = hbm_bytes / bw * 1e6
    l2_us = l2_bytes / (model.l2_tbps * 1e12) * 1e6
    # Each wave moves its units' share of the bytes (a whole tile's, or 1 / splits of it for a slice): a full wave
    # at HBM speed or at its units' pace, whichever is slower; a partial last wave has fewer SMs pulling, so its
    # share is not hidden under the full waves' time.
    tiles = dp + tail

    def wave(count: int, time: float, of_tile: float) -> float:
        return max(time, hbm_us * count * of_tile / tiles) if count else 0.0

    waves_us = (whole_full * wave(clusters, whole_us, 1.0) + wave(whole_last, whole_us, 1.0)
                + split_full * wave(clusters, unit_us, 1 / cfg.splits) + wave(split_last, unit_us, 1 / cfg.splits))
    # Split-K: in every split wave some units are reducers, and a reducer's read of the other partial tiles comes
    # after its own unit: each such wave ends that much later (the last one at the kernel's tail).
    time_us = max(waves_us, l2_us) + split_waves * tail_us + fixed_us
    if cfg.tile_m == 192:
        time_us *= model.tall_tile_penalty
    return Candidate(cfg, units, waves, min(1.0, useful), unit_us if split_units else whole_us, hbm_us, l2_us,
                     split_waves * (publish_us + tail_us) + fixed_us, time_us, dp if split_units else 0, whole_us)


def splitk_costs(cfg: Sm90Config, model: MachineModel = MODEL) -> tuple[float, float]:
    """``(publish_us, tail_us)`` of split-K in one launch (:mod:`gemmlab.splitk`), 0 without split-K.

    ``publish_us``: what every unit adds to its time: its ``tile_m x tile_n`` FP32
    partial tile stored at :attr:`MachineModel.splitk_sm_gbps`, then the hand-off
    (:attr:`MachineModel.splitk_sync_us`). ``tail_us``: a reducer reading the
    other ``splits - 1`` partial tiles at the same rate after its own unit; every
    wave of split units has reducers, so :func:`predict` adds it once per such
    wave (the whole tiles of a hybrid grid pay neither). Constants: see
    :class:`MachineModel`.
    """
    if not cfg.split_k:
        return 0.0, 0.0
    tile_us = 4 * cfg.tile_m * cfg.tile_n / (model.splitk_sm_gbps * 1e9) * 1e6
    return tile_us + model.splitk_sync_us, (cfg.splits - 1) * tile_us


def _tile_choices(problem: GemmProblem, forms: Forms = FORMS):
    """(tile_m, tile_n, swap) triples worth modelling for this problem (``forms``: :class:`Forms`).

    A row-major (N-contiguous) B is loaded in 64-column swizzle atoms along N, so
    its tiles are multiples of 64 wide (measured on an H100: 4096 x 2112 x 7168 with
    a 176-wide tile ran at 0.72x torch with B row-major, 0.97x with B a weight's view).

    Swapped, every token width of :func:`swap_token_tiles` goes on weight tiles of 64 and 128 rows, and of 192 rows
    where the batch is in several token tiles (each at most 192 wide), with two rules from the first run of
    ``benchmarks/gemm_family.py token8`` on an H200 (2026-12-02, ``results/nvidia-h200/gemm_family_token8_first.json``,
    kernels alone): 192 rows over one token tile lost (128 x 24576 x 1536: 26.0 us against 25.0 for 64 x 128), where
    over several they won (200 x 10240 x 8192 on two 104-wide token tiles: 62.0 us against 71.5); and a batch of at
    most :data:`SWAP_MAX_M` rows cut in two lost on 128-row weight tiles, on both shapes they were picked for
    (200 x 6144 x 4096: 24.1 us against 23.7 for one 64 x 208 tile), where 64 rows (200 x 4096 x 4096: 17.3 against
    18.7) and 192 rows won.
    """
    tns = TILE_NS if problem.b_major == "k" else tuple(t for t in TILE_NS if t % 64 == 0)
    out = [] if problem.m <= SWAP_ONLY_M else [(tm, tn, False) for tm in (128, 64) for tn in tns]
    if problem.m > SWAP_ONLY_M:
        out += [(192, tn, False) for tn in tns if tn <= MAX_TILE_N_192]
    for tn in swap_token_tiles(problem.m, forms):
        cut = tn < problem.m  # the batch in several token tiles
        for tm in (192, 128, 64):
            if tm == 192 and not (forms.tall_swap and cut and tn <= MAX_TILE_N_192):
                continue  # 192 rows: only over several token tiles
            if tm == 128 and cut and problem.m <= SWAP_MAX_M:
                continue  # a small batch cut in two: not on 128-row weight tiles
            out.append((tm, tn, True))
    return out


def swap_token_tiles(m: int, forms: Forms = FORMS) -> tuple[int, ...]:
    """Widths of the token tile (WGMMA's N) worth modelling for a swapped batch of ``m`` rows, widest first.

    Widths are rounded up to ``forms.token_step`` (:class:`Forms`; 8 by default), and are at least 16. Up to
    :data:`SWAP_MAX_M`: the whole batch in one tile, and (``forms.cut_small``) two of equal width where that is at
    least :data:`SWAP_MIN_TOKEN_TILE` once rounded up (177 to 256 rows). Above it, up to :data:`SWAP_TILED_MAX_M`:
    the batch cut into :data:`SWAP_TOKEN_TILES` tiles of equal width, where that width lies from
    :data:`SWAP_MIN_TOKEN_TILE` to 256. Above that: none.
    """
    m = check_int("m", m, lo=1)
    if not isinstance(forms, Forms):
        raise TypeError(f"forms must be a Forms; got {type(forms).__name__}")
    step = forms.token_step

    def width(tiles: int) -> int:
        rows = -(-m // tiles)  # ``tiles`` token tiles of equal width ...
        return max(16, -(-rows // step) * step)  # ... rounded up to the step, at least 16

    if m > SWAP_TILED_MAX_M:
        return ()
    if m <= SWAP_MAX_M:
        cuts = (2,) if forms.cut_small else ()
        out = {width(1)} | {width(t) for t in cuts if width(t) >= SWAP_MIN_TOKEN_TILE}
    else:
        out = {width(t) for t in SWAP_TOKEN_TILES if SWAP_MIN_TOKEN_TILE <= width(t) <= 256}
    return tuple(sorted(out, reverse=True))


def candidates(problem: GemmProblem, num_sms: int = H100.sms, model: MachineModel = MODEL,
               forms: Forms = FORMS) -> list[Candidate]:
    """Every variant the heuristic considers, with its predicted time; best first (``forms``: :class:`Forms`)."""
    num_sms = _check_args(problem, num_sms, model)
    if not isinstance(forms, Forms):
        raise TypeError(f"forms must be a Forms; got {type(forms).__name__}")
    k_tiles = -(-problem.k // 64)
    out = []
    for tile_m, tile_n, swap in _tile_choices(problem, forms):
        m, n = (problem.n, problem.m) if swap else (problem.m, problem.n)
        tried = set()
        for cluster in clusters_for(swap, -(-m // tile_m), -(-n // tile_n), num_sms):
            for s in range(1, min(MAX_SPLITS, k_tiles) + 1):
                for wg_rows in wg_rows_for(tile_m, tile_n):
                    cfg = make_config(problem, tile_m, tile_n, swap=swap, splits=s, num_sms=num_sms, cluster=cluster,
                                      wg_rows=wg_rows)
                    if cfg in tried:
                        continue
                    tried.add(cfg)
                    if cfg.split_k and not _split_worth_modelling(problem, cfg, num_sms):
                        continue
                    if cfg.wg_rows == 128 and not _one_warpgroup_worth_modelling(problem, cfg, num_sms):
                        continue
                    out.append(predict(problem, cfg, num_sms, model))
    return sorted(out, key=lambda c: rank_key(c, num_sms))


def wg_rows_for(tile_m: int, tile_n: int) -> tuple[int, ...]:
    """The rows per consumer warpgroup modelled for a tile: 64, and for a 128-row tile up to
    :data:`~gemmlab.family.configs.MAX_TILE_N_WG128` wide also 128 (one warpgroup, two accumulators)."""
    return (64, 128) if tile_m == 128 and tile_n <= MAX_TILE_N_WG128 else (64,)


def _one_warpgroup_worth_modelling(problem: GemmProblem, cfg: Sm90Config, num_sms: int) -> bool:
    """Whether :func:`candidates` models ``cfg`` with one consumer warpgroup (``wg_rows = 128``): at most two K slices,
    and a swapped batch or a grid of at most one tile per cluster.

    Measured on an H100 (2026-11-28, ``results/nvidia-h100-80gb-hbm3/gemm_family_w128.json``: the same tile both ways
    in one run, on the 27 shapes of both families whose pick had a 128-row tile up to 192 wide):

    * one tile per cluster, at most two K slices: faster on 13 of 14 shapes (1.005x to 1.065x; 384 x 4096 x 14336
      with two K slices), 0.992x on the decode batch 96 x 10240 x 8192, where HBM binds and the model ties the two;
    * swapped token tiles over several waves: faster on all five mid-M shapes (1.014x to 1.039x, 640 x 8192 x
      28672), within 1 % on the decode batches, where HBM binds and the model ties the two;
    * an unswapped grid of two waves: slower on both (1000 x 6144 x 4096, 128 x 192: 70.1 us against 68.7);
    * four K slices: half the threads store and read back the partial tiles (1024 x 576 x 7168: 32.8 us against 23.9).
    """
    clusters = cfg.clusters_on(num_sms)
    return cfg.splits <= 2 and (cfg.swap_ab or cfg.units(problem.m, problem.n, clusters) <= clusters)


def rank_key(c: Candidate, num_sms: int = H100.sms) -> tuple:
    """How :func:`candidates` orders variants: fastest first; among equals (within 1 %: typically several variants
    all bound by HBM or by L2) the one with more CTAs (more SMs streaming), then fewer splits, then the bigger tile,
    then the preferred cluster (:data:`CLUSTERS`, :data:`SWAP_CLUSTERS`), then the preferred consumer warpgroups
    (:func:`_prefers_one_warpgroup`)."""
    return (round(math.log(c.time_us) / math.log(1.01)), -min(c.units * c.config.cluster_size, num_sms),
            c.config.splits, -c.config.tile_m * c.config.tile_n,
            _cluster_preference(c.config),
            c.config.wg_rows != (128 if _prefers_one_warpgroup(c.config) else 64))


def _cluster_preference(cfg: Sm90Config) -> int:
    """Where ``cfg``'s cluster stands in :data:`CLUSTERS` (or :data:`SWAP_CLUSTERS`) for :func:`rank_key`; a cluster
    of 4 or 8 CTAs, which the heuristic does not enumerate but a stored sweep may have timed, after them all."""
    order = SWAP_CLUSTERS if cfg.swap_ab else CLUSTERS
    return order.index(cfg.cluster) if cfg.cluster in order else len(order)


def _prefers_one_warpgroup(cfg: Sm90Config) -> bool:
    """Whether, between two variants the model ties, :func:`rank_key` takes one consumer warpgroup (``wg_rows = 128``)
    over two: for an unswapped tile at most 160 wide, yes; otherwise two.

    Where they tie the L2 floor binds, which the main loop's gain does not move. Measured, the same tile both ways in
    one run (``results/<device>/gemm_family_w128.json``, kernels alone): unswapped 128 x 128 and 128 x 144 tiles with
    one warpgroup were faster on all 10 shape-GPU pairs timed (1.004x to 1.035x; 1024 x 2112 x 7168 on the H200: 46.7
    us against 47.9); 128 x 192 with one warpgroup lost on 5 of 6 (640 x 4608 x 3584 on the H200: 32.8 us against
    32.1), and the swapped decode batches the model ties were within 1 % either way (96 x 10240 x 8192 on the H100:
    64.7 us against 64.2).
    """
    return not cfg.swap_ab and cfg.tile_n <= 160


def _split_worth_modelling(problem: GemmProblem, cfg: Sm90Config, num_sms: int) -> bool:
    """Whether :func:`candidates` models split config ``cfg``: a tail to split, whose units fit one wave.

    A grid of at most one wave of tiles splits every tile, and any count is modelled (a second wave of slices
    may still beat idle SMs). On a larger grid only the partial last wave's tiles are split
    (:func:`~gemmlab.family.configs.hybrid_tiles`), into at most one wave of units: a count that needs a second
    wave for the tail would end the kernel on another partial wave, and a grid of whole waves has nothing to
    split. (Splitting every tile of a multi-wave grid, as the kernel first did, lost to the unsplit picks on an
    H100 (2026-11-27, results/nvidia-h100-80gb-hbm3/splitk_picks.json): 640 x 8192 x 28672 450 us against 426,
    384 x 8192 x 28672 263 against 257, 1536 x 3584 x 18944 284 against 281.) Nor is a workspace of 2 GiB or more
    worth it (the kernel's slice offsets are 32-bit).
    """
    clusters = cfg.clusters_on(num_sms)
    dp, tail = cfg.hybrid(problem.m, problem.n, clusters)
    if tail == 0 or (dp and tail * cfg.splits > clusters):
        return False
    return cfg.workspace_floats(problem.m, problem.n, clusters=clusters) * 4 < 2**31


def choose(problem: GemmProblem, num_sms: int = H100.sms, model: MachineModel = MODEL) -> Sm90Config:
    """The configuration ``gemmlab.gemm`` runs for ``problem`` on ``num_sms`` SMs (``model``: :func:`model_for`)."""
    return _choose(problem, _check_args(problem, num_sms, model), model)


@functools.lru_cache(maxsize=4096)
def _choose(problem: GemmProblem, num_sms: int, model: MachineModel) -> Sm90Config:
    return candidates(problem, num_sms, model)[0].config


def explain(problem: GemmProblem, num_sms: int = H100.sms, top: int = 6, model: MachineModel = MODEL) -> str:
    """The reasoning behind :func:`choose`, as text: the best ``top`` variants and the model's numbers."""
    cands = candidates(problem, num_sms, model)
    p = problem
    lines = [f"(M, N, K) = ({p.m}, {p.n}, {p.k}) on {num_sms} SMs: floor {p.flops / model.peak_tflops / 1e6:.1f} us "
             f"of math, {p.min_bytes() / (model.hbm_tbps * 1e6):.1f} us of HBM traffic (datasheet rates)"]
    for i, c in enumerate(cands[:top]):
        mark = "  <- chosen" if i == 0 else ""
        dp = f" ({c.dp_tiles} whole)" if c.dp_tiles else ""
        lines.append(f"  {c.config.name:<32} {c.units:5d} units{dp} {c.waves:3d} wave(s) useful {c.useful:6.1%}  "
                     f"unit {c.unit_us:7.2f} us  HBM {c.hbm_us:7.2f} us  L2 {c.l2_us:7.2f} us  split {c.extra_us:4.1f} us  "
                     f"-> {c.time_us:7.2f} us{mark}")
    return "\n".join(lines)

