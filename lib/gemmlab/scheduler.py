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
      for pictures; :func:`plot_tile_order` draws it.

Both versions call one function, :func:`_tile_math`, with a different
``minimum`` (Python's ``min`` or ``cutlass.min``), so they cannot drift apart.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
import cuda.bindings.driver as cuda
from cutlass import Int32

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


def plot_tile_order(scheds: list[TileScheduler], num_ctas: int, name: str = "07_tile_order"):
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
