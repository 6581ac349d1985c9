"""Small grouped GEMMs for compute-sanitizer (memcheck, racecheck): every tile, both forms, both schedulings,
both places of the store, the mixed order.

    compute-sanitizer --tool memcheck python benchmarks/sanitize_grouped.py [mixed | bad]

``bad``: only the calls with a bad ``offs`` (decreasing, past the rows): the kernel clamps it, so nothing is read
or written outside ``a`` and ``out``, and reports it through host memory (:func:`gemmlab.check_grouped_offs`).
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))

import torch  # noqa: E402

from gemmlab.family import api, configs, heuristic_grouped as hg  # noqa: E402
from gemmlab import grouped_model as gm  # noqa: E402


def main():
    gen = torch.Generator(device="cuda").manual_seed(0)
    # (tile, dynamic, visiting order: None for the default of so few tokens, True for largest first, the store
    # under the next main loop: None for the default of so few tokens per expert, True to force it)
    runs = [(cfg, dyn, None, None) for cfg in (configs.SMALL, configs.SMALL_WIDE, configs.MEDIUM, configs.LARGE)
            for dyn in (False, True)] + [(cfg, dyn, None, None) for cfg in (configs.MEDIUM_C2, configs.LARGE_C2)
                                         for dyn in (False, True)]
    runs.append((configs.LARGE, True, True, None))  # dynamic and largest first: the default from 8192 tokens
    runs += [(cfg, dyn, None, True) for cfg, dyn in ((configs.SMALL, True), (configs.LARGE, False),
                                                     (configs.LARGE, True), (configs.LARGE_C2, False))]
    runs = [r + ({},) for r in runs]
    # the mixed order (light experts' tiles claimed among the heavy ones'), in one block and in blocks of 5
    runs += [(configs.LARGE, True, None, True, {"mixed": 128, "burst": q}) for q in (None, 5)]
    if sys.argv[1:] == ["mixed"]:  # only the mixed order
        runs = [r for r in runs if r[4]]
    if sys.argv[1:] == ["bad"]:  # only the bad offs
        runs = []
    if sys.argv[1:] != ["mixed"]:
        bad_offs(gen)
    for cfg, dyn, by_size, overlap, extra in runs:
        sizes = [0, 70, 3, 0, 200, 1] if not extra else [0, 700, 3, 0, 200, 1, 90, 40]
        n, k = 264, 200
        a = torch.randn(sum(sizes), k, device="cuda", dtype=torch.bfloat16, generator=gen)
        b = torch.randn(len(sizes), n, k, device="cuda", dtype=torch.bfloat16, generator=gen).transpose(1, 2)
        offs = gm.offsets_of(sizes)
        out = api.grouped_gemm(a, b, offs, config=cfg, dynamic=dyn, by_size=by_size, overlap_store=overlap,
                               **extra)
        ref = gm.reference(a, b, offs)
        order = ", largest first" if by_size else ""
        store = ", store under the next main loop" if overlap else ""
        mix = f", mixed in blocks of {extra['burst'] or hg.MIXED_BURST}" if extra else ""
        print(f"ragged {cfg.name} {'dynamic' if dyn else 'static'}{order}{store}{mix}: rel. Frobenius error "
              f"{((out.float() - ref).norm() / ref.norm()).item():.2e}")
    # 40 groups, most of them empty: from 32 groups each tile's group is found by bisection in a shared-memory
    # prefix of the groups' tiles (kernels.grouped_sm90.tile_prefix), here in both visiting orders and both forms
    # of scheduling, in pairs and in the mixed order; then a bad offs over as many groups.
    many = [0] * 7 + [16] + [0] * 12 + [700] + [0] * 9 + [10] + [0] * 4 + [90, 0, 0, 40, 3]
    many_runs = [(configs.SMALL, True, None, {}), (configs.SMALL_WIDE, True, None, {}),
                 (configs.LARGE, True, True, {}), (configs.LARGE, False, None, {}), (configs.LARGE_C2, False, None, {}),
                 (configs.LARGE, True, None, {"mixed": 128, "burst": 5})]
    if sys.argv[1:] == ["bad"]:
        many_runs = []
    if sys.argv[1:] == ["mixed"]:
        many_runs = [r for r in many_runs if r[3]]
    for cfg, dyn, by_size, extra in many_runs:
        n, k = 264, 200
        a = torch.randn(sum(many), k, device="cuda", dtype=torch.bfloat16, generator=gen)
        b = torch.randn(len(many), n, k, device="cuda", dtype=torch.bfloat16, generator=gen).transpose(1, 2)
        offs = gm.offsets_of(many)
        out = api.grouped_gemm(a, b, offs, config=cfg, dynamic=dyn, by_size=by_size, **extra)
        ref = gm.reference(a, b, offs)
        print(f"ragged, {len(many)} groups, {cfg.name} {'dynamic' if dyn else 'static'}"
              f"{', largest first' if by_size else ''}{', mixed in blocks of 5' if extra else ''}: "
              f"rel. Frobenius error {((out.float() - ref).norm() / ref.norm()).item():.2e}")
    if sys.argv[1:] != ["mixed"]:
        bad = torch.tensor(many, dtype=torch.int32).cumsum(0).to(torch.int32)
        bad[25] = 5  # decreasing at group 25
        for cfg, dyn in ((configs.SMALL, True), (configs.LARGE, False)):
            a = torch.randn(sum(many), 200, device="cuda", dtype=torch.bfloat16, generator=gen)
            b = torch.randn(len(many), 264, 200, device="cuda", dtype=torch.bfloat16, generator=gen).transpose(1, 2)
            api.grouped_gemm(a, b, bad.cuda(), config=cfg, dynamic=dyn)
            try:
                api.check_grouped_offs()
                print(f"bad offs, {len(many)} groups, {cfg.name}: NOT reported")
            except ValueError as e:
                print(f"bad offs, {len(many)} groups, {cfg.name}: reported: {str(e).split('(')[1].split(')')[0]}")
    pairs = [(torch.randn(m, kk, device="cuda", dtype=torch.bfloat16, generator=gen),
              torch.randn(kk, nn, device="cuda", dtype=torch.bfloat16, generator=gen))
             for m, nn, kk in [(130, 136, 64), (0, 64, 64), (7, 256, 128)]]
    outs = api.grouped_gemm_list(pairs)
    errs = [((c.float() - x.float() @ w.float()).norm() / (x.float() @ w.float()).norm()).item()
            for (x, w), c in zip(pairs, outs) if x.shape[0]]
    print(f"list form: rel. Frobenius error {max(errs):.2e}")
    torch.cuda.synchronize()


def bad_offs(gen):
    """Bad offs on every tile, static and dynamic: the kernel's own check reports each, nothing faults."""
    sizes, n, k = [0, 70, 3, 0, 200, 1], 264, 200
    a = torch.randn(sum(sizes), k, device="cuda", dtype=torch.bfloat16, generator=gen)
    b = torch.randn(len(sizes), n, k, device="cuda", dtype=torch.bfloat16, generator=gen).transpose(1, 2)
    out = torch.empty(sum(sizes), n, device="cuda", dtype=torch.bfloat16)
    bad = {"decreasing": [0, 70, 3, 3, 273, 274], "past the rows": [0, 70, 73, 73, 5000, 6000],
           "negative": [-8, 70, 73, 73, 273, 274]}
    for cfg in (configs.SMALL, configs.MEDIUM, configs.LARGE, configs.LARGE_C2):
        for dyn in (False, True):
            for what, offs in bad.items():
                api.grouped_gemm(a, b, torch.tensor(offs, dtype=torch.int32, device="cuda"), out, config=cfg,
                                 dynamic=dyn)
                try:
                    api.check_grouped_offs()
                    print(f"bad offs ({what}) {cfg.name} {'dynamic' if dyn else 'static'}: NOT reported")
                except ValueError as e:
                    print(f"bad offs ({what}) {cfg.name} {'dynamic' if dyn else 'static'}: reported: "
                          f"{str(e).split('(')[1].split(')')[0]}")


if __name__ == "__main__":
    main()
