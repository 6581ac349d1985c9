"""Split-K in one launch (gemmlab.splitk + the dense Hopper kernel): the protocol on the CPU, the kernel on the
emulator (poisoned outputs and workspace, counters reused across launches, units of one tile on different CTAs),
its PTX, and on an H100/H200 (tagged gpu + sm90, skipped elsewhere)."""
import itertools
from dataclasses import replace

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import numpy as np
import pytest
import torch
from cutlass import Int32

from gemmlab import splitk
from gemmlab.splitk import reduce_group
from gemmlab.compile import ptx_lines, ptx_opcodes
from gemmlab.emulator import sm90_cases as S
from gemmlab.family.configs import Sm90Config, effective_splits, hybrid_tiles, split_ranges
from gemmlab.family.plan import split_launch
from gemmlab.family.problem import GemmProblem
from gemmlab.kernels.gemm_sm90 import compile_gemm, unit_coords
from gemmlab.scheduler import TileScheduler

# ---------------------------------------------------------------- the protocol on the CPU


def test_fixup_model_reduces_once_in_split_order_whatever_the_arrival_order():
    # FP32 addition is not associative: ((1e8 + 1) - 1e8) is 0, (1e8 - 1e8) + 1 is 1. A reducer that added the
    # partials in arrival order would return either; split order returns 0 for every arrival order.
    parts = torch.tensor([[1e8], [1.0], [-1e8]])
    assert ((parts[0] + parts[1]) + parts[2]).item() == 0.0 and ((parts[0] + parts[2]) + parts[1]).item() == 1.0
    for order in itertools.permutations(range(3)):
        reducer, out, counter = splitk.fixup_model(parts, order)
        assert reducer == order[-1] and counter == 0  # the last to arrive reduces and resets the counter
        assert out.tolist() == [0.0]
    with pytest.raises(ValueError, match="permutation"):
        splitk.fixup_model(parts, [0, 0, 1])


# ---------------------------------------------------------------- the hybrid's work units on the CPU


@pytest.mark.parametrize("tiles,clusters,k_tiles,splits", [
    (296, 132, 56, 3), (5, 2, 5, 3), (6, 4, 5, 3), (7, 3, 9, 4), (9, 3, 4, 2), (4, 9, 5, 3), (1, 1, 1, 1),
    (80, 66, 448, 3), (145, 66, 128, 2), (11, 5, 3, 8)])
def test_the_hybrid_units_cover_every_k_block_of_every_tile_once(tiles, clusters, k_tiles, splits):
    splits = effective_splits(k_tiles, splits)
    dp, tail = hybrid_tiles(tiles, clusters, splits)
    units = splitk.units_model(tiles, k_tiles, splits, dp)
    assert len(units) == dp + tail * splits
    covered = torch.zeros(tiles, k_tiles, dtype=torch.int32)
    for tile, split, k0, kc in units:
        assert kc >= 1 and 0 <= split < splits
        covered[tile, k0:k0 + kc] += 1
    assert torch.equal(covered, torch.ones_like(covered))  # every (tile, k-block) exactly once
    # The whole tiles come first, all of K, and fill whole waves: every cluster runs as many of them, and the
    # split units start together, one slice of the tail's tiles per wave (slice-major).
    assert all(u == (t, 0, 0, k_tiles) for t, u in enumerate(units[:dp])) and dp % clusters == 0
    assert [u[1] for u in units[dp:]] == sorted(u[1] for u in units[dp:])
    if splits > 1 and tiles > clusters:
        assert 0 < tail < clusters or tiles % clusters == 0


def test_units_model_refuses_what_the_kernel_cannot_run():
    assert splitk.units_model(np.int64(3), np.int32(5), 3, np.int64(2)) == \
        [(0, 0, 0, 5), (1, 0, 0, 5), (2, 0, 0, 2), (2, 1, 2, 2), (2, 2, 4, 1)]
    with pytest.raises(ValueError, match=r"^dp_tiles must be <= 3; got 4"):
        splitk.units_model(3, 5, 3, 4)
    with pytest.raises(ValueError, match=r"splits=4 leaves slices of 5 k-blocks empty"):
        splitk.units_model(3, 5, 4, 0)
    with pytest.raises(TypeError, match=r"^dp_tiles must be an int"):
        splitk.units_model(3, 5, 3, 1.0)


@cute.kernel
def _units_kernel(out: cute.Tensor, m_ctiles: Int32, n_ctiles: Int32, k_tiles: Int32, splits: Int32, dp_tiles: Int32,
                  units: Int32):
    tid, _, _ = cute.arch.thread_idx()
    bid, _, _ = cute.arch.block_idx()
    i = bid * 128 + tid
    if i < units:
        fields = unit_coords(i, m_ctiles, n_ctiles, k_tiles, splits, dp_tiles, "m", 2, True)
        for f in cutlass.range_constexpr(6):
            out[6 * i + f] = fields[f]


@cute.jit
def _units_host(out: cute.Tensor, m_ctiles: Int32, n_ctiles: Int32, k_tiles: Int32, splits: Int32, dp_tiles: Int32,
                units: Int32, stream: cuda.CUstream):
    _units_kernel(out, m_ctiles, n_ctiles, k_tiles, splits, dp_tiles, units).launch(
        grid=((units + 127) // 128, 1, 1), block=(128, 1, 1), stream=stream)


def test_the_kernels_unit_coords_are_the_cpu_model():
    # The device function both warp roles call, run on the emulator for every unit of a few grids: the same
    # (tile, split, k-blocks) as units_model, and the tile's (m, n) from the grouped raster order.
    from gemmlab.compile import compile_for, fake_stream, fake_tensor

    c = compile_for("sm_90a", _units_host, fake_tensor(Int32, (cute.sym_int(),), align=4), *[Int32(1)] * 6,
                    fake_stream())
    for mt, nt, k_tiles, splits, dp in ((3, 2, 5, 3, 4), (5, 3, 10, 4, 12), (2, 2, 7, 3, 0), (7, 1, 3, 2, 5),
                                        (3, 3, 4, 1, 9)):
        want = splitk.units_model(mt * nt, k_tiles, splits, dp)
        out = torch.full((6 * len(want),), -1, dtype=torch.int32)
        S._emulate(c, [out, *(Int32(v) for v in (mt, nt, k_tiles, splits, dp, len(want)))], 0, dynamic=True,
                   aligns={0: 4})
        order = TileScheduler(mt, nt, "m", 2)
        got = [tuple(r) for r in out.view(-1, 6).tolist()]
        assert got == [(*order.tile(t), k0, kc, t, s) for t, s, k0, kc in want], (mt, nt, k_tiles, splits, dp)


# ---------------------------------------------------------------- the kernel on the emulator

_SMALL = Sm90Config(tile_m=64, tile_n=64, stages=4, cluster=(1, 1), splits=3)
_compiled = {}


def _kernel(cfg):
    key = cfg.kernel_key
    if key not in _compiled:
        _compiled[key] = compile_gemm("sm_90a", cfg)
    return _compiled[key]


def _inputs(m, n, k, seed=0):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(m, k, generator=g).to(torch.bfloat16)
    b = torch.randn(n, k, generator=g).to(torch.bfloat16).t()  # K-major, as a weight's view
    return a, b


def _plan_args(cfg, m, n, k, clusters):
    """What the plan passes a split launch on ``clusters`` clusters: ``(splits, dp_tiles, workspace floats, counters)``."""
    return split_launch(GemmProblem(m, n, k), cfg, clusters)


def _launch(cfg, a, b, clusters, counters=None, seed=0, dp_tiles=None):
    """One launch on the emulator with a NaN-poisoned C and workspace; returns C (the counters are updated).

    Split-K: the plan's arguments for ``clusters`` clusters, the workspace exactly as large as the plan's (so a
    partial tile stored past the tail's would fault); ``dp_tiles`` forces another count of whole tiles (the
    workspace then holds the rest)."""
    m, n = a.shape[0], b.shape[1]
    out = torch.full((m, n), float("nan"), dtype=torch.bfloat16)
    if not cfg.split_k:
        S._emulate(_kernel(cfg), [a, b, out, Int32(clusters)], seed, dynamic=True)
        return out
    splits, dp, floats, _ = _plan_args(cfg, m, n, a.shape[1], clusters)
    if dp_tiles is not None:
        cm, cn = cfg.cluster_tiles(m, n)
        dp, floats = dp_tiles, (cm * cn - dp_tiles) * cfg.cluster_size * splits * cfg.tile_m * cfg.tile_n
    ws = torch.full((floats,), float("nan"))
    S._emulate(_kernel(cfg), [a, b, out, ws, counters, Int32(splits), Int32(dp), Int32(clusters)], seed,
               dynamic=True, aligns={4: 4})
    return out


def _check(out, a, b):
    verdict = S.Mma(lambda x: [((slice(None), slice(None)), a.float(), b.float())]).compare(
        out, a.double() @ b.double(), None, sides=1)
    assert not out.isnan().any() and verdict.ok, verdict


def _owners(cfg, m, n, k, clusters) -> dict:
    """Which CTAs run each split tile's units: the plan's units (:func:`splitk.units_model`) dealt out as the
    persistent kernel deals them, cluster c taking units c, c + clusters, ..."""
    splits, dp, _, _ = _plan_args(cfg, m, n, k, clusters)
    cm, cn = cfg.cluster_tiles(m, n)
    owners: dict = {}
    for u, (tile, split, _, _) in enumerate(splitk.units_model(cm * cn, -(-k // cfg.tile_k), splits, dp)):
        if tile >= dp:
            owners.setdefault(tile, set()).add(u % clusters)
    return owners


@pytest.mark.parametrize("cfg,shape,clusters", [
    # 2 tiles, 3 k-blocks in slices of 2 and 1; on 3 CTAs each tile's two units run on two CTAs
    (Sm90Config(tile_m=64, tile_n=64, stages=4, cluster=(1, 1), splits=2), (100, 64, 136), 3),
    # 3 tiles, 5 k-blocks in slices of 2, 2, 1; on 2 CTAs
    (_SMALL, (136, 64, 264), 2),
    # two consumer warpgroups (the named barrier over 256 threads), swapped: 2 x 2 tiles of 128 x 32
    (Sm90Config(tile_m=128, tile_n=32, stages=4, cluster=(1, 1), swap_ab=True, epi_n=16, splits=2), (40, 136, 264), 3),
    # a 2 x 1 cluster over 3 M tiles: the fourth CTA tile is padding and still counts its units
    (Sm90Config(tile_m=64, tile_n=64, stages=4, cluster=(2, 1), splits=3), (130, 64, 264), 2),
], ids=["split2-uneven", "split3-uneven", "two-consumers-swap", "cluster-2x1-padding"])
def test_split_k_in_one_launch_on_the_emulator(cfg, shape, clusters):
    m, n, k = shape
    a, b = _inputs(m, n, k)
    k_tiles = -(-k // cfg.tile_k)
    splits = effective_splits(k_tiles, cfg.splits)
    assert len({c for _, c in split_ranges(k_tiles, splits)}) == 2  # uneven slices
    if cfg.cluster == (1, 1):  # some tile's units run on different CTAs
        assert any(len(o) > 1 for o in _owners(cfg, m, n, k, clusters).values())
    counters = torch.zeros(cfg.split_tiles(m, n, clusters), dtype=torch.int32)
    first = _launch(cfg, a, b, clusters, counters)
    _check(first, a, b)
    assert not counters.any()  # every tile's last unit put its counter back
    second = _launch(cfg, a, b, clusters, counters, seed=1)  # the same counters, another interleaving
    _check(second, a, b)
    assert not counters.any()
    assert torch.equal(first.view(torch.int16), second.view(torch.int16))  # and the same bits


@pytest.mark.parametrize("cfg,shape,clusters", [
    # 6 tiles (3 x 2, partial in M and N) on 4 CTAs: 4 whole, then 2 tiles x 3 slices (2, 2, 1 k-blocks)
    (_SMALL, (130, 104, 264), 4),
    # 5 tiles on 2 CTAs: 4 whole, then 1 tile in 2 slices (2 and 1 k-blocks) on both CTAs
    (Sm90Config(tile_m=64, tile_n=64, stages=4, cluster=(1, 1), splits=2), (300, 64, 136), 2),
    # a 2 x 1 cluster: 9 M tiles in 5 cluster tiles (the last pair's second CTA is padding) on 2 clusters:
    # 4 whole, then the fifth in 3 slices
    (Sm90Config(tile_m=64, tile_n=64, stages=4, cluster=(2, 1), splits=3), (540, 64, 264), 2),
], ids=["6-tiles-on-4", "5-tiles-on-2", "cluster-2x1-5-on-2"])
def test_hybrid_grid_on_the_emulator(cfg, shape, clusters):
    m, n, k = shape
    a, b = _inputs(m, n, k, seed=3)
    cm, cn = cfg.cluster_tiles(m, n)
    splits, dp, floats, tiles = _plan_args(cfg, m, n, k, clusters)
    assert (dp, tiles // cfg.cluster_size) == hybrid_tiles(cm * cn, clusters, splits)
    assert 0 < dp < cm * cn and dp % clusters == 0 and tiles % cfg.cluster_size == 0
    assert floats == tiles * splits * cfg.tile_m * cfg.tile_n  # the workspace holds the tail's tiles only
    if cfg.cluster == (1, 1):
        assert any(len(o) > 1 for o in _owners(cfg, m, n, k, clusters).values())
    counters = torch.zeros(tiles, dtype=torch.int32)
    first = _launch(cfg, a, b, clusters, counters)
    _check(first, a, b)
    assert not counters.any()
    second = _launch(cfg, a, b, clusters, counters, seed=1)
    assert not counters.any() and torch.equal(first.view(torch.int16), second.view(torch.int16))
    # the whole tiles are bit for bit the kernel without split-K's (its one accumulator over all of K)
    whole, mask = _launch(replace(cfg, splits=1), a, b, clusters), _whole_mask(cfg, m, n, dp)
    assert mask.any() and not mask.all()
    assert torch.equal(first[mask].view(torch.int16), whole[mask].view(torch.int16))


def _cancelling_inputs(seed=0):
    """136 x 64 x 264 (3 slices of 2, 2 and 1 k-blocks) whose slices sum to p0 = 2^24, p1 in [64, 192), p2 = -2^24.

    In FP32, ``(p0 + p1) + p2`` rounds p1 to an even integer (the spacing at 2^24 is 2) while ``(p0 + p2) + p1``
    is p1 exactly: the order of the partial sums shows in the BF16 output.
    """
    g = torch.Generator().manual_seed(seed)
    a = torch.ones(136, 264, dtype=torch.bfloat16)
    b = torch.empty(264, 64)
    b[:128] = 2.0 ** 17
    b[128:256] = 0.5 + torch.rand(128, 64, generator=g)
    b[256:] = -(2.0 ** 21)
    b = b.to(torch.bfloat16).t().contiguous().t()  # K-major
    parts = [a[:, r].float() @ b[r].float() for r in (slice(0, 128), slice(128, 256), slice(256, 264))]
    return a, b, parts


def test_the_sum_does_not_depend_on_who_reduces():
    # On one CTA the units arrive in split order, so split 2 reduces every tile (it reads its own partial back).
    # On 9 CTAs all units run at once and the short last slice arrives first, so split 0 or 1 reduces (its own
    # partial stays in its registers). Every run must return ((p0 + p1) + p2), the split order's sum.
    a, b, (p0, p1, p2) = _cancelling_inputs()
    want = ((p0 + p1) + p2).to(torch.bfloat16)
    arrival = ((p2 + p0) + p1).to(torch.bfloat16)  # what adding in arrival order would give when p2 came first
    assert (want != arrival).sum() > 1000  # the data tells the orders apart
    for clusters, seed in ((1, 0), (9, 0), (9, 1), (2, 2)):
        # dp_tiles = 0: every tile split, whatever the grid (the kernel before whole waves ran whole tiles)
        counters = torch.zeros(_SMALL.split_tiles(136, 64), dtype=torch.int32)
        out = _launch(_SMALL, a, b, clusters, counters, seed, dp_tiles=0)
        assert not counters.any()
        assert torch.equal(out.view(torch.int16), want.view(torch.int16)), (clusters, seed)


def test_on_a_hybrid_grid_whole_tiles_are_whole_and_only_the_tail_is_split():
    # 3 tiles on 2 CTAs: the first wave (tiles 0 and 1 of the raster order) runs whole tiles, bit for bit what the
    # kernel without split-K computes (one accumulator over all of K); the third tile is split in 3 and added in
    # split order. The inputs tell the two sums apart.
    a, b, (p0, p1, p2) = _cancelling_inputs()
    want = ((p0 + p1) + p2).to(torch.bfloat16)
    splits, dp, floats, tiles = _plan_args(_SMALL, 136, 64, 264, 2)
    assert (splits, dp, tiles) == (3, 2, 1) and floats == 3 * 64 * 64  # the workspace holds the tail tile only
    whole = _launch(replace(_SMALL, splits=1), a, b, 2)
    tail_m, _ = TileScheduler(3, 1, _SMALL.raster, _SMALL.group).tile(2)
    rows = slice(64 * tail_m, 64 * tail_m + 64)
    assert (whole[rows] != want[rows]).sum() > 100  # one accumulator over all of K is not the split order's sum
    for seed in (0, 1):
        counters = torch.zeros(tiles, dtype=torch.int32)
        out = _launch(_SMALL, a, b, 2, counters, seed)
        assert not counters.any()
        assert torch.equal(out[rows].view(torch.int16), want[rows].view(torch.int16))
        others = torch.ones(136, dtype=torch.bool)
        others[rows] = False
        assert torch.equal(out[others].view(torch.int16), whole[others].view(torch.int16))


def test_a_counter_left_non_zero_breaks_its_tile():
    # The test's own control: the counters are what decides who reduces. A counter left at 1 by an earlier launch
    # makes tile 0's first arrival its "last" unit: it adds the other slice before it was written (NaN, the poisoned
    # workspace) and the real last unit leaves the counter at 1 again. The other tile is untouched.
    cfg = Sm90Config(tile_m=64, tile_n=64, stages=4, cluster=(1, 1), splits=2)
    a, b = _inputs(100, 64, 136)
    counters = torch.tensor([1, 0], dtype=torch.int32)
    out = _launch(cfg, a, b, 1, counters, dp_tiles=0)  # both tiles split (one CTA would otherwise run them whole)
    assert out[:64].isnan().any() and not out[64:].isnan().any()
    assert counters.tolist() == [1, 0]


# ---------------------------------------------------------------- PTX (any machine)


def test_split_kernel_ptx_has_the_protocol_and_one_kernel():
    c = compile_gemm("sm_90a", Sm90Config(tile_n=256, stages=4, cluster=(2, 1), splits=3))
    assert len(ptx_lines(c, r"^\.visible \.entry")) == 1  # no second (reduction) kernel in the host function
    ops = ptx_opcodes(c, r"^atom", r"^fence\.acq_rel", r"^st\.global", r"ld\.global\.cg", r"^bar\.sync")
    assert "atom.global.add.u32" in ops and "atom.global.exch.b32" in ops  # count; reset by the last unit
    assert "fence.acq_rel.gpu;" in ops  # release before the count, acquire after the last one
    assert "st.global.v4.f32" in ops and "@%p" not in " ".join(ptx_lines(c, r"st\.global\.v4\.f32"))  # unpredicated
    assert any("ld.global.cg.v4.f32" in o for o in ops)  # partials read from L2, never a stale L1 line
    # the consumer warpgroups (2 x 128 threads) meet before the count and after it
    assert len(ptx_lines(c, r"^bar\.sync\s+4, 256;")) == 2
    # in order: stores, barrier, fence, atomic, fence (acquire), reset, barrier, loads
    seq = ptx_lines(c, r"^st\.global\.v4\.f32", r"^bar\.sync\s+4,", r"^fence\.acq_rel\.gpu", r"^atom\.global",
                    r"ld\.global\.cg\.v4\.f32")
    kinds = [next(k for k in ("st.global", "bar.sync", "fence", "atom.global.add", "atom.global.exch", "ld.global")
                  if k in line) for line in seq]
    dedup = [k for i, k in enumerate(kinds) if i == 0 or kinds[i - 1] != k]
    assert dedup == ["st.global", "bar.sync", "fence", "atom.global.add", "fence", "atom.global.exch", "bar.sync",
                     "ld.global"], dedup


def test_no_spills_in_the_split_kernels():
    # The reduction adds into the accumulator itself (no second register array): the widest tiles keep no local
    # memory, as without split-K.
    from gemmlab.compile import sass_opcodes

    for cfg in (Sm90Config(tile_n=256, stages=4, cluster=(2, 1), splits=3),
                Sm90Config(tile_m=192, tile_n=192, stages=4, cluster=(2, 1), epi_stages=2, splits=3)):
        assert not sass_opcodes(compile_gemm("sm_90a", cfg), r"^(STL|LDL)"), cfg.name


def test_add_partials_reads_s_minus_1_slices_where_it_can():
    # own 0 or 1: p1 + p0 == p0 + p1, so the reducer's slice stays in registers; own >= 2: it is read back.
    # The PTX has the load groups of add_partials: own >= 2 (acc = p0), own == 1 (acc += p0), and the loop's body,
    # which reads reduce_group slices at once (a 64 x 64 tile's 32 floats a thread: 4 slices, 128 floats in flight).
    c = _kernel(_SMALL)
    per_slice = _SMALL.tile_m * _SMALL.tile_n // 128 // 4  # 16-byte vectors per thread and slice
    group = reduce_group(_SMALL.tile_m * _SMALL.tile_n // 128, 1)
    assert group == 4
    assert len(ptx_lines(c, r"ld\.global\.cg\.v4\.f32")) == (2 + group) * per_slice


def test_the_loop_issues_a_groups_loads_before_its_additions():
    # In the loop body every one of the group's loads comes before the first addition of a loaded value, so the
    # group costs one round trip to L2; the additions then run in split order, slice by slice.
    c = _kernel(_SMALL)
    per_slice = _SMALL.tile_m * _SMALL.tile_n // 128 // 4
    ops = ptx_lines(c, r"^(@!?%p\d+\s+)?(ld\.global\.cg|add\.(rn\.)?f32)")
    loads = [i for i, o in enumerate(ops) if "ld.global.cg" in o]
    body = loads[2 * per_slice:]
    assert len(body) == 4 * per_slice
    assert not any(o.startswith("add") for o in ops[body[0]:body[-1]])


@pytest.mark.parametrize("floats,consumers,want", [(32, 1, 4), (16, 1, 4), (40, 1, 3), (48, 1, 2), (52, 1, 1),
                                                   (64, 1, 1), (128, 1, 1), (32, 2, 1), (72, 2, 1), (24, 3, 1)])
def test_reduce_group_only_where_it_was_measured_faster(floats, consumers, want):
    # one warpgroup, at most 48 floats a thread: 128 floats in flight; elsewhere one slice at a time
    assert reduce_group(floats, consumers) == want


# ---------------------------------------------------------------- on the GPU

SPLIT_CONFIGS = [Sm90Config(tile_n=256, stages=4, cluster=(2, 1), splits=3),
                 Sm90Config(tile_n=128, stages=6, cluster=(1, 2), splits=4),
                 Sm90Config(tile_m=128, tile_n=64, stages=8, cluster=(1, 1), swap_ab=True, splits=7),
                 Sm90Config(tile_m=192, tile_n=176, stages=4, cluster=(1, 2), epi_n=16, epi_stages=2, splits=3),
                 Sm90Config(tile_m=128, tile_n=208, stages=4, cluster=(1, 1), swap_ab=True, epi_n=16, splits=2)]
GPU_SHAPES = [(384, 3584, 4736), (200, 4096, 3584), (1000, 1032, 520), (72, 2120, 1600), (777, 1608, 1112)]


def _cuda_ab(m, n, k, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=g)
    b = torch.randn(n, k, device="cuda", dtype=torch.bfloat16, generator=g).t()
    return a, b


def _rel(out, a, b):
    ref = a.float() @ b.float()
    return ((out.float() - ref).norm() / ref.norm()).item()


@pytest.mark.gpu
@pytest.mark.sm90
@pytest.mark.parametrize("cfg", SPLIT_CONFIGS, ids=lambda c: c.name.replace(" ", "_"))
@pytest.mark.parametrize("m,n,k", GPU_SHAPES)
def test_split_k_on_gpu_fresh_data_poisoned_and_repeated(cfg, m, n, k):
    from gemmlab.family import plan as P

    a, b = _cuda_ab(m, n, k, seed=m + n + k)
    out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    run = P.prepare(a, b, out, cfg)
    run()
    torch.cuda.synchronize()
    first = out.clone()
    assert not first.isnan().any() and _rel(first, a, b) <= 1e-2
    for _ in range(5):  # the plan's counters again: each launch leaves them at zero for the next
        out.fill_(float("nan"))
        run()
    torch.cuda.synchronize()
    assert torch.equal(out, first)  # deterministic: same bits whichever unit reduced each tile
    sets = run.plan.launch.counters.by_stream  # the plan's counters (one set: one stream), back at zero
    assert len(sets) == 1 and not next(iter(sets.values())).any()


@pytest.mark.gpu
@pytest.mark.sm90
def test_split_k_through_gemmlab_gemm_with_a_forced_config(monkeypatch):
    import gemmlab
    from gemmlab.family import api, plan

    cfg = Sm90Config(tile_m=128, tile_n=208, stages=4, cluster=(1, 1), swap_ab=True, epi_n=16, splits=3)
    monkeypatch.setattr(plan, "choose_config", lambda problem, arch, sms, spec=None: cfg)
    monkeypatch.setattr(api, "_PLANS", {})
    monkeypatch.setattr(api, "_BY_PROBLEM", {})
    for m, n, k in ((200, 4096, 14336), (131, 3584, 2000)):
        a, b = _cuda_ab(m, n, k, seed=k)
        outs = [gemmlab.gemm(a, b) for _ in range(3)]  # fresh (uninitialised) outputs, the same plan
        torch.cuda.synchronize()
        assert api.plans()[-1].config == cfg
        assert _rel(outs[0], a, b) <= 1e-2 and all(torch.equal(o, outs[0]) for o in outs)


@pytest.mark.gpu
@pytest.mark.sm90
def test_one_plan_on_two_streams_at_once():
    # Per-stream counters: the same plan launched on two streams concurrently, many times, stays correct.
    from gemmlab.family import plan as P

    cfg = Sm90Config(tile_n=128, stages=6, cluster=(1, 2), splits=4)
    a, b = _cuda_ab(384, 3584, 4736, seed=5)
    outs = [torch.full((384, 3584), float("nan"), device="cuda", dtype=torch.bfloat16) for _ in range(2)]
    launch = P.prepare(a, b, outs[0], cfg).plan.launch  # one plan, launched on both streams
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    torch.cuda.synchronize()
    for _ in range(20):
        for out, s in zip(outs, streams):
            with torch.cuda.stream(s):
                launch(a, b, out)
    torch.cuda.synchronize()
    assert torch.equal(outs[0], outs[1]) and _rel(outs[0], a, b) <= 1e-2
    sets = launch.counters.by_stream
    assert len(sets) == 2 and not any(t.any() for t in sets.values())
    ws = launch.counters.workspaces  # and a workspace a stream: two launches at once never share partial tiles
    assert len(ws) == 2 and len({t.data_ptr() for t in ws.values()}) == 2


def _whole_mask(cfg, m, n, dp_tiles):
    """The elements of the M x N output that the first ``dp_tiles`` cluster tiles of the raster order cover."""
    cm, cn = cfg.cluster_tiles(m, n)
    order = TileScheduler(cm, cn, cfg.raster, cfg.group)
    mask = torch.zeros(*cfg.kernel_mn(m, n), dtype=torch.bool)
    for t in range(dp_tiles):
        mc, nc = order.tile(t)
        for r in range(cfg.cluster_size):  # the CTAs of the cluster: neighbours along M' or along N'
            mt = mc * cfg.cluster[0] + (r if cfg.cluster[0] > 1 else 0)
            nt = nc * cfg.cluster[1] + (r if cfg.cluster[1] > 1 else 0)
            mask[mt * cfg.tile_m:(mt + 1) * cfg.tile_m, nt * cfg.tile_n:(nt + 1) * cfg.tile_n] = True
    return mask.t() if cfg.swap_ab else mask


#: Hybrid grids (more tiles than clusters): the heuristic's split picks for three of the shapes it was built for on
#: the GPU's own grid (None), and smaller grids forced through a plan's SM count.
HYBRID_CASES = [
    (Sm90Config(tile_m=128, tile_n=208, stages=4, cluster=(1, 1), swap_ab=True, epi_n=16, splits=3),
     (200, 37888, 3584), None),
    (Sm90Config(tile_n=256, stages=4, cluster=(1, 2), raster="n", splits=3), (640, 8192, 28672), None),
    (Sm90Config(tile_n=192, stages=4, cluster=(2, 1), raster="n", splits=2), (1000, 4608, 3584), None),
    (Sm90Config(tile_m=192, tile_n=176, stages=4, cluster=(1, 2), epi_n=16, epi_stages=2, splits=3),
     (777, 1608, 1112), 16),
    (Sm90Config(tile_m=128, tile_n=64, stages=8, cluster=(1, 1), swap_ab=True, splits=7), (72, 2120, 1600), 10),
]


@pytest.mark.gpu
@pytest.mark.sm90
@pytest.mark.parametrize("cfg,shape,sms", HYBRID_CASES, ids=lambda x: x.name.replace(" ", "_")
                         if isinstance(x, Sm90Config) else str(x))
def test_hybrid_split_k_on_gpu(cfg, shape, sms):
    # Whole tiles first, then the tail split: the whole tiles are bit for bit what the same tile without split-K
    # computes (one accumulator over all of K), the rest is right and the same on every launch, the counters zero.
    from gemmlab import hardware
    from gemmlab.family import plan as P
    from gemmlab.family.problem import canonical_operands, problem_of

    m, n, k = shape
    a, b = _cuda_ab(m, n, k, seed=m + k)
    out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    problem = problem_of(a, b, out)
    plan = P.Plan(problem, cfg, "sm90", sms or hardware.sm_count(a.device))
    dp = plan.launch.dp_tiles
    cm, cn = cfg.cluster_tiles(m, n)
    assert 0 < dp < cm * cn  # a hybrid grid: whole waves, then a split tail
    ca, cb, cout = canonical_operands(a, b, out, problem.b_major)
    plan(ca, cb, cout)
    whole = torch.full_like(out, float("nan"))
    P.Plan(problem, replace(cfg, splits=1), "sm90", plan.num_sms)(ca, cb, whole)
    torch.cuda.synchronize()
    first = out.clone()
    assert not first.isnan().any() and _rel(first, a, b) <= 1e-2
    mask = _whole_mask(cfg, m, n, dp).cuda()
    assert mask.any() and not mask.all()
    assert torch.equal(first[mask].view(torch.int16), whole[mask].view(torch.int16))
    for _ in range(3):
        out.fill_(float("nan"))
        plan(ca, cb, cout)
    torch.cuda.synchronize()
    assert torch.equal(out, first)
    sets = plan.launch.counters.by_stream
    assert len(sets) == 1 and not next(iter(sets.values())).any()
