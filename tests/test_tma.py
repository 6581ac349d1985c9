"""Chapter 04: TMA loads, stores, multicast and cache hints.

CPU: the PTX of each kernel holds the TMA instructions the chapter teaches
(compile-only, sm_90a); the tensor-map description; every bad input raises a
clear error before any launch. GPU: the bytes TMA writes into shared memory
equal the swizzle model for every mode; partial tiles are zero-filled on load
and clipped on store; multicast fills both CTAs of a cluster; the store
round trip is exact. Outputs are poisoned first, inputs fresh random bytes.
"""
from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from gemmlab import swizzle as swz
from gemmlab import tma
from gemmlab.compile import ptx_lines, ptx_of, ptx_opcodes
from gemmlab.compile import line_index as _index

# ---------------------------------------------------------------------------
# CPU: compile-only PTX
# ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ptx():
    return {
        "rt": ptx_of(tma.compile_roundtrip("sm_90a", (100, 200), "float16", (64, 64), "128B")),
        "hint": ptx_of(tma.compile_roundtrip("sm_90a", (100, 200), "float16", (64, 64), "128B",
                                             cache_hint="evict_first")),
        "mc": ptx_of(tma.compile_multicast("sm_90a", clusters=2)),
    }




def test_load_ptx(ptx):
    loads = ptx_lines(ptx["rt"], r"^cp\.async\.bulk\.tensor\.2d\.shared::(cta|cluster)\.global")
    assert len(loads) == 1  # one instruction moves the whole 64 x 64 box
    assert ".tile.mbarrier::complete_tx::bytes" in loads[0]
    # operands: [smem], [tensor map, {inner coordinate, outer coordinate}], [mbarrier]
    assert re.search(r"\[%r\d+\], \[%rd\d+, \{%r\d+, %r\d+\}\], \[%r\d+\]", loads[0])
    ops = ptx_opcodes(ptx["rt"], r"^mbarrier", r"^prefetch", r"^fence")
    for op in ("mbarrier.init.shared.b64", "mbarrier.arrive.expect_tx.shared.b64", "mbarrier.try_wait.parity.shared.b64",
               "prefetch.tensormap", "fence.mbarrier_init.release.cluster;"):
        assert op in ops, op
    # expect_tx before the load, the wait after it
    lines = ptx_lines(ptx["rt"], r".")
    e = _index(lines, r"^mbarrier\.arrive\.expect_tx")
    ld = _index(lines, r"^cp\.async\.bulk\.tensor", e)
    _index(lines, r"^mbarrier\.try_wait\.parity", ld)


def test_tensor_maps_are_grid_constant_parameters_and_prefetched(ptx):
    # Two 128-byte, 64-byte aligned kernel parameters: the load's and the store's tensor maps.
    params = ptx_lines(ptx["rt"], r"^\.param \.align 64 \.b8 \S+\[128\]")
    assert len(params) == 2
    assert len(ptx_lines(ptx["rt"], r"^prefetch\.tensormap")) == 2
    # the copies take the map's address in parameter space (cvta.param): no copy to global memory
    assert ptx_lines(ptx["rt"], r"^cvta\.param\.u64")


def test_store_ptx(ptx):
    lines = ptx_lines(ptx["rt"], r".")
    st = _index(lines, r"^cp\.async\.bulk\.tensor\.2d\.global\.shared::cta\.tile\.bulk_group")
    c = _index(lines, r"^cp\.async\.bulk\.commit_group", st)
    _index(lines, r"^cp\.async\.bulk\.wait_group\.read\s+0", c)
    # the store comes after the load's mbarrier wait
    assert _index(lines, r"^mbarrier\.try_wait") < st


def test_multicast_ptx(ptx):
    loads = ptx_lines(ptx["mc"], r"^cp\.async\.bulk\.tensor")
    mc = [l for l in loads if ".multicast::cluster" in l]
    assert len(mc) == 1
    assert mc[0].startswith("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
                            ".multicast::cluster")
    assert re.search(r"\], %rs\d+", mc[0])  # the 16-bit CTA mask operand
    lines = ptx_lines(ptx["mc"], r".")
    w = _index(lines, r"^barrier\.cluster\.wait")  # peers' barriers initialised first
    assert _index(lines, r"^mbarrier\.init") < w < _index(lines, r"\.multicast::cluster")
    # a cluster barrier again before exit
    _index(lines, r"^barrier\.cluster\.wait", _index(lines, r"^cp\.async\.bulk\.wait_group"))
    # the 0b11 mask is built in a 16-bit register
    assert any(re.search(r"mov\.[bu]16\s+%rs\d+, 3;", l) for l in lines)


def test_cache_hint_ptx(ptx):
    lines = ptx_lines(ptx["hint"], r".")
    p = _index(lines, r"^createpolicy\.fractional\.L2::evict_first\.b64")
    reg = re.search(r"(%rd\d+), 1\.0;", lines[p]).group(1)
    ld = lines[_index(lines, r"^cp\.async\.bulk\.tensor\.2d\.shared::cta\.global", p)]
    assert ".L2::cache_hint" in ld and ld.endswith(f", {reg};")
    # without a hint the DSL still emits .L2::cache_hint, with a zero policy and no createpolicy
    assert not ptx_lines(ptx["rt"], r"^createpolicy")


@pytest.mark.parametrize("mode, cute_b", [("none", 0), ("32B", 1), ("64B", 2), ("128B", 3)])
def test_every_mode_compiles_to_one_load_per_box(mode, cute_b):
    span = swz.SPAN[mode] or 128
    c = tma.compile_roundtrip("sm_90a", (64, span // 2 * 3), "float16", (32, span // 2), mode)
    assert len(ptx_lines(c, r"^cp\.async\.bulk\.tensor\.2d\.shared")) == 1
    assert swz.cute_swizzle(mode) == (cute_b, 4, 3)


def test_compiles_for_sm100():
    ops = ptx_opcodes(tma.compile_roundtrip("sm_100a"), r"^cp\.async\.bulk\.tensor")
    assert any(op.startswith("cp.async.bulk.tensor.2d.global.shared::cta") for op in ops)


# ---------------------------------------------------------------------------
# CPU: the tensor map description and bad input
# ---------------------------------------------------------------------------


def test_describe_tensor_map():
    d = tma.describe_tensor_map((100, 200), torch.float16, (64, 64), "128B")
    assert d["tensorDataType"] == "CU_TENSOR_MAP_DATA_TYPE_FLOAT16"
    assert d["tensorRank"] == 2
    assert d["globalDim"] == (200, 100)  # innermost first
    assert d["globalStrides"] == (400,)  # bytes, rank - 1 entries
    assert d["boxDim"] == (64, 64)
    assert d["elementStrides"] == (1, 1)
    assert d["swizzle"] == "CU_TENSOR_MAP_SWIZZLE_128B"
    assert d["interleave"] == "CU_TENSOR_MAP_INTERLEAVE_NONE"
    assert d["oobFill"] == "CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE"
    assert d["expect_tx_bytes"] == 64 * 64 * 2
    assert d["tiles"] == (2, 4)
    d2 = tma.describe_tensor_map((10, 48), "float32", (8, 8), "32B", strides=(52, 1), l2_promotion="none")
    assert d2["globalStrides"] == (208,) and d2["boxDim"] == (8, 8) and d2["expect_tx_bytes"] == 256
    assert d2["l2Promotion"] == "CU_TENSOR_MAP_L2_PROMOTION_NONE"
    assert "boxDim" in tma.format_tensor_map(d)


def _cpu(shape, dtype=torch.float16):
    return torch.zeros(shape, dtype=dtype)


@pytest.mark.parametrize(
    "call, exc, words",
    [
        # unsupported dtypes
        (lambda: tma.tma_roundtrip(_cpu((64, 64), torch.float64), (8, 16), "none"), TypeError, "TMA-supported dtype"),
        (lambda: tma.tma_roundtrip(_cpu((64, 64), torch.bool), (8, 16), "none"), TypeError, "TMA-supported dtype"),
        (lambda: tma.describe_tensor_map((8, 8), torch.complex64, (8, 8), "none"), TypeError, "TMA-supported"),
        # global strides must be multiples of 16 bytes: 100 fp16 = 200 bytes per row
        (lambda: tma.tma_roundtrip(_cpu((64, 100)), (8, 8), "none"), ValueError, "multiple of 16 bytes"),
        # ... also for a strided view
        (lambda: tma.tma_roundtrip(_cpu((64, 132))[:, :64], (8, 64), "128B"), ValueError, "row stride"),
        # innermost stride must be 1
        (lambda: tma.tma_roundtrip(_cpu((64, 64)).t(), (8, 64), "128B"), ValueError, "unit stride"),
        # misaligned base address
        (lambda: tma.tma_roundtrip(_cpu((65, 64)).view(-1)[1:4097].view(64, 64), (8, 64), "128B"), ValueError,
         "16-byte aligned address"),
        # boxes over 256 elements per dimension
        (lambda: tma.tma_roundtrip(_cpu((512, 64)), (300, 64), "128B"), ValueError, "between 1 and 256"),
        (lambda: tma.tma_roundtrip(_cpu((64, 512), torch.uint8), (8, 272), "none"), ValueError, "between 1 and 256"),
        (lambda: tma.tma_roundtrip(_cpu((64, 64)), (0, 64), "128B"), ValueError, "between 1 and 256"),
        # inner box a multiple of 16 bytes
        (lambda: tma.tma_roundtrip(_cpu((64, 64)), (8, 4), "none"), ValueError, "multiple of 16 bytes (TMA inner box)"),
        # inner box vs swizzle span: 128B swizzle needs <= 128 bytes (64 fp16 = 128 bytes is fine, 128 is not)
        (lambda: tma.tma_roundtrip(_cpu((64, 256)), (8, 128), "128B"), ValueError, "<= 128 bytes for swizzle 128B"),
        (lambda: tma.tma_roundtrip(_cpu((64, 64)), (8, 64), "64B"), ValueError, "<= 64 bytes for swizzle 64B"),
        (lambda: tma.multicast_demo(_cpu((64, 32)), (64, 32), "128B"), ValueError, "equal the swizzle span"),
        (lambda: tma.tma_roundtrip(_cpu((64, 64)), (8, 64), "96B"), ValueError, "swizzle must be one of"),
        (lambda: tma.tma_roundtrip(_cpu((64, 64)), 64, "128B"), ValueError, "box must be a pair"),
        (lambda: tma.tma_roundtrip(_cpu((64, 64)), (8.0, 64), "128B"), TypeError, "box[0] must be an int"),
        (lambda: tma.tma_roundtrip(_cpu((4, 64, 64)), (8, 64), "128B"), ValueError, "must be 2-D"),
        (lambda: tma.tma_roundtrip([[1.0]], (8, 64), "128B"), TypeError, "torch.Tensor"),
        (lambda: tma.tma_roundtrip(_cpu((64, 64)), (8, 64), "128B", cache_hint="keep"), ValueError,
         "cache_hint must be one of"),
        (lambda: tma.tma_roundtrip(_cpu((64, 64)), (8, 64), "128B", out=_cpu((64, 72))), ValueError,
         "out must match src"),
        (lambda: tma.multicast_demo(_cpu((96, 64)), (64, 64)), ValueError, "clusters * box[0]"),
        (lambda: tma.compile_roundtrip("sm_80", (64, 64), "float16", (8, 64)), ValueError, "target must be one of"),
        (lambda: tma.describe_tensor_map((64, 64), "float16", (8, 64), oob_fill="ones"), ValueError,
         "oob_fill must be one of"),
    ],
)
def test_bad_input_raises_before_launch(call, exc, words):
    with pytest.raises(exc) as e:
        call()
    assert words in str(e.value)


def test_cpu_tensor_is_refused_before_launch():
    with pytest.raises(ValueError, match="cuda device"):
        tma.tma_roundtrip(_cpu((64, 64)), (8, 64), "128B")


# ---------------------------------------------------------------------------
# GPU
# ---------------------------------------------------------------------------


def _random(shape, dtype, seed=None):
    """Fresh random bytes viewed as ``dtype`` (every bit pattern, NaNs included: we compare bytes)."""
    g = torch.Generator(device="cuda")
    g.manual_seed(torch.seed() if seed is None else seed)
    eb = torch.empty((), dtype=dtype).element_size()
    b = torch.randint(0, 256, (shape[0], shape[1] * eb), dtype=torch.uint8, device="cuda", generator=g)
    return b.view(dtype)


def _bytes(t):
    return t.contiguous().view(torch.uint8)


CASES = [  # (mode, dtype, box, shape): every mode, several element sizes, full and partial tiles
    ("none", torch.float16, (16, 64), (48, 192)),
    ("none", torch.uint8, (8, 48), (20, 100 - 4)),
    ("32B", torch.float16, (32, 16), (64, 48)),
    ("32B", torch.float32, (24, 8), (50, 40)),
    ("64B", torch.bfloat16, (64, 32), (128, 64)),
    ("64B", torch.uint8, (16, 64), (40, 160)),
    ("128B", torch.float16, (64, 64), (128, 128)),
    ("128B", torch.float32, (16, 32), (37, 72)),
    ("128B", torch.int8, (128, 128), (200, 304)),
]


@pytest.mark.gpu
@pytest.mark.parametrize("mode, dtype, box, shape", CASES)
def test_hardware_swizzle_matches_model(mode, dtype, box, shape):
    src = _random(shape, dtype)
    out, raw = tma.tma_roundtrip(src, box, mode)
    expected = tma.expected_raw(src, box, mode)
    got = raw.cpu().numpy()
    assert got.shape == expected.shape
    bad = np.argwhere(got != expected)
    assert bad.size == 0, f"{len(bad)} bytes differ from the {mode} model, first at (tile i, tile j, byte) {bad[0]}"
    assert torch.equal(_bytes(out), _bytes(src))


SHORT_ROW_CASES = [  # rows shorter than the swizzle span: each row takes a whole span of shared memory
    ("128B", torch.float16, (16, 32), (16, 32)),   # the 64-byte rows of an H200 probe: 2048 bytes for 1024
    ("128B", torch.float16, (16, 32), (40, 72)),   # the same box, partial tiles
    ("128B", torch.uint8, (8, 16), (8, 48)),       # 16-byte rows
    ("64B", torch.bfloat16, (16, 16), (32, 48)),   # 32-byte rows
    ("32B", torch.float32, (8, 4), (24, 12)),      # 16-byte rows
]


@pytest.mark.gpu
@pytest.mark.parametrize("mode, dtype, box, shape", SHORT_ROW_CASES)
def test_hardware_swizzle_short_rows(mode, dtype, box, shape):
    """Every data byte where :func:`gemmlab.swizzle.expected_smem` puts it (row pitch = the span); the store
    round trip exact. The padding's bytes are not compared: the model does not say what TMA leaves there."""
    src = _random(shape, dtype)
    out, raw = tma.tma_roundtrip(src, box, mode)
    row_bytes = box[1] * src.element_size()
    assert raw.shape[-1] == swz.smem_bytes(mode, box[0], row_bytes) == box[0] * swz.SPAN[mode]
    mask = swz.data_mask(mode, box[0], row_bytes)
    got, expected = raw.cpu().numpy(), tma.expected_raw(src, box, mode)
    bad = np.argwhere((got != expected) & mask)
    assert bad.size == 0, f"{len(bad)} data bytes differ from the {mode} model, first at (tile i, tile j, byte) {bad[0]}"
    # the packed layout (rows back to back, the old model) would not match
    packed = swz.swizzle_offset(mode, np.arange(box[0] * row_bytes))
    assert not np.array_equal(got[0, 0][packed], tma.expected_raw(src, box, "none")[0, 0])
    assert torch.equal(_bytes(out), _bytes(src))


@pytest.mark.gpu
def test_swizzle_model_would_catch_a_wrong_mode():
    """The check can fail: the 128B bytes are not what the 64B or unswizzled model predicts."""
    src = _random((64, 64), torch.float16)
    raw = tma.load_tile_raw(src, (64, 64), "128B").cpu().numpy()
    assert np.array_equal(raw, tma.expected_raw(src, (64, 64), "128B")[0, 0])
    assert not np.array_equal(raw, tma.expected_raw(src, (64, 64), "none")[0, 0])


@pytest.mark.gpu
def test_partial_tiles_zero_fill_and_clipped_store():
    rows, cols = 100, 72  # neither a multiple of the 64 x 64 box
    src = _random((rows, cols), torch.float16)
    big = torch.empty((rows + 28, 136), dtype=torch.float16, device="cuda")  # row stride 272 bytes: 16-aligned
    big.view(torch.uint8).fill_(tma.POISON_BYTE)
    out = big[:rows, :cols]
    tma.tma_roundtrip(src, (64, 64), "128B", out=out)
    assert torch.equal(_bytes(out), _bytes(src))
    # clipped: nothing outside the tensor was written
    mask = torch.ones_like(big, dtype=torch.bool)
    mask[:rows, :cols] = False
    assert bool((big.view(torch.int16)[mask] == 0x5A5A).all())
    # zero fill: box (1, 1) covers rows 64..127, cols 64..127 of which rows 64..99, cols 64..71 exist
    _, raw = tma.tma_roundtrip(src, (64, 64), "none")
    tile = raw[1, 1].view(torch.float16).view(64, 64)
    assert torch.equal(_bytes(tile[:36, :8]), _bytes(src[64:, 64:]))
    assert not bool(tile[36:].view(torch.int16).any()) and not bool(tile[:, 8:].view(torch.int16).any())


@pytest.mark.gpu
@pytest.mark.parametrize("hint", ["evict_first", "evict_last"])
def test_cache_hint_round_trip(hint):
    src = _random((256, 64), torch.bfloat16)
    out, _ = tma.tma_roundtrip(src, (128, 64), "128B", cache_hint=hint)
    assert torch.equal(_bytes(out), _bytes(src))


@pytest.mark.gpu
def test_multicast_fills_both_ctas():
    src = _random((3 * 64, 64), torch.float16)
    got = tma.multicast_demo(src, (64, 64))
    assert got.shape == (3, 2, 64, 64)
    for c in range(3):
        for r in range(2):
            assert torch.equal(_bytes(got[c, r]), _bytes(src[64 * c:64 * (c + 1)])), (c, r)


def test_expected_raw_pads_partial_boxes_with_zeros():
    src = torch.arange(1, 3 * 24 + 1, dtype=torch.int32).view(3, 24).to(torch.uint8)  # 3 x 24 bytes
    raw = tma.expected_raw(src, (2, 16), "none")
    assert raw.shape == (2, 2, 32)
    assert list(raw[0, 0, :16]) == list(range(1, 17)) and list(raw[0, 0, 16:]) == list(range(25, 41))
    assert list(raw[0, 1, :8]) == list(range(17, 25)) and not raw[0, 1, 8:16].any()
    assert list(raw[1, 0, :16]) == list(range(49, 65)) and not raw[1, 0, 16:].any()  # row 3 does not exist
    # these kernels take exactly one swizzle span per box row, except the round trip (short_rows=True)
    with pytest.raises(ValueError, match="equal the swizzle span"):
        tma.check_tma_box((3, 32), torch.uint8, (2, 16), "32B")
    tma.check_tma_box((3, 32), torch.uint8, (2, 16), "32B", short_rows=True)


def test_expected_raw_of_short_rows_covers_the_padded_footprint():
    src = torch.arange(16 * 64, dtype=torch.int32).to(torch.uint8).view(16, 64).view(torch.float16)  # 16 x 32 fp16
    raw = tma.expected_raw(src, (16, 32), "128B")
    assert raw.shape == (1, 1, 2048)
    mask = swz.data_mask("128B", 16, 64)
    assert sorted(raw[0, 0][mask].tolist()) == sorted(src.view(torch.uint8).reshape(-1).tolist())
    # row 3 chunk 1 (bytes 3 * 64 + 16 ...) sits in group 1 ^ 3 = 2 of line 3
    assert raw[0, 0, 3 * 128 + 2 * 16:3 * 128 + 3 * 16].tolist() == list(range(3 * 64 + 16, 3 * 64 + 32))


def test_short_row_round_trip_compiles_with_the_padded_buffer():
    c = tma.compile_roundtrip("sm_90a", (16, 32), "float16", (16, 32), "128B")
    assert len(ptx_lines(c, r"^cp\.async\.bulk\.tensor")) == 2
    # the mbarrier expects the box's 1024 bytes, and sits after the 2048-byte buffer (the padded footprint)
    lines = [" ".join(l.split()) for l in ptx_lines(c, r".")]
    (arrive,) = [i for i, l in enumerate(lines) if l.startswith("mbarrier.arrive.expect_tx")]
    tx_reg = lines[arrive].rstrip(";").split(", ")[-1]
    assert f"mov.b32 {tx_reg}, 1024;" in lines[:arrive]
    bar_reg = lines[arrive].split("[")[1].split("]")[0]
    assert any(re.fullmatch(rf"add\.s32 {re.escape(bar_reg)}, %r\d+, 2048;", l) for l in lines[:arrive])


def test_tma_store_is_issued_by_one_elected_lane():
    """The DSL elects a lane for TMA loads but not for stores: ours must elect one itself.

    Without it every lane of the storing warp issues the same bulk store (32 stores
    of one box). In the PTX the store must come after a second ``elect.sync`` (the
    first one guards the load) with no other bulk-tensor instruction in between.
    """
    from gemmlab.compile import ptx_of

    ptx = ptx_of(tma.compile_roundtrip("sm_90a"))
    lines = [line.strip() for line in ptx[ptx.find(".entry"):].splitlines()]
    elects = [i for i, line in enumerate(lines) if line.startswith("elect.sync")]
    stores = [i for i, line in enumerate(lines)
              if line.startswith("cp.async.bulk.tensor") and ".global.shared" in line]
    assert len(stores) == 1 and len(elects) >= 2
    guard = max(i for i in elects if i < stores[0])
    assert guard != elects[0]  # not the load's election
    between = lines[guard + 1:stores[0]]
    assert not any(line.startswith("cp.async.bulk.tensor") for line in between)
