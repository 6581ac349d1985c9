"""Integer, logic, comparison, conversion and floating-point instructions; branches; warp-level data exchange.

PTX ISA sections: "Integer Arithmetic Instructions", "Logic and Shift Instructions",
"Comparison and Selection Instructions", "Data Movement and Conversion Instructions"
(mov, cvt, prmt, shfl.sync), "Floating-Point Instructions", "Half Precision
Floating-Point Instructions", "Control Flow Instructions" (bra, ret, exit) and
"Parallel Synchronization and Communication Instructions" (elect.sync, vote.sync,
activemask). Integer arithmetic wraps at the type's width; ``.approx`` float
instructions are computed exactly (the hardware's result is within the ISA's stated
error of this one: functional, not bit-exact for ``.approx``).
"""
from __future__ import annotations

import numpy as np

from ..errors import EmulatorError, Unsupported
from ..ptx import Imm, Pair, Reg, Sink, Vec
from ..values import (BITS, bf16_bits_to_f32, bits_of, decode_small, encode_small, f32_to_bf16_bits, from_raw,
                      pack_halves, to_raw)
from . import handler, require_converged, type_of

INT_TYPES = {"u8", "s8", "u16", "s16", "u32", "s32", "u64", "s64", "b8", "b16", "b32", "b64"}
FLOAT_TYPES = {"f32", "f64", "f16", "bf16"}

_ERRSTATE = {"over": "ignore", "invalid": "ignore", "divide": "ignore", "under": "ignore"}


def _int_view(typ):
    b = bits_of(typ)
    signed = typ[0] == "s"
    return {8: np.int8, 16: np.int16, 32: np.int32, 64: np.int64}[b] if signed else \
        {8: np.uint8, 16: np.uint16, 32: np.uint32, 64: np.uint64}[b]


def _as(values, typ):
    """Values of ``typ``'s numpy dtype (ints wrap)."""
    if typ in ("f32", "tf32"):
        return np.asarray(values, dtype=np.float32)
    if typ == "f64":
        return np.asarray(values, dtype=np.float64)
    if typ in ("f16", "bf16"):
        return np.asarray(values, dtype=np.float32)
    v = np.asarray(values)
    dt = _int_view(typ)
    if v.dtype == dt:
        return v
    return v.astype(np.int64 if v.dtype.kind in "iu" and v.dtype.itemsize < 8 else v.dtype).astype(dt)


def _round_half(values, typ):
    """A float32 result rounded to f16 / bf16 (round to nearest even), returned as float32 values."""
    if typ == "f16":
        return np.asarray(values, np.float32).astype(np.float16).astype(np.float32)
    if typ == "bf16":
        return bf16_bits_to_f32(f32_to_bf16_bits(np.asarray(values, np.float32)))
    return values


# ---------------------------------------------------------------------------------------------
# FP32 arithmetic with the ISA's rounding modifiers (PTX ISA "Floating-Point Instructions": add, sub, mul,
# fma; "Rounding modifiers": .rn, .rz, .rm, .rp; .ftz; .sat)
# ---------------------------------------------------------------------------------------------

_F32_MIN_NORMAL = np.float32(2.0 ** -126)
_ROUNDINGS = ("rn", "rz", "rm", "rp")


def _two_sum(x, y):
    """``s, e`` with ``s = fl(x + y)`` and ``s + e = x + y`` exactly (float64, Knuth's TwoSum)."""
    s = x + y
    bb = s - x
    return s, (x - (s - bb)) + (y - bb)


def f32_from_exact(s, e, mode: str = "rn"):
    """The float32 rounding, by ``mode``, of the exact value ``s + e`` (float64 arrays; ``e`` the error of ``s``).

    ``rn``: round to odd in binary64 (``s`` itself, or its neighbour towards ``s + e`` when ``e != 0`` and ``s``
    ends in a 0 bit), then to nearest even in binary32: correctly rounded because binary64 has at least two bits
    more than binary32 (Boldo and Melquiond, "Emulation of FMA and correctly rounded sums: proved algorithms
    using rounding to odd", IEEE Trans. Computers 2008). ``rz``/``rm``/``rp``: the nearest float32, stepped one
    unit towards zero / minus infinity / plus infinity when it lies on the wrong side of the exact value.
    """
    s = np.asarray(s, np.float64)
    e = np.asarray(e, np.float64)
    with np.errstate(**_ERRSTATE):
        if mode == "rn":
            return _round_to_odd(s, e).astype(np.float32)
        r = s.astype(np.float32)
        diff = (s - r.astype(np.float64)) + e  # exact - r: s - r is exact (Sterbenz), the sum keeps its sign
        if mode == "rz":
            step = ((r > 0) & (diff < 0)) | ((r < 0) & (diff > 0))
            return np.where(step, np.nextafter(r, np.float32(0)), r).astype(np.float32)
        if mode == "rm":
            return np.where(diff < 0, np.nextafter(r, np.float32(-np.inf)), r).astype(np.float32)
        if mode == "rp":
            return np.where(diff > 0, np.nextafter(r, np.float32(np.inf)), r).astype(np.float32)
    raise Unsupported(f"rounding mode .{mode}")


def _round_to_odd(s, e):
    """``s + e`` rounded to odd in binary64: ``s``, or its neighbour towards ``s + e`` if inexact and ``s`` is even."""
    odd = (s.view(np.uint64) & np.uint64(1)) == 1
    fix = (e != 0) & ~odd & np.isfinite(s)
    return np.where(fix, np.nextafter(s, np.where(e > 0, np.inf, -np.inf)), s)


def half_from_exact(s, e, typ: str):
    """The exact value ``s + e`` (float64 pair) rounded once to nearest even ``f16``/``bf16`` (as float32 values).

    Round to odd in binary64, then for bf16 to odd in binary32 (24 bits >= 8 + 2), then to nearest even in the
    type; numpy converts binary64 to binary16 in one rounding."""
    r = _round_to_odd(np.asarray(s, np.float64), np.asarray(e, np.float64))
    with np.errstate(**_ERRSTATE):
        if typ == "f16":
            return r.astype(np.float16).astype(np.float32)
        r32 = r.astype(np.float32)
        inexact = r32.astype(np.float64) != r
        odd = (r32.view(np.uint32) & np.uint32(1)) == 1
        r32 = np.where(inexact & ~odd & np.isfinite(r32),
                       np.nextafter(r32, np.where(r > r32, np.float32(np.inf), np.float32(-np.inf))), r32)
    return bf16_bits_to_f32(f32_to_bf16_bits(r32.astype(np.float32)))


def _ftz(x):
    """``.ftz``: subnormal float32 inputs and results become zero of the same sign."""
    x = np.asarray(x, np.float32)
    return np.where((np.abs(x) < _F32_MIN_NORMAL) & (x != 0), np.copysign(np.float32(0), x), x).astype(np.float32)


def _sat(x):
    """``.sat``: the result clamped to [0.0, 1.0]; NaN becomes +0.0."""
    x = np.asarray(x, np.float32)
    return np.where(np.isnan(x), np.float32(0), np.clip(x, np.float32(0), np.float32(1))).astype(np.float32)


def _float_mods(ctx, typ):
    """``(rounding, ftz, sat)`` of a float add/sub/mul/fma; directed rounding, .ftz and .sat only for f32."""
    mods = ctx.mods
    rnd = next((m for m in _ROUNDINGS if m in mods), "rn")
    ftz, sat = "ftz" in mods, "sat" in mods
    if typ != "f32" and (rnd != "rn" or ftz or sat):
        ctx.unsupported(f"the modifiers .{rnd}{'.ftz' if ftz else ''}{'.sat' if sat else ''} on .{typ} of")
    return rnd, ftz, sat


def _f32_op(op: str, rnd: str, ftz: bool, sat: bool):
    """``f(a, b[, c])`` for float32 add/sub/mul/fma with the ISA's modifiers, exactly rounded."""
    def f(*args):
        args = [np.asarray(x, np.float32) for x in args]
        if ftz:
            args = [_ftz(x) for x in args]
        with np.errstate(**_ERRSTATE):
            if rnd == "rn" and op in ("add", "sub", "mul"):
                a, b = args
                r = a + b if op == "add" else a - b if op == "sub" else a * b  # IEEE binary32, round to nearest
            else:
                a64 = [x.astype(np.float64) for x in args]
                if op == "mul":
                    s, e = a64[0] * a64[1], np.zeros_like(a64[0])  # exact: 24 + 24 bits fit in 53
                elif op == "fma":
                    s, e = _two_sum(a64[0] * a64[1], a64[2])
                else:
                    s, e = _two_sum(a64[0], -a64[1] if op == "sub" else a64[1])
                r = f32_from_exact(s, np.where(np.isfinite(s), e, 0.0), rnd)
        if ftz:
            r = _ftz(r)
        return _sat(r) if sat else r
    return f


# ---------------------------------------------------------------------------------------------
# mov
# ---------------------------------------------------------------------------------------------


def _regs_of(ctx, op) -> list:
    items = op.items if isinstance(op, Vec) else (op,)
    return [ctx.reg_index(x) for x in items if isinstance(x, Reg)]


@handler("mov")
def h_mov(ctx):
    """``mov`` (also packing/unpacking vectors). A pure move may copy a register whose ``tcgen05.ld`` result
    is not yet waited for: the copy inherits the pending state (ptxas turns these packs into register
    renaming; the DSL's epilogues pack ``tcgen05.ld`` results before ``tcgen05.wait::ld``)."""
    body = _mov(ctx)
    srcs, dsts = _regs_of(ctx, ctx.inst.operands[1]), _regs_of(ctx, ctx.inst.operands[0])

    def run(warp, mask):
        if warp.pending.any():
            why = [warp.pending_why[i] for i in srcs if warp.pending[i]]
            if why:
                if not all("tcgen05.ld" in w for w in why):
                    return body(warp, mask)  # the reader reports it
                saved = warp.pending[srcs].copy()
                warp.pending[srcs] = False
                try:
                    body(warp, mask)
                finally:
                    warp.pending[srcs] = saved
                warp.set_pending(dsts, why[0])
                warp.__dict__.setdefault("_tc_ld_pending", []).extend(dsts)
                return None
        return body(warp, mask)
    return run


def _mov(ctx):
    typ = type_of(ctx.parts)
    ctx.need({typ})
    d, a = ctx.inst.operands
    b = bits_of(typ)
    if isinstance(a, Vec):  # pack: lowest element into the lowest bits
        k = len(a.items)
        part = b // k
        ptype = {8: "b8", 16: "b16", 32: "b32"}[part]
        readers = [ctx.src(x, ptype) if not isinstance(x, Sink) else (lambda w: np.zeros(32, np.uint64))
                   for x in a.items]
        write = ctx.dst(d, typ)

        def pack(warp, mask):
            acc = np.zeros(32, dtype=np.uint64)
            for i, r in enumerate(readers):
                acc |= r(warp).astype(np.uint64) << np.uint64(i * part)
            write(warp, mask, from_raw(acc, typ))
        return pack
    if isinstance(d, Vec):  # unpack
        k = len(d.items)
        part = b // k
        ptype = {8: "b8", 16: "b16", 32: "b32"}[part]
        read = ctx.src(a, typ if not typ.startswith("f") else {32: "b32", 64: "b64", 16: "b16"}[b])
        writers = [ctx.dst(x, ptype) for x in d.items]
        pmask = np.uint64((1 << part) - 1)

        def unpack(warp, mask):
            v = read(warp).astype(np.uint64)
            for i, w in enumerate(writers):
                w(warp, mask, from_raw((v >> np.uint64(i * part)) & pmask, ptype))
        return unpack
    read = ctx.src(a, typ)
    write = ctx.dst(d, typ)
    return lambda warp, mask: write(warp, mask, read(warp))


# ---------------------------------------------------------------------------------------------
# Integer and float arithmetic
# ---------------------------------------------------------------------------------------------


def _binary(ctx, fn, *, allowed=()):
    typ = type_of(ctx.parts)
    ctx.need({typ, *allowed})
    d, a, b = ctx.inst.operands
    ra, rb, w = ctx.src(a, typ), ctx.src(b, typ), ctx.dst(d, typ)

    def run(warp, mask):
        with np.errstate(**_ERRSTATE):
            w(warp, mask, fn(_as(ra(warp), typ), _as(rb(warp), typ), typ, mask))
    return run


def _packed_binary(ctx, fn):
    """``add/sub/mul/fma/min/max .f16x2/.bf16x2``: the operation on each 16-bit half."""
    typ = type_of(ctx.parts)
    half = "f16" if typ == "f16x2" else "bf16"
    extra = ctx.mods - {typ, "rn"}
    if extra:  # each half is computed in float32 and rounded to nearest: other modes are not modelled
        ctx.unsupported("the modifier(s) ." + ", .".join(sorted(extra)) + " of")
    ops = ctx.inst.operands
    readers = [ctx.src(x, "b32") for x in ops[1:]]
    w = ctx.dst(ops[0], "b32")

    def halves(v):
        v = v.astype(np.uint32)
        return from_raw((v & 0xFFFF).astype(np.uint64), half).astype(np.float32), \
            from_raw((v >> 16).astype(np.uint64), half).astype(np.float32)

    def run(warp, mask):
        parts = [halves(r(warp)) for r in readers]
        with np.errstate(**_ERRSTATE):
            lo = fn(*[p[0] for p in parts])
            hi = fn(*[p[1] for p in parts])
        w(warp, mask, pack_halves(to_raw(hi, half), to_raw(lo, half)))
    return run


@handler("add", "sub")
def h_addsub(ctx):
    typ = type_of(ctx.parts)
    sub = ctx.parts[0] == "sub"
    if typ in ("f16x2", "bf16x2"):
        return _packed_binary(ctx, (lambda a, b: a - b) if sub else (lambda a, b: a + b))
    if ".cc" in ctx.inst.opcode or "cc" in ctx.mods:
        ctx.unsupported("the carry (.cc) form of")

    if typ in FLOAT_TYPES:
        rnd, ftz, sat = _float_mods(ctx, typ)
        if typ == "f32":
            f32 = _f32_op("sub" if sub else "add", rnd, ftz, sat)
            return _binary(ctx, lambda a, b, t, m: f32(a, b), allowed={*_ROUNDINGS, "ftz", "sat"})
        return _binary(ctx, lambda a, b, t, m: _round_half(a - b if sub else a + b, t), allowed={"rn"})

    def fn(a, b, t, mask):
        r = a - b if sub else a + b
        if "sat" in ctx.mods and t == "s32":
            wide = a.astype(np.int64) - b.astype(np.int64) if sub else a.astype(np.int64) + b.astype(np.int64)
            r = np.clip(wide, -2 ** 31, 2 ** 31 - 1).astype(np.int32)
        return r
    return _binary(ctx, fn, allowed={"sat"} if typ == "s32" else ())


@handler("mul")
def h_mul(ctx):
    typ = type_of(ctx.parts)
    if typ in ("f16x2", "bf16x2"):
        return _packed_binary(ctx, lambda a, b: a * b)
    mode = next((p for p in ("lo", "hi", "wide") if p in ctx.mods), None)
    if typ in FLOAT_TYPES:
        rnd, ftz, sat = _float_mods(ctx, typ)
        if typ == "f32":
            f32 = _f32_op("mul", rnd, ftz, sat)
            return _binary(ctx, lambda a, b, t, m: f32(a, b), allowed={*_ROUNDINGS, "ftz", "sat"})
        return _binary(ctx, lambda a, b, t, m: _round_half(a * b, t), allowed={"rn"})
    if mode is None:
        ctx.unsupported("an integer mul without .lo/.hi/.wide:")
    d, a, b = ctx.inst.operands
    b_ = bits_of(typ)
    ra, rb = ctx.src(a, typ), ctx.src(b, typ)
    signed = typ[0] == "s"
    if mode == "wide":
        wtype = ("s" if signed else "u") + str(2 * b_)
        w = ctx.dst(d, wtype)

        def run(warp, mask):
            x = _as(ra(warp), typ).astype(np.int64 if signed else np.uint64)
            y = _as(rb(warp), typ).astype(np.int64 if signed else np.uint64)
            with np.errstate(**_ERRSTATE):
                w(warp, mask, (x * y).astype(_int_view(wtype)))
        return run
    w = ctx.dst(d, typ)

    def run(warp, mask):
        x, y = _as(ra(warp), typ), _as(rb(warp), typ)
        if mode == "lo":
            with np.errstate(**_ERRSTATE):
                w(warp, mask, x * y)
            return
        if b_ <= 32:
            p = x.astype(np.int64) * y.astype(np.int64)
            w(warp, mask, (p >> b_).astype(_int_view(typ)))
        else:
            xs = [int(v) for v in x]
            ys = [int(v) for v in y]
            w(warp, mask, np.array([((u * v) >> 64) & (2 ** 64 - 1) for u, v in zip(xs, ys)], dtype=np.uint64)
              .astype(_int_view(typ)) if not signed else
              np.array([((u * v) >> 64) for u, v in zip(xs, ys)], dtype=object).astype(np.int64))
    return run


@handler("mad", "fma")
def h_mad(ctx):
    typ = type_of(ctx.parts)
    if typ in ("f16x2", "bf16x2"):
        if ctx.mods - {typ, "rn"}:
            ctx.unsupported(f"the modifiers {sorted(ctx.mods - {typ, 'rn'})} on .{typ} of")
        half = typ[:-2]

        def packed_fma(a, b, c):  # the exact a*b + c, rounded once to the half type
            return half_from_exact(*_two_sum(a.astype(np.float64) * b, c.astype(np.float64)), half)
        return _packed_binary(ctx, packed_fma)
    d, a, b, c = ctx.inst.operands
    if typ in FLOAT_TYPES:
        ctx.need({typ, *_ROUNDINGS, "ftz", "sat"})
        rnd, ftz, sat = _float_mods(ctx, typ)
        if typ == "f64":
            ctx.unsupported("the .f64 form of")  # fused f64 needs more than float64 arithmetic to round once
        ra, rb, rc, w = ctx.src(a, typ), ctx.src(b, typ), ctx.src(c, typ), ctx.dst(d, typ)
        f32 = _f32_op("fma", rnd, ftz, sat)

        def fma(warp, mask):
            if typ == "f32":  # fused: the exact a*b + c, rounded once
                w(warp, mask, f32(_as(ra(warp), "f32"), _as(rb(warp), "f32"), _as(rc(warp), "f32")))
                return
            with np.errstate(**_ERRSTATE):  # f16/bf16: the exact a*b + c (products of halves fit in float64)
                s, e = _two_sum(_as(ra(warp), "f64") * _as(rb(warp), "f64"), _as(rc(warp), "f64"))
            w(warp, mask, half_from_exact(s, np.where(np.isfinite(s), e, 0.0), typ))
        return fma
    mode = next((p for p in ("lo", "hi", "wide") if p in ctx.mods), None)
    if mode not in ("lo", "wide"):
        ctx.unsupported()
    ctx.need({typ, mode})
    signed = typ[0] == "s"
    wtype = typ if mode == "lo" else ("s" if signed else "u") + str(2 * bits_of(typ))
    ra, rb, rc, w = ctx.src(a, typ), ctx.src(b, typ), ctx.src(c, wtype), ctx.dst(d, wtype)

    def run(warp, mask):
        x, y = _as(ra(warp), typ), _as(rb(warp), typ)
        if mode == "wide":
            x, y = x.astype(_int_view(wtype)), y.astype(_int_view(wtype))
        with np.errstate(**_ERRSTATE):
            w(warp, mask, x * y + _as(rc(warp), wtype))
    return run


@handler("div", "rem")
def h_div(ctx):
    typ = type_of(ctx.parts)
    is_rem = ctx.parts[0] == "rem"
    if typ in FLOAT_TYPES:
        if is_rem:
            ctx.unsupported()

        def fdiv(a, b, t, mask):
            return _round_half((a.astype(np.float64) / b).astype(np.float32) if t != "f64" else a / b, t)
        return _binary(ctx, fdiv, allowed={"rn", "ftz", "approx", "full", "rz"})

    def idiv(a, b, t, mask):
        if (b[mask] == 0).any():
            raise EmulatorError(f"integer {'rem' if is_rem else 'div'} by zero")
        safe = np.where(b == 0, 1, b)
        if t[0] == "s":
            q = (np.abs(a.astype(np.int64)) // np.abs(safe.astype(np.int64))) * np.sign(a.astype(np.int64)) \
                * np.sign(safe.astype(np.int64))
            r = a.astype(np.int64) - q * safe.astype(np.int64)
            return (r if is_rem else q).astype(_int_view(t))
        return (a % safe) if is_rem else (a // safe)
    return _binary(ctx, idiv)


@handler("min", "max")
def h_minmax(ctx):
    """min/max. A NaN operand yields the other operand; with ``.NaN`` a NaN operand yields NaN; ``.relu`` then
    clamps a negative result to +0 (PTX ISA "min", "max"; ``.ftz`` for f32)."""
    typ = type_of(ctx.parts)
    is_max = ctx.parts[0] == "max"
    nan, relu, ftz = "NaN" in ctx.mods, "relu" in ctx.mods, "ftz" in ctx.mods
    if typ not in FLOAT_TYPES | {"f16x2", "bf16x2"} and (nan or relu or ftz):
        ctx.unsupported()
    if ftz and typ != "f32":
        ctx.unsupported("the modifier .ftz on ." + typ + " of")

    def pick(a, b):
        if nan:  # a NaN operand makes the result NaN
            r = np.maximum(a, b) if is_max else np.minimum(a, b)
        else:
            r = np.fmax(a, b) if is_max else np.fmin(a, b)
        return np.where(r < 0, np.zeros_like(r), r) if relu else r  # NaN stays NaN under .relu
    if typ in ("f16x2", "bf16x2"):
        ctx.mods.discard("NaN")
        ctx.mods.discard("relu")
        return _packed_binary(ctx, pick)

    def fn(a, b, t, mask):
        if t in FLOAT_TYPES:
            if ftz:
                a, b = _ftz(a), _ftz(b)
            return pick(a, b)
        return np.maximum(a, b) if is_max else np.minimum(a, b)
    return _binary(ctx, fn, allowed={"ftz", "NaN", "relu"})


@handler("neg", "abs", "not", "popc", "clz", "brev", "cnot")
def h_unary(ctx):
    typ = type_of(ctx.parts)
    ctx.need({typ, "ftz"})
    op = ctx.parts[0]
    d, a = ctx.inst.operands
    if op in ("popc", "clz"):
        ra, w = ctx.src(a, typ), ctx.dst(d, "u32")
        b = bits_of(typ)

        def count(warp, mask):
            v = ra(warp).astype(np.uint64)
            if op == "popc":
                r = np.array([bin(int(x)).count("1") for x in v], dtype=np.uint32)
            else:
                r = np.array([b - int(x).bit_length() for x in v], dtype=np.uint32)
            w(warp, mask, r)
        return count
    ra, w = ctx.src(a, typ), ctx.dst(d, typ)
    b = bits_of(typ)

    def run(warp, mask):
        v = _as(ra(warp), typ)
        with np.errstate(**_ERRSTATE):
            if op == "neg":
                r = -v
            elif op == "abs":
                r = np.abs(v)
            elif op == "not":
                r = ~v if typ != "pred" else ~v
            elif op == "cnot":
                r = (v == 0).astype(v.dtype)
            else:  # brev
                r = np.array([int(format(int(x), f"0{b}b")[::-1], 2) for x in v.astype(np.uint64)],
                             dtype=np.uint64).astype(_int_view(typ))
        w(warp, mask, r)
    if typ == "pred":
        rp, wp = ctx.src(a, "pred"), ctx.dst(d, "pred")
        return lambda warp, mask: wp(warp, mask, ~rp(warp))
    return run


@handler("and", "or", "xor")
def h_logic(ctx):
    typ = type_of(ctx.parts)
    ctx.need({typ})
    op = ctx.parts[0]
    f = {"and": np.bitwise_and, "or": np.bitwise_or, "xor": np.bitwise_xor}[op]
    d, a, b = ctx.inst.operands
    if typ == "pred":
        ra, rb, w = ctx.src(a, "pred"), ctx.src(b, "pred"), ctx.dst(d, "pred")
        return lambda warp, mask: w(warp, mask, f(ra(warp), rb(warp)))
    ut = {8: "b8", 16: "b16", 32: "b32", 64: "b64"}[bits_of(typ)]
    ra, rb, w = ctx.src(a, ut), ctx.src(b, ut), ctx.dst(d, ut)
    return lambda warp, mask: w(warp, mask, f(ra(warp), rb(warp)))


@handler("shl", "shr")
def h_shift(ctx):
    typ = type_of(ctx.parts)
    ctx.need({typ})
    d, a, b = ctx.inst.operands
    nb = bits_of(typ)
    ra, rb, w = ctx.src(a, typ), ctx.src(b, "u32"), ctx.dst(d, typ)
    left = ctx.parts[0] == "shl"
    signed = typ[0] == "s"

    def run(warp, mask):
        v = _as(ra(warp), typ)
        n = rb(warp).astype(np.uint64)
        big = n >= nb  # the ISA clamps shift amounts larger than the width
        n2 = np.minimum(n, nb - 1).astype(v.dtype if v.dtype.kind == "u" else np.int64)
        if left:
            r = np.where(big, 0, (v.astype(np.uint64) << np.minimum(n, nb - 1)).astype(_int_view(typ)))
        elif signed:
            r = np.where(big, np.where(v < 0, -1, 0), v >> n2.astype(v.dtype)).astype(v.dtype)
        else:
            r = np.where(big, 0, v >> n2.astype(v.dtype)).astype(v.dtype)
        w(warp, mask, r.astype(_int_view(typ)))
    return run


@handler("bfe")
def h_bfe(ctx):
    typ = type_of(ctx.parts)
    d, a, b, c = ctx.inst.operands
    nb = bits_of(typ)
    ra, rb, rc, w = ctx.src(a, typ), ctx.src(b, "u32"), ctx.src(c, "u32"), ctx.dst(d, typ)
    signed = typ[0] == "s"

    def run(warp, mask):
        v = ra(warp).astype(np.uint64) & np.uint64((1 << nb) - 1 if nb < 64 else 2 ** 64 - 1)
        pos = (rb(warp) & 0xFF).astype(np.int64)
        ln = (rc(warp) & 0xFF).astype(np.int64)
        out = []
        for x, p, n in zip(v, pos, ln):
            x = int(x)
            field = (x >> min(p, nb - 1)) & ((1 << n) - 1) if n else 0
            if signed and n:
                sbit = (x >> min(p + n - 1, nb - 1)) & 1
                if sbit:
                    field |= ((1 << nb) - 1) ^ ((1 << n) - 1)
            elif signed and not n:
                field = 0
            out.append(field & ((1 << nb) - 1))
        w(warp, mask, from_raw(np.array(out, dtype=np.uint64), typ))
    return run


@handler("bfi")
def h_bfi(ctx):
    typ = type_of(ctx.parts)
    d, f, b, c, e = ctx.inst.operands
    nb = bits_of(typ)
    rf, rb, rc, re_, w = ctx.src(f, typ), ctx.src(b, typ), ctx.src(c, "u32"), ctx.src(e, "u32"), ctx.dst(d, typ)

    def run(warp, mask):
        out = []
        for x, y, p, n in zip(rf(warp).astype(np.uint64), rb(warp).astype(np.uint64), rc(warp), re_(warp)):
            p, n = int(p) & 0xFF, int(n) & 0xFF
            m = (((1 << n) - 1) << p) & ((1 << nb) - 1)
            out.append(((int(y) & ~m) | ((int(x) << p) & m)) & ((1 << nb) - 1))
        w(warp, mask, from_raw(np.array(out, dtype=np.uint64), typ))
    return run


@handler("lop3")
def h_lop3(ctx):
    ctx.need({"b32"})
    d, a, b, c, lut = ctx.inst.operands
    if not isinstance(lut, Imm):
        ctx.unsupported("a non-immediate LUT in")
    table = int(lut.value) & 0xFF
    ra, rb, rc, w = ctx.src(a, "b32"), ctx.src(b, "b32"), ctx.src(c, "b32"), ctx.dst(d, "b32")

    def run(warp, mask):
        x, y, z = ra(warp), rb(warp), rc(warp)
        r = np.zeros(32, dtype=np.uint32)
        for i in range(8):
            if table >> i & 1:
                r |= (x if i & 4 else ~x) & (y if i & 2 else ~y) & (z if i & 1 else ~z)
        w(warp, mask, r)
    return run


@handler("prmt")
def h_prmt(ctx):
    ctx.need({"b32"})
    d, a, b, c = ctx.inst.operands
    ra, rb, rc, w = ctx.src(a, "b32"), ctx.src(b, "b32"), ctx.src(c, "b32"), ctx.dst(d, "b32")

    def run(warp, mask):
        src = (rb(warp).astype(np.uint64) << np.uint64(32)) | ra(warp).astype(np.uint64)
        sel = rc(warp)
        out = np.zeros(32, dtype=np.uint32)
        for k in range(4):
            nib = (sel >> np.uint32(4 * k)) & np.uint32(0xF)
            idx = (nib & 7).astype(np.uint64)
            byte = ((src >> (idx * np.uint64(8))) & np.uint64(0xFF)).astype(np.uint32)
            sign = (byte >> 7) & 1
            byte = np.where(nib & 8, np.where(sign == 1, 0xFF, 0), byte).astype(np.uint32)
            out |= byte << np.uint32(8 * k)
        w(warp, mask, out)
    return run


def _lanes(x, width: int, count: int, signed: bool):
    """``count`` packed ``width``-bit fields of the uint32 array ``x``, as int64 (sign-extended when ``signed``)."""
    out = []
    for i in range(count):
        f = ((x >> np.uint32(width * i)) & np.uint32((1 << width) - 1)).astype(np.int64)
        if signed:
            f = np.where(f >= 1 << (width - 1), f - (1 << width), f)
        out.append(f)
    return out


@handler("dp4a", "dp2a")
def h_dot_product(ctx):
    """``dp4a.atype.btype d, a, b, c`` and ``dp2a.mode.atype.btype d, a, b, c`` (PTX ISA, integer arithmetic:
    dp4a, dp2a): four (dp4a) or two (dp2a: 16-bit fields of ``a`` against bytes 0-1 of ``b`` for ``.lo``, 2-3 for
    ``.hi``) products of packed fields, signed or unsigned per operand type, added to ``c``; 32 bits, wrapping.
    ``d`` and ``c`` are ``.u32`` when both types are, else ``.s32``."""
    two = ctx.parts[0] == "dp2a"
    parts = ctx.parts[1:]
    mode = None
    if two:
        if not parts or parts[0] not in ("lo", "hi"):
            ctx.unsupported("dp2a without .lo or .hi:")
        mode, parts = parts[0], parts[1:]
    if len(parts) != 2 or any(t not in ("u32", "s32") for t in parts):
        ctx.unsupported("operand types other than .u32 / .s32 in")
    a_signed, b_signed = parts[0] == "s32", parts[1] == "s32"
    dtype = "s32" if (a_signed or b_signed) else "u32"
    d, a, b, c = ctx.inst.operands
    ra, rb, rc, w = ctx.src(a, "b32"), ctx.src(b, "b32"), ctx.src(c, "b32"), ctx.dst(d, "b32")

    def run(warp, mask):
        bytes_b = _lanes(rb(warp), 8, 4, b_signed)
        if two:
            fields_a = _lanes(ra(warp), 16, 2, a_signed)
            first = 0 if mode == "lo" else 2
            pairs = zip(fields_a, bytes_b[first:first + 2])
        else:
            pairs = zip(_lanes(ra(warp), 8, 4, a_signed), bytes_b)
        acc = rc(warp).astype(np.int64)
        if dtype == "s32":
            acc = np.where(acc >= 1 << 31, acc - (1 << 32), acc)
        for x, y in pairs:
            acc = acc + x * y
        w(warp, mask, (acc & 0xFFFFFFFF).astype(np.uint32))
    return run


# ---------------------------------------------------------------------------------------------
# Comparison and selection
# ---------------------------------------------------------------------------------------------

_CMP = {
    "eq": np.equal, "ne": np.not_equal, "lt": np.less, "le": np.less_equal, "gt": np.greater, "ge": np.greater_equal,
    "lo": np.less, "ls": np.less_equal, "hi": np.greater, "hs": np.greater_equal,
}


def _compare(op, a, b, is_float):
    if op in _CMP:
        r = _CMP[op](a, b)
        if is_float and op == "ne":
            r = r & ~(np.isnan(a) | np.isnan(b))
        return r
    if is_float:
        unordered = np.isnan(a) | np.isnan(b)
        if op == "num":
            return ~unordered
        if op == "nan":
            return unordered
        if op.endswith("u") and op[:-1] in _CMP:
            return _CMP[op[:-1]](a, b) | unordered
    raise Unsupported(f"comparison .{op}")


@handler("setp")
def h_setp(ctx):
    typ = type_of(ctx.parts)
    cmp = ctx.parts[1]
    boolop = ctx.parts[2] if len(ctx.parts) > 3 and ctx.parts[2] in ("and", "or", "xor") else None
    ops = ctx.inst.operands
    dst = ops[0]
    p, q = (dst.first, dst.second) if isinstance(dst, Pair) else (dst, None)
    ra, rb = ctx.src(ops[1], typ), ctx.src(ops[2], typ)
    rc = ctx.src(ops[3], "pred") if len(ops) > 3 else None
    wp = ctx.dst(p, "pred")
    wq = ctx.dst(q, "pred") if q is not None else None
    is_float = typ in FLOAT_TYPES
    f = {"and": np.logical_and, "or": np.logical_or, "xor": np.logical_xor}.get(boolop)

    def run(warp, mask):
        t = _compare(cmp, _as(ra(warp), typ), _as(rb(warp), typ), is_float)
        if f is not None:
            c = rc(warp)
            wp(warp, mask, f(t, c))
            if wq is not None:
                wq(warp, mask, f(~t, c))
        else:
            wp(warp, mask, t)
            if wq is not None:
                wq(warp, mask, ~t)
    return run


@handler("selp")
def h_selp(ctx):
    typ = type_of(ctx.parts)
    d, a, b, c = ctx.inst.operands
    ra, rb, rc, w = ctx.src(a, typ), ctx.src(b, typ), ctx.src(c, "pred"), ctx.dst(d, typ)
    return lambda warp, mask: w(warp, mask, np.where(rc(warp), ra(warp), rb(warp)))


# ---------------------------------------------------------------------------------------------
# cvt
# ---------------------------------------------------------------------------------------------

_ROUND_INT = {"rni": np.rint, "rzi": np.trunc, "rmi": np.floor, "rpi": np.ceil}


@handler("cvt")
def h_cvt(ctx):
    parts = ctx.parts
    types = [p for p in parts[1:] if p in BITS or p in ("e4m3x2", "e5m2x2", "e2m1x2", "f16x2", "bf16x2")]
    if len(types) != 2:
        ctx.unsupported()
    dt, at = types
    mods = set(parts[1:]) - {dt, at}
    ops = ctx.inst.operands
    # packed conversions (PTX ISA cvt: "a is stored in the upper half/byte, b in the lower")
    if dt in ("bf16x2", "f16x2") and at == "f32":
        half = dt[:-2]
        ra, rb, w = ctx.src(ops[1], "f32"), ctx.src(ops[2], "f32"), ctx.dst(ops[0], "b32")
        relu = "relu" in mods

        def pack(warp, mask):
            x, y = ra(warp), rb(warp)
            if relu:
                x, y = np.maximum(x, 0), np.maximum(y, 0)
            w(warp, mask, pack_halves(to_raw(_round_half(x, half) if half == "f16" else x, half),
                                      to_raw(_round_half(y, half) if half == "f16" else y, half)))
        return pack
    if dt in ("e4m3x2", "e5m2x2", "e2m1x2") and at == "f32":
        fmt = dt[:-2]
        sat = "satfinite" in mods
        if not sat:
            ctx.unsupported("cvt to FP8/FP4 without .satfinite:")
        ra, rb = ctx.src(ops[1], "f32"), ctx.src(ops[2], "f32")
        shift = 4 if fmt == "e2m1" else 8
        w = ctx.dst(ops[0], "b16" if shift == 8 else "b8")
        relu = "relu" in mods

        def pack8(warp, mask):
            x, y = ra(warp), rb(warp)
            if relu:
                x, y = np.maximum(x, 0), np.maximum(y, 0)
            hi, lo = encode_small(x, fmt).astype(np.uint32), encode_small(y, fmt).astype(np.uint32)
            w(warp, mask, ((hi << shift) | lo).astype(np.uint16 if shift == 8 else np.uint8))
        return pack8
    if dt in ("f16x2", "bf16x2") and at in ("e4m3x2", "e5m2x2", "e2m1x2"):
        fmt = at[:-2]
        shift = 4 if fmt == "e2m1" else 8
        ra = ctx.src(ops[1], "b16" if shift == 8 else "b8")
        w = ctx.dst(ops[0], "b32")
        half = dt[:-2]

        def unpack8(warp, mask):
            v = ra(warp).astype(np.uint32)
            lo = decode_small(v & ((1 << shift) - 1), fmt)
            hi = decode_small((v >> shift) & ((1 << shift) - 1), fmt)
            w(warp, mask, pack_halves(to_raw(hi, half), to_raw(lo, half)))
        return unpack8
    if dt not in BITS or at not in BITS:
        ctx.unsupported()
    ra, w = ctx.src(ops[1], at), ctx.dst(ops[0], dt)
    rnd = next((m for m in mods if m in ("rn", "rz", "rm", "rp", "rni", "rzi", "rmi", "rpi", "rna")), None)
    sat = "sat" in mods
    extra = mods - {rnd, "sat", "ftz", "satfinite", "relu", None}
    if extra:
        ctx.unsupported("the modifier(s) ." + ", .".join(sorted(extra)) + " of")
    a_float, d_float = at in FLOAT_TYPES, dt in FLOAT_TYPES

    def run(warp, mask):
        v = ra(warp)
        with np.errstate(**_ERRSTATE):
            if d_float and a_float:
                x = np.asarray(v, dtype=np.float64 if at == "f64" else np.float32)
                if rnd in _ROUND_INT:
                    x = _ROUND_INT[rnd](x)
                if dt == "bf16":
                    r = bf16_bits_to_f32(f32_to_bf16_bits(x.astype(np.float32), "rz" if rnd == "rz" else "rn"))
                elif dt == "f16":
                    if rnd not in (None, "rn"):
                        raise Unsupported(f"cvt.{rnd} to f16")
                    r = x.astype(np.float16).astype(np.float32)
                elif dt == "f32":
                    if at == "f64" and rnd not in (None, "rn"):
                        raise Unsupported(f"cvt.{rnd}.f32.f64")
                    r = x.astype(np.float32)
                else:
                    r = x.astype(np.float64)
                if sat:
                    r = np.clip(np.nan_to_num(r, nan=0.0), 0.0, 1.0)
                w(warp, mask, r)
            elif d_float:  # int -> float
                x = v.astype(np.float64)
                if dt == "bf16":
                    r = bf16_bits_to_f32(f32_to_bf16_bits(x.astype(np.float32)))
                else:
                    r = x.astype({"f32": np.float32, "f64": np.float64, "f16": np.float16}[dt])
                w(warp, mask, r)
            elif a_float:  # float -> int: round as asked, saturate to the range (NaN -> 0)
                x = np.asarray(v, dtype=np.float64)
                x = _ROUND_INT.get(rnd, np.trunc)(x) if rnd else np.trunc(x)
                info = np.iinfo(_int_view(dt))
                r = np.clip(np.nan_to_num(x, nan=0.0), info.min, info.max).astype(_int_view(dt))
                w(warp, mask, r)
            else:  # int -> int: sign/zero extension by the source type, truncation to the destination
                src_signed = at[0] == "s"
                x = _as(v, at).astype(np.int64 if src_signed else np.uint64)
                if sat:
                    info = np.iinfo(_int_view(dt))
                    x = np.clip(x.astype(np.float64), info.min, info.max).astype(np.int64)
                w(warp, mask, x.astype(np.int64).astype(_int_view(dt)) if src_signed else x.astype(_int_view(dt)))
    return run


# ---------------------------------------------------------------------------------------------
# Floating point (single operand)
# ---------------------------------------------------------------------------------------------


@handler("rcp", "sqrt", "rsqrt", "ex2", "lg2", "sin", "cos", "tanh")
def h_fmath(ctx):
    typ = type_of(ctx.parts)
    op = ctx.parts[0]
    d, a = ctx.inst.operands
    ra, w = ctx.src(a, typ), ctx.dst(d, typ)
    fn = {"rcp": lambda x: 1.0 / x, "sqrt": np.sqrt, "rsqrt": lambda x: 1.0 / np.sqrt(x), "ex2": np.exp2,
          "lg2": np.log2, "sin": np.sin, "cos": np.cos, "tanh": np.tanh}[op]

    def run(warp, mask):
        with np.errstate(**_ERRSTATE):
            x = np.asarray(ra(warp), np.float64)
            w(warp, mask, _round_half(fn(x).astype(np.float32) if typ != "f64" else fn(x), typ))
    return run


# ---------------------------------------------------------------------------------------------
# Control flow
# ---------------------------------------------------------------------------------------------


@handler("bra")
def h_bra(ctx):
    ctx.need({"uni"})
    target = ctx.m.kernel.labels[ctx.inst.operands[0].name]
    return lambda warp, mask: target


@handler("ret", "exit")
def h_exit(ctx):
    def run(warp, mask):
        warp.exit_lanes(mask)
    return run


@handler("trap")
def h_trap(ctx):
    def run(warp, mask):
        raise EmulatorError("trap: the kernel aborted")
    return run


@handler("brkpt", "nanosleep", "pmevent")
def h_nop(ctx):
    return lambda warp, mask: None


# ---------------------------------------------------------------------------------------------
# Warp-level exchange: shfl.sync, elect.sync, vote.sync, activemask, bar.warp.sync
# ---------------------------------------------------------------------------------------------


def _member_mask(value) -> np.ndarray:
    v = int(value) & 0xFFFFFFFF
    return ((np.uint64(v) >> np.arange(32, dtype=np.uint64)) & np.uint64(1)).astype(bool)


@handler("shfl")
def h_shfl(ctx):
    if "sync" not in ctx.mods:
        ctx.unsupported("shfl without .sync:")
    mode = next(p for p in ctx.parts[1:] if p in ("idx", "up", "down", "bfly"))
    ops = ctx.inst.operands
    d = ops[0]
    dreg, preg = (d.first, d.second) if isinstance(d, Pair) else (d, None)
    ra, rb, rc, rm = ctx.src(ops[1], "b32"), ctx.src(ops[2], "u32"), ctx.src(ops[3], "u32"), ctx.src(ops[4], "u32")
    wd = ctx.dst(dreg, "b32")
    wp = ctx.dst(preg, "pred") if preg is not None else None
    lane = np.arange(32, dtype=np.int64)

    def run(warp, mask):
        members = _member_mask(rm(warp)[np.flatnonzero(mask)[0]])
        need = members & ~warp.exited
        if (need & ~mask).any():
            from ..machine import NeedConvergence

            raise NeedConvergence()
        a = ra(warp)
        b = (rb(warp) & 31).astype(np.int64)
        c = rc(warp).astype(np.int64)
        seg = (c >> 8) & 31
        cval = c & 31
        max_lane = (lane & seg) | (cval & ~seg)
        min_lane = lane & seg
        if mode == "up":
            j = lane - b
            ok = j >= max_lane
        elif mode == "down":
            j = lane + b
            ok = j <= max_lane
        elif mode == "bfly":
            j = lane ^ b
            ok = j <= max_lane
        else:
            j = min_lane | (b & ~seg)
            ok = j <= max_lane
        j = np.where(ok, j, lane) & 31
        wd(warp, mask, a[j])
        if wp is not None:
            wp(warp, mask, ok)
    return run


@handler("elect")
def h_elect(ctx):
    if "sync" not in ctx.mods:
        ctx.unsupported()
    d, m = ctx.inst.operands
    dreg, preg = (d.first, d.second) if isinstance(d, Pair) else (d, None)
    rm = ctx.src(m, "u32")
    wd = ctx.dst(dreg, "u32")
    wp = ctx.dst(preg, "pred") if preg is not None else None

    def run(warp, mask):
        members = _member_mask(rm(warp)[np.flatnonzero(mask)[0]]) & ~warp.exited
        if (members & ~mask).any():
            from ..machine import NeedConvergence

            raise NeedConvergence()
        cand = np.flatnonzero(members & mask)
        leader = int(cand[0]) if len(cand) else 0  # the lowest active member (deterministic)
        wd(warp, mask, np.full(32, leader, np.uint32))
        if wp is not None:
            wp(warp, mask, np.arange(32) == leader)
    return run


@handler("vote")
def h_vote(ctx):
    mode = next(p for p in ctx.parts[1:] if p in ("all", "any", "uni", "ballot"))
    ops = ctx.inst.operands
    ra = ctx.src(ops[1], "pred")
    w = ctx.dst(ops[0], "b32" if mode == "ballot" else "pred")

    def run(warp, mask):
        p = ra(warp) & mask
        if mode == "ballot":
            v = np.uint32(sum(1 << int(i) for i in np.flatnonzero(p)))
            w(warp, mask, np.full(32, v, np.uint32))
        elif mode == "all":
            w(warp, mask, np.full(32, bool(p[mask].all())))
        elif mode == "any":
            w(warp, mask, np.full(32, bool(p[mask].any())))
        else:
            vals = p[mask]
            w(warp, mask, np.full(32, bool(vals.all() or not vals.any())))
    return run


@handler("activemask")
def h_activemask(ctx):
    w = ctx.dst(ctx.inst.operands[0], "b32")

    def run(warp, mask):
        w(warp, mask, np.full(32, np.uint32(sum(1 << int(i) for i in np.flatnonzero(mask))), np.uint32))
    return run


@handler("setmaxnreg")
def h_setmaxnreg(ctx):
    """``setmaxnreg.{inc,dec}.sync.aligned.u32 n``: warpgroup-wide register reallocation (ISA: n in 24..256, a
    multiple of 8). Functionally a no-op here; the operand rules are checked."""
    (n,) = ctx.inst.operands
    if not isinstance(n, Imm) or not (24 <= n.value <= 256 and n.value % 8 == 0):
        ctx.unsupported("a register count outside 24..256 (multiple of 8) in")

    def run(warp, mask):
        require_converged(warp, mask)
        warp.maxnreg = int(n.value)
    return run
