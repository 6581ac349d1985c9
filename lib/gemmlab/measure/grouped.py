"""Chapter 08's measurements, read back: the heuristic's regret, the bounds, the headline numbers, traced launches.

Each function takes what a ``benchmarks/grouped_gemm.py`` run stored (``results/<device>/grouped_gemm_*.json``)
and computes what the chapter and the README say about it: how far the heuristic's choice is from the best
swept tile (:func:`heuristic_regret`), what a ping-pong kernel could win at best (:func:`ping_pong_bound`), the
store's gain where :func:`~gemmlab.family.heuristic_grouped.store_under_next` turns it on (:func:`store_gains`),
each set against two model times (:func:`expert_bounds`) and against the GPU's measured ceilings
(:func:`measured_roofline`), the benchmark's headline (:func:`summarize`), a decode launch's fixed cost
(:func:`fit_launch_cost`). :func:`trace_launches` runs the traced kernel and :func:`timeline` reads where a
launch's time goes. :mod:`.grouped_tables` prints and draws them.
"""
from __future__ import annotations

from .. import hardware
from ..family.configs import Sm90Config
from ..family.heuristic_grouped import (config_for_gpu, default_config, dynamic_schedule, ragged_grid, schedule,
                                        store_under_next)
from ..family.plan import dummies, grouped_kernel, grouped_machine, new_workspace
from ..family.problem import DTYPE_BITS, ragged_problem
from ..grouped_model import skewed_sizes
from .bench import geomean, line_fit


#: Issue 28's widened MoE family: ``(model, experts on one GPU, hidden size, expert width)`` from each model's
#: published configuration. Each gives two expert GEMMs: gate/up (N = width, K = hidden) and down (N = hidden,
#: K = width). DeepSeek-V3's 256 experts are spread 8 ways (expert parallelism): 32 on one GPU.
MOE_WIDE_MODELS = (
    ("Mixtral-8x7B", 8, 4096, 14336),
    ("Mixtral-8x22B", 8, 6144, 16384),
    ("DBRX", 16, 6144, 10752),
    ("Qwen2-57B-A14B", 64, 3584, 2560),
    ("Qwen3-30B-A3B", 128, 2048, 768),
    ("Qwen3-235B-A22B", 128, 4096, 1536),
    ("DeepSeek-V3 EP8", 32, 7168, 2048),
    ("OLMoE-1B-7B", 64, 2048, 1024),
    ("gpt-oss-120b", 128, 2880, 2880),
)
#: Routed rows per launch (tokens x top-k reaching the layer): decode batches to a long prefill, not powers of two.
MOE_WIDE_TOKENS = (32, 96, 384, 1000, 4096, 16384)


def moe_wide_sets(models=MOE_WIDE_MODELS):
    """``(label, groups, N, K)`` of every expert GEMM of :data:`MOE_WIDE_MODELS`."""
    out = []
    for name, experts, hidden, width in models:
        out.append((f"{name} gate/up", experts, width, hidden))
        out.append((f"{name} down", experts, hidden, width))
    return out


def summarize_wide(rows) -> dict:
    """The widened family's headline: the public call (default arguments), ``validate=False`` and the kernels
    against ``torch._grouped_mm``, overall, by token count and by model."""
    def stats(key, rs):
        vals = [r[key] for r in rs]
        worst = min(rs, key=lambda r: r[key])
        return {"geomean": geomean(vals), "min": min(vals), "below_1": sum(v < 1.0 for v in vals),
                "worst": f"{worst['shape']} T={worst['tokens']}"}
    out = {"sets": len(rows), "max_rel_err": max(r["rel_err"] for r in rows)}
    for key in ("vs_torch", "vs_torch_novalidate", "vs_torch_kernel"):
        out[key] = stats(key, rows)
    out["by_tokens"] = {str(t): geomean([r["vs_torch"] for r in rows if r["tokens"] == t])
                        for t in sorted({r["tokens"] for r in rows})}
    models = sorted({r["shape"].rsplit(" ", 1)[0] for r in rows})
    out["by_model"] = {m: geomean([r["vs_torch"] for r in rows if r["shape"].rsplit(" ", 1)[0] == m])
                       for m in models}
    return out


def sweep_column(cfg: Sm90Config, dynamic: bool) -> str:
    """The column of ``benchmarks/grouped_gemm.py sweep*`` that times ``cfg`` (e.g. ``"128x256 c2 s4"``,
    ``"64x128 s8 dyn"``)."""
    pair = " c2" if cfg.cluster == (2, 1) else ""
    return f"{cfg.tile_m}x{cfg.tile_n}{pair} s{cfg.stages}" + (" dyn" if dynamic else "")


def heuristic_regret(doc: dict, gpu: str) -> list[tuple[float, dict]]:
    """For each set of a stored ``sweep_sched`` run on ``gpu`` (``GPUSpec.short``): the time of the tile
    :func:`~gemmlab.family.heuristic_grouped.choose_config` and
    :func:`~gemmlab.family.heuristic_grouped.dynamic_schedule` pick, over the best swept one's (1.0: the best)."""
    out = []
    for r in doc["rows"]:
        cfg = config_for_gpu(gpu, r["tokens"], r["groups"], r["n"], r["k"])
        best = min(r[f"{c}_ms"] for c in doc["configs"])
        out.append((r[f"{sweep_column(cfg, dynamic_schedule(cfg))}_ms"] / best, r))
    return out


def best_tile_ratio(doc: dict, tile: str, against: str) -> list[tuple[float, dict]]:
    """For each set of a stored sweep: the fastest swept configuration of ``tile`` (a column prefix such as
    ``"128x128"``: alone or in pairs, static or dynamic) over the fastest of ``against``, ``[(ratio, row), ...]``.
    Above 1: ``tile`` is slower even at its best."""
    def best(prefix):
        cols = [c for c in doc["configs"] if c.split(" ")[0] == prefix]
        if not cols:
            raise ValueError(f"the sweep times no {prefix} tile; its columns: {sorted(doc['configs'])}")
        return lambda row: min(row[f"{c}_ms"] for c in cols)
    slow, fast = best(tile), best(against)
    return [(slow(r) / fast(r), r) for r in doc["rows"]]


#: A 128 x 256 tile's store as a share of its main loop with K = 2048, traced on an H100 (chapter 08: 1.4-2.0 us
#: against about 22 us); with a longer K the main loop grows and the share shrinks as 2048 / K.
STORE_SHARE_K2048 = 0.07


def ping_pong_bound(doc: dict, store_share: float = STORE_SHARE_K2048) -> list[tuple[float, dict]]:
    """For each set of a stored ``sweep_128x128``: how fast a ping-pong kernel with 128 x 128 tiles could be at
    best, as its time over our best 128 x 256 time, ``[(bound, row), ...]``.

    It runs the same main loops as our kernel with 128 x 128 tiles and hides their stores, no more. Those stores
    take at most what a 128 x 256 tile's does (each warpgroup stores half as much) and there are twice as many,
    so hiding them all wins back at most twice the store's share of our time: ``store_share * 2048 / K`` each.
    """
    return [(x - 2 * store_share * 2048 / r["k"], r) for x, r in best_tile_ratio(doc, "128x128", "128x256")]


def store_gains(doc: dict) -> dict:
    """A stored ``overlap`` run: the store under the next main loop against between main loops, split by
    :func:`~gemmlab.family.heuristic_grouped.store_under_next` over the 128-row tiles (``"on"``: the sets it turns it on for, ``"off"``: the others;
    each ``{"sets", "geomean", "min", "max", "faster"}``), and the kernel against ``torch._grouped_mm`` over all
    sets with the store between main loops and as the rule places it (``"vs_torch_between"``,
    ``"vs_torch_rule"``)."""
    def tile(r):
        f = Sm90Config.parse_name(r["config"])
        return Sm90Config(tile_m=f["tile_m"], tile_n=f["tile_n"])

    def stats(gains):
        return {"sets": len(gains), "geomean": geomean(gains), "min": min(gains), "max": max(gains),
                "faster": sum(g > 1 for g in gains)}
    rows = doc["rows"]
    on, off, rule = [], [], []
    for r in rows:
        cfg = tile(r)
        under = store_under_next(cfg, r["tokens"], r["groups"])
        if cfg.tile_m == 128:
            (on if under else off).append(r["under_gain"])
        rule.append(r["torch_ms"] / (r["under_ms"] if under else r["between_ms"]))
    return {"on": stats(on), "off": stats(off), "vs_torch_between": geomean([r["vs_torch_between"] for r in rows]),
            "vs_torch_rule": geomean(rule)}


def expert_bounds(m_sizes, n: int, k: int, tflops: float, tbs: float, unit_rows: int = 128,
                  dtype: str = "bfloat16") -> tuple[float, float]:
    """Two model times (ms) for a ragged launch: ``(one_after_another, overlapped)``.

    Each live expert costs its padded compute (its rows rounded up to ``unit_rows``, the rows a tile or a pair's
    unit computes, at ``tflops``) and its bytes (its weights and its rows of A and C, at ``tbs``). Run one after
    another, each bound by the larger of the two, the experts take the sum of those maxima; with the
    bandwidth-bound experts running beside the compute-bound ones, the launch could take the larger of the two sums.
    """
    esize = DTYPE_BITS[dtype] // 8
    comp = byts = serial = 0.0
    for m in m_sizes:
        if m <= 0:
            continue
        c = 2 * -(-m // unit_rows) * unit_rows * n * k / (tflops * 1e12)
        b = esize * (n * k + m * k + m * n) / (tbs * 1e12)
        comp, byts, serial = comp + c, byts + b, serial + max(c, b)
    return serial * 1e3, max(comp, byts) * 1e3


def expert_bound_rows(doc: dict) -> list[dict]:
    """The sets of a stored ``moe`` run with 128 x 256 tiles, against :func:`expert_bounds` at the run's own measured
    ceilings (the router's sizes recomputed by :func:`gemmlab.grouped_model.skewed_sizes`): each ``{"row", "serial_ms", "overlapped_ms",
    "measured_over_serial", "overlapped_over_serial"}``."""
    out = []
    ceil = doc["measured"]
    for r in doc["rows"]:
        f = Sm90Config.parse_name(r["config"])
        tile_m, tile_n, cluster = f["tile_m"], f["tile_n"], f["cluster"]
        if (tile_m, tile_n) != (128, 256):
            continue
        unit = tile_m * cluster[0]  # the rows of a tile, or of a pair's unit
        serial, overlapped = expert_bounds(skewed_sizes(r["tokens"], r["groups"]), r["n"], r["k"],
                                           ceil["gemm_tflops"], ceil["copy_tbs"], unit_rows=unit)
        out.append({"row": r, "serial_ms": serial, "overlapped_ms": overlapped,
                    "measured_over_serial": r["gemmlab_kernel_ms"] / serial, "overlapped_over_serial": overlapped / serial})
    return out


def order_by_tokens(rows) -> dict:
    """Rows of ``benchmarks/grouped_gemm.py order`` by token count: ``{tokens: {"sets", "geomean",
    "largest_first_wins"}}``, the geomean of index order's time over largest first's (above 1: largest first is
    faster) and the sets where it is."""
    out = {}
    for t in sorted({r["tokens"] for r in rows}):
        ratios = [r["index_over_largest"] for r in rows if r["tokens"] == t]
        out[t] = {"sets": len(ratios), "geomean": geomean(ratios), "largest_first_wins": sum(x > 1 for x in ratios)}
    return out


def decode_rows(rows) -> list[dict]:
    """The "decode" sets of a ``moe`` run: at most 16 tokens per expert on average, where the weights dominate
    the bytes and the HBM roofline is the bound to reach."""
    return [r for r in rows if r["tokens"] <= 16 * r["groups"]]


def floor_ms(flops: float, nbytes: float, tflops: float, tbs: float) -> float:
    """The roofline's time for ``flops`` and ``nbytes`` at ``tflops`` TFLOP/s and ``tbs`` TB/s, in ms."""
    return max(flops / (tflops * 1e12), nbytes / (tbs * 1e12)) * 1e3


def measured_roofline(rows, ceilings: dict) -> list[dict]:
    """Each ``moe`` row's floor against the GPU's *measured* ceilings, added to the row and returned.

    ``ceilings``: :func:`gemmlab.measure.bench.measured_ceilings` of the same run (``copy_tbs``, ``gemm_tflops``).
    A row's floor is then ``max(FLOPs / gemm_tflops, bytes / copy_tbs)`` (``measured_floor_ms``) and
    ``of_measured_roofline`` that floor over the kernel's time. The datasheet's floor (``floor_ms``,
    ``of_roofline``) stays beside it: neither a copy nor cuBLAS reaches the datasheet (an H200's 4.8 TB/s
    copies at about 4.2-4.3), so that one is a bound no kernel meets, this one the best this GPU showed
    doing the simplest thing with the same resource.
    """
    tflops, tbs = ceilings["gemm_tflops"], ceilings["copy_tbs"]
    if not (tflops > 0 and tbs > 0):
        raise ValueError(f"ceilings: gemm_tflops and copy_tbs must be positive; got {tflops!r}, {tbs!r}")
    for r in rows:
        floor = floor_ms(r["flops"], r["bytes"], tflops, tbs)
        r["measured_floor_ms"] = floor
        r["of_measured_roofline"] = floor / r["gemmlab_kernel_ms"]
    return rows


def summarize(rows) -> dict:
    """The MoE benchmark's headline numbers from its rows (``benchmarks/grouped_gemm.py moe``; decode sets as
    :func:`decode_rows` counts them)."""
    decode = decode_rows(rows)
    out = {
        "sets": len(rows),
        "geomean_vs_torch": geomean([r["vs_torch"] for r in rows]),
        "min_vs_torch": min(r["vs_torch"] for r in rows),
        "geomean_vs_torch_novalidate": geomean([r["vs_torch_novalidate"] for r in rows]),
        "geomean_vs_torch_kernel": geomean([r["vs_torch_kernel"] for r in rows]),
        "min_vs_torch_novalidate": min(r["vs_torch_novalidate"] for r in rows),
        "min_vs_torch_kernel": min(r["vs_torch_kernel"] for r in rows),
        "geomean_vs_loop": geomean([r["vs_loop"] for r in rows]),
        "decode_sets": len(decode),
        "decode_of_roofline_min": min((r["of_roofline"] for r in decode), default=None),
        "decode_of_roofline_geomean": geomean([r["of_roofline"] for r in decode]) if decode else None,
        "max_rel_err": max(r["rel_err"] for r in rows),
    }
    if decode and all("of_measured_roofline" in r for r in rows):
        out["decode_of_measured_roofline_min"] = min(r["of_measured_roofline"] for r in decode)
        out["decode_of_measured_roofline_geomean"] = geomean([r["of_measured_roofline"] for r in decode])
    order = [r["order_gain"] for r in rows if r.get("order_gain") is not None]
    if order:
        out["geomean_order_gain"] = geomean(order)
        out["min_order_gain"] = min(order)
    mixed = [r["mixed_gain"] for r in rows if r.get("mixed_gain") is not None]
    if mixed:
        out["geomean_mixed_gain"] = geomean(mixed)
        out["min_mixed_gain"] = min(mixed)
        out["mixed_sets"] = len(mixed)
    sched = [r["sched_gain"] for r in rows if r.get("sched_gain") is not None]
    if sched:
        out["geomean_sched_gain"] = geomean(sched)
        out["min_sched_gain"] = min(sched)
    if all("l2_gain" in r for r in rows):
        out["geomean_l2_gain"] = geomean([r["l2_gain"] for r in rows])
        out["min_l2_gain"] = min(r["l2_gain"] for r in rows)
    if all("vs_padded" in r for r in rows):
        out["geomean_vs_padded"] = geomean([r["vs_padded"] for r in rows])
    return out


def fit_launch_cost(rows, min_waves: float = 4.0) -> dict:
    """A straight line through decode launches of growing size: ``{"fixed_us", "us_per_expert", "tbs"}``.

    ``rows``: ``{"live", "waves", "us", "bytes_per_expert"}`` each (``benchmarks/grouped_gemm.py tail``),
    one family (one N, K). Least squares over the rows of at least ``min_waves`` waves of tiles: the
    slope is what one more expert's weights cost (``tbs``: the rate they stream at), the intercept the
    launch's fixed cost (start, pipeline fill, drain, and the last wave's tail on average).
    """
    pts = [(r["live"], r["us"]) for r in rows if r["waves"] >= min_waves]
    if len(pts) < 2:
        raise ValueError(f"rows: need two launches of at least {min_waves} waves to fit a line; got {len(pts)}")
    fixed, slope = line_fit(pts)
    per_expert = rows[0]["bytes_per_expert"]
    return {"fixed_us": fixed, "us_per_expert": slope, "tbs": per_expert / (slope * 1e-6) / 1e12}


def against_streaming_read(moe_doc: dict, tail_doc: dict) -> list[tuple[dict, float]]:
    """Each decode set of a ``moe`` run (:func:`decode_rows`) against a plain streaming read of its bytes on the
    same GPU: ``[(row, read_us / kernel_us), ...]``.

    ``read_us`` is the line ``benchmarks/grouped_gemm.py tail`` fits through ``torch.sum`` over 128 MiB to
    2 GiB (``tail_doc["stream_read_fit"]``: fixed cost plus bytes at its rate), for the bytes the set must
    move (A, the live experts' weights and C: on these weight-bound sets ``floor_ms`` times the datasheet
    bandwidth). Above 1: the kernel moves them faster than that read would.
    """
    fit = tail_doc["stream_read_fit"]
    hbm = moe_doc["hbm_gbs"] * 1e9
    out = []
    for r in decode_rows(moe_doc["rows"]):
        if not r["weight_bound"]:
            continue
        nbytes = r["floor_ms"] * 1e-3 * hbm
        read_us = fit["fixed_us"] + nbytes / (fit["tbs"] * 1e12) * 1e6
        out.append((r, read_us / (r["gemmlab_kernel_ms"] * 1e3)))
    return out


def trace_launches(a, b, offs, *, launches: int = 3, config: Sm90Config | None = None,
                   dynamic: bool | None = None) -> dict:
    """Run the ragged call ``launches`` times back to back with the traced kernel; return each CTA's timeline.

    ``{"points": TRACE_POINTS, "launches": [(grid, len(points)) int64 tensors on the CPU], "grid", "config"}``:
    ``%globaltimer`` nanoseconds (a clock shared by all SMs) and the tile count, one row per CTA, one
    workspace per launch so that nothing is overwritten. :func:`timeline` reads them.
    """
    import torch

    from ..kernels.grouped_sm90 import TRACE_POINTS
    problem = ragged_problem(a, b, offs, validate=True)
    grouped_machine(a.device, "gemmlab.measure.grouped.trace_launches")  # Hopper, CUDA tensors
    rows, groups, n = problem.tokens, problem.groups, problem.n
    cfg = config or default_config(rows, groups, n, problem.k, a.device, problem.dtype)
    sms = hardware.sm_count(a.device)
    grid = ragged_grid(cfg, sms, rows, groups, n)
    sched = schedule(cfg, problem, dynamic=dynamic, overlap_store=False, mixed=0)
    fn = grouped_kernel(cfg, "ragged", problem.b_major, sched, trace=True)
    out = torch.empty((rows, n), dtype=a.dtype, device=a.device)
    _, table = dummies(a.device)
    spaces = [new_workspace(a.device, sms, cfg, trace=True) for _ in range(launches)]
    fn(a, b, out, offs, table, spaces[0], groups, grid, 0)  # warm: the descriptor cache and the clocks
    torch.cuda.synchronize()
    for ws in spaces:
        fn(a, b, out, offs, table, ws, groups, grid, 0)
    torch.cuda.synchronize()
    return {"points": TRACE_POINTS, "grid": grid, "config": cfg.name,
            "launches": [ws[:grid, -1, :len(TRACE_POINTS)].cpu() for ws in spaces]}


def timeline(traced: dict) -> dict:
    """Where a launch's time goes, in microseconds, from :func:`trace_launches` (medians over launches).

    ``span``: first CTA entry to last CTA exit. ``gap``: last exit of one launch to the first entry of
    the next. ``entry_skew``: last CTA entry minus first. ``to_first_load``: a CTA's entry to its first TMA
    load (median over CTAs). ``first_tile``: entry to the end of its first tile's main loop (median).
    ``drain``: last main loop's end to exit (median). ``tail``: last exit minus the median CTA's exit.
    """
    import statistics
    pts = list(traced["points"])
    col = {p: pts.index(p) for p in pts}
    runs = [t.tolist() for t in traced["launches"]]
    us = lambda ns: ns / 1e3
    per = []
    for i, rows in enumerate(runs):
        live = [r for r in rows if r[col["tiles"]] > 0]
        entry = [r[col["entry"]] for r in rows]
        exits = [r[col["exit"]] for r in rows]
        d = {"span": us(max(exits) - min(entry)), "entry_skew": us(max(entry) - min(entry)),
             "to_first_load": us(statistics.median(r[col["first_load"]] - r[col["entry"]] for r in live)),
             "first_tile": us(statistics.median(r[col["first_mainloop_end"]] - r[col["entry"]] for r in live)),
             "drain": us(statistics.median(r[col["exit"]] - r[col["last_mainloop_end"]] for r in live)),
             "tail": us(max(exits) - statistics.median(exits)),
             "tiles_max": max(r[col["tiles"]] for r in rows), "tiles_min": min(r[col["tiles"]] for r in rows)}
        if i + 1 < len(runs):
            d["gap"] = us(min(r[col["entry"]] for r in runs[i + 1]) - max(exits))
        per.append(d)
    keys = set().union(*per)  # "gap" is missing from the last launch
    return {k: statistics.median(d[k] for d in per if k in d) for k in sorted(keys)}

