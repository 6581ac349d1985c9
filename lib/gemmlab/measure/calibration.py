"""Calibrating the pipeline simulator on measured Hopper GEMMs before it predicts a B200 (chapter 10).

Why
    Chapter 05's timeline simulator (:mod:`gemmlab.simulator`) fed with datasheet rates says the chapter 07
    GEMM should reach about 97 % of an H200's 989 TFLOP/s at 8192^3; the benchmark measured 724 TFLOP/s
    (73 %). A model that is 30 % off on the GPU it can be checked on says nothing about a GPU it cannot.
    So the model is first made to reproduce the stored Hopper measurements of chapter 07's ten shapes
    (BF16, B a weight's ``w.t()`` view, the kernel alone), and only then asked about a B200, as a range.

What the datasheet model misses, and what replaces it
    * **The clock the power cap lets the GPU hold.** The datasheet's 989.4 TFLOP/s is 132 SMs x 4096
      FLOP/clock x 1.83 GHz. Running the GEMM back to back at the 700 W cap, the H100 held 1.32-1.44 GHz
      (``benchmarks/clock_under_load.py``, ``results/<device>/gemm_clocks.json``: nvidia-smi sampling
      every 100 ms during 4 s per shape). Each H100 point uses its own measured clock. No H200 clock was
      measured during its runs, so the H200 gets one **fitted** clock; :data:`CALIBRATION` says which is
      which (``clock_source``).
    * **A throughput belongs to the clock of the same launches.** Chapter 07's benchmark times short
      interleaved rounds; between them the GPU relaxes, and the clock it ran at was not recorded. On the
      H100 those rounds reached 809 TFLOP/s at 4096 x 4096 x 7168, above the 738 TFLOP/s tensor peak at the
      1.365 GHz held under sustained load: they ran at a higher clock. So an H100 point pairs the measured
      clock with the TFLOP/s of the sustained window it was sampled in, not with chapter 07's number.
    * **The consumers' round trip per k-block.** Chapter 07's consumer warpgroups keep one wgmma batch in
      flight: between two batches they wait for the older one, free its stage in both CTAs and wait on the
      next ``full`` barrier. That round trip has a floor (``kblock_cycles``, fitted); a 128 x 144 tile's
      k-block is only 576 cycles of tensor work, less than the floor, so the tensor pipe idles between
      batches (a 128 x 256 tile's 1024 cycles hide it). Nsight Compute on the H200 is consistent with it:
      the tensor pipe was busy 79 % of the time at 4096 x 576 x 7168 (128 x 144 tiles), 94 % at 8192^3.
    * **The epilogue** runs on the consumer warpgroups between two tiles: per sub-tile of 64 rows x
      ``epi_n`` columns (32, or 16 where 32 does not divide the tile) a conversion, ``stmatrix``, a proxy
      fence and two named barriers (``subtile_cycles`` each, fitted); the TMA stores then drain while the
      next tile's k-loop runs and the producer keeps filling the ring, so only the sub-tile steps are
      serial. (Where the sub-tiles do not fill the 4-deep store ring a whole number of times, as with 144-,
      176- and 240-column tiles, the kernel waits for its last stores before the next tile; the model does
      not price that wait separately.) On Blackwell the epilogue warps work from the other TMEM accumulator stage, so it overlaps
      the main loop (``epilogue="overlapped"``).
    * **Launch, prologue and teardown**: a fixed ``launch_s`` per launch, fitted (the back-to-back runs
      include the gap between two launches).
    * **C's bytes** go through HBM with A's and B's: the transfer per k-block is the problem's minimum
      traffic (A, B read once, C written once) over its k-blocks, at the SM's share of 85 % of the
      datasheet bandwidth.

    The three kernel constants are shared by both GPUs (same kernel); :func:`fit` finds them by a grid
    search that minimises the worst error over all points. With them, every H100 point at its measured
    clock and every H200 point at the fitted clock is within +-10 %.

    What the model still misses: the H200's points come from chapter 07's short rounds, whose clock was not
    recorded and differed from shape to shape. The H100 shows how: its short rounds ran 1.19-1.23x faster
    than its sustained runs, except at the two shapes whose rounds keep the GPU at full power longest
    (8192^3: 1.09x, 4096 x 7168 x 16384: 1.17x). One fitted H200 clock cannot follow that, which is why
    those two shapes are over-predicted on the H200 and the others under-predicted (within 8 %).

Predicting a B200
    The same recipe with B200's datasheet numbers (148 SMs, 2.25 PFLOP/s dense BF16, 7.7 TB/s) and chapter
    10's configuration, assuming B200 keeps the fraction of its datasheet clock that the Hopper GPUs keep
    (the mean of the H100's median measured clock and the H200's fitted one, over 1.83 GHz). The result
    is shown as a range: the calibration's own acceptance band, +-10 %, around it, never above the roofline.
    It is a prediction: no Blackwell GPU was used.
"""
from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field, replace
from pathlib import Path

from ..checks import check_int, check_real
from ..family.configs import BLOCK_K, PAIR_M, Sm90Config, Sm100Config
from ..family.heuristic_sm90 import epi_shape_for
from ..figures import REPO_ROOT
from ..hardware import B200, H100, H200
from ..simulator import check_work, simulate
from ..sm100_model import choose_config, num_clusters_for, tile_scheduler
from .gemm_family import CHAPTER07_SHAPES

RESULTS = REPO_ROOT / "results"
#: The chapter 07 family run each device's points come from: the runs the constants below were fitted on (H100
#: 2026-11-26, H200 2026-11-23), kept in a file of their own so that a later ``gemm_family.json`` (the H100 and the
#: H200 on 2026-11-27, after split-K moved into the GEMM) does not move the calibration unseen. To move it: copy a
#: new run here, refit with :func:`fit`, and store the new constants.
POINTS_FILE = "gemm_family_calibration.json"
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

    ``tensor_ghz``: per device (results folder name), the SM clock in GHz used where a point carries no
    measured clock of its own; ``clock_source`` says per device whether it was ``"measured"`` (the median
    clock held under load, ``benchmarks/clock_under_load.py``) or ``"fitted"``.
    ``subtile_cycles``: the consumers' serial work per epilogue sub-tile (64 rows x ``epi_n`` columns per
    warpgroup). ``kblock_cycles``: the fewest cycles a consumer spends per k-block (its round trip between
    two wgmma batches). ``load_latency_s``: a TMA load in flight. ``launch_s``: launch, prologue, teardown
    and the gap to the next launch. ``hbm_efficiency``: fraction of the datasheet bandwidth.
    """

    tensor_ghz: dict = field(default_factory=dict)
    subtile_cycles: float = 0.0
    kblock_cycles: float = 0.0
    load_latency_s: float = 1.0e-6
    launch_s: float = 2.0e-6
    hbm_efficiency: float = 0.85
    clock_source: dict = field(default_factory=dict)

    def __post_init__(self):
        for name in ("subtile_cycles", "kblock_cycles", "load_latency_s", "launch_s"):
            object.__setattr__(self, name, check_real(name, getattr(self, name), lo=0))
        # A fraction of the datasheet bandwidth: 0 would divide by zero, more than 1 is faster than the datasheet.
        object.__setattr__(self, "hbm_efficiency", check_real("hbm_efficiency", self.hbm_efficiency, lo=0, hi=1,
                                                              lo_open=True))
        if not isinstance(self.tensor_ghz, dict) or not isinstance(self.clock_source, dict):
            raise TypeError("tensor_ghz and clock_source must be dicts keyed by device")
        object.__setattr__(self, "tensor_ghz", {dev: check_real(f"tensor_ghz[{dev!r}]", ghz, lo=0, lo_open=True)
                                                for dev, ghz in self.tensor_ghz.items()})
        for dev, src in self.clock_source.items():
            if src not in ("measured", "fitted"):
                raise ValueError(f"clock_source[{dev!r}] must be 'measured' or 'fitted'; got {src!r}")

    def clock_fraction(self, device: str) -> float:
        """The device's clock (measured or fitted) as a fraction of the datasheet's."""
        return self.tensor_ghz[device] / SM90_SPEC_GHZ

    @property
    def epilogue_cycles(self) -> float:
        """The serial epilogue of one 128 x 256 tile: 8 sub-tiles of 32 columns (a per-tile figure for models
        that do not count sub-tiles)."""
        return 8 * self.subtile_cycles


#: The datasheet model: the datasheet clock, no epilogue cost, no per-k-block floor.
UNCALIBRATED = Calibration(tensor_ghz={d: SM90_SPEC_GHZ for d in DEVICES})
#: Found by :func:`fit` on the stored measurements (``tests/test_calibration.py`` re-fits and compares). The
#: H100's clock is the median of the clocks it held under load (each H100 point uses its own); the H200's
#: is fitted, because no H200 clock was measured during its runs.
CALIBRATION = Calibration(tensor_ghz={"nvidia-h100-80gb-hbm3": 1.3725, "nvidia-h200": 1.51}, subtile_cycles=250.0,
                          kblock_cycles=650.0, launch_s=4.0e-6,
                          clock_source={"nvidia-h100-80gb-hbm3": "measured", "nvidia-h200": "fitted"})


# --------------------------------------------------------------------------------------
# The measurements
# --------------------------------------------------------------------------------------


def _check_shape(shape) -> tuple[int, int, int]:
    msg = f"shape must be (m, n, k), three positive ints (numpy ints too); got {shape!r}"
    if not isinstance(shape, (tuple, list)) or len(shape) != 3:
        raise ValueError(msg)
    try:
        return tuple(check_int("shape", x, lo=1) for x in shape)
    except (TypeError, ValueError):
        raise ValueError(msg) from None


def _plain_config(name: str) -> tuple[int, int, tuple[int, int], int]:
    """``(tile_m, tile_n, cluster, stages)`` of a stored config name (:meth:`Sm90Config.parse_name`); the
    calibration models the plain persistent kernel only."""
    f = Sm90Config.parse_name(name)
    if f["swap_ab"] or f["splits"] > 1:
        raise ValueError(f"the calibration models the plain persistent kernel; {name!r} is swapped or split")
    return f["tile_m"], f["tile_n"], f["cluster"], f["stages"]


def measured_points(results: Path = RESULTS) -> list[dict]:
    """Chapter 07's ten shapes (BF16, B K-major) as measured on each device: the calibration's data.

    Each point: ``device``, ``shape``, ``config`` (the heuristic's choice that ran), ``measured_tflops``,
    ``held_mhz`` and ``clock`` (``"measured"`` or ``"fitted"``), ``burst_tflops`` and ``sampled_mhz``.

    A throughput is only paired with a clock measured during the *same* launches. Where
    ``benchmarks/clock_under_load.py`` has been run (``results/<device>/gemm_clocks.json``), the point is its
    4-second back-to-back run: ``measured_tflops`` from that window and ``held_mhz`` the median SM clock
    sampled in it (``clock="measured"``). Elsewhere the point is chapter 07's benchmark
    (:data:`POINTS_FILE`, a stored ``gemm_family.json``: short interleaved rounds, the prepared launch, kernels
    alone), whose clock was not recorded during the rounds (``held_mhz=None``, ``clock="fitted"``).
    ``burst_tflops``: that file's number in both cases; ``sampled_mhz``: its one nvidia-smi reading after the rounds.
    """
    points = []
    for dev in DEVICES:
        f = Path(results) / dev / POINTS_FILE
        if not f.exists():
            continue
        held = {}
        g = Path(results) / dev / "gemm_clocks.json"
        if g.exists():
            held = {tuple(r["shape"]): r for r in json.loads(g.read_text())["rows"] if r.get("held_mhz")}
        for r in json.loads(f.read_text())["rows"]:
            shape = (r["m"], r["n"], r["k"])
            if shape in CHAPTER07_SHAPES and r["dtype"] == "bfloat16" and r["b_major"] == "k":
                p = dict(device=dev, shape=shape, config=r["config"], measured_tflops=r["prepared_tflops"],
                         held_mhz=None, clock="fitted", burst_tflops=r["prepared_tflops"],
                         sampled_mhz=(r.get("gpu") or {}).get("sm_mhz"))
                h = held.get(shape)
                if h is not None:
                    p.update(config=h["config"], measured_tflops=h["tflops"], held_mhz=h["held_mhz"], clock="measured")
                points.append(p)
    return points


# --------------------------------------------------------------------------------------
# The model: chapter 05's simulator, one persistent CTA's (or CTA pair's) share of the work
# --------------------------------------------------------------------------------------


def _simulate(flop: float, stages: int, tiles: int, k_tiles: int, slots: int, workers: int, tile_flop_per_kblock: float,
              worker_flops: float, total_bytes: float, hbm_bytes_per_s: float, epilogue_s: float, epilogue: str,
              cal: Calibration, min_kblock_s: float = 0.0) -> float:
    """Seconds for the busiest worker (a CTA, or a CTA pair) to run ``tiles`` tiles of ``k_tiles`` k-blocks.

    A k-block holds its stage for its tensor work or ``min_kblock_s``, whichever is longer.
    """
    check_work(tiles, k_tiles)  # before the list of tiles is built
    compute = max(tile_flop_per_kblock / worker_flops, min_kblock_s)
    transfer = total_bytes / slots / (hbm_bytes_per_s * cal.hbm_efficiency / workers)
    tl = simulate(stages, [k_tiles] * tiles, cal.load_latency_s, compute, transfer_time=transfer,
                  epilogue_time=epilogue_s, epilogue=epilogue, acc_stages=2)
    return tl.total + cal.launch_s


def sm90_epilogue_subtiles(tile_n: int) -> int:
    """How many sub-tiles one consumer warpgroup's epilogue walks per tile: ``tile_n / epi_n``, with the
    heuristic's ``epi_n`` (32 columns where 32 divides ``tile_n``, else 16)."""

    return tile_n // epi_shape_for(tile_n)[0]


def predict_sm90(shape, config: str, device: str, cal: Calibration = CALIBRATION, ghz: float | None = None) -> float:
    """Predicted TFLOP/s of the chapter 07 kernel (config name as stored) on ``device`` for ``shape``.

    ``ghz``: the SM clock the GPU held (a measurement); default ``cal.tensor_ghz[device]``.

    Per k-block a consumer holds its stage for the wgmma work at that clock (4096 FLOP per clock per SM),
    but never less than ``cal.kblock_cycles``: chapter 07's consumer keeps one wgmma batch in flight, so
    between two batches it waits for the older one, frees its stage in both CTAs of the cluster, waits on
    the next ``full`` barrier and issues 4 wgmmas; when the batch it keeps in flight is shorter than that
    round trip (narrow tiles: 576 cycles at N = 144, 1024 at N = 256), the tensor pipe idles.
    The epilogue is inline: the consumers convert, ``stmatrix`` and pass two named barriers per sub-tile
    before their next tile's first wgmma (``cal.subtile_cycles`` each); the TMA stores themselves drain
    while the next tile runs (except the last ones of a tile whose sub-tiles do not fill the store ring a
    whole number of times: not priced separately), and the producer keeps filling the ring meanwhile (the
    simulator's producer is never held up by an epilogue), so neither is counted.
    """
    m, n, k = _check_shape(shape)
    if device not in DEVICES:
        raise ValueError(f"device must be one of {', '.join(DEVICES)}; got {device!r}")
    if ghz is None:
        if device not in cal.tensor_ghz:
            raise ValueError(f"the calibration has no clock for {device!r}; pass ghz (a measured clock)")
        ghz = cal.tensor_ghz[device]
    else:
        try:
            ghz = check_real("ghz", ghz, lo=0, hi=5, lo_open=True, hi_open=True)
        except (TypeError, ValueError) as exc:
            raise type(exc)(f"ghz must be a clock in GHz, a finite number in (0, 5); got {ghz!r}") from None
    tile_m, tile_n, cluster, stages = _plain_config(config)
    _check_sm90_config(config, tile_m, tile_n, cluster, stages)
    spec = DEVICES[device]
    m_tiles, n_tiles, k_tiles = -(-m // tile_m), -(-n // tile_n), -(-k // 64)
    units = -(-m_tiles // cluster[0]) * -(-n_tiles // cluster[1])
    clusters = spec.sms // (cluster[0] * cluster[1])
    hz = ghz * 1e9
    seconds = _simulate(2 * m * n * k, stages, -(-units // clusters), k_tiles, m_tiles * n_tiles * k_tiles,
                        min(spec.sms, units * cluster[0] * cluster[1]), 2 * tile_m * tile_n * 64,
                        SM90_FLOP_PER_CLOCK * hz, 2 * (m * k + n * k + m * n), spec.hbm_tbps * 1e12,
                        cal.subtile_cycles * sm90_epilogue_subtiles(tile_n) / hz, "inline", cal,
                        min_kblock_s=cal.kblock_cycles / hz)
    return 2 * m * n * k / seconds / 1e12


def _check_sm90_config(name: str, tile_m: int, tile_n: int, cluster: tuple, stages: int) -> None:
    """The parsed config must be one the chapter 07 kernel can be built with (:class:`Sm90Config`'s rules)."""
    try:
        Sm90Config(tile_m=tile_m, tile_n=tile_n, stages=stages, cluster=cluster,
                   epi_n=epi_shape_for(tile_n)[0] if tile_n > 0 else 16)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"config {name!r} is not a chapter 07 kernel: {exc}") from None


def _point_ghz(p: dict):
    return p["held_mhz"] / 1000 if p.get("held_mhz") else None


def calibration_rows(cal: Calibration = CALIBRATION, points=None) -> list[dict]:
    """Every measured point with the calibrated and the datasheet prediction and their errors.

    The calibrated prediction uses the point's measured clock where it has one (``clock="measured"``),
    else the device's fitted clock; ``model_ghz`` says which number was used.
    """
    rows = []
    for p in points if points is not None else measured_points():
        ghz = _point_ghz(p)
        pred = predict_sm90(p["shape"], p["config"], p["device"], cal, ghz=ghz)
        raw = predict_sm90(p["shape"], p["config"], p["device"], UNCALIBRATED)
        rows.append({**p, "model_ghz": ghz if ghz else cal.tensor_ghz[p["device"]],
                     "predicted_tflops": pred, "error": pred / p["measured_tflops"] - 1,
                     "datasheet_tflops": raw, "datasheet_error": raw / p["measured_tflops"] - 1})
    return rows


def worst_errors(rows: list[dict]) -> dict:
    """Per device: ``(worst |error|, clock source)`` of the calibrated predictions."""
    out = {}
    for r in rows:
        w = out.get(r["device"], (0.0, r["clock"]))[0]
        out[r["device"]] = (max(w, abs(r["error"])), r["clock"])
    return out


def fit(points=None, ghz_grid=None, subtile_grid=(200, 250, 300, 350, 400), kblock_grid=(0, 600, 650, 700),
        launch_grid=(2e-6, 3e-6, 4e-6, 5e-6), load_latency_s: float = 1.0e-6):
    """The calibration with the smallest worst-case error over ``points`` (a grid search, deterministic).

    Shared by both devices (the same kernel): the epilogue's cycles per sub-tile, the per-k-block floor
    and the launch time. Per device the clock: each point with a measured clock uses it; a device without
    one gets the clock of ``ghz_grid`` (default 1.30 ... 1.98 GHz by 0.01) that minimises its worst error,
    and ``clock_source`` records which. Returns ``(Calibration, worst |error|)``.
    """
    points = points if points is not None else measured_points()
    if not points:
        raise ValueError("points must hold at least one measurement (results/<device>/" + POINTS_FILE + ")")
    ghz_grid = ghz_grid if ghz_grid is not None else [round(1.30 + 0.01 * i, 2) for i in range(69)]
    devices = sorted({p["device"] for p in points})
    measured = {d: [_point_ghz(p) for p in points if p["device"] == d] for d in devices}
    source = {d: "measured" if all(measured[d]) else "fitted" for d in devices}
    best = None
    for sub in subtile_grid:
        for kb in kblock_grid:
            for launch in launch_grid:
                base = Calibration({}, float(sub), float(kb), load_latency_s, launch)
                clocks, worst = {}, 0.0
                for dev in devices:
                    mine = [p for p in points if p["device"] == dev]
                    if source[dev] == "measured":
                        err = max(abs(predict_sm90(p["shape"], p["config"], dev, base, ghz=_point_ghz(p))
                                      / p["measured_tflops"] - 1) for p in mine)
                        clocks[dev] = statistics.median(measured[dev])
                    else:
                        err, clocks[dev] = min((max(abs(predict_sm90(p["shape"], p["config"], dev, base, ghz=g)
                                                        / p["measured_tflops"] - 1) for p in mine), g)
                                               for g in ghz_grid)
                    worst = max(worst, err)
                if best is None or worst < best[1] - 1e-12:
                    best = (replace(base, tensor_ghz=clocks, clock_source=dict(source)), worst)
    return best


# --------------------------------------------------------------------------------------
# The B200 prediction (chapter 10's kernel), as a range
# --------------------------------------------------------------------------------------


def b200_clock_fraction(cal: Calibration = CALIBRATION) -> float:
    """The fraction of the datasheet clock the B200 is assumed to hold: the Hopper GPUs' mean (the H100's
    median measured clock and the H200's fitted one, as :data:`CALIBRATION` holds them)."""
    return sum(cal.clock_fraction(d) for d in cal.tensor_ghz) / len(cal.tensor_ghz)


def predict_b200(shape, cfg=None, cal: Calibration = CALIBRATION) -> dict:
    """A PREDICTION of chapter 10's kernel on a B200 for ``shape = (m, n, k)``: low, mid and high TFLOP/s.

    ``mid``: the calibrated recipe at B200's datasheet rate times :func:`b200_clock_fraction`; ``low`` and
    ``high``: +-:data:`TOLERANCE` around it, ``high`` capped at the roofline.
    """
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
    # The epilogue: the calibrated cycles per sub-tile at the assumed clock (the datasheet rate's clock is
    # unknown; 1.83 GHz stands in for it, as on Hopper), block_n / epi_n sub-tiles per tile, overlapped with
    # the next tile's main loop through two TMEM stages. No per-k-block floor: one thread issues tcgen05.mma
    # and commits it to an mbarrier, so unlike chapter 07's consumers nothing waits for the previous k-block's
    # MMAs before issuing the next.
    epi_s = cal.subtile_cycles * (cfg.block_n // cfg.epi_n) / (SM90_SPEC_GHZ * frac * 1e9)
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


def prediction_table(shapes=CHAPTER07_SHAPES) -> list[dict]:
    """:func:`predict_b200` for every shape (default: chapter 07's ten): PREDICTIONS, nothing is measured."""
    return [predict_b200(s) for s in shapes]


def draw_calibration(rows: list[dict], name: str = "10_calibration"):
    """Predicted against measured TFLOP/s, datasheet model and calibrated model, both GPUs, +-10 % band.

    Filled markers: the prediction used the clock measured during that run; hollow: a fitted clock.
    Returns ``(path, data)``.
    """
    from ..figures import new_figure, save

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
        if not mine:
            continue
        short = DEVICES[dev].short
        ax.scatter([r["measured_tflops"] for r in mine], [r["datasheet_tflops"] for r in mine], marker="x",
                   color=colour, alpha=0.6, label=f"{short}: datasheet clock (1.83 GHz)")
        for source in ("measured", "fitted"):
            pts = [r for r in mine if r["clock"] == source]
            if not pts:
                continue
            ghz = sorted(r["model_ghz"] for r in pts)
            clocks = f"{ghz[0]:.2f}" if ghz[0] == ghz[-1] else f"{ghz[0]:.2f}-{ghz[-1]:.2f}"
            ax.scatter([r["measured_tflops"] for r in pts], [r["predicted_tflops"] for r in pts], marker="o",
                       s=36, color=colour if source == "measured" else "white", edgecolors=colour, linewidths=1.5,
                       label=f"{short}: calibrated, {source} clock ({clocks} GHz)")
        data[short] = [(r["shape"], r["measured_tflops"], r["predicted_tflops"], r["datasheet_tflops"], r["clock"])
                       for r in mine]
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_xlabel("measured TFLOP/s (chapter 07 kernel; H100: sustained runs, clock sampled)")
    ax.set_ylabel("predicted TFLOP/s (pipeline simulator)")
    ax.set_title("Calibrating the simulator on Hopper: chapter 07's ten shapes", fontsize=10)
    ax.legend(fontsize=7, loc="upper left")
    return save(fig, name), data


def format_calibration(rows: list[dict]) -> str:
    """The calibration table as fixed-width text (``clock``: the GHz the prediction used, measured or fitted)."""
    out = [f"{'device':>6} {'M x N x K':>16}  {'config':<20} {'clock':>14} {'measured':>8} {'datasheet':>9} "
           f"{'err':>6} {'calibrated':>10} {'err':>6}"]
    for r in rows:
        out.append(f"{DEVICES[r['device']].short:>6} {'x'.join(map(str, r['shape'])):>16}  {r['config']:<20} "
                   f"{r['model_ghz']:5.3f} {r['clock']:>8} {r['measured_tflops']:8.0f} {r['datasheet_tflops']:9.0f} "
                   f"{r['datasheet_error']:+6.0%} {r['predicted_tflops']:10.0f} {r['error']:+6.0%}")
    return "\n".join(out)


def with_clock(cal: Calibration, device: str, ghz: float) -> Calibration:
    """``cal`` with the effective tensor clock of ``device`` replaced (for what-if cells and exercises)."""
    return replace(cal, tensor_ghz={**cal.tensor_ghz, device: ghz})


def draw_prediction(rows: list[dict], name: str = "10_prediction"):
    """Predicted TFLOP/s ranges against the roofline, labelled PREDICTION. Returns ``(path, data)``."""
    import numpy as np

    from ..figures import new_figure, save

    labels = [f"{r['m']}x{r['n']}x{r['k']}" for r in rows]
    pred = [r["predicted_tflops"] for r in rows]
    low = [r["low_tflops"] for r in rows]
    high = [r["high_tflops"] for r in rows]
    roof = [r["roofline_tflops"] for r in rows]
    fig, ax = new_figure(figsize=(11, 4))
    x = np.arange(len(rows))
    ax.bar(x - 0.2, roof, 0.4, color="#BBBBBB", label="roofline (2.25 PFLOP/s, 7.7 TB/s)")
    ax.bar(x + 0.2, pred, 0.4, color="#4C72B0", label="PREDICTED (calibrated on H100/H200), with its range")
    ax.errorbar(x + 0.2, pred, yerr=[np.subtract(pred, low), np.subtract(high, pred)], fmt="none", ecolor="black",
                capsize=3, lw=1)
    for xi, lo_, hi_ in zip(x, low, high):
        ax.text(xi + 0.2, hi_ + 20, f"{lo_:.0f}-{hi_:.0f}", ha="center", va="bottom", fontsize=6)
    ax.set_xticks(x)
    ax.set_xticklabels(labels, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("TFLOP/s (BF16)")
    ax.set_title("B200, persistent 2-CTA GEMM: a PREDICTION, not a measurement", fontsize=10)
    ax.set_ylim(0, 2750)
    ax.legend(fontsize=8, loc="upper center", ncol=2)
    path = save(fig, name)
    return path, {"labels": labels, "predicted": pred, "low": low, "high": high, "roofline": roof}
