"""Chapter 05: a warp-specialized, multi-stage TMA pipeline at HBM speed.

What it teaches
    The shape every fast Hopper/Blackwell kernel has. One **producer warp**
    issues TMA loads (``cp.async.bulk.tensor``) into a ring of ``stages``
    shared-memory buffers; **consumer warps** do the work on each stage and
    write results through a second, smaller ring that **TMA stores** drain.
    Two mbarriers per stage carry the hand-off: ``full[s]`` (the TMA engine
    completes it with ``complete_tx`` once ``expect_tx`` bytes landed) and
    ``empty[s]`` (every consumer thread arrives once it has read the stage).
    The grid is **persistent**: each CTA loops over many tiles, and the
    ring's position, a :class:`~gemmlab.pipeline.DevicePipelineState` per
    role, is carried across tiles and k-iterations, never reset.

    The operation is a fused **row scale + cast**, ``y[m, n] = cast(x[m, n] *
    scale[m])``, a memory-bound epilogue-like kernel (dequantisation, the
    ``1/rms`` of a norm). A *tile* is ``block_m`` rows; its k-iterations walk
    the columns ``block_n`` at a time, like a GEMM's k-loop. Rows and columns
    need not be multiples of the box: TMA loads fill out-of-bounds elements
    with zeros and TMA stores clip them.

What it adds over chapters 03 and 04
    Chapter 03 drove a ring from a single thread with contiguous bulk copies;
    chapter 04 built tensor maps and single TMA copies. Here the roles are
    split across warps (the producer never touches data, the consumers never
    issue loads), loads and stores are tensor copies with hardware bounds
    handling, and the same kernel comes in the two designs the
    :mod:`gemmlab.simulator` compares:

    * ``design="carried"``: stage index and phase live in a
      ``DevicePipelineState`` that flows through the dynamic loops.
    * ``design="unrolled"``: the k-loop is unrolled by ``stages`` so every
      stage index is a compile-time constant; each tile restarts at stage 0,
      and when ``k_tiles % stages != 0`` the unused slots of the last group
      are walked without data (the producer arrives on ``full`` with no
      bytes, consumers arrive on ``empty``), which re-synchronises the two
      roles at each tile's tail: a bubble.

The code
    * :func:`row_scale_kernel` / :func:`row_scale_host`: the kernel and its
      host function (builds the two TMA atoms: load of ``x``, store of ``y``).
    * :func:`row_scale`: checks, then launches. :func:`prepare_row_scale`
      returns a zero-argument launch for timing.
    * :func:`compile_row_scale`: compile-only, any machine.
    * Its measurements (against torch's device-to-device copy of the same
      bytes, and the unrolled design's tail bubble against the simulator) are
      :mod:`gemmlab.measure.tma_pipeline`'s.
"""
from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import BFloat16, Constexpr, Float16, Float32, Int32, Int64
from cutlass.cute.nvgpu import cpasync
from cutlass.memory import SmemAllocator

from .checks import check_choice, check_int
from .compile import check_target, compile_for, fake_stream, fake_tensor, launcher
from .hardware import H100, SMEM_PER_BLOCK, sm_count
from .pipeline import DevicePipelineState
from .tiers import require_tier

#: TMA rules (PTX ISA, tensor maps): global base address and every stride but
#: the innermost a multiple of 16 bytes; at most 256 elements per box dimension.
TMA_ALIGN = 16
TMA_MAX_BOX = 256
#: Shared memory :func:`smem_bytes` may count for one CTA: the hardware's per-block limit
#: (:data:`gemmlab.hardware.SMEM_PER_BLOCK`, 227 KiB on H100/H200) less 1 KiB of margin for
#: what smem_bytes leaves out (such as the allocator's alignment padding between the rings).
MAX_SMEM_BYTES = SMEM_PER_BLOCK - 1024
#: Shared memory of one SM (228 KiB): the per-block limit plus the 1 KiB CUDA reserves per resident CTA.
SMEM_PER_SM = SMEM_PER_BLOCK + 1024
#: Consumer warps per CTA (warp 0 is the producer): 128 threads read each stage.
CONSUMER_WARPS = 4
CONSUMER_THREADS = 32 * CONSUMER_WARPS
#: Output buffers the consumers write and TMA stores drain (the store ring).
OUT_STAGES = 2
#: Named barrier the consumer warps use among themselves (0 is ``__syncthreads``).
CONSUMER_BARRIER = 1
#: Upper bound of the synthetic compute per stage (``spin_cycles``): 1M cycles, about half a millisecond.
MAX_SPIN_CYCLES = 1 << 20

DESIGNS = ("carried", "unrolled")
#: torch dtype name -> CuTe DSL type. TMA moves any of them; the consumers compute in float32.
DTYPES = {"float32": Float32, "bfloat16": BFloat16, "float16": Float16}


def default_block(dtype: str) -> tuple[int, int]:
    """16 KiB boxes: 256 columns (the TMA box limit) and as many rows as fit 16 KiB."""
    elem = DTYPES[dtype].width // 8
    return (16384 // (256 * elem), 256)


# ---------------------------------------------------------------------------
# The kernel
# ---------------------------------------------------------------------------


@cute.kernel
def row_scale_kernel(load_x: cute.CopyAtom, tma_x: cute.Tensor, store_y: cute.CopyAtom, tma_y: cute.Tensor,
                     scale: cute.Tensor, x_dtype: Constexpr, y_dtype: Constexpr, block_m: Constexpr,
                     block_n: Constexpr, stages: Constexpr, design: Constexpr, spin_cycles: Constexpr = 0):
    """``y = cast(x * scale[:, None])``: warp 0 loads with TMA, warps 1..4 scale and store with TMA.

    Tiles (``block_m`` rows) are dealt round-robin to the persistent CTAs;
    each tile has ``k_tiles`` k-iterations (``block_n`` columns each), each
    one stage of the load ring ("x-tile ring": ``full``/``empty`` per stage).
    ``spin_cycles > 0``: the consumers hold every stage that long (synthetic
    compute, like an MMA reading its operands) before reading and releasing it.
    """
    tidx, _, _ = cute.arch.thread_idx()
    bid, _, _ = cute.arch.block_idx()
    ctas, _, _ = cute.arch.grid_dim()
    warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())

    rows = cute.size(tma_x.shape[0])  # static
    m_tiles = (rows + block_m - 1) // block_m
    k_tiles = (cute.size(tma_x.shape[1]) + block_n - 1) // block_n
    tile_elems = block_m * block_n
    x_tile_bytes = tile_elems * (x_dtype.width // 8)  # TMA counts the whole box, out-of-bounds zeros included

    # Shared memory: the x-tile ring, the y-tile (store) ring, two barriers per x stage.
    smem = SmemAllocator()
    sx = smem.allocate_tensor(x_dtype, cute.make_layout((block_m, block_n, stages), stride=(block_n, 1, tile_elems)),
                              byte_alignment=128)
    sy = smem.allocate_tensor(y_dtype, cute.make_layout((block_m, block_n, OUT_STAGES),
                                                        stride=(block_n, 1, tile_elems)), byte_alignment=128)
    full = smem.allocate_array(Int64, stages, byte_alignment=8)  # "x stage s holds tile data"
    empty = smem.allocate_array(Int64, stages, byte_alignment=8)  # "every consumer thread has read x stage s"

    if warp == 0:
        with cute.arch.elect_one():
            for s in cutlass.range_constexpr(stages):
                cute.arch.mbarrier_init(full + s, 1)  # one arrive (with expect_tx) + the bytes
                cute.arch.mbarrier_init(empty + s, CONSUMER_THREADS)
            cute.arch.mbarrier_init_fence()
    cute.arch.sync_threads()

    # TMA views: (box, m_tiles, k_tiles) in global memory against (box, stage) in shared memory.
    gx = cute.local_tile(tma_x, (block_m, block_n), (None, None))
    gy = cute.local_tile(tma_y, (block_m, block_n), (None, None))
    tsx, tgx = cpasync.tma_partition(load_x, 0, cute.make_layout(1), cute.group_modes(sx, 0, 2),
                                     cute.group_modes(gx, 0, 2))
    tsy, tgy = cpasync.tma_partition(store_y, 0, cute.make_layout(1), cute.group_modes(sy, 0, 2),
                                     cute.group_modes(gy, 0, 2))

    if warp == 0:
        # ---------------- producer warp: TMA loads into the x-tile ring ----------------
        if cutlass.const_expr(design == "carried"):
            x_ring = DevicePipelineState.producer(stages)  # carried across tiles: never reset
            for tile in cutlass.range(bid, m_tiles, ctas, unroll=1):
                for k in cutlass.range(k_tiles, unroll=1):
                    cute.arch.mbarrier_wait(empty + x_ring.index, x_ring.phase)
                    with cute.arch.elect_one():
                        cute.arch.mbarrier_arrive_and_expect_tx(full + x_ring.index, x_tile_bytes)
                    cute.copy(load_x, tgx[(None, tile, k)], tsx[(None, x_ring.index)],
                              tma_bar_ptr=full + x_ring.index)
                    x_ring.advance()
        else:
            # Unrolled: stage s is a constant; every stage is used once per group, so one
            # phase bit for all of them, flipped per group. Each tile restarts at stage 0.
            phase = Int32(1)
            for tile in cutlass.range(bid, m_tiles, ctas, unroll=1):
                for g in cutlass.range_constexpr((k_tiles + stages - 1) // stages):
                    for s in cutlass.range_constexpr(stages):
                        cute.arch.mbarrier_wait(empty + s, phase)
                        if cutlass.const_expr(g * stages + s < k_tiles):
                            with cute.arch.elect_one():
                                cute.arch.mbarrier_arrive_and_expect_tx(full + s, x_tile_bytes)
                            cute.copy(load_x, tgx[(None, tile, g * stages + s)], tsx[(None, s)],
                                      tma_bar_ptr=full + s)
                        else:
                            # Tail slot with no data: arrive anyway so both roles stay in step.
                            with cute.arch.elect_one():
                                cute.arch.mbarrier_arrive(full + s)
                    phase = phase ^ 1
    else:
        # ---------------- consumer warps: scale, cast, write the y ring, TMA store ----------------
        c = tidx - 32
        vec = 16 * 8 // x_dtype.width  # elements per 16-byte read of x
        passes = tile_elems // (vec * CONSUMER_THREADS)
        y_ring = DevicePipelineState(OUT_STAGES, 0, 0)  # which y buffer is next (phase unused)
        # Row scales: this tile's in registers, the next tile's loads in flight (issued a tile ahead,
        # so their global-memory latency never stalls the consumers at a tile boundary).
        row_scale = cute.make_rmem_tensor(cute.make_layout(passes), Float32)
        next_scale = cute.make_rmem_tensor(cute.make_layout(passes), Float32)
        load_row_scales(scale, next_scale, bid, c, rows, block_m, block_n, vec, passes)
        if cutlass.const_expr(design == "carried"):
            x_ring = DevicePipelineState.consumer(stages)
            for tile in cutlass.range(bid, m_tiles, ctas, unroll=1):
                row_scale.store(next_scale.load())
                load_row_scales(scale, next_scale, tile + ctas, c, rows, block_m, block_n, vec, passes)
                for k in cutlass.range(k_tiles, unroll=1):
                    cute.arch.mbarrier_wait(full + x_ring.index, x_ring.phase)
                    spin(spin_cycles)  # synthetic compute while holding the stage (0: none)
                    scale_stage(sx, sy, empty, x_ring.index, y_ring.index, row_scale, c, vec, passes, tile_elems,
                                x_dtype, y_dtype)
                    store_stage(store_y, tsy, tgy, y_ring.index, tile, k, c)
                    x_ring.advance()
                    y_ring.advance()
        else:
            phase = Int32(0)
            for tile in cutlass.range(bid, m_tiles, ctas, unroll=1):
                row_scale.store(next_scale.load())
                load_row_scales(scale, next_scale, tile + ctas, c, rows, block_m, block_n, vec, passes)
                for g in cutlass.range_constexpr((k_tiles + stages - 1) // stages):
                    for s in cutlass.range_constexpr(stages):
                        cute.arch.mbarrier_wait(full + s, phase)
                        if cutlass.const_expr(g * stages + s < k_tiles):
                            spin(spin_cycles)
                            scale_stage(sx, sy, empty, s, y_ring.index, row_scale, c, vec, passes, tile_elems,
                                        x_dtype, y_dtype)
                            store_stage(store_y, tsy, tgy, y_ring.index, tile, g * stages + s, c)
                            y_ring.advance()
                        else:
                            cute.arch.mbarrier_arrive(empty + s)  # tail slot: nothing to read
                    phase = phase ^ 1
        # Shared memory must outlive the stores reading it, and the writes must land.
        if c == 0:
            cute.arch.cp_async_bulk_wait_group(0, read=False)


@cute.jit
def load_row_scales(scale: cute.Tensor, row_scale: cute.Tensor, tile, c, rows: Constexpr, block_m: Constexpr,
                    block_n: Constexpr, vec: Constexpr, passes: Constexpr):
    """The scale of every row this thread touches in ``tile`` (once per tile, reused for all k).

    ``tile`` may be past the last tile (the prefetch after the last one): rows are clamped.
    """
    for j in cutlass.range_constexpr(passes):
        r = tile * block_m + ((c + j * CONSUMER_THREADS) * vec) // block_n  # pass j reads piece c + 128 j
        # Rows past the end belong to a partial tile: clamp the read; TMA will not store them.
        row_scale[j] = scale[cutlass.min(r, rows - 1)]


@cute.jit
def spin(cycles: Constexpr):
    """Busy-wait ``cycles`` SM clock cycles (``%clock64``): synthetic compute the compiler cannot remove."""
    if cutlass.const_expr(cycles > 0):
        start = cute.arch.clock64()
        while cute.arch.clock64() - start < cycles:
            pass


@cute.jit
def scale_stage(sx: cute.Tensor, sy: cute.Tensor, empty, x_stage, y_stage, row_scale: cute.Tensor, c,
                vec: Constexpr, passes: Constexpr, tile_elems: Constexpr, x_dtype: Constexpr, y_dtype: Constexpr):
    """Read x stage ``x_stage`` (16 bytes per thread per pass), release it, write ``cast(x * s)`` into y buffer.

    Consecutive threads read consecutive 16-byte pieces (no bank conflicts).
    The x stage is released as soon as its values are in registers: the
    producer may refill it while we compute and write.
    """
    xs = cute.make_tensor(sx.iterator + x_stage * tile_elems, cute.make_layout((vec, tile_elems // vec),
                                                                               stride=(1, vec)))
    ys = cute.make_tensor(sy.iterator + y_stage * tile_elems, cute.make_layout((vec, tile_elems // vec),
                                                                               stride=(1, vec)))
    vals = cute.make_rmem_tensor(cute.make_layout((vec, passes), stride=(1, vec)), x_dtype)
    for j in cutlass.range_constexpr(passes):
        vals[None, j].store(xs[None, c + j * CONSUMER_THREADS].load())
    cute.arch.mbarrier_arrive(empty + x_stage)  # this thread is done with x stage
    for j in cutlass.range_constexpr(passes):
        v = vals[None, j].load().to(Float32) * row_scale[j]
        ys[None, c + j * CONSUMER_THREADS].store(v.to(y_dtype))
    # Our st.shared must be visible to the TMA engine (async proxy) before the store reads them.
    cute.arch.fence_proxy("async.shared", space="cta")


@cute.jit
def store_stage(store_y: cute.CopyAtom, tsy: cute.Tensor, tgy: cute.Tensor, y_stage, tile, k, c):
    """After every consumer wrote y buffer ``y_stage``: consumer thread 0 issues its TMA store.

    Bulk groups are per thread, so one thread (``c == 0``) issues every store,
    commits it and does every wait. (The DSL elects one lane for TMA *loads*
    but not for stores: called by a whole warp, the store would run 32 times.)
    Before the barrier that thread waits until the store that last read
    the *other* y buffer is done reading it (``wait_group.read`` with
    ``OUT_STAGES - 2`` newer groups allowed): after the barrier, every
    consumer may write that buffer for the next k-iteration.
    """
    if c == 0:
        cute.arch.cp_async_bulk_wait_group(OUT_STAGES - 2, read=True)
    cute.arch.barrier(barrier_id=CONSUMER_BARRIER, number_of_threads=CONSUMER_THREADS)
    if c == 0:
        cute.copy(store_y, tsy[(None, y_stage)], tgy[(None, tile, k)])
        cute.arch.cp_async_bulk_commit_group()


@cute.jit
def row_scale_host(x: cute.Tensor, y: cute.Tensor, scale: cute.Tensor, block_m: Constexpr, block_n: Constexpr,
                   stages: Constexpr, design: Constexpr, ctas: Constexpr, spin_cycles: Constexpr,
                   stream: cuda.CUstream):
    """Build the TMA atoms (tensor maps) for ``x`` (load) and ``y`` (store); launch a persistent grid."""
    tile = cute.make_layout((block_m, block_n), stride=(block_n, 1))  # row-major box, no swizzle
    load_x, tma_x = cpasync.make_tiled_tma_atom(cpasync.CopyBulkTensorTileG2SOp(), x, tile, (block_m, block_n))
    store_y, tma_y = cpasync.make_tiled_tma_atom(cpasync.CopyBulkTensorTileS2GOp(), y, tile, (block_m, block_n))
    row_scale_kernel(load_x, tma_x, store_y, tma_y, scale, x.element_type, y.element_type, block_m, block_n,
                     stages, design, spin_cycles).launch(
        grid=(ctas, 1, 1), block=(32 * (1 + CONSUMER_WARPS), 1, 1), stream=stream)


# ---------------------------------------------------------------------------
# Checks: everything TMA and the kernel need, before any launch
# ---------------------------------------------------------------------------


def _dtype_name(t) -> str:
    return str(t.dtype).replace("torch.", "")


def check_tma_operand(name: str, t) -> None:
    """A 2-D tensor TMA can describe: row-major rows (unit column stride), 16-byte aligned row stride and base.

    A view with padded rows (``big[:, :n]``) is fine as long as its row
    stride in bytes is a multiple of 16: the tensor map records the stride.
    """
    import torch

    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor; got {type(t).__name__}")
    if _dtype_name(t) not in DTYPES:
        raise TypeError(f"{name} must have dtype {', '.join(DTYPES)}; got {_dtype_name(t)}")
    if t.dim() != 2:
        raise ValueError(f"{name} must be 2-D (rows, columns); got shape {tuple(t.shape)}")
    if t.numel() == 0:
        raise ValueError(f"{name} must not be empty; got shape {tuple(t.shape)}")
    if t.shape[0] < 2:
        # With one row the DSL folds the static (1, n) layout into a 1-D tensor map whose
        # box (block_m x block_n elements in one dimension) breaks the 256-element limit.
        raise ValueError(f"{name} must have at least 2 rows (a single row folds into a 1-D tensor map); "
                         f"got shape {tuple(t.shape)}")
    elem = t.element_size()
    if t.stride(1) != 1 and t.shape[1] > 1:
        raise ValueError(f"{name} must have unit column stride (row-major rows) for TMA; got strides {tuple(t.stride())}")
    if t.shape[0] > 1 and (t.stride(0) * elem) % TMA_ALIGN:
        raise ValueError(f"{name}'s row stride must be a multiple of {TMA_ALIGN} bytes for TMA; got "
                         f"{t.stride(0)} elements = {t.stride(0) * elem} bytes")
    if t.data_ptr() % TMA_ALIGN:
        raise ValueError(f"{name} must start at a {TMA_ALIGN}-byte aligned address for TMA; its data pointer is "
                         f"{t.data_ptr() % TMA_ALIGN} bytes past alignment")


def smem_bytes(x_dtype: str, y_dtype: str, block, stages: int) -> int:
    """Shared memory of one CTA: the x ring, the y ring and two mbarriers per x stage."""
    bm, bn = block
    xe, ye = DTYPES[x_dtype].width // 8, DTYPES[y_dtype].width // 8
    return stages * bm * bn * xe + OUT_STAGES * bm * bn * ye + 16 * stages


def check_config(x_dtype: str, y_dtype: str, block, stages: int, design: str, ctas_per_sm: int = 1) -> tuple:
    """Validate the kernel's compile-time configuration; return ``block`` as a tuple."""
    check_choice("x dtype", x_dtype, tuple(DTYPES))
    check_choice("out dtype", y_dtype, tuple(DTYPES))
    if not (isinstance(block, (tuple, list)) and len(block) == 2):
        raise TypeError(f"block must be a (block_m, block_n) pair; got {block!r}")
    bm, bn = block
    check_int("block_m", bm, lo=1, hi=TMA_MAX_BOX)  # a TMA box has at most 256 elements per dimension
    check_int("block_n", bn, lo=1, hi=TMA_MAX_BOX)
    for which, dt in (("x", x_dtype), ("out", y_dtype)):
        row = bn * DTYPES[dt].width // 8
        if row % TMA_ALIGN:
            raise ValueError(f"block_n * element size must be a multiple of {TMA_ALIGN} bytes for {which} "
                             f"({dt}); got {bn} x {DTYPES[dt].width // 8} = {row} bytes")
    vec = 128 // DTYPES[x_dtype].width
    if (bm * bn) % (vec * CONSUMER_THREADS):
        raise ValueError(f"block_m * block_n must be a multiple of {vec * CONSUMER_THREADS} for {x_dtype} "
                         f"({CONSUMER_THREADS} consumer threads x 16 bytes); got {bm} x {bn} = {bm * bn}")
    check_int("stages", stages, lo=1, hi=16)
    check_choice("design", design, DESIGNS)
    check_int("ctas_per_sm", ctas_per_sm, lo=1, hi=4)
    need = smem_bytes(x_dtype, y_dtype, block, stages)
    if need > MAX_SMEM_BYTES:
        raise ValueError(f"stages={stages} with block {tuple(block)} needs {need} bytes of shared memory per CTA; "
                         f"at most {MAX_SMEM_BYTES} fit")
    if ctas_per_sm * (need + 1024) > SMEM_PER_SM:
        raise ValueError(f"ctas_per_sm={ctas_per_sm} CTAs of {need} bytes of shared memory do not fit one SM "
                         f"(228 KiB, 1 KiB reserved per CTA)")
    return (bm, bn)


def fitting_ctas_per_sm(x_dtype: str, y_dtype: str, block, stages: int, most: int = 2) -> int:
    """How many CTAs of this configuration fit one SM's shared memory (at least 1, at most ``most``)."""
    need = smem_bytes(x_dtype, y_dtype, block, stages) + 1024
    return max(1, min(most, SMEM_PER_SM // need))


def _check_call(x, scale, out, block, stages, design, ctas_per_sm):
    import torch

    check_tma_operand("x", x)
    check_tma_operand("out", out)
    if tuple(out.shape) != tuple(x.shape):
        raise ValueError(f"x and out must have the same shape; got {tuple(x.shape)} and {tuple(out.shape)}")
    if not isinstance(scale, torch.Tensor):
        raise TypeError(f"scale must be a torch.Tensor; got {type(scale).__name__}")
    if scale.dtype != torch.float32:
        raise TypeError(f"scale must have dtype float32; got {_dtype_name(scale)}")
    if scale.dim() != 1 or scale.shape[0] != x.shape[0] or not scale.is_contiguous():
        raise ValueError(f"scale must be a contiguous 1-D tensor of x.shape[0] = {x.shape[0]} elements; "
                         f"got shape {tuple(scale.shape)}")
    xd, yd = _dtype_name(x), _dtype_name(out)
    block = block or default_block(xd)
    if ctas_per_sm is None:
        check_config(xd, yd, block, stages, design)  # the config itself first, then how many fit
        ctas_per_sm = fitting_ctas_per_sm(xd, yd, block, stages)
    block = check_config(xd, yd, block, stages, design, ctas_per_sm)
    for name, t in (("x", x), ("scale", scale), ("out", out)):
        if t.device.type != "cuda":
            raise ValueError(f"{name} must be on a cuda device; got {t.device}")
    return block, ctas_per_sm


def prepare_row_scale(x, scale, out, *, block=None, stages: int = 4, design: str = "carried",
                      ctas_per_sm: int | None = None, ctas: int | None = None, spin_cycles: int = 0):
    """Check the arguments, compile once; return a zero-argument launch of ``out = cast(x * scale[:, None])``.

    ``ctas`` overrides the persistent grid size (default: ``ctas_per_sm`` x SMs, at most one CTA per tile).
    ``spin_cycles``: synthetic compute per stage (the consumers hold each stage that many SM cycles).
    """
    block, ctas_per_sm = _check_call(x, scale, out, block, stages, design, ctas_per_sm)
    if ctas is not None:
        check_int("ctas", ctas, lo=1)
    check_int("spin_cycles", spin_cycles, lo=0, hi=MAX_SPIN_CYCLES)
    require_tier("gpu", "gemmlab.tma_pipeline.row_scale")
    m_tiles = -(-x.shape[0] // block[0])
    grid = max(1, min(m_tiles, ctas or sm_count() * ctas_per_sm))
    return launcher(row_scale_host, x, out, scale, block[0], block[1], stages, design, grid, spin_cycles)


def row_scale(x, scale, out=None, *, out_dtype=None, block=None, stages: int = 4, design: str = "carried",
              ctas_per_sm: int | None = None, ctas: int | None = None, spin_cycles: int = 0):
    """``out[m, n] = cast(x[m, n] * scale[m])`` through the warp-specialized TMA pipeline; returns ``out``.

    ``x``: 2-D float32/bfloat16/float16 CUDA tensor, row-major rows, row
    stride and base 16-byte aligned (any number of rows and columns: partial
    tiles are handled by TMA). ``scale``: float32, one per row. ``out``:
    written in place when given, else a new tensor of ``out_dtype`` (default
    ``x.dtype``). ``block``: the TMA box ``(block_m, block_n)``, each at most
    256 (default 16 KiB: 256 columns). ``stages``: x-ring depth. ``design``:
    ``"carried"`` or ``"unrolled"``. ``ctas_per_sm``: persistent CTAs per SM
    (default: as many as fit shared memory, at most 2); ``ctas``: the grid size instead.
    ``spin_cycles``: synthetic compute, SM clock cycles per stage during which the
    consumers hold the stage (0: none; the result is the same).
    """
    import torch

    if out is None:
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"x must be a torch.Tensor; got {type(x).__name__}")
        if out_dtype is not None and (not isinstance(out_dtype, torch.dtype) or str(out_dtype)[6:] not in DTYPES):
            raise TypeError(f"out_dtype must be one of torch.{', torch.'.join(DTYPES)}; got {out_dtype!r}")
        out = torch.empty(tuple(x.shape), dtype=out_dtype or x.dtype, device=x.device)
    prepare_row_scale(x, scale, out, block=block, stages=stages, design=design, ctas_per_sm=ctas_per_sm,
                      ctas=ctas, spin_cycles=spin_cycles)()
    return out


def reference(x, scale, out_dtype=None):
    """What :func:`row_scale` computes, in torch: float32 product, one rounding to the output type."""
    return (x.float() * scale[:, None]).to(out_dtype or x.dtype)


def compile_row_scale(target: str = "sm_90a", *, shape=(1000, 1200), dtype: str = "bfloat16",
                      out_dtype: str | None = None, block=None, stages: int = 4, design: str = "carried",
                      ctas: int = H100.sms, spin_cycles: int = 0):
    """Compile :func:`row_scale_kernel` without a GPU (static shape), for reading its PTX."""
    check_target(target)
    out_dtype = out_dtype or dtype
    block = check_config(dtype, out_dtype, block or default_block(dtype), stages, design)
    if not (isinstance(shape, (tuple, list)) and len(shape) == 2):
        raise TypeError(f"shape must be a (rows, columns) pair; got {shape!r}")
    rows, cols = shape
    check_int("rows", rows, lo=2)
    check_int("columns", cols, lo=1)
    for dt in (dtype, out_dtype):
        if (cols * DTYPES[dt].width // 8) % TMA_ALIGN:
            raise ValueError(f"a row of {cols} {dt} elements is not a multiple of {TMA_ALIGN} bytes (TMA row stride)")
    check_int("ctas", ctas, lo=1)
    check_int("spin_cycles", spin_cycles, lo=0, hi=MAX_SPIN_CYCLES)
    x = fake_tensor(DTYPES[dtype], (rows, cols), stride_order=(1, 0))
    y = fake_tensor(DTYPES[out_dtype], (rows, cols), stride_order=(1, 0))
    return compile_for(target, row_scale_host, x, y, fake_tensor(Float32, (rows,)), block[0], block[1], stages,
                       design, ctas, spin_cycles, fake_stream())
