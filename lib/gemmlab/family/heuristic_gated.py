"""Chapter 11: choosing the gated NVFP4 kernels' configuration for a problem.

On Hopper the fast twin (:mod:`gemmlab.kernels.dual_gemm_sm90_pipelined`) has one decision: the
width of its tile, ``tile_n`` (32, 48 or 64 columns of each GEMM). Narrow tiles cost more
dequantization per MMA (each CTA converts its own B rows and all 128 of its A rows), so the
widest tile whose grid fills the GPU wins (:func:`choose_tile_n`). The public call no longer takes it: each
of the other twins has a time model, and :func:`choose_sm90` takes the one of least modelled time among those that
serve M. The decode twin (:mod:`gemmlab.kernels.dual_gemm_sm90_decode`, :func:`choose_decode_config`) serves M up to
:data:`DECODE_UP_TO`; the A16 twin (:mod:`gemmlab.kernels.dual_gemm_sm90_a16`: A converted to FP16 once per call, SS
WGMMA over stacked [B1; B2] converted in shared memory; :func:`choose_a16`) and the W16 route
(:mod:`gemmlab.kernels.dual_gemm_sm90_w16`: the weights converted to FP16 once per call too, then chapter 07's GEMM
with a gated epilogue; :func:`w16_candidate`) every M from :data:`A16_FROM`; the swap twin
(:mod:`gemmlab.kernels.dual_gemm_sm90_swap`: the A16 twin's FP16 A read by TMA, the weights converted in the MMA
threads' registers as in the decode twin; :func:`choose_swap`) M from :data:`SWAP_FROM` to :data:`SWAP_UP_TO`, and it
takes M from :data:`SWAP_FROM` to :data:`DECODE_UP_TO` outright. Timed beside each other on an H100 (2026-11-27,
``results/nvidia-h100-80gb-hbm3/dual_gemm_swap.json``: 24 shapes, M = 64 to 1024, kernels alone; the data the swap
model was fitted to), the choice was within 4 % of the fastest configuration timed on all 24, and faster than the
choice without the swap twin on 15 of them (1.04x to 1.36x, none slower); the A16 against
W16 choice was the faster of the two on 25 of 27 shapes on the H100 and 18 of 18 on the H200
(``results/<device>/dual_gemm_w16.json``). On Blackwell the SM100 kernel runs its default
:class:`~gemmlab.family.configs.DualSm100Config` (compile-verified only: no B200 timed a choice).
"""
from __future__ import annotations

import functools

from ..checks import check_int
from ..hardware import H100
from .. import nvfp4 as fp4
from .configs import (DECODE_MAX_TOKENS, DECODE_MMA_WARPGROUPS, DECODE_SPLITS, DECODE_TOKEN_MULTIPLE, GATED_TILE_M,
                      PIPELINED_TILE_NS, A16_TILE_NS, A16Config, DecodeConfig, DualSm100Config, PipelinedConfig,
                      SwapConfig, W16Config, a16_max_stages, decode_max_stages, swap_max_stages)
from .heuristic_sm90 import SWAP_ONLY_M
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


def choose_sm90(problem: GatedProblem, num_sms: int = H100.sms, clusters: tuple[int, ...] | None = None,
                model=None, swap: bool = True) -> PipelinedConfig | DecodeConfig | A16Config | SwapConfig | W16Config:
    """The Hopper configuration for ``problem`` on ``num_sms`` SMs. From :data:`SWAP_FROM` to :data:`DECODE_UP_TO`
    rows the swap twin's (:func:`choose_swap`) where it has one; below, the decode twin's
    (:func:`choose_decode_config`). From :data:`A16_FROM` rows the one of least modelled time among the A16 twin's
    (:func:`choose_a16`, :func:`a16_time`), the W16 route's (:func:`choose_w16`, :func:`w16_time`; ``model``: chapter
    07's :class:`~gemmlab.family.heuristic_sm90.MachineModel` of the GPU, None: an H100's) and, up to
    :data:`SWAP_UP_TO` rows, the swap twin's (:func:`swap_time`). ``clusters``: how many clusters of 1, 2 and 4 CTAs
    the GPU runs at once (the plan asks the driver; None: an H100's scaled to ``num_sms``). ``swap`` False: the choice
    without the swap twin (what the public call took before it; the sweeps time it beside)."""
    m, n, k = problem.m, problem.n, problem.k
    clusters = check_clusters(clusters, num_sms)
    options = []
    if not isinstance(swap, bool):
        raise TypeError(f"swap must be a bool; got {type(swap).__name__}")
    swap = choose_swap(m, n, k, num_sms, clusters) if swap and SWAP_FROM <= m <= SWAP_UP_TO else None
    if m <= DECODE_UP_TO:
        if swap is not None:  # timed faster than the decode twin's pick wherever both ran (SWAP_FROM)
            return swap
        dec = choose_decode_config(m, n, k, num_sms, clusters)
        options.append((decode_cost(dec, n, k, clusters), dec))
    if m >= A16_FROM:
        a16 = choose_a16(m, n, k, num_sms)
        options.append((a16_time(m, n, k, a16.tile_n, num_sms, a16.converters), a16))
        w16 = w16_candidate(m, n, k, num_sms, model)
        if w16 is not None:
            options.append((w16[1], w16[0]))
    if swap is not None:
        options.append((swap_time(swap, m, n, k, clusters), swap))
    if not options:  # not reached: the decode twin serves every M up to 128, the A16 twin every M above
        return PipelinedConfig(tile_n=choose_tile_n(m, n, num_sms))
    return min(options, key=lambda o: o[0])[1]


#: The W16 route's cost beyond its three kernels' modelled times, microseconds: two more launches (the A pre-pass and
#: the weight pass) and the GEMM's start after them. An estimate (not fitted).
W16_FIXED_US = 4.0


def w16_pass_us(m: int, n: int, k: int, model=None) -> float:
    """The W16 route's two conversion passes at the model's HBM rate, microseconds: the A pre-pass reads ``M K / 2``
    packed and ``M K / 16`` scale bytes and writes ``2 M K`` FP16 bytes; the weight pass the same for ``2 N`` rows."""
    from .heuristic_sm90 import MODEL

    model = MODEL if model is None else model
    per_value = 0.5 + 1 / 16 + 2  # packed, scale and FP16 bytes per value
    return (m + 2 * n) * k * per_value / (model.hbm_tbps * model.hbm_efficiency * 1e6)


def w16_candidate(m: int, n: int, k: int, num_sms: int = H100.sms, model=None):
    """``(W16Config, modelled microseconds)`` of the W16 route's best GEMM for M x N x K, or None where chapter 07's
    heuristic has no candidate for it: the gated epilogue takes no swap, no split-K and two consumer warpgroups of 64
    rows (``wg_rows`` 64: a warpgroup pairs the two halves of its columns in its own registers), a ``tile_n`` that is
    a multiple
    of 64 (so the output tile, ``tile_n / 2``, is a multiple of the 32-column epilogue sub-tile) and N a multiple of
    ``tile_n / 2``. The GEMM is priced as chapter 07's model prices ``M x 2N x K`` in FP16
    (:func:`~gemmlab.family.heuristic_sm90.candidates`), plus :func:`w16_pass_us` and :data:`W16_FIXED_US`."""
    m = check_int("m", m, lo=1)
    n = check_int("n", n, lo=1)
    k = check_int("k", k, lo=1)
    num_sms = check_int("num_sms", num_sms, lo=1)
    return _w16_candidate(m, n, k, num_sms, model)


@functools.lru_cache(maxsize=1024)
def _w16_candidate(m: int, n: int, k: int, num_sms: int, model):
    from dataclasses import replace

    from .heuristic_sm90 import MODEL, candidates
    from .problem import GemmProblem

    model = MODEL if model is None else model
    for c in candidates(GemmProblem(m, 2 * n, k, "float16", "float16"), num_sms, model):
        g = c.config
        if g.swap_ab or g.split_k or g.wg_rows != 64 or g.tile_n % 64 or n % (g.tile_n // 2):
            continue
        return W16Config(replace(g, gated=True)), c.time_us + w16_pass_us(m, n, k, model) + W16_FIXED_US
    return None


def w16_time(m: int, n: int, k: int, num_sms: int = H100.sms, model=None) -> float:
    """The W16 route's modelled time (:func:`w16_candidate`), microseconds; a ValueError where it has no candidate."""
    cand = w16_candidate(m, n, k, num_sms, model)
    if cand is None:
        raise ValueError(f"the W16 route has no configuration for M={m}, N={n}, K={k} (it needs M > "
                         f"{SWAP_ONLY_M}, unswapped tiles, and N a multiple of half a tile of 64 to 256 columns)")
    return cand[1]


def choose_w16(m: int, n: int, k: int, num_sms: int = H100.sms, model=None) -> W16Config:
    """The W16 route's configuration for M x N x K (:func:`w16_candidate`); a ValueError where it has none."""
    cand = w16_candidate(m, n, k, num_sms, model)
    if cand is None:
        w16_time(m, n, k, num_sms, model)  # raises, naming the rule
    return cand[0]


#: The fewest rows of A for which the public call considers the A16 twin (A converted to FP16 once by a pre-pass, SS
#: WGMMA over stacked [B1; B2]): the first M the decode twin does not take. On an H100 (2026-11-27, ``benchmarks/dual_gemm.py a16``,
#: kernels alone) its best width beat the fast twin on all 24 shapes of :data:`~gemmlab.measure.dual_gemm.A16_SWEEP_SHAPES`,
#: M = 200 to 1024: by 1.06x (256 x 3072 x 4096, 36.5 against 38.8 us) to 1.63x (640 x 4096 x 7168). From 129 to 256
#: rows both kernels run two 128-row tiles, as at M = 200 and 256.
A16_FROM = 129

#: The A16 twin's time model, microseconds: ``waves x K / 1024 x (per_kilo + per_kilo_col x tile_n / 128) + fixed``,
#: ``waves`` = ceil(CTAs / SMs) (one CTA per SM: 212 to 218 KiB of shared memory), ``CTAs`` = ceil(M / 128) ceil(N /
#: tile_n). Least squares on the 144 timings of that H100 sweep (6 widths x 24 shapes): 5.6 us rms (4 % relative), and
#: its pick is the sweep's fastest width on all 24 shapes.
A16_COST = (2.94, 11.89, 4.26)


#: The time of the A16 twin with two converter warpgroups (``A16Config(converters=2)``: ``tile_n`` 64 or 96) over its
#: time with one, by width: the geometric mean over six shapes (M = 200 to 1024) timed on an H100 (2026-11-27,
#: ``results/nvidia-h100-80gb-hbm3/dual_gemm_a16_converters.json``, kernels alone; 0.834 to 0.856 at 64, 0.955 to
#: 0.964 at 96). :data:`A16_COST` was fitted with one converter warpgroup.
A16_TWO_CONVERTERS = {64: 0.843, 96: 0.958}

#: The time of the A16 twin's cluster form (``A16Config(cluster_m=2)``: two CTAs along M share the converted B, each
#: converting one half and sending it to the peer by bulk copy) over the one-CTA form's per wave, by width (64, 96,
#: 128). Empty: timed on an H100 (2026-11-27, ``results/nvidia-h100-80gb-hbm3/dual_gemm_a16_cluster.json``, 9 shapes)
#: the form was correct but 0.96 to 0.99 of the one-CTA time at ``tile_n`` 64 (where two converter warpgroups take
#: 0.84) and 1.39 to 1.47 times it at 96 and 128 (see :mod:`gemmlab.kernels.dual_gemm_sm90_a16`), so :func:`a16_time`
#: refuses it and :func:`choose_a16` never picks it.
A16_CLUSTER: dict = {}


def a16_time(m: int, n: int, k: int, tile_n: int, num_sms: int = H100.sms, converters: int = 1,
             cluster_m: int = 1) -> float:
    """:data:`A16_COST`'s time (microseconds) of the A16 twin at ``tile_n`` on an M x N x K problem; with two converter
    warpgroups, scaled by :data:`A16_TWO_CONVERTERS`. ``cluster_m`` 2: M tiles rounded up to whole clusters, waves of
    ``num_sms // 2`` clusters, scaled by :data:`A16_CLUSTER` (a ValueError while it has no factor for ``tile_n``)."""
    per_kilo, per_kilo_col, fixed = A16_COST
    if cluster_m == 2:
        if tile_n not in A16_CLUSTER:
            raise ValueError(f"a16_time has no factor for cluster_m=2 at tile_n={tile_n}: A16_CLUSTER holds the "
                             f"widths timed on a GPU ({sorted(A16_CLUSTER) or 'none yet'})")
        clusters = -(-m // (2 * GATED_TILE_M)) * -(-n // tile_n)
        waves = -(-clusters // (num_sms // 2))
        return (waves * k / 1024 * (per_kilo + per_kilo_col * tile_n / 128)) * A16_CLUSTER[tile_n] + fixed
    if cluster_m != 1:
        raise ValueError(f"cluster_m must be one of 1, 2; got {cluster_m!r}")
    waves = -(-(-(-m // GATED_TILE_M) * -(-n // tile_n)) // num_sms)
    t = waves * k / 1024 * (per_kilo + per_kilo_col * tile_n / 128) + fixed
    return t * A16_TWO_CONVERTERS[tile_n] if converters == 2 else t


#: The most converter warpgroups the public call's A16 configuration uses. The two-converter form (``tile_n`` 64 and 96)
#: passed compute-sanitizer memcheck and racecheck and the GPU test suite on an H100 on 2026-11-27
#: (``results/nvidia-h100-80gb-hbm3/dual_gemm_a16_sanitizer_two.txt``; the tests of every width: 56 passed), so the
#: public call takes it wherever :func:`a16_time` finds it the fastest (``max_converters=1`` shows the one-converter
#: choice).
A16_PUBLIC_CONVERTERS = 2


def choose_a16(m: int, n: int, k: int, num_sms: int = H100.sms, max_converters: int = A16_PUBLIC_CONVERTERS
               ) -> A16Config:
    """The A16 twin's configuration: the width, and for 64 and 96 the number of converter warpgroups (up to
    ``max_converters``), that :func:`a16_time` finds fastest (the wider on a tie: each converted B element serves 128
    rows of C either way, and a wider WGMMA reads A from shared memory for more columns), with its deepest ring. A
    narrower tile costs more per column but can fill a wave the wider one leaves partly idle: at 512 x 3072 x 7168
    tile_n 96 makes 128 CTAs of one wave where 128 makes 96."""
    m = check_int("m", m, lo=1)
    n = check_int("n", n, lo=1)
    k = check_int("k", k, lo=1)
    num_sms = check_int("num_sms", num_sms, lo=1)
    max_converters = check_int("max_converters", max_converters, lo=1, hi=2)
    forms = [(bn, 1) for bn in A16_TILE_NS] + [(bn, 2) for bn in A16_TWO_CONVERTERS if max_converters == 2]
    tile_n, converters = min(forms, key=lambda f: (a16_time(m, n, k, f[0], num_sms, f[1]), -f[0], -f[1]))
    return A16Config(tile_n, a16_max_stages(tile_n), converters=converters)


#: The most rows of A the decode twin takes (its one token tile); the public call runs it below :data:`SWAP_FROM`
#: rows, and from there to this many where the swap twin has no configuration that fills the GPU. Timed on an H100
#: (2026-11-27, ``benchmarks/dual_gemm.py decode``, kernels alone) at M = 1, 32, 64, 96 and 128 on 4096 x 7168, 3072 x 4096 and
#: 14336 x 4096 weights, the configuration :func:`choose_decode_config` picks ran 1.03x (128 x 3072 x 4096) to 2.6x
#: (1 x 4096 x 7168) faster than the fast twin; correct there in every form (one or two MMA warpgroups, split 1, 2, 4).
DECODE_UP_TO = DECODE_MAX_TOKENS

#: Clusters of 1, 2 and 4 CTAs an H100 runs at once with one CTA per SM, where the plan cannot ask the driver
#: (:func:`gemmlab.hardware.max_active_clusters`, which answered 132, 66 and 30 on an H100 on 2026-11-27, and 15
#: clusters of 8): a cluster's CTAs share a GPC, and the GPCs are of unequal size, so 30 quads use 120 SMs.
H100_CLUSTERS = (132, 66, 30)

#: The decode twin's time model, microseconds, fitted by least squares to the 81 configurations the H100 sweep timed
#: (2026-11-27; 5 us rms; its pick is 3 % slower than the sweep's best on average, 20 % at worst): a fixed cost; per
#: 64 weight rows x k-block a CTA streams, summed over waves (an MMA warp's conversions are the bottleneck); the same
#: scaled by tokens / 64 (the token tile's WGMMA columns); per wave; and split-K's reduction.
DECODE_COST = (3.04, 0.59, 0.70, 6.92, 2.20)


def decode_cost(cfg: DecodeConfig, n: int, k: int, clusters: tuple[int, ...]) -> float:
    """:data:`DECODE_COST`'s model of ``cfg``'s time at N x K, in microseconds, on a GPU running ``clusters[i]``
    clusters of ``DECODE_SPLITS[i]`` CTAs at once."""
    blocks = -(-n // cfg.rows)
    waves = -(-blocks // clusters[DECODE_SPLITS.index(cfg.split)])
    work = waves * -(-(k // fp4.K_MULTIPLE) // cfg.split) * cfg.mma_warpgroups
    c0, c_work, c_tokens, c_wave, c_split = DECODE_COST
    return c0 + work * (c_work + c_tokens * cfg.tokens / 64) + c_wave * waves + c_split * (cfg.split > 1)


def decode_candidates(m: int, k: int) -> list[DecodeConfig]:
    """Every decode-twin configuration for M rows and K: tokens = M rounded up to 16, one or two MMA warpgroups,
    split 1, 2 or 4 (no more than the k-blocks), the deepest ring that fits shared memory (two warpgroups at 128
    tokens fit none)."""
    tokens = -(-m // DECODE_TOKEN_MULTIPLE) * DECODE_TOKEN_MULTIPLE
    out = []
    for wgs in DECODE_MMA_WARPGROUPS:
        for split in DECODE_SPLITS:
            if split > k // fp4.K_MULTIPLE:
                continue
            try:
                out.append(DecodeConfig(tokens, wgs, split, decode_max_stages(tokens, wgs, split)))
            except ValueError:  # not even the shallowest ring fits
                pass
    return out


def choose_decode_config(m: int, n: int, k: int, num_sms: int = H100.sms,
                         clusters: tuple[int, ...] | None = None) -> DecodeConfig:
    """The decode twin's configuration for M x N x K (M <= 128): the candidate (:func:`decode_candidates`) of least
    modelled time (:func:`decode_cost`), the fewer MMA warpgroups and the smaller split on a tie.

    ``clusters``: how many clusters of 1, 2 and 4 CTAs the GPU runs at once (the plan asks the driver); None: an
    H100's (:data:`H100_CLUSTERS`) scaled to ``num_sms``. Checked here, before the cache: ``66.0`` would hash as 66.
    """
    m = check_int("m", m, lo=1, hi=DECODE_MAX_TOKENS)
    n, k, num_sms = (check_int(name, v, lo=1) for name, v in (("n", n), ("k", k), ("num_sms", num_sms)))
    return _choose_decode_config(m, n, k, check_clusters(clusters, num_sms))


def check_clusters(clusters, num_sms: int = H100.sms) -> tuple[int, ...]:
    """``clusters`` (how many clusters of 1, 2 and 4 CTAs the GPU runs at once, as the plan asks the driver) checked:
    a tuple of three counts >= 1, as plain ints; None: an H100's (:data:`H100_CLUSTERS`) scaled to ``num_sms``."""
    if clusters is None:
        return tuple(max(1, c * num_sms // H100.sms) for c in H100_CLUSTERS)
    if not isinstance(clusters, tuple) or len(clusters) != len(DECODE_SPLITS):
        raise ValueError(f"clusters must be a tuple of {len(DECODE_SPLITS)} counts (clusters of "
                         f"{', '.join(map(str, DECODE_SPLITS))} CTAs at once); got {clusters!r}")
    return tuple(check_int(f"clusters[{i}]", c, lo=1) for i, c in enumerate(clusters))


@functools.lru_cache(maxsize=1024)
def _choose_decode_config(m: int, n: int, k: int, clusters: tuple[int, ...]) -> DecodeConfig:
    return min(decode_candidates(m, k), key=lambda c: (decode_cost(c, n, k, clusters), c.mma_warpgroups, c.split))


#: The swap twin's grids the candidates keep: at least this share of one wave of CTAs, at most this many waves.
SWAP_GRID = (0.45, 2.1)


def swap_candidates(m: int, n: int, k: int, num_sms: int = H100.sms) -> list[SwapConfig]:
    """The swap twin's configurations worth timing or modelling for M x N x K: token tiles that cover M in the fewest
    tiles of at most 128 rows, or (M > 128) one more (``tokens`` M / tiles rounded up to 16), one or two MMA
    warpgroups, split 1, 2 or 4 (M > 128: 1 or 2; no more than the k-blocks; ``tokens`` a multiple of 8 x split), the
    deepest ring; only grids of :data:`SWAP_GRID` waves, except the fewest tiles with two MMA warpgroups unsplit."""
    m = check_int("m", m, lo=1)
    n = check_int("n", n, lo=1)
    k = check_int("k", k, lo=1)
    num_sms = check_int("num_sms", num_sms, lo=1)
    fewest = -(-m // DECODE_MAX_TOKENS)
    out = []
    for tiles in (fewest, fewest + 1) if m > DECODE_MAX_TOKENS else (fewest,):
        tokens = -(-(-(-m // tiles)) // DECODE_TOKEN_MULTIPLE) * DECODE_TOKEN_MULTIPLE
        if tiles > fewest and -(-m // tokens) == fewest:
            continue
        for wgs in DECODE_MMA_WARPGROUPS:
            for split in DECODE_SPLITS if m <= DECODE_MAX_TOKENS else DECODE_SPLITS[:2]:
                if split > k // fp4.K_MULTIPLE or tokens % (8 * split):
                    continue
                ctas = -(-n // (64 * wgs)) * -(-m // tokens) * split
                widest = tiles == fewest and wgs == 2 and split == 1  # kept at any size: many waves fill well
                if ctas < SWAP_GRID[0] * num_sms or (ctas > SWAP_GRID[1] * num_sms and not widest):
                    continue
                cfg = SwapConfig(tokens, wgs, split, swap_max_stages(tokens, wgs))
                if cfg not in out:
                    out.append(cfg)
    return out


#: The rows of A for which the public call considers the swap twin: the M its time model (:data:`SWAP_COST`) was
#: fitted to. Up to :data:`DECODE_UP_TO` rows it takes the swap twin outright: on the H100 sweep its pick beat the
#: decode twin's on all six shapes with M = 64 and 128 (1.04x at 64 x 14336 x 4096 to 1.36x at 128 x 14336 x 4096,
#: kernels alone), where the decode twin's model (:data:`DECODE_COST`) priced the decode twin up to 11 % below its time.
SWAP_FROM = 64
SWAP_UP_TO = 1024

#: The swap twin's time model, microseconds: ``fixed + waves x kpc x (per_kb[w] + per_kb_tok[w] x tokens / 64) +
#: per_wave x waves + split x (split > 1) + prepass x M K / 10^6``, ``w`` the MMA warpgroups (index 0: one, 1: two),
#: ``kpc`` the k-blocks per CTA (ceil(K / 256 / split)), ``waves`` the rounds of clusters of ``split`` CTAs the GPU runs
#: at once over ``ceil(N / rows) x ceil(M / tokens)`` of them. Least squares on the 84 timings of the H100 sweep
#: (2026-11-27, ``results/nvidia-h100-80gb-hbm3/dual_gemm_swap.json``, 24 shapes, M = 64 to 1024, kernels alone):
#: 3.0 us rms (5.5 % relative), and its pick is within 1.3 % of the sweep's fastest swap configuration on all 24.
SWAP_COST = dict(fixed=3.141, per_kb=(0.482, 1.722), per_kb_tok=(0.680, 0.656), per_wave=4.799, split=7.199,
                 prepass=0.399)


def swap_time(cfg: SwapConfig, m: int, n: int, k: int, clusters: tuple[int, ...] = H100_CLUSTERS) -> float:
    """:data:`SWAP_COST`'s time (microseconds) of the swap twin's ``cfg`` on an M x N x K problem, on a GPU running
    ``clusters[i]`` clusters of ``DECODE_SPLITS[i]`` CTAs at once (:func:`check_clusters`)."""
    if not isinstance(cfg, SwapConfig):
        raise TypeError(f"cfg must be a SwapConfig; got {type(cfg).__name__}")
    m, n, k = (check_int(name, v, lo=1) for name, v in (("m", m), ("n", n), ("k", k)))
    clusters = check_clusters(clusters)
    c = SWAP_COST
    w = cfg.mma_warpgroups - 1
    waves = -(-(-(-n // cfg.rows) * -(-m // cfg.tokens)) // clusters[DECODE_SPLITS.index(cfg.split)])
    kpc = -(-(k // fp4.K_MULTIPLE) // cfg.split)
    return (c["fixed"] + waves * kpc * (c["per_kb"][w] + c["per_kb_tok"][w] * cfg.tokens / 64)
            + c["per_wave"] * waves + c["split"] * (cfg.split > 1) + c["prepass"] * m * k / 1e6)


def choose_swap(m: int, n: int, k: int, num_sms: int = H100.sms, clusters: tuple[int, ...] | None = None
                ) -> SwapConfig | None:
    """The swap twin's candidate (:func:`swap_candidates`) of least modelled time (:func:`swap_time`), None where it
    has none; the fewer MMA warpgroups and the smaller split on a tie. ``clusters``: as :func:`check_clusters`
    takes them."""
    cands = swap_candidates(m, n, k, num_sms)
    clusters = check_clusters(clusters, num_sms)
    if not cands:
        return None
    return min(cands, key=lambda c: (swap_time(c, m, n, k, clusters), c.mma_warpgroups, c.split))


def choose_sm100(problem: GatedProblem, num_sms: int | None = None) -> DualSm100Config:
    """The SM100 kernel's configuration: its defaults (one persistent CTA per SM; ``num_sms`` None: a B200's)."""
    return DualSm100Config() if num_sms is None else DualSm100Config(num_ctas=num_sms)
