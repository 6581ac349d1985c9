"""Chapter 07: the persistent tile scheduler (grouped, rasterized tile order).

What it teaches
    A persistent GEMM launches about one CTA (or one cluster) per SM, and each
    CTA walks a list of output tiles: ``linear = cta, cta + num_ctas, ...``.
    *Which* tile a linear index names decides how well L2 is reused. Tiles
    that run at the same time should share operands: CTAs working on the same
    block-column of C read the same B tile, CTAs on the same block-row read the
    same A tile.

    The order used here is the grouped (swizzled) raster order:

    * ``raster="m"``: the M tiles are cut into *bands* of ``group`` tiles.
      Inside a band, consecutive linear indices walk **down M** first (the
      band's ``group`` M tiles of one N column), then step to the next N
      column. Bands follow each other along M. The last band may be narrower
      (``m_tiles % group``) and is walked the same way.
    * ``raster="n"``: the same with the roles of M and N swapped: bands of
      ``group`` N tiles, walking along N first.

    A wave of ``num_ctas`` consecutive tiles then covers a compact block of
    about ``group`` x ``num_ctas / group`` tiles instead of a long thin
    strip, so the A and B panels it needs fit in L2 together.

    The two extremes are plain orders: ``group=1`` steps across at once
    (``raster="m"`` then visits row by row), and a group as large as the grid
    walks the raster direction end to end (``raster="m"``: column by column).

What it adds over chapter 06
    Chapter 06 launched one CTA per tile, in the hardware's launch order.
    Here the kernel decides the order itself, and one CTA handles many tiles.

The code
    * :class:`TileScheduler`: the plain-Python scheduler (host code, CPU
      tests, figures). ``tile(linear)`` and ``tiles_for(cta, num_ctas)``.
    * :func:`device_tile`: the same arithmetic inside a kernel
      (``@cute.jit``, run-time ``Int32`` linear index, compile-time sizes).
    * :func:`tile_order_grid`: the visit order as an (m_tiles, n_tiles) grid
      for pictures; :func:`draw_tile_order` draws it.
    * The dynamic tile claim (chapter 08): :func:`claim_tile` / :func:`claimed_tile`
      (a global counter instead of the static order), :func:`put_tile_of` /
      :func:`tile_of` (the producer tells the consumers which tile a stage holds),
      :func:`post_unit` / :func:`wait_unit` / :func:`clear_mailbox` (a CTA pair),
      :func:`reset_counters` (ready for the next launch).

Both versions call one function, :func:`_tile_math`, with a different
``minimum`` (Python's ``min`` or ``cutlass.min``), so they cannot drift apart.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
import cuda.bindings.driver as cuda
from cutlass import Int32, Int64

from .checks import check_choice, check_int
from .compile import check_target, compile_for, fake_stream, fake_tensor, launcher
from .tiers import require_tier

RASTERS = ("m", "n")


def _tile_math(linear, m_tiles: int, n_tiles: int, raster: str, group: int, minimum):
    """(m_tile, n_tile) of tile number ``linear`` in grouped ``raster`` order.

    ``m_tiles``, ``n_tiles``, ``group`` are Python ints; ``linear`` is a Python
    int or a device ``Int32``. ``minimum`` is ``min`` (host) or ``cutlass.min``
    (device).
    """
    # "major" is the direction cut into bands, "minor" the other one.
    major_tiles, minor_tiles = (m_tiles, n_tiles) if raster == "m" else (n_tiles, m_tiles)
    band_tiles = group * minor_tiles  # tiles in one full band
    band = linear // band_tiles
    first = band * group  # first major tile of this band
    width = minimum(group, major_tiles - first)  # the last band may be narrower
    within = linear - band * band_tiles
    major = first + within % width  # walk along the band first...
    minor = within // width  # ...then step to the next column (row)
    return (major, minor) if raster == "m" else (minor, major)


@dataclass(frozen=True)
class TileScheduler:
    """The tile order of a persistent GEMM over an ``m_tiles`` x ``n_tiles`` grid.

    ``raster``: ``"m"`` walks down M inside a band of ``group`` M tiles (CTAs
    running together share B columns); ``"n"`` walks along N inside a band
    of ``group`` N tiles (they share A rows). ``group=1`` gives plain
    row-by-row (``"m"``) or column-by-column (``"n"``) order.
    """

    m_tiles: int
    n_tiles: int
    raster: str = "m"
    group: int = 8

    def __post_init__(self):
        check_int("m_tiles", self.m_tiles, lo=1)
        check_int("n_tiles", self.n_tiles, lo=1)
        check_choice("raster", self.raster, RASTERS)
        check_int("group", self.group, lo=1)

    @property
    def num_tiles(self) -> int:
        return self.m_tiles * self.n_tiles

    def tile(self, linear: int) -> tuple[int, int]:
        """``(m_tile, n_tile)`` of tile number ``linear`` (0 <= linear < num_tiles)."""
        check_int("linear", linear, lo=0, hi=self.num_tiles - 1)
        return _tile_math(linear, self.m_tiles, self.n_tiles, self.raster, self.group, min)

    def order(self) -> list[tuple[int, int]]:
        """Every tile, in visit order."""
        return [self.tile(i) for i in range(self.num_tiles)]

    def tiles_for(self, cta: int, num_ctas: int) -> list[tuple[int, int]]:
        """The tiles persistent CTA ``cta`` of ``num_ctas`` handles, in order."""
        check_int("num_ctas", num_ctas, lo=1)
        check_int("cta", cta, lo=0, hi=num_ctas - 1)
        return [self.tile(i) for i in range(cta, self.num_tiles, num_ctas)]

    def device_tile(self, linear):
        """Inside a kernel: :func:`device_tile` with this scheduler's sizes (compile-time)."""
        return device_tile(linear, self.m_tiles, self.n_tiles, self.raster, self.group)


@cute.jit
def device_tile(linear: Int32, m_tiles: cutlass.Constexpr, n_tiles: cutlass.Constexpr,
                raster: cutlass.Constexpr, group: cutlass.Constexpr):
    """Device twin of :meth:`TileScheduler.tile`: ``(m_tile, n_tile)`` as ``Int32``.

    Call it from kernel code with a run-time linear index; the sizes are
    compile-time constants, so the divisions by ``band_tiles`` become
    multiply-shift sequences. Only ``% width`` and ``// width`` divide by a
    run-time value (the last band's width), once per tile.
    """
    return _tile_math(Int32(linear), m_tiles, n_tiles, raster, group, cutlass.min)


# --------------------------------------------------------------------------------------
# The dynamic tile claim (chapter 08): tiles handed out from a counter, not by index
# --------------------------------------------------------------------------------------
#
# The static order above gives CTA ``b`` the tiles ``b, b + grid, ...``; with dynamic scheduling each
# CTA takes its first tile by index and then claims the next unclaimed one from a global counter, so
# CTAs that get less bandwidth take fewer tiles. Chapter 08's grouped kernel
# (:mod:`gemmlab.kernels.grouped_sm90`) uses it; a kernel that claims tiles the same way (a
# CLC-scheduled Blackwell GEMM, say) reuses these pieces: the claim and its hand-over to the
# consumers through shared memory beside each stage's barrier, a pair's mailbox, and the reset that
# leaves the counters at 0 for the next launch.

#: Dynamic scheduling claims the next tile this many k-blocks before the current tile's last load: late enough
#: that a slow CTA does not hold a tile the others could have taken (claiming a whole tile ahead, as we first did, ran
#: 1.00-1.04x slower on an H100's 52 dynamic sets), early enough that the atomic's round trip stays off the
#: producer's path.
CLAIM_LEAD = 4

#: A pair's mailbox (dynamic scheduling in 2-CTA clusters): words 2..15 of the first CTA's scheduler slot
#: (:func:`gemmlab.family.configs.sched_slot`), one
#: unit posted per word in turn. The first CTA cannot run more than ``stages`` k-blocks ahead of its partner
#: (each stage waits for both CTAs' consumers), so it never reuses a word the partner has not read yet as long
#: as there are more words than stages + 1.
MAILBOX_FIRST, MAILBOX_WORDS = 2, 14


NO_MORE_TILES = -1  # what the producer writes in place of a tile number when the tiles have run out


@cute.jit
def claim_tile(counter):
    """Dynamic scheduling: lane 0 claims the next unclaimed tile with one atomic add on a global counter.

    Every CTA starts with tile ``bid``; after that a CTA that finishes early takes the next unclaimed tile,
    so the CTAs finish within about a tile of each other whatever bandwidth each SM happens to get. The
    claim is made :data:`CLAIM_LEAD` k-blocks before the current tile's last load and read by
    :func:`claimed_tile` only after that load, so the atomic's round trip is off the producer's path.
    """
    got = Int32(0)
    if cute.arch.lane_idx() == 0:
        got = Int32(cute.arch.atomic_add(counter, Int64(1), sem="relaxed", scope="gpu"))
    return got


@cute.jit
def claimed_tile(claim: Int32, first_round: Int32):
    """The tile (unit) number a :func:`claim_tile` got (lane 0's), for the whole warp: the first round,
    one unit per CTA or pair, is handed out statically. Numbers only grow, so each CTA's tiles come in
    increasing order and :func:`gemmlab.kernels.grouped_sm90.seek` still only moves forward."""
    return cute.arch.shuffle_sync(claim, 0) + first_round


@cute.jit
def post_unit(mailbox, seq: Int32, unit: Int32):
    """A pair's first CTA tells its partner its ``seq``-th claimed unit: ``seq`` and ``unit`` in one 64-bit
    word (the word says which post it holds, so a stale one is never taken for a new one)."""
    if cute.arch.lane_idx() == 0:
        word = (Int64(seq) << 32) | Int64(unit)
        cute.arch.atomic_exch(mailbox + (MAILBOX_FIRST + seq % MAILBOX_WORDS), word, sem="relaxed", scope="gpu")


@cute.jit
def wait_unit(mailbox, seq: Int32):
    """The partner's side of :func:`post_unit`: lane 0 polls the word until it holds post ``seq``; the unit,
    for the whole warp. Only the unit number travels (each CTA rewrites its own descriptors), so a relaxed
    read is enough."""
    got = Int32(0)
    if cute.arch.lane_idx() == 0:
        where = mailbox + (MAILBOX_FIRST + seq % MAILBOX_WORDS)
        word = cute.arch.atomic_add(where, Int64(0), sem="relaxed", scope="gpu")
        while (word >> 32) != Int64(seq):
            word = cute.arch.atomic_add(where, Int64(0), sem="relaxed", scope="gpu")
        got = Int32(word & Int64(0xFFFFFFFF))
    return cute.arch.shuffle_sync(got, 0)


@cute.jit
def clear_mailbox(mailbox):
    """The partner empties the mailbox after its last read (no post can follow it), for the next launch."""
    if cute.arch.lane_idx() == 0:
        for w in cutlass.range_constexpr(MAILBOX_WORDS):
            cute.arch.atomic_exch(mailbox + (MAILBOX_FIRST + w), Int64(0), sem="relaxed", scope="gpu")


@cute.jit
def reset_counters(counter, claimers: Int32):
    """The last of the ``claimers`` (CTAs, or pairs' first CTAs) to stop fetching sets both counters back
    to 0 for the next launch.

    The increment is acq_rel: every other CTA's last fetch happens before it, so no fetch can land after
    the reset.
    """
    if cute.arch.lane_idx() == 0:
        done = cute.arch.atomic_add(counter + 1, Int64(1), sem="acq_rel", scope="gpu")
        if done == Int64(claimers) - 1:
            cute.arch.atomic_exch(counter, Int64(0), sem="relaxed", scope="gpu")
            cute.arch.atomic_exch(counter + 1, Int64(0), sem="relaxed", scope="gpu")


@cute.jit
def put_tile_of(ring, stages: cutlass.Constexpr, stage: Int32, tile: Int32):
    """Shared memory ``ring[stage] = tile``: the tile whose first k-block stage ``stage`` holds."""
    cute.make_tensor(ring, cute.make_layout(stages))[stage] = tile


@cute.jit
def tile_of(ring, stages: cutlass.Constexpr, stage: Int32):
    """``ring[stage]``: read by the consumers once stage ``stage``'s barrier has completed."""
    return cute.make_tensor(ring, cute.make_layout(stages))[stage]


# --------------------------------------------------------------------------------------
# A kernel that writes the device order (tests: compile-only fold, and the GPU run)
# --------------------------------------------------------------------------------------


@cute.kernel
def tile_order_kernel(out: cute.Tensor, m_tiles: cutlass.Constexpr, n_tiles: cutlass.Constexpr,
                      raster: cutlass.Constexpr, group: cutlass.Constexpr, fold: cutlass.Constexpr):
    """Writes ``out[2i], out[2i+1] = device_tile(i)`` for every tile ``i``.

    ``fold=True``: one thread, compile-time ``i`` (the PTX becomes constant
    stores, readable without a GPU). ``fold=False``: thread ``i`` computes
    tile ``i`` from its run-time index, as the persistent kernel does.
    """
    if cutlass.const_expr(fold):
        for i in cutlass.range_constexpr(m_tiles * n_tiles):
            m, n = device_tile(Int32(i), m_tiles, n_tiles, raster, group)
            out[2 * i] = m
            out[2 * i + 1] = n
    else:
        tid, _, _ = cute.arch.thread_idx()
        bid, _, _ = cute.arch.block_idx()
        i = bid * 128 + tid
        if i < m_tiles * n_tiles:
            m, n = device_tile(i, m_tiles, n_tiles, raster, group)
            out[2 * i] = m
            out[2 * i + 1] = n


@functools.lru_cache(maxsize=None)
def _order_host(m_tiles: int, n_tiles: int, raster: str, group: int, fold: bool):
    @cute.jit
    def tile_order_host(out: cute.Tensor, stream: cuda.CUstream):
        blocks = 1 if fold else (m_tiles * n_tiles + 127) // 128
        threads = 1 if fold else 128
        tile_order_kernel(out, m_tiles, n_tiles, raster, group, fold).launch(
            grid=(blocks, 1, 1), block=(threads, 1, 1), stream=stream)

    return tile_order_host


def compile_tile_order(target: str = "sm_90a", sched: TileScheduler | None = None, fold: bool = True):
    """Compile :func:`tile_order_kernel` for ``sched`` without a GPU."""
    check_target(target)
    sched = sched or TileScheduler(6, 5, "m", 4)
    if not isinstance(sched, TileScheduler):
        raise TypeError(f"sched must be a TileScheduler; got {type(sched).__name__}")
    if fold and sched.num_tiles > 256:
        raise ValueError(f"sched must have at most 256 tiles to fold; got {sched.num_tiles}")
    return compile_for(target, _order_host(sched.m_tiles, sched.n_tiles, sched.raster, sched.group, fold),
                       fake_tensor(Int32, (2 * sched.num_tiles,)), fake_stream())


def run_tile_order(sched: TileScheduler) -> list[tuple[int, int]]:
    """The device order of ``sched``, computed on the GPU from run-time indices."""
    if not isinstance(sched, TileScheduler):
        raise TypeError(f"sched must be a TileScheduler; got {type(sched).__name__}")
    require_tier("gpu", "gemmlab.scheduler.run_tile_order")
    import torch

    out = torch.full((2 * sched.num_tiles,), -1, dtype=torch.int32, device="cuda")  # poisoned
    launcher(_order_host(sched.m_tiles, sched.n_tiles, sched.raster, sched.group, False), out)()
    torch.cuda.synchronize()
    return [tuple(r) for r in out.view(-1, 2).tolist()]


# --------------------------------------------------------------------------------------
# Pictures
# --------------------------------------------------------------------------------------


def tile_order_grid(sched: TileScheduler) -> list[list[int]]:
    """``grid[m][n]`` = the linear index at which tile (m, n) is visited."""
    grid = [[-1] * sched.n_tiles for _ in range(sched.m_tiles)]
    for i, (m, n) in enumerate(sched.order()):
        grid[m][n] = i
    return grid


def wave_footprint(sched: TileScheduler, num_ctas: int) -> list[tuple[int, int]]:
    """Per wave of ``num_ctas`` tiles: (distinct A block-rows, distinct B block-columns) it reads."""
    check_int("num_ctas", num_ctas, lo=1)
    order = sched.order()
    out = []
    for w in range(0, len(order), num_ctas):
        wave = order[w:w + num_ctas]
        out.append((len({m for m, _ in wave}), len({n for _, n in wave})))
    return out


def draw_tile_order(scheds: list[TileScheduler], num_ctas: int, name: str = "07_tile_order"):
    """Draw the visit order of each scheduler; tiles of the first wave are outlined."""
    from matplotlib.patches import Rectangle

    from .figures import new_figure, save

    fig, axes = new_figure(1, len(scheds), figsize=(4.2 * len(scheds), 3.8), squeeze=False)
    for ax, s in zip(axes[0], scheds):
        grid = tile_order_grid(s)
        ax.imshow(grid, cmap="viridis", origin="upper")
        for m in range(s.m_tiles):
            for n in range(s.n_tiles):
                v = grid[m][n]
                ax.text(n, m, str(v), ha="center", va="center", fontsize=7,
                        color="white" if v < s.num_tiles * 0.6 else "black")
                if v < num_ctas:
                    ax.add_patch(Rectangle((n - 0.5, m - 0.5), 1, 1, fill=False, ec="red", lw=1.5))
        a, b = wave_footprint(s, num_ctas)[0]
        ax.set_title(f"raster={s.raster!r}, group={s.group}\nfirst wave ({num_ctas} CTAs): "
                     f"{a} A rows + {b} B cols", fontsize=9)
        ax.set_xlabel("n tile")
        ax.set_ylabel("m tile")
        ax.set_xticks(range(s.n_tiles))
        ax.set_yticks(range(s.m_tiles))
    return save(fig, name)
