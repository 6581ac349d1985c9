"""The GEMM family's benchmark: what users call, against torch.matmul, on shape families.

Three competitors per shape, timed in the same run by :func:`gemmlab.measure.bench.time_interleaved`
(rotating rounds on the same rotated input sets, spanning at least 4 x L2):

* ``public``: ``gemmlab.gemm(a, b, out=c)``, the call a user makes (Python included);
* ``prepared``: :func:`gemmlab.family.plan.prepare`'s launch (the compiled call alone);
* ``torch``: ``torch.matmul(a, b, out=c)`` (cuBLAS through torch's dispatcher).

Ratios are torch's time over ours (above 1: faster than torch). Every row also
holds the relative Frobenius error of a poisoned output against an FP32
product and the configuration the heuristic chose.

The shapes (:func:`family_cases`): DeepGEMM's seven (N, K) pairs of
DeepSeek-V3's linear layers with M from 64 (a decode batch) to 16384 (a
prefill), the square 4096^3 and 8192^3 and 2048 x 2048 x 8192, and variants of
some of them with a row-major (N-contiguous) B, with FP16, and with sizes that
are not multiples of any tile.
"""
from __future__ import annotations

import functools
from dataclasses import asdict, dataclass

from .bench import geomean, gpu_clocks, host_us, input_sets, time_interleaved

#: DeepGEMM's (N, K) pairs: the linear layers of DeepSeek-V3 its tests time.
DEEPGEMM_NK = ((2112, 7168), (576, 7168), (24576, 1536), (32768, 512), (7168, 16384), (4096, 7168), (7168, 2048))
#: M of the family: decode batches to prefill chunks.
FAMILY_MS = (64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
#: Chapter 07's ten shapes: DeepGEMM's pairs at M = 4096 plus three squares.
CHAPTER07_SHAPES = tuple((4096, n, k) for n, k in DEEPGEMM_NK) + ((4096, 4096, 4096), (8192, 8192, 8192),
                                                                  (2048, 2048, 8192))
#: Shapes whose sizes are multiples of no tile.
PARTIAL_SHAPES = ((4095, 4104, 4096), (1000, 1032, 520), (777, 1608, 1112), (100, 2120, 7168))
#: Linear layers of other models (N, K) by name (issue 28's widened family): the attention's fused QKV and output
#: projections and the MLP's fused gate+up and down projections of Llama-3 8B (which Mistral 7B shares) and 70B,
#: and Qwen2.5 7B and 72B (hidden size, intermediate size, 128-wide heads and the KV heads of each model's
#: published configuration).
LLM_NK = {
    "llama3-8b qkv": (6144, 4096), "llama3-8b o": (4096, 4096), "llama3-8b gate+up": (28672, 4096),
    "llama3-8b down": (4096, 14336),
    "llama3-70b qkv": (10240, 8192), "llama3-70b down": (8192, 28672),
    "qwen2.5-7b qkv": (4608, 3584), "qwen2.5-7b gate+up": (37888, 3584), "qwen2.5-7b down": (3584, 18944),
    "qwen2.5-72b up": (29568, 8192),
}
#: M of the widened family: between decode and prefill, mostly not powers of two (issue 28: M = 384 was weak).
WIDE_MS = (96, 200, 384, 640, 1000, 1536, 3000)
#: The tiny shape the per-call host cost is measured on.
HOST_SHAPE = (128, 1024, 1024)

METHOD = ("two interleaved runs on the same rotated input sets (>= 4 x L2 in total when a set is smaller), "
          "order rotated each round, CUDA events around each round's batch of back-to-back launches, median over "
          "rounds of the mean per launch, "
          "ratio = torch / ours: (1) public: gemmlab.gemm vs torch.matmul(out=) as a caller's loop sees them, "
          "Python included; (2) prepared: the plan's launch vs torch.matmul with the queue primed by "
          "torch.cuda._sleep, so both are timed as kernels alone")


@dataclass(frozen=True)
class Case:
    m: int
    n: int
    k: int
    dtype: str = "bfloat16"
    b_major: str = "k"
    group: str = "family"

    @property
    def label(self) -> str:
        extra = ("" if self.dtype == "bfloat16" else " fp16") + ("" if self.b_major == "k" else " B row-major")
        return f"{self.m}x{self.n}x{self.k}{extra}"


def family_cases() -> list[Case]:
    """Every benchmark case, in table order."""
    cases = [Case(m, n, k) for n, k in DEEPGEMM_NK for m in FAMILY_MS]
    cases += [Case(*s, group="square") for s in CHAPTER07_SHAPES[7:]]
    picks = ((128, 2112, 7168), (4096, 2112, 7168), (4096, 4096, 4096), (8192, 8192, 8192))
    cases += [Case(*s, b_major="n", group="B row-major") for s in picks]
    cases += [Case(*s, dtype="float16", group="fp16") for s in picks]
    cases += [Case(*s, group="partial tiles") for s in PARTIAL_SHAPES]
    return cases


def wide_cases() -> list[Case]:
    """The widened family (:data:`LLM_NK` x :data:`WIDE_MS`), grouped by model layer."""
    return [Case(m, n, k, group=name) for name, (n, k) in LLM_NK.items() for m in WIDE_MS]


def weakest_rows(device_name: str, count: int, names=("gemm_family_wide",), key: str = "ratio_public"):
    """The stored rows of ``device_name``'s runs ``names`` with the lowest ``key``, one a problem (M, N, K, dtype, B's
    major), weakest first, at most ``count``; None when that device has none of those runs."""
    from .bench import load_results

    docs = [d for d in (load_results(name, device_name) for name in names) if d is not None]
    if not docs:
        return None
    rows, seen = [], set()
    for r in sorted((r for d in docs for r in d["rows"]), key=lambda r: r[key]):
        problem = (r["m"], r["n"], r["k"], r.get("dtype", "bfloat16"), r.get("b_major", "k"))
        if problem not in seen and len(rows) < count:
            seen.add(problem)
            rows.append(r)
    return rows


def weakest_wide(device_name: str, count: int = 12) -> list[tuple[int, int, int]] | None:
    """The ``count`` shapes of ``device_name``'s stored wide family (``gemm_family_wide.json``) with the lowest
    public ratio, weakest first; None when that device has no stored run."""
    rows = weakest_rows(device_name, count)
    return None if rows is None else [(r["m"], r["n"], r["k"]) for r in rows]


def _operands(case: Case, sets: int, seed: int = 0):
    import torch

    dt = getattr(torch, case.dtype)
    g = torch.Generator(device="cuda").manual_seed(seed)
    out = []
    for _ in range(sets):
        a = torch.randn(case.m, case.k, device="cuda", dtype=dt, generator=g)
        if case.b_major == "k":
            b = torch.randn(case.n, case.k, device="cuda", dtype=dt, generator=g).t()  # a weight's K x N view
        else:
            b = torch.randn(case.k, case.n, device="cuda", dtype=dt, generator=g)
        out.append((a, b, torch.empty(case.m, case.n, device="cuda", dtype=dt)))
    return out


def rel_error(out, a, b) -> float:
    """Relative Frobenius error of ``out`` against the FP32 product of ``a`` and ``b``."""
    ref = a.float() @ b.float()
    return ((out.float() - ref).norm() / ref.norm()).item()


def time_case(case: Case, *, rounds: int = 10, per_round: int = 10, config=None) -> dict:
    """One row: the three competitors on ``case``, the error of a poisoned output, the config used."""
    import torch

    from .. import gemm
    from ..family.plan import prepare

    props = torch.cuda.get_device_properties(0)
    eb = 2
    sets = input_sets(eb * (case.m * case.k + case.k * case.n + case.m * case.n), props.L2_cache_size)
    data = _operands(case, sets)
    a0, b0, c0 = data[0]
    c0.fill_(float("nan"))  # poisoned
    if config is None:
        gemm(a0, b0, c0)
    prepared = [prepare(a, b, c, config) for a, b, c in data]
    if config is not None:
        prepared[0]()
    torch.cuda.synchronize()
    err = rel_error(c0, a0, b0)
    torch_calls = [functools.partial(torch.matmul, a, b, out=c) for a, b, c in data]
    flop = 2 * case.m * case.n * case.k
    row = {**asdict(case), "label": case.label, "config": prepared[0].plan.config.name,
           "rel_err": err, "input_sets": sets}
    # Kernels alone (queue primed): the prepared launch against torch's.
    t = time_interleaved({"prepared": prepared, "torch_gpu": torch_calls}, rounds=rounds, per_round=per_round,
                         gpu_only=True)
    if config is None:
        # What a caller waits for in a loop, Python included: the public call against torch.matmul.
        t.update(time_interleaved({"public": [functools.partial(gemm, a, b, c) for a, b, c in data],
                                   "torch": torch_calls}, rounds=rounds, per_round=per_round))
    for name, r in t.items():
        row[f"{name}_us"] = r["median_ms"] * 1e3
        row[f"{name}_tflops"] = flop / r["median_ms"] / 1e9
    row["ratio_prepared"] = t["torch_gpu"]["median_ms"] / t["prepared"]["median_ms"]
    if "public" in t:
        row["ratio_public"] = t["torch"]["median_ms"] / t["public"]["median_ms"]
    row["gpu"] = gpu_clocks()
    del data, prepared, torch_calls
    return row


def host_cost(shape=HOST_SHAPE) -> dict:
    """Per-call host microseconds of the public call, the prepared launch and torch.matmul (same run)."""
    import torch

    from .. import gemm
    from ..family.plan import prepare

    case = Case(*shape)
    (a, b, c), = _operands(case, 1)
    us = host_us({"public": functools.partial(gemm, a, b, c), "prepared": prepare(a, b, c),
                  "torch": functools.partial(torch.matmul, a, b, out=c),
                  "public_alloc": functools.partial(gemm, a, b),
                  "torch_alloc": functools.partial(torch.matmul, a, b)})
    return {"shape": list(shape), **{f"{k}_us": v for k, v in us.items()}}


def summary(rows: list[dict]) -> dict:
    """Geometric means and the worst ratio, over all rows and per group."""
    out = {}
    for key in ("ratio_public", "ratio_prepared"):
        vals = [r[key] for r in rows if key in r]
        if not vals:
            continue
        out[key] = {"geomean": geomean(vals), "min": min(vals),
                    "worst": min(rows, key=lambda r: r.get(key, 1e9))["label"]}
        groups = {}
        for r in rows:
            if key in r:
                groups.setdefault(r["group"], []).append(r[key])
        out[key]["groups"] = {g: geomean(v) for g, v in groups.items()}
    return out


def run(cases=None, *, rounds: int = 10, per_round: int = 10, progress=print) -> list[dict]:
    """Time every case (default :func:`family_cases`); ``progress`` gets one line per case."""
    rows = []
    for case in cases or family_cases():
        r = time_case(case, rounds=rounds, per_round=per_round)
        rows.append(r)
        if progress:
            progress(f"{r['label']:>28} {r['config']:<30} public {r.get('ratio_public', 0):.3f} "
                     f"prepared {r['ratio_prepared']:.3f} torch {r['torch_gpu_us']:9.1f} us (kernel) "
                     f"{r.get('torch_us', 0):9.1f} us (call) err {r['rel_err']:.1e}")
    return rows


#: When the dense kernel's split-K started adding its slices in the same launch (UTC): stored runs older than this
#: timed split-K with a second reduction kernel.
SPLITK_ONE_LAUNCH_SINCE = "2026-11-27 13:24"
#: When the heuristic's tile forms became :data:`~gemmlab.family.heuristic_sm90.FORMS` (token tiles in steps of 8,
#: 192-row weight tiles swapped; UTC): stored runs older than this chose among
#: :data:`~gemmlab.family.heuristic_sm90.FORMS_BEFORE_TOKEN8`'s.
TOKEN8_SINCE = "2026-12-02 01:16"


def model_regret(doc: dict, num_sms: int = 132, model=None) -> dict:
    """How good the heuristic's choice is on a stored run that timed several variants per shape
    (``benchmarks/gemm_family.py sweep``, ``swap``, ``tall``, ``swap_tiled``): per shape, the measured kernel time of
    the variant the model ranks first among those timed and among those
    :func:`~gemmlab.family.heuristic_sm90.candidates` would consider (by predicted time, ties broken as
    :func:`~gemmlab.family.heuristic_sm90.rank_key` breaks them, so the pick is what ``choose`` would take among
    them) over the fastest one's. Returns ``{"shapes", "geomean", "worst", "over_5pct"}`` (``worst``:
    ``(regret, (M, N, K), picked, best)``).
    Split-K rows of runs made before split-K ran in one launch (:data:`SPLITK_ONE_LAUNCH_SINCE`) are left out, pick
    and best alike: they timed a second reduction kernel that the model no longer prices. Rows without a timing (a
    variant that failed in that run, stored with its ``error``) are left out too, and so are variants today's
    :class:`~gemmlab.family.configs.Sm90Config` refuses (a ring sized for an older epilogue). The variants the
    heuristic would consider are those of the tile forms of the run's day (:data:`TOKEN8_SINCE`): a sweep timed
    208-wide token tiles for M = 200, which today's forms round to 200."""
    from ..family import heuristic_sm90 as h
    from ..family.configs import Sm90Config
    from ..family.problem import GemmProblem

    model = model or h.MODEL
    two_launches = str(doc.get("date", "")) < SPLITK_ONE_LAUNCH_SINCE
    forms = h.FORMS if str(doc.get("date", "")) >= TOKEN8_SINCE else h.FORMS_BEFORE_TOKEN8
    by_shape = {}
    for r in doc["rows"]:
        by_shape.setdefault((r["m"], r["n"], r["k"], r.get("dtype", "bfloat16"), r.get("b_major", "k")), []).append(r)
    regrets = []
    worst = (1.0, None, None, None)
    for (m, n, k, dtype, b_major), rows in by_shape.items():
        problem = GemmProblem(m, n, k, dtype=dtype, b_major=b_major)
        allowed = set(h._tile_choices(problem, forms))
        scored = []
        for r in rows:
            if "prepared_us" not in r:
                continue  # the variant failed in that run: nothing was timed
            fields = Sm90Config.parse_name(r["config"])
            if fields["splits"] > 1 and two_launches:
                continue  # timed with the second reduction kernel; the model prices split-K in one launch
            epi_n, epi_stages = h.epi_shape_for(fields["tile_n"], fields["tile_m"])
            try:
                cfg = Sm90Config(**fields, epi_n=epi_n, epi_stages=epi_stages, dtype=dtype, out_dtype=dtype)
            except ValueError:
                continue  # a variant today's configs do not build (an older epilogue ring): nothing to rank
            if (cfg.tile_m, cfg.tile_n, cfg.swap_ab) in allowed:
                scored.append((h.rank_key(h.predict(problem, cfg, num_sms, model), num_sms), r))
        if not scored:
            continue
        pick = min(scored, key=lambda x: x[0])[1]
        best = min((r for _, r in scored), key=lambda r: r["prepared_us"])
        regret = pick["prepared_us"] / best["prepared_us"]
        regrets.append(regret)
        if regret > worst[0]:
            worst = (regret, (m, n, k), pick["config"], best["config"])
    return {"shapes": len(regrets), "geomean": geomean(regrets), "worst": worst,
            "over_5pct": sum(r > 1.05 for r in regrets)}


def on_cluster(cfg, cluster, m: int, n: int):
    """``cfg`` (an :class:`~gemmlab.family.configs.Sm90Config`) on ``cluster`` for an M x N problem, with the raster
    :func:`~gemmlab.family.heuristic_sm90.make_config` gives a grid of that many cluster tiles (bands along the
    dimension with more of them), for clusters the heuristic does not enumerate; a ValueError where the tile does not
    cut into the cluster's parts."""
    from dataclasses import replace

    cfg = replace(cfg, cluster=tuple(cluster))
    cmt, cnt = cfg.cluster_tiles(m, n)
    return replace(cfg, raster="m" if cmt >= cnt else "n")


def cluster_tile_grid(prob, model, num_sms: int = 132, per_cluster: int = 2) -> list:
    """The variants ``benchmarks/gemm_family.py cluster_tiles`` times for ``prob`` (a
    :class:`~gemmlab.family.problem.GemmProblem`; ``model``: a
    :class:`~gemmlab.family.heuristic_sm90.MachineModel`): for each cluster of
    :data:`~gemmlab.family.configs.SM90_CLUSTERS`, the ``per_cluster`` best-modelled (tile, swap, splits) choices whose
    grid runs in one wave of that cluster's persistent grid with at most a quarter of it idle or padding, each with the
    heuristic's ring (at most 8 stages) and with the deepest that fits. Ranked by the model, whose L2 term is the only
    one that sees multicast: a search, not a prediction."""
    from dataclasses import replace

    from ..family import configs
    from ..family import heuristic_sm90 as h

    k_tiles = -(-prob.k // 64)
    out = []
    for cl in configs.SM90_CLUSTERS:
        best = {}
        for tile_m, tile_n, swap in h._tile_choices(prob):
            m, n = (prob.n, prob.m) if swap else (prob.m, prob.n)
            mt, nt = -(-m // tile_m), -(-n // tile_n)
            if cl[0] > mt or cl[1] > nt:
                continue
            for s in range(1, min(h.MAX_SPLITS, k_tiles) + 1):
                try:
                    cfg = on_cluster(h.make_config(prob, tile_m, tile_n, swap=swap, splits=s, num_sms=num_sms), cl,
                                     prob.m, prob.n)
                except ValueError:
                    continue
                if cfg.splits != s:
                    continue
                clusters = cfg.clusters_on(num_sms)
                units = cfg.units(prob.m, prob.n, clusters)
                ctas = units * cfg.cluster_size
                if units > clusters or ctas < 0.75 * clusters * cfg.cluster_size or mt * nt * s < 0.75 * ctas:
                    continue
                c = h.predict(prob, cfg, num_sms, model)
                key = (tile_m, tile_n, swap)
                if key not in best or c.time_us < best[key].time_us:
                    best[key] = c
        for c in sorted(best.values(), key=lambda c: c.time_us)[:per_cluster]:
            out.append(c)
            deep = h._stages(c.config.tile_m, c.config.tile_n, c.config.split_k, prob.dtype, prob.out_dtype, cap=16)
            if deep > c.config.stages:
                out.append(h.predict(prob, replace(c.config, stages=deep), num_sms, model))
    return out


def split_pairs(prob, model, num_sms: int = 132, near: float = 1.3, cands=None) -> list:
    """The variants ``benchmarks/gemm_family.py split_sweep`` times for ``prob`` (a
    :class:`~gemmlab.family.problem.GemmProblem`): among the model's candidates within ``near`` times its best
    predicted time, the best unsplit one and the best split one of each consumer count (one, two or three warpgroups)
    and of two slices; nothing where none of them splits K. ``cands``: the model's candidates for ``prob`` on
    ``num_sms`` SMs, where the caller already has them (None: they are enumerated here)."""
    from ..family import heuristic_sm90 as h

    cands = h.candidates(prob, num_sms, model) if cands is None else cands
    close = [c for c in cands if c.time_us <= near * cands[0].time_us]
    picks = []

    def add(want):
        c = next((c for c in close if want(c.config)), None)
        if c is not None and c not in picks:
            picks.append(c)

    add(lambda g: g.split_k)
    if not picks:
        return []
    add(lambda g: not g.split_k)
    for consumers in (1, 2, 3):
        add(lambda g, n=consumers: g.split_k and g.consumers == n)
    add(lambda g: g.splits == 2)
    return picks
