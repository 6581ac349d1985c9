"""Chapter 04 (CuTe layouts): the layout algebra the kernels' tiling rests on, computed on the CPU.

What it teaches
    A CuTe *layout* is a pair ``shape:stride``. It maps a coordinate to an
    offset: ``(i, j) -> i * stride[0] + j * stride[1]`` for a rank-2 layout,
    and the same sum over nested modes for hierarchical shapes. A row-major
    ``4 x 8`` matrix is ``(4,8):(8,1)``, a column-major one ``(4,8):(1,4)``
    (CuTe's default: the first mode is the fastest).

    Every tiling the kernels do is an operation on layouts:

    * ``zipped_divide(L, tiler)`` splits each mode of ``L`` by the tiler and
      groups the result as ``((tile), (rest))``: mode 0 walks inside one tile,
      mode 1 picks the tile.
    * ``flat_divide(L, tiler)`` is the same split with the modes flattened:
      ``(tile_0, tile_1, rest_0, rest_1)``.
    * ``local_tile(T, tiler, coord)`` is ``zipped_divide`` followed by indexing
      the *rest* mode with ``coord``; a ``None`` in ``coord`` keeps that mode.
      ``local_tile(mA, (128, 64), (m, None))`` is "row of tiles ``m`` of A,
      every k-tile": shape ``(128, 64, k_tiles)``.

    On top of these the kernels call ``cpasync.tma_partition`` (a TMA box's
    shared-memory and global views), ``partition_A`` (what one thread of the
    MMA owns) and ``make_fragment_A`` (the wgmma descriptors for those
    pieces). :func:`gemm_tiling` makes exactly the calls of
    :func:`gemmlab.wgmma.gemm_kernel` and records what each returns.

    The DSL builds layouts only while a ``@cute.jit`` function is being
    compiled; static layouts are plain values at that time, so the functions
    below trace a small function on the CPU and keep the printed layouts.

What it adds over the chapter before
    Chapters 01-04 addressed memory by hand (``base + lane * 16``). From here
    on the kernels index tensors by coordinate and let layouts compute the
    addresses; this module is the dictionary between the two.
"""
from __future__ import annotations

import functools
import itertools

import cuda.bindings.driver as cuda
import cutlass.cute as cute
from cutlass import BFloat16, Constexpr

from .checks import check_int


def _check_shape_stride(shape, stride) -> tuple[tuple[int, ...], tuple[int, ...]]:
    if not isinstance(shape, (tuple, list)) or not shape:
        raise TypeError(f"shape must be a non-empty tuple of ints; got {shape!r}")
    if not isinstance(stride, (tuple, list)) or len(stride) != len(shape):
        raise ValueError(f"stride must be a tuple as long as shape ({len(shape)}); got {stride!r}")
    for i, s in enumerate(shape):
        check_int(f"shape[{i}]", s, lo=1)
    for i, d in enumerate(stride):
        check_int(f"stride[{i}]", d, lo=0)
    return tuple(shape), tuple(stride)


def offset(shape, stride, coord) -> int:
    """The offset a flat layout ``shape:stride`` gives coordinate ``coord``: ``sum(c_i * d_i)``."""
    shape, stride = _check_shape_stride(shape, stride)
    if not isinstance(coord, (tuple, list)) or len(coord) != len(shape):
        raise ValueError(f"coord must be a tuple as long as shape ({len(shape)}); got {coord!r}")
    for i, (c, s) in enumerate(zip(coord, shape)):
        check_int(f"coord[{i}]", c, lo=0, hi=s - 1)
    return sum(c * d for c, d in zip(coord, stride))


def offsets(shape, stride) -> list:
    """Every offset of a flat layout, as nested lists indexed by coordinate (``out[i][j]`` for rank 2)."""
    shape, stride = _check_shape_stride(shape, stride)
    if len(shape) == 1:
        return [i * stride[0] for i in range(shape[0])]
    inner = offsets(shape[1:], stride[1:])
    return [_shifted(inner, i * stride[0]) for i in range(shape[0])]


def _shifted(x, by: int):
    return [_shifted(v, by) for v in x] if isinstance(x, list) else x + by


def tile_offsets(shape, stride, tile) -> list[tuple[tuple[int, int], list[int]]]:
    """What ``zipped_divide(shape:stride, tile)`` means, by enumeration (rank 2, CPU only).

    Returns one entry per tile, in CuTe's order (tile index 0 fastest): the
    tile's coordinate and the offsets of its elements, element index 0
    fastest, exactly the order in which the divided layout enumerates them.
    """
    shape, stride = _check_shape_stride(shape, stride)
    if len(shape) != 2:
        raise ValueError(f"shape must have rank 2; got {shape!r}")
    if not isinstance(tile, (tuple, list)) or len(tile) != 2:
        raise ValueError(f"tile must be a pair of ints; got {tile!r}")
    for i, (t, s) in enumerate(zip(tile, shape)):
        check_int(f"tile[{i}]", t, lo=1)
        if s % t:
            raise ValueError(f"tile[{i}] must divide shape[{i}] = {s}; got {t}")
    (m, n), (tm, tn) = shape, tile
    out = []
    for bj, bi in itertools.product(range(n // tn), range(m // tm)):
        elems = [(bi * tm + i) * stride[0] + (bj * tn + j) * stride[1] for j in range(tn) for i in range(tm)]
        out.append(((bi, bj), elems))
    return out


@functools.lru_cache(maxsize=None)
def algebra_examples() -> dict[str, str]:
    """The layout operations of the chapter on small examples, as CuTe prints them.

    Traced on the CPU (no GPU, no kernel): ``row`` is a row-major 4 x 8
    matrix, ``col`` CuTe's default (column-major) one; the rest divide ``row``
    into 2 x 4 tiles, and take tile ``(1, None)`` of a 256 x 512 coordinate
    tensor with 128 x 64 tiles (the ``local_tile`` call of the GEMMs).
    """
    out: dict[str, str] = {}

    @cute.jit
    def trace():
        row = cute.make_layout((4, 8), stride=(8, 1))
        out["row"] = str(row)
        out["col"] = str(cute.make_layout((4, 8)))
        out["row((1, 2))"] = str(row((1, 2)))
        out["zipped_divide(row, (2, 4))"] = str(cute.zipped_divide(row, (2, 4)))
        out["flat_divide(row, (2, 4))"] = str(cute.flat_divide(row, (2, 4)))
        coords = cute.make_identity_tensor((256, 512))
        out["coords"] = str(coords)
        out["zipped_divide(coords, (128, 64))"] = str(cute.zipped_divide(coords, (128, 64)))
        out["local_tile(coords, (128, 64), (1, None))"] = str(cute.local_tile(coords, (128, 64), (1, None)))
        tile = cute.local_tile(coords, (128, 64), (1, None))
        out["local_tile(...)[(5, 3, 2)]"] = str(tile[(5, 3, 2)])

    trace()
    return out


@functools.lru_cache(maxsize=None)
def gemm_tiling(m: int = 4096, k: int = 4096, *, tile_m: int = 128, tile_n: int = 128, stages: int = 4) -> dict[str, str]:
    """The tensors chapter 06's GEMM builds for operand A, as CuTe prints them (compiled for ``sm_90a``, no GPU).

    The probe kernel makes the same calls as :func:`gemmlab.wgmma.gemm_kernel`
    on the same arguments (the host's swizzled shared-memory layout, its TMA
    atom, its tiled MMA) and records each result while it is traced:

    * ``a``: A in global memory, ``(M, K)`` row-major;
    * ``mA``: the TMA *coordinate* tensor the host passes (its elements are coordinates);
    * ``gA = local_tile(mA, (tile_m, 64), (bm, None))``: one CTA's row of tiles, every k-tile;
    * ``sA``: the ring in shared memory, ``(tile_m, 64, stages)``, 128B-swizzled;
    * ``tAsA, tAgA = tma_partition(...)``: one TMA box per stage / per k-tile;
    * ``tCsA = partition_A(sA)`` for thread 0 of the warpgroup, and
      ``tCrA = make_fragment_A(tCsA)``: the wgmma descriptors, ``(MMA, MMA_M, MMA_K, stages)``.
    """
    check_int("m", m, lo=tile_m, multiple_of=tile_m)
    check_int("k", k, lo=64, multiple_of=64)
    from .wgmma import TILE_SHAPES, TILE_K

    if (tile_m, tile_n) not in TILE_SHAPES:
        raise ValueError(f"(tile_m, tile_n) must be one of {TILE_SHAPES}; got {(tile_m, tile_n)}")
    check_int("stages", stages, lo=1, hi=8)
    return _trace_gemm_tiling(m, k, tile_m, tile_n, stages, TILE_K)


def _trace_gemm_tiling(m, k, tile_m, tile_n, stages, tile_k):
    from cutlass.cute.nvgpu import cpasync, warpgroup
    from cutlass.memory import SmemAllocator

    from .compile import compile_for, fake_stream, fake_tensor
    from .wgmma import k_major_smem_layout, make_tiled_mma

    out: dict[str, str] = {}

    @cute.kernel
    def probe(tma_a: cute.CopyAtom, mA: cute.Tensor, tiled_mma: cute.TiledMma, a_layout: cute.ComposedLayout,
              tm: Constexpr):
        smem = SmemAllocator()
        sA = smem.allocate_tensor(BFloat16, a_layout.outer, byte_alignment=1024, swizzle=a_layout.inner)
        bm, _, _ = cute.arch.block_idx()
        gA = cute.local_tile(mA, (tm, tile_k), (bm, None))
        tAsA, tAgA = cpasync.tma_partition(tma_a, 0, cute.make_layout(1), cute.group_modes(sA, 0, 2),
                                           cute.group_modes(gA, 0, 2))
        tCsA = tiled_mma.get_slice(0).partition_A(sA)
        tCrA = tiled_mma.make_fragment_A(tCsA)
        for name, t in (("mA", mA), ("gA", gA), ("sA", sA), ("tAsA", tAsA), ("tAgA", tAgA), ("tCsA", tCsA)):
            out[name] = str(t.layout)
        out["tCrA"] = str(tCrA.layout)
        out["sA swizzle"] = str(a_layout.inner)

    @cute.jit
    def host(a: cute.Tensor, stream: cuda.CUstream):
        tiled_mma = make_tiled_mma(a.element_type, tile_n)
        a_layout = k_major_smem_layout(a.element_type, tile_m, tile_k, stages, warpgroup.SmemLayoutAtomKind.K_SW128)
        tma_a, mA = cpasync.make_tiled_tma_atom(cpasync.CopyBulkTensorTileG2SOp(), a,
                                                cute.slice_(a_layout, (None, None, 0)), (tile_m, tile_k))
        out["a"] = str(a.layout)
        probe(tma_a, mA, tiled_mma, a_layout, tile_m).launch(grid=(m // tile_m, 1, 1), block=(128, 1, 1),
                                                             stream=stream)

    compile_for("sm_90a", host, fake_tensor(BFloat16, (m, k), stride_order=(1, 0)), fake_stream())
    order = ("a", "mA", "gA", "sA", "sA swizzle", "tAsA", "tAgA", "tCsA", "tCrA")
    return {name: out[name] for name in order}
