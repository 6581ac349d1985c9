"""The GEMM family on this GPU: correctness sweep, host cost, configuration sweep, the family benchmark.

    python benchmarks/gemm_family.py check          # every kernel variant against FP32, poisoned outputs
    python benchmarks/gemm_family.py host           # per-call host cost: gemmlab.gemm vs torch.matmul
    python benchmarks/gemm_family.py sweep          # forced configs vs the heuristic's pick (calibration)
    python benchmarks/gemm_family.py sweep --wide   # the same on the wide family's 12 weakest shapes
    python benchmarks/gemm_family.py swap           # swapped (64-, 128-row) vs unswapped, M = 32 to 256
    python benchmarks/gemm_family.py tall           # 192-row tiles vs the best 64/128-row ones
    python benchmarks/gemm_family.py swap_tiled     # a batch of 257-1024 rows in several swapped token tiles vs unswapped
    python benchmarks/gemm_family.py w128           # a 128-row tile in one consumer warpgroup vs two, same tile
    python benchmarks/gemm_family.py stages         # the deepest A/B ring that fits vs the picks' ring of at most 8
    python benchmarks/gemm_family.py family         # the family: public call + prepared launch vs torch
    python benchmarks/gemm_family.py wide           # other models' layers (Llama-3, Qwen2.5), M off powers of two
    python benchmarks/gemm_family.py l2_shared      # the picks the L2 floor's shared-panel term changes, old vs new
    python benchmarks/gemm_family.py token8         # the picks 8-wide token steps / 192-row swap / cut batches change
    python benchmarks/gemm_family.py clusters       # clusters of 4 and 8 CTAs on the weakest shapes vs the picks
    python benchmarks/gemm_family.py cluster_tiles  # small tiles on wide clusters, unsplit or split, vs the picks
    python benchmarks/gemm_family.py split_sweep    # split-K against whole tiles with today's reducer, M <= 1024
    python benchmarks/gemm_family.py model_change --set l2_tbps=10   # the picks a model constant changes, both timed
    python benchmarks/gemm_family.py all            # check, host, family

Results go to ``results/<device>/gemm_family*.json`` (``--out DIR`` writes there instead); the
table comes last.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))

import torch  # noqa: E402

from gemmlab.measure import bench  # noqa: E402
from gemmlab.measure import gemm_family as fb  # noqa: E402
from gemmlab.family import heuristic_sm90 as h  # noqa: E402
from gemmlab.family.configs import Sm90Config  # noqa: E402
from gemmlab.family.problem import GemmProblem  # noqa: E402


def _write(name, doc, out_dir):
    return bench.write_doc(name, doc, out_dir)


def _cuda(m, n, k, dtype=torch.bfloat16, b_major="k", seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    a = torch.randn(m, k, device="cuda", dtype=dtype, generator=g)
    b = (torch.randn(n, k, device="cuda", dtype=dtype, generator=g).t() if b_major == "k"
         else torch.randn(k, n, device="cuda", dtype=dtype, generator=g))
    return a, b


FORCED = [  # (label, config kwargs): every kernel variant at least once
    ("128x256 c2x1", dict()),
    ("128x144 c1x2", dict(tile_n=144, stages=6, cluster=(1, 2), epi_n=16)),
    ("128x176 c1x1 s4", dict(tile_n=176, stages=4, cluster=(1, 1), epi_n=16)),
    ("64x128 c2x1", dict(tile_m=64, tile_n=128, stages=8, cluster=(2, 1))),
    ("64x256 c1x2 e64", dict(tile_m=64, tile_n=256, stages=4, cluster=(1, 2), epi_n=64, epi_stages=2)),
    ("swap 64x16", dict(tile_m=64, tile_n=16, stages=8, cluster=(1, 1), swap_ab=True, epi_n=16)),
    ("swap 128x64", dict(tile_m=128, tile_n=64, stages=8, cluster=(1, 1), swap_ab=True)),
    ("swap 128x112 c2x1", dict(tile_m=128, tile_n=112, stages=6, cluster=(2, 1), swap_ab=True, epi_n=16)),
    ("split3 128x256 c2x1", dict(tile_n=256, stages=4, cluster=(2, 1), splits=3)),
    ("split5 128x128 c1x2", dict(tile_n=128, stages=6, cluster=(1, 2), splits=5)),
    ("swap split7 128x64", dict(tile_m=128, tile_n=64, stages=8, cluster=(1, 1), swap_ab=True, splits=7)),
    ("swap split4 64x32", dict(tile_m=64, tile_n=32, stages=8, cluster=(1, 1), swap_ab=True, splits=4)),
]


def check(out_dir) -> list[dict]:
    from gemmlab import gemm
    from gemmlab.family import plan as P

    rows = []

    def record(what, fn):
        try:
            err = fn()
            ok = err <= 1e-2
        except Exception as e:  # keep going: one broken variant must not hide the others
            err, ok = float("nan"), False
            traceback.print_exc()
            what += f" ({type(e).__name__}: {str(e)[:160]})"
        rows.append({"what": what, "rel_err": err, "ok": ok})
        print(f"{'ok  ' if ok else 'FAIL'} {err:.2e} {what}", flush=True)

    shapes = [(1, 8, 8), (17, 24, 8), (129, 136, 72), (300, 200, 264), (1000, 1032, 520), (777, 1608, 1112),
              (64, 2112, 7168), (128, 576, 7168), (255, 4104, 64), (2000, 3000, 1000)]
    for m, n, k in shapes:
        for bm in ("k", "n"):
            def run(m=m, n=n, k=k, bm=bm):
                a, b = _cuda(m, n, k, b_major=bm, seed=m + n + k)
                out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
                assert gemm(a, b, out) is out
                torch.cuda.synchronize()
                assert not out.isnan().any(), "unwritten (poisoned) outputs"
                return fb.rel_error(out, a, b)
            cfg = h.choose(GemmProblem(m, n, k, b_major=bm), 132)
            record(f"gemm {m}x{n}x{k} b {bm}-major [{cfg.name}]", run)
    for label, kw in FORCED:
        for m, n, k in ((1000, 1232, 520), (72, 2120, 1600)):
            for bm in ("k", "n"):
                def run(kw=kw, m=m, n=n, k=k, bm=bm):
                    a, b = _cuda(m, n, k, b_major=bm, seed=7)
                    out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
                    P.prepare(a, b, out, Sm90Config(**kw))()
                    torch.cuda.synchronize()
                    assert not out.isnan().any(), "unwritten (poisoned) outputs"
                    return fb.rel_error(out, a, b)
                record(f"forced {label} {m}x{n}x{k} b {bm}-major", run)

    def fp16():
        a, b = _cuda(333, 200, 264, dtype=torch.float16)
        out = gemm(a, b)
        assert out.dtype == torch.float16 and out.shape == (333, 200)
        out_bf = torch.full((333, 200), float("nan"), device="cuda", dtype=torch.bfloat16)
        gemm(a, b, out_bf)
        return max(fb.rel_error(out, a, b), fb.rel_error(out_bf, a, b))
    record("fp16 in, fp16 and bf16 out", fp16)

    def odd_strides():  # size-1 dimensions with strides torch chose freely
        k, n = 64, 48
        a = torch.randn(k, 1, device="cuda", dtype=torch.bfloat16).t()  # 1 x K, strides (1, 1)
        b = torch.randn(n, k, device="cuda", dtype=torch.bfloat16).t()
        out = torch.full((n, 1), float("nan"), device="cuda", dtype=torch.bfloat16).t()  # 1 x N, strides (1, 1)
        gemm(a, b, out)
        return fb.rel_error(out, a, b)
    record("M = 1 with strides (1, 1)", odd_strides)

    def side_stream():  # the launch must go to torch's current stream
        a, b = _cuda(256, 512, 512)
        out = torch.full((256, 512), float("nan"), device="cuda", dtype=torch.bfloat16)
        gemm(a, b, out)  # compile outside the timed region
        out.fill_(float("nan"))
        torch.cuda.synchronize()
        s = torch.cuda.Stream()
        with torch.cuda.stream(s):
            torch.cuda._sleep(int(2e8))  # ~0.1 s on s
            gemm(a, b, out)
        torch.cuda.current_stream().synchronize()  # the default stream: the gemm must not have run yet
        still_poisoned = bool(out.isnan().all().item())
        s.synchronize()
        assert still_poisoned, "gemm ran before the work queued ahead of it on its stream"
        return fb.rel_error(out, a, b)
    record("launches on torch's current stream", side_stream)

    def no_recompile():
        n0 = len(P._KERNELS)
        for m in (100, 900, 3000):  # new sizes, same configs: no compile
            a, b = _cuda(m, 1024, 1024)
            gemm(a, b)
        n1 = len(P._KERNELS)
        a, b = _cuda(3001, 1024, 1024)
        out = gemm(a, b)
        torch.cuda.synchronize()
        print(f"     kernels compiled: {n0} -> {n1} -> {len(P._KERNELS)}; compile seconds: "
              f"{sorted(round(v, 2) for v in P.COMPILE_SECONDS.values())}")
        return fb.rel_error(out, a, b)
    record("new sizes reuse compiled kernels", no_recompile)
    _write("gemm_family_check", {"rows": rows, "compile_seconds": sorted(P.COMPILE_SECONDS.values())}, out_dir)
    return rows


def host(out_dir) -> dict:
    res = fb.host_cost()
    _write("gemm_family_host", {"rows": [res], "method": bench.host_us.__doc__.split("\n\n")[1].strip()}, out_dir)
    print(json.dumps(res))
    return res


SWEEP_SHAPES = [(64, 2112, 7168), (64, 576, 7168), (64, 24576, 1536), (128, 4096, 7168), (128, 32768, 512),
                (256, 7168, 2048), (512, 576, 7168), (512, 2112, 7168), (2048, 576, 7168), (1024, 2112, 7168)]


def weakest_wide(count: int = 12) -> list[tuple[int, int, int]]:
    """The ``count`` shapes of this device's stored wide family with the lowest public ratio."""
    shapes = fb.weakest_wide(torch.cuda.get_device_name(), count)
    if shapes is None:
        raise SystemExit("sweep --wide reads this device's gemm_family_wide.json: run 'gemm_family.py wide' first")
    return shapes


def sweep(out_dir, top: int = 6, shapes=None, name: str = "gemm_family_sweep") -> list[dict]:
    rows = []
    for m, n, k in shapes or SWEEP_SHAPES:
        prob = GemmProblem(m, n, k)
        seen, cands = set(), []
        for c in h.candidates(prob, 132):
            key = (c.config.tile_m, c.config.tile_n, c.config.cluster, c.config.swap_ab, c.config.splits)
            if key not in seen:
                seen.add(key)
                cands.append(c)
        # the model's best few, plus one of each kind it ranked lower
        pick = cands[:top]
        for want in ((True, False), (True, True), (False, True), (False, False)):
            extra = [c for c in cands if (c.config.swap_ab, c.config.split_k) == want and c not in pick]
            pick += extra[:1]
        for c in pick:
            try:
                r = fb.time_case(fb.Case(m, n, k), rounds=4, per_round=8, config=c.config)
                r.update(predicted_us=c.time_us, model_rank=cands.index(c))
                rows.append(r)
                print(f"{m}x{n}x{k} {c.config.name:<32} pred {c.time_us:8.1f} us  ours {r['prepared_us']:8.1f} us "
                      f"torch {r['torch_gpu_us']:8.1f} us ratio {r['ratio_prepared']:.3f} err {r['rel_err']:.1e}",
                      flush=True)
            except Exception as e:
                traceback.print_exc()
                print(f"FAIL {m}x{n}x{k} {c.config.name}: {e}", flush=True)
    _write(name, {"rows": rows}, out_dir)
    return rows


def _time_candidate(case, c, cands, **tags) -> dict:
    """One forced variant of the model's: the kernels alone against torch's (:func:`fb.time_case`), the row tagged
    with ``tags``, its predicted time and its rank among ``cands``; one line printed."""
    r = fb.time_case(case, rounds=4, per_round=8, config=c.config)
    r.update(tags, predicted_us=c.time_us, model_rank=cands.index(c) if c in cands else None)
    kind = " ".join(str(v) for v in tags.values())
    print(f"{case.label:>28} {kind:9s} {c.config.name:<32} pred {c.time_us:8.1f} us  ours {r['prepared_us']:8.1f} us "
          f"torch {r['torch_gpu_us']:8.1f} us ratio {r['ratio_prepared']:.3f} err {r['rel_err']:.1e}", flush=True)
    return r


#: M of the swap calibration: decode batches up to the largest M that swapping is considered for.
SWAP_MS = (32, 64, 96, 128, 160, 200, 256)


def swap_calibration(out_dir) -> list[dict]:
    """The model's best variant of each kind against each other, on every LLM layer at decode-to-mid M:
    swapped with 64- and with 128-row weight tiles, and unswapped (where M > h.SWAP_ONLY_M lets the model consider
    it); the kernels alone against torch's, in the same run."""
    rows = []
    kinds = {"swap64": lambda c: c.config.swap_ab and c.config.tile_m == 64,
             "swap128": lambda c: c.config.swap_ab and c.config.tile_m == 128,
             "unswapped": lambda c: not c.config.swap_ab}
    for name, (n, k) in fb.LLM_NK.items():
        for m in SWAP_MS:
            prob = GemmProblem(m, n, k)
            cands = h.candidates(prob, 132)
            picks = {}
            for kind, want in kinds.items():
                best = next((c for c in cands if want(c)), None)
                if best is not None:
                    picks[kind] = best
            rows += [_time_candidate(fb.Case(m, n, k, group=name), c, cands, kind=kind) for kind, c in picks.items()]
    _write("gemm_family_swap", {"rows": rows}, out_dir)
    return rows


def swap_tiled(out_dir) -> list[dict]:
    """A batch of ``SWAP_MAX_M < M <= SWAP_TILED_MAX_M`` rows swapped and cut into several token tiles, against the
    model's best unswapped variant: on every shape of both families in that range, the model's best unswapped
    config, its best swapped one with each cluster the grid allows, and its next two swapped tiles; kernels alone
    against torch's, in the same run."""
    rows = []
    cases = [c for c in fb.family_cases() + fb.wide_cases() if h.SWAP_MAX_M < c.m <= h.SWAP_TILED_MAX_M]
    for case in cases:
        prob = GemmProblem(case.m, case.n, case.k, dtype=case.dtype, b_major=case.b_major)
        cands = h.candidates(prob, 132)
        picks = [next(c for c in cands if not c.config.swap_ab)]
        swapped = [c for c in cands if c.config.swap_ab]
        if swapped:
            top = swapped[0].config
            picks += [c for c in swapped if (c.config.tile_m, c.config.tile_n, c.config.splits)
                      == (top.tile_m, top.tile_n, top.splits)]
            tiles = {(top.tile_m, top.tile_n)}
            for c in swapped:
                if (c.config.tile_m, c.config.tile_n) not in tiles and len(tiles) < 3:
                    tiles.add((c.config.tile_m, c.config.tile_n))
                    picks.append(c)
        rows += [_time_candidate(case, c, cands) for c in picks]
    _write("gemm_family_swap_tiled", {"rows": rows}, out_dir)
    return rows


def tall_tiles(out_dir) -> list[dict]:
    """192-row tiles (three consumer warpgroups) against the model's best 64/128-row variant, each the model's
    best of its kind, kernels alone against torch's in the same run: chapter 07's ten shapes and the widened
    family from M = 384."""
    rows = []
    shapes = [(m, n, k, "chapter 07") for m, n, k in fb.CHAPTER07_SHAPES]
    shapes += [(c.m, c.n, c.k, c.group) for c in fb.wide_cases() if c.m >= 384]
    for m, n, k, group in shapes:
        cands = h.candidates(GemmProblem(m, n, k), 132)
        picks = {"tall": next((c for c in cands if c.config.tile_m == 192), None),
                 "short": next((c for c in cands if c.config.tile_m != 192), None)}
        rows += [_time_candidate(fb.Case(m, n, k, group=group), c, cands, kind=kind)
                 for kind, c in picks.items() if c is not None]
    _write("gemm_family_tall", {"rows": rows}, out_dir)
    return rows


def _unique_problems(cases):
    """``(case, problem)`` for each distinct problem of ``cases``, the first case that poses it (the families share
    some shapes)."""
    seen = set()
    for case in cases:
        prob = GemmProblem(case.m, case.n, case.k, dtype=case.dtype, out_dtype=case.dtype, b_major=case.b_major)
        if prob not in seen:
            seen.add(prob)
            yield case, prob


def w128(out_dir) -> list[dict]:
    """A 128-row tile held by one consumer warpgroup (``wg_rows = 128``) against two, each as the model builds it
    (its own ring depth), same tile, cluster and splits, kernels alone against torch's in the same run: every shape of
    both families whose model pick has a 128-row tile up to 192 wide, and chapter 07's ten. A form the model does not
    consider for the shape is built as :func:`~gemmlab.family.heuristic_sm90.make_config` would
    (``model_rank`` None)."""
    rows = []
    cases = fb.family_cases() + fb.wide_cases() + [fb.Case(m, n, k, group="chapter 07")
                                                   for m, n, k in fb.CHAPTER07_SHAPES]
    for case, prob in _unique_problems(cases):
        cands = h.candidates(prob, 132)
        top = cands[0].config
        if h.wg_rows_for(top.tile_m, top.tile_n) != (64, 128):
            continue
        same = [c for c in cands if (c.config.tile_m, c.config.tile_n, c.config.swap_ab, c.config.cluster,
                                     c.config.splits) == (top.tile_m, top.tile_n, top.swap_ab, top.cluster, top.splits)]
        for w in (64, 128):
            c = next((c for c in same if c.config.wg_rows == w), None)
            if c is None:  # a form the model does not consider here (h._one_warpgroup_worth_modelling)
                c = h.predict(prob, h.make_config(prob, top.tile_m, top.tile_n, swap=top.swap_ab, splits=top.splits,
                                                  cluster=top.cluster, wg_rows=w), 132)
            rows.append(_time_candidate(case, c, cands, kind=f"w{w}"))
    _write("gemm_family_w128", {"rows": rows}, out_dir)
    return rows


def deep_rings(out_dir, cap: int = 16) -> list[dict]:
    """The heuristic's pick with its A/B ring of at most 8 stages against the same config with the deepest ring that
    fits (up to ``cap``), kernels alone against torch's in the same run: every shape of both families where a deeper
    ring fits (narrow 64-row tiles: a 64 x 64 tile's stage is 16 KiB, so 13 fit where 8 were used)."""
    from dataclasses import replace

    from gemmlab import hardware

    model = h.model_for(hardware.spec_of())  # this GPU's picks
    rows = []
    for case, prob in _unique_problems(fb.family_cases() + fb.wide_cases()):
        cands = h.candidates(prob, 132, model)
        pick = cands[0]
        deep = h._stages(pick.config.tile_m, pick.config.tile_n, pick.config.split_k, prob.dtype, prob.out_dtype,
                         cap=cap, wg_rows=pick.config.wg_rows)
        if deep <= pick.config.stages:
            continue
        rows.append(_time_candidate(case, pick, cands, kind=f"s{pick.config.stages}"))
        rows.append(_time_candidate(case, replace(pick, config=replace(pick.config, stages=deep)), cands,
                                    kind=f"s{deep}"))
    _write("gemm_family_stages", {"rows": rows}, out_dir)
    return rows


def family(out_dir, quick: bool = False) -> list[dict]:
    cases = fb.family_cases()
    if quick:
        cases = cases[::3]
    rows = fb.run(cases)
    s = fb.summary(rows)
    _write("gemm_family", {"rows": rows, "summary": s, "method": fb.METHOD}, out_dir)
    print(json.dumps(s, indent=1))
    return rows


def wide(out_dir) -> list[dict]:
    """Issue 28's widened family: other models' layers, M not a power of two."""
    rows = fb.run(fb.wide_cases())
    s = fb.summary(rows)
    _write("gemm_family_wide", {"rows": rows, "summary": s, "method": fb.METHOD}, out_dir)
    print(json.dumps(s, indent=1))
    return rows


def l2_shared(out_dir) -> list[dict]:
    """Where the L2 floor's shared-panel term (``MachineModel.l2_shared_boost``) changes the pick on this GPU: every
    family and widened-family shape whose best config differs between the term off (1.0) and the default, both
    picks timed (prepared launches against torch in the same run, inputs rotated beyond L2)."""
    from dataclasses import replace

    from gemmlab import hardware

    new = h.model_for(hardware.device_spec(torch.cuda.current_device()))
    old = replace(new, l2_shared_boost=1.0)
    rows = []
    for case in fb.family_cases() + fb.wide_cases():
        p = GemmProblem(case.m, case.n, case.k, case.dtype, case.dtype, case.b_major)
        a, b = h.candidates(p, 132, old)[0].config, h.candidates(p, 132, new)[0].config
        if a == b:
            continue
        for which, cfg in (("old", a), ("new", b)):
            r = fb.time_case(case, rounds=4, per_round=8, config=cfg)
            r.update(which=which)
            rows.append(r)
            print(f"{case.m}x{case.n}x{case.k} {case.dtype[:4]} b{case.b_major} {which} {cfg.name:<34} ours "
                  f"{r['prepared_us']:8.1f} torch {r['torch_gpu_us']:8.1f} ratio {r['ratio_prepared']:.3f}", flush=True)
    _write("gemm_family_l2_shared", {"rows": rows, "old": "l2_shared_boost=1.0",
                                     "new": f"l2_shared_boost={new.l2_shared_boost}"}, out_dir)
    return rows


def token8(out_dir, only: str | None = None) -> list[dict]:
    """Where the tile forms of :data:`~gemmlab.family.heuristic_sm90.FORMS` change this GPU's pick against
    :data:`~gemmlab.family.heuristic_sm90.FORMS_BEFORE_TOKEN8` (token tiles a multiple of 8 wide, 192-row weight tiles
    swapped, a batch of 177-256 rows cut in two): every shape of both families and chapter 07's ten, both picks timed,
    kernels alone against torch's in the same run, inputs rotated beyond L2 (``only``: shapes whose label contains
    it)."""
    from gemmlab import hardware

    model = h.model_for(hardware.spec_of())  # this GPU's picks
    rows = []
    cases = fb.family_cases() + fb.wide_cases() + [fb.Case(m, n, k, group="chapter 07")
                                                   for m, n, k in fb.CHAPTER07_SHAPES]
    for case, prob in _unique_problems(cases):
        if only and only not in case.label:
            continue
        cands = h.candidates(prob, 132, model)  # today's forms (h.FORMS)
        old, new = h.candidates(prob, 132, model, h.FORMS_BEFORE_TOKEN8)[0], cands[0]
        if old.config == new.config:
            continue
        for which, c in (("before", old), ("after", new)):
            rows.append(_time_candidate(case, c, cands, which=which))
    _write("gemm_family_token8", {"rows": rows, "before": repr(h.FORMS_BEFORE_TOKEN8), "after": repr(h.FORMS)},
           out_dir)
    return rows


#: The clusters of more than two CTAs (cuBLAS runs 4 x 2, 2 x 4, 4 x 1 and 1 x 4 on the shapes the family loses most:
#: ``results/nvidia-h100-80gb-hbm3/cublas_picks_weak.json``).
WIDE_CLUSTERS = ((2, 2), (4, 1), (1, 4), (4, 2), (2, 4))


def load_active_clusters() -> dict:
    """``{(SMs, cluster size): clusters}`` for clusters of 4 and 8 CTAs of the dense kernel's common block (384
    threads, 200 KiB of shared memory), as the driver answers :func:`gemmlab.hardware.max_active_clusters`, into
    :data:`gemmlab.family.configs.ACTIVE_CLUSTERS`, so this run's persistent grids fit the GPU."""
    from gemmlab import hardware
    from gemmlab.family import configs

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    found = {(sms, size): hardware.max_active_clusters(size, threads=384) for size in (4, 8)}
    configs.ACTIVE_CLUSTERS.update(found)
    return found


def clusters(out_dir, count: int = 16, bases: int = 1) -> list[dict]:
    """Clusters of 4 and 8 CTAs against the model's picks: on the ``count`` shapes of both families this GPU's stored
    runs (``gemm_family.json``, ``gemm_family_wide.json``) rank weakest (kernel against cuBLAS), the model's ``bases``
    best tile choices (tile, swap, splits), each with its own cluster and with every one of :data:`WIDE_CLUSTERS` the
    tile cuts into (no more than a quarter of the cluster grid padding), kernels alone against torch's in the same
    run."""
    from dataclasses import replace

    from gemmlab import hardware
    from gemmlab.family import configs

    model = h.model_for(hardware.spec_of())
    weak = fb.weakest_rows(torch.cuda.get_device_name(), count, ("gemm_family", "gemm_family_wide"), "ratio_prepared")
    cases = [fb.Case(r["m"], r["n"], r["k"], dtype=r["dtype"], b_major=r["b_major"], group="weak") for r in weak or []]
    rows = []
    for case, prob in _unique_problems(cases):
        cands = h.candidates(prob, 132, model)
        picked, shapes = [], set()
        for c in cands:
            key = (c.config.tile_m, c.config.tile_n, c.config.swap_ab, c.config.splits, c.config.wg_rows)
            if key not in shapes and len(picked) < bases:
                shapes.add(key)
                picked.append(c)
        for rank, c in enumerate(picked):
            rows.append(_time_candidate(case, c, cands, base=rank, cluster="own"))
            mt, nt = c.config.tiles(prob.m, prob.n)
            for cl in WIDE_CLUSTERS:
                if cl[0] > mt or cl[1] > nt:
                    continue
                try:
                    cfg = replace(c.config, cluster=cl)
                except ValueError:  # the tile does not cut into the cluster's parts
                    continue
                cmt, cnt = cfg.cluster_tiles(prob.m, prob.n)
                if mt * nt < 0.75 * cmt * cl[0] * cnt * cl[1]:  # more than a quarter of the cluster grid padding
                    continue
                rows.append(_time_candidate(case, h.predict(prob, cfg, 132, model), cands, base=rank,
                                            cluster=f"{cl[0]}x{cl[1]}"))
    active = {f"{sms} SMs, {size} CTAs": v for (sms, size), v in configs.ACTIVE_CLUSTERS.items()}
    _write("gemm_family_clusters", {"rows": rows, "active_clusters": active}, out_dir)
    return rows


#: The shapes :func:`cluster_tiles` searches by default: the family shapes below 0.90x as called on the H200
#: (2026-12-02), the two closest above it, chapter 07's weakest, and three of the widened family's M = 200.
CLUSTER_TILE_SHAPES = ((256, 2112, 7168), (1024, 576, 7168), (64, 4096, 7168), (200, 4096, 14336),
                       (384, 6144, 4096), (4096, 576, 7168), (512, 576, 7168),
                       (200, 4608, 3584), (200, 4096, 4096), (200, 6144, 4096))
#: Variants close to what cuBLAS ran on the H100 (``cublas_picks_weak.json``: tile, ring depth, cluster, split-K),
#: timed beside the grid where the grid's per-cluster cut leaves them out: ``(M, N, K) -> [(tile_m, tile_n, swap,
#: splits, cluster, stages)]`` (stages None: the heuristic's ring).
CLUSTER_TILE_EXTRAS = {
    (256, 2112, 7168): [(64, 64, False, 1, (2, 1), 13), (64, 64, False, 1, (2, 1), 8)],
    (64, 4096, 7168): [(64, 64, True, 2, (2, 1), 13)],
    (1024, 576, 7168): [(64, 96, False, 1, (4, 2), 10), (64, 96, False, 1, (2, 2), 10)],
    # 200 tokens in three 72-wide token tiles, as cuBLAS cut 200 x 4608 x 3584 on the H100 (128 x 72 tiles, 108 CTAs);
    # the heuristic's token tiles are at least SWAP_MIN_TOKEN_TILE = 96 wide
    (200, 4608, 3584): [(128, 72, True, 1, (1, 1), None), (128, 72, True, 1, (2, 1), None),
                        (64, 72, True, 1, (1, 1), None), (192, 72, True, 1, (1, 1), None)],
    (200, 4096, 4096): [(128, 72, True, 1, (1, 1), None), (128, 72, True, 1, (2, 1), None),
                        (192, 72, True, 1, (1, 1), None)],
    (200, 6144, 4096): [(128, 72, True, 1, (1, 1), None), (128, 72, True, 1, (2, 1), None),
                        (192, 72, True, 1, (1, 1), None)],
    (200, 4096, 14336): [(128, 104, True, 2, (1, 2), 7), (128, 104, True, 2, (1, 1), 7),
                         (128, 72, True, 1, (1, 1), None), (128, 72, True, 2, (1, 1), None)],
}


def cluster_tiles(out_dir, only: str | None = None) -> list[dict]:
    """Small tiles on wide clusters, unsplit or split, against the model's pick:
    :func:`~gemmlab.measure.gemm_family.cluster_tile_grid` on each of :data:`CLUSTER_TILE_SHAPES` (``only``: the
    shapes whose ``MxNxK`` label contains it), kernels alone against torch's in the same run. cuBLAS runs 64 x 96
    tiles in clusters of 2 x 4 on 96 CTAs, all of K, at 1024 x 576 x 7168 on the H100
    (``results/nvidia-h100-80gb-hbm3/cublas_picks_weak.json``), where the model's pick splits K in four.
    :data:`CLUSTER_TILE_EXTRAS` adds variants like cuBLAS's where the grid leaves them out."""
    from dataclasses import replace

    from gemmlab import hardware

    model = h.model_for(hardware.spec_of())
    rows = []
    for m, n, k in CLUSTER_TILE_SHAPES:
        case = fb.Case(m, n, k, group="cluster tiles")
        if only and only not in f"{m}x{n}x{k}":
            continue
        prob = GemmProblem(m, n, k)
        cands = h.candidates(prob, 132, model)
        rows.append(_time_candidate(case, cands[0], cands, kind="pick"))
        grid = fb.cluster_tile_grid(prob, model)
        for tm, tn, swap, splits, cl, stages in CLUSTER_TILE_EXTRAS.get((m, n, k), ()):
            base = h.make_config(prob, tm, tn, swap=swap, splits=splits)
            cfg = fb.on_cluster(replace(base, stages=stages or base.stages), cl, m, n)
            if all(c.config != cfg for c in grid):
                grid.append(h.predict(prob, cfg, 132, model))
        for c in grid:
            if c.config == cands[0].config:
                continue
            try:
                rows.append(_time_candidate(case, c, cands, kind="grid"))
            except Exception as e:  # a variant that fails is reported, and the search goes on
                traceback.print_exc()
                print(f"FAIL {case.label} {c.config.name}: {e}", flush=True)
    slug = f"_{only}" if only else ""
    _write(f"gemm_family_cluster_tiles{slug}", {"rows": rows}, out_dir)
    return rows


#: The largest M and best modelled time :func:`split_sweep` looks at (above them split-K is a tail's business).
SPLIT_SWEEP_MAX_M, SPLIT_SWEEP_MAX_US = 1024, 80.0


def split_sweep(out_dir, only: str | None = None) -> list[dict]:
    """Split-K against whole tiles with today's reducer (grouped reads since 2026-12-02; the split-K constants were
    fitted before it): :func:`~gemmlab.measure.gemm_family.split_pairs` on every shape of both families up to
    :data:`SPLIT_SWEEP_MAX_M` rows whose best modelled time is at most :data:`SPLIT_SWEEP_MAX_US`, kernels alone
    against torch's in the same run (``only``: shapes whose label contains it)."""
    from gemmlab import hardware

    model = h.model_for(hardware.spec_of())
    rows = []
    for case, prob in _unique_problems(fb.family_cases() + fb.wide_cases()):
        if prob.m > SPLIT_SWEEP_MAX_M or (only and only not in case.label):
            continue
        cands = h.candidates(prob, 132, model)
        picks = fb.split_pairs(prob, model, cands=cands)
        if not picks or picks[0].time_us > SPLIT_SWEEP_MAX_US:
            continue
        for c in picks:
            kind = f"split{c.config.splits}" if c.config.split_k else "whole"
            try:
                rows.append(_time_candidate(case, c, cands, kind=kind))
            except Exception as e:
                traceback.print_exc()
                print(f"FAIL {case.label} {c.config.name}: {e}", flush=True)
    slug = f"_{only}" if only else ""
    _write(f"gemm_family_split_sweep{slug}", {"rows": rows}, out_dir)
    return rows


def model_change(out_dir, changes: list[str]) -> list[dict]:
    """Where changing constants of this GPU's :class:`~gemmlab.family.heuristic_sm90.MachineModel` (``changes``:
    ``name=value`` strings, e.g. ``l2_tbps=10``) changes the pick: every shape of both families and chapter 07's ten,
    both picks timed, kernels alone against torch's in the same run, inputs rotated beyond L2; written to
    ``gemm_family_model_<changes>.json`` (``l2_tbps10``)."""
    from dataclasses import replace

    from gemmlab import hardware

    old = h.model_for(hardware.spec_of())
    new = replace(old, **{k: float(v) for k, v in (c.split("=") for c in changes)})
    rows = []
    cases = fb.family_cases() + fb.wide_cases() + [fb.Case(m, n, k, group="chapter 07")
                                                   for m, n, k in fb.CHAPTER07_SHAPES]
    for case, prob in _unique_problems(cases):
        a, b = h.candidates(prob, 132, old), h.candidates(prob, 132, new)
        if a[0].config == b[0].config:
            continue
        for which, c, cands in (("old", a[0], a), ("new", b[0], b)):
            rows.append(_time_candidate(case, c, cands, which=which))
    slug = "_".join(c.replace("=", "").replace(".", "p") for c in changes)
    _write(f"gemm_family_model_{slug}", {"rows": rows, "changes": changes}, out_dir)
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("what", choices=["check", "host", "sweep", "swap", "swap_tiled", "tall", "w128", "stages", "family",
                                    "quick", "wide", "l2_shared", "token8", "clusters", "cluster_tiles", "split_sweep",
                                    "model_change", "all"])
    p.add_argument("--out", default=None, help="write JSON here instead of results/<device>/")
    p.add_argument("--wide", action="store_true", help="sweep: the 12 weakest shapes of the stored wide family")
    p.add_argument("--only", default=None, help="token8, cluster_tiles: only the shapes whose label contains this")
    p.add_argument("--set", action="append", default=[], help="model_change: a model constant, name=value")
    p.add_argument("--occupancy", action="store_true",
                   help="ask the driver how many clusters of 4 and 8 fit at once and size the persistent grids by it")
    args = p.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False  # FP32 references in FP32
    t0 = time.time()
    if args.what in ("check", "all"):
        check(args.out)
    if args.what in ("host", "all"):
        host(args.out)
    if args.what == "sweep":
        if args.wide:
            sweep(args.out, shapes=weakest_wide(), name="gemm_family_sweep_wide")
        else:
            sweep(args.out)
    if args.what == "swap":
        swap_calibration(args.out)
    if args.what == "swap_tiled":
        swap_tiled(args.out)
    if args.what == "tall":
        tall_tiles(args.out)
    if args.what == "w128":
        w128(args.out)
    if args.what == "stages":
        deep_rings(args.out)
    if args.what in ("family", "all"):
        family(args.out)
    if args.what == "quick":
        family(args.out, quick=True)
    if args.what == "wide":
        wide(args.out)
    if args.what == "l2_shared":
        l2_shared(args.out)
    if args.what == "token8":
        token8(args.out, args.only)
    if args.occupancy:
        print("active clusters:", load_active_clusters())
    if args.what == "clusters":
        clusters(args.out)
    if args.what == "model_change":
        model_change(args.out, args.set)
    if args.what == "cluster_tiles":
        cluster_tiles(args.out, args.only)
    if args.what == "split_sweep":
        split_sweep(args.out, args.only)
    print(f"done in {time.time() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
