"""Chapter 07's feature ladder: what each feature of the persistent kernel buys, measured.

A ladder starts from chapter 06's kernel (one CTA per output tile, one consumer
warpgroup: :func:`gemmlab.wgmma.gemm_nt`) and climbs through chapter 07's kernel
(:mod:`gemmlab.kernels.gemm_sm90`), changing one :class:`~gemmlab.family.configs.Sm90Config`
knob per rung, up to the default configuration. Then *variations* change one knob of
the top rung (stages, the epilogue's sub-tile and ring, the cluster's direction, the
band width) and the last one is the configuration :func:`gemmlab.gemm` itself picks.
cuBLAS (``torch.matmul``) is the reference line: every rung is timed against it in
the same interleaved run (:func:`gemmlab.measure.bench.time_interleaved`, kernels alone).

``benchmarks/gemm_ladder.py`` measures it on :data:`LADDER_SHAPES` and writes
``results/<device>/gemm_ladder.json``; this module holds the rungs, the table and the
figure (``figures/07_ladder.png``), which need no GPU.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields

from ..figures import format_table
from .bench import device_slug
from ..family.configs import Sm90Config

#: The fixed shapes (M, N, K): a large square, and a DeepSeek-V3 layer (N, K = 7168, 2048) at M = 4096 tokens.
LADDER_SHAPES = ((8192, 8192, 8192), (4096, 7168, 2048))
#: The command that measures the ladder on the GPU it runs on.
COMMAND = "python benchmarks/gemm_ladder.py"
#: How every rung is timed (stored with the results).
METHOD = ("each rung checked first (poisoned output, relative Frobenius error against an FP32 product at most "
          "MAX_REL_ERR), then timed against torch.matmul (cuBLAS) in one interleaved run on the same rotated input "
          "sets (>= 4 x L2 in total when a set is smaller), order rotated each round, the queue primed by "
          "torch.cuda._sleep so both are timed as kernels alone, CUDA events around each round's batch of "
          "back-to-back launches, median over rounds of the mean per launch; TFLOP/s = 2 M N K / time")
#: Above this relative Frobenius error (against an FP32 product) a rung counts as failed: it is not timed.
MAX_REL_ERR = 1e-2


@dataclass(frozen=True)
class Rung:
    """One measured kernel of the ladder.

    ``kernel``: ``"ch06"`` (:func:`gemmlab.wgmma.gemm_nt` with ``tile`` = (tile_m,
    tile_n, stages)) or ``"ch07"`` (:func:`gemmlab.family.plan.prepare` with
    ``config``; ``None``: the configuration the heuristic picks for the shape).
    ``step``: a rung of the ladder (each adds ``adds`` to the one before) or a
    variation of the top rung.
    """

    key: str
    label: str
    adds: str
    kernel: str
    config: Sm90Config | None = None
    tile: tuple | None = None
    step: bool = True

    def __post_init__(self):
        if self.kernel not in ("ch06", "ch07"):
            raise ValueError(f"kernel must be 'ch06' or 'ch07'; got {self.kernel!r}")
        if self.kernel == "ch06" and (self.tile is None or len(self.tile) != 3):
            raise ValueError(f"a ch06 rung needs tile=(tile_m, tile_n, stages); got {self.tile!r}")

    @property
    def config_name(self) -> str:
        if self.kernel == "ch06":
            m, n, s = self.tile
            return f"{m}x{n} s{s} (one CTA per tile)"
        return config_label(self.config) if self.config is not None else "heuristic"

    def meta(self) -> dict:
        """What the results file stores about the rung (so an old file still renders if the rungs change)."""
        return {"key": self.key, "label": self.label, "adds": self.adds, "kernel": self.kernel,
                "config": self.config_name, "step": self.step,
                "config_fields": asdict(self.config) if self.config is not None else None}


_BASE = dict(tile_m=64, tile_n=256, stages=4, cluster=(1, 1), raster="m", group=1, epi_n=32, epi_stages=4)
_TOP = Sm90Config()

#: The rungs, in order: the ladder (``step=True``), then the variations of its top rung.
RUNGS = (
    Rung("ch06", "ch06: 128x128 tile per CTA", "chapter 06's kernel: one CTA per 128 x 128 output tile, one "
         "consumer warpgroup and a TMA warp, a 6-stage ring; the grid's launch order", "ch06", tile=(128, 128, 6)),
    Rung("persistent", "ch07: 64x256, 1 consumer WG", "chapter 07's kernel at its smallest: one consumer warpgroup "
         "on a 64 x 256 tile (the same 128 accumulator registers per thread as chapter 06's 128 x 128), a producer "
         "warpgroup with setmaxnreg, a persistent grid in plain row order, one pipeline across tiles, the TMA-store "
         "epilogue; no cluster", "ch07", Sm90Config(**_BASE)),
    Rung("two_consumers", "+ 2 consumer WGs (128x256)", "two consumer warpgroups: a 128 x 256 tile, so each B' block "
         "loaded feeds twice the rows", "ch07", Sm90Config(**{**_BASE, "tile_m": 128})),
    Rung("grouped", "+ grouped order (bands of 8)", "the grouped tile order of section 1 (bands of 8 tiles along M): "
         "a wave of CTAs touches fewer distinct A and B panels, so more of its loads hit in L2", "ch07",
         Sm90Config(**{**_BASE, "tile_m": 128, "group": 8})),
    Rung("cluster", "+ cluster 2x1, B multicast", "CTA pairs along M: each CTA loads half of the B' block both need "
         "and multicasts it (half of B''s L2-to-SM traffic); this is the default configuration", "ch07", _TOP),
    Rung("stages3", "variation: 3 stages", "one ring stage fewer than the top rung's 4", "ch07",
         Sm90Config(stages=3), step=False),
    Rung("epi64x2", "variation: epilogue 64x64, ring 2", "64-column epilogue sub-tiles in a ring of 2 (same shared "
         "memory as 32 x 4)", "ch07", Sm90Config(epi_n=64, epi_stages=2), step=False),
    Rung("epi16x4", "variation: epilogue 64x16, ring 4", "16-column epilogue sub-tiles in a ring of 4 (half the "
         "shared memory of 32 x 4)", "ch07", Sm90Config(epi_n=16, epi_stages=4), step=False),
    Rung("epi32x2", "variation: epilogue ring 2", "a ring of 2 sub-tiles of 64 x 32 instead of 4", "ch07",
         Sm90Config(epi_stages=2), step=False),
    Rung("cluster1x2", "variation: cluster 1x2, A multicast", "CTA pairs along N instead, multicasting A'", "ch07",
         Sm90Config(cluster=(1, 2)), step=False),
    Rung("group16", "variation: bands of 16", "bands of 16 tiles instead of 8", "ch07", Sm90Config(group=16),
         step=False),
    Rung("heuristic", "gemmlab.gemm's choice", "the configuration the heuristic of section 6 picks for the shape "
         "(what gemmlab.gemm runs)", "ch07", None, step=False),
)


def config_label(cfg: Sm90Config) -> str:
    """``Sm90Config.name`` with the epilogue's sub-tile width and ring depth: ``128x256 c2x1 m8 s4 e32x4``."""
    return f"{cfg.name} e{cfg.epi_n}x{cfg.epi_stages}"


def changed_fields(a: Sm90Config, b: Sm90Config) -> list[str]:
    """The names of the fields in which two configurations differ."""
    return [f.name for f in fields(Sm90Config) if getattr(a, f.name) != getattr(b, f.name)]


def rung_table(rungs=RUNGS, *, adds: bool = True) -> str:
    """The rungs as text: name, kind and kernel configuration; then what each adds (unless ``adds=False``)."""
    rows = [{"key": r.key, "label": r.label, "kind": "ladder" if r.step else "variation", "config": r.config_name}
            for r in rungs]
    table = format_table(rows, [("key", "rung", ""), ("kind", "kind", ""), ("label", "label in the figure", ""),
                                ("config", "kernel configuration", "")])
    return table + ("\n\n" + "\n".join(f"{r.key}: {r.adds}" for r in rungs) if adds else "")


# --------------------------------------------------------------------------------------
# The results: checks, the table, the figure
# --------------------------------------------------------------------------------------


def _check_doc(doc) -> dict:
    if not isinstance(doc, dict) or doc.get("benchmark") != "gemm_ladder":
        raise ValueError("doc must be the results of benchmarks/gemm_ladder.py (a dict with benchmark "
                         f"'gemm_ladder'); got {type(doc).__name__}"
                         + (f" with benchmark {doc.get('benchmark')!r}" if isinstance(doc, dict) else ""))
    for key in ("device", "rungs", "rows"):
        if key not in doc:
            raise ValueError(f"doc must have a {key!r} entry (results of benchmarks/gemm_ladder.py)")
    if not doc["rows"]:
        raise ValueError("doc has no rows: the ladder measured nothing")
    keys = {r["key"] for r in doc["rungs"]}
    for row in doc["rows"]:
        if row.get("rung") not in keys:
            raise ValueError(f"row {row.get('rung')!r} names no rung of the doc's rungs {sorted(keys)}")
    return doc


def shapes_of(doc: dict) -> list[tuple[int, int, int]]:
    """The shapes measured, in the order they were run."""
    seen = []
    for row in _check_doc(doc)["rows"]:
        s = (row["m"], row["n"], row["k"])
        if s not in seen:
            seen.append(s)
    return seen


def ladder_rows(doc: dict, shape) -> list[dict]:
    """The rows of one shape in rung order, each with ``gain``: the speed-up over the rung before it.

    ``gain`` is ``None`` for the first rung, for failed rungs, and when the rung
    before failed; a variation's ``gain`` is against the top rung of the ladder.
    ``vs_ch06``: against chapter 06's kernel; ``vs_cublas``: cuBLAS time over
    ours in the rung's own interleaved run.
    """
    shape = tuple(shape)
    doc = _check_doc(doc)
    if shape not in shapes_of(doc):
        raise ValueError(f"shape must be one of the measured shapes {shapes_of(doc)}; got {shape}")
    by_key = {r["rung"]: r for r in doc["rows"] if (r["m"], r["n"], r["k"]) == shape}
    ch06 = [by_key.get(r["key"]) for r in doc["rungs"] if r["kernel"] == "ch06"]
    ch06 = ch06[0] if ch06 and ch06[0] is not None and ch06[0].get("ok") else None
    out, top = [], None
    for rung in doc["rungs"]:
        row = by_key.get(rung["key"])
        if row is None:
            continue
        label = rung["label"]
        if rung["config"] == "heuristic" and row.get("config", "heuristic") != "heuristic":
            label += f" ({row['config']})"  # the configuration it picked for this shape
        row = {**row, "label": label, "step": rung["step"], "gain": None, "vs_ch06": None, "vs_cublas": None}
        ok = bool(row.get("ok", False))
        if ok:
            row["vs_cublas"] = row["cublas_us"] / row["us"]
            if ch06 is not None:
                row["vs_ch06"] = row["tflops"] / ch06["tflops"]
            if top is not None and top.get("ok"):  # the rung before, or for a variation the top rung
                row["gain"] = row["tflops"] / top["tflops"]
        if rung["step"]:
            top = row
        out.append(row)
    return out


def ladder_table(doc: dict) -> str:
    """One block per shape: TFLOP/s of every rung, its gain over the rung before, and against cuBLAS."""
    doc = _check_doc(doc)
    blocks = [f"{doc['device']}, {doc.get('date', '')}"]
    for shape in shapes_of(doc):
        rows = ladder_rows(doc, shape)
        cublas = [r["cublas_tflops"] for r in rows if r.get("ok")]
        head = f"{shape[0]} x {shape[1]} x {shape[2]}"
        if cublas:
            head += (f": cuBLAS {sorted(cublas)[len(cublas) // 2]:.0f} TFLOP/s (the median of its {len(cublas)} "
                     f"runs, one beside each rung)")
        table_rows = []
        for r in rows:
            ok = r.get("ok")
            table_rows.append({
                "label": r["label"], "config": r.get("config", ""),
                "tflops": f"{r['tflops']:.0f}" if ok else "failed",
                "us": f"{r['us']:.1f}" if ok else "-",
                "gain": f"x{r['gain']:.3f}" if r["gain"] else "-",
                "vs_ch06": f"x{r['vs_ch06']:.2f}" if r["vs_ch06"] else "-",
                "vs_cublas": f"{r['vs_cublas']:.3f}" if ok else "-",
                "err": f"{r['rel_err']:.1e}" if r.get("rel_err") is not None else "-"})
        blocks.append(head + "\n" + format_table(table_rows, [
            ("label", "rung", ""), ("config", "configuration", ""), ("us", "us", ""), ("tflops", "TFLOP/s", ""),
            ("gain", "vs rung before", ""), ("vs_ch06", "vs ch06", ""), ("vs_cublas", "cuBLAS/ours", ""),
            ("err", "rel. error", "")]))
        failed = [r for r in rows if not r.get("ok")]
        for r in failed:
            blocks.append(f"  {r['label']} failed: {r.get('error', 'no error recorded')}")
    return "\n\n".join(blocks)


def draw_ladder(docs: list[dict], name: str = "07_ladder"):
    """TFLOP/s of every rung as bars, cuBLAS as a dashed line: one panel per (device, shape); returns the path."""
    from ..figures import new_figure, save

    if not isinstance(docs, (list, tuple)) or not docs:
        raise ValueError("docs must be a non-empty list of gemm_ladder results (one per device)")
    docs = [_check_doc(d) for d in docs]
    shapes = []
    for d in docs:
        shapes += [s for s in shapes_of(d) if s not in shapes]
    n_rungs = max(len(d["rungs"]) for d in docs)
    fig, axes = new_figure(len(docs), len(shapes), figsize=(6.4 * len(shapes), 0.42 * n_rungs * len(docs) + 1.4),
                           squeeze=False)
    for i, doc in enumerate(docs):
        for j, shape in enumerate(shapes):
            ax = axes[i][j]
            ax.set_title(f"{doc['device']}: {shape[0]} x {shape[1]} x {shape[2]}", fontsize=10)
            if shape not in shapes_of(doc):
                ax.text(0.5, 0.5, "not measured", ha="center", va="center", transform=ax.transAxes)
                ax.set_axis_off()
                continue
            rows = ladder_rows(doc, shape)
            ys = list(range(len(rows)))[::-1]
            best = max([r["tflops"] for r in rows if r.get("ok")] + [r["cublas_tflops"] for r in rows if r.get("ok")]
                       + [1.0])
            for y, r in zip(ys, rows):
                if not r.get("ok"):
                    ax.text(best * 0.01, y, "failed", va="center", fontsize=8, color="crimson")
                    continue
                color = "tab:blue" if r["step"] else "tab:gray"
                ax.barh(y, r["tflops"], color=color, height=0.7)
                note = f" {r['tflops']:.0f}" + (f"  x{r['gain']:.2f}" if r["gain"] else "")
                ax.text(r["tflops"], y, note, va="center", fontsize=7.5,
                        bbox=dict(facecolor="white", edgecolor="none", alpha=0.8, pad=0.5))
            cublas = sorted(r["cublas_tflops"] for r in rows if r.get("ok"))
            if cublas:
                ax.axvline(cublas[len(cublas) // 2], color="black", ls="--", lw=1,
                           label=f"cuBLAS {cublas[len(cublas) // 2]:.0f}")
                ax.legend(fontsize=8, loc="upper right")
            ax.set_yticks(ys)
            ax.set_yticklabels([r["label"] for r in rows], fontsize=8)
            ax.set_xlim(0, best * 1.25)
            ax.set_xlabel("TFLOP/s (x: gain over the rung before; variations: over the top rung)", fontsize=8)
            ax.grid(True, axis="x", alpha=0.3)
    fig.tight_layout()
    return save(fig, name)


def not_measured(device: str) -> str:
    """The line a notebook prints for a device without results."""
    return (f"The ladder has not been measured on {device}: on that GPU run `{COMMAND}` "
            f"(writes results/{device_slug(device)}/gemm_ladder.json).")
