"""Chapter 04: TMA, the tensor form of the bulk copy.

What it teaches
    ``cp.async.bulk`` (chapter 03) copies a run of contiguous bytes. A GEMM
    wants a *tile*: ``rows`` x ``cols`` elements out of a larger row-major
    matrix, laid out in shared memory so that tensor cores read it without
    bank conflicts. The Tensor Memory Accelerator (TMA) does that with one
    instruction, ``cp.async.bulk.tensor``, driven by a **tensor map**: a
    128-byte descriptor, built on the host (``cuTensorMapEncodeTiled``), that
    holds the tensor's address, rank, extents and byte strides, the *box*
    (tile) size, element strides, interleave, the shared-memory **swizzle**,
    the L2 promotion and the out-of-bounds fill. The instruction then only
    names the descriptor, the tile's coordinates and the mbarrier.

    * The map travels as a ``__grid_constant__`` kernel parameter (a
      ``.param .align 64 .b8 [128]`` in PTX; the instruction takes its
      address in parameter space), and one warp prefetches it
      (``prefetch.tensormap``) so the first copy does not wait for it.
    * Loads (G -> S) complete on an mbarrier exactly like bulk loads:
      ``arrive.expect_tx(box bytes)``, then ``complete_tx`` as bytes land.
      Stores (S -> G) complete through bulk groups.
    * Tiles that hang over the edge of the tensor are legal: the load fills
      the missing elements with zeros (and still counts the full box bytes),
      the store writes only the elements inside the tensor.
    * Multicast (``.multicast::cluster``): one load lands in the shared
      memory of several CTAs of a cluster, signalling each one's mbarrier.
    * An L2 cache hint (``.L2::cache_hint``) carries a policy made by
      ``createpolicy``: e.g. evict-first for data read once.

What it adds over chapter 03
    Coordinates instead of addresses, 2-D boxes with hardware bounds
    handling, swizzled shared-memory layouts (modelled in
    :mod:`gemmlab.swizzle` and checked against the hardware here), multicast
    and cache policies. The copies are issued through the DSL's TMA atoms
    (``cpasync.make_tiled_tma_atom`` on the host builds the map from the
    global tensor and the shared-memory layout; ``cute.copy`` issues
    ``cp.async.bulk.tensor``); the mbarrier ops are the DSL's (chapter 02).

The kernels (2-D row-major tensors, static shapes)
    * :func:`roundtrip_kernel`: each CTA TMA-loads one box of ``src`` into
      swizzled shared memory, dumps the raw shared-memory bytes to ``raw``
      (to compare with the model), and TMA-stores the box into ``dst``.
    * :func:`multicast_kernel`: clusters of two CTAs; CTA 0 of each cluster
      issues one multicast load that fills both CTAs' shared memory; each
      CTA stores what it received.
"""
from __future__ import annotations

import functools

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Constexpr, Int16, Int64, Uint32
from cutlass.cute.nvgpu import cpasync
from cutlass.memory import SmemAllocator

from . import swizzle as swz
from .checks import check_choice, check_int, check_tensor
from .compile import check_target, compile_for, fake_stream, fake_tensor, launcher
from .tiers import require_tier

#: TMA's rules (CUDA driver, cuTensorMapEncodeTiled): 16-byte aligned base and strides,
#: at most 256 elements per box dimension, inner box a multiple of 16 bytes.
TMA_ALIGN = 16
MAX_BOX = 256
#: cuTensorMapEncodeTiled: every globalDim at most 2^32 elements, every globalStride below 2^40 bytes.
MAX_GLOBAL_DIM = 1 << 32
MAX_GLOBAL_STRIDE_BYTES = 1 << 40
THREADS = 128  # per CTA: warp 0 issues the copies, all four warps dump shared memory
CACHE_HINTS = (None, "evict_first", "evict_last")
#: Shared memory for one box: a 227 KiB block limit, minus room for the barrier.
MAX_TILE_BYTES = 200 * 1024

# torch dtype name -> (CuTe DSL type, CUtensorMapDataType name)
_DTYPES = {
    "uint8": (cutlass.Uint8, "UINT8"),
    "int8": (cutlass.Int8, "UINT8"),  # TMA moves bytes: signedness does not matter
    "float16": (cutlass.Float16, "FLOAT16"),
    "bfloat16": (cutlass.BFloat16, "BFLOAT16"),
    "int32": (cutlass.Int32, "INT32"),
    "float32": (cutlass.Float32, "FLOAT32"),
}
DTYPES = tuple(_DTYPES)


def _dtype_name(dtype) -> str:
    return str(dtype).replace("torch.", "")


def _elem_bytes(dtype) -> int:
    return _DTYPES[_dtype_name(dtype)][0].width // 8


def _check_dtype(name: str, dtype) -> str:
    d = _dtype_name(dtype)
    if d not in _DTYPES:
        raise TypeError(f"{name} must have a TMA-supported dtype ({', '.join(DTYPES)}); got {d}")
    return d


# ---------------------------------------------------------------------------
# The tensor map: what it holds, and the rules it must obey
# ---------------------------------------------------------------------------


def _check_whole(name: str, value, lo: int | None = None) -> None:
    """An int (numpy integers too) of at least ``lo``."""
    check_int(name, value, lo=lo)


def check_tma_box(shape, dtype, box, swizzle: str, *, strides=None, base_address: int = 0, name: str = "src",
                  short_rows: bool = False) -> None:
    """Raise ``TypeError``/``ValueError`` unless a 2-D row-major tensor and ``box`` make a valid tiled tensor map.

    ``shape`` = (rows, cols) of the tensor, ``strides`` its element strides
    (default: contiguous), ``box`` = (box rows, box cols). The rules are the
    driver's (``cuTensorMapEncodeTiled``) plus one of this chapter's kernels:

    * dtype: one TMA moves (see :data:`DTYPES`);
    * the innermost stride is 1 element; every other global stride and the
      base address are multiples of 16 bytes;
    * each box dimension is 1..256 elements, the inner one a multiple of 16 bytes;
    * with a swizzle, the inner box is at most the swizzle span (32/64/128 bytes);
      these kernels want exactly one span per row (the layout GEMMs use)
      unless ``short_rows``: a shorter row still takes a whole span of shared
      memory (:func:`gemmlab.swizzle.smem_bytes`), so a buffer sized by the
      box's bytes overflows. That is why a probe with 64-byte rows, the 128B
      swizzle and a buffer of the box's bytes faulted on an H200. Only
      :func:`tma_roundtrip` sizes its buffer by the footprint and passes
      ``short_rows=True``.
    """
    _check_dtype(name, dtype)
    eb = _elem_bytes(dtype)
    check_choice("swizzle", swizzle, swz.MODES)
    if not (isinstance(shape, (tuple, list)) and len(shape) == 2):
        raise ValueError(f"{name} must be 2-D (rows, cols); got shape {tuple(shape) if shape is not None else shape}")
    for i, e in enumerate(shape):
        _check_whole(f"{name}'s shape[{i}]", e, 1)
        if e > MAX_GLOBAL_DIM:
            raise ValueError(f"{name}'s shape[{i}] must be at most 2^32 elements (a tensor map's globalDim); got {e}")
    if strides is not None and not (isinstance(strides, (tuple, list)) and len(strides) == 2):
        raise ValueError(f"{name}'s strides must be a pair (row stride, 1) in elements; got {strides!r}")
    strides = tuple(strides) if strides is not None else (shape[1], 1)
    for i, st in enumerate(strides):
        _check_whole(f"{name}'s strides[{i}]", st, 0)
    _check_whole("base_address", base_address, 0)
    if strides[1] != 1:
        raise ValueError(f"{name} must have unit stride in its last dimension (TMA's innermost dimension); "
                         f"got strides {strides}")
    if shape[0] > 1 and strides[0] < shape[1]:
        raise ValueError(f"{name}'s row stride must be >= its row length ({shape[1]} elements), or rows overlap; "
                         f"got strides {strides}")
    if strides[0] * eb >= MAX_GLOBAL_STRIDE_BYTES:
        raise ValueError(f"{name}'s row stride must be below 2^40 bytes (a tensor map's globalStrides); "
                         f"got {strides[0]} elements = {strides[0] * eb} bytes")
    if (strides[0] * eb) % TMA_ALIGN:
        raise ValueError(f"{name}'s row stride must be a multiple of {TMA_ALIGN} bytes (TMA global strides); "
                         f"got {strides[0]} elements = {strides[0] * eb} bytes")
    if base_address % TMA_ALIGN:
        raise ValueError(f"{name} must start at a {TMA_ALIGN}-byte aligned address (TMA global address); "
                         f"its data pointer is {base_address % TMA_ALIGN} bytes past alignment")
    if not (isinstance(box, (tuple, list)) and len(box) == 2):
        raise ValueError(f"box must be a pair (box rows, box cols); got {box!r}")
    for i, b in enumerate(box):
        _check_whole(f"box[{i}]", b)
        if not 1 <= b <= MAX_BOX:
            raise ValueError(f"box[{i}] must be between 1 and {MAX_BOX} elements (TMA box limit); got {b}")
    inner = box[1] * eb
    if inner % TMA_ALIGN:
        raise ValueError(f"box[1] * element size must be a multiple of {TMA_ALIGN} bytes (TMA inner box); "
                         f"got {box[1]} x {eb} = {inner} bytes")
    span = swz.SPAN[swizzle]
    if span is not None and inner > span:
        raise ValueError(f"box[1] * element size must be <= {span} bytes for swizzle {swizzle} (the swizzle span); "
                         f"got {inner} bytes")
    if not isinstance(short_rows, bool):
        raise TypeError(f"short_rows must be a bool; got {type(short_rows).__name__}")
    if span is not None and inner != span and not short_rows:
        raise ValueError(f"box[1] * element size must equal the swizzle span ({span} bytes) for swizzle {swizzle} "
                         f"in these kernels (one span per row; a shorter row still takes {span} bytes of shared "
                         f"memory); got {inner} bytes")
    footprint = swz.smem_bytes(swizzle, box[0], inner)
    if footprint > MAX_TILE_BYTES:
        raise ValueError(f"box must fit in shared memory (<= {MAX_TILE_BYTES} bytes); got {footprint}")


def describe_tensor_map(shape, dtype, box, swizzle: str = "128B", *, strides=None, l2_promotion: str = "256B",
                        oob_fill: str = "none") -> dict:
    """The arguments of ``cuTensorMapEncodeTiled`` for a 2-D row-major tensor, as a readable dict.

    This is what a tensor map holds. The driver takes every list innermost
    dimension first, so ``globalDim`` is ``(cols, rows)``. ``globalStrides``
    has rank - 1 entries in bytes (the innermost stride is the element size,
    implied); ``elementStrides`` of 1 take every element; ``expect_tx_bytes``
    (not a field) is what one load of a box announces on its mbarrier, even
    for a box hanging over the edge.
    ``l2_promotion`` and ``oob_fill`` are the choices a hand-written encoder
    makes (DeepGEMM passes 256B and none); the DSL encodes its own map at launch.
    """
    check_tma_box(shape, dtype, box, swizzle, strides=strides)
    check_choice("l2_promotion", l2_promotion, ("none", "64B", "128B", "256B"))
    check_choice("oob_fill", oob_fill, ("none", "nan_request_zero_fma"))
    d = _dtype_name(dtype)
    eb = _elem_bytes(dtype)
    rows, cols = (int(e) for e in shape)
    box = tuple(int(b) for b in box)
    strides = tuple(int(st) for st in strides) if strides is not None else (cols, 1)
    return {
        "tensorDataType": f"CU_TENSOR_MAP_DATA_TYPE_{_DTYPES[d][1]}",
        "tensorRank": 2,
        "globalAddress": "16-byte aligned device pointer",
        "globalDim": (cols, rows),
        "globalStrides": (strides[0] * eb,),
        "boxDim": (box[1], box[0]),
        "elementStrides": (1, 1),
        "interleave": "CU_TENSOR_MAP_INTERLEAVE_NONE",
        "swizzle": f"CU_TENSOR_MAP_SWIZZLE_{swizzle.upper()}",
        "l2Promotion": "CU_TENSOR_MAP_L2_PROMOTION_" + ("NONE" if l2_promotion == "none" else f"L2_{l2_promotion}"),
        "oobFill": f"CU_TENSOR_MAP_FLOAT_OOB_FILL_{oob_fill.upper()}",
        "expect_tx_bytes": box[0] * box[1] * eb,
        "tiles": (-(-rows // box[0]), -(-cols // box[1])),
    }


def format_tensor_map(desc: dict) -> str:
    """:func:`describe_tensor_map`'s dict as aligned text."""
    w = max(len(k) for k in desc)
    return "\n".join(f"{k:<{w}}  {v}" for k, v in desc.items())


# ---------------------------------------------------------------------------
# Device code
# ---------------------------------------------------------------------------


def tile_smem_layout(rows: int, cols: int, swizzle: str):
    """The shared-memory layout of one box: row-major ``rows`` x ``cols``, composed with the swizzle.

    ``make_tiled_tma_atom`` reads the swizzle mode of the tensor map off this
    layout: ``Swizzle<3,4,3>`` -> 128B, ``<2,4,3>`` -> 64B, ``<1,4,3>`` -> 32B,
    ``<0,4,3>`` -> none (see :func:`gemmlab.swizzle.cute_swizzle`). The swizzle
    acts on byte addresses (it is attached to the shared-memory *pointer*), so
    the same ``<3,4,3>`` means 128B for every element type. Call inside ``@cute.jit``.
    """
    return cute.make_composed_layout(cute.make_swizzle(*swz.cute_swizzle(swizzle)), 0,
                                     cute.make_layout((rows, cols), stride=(cols, 1)))


def l2_cache_policy(hint: str) -> Int64:
    """``createpolicy.fractional.L2::<hint>.b64``: a 64-bit L2 cache policy for ``.L2::cache_hint`` copies.

    ``evict_first``: data read once (streamed operands), evicted before
    others; ``evict_last``: data re-read by many CTAs (kept longer). The
    fraction 1.0 applies the policy to every access that carries it.
    """
    check_choice("hint", hint, CACHE_HINTS[1:])
    return cute.arch.inline_ptx(
        "createpolicy.fractional.L2::%s.b64 {$w0}, 1.0;" % hint,
        write_only_types=[Int64],
    )


@cute.jit
def tma_load_tile(load_atom: cute.CopyAtom, g_tile: cute.Tensor, s_tile: cute.Tensor, bar,
                  cache_hint: Constexpr = None):
    """Issue one TMA load of ``g_tile`` (TMA coordinates of one box) into ``s_tile``, completing on ``bar``.

    Called by a whole warp: the DSL elects one lane to issue the instruction.
    """
    s_part, g_part = cpasync.tma_partition(load_atom, 0, cute.make_layout(1), cute.group_modes(s_tile, 0, 2),
                                           cute.group_modes(g_tile, 0, 2))
    if cutlass.const_expr(cache_hint is None):
        cute.copy(load_atom, g_part, s_part, tma_bar_ptr=bar)
    else:
        cute.copy(load_atom, g_part, s_part, tma_bar_ptr=bar, cache_policy=l2_cache_policy(cache_hint))


@cute.jit
def tma_store_tile(store_atom: cute.CopyAtom, s_tile: cute.Tensor, g_tile: cute.Tensor):
    """Issue one TMA store of ``s_tile`` into the box ``g_tile``, commit it, wait until it has read shared memory."""
    s_part, g_part = cpasync.tma_partition(store_atom, 0, cute.make_layout(1), cute.group_modes(s_tile, 0, 2),
                                           cute.group_modes(g_tile, 0, 2))
    # Unlike TMA loads, the DSL does not elect a lane for TMA stores: called by a
    # whole warp, every lane would issue the same store. One elected lane issues,
    # commits and waits (bulk groups are per thread, so the same lane must wait).
    with cute.arch.elect_one():
        cute.copy(store_atom, s_part, g_part)
        cute.arch.cp_async_bulk_commit_group()
        cute.arch.cp_async_bulk_wait_group(0, read=True)  # shared memory may be reused / freed after this


@cute.kernel
def roundtrip_kernel(load_atom: cute.CopyAtom, g_src: cute.Tensor, store_atom: cute.CopyAtom, g_dst: cute.Tensor,
                     raw: cute.Tensor, layout: cute.ComposedLayout, dtype: Constexpr, box: Constexpr,
                     cache_hint: Constexpr, footprint: Constexpr = None):
    """CTA (i, j): TMA-load box (i, j) of src, dump shared memory raw, TMA-store the box to dst.

    Roles: thread 0 owns the mbarrier; warp 0 prefetches the tensor maps and
    issues the copies; all warps dump the raw shared-memory words.
    ``footprint``: the box's bytes in shared memory when rows shorter than the
    swizzle span are padded to it (:func:`gemmlab.swizzle.smem_bytes`); the
    buffer and the dump cover it, while the mbarrier still expects the box's bytes.
    """
    tidx, _, _ = cute.arch.thread_idx()
    bi, bj, _ = cute.arch.block_idx()
    _, tiles_n, _ = cute.arch.grid_dim()
    warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
    tile_bytes = box[0] * box[1] * dtype.width // 8
    words = (tile_bytes if footprint is None else footprint) // 4

    smem = SmemAllocator()
    # 1024-byte alignment: the swizzle pattern repeats every 8 x 128 bytes, from an aligned base.
    buf = smem.allocate_array(Uint32, words, byte_alignment=swz.PATTERN_BYTES)
    full = smem.allocate_array(Int64, 1, byte_alignment=8)  # "the box has landed"
    s_tile = cute.make_tensor(cute.recast_ptr(buf, layout.inner, dtype=dtype), layout.outer)

    if warp == 0:
        cpasync.prefetch_descriptor(load_atom)  # prefetch.tensormap: the maps live in kernel parameters
        cpasync.prefetch_descriptor(store_atom)
    if tidx == 0:
        cute.arch.mbarrier_init(full, 1)
        cute.arch.mbarrier_init_fence()
    cute.arch.sync_threads()

    # Load: announce the box's bytes (the full box, even where it hangs over the edge), then copy.
    if tidx == 0:
        cute.arch.mbarrier_arrive_and_expect_tx(full, tile_bytes)
    if warp == 0:
        tma_load_tile(load_atom, cute.local_tile(g_src, box, (bi, bj)), s_tile, full, cache_hint)
    cute.arch.mbarrier_wait(full, 0)  # the async proxy's writes are now visible to every thread

    # Raw dump: the shared-memory words exactly as TMA left them (swizzled).
    raw_words = cute.make_tensor(buf, cute.make_layout(words))
    base = (bi * tiles_n + bj) * words
    for w in cutlass.range(tidx, words, THREADS):
        raw[base + w] = raw_words[w]

    # Store: only the async proxy wrote this buffer and the TMA store reads it: no proxy fence.
    if warp == 0:
        tma_store_tile(store_atom, s_tile, cute.local_tile(g_dst, box, (bi, bj)))


@functools.lru_cache(maxsize=None)
def _roundtrip_host(rows: int, cols: int, swizzle: str, cache_hint):
    @cute.jit
    def roundtrip_host(src: cute.Tensor, dst: cute.Tensor, raw: cute.Tensor, stream: cuda.CUstream):
        layout = tile_smem_layout(rows, cols, swizzle)
        # The tensor maps are encoded here, on the host, from the global tensor, the box and the layout.
        load_atom, g_src = cpasync.make_tiled_tma_atom(cpasync.CopyBulkTensorTileG2SOp(), src, layout, (rows, cols))
        store_atom, g_dst = cpasync.make_tiled_tma_atom(cpasync.CopyBulkTensorTileS2GOp(), dst, layout, (rows, cols))
        m, n = src.shape
        grid = ((m + rows - 1) // rows, (n + cols - 1) // cols, 1)
        footprint = swz.smem_bytes(swizzle, rows, cols * src.element_type.width // 8)
        roundtrip_kernel(load_atom, g_src, store_atom, g_dst, raw, layout, src.element_type, (rows, cols),
                         cache_hint, footprint).launch(grid=grid, block=(THREADS, 1, 1), stream=stream)

    return roundtrip_host


@cute.kernel
def multicast_kernel(load_atom: cute.CopyAtom, g_src: cute.Tensor, store_atom: cute.CopyAtom, g_dst: cute.Tensor,
                     layout: cute.ComposedLayout, dtype: Constexpr, box: Constexpr):
    """Clusters of 2: CTA 0 of cluster c multicasts box c of src into both CTAs; CTA r stores it as box 2c + r of dst.

    Each CTA expects the whole box on its own mbarrier (it receives all of it);
    the multicast signals the barrier at the same shared-memory offset in
    every destination CTA. Cluster barriers frame the exchange: before, so
    the peer's barrier is initialised before our copy signals it; after, so
    no CTA exits while a copy into its shared memory may be in flight.
    """
    tidx, _, _ = cute.arch.thread_idx()
    bid, _, _ = cute.arch.block_idx()
    rank = cute.arch.block_idx_in_cluster()
    warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
    tile_bytes = box[0] * box[1] * dtype.width // 8

    smem = SmemAllocator()
    buf = smem.allocate_array(Uint32, tile_bytes // 4, byte_alignment=swz.PATTERN_BYTES)
    full = smem.allocate_array(Int64, 1, byte_alignment=8)
    s_tile = cute.make_tensor(cute.recast_ptr(buf, layout.inner, dtype=dtype), layout.outer)

    if warp == 0:
        cpasync.prefetch_descriptor(load_atom)
        cpasync.prefetch_descriptor(store_atom)
    if tidx == 0:
        cute.arch.mbarrier_init(full, 1)
        cute.arch.mbarrier_init_fence()
    cute.arch.cluster_arrive()
    cute.arch.cluster_wait()

    if tidx == 0:
        cute.arch.mbarrier_arrive_and_expect_tx(full, tile_bytes)
    if rank == 0:
        if warp == 0:
            s_part, g_part = cpasync.tma_partition(load_atom, 0, cute.make_layout(1), cute.group_modes(s_tile, 0, 2),
                                                   cute.group_modes(cute.local_tile(g_src, box, (bid // 2, 0)), 0, 2))
            # Bit r of the mask: deliver to CTA r of the cluster.
            cute.copy(load_atom, g_part, s_part, tma_bar_ptr=full, mcast_mask=Int16(0b11))
    cute.arch.mbarrier_wait(full, 0)

    if warp == 0:
        tma_store_tile(store_atom, s_tile, cute.local_tile(g_dst, box, (bid, 0)))
    cute.arch.cluster_arrive()
    cute.arch.cluster_wait()


@functools.lru_cache(maxsize=None)
def _multicast_host(rows: int, cols: int, swizzle: str):
    @cute.jit
    def multicast_host(src: cute.Tensor, dst: cute.Tensor, stream: cuda.CUstream):
        layout = tile_smem_layout(rows, cols, swizzle)
        load_atom, g_src = cpasync.make_tiled_tma_atom(cpasync.CopyBulkTensorTileG2SMulticastOp(), src, layout,
                                                       (rows, cols))
        store_atom, g_dst = cpasync.make_tiled_tma_atom(cpasync.CopyBulkTensorTileS2GOp(), dst, layout, (rows, cols))
        clusters = src.shape[0] // rows
        multicast_kernel(load_atom, g_src, store_atom, g_dst, layout, src.element_type, (rows, cols)).launch(
            grid=(2 * clusters, 1, 1), block=(THREADS, 1, 1), cluster=(2, 1, 1), stream=stream)

    return multicast_host


# ---------------------------------------------------------------------------
# Host side: checks, launches, compile-only entry points
# ---------------------------------------------------------------------------

POISON_BYTE = 0x5A  # written into every output before a launch


def _check_src(name, t, box, swizzle, short_rows=False):
    import torch

    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor; got {type(t).__name__}")
    check_tma_box(tuple(t.shape), t.dtype, box, swizzle, strides=tuple(t.stride()) if t.dim() == 2 else None,
                  base_address=t.data_ptr(), name=name, short_rows=short_rows)


def tma_roundtrip(src, box=(64, 64), swizzle: str = "128B", *, out=None, cache_hint=None):
    """TMA-load every box of ``src`` into shared memory and TMA-store it to ``out``; return ``(out, raw)``.

    ``src``: a 2-D CUDA tensor, unit stride in the last dimension, row stride
    and address 16-byte aligned, any number of rows and columns (edge boxes
    hang over: zero-filled on load, clipped on store). ``out``: same shape
    and dtype (may be a strided view; default a new tensor filled with
    :data:`POISON_BYTE`). ``raw``: uint8 tensor ``(tiles_m, tiles_n, footprint)``,
    each box's shared memory exactly as TMA wrote it (swizzled). The footprint
    is the box's bytes, or more when its rows are shorter than the swizzle
    span (:func:`gemmlab.swizzle.smem_bytes`: each row takes a whole span;
    the padding bytes are whatever shared memory held).
    ``cache_hint``: None, ``"evict_first"`` or ``"evict_last"`` for the loads.
    """
    import torch

    _check_src("src", src, box, swizzle, short_rows=True)
    check_choice("cache_hint", cache_hint, CACHE_HINTS)
    if out is not None:
        _check_src("out", out, box, swizzle, short_rows=True)
        if out.shape != src.shape or out.dtype != src.dtype:
            raise ValueError(f"out must match src in shape and dtype; got {tuple(out.shape)} {out.dtype} "
                             f"and {tuple(src.shape)} {src.dtype}")
        check_tensor("out", out, contiguous=False)
    check_tensor("src", src, contiguous=False)
    require_tier("gpu", "gemmlab.tma.tma_roundtrip")
    if out is None:
        out = torch.empty(src.shape, dtype=src.dtype, device=src.device)
        out.view(torch.uint8).fill_(POISON_BYTE)
    tiles = (-(-src.shape[0] // box[0]), -(-src.shape[1] // box[1]))
    footprint = swz.smem_bytes(swizzle, box[0], box[1] * src.element_size())
    raw = torch.full((tiles[0] * tiles[1] * footprint // 4,), 0x5A5A5A5A, dtype=torch.int32, device=src.device)
    launcher(_roundtrip_host(box[0], box[1], swizzle, cache_hint), src, out, raw)()
    torch.cuda.synchronize()
    return out, raw.view(torch.uint8).view(tiles[0], tiles[1], footprint)


def load_tile_raw(src, box=(64, 64), swizzle: str = "128B"):
    """The shared-memory bytes (uint8, flat) TMA writes for box (0, 0) of ``src`` with ``swizzle``."""
    return tma_roundtrip(src, box, swizzle)[1][0, 0]


def expected_raw(src, box, swizzle: str):
    """The model's answer for :func:`tma_roundtrip`'s ``raw``: each box zero-padded, swizzled (numpy uint8).

    Where box rows are shorter than the swizzle span the padding holds 0 here; compare
    the hardware's bytes where :func:`gemmlab.swizzle.data_mask` is True.
    """
    import numpy as np
    import torch

    a = src.detach().cpu().contiguous()
    rows, cols = a.shape
    tiles = (-(-rows // box[0]), -(-cols // box[1]))
    padded = np.zeros((tiles[0] * box[0], tiles[1] * box[1] * a.element_size()), dtype=np.uint8)
    padded[:rows, :cols * a.element_size()] = a.view(-1).view(torch.uint8).numpy().reshape(rows, -1)
    row_bytes = box[1] * a.element_size()
    out = np.zeros((tiles[0], tiles[1], swz.smem_bytes(swizzle, box[0], row_bytes)), dtype=np.uint8)
    for i in range(tiles[0]):
        for j in range(tiles[1]):
            tile = padded[i * box[0]:(i + 1) * box[0], j * row_bytes:(j + 1) * row_bytes]
            out[i, j] = swz.expected_smem(tile, swizzle)
    return out


def multicast_demo(src, box=None, swizzle: str = "128B"):
    """Multicast each box-row block of ``src`` to both CTAs of a 2-CTA cluster; return what each CTA received.

    ``src``: 2-D CUDA tensor ``(clusters * box rows, box cols)`` (default box:
    ``(src rows, src cols)``, one cluster). Returns a tensor of shape
    ``(clusters, 2, box rows, box cols)``: ``[c, r]`` is the box CTA ``r`` of
    cluster ``c`` had in shared memory, stored back by TMA. Both must equal
    ``src``'s block ``c``.
    """
    import torch

    if not isinstance(src, torch.Tensor):
        raise TypeError(f"src must be a torch.Tensor; got {type(src).__name__}")
    if box is None:
        box = tuple(src.shape) if src.dim() == 2 else None
    _check_src("src", src, box, swizzle)
    if src.shape[0] % box[0] or src.shape[1] != box[1]:
        raise ValueError(f"src must be (clusters * box[0], box[1]) = (k * {box[0]}, {box[1]}); got {tuple(src.shape)}")
    if not src.is_contiguous():
        raise ValueError(f"src must be contiguous; got strides {tuple(src.stride())}")
    check_tensor("src", src, ndim=2)
    require_tier("gpu", "gemmlab.tma.multicast_demo")
    clusters = src.shape[0] // box[0]
    out = torch.empty((2 * src.shape[0], src.shape[1]), dtype=src.dtype, device=src.device)
    out.view(torch.uint8).fill_(POISON_BYTE)
    launcher(_multicast_host(box[0], box[1], swizzle), src, out)()
    torch.cuda.synchronize()
    return out.view(clusters, 2, box[0], box[1])


def _fake_2d(dtype, shape):
    d = _check_dtype("dtype", dtype)
    return fake_tensor(_DTYPES[d][0], shape, stride_order=(1, 0))


def compile_roundtrip(target: str = "sm_90a", shape=(100, 200), dtype="float16", box=(64, 64), swizzle: str = "128B",
                      cache_hint=None):
    """Compile :func:`roundtrip_kernel` for ``target`` (no GPU needed); ``dtype`` a torch dtype or its name."""
    check_target(target)
    check_tma_box(tuple(shape), dtype, box, swizzle, short_rows=True)
    check_choice("cache_hint", cache_hint, CACHE_HINTS)
    tiles = (-(-shape[0] // box[0])) * (-(-shape[1] // box[1]))
    words = tiles * swz.smem_bytes(swizzle, box[0], box[1] * _elem_bytes(dtype)) // 4
    return compile_for(target, _roundtrip_host(box[0], box[1], swizzle, cache_hint), _fake_2d(dtype, shape),
                       _fake_2d(dtype, shape), fake_tensor(cutlass.Int32, (words,)), fake_stream())


def compile_multicast(target: str = "sm_90a", clusters: int = 2, dtype="float16", box=(64, 64),
                      swizzle: str = "128B"):
    """Compile :func:`multicast_kernel` for ``target`` (no GPU needed)."""
    check_target(target)
    clusters = check_int("clusters", clusters, lo=1)
    if not (isinstance(box, (tuple, list)) and len(box) == 2):
        raise ValueError(f"box must be a pair (box rows, box cols); got {box!r}")
    box = tuple(check_int(f"box[{i}]", b, lo=1, hi=MAX_BOX) for i, b in enumerate(box))
    shape = (clusters * box[0], box[1])
    check_tma_box(shape, dtype, box, swizzle)
    return compile_for(target, _multicast_host(box[0], box[1], swizzle), _fake_2d(dtype, shape),
                       _fake_2d(dtype, (2 * shape[0], shape[1])), fake_stream())
