"""Chapter 03: asynchronous copies, from ``cp.async`` to ``cp.async.bulk``.

Chapter 01 moved data with ordinary loads and stores: every byte passed through
a thread's registers. Chapter 02 built the mbarrier, a counter in shared memory
that threads (and, as we see here, copy engines) arrive on. This chapter adds
the copies that do **not** pass through registers: the thread only *issues*
them and later waits for them to finish.

* ``cp.async`` (Ampere and later): one thread copies 4, 8 or 16 bytes from
  global to shared memory. The copies a thread issued are grouped with
  ``cp.async.commit_group`` and waited for with ``cp.async.wait_group N``
  ("until at most N of my groups are still in flight"). Counted per thread,
  no mbarrier.
* ``cp.async.bulk`` (Hopper): one thread copies a block of contiguous bytes
  (a multiple of 16) with one instruction. Each copy form has shared memory at
  one end, so one copy moves at most what one CTA's shared memory holds:
  227 KiB on an H100/H200. Global -> shared completes on an **mbarrier**
  (``complete_tx::bytes``: the copy engine subtracts the bytes it has written
  from the barrier's transaction count); shared -> global completes through
  **bulk groups** (``commit_group`` / ``wait_group``, and ``wait_group.read``,
  which returns as soon as the source shared memory has been *read*, so the
  buffer may be reused before the global writes land).
* The cluster copy: ``cp.async.bulk.shared::cluster.shared::cta`` pushes a
  block of our shared memory into a *peer CTA's* shared memory, completing on
  the peer's mbarrier; ``mapa`` turns our shared address into the peer's.
* ``fence.proxy.async``: bulk copies are performed by the **async proxy**,
  ordinary ``ld``/``st`` by the **generic proxy**. Writes by threads to shared
  memory are not ordered with later async-proxy reads of it unless a
  ``fence.proxy.async.shared::cta`` sits in between.

Every PTX instruction is wrapped in a small named function over
``cute.arch.inline_ptx``; the docstrings name the DSL's own equivalent where
one exists. The kernels use the DSL's mbarrier ops (chapter 02 explained the
PTX behind them). Chapter 04 replaces ``cp.async.bulk`` by its tensor form,
TMA (``cp.async.bulk.tensor``), issued through the DSL's copy atoms.

The kernels (static shapes, bytes as ``Uint8`` tensors):

* :func:`cp_async_copy`: G -> S with ``cp.async.cg`` (or ``.ca``) 16-byte
  copies through a ring of stages counted by commit/wait_group, then S -> G.
* :func:`bulk_copy`: the performance kernel. A persistent grid; in each CTA
  one thread streams chunks G -> S (``cp.async.bulk`` + mbarrier per stage)
  and S -> G (``cp.async.bulk`` bulk_group) through a ring of stages.
* :func:`fenced_store`: threads transform a tile in shared memory, fence the
  proxies, one thread stores the tile with a bulk copy.
* :func:`cluster_swap`: a cluster of two CTAs swaps tiles through distributed
  shared memory.
"""
from __future__ import annotations

import numbers

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Constexpr, Float32, Int32, Int64, Uint8, Uint32
from cutlass.memory import SmemAllocator

from .checks import check_choice, check_int, check_real, check_same, check_tensor
from .compile import check_target, compile_for, fake_stream, fake_tensor, launcher
from .ldst import ld_shared_v4, st_global_v4  # chapter 01's wrappers
from .hardware import H100, sm_count
from .tiers import require_tier

#: Bulk copies move whole 16-byte pieces: sizes and addresses are multiples of 16.
BULK_ALIGN = 16
#: The byte sizes ``cp.async.ca`` accepts (``cp.async.cg`` only 16).
CP_ASYNC_CA_SIZES = (4, 8, 16)
#: Shared memory our ring may use per CTA (H100/H200 allow 227 KiB per block).
MAX_RING_BYTES = 200 * 1024
#: Byte offsets are 32-bit in these kernels (with headroom for a tile past the end).
MAX_COPY_BYTES = (1 << 31) - (1 << 20)

# ---------------------------------------------------------------------------
# PTX wrappers: one instruction each
# ---------------------------------------------------------------------------


def _immediate(name: str, n, lo: int = 0) -> int:
    """``n`` must be an int known now (numpy ints too; not a DSL value): it is written into the instruction itself."""
    if isinstance(n, bool) or not isinstance(n, numbers.Integral):
        raise TypeError(f"{name} must be an int (a compile-time immediate); got {type(n).__name__}")
    n = int(n)
    if n < lo:
        raise ValueError(f"{name} must be >= {lo}; got {n}")
    return n


def _check_bulk_size(nbytes) -> None:
    """A size known at trace time (Python int) is checked here; a runtime size is the caller's job."""
    if isinstance(nbytes, numbers.Integral) and not isinstance(nbytes, bool):
        if nbytes <= 0 or nbytes % BULK_ALIGN:
            raise ValueError(f"nbytes must be a positive multiple of {BULK_ALIGN}; got {nbytes}")


def cp_async_ca(smem_dst, gmem_src, nbytes: int) -> None:
    """``cp.async.ca.shared.global [smem_dst], [gmem_src], nbytes``: 4, 8 or 16 bytes, cached in L1.

    Both addresses must be aligned to ``nbytes``. The copy is asynchronous:
    the data is in shared memory only after a ``cp_async_wait_group`` that
    covers the group it was committed in.
    """
    if nbytes not in CP_ASYNC_CA_SIZES:
        raise ValueError(f"nbytes must be one of {CP_ASYNC_CA_SIZES} for cp.async.ca; got {nbytes!r}")
    cute.arch.inline_ptx(
        "cp.async.ca.shared.global [{$r0}], [{$r1}], %d;" % nbytes,
        read_only_args=[smem_dst, gmem_src],
    )


def cp_async_cg(smem_dst, gmem_src) -> None:
    """``cp.async.cg.shared.global [smem_dst], [gmem_src], 16``: 16 bytes, bypassing L1 (L2 only).

    ``.cg`` exists only for 16-byte copies; both addresses 16-byte aligned.
    Streaming data that is read once has no use for L1, so copies use ``.cg``.
    """
    cute.arch.inline_ptx(
        "cp.async.cg.shared.global [{$r0}], [{$r1}], 16;",
        read_only_args=[smem_dst, gmem_src],
    )


def cp_async_commit_group() -> None:
    """``cp.async.commit_group``: close this thread's pending ``cp.async`` copies into one group.

    DSL equivalent: ``cute.arch.cp_async_commit_group()``. An empty group is
    legal, which lets every thread commit once per iteration and keep counts uniform.
    """
    cute.arch.inline_ptx("cp.async.commit_group;")


def cp_async_wait_group(n: int) -> None:
    """``cp.async.wait_group n``: wait until at most ``n`` of this thread's groups are in flight.

    ``n`` is an immediate in the instruction, so it must be a Python int.
    Groups complete in order, so with one group per stage, ``n = stages - 1``
    means "the oldest stage has landed". DSL equivalent: ``cute.arch.cp_async_wait_group(n)``.
    """
    n = _immediate("n", n)
    cute.arch.inline_ptx("cp.async.wait_group %d;" % n)


def cp_async_bulk_g2s(smem_dst, gmem_src, nbytes, mbar) -> None:
    """``cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes``: global -> shared.

    Copies ``nbytes`` (a multiple of 16; both addresses 16-byte aligned) and,
    as bytes land, performs complete-tx on the mbarrier ``mbar``: its
    transaction count drops by the bytes written. Whoever waits on ``mbar``
    must first have announced the bytes with ``mbarrier_arrive_and_expect_tx``.
    A CTA's own shared address is a valid ``shared::cluster`` address.
    """
    _check_bulk_size(nbytes)
    cute.arch.inline_ptx(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [{$r0}], [{$r1}], {$r2}, [{$r3}];",
        read_only_args=[smem_dst, gmem_src, Int32(nbytes), mbar],
    )


def cp_async_bulk_s2g(gmem_dst, smem_src, nbytes) -> None:
    """``cp.async.bulk.global.shared::cta.bulk_group``: shared -> global, tracked by bulk groups.

    ``nbytes`` a multiple of 16, addresses 16-byte aligned. Nothing signals an
    mbarrier: the issuing thread commits the copy into a bulk group and waits
    with :func:`cp_async_bulk_wait_group_read` (source read, buffer reusable)
    or :func:`cp_async_bulk_wait_group` (writes done).
    """
    _check_bulk_size(nbytes)
    cute.arch.inline_ptx(
        "cp.async.bulk.global.shared::cta.bulk_group [{$r0}], [{$r1}], {$r2};",
        read_only_args=[gmem_dst, smem_src, Int32(nbytes)],
    )


def cp_async_bulk_commit_group() -> None:
    """``cp.async.bulk.commit_group``: close this thread's pending bulk stores into one bulk group.

    DSL equivalent: ``cute.arch.cp_async_bulk_commit_group()``.
    """
    cute.arch.inline_ptx("cp.async.bulk.commit_group;")


def cp_async_bulk_wait_group_read(n: int) -> None:
    """``cp.async.bulk.wait_group.read n``: at most ``n`` bulk groups may still be *reading* their source.

    Returns once the shared memory of all older groups has been read, while
    their global writes may still be in flight: the moment a stage's buffer
    may be overwritten. DSL equivalent: ``cute.arch.cp_async_bulk_wait_group(n, read=True)``.
    """
    n = _immediate("n", n)
    cute.arch.inline_ptx("cp.async.bulk.wait_group.read %d;" % n)


def cp_async_bulk_wait_group(n: int) -> None:
    """``cp.async.bulk.wait_group n``: at most ``n`` bulk groups may still be in flight at all.

    All older groups have completed, writes included (e.g. before the kernel
    exits). DSL equivalent: ``cute.arch.cp_async_bulk_wait_group(n)``.
    """
    n = _immediate("n", n)
    cute.arch.inline_ptx("cp.async.bulk.wait_group %d;" % n)


def fence_proxy_async_shared_cta() -> None:
    """``fence.proxy.async.shared::cta``: order this thread's generic-proxy shared accesses with the async proxy.

    Needed between a thread's ordinary stores to shared memory and a bulk
    copy (or TMA store, or WGMMA) that reads that memory. Each writing thread
    fences, then the CTA synchronises, then one thread issues the copy.
    DSL equivalent: ``cute.arch.fence_proxy("async.shared", space="cta")``
    (``cute.arch.fence_view_async_shared()``).
    """
    cute.arch.inline_ptx("fence.proxy.async.shared::cta;")


def mapa_shared_cluster(addr, cta_rank) -> Uint32:
    """``mapa.shared::cluster.u32``: the address of the same shared variable in CTA ``cta_rank`` of our cluster.

    ``addr`` is one of our shared-memory pointers (every CTA of a kernel has
    the same shared layout); the result is a 32-bit ``shared::cluster``
    address for :func:`cp_async_bulk_s2s_cluster`. The DSL applies the same
    instruction inside ``mbarrier_arrive_and_expect_tx(..., peer_cta_rank_in_cluster=r)``.
    """
    return cute.arch.inline_ptx(
        "mapa.shared::cluster.u32 {$w0}, {$r0}, {$r1};",
        write_only_types=[Uint32],
        read_only_args=[addr, Int32(cta_rank)],
    )


def cp_async_bulk_s2s_cluster(dst_cluster_addr, src_smem, nbytes, remote_mbar_cluster_addr) -> None:
    """``cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes``: our shared -> a peer's shared.

    ``dst_cluster_addr`` and ``remote_mbar_cluster_addr`` come from
    :func:`mapa_shared_cluster`; completion is signalled on the *receiver's*
    mbarrier, so the sender learns nothing: it must not free (exit) or
    overwrite ``src_smem`` until the receiver says so (a cluster barrier).
    """
    _check_bulk_size(nbytes)
    cute.arch.inline_ptx(
        "cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes [{$r0}], [{$r1}], {$r2}, [{$r3}];",
        read_only_args=[dst_cluster_addr, src_smem, Int32(nbytes), remote_mbar_cluster_addr],
    )


# ---------------------------------------------------------------------------
# Kernel (a): cp.async G -> S -> G through a ring of stages
# ---------------------------------------------------------------------------

#: Threads per CTA of the cp.async kernel; each moves 16 bytes per stage.
CP_ASYNC_THREADS = 128
CP_ASYNC_TILE = CP_ASYNC_THREADS * 16  # bytes per CTA per stage


@cute.kernel
def cp_async_copy_kernel(src: cute.Tensor, dst: cute.Tensor, cache: Constexpr, stages: Constexpr):
    """Each thread streams its 16-byte slice of every tile this CTA owns through ``stages`` slots.

    Tiles (2 KiB: 128 threads x 16 B) are dealt round-robin to the CTAs. One
    cp.async group per tile; ``wait_group(stages - 1)`` means "the oldest
    tile has landed". Each thread reads back only the 16 bytes it copied
    itself, so no CTA barrier is needed; a kernel whose threads read each
    other's bytes would add ``sync_threads()`` after the wait.
    """
    tidx, _, _ = cute.arch.thread_idx()
    bid, _, _ = cute.arch.block_idx()
    ctas, _, _ = cute.arch.grid_dim()
    nbytes = cute.size(src.shape)  # static
    n_tiles = (nbytes + CP_ASYNC_TILE - 1) // CP_ASYNC_TILE

    ring = SmemAllocator().allocate_array(Uint8, stages * CP_ASYNC_TILE, byte_alignment=128)
    my_tiles = (n_tiles - bid + ctas - 1) // ctas  # tiles bid, bid + ctas, ...
    lane_off = tidx * 16

    # Prologue: put stages - 1 tiles in flight, one group each.
    for j in cutlass.range_constexpr(stages - 1):
        if j < my_tiles:
            off = (bid + j * ctas) * CP_ASYNC_TILE + lane_off
            if off < nbytes:
                _cp_async_16(cache, ring + (j * CP_ASYNC_TILE + lane_off), src.iterator + off)
        cp_async_commit_group()

    # Stage indices are explicit loop-carried Int32s (no phases: cp.async counts groups).
    load_stage = Int32(stages - 1)
    read_stage = Int32(0)
    for k in cutlass.range(my_tiles):
        # Refill: tile k + stages - 1 goes into the slot this thread drained in iteration k - 1.
        if k + stages - 1 < my_tiles:
            off = (bid + (k + stages - 1) * ctas) * CP_ASYNC_TILE + lane_off
            if off < nbytes:
                _cp_async_16(cache, ring + (load_stage * CP_ASYNC_TILE + lane_off), src.iterator + off)
        cp_async_commit_group()  # possibly empty: keeps "one group per iteration"
        cp_async_wait_group(stages - 1)  # tile k's group is now complete

        off = (bid + k * ctas) * CP_ASYNC_TILE + lane_off
        if off < nbytes:
            a, b, c, d = ld_shared_v4(ring + (read_stage * CP_ASYNC_TILE + lane_off))
            st_global_v4(dst.iterator + off, a, b, c, d)

        load_stage = load_stage + 1
        if load_stage == stages:
            load_stage = Int32(0)
        read_stage = read_stage + 1
        if read_stage == stages:
            read_stage = Int32(0)


def _cp_async_16(cache, smem_dst, gmem_src) -> None:
    """16 bytes with ``cp.async.cg`` or ``cp.async.ca`` (chosen at compile time)."""
    if cache == "cg":
        cp_async_cg(smem_dst, gmem_src)
    else:
        cp_async_ca(smem_dst, gmem_src, 16)


@cute.jit
def cp_async_copy_host(src: cute.Tensor, dst: cute.Tensor, ctas: Constexpr, cache: Constexpr,
                       stages: Constexpr, stream: cuda.CUstream):
    cp_async_copy_kernel(src, dst, cache, stages).launch(
        grid=(ctas, 1, 1), block=(CP_ASYNC_THREADS, 1, 1), stream=stream
    )


# ---------------------------------------------------------------------------
# Kernel (b): the staged bulk copy (performance kernel)
# ---------------------------------------------------------------------------


@cute.kernel
def bulk_copy_kernel(src: cute.Tensor, dst: cute.Tensor, stages: Constexpr, stage_bytes: Constexpr):
    """Persistent bulk copy: one thread per CTA streams its chunks through a ring of ``stages`` buffers.

    Chunk ``c`` (``stage_bytes`` bytes, the last one possibly shorter) goes
    to CTA ``c % ctas``. For the k-th chunk of this CTA, in stage ``k % stages``:

    1. load:  ``arrive_and_expect_tx(full[s], bytes)`` then ``cp.async.bulk`` G -> S on ``full[s]``;
    2. wait ``full[s]`` (phase flips each time the ring wraps), store S -> G
       with ``cp.async.bulk`` into a bulk group;
    3. refill the *previous* stage once its store has finished reading it
       (``wait_group.read 1``: every group but the newest has read its source).

    Only the async proxy touches the ring (bulk load writes, bulk store
    reads), and the mbarrier + bulk-group waits order them, so no
    ``fence.proxy.async`` is needed here.
    """
    tidx, _, _ = cute.arch.thread_idx()
    bid, _, _ = cute.arch.block_idx()
    ctas, _, _ = cute.arch.grid_dim()
    nbytes = cute.size(src.shape)  # static
    n_chunks = (nbytes + stage_bytes - 1) // stage_bytes
    last_bytes = nbytes - (n_chunks - 1) * stage_bytes  # a multiple of 16 (checked on the host)

    smem = SmemAllocator()
    ring = smem.allocate_array(Uint8, stages * stage_bytes, byte_alignment=128)
    full = smem.allocate_array(Int64, stages, byte_alignment=8)  # "stage s holds a loaded chunk"

    if tidx == 0:
        for s in cutlass.range_constexpr(stages):
            cute.arch.mbarrier_init(full + s, 1)
        cute.arch.mbarrier_init_fence()
    cute.arch.sync_threads()

    if tidx == 0:
        my_chunks = (n_chunks - bid + ctas - 1) // ctas

        # Prologue: fill the ring.
        for s in cutlass.range_constexpr(stages):
            if s < my_chunks:
                load_chunk(src, ring, full, bid + s * ctas, Int32(s), n_chunks, last_bytes, stage_bytes)

        # Chapter 05 carries (stage, phase) in gemmlab.pipeline.PipelineState.
        stage = Int32(0)
        phase = Int32(0)
        prev_stage = Int32(stages - 1)
        for k in cutlass.range(my_chunks):
            chunk = bid + k * ctas
            nb = Int32(stage_bytes)
            if chunk == n_chunks - 1:
                nb = Int32(last_bytes)
            cute.arch.mbarrier_wait(full + stage, phase)
            cp_async_bulk_s2g(dst.iterator + chunk * stage_bytes, ring + stage * stage_bytes, nb)
            cp_async_bulk_commit_group()

            # Reuse hazard: the previous stage may be reloaded only once its
            # store has *read* it. Waiting with .read 1 leaves the store just
            # issued in flight, so loads and stores overlap.
            if k >= 1:
                if k - 1 + stages < my_chunks:
                    cp_async_bulk_wait_group_read(1)
                    load_chunk(src, ring, full, bid + (k - 1 + stages) * ctas, prev_stage,
                                n_chunks, last_bytes, stage_bytes)

            prev_stage = stage
            stage = stage + 1
            if stage == stages:
                stage = Int32(0)
                phase = phase ^ 1

        # Shared memory must outlive the stores that read it; wait for the writes too.
        cp_async_bulk_wait_group(0)


@cute.jit
def load_chunk(src: cute.Tensor, ring, full, chunk: Int32, stage: Int32, n_chunks: Constexpr,
                last_bytes: Constexpr, stage_bytes: Constexpr):
    """Announce the bytes on ``full[stage]`` and start the G -> S bulk copy of ``chunk`` into that stage."""
    nb = Int32(stage_bytes)
    if chunk == n_chunks - 1:
        nb = Int32(last_bytes)
    cute.arch.mbarrier_arrive_and_expect_tx(full + stage, nb)
    cp_async_bulk_g2s(ring + stage * stage_bytes, src.iterator + chunk * stage_bytes, nb, full + stage)


@cute.jit
def bulk_copy_host(src: cute.Tensor, dst: cute.Tensor, ctas: Constexpr, stages: Constexpr,
                   stage_bytes: Constexpr, stream: cuda.CUstream):
    bulk_copy_kernel(src, dst, stages, stage_bytes).launch(grid=(ctas, 1, 1), block=(32, 1, 1), stream=stream)


# ---------------------------------------------------------------------------
# Kernel (b'): threads write shared memory, then a bulk store reads it
# ---------------------------------------------------------------------------

FENCED_THREADS = 128
FENCED_TILE = 4096  # float32 elements per CTA (16 KiB)


@cute.kernel
def fenced_store_kernel(src: cute.Tensor, dst: cute.Tensor, with_fence: Constexpr):
    """``dst = 2 * src + 1``, tile by tile: bulk load, threads transform in shared memory, bulk store.

    The load is async proxy -> threads: the mbarrier wait makes the bytes
    visible. The store is threads -> async proxy: each thread's
    ``st.shared`` must be fenced with ``fence.proxy.async.shared::cta``
    before the CTA barrier after which one thread issues the bulk store.
    ``with_fence=False`` exists only to compare the PTX: it is a race.
    """
    tidx, _, _ = cute.arch.thread_idx()
    bid, _, _ = cute.arch.block_idx()
    tile_bytes = FENCED_TILE * 4

    smem = SmemAllocator()
    tile = smem.allocate_tensor(Float32, cute.make_layout(FENCED_TILE), byte_alignment=128)
    loaded = smem.allocate_array(Int64, 1, byte_alignment=8)

    if tidx == 0:
        cute.arch.mbarrier_init(loaded, 1)
        cute.arch.mbarrier_init_fence()
    cute.arch.sync_threads()

    if tidx == 0:
        cute.arch.mbarrier_arrive_and_expect_tx(loaded, tile_bytes)
        cp_async_bulk_g2s(tile.iterator, src.iterator + bid * FENCED_TILE, tile_bytes, loaded)
    cute.arch.mbarrier_wait(loaded, 0)  # every thread: the async proxy's writes are now visible

    for j in cutlass.range_constexpr(FENCED_TILE // FENCED_THREADS):
        i = tidx + j * FENCED_THREADS  # consecutive threads, consecutive words: no bank conflicts
        tile[i] = tile[i] * Float32(2.0) + Float32(1.0)

    if with_fence:
        fence_proxy_async_shared_cta()  # my st.shared -> visible to the async proxy
    cute.arch.sync_threads()  # ...and everyone's fence happened before the store below

    if tidx == 0:
        cp_async_bulk_s2g(dst.iterator + bid * FENCED_TILE, tile.iterator, tile_bytes)
        cp_async_bulk_commit_group()
        cp_async_bulk_wait_group(0)


@cute.jit
def fenced_store_host(src: cute.Tensor, dst: cute.Tensor, with_fence: Constexpr, stream: cuda.CUstream):
    n_tiles = cute.size(src.shape) // FENCED_TILE
    fenced_store_kernel(src, dst, with_fence).launch(
        grid=(n_tiles, 1, 1), block=(FENCED_THREADS, 1, 1), stream=stream
    )


# ---------------------------------------------------------------------------
# Kernel (c): a cluster of two CTAs swaps tiles through distributed shared memory
# ---------------------------------------------------------------------------


@cute.kernel
def cluster_swap_kernel(src: cute.Tensor, dst: cute.Tensor, tile_bytes: Constexpr):
    """CTA ``b`` loads tile ``b``, pushes it into its peer's ``inbox``, and stores what it received as tile ``b``.

    Peers are the two CTAs of a cluster (ranks 0 and 1), so tiles 2p and
    2p + 1 trade places. Two cluster barriers frame the exchange:

    * before: the peer's ``inbox_full`` barrier must be initialised before our
      copy signals it;
    * after: our S2S copy's completion is signalled on the *peer's* barrier
      only, so we may exit (freeing ``outbox``) only after the peer saw it.
    """
    tidx, _, _ = cute.arch.thread_idx()
    bid, _, _ = cute.arch.block_idx()
    rank = cute.arch.block_idx_in_cluster()
    peer = rank ^ 1

    smem = SmemAllocator()
    outbox = smem.allocate_array(Uint8, tile_bytes, byte_alignment=128)  # our tile, to send
    inbox = smem.allocate_array(Uint8, tile_bytes, byte_alignment=128)  # the peer's tile, received
    bars = smem.allocate_array(Int64, 2, byte_alignment=8)
    outbox_full = bars  # our G -> S load landed
    inbox_full = bars + 1  # the peer's S -> S push landed

    if tidx == 0:
        cute.arch.mbarrier_init(outbox_full, 1)
        cute.arch.mbarrier_init(inbox_full, 1)
        cute.arch.mbarrier_init_fence()
    cute.arch.cluster_arrive()
    cute.arch.cluster_wait()

    if tidx == 0:
        cute.arch.mbarrier_arrive_and_expect_tx(outbox_full, tile_bytes)
        cp_async_bulk_g2s(outbox, src.iterator + bid * tile_bytes, tile_bytes, outbox_full)
        # We expect tile_bytes from the peer; its complete_tx may even come first
        # (the tx-count goes negative), the phase cannot finish before this arrive.
        cute.arch.mbarrier_arrive_and_expect_tx(inbox_full, tile_bytes)

        cute.arch.mbarrier_wait(outbox_full, 0)
        peer_inbox = mapa_shared_cluster(inbox, peer)
        peer_inbox_full = mapa_shared_cluster(inbox_full, peer)
        cp_async_bulk_s2s_cluster(peer_inbox, outbox, tile_bytes, peer_inbox_full)

        cute.arch.mbarrier_wait(inbox_full, 0)
        cp_async_bulk_s2g(dst.iterator + bid * tile_bytes, inbox, tile_bytes)
        cp_async_bulk_commit_group()
        cp_async_bulk_wait_group(0)

    cute.arch.cluster_arrive()
    cute.arch.cluster_wait()


@cute.jit
def cluster_swap_host(src: cute.Tensor, dst: cute.Tensor, tile_bytes: Constexpr, stream: cuda.CUstream):
    n_tiles = cute.size(src.shape) // tile_bytes
    cluster_swap_kernel(src, dst, tile_bytes).launch(
        grid=(n_tiles, 1, 1), block=(32, 1, 1), cluster=(2, 1, 1), stream=stream
    )


# ---------------------------------------------------------------------------
# Host side: argument checks, launches, compile-only entry points
# ---------------------------------------------------------------------------


def _as_bytes(t):
    """A contiguous tensor viewed as its flat bytes (no copy)."""
    import torch

    return t.reshape(-1).view(torch.uint8)


def _check_copy_pair(src, dst) -> None:
    check_tensor("src", src, align_bytes=BULK_ALIGN)
    check_tensor("dst", dst, align_bytes=BULK_ALIGN)
    check_same("src", src, "dst", dst)
    nbytes = src.numel() * src.element_size()
    if nbytes % BULK_ALIGN:
        raise ValueError(f"src must hold a multiple of {BULK_ALIGN} bytes; got {nbytes}")
    if nbytes > MAX_COPY_BYTES:
        raise ValueError(f"src must hold at most {MAX_COPY_BYTES} bytes (32-bit offsets); got {nbytes}")


def _check_ring(stages, stage_bytes, ctas_per_sm) -> None:
    # One stage cannot work: the loop refills a stage one iteration after storing from it.
    check_int("stages", stages, lo=2, hi=16)
    check_int("stage_bytes", stage_bytes, lo=BULK_ALIGN, multiple_of=BULK_ALIGN)
    check_int("ctas_per_sm", ctas_per_sm, lo=1, hi=4)
    if stages * stage_bytes > MAX_RING_BYTES:
        raise ValueError(
            f"stages * stage_bytes must be <= {MAX_RING_BYTES} bytes of shared memory; "
            f"got {stages} * {stage_bytes} = {stages * stage_bytes}"
        )


def _cp_async_ctas(nbytes: int, sms: int) -> int:
    """Enough CTAs to fill every SM several times over (each has 128 threads, ~8 KiB of shared memory)."""
    n_tiles = -(-nbytes // CP_ASYNC_TILE)
    return max(1, min(n_tiles, 8 * sms))


def prepare_cp_async_copy(src, dst, *, cache: str = "cg", stages: int = 4):
    """Check arguments, compile once, and return ``run()`` copying ``src`` into ``dst`` with cp.async."""
    check_choice("cache", cache, ("cg", "ca"))
    check_int("stages", stages, lo=1, hi=8)
    _check_copy_pair(src, dst)
    require_tier("gpu", "gemmlab.async_copy.cp_async_copy")
    s, d = _as_bytes(src), _as_bytes(dst)
    return launcher(cp_async_copy_host, s, d, _cp_async_ctas(s.numel(), sm_count()), cache, stages)


def cp_async_copy(src, dst, *, cache: str = "cg", stages: int = 4):
    """Copy ``src`` into ``dst`` (same shape/dtype, contiguous, 16-byte multiples) with ``cp.async``; return ``dst``."""
    prepare_cp_async_copy(src, dst, cache=cache, stages=stages)()
    return dst


def _bulk_ctas(nbytes: int, stage_bytes: int, ctas_per_sm: int, sms: int) -> int:
    n_chunks = -(-nbytes // stage_bytes)
    return max(1, min(n_chunks, ctas_per_sm * sms))


def prepare_bulk_copy(src, dst, *, stages: int = 4, stage_bytes: int = 16384, ctas_per_sm: int = 2):
    """Check arguments, compile once, and return ``run()`` copying ``src`` into ``dst`` with ``cp.async.bulk``."""
    _check_ring(stages, stage_bytes, ctas_per_sm)
    _check_copy_pair(src, dst)
    require_tier("gpu", "gemmlab.async_copy.bulk_copy")
    s, d = _as_bytes(src), _as_bytes(dst)
    ctas = _bulk_ctas(s.numel(), stage_bytes, ctas_per_sm, sm_count())
    return launcher(bulk_copy_host, s, d, ctas, stages, stage_bytes)


def bulk_copy(src, dst, *, stages: int = 4, stage_bytes: int = 16384, ctas_per_sm: int = 2):
    """Copy ``src`` into ``dst`` with the staged ``cp.async.bulk`` kernel; return ``dst``.

    Any size that is a multiple of 16 bytes (the last chunk may be short);
    ``stages`` shared-memory buffers of ``stage_bytes`` per CTA, ``ctas_per_sm``
    CTAs per SM (a persistent grid).
    """
    prepare_bulk_copy(src, dst, stages=stages, stage_bytes=stage_bytes, ctas_per_sm=ctas_per_sm)()
    return dst


def _check_out(out, src):
    if out is None:
        import torch

        return torch.empty_like(src)
    check_tensor("out", out, align_bytes=BULK_ALIGN)
    check_same("src", src, "out", out)
    return out


def fenced_store(src, out=None):
    """``2 * src + 1`` computed in shared memory and written back by a bulk store after ``fence.proxy.async``.

    ``src``: a contiguous float32 CUDA tensor of a multiple of 4096 elements.
    Writes into ``out`` when given (same shape), else a new tensor; returns it.
    """
    import torch

    check_tensor("src", src, dtypes=(torch.float32,), align_bytes=BULK_ALIGN, numel_multiple=FENCED_TILE)
    out = _check_out(out, src)
    require_tier("gpu", "gemmlab.async_copy.fenced_store")
    launcher(fenced_store_host, src.reshape(-1), out.reshape(-1), True)()
    return out


def cluster_swap(src, out=None):
    """Swap rows pairwise (row 2p <-> row 2p + 1) through a cluster of two CTAs per pair.

    ``src``: a contiguous 2-D CUDA tensor with an even number of rows, each
    row a multiple of 16 bytes and at most 64 KiB (one CTA's tile).
    Returns ``out`` (new unless given): ``out[2p] = src[2p + 1]``, ``out[2p + 1] = src[2p]``.
    """
    check_tensor("src", src, ndim=2, align_bytes=BULK_ALIGN)
    rows = src.shape[0]
    if rows % 2:
        raise ValueError(f"src must have an even number of rows (one pair per cluster); got {rows}")
    row_bytes = src.shape[1] * src.element_size()
    if row_bytes % BULK_ALIGN or row_bytes > 65536:
        raise ValueError(f"each row of src must be a multiple of {BULK_ALIGN} bytes and at most 65536; got {row_bytes}")
    out = _check_out(out, src)
    require_tier("gpu", "gemmlab.async_copy.cluster_swap")
    launcher(cluster_swap_host, _as_bytes(src), _as_bytes(out), row_bytes)()
    return out


#: The copy kernel the course holds to the bandwidth bar (>= 85% of torch's copy).
BENCH_KERNEL = "bulk, 4 x 16 KiB, 2 CTAs/SM"


def copiers() -> dict:
    """Copy kernels of this chapter for :func:`gemmlab.measure.copybench.measure_copies` (name -> prepare)."""
    return {
        "cp.async.cg, 4 stages": lambda s, d: prepare_cp_async_copy(s, d, cache="cg", stages=4),
        BENCH_KERNEL: lambda s, d: prepare_bulk_copy(s, d, stages=4, stage_bytes=16384, ctas_per_sm=2),
    }


# Compile-only entry points: any machine, explicit target, static shapes.


def compile_cp_async_copy(target: str, *, nbytes: int = 1 << 20, cache: str = "cg", stages: int = 4,
                          ctas: int = H100.sms):
    check_target(target)
    check_int("nbytes", nbytes, lo=BULK_ALIGN, multiple_of=BULK_ALIGN)
    check_choice("cache", cache, ("cg", "ca"))
    check_int("stages", stages, lo=1, hi=8)
    check_int("ctas", ctas, lo=1)
    t = fake_tensor(Uint8, (nbytes,))
    return compile_for(target, cp_async_copy_host, t, fake_tensor(Uint8, (nbytes,)), ctas, cache, stages, fake_stream())


def compile_bulk_copy(target: str, *, nbytes: int = 1 << 20, stages: int = 4, stage_bytes: int = 16384,
                      ctas: int = H100.sms):
    check_target(target)
    check_int("nbytes", nbytes, lo=BULK_ALIGN, multiple_of=BULK_ALIGN)
    _check_ring(stages, stage_bytes, 1)
    check_int("ctas", ctas, lo=1)
    t = fake_tensor(Uint8, (nbytes,))
    return compile_for(target, bulk_copy_host, t, fake_tensor(Uint8, (nbytes,)), ctas, stages, stage_bytes,
                       fake_stream())


def compile_fenced_store(target: str, *, n: int = 4 * FENCED_TILE, fence: bool = True):
    check_target(target)
    check_int("n", n, lo=FENCED_TILE, multiple_of=FENCED_TILE)
    if not isinstance(fence, bool):
        raise TypeError(f"fence must be a bool; got {type(fence).__name__}")
    t = fake_tensor(Float32, (n,))
    return compile_for(target, fenced_store_host, t, fake_tensor(Float32, (n,)), fence, fake_stream())


def compile_cluster_swap(target: str, *, tiles: int = 4, tile_bytes: int = 16384):
    check_target(target)
    check_int("tiles", tiles, lo=2, multiple_of=2)
    check_int("tile_bytes", tile_bytes, lo=BULK_ALIGN, hi=65536, multiple_of=BULK_ALIGN)
    n = tiles * tile_bytes
    return compile_for(target, cluster_swap_host, fake_tensor(Uint8, (n,)), fake_tensor(Uint8, (n,)), tile_bytes,
                       fake_stream())


# ---------------------------------------------------------------------------
# Models and figures
# ---------------------------------------------------------------------------


def ring_schedule(n_chunks: int, stages: int, *, latency: float = 4.0, transfer: float = 1.0,
                  read: float = 1.0) -> list[dict]:
    """When each chunk of :func:`bulk_copy_kernel`'s loop is loaded and stored, in a toy time model.

    A load finishes ``latency`` after it is issued, and no sooner than
    ``transfer`` after the previous load finished (the CTA's share of
    bandwidth). A store reads its stage for ``read``. The single thread
    issues exactly as the kernel does: wait for chunk k, store it, wait until
    the store of chunk k - 1 has read its stage, refill that stage with chunk
    k - 1 + stages. Returns one row per chunk: ``chunk``, ``stage``,
    ``load_start``, ``load_end``, ``store_start``, ``read_end``.
    """
    check_int("n_chunks", n_chunks, lo=1)
    check_int("stages", stages, lo=2)
    latency, transfer, read = (check_real(name, v, lo=0, lo_open=True)
                               for name, v in (("latency", latency), ("transfer", transfer), ("read", read)))
    rows = [dict(chunk=j, stage=j % stages) for j in range(n_chunks)]
    last_load_end = 0.0

    def load(j, t):
        nonlocal last_load_end
        end = max(t + latency, last_load_end + transfer)
        rows[j].update(load_start=t, load_end=end)
        last_load_end = end

    for j in range(min(stages, n_chunks)):
        load(j, 0.0)
    t = 0.0
    for k in range(n_chunks):
        t = max(t, rows[k]["load_end"])  # mbarrier wait on full[stage]
        rows[k].update(store_start=t, read_end=t + read)
        if k >= 1 and k - 1 + stages < n_chunks:
            t = max(t, rows[k - 1]["read_end"])  # cp.async.bulk.wait_group.read 1
            load(k - 1 + stages, t)
    return rows


def draw_ring_timeline(stage_counts=(2, 4), n_chunks: int = 12) -> str:
    """Gantt charts of :func:`ring_schedule` for a few ring sizes; returns the figure's path."""
    from .figures import new_figure, save

    fig, axes = new_figure(len(stage_counts), 1, figsize=(9, 1.2 + 0.75 * sum(stage_counts)), sharex=True,
                           squeeze=False, gridspec_kw={"height_ratios": list(stage_counts)})
    end = max(r["read_end"] for s in stage_counts for r in ring_schedule(n_chunks, s))
    for ax, stages in zip(axes[:, 0], stage_counts):
        rows = ring_schedule(n_chunks, stages)
        for r in rows:
            y = r["stage"]
            ax.barh(y, r["load_end"] - r["load_start"], left=r["load_start"], height=0.6, color="#4C72B0")
            ax.barh(y, r["read_end"] - r["store_start"], left=r["store_start"], height=0.6, color="#DD8452")
            ax.text(r["load_start"] + 0.1, y, f"{r['chunk']}", va="center", ha="left", color="white", fontsize=8)
        total = rows[-1]["read_end"]
        ax.set_yticks(range(stages))
        ax.set_yticklabels([f"stage {s}" for s in range(stages)])
        ax.invert_yaxis()
        ax.set_xlim(0, end + 0.5)
        ax.set_title(f"{stages} stages: {n_chunks} chunks done at t = {total:g}", fontsize=10)
    axes[-1, 0].set_xlabel("time (load latency 4, one load finishes per 1, store reads for 1)")
    from matplotlib.patches import Patch

    # The ring with the most stages finishes first: its right side is empty.
    axes[-1, 0].legend(handles=[Patch(color="#4C72B0", label="G->S load in flight (full[s] pending)"),
                                Patch(color="#DD8452", label="S->G store reading the stage")],
                       loc="center right", fontsize=8)
    return str(save(fig, "03_ring_timeline"))


#: The steps of :func:`fenced_store_kernel`, lane by lane: (lane, text). Lane 0 is the
#: threads (generic proxy), lane 1 the bulk-copy engine (async proxy).
PROXY_STEPS = (
    (0, "thread 0: mbarrier.arrive.expect_tx(loaded, 16 KiB)\nthread 0: cp.async.bulk G->S"),
    (1, "engine writes the tile into shared memory,\ncomplete_tx on 'loaded'"),
    (0, "all threads: mbarrier wait(loaded)\n(async writes now visible: no fence needed)"),
    (0, "all threads: ld.shared, 2x+1, st.shared"),
    (0, "all threads: fence.proxy.async.shared::cta"),
    (0, "bar.sync (every thread's fence is done)"),
    (0, "thread 0: cp.async.bulk S->G + commit_group"),
    (1, "engine reads shared memory, writes global"),
    (0, "thread 0: cp.async.bulk.wait_group 0"),
)


def draw_proxies() -> str:
    """The two proxies and where the fence sits (the steps of :data:`PROXY_STEPS`); returns the path."""
    from .figures import new_figure, save

    fig, ax = new_figure(figsize=(9, 6.2))
    lanes = {0: 0.25, 1: 0.75}
    ax.text(lanes[0], 1.0, "threads: generic proxy\n(ld/st.shared, ld/st.global)", ha="center", va="bottom",
            fontsize=11, weight="bold")
    ax.text(lanes[1], 1.0, "copy engine: async proxy\n(cp.async.bulk, TMA, wgmma operands)", ha="center",
            va="bottom", fontsize=11, weight="bold")
    for x in lanes.values():
        ax.plot([x, x], [0.0, 0.97], color="#bbbbbb", lw=1, zorder=0)
    n = len(PROXY_STEPS)
    ys = [0.93 - i * 0.9 / (n - 1) for i in range(n)]
    prev = None
    for (lane, text), y in zip(PROXY_STEPS, ys):
        fence = "fence.proxy" in text
        ax.text(lanes[lane], y, text, ha="center", va="center", fontsize=8.5,
                bbox=dict(boxstyle="round,pad=0.35", fc="#fde0c5" if fence else ("#dce6f2" if lane == 0 else "#e2f0d9"),
                          ec="#c0504d" if fence else "#777777", lw=2 if fence else 1))
        if prev is not None:
            gap = 0.035 if lane == prev[0] else 0.05  # cross-lane arrows leave the boxes' edges
            ax.annotate("", xy=(lanes[lane], y + gap), xytext=(lanes[prev[0]], prev[1] - gap),
                        arrowprops=dict(arrowstyle="->", color="#555555", lw=1))
        prev = (lane, y)
    ax.set_xlim(0, 1)
    ax.set_ylim(-0.04, 1.1)
    ax.axis("off")
    return str(save(fig, "03_proxies"))
