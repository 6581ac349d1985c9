"""Chapter 09 (part 2): ``tcgen05.mma``, its two descriptors, ``tcgen05.commit``, and CTA pairs.

What it teaches
    Blackwell's tensor-core instruction, ``tcgen05.mma.cta_group::1.kind::f16
    [d_tmem], a_desc, b_desc, idesc, enable_input_d``, is issued by **one
    thread**. It reads A and B from shared memory through 64-bit
    *shared-memory descriptors*, accumulates D (fp32) into tensor memory
    (:mod:`gemmlab.tmem`), and runs asynchronously: ``tcgen05.commit`` makes an
    mbarrier arrive once every MMA the thread issued before it has finished.

    * The **instruction descriptor** (32 bits, :class:`InstrDesc`) says what to
      compute: dtypes of A, B, D, whether A/B are K-major or MN-major, M, N,
      negation, saturation, sparsity, and the ``.ws`` max shift.
    * The **shared-memory descriptor** (64 bits, :class:`SmemDesc`) says where
      an operand is and how it is laid out. It extends Hopper's wgmma
      descriptor: addresses, LBO, SBO and base offset sit in the same bits, and
      the swizzle field grows from 2 bits (62-63) to 3 (61-63) so that
      Hopper's codes 1/2/3 (128B/64B/32B) read as SM100's 2/4/6, the same bit
      patterns (:func:`sm90_swizzle_as_sm100`). What is new: bits 46-48 must
      hold the constant ``0b001`` (a version; 0 in a Hopper descriptor), bit 52
      selects the LBO mode, and code 1 (bit 61) is a new 128B mode with
      32-byte atoms.
    * K-major, 128-byte swizzle, 16-bit elements (:func:`smem_desc_kmajor_sw128`):
      each operand row is 64 elements (128 bytes) of K; 8 rows form a
      1024-byte swizzle atom (the stride byte offset, SBO); a wider K is
      stored as further panels of ``rows x 64``. One MMA consumes K=16
      (32 bytes), and moving to the next K step adds 32 bytes to the start
      address, *inside* the swizzled atom: the hardware applies the swizzle to
      the final address, so the descriptor does not change otherwise.
    * **CTA pairs** (``cta_group::2``): two CTAs of a cluster (ranks 2i, 2i+1)
      act as one M=256 MMA. Each holds its 128 rows of A and *half* of B
      (N/2 rows); the even (leader) CTA issues every MMA, and each CTA's
      tensor memory receives its own 128 rows of D. Both allocate TMEM with
      ``cta_group::2``; the leader's ``tcgen05.commit ... multicast::cluster``
      arrives on the barrier of both CTAs.

What it adds over chapter 06 (wgmma)
    No accumulator registers: D lives in TMEM, is read with ``tcgen05.ld``
    by whichever warps do the epilogue, and the MMA is issued by a single
    thread instead of a warpgroup. Completion is an mbarrier arrival, so the
    MMA warp never waits for its own MMAs.

The code
    * :class:`InstrDesc` (encode / decode / validate), :class:`SmemDesc` and
      :func:`smem_desc_kmajor_sw128` (encode / decode), :func:`sw128_kmajor_offset`
      (where element (row, k) lives), :func:`kmajor_sw128_desc_sequence`:
      the stable API chapter 10 reuses.
    * One wrapper per PTX instruction: :func:`tcgen05_mma_f16`,
      :func:`tcgen05_commit`, :func:`tcgen05_commit_multicast`.
    * :func:`mma_tile_kernel`: one 128xNxK tile (or 256xNxK on a CTA pair),
      every step written out: alloc, fill shared memory, MMA, commit, wait,
      ``tcgen05.ld``, dealloc. :func:`run_mma_tile` launches it (``sm100``).
    * :func:`compile_dsl_reference` / :func:`dsl_mma_constants`: the DSL's own
      ``tcgen05.MmaF16BF16Op`` compiled for sm_100a, and the descriptor
      constants read back from its PTX, so tests can check our encoders against
      what NVIDIA's compiler emits.
"""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass

import numpy as np

import cutlass
import cutlass.cute as cute
import cuda.bindings.driver as cuda
from cutlass import BFloat16, Float32, Int32, Int64

from .checks import check_choice, check_int, check_tensor
from .compile import check_target, compile_for, fake_stream, fake_tensor, launcher, ptx_instructions, ptx_lines
from .hardware import SMEM_PER_BLOCK
from .tiers import require_tier
from .tmem import (  # noqa: F401  (tmem_ld_32x32b_model is part of this module's API)
    LD_32X32B_NUMS,
    accumulator_coords,
    alloc_columns_for,
    registers_to_tile,
    tcgen05_fence_after_thread_sync,
    tcgen05_fence_before_thread_sync,
    tmem_alloc,
    tmem_dealloc,
    tmem_ld_32x32b,
    tmem_ld_32x32b_model,
    tmem_relinquish_alloc_permit,
    tmem_wait_ld,
)

# --------------------------------------------------------------------------------------
# The instruction descriptor (kind::f16 / tf32 / f8f6f4 / i8 share this format)
# --------------------------------------------------------------------------------------

#: (name, lowest bit, width, meaning): the 32-bit instruction descriptor, PTX ISA
#: "Instruction descriptor" table for .kind::f16/.tf32/.f8f6f4/.i8. Gaps are reserved (0).
INSTR_DESC_FIELDS = (
    ("sparse_id2", 0, 2, "sparsity selector (sparse only)"),
    ("sparse", 2, 1, "0 dense, 1 sparse"),
    ("saturate", 3, 1, "saturate (integer kinds)"),
    ("d_fmt", 4, 2, "D type: 0 f16, 1 f32, 2 s32"),
    ("a_fmt", 7, 3, "A type (f16 kind: 0 f16, 1 bf16)"),
    ("b_fmt", 10, 3, "B type (f16 kind: 0 f16, 1 bf16)"),
    ("negate_a", 13, 1, "negate A"),
    ("negate_b", 14, 1, "negate B"),
    ("a_major", 15, 1, "A: 0 K-major, 1 MN-major (transposed)"),
    ("b_major", 16, 1, "B: 0 K-major, 1 MN-major (transposed)"),
    ("n_dim", 17, 6, "N >> 3"),
    ("m_dim", 24, 5, "M >> 4"),
    ("max_shift", 30, 2, "max shift (.ws only)"),
)
_RESERVED_IDESC_BITS = (6, 23, 29)

AB_FORMATS = {"f16": 0, "bf16": 1}
D_FORMATS = {"f16": 0, "f32": 1}
MAJORS = {"K": 0, "MN": 1}


def valid_mma_shape(m: int, n: int, cta_group: int = 1) -> bool:
    """Dense ``kind::f16`` shapes (PTX ISA, tcgen05 matrix shapes table).

    ``cta_group::1``: M in {64, 128}, N = 8..256 in steps of 8.
    ``cta_group::2``: M in {128, 256}, N = 16..256 in steps of 16 (the pair's
    whole N; each CTA holds N/2 rows of B).
    """
    if cta_group == 1:
        return m in (64, 128) and 8 <= n <= 256 and n % 8 == 0
    if cta_group == 2:
        return m in (128, 256) and 16 <= n <= 256 and n % 16 == 0
    raise ValueError(f"cta_group must be 1 or 2; got {cta_group!r}")


def check_mma_shape(m, n, cta_group: int = 1) -> None:
    """Raise ``ValueError`` naming the rule when (M, N) is not a ``kind::f16`` shape."""
    check_choice("cta_group", cta_group, (1, 2))
    check_int("m", m)
    check_int("n", n)
    if valid_mma_shape(m, n, cta_group):
        return
    rule = ("M in {64, 128} and N = 8..256 in steps of 8" if cta_group == 1
            else "M in {128, 256} and N = 16..256 in steps of 16")
    raise ValueError(f"tcgen05.mma.cta_group::{cta_group}.kind::f16 needs {rule}; got M={m}, N={n}")


@dataclass(frozen=True)
class InstrDesc:
    """The 32-bit ``tcgen05.mma`` instruction descriptor for ``kind::f16``.

    ``InstrDesc(m=128, n=256).encode()`` is the constant a BF16 x BF16 -> F32,
    K-major x K-major, M=128, N=256 MMA passes as ``idesc``;
    ``InstrDesc.decode(value)`` reads one back. ``cta_group`` is not encoded
    (it is part of the opcode) but decides which M and N are valid.
    """

    m: int = 128
    n: int = 256
    a_dtype: str = "bf16"
    b_dtype: str = "bf16"
    d_dtype: str = "f32"
    a_major: str = "K"
    b_major: str = "K"
    negate_a: bool = False
    negate_b: bool = False
    saturate: bool = False
    sparse: bool = False
    sparse_id2: int = 0
    max_shift: int = 0
    cta_group: int = 1

    def __post_init__(self):
        check_mma_shape(self.m, self.n, self.cta_group)
        for name in ("m", "n", "cta_group"):  # stored as Python ints
            object.__setattr__(self, name, check_int(name, getattr(self, name)))
        for name in ("negate_a", "negate_b", "saturate", "sparse"):  # one bit each: a bool, not any number
            object.__setattr__(self, name, check_choice(name, getattr(self, name), (False, True)))
        check_choice("a_dtype", self.a_dtype, tuple(AB_FORMATS))
        check_choice("b_dtype", self.b_dtype, tuple(AB_FORMATS))
        check_choice("d_dtype", self.d_dtype, tuple(D_FORMATS))
        if self.a_dtype != self.b_dtype:
            raise ValueError(f"kind::f16 needs a_dtype == b_dtype; got {self.a_dtype} and {self.b_dtype}")
        if self.a_dtype == "bf16" and self.d_dtype != "f32":
            raise ValueError("bf16 inputs accumulate in f32 only; got d_dtype='f16'")
        check_choice("a_major", self.a_major, tuple(MAJORS))
        check_choice("b_major", self.b_major, tuple(MAJORS))
        object.__setattr__(self, "sparse_id2", check_int("sparse_id2", self.sparse_id2, lo=0, hi=3))
        object.__setattr__(self, "max_shift", check_int("max_shift", self.max_shift, lo=0, hi=3))

    def field_values(self) -> dict[str, int]:
        """The raw value of every field of :data:`INSTR_DESC_FIELDS`."""
        return {
            "sparse_id2": self.sparse_id2,
            "sparse": int(self.sparse),
            "saturate": int(self.saturate),
            "d_fmt": D_FORMATS[self.d_dtype],
            "a_fmt": AB_FORMATS[self.a_dtype],
            "b_fmt": AB_FORMATS[self.b_dtype],
            "negate_a": int(self.negate_a),
            "negate_b": int(self.negate_b),
            "a_major": MAJORS[self.a_major],
            "b_major": MAJORS[self.b_major],
            "n_dim": self.n >> 3,
            "m_dim": self.m >> 4,
            "max_shift": self.max_shift,
        }

    def encode(self) -> int:
        values = self.field_values()
        out = 0
        for name, lo, width, _ in INSTR_DESC_FIELDS:
            v = values[name]
            assert 0 <= v < (1 << width), (name, v)
            out |= v << lo
        return out

    @classmethod
    def decode(cls, value: int, cta_group: int = 1) -> "InstrDesc":
        """The descriptor ``value`` holds; ``ValueError`` for reserved bits or unknown codes."""
        check_int("value", value, lo=0, hi=0xFFFFFFFF)
        for bit in _RESERVED_IDESC_BITS:
            if value >> bit & 1:
                raise ValueError(f"instruction descriptor {value:#010x} sets reserved bit {bit}")
        f = {name: value >> lo & ((1 << width) - 1) for name, lo, width, _ in INSTR_DESC_FIELDS}

        def name_of(table, code, what):
            for k, v in table.items():
                if v == code:
                    return k
            raise ValueError(f"instruction descriptor {value:#010x}: unknown {what} code {code}")

        return cls(
            m=f["m_dim"] << 4, n=f["n_dim"] << 3,
            a_dtype=name_of(AB_FORMATS, f["a_fmt"], "A type"), b_dtype=name_of(AB_FORMATS, f["b_fmt"], "B type"),
            d_dtype=name_of(D_FORMATS, f["d_fmt"], "D type"),
            a_major=name_of(MAJORS, f["a_major"], "A major"), b_major=name_of(MAJORS, f["b_major"], "B major"),
            negate_a=bool(f["negate_a"]), negate_b=bool(f["negate_b"]), saturate=bool(f["saturate"]),
            sparse=bool(f["sparse"]), sparse_id2=f["sparse_id2"], max_shift=f["max_shift"], cta_group=cta_group,
        )

    def table(self) -> str:
        """The fields as a fixed-width text table (bits, raw value, meaning)."""
        values = self.field_values()
        lines = [f"{'bits':>6}  {'field':<10} {'value':>5}  meaning"]
        for name, lo, width, meaning in INSTR_DESC_FIELDS:
            bits = f"{lo}" if width == 1 else f"{lo}-{lo + width - 1}"
            lines.append(f"{bits:>6}  {name:<10} {values[name]:>5}  {meaning}")
        return "\n".join(lines)


# --------------------------------------------------------------------------------------
# The shared-memory descriptor (SM100 format)
# --------------------------------------------------------------------------------------

#: (name, lowest bit, width, meaning): the 64-bit tcgen05 shared-memory descriptor.
SMEM_DESC_FIELDS = (
    ("start_addr", 0, 14, "start address >> 4 (18-bit shared address)"),
    ("lbo", 16, 14, "leading-dimension byte offset >> 4"),
    ("sbo", 32, 14, "stride-dimension byte offset >> 4"),
    ("version", 46, 3, "fixed constant 0b001 (SM100)"),
    ("base_offset", 49, 3, "matrix base offset (0 if atoms 1024-B aligned)"),
    ("lbo_mode", 52, 1, "LBO mode: 0 relative offset, 1 absolute address"),
    ("swizzle", 61, 3, "layout: 0 none, 1 128B/32B-atom, 2 128B, 4 64B, 6 32B"),
)
SWIZZLE_CODES = {"none": 0, "128B_base32B": 1, "128B": 2, "64B": 4, "32B": 6}
#: wgmma's 2-bit swizzle codes at bits 62-63 (chapter 06, :data:`gemmlab.wgmma.SWIZZLE_CODES`).
SM90_SWIZZLE_CODES = {"none": 0, "128B": 1, "64B": 2, "32B": 3}


def sm90_swizzle_as_sm100(sm90_code: int) -> int:
    """The SM100 code (bits 61-63) whose bits equal Hopper's ``sm90_code`` at bits 62-63: twice it.

    The field grew downwards by one bit, so a Hopper swizzle pattern keeps its meaning:
    128B (1) -> 2, 64B (2) -> 4, 32B (3) -> 6. What a Hopper descriptor lacks on SM100 is
    the version (bits 46-48 = 1), not a swizzle code.
    """
    check_choice("sm90_code", sm90_code, tuple(SM90_SWIZZLE_CODES.values()))
    return sm90_code << 1
SMEM_DESC_VERSION = 1
_SMEM_FIELD_BITS = sum(((1 << w) - 1) << lo for _, lo, w, _ in SMEM_DESC_FIELDS)


@dataclass(frozen=True)
class SmemDesc:
    """A decoded SM100 shared-memory descriptor; byte quantities are in bytes (not >> 4)."""

    start_addr: int
    lbo: int
    sbo: int
    swizzle: str = "128B"
    base_offset: int = 0
    lbo_mode: int = 0
    version: int = SMEM_DESC_VERSION

    def __post_init__(self):
        # Stored as Python ints: numpy ints overflow when shifted into the upper bits of the descriptor.
        for name in ("start_addr", "lbo", "sbo"):
            object.__setattr__(self, name, check_int(name, getattr(self, name), lo=0, hi=(1 << 18) - 16,
                                                     multiple_of=16))
        check_choice("swizzle", self.swizzle, tuple(SWIZZLE_CODES))
        object.__setattr__(self, "base_offset", check_int("base_offset", self.base_offset, lo=0, hi=7))
        object.__setattr__(self, "lbo_mode", check_choice("lbo_mode", self.lbo_mode, (0, 1)))
        object.__setattr__(self, "version", check_int("version", self.version))
        if self.version != SMEM_DESC_VERSION:
            raise ValueError(f"bits 46-48 must hold {SMEM_DESC_VERSION} (0b001) on SM100; got {self.version}")

    def field_values(self) -> dict[str, int]:
        return {
            "start_addr": self.start_addr >> 4, "lbo": self.lbo >> 4, "sbo": self.sbo >> 4,
            "version": self.version, "base_offset": self.base_offset, "lbo_mode": self.lbo_mode,
            "swizzle": SWIZZLE_CODES[self.swizzle],
        }

    def encode(self) -> int:
        values = self.field_values()
        out = 0
        for name, lo, _, _ in SMEM_DESC_FIELDS:
            out |= values[name] << lo
        return out

    @classmethod
    def decode(cls, value: int) -> "SmemDesc":
        check_int("value", value, lo=0, hi=(1 << 64) - 1)
        if value & ~_SMEM_FIELD_BITS:
            raise ValueError(f"shared-memory descriptor {value:#018x} sets reserved bits {value & ~_SMEM_FIELD_BITS:#x}")
        f = {name: value >> lo & ((1 << w) - 1) for name, lo, w, _ in SMEM_DESC_FIELDS}
        names = {v: k for k, v in SWIZZLE_CODES.items()}
        if f["swizzle"] not in names:
            raise ValueError(f"shared-memory descriptor {value:#018x}: unknown swizzle code {f['swizzle']}")
        return cls(start_addr=f["start_addr"] << 4, lbo=f["lbo"] << 4, sbo=f["sbo"] << 4,
                   swizzle=names[f["swizzle"]], base_offset=f["base_offset"], lbo_mode=f["lbo_mode"],
                   version=f["version"])


#: K-major, 128-byte swizzle: 8 rows of 128 bytes form one 1024-byte atom.
SW128_ROW_BYTES = 128
SW128_ATOM_BYTES = 1024


def smem_desc_kmajor_sw128(start_addr: int, sbo: int = SW128_ATOM_BYTES, lbo: int = 16) -> int:
    """The 64-bit descriptor of a K-major, 128B-swizzled operand starting at shared address ``start_addr``.

    ``sbo`` is the byte distance between consecutive groups of 8 rows (one
    swizzle atom: 1024 when rows are packed). ``lbo`` is not used by K-major
    swizzled layouts (the K extent of one MMA, 32 bytes, never leaves the
    atom's 128-byte row); the DSL writes 16 (field value 1), and so do we,
    so that our constants equal the DSL's bit for bit. ``start_addr`` may
    point inside an atom (K steps add 32, 64, 96 bytes); the atom itself
    must be 1024-byte aligned, which keeps the base offset 0.
    """
    return SmemDesc(start_addr=start_addr, lbo=lbo, sbo=sbo, swizzle="128B").encode()


def decode_smem_desc(value: int) -> SmemDesc:
    """:meth:`SmemDesc.decode`, by its chapter-10 name."""
    return SmemDesc.decode(value)


def sw128_kmajor_offset(row: int, k: int, rows: int, elem_bytes: int = 2) -> int:
    """Byte offset of element (``row``, ``k``) in a K-major, 128B-swizzled ``rows x K`` operand.

    K is cut into panels of 128 bytes (64 16-bit elements); panel ``p`` holds
    ``rows`` rows of 128 bytes, packed (``p * rows * 128``). Inside a row the
    eight 16-byte chunks are permuted: chunk ``c`` is stored at ``c ^ (row % 8)``.
    That is the address-bit swizzle ``bits[4:7] ^= bits[7:10]`` of a
    1024-byte aligned buffer, the one TMA's ``SWIZZLE_128B`` writes.
    """
    check_choice("elem_bytes", elem_bytes, (1, 2, 4))
    check_int("rows", rows, lo=8, multiple_of=8)
    check_int("row", row, lo=0, hi=rows - 1)
    check_int("k", k, lo=0)
    per_row = SW128_ROW_BYTES // elem_bytes
    panel, kk = divmod(k, per_row)
    byte = kk * elem_bytes
    chunk, within = divmod(byte, 16)
    return panel * rows * SW128_ROW_BYTES + row * SW128_ROW_BYTES + ((chunk ^ (row % 8)) * 16) + within


def kmajor_sw128_desc_sequence(start_addr: int, rows: int, k: int, mma_k: int = 16, elem_bytes: int = 2) -> list[int]:
    """The descriptor of each K step (``mma_k`` elements) of a ``rows x k`` K-major SW128 operand.

    Step ``s`` starts at panel ``s // steps_per_panel``, plus ``32 * (s % 4)``
    bytes inside the atom row for 16-bit types with K=16.
    """
    check_int("k", k, lo=mma_k, multiple_of=mma_k)
    step_bytes = mma_k * elem_bytes
    per_panel = SW128_ROW_BYTES // step_bytes
    out = []
    for s in range(k // mma_k):
        panel, inner = divmod(s, per_panel)
        out.append(smem_desc_kmajor_sw128(start_addr + panel * rows * SW128_ROW_BYTES + inner * step_bytes))
    return out


def draw_bitfields(fields, values: dict, total_bits: int, title: str, name: str):
    """A bit-field diagram: one box per field, bit numbers above, value below.

    ``fields`` are ``(name, lo, width, meaning)`` rows; bits outside every field
    are drawn grey (reserved). Returns ``(path, data)`` with ``data`` the list
    of ``(name, lo, width, value)`` drawn, most significant field first.
    """
    from matplotlib.patches import Rectangle

    from .figures import new_figure, save

    rows = 1 if total_bits <= 32 else 2
    per_row = 32
    fig, axes = new_figure(rows, 1, figsize=(15, 2.3 * rows))
    axes = np.atleast_1d(axes)
    palette = ["#8FB9E3", "#F2B880", "#9ED39E", "#E3A0C8", "#F5E08A", "#B9A6E3", "#9FD8D8"]
    owner = {}
    for i, (fname, lo, width, _) in enumerate(fields):
        for b in range(lo, lo + width):
            owner[b] = i
    data = []
    for r in range(rows):
        ax = axes[r]
        hi_bit = total_bits - 1 - r * per_row
        for b in range(hi_bit, hi_bit - per_row, -1):
            x = hi_bit - b
            i = owner.get(b)
            ax.add_patch(Rectangle((x, 0), 1, 1, facecolor="#DDDDDD" if i is None else palette[i % len(palette)],
                                   edgecolor="white", lw=0.5))
            ax.text(x + 0.5, 1.15, str(b), ha="center", va="bottom", fontsize=6)
            if i is not None:
                fname, lo, width, _ = fields[i]
                ax.text(x + 0.5, 0.5, str(values[fname] >> (b - lo) & 1), ha="center", va="center", fontsize=8)
        for i, (fname, lo, width, _) in enumerate(fields):
            top, bottom = min(lo + width - 1, hi_bit), max(lo, hi_bit - per_row + 1)
            if top < bottom:
                continue
            x0 = hi_bit - top
            ax.add_patch(Rectangle((x0, 0), top - bottom + 1, 1, fill=False, edgecolor="black", lw=1.0))
            # narrow neighbours alternate between two label rows so their names do not collide
            y = -0.2 - (0.65 if width == 1 and i % 2 else 0)
            ax.text(x0 + (top - bottom + 1) / 2, y, f"{fname}\n= {values[fname]}", ha="center", va="top",
                    fontsize=7 if width > 2 else 6)
        ax.set_xlim(-0.2, per_row + 0.2)
        ax.set_ylim(-1.8, 1.6)
        ax.axis("off")
    for fname, lo, width, _ in sorted(fields, key=lambda f: -f[1]):
        data.append((fname, lo, width, values[fname]))
    axes[0].set_title(title, fontsize=10)
    return save(fig, name), data


def draw_instr_desc(desc: InstrDesc | None = None, name: str = "09_instr_desc"):
    """:func:`draw_bitfields` of an :class:`InstrDesc` (default: BF16, M=128, N=256)."""
    desc = desc or InstrDesc()
    title = (f"instruction descriptor {desc.encode():#010x} = {desc.encode()}: "
             f"{desc.a_dtype} x {desc.b_dtype} -> {desc.d_dtype}, M={desc.m}, N={desc.n}, "
             f"A {desc.a_major}-major, B {desc.b_major}-major")
    return draw_bitfields(INSTR_DESC_FIELDS, desc.field_values(), 32, title, name)


def draw_smem_desc(value: int | None = None, name: str = "09_smem_desc"):
    """:func:`draw_bitfields` of a shared-memory descriptor (default: K-major SW128 at 0x400)."""
    value = smem_desc_kmajor_sw128(0x400) if value is None else value
    d = SmemDesc.decode(value)
    title = (f"shared-memory descriptor {value:#018x}: start {d.start_addr:#x}, SBO {d.sbo}, LBO {d.lbo}, "
             f"swizzle {d.swizzle}")
    return draw_bitfields(SMEM_DESC_FIELDS, d.field_values(), 64, title, name)


def draw_sw128_atom(name: str = "09_sw128_atom"):
    """One 1024-byte K-major SW128 atom of bf16: which 16-byte chunk (8 elements of K) sits where.

    Returns ``(path, grid)``; ``grid[row, slot]`` is the logical chunk stored
    in physical slot ``slot`` of row ``row`` (from :func:`sw128_kmajor_offset`).
    """
    from .figures import new_figure, save

    grid = np.zeros((8, 8), dtype=np.int64)
    for row in range(8):
        for chunk in range(8):
            slot = (sw128_kmajor_offset(row, chunk * 8, 8) % SW128_ROW_BYTES) // 16
            grid[row, slot] = chunk
    fig, ax = new_figure(figsize=(7.5, 4.2))
    ax.imshow(grid, cmap="tab10", vmin=0, vmax=9)
    for row in range(8):
        for slot in range(8):
            c = grid[row, slot]
            ax.text(slot, row, f"k {8 * c}-{8 * c + 7}", ha="center", va="center", fontsize=7)
    ax.set_xticks(range(8))
    ax.set_xticklabels([f"bytes\n{16 * s}-{16 * s + 15}" for s in range(8)], fontsize=7)
    ax.set_yticks(range(8))
    ax.set_yticklabels([f"row {r}" for r in range(8)], fontsize=8)
    ax.set_title("K-major SW128 atom (bf16): chunk c of row r is stored in slot c ^ (r % 8)", fontsize=9)
    return save(fig, name), grid


# --------------------------------------------------------------------------------------
# One wrapper per PTX instruction
# --------------------------------------------------------------------------------------


def tcgen05_mma_f16(d_tmem, a_desc, b_desc, idesc, accumulate, cta_group: int = 1):
    """``tcgen05.mma.cta_group::{1,2}.kind::f16 [d_tmem], a_desc, b_desc, idesc, enable_input_d``.

    Issued by **one thread** (with ``cta_group=2``: one thread of the leader
    CTA). ``accumulate`` (``Int32``, 0 or 1) is the predicate
    ``enable_input_d``: 0 for the first K step (D = A B), 1 after (D += A B).
    Asynchronous: completion is observed only through :func:`tcgen05_commit`.
    """
    check_choice("cta_group", cta_group, (1, 2))
    cute.arch.inline_ptx(
        "{ .reg .pred acc; "
        "setp.ne.b32 acc, {$r4}, 0; "
        f"tcgen05.mma.cta_group::{cta_group}.kind::f16 [{{$r0}}], {{$r1}}, {{$r2}}, {{$r3}}, acc; }}",
        read_only_args=[Int32(d_tmem), Int64(a_desc), Int64(b_desc), Int32(idesc), Int32(accumulate)],
    )


def tcgen05_commit(bar, cta_group: int = 1):
    """``tcgen05.commit...mbarrier::arrive::one``: one arrival on ``bar`` once this thread's MMAs finish.

    Tracks the completion of *all* prior asynchronous tcgen05 operations of
    this thread (``tcgen05.mma``, ``tcgen05.cp``, ``tcgen05.shift``), not only
    those since its previous commit (PTX ISA, ``tcgen05.commit``), so the
    thread that issued the MMAs commits. It also acts as ``tcgen05.fence::before_thread_sync``: whoever
    waits on ``bar`` then needs only ``tcgen05.fence::after_thread_sync``.
    """
    check_choice("cta_group", cta_group, (1, 2))
    cute.arch.inline_ptx(
        f"tcgen05.commit.cta_group::{cta_group}.mbarrier::arrive::one.shared::cluster.b64 [{{$r0}}];",
        read_only_args=[bar],
    )


def tcgen05_commit_multicast(bar, cta_mask, cta_group: int = 2):
    """``tcgen05.commit...multicast::cluster``: arrive on ``bar`` in every CTA whose bit is set in ``cta_mask``.

    ``bar`` is a CTA-relative shared address, the same offset in each target
    CTA. The leader of a CTA pair commits with mask ``0b11 << pair_base``
    so the peer learns, from its own barrier, that its half of D is ready.
    """
    check_choice("cta_group", cta_group, (1, 2))
    cute.arch.inline_ptx(
        "{ .reg .b16 mask; "
        "cvt.u16.u32 mask, {$r1}; "
        f"tcgen05.commit.cta_group::{cta_group}.mbarrier::arrive::one.shared::cluster.multicast::cluster.b64 "
        "[{$r0}], mask; }",
        read_only_args=[bar, Int32(cta_mask)],
    )


#: Our wrapper -> the DSL operation chapter 10 calls instead.
DSL_EQUIVALENTS = {
    "tcgen05_mma_f16": "cute.gemm(tiled_mma, tCtAcc, tCrA, tCrB, tCtAcc) with tcgen05.MmaF16BF16Op",
    "tcgen05_commit": "tcgen05.commit(bar, None, CtaGroup.ONE)   (inside cute.arch.elect_one())",
    "tcgen05_commit_multicast": "tcgen05.commit(bar, mask, CtaGroup.TWO)",
}


# --------------------------------------------------------------------------------------
# One tile, every step written out: 128 x N x K (cta_group::1) or 256 x N x K (cta_group::2)
# --------------------------------------------------------------------------------------

TILE_THREADS = 128  # one warpgroup: warp w reads TMEM lanes 32(w % 4)..+31, here 32w..32w+31
#: Bytes of A and B the one-tile teaching kernel may stage per CTA: a deliberately round budget for
#: this single-stage kernel, not the hardware limit (that is :data:`gemmlab.hardware.SMEM_PER_BLOCK`,
#: 227 KiB). What it leaves below the limit covers the operands' 1024-byte alignment, the mbarrier and
#: the slot ``tcgen05.alloc`` writes the TMEM address to.
TILE_SMEM_BUDGET = 192 * 1024
assert TILE_SMEM_BUDGET < SMEM_PER_BLOCK


def tile_shapes(n: int, k: int, cta_group: int):
    """(M of the MMA, rows of A per CTA, rows of B per CTA) for a tile; validates N and K."""
    check_choice("cta_group", cta_group, (1, 2))
    check_int("n", n, lo=16, hi=256, multiple_of=16)
    check_int("k", k, lo=64, hi=512, multiple_of=64)
    m = 128 * cta_group
    check_mma_shape(m, n, cta_group)
    b_rows = n // cta_group
    if b_rows % 8:
        raise ValueError(f"each CTA holds N/{cta_group} = {b_rows} rows of B; it must be a multiple of 8")
    smem = (128 + b_rows) * k * 2
    if smem > TILE_SMEM_BUDGET:
        raise ValueError(f"A and B tiles need {smem} bytes of shared memory per CTA; this teaching tile's budget "
                         f"is TILE_SMEM_BUDGET = {TILE_SMEM_BUDGET} bytes (lower k or n)")
    return m, 128, b_rows


@cute.jit
def fill_sw128(dst: cute.Tensor, src: cute.Tensor, row0, rows: cutlass.Constexpr, k: cutlass.Constexpr, tidx):
    """Copy rows ``row0 .. row0+rows`` of ``src`` (row-major, K contiguous) into ``dst`` in SW128 order.

    Plain element stores by all 128 threads, placed by the same arithmetic as
    :func:`sw128_kmajor_offset` (in elements). A TMA load with
    ``SWIZZLE_128B`` (chapter 04) writes the same bytes; this chapter keeps
    the copy visible.
    """
    for it in cutlass.range(rows * k // TILE_THREADS, unroll=8):
        i = it * TILE_THREADS + tidx
        r = i // k
        kk = i % k
        panel = kk // 64
        col = kk % 64
        chunk = (col // 8) ^ (r % 8)
        dst[panel * rows * 64 + r * 64 + chunk * 8 + col % 8] = src[row0 + r, kk]


@cute.jit
def tcgen05_thread_sync(cta_group: cutlass.Constexpr):
    """Fence, sync every thread of the CTA (or of the CTA pair), fence.

    The tcgen05 fences around a thread sync order tensor-memory work (alloc,
    MMA, ld) of one thread before, and of another thread after, the sync that
    connects them; a pair syncs through the cluster barrier.
    """
    tcgen05_fence_before_thread_sync()
    if cutlass.const_expr(cta_group == 2):
        cute.arch.cluster_arrive()
        cute.arch.cluster_wait()
    else:
        cute.arch.barrier()
    tcgen05_fence_after_thread_sync()


@cute.kernel
def mma_tile_kernel(a: cute.Tensor, b: cute.Tensor, regs: cute.Tensor, n: cutlass.Constexpr,
                    k: cutlass.Constexpr, num: cutlass.Constexpr, cta_group: cutlass.Constexpr):
    """D = A @ B^T for one tile; every thread stores its raw ``tcgen05.ld`` registers.

    ``regs[128*cta + tid, c*num + j]`` = register ``j`` of thread ``tid`` of CTA
    ``cta`` after the ``c``-th ``32x32b.x{num}`` load: *where* that value
    belongs in D is the model's business (:func:`registers_to_tile`).
    With ``cta_group=2`` two CTAs of a cluster compute a 256-row tile.
    """
    m, a_rows, b_rows = 128 * cta_group, 128, n // cta_group
    ncols = alloc_columns_for(n)
    idesc = InstrDesc(m=m, n=n, cta_group=cta_group).encode()
    # Everything but the start address is a compile-time constant.
    desc_hi = smem_desc_kmajor_sw128(0)

    smem = cutlass.memory.SmemAllocator()
    sA = smem.allocate_tensor(BFloat16, cute.make_layout(a_rows * k), byte_alignment=1024)
    sB = smem.allocate_tensor(BFloat16, cute.make_layout(b_rows * k), byte_alignment=1024)
    bar = smem.allocate_array(Int64, 1)
    holder = smem.allocate_array(Int32, 1)
    held = cute.make_tensor(holder, cute.make_layout(1))

    tidx, _, _ = cute.arch.thread_idx()
    warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
    cta = Int32(0)
    if cutlass.const_expr(cta_group == 2):
        cta = cute.arch.make_warp_uniform(cute.arch.block_idx_in_cluster())

    # 1. The barrier, then a sync of the CTA (of the pair: the cluster barrier), so both CTAs are
    #    running and set up before the pair's collective tcgen05.alloc.cta_group::2.
    if tidx == 0:
        cute.arch.mbarrier_init(bar, 1)
        cute.arch.mbarrier_init_fence()
    if cutlass.const_expr(cta_group == 2):
        cute.arch.cluster_arrive()
        cute.arch.cluster_wait()
    else:
        cute.arch.barrier()

    # 2. Tensor memory: warp 0 allocates (in both CTAs of a pair, together). Operands into shared
    #    memory, swizzled; this CTA's rows of A and its half of B.
    if warp == 0:
        tmem_alloc(holder, ncols, cta_group)
    fill_sw128(sA, a, cta * a_rows, a_rows, k, tidx)
    fill_sw128(sB, b, cta * b_rows, b_rows, k, tidx)
    # Generic-proxy stores must be made visible to the tensor core (async proxy).
    cute.arch.fence_proxy("async.shared", space="cta")

    # 3. Publish the TMEM address and the operands: fence, sync, fence.
    tcgen05_thread_sync(cta_group)
    taddr = held[0]

    # 4. One thread (of the leader CTA) issues K/16 MMAs and commits.
    if tidx + cta == 0:
        a_addr = sA.iterator.toint()
        b_addr = sB.iterator.toint()
        for s in cutlass.range_constexpr(k // 16):
            # K step s: panel s // 4, then 32 bytes per step inside the 128-byte row.
            a_off = (s // 4) * a_rows * 128 + (s % 4) * 32
            b_off = (s // 4) * b_rows * 128 + (s % 4) * 32
            a_desc = Int64(desc_hi) | Int64(((a_addr + a_off) >> 4) & 0x3FFF)
            b_desc = Int64(desc_hi) | Int64(((b_addr + b_off) >> 4) & 0x3FFF)
            tcgen05_mma_f16(taddr, a_desc, b_desc, idesc, 0 if s == 0 else 1, cta_group)
        if cutlass.const_expr(cta_group == 2):
            tcgen05_commit_multicast(bar, 0b11, cta_group)
        else:
            tcgen05_commit(bar, cta_group)

    # 5. Wait for the accumulator; the commit fenced the MMAs, we fence after the wait.
    cute.arch.mbarrier_wait(bar, 0)
    tcgen05_fence_after_thread_sync()

    # 6. Epilogue: warp w reads lanes 32(w % 4)..+31 (here w < 4), num columns per load.
    lane_base = (warp % 4) * 32
    row = cta * 128 + tidx
    # Unrolled in Python (vals is a tuple of registers: only a compile-time index can pick one), in chunks of
    # 32 so that no single static loop has the 64+ iterations the DSL warns about; the instructions are the same.
    for c0 in cutlass.range_constexpr(0, n // num, 32):
        for c in cutlass.range_constexpr(c0, min(c0 + 32, n // num)):
            vals = tmem_ld_32x32b(taddr + (lane_base << 16) + c * num, num)
            tmem_wait_ld()
            for j0 in cutlass.range_constexpr(0, num, 32):
                for j in cutlass.range_constexpr(j0, min(j0 + 32, num)):
                    regs[row, c * num + j] = vals[j]

    # 7. Free the columns once every warp (of both CTAs) is done reading them: give up the
    #    allocation permit, then dealloc (with cta_group::2, both CTAs' warp 0 together).
    tcgen05_thread_sync(cta_group)
    if warp == 0:
        tmem_relinquish_alloc_permit(cta_group)
        tmem_dealloc(taddr, ncols, cta_group)


@functools.lru_cache(maxsize=None)
def tile_host(n: int, k: int, num: int, cta_group: int = 1):
    """The ``@cute.jit`` host function of one tile (``a``, ``b``, ``regs``, stream): what :func:`run_mma_tile`
    launches on a B200, and what chapter 09 runs on the emulator (``gemmlab.emulator.run.emulate``)."""
    return _tile_host(n, k, num, cta_group)


def _tile_host(n: int, k: int, num: int, cta_group: int):
    @cute.jit
    def tile_host(a: cute.Tensor, b: cute.Tensor, regs: cute.Tensor, stream: cuda.CUstream):
        mma_tile_kernel(a, b, regs, n, k, num, cta_group).launch(
            grid=(cta_group, 1, 1), block=(TILE_THREADS, 1, 1), cluster=(cta_group, 1, 1), stream=stream)

    return tile_host


def _check_num(n: int, num: int) -> int:
    check_choice("num", num, LD_32X32B_NUMS)
    if n % num:
        raise ValueError(f"num must divide n (each load reads num columns); got num={num}, n={n}")
    return num


def compile_mma_tile(target: str = "sm_100a", n: int = 64, k: int = 64, num: int = 32, cta_group: int = 1):
    """Compile :func:`mma_tile_kernel` for ``target`` without a GPU (read ``.__ptx__``)."""
    check_target(target)
    m, _, _ = tile_shapes(n, k, cta_group)
    _check_num(n, num)
    args = (fake_tensor(BFloat16, (m, k), stride_order=(1, 0)), fake_tensor(BFloat16, (n, k), stride_order=(1, 0)),
            fake_tensor(Float32, (m, n), stride_order=(1, 0)))
    return compile_for(target, _tile_host(n, k, num, cta_group), *args, fake_stream())


def run_mma_tile(a, b, num: int = 32, cta_group: int = 1):
    """Launch one tile: ``a`` (M, K) and ``b`` (N, K) bf16, K contiguous (M = 128 * cta_group).

    Returns ``(d, regs)``: ``d`` (M, N) fp32 = A @ B^T placed by the model,
    ``regs`` the raw registers each thread received (see :func:`mma_tile_kernel`).
    """
    import torch

    check_choice("cta_group", cta_group, (1, 2))
    # Shapes first (device=None), so bad input fails the same way on every machine.
    check_tensor("a", a, dtypes=(torch.bfloat16,), ndim=2, device=None)
    check_tensor("b", b, dtypes=(torch.bfloat16,), ndim=2, device=None)
    m, kk = a.shape
    n, kb = b.shape
    if m != 128 * cta_group:
        raise ValueError(f"a must have {128 * cta_group} rows for cta_group={cta_group}; got {m}")
    if kb != kk:
        raise ValueError(f"a and b must share K; got {kk} and {kb}")
    tile_shapes(n, kk, cta_group)
    _check_num(n, num)
    require_tier("sm100", "gemmlab.tcgen05.run_mma_tile")
    check_tensor("a", a, device="cuda")
    check_tensor("b", b, device="cuda")

    regs = torch.full((m, n), float("nan"), dtype=torch.float32, device="cuda")  # poisoned
    launcher(_tile_host(n, kk, num, cta_group), a, b, regs)()
    torch.cuda.synchronize()
    d = torch.cat([registers_to_tile(regs[128 * c:128 * (c + 1)], num) for c in range(cta_group)])
    return d, regs


def ld_probe_operands(m: int = 128, n: int = 64, k: int = 64, device: str = "cpu"):
    """A, B whose product is ``D[i, j] = 256 * i + j`` exactly (bf16 inputs, fp32 sums).

    ``A[i, :3] = (i % 128, 1, i // 128)`` and ``B[j, :3] = (256, j, 32768)``,
    zeros elsewhere: ``D[i, j] = 256 (i % 128) + j + 32768 (i // 128)``.
    Every input is exact in bf16 (integers below 256, or powers of two) and
    every sum an integer below 2^24, so each TMEM cell names its own
    (row, column).
    """
    import torch

    a = torch.zeros(m, k, dtype=torch.float32)
    b = torch.zeros(n, k, dtype=torch.float32)
    rows = torch.arange(m)
    a[:, 0] = rows % 128
    a[:, 1] = 1
    a[:, 2] = rows // 128
    b[:, 0] = 256
    b[:, 1] = torch.arange(n)
    b[:, 2] = 128 * 256
    return a.to(torch.bfloat16).to(device), b.to(torch.bfloat16).to(device)


def expected_probe_registers(n: int, num: int, cta_group: int = 1) -> np.ndarray:
    """What each thread's registers must hold after the probe (model only): ``256 * row + col``."""
    out = np.zeros((128 * cta_group, n), dtype=np.int64)
    for cta in range(cta_group):
        for w in range(4):
            for c in range(n // num):
                coords = accumulator_coords(w, num, c * num)
                for t in range(32):
                    rows = coords[t, :, 0] + 128 * cta
                    out[128 * cta + 32 * w + t, c * num:(c + 1) * num] = 256 * rows + coords[t, :, 1]
    return out


# --------------------------------------------------------------------------------------
# The DSL's own tcgen05 MMA, compiled: which constants does NVIDIA's compiler emit?
# --------------------------------------------------------------------------------------


def _dsl_tiled_mma(m: int, n: int, cta_group: int):
    from cutlass.cute.nvgpu import OperandMajorMode, tcgen05 as t5

    op = t5.MmaF16BF16Op(BFloat16, Float32, (m, n, 16), t5.CtaGroup.ONE if cta_group == 1 else t5.CtaGroup.TWO,
                         t5.OperandSource.SMEM, OperandMajorMode.K, OperandMajorMode.K)
    return cute.make_tiled_mma(op)


@cute.kernel
def dsl_reference_kernel(out: cute.Tensor, a_layout: cute.ComposedLayout, b_layout: cute.ComposedLayout,
                         m: cutlass.Constexpr, n: cutlass.Constexpr, cta_group: cutlass.Constexpr):
    """A minimal tile with the DSL's ``MmaF16BF16Op`` / ``cute.gemm`` (compile-only reference).

    Shared-memory layouts come from ``blackwell_helpers.make_smem_layout_a/b``
    (K-major, 128B swizzle); no data is loaded: we only read the PTX.
    """
    from cutlass.cute.nvgpu import tcgen05 as t5

    tiled_mma = _dsl_tiled_mma(m, n, cta_group)
    two = cta_group == 2
    smem = cutlass.memory.SmemAllocator()
    holder = smem.allocate_array(Int32, 1)
    bar = smem.allocate_array(Int64, 1)
    sA = smem.allocate_tensor(BFloat16, a_layout.outer, byte_alignment=1024, swizzle=a_layout.inner)
    sB = smem.allocate_tensor(BFloat16, b_layout.outer, byte_alignment=1024, swizzle=b_layout.inner)
    warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
    if cutlass.const_expr(two):  # the pair's collective alloc comes after a cluster barrier
        cute.arch.cluster_arrive()
        cute.arch.cluster_wait()
    if warp == 0:
        cute.arch.alloc_tmem(alloc_columns_for(n), holder, is_two_cta=two)
    cute.arch.barrier()
    tptr = cute.arch.retrieve_tmem_ptr(Float32, 16, holder)
    tCrA = tiled_mma.make_fragment_A(sA)
    tCrB = tiled_mma.make_fragment_B(sB)
    acc = cute.make_tensor(tptr, tiled_mma.make_fragment_C(tiled_mma.partition_shape_C((m, n))).layout)
    if warp == 0:
        tiled_mma.set(t5.Field.ACCUMULATE, False)
        for kb in cutlass.range_constexpr(cute.size(tCrA, mode=[2])):
            cute.gemm(tiled_mma, acc, tCrA[None, None, kb, 0], tCrB[None, None, kb, 0], acc)
            tiled_mma.set(t5.Field.ACCUMULATE, True)
        with cute.arch.elect_one():
            if cutlass.const_expr(two):
                t5.commit(bar, 0b11, t5.CtaGroup.TWO)
            else:
                t5.commit(bar, None, t5.CtaGroup.ONE)
    cute.arch.mbarrier_wait(bar, 0)
    if cutlass.const_expr(two):
        cute.arch.cluster_arrive()
        cute.arch.cluster_wait()
    else:
        cute.arch.barrier()
    if warp == 0:
        cute.arch.relinquish_tmem_alloc_permit(is_two_cta=two)
        cute.arch.dealloc_tmem(tptr, alloc_columns_for(n), is_two_cta=two)


@functools.lru_cache(maxsize=None)
def _dsl_host(m: int, n: int, k: int, cta_group: int):
    import cutlass.utils.blackwell_helpers as sm100_utils

    @cute.jit
    def dsl_host(out: cute.Tensor, stream: cuda.CUstream):
        tiled_mma = _dsl_tiled_mma(m, n, cta_group)
        a_layout = sm100_utils.make_smem_layout_a(tiled_mma, (m, n, k), BFloat16, 1)
        b_layout = sm100_utils.make_smem_layout_b(tiled_mma, (m, n, k), BFloat16, 1)
        dsl_reference_kernel(out, a_layout, b_layout, m, n, cta_group).launch(
            grid=(cta_group, 1, 1), block=(128, 1, 1), cluster=(cta_group, 1, 1), stream=stream)

    return dsl_host


def compile_dsl_reference(target: str = "sm_100a", m: int = 128, n: int = 64, k: int = 64, cta_group: int = 1):
    """Compile :func:`dsl_reference_kernel` for ``target`` (sm_100a; no GPU needed)."""
    check_target(target)
    check_mma_shape(m, n, cta_group)
    check_int("k", k, lo=64, hi=256, multiple_of=64)
    return compile_for(target, _dsl_host(m, n, k, cta_group), fake_tensor(Int32, (128,)), fake_stream())


def dsl_mma_constants(compiled) -> dict:
    """The constants behind every ``tcgen05.mma`` in ``compiled``'s PTX.

    Returns ``{"opcodes": [...], "idesc": [int per MMA], "a_desc": [...],
    "b_desc": [...]}``. The descriptor entries are the immediates the
    compiler ORs/adds onto the shifted shared address (``start_addr`` field
    0 for the first step), i.e. :func:`kmajor_sw128_desc_sequence` with
    ``start_addr=0``. Registers are traced through ``mov``/``or``/``add``
    with an immediate operand.
    """
    consts: dict[str, int] = {}
    pattern = re.compile(r"^(mov\.b32|mov\.b64|or\.b64|add\.s64)\s+(%\w+),\s*(?:(%\w+),\s*)?(-?\d+);")
    out = {"opcodes": [], "idesc": [], "a_desc": [], "b_desc": []}
    for line in ptx_lines(compiled, r"."):
        mt = pattern.match(line)
        if mt:
            consts[mt.group(2)] = int(mt.group(4)) & ((1 << 64) - 1)
            continue
        if line.startswith("tcgen05.mma"):
            opcode, rest = line.split(None, 1)
            ops = [o.strip() for o in rest.split(",")]
            out["opcodes"].append(opcode)
            out["a_desc"].append(consts.get(ops[1]))
            out["b_desc"].append(consts.get(ops[2]))
            out["idesc"].append(consts.get(ops[3]))
    return out


def tcgen05_instructions(compiled) -> list[str]:
    """The ``tcgen05.*`` instruction names in a kernel's PTX, in order, once each.

    Also inside inline-asm ``{ ... }`` blocks, where our MMA and commit wrappers live.
    """
    return ptx_instructions(compiled, r"tcgen05\.[\w.:]+")


def cta_pair_split(n: int = 256, k: int = 64) -> dict:
    """Who holds what in an M=256 ``cta_group::2`` tile (the data behind the CTA-pair figure)."""
    tile_shapes(n, k, 2)
    return {
        cta: {
            "A rows": (128 * cta, 128 * cta + 128),
            "B rows (N)": (n // 2 * cta, n // 2 * cta + n // 2),
            "D rows in own TMEM": (128 * cta, 128 * cta + 128),
            "D columns": (0, n),
            "issues MMA": cta == 0,
        }
        for cta in (0, 1)
    }


def draw_cta_pair(n: int = 256, name: str = "09_cta_pair"):
    """The M=256 CTA-pair tile: A, B and D, coloured by the CTA whose memory holds each part."""
    from matplotlib.patches import Rectangle

    from .figures import new_figure, save

    split = cta_pair_split(n)
    colors = {0: "#8FB9E3", 1: "#F2B880"}
    fig, ax = new_figure(figsize=(10, 5))
    k_w = 64
    for cta, parts in split.items():
        r0, r1 = parts["A rows"]
        ax.add_patch(Rectangle((0, r0), k_w, r1 - r0, facecolor=colors[cta], edgecolor="black"))
        ax.text(k_w / 2, (r0 + r1) / 2, f"A rows\n{r0}-{r1 - 1}\nsmem of\nCTA {cta}", ha="center", va="center",
                fontsize=8)
        c0, c1 = parts["B rows (N)"]
        ax.add_patch(Rectangle((k_w + 40 + c0, -k_w - 20), c1 - c0, k_w, facecolor=colors[cta], edgecolor="black"))
        ax.text(k_w + 40 + (c0 + c1) / 2, -k_w / 2 - 20, f"B^T cols {c0}-{c1 - 1}\nsmem of CTA {cta}",
                ha="center", va="center", fontsize=8)
        d0, d1 = parts["D rows in own TMEM"]
        ax.add_patch(Rectangle((k_w + 40, d0), n, d1 - d0, facecolor=colors[cta], edgecolor="black", alpha=0.6))
        ax.text(k_w + 40 + n / 2, (d0 + d1) / 2,
                f"D rows {d0}-{d1 - 1}, all {n} columns\nTMEM of CTA {cta}"
                + ("\n(CTA 0, the leader, issues every MMA\nand multicasts the commit to both)" if cta == 0 else ""),
                ha="center", va="center", fontsize=8)
    ax.set_xlim(-5, k_w + 45 + n)
    ax.set_ylim(260, -k_w - 25)
    ax.set_aspect("equal")
    ax.axis("off")
    ax.set_title(f"tcgen05.mma.cta_group::2, M=256, N={n}: one instruction, two CTAs' memories", fontsize=10)
    return save(fig, name), split
