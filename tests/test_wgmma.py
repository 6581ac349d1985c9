"""Chapter 06: wgmma descriptors, accumulator fragments, the first TMA + WGMMA GEMM.

CPU: the descriptor encoder puts every field at its bits and round-trips; the
descriptor constants in the compiled PTX decode to what the layout model
predicts; the fragment model is a bijection with the documented formula; the
PTX holds the wgmma, fence/commit/wait, TMA and mbarrier instructions in the
order the chapter argues for; bad input raises before any launch.
GPU (sm90): the fragment probe matches the model element by element; the GEMM
matches torch on fresh random data with a poisoned output.
"""
from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from gemmlab import wgmma as wg
from gemmlab.compile import ptx_lines, ptx_opcodes
from gemmlab.compile import line_index as _index

# ---------------------------------------------------------------------------
# CPU: the descriptor
# ---------------------------------------------------------------------------


def test_encode_puts_each_field_at_its_bits():
    assert wg.encode_smem_desc(16, 0, 0, "none") == 1
    assert wg.encode_smem_desc(0, 16, 0, "none") == 1 << 16
    assert wg.encode_smem_desc(0, 0, 16, "none") == 1 << 32
    assert wg.encode_smem_desc(0, 0, 0, "none", base_offset=1) == 1 << 49
    assert wg.encode_smem_desc(0, 0, 0, "128B") == 1 << 62
    assert wg.encode_smem_desc(0, 0, 0, "64B") == 2 << 62
    assert wg.encode_smem_desc(0, 0, 0, "32B") == 3 << 62
    # Largest values fill exactly 14 bits.
    top = (1 << 18) - 16
    assert wg.encode_smem_desc(top, 0, 0, "none") == 0x3FFF
    assert wg.encode_smem_desc(0, top, 0, "none") == 0x3FFF << 16
    assert wg.encode_smem_desc(0, 0, top, "none") == 0x3FFF << 32


@pytest.mark.parametrize("fields", [
    (0x1000, 16, 1024, "128B", 0),
    (0x3FFF0, 0x100, 0x2000, "64B", 3),
    (0x20, 0, 256, "32B", 7),
    (0, 128, 256, "none", 0),
])
def test_round_trip(fields):
    v = wg.encode_smem_desc(*fields)
    d = wg.decode_smem_desc(v)
    assert (d.start_addr, d.lbo, d.sbo, d.swizzle, d.base_offset) == fields
    assert d.value == v
    # PTX prints 64-bit constants signed: the decoder takes that form too.
    assert wg.decode_smem_desc(v - (1 << 64) if v >> 63 else v) == d


def test_hand_encoded_value():
    # start 0x400 (field 0x40), LBO 16 (1), SBO 1024 (64), 128B swizzle (1 in bits 62-63).
    assert wg.encode_smem_desc(0x400, 16, 1024, "128B") == 0x4000_0040_0001_0040
    assert wg.decode_smem_desc(0x4000_0040_0001_0040).raw_fields() == {
        "start_addr": 0x40, "lbo": 1, "sbo": 64, "base_offset": 0, "swizzle": 1}


@pytest.mark.parametrize("kwargs, err", [
    (dict(start_addr=8, lbo=16, sbo=16), ValueError),  # not 16-byte granular
    (dict(start_addr=1 << 18, lbo=16, sbo=16), ValueError),  # beyond 14 bits after >> 4
    (dict(start_addr=0, lbo=16, sbo=16, swizzle="256B"), ValueError),
    (dict(start_addr=0, lbo=16, sbo=16, base_offset=8), ValueError),
    (dict(start_addr=0.0, lbo=16, sbo=16), TypeError),
])
def test_encode_rejects_bad_fields(kwargs, err):
    with pytest.raises(err):
        wg.encode_smem_desc(**kwargs)


def test_decode_rejects_reserved_bits_and_non_ints():
    with pytest.raises(ValueError, match="reserved"):
        wg.decode_smem_desc(1 << 14)
    with pytest.raises(TypeError):
        wg.decode_smem_desc("0x40")


def test_describe_for_layout_k_major_sw128_bf16():
    d = wg.describe_for_layout(128, 64)
    assert (d.row_bytes, d.sbo, d.lbo, d.k_step_bytes) == (128, 1024, 16, 32)
    assert [wg.decode_smem_desc(v).start_addr for v in d.descriptors] == [0, 32, 64, 96]
    assert d.descriptors[0] == 0x4000_0040_0001_0000
    # K beyond one swizzled row continues in the next column of atoms, after all rows.
    wide = wg.describe_for_layout(64, 128)
    assert [wg.decode_smem_desc(v).start_addr for v in wide.descriptors][4] == 64 * 128
    with pytest.raises(ValueError):
        wg.describe_for_layout(128, 64, start_addr=512)  # not aligned to the 1024-byte atom


def test_sw128_chunk_map_is_a_permutation_per_row():
    m = wg.sw128_chunk_map(16)
    assert all(sorted(row) == list(range(8)) for row in m)
    assert m[0] == list(range(8)) and m[1][0] == 1 and m[7][0] == 7 and m[8] == m[0]


# ---------------------------------------------------------------------------
# CPU: the accumulator fragment model
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("n", [8, 64, 128, 256])
def test_fragment_map_is_a_bijection(n):
    thread, reg = wg.acc_fragment_map(n)
    assert (thread >= 0).all() and (reg >= 0).all()
    pairs = set(zip(thread.ravel().tolist(), reg.ravel().tolist()))
    assert len(pairs) == 64 * n  # every (thread, reg) used exactly once


def test_fragment_model_matches_the_mma_m16n8_pattern():
    thread, reg = wg.acc_fragment_map(128)
    # warp w owns rows 16w..16w+15
    assert ((thread // 32) == (np.arange(64)[:, None] // 16)).all()
    # thread 0: C[0,0], C[0,1], C[8,0], C[8,1], then the next 8 columns
    assert [wg.acc_coord(0, r) for r in range(6)] == [(0, 0), (0, 1), (8, 0), (8, 1), (0, 8), (0, 9)]
    assert wg.acc_coord(37, 0) == (16 + 1, 2)  # warp 1, lane 5: row 16 + 5//4, col 2*(5%4)
    probe = wg.expected_probe(64)
    assert probe.shape == (128, 32, 2) and tuple(probe[127, 31]) == (63, 63)


# ---------------------------------------------------------------------------
# CPU: compile-only PTX
# ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def gemm_ptx():
    return wg.compile_gemm_nt("sm_90a", 256, 256, 256)


@pytest.fixture(scope="module")
def probe_ptx():
    return wg.compile_fragment_probe("sm_90a", 128)




def test_gemm_ptx_has_the_chapter_instructions(gemm_ptx):
    ops = ptx_opcodes(gemm_ptx, r"wgmma|cp\.async|mbarrier")
    for op in ("wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16", "wgmma.fence.sync.aligned;",
               "wgmma.commit_group.sync.aligned;", "wgmma.wait_group.sync.aligned",
               "mbarrier.try_wait.parity.shared.b64", "mbarrier.arrive.expect_tx.shared.b64",
               "mbarrier.arrive.shared.b64"):
        assert op in ops, op
    assert any(op.startswith("cp.async.bulk.tensor.2d.shared::cta.global") for op in ops)
    # Main loop keeps one group in flight; the epilogue drains all.
    waits = [re.sub(r"\s+", " ", line) for line in ptx_lines(gemm_ptx, r"^wgmma\.wait_group")]
    assert waits == ["wgmma.wait_group.sync.aligned 1;", "wgmma.wait_group.sync.aligned 0;"]
    # 128x128 tile, k-tile 64: 2 m-blocks x 4 k16 slices = 8 wgmmas per k-tile (peeled first + loop).
    assert len(ptx_lines(gemm_ptx, r"^wgmma\.mma_async")) == 16


def test_gemm_ptx_orders_fence_mma_commit_wait_release(gemm_ptx):
    lines = ptx_lines(gemm_ptx, r".")
    loop_wait = _index(lines, r"^wgmma\.wait_group\.sync\.aligned\s+1")
    # walk back from the wait: commit, the wgmmas, the fence, the full-barrier wait
    commit = max(i for i in range(loop_wait) if lines[i].startswith("wgmma.commit_group"))
    fence = max(i for i in range(commit) if lines[i].startswith("wgmma.fence"))
    assert any(lines[i].startswith("wgmma.mma_async") for i in range(fence, commit))
    assert any("mbarrier.try_wait" in lines[i] for i in range(fence))
    # The stage is released (empty barrier) only after the wait.
    _index(lines, r"^mbarrier\.arrive\.shared", loop_wait)
    # Stores of C come after the final wait_group 0.
    last = _index(lines, r"^wgmma\.wait_group\.sync\.aligned\s+0")
    assert _index(lines, r"^st\.global") > last


def test_inflight_zero_waits_for_everything_and_releases_the_current_stage():
    ptx = wg.compile_gemm_nt("sm_90a", 256, 256, 256, inflight=0)
    waits = {re.sub(r"\s+", " ", line) for line in ptx_lines(ptx, r"^wgmma\.wait_group")}
    assert waits == {"wgmma.wait_group.sync.aligned 0;"}
    with pytest.raises(ValueError, match="inflight"):
        wg.compile_gemm_nt("sm_90a", inflight=2)


def test_figures_are_written():
    for path in (wg.draw_smem_desc(wg.describe_for_layout().descriptors[0], name="06_test_desc"),
                 wg.draw_acc_fragment(16, name="06_test_acc"), wg.draw_sw128_tile(8, name="06_test_sw"),
                 wg.draw_gemm_roles(4, name="06_test_roles")):
        import os

        assert os.path.getsize(path) > 10_000
        os.remove(path)


def test_descriptor_constants_in_ptx_decode_to_the_layout_model(gemm_ptx, probe_ptx):
    model = wg.describe_for_layout(128, 64)
    assert wg.ptx_desc_constants(gemm_ptx) == list(model.descriptors)
    d = wg.decode_smem_desc(wg.ptx_desc_constants(gemm_ptx)[0])
    assert (d.swizzle, d.sbo, d.lbo, d.base_offset) == ("128B", 1024, 16, 0)
    # The probe stages one k16 slice per row (32 bytes): the 32-byte swizzle.
    (p,) = wg.ptx_desc_constants(probe_ptx)
    assert p == wg.describe_for_layout(64, 16, swizzle="32B").descriptors[0]


def test_probe_and_other_tiles_compile(probe_ptx):
    assert "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16" in ptx_opcodes(probe_ptx, r"^wgmma")
    ops = ptx_opcodes(wg.compile_gemm_nt("sm_90a", 128, 256, 128, tile_m=64, tile_n=256, dtype="fp16"), r"^wgmma")
    assert "wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16" in ops


# ---------------------------------------------------------------------------
# CPU: bad input
# ---------------------------------------------------------------------------


def _ab(m=256, n=256, k=256, dtype=torch.bfloat16, device="cpu"):
    return torch.zeros(m, k, dtype=dtype, device=device), torch.zeros(n, k, dtype=dtype, device=device)


@pytest.mark.parametrize("make, err, match", [
    (lambda: _ab(dtype=torch.float32), TypeError, "dtype"),
    (lambda: (_ab()[0], _ab(dtype=torch.float16)[1]), TypeError, "same dtype"),
    (lambda: (_ab()[0], torch.zeros(256, 128, dtype=torch.bfloat16)), ValueError, "K must match"),
    (lambda: _ab(m=200), ValueError, "M must be a positive multiple of 128"),
    (lambda: _ab(n=100), ValueError, "N must be a positive multiple of 128"),
    (lambda: _ab(k=96), ValueError, "K must be a positive multiple of 64"),
    (lambda: (_ab()[0].t(), _ab()[1]), ValueError, "contiguous"),
    (lambda: (_ab()[0][None], _ab()[1]), ValueError, "2-D"),
    (lambda: _ab(), ValueError, "cuda"),  # right shapes, but on the CPU
])
def test_gemm_rejects_bad_input(make, err, match):
    a, b = make()
    with pytest.raises(err, match=match):
        wg.gemm_nt(a, b)


@pytest.mark.parametrize("kwargs, match", [
    (dict(tile_m=256, tile_n=128), "tile_m, tile_n"),
    (dict(tile_m=128, tile_n=256), "tile_m, tile_n"),  # 256 accumulators per thread: too many
    (dict(stages=1), "stages"),
    (dict(stages=8), "shared memory"),
])
def test_gemm_rejects_bad_config(kwargs, match):
    a, b = _ab()
    with pytest.raises(ValueError, match=match):
        wg.gemm_nt(a, b, **kwargs)


def test_gemm_nt_is_the_only_name_and_means_a_at_b_t():
    # One contract per name: this chapter's GEMM computes a @ b.T, so it is gemm_nt (a @ b is gemmlab.gemm).
    assert not hasattr(wg, "gemm") and not hasattr(wg, "prepare_gemm") and not hasattr(wg, "compile_gemm")
    assert "a @ b.T" in wg.gemm_nt.__doc__ and "N x K" in wg.gemm_nt.__doc__
    assert "a @ b.T" in wg.prepare_gemm_nt.__doc__
    # b is N x K: a (256 x 128) with b (384 x 128) passes the shape checks and fails only on the device
    # (CPU tensors); b given as K x N (128 x 384), the a @ b layout, is refused as a K mismatch.
    a = torch.zeros(256, 128, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="cuda"):
        wg.gemm_nt(a, torch.zeros(384, 128, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match=re.escape("b is N x K (C = a @ b.T): their K must match")):
        wg.gemm_nt(a, torch.zeros(128, 384, dtype=torch.bfloat16))


def test_smem_limit_is_the_hardware_one():
    from gemmlab.hardware import SMEM_PER_BLOCK

    assert not hasattr(wg, "MAX_SMEM")
    # The deepest ring that fits: 227 KiB less 1 KiB of margin (unchanged from the literal 227 * 1024).
    assert wg.default_stages(128, 128) == min(6, (227 * 1024 - 1024) // wg.stage_bytes(128, 128)) == 6
    assert wg.default_stages(64, 256) == (SMEM_PER_BLOCK - 1024) // wg.stage_bytes(64, 256) == 5
    with pytest.raises(ValueError, match=f"at most {SMEM_PER_BLOCK} fit"):
        wg.compile_gemm_nt("sm_90a", stages=8)


def test_compile_only_rejects_other_targets():
    with pytest.raises(ValueError, match="sm_90a"):
        wg.compile_gemm_nt("sm_100a")
    with pytest.raises(ValueError, match="sm_90a"):
        wg.compile_fragment_probe("sm_100a")
    with pytest.raises(ValueError):
        wg.acc_coord(0, 64, 128)  # only 64 registers at n = 128


# ---------------------------------------------------------------------------
# GPU (Hopper only)
# ---------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.sm90
@pytest.mark.parametrize("n", [16, 128, 256])
def test_fragment_probe_matches_model(n):
    got = wg.run_fragment_probe(n)
    want = wg.expected_probe(n)
    assert got.shape == want.shape
    bad = np.argwhere((got != want).any(axis=-1))
    assert not len(bad), f"{len(bad)} registers differ, first (thread, reg) = {bad[0].tolist()}"


@pytest.mark.gpu
@pytest.mark.sm90
@pytest.mark.parametrize("m, n, k, tile, stages, dtype, inflight", [
    (256, 256, 512, (128, 128), 4, torch.bfloat16, 1),
    (128, 384, 64, (64, 128), 2, torch.bfloat16, 1),  # a single k-tile: only the peeled iteration
    (384, 256, 1024, (128, 64), 3, torch.float16, 1),
    (128, 512, 320, (64, 256), 5, torch.bfloat16, 1),
    (256, 256, 704, (128, 128), 6, torch.bfloat16, 0),
    (256, 128, 128, (128, 128), 2, torch.bfloat16, 0),
])
def test_gemm_matches_torch(m, n, k, tile, stages, dtype, inflight):
    torch.manual_seed(m + n + k)
    a = torch.randn(m, k, device="cuda").to(dtype)
    b = torch.randn(n, k, device="cuda").to(dtype)
    out = torch.full((m, n), float("nan"), dtype=dtype, device="cuda")  # poisoned
    wg.prepare_gemm_nt(a, b, out, tile_m=tile[0], tile_n=tile[1], stages=stages, inflight=inflight)()
    torch.cuda.synchronize()
    ref = a.float() @ b.float().T
    assert not out.isnan().any()
    rel = ((out.float() - ref).norm() / ref.norm()).item()
    assert rel < 5e-3, rel


@pytest.mark.gpu
@pytest.mark.sm90
def test_gemm_default_call_allocates_out():
    a = torch.randn(256, 128, device="cuda").to(torch.bfloat16)
    b = torch.randn(128, 128, device="cuda").to(torch.bfloat16)
    c = wg.gemm_nt(a, b)
    assert c.shape == (256, 128) and c.dtype == torch.bfloat16
    torch.testing.assert_close(c.float(), a.float() @ b.float().T, rtol=2e-2, atol=2e-2)


@pytest.mark.gpu
@pytest.mark.sm90
def test_gemm_rejects_misaligned_pointer():
    base = torch.zeros(256 * 256 + 1, dtype=torch.bfloat16, device="cuda")
    a = base[1:].view(256, 256)  # contiguous, but 2 bytes past a 16-byte boundary
    b = torch.zeros(256, 256, dtype=torch.bfloat16, device="cuda")
    with pytest.raises(ValueError, match="aligned"):
        wg.gemm_nt(a, b)
