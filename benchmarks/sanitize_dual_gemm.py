"""Small NVFP4 dual GEMMs for compute-sanitizer (memcheck, racecheck): the Hopper twins, every tile width, and the
decode twin with one and two MMA warpgroups and split-K over clusters of 1, 2 and 4 CTAs (``decode``: those alone), and
the A16 twin at every tile width (``a16``: those alone; ``a16 two``: only its forms with two converter warpgroups;
``a16 cluster``: only its cluster forms, two CTAs sharing the converted B through distributed shared memory), and the
W16 route (``w16``: its three kernels, the gated GEMM in each cluster shape and tile height), and the swap twin
(``swap``: one and two MMA warpgroups, split-K over clusters of 1, 2 and 4 CTAs, several token tiles).

    compute-sanitizer --tool racecheck python benchmarks/sanitize_dual_gemm.py [decode | a16 [two | cluster] | w16 | swap]

Partial tiles in M and N, several k-blocks (so the TMA ring wraps and every FP16 buffer is reused).
Prints the check against the FP32 reference per launch; the sanitizer's summary comes after.
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))

import torch  # noqa: E402

from gemmlab.kernels import dual_gemm_sm90 as simple  # noqa: E402
from gemmlab.kernels import dual_gemm_sm90_pipelined as fast  # noqa: E402
from gemmlab import nvfp4 as fp4  # noqa: E402
from gemmlab.family.configs import PIPELINED_TILE_NS, DecodeConfig, PipelinedConfig  # noqa: E402
from gemmlab.kernels import dual_gemm_sm90_decode as decode  # noqa: E402


def a16(only: str | None = None):
    """The A16 twin, every tile width (``only``: "two", the two-converter forms alone; "cluster", the cluster forms
    alone): partial tiles in M and N, 6 k-blocks (its rings wrap). The cluster forms run M = 200 (the second CTA of
    the cluster partly past M) and 300 (3 tiles in 2 clusters: the last CTA wholly past M)."""
    from gemmlab.family.configs import A16_CLUSTER_TILE_NS, A16_TILE_NS, A16Config, a16_max_stages
    from gemmlab.kernels import dual_gemm_sm90_a16

    forms = [("one", 200, A16Config(tile_n, a16_max_stages(tile_n))) for tile_n in A16_TILE_NS]
    # two converter warpgroups at 64 and 96
    forms += [("two", 200, A16Config(tile_n, a16_max_stages(tile_n), converters=2)) for tile_n in (64, 96)]
    forms += [("cluster", m, A16Config(tile_n, a16_max_stages(tile_n, 2), cluster_m=2))
              for tile_n in A16_CLUSTER_TILE_NS for m in (200, 300)]
    for kind, m, cfg in forms:
        if only is not None and kind != only:
            continue
        ops = fp4.generate(m, 136, 1536, seed=cfg.tile_n, device="cuda")
        dual_gemm_sm90_a16.gated_dual_gemm_a16(*ops.inputs(), out=ops.c, cfg=cfg)
        print(f"a16 M={m} {cfg}: {fp4.check_close(ops.c, fp4.reference(*ops.inputs()))}", flush=True)
    torch.cuda.synchronize()


def w16():
    """The W16 route: the A pre-pass, the weight pass and the gated GEMM (clusters 1x1, 2x1, 1x2; 64-, 128- and
    192-row tiles): M = 200 and 300 (partial row tiles), N = 192 (3 output tiles of 64 at tile_n 128: the last 1x2
    cluster's second CTA wholly past N), K = 1536, 24 k-blocks of 64 (the ring wraps)."""
    from gemmlab.family.configs import Sm90Config, W16Config
    from gemmlab.kernels import dual_gemm_sm90_w16

    def gated(**kw):
        return W16Config(Sm90Config(dtype="float16", out_dtype="float16", gated=True, **kw))

    forms = [(200, gated(tile_m=128, tile_n=128, stages=4, cluster=(2, 1))),
             (300, gated(tile_m=128, tile_n=128, stages=4, cluster=(1, 2))),
             (300, gated(tile_m=64, tile_n=64, stages=6, cluster=(1, 1), epi_n=16)),
             (200, gated(tile_m=192, tile_n=128, stages=3, cluster=(1, 1), epi_stages=2))]
    for m, cfg in forms:
        ops = fp4.generate(m, 192, 1536, seed=m, device="cuda")
        dual_gemm_sm90_w16.gated_dual_gemm_w16(*ops.inputs(), out=ops.c, cfg=cfg)
        print(f"w16 M={m} {cfg.gemm.name}: {fp4.check_close(ops.c, fp4.reference(*ops.inputs()))}", flush=True)
    torch.cuda.synchronize()


def swap():
    """The swap twin: M over one to three token tiles (the last partial; at M = 64 the tile overhangs M), N not a
    multiple of the row block, 8 k-blocks (the ring wraps: 8 / split k-blocks a CTA over 2 to 4 stages), every split
    and both warpgroup counts."""
    from gemmlab.family.configs import SwapConfig, swap_max_stages
    from gemmlab.kernels import dual_gemm_sm90_swap

    for m, (tokens, wgs, split) in ((200, (128, 2, 1)), (200, (112, 1, 2)), (300, (128, 2, 2)), (100, (64, 1, 4)),
                                    (1, (32, 2, 4)), (64, (128, 2, 1))):
        cfg = SwapConfig(tokens, wgs, split, swap_max_stages(tokens, wgs))
        ops = fp4.generate(m, 136, 2048, seed=m, device="cuda")
        dual_gemm_sm90_swap.gated_dual_gemm_swap(*ops.inputs(), out=ops.c, cfg=cfg)
        print(f"swap M={m} {cfg}: {fp4.check_close(ops.c, fp4.reference(*ops.inputs()))}", flush=True)
    torch.cuda.synchronize()


def main():
    if sys.argv[1:] == ["w16"]:
        return w16()
    if sys.argv[1:] == ["swap"]:
        return swap()
    if sys.argv[1:2] == ["a16"]:
        if sys.argv[2:] not in ([], ["two"], ["cluster"]):
            sys.exit(f"usage: sanitize_dual_gemm.py [decode | a16 [two | cluster] | w16 | swap]; got "
                     f"{' '.join(sys.argv[1:])!r}")
        return a16(only=sys.argv[2] if sys.argv[2:] else None)
    # the decode twin: M not a multiple of 16, N not a multiple of the row block, 8 k-blocks (the ring wraps)
    for m, cfg in ((40, DecodeConfig(48, 2, 1, 4)), (40, DecodeConfig(48, 2, 2, 4)), (40, DecodeConfig(48, 2, 4, 4)),
                   (100, DecodeConfig(112, 1, 4, 4)), (1, DecodeConfig(16, 2, 4, 5))):
        ops = fp4.generate(m, 136, 2048, seed=m, device="cuda")
        decode.gated_dual_gemm_decode(*ops.inputs(), out=ops.c, cfg=cfg)
        print(f"decode M={m} {cfg}: {fp4.check_close(ops.c, fp4.reference(*ops.inputs()))}", flush=True)
    if sys.argv[1:] == ["decode"]:
        torch.cuda.synchronize()
        return
    shape = (200, 136, 1536)  # 2 x 3..5 tiles, 6 k-blocks: the 4-stage ring wraps
    for split in (True, False):
        for tile_n in PIPELINED_TILE_NS:
            ops = fp4.generate(*shape, seed=tile_n, device="cuda")
            cfg = PipelinedConfig(tile_n=tile_n, split=split)
            fast.gated_dual_gemm_pipelined(*ops.inputs(), out=ops.c, cfg=cfg)
            res = fp4.check_close(ops.c, fp4.reference(*ops.inputs()))
            print(f"pipelined tile_n={tile_n} split={split}: {res}", flush=True)
    ops = fp4.generate(*shape, seed=1, device="cuda")
    simple.gated_dual_gemm_sm90(*ops.inputs(), out=ops.c)
    print(f"simple: {fp4.check_close(ops.c, fp4.reference(*ops.inputs()))}", flush=True)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
