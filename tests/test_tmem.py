"""Chapter 09: tensor memory: addresses, lanes, allocation rules, the tcgen05.ld 32x32b model, PTX."""
import numpy as np
import pytest

from gemmlab import figures, tmem
from gemmlab.compile import ptx_lines

# ---------------------------------------------------------------- addresses and lanes


def test_tmem_address_packs_lane_high_column_low():
    assert tmem.tmem_addr(0, 0) == 0
    assert tmem.tmem_addr(32, 5) == 0x0020_0005
    assert tmem.tmem_addr(127, 511) == (127 << 16) | 511
    assert tmem.tmem_addr_fields(0x0060_0100) == (96, 256)
    for lane, col in [(0, 0), (33, 17), (127, 511)]:
        assert tmem.tmem_addr_fields(tmem.tmem_addr(lane, col)) == (lane, col)
    with pytest.raises(ValueError, match="lane"):
        tmem.tmem_addr(128, 0)
    with pytest.raises(ValueError, match="column"):
        tmem.tmem_addr(0, 512)


def test_warp_lanes_follow_warp_mod_4():
    assert tmem.warp_lanes(0) == range(0, 32)
    assert tmem.warp_lanes(3) == range(96, 128)
    assert tmem.warp_lanes(5) == range(32, 64)  # the second warpgroup sees the same quarters
    assert tmem.warp_lanes(10) == range(64, 96)


def test_alloc_columns_rules():
    for ok in (32, 64, 128, 256, 512):
        assert tmem.check_alloc_columns(ok) == ok
    with pytest.raises(ValueError, match="power of two"):
        tmem.check_alloc_columns(96)
    with pytest.raises(ValueError, match=">= 32"):
        tmem.check_alloc_columns(16)
    with pytest.raises(ValueError, match="<= 512"):
        tmem.check_alloc_columns(1024)
    with pytest.raises(TypeError, match="ncols"):
        tmem.check_alloc_columns(64.0)
    assert [tmem.alloc_columns_for(n) for n in (1, 32, 33, 64, 96, 200, 256)] == [32, 32, 64, 64, 128, 256, 256]


def test_tmem_model_allocates_and_blocks():
    mdl = tmem.TmemModel()
    a = mdl.alloc(256)
    b = mdl.alloc(128)
    c = mdl.alloc(64)
    assert [tmem.tmem_addr_fields(x) for x in (a, b, c)] == [(0, 0), (0, 256), (0, 384)]
    assert mdl.free_columns == 64
    assert mdl.alloc(128) is None  # the hardware alloc would block here
    mdl.dealloc(a, 256)
    assert mdl.alloc(128) == tmem.tmem_addr(0, 0)
    with pytest.raises(ValueError, match="no allocation"):
        mdl.dealloc(b, 64)  # wrong size
    assert tmem.check_alloc_addresses([a, b, c], [256, 128, 64]) == []
    assert "overlap" in tmem.check_alloc_addresses([0, 32], [64, 32])[0]
    assert "lane field" in tmem.check_alloc_addresses([tmem.tmem_addr(1, 0)], [32])[0]
    assert "run past" in tmem.check_alloc_addresses([tmem.tmem_addr(0, 480)], [64])[0]


# ---------------------------------------------------------------- tcgen05.ld 32x32b


def test_ld_model_hand_worked():
    m = tmem.tmem_ld_32x32b_model(1)
    assert m.shape == (32, 1, 2)
    assert m[7, 0].tolist() == [7, 0]
    m = tmem.tmem_ld_32x32b_model(8)
    assert m.shape == (32, 8, 2)
    assert m[0, 5].tolist() == [0, 5]
    assert m[31, 7].tolist() == [31, 7]
    assert tmem.tmem_ld_32x32b_model(128).shape == (32, 128, 2)
    # each (lane, column) cell is received exactly once
    m = tmem.tmem_ld_32x32b_model(16).reshape(-1, 2)
    assert len({tuple(x) for x in m.tolist()}) == 32 * 16
    with pytest.raises(ValueError, match="num"):
        tmem.tmem_ld_32x32b_model(3)
    with pytest.raises(ValueError, match="num"):
        tmem.tmem_ld_32x32b_model(256)


def test_accumulator_coords_hand_worked():
    # warp 5 is in lane quarter 1; thread 3, register 7, of an x8 load at column 16 -> row 35, col 23
    c = tmem.accumulator_coords(5, 8, col0=16)
    assert c[3, 7].tolist() == [35, 23]
    assert tmem.accumulator_coords(3, 1)[31, 0].tolist() == [127, 0]
    with pytest.raises(ValueError, match="col0"):
        tmem.accumulator_coords(0, 32, col0=500)


def test_registers_to_tile_inverts_the_model():
    n, num = 64, 16
    tile = np.arange(128 * n).reshape(128, n)
    regs = np.zeros_like(tile)
    for w in range(4):
        for c in range(n // num):
            co = tmem.accumulator_coords(w, num, c * num)
            for t in range(32):
                regs[32 * w + t, c * num:(c + 1) * num] = tile[co[t, :, 0], co[t, :, 1]]
    assert np.array_equal(tmem.registers_to_tile(regs, num), tile)
    # for 32x32b the registers *are* the tile, row per thread
    assert np.array_equal(regs, tile)


def test_tmem_ld_figure_data(tmp_path, monkeypatch):
    monkeypatch.setattr(figures, "FIGURES_DIR", tmp_path)
    path, data = tmem.draw_tmem_ld(4)
    assert path.exists() and path.name == "09_tmem_ld_32x32b.png"
    assert data["owner"][:, 0].tolist() == [lane // 32 for lane in range(128)]
    assert data["thread"][37, 2] == 37 and data["reg"][37, 2] == 2


# ---------------------------------------------------------------- PTX


def test_alloc_kernel_ptx():
    c = tmem.compile_alloc("sm_100a", (128, 64))
    lines = ptx_lines(c, r"^tcgen05\.")
    assert lines[0].startswith("tcgen05.alloc.cta_group::1.sync.aligned.shared::cta.b32") and lines[0].endswith("128;")
    assert lines[1].endswith("64;")
    names = [line.split()[0] for line in lines]
    assert names == [
        "tcgen05.alloc.cta_group::1.sync.aligned.shared::cta.b32",
        "tcgen05.alloc.cta_group::1.sync.aligned.shared::cta.b32",
        "tcgen05.relinquish_alloc_permit.cta_group::1.sync.aligned;",
        "tcgen05.fence::before_thread_sync;",
        "tcgen05.fence::after_thread_sync;",
        "tcgen05.dealloc.cta_group::1.sync.aligned.b32",
        "tcgen05.dealloc.cta_group::1.sync.aligned.b32",
    ]
    # the fences straddle the bar.sync that publishes the addresses
    seq = [line.split()[0] for line in ptx_lines(c, r"^tcgen05\.fence|^bar\.sync")]
    assert seq[:3] == ["tcgen05.fence::before_thread_sync;", "bar.sync", "tcgen05.fence::after_thread_sync;"]


def test_alloc_bad_sizes():
    with pytest.raises(ValueError, match="power of two"):
        tmem.compile_alloc("sm_100a", (96,))
    with pytest.raises(ValueError, match="at most 512"):
        tmem.compile_alloc("sm_100a", (512, 32))
    with pytest.raises(ValueError, match=">= 32"):
        tmem.run_tmem_alloc((16,))  # argument checks come before the tier check
    with pytest.raises(ValueError, match="target"):
        tmem.compile_alloc("sm_90", (32,))


# ---------------------------------------------------------------- GPU (Blackwell)


@pytest.mark.gpu
@pytest.mark.sm100
def test_alloc_on_gpu():
    sizes = (128, 64, 32, 256)
    addrs = tmem.run_tmem_alloc(sizes)
    assert tmem.check_alloc_addresses(addrs, sizes) == []
