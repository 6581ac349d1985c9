"""gemmlab.layouts: the CPU enumeration agrees with CuTe's own layout algebra, and the GEMM's tensors are what chapter 06 says."""
import re

import pytest

from gemmlab import layouts as L


def test_offsets_row_and_column_major():
    assert L.offsets((4, 8), (8, 1))[1][2] == 10 == L.offset((4, 8), (8, 1), (1, 2))
    assert L.offsets((4, 8), (1, 4))[1][2] == 9
    assert L.offsets((2, 3, 4), (12, 4, 1))[1][2][3] == 23
    flat = sorted(v for row in L.offsets((4, 8), (8, 1)) for v in row)
    assert flat == list(range(32))  # a compact layout is a bijection onto 0..31


def test_tile_offsets_enumerate_zipped_divide_order():
    tiles = L.tile_offsets((4, 8), (8, 1), (2, 4))
    assert [t for t, _ in tiles] == [(0, 0), (1, 0), (0, 1), (1, 1)]  # tile index 0 fastest
    # CuTe: zipped_divide((4,8):(8,1), (2,4)) = ((2,4),(2,2)):((8,1),(16,4)).
    tile_shape, tile_stride, rest_stride = (2, 4), (8, 1), (16, 4)
    for (bi, bj), elems in tiles:
        base = bi * rest_stride[0] + bj * rest_stride[1]
        want = [base + i * tile_stride[0] + j * tile_stride[1] for j in range(tile_shape[1]) for i in range(tile_shape[0])]
        assert elems == want


def test_cute_algebra_matches_the_cpu_model():
    ex = L.algebra_examples()
    assert ex["row"] == "(4,8):(8,1)" and ex["col"] == "(4,8):(1,4)"
    assert int(ex["row((1, 2))"]) == L.offset((4, 8), (8, 1), (1, 2))
    assert ex["zipped_divide(row, (2, 4))"] == "((2,4),(2,2)):((8,1),(16,4))"
    assert ex["flat_divide(row, (2, 4))"] == "(2,4,2,2):(8,1,16,4)"
    assert "(128,64,8)" in ex["local_tile(coords, (128, 64), (1, None))"]
    assert ex["local_tile(...)[(5, 3, 2)]"] == "(133, 131)"  # row 128 + 5, column 2 * 64 + 3


def test_gemm_tiling_shapes():
    t = L.gemm_tiling(4096, 4096, tile_m=128, tile_n=128, stages=4)
    assert t["a"] == "(4096,4096):(4096,1)"
    assert t["gA"].startswith("(128,64,64):")  # one CTA's rows, every one of the 64 k-tiles
    assert t["sA swizzle"] == "S<3,4,3>"  # the 128-byte swizzle of chapter 04
    assert t["tAsA"].startswith("((8192,1),(1,4)):")  # one 128 x 64 box per stage
    assert t["tCsA"].startswith("((64,16),2,4,(1,4)):")  # m64 x k16 per wgmma, 2 row blocks, 4 k16 slices
    # Descriptors advance in 16-byte units: +2 per k16 slice (32 bytes), +512 per 64-row block (8 KiB).
    stride = re.search(r":\((\d+),(\d+),(\d+),", t["tCrA"]).groups()
    assert (int(stride[1]) * 16, int(stride[2]) * 16) == (8192, 32)
    assert L.gemm_tiling(1024, 512, tile_m=64, tile_n=256, stages=2)["gA"].startswith("(64,64,8):")


@pytest.mark.parametrize("call, err", [
    (lambda: L.offset((4, 8), (8, 1), (4, 0)), ValueError),
    (lambda: L.offset((4, 8), (8,), (0, 0)), ValueError),
    (lambda: L.offsets("4x8", (8, 1)), TypeError),
    (lambda: L.tile_offsets((4, 8), (8, 1), (3, 4)), ValueError),
    (lambda: L.gemm_tiling(100, 4096), ValueError),
    (lambda: L.gemm_tiling(4096, 4096, tile_m=96), ValueError),
])
def test_bad_input(call, err):
    with pytest.raises(err):
        call()
