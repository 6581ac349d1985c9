"""Chapter 11's measurements: the baselines, the bounds, a B200 prediction, and timing one shape.

The public call, :func:`gemmlab.gated_dual_gemm`, is :mod:`gemmlab.family.api`'s (its prepared launch
:func:`gemmlab.family.plan.prepare_gated`); this module is what every number of chapter 11 is measured with.

What it holds
    * The two baselines every measurement of chapter 11 stands next to:

      (a) :func:`reference_pipeline`: what a first attempt does: dequantize A, B1 and B2 to FP32 on every
          call, two FP32 ``torch.matmul``, ``silu(x) * y``, FP16. It is :func:`gemmlab.nvfp4.reference`
          with an output buffer.
      (b) the best stock path: :func:`prepare_stock` dequantizes the *weights* B1, B2 to BF16 once, ahead
          of time (exact: an e2m1 value times an e4m3 scale has at most 6 significant bits, BF16 has 8);
          :func:`stock_path` then, per call, dequantizes A only (it changes every call) to BF16, runs two
          cuBLAS BF16 GEMMs with FP32 output (``torch.mm(..., out_dtype=torch.float32)``: a BF16 result
          would round the products to 8 bits, 0.4 %, more than the checker's 0.1 %), and the gate as two
          elementwise kernels, ``silu`` in place and one ``torch.mul`` writing FP16 (no ``torch.compile``:
          it is not reliably available offline, so nothing fuses them further).

    * :func:`roofline`: the least time any kernel can take on a GPU: the packed FP4 bytes of A, B1, B2, their
      e4m3 scales and the FP16 C over the HBM bandwidth, or the FLOPs over the dense tensor-core peak,
      whichever is larger. The peak is FP4's on a B200 (what the SM100 kernel uses) and BF16's on Hopper
      (no FP4 tensor cores: the twin multiplies BF16). On a B200 the bytes decide the two 256-row shapes, and
      there they reproduce GPU MODE's speed-of-light figures (:data:`gemmlab.nvfp4.SOL_US`) to 0.3 %; the
      FLOPs decide the two 512-row shapes, where GPU MODE's figures imply 6.9 PFLOP/s
      (:func:`roofline_table` shows both).
    * :func:`predict_b200`: a PREDICTION of the SM100 kernel's time from chapter 05's pipeline simulator
      with chapter 10's calibration (never a measurement: no Blackwell GPU was used).
"""
from __future__ import annotations

from dataclasses import dataclass

from .. import nvfp4 as fp4
from .. import tiers
from ..checks import check_choice, check_int
from ..family.api import gated_dual_gemm
from ..family.configs import (A16_TILE_NS, DECODE_MAX_TOKENS, GATED_TILE_M as TILE_M, A16Config, DecodeConfig,
                              PipelinedConfig, W16Config, a16_max_stages)
from ..family.heuristic_gated import choose_decode_config, choose_tile_n
from ..family.plan import decode_clusters, prepare_gated
from ..family.problem import check_gated_arguments, check_gated_output

#: The best public result for GPU MODE's nvfp4_dual_gemm on a B200 (geomean of the four shapes), microseconds.
BEST_PUBLIC_US = 13.3


# --------------------------------------------------------------------------------------
# Baseline (a): the reference pipeline, dequantizing everything on every call
# --------------------------------------------------------------------------------------


def reference_pipeline(a, b1, b2, sfa, sfb1, sfb2, out=None):
    """Baseline (a): dequantize A, B1, B2 to FP32 on every call, two FP32 ``torch.matmul``, ``silu(x) * y``, FP16.

    Any device (the CPU too). Returns ``out`` ((M, N, 1) FP16), allocated when None.
    """
    import torch

    m, n, _ = check_gated_arguments(a, b1, b2, sfa, sfb1, sfb2, out)
    fa, f1, f2 = (fp4.dequantize(p[..., 0], s[..., 0]) for p, s in ((a, sfa), (b1, sfb1), (b2, sfb2)))
    y1 = torch.matmul(fa, f1.T)
    y2 = torch.matmul(fa, f2.T)
    if out is None:
        out = torch.empty((m, n, 1), dtype=torch.float16, device=a.device)
    out[..., 0] = fp4.silu_mul(y1, y2)
    return out


# --------------------------------------------------------------------------------------
# Baseline (b): weights dequantized to BF16 once, then cuBLAS
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StockWeights:
    """B1 and B2 dequantized to BF16 ahead of time and stacked, (2N, K): what :func:`stock_path` multiplies by.

    One (2N, K) matrix instead of two (N, K) ones is what a serving stack does with gate and up
    projections: one cuBLAS call over 2N columns fills the GPU better than two over N.
    """

    w12: object

    @property
    def n(self) -> int:
        return self.w12.shape[0] // 2

    @property
    def w1(self):
        return self.w12[: self.n]

    @property
    def w2(self):
        return self.w12[self.n:]

    @property
    def nbytes(self) -> int:
        return self.w12.numel() * self.w12.element_size()


_PAIR_TABLES: dict = {}


def _pair_table(device):
    """BF16 (256, 2): the two e2m1 values of every byte (low nibble first), one table per device."""
    import torch

    key = str(device)
    if key not in _PAIR_TABLES:
        vals = torch.tensor(fp4.E2M1_VALUES, dtype=torch.float32)
        idx = torch.arange(256)
        _PAIR_TABLES[key] = torch.stack([vals[idx & 15], vals[idx >> 4]], dim=1).to(torch.bfloat16).to(device)
    return _PAIR_TABLES[key]


def dequantize_bf16(packed, sf):
    """Packed FP4 ``(rows, K/2, 1)`` with plain scales ``(rows, K/16, 1)`` as BF16 ``(rows, K)``: exact.

    Four torch operations (a byte-pair table lookup, the scales to BF16, one multiply): the fastest stock
    way we found, used per call by baseline (b). Every product is exact in BF16 (2 + 4 significant bits).
    """
    import torch

    p = fp4.as_bytes(packed)[..., 0]
    rows = p.shape[0]
    pairs = _pair_table(p.device)[p.long()]  # (rows, K/2, 2)
    s = sf[..., 0].view(torch.float8_e4m3fn).to(torch.bfloat16)
    return (pairs.view(rows, -1, fp4.SF_VEC) * s[..., None]).view(rows, -1)


def prepare_stock(b1, b2, sfb1, sfb2) -> StockWeights:
    """Baseline (b)'s one-time step: B1 and B2 as one BF16 ``(2N, K)`` matrix (exact, 3.6x the NVFP4 bytes)."""
    import torch

    for name, t in (("b1", b1), ("b2", b2)):
        fp4._check_packed(name, t, torch)
    if tuple(b2.shape) != tuple(b1.shape):
        raise ValueError(f"b1 and b2 must have the same shape; got {tuple(b1.shape)} and {tuple(b2.shape)}")
    n, k, l = b1.shape[0], 2 * b1.shape[1], b1.shape[2]
    fp4.check_problem(n, n, k, l)
    if l != 1:
        raise ValueError(f"L must be 1; got L={l}")
    fp4._check_sf("sfb1", sfb1, n, k, l, torch)
    fp4._check_sf("sfb2", sfb2, n, k, l, torch)
    return StockWeights(torch.cat([dequantize_bf16(b1, sfb1), dequantize_bf16(b2, sfb2)], dim=0))


def bf16_gemm_fp32(x, w):
    """``x @ w.T`` for BF16 ``x`` (M, K) and ``w`` (N, K), FP32 out: one cuBLAS BF16 GEMM on a GPU.

    ``torch.mm(..., out_dtype=torch.float32)`` keeps the FP32 accumulator instead of rounding it to BF16.
    Where that overload is missing (torch's CPU build has no BF16 -> FP32 ``mm``), the FP32 product of the
    same BF16 values: the same numbers, computed differently.
    """
    import torch

    if x.device.type == "cuda":
        return torch.mm(x, w.T, out_dtype=torch.float32)
    return torch.mm(x.float(), w.float().T)


def stock_path(a, sfa, weights: StockWeights, out=None):
    """Baseline (b), per call: A to BF16, one cuBLAS BF16 GEMM over [B1; B2] (FP32 out), ``silu`` in place, one
    ``mul`` to FP16.

    ``a`` (M, K/2, 1) packed FP4 with ``sfa`` (M, K/16, 1); ``weights`` from :func:`prepare_stock`.
    Returns ``out`` ((M, N, 1) FP16), allocated when None.
    """
    import torch

    if not isinstance(weights, StockWeights):
        raise TypeError(f"weights must be a StockWeights (from prepare_stock); got {type(weights).__name__}")
    fp4._check_packed("a", a, torch)
    m, k = a.shape[0], 2 * a.shape[1]
    n = weights.n
    if tuple(weights.w12.shape) != (2 * n, k):
        raise ValueError(f"weights must be one (2N, K={k}) tensor, K as a's; got {tuple(weights.w12.shape)}")
    fp4._check_sf("sfa", sfa, m, k, 1, torch)
    check_gated_output(out, m, n)
    for name, t in (("sfa", sfa), ("weights", weights.w12), ("out", out)):
        if t is not None and t.device != a.device:
            raise ValueError(f"{name} must be on a's device {a.device}; got {t.device}")
    x = dequantize_bf16(a, sfa)
    y = bf16_gemm_fp32(x, weights.w12)  # (M, 2N) FP32: [A B1^T | A B2^T]
    if out is None:
        out = torch.empty((m, n, 1), dtype=torch.float16, device=a.device)
    y1 = y[:, :n]
    torch.nn.functional.silu(y1, inplace=True)
    torch.mul(y1, y[:, n:], out=out[..., 0])
    return out


# --------------------------------------------------------------------------------------
# Bounds: the roofline and a B200 prediction
# --------------------------------------------------------------------------------------


def problem_bytes(m: int, n: int, k: int) -> dict:
    """Bytes that must cross HBM at least once: packed A, B1, B2 (half a byte a value), their e4m3 scales
    (one byte per 16 values of every row), and C in FP16."""
    m, n, k, _ = fp4.check_problem(m, n, k)
    d = dict(a=m * k // 2, b1=n * k // 2, b2=n * k // 2, scales=(m + 2 * n) * (k // fp4.SF_VEC), c=2 * m * n)
    d["total"] = sum(d.values())
    return d


def problem_flops(m: int, n: int, k: int) -> int:
    """Multiply-adds of both products, two FLOPs each: ``2 * 2 * M * N * K`` (the gate is negligible)."""
    m, n, k, _ = fp4.check_problem(m, n, k)
    return 4 * m * n * k


def roofline(m: int, n: int, k: int, spec=None) -> dict:
    """The least time for M x N x K on ``spec`` (a :class:`gemmlab.hardware.GPUSpec`, default B200), microseconds.

    ``memory_us``: :func:`problem_bytes` over the HBM bandwidth; ``compute_us``: :func:`problem_flops` over
    the dense FP4 peak where the GPU has FP4 tensor cores, else the dense BF16 peak (``peak``: which one).
    ``bound_us`` is the larger, ``bound`` names it.
    """
    from ..hardware import B200, GPUSpec

    spec = B200 if spec is None else spec
    if not isinstance(spec, GPUSpec):
        raise TypeError(f"spec must be a gemmlab.hardware.GPUSpec; got {type(spec).__name__}")
    nbytes = problem_bytes(m, n, k)["total"]
    flops = problem_flops(m, n, k)
    peak = "fp4" if spec.fp4_tflops else "bf16"
    memory_us = nbytes / (spec.hbm_tbps * 1e12) * 1e6
    compute_us = flops / (spec.peak_tflops(peak) * 1e12) * 1e6
    bound = "memory" if memory_us >= compute_us else "compute"
    return dict(m=m, n=n, k=k, gpu=spec.short, bytes=nbytes, flops=flops, peak=peak, memory_us=memory_us,
                compute_us=compute_us, bound_us=max(memory_us, compute_us), bound=bound)


def roofline_table(spec=None, shapes=fp4.BENCHMARK_SHAPES) -> list[dict]:
    """:func:`roofline` for each shape, with GPU MODE's speed of light beside it where the shape is theirs.

    ``sol_tbps`` and ``sol_pflops``: the bandwidth and the FLOP rate GPU MODE's figure implies if it is all
    bytes or all FLOPs (the one that matches a datasheet-like number tells which bound they used).
    """
    sol = dict(zip(fp4.BENCHMARK_SHAPES, fp4.SOL_US))
    rows = []
    for m, n, k in shapes:
        r = {**roofline(m, n, k, spec), "sol_us": sol.get((m, n, k)), "sol_tbps": None, "sol_pflops": None}
        if r["sol_us"]:
            r["sol_tbps"] = r["bytes"] / (r["sol_us"] * 1e-6) / 1e12
            r["sol_pflops"] = r["flops"] / (r["sol_us"] * 1e-6) / 1e15
        rows.append(r)
    return rows


def _subtile_cycles(cal) -> float:
    """The calibration's epilogue cost per 32-column sub-tile (older calibrations hold it per 8 sub-tiles)."""
    if hasattr(cal, "subtile_cycles"):
        return cal.subtile_cycles
    return cal.epilogue_cycles / 8


def predict_b200(shape, tile_n: int = 128, stages: int | None = None, cal=None) -> dict:
    """A PREDICTION (not a measurement) of the SM100 dual GEMM on a B200 for ``shape = (m, n, k)``, microseconds.

    Chapter 10's recipe, through chapter 05's simulator: the busiest CTA's tiles, one CTA per 128 x
    ``tile_n`` tile (``ctas`` of them, at most one per SM), each k-block (256 values of K) holding a stage
    while the tensor pipe does both GEMMs' ``2 x 2 x 128 x tile_n x 256`` FLOPs at the SM's share of the
    dense FP4 peak, scaled by the clock fraction the calibration found on Hopper
    (:func:`gemmlab.measure.calibration.b200_clock_fraction`); loads in flight for the calibration's latency, all
    CTAs together at 85 % of HBM; ``stages`` as many as shared memory holds
    (:func:`gemmlab.dual_gemm_model.max_stages`); the calibration's launch time. One accumulator stage (at
    ``tile_n`` = 128 a second stage of both FP32 accumulators would take all 512 TMEM columns and leave none
    for the scales), so the epilogue (the calibration's cycles per 32-column sub-tile) runs after each tile.
    Returns ``low_us`` / ``predicted_us`` / ``high_us`` (the calibration's +-10 %, never below the roofline)
    and the numbers behind them: ``kblock_us`` (tensor work per k-block), ``ring_kblock_us`` (what a ring of
    ``stages`` can sustain per k-block when every load waits ``latency_us``), ``transfer_us`` (a k-block's
    share of the bandwidth).
    """
    from .calibration import CALIBRATION, SM90_SPEC_GHZ, TOLERANCE, Calibration, b200_clock_fraction
    from ..dual_gemm_model import EPI_N, TILE_N_CHOICES, budget, max_stages
    from ..hardware import B200
    from ..simulator import check_work, simulate

    if not isinstance(shape, (tuple, list)) or len(shape) != 3:
        raise ValueError(f"shape must be (m, n, k); got {shape!r}")
    m, n, k, _ = fp4.check_problem(*shape)
    tile_n = check_choice("tile_n", tile_n, TILE_N_CHOICES)
    cal = CALIBRATION if cal is None else cal
    if not isinstance(cal, Calibration):
        raise TypeError(f"cal must be a gemmlab.measure.calibration.Calibration; got {type(cal).__name__}")
    most = max_stages(tile_n)
    stages = most if stages is None else stages
    stages = check_int("stages", stages, lo=1, hi=most)
    tiles = fp4.ceil_div(m, TILE_M) * fp4.ceil_div(n, tile_n)
    ctas = min(B200.sms, tiles)
    waves = fp4.ceil_div(tiles, ctas)
    k_blocks = k // fp4.K_MULTIPLE
    check_work(waves, k_blocks)  # the busiest CTA's k-blocks, refused before the list of them is built
    frac = b200_clock_fraction(cal)
    sm_flops = B200.fp4_tflops * 1e12 * frac / B200.sms
    kblock_s = 2 * 2 * TILE_M * tile_n * fp4.K_MULTIPLE / sm_flops
    roof = roofline(m, n, k, B200)
    transfer_s = roof["bytes"] / (tiles * k_blocks) / (B200.hbm_tbps * 1e12 * cal.hbm_efficiency / ctas)
    epi_s = _subtile_cycles(cal) * (tile_n // EPI_N) / (SM90_SPEC_GHZ * frac * 1e9)
    tl = simulate(stages, [k_blocks] * waves, cal.load_latency_s, kblock_s, transfer_time=transfer_s,
                  epilogue_time=epi_s, epilogue="inline")
    mid = (tl.total + cal.launch_s) * 1e6
    return dict(m=m, n=n, k=k, tile_n=tile_n, stages=stages, tiles=tiles, ctas=ctas, waves=waves,
                k_blocks=k_blocks, clock_fraction=frac, smem_bytes=budget(tile_n, stages).smem_total,
                kblock_us=kblock_s * 1e6, transfer_us=transfer_s * 1e6, latency_us=cal.load_latency_s * 1e6,
                ring_kblock_us=(cal.load_latency_s + kblock_s) / stages * 1e6, epilogue_us=epi_s * 1e6,
                launch_us=cal.launch_s * 1e6,
                low_us=max(roof["bound_us"], mid * (1 - TOLERANCE)), predicted_us=mid,
                high_us=mid * (1 + TOLERANCE), roofline_us=roof["bound_us"])


def prediction_table(shapes=fp4.BENCHMARK_SHAPES, tile_ns=(64, 128)) -> list[dict]:
    """:func:`predict_b200` for each shape and tile width, with GPU MODE's speed of light: PREDICTIONS."""
    sol = dict(zip(fp4.BENCHMARK_SHAPES, fp4.SOL_US))
    return [{**predict_b200(s, tile_n), "sol_us": sol.get(tuple(s))} for s in shapes for tile_n in tile_ns]


# --------------------------------------------------------------------------------------
# Timing one shape (the benchmark script and the notebook use the same function)
# --------------------------------------------------------------------------------------


def _copy_operands(ops):
    """Another copy of the same problem in other memory (FP4 copied as bytes)."""
    def cp(t):
        return fp4.as_fp4x2(fp4.as_bytes(t).clone()) if t.dtype in fp4.fp4_packed_dtypes() else t.clone()

    return fp4.DualGemmOperands(*(cp(t) for t in (ops.a, ops.b1, ops.b2, ops.sfa, ops.sfb1, ops.sfb2)),
                                None, None, None, cp(ops.c))


def prepare_simple(a, b1, b2, sfa, sfb1, sfb2, out):
    """The simple (first-draft) Hopper twin as a zero-argument launch on these tensors (sm90 only)."""
    from ..kernels import dual_gemm_sm90
    from ..compile import launcher

    check_gated_arguments(a, b1, b2, sfa, sfb1, sfb2, out)
    tiers.require_tier("sm90", "gemmlab.measure.dual_gemm.prepare_simple")
    return launcher(dual_gemm_sm90.dual_host(dual_gemm_sm90.DualSm90Config()),
                    *dual_gemm_sm90.operands_2d(a, b1, b2, sfa, sfb1, sfb2, out))


def a16_configs() -> list:
    """The A16 twin's configurations the benchmarks try: each tile width with its deepest ring, then the widths that
    take two converter warpgroups with them."""
    from ..family.heuristic_gated import A16_TWO_CONVERTERS

    return ([A16Config(tile_n, a16_max_stages(tile_n)) for tile_n in A16_TILE_NS]
            + [A16Config(tile_n, a16_max_stages(tile_n), converters=2) for tile_n in A16_TWO_CONVERTERS])


def _ok_on_poisoned(launch, base, ref) -> bool:
    """One launch writing ``base.c``, poisoned with NaN first, then checked against ``ref`` (the FP32 reference)."""
    import torch

    base.c.fill_(float("nan"))
    launch()
    torch.cuda.synchronize()
    return fp4.check_close(base.c, ref).ok


def _timing_setup(m, n, k, rounds, per_round, seed, what: str) -> tuple:
    """The checks (before the tier), this GPU's spec, and the input copies every timing of one shape rotates
    over (enough to span 4x the L2; the first, ``base``, has a NaN-poisoned output). Returns
    ``(m, n, k, spec, base, sets)``."""
    import torch

    from . import bench
    from .. import hardware

    m, n, k, _ = fp4.check_problem(m, n, k)
    check_int("rounds", rounds, lo=1)
    check_int("per_round", per_round, lo=1)
    tiers.require_tier("gpu", f"gemmlab.measure.dual_gemm.{what}")
    spec = hardware.device_spec(torch.cuda.current_device()) or hardware.H100
    base = fp4.generate(m, n, k, seed=seed, device="cuda")
    nsets = bench.input_sets(problem_bytes(m, n, k)["total"], spec.l2_mib * 2 ** 20)
    return m, n, k, spec, base, [base] + [_copy_operands(base) for _ in range(nsets - 1)]


def time_case(m: int, n: int, k: int, *, rounds: int = 10, per_round: int = 5, seed: int = 0,
              simple: bool = False) -> dict:
    """Time M x N x K on this GPU: the public call, its prepared launch, baselines (a) and (b), side by side.

    Inputs are rotated over enough copies to span 4x the L2 (:func:`gemmlab.measure.bench.input_sets`), the same
    copies for every competitor; :func:`gemmlab.measure.bench.time_interleaved` times the four in rotating rounds
    (what a caller waits for, Python included), then the prepared launch and (b) again with the queue
    primed (``*_kernel*``: the kernels alone). (b)'s BF16 weights are made before timing, once per copy.
    Both outputs are checked against the FP32 reference first. Returns one row (microseconds, speed-ups).
    """
    import torch

    from . import bench

    m, n, k, spec, base, sets = _timing_setup(m, n, k, rounds, per_round, seed, "time_case")
    nsets = len(sets)
    weights = [prepare_stock(s.b1, s.b2, s.sfb1, s.sfb2) for s in sets]  # ahead of time: not timed
    out_a = [torch.empty_like(s.c) for s in sets]
    out_b = [torch.empty_like(s.c) for s in sets]
    ref = fp4.reference(*base.inputs())
    gated_dual_gemm(*base.inputs(), out=base.c)  # compiles
    torch.cuda.synchronize()
    res = fp4.check_close(base.c, ref)
    res_b = fp4.check_close(stock_path(base.a, base.sfa, weights[0], out=out_b[0]), ref)
    del ref
    launches = {
        "gemmlab": [lambda s=s: gated_dual_gemm(*s.inputs(), out=s.c) for s in sets],
        "prepared": [prepare_gated(*s.inputs(), out=s.c) for s in sets],
        "reference_a": [lambda s=s, o=o: reference_pipeline(*s.inputs(), out=o) for s, o in zip(sets, out_a)],
        "stock_b": [lambda s=s, w=w, o=o: stock_path(s.a, s.sfa, w, out=o) for s, w, o in zip(sets, weights, out_b)],
    }
    t = bench.time_interleaved(launches, rounds=rounds, per_round=per_round, warmup=3)
    kernels = {"prepared_kernel": launches["prepared"], "stock_b_kernels": launches["stock_b"]}
    if simple:  # chapter 11's first draft, for the ladder: correct, but the tensor cores wait on every slice
        kernels["simple_kernel"] = [prepare_simple(*s.inputs(), out=o) for s, o in zip(sets, out_a)]
    tk = bench.time_interleaved(kernels, rounds=rounds, per_round=per_round, warmup=3, gpu_only=True)
    roof = roofline(m, n, k, spec)
    row = dict(m=m, n=n, k=k, sets=nsets, ok=res.ok, max_abs_err=res.max_abs_err, stock_ok=res_b.ok,
               stock_max_abs_err=res_b.max_abs_err, roofline_us=roof["bound_us"], roofline_bound=roof["bound"],
               b200_sol_us=dict(zip(fp4.BENCHMARK_SHAPES, fp4.SOL_US)).get((m, n, k)),
               stock_weight_bytes=weights[0].nbytes, nvfp4_bytes=roof["bytes"])
    flops = problem_flops(m, n, k)
    for name, v in list(t.items()) + list(tk.items()):
        row[f"{name}_us"] = v["median_ms"] * 1e3
        row[f"{name}_round_us"] = [x * 1e3 for x in v["round_ms"]]
        row[f"{name}_tflops"] = flops / (v["median_ms"] * 1e-3) / 1e12
    row["vs_a"] = row["reference_a_us"] / row["gemmlab_us"]
    row["vs_b"] = row["stock_b_us"] / row["gemmlab_us"]
    row["vs_b_prepared"] = row["stock_b_us"] / row["prepared_us"]
    row["vs_b_kernel"] = row["stock_b_kernels_us"] / row["prepared_kernel_us"]
    row["of_roofline"] = row["roofline_us"] / row["prepared_kernel_us"]
    if simple:
        row["vs_simple_kernel"] = row["simple_kernel_us"] / row["prepared_kernel_us"]
    return row


# --------------------------------------------------------------------------------------
# Against the path a Hopper user would otherwise take: BF16 activations, BF16 weights made once
# --------------------------------------------------------------------------------------

#: The shapes of the BF16-path comparison: GPU MODE's four, decode (M = 64, 128), prefill-sized M (1024, 2048), a wide
#: FFN (N = 14336, Llama-3 8B's and Mistral 7B's intermediate size), and three M that are not powers of two (200, 384,
#: 640) between the decode and prefill regimes.
BF16_PATH_SHAPES = (*fp4.BENCHMARK_SHAPES, (64, 4096, 7168), (128, 4096, 7168), (1024, 4096, 7168),
                    (2048, 4096, 7168), (128, 14336, 4096), (2048, 14336, 4096), (200, 14336, 4096),
                    (384, 4096, 7168), (640, 3072, 4096))


def bf16_path(x, w12, h, n: int):
    """What a Hopper user holding an NVFP4 checkpoint would otherwise run: BF16 activations ``x`` (M, K), the
    weights dequantized once to one BF16 ``w12`` (2N, K) (``nn.Linear``'s layout), one cuBLAS GEMM into ``h``
    (M, 2N), then ``silu(h[:, :N]) * h[:, N:]`` in torch (BF16, two elementwise kernels). Returns the gate."""
    import torch

    torch.nn.functional.linear(x, w12, out=h)
    return torch.nn.functional.silu(h[:, :n]) * h[:, n:]


def _bf16_path_inputs(base, m: int, n: int, k: int, spec) -> list[tuple]:
    """The BF16 path's inputs for ``base``'s M x N x K problem: ``(x, w12, h)`` triples (BF16 activations, the BF16
    weights made once and copied, the output), enough of them to span 4x the L2 of ``spec``."""
    import torch

    from . import bench

    w12 = prepare_stock(base.b1, base.b2, base.sfb1, base.sfb2).w12
    sets = bench.input_sets(2 * (m + 2 * n) * k, spec.l2_mib * 2 ** 20)
    return [(dequantize_bf16(base.a, base.sfa), w12 if i == 0 else w12.clone(),
             torch.empty(m, 2 * n, dtype=torch.bfloat16, device="cuda")) for i in range(sets)]


def time_vs_bf16(m: int, n: int, k: int, *, rounds: int = 10, per_round: int = 5, seed: int = 0) -> dict:
    """Time M x N x K against :func:`bf16_path`: the public call and its prepared launch, the BF16 path and its
    GEMM alone, interleaved as callers see them (:func:`gemmlab.measure.bench.time_interleaved`, Python
    included), then the same with the queue primed (``*_kernel*``: the GPU's time alone). Inputs rotate over
    enough copies to span 4x the L2 (the BF16 weights get their own copies: 3.6x the NVFP4 bytes). Our output is
    checked against the FP32 reference on a poisoned buffer first. Returns one row: microseconds, the ratios
    ``bf16 / ours`` (above 1: ours is faster), and the two floors on this GPU: the NVFP4 bytes over the HBM
    bandwidth and the FLOPs over the dense BF16 peak."""
    import torch

    from . import bench

    m, n, k, spec, base, sets = _timing_setup(m, n, k, rounds, per_round, seed, "time_vs_bf16")
    nsets = len(sets)
    ref = fp4.reference(*base.inputs())
    gated_dual_gemm(*base.inputs(), out=base.c)  # compiles, then checked on the poisoned buffer
    torch.cuda.synchronize()
    res = fp4.check_close(base.c, ref)
    triples = _bf16_path_inputs(base, m, n, k, spec)
    bsets = len(triples)
    launches = {
        "gemmlab": [lambda s=s: gated_dual_gemm(*s.inputs(), out=s.c) for s in sets],
        "prepared": [prepare_gated(*s.inputs(), out=s.c) for s in sets],
        "bf16_path": [lambda x=x, w=w, h=h: bf16_path(x, w, h, n) for x, w, h in triples],
        "bf16_gemm": [lambda x=x, w=w, h=h: torch.nn.functional.linear(x, w, out=h) for x, w, h in triples],
    }
    t = bench.time_interleaved(launches, rounds=rounds, per_round=per_round, warmup=3)
    kernels = {f"{name}_kernel": fns for name, fns in launches.items() if name != "gemmlab"}
    chosen = prepare_gated(*base.inputs(), out=base.c).plan.config

    def prepared(cfg):  # a configuration's prepared launch on every input set
        return [prepare_gated(*s.inputs(), out=s.c, config=cfg) for s in sets]

    if not isinstance(chosen, PipelinedConfig):  # the decode or the A16 twin was chosen: the fast twin beside it
        kernels["fast_twin_kernel"] = prepared(PipelinedConfig(tile_n=choose_tile_n(m, n, spec.sms)))
    decode_ok = dec = None
    alt_ok = alt = None
    if isinstance(chosen, (A16Config, W16Config)):  # the other large-M form beside: the A16 twin or the W16 route
        alt = other_large_m_form(chosen, m, n, k, spec)
        if alt is not None:
            alt_ok = _ok_on_poisoned(prepare_gated(*base.inputs(), out=base.c, config=alt), base, ref)
            if alt_ok:
                kernels["other_form_kernel"] = prepared(alt)
    if m <= DECODE_MAX_TOKENS and not isinstance(chosen, DecodeConfig):  # the decode twin beside, checked first
        dec = choose_decode_config(m, n, k, spec.sms, decode_clusters())
        decode_ok = _ok_on_poisoned(prepare_gated(*base.inputs(), out=base.c, config=dec), base, ref)
        if decode_ok:
            kernels["decode_twin_kernel"] = prepared(dec)
    del ref
    tk = bench.time_interleaved(kernels, rounds=rounds, per_round=per_round, warmup=3, gpu_only=True)
    bound = roofline(m, n, k, spec)  # a Hopper spec: the BF16 peak
    row = dict(m=m, n=n, k=k, sets=nsets, bf16_sets=bsets, ok=res.ok, max_abs_err=res.max_abs_err,
               decode_twin=None if decode_ok is None else dict(config=repr(dec), ok=decode_ok),
               other_form=None if alt_ok is None else dict(config=repr(alt), ok=alt_ok),
               nvfp4_bytes=bound["bytes"], bf16_weight_bytes=triples[0][1].nbytes,
               fp4_bytes_us=bound["memory_us"], compute_us=bound["compute_us"], config=repr(chosen))
    for name, v in list(t.items()) + list(tk.items()):
        row[f"{name}_us"] = v["median_ms"] * 1e3
        row[f"{name}_round_us"] = [x * 1e3 for x in v["round_ms"]]
    row["vs_bf16_path"] = row["bf16_path_us"] / row["gemmlab_us"]
    row["vs_bf16_path_prepared"] = row["bf16_path_us"] / row["prepared_us"]
    row["vs_bf16_path_kernel"] = row["bf16_path_kernel_us"] / row["prepared_kernel_us"]
    row["vs_bf16_gemm"] = row["bf16_gemm_us"] / row["gemmlab_us"]
    row["of_floor"] = max(row["fp4_bytes_us"], row["compute_us"]) / row["prepared_kernel_us"]
    if "fast_twin_kernel_us" in row:
        row["vs_fast_twin_kernel"] = row["fast_twin_kernel_us"] / row["prepared_kernel_us"]
    if "decode_twin_kernel_us" in row:
        row["decode_twin_vs_bf16_path_kernel"] = row["bf16_path_kernel_us"] / row["decode_twin_kernel_us"]
    if "other_form_kernel_us" in row:
        row["vs_other_form_kernel"] = row["other_form_kernel_us"] / row["prepared_kernel_us"]
    return row


def other_large_m_form(chosen, m: int, n: int, k: int, spec):
    """Beside the heuristic's A16 twin, the W16 route's best configuration (None where it has none); beside the W16
    route, the A16 twin's: what the benchmarks time next to the public call's choice."""
    from ..family.heuristic_gated import choose_a16, w16_candidate
    from ..family.heuristic_sm90 import model_for

    if isinstance(chosen, W16Config):
        return choose_a16(m, n, k, spec.sms)
    cand = w16_candidate(m, n, k, spec.sms, model_for(spec))
    return None if cand is None else cand[0]


#: The decode sweep's shapes: M from one token to the twin's 128 (96: two MMA warpgroups still fit), on three weight
#: shapes (DeepSeek-V3's and GPU MODE's 4096 x 7168, GPU MODE's 3072 x 4096, and a wide FFN, 14336 x 4096).
DECODE_SWEEP_SHAPES = tuple((m, n, k) for n, k in ((4096, 7168), (3072, 4096), (14336, 4096))
                            for m in (1, 32, 64, 96, 128))


def _sweep(m, n, k, make_configs, rounds, per_round, seed, what: str, stock: bool = False) -> tuple:
    """Each of ``make_configs(spec)`` (``spec``: this GPU's :class:`~gemmlab.hardware.GPUSpec`) at M x N x K, kernels
    alone (``gpu_only``), on inputs rotated over 4x the L2; each first checked on a NaN-poisoned output against the
    FP32 reference (one that fails is recorded with ``ok`` False and not timed). ``stock``: the BF16 path
    (:func:`bf16_path`, BF16 weights made once) timed beside them as the row ``"bf16_path"``. Returns
    ``(m, n, k, rows, spec)`` (the sizes as plain ints), each row a configuration's ``config``, ``ok`` and
    ``kernel_us``."""
    from . import bench

    m, n, k, spec, base, sets = _timing_setup(m, n, k, rounds, per_round, seed, what)
    ref = fp4.reference(*base.inputs())
    rows, kernels = [], {}
    for cfg in make_configs(spec):
        ok = _ok_on_poisoned(prepare_gated(*base.inputs(), out=base.c, config=cfg), base, ref)
        rows.append(dict(config=repr(cfg), ok=ok))
        if ok:
            kernels[repr(cfg)] = [prepare_gated(*s.inputs(), out=s.c, config=cfg) for s in sets]
    del ref
    if stock:
        kernels["bf16_path"] = [lambda x=x, w=w, h=h: bf16_path(x, w, h, n)
                                for x, w, h in _bf16_path_inputs(base, m, n, k, spec)]
        rows.append(dict(config="bf16_path", ok=True))
    t = bench.time_interleaved(kernels, rounds=rounds, per_round=per_round, warmup=2, gpu_only=True)
    for row in rows:
        if row["config"] in t:
            row["kernel_us"] = t[row["config"]]["median_ms"] * 1e3
    return m, n, k, rows, spec


def sweep_decode(m: int, n: int, k: int, *, rounds: int = 5, per_round: int = 5, seed: int = 0) -> dict:
    """Every decode-twin configuration at M x N x K (:func:`~gemmlab.family.heuristic_gated.decode_candidates`)
    beside the fast twin the heuristic would pick, kernels alone (:func:`_sweep`: each checked on a poisoned output
    first). Returns ``{"m", "n", "k", "chosen", "clusters", "rows": [...]}`` (``chosen``:
    :func:`choose_decode_config`'s pick on this GPU's cluster capacity ``clusters``), each row a configuration's
    ``config``, ``ok`` and ``kernel_us``."""
    from ..family.heuristic_gated import decode_candidates

    def configs(spec):
        return [PipelinedConfig(tile_n=choose_tile_n(m, n, spec.sms))] + decode_candidates(m, k)

    m, n, k, rows, spec = _sweep(m, n, k, configs, rounds, per_round, seed, "sweep_decode")
    clusters = decode_clusters()
    return dict(m=m, n=n, k=k, chosen=repr(choose_decode_config(m, n, k, spec.sms, clusters)), rows=rows,
                clusters=clusters, fp4_bytes_us=roofline(m, n, k, spec)["memory_us"])


#: The A16 sweep's shapes: M from 200 to 1024 (200, 384 and 640 not powers of two) on four weight shapes (GPU MODE's
#: 4096 x 7168, 3072 x 4096 and 3072 x 7168, and a wide FFN, 14336 x 4096).
A16_SWEEP_SHAPES = tuple((m, n, k) for n, k in ((4096, 7168), (3072, 4096), (3072, 7168), (14336, 4096))
                         for m in (200, 256, 384, 512, 640, 1024))


#: The swap twin's sweep shapes: M from 64 to 1024 (200, 384 and 640 not powers of two) on three weight shapes (GPU
#: MODE's 4096 x 7168 and 3072 x 4096, and a wide FFN, 14336 x 4096).
SWAP_SWEEP_SHAPES = tuple((m, n, k) for n, k in ((4096, 7168), (3072, 4096), (14336, 4096))
                          for m in (64, 128, 200, 256, 384, 512, 640, 1024))


#: The W16 sweep's shapes: M from 512 to 4096 (768, 1536 and 3072 not powers of two) on three weight shapes (GPU
#: MODE's 4096 x 7168 and 3072 x 4096, and a wide FFN, 14336 x 4096): where the heuristic chooses between the A16 twin
#: and the W16 route.
W16_SWEEP_SHAPES = tuple((m, n, k) for n, k in ((4096, 7168), (3072, 4096), (14336, 4096))
                         for m in (512, 768, 1024, 1536, 2048, 4096))


#: Narrower weights for the same choice (N = 1024 to 2048: where the A16 twin's grid is one thin wave and chapter 07's
#: model prices small 64-row tiles for the W16 route's GEMM).
W16_NARROW_SHAPES = ((256, 1024, 7168), (512, 1024, 7168), (1024, 1024, 7168), (2048, 1024, 7168), (256, 2048, 7168),
                     (1024, 2048, 7168), (2048, 2048, 7168), (256, 1536, 4096), (2048, 1536, 4096))


def sweep_w16(m: int, n: int, k: int, *, rounds: int = 5, per_round: int = 5, seed: int = 0) -> dict:
    """The A16 twin's best configuration (:func:`~gemmlab.family.heuristic_gated.choose_a16`) beside the W16 route's
    (:func:`~gemmlab.family.heuristic_gated.w16_candidate`) and the BF16 path, kernels alone (:func:`_sweep`: each
    checked on a poisoned output first), with both models' times. Returns ``{"m", "n", "k", "chosen", "sms",
    "a16_model_us", "w16_model_us", "rows": [...]}``."""
    from ..family.heuristic_gated import a16_time, choose_a16, choose_sm90, w16_candidate
    from ..family.heuristic_sm90 import model_for
    from ..family.problem import GatedProblem

    def configs(spec):
        out = [choose_a16(m, n, k, spec.sms)]
        cand = w16_candidate(m, n, k, spec.sms, model_for(spec))
        return out + ([] if cand is None else [cand[0]])

    m, n, k, rows, spec = _sweep(m, n, k, configs, rounds, per_round, seed, "sweep_w16", stock=True)
    a16 = choose_a16(m, n, k, spec.sms)
    cand = w16_candidate(m, n, k, spec.sms, model_for(spec))
    model = model_for(spec)
    return dict(m=m, n=n, k=k, sms=spec.sms, rows=rows,
                chosen=repr(choose_sm90(GatedProblem(m, n, k), spec.sms, None, model)),
                a16_model_us=a16_time(m, n, k, a16.tile_n, spec.sms, a16.converters),
                w16_model_us=None if cand is None else cand[1])


#: Where the W16 route's time goes: GPU MODE's largest shapes and the sweep's crossings.
W16_PARTS_SHAPES = ((1024, 4096, 7168), (2048, 4096, 7168), (2048, 14336, 4096), (4096, 3072, 4096))


def time_w16_parts(m: int, n: int, k: int, *, rounds: int = 5, per_round: int = 5, seed: int = 0) -> dict:
    """The W16 route's pieces at M x N x K, kernels alone (``gpu_only``), on inputs rotated over 4x the L2: A's
    pre-pass alone, the weight pass alone, the whole route (its three launches), and the BF16 path's GEMM alone
    (``F.linear`` on BF16 weights made once). Returns microseconds, the two passes' rates (bytes read + written over
    their time, TB/s) and the route's time less both passes (``rest_us``: its GEMM and the launch gaps; not timed
    apart)."""
    import torch

    from . import bench
    from ..compile import launcher
    from ..family.heuristic_gated import w16_candidate
    from ..family.heuristic_sm90 import model_for
    from ..kernels import dual_gemm_sm90_a16 as a16_mod
    from ..kernels import dual_gemm_sm90_w16 as w16_mod
    from ..kernels.dual_gemm_sm90 import operands_2d

    m, n, k, spec, base, sets = _timing_setup(m, n, k, rounds, per_round, seed, "time_w16_parts")
    cand = w16_candidate(m, n, k, spec.sms, model_for(spec))
    if cand is None:
        raise ValueError(f"the W16 route has no configuration for {m} x {n} x {k}")
    cfg = cand[0]
    h = cfg.gemm.out_tile_n
    ref = fp4.reference(*base.inputs())
    ok = _ok_on_poisoned(prepare_gated(*base.inputs(), out=base.c, config=cfg), base, ref)
    del ref
    launches = {"w16": [prepare_gated(*s.inputs(), out=s.c, config=cfg) for s in sets], "prepass": [], "weights": []}
    for s in sets:
        ops = operands_2d(*s.inputs(), s.c)
        a16, w = w16_mod.workspaces(m, n, k, s.c.device)
        launches["prepass"].append(launcher(a16_mod.prepass_host, ops[0], ops[3], a16))
        launches["weights"].append(launcher(w16_mod.weights_host(h), ops[1], ops[4], ops[2], ops[5], w))
    launches["bf16_gemm"] = [lambda x=x, w=w, o=o: torch.nn.functional.linear(x, w, out=o)
                             for x, w, o in _bf16_path_inputs(base, m, n, k, spec)]
    t = bench.time_interleaved(launches, rounds=rounds, per_round=per_round, warmup=2, gpu_only=True)
    us = {name: v["median_ms"] * 1e3 for name, v in t.items()}
    per_value = 0.5 + 1 / 16 + 2
    return dict(m=m, n=n, k=k, config=repr(cfg), ok=ok, **{f"{name}_us": v for name, v in us.items()},
                rest_us=us["w16"] - us["prepass"] - us["weights"],
                prepass_tbps=m * k * per_value / (us["prepass"] * 1e6),
                weights_tbps=2 * n * k * per_value / (us["weights"] * 1e6), hbm_tbps=spec.hbm_tbps)


def sweep_swap(m: int, n: int, k: int, *, rounds: int = 5, per_round: int = 5, seed: int = 0) -> dict:
    """Every swap-twin candidate at M x N x K (:func:`~gemmlab.family.heuristic_gated.swap_candidates`) beside the
    public call's choice without the swap twin, the other twin that serves M (the A16 twin's best from 129 rows, the
    decode twin's to 128) and the BF16 path, kernels alone (:func:`_sweep`: each checked on a poisoned output first).
    Returns ``{"m", "n", "k", "chosen", "without_swap", "sms", "rows": [...]}`` (``chosen``: the public call's
    configuration on this GPU; ``without_swap``: its choice without the swap twin)."""
    from ..family.heuristic_gated import (A16_FROM, DECODE_UP_TO, choose_a16, choose_decode_config, choose_sm90,
                                          swap_candidates)
    from ..family.problem import GatedProblem

    def configs(spec):
        out = [choose_sm90(GatedProblem(m, n, k), spec.sms, decode_clusters(), swap=False)]
        other = (choose_decode_config(m, n, k, spec.sms, decode_clusters()) if m <= DECODE_UP_TO else
                 choose_a16(m, n, k, spec.sms) if m >= A16_FROM else None)
        if other is not None and other not in out:
            out.append(other)
        return out + [c for c in swap_candidates(m, n, k, spec.sms) if c not in out]

    m, n, k, rows, spec = _sweep(m, n, k, configs, rounds, per_round, seed, "sweep_swap", stock=True)
    problem = GatedProblem(m, n, k)
    return dict(m=m, n=n, k=k, sms=spec.sms, rows=rows,
                chosen=repr(choose_sm90(problem, spec.sms, decode_clusters())),
                without_swap=repr(choose_sm90(problem, spec.sms, decode_clusters(), swap=False)))


def sweep_a16(m: int, n: int, k: int, *, rounds: int = 5, per_round: int = 5, seed: int = 0) -> dict:
    """Every A16-twin width (:func:`a16_configs`) at M x N x K beside the fast twin the heuristic would pick and the
    BF16 path, kernels alone (:func:`_sweep`: each checked on a poisoned output first). Returns ``{"m", "n", "k",
    "chosen", "sms", "rows": [...]}`` (``chosen``: the public call's configuration on this GPU)."""
    from ..family.heuristic_gated import choose_sm90
    from ..family.problem import GatedProblem

    def configs(spec):
        return [PipelinedConfig(tile_n=choose_tile_n(m, n, spec.sms))] + a16_configs()

    m, n, k, rows, spec = _sweep(m, n, k, configs, rounds, per_round, seed, "sweep_a16", stock=True)
    bound = roofline(m, n, k, spec)  # a Hopper spec: the BF16 peak
    return dict(m=m, n=n, k=k, sms=spec.sms, rows=rows,
                chosen=repr(choose_sm90(GatedProblem(m, n, k), spec.sms, decode_clusters())),
                fp4_bytes_us=bound["memory_us"], compute_us=bound["compute_us"])
