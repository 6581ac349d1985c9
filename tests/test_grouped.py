"""Chapter 08: the grouped GEMM: scheduler model, argument checks, descriptor-update PTX, GPU results."""
from __future__ import annotations

import math
import re

import pytest
import torch

from gemmlab.family import api, configs, heuristic_grouped as hg, plan, problem
from gemmlab import grouped_model as gm
from gemmlab.measure import bench, grouped as mg, grouped_tables as gt
from gemmlab.compile import ptx_lines, ptx_of
from gemmlab.kernels.grouped_sm90 import compile_grouped


# ---------------------------------------------------------------- the scheduler model (hand-worked)

def test_tile_order_walks_groups_largest_first_m_fastest():
    # groups of 3, 0 and 130 rows; N = 256 in 128-wide tiles; 128-row tiles:
    # group 2 (largest) first: 2 x 2 tiles, then group 0: 1 x 2, group 1: none -> 6 tiles over 3 CTAs
    order = gm.tile_order([3, 0, 130], 256, 128, 128, 3)
    assert order == [[(2, 0, 0), (2, 1, 1)], [(2, 1, 0), (0, 0, 0)], [(2, 0, 1), (0, 0, 1)]]
    flat = sorted(t for cta in order for t in cta)
    assert len(flat) == len(set(flat)) == 6
    # index order (by_size=False): group 0's tiles first
    order = gm.tile_order([3, 0, 130], 256, 128, 128, 3, by_size=False)
    assert order == [[(0, 0, 0), (2, 1, 0)], [(0, 0, 1), (2, 0, 1)], [(2, 0, 0), (2, 1, 1)]]


def test_tile_order_in_cluster_pairs():
    # groups of 130 and 300 rows, N = 256, 128 x 128 tiles, 4 CTAs = 2 pairs. Largest first: group 1 has
    # 3 M-tiles -> 2 pairs x 2 N-tiles = units 0-3; group 0: 2 M-tiles -> 1 pair x 2 = units 4-5.
    order = gm.tile_order([130, 300], 256, 128, 128, 4, cluster=2)
    assert order[0] == [(1, 0, 0), (1, 0, 1), (0, 0, 0)]  # pair 0 takes units 0, 2, 4 (rank 0)
    assert order[1] == [(1, 1, 0), (1, 1, 1), (0, 1, 0)]  # rank 1: the other M-tile of each pair
    assert order[2] == [(1, 2, 0), (1, 2, 1), (0, 0, 1)]  # pair 1: units 1, 3, 5
    assert order[3] == [(1, 3, 0), (1, 3, 1), (0, 1, 1)]  # M-tile 3 of group 1 is past its 300 rows
    one = gm.tile_order([130, 300], 256, 128, 128, 4)
    assert gm.tile_order([130, 300], 256, 128, 128, 4, cluster=1) == one


def test_dynamic_scheduling_for_every_single_cta_tile():
    assert all(hg.dynamic_schedule(c) for c in (configs.SMALL, configs.SMALL_WIDE, configs.MEDIUM, configs.LARGE))
    assert not any(hg.dynamic_schedule(c) for c in (configs.LARGE_C2, configs.MEDIUM_C2))


def test_dynamic_variant_claims_tiles_and_resets_its_counters():
    dyn = ptx_of(compile_grouped("sm_90a", configs.LARGE, "ragged", "k", dynamic=True))
    # one claim (in the k-loop, CLAIM_LEAD k-blocks before a tile's last load), the acq_rel "done" count,
    # two resets
    assert len(re.findall(r"atom\.global\.add\.u64", dyn)) == 1
    assert len(re.findall(r"atom\.global\.acq_rel\.add\.u64", dyn)) == 1
    assert len(re.findall(r"atom\.global\.exch\.b64", dyn)) == 2
    assert "atom." not in ptx_of(compile_grouped("sm_90a", configs.LARGE, "ragged", "k"))


def test_dynamic_pairs_post_units_through_the_mailbox():
    from gemmlab.scheduler import MAILBOX_WORDS
    dyn = ptx_of(compile_grouped("sm_90a", configs.LARGE_C2, "ragged", "k", dynamic=True))
    # the first CTA's claim, the partner's two polls (the first read and the loop's)
    assert len(re.findall(r"atom\.global\.add\.u64", dyn)) == 3
    assert len(re.findall(r"atom\.global\.acq_rel\.add\.u64", dyn)) == 1  # the "done" count, first CTAs only
    # one post, the partner's clearing of every mailbox word, the two resets
    assert len(re.findall(r"atom\.global\.exch\.b64", dyn)) == 1 + MAILBOX_WORDS + 2
    assert MAILBOX_WORDS > configs.LARGE_C2.stages + 1 and MAILBOX_WORDS > configs.MEDIUM_C2.stages + 1


def test_largest_first_only_for_single_cta_128_row_tiles():
    many = hg.DYNAMIC_LARGEST_FIRST_FROM
    assert hg.largest_first(configs.MEDIUM, many) and hg.largest_first(configs.LARGE, many)
    assert not hg.largest_first(configs.SMALL, many) and not hg.largest_first(configs.SMALL_WIDE, many)
    assert not hg.largest_first(configs.LARGE_C2, many) and not hg.largest_first(configs.MEDIUM_C2, many)


def test_largest_first_with_dynamic_scheduling_only_from_many_tokens():
    many = hg.DYNAMIC_LARGEST_FIRST_FROM
    assert hg.dynamic_schedule(configs.LARGE) and hg.dynamic_schedule(configs.MEDIUM)
    assert not hg.largest_first(configs.LARGE, many - 1) and hg.largest_first(configs.LARGE, many)
    assert not hg.largest_first(configs.MEDIUM, 512)  # where choose_config picks 128 x 192: index order
    # static scheduling keeps largest first at any size; the scheduling passed in overrides the tile's
    assert hg.largest_first(configs.MEDIUM, 64, dynamic=False)
    assert hg.largest_first(configs.LARGE, 64, dynamic=False)
    assert not hg.largest_first(configs.MEDIUM, 64, dynamic=True)


def test_tile_order_figures(tmp_path, monkeypatch):
    import gemmlab.figures as figs

    monkeypatch.setattr(figs, "FIGURES_DIR", tmp_path)
    for cluster in (1, 2):  # the pairs' figure draws the slots past the rows too: every handed-out tile has a cell
        p = gm.draw_tile_order([300, 0, 70, 520], 512, 128, 128, 6, name=f"t{cluster}", cluster=cluster)
        assert p.exists() and p.stat().st_size > 1000


def _tail_rows(fixed, us_per_expert, n=7168, k=2048, lives=(1, 2, 8, 10, 12, 20)):
    return [{"n": n, "k": k, "live": x, "tiles": 56 * x, "waves": 56 * x / 132, "bytes_per_expert": n * k * 2,
             "us": fixed + us_per_expert * x, "torch_us": 2 * fixed + 1.3 * us_per_expert * x} for x in lives]


def test_fit_launch_cost_on_a_line():
    rows = _tail_rows(12.0, 7.0)
    rows[0]["us"] += 50.0  # under 4 waves: left out of the fit
    fit = mg.fit_launch_cost(rows)
    assert fit["fixed_us"] == pytest.approx(12.0) and fit["us_per_expert"] == pytest.approx(7.0)
    assert fit["tbs"] == pytest.approx(7168 * 2048 * 2 / 7e-6 / 1e12)
    with pytest.raises(ValueError, match="two launches"):
        mg.fit_launch_cost(rows[:3])


def test_finish_times_figure(tmp_path, monkeypatch):
    import gemmlab.figures as figs

    monkeypatch.setattr(figs, "FIGURES_DIR", tmp_path)
    p = gm.draw_finish_times(tiles=40, grid=8, name="finish")
    assert p.exists() and p.stat().st_size > 1000


def test_tail_figure_and_lines(tmp_path, monkeypatch):
    import gemmlab.figures as figs

    monkeypatch.setattr(figs, "FIGURES_DIR", tmp_path)
    rows = _tail_rows(12.0, 7.0) + _tail_rows(8.0, 14.0, n=4096, k=7168)
    fits = []
    for n, k in ((7168, 2048), (4096, 7168)):
        fam = [r for r in rows if r["n"] == n]
        fits.append({"n": n, "k": k, **mg.fit_launch_cost(fam),
                     "torch": mg.fit_launch_cost([{**r, "us": r["torch_us"]} for r in fam])})
    doc = {"device": "test GPU", "rows": rows, "fits": fits, "stream_read_tbs": 3.0, "sms": 132}
    p = gt.draw_tail([doc, doc], name="tail")
    assert p.exists() and p.stat().st_size > 1000
    text = gt.tail_lines(doc)
    assert "fixed  12.0 us" in text and "torch._grouped_mm  24.0 us" in text and "3.00 TB/s" in text
    assert "as a line" not in text  # results from before the streaming reads' fit
    # a read of x MiB taking 9.5 us + x MiB at 3.2 TB/s: the fit finds both
    pts = [(mib << 20, 9.5 + (mib << 20) / 3.2e6) for mib in (128, 512, 2048)]
    fixed, slope = bench.line_fit(pts)
    doc["stream_read_fit"] = {"fixed_us": fixed, "tbs": 1 / (slope * 1e-6) / 1e12}
    assert "as a line: fixed   9.5 us per launch, 3.20 TB/s" in gt.tail_lines(doc)


def test_decode_sets_against_a_streaming_read_of_their_bytes():
    # a weight-bound decode set of 3.2 GB/s * 100 us = 320 MB at the datasheet's 3.2 TB/s, run in 110 us; a read of
    # it on the fitted line takes 10 us + 320 MB at 3.2 TB/s = 110 us: ratio 1. A compute-bound or a 64-per-expert
    # row is not a decode set.
    row = {"tokens": 64, "groups": 8, "weight_bound": True, "floor_ms": 0.1, "gemmlab_kernel_ms": 0.11}
    rows = [row, {**row, "weight_bound": False}, {**row, "tokens": 512}, {**row, "gemmlab_kernel_ms": 0.22}]
    moe_doc = {"device": "test GPU", "hbm_gbs": 3200.0, "rows": rows}
    tail_doc = {"stream_read_fit": {"fixed_us": 10.0, "tbs": 3.2}}
    got = mg.against_streaming_read(moe_doc, tail_doc)
    assert [x for _, x in got] == pytest.approx([1.0, 0.5])
    assert "2 decode sets" in gt.streaming_read_line(moe_doc, tail_doc) and "0.500 to 1.000" in gt.streaming_read_line(moe_doc, tail_doc)


def test_measured_roofline_by_hand(tmp_path, monkeypatch):
    import gemmlab.figures as figs
    # Ceilings of 4.0 TB/s and 800 TFLOP/s. A decode set moving 400 MB with 8 GFLOP: the bytes bound it,
    # 100 us; run in 125 us it is at 0.80. A compute-bound set of 1.6 TFLOP and 1 GB: 2 ms of MMAs against
    # 0.25 ms of bytes; run in 2.5 ms, 0.80 too. The datasheet's column stays as it was.
    decode = {"tokens": 64, "groups": 8, "flops": 8e9, "bytes": 4e8, "gemmlab_kernel_ms": 0.125, "of_roofline": 0.7}
    big = {"tokens": 16384, "groups": 8, "flops": 1.6e12, "bytes": 1e9, "gemmlab_kernel_ms": 2.5, "of_roofline": 0.6}
    rows = mg.measured_roofline([decode, big], {"copy_tbs": 4.0, "gemm_tflops": 800.0})
    assert [r["measured_floor_ms"] for r in rows] == pytest.approx([0.1, 2.0])
    assert [r["of_measured_roofline"] for r in rows] == pytest.approx([0.8, 0.8])
    assert decode["of_roofline"] == 0.7
    with pytest.raises(ValueError, match="ceilings"):
        mg.measured_roofline([decode], {"copy_tbs": 0.0, "gemm_tflops": 800.0})
    # The summary and the chapter's lines name both rooflines once a run has the measured one.
    full = {"vs_torch": 1.0, "vs_torch_novalidate": 1.0, "vs_torch_kernel": 1.0, "vs_loop": 1.0, "rel_err": 1e-3,
            "shape": "test", "nonempty": 8, "config": "64x128 c1x1", "gemmlab_novalidate_ms": 1.0,
            "torch_grouped_mm_ms": 1.0, "matmul_loop_ms": 1.0}
    doc = {"device": "test GPU", "date": "2026-11-25", "measured": {"copy_tbs": 4.0, "gemm_tflops": 800.0},
           "rows": [{**decode, **full}, {**decode, **full, "gemmlab_kernel_ms": 0.2}, {**big, **full}]}
    mg.measured_roofline(doc["rows"], doc["measured"])
    s = mg.summarize(doc["rows"])
    assert s["decode_of_measured_roofline_min"] == pytest.approx(0.5)
    assert s["decode_of_measured_roofline_geomean"] == pytest.approx((0.8 * 0.5) ** 0.5)
    assert "0.63 of the measured one (geomean), lowest 0.50 (this run's copy 4.00 TB/s" in gt.summary_lines(doc)
    assert gt.moe_table(doc).splitlines()[0].endswith("meas")
    # The figure draws the measured roofline as its own series (the datasheet's stays), only where the run has it.
    monkeypatch.setattr(figs, "FIGURES_DIR", tmp_path)
    for r in doc["rows"]:
        r.update(n=4096, k=7168, floor_ms=0.1, torch_grouped_mm_kernel_tflops=1.0, gemmlab_kernel_tflops=1.0)
    captured = {}
    monkeypatch.setattr(figs, "save", lambda fig, name: captured.setdefault(name, fig) and tmp_path / name)
    gt.draw_moe([doc], name="with")
    gt.draw_moe([{**doc, "rows": [{k: v for k, v in r.items() if k != "measured_floor_ms"} for r in doc["rows"]]}],
                name="without")
    labels = {n: [ln.get_label() for ln in f.axes[0].get_lines()] for n, f in captured.items()}
    assert "measured roofline (device copy, cuBLAS)" in labels["with"]
    assert "measured roofline (device copy, cuBLAS)" not in labels["without"] and len(labels["without"]) == 3


def test_timeline_from_hand_made_traces():
    pts = grouped_sm90_points()
    def launch(t0):
        rows = [[0, 2000, 5000, 6000, 20000, 19000, 22000, 3], [1000, 3000, 7000, 8000, 14000, 13000, 15000, 2]]
        return torch.tensor([[v + t0 if i < len(pts) - 1 else v for i, v in enumerate(r)] for r in rows])
    t = mg.timeline({"points": pts, "launches": [launch(0), launch(30000)]})
    assert t["span"] == 22 and t["entry_skew"] == 1 and t["gap"] == 8
    assert t["to_first_load"] == 2 and t["first_tile"] == 5.5 and t["drain"] == 1.5 and t["tail"] == 3.5
    assert (t["tiles_min"], t["tiles_max"]) == (2, 3)


def grouped_sm90_points():
    from gemmlab.kernels.grouped_sm90 import TRACE_POINTS
    assert TRACE_POINTS[-1] == "tiles" and TRACE_POINTS[0] == "entry"
    return TRACE_POINTS


def test_traced_kernel_stamps_only_when_asked():
    traced = ptx_of(compile_grouped("sm_90a", configs.SMALL, "ragged", "k", trace=True))
    from gemmlab.kernels.grouped_sm90 import TRACE_POINTS
    assert len(re.findall(r"%globaltimer", traced)) == len(TRACE_POINTS) - 1  # every point but the tile count
    assert "%globaltimer" not in ptx_of(compile_grouped("sm_90a", configs.SMALL, "ragged", "k"))


def test_finish_times_claimed_as_tiles_end_by_hand():
    # CTA 1 twice as fast: it frees up at 0.5 and takes tile 2; at 1.0 both are free (CTA 0 first): tile 3 to
    # CTA 0 (ends 2.0), tile 4 to CTA 1 (1.0 -> 1.5), tile 5 to CTA 1 (-> 2.0): both end at the even split
    assert gm.finish_times([1] * 6, [1, 2], dynamic=True, ahead=False) == [2.0, 2.0]
    # claiming as a tile starts, the same 6 tiles end as the static order does
    assert gm.finish_times([1] * 6, [1, 2], dynamic=True, ahead=True) == [3.0, 1.5]
    assert gm.finish_times([1] * 6, [1, 2], dynamic=False, ahead=False) == [3.0, 1.5]  # static ignores it


def test_finish_times_model_by_hand():
    # 2 CTAs at speeds 1 and 2, six unit tiles. Static: CTA 0 runs tiles 0, 2, 4 (3.0), CTA 1 tiles 1, 3, 5 (1.5).
    assert gm.finish_times([1] * 6, [1, 2], dynamic=False) == [3.0, 1.5]
    # Dynamic, claiming one ahead: CTA 0 starts 0 (claims 2), CTA 1 starts 1 (claims 3); CTA 1 starts 3 at 0.5
    # (claims 4), CTA 0 starts 2 at 1 (claims 5), CTA 1 starts 4 at 1.0 and ends at 1.5; CTA 0 runs 5 from 2 to 3.
    assert gm.finish_times([1] * 6, [1, 2], dynamic=True) == [3.0, 1.5]
    # With more tiles dynamic wins: 24 unit tiles, static ends at 12, dynamic between the even split (8) and 9
    # (the slow CTA may still hold one claimed tile when the fast one runs out).
    static = gm.finish_times([1] * 24, [1, 2], dynamic=False)
    dynamic = gm.finish_times([1] * 24, [1, 2], dynamic=True)
    assert static == [12.0, 6.0] and 8.0 <= max(dynamic) <= 9.0


def test_visit_order_ranks_sizes_ties_by_index():
    assert gm.visit_order([5, 9, 0, 9, 5]) == [1, 3, 0, 4, 2]
    assert gm.visit_order([5, 9, 0], by_size=False) == [0, 1, 2]
    from gemmlab.kernels.grouped_sm90 import ORDER_MAX
    many = list(range(ORDER_MAX + 1))  # past the shared-memory list: index order
    assert gm.visit_order(many) == many
    assert gm.visit_order(many[:ORDER_MAX])[:2] == [ORDER_MAX - 1, ORDER_MAX - 2]


def test_descriptor_slots_are_never_rewritten_under_a_queued_load():
    """The producer rewrites an A/B slot at a group change; the slot's last load has surely completed only if at
    least `stages` loads were issued after it (the producer waits for one stage's release per load). With the two
    slots the kernel first had, groups of one k-block break that; with stages + 1 slots nothing can."""
    import random

    from gemmlab.family.configs import ab_slots
    from gemmlab.grouped_model import slot_reuse_margin

    one_block = [(0, g, 1) for g in range(40)]  # a CTA walking 40 groups of one k-block each
    for stages in (2, 4, 8):
        assert slot_reuse_margin(one_block, stages, slots=2) == 1 < stages  # the hazard of two slots
        assert slot_reuse_margin(one_block, stages, slots=stages + 1) == stages
    rng = random.Random(0)
    for _ in range(300):
        stages = rng.choice((2, 3, 4, 5, 6, 8))
        visits, g = [], 0
        for _ in range(rng.randint(1, 60)):  # tiles of 1..5 k-blocks, groups of 1..3 tiles, two streams
            g += rng.random() < 0.7
            visits.append((rng.randint(0, 1), g, rng.randint(1, 5)))
        margin = slot_reuse_margin(visits, stages, stages + 1)
        assert margin is None or margin >= stages, (stages, visits)
    for cfg in (configs.SMALL, configs.LARGE, configs.LARGE_C2):
        assert ab_slots(cfg) == cfg.stages + 1
    # no group change inside a run of one group's tiles
    assert slot_reuse_margin([(0, 0, 3)] * 10, 4, 2) is None
    with pytest.raises(ValueError, match="at least one k-block"):
        slot_reuse_margin([(0, 0, 0)], 4, 5)


def test_descriptor_updates_count_group_changes():
    assert gm.descriptor_updates([3, 0, 130], 256, 128, 128, 3) == [1, 2, 2]
    assert gm.descriptor_updates([3, 0, 130], 256, 128, 128, 3, by_size=False) == [2, 2, 1]
    # one group: every CTA rewrites once
    assert gm.descriptor_updates([1000], 512, 128, 128, 4) == [1, 1, 1, 1]


def test_random_pairs_layouts():
    pairs = gm.random_pairs([(3, 16, 24), (0, 8, 16)], device="cpu")
    (a, b), (a0, b0) = pairs
    assert a.shape == (3, 24) and b.shape == (24, 16) and b.stride() == (1, 24)  # (N, K) storage, (K, N) view
    assert a0.shape == (0, 16) and b0.shape == (16, 8)
    (_, bn), _ = gm.random_pairs([(3, 16, 24), (0, 8, 16)], b_major="n", device="cpu")
    assert bn.shape == (24, 16) and bn.stride() == (16, 1)
    again = gm.random_pairs([(3, 16, 24), (0, 8, 16)], device="cpu")
    assert torch.equal(again[0][0], a) and torch.equal(again[0][1], b)  # the seed fixes the data


def test_random_problem_layouts_and_offsets():
    a, b, offs = gm.random_problem([3, 0, 5], 16, 24, extra_rows=2, device="cpu")
    assert a.shape == (10, 24) and b.shape == (3, 24, 16) and problem.b_major_of("b", b) == "k"
    assert offs.dtype == torch.int32 and offs.tolist() == [3, 3, 8]
    _, bn, _ = gm.random_problem([1], 16, 24, b_major="n", device="cpu")
    assert problem.b_major_of("b", bn) == "n"


def test_problem_table_rows():
    a = torch.zeros(5, 32, dtype=torch.bfloat16)
    bk = torch.zeros(24, 32, dtype=torch.bfloat16).t()  # K x N view of an N x K weight: ldb = K
    bn = torch.zeros(32, 24, dtype=torch.bfloat16)  # row-major K x N: ldb = N
    c = torch.zeros(5, 24, dtype=torch.bfloat16)
    (row,) = plan.problem_table([(a, bk)], [c], "k")
    assert row == (a.data_ptr(), bk.data_ptr(), c.data_ptr(), 5, 24, 32, 32, 32, 24)
    (row,) = plan.problem_table([(a, bn)], [c], "n")
    assert row[6:] == (32, 24, 24)


def test_flops_bytes_count_only_live_weights():
    flops, nbytes = gm.flops_bytes([2, 0, 3], 8, 16)
    assert flops == 2 * 5 * 8 * 16
    assert nbytes == 2 * (5 * 16 + 5 * 8 + 2 * 16 * 8)


def test_store_under_next_from_256_tokens_per_expert_on_128_row_tiles():
    assert hg.store_under_next(configs.LARGE, 16384, 64)  # 256 per expert
    assert not hg.store_under_next(configs.LARGE, 16383, 64)
    assert hg.store_under_next(configs.LARGE_C2, 4096, 8) and hg.store_under_next(configs.MEDIUM, 4096, 8)
    assert not hg.store_under_next(configs.LARGE, 4096, 32)  # 128 per expert: waits on memory
    assert not hg.store_under_next(configs.SMALL, 16384, 8)  # 64-row tiles: never


def test_store_gains_by_hand():
    def row(config, tokens, groups, between, under, torch_ms):
        return {"config": config, "tokens": tokens, "groups": groups, "between_ms": between, "under_ms": under,
                "torch_ms": torch_ms, "under_gain": between / under, "vs_torch_between": torch_ms / between}
    doc = {"device": "GPU", "rows": [row("128x256 c2x1 m8 s4", 4096, 8, 1.02, 1.00, 1.1),  # 512 per expert: on
                                     row("128x256 c1x1 m8 s4", 4096, 32, 1.00, 1.01, 1.3),  # 128: off
                                     row("64x128 c1x1 m8 s8", 64, 8, 1.00, 0.99, 1.2)]}  # 64-row: neither
    got = mg.store_gains(doc)
    assert got["on"] == {"sets": 1, "geomean": pytest.approx(1.02), "min": pytest.approx(1.02),
                         "max": pytest.approx(1.02), "faster": 1}
    assert got["off"]["sets"] == 1 and got["off"]["faster"] == 0 and got["off"]["min"] == pytest.approx(1 / 1.01)
    assert got["vs_torch_between"] == pytest.approx((1.1 / 1.02 * 1.3 * 1.2) ** (1 / 3))
    assert got["vs_torch_rule"] == pytest.approx((1.1 * 1.3 * 1.2) ** (1 / 3))  # under only where the rule says
    line = gt.overlap_line(doc)
    assert "from 256 tokens per expert (1 sets): geomean 1.020, 1.020 to 1.020, 1 faster; below (1 sets): 0.990" in line
    assert line.endswith(f"{(1.1 / 1.02 * 1.3 * 1.2) ** (1 / 3):.3f}x with the store between main loops, "
                         f"{(1.1 * 1.3 * 1.2) ** (1 / 3):.3f}x with it where the rule puts it")


@pytest.mark.parametrize("gpu", ["H100", "H200"])
def test_store_under_next_threshold_on_its_stored_data(gpu):
    """The stored ``overlap`` runs are the rule's data: where it turns the store under the next main loop on, that
    is faster (geomean over 1 %, at most one set of 16 not faster); where it leaves it off, no set would gain 1.5 %."""
    from gemmlab.measure.bench import load_results
    slug = {"H100": "nvidia-h100-80gb-hbm3", "H200": "nvidia-h200"}[gpu]
    doc = load_results("grouped_gemm_overlap", slug)
    if doc is None:
        pytest.skip(f"no stored overlap run for the {gpu}")
    got = mg.store_gains(doc)
    assert got["on"]["sets"] == 16 and got["on"]["geomean"] > 1.01 and got["on"]["faster"] >= 15
    assert got["off"]["sets"] == 20 and got["off"]["max"] < 1.015
    assert got["vs_torch_rule"] > got["vs_torch_between"]


def test_expert_bounds_by_hand():
    # N = K = 1000, BF16, 1 TFLOP/s and 5 GB/s: the expert of 100 rows waits on its bytes (2.4 MB: 0.48 ms against
    # 0.256 ms of its 128 padded rows), the one of 300 on its compute (384 rows: 0.768 ms against 3.2 MB, 0.64 ms)
    serial, overlapped = mg.expert_bounds([0, 100, 300], 1000, 1000, tflops=1.0, tbs=0.005)
    assert serial == pytest.approx(0.48 + 0.768)
    assert overlapped == pytest.approx(max(0.256 + 0.768, 0.48 + 0.64))
    serial, _ = mg.expert_bounds([300], 1000, 1000, tflops=1.0, tbs=0.005, unit_rows=256)
    assert serial == pytest.approx(0.512 * 2)  # 512 rows in units of 256


def test_expert_bound_rows_and_lines():
    rows = [{"shape": "S", "n": 512, "k": 256, "groups": 8, "tokens": 4096, "config": cfg, "gemmlab_kernel_ms": 0.1}
            for cfg in ("128x256 c1x1 m8 s4", "128x256 c2x1 m8 s4", "64x128 c1x1 m8 s8")]
    doc = {"device": "GPU", "rows": rows, "measured": {"gemm_tflops": 700.0, "copy_tbs": 3.0}}
    got = mg.expert_bound_rows(doc)
    assert [g["row"]["config"] for g in got] == ["128x256 c1x1 m8 s4", "128x256 c2x1 m8 s4"]  # 128 x 256 only
    sizes = gm.skewed_sizes(4096, 8)
    for g, unit in zip(got, (128, 256)):
        serial, overlapped = mg.expert_bounds(sizes, 512, 256, 700.0, 3.0, unit_rows=unit)
        assert g["serial_ms"] == serial and g["overlapped_ms"] == overlapped
        assert g["measured_over_serial"] == pytest.approx(0.1 / serial)
    lines = gt.expert_bound_lines(doc, most=1).splitlines()
    assert len(lines) == 2 and lines[0].startswith("GPU: 2 sets of 128 x 256 tiles; kernel time over the experts")


def test_kernel_and_mixed_lines_by_hand():
    rows = [{"vs_torch_kernel": 1.21, "mixed": True}, {"vs_torch_kernel": 1.0, "mixed": False}]
    doc = {"device": "GPU", "date": "2026-01-02 03:04", "rows": rows,
           "summary": {"geomean_vs_torch_kernel": 1.1, "min_vs_torch_kernel": 1.0}}
    assert gt.kernel_lines(doc) == ("GPU (2026-01-02): kernel time vs torch._grouped_mm over 2 sets: geomean 1.100x, "
                                    "lowest 1.000x; the 1 sets in the mixed order 1.210x")
    rows = [{"burst128_gain": 1.1, "burst64_gain": 0.9}, {"burst128_gain": 1.0, "burst64_gain": 0.9}]
    assert gt.mixed_lines({"device": "GPU", "rows": rows}) == (
        "GPU, 2 sets, the mixed order over the kernel without it: blocks of 64: 0.900x (0.900-0.900, 0 faster); "
        "blocks of 128: 1.049x (1.000-1.100, 1 faster)")


def test_fences_lines_by_hand():
    rows = [{"shape": "S", "groups": 4, "tokens": 64, "fenced_ms": 2.0, "unfenced_ms": 1.5, "measured_floor_ms": 1.8,
             "rel_err_fenced": [1e-3, 2e-3], "rel_err_unfenced": [0.5, float("inf")]},
            {"shape": "T", "groups": 8, "tokens": 512, "fenced_ms": 1.0, "unfenced_ms": 1.1, "measured_floor_ms": 0.5,
             "rel_err_fenced": [1e-3], "rel_err_unfenced": [0.25]}]
    lines = gt.fences_lines({"device": "GPU", "rows": rows}).splitlines()
    assert lines[0] == "GPU: the kernel with and without the descriptor fences"
    assert lines[1] == ("  S, 4 experts, 64 tokens: fenced 2.00 ms (error 2.0e-03), unfenced 1.50 ms "
                        "(non-finite values in the output), 0.83 of the floor")
    assert lines[2].endswith("unfenced 1.10 ms (error 2.5e-01), 2.20 of the floor")


def test_stored_fences_run_is_wrong_and_under_its_floor():
    """Chapter 08's claim from the stored H100 run: the unfenced kernel's output is wrong on every set and on at
    least one it finished in less time than reading its bytes once takes."""
    from gemmlab.measure.bench import load_results
    doc = load_results("grouped_gemm_fences", "nvidia-h100-80gb-hbm3")
    if doc is None:
        pytest.skip("no stored fences run for the H100")
    rows = doc["rows"]
    assert all(max(r["rel_err_fenced"]) < 1e-2 for r in rows)
    assert all(min(r["rel_err_unfenced"]) > 1e-2 for r in rows)
    assert min(r["unfenced_ms"] / r["measured_floor_ms"] for r in rows) < 1.0


@pytest.mark.parametrize("gpu", ["H100", "H200"])
def test_stored_mixed_runs_back_the_block_size(gpu):
    """MIXED_BURST is the fastest block size each GPU measured, and the mixed order in it beats the kernel without
    it as a geomean over the sets where mixed_rows turns it on (on the H100, on every one of them)."""
    from gemmlab.measure.bench import load_results
    slug = {"H100": "nvidia-h100-80gb-hbm3", "H200": "nvidia-h200"}[gpu]
    doc = load_results("grouped_gemm_mixed", slug)
    if doc is None:
        pytest.skip(f"no stored mixed run for the {gpu}")
    rows = doc["rows"]
    assert rows and all(hg.mixed_rows(configs.LARGE, r["tokens"], r["groups"]) for r in rows)
    best = max(doc["summary"], key=lambda key: doc["summary"][key] if key.endswith("_gain") else 0)
    assert best == f"burst{hg.MIXED_BURST}_gain" and doc["summary"][best] > 1
    if gpu == "H100":
        assert all(r[best] > 1 for r in rows)
    assert doc["summary"]["worst_rel_err"] < 1e-2


@pytest.mark.parametrize("gpu", ["H100", "H200"])
def test_stored_kernel_runs_follow_the_rules(gpu):
    """The stored headline runs: the 64 sets, each with the tile and the mixed order the library picks today."""
    from gemmlab.measure.bench import load_results
    slug = {"H100": "nvidia-h100-80gb-hbm3", "H200": "nvidia-h200"}[gpu]
    doc = load_results("grouped_gemm_kernel", slug)
    if doc is None:
        pytest.skip(f"no stored kernel run for the {gpu}")
    rows = doc["rows"]
    assert len(rows) == 64 and all(r["rel_err"] < 1e-2 for r in rows)
    for r in rows:
        cfg = hg.config_for_gpu(gpu, r["tokens"], r["groups"], r["n"], r["k"])
        assert r["config"] == cfg.name
        assert r["mixed"] == bool(hg.mixed_rows(cfg, r["tokens"], r["groups"]))
    assert sum(r["mixed"] for r in rows) == 16


@pytest.mark.parametrize("gpu", ["H100", "H200"])
def test_stored_moe_runs_the_experts_as_if_one_after_another(gpu):
    """Chapter 08's model: on every set of 128 x 256 tiles the kernel takes within 0.95-1.10x of the experts' time
    one after another, and overlapping them would be worth 20 % or more somewhere."""
    from gemmlab.measure.bench import load_results
    slug = {"H100": "nvidia-h100-80gb-hbm3", "H200": "nvidia-h200"}[gpu]
    doc = load_results("grouped_gemm", slug)
    if doc is None:
        pytest.skip(f"no stored moe run for the {gpu}")
    got = mg.expert_bound_rows(doc)
    assert len(got) == 32
    assert all(0.95 < g["measured_over_serial"] < 1.10 for g in got)
    assert all(g["overlapped_over_serial"] <= 1.0 for g in got) and min(g["overlapped_over_serial"] for g in got) < 0.8


def test_choose_config_by_tokens_and_experts():
    choose = hg.choose_config
    assert choose(64, 8, 4096, 7168) is configs.SMALL  # decode: 8 per expert
    wide = configs.SMALL_WIDE
    assert choose(512, 32, 4096, 7168, decode=wide) is wide  # 16 per expert
    assert choose(512, 32, 3072, 7168, decode=wide) is wide  # 12 tiles of 256 per expert
    assert choose(512, 32, 2048, 7168, decode=wide) is configs.SMALL  # too narrow for the wide tile
    assert choose(512, 32, 2048, 7168, decode=configs.SMALL) is configs.SMALL
    assert choose(512, 8, 4096, 7168) is configs.MEDIUM  # 64 per expert, too few tokens in all
    assert choose(1900, 8, 4096, 7168) is configs.LARGE  # 237 per expert, too few tokens in all
    assert choose(4096, 128, 4096, 7168) is configs.LARGE  # 32 per expert
    assert choose(4096, 16, 4096, 7168, pairs_from=41) is configs.LARGE_C2
    assert choose(4096, 64, 4096, 7168, pairs_from=41) is configs.LARGE  # 64 experts: never pairs
    assert choose(4096, 64, 4096, 7168, pairs_from=512) is configs.LARGE  # 64 per expert
    assert choose(4096, 8, 4096, 7168, pairs_from=512) is configs.LARGE_C2  # 512 per expert, 8 experts
    assert choose(4096 * 4, 16, 4096, 7168, pairs_from=512) is configs.LARGE_C2  # 1024, 16 experts
    assert choose(16384, 32, 4096, 7168, pairs_from=512) is configs.LARGE  # 512 per expert, 32 experts
    assert choose(16384, 8, 4096, 7168) is configs.LARGE  # no pairs on GPUs not measured
    narrow = 2048 * 1024
    assert choose(4096, 128, 768, 2048, narrow_up_to=narrow) is configs.SMALL_WIDE  # Qwen3-30B-A3B's experts
    assert choose(4096, 64, 2048, 1024, narrow_up_to=narrow) is configs.SMALL_WIDE  # OLMoE's: just at the limit
    assert choose(4096, 64, 2048, 1032, narrow_up_to=narrow) is configs.LARGE  # one k-step of 8 past it
    assert choose(8191, 64, 2048, 1024, narrow_up_to=narrow) is configs.SMALL_WIDE  # below the token limit
    assert choose(8192, 64, 2048, 1024, narrow_up_to=narrow) is configs.LARGE  # from it: 128 x 256 (16384 measured)
    assert choose(1024, 16, 768, 2048, narrow_up_to=narrow) is configs.MEDIUM  # 64 per expert, too few tokens in all
    assert choose(4096, 128, 768, 2048) is configs.LARGE  # not measured: no narrow rule
    assert hg.config_for_gpu("H100", 4096, 128, 768, 2048) is configs.SMALL_WIDE
    assert hg.config_for_gpu("H200", 4096, 128, 768, 2048) is configs.LARGE


@pytest.mark.parametrize("gpu", ["H100", "H200"])
def test_heuristic_is_near_the_best_tile_of_its_sweep(gpu):
    """The stored sweep (every tile, static and dynamic) is the heuristic's data: on it the chosen tile must be
    within 1 % of the best per set as a geomean, and within 1.2x on every set."""
    from gemmlab.measure.bench import load_results
    slug = {"H100": "nvidia-h100-80gb-hbm3", "H200": "nvidia-h200"}[gpu]
    doc = load_results("grouped_gemm_sweep_sched", slug)
    if doc is None:
        pytest.skip(f"no stored sweep for the {gpu}")
    regret = [x for x, _ in mg.heuristic_regret(doc, gpu)]
    assert len(regret) == 64
    assert sum(map(math.log, regret)) / len(regret) < math.log(1.01)
    assert max(regret) < 1.2


def test_best_tile_ratio_by_hand():
    doc = {"configs": {"128x128 s5": {}, "128x128 c2 s6 dyn": {}, "128x256 s4 dyn": {}, "128x256 c2 s4": {}},
           "rows": [{"128x128 s5_ms": 3.0, "128x128 c2 s6 dyn_ms": 2.5, "128x256 s4 dyn_ms": 2.0, "128x256 c2 s4_ms": 2.2},
                    {"128x128 s5_ms": 1.0, "128x128 c2 s6 dyn_ms": 1.2, "128x256 s4 dyn_ms": 1.1, "128x256 c2 s4_ms": 1.25}]}
    got = mg.best_tile_ratio(doc, "128x128", "128x256")
    assert [round(x, 6) for x, _ in got] == [1.25, round(1.0 / 1.1, 6)]
    assert got[1][1] is doc["rows"][1]
    with pytest.raises(ValueError, match="no 64x64 tile"):
        mg.best_tile_ratio(doc, "64x64", "128x256")
    for r, (shape, g, t) in zip(doc["rows"], [("A", 8, 4096), ("B", 32, 16384)]):
        r.update(shape=shape, groups=g, tokens=t)
    line = gt.tile_ratio_line({**doc, "device": "GPU"})
    assert line.startswith("GPU: 128x128 at its best over 128x256 at its best, 2 sets: geomean ")
    assert f"geomean {(1.25 / 1.1) ** 0.5:.3f}, 0.909 to 1.250 (closest: B, 32 experts, 16384 tokens)" in line


def test_ping_pong_bound_by_hand():
    doc = {"configs": {"128x128 s5": {}, "128x256 s4 dyn": {}},
           "rows": [{"k": 2048, "128x128 s5_ms": 1.2, "128x256 s4 dyn_ms": 1.0},
                    {"k": 8192, "128x128 s5_ms": 1.2, "128x256 s4 dyn_ms": 1.0}]}
    got = [x for x, _ in mg.ping_pong_bound(doc, store_share=0.05)]
    assert got == pytest.approx([1.2 - 0.1, 1.2 - 0.025])
    for r, (shape, g, t) in zip(doc["rows"], [("A", 8, 4096), ("B", 32, 16384)]):
        r.update(shape=shape, groups=g, tokens=t)
    line = gt.ping_pong_line(doc)  # with the default share, 0.07: 1.2 - 0.14 and 1.2 - 0.035
    assert line.endswith(f"geomean {(1.06 * 1.165) ** 0.5:.3f} of our time, ahead of ours on 0 of 2 sets; "
                         "lowest 1.060 (A, 8 experts, 4096 tokens)")


@pytest.mark.parametrize("gpu,ahead", [("H100", 1), ("H200", 0)])
def test_stored_128x128_sweep_leaves_a_ping_pong_little_to_win(gpu, ahead):
    """Chapter 08's argument against a ping-pong kernel: a 128 x 128 tile (what one of its warpgroups would own) is
    slower at its best than the 128 x 256 tile on every one of the 32 sets of 4096 and 16384 tokens, and hiding its
    stores would put it ahead of ours on at most one H100 set, by under 3 %, and on no H200 set."""
    from gemmlab.measure.bench import load_results
    slug = {"H100": "nvidia-h100-80gb-hbm3", "H200": "nvidia-h200"}[gpu]
    doc = load_results("grouped_gemm_sweep_128x128", slug)
    if doc is None:
        pytest.skip(f"no stored 128 x 128 sweep for the {gpu}")
    ratios = [x for x, _ in mg.best_tile_ratio(doc, "128x128", "128x256")]
    assert len(ratios) == 32 and min(ratios) > 1.07
    bounds = [x for x, _ in mg.ping_pong_bound(doc)]
    assert sum(b < 1 for b in bounds) == ahead and min(bounds) > 0.97


def test_order_by_tokens_by_hand():
    rows = [{"tokens": 4096, "index_over_largest": 0.98}, {"tokens": 4096, "index_over_largest": 1.02 ** 2 / 0.98},
            {"tokens": 16384, "index_over_largest": 1.05}]
    got = mg.order_by_tokens(rows)
    assert list(got) == [4096, 16384]
    assert got[4096]["sets"] == 2 and got[4096]["largest_first_wins"] == 1
    assert got[4096]["geomean"] == pytest.approx(1.02) and got[16384]["geomean"] == pytest.approx(1.05)


@pytest.mark.parametrize("gpu", ["H100", "H200"])
def test_largest_first_threshold_between_the_measured_token_counts(gpu):
    """The stored ``order`` run is the threshold's data: index order faster (geomean) at every token count below
    it, largest first no slower than a 0.1 % tie from it on."""
    from gemmlab.measure.bench import load_results
    slug = {"H100": "nvidia-h100-80gb-hbm3", "H200": "nvidia-h200"}[gpu]
    doc = load_results("grouped_gemm_order", slug)
    if doc is None:
        pytest.skip(f"no stored order run for the {gpu}")
    by_tokens = mg.order_by_tokens(doc["rows"])
    below = [v["geomean"] for t, v in by_tokens.items() if t < hg.DYNAMIC_LARGEST_FIRST_FROM]
    above = [v["geomean"] for t, v in by_tokens.items() if t >= hg.DYNAMIC_LARGEST_FIRST_FROM]
    assert below and above
    assert max(below) < 1.0 and min(above) > 0.999


def test_sweeps_time_the_configs_the_heuristic_picks_under_the_names_it_looks_up(bench_script):
    mod = bench_script("grouped_gemm")
    assert len(mod.SWEEP_CONFIGS) == len(mod.SWEPT), "two swept entries share a column name"
    for cfg in (configs.SMALL, configs.SMALL_WIDE, configs.MEDIUM, configs.LARGE, configs.MEDIUM_C2, configs.LARGE_C2):
        name = mg.sweep_column(cfg, hg.dynamic_schedule(cfg))
        assert mod.swept_config(mod.SWEEP_CONFIGS[name]) == (cfg, hg.dynamic_schedule(cfg))
    for mode in mod.SWEEP_MODES.values():
        assert set(mode["configs"]) <= set(mod.SWEEP_CONFIGS)
    with pytest.raises(ValueError, match="not in SWEEP_CONFIGS"):
        mod.sweep(configs=("64x96 s7",))  # refused before any GPU work


def test_sweep_column_names():
    assert mg.sweep_column(configs.LARGE_C2, False) == "128x256 c2 s4"
    assert mg.sweep_column(configs.SMALL, True) == "64x128 s8 dyn"
    assert mg.sweep_column(configs.SMALL_WIDE, True) == "64x256 s5 dyn"


def test_decode_tile_and_pairs_by_gpu():
    assert hg.DECODE_TILE == {"H100": configs.SMALL, "H200": configs.SMALL_WIDE}
    assert hg.PAIRS_FROM == {"H100": 512, "H200": 512}
    assert hg.config_for_gpu("H200", 512, 32, 4096, 7168) is configs.SMALL_WIDE
    assert hg.config_for_gpu("H100", 512, 32, 4096, 7168) is configs.SMALL
    assert hg.config_for_gpu("H100", 4096, 8, 4096, 7168) is configs.LARGE_C2
    assert hg.config_for_gpu(None, 4096, 8, 4096, 7168) is configs.LARGE  # not measured: no pairs
    assert hg.config_for_gpu(None, 512, 32, 4096, 7168) is configs.SMALL


# ---------------------------------------------------------------- argument checks (before any launch)

def _cpu(rows=32, g=2, k=64, n=64, dtype=torch.bfloat16):
    a = torch.zeros(rows, k, dtype=dtype)
    b = torch.zeros(g, n, k, dtype=dtype).transpose(1, 2)
    offs = torch.tensor([rows // 2, rows][:g], dtype=torch.int32)
    return a, b, offs


@pytest.mark.parametrize("mutate, match", [
    (lambda a, b, o: (a.float(), b, o), "a must be bfloat16 or float16"),
    (lambda a, b, o: (a, b.half(), o), "b must be bfloat16"),
    (lambda a, b, o: (a, b, o.long()), "offs must be int32"),
    (lambda a, b, o: (a, b, o[:1]), r"offs must have shape \(2,\)"),
    (lambda a, b, o: (a, b[:, :32], o), "K must match"),
    (lambda a, b, o: (a[:, :60], b[:, :60], o), "multiples of 8"),
    (lambda a, b, o: (a.t().contiguous().t(), b, o), "contiguous rows"),
    (lambda a, b, o: (a, b[:, :, ::2], o), "dense along K or along N"),
    (lambda a, b, o: (a, b, torch.tensor([20, 10], dtype=torch.int32)), "non-decreasing"),
    (lambda a, b, o: (a, b, torch.tensor([10, 40], dtype=torch.int32)), "past the 32 rows"),
    (lambda a, b, o: (a, b, torch.tensor([-1, 10], dtype=torch.int32)), "non-decreasing"),
])
def test_bad_arguments_named(mutate, match):
    a, b, offs = mutate(*_cpu())
    with pytest.raises((TypeError, ValueError), match=match):
        problem.check_ragged(a, b, offs, None)


def test_offs_values_empty_groups_pass_and_the_first_bad_entry_is_named():
    problem.check_offs_values(torch.tensor([0, 0, 5, 5, 32], dtype=torch.int32), 32)  # empty groups are fine
    with pytest.raises(ValueError, match=r"offs\[2\] = 4 < offs\[1\] = 9"):
        problem.check_offs_values(torch.tensor([3, 9, 4, 32], dtype=torch.int32), 32)
    with pytest.raises(ValueError, match="offs\\[-1\\] = 33 is past the 32 rows"):
        problem.check_offs_values(torch.tensor([3, 9, 33], dtype=torch.int32), 32)


def test_bad_out_named():
    a, b, offs = _cpu()
    with pytest.raises(ValueError, match=r"out must have shape \(32, 64\)"):
        problem.check_ragged(a, b, offs, torch.zeros(32, 65, dtype=torch.bfloat16))


def test_cpu_tensors_rejected_before_launch(monkeypatch):
    """The course's order: the arguments, then the tier (the grouped kernel is Hopper's), then the device."""
    from gemmlab import tiers

    a, b, offs = _cpu()
    monkeypatch.setattr(api, "_GROUPED", {})
    monkeypatch.setattr(tiers, "detect_tier", lambda: "cpu")
    with pytest.raises(tiers.TierError, match="gemmlab.grouped_gemm needs tier sm90"):
        api.grouped_gemm(a, b, offs)
    monkeypatch.setattr(tiers, "detect_tier", lambda: "sm90")
    with pytest.raises(ValueError, match="the grouped GEMM runs on a CUDA device; the tensors are on cpu"):
        api.grouped_gemm(a, b, offs)
    with pytest.raises(ValueError, match="the grouped GEMM runs on a CUDA device; the tensors are on cpu"):
        api.grouped_gemm_list([(a, b[0])])


def test_b_layouts_recognised():
    _, b, _ = _cpu()
    assert problem.b_major_of("b", b) == "k"
    assert problem.b_major_of("b", b.contiguous()) == "n"


def test_list_form_checks():
    x = torch.zeros(8, 16, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="K must match"):
        api.grouped_gemm_list([(x, torch.zeros(8, 16, dtype=torch.bfloat16))])
    with pytest.raises(ValueError, match="same layout"):
        api.grouped_gemm_list([(x, torch.zeros(16, 16, dtype=torch.bfloat16)),
                               (x, torch.zeros(16, 16, dtype=torch.bfloat16).t().contiguous().t()[:, :8])])
    with pytest.raises(ValueError, match="at least one"):
        api.grouped_gemm_list([])


# ---------------------------------------------------------------- the descriptor update in PTX (compile only)

@pytest.fixture(scope="module")
def ragged_ptx():
    return ptx_of(compile_grouped("sm_90a", configs.SMALL, "ragged", "k"))


def _lines(ptx):
    return [l.strip() for l in ptx.splitlines() if l.strip() and not l.strip().startswith("//")]


def test_descriptor_update_sequence_in_program_order(ragged_ptx):
    lines = _lines(ragged_ptx)

    def first(pattern, start=0):
        for i in range(start, len(lines)):
            if re.search(pattern, lines[i]):
                return i
        raise AssertionError(f"{pattern} not found after line {start}")

    # producer: replace (address, sizes, strides) in shared memory -> publish with release -> acquire -> TMA load
    r = first(r"tensormap\.replace\.tile\.global_address\.shared::cta")
    d = first(r"tensormap\.replace\.tile\.global_dim\.shared::cta", r)
    s = first(r"tensormap\.replace\.tile\.global_stride\.shared::cta", r)
    p = first(r"tensormap\.cp_fenceproxy\.global\.shared::cta\.tensormap::generic\.release\.gpu\.sync\.aligned", r)
    q = first(r"fence\.proxy\.tensormap::generic\.acquire\.gpu", p)
    load = first(r"cp\.async\.bulk\.tensor\.2d\.shared::cta\.global", q)
    assert r < d < p and s < p < q < load


def test_every_tensor_gets_its_descriptor_rewritten(ragged_ptx):
    # A and B in the producer, C in the consumer: three publishes, three acquires
    assert len(re.findall(r"tensormap\.cp_fenceproxy", ragged_ptx)) == 3
    assert len(re.findall(r"fence\.proxy\.tensormap::generic\.acquire", ragged_ptx)) == 3
    assert len(re.findall(r"tensormap\.replace\.tile\.global_address", ragged_ptx)) == 3


def test_store_waits_for_earlier_stores_before_rewriting_c(ragged_ptx):
    lines = _lines(ragged_ptx)
    pubs = [i for i, l in enumerate(lines) if "tensormap.cp_fenceproxy" in l]
    c_pub = pubs[-1]  # the consumer's (C) publish comes after the producer's two in the kernel text
    replace_c = max(i for i, l in enumerate(lines[:c_pub]) if "tensormap.replace.tile.global_address" in l)
    waits = [i for i, l in enumerate(lines[:replace_c]) if re.search(r"cp\.async\.bulk\.wait_group\.read\s+0;", l)]
    assert waits, "no wait for earlier TMA stores before C's descriptor is rewritten"
    store = next(i for i in range(c_pub, len(lines)) if re.search(r"cp\.async\.bulk\.tensor\.2d\.global\.shared::cta", lines[i]))
    assert store > c_pub


def test_l2_promotion_written_into_the_templates_before_the_first_rewrite(ragged_ptx):
    from gemmlab.kernels.grouped_sm90 import L2_PROMOTION_SHIFT
    lines = _lines(ragged_ptx)
    value = 3 << L2_PROMOTION_SHIFT  # 256 bytes
    sets = [i for i, l in enumerate(lines) if re.match(rf"or\.b64\s.*,\s*{value};", l)]
    assert len(sets) == 2, "A's and B's template each get the 256-byte promotion"
    # each is stored back to byte 8 of its shared-memory copy, before the first tensormap.replace
    stores = [i for i, l in enumerate(lines) if re.match(r"st\.shared\.b64\s+\[%r\d+\+8\]", l)]
    first_replace = next(i for i, l in enumerate(lines) if l.startswith("tensormap.replace"))
    assert len(stores) == 2 and all(s < first_replace for s in stores) and sets[-1] < stores[-1]
    kept = _lines(ptx_of(compile_grouped("sm_90a", configs.SMALL, "ragged", "k", l2_promotion=None)))
    assert not any(re.match(r"st\.shared\.b64\s+\[%r\d+\+8\]", l) for l in kept)
    with pytest.raises(ValueError, match="l2_promotion"):
        compile_grouped("sm_90a", configs.SMALL, l2_promotion=4)


@pytest.mark.parametrize("mode", ["ragged", "table"])
@pytest.mark.parametrize("b_major", ["k", "n"])
@pytest.mark.parametrize("cfg", [configs.SMALL, configs.SMALL_WIDE, configs.LARGE, configs.LARGE_C2],
                         ids=["small", "small-wide", "large", "large-c2"])
def test_every_variant_compiles_for_sm90a(cfg, mode, b_major):
    ptx = ptx_of(compile_grouped("sm_90a", cfg, mode, b_major))
    assert "wgmma.mma_async.sync.aligned" in ptx
    assert "tensormap.cp_fenceproxy" in ptx


def test_kernel_fixes_its_register_count_at_entry():
    """`.minnctapersm 1` (min_blocks_per_mp=1): without it ptxas ignores setmaxnreg in the 64-row kernels and
    serialises their wgmmas. The PTX must carry it beside the setmaxnreg pair."""
    for cfg in (configs.SMALL, configs.LARGE):
        ptx = ptx_of(compile_grouped("sm_90a", cfg, "ragged", "k", dynamic=True))
        assert re.search(r"^\.minnctapersm 1$", ptx, re.M)
        assert "setmaxnreg.dec.sync.aligned.u32 \t40;" in ptx and "setmaxnreg.inc.sync.aligned.u32 \t232;" in ptx


def test_cluster_variant_multicasts_b_and_releases_both_ctas():
    ptx = ptx_of(compile_grouped("sm_90a", configs.LARGE_C2))
    # B's slice goes to both CTAs through the rewritten descriptor; A stays per CTA
    assert len(re.findall(r"cp\.async\.bulk\.tensor\.2d\.shared::cluster\.global\S*multicast::cluster", ptx)) == 1
    assert len(re.findall(r"cp\.async\.bulk\.tensor\.2d\.shared::cta\.global", ptx)) == 1
    assert "barrier.cluster.wait" in ptx  # peers' barriers initialised before the first multicast
    assert "mapa.shared::cluster" in ptx  # a consumer frees the stage in the peer CTA too
    single = ptx_of(compile_grouped("sm_90a", configs.LARGE))
    assert "multicast::cluster" not in single and "mapa" not in single


@pytest.mark.parametrize("cname", ["LARGE", "SMALL"])
def test_overlapped_store_runs_inside_the_next_main_loop(cname):
    """overlap_store: the previous tile's sub-tile stores (stmatrix + TMA store) sit between the wgmma batches
    of the next tile's main loop, one after each of its first tile_n / epi_n k-blocks; without it every store
    comes after the main loop's last batch."""
    cfg = getattr(configs, cname)
    epi_count = cfg.tile_n // cfg.epi_n

    def between_batches(ptx):
        lines = ptx_lines(ptx, r"^wgmma\.commit_group", r"^cp\.async\.bulk\.tensor\.2d\.global\.shared::cta",
                          r"^stmatrix")
        commits = [i for i, l in enumerate(lines) if l.startswith("wgmma.commit_group")]
        inside = lines[commits[0]:commits[-1]]
        return (sum(l.startswith("cp.async.bulk.tensor") for l in inside),
                sum(l.startswith("stmatrix") for l in inside), len(commits))
    stores, stm, commits = between_batches(ptx_of(compile_grouped("sm_90a", cfg, dynamic=True, overlap_store=True)))
    assert stores == epi_count and stm > 0
    assert commits == epi_count + 2  # the peeled first k-block, one per sub-tile, the loop's
    assert between_batches(ptx_of(compile_grouped("sm_90a", cfg, dynamic=True, overlap_store=False)))[:2] == (0, 0)


def test_mixed_order_by_hand():
    # 3 heavy tiles, 5 light, blocks of 4: H(1) = floor(4 * 3 / 8) = 1 heavy tile in block 0, then 3 light ones;
    # H(2) = 3: 2 heavy in block 1, then 2 light
    assert gm.mixed_order(3, 8, 4) == [(False, 0), (True, 3), (True, 4), (True, 5),
                                       (False, 1), (False, 2), (True, 6), (True, 7)]
    # blocks of 1: claim i is heavy when H(i + 1) > H(i), H(i) = floor(3 i / 5)
    assert gm.mixed_order(3, 5) == [(True, 3), (False, 0), (True, 4), (False, 1), (False, 2)]
    for heavy, total, burst in [(0, 7, 1), (7, 7, 3), (100, 164, 1), (13, 250, 16), (900, 2300, 128), (5, 64, 128)]:
        got = gm.mixed_order(heavy, total, burst)
        assert sorted(t for _, t in got) == list(range(total))  # every tile once
        light = [t for is_light, t in got if is_light]
        assert all(t >= heavy for t in light) and light == sorted(light)
        assert [t for is_light, t in got if not is_light] == list(range(heavy))
        for j in range(0, total, burst):  # each block: its share of heavy tiles, give or take one, and those first
            block = [is_light for is_light, _ in got[j:j + burst]]
            assert abs(block.count(False) - len(block) * heavy / total) <= 1
            assert block == sorted(block)


def test_mixed_rows_by_hand():
    rows = hg.mixed_rows
    assert rows(configs.LARGE, 4096, 32) == hg.MIXED_LIGHT_ROWS == 128  # 128 tokens per expert
    assert rows(configs.LARGE, 4095, 32) == 0 and rows(configs.LARGE, 4096, 64) == 0
    assert rows(configs.LARGE, 16384, 128) == 128
    for cfg in (configs.LARGE_C2, configs.MEDIUM, configs.SMALL, configs.SMALL_WIDE, configs.MEDIUM_C2):
        assert rows(cfg, 16384, 8) == 0  # pairs keep the static order; the others are not 128 x 256


def test_mixed_variant_compiles_with_more_producer_registers():
    ptx = ptx_of(compile_grouped("sm_90a", configs.LARGE, dynamic=True, overlap_store=True, mixed=256))
    # 8 registers move from the consumers to the producer: 128 x 48 + 256 x 224 stays within the 384 x 168 of
    # the launch (setmaxnreg.inc would wait forever for registers the CTA does not have)
    assert "setmaxnreg.dec.sync.aligned.u32 \t48;" in ptx and "setmaxnreg.inc.sync.aligned.u32 \t224;" in ptx
    plain = ptx_of(compile_grouped("sm_90a", configs.LARGE, dynamic=True))
    assert "setmaxnreg.dec.sync.aligned.u32 \t40;" in plain and "setmaxnreg.inc.sync.aligned.u32 \t232;" in plain
    with pytest.raises(ValueError, match="mixed: claiming"):
        compile_grouped("sm_90a", configs.LARGE_C2, mixed=256)
    with pytest.raises(ValueError, match="mixed: claiming"):
        compile_grouped("sm_90a", configs.LARGE, dynamic=False, mixed=256)
    with pytest.raises(ValueError, match="burst"):
        compile_grouped("sm_90a", configs.LARGE, dynamic=True, mixed=256, burst=0)


def test_compile_rejects_other_targets_and_clusters():
    with pytest.raises(ValueError, match="sm_90a"):
        compile_grouped("sm_100a", configs.SMALL)
    from gemmlab.family.configs import Sm90Config
    with pytest.raises(ValueError, match=r"clusters of 1 or 2 CTAs along M"):
        compile_grouped("sm_90a", Sm90Config(cluster=(1, 2)))
    with pytest.raises(ValueError, match="mode"):
        compile_grouped("sm_90a", configs.SMALL, mode="padded")


def test_grouped_smem_counts_what_the_kernel_allocates_beyond_the_dense_slack(no_compile):
    """128 x 128 with 6 stages fits the dense kernel (Sm90Config accepts it) but not the grouped one with dynamic
    scheduling and the largest-first order: the H100 refused that launch (cudaErrorInvalidValue) reporting 233,116
    bytes allocated against 232,448 allowed. The rule names the bytes before anything compiles; without the order
    tables (by_size False, as the pairs run) it fits."""
    from gemmlab.family.configs import Sm90Config, grouped_smem_bytes
    from gemmlab.hardware import SMEM_PER_BLOCK

    cfg = Sm90Config(tile_m=128, tile_n=128, stages=6, cluster=(1, 1))
    assert cfg.smem_bytes() <= SMEM_PER_BLOCK == 232448
    assert grouped_smem_bytes(cfg, by_size=True, dynamic=True) == 233116
    # the order and the sizes it is ranked from: 255 words each fewer; the ring's tile numbers: 5 fewer words
    assert grouped_smem_bytes(cfg, by_size=False, dynamic=True) == 233116 - 2 * 255 * 4
    assert grouped_smem_bytes(cfg, by_size=True, dynamic=False) == 233116 - 5 * 4
    assert grouped_smem_bytes(cfg, by_size=True, dynamic=True, mixed=True) == 233116 + 8
    with pytest.raises(ValueError, match=r"stages=6 needs 233116 bytes of shared memory in the grouped kernel"):
        compile_grouped("sm_90a", cfg, dynamic=True)
    with pytest.raises(AssertionError, match="compiled before"):  # the check passed: the compile was reached
        compile_grouped("sm_90a", cfg, dynamic=True, by_size=False)
    for tile in (configs.SMALL, configs.SMALL_WIDE, configs.MEDIUM, configs.LARGE, configs.LARGE_C2):
        assert grouped_smem_bytes(tile, by_size=True, dynamic=True, mixed=True) <= SMEM_PER_BLOCK, tile.name


# ---------------------------------------------------------------- on the GPU

def _ragged(sizes, n, k, major="k", seed=0, extra=0):
    return gm.random_problem(sizes, n, k, b_major=major, seed=seed, extra_rows=extra)


GPU_CASES = [
    ([256] * 4, 256, 512, "k", None),
    ([0, 300, 0, 0, 77, 0], 384, 256, "k", None),  # empty groups
    ([1, 7, 33, 63, 65, 2], 512, 512, "n", None),  # groups smaller than a tile, unaligned ends
    ([0, 3000, 0], 1024, 512, "k", None),  # one giant group
    ([3, 0, 11, 1] * 32, 256, 256, "k", None),  # many small groups
    ([200, 0, 130, 64], 384, 512, "k", "SMALL"),
    ([3, 1, 0, 9] * 4, 512, 512, "n", "LARGE"),
    ([130, 260], 256, 200, "k", None),  # K not a multiple of the 64-wide k-tile
    ([2, 0, 150] * 100, 256, 128, "k", "LARGE"),  # more groups than the ranked list holds: index order
    ([0, 300, 0, 77, 129, 5], 384, 256, "k", "LARGE_C2"),  # 2x1 clusters: odd m-tile counts, empty groups
    ([1, 7, 333, 63, 65, 2], 264, 136, "n", "MEDIUM_C2"),
    ([0, 700, 3, 0, 200, 1] * 3, 512, 256, "k", "LARGE"),  # dynamic scheduling (chosen for this tile)
    ([5, 0, 24, 1, 17, 64, 9] * 3, 1280, 384, "n", "SMALL_WIDE"),  # the wide decode tile: N not a multiple
    ([0, 700, 3, 0, 200, 1] * 3, 512, 256, "k", "LARGE_C2 dynamic"),  # pairs with the mailbox
    ([1, 7, 333, 63, 65, 2] * 4, 264, 136, "n", "MEDIUM_C2 dynamic"),
    ([0, 700, 3, 0, 200, 1] * 3, 512, 256, "k", "LARGE mixed"),  # light experts' tiles among the heavy ones'
    ([1500, 40, 90, 0, 300, 17, 60] * 4, 1024, 256, "n", "LARGE mixed5"),  # in blocks of 5 claims
    ([5, 9, 100] * 10, 384, 200, "k", "LARGE mixed1"),  # light only, blocks of 1
]


@pytest.mark.sm90
@pytest.mark.parametrize("variant", ["chosen", "other-order", "other-store"])
@pytest.mark.parametrize("sizes, n, k, major, cname", GPU_CASES)
def test_ragged_matches_fp32_reference(sizes, n, k, major, cname, variant):
    """The kernel as chosen, with the other visiting order, and with the store placed the other way
    (between main loops or under the next one, hg.store_under_next)."""
    a, b, offs = _ragged(sizes, n, k, major, seed=len(sizes), extra=16)
    out = torch.full((a.shape[0], n), float("nan"), device="cuda", dtype=torch.bfloat16)
    chosen = hg.default_config(a.shape[0], len(sizes), n, k, a.device)
    dynamic, mixed, burst = None, None, None
    if cname and cname.endswith(" dynamic"):
        cname, dynamic = cname.split()[0], True
    if cname and " mixed" in cname:
        cname, tag = cname.split()
        dynamic, mixed, burst = True, 128, int(tag[5:]) if tag[5:] else None
    cfg = getattr(configs, cname) if cname else chosen
    by_size = not hg.largest_first(cfg, a.shape[0], dynamic) if variant == "other-order" else None
    overlap = not hg.store_under_next(cfg, a.shape[0], len(sizes)) if variant == "other-store" else None
    api.grouped_gemm(a, b, offs, out=out, config=cfg, by_size=by_size, dynamic=dynamic, overlap_store=overlap,
                     mixed=mixed, burst=burst)
    rows = sum(sizes)
    ref = gm.reference(a, b, offs)
    got = out[:rows].float()
    assert torch.isfinite(got).all(), "rows of a group were left unwritten"
    err = ((got - ref[:rows]).norm() / ref[:rows].norm()).item()
    assert err < 1e-2
    assert torch.isnan(out[rows:]).all(), "rows past offs[-1] were written"


@pytest.mark.sm90
@pytest.mark.parametrize("cname", ["SMALL", "SMALL_WIDE", "MEDIUM", "LARGE", "LARGE_C2", "MEDIUM_C2"])
def test_dynamic_scheduling_many_launches_in_a_row(cname):
    """The tile counter must be back at 0 after every launch: 20 launches in a row, each checked."""
    from gemmlab.family.configs import sched_slot
    cfg = getattr(configs, cname)
    sizes = [1, 7, 33, 63, 65, 2] * 5
    a, b, offs = _ragged(sizes, 512, 256, seed=3, extra=16)
    ref = gm.reference(a, b, offs)
    outs = [torch.full((a.shape[0], 512), float("nan"), device="cuda", dtype=torch.bfloat16) for _ in range(20)]
    for o in outs:
        api.grouped_gemm(a, b, offs, out=o, config=cfg, dynamic=True)
    torch.cuda.synchronize()
    rows = sum(sizes)
    for o in outs:
        assert torch.isfinite(o[:rows]).all() and torch.isnan(o[rows:]).all()
        assert ((o[:rows].float() - ref[:rows]).norm() / ref[:rows].norm()).item() < 1e-2
    (ws,) = [w for key, w in plan._WORKSPACES.items() if key[0] == a.device and w.shape[1] == sched_slot(cfg) + 1]
    assert ws[0, sched_slot(cfg), :2].tolist() == [0, 0]


@pytest.mark.sm90
@pytest.mark.parametrize("cname", ["SMALL", "SMALL_WIDE", "MEDIUM", "LARGE", "LARGE_C2"])
@pytest.mark.parametrize("dynamic", [False, True])
def test_many_one_k_block_groups(cname, dynamic):
    """Hundreds of groups of one k-block (K = 64) and a few rows: a CTA changes group at almost every tile, so
    its descriptor slots are rewritten as fast as its loads are issued (the case where two A/B slots were not
    enough). Every group's rows must match the FP32 reference; rows past offs[-1] stay untouched."""
    cfg = getattr(configs, cname)
    sizes = [1, 3, 0, 2, 5, 1, 4] * 60  # 420 groups (more than ORDER_MAX: index order beyond the ranked list)
    for k in (64, 128):  # one and two k-blocks per tile
        a, b, offs = _ragged(sizes, 256, k, seed=k, extra=16)
        out = torch.full((a.shape[0], 256), float("nan"), device="cuda", dtype=torch.bfloat16)
        api.grouped_gemm(a, b, offs, out=out, config=cfg, dynamic=dynamic)
        rows = sum(sizes)
        ref = gm.reference(a, b, offs)
        got = out[:rows].float()
        assert torch.isfinite(got).all(), "rows of a group were left unwritten"
        assert ((got - ref[:rows]).norm() / ref[:rows].norm()).item() < 1e-2
        assert torch.isnan(out[rows:]).all()


@pytest.mark.sm90
def test_matches_torch_grouped_mm():
    a, b, offs = _ragged([64, 0, 128, 32], 256, 256)
    ours = api.grouped_gemm(a, b, offs)
    theirs = torch._grouped_mm(a, b, offs=offs)
    assert (ours.float() - theirs.float()).abs().max().item() <= 0.02 * theirs.float().abs().max().item()


@pytest.mark.sm90
@pytest.mark.parametrize("major", ["k", "n"])
def test_list_form_matches_reference(major):
    pairs = gm.random_pairs(gm.LIST_SHAPES, b_major=major, seed=5)
    outs = [torch.full((a.shape[0], b.shape[1]), float("nan"), device="cuda", dtype=torch.bfloat16)
            for a, b in pairs]
    api.grouped_gemm_list(pairs, outs)
    for (a, b), c in zip(pairs, outs):
        if a.shape[0]:
            ref = a.float() @ b.float()
            assert ((c.float() - ref).norm() / ref.norm()).item() < 1e-2


@pytest.mark.sm90
def test_l2_promotion_where_the_driver_puts_it():
    """The driver's own encoding differs only in bits 17-18 of word 1; our published descriptors carry 256 B."""
    import cuda.bindings.driver as drv
    from gemmlab.kernels.grouped_sm90 import L2_PROMOTION_SHIFT, L2_PROMOTION_WORD
    t = torch.empty((256, 256), dtype=torch.bfloat16, device="cuda")
    words = []
    for promo in range(4):
        res, tmap = drv.cuTensorMapEncodeTiled(
            drv.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, drv.cuuint32_t(2), t.data_ptr(),
            [drv.cuuint64_t(256)] * 2, [drv.cuuint64_t(512)], [drv.cuuint32_t(64), drv.cuuint32_t(128)],
            [drv.cuuint32_t(1)] * 2, drv.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
            drv.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B, drv.CUtensorMapL2promotion(promo),
            drv.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE)
        assert res == drv.CUresult.CUDA_SUCCESS
        words.append([int(w) for w in tmap.opaque])
    for promo in range(4):
        diff = [i for i in range(16) if words[promo][i] != words[0][i]]
        assert diff == ([L2_PROMOTION_WORD] if promo else [])
        assert (words[promo][L2_PROMOTION_WORD] >> L2_PROMOTION_SHIFT) & 3 == promo

    from gemmlab.family.configs import ab_slots
    a, b, offs = _ragged([40, 0, 70], 256, 256)
    ab = 2 * ab_slots(hg.default_config(a.shape[0], 3, 256, 256, a.device))  # the A and B slots
    for promo, expect in ((hg.L2_PROMOTION, 3), (None, 2)):  # None: the DSL's template (128 B)
        plan._WORKSPACES.clear()
        api._GROUPED.clear()  # the plans hold their workspaces: make the call build a fresh one
        api.grouped_gemm(a, b, offs, l2_promotion=promo)
        torch.cuda.synchronize()
        (ws,) = plan._WORKSPACES.values()
        published = [w for w in ws[:, :ab, L2_PROMOTION_WORD].flatten().tolist() if w]  # A and B slots in use
        assert published and {(w >> L2_PROMOTION_SHIFT) & 3 for w in published} == {expect}


@pytest.mark.sm90
def test_bad_offs_clamped_without_validation():
    a, b, offs = _ragged([64, 64], 128, 128)
    bad = torch.tensor([100, 10_000], dtype=torch.int32, device="cuda")
    with pytest.raises(ValueError, match="past the 128 rows"):
        api.grouped_gemm(a, b, bad, validate="sync")
    out = api.grouped_gemm(a, b, bad, validate=False)  # clamped: no fault, rows 0..127 written
    api.check_grouped_offs()  # nothing reported: validate=False asks the kernel for no check
    assert out.shape == (128, 128)


def _expected(a, b, offs_list):
    ref, start = torch.full((a.shape[0], b.shape[2]), float("nan"), device=a.device), 0
    for g, end in enumerate(offs_list):
        ref[start:end] = a[start:end].float() @ b[g].float()
        start = end
    return ref


@pytest.mark.sm90
@pytest.mark.parametrize("bad, first, rule", [
    ([30, 20, 128], 1, r"offs must be non-decreasing from 0: offs\[1\] = 20 < offs\[0\] = 30"),
    ([-5, 64, 128], 0, r"offs\[0\] = -5 < 0"),
    ([64, 100, 10_000], 2, r"offs\[2\] = 10000 is past the 128 rows of a"),
    ([8] * 40 + [7] + [128] * 3, 40, r"offs\[40\] = 7 < offs\[39\] = 8"),  # past the first 32 lanes
])
def test_the_kernel_checks_offs_and_the_next_call_raises(bad, first, rule):
    """The default call checks offs on the GPU: no round trip, the finding raised by the next call (or
    check_grouped_offs), the bad call's kernel confined to the clamped rows (it never faults)."""
    groups = len(bad)
    sizes = [128 // groups] * groups
    sizes[-1] += 128 - sum(sizes)
    a, b, offs = _ragged(sizes, 128, 128)
    good = offs.clone()
    api.check_grouped_offs()  # nothing pending from an earlier test
    out = torch.full((128, 128), float("nan"), dtype=a.dtype, device="cuda")
    api.grouped_gemm(a, b, torch.tensor(bad, dtype=torch.int32, device="cuda"), out)  # returns: no wait
    torch.cuda.synchronize()
    # The groups before the bad one are right up to where a later group's clamped start reaches back (group g
    # starts at offs[g - 1] clamped to [0, rows]: a decreasing offs makes two groups write the same rows, inside c).
    rows = min(max(x, 0) for x in bad[first - 1:]) if first else 0
    if rows:
        ref = _expected(a, b, bad[:first])
        assert torch.allclose(out[:rows].float(), ref[:rows], rtol=2e-2, atol=2e-2)
    before = out.clone()
    with pytest.raises(ValueError, match=rule):
        api.grouped_gemm(a, b, good, out)  # the next call on the device raises the finding, before its launch
    torch.cuda.synchronize()
    assert torch.equal(out.isnan(), before.isnan()) and torch.equal(out.nan_to_num(), before.nan_to_num())
    api.check_grouped_offs()  # the report was emptied by the raise
    again = api.grouped_gemm(a, b, good)
    api.check_grouped_offs()
    assert torch.allclose(again.float(), _expected(a, b, good.tolist()), rtol=2e-2, atol=2e-2)


@pytest.mark.sm90
def test_check_grouped_offs_waits_and_raises():
    a, b, offs = _ragged([64, 64], 128, 128)
    api.check_grouped_offs()
    api.grouped_gemm(a, b, torch.tensor([64, 129], dtype=torch.int32, device="cuda"))
    with pytest.raises(ValueError, match=r"offs\[1\] = 129 is past the 128 rows"):
        api.check_grouped_offs()
    api.check_grouped_offs()  # reported once


def test_exercise_solutions_by_hand(ragged_ptx):
    from gemmlab.compile import ptx_opcodes
    from gemmlab.course.exercises import ch08

    assert ch08.solution_tiles_and_rewrites() == (3 * 4 + 1 * 4 + 5 * 4, 3)
    broken = ptx_of(compile_grouped("sm_90a", configs.SMALL, "ragged", "k", fences=False))
    names = lambda ptx: {op for op in ptx_opcodes(ptx, r"^tensormap\.", r"^fence\.proxy\.tensormap")}
    vanished = names(ragged_ptx) - names(broken)
    assert {v.split(".global")[0].split(".gpu")[0] for v in vanished} == ch08.solution_fence_instructions()
    assert names(broken) and all(n.startswith("tensormap.replace") for n in names(broken))
    assert ch08.solution_decode_floor_us() == round(23 * 4096 * 7168 * 2 / 3.35e12 * 1e6)
    assert ch08.solution_pair_waste() == (1 + 1 + 1) * 4  # 520, 70 and 300 rows: an odd count of M-tiles each
    assert sum(len(t) for t in gm.tile_order(**ch08.PAIR_PROBLEM)) == (3 + 1 + 2) * 2 * 4
    assert ch08.solution_roofline_launch_us() == 288  # 16 + (0.85 * 16 / (1 - 0.85 / 0.9)) / 0.9, by hand
    assert ch08.check_roofline_launch_us(287) and not ch08.check_roofline_launch_us(245)
