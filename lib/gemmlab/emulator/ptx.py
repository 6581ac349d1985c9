"""Reading PTX text into kernels the emulator executes.

The grammar is the part of PTX (ISA 9.x, "Syntax" and "State spaces, types and
variables") that ``cute.compile`` emits for the course's kernels: module
directives, ``.entry`` kernels with ``.param`` lists and performance directives,
``.reg`` declarations (ranges such as ``%r<835>``), labels, guards (``@%p``,
``@!%p``) and instructions whose operands are registers, immediates (decimal,
hex, ``0f``/``0d`` floats), vectors ``{a, b}``, addresses ``[base+offset]``,
symbols and the sink ``_``. Inline assembly arrives as ``{ ... }`` blocks that
declare their own registers and labels (``WAIT_PARITY:`` appears in many
blocks); each block is a scope, and its names are made unique here, so the
executed program is one flat list of instructions with resolved branch targets.
"""
from __future__ import annotations

import re
import struct
from dataclasses import dataclass, field

#: Bits of each register/variable type (``.pred`` is 1 bit, stored as a bool).
TYPE_BITS = {"pred": 1, "b8": 8, "u8": 8, "s8": 8, "b16": 16, "u16": 16, "s16": 16, "f16": 16, "bf16": 16,
             "b32": 32, "u32": 32, "s32": 32, "f32": 32, "f16x2": 32, "bf16x2": 32, "b64": 64, "u64": 64,
             "s64": 64, "f64": 64, "b128": 128}


class PTXSyntaxError(ValueError):
    """The PTX text is not in the subset the emulator reads (names the line)."""


# ---------------------------------------------------------------------------------------------
# Operands
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Reg:
    name: str  # unique within the kernel (scoped names carry a '#<scope>' suffix)


@dataclass(frozen=True)
class Imm:
    value: int | float
    kind: str  # "int", "f32" (0f...), "f64" (0d... or a decimal with a point)


@dataclass(frozen=True)
class Sym:
    name: str  # a parameter, a shared variable, a label or a special register


@dataclass(frozen=True)
class Vec:
    items: tuple  # Reg / Imm / Sink


@dataclass(frozen=True)
class Addr:
    base: object  # Reg or Sym or Imm (an absolute address), or None
    offset: int = 0
    coords: tuple = ()  # tensor coordinates of a TMA address: [tmap, {c0, c1}]


@dataclass(frozen=True)
class Sink:
    pass


@dataclass(frozen=True)
class Pair:
    """``d|p``: an instruction with two destinations (``elect.sync``, ``shfl.sync``, ``setp``)."""

    first: object
    second: object


# ---------------------------------------------------------------------------------------------
# Program
# ---------------------------------------------------------------------------------------------


@dataclass
class Instruction:
    pc: int
    opcode: str  # e.g. "mbarrier.try_wait.parity.shared::cta.b64"
    operands: tuple
    guard: tuple | None  # (register name, negated) or None
    line: int  # 1-based line in the PTX text
    text: str  # the statement as written

    @property
    def parts(self) -> list[str]:
        return self.opcode.split(".")


@dataclass
class Kernel:
    name: str
    params: list  # [(name, size in bytes, align)]
    regs: dict  # register name -> type ("b32", "pred", ...)
    body: list  # [Instruction]
    labels: dict  # label -> pc
    directives: dict = field(default_factory=dict)  # "reqntid": (x, y, z), "minnctapersm": n, ...
    branch_scopes: dict = field(default_factory=dict, repr=False)  # pc -> label scopes seen by a branch

    def param_offsets(self) -> dict:
        """``{param name: (offset, size)}`` in a param buffer laid out in order, each at its alignment."""
        out, off = {}, 0
        for name, size, align in self.params:
            off = -(-off // align) * align
            out[name] = (off, size)
            off += size
        return out


@dataclass
class Module:
    version: str
    target: str
    kernels: dict  # name -> Kernel
    shared: dict  # module-level .shared variables: name -> (align, size or None for extern)
    text: str

    def kernel(self, name: str | None = None) -> Kernel:
        if name is None:
            if len(self.kernels) != 1:
                raise ValueError(f"the module has {len(self.kernels)} kernels; name one of {sorted(self.kernels)}")
            return next(iter(self.kernels.values()))
        try:
            return self.kernels[name]
        except KeyError:
            raise ValueError(f"no kernel {name!r} in the module; it has {sorted(self.kernels)}") from None


# ---------------------------------------------------------------------------------------------
# Lexing: statements with their line numbers, braces and labels as their own items
# ---------------------------------------------------------------------------------------------

_COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)


def _statements(text: str):
    """Yield ``(kind, payload, line)``: ("open",), ("close",), ("label", name), ("stmt", text)."""
    text = _COMMENT.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    # module directives that end at the end of their line
    text = re.sub(r"^(\s*\.(?:version|target|address_size)\b[^;\n]*)$", r"\1;", text, flags=re.M)
    i, n, line = 0, len(text), 1
    buf, buf_line, depth_in_stmt = [], None, 0
    while i < n:
        ch = text[i]
        if ch == "\n":
            line += 1
        if ch == '"':  # strings (.pragma "nounroll") are copied as they are
            j = text.index('"', i + 1)
            if buf_line is None:
                buf_line = line
            buf.append(text[i:j + 1])
            i = j + 1
            continue
        if not buf or not "".join(buf).strip():
            # at the start of a statement: braces are scopes, "name:" is a label
            if ch == "{":
                yield ("open", None, line)
                buf, buf_line = [], None
                i += 1
                continue
            if ch == "}":
                yield ("close", None, line)
                buf, buf_line = [], None
                i += 1
                continue
        if ch == "{" and depth_in_stmt == 0:
            head = "".join(buf)
            if re.match(r"\s*(\.visible\s+|\.weak\s+)?\.entry\b", head) and head.count("(") == head.count(")"):
                yield ("stmt", head.strip(), buf_line)  # an .entry header ends at its body's brace
                yield ("open", None, line)
                buf, buf_line = [], None
                i += 1
                continue
        if ch == "{":
            depth_in_stmt += 1
        elif ch == "}":
            depth_in_stmt -= 1
            if depth_in_stmt < 0:  # a closing brace right after a statement without ';'
                stmt = "".join(buf).strip()
                if stmt:
                    yield ("stmt", stmt, buf_line)
                yield ("close", None, line)
                buf, buf_line, depth_in_stmt = [], None, 0
                i += 1
                continue
        if ch == ";" and depth_in_stmt == 0:
            stmt = "".join(buf).strip()
            if stmt:
                yield ("stmt", stmt, buf_line)
            buf, buf_line = [], None
            i += 1
            continue
        if ch == ":" and depth_in_stmt == 0 and text[i + 1:i + 2] != ":" and (i == 0 or text[i - 1] != ":"):
            cand = "".join(buf).strip()
            if re.fullmatch(r"[$%\w.]+", cand or "-") and not cand.startswith("."):
                yield ("label", cand, buf_line)
                buf, buf_line = [], None
                i += 1
                continue
        if buf_line is None and not ch.isspace():
            buf_line = line
        buf.append(ch)
        i += 1
    if "".join(buf).strip():
        raise PTXSyntaxError(f"line {buf_line}: statement without ';': {''.join(buf).strip()[:80]}")


# ---------------------------------------------------------------------------------------------
# Operands
# ---------------------------------------------------------------------------------------------

_INT = re.compile(r"[-+]?(0[xX][0-9a-fA-F]+|0[bB][01]+|\d+)[uU]?$")


def _split_top(s: str, sep: str = ",") -> list[str]:
    out, depth, cur = [], 0, []
    for ch in s:
        if ch in "{[(":
            depth += 1
        elif ch in "}])":
            depth -= 1
        if ch == sep and depth == 0:
            out.append("".join(cur).strip())
            cur = []
        else:
            cur.append(ch)
    if "".join(cur).strip():
        out.append("".join(cur).strip())
    return out


def parse_immediate(tok: str) -> Imm | None:
    t = tok.strip()
    if t[:2] in ("0f", "0F") and len(t) == 10:
        return Imm(struct.unpack("<f", int(t[2:], 16).to_bytes(4, "little"))[0], "f32")
    if t[:2] in ("0d", "0D") and len(t) == 18:
        return Imm(struct.unpack("<d", int(t[2:], 16).to_bytes(8, "little"))[0], "f64")
    if _INT.match(t):
        neg = t.startswith("-")
        body = t.lstrip("+-").rstrip("uU")
        v = int(body, 0) if body[:2].lower() in ("0x", "0b") else int(body)
        return Imm(-v if neg else v, "int")
    if re.fullmatch(r"[-+]?\d+\.\d*([eE][-+]?\d+)?|[-+]?\d+[eE][-+]?\d+", t):
        return Imm(float(t), "f64")
    return None


class _Scopes:
    """Register and label names by brace scope: inner declarations shadow outer ones."""

    def __init__(self):
        self.stack = [{}]  # each: local name -> unique name
        self.label_stack = [{}]
        self.counter = 0

    def push(self):
        self.counter += 1
        self.stack.append({"#": self.counter})
        self.label_stack.append({"#": self.counter})

    def pop(self):
        self.stack.pop()
        self.label_stack.pop()

    def declare_reg(self, name: str) -> str:
        scope = self.stack[-1]
        unique = name if len(self.stack) == 1 else f"{name}#{scope['#']}"
        scope[name] = unique
        return unique

    def reg(self, name: str) -> str | None:
        for scope in reversed(self.stack):
            if name in scope:
                return scope[name]
        return None

    def declare_label(self, name: str) -> str:
        scope = self.label_stack[-1]
        unique = name if len(self.label_stack) == 1 else f"{name}#{scope['#']}"
        scope[name] = unique
        return unique


# ---------------------------------------------------------------------------------------------
# The parser
# ---------------------------------------------------------------------------------------------


def parse(text: str) -> Module:
    """Parse PTX ``text`` into a :class:`Module` (raises :class:`PTXSyntaxError` naming the line)."""
    version = re.search(r"^\s*\.version\s+(\S+)", text, re.M)
    target = re.search(r"^\s*\.target\s+(\S+)", text, re.M)
    module = Module(version.group(1) if version else "", target.group(1).rstrip(",") if target else "", {}, {},
                    text)
    items = list(_statements(text))
    i = 0
    while i < len(items):
        kind, stmt, line = items[i]
        if kind == "stmt" and re.match(r"(\.visible\s+|\.weak\s+)?\.entry\b", stmt):
            i = _parse_entry(items, i, module)
            continue
        if kind == "stmt":
            _module_directive(stmt, line, module)
        i += 1
    return module


def _module_directive(stmt: str, line: int, module: Module):
    m = re.match(r"(?:\.extern\s+)?\.shared\s+(?:\.align\s+(\d+)\s+)?\.(\w+)\s+(\w+)(?:\[(\d*)\])?", stmt)
    if m:
        align = int(m.group(1) or 1)
        bits = TYPE_BITS.get(m.group(2), 8)
        count = m.group(4)
        size = None if count == "" else (int(count) if count else 1) * max(bits // 8, 1)
        module.shared[m.group(3)] = (align, size)
        return
    if re.match(r"\.(version|target|address_size|file|loc|section|pragma)\b", stmt):
        return
    if re.match(r"(\.extern\s+|\.visible\s+)?\.func\b", stmt):
        raise PTXSyntaxError(f"line {line}: device functions (.func) are not supported by the emulator")
    if re.match(r"(\.visible\s+|\.extern\s+)?\.(global|const)\b", stmt):
        raise PTXSyntaxError(f"line {line}: module-level .global/.const variables are not supported: {stmt[:80]}")
    raise PTXSyntaxError(f"line {line}: unexpected module-level statement: {stmt[:80]}")


def _parse_entry(items, i, module: Module) -> int:
    _, header, line = items[i]
    m = re.match(r"(?:\.visible\s+|\.weak\s+)?\.entry\s+(\w+)\s*\((.*)\)\s*(.*)$", header, re.S)
    if not m:
        raise PTXSyntaxError(f"line {line}: cannot read the .entry header")
    name, plist, tail = m.group(1), m.group(2), m.group(3)
    params = []
    for p in _split_top(plist):
        pm = re.match(r"\.param\s+(?:\.align\s+(\d+)\s+)?\.(\w+)\s+(\w+)(?:\[(\d+)\])?$", p.strip())
        if not pm:
            raise PTXSyntaxError(f"line {line}: cannot read parameter {p!r}")
        bits = TYPE_BITS.get(pm.group(2))
        if bits is None:
            raise PTXSyntaxError(f"line {line}: unknown parameter type .{pm.group(2)}")
        elem = max(bits // 8, 1)
        size = elem * (int(pm.group(4)) if pm.group(4) else 1)
        params.append((pm.group(3), size, int(pm.group(1) or elem)))
    directives = _directives(tail)
    i += 1
    # directives written as statements of their own (".reqntid 192, 1, 1" without ';' come with the header)
    kernel = Kernel(name, params, {}, [], {}, directives)
    if i >= len(items) or items[i][0] != "open":
        raise PTXSyntaxError(f"line {line}: .entry {name} has no body")
    scopes = _Scopes()
    depth = 0
    pending_labels: list[str] = []
    while i < len(items):
        kind, stmt, ln = items[i]
        i += 1
        if kind == "open":
            depth += 1
            if depth > 1:
                scopes.push()
            continue
        if kind == "close":
            depth -= 1
            if depth == 0:
                break
            scopes.pop()
            continue
        if kind == "label":
            unique = scopes.declare_label(stmt)
            kernel.labels[unique] = len(kernel.body)
            pending_labels.append(unique)
            continue
        _statement(stmt, ln, kernel, scopes)
    _resolve_labels(kernel)
    module.kernels[name] = kernel
    return i


def _directives(tail: str) -> dict:
    out = {}
    for m in re.finditer(r"\.(reqntid|maxntid|reqnctapercluster|maxclusterrank|minnctapersm|maxnreg|"
                         r"explicitcluster)\b\s*([\d,\s]*)", tail):
        vals = tuple(int(v) for v in re.findall(r"\d+", m.group(2)))
        out[m.group(1)] = vals if len(vals) != 1 else vals[0]
    return out


def _statement(stmt: str, line: int, kernel: Kernel, scopes: _Scopes):
    if stmt.startswith(".reg"):
        m = re.match(r"\.reg\s+(?:\.v\d+\s+)?\.(\w+)\s+(.*)$", stmt, re.S)
        if not m:
            raise PTXSyntaxError(f"line {line}: cannot read {stmt[:60]}")
        typ = m.group(1)
        if typ not in TYPE_BITS:
            raise PTXSyntaxError(f"line {line}: unknown register type .{typ}")
        for decl in _split_top(m.group(2)):
            rm = re.fullmatch(r"(%?\w+)<(\d+)>", decl.strip())
            if rm:  # %r<835>: %r0 .. %r834
                for k in range(int(rm.group(2))):
                    kernel.regs[scopes.declare_reg(f"{rm.group(1)}{k}")] = typ
            else:
                kernel.regs[scopes.declare_reg(decl.strip())] = typ
        return
    if stmt.startswith(".pragma") or stmt.startswith(".loc") or stmt.startswith(".file"):
        return
    if stmt.startswith("."):
        d = _directives(stmt)
        if d:
            kernel.directives.update(d)
            return
        if re.match(r"\.(shared|local)\b", stmt):
            raise PTXSyntaxError(f"line {line}: kernel-scope .shared/.local variables are not supported: {stmt[:80]}")
        raise PTXSyntaxError(f"line {line}: unexpected directive {stmt[:80]}")
    guard = None
    gm = re.match(r"@(!?)(%?\w+)\s+", stmt)
    if gm:
        reg = scopes.reg(gm.group(2))
        if reg is None:
            raise PTXSyntaxError(f"line {line}: guard predicate {gm.group(2)} is not declared")
        guard = (reg, gm.group(1) == "!")
        stmt = stmt[gm.end():]
    om = re.match(r"([\w.:]+)\s*(.*)$", stmt, re.S)
    if not om:
        raise PTXSyntaxError(f"line {line}: cannot read {stmt[:80]}")
    opcode, rest = om.group(1), om.group(2).strip()
    operands = tuple(_operand(tok, line, scopes) for tok in _split_top(rest)) if rest else ()
    inst = Instruction(len(kernel.body), opcode, operands, guard, line, stmt)
    if opcode.startswith("bra"):
        kernel.branch_scopes[inst.pc] = list(scopes.label_stack)  # resolved once the labels are all known
    kernel.body.append(inst)


def _operand(tok: str, line: int, scopes: _Scopes):
    tok = tok.strip()
    if tok == "_":
        return Sink()
    if tok.startswith("{") and tok.endswith("}"):
        return Vec(tuple(_operand(t, line, scopes) for t in _split_top(tok[1:-1])))
    if tok.startswith("[") and tok.endswith("]"):
        inner = tok[1:-1].strip()
        parts = _split_top(inner)
        if len(parts) > 1:  # [tmap, {c0, c1}]
            base = _operand(parts[0], line, scopes)
            coords = _operand(parts[1], line, scopes)
            return Addr(base, 0, coords.items if isinstance(coords, Vec) else (coords,))
        m = re.fullmatch(r"([^+\-]+?)\s*(?:([+-])\s*(-?\s*\w+))?", inner)
        if not m:
            raise PTXSyntaxError(f"line {line}: cannot read address {tok}")
        base_tok, sign, off = m.group(1).strip(), m.group(2), m.group(3)
        offset = 0
        if off is not None:
            imm = parse_immediate(off.replace(" ", ""))
            if imm is None or imm.kind != "int":
                raise PTXSyntaxError(f"line {line}: address offset {off!r} is not an integer")
            offset = imm.value if sign == "+" else -imm.value
        base_imm = parse_immediate(base_tok)
        base = base_imm if base_imm is not None else _operand(base_tok, line, scopes)
        return Addr(base, offset)
    if "|" in tok:
        a, b = tok.split("|", 1)
        return Pair(_operand(a, line, scopes), _operand(b, line, scopes))
    imm = parse_immediate(tok)
    if imm is not None:
        return imm
    neg = tok.startswith("!")  # a negated predicate source (e.g. in selp / setp ... , !p)
    name = tok[1:] if neg else tok
    reg = scopes.reg(name)
    if reg is not None:
        if neg:
            return Pair(Sym("!"), Reg(reg))
        return Reg(reg)
    if re.fullmatch(r"[%$]?[\w.]+", tok):
        return Sym(tok)
    raise PTXSyntaxError(f"line {line}: cannot read operand {tok!r}")


def _resolve_labels(kernel: Kernel):
    """Each branch names a label as written; it means the label of the innermost enclosing block that has it."""
    for pc, scopes in kernel.branch_scopes.items():
        inst = kernel.body[pc]
        if len(inst.operands) != 1 or not isinstance(inst.operands[0], Sym):
            raise PTXSyntaxError(f"line {inst.line}: a branch target must be one label")
        target = inst.operands[0].name
        for scope in reversed(scopes):
            if target in scope:
                inst.operands = (Sym(scope[target]),)
                break
        else:
            raise PTXSyntaxError(f"line {inst.line}: branch to unknown label {target}")
    kernel.branch_scopes.clear()
