"""Tests for gemmlab.heuristic: the configuration choice, on the CPU."""
import pytest

from gemmlab import heuristic as h
from gemmlab.gemm_sm90 import SMEM_LIMIT, GemmConfig

BENCH_SHAPES = [(4096, 2112, 7168), (4096, 576, 7168), (4096, 24576, 1536), (4096, 32768, 512),
                (4096, 7168, 16384), (4096, 4096, 7168), (4096, 7168, 2048), (4096, 4096, 4096),
                (8192, 8192, 8192), (2048, 2048, 8192)]


def test_intensity():
    assert h.intensity(128, 128) == pytest.approx(64.0)
    assert h.intensity(128, 256) == pytest.approx(85.333, rel=1e-4)


def test_square_shapes_take_the_biggest_tile():
    for shape in [(8192, 8192, 8192), (4096, 4096, 4096), (4096, 4096, 7168)]:
        c = h.choose(*shape)
        assert c.tile_n == 256 and c.cluster == (2, 1) and c.stages == 4


def test_small_n_fills_the_machine():
    # N = 576: 128 x 192 tiles would give 32 x 3 = 96 tiles for 132 SMs; 144 gives 32 x 4 = 128.
    c = h.choose(4096, 576, 7168)
    assert c.tile_n == 144
    best = h.candidates(4096, 576, 7168)[0]
    assert best.tiles == 128 and best.waves == 1 and best.useful == pytest.approx(0.97, abs=0.01)


def test_wave_quantization_counts():
    c = {x.tile_n: x for x in h.candidates(4096, 2112, 7168)}
    assert c[256].tiles == 32 * 9 and c[256].waves == 3
    assert c[176].tiles == 32 * 12 and c[176].waves == 3
    assert c[176].useful > c[256].useful


def test_candidates_sorted_and_complete():
    cs = h.candidates(1000, 1000, 64, num_sms=100)
    assert sorted(x.tile_n for x in cs) == sorted(h.TILE_NS)
    assert [x.score for x in cs] == sorted((x.score for x in cs), reverse=True)
    for x in cs:
        assert 0 < x.useful <= 1


@pytest.mark.parametrize("shape", BENCH_SHAPES + [(1, 8, 8), (129, 8, 8), (128, 4096, 64), (300, 200, 264)])
def test_every_choice_is_a_valid_config(shape):
    c = h.choose(*shape)
    assert isinstance(c, GemmConfig)
    assert c.smem_bytes() <= SMEM_LIMIT
    assert c.tile_n % c.epi_n == 0
    mt, nt = c.tiles(shape[0], shape[1])
    if mt >= 2:
        assert c.cluster == (2, 1)
    elif nt >= 2:
        assert c.cluster == (1, 2)
    else:
        assert c.cluster == (1, 1)
    cmt, cnt = c.cluster_tiles(shape[0], shape[1])
    assert c.raster == ("m" if cmt >= cnt else "n")


def test_stages_fill_shared_memory():
    assert h.max_stages(256) == 4  # 4 x 48 KB + 4 x 8 KB of epilogue
    assert h.max_stages(128) == 6  # 6 x 32 KB + 32 KB
    for tn in h.TILE_NS:
        s = h.max_stages(tn)
        en, es = h.epi_shape_for(tn)
        GemmConfig(tile_n=tn, stages=s, epi_n=en, epi_stages=es)  # fits
        with pytest.raises(ValueError, match="shared memory"):
            GemmConfig(tile_n=tn, stages=s + 1, epi_n=en, epi_stages=es)


def test_measured_stage_exception():
    # 128 x 176: 4 stages measured faster than the 5 that fit (H200, 4096 x 2112 x 7168).
    assert h.max_stages(176) == 5 and h.stages_for(176) == 4
    c = h.choose(4096, 2112, 7168)
    assert c.tile_n == 176 and c.stages == 4 and c.epi_per_wg
    assert "measured best" in h.explain(4096, 2112, 7168)
    assert h.stages_for(144) == h.max_stages(144) == 6


def test_explain_names_the_choice():
    text = h.explain(4096, 576, 7168)
    assert "tile 128x144" in text and "<- chosen" in text
    assert "cluster (2, 1)" in text and "stages 6" in text


def test_bad_arguments():
    with pytest.raises(ValueError, match="m must be"):
        h.candidates(0, 8, 8)
    with pytest.raises(TypeError, match="k must be an int"):
        h.candidates(8, 8, 8.0)
    with pytest.raises(ValueError, match="num_sms"):
        h.candidates(8, 8, 8, num_sms=0)
