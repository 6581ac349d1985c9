"""Tests for gemmlab.scheduler: the grouped tile order, host and device."""
import re

import pytest

from gemmlab import scheduler as sc
from gemmlab.compile import ptx_lines
from gemmlab.tiers import TierError

SHAPES = [(1, 1), (1, 7), (7, 1), (6, 5), (8, 8), (9, 4), (13, 11), (32, 16)]


@pytest.mark.parametrize("m_tiles,n_tiles", SHAPES)
@pytest.mark.parametrize("raster", ["m", "n"])
@pytest.mark.parametrize("group", [1, 2, 4, 8, 16])
def test_order_is_a_permutation(m_tiles, n_tiles, raster, group):
    s = sc.TileScheduler(m_tiles, n_tiles, raster, group)
    order = s.order()
    assert len(order) == s.num_tiles == m_tiles * n_tiles
    assert sorted(order) == [(m, n) for m in range(m_tiles) for n in range(n_tiles)]


def test_hand_worked_raster_m():
    # 6 x 5 tiles, bands of 4 M tiles: walk m = 0..3 down column 0, then column 1, ...
    s = sc.TileScheduler(6, 5, "m", 4)
    assert s.order()[:9] == [(0, 0), (1, 0), (2, 0), (3, 0), (0, 1), (1, 1), (2, 1), (3, 1), (0, 2)]
    # The second band holds only m = 4, 5 (width 2) and starts after 4 x 5 = 20 tiles.
    assert s.order()[20:24] == [(4, 0), (5, 0), (4, 1), (5, 1)]
    assert s.tile(29) == (5, 4)


def test_hand_worked_raster_n():
    s = sc.TileScheduler(5, 6, "n", 4)
    assert s.order()[:6] == [(0, 0), (0, 1), (0, 2), (0, 3), (1, 0), (1, 1)]
    assert s.order()[20:24] == [(0, 4), (0, 5), (1, 4), (1, 5)]


@pytest.mark.parametrize("m_tiles,n_tiles", SHAPES)
@pytest.mark.parametrize("raster", ["m", "n"])
@pytest.mark.parametrize("group", [1, 3, 8])
def test_grouping_as_documented(m_tiles, n_tiles, raster, group):
    """Inside each band, the index walks the band's major tiles first, then the other direction."""
    s = sc.TileScheduler(m_tiles, n_tiles, raster, group)
    major_tiles, minor_tiles = (m_tiles, n_tiles) if raster == "m" else (n_tiles, m_tiles)
    i = 0
    for first in range(0, major_tiles, group):
        width = min(group, major_tiles - first)
        for minor in range(minor_tiles):
            for major in range(first, first + width):
                want = (major, minor) if raster == "m" else (minor, major)
                assert s.tile(i) == want, (i, want)
                i += 1
    assert i == s.num_tiles


def test_extreme_groups_are_plain_orders():
    # group=1: bands one tile wide, so the walk steps across the band at once;
    # a group covering the whole grid walks the raster direction end to end.
    assert sc.TileScheduler(3, 4, "m", 1).order() == [(m, n) for m in range(3) for n in range(4)]
    assert sc.TileScheduler(3, 4, "n", 1).order() == [(m, n) for n in range(4) for m in range(3)]
    assert sc.TileScheduler(3, 4, "m", 3).order() == [(m, n) for n in range(4) for m in range(3)]
    assert sc.TileScheduler(3, 4, "n", 4).order() == [(m, n) for m in range(3) for n in range(4)]


def test_tiles_for_partitions_the_grid():
    s = sc.TileScheduler(9, 7, "m", 4)
    seen = []
    for cta in range(5):
        mine = s.tiles_for(cta, 5)
        assert mine == [s.tile(i) for i in range(cta, s.num_tiles, 5)]
        seen += mine
    assert sorted(seen) == sorted(s.order())
    assert s.tiles_for(0, 100) == [(0, 0)]  # more CTAs than tiles: some get nothing
    assert s.tiles_for(99, 100) == []


def test_grouping_shrinks_the_wave_footprint():
    # A wave of 132 CTAs over a 64 x 64 grid. Column order reads all 64 A
    # block-rows and 3 B block-columns (67 panels); bands of 8 along M read
    # 8 A rows and 17 B columns (25 panels).
    assert sc.wave_footprint(sc.TileScheduler(64, 64, "n", 1), 132)[0] == (64, 3)
    assert sc.wave_footprint(sc.TileScheduler(64, 64, "m", 8), 132)[0] == (8, 17)
    assert sc.wave_footprint(sc.TileScheduler(64, 64, "n", 8), 132)[0] == (17, 8)


def test_bad_arguments():
    with pytest.raises(ValueError, match="raster"):
        sc.TileScheduler(2, 2, "k")
    with pytest.raises(ValueError, match="group"):
        sc.TileScheduler(2, 2, "m", 0)
    with pytest.raises(TypeError, match="m_tiles"):
        sc.TileScheduler(2.0, 2)
    with pytest.raises(ValueError, match="n_tiles"):
        sc.TileScheduler(2, 0)
    s = sc.TileScheduler(2, 2)
    with pytest.raises(ValueError, match="linear"):
        s.tile(4)
    with pytest.raises(ValueError, match="cta"):
        s.tiles_for(3, 3)
    with pytest.raises(TypeError, match="sched"):
        sc.compile_tile_order("sm_90a", (2, 2))
    with pytest.raises(ValueError, match="target"):
        sc.compile_tile_order("sm_80", s)
    with pytest.raises(ValueError, match="sched"):
        sc.compile_tile_order("sm_90a", sc.TileScheduler(20, 20))


def test_frozen():
    s = sc.TileScheduler(2, 2)
    with pytest.raises(Exception):
        s.group = 4


# ---------------------------------------------------------------- the device twin, read from PTX

_STORE = re.compile(r"st\.global(?:\.v(\d))?\.b32\s+\[%rd\d+(?:\+(\d+))?\],\s*\{?([-\d,\s]+)\}?;")


def _folded_stores(compiled):
    """{word offset: constant} of the kernel's constant (possibly vector) stores."""
    out = {}
    for line in ptx_lines(compiled, r"st\.global"):
        m = _STORE.search(line)
        assert m, f"not a constant store: {line}"
        base = int(m.group(2) or 0) // 4
        vals = [int(v) for v in m.group(3).split(",")]
        assert len(vals) == int(m.group(1) or 1)
        for j, v in enumerate(vals):
            out[base + j] = v
    return out


@pytest.mark.parametrize("m_tiles,n_tiles,raster,group", [(6, 5, "m", 4), (5, 6, "n", 4), (7, 3, "m", 8),
                                                          (4, 9, "n", 2), (3, 3, "m", 1)])
def test_device_twin_folds_to_the_host_order(m_tiles, n_tiles, raster, group):
    s = sc.TileScheduler(m_tiles, n_tiles, raster, group)
    stores = _folded_stores(sc.compile_tile_order("sm_90a", s, fold=True))
    assert len(stores) == 2 * s.num_tiles
    assert [(stores[2 * i], stores[2 * i + 1]) for i in range(s.num_tiles)] == s.order()


def test_device_twin_runtime_index_compiles():
    # From a run-time index the band width is a run-time value: one real division.
    c = sc.compile_tile_order("sm_90a", sc.TileScheduler(6, 5, "m", 4), fold=False)
    assert ptx_lines(c, r"^div\.|^rem\.")
    assert ptx_lines(c, r"^st\.global")


def test_tile_order_figure(tmp_path, monkeypatch):
    import gemmlab.figures as figs

    monkeypatch.setattr(figs, "FIGURES_DIR", tmp_path)
    p = sc.draw_tile_order([sc.TileScheduler(6, 8, "n", 1), sc.TileScheduler(6, 8, "m", 3)], 9, "t")
    assert p.exists() and p.stat().st_size > 1000
    assert sc.tile_order_grid(sc.TileScheduler(2, 3, "m", 1)) == [[0, 1, 2], [3, 4, 5]]


def test_run_refuses_without_gpu():
    from gemmlab.tiers import detect_tier

    if detect_tier() != "cpu":
        pytest.skip("this machine has a GPU")
    with pytest.raises(TierError):
        sc.run_tile_order(sc.TileScheduler(2, 2))


@pytest.mark.gpu
@pytest.mark.parametrize("m_tiles,n_tiles,raster,group", [(6, 5, "m", 4), (33, 17, "n", 8), (40, 40, "m", 8)])
def test_device_order_on_gpu(m_tiles, n_tiles, raster, group):
    s = sc.TileScheduler(m_tiles, n_tiles, raster, group)
    assert sc.run_tile_order(s) == s.order()
