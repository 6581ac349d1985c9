"""What a compiled GEMM kernel is: one frozen, validated dataclass per kernel of the family.

* Dense (chapters 07, 10): :class:`Sm90Config`, :class:`Sm100Config`.
* Grouped (chapter 08): the Hopper kernel's tiles are :class:`Sm90Config` too; the ones its
  heuristic picks from are named here (:data:`SMALL` ... :data:`LARGE_C2`).
* Gated NVFP4 (chapter 11): :class:`DualSm90Config` (the simple Hopper twin), :class:`PipelinedConfig`
  (the fast one) and :class:`DualSm100Config` with its shared- and tensor-memory :func:`budget`.

Every config follows one style: every field is checked in ``__post_init__`` (a
``ValueError`` naming the field and the rule), byte sizes come from the dtypes'
bit widths (:data:`gemmlab.family.problem.DTYPE_BITS`: 16 for BF16/FP16, 4 for
the FP4 of chapter 11), and shared memory is checked against
:data:`gemmlab.hardware.SMEM_PER_BLOCK`. The dense and grouped configs say nothing
about M, N or K: one compiled kernel serves every problem size (the sm90 kernels take
sizes at run time; chapters 10 and 11's kernels are still compiled per shape).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from .. import nvfp4 as fp4
from ..checks import check_choice, check_int
from ..hardware import B200, SMEM_PER_BLOCK, TMEM_COLUMNS
from .problem import DTYPE_BITS, IN_DTYPES, OUT_DTYPES

RASTERS = ("m", "n")
#: Bytes per 128B-swizzled row: a k-block holds this many bytes of K per operand row.
SWIZZLE_ROW_BYTES = 128
#: The widest tile of three consumer warpgroups (``tile_m = 192``): 128 x 40 + 384 x 152 registers fill the SM's 64 K,
#: and a 64 x 192 FP32 accumulator takes 96 of a consumer thread's 152.
MAX_TILE_N_192 = 192
#: The widest tile one consumer warpgroup holds whole (``wg_rows = 128``): its FP32 accumulator takes ``tile_n`` of a
#: thread's 232 registers.
MAX_TILE_N_WG128 = 192
#: Shared memory kept for mbarriers and alignment slack in every sm90 CTA.
SM90_SMEM_SLACK = 1024
#: Clusters a 132-SM GH100 runs at once, one CTA per SM, keyed by (SMs, CTAs per cluster): a cluster's CTAs must
#: share a GPC, so SMs left over in a GPC stay idle: 30 clusters of 4 and 15 of 8, 120 SMs either way (66 pairs use
#: all 132). Measured on an H200 with ``cudaOccupancyMaxActiveClusters`` (2026-12-02, 256 to 512 threads, 200 KiB of
#: shared memory a CTA: ``results/nvidia-h200/cluster_occupancy.txt``); the H100 SXM5 has the same 132-SM
#: configuration but was not measured. A size not here is taken to fit ``SMs // size`` times.
ACTIVE_CLUSTERS: dict[tuple[int, int], int] = {(132, 4): 30, (132, 8): 15}
#: The dense kernel's clusters ``(CM, CN)``: CM CTAs along M' share each B' panel, CN along N' each A' panel (TMA
#: multicast). At most 8 CTAs, the portable cluster size (CUDA programming guide, "Thread Block Clusters").
SM90_CLUSTERS = ((1, 1), (2, 1), (1, 2), (2, 2), (4, 1), (1, 4), (4, 2), (2, 4))


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

    ``tile_m``: 64 (one consumer warpgroup), 128 (two) or 192 (three, ``tile_n`` at most
    :data:`MAX_TILE_N_192`: they share the register file). ``tile_n``: WGMMA's N,
    a multiple of 16 from 16 to 256, or with ``swap_ab`` of 8 (a token tile: 200 tokens are a 200-wide tile, not a
    208-wide one, as cuBLAS cuts them). ``tile_k``: one 128-byte swizzle row of the
    input dtype. ``stages``: depth of the A/B ring. ``cluster``: ``(2, 1)`` pairs
    two CTAs along M' (B' is multicast), ``(1, 2)`` along N' (A' is multicast); ``(CM, CN)`` of
    :data:`SM90_CLUSTERS` in general, CM CTAs along M' sharing each B' panel and CN along N' each A' panel (beyond
    pairs, the tiles must cut into whole 8-row atoms: ``tile_m`` a multiple of ``8 CN``, ``tile_n`` of ``8 CM``).
    ``raster``/``group``: the tile order (:mod:`gemmlab.scheduler`). ``epi_n`` x
    ``epi_stages``: each consumer warpgroup's ring of 64 x ``epi_n`` output
    sub-tiles for the TMA store (16, 32 or 64 columns; with ``swap_ab`` any multiple of 8 up to 64 that divides
    ``tile_n``: a sub-tile not a multiple of 16 wide is written by two-matrix ``stmatrix``). ``splits``: K is cut
    into this many slices, each a separate work unit writing its FP32 partial tile to a workspace; the tile's
    last unit adds them up and stores C, in the same launch (split-K; 1 = off;
    :mod:`gemmlab.splitk`). On a grid with more tiles than the persistent grid has
    clusters, only the tiles of the partial last wave are split; the whole waves
    run whole tiles (:func:`hybrid_tiles`). ``wg_rows``: the rows each consumer warpgroup owns, 64 (one WGMMA's M)
    or, for a 128-row tile at most :data:`MAX_TILE_N_WG128` wide, 128 (one warpgroup issuing both halves' WGMMAs
    into two accumulators). ``pingpong`` (with ``wg_rows = 128``, no split-K): two such warpgroups take the CTA's
    tiles in turn, one storing while the other computes.
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
    gated: bool = False
    wg_rows: int = 64
    pingpong: bool = False

    def __post_init__(self):
        # Every field is stored as the checked Python value (numpy ints become ints; 128.0 is refused).
        def put(name, value):
            object.__setattr__(self, name, value)

        check_choice("dtype", self.dtype, IN_DTYPES)
        check_choice("out_dtype", self.out_dtype, OUT_DTYPES)
        put("tile_m", check_choice("tile_m", self.tile_m, (64, 128, 192)))
        put("tile_n", check_int("tile_n", self.tile_n, lo=16, hi=256, multiple_of=8))
        row = SWIZZLE_ROW_BYTES * 8 // DTYPE_BITS[self.dtype]
        put("tile_k", check_int("tile_k", self.tile_k))
        if self.tile_k != row:
            raise ValueError(f"tile_k must be {row} for {self.dtype} (one 128-byte swizzle row); got {self.tile_k}")
        put("stages", check_int("stages", self.stages, lo=2, hi=16))
        put("cluster", check_choice("cluster", self.cluster, SM90_CLUSTERS))
        check_choice("raster", self.raster, RASTERS)
        put("group", check_int("group", self.group, lo=1))
        put("epi_n", check_int("epi_n", self.epi_n, lo=8, hi=64, multiple_of=8))
        put("epi_stages", check_int("epi_stages", self.epi_stages, lo=1, hi=8))
        put("swap_ab", check_choice("swap_ab", self.swap_ab, (False, True)))
        put("splits", check_int("splits", self.splits, lo=1, hi=64))
        if self.tile_n % self.epi_n:
            raise ValueError(f"epi_n must divide tile_n={self.tile_n}; got epi_n={self.epi_n}")
        if not self.swap_ab and (self.tile_n % 16 or self.epi_n not in (16, 32, 64)):
            raise ValueError(f"tile_n must be a multiple of 16 and epi_n one of (16, 32, 64) without swap_ab (C is "
                             f"stored N-major in sub-tiles of 16-column stmatrix blocks); a multiple of 8 needs "
                             f"swap_ab=True (a token tile: C' is M-major); got tile_n={self.tile_n}, "
                             f"epi_n={self.epi_n}")
        put("gated", check_choice("gated", self.gated, (False, True)))
        if self.gated:
            if self.swap_ab or self.splits > 1:
                raise ValueError(f"gated needs swap_ab False and splits 1 (the epilogue pairs columns of one whole "
                                 f"tile); got swap_ab={self.swap_ab}, splits={self.splits}")
            if (self.tile_n // 2) % self.epi_n:
                raise ValueError(f"gated: epi_n must divide tile_n / 2 = {self.tile_n // 2} (the output tile's "
                                 f"width); got epi_n={self.epi_n}")
        put("wg_rows", check_choice("wg_rows", self.wg_rows, (64, 128)))
        if self.wg_rows == 128:
            if self.tile_m != 128 or self.tile_n > MAX_TILE_N_WG128 or self.gated:
                raise ValueError(f"wg_rows=128 (one consumer warpgroup holding both 64-row halves of the tile) needs "
                                 f"tile_m=128, tile_n <= {MAX_TILE_N_WG128} (tile_n accumulator registers a thread) "
                                 f"and no gated epilogue; got tile_m={self.tile_m}, tile_n={self.tile_n}, "
                                 f"gated={self.gated}")
        put("pingpong", check_choice("pingpong", self.pingpong, (False, True)))
        if self.pingpong and (self.wg_rows != 128 or self.split_k):
            raise ValueError(f"pingpong (two consumer warpgroups taking whole 128-row tiles in turn) needs wg_rows=128 "
                             f"and splits 1; got wg_rows={self.wg_rows}, splits={self.splits}")
        if self.tile_m == 192 and self.tile_n > MAX_TILE_N_192:
            raise ValueError(f"tile_n must be at most {MAX_TILE_N_192} with tile_m=192: three consumer warpgroups "
                             f"share the registers (152 per thread, tile_n / 2 of them accumulators); got {self.tile_n}")
        cm, cn = self.cluster
        if cm * cn > 2 and (self.tile_m % (8 * cn) or self.tile_n % (8 * cm)):
            raise ValueError(f"cluster {self.cluster}: each of the {cn} CTAs sharing an A' panel loads tile_m / {cn} of "
                             f"its rows and each of the {cm} sharing a B' panel tile_n / {cm}, in whole 8-row swizzle "
                             f"atoms, so tile_m must be a multiple of {8 * cn} and tile_n of {8 * cm}; got tile_m="
                             f"{self.tile_m}, tile_n={self.tile_n}")
        if self.smem_bytes() > SMEM_PER_BLOCK:
            raise ValueError(f"stages={self.stages} with a {self.tile_m} x {self.tile_n} tile needs "
                             f"{self.smem_bytes()} bytes of shared memory; a CTA may use {SMEM_PER_BLOCK}")

    # ---- the CTA
    @property
    def consumers(self) -> int:
        """Consumer warpgroups: one per ``wg_rows`` rows of the tile (64: one WGMMA's M; 128: two WGMMAs a k-step);
        with ``pingpong`` two, each holding whole tiles, one tile after the other's."""
        return 2 if self.pingpong else self.tile_m // self.wg_rows

    @property
    def tile_warpgroups(self) -> int:
        """Consumer warpgroups that compute one tile together, and so read each ring stage: all of them, or one with
        ``pingpong`` (each warpgroup its own tiles)."""
        return 1 if self.pingpong else self.consumers

    @property
    def threads(self) -> int:
        return 128 * (1 + self.consumers)

    @property
    def cluster_size(self) -> int:
        return self.cluster[0] * self.cluster[1]

    def clusters_on(self, num_sms: int) -> int:
        """The persistent grid's clusters on ``num_sms`` SMs: one CTA per SM, whole clusters, at least one, and no
        more than the GPU runs at once (:data:`ACTIVE_CLUSTERS`: a cluster's CTAs share one GPC)."""
        return max(1, min(num_sms // self.cluster_size, ACTIVE_CLUSTERS.get((num_sms, self.cluster_size), num_sms)))

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
        return (self.out_tile_n // self.epi_n) % self.epi_stages == 0

    @property
    def out_tile_n(self) -> int:
        """Columns of C a tile stores: ``tile_n``, or half of it when ``gated`` (``silu(first half) * second half``)."""
        return self.tile_n // 2 if self.gated else self.tile_n

    # ---- sizes
    def stage_bytes(self) -> int:
        """Bytes one ring stage holds: an A' block (tile_m x tile_k) and a B' block (tile_n x tile_k)."""
        return _bytes((self.tile_m + self.tile_n) * self.tile_k, self.dtype)

    def epi_bytes(self) -> int:
        """The output sub-tile rings (split-K too: a tile's last unit stores C through them)."""
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

    def hybrid(self, m: int, n: int, clusters: int | None = None) -> tuple[int, int]:
        """``(dp_tiles, tail_tiles)``: :func:`hybrid_tiles` of this problem's cluster tiles on ``clusters``
        clusters (None: a grid with a cluster for every tile, so every tile is split, as on one wave)."""
        cm, cn = self.cluster_tiles(m, n)
        tiles = cm * cn
        return hybrid_tiles(tiles, tiles if clusters is None else clusters, self.splits)

    def units(self, m: int, n: int, clusters: int | None = None) -> int:
        """Work units a CTA cluster takes one at a time: the whole tiles, then the tail tiles x K slices
        (``clusters``: the persistent grid's, as in :meth:`hybrid`)."""
        dp, tail = self.hybrid(m, n, clusters)
        return dp + tail * self.splits

    def split_tiles(self, m: int, n: int, clusters: int | None = None) -> int:
        """Split-K: CTA tiles with a counter and workspace tiles of their own, cluster padding included: the tail's
        (``clusters`` as in :meth:`hybrid`; None sizes for every tile, which is never too few)."""
        return self.hybrid(m, n, clusters)[1] * self.cluster_size

    def workspace_floats(self, m: int, n: int, splits: int | None = None, clusters: int | None = None) -> int:
        """Split-K: FP32 values of the workspace, one ``tile_m x tile_n`` partial tile per tail CTA tile and K slice
        (``splits``: the run-time count, default ``self.splits``; ``clusters`` as in :meth:`hybrid`)."""
        return self.split_tiles(m, n, clusters) * (splits or self.splits) * self.tile_m * self.tile_n

    @property
    def kernel_key(self) -> "Sm90Config":
        """The part of the config the compiled code depends on: the number of splits is a run-time value."""
        return replace(self, splits=min(self.splits, 2))

    @property
    def name(self) -> str:
        """A short name: ``128x256 c2x1 m8 s4`` (+ `` swap`` / `` split5`` / `` gated`` / `` w128`` / `` pp``);
        :meth:`Sm90Config.parse_name` reads it back."""
        return (f"{self.tile_m}x{self.tile_n} c{self.cluster[0]}x{self.cluster[1]} {self.raster}{self.group} "
                f"s{self.stages}" + (" swap" if self.swap_ab else "") + (f" split{self.splits}" if self.split_k else "")
                + (" gated" if self.gated else "") + (" w128" if self.wg_rows == 128 else "")
                + (" pp" if self.pingpong else ""))

    @staticmethod
    def parse_name(name: str) -> dict:
        """The fields a :attr:`name` holds: ``tile_m``, ``tile_n``, ``cluster``, ``raster``, ``group``, ``stages``,
        ``swap_ab``, ``splits`` (the stored benchmark results name their configs this way)."""
        parts = str(name).split()
        try:
            tile_m, tile_n = (int(x) for x in parts[0].split("x"))
            cluster = tuple(int(x) for x in parts[1][1:].split("x"))
            raster, group = parts[2][0], int(parts[2][1:])
            stages = int(parts[3][1:])
            extra = parts[4:]
            splits = [int(p[5:]) for p in extra if p.startswith("split")]
            known = ("swap", "gated", "w128", "pp")
            if any(p not in known and not p.startswith("split") for p in extra) or len(splits) > 1:
                raise ValueError
        except (IndexError, ValueError):
            raise ValueError(f"name must look like '128x256 c2x1 m8 s4' (+ ' swap', ' split5', ' gated', ' w128', "
                             f"' pp'); got {name!r}") from None
        out = dict(tile_m=tile_m, tile_n=tile_n, cluster=cluster, raster=raster, group=group, stages=stages,
                   swap_ab="swap" in extra, splits=splits[0] if splits else 1)
        if "gated" in extra:
            out["gated"] = True
        if "w128" in extra:
            out["wg_rows"] = 128
        if "pp" in extra:
            out["pingpong"] = True
        return out


def split_ranges(k_tiles: int, splits: int) -> list[tuple[int, int]]:
    """``(first k-block, count)`` of every K slice, as the sm90 kernel computes them.

    Slices are ``ceil(k_tiles / splits)`` k-blocks long and the last takes what is
    left, so every slice is non-empty only if ``splits`` is :func:`effective_splits`;
    any other count (one that would leave a slice empty) is a ``ValueError`` naming it.
    """
    k_tiles = check_int("k_tiles", k_tiles, lo=1)
    splits = check_int("splits", splits, lo=1, hi=1024)  # a list of them is built: far more than any kernel runs
    per = -(-k_tiles // splits)
    if (splits - 1) * per >= k_tiles:
        raise ValueError(f"splits={splits} leaves slices of {k_tiles} k-blocks empty (ceil({k_tiles} / {splits}) = "
                         f"{per} k-blocks a slice); the kernel is given effective_splits({k_tiles}, {splits}) = "
                         f"{effective_splits(k_tiles, splits)}")
    return [(s * per, min(per, k_tiles - s * per)) for s in range(splits)]


def hybrid_tiles(tiles: int, clusters: int, splits: int) -> tuple[int, int]:
    """``(dp_tiles, tail_tiles)``: which of ``tiles`` cluster tiles a persistent grid of ``clusters`` runs whole and
    which it splits into ``splits`` K slices (data-parallel waves, then a split-K tail).

    The tiles that fill whole waves, ``(tiles // clusters) * clusters`` of them, run whole: full K, the normal
    epilogue, no workspace. Only the partial last wave's tiles are split, so their ``tail x splits`` units spread
    over the SMs the last wave would leave idle. A grid of at most one wave (``tiles <= clusters``) splits every
    tile; a whole number of waves (or ``splits`` 1) leaves nothing to split: ``(tiles, 0)``.
    """
    tiles = check_int("tiles", tiles, lo=1)
    clusters = check_int("clusters", clusters, lo=1)
    splits = check_int("splits", splits, lo=1)
    if splits == 1:
        return tiles, 0
    dp = tiles // clusters * clusters if tiles > clusters else 0
    return dp, tiles - dp


def effective_splits(k_tiles: int, splits: int) -> int:
    """The largest slice count <= ``splits`` that leaves no slice empty (and no more slices than k-blocks)."""
    k_tiles = check_int("k_tiles", k_tiles, lo=1)
    splits = check_int("splits", splits, lo=1)
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
BARRIER_RESERVE = 1024  # bytes kept for mbarriers and the TMEM address (rounded up)
EPILOGUE_WARPS = 4  # warps 0-3: warp w may read TMEM lanes 32(w % 4)..+31, so they come first
GROUP_M = 8  # the tile order: bands of 8 M-tiles (gemmlab.scheduler, chapter 07)
RASTER = "m"


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
    num_sms: int = B200.sms
    dtype: str = "bfloat16"  # of A, B and C
    b_major: str = "k"  # "k": B is N x K (K contiguous); "n": B is K x N (N contiguous)

    def __post_init__(self):
        object.__setattr__(self, "block_n", check_choice("block_n", self.block_n, BLOCK_N_CHOICES))
        object.__setattr__(self, "ab_stages", check_int("ab_stages", self.ab_stages, lo=1))
        object.__setattr__(self, "epi_n", check_choice("epi_n", self.epi_n, (16, 32, 64)))
        object.__setattr__(self, "num_sms", check_int("num_sms", self.num_sms, lo=2))
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


# --------------------------------------------------------------------------------------
# Grouped (chapter 08): gemmlab.kernels.grouped_sm90's tiles, the ones its heuristic picks from
# --------------------------------------------------------------------------------------

#: 64-row tiles for decode (a few tokens per expert): the least MMA work wasted on rows past a group's end.
SMALL = Sm90Config(tile_m=64, tile_n=128, tile_k=64, stages=8, cluster=(1, 1), epi_n=32, epi_stages=4)
#: The decode tile twice as wide: half as many tiles, each streaming twice the weight bytes.
SMALL_WIDE = Sm90Config(tile_m=64, tile_n=256, tile_k=64, stages=5, cluster=(1, 1), epi_n=32, epi_stages=4)
MEDIUM = Sm90Config(tile_m=128, tile_n=192, tile_k=64, stages=4, cluster=(1, 1), epi_n=32, epi_stages=4)
LARGE = Sm90Config(tile_m=128, tile_n=256, tile_k=64, stages=4, cluster=(1, 1), epi_n=32, epi_stages=2)
#: The two large tiles in clusters of two CTAs along M that share each B tile (the expert's weights) by multicast.
MEDIUM_C2 = Sm90Config(tile_m=128, tile_n=192, tile_k=64, stages=4, cluster=(2, 1), epi_n=32, epi_stages=4)
LARGE_C2 = Sm90Config(tile_m=128, tile_n=256, tile_k=64, stages=4, cluster=(2, 1), epi_n=32, epi_stages=2)
#: Groups the kernel ranks by size in shared memory (largest first); beyond this it visits them in index order.
ORDER_MAX = 256
#: The A and B descriptors' L2 promotion the grouped kernel can write (the driver's ``CUtensorMapL2promotion``:
#: 0 none, 1 64 B, 2 128 B, 3 256 B; None keeps the DSL template's 128 B):
#: :func:`gemmlab.kernels.grouped_sm90.set_l2_promotion`.
L2_PROMOTIONS = (None, 0, 1, 2, 3)
#: The grouped kernel's ``mixed`` (rows) and ``burst`` (claims) are compared with its Int32 counters.
INT32_MAX = 2 ** 31 - 1


def check_grouped_config(cfg, dtype: str | None = None) -> Sm90Config:
    """A tile the grouped kernel runs: an :class:`Sm90Config` in clusters of 1 or 2 CTAs along M, no swap, no
    split-K (and for ``dtype``'s operands when given); returns it."""
    if not isinstance(cfg, Sm90Config):
        raise TypeError(f"config must be an Sm90Config (a grouped tile such as configs.LARGE); got "
                        f"{type(cfg).__name__}")
    if cfg.cluster not in ((1, 1), (2, 1)) or cfg.swap_ab or cfg.split_k or cfg.tile_m == 192 or cfg.gated:
        raise ValueError(f"cfg: the grouped kernel runs 64- or 128-row tiles in clusters of 1 or 2 CTAs along M "
                         f"(cluster (1, 1) or (2, 1)), no swap, no split-K, not gated; got {cfg.name}")
    if dtype is not None and (cfg.dtype, cfg.out_dtype) != (dtype, dtype):
        raise ValueError(f"config is for {cfg.dtype} -> {cfg.out_dtype}; the tensors are {dtype} (the grouped GEMM "
                         f"writes its inputs' dtype): pass dataclasses.replace(config, dtype={dtype!r}, "
                         f"out_dtype={dtype!r})")
    return cfg


#: The grouped kernel's workspace (allocated by the host, one row of slots per CTA) and its table of problems (the
#: list form): their layout is the contract between :mod:`gemmlab.family.plan` and the kernel.
DESC_BYTES = 128  # one TMA descriptor (CUtensorMap)
DESC_WORDS = DESC_BYTES // 8
TABLE_COLUMNS = ("a", "b", "c", "m", "n", "k", "lda", "ldb", "ldc")  # mode "table": one int64 row per group


def ab_slots(cfg: Sm90Config) -> int:
    """Descriptor slots for A (and as many for B) per CTA and stream: ``stages + 1``.

    At most ``stages`` TMA loads are in flight (the producer waits for a stage's release before refilling it),
    so a slot used again ``stages + 1`` group changes later is never rewritten under a queued load
    (:func:`gemmlab.grouped_model.slot_reuse_margin` is the CPU model of it).
    """
    return cfg.stages + 1


def grouped_smem_bytes(cfg: Sm90Config, *, by_size: bool = True, dynamic: bool = False, mixed: bool = False) -> int:
    """Shared memory the grouped kernel (:mod:`gemmlab.kernels.grouped_sm90`) allocates for ``cfg``, in its allocation
    order and alignments: the A, B and output rings (1024-aligned), the ring's two mbarrier arrays, the descriptor
    scratch (A, B and one C per consumer, 128-aligned), the visiting order and the sizes it is ranked from
    (:data:`ORDER_MAX` words each with ``by_size``, else one), every group's first tile (``ORDER_MAX + 1`` words), the
    dynamic ring's tile numbers (``stages`` words, else one) and the mixed order's two counters. Those tables take about
    3.7 KiB, against the 1 KiB of slack :meth:`Sm90Config.smem_bytes` adds, so a configuration the dense kernel fits can
    exceed a block here (128 x 128 with 6 stages, dynamic, largest first: 233,116 bytes, which the H100 refused to
    launch on 2026-11-27)."""
    e, o = DTYPE_BITS[cfg.dtype] // 8, DTYPE_BITS[cfg.out_dtype] // 8
    off = 0

    def put(size: int, align: int) -> None:
        nonlocal off
        off = -(-off // align) * align + size

    put(cfg.stages * cfg.tile_m * cfg.tile_k * e, 1024)
    put(cfg.stages * cfg.tile_n * cfg.tile_k * e, 1024)
    put(cfg.consumers * cfg.epi_stages * 64 * cfg.epi_n * o, 1024)
    put(8 * cfg.stages, 8)
    put(8 * cfg.stages, 8)
    put(DESC_BYTES * (2 + cfg.consumers), DESC_BYTES)
    order = ORDER_MAX if by_size else 1
    put(4 * order, 4)
    put(4 * order, 4)
    put(4 * (ORDER_MAX + 1), 4)
    put(4 * (cfg.stages if dynamic else 1), 4)
    if mixed:
        put(8, 4)
    return off


def check_grouped_smem(cfg: Sm90Config, *, by_size: bool, dynamic: bool, mixed: bool) -> None:
    """A ``ValueError`` naming ``stages`` where :func:`grouped_smem_bytes` exceeds a block's shared memory (before any
    compile or launch: the driver would refuse the launch with ``cudaErrorInvalidValue``)."""
    need = grouped_smem_bytes(cfg, by_size=by_size, dynamic=dynamic, mixed=mixed)
    if need > SMEM_PER_BLOCK:
        raise ValueError(f"config {cfg.name}: stages={cfg.stages} needs {need} bytes of shared memory in the grouped "
                         f"kernel (dynamic={dynamic}, by_size={by_size}: its rings plus descriptor scratch and "
                         f"visiting order); a block has {SMEM_PER_BLOCK}: use fewer stages")


def slots_per_cta(cfg: Sm90Config, trace: bool = False, mixed: bool = False) -> int:
    """Slots one CTA owns in the workspace: ``stages + 1`` for A, as many for B (:func:`ab_slots`), 1 per consumer
    warpgroup for C, then one for the tile counters (CTA 0's holds them: :func:`gemmlab.scheduler.claim_tile`).

    ``mixed``: as many descriptor slots again after that, for the light experts' stream (:func:`light_base`).
    ``trace``: one more, the CTA's timeline (:data:`gemmlab.kernels.grouped_sm90.TRACE_POINTS`).
    """
    return sched_slot(cfg) + 1 + (sched_slot(cfg) if mixed else 0) + int(bool(trace))


def light_base(cfg: Sm90Config) -> int:
    """``mixed``: the light stream's descriptor slots start here (its A, B and C slots at the heavy stream's
    offsets), so a CTA going back and forth between the streams does not rewrite the heavy group's descriptors."""
    return sched_slot(cfg) + 1


def sched_slot(cfg: Sm90Config) -> int:
    """The workspace slot after the descriptors: in CTA 0's row, word 0 counts the tiles handed out, word 1 the
    CTAs done with fetching; in a pair's first CTA's row, words :data:`gemmlab.scheduler.MAILBOX_FIRST` on are its
    mailbox."""
    return 2 * ab_slots(cfg) + cfg.consumers


# --------------------------------------------------------------------------------------
# Gated NVFP4 (chapter 11): gemmlab.kernels.dual_gemm_sm90, .dual_gemm_sm90_pipelined, .dual_gemm_sm100
# --------------------------------------------------------------------------------------

GATED_TILE_M = 128  #: rows of A and C per CTA tile in all three kernels (one 128-lane MMA; two 64-row warpgroups)
K_BLOCK = fp4.K_MULTIPLE  #: FP4 values of K per pipeline stage: 128 bytes a row
KB_BYTES = K_BLOCK // 2  #: packed bytes of one k-block per row
SF_BYTES = K_BLOCK // fp4.SF_VEC  #: scale bytes of one k-block per row (16)
SLICE_K = 64  #: Hopper: K values per dequantized 16-bit slice (128 bytes: one 128B-swizzle row)
SLICES = K_BLOCK // SLICE_K  #: slices per k-block
PIPELINED_TILE_NS = (32, 48, 64)  #: N of each GEMM per CTA of the fast Hopper twin
PROBES = ("full", "no_mma", "no_convert")  #: the fast twin's timing probes (all but "full" compute wrong results)
MMA_K_FP4 = 64  #: K of one tcgen05.mma kind::mxf4nvf4 (32 bytes of FP4 a row)
STEPS = K_BLOCK // MMA_K_FP4  #: MMAs per k-block and GEMM
SF_PER_STEP = MMA_K_FP4 // fp4.SF_VEC  #: scales per row per MMA (scale_vec::4X)
#: Tile N chapter 11's CPU model and its tests cover. 256 does not fit: two 256-column FP32 accumulators fill
#: TMEM's 512 columns and leave none for the scales (:func:`tmem_columns`).
TILE_N_CHOICES = (64, 128, 192)
#: Tile N the SM100 kernel supports (192 needs SFB atoms split over two tiles, not implemented).
DUAL_SM100_TILE_NS = (64, 128)
EPI_N = 32  #: SM100: columns of C per epilogue store (a 128 x 32 FP16 sub-tile, 8 KiB)
EPI_C_STAGES = 2  #: SM100: shared-memory staging buffers of the epilogue's TMA store


@dataclass(frozen=True)
class DualSm90Config:
    """The simple Hopper twin: ``tile_n``: N of the CTA tile (64 or 128); ``stages``: depth of the packed-FP4 TMA ring."""

    tile_n: int = 128
    stages: int = 2

    def __post_init__(self):
        if self.tile_n not in (64, 128):
            raise ValueError(f"tile_n must be 64 or 128; got {self.tile_n}")
        check_int("stages", self.stages, lo=1)
        if self.smem_bytes() > SMEM_PER_BLOCK:
            raise ValueError(f"tile_n={self.tile_n} with stages={self.stages} needs {self.smem_bytes()} bytes of "
                             f"shared memory; a block has {SMEM_PER_BLOCK}")

    def smem_bytes(self) -> int:
        """Shared memory: the packed ring, the three BF16 slices, the barriers."""
        n, tm = self.tile_n, GATED_TILE_M
        ring = self.stages * (tm * KB_BYTES + 2 * n * KB_BYTES + tm * SF_BYTES + 2 * n * SF_BYTES)
        bf16 = (tm + 2 * n) * SLICE_K * 2
        return ring + bf16 + 1024


@dataclass(frozen=True)
class PipelinedConfig:
    """The fast Hopper twin: ``tile_n``: N of each GEMM per CTA (32, 48 or 64); ``stages``: packed k-blocks in flight."""

    tile_n: int = 64
    stages: int = 4
    #: True: warpgroup 0 converts B (and its warp 0 issues the TMA loads); False: the MMA warpgroups convert both
    split: bool = True
    #: "full", or a timing probe that returns wrong results: "no_mma" (convert only), "no_convert" (MMAs only)
    probe: str = "full"

    def __post_init__(self):
        if self.probe not in PROBES:
            raise ValueError(f"probe must be one of {PROBES}; got {self.probe!r}")
        if self.tile_n not in PIPELINED_TILE_NS:
            raise ValueError(f"tile_n must be one of {PIPELINED_TILE_NS}; got {self.tile_n}")
        check_int("stages", self.stages, lo=3 if self.split else 2)
        if not isinstance(self.split, bool):
            raise TypeError(f"split must be a bool; got {type(self.split).__name__}")
        if self.smem_bytes() > SMEM_PER_BLOCK:
            raise ValueError(f"tile_n={self.tile_n} with stages={self.stages} needs {self.smem_bytes()} bytes of "
                             f"shared memory; a block has {SMEM_PER_BLOCK}")

    def stage_bytes(self) -> int:
        """Bytes TMA writes per k-block: packed A, B1, B2 and their scales."""
        return (GATED_TILE_M + 2 * self.tile_n) * (KB_BYTES + SF_BYTES)

    def smem_bytes(self) -> int:
        """The packed ring, the four FP16 B buffers, alignment and barriers."""
        return self.stages * self.stage_bytes() + SLICES * 2 * self.tile_n * SLICE_K * 2 + 1024 + 256


def sf_columns(rows: int) -> int:
    """TMEM columns the scales of ``rows`` rows take per k-block: 4 per 128 rows per MMA step."""
    return STEPS * 4 * fp4.ceil_div(rows, fp4.ATOM_MN)


def tmem_columns(tile_n: int, acc_stages: int = 1) -> dict:
    """Column offsets in TMEM: accumulators first, then SFA, SFB1, SFB2; ``alloc`` is the power of two allocated.

    Each accumulator is ``tile_n`` FP32 columns (128 lanes = 128 rows of C); with
    ``acc_stages`` = 2 the pair is doubled (the epilogue of one tile overlaps the next
    tile's main loop). The scale regions follow at offsets computed from the
    accumulators' footprint, as the kernel computes them.
    """
    acc = 2 * tile_n * acc_stages
    sfa = acc
    sfb1 = sfa + sf_columns(GATED_TILE_M)
    sfb2 = sfb1 + sf_columns(tile_n)
    end = sfb2 + sf_columns(tile_n)
    alloc = 32
    while alloc < end:
        alloc *= 2
    return dict(acc1=0, acc2=tile_n, sfa=sfa, sfb1=sfb1, sfb2=sfb2, used=end, alloc=alloc)


@dataclass(frozen=True)
class Budget:
    """Shared memory (bytes) and TMEM (columns) of one configuration; ``fits`` says whether it can run."""

    tile_n: int
    ab_stages: int
    acc_stages: int
    smem_per_stage: dict
    smem_stage_bytes: int
    smem_c_bytes: int
    smem_total: int
    tmem: dict

    @property
    def fits(self) -> bool:
        return self.smem_total <= SMEM_PER_BLOCK and self.tmem["used"] <= TMEM_COLUMNS

    def describe(self) -> str:
        s = self.smem_per_stage
        parts = ", ".join(f"{k} {v / 1024:g} KiB" for k, v in s.items())
        t = self.tmem
        return (f"tile 128 x {self.tile_n}, {self.ab_stages} stages, {self.acc_stages} accumulator stage(s): "
                f"SMEM {self.smem_total / 1024:.1f} of {SMEM_PER_BLOCK / 1024:g} KiB "
                f"(per stage: {parts}; C staging {self.smem_c_bytes / 1024:g} KiB); "
                f"TMEM columns: acc1 {t['acc1']}, acc2 {t['acc2']}, SFA {t['sfa']}, SFB1 {t['sfb1']}, "
                f"SFB2 {t['sfb2']}, end {t['used']} of {TMEM_COLUMNS} (allocate {t['alloc']})"
                + ("" if self.fits else "  -> does NOT fit"))


def budget(tile_n: int, ab_stages: int, acc_stages: int = 1) -> Budget:
    """SMEM and TMEM of a 128 x ``tile_n`` dual-GEMM tile with ``ab_stages`` pipeline stages.

    Per stage: A 128 x 128 bytes, B1 and B2 ``tile_n`` x 128 bytes, SFA 4 atoms of 512
    bytes (128 rows x 16 scales), SFB1 and SFB2 4 atoms per 128 rows of B (rounded up).
    Plus ``EPI_C_STAGES`` FP16 staging buffers of 128 x ``EPI_N`` and ``BARRIER_RESERVE``.
    """
    check_int("tile_n", tile_n, lo=16, hi=256, multiple_of=16)
    check_int("ab_stages", ab_stages, lo=1)
    check_int("acc_stages", acc_stages, lo=1, hi=2)
    kb = KB_BYTES
    per = dict(A=GATED_TILE_M * kb, B1=tile_n * kb, B2=tile_n * kb,
               SFA=fp4.ceil_div(GATED_TILE_M, 128) * STEPS * fp4.ATOM_BYTES,
               SFB1=fp4.ceil_div(tile_n, 128) * STEPS * fp4.ATOM_BYTES,
               SFB2=fp4.ceil_div(tile_n, 128) * STEPS * fp4.ATOM_BYTES)
    stage = sum(per.values())
    c_bytes = EPI_C_STAGES * GATED_TILE_M * EPI_N * 2
    total = ab_stages * stage + c_bytes + BARRIER_RESERVE
    return Budget(tile_n, ab_stages, acc_stages, per, stage, c_bytes, total, tmem_columns(tile_n, acc_stages))


def max_stages(tile_n: int, acc_stages: int = 1) -> int:
    """The most pipeline stages that fit in shared memory (0 if TMEM cannot hold the configuration)."""
    if not budget(tile_n, 1, acc_stages).fits:
        return 0
    s = 1
    while budget(tile_n, s + 1, acc_stages).fits:
        s += 1
    return s


@dataclass(frozen=True)
class DualSm100Config:
    """The tcgen05 kernel: ``tile_n``: N of the CTA tile (128 or 64); ``stages``: depth of the TMA ring
    (1 .. :func:`max_stages`); ``num_ctas``: persistent CTAs (at most the number of tiles are launched)."""

    tile_n: int = 128
    stages: int = 3
    num_ctas: int = B200.sms  #: one persistent CTA per SM of a B200

    def __post_init__(self):
        check_int("tile_n", self.tile_n, lo=16, hi=256, multiple_of=16)
        if self.tile_n not in DUAL_SM100_TILE_NS:
            raise ValueError(f"tile_n must be one of {DUAL_SM100_TILE_NS} (192 needs SFB atoms split over two tiles, "
                             f"not implemented; 256 leaves no TMEM for the scales); got {self.tile_n}")
        check_int("stages", self.stages, lo=1)
        most = max_stages(self.tile_n)
        if self.stages > most:
            raise ValueError(f"stages must be at most {most} for tile_n={self.tile_n} (shared memory: "
                             f"{budget(self.tile_n, self.stages).describe()}); got {self.stages}")
        check_int("num_ctas", self.num_ctas, lo=1)

    @property
    def tmem(self) -> dict:
        """The TMEM column plan (:func:`tmem_columns`)."""
        return tmem_columns(self.tile_n)

    @property
    def tx_bytes(self) -> int:
        """Bytes the six TMA loads of one stage bring (what ``ab_full[s]`` expects)."""
        return budget(self.tile_n, self.stages).smem_stage_bytes


# --- chapter 11, Hopper: the decode twin (weights on the MMA's M side, split-K over a cluster) ---

DECODE_WG_ROWS = 64  #: the decode twin: weight rows per MMA warpgroup (WGMMA's M)
DECODE_MAX_TOKENS = 128  #: the decode twin's token tile: M <= 128
DECODE_TOKEN_MULTIPLE = 16  #: tokens (WGMMA's N) is a multiple of 16
DECODE_SPLITS = (1, 2, 4)  #: CTAs per cluster along K
DECODE_MMA_WARPGROUPS = (1, 2)
#: k-blocks the converter's warp 0 loads ahead of the one it converts (stages - 2, as the fast twin)
DECODE_LOAD_LAG = 2


class _WeightsOnM:
    """What the decode and swap twins share: ``mma_warpgroups`` MMA warpgroups of 64 weight rows each beside one
    warpgroup that loads (and, in the decode twin, converts the tokens), two FP32 accumulators of ``tokens`` columns."""

    def _check_shared_fields(self, min_stages: int) -> None:
        """``tokens`` (a multiple of 16 up to 128), ``mma_warpgroups``, ``split`` and ``stages`` checked and stored
        as plain ints (numpy and torch integers are numbers; a config's repr and hash must not depend on their type)."""
        object.__setattr__(self, "tokens", check_int("tokens", self.tokens, lo=DECODE_TOKEN_MULTIPLE,
                                                     hi=DECODE_MAX_TOKENS, multiple_of=DECODE_TOKEN_MULTIPLE))
        object.__setattr__(self, "mma_warpgroups", check_choice("mma_warpgroups", self.mma_warpgroups,
                                                                DECODE_MMA_WARPGROUPS))
        object.__setattr__(self, "split", check_choice("split", self.split, DECODE_SPLITS))
        object.__setattr__(self, "stages", check_int("stages", self.stages, lo=min_stages))

    @property
    def rows(self) -> int:
        """Weight rows of each GEMM per CTA (WGMMA's M over the MMA warpgroups)."""
        return DECODE_WG_ROWS * self.mma_warpgroups

    @property
    def threads(self) -> int:
        """The first warpgroup (its warp 0 issues every TMA load) and the MMA warpgroups."""
        return 128 * (1 + self.mma_warpgroups)

    def partial_bytes(self) -> int:
        """Split-K: both FP32 partial accumulators of the CTA (they reuse the ring's space)."""
        return 0 if self.split == 1 else 2 * self.rows * self.tokens * 4


@dataclass(frozen=True)
class DecodeConfig(_WeightsOnM):
    """The decode twin: ``tokens`` T (WGMMA's N: M padded, a multiple of 16 up to 128), ``mma_warpgroups``
    (1 or 2: 64 or 128 weight rows of each GEMM per CTA), ``split`` (1, 2 or 4 CTAs along K, one cluster),
    ``stages`` (packed k-blocks in flight, >= 3: the converter loads two k-blocks ahead of the one it converts)."""

    tokens: int = 64
    mma_warpgroups: int = 2
    split: int = 1
    stages: int = 4

    def __post_init__(self):
        self._check_shared_fields(DECODE_LOAD_LAG + 1)
        if self.smem_bytes() > SMEM_PER_BLOCK:
            raise ValueError(f"stages={self.stages} with tokens={self.tokens} and mma_warpgroups="
                             f"{self.mma_warpgroups} needs {self.smem_bytes()} bytes of shared memory; a block has "
                             f"{SMEM_PER_BLOCK}")

    def stage_bytes(self) -> int:
        """Bytes TMA writes per k-block: packed W1, W2, A and their scales (A's box is ``tokens`` rows)."""
        return (2 * self.rows + self.tokens) * (KB_BYTES + SF_BYTES)

    def buffer_bytes(self) -> int:
        """The four FP16 token buffers (one slice each: ``tokens`` x 64 values)."""
        return SLICES * self.tokens * SLICE_K * 2

    def smem_bytes(self) -> int:
        """The FP16 buffers and the ring (or the partials, if larger), alignment and barriers."""
        return max(self.buffer_bytes() + self.stages * self.stage_bytes(), self.partial_bytes()) + 1024 + 256


def decode_max_stages(tokens: int, mma_warpgroups: int, split: int = 1, cap: int = 6) -> int:
    """The decode twin's deepest ring (at most ``cap``) that fits in shared memory."""
    best = DECODE_LOAD_LAG + 1
    for s in range(DECODE_LOAD_LAG + 1, cap + 1):
        try:
            DecodeConfig(tokens, mma_warpgroups, split, s)
        except ValueError:
            break
        best = s
    return best


# --- chapter 11, Hopper: the swap twin (the decode twin's weights in registers, the A16 twin's FP16 tokens) ---



@dataclass(frozen=True)
class SwapConfig(_WeightsOnM):
    """The swap twin: ``tokens`` T (WGMMA's N: a tile of T rows of A, the grid's y covering M; a multiple of 16 up to
    128, as the decode twin's), ``mma_warpgroups`` (1 or 2: 64 or 128 weight rows of each GEMM per CTA), ``split``
    (1, 2 or 4 CTAs along K, one cluster; ``tokens`` a multiple of 8 x split), ``stages`` (k-blocks in flight, >= 2:
    packed W1, W2, their scales and four FP16 token slices each)."""

    tokens: int = 128
    mma_warpgroups: int = 2
    split: int = 1
    stages: int = 2

    def __post_init__(self):
        self._check_shared_fields(2)
        if self.tokens % (8 * self.split):
            raise ValueError(f"tokens must be a multiple of 8 x split ({8 * self.split}: each CTA of a split stores "
                             f"whole 8-column groups of the token tile); got tokens={self.tokens}, split={self.split}")
        if self.smem_bytes() > SMEM_PER_BLOCK:
            most = swap_max_stages(self.tokens, self.mma_warpgroups, cap=None)
            raise ValueError(f"stages must be at most {most} for tokens={self.tokens} and mma_warpgroups="
                             f"{self.mma_warpgroups}: stages={self.stages} needs {self.smem_bytes()} bytes of shared "
                             f"memory; a block has {SMEM_PER_BLOCK}")

    def token_bytes(self) -> int:
        """The FP16 token slices of one k-block: ``SLICES`` of ``tokens`` x 64 values."""
        return SLICES * self.tokens * SLICE_K * 2

    def stage_bytes(self) -> int:
        """Bytes TMA writes per k-block: packed W1 and W2, their scales, and the FP16 token slices."""
        return 2 * self.rows * (KB_BYTES + SF_BYTES) + self.token_bytes()

    def epilogue_bytes(self) -> int:
        """The epilogue's use of the ring's space: the partials (split-K), then the FP16 tile of C it stages."""
        return self.partial_bytes() + self.rows * self.tokens * 2

    def ring_bytes(self) -> int:
        """The ring's space: ``stages`` k-blocks, or what the epilogue puts there, if more."""
        return max(self.stages * self.stage_bytes(), self.epilogue_bytes())

    def smem_bytes(self) -> int:
        """The ring's space (:meth:`ring_bytes`), alignment and barriers."""
        return self.ring_bytes() + 1024 + 256


def swap_max_stages(tokens: int, mma_warpgroups: int, cap: int | None = 6) -> int:
    """The swap twin's deepest ring (at most ``cap``; None: no cap) that fits in shared memory (2 at 128 tokens and two
    MMA warpgroups; the split-K partials always fit where two stages do)."""
    stage = SwapConfig(tokens, mma_warpgroups, 1, 2).stage_bytes()
    s = 2
    while (cap is None or s < cap) and stage * (s + 1) + 1024 + 256 <= SMEM_PER_BLOCK:
        s += 1
    return s


# --- chapter 11, Hopper: the A16 twin (A converted to FP16 once by a pre-pass; SS WGMMA over stacked [B1; B2]) ---

A16_TILE_NS = (48, 64, 80, 96, 112, 128)  #: the A16 twin: N of each GEMM per CTA (WGMMA's N is twice that: B1 and B2
#: stacked); multiples of 16, so the converter's 8 tile_n units of a slice split evenly over its 128 threads
A16_B_STAGES = 2  #: the A16 twin: packed B k-blocks in flight (the producer loads them ahead of the converter)
A16_SLICE_BYTES = GATED_TILE_M * SLICE_K * 2  #: one FP16 A slice of the A16 twin: 128 rows x 64 K x 2 bytes (16 KiB)
A16_CLUSTER_TILE_NS = (64, 96, 128)  #: the A16 twin's widths with ``cluster_m`` 2: a CTA converts its half slice's
#: 4 tile_n units over 128 threads, tile_n / 32 each (48, 80 and 112 would leave a remainder)


@dataclass(frozen=True)
class A16Config:
    """The A16 twin: ``tile_n``: N of each GEMM per CTA (:data:`A16_TILE_NS`, 48 to 128 in steps of 16; WGMMA's N is
    ``2 tile_n``); ``stages``: FP16 A slices (128 rows x 64 K, 16 KiB: each MMA warpgroup's 64 rows in a ring of its
    own) in flight, >= 2, at most what shared memory allows (:func:`a16_max_stages`: 10 for ``tile_n`` 48, 7 for 64,
    5 for 128); ``mma_converts`` (``tile_n`` 64 or 128 only): the MMA warpgroups convert half of every [B1; B2]
    slice themselves (while their WGMMAs of the slice before run), so the converter warpgroup converts half as much.
    Correct on an H100, but 3 to 8 % slower there (2026-11-27,
    ``results/nvidia-h100-80gb-hbm3/dual_gemm_a16_mma_converts.json``), so off by default. ``cluster_m`` 2
    (:data:`A16_CLUSTER_TILE_NS`, one converter warpgroup, ``mma_converts`` off): two CTAs with adjacent 128-row M
    tiles and the same N tile form a cluster; each converts half of every [B1; B2] slice (rank 0 B1, rank 1 B2) and
    the copy engine sends it to the peer, so each converted value serves 256 rows of C. Its packed B ring holds one
    half, which leaves room for a deeper A ring (:func:`a16_max_stages`). Correct on an H100 but not faster (2026-11-27,
    ``results/nvidia-h100-80gb-hbm3/dual_gemm_a16_cluster.json``: 0.96 to 0.99 of one CTA's time at ``tile_n`` 64,
    1.39 to 1.47 times it at 96 and 128), so off by default."""

    tile_n: int = 128
    stages: int = 5
    mma_converts: bool = False
    converters: int = 1
    cluster_m: int = 1

    def __post_init__(self):
        object.__setattr__(self, "tile_n", check_choice("tile_n", self.tile_n, A16_TILE_NS))
        object.__setattr__(self, "stages", check_int("stages", self.stages, lo=2))
        if not isinstance(self.mma_converts, bool):
            raise TypeError(f"mma_converts must be a bool; got {type(self.mma_converts).__name__}")
        object.__setattr__(self, "converters", check_choice("converters", self.converters, (1, 2)))
        if self.converters == 2 and (self.mma_converts or self.tile_n not in (64, 96)):
            raise ValueError(f"converters=2 needs tile_n 64 or 96 (the 8 tile_n units of a slice split evenly over 256 "
                             f"threads, and 512 threads start with 128 registers each, below the 138 ptxas wants for "
                             f"wgmma.m64n224k16) and mma_converts off; got tile_n={self.tile_n}, "
                             f"mma_converts={self.mma_converts}")
        if self.mma_converts and self.tile_n % 64:
            raise ValueError(f"mma_converts needs tile_n 64 or 128 (each of the 256 MMA threads converts tile_n / 64 "
                             f"units of a slice); got tile_n={self.tile_n}")
        object.__setattr__(self, "cluster_m", check_choice("cluster_m", self.cluster_m, (1, 2)))
        if self.cluster_m == 2 and (self.tile_n not in A16_CLUSTER_TILE_NS or self.converters != 1
                                    or self.mma_converts):
            raise ValueError(f"cluster_m=2 needs tile_n 64, 96 or 128 (the 4 tile_n units of a CTA's half slice split "
                             f"evenly over the converter's 128 threads), converters=1 and mma_converts off; got "
                             f"tile_n={self.tile_n}, converters={self.converters}, mma_converts={self.mma_converts}")
        if self.smem_bytes() > SMEM_PER_BLOCK:
            most = a16_max_stages(self.tile_n, self.cluster_m)
            raise ValueError(f"stages must be at most {most} for tile_n={self.tile_n}"
                             + (f", cluster_m={self.cluster_m}" if self.cluster_m > 1 else "")
                             + f": stages={self.stages} needs {self.smem_bytes()} bytes of shared memory; a block has "
                             f"{SMEM_PER_BLOCK}")

    def __repr__(self) -> str:
        """The dataclass's repr, ``cluster_m`` only when it is not 1: the names recorded results use stay as they
        were before the field existed."""
        extra = f", cluster_m={self.cluster_m}" if self.cluster_m != 1 else ""
        return (f"A16Config(tile_n={self.tile_n}, stages={self.stages}, mma_converts={self.mma_converts}, "
                f"converters={self.converters}{extra})")

    @property
    def buffers(self) -> int:
        """FP16 [B1; B2] slice buffers between the converter and the MMAs (:func:`a16_buffers`)."""
        return a16_buffers(self.tile_n)

    @property
    def threads(self) -> int:
        """The converter warpgroups (the first one's warp 0 loads B) and two MMA warpgroups (64 rows of C each)."""
        return 128 * (self.converters + 2)

    def b_stage_bytes(self) -> int:
        """Bytes TMA writes per packed B k-block: B1 and B2 bytes and their scales (``cluster_m`` 2: the CTA's half,
        B1 or B2, alone)."""
        return 2 * self.tile_n * (KB_BYTES + SF_BYTES) // self.cluster_m

    def buffer_bytes(self) -> int:
        """The FP16 [B1; B2] slice buffers (each ``2 tile_n`` rows of one 128-byte swizzle row)."""
        return self.buffers * 2 * self.tile_n * SLICE_K * 2

    def smem_bytes(self) -> int:
        """The FP16 B buffers, the FP16 A ring, the packed B ring, alignment and barriers."""
        return a16_smem_bytes(self.tile_n, self.stages, self.cluster_m)


@dataclass(frozen=True)
class W16Config:
    """The W16 route of the gated NVFP4 GEMM on Hopper (:mod:`gemmlab.kernels.dual_gemm_sm90_w16`): A and the weights
    converted to FP16 workspaces inside the call, then chapter 07's kernel with the ``gated`` epilogue. ``gemm``: that
    kernel's :class:`Sm90Config` (``gated``, FP16 in and out, no swap, no split-K); its ``tile_n / 2`` is the block of
    B1 and B2 rows interleaved in the weight workspace and the width of a tile of C."""

    gemm: Sm90Config

    def __post_init__(self):
        if not isinstance(self.gemm, Sm90Config):
            raise TypeError(f"gemm must be an Sm90Config; got {type(self.gemm).__name__}")
        g = self.gemm
        if not g.gated or g.dtype != "float16" or g.out_dtype != "float16":
            raise ValueError(f"gemm must be gated with dtype and out_dtype float16 (the FP16 workspaces hold the NVFP4 "
                             f"values exactly; C is FP16); got gated={g.gated}, dtype={g.dtype!r}, "
                             f"out_dtype={g.out_dtype!r}")


def a16_buffers(tile_n: int) -> int:
    """The A16 twin's FP16 [B1; B2] slice buffers: four of 16 KiB at ``tile_n`` 64, else two of ``tile_n / 4`` KiB
    (32 KiB at 128)."""
    return 4 if tile_n == 64 else 2


def a16_smem_bytes(tile_n: int, stages: int, cluster_m: int = 1) -> int:
    """Shared memory of the A16 twin: FP16 B buffers, ``stages`` FP16 A slices, the packed B ring (``cluster_m`` 2:
    one half of [B1; B2]), slack."""
    buffers = a16_buffers(tile_n) * 2 * tile_n * SLICE_K * 2
    b_ring = A16_B_STAGES * 2 * tile_n * (KB_BYTES + SF_BYTES) // cluster_m
    return buffers + stages * A16_SLICE_BYTES + b_ring + SM90_SMEM_SLACK + 256


def a16_max_stages(tile_n: int, cluster_m: int = 1) -> int:
    """The A16 twin's deepest FP16 A ring (slices) that fits in shared memory for ``tile_n`` (and ``cluster_m``:
    2 holds half the packed B ring, so 7 slices fit at ``tile_n`` 128 instead of 5)."""
    tile_n = check_choice("tile_n", tile_n, A16_TILE_NS)
    cluster_m = check_choice("cluster_m", cluster_m, (1, 2))
    s = 2
    while a16_smem_bytes(tile_n, s + 1, cluster_m) <= SMEM_PER_BLOCK:
        s += 1
    return s
