"""Chapter 11 on Hopper, the A16 twin: A converted to FP16 once, then an SS WGMMA over stacked [B1; B2].

What it teaches
    The fast twin (:mod:`gemmlab.kernels.dual_gemm_sm90_pipelined`) converts A's FP4 bytes into
    WGMMA register fragments in every CTA along N: A is converted N / ``tile_n`` times in all,
    and at M >= 256 conversion and MMA each take about 60% of its time. This twin converts A
    exactly once and spends the saved work on wider MMAs:

    * **A pre-pass** (:func:`prepass_kernel`) turns the packed NVFP4 A and its scales into a
      plain FP16 (M, K) row-major tensor in global memory (a workspace). Every e2m1 x e4m3
      product is exact in FP16 (:mod:`gemmlab.fp4_dequant`), so nothing is lost. It is a
      streaming kernel: thread ``i`` of a CTA converts 8-value units ``i``, ``i + 256``, ...
      (one packed word in, one 16-byte FP16 chunk out), so a warp's loads and stores are
      each one contiguous span; every access is predicated on the unit count.
    * **The main kernel** (:func:`a16_kernel`) reads that FP16 A by TMA straight into
      WGMMA's 128B-swizzled K-major layout. Each MMA warpgroup owns a ring of ``stages``
      slots holding its 64 rows of a 64-K slice (one 64 x 64 box, 8 KiB) and refills a slot
      itself as soon as ``wgmma.wait_group 1`` shows the slot read: no mbarrier between
      warpgroups for A, and a load ``stages - 1`` slices ahead. B1 and B2 arrive packed,
      with their scales, by TMA as in the fast twin (slice-major, a ring of two k-blocks,
      loaded one k-block ahead by the converter's warp 0), and the converter warpgroup
      turns each B slice into FP16 in shared memory. B1's ``tile_n`` rows and B2's are
      **stacked** in one buffer of ``2 tile_n`` rows, so one ``wgmma.m64n(2 tile_n)k16``
      (both operands from shared memory: the SS form) serves both GEMMs: the accumulator's
      first ``tile_n`` columns are A B1^T, the next ``tile_n`` A B2^T. Wider N reads A from
      shared memory once for twice the columns.
    * **Epilogue**: ``silu(acc1) * acc2`` in FP32, FP16 to C straight from the registers,
      predicated on row < M and column < N (the fast twin's
      :func:`~gemmlab.kernels.dual_gemm_sm90.gate_epilogue`, on two views of the one
      accumulator).

    The price: A travels as FP16 (2 bytes a value instead of 9/16), once through global
    memory for the pre-pass's store and once per CTA along N through L2 for the main kernel.

Roles of the main kernel (384 threads, three warpgroups; with ``converters`` 2, 512 threads, two converter
warpgroups that split each slice's units between them, then the two MMA warpgroups)::

    warpgroup 0  converter; its warp 0 first loads packed k-block kb + 1 (wait pempty[(kb + 1) % 2]; expect_tx;
                   10 TMA boxes: B1, B2 as four 32-byte slices each, their scales);
                 all 4 warps, per k-block kb: wait pfull[kb % 2]; per slice j (g = 4 kb + j): load B(j + 1) bytes;
                   wait hempty[g % buffers]; convert [B1; B2](j) into buffer g % buffers; fence.proxy.async;
                   arrive hfull[g % buffers]; after the 4 slices: arrive pempty[kb % 2]
    warpgroups 1, 2  MMA, 64 rows of C each; first warp: load A slices 0 .. stages - 1 (own rows, own ring);
                   per slice g: wait afull[wg][g % stages], hfull[g % buffers]; wgmma.fence;
                   4 x wgmma m64n(2 tile_n)k16 SS; commit; wait_group 1 -> arrive hempty of slice g - 1;
                   first warp: load A slice g - 1 + stages into slot (g - 1) % stages
                 epilogue: wait 0; silu(acc[:, :tile_n]) * acc[:, tile_n:] -> FP16 -> C (predicated)

The cluster form (``A16Config(cluster_m=2)``, ``tile_n`` 64, 96 or 128, one converter warpgroup): at large M every
128-row CTA converts the same B tile again, M / 128 times in all. Two CTAs with adjacent M tiles and the same N tile
form a cluster (launch cluster (2, 1, 1); M tiles rounded up to even: a second CTA wholly past M converts its half,
takes part in every barrier and stores nothing). Rank r loads only its half of [B1; B2] packed (rank 0 B1 and its
scales, rank 1 B2 and its: 5 TMA boxes a k-block instead of 10, half the packed ring, so the A ring may be deeper)
and converts it into stacked rows ``[r tile_n, (r + 1) tile_n)`` of buffer g % buffers of its own shared memory
(``st.shared``, as the one-CTA form writes the whole slice). Those rows are one contiguous block of ``tile_n`` x 128
bytes, and the copy engine moves it: once the converter's 4 warps have stored and fenced their rows, one thread
issues ``cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes`` to the same rows of the peer's
buffer (``mapa`` of the same address), completing on the peer's hfull as a TMA load completes on its barrier. Both
CTAs' buffers sit at the same 1024-aligned offsets and a half starts on a 1024-byte swizzle atom (:func:`half_bytes`),
so the byte copy carries the 128B swizzle unchanged. Each converted value so serves 256 rows of C. The barriers::

    hfull[b]   count 4 converter warps, plus the peer's copy's bytes: each converter warp, after its stores,
               ``fence.proxy.async.shared::cta`` and ``bar.warp.sync``, arrives on its own hfull; warp 0's arrival is
               ``mbarrier.arrive.expect_tx`` of ``tile_n`` x 128 bytes (the peer's half), which the peer's bulk copy
               completes (complete_tx). The MMA warps wait at CTA scope, as on a TMA-loaded A slot
    bar 1      named barrier of the converter's 128 threads after their arrivals; then thread 0 issues the bulk copy of
               our half of buffer b to the peer's buffer b, complete_tx on the peer's hfull[b]
    hempty[b]  count 2 x 8 MMA warps: each MMA warp, after ``wgmma.wait_group 1``, arrives on its own hempty and on
               the peer's (``mbarrier.arrive.shared::cluster``, default semantics: release at CTA scope, as CUTLASS's
               ``ClusterBarrier::arrive(cta_id)`` releases a multicast TMA's consumer buffer). The WGMMAs' reads of
               the buffer are complete at ``wait_group``, before the arrival, so the peer's next copy into it cannot
               overwrite what they read. The converter waits at CTA scope: what it writes next is its own buffer
               (``st.shared``, after its own MMA warps' arrivals) and the peer's through the async proxy
    cluster barriers  after the barrier inits (no copy to or arrival on a peer's barrier before it is initialised);
               at the converter's end and around the MMA warpgroups' epilogue (arrive before, wait after): no CTA
               exits while the peer may still copy into it or arrive on its barriers, or while its own last copies
               still read its buffers; pfull, pempty and the A ring stay per CTA

Phases. The peer's complete_tx and our expect_tx of hfull[b]'s use u may come in either order: the tx-count may go
negative (PTX ISA, "mbarrier": its range is -(2^20 - 1) to 2^20 - 1), and a phase completes only when the pending
arrivals and the tx-count are both zero, so the four local arrivals (warp 0's carrying the expect_tx) hold it open
until our half is written and the peer's bytes are counted. No byte lands in the wrong phase: the peer copies into
our b for use u + 1 only after its hempty[b] completed use u, which needs our MMA warps' arrivals, made after our
hfull[b] completed use u; and our warp 0 arms use u after its own hempty[b] wait, after our MMA warps passed use
u - 1. Source reuse: a converter rewrites its half of b for use u + 1 only after its hempty[b] completed use u, which
needs the peer's MMA warps' release of use u, made after the peer's hfull[b] completed, after the bytes of our copy
out of b landed: the copy has read its source. (The mbarrier form of the copy joins no bulk group, so
``cp.async.bulk.wait_group.read`` could not track it anyway.) So every barrier is at most one phase ahead of its
slowest waiter, as in the one-CTA kernel.

Why the copy engine (H100, 2026-11-27). The first cluster design stored every converted 16-byte chunk twice,
``st.shared`` into our buffer and ``st.shared::cluster`` into the peer's, with ``fence.proxy.async.shared::cluster``,
``mbarrier.arrive.release.cluster`` on the peer's hfull and ``try_wait.acquire.cluster`` waits. It was correct (37
GPU tests, bitwise equal to the one-CTA form at 1024 x 4096 x 7168, compute-sanitizer memcheck and racecheck clean)
and **2.4 to 3.6 times slower** than the one-CTA form (``results/nvidia-h100-80gb-hbm3/dual_gemm_a16_cluster_first.json``,
kernels alone, 9 shapes M = 256 to 2048: 2.4 to 2.6 at ``tile_n`` 64, 3.1 to 3.6 at 96, 2.8 to 3.1 at 128). The probe
(``results/nvidia-h100-80gb-hbm3/dual_gemm_a16_cluster_probe.txt``, 1024 x 4096 x 7168, ``tile_n`` 128, pre-pass
and main kernel per call): one-CTA form about 310 us, cluster form 621 us; Nsight Compute saw 67 % of its warp cycles
stalled on an L1TEX scoreboard dependency (the remote stores) and 0.09 eligible warps per scheduler (0.39 one-CTA).
The remote arrivals with default semantics instead of ``.release.cluster``: 416 us; the waits and the proxy fence at
CTA scope too: 315 us, but wrong (nothing then orders the peer's generic stores for our WGMMAs); no remote stores at
all (wrong) with CTA-scope arrivals: 302 us. The per-thread remote stores, and the cluster-scope release that must
wait for them, cost the time; the bulk copy takes the bytes off the converter's threads and makes every cross-CTA
signal what a TMA multicast pipeline uses (the probe's other variants patched wrappers of that first design, which
are gone: commit 4594d43 has them).

Measured, this design (H100, 2026-11-27, ``results/nvidia-h100-80gb-hbm3/dual_gemm_a16_cluster.json``, kernels
alone, the same 9 shapes): correct (the 37 GPU tests, bitwise equal to the one-CTA form; compute-sanitizer memcheck
and racecheck clean), twice as fast as the first design, and still not worth running: 0.96 to 0.99 of the one-CTA
form's time at ``tile_n`` 64 but 1.13 to 1.19 times the two-converter form's there (1024 x 4096 x 7168: 241.0 us
against 251.1 and 210.1), and 1.39 to 1.47 times the one-CTA form's at 96 and 128 (1024 x 4096 x 7168 at 128: 290.7
against 204.6). The halved conversion does not reach the tensor cores: each slice now waits for the peer's slowest
converter warp and the copy's flight, and the peer's MMA warps' release, with two FP16 buffers of slack (not
profiled). :data:`~gemmlab.family.heuristic_gated.A16_CLUSTER` stays empty, so the public call never runs it.

Model of the cluster form, per CTA and 64-K slice at ``tile_n`` 128 (from the PTX). One CTA: 1,024 units of 16
values, 8 a converter thread, each 2 shared loads, 9 ``cvt.rn.f16x2.e4m3x2``, 9 ``mul.rn.f16x2``, 5 ``prmt`` and 2
16-byte stores plus address arithmetic, about 55 instructions (the converter's unrolled k-block, 32 units a thread,
is about 1,760 of the kernel's 3,510 PTX instructions); 32 KiB of FP16 written, 9 KiB of packed B and scales loaded.
Cluster: 512 units, 4 a thread, the same 2 local stores each, so about half the converter's instructions (the whole
kernel 2,664 PTX instructions against the one-CTA form's 3,485 counted the same way at 1024 x 4096 x 7168), plus a
named barrier and one bulk copy of 16 KiB a slice; the FP16 bytes
written into each SM's shared memory are the same 32 KiB (16 by its own converter, 16 by the peer's copy over the
SM-to-SM network), 4.5 KiB packed loaded; the WGMMAs unchanged (2 warpgroups x 4 x m64n256k16). Nsight Compute saw
the one-CTA form's tensor pipe 63 % busy at 1024 x 4096 x 7168, the MMA warps waiting on the converter: if halving
the converter's work leaves the tensor pipe the limit, the time falls to at best about 0.63 of the one-CTA form's
(at most 1.6x faster). What may keep it above that: a slice's peer half now lands only after the peer's slowest
converter warp and the copy's latency (the per-chunk stores overlapped the conversion), the per-slice named barrier,
a cross-SM round trip per slice on hempty with only ``buffers`` FP16 buffers of slack, and the extra CTA of an odd
ceil(M / 128) (M = 640: 6 tiles instead of 5, 20 % more CTAs). The same halving at 64 and 96 has no measured tensor
share to bound it.

Registers: 384 threads start with 168 each (.minnctapersm 1: ptxas then honours setmaxnreg, see the decode
twin); :data:`REGS` moves them to the roles, ``128 x (converters x converter + 2 x MMA) <= entry x threads``. 512
threads start with 128, and ptxas refuses a m64n256k16 WGMMA (``tile_n`` 128) below 154 registers at entry and a
m64n224k16 (112) below 138, whatever setmaxnreg gives its region (C7602): so a second converter warpgroup only for
``tile_n`` 64 and 96 (whose 8 ``tile_n`` units of a slice also split evenly over 256 threads).

The cluster form moves registers the same way (:data:`REGS` [1]); ptxas compiles it at ``tile_n`` 64, 96 and 128 with
168 registers at entry and no spill (48, 80 and 112 are refused by the configuration: a CTA's half slice is 4
``tile_n`` units, not a multiple of 128 threads there).

Measured (kernels alone, inputs rotated over 4x the L2; H100, 2026-11-27): ``tile_n`` 128 took 0.72 to 0.88 of
the fast twin's time at M = 512 to 2048 (2048 x 4096 x 7168: 409 us against 554, ``benchmarks/dual_gemm.py bf16``).
Every width from 48 to 128 (``benchmarks/dual_gemm.py a16``, 24 shapes, M = 200 to 1024): the fastest one beat the
fast twin on every shape, and which one is fastest follows the waves of its grid
(:func:`~gemmlab.family.heuristic_gated.choose_a16`).
A second converter warpgroup (``converters`` 2) took 0.83 to 0.86 of one's time at ``tile_n`` 64 and 0.96 at 96 on
six shapes (H100, ``results/nvidia-h100-80gb-hbm3/dual_gemm_a16_converters.json``): the converter, not the tensor
cores, set the pace. ``mma_converts`` (the MMA warpgroups convert half of each slice between their WGMMAs) was correct
there but 3 to 8 % slower: an MMA warpgroup converting slice j + 1 cannot issue slice j + 1's WGMMAs until it is done, and only slice
j's are in flight meanwhile, so the tensor cores wait on the conversion it took over.
"""
from __future__ import annotations

import functools

import cutlass
import cutlass.cute as cute
import cutlass.utils.hopper_helpers as sm90_utils
import cuda.bindings.driver as cuda
from cutlass import Float16, Float32, Int32, Int64, Uint8
from cutlass.cute.nvgpu import OperandMajorMode, cpasync, warpgroup
from cutlass.memory import SmemAllocator
from cutlass.tensor_utils import LayoutEnum

from ..async_copy import cp_async_bulk_s2s_cluster, mapa_shared_cluster
from ..family.configs import A16_B_STAGES as B_STAGES, A16_SLICE_BYTES as A_SLICE_BYTES, A16Config
from ..family.configs import GATED_TILE_M as TILE_M, KB_BYTES, SF_BYTES, SLICE_K, SLICES
from ..family.problem import check_gated_sizes
from ..fp4_dequant import fp4x8_to_f16, scale_f16x2
from ..ldst import ld_global_b32, ld_shared_b32, ld_shared_v2, st_global_v4
from .dual_gemm_sm90 import (check_devices, check_sm90_target, compile_with_pointers, fake_operands, gate_epilogue,
                             operand_2d, operands_2d, with_runtime_rows)
from .dual_gemm_sm90_pipelined import convert_unit, load_b

SLICE_BYTES = SLICE_K // 2  #: packed bytes of a slice per row
WG_ROWS = 64  #: rows of C per MMA warpgroup (WGMMA's M)
#: setmaxnreg per role, (converter, MMA), by converter warpgroups. One: 384 threads start with 168 registers each
#: (64,512 in all), and 128 x (112 + 2 x 192) = 63,488 <= 64,512. Two: 512 threads start with 128 each (65,536), and
#: 128 x (2 x 56 + 2 x 200) = 65,536. An MMA thread holds 2 tile_n FP32 accumulators (128 at tile_n 128, 96 at 96).
REGS = {1: (112, 192), 2: (56, 200)}
PREPASS_THREADS = 256
PREPASS_UNITS = 4  #: 8-value units each pre-pass thread converts (one packed word in, 16 FP16 bytes out each)


# --------------------------------------------------------------------------------------
# The cluster form (``cluster_m`` 2): the peer's half by one bulk copy, and the peer's release
# --------------------------------------------------------------------------------------

CONVERTER_BARRIER = 1  #: named barrier of the converter warpgroup's 128 threads (0 is ``__syncthreads``; no other)


def half_bytes(bn: int) -> int:
    """Bytes of a CTA's half of a stacked [B1; B2] slice buffer (``cluster_m`` 2): ``bn`` 128-byte rows, copied to
    the peer in one ``cp.async.bulk``. The copy keeps the 128B swizzle as it is, byte for byte, only if both ends sit
    at the same offset within a 1024-byte swizzle atom: the buffers are 1024-aligned at the same offset in both CTAs
    (one kernel, one allocation order), and a half starts ``bn`` rows into a buffer of ``2 bn``."""
    nbytes = bn * 128
    assert nbytes % 1024 == 0, f"a half of {bn} rows does not start on a 1024-byte swizzle atom"
    assert nbytes % 16 == 0 and nbytes < 1 << 20, f"cp.async.bulk cannot copy {nbytes} bytes (tx-count range)"
    return nbytes


def arrive_remote(addr):
    """``mbarrier.arrive.shared::cluster.b64``: one arrival on the mbarrier at ``shared::cluster`` address ``addr``
    (the peer's, from :func:`~gemmlab.async_copy.mapa_shared_cluster`), with the default semantics: release at CTA
    scope, as CUTLASS's ``ClusterBarrier::arrive(cta_id)`` releases a multicast TMA's consumer buffer. What it
    orders for the peer is our WGMMAs' reads, complete at ``wgmma.wait_group`` before it: no data of ours."""
    cute.arch.inline_ptx("mbarrier.arrive.shared::cluster.b64 _, [{$r0}];", read_only_args=[addr])


# --------------------------------------------------------------------------------------
# The pre-pass: NVFP4 A -> FP16 A
# --------------------------------------------------------------------------------------


@cute.kernel
def prepass_kernel(a: cute.Tensor, sfa: cute.Tensor, a16: cute.Tensor, units: cutlass.Constexpr):
    """Unit ``u`` (8 values): packed word ``u`` of ``a`` (flat), scale byte ``u // 2`` of ``sfa`` (flat: K/16 a row,
    K/8 units a row), FP16 chunk ``u`` (16 bytes) of ``a16``. Thread ``i`` of CTA ``b`` converts units
    ``b 256 U + i + 256 j``, ``j < U``: all loads first, then the conversions and stores."""
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    first = bidx * (PREPASS_THREADS * PREPASS_UNITS) + tidx
    pa = a.iterator
    ps = sfa.iterator
    po = cute.recast_ptr(a16.iterator, dtype=Uint8)
    for u, ok, w, sw in load_units(pa, ps, first, units):
        st_global_v4(po + Int64(u) * 16, *convert_loaded(u, w, sw), pred=ok)


def load_units(pa, ps, first, units: int) -> list:
    """A streaming pass's loads, issued before any conversion (traced inline into the kernel that calls it): for each
    of a thread's :data:`PREPASS_UNITS` units ``u = first + 256 j`` (8 values), ``(u, ok, packed word u, the scale word
    holding byte u // 2)`` from the flat packed bytes at ``pa`` and scale bytes at ``ps``, predicated on ``u < units``."""
    held = []
    for j in range(PREPASS_UNITS):
        u = first + j * PREPASS_THREADS
        ok = u < units
        w = ld_global_b32(pa + Int64(u) * 4, pred=ok)
        sw = ld_global_b32(ps + Int64(u // 8) * 4, pred=ok)  # the word holding scale byte u // 2
        held.append((u, ok, w, sw))
    return held


def convert_loaded(u, w, sw) -> tuple:
    """Unit ``u``'s 8 values (packed word ``w``; ``sw`` the scale word holding its byte) as four FP16x2 words."""
    sc = scale_f16x2(sw >> (((u // 2) % 4) * 8), 0)
    return fp4x8_to_f16(w, sc, sc)


@cute.jit
def launch_prepass(a: cute.Tensor, sfa: cute.Tensor, a16: cute.Tensor, stream: cuda.CUstream):
    """``a`` (M, K/2) packed bytes, ``sfa`` (M, K/16) scale bytes, ``a16`` (M, K) FP16: all row-major."""
    units = cute.size(a16) // 8
    per_cta = PREPASS_THREADS * PREPASS_UNITS
    prepass_kernel(a, sfa, a16, units).launch(grid=((units + per_cta - 1) // per_cta, 1, 1),
                                              block=(PREPASS_THREADS, 1, 1), stream=stream)


# --------------------------------------------------------------------------------------
# The main kernel
# --------------------------------------------------------------------------------------


@cute.jit
def convert_b_stacked(fB, loaded, unit: Int32, buf, bn: cutlass.Constexpr):
    """One unit of :func:`~.dual_gemm_sm90_pipelined.load_b` (row ``unit // 4`` of [B1; B2], 16 values) to FP16 in
    buffer ``buf``: two 16-byte chunks of a 128B-swizzled row, chunk c of row r at chunk ``c ^ (r % 8)``. The
    buffer stacks B1's ``bn`` rows and B2's: row r of [B1; B2] at ``r x 128`` bytes (WGMMA's K-major B layout
    for N = 2 bn). ``fB``: the buffers' base, or (``cluster_m`` 2) our half's, ``rank bn`` rows in: a whole number
    of 1024-byte swizzle atoms (:func:`half_bytes`), so row ``unit // 4`` of the half has the stacked row's swizzle
    phase."""
    convert_unit(fB + (buf * (2 * bn * 128) + (unit // 4) * 128), loaded, unit)


@cute.jit
def load_slice_unit(pB, sB, unit: Int32, sl: cutlass.Constexpr, bn: cutlass.Constexpr, cluster: cutlass.Constexpr):
    """The converter's loads of unit ``unit`` of slice ``sl``: from stacked [B1; B2] stages, or (``cluster_m`` 2)
    from stages of one half."""
    if cutlass.const_expr(cluster > 1):
        return load_b_half(pB, sB, unit, sl, bn)
    return load_b(pB, sB, unit, sl, bn)


@cute.jit
def load_b_half(pB, sB, unit: Int32, sl: cutlass.Constexpr, bn: cutlass.Constexpr):
    """``cluster_m`` 2: :func:`~.dual_gemm_sm90_pipelined.load_b` of a stage that holds one of B1 and B2 (``bn``
    rows): unit ``unit`` is row ``unit // 4``, bytes ``8 (unit % 4)`` onwards of the slice row, and its scale word."""
    row = unit // 4
    x0, x1 = ld_shared_v2(pB + (sl * bn * SLICE_BYTES + row * SLICE_BYTES + (unit % 4) * 8))
    sw = ld_shared_b32(sB + (row * SF_BYTES + sl * 4))
    return x0, x1, sw


@cute.jit
def acc_half(acc: cute.Tensor, half: cutlass.Constexpr, bn: cutlass.Constexpr) -> cute.Tensor:
    """GEMM ``half + 1``'s view of the stacked accumulator: a thread's values of an m64nNk16 C fragment are
    ``((2, 2, N / 8), 1, 1)`` with the N / 8 column groups outermost, so columns ``[0, bn)`` are the first half of
    the fragment and ``[bn, 2 bn)`` the second: each half is laid out as the fragment of a ``(128, bn)`` tile."""
    inner = cute.make_layout(((2, 2, bn // 8), 1, 1), stride=((1, 2, 4), 0, 0))
    return cute.make_tensor(acc.iterator + half * (bn // 2), inner)


@cute.kernel
def a16_kernel(
    tma_a: cute.CopyAtom, mA: cute.Tensor, tma_b1: cute.CopyAtom, mB1: cute.Tensor,
    tma_b2: cute.CopyAtom, mB2: cute.Tensor, tma_sb1: cute.CopyAtom, mSB1: cute.Tensor,
    tma_sb2: cute.CopyAtom, mSB2: cute.Tensor, mC: cute.Tensor, tiled_mma: cute.TiledMma, epi_mma: cute.TiledMma,
    sa_layout: cute.ComposedLayout, pb_layout: cute.Layout, sb_layout: cute.Layout, fb_layout: cute.ComposedLayout,
    k_blocks: Int32, cfg: cutlass.Constexpr,
):
    BN = cfg.tile_n
    SA = cfg.stages
    NB = cfg.buffers
    tidx, _, _ = cute.arch.thread_idx()
    warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
    wg = warp // 4
    m_tile, n_tile, _ = cute.arch.block_idx()
    slices = k_blocks * SLICES
    CT = 128 * cfg.converters  # converter threads
    CONVERTING_WARPS = 12 if cfg.mma_converts else 4 * cfg.converters  # the warps that write each FP16 buffer
    UNITS = 2 * BN * (SLICE_BYTES // 8)  # 8-byte units of a [B1; B2] slice
    CONV_UNITS = UNITS // 2 if cfg.mma_converts else UNITS  # the converter warpgroups': the first ones
    CL = cfg.cluster_m  # 2: this CTA and its peer (adjacent M tile, same N tile) share the FP16 [B1; B2] buffers
    RB = 2 * BN // CL  # rows of [B1; B2] this CTA loads packed and converts: all, or its half (B1 or B2)
    if cutlass.const_expr(CL > 1):
        CONV_UNITS = UNITS // CL

    smem = SmemAllocator()
    fRaw = smem.allocate_tensor(Uint8, cute.make_layout(cfg.buffer_bytes()), byte_alignment=1024)
    aRaw = smem.allocate_tensor(Uint8, cute.make_layout(SA * A_SLICE_BYTES), byte_alignment=1024)
    pBRaw = smem.allocate_tensor(Uint8, cute.make_layout(B_STAGES * RB * KB_BYTES), byte_alignment=128)
    sBRaw = smem.allocate_tensor(Uint8, cute.make_layout(B_STAGES * RB * SF_BYTES), byte_alignment=128)
    afull = smem.allocate_array(Int64, 2 * SA, byte_alignment=8)  # per MMA warpgroup: its FP16 A half-slice landed
    pfull = smem.allocate_array(Int64, B_STAGES, byte_alignment=8)  # packed B k-block landed (TMA)
    pempty = smem.allocate_array(Int64, B_STAGES, byte_alignment=8)  # packed B k-block read (the converting warps)
    # FP16 [B1; B2] buffer written (the converting warps; cluster_m 2: and the bytes of the peer's bulk copy of its
    # half) and read (8 MMA warps; cluster_m 2: ours and the peer's 8, which read the copy of our half)
    hfull = smem.allocate_array(Int64, NB, byte_alignment=8)
    hempty = smem.allocate_array(Int64, NB, byte_alignment=8)

    pB1 = cute.make_tensor(pBRaw.iterator, pb_layout)
    pB2 = cute.make_tensor(pBRaw.iterator + (BN * KB_BYTES) % (RB * KB_BYTES), pb_layout)  # cluster_m 2: B1's place
    sSB1 = cute.make_tensor(sBRaw.iterator, sb_layout)
    sSB2 = cute.make_tensor(sBRaw.iterator + (BN * SF_BYTES) % (RB * SF_BYTES), sb_layout)

    if warp == 0:
        for atom in (tma_a, tma_b1, tma_b2, tma_sb1, tma_sb2):
            cpasync.prefetch_descriptor(atom)
        with cute.arch.elect_one():
            for s in cutlass.range_constexpr(2 * SA):
                cute.arch.mbarrier_init(afull + s, 1)
            for s in cutlass.range_constexpr(B_STAGES):
                cute.arch.mbarrier_init(pfull + s, 1)
                cute.arch.mbarrier_init(pempty + s, CONVERTING_WARPS)
            for b in cutlass.range_constexpr(NB):
                cute.arch.mbarrier_init(hfull + b, CONVERTING_WARPS)  # cluster_m 2: + the peer's bytes (tx)
                cute.arch.mbarrier_init(hempty + b, 8 * CL)
            cute.arch.mbarrier_init_fence()
    rank = Int32(0)  # our rank in the cluster: the half of [B1; B2] we load and convert
    peer_hfull = Int32(0)  # the peer's barriers, as shared::cluster addresses
    peer_hempty = Int32(0)
    if cutlass.const_expr(CL > 1):
        # both CTAs' barriers are initialised before either arrives on, or copies to, the other's
        cute.arch.cluster_arrive()
        cute.arch.cluster_wait()
        rank = cute.arch.make_warp_uniform(cute.arch.block_idx_in_cluster())
        peer_hfull = Int32(mapa_shared_cluster(hfull, 1 - rank))
        peer_hempty = Int32(mapa_shared_cluster(hempty, 1 - rank))
    else:
        cute.arch.sync_threads()

    if wg < cfg.converters:
        # ============================================================ converter: [B1; B2] to FP16; warp 0 loads B
        cute.arch.warpgroup_reg_dealloc(REGS[cfg.converters][0])
        lane = cute.arch.lane_idx()
        b_copies = []
        for atom, g, s, width in ((tma_b1, mB1, pB1, KB_BYTES), (tma_b2, mB2, pB2, KB_BYTES),
                                  (tma_sb1, mSB1, sSB1, SF_BYTES), (tma_sb2, mSB2, sSB2, SF_BYTES)):
            tiles = cute.local_tile(g, (BN, width), (None, None))
            dst, src = cpasync.tma_partition(atom, 0, cute.make_layout(1), cute.group_modes(s, 0, 2),
                                             cute.group_modes(tiles, 0, 2))
            b_copies.append((atom, src, dst))
        if warp == 0:
            load_b_stage(b_copies, pfull, n_tile, Int32(0), Int32(0), cfg.b_stage_bytes(), rank, CL)
        per = CONV_UNITS // CT  # 8-byte units of a slice per thread
        # cluster_m 2: our half's rows of the stacked buffers, in our shared memory and (shared::cluster) the peer's:
        # rows [rank bn, (rank + 1) bn), 1024-aligned (half_bytes), so the swizzle phase of half row r is the
        # stacked row's and a byte copy to the same offset in the peer is a copy of the swizzled rows
        own_half = fRaw.iterator
        peer_half = Int32(0)
        HB = 0  # bytes of our half of a slice, the peer's copy of it
        if cutlass.const_expr(CL > 1):
            HB = half_bytes(BN)
            own_half = fRaw.iterator + rank * HB
            peer_half = Int32(mapa_shared_cluster(own_half, 1 - rank))
        for kb in cutlass.range(k_blocks, unroll=1):
            if warp == 0:
                nxt = kb + 1  # one k-block ahead: its stage was released by all four warps after k-block kb - 1
                if nxt < k_blocks:
                    cute.arch.mbarrier_wait(pempty + nxt % B_STAGES, ((nxt // B_STAGES) & 1) ^ 1)
                    load_b_stage(b_copies, pfull, n_tile, nxt, nxt % B_STAGES, cfg.b_stage_bytes(), rank, CL)
            st = kb % B_STAGES
            cute.arch.mbarrier_wait(pfull + st, (kb // B_STAGES) & 1)
            stage_b = pBRaw.iterator + st * (RB * KB_BYTES)
            stage_sb = sBRaw.iterator + st * (RB * SF_BYTES)
            loaded = [load_slice_unit(stage_b, stage_sb, tidx + i * CT, 0, BN, CL) for i in range(per)]
            for sl in cutlass.range_constexpr(SLICES):
                buf = sl % NB  # SLICES is a multiple of NB: the buffer is fixed per slice of a k-block
                uses = SLICES // NB  # times a k-block fills each buffer
                # its last WGMMAs are done (cluster_m 2: ours, which read our buffer, and the peer's, which read the
                # peer's buffer, where our bulk copy will write; CTA scope: all we write next is our own buffer by
                # st.shared and the peer's by the async proxy, ordered after its MMA warps' wgmma.wait_group by their
                # remote arrival, as a multicast TMA after its consumers' release). It also frees our half of the
                # buffer from our last bulk copy out of it: the peer's MMA warps released that use only after their
                # hfull completed, which needed the copy's bytes to land, so it has finished reading.
                cute.arch.mbarrier_wait(hempty + buf, ((kb * uses + sl // NB) & 1) ^ 1)
                nxt_loaded = loaded
                if cutlass.const_expr(sl + 1 < SLICES):  # the next slice's loads overlap this one's conversion
                    nxt_loaded = [load_slice_unit(stage_b, stage_sb, tidx + i * CT, sl + 1, BN, CL)
                                  for i in range(per)]
                for i in cutlass.range_constexpr(per):  # cluster_m 2: our half, into our own buffer only
                    convert_b_stacked(own_half, loaded[i], tidx + i * CT, buf, BN)
                loaded = nxt_loaded
                # generic-proxy stores before the async proxy reads them: our WGMMAs and (cluster_m 2) our bulk copy
                cute.arch.fence_proxy("async.shared", space="cta")
                cute.arch.sync_warp()
                if lane == 0:
                    if cutlass.const_expr(CL > 1):
                        if warp == 0:  # its warp's arrival, arming the phase for the peer's copy of its half
                            cute.arch.mbarrier_arrive_and_expect_tx(hfull + buf, HB)
                        else:
                            cute.arch.mbarrier_arrive(hfull + buf)
                    else:
                        cute.arch.mbarrier_arrive(hfull + buf)
                if cutlass.const_expr(CL > 1):
                    # all four warps' stores of our half are written and fenced: one thread copies the half to the
                    # same rows of the peer's buffer, completing on the peer's hfull (which its warp 0 armed)
                    cute.arch.barrier(barrier_id=CONVERTER_BARRIER, number_of_threads=128)
                    if tidx == 0:
                        off = buf * (2 * BN * 128)
                        cp_async_bulk_s2s_cluster(peer_half + off, own_half + off, HB, peer_hfull + buf * 8)
            if lane == 0:
                cute.arch.mbarrier_arrive(pempty + st)
        if cutlass.const_expr(CL > 1):
            # the peer copies into our buffers and arrives on our barriers until its last slice, and our last copies
            # read our buffers until they land in the peer's: neither CTA exits before both are done
            cute.arch.cluster_arrive()
            cute.arch.cluster_wait()
    else:
        # ============================================================ MMA warpgroups: 64 rows of C each
        cute.arch.warpgroup_reg_alloc(REGS[cfg.converters][1])
        wgi = wg - cfg.converters
        ctid = tidx - CT
        lane = cute.arch.lane_idx()
        loader = warp % 4 == 0  # this warpgroup's first warp issues its A loads
        # this warpgroup's own FP16 A ring: its 64 rows of every slice, loaded by its first warp, read by its WGMMAs
        ring = aRaw.iterator + wgi * (SA * A_SLICE_BYTES // 2)
        sA = cute.make_tensor(cute.recast_ptr(ring, sa_layout.inner, Float16), sa_layout.outer)
        bars = afull + wgi * SA
        gA = cute.local_tile(mA, (WG_ROWS, SLICE_K), (None, None))
        tAs, tAg = cpasync.tma_partition(tma_a, 0, cute.make_layout(1), cute.group_modes(sA, 0, 2),
                                         cute.group_modes(gA, 0, 2))
        a_row_tile = m_tile * 2 + wgi
        if loader:
            for i in cutlass.range_constexpr(SA):
                if i < slices:
                    load_a_slice(tma_a, tAg, tAs, bars, a_row_tile, Int32(i), Int32(i))

        thr_mma = tiled_mma.get_slice(ctid % 128)
        fB = cute.make_tensor(cute.recast_ptr(fRaw.iterator, fb_layout.inner, Float16), fb_layout.outer)
        tCrA = tiled_mma.make_fragment_A(thr_mma.partition_A(sA))  # (MMA, MMA_M, MMA_K, stages)
        tCrB = tiled_mma.make_fragment_B(thr_mma.partition_B(fB))  # (MMA, MMA_N, MMA_K, buffers)
        acc = cute.make_rmem_tensor(tiled_mma.partition_shape_C((WG_ROWS, 2 * BN)), Float32)
        acc.fill(0.0)
        tiled_mma.set(warpgroup.Field.ACCUMULATE, True)
        k_steps = cute.size(tCrA, mode=[2])
        MPER = (UNITS - CONV_UNITS) // (2 * 128)  # units of a slice per MMA thread (mma_converts)
        if cutlass.const_expr(cfg.mma_converts):  # our half of slice 0 before the first WGMMA
            mma_convert_slice(pBRaw.iterator, sBRaw.iterator, fRaw.iterator, pfull, pempty, hfull, hempty, Int32(0),
                              0, CONV_UNITS + ctid, MPER, lane, BN, NB)
        for kb in cutlass.range(k_blocks, unroll=1):
            for sl in cutlass.range_constexpr(SLICES):
                g = kb * SLICES + sl
                slot = g % SA
                buf = sl % NB
                uses = SLICES // NB
                cute.arch.mbarrier_wait(bars + slot, (g // SA) & 1)
                # CTA scope as for a TMA load: cluster_m 2's other half arrives by the peer's bulk copy (complete_tx)
                cute.arch.mbarrier_wait(hfull + buf, (kb * uses + sl // NB) & 1)
                warpgroup.fence()
                for ks in cutlass.range_constexpr(k_steps):
                    cute.gemm(tiled_mma, acc, tCrA[(None, None, ks, slot)], tCrB[(None, None, ks, buf)], acc)
                warpgroup.commit_group()
                # the previous slice's WGMMAs are done: its FP16 B buffer may be refilled, and its A slot, by us
                warpgroup.wait_group(1)
                if g > 0:
                    if lane == 0:
                        cute.arch.mbarrier_arrive(hempty + (sl + NB - 1) % NB)
                        if cutlass.const_expr(CL > 1):  # the peer's bulk copy writes this buffer of ours too
                            arrive_remote(peer_hempty + ((sl + NB - 1) % NB) * 8)
                    refill = g - 1 + SA
                    if loader:
                        if refill < slices:
                            load_a_slice(tma_a, tAg, tAs, bars, a_row_tile, refill, (g + SA - 1) % SA)
                if cutlass.const_expr(cfg.mma_converts):  # our half of the next slice while these WGMMAs run
                    nkb = kb + (sl + 1) // SLICES
                    if nkb < k_blocks:
                        mma_convert_slice(pBRaw.iterator, sBRaw.iterator, fRaw.iterator, pfull, pempty, hfull, hempty,
                                          nkb, (sl + 1) % SLICES, CONV_UNITS + ctid, MPER, lane, BN, NB)
        warpgroup.wait_group(0)
        if cutlass.const_expr(CL > 1):
            # our last arrival on the peer's barriers is behind us, and the peer's last copy into us has landed (our
            # hfull): the wait is at the end
            cute.arch.cluster_arrive()

        # ---- epilogue: columns [0, BN) of the accumulator are A B1^T, [BN, 2 BN) A B2^T
        thr_epi = epi_mma.get_slice(ctid)
        if cutlass.const_expr(CL > 1):
            # a CTA wholly past M (the second of the last cluster) stores nothing. Its predicates alone would not do at
            # M = 1: C's static row extent of 1 is folded away, and with it the tile's row offset
            if m_tile * TILE_M < cute.size(mC, mode=[0]):
                gate_epilogue(thr_epi, acc_half(acc, 0, BN), acc_half(acc, 1, BN), mC, m_tile, n_tile, BN)
        else:
            gate_epilogue(thr_epi, acc_half(acc, 0, BN), acc_half(acc, 1, BN), mC, m_tile, n_tile, BN)
        if cutlass.const_expr(CL > 1):
            cute.arch.cluster_wait()  # our shared memory outlives the peer's writes and arrivals


@cute.jit
def mma_convert_slice(pB, sB, fB, pfull, pempty, hfull, hempty, kb: Int32, sl: cutlass.Constexpr, first: Int32,
                      per: cutlass.Constexpr, lane: Int32, bn: cutlass.Constexpr, nb: cutlass.Constexpr):
    """An MMA thread's share of slice ``sl`` of k-block ``kb`` (``mma_converts``): units ``first``, ``first + 256``,
    ... of the stacked [B1; B2] slice into its FP16 buffer. Waits for the packed k-block (its first slice) and for
    the buffer's last WGMMAs; arrives on ``hfull`` (and, after the k-block's last slice, on ``pempty``) as the
    converter's warps do."""
    st = kb % B_STAGES
    buf = sl % nb
    if cutlass.const_expr(sl == 0):
        cute.arch.mbarrier_wait(pfull + st, (kb // B_STAGES) & 1)
    cute.arch.mbarrier_wait(hempty + buf, ((kb * (SLICES // nb) + sl // nb) & 1) ^ 1)
    stage_b = pB + st * (2 * bn * KB_BYTES)
    stage_sb = sB + st * (2 * bn * SF_BYTES)
    loaded = [load_b(stage_b, stage_sb, first + i * 256, sl, bn) for i in range(per)]
    for i in cutlass.range_constexpr(per):
        convert_b_stacked(fB, loaded[i], first + i * 256, buf, bn)
    cute.arch.fence_proxy("async.shared", space="cta")  # generic-proxy stores before WGMMA reads them
    cute.arch.sync_warp()
    if lane == 0:
        cute.arch.mbarrier_arrive(hfull + buf)
        if cutlass.const_expr(sl == SLICES - 1):
            cute.arch.mbarrier_arrive(pempty + st)  # this warp has read the k-block's packed bytes


@cute.jit
def load_b_stage(copies, pfull, n_tile, kb: Int32, stage: Int32, stage_bytes: cutlass.Constexpr, rank: Int32,
                 cluster: cutlass.Constexpr):
    """Packed B1, B2 and their scales of k-block ``kb`` into ring stage ``stage`` (10 boxes: 4 slices each, 2 of
    scales; ``copies`` in the order B1, B2, SB1, SB2). ``cluster`` 2: only the half of rank ``rank``, B1 and SB1
    (rank 0) or B2 and SB2 (rank 1), 5 boxes."""
    with cute.arch.elect_one():
        cute.arch.mbarrier_arrive_and_expect_tx(pfull + stage, stage_bytes)
    if cutlass.const_expr(cluster > 1):
        if rank == 0:
            for atom, src, dst in (copies[0], copies[2]):
                cute.copy(atom, src[(None, n_tile, kb)], dst[(None, stage)], tma_bar_ptr=pfull + stage)
        else:
            for atom, src, dst in (copies[1], copies[3]):
                cute.copy(atom, src[(None, n_tile, kb)], dst[(None, stage)], tma_bar_ptr=pfull + stage)
    else:
        for atom, src, dst in copies:
            cute.copy(atom, src[(None, n_tile, kb)], dst[(None, stage)], tma_bar_ptr=pfull + stage)


@cute.jit
def load_a_slice(tma_a, tAg, tAs, bars, row_tile, g: Int32, slot: Int32):
    """One 64 x 64 FP16 box of A (a warpgroup's rows of slice ``g``) into ring slot ``slot``."""
    with cute.arch.elect_one():
        cute.arch.mbarrier_arrive_and_expect_tx(bars + slot, A_SLICE_BYTES // 2)
    cute.copy(tma_a, tAg[(None, row_tile, g)], tAs[(None, slot)], tma_bar_ptr=bars + slot)


# --------------------------------------------------------------------------------------
# Host side
# --------------------------------------------------------------------------------------


def smem_layouts(cfg: A16Config):
    """The FP16 A ring (WGMMA's 128B-swizzled K-major A, one 128 x 64 slice per stage), the packed B ring
    (slice-major, B2 after B1 in every stage), B's scales (row-major) and the FP16 [B1; B2] buffers."""
    BN, S = cfg.tile_n, cfg.stages
    tile = (TILE_M, 2 * BN, SLICE_K)
    # one MMA warpgroup's ring: its 64 rows of each slice (WGMMA's 128B-swizzled K-major A), ``stages`` slots
    sa = sm90_utils.make_smem_layout_a(LayoutEnum.ROW_MAJOR, (WG_ROWS, 2 * BN, SLICE_K), Float16, S)
    RB = 2 * BN // cfg.cluster_m  # rows of [B1; B2] a stage holds: both, or (cluster_m 2) the CTA's half
    pb = cute.make_layout((BN, (SLICE_BYTES, SLICES), B_STAGES),
                          stride=(SLICE_BYTES, (1, BN * SLICE_BYTES), RB * KB_BYTES))
    sb = cute.make_layout((BN, SF_BYTES, B_STAGES), stride=(SF_BYTES, 1, RB * SF_BYTES))
    fb = sm90_utils.make_smem_layout_b(LayoutEnum.ROW_MAJOR, tile, Float16, cfg.buffers)
    return sa, pb, sb, fb


@cute.jit
def launch_a16(a16: cute.Tensor, b1: cute.Tensor, b2: cute.Tensor, sfb1: cute.Tensor, sfb2: cute.Tensor,
               c: cute.Tensor, stream: cuda.CUstream, cfg: cutlass.Constexpr):
    """The main kernel: ``a16`` (M, K) FP16 row-major (the pre-pass's output), ``b1``/``b2`` (N, K/2) packed bytes,
    ``sfb1``/``sfb2`` (N, K/16) scale bytes, ``c`` (M, N) FP16."""
    BN = cfg.tile_n
    # one warpgroup's MMA (each MMA warpgroup has an A ring of its own): m64n(2 BN)k16, SS
    tiled_mma = sm90_utils.make_trivial_tiled_mma(Float16, Float16, OperandMajorMode.K, OperandMajorMode.K, Float32,
                                                  (1, 1, 1), tiler_mn=(WG_ROWS, 2 * BN))
    # partitions C for the epilogue: a (128, BN) tile, the fragment of each half of the accumulator
    epi_mma = sm90_utils.make_trivial_tiled_mma(Float16, Float16, OperandMajorMode.K, OperandMajorMode.K, Float32,
                                                (2, 1, 1), tiler_mn=(WG_ROWS, BN))
    sa, pb, sb, fb = smem_layouts(cfg)
    m = cute.size(c, mode=[0])
    n = cute.size(c, mode=[1])
    if cutlass.const_expr(m == 1):  # one row: keep the row coordinate of A's TMA copies
        a16 = with_runtime_rows(a16, 1)
    g2s = cpasync.CopyBulkTensorTileG2SOp()
    tma_a, tA = cpasync.make_tiled_tma_atom(g2s, a16, cute.slice_(sa, (None, None, 0)), (WG_ROWS, SLICE_K))
    tma_b1, tB1 = cpasync.make_tiled_tma_atom(g2s, b1, cute.slice_(pb, (None, None, 0)), (BN, KB_BYTES))
    tma_b2, tB2 = cpasync.make_tiled_tma_atom(g2s, b2, cute.slice_(pb, (None, None, 0)), (BN, KB_BYTES))
    tma_sb1, tSB1 = cpasync.make_tiled_tma_atom(g2s, sfb1, cute.slice_(sb, (None, None, 0)), (BN, SF_BYTES))
    tma_sb2, tSB2 = cpasync.make_tiled_tma_atom(g2s, sfb2, cute.slice_(sb, (None, None, 0)), (BN, SF_BYTES))
    k_blocks = cute.size(b1, mode=[1]) // KB_BYTES
    CL = cfg.cluster_m
    # cluster_m 2: M tiles rounded up to whole clusters; a CTA past M converts its half and stores nothing
    m_tiles = (m + TILE_M * CL - 1) // (TILE_M * CL) * CL
    grid = (m_tiles, (n + BN - 1) // BN, 1)
    kernel = a16_kernel(tma_a, tA, tma_b1, tB1, tma_b2, tB2, tma_sb1, tSB1, tma_sb2, tSB2, c, tiled_mma, epi_mma,
                        sa, pb, sb, fb, k_blocks, cfg)
    if cutlass.const_expr(CL > 1):
        kernel.launch(grid=grid, block=(cfg.threads, 1, 1), cluster=(CL, 1, 1), min_blocks_per_mp=1, stream=stream)
    else:
        kernel.launch(grid=grid, block=(cfg.threads, 1, 1), min_blocks_per_mp=1, stream=stream)


@cute.jit
def launch_both(a: cute.Tensor, b1: cute.Tensor, b2: cute.Tensor, sfa: cute.Tensor, sfb1: cute.Tensor,
                sfb2: cute.Tensor, a16: cute.Tensor, c: cute.Tensor, stream: cuda.CUstream, cfg: cutlass.Constexpr):
    """The pre-pass into ``a16`` (the FP16 A workspace), then the main kernel, on one stream."""
    launch_prepass(a, sfa, a16, stream)
    launch_a16(a16, b1, b2, sfb1, sfb2, c, stream, cfg)


@functools.lru_cache(maxsize=None)
def a16_host(cfg: A16Config):
    """The ``@cute.jit`` host function of ``cfg``: :func:`launch_both` (static shapes: one compile per problem
    size)."""

    @cute.jit
    def dual_gemm_sm90_a16_host(a: cute.Tensor, b1: cute.Tensor, b2: cute.Tensor, sfa: cute.Tensor,
                                sfb1: cute.Tensor, sfb2: cute.Tensor, a16: cute.Tensor, c: cute.Tensor,
                                stream: cuda.CUstream):
        launch_both(a, b1, b2, sfa, sfb1, sfb2, a16, c, stream, cfg)

    return dual_gemm_sm90_a16_host


@cute.jit
def prepass_host(a: cute.Tensor, sfa: cute.Tensor, a16: cute.Tensor, stream: cuda.CUstream):
    """The pre-pass alone: NVFP4 ``a`` (M, K/2) and ``sfa`` (M, K/16) to FP16 ``a16`` (M, K)."""
    launch_prepass(a, sfa, a16, stream)


def _config(cfg):
    cfg = A16Config() if cfg is None else cfg
    if not isinstance(cfg, A16Config):
        raise TypeError(f"cfg must be an A16Config; got {type(cfg).__name__}")
    return cfg


def _fake_a16(m: int, k: int):
    from ..compile import fake_tensor

    return fake_tensor(Float16, (m, k), stride_order=(1, 0))


def compile_a16(target: str, cfg: A16Config | None, m: int, n: int, k: int):
    """Compile the A16 twin of ``cfg`` (None: the default :class:`A16Config`), pre-pass and main kernel in one host
    function, for an M x N x K problem without a GPU (static shapes). The compiled function takes
    ``(a, b1, b2, sfa, sfb1, sfb2, a16, c, stream)`` (:func:`operands_2d`'s operands, the (M, K) FP16 workspace
    before ``c``). Every argument is checked before the DSL sees it."""
    from ..compile import compile_for, fake_stream

    check_sm90_target(target)
    m, n, k = check_gated_sizes(m, n, k)  # N a multiple of 8 too
    cfg = _config(cfg)
    ops = fake_operands(m, n, k)
    return compile_for(target, a16_host(cfg), *ops[:6], _fake_a16(m, k), ops[6], fake_stream())


def compile_a16_ptrs(target: str, cfg: A16Config | None, m: int, n: int, k: int, out_stride: tuple = None):
    """The A16 twin compiled through TVM-FFI with the inputs and the FP16 A workspace as bare pointers
    (:func:`~gemmlab.kernels.dual_gemm_sm90.compile_with_pointers` with ``workspace``): what the public call's plan
    launches, as ``fn(a, b1, b2, sfa, sfb1, sfb2, a16 workspace pointers, out)``."""
    check_sm90_target(target)
    m, n, k = check_gated_sizes(m, n, k)
    return compile_with_pointers(target, launch_both, _config(cfg), m, n, k, out_stride, workspace=True)


def compile_prepass(target: str, m: int, k: int):
    """Compile the pre-pass alone for M x K without a GPU: ``(a, sfa, a16, stream)``."""
    from ..compile import compile_for, fake_stream

    check_sm90_target(target)
    m, _, k = check_gated_sizes(m, 8, k)
    ops = fake_operands(m, 8, k)
    return compile_for(target, prepass_host, ops[0], ops[3], _fake_a16(m, k), fake_stream())


def gated_dual_gemm_a16(a, b1, b2, sfa, sfb1, sfb2, out=None, cfg: A16Config | None = None):
    """``silu(A B1^T) * (A B2^T)`` in FP16 on an H100/H200 with the A16 twin (arguments as the simple twin's;
    ``cfg`` forced or the default :class:`A16Config`). Checks every argument before anything compiles or launches;
    allocates the (M, K) FP16 A workspace per call and runs the pre-pass and the main kernel on torch's current
    stream. Returns ``out``."""
    return call_with_a_workspace(lambda c: a16_host(_config(c)),
                                 "gemmlab.kernels.dual_gemm_sm90_a16.gated_dual_gemm_a16",
                                 a, b1, b2, sfa, sfb1, sfb2, out, cfg)


def call_with_a_workspace(host_of, name: str, a, b1, b2, sfa, sfb1, sfb2, out, cfg):
    """A twin that runs the pre-pass into an (M, K) FP16 A workspace, called on tensors (the A16 and swap twins):
    every argument checked (``host_of(cfg)`` checks ``cfg`` and returns the ``@cute.jit`` host function) before the
    tier check (``name``: the caller, for its message), then the workspace allocated and one launch through
    :func:`gemmlab.compile.launcher` on torch's current stream. Returns ``out`` (allocated when None)."""
    import torch

    from ..compile import launcher
    from ..tiers import require_tier
    from .dual_gemm_sm90 import check_twin_arguments
    from .dual_gemm_sm90_pipelined import check_compact_out

    m, n, k = check_twin_arguments(a, b1, b2, sfa, sfb1, sfb2, out)
    check_compact_out(out, n)
    host = host_of(cfg)
    require_tier("sm90", name)
    check_devices(a, b1, b2, sfa, sfb1, sfb2, out)
    if out is None:
        out = torch.empty((m, n, 1), dtype=torch.float16, device=a.device)
    a16 = torch.empty((m, k), dtype=torch.float16, device=a.device)
    ops = operands_2d(a, b1, b2, sfa, sfb1, sfb2, out)
    launcher(host, *ops[:6], a16, ops[6])()
    return out


def prepass_a16(a, sfa, out=None):
    """The pre-pass alone on an H100/H200: NVFP4 ``a`` (M, K/2, 1) packed (uint8 or ``float4_e2m1fn_x2``) with its
    e4m3 scales ``sfa`` (M, K/16, 1) to FP16 ``out`` (M, K), row-major (allocated when None); exact. Checks every
    argument before anything compiles or launches. Returns ``out``."""
    import torch

    from .. import nvfp4 as fp4
    from ..checks import check_tensor
    from ..compile import launcher
    from ..tiers import require_tier

    m, _, k, l = fp4.check_operands(a, a, a, sfa, sfa, sfa)  # a as its own B: the checks of A and SFA
    if l != 1:
        raise ValueError(f"L must be 1 (the kernel's batch); got L={l}")
    if out is not None:
        check_tensor("out", out, dtypes=(torch.float16,), ndim=2, device=None)
        if tuple(out.shape) != (m, k):
            raise ValueError(f"out must have shape {(m, k)}; got {tuple(out.shape)}")
    require_tier("sm90", "gemmlab.kernels.dual_gemm_sm90_a16.prepass_a16")
    check_devices(a, a, a, sfa, sfa, sfa, out)
    if out is None:
        out = torch.empty((m, k), dtype=torch.float16, device=a.device)
    launcher(prepass_host, operand_2d(0, a), operand_2d(3, sfa), out)()
    return out
