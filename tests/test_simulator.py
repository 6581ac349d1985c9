"""The pipeline timeline simulator: closed forms worked out by hand, the two designs, drawing."""
import pytest

from gemmlab import figures
from gemmlab import simulator as sm


def test_one_stage_serialises_everything():
    # Nothing overlaps: each item is issue + load + compute, one after another.
    assert sm.simulate(1, (1, 10), 3, 1).total == 10 * (3 + 1)
    assert sm.simulate(1, (2, 5), 4, 2, issue_time=1).total == 10 * (1 + 4 + 2)


@pytest.mark.parametrize("issue,compute", [(0.0, 1.0), (0.5, 1.0), (2.0, 1.0)])
def test_many_stages_pay_latency_once(issue, compute):
    n, lat = 10, 3.0
    tl = sm.simulate(16, (1, n), lat, compute, issue_time=issue)
    assert tl.total == pytest.approx(issue + lat + compute + (n - 1) * max(issue, compute))


def test_stages_shorten_until_the_ring_covers_the_latency():
    totals = [sm.simulate(s, (1, 20), 3, 1).total for s in (1, 2, 3, 4, 5)]
    assert totals == sorted(totals, reverse=True)
    # Four stages of compute 1 cover a latency of 3: latency once, then back to back.
    assert totals[3] == totals[4] == 3 + 20


def test_unrolled_tail_bubble_k5_stages4_by_hand():
    # load 3, compute 1, 4 stages: the ring is exactly deep enough (4 x 1 = 3 + 1), so the
    # carried design has no bubble: 3 + 10 = 13 for two tiles of 5.
    carried = sm.simulate(4, (2, 5), 3, 1, design="carried")
    assert carried.total == 13 and carried.bubble_time == 0 and carried.bubbles == []
    # Unrolled: tile 0's item 4 sits alone in stage 0 of group 1 (consumed 7..8); stages 1-3 are
    # walked empty, so tile 1's four loads are issued only at 8 (stage 0 freed), land at 11.
    unrolled = sm.simulate(4, (2, 5), 3, 1, design="unrolled")
    assert [(b.start, b.end) for b in unrolled.bubbles] == [(8.0, 11.0)]
    assert unrolled.bubble_time == 3  # = load_time, once per tile boundary
    assert unrolled.total == 16
    # Three tiles: two boundaries.
    assert sm.simulate(4, (3, 5), 3, 1, design="unrolled").bubble_time == 6


def test_unrolled_equals_carried_when_stages_divide_k():
    for k in (4, 8):
        a = sm.simulate(4, (3, k), 3, 1, design="carried")
        b = sm.simulate(4, (3, k), 3, 1, design="unrolled")
        assert a.total == b.total and b.bubble_time == 0


def test_unrolled_skips_are_recorded_with_their_stages():
    tl = sm.simulate(4, (1, 5), 3, 1, design="unrolled")
    skips = [e for e in tl.lane("consumer 0") if e.what == "skip"]
    assert [e.stage for e in skips] == [1, 2, 3]
    assert all(e.duration == 0 and e.k is None for e in skips)
    loads = tl.lane("tma")
    assert [(e.stage, e.k) for e in loads] == [(0, 0), (1, 1), (2, 2), (3, 3), (0, 4)]


def test_phases_follow_pipeline_state():
    from gemmlab.pipeline import PipelineState

    tl = sm.simulate(3, (2, 4), 2, 1)
    cons = PipelineState.consumer(3)
    for e in [e for e in tl.lane("consumer 0") if e.what == "compute"]:
        assert (e.stage, e.phase) == (cons.index, cons.phase)
        cons.advance()


def test_transfer_time_limits_bandwidth():
    tl = sm.simulate(8, (1, 20), 3, 0.5, transfer_time=1.0)
    lands = [e.end for e in tl.lane("tma")]
    assert all(b - a >= 1.0 - 1e-12 for a, b in zip(lands, lands[1:]))
    assert tl.total == pytest.approx(3 + 19 * 1.0 + 0.5)


def test_consumers_release_together():
    one = sm.simulate(2, (1, 6), 3, 1)
    two = sm.simulate(2, (1, 6), 3, 1, consumers=2)
    assert two.total == one.total  # both consumers read every stage in lockstep
    assert len(two.lane("consumer 1")) == len(one.lane("consumer 0"))


def test_epilogue_inline_and_overlapped():
    inline = sm.simulate(4, (4, 8), 3, 1, epilogue_time=2)
    assert inline.total == 3 + 32 + 4 * 2  # the epilogue stalls the consumer; loads keep landing meanwhile
    over = sm.simulate(4, (4, 8), 3, 1, epilogue_time=2, epilogue="overlapped")
    assert over.total == 3 + 32 + 2  # only the last tile's epilogue shows
    assert over.busy("epilogue") == 8
    # An epilogue longer than a tile's main loop: one accumulator buffer stalls, two hide part of it.
    one = sm.simulate(4, (4, 2), 3, 1, epilogue_time=5, epilogue="overlapped", acc_stages=1)
    two = sm.simulate(4, (4, 2), 3, 1, epilogue_time=5, epilogue="overlapped", acc_stages=2)
    assert two.total < one.total


def test_list_of_tiles_and_ideal():
    tl = sm.simulate(4, [3, 5, 2], 3, 1)
    assert tl.n_slots == 10 and tl.total == 13 and tl.ideal == 13


def test_sweep_rows():
    rows = sm.sweep_stages((1, 2, 4), (2, 5), 3, 1)
    assert [(r["stages"], r["design"]) for r in rows] == [(s, d) for s in (1, 2, 4) for d in sm.DESIGNS]
    by = {(r["stages"], r["design"]): r["total"] for r in rows}
    assert by[(4, "unrolled")] > by[(4, "carried")]
    assert by[(1, "unrolled")] == by[(1, "carried")]  # one stage: every slot is used, no tail


def test_errors():
    with pytest.raises(ValueError, match="stages must be >= 1"):
        sm.simulate(0, (1, 1), 1, 1)
    with pytest.raises(ValueError, match="design must be one of"):
        sm.simulate(2, (1, 1), 1, 1, design="reset")
    with pytest.raises(TypeError, match="tiles must be"):
        sm.simulate(2, 5, 1, 1)
    with pytest.raises(ValueError, match="tiles\\[i\\]"):
        sm.simulate(2, [3, 0], 1, 1)
    with pytest.raises(ValueError, match="load_time must be >= 0"):
        sm.simulate(2, (1, 1), -1, 1)
    with pytest.raises(TypeError, match="compute_time must be a number"):
        sm.simulate(2, (1, 1), 1, "1")
    with pytest.raises(TypeError, match="timelines must be"):
        sm.draw_timeline([1], "x")


def test_drawings_are_written(tmp_path, monkeypatch):
    monkeypatch.setattr(figures, "FIGURES_DIR", tmp_path)
    tls = [sm.simulate(4, (3, 5), 3, 1, design=d) for d in sm.DESIGNS]
    p = sm.draw_timeline(tls, "05_t")
    q = sm.draw_timeline(sm.simulate(2, (2, 3), 2, 1, epilogue_time=1, epilogue="overlapped"), "05_u")
    r = sm.draw_stage_model(sm.sweep_stages((1, 2, 4), (2, 5), 3, 1), "05_v")
    for path, name in ((p, "05_t"), (q, "05_u"), (r, "05_v")):
        assert path.endswith(f"{name}.png") and (tmp_path / f"{name}.png").stat().st_size > 1000
    with pytest.raises(ValueError, match="titles must have one entry per timeline"):
        sm.draw_timeline(tls, "05_w", titles=["one"])


def test_fit_ring_recovers_load_and_compute():
    # One stage: load + compute per item; a deep ring: compute per item.
    one = sm.simulate(1, (4, 5), 3, 1).total / 20
    deep = sm.simulate(8, (40, 5), 3, 1).total / 200  # fill latency amortised over many items
    load, compute = sm.fit_ring(one, 1.0)
    assert (load, compute) == (3.0, 1.0) and deep == pytest.approx(1.0, abs=0.02)
    with pytest.raises(ValueError, match="deep_ring_item must be <= one_stage_item"):
        sm.fit_ring(1.0, 2.0)
    with pytest.raises(ValueError, match="one_stage_item must be > 0"):
        sm.fit_ring(0, 0)


def test_predict_designs_by_hand():
    # The hand-worked case: two tiles of 5, 4 stages, load 3, compute 1: 13 against 16.
    p = sm.predict_designs(4, (2, 5), 3, 1)
    assert p == {"carried": 13.0, "unrolled": 16.0, "extra": 3.0, "extra per tile": 1.5}
    # n tiles: n - 1 boundaries of one load latency each, when the ring is just deep enough.
    assert sm.predict_designs(4, (8, 5), 3, 1)["extra"] == pytest.approx(7 * 3)
    # No tail (stages divides k): nothing to predict.
    assert sm.predict_designs(2, (8, 4), 3, 1)["extra"] == 0
    # A shallow ring (2 stages, k = 3): both stall, the unrolled design more.
    p = sm.predict_designs(2, (8, 3), 3, 1)
    assert p["carried"] > 3 + 24 and p["extra"] > 0


@pytest.mark.parametrize("name", ["load_time", "compute_time", "issue_time", "transfer_time", "epilogue_time"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_simulate_rejects_non_finite_durations(name, bad):
    kw = {"load_time": 3.0, "compute_time": 1.0, name: bad}
    with pytest.raises(ValueError, match=f"{name} must be a finite number"):
        sm.simulate(2, (1, 4), **kw)
