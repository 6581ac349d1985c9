"""Bits and numbers: how register contents are stored and how each PTX type reads them.

Registers hold raw bits (unsigned numpy integers of the declared width, ``bool``
for predicates), one value per lane. An instruction's type says how to read them:
``.s32`` as two's complement, ``.f32`` as IEEE binary32, ``.bf16`` as the upper half
of a binary32, and so on (PTX ISA, "Fundamental types"). Conversions between
floating-point formats round as the ISA's ``cvt`` rounding modifiers say; the
narrow formats (FP8 e4m3/e5m2, FP4 e2m1) are decoded through exact tables and
encoded by round-to-nearest-even with saturation where ``.satfinite`` asks for it.
"""
from __future__ import annotations

import numpy as np

RAW = {1: np.bool_, 8: np.uint8, 16: np.uint16, 32: np.uint32, 64: np.uint64}
SIGNED = {8: np.int8, 16: np.int16, 32: np.int32, 64: np.int64}

#: bits of each scalar PTX type
BITS = {"pred": 1, "b8": 8, "u8": 8, "s8": 8, "b16": 16, "u16": 16, "s16": 16, "f16": 16, "bf16": 16,
        "e4m3": 8, "e5m2": 8,
        "b32": 32, "u32": 32, "s32": 32, "f32": 32, "f16x2": 32, "bf16x2": 32, "tf32": 32,
        "b64": 64, "u64": 64, "s64": 64, "f64": 64}


def bits_of(typ: str) -> int:
    try:
        return BITS[typ]
    except KeyError:
        from .errors import Unsupported

        raise Unsupported(f"type .{typ} is not supported") from None


def raw_dtype(typ: str):
    return RAW[bits_of(typ)]


def to_raw(values: np.ndarray, typ: str) -> np.ndarray:
    """Numbers of PTX type ``typ`` -> raw bits (unsigned array of the type's width)."""
    b = bits_of(typ)
    if typ == "pred":
        return np.asarray(values, dtype=np.bool_)
    if typ in ("f32",):
        return np.asarray(values, dtype=np.float32).view(np.uint32)
    if typ == "f64":
        return np.asarray(values, dtype=np.float64).view(np.uint64)
    if typ == "f16":
        return np.asarray(values, dtype=np.float16).view(np.uint16)
    if typ == "bf16":
        return f32_to_bf16_bits(np.asarray(values, dtype=np.float32))
    v = np.asarray(values)
    if v.dtype.kind == "f":
        raise TypeError(f"float values for integer type .{typ}")
    return v.astype(SIGNED.get(b, RAW[b]) if v.dtype.kind == "i" else RAW[b], copy=False).view(RAW[b])


def from_raw(raw: np.ndarray, typ: str) -> np.ndarray:
    """Raw bits of a register (any width) read as PTX type ``typ`` (narrower reads take the low bits)."""
    b = bits_of(typ)
    if typ == "pred":
        return raw.astype(np.bool_, copy=False)
    if raw.dtype == np.bool_:
        raw = raw.astype(np.uint8)
    r = raw.astype(RAW[b], copy=False) if raw.dtype != RAW[b] else raw
    if typ == "f32" or typ == "tf32":
        return r.view(np.float32)
    if typ == "f64":
        return r.view(np.float64)
    if typ == "f16":
        return r.view(np.float16)
    if typ == "bf16":
        return bf16_bits_to_f32(r)
    if typ[0] == "s":
        return r.view(SIGNED[b])
    return r


def store_bits(reg_dtype, value_raw: np.ndarray, typ: str) -> np.ndarray:
    """Raw bits of type ``typ`` widened or narrowed to a register's storage (sign-extending ``.s`` types)."""
    if reg_dtype == np.bool_:
        return value_raw.astype(np.bool_)
    if value_raw.dtype == reg_dtype:
        return value_raw
    if typ[0] == "s" and np.dtype(reg_dtype).itemsize > value_raw.dtype.itemsize:
        return value_raw.view(SIGNED[value_raw.dtype.itemsize * 8]).astype(
            SIGNED[np.dtype(reg_dtype).itemsize * 8]).view(reg_dtype)
    return value_raw.astype(reg_dtype)


# ---------------------------------------------------------------------------------------------
# bfloat16 and half
# ---------------------------------------------------------------------------------------------


def bf16_bits_to_f32(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << np.uint32(16)).view(np.float32)


def f32_to_bf16_bits(x: np.ndarray, mode: str = "rn") -> np.ndarray:
    """binary32 -> bfloat16 bits: round to nearest even (``.rn``) or toward zero (``.rz``); NaN stays NaN."""
    u = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    nan = np.isnan(np.asarray(x, dtype=np.float32))
    if mode == "rz":
        out = (u >> 16)
    elif mode == "rn":
        lsb = (u >> 16) & 1
        out = (u + 0x7FFF + lsb) >> 16
    else:
        from .errors import Unsupported

        raise Unsupported(f"rounding .{mode} for bf16")
    out = out.astype(np.uint16)
    out[nan] = 0x7FFF
    return out


def pack_halves(hi: np.ndarray, lo: np.ndarray) -> np.ndarray:
    """Two 16-bit halves -> one 32-bit value (``hi`` in the upper half)."""
    return (hi.astype(np.uint32) << np.uint32(16)) | lo.astype(np.uint32)


# ---------------------------------------------------------------------------------------------
# FP8 and FP4 (PTX ISA "Alternate floating point data formats"; OCP MX spec for e2m1)
# ---------------------------------------------------------------------------------------------


def _table_e4m3() -> np.ndarray:
    out = np.zeros(256, dtype=np.float32)
    for code in range(256):
        s, e, m = code >> 7, (code >> 3) & 15, code & 7
        if e == 15 and m == 7:
            v = np.nan
        elif e == 0:
            v = m / 8 * 2.0 ** -6
        else:
            v = (1 + m / 8) * 2.0 ** (e - 7)
        out[code] = -v if s else v
    return out


def _table_e5m2() -> np.ndarray:
    out = np.zeros(256, dtype=np.float32)
    for code in range(256):
        s, e, m = code >> 7, (code >> 2) & 31, code & 3
        if e == 31:
            v = np.inf if m == 0 else np.nan
        elif e == 0:
            v = m / 4 * 2.0 ** -14
        else:
            v = (1 + m / 4) * 2.0 ** (e - 15)
        out[code] = -v if s else v
    return out


E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0],
                dtype=np.float32)
E4M3 = _table_e4m3()
E5M2 = _table_e5m2()
DECODE = {"e4m3": E4M3, "e5m2": E5M2, "e2m1": E2M1}
MAXFINITE = {"e4m3": 448.0, "e5m2": 57344.0, "e2m1": 6.0}


def decode_small(codes: np.ndarray, fmt: str) -> np.ndarray:
    """Codes of an 8- or 4-bit float format -> float32 (exact)."""
    return DECODE[fmt][codes.astype(np.int64)]


def encode_small(x: np.ndarray, fmt: str, satfinite: bool = True) -> np.ndarray:
    """float32 -> codes of ``fmt`` by round-to-nearest-even; with ``satfinite`` out-of-range values clamp to
    the largest finite magnitude and NaN gives the format's NaN (e2m1 has none: NaN is an error upstream)."""
    x = np.asarray(x, dtype=np.float32)
    table = DECODE[fmt]
    bits = 4 if fmt == "e2m1" else 8
    half = 1 << (bits - 1)
    pos_codes = np.array([c for c in range(half) if np.isfinite(table[c])], dtype=np.int64)
    pos_vals = table[pos_codes].astype(np.float64)
    order = np.argsort(pos_vals, kind="stable")
    pos_codes, pos_vals = pos_codes[order], pos_vals[order]
    mag = np.abs(x.astype(np.float64))
    if satfinite:
        mag = np.minimum(mag, MAXFINITE[fmt])
    hi = np.clip(np.searchsorted(pos_vals, mag, side="left"), 0, len(pos_vals) - 1)
    lo = np.clip(hi - 1, 0, len(pos_vals) - 1)
    dlo, dhi = np.abs(mag - pos_vals[lo]), np.abs(pos_vals[hi] - mag)
    even_hi = (pos_codes[hi] & 1) == 0
    pick_hi = (dhi < dlo) | ((dhi == dlo) & even_hi)
    codes = np.where(pick_hi, pos_codes[hi], pos_codes[lo])
    codes = np.where(np.signbit(x), codes | half, codes)
    if fmt != "e2m1":
        nan_code = 0x7F if fmt == "e4m3" else 0x7F
        codes = np.where(np.isnan(x), nan_code, codes)
    return codes.astype(np.uint8)
