"""Chapter 11 on the CPU: the NVFP4 format, its scale layouts, and the gated dual GEMM's reference.

What it holds
    * **e2m1**, the 4-bit value: one sign bit, two exponent bits (bias 1), one
      mantissa bit. Its 16 codes are the values 0, 0.5, 1, 1.5, 2, 3, 4, 6 and their
      negatives (code 8 is -0). :func:`e2m1_decode` / :func:`e2m1_encode` (round to
      nearest, ties to the even code, saturating at 6: what ``cvt.rn.satfinite.e2m1x2``
      does).
    * **Packing**: two values per byte along K, the element with the even K index in
      the low nibble (bits 3..0), the odd one in the high nibble. This is torch's
      ``float4_e2m1fn_x2`` (its header draws ``val1 : val0`` as bits ``7654 : 3210``)
      and CUTLASS's sub-byte order (element 0 in the least significant bits).
      :func:`pack_fp4` / :func:`unpack_fp4`.
    * **Scales**: one float8 e4m3 per 16 consecutive K elements of every row (NVFP4's
      block size). Two layouts of the same numbers:

      - *plain* ``(MN, K/16, L)``: ``sf[i, j, l]`` scales ``x[i, 16j:16j+16, l]``;
      - *permuted* ``(32, 4, rest_mn, 4, rest_k, L)``, the 128x4 block-scaling layout
        of cuBLAS and tcgen05: row ``i`` goes to ``[i % 32, (i % 128) // 32, i // 128]``
        and k-block ``j`` to ``[j % 4, j // 4]``. In memory it is ``L``, then
        ``rest_mn``, then ``rest_k`` blocks of 512 bytes, each holding 128 rows x 4
        scales as 32 rows of 16 bytes: byte ``(i % 32) * 16 + ((i % 128) // 32) * 4 + j % 4``.
        One such 512-byte block is what one ``tcgen05.cp ... 32x128b.warpx4`` moves to
        tensor memory for one 64-wide K step of a 128-row MMA.

      :func:`permute_scales` / :func:`unpermute_scales` convert between them,
      :func:`permuted_index` / :func:`permuted_offset` say where one scale goes.
    * :func:`dequantize`, :func:`quantize` (per-16 amax / 6 -> e4m3 scale -> e2m1 codes),
      :func:`reference` (``silu(A B1^T) * (A B2^T)`` in FP32, FP16 out),
      :func:`check_close` (rtol = atol = 1e-3, the GPU MODE ``nvfp4_dual_gemm`` checker),
      :func:`generate` (test and benchmark data: every e2m1 code, scales spread over
      more than a decade), :func:`check_operands` (clear errors for bad input), and
      :func:`draw_scale_layout` (the figure of the permutation).

The problem matches GPU MODE's ``nvfp4_dual_gemm`` (B200): A is M x K, B1 and B2 are
N x K, all NVFP4 and K-major with a batch dimension L = 1, C = silu(A B1^T) * (A B2^T)
in FP16, K a multiple of 256.

Everything here is plain torch and runs on any device (the CPU tier included).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from .checks import check_int, check_real

#: e2m1 value of each 4-bit code (bit 3 sign, bits 2..1 exponent, bit 0 mantissa). Code 8 is -0.
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
               -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
E2M1_MAX = 6.0
E4M3_MAX = 448.0
#: NVFP4: one e4m3 scale per this many consecutive K elements.
SF_VEC = 16
#: The permuted layout's atom: 128 rows (32 x 4) by 4 scales (64 K elements), 512 bytes.
ATOM_MN = 128
ATOM_K = 4
ATOM_BYTES = ATOM_MN * ATOM_K
#: K must be a multiple of this: the kernels' k-block (256 e2m1 values = 128 bytes per row).
K_MULTIPLE = 256
#: The checker's tolerances (GPU MODE's ``make_match_reference(rtol=1e-3, atol=1e-3)``).
RTOL = ATOL = 1e-3
#: The four benchmark shapes (M, N, K) of GPU MODE's ``nvfp4_dual_gemm``.
BENCHMARK_SHAPES = ((256, 4096, 7168), (512, 4096, 7168), (256, 3072, 4096), (512, 3072, 7168))
#: Speed of light on a B200 for those shapes (GPU MODE's figures), microseconds.
SOL_US = (4.708, 8.714, 2.125, 6.535)
#: Small shapes for tests: partial 128-row tiles, N not a multiple of 128, several k-blocks.
TEST_SHAPES = ((128, 128, 256), (256, 256, 512), (200, 136, 768), (64, 96, 1024), (384, 320, 256))


def _torch():
    import torch

    return torch


def fp4_packed_dtypes() -> tuple:
    """The dtypes a packed FP4 tensor may have: uint8, and torch's ``float4_e2m1fn_x2`` where it exists."""
    torch = _torch()
    out = [torch.uint8]
    if hasattr(torch, "float4_e2m1fn_x2"):
        out.append(torch.float4_e2m1fn_x2)
    return tuple(out)


def as_bytes(packed):
    """A packed FP4 tensor as uint8 (a view: ``float4_e2m1fn_x2`` has no arithmetic in torch)."""
    torch = _torch()
    return packed if packed.dtype == torch.uint8 else packed.view(torch.uint8)


def as_fp4x2(packed):
    """uint8 packed FP4 as torch's ``float4_e2m1fn_x2`` (a view), or unchanged if torch lacks it."""
    torch = _torch()
    if hasattr(torch, "float4_e2m1fn_x2") and packed.dtype == torch.uint8:
        return packed.view(torch.float4_e2m1fn_x2)
    return packed


# --------------------------------------------------------------------------------------
# e2m1 values and packing
# --------------------------------------------------------------------------------------


def _check_codes(name: str, codes, torch) -> None:
    """``codes`` must be an integer tensor of e2m1 codes, 0..15 (not floats, not bytes past a nibble)."""
    if not isinstance(codes, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of e2m1 codes (integers 0..15); got {type(codes).__name__}")
    if codes.dtype == torch.bool or codes.is_floating_point() or codes.is_complex():
        raise TypeError(f"{name} must have an integer dtype (e2m1 codes 0..15, e.g. uint8); got "
                        f"{str(codes.dtype).replace('torch.', '')}: values are encoded with e2m1_encode")
    if codes.numel() and (int(codes.min()) < 0 or int(codes.max()) > 15):
        raise ValueError(f"{name} must hold e2m1 codes 0..15; got values from {int(codes.min())} to {int(codes.max())}")


def e2m1_decode(codes):
    """FP32 values of e2m1 ``codes`` (any integer tensor of values 0..15)."""
    torch = _torch()
    _check_codes("codes", codes, torch)
    return _decode(codes, torch)


def _decode(codes, torch):
    """:func:`e2m1_decode` of codes known to be 0..15 (no check: no reduction, no device sync)."""
    lut = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=codes.device)
    return lut[codes.long() & 0xF]


def e2m1_encode(x):
    """e2m1 codes (uint8, 0..15) of ``x``: round to nearest, ties to the even code, saturate at +-6.

    The sign is kept (a small negative value becomes -0, code 8), as the hardware's
    ``cvt.rn.satfinite.e2m1x2.f32`` does. NaN is rejected: e2m1 has no NaN.
    """
    torch = _torch()
    x = x.float()
    if torch.isnan(x).any():
        raise ValueError("x must not contain NaN: e2m1 has no NaN")
    sign = torch.signbit(x)
    mag = x.abs().clamp(max=E2M1_MAX)
    grid = torch.tensor(E2M1_VALUES[:8], dtype=torch.float32, device=x.device)
    mids = (grid[1:] + grid[:-1]) / 2
    # code c covers (mid[c-1], mid[c]); a value exactly on a midpoint goes to the even code.
    code = torch.bucketize(mag, mids, right=False)  # mag == mid -> lower code
    on_mid = (code < 7) & (mag == mids[code.clamp(max=6)])
    code = torch.where(on_mid & (code % 2 == 1), code + 1, code)
    return (code + 8 * sign.long()).to(torch.uint8)


def pack_fp4(codes):
    """Pack e2m1 ``codes`` (uint8 0..15, last dimension K, even) two per byte: even K index in the low nibble."""
    torch = _torch()
    _check_codes("codes", codes, torch)
    if codes.dim() == 0 or codes.shape[-1] % 2:
        raise ValueError(f"codes must have an even last dimension (two values per byte); got {tuple(codes.shape)}")
    c = codes.to(torch.uint8)
    return (c[..., 0::2] & 0xF) | ((c[..., 1::2] & 0xF) << 4)


def _check_packed_dtype(name: str, packed, torch) -> None:
    if not isinstance(packed, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of packed FP4 bytes; got {type(packed).__name__}")
    if packed.dtype not in fp4_packed_dtypes():
        allowed = " or ".join(str(d).replace("torch.", "") for d in fp4_packed_dtypes())
        raise TypeError(f"{name} must have dtype {allowed} (two e2m1 codes per byte); got "
                        f"{str(packed.dtype).replace('torch.', '')}")
    if packed.dim() == 0:
        raise ValueError(f"{name} must have at least one dimension (K/2 bytes last); got a 0-d tensor")


def unpack_fp4(packed):
    """The e2m1 codes (uint8, last dimension doubled) of packed FP4 bytes: low nibble first."""
    torch = _torch()
    _check_packed_dtype("packed", packed, torch)
    p = as_bytes(packed)
    out = torch.stack((p & 0xF, p >> 4), dim=-1)
    return out.reshape(*p.shape[:-1], 2 * p.shape[-1])


# --------------------------------------------------------------------------------------
# Scale layouts
# --------------------------------------------------------------------------------------


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def permuted_shape(mn: int, sf_k: int, l: int = 1) -> tuple:
    """Shape ``(32, 4, rest_mn, 4, rest_k, L)`` of the permuted scales of ``mn`` rows and ``sf_k`` scales per row."""
    mn, sf_k, l = check_int("mn", mn, lo=1), check_int("sf_k", sf_k, lo=1), check_int("l", l, lo=1)
    return (32, 4, ceil_div(mn, ATOM_MN), ATOM_K, ceil_div(sf_k, ATOM_K), l)


def permuted_index(i: int, j: int) -> tuple:
    """Where plain scale ``[i, j]`` (row ``i``, k-block ``j`` of 16) sits in the permuted tensor (without L)."""
    i, j = check_int("i", i, lo=0), check_int("j", j, lo=0)
    return (i % 32, (i % ATOM_MN) // 32, i // ATOM_MN, j % ATOM_K, j // ATOM_K)


def permuted_offset(i: int, j: int, mn: int, sf_k: int, l: int = 0) -> int:
    """Byte offset of plain scale ``[i, j, l]`` in the permuted tensor's memory (cuBLAS's block order).

    ``i`` < ``mn`` rows and ``j`` < ``sf_k`` scales per row: an offset outside the scales is an error.
    """
    mn, sf_k = check_int("mn", mn, lo=1), check_int("sf_k", sf_k, lo=1)
    i, j = check_int("i", i, lo=0, hi=mn - 1), check_int("j", j, lo=0, hi=sf_k - 1)
    l = check_int("l", l, lo=0)
    rest_mn, rest_k = ceil_div(mn, ATOM_MN), ceil_div(sf_k, ATOM_K)
    block = (l * rest_mn + i // ATOM_MN) * rest_k + j // ATOM_K
    return block * ATOM_BYTES + (i % 32) * 16 + ((i % ATOM_MN) // 32) * 4 + j % ATOM_K


def _as3d(t, name: str):
    if t.dim() == 2:
        return t.unsqueeze(-1)
    if t.dim() != 3:
        raise ValueError(f"{name} must be 2-D or 3-D (rows, columns[, L]); got shape {tuple(t.shape)}")
    return t


def permute_scales(sf):
    """Plain scales ``(MN, K/16[, L])`` -> the permuted ``(32, 4, rest_mn, 4, rest_k, L)`` view.

    The result is a strided view of a buffer laid out as ``(L, rest_mn, rest_k, 32, 4, 4)``
    (so its bytes, in memory order, are cuBLAS's blocked layout). Rows past MN and
    k-blocks past K/16 are padding, filled with zero.
    """
    torch = _torch()
    sf = _as3d(sf, "sf")
    mn, sf_k, l = sf.shape
    rest_mn, rest_k = ceil_div(mn, ATOM_MN), ceil_div(sf_k, ATOM_K)
    raw = sf.view(torch.uint8) if sf.dtype.itemsize == 1 and sf.dtype != torch.uint8 else sf
    pad = torch.zeros((rest_mn * ATOM_MN, rest_k * ATOM_K, l), dtype=raw.dtype, device=sf.device)
    pad[:mn, :sf_k] = raw
    # (rest_mn, 4, 32, rest_k, 4, L) -> memory order (L, rest_mn, rest_k, 32, 4[m], 4[k])
    blocks = pad.view(rest_mn, 4, 32, rest_k, ATOM_K, l).permute(5, 0, 3, 2, 1, 4).contiguous()
    out = blocks.permute(3, 4, 1, 5, 2, 0)  # (32, 4, rest_mn, 4, rest_k, L)
    return out.view(sf.dtype) if raw is not sf else out


def _check_perm(name: str, perm, torch) -> None:
    if not isinstance(perm, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor (permuted scales); got {type(perm).__name__}")
    if perm.dim() != 6 or perm.shape[0] != 32 or perm.shape[1] != 4 or perm.shape[3] != ATOM_K:
        raise ValueError(f"{name} must have shape (32, 4, rest_mn, 4, rest_k, L) (permute_scales' result); "
                         f"got {tuple(perm.shape)}")


def unpermute_scales(perm, mn: int, sf_k: int | None = None):
    """The permuted scales back to plain ``(MN, sf_k, L)`` (dropping the padding); ``sf_k`` defaults to all."""
    torch = _torch()
    _check_perm("perm", perm, torch)
    raw = perm.view(torch.uint8) if perm.dtype.itemsize == 1 and perm.dtype != torch.uint8 else perm
    _, _, rest_mn, _, rest_k, l = raw.shape
    mn = check_int("mn", mn, lo=1, hi=rest_mn * ATOM_MN)
    sf_k = rest_k * ATOM_K if sf_k is None else check_int("sf_k", sf_k, lo=1, hi=rest_k * ATOM_K)
    plain = raw.permute(2, 1, 0, 4, 3, 5).reshape(rest_mn * ATOM_MN, rest_k * ATOM_K, l)
    out = plain[:mn, :sf_k].contiguous()
    return out.view(perm.dtype) if raw is not perm else out


def blocked_bytes(perm):
    """The permuted scales' bytes in memory order (cuBLAS's flat blocked layout, one batch after another)."""
    torch = _torch()
    _check_perm("perm", perm, torch)
    if perm.dtype.itemsize != 1:
        raise TypeError(f"perm must hold one byte per scale (float8_e4m3fn or uint8); got "
                        f"{str(perm.dtype).replace('torch.', '')}")
    raw = perm.view(torch.uint8) if perm.dtype != torch.uint8 else perm
    return raw.permute(5, 2, 4, 0, 1, 3).reshape(-1)


# --------------------------------------------------------------------------------------
# Dequantize, quantize
# --------------------------------------------------------------------------------------


def dequantize(packed, sf):
    """FP32 values ``(MN, K[, L])`` of packed FP4 ``(MN, K/2[, L])`` with plain scales ``(MN, K/16[, L])``.

    Every value is e2m1 x e4m3, exact in FP32 (and in BF16: 2 + 4 significant bits).
    """
    torch = _torch()
    _check_packed_dtype("packed", packed, torch)
    if not isinstance(sf, torch.Tensor):
        raise TypeError(f"sf must be a torch.Tensor of scales; got {type(sf).__name__}")
    if not sf.is_floating_point():
        hint = ("; raw e4m3 bytes? pass sf.view(torch.float8_e4m3fn)" if sf.dtype in (torch.uint8, torch.int8)
                else "")
        raise TypeError(f"sf must hold e4m3 scales (float8_e4m3fn) or their values in a float dtype; got "
                        f"{str(sf.dtype).replace('torch.', '')}{hint}")
    two_d = packed.dim() == 2
    p, s = _as3d(as_bytes(packed), "packed"), _as3d(sf, "sf")
    codes = unpack_fp4(p.permute(0, 2, 1)).permute(0, 2, 1)  # (MN, K, L)
    vals = _decode(codes, torch)  # nibbles: 0..15 by construction (baseline (a) times this: no extra sync)
    k = vals.shape[1]
    if s.shape[0] != vals.shape[0] or s.shape[1] * SF_VEC != k or s.shape[2] != vals.shape[2]:
        raise ValueError(f"sf must have shape ({vals.shape[0]}, {k // SF_VEC}, {vals.shape[2]}) for packed of shape "
                         f"{tuple(p.shape)}; got {tuple(s.shape)}")
    out = vals * s.float().repeat_interleave(SF_VEC, dim=1)
    return out[..., 0] if two_d else out


def quantize(x):
    """NVFP4 of ``x`` ``(MN, K[, L])``: returns ``(packed uint8 (MN, K/2[, L]), plain scales e4m3 (MN, K/16[, L]))``.

    Per block of 16 along K: scale = amax / 6 rounded to e4m3 (so the block's largest
    magnitude lands near e2m1's 6), then each value / scale rounded to e2m1. A block
    of zeros, or one whose scale underflows e4m3, gets scale 0 and codes 0.
    """
    torch = _torch()
    two_d = x.dim() == 2
    x3 = _as3d(x.float(), "x")
    mn, k, l = x3.shape
    if k % SF_VEC:
        raise ValueError(f"x must have K a multiple of {SF_VEC}; got K={k}")
    if not torch.isfinite(x3).all():
        raise ValueError("x must be finite")
    blocks = x3.view(mn, k // SF_VEC, SF_VEC, l)
    amax = blocks.abs().amax(dim=2)  # (MN, K/16, L)
    sf = (amax / E2M1_MAX).clamp(max=E4M3_MAX).to(torch.float8_e4m3fn)
    s = sf.float().unsqueeze(2)
    ratio = torch.where(s > 0, blocks / torch.where(s > 0, s, torch.ones_like(s)), torch.zeros_like(blocks))
    codes = e2m1_encode(ratio).view(mn, k, l)
    packed = pack_fp4(codes.permute(0, 2, 1)).permute(0, 2, 1).contiguous()
    if two_d:
        return packed[..., 0], sf[..., 0]
    return packed, sf


# --------------------------------------------------------------------------------------
# Operands, validation, reference, checker
# --------------------------------------------------------------------------------------


@dataclass
class DualGemmOperands:
    """One problem's tensors, in GPU MODE's order and shapes (``L`` last, L = 1 by default).

    ``a`` (M, K/2, L), ``b1``/``b2`` (N, K/2, L): packed FP4 (uint8, or ``float4_e2m1fn_x2``);
    ``sfa`` (M, K/16, L), ``sfb1``/``sfb2`` (N, K/16, L): plain e4m3 scales;
    ``sfa_perm`` etc.: the same scales permuted; ``c`` (M, N, L): FP16 output buffer.
    """

    a: object
    b1: object
    b2: object
    sfa: object
    sfb1: object
    sfb2: object
    sfa_perm: object
    sfb1_perm: object
    sfb2_perm: object
    c: object

    @property
    def mnkl(self) -> tuple:
        m, kh, l = self.a.shape
        return m, self.b1.shape[0], 2 * kh, l

    def inputs(self) -> tuple:
        """``(a, b1, b2, sfa, sfb1, sfb2)``: what :func:`reference` takes."""
        return self.a, self.b1, self.b2, self.sfa, self.sfb1, self.sfb2

    def to(self, device) -> "DualGemmOperands":
        """The same problem on ``device`` (FP4 moved as bytes: torch copies ``float4_e2m1fn_x2`` poorly)."""
        def move(t):
            return as_fp4x2(as_bytes(t).to(device)) if t.dtype in fp4_packed_dtypes() else t.to(device)

        return DualGemmOperands(*(move(t) for t in (self.a, self.b1, self.b2, self.sfa, self.sfb1, self.sfb2)),
                                *(permute_scales(move(t)) for t in (self.sfa, self.sfb1, self.sfb2)),
                                move(self.c))


def check_problem(m: int, n: int, k: int, l: int = 1) -> tuple[int, int, int, int]:
    """Sizes the dual GEMM accepts: M, N, L >= 1 and K a positive multiple of 256; returns them as ``int``."""
    m = check_int("M", m, lo=1)
    n = check_int("N", n, lo=1)
    l = check_int("L", l, lo=1)
    k = check_int("K", k, lo=K_MULTIPLE)
    if k % K_MULTIPLE:
        raise ValueError(f"K must be a multiple of {K_MULTIPLE} (the k-block: 256 FP4 values, 128 bytes a row); "
                         f"got K={k}")
    return m, n, k, l


def _check_packed(name: str, t, torch):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor; got {type(t).__name__}")
    allowed = fp4_packed_dtypes()
    if t.dtype not in allowed:
        names = ", ".join(str(d).replace("torch.", "") for d in allowed)
        raise TypeError(f"{name} must hold packed FP4 (two e2m1 per byte), dtype {names}; "
                        f"got {str(t.dtype).replace('torch.', '')}")
    if t.dim() != 3:
        raise ValueError(f"{name} must be 3-D (rows, K/2, L): packed FP4, K-major; got shape {tuple(t.shape)}")
    if t.stride(1) != 1:
        raise ValueError(f"{name} must be K-major (stride 1 along its packed K dimension); got strides {t.stride()}")


def _check_sf(name: str, t, rows: int, k: int, l: int, torch):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor; got {type(t).__name__}")
    if t.dtype != torch.float8_e4m3fn:
        raise TypeError(f"{name} must have dtype float8_e4m3fn (NVFP4 scales); got {str(t.dtype).replace('torch.', '')}")
    want = (rows, k // SF_VEC, l)
    if tuple(t.shape) != want:
        raise ValueError(f"{name} must have shape {want} (one scale per {SF_VEC} K elements of every row); "
                         f"got {tuple(t.shape)}")


def check_permuted(name: str, t, rows: int, k: int, l: int) -> None:
    """``t`` must be the permuted scales of ``rows`` rows and K = ``k``: e4m3, shape (32, 4, rest, 4, rest_k, L)."""
    torch = _torch()
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor; got {type(t).__name__}")
    if t.dtype != torch.float8_e4m3fn:
        raise TypeError(f"{name} must have dtype float8_e4m3fn (NVFP4 scales); got {str(t.dtype).replace('torch.', '')}")
    want = permuted_shape(rows, k // SF_VEC, l)
    if tuple(t.shape) != want:
        raise ValueError(f"{name} must have the permuted shape {want} (32, 4, rest_mn, 4, rest_k, L); "
                         f"got {tuple(t.shape)}")


def check_operands(a, b1, b2, sfa, sfb1, sfb2) -> tuple:
    """Validate the dual GEMM's inputs; return ``(M, N, K, L)``.

    Packed FP4 (uint8 or ``float4_e2m1fn_x2``) ``a`` (M, K/2, L), ``b1``/``b2`` (N, K/2, L),
    K-major; K a multiple of 256; plain e4m3 scales (rows, K/16, L); all on one device.
    Raises ``TypeError`` / ``ValueError`` naming the argument and the rule.
    """
    torch = _torch()
    for name, t in (("a", a), ("b1", b1), ("b2", b2)):
        _check_packed(name, t, torch)
    m, kh, l = a.shape
    k = 2 * kh
    n = b1.shape[0]
    if tuple(b2.shape) != tuple(b1.shape):
        raise ValueError(f"b1 and b2 must have the same shape; got {tuple(b1.shape)} and {tuple(b2.shape)}")
    if b1.shape[1] != kh:
        raise ValueError(f"b1 and b2 must have K/2 = {kh} packed bytes per row, as a does; got {b1.shape[1]}")
    if b1.shape[2] != l:
        raise ValueError(f"b1 and b2 must have the batch L = {l} of a; got {b1.shape[2]}")
    check_problem(m, n, k, l)
    _check_sf("sfa", sfa, m, k, l, torch)
    _check_sf("sfb1", sfb1, n, k, l, torch)
    _check_sf("sfb2", sfb2, n, k, l, torch)
    dev = a.device
    for name, t in (("b1", b1), ("b2", b2), ("sfa", sfa), ("sfb1", sfb1), ("sfb2", sfb2)):
        if t.device != dev:
            raise ValueError(f"{name} must be on a's device {dev}; got {t.device}")
    return m, n, k, l


def silu_mul(acc1, acc2):
    """The gate: ``silu(acc1) * acc2`` in FP32 (silu(x) = x * sigmoid(x))."""
    torch = _torch()
    return torch.nn.functional.silu(acc1.float()) * acc2.float()


def reference(a, b1, b2, sfa, sfb1, sfb2):
    """``C = silu(A B1^T) * (A B2^T)``, FP16 ``(M, N, L)``: dequantize to FP32, two products, gate in FP32."""
    torch = _torch()
    check_operands(a, b1, b2, sfa, sfb1, sfb2)
    fa, f1, f2 = dequantize(a, sfa), dequantize(b1, sfb1), dequantize(b2, sfb2)
    outs = []
    for li in range(fa.shape[2]):
        x = fa[..., li]
        r1 = x @ f1[..., li].T
        r2 = x @ f2[..., li].T
        outs.append(silu_mul(r1, r2).to(torch.float16))
    return torch.stack(outs, dim=-1)


@dataclass(frozen=True)
class CheckResult:
    """What :func:`check_close` found: ``ok``, the largest absolute error, how many elements failed."""

    ok: bool
    max_abs_err: float
    bad: int
    total: int
    rtol: float = RTOL
    atol: float = ATOL

    def __str__(self) -> str:
        verdict = "OK" if self.ok else f"MISMATCH ({self.bad} of {self.total} elements)"
        tol = f"rtol = atol = {self.rtol:g}" if self.rtol == self.atol else f"rtol = {self.rtol:g}, atol = {self.atol:g}"
        return f"{verdict}: max |err| = {self.max_abs_err:.3g} ({tol})"


def check_close(out, ref, rtol: float = RTOL, atol: float = ATOL) -> CheckResult:
    """``|out - ref| <= atol + rtol |ref|`` elementwise (NaN or inf in ``out`` fails)."""
    torch = _torch()
    rtol, atol = check_real("rtol", rtol, lo=0), check_real("atol", atol, lo=0)
    for name, t in (("out", out), ("ref", ref)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor; got {type(t).__name__}")
    if tuple(out.shape) != tuple(ref.shape):
        raise ValueError(f"out must have the reference's shape {tuple(ref.shape)}; got {tuple(out.shape)}")
    o, r = out.float().cpu(), ref.float().cpu()
    err = (o - r).abs()
    bad = ~(err <= atol + rtol * r.abs())  # NaN compares False -> bad
    finite = err[torch.isfinite(err)]
    max_err = float(finite.max()) if finite.numel() else float("nan")
    if not torch.isfinite(err).all():
        max_err = float("inf")
    return CheckResult(ok=not bool(bad.any()), max_abs_err=max_err, bad=int(bad.sum()), total=o.numel(), rtol=rtol,
                       atol=atol)


# --------------------------------------------------------------------------------------
# Data
# --------------------------------------------------------------------------------------

#: log2 of the spread of the scales :func:`generate` draws: each scale is base * 2**U(-SPREAD/2, SPREAD/2).
SCALE_SPREAD_LOG2 = 4.0


def _random_scales(rows: int, sf_k: int, l: int, base: float, gen, torch):
    e = (torch.rand((rows, sf_k, l), generator=gen) - 0.5) * SCALE_SPREAD_LOG2
    return (base * torch.exp2(e)).clamp(max=E4M3_MAX).to(torch.float8_e4m3fn)


def generate(m: int, n: int, k: int, l: int = 1, seed: int = 0, device="cpu") -> DualGemmOperands:
    """Random NVFP4 operands for C = silu(A B1^T) * (A B2^T).

    The e2m1 codes are uniform over all 16 (so every value, -0 included, appears);
    each scale is ``base * 2**u`` with ``u`` uniform in [-2, 2] rounded to e4m3 (a
    16x spread, many distinct e4m3 values), ``base`` chosen from K so that A B^T has
    a standard deviation of about 3 (the gate then stays well inside FP16's range).
    ``c`` is filled with NaN (a poisoned output: an element a kernel forgets to write fails the check).
    """
    torch = _torch()
    m, n, k, l = check_problem(m, n, k, l)
    gen = torch.Generator().manual_seed(seed)
    # E[v^2] of a uniform e2m1 code is 8.5625 and E[2^(2u)] of the spread is (2^(2h) - 2^(-2h)) / (4h ln 2),
    # h = SPREAD/2; std(A B^T) = 8.5625 sqrt(K) E[2^(2u)] base^2.
    h = SCALE_SPREAD_LOG2 / 2
    spread = (2 ** (2 * h) - 2 ** (-2 * h)) / (4 * h * math.log(2))
    base = (3.0 / (8.5625 * k ** 0.5 * spread)) ** 0.5

    def packed(rows):
        codes = torch.randint(0, 16, (l, rows, k), generator=gen, dtype=torch.uint8)
        return pack_fp4(codes).permute(1, 2, 0)  # (rows, K/2, L), K-major, L outermost in memory

    a, b1, b2 = packed(m), packed(n), packed(n)
    sf_k = k // SF_VEC
    sfa = _random_scales(m, sf_k, l, base, gen, torch)
    sfb1 = _random_scales(n, sf_k, l, base, gen, torch)
    sfb2 = _random_scales(n, sf_k, l, base, gen, torch)
    c = torch.full((l, m, n), float("nan"), dtype=torch.float16).permute(1, 2, 0)
    ops = DualGemmOperands(a, b1, b2, sfa, sfb1, sfb2, None, None, None, c)
    ops.a, ops.b1, ops.b2 = (as_fp4x2(t) for t in (a, b1, b2))
    out = ops.to(device)
    return out


# --------------------------------------------------------------------------------------
# Figure
# --------------------------------------------------------------------------------------


def run_poisoned(call, m: int, n: int, k: int, seed: int = 0, device="cuda"):
    """One call of a kernel, checked as the kernels' tests check it: fresh :func:`generate` operands (seeded), the
    output poisoned with NaN (an element the kernel forgets to write fails), ``call(a, b1, b2, sfa, sfb1, sfb2,
    out=c)``, then :func:`check_close` against :func:`reference`. Returns ``(c, what call returned, the check)``."""
    torch = _torch()
    ops = generate(m, n, k, seed=seed, device=device)
    out = ops.c
    if not torch.isnan(out.float()).all():
        raise AssertionError("generate's output must start poisoned (all NaN)")
    returned = call(*ops.inputs(), out=out)
    if out.is_cuda:
        torch.cuda.synchronize(out.device)
    return out, returned, check_close(out, reference(*ops.inputs()))


def run_twice(call, m: int, n: int, k: int, seed: int = 0, device="cuda"):
    """Two calls on the same fresh :func:`generate` operands (seeded), each allocating its output
    (``call(a, b1, b2, sfa, sfb1, sfb2)``), as the kernels' repeat-call tests make them: state left by one launch
    (barriers, workspaces, a cluster's reduction) shows as two results that differ. Returns ``(first, second, the
    check of first against reference)``."""
    torch = _torch()
    ops = generate(m, n, k, seed=seed, device=device)
    first = call(*ops.inputs())
    second = call(*ops.inputs())
    if first.is_cuda:
        torch.cuda.synchronize(first.device)
    return first, second, check_close(first, reference(*ops.inputs()))


def draw_scale_layout(name: str = "11_scale_layout"):
    """The 128x4 permutation: plain scales of one 128-row, 4-k-block atom (left) and where they sit in its 512 bytes (right).

    Colour: the row's quarter ``(i % 128) // 32``; shade: the k-block ``j % 4``. Marked:
    rows 0, 31, 32, 127 at k-block 0 and 3. Saved as ``figures/<name>.png``.
    """
    import numpy as np

    from .figures import new_figure, save

    base = np.array([[0.12, 0.47, 0.71], [1.0, 0.5, 0.05], [0.17, 0.63, 0.17], [0.84, 0.15, 0.16]])

    def colour(i, j):
        c = base[(i % 128) // 32]
        return c + (1 - c) * (0.55 * j / 3)

    plain = np.zeros((128, 4, 3))
    atom = np.zeros((32, 16, 3))
    for i in range(128):
        for j in range(4):
            plain[i, j] = colour(i, j)
            off = permuted_offset(i, j, 128, 4)
            atom[off // 16, off % 16] = colour(i, j)
    fig, (ax0, ax1) = new_figure(1, 2, figsize=(10, 6.2), gridspec_kw=dict(width_ratios=[1, 2.4]))
    ax0.imshow(plain, aspect="auto", interpolation="nearest", extent=(-0.5, 3.5, 127.5, -0.5))
    ax0.set_title("plain scales sf[i, j]\n128 rows x 4 k-blocks (64 K values)", fontsize=10)
    ax0.set_xlabel("k-block j (16 values each)")
    ax0.set_ylabel("row i")
    ax0.set_xticks(range(4))
    ax0.set_yticks([0, 32, 64, 96, 127])
    ax1.imshow(atom, aspect="auto", interpolation="nearest", extent=(-0.5, 15.5, 31.5, -0.5))
    ax1.set_title("permuted: 512 bytes = 32 lines x 16 bytes\nbyte (i % 32)*16 + ((i % 128) // 32)*4 + j % 4",
                  fontsize=10)
    ax1.set_xlabel("byte within the 16-byte line: 4 x (row quarter (i % 128)//32), 4 scales j each")
    ax1.set_ylabel("line = i % 32")
    ax1.set_xticks(range(16))
    ax1.set_yticks([0, 8, 16, 24, 31])
    for x in (3.5, 7.5, 11.5):
        ax1.axvline(x, color="k", lw=1.2)
    for i, j in ((0, 0), (31, 0), (32, 0), (127, 0), (0, 3), (127, 3)):
        off = permuted_offset(i, j, 128, 4)
        y = i + {31: -3, 32: 3}.get(i, 0)  # rows 31 and 32 are neighbours: keep their labels apart
        ax0.text(j, y, f"{i},{j}", ha="center", va="center", fontsize=7, color="k")
        ax1.text(off % 16, off // 16, f"{i},{j}", ha="center", va="center", fontsize=7, color="k")
    fig.suptitle("NVFP4 scales: the 128x4 block-scaling layout (cuBLAS, tcgen05); labels are (row i, k-block j)",
                 fontsize=11)
    return save(fig, name)
