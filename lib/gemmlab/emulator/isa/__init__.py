"""Instruction semantics, one module per family; each handler names the PTX ISA section it follows.

A handler is registered for an opcode's first part (``add``, ``mbarrier``,
``cp``, ``tcgen05``, ...). At load time it reads the instruction's modifiers and
operands once and returns ``run(warp, lanes)``: the work for the lanes that
execute it (guard applied). ``run`` returns ``None`` (fall through) or a branch
target. Modifiers a handler does not know are refused with :class:`Unsupported`
when the instruction executes, never guessed.
"""
from __future__ import annotations

import numpy as np

from ..errors import Unsupported
from ..memory import GENERIC_PARAM, GENERIC_SHARED
from ..ptx import Addr, Imm, Pair, Reg, Sink, Sym, Vec
from ..values import bits_of, from_raw, to_raw

HANDLERS: dict = {}


def handler(*names):
    def deco(fn):
        for n in names:
            HANDLERS[n] = fn
        return fn
    return deco


class Ctx:
    """What a handler needs to compile one instruction: operand readers and writers."""

    def __init__(self, machine, inst):
        self.m = machine
        self.inst = inst
        self.parts = inst.parts
        self.mods = set(inst.parts[1:])

    def unsupported(self, what: str = ""):
        raise Unsupported(f"{what or 'this form of'} {self.inst.opcode} is not implemented by the emulator "
                          f"(PTX line {self.inst.line}: {self.inst.text.strip()[:100]})")

    def need(self, allowed: set, *, prefixes=()):
        """Refuse modifiers outside ``allowed`` (and not starting with one of ``prefixes``)."""
        extra = [p for p in self.parts[1:] if p not in allowed and not any(p.startswith(x) for x in prefixes)]
        if extra:
            self.unsupported("the modifier(s) ." + ", .".join(extra) + " of")

    # ---- registers
    def reg_index(self, op: Reg) -> int:
        try:
            return self.m.reg_index[op.name]
        except KeyError:
            raise Unsupported(f"register {op.name} is not declared (PTX line {self.inst.line})") from None

    def src(self, op, typ: str):
        """A reader ``f(warp) -> values`` (32 lanes, numpy, read as ``typ``)."""
        m = self.m
        if isinstance(op, Reg):
            idx = self.reg_index(op)
            name = op.name
            pc = self.inst.pc

            def read(warp):
                if warp.pending[idx]:
                    warp.check_pending(idx, name, pc)
                return from_raw(warp.regs[idx], typ)
            return read
        if isinstance(op, Pair) and isinstance(op.first, Sym) and op.first.name == "!":
            inner = self.src(op.second, "pred")
            return lambda warp: ~inner(warp)
        if isinstance(op, Imm):
            value = imm_values(op, typ)
            return lambda warp: value
        if isinstance(op, Sym):
            return self.symbol(op.name, typ)
        if isinstance(op, Addr) and not op.coords:
            return self.src(op.base, typ)
        raise Unsupported(f"operand {op} as a source of {self.inst.opcode} (PTX line {self.inst.line})")

    def symbol(self, name: str, typ: str):
        """Special registers, parameters and shared variables used as values."""
        m = self.m
        if name in m.param_offsets:  # the parameter's address in the param space (mov / cvta.param)
            off = m.param_offsets[name][0]
            value = to_typed_const(off, typ)
            return lambda warp: value
        if name in m.shared_symbols:  # the variable's address in the executing CTA's shared window
            off = m.shared_symbols[name]
            return lambda warp: to_typed_const(warp.cta.smem.base + off, typ)
        fn = SPECIAL.get(name)
        if fn is None:
            raise Unsupported(f"special register or symbol {name} (PTX line {self.inst.line})")

        def read(warp):
            return from_raw(np.broadcast_to(np.asarray(fn(warp)).astype(np.uint64), (32,)), typ)
        return read

    def dst(self, op, typ: str):
        """A writer ``f(warp, lanes, values)`` storing ``values`` (read as ``typ``) into the lanes' register."""
        if isinstance(op, Sink):
            return lambda warp, mask, v: None
        if not isinstance(op, Reg):
            raise Unsupported(f"operand {op} as a destination of {self.inst.opcode} (PTX line {self.inst.line})")
        idx = self.reg_index(op)
        reg_bits = bits_of(self.m.reg_type[idx])
        tbits = bits_of(typ)
        signed = typ[0] == "s" and reg_bits > tbits
        rmask = np.uint64((1 << reg_bits) - 1) if reg_bits < 64 else None
        pc = self.inst.pc
        name = op.name

        def write(warp, mask, values):
            if warp.pending[idx]:
                from ..errors import RaceError

                raise RaceError(f"register {name} is overwritten before {warp.pending_why.get(idx)} is waited for",
                                where=warp.where(pc))
            if getattr(values, "shape", None) != (32,):
                values = np.broadcast_to(values, (32,))
            raw = to_raw(values, typ)
            if signed:
                raw = raw.view({8: np.int8, 16: np.int16, 32: np.int32}[tbits]).astype(np.int64).view(np.uint64)
            else:
                raw = raw.astype(np.uint64)
            if rmask is not None:
                raw = raw & rmask
            row = warp.regs[idx]
            if mask is None or mask.all():
                row[:] = raw
            else:
                np.copyto(row, raw, where=mask)
        return write

    def addr(self, op: Addr):
        """A reader of the addresses of a memory operand ``[base + offset]`` (uint64, per lane)."""
        if not isinstance(op, Addr):
            raise Unsupported(f"operand {op} is not an address (PTX line {self.inst.line})")
        off = np.uint64(op.offset & 0xFFFF_FFFF_FFFF_FFFF)
        base = op.base
        if isinstance(base, Imm):
            value = np.full(32, np.uint64(base.value & 0xFFFF_FFFF_FFFF_FFFF))
            return lambda warp: value + off
        if isinstance(base, Sym) and base.name in self.m.param_offsets:
            value = np.full(32, np.uint64(self.m.param_offsets[base.name][0]))
            return lambda warp: value + off
        if isinstance(base, Sym) and base.name in self.m.shared_symbols:
            soff = np.uint64(self.m.shared_symbols[base.name])
            return lambda warp: np.full(32, np.uint64(warp.cta.smem.base) + soff + off)
        if isinstance(base, Reg):
            idx = self.reg_index(base)
            name = base.name
            pc = self.inst.pc

            def read(warp):
                if warp.pending[idx]:
                    warp.check_pending(idx, name, pc)
                return warp.regs[idx] + off
            return read
        raise Unsupported(f"address base {base} (PTX line {self.inst.line})")

    def vec_src(self, op, typ: str):
        items = op.items if isinstance(op, Vec) else (op,)
        readers = [self.src(x, typ) for x in items]
        return lambda warp: [r(warp) for r in readers]

    def vec_dst(self, op, typ: str):
        items = op.items if isinstance(op, Vec) else (op,)
        writers = [self.dst(x, typ) for x in items]

        def write(warp, mask, values):
            for w, v in zip(writers, values):
                w(warp, mask, v)
        return write


def to_typed_const(value: int, typ: str):
    return imm_values(Imm(value, "int"), typ)


def imm_values(op: Imm, typ: str):
    """An immediate read as ``typ``: integers wrap to the type's width (on 16-bit float types they are bit
    patterns), float literals round to the type (on bit types, ``0f``/``0d`` literals keep their bits)."""
    if typ == "pred":
        return np.full(32, bool(op.value))
    b = bits_of(typ)
    if op.kind == "int":
        if typ in ("f32", "tf32", "f64"):
            return np.full(32, float(op.value), dtype=np.float64 if typ == "f64" else np.float32)
        return from_raw(np.full(32, int(op.value) & ((1 << b) - 1), dtype=np.uint64), typ)
    if typ in ("f32", "tf32"):
        return np.full(32, op.value, np.float32)
    if typ == "f64":
        return np.full(32, op.value, np.float64)
    if typ in ("f16", "bf16"):
        return from_raw(to_raw(np.full(32, op.value, np.float32), typ), typ)
    raw = (np.full(32, op.value, np.float32).view(np.uint32) if op.kind == "f32"
           else np.full(32, op.value, np.float64).view(np.uint64))
    return from_raw(raw.astype(np.uint64), typ)


# ---------------------------------------------------------------------------------------------
# Special registers (PTX ISA "Special Registers")
# ---------------------------------------------------------------------------------------------


def _cluster_coord(warp, i):
    cx = warp.machine.cluster_dims
    return warp.cta.ctaid[i] % cx[i]


SPECIAL = {
    "%tid.x": lambda w: w.tid[0], "%tid.y": lambda w: w.tid[1], "%tid.z": lambda w: w.tid[2],
    "%ntid.x": lambda w: w.machine.launch_block[0], "%ntid.y": lambda w: w.machine.launch_block[1],
    "%ntid.z": lambda w: w.machine.launch_block[2],
    "%ctaid.x": lambda w: w.cta.ctaid[0], "%ctaid.y": lambda w: w.cta.ctaid[1], "%ctaid.z": lambda w: w.cta.ctaid[2],
    "%nctaid.x": lambda w: w.machine.grid[0], "%nctaid.y": lambda w: w.machine.grid[1],
    "%nctaid.z": lambda w: w.machine.grid[2],
    "%laneid": lambda w: np.arange(32), "%warpid": lambda w: w.index,
    "%nwarpid": lambda w: len(w.cta.warps),
    "%cluster_ctarank": lambda w: w.cta.rank, "%cluster_nctarank": lambda w: w.cta.cluster.size,
    "%cluster_ctaid.x": lambda w: _cluster_coord(w, 0), "%cluster_ctaid.y": lambda w: _cluster_coord(w, 1),
    "%cluster_ctaid.z": lambda w: _cluster_coord(w, 2),
    "%cluster_nctaid.x": lambda w: w.machine.cluster_dims[0], "%cluster_nctaid.y": lambda w: w.machine.cluster_dims[1],
    "%cluster_nctaid.z": lambda w: w.machine.cluster_dims[2],
    "%clusterid.x": lambda w: w.cta.ctaid[0] // w.machine.cluster_dims[0],
    "%clusterid.y": lambda w: w.cta.ctaid[1] // w.machine.cluster_dims[1],
    "%clusterid.z": lambda w: w.cta.ctaid[2] // w.machine.cluster_dims[2],
    "%nclusterid.x": lambda w: w.machine.grid[0] // w.machine.cluster_dims[0],
    "%nclusterid.y": lambda w: w.machine.grid[1] // w.machine.cluster_dims[1],
    "%nclusterid.z": lambda w: w.machine.grid[2] // w.machine.cluster_dims[2],
    "%is_explicit_cluster": lambda w: int(w.machine.cluster_dims != (1, 1, 1)),
    "%dynamic_smem_size": lambda w: w.machine.launch.smem,
    "%total_smem_size": lambda w: w.machine.smem_total,
    # clocks count emulator steps: they order events, they do not measure time
    "%clock": lambda w: w.machine.clock & 0xFFFFFFFF, "%clock64": lambda w: w.machine.clock,
    "%globaltimer": lambda w: w.machine.clock, "%globaltimer_lo": lambda w: w.machine.clock & 0xFFFFFFFF,
    "%smid": lambda w: w.cta.linear, "%nsmid": lambda w: len(w.machine.ctas),
    "%lanemask_eq": lambda w: np.uint32(1) << np.arange(32, dtype=np.uint32),
    "%lanemask_lt": lambda w: (np.uint64(1) << np.arange(32, dtype=np.uint64)) - np.uint64(1),
}


# ---------------------------------------------------------------------------------------------
# Compiling a kernel
# ---------------------------------------------------------------------------------------------


def compile_kernel(machine) -> list:
    from . import alu, mem, sync, asyncops, wgmma, tcgen05, matrix  # noqa: F401  (register the handlers)

    return [compile_instruction(machine, inst) for inst in machine.kernel.body]


def compile_instruction(machine, inst):
    head = inst.parts[0]
    factory = HANDLERS.get(head)
    text = inst.text.strip()
    if factory is None:
        def missing(warp, pc, mask):
            raise Unsupported(f"instruction {inst.opcode} is not implemented by the emulator "
                              f"(PTX line {inst.line}: {text[:100]})")
        return missing
    try:
        body = factory(Ctx(machine, inst))
    except Unsupported as e:
        err = e

        def refused(warp, pc, mask):
            raise err
        return refused
    guard = inst.guard
    is_branch = head == "bra"
    if guard is None:
        def run(warp, pc, mask):
            target = body(warp, mask)
            warp.advance(pc, mask, target)
        return run
    gidx = machine.reg_index[guard[0]]
    neg = guard[1]

    def run_guarded(warp, pc, mask):
        g = warp.regs[gidx] != 0
        m = mask & (~g if neg else g)
        if not m.any():
            warp.advance(pc, mask)
            return
        target = body(warp, m)
        if target is None:
            warp.advance(pc, mask)
        elif m is mask or np.array_equal(m, mask):
            warp.advance(pc, mask, target)
        else:
            t = np.full(32, pc + 1, dtype=np.int64)
            t[m] = target if isinstance(target, (int, np.integer)) else target[m]
            warp.advance(pc, mask, t)
    return run_guarded


def type_of(parts, *, default=None):
    """The last part of an opcode that names a scalar type (``add.s32`` -> ``s32``)."""
    from ..values import BITS

    for p in reversed(parts):
        if p in BITS:
            return p
    if default is None:
        raise Unsupported(f"no type in {'.'.join(parts)}")
    return default


def require_converged(warp, mask):
    """Warp-synchronous (``.sync.aligned``) instructions: every active lane of the warp executes together."""
    if not (mask is warp.active or np.array_equal(mask, ~warp.exited)):
        from ..machine import NeedConvergence

        raise NeedConvergence()


def generic_to_space(addr: int) -> tuple[str, int]:
    """A generic address -> ("shared" | "param" | "global", address in that space)."""
    top = addr & 0xF000_0000_0000_0000
    if top == GENERIC_SHARED:
        return "shared", addr - GENERIC_SHARED
    if top == GENERIC_PARAM:
        return "param", addr - GENERIC_PARAM
    return "global", addr
