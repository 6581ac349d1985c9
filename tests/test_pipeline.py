"""Chapter 02: PipelineState, the ring simulation and the GPU ring."""
import re

import pytest
import torch

from gemmlab import figures, pipeline as pl
from gemmlab.compile import ptx_lines
from gemmlab.mbarrier import mbarrier_instructions
from gemmlab.tiers import TierError, detect_tier

# ---------------------------------------------------------------- PipelineState (CPU)


def test_state_hand_worked_three_stages():
    st = pl.PipelineState(3)
    seen = []
    for _ in range(7):
        seen.append((st.index, st.phase))
        st.advance()
    # 0 1 2 | wrap: phase flips | 0 1 2 | wrap again | 0
    assert seen == [(0, 0), (1, 0), (2, 0), (0, 1), (1, 1), (2, 1), (0, 0)]
    # after 7 advances: index 7 % 3 = 1, phase flipped 7 // 3 = 2 times -> 0
    assert st.as_tuple() == (1, 0, 7)


def test_producer_starts_at_phase_one():
    p, c = pl.PipelineState.producer(3), pl.PipelineState.consumer(3)
    assert (p.index, p.phase) == (0, 1) and (c.index, c.phase) == (0, 0)
    for _ in range(7):
        p.advance()
    assert p.as_tuple() == (1, 1, 7)


def test_single_stage_flips_every_step():
    st = pl.PipelineState(1)
    phases = []
    for _ in range(4):
        phases.append(st.phase)
        st.advance()
        assert st.index == 0
    assert phases == [0, 1, 0, 1]


@pytest.mark.parametrize("stages", [1, 2, 3, 4, 7])
@pytest.mark.parametrize("start", [0, 1])
def test_state_closed_form(stages, start):
    for n, (i, p, c) in enumerate(pl.state_sequence(stages, 40, start)):
        assert (i, p, c) == (n % stages, start ^ ((n // stages) & 1), n)


def test_state_validation_and_equality():
    with pytest.raises(ValueError, match="stages"):
        pl.PipelineState(0)
    with pytest.raises(ValueError, match="index"):
        pl.PipelineState(3, index=3)
    with pytest.raises(ValueError, match="phase"):
        pl.PipelineState(3, phase=2)
    with pytest.raises(TypeError, match="stages"):
        pl.PipelineState(3.0)
    a, b = pl.PipelineState(2), pl.PipelineState(2)
    a.advance()
    assert a != b
    b.advance()
    assert a == b and "index=1" in repr(a)


# ---------------------------------------------------------------- the device twin, read from PTX

_STORE = re.compile(r"st\.global\.b32\s+\[%rd\d+(?:\+(\d+))?\],\s*(-?\d+);")


def _folded_stores(compiled):
    """{word offset: constant} of the kernel's constant stores."""
    out = {}
    for line in ptx_lines(compiled, r"st\.global"):
        m = _STORE.search(line)
        assert m, f"not a constant store: {line}"
        out[int(m.group(1) or 0) // 4] = int(m.group(2))
    return out


@pytest.mark.parametrize("stages,tiles,k_tiles,start", [(3, 3, 5, 0), (3, 3, 5, 1), (4, 2, 5, 0), (2, 4, 3, 1)])
def test_device_twin_folds_to_the_cpu_sequence(stages, tiles, k_tiles, start):
    # Static bounds: the compiler unrolls the cutlass.range loops and folds the
    # DevicePipelineState arithmetic into constants, so the PTX is the sequence.
    c = pl.compile_state_trace("sm_90a", stages, tiles, k_tiles, start)
    stores = _folded_stores(c)
    want = pl.state_sequence(stages, tiles * k_tiles, start)
    assert len(stores) == 3 * len(want)
    assert [tuple(stores[3 * i + j] for j in range(3)) for i in range(len(want))] == want


def test_state_trace_bad_args():
    with pytest.raises(ValueError, match="start_phase"):
        pl.compile_state_trace("sm_90a", 3, 2, 2, 2)
    with pytest.raises(ValueError, match="stages"):
        pl.compile_state_trace("sm_90a", 0)
    with pytest.raises(ValueError, match="target"):
        pl.compile_state_trace("sm_89")


# ---------------------------------------------------------------- the ring, simulated


@pytest.mark.parametrize("stages", [1, 2, 3, 4])
@pytest.mark.parametrize("k_tiles", [1, 3, 5, 8])
@pytest.mark.parametrize("consumers", [1, 2])
@pytest.mark.parametrize("ticks", [(1, 1), (1, 3), (3, 1)])
def test_carried_state_keeps_order(stages, k_tiles, consumers, ticks):
    run = pl.simulate_ring(stages, k_tiles, 3, consumers=consumers, fill_ticks=ticks[0], drain_ticks=ticks[1])
    assert run.ok and not run.deadlock and not run.stale_reads() and not run.overwritten
    assert run.consumed == [list(range(3 * k_tiles))] * consumers


def test_carried_ring_hand_worked_schedule():
    # 2 stages, producer 1 tick, consumer 2 ticks: the producer runs 2 items ahead,
    # then waits for each stage to be emptied.
    run = pl.simulate_ring(2, 2, 2, fill_ticks=1, drain_ticks=2)
    fills = [(e.item, e.start, e.stage, e.phase) for e in run.events if e.kind == "fill"]
    drains = [(e.item, e.start, e.stage, e.phase) for e in run.events if e.kind == "drain"]
    assert fills == [(0, 0, 0, 1), (1, 1, 1, 1), (2, 3, 0, 0), (3, 5, 1, 0)]
    assert drains == [(0, 1, 0, 0), (1, 3, 1, 0), (2, 5, 0, 1), (3, 7, 1, 1)]
    assert run.ticks == 9


def test_reset_per_tile_reads_stale_items():
    # 4 stages, 5 items per tile. Worked by hand: after tile 0 full[1..3] have
    # completed one phase, so the reset consumer (phase 0) passes them at once
    # and reads items 1, 2, 3 again instead of 6, 7, 8.
    run = pl.simulate_ring(4, 5, 2, reset_per_tile=True)
    assert not run.deadlock
    assert run.consumed == [[0, 1, 2, 3, 4, 5, 1, 2, 3, 9]]
    assert [(e.item, e.seen) for e in run.stale_reads()] == [(6, 1), (7, 2), (8, 3)]
    assert not run.ok
    # the same schedule with the state carried is fine
    assert pl.simulate_ring(4, 5, 2).ok


def test_reset_per_tile_can_deadlock():
    run = pl.simulate_ring(4, 9, 2, reset_per_tile=True)
    assert run.deadlock and not run.ok
    assert run.overwritten == [8]  # the reset producer destroyed item 8 before it was read
    stuck = {e.agent for e in run.events if e.kind == "wait" and e.end == run.ticks}
    assert stuck == {"producer", "consumer 0"}


def test_reset_is_only_safe_at_multiples_of_two_rings():
    # k_tiles a multiple of stages is not enough: the phase has flipped an odd number of times.
    assert not pl.simulate_ring(4, 4, 2, reset_per_tile=True).ok
    assert pl.simulate_ring(4, 8, 3, reset_per_tile=True).ok
    for stages in (1, 2, 3):
        for k in range(1, 9):
            run = pl.simulate_ring(stages, k, 3, reset_per_tile=True)
            assert run.ok == (k % (2 * stages) == 0), (stages, k)


def test_ring_table_and_figure(tmp_path, monkeypatch):
    monkeypatch.setattr(figures, "FIGURES_DIR", tmp_path)
    run = pl.simulate_ring(4, 5, 2, reset_per_tile=True)
    text = pl.ring_table(run)
    assert text.count("<- stale") == 3
    path, data = pl.draw_ring_timeline(run, "02_test")
    assert path.exists()
    assert data["full_parity"].shape == (run.ticks, 4) and data["empty_parity"].shape == (run.ticks, 4)
    # at tick 0 every barrier is fresh (parity 0); at the end full[0] has completed 3 phases
    assert data["full_parity"][0].tolist() == [0, 0, 0, 0]
    drains = [b for b in data["boxes"] if b[1] == "drain"]
    assert [b[7] for b in drains] == run.consumed[0]


def test_simulation_bad_args():
    with pytest.raises(ValueError, match="stages"):
        pl.simulate_ring(0)
    with pytest.raises(ValueError, match="drain_ticks"):
        pl.simulate_ring(2, drain_ticks=0)


def test_expected_trace():
    assert pl.expected_trace(7, 3) == [(0, 0), (1, 0), (2, 0), (0, 1), (1, 1), (2, 1), (0, 0)]


# ---------------------------------------------------------------- the ring's PTX


def test_ring_ptx():
    c = pl.compile_ring("sm_90a", 4, 15, k_tiles=5, consumer_warps=2)
    names = mbarrier_instructions(c)
    for want in ("mbarrier.init.shared::cta.b64", "mbarrier.arrive.shared::cta.b64",
                 "mbarrier.try_wait.parity.shared::cta.b64", "fence.mbarrier_init.release.cluster"):
        assert want in names
    inits = ptx_lines(c, r"mbarrier\.init")
    assert len(inits) == 8  # full + empty per stage
    assert sorted(line.split(",")[-1].strip(" ;") for line in inits) == ["32"] * 4 + ["64"] * 4
    # one wait and one arrive per role, inside real (not unrolled) loops
    assert len(ptx_lines(c, r"WAIT_PARITY")) == 2
    assert len(ptx_lines(c, r"mbarrier\.arrive")) == 2
    assert ptx_lines(c, r"st\.shared") and ptx_lines(c, r"ld\.shared")
    assert ptx_lines(c, r"bar\.sync")


def test_ring_compiles_for_sm100():
    assert "mbarrier.try_wait.parity.shared::cta.b64" in mbarrier_instructions(
        pl.compile_ring("sm_100a", 3, 7, k_tiles=7, consumer_warps=1))


def test_compile_ring_bad_args():
    with pytest.raises(ValueError, match="items"):
        pl.compile_ring("sm_90a", 4, 14, k_tiles=5)
    with pytest.raises(ValueError, match="consumer_warps"):
        pl.compile_ring("sm_90a", 4, 15, consumer_warps=3)
    with pytest.raises(ValueError, match="stages"):
        pl.compile_ring("sm_90a", 0, 15)


def test_ring_copy_bad_inputs():
    good = torch.zeros(15, pl.ITEM_WORDS, dtype=torch.int32)
    with pytest.raises(TypeError, match="src"):
        pl.ring_copy(good.tolist())
    with pytest.raises(TypeError, match="int32"):
        pl.ring_copy(good.float())
    with pytest.raises(ValueError, match="2-D"):
        pl.ring_copy(good.view(-1))
    with pytest.raises(ValueError, match="128 columns"):
        pl.ring_copy(torch.zeros(15, 64, dtype=torch.int32))
    with pytest.raises(ValueError, match="contiguous"):
        pl.ring_copy(torch.zeros(pl.ITEM_WORDS, 15, dtype=torch.int32).t())
    with pytest.raises(ValueError, match="multiple of k_tiles"):
        pl.ring_copy(good, k_tiles=4)
    with pytest.raises(ValueError, match="stages"):
        pl.ring_copy(good, stages=17)
    with pytest.raises(TypeError, match="stages"):
        pl.ring_copy(good, stages=2.0)
    with pytest.raises(ValueError, match="consumer_warps"):
        pl.ring_copy(good, consumer_warps=3)
    with pytest.raises(ValueError, match="cuda"):
        pl.ring_copy(good)  # right shape, wrong device


@pytest.mark.skipif(detect_tier() != "cpu", reason="checks the CPU refusal")
def test_gpu_functions_refuse_on_cpu():
    with pytest.raises(TierError, match="run_state_trace"):
        pl.run_state_trace()


# ---------------------------------------------------------------- on the GPU


@pytest.mark.gpu
@pytest.mark.parametrize("stages,tiles,k_tiles,start", [(3, 3, 5, 0), (4, 2, 5, 1)])
def test_state_trace_on_gpu(stages, tiles, k_tiles, start):
    assert pl.run_state_trace(stages, tiles, k_tiles, start) == pl.state_sequence(stages, tiles * k_tiles, start)


@pytest.mark.gpu
@pytest.mark.parametrize("stages,k_tiles,tiles,consumer_warps", [
    (4, 5, 3, 2),  # the notebook's ring: 5 % 4 != 0, three tiles
    (1, 3, 2, 1),  # one stage: every item waits for the previous one
    (2, 7, 3, 4),
    (3, 5, 4, 1),
    (4, 8, 2, 2),  # k_tiles a multiple of 2 x stages
    (5, 6, 5, 2),
])
def test_ring_copy_on_gpu(stages, k_tiles, tiles, consumer_warps):
    items = k_tiles * tiles
    src = torch.randint(-2**31, 2**31 - 1, (items, pl.ITEM_WORDS), dtype=torch.int32, device="cuda")
    dst, trace = pl.ring_copy(src, stages, k_tiles=k_tiles, consumer_warps=consumer_warps)
    assert torch.equal(dst, src)
    assert [tuple(r) for r in trace.tolist()] == pl.expected_trace(items, stages)
