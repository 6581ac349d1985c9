"""Chapter 11 probe: how much of the A16 and decode twins' time is the FP4 -> FP16 conversion's arithmetic?

Each variant runs in its own process (the patch applies before the first compile), on one warm GPU:

    python benchmarks/conversion_probe.py base          # the kernels as they are
    python benchmarks/conversion_probe.py xconv         # A16: the converter stores the packed words unconverted;
                                                        # decode: the token converter does the same
    python benchmarks/conversion_probe.py wconv         # decode: the MMA warps move packed words into the fragments
    python benchmarks/conversion_probe.py xconv_wconv   # both

The patched variants compute wrong results (no check is made): they keep every load, store, barrier and WGMMA and
drop only the conversion's arithmetic, so the time they save is what that arithmetic costs. Kernels alone (the public
plan's prepared launch, ``gpu_only``), three input sets, the medians of 5 rounds of 5 launches.
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))

import cutlass  # noqa: E402
import cutlass.cute as cute  # noqa: E402
from cutlass import Int32  # noqa: E402

import gemmlab.kernels.dual_gemm_sm90_a16 as a16_mod  # noqa: E402
import gemmlab.kernels.dual_gemm_sm90_decode as decode_mod  # noqa: E402
from gemmlab import nvfp4 as fp4  # noqa: E402
from gemmlab.family.configs import A16Config, DecodeConfig  # noqa: E402
from gemmlab.ldst import st_shared_v4  # noqa: E402

#: (M, N, K, configuration): the public call's A16 and decode choices on an H100 before the swap twin.
CASES = [
    (512, 4096, 7168, A16Config(128, 5)),
    (1024, 4096, 7168, A16Config(128, 5)),
    (256, 4096, 7168, A16Config(64, 7, converters=2)),
    (512, 3072, 7168, A16Config(96, 7, converters=2)),
    (128, 4096, 7168, DecodeConfig(128, 1, 2, 4)),
    (64, 4096, 7168, DecodeConfig(64, 1, 2, 6)),
    (96, 4096, 7168, DecodeConfig(96, 2, 4, 3)),
]


@cute.jit
def raw_unit(dst_row, loaded, unit: Int32):
    """:func:`~gemmlab.kernels.dual_gemm_sm90_pipelined.convert_unit`'s stores, of the packed words themselves."""
    row = unit // 4
    q = unit % 4
    x0, x1, sw = loaded
    r8 = row % 8
    st_shared_v4(dst_row + ((2 * q) ^ r8) * 16, x0, x1, sw, x0)
    st_shared_v4(dst_row + ((2 * q + 1) ^ r8) * 16, x1, x0, sw, x1)


@cute.jit
def raw_fragment(frag, loaded, selector, half: cutlass.Constexpr):
    """:func:`~gemmlab.kernels.dual_gemm_sm90_pipelined.convert_a`'s fragment words, the packed words themselves."""
    for j in cutlass.range_constexpr(8):
        frag[half + 2 * (j % 2) + 4 * (j // 2)] = loaded[j] ^ selector


def main(variant: str) -> None:
    import torch

    from gemmlab.family.plan import prepare_gated
    from gemmlab.measure import bench

    if variant not in ("base", "xconv", "wconv", "xconv_wconv"):
        sys.exit(f"usage: conversion_probe.py base | xconv | wconv | xconv_wconv; got {variant!r}")
    if "xconv" in variant:
        a16_mod.convert_unit = raw_unit
        decode_mod.convert_unit = raw_unit
    if "wconv" in variant:
        decode_mod.convert_a = raw_fragment
    launches = {}
    for m, n, k, cfg in CASES:
        if variant == "wconv" and not isinstance(cfg, DecodeConfig):
            continue
        sets = [fp4.generate(m, n, k, seed=s, device="cuda") for s in range(3)]
        launches[f"{m}x{n}x{k} {cfg!r}"] = [prepare_gated(*s.inputs(), out=s.c, config=cfg) for s in sets]
    t = bench.time_interleaved(launches, rounds=5, per_round=5, warmup=2, gpu_only=True)
    for name, v in t.items():
        print(f"{variant:12s} {v['median_ms'] * 1e3:8.1f} us  {name}", flush=True)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "base")
