"""What a compiled GEMM kernel is: one frozen, validated dataclass per architecture.

Both configs follow one style: every field is checked in ``__post_init__`` (a
``ValueError`` naming the field and the rule), byte sizes come from the dtypes'
bit widths (:data:`gemmlab.family.problem.DTYPE_BITS`: 16 for BF16/FP16, 4 for
the FP4 of chapter 11), and shared memory is checked against
:data:`gemmlab.hardware.SMEM_PER_BLOCK`. A config says nothing about M, N or K:
one compiled kernel serves every problem size (the sm90 kernel takes sizes at
run time; chapter 10's sm100 kernel is still compiled per shape).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from ..checks import check_choice, check_int
from ..hardware import SMEM_PER_BLOCK
from .problem import DTYPE_BITS, IN_DTYPES, OUT_DTYPES

RASTERS = ("m", "n")
#: Bytes per 128B-swizzled row: a k-block holds this many bytes of K per operand row.
SWIZZLE_ROW_BYTES = 128
#: Shared memory kept for mbarriers and alignment slack in every sm90 CTA.
SM90_SMEM_SLACK = 1024


def _bytes(elements: int, dtype: str) -> int:
    return elements * DTYPE_BITS[dtype] // 8


# --------------------------------------------------------------------------------------
# Hopper (chapter 07): gemmlab.kernels.gemm_sm90
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Sm90Config:
    """One variant of the persistent Hopper kernel, and how a problem is mapped onto it.

    The kernel computes ``C' = A' @ B'^T`` over an ``M' x N'`` grid of tiles
    (kernel coordinates). ``swap_ab=False``: ``A' = a``, ``B'^T = b``, ``C' = c``.
    ``swap_ab=True``: ``A' = b^T`` (the weight), ``B' = a``, ``C' = c^T``: a
    small M becomes WGMMA's N (any multiple of 8 up to 256), so a decode batch of
    64 rows costs a 64-wide tile instead of a 128-row one that is half padding.

    ``tile_m``: 64 (one consumer warpgroup) or 128 (two). ``tile_n``: WGMMA's N,
    a multiple of 16 from 16 to 256. ``tile_k``: one 128-byte swizzle row of the
    input dtype. ``stages``: depth of the A/B ring. ``cluster``: ``(2, 1)`` pairs
    two CTAs along M' (B' is multicast), ``(1, 2)`` along N' (A' is multicast).
    ``raster``/``group``: the tile order (:mod:`gemmlab.scheduler`). ``epi_n`` x
    ``epi_stages``: each consumer warpgroup's ring of 64 x ``epi_n`` output
    sub-tiles for the TMA store. ``splits``: K is cut into this many slices, each
    a separate work unit writing FP32 partial sums to a workspace that a second
    kernel reduces (split-K; 1 = off).
    """

    tile_m: int = 128
    tile_n: int = 256
    tile_k: int = 64
    stages: int = 4
    cluster: tuple = (2, 1)
    raster: str = "m"
    group: int = 8
    epi_n: int = 32
    epi_stages: int = 4
    swap_ab: bool = False
    splits: int = 1
    dtype: str = "bfloat16"
    out_dtype: str = "bfloat16"

    def __post_init__(self):
        check_choice("dtype", self.dtype, IN_DTYPES)
        check_choice("out_dtype", self.out_dtype, OUT_DTYPES)
        check_choice("tile_m", self.tile_m, (64, 128))
        check_int("tile_n", self.tile_n, lo=16, hi=256, multiple_of=16)
        row = SWIZZLE_ROW_BYTES * 8 // DTYPE_BITS[self.dtype]
        if self.tile_k != row:
            raise ValueError(f"tile_k must be {row} for {self.dtype} (one 128-byte swizzle row); got {self.tile_k}")
        check_int("stages", self.stages, lo=2, hi=16)
        check_choice("cluster", tuple(self.cluster), ((1, 1), (2, 1), (1, 2)))
        check_choice("raster", self.raster, RASTERS)
        check_int("group", self.group, lo=1)
        check_choice("epi_n", self.epi_n, (16, 32, 64))
        check_int("epi_stages", self.epi_stages, lo=1, hi=8)
        check_choice("swap_ab", self.swap_ab, (False, True))
        check_int("splits", self.splits, lo=1, hi=64)
        if self.tile_n % self.epi_n:
            raise ValueError(f"epi_n must divide tile_n={self.tile_n}; got epi_n={self.epi_n}")
        if self.smem_bytes() > SMEM_PER_BLOCK:
            raise ValueError(f"stages={self.stages} with a {self.tile_m} x {self.tile_n} tile needs "
                             f"{self.smem_bytes()} bytes of shared memory; a CTA may use {SMEM_PER_BLOCK}")

    # ---- the CTA
    @property
    def consumers(self) -> int:
        """Consumer warpgroups: one per 64 rows of the tile (WGMMA's M is 64)."""
        return self.tile_m // 64

    @property
    def threads(self) -> int:
        return 128 * (1 + self.consumers)

    @property
    def cluster_size(self) -> int:
        return self.cluster[0] * self.cluster[1]

    @property
    def split_k(self) -> bool:
        return self.splits > 1

    @property
    def epi_ring_aligned(self) -> bool:
        """Whether each tile's sub-tiles fill the epilogue ring a whole number of times.

        Then sub-tile ``e`` always uses buffer ``e % epi_stages`` and the last
        stores of a tile may still be in flight when the next tile's epilogue
        starts. Otherwise the epilogue drains its stores at the end of each tile.
        """
        return (self.tile_n // self.epi_n) % self.epi_stages == 0

    # ---- sizes
    def stage_bytes(self) -> int:
        """Bytes one ring stage holds: an A' block (tile_m x tile_k) and a B' block (tile_n x tile_k)."""
        return _bytes((self.tile_m + self.tile_n) * self.tile_k, self.dtype)

    def epi_bytes(self) -> int:
        """The output sub-tile rings (none with split-K: partial sums go straight to the workspace)."""
        if self.split_k:
            return 0
        return self.consumers * self.epi_stages * _bytes(64 * self.epi_n, self.out_dtype)

    def smem_bytes(self) -> int:
        """Shared memory per CTA: the A/B ring, the output rings, the mbarriers and alignment slack."""
        return self.stages * self.stage_bytes() + self.epi_bytes() + 2 * self.stages * 8 + SM90_SMEM_SLACK

    # ---- the problem in kernel coordinates
    def kernel_mn(self, m: int, n: int) -> tuple[int, int]:
        """``(M', N')``: the kernel's rows and columns for a user problem of M x N."""
        return (n, m) if self.swap_ab else (m, n)

    def tiles(self, m: int, n: int) -> tuple[int, int]:
        """CTA tiles along M' and N' for a user problem of M x N (partial tiles count)."""
        mk, nk = self.kernel_mn(m, n)
        return -(-mk // self.tile_m), -(-nk // self.tile_n)

    def cluster_tiles(self, m: int, n: int) -> tuple[int, int]:
        mt, nt = self.tiles(m, n)
        return -(-mt // self.cluster[0]), -(-nt // self.cluster[1])

    def units(self, m: int, n: int) -> int:
        """Work units a CTA cluster takes one at a time: cluster tiles x K slices."""
        cm, cn = self.cluster_tiles(m, n)
        return cm * cn * self.splits

    @property
    def kernel_key(self) -> "Sm90Config":
        """The part of the config the compiled code depends on: the number of splits is a run-time value."""
        return replace(self, splits=min(self.splits, 2))

    @property
    def name(self) -> str:
        """A short name: ``128x256 c2x1 m8 s4`` (+ `` swap`` / `` split5``)."""
        return (f"{self.tile_m}x{self.tile_n} c{self.cluster[0]}x{self.cluster[1]} {self.raster}{self.group} "
                f"s{self.stages}" + (" swap" if self.swap_ab else "") + (f" split{self.splits}" if self.split_k else ""))


def split_ranges(k_tiles: int, splits: int) -> list[tuple[int, int]]:
    """``(first k-block, count)`` of every K slice, as the sm90 kernel computes them.

    Slices are ``ceil(k_tiles / splits)`` k-blocks long and the last takes what is
    left, so every slice is non-empty only if ``splits`` is :func:`effective_splits`.
    """
    check_int("k_tiles", k_tiles, lo=1)
    check_int("splits", splits, lo=1)
    per = -(-k_tiles // splits)
    return [(s * per, min(per, k_tiles - s * per)) for s in range(splits)]


def effective_splits(k_tiles: int, splits: int) -> int:
    """The largest slice count <= ``splits`` that leaves no slice empty (and no more slices than k-blocks)."""
    check_int("k_tiles", k_tiles, lo=1)
    check_int("splits", splits, lo=1)
    per = -(-k_tiles // min(splits, k_tiles))
    return -(-k_tiles // per)


# --------------------------------------------------------------------------------------
# Blackwell (chapter 10): gemmlab.kernels.gemm_sm100
# --------------------------------------------------------------------------------------

PAIR_M = 256  # rows of C per CTA pair (one 2-CTA MMA tile)
CTA_M = 128  # rows of C (and of A) per CTA
BLOCK_K = 64  # K per pipeline stage: 64 bf16 = 128 bytes, one 128B-swizzle row
MMA_K = 16  # K of one tcgen05.mma.kind::f16 instruction
ACC_STAGES = 2  # TMEM-C stages: epilogue of tile i overlaps the main loop of tile i + 1
C_STAGES = 2  # SMEM-C staging buffers for TMA stores
BLOCK_N_CHOICES = (256, 128)  # N of the pair's tile (each CTA loads half of it from B)
TMEM_COLUMNS = 512  # TMEM per SM: 128 lanes x 512 columns of 32 bits
BARRIER_RESERVE = 1024  # bytes kept for mbarriers and the TMEM address (rounded up)
B200_SMS = 148


@dataclass(frozen=True)
class Sm100Config:
    """One compiled variant of chapter 10's kernel.

    ``block_n``: N of the pair's tile (256 or 128); ``ab_stages``: depth of the
    SMEM-AB ring; ``epi_n``: columns per TMA store (the SMEM-C buffer is
    ``128 x epi_n``); ``num_sms``: the persistent grid is ``num_sms // 2`` clusters.
    """

    block_n: int = 256
    ab_stages: int = 6
    epi_n: int = 32
    num_sms: int = B200_SMS
    dtype: str = "bfloat16"  # of A, B and C
    b_major: str = "k"  # "k": B is N x K (K contiguous); "n": B is K x N (N contiguous)

    def __post_init__(self):
        check_choice("block_n", self.block_n, BLOCK_N_CHOICES)
        check_int("ab_stages", self.ab_stages, lo=1)
        check_choice("epi_n", self.epi_n, (16, 32, 64))
        check_int("num_sms", self.num_sms, lo=2)
        check_choice("dtype", self.dtype, IN_DTYPES)
        check_choice("b_major", self.b_major, ("k", "n"))

    def check_fits(self) -> "Sm100Config":
        """Reject a configuration that cannot run: >= 2 stages, SMEM <= 227 KiB, TMEM <= 512 columns."""
        check_int("ab_stages", self.ab_stages, lo=2)
        if self.smem_bytes > SMEM_PER_BLOCK:
            raise ValueError(f"configuration needs {self.smem_bytes} bytes of shared memory per CTA; "
                             f"sm_100 allows {SMEM_PER_BLOCK}")
        if self.tmem_columns > TMEM_COLUMNS:
            raise ValueError(f"configuration needs {self.tmem_columns} TMEM columns; an SM has {TMEM_COLUMNS}")
        return self

    @property
    def elem_bytes(self) -> float:
        return DTYPE_BITS[self.dtype] / 8

    @property
    def a_stage_bytes(self) -> int:
        """One CTA's A k-block: 128 rows x 64 K."""
        return _bytes(CTA_M * BLOCK_K, self.dtype)

    @property
    def b_stage_bytes(self) -> int:
        """One CTA's half of B's k-block: ``block_n / 2`` rows x 64 K."""
        return _bytes(self.block_n // 2 * BLOCK_K, self.dtype)

    @property
    def stage_bytes(self) -> int:
        return self.a_stage_bytes + self.b_stage_bytes

    @property
    def tx_bytes(self) -> int:
        """Bytes the leader's ``ab_full`` barrier waits for: both CTAs' loads."""
        return 2 * self.stage_bytes

    @property
    def c_stage_bytes(self) -> int:
        return _bytes(CTA_M * self.epi_n, self.dtype)

    @property
    def smem_bytes(self) -> int:
        """Shared memory per CTA: barriers + A/B ring + C staging, each 1024-aligned."""
        return BARRIER_RESERVE + self.ab_stages * self.stage_bytes + C_STAGES * self.c_stage_bytes

    @property
    def tmem_columns(self) -> int:
        """TMEM per CTA: ``ACC_STAGES`` fp32 accumulators of 128 lanes x ``block_n`` columns."""
        return ACC_STAGES * self.block_n

    @property
    def num_clusters(self) -> int:
        return self.num_sms // 2


def max_ab_stages(block_n: int, epi_n: int = 32, dtype: str = "bfloat16") -> int:
    """The deepest SMEM-AB ring that fits next to the barriers and the C staging."""
    probe = Sm100Config(block_n=block_n, ab_stages=1, epi_n=epi_n, dtype=dtype)
    return (SMEM_PER_BLOCK - probe.smem_bytes + probe.stage_bytes) // probe.stage_bytes
