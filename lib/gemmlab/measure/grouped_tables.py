"""Chapter 08's result tables and figures: the MoE benchmark against its roofline, the decode tail, the sweeps.

The CPU models' figures (the tile order, the finish times) are :mod:`gemmlab.grouped_model`'s."""
from __future__ import annotations

from ..family.heuristic_grouped import OVERLAP_STORE_FROM
from .bench import geomean
from .grouped import against_streaming_read, best_tile_ratio, expert_bound_rows, ping_pong_bound, store_gains, summarize


def draw_moe(docs: list[dict], name: str = "08_moe"):
    """TFLOP/s against tokens per expert, ours and torch._grouped_mm, with the roofline; a panel per device.

    Black bars: the datasheet's roofline; grey bars, where the run measured its ceilings
    (:func:`gemmlab.measure.grouped.measured_roofline`): the roofline of this GPU's device copy and cuBLAS."""
    from ..figures import new_figure, save

    fig, axes = new_figure(1, len(docs), figsize=(6.4 * len(docs), 4.6), squeeze=False, sharey=True)
    for ax, doc in zip(axes[0], docs):
        rows = sorted(doc["rows"], key=lambda r: r["tokens"] / r["groups"])
        x = [r["tokens"] / r["groups"] for r in rows]
        def at_floor(key):  # TFLOP/s of each set run in its floor's time
            return [2 * r["tokens"] * r["n"] * r["k"] / (r[key] * 1e-3) / 1e12 for r in rows]

        ax.plot(x, at_floor("floor_ms"), "_", ms=12, color="black",
                label="datasheet roofline (max of FLOPs/peak, bytes/HBM)")
        if all("measured_floor_ms" in r for r in rows):
            ax.plot(x, at_floor("measured_floor_ms"), "_", ms=12, mew=2, color="0.6",
                    label="measured roofline (device copy, cuBLAS)")
        ax.plot(x, [r["torch_grouped_mm_kernel_tflops"] for r in rows], "s", ms=4, mfc="none",
                color="tab:orange", label="torch._grouped_mm")
        ax.plot(x, [r["gemmlab_kernel_tflops"] for r in rows], "o", ms=4, color="tab:blue",
                label="gemmlab.grouped_gemm")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log", base=2)
        ax.set_xlabel("tokens per expert (T / G)")
        g = geomean([r["vs_torch_kernel"] for r in rows])
        ax.set_title(f"{doc['device']}: kernel time ratio vs torch, geomean {g:.3f}", fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].set_ylabel("TFLOP/s (kernel time)")
    axes[0][0].legend(fontsize=7, loc="lower right")
    return save(fig, name)


def draw_tail(docs: list[dict], name: str = "08_tail"):
    """Decode launch time against live experts (``benchmarks/grouped_gemm.py tail``), a column per device.

    Top: filled ours, open ``torch._grouped_mm``, lines the fits of :func:`gemmlab.measure.grouped.fit_launch_cost`
    (intercept = fixed cost per launch). Bottom: our time minus the fit against the waves of tiles (tiles /
    SMs), dotted at whole waves: a step just past one is the cost of a last wave with few tiles.
    """
    from ..figures import new_figure, save

    fig, axes = new_figure(2, len(docs), figsize=(6.4 * len(docs), 7.2), squeeze=False,
                           gridspec_kw={"height_ratios": [3, 2]})
    colors = ("tab:blue", "tab:green")
    for col, doc in enumerate(docs):
        top, bottom = axes[0][col], axes[1][col]
        for fit, color in zip(doc["fits"], colors):
            fam = [r for r in doc["rows"] if (r["n"], r["k"]) == (fit["n"], fit["k"])]
            live = [r["live"] for r in fam]
            label = f"N = {fit['n']}, K = {fit['k']}"
            top.plot(live, [r["us"] for r in fam], "o", ms=4, color=color, label=f"ours, {label}")
            top.plot(live, [r["torch_us"] for r in fam], "s", ms=4, mfc="none", color=color, alpha=0.6,
                     label=f"torch._grouped_mm, {label}")
            xs = [0, max(live)]
            top.plot(xs, [fit["fixed_us"] + fit["us_per_expert"] * x for x in xs], "-", lw=0.8, color=color)
            bottom.plot([r["waves"] for r in fam],
                        [r["us"] - fit["fixed_us"] - fit["us_per_expert"] * r["live"] for r in fam],
                        "o-", ms=4, lw=0.6, color=color, label=label)
        tile = doc.get("config", "64x128").split()[0].replace("x", " x ")  # results before the field: 64 x 128
        sched = {True: ", dynamic", False: ", static"}.get(doc.get("dynamic"), "")
        top.set_xlabel(f"live experts (4 tokens each; {tile} tiles{sched})")
        top.set_title(f"{doc['device']}: fixed cost per launch = intercept", fontsize=10)
        top.grid(True, alpha=0.3)
        for w in range(1, int(max(r["waves"] for r in doc["rows"])) + 1):
            bottom.axvline(w, ls=":", lw=0.6, color="gray")
        bottom.axhline(0, lw=0.6, color="black")
        bottom.set_xlabel(f"waves of tiles (tiles / {doc['sms']} SMs)")
        bottom.grid(True, axis="y", alpha=0.3)
    axes[0][0].set_ylabel("kernel time (us), back to back")
    axes[1][0].set_ylabel("ours minus the fit (us)")
    axes[0][0].legend(fontsize=7, loc="upper left")
    return save(fig, name)


def tail_lines(doc: dict) -> str:
    """The tail benchmark's fits, one line per weight shape."""
    tile = f", {doc['config'].split()[0]} tiles" if "config" in doc else ""
    lines = [f"{doc['device']}: streaming read (torch.sum over 2 GiB) {doc['stream_read_tbs']:.2f} TB/s{tile}"]
    if "stream_read_fit" in doc:  # older results lack it
        f = doc["stream_read_fit"]
        lines.append(f"  streaming reads of 128 MiB to 2 GiB as a line: fixed {f['fixed_us']:5.1f} us per launch, "
                     f"{f['tbs']:.2f} TB/s")
    for f in doc["fits"]:
        lines.append(f"  N = {f['n']:5d}, K = {f['k']:5d}: fixed {f['fixed_us']:5.1f} us per launch, weights at "
                     f"{f['tbs']:.2f} TB/s; torch._grouped_mm {f['torch']['fixed_us']:5.1f} us, "
                     f"{f['torch']['tbs']:.2f} TB/s")
    return "\n".join(lines)


def streaming_read_line(moe_doc: dict, tail_doc: dict) -> str:
    """One line: the decode sets' kernel time against a plain streaming read of their bytes
    (:func:`gemmlab.measure.grouped.against_streaming_read`)."""
    ratios = [x for _, x in against_streaming_read(moe_doc, tail_doc)]
    if not ratios:
        return f"{moe_doc['device']}: no decode sets"
    return (f"{moe_doc['device']}: {len(ratios)} decode sets, a streaming read of their bytes (the torch.sum line) "
            f"over our kernel time: geomean {geomean(ratios):.3f}, {min(ratios):.3f} to {max(ratios):.3f}")


def tile_ratio_line(doc: dict, tile: str = "128x128", against: str = "128x256") -> str:
    """One line of a stored sweep: ``tile`` at its best over ``against`` at its best
    (:func:`gemmlab.measure.grouped.best_tile_ratio`), geomean and range, and the set closest to a tie."""
    got = best_tile_ratio(doc, tile, against)
    ratios = [x for x, _ in got]
    x, r = min(got, key=lambda p: p[0])
    return (f"{doc['device']}: {tile} at its best over {against} at its best, {len(ratios)} sets: geomean "
            f"{geomean(ratios):.3f}, {min(ratios):.3f} to {max(ratios):.3f} (closest: {r['shape']}, "
            f"{r['groups']} experts, {r['tokens']} tokens)")


def ping_pong_line(doc: dict) -> str:
    """One line of a stored ``sweep_128x128``: the best a ping-pong kernel with 128 x 128 tiles could do
    (:func:`gemmlab.measure.grouped.ping_pong_bound`), the sets where it could be ahead of ours and the closest one."""
    got = ping_pong_bound(doc)
    x, r = min(got, key=lambda p: p[0])
    ahead = sum(b < 1 for b, _ in got)
    return (f"  a ping-pong with every store hidden, at best: geomean {geomean([b for b, _ in got]):.3f} of our time, "
            f"ahead of ours on {ahead} of {len(got)} sets; lowest {x:.3f} ({r['shape']}, {r['groups']} experts, "
            f"{r['tokens']} tokens)")


def overlap_line(doc: dict) -> str:
    """Two lines of a stored ``overlap`` run (:func:`gemmlab.measure.grouped.store_gains`)."""
    g = store_gains(doc)
    on, off = g["on"], g["off"]
    return (f"{doc['device']}: time with the store between two main loops over with it under the next one, "
            f"128-row tiles:\n"
            f"  from {OVERLAP_STORE_FROM} tokens per expert ({on['sets']} sets): geomean {on['geomean']:.3f}, "
            f"{on['min']:.3f} to {on['max']:.3f}, {on['faster']} faster; below ({off['sets']} sets): "
            f"{off['min']:.3f} to {off['max']:.3f}\n"
            f"  all {len(doc['rows'])} sets vs torch._grouped_mm: {g['vs_torch_between']:.3f}x with the store between "
            f"main loops, {g['vs_torch_rule']:.3f}x with it where the rule puts it")


def kernel_lines(doc: dict) -> str:
    """A stored ``kernel`` run (the headline alone): the geomean and lowest ratio of torch's kernel time over ours,
    over all sets and over the sets in the mixed order."""
    rows = doc["rows"]
    mixed = [r["vs_torch_kernel"] for r in rows if r.get("mixed")]
    s = doc["summary"]
    return (f"{doc['device']} ({doc['date'][:10]}): kernel time vs torch._grouped_mm over {len(rows)} sets: geomean "
            f"{s['geomean_vs_torch_kernel']:.3f}x, lowest {s['min_vs_torch_kernel']:.3f}x"
            + (f"; the {len(mixed)} sets in the mixed order {geomean(mixed):.3f}x" if mixed else ""))


def mixed_lines(doc: dict) -> str:
    """A stored ``mixed`` run: each block size's time over the kernel without the mixed order (geomean, range)."""
    rows = doc["rows"]
    bursts = sorted(int(k[5:-5]) for k in rows[0] if k.startswith("burst") and k.endswith("_gain"))
    parts = []
    for q in bursts:
        g = [r[f"burst{q}_gain"] for r in rows]
        parts.append(f"blocks of {q}: {geomean(g):.3f}x ({min(g):.3f}-{max(g):.3f}, {sum(x > 1 for x in g)} faster)")
    return f"{doc['device']}, {len(rows)} sets, the mixed order over the kernel without it: " + "; ".join(parts)


def fences_lines(doc: dict) -> str:
    """A stored ``fences`` run, one line per set: each variant's time and worst error, and the unfenced time over
    the set's measured floor (under 1: it finished before its bytes could have been read once)."""
    lines = [f"{doc['device']}: the kernel with and without the descriptor fences"]
    for r in doc["rows"]:
        worst = max(r["rel_err_unfenced"])
        lines.append(f"  {r['shape']}, {r['groups']} experts, {r['tokens']} tokens: fenced {r['fenced_ms']:.2f} ms "
                     f"(error {max(r['rel_err_fenced']):.1e}), unfenced {r['unfenced_ms']:.2f} ms "
                     f"({'non-finite values in the output' if worst == float('inf') else f'error {worst:.1e}'}), "
                     f"{r['unfenced_ms'] / r['measured_floor_ms']:.2f} of the floor")
    return "\n".join(lines)


def expert_bound_lines(doc: dict, most: int = 4) -> str:
    """A stored ``moe`` run's 128 x 256 sets against the two model times of :func:`gemmlab.measure.grouped.expert_bounds`:
    how close the kernel is to "one expert after another", and the ``most`` sets with the most to gain from
    overlapping them."""
    got = expert_bound_rows(doc)
    meas = [g["measured_over_serial"] for g in got]
    over = [g["overlapped_over_serial"] for g in got]
    lines = [f"{doc['device']}: {len(got)} sets of 128 x 256 tiles; kernel time over the experts one after another: "
             f"geomean {geomean(meas):.3f}, {min(meas):.3f} to {max(meas):.3f}; overlapped over one after another: "
             f"geomean {geomean(over):.3f}, lowest {min(over):.3f}"]
    for g in sorted(got, key=lambda g: g["overlapped_over_serial"])[:most]:
        r = g["row"]
        lines.append(f"  {r['shape']:20s} G={r['groups']:3d} T={r['tokens']:5d}: kernel {r['gemmlab_kernel_ms']:.3f} ms, "
                     f"one after another {g['serial_ms']:.3f}, overlapped {g['overlapped_ms']:.3f}")
    return "\n".join(lines)


def moe_table(doc: dict) -> str:
    """One line per MoE set: tokens, groups, our tile, the times (ms) and ratios."""
    measured = all("of_measured_roofline" in r for r in doc["rows"])
    head = (f"{'set':22s} {'G':>4s} {'T':>6s} {'live':>4s} {'tile':>8s} {'ours':>7s} {'torch':>7s} "
            f"{'loop':>7s} {'padded':>7s} {'x torch':>7s} {'roof':>5s}" + (f" {'meas':>5s}" if measured else ""))
    lines = [head, "-" * len(head)]
    for r in doc["rows"]:
        padded = f"{r['padded_bmm_ms']:7.3f}" if "padded_bmm_ms" in r else f"{'-':>7s}"
        lines.append(f"{r['shape']:22s} {r['groups']:4d} {r['tokens']:6d} {r['nonempty']:4d} "
                     f"{r['config'].split()[0]:>8s} {r['gemmlab_novalidate_ms']:7.3f} {r['torch_grouped_mm_ms']:7.3f} "
                     f"{r['matmul_loop_ms']:7.3f} {padded} {r['vs_torch_kernel']:7.2f} {r['of_roofline']:5.2f}"
                     + (f" {r['of_measured_roofline']:5.2f}" if measured else ""))
    return "\n".join(lines)


def summary_lines(doc: dict) -> str:
    """The benchmark's headline numbers, one per line, named."""

    s = summarize(doc["rows"])
    lines = [f"{doc['device']} ({s['sets']} MoE sets, {doc.get('date', '')[:10]})",
             f"  kernel time vs torch._grouped_mm: geomean {s['geomean_vs_torch_kernel']:.3f}x, "
             f"min {s['min_vs_torch_kernel']:.3f}x",
             f"  public call vs torch._grouped_mm: {s['geomean_vs_torch']:.3f}x with the offs check, "
             f"{s['geomean_vs_torch_novalidate']:.3f}x without (min {s['min_vs_torch_novalidate']:.3f}x)",
             f"  vs a loop of torch.matmul: {s['geomean_vs_loop']:.3f}x"]
    if "geomean_vs_padded" in s:
        lines.append(f"  vs a padded batched GEMM (torch.bmm, padding not timed): {s['geomean_vs_padded']:.3f}x")
    lines.append(f"  decode sets (<= 16 tokens per expert, {s['decode_sets']}): {s['decode_of_roofline_geomean']:.2f} "
                 f"of the datasheet roofline (geomean), lowest {s['decode_of_roofline_min']:.2f}")
    if "decode_of_measured_roofline_geomean" in s:
        m = doc["measured"]
        lines.append(f"  ... and {s['decode_of_measured_roofline_geomean']:.2f} of the measured one (geomean), lowest "
                     f"{s['decode_of_measured_roofline_min']:.2f} (this run's copy {m['copy_tbs']:.2f} TB/s, "
                     f"cuBLAS {m['gemm_tflops']:.0f} TFLOP/s)")
    if "geomean_l2_gain" in s:
        lines.append(f"  256-byte L2 promotion vs the DSL's 128: {s['geomean_l2_gain']:.3f}x geomean, "
                     f"lowest {s['min_l2_gain']:.3f}x")
    if "geomean_mixed_gain" in s:
        lines.append(f"  mixed order vs the order without it ({s['mixed_sets']} sets): {s['geomean_mixed_gain']:.3f}x "
                     f"geomean, lowest {s['min_mixed_gain']:.3f}x")
    if "geomean_sched_gain" in s:
        lines.append(f"  chosen tile scheduling (dynamic or static) vs the other: {s['geomean_sched_gain']:.3f}x "
                     f"geomean, lowest {s['min_sched_gain']:.3f}x")
    lines.append(f"  largest relative error against FP32: {s['max_rel_err']:.1e}")
    return "\n".join(lines)
