"""Chapter 03: cp.async, cp.async.bulk (G2S, S2G, cluster S2S), fence.proxy.async.

CPU: the PTX of every kernel contains the instructions the chapter teaches, in
the order the chapter argues for; the ring-schedule model respects the reuse
hazard; every bad input raises before any launch. GPU: every kernel against
torch on fresh random data, outputs poisoned first.
"""
from __future__ import annotations

import re

import pytest
import torch

from gemmlab import async_copy as ac
from gemmlab.measure import copybench
from gemmlab import figures
from gemmlab.compile import ptx_lines, ptx_opcodes, ptx_of
from gemmlab.compile import line_index as _index

# ---------------------------------------------------------------------------
# CPU: compile-only PTX
# ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ptx():
    return {
        "cp_cg": ptx_of(ac.compile_cp_async_copy("sm_90a")),
        "cp_ca": ptx_of(ac.compile_cp_async_copy("sm_90a", cache="ca")),
        "bulk": ptx_of(ac.compile_bulk_copy("sm_90a", nbytes=(1 << 20) + 48)),
        "fenced": ptx_of(ac.compile_fenced_store("sm_90a")),
        "unfenced": ptx_of(ac.compile_fenced_store("sm_90a", fence=False)),
        "swap": ptx_of(ac.compile_cluster_swap("sm_90a")),
    }




def test_cp_async_ptx(ptx):
    ops = ptx_opcodes(ptx["cp_cg"], r"cp\.async")
    assert ops == ["cp.async.cg.shared.global", "cp.async.commit_group;", "cp.async.wait_group"]
    # The wait counts stages - 1 groups, as an immediate.
    assert set(ptx_lines(ptx["cp_cg"], r"cp\.async\.wait_group")) == {"cp.async.wait_group 3;"}
    assert all(line.endswith(", 16;") for line in ptx_lines(ptx["cp_cg"], r"cp\.async\.cg"))
    assert "cp.async.ca.shared.global" in ptx_opcodes(ptx["cp_ca"], r"cp\.async")
    assert "cp.async.cg.shared.global" not in ptx_opcodes(ptx["cp_ca"], r"cp\.async")


def test_bulk_copy_ptx(ptx):
    ops = ptx_opcodes(ptx["bulk"], r"cp\.async|mbarrier|fence")
    for op in (
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes",
        "cp.async.bulk.global.shared::cta.bulk_group",
        "cp.async.bulk.commit_group;",
        "cp.async.bulk.wait_group.read",
        "cp.async.bulk.wait_group",
        "mbarrier.arrive.expect_tx.shared.b64",
        "mbarrier.try_wait.parity.shared.b64",
    ):
        assert op in ops, op
    # Only the async proxy touches the ring: no proxy fence in this kernel.
    assert not ptx_lines(ptx["bulk"], r"fence\.proxy")
    # Refills wait for all but the newest store to have read its stage.
    assert set(ptx_lines(ptx["bulk"], r"wait_group\.read")) == {"cp.async.bulk.wait_group.read 1;"}
    # ...and the kernel ends by waiting for every store to complete.
    assert ptx_lines(ptx["bulk"], r"cp\.async\.bulk\.wait_group ")[-1] == "cp.async.bulk.wait_group 0;"
    # In the loop, a refill load comes after the wait_group.read that frees its stage.
    lines = ptx_lines(ptx["bulk"], r".")
    w = _index(lines, r"wait_group\.read")
    _index(lines, r"cp\.async\.bulk\.shared::cluster\.global", w)
    # The tail chunk (48 bytes) is selected at run time.
    assert any(re.search(r"selp\.b32\s+%r\d+, 48, 16384", line) for line in lines)


def test_fenced_store_ptx_orders_threads_fence_barrier_store(ptx):
    lines = ptx_lines(ptx["fenced"], r".")
    first_st = _index(lines, r"^st\.shared")
    fence = _index(lines, r"^fence\.proxy\.async\.shared::cta", first_st)
    # every thread store comes before the fence
    assert not [line for line in lines[fence:] if line.startswith("st.shared")]
    bar = _index(lines, r"^bar(rier)?\.sync", fence)
    store = _index(lines, r"^cp\.async\.bulk\.global\.shared::cta\.bulk_group", bar)
    _index(lines, r"^cp\.async\.bulk\.wait_group 0", store)
    # The threads' shared reads come after the mbarrier wait of the bulk load.
    load = _index(lines, r"^cp\.async\.bulk\.shared::cluster\.global")
    wait = _index(lines, r"mbarrier\.try_wait", load)
    assert _index(lines, r"^ld\.shared") > wait
    # Without the fence the same kernel has none.
    assert not ptx_lines(ptx["unfenced"], r"fence\.proxy")


def test_cluster_swap_ptx(ptx):
    lines = ptx_lines(ptx["swap"], r".")
    ops = ptx_opcodes(ptx["swap"], r"cp\.async|mapa|barrier\.cluster")
    for op in (
        "mapa.shared::cluster.u32",
        "cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes",
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes",
        "cp.async.bulk.global.shared::cta.bulk_group",
        "barrier.cluster.arrive;",
        "barrier.cluster.wait;",
    ):
        assert op in ops, op
    assert len(ptx_lines(ptx["swap"], r"^mapa\.shared::cluster")) == 2  # the peer's inbox and its barrier
    # cluster barrier (peer's mbarrier initialised) -> push -> ... -> cluster barrier (peer got it) -> exit
    first_wait = _index(lines, r"^barrier\.cluster\.wait")
    push = _index(lines, r"^cp\.async\.bulk\.shared::cluster\.shared::cta", first_wait)
    _index(lines, r"^barrier\.cluster\.wait", push)
    assert _index(lines, r"^mbarrier\.init") < first_wait


def test_compiles_for_sm100():
    ops = ptx_opcodes(ac.compile_bulk_copy("sm_100a", nbytes=1 << 16), r"cp\.async\.bulk")
    assert "cp.async.bulk.global.shared::cta.bulk_group" in ops


# ---------------------------------------------------------------------------
# CPU: the ring model behind the timeline figure; the proxy figure's steps
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("stages", [2, 3, 4, 8])
def test_ring_schedule_respects_reuse_hazard(stages):
    rows = ac.ring_schedule(30, stages)
    assert [r["chunk"] for r in rows] == list(range(30))
    for r in rows:
        assert r["stage"] == r["chunk"] % stages
        assert r["load_start"] < r["load_end"] <= r["store_start"] < r["read_end"]
        j = r["chunk"]
        if j >= stages:  # the stage's previous chunk must have been read out first
            assert r["load_start"] >= rows[j - stages]["read_end"]
    ends = [r["load_end"] for r in rows]
    assert ends == sorted(ends)  # loads finish in order (one transfer at a time)


def test_ring_schedule_more_stages_until_bandwidth_bound():
    total = {s: ac.ring_schedule(40, s)[-1]["read_end"] for s in (2, 3, 4, 6, 8)}
    assert total[2] > total[3] > total[4] > total[6]
    # With enough stages only the bandwidth limits: latency + 40 transfers + one read.
    assert total[8] == pytest.approx(4.0 + 39 * 1.0 + 1.0)


def test_ring_schedule_errors():
    with pytest.raises(ValueError, match="stages must be >= 2"):
        ac.ring_schedule(10, 1)
    with pytest.raises(ValueError, match="n_chunks must be >= 1"):
        ac.ring_schedule(0, 2)
    with pytest.raises(ValueError, match="latency must be > 0"):
        ac.ring_schedule(10, 2, latency=0)


def test_proxy_steps_put_the_fence_between_thread_stores_and_bulk_store():
    texts = [t for _, t in ac.PROXY_STEPS]
    st = next(i for i, t in enumerate(texts) if "st.shared" in t)
    fence = next(i for i, t in enumerate(texts) if "fence.proxy.async" in t)
    bar = next(i for i, t in enumerate(texts) if "bar.sync" in t)
    store = next(i for i, t in enumerate(texts) if "S->G" in t)
    assert st < fence < bar < store
    assert ac.PROXY_STEPS[fence][0] == 0  # the threads fence, not the engine


def test_figures_are_written(tmp_path, monkeypatch):
    monkeypatch.setattr(figures, "FIGURES_DIR", tmp_path)
    p1 = ac.draw_ring_timeline()
    p2 = ac.draw_proxies()
    p3 = copybench.draw_stage_sweep([{"stages": 2, "ctas/SM": 1, "GB/s": 3000.0, "vs torch": 0.7},
                              {"stages": 4, "ctas/SM": 1, "GB/s": 4000.0, "vs torch": 0.93}])
    for p, name in ((p1, "03_ring_timeline"), (p2, "03_proxies"), (p3, "03_bulk_stages")):
        assert p.endswith(f"{name}.png") and (tmp_path / f"{name}.png").stat().st_size > 1000


def test_smem_fits():
    assert copybench._smem_fits(4, 16384, 2)
    assert copybench._smem_fits(6, 16384, 2)
    assert not copybench._smem_fits(8, 16384, 2)
    assert copybench._smem_fits(8, 16384, 1)


# ---------------------------------------------------------------------------
# CPU: bad input
# ---------------------------------------------------------------------------


def test_wrapper_errors():
    with pytest.raises(ValueError, match="nbytes must be one of"):
        ac.cp_async_ca(None, None, 2)
    with pytest.raises(TypeError, match=r"n must be an int \(a compile-time immediate\)"):
        ac.cp_async_wait_group(1.0)
    with pytest.raises(ValueError, match="n must be >= 0"):
        ac.cp_async_bulk_wait_group_read(-1)
    with pytest.raises(TypeError, match=r"n must be an int \(a compile-time immediate\)"):
        ac.cp_async_bulk_wait_group("0")
    for fn in (lambda: ac.cp_async_bulk_g2s(None, None, 24, None),
               lambda: ac.cp_async_bulk_s2g(None, None, 0),
               lambda: ac.cp_async_bulk_s2s_cluster(None, None, 8, None)):
        with pytest.raises(ValueError, match="nbytes must be a positive multiple of 16"):
            fn()


def test_compile_errors():
    with pytest.raises(ValueError, match="target must be one of"):
        ac.compile_bulk_copy("sm_80")
    with pytest.raises(ValueError, match="nbytes must be a multiple of 16"):
        ac.compile_bulk_copy("sm_90a", nbytes=100)
    with pytest.raises(ValueError, match="stages must be >= 2"):
        ac.compile_bulk_copy("sm_90a", stages=1)
    with pytest.raises(ValueError, match="stages \\* stage_bytes must be <="):
        ac.compile_bulk_copy("sm_90a", stages=8, stage_bytes=32768)
    with pytest.raises(ValueError, match="cache must be one of"):
        ac.compile_cp_async_copy("sm_90a", cache="cs")
    with pytest.raises(ValueError, match="n must be a multiple of 4096"):
        ac.compile_fenced_store("sm_90a", n=5000)
    with pytest.raises(TypeError, match="fence must be a bool"):
        ac.compile_fenced_store("sm_90a", fence=1)
    with pytest.raises(ValueError, match="tiles must be a multiple of 2"):
        ac.compile_cluster_swap("sm_90a", tiles=3)
    with pytest.raises(ValueError, match="tile_bytes must be <= 65536"):
        ac.compile_cluster_swap("sm_90a", tile_bytes=1 << 17)


def test_api_errors_on_any_machine():
    a = torch.zeros(1024, dtype=torch.uint8)
    with pytest.raises(TypeError, match="src must be a torch.Tensor"):
        ac.bulk_copy([1, 2], a)
    with pytest.raises(ValueError, match="src must be on a cuda device"):
        ac.bulk_copy(a, a.clone())
    with pytest.raises(ValueError, match="src must be on a cuda device"):
        ac.cp_async_copy(a, a.clone())
    with pytest.raises(ValueError, match="stages must be >= 2"):
        ac.bulk_copy(a, a.clone(), stages=1)
    with pytest.raises(ValueError, match="stage_bytes must be a multiple of 16"):
        ac.bulk_copy(a, a.clone(), stage_bytes=1000)
    with pytest.raises(ValueError, match="stages \\* stage_bytes must be <="):
        ac.bulk_copy(a, a.clone(), stages=16, stage_bytes=65536)
    with pytest.raises(TypeError, match="ctas_per_sm must be an int"):
        ac.bulk_copy(a, a.clone(), ctas_per_sm=1.5)
    with pytest.raises(ValueError, match="cache must be one of"):
        ac.cp_async_copy(a, a.clone(), cache="cs")
    with pytest.raises(TypeError, match="src must have dtype float32"):
        ac.fenced_store(torch.zeros(4096, dtype=torch.float64))
    with pytest.raises(ValueError, match="src must be 2-D"):
        ac.cluster_swap(a)


# ---------------------------------------------------------------------------
# GPU: every kernel against torch, fresh random data, poisoned outputs
# ---------------------------------------------------------------------------


def _random_bytes(nbytes):
    return torch.randint(0, 256, (nbytes,), dtype=torch.uint8, device="cuda")


def _poisoned(like):
    return torch.full((like.numel() * like.element_size(),), 0x7F, dtype=torch.uint8,
                      device="cuda").view(like.dtype).view(like.shape)


# Sizes: tiny, one tile/chunk exactly, not a power of two (multiples of 16), a few MiB.
COPY_SIZES = [16, 48, 2048, 16384, 5 * 16384, (1 << 20) + 48, 3 * (1 << 20) + 2064, 32 << 20]


@pytest.mark.gpu
@pytest.mark.parametrize("nbytes", COPY_SIZES)
@pytest.mark.parametrize("cache,stages", [("cg", 4), ("ca", 2), ("cg", 1)])
def test_cp_async_copy_matches_torch(nbytes, cache, stages):
    src = _random_bytes(nbytes)
    dst = _poisoned(src)
    out = ac.cp_async_copy(src, dst, cache=cache, stages=stages)
    torch.cuda.synchronize()
    assert out is dst
    assert torch.equal(dst, src)


@pytest.mark.gpu
@pytest.mark.parametrize("nbytes", COPY_SIZES)
@pytest.mark.parametrize("stages,stage_bytes,ctas_per_sm", [(4, 16384, 2), (2, 16384, 1), (8, 8192, 1), (3, 32768, 2)])
def test_bulk_copy_matches_torch(nbytes, stages, stage_bytes, ctas_per_sm):
    src = _random_bytes(nbytes)
    dst = _poisoned(src)
    ac.bulk_copy(src, dst, stages=stages, stage_bytes=stage_bytes, ctas_per_sm=ctas_per_sm)
    torch.cuda.synchronize()
    assert torch.equal(dst, src)


@pytest.mark.gpu
def test_bulk_copy_other_dtypes_and_shapes():
    src = torch.randn(37, 96, device="cuda", dtype=torch.bfloat16)  # 7104 bytes: 444 x 16
    dst = _poisoned(src)
    ac.bulk_copy(src, dst, stages=2, stage_bytes=1024)
    torch.cuda.synchronize()
    assert torch.equal(dst.view(torch.int16), src.view(torch.int16))


@pytest.mark.gpu
def test_copiers_pass_copybench_check():
    from gemmlab.measure.copybench import check_copier

    for name, prep in ac.copiers().items():
        check_copier(name, prep, (8 << 20) + 16)


@pytest.mark.gpu
@pytest.mark.parametrize("n_tiles", [1, 3, 64])
def test_fenced_store_matches_torch(n_tiles):
    src = torch.randn(n_tiles * ac.FENCED_TILE, device="cuda")
    out = torch.full_like(src, float("nan"))
    got = ac.fenced_store(src, out)
    torch.cuda.synchronize()
    assert got is out
    assert torch.equal(out, src * 2 + 1)
    fresh = ac.fenced_store(src)  # allocates its own output
    assert torch.equal(fresh, src * 2 + 1)


def _swapped(src):
    return src.reshape(src.shape[0] // 2, 2, -1).flip(1).reshape(src.shape)


@pytest.mark.gpu
@pytest.mark.parametrize("shape,dtype", [((2, 4096), torch.float32), ((6, 4096), torch.float32),
                                         ((10, 8), torch.bfloat16), ((2, 65536), torch.uint8),
                                         ((264, 1000), torch.int32)])
def test_cluster_swap_matches_torch(shape, dtype):
    if dtype.is_floating_point:
        src = torch.randn(shape, device="cuda").to(dtype)
    else:
        src = torch.randint(-1000, 1000, shape, device="cuda").to(dtype)
    out = _poisoned(src)
    got = ac.cluster_swap(src, out)
    torch.cuda.synchronize()
    assert got is out
    assert torch.equal(out, _swapped(src))


@pytest.mark.gpu
def test_api_errors_on_gpu():
    buf = _random_bytes(4096)
    with pytest.raises(ValueError, match="src must hold a multiple of 16 bytes"):
        ac.bulk_copy(buf[:40], buf[1024:1064])
    with pytest.raises(ValueError, match="src must start at a 16-byte aligned address"):
        ac.bulk_copy(buf[1:17], buf[1024:1040])
    with pytest.raises(ValueError, match="dst must start at a 16-byte aligned address"):
        ac.cp_async_copy(buf[:16], buf[1025:1041])
    with pytest.raises(ValueError, match="src and dst must have the same shape"):
        ac.bulk_copy(buf[:32], buf[1024:1040])
    with pytest.raises(TypeError, match="src and dst must have the same dtype"):
        ac.bulk_copy(buf[:32], torch.zeros(32, dtype=torch.int8, device="cuda"))
    with pytest.raises(ValueError, match="src must be contiguous"):
        ac.bulk_copy(buf.view(64, 64).t(), buf.view(64, 64).clone())
    with pytest.raises(ValueError, match="src must hold a multiple of 4096 elements"):
        ac.fenced_store(torch.zeros(1000, device="cuda"))
    with pytest.raises(ValueError, match="src and out must have the same shape"):
        ac.fenced_store(torch.zeros(4096, device="cuda"), torch.zeros(8192, device="cuda"))
    with pytest.raises(ValueError, match="even number of rows"):
        ac.cluster_swap(torch.zeros(3, 16, device="cuda"))
    with pytest.raises(ValueError, match="multiple of 16 bytes and at most 65536"):
        ac.cluster_swap(torch.zeros(2, 5, device="cuda"))
    with pytest.raises(ValueError, match="multiple of 16 bytes and at most 65536"):
        ac.cluster_swap(torch.zeros(2, 16385, device="cuda"))
