"""Matrices in shared memory as the tensor cores read them: the canonical layouts behind a matrix descriptor.

Both WGMMA (sm_90a) and tcgen05.mma (sm_100a) read A and B from shared memory
through a 64-bit *matrix descriptor*: a start address, a leading-dimension byte
offset (LBO), a stride-dimension byte offset (SBO) and a swizzle mode (PTX ISA,
"Matrix Descriptor Format" for wgmma and "Shared memory descriptor" for tcgen05).
The descriptor does not spell out a layout; it parameterises one of the canonical
layouts the ISA and CUTLASS define (``cute/arch/mma_sm90_desc.hpp`` writes them in
CuTe notation, in units of 16 bytes; ``T`` = elements per 16 bytes):

=========  ==================================================  ==============================================
swizzle    K-major (rows of the MMA's M or N, K contiguous)    MN-major (M or N contiguous)
=========  ==================================================  ==============================================
none       ((8,m),(T,2)) : ((1T,SBO),(1,LBO))                  ((T,1,m),(8,k)) : ((1,T,SBO),(1T,LBO))
32B        ((8,m),(T,2)) : ((2T,SBO),(1,T))                    ((T,2,m),(8,k)) : ((1,T,LBO),(2T,SBO))
64B        ((8,m),(T,2)) : ((4T,SBO),(1,T))                    ((T,4,m),(8,k)) : ((1,T,LBO),(4T,SBO))
128B       ((8,m),(T,2)) : ((8T,SBO),(1,T))                    ((T,8,m),(8,k)) : ((1,T,LBO),(8T,SBO))
=========  ==================================================  ==============================================

then ``Swizzle<B,4,3>`` (B = 1, 2, 3 for 32/64/128-byte swizzling) on the byte
address: bits ``[4, 4+B)`` are XORed with bits ``[7, 7+B)``. The swizzle acts on
the absolute shared-memory address, which is why swizzled tiles start on a
1024-byte boundary (and why a descriptor's start address may move by 32 bytes
inside a 128-byte row to reach the next K slice, as chapter 06 and 09 show).
"""
from __future__ import annotations

import numpy as np

from .errors import Unsupported

SWIZZLE_BITS = {0: 0, 32: 1, 64: 2, 128: 3}


def swizzle(addr: np.ndarray, width: int) -> np.ndarray:
    """``Swizzle<B,4,3>`` of byte addresses for a ``width``-byte swizzle (0 = none)."""
    b = SWIZZLE_BITS[width]
    if not b:
        return addr
    mask = np.int64((1 << b) - 1)
    return addr ^ (((addr >> 7) & mask) << 4)


def element_offsets(mn: int, k: int, elem_bits: int, major: str, lbo: int, sbo: int, width: int) -> np.ndarray:
    """Byte offsets (before swizzling, from the start address) of every element ``(i, j)`` of an
    ``mn x k`` operand; for 4-bit elements the offset of the byte holding it (low nibble first)."""
    i = np.arange(mn, dtype=np.int64)[:, None]
    j = np.arange(k, dtype=np.int64)[None, :]
    if elem_bits == 4:
        kb = j // 2 if major == "K" else None
        ib = i // 2 if major == "MN" else None
    if major == "K":
        kbyte = (j * elem_bits) // 8
        if width == 0:  # core matrices of 8 rows x 16 bytes; the next 16 bytes of K at LBO
            return (i % 8) * 16 + (i // 8) * sbo + (kbyte % 16) + (kbyte // 16) * lbo
        if (k * elem_bits) // 8 > width:
            raise Unsupported(f"a K-major operand with {k * elem_bits // 8} bytes of K per row and a {width}-byte "
                              "swizzle (one MMA reads at most one swizzle row of K)")
        return (i % 8) * width + (i // 8) * sbo + kbyte
    if major == "MN":
        mnbyte = (i * elem_bits) // 8
        if width == 0:
            return (mnbyte % 16) + (mnbyte // 16) * sbo + (j % 8) * 16 + (j // 8) * lbo
        return (mnbyte % width) + (mnbyte // width) * lbo + (j % 8) * width + (j // 8) * sbo
    raise ValueError(f"major must be 'K' or 'MN'; got {major!r}")


def read_operand(smem, start: int, mn: int, k: int, elem_bits: int, major: str, lbo: int, sbo: int,
                 width: int) -> np.ndarray:
    """The ``mn x k`` operand's raw element codes (uint8/uint16/uint32 by ``elem_bits``) from ``smem``
    (a :class:`gemmlab.emulator.memory.SharedMemory`), ``start`` being a shared::cta address."""
    off = element_offsets(mn, k, elem_bits, major, lbo, sbo, width)
    addr = swizzle(start + off, width)
    nbytes = max(elem_bits // 8, 1)
    base = smem.base
    rel = addr - base
    if rel.min() < 0 or rel.max() + nbytes > smem.size:
        raise_fault(smem, int(addr.min()), int(addr.max()))
    data = smem.data
    if elem_bits == 4:
        byte = data[rel]
        j = np.arange(k)[None, :] if major == "K" else np.arange(mn)[:, None]
        return np.where(j % 2 == 0, byte & 0xF, byte >> 4).astype(np.uint8)
    if nbytes == 1:
        return data[rel].copy()
    idx = rel[..., None] + np.arange(nbytes)
    raw = data[idx]
    return raw.view({2: np.uint16, 4: np.uint32}[nbytes])[..., 0]


def raise_fault(smem, lo, hi):
    from .errors import MemoryFault

    raise MemoryFault(f"an MMA operand spans shared addresses 0x{lo:x}..0x{hi:x}, outside this CTA's shared "
                      f"memory (0x{smem.base:x}..0x{smem.base + smem.size:x}): check the descriptor's start "
                      "address, LBO and SBO")


def to_float(codes: np.ndarray, fmt: str) -> np.ndarray:
    """Element codes of ``fmt`` -> float32 values (exact)."""
    from .values import bf16_bits_to_f32, decode_small

    if fmt == "bf16":
        return bf16_bits_to_f32(codes.astype(np.uint16))
    if fmt == "f16":
        return codes.astype(np.uint16).view(np.float16).astype(np.float32)
    if fmt == "tf32":
        return (codes.astype(np.uint32) & np.uint32(0xFFFFE000)).view(np.float32)
    if fmt in ("e4m3", "e5m2", "e2m1"):
        return decode_small(codes, fmt)
    raise Unsupported(f"MMA operand format {fmt}")
