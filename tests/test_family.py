"""The GEMM family's layers on the CPU: contract, configs, split ranges, heuristic model, plan and api wiring."""
from dataclasses import replace

import numpy as np
import pytest
import torch

import gemmlab
from gemmlab import hardware, tiers
from gemmlab.family import api, plan
from gemmlab.family import heuristic_sm90 as h
from gemmlab.measure.gemm_family import family_cases
from gemmlab.family.configs import Sm90Config, Sm100Config, effective_splits, hybrid_tiles, split_ranges
from gemmlab.family.problem import GemmProblem, canonical, problem_of

BF = torch.bfloat16


def _ab(m, n, k, dtype=BF, k_major=True):
    a = torch.zeros(m, k, dtype=dtype)
    b = torch.zeros(n, k, dtype=dtype).t() if k_major else torch.zeros(k, n, dtype=dtype)
    return a, b


# ---------------------------------------------------------------- the contract


def test_problem_of_reads_both_b_layouts():
    assert problem_of(*_ab(24, 16, 40)) == GemmProblem(24, 16, 40, b_major="k")
    assert problem_of(*_ab(24, 16, 40, k_major=False)) == GemmProblem(24, 16, 40, b_major="n")
    a, b = _ab(24, 16, 40, dtype=torch.float16)
    assert problem_of(a, b, torch.zeros(24, 16, dtype=BF)) == GemmProblem(24, 16, 40, "float16", "bfloat16", "k")


@pytest.mark.parametrize("what,args,exc,match", [
    ("fp32 a", lambda: (torch.zeros(24, 40), _ab(24, 16, 40)[1]), TypeError, "a must have dtype bfloat16 or float16"),
    ("mixed", lambda: (_ab(24, 16, 40)[0], _ab(24, 16, 40, dtype=torch.float16)[1]), TypeError, "same dtype"),
    ("N x K passed", lambda: (_ab(24, 16, 40)[0], torch.zeros(16, 40, dtype=BF)), ValueError, "b must be K x N"),
    ("K = 36", lambda: _ab(24, 16, 36), ValueError, "K must be a multiple of 8"),
    ("N = 12", lambda: _ab(24, 12, 40, k_major=False), ValueError, "N must be a multiple of 8"),
    ("a transposed", lambda: (torch.zeros(40, 24, dtype=BF).t(), _ab(24, 16, 40)[1]), ValueError,
     "a must be K-contiguous"),
    ("a row-strided", lambda: (torch.zeros(24, 48, dtype=BF)[:, :40], _ab(24, 16, 40)[1]), ValueError,
     "a's rows must be packed"),
    ("b strided", lambda: (_ab(24, 16, 40)[0], torch.zeros(40, 32, dtype=BF)[:, ::2]), ValueError,
     "b must be N-contiguous"),
    ("1-D a", lambda: (torch.zeros(40, dtype=BF), _ab(24, 16, 40)[1]), ValueError, "a must be 2-D"),
    ("empty a", lambda: (torch.zeros(0, 40, dtype=BF), _ab(24, 16, 40)[1]), ValueError, "at least one element"),
    ("numpy b", lambda: (_ab(24, 16, 40)[0], _ab(24, 16, 40)[1].float().numpy()), TypeError,
     "b must be a torch.Tensor"),
])
def test_problem_of_rejects(what, args, exc, match):
    with pytest.raises(exc, match=match):
        problem_of(*args())


def test_problem_of_checks_out():
    a, b = _ab(24, 16, 40)
    with pytest.raises(ValueError, match=r"out must have shape \(M, N\) = \(24, 16\)"):
        problem_of(a, b, torch.zeros(16, 24, dtype=BF))
    with pytest.raises(TypeError, match="out must have dtype"):
        problem_of(a, b, torch.zeros(24, 16))
    with pytest.raises(ValueError, match="out must be contiguous"):
        problem_of(a, b, torch.zeros(16, 24, dtype=BF).t())
    base = torch.zeros(24 * 40 + 8, dtype=BF)
    with pytest.raises(ValueError, match="a must start at a 16-byte aligned address"):
        problem_of(base[1:24 * 40 + 1].view(24, 40), b)


def test_size_one_dimensions_take_any_stride():
    # torch gives a size-1 dimension whatever stride the view implies; it addresses nothing.
    a = torch.zeros(40, 1, dtype=BF).t()  # 1 x 40 with strides (1, 1)
    b = torch.zeros(16, 40, dtype=BF).t()
    out = torch.zeros(16, 1, dtype=BF).t()  # 1 x 16 with strides (1, 1)
    assert problem_of(a, b, out) == GemmProblem(1, 16, 40)
    assert canonical(a).stride() == (40, 1) and canonical(out).stride() == (16, 1)
    packed = torch.zeros(3, 40, dtype=BF)
    assert canonical(packed) is packed
    assert canonical(b, row_major=False) is b


def test_problem_counts():
    p = GemmProblem(64, 2112, 7168)
    assert p.flops == 2 * 64 * 2112 * 7168
    assert p.min_bytes() == 2 * (64 * 7168 + 7168 * 2112) + 2 * 64 * 2112
    with pytest.raises(ValueError, match="K must be a multiple of 8"):
        GemmProblem(8, 8, 12)
    with pytest.raises(ValueError, match="b_major"):
        GemmProblem(8, 8, 8, b_major="m")


# ---------------------------------------------------------------- configs


def test_sm90_config_sizes_by_hand():
    c = Sm90Config(tile_n=256, stages=4)
    assert c.stage_bytes() == (128 + 256) * 64 * 2 == 49152
    assert c.epi_bytes() == 2 * 4 * 64 * 32 * 2  # two warpgroups x ring of 4 sub-tiles of 64 x 32 bf16
    assert c.smem_bytes() == 4 * 49152 + 32768 + 2 * 4 * 8 + 1024 == 230464 <= hardware.SMEM_PER_BLOCK
    assert c.threads == 384 and c.consumers == 2 and c.cluster_size == 2
    small = Sm90Config(tile_m=64, tile_n=64, stages=8, cluster=(1, 1), splits=3)
    # split-K keeps the output ring: the tile's last unit stores C through it like any other tile
    assert small.threads == 256 and small.epi_bytes() == 1 * 4 * 64 * 32 * 2 and small.split_k
    assert c.tiles(4096, 2112) == (32, 9) and c.cluster_tiles(4096, 2112) == (16, 9) and c.units(4096, 2112) == 144
    swap = Sm90Config(tile_m=64, tile_n=64, stages=8, cluster=(1, 1), swap_ab=True, splits=2)
    assert swap.kernel_mn(64, 2112) == (2112, 64) and swap.tiles(64, 2112) == (33, 1) and swap.units(64, 2112) == 66
    assert swap.name == "64x64 c1x1 m8 s8 swap split2"
    # the in-kernel split-K's state: a counter and a partial tile per CTA tile (cluster padding included) and slice
    assert swap.split_tiles(64, 2112) == 33 and swap.workspace_floats(64, 2112) == 33 * 2 * 64 * 64
    pair = Sm90Config(tile_m=64, tile_n=64, stages=8, cluster=(2, 1), splits=3)
    assert pair.split_tiles(130, 64) == 4  # 3 M tiles in 2 clusters of 2 CTAs: the 4th CTA computes padding
    assert pair.workspace_floats(130, 64, 2) == 4 * 2 * 64 * 64  # the run-time count, when given
    # on a grid of fewer clusters than tiles only the tail is split, and only its tiles have a workspace: 33 tiles
    # on 8 clusters run 32 whole (4 waves) and the 33rd in 2 slices
    assert swap.hybrid(64, 2112, 8) == (32, 1) and swap.units(64, 2112, 8) == 32 + 2
    assert swap.split_tiles(64, 2112, 8) == 1 and swap.workspace_floats(64, 2112, clusters=8) == 2 * 64 * 64
    assert pair.hybrid(540, 64, 2) == (4, 1) and pair.split_tiles(540, 64, 2) == 2  # a cluster tile is 2 CTA tiles
    assert c.units(4096, 2112, 66) == 144 and c.hybrid(4096, 2112, 66) == (144, 0)  # no split-K: every tile whole


def test_hybrid_tiles_by_hand():
    assert hybrid_tiles(296, 132, 3) == (264, 32)  # two whole waves, then 32 tiles x 3 slices: 96 units, one wave
    assert hybrid_tiles(80, 66, 3) == (66, 14)
    assert hybrid_tiles(5, 2, 2) == (4, 1)
    assert hybrid_tiles(9, 132, 8) == (0, 9)  # at most one wave: every tile split
    assert hybrid_tiles(132, 132, 2) == (0, 132)
    assert hybrid_tiles(264, 132, 2) == (264, 0)  # whole waves: nothing to split
    assert hybrid_tiles(296, 132, 1) == (296, 0)  # no split-K: every tile whole
    assert hybrid_tiles(np.int64(5), np.int32(2), torch.tensor(3)) == (4, 1)  # numpy and torch integers are numbers
    for kw, exc, msg in ((dict(tiles=0), ValueError, "^tiles must be >= 1; got 0"),
                         (dict(clusters=0), ValueError, "^clusters must be >= 1; got 0"),
                         (dict(splits=-2), ValueError, "^splits must be >= 1; got -2"),
                         (dict(tiles=5.0), TypeError, "^tiles must be an int"),
                         (dict(clusters=True), TypeError, "^clusters must be an int")):
        with pytest.raises(exc, match=msg):
            hybrid_tiles(**{**dict(tiles=5, clusters=2, splits=2), **kw})


def test_sm90_config_rules():
    with pytest.raises(ValueError, match="tile_n must be a multiple of 8"):
        Sm90Config(tile_n=100)
    # a multiple of 8 that is no multiple of 16 is a token tile: swapped only, with a sub-tile that divides it
    with pytest.raises(ValueError, match="tile_n must be a multiple of 16 and epi_n one of .* without swap_ab"):
        Sm90Config(tile_n=104, epi_n=8)
    with pytest.raises(ValueError, match="without swap_ab"):
        Sm90Config(tile_n=128, epi_n=8)  # an 8-column sub-tile of C stored N-major: not built
    with pytest.raises(ValueError, match="epi_n must divide tile_n=200; got epi_n=16"):
        Sm90Config(tile_n=200, epi_n=16, swap_ab=True, stages=4)
    with pytest.raises(ValueError, match="epi_n must be a multiple of 8"):
        Sm90Config(tile_n=200, epi_n=20, swap_ab=True, stages=4)
    assert Sm90Config(tile_n=200, epi_n=40, swap_ab=True, stages=4).epi_n == 40
    with pytest.raises(ValueError, match="tile_m"):
        Sm90Config(tile_m=96)
    with pytest.raises(ValueError, match="cluster"):
        Sm90Config(cluster=(2, 3))  # (2, 2) is a cluster of 4 now: SM90_CLUSTERS
    with pytest.raises(ValueError, match="shared memory"):
        Sm90Config(tile_n=256, stages=5)
    with pytest.raises(ValueError, match="epi_n must divide"):
        Sm90Config(tile_n=144, epi_n=32)
    with pytest.raises(ValueError, match="tile_k must be 64 for bfloat16"):
        Sm90Config(tile_k=128)
    assert not Sm90Config(tile_n=144, stages=4, epi_n=16, epi_stages=4).epi_ring_aligned
    assert Sm90Config(tile_n=256, stages=4).epi_ring_aligned
    for bad, msg in ((dict(wg_rows=96), "wg_rows must be one of"), (dict(tile_n=224, wg_rows=128), "tile_n <= 192"),
                     (dict(tile_m=64, tile_n=128, wg_rows=128), "tile_m=128"),
                     (dict(tile_n=128, wg_rows=128, gated=True), "no gated epilogue")):
        with pytest.raises(ValueError, match=msg):
            Sm90Config(**bad)


def test_one_consumer_warpgroup_config_by_hand():
    # wg_rows = 128: one consumer warpgroup (256 threads), one ring of epilogue buffers (half the bytes), so a
    # 128 x 96 tile fits a 7th A/B stage: 7 x 28 KiB + 4 x 4 KiB + barriers + slack <= 227 KiB (with two warpgroups
    # the 8 buffers take 32 KiB and 7 stages do not fit)
    one, two = Sm90Config(tile_n=96, stages=6, wg_rows=128), Sm90Config(tile_n=96, stages=6)
    assert (one.consumers, one.threads, two.consumers, two.threads) == (1, 256, 2, 384)
    assert one.epi_bytes() * 2 == two.epi_bytes() == 2 * 4 * 64 * 32 * 2
    assert Sm90Config(tile_n=96, stages=7, wg_rows=128).smem_bytes() == 7 * 28672 + 16384 + 2 * 7 * 8 + 1024
    with pytest.raises(ValueError, match="shared memory"):
        Sm90Config(tile_n=96, stages=7)
    assert one.name == "128x96 c2x1 m8 s6 w128" and one.kernel_key != two.kernel_key
    # pingpong: two such warpgroups, each with its own ring of epilogue buffers
    pp = Sm90Config(tile_n=96, stages=6, wg_rows=128, pingpong=True)
    assert (pp.consumers, pp.threads, pp.epi_bytes()) == (2, 384, two.epi_bytes())
    # warpgroups computing one tile (and reading each ring stage): both of two, the one, one of the ping-pong pair
    assert (two.tile_warpgroups, one.tile_warpgroups, pp.tile_warpgroups) == (2, 1, 1)
    assert pp.name == "128x96 c2x1 m8 s6 w128 pp"


def test_kernel_key_ignores_the_number_of_splits():
    # Splits are a run-time argument: one compiled kernel serves every count above 1.
    a, b = Sm90Config(splits=3), Sm90Config(splits=7)
    assert a.kernel_key == b.kernel_key != Sm90Config().kernel_key


def test_split_ranges_by_hand():
    assert split_ranges(10, 4) == [(0, 3), (3, 3), (6, 3), (9, 1)]
    with pytest.raises(ValueError, match=r"leaves slices of 10 k-blocks empty.*effective_splits\(10, 6\) = 5"):
        split_ranges(10, 6)  # 6 slices of ceil(10/6) = 2 leave the last empty ...
    assert effective_splits(10, 6) == 5  # ... so the kernel is given 5
    assert effective_splits(3, 16) == 3


@pytest.mark.parametrize("k_tiles", range(1, 41))
def test_effective_splits_never_leave_a_slice_empty(k_tiles):
    for s in range(1, 17):
        ranges = split_ranges(k_tiles, effective_splits(k_tiles, s))
        assert all(cnt >= 1 for _, cnt in ranges)
        assert [f for f, _ in ranges] == [sum(c for _, c in ranges[:i]) for i in range(len(ranges))]
        assert sum(c for _, c in ranges) == k_tiles


def test_sm100_config_fits():
    assert Sm100Config(block_n=256, ab_stages=6).check_fits().smem_bytes <= hardware.SMEM_PER_BLOCK
    with pytest.raises(ValueError, match="shared memory"):
        Sm100Config(block_n=256, ab_stages=7).check_fits()


# ---------------------------------------------------------------- the heuristic's model


def test_l2_term_by_hand():
    # 2048 x 2112 x 7168 on 128 x 144 tiles, cluster 2 x 1: 16 x 15 tiles, 112 k-blocks, and per k-block
    # each CTA reads 128 rows of A' and half of B''s 144 (the peer multicasts the other half), 128 B a row.
    p = GemmProblem(2048, 2112, 7168)
    cfg = h.make_config(p, 128, 144)
    assert cfg.cluster == (2, 1)
    c = h.predict(p, cfg)
    assert c.l2_us == pytest.approx(16 * 15 * 112 * 128 * (128 + 72) / 7e12 * 1e6)
    assert c.time_us == pytest.approx(max(c.waves * c.unit_us, c.hbm_us, c.l2_us))
    assert c.units == 8 * 15 and c.waves == 2


def test_a_partial_last_wave_pays_its_own_share_of_the_bytes():
    # 96 x 10240 x 8192 swapped: 64-row weight tiles give 160 units (a wave of 132, then 28), 128-row tiles 80.
    # A full wave moves 132/160 of the bytes at HBM speed; the last 28 units move theirs at their own pace.
    p = GemmProblem(96, 10240, 8192)
    small = h.predict(p, h.make_config(p, 64, 96, swap=True))
    big = h.predict(p, h.make_config(p, 128, 96, swap=True))
    assert (small.units, small.waves, big.units, big.waves) == (160, 2, 80, 1)
    assert small.unit_us < small.hbm_us * 132 / 160  # the full wave is bound by HBM ...
    assert small.time_us == pytest.approx(small.hbm_us * 132 / 160 + max(small.unit_us, small.hbm_us * 28 / 160))
    assert big.time_us == pytest.approx(max(big.unit_us, big.hbm_us, big.l2_us))
    assert big.time_us < small.time_us and h.choose(p) == big.config  # measured: 64.6 us against 75.6 (H100)


def test_split_k_pays_its_hand_offs_tail_and_workspace():
    p = GemmProblem(64, 576, 7168)
    one = h.predict(p, h.make_config(p, 64, 64, swap=True))
    eight = h.predict(p, h.make_config(p, 64, 64, swap=True, splits=8))
    assert one.extra_us == 0 and one.units == 9
    m = h.MODEL
    # A 64 x 64 FP32 partial tile is 16 KiB: every unit stores one and hands off, the last reducer reads 7.
    tile_us = 4 * 64 * 64 / (m.splitk_sm_gbps * 1e9) * 1e6
    assert h.splitk_costs(eight.config) == pytest.approx((tile_us + m.splitk_sync_us, 7 * tile_us))
    assert eight.units == 72 and eight.waves == 1
    # one wave's hand-off + tail, and the launch's fixed cost
    assert eight.extra_us == pytest.approx(tile_us + m.splitk_sync_us + 7 * tile_us + m.splitk_fixed_64_us)
    assert eight.unit_us == pytest.approx((one.unit_us - m.epilogue_us) / 8 + m.epilogue_us + tile_us + m.splitk_sync_us)
    # The workspace, 9 tiles x 8 slices x 16 KiB, is written back to HBM once; through L2 it is written and 7/8 read.
    ws = 9 * 8 * 4 * 64 * 64
    bw = m.hbm_tbps * 1e12 * m.hbm_efficiency
    assert eight.hbm_us - one.hbm_us == pytest.approx(ws / bw * 1e6)
    assert eight.l2_us - one.l2_us == pytest.approx(ws * 15 / 8 / (m.l2_tbps * 1e12) * 1e6)
    # One wave, bound by its units (the HBM floor is lower): the wave, then the tail, then the launch's fixed cost.
    assert eight.time_us == pytest.approx(max(eight.unit_us, eight.hbm_us, eight.l2_us) + 7 * tile_us
                                          + m.splitk_fixed_64_us)
    # a 64-row tile's launch costs less than a taller one's (refitted after the grouped reducer; H200 split sweep)
    assert 0 < m.splitk_fixed_64_us < m.splitk_fixed_us and one.time_us == pytest.approx(max(one.unit_us, one.hbm_us, one.l2_us))
    # Two waves: each ends with its reducers' reads.
    big = GemmProblem(64, 1280, 7168)  # 20 tiles x 8 slices = 160 units on 132 SMs
    two = h.predict(big, h.make_config(big, 64, 64, swap=True, splits=8))
    assert two.waves == 2 and two.extra_us == pytest.approx(2 * (tile_us + m.splitk_sync_us + 7 * tile_us)
                                                            + m.splitk_fixed_64_us)


def test_the_model_prices_whole_waves_then_the_split_tail():
    # 200 x 37888 x 3584 swapped on 128 x 200 tiles: 296 tiles on 132 SMs. Unsplit, a third wave runs 32 whole
    # tiles on 132 SMs; split in 3, two waves of whole tiles, then 96 slices of 19 k-blocks (of 56) in one wave.
    p = GemmProblem(200, 37888, 3584)
    one = h.predict(p, h.make_config(p, 128, 200, swap=True))
    hy = h.predict(p, h.make_config(p, 128, 200, swap=True, splits=3))
    m = h.MODEL
    assert (one.units, one.waves, one.dp_tiles) == (296, 3, 0) and (hy.units, hy.waves, hy.dp_tiles) == (360, 3, 264)
    assert hy.whole_us == one.whole_us == one.unit_us
    publish, tail = h.splitk_costs(hy.config)
    assert hy.unit_us == pytest.approx((one.unit_us - m.epilogue_us) * 19 / 56 + m.epilogue_us + publish)
    # Only the tail pays split-K: one wave of hand-offs and reads, the fixed cost, its 32 tiles' workspace.
    assert hy.extra_us == pytest.approx(publish + tail + m.splitk_fixed_us)
    ws = 4 * 32 * 3 * 128 * 200
    assert hy.hbm_us - one.hbm_us == pytest.approx(ws / (m.hbm_tbps * 1e12 * m.hbm_efficiency) * 1e6)
    assert hy.l2_us - one.l2_us == pytest.approx(ws * 5 / 3 / (m.l2_tbps * 1e12) * 1e6)

    def wave(c, count, time, of_tile):  # a wave at its units' pace or its share of the HBM time
        return max(time, c.hbm_us * count * of_tile / 296)

    assert one.time_us == pytest.approx(max(2 * wave(one, 132, one.unit_us, 1) + wave(one, 32, one.unit_us, 1),
                                            one.l2_us))
    assert hy.time_us == pytest.approx(max(2 * wave(hy, 132, hy.whole_us, 1) + wave(hy, 96, hy.unit_us, 1 / 3),
                                           hy.l2_us) + tail + m.splitk_fixed_us)
    assert hy.time_us < one.time_us
    best_128 = min((c for c in h.candidates(p) if (c.config.tile_m, c.config.swap_ab) == (128, True)),
                   key=lambda c: c.time_us)
    assert best_128.config == hy.config
    assert any("(264 whole)" in line for line in h.explain(p, top=12).splitlines()[1:])
    # the pick itself is two 104-wide token tiles on 192-row weight tiles, the weight multicast to both (the H200 timed
    # it at 90.6 us against 95.1 for the 128 x 208 split in 4 it replaced: gemm_family_token8.json)
    c = h.choose(p)
    assert (c.tile_m, c.tile_n, c.swap_ab, c.cluster, c.splits) == (192, 104, True, (1, 2), 1)


def test_candidates_split_a_tail_into_at_most_one_wave():
    def splits(p, tile_m, tile_n, swap):
        return {c.config.splits for c in h.candidates(p) if (c.config.tile_m, c.config.tile_n,
                                                             c.config.swap_ab) == (tile_m, tile_n, swap)}

    # 32 tail tiles: up to 4 slices fit 132 SMs (5 would be 160 units, a second partial wave)
    assert splits(GemmProblem(200, 37888, 3584), 128, 200, True) == {1, 2, 3, 4}
    # 264 tiles are two whole waves: nothing to split
    assert splits(GemmProblem(200, 33792, 3584), 128, 200, True) == {1}
    # a grid of one wave splits every tile, in as many slices as it likes (9 tiles x 16 is more than one wave)
    assert 16 in splits(GemmProblem(64, 576, 7168), 64, 64, True)


@pytest.mark.parametrize("shape,tile_n,stages", [((8192, 8192, 8192), 256, 4), ((4096, 4096, 4096), 256, 4)])
def test_large_shapes_keep_chapter_07_choices(shape, tile_n, stages):
    c = h.choose(GemmProblem(*shape))
    assert (c.tile_m, c.tile_n, c.stages, c.cluster, c.swap_ab, c.splits) == (128, tile_n, stages, (2, 1), False, 1)


def test_split_k_in_one_launch_keeps_4096_576_7168_on_its_measured_tile():
    # Chapter 07 runs 128 x 144 tiles here (64 pairs for 66: one wave), bound by L2 in the model: 128 tiles x 112
    # k-blocks x 64 x 2 x (128 + 144 / 2) bytes = 367 MB at 7 TB/s = 52.4 us. 192 x 192 tiles split in 2 also fill
    # one wave (33 pairs x 2 slices) and move 66 x 112 x 64 x 2 x (192 + 96) = 272.5 MB of operands plus 1.5x the
    # 19.5 MB workspace through L2: fewer bytes. With split-K's first, unfitted costs the model took them; the H100
    # then timed 57.9 us for them against 50.2 for 128 x 144 (results/nvidia-h100-80gb-hbm3/splitk_gpu.json), and the
    # refitted launch cost (splitk_fixed_us) keeps the measured winner.
    p = GemmProblem(4096, 576, 7168)
    old = h.make_config(p, 128, 144)
    split = h.make_config(p, 192, 192, cluster=(2, 1), splits=2)
    assert old.stages == 6 and h.predict(p, old).l2_us == pytest.approx(128 * 112 * 64 * 2 * 200 / 7e12 * 1e6)
    ws = 4 * 66 * 2 * 192 * 192
    assert h.predict(p, split).l2_us == pytest.approx((66 * 112 * 64 * 2 * 288 + 1.5 * ws) / 7e12 * 1e6)
    assert h.predict(p, split).units == 66 and h.predict(p, split).l2_us < h.predict(p, old).l2_us
    new = h.choose(p)
    assert (new.tile_m, new.tile_n, new.cluster, new.splits) == (128, 144, (2, 1), 1)
    assert h.predict(p, split).time_us > h.predict(p, old).time_us


def test_tall_tiles_where_they_were_measured_faster():
    # benchmarks/gemm_family.py tall (H100): 192 x 176 in pairs along N 1.027x faster than 128 x 176 at
    # 4096 x 2112 x 7168; 192 x 192 pairs along M 1.168x at 384 x 37888 x 3584 (two 192-row tiles: no padding)
    c = h.choose(GemmProblem(4096, 2112, 7168))
    assert (c.tile_m, c.tile_n, c.cluster, c.epi_stages) == (192, 176, (1, 2), 2)
    c = h.choose(GemmProblem(384, 37888, 3584))
    assert (c.tile_m, c.tile_n, c.cluster) == (192, 192, (2, 1))
    # ... and not where they lost: 0.938x at 4096 x 4096 x 4096, which the penalty keeps them out of (on 20 of the
    # 21 measured shapes whose choice it changes, the 192-row tile had been slower)
    assert h.choose(GemmProblem(4096, 4096, 4096)).tile_m == 128
    free = h.candidates(GemmProblem(4096, 4096, 4096), model=replace(h.MODEL, tall_tile_penalty=1.0))[0]
    assert free.config.tile_m == 192


def test_tall_tiles_fit_the_register_file():
    assert Sm90Config(tile_m=192, tile_n=192, stages=4, epi_stages=2).threads == 512
    with pytest.raises(ValueError, match="tile_n must be at most 192 with tile_m=192"):
        Sm90Config(tile_m=192, tile_n=208, stages=3, epi_n=16, epi_stages=1)
    with pytest.raises(ValueError, match="grouped kernel runs 64- or 128-row tiles"):
        from gemmlab.family.configs import check_grouped_config
        check_grouped_config(Sm90Config(tile_m=192, tile_n=128, stages=4, cluster=(1, 1), epi_stages=2))


def test_small_m_is_swapped_and_covered_by_one_tile():
    for m in (1, 17, 64, 100, 128):
        c = h.choose(GemmProblem(m, 2112, 7168))
        assert c.swap_ab and c.tile_n == max(16, -(-m // 8) * 8) and c.cluster == (1, 1)  # WGMMA's N steps by 8


def test_few_tiles_split_k():
    c = h.choose(GemmProblem(64, 576, 7168))  # 9 tiles of 64 weight rows: most SMs idle without it
    assert c.swap_ab and c.split_k and c.splits >= 4
    assert not h.choose(GemmProblem(4096, 4096, 4096)).split_k


def test_row_major_b_tiles_are_whole_swizzle_atoms():
    for m in (512, 4096, 8192):
        c = h.choose(GemmProblem(m, 2112, 7168, b_major="n"))
        assert c.swap_ab or c.tile_n % 64 == 0


def test_candidates_sorted_and_explained():
    p = GemmProblem(1000, 1032, 520)
    cands = h.candidates(p)
    times = [round(c.time_us, 6) for c in cands]
    assert times[0] == min(times)
    text = h.explain(p)
    assert "<- chosen" in text and cands[0].config.name in text.splitlines()[1]
    with pytest.raises(TypeError, match="problem must be a GemmProblem"):
        h.candidates((1000, 1032, 520))


def test_the_wide_family_covers_other_models_off_powers_of_two():
    from gemmlab.measure.gemm_family import LLM_NK, WIDE_MS, wide_cases

    cases = wide_cases()
    assert len(cases) == len(LLM_NK) * len(WIDE_MS) and {c.group for c in cases} == set(LLM_NK)
    assert sum(m & (m - 1) != 0 for m in WIDE_MS) >= len(WIDE_MS) - 1  # all but one not a power of two
    assert 384 in WIDE_MS and all(n % 8 == 0 and k % 8 == 0 for n, k in LLM_NK.values())


def test_weakest_wide_reads_the_stored_run(tmp_path, monkeypatch):
    import json

    from gemmlab.measure import bench
    from gemmlab.measure.gemm_family import weakest_wide

    monkeypatch.setattr(bench, "RESULTS_DIR", tmp_path)
    assert weakest_wide("NVIDIA H100 80GB HBM3") is None
    rows = [{"m": m, "n": 64, "k": 64, "ratio_public": r} for m, r in ((96, 1.0), (384, 0.6), (640, 0.8))]
    (tmp_path / "nvidia-h100-80gb-hbm3").mkdir()
    (tmp_path / "nvidia-h100-80gb-hbm3" / "gemm_family_wide.json").write_text(json.dumps({"rows": rows}))
    assert weakest_wide("NVIDIA H100 80GB HBM3", 2) == [(384, 64, 64), (640, 64, 64)]


def test_weakest_rows_merge_runs_one_row_a_problem(tmp_path, monkeypatch):
    import json

    from gemmlab.measure import bench
    from gemmlab.measure.gemm_family import weakest_rows

    monkeypatch.setattr(bench, "RESULTS_DIR", tmp_path)
    d = tmp_path / "nvidia-h200"
    d.mkdir()
    fam = [{"m": 64, "n": 64, "k": 64, "ratio_prepared": 0.7}, {"m": 128, "n": 64, "k": 64, "ratio_prepared": 0.9},
           {"m": 64, "n": 64, "k": 64, "dtype": "float16", "ratio_prepared": 0.95}]
    wide = [{"m": 64, "n": 64, "k": 64, "ratio_prepared": 0.8}, {"m": 200, "n": 64, "k": 64, "ratio_prepared": 0.85}]
    (d / "gemm_family.json").write_text(json.dumps({"rows": fam}))
    (d / "gemm_family_wide.json").write_text(json.dumps({"rows": wide}))
    got = weakest_rows("NVIDIA H200", 3, ("gemm_family", "gemm_family_wide"), "ratio_prepared")
    # 64 x 64 x 64 BF16 is in both runs: its weakest row only; the FP16 one is another problem, past the count
    assert [(r["m"], r["ratio_prepared"]) for r in got] == [(64, 0.7), (200, 0.85), (128, 0.9)]
    assert weakest_rows("NVIDIA H200", 3, ("gemm_family_sweep",)) is None


def test_every_family_choice_is_valid():
    from gemmlab.measure.gemm_family import wide_cases

    for case in family_cases() + wide_cases():
        _assert_valid_choice(GemmProblem(case.m, case.n, case.k, case.dtype, case.dtype, case.b_major))


def test_every_m_from_64_to_2048_in_steps_of_32_gets_a_valid_choice():
    # the M grid of the dense issue, on four layers: a square one, a Qwen QKV, and DeepSeek-V3's two narrow ones
    for n, k in ((4096, 4096), (4608, 3584), (2112, 7168), (576, 7168)):
        for m in range(64, 2049, 32):
            _assert_valid_choice(GemmProblem(m, n, k))


def _assert_valid_choice(p):
    """The pick fits in shared memory, its splits are what the kernel runs, its clusters and token tiles follow the
    rules of the heuristic, and a split-K workspace stays under 2 GiB."""
    c = h.choose(p, 132)
    assert c.smem_bytes() <= hardware.SMEM_PER_BLOCK and c.tile_n % c.epi_n == 0
    kt = -(-p.k // 64)
    assert c.splits == effective_splits(kt, c.splits)
    mt, nt = c.tiles(p.m, p.n)
    if c.swap_ab and nt == 1:
        assert c.cluster == (1, 1)  # one token tile: nothing to pair
    if c.swap_ab and c.cluster != (1, 1):  # several token tiles: a pair only along an even count
        assert (mt if c.cluster[0] == 2 else nt) % 2 == 0
    if c.swap_ab and nt > 1:  # several token tiles: each at least SWAP_MIN_TOKEN_TILE wide; a small batch in two
        assert p.m <= h.SWAP_TILED_MAX_M and c.tile_n >= h.SWAP_MIN_TOKEN_TILE
        assert p.m > h.SWAP_MAX_M or (nt == 2 and c.tile_m != 128)
    if c.swap_ab and c.tile_m == 192:
        assert nt > 1  # 192-row weight tiles only for several token tiles
    assert c.tile_n % 16 == 0 or c.swap_ab  # a tile 8 past a multiple of 16 is a token tile
    if c.split_k:
        assert 4 * c.workspace_floats(p.m, p.n) < 2**31


# ---------------------------------------------------------------- plan and api wiring (no GPU: compile is faked)


@pytest.fixture
def fake_machine(monkeypatch):
    """A machine of the given tier whose 'compiled kernel' records its calls."""
    calls = []

    def use(tier):
        monkeypatch.setattr(tiers, "detect_tier", lambda: tier)
        monkeypatch.setattr(plan, "compiled_kernel", lambda problem, cfg, arch: lambda *args: calls.append(args))
        monkeypatch.setattr(api, "check_devices", lambda *t: None)
        monkeypatch.setattr(hardware, "sm_count", lambda device=None: 132 if tier == "sm90" else 148)
        monkeypatch.setattr(api, "_PLANS", {})
        monkeypatch.setattr(api, "_BY_PROBLEM", {})
        return calls
    return use


def test_gemm_on_sm90_binds_tensors_and_grid(fake_machine):
    calls = fake_machine("sm90")
    a, b = _ab(4096, 4096, 4096)
    out = torch.empty(4096, 4096, dtype=BF)
    assert gemmlab.gemm(a, b, out) is out
    (ta, tb, tout, max_clusters), = calls
    assert ta is a and tb is b and tout is out and max_clusters == 66  # 132 SMs in clusters of 2
    p, = api.plans()
    assert isinstance(p.config, Sm90Config) and p.arch == "sm90"
    gemmlab.gemm(a, b, out)  # same key: no new plan
    assert len(api.plans()) == 1 and len(calls) == 2


def test_gemm_on_sm90_split_k_passes_a_workspace(fake_machine):
    calls = fake_machine("sm90")
    a, b = _ab(64, 576, 7168)
    out = gemmlab.gemm(a, b)
    assert out.shape == (64, 576) and out.dtype == BF
    (_, _, _, ws, counters, splits, dp_tiles, max_clusters), = calls
    cfg = api.plans()[0].config
    assert splits == cfg.splits > 1 and ws.dtype == torch.float32 and counters.dtype == torch.int32
    # flat: a partial tile per CTA tile and slice (9 swapped 64 x 64 tiles, one wave: all split); a zeroed counter
    # per CTA tile
    tiles = cfg.split_tiles(64, 576)
    assert tiles == 9 and dp_tiles == 0
    assert ws.shape == (tiles * splits * cfg.tile_m * cfg.tile_n,) and counters.shape == (tiles,)
    assert not counters.any() and max_clusters == 132
    gemmlab.gemm(a, b)  # the plan's counters and workspace again (one set a stream; the kernel zeroes the counters)
    assert calls[1][4] is counters and calls[1][3] is ws


def test_split_buffers_keep_one_workspace_and_counter_set_a_stream():
    sets = plan.SplitBuffers(9, 9 * 8 * 64 * 64)
    ws, counters = sets.buffers(torch.device("cpu"))
    assert ws.shape == (9 * 8 * 64 * 64,) and ws.dtype == torch.float32
    assert counters.shape == (9,) and counters.dtype == torch.int32 and not counters.any()
    again = sets.buffers(torch.device("cpu"))
    assert again[0] is ws and again[1] is counters
    assert list(sets.by_stream.values()) == [counters] and list(sets.workspaces.values()) == [ws]
    with pytest.raises(ValueError, match="^tiles must be >= 1; got 0"):
        plan.SplitBuffers(0, 1)
    with pytest.raises(ValueError, match="^workspace_floats must be >= 1; got 0"):
        plan.SplitBuffers(1, 0)  # split_launch asks for at least one float, so that no tensor is empty


def test_split_launch_sizes_the_tail_by_hand():
    p = GemmProblem(200, 37888, 3584)
    cfg = h.make_config(p, 128, 208, swap=True, splits=3)
    # 296 weight tiles of 128 rows on 132 SMs: two waves of whole tiles, then 32 tiles in 3 slices (56 k-blocks:
    # 19, 19, 18); the workspace and the counters hold those 32 only
    assert plan.split_launch(p, cfg, 132) == (3, 264, 32 * 3 * 128 * 208, 32)
    assert plan.split_launch(p, cfg, 296) == (3, 0, 296 * 3 * 128 * 208, 296)  # one wave: every tile split
    assert plan.split_launch(p, cfg, 148) == (3, 296, 1, 1)  # whole waves: nothing split, and no empty tensor
    assert plan.split_launch(p, cfg, np.int64(132)) == plan.split_launch(p, cfg, 132)
    pair = Sm90Config(tile_m=64, tile_n=64, stages=8, cluster=(2, 1), splits=3)
    q = GemmProblem(540, 64, 264)  # 9 M tiles in 5 pairs on 2 clusters: 4 whole, the 5th pair's 2 CTAs split
    assert plan.split_launch(q, pair, 2) == (3, 4, 2 * 3 * 64 * 64, 2)
    with pytest.raises(ValueError, match="^max_clusters must be >= 1; got 0"):
        plan.split_launch(p, cfg, 0)


def test_a_plan_on_a_multi_wave_grid_splits_the_tail(fake_machine):
    calls = fake_machine("sm90")
    p = GemmProblem(200, 37888, 3584)
    cfg = h.make_config(p, 128, 208, swap=True, splits=3)
    run = plan.make_plan(p, None, cfg)
    out = torch.empty(0, dtype=BF)  # the recorded "kernel" reads nothing but the arguments
    run(None, None, out)
    (_, _, _, ws, counters, splits, dp_tiles, max_clusters), = calls
    assert (splits, dp_tiles, max_clusters) == (3, 264, 132) and run.launch.dp_tiles == 264
    assert ws.shape == (32 * 3 * 128 * 208,) and counters.shape == (32,) and not counters.any()


def test_gemm_on_sm100_dispatches_to_chapter_10(fake_machine):
    calls = fake_machine("sm100")
    a, b = _ab(256, 512, 512)
    gemmlab.gemm(a, b)
    assert isinstance(api.plans()[0].config, Sm100Config) and len(calls) == 1
    a1 = torch.zeros(1, 64, dtype=BF)
    gemmlab.gemm(a1, _ab(1, 512, 64)[1])  # M = 1 runs padded to two rows on the static-shape kernel
    assert calls[-1][0].shape == (2, 64)


def test_gemm_checks_arguments_then_tier(monkeypatch):
    monkeypatch.setattr(tiers, "detect_tier", lambda: "cpu")
    monkeypatch.setattr(api, "_PLANS", {})
    with pytest.raises(gemmlab.TierError, match="gemmlab.gemm needs tier sm90 or sm100"):
        gemmlab.gemm(*_ab(24, 16, 40))
    with pytest.raises(ValueError, match="K x N"):  # arguments are checked before any tier question
        gemmlab.gemm(_ab(24, 16, 40)[0], torch.zeros(16, 40, dtype=BF))


def test_alignment_is_checked_on_every_call(fake_machine):
    fake_machine("sm90")
    base = torch.zeros(64 * 40 + 8, dtype=BF)
    b = _ab(64, 16, 40)[1]
    gemmlab.gemm(base[:64 * 40].view(64, 40), b)  # makes and caches the plan
    with pytest.raises(ValueError, match="a must start at a 16-byte aligned address"):
        gemmlab.gemm(base[1:64 * 40 + 1].view(64, 40), b)  # same key, misaligned pointer


def test_config_must_match_the_machine(fake_machine):
    fake_machine("sm90")
    with pytest.raises(TypeError, match="config must be an Sm90Config"):
        plan.make_plan(GemmProblem(64, 64, 64), None, Sm100Config())
    with pytest.raises(ValueError, match="config is for bfloat16"):
        plan.make_plan(GemmProblem(64, 64, 64, "float16", "float16"), None, Sm90Config())
    with pytest.raises(ValueError, match="out must be given"):
        plan.prepare(*_ab(64, 64, 64), None)


def test_hopper_kernels_without_tvm_ffi_name_the_package(monkeypatch):
    """apache-tvm-ffi missing (simulated: the module blocked): the Hopper GEMM and the grouped GEMM, which have no
    call path without it, raise an ImportError naming the package instead of failing inside the DSL."""
    import sys

    from gemmlab.family import plan
    from gemmlab.family.configs import SMALL, Sm90Config
    from gemmlab.family.heuristic_grouped import schedule
    from gemmlab.family.problem import GemmProblem, GroupedProblem

    monkeypatch.setitem(sys.modules, "tvm_ffi", None)
    monkeypatch.setattr(plan, "_KERNELS", {})  # the family's one compile cache, grouped kernels included
    plan._have_tvm_ffi.cache_clear()
    try:
        assert plan._have_tvm_ffi() is False
        with pytest.raises(ImportError, match="apache-tvm-ffi"):
            plan.compiled_kernel(GemmProblem(256, 256, 256), Sm90Config(), "sm90")
        sched = schedule(SMALL, GroupedProblem("ragged", 64, 8, 256, 256))
        with pytest.raises(ImportError, match="apache-tvm-ffi"):
            plan.grouped_kernel(SMALL, "ragged", "k", sched)
    finally:
        plan._have_tvm_ffi.cache_clear()


@pytest.mark.sm90
def test_gemm_without_tvm_ffi_raises_a_clear_error_on_the_gpu(monkeypatch):
    import sys

    import torch

    import gemmlab
    from gemmlab.family import plan

    monkeypatch.setitem(sys.modules, "tvm_ffi", None)
    monkeypatch.setattr(plan, "_KERNELS", {})
    for cache in ("_PLANS", "_BY_PROBLEM"):  # no plan made earlier in the session may answer for it
        monkeypatch.setattr(api, cache, {})
    plan._have_tvm_ffi.cache_clear()
    try:
        a = torch.randn(128, 256, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(256, 192, device="cuda", dtype=torch.bfloat16)
        with pytest.raises(ImportError, match="apache-tvm-ffi"):
            gemmlab.gemm(a, b)
    finally:
        plan._have_tvm_ffi.cache_clear()


@pytest.mark.parametrize("cfg", [Sm90Config(), Sm90Config(tile_m=64, tile_n=96, stages=8, splits=5),
                                 Sm90Config(tile_m=128, tile_n=128, stages=6, cluster=(1, 1), swap_ab=True, splits=3),
                                 Sm90Config(cluster=(1, 2), raster="n", group=4),
                                 Sm90Config(tile_n=144, stages=6, epi_n=16, wg_rows=128, swap_ab=True, splits=2),
                                 Sm90Config(tile_n=192, stages=4, wg_rows=128, pingpong=True)])
def test_a_config_name_reads_back_into_the_config(cfg):
    """The stored results name their configs (Sm90Config.name); parse_name gives every field the name holds."""
    fields = Sm90Config.parse_name(cfg.name)
    rest = dict(tile_k=cfg.tile_k, epi_n=cfg.epi_n, epi_stages=cfg.epi_stages, dtype=cfg.dtype, out_dtype=cfg.out_dtype)
    assert Sm90Config(**fields, **rest) == cfg
    with pytest.raises(ValueError, match="name must look like"):
        Sm90Config.parse_name("128x256 c2x1 m8 s4 twice")


def test_model_regret_by_hand():
    from gemmlab.measure.gemm_family import model_regret

    # 96 x 10240 x 8192: the model ranks 128-row swapped tiles first (one wave) over 64-row ones (1.2 waves)
    p = GemmProblem(96, 10240, 8192)
    big, small = h.make_config(p, 128, 96, swap=True), h.make_config(p, 64, 96, swap=True)
    assert h.predict(p, big).time_us < h.predict(p, small).time_us
    row = dict(m=96, n=10240, k=8192)
    doc = {"rows": [dict(row, config=big.name, prepared_us=70.0), dict(row, config=small.name, prepared_us=56.0)]}
    got = model_regret(doc)
    assert got["shapes"] == 1 and got["geomean"] == pytest.approx(70.0 / 56.0) and got["over_5pct"] == 1
    assert got["worst"][1:] == ((96, 10240, 8192), big.name, small.name)
    doc["rows"][0]["prepared_us"] = 50.0  # the pick is the fastest: no regret
    assert model_regret(doc)["geomean"] == pytest.approx(1.0) and model_regret(doc)["over_5pct"] == 0
    # a variant that failed in its run (stored with its error, no timing) is neither pick nor best
    failed = h.make_config(p, 64, 96, swap=True, splits=3)
    doc["rows"].append(dict(row, config=failed.name, error="ValueError: ..."))
    assert model_regret(doc)["geomean"] == pytest.approx(1.0) and model_regret(doc)["shapes"] == 1
    doc["rows"].pop()
    # a split-K row of a run from before split-K ran in one launch is neither pick nor best, however fast it was
    split = h.make_config(p, 128, 96, swap=True, splits=2)
    doc["rows"].append(dict(row, config=split.name, prepared_us=10.0))
    doc["date"] = "2026-11-26 11:12:10 UTC"
    assert model_regret(doc)["geomean"] == pytest.approx(1.0)
    doc["date"] = "2026-11-28 09:00:00 UTC"  # a later run's split rows count: the split row is now the best
    pick_us = 10.0 if h.predict(p, split).time_us < h.predict(p, big).time_us else 50.0
    assert model_regret(doc)["geomean"] == pytest.approx(pick_us / 10.0)
    # a run is judged by the tile forms of its day: 200 tokens were a 208-wide token tile before TOKEN8_SINCE
    p, row = GemmProblem(200, 4096, 4096), dict(m=200, n=4096, k=4096)
    old = replace(h.make_config(p, 64, 200, swap=True), tile_n=208, epi_n=16)
    doc = {"date": "2026-11-28 09:00:00 UTC", "rows": [dict(row, config=old.name, prepared_us=18.8)]}
    assert model_regret(doc)["shapes"] == 1
    doc["date"] = "2026-12-03 09:00:00 UTC"  # today's forms round 200 to 200: no 208-wide tile to pick, no shape left
    with pytest.raises(ValueError, match="non-empty list"):
        model_regret(doc)


def test_model_regret_ranks_wide_clusters_and_skips_what_configs_refuse():
    """A stored sweep may time clusters of 4 and 8 CTAs (which the heuristic does not enumerate) and rings sized for
    an older epilogue (which today's Sm90Config refuses): the first are ranked, the second left out."""
    from gemmlab.measure.gemm_family import model_regret

    p, row = GemmProblem(1024, 576, 7168), dict(m=1024, n=576, k=7168)
    wide = replace(h.make_config(p, 64, 96), cluster=(2, 2), stages=10)
    pair = h.make_config(p, 64, 96)
    assert h._cluster_preference(wide) == len(h.CLUSTERS) > h._cluster_preference(pair)
    doc = {"date": "2026-12-02 17:00:00 UTC",
           "rows": [dict(row, config=wide.name, prepared_us=21.4), dict(row, config=pair.name, prepared_us=22.1),
                    dict(row, config="128x96 c2x1 m8 s9", prepared_us=1.0)]}  # 9 stages of 128 x 96 do not fit
    with pytest.raises(ValueError, match="stages=9"):
        Sm90Config(**Sm90Config.parse_name("128x96 c2x1 m8 s9"))
    got = model_regret(doc)
    assert got["shapes"] == 1
    # the pick is whichever of the two the model ranks first; the 1 us row is neither pick nor best
    first = min((wide, pair), key=lambda c: h.rank_key(h.predict(p, c)))
    assert got["geomean"] == pytest.approx({wide: 1.0, pair: 22.1 / 21.4}[first])


def test_on_cluster_bands_along_the_dimension_with_more_cluster_tiles():
    """A config moved to a cluster the heuristic does not enumerate takes make_config's raster for its cluster grid,
    and a tile that does not cut into the cluster's parts is refused."""
    from gemmlab.measure.gemm_family import on_cluster

    p = GemmProblem(1024, 576, 7168)
    base = h.make_config(p, 64, 96)  # 16 x 6 tiles
    wide = on_cluster(base, (4, 2), 1024, 576)  # 4 x 3 cluster tiles: bands along M
    assert wide.cluster == (4, 2) and wide.raster == "m" and wide.tile_n == base.tile_n
    tall = on_cluster(base, (1, 4), 1024, 576)  # 16 x 2: bands along M
    assert tall.raster == "m"
    swapped = on_cluster(h.make_config(p, 64, 96, swap=True), (4, 1), 1024, 576)  # 9 x 11 tiles: 3 x 11 clusters
    assert swapped.raster == "n"
    assert on_cluster(wide, (2, 1), 1024, 576) == replace(base, cluster=(2, 1))  # make_config's own for a pair
    with pytest.raises(ValueError, match="cluster \\(4, 2\\)"):
        on_cluster(h.make_config(p, 64, 80), (4, 2), 1024, 576)  # 4 CTAs share a B' panel: tile_n 80 is no 4 x 8k


def test_cluster_tile_grid_keeps_one_wave_grids_per_cluster():
    """Every variant of the cluster-tile search runs in one wave of its cluster's persistent grid, at most a quarter
    of it idle or padding; each cluster gets at most two tile choices, each also with its deepest ring."""
    from gemmlab.measure.gemm_family import cluster_tile_grid

    p = GemmProblem(1024, 576, 7168)
    grid = cluster_tile_grid(p, h.MODEL)
    assert grid and len({c.config for c in grid}) == len(grid)
    for c in grid:
        cfg = c.config
        clusters = cfg.clusters_on(132)
        units = cfg.units(p.m, p.n, clusters)
        mt, nt = cfg.tiles(p.m, p.n)
        assert units <= clusters and units * cfg.cluster_size >= 0.75 * clusters * cfg.cluster_size
        assert mt * nt * cfg.splits >= 0.75 * units * cfg.cluster_size
        assert c.time_us == pytest.approx(h.predict(p, cfg).time_us)
    by_cluster = {}
    for c in grid:
        by_cluster.setdefault(c.config.cluster, set()).add((c.config.tile_m, c.config.tile_n, c.config.splits))
    assert all(len(v) <= 2 for v in by_cluster.values())
    # cuBLAS's form on this shape (64 x 96 tiles, all of K, clusters of 4): in the grid, with a ring deeper than 8
    assert any(c.config.tile_m == 64 and c.config.tile_n == 96 and not c.config.split_k and c.config.cluster_size == 4
               and c.config.stages > 8 for c in grid)


def test_split_pairs_time_split_against_whole():
    """The split sweep's variants: the model's best split one first, then its best whole one, then the best split one
    of each consumer count and of two slices, all within 1.3x of the model's best, no repeats; none where no
    near variant splits K."""
    from gemmlab.hardware import H200
    from gemmlab.measure.gemm_family import split_pairs

    p, model = GemmProblem(64, 4096, 7168), h.model_for(H200)
    picks = split_pairs(p, model)
    best = h.candidates(p, 132, model)[0].time_us
    assert picks[0].config.split_k and not picks[1].config.split_k
    assert len({c.config for c in picks}) == len(picks)
    assert all(c.time_us <= 1.3 * best for c in picks)
    assert any(c.config.splits == 2 for c in picks)
    assert split_pairs(GemmProblem(4096, 4096, 64), model) == []  # one k-block: nothing to split
    whole = h.candidates(p, 132, h.MODEL)[0]  # the H100's model prices every split variant above its whole tiles
    assert not whole.config.split_k and split_pairs(p, h.MODEL, near=1.0) == []  # none near enough


# ---------------------------------------------------------------- the first call's timing of the model's best few


def test_tune_top_reads_the_environment(monkeypatch):
    from gemmlab.family import tune

    monkeypatch.delenv("GEMMLAB_TUNE", raising=False)
    assert tune.tune_top() == tune.DEFAULT_TOP == 1  # off unless asked for (measured: it did not pay)
    monkeypatch.setenv("GEMMLAB_TUNE", " 4 ")
    assert tune.tune_top() == 4
    for bad, msg in (("two", "GEMMLAB_TUNE must be a whole number"), ("0", "GEMMLAB_TUNE must be"),
                     ("2.5", "GEMMLAB_TUNE must be a whole number"), ("17", "GEMMLAB_TUNE must be")):
        monkeypatch.setenv("GEMMLAB_TUNE", bad)
        with pytest.raises(ValueError, match=msg):
            tune.tune_top()


def test_tune_shortlist_and_pick_by_hand():
    from gemmlab.family import tune

    p = GemmProblem(512, 2112, 7168)
    cands = h.candidates(p, 132)
    short = tune.shortlist(cands, 4)
    assert short[0] == h.choose(p, 132) and len(short) == len(set(short)) == 4
    assert short == [c.config for c in cands[:4]]  # the model's order (its candidates are distinct configs)
    assert tune.shortlist(["x", "x", "y", "z"], 2) == ["x", "y"]  # repeats count once
    # the fastest wins, but one within 1 % of an earlier-ranked one does not displace it
    assert tune.pick_fastest([("a", 30.0), ("b", 29.8), ("c", 31.0)]) == "a"
    assert tune.pick_fastest([("a", 30.0), ("b", 29.6), ("c", 28.0)]) == "c"
    assert tune.pick_fastest([("a", 30.0), ("b", 25.0), ("c", 24.9)]) == "b"
    with pytest.raises(ValueError, match="timed must hold at least one"):
        tune.pick_fastest([])
    with pytest.raises(ValueError, match="top must be"):
        tune.shortlist(cands, 0)


def test_tune_times_each_candidate_once_per_problem(monkeypatch):
    from gemmlab.family import tune

    monkeypatch.setattr(tune, "_CHOICES", {})
    seen = []
    fake = {"a": 40.0, "b": 31.0, "c": 35.0}

    def time_us(cfg):
        seen.append(cfg)
        return fake[cfg]

    assert tune.choose_by_timing("k", ["a", "b", "c"], time_us) == "b"
    assert tune.choose_by_timing("k", ["a", "b", "c"], time_us) == "b" and seen == ["a", "b", "c"]  # kept
    assert tune.choices()["k"] == [("a", 40.0), ("b", 31.0), ("c", 35.0)]
    assert tune.choose_by_timing("one", ["a"], time_us) == "a" and len(seen) == 3  # nothing to compare: no launch


def test_plan_takes_the_timed_choice_on_the_callers_tensors(monkeypatch):
    """make_plan with the caller's tensors and GEMMLAB_TUNE=4: the model's best four are each launched (here: a fake
    clock that makes the third the fastest) and the plan runs that one; with CPU tensors, or GEMMLAB_TUNE=1 (the
    default), the model's pick."""
    from gemmlab.family import tune

    monkeypatch.setattr(tiers, "detect_tier", lambda: "sm90")
    monkeypatch.setattr(hardware, "sm_count", lambda device=None: 132)
    monkeypatch.setattr(plan, "compiled_kernel", lambda problem, cfg, arch: cfg)  # the "function" is its config
    monkeypatch.setattr(plan, "raw_function", lambda fn: fn)
    monkeypatch.setattr(plan, "_bind", lambda fn, problem, cfg, arch, sms: lambda a, b, out: launched.append(cfg))
    monkeypatch.setattr(tune, "_CHOICES", {})
    monkeypatch.setenv("GEMMLAB_TUNE", "4")
    p = GemmProblem(512, 2112, 7168)
    four = [c.config for c in h.candidates(p, 132)[:4]]
    clock = {cfg: 50.0 - 5 * (i == 2) for i, cfg in enumerate(four)}
    launched = []
    monkeypatch.setattr(tune, "time_launch", lambda launch, device: (launch(), clock[launched[-1]])[1])
    a, b = _ab(512, 2112, 7168)
    out = torch.empty(512, 2112, dtype=BF)
    assert plan._timed_choice(p, 132, None, (a, b, out)) == four[2]
    assert launched == four  # each candidate launched once on the caller's tensors
    assert plan._timed_choice(p, 132, None, (a, b, None)) == four[2] and len(launched) == 4  # kept per problem
    # CPU tensors (no GPU to time on), or timing turned off: the model's choice, nothing launched
    assert plan.make_plan(p, None, tensors=(a, b, out)).config == four[0] and len(launched) == 4
    monkeypatch.delenv("GEMMLAB_TUNE")
    assert plan.make_plan(p, None, tensors=(a, b, out)).config == four[0] and len(launched) == 4


# ---------------------------------------------------------------- a swapped batch in several token tiles


def test_swap_token_tiles_by_hand():
    # up to SWAP_MAX_M: the whole batch rounded up to 8 (WGMMA's N step), at least 16; and two tiles where each is at
    # least SWAP_MIN_TOKEN_TILE wide once rounded up (177 to 256 rows)
    assert h.swap_token_tiles(200) == (200, 104) and h.swap_token_tiles(100) == (104,)
    assert h.swap_token_tiles(64) == (64,) and h.swap_token_tiles(1) == (16,) and h.swap_token_tiles(17) == (24,)
    assert h.swap_token_tiles(177) == (184, 96) and h.swap_token_tiles(176) == (176,)
    # 384 rows: 2, 3, 4 tiles of 192, 128, 96 (5 tiles would be 80 wide: under SWAP_MIN_TOKEN_TILE)
    assert h.swap_token_tiles(384) == (192, 128, 96)
    # 640: 2 tiles of 320 are too wide for WGMMA; 3 .. 7 tiles of 216 (213.3 up to 8), 160, 128, 112 (106.7), 96 (91.4)
    assert h.swap_token_tiles(640) == (216, 160, 128, 112, 96)
    assert h.swap_token_tiles(1024) == (256, 208, 176, 152, 128)
    assert h.swap_token_tiles(1025) == ()  # above SWAP_TILED_MAX_M: not swapped
    # the forms before (token tiles rounded up to 16, no small batch cut): what benchmarks/gemm_family.py token8 times
    before = h.FORMS_BEFORE_TOKEN8
    assert h.swap_token_tiles(200, before) == (208,) and h.swap_token_tiles(640, before) == (224, 160, 128, 112, 96)
    with pytest.raises(TypeError, match="forms must be a Forms"):
        h.swap_token_tiles(200, (8, True, True))
    with pytest.raises(ValueError, match="token_step must be one of"):
        h.Forms(token_step=4)
    for bad, msg in ((dict(token_step=16.0), "token_step must be one of 8, 16; got float 16.0"),
                     (dict(tall_swap=1), "tall_swap must be one of False, True; got int 1")):
        with pytest.raises(TypeError, match=msg):
            h.Forms(**bad)
    f = h.Forms(token_step=np.int64(16), tall_swap=np.bool_(False), cut_small=torch.tensor(False))
    assert f == before and type(f.token_step) is int and type(f.cut_small) is bool  # numpy and torch scalars count
    assert h.swap_token_tiles(np.int64(384)) == h.swap_token_tiles(torch.tensor(384)) == (192, 128, 96)
    for bad, err, msg in ((0, ValueError, "m must be >= 1"), (384.0, TypeError, "m must be an int"),
                          (True, TypeError, "m must be an int")):
        with pytest.raises(err, match=msg):
            h.swap_token_tiles(bad)


def test_swapped_clusters_pair_only_an_even_count():
    assert h.clusters_for(True, 33, 1) == ((1, 1),)  # one token tile: nothing to pair
    assert set(h.clusters_for(True, 32, 4)) == {(2, 1), (1, 2), (1, 1)}
    assert set(h.clusters_for(True, 64, 3)) == {(2, 1), (1, 1)}  # three token tiles: no (1, 2)
    assert set(h.clusters_for(True, 13, 4)) == {(1, 2), (1, 1)}
    assert set(h.clusters_for(False, 3, 37)) == {(2, 1), (1, 2), (1, 1)}  # unswapped: padding is modelled instead
    with pytest.raises(ValueError, match="cluster must be one of"):
        h.make_config(GemmProblem(640, 8192, 28672), 128, 224, swap=True, cluster=(1, 2))


def test_mid_m_picks_the_measured_swapped_tiles():
    # H100, kernels alone (gemm_family_swap_tiled*.json): 384 x 4096 x 4096 on four 96-wide token tiles, weight
    # multicast along them, 24.0 us where the unswapped 128 x 112 pick took 26.3 (cuBLAS's own tile there is the same).
    c = h.choose(GemmProblem(384, 4096, 4096), 132)
    assert (c.tile_m, c.tile_n, c.swap_ab, c.cluster) == (128, 96, True, (1, 2))
    # 640 x 3584 x 18944: 128 x 160 swapped, 128.1 us against 154.4 for the unswapped pick
    c = h.choose(GemmProblem(640, 3584, 18944), 132)
    assert (c.tile_m, c.tile_n, c.swap_ab, c.cluster) == (128, 160, True, (1, 2))
    # three token tiles of 224 pair along the weight only
    for cand in h.candidates(GemmProblem(640, 8192, 28672), 132):
        if cand.config.swap_ab and cand.config.tile_n == 224:
            assert cand.config.cluster != (1, 2)
    # M <= SWAP_MAX_M: the whole batch in one token tile, or cut in two: at 200 x 4096 x 4096 two 104-wide ones on
    # 64-row weight tiles, paired along the token tiles (H200: 17.4 us against 18.8 for the 64 x 208 split in 2 it
    # replaced, gemm_family_token8.json); M > SWAP_TILED_MAX_M is never swapped
    c = h.choose(GemmProblem(200, 4096, 4096), 132)
    assert (c.tile_m, c.tile_n, c.swap_ab, c.cluster) == (64, 104, True, (1, 2))
    assert not any(c.config.swap_ab for c in h.candidates(GemmProblem(1536, 4096, 4096), 132))


def test_one_warpgroup_tiles_where_the_main_loop_binds():
    # H200, kernels alone, both forms in one run (gemm_family_w128_first.json): 512 x 4096 x 7168 on 128 x 128 swapped
    # tiles, one tile per CTA, 41.9 us with one consumer warpgroup against 44.1 with two
    p = GemmProblem(512, 4096, 7168)
    c = h.choose(p, 132)
    assert (c.tile_m, c.tile_n, c.swap_ab, c.wg_rows) == (128, 128, True, 128)
    # the model: the same tile's main loop wg128_gain faster, its epilogue twice as long
    one, two = (h.predict(p, replace(c, wg_rows=w), 132) for w in (128, 64))
    assert one.whole_us == pytest.approx((two.whole_us - h.MODEL.epilogue_us) / h.MODEL.wg128_gain
                                         + 2 * h.MODEL.epilogue_us)
    # where HBM binds (a decode batch on 128 x 96 swapped tiles) the two forms tie, and the tie goes to two warpgroups
    p = GemmProblem(96, 10240, 8192)
    d = h.choose(p, 132)
    assert (d.tile_m, d.tile_n, d.wg_rows) == (128, 96, 64)
    assert h.predict(p, replace(d, wg_rows=128, stages=7), 132).time_us == pytest.approx(h.predict(p, d, 132).time_us)
    assert h.wg_rows_for(128, 192) == (64, 128) and h.wg_rows_for(128, 208) == h.wg_rows_for(64, 128) == (64,)


def test_ties_take_one_warpgroup_for_unswapped_tiles_up_to_160_wide():
    # an unswapped grid of one tile per cluster: the L2 floor binds and the two forms tie; one warpgroup was faster
    # there on every 128 x 128 and 128 x 144 tile timed (H200, gemm_family_w128.json: 1024 x 2112 x 7168 46.7 us
    # against 47.9), so the tie goes to it; on 128 x 192 it lost (640 x 4608 x 3584: 32.8 against 32.1)
    model = h.model_for(hardware.H200)
    p = GemmProblem(1024, 2112, 7168)
    cands = h.candidates(p, 132, model)
    c = cands[0].config
    assert (c.tile_m, c.tile_n, c.swap_ab, c.wg_rows) == (128, 144, False, 128)
    other = next(x for x in cands if x.config == replace(c, wg_rows=64))
    assert other.time_us == pytest.approx(cands[0].time_us)  # the model ties them
    c = h.choose(GemmProblem(640, 4608, 3584), 132, model)
    assert (c.tile_m, c.tile_n, c.swap_ab, c.wg_rows) == (128, 192, False, 64)
    assert h._prefers_one_warpgroup(Sm90Config(tile_n=160, stages=5)) and not h._prefers_one_warpgroup(
        Sm90Config(tile_n=128, stages=6, swap_ab=True))


def test_forms_before_token8_are_the_previous_picks():
    # benchmarks/gemm_family.py token8 times these against today's: the forms before reproduce the picks the stored
    # runs of 2026-11-28 made (results/nvidia-h200/gemm_family_token8.json, "before")
    model = h.model_for(hardware.H200)
    for (m, n, k), before, now in (((200, 10240, 8192), "128x208 c1x1 m8 s4 swap split3", "192x104 c1x2 m8 s5 swap"),
                                   ((640, 37888, 3584), "128x160 c1x2 m8 s5 swap w128", "192x160 c1x2 m8 s4 swap"),
                                   ((100, 2120, 7168), "64x112 c1x1 m8 s8 swap split3", "64x104 c1x1 m8 s8 swap split3")):
        p = GemmProblem(m, n, k)
        assert h.candidates(p, 132, model, h.FORMS_BEFORE_TOKEN8)[0].config.name == before
        assert h.choose(p, 132, model).name == now
    with pytest.raises(TypeError, match="forms must be a Forms"):
        h.candidates(GemmProblem(200, 4096, 4096), 132, h.MODEL, "before")


def test_token8_summary_reads_a_stored_run():
    from gemmlab.measure import gemm_tables

    row = dict(m=200, n=4096, k=4096, label="200x4096x4096")
    doc = {"device": "NVIDIA H200", "date": "2026-12-02", "rows": [
        {**row, "which": "before", "config": "64x208 c1x1 m8 s6 swap split2", "prepared_us": 18.8},
        {**row, "which": "after", "config": "64x104 c1x2 m8 s8 swap", "prepared_us": 17.4},
        {**row, "label": "1x8x8", "which": "after", "config": "64x16 c1x1 m8 s8 swap", "error": "failed"}]}
    text = gemm_tables.token8_summary(doc)
    assert "1 shapes whose pick changed; the new pick faster on 1 (geometric mean 1.080x" in text
    assert "64x104 c1x2 m8 s8 swap" in text and "1x8x8" not in text  # a row without a timing is left out


def test_equal_swapped_variants_prefer_the_weight_multicast():
    p = GemmProblem(640, 4096, 4096)
    same = [c for c in h.candidates(p, 132) if (c.config.tile_m, c.config.tile_n, c.config.swap_ab, c.config.splits)
            == (128, 160, True, 1)]
    assert {c.config.cluster for c in same} == {(1, 2), (2, 1), (1, 1)}
    assert same[0].config.cluster == (1, 2)  # ranked first among the three
