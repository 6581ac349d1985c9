"""Tables and figures of the GEMM family's benchmark (``results/<device>/gemm_family*.json``).

Also the stored evidence of the chapter-start kernel (Nsight Compute profile and tuning sweeps on an
H200, ``gemm_sm90_profile.json`` and ``gemm_sm90_tuning.json``), which chapter 07 prints.
"""
from __future__ import annotations

from ..figures import format_table
from .bench import geomean


def family_table(rows: list[dict], groups=None) -> str:
    """One line per shape: the call (Python included) and the kernel, each against torch's."""
    rows = [r for r in rows if groups is None or r["group"] in groups]
    return format_table(rows, [
        ("label", "M x N x K", ""), ("config", "config", ""),
        ("public_us", "gemm() us", ".1f"), ("torch_us", "matmul() us", ".1f"), ("ratio_public", "call ratio", ".3f"),
        ("prepared_us", "kernel us", ".1f"), ("torch_gpu_us", "cuBLAS us", ".1f"),
        ("ratio_prepared", "kernel ratio", ".3f"), ("rel_err", "rel. error", ".1e")])


def summary_lines(doc: dict) -> str:
    """The geometric means and worst shapes of a stored run, as text."""
    lines = [f"{doc['device']}, {doc['date']}:"]
    for key, what in (("ratio_public", "the call (gemmlab.gemm vs torch.matmul)"),
                      ("ratio_prepared", "the kernel (prepared launch vs cuBLAS)")):
        s = doc["summary"][key]
        groups = ", ".join(f"{g} {v:.3f}" for g, v in s["groups"].items())
        lines.append(f"  {what}: geometric mean {s['geomean']:.3f}, lowest {s['min']:.3f} ({s['worst']}); {groups}")
    return "\n".join(lines)


def host_table(docs: list[dict]) -> str:
    """Per-call host microseconds, one row per device."""
    rows = []
    for d in docs:
        r = d["rows"][0]
        rows.append({"device": d["device"], "shape": "x".join(map(str, r["shape"])), **r})
    return format_table(rows, [("device", "device", ""), ("shape", "M x N x K", ""),
                               ("public_us", "gemm(a, b, out)", ".1f"), ("torch_us", "matmul(a, b, out=)", ".1f"),
                               ("prepared_us", "prepared launch", ".1f"), ("public_alloc_us", "gemm(a, b)", ".1f"),
                               ("torch_alloc_us", "matmul(a, b)", ".1f")])


def draw_family(docs: list[dict], name: str = "07_gemm_family"):
    """Call ratio against M for each (N, K) pair, one panel per device; returns the figure's path."""
    from .gemm_family import DEEPGEMM_NK
    from ..figures import new_figure, save

    fig, axes = new_figure(1, len(docs), figsize=(6.2 * len(docs), 4.4), squeeze=False, sharey=True)
    for ax, doc in zip(axes[0], docs):
        fam = [r for r in doc["rows"] if r["group"] == "family"]
        for n, k in DEEPGEMM_NK:
            pts = sorted((r["m"], r["ratio_public"]) for r in fam if (r["n"], r["k"]) == (n, k))
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", ms=3, lw=1.2, label=f"N={n}, K={k}")
        ax.axhline(1.0, color="gray", lw=1, ls="--")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("M (rows of A: tokens)")
        vals = [r["ratio_public"] for r in fam]
        ax.set_title(f"{doc['device']}, {str(doc.get('date', '?'))[:10]}\nthe 'family' group ({len(vals)} shapes, "
                     f"drawn): geometric mean {geomean(vals):.3f}", fontsize=10)
        ax.grid(True, alpha=0.3)
    axes[0][0].set_ylabel("torch.matmul time / gemmlab.gemm time")
    handles, labels = axes[0][0].get_legend_handles_labels()  # below the panels: inside one it covered points
    fig.legend(handles, labels, loc="lower center", ncol=4, fontsize=8, frameon=False)
    fig.subplots_adjust(bottom=0.24)
    return save(fig, name)


def profile_table(doc: dict) -> str:
    """The stored Nsight Compute numbers (``results/<device>/gemm_sm90_profile.json``) as a text table."""
    rows = []
    for shape, recs in doc["shapes"].items():
        for r in recs:
            st = r["stalls_per_issue"]
            rows.append({"shape": shape, "who": r["kernel"] if r["kernel"] == "cublas" else f"ours {r['config'].split(' (')[0]}",
                         "kernel": r["name"][:34] if r["kernel"] == "cublas" else "", "time": r["time_us"],
                         "clock": r["sm_clock_ghz"], "tensor": r["tensor_pipe_active_pct"], "dram": r["dram_tbs"],
                         "l2": r["l2_throughput_pct"], "occ": r["achieved_occupancy_warps_pct"],
                         "stalls": f"bar {st['barrier']:.1f} lsb {st['long_scoreboard']:.1f} gmma {st['gmma']:.1f} "
                                   f"disp {st['dispatch_stall']:.1f}"})
    return format_table(rows, [("shape", "M x N x K", ""), ("who", "kernel", ""), ("kernel", "cuBLAS kernel", ""),
                               ("time", "time us", ".1f"), ("clock", "SM GHz", ".2f"),
                               ("tensor", "tensor pipe %", ".1f"), ("dram", "DRAM TB/s", ".2f"),
                               ("l2", "L2 %", ".1f"), ("occ", "warps %", ".1f"),
                               ("stalls", "stalls per issue", "")])


def tuning_table(doc: dict) -> str:
    """The stored tuning sweeps (``results/<device>/gemm_sm90_tuning.json``): ratio to cuBLAS per variant."""
    lines = []
    for run in doc["runs"]:
        lines.append(run["name"])
        for r in run["rows"]:
            cells = "  ".join(f"{k} {v['ratio']:.3f}" for k, v in r["variants"].items())
            lines.append(f"  {r['shape']:>15}  cuBLAS {r['cublas_tflops']:4.0f}  {cells}")
    base = doc.get("baseline_fair_runs")
    if base:
        lines.append(f"chapter-start kernel, fair benchmark run twice: geometric mean {base['geomean']['run1']:.3f} "
                     f"and {base['geomean']['run2']:.3f}")
    return "\n".join(lines)


def family_profile_table(doc: dict) -> str:
    """The stored Nsight Compute comparison (``gemm_family_profile.json``): time, L2 and DRAM bytes, throughputs."""
    return format_table(doc["rows"], [("shape", "M x N x K", ""), ("kernel", "kernel", ""), ("time_us", "us", ".1f"),
                                      ("l2_mb", "L2 MB", ".0f"), ("dram_read_mb", "DRAM read MB", ".0f"),
                                      ("l2_pct", "L2 % of peak", ".1f"), ("sm_pct", "SM % of peak", ".1f"),
                                      ("sm_ghz", "SM GHz", ".2f")])


def w128_summary(doc: dict) -> str:
    """A stored ``benchmarks/gemm_family.py w128`` run: per shape the same tile with two consumer warpgroups and with
    one (``wg_rows = 128``), kernels alone, and which form the heuristic picks there now (with the model of the
    run's GPU; ``other`` where it now picks another tile)."""
    from ..family import heuristic_sm90 as h
    from ..family.configs import Sm90Config
    from ..family.problem import GemmProblem
    from ..hardware import spec_for

    model = h.model_for(spec_for(doc["device"]))
    by = {}
    for r in doc["rows"]:
        if "prepared_us" in r:
            by.setdefault((r["m"], r["n"], r["k"], r["label"]), {})[r["kind"]] = r
    rows = []
    for (m, n, k, label), v in by.items():
        if "w64" in v and "w128" in v:
            pick = h.choose(GemmProblem(m, n, k), 132, model)
            tile = Sm90Config.parse_name(v["w64"]["config"])
            same = (pick.tile_m, pick.tile_n, pick.swap_ab) == (tile["tile_m"], tile["tile_n"], tile["swap_ab"])
            rows.append({"label": label, "config": v["w64"]["config"], "w64": v["w64"]["prepared_us"],
                         "w128": v["w128"]["prepared_us"], "gain": v["w64"]["prepared_us"] / v["w128"]["prepared_us"],
                         "picked": ("one" if pick.wg_rows == 128 else "two") if same else "other"})
    picked = [r["gain"] for r in rows if r["picked"] == "one"]
    head = (f"{doc['device']}, {doc['date']}: {len(rows)} shapes timed both ways; the heuristic picks one warpgroup "
            f"on {len(picked)}")
    if picked:
        head += f", {sum(g > 1 for g in picked)} of them faster that way ({_gains(picked)})"
    return head + "\n" + format_table(rows, [
        ("label", "M x N x K", ""), ("config", "tile (two warpgroups)", ""), ("w64", "two: us", ".1f"),
        ("w128", "one: us", ".1f"), ("gain", "two / one", ".3f"), ("picked", "heuristic", "")])


def token8_summary(doc: dict) -> str:
    """A stored ``benchmarks/gemm_family.py token8`` run: per shape the pick with the forms before
    (:data:`~gemmlab.family.heuristic_sm90.FORMS_BEFORE_TOKEN8`) and with today's, kernels alone in one run."""
    by = {}
    for r in doc["rows"]:
        if "prepared_us" in r:
            by.setdefault(r["label"], {})[r["which"]] = r
    rows = [{"label": label, "before": v["before"]["config"], "before_us": v["before"]["prepared_us"],
             "after": v["after"]["config"], "after_us": v["after"]["prepared_us"],
             "gain": v["before"]["prepared_us"] / v["after"]["prepared_us"]}
            for label, v in by.items() if "before" in v and "after" in v]
    gains = [r["gain"] for r in rows]
    head = f"{doc['device']}, {doc['date']}: {len(rows)} shapes whose pick changed"
    if gains:
        head += f"; the new pick faster on {sum(g > 1 for g in gains)} ({_gains(gains)})"
    return head + "\n" + format_table(rows, [
        ("label", "M x N x K", ""), ("before", "pick before", ""), ("before_us", "us", ".1f"),
        ("after", "pick now", ""), ("after_us", "us", ".1f"), ("gain", "before / now", ".3f")])


def _gains(gains: list[float]) -> str:
    """``geometric mean 1.036x, 0.998x to 1.162x``: a same-run comparison's speed-ups in a few words."""
    return f"geometric mean {geomean(gains):.3f}x, {min(gains):.3f}x to {max(gains):.3f}x"
