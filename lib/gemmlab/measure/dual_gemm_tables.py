"""Chapter 11's tables and figures: the benchmark against both baselines, the roofline, the B200 prediction.

Kept apart from :mod:`gemmlab.measure.dual_gemm` (what measures) as chapter 08 keeps :mod:`.grouped_tables`:
these functions read rows (``benchmarks/dual_gemm.py`` writes them to ``results/<device>/dual_gemm.json``;
:func:`gemmlab.measure.dual_gemm.prediction_table` computes the prediction) and never launch anything.
"""
from __future__ import annotations

import math

from .. import nvfp4 as fp4
from ..figures import format_table, new_figure, save
from .dual_gemm import BEST_PUBLIC_US

#: The goals the Hopper twin is held to: geomean speed-up over baseline (b) and over baseline (a).
GOAL_VS_B = 1.10
GOAL_VS_A = 3.0

BENCH_COLUMNS = [
    ("shape", "M x N x K", ""),
    ("ok", "correct", ""),
    ("gemmlab_us", "gemmlab us", ".1f"),
    ("prepared_us", "prepared us", ".1f"),
    ("stock_b_us", "(b) us", ".1f"),
    ("reference_a_us", "(a) us", ".1f"),
    ("vs_b", "x (b)", ".2f"),
    ("vs_a", "x (a)", ".1f"),
    ("prepared_kernel_us", "kernel us", ".1f"),
    ("stock_b_kernels_us", "(b) kernels us", ".1f"),
    ("vs_b_kernel", "x (b) kernels", ".2f"),
    ("roofline_us", "roofline us", ".1f"),
    ("of_roofline", "of roofline", ".2f"),
]
#: Shown when the run also timed chapter 11's simple (first-draft) twin.
SIMPLE_COLUMNS = [("simple_kernel_us", "simple twin us", ".1f"), ("vs_simple_kernel", "x simple", ".1f")]


def _geomean(values):
    values = [v for v in values if v and v > 0]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def summarize(rows: list[dict]) -> dict:
    """Geomeans over the rows that ran: the public call's speed-up over (a) and (b), the kernels' over (b)."""
    good = [r for r in rows if "error" not in r]
    out = {"shapes": len(rows), "ran": len(good), "all_correct": all(r.get("ok") for r in rows) and bool(rows)}
    for key in ("vs_a", "vs_b", "vs_b_prepared", "vs_b_kernel", "of_roofline"):
        out[f"geomean_{key}"] = _geomean([r.get(key) for r in good])
    for key in ("gemmlab_us", "prepared_kernel_us", "stock_b_us", "reference_a_us"):
        out[f"geomean_{key}"] = _geomean([r.get(key) for r in good])
    vb, va = out["geomean_vs_b"], out["geomean_vs_a"]
    out["goal_vs_b"] = None if vb is None else vb >= GOAL_VS_B
    out["goal_vs_a"] = None if va is None else va >= GOAL_VS_A
    return out


def format_bench(doc: dict) -> str:
    """The benchmark's rows as a fixed-width table (failed rows say so), its device and geomeans after it."""

    rows = doc.get("rows", [])
    lines = [f"{doc.get('device', '?')}: NVFP4 gated dual GEMM, microseconds (median of interleaved rounds)"]
    ok_rows, bad = [], []
    for r in rows:
        shape = f"{r['m']}x{r['n']}x{r['k']}"
        if "error" in r:
            bad.append(f"{shape}: FAILED: {r['error'].strip().splitlines()[-1]}")
        else:
            ok_rows.append({**r, "shape": shape})
    if ok_rows:
        cols = BENCH_COLUMNS + (SIMPLE_COLUMNS if all("simple_kernel_us" in r for r in ok_rows) else [])
        lines.append(format_table(ok_rows, cols))
    lines += bad
    s = doc.get("summary") or summarize(rows)
    if s.get("geomean_vs_b") is not None:
        lines.append(f"geomean: x{s['geomean_vs_b']:.2f} over (b) (goal {GOAL_VS_B}: "
                     f"{'met' if s['goal_vs_b'] else 'NOT met'}), x{s['geomean_vs_a']:.1f} over (a) (goal {GOAL_VS_A}: "
                     f"{'met' if s['goal_vs_a'] else 'NOT met'}); kernels alone x{s['geomean_vs_b_kernel']:.2f} over "
                     f"(b)'s; {s['geomean_of_roofline']:.2f} of the roofline")
    return "\n".join(lines)


PROBE_COLUMNS = ["chosen", "joint roles", "3 stages", "convert only (no_mma)", "MMA only (no_convert)"]


def format_probe(doc: dict) -> str:
    """``benchmarks/dual_gemm.py probe``'s rows: the fast twin's variants, kernel microseconds per launch."""

    rows = [{**r, "shape": f"{r['m']}x{r['n']}x{r['k']}"} for r in doc.get("rows", [])]
    widths = sorted({k for r in rows for k in r if k.startswith("tile_n ")}, key=lambda k: int(k.split()[1]))
    cols = ([("shape", "M x N x K", ""), ("tile_n", "tile_n", "")] + [(c, c, ".1f") for c in PROBE_COLUMNS]
            + [(w, w, ".1f") for w in widths])
    return (f"{doc.get('device', '?')}: the fast twin's kernel, microseconds per launch (CUDA graph)\n"
            + format_table(rows, cols))


def format_check(doc: dict) -> str:
    """The correctness sweep as text: one line per shape."""
    lines = []
    for r in doc.get("rows", []):
        shape = f"{r['m']}x{r['n']}x{r['k']}"
        if "error" in r:
            lines.append(f"{shape:>16}: FAILED: {r['error'].strip().splitlines()[-1]}")
        else:
            lines.append(f"{shape:>16}: {'OK' if r['ok'] else 'MISMATCH'}, max |err| = {r['max_abs_err']:.3g}, "
                         f"{r['bad']} of {r['total']} outside rtol = atol = {fp4.RTOL:g}; "
                         f"baseline (b) {'OK' if r.get('stock_ok') else 'MISMATCH'}")
    lines.append(f"{doc.get('passed')} / {doc.get('total')} shapes passed on {doc.get('device', '?')}")
    return "\n".join(lines)


def format_roofline(rows: list[dict]) -> str:
    """:func:`gemmlab.measure.dual_gemm.roofline_table` as text."""
    out = [f"{'M x N x K':>16} {'GPU':>5} {'MB':>7} {'GFLOP':>7} {'bytes us':>9} {'FLOPs us':>9} {'bound':>8}"
           f" {'B200 SOL (GPU MODE)':>19}"]
    for r in rows:
        sol = f"{r['sol_us']:19.3f}" if r.get("sol_us") else ""
        out.append(f"{r['m']:>5}x{r['n']}x{r['k']:<5} {r['gpu']:>5} {r['bytes'] / 1e6:7.2f} {r['flops'] / 1e9:7.2f} "
                   f"{r['memory_us']:9.3f} {r['compute_us']:9.3f} {r['bound']:>8} {sol}")
    return "\n".join(out)


def format_prediction(rows: list[dict]) -> str:
    """:func:`gemmlab.measure.dual_gemm.prediction_table` as text, every line labelled a prediction."""
    out = ["PREDICTED (not measured) on a B200, microseconds:",
           f"{'M x N x K':>16} {'tile':>8} {'stages':>6} {'CTAs':>5} {'predicted range':>17} {'roofline':>9} "
           f"{'GPU MODE SOL':>12}"]
    for r in rows:
        out.append(f"{r['m']:>5}x{r['n']}x{r['k']:<5} {'128x' + str(r['tile_n']):>8} {r['stages']:>6} {r['ctas']:>5} "
                   f"{r['low_us']:7.1f} - {r['high_us']:<7.1f} {r['roofline_us']:9.2f} {r['sol_us'] or float('nan'):12.3f}")
    return "\n".join(out)


def best_per_shape(rows: list[dict]) -> list[dict]:
    """The prediction row with the least predicted time for each shape (the tile a heuristic would pick)."""
    best = {}
    for r in rows:
        key = (r["m"], r["n"], r["k"])
        if key not in best or r["predicted_us"] < best[key]["predicted_us"]:
            best[key] = r
    return list(best.values())


def draw_prediction(rows: list[dict], name: str = "11_prediction"):
    """Per benchmark shape: GPU MODE's speed of light, the predicted range (best tile), and the best public
    result's geomean as a line. Returns ``(path, data)``."""
    import numpy as np


    best = best_per_shape(rows)
    labels = [f"{r['m']}x{r['n']}\nx{r['k']}" for r in best]
    x = np.arange(len(best))
    fig, ax = new_figure(figsize=(8.2, 4.6))
    sol = [r["sol_us"] for r in best]
    mid = [r["predicted_us"] for r in best]
    lo = [r["predicted_us"] - r["low_us"] for r in best]
    hi = [r["high_us"] - r["predicted_us"] for r in best]
    ax.bar(x - 0.2, sol, 0.38, color="#999999", label="speed of light (GPU MODE)")
    ax.bar(x + 0.2, mid, 0.38, color="tab:orange", alpha=0.8, yerr=[lo, hi], capsize=4,
           label="PREDICTED: SM100 kernel, range (best tile)")
    for xi, r in zip(x, best):
        ax.text(xi + 0.2, r["high_us"] + 0.3, f"128x{r['tile_n']}", ha="center", fontsize=7)
    ax.axhline(BEST_PUBLIC_US, color="tab:blue", ls="--", lw=1.2,
               label=f"best public result, geomean of the four shapes (~{BEST_PUBLIC_US} us)")
    geo_sol = _geomean(sol)
    ax.axhline(geo_sol, color="#555555", ls=":", lw=1.2, label=f"speed of light, geomean ({geo_sol:.3f} us)")
    ax.set_xticks(x)
    ax.set_xticklabels(labels, fontsize=8)
    ax.set_ylabel("microseconds (lower is better)")
    ax.set_title("NVFP4 gated dual GEMM on a B200: a PREDICTION next to the bounds (no B200 was used)", fontsize=10)
    ax.legend(fontsize=7, loc="upper left")
    ax.set_ylim(0, max(max(r["high_us"] for r in best), BEST_PUBLIC_US) * 1.35)
    data = [(r["m"], r["n"], r["k"], r["tile_n"], r["sol_us"], r["low_us"], r["predicted_us"], r["high_us"])
            for r in best]
    return save(fig, name), data


def draw_benchmark(docs: list[dict], name: str = "11_benchmark"):
    """Measured microseconds per shape and device: the public call, the kernel alone, (b), (a), the roofline.

    Log scale (baseline (a) is an order of magnitude slower). Returns ``(path, data)``.
    """
    import numpy as np


    docs = [d for d in docs if d and any("error" not in r for r in d.get("rows", []))]
    if not docs:
        raise ValueError("docs must hold at least one benchmark result with a row that ran")
    fig, axes = new_figure(1, len(docs), figsize=(6.5 * len(docs), 4.6), squeeze=False)
    series = [("gemmlab_us", "gemmlab (public call)", "tab:orange"),
              ("prepared_kernel_us", "gemmlab kernel alone", "tab:red"),
              ("stock_b_us", "(b) BF16 weights + cuBLAS", "tab:green"),
              ("reference_a_us", "(a) dequantize every call, FP32", "tab:purple"),
              ("roofline_us", "roofline", "#999999")]
    data = {}
    for ax, doc in zip(axes[0], docs):
        rows = [r for r in doc["rows"] if "error" not in r]
        x = np.arange(len(rows))
        w = 0.8 / len(series)
        for i, (key, label, colour) in enumerate(series):
            ax.bar(x - 0.4 + w * (i + 0.5), [r[key] for r in rows], w, color=colour, label=label)
        ax.set_yscale("log")
        ax.set_xticks(x)
        ax.set_xticklabels([f"{r['m']}x{r['n']}\nx{r['k']}" for r in rows], fontsize=8)
        ax.set_ylabel("microseconds (log, lower is better)")
        ax.set_title(f"{doc.get('device', '?')}, {str(doc.get('date', '?'))[:10]}", fontsize=10)
        data[doc.get("device", "?")] = [{k: r[k] for k, _, _ in series} | {"shape": (r["m"], r["n"], r["k"])}
                                        for r in rows]
    # One legend for all panels, below them: inside a panel it covered bars.
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(series), fontsize=8, frameon=False)
    fig.suptitle("NVFP4 gated dual GEMM on Hopper: the twin against both baselines (measured)", fontsize=11)
    fig.subplots_adjust(bottom=0.2)
    return save(fig, name), data


def _short(config: str) -> str:
    """``DecodeConfig(tokens=64, mma_warpgroups=1, split=2, stages=6)`` -> ``64t 1wg s2``; any other configuration
    (the fast twin's) -> ``fast twin``."""
    if not config.startswith("DecodeConfig"):
        return "fast twin"
    f = dict(part.split("=") for part in config[len("DecodeConfig("):-1].split(", "))
    return f"{f['tokens']}t {f['mma_warpgroups']}wg s{f['split']}"


def decode_sweep_rows(doc: dict) -> list[dict]:
    """Per shape of a decode sweep (``benchmarks/dual_gemm.py decode``): the fast twin's kernel time, the time of the
    decode-twin configuration today's model picks (:func:`~gemmlab.family.heuristic_gated.choose_decode_config`, on
    the cluster capacity the run's GPU reported, an H100's where the run predates that record) and of the fastest
    one the sweep timed, and the NVFP4-byte floor."""
    from ..family.heuristic_gated import choose_decode_config

    out = []
    for shape in doc["shapes"]:
        times = {r["config"]: r["kernel_us"] for r in shape.get("rows", []) if r.get("ok") and "kernel_us" in r}
        fast = [t for c, t in times.items() if not c.startswith("DecodeConfig")]
        decode = {c: t for c, t in times.items() if c.startswith("DecodeConfig")}
        if not fast or not decode:
            out.append({"shape": f"{shape['m']}x{shape['n']}x{shape['k']}", "error": shape.get("error", "no rows")})
            continue
        best = min(decode, key=decode.get)
        clusters = shape.get("clusters")
        pick = repr(choose_decode_config(shape["m"], shape["n"], shape["k"],
                                         clusters=None if clusters is None else tuple(clusters)))
        out.append({"shape": f"{shape['m']}x{shape['n']}x{shape['k']}", "fast_us": fast[0],
                    "pick": _short(pick) if pick in decode else "-", "pick_us": decode.get(pick),
                    "best": _short(best), "best_us": decode[best],
                    "x_fast": fast[0] / decode[pick] if pick in decode else None,
                    "floor_us": shape.get("fp4_bytes_us"),
                    "all_ok": all(r.get("ok") for r in shape.get("rows", []))})
    return out


def format_decode_sweep(doc: dict) -> str:
    """:func:`decode_sweep_rows` as a table: kernels alone, microseconds; ``x fast``: the fast twin's time over the
    pick's."""
    cols = [("shape", "M x N x K", ""), ("fast_us", "fast twin", ".1f"), ("pick", "model's pick", ""),
            ("pick_us", "pick us", ".1f"), ("best", "sweep's best", ""), ("best_us", "best us", ".1f"),
            ("x_fast", "x fast", ".2f"), ("floor_us", "FP4 floor", ".1f"), ("all_ok", "all correct", "")]
    all_rows = decode_sweep_rows(doc)
    rows = [r for r in all_rows if "error" not in r]
    failed = [f"{r['shape']}: {r['error'].strip().splitlines()[-1]}" for r in all_rows if "error" in r]
    return format_table(rows, cols) + "".join(f"\nfailed: {f}" for f in failed)


def a16_sweep_rows(doc: dict) -> list[dict]:
    """Per shape of an A16 sweep (``benchmarks/dual_gemm.py a16``): the BF16 path's and the fast twin's kernel times,
    each A16 width's with one converter warpgroup (``n48`` ... ``n128``), the fastest of those, the configuration
    today's heuristic picks (:func:`~gemmlab.family.heuristic_gated.choose_sm90`, on the run's SM count; ``x2``: two
    converter warpgroups; where the call takes the W16 route, the width :func:`~gemmlab.family.heuristic_gated.choose_a16`
    would take), its time where the sweep timed it, and the BF16 path's time over the pick's (above 1: ours is
    faster)."""
    import re

    from ..family.configs import A16Config, PipelinedConfig
    from ..family.heuristic_gated import choose_a16, choose_sm90
    from ..family.problem import GatedProblem

    out = []
    for shape in doc["shapes"]:
        label = f"{shape['m']}x{shape['n']}x{shape['k']}"
        times = {r["config"]: r["kernel_us"] for r in shape.get("rows", []) if r.get("ok") and "kernel_us" in r}
        fast = [t for c, t in times.items() if c.startswith("PipelinedConfig")]
        if "bf16_path" not in times or not fast:
            out.append({"shape": label, "error": shape.get("error", "no rows")})
            continue
        row = {"shape": label, "bf16_us": times.pop("bf16_path"), "fast_us": fast[0],
               "all_ok": all(r.get("ok") for r in shape.get("rows", []))}
        widths, forms = {}, {}
        for c, t in times.items():
            if c.startswith("A16Config") and "cluster_m=2" not in c:  # the one-CTA forms (the sweep times no other)
                tile_n = int(re.search(r"tile_n=(\d+)", c).group(1))
                conv = re.search(r"converters=(\d+)", c)
                forms[(tile_n, int(conv.group(1)) if conv else 1)] = t
                if not conv or conv.group(1) == "1":
                    widths[tile_n] = t
        for tile_n, t in widths.items():
            row[f"n{tile_n}"] = t
        pick = choose_sm90(GatedProblem(shape["m"], shape["n"], shape["k"]), shape.get("sms", 132))
        if not isinstance(pick, (A16Config, PipelinedConfig)):  # this sweep is about the A16 widths: the width the
            pick = choose_a16(shape["m"], shape["n"], shape["k"], shape.get("sms", 132))  # A16 twin would take
        if isinstance(pick, PipelinedConfig):
            row["pick"], pick_us = "fast", row["fast_us"]
        else:  # an A16 form: n<tile_n>, x2 with two converter warpgroups
            row["pick"] = f"n{pick.tile_n}" + ("x2" if pick.converters == 2 else "")
            pick_us = forms.get((pick.tile_n, pick.converters))
        row["pick_us"] = pick_us
        row["best"] = min([("fast", row["fast_us"])] + [(f"n{w}", t) for w, t in widths.items()], key=lambda x: x[1])[0]
        row["x_bf16"] = row["bf16_us"] / pick_us if pick_us else None
        out.append(row)
    return out


def format_a16_sweep(doc: dict) -> str:
    """:func:`a16_sweep_rows` as a table: kernels alone, microseconds."""
    rows_all = a16_sweep_rows(doc)
    rows = [r for r in rows_all if "error" not in r]
    widths = sorted({int(k[1:]) for r in rows for k in r if k[0] == "n" and k[1:].isdigit()})
    cols = ([("shape", "M x N x K", ""), ("bf16_us", "BF16 path", ".1f"), ("fast_us", "fast twin", ".1f")]
            + [(f"n{w}", f"A16 {w}", ".1f") for w in widths]
            + [("best", "best", ""), ("pick", "pick", ""), ("pick_us", "pick us", ".1f"), ("x_bf16", "x BF16", ".2f"),
               ("all_ok", "all correct", "")])
    failed = [f"{r['shape']}: {r['error'].strip().splitlines()[-1]}" for r in rows_all if "error" in r]
    return format_table(rows, cols) + "".join(f"\nfailed: {f}" for f in failed)


def w16_sweep_rows(doc: dict) -> list[dict]:
    """Per shape of a W16 sweep (``benchmarks/dual_gemm.py w16`` or ``w16_narrow``): the kernel times of the A16
    twin's configuration, the W16 route's and the BF16 path's (microseconds, kernels alone), both time models, which
    form the heuristic picked (``pick``: ``A16`` or ``W16``) and whether it is the faster of the two (``right``), the
    pick's time over the faster one's (``regret``) and the BF16 path's time over the pick's (``x_bf16``; above 1: ours
    is faster)."""
    out = []
    for shape in doc["shapes"]:
        t = {}
        for r in shape.get("rows", []):
            if r.get("ok") and "kernel_us" in r:
                key = "bf16" if r["config"] == "bf16_path" else "w16" if r["config"].startswith("W16") else "a16"
                t[key] = r["kernel_us"]
        if not {"a16", "w16", "bf16"} <= set(t):
            continue
        pick = "W16" if str(shape.get("chosen", "")).startswith("W16") else "A16"
        got = t["w16"] if pick == "W16" else t["a16"]
        out.append(dict(shape=f"{shape['m']}x{shape['n']}x{shape['k']}", m=shape["m"], n=shape["n"], k=shape["k"],
                        a16_us=t["a16"], w16_us=t["w16"], bf16_us=t["bf16"], a16_model_us=shape.get("a16_model_us"),
                        w16_model_us=shape.get("w16_model_us"), pick=pick, right=got == min(t["a16"], t["w16"]),
                        regret=got / min(t["a16"], t["w16"]), x_bf16=t["bf16"] / got))
    return out


def format_w16_sweep(doc: dict) -> str:
    """:func:`w16_sweep_rows` as a table, with the count of shapes where the pick was the faster form."""
    rows = w16_sweep_rows(doc)
    cols = [("shape", "M x N x K", ""), ("a16_us", "A16 us", ".1f"), ("a16_model_us", "model", ".0f"),
            ("w16_us", "W16 us", ".1f"), ("w16_model_us", "model", ".0f"), ("bf16_us", "BF16 path", ".1f"),
            ("pick", "pick", ""), ("regret", "pick/best", ".3f"), ("x_bf16", "x BF16", ".2f")]
    right = sum(r["right"] for r in rows)
    return format_table(rows, cols) + f"\nthe pick is the faster form on {right} of {len(rows)} shapes"


def swap_sweep_rows(doc: dict) -> list[dict]:
    """One row per shape of a swap-twin sweep (``benchmarks/dual_gemm.py swap``): the public call's choice without the
    swap twin (``before``, as the sweep recorded it) and its time, the swap twin's model pick and the fastest swap form timed, the
    public call's choice today (``now``) and its time where the sweep timed it, and the BF16 path's kernels over it."""
    from ..family.heuristic_gated import choose_sm90, choose_swap
    from ..family.problem import GatedProblem

    out = []
    for shape in doc["shapes"]:
        m, n, k = shape["m"], shape["n"], shape["k"]
        times = {r["config"]: r["kernel_us"] for r in shape.get("rows", []) if r.get("ok") and "kernel_us" in r}
        swaps = {c: t for c, t in times.items() if c.startswith("SwapConfig")}
        if not swaps or "bf16_path" not in times:
            continue
        pick = choose_swap(m, n, k, shape.get("sms", 132))
        now = repr(choose_sm90(GatedProblem(m, n, k), shape.get("sms", 132)))
        before = shape.get("without_swap")
        best = min(swaps, key=swaps.get)
        row = dict(shape=f"{m}x{n}x{k}", m=m, n=n, k=k, before=before.split("(")[0] if before else None,
                   before_us=times.get(before), pick=_swap_label(repr(pick)) if pick else None,
                   pick_us=swaps.get(repr(pick)) if pick else None, best=_swap_label(best), best_us=swaps[best],
                   now=now.split("(")[0], now_us=times.get(now), bf16_us=times["bf16_path"])
        row["gain"] = row["before_us"] / row["now_us"] if row["before_us"] and row["now_us"] else None
        row["x_bf16"] = row["bf16_us"] / row["now_us"] if row["now_us"] else None
        out.append(row)
    return out


def _swap_label(config: str) -> str:
    """``SwapConfig(tokens=128, mma_warpgroups=2, split=1, ...)`` as ``T128 w2 s1``."""
    import re

    t, w, sp = re.search(r"tokens=(\d+), mma_warpgroups=(\d+), split=(\d+)", config).groups()
    return f"T{t} w{w} s{sp}"


def format_swap_sweep(doc: dict) -> str:
    """:func:`swap_sweep_rows` as a table, with the geometric mean of the old choice's time over the new one's."""
    rows = swap_sweep_rows(doc)
    cols = [("shape", "M x N x K", ""), ("before", "before", ""), ("before_us", "us", ".1f"),
            ("pick", "swap pick", ""), ("pick_us", "us", ".1f"), ("best", "swap best", ""), ("best_us", "us", ".1f"),
            ("now", "now", ""), ("now_us", "us", ".1f"), ("gain", "before/now", ".3f"),
            ("bf16_us", "BF16 path", ".1f"), ("x_bf16", "x BF16", ".2f")]
    gains = [r["gain"] for r in rows if r["gain"]]
    geo = math.exp(sum(math.log(g) for g in gains) / len(gains)) if gains else float("nan")
    faster = sum(g > 1.005 for g in gains)
    return (format_table(rows, cols) + f"\nthe choice now against the choice before the swap twin: {geo:.3f}x "
            f"geomean, faster on {faster} of {len(gains)} shapes")


def draw_w16(docs: list[dict], name: str = "11_w16"):
    """The BF16 path's kernel time over ours against M, per weight shape: the A16 twin (dashed) and the W16 route
    (solid), one panel per device (measured, kernels alone; title: device and date). Returns ``(path, data)``."""
    docs = [d for d in docs if d and w16_sweep_rows(d)]
    if not docs:
        raise ValueError("docs must hold at least one W16 sweep with a shape that ran")
    fig, axes = new_figure(1, len(docs), figsize=(6.0 * len(docs), 4.2), squeeze=False)
    colours = ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple")
    data = {}
    for ax, doc in zip(axes[0], docs):
        rows = w16_sweep_rows(doc)
        weights = sorted({(r["n"], r["k"]) for r in rows}, key=lambda w: (w[0] * w[1], w))
        for colour, (n, k) in zip(colours, weights):
            rs = sorted((r for r in rows if (r["n"], r["k"]) == (n, k)), key=lambda r: r["m"])
            ms = [r["m"] for r in rs]
            ax.plot(ms, [r["bf16_us"] / r["a16_us"] for r in rs], "--o", color=colour, ms=3,
                    label=f"A16 twin, N x K = {n} x {k}")
            ax.plot(ms, [r["bf16_us"] / r["w16_us"] for r in rs], "-s", color=colour, ms=3,
                    label=f"W16 route, {n} x {k}")
        ax.axhline(1.0, color="#999999", lw=0.8)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("M (rows of A)")
        ax.set_ylabel("BF16 path's time / ours (kernels; above 1: ours faster)")
        ax.set_title(f"{doc.get('device', '?')}, {str(doc.get('date', '?'))[:10]}", fontsize=10)
        ax.legend(fontsize=7)
        data[doc.get("device", "?")] = rows
    fig.suptitle("NVFP4 gated dual GEMM, large M: weights converted in the kernel (A16) or once per call (W16)",
                 fontsize=11)
    return save(fig, name), data


def format_w16_parts(doc: dict) -> str:
    """``benchmarks/dual_gemm.py w16_parts``: the W16 route's time split into A's pre-pass, the weight pass (each with
    its rate, TB/s) and the rest (its gated GEMM and the launch gaps), beside the BF16 path's cuBLAS GEMM alone."""
    rows = [dict(r, shape=f"{r['m']}x{r['n']}x{r['k']}", rest_vs_bf16=r["rest_us"] / r["bf16_gemm_us"])
            for r in doc["rows"] if "error" not in r]
    cols = [("shape", "M x N x K", ""), ("w16_us", "W16 us", ".1f"), ("prepass_us", "A pass", ".1f"),
            ("prepass_tbps", "TB/s", ".2f"), ("weights_us", "weight pass", ".1f"), ("weights_tbps", "TB/s", ".2f"),
            ("rest_us", "rest", ".1f"), ("bf16_gemm_us", "BF16 GEMM", ".1f"), ("rest_vs_bf16", "rest/GEMM", ".3f")]
    return format_table(rows, cols)
