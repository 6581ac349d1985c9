"""Chapter 11, CPU tier: NVFP4 values, packing, the two scale layouts, the reference and its checker."""
import math

import pytest

torch = pytest.importorskip("torch")

from gemmlab import figures  # noqa: E402
from gemmlab import nvfp4 as f  # noqa: E402

E4M3 = torch.float8_e4m3fn


def e4m3(values):
    return torch.tensor(values, dtype=torch.float32).to(E4M3)


# ---------------------------------------------------------------- e2m1 values


def test_decode_every_code():
    codes = torch.arange(16, dtype=torch.uint8)
    vals = f.e2m1_decode(codes)
    assert vals.tolist() == [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]
    assert torch.signbit(vals[8]) and not torch.signbit(vals[0])  # code 8 is -0


def test_encode_rounds_to_nearest_ties_to_even_and_saturates():
    x = torch.tensor([0.25, 0.26, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 5.01, 7.0, 1e9, -0.1, -0.75, -100.0])
    # ties: 0.25 -> 0 (code 0), 0.75 -> 1.0 (code 2), 1.25 -> 1.0, 1.75 -> 2.0, 2.5 -> 2.0, 3.5 -> 4.0, 5 -> 4.0
    assert f.e2m1_encode(x).tolist() == [0, 1, 2, 2, 4, 4, 6, 6, 7, 7, 7, 8, 10, 15]


def test_encode_decode_round_trip_on_every_code():
    codes = torch.arange(16, dtype=torch.uint8)
    assert f.e2m1_encode(f.e2m1_decode(codes)).tolist() == list(range(16))


def test_encode_rejects_nan():
    with pytest.raises(ValueError, match="NaN"):
        f.e2m1_encode(torch.tensor([1.0, float("nan")]))


# ---------------------------------------------------------------- packing


def test_pack_puts_the_even_element_in_the_low_nibble():
    codes = torch.tensor([[1, 2, 15, 8, 0, 7]], dtype=torch.uint8)
    packed = f.pack_fp4(codes)
    assert packed.tolist() == [[0x21, 0x8F, 0x70]]
    assert torch.equal(f.unpack_fp4(packed), codes)


def test_pack_rejects_odd_length():
    with pytest.raises(ValueError, match="even"):
        f.pack_fp4(torch.zeros(3, dtype=torch.uint8))


@pytest.mark.skipif(not hasattr(torch, "float4_e2m1fn_x2"), reason="torch without float4_e2m1fn_x2")
def test_fp4x2_view_keeps_the_bytes():
    raw = torch.tensor([0x21, 0x8F], dtype=torch.uint8)
    t = f.as_fp4x2(raw)
    assert t.dtype == torch.float4_e2m1fn_x2
    assert f.as_bytes(t).tolist() == [0x21, 0x8F]
    assert f.unpack_fp4(t).tolist() == [1, 2, 15, 8]


# ---------------------------------------------------------------- dequantize a hand-worked row


def test_dequantize_a_hand_worked_1x256_row():
    # Every byte 0x71: even elements code 1 (0.5), odd elements code 7 (6.0); then two bytes changed.
    packed = torch.full((1, 128), 0x71, dtype=torch.uint8)
    packed[0, 127] = 0xF8  # elements 254, 255: -0 and -6
    scales = [1.0] * 16
    scales[1] = 0.5
    scales[7] = 2.0 ** -9  # e4m3's smallest subnormal
    scales[15] = 448.0  # e4m3's largest value
    sf = e4m3([scales])
    x = f.dequantize(packed, sf)
    assert x.shape == (1, 256)
    got = {i: x[0, i].item() for i in (0, 1, 15, 16, 17, 112, 113, 240, 253, 254, 255)}
    assert got == {0: 0.5, 1: 6.0, 15: 6.0, 16: 0.25, 17: 3.0, 112: 2.0 ** -10, 113: 6 * 2.0 ** -9,
                   240: 224.0, 253: 2688.0, 254: -0.0, 255: -2688.0}
    assert torch.signbit(x[0, 254])


def test_dequantize_rejects_mismatched_scales():
    with pytest.raises(ValueError, match="sf must have shape"):
        f.dequantize(torch.zeros(2, 128, dtype=torch.uint8), e4m3([[1.0] * 8] * 2))


# ---------------------------------------------------------------- scale layouts


HAND = [  # (i, j) -> permuted index (i%32, (i%128)//32, i//128, j%4, j//4) and byte offset for MN=256, K/16=8
    ((0, 0), (0, 0, 0, 0, 0), 0),
    ((31, 0), (31, 0, 0, 0, 0), 496),
    ((32, 0), (0, 1, 0, 0, 0), 4),
    ((127, 0), (31, 3, 0, 0, 0), 508),
    ((128, 0), (0, 0, 1, 0, 0), 1024),
    ((0, 3), (0, 0, 0, 3, 0), 3),
    ((0, 4), (0, 0, 0, 0, 1), 512),
    ((127, 4), (31, 3, 0, 0, 1), 1020),
    ((128, 3), (0, 0, 1, 3, 0), 1027),
    ((200, 7), (8, 2, 1, 3, 1), 1024 + 512 + 8 * 16 + 2 * 4 + 3),
]


@pytest.mark.parametrize("ij, idx, off", HAND)
def test_permuted_index_and_offset_hand_worked(ij, idx, off):
    i, j = ij
    assert f.permuted_index(i, j) == idx
    assert f.permuted_offset(i, j, 256, 8) == off


@pytest.mark.parametrize("ij, idx, off", HAND)
def test_permute_scales_moves_one_scale_where_the_index_says(ij, idx, off):
    i, j = ij
    sf = torch.zeros(256, 8, 1)
    sf[i, j, 0] = 2.0
    perm = f.permute_scales(sf.to(E4M3))
    assert perm.shape == (32, 4, 2, 4, 2, 1)
    assert perm[idx + (0,)].float().item() == 2.0
    flat = f.blocked_bytes(perm)
    assert flat.nonzero().flatten().tolist() == [off]


def test_blocked_bytes_equal_cublas_blocked_layout():
    # cuBLAS's 128x4 blocking written independently: tiles of 128 rows x 4 scales, row-block major,
    # inside a tile 32 lines of (4 row quarters x 4 scales).
    g = torch.Generator().manual_seed(1)
    rows, sf_k = 256, 16
    sf = torch.randint(1, 127, (rows, sf_k), generator=g, dtype=torch.uint8)
    tiles = sf.view(rows // 128, 128, sf_k // 4, 4).permute(0, 2, 1, 3)  # (rb, kb, 128, 4)
    lines = tiles.reshape(-1, 4, 32, 4).transpose(1, 2)  # (tile, 32, quarter, 4)
    expect = lines.reshape(-1)
    got = f.blocked_bytes(f.permute_scales(sf.view(E4M3)))
    assert torch.equal(got, expect)


@pytest.mark.parametrize("rows, sf_k, l", [(128, 4, 1), (200, 48, 1), (64, 16, 2), (384, 20, 1)])
def test_permute_unpermute_round_trip(rows, sf_k, l):
    g = torch.Generator().manual_seed(rows)
    sf = torch.randint(0, 127, (rows, sf_k, l), generator=g, dtype=torch.uint8).view(E4M3)
    perm = f.permute_scales(sf)
    assert perm.dtype == E4M3
    assert perm.shape == f.permuted_shape(rows, sf_k, l)
    back = f.unpermute_scales(perm, rows, sf_k)
    assert torch.equal(back.view(torch.uint8), sf.view(torch.uint8))
    # the memory behind the view is (L, rest_mn, rest_k, 32, 4, 4): batch outermost
    strides = perm.stride()
    assert strides[0] == 16 and strides[1] == 4 and strides[3] == 1
    assert strides[5] == math.prod(perm.shape[:5])


def test_permuted_padding_is_zero():
    sf = torch.ones(200, 4, 1).to(E4M3)
    perm = f.permute_scales(sf)
    plain = f.unpermute_scales(perm, 256).float()
    assert (plain[:200] == 1).all() and (plain[200:] == 0).all()


def test_unpermute_rejects_a_plain_tensor():
    with pytest.raises(ValueError, match="perm must have shape"):
        f.unpermute_scales(torch.zeros(128, 4, 1).to(E4M3), 128)


# ---------------------------------------------------------------- quantize


def test_quantize_recovers_representable_data_exactly():
    # Values that are e2m1 x e4m3 with every block's largest magnitude 6 x scale: quantize is exact.
    g = torch.Generator().manual_seed(0)
    codes = torch.randint(0, 16, (8, 256), generator=g, dtype=torch.uint8)
    codes[:, ::16] = 7  # each block holds a 6
    scales = torch.tensor([0.25, 0.5, 1.0, 1.5, 3.0, 0.125, 2.0, 0.75]).view(8, 1).expand(8, 16)
    x = f.e2m1_decode(codes) * scales.repeat_interleave(16, dim=1)
    packed, sf = f.quantize(x)
    assert torch.equal(sf.float(), scales)
    assert torch.equal(f.dequantize(packed, sf), x)


def test_quantize_error_on_gaussian_data():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 1024, generator=g) * torch.exp2(torch.randn(64, 1, generator=g) * 2)
    packed, sf = f.quantize(x)
    assert packed.dtype == torch.uint8 and packed.shape == (64, 512) and sf.shape == (64, 64)
    d = f.dequantize(packed, sf)
    rel = ((d - x).norm() / x.norm()).item()
    assert 0.03 < rel < 0.13  # 4-bit values: ~10 % RMS error, never zero
    # each element's error is at most half the widest e2m1 step (2 -> 4 -> 6: 1.0) times its scale
    step = sf.float().repeat_interleave(16, dim=1)
    assert ((d - x).abs() <= step * 1.0 + 1e-6 + x.abs() * 0.07).all()


def test_quantize_zero_block_and_rejects_inf():
    x = torch.zeros(2, 32)
    x[1, 16:] = 3.0
    packed, sf = f.quantize(x)
    assert sf.float().tolist() == [[0.0, 0.0], [0.0, 0.5]]
    assert torch.equal(f.dequantize(packed, sf), x)
    with pytest.raises(ValueError, match="finite"):
        f.quantize(torch.full((1, 16), float("inf")))


# ---------------------------------------------------------------- the reference


def test_reference_hand_worked():
    # A: one row of 1.0 (code 2, scale 1). B1 row 0: all 0.5 -> acc1 = 128; B2 row 0: all 1 with scale 2^-7 -> acc2 = 2.
    # B1 row 1: two 0.5 then zeros -> acc1 = 1; B2 row 1: all 6 with scale 2^-8 -> acc2 = 6.
    k = 256
    a = f.pack_fp4(torch.full((1, k), 2, dtype=torch.uint8))
    c1 = torch.zeros(2, k, dtype=torch.uint8)
    c1[0] = 1
    c1[1, :2] = 1
    c2 = torch.full((2, k), 2, dtype=torch.uint8)
    c2[1] = 7
    b1, b2 = f.pack_fp4(c1), f.pack_fp4(c2)
    sfa = e4m3([[1.0] * 16])
    sfb1 = e4m3([[1.0] * 16] * 2)
    sfb2 = e4m3([[2.0 ** -7] * 16, [2.0 ** -8] * 16])
    out = f.reference(*(t.unsqueeze(-1) for t in (a, b1, b2, sfa, sfb1, sfb2)))
    assert out.dtype == torch.float16 and out.shape == (1, 2, 1)
    expect = torch.tensor([[128 / (1 + math.exp(-128)) * 2, 6 / (1 + math.exp(-1))]]).half()
    assert torch.equal(out[..., 0], expect)
    assert out[0, 1, 0].item() == pytest.approx(4.3866, abs=2e-3)


def test_reference_equals_a_float64_computation():
    ops = f.generate(200, 136, 768, seed=3)
    fa = f.dequantize(ops.a, ops.sfa)[..., 0].double()
    r1 = fa @ f.dequantize(ops.b1, ops.sfb1)[..., 0].double().T
    r2 = fa @ f.dequantize(ops.b2, ops.sfb2)[..., 0].double().T
    expect = (r1 * torch.sigmoid(r1) * r2).half()
    out = f.reference(*ops.inputs())
    res = f.check_close(out[..., 0], expect)
    assert res.ok, str(res)


def test_check_close_catches_one_wrong_element_and_nan():
    ref = torch.linspace(-10, 10, 64).half().view(8, 8)
    assert f.check_close(ref.clone(), ref).ok
    near = ref.float() * (1 + 0.9e-3)
    assert f.check_close(near.half(), ref).ok
    bad = ref.clone()
    bad[3, 4] += 0.5
    res = f.check_close(bad, ref)
    assert not res.ok and res.bad == 1 and res.max_abs_err == pytest.approx(0.5, abs=0.01)
    nan = ref.clone()
    nan[0, 0] = float("nan")
    assert not f.check_close(nan, ref).ok
    assert "MISMATCH" in str(f.check_close(nan, ref))
    with pytest.raises(ValueError, match="shape"):
        f.check_close(ref[:4], ref)


def test_poisoned_output_fails_the_check():
    ops = f.generate(128, 128, 256)
    assert torch.isnan(ops.c.float()).all()
    assert not f.check_close(ops.c, f.reference(*ops.inputs())).ok


# ---------------------------------------------------------------- data generation


def test_generate_shapes_dtypes_layouts():
    ops = f.generate(200, 136, 768, seed=1)
    assert ops.mnkl == (200, 136, 768, 1)
    assert ops.a.shape == (200, 384, 1) and ops.b1.shape == (136, 384, 1) and ops.b2.shape == (136, 384, 1)
    assert ops.a.dtype in f.fp4_packed_dtypes()
    if hasattr(torch, "float4_e2m1fn_x2"):
        assert ops.a.dtype == torch.float4_e2m1fn_x2
    assert ops.sfa.shape == (200, 48, 1) and ops.sfa.dtype == E4M3
    assert ops.sfa_perm.shape == (32, 4, 2, 4, 12, 1) and ops.sfb1_perm.shape == (32, 4, 2, 4, 12, 1)
    assert torch.equal(f.unpermute_scales(ops.sfb2_perm, 136, 48).view(torch.uint8), ops.sfb2.view(torch.uint8))
    assert ops.c.shape == (200, 136, 1) and ops.c.dtype == torch.float16
    f.check_operands(*ops.inputs())


def test_generate_exercises_every_code_and_a_spread_of_scales():
    ops = f.generate(128, 128, 512, seed=0)
    for t in (ops.a, ops.b1, ops.b2):
        assert sorted(f.unpack_fp4(f.as_bytes(t).permute(0, 2, 1)).unique().tolist()) == list(range(16))
    for s in (ops.sfa, ops.sfb1, ops.sfb2):
        v = s.float()
        assert (v > 0).all()
        assert v.unique().numel() >= 30  # many distinct e4m3 values
        assert (v.max() / v.min()).item() >= 8  # more than three octaves
    out = f.reference(*ops.inputs()).float()
    assert torch.isfinite(out).all() and out.abs().max() < 1e4 and out.std() > 1  # well inside FP16


def test_generate_is_deterministic_per_seed():
    x, y, z = f.generate(128, 128, 256, seed=5), f.generate(128, 128, 256, seed=5), f.generate(128, 128, 256, seed=6)
    assert torch.equal(f.as_bytes(x.a), f.as_bytes(y.a))
    assert not torch.equal(f.as_bytes(x.a), f.as_bytes(z.a))


def test_benchmark_shapes_are_valid_problems():
    assert len(f.BENCHMARK_SHAPES) == 4 and len(f.SOL_US) == 4
    for m, n, k in f.BENCHMARK_SHAPES + f.TEST_SHAPES:
        f.check_problem(m, n, k)
    geo = math.exp(sum(math.log(t) for t in f.SOL_US) / 4)
    assert geo == pytest.approx(4.886, abs=1e-3)


# ---------------------------------------------------------------- bad input


def _good():
    return list(f.generate(128, 128, 256).inputs())


def test_check_operands_returns_the_sizes():
    assert f.check_operands(*_good()) == (128, 128, 256, 1)


@pytest.mark.parametrize("index, bad, exc, match", [
    (0, lambda t: torch.zeros(128, 128, 1, dtype=torch.float16), TypeError, "a must hold packed FP4"),
    (0, lambda t: torch.zeros(128, 128, 1, dtype=torch.int8), TypeError, "a must hold packed FP4"),
    (1, lambda t: [1, 2, 3], TypeError, "b1 must be a torch.Tensor"),
    (0, lambda t: f.as_bytes(t)[..., 0], ValueError, "a must be 3-D"),
    (2, lambda t: f.as_bytes(t)[:64], ValueError, "b1 and b2 must have the same shape"),
    (3, lambda t: t.float(), TypeError, "sfa must have dtype float8_e4m3fn"),
    (4, lambda t: t[:64], ValueError, r"sfb1 must have shape \(128, 16, 1\)"),
    (5, lambda t: f.permute_scales(t), ValueError, "sfb2 must have shape"),
])
def test_check_operands_rejects(index, bad, exc, match):
    args = _good()
    args[index] = bad(args[index])
    with pytest.raises(exc, match=match):
        f.check_operands(*args)


def test_check_operands_rejects_k_not_a_multiple_of_256():
    ops = f.generate(128, 128, 512)
    a, b1, b2 = (f.as_bytes(t)[:, :192] for t in (ops.a, ops.b1, ops.b2))  # K = 384
    sfs = [s[:, :24] for s in (ops.sfa, ops.sfb1, ops.sfb2)]
    with pytest.raises(ValueError, match="K must be a multiple of 256"):
        f.check_operands(a, b1, b2, *sfs)
    with pytest.raises(ValueError, match="K must be a multiple of 256"):
        f.check_problem(128, 128, 320)


def test_check_operands_rejects_m_major_a():
    args = _good()
    a = f.as_bytes(args[0])[..., 0]
    args[0] = a.t().contiguous().t().unsqueeze(-1)  # same shape, column-major
    with pytest.raises(ValueError, match="K-major"):
        f.check_operands(*args)


def test_check_permuted():
    ops = f.generate(200, 136, 768)
    f.check_permuted("sfa_perm", ops.sfa_perm, 200, 768, 1)
    with pytest.raises(ValueError, match="permuted shape"):
        f.check_permuted("sfa_perm", ops.sfa, 200, 768, 1)
    with pytest.raises(TypeError, match="float8_e4m3fn"):
        f.check_permuted("sfa_perm", ops.sfa_perm.view(torch.uint8), 200, 768, 1)


# ---------------------------------------------------------------- figure


def test_draw_scale_layout(tmp_path, monkeypatch):
    monkeypatch.setattr(figures, "FIGURES_DIR", tmp_path)
    path = f.draw_scale_layout("11_scale_layout_test")
    assert path == tmp_path / "11_scale_layout_test.png"
    assert path.stat().st_size > 10_000


def test_every_e4m3_scale_byte_lands_at_its_permuted_offset():
    """Chapter 11's check, on e4m3 bit patterns 0x01..0x7E (finite values, no conversion involved): a check that
    converted 0..2399 to e4m3 depended on each torch version's overflow rule past 448."""
    codes = (torch.arange(200 * 12) % 126 + 1).to(torch.uint8).reshape(200, 12, 1)
    assert torch.isfinite(codes.view(torch.float8_e4m3fn).float()).all()
    flat = f.blocked_bytes(f.permute_scales(codes.view(torch.float8_e4m3fn)))
    got = [int(flat[f.permuted_offset(i, j, 200, 12)]) for i in range(200) for j in range(12)]
    assert got == codes.reshape(-1).tolist()


def test_run_poisoned_catches_an_unwritten_element_and_passes_the_reference():
    def right(*ins, out):
        out.copy_(f.reference(*ins))
        return out

    def forgets_one(*ins, out):
        right(*ins, out=out)
        out[3, 5, 0] = float("nan")

    out, returned, res = f.run_poisoned(right, 64, 96, 256, seed=3, device="cpu")
    assert returned is out and res.ok and res.total == 64 * 96
    _, returned, res = f.run_poisoned(forgets_one, 64, 96, 256, seed=3, device="cpu")
    assert returned is None and not res.ok and res.bad == 1


def test_run_twice_shows_state_left_between_calls():
    def right(*ins):
        return f.reference(*ins).to(torch.float16)

    calls = []

    def leaks(*ins):  # the second call sees what the first left behind
        calls.append(1)
        return right(*ins) * len(calls)

    first, second, res = f.run_twice(right, 64, 96, 256, seed=3, device="cpu")
    assert torch.equal(first, second) and res.ok and res.total == 64 * 96
    first, second, res = f.run_twice(leaks, 64, 96, 256, seed=3, device="cpu")
    assert not torch.equal(first, second) and res.ok  # the first call is right; only the repeat differs
