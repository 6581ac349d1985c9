"""Chapter 08: choosing the grouped kernel's tile, grid, schedule and store for a problem.

Everything here is decided from a :class:`~gemmlab.family.problem.GroupedProblem` (the tokens, the
experts, N and K) and the GPU, never from ``offs``: the group sizes stay on the device. A plan
(:mod:`gemmlab.family.plan`) asks once per call signature:

* :func:`default_config`: the tile (:func:`choose_config`, with what was measured on this GPU:
  :data:`PAIRS_FROM`, :data:`DECODE_TILE`);
* :func:`ragged_grid` / :func:`persistent_grid`: the CTAs to launch;
* :func:`schedule`: how the tiles are handed out (:func:`dynamic_schedule`), in which order
  (:func:`largest_first`, the mixed order of :func:`mixed_rows`) and where each tile's store
  goes (:func:`store_under_next`).

Every rule says what it was fitted on (``benchmarks/grouped_gemm.py``; the stored runs are in
``results/<device>/grouped_gemm_*.json`` and :mod:`gemmlab.measure.grouped` reads them back).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from ..checks import check_choice, check_int
from ..hardware import spec_of
from .configs import (INT32_MAX, L2_PROMOTIONS, LARGE, LARGE_C2, MEDIUM, ORDER_MAX, SMALL, SMALL_WIDE, Sm90Config,
                      check_grouped_config)
from .problem import GroupedProblem

#: Tokens per expert from which the 2-CTA clusters were measured faster, by GPU (``GPUSpec.short``;
#: ``benchmarks/grouped_gemm.py sweep_sched``). Other GPUs: never (not measured).
PAIRS_FROM = {"H100": 512, "H200": 512}
#: ... and only with at most this many experts (measured: 8 experts pairs win, 32 dynamic single CTAs win).
PAIRS_UP_TO_GROUPS = 16
#: The decode tile by GPU (``sweep_sched``, both dynamic): on an H200 the wide one (1.03x geomean over
#: ``SMALL`` on the 28 decode sets, 0.98-1.10x), on an H100 ``SMALL`` (the wide one 0.97-1.01x, geomean 0.996x).
#: ``sweep_decode`` (24 decode sets): 64 x 192 is within 1 % of the chosen tile on both GPUs (0.6 % faster on
#: the H200), 64 x 64 1.10x (H100) and 1.44x (H200) slower. Other GPUs: ``SMALL``.
DECODE_TILE = {"H100": SMALL, "H200": SMALL_WIDE}
#: A decode tile wider than ``SMALL`` only when N gives it this many tiles per expert. Measured on an H200
#: (``benchmarks/grouped_gemm.py sweep_narrow``: 64 x 256 against 64 x 128, 6 decode sets per width, K = 4096):
#: the wide tile 1.12x slower at N = 512, 1.04x at 1536, 1.03x at 2048 (0.97-1.10x), 1 % faster at 3072; at 1024
#: 2 % faster but spread over 0.89-1.10x. The benchmark's N of 4096 and more: 1.03x faster (``sweep_sched``).
#: On an H100 (decode tile 64 x 128 at every width) the wide tile is 1.03-1.09x slower at 512, 1536 and 2048.
DECODE_WIDE_FROM_TILES = 12
#: Past decode, from 2048 to fewer than :data:`NARROW_BELOW_TOKENS` tokens, experts of at most this many weights
#: (N x K) run the 64 x 256 tile, by GPU. Measured on an H100 (``benchmarks/grouped_gemm.py sweep_wide_narrow``:
#: Qwen3-30B-A3B's and OLMoE's expert GEMMs, 768 x 2048 to 2048 x 1024, 64 and 128 experts, 4096 and 16384 tokens;
#: ``results/nvidia-h100-80gb-hbm3/grouped_gemm_sweep_wide_narrow.json``, rerun 2026-11-27 on today's kernel): at
#: 4096 tokens 64 x 256 and 128 x 256 (dynamic) split the 8 sets, within 5 % of each other (64 x 256 1 % faster
#: summed); at 16384 tokens 128 x 256 was the fastest on all 8, by up to 1.16x (OLMoE, 64 experts: 162 against 188
#: us). An earlier kernel had 64 x 256 fastest on 13 of the 16. With 14.7 M weights and more (DeepSeek-V3, Mixtral:
#: ``sweep_sched``) 128 x 256 wins at every set of 4096 tokens or more, by 1.03x to 1.49x. Between 2 M and 14.7 M
#: nothing was swept. Other GPUs: never (not measured).
NARROW_UP_TO = {"H100": 2048 * 1024}
#: The narrow rule's token limit (exclusive): 8192, halfway between the sets where it was measured to pay (4096) and
#: not to (16384), on a log scale; nothing between was measured.
NARROW_BELOW_TOKENS = 8192


def gpu_of(device) -> str | None:
    """``GPUSpec.short`` of CUDA ``device``, the key of :data:`PAIRS_FROM` and :data:`DECODE_TILE`; None for a
    GPU the course does not know, or without CUDA."""
    spec = spec_of(device)
    return spec.short if spec is not None else None


def decode_tile(device) -> Sm90Config:
    """:data:`DECODE_TILE` for CUDA ``device`` (``SMALL`` where not measured)."""
    return DECODE_TILE.get(gpu_of(device), SMALL)


def config_for_gpu(gpu: str | None, tokens: int, groups: int, n: int, k: int) -> Sm90Config:
    """:func:`choose_config` with what was measured on ``gpu`` (``GPUSpec.short``): :data:`PAIRS_FROM`,
    :data:`DECODE_TILE` and :data:`NARROW_UP_TO`; elsewhere no pairs, ``SMALL`` and no narrow rule."""
    return choose_config(tokens, groups, n, k, PAIRS_FROM.get(gpu, float("inf")), DECODE_TILE.get(gpu, SMALL),
                         NARROW_UP_TO.get(gpu, 0))


def default_config(tokens: int, groups: int, n: int, k: int, device, dtype: str = "bfloat16") -> Sm90Config:
    """The configuration the calls run on ``device`` when given none: :func:`config_for_gpu` for its GPU, for
    ``dtype``'s operands (the tiles were measured in BF16; FP16 runs the same tile, compiled for FP16)."""
    cfg = config_for_gpu(gpu_of(device), tokens, groups, n, k)
    return cfg if cfg.dtype == dtype else replace(cfg, dtype=dtype, out_dtype=dtype)


def choose_config(tokens: int, groups: int, n: int, k: int, pairs_from: float = float("inf"),
                  decode: Sm90Config = SMALL, narrow_up_to: int = 0) -> Sm90Config:
    """A tile configuration from the tokens and the experts (the host never reads ``offs``).

    Measured on an H100 and an H200, every tile on the 64 MoE sets in one run
    (``benchmarks/grouped_gemm.py sweep_sched``; ``results/<device>/grouped_gemm_sweep_sched.json``):

    * up to 24 tokens per expert (decode): every expert's weights are read
      once whatever the tile, so a 64-row tile (the least MMA work wasted on
      rows past a group's end), ``decode`` wide (:data:`DECODE_TILE`) if
      ``n`` gives it :data:`DECODE_WIDE_FROM_TILES` tiles per expert, else 128
      wide (on narrow outputs the narrower tile keeps twice the SMs busy);
    * from 2048 to fewer than :data:`NARROW_BELOW_TOKENS` tokens, experts of at
      most ``narrow_up_to`` weights (:data:`NARROW_UP_TO`): 64 x 256, one CTA
      per tile, dynamic: the experts' GEMMs are short (K or N of 768 to 2048),
      and twice the tiles of 128 x 256 keep more SMs streaming weights;
    * fewer than 2048 tokens in all: 128 x 192 (128 x 256 past 160 per
      expert): the few tiles of 128 x 256 fill the SMs unevenly;
    * more: 128 x 256, in clusters of two CTAs along M that share each weight
      tile by multicast (half the L2 -> SM traffic for B) from ``pairs_from``
      tokens per expert with at most :data:`PAIRS_UP_TO_GROUPS` experts, else
      one CTA per tile with tiles handed out dynamically
      (:func:`dynamic_schedule`). With 8 experts of 512 or more tokens the
      pairs win (geomean 1.045x on an H100, 1.017x on an H200); with 32
      experts of 512 the single CTAs do (1.012x, 1.038x), and below 512 per
      expert by far (1.075x, 1.24x). Our reading: skewed sizes leave uneven
      work that only the dynamic order rebalances (the pairs keep a static
      one), while a few big experts are even work where halving B's traffic
      counts more.
    """
    per_expert = tokens / max(groups, 1)
    if per_expert <= 24:
        return decode if n >= DECODE_WIDE_FROM_TILES * decode.tile_n else SMALL
    if 2048 <= tokens < NARROW_BELOW_TOKENS and n * k <= narrow_up_to:
        return SMALL_WIDE
    if tokens < 2048:
        return MEDIUM if per_expert <= 160 else LARGE
    return LARGE_C2 if per_expert >= pairs_from and groups <= PAIRS_UP_TO_GROUPS else LARGE


def persistent_grid(cfg: Sm90Config, sms: int, m_units: int, n_tiles: int) -> int:
    """CTAs to launch: one per SM, whole clusters, no more clusters than there are work units (an upper bound)."""
    cm = cfg.cluster[0]
    return cm * max(1, min(sms // cm, m_units * n_tiles))


def ragged_grid(cfg: Sm90Config, sms: int, rows: int, groups: int, n: int) -> int:
    """:func:`persistent_grid` for the ragged form: at most ``ceil(T / unit rows) + G`` units of rows (each group
    may end in a partial one) times the column tiles."""
    return persistent_grid(cfg, sms, -(-rows // (cfg.tile_m * cfg.cluster[0])) + groups, -(-n // cfg.tile_n))


def table_grid(cfg: Sm90Config, sms: int, shapes) -> int:
    """:func:`persistent_grid` for the list form: the exact work units of the problems' ``(M, N)`` ``shapes``."""
    return persistent_grid(cfg, sms, sum(-(-m // (cfg.tile_m * cfg.cluster[0])) * -(-n // cfg.tile_n)
                                         for m, n in shapes), 1)


#: With dynamic scheduling, the 128-row tiles visit the groups largest first only from this many tokens.
#: Measured (``benchmarks/grouped_gemm.py order``: 128 x 256 with dynamic scheduling, both orders side by side on the
#: 12 sets of 32, 64 and 128 experts per token count; ``results/<device>/grouped_gemm_order.json``): index order's
#: time over largest first's, geomean, at 4096 / 6144 / 8192 / 12288 / 16384 tokens: on an H100 0.989 / 0.993 /
#: 0.994 / 1.008 / 1.021, on an H200 0.987 / 0.993 / 0.993 / 1.000 / 1.005. Index order wins up to 8192 on both,
#: largest first from 12288 (by 0.8 % on the H100; a tie on the H200). Nothing between 8192 and 12288 was measured.
DYNAMIC_LARGEST_FIRST_FROM = 12288


#: Tokens per expert (on average) from which a 128-row tile stores its output under the next tile's main loop.
#: ``benchmarks/grouped_gemm.py overlap`` (the 36 sets of 128-row tiles; the kernel time with the store between two
#: main loops over with it under the next one): from 256 tokens per expert 1.013x on an H100 (1.000-1.032x, 15 of
#: 16 sets faster) and 1.015x on an H200 (0.999-1.033x, 15 of 16); below, where the tiles wait on memory and the
#: tensor cores have time to spare anyway, 0.994-1.008x and 0.994-1.012x.
OVERLAP_STORE_FROM = 256


def store_under_next(cfg: Sm90Config, tokens: int, groups: int) -> bool:
    """Whether the kernel stores each tile while the next tile's main loop runs
    (:func:`gemmlab.kernels.grouped_sm90.mma_tile_storing`) rather than between the two main loops: for the
    128-row tiles from :data:`OVERLAP_STORE_FROM` tokens per expert, where the tensor cores are the bound and
    would otherwise wait out each store."""
    return cfg.tile_m == 128 and tokens >= OVERLAP_STORE_FROM * max(groups, 1)


#: The mixed order (:func:`mixed_rows`): experts of at most this many rows are "light" (one 128-row tile per column of
#: the output: their weights are read once, so their tiles wait on memory while the heavy ones wait on the tensor
#: cores) ...
MIXED_LIGHT_ROWS = 128
#: ... and their tiles are claimed among the heavy ones' from this many tokens per expert on average ...
MIXED_FROM = 128
#: ... in blocks of this many claims, about one per SM (:func:`gemmlab.kernels.grouped_sm90.mixed_tile`).
MIXED_BURST = 128


def mixed_rows(cfg: Sm90Config, tokens: int, groups: int) -> int:
    """The light experts' rows for the mixed order with tile ``cfg`` (0: off): :data:`MIXED_LIGHT_ROWS` for 128 x 256
    tiles run one CTA each with dynamic scheduling from :data:`MIXED_FROM` tokens per expert, else 0.

    Run largest first, the experts take about the sum of their own times, each bound by its compute or by its
    bytes (:func:`gemmlab.measure.grouped.expert_bounds`): the heavy ones keep the tensor cores busy while memory idles, then the light ones
    the reverse. Claiming light tiles among the heavy ones overlaps the two. Spread one by one (``burst = 1``) they
    pushed the heavy tiles that share a weight tile apart in time, so L2 lost those tiles between their readers:
    ``ncu`` on an H100 counted 1.15-1.18x the DRAM bytes of largest first on the sets of 16384 tokens, and the
    order lost more often than it won. In blocks of 128 claims the heavy tiles of a block start close together.
    Measured on the 16 sets of 128 or more tokens per expert with 32-128 experts (``benchmarks/grouped_gemm.py
    mixed``, each against the kernel without it, in its own order, in the same run): blocks of 128 are 1.054x
    faster on an H100 (1.011-1.094x, all 16 faster), blocks of 64 1.031x, of 256 1.005x; on an H200 blocks of 128
    are 1.023x faster (0.992-1.062x), of 64 1.013x, of 32 1.005x. With fewer tokens per expert most experts are
    light, there is little compute to hide their bytes under, and the order lost: 0.95-1.00x (H100, blocks of 64,
    64 and 128 experts with 4096 tokens).
    """
    if cfg.tile_m != 128 or cfg.tile_n != 256 or cfg.cluster != (1, 1) or not dynamic_schedule(cfg):
        return 0
    return MIXED_LIGHT_ROWS if tokens >= MIXED_FROM * max(groups, 1) else 0


def largest_first(cfg: Sm90Config, tokens: int, dynamic: bool | None = None) -> bool:
    """Whether the kernel visits the groups largest first with tile ``cfg`` (else in index order).

    ``tokens``: the rows of ``a``; ``dynamic``: the scheduling (None: :func:`dynamic_schedule` decides).
    Measured on an H100 and an H200 (``benchmarks/grouped_gemm.py moe``, the
    ``order_gain`` column: the other order's time over the chosen one's).
    With 128-row tiles run one CTA each in a static order, largest first is
    up to 1.17x faster: the big, compute-bound experts run while every SM is
    busy and the short tiles of small experts fill the end. With dynamic
    scheduling the counter evens out the end whatever the order, and largest
    first pays only when the largest experts have many tiles
    (:data:`DYNAMIC_LARGEST_FIRST_FROM` tokens). With the 64-row decode tile
    every expert is one weight stream and ranking the groups costs each CTA a
    few microseconds up front: up to 1.14x slower there. In 2-CTA clusters
    neither order wins on the H100 (0.96-1.05x over two runs) and index order
    is 1-3 % ahead on the H200 (we have not looked into why), so index order
    for both.
    """
    if cfg.tile_m == 64 or cfg.cluster != (1, 1):
        return False
    dynamic = dynamic_schedule(cfg) if dynamic is None else dynamic
    return not dynamic or tokens >= DYNAMIC_LARGEST_FIRST_FROM


def dynamic_schedule(cfg: Sm90Config) -> bool:
    """Whether the kernel hands out tiles dynamically with tile ``cfg`` (else CTA ``b`` takes ``b, b + grid, ...``).

    A traced launch (:func:`gemmlab.measure.grouped.trace_launches`) shows why it can matter: on an H200, DeepSeek-V3 gate/up with 32
    experts and 64 tokens, every CTA has 4 or 5 tiles, yet the CTAs left 178 to 268 us after the first
    started: some SMs draw less bandwidth than others. Claiming tiles from a counter
    (:func:`gemmlab.scheduler.claim_tile`) evens that out (there: 218 to 254 us). That trace was one
    experiment; the benchmarks (``benchmarks/grouped_gemm.py moe``, the ``sched_gain`` column: the other
    scheduling's time over the chosen one's; ``sweep_sched``: both, every tile) say: with 128 x 256 tiles
    run one CTA each, dynamic wins on all 16 H200 sets it ran (1.01-1.17x); with the 64-row decode tiles
    it wins by a little (on an H100 1.035x geomean for 64 x 128, 0.99-1.08x; on an H200 1.017x for
    64 x 256, 0.98-1.05x). With 128 x 192 (``sweep_medium``: the 28 sets of 512 to 1536 tokens where
    :func:`choose_config` picks it) dynamic scheduling in index order (:func:`largest_first`) is 1.044x
    faster than static with largest first on an H100 (0.97-1.15x, 23 sets faster) and even on an H200
    (0.999x, 0.89-1.13x); with largest first it had been 1.06x and 1.03x slower. Pairs (2-CTA clusters) keep the
    static order: with ``dynamic=True`` the pair's first CTA claims each unit and posts it to its partner
    (:func:`gemmlab.scheduler.post_unit`), which measured no better on the sets that run in pairs
    (``sweep_pairs``: 1.004x geomean on an H100, 0.995x on an H200, 0.98-1.03x).
    """
    return cfg.cluster == (1, 1)


#: The L2 promotion of the A and B descriptors (:data:`gemmlab.kernels.grouped_sm90.L2_PROMOTIONS`): 3, 256 bytes.
#: Each row of a K-major tile is one 128-byte line per k-block; fetching 256 bytes per miss brings in
#: the next k-block's line too. Measured (``benchmarks/grouped_gemm.py moe``, the ``l2_gain`` column: time
#: with the DSL's 128 bytes over time with 256): on an H100 1.04x geomean with the 64-row decode tile and
#: with 128 x 192, 1.01x with the 2-CTA pairs; on an H200 1.00x with the 64-row tile, 1.01-1.02x with the
#: 128-row ones (0.96-1.06x on single sets). One setting for both GPUs.
L2_PROMOTION = 3




@dataclass(frozen=True)
class GroupedSchedule:
    """How the grouped kernel hands out its tiles, in which order, and where it stores them (compile-time choices)."""

    dynamic: bool  #: tiles claimed from a counter (:func:`dynamic_schedule`), else CTA ``b`` takes ``b, b + grid, ...``
    by_size: bool  #: groups visited largest first (:func:`largest_first`), else in index order
    overlap_store: bool  #: each tile stored under the next tile's main loop (:func:`store_under_next`)
    mixed: int  #: the light experts' rows of the mixed order (:func:`mixed_rows`); 0: off
    burst: int  #: claims per block of the mixed order (1 without it)


def check_options(problem: GroupedProblem, config=None, *, fences=True, by_size=None, l2_promotion=L2_PROMOTION,
                  dynamic=None, overlap_store=None, mixed=None, burst=None) -> dict:
    """The grouped call's options, checked before anything asks about the machine: a ``TypeError`` or
    ``ValueError`` naming the option, or the options as Python values (None stays None: the rule decides).

    ``config``: a tile the grouped kernel runs, for the problem's dtype; ``fences``: a bool; ``by_size``,
    ``dynamic``, ``overlap_store``: a bool or None; ``l2_promotion``: one of
    :data:`~gemmlab.family.configs.L2_PROMOTIONS`; ``mixed`` (rows) an int >= 0 or None, ``burst`` (claims) an int
    >= 1 or None (numpy ints count; floats and bools do not). An explicit mixed order (``mixed`` > 0) cannot run
    with ``dynamic=False``, ``by_size=False`` (it visits the groups largest first) or a 2-CTA ``config``.
    """
    if config is not None:
        check_grouped_config(config, problem.dtype)
    flags = {"fences": check_choice("fences", fences, (False, True))}
    for name, value in (("by_size", by_size), ("dynamic", dynamic), ("overlap_store", overlap_store)):
        flags[name] = None if value is None else check_choice(name, value, (False, True))
    l2_promotion = check_choice("l2_promotion", l2_promotion, L2_PROMOTIONS)
    mixed = None if mixed is None else check_int("mixed", mixed, lo=0, hi=INT32_MAX)
    burst = None if burst is None else check_int("burst", burst, lo=1, hi=INT32_MAX)
    if mixed:
        why = ("dynamic=False: it claims tiles from the counter" if flags["dynamic"] is False else
               "by_size=False: it visits the groups largest first" if flags["by_size"] is False else
               f"config {config.name}: it runs one CTA per tile" if config is not None and config.cluster != (1, 1)
               else None)
        if why:
            raise ValueError(f"mixed={mixed}: the mixed order cannot run with {why} (pass mixed=0 or None)")
    return dict(flags, l2_promotion=l2_promotion, mixed=mixed, burst=burst)


def schedule(cfg: Sm90Config, problem: GroupedProblem, *, dynamic: bool | None = None, by_size: bool | None = None,
             overlap_store: bool | None = None, mixed: int | None = None, burst: int | None = None) -> GroupedSchedule:
    """The schedule of tile ``cfg`` on ``problem``: each argument that is not None overrides its rule.

    The rules were fitted on the ragged form; the list form (``problem.mode == "table"``) keeps the store between
    main loops and never mixes. The mixed order is off when the call asks for static tiles or index order, and with
    more than :data:`~gemmlab.family.configs.ORDER_MAX` groups (the light groups are found by the ranking, which
    covers that many); on, it visits the groups largest first (the heavy groups' tiles come first in the numbers).
    An explicit ``mixed`` that cannot run as asked (the list form, ``by_size=False``, static tiles, pairs) is a
    ``ValueError``, not a silent change of the other choices.
    """
    tokens, groups, ragged = problem.tokens, problem.groups, problem.mode == "ragged"
    if overlap_store is None:
        overlap_store = store_under_next(cfg, tokens, groups) if ragged else False
    if mixed is None:
        light = mixed_rows(cfg, tokens, groups) if ragged and dynamic is not False and by_size is not False else 0
    else:
        light = check_int("mixed", mixed, lo=0, hi=INT32_MAX)
    if light and groups > ORDER_MAX:
        light = 0
    dynamic = dynamic_schedule(cfg) if dynamic is None else bool(dynamic)
    if light and mixed is not None and (not ragged or by_size is False or not dynamic or cfg.cluster != (1, 1)):
        raise ValueError(f"mixed={light}: the mixed order needs the ragged form, largest first, dynamic scheduling "
                         f"and one CTA per tile; got mode {problem.mode!r}, by_size={by_size}, dynamic={dynamic}, "
                         f"{cfg.name}")
    if light:
        by_size = True
    by_size = largest_first(cfg, tokens, dynamic) if by_size is None else bool(by_size)
    return GroupedSchedule(dynamic, by_size, bool(overlap_store), light, (MIXED_BURST if burst is None else burst)
                           if light else 1)
