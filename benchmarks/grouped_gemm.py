"""The grouped GEMM (chapter 08) on this GPU: correctness sweep and the MoE benchmark.

    python benchmarks/grouped_gemm.py check      # ragged + list forms, edge cases, vs FP32 and torch._grouped_mm
    python benchmarks/grouped_gemm.py moe        # MoE sets: gemmlab vs torch._grouped_mm, a matmul loop, roofline
    python benchmarks/grouped_gemm.py moe_wide   # nine models' expert GEMMs, 32 to 16384 rows: the public call vs torch
    python benchmarks/grouped_gemm.py tail       # decode launches of 1 to 64 experts: fixed cost, the last wave
    python benchmarks/grouped_gemm.py sweep_sched  # every tile, static and dynamic: the heuristic's data
    python benchmarks/grouped_gemm.py sweep_pairs  # 2-CTA pairs with dynamic scheduling
    python benchmarks/grouped_gemm.py sweep_decode  # the 64-row tiles, 64 to 256 wide, on the decode sets
    python benchmarks/grouped_gemm.py sweep_narrow  # the two decode tiles on outputs 512 to 3072 wide
    python benchmarks/grouped_gemm.py sweep_medium  # 128 x 192 static against dynamic, where it is chosen
    python benchmarks/grouped_gemm.py sweep_128x128  # 128 x 128 tiles (a ping-pong warpgroup's) against 128 x 256
    python benchmarks/grouped_gemm.py overlap    # each tile's store between main loops or under the next one
    python benchmarks/grouped_gemm.py fences     # the unfenced variant on MoE sets: wrong, and "faster" than its floor
    python benchmarks/grouped_gemm.py kernel     # the headline alone: kernel time vs torch._grouped_mm, 64 sets
    python benchmarks/grouped_gemm.py mixed      # the mixed order in blocks of 64, 128, 256 claims, and without it
    python benchmarks/grouped_gemm.py all

Results go to ``results/<device>/grouped_gemm*.json`` (``--out DIR`` writes there instead); the
table comes last.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import traceback

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))

import torch  # noqa: E402

from gemmlab.measure import bench  # noqa: E402
from gemmlab.family import api, configs, heuristic_grouped as hg  # noqa: E402
from gemmlab import grouped_model as gm  # noqa: E402
from gemmlab.measure import grouped as mg  # noqa: E402
from gemmlab import hardware  # noqa: E402

POISON = float("nan")

#: The expert GEMMs of two MoE models: (label, N, K).
MOE_SHAPES = [
    ("DeepSeek-V3 gate/up", 4096, 7168),
    ("DeepSeek-V3 down", 7168, 2048),
    ("Mixtral gate/up", 14336, 4096),
    ("Mixtral down", 4096, 14336),
]
GROUPS = (8, 32, 64, 128)
TOKENS = (64, 512, 4096, 16384)


def ragged_inputs(sizes, n, k, *, b_major="k", seed=0, extra_rows=0):
    return gm.random_problem(sizes, n, k, b_major=b_major, seed=seed, extra_rows=extra_rows)


def rel_err(out, ref, rows):
    o, r = out[:rows].float(), ref[:rows].float()
    if not torch.isfinite(o).all():
        return float("inf")
    return ((o - r).norm() / r.norm().clamp_min(1e-30)).item()


# --------------------------------------------------------------------------------------
# check
# --------------------------------------------------------------------------------------

CHECK_CASES = [  # (label, sizes, N, K, b_major, config name or None)
    ("uniform 4 x 256", [256] * 4, 256, 512, "k", None),
    ("empty groups", [0, 300, 0, 0, 77, 0], 384, 256, "k", None),
    ("groups below one tile", [1, 7, 33, 63, 65, 2], 512, 512, "k", None),
    ("unaligned ends, N-major b", [100, 37, 250, 3], 264, 136, "n", None),
    ("one giant group", [0, 5000, 0], 1024, 1024, "k", None),
    ("128 small groups", [3, 0, 11, 1] * 32, 512, 256, "k", None),
    ("all empty but last", [0] * 7 + [129], 256, 256, "k", None),
    ("small tile forced", [200, 0, 130, 64], 384, 512, "k", "SMALL"),
    ("large tile forced", [3, 1, 0, 9] * 4, 512, 512, "n", "LARGE"),
    ("rows after offs[-1]", [64, 64], 256, 256, "k", None),  # 16 extra rows must stay untouched
    ("K not a tile multiple", [130, 260], 256, 200, "k", None),
]


def check(out_dir=None):
    rows = []
    have_torch_grouped = hasattr(torch, "_grouped_mm")
    for label, sizes, n, k, major, cname in CHECK_CASES:
        cfg = getattr(grouped, cname) if cname else None
        extra = 16 if label.startswith("rows after") else 0
        row = {"case": label, "groups": len(sizes), "tokens": sum(sizes), "n": n, "k": k, "b_major": major}
        try:
            a, b, offs = ragged_inputs(sizes, n, k, b_major=major, extra_rows=extra, seed=len(rows))
            out = torch.full((a.shape[0], n), POISON, device="cuda", dtype=a.dtype)
            api.grouped_gemm(a, b, offs, out=out, config=cfg)
            torch.cuda.synchronize()
            ref = gm.reference(a, b, offs)
            row["rel_err"] = rel_err(out, ref, sum(sizes))
            row["tail_untouched"] = bool(torch.isnan(out[sum(sizes):]).all().item()) if extra else None
            if have_torch_grouped and all(s % 16 == 0 for s in [0]):
                try:
                    t = torch._grouped_mm(a[:sum(sizes)], b, offs=offs)
                    row["torch_rel_err"] = rel_err(t, ref, sum(sizes))
                except Exception as e:  # noqa: BLE001
                    row["torch_rel_err"] = f"{type(e).__name__}: {e}"[:120]
            row["ok"] = row["rel_err"] < 1e-2 and row["tail_untouched"] in (None, True)
        except Exception:  # noqa: BLE001
            row["error"] = traceback.format_exc()[-800:]
            row["ok"] = False
        rows.append(row)
        print(f"{label:28s} ok={row['ok']} err={row.get('rel_err')} torch={row.get('torch_rel_err')}", flush=True)
    # The list form: independent problems of different M, N, K.
    for major in ("k", "n"):
        label = f"list form, b {major}-major"
        row = {"case": label}
        try:
            pairs = gm.random_pairs(gm.LIST_SHAPES, b_major=major, seed=99)
            outs = [torch.full((ai.shape[0], bi.shape[1]), POISON, device="cuda", dtype=torch.bfloat16)
                    for ai, bi in pairs]
            api.grouped_gemm_list(pairs, outs)
            torch.cuda.synchronize()
            errs = [rel_err(c, ai.float() @ bi.float(), ai.shape[0]) if ai.shape[0] else 0.0
                    for (ai, bi), c in zip(pairs, outs)]
            row["rel_err"] = max(errs)
            row["ok"] = row["rel_err"] < 1e-2
        except Exception:  # noqa: BLE001
            row["error"] = traceback.format_exc()[-800:]
            row["ok"] = False
        rows.append(row)
        print(f"{label:28s} ok={row['ok']} err={row.get('rel_err')}", flush=True)
    passed = sum(r["ok"] for r in rows)
    _write("grouped_gemm_check", {"rows": rows, "passed": passed, "total": len(rows)}, out_dir)
    print(f"check: {passed} / {len(rows)} passed")
    return passed == len(rows)


# --------------------------------------------------------------------------------------
# the MoE benchmark
# --------------------------------------------------------------------------------------


def moe_sets(shapes, groups, tokens):
    """Every MoE set of the benchmark and the sweep: ``(row, sizes, a, b, offs)``, the inputs on the GPU.

    ``row`` starts the set's result row (shape, N, K, G, T, non-empty groups, the largest group). The caller
    deletes its references to the inputs (and its own buffers) before asking for the next set.
    """
    for label, n, k in shapes:
        for G in groups:
            for T in tokens:
                sizes = gm.skewed_sizes(T, G)
                a, b, offs = ragged_inputs(sizes, n, k)
                row = {"shape": label, "n": n, "k": k, "groups": G, "tokens": T,
                       "nonempty": sum(1 for x in sizes if x), "max_group": max(sizes)}
                yield row, sizes, a, b, offs
                del a, b, offs  # the caller has dropped its references: free the set before the next
                torch.cuda.empty_cache()


def moe(out_dir=None, tokens=TOKENS, groups=GROUPS, shapes=MOE_SHAPES, rounds=7):
    spec = hardware.device_spec(torch.cuda.current_device())
    peak = spec.bf16_tflops * 1e12 if spec else 989e12
    hbm = spec.hbm_tbps * 1e12 if spec else 3.35e12
    # The measured roofline's ceilings, before and after the sets: the better of each is this GPU's.
    ceilings = [bench.measured_ceilings()]
    rows = []
    for row, sizes, a, b, offs in moe_sets(shapes, groups, tokens):
        label, n, k, G, T = row["shape"], row["n"], row["k"], row["groups"], row["tokens"]
        ends = [0] + torch.cumsum(torch.tensor(sizes), 0).tolist()
        out = torch.empty((T, n), device="cuda", dtype=a.dtype)
        out_t = torch.empty((T, n), device="cuda", dtype=a.dtype)
        flops, nbytes = gm.flops_bytes(sizes, n, k)
        floor_ms = mg.floor_ms(flops, nbytes, peak / 1e12, hbm / 1e12)
        cfg = hg.default_config(T, G, n, k, a.device)
        api.grouped_gemm(a, b, offs, out=out)  # compile + warm up
        ref = gm.reference(a, b, offs)
        err = rel_err(out, ref, T)
        del ref

        # A padded batched GEMM: every group padded to the largest (pre-padded: the
        # gather/scatter it would also need is not timed, in its favour).
        mmax = max(sizes)
        a_pad = torch.zeros((G, mmax, k), device="cuda", dtype=a.dtype)
        out_pad = torch.empty((G, mmax, n), device="cuda", dtype=a.dtype)

        def loop():
            for g in range(G):
                if ends[g + 1] > ends[g]:
                    torch.matmul(a[ends[g]:ends[g + 1]], b[g], out=out_t[ends[g]:ends[g + 1]])

        launches = {
            "gemmlab": [lambda: api.grouped_gemm(a, b, offs, out=out)],
            "gemmlab_novalidate": [lambda: api.grouped_gemm(a, b, offs, out=out, validate=False)],
            "torch_grouped_mm": [lambda: torch._grouped_mm(a, b, offs=offs)],
            "matmul_loop": [loop],
            "padded_bmm": [lambda: torch.bmm(a_pad, b, out=out_pad)],
        }
        t = bench.time_interleaved(launches, rounds=rounds, per_round=5, warmup=2)
        # The DSL's own L2 promotion (128 bytes) in place of ours (256), for its gain.
        l2_128 = [lambda: api.grouped_gemm(a, b, offs, out=out, validate=False, l2_promotion=None)]
        kernels = {"gemmlab_kernel": launches["gemmlab_novalidate"], "gemmlab_l2_128_kernel": l2_128,
                   "torch_grouped_mm_kernel": launches["torch_grouped_mm"]}
        mixed = hg.mixed_rows(cfg, T, G)
        other = not hg.largest_first(cfg, T)
        if mixed:  # the mixed order against the order the kernel takes without it, for its gain
            kernels["gemmlab_other_mixed_kernel"] = [
                lambda: api.grouped_gemm(a, b, offs, out=out, validate=False, mixed=0, by_size=not other)]
        else:  # the visiting order the heuristic did not choose (largest first or index order), for its gain
            kernels["gemmlab_other_order_kernel"] = [
                lambda: api.grouped_gemm(a, b, offs, out=out, validate=False, by_size=other)]
        if cfg.cluster == (1, 1):  # the tile scheduling the heuristic did not choose (dynamic or static)
            dyn = not hg.dynamic_schedule(cfg)
            kernels["gemmlab_other_sched_kernel"] = [
                lambda: api.grouped_gemm(a, b, offs, out=out, validate=False, dynamic=dyn)]
        tg = bench.time_interleaved(kernels,
                                    rounds=rounds, per_round=5, warmup=2, gpu_only=True)
        row.update({"config": cfg.name, "rel_err": err, "floor_ms": floor_ms, "flops": flops, "bytes": nbytes,
                    "weight_bound": nbytes / hbm > flops / peak})
        for name, v in list(t.items()) + list(tg.items()):
            row[f"{name}_ms"] = v["median_ms"]
        row["padded_flops_ratio"] = G * mmax / max(T, 1)
        for name in ("gemmlab", "gemmlab_novalidate", "torch_grouped_mm", "matmul_loop", "padded_bmm",
                     "gemmlab_kernel", "gemmlab_l2_128_kernel", "torch_grouped_mm_kernel"):
            row[f"{name}_tflops"] = flops / (row[f"{name}_ms"] * 1e-3) / 1e12
        row["vs_torch"] = row["torch_grouped_mm_ms"] / row["gemmlab_ms"]
        row["vs_torch_novalidate"] = row["torch_grouped_mm_ms"] / row["gemmlab_novalidate_ms"]
        row["vs_torch_kernel"] = row["torch_grouped_mm_kernel_ms"] / row["gemmlab_kernel_ms"]
        row["vs_loop"] = row["matmul_loop_ms"] / row["gemmlab_ms"]
        row["largest_first"] = bool(mixed) or not other
        row["mixed"] = bool(mixed)
        row["order_gain"] = (None if mixed else row["gemmlab_other_order_kernel_ms"] / row["gemmlab_kernel_ms"])
        row["mixed_gain"] = (row["gemmlab_other_mixed_kernel_ms"] / row["gemmlab_kernel_ms"] if mixed else None)
        row["l2_gain"] = row["gemmlab_l2_128_kernel_ms"] / row["gemmlab_kernel_ms"]
        row["dynamic"] = hg.dynamic_schedule(cfg)
        row["sched_gain"] = (row["gemmlab_other_sched_kernel_ms"] / row["gemmlab_kernel_ms"]
                             if "gemmlab_other_sched_kernel_ms" in row else None)
        row["vs_padded"] = row["padded_bmm_ms"] / row["gemmlab_ms"]
        row["of_roofline"] = floor_ms / row["gemmlab_kernel_ms"]
        rows.append(row)
        print(f"{label:20s} G={G:3d} T={T:5d} {cfg.name:18s} err={err:.1e} "
              f"ours={row['gemmlab_ms']:.3f} nov={row['gemmlab_novalidate_ms']:.3f} "
              f"torch={row['torch_grouped_mm_ms']:.3f} loop={row['matmul_loop_ms']:.3f} "
              f"x{row['vs_torch']:.2f} k{row['vs_torch_kernel']:.2f} order{row['order_gain'] or 1:.2f} "
              f"mixed{row['mixed_gain'] or 1:.2f} "
              f"l2{row['l2_gain']:.2f} sched{row['sched_gain'] or 1:.2f} "
              f"roof={row['of_roofline']:.2f}", flush=True)
        del a, b, out, out_t, a_pad, out_pad
    ceilings.append(bench.measured_ceilings())
    measured = {"copy_tbs": max(c["copy_tbs"] for c in ceilings),
                "gemm_tflops": max(c["gemm_tflops"] for c in ceilings), "runs": ceilings}
    mg.measured_roofline(rows, measured)
    summary = mg.summarize(rows)
    _write("grouped_gemm", {"rows": rows, "summary": summary, "clocks": bench.gpu_clocks(),
                            "peak_tflops": peak / 1e12, "hbm_gbs": hbm / 1e9, "measured": measured,
                            # how the public call (default arguments) checked offs in this run
                            "offs_check": "kernel"}, out_dir)
    print(f"measured ceilings: copy {measured['copy_tbs']:.2f} TB/s, cuBLAS {measured['gemm_tflops']:.0f} TFLOP/s "
          f"(each the better of {len(ceilings)}: before and after the sets)")
    print(json.dumps(summary, indent=1))
    return summary


def moe_wide(out_dir=None, sets=None, tokens=mg.MOE_WIDE_TOKENS, rounds=7):
    """Issue 28's widened MoE family: the public call as users make it against ``torch._grouped_mm``.

    Three competitors interleaved (the default call, ``validate=False``, torch), then the kernels alone
    (``gpu_only``); every output is checked against an FP32 reference first, on a poisoned buffer.
    """
    rows = []
    for label, G, n, k in sets or mg.moe_wide_sets():
        for T in tokens:
            sizes = gm.skewed_sizes(T, G)
            a, b, offs = ragged_inputs(sizes, n, k)
            out = torch.full((T, n), POISON, device="cuda", dtype=a.dtype)
            cfg = hg.default_config(T, G, n, k, a.device)
            api.grouped_gemm(a, b, offs, out=out)
            api.check_grouped_offs()
            ref = gm.reference(a, b, offs)
            err = rel_err(out, ref, T)
            del ref
            launches = {
                "gemmlab": [lambda: api.grouped_gemm(a, b, offs, out=out)],
                "gemmlab_novalidate": [lambda: api.grouped_gemm(a, b, offs, out=out, validate=False)],
                "torch_grouped_mm": [lambda: torch._grouped_mm(a, b, offs=offs)],
            }
            t = bench.time_interleaved(launches, rounds=rounds, per_round=5, warmup=2)
            kernels = {"gemmlab_kernel": launches["gemmlab_novalidate"],
                       "torch_grouped_mm_kernel": launches["torch_grouped_mm"]}
            tg = bench.time_interleaved(kernels, rounds=rounds, per_round=5, warmup=2, gpu_only=True)
            api.check_grouped_offs()
            flops, nbytes = gm.flops_bytes(sizes, n, k)
            row = {"shape": label, "groups": G, "n": n, "k": k, "tokens": T,
                   "nonempty": sum(1 for x in sizes if x), "max_group": max(sizes), "config": cfg.name,
                   "rel_err": err, "flops": flops, "bytes": nbytes}
            for name, v in list(t.items()) + list(tg.items()):
                row[f"{name}_ms"] = v["median_ms"]
            row["vs_torch"] = row["torch_grouped_mm_ms"] / row["gemmlab_ms"]
            row["vs_torch_novalidate"] = row["torch_grouped_mm_ms"] / row["gemmlab_novalidate_ms"]
            row["vs_torch_kernel"] = row["torch_grouped_mm_kernel_ms"] / row["gemmlab_kernel_ms"]
            rows.append(row)
            print(f"{label:26s} G={G:3d} T={T:5d} {cfg.name:18s} err={err:.1e} ours={row['gemmlab_ms']:.3f} "
                  f"torch={row['torch_grouped_mm_ms']:.3f} x{row['vs_torch']:.2f} nov x{row['vs_torch_novalidate']:.2f} "
                  f"kernel x{row['vs_torch_kernel']:.2f}", flush=True)
            del a, b, offs, out
            torch.cuda.empty_cache()
    summary = mg.summarize_wide(rows)
    _write("grouped_gemm_moe_wide", {"rows": rows, "summary": summary, "clocks": bench.gpu_clocks(),
                                     "models": [list(m) for m in mg.MOE_WIDE_MODELS],
                                     "method": "public calls interleaved with torch._grouped_mm (5 calls a round, "
                                               f"{rounds} rounds, median); kernels alone with gpu_only"}, out_dir)
    print(json.dumps(summary, indent=1))
    return summary


#: What the sweeps may time: Sm90Config fields (one CTA unless ``cluster`` says otherwise), plus ``dynamic`` for
#: tiles handed out from a counter (hg.dynamic_schedule). Each is named by mg.sweep_column, the name
#: its result column carries and the one mg.heuristic_regret looks up.
SWEPT = [
    dict(tile_m=64, tile_n=64, stages=12),
    dict(tile_m=64, tile_n=128, stages=8),
    dict(tile_m=64, tile_n=256, stages=5),
    dict(tile_m=128, tile_n=128, stages=5),
    dict(tile_m=128, tile_n=192, stages=4),
    dict(tile_m=128, tile_n=256, stages=4, epi_stages=2),
    dict(tile_m=128, tile_n=192, stages=4, cluster=(2, 1)),
    dict(tile_m=128, tile_n=256, stages=4, epi_stages=2, cluster=(2, 1)),
    dict(tile_m=64, tile_n=64, stages=12, dynamic=True),
    dict(tile_m=64, tile_n=128, stages=8, dynamic=True),
    dict(tile_m=64, tile_n=192, stages=6, dynamic=True),
    dict(tile_m=64, tile_n=256, stages=5, dynamic=True),
    dict(tile_m=128, tile_n=192, stages=4, dynamic=True),
    dict(tile_m=128, tile_n=256, stages=4, epi_stages=2, dynamic=True),
    dict(tile_m=128, tile_n=192, stages=4, cluster=(2, 1), dynamic=True),
    dict(tile_m=128, tile_n=256, stages=4, epi_stages=2, cluster=(2, 1), dynamic=True),
    # 6 stages fit this kernel's shared memory with dynamic scheduling until it gained its visiting-order tables
    # (233,116 bytes largest first: configs.grouped_smem_bytes); stored sweeps name it "128x128 s6 dyn"
    dict(tile_m=128, tile_n=128, stages=5, dynamic=True),
    dict(tile_m=128, tile_n=128, stages=6, cluster=(2, 1)),
    dict(tile_m=128, tile_n=128, stages=6, cluster=(2, 1), dynamic=True),
]


def swept_config(spec: dict):
    """``(Sm90Config, dynamic)`` of one :data:`SWEPT` entry."""
    from gemmlab.family.configs import Sm90Config
    fields = {key: v for key, v in spec.items() if key != "dynamic"}
    return Sm90Config(**{"cluster": (1, 1), **fields}), spec.get("dynamic", False)


SWEEP_CONFIGS = {mg.sweep_column(*swept_config(spec)): spec for spec in SWEPT}


def sweep(out_dir=None, tokens=TOKENS, groups=(8, 32, 128), shapes=MOE_SHAPES, rounds=3, configs=None,
          doc_name="grouped_gemm_sweep"):
    """Kernel time of every swept configuration on the MoE sets (GPU only): the heuristic's data."""
    unknown = [name for name in configs or () if name not in SWEEP_CONFIGS]
    if unknown:
        raise ValueError(f"configs: {unknown} are not in SWEEP_CONFIGS ({sorted(SWEEP_CONFIGS)})")
    chosen = [name for name in SWEEP_CONFIGS if configs is None or name in configs]
    swept = {name: swept_config(SWEEP_CONFIGS[name]) for name in chosen}
    cfgs = {name: cfg for name, (cfg, _) in swept.items()}
    dyn = {name: d for name, (_, d) in swept.items()}
    rows = []
    for row, sizes, a, b, offs in moe_sets(shapes, groups, tokens):
        label, n, k, G, T = row["shape"], row["n"], row["k"], row["groups"], row["tokens"]
        out = torch.empty((T, n), device="cuda", dtype=a.dtype)
        launches = {}
        for name, cfg in cfgs.items():
            api.grouped_gemm(a, b, offs, out=out, config=cfg, validate=False, dynamic=dyn[name])
            launches[name] = [lambda cfg=cfg, d=dyn[name]: api.grouped_gemm(a, b, offs, out=out, config=cfg,
                                                                               validate=False, dynamic=d)]
        launches["torch"] = [lambda: torch._grouped_mm(a, b, offs=offs)]
        t = bench.time_interleaved(launches, rounds=rounds, per_round=5, warmup=2, gpu_only=True)
        row["chosen"] = hg.default_config(T, G, n, k, a.device).name
        row.update({f"{name}_ms": v["median_ms"] for name, v in t.items()})
        best = min(cfgs, key=lambda c: row[f"{c}_ms"])
        row["best"] = best
        rows.append(row)
        print(f"{label:20s} G={G:3d} T={T:5d} best={best:11s} {row[best + '_ms']:.3f} torch={row['torch_ms']:.3f} "
              + " ".join(f"{c}={row[c + '_ms']:.3f}" for c in cfgs), flush=True)
        del a, b, out
    _write(doc_name, {"rows": rows, "configs": {c: SWEEP_CONFIGS[c] for c in cfgs}}, out_dir)


#: The named sweeps: ``sweep``'s arguments for each.
SWEEP_MODES = {
    # the 128-row tiles with and without 2x1 clusters, every set of many tokens
    "sweep_clusters": dict(tokens=(512, 4096, 16384), groups=GROUPS,
                           configs=("64x128 s8", "128x192 s4", "128x256 s4", "128x192 c2 s4", "128x256 c2 s4"),
                           doc_name="grouped_gemm_sweep_clusters"),
    # static against dynamic tile scheduling, every tile the heuristic may pick
    "sweep_sched": dict(groups=GROUPS,
                        configs=("64x128 s8", "64x128 s8 dyn", "64x256 s5", "64x256 s5 dyn", "128x192 s4",
                                 "128x192 s4 dyn", "128x256 s4 dyn", "128x256 c2 s4"),
                        doc_name="grouped_gemm_sweep_sched"),
    # the 64-row tiles, dynamic, from 64 to 256 wide, on the decode sets
    "sweep_decode": dict(tokens=(64, 512), groups=(32, 64, 128),
                         configs=("64x64 s12 dyn", "64x128 s8 dyn", "64x192 s6 dyn", "64x256 s5 dyn"),
                         doc_name="grouped_gemm_sweep_decode"),
    # 128 x 192, static (largest first) against dynamic (index order below DYNAMIC_LARGEST_FIRST_FROM), where
    # choose_config picks it: fewer than 2048 tokens, 25 to 160 per expert
    "sweep_medium": dict(tokens=(512, 1024, 1536), groups=(8, 16, 32), configs=("128x192 s4", "128x192 s4 dyn"),
                         rounds=5, doc_name="grouped_gemm_sweep_medium"),
    # the two decode tiles on outputs narrower than the benchmark's (hg.DECODE_WIDE_FROM_TILES)
    "sweep_narrow": dict(shapes=[(f"narrow N={n}", n, 4096) for n in (512, 1024, 1536, 2048, 3072)],
                         tokens=(64, 256), groups=(16, 32, 128), configs=("64x128 s8 dyn", "64x256 s5 dyn"),
                         doc_name="grouped_gemm_sweep_narrow"),
    # the widened family's narrow layers (N <= 2048) at decode sizes: many experts, few of them hit
    "sweep_wide_decode": dict(shapes=[(label, n, k) for label, _, n, k in mg.moe_wide_sets() if n <= 2048],
                              tokens=(32, 96), groups=(64, 128),
                              configs=("64x64 s12 dyn", "64x128 s8 dyn", "64x192 s6 dyn"),
                              doc_name="grouped_gemm_sweep_wide_decode"),
    # ... and at prefill sizes, where K or N is small (768 to 2048)
    "sweep_wide_narrow": dict(shapes=[(label, n, k) for label, _, n, k in mg.moe_wide_sets() if min(n, k) <= 1024],
                              tokens=(4096, 16384), groups=(64, 128),
                              configs=("128x128 s5 dyn", "128x192 s4 dyn", "128x256 s4 dyn", "64x256 s5 dyn"),
                              doc_name="grouped_gemm_sweep_wide_narrow"),
    # 2-CTA pairs with dynamic scheduling against the pairs and single CTAs
    "sweep_pairs": dict(tokens=(512, 4096, 16384), groups=GROUPS,
                        configs=("128x192 s4", "128x256 s4 dyn", "128x256 c2 s4", "128x192 c2 s4 dyn",
                                 "128x256 c2 s4 dyn"),
                        doc_name="grouped_gemm_sweep_pairs"),
    # 128 x 128 tiles, the tile one warpgroup of a ping-pong kernel would own, against the 128 x 256 ones on the
    # compute-heavy sets: the same operand bytes per FLOP as ping-pong, but the store still exposed
    "sweep_128x128": dict(tokens=(4096, 16384), groups=GROUPS,
                          configs=("128x256 s4 dyn", "128x256 c2 s4", "128x256 c2 s4 dyn", "128x128 s5",
                                   "128x128 s5 dyn", "128x128 c2 s6", "128x128 c2 s6 dyn"),
                          doc_name="grouped_gemm_sweep_128x128"),
}


def overlap(out_dir=None, tokens=TOKENS, groups=GROUPS, shapes=MOE_SHAPES, rounds=5):
    """The chosen tile on every MoE set with its store between two main loops against under the next one
    (``overlap_store``), kernel time side by side with ``torch._grouped_mm``; each variant's output poisoned
    and checked against the FP32 reference first."""
    rows = []
    for row, sizes, a, b, offs in moe_sets(shapes, groups, tokens):
        label, n, k, G, T = row["shape"], row["n"], row["k"], row["groups"], row["tokens"]
        cfg = hg.default_config(T, G, n, k, a.device)
        ref = gm.reference(a, b, offs)
        out = torch.empty((T, n), device="cuda", dtype=a.dtype)
        for flag in (False, True):
            out.fill_(float("nan"))
            api.grouped_gemm(a, b, offs, out=out, validate=False, overlap_store=flag)
            row[f"rel_err_{'under' if flag else 'between'}"] = rel_err(out, ref, T)
        del ref
        launches = {name: [lambda flag=flag: api.grouped_gemm(a, b, offs, out=out, validate=False,
                                                              overlap_store=flag)]
                    for name, flag in (("between", False), ("under", True))}
        launches["torch"] = [lambda: torch._grouped_mm(a, b, offs=offs)]
        t = bench.time_interleaved(launches, rounds=rounds, per_round=5, warmup=2, gpu_only=True)
        row.update({"config": cfg.name, **{f"{name}_ms": v["median_ms"] for name, v in t.items()}})
        row["under_gain"] = row["between_ms"] / row["under_ms"]
        row["vs_torch_between"] = row["torch_ms"] / row["between_ms"]
        row["vs_torch_under"] = row["torch_ms"] / row["under_ms"]
        rows.append(row)
        err = max(row["rel_err_between"], row["rel_err_under"])
        print(f"{label:20s} G={G:3d} T={T:5d} {cfg.name:18s} err={err:.1e} "
              f"between={row['between_ms']:.3f} under={row['under_ms']:.3f} torch={row['torch_ms']:.3f} "
              f"gain={row['under_gain']:.3f} x{row['vs_torch_between']:.3f}->{row['vs_torch_under']:.3f}", flush=True)
        del a, b, out
    summary = {key: bench.geomean([r[key] for r in rows]) for key in ("under_gain", "vs_torch_between",
                                                                         "vs_torch_under")}
    summary["worst_rel_err"] = max(max(r["rel_err_between"], r["rel_err_under"]) for r in rows)
    for tile in sorted({r["config"].split()[0] for r in rows}):
        gains = [r["under_gain"] for r in rows if r["config"].split()[0] == tile]
        summary[f"under_gain_{tile}"] = {"sets": len(gains), "geomean": bench.geomean(gains),
                                         "min": min(gains), "max": max(gains)}
    _write("grouped_gemm_overlap", {"rows": rows, "summary": summary}, out_dir)
    print(json.dumps(summary, indent=1))


def kernel(out_dir=None, tokens=TOKENS, groups=GROUPS, shapes=MOE_SHAPES, rounds=5):
    """The headline alone: the default kernel against ``torch._grouped_mm``'s, kernel time side by side (GPU-only
    timing, as ``moe``'s second pass) on the 64 MoE sets, each output poisoned and checked against FP32 first; the
    file is rewritten after every set, so a run cut short keeps what it measured."""
    rows = []
    for row, sizes, a, b, offs in moe_sets(shapes, groups, tokens):
        label, n, k, G, T = row["shape"], row["n"], row["k"], row["groups"], row["tokens"]
        cfg = hg.default_config(T, G, n, k, a.device)
        out = torch.empty((T, n), device="cuda", dtype=a.dtype)
        out.fill_(POISON)
        api.grouped_gemm(a, b, offs, out=out, validate=False)
        ref = gm.reference(a, b, offs)
        row["rel_err"] = rel_err(out, ref, T)
        del ref
        launches = {"gemmlab_kernel": [lambda: api.grouped_gemm(a, b, offs, out=out, validate=False)],
                    "torch_grouped_mm_kernel": [lambda: torch._grouped_mm(a, b, offs=offs)]}
        t = bench.time_interleaved(launches, rounds=rounds, per_round=5, warmup=2, gpu_only=True)
        row.update({"config": cfg.name, "mixed": bool(hg.mixed_rows(cfg, T, G)),
                    **{f"{name}_ms": v["median_ms"] for name, v in t.items()}})
        row["vs_torch_kernel"] = row["torch_grouped_mm_kernel_ms"] / row["gemmlab_kernel_ms"]
        rows.append(row)
        print(f"{label:20s} G={G:3d} T={T:5d} {cfg.name:18s} err={row['rel_err']:.1e} "
              f"ours={row['gemmlab_kernel_ms']:.3f} torch={row['torch_grouped_mm_kernel_ms']:.3f} "
              f"x{row['vs_torch_kernel']:.3f}{' mixed' if row['mixed'] else ''}", flush=True)
        del a, b, out
        ratios = [r["vs_torch_kernel"] for r in rows]
        _write("grouped_gemm_kernel", {"rows": rows, "summary": {
            "sets": len(rows), "geomean_vs_torch_kernel": bench.geomean(ratios), "min_vs_torch_kernel": min(ratios),
            "max_rel_err": max(r["rel_err"] for r in rows)}}, out_dir)
    print(f"{len(rows)} sets: kernel time vs torch._grouped_mm, geomean {bench.geomean(ratios):.3f}x, "
          f"lowest {min(ratios):.3f}x")


#: The sets of ``fences``: (label, N, K, experts, tokens); three where every CTA changes group at almost every tile.
FENCE_SETS = (("DeepSeek-V3 gate/up", 4096, 7168, 128, 16384), ("DeepSeek-V3 down", 7168, 2048, 64, 16384),
              ("Mixtral down", 4096, 14336, 128, 16384), ("DeepSeek-V3 gate/up", 4096, 7168, 64, 4096))


def fences(out_dir=None, sets=FENCE_SETS, rounds=5, runs=3):
    """The broken variant (``fences=False``: descriptors published without release or acquire) on MoE sets.

    For each set: both variants' errors against FP32 over ``runs`` launches (outputs poisoned with NaN first),
    both kernel times side by side, and the set's floor at this GPU's measured ceilings (the copy rate: the time
    to read every byte of the set once). A time under that floor means the kernel did not read its inputs.
    """
    ceil = bench.measured_ceilings()
    rows = []
    for label, n, k, G, T in sets:
        sizes = gm.skewed_sizes(T, G)
        a, b, offs = ragged_inputs(sizes, n, k)
        ref = gm.reference(a, b, offs)
        out = torch.empty((T, n), device="cuda", dtype=a.dtype)
        row = {"shape": label, "n": n, "k": k, "groups": G, "tokens": T}
        for name, flag in (("fenced", True), ("unfenced", False)):
            errs = []
            for _ in range(runs):
                out.fill_(POISON)
                api.grouped_gemm(a, b, offs, out=out, validate=False, fences=flag)
                errs.append(rel_err(out, ref, T))
            row[f"rel_err_{name}"] = errs
        del ref
        t = bench.time_interleaved(
            {name: [lambda flag=flag: api.grouped_gemm(a, b, offs, out=out, validate=False, fences=flag)]
             for name, flag in (("fenced", True), ("unfenced", False))},
            rounds=rounds, per_round=5, warmup=2, gpu_only=True)
        flops, nbytes = gm.flops_bytes(sizes, n, k)
        row.update({f"{name}_ms": v["median_ms"] for name, v in t.items()})
        row["measured_floor_ms"] = mg.floor_ms(flops, nbytes, ceil["gemm_tflops"], ceil["copy_tbs"])
        rows.append(row)
        print(f"{label:20s} G={G:3d} T={T:5d} fenced {row['fenced_ms']:.3f} ms (err {max(row['rel_err_fenced']):.1e}), "
              f"unfenced {row['unfenced_ms']:.3f} ms (err {max(row['rel_err_unfenced']):.1e}), "
              f"floor {row['measured_floor_ms']:.3f} ms", flush=True)
        del a, b, out
    _write("grouped_gemm_fences", {"rows": rows, "measured": ceil}, out_dir)


def mixed(out_dir=None, tokens=(4096, 16384), groups=(32, 64, 128), shapes=MOE_SHAPES, rounds=5,
          bursts=(64, 128, 256)):
    """The mixed order (:func:`gemmlab.family.heuristic_grouped.mixed_rows`) in blocks of each of ``bursts`` claims against the kernel
    without it (its order as :func:`gemmlab.family.heuristic_grouped.largest_first` decides), on the sets of
    :data:`gemmlab.family.heuristic_grouped.MIXED_FROM` or more tokens per expert (the data behind :data:`gemmlab.family.heuristic_grouped.MIXED_BURST`);
    every variant's output poisoned and checked against FP32 first."""
    rows = []
    variants = {"unmixed": {"mixed": 0},
                **{f"burst{q}": {"mixed": hg.MIXED_LIGHT_ROWS, "burst": q} for q in bursts}}
    for row, sizes, a, b, offs in moe_sets(shapes, groups, tokens):
        label, n, k, G, T = row["shape"], row["n"], row["k"], row["groups"], row["tokens"]
        cfg = hg.default_config(T, G, n, k, a.device)
        if T < hg.MIXED_FROM * G or cfg != configs.LARGE:
            del a, b, offs
            continue
        ref = gm.reference(a, b, offs)
        out = torch.empty((T, n), device="cuda", dtype=a.dtype)
        for name, kw in variants.items():
            out.fill_(POISON)
            api.grouped_gemm(a, b, offs, out=out, validate=False, **kw)
            row[f"rel_err_{name}"] = rel_err(out, ref, T)
        del ref
        launches = {name: [lambda kw=kw: api.grouped_gemm(a, b, offs, out=out, validate=False, **kw)]
                    for name, kw in variants.items()}
        launches["torch"] = [lambda: torch._grouped_mm(a, b, offs=offs)]
        t = bench.time_interleaved(launches, rounds=rounds, per_round=5, warmup=2, gpu_only=True)
        row.update({"config": cfg.name, **{f"{name}_ms": v["median_ms"] for name, v in t.items()}})
        for name in list(variants)[1:]:
            row[f"{name}_gain"] = row["unmixed_ms"] / row[f"{name}_ms"]
        rows.append(row)
        err = max(row[f"rel_err_{name}"] for name in variants)
        print(f"{label:20s} G={G:3d} T={T:5d} err={err:.1e} unmixed={row['unmixed_ms']:.3f} "
              + " ".join(f"{name}x{row[name + '_gain']:.3f}" for name in list(variants)[1:]), flush=True)
        del a, b, out
    summary = {f"{name}_gain": bench.geomean([r[f"{name}_gain"] for r in rows]) for name in list(variants)[1:]}
    summary["worst_rel_err"] = max(v for r in rows for key, v in r.items() if key.startswith("rel_err_"))
    _write("grouped_gemm_mixed", {"rows": rows, "summary": summary}, out_dir)
    print(json.dumps(summary, indent=1))


#: Decode launches for ``tail``: (N, K, live experts); 4 tokens each, so one 64-row tile per tile width of
#: columns. With the 128-wide tile the live counts straddle whole waves on 132 SMs (56 or 32 tiles per expert).
STREAM_MIB = (128, 256, 512, 1024, 2048)  # the streaming reads' sizes
TAIL_FAMILIES = ((7168, 2048, (1, 2, 3, 4, 6, 8, 12, 16, 20, 24, 28, 32, 33, 34, 35, 36, 40)),
                 (4096, 7168, (1, 2, 4, 8, 12, 16, 17, 20, 24, 32, 33, 34, 36, 40, 48, 56, 64)))


def tail(out_dir=None, rounds=5):
    """What a decode launch costs beyond its weight bytes (GPU only): time against live experts.

    Each family is one weight shape with 1 to 40 or 64 live experts of 4 tokens (this GPU's decode tile as the
    library runs it, :func:`gemmlab.family.heuristic_grouped.decode_tile`; kernel time back to back, ``torch._grouped_mm``
    beside it). :func:`gemmlab.measure.grouped.fit_launch_cost` fits a line:
    the slope is the rate the weights stream at, the intercept the fixed cost of a launch. A streaming read
    of 2 GiB (``torch.sum``) in the same run gives the practical ceiling of the memory.
    """
    sms = hardware.sm_count()
    cfg = hg.decode_tile(torch.device("cuda"))
    x = torch.ones(1 << 30, dtype=torch.bfloat16, device="cuda")  # 2 GiB
    # The read's own fixed cost: torch.sum over 128 MiB to 2 GiB, a line through (bytes, us) like the launches'.
    reads = [x[:(mib << 20) // 2] for mib in STREAM_MIB]
    t = bench.time_interleaved({mib: [lambda v=v: v.sum()] for mib, v in zip(STREAM_MIB, reads)},
                               rounds=rounds, per_round=5, warmup=2, gpu_only=True)
    points = [(mib << 20, t[mib]["median_ms"] * 1e3) for mib in STREAM_MIB]
    stream_tbs = points[-1][0] / (points[-1][1] * 1e-6) / 1e12
    fixed, slope = bench.line_fit(points)
    stream_fit = {"fixed_us": fixed, "tbs": 1 / (slope * 1e-6) / 1e12, "points": points}
    del x, reads
    print(f"streaming read (torch.sum over 2 GiB): {stream_tbs:.2f} TB/s; over 128 MiB-2 GiB: fixed "
          f"{fixed:.1f} us, {stream_fit['tbs']:.2f} TB/s", flush=True)
    rows, fits = [], []
    for n, k, lives in TAIL_FAMILIES:
        G = max(lives)
        b = torch.randn(G, n, k, device="cuda", dtype=torch.bfloat16).transpose(1, 2)  # as nn.Linear stores them
        a = torch.randn(4 * G, k, device="cuda", dtype=torch.bfloat16)
        out = torch.empty((4 * G, n), device="cuda", dtype=torch.bfloat16)
        fam = []
        for live in lives:
            sizes = [4] * live + [0] * (G - live)
            offs = gm.offsets_of(sizes)
            ours = [lambda: api.grouped_gemm(a, b, offs, out=out, validate=False, config=cfg)]
            ours[0]()
            tt = bench.time_interleaved({"ours": ours, "torch": [lambda: torch._grouped_mm(a, b, offs=offs)]},
                                        rounds=rounds, per_round=10, warmup=2, gpu_only=True)
            tiles = live * -(-n // cfg.tile_n)
            r = {"n": n, "k": k, "live": live, "tiles": tiles, "waves": tiles / sms, "bytes_per_expert": n * k * 2,
                 "us": tt["ours"]["median_ms"] * 1e3, "torch_us": tt["torch"]["median_ms"] * 1e3}
            r["tbs"] = live * r["bytes_per_expert"] / (r["us"] * 1e-6) / 1e12
            fam.append(r)
            print(f"N={n} K={k} live={live:3d} tiles={tiles:5d} waves={r['waves']:6.2f} ours={r['us']:8.1f} us "
                  f"({r['tbs']:.2f} TB/s) torch={r['torch_us']:8.1f} us", flush=True)
        fit = {"n": n, "k": k, **mg.fit_launch_cost(fam)}
        fit["torch"] = mg.fit_launch_cost([{**r, "us": r["torch_us"]} for r in fam])
        print(f"N={n} K={k}: fixed {fit['fixed_us']:.1f} us per launch, weights at {fit['tbs']:.2f} TB/s "
              f"(torch._grouped_mm: {fit['torch']['fixed_us']:.1f} us, {fit['torch']['tbs']:.2f} TB/s)", flush=True)
        rows += fam
        fits.append(fit)
        del a, b, out
        torch.cuda.empty_cache()
    _write("grouped_gemm_tail", {"rows": rows, "fits": fits, "stream_read_tbs": stream_tbs,
                                 "stream_read_fit": stream_fit, "sms": sms,
                                 "config": cfg.name, "dynamic": hg.dynamic_schedule(cfg)}, out_dir)


#: ``order``: the token counts around hg.DYNAMIC_LARGEST_FIRST_FROM, with the experts for which
#: choose_config picks one CTA per 128 x 256 tile (dynamic scheduling) at all of them.
ORDER_TOKENS = (4096, 6144, 8192, 12288, 16384)
ORDER_GROUPS = (32, 64, 128)


def order(out_dir=None, tokens=ORDER_TOKENS, groups=ORDER_GROUPS, shapes=MOE_SHAPES, rounds=5):
    """Largest first against index order with dynamic scheduling (GPU only): the data behind
    ``hg.DYNAMIC_LARGEST_FIRST_FROM``. ``index_over_largest``: index order's kernel time over largest
    first's (above 1: largest first is faster)."""
    rows = []
    for row, sizes, a, b, offs in moe_sets(shapes, groups, tokens):
        label, n, k, G, T = row["shape"], row["n"], row["k"], row["groups"], row["tokens"]
        cfg = hg.default_config(T, G, n, k, a.device)
        if cfg.tile_m != 128 or not hg.dynamic_schedule(cfg):
            raise RuntimeError(f"order: {label} G={G} T={T} runs {cfg.name}, not one CTA per 128-row tile")
        out = torch.empty((T, n), device="cuda", dtype=a.dtype)
        launches = {lf: [lambda lf=lf: api.grouped_gemm(a, b, offs, out=out, validate=False, by_size=lf)]
                    for lf in (True, False)}
        for fn in launches.values():
            fn[0]()
        t = bench.time_interleaved(launches, rounds=rounds, per_round=5, warmup=2, gpu_only=True)
        row.update({"config": cfg.name, "largest_first_ms": t[True]["median_ms"],
                    "index_order_ms": t[False]["median_ms"]})
        row["index_over_largest"] = row["index_order_ms"] / row["largest_first_ms"]
        rows.append(row)
        print(f"{label:20s} G={G:3d} T={T:5d} largest first={row['largest_first_ms']:.3f} "
              f"index={row['index_order_ms']:.3f} x{row['index_over_largest']:.3f}", flush=True)
        del a, b, out
    summary = mg.order_by_tokens(rows)
    for T, v in summary.items():
        print(f"T={T:5d}: index/largest-first geomean {v['geomean']:.3f} ({v['largest_first_wins']} of {v['sets']} "
              f"sets faster largest first)")
    _write("grouped_gemm_order", {"rows": rows, "summary": {str(T): v for T, v in summary.items()}}, out_dir)


def _write(name, doc, out_dir):
    return bench.write_doc(name, doc, out_dir)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("what", choices=("check", "moe", "moe_wide", "quick", "sweep", *SWEEP_MODES, "tail", "order",
                                    "overlap", "fences", "mixed", "kernel", "all"))
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    ok = True
    if args.what in ("check", "all"):
        ok = check(args.out)
    if args.what == "quick":
        moe(args.out, tokens=(64, 4096), groups=(8, 128), shapes=MOE_SHAPES[:2], rounds=3)
    if args.what == "sweep":
        sweep(args.out)
    if args.what in SWEEP_MODES:
        sweep(args.out, **SWEEP_MODES[args.what])
    if args.what == "tail":  # decode launches of 1 to 64 experts: fixed cost per launch, the last wave
        tail(args.out)
    if args.what == "order":  # largest first against index order around DYNAMIC_LARGEST_FIRST_FROM
        order(args.out)
    if args.what == "overlap":  # the store between main loops against under the next one
        overlap(args.out)
    if args.what == "fences":  # the unfenced variant: its errors, and its time against the set's floor
        fences(args.out)
    if args.what == "kernel":  # the headline alone: kernel time against torch._grouped_mm on the 64 sets
        kernel(args.out)
    if args.what == "mixed":  # the light experts' tiles claimed among the heavy ones', in blocks
        mixed(args.out)
    if args.what in ("moe", "all"):
        moe(args.out)
    if args.what in ("moe_wide", "all"):
        moe_wide(args.out)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
