"""Chapter 11 on the CPU: the SM100 NVFP4 gated dual GEMM's data flow, executed with numbers.

What it models
    One persistent CTA per tile list, doing what the tcgen05 kernel does, byte for byte
    where it matters:

    * **Tiles**: 128 rows of A and C (``TILE_M``) by ``tile_n`` columns, visited in
      chapter 07's grouped order, ``num_ctas`` CTAs each taking every ``num_ctas``-th tile.
      One CTA's tensor memory (TMEM) lives across its tiles, as on the GPU.
    * **k-blocks** of 256 FP4 values (128 bytes a row, ``K_BLOCK``): the TMA warp copies
      the packed A, B1, B2 rows and the *permuted* scales' bytes (the 512-byte atoms of
      :mod:`gemmlab.nvfp4`: 4 per 128 rows per k-block) into a stage of shared memory.
    * **Scales to TMEM** (``tcgen05.cp.cta_group::1.32x128b.warpx4``): each 512-byte atom
      is 32 lines of 16 bytes; line ``r`` goes to lane ``r`` of *every* 32-lane
      sub-partition (``warpx4``: the PTX ISA asks for the scale factors to be
      duplicated to all lane partitions), as 4 columns of 32 bits. Column ``c`` of lane
      ``r`` then holds the 4 scales (bytes 0..3, one per 16 K values) of row
      ``c * 32 + r`` of the atom. SFA takes 4 columns per 64-wide MMA step, 16 per
      k-block; SFB the same per 128 rows of B.
    * **The MMA** (``tcgen05.mma.cta_group::1.kind::mxf4nvf4.block_scale.scale_vec::4X``,
      M = 128, N = ``tile_n``, K = 64; four per k-block): output row ``i`` is computed by
      the sub-partition that owns lane ``i`` and reads its scales from its own lanes:
      lane ``i``, column ``sfa + 4 * step + (i % 128) // 32``, byte ``b`` for K values
      ``16 b .. 16 b + 15`` of the step (``scale_vec::4X``: four e4m3 scales in one
      32-bit word, scale-factor ID 0). Column ``n`` of B reads lane
      ``(i // 32) * 32 + n % 32`` (the replica in that sub-partition), column
      ``sfb + cols_per_step * step + (n // 128) * 4 + (n % 128) // 32``. It computes
      ``acc = (A * SFA) (B * SFB)^T (+ acc)``; the first MMA of a tile runs with
      ACCUMULATE off, every later one with it on. GEMM 1 uses SFB1, GEMM 2 the same A
      and scales with SFB2 (the kernel switches the instruction's SFB operand).
      Where this placement comes from: the PTX ISA says the scale factors must be
      duplicated to all lane partitions and that ``scale_vec::4X`` takes a whole 32-bit
      word (ID 0) per row; the rest (which column a row's word is in) follows from the
      CuTe DSL's scale-factor atom, ``((32, 4), (16, 4)) : ((16, 4), (0, 1))``, and the
      ``32x128b`` copy shape. The ISA draws the layout as a picture; this model is
      consistent with those texts and has not been run against a B200.
    * **TMEM**: 128 lanes x 512 columns of 32 bits (a numpy ``uint32`` array seen as
      FP32 for the accumulators and as bytes for the scales). Accumulator 1 at column 0,
      accumulator 2 at ``tile_n``, then SFA, SFB1, SFB2 (:func:`tmem_columns`). It is
      filled with garbage at the start, as real TMEM is: only ACCUMULATE off clears it.
    * **Epilogue**: TMEM -> registers for both accumulators, ``silu(acc1) * acc2`` in
      FP32, FP16, stored to C with rows and columns past M, N dropped (TMA store clips).

    :func:`run_model` returns C and what happened; ``bug=`` injects the mistakes listed
    in :data:`BUGS`, each of which the reference check catches (the tests prove it).
    :func:`budget` gives the shared memory and TMEM a configuration needs.

What it adds over chapter 10's CPU model
    Chapter 10's model executes the pipelines' timing (barriers, phases). This one
    executes the data: packed FP4 bytes, permuted scale bytes, the TMEM placement the
    block-scaled MMA reads, two accumulators and the gated epilogue. The pipeline
    schedule is the same as chapter 10's and is not repeated here.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from . import nvfp4 as fp4
from .checks import check_choice, check_int
from .family.configs import (EPI_C_STAGES as C_STAGES, EPI_N, GATED_TILE_M as TILE_M, K_BLOCK,  # noqa: F401
                             MMA_K_FP4 as MMA_K, SF_PER_STEP, STEPS, TILE_N_CHOICES, Budget, budget, max_stages,
                             sf_columns, tmem_columns)
from .hardware import TMEM_COLUMNS, TMEM_LANES

#: Mistakes the model can make on purpose (``run_model(bug=...)``).
BUGS = (
    None,
    "wrong_scale_index",  # SFA read without the row-quarter term: rows 32..127 get rows 0..31's scales
    "no_accumulate_reset",  # ACCUMULATE never turned off: a tile adds onto TMEM garbage / the last tile
    "reset_every_kblock",  # ACCUMULATE off at the first MMA of *every* k-block: only the last k-block survives
    "sfb_not_switched",  # GEMM 2 run with SFB1: the kernel forgot to switch the SFB operand
    "no_warpx4",  # scales copied to lanes 0..31 only (32x128b without .warpx4)
    "sf_not_advanced",  # every MMA step of a k-block reads step 0's scale columns
    "sfb_not_shifted",  # tile_n 64 / 192: odd tiles read their SFB from the atom's first rows, not from row 64
)


# --------------------------------------------------------------------------------------
# The model
# --------------------------------------------------------------------------------------

_E2M1 = np.array(fp4.E2M1_VALUES, dtype=np.float32)


def _e4m3_lut() -> np.ndarray:
    import torch

    v = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float().numpy()
    return np.nan_to_num(v, nan=0.0).astype(np.float32)  # 0x7f / 0xff are NaN; never produced by the data


@dataclass
class ModelRun:
    """What :func:`run_model` computed: ``c`` (M, N) FP16, the tiles each CTA did, how many MMAs ran."""

    c: np.ndarray
    tile_n: int
    bug: str | None
    cta_tiles: list = field(default_factory=list)
    mmas: int = 0
    tmem: dict = field(default_factory=dict)


class _Cta:
    """One CTA's tensor memory: 128 lanes x 512 columns of 32 bits, seen as FP32 and as bytes."""

    def __init__(self, rng: np.random.Generator):
        # Real TMEM holds whatever the last kernel left: model it as garbage.
        self.words = rng.integers(0, 2 ** 32, size=(TMEM_LANES, TMEM_COLUMNS), dtype=np.uint64).astype(np.uint32)
        garbage = rng.normal(0, 1e3, size=(TMEM_LANES, TMEM_COLUMNS)).astype(np.float32)
        self.words[:] = garbage.view(np.uint32)

    @property
    def f32(self) -> np.ndarray:
        return self.words.view(np.float32)

    @property
    def bytes(self) -> np.ndarray:
        return self.words.view(np.uint8).reshape(TMEM_LANES, TMEM_COLUMNS, 4)  # byte 0 = least significant


def _rows(packed: np.ndarray, r0: int, rows: int, kb: int) -> np.ndarray:
    """TMA load of one k-block: ``rows`` rows of 128 packed bytes from row ``r0``, zeros past the end."""
    out = np.zeros((rows, K_BLOCK // 2), dtype=np.uint8)
    blk = packed[r0:r0 + rows, kb * (K_BLOCK // 2):(kb + 1) * (K_BLOCK // 2)]
    out[:blk.shape[0]] = blk
    return out


def _sf_atoms(flat: np.ndarray, rows_total: int, sf_k: int, row_block: int, kb: int, n_blocks: int) -> np.ndarray:
    """TMA load of one k-block's scales from the permuted tensor's memory: ``n_blocks`` x 4 atoms of 512 bytes.

    Returns ``(n_blocks, STEPS, 512)``: for 128-row block ``h`` of the tile and MMA step ``s``,
    atom ``(row_block + h, 4 kb + s)`` of the permuted layout (zeros past the tensor, as TMA fills).
    """
    rest_mn = fp4.ceil_div(rows_total, fp4.ATOM_MN)
    rest_k = fp4.ceil_div(sf_k, fp4.ATOM_K)
    out = np.zeros((n_blocks, STEPS, fp4.ATOM_BYTES), dtype=np.uint8)
    for h in range(n_blocks):
        rb = row_block + h
        if rb >= rest_mn:
            continue
        for s in range(STEPS):
            start = (rb * rest_k + kb * STEPS + s) * fp4.ATOM_BYTES
            out[h, s] = flat[start:start + fp4.ATOM_BYTES]
    return out


def _copy_sf_to_tmem(cta: _Cta, atoms: np.ndarray, col0: int, bug: str | None) -> None:
    """``tcgen05.cp 32x128b.warpx4`` of every atom: line r -> lane r of each sub-partition, 4 columns."""
    n_blocks = atoms.shape[0]
    quarters = 1 if bug == "no_warpx4" else 4
    for h in range(n_blocks):
        for s in range(STEPS):
            lines = atoms[h, s].reshape(32, 4, 4)  # (line r, column c, byte)
            col = col0 + s * 4 * n_blocks + h * 4
            for q in range(quarters):
                cta.bytes[q * 32:(q + 1) * 32, col:col + 4, :] = lines


def _mma_scales_a(cta: _Cta, col0: int, step: int, bug: str | None) -> np.ndarray:
    """The (128, 4) SFA bytes the MMA of ``step`` reads: lane i, column col0 + 4 step + (i % 128) // 32."""
    i = np.arange(TILE_M)
    quarter = np.zeros_like(i) if bug == "wrong_scale_index" else (i % 128) // 32
    s = 0 if bug == "sf_not_advanced" else step
    return cta.bytes[i, col0 + 4 * s + quarter, :]


def _mma_scales_b(cta: _Cta, col0: int, step: int, tile_n: int, shift: int, bug: str | None) -> np.ndarray:
    """The (4 quarters, tile_n, 4) SFB bytes each sub-partition reads for B's columns n.

    ``shift``: the tile's first B row within its 128-row atom (64 for odd tiles of
    ``tile_n`` 64 or 192). The TMA loads whole atoms, so the kernel moves the MMA's SFB
    address by ``shift // 32`` columns instead: row ``n`` of the tile is row
    ``shift + n`` of the loaded atoms.
    """
    n_blocks = fp4.ceil_div(tile_n, 128)
    n = shift + np.arange(tile_n)
    s = 0 if bug == "sf_not_advanced" else step
    col = col0 + s * 4 * n_blocks + (n // 128) * 4 + (n % 128) // 32
    return np.stack([cta.bytes[q * 32 + n % 32, col, :] for q in range(4)])


def _values(tile_bytes: np.ndarray, step: int) -> np.ndarray:
    """e2m1 values of one MMA step (64 K values = 32 bytes a row), low nibble first."""
    b = tile_bytes[:, step * (MMA_K // 2):(step + 1) * (MMA_K // 2)]
    codes = np.stack((b & 0xF, b >> 4), axis=-1).reshape(b.shape[0], MMA_K)
    return _E2M1[codes]


def _mma(cta: _Cta, acc_col: int, a_vals, sfa_bytes, b_vals, sfb_bytes, tile_n: int, accumulate: bool, lut):
    """One block-scaled MMA, 128 x tile_n x 64, into TMEM columns ``acc_col ..``; ``accumulate`` is ACCUMULATE."""
    sa = lut[sfa_bytes]  # (128, 4)
    a = a_vals * np.repeat(sa, fp4.SF_VEC, axis=1)  # (128, 64)
    d = np.empty((TILE_M, tile_n), dtype=np.float32)
    for q in range(4):  # each sub-partition: its 32 rows with its replica of the B scales
        sb = lut[sfb_bytes[q]]  # (tile_n, 4)
        b = b_vals * np.repeat(sb, fp4.SF_VEC, axis=1)
        d[q * 32:(q + 1) * 32] = a[q * 32:(q + 1) * 32] @ b.T
    acc = cta.f32[:, acc_col:acc_col + tile_n]
    if accumulate:
        acc += d
    else:
        acc[:] = d


def _silu_mul(acc1: np.ndarray, acc2: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return acc1 / (np.float32(1) + np.exp(-acc1)) * acc2


def _as_numpy(operands):
    """Validate; return sizes, the packed bytes (numpy) and the permuted scales' bytes in memory order.

    With a :class:`~gemmlab.nvfp4.DualGemmOperands` the model reads its permuted scale
    tensors (what the kernel is given); with a tuple it permutes the plain scales itself.
    """
    if isinstance(operands, fp4.DualGemmOperands):
        a, b1, b2, sfa, sfb1, sfb2 = operands.inputs()
        perms = (operands.sfa_perm, operands.sfb1_perm, operands.sfb2_perm)
    else:
        a, b1, b2, sfa, sfb1, sfb2 = operands
        perms = None
    m, n, k, l = fp4.check_operands(a, b1, b2, sfa, sfb1, sfb2)
    if l != 1:
        raise ValueError(f"L must be 1 (the kernel's batch); got L={l}")
    if perms is None:
        perms = tuple(fp4.permute_scales(t.cpu()) for t in (sfa, sfb1, sfb2))
    for name, t, rows in zip(("sfa_perm", "sfb1_perm", "sfb2_perm"), perms, (m, n, n)):
        fp4.check_permuted(name, t, rows, k, l)

    def packed(t):
        return fp4.as_bytes(t)[..., 0].cpu().contiguous().numpy()

    flats = [fp4.blocked_bytes(t.cpu()).numpy() for t in perms]
    return (m, n, k, packed(a), packed(b1), packed(b2), *flats)


def run_model(operands, tile_n: int = 128, num_ctas: int = 3, raster: str = "m", group: int = 8,
              bug: str | None = None, seed: int = 0) -> ModelRun:
    """Execute the SM100 kernel's data flow on the CPU; return C (M, N) FP16 and what ran.

    ``operands``: a :class:`gemmlab.nvfp4.DualGemmOperands` (the model reads its
    permuted scales, as the kernel does) or the tuple ``(a, b1, b2, sfa, sfb1, sfb2)``
    (plain scales, which the model permutes first; from then on it reads only the
    permuted bytes). ``tile_n``: N of the tile (a multiple
    of 16 up to 256). ``num_ctas``: persistent CTAs. ``bug``: one of :data:`BUGS`.
    ``seed``: the TMEM garbage.
    """
    from .scheduler import TileScheduler

    check_int("tile_n", tile_n, lo=16, hi=256, multiple_of=16)
    check_int("num_ctas", num_ctas, lo=1)
    check_choice("bug", bug, BUGS)
    m, n, k, a, b1, b2, sfa, sfb1, sfb2 = _as_numpy(operands)
    sf_k = k // fp4.SF_VEC
    k_blocks = k // K_BLOCK
    cols = tmem_columns(tile_n)
    if cols["used"] > TMEM_COLUMNS:
        raise ValueError(f"tile_n={tile_n} needs {cols['used']} TMEM columns; there are {TMEM_COLUMNS}")
    n_blocks = fp4.ceil_div(tile_n, 128)
    lut = _e4m3_lut()
    rng = np.random.default_rng(seed)
    sched = TileScheduler(fp4.ceil_div(m, TILE_M), fp4.ceil_div(n, tile_n), raster, group)
    ctas = min(num_ctas, sched.num_tiles)
    c = np.full((m, n), np.nan, dtype=np.float16)  # poisoned: an unwritten element fails the check
    run = ModelRun(c=c, tile_n=tile_n, bug=bug, tmem=cols)
    for cta_id in range(ctas):
        cta = _Cta(rng)
        tiles = sched.tiles_for(cta_id, ctas)
        run.cta_tiles.append(tiles)
        for mt, nt in tiles:
            first = True
            for kb in range(k_blocks):
                # TMA: one stage of shared memory
                sa = _rows(a, mt * TILE_M, TILE_M, kb)
                sb1 = _rows(b1, nt * tile_n, tile_n, kb)
                sb2 = _rows(b2, nt * tile_n, tile_n, kb)
                ssfa = _sf_atoms(sfa, m, sf_k, mt, kb, 1)
                row_block_b = nt * tile_n // 128  # the atoms holding the tile's B rows (tile_n 64, 192: from mid-atom)
                shift = 0 if bug == "sfb_not_shifted" else (nt * tile_n) % 128
                ssfb1 = _sf_atoms(sfb1, n, sf_k, row_block_b, kb, n_blocks)
                ssfb2 = _sf_atoms(sfb2, n, sf_k, row_block_b, kb, n_blocks)
                # tcgen05.cp: shared memory -> TMEM
                _copy_sf_to_tmem(cta, ssfa, cols["sfa"], bug)
                _copy_sf_to_tmem(cta, ssfb1, cols["sfb1"], bug)
                _copy_sf_to_tmem(cta, ssfb2, cols["sfb2"], bug)
                if bug == "reset_every_kblock":
                    first = True
                for s in range(STEPS):
                    av = _values(sa, s)
                    sfa_b = _mma_scales_a(cta, cols["sfa"], s, bug)
                    accumulate = (bug == "no_accumulate_reset") or not first
                    sfb_1 = _mma_scales_b(cta, cols["sfb1"], s, tile_n, shift, bug)
                    sfb_2 = sfb_1 if bug == "sfb_not_switched" else _mma_scales_b(cta, cols["sfb2"], s, tile_n, shift,
                                                                                    bug)
                    _mma(cta, cols["acc1"], av, sfa_b, _values(sb1, s), sfb_1, tile_n, accumulate, lut)
                    _mma(cta, cols["acc2"], av, sfa_b, _values(sb2, s), sfb_2, tile_n, accumulate, lut)
                    run.mmas += 2
                    first = False
            # epilogue: TMEM -> registers, gate, FP16, clipped store
            acc1 = cta.f32[:, cols["acc1"]:cols["acc1"] + tile_n].copy()
            acc2 = cta.f32[:, cols["acc2"]:cols["acc2"] + tile_n].copy()
            with np.errstate(over="ignore", invalid="ignore"):  # garbage (an injected bug) may overflow FP16
                out = _silu_mul(acc1, acc2).astype(np.float16)
            r0, c0 = mt * TILE_M, nt * tile_n
            rows, ncols = min(TILE_M, m - r0), min(tile_n, n - c0)
            c[r0:r0 + rows, c0:c0 + ncols] = out[:rows, :ncols]
    return run


def check_model(operands, **kwargs):
    """:func:`run_model` against :func:`gemmlab.nvfp4.reference`: the :class:`~gemmlab.nvfp4.CheckResult`."""
    import torch

    plain = operands.inputs() if isinstance(operands, fp4.DualGemmOperands) else operands
    ref = fp4.reference(*plain)[..., 0]
    run = run_model(operands, **kwargs)
    return fp4.check_close(torch.from_numpy(run.c), ref)
