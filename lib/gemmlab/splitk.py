"""Chapter 07: split-K, the FP32 partial sums and how they are added up.

What it teaches
    A GEMM whose output has fewer tiles than the GPU has SMs leaves SMs idle:
    M = 64, N = 2112 is 17 tiles of 128 x 64 for 132 SMs. Split-K cuts K into
    ``splits`` slices and makes every (tile, slice) pair a work unit, so
    17 x 7 = 119 units keep 119 SMs streaming the weight. Each unit holds the
    FP32 partial sum of its slice; the slices must then be added up.

    Two ways to add them, both here:

    * **A second kernel** (the first version of chapter 07): every unit writes
      its partial tile to a ``splits x M x N`` FP32 workspace, and
      :func:`reduce_kernel` adds the slices and converts to the output dtype.
      It costs one more launch, its gap behind the GEMM and the GEMM's drained
      tail (about 9 us on an H100, fitted on the sweep of chapter 07).
    * **In the GEMM itself** (what :mod:`gemmlab.kernels.gemm_sm90` runs now,
      "serial split-K" / stream-K "fixup"): every unit writes its accumulator
      fragment to the workspace as the registers hold it
      (:func:`store_partial`), and counts itself on a per-tile counter
      (:func:`arrive`). The unit that arrives last is the tile's *reducer*: it
      adds every slice in split order 0 .. S-1 (:func:`add_partials`; its own
      from its registers where the order allows), so the sum is the same bits
      whatever order the units arrived in, resets the counter for the next
      launch, and runs the normal epilogue. Nobody waits for anybody: a unit that is not last moves
      on to its next unit, so the persistent schedule cannot deadlock.

    The in-kernel form's cost is the workspace traffic (every unit writes
    ``tile_m x tile_n x 4`` bytes; the reducer reads S - 1 or S such tiles
    back) and the reducer's serial read at the tail; the heuristic
    (:mod:`gemmlab.family.heuristic_sm90`) weighs it against the idle SMs.

Whole waves, then a split tail
    Idle SMs are not only a small problem's trouble. 200 x 37888 x 3584 on
    swapped 128 x 208 tiles has 296 tiles: two full waves on 132 SMs, then a
    third wave of 32 tiles that leaves 100 SMs idle for a whole tile's time.
    Splitting every tile would pay the workspace and the hand-offs 888 times to
    fix that one wave. So only the tiles of the partial last wave are split
    (the hybrid schedule of the stream-K literature, data-parallel waves and
    then a partitioned tail, with split-K partitioning the tail): the first
    ``dp_tiles = (tiles // clusters) x clusters`` units are whole tiles with
    the normal epilogue, and the 32 tail tiles become 96 units of a third of K:
    one wave, 36 SMs idle instead of 100, for a third of the time. Only the
    tail's tiles have partial tiles and counters
    (:func:`gemmlab.family.configs.hybrid_tiles`; :func:`units_model` numbers
    the units as the kernel does). A grid of at most one wave has
    ``dp_tiles = 0``: every tile split, as above.

The fragment-native workspace
    Partial tile ``(tile, split)`` is ``tile_m * tile_n`` floats at
    ``(tile * splits + split) * tile_m * tile_n``, ``tile`` counting the tail's
    CTA tiles from 0 (``(cluster tile - dp_tiles) x cluster size + rank``).
    Inside it, consumer thread ``t`` (of ``T = 128 x consumer warpgroups``)
    keeps its accumulator values ``4j .. 4j+3`` at ``(j * T + t) * 4``: each
    thread's four values are one 16-byte vector, and the 32 lanes of a warp
    write 512 contiguous bytes per instruction. Writer and reader are the same thread index of the same tiled
    MMA, so nothing about the fragment's (m, n) coordinates is needed, partial
    tiles included (their padding rows hold the zeros the TMA loads filled in).

The protocol (one counter per split CTA tile, int32, zero between launches)
    1. every consumer thread stores its fragment; the consumer warpgroups meet
       at a named barrier;
    2. one thread: ``fence.acq_rel.gpu`` (release: the CTA's stores, ordered
       before it by the barrier), then ``atom.add`` on the tile's counter;
    3. if the counter was ``splits - 1``, this unit is the last: the thread
       fences again (acquire: the other units' stores, released before their
       adds) and stores 0 to the counter; it tells the other threads through
       shared memory and a second barrier;
    4. the reducer's threads load the slices with ``ld.global.cg`` (L2, never
       a stale L1 line) and add them in split order; a one-warpgroup tile of
       at most 48 floats a thread loads several slices before adding any
       (:func:`reduce_group`: 64 x 576 x 7168 in 11 slices, 12.6 -> 10.4 us on
       an H200).

The code, in the chapter modules' order
    * PTX wrappers: ``ld.global.v4.f32`` / ``ld.global.cg.v4.f32`` / ``st.global.v4.f32``
      (four floats, 16 bytes) and ``cvt.rn.bf16x2.f32`` / ``cvt.rn.f16x2.f32``
      (two floats into one packed 32-bit word; the first operand lands in the
      upper half). The fence and the atomic are the DSL's own
      (``cute.arch.fence_acq_rel_gpu``, ``cute.arch.atomic_add``).
    * CPU models: :func:`reduce_model` (the second kernel's sum),
      :func:`fixup_model` (the counter protocol: who reduces, and what) and
      :func:`units_model` (the work units: whole tiles, then the tail's slices).
    * Device code: :func:`store_partial`, :func:`arrive`, :func:`add_partials`
      (called by the GEMM's split-K epilogue), and the standalone
      :func:`reduce_kernel`: one thread per 8 output elements, a loop over the
      slices with two 16-byte loads each, one 16-byte store.
    * Host side: :func:`launch_reduce` and :func:`compile_reduce` (the
      reduction alone, for compile-only cells and the emulator).

The standalone reduction's tensors are row-major and packed, so slice ``s`` of
the workspace and the output share one flat index: element ``i`` of the output
is the sum of elements ``s * M * N + i``. N is a multiple of 8 (the GEMM's
contract), so M * N is too: every thread has eight whole elements.
"""
from __future__ import annotations

import functools

import cutlass
import cutlass.cute as cute
import cuda.bindings.driver as cuda
from cutlass import Float32, Int32

from .checks import check_int
from .ldst import st_global_v4

THREADS = 256
VEC = 8  # output elements per thread: 8 x 2 bytes = one 16-byte store
#: FP32 values per 16-byte access of the in-kernel form's workspace.
PART_VEC = 4
#: The largest accumulator fragment (floats a thread) whose reducer reads several slices at once (:func:`reduce_group`).
GROUPED_MAX_FLOATS = 48

# --------------------------------------------------------------------------------------
# PTX wrappers
# --------------------------------------------------------------------------------------


def ld_global_v4_f32(ptr):
    """``ld.global.v4.f32``: four floats from a 16-byte aligned global address."""
    return cute.arch.inline_ptx("ld.global.v4.f32 {{$w0}, {$w1}, {$w2}, {$w3}}, [{$r0}];",
                                write_only_types=[Float32] * 4, read_only_args=[ptr])


def ld_global_cg_v4_f32(ptr, pred=None):
    """``ld.global.cg.v4.f32``: four floats from a 16-byte aligned global address, cached in L2 only.

    ``.cg`` never hits L1, which other SMs' stores do not update: a partial sum
    another CTA published is read from L2, where its release made it visible.
    With ``pred`` false the lane loads nothing (its results are undefined).
    """
    return cute.arch.inline_ptx("ld.global.cg.v4.f32 {{$w0}, {$w1}, {$w2}, {$w3}}, [{$r0}];",
                                write_only_types=[Float32] * 4, read_only_args=[ptr], predicate=pred)


def st_global_v4_f32(ptr, a, b, c, d):
    """``st.global.v4.f32``: four floats to a 16-byte aligned global address."""
    cute.arch.inline_ptx("st.global.v4.f32 [{$r0}], {{$r1}, {$r2}, {$r3}, {$r4}};",
                         read_only_args=[ptr, Float32(a), Float32(b), Float32(c), Float32(d)])


def cvt_pack(hi, lo, c_type):
    """``cvt.rn.{bf16,f16}x2.f32``: two floats rounded to nearest into one 32-bit word (``lo`` in bits 0-15)."""
    kind = "bf16x2" if c_type is cutlass.BFloat16 else "f16x2"
    return cute.arch.inline_ptx(f"cvt.rn.{kind}.f32 {{$w0}}, {{$r0}}, {{$r1}};",
                                write_only_types=[Int32], read_only_args=[Float32(hi), Float32(lo)])


# --------------------------------------------------------------------------------------
# CPU model
# --------------------------------------------------------------------------------------


def reduce_model(ws, out_dtype):
    """What the kernel computes: the FP32 sum over slices (dim 0), rounded once to ``out_dtype``."""
    return ws.float().sum(dim=0).to(out_dtype)


def fixup_model(partials, arrivals):
    """The in-kernel protocol on the CPU: ``(reducer, out, counter)``.

    ``partials``: the S partial tiles (FP32, split order); ``arrivals``: the
    order in which the S units reach the counter (a permutation of 0 .. S-1).
    Each adds 1; the one that reads ``S - 1`` reduces: it adds slice 0, 1, ...,
    S-1 in that order, ``((p0 + p1) + p2) + ...`` (its own from its registers
    or read back: the same bits either way), and leaves the counter at 0. The
    sum, and so ``out``, does not depend on ``arrivals``.
    """
    import torch

    splits = len(partials)
    if sorted(arrivals) != list(range(splits)):
        raise ValueError(f"arrivals must be a permutation of 0 .. {splits - 1}; got {list(arrivals)}")
    counter, reducer = 0, None
    for s in arrivals:
        old, counter = counter, counter + 1
        if old == splits - 1:
            reducer, counter = s, 0
    out = partials[0].float()
    for s in range(1, splits):
        out = out + partials[s].float()
    return reducer, out, counter


def units_model(tiles: int, k_tiles: int, splits: int, dp_tiles: int = 0) -> list[tuple[int, int, int, int]]:
    """The GEMM's work units on the CPU: ``(tile, split, first k-block, k-blocks)`` of unit 0, 1, 2, ...

    As :func:`gemmlab.kernels.gemm_sm90.unit_coords` numbers them: units ``0 .. dp_tiles - 1`` are whole tiles
    (split 0, all ``k_tiles`` k-blocks); then the other ``tail = tiles - dp_tiles`` tiles slice-major, unit
    ``dp_tiles + s * tail + j`` being tile ``dp_tiles + j`` of slice ``s``
    (:func:`~gemmlab.family.configs.split_ranges`). Tiles are places in the grouped raster order
    (:mod:`gemmlab.scheduler`).
    """
    from .family.configs import split_ranges

    tiles = check_int("tiles", tiles, lo=1)
    k_tiles = check_int("k_tiles", k_tiles, lo=1)
    dp_tiles = check_int("dp_tiles", dp_tiles, lo=0, hi=tiles)
    ranges = split_ranges(k_tiles, splits)  # refuses a count that leaves a slice empty, as the kernel must be spared
    tail = tiles - dp_tiles
    whole = [(t, 0, 0, k_tiles) for t in range(dp_tiles)]
    return whole + [(dp_tiles + j, s, k0, kc) for s, (k0, kc) in enumerate(ranges) for j in range(tail)]


# --------------------------------------------------------------------------------------
# Device code: the GEMM's split-K epilogue (in-kernel form)
# --------------------------------------------------------------------------------------


@cute.jit
def store_partial(acc: cute.Tensor, part, threads: cutlass.Constexpr):
    """This thread's accumulator fragment to its slots of a partial tile: vector ``j`` (values ``4j .. 4j+3``)
    at ``part + 4 * threads * j``, ``part`` being the thread's first float (``tile base + 4 * t``)."""
    for j in cutlass.range_constexpr(cute.size(acc) // PART_VEC):
        st_global_v4_f32(part + j * PART_VEC * threads, acc[4 * j], acc[4 * j + 1], acc[4 * j + 2], acc[4 * j + 3])


@cute.jit
def arrive(counter, flag: cute.Tensor, splits: Int32, ctid: Int32, threads: cutlass.Constexpr,
           barrier_id: cutlass.Constexpr):
    """Count this unit on its tile's ``counter`` once all ``threads`` consumer threads stored; True for the last.

    ``flag``: one Int32 of shared memory that carries thread 0's answer to the
    others. The last unit resets the counter (nobody touches it again in this
    launch; the next launch sees 0) and has acquired the other units' partials.
    """
    cute.arch.barrier(barrier_id=barrier_id, number_of_threads=threads)  # every partial of this CTA is stored
    if ctid == 0:
        cute.arch.fence_acq_rel_gpu()  # release: this CTA's partials, ordered before by the barrier
        old = cute.arch.atomic_add(counter, Int32(1), sem="relaxed", scope="gpu")
        last = Int32(0)
        if old == splits - 1:
            cute.arch.fence_acq_rel_gpu()  # acquire: the other units' partials, released before their adds
            cute.arch.atomic_exch(counter, Int32(0), sem="relaxed", scope="gpu")  # ready for the next launch
            last = Int32(1)
        flag[0] = last
    cute.arch.barrier(barrier_id=barrier_id, number_of_threads=threads)
    return flag[0] != 0


@cute.jit
def add_slice(acc: cute.Tensor, part, threads: cutlass.Constexpr, fresh: cutlass.Constexpr):
    """``acc += `` (``fresh``: ``acc = ``) the partial fragment at ``part``: 16-byte ``ld.global.cg`` loads."""
    for j in cutlass.range_constexpr(cute.size(acc) // PART_VEC):
        x = ld_global_cg_v4_f32(part + j * PART_VEC * threads)
        for q in cutlass.range_constexpr(PART_VEC):
            if cutlass.const_expr(fresh):
                acc[PART_VEC * j + q] = x[q]
            else:
                acc[PART_VEC * j + q] = acc[PART_VEC * j + q] + x[q]


@cute.jit
def add_partials(acc: cute.Tensor, part, own: Int32, splits: Int32, slice_floats: cutlass.Constexpr,
                 threads: cutlass.Constexpr, group: cutlass.Constexpr = 1):
    """``acc`` (slice ``own``'s fragment) <- ``((p0 + p1) + p2) + ...``: every slice in split order.

    Slice ``s`` of this thread is at ``part + s * slice_floats``. The sum is
    made in ``acc`` itself (no second register array: a 128 x 256 tile's
    fragment is already 128 registers a thread). Slice 0 or 1 may stay in the
    registers, because ``p1 + p0`` is ``p0 + p1`` to the bit; a later ``own``
    cannot wait there while the slices before it are added, so the reducer
    reads its own partial back (it stored it before counting itself): S - 1
    slices read when ``own`` is 0 or 1 (always, with two splits), S otherwise.

    The slices after the first are read ``group`` at a time (:func:`read_group`): all of a group's loads are in
    flight before the first of its additions, so S - 1 slices cost ``ceil((S - 1) / group)`` round trips to L2
    instead of S - 1, and the additions still run in split order.
    """
    first = Int32(1)  # the first slice still to add after acc holds p0 (own 0 or >= 2) or p0 + p1 (own 1)
    if own >= 2:
        add_slice(acc, part, threads, True)  # acc = p0 (its own partial is in the workspace)
    elif own == 1:
        add_slice(acc, part, threads, False)  # acc = p1 + p0
        first = Int32(2)
    for s0 in cutlass.range(first, splits, group, unroll=1):
        read_group(acc, part, s0, splits, slice_floats, threads, group)


@cute.jit
def read_group(acc: cute.Tensor, part, s0: Int32, splits: Int32, slice_floats: cutlass.Constexpr,
               threads: cutlass.Constexpr, group: cutlass.Constexpr):
    """``acc += p[s0] + ...`` for the ``group`` slices from ``s0`` that exist (``< splits``), added in order after
    every one of their 16-byte loads was issued (a slice past the last is neither read nor added)."""
    vecs = cute.size(acc) // PART_VEC
    loaded = []
    for g in cutlass.range_constexpr(group):
        base = part + (s0 + g) * slice_floats
        ok = s0 + g < splits
        loaded.append([ld_global_cg_v4_f32(base + j * PART_VEC * threads, ok) for j in range(vecs)])
    for g in cutlass.range_constexpr(group):
        if s0 + g < splits:
            for j in cutlass.range_constexpr(vecs):
                for q in cutlass.range_constexpr(PART_VEC):
                    acc[PART_VEC * j + q] = acc[PART_VEC * j + q] + loaded[g][j][q]


def reduce_group(fragment_floats: int, consumers: int) -> int:
    """Slices a reducer thread reads at once (:func:`add_partials`'s ``group``), 1 to 4: with one consumer warpgroup
    and at most :data:`GROUPED_MAX_FLOATS` accumulator floats a thread, as many as keep 128 loaded floats in flight;
    otherwise 1 (one slice per round trip, as before grouping).

    Measured on an H200 (2026-12-02, ``results/nvidia-h200/splitk_grouped_reads.json``, each split pick of the two
    families timed with both forms in one run): 64 x 64 tiles (32 floats, 4 slices a group) 12.6 -> 10.4 us at
    64 x 576 x 7168 (split 11), 64 x 96 (48 floats, 2) 13.7 -> 12.7 us at 256 x 576 x 7168 (split 5); 64 x 104 (52
    floats, 2) no change; 64 x 128 (64 floats, 2) 0.4-0.6 us *slower* on all four shapes it runs (128 x 2112 x 7168:
    16.2 -> 16.7 us, not explained: no spills, 167 registers), hence the bound. Tiles of two or three warpgroups were not
    timed grouped.
    """
    if consumers != 1 or fragment_floats > GROUPED_MAX_FLOATS:
        return 1
    return min(4, 128 // fragment_floats)


# --------------------------------------------------------------------------------------
# The standalone reduction kernel (the two-launch form)
# --------------------------------------------------------------------------------------


@cute.kernel
def reduce_kernel(ws: cute.Tensor, c: cute.Tensor, splits: Int32, plane: Int32, c_type: cutlass.Constexpr):
    """``c[i] = sum_s ws[s, i]`` for this thread's 8 elements; ``plane`` = M * N."""
    tid, _, _ = cute.arch.thread_idx()
    bid, _, _ = cute.arch.block_idx()
    v = bid * THREADS + tid
    if v * VEC < plane:
        acc = cute.make_rmem_tensor((VEC,), Float32)
        acc.fill(0.0)
        for s in cutlass.range(splits, unroll=1):
            base = ws.iterator + (s * plane + v * VEC)
            for half in cutlass.range_constexpr(2):
                x = ld_global_v4_f32(base + 4 * half)
                for j in cutlass.range_constexpr(4):
                    acc[4 * half + j] = acc[4 * half + j] + x[j]
        words = [cvt_pack(acc[2 * j + 1], acc[2 * j], c_type) for j in range(VEC // 2)]
        st_global_v4(c.iterator + v * VEC, *words)


# --------------------------------------------------------------------------------------
# Host side
# --------------------------------------------------------------------------------------


@cute.jit
def launch_reduce(ws: cute.Tensor, c: cute.Tensor, splits: Int32, stream: cuda.CUstream):
    """Launch :func:`reduce_kernel` for workspace ``ws`` (splits, M, N) FP32 into ``c`` (M, N)."""
    plane = cute.size(c)
    blocks = (plane // VEC + THREADS - 1) // THREADS
    reduce_kernel(ws, c, splits, plane, c.element_type).launch(grid=(blocks, 1, 1), block=(THREADS, 1, 1),
                                                               stream=stream)


@functools.lru_cache(maxsize=None)
def _reduce_host():
    @cute.jit
    def reduce_host(ws: cute.Tensor, c: cute.Tensor, splits: Int32, stream: cuda.CUstream):
        launch_reduce(ws, c, splits, stream)

    return reduce_host


def compile_reduce(target: str = "sm_90a", out_dtype: str = "bfloat16"):
    """Compile the reduction alone for ``target`` (no GPU needed); sizes are run-time values."""
    from .compile import check_target, compile_for, fake_stream, fake_tensor
    from .checks import check_choice

    check_target(target)
    check_choice("out_dtype", out_dtype, ("bfloat16", "float16"))
    ct = cutlass.BFloat16 if out_dtype == "bfloat16" else cutlass.Float16
    m, n, s = cute.sym_int(), cute.sym_int(divisibility=VEC), cute.sym_int()
    ws = fake_tensor(Float32, (s, m, n), stride_order=(2, 1, 0))
    c = fake_tensor(ct, (m, n), stride_order=(1, 0))
    return compile_for(target, _reduce_host(), ws, c, Int32(2), fake_stream())
