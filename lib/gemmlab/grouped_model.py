"""The grouped GEMM's public calls: torch's ragged MoE convention and a list of independent problems.

``grouped_gemm(a, b, offs)``: ``a`` (T, K) holds the tokens of every expert one
after the other, ``offs`` (G,) int32 the cumulative end row of each expert's
tokens, ``b`` (G, K, N) the experts' weights; returns ``c`` (T, N) with
``c[offs[g-1]:offs[g]] = a[offs[g-1]:offs[g]] @ b[g]``: the meaning of
``torch._grouped_mm(a, b, offs=offs)``. Rows after ``offs[-1]`` are not written.

``grouped_gemm_list(pairs)``: ``[(a_i, b_i), ...]`` of any sizes, one launch.

BF16 (or FP16) in, FP32 accumulation, the input dtype out. The kernel is
:mod:`gemmlab.kernels.grouped_sm90`; one compiled variant per (tile configuration,
mode, B's layout) serves every size and group count.
"""
from __future__ import annotations

import time

from .family.configs import Sm90Config
from .family.problem import DTYPE_BITS

#: Compiled kernels by (config, mode, B's layout), and the seconds each compile took.
_KERNELS: dict = {}
COMPILE_SECONDS: dict = {}
_WORKSPACES: dict = {}
_DUMMIES: dict = {}

#: The tile configurations the heuristic picks from (see :func:`choose_config`).
SMALL = Sm90Config(tile_m=64, tile_n=128, tile_k=64, stages=8, cluster=(1, 1), epi_n=32, epi_stages=4)
#: The decode tile twice as wide: half as many tiles, each streaming twice the weight bytes.
SMALL_WIDE = Sm90Config(tile_m=64, tile_n=256, tile_k=64, stages=5, cluster=(1, 1), epi_n=32, epi_stages=4)
MEDIUM = Sm90Config(tile_m=128, tile_n=192, tile_k=64, stages=4, cluster=(1, 1), epi_n=32, epi_stages=4)
LARGE = Sm90Config(tile_m=128, tile_n=256, tile_k=64, stages=4, cluster=(1, 1), epi_n=32, epi_stages=2)
#: The two large tiles in clusters of two CTAs along M that share each B tile (the expert's weights) by multicast.
MEDIUM_C2 = Sm90Config(tile_m=128, tile_n=192, tile_k=64, stages=4, cluster=(2, 1), epi_n=32, epi_stages=4)
LARGE_C2 = Sm90Config(tile_m=128, tile_n=256, tile_k=64, stages=4, cluster=(2, 1), epi_n=32, epi_stages=2)


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


def gpu_of(device) -> str | None:
    """``GPUSpec.short`` of CUDA ``device``, the key of :data:`PAIRS_FROM` and :data:`DECODE_TILE`; None for a
    GPU the course does not know, or without CUDA."""
    from .hardware import spec_of
    spec = spec_of(device)
    return spec.short if spec is not None else None


def decode_tile(device) -> Sm90Config:
    """:data:`DECODE_TILE` for CUDA ``device`` (``SMALL`` where not measured)."""
    return DECODE_TILE.get(gpu_of(device), SMALL)


def config_for_gpu(gpu: str | None, tokens: int, groups: int, n: int, k: int) -> Sm90Config:
    """:func:`choose_config` with what was measured on ``gpu`` (``GPUSpec.short``): :data:`PAIRS_FROM` and
    :data:`DECODE_TILE`; elsewhere no pairs and ``SMALL``."""
    return choose_config(tokens, groups, n, k, PAIRS_FROM.get(gpu, float("inf")), DECODE_TILE.get(gpu, SMALL))


def default_config(tokens: int, groups: int, n: int, k: int, device) -> Sm90Config:
    """The configuration the calls run on ``device`` when given none: :func:`config_for_gpu` for its GPU."""
    return config_for_gpu(gpu_of(device), tokens, groups, n, k)


def choose_config(tokens: int, groups: int, n: int, k: int, pairs_from: float = float("inf"),
                  decode: Sm90Config = SMALL) -> Sm90Config:
    """A tile configuration from the tokens and the experts (the host never reads ``offs``).

    Measured on an H100 and an H200, every tile on the 64 MoE sets in one run
    (``benchmarks/grouped_gemm.py sweep_sched``; ``results/<device>/grouped_gemm_sweep_sched.json``):

    * up to 24 tokens per expert (decode): every expert's weights are read
      once whatever the tile, so a 64-row tile (the least MMA work wasted on
      rows past a group's end), ``decode`` wide (:data:`DECODE_TILE`) if
      ``n`` gives it :data:`DECODE_WIDE_FROM_TILES` tiles per expert, else 128
      wide (on narrow outputs the narrower tile keeps twice the SMs busy);
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
    del k
    per_expert = tokens / max(groups, 1)
    if per_expert <= 24:
        return decode if n >= DECODE_WIDE_FROM_TILES * decode.tile_n else SMALL
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
    bytes (:func:`expert_bounds`): the heavy ones keep the tensor cores busy while memory idles, then the light ones
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

    A traced launch (:func:`trace_launches`) shows why it can matter: on an H200, DeepSeek-V3 gate/up with 32
    experts and 64 tokens, every CTA has 4 or 5 tiles, yet the CTAs left 178 to 268 us after the first
    started: some SMs draw less bandwidth than others. Claiming tiles from a counter
    (:func:`gemmlab.kernels.grouped_sm90.claim_tile`) evens that out (there: 218 to 254 us). That trace was one
    experiment; the benchmarks (``benchmarks/grouped_gemm.py moe``, the ``sched_gain`` column: the other
    scheduling's time over the chosen one's; ``sweep_sched``: both, every tile) say: with 128 x 256 tiles
    run one CTA each, dynamic wins on all 16 H200 sets it ran (1.01-1.17x); with the 64-row decode tiles
    it wins by a little (on an H100 1.035x geomean for 64 x 128, 0.99-1.08x; on an H200 1.017x for
    64 x 256, 0.98-1.05x). With 128 x 192 (``sweep_medium``: the 28 sets of 512 to 1536 tokens where
    :func:`choose_config` picks it) dynamic scheduling in index order (:func:`largest_first`) is 1.044x
    faster than static with largest first on an H100 (0.97-1.15x, 23 sets faster) and even on an H200
    (0.999x, 0.89-1.13x); with largest first it had been 1.06x and 1.03x slower. Pairs (2-CTA clusters) keep the
    static order: with ``dynamic=True`` the pair's first CTA claims each unit and posts it to its partner
    (:func:`gemmlab.kernels.grouped_sm90.post_unit`), which measured no better on the sets that run in pairs
    (``sweep_pairs``: 1.004x geomean on an H100, 0.995x on an H200, 0.98-1.03x).
    """
    return cfg.cluster == (1, 1)


def _have_tvm_ffi() -> bool:
    from .family.plan import _have_tvm_ffi as have
    return have()


#: The L2 promotion of the A and B descriptors (:data:`gemmlab.kernels.grouped_sm90.L2_PROMOTIONS`): 3, 256 bytes.
#: Each row of a K-major tile is one 128-byte line per k-block; fetching 256 bytes per miss brings in
#: the next k-block's line too. Measured (``benchmarks/grouped_gemm.py moe``, the ``l2_gain`` column: time
#: with the DSL's 128 bytes over time with 256): on an H100 1.04x geomean with the 64-row decode tile and
#: with 128 x 192, 1.01x with the 2-CTA pairs; on an H200 1.00x with the 64-row tile, 1.01-1.02x with the
#: 128-row ones (0.96-1.06x on single sets). One setting for both GPUs.
L2_PROMOTION = 3


def compiled(cfg: Sm90Config, mode: str, b_major: str, fences: bool = True, by_size: bool | None = None,
             l2_promotion: int | None = L2_PROMOTION, trace: bool = False, dynamic: bool | None = None,
             *, tokens: int, overlap_store: bool = False, mixed: int = 0, burst: int = 1):
    """The compiled grouped kernel for (cfg, mode, B's layout): compiled on first use, then cached.

    ``by_size``: the visiting order (None: :func:`largest_first` decides for ``cfg`` and ``tokens``, the rows
    of ``a``; required, so that no call gets the order of some other size by default).
    ``l2_promotion``: the A and B descriptors' L2 promotion (None: the DSL's, 128 bytes).
    ``dynamic``: hand out tiles from a counter (None: :func:`dynamic_schedule` decides for ``cfg``).
    ``overlap_store``: store each tile during the next one's main loop (:func:`store_under_next`).
    ``mixed``: claim the tiles of groups of at most that many rows among the others' (0: off), in blocks of
    ``burst`` claims (:func:`mixed_order`).
    """
    dynamic = dynamic_schedule(cfg) if dynamic is None else bool(dynamic)
    by_size = largest_first(cfg, tokens, dynamic) if by_size is None else bool(by_size)
    overlap_store = bool(overlap_store)
    burst = burst if mixed else 1  # the block size means nothing without the mixed order
    key = (cfg, mode, b_major, fences, by_size, l2_promotion, trace, dynamic, overlap_store, int(mixed), burst)
    fn = _KERNELS.get(key)
    if fn is None:
        from .kernels.grouped_sm90 import compile_grouped
        t0 = time.perf_counter()
        fn = compile_grouped(cfg, mode, b_major, tvm_ffi=_have_tvm_ffi(), fences=fences, by_size=by_size,
                             l2_promotion=l2_promotion, trace=trace, dynamic=dynamic, overlap_store=overlap_store,
                             mixed=int(mixed), burst=burst)
        COMPILE_SECONDS[key] = time.perf_counter() - t0
        if hasattr(fn, "__tvm_ffi_object__"):
            fn = fn.__tvm_ffi_object__()
        _KERNELS[key] = fn
    return fn


def _workspace(device, grid: int, cfg: Sm90Config, mixed: bool = False):
    """The descriptor slots: (grid, slots, 16) int64, one set per CTA, cached per device.

    Calls on one stream reuse it safely (a launch starts after the previous one
    ended). Calls that run at the same time on two streams of one device would
    rewrite each other's descriptors: that is not supported.
    """
    from .kernels.grouped_sm90 import slots_per_cta
    key = (device, grid, slots_per_cta(cfg, mixed=mixed))
    ws = _WORKSPACES.get(key)
    if ws is None:
        ws = _new_workspace(device, grid, cfg, mixed=mixed)
        _WORKSPACES[key] = ws
    return ws


def _new_workspace(device, grid: int, cfg: Sm90Config, trace: bool = False, mixed: bool = False):
    """A zeroed workspace: (grid, slots, 16) int64 (the tile counters at 0), one more slot with ``trace``, the
    light stream's descriptor slots with ``mixed``."""
    import torch
    from .kernels.grouped_sm90 import DESC_WORDS, slots_per_cta
    return torch.zeros((grid, slots_per_cta(cfg, trace, mixed), DESC_WORDS), dtype=torch.int64, device=device)


def _dummies(device):
    """Placeholder offs / table tensors for the mode that does not use them."""
    d = _DUMMIES.get(device)
    if d is None:
        import torch
        from .kernels.grouped_sm90 import TABLE_COLUMNS
        d = (torch.zeros(1, dtype=torch.int32, device=device),
             torch.zeros((1, len(TABLE_COLUMNS)), dtype=torch.int64, device=device))
        _DUMMIES[device] = d
    return d


# --------------------------------------------------------------------------------------
# Checks (before any launch)
# --------------------------------------------------------------------------------------


def _dtype_name(t) -> str:
    return str(t.dtype).replace("torch.", "")


def _check_matrix(name: str, t, dtype: str):
    import torch
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor; got {type(t).__name__}")
    if _dtype_name(t) != dtype:
        raise TypeError(f"{name} must be {dtype} like a; got {_dtype_name(t)}")


def _check_row_major(name: str, t):
    """Rows contiguous (stride 1 along the last dimension), the row stride a multiple of 16 bytes."""
    rows, cols = t.shape[-2], t.shape[-1]
    if t.stride(-1) != 1 and cols > 1:
        raise ValueError(f"{name} must have contiguous rows (stride 1 along its last dimension); "
                         f"got strides {tuple(t.stride())}")
    if rows > 1 and (t.stride(-2) * t.element_size()) % 16:
        raise ValueError(f"{name}'s row stride must be a multiple of 16 bytes (TMA); got "
                         f"{t.stride(-2)} elements of {t.element_size()} bytes")
    if t.data_ptr() % 16:
        raise ValueError(f"{name} must start at a 16-byte-aligned address (TMA); it starts at {t.data_ptr():#x}")


def b_major_of(name: str, b) -> str:
    """``"n"`` when the weights' rows (N) are contiguous, ``"k"`` when each column of K is; else an error."""
    k, n = b.shape[-2], b.shape[-1]
    if b.stride(-1) == 1 and (b.stride(-2) == n or k == 1):
        return "n"
    if b.stride(-2) == 1 and (b.stride(-1) == k or n == 1):
        return "k"
    raise ValueError(f"{name} must be dense along K or along N in its last two dimensions (K x N, either "
                     f"contiguous order); got shape {tuple(b.shape)} with strides {tuple(b.stride())}")


def check_offs(offs, groups: int, rows: int, *, validate: bool = True) -> None:
    """``offs``: int32, shape (G,), same device; with ``validate`` (one device-to-host copy) also
    non-decreasing and at most T."""
    import torch
    if not isinstance(offs, torch.Tensor):
        raise TypeError(f"offs must be a torch.Tensor of int32; got {type(offs).__name__}")
    if offs.dtype != torch.int32:
        raise TypeError(f"offs must be int32 (cumulative end row of each group); got {_dtype_name(offs)}")
    if offs.dim() != 1 or offs.shape[0] != groups:
        raise ValueError(f"offs must have shape ({groups},): one end row per group of b; got {tuple(offs.shape)}")
    if offs.stride(0) != 1 and groups > 1:
        raise ValueError("offs must be contiguous")
    if validate and groups:
        check_offs_values(offs, rows)


def check_offs_values(offs, rows: int) -> None:
    """``offs`` non-decreasing from 0 and at most ``rows``: one device-to-host copy, which waits for the GPU."""
    host = offs.tolist()
    if not host or (host[0] >= 0 and host[-1] <= rows and host == sorted(host)):
        return  # the common case, at C speed (a Python loop over 128 groups costs a few microseconds)
    prev = 0
    for g, end in enumerate(host):
        if end < prev:
            raise ValueError(f"offs must be non-decreasing from 0: offs[{g}] = {end} < "
                             f"{'offs[%d] = %d' % (g - 1, prev) if g else 0}")
        prev = end
    if prev > rows:
        raise ValueError(f"offs[-1] = {prev} is past the {rows} rows of a")


def check_ragged(a, b, offs, out, *, validate: bool = True) -> str:
    """Every rule of :func:`grouped_gemm`'s arguments; returns B's layout ("k" or "n")."""
    import torch
    if not isinstance(a, torch.Tensor):
        raise TypeError(f"a must be a torch.Tensor; got {type(a).__name__}")
    dtype = _dtype_name(a)
    if dtype not in ("bfloat16", "float16"):
        raise TypeError(f"a must be bfloat16 or float16; got {dtype}")
    _check_matrix("b", b, dtype)
    if a.dim() != 2:
        raise ValueError(f"a must be 2-D (tokens x K); got shape {tuple(a.shape)}")
    if b.dim() != 3:
        raise ValueError(f"b must be 3-D (groups x K x N); got shape {tuple(b.shape)}")
    rows, k = a.shape
    groups, kb, n = b.shape
    if kb != k:
        raise ValueError(f"a is {rows} x {k} but b is {groups} x {kb} x {n}: K must match")
    if k % 8 or n % 8:
        raise ValueError(f"K and N must be multiples of 8 (16-byte TMA rows); got K = {k}, N = {n}")
    if k == 0 or n == 0 or groups == 0:
        raise ValueError(f"K, N and the group count must be positive; got K = {k}, N = {n}, G = {groups}")
    _check_row_major("a", a)
    major = b_major_of("b", b)
    if groups > 1 and (b.stride(0) * b.element_size()) % 16:
        raise ValueError(f"b's group stride must be a multiple of 16 bytes; got {b.stride(0)} elements")
    if out is not None:
        _check_matrix("out", out, dtype)
        if tuple(out.shape) != (rows, n):
            raise ValueError(f"out must have shape ({rows}, {n}); got {tuple(out.shape)}")
        _check_row_major("out", out)
    devices = {t.device for t in (a, b, offs) + ((out,) if out is not None else ())}
    if len(devices) != 1:
        raise ValueError(f"a, b, offs and out must be on one device; got {sorted(map(str, devices))}")
    check_offs(offs, groups, rows, validate=validate)
    if a.device.type != "cuda":
        raise ValueError(f"the grouped GEMM runs on a CUDA device; the tensors are on {a.device}")
    return major


# --------------------------------------------------------------------------------------
# The calls
# --------------------------------------------------------------------------------------


def grouped_gemm(a, b, offs, out=None, *, config: Sm90Config | None = None, validate: bool = True,
                 fences: bool = True, by_size: bool | None = None, l2_promotion: int | None = L2_PROMOTION,
                 dynamic: bool | None = None, overlap_store: bool | None = None, mixed: int | None = None,
                 burst: int | None = None):
    """``out[offs[g-1]:offs[g]] = a[offs[g-1]:offs[g]] @ b[g]`` for every group g, in one launch.

    ``validate=False`` skips the one check that reads ``offs`` back to the host
    (monotonic, within ``a``): then the kernel clamps ``offs`` instead, so a bad
    ``offs`` gives empty groups rather than a memory fault. ``fences=False``
    runs the broken variant without the descriptor release/acquire (chapter 08
    uses it to show what the fences are for; never use it for results).
    ``by_size``: visit the groups largest first (see :func:`largest_first`;
    default: as that function decides for the tile and the rows of ``a``). ``l2_promotion``: see
    :data:`L2_PROMOTION` (None: the DSL's 128 bytes). ``dynamic``: see
    :func:`dynamic_schedule` (None: as it decides). ``overlap_store``: see
    :func:`store_under_next` (None: as it decides). ``mixed``: the light experts'
    rows for the mixed order, 0 for none (None: :func:`mixed_rows` decides, and
    never for ``dynamic=False`` or ``by_size=False``); ``burst``: its claims per
    block (None: :data:`MIXED_BURST`). Calls on one stream at a
    time only: the per-CTA descriptor slots and the tile counter are shared.
    """
    import torch
    from . import hardware
    major = check_ragged(a, b, offs, out, validate=False)
    rows, k = a.shape
    groups, _, n = b.shape
    if out is None:
        out = torch.empty((rows, n), dtype=a.dtype, device=a.device)
    cfg = config or default_config(rows, groups, n, k, a.device)
    sms = hardware.sm_count(a.device)
    grid = ragged_grid(cfg, sms, rows, groups, n)
    overlap = store_under_next(cfg, rows, groups) if overlap_store is None else bool(overlap_store)
    if mixed is None:  # as the rule decides, unless the call asked for static tiles or index order
        light = mixed_rows(cfg, rows, groups) if dynamic is not False and by_size is not False else 0
    else:
        light = int(mixed)
    if light:
        from .kernels.grouped_sm90 import ORDER_MAX
        if groups > ORDER_MAX:
            light = 0  # the light groups are found by the ranking, which covers ORDER_MAX groups
        else:
            by_size = True  # the heavy groups must come first in the tile numbers
    fn = compiled(cfg, "ragged", major, fences, by_size, l2_promotion, dynamic=dynamic, tokens=rows,
                  overlap_store=overlap, mixed=light, burst=MIXED_BURST if burst is None else burst)
    _, table = _dummies(a.device)
    workspace = _workspace(a.device, sms, cfg, mixed=bool(light))
    if validate:
        # Last, with everything else ready: reading offs waits for the GPU to finish the work queued
        # before this call, and the GPU idles from then until the launch below.
        check_offs_values(offs, rows)
    if rows == 0:
        return out
    fn(a, b, out, offs, table, workspace, groups, grid)
    return out


def problem_table(pairs, outs, b_major: str):
    """The (G, 9) int64 table of :data:`gemmlab.kernels.grouped_sm90.TABLE_COLUMNS` for independent problems.

    ``b_major``: the layout every ``b`` has (checked by the caller): B's leading
    dimension is its row stride when N-contiguous, its column stride when K-contiguous.
    """
    ldb = 0 if b_major == "n" else 1
    return [(ai.data_ptr(), bi.data_ptr(), ci.data_ptr(), ai.shape[0], bi.shape[1], ai.shape[1],
             ai.stride(0), bi.stride(ldb), ci.stride(0)) for (ai, bi), ci in zip(pairs, outs)]


def grouped_gemm_list(pairs, outs=None, *, config: Sm90Config | None = None):
    """``[a_i @ b_i for (a_i, b_i) in pairs]`` in one launch: the pointer-array grouped GEMM.

    Every ``a_i`` is (M_i, K_i) with contiguous rows, every ``b_i`` (K_i, N_i) with
    the same layout (all K-contiguous or all N-contiguous), one dtype, one
    device; M_i may be 0. The problem table (addresses, sizes, strides) is built
    on the host and copied to the device with the launch.
    """
    import torch
    from . import hardware
    pairs = list(pairs)
    if not pairs:
        raise ValueError("pairs must hold at least one (a, b) problem")
    a0 = pairs[0][0]
    if not isinstance(a0, torch.Tensor):
        raise TypeError(f"pairs[0][0] must be a torch.Tensor; got {type(a0).__name__}")
    dtype = _dtype_name(a0)
    if dtype not in ("bfloat16", "float16"):
        raise TypeError(f"pairs[0][0] must be bfloat16 or float16; got {dtype}")
    majors = set()
    for i, pair in enumerate(pairs):
        if len(pair) != 2:
            raise ValueError(f"pairs[{i}] must be an (a, b) pair")
        ai, bi = pair
        _check_matrix(f"pairs[{i}][0]", ai, dtype)
        _check_matrix(f"pairs[{i}][1]", bi, dtype)
        if ai.dim() != 2 or bi.dim() != 2:
            raise ValueError(f"pairs[{i}] must hold 2-D matrices; got {tuple(ai.shape)} and {tuple(bi.shape)}")
        if ai.shape[1] != bi.shape[0]:
            raise ValueError(f"pairs[{i}]: a is {tuple(ai.shape)}, b is {tuple(bi.shape)}: K must match")
        kk, nn = bi.shape
        if kk % 8 or nn % 8 or kk == 0 or nn == 0:
            raise ValueError(f"pairs[{i}]: K and N must be positive multiples of 8; got K = {kk}, N = {nn}")
        _check_row_major(f"pairs[{i}][0]", ai)
        majors.add(b_major_of(f"pairs[{i}][1]", bi))
        if ai.device != a0.device or bi.device != a0.device:
            raise ValueError(f"pairs[{i}] is not on {a0.device} like pairs[0][0]")
    if len(majors) > 1:
        raise ValueError("every b must have the same layout (all K-contiguous or all N-contiguous); got both")
    if a0.device.type != "cuda":
        raise ValueError(f"the grouped GEMM runs on a CUDA device; the tensors are on {a0.device}")
    if outs is None:
        outs = [torch.empty((ai.shape[0], bi.shape[1]), dtype=ai.dtype, device=ai.device) for ai, bi in pairs]
    else:
        outs = list(outs)
        if len(outs) != len(pairs):
            raise ValueError(f"outs must hold one matrix per pair: {len(pairs)}; got {len(outs)}")
        for i, ((ai, bi), ci) in enumerate(zip(pairs, outs)):
            _check_matrix(f"outs[{i}]", ci, dtype)
            if tuple(ci.shape) != (ai.shape[0], bi.shape[1]):
                raise ValueError(f"outs[{i}] must have shape ({ai.shape[0]}, {bi.shape[1]}); got {tuple(ci.shape)}")
            _check_row_major(f"outs[{i}]", ci)
    major = majors.pop()
    live = [(p, c) for p, c in zip(pairs, outs) if p[0].shape[0] > 0]
    if not live:
        return outs
    table = torch.tensor(problem_table([p for p, _ in live], [c for _, c in live], major), dtype=torch.int64)
    table = table.to(a0.device, non_blocking=True)
    (a_0, b_0), c_0 = live[0]
    tokens = sum(p[0].shape[0] for p, _ in live)
    cfg = config or default_config(tokens, len(live), max(p[1].shape[1] for p, _ in live), 0, a0.device)
    sms = hardware.sm_count(a0.device)
    units = sum(-(-p[0].shape[0] // (cfg.tile_m * cfg.cluster[0])) * -(-p[1].shape[1] // cfg.tile_n) for p, _ in live)
    fn = compiled(cfg, "table", major, tokens=tokens)
    offs, _ = _dummies(a0.device)
    fn(a_0, b_0, c_0, offs, table, _workspace(a0.device, sms, cfg), len(live), persistent_grid(cfg, sms, units, 1))
    return outs


# --------------------------------------------------------------------------------------
# References and models (CPU tier)
# --------------------------------------------------------------------------------------


def reference(a, b, offs):
    """FP32 reference of the ragged grouped GEMM (rows past ``offs[-1]`` are zero)."""
    import torch
    out = torch.zeros((a.shape[0], b.shape[2]), dtype=torch.float32, device=a.device)
    start = 0
    for g, end in enumerate(offs.tolist()):
        if end > start:
            out[start:end] = a[start:end].float() @ b[g].float()
        start = max(start, end)
    return out


def visit_order(m_sizes, by_size: bool = True) -> list[int]:
    """CPU model of :func:`gemmlab.kernels.grouped_sm90.rank_groups`: the groups in the order the kernel visits them.

    Largest first, ties by index; index order when ``by_size`` is off or there
    are more than :data:`gemmlab.kernels.grouped_sm90.ORDER_MAX` groups.
    """
    from .kernels.grouped_sm90 import ORDER_MAX
    groups = range(len(m_sizes))
    if not by_size or len(m_sizes) > ORDER_MAX:
        return list(groups)
    return sorted(groups, key=lambda g: (-m_sizes[g], g))


def tile_order(m_sizes, n: int, tile_m: int, tile_n: int, grid: int, by_size: bool = True, cluster: int = 1):
    """CPU model of the kernel's scheduler: for each CTA, its tiles as ``(group, m_tile, n_tile)``.

    Tiles are numbered group after group in :func:`visit_order` (largest group
    first), M fastest inside a group; CTA ``b`` takes ``b, b + grid, ...``.
    Groups with no rows have no tiles. With ``cluster = 2`` the numbered units
    are pairs of M-tiles: cluster ``c = b // 2`` takes units ``c, c + grid / 2,
    ...`` and its CTA of rank ``b % 2`` the pair's M-tile ``2 * pair + rank``,
    which lies past the group's rows when the group has an odd number of them.
    """
    order = []
    for g in visit_order(m_sizes, by_size):
        m = m_sizes[g]
        mu, nt = -(-m // (tile_m * cluster)), -(-n // tile_n)
        order += [(g, i % mu, i // mu) for i in range(mu * nt)]
    clusters = grid // cluster
    return [[(g, pair * cluster + b % cluster, nt) for g, pair, nt in order[b // cluster::clusters]]
            for b in range(clusters * cluster)]


def finish_times(tile_costs, speeds, dynamic: bool, ahead: bool = True) -> list[float]:
    """CPU model of when each CTA finishes: static (CTA ``b`` takes ``b, b + grid, ...``) or dynamic scheduling.

    ``tile_costs``: each tile's work, in the order tiles are numbered; ``speeds``: each CTA's rate (work per
    unit of time, e.g. the memory bandwidth its SM happens to get); ``len(speeds)`` is the grid. Dynamic: tile
    ``b`` first, then a CTA claims its next tile from the counter, with ``ahead`` when it *starts* a tile (the
    kernel's first version: a claimed tile waits for the tile in hand), else when it ends one (the kernel now
    claims :data:`gemmlab.kernels.grouped_sm90.CLAIM_LEAD` k-blocks before, which this idealises). A model: the rates
    are constant and independent of how many CTAs are still running.
    """
    grid = len(speeds)
    if not dynamic:
        return [sum(tile_costs[b::grid]) / speeds[b] for b in range(grid)]
    import heapq
    if not ahead:  # the CTA that frees up first takes the next tile
        done = [0.0] * grid
        for b in range(min(grid, len(tile_costs))):
            done[b] = tile_costs[b] / speeds[b]
        free = [(done[b], b) for b in range(min(grid, len(tile_costs)))]
        heapq.heapify(free)
        for tile in range(grid, len(tile_costs)):
            t, b = heapq.heappop(free)
            done[b] = t + tile_costs[tile] / speeds[b]
            heapq.heappush(free, (done[b], b))
        return done
    nxt = grid  # the counter: the next unclaimed tile
    # (time the CTA starts a tile, CTA, the tile it starts)
    events = [(0.0, b, b) for b in range(min(grid, len(tile_costs)))]
    heapq.heapify(events)
    done = [0.0] * grid
    claimed = [None] * grid
    while events:
        t, b, tile = heapq.heappop(events)
        if nxt < len(tile_costs):  # claim the following tile now, work on it after this one
            claimed[b], nxt = nxt, nxt + 1
        else:
            claimed[b] = None
        end = t + tile_costs[tile] / speeds[b]
        done[b] = end
        if claimed[b] is not None:
            heapq.heappush(events, (end, b, claimed[b]))
    return done


def descriptor_updates(m_sizes, n: int, tile_m: int, tile_n: int, grid: int, by_size: bool = True) -> list[int]:
    """For each CTA, how many times its producer rewrites the A/B descriptors (once per group it enters)."""
    counts = []
    for tiles in tile_order(m_sizes, n, tile_m, tile_n, grid, by_size):
        groups = [g for g, _, _ in tiles]
        counts.append(sum(1 for i, g in enumerate(groups) if i == 0 or g != groups[i - 1]))
    return counts


def skewed_sizes(tokens: int, groups: int, seed: int = 0, alpha: float = 1.2) -> list[int]:
    """Tokens per expert from a skewed router: expert popularity ~ 1 / rank^alpha, then a multinomial draw.

    Popular experts get many tokens; with few tokens many experts get none (the
    benchmark's MoE sets; deterministic for a seed).
    """
    import torch
    g = torch.Generator().manual_seed(seed * 7919 + groups)
    weights = 1.0 / torch.arange(1, groups + 1, dtype=torch.float64) ** alpha
    weights = weights[torch.randperm(groups, generator=g)]
    picks = torch.multinomial(weights, tokens, replacement=True, generator=g)
    return torch.bincount(picks, minlength=groups).tolist()


def offsets_of(sizes, device="cuda"):
    """torch's ``offs`` for groups of ``sizes`` rows: their cumulative end rows, int32, on ``device``."""
    import itertools

    import torch
    return torch.tensor(list(itertools.accumulate(sizes)), dtype=torch.int32, device=device)


def random_problem(sizes, n: int, k: int, *, b_major: str = "k", dtype=None, seed: int = 0, extra_rows: int = 0,
                   device="cuda"):
    """Random ``(a, b, offs)`` in the ragged convention for groups of ``sizes`` rows (tests, benchmarks).

    ``b_major="k"``: the weights stored as nn.Linear does, (G, N, K), passed as the
    (G, K, N) view; ``"n"``: stored (G, K, N). ``extra_rows``: rows of ``a`` after
    the last group (the kernel must leave the output's rows there untouched).
    """
    import torch
    dtype = dtype or torch.bfloat16
    gen = torch.Generator(device=device).manual_seed(seed)
    a = torch.randn(sum(sizes) + extra_rows, k, device=device, dtype=dtype, generator=gen)
    if b_major == "k":
        b = torch.randn(len(sizes), n, k, device=device, dtype=dtype, generator=gen).transpose(1, 2)
    else:
        b = torch.randn(len(sizes), k, n, device=device, dtype=dtype, generator=gen)
    return a, b, offsets_of(sizes, device)


#: The list form's mixed problems (M, N, K) of the check and the tests: an empty one, one below a tile, K not a
#: multiple of the tile, N not a multiple of 16.
LIST_SHAPES = ((130, 256, 64), (0, 128, 64), (7, 512, 1024), (300, 136, 200), (64, 64, 64))


def random_pairs(shapes, *, b_major: str = "k", seed: int = 0, device="cuda") -> list:
    """Random BF16 ``(a_i, b_i)`` for independent problems ``(M, N, K)`` in ``shapes`` (the list form).

    ``b_major="k"``: each b stored (N, K) as nn.Linear does, passed as its (K, N) view; ``"n"``: stored (K, N).
    """
    import torch
    gen = torch.Generator(device=device).manual_seed(seed)
    pairs = []
    for m, n, k in shapes:
        a = torch.randn(m, k, device=device, dtype=torch.bfloat16, generator=gen)
        b = (torch.randn(n, k, device=device, dtype=torch.bfloat16, generator=gen).t() if b_major == "k"
             else torch.randn(k, n, device=device, dtype=torch.bfloat16, generator=gen))
        pairs.append((a, b))
    return pairs


def flops_bytes(m_sizes, n: int, k: int, dtype: str = "bfloat16") -> tuple[int, int]:
    """FLOPs and the bytes that must move at least once: A and C rows, and the weights of non-empty groups."""
    esize = DTYPE_BITS[dtype] // 8
    tokens = sum(m_sizes)
    live = sum(1 for m in m_sizes if m > 0)
    return 2 * tokens * n * k, esize * (tokens * k + tokens * n + live * k * n)



def sweep_column(cfg: Sm90Config, dynamic: bool) -> str:
    """The column of ``benchmarks/grouped_gemm.py sweep*`` that times ``cfg`` (e.g. ``"128x256 c2 s4"``,
    ``"64x128 s8 dyn"``)."""
    pair = " c2" if cfg.cluster == (2, 1) else ""
    return f"{cfg.tile_m}x{cfg.tile_n}{pair} s{cfg.stages}" + (" dyn" if dynamic else "")


def heuristic_regret(doc: dict, gpu: str) -> list[tuple[float, dict]]:
    """For each set of a stored ``sweep_sched`` run on ``gpu`` (``GPUSpec.short``): the time of the tile
    :func:`choose_config` and :func:`dynamic_schedule` pick, over the best swept one's (1.0: the best)."""
    out = []
    for r in doc["rows"]:
        cfg = config_for_gpu(gpu, r["tokens"], r["groups"], r["n"], r["k"])
        best = min(r[f"{c}_ms"] for c in doc["configs"])
        out.append((r[f"{sweep_column(cfg, dynamic_schedule(cfg))}_ms"] / best, r))
    return out


def best_tile_ratio(doc: dict, tile: str, against: str) -> list[tuple[float, dict]]:
    """For each set of a stored sweep: the fastest swept configuration of ``tile`` (a column prefix such as
    ``"128x128"``: alone or in pairs, static or dynamic) over the fastest of ``against``, ``[(ratio, row), ...]``.
    Above 1: ``tile`` is slower even at its best."""
    def best(prefix):
        cols = [c for c in doc["configs"] if c.split(" ")[0] == prefix]
        if not cols:
            raise ValueError(f"the sweep times no {prefix} tile; its columns: {sorted(doc['configs'])}")
        return lambda row: min(row[f"{c}_ms"] for c in cols)
    slow, fast = best(tile), best(against)
    return [(slow(r) / fast(r), r) for r in doc["rows"]]


#: A 128 x 256 tile's store as a share of its main loop with K = 2048, traced on an H100 (chapter 08: 1.4-2.0 us
#: against about 22 us); with a longer K the main loop grows and the share shrinks as 2048 / K.
STORE_SHARE_K2048 = 0.07


def ping_pong_bound(doc: dict, store_share: float = STORE_SHARE_K2048) -> list[tuple[float, dict]]:
    """For each set of a stored ``sweep_128x128``: how fast a ping-pong kernel with 128 x 128 tiles could be at
    best, as its time over our best 128 x 256 time, ``[(bound, row), ...]``.

    It runs the same main loops as our kernel with 128 x 128 tiles and hides their stores, no more. Those stores
    take at most what a 128 x 256 tile's does (each warpgroup stores half as much) and there are twice as many,
    so hiding them all wins back at most twice the store's share of our time: ``store_share * 2048 / K`` each.
    """
    return [(x - 2 * store_share * 2048 / r["k"], r) for x, r in best_tile_ratio(doc, "128x128", "128x256")]


def store_gains(doc: dict) -> dict:
    """A stored ``overlap`` run: the store under the next main loop against between main loops, split by
    :func:`store_under_next` over the 128-row tiles (``"on"``: the sets it turns it on for, ``"off"``: the others;
    each ``{"sets", "geomean", "min", "max", "faster"}``), and the kernel against ``torch._grouped_mm`` over all
    sets with the store between main loops and as the rule places it (``"vs_torch_between"``,
    ``"vs_torch_rule"``)."""
    from .measure.bench import geomean
    from .measure.calibration import parse_sm90_config

    def tile(r):
        tile_m, tile_n, _, _ = parse_sm90_config(r["config"])
        return Sm90Config(tile_m=tile_m, tile_n=tile_n)

    def stats(gains):
        return {"sets": len(gains), "geomean": geomean(gains), "min": min(gains), "max": max(gains),
                "faster": sum(g > 1 for g in gains)}
    rows = doc["rows"]
    on, off, rule = [], [], []
    for r in rows:
        cfg = tile(r)
        under = store_under_next(cfg, r["tokens"], r["groups"])
        if cfg.tile_m == 128:
            (on if under else off).append(r["under_gain"])
        rule.append(r["torch_ms"] / (r["under_ms"] if under else r["between_ms"]))
    return {"on": stats(on), "off": stats(off), "vs_torch_between": geomean([r["vs_torch_between"] for r in rows]),
            "vs_torch_rule": geomean(rule)}


def expert_bounds(m_sizes, n: int, k: int, tflops: float, tbs: float, unit_rows: int = 128,
                  dtype: str = "bfloat16") -> tuple[float, float]:
    """Two model times (ms) for a ragged launch: ``(one_after_another, overlapped)``.

    Each live expert costs its padded compute (its rows rounded up to ``unit_rows``, the rows a tile or a pair's
    unit computes, at ``tflops``) and its bytes (its weights and its rows of A and C, at ``tbs``). Run one after
    another, each bound by the larger of the two, the experts take the sum of those maxima; with the
    bandwidth-bound experts running beside the compute-bound ones, the launch could take the larger of the two sums.
    """
    esize = DTYPE_BITS[dtype] // 8
    comp = byts = serial = 0.0
    for m in m_sizes:
        if m <= 0:
            continue
        c = 2 * -(-m // unit_rows) * unit_rows * n * k / (tflops * 1e12)
        b = esize * (n * k + m * k + m * n) / (tbs * 1e12)
        comp, byts, serial = comp + c, byts + b, serial + max(c, b)
    return serial * 1e3, max(comp, byts) * 1e3


def expert_bound_rows(doc: dict) -> list[dict]:
    """The sets of a stored ``moe`` run with 128 x 256 tiles, against :func:`expert_bounds` at the run's own measured
    ceilings (the router's sizes recomputed by :func:`skewed_sizes`): each ``{"row", "serial_ms", "overlapped_ms",
    "measured_over_serial", "overlapped_over_serial"}``."""
    from .measure.calibration import parse_sm90_config
    out = []
    ceil = doc["measured"]
    for r in doc["rows"]:
        tile_m, tile_n, cluster, _ = parse_sm90_config(r["config"])
        if (tile_m, tile_n) != (128, 256):
            continue
        unit = tile_m * cluster[0]  # the rows of a tile, or of a pair's unit
        serial, overlapped = expert_bounds(skewed_sizes(r["tokens"], r["groups"]), r["n"], r["k"],
                                           ceil["gemm_tflops"], ceil["copy_tbs"], unit_rows=unit)
        out.append({"row": r, "serial_ms": serial, "overlapped_ms": overlapped,
                    "measured_over_serial": r["gemmlab_kernel_ms"] / serial, "overlapped_over_serial": overlapped / serial})
    return out


def mixed_order(heavy: int, total: int, burst: int = 1) -> list[tuple[bool, int]]:
    """CPU twin of :func:`gemmlab.kernels.grouped_sm90.mixed_tile`: for each claim ``i`` in ``0 .. total - 1``,
    ``(light, tile)``. Claims come in blocks of ``burst``; each block takes its share of the ``heavy`` heavy tiles
    (numbers ``0 .. heavy - 1``) first and then its share of the light ones (numbers ``heavy ..``), each stream in
    its own order."""
    out = []
    for i in range(total):
        j, r = divmod(i, burst)
        h0, h1 = (min(x * burst, total) * heavy // total for x in (j, j + 1))
        out.append((False, h0 + r) if r < h1 - h0 else (True, heavy + j * burst - h0 + r - (h1 - h0)))
    return out


def order_by_tokens(rows) -> dict:
    """Rows of ``benchmarks/grouped_gemm.py order`` by token count: ``{tokens: {"sets", "geomean",
    "largest_first_wins"}}``, the geomean of index order's time over largest first's (above 1: largest first is
    faster) and the sets where it is."""
    from .measure.bench import geomean
    out = {}
    for t in sorted({r["tokens"] for r in rows}):
        ratios = [r["index_over_largest"] for r in rows if r["tokens"] == t]
        out[t] = {"sets": len(ratios), "geomean": geomean(ratios), "largest_first_wins": sum(x > 1 for x in ratios)}
    return out


def decode_rows(rows) -> list[dict]:
    """The "decode" sets of a ``moe`` run: at most 16 tokens per expert on average, where the weights dominate
    the bytes and the HBM roofline is the bound to reach."""
    return [r for r in rows if r["tokens"] <= 16 * r["groups"]]


def floor_ms(flops: float, nbytes: float, tflops: float, tbs: float) -> float:
    """The roofline's time for ``flops`` and ``nbytes`` at ``tflops`` TFLOP/s and ``tbs`` TB/s, in ms."""
    return max(flops / (tflops * 1e12), nbytes / (tbs * 1e12)) * 1e3


def measured_roofline(rows, ceilings: dict) -> list[dict]:
    """Each ``moe`` row's floor against the GPU's *measured* ceilings, added to the row and returned.

    ``ceilings``: :func:`gemmlab.measure.bench.measured_ceilings` of the same run (``copy_tbs``, ``gemm_tflops``).
    A row's floor is then ``max(FLOPs / gemm_tflops, bytes / copy_tbs)`` (``measured_floor_ms``) and
    ``of_measured_roofline`` that floor over the kernel's time. The datasheet's floor (``floor_ms``,
    ``of_roofline``) stays beside it: neither a copy nor cuBLAS reaches the datasheet (an H200's 4.8 TB/s
    copies at about 4.2-4.3), so that one is a bound no kernel meets, this one the best this GPU showed
    doing the simplest thing with the same resource.
    """
    tflops, tbs = ceilings["gemm_tflops"], ceilings["copy_tbs"]
    if not (tflops > 0 and tbs > 0):
        raise ValueError(f"ceilings: gemm_tflops and copy_tbs must be positive; got {tflops!r}, {tbs!r}")
    for r in rows:
        floor = floor_ms(r["flops"], r["bytes"], tflops, tbs)
        r["measured_floor_ms"] = floor
        r["of_measured_roofline"] = floor / r["gemmlab_kernel_ms"]
    return rows


def summarize(rows) -> dict:
    """The MoE benchmark's headline numbers from its rows (``benchmarks/grouped_gemm.py moe``; decode sets as
    :func:`decode_rows` counts them)."""
    from .measure.bench import geomean
    decode = decode_rows(rows)
    out = {
        "sets": len(rows),
        "geomean_vs_torch": geomean([r["vs_torch"] for r in rows]),
        "geomean_vs_torch_novalidate": geomean([r["vs_torch_novalidate"] for r in rows]),
        "geomean_vs_torch_kernel": geomean([r["vs_torch_kernel"] for r in rows]),
        "min_vs_torch_novalidate": min(r["vs_torch_novalidate"] for r in rows),
        "min_vs_torch_kernel": min(r["vs_torch_kernel"] for r in rows),
        "geomean_vs_loop": geomean([r["vs_loop"] for r in rows]),
        "decode_sets": len(decode),
        "decode_of_roofline_min": min((r["of_roofline"] for r in decode), default=None),
        "decode_of_roofline_geomean": geomean([r["of_roofline"] for r in decode]) if decode else None,
        "max_rel_err": max(r["rel_err"] for r in rows),
    }
    if decode and all("of_measured_roofline" in r for r in rows):
        out["decode_of_measured_roofline_min"] = min(r["of_measured_roofline"] for r in decode)
        out["decode_of_measured_roofline_geomean"] = geomean([r["of_measured_roofline"] for r in decode])
    order = [r["order_gain"] for r in rows if r.get("order_gain") is not None]
    if order:
        out["geomean_order_gain"] = geomean(order)
        out["min_order_gain"] = min(order)
    mixed = [r["mixed_gain"] for r in rows if r.get("mixed_gain") is not None]
    if mixed:
        out["geomean_mixed_gain"] = geomean(mixed)
        out["min_mixed_gain"] = min(mixed)
        out["mixed_sets"] = len(mixed)
    sched = [r["sched_gain"] for r in rows if r.get("sched_gain") is not None]
    if sched:
        out["geomean_sched_gain"] = geomean(sched)
        out["min_sched_gain"] = min(sched)
    if all("l2_gain" in r for r in rows):
        out["geomean_l2_gain"] = geomean([r["l2_gain"] for r in rows])
        out["min_l2_gain"] = min(r["l2_gain"] for r in rows)
    if all("vs_padded" in r for r in rows):
        out["geomean_vs_padded"] = geomean([r["vs_padded"] for r in rows])
    return out


def fit_launch_cost(rows, min_waves: float = 4.0) -> dict:
    """A straight line through decode launches of growing size: ``{"fixed_us", "us_per_expert", "tbs"}``.

    ``rows``: ``{"live", "waves", "us", "bytes_per_expert"}`` each (``benchmarks/grouped_gemm.py tail``),
    one family (one N, K). Least squares over the rows of at least ``min_waves`` waves of tiles: the
    slope is what one more expert's weights cost (``tbs``: the rate they stream at), the intercept the
    launch's fixed cost (start, pipeline fill, drain, and the last wave's tail on average).
    """
    from .measure.bench import line_fit
    pts = [(r["live"], r["us"]) for r in rows if r["waves"] >= min_waves]
    if len(pts) < 2:
        raise ValueError(f"rows: need two launches of at least {min_waves} waves to fit a line; got {len(pts)}")
    fixed, slope = line_fit(pts)
    per_expert = rows[0]["bytes_per_expert"]
    return {"fixed_us": fixed, "us_per_expert": slope, "tbs": per_expert / (slope * 1e-6) / 1e12}


def against_streaming_read(moe_doc: dict, tail_doc: dict) -> list[tuple[dict, float]]:
    """Each decode set of a ``moe`` run (:func:`decode_rows`) against a plain streaming read of its bytes on the
    same GPU: ``[(row, read_us / kernel_us), ...]``.

    ``read_us`` is the line ``benchmarks/grouped_gemm.py tail`` fits through ``torch.sum`` over 128 MiB to
    2 GiB (``tail_doc["stream_read_fit"]``: fixed cost plus bytes at its rate), for the bytes the set must
    move (A, the live experts' weights and C: on these weight-bound sets ``floor_ms`` times the datasheet
    bandwidth). Above 1: the kernel moves them faster than that read would.
    """
    fit = tail_doc["stream_read_fit"]
    hbm = moe_doc["hbm_gbs"] * 1e9
    out = []
    for r in decode_rows(moe_doc["rows"]):
        if not r["weight_bound"]:
            continue
        nbytes = r["floor_ms"] * 1e-3 * hbm
        read_us = fit["fixed_us"] + nbytes / (fit["tbs"] * 1e12) * 1e6
        out.append((r, read_us / (r["gemmlab_kernel_ms"] * 1e3)))
    return out


def trace_launches(a, b, offs, *, launches: int = 3, config: Sm90Config | None = None,
                   dynamic: bool | None = None) -> dict:
    """Run the ragged call ``launches`` times back to back with the traced kernel; return each CTA's timeline.

    ``{"points": TRACE_POINTS, "launches": [(grid, len(points)) int64 tensors on the CPU], "grid", "config"}``:
    ``%globaltimer`` nanoseconds (a clock shared by all SMs) and the tile count, one row per CTA, one
    workspace per launch so that nothing is overwritten. :func:`timeline` reads them.
    """
    import torch
    from . import hardware
    from .kernels.grouped_sm90 import TRACE_POINTS
    major = check_ragged(a, b, offs, None)
    rows, k = a.shape
    groups, _, n = b.shape
    cfg = config or default_config(rows, groups, n, k, a.device)
    sms = hardware.sm_count(a.device)
    grid = ragged_grid(cfg, sms, rows, groups, n)
    fn = compiled(cfg, "ragged", major, trace=True, dynamic=dynamic, tokens=rows)
    out = torch.empty((rows, n), dtype=a.dtype, device=a.device)
    _, table = _dummies(a.device)
    spaces = [_new_workspace(a.device, sms, cfg, trace=True) for _ in range(launches)]
    fn(a, b, out, offs, table, spaces[0], groups, grid)  # warm: the descriptor cache and the clocks
    torch.cuda.synchronize()
    for ws in spaces:
        fn(a, b, out, offs, table, ws, groups, grid)
    torch.cuda.synchronize()
    return {"points": TRACE_POINTS, "grid": grid, "config": cfg.name,
            "launches": [ws[:grid, -1, :len(TRACE_POINTS)].cpu() for ws in spaces]}


def timeline(traced: dict) -> dict:
    """Where a launch's time goes, in microseconds, from :func:`trace_launches` (medians over launches).

    ``span``: first CTA entry to last CTA exit. ``gap``: last exit of one launch to the first entry of
    the next. ``entry_skew``: last CTA entry minus first. ``to_first_load``: a CTA's entry to its first TMA
    load (median over CTAs). ``first_tile``: entry to the end of its first tile's main loop (median).
    ``drain``: last main loop's end to exit (median). ``tail``: last exit minus the median CTA's exit.
    """
    import statistics
    pts = list(traced["points"])
    col = {p: pts.index(p) for p in pts}
    runs = [t.tolist() for t in traced["launches"]]
    us = lambda ns: ns / 1e3
    per = []
    for i, rows in enumerate(runs):
        live = [r for r in rows if r[col["tiles"]] > 0]
        entry = [r[col["entry"]] for r in rows]
        exits = [r[col["exit"]] for r in rows]
        d = {"span": us(max(exits) - min(entry)), "entry_skew": us(max(entry) - min(entry)),
             "to_first_load": us(statistics.median(r[col["first_load"]] - r[col["entry"]] for r in live)),
             "first_tile": us(statistics.median(r[col["first_mainloop_end"]] - r[col["entry"]] for r in live)),
             "drain": us(statistics.median(r[col["exit"]] - r[col["last_mainloop_end"]] for r in live)),
             "tail": us(max(exits) - statistics.median(exits)),
             "tiles_max": max(r[col["tiles"]] for r in rows), "tiles_min": min(r[col["tiles"]] for r in rows)}
        if i + 1 < len(runs):
            d["gap"] = us(min(r[col["entry"]] for r in runs[i + 1]) - max(exits))
        per.append(d)
    keys = set().union(*per)  # "gap" is missing from the last launch
    return {k: statistics.median(d[k] for d in per if k in d) for k in sorted(keys)}

