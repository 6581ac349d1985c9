"""Chapter 07: on the first call of a new problem, time the model's few best configurations and keep the fastest.

The time model of :mod:`gemmlab.family.heuristic_sm90` ranks every variant; timed against forced
configurations on the weakest shapes left on an H100 (2026-11-27, ``benchmarks/gemm_family.py sweep``), its
first choice was within 1 % of the fastest timed variant on most shapes, but 3 to 4 % slower on average on
the weakest twenty and up to 14 % slower on one (512 x 2112 x 7168). Where the model cannot tell its best few
apart, a measurement might: with ``GEMMLAB_TUNE`` set above 1, the first :func:`gemmlab.gemm` (or
``plan.prepare``) of a problem on a Hopper GPU times the ``top`` distinct configurations the model ranks first, on
the caller's tensors, and the plan keeps the fastest for the rest of the process. It costs what compiling those
variants costs (0.5 to 1.3 s each on the H100/H200 machines, once per configuration and layout; later problems
that share a variant share its compile) plus a few milliseconds of launches.

Each candidate is launched ``WARMUP`` times, then timed ``REPS`` times, each launch alone between CUDA events,
after overwriting a buffer twice the size of the L2 so that the operands come from HBM as they do in a model's
forward pass; the median counts. The fastest wins; one within :data:`TIE` of the model's earlier choice loses to
it (timing noise should not overturn the model). So a tuned choice can differ between processes where two
variants run within a few per cent of each other; every variant computes the same products in the same K order
(split-K adds its slices in a fixed order), but a split variant rounds its FP32 sum differently from an unsplit
one.

``GEMMLAB_TUNE`` (environment) sets ``top``: ``1`` (the default, :data:`DEFAULT_TOP`) turns timing off and plans
take the model's choice; ``4`` times its best four. :func:`choices` shows what was timed.

It is off by default because it did not pay as measured (H100, 2026-11-27, ``GEMMLAB_TUNE=4``, both families;
``results/nvidia-h100-80gb-hbm3/gemm_family_tuned.json``, ``..._wide_tuned.json``, ``..._tune_choices.json``). The
tuner changed the choice on 24 of the 78 family problems and 19 of the 70 wide ones, by its own timings 1.4 % and
1.2 % faster on average (up to 12 %). But the benchmark, which times back-to-back launches on inputs rotated over
four times the L2, saw the call's geometric mean against torch go from 1.032 to 1.026 (family) and stay at 0.978
(wide); fewer shapes fell below 0.90 (5 against 7, 7 against 10), and the worst got worse: 384 x 4096 x 4096 on
128 x 96 tiles ran at 0.766 where the model's 128 x 112 had run at 0.845. A launch timed alone after an L2 flush
(whose dirty lines the kernel then writes back) ranks close variants differently from a stream of launches. The
first call of a new problem took 2.85 s instead of 0.78 (777 x 1608 x 1112, three more compiles).
"""
from __future__ import annotations

import os

from ..checks import check_int

#: Candidates timed on a problem's first call unless ``GEMMLAB_TUNE`` says otherwise (1: none, the model's choice).
DEFAULT_TOP = 1
#: Launches before timing (the first compiles), and timed launches per candidate.
WARMUP, REPS = 2, 7
#: A candidate must beat an earlier-ranked one by more than this fraction to displace it.
TIE = 0.01
ENV = "GEMMLAB_TUNE"

#: What the tuner measured: ``{(problem, device): [(config, median us), ...]}`` in the model's order.
_CHOICES: dict = {}
_FLUSH: dict = {}


def tune_top() -> int:
    """How many of the model's best configurations a new problem's first call times (``GEMMLAB_TUNE``; 1 = off)."""
    raw = os.environ.get(ENV)
    if raw is None or raw.strip() == "":
        return DEFAULT_TOP
    try:
        top = int(raw.strip())
    except ValueError:
        raise ValueError(f"{ENV} must be a whole number >= 1 (1: no timing, the model's choice); got {raw!r}") from None
    return check_int(ENV, top, lo=1, hi=16)


def shortlist(candidates, top: int) -> list:
    """The first ``top`` distinct configurations of ``candidates`` (the model's ranking: objects with ``.config``
    or configurations themselves), in that order."""
    top = check_int("top", top, lo=1)
    out = []
    for c in candidates:
        cfg = getattr(c, "config", c)
        if cfg not in out:
            out.append(cfg)
        if len(out) == top:
            break
    return out


def pick_fastest(timed) -> object:
    """The configuration of ``timed`` (``[(config, microseconds), ...]`` in the model's order) that runs fastest; one
    that beats an earlier one by no more than :data:`TIE` does not displace it."""
    if not timed:
        raise ValueError("timed must hold at least one (config, microseconds) pair")
    best_cfg, best_us = timed[0]
    for cfg, us in timed[1:]:
        if us < best_us * (1 - TIE):
            best_cfg, best_us = cfg, us
    return best_cfg


def choose_by_timing(key, configs, time_us) -> object:
    """The fastest of ``configs`` by ``time_us(config)`` (:func:`pick_fastest`), measured once per ``key`` and kept
    (:func:`choices`). One configuration needs no timing."""
    if key in _CHOICES:
        return pick_fastest(_CHOICES[key])
    if len(configs) == 1:
        return configs[0]
    timed = [(cfg, time_us(cfg)) for cfg in configs]
    _CHOICES[key] = timed
    return pick_fastest(timed)


def choices() -> dict:
    """Every problem the tuner timed in this process: ``{(problem, device): [(config, us), ...]}`` (``device``: the
    operands' torch device)."""
    return dict(_CHOICES)


def time_launch(launch, device) -> float:
    """Median microseconds of ``launch()`` (:data:`WARMUP` untimed launches first), each timed alone between CUDA
    events on the current stream after the L2 was overwritten."""
    import torch

    from ..hardware import _device_index

    index = _device_index(device)
    flush = _FLUSH.get(index)
    if flush is None:
        l2 = torch.cuda.get_device_properties(index).L2_cache_size
        flush = _FLUSH[index] = torch.empty(2 * l2, dtype=torch.uint8, device=torch.device("cuda", index))
    for _ in range(WARMUP):
        launch()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(REPS)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(REPS)]
    for s, e in zip(starts, ends):
        flush.zero_()
        s.record()
        launch()
        e.record()
    torch.cuda.synchronize(index)
    times = sorted(s.elapsed_time(e) * 1e3 for s, e in zip(starts, ends))
    return times[len(times) // 2]
