"""The FP4 -> FP16 conversion PTX of chapter 11's fast Hopper twin: its text (any machine), its values (sm90)."""
import pytest

torch = pytest.importorskip("torch")

from gemmlab import fp4_dequant as q  # noqa: E402
from gemmlab import nvfp4 as fp4  # noqa: E402
from gemmlab.compile import ptx_lines, ptx_opcodes  # noqa: E402


def e4m3_of_code(code: int) -> float:
    """The e4m3 byte the bit move makes of an e2m1 code, decoded by torch: must be value x 2^-6."""
    byte = q.e4m3_byte_of_code(code)
    return torch.tensor([byte], dtype=torch.uint8).view(torch.float8_e4m3fn).float().item()


def test_bit_move_is_exact_for_every_code():
    for code in range(16):
        assert e4m3_of_code(code) == fp4.E2M1_VALUES[code] * 2.0**-6, code


def test_byte_of_code_by_hand():
    assert q.e4m3_byte_of_code(0b0001) == 0b0000_0100  # 0.5: subnormal e4m3 4/8 x 2^-6
    assert q.e4m3_byte_of_code(0b1011) == 0b1000_1100  # -1.5: sign, exponent 1, mantissa 4/8
    with pytest.raises(ValueError, match="code must be <= 15"):
        q.e4m3_byte_of_code(16)


def test_products_are_exact_in_fp16_and_scale_times_64_fits():
    vals = torch.tensor(fp4.E2M1_VALUES)
    sc = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    sc = sc[torch.isfinite(sc)]
    prod = vals[:, None] * sc[None, :]
    assert torch.equal(prod.half().float(), prod)
    assert torch.equal((64 * sc).half().float(), 64 * sc)  # the multiplier never rounds or overflows
    nz = prod[prod != 0].abs()
    assert nz.min() >= 2.0**-14  # FP16 normals: no subnormal products


def test_ptx_blocks():
    assert q.scale_ptx(2).count("prmt.b32 t, {$r0}, 0, 0x0022;") == 1
    with pytest.raises(ValueError, match="byte must be 0, 1, 2 or 3"):
        q.scale_ptx(4)
    c = q.compile_dequant()
    assert ptx_opcodes(c, r"cvt\.rn\.f16x2|mul\.rn\.f16x2") == ["cvt.rn.f16x2.e4m3x2", "mul.rn.f16x2"]
    assert len(ptx_lines(c, r"cvt\.rn\.f16x2\.e4m3x2")) == 4 + 4  # four scales, four byte pairs
    assert len(ptx_lines(c, r"prmt\.b32")) == 4 + 2 + 3  # scale bytes, pairing, gather


def _expected(packed: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """What the kernel must write, computed with nvfp4's decoding (int32 words, as the kernel's ``out``)."""
    n = packed.numel()
    pb = packed.view(torch.uint8).view(n, 4).long()
    sb = scales.view(torch.uint8).view(n, 4)
    sval = sb.view(torch.float8_e4m3fn).float()  # (n, 4)
    vals = torch.tensor(fp4.E2M1_VALUES)
    lo, hi = vals[pb & 15], vals[pb >> 4]  # (n, 4) each
    scale_of_byte = torch.stack([sval[:, 0], sval[:, 0], sval[:, 3], sval[:, 3]], dim=1)
    pairs = torch.stack([lo * scale_of_byte, hi * scale_of_byte], dim=2).half()  # (n, 4, 2)
    words = pairs.contiguous().view(torch.int32).view(n, 4)
    mult = (64 * sval).half()[:, :, None].expand(n, 4, 2).contiguous().view(torch.int32).view(n, 4)
    idx = torch.arange(n)
    t = idx % 4
    gathered = torch.stack([packed.view(torch.uint8).view(n, 4)[(idx + j) % n, t] for j in range(4)], dim=1)
    return torch.cat([words, mult, gathered.contiguous().view(torch.int32).view(n, 1)], dim=1)


@pytest.mark.gpu
@pytest.mark.sm90
def test_conversion_matches_nvfp4_for_every_byte_and_many_scales():
    g = torch.Generator().manual_seed(5)
    n = 4096
    packed = torch.randint(0, 256, (n * 4,), dtype=torch.uint8, generator=g)
    packed[:256] = torch.arange(256, dtype=torch.uint8)  # every byte (every pair of codes) at least once
    finite = torch.tensor([b for b in range(256) if b not in (0x7F, 0xFF)], dtype=torch.uint8)
    scales = finite[torch.randint(0, len(finite), (n * 4,), generator=g)]
    scales[:254] = finite  # every finite scale at least once
    packed, scales = packed.view(torch.int32), scales.view(torch.int32)
    got = q.run_dequant(packed.cuda(), scales.cuda()).cpu()
    want = _expected(packed, scales)
    bad = (got != want).any(dim=1).nonzero().flatten()
    assert bad.numel() == 0, f"{bad.numel()} threads differ, first {bad[:5].tolist()}: {got[bad[0]]} vs {want[bad[0]]}"
