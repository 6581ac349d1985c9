"""Tensor maps (``CUtensorMap``) and the TMA unit's tile mode, in pure Python, for the emulator.

A tensor map is the 128-byte descriptor ``cp.async.bulk.tensor`` reads. NVIDIA calls it
opaque; this module gives its bit layout as far as it can be *read off tools that write it*,
and the copy semantics the PTX ISA defines, so the emulator can run the exact maps the
DSL's host code builds (:func:`gemmlab.emulator.host.capture_launches` returns their bytes).

Where each fact comes from
--------------------------
* **ptxas**: ``tensormap.replace`` on a ``.shared::cta`` map compiles (ptxas 13.0, sm_90a,
  sm_100a, sm_103a) to plain ``LDS`` / ``LOP3`` / ``STS`` on the 128 bytes, so the SASS
  (read with nvdisasm) gives the byte offset, shift and mask of every field the instruction
  can replace. This is NVIDIA's compiler encoding NVIDIA's format: the primary source below.
* **DSL**: maps built by ``cpasync.make_tiled_tma_atom`` (nvidia-cutlass-dsl 4.8.1), varied
  one parameter at a time and diffed; with dynamic shapes the host IR shows the arithmetic.
  The DSL zeroes bytes 0..63 and then writes its fields; **it never writes bytes 64..127**
  (they hold whatever was on the host stack), so no field lives there.
* **ISA**: the PTX ISA (tensor-map sections 5.5.x; ``tensormap.replace``, Table 33, whose
  ``new_val`` encodings are *not* the driver's enum values) and the CUDA driver API
  documentation of ``cuTensorMapEncodeTiled`` (value ranges and rules).
* **measured**: what an H200 did (stated where used). ``benchmarks/emulator_tma_check.py``
  re-measures every rule here on a GPU, including the ones marked *inferred*.

The layout (byte offsets into the map; bit numbers within the little-endian 32-bit word there)
----------------------------------------------------------------------------------------------
========  =======  ==========================================  ===========================
offset    bits     field                                       source
========  =======  ==========================================  ===========================
0x00      0..63    global address (16-byte aligned)            ptxas (STS.64); DSL
0x08      0..3     mode: 2 = tiled, 3 = im2col                 DSL (tiled / im2col atoms)
0x08      4..6     rank - 1                                    ptxas ``.rank``
0x08      7..10    element type code (see :data:`ELEMTYPES`)   ptxas ``.elemtype``
0x08      11..12   interleave: 0 none, 1 16B, 2 32B            ptxas ``.interleave_layout``
0x08      13..14   swizzle: 0 none, 1 32B, 2 64B, 3 128B       ptxas ``.swizzle_mode``
0x08      15       OOB fill: 0 zero, 1 NaN-request-zero-FMA    ptxas ``.fill_mode``
0x08      16       tf32 flag (with code 7 / 8)                 ptxas ``.elemtype`` 11, 12
0x08      17..18   L2 promotion (*inferred*; DSL writes 2)     DSL constant = CUTLASS's L2_128B
0x08      19..20   swizzle atomicity 0..3 (sm_100+)            ptxas ``.swizzle_atomicity``
0x08      21       DSL: tensor extent >= 128 KiB (see below)   DSL host IR
0x08      22       96B swizzle (sm_103a)                       ptxas ``.swizzle_mode`` 4
0x0c+4i   0..31    global stride i (of dim i+1) bits 4..35     ptxas ``.global_stride``
0x1c      4i..4i+3 global stride i bits 36..39                 ptxas ``.global_stride``
0x20+4i   0..31    global dim i - 1 (i = 0..4)                 ptxas ``.global_dim``
0x34      3i..3i+2 element stride i - 1 (i = 0..4)             ptxas ``.element_stride``
0x34      24..31   box dim 0 - 1                               ptxas ``.box_dim``
0x38      8i-8..   box dim i - 1 (i = 1..4)                    ptxas ``.box_dim``
0x3c      0..31    zero in tiled maps (the DSL's im2col maps   DSL
                   use it)
========  =======  ==========================================  ===========================

Every other bit of bytes 0..63 is zero in every map the DSL writes; :func:`decode` rejects a
map with any of them set (it names them) rather than guess a meaning. Entries beyond the rank
are written as zero by the DSL (dim 1, box 1, element stride 1, stride 0) and ignored on decode.
The bit-21 flag: the DSL's host code sets it when ``dim0 * elem_bytes + sum((dim_i - 1) *
stride_i)`` is at least 2**17; its meaning is not documented and nothing here depends on it
(``tensormap.replace`` of a dimension does not update it, and ``.swizzle_atomicity`` clears it:
ptxas's mask for that field is bits 19..21). The driver's encoder (``cuTensorMapEncodeTiled``,
CUDA 13.0 on an H100, ``benchmarks/emulator_tma_check.py``) differs from the DSL's in exactly
two bits of bytes 0..63 in every map compared: it writes 0 in the mode nibble of a tiled map
(:func:`decode` reads 0 as tiled too) and never sets bit 21; the driver's and the DSL's maps
loaded the same bytes in that run's copies. Lists are innermost dimension first, like the
driver's; ``global_stride[i]`` is the byte stride of dimension ``i + 1`` (the driver's
``globalStrides``: rank - 1 entries).
"""
from __future__ import annotations

import functools
import numbers
import struct
from dataclasses import dataclass

import numpy as np

MAP_BYTES = 128
MAX_RANK = 5
#: Bytes the DSL's encoder writes (it leaves 64..127 as they were); every field lies here.
FIELD_BYTES = 64


# ---------------------------------------------------------------------------
# Element types
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class ElemType:
    """One tensor-map element type.

    ``ptx``: the ``new_val`` of ``tensormap.replace.elemtype`` (PTX ISA Table 33); ``driver``:
    the ``CUtensorMapDataType`` value (CUDA driver API; the ISA notes they differ); ``code`` and
    ``tf32``: what the map holds in bits 7..10 and bit 16 (ptxas's lowering of
    ``tensormap.replace.elemtype``); ``bits``: bits per element in global memory;
    ``smem_bits``: bits per element in shared memory (differs for the padded sub-byte types,
    PTX ISA 5.5.1.1); ``is_float``: may use the NaN out-of-bounds fill (driver docs).
    """

    name: str
    ptx: int
    driver: int
    code: int
    tf32: bool
    bits: int
    smem_bits: int
    is_float: bool


#: Every element type, in PTX ``new_val`` order.
ELEMTYPES = (
    ElemType("u8", 0, 0, 0, False, 8, 8, False),
    ElemType("u16", 1, 1, 1, False, 16, 16, False),
    ElemType("u32", 2, 2, 2, False, 32, 32, False),
    ElemType("s32", 3, 3, 3, False, 32, 32, False),
    ElemType("u64", 4, 4, 4, False, 64, 64, False),
    ElemType("s64", 5, 5, 5, False, 64, 64, False),
    ElemType("f16", 6, 6, 6, False, 16, 16, True),
    ElemType("f32", 7, 7, 7, False, 32, 32, True),
    ElemType("f32.ftz", 8, 10, 8, False, 32, 32, True),
    ElemType("f64", 9, 8, 9, False, 64, 64, True),
    ElemType("bf16", 10, 9, 10, False, 16, 16, True),
    ElemType("tf32", 11, 11, 7, True, 32, 32, True),
    ElemType("tf32.ftz", 12, 12, 8, True, 32, 32, True),
    ElemType("b4x16", 13, 13, 11, False, 4, 4, False),  # CU_TENSOR_MAP_DATA_TYPE_16U4_ALIGN8B
    ElemType("b4x16_p64", 14, 14, 12, False, 4, 8, False),  # 16U4_ALIGN16B
    ElemType("b6x16_p32", 15, 15, 13, False, 6, 8, False),  # 16U6_ALIGN16B (b6p2x16 on stores)
)
ELEMTYPE = {e.name: e for e in ELEMTYPES}
_BY_CODE = {(e.code, e.tf32): e for e in ELEMTYPES}
#: Types whose bytes TMA moves unchanged (the rest convert or pad: see :func:`load_tile`).
_PLAIN = {"u8", "u16", "u32", "s32", "u64", "s64", "f16", "f32", "f64", "bf16", "b4x16"}

INTERLEAVES = ("none", "16B", "32B")  # PTX new_val order = driver enum order
SWIZZLES = ("none", "32B", "64B", "128B", "96B")  # PTX new_val order (driver: none, 32B, 64B, 128B, ...)
ATOMICITIES = ("16B", "32B", "32B_flip8B", "64B")  # PTX new_val order
FILLS = ("zero", "nan")  # PTX new_val order = driver enum order
L2_PROMOTIONS = ("none", "64B", "128B", "256B")  # driver enum order (the map's bits 17..18: inferred)
#: Bytes of one swizzle row: the inner box may be at most this long (driver docs), and a
#: swizzled box's rows are laid out this far apart in shared memory (measured on H200: below).
SWIZZLE_SPAN = {"none": None, "32B": 32, "64B": 64, "128B": 128, "96B": 96}
#: Shared-memory alignment of a tile-mode copy's shared-memory address (CUDA Programming Guide,
#: "Using TMA to transfer multi-dimensional arrays": shared memory address 128-byte aligned).
SMEM_ALIGN = 128

#: The bit pattern of the "OOB-NaN" an out-of-bounds element gets with fill mode ``nan``, per
#: element type. Not documented (PTX ISA 5.5.3.3 only names it "a special NaN"): empty until
#: measured; ``benchmarks/emulator_tma_check.py`` reports it. :func:`load_tile` refuses the
#: NaN fill for a type missing here rather than guess.
OOB_NAN_FILL: dict = {}

# bit positions of the flags word at byte 8 (see the module docstring for sources)
_W = 0x08
_MODE_MASK, _MODE_TILED, _MODE_IM2COL = 0xF, 2, 3
_RANK_SHIFT, _RANK_MASK = 4, 0x7
_CODE_SHIFT, _CODE_MASK = 7, 0xF
_INTERLEAVE_SHIFT, _INTERLEAVE_MASK = 11, 0x3
_SWIZZLE_SHIFT, _SWIZZLE_MASK = 13, 0x3
_FILL_BIT = 15
_TF32_BIT = 16
_L2_SHIFT, _L2_MASK = 17, 0x3
_ATOM_SHIFT, _ATOM_MASK = 19, 0x3
_BIG_BIT = 21
_SW96_BIT = 22
_FLAGS_KNOWN = (_MODE_MASK | _RANK_MASK << _RANK_SHIFT | _CODE_MASK << _CODE_SHIFT
                | _INTERLEAVE_MASK << _INTERLEAVE_SHIFT | _SWIZZLE_MASK << _SWIZZLE_SHIFT | 1 << _FILL_BIT
                | 1 << _TF32_BIT | _L2_MASK << _L2_SHIFT | _ATOM_MASK << _ATOM_SHIFT | 1 << _BIG_BIT
                | 1 << _SW96_BIT)
_STRIDE_LO = 0x0C  # + 4 i
_STRIDE_HI = 0x1C  # nibble i
_DIM = 0x20  # + 4 i
_ESTRIDE_BOX0 = 0x34
_BOX14 = 0x38
#: 32-bit words of bytes 0..63 and the bits of each that hold a field (the rest must be zero).
_KNOWN_BITS = {0x08: _FLAGS_KNOWN, 0x1C: 0xFFFF, 0x34: 0x7FFF | 0xFF << 24, 0x3C: 0}
#: The DSL's threshold for bit 21 (its host IR: ``icmp uge extent, 131072``).
BIG_EXTENT = 1 << 17


def _u32(raw, off):
    return struct.unpack_from("<I", raw, off)[0]


def _int(name, value, lo=None, hi=None):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int; got {type(value).__name__}")
    value = int(value)
    if lo is not None and value < lo or hi is not None and value > hi:
        raise ValueError(f"{name} must be in [{lo}, {hi}]; got {value}")
    return value


def _choice(name, value, options):
    if value not in options:
        raise ValueError(f"{name} must be one of {', '.join(map(str, options))}; got {value!r}")
    return value


# ---------------------------------------------------------------------------
# The map as fields
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class TensorMap:
    """A tiled-mode tensor map, field by field (the arguments of ``cuTensorMapEncodeTiled``).

    Lists are innermost dimension first. ``global_stride`` has ``rank - 1`` byte strides
    (dimension 0's is the element size, implied). ``box_dim`` and ``element_stride`` count
    elements; ``big_extent`` is the DSL's bit 21 (module docstring). Construction checks only
    that each value fits its bit field; :func:`validate` checks the driver's rules.
    """

    global_address: int
    elemtype: str
    global_dim: tuple
    global_stride: tuple
    box_dim: tuple
    element_stride: tuple = None
    interleave: str = "none"
    swizzle: str = "none"
    swizzle_atomicity: str = "16B"
    fill: str = "zero"
    l2_promotion: str = "128B"
    big_extent: bool = False

    def __post_init__(self):
        dims = tuple(self.global_dim)
        rank = len(dims)
        if not 1 <= rank <= MAX_RANK:
            raise ValueError(f"global_dim must have 1..{MAX_RANK} entries (the rank); got {rank}")
        es = tuple(self.element_stride) if self.element_stride is not None else (1,) * rank
        for name, values, n in (("global_stride", tuple(self.global_stride), rank - 1),
                                ("box_dim", tuple(self.box_dim), rank), ("element_stride", es, rank)):
            if len(values) != n:
                raise ValueError(f"{name} must have {n} entries for rank {rank}; got {len(values)}")
        set_ = object.__setattr__
        set_(self, "global_address", _int("global_address", self.global_address, 0, 2 ** 64 - 1))
        set_(self, "global_dim", tuple(_int(f"global_dim[{i}]", d, 1, 2 ** 32) for i, d in enumerate(dims)))
        set_(self, "global_stride", tuple(_int(f"global_stride[{i}]", s, 0, 2 ** 40 - 1)
                                          for i, s in enumerate(self.global_stride)))
        set_(self, "box_dim", tuple(_int(f"box_dim[{i}]", b, 1, 256) for i, b in enumerate(self.box_dim)))
        set_(self, "element_stride", tuple(_int(f"element_stride[{i}]", e, 1, 8) for i, e in enumerate(es)))
        _choice("elemtype", self.elemtype, tuple(ELEMTYPE))
        _choice("interleave", self.interleave, INTERLEAVES)
        _choice("swizzle", self.swizzle, SWIZZLES)
        _choice("swizzle_atomicity", self.swizzle_atomicity, ATOMICITIES)
        _choice("fill", self.fill, FILLS)
        _choice("l2_promotion", self.l2_promotion, L2_PROMOTIONS)
        for i, s in enumerate(self.global_stride):
            if s % 16:
                raise ValueError(f"global_stride[{i}] must be a multiple of 16 bytes (the map stores stride / 16); "
                                 f"got {s}")
        if self.global_address % 16:
            raise ValueError(f"global_address must be 16-byte aligned (the driver's rule; the map's low 4 bits are "
                             f"zero in every map the DSL writes); got {self.global_address:#x}")
        set_(self, "big_extent", bool(self.big_extent))

    @property
    def rank(self) -> int:
        return len(self.global_dim)

    @property
    def elem(self) -> ElemType:
        return ELEMTYPE[self.elemtype]


def extent_bytes(elemtype: str, global_dim, global_stride) -> int:
    """The byte extent the DSL's host code compares with 2**17 for bit 21: the last element's end.

    ``dim0 * elem_bits / 8 + sum((dim_i - 1) * stride_i)`` (from the host IR of a
    dynamic-shape ``make_tiled_tma_atom``).
    """
    e = ELEMTYPE[_choice("elemtype", elemtype, tuple(ELEMTYPE))]
    return global_dim[0] * e.bits // 8 + sum((d - 1) * s for d, s in zip(global_dim[1:], global_stride))


def tiled_map(global_address: int, elemtype: str, global_dim, global_stride, box_dim, **fields) -> TensorMap:
    """A :class:`TensorMap` with the DSL's defaults: L2 promotion 128B, bit 21 computed like the DSL."""
    fields.setdefault("big_extent", extent_bytes(elemtype, tuple(global_dim), tuple(global_stride)) >= BIG_EXTENT)
    return TensorMap(global_address, elemtype, tuple(global_dim), tuple(global_stride), tuple(box_dim), **fields)


# ---------------------------------------------------------------------------
# Bytes <-> fields
# ---------------------------------------------------------------------------


def _check_raw(raw) -> bytes:
    if isinstance(raw, np.ndarray):
        raw = raw.astype(np.uint8, copy=False).tobytes()
    if not isinstance(raw, (bytes, bytearray, memoryview)):
        raise TypeError(f"a tensor map must be bytes; got {type(raw).__name__}")
    raw = bytes(raw)
    if len(raw) != MAP_BYTES:
        raise ValueError(f"a tensor map is {MAP_BYTES} bytes; got {len(raw)}")
    return raw


def decode(raw) -> TensorMap:
    """The fields of a 128-byte tiled-mode tensor map (layout and sources: module docstring).

    Raises ``NotImplementedError`` for an im2col map, and ``ValueError`` for a bit pattern no
    known field explains (naming the bits) or a field value with no meaning (a rank above 5,
    element type codes 14/15, interleave 3, the tf32 flag on a type other than f32 / f32.ftz,
    96B swizzle together with another swizzle mode). Bytes 64..127 are ignored: the DSL never
    writes them. A misaligned address (possible through ``tensormap.replace``) is an error.
    """
    raw = _check_raw(raw)
    flags = _u32(raw, _W)
    unknown = []
    for off, known in _KNOWN_BITS.items():
        extra = _u32(raw, off) & ~known & 0xFFFFFFFF
        if extra:
            unknown.append(f"byte {off:#04x} bits {[b for b in range(32) if extra >> b & 1]}")
    mode = flags & _MODE_MASK
    if mode == _MODE_IM2COL:
        raise NotImplementedError("im2col tensor maps (mode nibble 3 at byte 8) are not modelled; only tiled maps")
    if mode not in (_MODE_TILED, 0):
        # the DSL writes 2 for tiled maps; the CUDA driver's cuTensorMapEncodeTiled writes 0 (measured on an H100,
        # benchmarks/emulator_tma_check.py part a: the driver's maps differ from the DSL's in this bit and bit 21)
        raise ValueError(f"the mode nibble (byte 8, bits 0..3) is {mode}: tiled maps carry 2 (the DSL) or 0 (the "
                         f"driver), im2col 3; this value has no known meaning")
    if unknown:
        raise ValueError("tensor map bits outside every known field are set (" + "; ".join(unknown)
                         + "): the DSL never sets them and their meaning is unknown")
    rank = (flags >> _RANK_SHIFT & _RANK_MASK) + 1
    if rank > MAX_RANK:
        raise ValueError(f"the rank field (byte 8, bits 4..6) says rank {rank}; TMA supports 1..{MAX_RANK}")
    code, tf32 = flags >> _CODE_SHIFT & _CODE_MASK, bool(flags >> _TF32_BIT & 1)
    if (code, tf32) not in _BY_CODE:
        raise ValueError(f"element type code {code} with the tf32 flag {'set' if tf32 else 'clear'} (byte 8, bits "
                         f"7..10 and 16) is no tensor-map type (ptxas writes codes 0..13, the flag only with 7 / 8)")
    interleave = flags >> _INTERLEAVE_SHIFT & _INTERLEAVE_MASK
    if interleave >= len(INTERLEAVES):
        raise ValueError(f"interleave field value {interleave} (byte 8, bits 11..12) has no meaning (0..2)")
    swz = flags >> _SWIZZLE_SHIFT & _SWIZZLE_MASK
    if flags >> _SW96_BIT & 1:
        if swz:
            raise ValueError(f"the 96B-swizzle bit (byte 8, bit 22) is set together with swizzle mode {SWIZZLES[swz]}: "
                             f"ptxas never writes that combination")
        swz = 4
    dims = tuple(_u32(raw, _DIM + 4 * i) + 1 for i in range(rank))
    strides = tuple(((_u32(raw, _STRIDE_HI) >> 4 * i & 0xF) << 36 | _u32(raw, _STRIDE_LO + 4 * i) << 4)
                    for i in range(rank - 1))
    eb0 = _u32(raw, _ESTRIDE_BOX0)
    box14 = _u32(raw, _BOX14)
    box = ((eb0 >> 24) + 1,) + tuple((box14 >> 8 * (i - 1) & 0xFF) + 1 for i in range(1, rank))
    estr = tuple((eb0 >> 3 * i & 7) + 1 for i in range(rank))
    address = struct.unpack_from("<Q", raw, 0)[0]
    if address % 16:
        raise ValueError(f"the global address {address:#x} is not 16-byte aligned (driver rule; the DSL and the "
                         f"driver never write such a map)")
    return TensorMap(
        global_address=address, elemtype=_BY_CODE[(code, tf32)].name, global_dim=dims, global_stride=strides,
        box_dim=box, element_stride=estr, interleave=INTERLEAVES[interleave], swizzle=SWIZZLES[swz],
        swizzle_atomicity=ATOMICITIES[flags >> _ATOM_SHIFT & _ATOM_MASK], fill=FILLS[flags >> _FILL_BIT & 1],
        l2_promotion=L2_PROMOTIONS[flags >> _L2_SHIFT & _L2_MASK], big_extent=bool(flags >> _BIG_BIT & 1))


def encode(tm: TensorMap) -> bytes:
    """The 128 bytes of ``tm`` (layout: module docstring); bytes 64..127 and unused entries are zero.

    Byte for byte what the DSL's host code writes into bytes 0..63 for the same fields
    (tested on captured maps).
    """
    if not isinstance(tm, TensorMap):
        raise TypeError(f"tm must be a TensorMap; got {type(tm).__name__}")
    e = tm.elem
    swz = SWIZZLES.index(tm.swizzle)
    flags = (_MODE_TILED | (tm.rank - 1) << _RANK_SHIFT | e.code << _CODE_SHIFT | e.tf32 << _TF32_BIT
             | INTERLEAVES.index(tm.interleave) << _INTERLEAVE_SHIFT | (swz & 3) << _SWIZZLE_SHIFT
             | (swz == 4) << _SW96_BIT | FILLS.index(tm.fill) << _FILL_BIT
             | L2_PROMOTIONS.index(tm.l2_promotion) << _L2_SHIFT
             | ATOMICITIES.index(tm.swizzle_atomicity) << _ATOM_SHIFT | tm.big_extent << _BIG_BIT)
    out = bytearray(MAP_BYTES)
    struct.pack_into("<Q", out, 0, tm.global_address)
    struct.pack_into("<I", out, _W, flags)
    hi = 0
    for i, s in enumerate(tm.global_stride):
        struct.pack_into("<I", out, _STRIDE_LO + 4 * i, s >> 4 & 0xFFFFFFFF)
        hi |= (s >> 36 & 0xF) << 4 * i
    struct.pack_into("<I", out, _STRIDE_HI, hi)
    for i, d in enumerate(tm.global_dim):
        struct.pack_into("<I", out, _DIM + 4 * i, d - 1)
    eb0 = (tm.box_dim[0] - 1) << 24
    for i, es in enumerate(tm.element_stride):
        eb0 |= (es - 1) << 3 * i
    struct.pack_into("<I", out, _ESTRIDE_BOX0, eb0)
    struct.pack_into("<I", out, _BOX14, sum((b - 1) << 8 * (i - 1) for i, b in enumerate(tm.box_dim) if i))
    return bytes(out)


# ---------------------------------------------------------------------------
# tensormap.replace
# ---------------------------------------------------------------------------

#: ``tensormap.replace`` fields: (takes an ordinal, operand type) (PTX ISA: field1/2/3, ``.type``).
REPLACE_FIELDS = {
    "global_address": (False, "b64"), "rank": (False, "b32"),
    "box_dim": (True, "b32"), "global_dim": (True, "b32"), "global_stride": (True, "b64"),
    "element_stride": (True, "b32"),
    "elemtype": (False, "b32"), "interleave_layout": (False, "b32"), "swizzle_mode": (False, "b32"),
    "swizzle_atomicity": (False, "b32"), "fill_mode": (False, "b32"),
}
_FIELD3_RANGE = {"elemtype": 15, "interleave_layout": 2, "swizzle_mode": 4, "swizzle_atomicity": 3, "fill_mode": 1}
_SM100_UP = ("sm_100a", "sm_100f", "sm_101a", "sm_103a", "sm_103f", "sm_110a", "sm_110f", "sm_120a", "sm_120f")


def _insert(word, shift, mask, value):
    return (word & ~(mask << shift) | (value & mask) << shift) & 0xFFFFFFFF


def replace(raw, field: str, ordinal: int | None, value: int, *, arch: str | None = None) -> bytes:
    """``tensormap.replace.tile.<field>`` applied to the 128-byte map ``raw``; returns the new bytes.

    Semantics: PTX ISA ``tensormap.replace`` (9.7.9.28); the bits written are exactly what
    ptxas 13.0 emits for the ``.shared::cta`` form (``LDS`` / ``LOP3`` / ``STS`` on the map),
    including its side effects: ``.elemtype`` with a value other than tf32 / tf32.ftz leaves
    the tf32 flag (bit 16) as it was; ``.swizzle_mode`` clears or sets the 96B bit 22;
    ``.swizzle_atomicity`` clears bit 21 (its mask is bits 19..21). ``value`` is the
    instruction's ``new_val``: for ``.rank`` one less than the rank; for the ``field3`` fields
    the ISA's Table 33 encoding (``elemtype`` 0..15 in PTX order, ``swizzle_mode`` 0..4 with
    4 = 96B, ``swizzle_atomicity`` 0..3, ``fill_mode`` 0..1, ``interleave_layout`` 0..2).

    Errors (``ValueError``): an unknown field; an ordinal where none is taken or outside 0..4
    (``global_stride``: 0..3, the map holds rank - 1 strides; ptxas accepts 4 and writes its
    low word over the high-nibble word at 0x1c); a ``field3`` value outside
    Table 33 (ptxas rejects these too); values the map cannot hold or the driver forbids: a
    rank above 5, box dims outside 1..256, element strides outside 1..8, global dims outside
    1..2**32, strides not a multiple of 16 or >= 2**40, an address not 16-byte aligned (the
    instruction would silently truncate these). ``arch`` (e.g. ``"sm_90a"``): also reject what
    the ISA's target notes forbid there (``swizzle_atomicity`` and elemtype 13..15 need sm_100+;
    96B swizzle needs sm_103a).
    """
    raw = bytearray(_check_raw(raw))
    if field not in REPLACE_FIELDS:
        raise ValueError(f"tensormap.replace has no field {field!r}; fields: {', '.join(REPLACE_FIELDS)}")
    takes_ord, _ = REPLACE_FIELDS[field]
    if takes_ord:
        hi = 3 if field == "global_stride" else MAX_RANK - 1
        ordinal = _int(f"the ordinal of .{field}", ordinal, 0, hi) if ordinal is not None else None
        if ordinal is None:
            raise ValueError(f".{field} takes an ordinal (0..{hi})")
    elif ordinal is not None:
        raise ValueError(f".{field} takes no ordinal; got {ordinal}")
    if field in _FIELD3_RANGE:
        value = _int(f"new_val of .{field}", value, 0, _FIELD3_RANGE[field])
        if arch is not None:
            sm100 = arch in _SM100_UP
            if field == "swizzle_atomicity" and not sm100:
                raise ValueError(f".swizzle_atomicity is not supported on {arch} (PTX ISA: sm_100a and later)")
            if field == "elemtype" and value >= 13 and not sm100:
                raise ValueError(f".elemtype {value} (sub-byte types) is not supported on {arch} (sm_100a and later)")
            if field == "swizzle_mode" and value == 4 and not arch.startswith("sm_103"):
                raise ValueError(f".swizzle_mode 4 (96B) is not supported on {arch} (PTX ISA: sm_103a)")
    flags = _u32(raw, _W)
    if field == "global_address":
        value = _int("new_val of .global_address", value, 0, 2 ** 64 - 1)
        if value % 16:
            raise ValueError(f"the global address must be 16-byte aligned (driver rule); got {value:#x}")
        struct.pack_into("<Q", raw, 0, value)
    elif field == "rank":
        value = _int("new_val of .rank (rank - 1)", value, 0, MAX_RANK - 1)
        flags = _insert(flags, _RANK_SHIFT, _RANK_MASK, value)
    elif field == "global_dim":
        value = _int(f"new_val of .global_dim[{ordinal}]", value, 1, 2 ** 32)
        struct.pack_into("<I", raw, _DIM + 4 * ordinal, value - 1)
    elif field == "global_stride":
        value = _int(f"new_val of .global_stride[{ordinal}]", value, 0, 2 ** 40 - 1)
        if value % 16:
            raise ValueError(f"a global stride must be a multiple of 16 bytes (the map keeps stride / 16); got {value}")
        struct.pack_into("<I", raw, _STRIDE_LO + 4 * ordinal, value >> 4 & 0xFFFFFFFF)
        struct.pack_into("<I", raw, _STRIDE_HI, _insert(_u32(raw, _STRIDE_HI), 4 * ordinal, 0xF, value >> 36))
    elif field == "box_dim":
        value = _int(f"new_val of .box_dim[{ordinal}]", value, 1, 256)
        off, shift = (_ESTRIDE_BOX0, 24) if ordinal == 0 else (_BOX14, 8 * (ordinal - 1))
        struct.pack_into("<I", raw, off, _insert(_u32(raw, off), shift, 0xFF, value - 1))
    elif field == "element_stride":
        value = _int(f"new_val of .element_stride[{ordinal}]", value, 1, 8)
        struct.pack_into("<I", raw, _ESTRIDE_BOX0, _insert(_u32(raw, _ESTRIDE_BOX0), 3 * ordinal, 7, value - 1))
    elif field == "elemtype":
        e = next(x for x in ELEMTYPES if x.ptx == value)
        if e.tf32:
            flags = _insert(flags, _TF32_BIT, 1, 1)
        flags = _insert(flags, _CODE_SHIFT, _CODE_MASK, e.code)
    elif field == "interleave_layout":
        flags = _insert(flags, _INTERLEAVE_SHIFT, _INTERLEAVE_MASK, value)
    elif field == "swizzle_mode":
        flags = _insert(flags, _SWIZZLE_SHIFT, _SWIZZLE_MASK, value if value < 4 else 0)
        flags = _insert(flags, _SW96_BIT, 1, value == 4)
    elif field == "swizzle_atomicity":
        flags = _insert(flags, _ATOM_SHIFT, 0x7, value)
    elif field == "fill_mode":
        flags = _insert(flags, _FILL_BIT, 1, value)
    struct.pack_into("<I", raw, _W, flags)
    return bytes(raw)


# ---------------------------------------------------------------------------
# The driver's rules
# ---------------------------------------------------------------------------


def validate(tm: TensorMap) -> None:
    """Raise ``ValueError`` naming the first rule of ``cuTensorMapEncodeTiled`` (CUDA driver API) ``tm`` breaks.

    These are the rules a map must obey for the hardware's behaviour to be defined; a map
    changed by ``tensormap.replace`` may break them (the instruction does not check), so the
    TMA operations here check them on every copy. Plus the PTX ISA's Table 14 (swizzle
    atomicity other than 16B only with the 128B swizzle).
    """
    e, r = tm.elem, tm.rank
    packed16 = tm.elemtype in ("b4x16_p64", "b6x16_p32")
    if tm.interleave != "none" and r < 3:
        raise ValueError(f"an interleaved map needs rank >= 3 (driver rule); got rank {r}")
    if (tm.interleave == "32B" or packed16) and tm.global_address % 32:
        raise ValueError(f"the global address must be 32-byte aligned for interleave {tm.interleave} / element type "
                         f"{tm.elemtype} (driver rule); got {tm.global_address:#x}")
    if packed16 and tm.global_dim[0] % 128:
        raise ValueError(f"global_dim[0] must be a multiple of 128 for {tm.elemtype} (driver rule); got "
                         f"{tm.global_dim[0]}")
    if tm.elemtype == "b4x16" and tm.global_dim[0] % 2:
        raise ValueError(f"global_dim[0] must be even for b4x16 (driver rule); got {tm.global_dim[0]}")
    for i, s in enumerate(tm.global_stride):
        if (tm.interleave == "32B" or packed16) and s % 32:
            raise ValueError(f"global_stride[{i}] must be a multiple of 32 for interleave {tm.interleave} / "
                             f"{tm.elemtype} (driver rule); got {s}")
    inner = tm.box_dim[0] * e.bits
    if tm.interleave == "none" and inner % 128:
        raise ValueError(f"box_dim[0] x element size must be a multiple of 16 bytes (driver rule); got "
                         f"{tm.box_dim[0]} x {e.bits} bits")
    if packed16 and tm.box_dim[0] != 128:
        raise ValueError(f"box_dim[0] must be 128 for {tm.elemtype} (driver rule); got {tm.box_dim[0]}")
    span = SWIZZLE_SPAN[tm.swizzle]
    if tm.interleave == "none" and span is not None and inner > 8 * span:
        raise ValueError(f"the inner box (box_dim[0] x element size = {inner // 8} bytes) must be at most the swizzle "
                         f"span {span} bytes for swizzle {tm.swizzle} (driver rule)")
    if tm.interleave == "32B" and tm.swizzle != "32B":
        raise ValueError(f"interleave 32B requires swizzle 32B (driver rule); got {tm.swizzle}")
    if tm.swizzle_atomicity != "16B" and tm.swizzle != "128B":
        raise ValueError(f"swizzle atomicity {tm.swizzle_atomicity} requires the 128B swizzle (PTX ISA Table 14); got "
                         f"swizzle {tm.swizzle}")
    if tm.fill == "nan" and (not e.is_float):
        raise ValueError(f"the NaN out-of-bounds fill needs a floating-point element type (driver rule); got "
                         f"{tm.elemtype}")


# ---------------------------------------------------------------------------
# The TMA unit, tile mode
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class _Geometry:
    counts: tuple  # elements traversed per dimension (dim 0: box_dim[0]; others ceil(box / element stride))
    row_bytes: int  # data bytes of one box row (dimension 0), in global and in shared memory
    pitch: int  # shared-memory bytes from one box row to the next
    rows: int
    span: int  # shared-memory bytes from the destination address to the end of the last row
    elem_bits: int


def _modelled(tm: TensorMap, what: str) -> None:
    if tm.interleave != "none":
        raise NotImplementedError(f"{what}: interleaved layouts ({tm.interleave}) are not modelled (the DSL never "
                                  f"makes them)")
    if tm.swizzle == "96B":
        raise NotImplementedError(f"{what}: the 96B swizzle (sm_103a) is not modelled")
    if tm.elemtype not in _PLAIN:
        raise NotImplementedError(
            f"{what}: element type {tm.elemtype} is not modelled: "
            + ("TMA may convert these values (rounding / flushing) in ways not documented; "
               if tm.elemtype in ("f32.ftz", "tf32", "tf32.ftz") else
               "its shared-memory padding (PTX ISA 5.5.1.1) and transaction count are not verified; ")
            + "benchmarks/emulator_tma_check.py is where to measure it")


def _key(tm: TensorMap) -> tuple:
    """What the shared-memory layout of a box depends on (so that caches ignore addresses, dims, strides)."""
    return (tm.elemtype, tm.box_dim, tm.element_stride, tm.swizzle, tm.swizzle_atomicity)


def _geometry(tm: TensorMap) -> _Geometry:
    return _geometry_of(_key(tm))


@functools.lru_cache(maxsize=512)
def _geometry_of(key) -> _Geometry:
    elemtype, box, estride, swizzle, _ = key
    bits = ELEMTYPE[elemtype].bits
    counts = (box[0],) + tuple(-(-b // s) for b, s in zip(box[1:], estride[1:]))
    row_bytes = box[0] * bits // 8
    span = SWIZZLE_SPAN[swizzle]
    pitch = max(row_bytes, span) if span else row_bytes
    rows = int(np.prod(counts[1:], dtype=np.int64)) if len(box) > 1 else 1
    return _Geometry(counts, row_bytes, pitch, rows, rows * pitch, bits)


def tile_bytes(tm: TensorMap) -> int:
    """The bytes one tile-mode load of a box completes on its mbarrier (``complete_tx``): the box's data bytes.

    ``box_dim[0] x element size x prod(ceil(box_dim[i] / element_stride[i]))`` (CUDA driver docs:
    TMA loads ceil(boxDim[i] / elementStrides[i]) elements along dimension i; the stride of
    dimension 0 is ignored), whether or not the box hangs over the tensor's edge (the
    out-of-bounds elements are filled and counted: course chapter 04, measured). Padding rows
    to the swizzle span adds nothing: on an H200 a 16x32 FP16 box loaded with the 128B swizzle
    (64-byte rows) completed with ``expect_tx = 1024`` while spreading over 2048 bytes.
    """
    _modelled(tm, "tile_bytes")
    g = _geometry(tm)
    return g.rows * g.row_bytes


def smem_span(tm: TensorMap) -> int:
    """Shared-memory bytes from the copy's shared-memory address that a load writes (or a store reads) within.

    Equal to :func:`tile_bytes` except with a swizzle whose span exceeds the inner box: each
    row then starts a span further on (measured on H200, see :func:`load_tile`), leaving
    bytes in between untouched.
    """
    _modelled(tm, "smem_span")
    return _geometry(tm).span


#: The innermost tile coordinate must land on a 16-byte multiple of the row, in loads and stores alike. Not in
#: the PTX ISA's text; measured on an H100 (2026-11-26, benchmarks/emulator_tma_check.py: u8 boxes at inner
#: offsets 8, 56, -8 and 250 bytes and a bf16 box at 150 elements (300 bytes) each raised "an illegal
#: instruction was encountered"; offsets 0, 48, -16, -48, 112 ... loaded correctly), as Triton documents for
#: its TMA descriptors ("the innermost coordinate must be 16-byte aligned", Gluon tutorial 04).
COORD_ALIGN = 16


def check_smem_address(tm: TensorMap, addr: int) -> None:
    """Raise ``ValueError`` unless ``addr`` is a shared-memory address a tile-mode copy of ``tm`` may use.

    The rule: 128-byte alignment (CUDA Programming Guide, TMA alignment table: "shared memory
    address 128-byte aligned"; the PTX ISA's 32B / 64B swizzle atomicity sub-modes need 32 / 64,
    implied). A swizzled copy need *not* start on the pattern's repeat (1024 bytes for 128B):
    PTX ISA 5.5.7 defines the pattern on the address bits themselves ("swizzle base offset =
    (dstMem / 128) % 8" otherwise), which is what :func:`load_tile` models; the course's
    kernels align to 1024 so that the pattern starts at row 0.
    """
    addr = _int("the shared-memory address", addr, 0, 2 ** 32 - 1)
    if addr % SMEM_ALIGN:
        raise ValueError(f"a TMA tile copy's shared-memory address must be {SMEM_ALIGN}-byte aligned (CUDA programming "
                         f"guide); got {addr:#x} ({addr % SMEM_ALIGN} bytes past alignment)")


def _phys(swizzle: str, atomicity: str, a: np.ndarray) -> np.ndarray:
    """Shared-memory address of logical address ``a`` (8-byte units' starts) under ``tm``'s swizzle (PTX ISA 5.5.7).

    16-byte atomicity: 16-byte chunk bits 4.. XORed with line bits 7..: 1 bit for 32B, 2 for
    64B, 3 for 128B (CUTLASS ``Swizzle<1|2|3, 4, 3>`` on the byte address; measured on H100 /
    H200 for rows of the full span by course chapter 04). 128B with 32-byte atomicity: 32-byte
    units (bits 5..6) XOR line bits 7..8; 64-byte atomicity: bit 6 XOR bit 7; "32B + 8B flip":
    as 32B, and the two 8-byte halves of every 16 bytes swap on odd lines (these three from the
    ISA's tables only: no sm_100 GPU has checked them).
    """
    if swizzle == "none":
        return a
    line = a >> 7
    if atomicity == "16B":
        bits = {"32B": 1, "64B": 2, "128B": 3}[swizzle]
        return a ^ ((line & ((1 << bits) - 1)) << 4)
    if atomicity == "64B":
        return a ^ ((line & 1) << 6)
    out = a ^ ((line & 3) << 5)
    if atomicity == "32B_flip8B":
        out = out ^ ((line & 1) << 3)
    return out


def _layout(tm: TensorMap, phase: int):
    return _layout_of(_key(tm), phase)


@functools.lru_cache(maxsize=512)
def _layout_of(key, phase: int):
    """(logical 8-byte units holding data, their shared-memory units) for a destination at ``phase`` (mod 1024)."""
    g = _geometry_of(key)
    per_row = g.row_bytes // 8
    units = (np.arange(g.rows, dtype=np.int64)[:, None] * (g.pitch // 8) + np.arange(per_row)[None, :]).ravel()
    phys = (_phys(key[3], key[4], phase + units * 8) - phase) // 8
    for a in (units, phys):
        a.flags.writeable = False
    return units, phys


def _check_coords(tm: TensorMap, coords) -> tuple:
    coords = tuple(coords)
    if len(coords) != tm.rank:
        raise ValueError(f"a rank-{tm.rank} tensor map takes {tm.rank} coordinates; got {len(coords)}")
    coords = tuple(_int(f"coords[{i}]", c, -2 ** 31, 2 ** 31 - 1) for i, c in enumerate(coords))
    if (coords[0] * tm.elem.bits) % 8:
        raise NotImplementedError(f"coords[0] = {coords[0]} starts a row inside a byte of {tm.elemtype}; not modelled")
    inner = coords[0] * tm.elem.bits // 8
    if inner % COORD_ALIGN:
        raise ValueError(f"coords[0] = {coords[0]} puts the box's rows {inner} bytes into the tensor's rows; a tile copy "
                         f"needs a multiple of {COORD_ALIGN} bytes there ({COORD_ALIGN * 8 // tm.elem.bits} "
                         f"{tm.elemtype} elements). The GPU stops with 'an illegal instruction was encountered' "
                         "(measured on an H100: benchmarks/emulator_tma_check.py)")
    return coords


def check_store_coords(tm: TensorMap, coords) -> tuple:
    """The coordinates of a tile-mode store, checked: those of any tile copy, and none negative.

    Measured on an H100 (2026-11-26, benchmarks/emulator_tma_check.py): f16 stores at (0, -5),
    (-32, 0), (-64, 0), (0, -16), each swizzle mode, and an f32 rank-1 store at (-8,) each raised
    'an illegal instruction was encountered', while loads at the same coordinates filled the
    outside and stores past the end were clipped. The PTX ISA's text does not single this out.
    """
    coords = _check_coords(tm, coords)
    bad = [i for i, c in enumerate(coords) if c < 0]
    if bad:
        raise ValueError(f"a TMA tile store at coords {coords}: coords[{bad[0]}] is negative. A store box may run "
                         "past the end of the tensor (clipped) but not start before it: the GPU stops with 'an "
                         "illegal instruction was encountered' (measured on an H100: "
                         "benchmarks/emulator_tma_check.py); loads accept negative coordinates")
    return coords


def _rows(tm: TensorMap, coords):
    """Per box row: in bounds? its global address; and the row's in-bounds byte range [lo, hi)."""
    g = _geometry(tm)
    idx = np.unravel_index(np.arange(g.rows), g.counts[1:][::-1]) if tm.rank > 1 else ()
    inb = np.ones(g.rows, dtype=bool)
    addr = np.full(g.rows, tm.global_address, dtype=np.int64)
    for d in range(1, tm.rank):
        k = idx[tm.rank - 1 - d]
        c = coords[d] + k * tm.element_stride[d]
        inb &= (c >= 0) & (c < tm.global_dim[d])
        addr += c * tm.global_stride[d - 1]
    lo_e = min(max(coords[0], 0), coords[0] + tm.box_dim[0])
    hi_e = max(min(coords[0] + tm.box_dim[0], tm.global_dim[0]), lo_e)
    bits = tm.elem.bits
    lo, hi = (lo_e - coords[0]) * bits // 8, (hi_e - coords[0]) * bits // 8
    if hi <= lo:
        inb[:] = False
    addr += coords[0] * bits // 8
    return inb, addr, lo, hi


def _as_bytes(data) -> np.ndarray:
    """A flat uint8 view (or copy) of bytes-like data or a numpy array's bytes."""
    if isinstance(data, np.ndarray):
        return np.ascontiguousarray(data).view(np.uint8).ravel()
    return np.frombuffer(memoryview(data).cast("B"), dtype=np.uint8)


def _runs(inb, addr, smem, lo, hi):
    """Maximal runs of in-bounds row segments contiguous both in global and in (logical) shared memory."""
    rows = np.flatnonzero(inb)
    if not rows.size:
        return []
    n = hi - lo
    ga, sa = addr[rows] + lo, smem[rows] + lo
    brk = np.flatnonzero((np.diff(ga) != n) | (np.diff(sa) != n)) + 1
    starts = np.concatenate(([0], brk))
    ends = np.concatenate((brk, [rows.size]))
    return [(int(ga[s]), int(sa[s]), n * int(e - s)) for s, e in zip(starts, ends)]


def load_tile(tm: TensorMap, coords, read, *, smem_addr: int = 0, into=None) -> np.ndarray:
    """The shared-memory bytes ``cp.async.bulk.tensor.<rank>d.shared::cluster.global.tile`` writes for ``coords``.

    Returns a uint8 array of :func:`smem_span` bytes: byte ``j`` is what lands at
    ``smem_addr + j``. ``read(address, nbytes)`` returns ``nbytes`` global bytes (bytes-like);
    it is called only for in-bounds data, once per run of contiguous bytes. Bytes the copy
    does not write (between rows padded to the swizzle span) are taken from ``into`` (the
    current shared-memory bytes there, ``smem_span`` long) or are zero.

    The model (sources): the box is traversed from ``coords`` (elements, innermost first,
    signed 32-bit), ``ceil(box_dim[i] / element_stride[i])`` elements along dimension
    ``i >= 1`` taking every ``element_stride[i]``-th (driver docs; dimension 0's element
    stride is ignored there); rows (dimension 0 runs) are laid out in order, dimension 1
    fastest (PTX ISA 5.5.3: tiled mode keeps the tensor's layout); an element outside
    ``[0, global_dim)`` in any dimension, negative coordinates included, is filled with zero
    or with the OOB-NaN (PTX ISA 5.5.3.3; zero fill measured by course chapter 04); rows are
    ``max(inner box bytes, swizzle span)`` apart, so a row shorter than the swizzle span
    starts a new span (measured on H200: a 16x32 FP16 box with the 128B swizzle put row r,
    chunk c in 16-byte group ``c ^ (r & 7)`` of its own 128-byte line, 2048 bytes for 1024 of
    data); then the swizzle permutes by address bits (:func:`_phys`), from ``smem_addr``'s
    own bits (PTX ISA 5.5.7 base offset). Multicast and ``cta_group::2`` deliver these same
    bytes to other CTAs: the caller's business.
    """
    if not isinstance(tm, TensorMap):
        raise TypeError(f"tm must be a TensorMap (decode the map's bytes first); got {type(tm).__name__}")
    _modelled(tm, "load_tile")
    validate(tm)
    check_smem_address(tm, smem_addr)
    coords = _check_coords(tm, coords)
    g = _geometry(tm)
    inb, addr, lo, hi = _rows(tm, coords)
    smem_rows = np.arange(g.rows, dtype=np.int64) * g.pitch
    logical = np.zeros(g.span, dtype=np.uint8)
    oob = not (inb.all() and lo == 0 and hi == g.row_bytes)
    if oob and tm.fill == "nan":
        pattern = OOB_NAN_FILL.get(tm.elemtype)
        if pattern is None:
            raise NotImplementedError(f"the OOB-NaN bit pattern for {tm.elemtype} is not documented nor measured yet "
                                      f"(OOB_NAN_FILL); run benchmarks/emulator_tma_check.py on a GPU to measure it")
        row = np.frombuffer(bytes(pattern) * (g.row_bytes // len(pattern)), dtype=np.uint8)
        logical.reshape(g.rows, g.pitch)[:, :g.row_bytes] = row
    for ga, sa, n in _runs(inb, addr, smem_rows, lo, hi):
        data = read(ga, n)
        buf = _as_bytes(data)
        if buf.size != n:
            raise ValueError(f"read({ga:#x}, {n}) returned {buf.size} bytes")
        logical[sa:sa + n] = buf
    if into is None:
        out = np.zeros(g.span, dtype=np.uint8)
    else:
        out = _as_bytes(into).copy()
        if out.size != g.span:
            raise ValueError(f"into must hold smem_span(tm) = {g.span} bytes; got {out.size}")
    units, phys = _layout(tm, smem_addr % 1024)
    out.view(np.uint64)[phys] = logical.view(np.uint64)[units]
    return out


def store_tile(tm: TensorMap, coords, smem_bytes, write, *, smem_addr: int = 0) -> int:
    """``cp.async.bulk.tensor.<rank>d.global.shared::cta.tile.bulk_group``: write the box's in-bounds elements.

    ``smem_bytes``: the shared-memory bytes from ``smem_addr`` (at least :func:`smem_span`
    of them), laid out as :func:`load_tile` lays out a load (same swizzle, padding and
    traversal); ``write(address, data)`` stores global bytes, called once per run of
    contiguous in-bounds bytes. Elements past the end of the tensor are not written (PTX ISA
    5.5.3.3; course chapter 04 measured clipped stores past the end). A *negative* coordinate,
    which a load accepts (it fills), is refused: the H100 stopped every such store with 'an
    illegal instruction was encountered' (:func:`check_store_coords`). Returns the bytes written.
    """
    if not isinstance(tm, TensorMap):
        raise TypeError(f"tm must be a TensorMap (decode the map's bytes first); got {type(tm).__name__}")
    _modelled(tm, "store_tile")
    validate(tm)
    check_smem_address(tm, smem_addr)
    coords = check_store_coords(tm, coords)
    g = _geometry(tm)
    src = _as_bytes(smem_bytes)
    if src.size < g.span:
        raise ValueError(f"smem_bytes must hold smem_span(tm) = {g.span} bytes; got {src.size}")
    src = np.ascontiguousarray(src[:g.span])
    units, phys = _layout(tm, smem_addr % 1024)
    logical = np.zeros(g.span, dtype=np.uint8)
    logical.view(np.uint64)[units] = src.view(np.uint64)[phys]
    inb, addr, lo, hi = _rows(tm, coords)
    total = 0
    for ga, sa, n in _runs(inb, addr, np.arange(g.rows, dtype=np.int64) * g.pitch, lo, hi):
        write(ga, logical[sa:sa + n].tobytes())
        total += n
    return total
