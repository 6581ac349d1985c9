"""Calibrating the pipeline simulator on measured Hopper GEMMs before it predicts a B200 (chapter 10).

Why
    Chapter 05's timeline simulator (:mod:`gemmlab.simulator`) fed with datasheet rates says the chapter 07
    GEMM should reach about 97 % of an H200's 989 TFLOP/s at 8192^3; the benchmark measured 724 TFLOP/s
    (73 %). A model that is 30 % off on the GPU it can be checked on says nothing about a GPU it cannot.
    So the model is first made to reproduce the stored Hopper measurements
    (``results/<device>/gemm_family.json``: chapter 07's ten shapes, BF16, B a weight's ``w.t()`` view,
    the kernel alone, chapter 07's fair method), and only then asked about a B200, as a range.

What the datasheet model misses, and what replaces it
    * **The clock the power cap lets the GPU hold.** The datasheet's 989.4 TFLOP/s is 132 SMs x 4096
      FLOP/clock x 1.83 GHz. Under a sustained dense GEMM at 700 W the H100 and H200 do not hold that:
      Nsight Compute measured 1.59 GHz with the tensor pipe busy 94 % of the time at 8192^3 on the H200
      (``results/nvidia-h200/gemm_sm90_profile.json``), and nvidia-smi read 1.3-1.6 GHz after the long runs.
      The calibration fits one **effective tensor clock** per GPU (clock x tensor-pipe efficiency): the
      tensor cores' rate is 4096 FLOP per clock of it, per SM.
    * **The epilogue** of the Hopper kernel runs on the consumer warpgroups between two tiles
      (registers -> shared memory; the TMA stores then overlap the next tile): a fixed number of cycles per
      tile, fitted. On Blackwell the epilogue warps work from the other TMEM accumulator stage, so it
      overlaps the main loop (``epilogue="overlapped"``).
    * **C's bytes** go through HBM with A's and B's: the transfer per k-block is the problem's minimum
      traffic (A, B read once, C written once) over its k-blocks, at the SM's share of 85 % of the
      datasheet bandwidth.

    The stored measurements never recorded the clock *during* the timed rounds (one nvidia-smi sample
    after them, often after the GPU had relaxed); ``benchmarks/clock_under_load.py`` measures it, and
    :func:`measured_points` reads its output where present, to check the fitted clocks against.

Predicting a B200
    The same recipe with B200's datasheet numbers (148 SMs, 2.25 PFLOP/s dense BF16, 7.7 TB/s) and chapter
    10's configuration, assuming B200 keeps the fraction of its datasheet clock that the Hopper GPUs keep
    (the mean of the two fitted fractions). The result is shown as a range: the calibration's own
    acceptance band, +-10 %, around it, never above the roofline. It is a prediction: no Blackwell GPU was
    used.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from pathlib import Path

from .figures import REPO_ROOT
from .hardware import B200, H100, H200

RESULTS = REPO_ROOT / "results"
#: The devices with stored chapter 07 measurements: results folder -> datasheet spec.
DEVICES = {"nvidia-h100-80gb-hbm3": H100, "nvidia-h200": H200}
#: The clock behind the Hopper datasheet peak: 989.4 TFLOP/s = 132 SMs x 4096 FLOP/clock x 1.83 GHz.
SM90_SPEC_GHZ = 1.83
SM90_FLOP_PER_CLOCK = 4096  # dense BF16 per SM
#: The calibration's acceptance band: every Hopper prediction within +-10 % of its measurement.
TOLERANCE = 0.10


@dataclass(frozen=True)
class Calibration:
    """The numbers the simulator is fed besides the datasheet's.

    ``tensor_ghz``: per device (results folder name), the effective tensor clock in GHz.
    ``epilogue_cycles``: per tile, at that clock. ``load_latency_s``: a TMA load in flight.
    ``launch_s``: launch, prologue and teardown. ``hbm_efficiency``: fraction of the datasheet bandwidth.
    """

    tensor_ghz: dict = field(default_factory=dict)
    epilogue_cycles: float = 0.0
    load_latency_s: float = 1.0e-6
    launch_s: float = 2.0e-6
    hbm_efficiency: float = 0.85

    def __post_init__(self):
        for name in ("epilogue_cycles", "load_latency_s", "launch_s", "hbm_efficiency"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise ValueError(f"{name} must be a finite number >= 0; got {v!r}")
        for dev, ghz in self.tensor_ghz.items():
            if not isinstance(ghz, (int, float)) or not math.isfinite(ghz) or ghz <= 0:
                raise ValueError(f"tensor_ghz[{dev!r}] must be a finite number > 0; got {ghz!r}")

    def clock_fraction(self, device: str) -> float:
        """The fitted effective clock as a fraction of the datasheet's."""
        return self.tensor_ghz[device] / SM90_SPEC_GHZ


#: The datasheet model: the datasheet clock, no epilogue cost.
UNCALIBRATED = Calibration(tensor_ghz={d: SM90_SPEC_GHZ for d in DEVICES}, epilogue_cycles=0.0)
#: Fitted by :func:`fit` on the stored measurements (``tests/test_calibration.py`` re-fits and compares).
CALIBRATION = Calibration(tensor_ghz={"nvidia-h100-80gb-hbm3": 1.49, "nvidia-h200": 1.46}, epilogue_cycles=1000.0)


# --------------------------------------------------------------------------------------
# The measurements
# --------------------------------------------------------------------------------------


def _check_shape(shape) -> tuple[int, int, int]:
    if (not isinstance(shape, (tuple, list)) or len(shape) != 3
            or not all(isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in shape)):
        raise ValueError(f"shape must be (m, n, k), three positive ints; got {shape!r}")
    return tuple(shape)


def parse_sm90_config(name: str) -> tuple[int, int, tuple[int, int], int]:
    """``(tile_m, tile_n, cluster, stages)`` from a config name such as ``"128x256 c2x1 m8 s4"``."""
    parts = str(name).split()
    try:
        tile_m, tile_n = (int(x) for x in parts[0].split("x"))
        cluster = tuple(int(x) for x in parts[1][1:].split("x"))
        stages = int(parts[3][1:])
    except (IndexError, ValueError):
        raise ValueError(f"name must look like '128x256 c2x1 m8 s4'; got {name!r}") from None
    if any(w in parts for w in ("swap",)) or any(p.startswith("split") for p in parts):
        raise ValueError(f"the calibration models the plain persistent kernel; {name!r} is swapped or split")
    return tile_m, tile_n, cluster, stages


def measured_points(results: Path = RESULTS) -> list[dict]:
    """Chapter 07's ten shapes (BF16, B K-major) as measured on each device: the calibration's data.

    Each point: ``device``, ``shape``, ``config`` (the heuristic's choice that ran), ``measured_tflops``
    (the prepared launch, kernels alone), ``sampled_mhz`` (nvidia-smi after the timed rounds) and, where
    ``benchmarks/clock_under_load.py`` has been run, ``held_mhz`` (the median clock during them).
    """
    from .family.benchmark import CHAPTER07_SHAPES

    points = []
    for dev in DEVICES:
        f = Path(results) / dev / "gemm_family.json"
        if not f.exists():
            continue
        held = {}
        g = Path(results) / dev / "gemm_clocks.json"
        if g.exists():
            held = {tuple(r["shape"]): r["held_mhz"] for r in json.loads(g.read_text())["rows"]}
        for r in json.loads(f.read_text())["rows"]:
            shape = (r["m"], r["n"], r["k"])
            if shape in CHAPTER07_SHAPES and r["dtype"] == "bfloat16" and r["b_major"] == "k":
                points.append(dict(device=dev, shape=shape, config=r["config"], measured_tflops=r["prepared_tflops"],
                                   sampled_mhz=(r.get("gpu") or {}).get("sm_mhz"), held_mhz=held.get(shape)))
    return points


# --------------------------------------------------------------------------------------
# The model: chapter 05's simulator, one persistent CTA's (or CTA pair's) share of the work
# --------------------------------------------------------------------------------------


def _simulate(flop: float, stages: int, tiles: int, k_tiles: int, slots: int, workers: int, tile_flop_per_kblock: float,
              worker_flops: float, total_bytes: float, hbm_bytes_per_s: float, epilogue_s: float, epilogue: str,
              cal: Calibration) -> float:
    """Seconds for the busiest worker (a CTA, or a CTA pair) to run ``tiles`` tiles of ``k_tiles`` k-blocks."""
    from .simulator import simulate

    compute = tile_flop_per_kblock / worker_flops
    transfer = total_bytes / slots / (hbm_bytes_per_s * cal.hbm_efficiency / workers)
    tl = simulate(stages, [k_tiles] * tiles, cal.load_latency_s, compute, transfer_time=transfer,
                  epilogue_time=epilogue_s, epilogue=epilogue, acc_stages=2)
    return tl.total + cal.launch_s


def predict_sm90(shape, config: str, device: str, cal: Calibration = CALIBRATION) -> float:
    """Predicted TFLOP/s of the chapter 07 kernel (config name as stored) on ``device`` for ``shape``."""
    m, n, k = _check_shape(shape)
    if device not in DEVICES:
        raise ValueError(f"device must be one of {', '.join(DEVICES)}; got {device!r}")
    if device not in cal.tensor_ghz:
        raise ValueError(f"the calibration has no tensor clock for {device!r}")
    tile_m, tile_n, cluster, stages = parse_sm90_config(config)
    spec = DEVICES[device]
    m_tiles, n_tiles, k_tiles = -(-m // tile_m), -(-n // tile_n), -(-k // 64)
    units = -(-m_tiles // cluster[0]) * -(-n_tiles // cluster[1])
    clusters = spec.sms // (cluster[0] * cluster[1])
    ghz = cal.tensor_ghz[device]
    seconds = _simulate(2 * m * n * k, stages, -(-units // clusters), k_tiles, m_tiles * n_tiles * k_tiles,
                        min(spec.sms, units * cluster[0] * cluster[1]), 2 * tile_m * tile_n * 64,
                        SM90_FLOP_PER_CLOCK * ghz * 1e9, 2 * (m * k + n * k + m * n), spec.hbm_tbps * 1e12,
                        cal.epilogue_cycles / (ghz * 1e9), "inline", cal)
    return 2 * m * n * k / seconds / 1e12


def calibration_rows(cal: Calibration = CALIBRATION, points=None) -> list[dict]:
    """Every measured point with the calibrated and the datasheet prediction and their errors."""
    rows = []
    for p in points if points is not None else measured_points():
        pred = predict_sm90(p["shape"], p["config"], p["device"], cal)
        raw = predict_sm90(p["shape"], p["config"], p["device"], UNCALIBRATED)
        rows.append({**p, "predicted_tflops": pred, "error": pred / p["measured_tflops"] - 1,
                     "datasheet_tflops": raw, "datasheet_error": raw / p["measured_tflops"] - 1})
    return rows


def fit(points=None, ghz_grid=None, epilogue_grid=(0, 250, 500, 1000, 1500, 2000), latency_grid=(0.5e-6, 1e-6, 2e-6)):
    """The calibration with the smallest worst-case error over ``points`` (a grid search, deterministic).

    Per device the effective tensor clock (``ghz_grid``, default 1.30 ... 1.98 GHz by 0.01); shared by both
    devices the epilogue cycles and the load latency. Returns ``(Calibration, worst |error|)``.
    """
    points = points if points is not None else measured_points()
    if not points:
        raise ValueError("points must hold at least one measurement (results/<device>/gemm_family.json)")
    ghz_grid = ghz_grid if ghz_grid is not None else [round(1.30 + 0.01 * i, 2) for i in range(69)]
    best = None
    for epi in epilogue_grid:
        for lat in latency_grid:
            clocks, worst = {}, 0.0
            for dev in sorted({p["device"] for p in points}):
                mine = [p for p in points if p["device"] == dev]
                err, ghz = min((max(abs(predict_sm90(p["shape"], p["config"], dev, Calibration(
                    {dev: g}, epi, lat)) / p["measured_tflops"] - 1) for p in mine), g) for g in ghz_grid)
                clocks[dev], worst = ghz, max(worst, err)
            if best is None or worst < best[1] - 1e-12:
                best = (Calibration(clocks, float(epi), lat), worst)
    return best


# --------------------------------------------------------------------------------------
# The B200 prediction (chapter 10's kernel), as a range
# --------------------------------------------------------------------------------------


def b200_clock_fraction(cal: Calibration = CALIBRATION) -> float:
    """The fraction of the datasheet clock the B200 is assumed to hold: the Hopper GPUs' mean."""
    return sum(cal.clock_fraction(d) for d in cal.tensor_ghz) / len(cal.tensor_ghz)


def predict_b200(shape, cfg=None, cal: Calibration = CALIBRATION) -> dict:
    """A PREDICTION of chapter 10's kernel on a B200 for ``shape = (m, n, k)``: low, mid and high TFLOP/s.

    ``mid``: the calibrated recipe at B200's datasheet rate times :func:`b200_clock_fraction`; ``low`` and
    ``high``: +-:data:`TOLERANCE` around it, ``high`` capped at the roofline.
    """
    from .family.configs import BLOCK_K, PAIR_M, Sm100Config
    from .sm100_model import choose_config, num_clusters_for, tile_scheduler

    m, n, k = _check_shape(shape)
    if cfg is None:
        cfg = choose_config(m, n, k)
    if not isinstance(cfg, Sm100Config):
        raise TypeError(f"cfg must be an Sm100Config; got {type(cfg).__name__}")
    cfg.check_fits()
    clusters = num_clusters_for(m, n, cfg)
    sched = tile_scheduler(m, n, cfg)
    k_tiles = -(-k // BLOCK_K)
    frac = b200_clock_fraction(cal)
    pair_flops = B200.bf16_tflops * 1e12 * frac * 2 / B200.sms
    # The epilogue's cycles at the effective clock (the datasheet rate's clock is unknown; 1.83 GHz stands
    # in for it, as on Hopper): overlapped with the next tile's main loop through two TMEM stages.
    epi_s = cal.epilogue_cycles / (SM90_SPEC_GHZ * frac * 1e9)
    seconds = _simulate(2 * m * n * k, cfg.ab_stages, -(-sched.num_tiles // clusters), k_tiles,
                        sched.num_tiles * k_tiles, clusters, 2 * PAIR_M * cfg.block_n * BLOCK_K, pair_flops,
                        2 * (m * k + n * k + m * n), B200.hbm_tbps * 1e12, epi_s, "overlapped", cal)
    mid = 2 * m * n * k / seconds / 1e12
    total_bytes = 2 * (m * k + n * k + m * n)
    roof = 2 * m * n * k / max(2 * m * n * k / (B200.bf16_tflops * 1e12), total_bytes / (B200.hbm_tbps * 1e12)) / 1e12
    return dict(m=m, n=n, k=k, block_n=cfg.block_n, stages=cfg.ab_stages, clusters=clusters, tiles=sched.num_tiles,
                waves=-(-sched.num_tiles // clusters), clock_fraction=frac, predicted_us=seconds * 1e6,
                low_tflops=mid * (1 - TOLERANCE), predicted_tflops=mid, high_tflops=min(roof, mid * (1 + TOLERANCE)),
                roofline_tflops=roof)


# --------------------------------------------------------------------------------------
# Figures and text
# --------------------------------------------------------------------------------------


def draw_calibration(rows: list[dict], name: str = "10_calibration"):
    """Predicted against measured TFLOP/s, datasheet model and calibrated model, both GPUs, +-10 % band.

    Returns ``(path, data)``.
    """
    from .figures import new_figure, save

    fig, ax = new_figure(figsize=(6.8, 5.4))
    lo = min(min(r["measured_tflops"], r["predicted_tflops"]) for r in rows) * 0.85
    hi = max(max(r["measured_tflops"], r["datasheet_tflops"]) for r in rows) * 1.05
    xs = [lo, hi]
    ax.plot(xs, xs, color="black", lw=1, label="predicted = measured")
    ax.fill_between(xs, [x * (1 - TOLERANCE) for x in xs], [x * (1 + TOLERANCE) for x in xs], color="#DDDDDD",
                    label=f"±{TOLERANCE:.0%}")
    data = {}
    for dev, colour in zip(DEVICES, ("tab:blue", "tab:green")):
        mine = [r for r in rows if r["device"] == dev]
        short = DEVICES[dev].short
        ax.scatter([r["measured_tflops"] for r in mine], [r["datasheet_tflops"] for r in mine], marker="x",
                   color=colour, alpha=0.6, label=f"{short}: datasheet clock")
        ax.scatter([r["measured_tflops"] for r in mine], [r["predicted_tflops"] for r in mine], marker="o",
                   color=colour, label=f"{short}: calibrated")
        data[short] = [(r["shape"], r["measured_tflops"], r["predicted_tflops"], r["datasheet_tflops"]) for r in mine]
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_xlabel("measured TFLOP/s (chapter 07 kernel, results/<device>/gemm_family.json)")
    ax.set_ylabel("predicted TFLOP/s (pipeline simulator)")
    ax.set_title("Calibrating the simulator on Hopper: chapter 07's ten shapes", fontsize=10)
    ax.legend(fontsize=7, loc="upper left")
    return save(fig, name), data


def format_calibration(rows: list[dict]) -> str:
    """The calibration table as fixed-width text."""
    out = [f"{'device':>6} {'M x N x K':>16}  {'config':<20} {'measured':>8} {'datasheet':>9} {'err':>6} "
           f"{'calibrated':>10} {'err':>6}"]
    for r in rows:
        out.append(f"{DEVICES[r['device']].short:>6} {'x'.join(map(str, r['shape'])):>16}  {r['config']:<20} "
                   f"{r['measured_tflops']:8.0f} {r['datasheet_tflops']:9.0f} {r['datasheet_error']:+6.0%} "
                   f"{r['predicted_tflops']:10.0f} {r['error']:+6.0%}")
    return "\n".join(out)


def with_clock(cal: Calibration, device: str, ghz: float) -> Calibration:
    """``cal`` with the effective tensor clock of ``device`` replaced (for what-if cells and exercises)."""
    return replace(cal, tensor_ghz={**cal.tensor_ghz, device: ghz})
