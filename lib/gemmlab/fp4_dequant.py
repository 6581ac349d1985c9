"""Chapter 11 on Hopper: NVFP4 bytes to FP16 in a few instructions per value (sm_89+ PTX).

Hopper has no e2m1 conversion, but it has ``cvt.rn.f16x2.e4m3x2`` (two FP8 e4m3 bytes
to two FP16 halves). An e2m1 code ``s e1 e0 m`` becomes an e4m3 byte by moving its
bits, no arithmetic: ``s`` to bit 7, ``e1 e0 m`` to bits 4..2::

    e4m3 byte  s 0 0 e1 e0 m 0 0   =   e2m1 value x 2^-6   (exactly, subnormals included:
                                                            e = 0, m = 1 is 2^-6 x 4/8 = 0.5 x 2^-6)

so ``cvt.rn.f16x2.e4m3x2`` turns two such bytes into two FP16 values ``v x 2^-6``, and one
``mul.rn.f16x2`` by the block's scale times 64 (an e4m3 value times 2^6 is at most
28672, exact in FP16) gives ``v x scale``. That product is exact in FP16: it has at most
6 significant bits (FP16 has 11) and lies in [2^-10, 2688] (FP16 normals span
[2^-14, 65504]). So the FP16 tiles the tensor cores read hold the NVFP4 values exactly,
and WGMMA's FP32 accumulation sees what the SM100 kernel's FP4 tensor cores see.

One 32-bit word of packed FP4 (8 values) costs 9 integer instructions (both nibbles of
all four bytes at once), 2 ``prmt`` to pair them, 4 ``cvt`` and 4 ``mul``: 19
instructions for 8 values, plus two ``mov`` that only split a register in halves (the
chapter's simple kernel spends more than 30 PTX instructions per value).

Every function here is one ``inline_ptx`` block; ``dequant_kernel`` runs them on a GPU so
that a test can compare them with :mod:`gemmlab.nvfp4`'s decoding for every code and scale.
"""
from __future__ import annotations

import functools

import cutlass
import cutlass.cute as cute
import cuda.bindings.driver as cuda
from cutlass import Int32

from .checks import check_int

#: FP16 64.0: the e4m3 trick yields v x 2^-6, so the scale is applied as scale x 2^6.
F16X2_64 = 0x54005400


def e4m3_byte_of_code(code: int) -> int:
    """The e4m3 byte the bit move makes of e2m1 ``code`` (0..15): ``s`` to bit 7, ``e1 e0 m`` to bits 4..2."""
    code = check_int("code", code, lo=0, hi=15)
    return (code & 8) << 4 | (code & 7) << 2


def fp4x8_ptx() -> str:
    """PTX: 8 packed e2m1 values (one 32-bit word, low nibble first) to 4 FP16x2 words.

    Inputs ``$r0`` (packed), ``$r1`` (FP16x2 scale of bytes 0-1), ``$r2`` (of bytes 2-3);
    outputs ``$w0..$w3``: ``$wi`` holds byte i's two values, the low nibble in the low half.
    """
    return (
        "{\n"
        ".reg .b32 lo, hi, t, u, p, q;\n"
        ".reg .b16 c0, c1, c2, c3;\n"
        # low nibbles: magnitude bits 2..0 -> 4..2, sign bit 3 -> 7 (every byte at once)
        "shl.b32 t, {$r0}, 2;\n"
        "and.b32 t, t, 0x1C1C1C1C;\n"
        "shl.b32 u, {$r0}, 4;\n"
        "and.b32 u, u, 0x80808080;\n"
        "or.b32 lo, t, u;\n"
        # high nibbles: magnitude bits 6..4 -> 4..2, the sign is already bit 7
        "shr.b32 t, {$r0}, 2;\n"
        "and.b32 t, t, 0x1C1C1C1C;\n"
        "and.b32 u, {$r0}, 0x80808080;\n"
        "or.b32 hi, t, u;\n"
        # pair byte i's two values: [lo0 hi0 lo1 hi1], [lo2 hi2 lo3 hi3]
        "prmt.b32 p, lo, hi, 0x5140;\n"
        "prmt.b32 q, lo, hi, 0x7362;\n"
        "mov.b32 {c0, c1}, p;\n"
        "mov.b32 {c2, c3}, q;\n"
        "cvt.rn.f16x2.e4m3x2 {$w0}, c0;\n"
        "cvt.rn.f16x2.e4m3x2 {$w1}, c1;\n"
        "cvt.rn.f16x2.e4m3x2 {$w2}, c2;\n"
        "cvt.rn.f16x2.e4m3x2 {$w3}, c3;\n"
        "mul.rn.f16x2 {$w0}, {$w0}, {$r1};\n"
        "mul.rn.f16x2 {$w1}, {$w1}, {$r1};\n"
        "mul.rn.f16x2 {$w2}, {$w2}, {$r2};\n"
        "mul.rn.f16x2 {$w3}, {$w3}, {$r2};\n"
        "}"
    )


def scale_ptx(byte: int) -> str:
    """PTX: byte ``byte`` (0..3) of the word ``$r0`` of e4m3 scales as FP16x2 ``(64 s, 64 s)`` in ``$w0``."""
    if byte not in (0, 1, 2, 3):
        raise ValueError(f"byte must be 0, 1, 2 or 3; got {byte!r}")
    sel = byte | byte << 4
    return (
        "{\n"
        ".reg .b32 t, k;\n"
        ".reg .b16 c0, c1;\n"
        f"prmt.b32 t, {{$r0}}, 0, 0x{sel:04X};\n"
        "mov.b32 {c0, c1}, t;\n"
        "cvt.rn.f16x2.e4m3x2 {$w0}, c0;\n"
        f"mov.b32 k, 0x{F16X2_64:08X};\n"
        "mul.rn.f16x2 {$w0}, {$w0}, k;\n"
        "}"
    )


def gather_ptx() -> str:
    """PTX: byte ``$r4`` (selector ``t | (t + 4) << 4``) of each of the words ``$r0..$r3``, in one word."""
    return (
        "{\n"
        ".reg .b32 a, b;\n"
        "prmt.b32 a, {$r0}, {$r1}, {$r4};\n"
        "prmt.b32 b, {$r2}, {$r3}, {$r4};\n"
        "prmt.b32 {$w0}, a, b, 0x5410;\n"
        "}"
    )


def fp4x8_to_f16(packed, scale_lo, scale_hi) -> tuple:
    """8 e2m1 values (a 32-bit word) times their scales: 4 FP16x2 words, byte i's pair in word i."""
    return cute.arch.inline_ptx(fp4x8_ptx(), write_only_types=[Int32] * 4,
                                read_only_args=[packed, scale_lo, scale_hi])


def scale_f16x2(word, byte: int):
    """Byte ``byte`` of a word of e4m3 scales as the FP16x2 multiplier ``(64 s, 64 s)``."""
    return cute.arch.inline_ptx(scale_ptx(byte), write_only_types=[Int32], read_only_args=[word])


def gather_bytes(w0, w1, w2, w3, selector):
    """``[w0.t, w1.t, w2.t, w3.t]``: byte t of four words (``selector = t | (t + 4) << 4``)."""
    return cute.arch.inline_ptx(gather_ptx(), write_only_types=[Int32], read_only_args=[w0, w1, w2, w3, selector])


# --------------------------------------------------------------------------------------
# A kernel that runs the three functions, for tests (every code, every scale)
# --------------------------------------------------------------------------------------


@cute.kernel
def dequant_kernel(packed: cute.Tensor, scales: cute.Tensor, out: cute.Tensor, n: Int32):
    """Thread i: the four scale multipliers of ``scales[i]`` (``out[9 i + 4 .. 9 i + 7]``), ``packed[i]``
    times the scales of bytes 0 and 3 (``out[9 i .. 9 i + 3]``) and byte ``i % 4`` of ``packed[i .. i + 3]``
    gathered into one word (``out[9 i + 8]``)."""
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    i = bidx * 128 + tidx
    if i < n:
        sw = scales[i]
        s0 = scale_f16x2(sw, 0)
        s1 = scale_f16x2(sw, 1)
        s2 = scale_f16x2(sw, 2)
        s3 = scale_f16x2(sw, 3)
        h0, h1, h2, h3 = fp4x8_to_f16(packed[i], s0, s3)
        t = i % 4
        g = gather_bytes(packed[i], packed[(i + 1) % n], packed[(i + 2) % n], packed[(i + 3) % n], t | (t + 4) << 4)
        for j, w in enumerate((h0, h1, h2, h3, s0, s1, s2, s3, g)):
            out[9 * i + j] = w


@functools.lru_cache(maxsize=None)
def _dequant_host():
    @cute.jit
    def dequant_host(packed: cute.Tensor, scales: cute.Tensor, out: cute.Tensor, n: Int32, stream: cuda.CUstream):
        dequant_kernel(packed, scales, out, n).launch(grid=((n + 127) // 128, 1, 1), block=(128, 1, 1),
                                                      stream=stream)

    return dequant_host


def compile_dequant(target: str = "sm_90a"):
    """The test kernel compiled without a GPU (its PTX shows the three blocks)."""
    from .compile import compile_for, fake_stream, fake_tensor

    args = [fake_tensor(Int32, (1024,)), fake_tensor(Int32, (1024,)), fake_tensor(Int32, (9 * 1024,))]
    return compile_for(target, _dequant_host(), *args, Int32(1024), fake_stream())


def run_dequant(packed, scales):
    """Run :func:`dequant_kernel` on int32 tensors ``packed`` and ``scales`` (n words each).

    Returns an int32 tensor (n, 9): per thread four FP16x2 products, four scale multipliers, one gathered word.
    """
    import torch

    from .compile import launcher

    n = packed.numel()
    if packed.dtype != torch.int32 or scales.dtype != torch.int32 or scales.numel() != n:
        raise ValueError("packed and scales must be int32 tensors with the same number of words")
    out = torch.zeros(n * 9, dtype=torch.int32, device=packed.device)
    launcher(_dequant_host(), packed, scales, out, cutlass.Int32(n))()
    return out.view(n, 9)
