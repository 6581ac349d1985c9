"""Chapter 05's measurements: the TMA pipeline against torch's copy of the same bytes, and its tail bubble.

* :func:`benchmark`, :func:`stage_sweep`, :func:`compare_designs`: GB/s of :func:`gemmlab.tma_pipeline.row_scale`
  (both designs) against ``y.copy_(x)`` of the same bytes, in the same run, each kernel first checked exactly.
* :func:`calibrate_ring`, :func:`tail_bubble`: the unrolled design's tail bubble with synthetic compute
  (``spin_cycles``) on a few SMs, against the simulator's prediction (:mod:`gemmlab.simulator`) from measured
  load and compute times.
* :func:`table` and the ``*_COLUMNS``, :func:`draw_tail_bubble`, :func:`draw_stage_sweep`: their tables and figures.
"""
from __future__ import annotations

from .. import simulator as sm
from ..checks import check_int
from ..figures import format_table, new_figure, save
from ..hardware import sm_count
from ..tiers import require_tier
from ..tma_pipeline import DESIGNS, DTYPES, MAX_SPIN_CYCLES, check_config, default_block, prepare_row_scale, reference
from .bench import copy_bandwidth_gbs, device_name, time_ms, write_results
from .bench import measured_on as _measured_on


#: The benchmark shape: 1 GiB of bfloat16 (far beyond the 50-60 MB of L2), 5 k-iterations
#: of 256 columns per tile, and a row count that leaves the last tile partial.
BENCH_SHAPE = (419_430, 1280)


def _random_inputs(shape, dtype: str):
    import torch

    x = torch.randn(shape, device="cuda", dtype=torch.float32).to(getattr(torch, dtype))
    scale = torch.rand(shape[0], device="cuda", dtype=torch.float32) + 0.5
    return x, scale


def _checked_run(x, scale, out, **kw):
    """Poison ``out``, run once, compare exactly with :func:`reference`; return the launch."""
    import torch

    run = prepare_row_scale(x, scale, out, **kw)
    out.fill_(float("nan"))
    run()
    torch.cuda.synchronize()
    if not torch.equal(out, reference(x, scale, out.dtype)):
        raise AssertionError(f"row_scale {kw} differs from torch")
    return run


def _bandwidth_row(run, base_ms, nbytes, rep, **fields):

    ms = time_ms(run, rep=rep)
    return {**fields, "ms": ms, "GB/s": copy_bandwidth_gbs(nbytes, ms), "vs torch": base_ms / ms}


def benchmark(*, shape=BENCH_SHAPE, dtype: str = "bfloat16", stages: int = 4, ctas_per_sm: int = 2,
              rep: int = 30, name: str | None = "05_tma_pipeline") -> list[dict]:
    """GB/s of :func:`gemmlab.tma_pipeline.row_scale` (both designs) against ``y.copy_(x)`` of the same bytes, same run.

    Each kernel is first checked exactly against torch on the full buffer
    (output poisoned). GB/s counts x read + y written; torch is re-timed
    after each kernel and the best torch time is the baseline.
    """
    import torch


    require_tier("gpu", "gemmlab.measure.tma_pipeline.benchmark")
    x, scale = _random_inputs(shape, dtype)
    out = torch.empty_like(x)
    nbytes = 2 * x.numel() * x.element_size()
    base = time_ms(lambda: out.copy_(x), rep=rep)
    rows = []
    for design in DESIGNS:
        run = _checked_run(x, scale, out, stages=stages, design=design, ctas_per_sm=ctas_per_sm)
        rows.append(_bandwidth_row(run, 1.0, nbytes, rep, kernel=f"row_scale {design}, {stages} stages, "
                                                                f"{ctas_per_sm} CTAs/SM"))
        base = min(base, time_ms(lambda: out.copy_(x), rep=rep))
    for r in rows:
        r["vs torch"] = base / r["ms"]
    rows.insert(0, {"kernel": "torch copy_", "ms": base, "GB/s": copy_bandwidth_gbs(nbytes, base), "vs torch": 1.0})
    if name:
        write_results(name, rows, shape=list(shape), dtype=dtype, note="GB/s counts bytes read + bytes written")
    return rows


def _block_for(stage_bytes: int, dtype: str) -> tuple[int, int]:
    """A box of 256 columns and ``stage_bytes`` bytes."""
    return (stage_bytes // (256 * DTYPES[dtype].width // 8), 256)


def stage_sweep(stage_counts=(1, 2, 3, 4, 6, 8), *, configs=((16384, 1), (16384, 2), (4096, 1)),
                shape=BENCH_SHAPE, dtype: str = "bfloat16", rep: int = 20,
                name: str | None = "05_tma_pipeline_stages") -> list[dict]:
    """GB/s of the carried design per ring depth, for each (bytes per stage, CTAs per SM) in ``configs``.

    Configurations that do not fit shared memory are skipped; each is checked
    exactly first. Rows: ``stages``, ``KiB/stage``, ``ctas/SM``, ``ms``, ``GB/s``, ``vs torch``.
    """
    import torch


    require_tier("gpu", "gemmlab.measure.tma_pipeline.stage_sweep")
    x, scale = _random_inputs(shape, dtype)
    out = torch.empty_like(x)
    nbytes = 2 * x.numel() * x.element_size()
    base = time_ms(lambda: out.copy_(x), rep=rep)
    rows = []
    for stage_bytes, c in configs:
        block = _block_for(stage_bytes, dtype)
        for s in stage_counts:
            try:
                check_config(dtype, dtype, block, s, "carried", c)
            except ValueError:
                continue  # does not fit shared memory
            run = _checked_run(x, scale, out, block=block, stages=s, ctas_per_sm=c)
            rows.append(_bandwidth_row(run, 1.0, nbytes, rep, stages=s, **{"KiB/stage": stage_bytes // 1024,
                                                                            "ctas/SM": c}))
            base = min(base, time_ms(lambda: out.copy_(x), rep=rep))
    for r in rows:
        r["vs torch"] = base / r["ms"]
    if name:
        write_results(name, rows, shape=list(shape), dtype=dtype, torch_ms=base,
                      note="GB/s counts bytes read + bytes written")
    return rows


def compare_designs(k_tiles=(4, 5), *, stages: int = 4, grids=(0.25, 1.0, 2.0), rows_total: int = 200_000,
                    dtype: str = "bfloat16", rep: int = 20, name: str | None = "05_tma_pipeline_designs") -> list[dict]:
    """Time the carried and unrolled designs back to back, per k-iterations per tile and grid size.

    A tile has ``k`` k-iterations of 256 columns (16 KiB boxes); with
    ``k % stages != 0`` the unrolled design re-synchronises once per tile.
    ``grids``: persistent CTAs per SM (0.25 = a quarter of the SMs, where
    each CTA's ring, not HBM, sets the pace). Rows: ``k``, ``CTAs``,
    ``carried ms``, ``unrolled ms``, ``unrolled/carried``, ``per-tile bubble us``
    (the extra time divided by the tiles one CTA runs).
    """
    import torch


    require_tier("gpu", "gemmlab.measure.tma_pipeline.compare_designs")
    rows = []
    bm, bn = default_block(dtype)
    sms = sm_count()
    for k in k_tiles:
        x, scale = _random_inputs((rows_total, k * bn), dtype)
        out = torch.empty_like(x)
        nbytes = 2 * x.numel() * x.element_size()
        m_tiles = -(-rows_total // bm)
        for g in grids:
            ctas = max(1, min(m_tiles, round(g * sms)))
            ms = {}
            for design in DESIGNS:
                run = _checked_run(x, scale, out, stages=stages, design=design, ctas=ctas)
                ms[design] = time_ms(run, rep=rep)
            rows.append({"k": k, "stages": stages, "CTAs": ctas, "carried ms": ms["carried"],
                         "unrolled ms": ms["unrolled"], "unrolled/carried": ms["unrolled"] / ms["carried"],
                         "carried GB/s": copy_bandwidth_gbs(nbytes, ms["carried"]),
                         "per-tile bubble us": (ms["unrolled"] - ms["carried"]) * 1e3 / (m_tiles / ctas)})
        del x, out
    if name:
        write_results(name, rows, dtype=dtype, rows_total=rows_total, block=[bm, bn], sms=sms)
    return rows


#: The tail-bubble experiment: few CTAs (one per SM, HBM far from saturated), each running many tiles.
BUBBLE_CTAS = 16
BUBBLE_TILES_PER_CTA = 64


def _per_tile_us(ms: float, tiles_per_cta: int) -> float:
    return ms * 1e3 / tiles_per_cta


def calibrate_ring(spin_cycles: int = 0, *, k: int = 4, deep_stages: int = 8, ctas: int = BUBBLE_CTAS,
                   tiles_per_cta: int = BUBBLE_TILES_PER_CTA, dtype: str = "bfloat16", rep: int = 10) -> dict:
    """Measure the simulator's ``load_time`` and ``compute_time`` (microseconds) for one CTA's ring.

    The carried design, ``ctas`` CTAs of ``tiles_per_cta`` tiles of ``k``
    k-iterations (16 KiB boxes): with one stage an item costs load + compute,
    with ``deep_stages`` stages only compute (when they cover the latency);
    :func:`gemmlab.simulator.fit_ring` turns the two into the model's numbers.
    """
    import torch


    bm, bn = default_block(dtype)
    x, scale = _random_inputs((ctas * tiles_per_cta * bm, k * bn), dtype)
    out = torch.empty_like(x)
    items = tiles_per_cta * k
    per_item = {}
    for stages in (1, deep_stages):
        run = _checked_run(x, scale, out, stages=stages, design="carried", ctas=ctas, spin_cycles=spin_cycles)
        per_item[stages] = time_ms(run, rep=rep) * 1e3 / items
    load, compute = sm.fit_ring(per_item[1], min(per_item[deep_stages], per_item[1]))
    return {"spin": spin_cycles, "one-stage us/item": per_item[1], "deep us/item": per_item[deep_stages],
            "load us": load, "compute us": compute}


def tail_bubble(spins=(0, 800), stage_counts=(2, 3, 4), *, ctas: int = BUBBLE_CTAS,
                tiles_per_cta: int = BUBBLE_TILES_PER_CTA, dtype: str = "bfloat16", rep: int = 10,
                name: str | None = "05_tma_pipeline_tail_bubble") -> list[dict]:
    """The unrolled design's tail bubble on the GPU, against the simulator's prediction.

    ``ctas`` CTAs (one per SM: HBM is far from saturated, no other CTA fills a
    stall), each running exactly ``tiles_per_cta`` tiles. For each
    ``spin_cycles`` in ``spins`` (synthetic compute: the consumers hold each
    stage that many SM cycles), :func:`calibrate_ring` first measures the
    model's ``load``/``compute``; then, per ring depth ``S`` in
    ``stage_counts``, tiles of ``k = S`` (no tail: the designs differ only in
    how they index the ring) and ``k = S + 1`` (one real slot in the tail
    group: the unrolled design re-synchronises once per tile) are timed in
    both designs, each checked exactly against torch first (output poisoned),
    and compared with :func:`gemmlab.simulator.predict_designs` for the same work.

    Rows (times per tile of one CTA, microseconds): ``spin``, ``stages``,
    ``k``, ``load us``, ``compute us``, ``carried us``, ``unrolled us``,
    ``extra us`` (unrolled - carried), ``net extra us`` (for ``k = S + 1``:
    the extra less the indexing difference measured at ``k = S``, scaled to
    ``k`` items; NaN for ``k = S``), and the model's ``model carried us``,
    ``model unrolled us``, ``model extra us``.
    """
    import torch


    require_tier("gpu", "gemmlab.measure.tma_pipeline.tail_bubble")
    for spin_cycles in spins:
        check_int("spin_cycles", spin_cycles, lo=0, hi=MAX_SPIN_CYCLES)
    bm, bn = default_block(dtype)
    rows, cals = [], []
    for spin_cycles in spins:
        cal = calibrate_ring(spin_cycles, ctas=ctas, tiles_per_cta=tiles_per_cta, dtype=dtype, rep=rep)
        cals.append(cal)
        for stages in stage_counts:
            for k in (stages, stages + 1):
                x, scale = _random_inputs((ctas * tiles_per_cta * bm, k * bn), dtype)
                out = torch.empty_like(x)
                us = {}
                for design in DESIGNS:
                    run = _checked_run(x, scale, out, stages=stages, design=design, ctas=ctas,
                                       spin_cycles=spin_cycles)
                    us[design] = _per_tile_us(time_ms(run, rep=rep), tiles_per_cta)
                del x, out
                pred = sm.predict_designs(stages, (tiles_per_cta, k), cal["load us"], cal["compute us"])
                extra = us["unrolled"] - us["carried"]
                net = float("nan")
                if k == stages + 1:
                    net = extra - rows[-1]["extra us"] * k / stages  # the k = S row just before
                rows.append({"spin": spin_cycles, "stages": stages, "k": k, "load us": cal["load us"],
                             "compute us": cal["compute us"], "carried us": us["carried"],
                             "unrolled us": us["unrolled"], "extra us": extra, "net extra us": net,
                             "model carried us": pred["carried"] / tiles_per_cta,
                             "model unrolled us": pred["unrolled"] / tiles_per_cta,
                             "model extra us": pred["extra per tile"]})
    if name:
        write_results(name, [{k: (None if v != v else v) for k, v in r.items()} for r in rows],
                      calibrations=cals, ctas=ctas, tiles_per_cta=tiles_per_cta, dtype=dtype, block=[bm, bn],
                      note="microseconds per tile of one CTA; model = gemmlab.simulator with the calibrated "
                           "load/compute times")
    return rows


def draw_tail_bubble(rows: list[dict], name: str = "05_tail_bubble", *, measured_on: str | None = None) -> str:
    """Measured against predicted extra time per tile of the unrolled design, per (spin, stages, k).

    ``measured_on``: "device, date" for the title (default: this GPU, today: :func:`gemmlab.measure.bench.measured_on`).
    """

    fig, ax = new_figure(figsize=(9.0, 3.8))
    labels = [f"S={r['stages']} k={r['k']}\n{r['spin']} cyc" for r in rows]
    xs = range(len(rows))
    w = 0.27
    ax.bar([x - w for x in xs], [r["extra us"] for r in rows], w, label="measured: unrolled - carried")
    net = [r["net extra us"] for r in rows]  # NaN (or None, read back from JSON) where there is no k = S twin
    ax.bar(list(xs), [0.0 if v is None or v != v else v for v in net], w,
           label="measured, less the indexing cost (k = S)")
    ax.bar([x + w for x in xs], [r["model extra us"] for r in rows], w, label="simulator prediction")
    ax.axhline(0, color="black", lw=0.6)
    ax.set_xticks(list(xs))
    ax.set_xticklabels(labels, fontsize=7)
    ax.set_ylabel("extra us per tile (one CTA)")
    top = max([r["extra us"] for r in rows] + [r["model extra us"] for r in rows] + [0.1])
    ax.set_ylim(top=top * 1.4)
    ax.legend(fontsize=7, loc="upper left", ncol=3)
    ax.set_title("the unrolled design's tail bubble: spin cycles per stage, stages S, k-iterations per tile "
                 f"({measured_on or _measured_on()})", fontsize=9)
    return str(save(fig, name))


def table(rows: list[dict], columns) -> str:

    return f"device: {device_name()}\n" + format_table(rows, columns)


BENCH_COLUMNS = [("kernel", "kernel", ""), ("ms", "ms", ".3f"), ("GB/s", "GB/s", ".0f"), ("vs torch", "vs torch", ".3f")]
SWEEP_COLUMNS = [("stages", "stages", ""), ("KiB/stage", "KiB/stage", ""), ("ctas/SM", "CTAs/SM", ""), ("ms", "ms", ".3f"), ("GB/s", "GB/s", ".0f"),
                 ("vs torch", "vs torch", ".3f")]
DESIGN_COLUMNS = [("k", "k/tile", ""), ("CTAs", "CTAs", ""), ("carried GB/s", "carried GB/s", ".0f"), ("carried ms", "carried ms", ".3f"),
                  ("unrolled ms", "unrolled ms", ".3f"), ("unrolled/carried", "unrolled/carried", ".3f"),
                  ("per-tile bubble us", "bubble us/tile", ".2f")]
BUBBLE_COLUMNS = [("spin", "spin", ""), ("stages", "S", ""), ("k", "k", ""), ("load us", "load", ".2f"),
                  ("compute us", "compute", ".2f"), ("carried us", "carried", ".2f"),
                  ("unrolled us", "unrolled", ".2f"),
                  ("extra us", "extra", ".2f"), ("net extra us", "net extra", ".2f"),
                  ("model carried us", "model carried", ".2f"), ("model unrolled us", "model unrolled", ".2f"),
                  ("model extra us", "model extra", ".2f")]


def draw_stage_sweep(rows: list[dict], name: str = "05_bandwidth_vs_stages", *, measured_on: str | None = None) -> str:
    """GB/s against stages, one line per (KiB/stage, CTAs/SM), torch's copy dashed; returns the figure's path.

    ``measured_on``: "device, date" for the title (default: this GPU, today: :func:`gemmlab.measure.bench.measured_on`).
    """

    fig, ax = new_figure(figsize=(6.5, 3.8))
    for kib, c in sorted({(r["KiB/stage"], r["ctas/SM"]) for r in rows}, reverse=True):
        pts = sorted((r["stages"], r["GB/s"]) for r in rows if r["ctas/SM"] == c and r["KiB/stage"] == kib)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=f"{kib} KiB stages, {c} CTA(s)/SM")
    if rows:
        ax.axhline(rows[0]["GB/s"] / rows[0]["vs torch"], color="gray", ls="--", label="torch copy_ (same bytes)")
    ax.set_xlabel("stages in the x ring")
    ax.set_ylabel("GB/s (read + write)")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8, loc="lower right")
    ax.set_title(f"TMA pipeline row_scale, bfloat16, 1 GiB ({measured_on or _measured_on()})", fontsize=10)
    return str(save(fig, name))
