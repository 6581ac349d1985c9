"""Chapter 04 (model): the swizzle address mapping against hand-worked cases, and the data behind its figures."""
from __future__ import annotations

import numpy as np
import pytest

from gemmlab import swizzle as swz


@pytest.mark.parametrize(
    "mode, logical, physical",
    [
        # none: the identity
        ("none", 0, 0), ("none", 0x1F0, 0x1F0),
        # 128B: chunk bits 4..6 ^= line bits 7..9.  Line 1 (byte 128), chunk 0 -> chunk 1.
        ("128B", 128, 144),
        # line 3, chunk 5, byte 7 within the chunk: 3*128 + 5*16 + 7 = 471 -> chunk 5 ^ 3 = 6 -> 384 + 96 + 7
        ("128B", 471, 487),
        # line 8 is line 0 of the next 1024-byte pattern: no change
        ("128B", 1024 + 32, 1024 + 32),
        # line 7, chunk 7 -> chunk 0
        ("128B", 7 * 128 + 7 * 16, 7 * 128),
        # 64B: only two bits.  Line 5 (5 & 3 = 1), chunk 6 -> chunk 7
        ("64B", 5 * 128 + 6 * 16, 5 * 128 + 7 * 16),
        # line 4 (4 & 3 = 0): unchanged
        ("64B", 4 * 128 + 16, 4 * 128 + 16),
        # 32B: one bit.  Line 1, chunk 2 -> chunk 3; line 2: unchanged
        ("32B", 128 + 32, 128 + 48),
        ("32B", 256 + 32, 256 + 32),
    ],
)
def test_swizzle_offset_hand_worked(mode, logical, physical):
    assert swz.swizzle_offset(mode, logical) == physical


@pytest.mark.parametrize("mode", swz.MODES)
def test_swizzle_is_an_involution_and_a_permutation_of_each_pattern(mode):
    a = np.arange(4 * swz.PATTERN_BYTES)
    p = swz.swizzle_offset(mode, a)
    assert np.array_equal(swz.swizzle_offset(mode, p), a)
    assert np.array_equal(np.sort(p), a)
    # bytes within a 16-byte chunk stay together, and chunks never leave their 128-byte line
    assert np.array_equal(p % 16, a % 16)
    assert np.array_equal(p // 128, a // 128)


def test_cute_swizzle_names():
    assert [swz.cute_swizzle(m) for m in swz.MODES] == [(0, 4, 3), (1, 4, 3), (2, 4, 3), (3, 4, 3)]


def test_tile_layout_128b_rows():
    lay = swz.tile_layout("128B", 8, 128)
    assert lay.shape == (8, 8, 2)
    # row r lives in line r; chunk c of row r is in bank group c ^ r
    for r in range(8):
        assert list(lay[r, :, 0]) == [r] * 8
        assert list(lay[r, :, 1]) == [c ^ r for c in range(8)]
    # unswizzled: chunk c always in group c
    assert np.array_equal(swz.tile_layout("none", 8, 128)[:, :, 1], np.tile(np.arange(8), (8, 1)))


def test_tile_layout_32b_rows_share_lines():
    lay = swz.tile_layout("32B", 8, 32)
    # four 32-byte rows per line; rows 4..7 are in line 1, whose chunks swap pairwise
    assert list(lay[:, 0, 0]) == [0, 0, 0, 0, 1, 1, 1, 1]
    assert list(lay[:, 0, 1]) == [0, 2, 4, 6, 1, 3, 5, 7]
    assert list(lay[:, 1, 1]) == [1, 3, 5, 7, 0, 2, 4, 6]


def test_line_map_128b_is_the_xor_table():
    data = swz.line_map("128B")
    assert data.shape == (8, 8, 2)
    for line in range(8):
        for g in range(8):
            assert tuple(data[line, g]) == (line, g ^ line)


def test_line_map_64b():
    data = swz.line_map("64B")
    # 64-byte rows: two per line. Line 1 holds rows 2 and 3, chunks swapped pairwise (1 = 1 & 3).
    assert [tuple(x) for x in data[1]] == [(2, 1), (2, 0), (2, 3), (2, 2), (3, 1), (3, 0), (3, 3), (3, 2)]


def test_expected_smem_places_bytes():
    tile = np.arange(2 * 128, dtype=np.int64).astype(np.uint8).reshape(2, 128)
    out = swz.expected_smem(tile, "128B")
    assert np.array_equal(out[:128], tile[0])
    # row 1: chunk 0 is at chunk 1's place and vice versa
    assert np.array_equal(out[128 + 16:128 + 32], tile[1, 0:16])
    assert np.array_equal(out[128:144], tile[1, 16:32])
    assert np.array_equal(swz.expected_smem(tile, "none"), tile.reshape(-1))


def test_rows_shorter_than_the_span_take_a_whole_span():
    """A 16 x 32 FP16 box (64-byte rows) with the 128B swizzle: each row on its own 128-byte line.

    Hand-worked: row r starts at byte 128 r, so its line is r and its chunk c lands in bank group
    c ^ (r & 7); 1024 data bytes spread over 2048 bytes of shared memory (what an H200 showed).
    """
    assert swz.row_pitch("128B", 64) == 128 and swz.row_pitch("none", 64) == 64
    assert swz.row_pitch("128B", 128) == 128 and swz.row_pitch("64B", 32) == 64 and swz.row_pitch("32B", 16) == 32
    assert swz.smem_bytes("128B", 16, 64) == 2048 and swz.smem_bytes("none", 16, 64) == 1024
    assert swz.smem_bytes("64B", 16, 64) == 1024  # one span per row: no padding
    lay = swz.tile_layout("128B", 16, 64)
    assert lay.shape == (16, 4, 2)
    for r in range(16):
        assert list(lay[r, :, 0]) == [r] * 4
        assert list(lay[r, :, 1]) == [c ^ (r & 7) for c in range(4)]
    # row 5, chunk 2: logical 5 * 128 + 32 = 672 -> group 2 ^ 5 = 7 of line 5: byte 752
    tile = np.arange(16 * 64, dtype=np.int64).astype(np.uint8).reshape(16, 64)
    out = swz.expected_smem(tile, "128B", fill=0xEE)
    assert out.shape == (2048,)
    assert np.array_equal(out[752:768], tile[5, 32:48])
    assert np.array_equal(out[640 + 16 * (0 ^ 5):640 + 16 * (0 ^ 5) + 16], tile[5, 0:16])
    mask = swz.data_mask("128B", 16, 64)
    assert mask.sum() == 1024 and (out[~mask] == 0xEE).all()
    # each line holds one row's four chunks and four chunks of padding
    assert mask.reshape(16, 8, 16).all(axis=2).sum(axis=1).tolist() == [4] * 16


def test_short_rows_with_the_64b_and_32b_swizzles():
    # 64B, 32-byte rows: pitch 64, row r at byte 64 r (line r // 2); group = (c + 4 (r % 2)) ^ ((r // 2) & 3)
    lay = swz.tile_layout("64B", 8, 32)
    assert [tuple(lay[r, 0]) for r in range(8)] == [(0, 0), (0, 4), (1, 1), (1, 5), (2, 2), (2, 6), (3, 3), (3, 7)]
    assert [tuple(lay[r, 1]) for r in range(4)] == [(0, 1), (0, 5), (1, 0), (1, 4)]
    # 32B, 16-byte rows: pitch 32, four rows per line; line 1 swaps chunk slots pairwise
    lay = swz.tile_layout("32B", 8, 16)
    assert [tuple(lay[r, 0]) for r in range(8)] == [(0, 0), (0, 2), (0, 4), (0, 6), (1, 1), (1, 3), (1, 5), (1, 7)]
    # the line map shows the padding
    data = swz.line_map("128B", 64, lines=2)
    assert [tuple(x) for x in data[1]] == [(1, 1), (1, 0), (1, 3), (1, 2), (-1, -1), (-1, -1), (-1, -1), (-1, -1)]


def test_column_reads_of_short_rows_with_128b_are_conflict_free_at_twice_the_memory():
    """Chapter 04 exercise 2: 64-byte rows. Unswizzled 4-way; 64B conflict-free; 128B conflict-free too, but
    every row then takes a whole 128-byte line: twice the shared memory."""
    assert max(swz.column_read_ways("none", 64, c) for c in range(4)) == 4
    assert max(swz.column_read_ways("64B", 64, c) for c in range(4)) == 1
    assert max(swz.column_read_ways("128B", 64, c) for c in range(4)) == 1
    assert swz.smem_bytes("128B", 64, 64) == 2 * swz.smem_bytes("64B", 64, 64)


def test_column_reads_conflict_without_swizzle_only():
    table = swz.conflict_table()
    assert [(r["row bytes"], r["mode"], r["ways none"], r["ways swizzled"]) for r in table] == [
        (32, "32B", 2, 1), (64, "64B", 4, 1), (128, "128B", 8, 1)]
    assert swz.column_read_ways("none", 128, chunk=3) == 8
    assert swz.column_read_ways("128B", 128, chunk=3) == 1


def test_figures_are_drawn_from_the_model(tmp_path, monkeypatch):
    from gemmlab import figures

    monkeypatch.setattr(figures, "FIGURES_DIR", tmp_path)  # keep test drawings out of figures/
    path, datas = swz.draw_swizzle_modes()
    assert path.parent == tmp_path
    assert path.exists() and path.name == "04_swizzle_modes.png"
    for m in swz.MODES:
        assert np.array_equal(datas[m], swz.line_map(m))
    path1, data1 = swz.draw_swizzle("128B")
    assert path1.name == "04_swizzle_128B.png" and np.array_equal(data1, swz.line_map("128B"))


@pytest.mark.parametrize(
    "call, exc, words",
    [
        (lambda: swz.swizzle_offset("256B", 0), ValueError, "mode must be one of"),
        (lambda: swz.swizzle_offset("128B", -16), ValueError, "non-negative"),
        (lambda: swz.tile_layout("128B", 8, 256), ValueError, "row_bytes must be <= 128"),
        (lambda: swz.tile_layout("none", 8, 24), ValueError, "row_bytes must be a multiple of 16"),
        (lambda: swz.tile_layout("none", 0, 32), ValueError, "rows must be >= 1"),
        (lambda: swz.expected_smem(np.zeros((2, 128), np.int32), "none"), ValueError, "uint8"),
        (lambda: swz.column_read_ways("none", 128, chunk=8), ValueError, "chunk must be <= 7"),
        (lambda: swz.conflict_table((48,)), ValueError, "row_bytes_list[i] must be one of"),
        (lambda: swz.smem_bytes("64B", 4, 128), ValueError, "row_bytes must be <= 64"),
        (lambda: swz.expected_smem(np.zeros((2, 64), np.uint8), "128B", fill=256), ValueError, "fill must be <= 255"),
    ],
)
def test_bad_input(call, exc, words):
    with pytest.raises(exc) as e:
        call()
    assert words in str(e.value)
