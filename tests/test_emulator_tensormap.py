"""The emulator's tensor maps and TMA unit (gemmlab.emulator.tensormap), on the CPU.

* decode of maps the DSL's host code builds (captured through capture_launches) for many
  parameter combinations, against the parameters that built them; encode of those fields
  reproduces the DSL's bytes 0..63;
* tensormap.replace bit for bit against ptxas's lowering, and against the DSL's own map of
  the new tensor;
* load_tile / store_tile on hand-worked cases and against an independent element-by-element
  reference; the swizzles against gemmlab.swizzle's model; bad input errors.
"""
import ctypes
import functools
import struct

import numpy as np
import pytest

from gemmlab.emulator import tensormap as T

torch = pytest.importorskip("torch")


# ---------------------------------------------------------------------------
# Capturing maps the DSL builds
# ---------------------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def _dsl():
    import cuda.bindings.driver as cuda
    import cutlass
    import cutlass.cute as cute
    from cutlass.cute.nvgpu import cpasync

    @cute.kernel
    def takes_atom(atom: cute.CopyAtom, g: cute.Tensor):
        pass

    def host_for(box, sw, op, mc, itype, order, fp4):
        @cute.jit
        def host(src: cute.Tensor, stream: cuda.CUstream):
            g = src
            if cutlass.const_expr(fp4):  # the uint8 tensor's bytes as packed FP4, two per byte
                g = cute.make_tensor(cute.recast_ptr(src.iterator, dtype=cutlass.Float4E2M1FN),
                                     cute.make_layout((src.shape[0], src.shape[1] * 2), stride=(src.shape[1] * 2, 1)))
            lay = cute.make_ordered_layout(box, order=order)
            layout = cute.make_composed_layout(cute.make_swizzle(sw, 4, 3), 0, lay)
            kind = {"load": cpasync.CopyBulkTensorTileG2SOp, "store": cpasync.CopyBulkTensorTileS2GOp,
                    "mcast": cpasync.CopyBulkTensorTileG2SMulticastOp}[op]()
            kw = {} if itype is None else {"internal_type": itype}
            if cutlass.const_expr(op == "mcast"):
                atom, tg = cpasync.make_tiled_tma_atom(kind, g, layout, box, mc, **kw)
            else:
                atom, tg = cpasync.make_tiled_tma_atom(kind, g, layout, box, **kw)
            takes_atom(atom, tg).launch(grid=(1, 1, 1), block=(32, 1, 1), stream=stream)

        return host

    return cuda, cutlass, host_for


def capture(t, box, sw=0, *, op="load", mc=1, itype=None, order=None, fp4=False, target="sm_90a", again=()):
    """The 128-byte map the DSL encodes for ``t`` (and, from the same compiled code, for each of ``again``)."""
    from cutlass.cute.runtime import from_dlpack

    from gemmlab.compile import compile_for
    from gemmlab.emulator.host import HostRunner

    cuda, cutlass, host_for = _dsl()
    order = tuple(order) if order is not None else tuple(range(len(box) - 1, -1, -1))
    host = host_for(tuple(box), sw, op, mc, itype, order, fp4)
    c = compile_for(target, host, from_dlpack(t, assumed_align=16), cuda.CUstream(0))
    runner = HostRunner(c)
    out = [runner(from_dlpack(x, assumed_align=16), cuda.CUstream(0))[0].params[0] for x in (t,) + tuple(again)]
    return out if again else out[0]


ELEM = {torch.uint8: "u8", torch.int8: "u8", torch.float8_e4m3fn: "u8", torch.int16: "u16", torch.float16: "f16",
        torch.bfloat16: "bf16", torch.int32: "u32", torch.float32: "f32", torch.int64: "u64", torch.float64: "f64"}


def expected(t, box, swizzle="none", elemtype=None, box_rows_div=1):
    """The map the DSL should build for torch tensor ``t`` and a box in ``t``'s mode order."""
    modes = sorted(range(t.dim()), key=lambda i: t.stride(i))
    eb = t.element_size()
    dims = tuple(t.shape[i] for i in modes)
    strides = tuple(t.stride(i) * eb for i in modes[1:])
    b = [box[i] for i in modes]
    b[-1] //= box_rows_div
    return T.tiled_map(t.data_ptr(), elemtype or ELEM[t.dtype], dims, strides, tuple(b), swizzle=swizzle)


def check_round_trip(raw, tm):
    got = T.decode(raw)
    assert got == tm
    assert T.encode(got)[:T.FIELD_BYTES] == raw[:T.FIELD_BYTES]
    assert T.decode(T.encode(got)) == got
    return got


SW = {0: "none", 1: "32B", 2: "64B", 3: "128B"}

CASES = [
    # (shape, dtype, box, swizzle bits)
    ((100, 200), torch.float16, (64, 64), 3),
    ((100, 200), torch.float16, (64, 16), 1),
    ((100, 200), torch.float16, (32, 32), 2),
    ((100, 200), torch.float16, (64, 8), 0),
    ((100, 256), torch.bfloat16, (16, 64), 3),
    ((64, 64), torch.float32, (8, 32), 3),
    ((64, 96), torch.int32, (8, 16), 2),
    ((64, 256), torch.uint8, (64, 128), 3),
    ((64, 256), torch.int8, (32, 32), 1),
    ((64, 256), torch.float8_e4m3fn, (16, 128), 3),
    ((64, 64), torch.int16, (8, 64), 3),
    ((32, 64), torch.int64, (8, 16), 3),
    ((32, 64), torch.float64, (8, 4), 1),
    ((1000,), torch.float32, (64,), 0),
    ((6, 10, 48), torch.float16, (2, 4, 16), 0),
    ((3, 6, 10, 48), torch.bfloat16, (2, 2, 4, 32), 2),
    ((3, 4, 6, 10, 64), torch.float16, (2, 2, 2, 4, 64), 3),
    ((256, 256), torch.float16, (64, 64), 3),  # >= 128 KiB: the DSL's bit 21
]


@pytest.mark.parametrize("shape,dtype,box,sw", CASES, ids=lambda v: str(v).replace(" ", ""))
def test_decode_dsl_maps(shape, dtype, box, sw):
    t = torch.zeros(shape, dtype=dtype)
    check_round_trip(capture(t, box, sw), expected(t, box, SW[sw]))


def test_big_extent_flag_follows_the_dsls_formula():
    # 4 x 40 x 64 f16 planes padded to 32896 bytes: extent = 128 + 63 * 512 + 3 * 32896 = 131072 exactly,
    # while the elements take only 32 KiB; one row less stays below.
    buf = torch.zeros(4 * 16448, dtype=torch.float16)
    for rows, big in ((64, True), (63, False)):
        t = buf.as_strided((4, rows, 64), (16448, 256, 1))
        tm = check_round_trip(capture(t, (2, 8, 64)), expected(t, (2, 8, 64)))
        assert tm.big_extent is big
        assert (T.extent_bytes("f16", tm.global_dim, tm.global_stride) >= T.BIG_EXTENT) is big


def test_decode_strided_transposed_and_offset_tensors():
    base = torch.zeros(128, 256, dtype=torch.float16)
    padded = base[:100, :200]  # row stride 512 bytes, not the row length
    check_round_trip(capture(padded, (64, 64), 3), expected(padded, (64, 64), "128B"))
    colmajor = torch.zeros(64, 128, dtype=torch.float16).t()  # (128, 64), stride (1, 128)
    check_round_trip(capture(colmajor, (64, 64), 3, order=(0, 1)), expected(colmajor, (64, 64), "128B"))
    # one compiled function, three tensors of one layout: the address is the host code's runtime value
    big = torch.zeros(512, 256, dtype=torch.float16)
    others = (big[128:256], big[384:])
    raws = capture(base, (64, 64), 3, again=others)
    for x, raw in zip((base,) + others, raws):
        check_round_trip(raw, expected(x, (64, 64), "128B"))


def test_decode_ops_targets_and_internal_types():
    import cutlass

    t = torch.zeros(128, 64, dtype=torch.float16)
    want = expected(t, (64, 64), "128B")
    for kw in ({"op": "store"}, {"target": "sm_100a"}, {"op": "store", "target": "sm_100a"}):
        check_round_trip(capture(t, (64, 64), 3, **kw), want)
    # multicast over 2 CTAs: each CTA's copy is half the box's rows
    check_round_trip(capture(t, (64, 64), 3, op="mcast", mc=2), expected(t, (64, 64), "128B", box_rows_div=2))
    f = torch.zeros(64, 64, dtype=torch.float32)
    check_round_trip(capture(f, (8, 32), 3, itype=cutlass.TFloat32), expected(f, (8, 32), "128B", "tf32"))
    h = torch.zeros(64, 64, dtype=torch.float16)
    check_round_trip(capture(h, (8, 64), 3, itype=cutlass.Int16), expected(h, (8, 64), "128B", "u16"))


def test_decode_sub_byte_types_on_sm100():
    import cutlass

    u = torch.zeros(64, 128, dtype=torch.uint8)  # 64 x 256 FP4 values
    want = T.tiled_map(u.data_ptr(), "b4x16", (256, 64), (128,), (128, 8))
    check_round_trip(capture(u, (8, 128), 0, fp4=True, target="sm_100a"), want)
    unpacked = T.tiled_map(u.data_ptr(), "b4x16_p64", (256, 64), (128,), (128, 8))
    check_round_trip(capture(u, (8, 128), 0, fp4=True, itype=cutlass.Uint8, target="sm_100a"), unpacked)


def test_decode_rejects_im2col_maps():
    import cuda.bindings.driver as cuda
    import cutlass.cute as cute
    from cutlass.cute.nvgpu import cpasync
    from cutlass.cute.runtime import from_dlpack

    from gemmlab.compile import compile_for
    from gemmlab.emulator.host import capture_launches

    @cute.kernel
    def kern(atom: cute.CopyAtom, g: cute.Tensor):
        pass

    @cute.jit
    def host(src: cute.Tensor, stream: cuda.CUstream):
        t = cute.make_tensor(src.iterator, cute.make_layout(((8, 1, 1, 2), 16), stride=((16, 0, 0, 128), 1)))
        layout = cute.make_composed_layout(cute.make_swizzle(0, 4, 3), 0, cute.make_layout((64, 16), stride=(16, 1)))
        atom, g = cpasync.make_im2col_tma_atom(
            cpasync.CopyBulkTensorIm2ColG2SOp(), t, layout, (64, 16), lower_corner_whd=(0, 0, 0),
            upper_corner_whd=(0, 0, 0), lower_padding_whd=(0, 0, 0), upper_padding_whd=(0, 0, 0),
            stride_whd=(1, 1, 1), lower_srt=(0, 0, 0), stride_srt=(1, 1, 1))
        kern(atom, g).launch(grid=(1, 1, 1), block=(32, 1, 1), stream=stream)

    a = torch.zeros(2, 8, 16, dtype=torch.float16)
    c = compile_for("sm_90a", host, from_dlpack(a, assumed_align=16), cuda.CUstream(0))
    raw = capture_launches(c, from_dlpack(a, assumed_align=16), cuda.CUstream(0))[0].params[0]
    with pytest.raises(NotImplementedError, match="im2col"):
        T.decode(raw)


# ---------------------------------------------------------------------------
# decode / encode on their own
# ---------------------------------------------------------------------------

BASE = 0x10000


def f16_map(**kw):
    kw.setdefault("swizzle", "128B")
    return T.TensorMap(BASE, "f16", (200, 100), (400,), (64, 64), **kw)


def with_word(raw, off, fn):
    b = bytearray(raw)
    struct.pack_into("<I", b, off, fn(struct.unpack_from("<I", b, off)[0]))
    return bytes(b)


def test_encode_layout_matches_the_documented_bits():
    tm = T.TensorMap(0x7F00_0000_1230, "bf16", (200, 100, 7), (0x12_3456_7890, 1 << 39), (32, 16, 4),
                     element_stride=(1, 2, 8), swizzle="64B", fill="nan", l2_promotion="256B", big_extent=True)
    raw = T.encode(tm)
    assert struct.unpack_from("<Q", raw, 0)[0] == 0x7F00_0000_1230
    flags = struct.unpack_from("<I", raw, 8)[0]
    assert flags & 0xF == 2 and flags >> 4 & 7 == 2 and flags >> 7 & 0xF == 10
    assert flags >> 13 & 3 == 2 and flags >> 15 & 1 == 1 and flags >> 17 & 3 == 3 and flags >> 21 & 1 == 1
    assert struct.unpack_from("<I", raw, 0x0C)[0] == (0x12_3456_7890 >> 4) & 0xFFFFFFFF
    assert struct.unpack_from("<I", raw, 0x10)[0] == (1 << 35) & 0xFFFFFFFF
    assert struct.unpack_from("<I", raw, 0x1C)[0] == 0x1 | 0x8 << 4  # bits 36..39 of each stride
    assert struct.unpack_from("<3I", raw, 0x20) == (199, 99, 6)
    assert struct.unpack_from("<I", raw, 0x34)[0] == 31 << 24 | 1 << 3 | 7 << 6
    assert struct.unpack_from("<I", raw, 0x38)[0] == 15 | 3 << 8
    assert raw[T.FIELD_BYTES:] == bytes(64)
    assert T.decode(raw) == tm


def test_decode_ignores_bytes_the_dsl_never_writes_and_unused_entries():
    raw = T.encode(f16_map())
    noisy = raw[:64] + bytes(range(1, 65))  # the DSL leaves host-stack bytes here
    noisy = with_word(noisy, 0x28, lambda w: 77)  # a global dim beyond the rank (e.g. after a rank replace)
    assert T.decode(noisy) == f16_map()


@pytest.mark.parametrize("off,bit", [(0x08, 23), (0x08, 31), (0x1C, 16), (0x34, 15), (0x34, 23), (0x3C, 0)])
def test_decode_rejects_unknown_bits(off, bit):
    raw = with_word(T.encode(f16_map()), off, lambda w: w | 1 << bit)
    with pytest.raises(ValueError, match=f"byte {off:#04x} bits \\[{bit}\\]"):
        T.decode(raw)


@pytest.mark.parametrize("change,match", [
    (lambda w: (w & ~0xF) | 5, "mode nibble"),  # 2 (DSL) and 0 (driver) are tiled, 3 im2col; 5 means nothing
    (lambda w: w & ~0x70 | 5 << 4, "rank 6"),
    (lambda w: w & ~(0xF << 7) | 14 << 7, "element type code 14"),
    (lambda w: w | 1 << 16, "tf32 flag set"),  # with f16
    (lambda w: w | 3 << 11, "interleave field value 3"),
    (lambda w: w | 1 << 22, "96B-swizzle bit"),  # with 128B
])
def test_decode_rejects_meaningless_values(change, match):
    with pytest.raises(ValueError, match=match):
        T.decode(with_word(T.encode(f16_map()), 0x08, change))


def test_decode_and_encode_reject_bad_input():
    with pytest.raises(ValueError, match="128 bytes"):
        T.decode(bytes(64))
    with pytest.raises(TypeError, match="bytes"):
        T.decode("abc")
    raw = bytearray(T.encode(f16_map()))
    raw[0] |= 8
    with pytest.raises(ValueError, match="16-byte aligned"):
        T.decode(bytes(raw))
    with pytest.raises(TypeError, match="TensorMap"):
        T.encode(b"x" * 128)
    with pytest.raises(ValueError, match="box_dim\\[1\\] must be in \\[1, 256\\]"):
        T.TensorMap(BASE, "f16", (64, 64), (128,), (64, 257))
    with pytest.raises(ValueError, match="global_stride must have 1 entries"):
        T.TensorMap(BASE, "f16", (64, 64), (), (64, 64))
    with pytest.raises(ValueError, match="multiple of 16"):
        T.TensorMap(BASE, "f16", (64, 64), (120,), (64, 64))
    with pytest.raises(ValueError, match="elemtype must be one of"):
        T.TensorMap(BASE, "f8", (64, 64), (128,), (64, 64))
    with pytest.raises(ValueError, match="1..5 entries"):
        T.TensorMap(BASE, "u8", (2,) * 6, (16,) * 5, (1,) * 6)


# ---------------------------------------------------------------------------
# tensormap.replace
# ---------------------------------------------------------------------------

# What ptxas 13.0 emits for tensormap.replace.tile.<field>.shared::cta (nvdisasm of sm_90a / sm_100a):
# (field, ordinal, new_val) -> {byte offset of a 32-bit word: its value}, starting from an all-zero map.
PTXAS = [
    ("rank", None, 3, {0x08: 3 << 4}),
    ("box_dim", 0, 256, {0x34: 0xFF << 24}),
    ("box_dim", 3, 5, {0x38: 4 << 16}),
    ("global_dim", 4, 1000, {0x30: 999}),
    ("global_stride", 2, (5 << 36) | 0x4560, {0x14: 0x456, 0x1C: 5 << 8}),
    ("element_stride", 4, 8, {0x34: 7 << 12}),
    ("elemtype", None, 10, {0x08: 10 << 7}),
    ("elemtype", None, 11, {0x08: 1 << 16 | 7 << 7}),
    ("elemtype", None, 12, {0x08: 1 << 16 | 8 << 7}),
    ("elemtype", None, 15, {0x08: 13 << 7}),
    ("interleave_layout", None, 2, {0x08: 2 << 11}),
    ("swizzle_mode", None, 3, {0x08: 3 << 13}),
    ("swizzle_mode", None, 4, {0x08: 1 << 22}),
    ("swizzle_atomicity", None, 3, {0x08: 3 << 19}),
    ("fill_mode", None, 1, {0x08: 1 << 15}),
]


@pytest.mark.parametrize("field,ordinal,value,words", PTXAS)
def test_replace_writes_the_bits_ptxas_writes(field, ordinal, value, words):
    raw = T.replace(bytes(128), field, ordinal, value)
    got = {off: struct.unpack_from("<I", raw, off)[0] for off in range(0, 128, 4)}
    assert {k: v for k, v in got.items() if v} == words


def test_replace_side_effects_follow_ptxas():
    raw = T.encode(f16_map(big_extent=True))
    # .swizzle_mode clears the 96B bit and back
    r96 = T.replace(raw, "swizzle_mode", None, 4)
    assert T.decode(r96).swizzle == "96B"
    assert T.decode(T.replace(r96, "swizzle_mode", None, 1)).swizzle == "32B"
    # .swizzle_atomicity's mask covers bit 21 (the DSL's extent flag)
    assert T.decode(T.replace(raw, "swizzle_atomicity", None, 1)) == f16_map(swizzle_atomicity="32B")
    # .elemtype to a non-tf32 type leaves the tf32 flag: tf32 -> f16 is no type the map can mean
    tf32 = T.replace(raw, "elemtype", None, 11)
    assert T.decode(tf32).elemtype == "tf32"
    assert T.decode(T.replace(tf32, "elemtype", None, 7)).elemtype == "tf32"
    with pytest.raises(ValueError, match="tf32 flag set"):
        T.decode(T.replace(tf32, "elemtype", None, 6))


def test_replace_round_trips_every_field():
    raw = T.encode(f16_map())
    raw = T.replace(raw, "rank", None, 2)
    for field, ordinal, value in [("global_address", None, 0xABC0), ("global_dim", 2, 9), ("global_stride", 1, 1 << 38),
                                  ("box_dim", 2, 3), ("element_stride", 1, 2), ("fill_mode", None, 1),
                                  ("elemtype", None, 7), ("swizzle_mode", None, 2)]:
        raw = T.replace(raw, field, ordinal, value)
    assert T.decode(raw) == T.TensorMap(0xABC0, "f32", (200, 100, 9), (400, 1 << 38), (64, 64, 3),
                                        element_stride=(1, 2, 1), swizzle="64B", fill="nan")


def test_replace_matches_the_dsls_map_of_the_new_tensor():
    # chapter 08's device-side update: a map's address, dims and strides replaced with another tensor's
    a = torch.zeros(100, 200, dtype=torch.float16)
    b = torch.zeros(80, 136, dtype=torch.float16)[:, :120]
    raw_a, raw_b = capture(a, (64, 64), 3), capture(b, (64, 64), 3)
    raw = T.replace(raw_a, "global_address", None, b.data_ptr())
    raw = T.replace(raw, "global_dim", 0, 120)
    raw = T.replace(raw, "global_dim", 1, 80)
    raw = T.replace(raw, "global_stride", 0, 272)
    assert raw[:64] == raw_b[:64]


@pytest.mark.parametrize("args,match", [
    (("box", 0, 1), "no field 'box'"),
    (("box_dim", None, 1), "takes an ordinal"),
    (("rank", 0, 1), "takes no ordinal"),
    (("box_dim", 5, 1), "ordinal of .box_dim must be in \\[0, 4\\]"),
    (("global_stride", 4, 16), "ordinal of .global_stride must be in \\[0, 3\\]"),
    (("box_dim", 0, 257), "box_dim\\[0\\] must be in \\[1, 256\\]"),
    (("element_stride", 1, 9), "must be in \\[1, 8\\]"),
    (("global_dim", 1, 0), "must be in \\[1, 4294967296\\]"),
    (("global_stride", 0, 24), "multiple of 16"),
    (("global_stride", 0, 1 << 40), "must be in"),
    (("global_address", None, 0x1008), "16-byte aligned"),
    (("rank", None, 5), "rank - 1"),
    (("fill_mode", None, 2), "fill_mode must be in \\[0, 1\\]"),
    (("swizzle_mode", None, 5), "must be in \\[0, 4\\]"),
    (("swizzle_atomicity", None, 4), "must be in \\[0, 3\\]"),
    (("interleave_layout", None, 3), "must be in \\[0, 2\\]"),
    (("elemtype", None, 16), "must be in \\[0, 15\\]"),
])
def test_replace_errors(args, match):
    with pytest.raises(ValueError, match=match):
        T.replace(T.encode(f16_map()), *args)


def test_replace_arch_rules():
    raw = T.encode(f16_map())
    with pytest.raises(ValueError, match="not supported on sm_90a"):
        T.replace(raw, "swizzle_atomicity", None, 1, arch="sm_90a")
    with pytest.raises(ValueError, match="sub-byte"):
        T.replace(raw, "elemtype", None, 13, arch="sm_90a")
    with pytest.raises(ValueError, match="96B"):
        T.replace(raw, "swizzle_mode", None, 4, arch="sm_100a")
    T.replace(raw, "swizzle_atomicity", None, 1, arch="sm_100a")
    T.replace(raw, "swizzle_mode", None, 4, arch="sm_103a")


# ---------------------------------------------------------------------------
# The TMA unit
# ---------------------------------------------------------------------------


class Memory:
    """Global memory: a byte array at BASE; reads and writes outside it raise; calls are recorded."""

    def __init__(self, data: np.ndarray):
        self.data = np.ascontiguousarray(data).view(np.uint8).ravel().copy()
        self.reads, self.writes = [], []

    def _span(self, addr, n):
        lo = addr - BASE
        if lo < 0 or lo + n > self.data.size or n <= 0:
            raise IndexError(f"global access [{addr:#x}, +{n}) outside the tensor")
        return lo

    def read(self, addr, n):
        lo = self._span(addr, n)
        self.reads.append((addr, n))
        return self.data[lo:lo + n].tobytes()

    def write(self, addr, data):
        lo = self._span(addr, len(data))
        self.writes.append((addr, len(data)))
        self.data[lo:lo + len(data)] = np.frombuffer(data, dtype=np.uint8)


def mat(rows, cols, dtype=np.uint8):
    """A rows x cols matrix whose every element is distinct (mod the type)."""
    return (np.arange(rows * cols) % 251 + 1).astype(dtype).reshape(rows, cols)


def u8_map(rows, cols, box, **kw):
    return T.TensorMap(BASE, "u8", (cols, rows), (cols,), (box[1], box[0]), **kw)


def test_load_in_bounds_and_batched_reads():
    a = mat(4, 32)
    m = Memory(a)
    out = T.load_tile(u8_map(4, 32, (2, 16)), (16, 1), m.read)
    assert (out.reshape(2, 16) == a[1:3, 16:32]).all()
    assert m.reads == [(BASE + 48, 16), (BASE + 80, 16)]  # rows are not contiguous: two reads
    m.reads.clear()
    out = T.load_tile(u8_map(4, 32, (3, 32)), (0, 1), m.read)
    assert (out.reshape(3, 32) == a[1:4]).all() and m.reads == [(BASE + 32, 96)]  # one run


def test_load_out_of_bounds_past_the_end_and_negative():
    a = mat(4, 32)
    m = Memory(a)
    tm = u8_map(4, 32, (2, 32))
    out = T.load_tile(tm, (16, 3), m.read).reshape(2, 32)
    assert (out[0, :16] == a[3, 16:]).all() and not out[0, 16:].any() and not out[1].any()
    out = T.load_tile(tm, (-16, -1), m.read).reshape(2, 32)
    assert not out[0].any() and not out[1, :16].any() and (out[1, 16:] == a[0, :16]).all()
    m.reads.clear()
    assert not T.load_tile(tm, (32, 0), m.read).any() and not T.load_tile(tm, (0, -2), m.read).any()
    assert not T.load_tile(tm, (-32, 0), m.read).any() and m.reads == []
    assert T.tile_bytes(tm) == 64  # the full box, in bounds or not


@pytest.mark.parametrize("elemtype, coord", [("u8", 8), ("u8", -8), ("u8", 250), ("bf16", 150), ("f32", 2),
                                             ("f16", 4)])
def test_an_innermost_coordinate_off_16_bytes_is_refused_like_the_gpu(elemtype, coord):
    # the H100 raised 'illegal instruction' for these offsets (benchmarks/emulator_tma_check.py, 2026-11-26)
    eb = T.ELEMTYPE[elemtype].bits // 8
    tm = T.TensorMap(BASE, elemtype, (512 // eb, 8), (512,), (16 // eb, 4))
    mem = Memory(np.zeros(4096, np.uint8))
    with pytest.raises(ValueError, match="multiple of 16 bytes"):
        T.load_tile(tm, (coord, 0), mem.read)
    with pytest.raises(ValueError, match="illegal instruction"):
        T.store_tile(tm, (coord, 0), np.zeros(T.smem_span(tm), np.uint8), mem.write)
    T.load_tile(tm, (coord - coord % (16 // eb), 0), mem.read)  # the 16-byte multiple below is fine


def test_load_element_strides():
    a = mat(10, 16)
    m = Memory(a)
    tm = T.TensorMap(BASE, "u8", (16, 10), (16,), (16, 4), element_stride=(1, 2))
    assert T.tile_bytes(tm) == 32  # ceil(4 / 2) rows
    assert (T.load_tile(tm, (0, 3), m.read).reshape(2, 16) == a[[3, 5]]).all()
    tm3 = T.TensorMap(BASE, "u8", (16, 10), (16,), (16, 4), element_stride=(1, 3))
    out = T.load_tile(tm3, (0, 7), m.read).reshape(2, 16)  # rows 7 and 10 (past the end)
    assert (out[0] == a[7]).all() and not out[1].any()
    # dimension 0's element stride is ignored (driver docs)
    tm0 = T.TensorMap(BASE, "u8", (16, 10), (16,), (16, 2), element_stride=(4, 1))
    assert (T.load_tile(tm0, (0, 0), m.read).reshape(2, 16) == a[:2]).all()


@pytest.mark.parametrize("mode,row_bytes", [("32B", 32), ("64B", 64), ("128B", 128)])
def test_swizzle_matches_the_course_model(mode, row_bytes):
    from gemmlab import swizzle

    a = mat(40, 96, np.uint16)  # f16-sized elements
    m = Memory(a)
    cols = row_bytes // 2
    tm = T.TensorMap(BASE, "f16", (96, 40), (192,), (cols, 16), swizzle=mode)
    for coords in ((0, 0), (32, 8), (80, 30), (-8, -3)):
        box = np.zeros((16, cols), dtype=np.uint16)
        r0, c0 = coords[1], coords[0]
        for r in range(16):
            for c in range(cols):
                if 0 <= r0 + r < 40 and 0 <= c0 + c < 96:
                    box[r, c] = a[r0 + r, c0 + c]
        want = swizzle.expected_smem(box.view(np.uint8), mode)
        assert (T.load_tile(tm, coords, m.read) == want).all()


def test_rows_shorter_than_the_swizzle_span_measured_on_h200():
    # 16 x 32 FP16 box, 128B swizzle: row r, chunk c -> line r, 16-byte group c ^ (r & 7); 2048 bytes spanned
    a = mat(16, 32, np.uint16)
    m = Memory(a)
    tm = T.TensorMap(BASE, "f16", (32, 16), (64,), (32, 16), swizzle="128B")
    assert (T.tile_bytes(tm), T.smem_span(tm)) == (1024, 2048)
    poison = np.full(2048, 0xA5, dtype=np.uint8)
    out = T.load_tile(tm, (0, 0), m.read, into=poison)
    lines = out.reshape(16, 8, 16)
    rows = a.view(np.uint8).reshape(16, 4, 16)
    for r in range(16):
        groups = [c ^ (r & 7) for c in range(4)]
        for c in range(4):
            assert (lines[r, groups[c]] == rows[r, c]).all()
        assert (lines[r, [g for g in range(8) if g not in groups]] == 0xA5).all()  # never written
    assert not T.load_tile(tm, (0, 0), m.read).reshape(16, 8, 16)[0, 4:].any()  # no into: zeros
    # the same rule for 64B swizzle with 32-byte rows: rows 64 bytes apart
    tm64 = T.TensorMap(BASE, "f16", (32, 16), (64,), (16, 8), swizzle="64B")
    assert (T.tile_bytes(tm64), T.smem_span(tm64)) == (256, 512)


def test_swizzle_base_offset_from_the_shared_memory_address():
    # PTX ISA 5.5.7: not at a 1024-byte boundary, the pattern starts at (dstMem / 128) % 8
    a = mat(8, 64, np.uint16)
    m = Memory(a)
    tm = T.TensorMap(BASE, "f16", (64, 8), (128,), (64, 8), swizzle="128B")
    out = T.load_tile(tm, (0, 0), m.read, smem_addr=1024 + 384).reshape(8, 8, 16)
    rows = a.view(np.uint8).reshape(8, 8, 16)
    for r in range(8):
        for c in range(8):
            assert (out[r, c ^ ((r + 3) & 7)] == rows[r, c]).all()
    # the pattern depends on the address mod 1024 only
    assert (T.load_tile(tm, (0, 0), m.read, smem_addr=384) == out.ravel()).all()


def test_swizzle_atomicity_sub_modes_follow_the_isa_tables():
    a = mat(2, 128)  # 2 lines of 128 bytes: units of 16 bytes numbered 0..7 per line
    m = Memory(a)
    src = a.reshape(2, 8, 16)
    for atom, line1 in (("32B", [2, 3, 0, 1, 6, 7, 4, 5]), ("64B", [4, 5, 6, 7, 0, 1, 2, 3])):
        tm = T.TensorMap(BASE, "u8", (128, 2), (128,), (128, 2), swizzle="128B", swizzle_atomicity=atom)
        out = T.load_tile(tm, (0, 0), m.read).reshape(2, 8, 16)
        assert (out[0] == src[0]).all()
        assert all((out[1, j] == src[1, line1[j]]).all() for j in range(8))
    tm = T.TensorMap(BASE, "u8", (128, 2), (128,), (128, 2), swizzle="128B", swizzle_atomicity="32B_flip8B")
    out = T.load_tile(tm, (0, 0), m.read).reshape(2, 8, 2, 8)
    assert (out[0] == a.reshape(2, 8, 2, 8)[0]).all()
    flipped = a.reshape(2, 8, 2, 8)[1][[2, 3, 0, 1, 6, 7, 4, 5]][:, ::-1]
    assert (out[1] == flipped).all()


def reference_load(tm, coords, a: np.ndarray, smem_addr=0):
    """Element by element, independent of the module: box element -> logical byte -> swizzled byte."""
    from gemmlab import swizzle

    eb = a.itemsize
    flat = a.view(np.uint8).ravel()
    counts = [tm.box_dim[0]] + [-(-b // s) for b, s in zip(tm.box_dim[1:], tm.element_stride[1:])]
    row_bytes = tm.box_dim[0] * eb
    pitch = max(row_bytes, T.SWIZZLE_SPAN[tm.swizzle] or 0)
    rows = int(np.prod(counts[1:])) if tm.rank > 1 else 1
    out = np.zeros(rows * pitch, dtype=np.uint8)
    for row in range(rows):
        k, rest = [], row
        for d in range(1, tm.rank):
            k.append(rest % counts[d])
            rest //= counts[d]
        pos = [coords[d] + k[d - 1] * tm.element_stride[d] for d in range(1, tm.rank)]
        for e in range(tm.box_dim[0]):
            p = [coords[0] + e] + pos
            if all(0 <= p[d] < tm.global_dim[d] for d in range(tm.rank)):
                off = p[0] * eb + sum(p[d] * tm.global_stride[d - 1] for d in range(1, tm.rank))
                for byte in range(eb):
                    logical = row * pitch + e * eb + byte
                    phys = swizzle.swizzle_offset(tm.swizzle, smem_addr + logical) - smem_addr
                    out[phys] = flat[off + byte]
    return out


@pytest.mark.parametrize("seed", range(20))
def test_load_and_store_against_an_element_by_element_reference(seed):
    rng = np.random.default_rng(seed)
    rank = 1 + seed % 5
    np_t, name = [(np.uint8, "u8"), (np.uint16, "f16"), (np.uint32, "f32"), (np.uint64, "f64")][seed % 4]
    eb = np.dtype(np_t).itemsize
    swz = ["none", "32B", "64B", "128B"][int(rng.integers(0, 4))]
    span = T.SWIZZLE_SPAN[swz] or 64
    inner = int(rng.choice([16, 32, 64][:1 + [16, 32, 64].index(min(span, 64))]))  # row bytes <= span
    box0 = inner // eb
    dims = [int(rng.integers(box0 // 2 + 1, 3 * box0))] + [int(rng.integers(1, 6)) for _ in range(rank - 1)]
    pad = int(rng.integers(0, 3)) * 16 // eb
    shape_elems = [-(-dims[0] * eb // 16) * 16 // eb + pad]  # rows padded to 16 bytes (TMA strides), maybe more
    strides = []
    for d in dims[1:]:
        strides.append(int(np.prod(shape_elems)) * eb)
        shape_elems.append(d)
    a = (rng.integers(1, 255, size=int(np.prod(shape_elems)) * eb, dtype=np.uint8)).view(np_t)
    box = [box0] + [int(rng.integers(1, 5)) for _ in range(rank - 1)]
    es = [1] + [int(rng.integers(1, 4)) for _ in range(rank - 1)]
    tm = T.TensorMap(BASE, name, tuple(dims), tuple(strides), tuple(box), element_stride=tuple(es), swizzle=swz)
    m = Memory(a)
    smem_addr = 128 * int(rng.integers(0, 8))
    for _ in range(4):
        coords = [int(rng.integers(-box[d], dims[d] + 1)) for d in range(rank)]
        coords[0] -= coords[0] % (16 // eb)  # the innermost coordinate lands on 16 bytes (T.COORD_ALIGN)
        got = T.load_tile(tm, coords, m.read, smem_addr=smem_addr)
        assert (got == reference_load(tm, coords, a, smem_addr)).all(), (tm, coords)
        # store: what the load brought in goes back to exactly the in-bounds elements, nothing else
        if min(coords) < 0:  # a store may not start before the tensor (the GPU faults)
            with pytest.raises(ValueError, match="negative"):
                T.store_tile(tm, coords, got, Memory(np.zeros_like(a)).write, smem_addr=smem_addr)
            continue
        dst = Memory(np.zeros_like(a))
        n = T.store_tile(tm, coords, got, dst.write, smem_addr=smem_addr)
        back = Memory(dst.data)
        again = T.load_tile(tm, coords, back.read, smem_addr=smem_addr)
        assert (again == got).all()
        # every element is non-zero: the bytes written are exactly the in-bounds ones the load read
        assert n == np.count_nonzero(dst.data) == np.count_nonzero(got)


def test_store_skips_out_of_bounds_elements():
    a = mat(4, 32)
    tm = u8_map(4, 32, (2, 16))
    smem = np.arange(1, 33, dtype=np.uint8)
    dst = Memory(np.zeros((4, 32), np.uint8))
    assert T.store_tile(tm, (16, 3), smem, dst.write) == 16
    d = dst.data.reshape(4, 32)
    assert (d[3, 16:] == smem[:16]).all() and np.count_nonzero(d) == 16
    dst = Memory(np.zeros((4, 32), np.uint8))
    assert T.store_tile(tm, (32, 2), smem, dst.write) == 0  # past the end of every row
    assert T.store_tile(tm, (16, 4), smem, dst.write) == 0 and not dst.data.any()  # past the last row
    # before the start: the H100 faults (illegal instruction) where a load would fill
    for coords in [(-16, 3), (0, -1), (-32, -2)]:
        with pytest.raises(ValueError, match=r"coords\[\d\] is negative.*illegal instruction"):
            T.store_tile(tm, coords, smem, dst.write)
    assert not dst.data.any() and dst.writes == []
    assert T.store_tile(tm, (0, 4), smem, dst.write) == 0
    del a


def test_nan_fill_is_refused_until_measured(monkeypatch):
    a = mat(4, 32, np.uint16)
    m = Memory(a)
    tm = T.TensorMap(BASE, "f16", (32, 4), (64,), (16, 2), fill="nan")
    assert (T.load_tile(tm, (0, 0), m.read).view(np.uint16).reshape(2, 16) == a[:2, :16]).all()  # in bounds
    with pytest.raises(NotImplementedError, match="OOB-NaN"):
        T.load_tile(tm, (24, 0), m.read)
    monkeypatch.setitem(T.OOB_NAN_FILL, "f16", b"\xff\x7f")
    out = T.load_tile(tm, (24, 3), m.read).view(np.uint16).reshape(2, 16)
    assert (out[0, :8] == a[3, 24:]).all() and (out[0, 8:] == 0x7FFF).all() and (out[1] == 0x7FFF).all()


def test_sub_byte_packed_fp4_moves_bytes():
    a = mat(8, 64)  # 8 rows x 128 FP4 values
    m = Memory(a)
    tm = T.TensorMap(BASE, "b4x16", (128, 8), (64,), (64, 4))
    assert T.tile_bytes(tm) == 128
    out = T.load_tile(tm, (64, 2), m.read).reshape(4, 32)
    assert (out == a[2:6, 32:]).all()
    out = T.load_tile(tm, (96, 6), m.read).reshape(4, 32)
    assert (out[:2, :16] == a[6:, 48:]).all() and not out[:2, 16:].any() and not out[2:].any()
    with pytest.raises(NotImplementedError, match="inside a byte"):
        T.load_tile(tm, (1, 0), m.read)


def test_dsl_map_loads_a_real_tensor_like_the_course_model():
    from gemmlab import tma

    x = torch.arange(100 * 200, dtype=torch.int32).to(torch.float16).reshape(100, 200)
    tm = T.decode(capture(x, (64, 64), 3))
    want = tma.expected_raw(x, (64, 64), "128B")
    for i in range(2):
        for j in range(4):
            got = T.load_tile(tm, (64 * j, 64 * i), lambda addr, n: ctypes.string_at(addr, n))
            assert (got == want[i, j]).all()


def test_smem_address_rules():
    tm = f16_map()
    T.check_smem_address(tm, 0)
    T.check_smem_address(tm, 128 * 5)
    with pytest.raises(ValueError, match="128-byte aligned"):
        T.check_smem_address(tm, 64)
    with pytest.raises(ValueError, match="128-byte aligned"):
        T.load_tile(tm, (0, 0), lambda a, n: bytes(n), smem_addr=1040)
    with pytest.raises(TypeError):
        T.check_smem_address(tm, 1.0)


@pytest.mark.parametrize("tm,match", [
    (T.TensorMap(BASE, "f16", (64, 8), (128,), (128, 8), swizzle="128B"), "at most the swizzle span"),
    (T.TensorMap(BASE, "f16", (64, 8), (128,), (12, 8)), "multiple of 16 bytes"),
    (T.TensorMap(BASE, "u16", (64, 8), (128,), (16, 8), fill="nan"), "floating-point"),
    (T.TensorMap(BASE, "f16", (64, 8), (128,), (16, 8), swizzle="64B", swizzle_atomicity="32B"), "Table 14"),
    (T.TensorMap(BASE, "f16", (64, 8), (128,), (16, 8), interleave="16B"), "rank >= 3"),
    (T.TensorMap(BASE, "b4x16", (63, 8), (128,), (32, 8)), "even"),
])
def test_validate_driver_rules(tm, match):
    with pytest.raises(ValueError, match=match):
        T.validate(tm)
    with pytest.raises((ValueError, NotImplementedError)):
        T.load_tile(tm, (0,) * tm.rank, lambda a, n: bytes(n))


@pytest.mark.parametrize("kw,match", [
    ({"elemtype": "tf32"}, "convert"), ({"elemtype": "f32.ftz"}, "convert"),
    ({"elemtype": "b4x16_p64", "dims": (128, 8), "box": (128, 8)}, "padding"),
    ({"interleave": "16B", "rank3": True}, "interleaved"), ({"swizzle": "96B"}, "96B"),
])
def test_unmodelled_modes_stop_with_a_message(kw, match):
    dims, box = kw.pop("dims", (64, 8)), kw.pop("box", (16, 8))
    if kw.pop("rank3", False):
        tm = T.TensorMap(BASE, "f16", dims + (2,), (128, 1024), box + (1,), **kw)
    else:
        tm = T.TensorMap(BASE, kw.pop("elemtype", "f16"), dims, (128,), box, **kw)
    for fn in (lambda: T.load_tile(tm, (0,) * tm.rank, lambda a, n: bytes(n)), lambda: T.tile_bytes(tm),
               lambda: T.store_tile(tm, (0,) * tm.rank, bytes(4096), lambda a, d: None)):
        with pytest.raises(NotImplementedError, match=match):
            fn()


def test_bad_tma_arguments():
    tm = u8_map(4, 32, (2, 16))
    m = Memory(mat(4, 32))
    with pytest.raises(ValueError, match="takes 2 coordinates"):
        T.load_tile(tm, (0,), m.read)
    with pytest.raises(ValueError, match="coords\\[1\\]"):
        T.load_tile(tm, (0, 2 ** 31), m.read)
    with pytest.raises(TypeError, match="TensorMap"):
        T.load_tile(T.encode(tm), (0, 0), m.read)
    with pytest.raises(ValueError, match="returned 3 bytes"):
        T.load_tile(tm, (0, 0), lambda a, n: b"abc")
    with pytest.raises(ValueError, match="into must hold"):
        T.load_tile(tm, (0, 0), m.read, into=bytes(8))
    with pytest.raises(ValueError, match="smem_bytes must hold"):
        T.store_tile(tm, (0, 0), bytes(8), m.write)
    with pytest.raises(IndexError):  # a map larger than the memory behind it: the reader's error propagates
        T.load_tile(T.TensorMap(BASE, "u8", (32, 8), (32,), (16, 2)), (0, 6), m.read)


def test_the_course_blackwell_kernels_maps_decode_and_their_tile_bytes_add_up():
    """Chapters 10 and 11: every map decodes; the loads' tile_bytes sum to the kernels' expect_tx constants."""
    import cuda.bindings.driver as cuda
    from cutlass.cute.runtime import from_dlpack

    import gemmlab.kernels.dual_gemm_sm100 as dual
    from gemmlab.emulator.host import capture_launches
    from gemmlab.family.configs import Sm100Config
    from gemmlab.kernels.gemm_sm100 import compile_gemm_sm100

    def maps(compiled, tensors):
        (launch,) = capture_launches(compiled, *[from_dlpack(t, assumed_align=16) for t in tensors], cuda.CUstream(0))
        return [T.decode(p) for p in launch.params if len(p) == T.MAP_BYTES]

    cfg = Sm100Config(block_n=256, ab_stages=4, num_sms=4)
    a, b, c = (torch.zeros(256, 256, dtype=torch.bfloat16) for _ in range(3))
    ma, mb, mc = maps(compile_gemm_sm100("sm_100a", cfg, 256, 256, 256), (a, b.t(), c))
    assert (ma.global_address, mb.global_address, mc.global_address) == (a.data_ptr(), b.data_ptr(), c.data_ptr())
    assert ma.swizzle == mb.swizzle == "128B" and ma.box_dim == (64, 128)
    assert 2 * (T.tile_bytes(ma) + T.tile_bytes(mb)) == cfg.tx_bytes  # the CTA pair's stage, on the leader

    fp4 = dual.fp4
    m, n, k = 256, 256, 512
    sf = [fp4.ATOM_BYTES * fp4.ceil_div(rows, fp4.ATOM_MN) * fp4.ceil_div(k // fp4.SF_VEC, fp4.ATOM_K)
          for rows in (m, n, n)]
    ops = ([torch.zeros(m, k // 2, dtype=torch.uint8)] + [torch.zeros(n, k // 2, dtype=torch.uint8)] * 2
           + [torch.zeros(s, dtype=torch.uint8) for s in sf] + [torch.zeros(m, n, dtype=torch.float16)])
    got = maps(dual.compile_dual_sm100("sm_100a", None, m, n, k), ops)
    assert [x.elemtype for x in got] == ["b4x16"] * 3 + ["u16"] * 3 + ["f16"]
    assert sum(T.tile_bytes(x) for x in got[:6]) == dual.DualSm100Config().tx_bytes


# ---------------------------------------------------------------------------
# benchmarks/emulator_tma_check.py's verdicts (the GPU run's rows, judged on any machine)
# ---------------------------------------------------------------------------


def _tma_check():
    import importlib.util
    import sys
    from pathlib import Path

    name = "emulator_tma_check"
    if name not in sys.modules:
        path = Path(__file__).resolve().parents[1] / "benchmarks" / f"{name}.py"
        spec = importlib.util.spec_from_file_location(name, path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
    return sys.modules[name]


def _row_a(driver_bits, fields=(), dsl_ok=True):
    return {"part": "a", "case": "f16 2-D 128B", "dsl": {"ok": dsl_ok, "fields": [], "bits_vs_model": []},
            "driver": {"fields": list(fields), "bits_vs_model": list(driver_bits)},
            "dsl_bytes_0_63_eq_driver": not driver_bits, "driver_bits_vs_dsl": list(driver_bits)}


def test_tma_check_passes_only_the_named_driver_differences():
    m = _tma_check()
    for bits, fields, ok in [([], [], True), (["0x08.b1=0"], [], True),
                             (["0x08.b1=0", "0x08.b21=0"], ["big_extent: False != True"], True),
                             (["0x08.b2=1"], [], False),  # any other bit is a failure
                             (["0x08.b1=0"], ["swizzle: '64B' != '128B'"], False)]:
        row = _row_a(bits, fields)
        m.verdict_a(row, 9)
        assert row["ok"] is ok, (bits, fields)
        assert row.get("known", []) == sorted({b.split("=")[0] for b in bits} & set(m.KNOWN_DRIVER_DIFFERENCES))
    row = _row_a([], dsl_ok=False)
    m.verdict_a(row, 9)
    assert row["ok"] is False


def test_tma_check_expects_refusals_of_sm100_features_only_on_hopper():
    m = _tma_check()
    err = "RuntimeError: cuTensorMapEncodeTiled failed: CUDA_ERROR_INVALID_VALUE"
    for case, major, ok in [("elemtype b4x16", 9, True), ("128B atomicity 64B", 9, True),
                            ("elemtype b4x16", 10, False), ("f32 rank 1", 9, False)]:
        row = {"part": "a", "case": case, "source": "driver", "error": err}
        m.verdict_a(row, major)
        assert row["ok"] is ok, (case, major)


def test_tma_check_rows_after_a_lost_context_are_not_run():
    m = _tma_check()
    fault = "AcceleratorError: CUDA error: an illegal instruction was encountered"
    rows = [{"part": "b", "case": "c0", "ok": True, "mismatched_bytes": 0},
            {"part": "b", "case": "c1", "coords": [56, 60], "ok": False, "error": fault},
            {"part": "b", "case": "c2", "coords": [0, 0], "ok": False, "error": fault, "trace": "..."},
            {"part": "b", "case": "sm100 only", "ok": True, "note": "not run: sm_100 only"}]
    out = m.reclassify_rows(rows, 9)
    assert [r["ok"] for r in out] == [True, False, None, True]
    assert "'c1' at [56, 60]" in out[2]["note"] and out[2]["error_after_fault"].startswith("AcceleratorError")
    meta = m.summary(out, "m")
    assert (meta["passed"], meta["failed"], meta["not_run"]) == (2, 1, 1)

    # rows a fresh process ran after the fault are its own results, not casualties of the lost context
    fresh = dict(rows[2], process=1)
    out = m.reclassify_rows(rows[:2] + [fresh], 9)
    assert out[2]["ok"] is False and "note" not in out[2] and out[2]["error"] == fault


def test_tma_check_goes_on_in_a_fresh_process_after_a_fault(monkeypatch):
    import torch

    m = _tma_check()
    fault = "AcceleratorError: CUDA error: an illegal instruction was encountered"
    ran = []

    def case(name, error=None):
        def fn(gpu, c, seed):
            ran.append(name)
            return [{"part": "b", "case": name, "ok": error is None, **({"error": error} if error else {})}]
        return (fn, None, 0)

    work = [case("w0"), case("w1", fault), case("w2"), case("w3")]
    children = []

    def child(start, restarts, fault_row, names):
        children.append((start, restarts, fault_row["case"], names))
        return [{"part": "b", "case": n, "ok": True, "process": restarts} for n in names]

    monkeypatch.setattr(m, "_work", lambda major: work)
    monkeypatch.setattr(m, "Gpu", lambda: None)
    monkeypatch.setattr(m, "_continue_in_child", child)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    rows = m.part_b()
    assert ran == ["w0", "w1"]  # nothing more launches in the faulted process
    assert children == [(2, 1, "w1", ["expect_tx = smem_span"] * 2)]
    assert [r["ok"] for r in rows] == [True, False, True, True]
    monkeypatch.setattr(m, "MAX_RESTARTS", 0)
    rows = m.part_b()
    assert [r["ok"] for r in rows] == [True, False, None, None, True]
    assert rows[-1]["note"].startswith("not run: sm_100 only")


def test_tma_check_expects_a_fault_where_the_model_refuses_the_coordinate():
    m = _tma_check()
    tm = T.tiled_map(0, "u8", (64, 64), (64,), (16, 8), swizzle="32B")
    assert m._model_refusal(tm, (48, 60)) is None
    refusal = m._model_refusal(tm, (8, 0))
    assert "multiple of 16 bytes" in refusal

    def fault():
        raise RuntimeError("AcceleratorError: CUDA error: an illegal instruction was encountered")

    row = m._expect_fault({"part": "b", "case": "c"}, refusal, fault)
    assert row["ok"] is True and m._lost_context(row)  # agreed, and the next case needs a fresh process
    row = m._expect_fault({"part": "b", "case": "c"}, refusal, lambda: None)
    assert row["ok"] is False and "completed a copy the model refuses" in row["error"]
