"""tcgen05 (sm_100a): tensor memory and the fifth-generation tensor core (PTX ISA "TensorCore 5th
Generation Family Instructions": tcgen05.alloc / dealloc / relinquish_alloc_permit, tcgen05.mma
(kind::f16; kind::mxf4nvf4, mxf4 and mxf8f6f4 with block scaling), tcgen05.commit, tcgen05.ld / st / wait, tcgen05.cp,
tcgen05.fence).

What is modelled:

* **Allocation** of TMEM columns per CTA (a power of two from 32 to 512, naturally
  aligned, lowest free range first); the address is written to shared memory. An
  allocation after ``relinquish_alloc_permit``, a dealloc of columns that are not
  allocated, and a CTA that exits with columns still allocated are errors. With
  ``cta_group::2`` one warp of each CTA of the pair performs alloc / dealloc
  collectively: the two instructions meet, and the same columns are allocated in both
  CTAs before either warp goes on.
* **MMA** ``D = A x B (+ D)`` with A and B read from shared memory through their
  descriptors (:mod:`gemmlab.emulator.operands`) when the operation completes. The
  MMAs, copies and commits one thread issues complete in issue order (one unit per
  CTA pair), so ``tcgen05.commit`` arrives on its mbarrier once every earlier
  operation of that thread has completed (the ISA: commit tracks the completion of
  all prior asynchronous tcgen05 operations of the executing thread).
* **Data-path layouts** (:func:`d_layout`): M = 128 with ``cta_group::1`` and M = 256 with
  ``cta_group::2`` (row i of each CTA's half of D in TMEM lane i, column ``col + n``); M = 64
  with ``cta_group::1`` (Layout F: 16 lanes of each lane quarter) and M = 128 with
  ``cta_group::2`` (Layout B: "2x2", the second half of N in lanes 64-127). Block scaling
  with the last two, ``.ws`` and sparsity are refused.
* **Block scaling**: ``kind::mxf4nvf4`` (E2M1, K = 64; 4X/block16 with UE4M3 or UE8M0
  scales, 2X/block32 with UE8M0), ``kind::mxf4`` (E2M1, 2X, UE8M0) and ``kind::mxf8f6f4``
  with E4M3/E5M2 operands (K = 32, 1X, UE8M0; the 6- and 4-bit types of that kind are
  refused). Row ``r`` (of A's M or of B's N) finds its scale bytes in the 32-bit word of
  column ``base + (r // 128) * 4 + (r % 128) // 32``, bytes ``sf_id .. sf_id + per - 1``
  (``per`` = 1, 2 or 4 scales per row, each for K / per values); A's at lane ``r % 128``,
  B's in the lanes of the sub-partition that computes the output row (all four replicas
  hold the same bytes when loaded with ``tcgen05.cp .32x128b.warpx4``). This is the data
  flow chapter 11's CPU model executes; NVIDIA's block-scaled example (NVFP4, MXF8, MXF4)
  runs on it and matches.
* **tcgen05.ld / st** shapes ``.32x32b``, ``.16x64b``, ``.16x128b``, ``.16x256b`` and
  ``.16x32bx2`` (:func:`ldst_map`; no ``.pack::16b`` / ``.unpack::16b``, no ``.red``).
  The registers a ``tcgen05.ld`` writes are usable at once (ptxas honours the register
  dependency); its TMEM read stays open until ``tcgen05.wait::ld``, and an MMA or copy
  that overwrites an open read is reported (see "tcgen05.ld: registers and the TMEM
  read" below).
* **tcgen05.cp** shape ``.32x128b.warpx4`` (32 rows of 16 bytes from a no-swizzle
  descriptor, copied to the same 4 columns of each of the four lane quarters); with
  ``cta_group::2`` into both CTAs of the pair, each from its own shared memory.
"""
from __future__ import annotations

import numpy as np

from ..errors import EmulatorError, MemoryFault, RaceError, TmemError, Unsupported
from ..machine import AsyncOp
from ..memory import TMEM_COLUMNS, TMEM_LANES
from ..operands import read_operand, to_float
from ..ptx import Imm, Sink, Vec
from . import handler, require_converged
from .sync import resolve_mbarrier

SM100_SWIZZLE = {0: 0, 2: 128, 4: 64, 6: 32}  # descriptor bits 61-63 (1 = 128B with 32B atoms: refused)
TMEM_POISON = np.uint32(0x7FC00000)  # a float32 NaN: what freshly allocated columns read as here


def decode_desc(value: int) -> dict:
    """A tcgen05 shared-memory descriptor (PTX ISA "Shared memory descriptor" for tcgen05)."""
    value = int(value)
    version = (value >> 46) & 7
    if version != 1:
        raise EmulatorError(f"tcgen05 shared-memory descriptor 0x{value:016x} has version {version} in bits "
                            "46-48; sm_100 requires 1 (a Hopper-style descriptor?)")
    if (value >> 49) & 7:
        raise Unsupported("a tcgen05 descriptor with a non-zero matrix base offset")
    if (value >> 52) & 1:
        raise Unsupported("a tcgen05 descriptor with the absolute leading-dimension mode")
    code = (value >> 61) & 7
    if code not in SM100_SWIZZLE:
        raise Unsupported(f"tcgen05 descriptor swizzle code {code}")
    return {"start": (value & 0x3FFF) << 4, "lbo": ((value >> 16) & 0x3FFF) << 4,
            "sbo": ((value >> 32) & 0x3FFF) << 4, "swizzle": SM100_SWIZZLE[code]}


def decode_idesc_f16(v: int) -> dict:
    v = int(v)
    if v & 0b111:
        raise Unsupported("a sparse or saturating tcgen05.mma instruction descriptor")
    d_fmt = (v >> 4) & 3
    a_fmt, b_fmt = (v >> 7) & 7, (v >> 10) & 7
    return {"d": {0: "f16", 1: "f32"}.get(d_fmt), "a": {0: "f16", 1: "bf16"}.get(a_fmt),
            "b": {0: "f16", 1: "bf16"}.get(b_fmt), "neg_a": (v >> 13) & 1, "neg_b": (v >> 14) & 1,
            "a_major": "MN" if (v >> 15) & 1 else "K", "b_major": "MN" if (v >> 16) & 1 else "K",
            "n": ((v >> 17) & 0x3F) << 3, "m": ((v >> 24) & 0x1F) << 4, "k": 16, "bits": 16}


#: Block-scaled kinds (PTX ISA 9.7.16.4.2, Tables 43 and 44): K of one MMA (dense), A/B element width,
#: the A/B type codes implemented, and the scale-vector sizes allowed with each scale type (Table 55:
#: mxf8f6f4 1X with UE8M0; mxf4 2X with UE8M0; mxf4nvf4 2X with UE8M0, 4X with UE8M0 or UE4M3).
BLOCK_SCALED = {
    "kind::mxf8f6f4": {"k": 32, "bits": 8, "types": {0: "e4m3", 1: "e5m2"}, "vec": {1: ("ue8m0",)}},
    "kind::mxf4": {"k": 64, "bits": 4, "types": {1: "e2m1"}, "vec": {2: ("ue8m0",)}},
    "kind::mxf4nvf4": {"k": 64, "bits": 4, "types": {1: "e2m1"}, "vec": {2: ("ue8m0",), 4: ("ue8m0", "ue4m3")}},
}


def decode_idesc_block_scaled(v: int, kind: str = "kind::mxf4nvf4") -> dict:
    """The instruction descriptor of a block-scaled ``tcgen05.mma`` (PTX ISA 9.7.16.4.2, Tables 43/44): the
    scale factor data IDs in bits 4-5 (B) and 29-30 (A), the scale type in bit 23 (UE8M0 = 1, UE4M3 = 0),
    M >> 7 in bits 27-28, K = 96 in bit 31 (mxf4 / mxf4nvf4)."""
    v = int(v)
    spec = BLOCK_SCALED[kind]
    if v & 0b111 or (v >> 31) & 1:
        raise Unsupported("a sparse block-scaled instruction descriptor or K = 96")
    a_fmt, b_fmt = (v >> 7) & 7, (v >> 10) & 7
    if a_fmt not in spec["types"] or b_fmt not in spec["types"]:
        raise Unsupported(f"{kind} with A/B type codes {a_fmt}/{b_fmt} (implemented: "
                          f"{', '.join(f'{c} = {t}' for c, t in spec['types'].items())})")
    return {"d": "f32", "a": spec["types"][a_fmt], "b": spec["types"][b_fmt], "neg_a": (v >> 13) & 1,
            "neg_b": (v >> 14) & 1, "a_major": "MN" if (v >> 15) & 1 else "K",
            "b_major": "MN" if (v >> 16) & 1 else "K", "n": ((v >> 17) & 0x3F) << 3, "m": ((v >> 27) & 3) << 7,
            "k": spec["k"], "bits": spec["bits"], "scale_format": "ue8m0" if (v >> 23) & 1 else "ue4m3",
            "a_sf_id": (v >> 29) & 3, "b_sf_id": (v >> 4) & 3}


def decode_scales(codes: np.ndarray, fmt: str) -> np.ndarray:
    """Scale-factor codes -> float32: UE4M3 (E4M3 without the sign) or UE8M0 (2^(code - 127), 0xFF NaN;
    OCP MX formats v1.0, the E8M0 scale)."""
    from ..values import decode_small

    if fmt == "ue4m3":
        return decode_small(codes, "e4m3")
    c = codes.astype(np.int64)
    return np.where(c == 0xFF, np.nan, np.ldexp(1.0, c - 127)).astype(np.float32)


def tmem_fields(addr: int) -> tuple[int, int]:
    return (addr >> 16) & 0xFFFF, addr & 0xFFFF


# ---------------------------------------------------------------------------------------------
# Operations
# ---------------------------------------------------------------------------------------------


class TcOp(AsyncOp):
    done = False

    def complete(self, machine):
        self.run(machine)
        self.done = True


def products(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a @ b.T`` in FP32 (``a``: (m, k), ``b``: (n, k)), without BLAS.

    numpy's ``@`` goes to a multi-threaded OpenBLAS, whose threads spin against each other on a busy
    2-core machine: a 128x64 @ 64x256 product took 32 ms there instead of 0.08 ms single-threaded (and
    torch's ``@`` the same). ``einsum`` without ``optimize`` runs numpy's own single-threaded loop
    (0.5 ms), which keeps an emulated MMA cheap wherever the emulator runs."""
    return np.einsum("mk,nk->mn", a.astype(np.float32, copy=False), b.astype(np.float32, copy=False),
                     optimize=False)


def d_layout(m: int, groups: int, n: int, lane0: int = 0):
    """Where a CTA's share of D lives in its tensor memory: ``(lanes, columns)``, two ``(rows, n)`` integer
    arrays (column offsets from D's column address) for the CTA's ``rows`` rows of D and its ``n`` columns.

    PTX ISA 9.7.16.10.5 ("Data Path Layout Organization") names the layout by M and cta_group; its figures
    are drawn in CUTLASS's ``UMMA::tmem_frg`` atoms (``cute/atom/mma_traits_sm100_frag.hpp``, (M, N) ->
    TMEM address with lane stride 1 and column stride 128), which is what is implemented:

    * Layout D (M = 128, cta_group::1) and Layout A (M = 256, cta_group::2; 128 rows per CTA): row r in
      lane r, column n in column n ("4x1", every lane).
    * Layout F (M = 64, cta_group::1, not .ws): atom ((16, 4), N) : ((1, 32), 128): row r in lane
      32 * (r // 16) + r % 16 -- the first 16 lanes of each lane quarter, or the second 16 when D's
      address names lane 16 (the ISA's "lane alignment 0 or 16"; CUTLASS's Interleaved allocation puts a
      second accumulator there).
    * Layout B (M = 128, cta_group::2, dense; 64 rows per CTA): atom (64, (N/2, 2)) : (1, (128, 64)):
      row r, column n in lane r + 64 * (n // (N/2)), column n % (N/2) ("2x2").
    """
    m_cta = m // groups
    r = np.arange(m_cta)[:, None]
    c = np.arange(n)[None, :]
    if m_cta == 128:
        if lane0:
            raise TmemError(f"tcgen05.mma D address names lane {lane0}; with M = {m} D starts at lane 0")
        return np.broadcast_to(r, (m_cta, n)), np.broadcast_to(c, (m_cta, n))
    if m == 64 and groups == 1:
        if lane0 not in (0, 16):
            raise TmemError(f"tcgen05.mma (M = 64) D address names lane {lane0}; Layout F starts at lane 0 or 16")
        return np.broadcast_to(lane0 + 32 * (r // 16) + r % 16, (m_cta, n)), np.broadcast_to(c, (m_cta, n))
    if m == 128 and groups == 2:
        if lane0:
            raise TmemError(f"tcgen05.mma D address names lane {lane0}; with M = 128 and cta_group::2 D starts at "
                            "lane 0")
        half = n // 2
        return r + 64 * (c // half), np.broadcast_to(c % half, (m_cta, n))
    raise Unsupported(f"the tcgen05 data-path layout of M = {m} with cta_group::{groups} (implemented: "
                      "M = 64 and 128 with cta_group::1, M = 128 and 256 with cta_group::2)")


class Mma(TcOp):
    def __init__(self, unit, ctas, d_lane, d_col, adesc, bdesc, idesc, accumulate, scales, label):
        self.unit = unit
        self.ctas = ctas  # [cta] or [leader, peer]
        self.d_lane, self.d_col, self.adesc, self.bdesc, self.idesc = d_lane, d_col, adesc, bdesc, idesc
        self.accumulate = accumulate
        self.scales = scales  # (sfa column address, sfb column address) or None
        self.label = label

    def run(self, machine):
        i = self.idesc
        m, n, k = i["m"], i["n"], i["k"]
        groups = len(self.ctas)
        m_cta, n_cta = m // groups, n // groups
        lanes, cols = d_layout(m, groups, n, self.d_lane)
        if self.scales is not None and m_cta != 128:
            raise Unsupported(f"block-scaled tcgen05.mma with M = {m} and cta_group::{groups} (its scale-factor "
                              "layout is not implemented; implemented: 128 rows of D per CTA)")
        a_parts, b_parts = [], []
        for cta in self.ctas:
            base = cta.rank << 24
            for desc, rows, fmt, major, parts in ((self.adesc, m_cta, i["a"], i["a_major"], a_parts),
                                                   (self.bdesc, n_cta, i["b"], i["b_major"], b_parts)):
                machine.check_async_read(cta, base | desc["start"], 1, "tcgen05.mma")
                codes = read_operand(cta.smem, base | desc["start"], rows, k, i["bits"], major, desc["lbo"],
                                     desc["sbo"], desc["swizzle"])
                parts.append(to_float(codes, fmt))
        a = np.concatenate(a_parts)  # (m, k): CTA g of a pair holds rows g * m_cta ...
        b = np.concatenate(b_parts)  # (n, k)
        if i["neg_a"]:
            a = -a
        if i["neg_b"]:
            b = -b
        if self.scales is not None:
            a, b_by_quarter = self._scaled(a, b, k)
        ncols = int(cols.max()) + 1
        for g, cta in enumerate(self.ctas):
            rows = slice(g * m_cta, (g + 1) * m_cta)
            if self.scales is not None:
                d = np.empty((128, n), np.float32)
                for q in range(4):
                    d[32 * q:32 * (q + 1)] = products(a[rows][32 * q:32 * (q + 1)], b_by_quarter[g][q])
            else:
                d = products(a[rows], b)
            tm = tmem_of(cta, self.d_col, ncols, "tcgen05.mma (D)")
            written = np.zeros(TMEM_LANES, bool)
            written[lanes.ravel()] = True
            _check_overwrite(machine, cta, written, self.d_col, self.d_col + ncols, self.label)
            acc = tm.view(np.float32)
            at = (lanes, self.d_col + cols)
            if self.accumulate:
                if not cta.tmem_written[at].all():
                    raise TmemError(f"{self.label} accumulates (enable-input-d = 1) into TMEM columns "
                                    f"{self.d_col}..{self.d_col + ncols - 1} of {cta.name} that nothing has written "
                                    "since they were allocated: the first MMA of a tile must overwrite "
                                    "(enable-input-d = 0)")
                acc[at] += d
            else:
                acc[at] = d
                cta.tmem_written[at] = True

    def _scaled(self, a, b, k):
        """Apply block scales read from TMEM, as the module docstring says: ``per`` scale factors per row
        (1X, 2X, 4X), each for ``k // per`` values of K, at byte ``sf_id`` .. ``sf_id + per - 1`` of the row's
        32-bit TMEM word (PTX ISA 9.7.16.10.7.2 / .3, "Scale Factor A ID" / "B ID": the ID is the byte
        offset, the half-word offset 0 or 2 with 2X, and 0 with 4X)."""
        i = self.idesc
        per = self.scales[2]
        vec = k // per
        fmt = i["scale_format"]
        for which, sf_id in (("A", i["a_sf_id"]), ("B", i["b_sf_id"])):
            if sf_id % per or sf_id + per > 4:
                raise EmulatorError(f"scale factor {which} ID {sf_id} with {per} scale factors per row: it must be "
                                    f"a multiple of {per} below 4 (PTX ISA 9.7.16.10.7.2)")
        sfa_col, sfb_col = self.scales[:2]
        out_b = []
        rows = np.arange(128)
        for g, cta in enumerate(self.ctas):
            tm = tmem_of(cta, sfa_col, 4, "tcgen05.mma (scale factors of A)")
            cols = sfa_col + rows // 32
            sa = tm[rows, cols].view(np.uint8).reshape(128, 4)[:, i["a_sf_id"]:i["a_sf_id"] + per]
            a[g * 128:(g + 1) * 128] *= np.repeat(decode_scales(sa, fmt), vec, axis=1)
        n = b.shape[0]
        r = np.arange(n)
        for g, cta in enumerate(self.ctas):
            tm = tmem_of(cta, sfb_col, 4 * (-(-n // 128)), "tcgen05.mma (scale factors of B)")
            quarters = []
            for q in range(4):
                lanes = 32 * q + r % 32
                cols = sfb_col + (r // 128) * 4 + (r % 128) // 32
                sb = tm[lanes, cols].view(np.uint8).reshape(n, 4)[:, i["b_sf_id"]:i["b_sf_id"] + per]
                quarters.append(b * np.repeat(decode_scales(sb, fmt), vec, axis=1))
            out_b.append(quarters)
        return a, out_b


class Commit(TcOp):
    def __init__(self, unit, targets, label):
        self.unit = unit
        self.targets = targets  # [mbarrier]
        self.label = label

    def run(self, machine):
        for mb in self.targets:
            mb.arrive(1, self.label)


class Copy(TcOp):
    """``tcgen05.cp.32x128b.warpx4``: 32 rows x 16 bytes from shared memory to each lane quarter.

    With ``cta_group::2`` the data is copied into the tensor memory of both CTAs of the pair (PTX ISA
    9.7.16.9.2, "tcgen05.cp"): each CTA's own shared memory at the descriptor's offset into its own TMEM
    at ``taddr``, as CUTLASS models it (``Copy_Traits<SM100_UTCCP_4x32dp128bit_2cta>``: ``ThrID`` =
    ``Layout<_2>``, one copy per CTA of the pair with the same source layout and TMEM address, the way
    a 2-CTA MMA reads each CTA's own A and B).
    """

    def __init__(self, unit, ctas, taddr, desc, label):
        self.unit, self.ctas, self.taddr, self.desc, self.label = unit, ctas, taddr, desc, label

    def run(self, machine):
        d = self.desc
        if d["swizzle"]:
            raise Unsupported("tcgen05.cp from a swizzled layout")
        lane, col = tmem_fields(self.taddr)
        if lane != 0:
            raise TmemError(f"tcgen05.cp.32x128b.warpx4 to lane {lane}; it writes lanes 0..127 (lane field 0)")
        for cta in self.ctas:
            base = cta.rank << 24
            machine.check_async_read(cta, base | d["start"], 512, "tcgen05.cp")
            # 32 rows of 16 bytes: the no-swizzle K-major layout of a 32 x 16-byte operand (8-row core
            # matrices at SBO)
            codes = read_operand(cta.smem, base | d["start"], 32, 16, 8, "K", d["lbo"], d["sbo"], 0)
            tm = tmem_of(cta, col, 4, "tcgen05.cp")
            _check_overwrite(machine, cta, np.ones(TMEM_LANES, bool), col, col + 4, self.label)
            words = codes.reshape(32, 4, 4).view(np.uint32).reshape(32, 4)
            for q in range(4):
                tm[32 * q:32 * (q + 1), col:col + 4] = words
            cta.tmem_written[:, col:col + 4] = True


# ---------------------------------------------------------------------------------------------
# tcgen05.ld: registers and the TMEM read
# ---------------------------------------------------------------------------------------------
#
# What the ISA makes asynchronous about ``tcgen05.ld`` is its *read of tensor memory*, not its
# registers. PTX ISA 9.7.16.8.3 ("tcgen05.ld") says the load is performed asynchronously and refers to
# the tcgen05 memory consistency model; unlike ``wgmma.mma_async`` (whose "wgmma.wait_group" section
# says that accessing the accumulator registers before the wait "is undefined behavior") it says nothing that
# makes the destination registers unusable before ``tcgen05.wait::ld``; ptxas honours the register
# dependency (it waits on the load's scoreboard at the first use). CUTLASS relies on it: the C++
# epilogues (``sm100_epilogue_tma_warpspecialized.hpp``) read the registers of every subtile but the
# last without ``fence_view_async_tmem_load()``, and the CuTe DSL's ``utils/gemm/sm100.py``
# ``epilogue_tma_store`` (DSL 4.8.1; NVIDIA's dense_gemm_persistent example) has no ``tcgen05.wait::ld``
# at all. So registers written by ``tcgen05.ld`` are readable at once here.
#
# ``tcgen05.wait::ld`` orders the TMEM read before later TMEM writes: 9.7.16.8.5's example ("Prevents
# subsequent tcgen05.mma from racing ahead of the tcgen05.ld") and the canonical pattern 9.7.16.6.4.4
# (ld; wait::ld; fence::before_thread_sync; mbarrier.arrive -- then the MMA in the other thread).
# The emulator performs the read at issue, so a later overwrite cannot change the values it returns;
# instead each read stays *open* until its warp's ``tcgen05.wait::ld``, and an MMA or ``tcgen05.cp``
# that writes TMEM cells of an open read, or a ``tcgen05.dealloc`` that frees them, is reported: a note
# in the launch report by default
# (``machine.notes``), a :class:`RaceError` when :data:`STRICT_LD_ORDER` is true.
# NVIDIA's DSL epilogues (4.8.1) never wait: the TMA-store one releases the accumulator after its
# registers are converted and stored, the direct-store one right after the last tcgen05.ld (with no
# tcgen05 fence either). They run on B200s, so this is a note by default, not an error.

#: Raise instead of noting a TMEM write or dealloc that overlaps a ``tcgen05.ld`` not yet waited for.
STRICT_LD_ORDER = False


def _open_read(warp, lane0, lane1, col0, col1, line):
    reads = warp.cta.__dict__.setdefault("_tc_ld_open", {}).setdefault(warp.index, [])
    reads[:] = [r for r in reads if not (r[0] >= lane0 and r[1] <= lane1 and r[2] >= col0 and r[3] <= col1)]
    reads.append((lane0, lane1, col0, col1, line))


def _check_overwrite(machine, cta, lanes, col0, col1, writer, verb="writes"):
    """``writer`` writes (or frees) TMEM ``lanes`` (a boolean mask of the 128 lanes), columns ``col0..col1-1``
    of ``cta``."""
    open_reads = cta.__dict__.get("_tc_ld_open")
    if not open_reads:
        return
    for w, reads in list(open_reads.items()):
        hit = [r for r in reads if lanes[r[0]:r[1]].any() and r[2] < col1 and col0 < r[3]]
        if not hit:
            continue
        r = hit[0]
        lo, hi = max(r[0], int(np.flatnonzero(lanes)[0])), min(r[1], int(np.flatnonzero(lanes)[-1]) + 1)
        msg = (f"{writer} {verb} TMEM lanes {lo}..{hi - 1}, columns {max(col0, r[2])}..{min(col1, r[3]) - 1} of "
               f"{cta.name}, which warp {w}'s tcgen05.ld (PTX line {r[4]}) read without a tcgen05.wait::ld since: "
               "the ISA orders that read before a later write or dealloc only with tcgen05.wait::ld, then "
               "tcgen05.fence::before_thread_sync before the thread synchronisation (PTX ISA 9.7.16.6.4.4)")
        if STRICT_LD_ORDER:
            raise RaceError(msg)
        notes = machine.__dict__.setdefault("notes", [])
        seen = machine.__dict__.setdefault("_note_keys", set())
        key = ("tcgen05.ld", r[4], writer.split(" by ")[0])
        if key not in seen:
            seen.add(key)
            notes.append(msg)
        reads[:] = [x for x in reads if x not in hit]


def tmem_of(cta, col: int, ncols: int, what: str) -> np.ndarray:
    """The CTA's TMEM, after checking that columns ``col .. col + ncols`` are allocated."""
    if col < 0 or col + ncols > TMEM_COLUMNS:
        raise MemoryFault(f"{what}: TMEM columns {col}..{col + ncols - 1} are outside 0..{TMEM_COLUMNS - 1}")
    for c0, n in cta.tmem_alloc.items():
        if c0 <= col and col + ncols <= c0 + n:
            return cta.tensor_memory()
    raise TmemError(f"{what}: TMEM columns {col}..{col + ncols - 1} of {cta.name} are not allocated "
                    f"(allocated: {sorted(cta.tmem_alloc.items()) or 'none'}; freed early, or never allocated?)")


# ---------------------------------------------------------------------------------------------
# Handlers
# ---------------------------------------------------------------------------------------------


def _group(ctx) -> int:
    for p in ctx.parts:
        if p.startswith("cta_group::"):
            return int(p.split("::")[1])
    return 1


def _pair(cta, groups: int):
    if groups == 1:
        return [cta]
    ctas = cta.cluster.ctas
    lead = cta.rank & ~1
    if lead + 1 >= len(ctas):
        raise EmulatorError("cta_group::2 in a cluster without a peer CTA (the cluster must pair CTAs)")
    return [ctas[lead], ctas[lead + 1]]


@handler("tcgen05")
def h_tcgen05(ctx):
    op = ctx.parts[1]
    if op.startswith("fence"):
        return lambda warp, mask: None
    if op == "alloc":
        return _alloc(ctx)
    if op == "dealloc":
        return _dealloc(ctx)
    if op == "relinquish_alloc_permit":
        def relinquish(warp, mask):
            require_converged(warp, mask)
            for c in _pair(warp.cta, _group(ctx)) if _group(ctx) == 1 else [warp.cta]:
                c.tmem_relinquished = True
        return relinquish
    if op == "mma":
        return _mma(ctx)
    if op == "commit":
        return _commit(ctx)
    if op in ("ld", "st"):
        return _ldst(ctx, op)
    if op.startswith("wait"):
        kind = op.split("::")[1] if "::" in op else ctx.parts[2].split("::")[-1]

        def wait(warp, mask):
            require_converged(warp, mask)
            if kind == "ld":
                open_reads = warp.cta.__dict__.get("_tc_ld_open")
                if open_reads:
                    open_reads.pop(warp.index, None)
        return wait
    if op == "cp":
        return _cp(ctx)
    ctx.unsupported()


def _pair_collective(warp, mask, kind, payload, complete):
    """``tcgen05.alloc`` / ``dealloc`` with ``cta_group::2``: "one warp from each of the peer CTAs must
    collectively perform the allocation and de-allocation" (PTX ISA 9.7.16.7.1). The n-th such
    instruction of one CTA meets the n-th of its peer; the first warp to get there waits (parked) for
    the other, and the operation takes effect for both CTAs when the second arrives, so neither warp
    goes on before the pair's allocation exists in both tensor memories (a 2-CTA MMA writes both)."""
    cta = warp.cta
    lead = _pair(cta, 2)[0]
    seq = cta.__dict__.setdefault("_tc_pair_seq", {})
    n = seq.get(kind, 0)
    seq[kind] = n + 1
    book = lead.__dict__.setdefault("_tc_pair_ops", {})
    other = book.pop((kind, n), None)
    if other is None:
        entry = {"cta": cta, "payload": payload, "done": False, "warp": warp}
        book[(kind, n)] = entry
        warp.block(mask, lambda: not entry["done"],
                   f"the peer CTA's warp to join tcgen05.{kind}.cta_group::2 (collective over the CTA pair)")
        return
    complete({other["cta"]: other["payload"], cta: payload})
    other["done"] = True
    warp.machine.wake((other["warp"],))


def _alloc_columns(ctas, n):
    """The lowest free, naturally aligned range of ``n`` columns in every CTA of ``ctas``."""
    if n < 32 or n > TMEM_COLUMNS or n & (n - 1):
        raise TmemError(f"tcgen05.alloc of {n} columns: it must be a power of two from 32 to 512")
    used = np.zeros(TMEM_COLUMNS, bool)
    for cta in ctas:
        if cta.tmem_relinquished:
            raise TmemError(f"tcgen05.alloc after {cta.name} relinquished its allocation permit")
        for c0, k in cta.tmem_alloc.items():
            used[c0:c0 + k] = True
    for c0 in range(0, TMEM_COLUMNS, n):
        if not used[c0:c0 + n].any():
            return c0
    raise TmemError(f"tcgen05.alloc of {n} columns: {' and '.join(c.name for c in ctas)} have no free aligned "
                    f"range (allocated: {[sorted(c.tmem_alloc.items()) for c in ctas]}); on a GPU the warp "
                    "would wait forever")


def _alloc(ctx):
    dst, ncols = ctx.inst.operands
    rdst, rn = ctx.addr(dst), ctx.src(ncols, "u32")
    groups = _group(ctx)

    def place(requests):
        """``requests``: {cta: (columns, shared address for the result)}."""
        sizes = {n for n, _ in requests.values()}
        if len(sizes) != 1:
            raise TmemError(f"tcgen05.alloc.cta_group::2 with different column counts in the two CTAs ({sizes})")
        n = sizes.pop()
        c0 = _alloc_columns(list(requests), n)
        for cta, (_, where) in requests.items():
            cta.tmem_alloc[c0] = n
            # fresh columns hold whatever the last owner left: poison them (NaN) and remember nothing wrote them
            cta.tensor_memory()[:, c0:c0 + n] = TMEM_POISON
            cta.tmem_written[:, c0:c0 + n] = False
            cta.smem.write(where, np.frombuffer(np.uint32(c0).tobytes(), np.uint8))

    def alloc(warp, mask):
        require_converged(warp, mask)
        lane0 = int(np.flatnonzero(mask)[0])
        request = (int(rn(warp)[lane0]), int(rdst(warp)[lane0]))
        if groups == 1:
            place({warp.cta: request})
        else:
            _pair_collective(warp, mask, "alloc", request, place)
    return alloc


def _dealloc(ctx):
    taddr, ncols = ctx.inst.operands
    rt, rn = ctx.src(taddr, "b32"), ctx.src(ncols, "u32")
    groups = _group(ctx)

    def check(cta, col, n):
        if cta.tmem_alloc.get(col) != n:
            raise TmemError(f"tcgen05.dealloc of {n} columns at column {col}: that is not an allocation of "
                            f"{cta.name} (allocated: {sorted(cta.tmem_alloc.items()) or 'none'})")
        pending = [op for op in cta.machine.pending if isinstance(op, Mma) and cta in op.ctas]
        if pending:
            raise TmemError(f"tcgen05.dealloc while {pending[0].label} has not completed: its accumulator would "
                            "land in freed tensor memory (wait for its tcgen05.commit first)")

    def free(requests):
        for cta, (col, n) in requests.items():
            check(cta, col, n)
        for cta, (col, n) in requests.items():
            _check_overwrite(cta.machine, cta, np.ones(TMEM_LANES, bool), col, col + n,
                             f"tcgen05.dealloc of {cta.name}", verb="frees")
            del cta.tmem_alloc[col]

    def dealloc(warp, mask):
        require_converged(warp, mask)
        lane0 = int(np.flatnonzero(mask)[0])
        lane, col = tmem_fields(int(rt(warp)[lane0]))
        request = (col, int(rn(warp)[lane0]))
        check(warp.cta, *request)
        if groups == 1:
            free({warp.cta: request})
        else:
            _pair_collective(warp, mask, "dealloc", request, free)
    return dealloc


def _mma(ctx):
    parts = ctx.parts
    groups = _group(ctx)
    per = None
    kind = next((p for p in parts if p.startswith("kind::")), None)
    scaled = "block_scale" in parts
    if kind == "kind::f16" and not scaled:
        decode = decode_idesc_f16
    elif kind in BLOCK_SCALED and scaled:
        # scale factors per row of one MMA: .scale_vec::NX, or .block16 (4X) / .block32 (1X for mxf8f6f4,
        # else 2X) -- PTX ISA 9.7.16.10.7.1, Table 54
        vec = next((p for p in parts if p.startswith("scale_vec::")), None)
        if vec:
            per = {"scale_vec::1X": 1, "scale_vec::2X": 2, "scale_vec::4X": 4}.get(vec)
        elif "block16" in parts:
            per = 4
        elif "block32" in parts:
            per = 1 if kind == "kind::mxf8f6f4" else 2
        else:
            per = None
        if per not in BLOCK_SCALED[kind]["vec"]:
            ctx.unsupported(f"the scale vector size ({vec or 'none'}) of")

        def decode(v, kind=kind, per=per):
            i = decode_idesc_block_scaled(v, kind)
            if i["scale_format"] not in BLOCK_SCALED[kind]["vec"][per]:
                raise Unsupported(f"{kind} with {per} scale factors per row and {i['scale_format']} scales "
                                  "(not a valid combination, PTX ISA Table 55)")
            return i
    else:
        ctx.unsupported()
    if "ws" in parts or any(p.startswith("ashift") for p in parts):
        ctx.unsupported()
    ops = list(ctx.inst.operands)
    rd = ctx.addr(ops[0]) if not isinstance(ops[0], Imm) else None
    if isinstance(ops[1], type(ops[0])) and hasattr(ops[1], "coords") and not isinstance(ops[1], Vec):
        ctx.unsupported("A from tensor memory in")
    ra, rb = ctx.src(ops[1], "b64"), ctx.src(ops[2], "b64")
    ridesc = ctx.src(ops[3], "b32")
    rest = ops[4:]
    rsfa = rsfb = None
    if scaled:
        rsfa, rsfb = ctx.addr(rest[0]), ctx.addr(rest[1])
        rest = rest[2:]
    if rest and isinstance(rest[0], Vec):  # disable-output-lane mask
        rdis = ctx.vec_src(rest[0], "b32")
        rest = rest[1:]
    else:
        rdis = None
    racc = ctx.src(rest[0], "pred") if rest else None
    if len(rest) > 1:
        ctx.unsupported("scale-input-d in")

    def issue(warp, mask):
        cta = warp.cta
        ctas = _pair(cta, groups)
        if groups == 2 and cta is not ctas[0]:
            raise EmulatorError("tcgen05.mma.cta_group::2 must be issued by the even CTA of the pair")
        for i in np.flatnonzero(mask):
            if rdis is not None and any(int(x[i]) for x in rdis(warp)):
                raise Unsupported("tcgen05.mma with disabled output lanes")
            lane, col = tmem_fields(int(rd(warp)[i]))
            idesc = decode(int(ridesc(warp)[i]))
            d_layout(idesc["m"], groups, idesc["n"], lane)  # refuses an unknown layout or D lane at issue
            scales = None
            if scaled:
                scales = (tmem_fields(int(rsfa(warp)[i]))[1], tmem_fields(int(rsfb(warp)[i]))[1], per)
            acc = bool(racc(warp)[i]) if racc is not None else True
            op = Mma(("tcgen05", ctas[0]), ctas, lane, col, decode_desc(int(ra(warp)[i])), decode_desc(int(rb(warp)[i])),
                     idesc, acc, scales,
                     f"tcgen05.mma m{idesc['m']}n{idesc['n']}k{idesc['k']} by {warp.name} lane {i}")
            warp.machine.issue(op)
    return issue


def _commit(ctx):
    parts = ctx.parts
    groups = _group(ctx)
    multicast = "multicast::cluster" in parts
    if "mbarrier::arrive::one" not in parts:
        ctx.unsupported()
    ops = ctx.inst.operands
    rbar = ctx.addr(ops[0])
    rmask = ctx.src(ops[1], "u16") if multicast else None
    space = "shared::cluster" if "shared::cluster" in parts else "shared"

    def commit(warp, mask):
        cta = warp.cta
        ctas = _pair(cta, groups)
        for i in np.flatnonzero(mask):
            bar = int(rbar(warp)[i])
            if multicast:
                cmask = int(rmask(warp)[i])
                targets = [c.mbarrier((c.rank << 24) | (bar & 0xFFFFFF), warp.where())
                           for c in cta.cluster.ctas if cmask >> c.rank & 1]
            else:
                targets = [resolve_mbarrier(warp, bar, space, warp.where())]
            warp.machine.issue(Commit(("tcgen05", ctas[0]), targets, f"tcgen05.commit by {warp.name} lane {i}"))
    return commit


#: Registers per ``.x1`` of each ``tcgen05.ld`` / ``st`` shape (PTX ISA 9.7.16.8.3, Table 49).
LDST_REGS = {"32x32b": 1, "16x64b": 1, "16x128b": 2, "16x256b": 4, "16x32bx2": 1}


def ldst_map(shape: str, num: int, half_offset: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``(lanes, columns)``: two ``(32, registers)`` arrays, the TMEM lane and column (offsets from the
    instruction's address) of register ``j`` of thread ``t`` for ``tcgen05.ld`` / ``st`` of ``shape`` ``.x{num}``.

    PTX ISA 9.7.16.2.3.1 ("Matrix fragments for shape ...") draws these as figures; the mappings here are
    CUTLASS's ``Copy_Traits<SM100_TMEM_LOAD_*>`` (``cute/atom/copy_traits_sm100.hpp``) read back from
    their ``DstLayout`` (thread, value bit) -> logical bit and ``ValID`` (bit of a lane row, lane):

    * ``.32x32b``: thread t, register j -> lane t, column j.
    * ``.16x64b`` (``((2,2,8),(32,n)) : ((512n,32,64n),(1,64))``): lane 8 * (t % 2) + t // 4,
      column 2 * j + (t // 2) % 2.
    * ``.16x128b`` (``((4,8),(32,2,n)) : ((32,128n),(1,1024n,128))``): register 2i + h -> lane t // 4 + 8h,
      column 4i + t % 4.
    * ``.16x256b`` (``((4,8),(64,2,n)) : ((64,256n),(1,2048n,256))``): register 4i + 2h + c -> lane
      t // 4 + 8h, column 8i + 2 * (t % 4) + c (the MMA accumulator fragment of mma.sync, per lane pair).
    * ``.16x32bx2``: two ``.16x32b`` accesses, the second ``immHalfSplitoff`` columns on: thread t,
      register j -> lane t % 16, column (t // 16) * immHalfSplitoff + j (CUTLASS passes
      immHalfSplitoff = num; its ``.x2`` DstLayout ``((16,2),64) : ((128,64),1)`` over 4 columns is lane
      t % 16, column 2 * (t // 16) + j).
    """
    t = np.arange(32)[:, None]
    if shape == "32x32b":
        j = np.arange(num)[None, :]
        return np.broadcast_to(t, (32, num)), np.broadcast_to(j, (32, num))
    if shape == "16x64b":
        j = np.arange(num)[None, :]
        return np.broadcast_to(8 * (t % 2) + t // 4, (32, num)), 2 * j + (t // 2) % 2
    if shape == "16x128b":
        j = np.arange(2 * num)[None, :]
        i, h = j // 2, j % 2
        return t // 4 + 8 * h, 4 * i + t % 4
    if shape == "16x256b":
        j = np.arange(4 * num)[None, :]
        i, h, c = j // 4, (j // 2) % 2, j % 2
        return t // 4 + 8 * h, 8 * i + 2 * (t % 4) + c
    if shape == "16x32bx2":
        j = np.arange(num)[None, :]
        return np.broadcast_to(t % 16, (32, num)), (t // 16) * half_offset + j
    raise Unsupported(f"tcgen05.ld/st shape .{shape}")


def _ldst(ctx, op):
    parts = ctx.parts
    shape = next((p for p in parts if "x" in p and p[0].isdigit()), "")
    if shape not in LDST_REGS or "pack::16b" in parts or "unpack::16b" in parts or "red" in parts:
        ctx.unsupported(f"shape .{shape} (implemented: {', '.join('.' + s for s in LDST_REGS)}; no pack/unpack, "
                        "no .red) of")
    num = int(next(p for p in parts if p.startswith("x") and p[1:].isdigit())[1:])
    ops = list(ctx.inst.operands)
    if op == "ld":
        regs, taddr, rest = ops[0], ops[1], ops[2:]
    else:
        taddr, regs, rest = ops[0], ops[-1], ops[1:-1]
    half = 0
    if shape == "16x32bx2":
        if len(rest) != 1 or not isinstance(rest[0], Imm):
            ctx.unsupported("a .16x32bx2 without its immediate immHalfSplitoff in")
        half = int(rest[0].value)
    elif rest:
        ctx.unsupported()
    items = regs.items if isinstance(regs, Vec) else (regs,)
    nregs = LDST_REGS[shape] * num
    if len(items) != nregs:
        ctx.unsupported(f"{len(items)} registers for .{shape}.x{num} (it takes {nregs}) in")
    lanes, cols = ldst_map(shape, num, half)
    nlanes = int(lanes.max()) + 1
    ncols = int(cols.max()) + 1
    rt = ctx.addr(taddr)
    line = ctx.inst.line
    if op == "ld":
        writers = [ctx.dst(r, "b32") for r in items]
    else:
        readers = [ctx.src(r, "b32") for r in items]

    def run(warp, mask):
        require_converged(warp, mask)
        cta = warp.cta
        lane, col = tmem_fields(int(rt(warp)[int(np.flatnonzero(mask)[0])]))
        quarter = warp.index % 4
        if not (32 * quarter <= lane and lane + nlanes <= 32 * quarter + 32):
            raise TmemError(f"tcgen05.{op}.{shape} by warp {warp.index} at TMEM lane {lane} (lanes {lane}.."
                            f"{lane + nlanes - 1}): warp {warp.index} may access lanes {32 * quarter}.."
                            f"{32 * quarter + 31} only (warp index mod 4)")
        tm = tmem_of(cta, col, ncols, f"tcgen05.{op}")
        at_l, at_c = lane + lanes, col + cols
        if op == "ld":
            for j, w in enumerate(writers):
                w(warp, mask, tm[at_l[:, j], at_c[:, j]])
            _open_read(warp, lane, lane + nlanes, col, col + ncols, line)
        else:
            for j, r in enumerate(readers):
                v = r(warp)
                tm[at_l[mask, j], at_c[mask, j]] = v[mask]
                cta.tmem_written[at_l[mask, j], at_c[mask, j]] = True
    return run


def _cp(ctx):
    parts = ctx.parts
    if "32x128b" not in parts or "warpx4" not in parts:
        ctx.unsupported("a shape other than .32x128b.warpx4 of")
    if any(p.startswith("b8x16") or p.startswith("b6x16") or p.startswith("b4x16") for p in parts):
        ctx.unsupported("decompressing")
    taddr, sdesc = ctx.inst.operands
    rt, rd = ctx.addr(taddr), ctx.src(sdesc, "b64")
    groups = _group(ctx)

    def cp(warp, mask):
        cta = warp.cta
        ctas = _pair(cta, groups)
        for i in np.flatnonzero(mask):
            warp.machine.issue(Copy(("tcgen05", ctas[0]), ctas, int(rt(warp)[i]), decode_desc(int(rd(warp)[i])),
                                    f"tcgen05.cp by {warp.name} lane {i}"))
    return cp
