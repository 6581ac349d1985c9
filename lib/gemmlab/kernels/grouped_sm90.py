"""Chapter 08: the grouped GEMM on Hopper, with TMA descriptors rewritten on the device.

A Mixture-of-Experts layer multiplies each token by the weights of the expert
it was routed to: G independent GEMMs of different M (tokens per expert), one
launch. This kernel is chapter 07's persistent warp-specialized GEMM with two
changes:

* **One tile order across all groups.** Tiles are numbered group after group
  (within a group, M fastest); CTA ``b`` takes tiles ``b, b + grid, ...`` and
  finds each tile's group with a cursor that only moves forward. The group
  sizes are read on the device (from torch's cumulative ``offs`` or from a
  table of problems), so the host never waits for them. With ``by_size``
  (the host sets it as :func:`gemmlab.family.heuristic_grouped.largest_first` decides: for
  128-row tiles run one CTA each, with dynamic scheduling only from 12288
  tokens) the groups are visited largest first: warp 1 of every CTA ranks the sizes into a
  shared-memory list before the first tile (:func:`rank_groups`), so the
  compute-bound experts run while the SMs are all busy and the short,
  bandwidth-bound tiles of small experts fill the end.
* **TMA descriptors rewritten on the device.** A TMA descriptor holds one
  tensor's address, sizes and strides. Each group has its own A, B and C, so
  when a CTA moves to a new group it rewrites its private copies of the
  descriptors: copy the template into shared memory, ``tensormap.replace``
  the address, sizes and strides there, publish it to the CTA's global slot
  with ``tensormap.cp_fenceproxy`` (a release), and acquire it with
  ``fence.proxy.tensormap::generic.acquire`` before the first TMA that uses it.
  A group's edge is then an edge of its tensors: TMA zero-fills the rows a
  tile reads past the group's end and drops the rows it would store there.
* **256-byte L2 promotion** for A and B. Each TMA box row of a K-major
  tile is one 128-byte line; the descriptors ask L2 to fetch 256 bytes per
  miss, so the next k-block's line of each row comes with it. The field is
  written once into the shared-memory template (:func:`set_l2_promotion`).
* **Dynamic tile scheduling** (``dynamic``): after its first tile a CTA
  claims the next unclaimed tile with an atomic add on a counter in the
  workspace and tells its consumers which one through shared memory beside
  the stage's barrier, so CTAs that get less memory bandwidth take fewer tiles
  and the CTAs finish together; a last empty stage says the tiles ran out. In
  a pair only the first CTA claims; it posts each unit to its partner through
  a small mailbox in the workspace. The pieces (:func:`~gemmlab.scheduler.claim_tile`,
  :func:`~gemmlab.scheduler.post_unit`, ...) are :mod:`gemmlab.scheduler`'s, next to
  chapter 07's static order, for any kernel that claims its tiles.
* **The store under the next main loop** (``overlap_store``; the host turns it on for 128-row tiles from 256
  tokens per expert, :func:`gemmlab.family.heuristic_grouped.store_under_next`). A warpgroup converts its finished accumulators
  to ``c_type`` in registers of their own (64 per thread for a 64 x 256 slab), starts the next tile, and stores
  the saved one sub-tile by sub-tile between that tile's first k-blocks, while their wgmmas run
  (:func:`mma_tile_storing`): the tensor cores no longer wait out the store between two tiles.
* **Clusters inside a group** (``cfg.cluster = (2, 1)``). A unit of work is
  two M-tiles of one group and one N-tile; the cluster's two CTAs take one
  each and share the weight tile by multicast. Units never straddle groups,
  so both CTAs always describe the same group; the second CTA of a pair
  past the group's rows gets a zero-filled A and a dropped store.

Descriptor slots (128 bytes each, in a global workspace, one set per CTA):
    A: ``stages + 1`` slots, B: ``stages + 1`` slots (:func:`gemmlab.family.configs.ab_slots`; the
       producer moves to the next one at each group change). A TMA load may still be reading its descriptor
       until the load completes, and the producer only ever waits for the stage it is about to fill, so with
       groups of one k-block a slot could be rewritten while an earlier group's load is still queued. With
       ``stages + 1`` slots it cannot: a slot comes round again only after ``stages`` more group changes,
       i.e. after at least ``stages`` more loads, and before the last of those the producer waited until the
       stage of the slot's last load was released, which needs that load to have completed
       (:func:`gemmlab.grouped_model.slot_reuse_margin` is the CPU model, and ``tests/test_grouped.py``
       checks it);
    C: 1 slot per consumer warpgroup (before it rewrites the slot, its store
       warp waits until its earlier stores have read shared memory: the TMA
       unit has taken them up; CUTLASS's and the CuTe DSL's grouped GEMMs wait
       the same way before rewriting a store descriptor).

Two ways to describe the groups (``mode``, a compile-time choice):
    ``"ragged"``: torch's MoE convention, ``a`` (T x K) holding every group's rows
        one after the other, ``offs[g]`` the end row of group g, ``b`` (G, K, N)
        and ``c`` (T x N);
    ``"table"``: independent problems, one int64 row per group:
        ``(address of A, of B, of C, M, N, K, lda, ldb, ldc)``.
"""
from __future__ import annotations

import functools

import cutlass
import cutlass.cute as cute
import cutlass.utils as utils
import cuda.bindings.driver as cuda
from cutlass import Float32, Int32, Int64
from cutlass.cute.nvgpu import cpasync, warpgroup
from cutlass.memory import SmemAllocator
from cutlass.tensor_utils import TensorMapManager, TensorMapUpdateMode

from ..family.configs import (DESC_BYTES, DESC_WORDS, INT32_MAX, L2_PROMOTIONS, ORDER_MAX,  # noqa: F401
                              TABLE_COLUMNS, Sm90Config, ab_slots, check_grouped_config, check_grouped_smem,
                              light_base, sched_slot, slots_per_cta)
from .gemm_sm90 import (CONSUMER_REGS, EPI_BARRIER, PRODUCER_REGS, WG_ROWS, epilogue_operands,
                        mma_and_smem_layouts, mma_operands, mma_tile, release_stage, store_tile)
from ..pipeline import DevicePipelineState
from ..scheduler import (CLAIM_LEAD, MAILBOX_FIRST, MAILBOX_WORDS, NO_MORE_TILES, claim_tile, claimed_tile,  # noqa: F401
                         clear_mailbox, post_unit, put_tile_of, reset_counters, tile_of, wait_unit)

#: What a traced launch (``trace=True``) records per CTA in its last workspace slot: ``%globaltimer``
#: nanoseconds at each point, then the CTA's tile count. Producer: entry (thread 0, the kernel's first
#: instruction), first_load (before its first TMA load), producer_done (after its last). Consumer warpgroup 0's
#: first thread: first_mainloop_end and first_tile_end (its first tile's main loop, then its store issued),
#: last_mainloop_end, exit (its last stores have read shared memory).
TRACE_POINTS = ("entry", "first_load", "first_mainloop_end", "first_tile_end", "last_mainloop_end",
                "producer_done", "exit", "tiles")


@cute.jit
def stamp(workspace: cute.Tensor, cta: Int32, point: str, trace: cutlass.Constexpr, value=None):
    """Write ``%globaltimer`` (or ``value``) at ``point`` of this CTA's trace slot; nothing unless tracing."""
    if cutlass.const_expr(trace):
        slot = cute.size(workspace, mode=[1]) - 1
        workspace[(cta, slot, TRACE_POINTS.index(point))] = cute.arch.globaltimer() if value is None else Int64(value)


# --------------------------------------------------------------------------------------
# The descriptor update, one named step per PTX instruction it teaches
# --------------------------------------------------------------------------------------

_MAPS = TensorMapManager(TensorMapUpdateMode.SMEM, DESC_BYTES)


def global_slot(workspace: cute.Tensor, cta: Int32, slot: int):
    """The global address of this CTA's descriptor slot, typed as a TMA descriptor pointer."""
    return _MAPS.get_tensormap_ptr(workspace[(cta, slot, None)].iterator)


def slot_descriptor(workspace: cute.Tensor, cta: Int32, slot):
    """The descriptor in this CTA's slot as a TMA copy names it (``tma_desc_ptr=``): a generic address."""
    return _MAPS.get_tensormap_ptr(global_slot(workspace, cta, slot), cute.AddressSpace.generic)


def smem_slot(scratch, i):
    """Scratch descriptor ``i`` in shared memory, as a 128-byte-aligned pointer (the tensormap instructions need it)."""
    addr = cute.arch.make_warp_uniform((scratch + DESC_WORDS * i).toint())
    return cute.make_ptr(Int64, addr, mem_space=cute.AddressSpace.smem, assumed_align=DESC_BYTES)


@cute.jit
def start_descriptor(atom: cute.CopyAtom, smem_slot):
    """Copy the host-built template descriptor (a kernel parameter) into shared memory.

    Only the fields that differ between groups are rewritten later; the rest
    (element type, box size, swizzle, L2 promotion) stay the template's.
    """
    with cute.arch.elect_one():
        cpasync.copy_tensormap(atom, smem_slot)
    cute.arch.sync_warp()


#: A tensor map's L2 promotion: how many bytes L2 fetches from memory for a TMA request that misses
#: (the driver's ``CUtensorMapL2promotion``: 0 none, 1 64 B, 2 128 B, 3 256 B). The CuTe DSL encodes its
#: templates with 128 B and ``tensormap.replace`` has no field for it, so :func:`set_l2_promotion` writes it
#: into the shared-memory copy: bits 17-18 of the descriptor's third 32-bit word (bytes 8-11), where
#: ``cuTensorMapEncodeTiled`` puts it (checked on the GPU by ``tests/test_grouped.py``).
L2_PROMOTION_WORD, L2_PROMOTION_SHIFT = 1, 17  # 64-bit word 1 (bytes 8-15), bits 17-18


@cute.jit
def set_l2_promotion(smem_slot, promotion: cutlass.Constexpr):
    """Rewrite the L2 promotion of a descriptor's shared-memory copy (once, before the first group's rewrite).

    A plain shared-memory store by one lane, ordered before the warp's later
    ``tensormap.replace`` and publish by ``__syncwarp``: the field is then part of
    every descriptor this CTA publishes.
    """
    if cutlass.const_expr(promotion is not None):
        words = cute.make_tensor(smem_slot, cute.make_layout(DESC_WORDS))
        if cute.arch.lane_idx() == 0:
            w = words[L2_PROMOTION_WORD]
            w = (w & Int64(~(3 << L2_PROMOTION_SHIFT))) | Int64(promotion << L2_PROMOTION_SHIFT)
            words[L2_PROMOTION_WORD] = w
        cute.arch.sync_warp()


@cute.jit
def rewrite_descriptor(atom: cute.CopyAtom, tensor: cute.Tensor, smem_slot):
    """``tensormap.replace`` the address, sizes and strides of the shared-memory copy with ``tensor``'s.

    The DSL's update elects one lane to write (``elect.sync`` inside: so it must be
    called by the whole warp, never from an already elected lane, which hangs);
    ``__syncwarp`` then orders that lane's writes before the other lanes' part in
    the warp-wide publish that follows.
    """
    cpasync.update_tma_descriptor(atom, tensor, smem_slot)
    cute.arch.sync_warp()


@cute.jit
def publish_descriptor_unfenced(workspace: cute.Tensor, cta: Int32, slot: int, smem_slot):
    """The broken twin of :func:`publish_descriptor` (a teaching knob): 16 plain 8-byte copies.

    The bytes reach global memory through the generic proxy only: nothing
    orders them with the TMA unit's reads through the tensormap proxy.
    """
    lane = cute.arch.lane_idx()
    src = cute.make_tensor(smem_slot, cute.make_layout(DESC_WORDS))
    if lane < DESC_WORDS:
        workspace[(cta, slot, lane)] = src[lane]
    cute.arch.sync_warp()


@cute.jit
def publish_descriptor(global_ptr, smem_slot):
    """``tensormap.cp_fenceproxy ... release``: copy the 128 bytes to the global slot *and* order the copy.

    The descriptor is written through the generic proxy but read by the TMA
    unit through the tensormap proxy; the release makes the new bytes visible
    to that proxy at GPU scope. It is ``.sync.aligned``: the whole warp runs it.
    """
    cpasync.cp_fence_tma_desc_release(global_ptr, smem_slot)


@cute.jit
def acquire_descriptor(global_ptr):
    """``fence.proxy.tensormap::generic.acquire``: the issuing thread's next TMA sees the published bytes.

    Without it the TMA unit may use a stale cached copy of the slot: the previous
    group's address and sizes.
    """
    cpasync.fence_tma_desc_acquire(global_ptr)


# --------------------------------------------------------------------------------------
# Groups: sizes and tensors, read on the device
# --------------------------------------------------------------------------------------


@cute.jit
def group_shape(g: Int32, offs: cute.Tensor, table: cute.Tensor, rows: Int32, n: Int32, k: Int32,
                mode: cutlass.Constexpr):
    """``(first row, M, N, K)`` of group ``g``.

    Ragged: ``offs`` is clamped to ``[previous end, rows]``, so a bad ``offs``
    yields empty groups, never an access outside ``a`` or ``c``.
    """
    if cutlass.const_expr(mode == "ragged"):
        start = Int32(0)
        if g > 0:
            start = cutlass.min(cutlass.max(offs[g - 1], Int32(0)), rows)
        end = cutlass.min(cutlass.max(offs[g], start), rows)
        return start, end - start, n, k
    return Int32(0), Int32(table[(g, 3)]), Int32(table[(g, 4)]), Int32(table[(g, 5)])


#: Words of the offs report (:func:`check_offs`): the first bad group + 1 (0: none), its ``offs``, the previous
#: end (0 for group 0) and the rows of ``a``.
OFFS_REPORT_WORDS = 4


@cute.jit
def check_offs(offs: cute.Tensor, groups: Int32, rows: Int32, report_addr: Int64):
    """One warp checks ``offs`` on the device: non-decreasing from 0 and at most ``rows``, the rule
    :func:`gemmlab.family.problem.check_offs_values` applies on the host. The first bad group goes to the
    report at ``report_addr`` (:data:`OFFS_REPORT_WORDS` words, host memory the host reads without waiting),
    unless the report already holds one (an earlier call's error is kept until the host has read it).

    Nothing else depends on it: :func:`group_shape` clamps ``offs`` whatever this finds, so the kernel
    computes the good groups and never reads or writes outside ``a`` or ``c``. Lanes take 32 groups a round;
    the lowest bad lane of the first round that has one writes.
    """
    report = cute.make_tensor(cute.make_ptr(Int32, report_addr, cute.AddressSpace.gmem, assumed_align=16),
                              cute.make_layout(OFFS_REPORT_WORDS))
    lane = cute.arch.lane_idx()
    base = Int32(0)
    while base < groups:
        g = base + lane
        bad = False
        end = Int32(0)
        prev = Int32(0)
        if g < groups:
            end = offs[g]
            if g > 0:
                prev = offs[g - 1]
            bad = (end < prev) | (end > rows)
        mask = cute.arch.vote_ballot_sync(bad)
        if mask != 0:
            below = mask & ((Int32(1) << lane) - 1)
            if bad and below == 0 and report[0] == 0:
                report[1] = end
                report[2] = prev
                report[3] = rows
                cute.arch.fence_acq_rel_sys()  # the host may read while the kernel runs: the words before the flag
                report[0] = g + 1  # last: the word the host polls
            base = groups  # the first bad group is reported; done
        else:
            base += 32


@cute.jit
def group_tiles(m: Int32, n: Int32, bm: cutlass.Constexpr, bn: cutlass.Constexpr):
    """``(m_tiles, tiles)`` of a group (0 tiles when M is 0)."""
    mt = (m + bm - 1) // bm
    return mt, mt * ((n + bn - 1) // bn)


@cute.jit
def group_tensor(which: cutlass.Constexpr, g: Int32, row0: Int32, m: Int32, n: Int32, k: Int32,
                 template: cute.Tensor, b_group_stride: Int64, table: cute.Tensor,
                 mode: cutlass.Constexpr, b_major_n: cutlass.Constexpr):
    """Group ``g``'s A (M x K), B (N x K view) or C (M x N) as a global tensor: what the descriptor will describe."""
    dtype = template.element_type
    if cutlass.const_expr(mode == "ragged"):
        if cutlass.const_expr(which == "a"):
            return cute.make_tensor(template.iterator + Int64(row0) * Int64(k),
                                    cute.make_layout((m, k), stride=(k, 1)))
        if cutlass.const_expr(which == "c"):
            return cute.make_tensor(template.iterator + Int64(row0) * Int64(n),
                                    cute.make_layout((m, n), stride=(n, 1)))
        base = template.iterator + Int64(g) * b_group_stride
        if cutlass.const_expr(b_major_n):
            return cute.make_tensor(base, cute.make_layout((n, k), stride=(1, n)))
        return cute.make_tensor(base, cute.make_layout((n, k), stride=(k, 1)))
    col = {"a": 0, "b": 1, "c": 2}[which]
    ld = Int32(table[(g, 6 + col)])
    ptr = cute.make_ptr(dtype, table[(g, col)], cute.AddressSpace.gmem, assumed_align=16)
    if cutlass.const_expr(which == "a"):
        return cute.make_tensor(ptr, cute.make_layout((m, k), stride=(ld, 1)))
    if cutlass.const_expr(which == "c"):
        return cute.make_tensor(ptr, cute.make_layout((m, n), stride=(ld, 1)))
    if cutlass.const_expr(b_major_n):
        return cute.make_tensor(ptr, cute.make_layout((n, k), stride=(1, ld)))
    return cute.make_tensor(ptr, cute.make_layout((n, k), stride=(ld, 1)))


@cute.jit
def rank_groups(order, sizes, offs, table, groups: Int32, rows: Int32, n: Int32, k: Int32, mode: cutlass.Constexpr):
    """One warp writes ``order[i]``: the group visited ``i``-th, largest M first (ties: lower index first).

    Each lane stages the sizes of groups ``lane, lane + 32, ...`` in shared
    memory, then counts, for each of its groups, the groups that go before it:
    that count is its place. A rank is a permutation, so no two lanes write one slot.
    """
    lane = cute.arch.lane_idx()
    for g in cutlass.range(lane, groups, 32, unroll=1):
        _, m, _, _ = group_shape(g, offs, table, rows, n, k, mode)
        sizes[g] = m
    cute.arch.sync_warp()
    for g in cutlass.range(lane, groups, 32, unroll=1):
        m = sizes[g]
        place = Int32(0)
        for h in cutlass.range(groups, unroll=4):
            other = sizes[h]
            if (other > m) | ((other == m) & (h < g)):
                place = place + 1
        order[place] = g


@cute.jit
def group_at(i: Int32, order, groups: Int32, by_size: cutlass.Constexpr):
    """The group visited ``i``-th: ``order[i]`` when ranked, else ``i``."""
    g = i
    if cutlass.const_expr(by_size):
        if groups <= ORDER_MAX:
            g = order[i]
    return g


@cute.jit
def count_streams(sizes, groups: Int32, n: Int32, bm: cutlass.Constexpr, bn: cutlass.Constexpr,
                  light_rows: cutlass.Constexpr, mix):
    """``mixed``: one warp writes ``mix[0]``, the tiles of groups with more than ``light_rows`` rows (the
    heavy, compute-bound experts), and ``mix[1]``, all tiles (after :func:`rank_groups`: ``sizes`` by group)."""
    lane = cute.arch.lane_idx()
    n_tiles = (n + bn - 1) // bn
    heavy = Int32(0)
    total = Int32(0)
    for g in cutlass.range(lane, groups, 32, unroll=1):
        m = sizes[g]
        t = (m + bm - 1) // bm * n_tiles
        total = total + t
        if m > light_rows:
            heavy = heavy + t
    heavy = cute.arch.warp_reduction(heavy, lambda x, y: x + y)
    total = cute.arch.warp_reduction(total, lambda x, y: x + y)
    if lane == 0:
        mix[0] = heavy
        mix[1] = total


@cute.jit
def mixed_tile(i: Int32, heavy: Int32, total: Int32, burst: cutlass.Constexpr):
    """``mixed``: claim ``i`` -> ``(light, tile)``. Claims come in blocks of ``burst``; each block takes its share
    of heavy tiles first, then its share of light ones, in the proportion of the two counts. With
    ``H(j) = floor(min(j * burst, total) * heavy / total)`` heavy tiles before block ``j``, claim ``i`` of block ``j``
    at offset ``r`` is heavy tile ``H(j) + r`` if ``r < H(j + 1) - H(j)``, else the next light one. With largest
    first the heavy groups' tiles are numbers ``0 .. heavy - 1`` and the light groups' the rest, so each stream keeps
    its own order (:func:`gemmlab.grouped_model.mixed_order` is the CPU twin). Past the last tile: a tile number past
    every group. ``burst = 1`` spreads the light tiles one by one among the heavy ones.
    """
    j = i // burst
    r = i - j * burst
    all_n = Int64(cutlass.max(total, 1))
    h0 = Int32(Int64(cutlass.min(j * burst, total)) * Int64(heavy) // all_n)
    h1 = Int32(Int64(cutlass.min((j + 1) * burst, total)) * Int64(heavy) // all_n)
    light = Int32(0)
    t = h0 + r
    if r >= h1 - h0:
        light = Int32(1)
        t = heavy + (j * burst - h0) + (r - (h1 - h0))
    if i >= total:
        light = Int32(0)
        t = Int32(2**31 - 1)
    return light, t


class GroupCursor:
    """Where a CTA is in the list of groups: the group, its first tile's number, its shape.

    Tiles are numbered group after group; a CTA's tiles only increase, so
    :meth:`seek` only moves forward (over empty groups too). It is carried
    through the kernel's ``while`` loops (the loop-carry protocol, as
    :class:`gemmlab.pipeline.DevicePipelineState`).
    """

    def __init__(self, g, base, row0, m, n, k, m_tiles, tiles):
        self.g, self.base, self.row0 = Int32(g), Int32(base), Int32(row0)
        self.m, self.n, self.k = Int32(m), Int32(n), Int32(k)
        self.m_tiles, self.tiles = Int32(m_tiles), Int32(tiles)

    def __extract_mlir_values__(self):
        return [v.ir_value() for v in (self.g, self.base, self.row0, self.m, self.n, self.k,
                                       self.m_tiles, self.tiles)]

    def __new_from_mlir_values__(self, values):
        return GroupCursor(*(Int32(v) for v in values))

    def tile(self, linear, bk: int):
        """``(m unit, n_tile, k-blocks)`` of unit ``linear`` inside this group (M fastest, as :func:`seek` counts).

        An m unit is one M-tile, or two for a cluster pair (the cursor then counts 2 x tile_m rows per unit).
        """
        local = linear - self.base
        return local % self.m_tiles, local // self.m_tiles, (self.k + bk - 1) // bk


@cute.jit
def first_group(order, groups: Int32, offs, table, rows: Int32, n: Int32, k: Int32, bm: cutlass.Constexpr,
                bn: cutlass.Constexpr, mode: cutlass.Constexpr, by_size: cutlass.Constexpr):
    row0, m, gn, gk = group_shape(group_at(Int32(0), order, groups, by_size), offs, table, rows, n, k, mode)
    mt, tiles = group_tiles(m, gn, bm, bn)
    return GroupCursor(0, 0, row0, m, gn, gk, mt, tiles)


#: From this many groups (and up to ``ORDER_MAX``) one warp sums every group's tiles into shared memory before the
#: tiles start (:func:`tile_prefix`), and :func:`seek` finds a tile's group by bisection in it. Below, a seek walks
#: the groups one by one, reading ``offs``: measured on an H100 (``benchmarks/grouped_gemm.py``'s traced launches,
#: Qwen3-30B-A3B's gate/up with 32 tokens) that walk cost about 80 ns a group, 11 us of a 31 us launch with 128
#: experts: a CTA's first load waited up to 14 us, and its search past the last group after its last tile 11 us.
PREFIX_FROM = 32


@cute.jit
def tile_prefix(prefix, order, offs, table, groups: Int32, rows: Int32, n: Int32, k: Int32, bm: cutlass.Constexpr,
                bn: cutlass.Constexpr, mode: cutlass.Constexpr, by_size: cutlass.Constexpr):
    """One warp writes ``prefix[i]``: the tiles of the groups visited before the ``i``-th (``prefix[0] = 0``,
    ``prefix[groups]`` all tiles), in :func:`group_at`'s order (after :func:`rank_groups` when ranked).

    Each lane sums a run of ``ceil(groups / 32)`` consecutive visits into its slots, then adds the lanes before
    it (an inclusive scan by ``shfl.sync.up``, five steps).
    """
    lane = cute.arch.lane_idx()
    run = (groups + 31) // 32
    first = lane * run
    local = Int32(0)
    for i in cutlass.range(run, unroll=1):
        v = first + i
        if v < groups:
            _, m, gn, _ = group_shape(group_at(v, order, groups, by_size), offs, table, rows, n, k, mode)
            _, t = group_tiles(m, gn, bm, bn)
            local = local + t
            prefix[v + 1] = local
    total = local
    for d in cutlass.range_constexpr(5):
        other = cute.arch.shuffle_sync_up(total, 1 << d)
        if lane >= (1 << d):
            total = total + other
    before = total - local
    for i in cutlass.range(run, unroll=1):
        v = first + i
        if v < groups:
            prefix[v + 1] = prefix[v + 1] + before
    if lane == 0:
        prefix[0] = Int32(0)


@cute.jit
def seek(cur: GroupCursor, linear: Int32, order, prefix, groups: Int32, offs, table, rows: Int32, n: Int32, k: Int32,
         bm: cutlass.Constexpr, bn: cutlass.Constexpr, mode: cutlass.Constexpr, by_size: cutlass.Constexpr):
    """Move ``cur`` forward to the group holding tile ``linear`` (``cur.g == groups`` past the last).

    ``cur.g`` counts visits; :func:`group_at` turns it into the group's index. With :data:`PREFIX_FROM` to
    ``ORDER_MAX`` groups the visit is the last one whose ``prefix`` (:func:`tile_prefix`) is at most ``linear``,
    found by bisection (empty groups share their successor's prefix, so it is never one of them); else the
    groups are walked one by one.
    """
    g, base, row0, m, gn, gk, mt, tiles = cur.g, cur.base, cur.row0, cur.m, cur.n, cur.k, cur.m_tiles, cur.tiles
    if (g < groups) & (linear >= base + tiles):
        if (groups >= PREFIX_FROM) & (groups <= ORDER_MAX):
            lo = g + 1  # prefix[g + 1] = base + tiles <= linear
            hi = groups
            while lo < hi:
                mid = (lo + hi + 1) // 2
                if prefix[mid] <= linear:
                    lo = mid
                else:
                    hi = mid - 1
            g = lo
            base = prefix[g]
            row0, m, gn, gk = group_shape(group_at(cutlass.min(g, groups - 1), order, groups, by_size),
                                          offs, table, rows, n, k, mode)
            mt, tiles = group_tiles(m, gn, bm, bn)
        else:
            while (g < groups) & (linear >= base + tiles):
                base = base + tiles
                g = g + 1
                row0, m, gn, gk = group_shape(group_at(cutlass.min(g, groups - 1), order, groups, by_size),
                                              offs, table, rows, n, k, mode)
                mt, tiles = group_tiles(m, gn, bm, bn)
    return GroupCursor(g, base, row0, m, gn, gk, mt, tiles)


@cute.jit
def seek_stream(heavy_cur: GroupCursor, light_cur: GroupCursor, light: Int32, t: Int32, order, prefix, groups: Int32,
                offs,
                table, rows: Int32, n: Int32, k: Int32, bm: cutlass.Constexpr, bn: cutlass.Constexpr,
                mode: cutlass.Constexpr, by_size: cutlass.Constexpr):
    """``mixed``: move the cursor of tile ``t``'s stream to it (each stream's tiles only increase, so each
    cursor still only moves forward); returns ``(heavy cursor, light cursor, tile t's cursor)``."""
    if light != 0:
        light_cur = seek(light_cur, t, order, prefix, groups, offs, table, rows, n, k, bm, bn, mode, by_size)
    else:
        heavy_cur = seek(heavy_cur, t, order, prefix, groups, offs, table, rows, n, k, bm, bn, mode, by_size)
    cur = heavy_cur
    if light != 0:
        cur = light_cur
    return heavy_cur, light_cur, cur


@cute.jit
def seek_claim(claim: Int32, cur: GroupCursor, heavy_cur: GroupCursor, light_cur: GroupCursor, mix, order, prefix,
               groups: Int32, offs, table, rows: Int32, n: Int32, k: Int32, bm: cutlass.Constexpr,
               bn: cutlass.Constexpr, mode: cutlass.Constexpr, by_size: cutlass.Constexpr, mixed: cutlass.Constexpr,
               burst: cutlass.Constexpr):
    """The tile of claim ``claim`` and the cursors moved to it: ``(light, tile, heavy cursor, light cursor,
    cursor)``, for the producer and the consumers alike. Without ``mixed`` the tile is the claim itself, in one
    stream (light 0; the two stream cursors are returned as given, unused)."""
    if cutlass.const_expr(mixed > 0):
        light, t = mixed_tile(claim, mix[0], mix[1], burst)
        heavy_cur, light_cur, cur = seek_stream(heavy_cur, light_cur, light, t, order, prefix, groups, offs, table,
                                                rows, n, k, bm, bn, mode, by_size)
        return light, t, heavy_cur, light_cur, cur
    cur = seek(cur, claim, order, prefix, groups, offs, table, rows, n, k, bm, bn, mode, by_size)
    return Int32(0), claim, heavy_cur, light_cur, cur


# --------------------------------------------------------------------------------------
# The store under the next main loop (``overlap_store``)
# --------------------------------------------------------------------------------------


@cute.jit
def store_staged(tma_c: cute.CopyAtom, bSG_sC: cute.Tensor, bSG_gC: cute.Tensor, r2s: cute.TiledCopy,
                 staged: cute.Tensor, tRS_sC: cute.Tensor, sub_out: cute.Tensor, half, store_warp,
                 e: cutlass.Constexpr, cfg: cutlass.Constexpr, desc):
    """Sub-tile ``e`` of a warpgroup's staged output (already ``c_type``, in registers): ``stmatrix`` into its
    ring buffer, then one TMA store, as :func:`gemmlab.kernels.gemm_sm90.store_tile` does for one sub-tile.

    ``e`` is a compile-time number: the staged values are registers, which can only be indexed by constants.
    """
    sub_size = cute.size(sub_out)
    epi_count = cfg.tile_n // cfg.epi_n
    buf = half * cfg.epi_stages + e % cfg.epi_stages
    for v in cutlass.range_constexpr(sub_size):
        sub_out[v] = staged[e * sub_size + v]
    cute.copy(r2s, sub_out, tRS_sC[(None, None, None, buf)])
    cute.arch.fence_proxy("async.shared", space="cta")  # stmatrix writes, then the TMA (async proxy) reads
    cute.arch.barrier(barrier_id=EPI_BARRIER + half, number_of_threads=128)
    if store_warp:
        cute.copy(tma_c, bSG_sC[(None, buf)], bSG_gC[(None, (half, e))], tma_desc_ptr=desc)
        cute.arch.cp_async_bulk_commit_group()
        cute.arch.cp_async_bulk_wait_group(cfg.epi_stages - 1, read=True)  # the buffer reused next is free
        if cutlass.const_expr(e == epi_count - 1 and not cfg.epi_ring_aligned):
            cute.arch.cp_async_bulk_wait_group(0, read=True)
    cute.arch.barrier(barrier_id=EPI_BARRIER + half, number_of_threads=128)


@cute.jit
def mma_k_block(tiled_mma: cute.TiledMma, acc: cute.Tensor, tCrA: cute.Tensor, tCrB: cute.Tensor, full, empty,
                read: DevicePipelineState, release: DevicePipelineState, cluster_size: cutlass.Constexpr):
    """One k-block after the first, as in :func:`gemmlab.kernels.gemm_sm90.mma_tile`'s loop: wait for its stage, issue
    its wgmmas, wait for the previous batch and free that stage. Returns the advanced ``(read, release)``."""
    cute.arch.mbarrier_wait(full + read.index, read.phase)
    for kb in cutlass.range_constexpr(cute.size(tCrA, mode=[2])):
        cute.gemm(tiled_mma, acc, tCrA[(None, None, kb, read.index)], tCrB[(None, None, kb, read.index)], acc)
    warpgroup.commit_group()
    warpgroup.wait_group(1)
    release_stage(empty, release.index, cluster_size)
    release = release.next()
    return read.next(), release


@cute.jit
def mma_tile_storing(tiled_mma: cute.TiledMma, acc: cute.Tensor, tCrA: cute.Tensor, tCrB: cute.Tensor, full, empty,
                     read: DevicePipelineState, release: DevicePipelineState, kc: Int32,
                     cluster_size: cutlass.Constexpr, pending: Int32, tma_c: cute.CopyAtom, sC: cute.Tensor,
                     gC_prev: cute.Tensor, r2s: cute.TiledCopy, staged: cute.Tensor, tRS_sC: cute.Tensor,
                     sub_out: cute.Tensor, half, store_warp, cfg: cutlass.Constexpr, desc):
    """:func:`gemmlab.kernels.gemm_sm90.mma_tile`, storing the previous tile on the way (when ``pending``).

    The previous tile's output waits in registers (``staged``, converted to ``c_type``: 64 registers per
    thread for a 64 x 256 slab). After each of this tile's first ``tile_n / epi_n`` k-blocks is issued,
    the warpgroup stores one sub-tile of it while that k-block's wgmmas run: the tensor cores no longer
    wait for the store between two tiles. A tile shorter than that stores the rest after its last k-block.
    """
    epi_count = cfg.tile_n // cfg.epi_n
    gC_epi = cute.zipped_divide(gC_prev, (WG_ROWS, cfg.epi_n))
    bSG_sC, bSG_gC = cpasync.tma_partition(tma_c, 0, cute.make_layout(1), cute.group_modes(sC, 0, 2), gC_epi)
    warpgroup.fence()
    cute.arch.mbarrier_wait(full + read.index, read.phase)  # the first k-block, peeled as in mma_tile
    for kb in cutlass.range_constexpr(cute.size(tCrA, mode=[2])):
        cute.gemm(tiled_mma, acc, tCrA[(None, None, kb, read.index)], tCrB[(None, None, kb, read.index)], acc)
    warpgroup.commit_group()
    read.advance()
    for e in cutlass.range_constexpr(epi_count):  # unrolled: sub-tile e is a compile-time index into `staged`
        if e + 1 < kc:
            read, release = mma_k_block(tiled_mma, acc, tCrA, tCrB, full, empty, read, release, cluster_size)
        if pending != 0:  # ...while k-block e + 1 runs, sub-tile e of the previous tile
            store_staged(tma_c, bSG_sC, bSG_gC, r2s, staged, tRS_sC, sub_out, half, store_warp, e, cfg, desc)
    for k in cutlass.range(epi_count + 1, kc, unroll=1):
        read, release = mma_k_block(tiled_mma, acc, tCrA, tCrB, full, empty, read, release, cluster_size)
    warpgroup.wait_group(0)
    release_stage(empty, release.index, cluster_size)
    release.advance()
    return read, release


# --------------------------------------------------------------------------------------
# The kernel
# --------------------------------------------------------------------------------------


@cute.kernel
def grouped_kernel(
    tma_a: cute.CopyAtom, mA: cute.Tensor,
    tma_b: cute.CopyAtom, mB: cute.Tensor,
    tma_c: cute.CopyAtom, mC: cute.Tensor,
    tA0: cute.Tensor, tB0: cute.Tensor, tC0: cute.Tensor,
    offs: cute.Tensor, table: cute.Tensor, workspace: cute.Tensor,
    groups: Int32, rows: Int32, n: Int32, k: Int32, b_group_stride: Int64, offs_report: Int64,
    tiled_mma: cute.TiledMma, epi_mma: cute.TiledMma,
    a_smem: cute.ComposedLayout, b_smem: cute.ComposedLayout, c_smem: cute.ComposedLayout,
    cfg: cutlass.Constexpr, mode: cutlass.Constexpr, b_major_n: cutlass.Constexpr,
    ab_type: cutlass.Constexpr, c_type: cutlass.Constexpr, fences: cutlass.Constexpr, by_size: cutlass.Constexpr,
    l2_promotion: cutlass.Constexpr = None, trace: cutlass.Constexpr = False, dynamic: cutlass.Constexpr = False,
    overlap_store: cutlass.Constexpr = False, mixed: cutlass.Constexpr = 0, burst: cutlass.Constexpr = 1,
):
    BM, BN, BK = cfg.tile_m, cfg.tile_n, cfg.tile_k
    stages = cfg.stages
    consumers = cfg.consumers
    AB = ab_slots(cfg)  # A (and B) descriptor slots per stream

    tidx, _, _ = cute.arch.thread_idx()
    bid, _, _ = cute.arch.block_idx()
    if cutlass.const_expr(trace):
        if tidx == 0:
            stamp(workspace, bid, "entry", trace)
    warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
    wg = warp // 4
    grid, _, _ = cute.arch.grid_dim()
    # Clusters of CM CTAs along M (cfg.cluster = (2, 1)): the CTAs of a cluster take the
    # CM m-tiles of one unit (group, m-tile pair, n-tile) and share its B (the expert's
    # weights) by multicast; units are numbered as tiles are, with CM * BM-row m-tiles.
    CM = cfg.cluster[0]
    UM = CM * BM
    cluster_id = bid // CM
    num_clusters = grid // CM
    rank = Int32(0)
    if cutlass.const_expr(CM > 1):
        rank = cute.arch.make_warp_uniform(cute.arch.block_idx_in_cluster())

    # ---------------------------------------------------------------- shared memory
    smem = SmemAllocator()
    sA = smem.allocate_tensor(ab_type, a_smem.outer, byte_alignment=1024, swizzle=a_smem.inner)
    sB = smem.allocate_tensor(ab_type, b_smem.outer, byte_alignment=1024, swizzle=b_smem.inner)
    sC = smem.allocate_tensor(c_type, c_smem.outer, byte_alignment=1024, swizzle=c_smem.inner)
    full = smem.allocate_array(Int64, stages, byte_alignment=8)
    empty = smem.allocate_array(Int64, stages, byte_alignment=8)
    # Scratch copies of the descriptors being rewritten: A, B (producer), C (one per consumer).
    sDesc = smem.allocate_array(Int64, DESC_WORDS * (2 + consumers), byte_alignment=DESC_BYTES)
    # The visiting order (largest group first, with by_size) and the sizes it is ranked from.
    order_len = ORDER_MAX if by_size else 1
    sOrder = cute.make_tensor(smem.allocate_array(Int32, order_len, byte_alignment=4), cute.make_layout(order_len))
    sSizes = cute.make_tensor(smem.allocate_array(Int32, order_len, byte_alignment=4), cute.make_layout(order_len))
    # Every group's first tile number, in visiting order (tile_prefix; read by seek from PREFIX_FROM groups).
    sPrefix = cute.make_tensor(smem.allocate_array(Int32, ORDER_MAX + 1, byte_alignment=4),
                               cute.make_layout(ORDER_MAX + 1))
    # Dynamic scheduling: the tile each ring stage's first k-block belongs to, written by the producer before
    # it arms the stage's barrier, read by the consumers after they waited on it (the barrier orders the two).
    ring = smem.allocate_array(Int32, stages if dynamic else 1, byte_alignment=4)
    sMix = None
    if cutlass.const_expr(mixed > 0):  # the heavy groups' tile count and all tiles (count_streams)
        sMix = cute.make_tensor(smem.allocate_array(Int32, 2, byte_alignment=4), cute.make_layout(2))
    counter = workspace[(0, sched_slot(cfg), None)].iterator  # CTA 0's scheduler slot: the two counters
    mailbox = workspace[(cluster_id * CM, sched_slot(cfg), None)].iterator  # pairs: the first CTA's slot

    if warp == 0:
        with cute.arch.elect_one():
            for s in cutlass.range_constexpr(stages):
                cute.arch.mbarrier_init(full + s, 1)
                cute.arch.mbarrier_init(empty + s, 4 * consumers * CM)  # every consumer warp of the cluster
            cute.arch.mbarrier_init_fence()
    if warp == 1:  # otherwise idle: ranks the groups and sums their tiles while warp 0 sets up the barriers
        if groups <= ORDER_MAX:
            if cutlass.const_expr(by_size):
                rank_groups(sOrder, sSizes, offs, table, groups, rows, n, k, mode)
                if cutlass.const_expr(mixed > 0):
                    count_streams(sSizes, groups, n, UM, BN, mixed, sMix)
                cute.arch.sync_warp()  # every lane's places in sOrder before tile_prefix reads them
            if groups >= PREFIX_FROM:
                tile_prefix(sPrefix, sOrder, offs, table, groups, rows, n, k, UM, BN, mode, by_size)
    cute.arch.sync_threads()
    if cutlass.const_expr(CM > 1):
        # The peer's barriers must be initialised before a multicast or a remote arrive touches them.
        cute.arch.cluster_arrive_relaxed()
        cute.arch.cluster_wait()

    # ---------------------------------------------------------------- tile views (template coordinates)
    # The descriptors' coordinates are tile indices inside the current group's
    # tensors, whatever the descriptor currently describes.
    gA = cute.local_tile(mA, (BM, BK), (None, None))  # (BM, BK, m_tiles, k_tiles)
    gB = cute.local_tile(mB, (BN, BK), (None, None))  # (BN, BK, n_tiles, k_tiles)
    tAsA, tAgA = cpasync.tma_partition(tma_a, 0, cute.make_layout(1),
                                       cute.group_modes(sA, 0, 2), cute.group_modes(gA, 0, 2))
    # B is split between the cluster's CTAs: each loads its slice and multicasts it to both.
    tBsB, tBgB = cpasync.tma_partition(tma_b, rank, cute.make_layout(CM),
                                       cute.group_modes(sB, 0, 2), cute.group_modes(gB, 0, 2))
    mcast_mask = cutlass.Int16((1 << CM) - 1)
    stage_bytes = cute.size_in_bytes(ab_type, cute.slice_(a_smem, (None, None, 0))) + \
        cute.size_in_bytes(ab_type, cute.slice_(b_smem, (None, None, 0)))

    if wg == 0:
        # ============================================================ producer warpgroup
        # mixed: two streams' cursors need 8 more registers, which the consumers give up (setmaxnreg only moves
        # registers within the CTA's 384 x 168 at launch: 128 x 48 + 256 x 224 fit, 128 x 48 + 256 x 232 never would).
        cute.arch.warpgroup_reg_dealloc(PRODUCER_REGS + (8 if mixed > 0 else 0))
        if cutlass.const_expr(mode == "ragged"):
            if warp == 2 and bid == 0 and offs_report != 0:  # an otherwise idle warp of CTA 0
                check_offs(offs, groups, rows, offs_report)
        if warp == 0:
            smem_a = smem_slot(sDesc, 0)
            smem_b = smem_slot(sDesc, 1)
            start_descriptor(tma_a, smem_a)
            start_descriptor(tma_b, smem_b)
            set_l2_promotion(smem_a, l2_promotion)
            set_l2_promotion(smem_b, l2_promotion)
            state = DevicePipelineState.producer(stages)
            cur = first_group(sOrder, groups, offs, table, rows, n, k, UM, BN, mode, by_size)
            last = Int32(-1)
            flips = Int32(0)  # group changes so far: which of the stages + 1 A/B slots is current
            linear = Int32(cluster_id)
            claim = Int32(0)
            posts = Int32(0)  # pairs: units posted (first CTA) or read (partner) so far
            # mixed: two streams, each with its cursor, its last group, its group changes and its slots.
            cur_h = cur
            cur_l = cur
            last_l = Int32(-1)
            flips_l = Int32(0)
            light, t, cur_h, cur_l, cur = seek_claim(linear, cur, cur_h, cur_l, sMix, sOrder, sPrefix, groups, offs,
                                                     table, rows, n, k, UM, BN, mode, by_size, mixed, burst)
            while cur.g < groups:
                base = 0
                s_last = last
                s_flips = flips
                if cutlass.const_expr(mixed > 0):
                    base = light * light_base(cfg)
                    if light != 0:
                        s_last = last_l
                        s_flips = flips_l
                slot = s_flips % AB
                if cur.g != s_last:
                    # A new group: rewrite A and B, publish them into the next slot (stages + 1 of them: the
                    # slot's previous loads have completed, see ab_slots).
                    s_flips = s_flips + 1
                    slot = s_flips % AB
                    g = group_at(cur.g, sOrder, groups, by_size)
                    rewrite_descriptor(tma_a, group_tensor("a", g, cur.row0, cur.m, cur.n, cur.k, tA0,
                                                           b_group_stride, table, mode, b_major_n), smem_a)
                    rewrite_descriptor(tma_b, group_tensor("b", g, cur.row0, cur.m, cur.n, cur.k, tB0,
                                                           b_group_stride, table, mode, b_major_n), smem_b)
                    if cutlass.const_expr(fences):
                        publish_descriptor(global_slot(workspace, bid, base + slot), smem_a)
                        publish_descriptor(global_slot(workspace, bid, base + AB + slot), smem_b)
                        acquire_descriptor(global_slot(workspace, bid, base + slot))
                        acquire_descriptor(global_slot(workspace, bid, base + AB + slot))
                    else:
                        publish_descriptor_unfenced(workspace, bid, base + slot, smem_a)
                        publish_descriptor_unfenced(workspace, bid, base + AB + slot, smem_b)
                    s_last = cur.g
                if cutlass.const_expr(mixed > 0):
                    if light != 0:
                        last_l = s_last
                        flips_l = s_flips
                    else:
                        last = s_last
                        flips = s_flips
                else:
                    last = s_last
                    flips = s_flips
                desc_a = slot_descriptor(workspace, bid, base + slot)
                desc_b = slot_descriptor(workspace, bid, base + AB + slot)
                m_unit, n_tile, k_tiles = cur.tile(t, BK)
                if cutlass.const_expr(trace):
                    if linear == cluster_id:
                        if cute.arch.lane_idx() == 0:
                            stamp(workspace, bid, "first_load", trace)
                # Every tile has at least one k-block (the host rejects K = 0), so every tile claims exactly once.
                claim_at = cutlass.max(k_tiles - CLAIM_LEAD, 0)
                m_tile = m_unit * CM + rank  # past the group's rows for the second CTA of an odd pair:
                for kt in cutlass.range(k_tiles, unroll=1):  # TMA zero-fills that A, the store drops it
                    if cutlass.const_expr(dynamic):
                        if kt == claim_at:
                            if rank == 0:  # in a pair the first CTA claims for both
                                claim = claim_tile(counter)  # the next tile, claimed now, used after the loop
                    cute.arch.mbarrier_wait(empty + state.index, state.phase)
                    with cute.arch.elect_one():
                        if cutlass.const_expr(dynamic):
                            if kt == 0:
                                put_tile_of(ring, stages, state.index, linear)
                        cute.arch.mbarrier_arrive_and_expect_tx(full + state.index, stage_bytes)
                    cute.copy(tma_a, tAgA[(None, m_tile, kt)], tAsA[(None, state.index)],
                              tma_bar_ptr=full + state.index, tma_desc_ptr=desc_a)
                    if cutlass.const_expr(CM > 1):
                        cute.copy(tma_b, tBgB[(None, n_tile, kt)], tBsB[(None, state.index)],
                                  tma_bar_ptr=full + state.index, mcast_mask=mcast_mask, tma_desc_ptr=desc_b)
                    else:
                        cute.copy(tma_b, tBgB[(None, n_tile, kt)], tBsB[(None, state.index)],
                                  tma_bar_ptr=full + state.index, tma_desc_ptr=desc_b)
                    state.advance()
                if cutlass.const_expr(dynamic):
                    if cutlass.const_expr(CM == 1):
                        linear = claimed_tile(claim, num_clusters)
                    else:
                        posts = posts + 1
                        if rank == 0:
                            linear = claimed_tile(claim, num_clusters)
                            post_unit(mailbox, posts, linear)
                        else:
                            linear = wait_unit(mailbox, posts)
                else:
                    linear = linear + num_clusters
                light, t, cur_h, cur_l, cur = seek_claim(linear, cur, cur_h, cur_l, sMix, sOrder, sPrefix, groups, offs,
                                                         table, rows, n, k, UM, BN, mode, by_size, mixed, burst)

            # ---- the producer's end: a "no more tiles" stage (dynamic), the counters reset, the ring drained
            if cutlass.const_expr(dynamic):
                # One more stage, with no data: it tells the consumers the tiles have run out.
                cute.arch.mbarrier_wait(empty + state.index, state.phase)
                with cute.arch.elect_one():
                    put_tile_of(ring, stages, state.index, Int32(NO_MORE_TILES))
                    cute.arch.mbarrier_arrive(full + state.index)
                state.advance()
                if rank == 0:
                    reset_counters(counter, num_clusters)
                else:
                    clear_mailbox(mailbox)
            if cutlass.const_expr(trace):
                if cute.arch.lane_idx() == 0:
                    stamp(workspace, bid, "producer_done", trace)
            # Tail: every stage must be released (by every consumer of the cluster) before the CTA may exit.
            for _ in cutlass.range_constexpr(stages):
                cute.arch.mbarrier_wait(empty + state.index, state.phase)
                state.advance()
    else:
        # ============================================================ consumer warpgroups
        cute.arch.warpgroup_reg_alloc(CONSUMER_REGS - (8 if mixed > 0 else 0))
        ctid = tidx - 128
        half = wg - 1
        _, tCrA, tCrB, acc = mma_operands(tiled_mma, sA, sB, ctid, BM, BN)
        r2s, tRS_acc, tRS_sC, sub_f32, sub_out = epilogue_operands(epi_mma, acc, sC, ctid, c_type, False)
        gC = cute.local_tile(mC, (BM, BN), (None, None))
        smem_c = smem_slot(sDesc, 2 + half)
        c_slot = 2 * AB + half
        store_warp = warp % 4 == 0
        if store_warp:
            start_descriptor(tma_c, smem_c)

        read = DevicePipelineState.consumer(stages)
        release = DevicePipelineState.consumer(stages)
        cur = first_group(sOrder, groups, offs, table, rows, n, k, UM, BN, mode, by_size)
        last = Int32(-1)
        linear = Int32(cluster_id)
        ntiles = Int32(0)
        # overlap_store: the tile whose output waits in `staged` to be stored during the next main loop.
        pending = Int32(0)
        prev_m = Int32(0)
        prev_n = Int32(0)
        if cutlass.const_expr(overlap_store):
            staged = cute.make_rmem_tensor_like(tRS_acc, c_type)
        # Every store goes through this warpgroup's C slot (rewritten in place at each new group).
        own_c = slot_descriptor(workspace, bid, c_slot)
        # mixed: as the producer, a cursor and a last group per stream; the pending tile's stream picks its C slot.
        cur_h = cur
        cur_l = cur
        last_l = Int32(-1)
        prev_light = Int32(0)
        light, t, cur_h, cur_l, cur = seek_claim(linear, cur, cur_h, cur_l, sMix, sOrder, sPrefix, groups, offs, table,
                                                 rows, n, k, UM, BN, mode, by_size, mixed, burst)
        while cur.g < groups:
            m_unit, n_tile, kc = cur.tile(t, BK)
            m_tile = m_unit * CM + rank

            # ---- main loop (chapter 07's): one wgmma batch in flight, free the stage before it
            acc.fill(0.0)
            tiled_mma.set(warpgroup.Field.ACCUMULATE, True)
            if cutlass.const_expr(overlap_store):
                # ...storing the previous tile's output on the way, through the descriptor still describing its
                # group (a new group's rewrite comes after this loop)
                prev_c = own_c
                if cutlass.const_expr(mixed > 0):
                    prev_c = slot_descriptor(workspace, bid, prev_light * light_base(cfg) + c_slot)
                read, release = mma_tile_storing(tiled_mma, acc, tCrA, tCrB, full, empty, read, release, kc, CM,
                                                 pending, tma_c, sC, gC[(None, None, prev_m, prev_n)], r2s, staged,
                                                 tRS_sC, sub_out, half, store_warp, cfg, prev_c)
            else:
                read, release = mma_tile(tiled_mma, acc, tCrA, tCrB, full, empty, read, release, kc, CM)
            if cutlass.const_expr(trace):
                if tidx == 128:
                    if linear == cluster_id:
                        stamp(workspace, bid, "first_mainloop_end", trace)
                    stamp(workspace, bid, "last_mainloop_end", trace)

            # ---- a new group: this warpgroup's C descriptor describes the group's C
            base = 0
            s_last = last
            if cutlass.const_expr(mixed > 0):
                base = light * light_base(cfg)
                if light != 0:
                    s_last = last_l
            if cur.g != s_last:
                if store_warp:
                    # Earlier stores must be done with the slot before it changes.
                    cute.arch.cp_async_bulk_wait_group(0, read=True)
                    g = group_at(cur.g, sOrder, groups, by_size)
                    rewrite_descriptor(tma_c, group_tensor("c", g, cur.row0, cur.m, cur.n, cur.k, tC0,
                                                           b_group_stride, table, mode, b_major_n), smem_c)
                    if cutlass.const_expr(fences):
                        publish_descriptor(global_slot(workspace, bid, base + c_slot), smem_c)
                        acquire_descriptor(global_slot(workspace, bid, base + c_slot))
                    else:
                        publish_descriptor_unfenced(workspace, bid, base + c_slot, smem_c)
                s_last = cur.g
            if cutlass.const_expr(mixed > 0):
                if light != 0:
                    last_l = s_last
                else:
                    last = s_last
            else:
                last = s_last
            desc_c = slot_descriptor(workspace, bid, base + c_slot)

            # ---- epilogue (chapter 07's): 64 rows per warpgroup, sub-tiles through its ring
            if cutlass.const_expr(overlap_store):
                staged.store(tRS_acc.load().to(c_type))  # stored during the next main loop (or after the last)
                pending = Int32(1)
                prev_m = m_tile
                prev_n = n_tile
                if cutlass.const_expr(mixed > 0):
                    prev_light = light
            else:
                store_tile(tma_c, sC, gC[(None, None, m_tile, n_tile)], r2s, tRS_acc, tRS_sC, sub_f32, sub_out,
                           half, store_warp, cfg, c_type, desc_c)
            if cutlass.const_expr(trace):
                if tidx == 128:
                    if linear == cluster_id:
                        stamp(workspace, bid, "first_tile_end", trace)
            ntiles = ntiles + 1
            if cutlass.const_expr(dynamic):
                # The next tile is the one the producer wrote beside the next stage's first k-block.
                cute.arch.mbarrier_wait(full + read.index, read.phase)
                linear = tile_of(ring, stages, read.index)
                if linear == NO_MORE_TILES:
                    linear = Int32(2**31 - 1)  # past every group: seek ends the loop
            else:
                linear = linear + num_clusters
            light, t, cur_h, cur_l, cur = seek_claim(linear, cur, cur_h, cur_l, sMix, sOrder, sPrefix, groups, offs,
                                                     table, rows, n, k, UM, BN, mode, by_size, mixed, burst)

        # ---- the consumers' end: the last stage freed (dynamic), the last tile stored (overlap_store), stores drained
        if cutlass.const_expr(dynamic):
            # Free the stage that said "no more tiles" (it may be the first this consumer sees).
            cute.arch.mbarrier_wait(full + read.index, read.phase)
            release_stage(empty, release.index, CM)
        if cutlass.const_expr(overlap_store):
            if pending != 0:  # the last tile's output: no main loop left to hide its store under
                gC_epi = cute.zipped_divide(gC[(None, None, prev_m, prev_n)], (WG_ROWS, cfg.epi_n))
                bSG_sC, bSG_gC = cpasync.tma_partition(tma_c, 0, cute.make_layout(1), cute.group_modes(sC, 0, 2),
                                                       gC_epi)
                last_c = own_c
                if cutlass.const_expr(mixed > 0):
                    last_c = slot_descriptor(workspace, bid, prev_light * light_base(cfg) + c_slot)
                for e in cutlass.range_constexpr(BN // cfg.epi_n):
                    store_staged(tma_c, bSG_sC, bSG_gC, r2s, staged, tRS_sC, sub_out, half, store_warp, e, cfg,
                                 last_c)
        if store_warp:
            cute.arch.cp_async_bulk_wait_group(0, read=True)
        if cutlass.const_expr(trace):
            if tidx == 128:
                stamp(workspace, bid, "exit", trace)
                stamp(workspace, bid, "tiles", trace, ntiles)


# --------------------------------------------------------------------------------------
# The host side
# --------------------------------------------------------------------------------------


@cute.jit
def launch_grouped(a: cute.Tensor, b: cute.Tensor, c: cute.Tensor, offs: cute.Tensor, table: cute.Tensor,
                   workspace: cute.Tensor, groups: Int32, grid: Int32, offs_report: Int64, stream: cuda.CUstream,
                   cfg: cutlass.Constexpr, mode: cutlass.Constexpr, fences: cutlass.Constexpr = True,
                   by_size: cutlass.Constexpr = True, l2_promotion: cutlass.Constexpr = None,
                   trace: cutlass.Constexpr = False, dynamic: cutlass.Constexpr = False,
                   overlap_store: cutlass.Constexpr = False, mixed: cutlass.Constexpr = 0,
                   burst: cutlass.Constexpr = 1):
    """Template descriptors from ``a``, ``b``, ``c`` (group 0's tensors) and the persistent launch.

    Ragged: ``a`` (T, K), ``b`` (G, K, N), ``c`` (T, N). Table: ``a`` (M0, K0),
    ``b`` (K0, N0), ``c`` (M0, N0) are group 0's tensors (their layouts are the
    template every group's descriptor is rewritten from). ``offs_report``: the
    address of :func:`check_offs`'s report (host memory), 0 for no check.
    """
    ab_type = a.element_type
    if cutlass.const_expr(mode == "ragged"):
        b0 = b[(0, None, None)]  # (K, N) of expert 0
        b_group_stride = Int64(b.layout.stride[0])
    else:
        b0 = b
        b_group_stride = Int64(0)
    b_nk = cute.make_tensor(b0.iterator, cute.select(b0.layout, mode=[1, 0]))  # (N, K) view
    b_layout = utils.LayoutEnum.from_tensor(b_nk)
    tiled_mma, epi_mma, a_smem, b_smem, c_smem, _ = mma_and_smem_layouts(a, b_nk, c, cfg)
    epi_tile = (WG_ROWS, cfg.epi_n)
    cm = cfg.cluster[0]
    g2s = cpasync.CopyBulkTensorTileG2SOp()
    b_op = cpasync.CopyBulkTensorTileG2SMulticastOp() if cm > 1 else g2s
    tma_a, tA = cpasync.make_tiled_tma_atom(g2s, a, cute.slice_(a_smem, (None, None, 0)), (cfg.tile_m, cfg.tile_k))
    tma_b, tB = cpasync.make_tiled_tma_atom(b_op, b_nk, cute.slice_(b_smem, (None, None, 0)),
                                            (cfg.tile_n, cfg.tile_k), num_multicast=cm)
    tma_c, tC = cpasync.make_tiled_tma_atom(cpasync.CopyBulkTensorTileS2GOp(), c,
                                            cute.slice_(c_smem, (None, None, 0)), epi_tile)
    rows = cute.size(c, mode=[0])
    n = cute.size(c, mode=[1])
    k = cute.size(a, mode=[1])
    b_major_n = b_layout == utils.LayoutEnum.COL_MAJOR  # the (N, K) view is N-contiguous
    grouped_kernel(tma_a, tA, tma_b, tB, tma_c, tC, a, b_nk, c, offs, table, workspace,
                   groups, rows, n, k, b_group_stride, offs_report, tiled_mma, epi_mma, a_smem, b_smem, c_smem,
                   cfg, mode, b_major_n, ab_type, c.element_type, fences, by_size, l2_promotion, trace, dynamic,
                   overlap_store, mixed, burst).launch(
        grid=(grid, 1, 1), block=(cfg.threads, 1, 1), cluster=(cm, 1, 1), stream=stream,
        # `.minnctapersm 1`. Without it ptxas compiles the 64-row kernels (256 threads) to about 105 registers,
        # ignores their setmaxnreg ("unable to determine register count at entry", C7508) and serialises the
        # wgmmas (C7520): in the SASS every HGMMA waits for itself (WARPGROUP.DEPBAR.LE gsb0, 0x0). With it: 232
        # registers, both messages gone. Timed side by side on all 64 MoE sets: 1.000x on an H100 (0.992-1.009
        # per set), 1.001x on an H200 (0.997-1.008); the decode tile waits on memory, not on its MMAs.
        min_blocks_per_mp=1)


@functools.lru_cache(maxsize=None)
def grouped_host(cfg: Sm90Config, mode: str, fences: bool = True, by_size: bool = True, l2_promotion=None,
                 trace: bool = False, dynamic: bool = False, overlap_store: bool = False, mixed: int = 0,
                 burst: int = 1):
    """The ``@cute.jit`` host function of one compiled variant (sizes and group count at run time)."""

    @cute.jit
    def grouped_sm90_host(a: cute.Tensor, b: cute.Tensor, c: cute.Tensor, offs: cute.Tensor, table: cute.Tensor,
                          workspace: cute.Tensor, groups: Int32, grid: Int32, offs_report: Int64,
                          stream: cuda.CUstream):
        launch_grouped(a, b, c, offs, table, workspace, groups, grid, offs_report, stream, cfg, mode, fences,
                       by_size, l2_promotion, trace, dynamic, overlap_store, mixed, burst)

    return grouped_sm90_host


_CUTLASS_TYPES = {"bfloat16": cutlass.BFloat16, "float16": cutlass.Float16}
MODES = ("ragged", "table")


def compile_grouped(target: str = "sm_90a", cfg: Sm90Config | None = None, mode: str = "ragged", b_major: str = "k", *,
                    tvm_ffi: bool = False, fences: bool = True, by_size: bool = True,
                    l2_promotion: int | None = 3, trace: bool = False, dynamic: bool = False,
                    overlap_store: bool = False, mixed: int = 0, burst: int = 1):
    """Compile the grouped kernel of ``cfg`` for ``mode`` and B's layout, without a GPU.

    Every size (T, N, K, the group count, each group's M) is a run-time value:
    one compiled kernel per (configuration, mode, B's layout) serves every call.
    ``fences=False`` compiles the broken variant: descriptors published with
    plain stores, no release, no acquire (chapter 08's "break it" exercise).
    ``l2_promotion``: the A and B descriptors' L2 promotion (:data:`L2_PROMOTIONS`;
    default 3, 256 bytes; None keeps the DSL's 128). ``trace``: record each CTA's timeline in one more
    workspace slot (:data:`TRACE_POINTS`; :func:`gemmlab.measure.grouped.trace_launches`). ``dynamic``: after its
    first tile a CTA (in a pair: the pair's first CTA, for both) claims the next one from a global counter
    (:func:`claim_tile`) instead of taking every ``grid``-th. ``overlap_store``: each consumer warpgroup keeps a
    finished tile in registers and stores it during the next tile's first k-blocks (:func:`mma_tile_storing`).
    ``mixed``: light experts' rows (0: off): the tiles of groups of at most that many rows are claimed among the
    others' (:func:`mixed_tile`), in blocks of ``burst`` claims; ragged, dynamic, one CTA, largest first only.
    """
    from ..checks import check_choice, check_int
    from ..compile import check_target, compile_for, fake_stream, fake_tensor

    check_target(target)
    if target != "sm_90a":
        raise ValueError(f"target: the grouped Hopper GEMM needs sm_90a (wgmma, setmaxnreg); got {target!r}")
    cfg = check_grouped_config(cfg or Sm90Config())
    check_choice("mode", mode, MODES)
    check_choice("b_major", b_major, ("k", "n"))
    check_choice("l2_promotion", l2_promotion, L2_PROMOTIONS)
    flags = (("tvm_ffi", tvm_ffi), ("fences", fences), ("by_size", by_size), ("trace", trace), ("dynamic", dynamic),
             ("overlap_store", overlap_store))
    tvm_ffi, fences, by_size, trace, dynamic, overlap_store = (check_choice(name, v, (False, True))
                                                               for name, v in flags)
    mixed = check_int("mixed", mixed, lo=0, hi=INT32_MAX)
    burst = check_int("burst", burst, lo=1, hi=INT32_MAX)  # numpy ints count (it was isinstance(burst, int))
    if mixed and (mode != "ragged" or not dynamic or cfg.cluster != (1, 1) or not by_size):
        raise ValueError(f"mixed: claiming light experts' tiles among the heavy ones' needs the ragged form, dynamic "
                         f"scheduling, one CTA per tile and largest first; got mode={mode!r}, dynamic={dynamic}, "
                         f"{cfg.name}, by_size={by_size}")
    check_grouped_smem(cfg, by_size=by_size, dynamic=dynamic, mixed=bool(mixed))
    dt, ct = _CUTLASS_TYPES[cfg.dtype], _CUTLASS_TYPES[cfg.out_dtype]
    t, n, k = cute.sym_int(), cute.sym_int(divisibility=8), cute.sym_int(divisibility=8)
    a = fake_tensor(dt, (t, k), stride_order=(1, 0))
    c = fake_tensor(ct, (t, n), stride_order=(1, 0))
    if mode == "ragged":
        b = fake_tensor(dt, (cute.sym_int(), k, n), stride_order=(2, 1, 0) if b_major == "n" else (2, 0, 1))
    else:
        b = fake_tensor(dt, (k, n), stride_order=(1, 0) if b_major == "n" else (0, 1))
    offs = fake_tensor(Int32, (cute.sym_int(),), align=4, stride_order=(0,))
    table = fake_tensor(Int64, (cute.sym_int(), len(TABLE_COLUMNS)), align=8, stride_order=(1, 0))
    workspace = fake_tensor(Int64, (cute.sym_int(), slots_per_cta(cfg, trace, bool(mixed)), DESC_WORDS),
                            align=DESC_BYTES, stride_order=(2, 1, 0))
    host = grouped_host(cfg, mode, fences, by_size, l2_promotion, trace, dynamic, overlap_store, mixed,
                        burst if mixed else 1)
    return compile_for(target, host, a, b, c, offs, table, workspace, Int32(1), Int32(1), Int64(0),
                       fake_stream(env=tvm_ffi), tvm_ffi=tvm_ffi)
