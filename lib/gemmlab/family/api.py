"""The family's public calls, thin: a dictionary lookup keyed on the call signature, then the plan's launch.

* :func:`gemm` ``(a, b, out=None)``: ``a @ b`` with torch's meaning (chapter 07's kernel on Hopper, chapter 10's
  on Blackwell: it ran on the course's emulator, never on a B200).
* :func:`grouped_gemm` ``(a, b, offs, out=None)``: ``torch._grouped_mm``'s ragged MoE meaning, and
  :func:`grouped_gemm_list` ``(pairs, outs=None)``: independent problems in one launch (chapter 08, Hopper).
* :func:`gated_dual_gemm` ``(a, b1, b2, sfa, sfb1, sfb2, out=None)``: ``silu(A B1^T) * (A B2^T)`` from NVFP4
  operands (chapter 11: the fast Hopper twin, or the SM100 kernel on Blackwell).

The rules of each call are its contract's (:mod:`gemmlab.family.problem`). The call path is built to cost
no more host time than torch's own call: one dictionary lookup keyed on what a plan depends on (shapes,
strides, dtypes, devices, the options), the per-call checks no signature can vouch for (where the tensors start:
16-byte alignment, and an output sharing no byte with an input; the grouped call's ``offs`` is checked by its
kernel, on the GPU), and the plan's launch. Everything else (argument checks, the heuristics, compiling) happens
once per key, when the plan is made (:mod:`gemmlab.family.plan`). Bad input always reaches the checks: an
argument that has no signature (not a tensor) goes down the slow path, which says what is wrong, and an option's
type is part of the grouped key (``mixed=64.0`` never finds the plan of ``mixed=64``). The order is the course's:
the arguments, then the tier (:class:`gemmlab.tiers.TierError` without the GPU a call needs), then the devices.

``gemm``'s rules: ``a`` M x K row-major, ``b`` K x N row-major or the ``w.t()`` view of an N x K weight,
BF16/FP16 in, FP32 accumulation, the output in ``out``'s dtype (default: ``a``'s; on Blackwell ``a``'s only),
every contiguous dimension a multiple of 8, 16-byte aligned starts, ``out`` apart from ``a`` and ``b``.
"""
from __future__ import annotations

from ..checks import check_choice
from .configs import check_grouped_config
from .heuristic_grouped import L2_PROMOTION, check_options
from .plan import (GatedPlan, GroupedPlan, Plan, arch_of_machine, grouped_machine, make_gated_plan, make_grouped_plan,
                   make_plan, offs_report, problem_table, take_offs_error)
from .problem import (as_list, canonical_operands, check_devices, check_gated_pointers, check_list, check_offs_values,
                      check_pointers, check_table_pointers, dtype_name, gated_problem, list_problem, problem_of,
                      ragged_problem, spans)


def _signature(*tensors):
    """Shapes, strides, dtypes and devices of ``tensors`` (None stays None); None if one is not a tensor."""
    try:
        return tuple(None if t is None else (t.shape, t.stride(), t.dtype, t.device) for t in tensors)
    except (AttributeError, TypeError):
        return None


def _cached(cache: dict, key):
    try:
        return None if key is None else cache.get(key)
    except TypeError:  # an unhashable option: no plan can be keyed on it, the checks will say what is wrong
        return None


# --------------------------------------------------------------------------------------
# Dense (chapters 07, 10)
# --------------------------------------------------------------------------------------

#: Plans by call signature (:func:`plan_key`): ``(plan, fix, extents)``, ``fix`` when a size-1 dimension's stride
#: must be rewritten (:func:`~gemmlab.family.problem.canonical_operands`), ``extents`` the bytes each operand spans.
_PLANS: dict = {}


def plan_key(a, b, out=None) -> tuple:
    """What a dense plan depends on: every operand's shape, strides, dtype and device (``out``'s None when not
    given). Where the tensors start is not in it: :func:`~gemmlab.family.problem.check_pointers` looks on every
    call. Raises ``AttributeError`` for an argument that is not a tensor."""
    return (a.shape, a.stride(), a.dtype, a.device, b.shape, b.stride(), b.dtype, b.device,
            None if out is None else (out.shape, out.stride(), out.dtype, out.device))


def gemm(a, b, out=None):
    """``out = a @ b`` on the GPU (see :mod:`gemmlab.family.problem` for the rules); returns ``out``."""
    try:
        key = plan_key(a, b, out)
        entry = _PLANS.get(key)
    except (AttributeError, TypeError):  # an argument that is not a tensor: the checks below name it
        key = entry = None
    if entry is None:
        entry = _new_plan(a, b, out, key)
    else:
        check_pointers(a, b, out, entry[2])
    plan, fix, _ = entry
    if out is None:
        import torch

        out = torch.empty((plan.problem.m, plan.problem.n), dtype=a.dtype, device=a.device)
    if fix:  # a size-1 dimension with a stride torch chose freely: pass the packed view
        a, b, out = canonical_operands(a, b, out, plan.problem.b_major)
    plan.launch(a, b, out)
    return out


def _new_plan(a, b, out, key) -> tuple[Plan, bool, tuple]:
    """Check everything, make (or share) the plan, remember it under ``key``.

    The order is the course's rule: the arguments first (any machine), then the
    tier (:class:`gemmlab.tiers.TierError` without a GPU), then the devices.
    """
    problem = problem_of(a, b, out)
    arch_of_machine()
    check_devices(a, b, out)
    plan = _plan_for(problem, a.device, (a, b, out))
    fix = any(c is not t for c, t in zip(canonical_operands(a, b, out, problem.b_major), (a, b, out)))
    entry = (plan, fix, spans(a, b, out))
    if key is not None:
        _PLANS[key] = entry
    return entry


_BY_PROBLEM: dict = {}


def _plan_for(problem, device, tensors=None) -> Plan:
    key = (problem, device)
    plan = _BY_PROBLEM.get(key)
    if plan is None:
        plan = _BY_PROBLEM[key] = make_plan(problem, device, tensors=tensors)
    return plan


def plans() -> list[Plan]:
    """Every plan made in this process (chapter 07 lists them)."""
    return list(_BY_PROBLEM.values())


# --------------------------------------------------------------------------------------
# Grouped (chapter 08)
# --------------------------------------------------------------------------------------

#: Grouped plans by call signature (the tensors' shapes, strides, dtypes, devices, and the options with their types):
#: ``(plan, extents)``, ``extents`` the bytes a, b and out span (the ragged form; None for the list form).
_GROUPED: dict = {}


def grouped_gemm(a, b, offs, out=None, *, config=None, validate: bool | str = True, fences: bool = True,
                 by_size: bool | None = None, l2_promotion: int | None = L2_PROMOTION, dynamic: bool | None = None,
                 overlap_store: bool | None = None, mixed: int | None = None, burst: int | None = None):
    """``out[offs[g-1]:offs[g]] = a[offs[g-1]:offs[g]] @ b[g]`` for every group g, in one launch.

    ``a`` (T, K) holds the tokens of every expert one after the other, ``offs`` (G,) int32 the cumulative end row
    of each expert's tokens, ``b`` (G, K, N) the experts' weights; returns ``out`` (T, N): the meaning of
    ``torch._grouped_mm(a, b, offs=offs)``. Rows after ``offs[-1]`` are not written. BF16 (or FP16) in, FP32
    accumulation, the input dtype out.

    ``offs`` must be non-decreasing from 0 and at most ``a``'s rows. It is on the GPU, and reading it back would
    make the call wait for all the GPU work queued before it, so by default (``validate=True``) the kernel checks
    it while it runs: a bad ``offs`` is raised as a ``ValueError`` by a later ``grouped_gemm`` call on that device
    (the first one after the kernel has written its report), or by :func:`check_grouped_offs`, which waits for the
    GPU (CUDA reports a kernel's own errors the same way: later). Whatever ``offs`` holds, the kernel clamps it to ``[previous end, rows]``, so a bad one never makes it
    read or write outside ``a`` or ``out``. ``validate="sync"`` checks ``offs`` on the host inside the call (it
    waits for the GPU; the error comes from this call); ``validate=False`` checks nothing. ``fences=False``
    runs the broken variant without the descriptor release/acquire (chapter 08
    uses it to show what the fences are for; never use it for results).
    The schedule's knobs, each None for its rule (:mod:`gemmlab.family.heuristic_grouped`):
    ``by_size`` (largest first: :func:`~gemmlab.family.heuristic_grouped.largest_first`), ``dynamic``
    (:func:`~gemmlab.family.heuristic_grouped.dynamic_schedule`), ``overlap_store``
    (:func:`~gemmlab.family.heuristic_grouped.store_under_next`), ``mixed`` (the light experts' rows for the mixed
    order, 0 for none: :func:`~gemmlab.family.heuristic_grouped.mixed_rows`, never for ``dynamic=False`` or
    ``by_size=False``) and ``burst`` (its claims per block: :data:`~gemmlab.family.heuristic_grouped.MIXED_BURST`);
    ``l2_promotion``: :data:`~gemmlab.family.heuristic_grouped.L2_PROMOTION` (None: the DSL's 128 bytes).
    Calls on one stream at a time only: the per-CTA descriptor slots and the tile counter are shared.

    Bad input raises ``TypeError`` / ``ValueError`` naming the argument (options included) on every machine;
    then a machine without a Hopper GPU raises ``TierError``, then tensors off a CUDA device a ``ValueError``.
    """
    if validate is not True and validate is not False and not (type(validate) is str and validate == "sync"):
        validate = check_choice("validate", validate, (False, True, "sync"))  # every call: not in the plan's key
    options = (config, fences, by_size, l2_promotion, dynamic, overlap_store, mixed, burst)
    sig = _signature(a, b, offs, out)
    # The options' types are in the key too: 64.0 == 64 and 1 == True, but only the ints and bools are accepted.
    key = None if sig is None else sig + options + tuple(map(type, options))
    entry = _cached(_GROUPED, key)
    if entry is None:
        problem = ragged_problem(a, b, offs, out)
        opts = check_options(problem, config, fences=fences, by_size=by_size, l2_promotion=l2_promotion,
                             dynamic=dynamic, overlap_store=overlap_store, mixed=mixed, burst=burst)
        grouped_machine(a.device)
        entry = (make_grouped_plan(problem, a.device, config, **opts), spans(a, b, out))
        if key is not None:
            _GROUPED[key] = entry
    else:  # the signature vouches for everything but where the tensors start
        check_pointers(a, b, out, entry[1])
    plan = entry[0]
    if out is None:
        import torch

        out = torch.empty((plan.problem.tokens, plan.problem.n), dtype=a.dtype, device=a.device)
    report = 0
    if validate is True:  # the kernel checks offs (check_offs); an earlier call's finding is raised now
        r = offs_report(a.device)
        if r.view[0]:
            raise r.take()
        report = r.address
    elif validate:
        # "sync": last, with everything else ready: reading offs waits for the GPU to finish the work queued
        # before this call, and the GPU idles from then until the launch below.
        check_offs_values(offs, plan.problem.tokens)
    if plan.problem.tokens == 0:
        return out
    plan.ragged(a, b, out, offs, report)
    return out


def check_grouped_offs(device=None) -> None:
    """Wait for the GPU, then raise the ``ValueError`` of a bad ``offs`` an earlier :func:`grouped_gemm` call's
    kernel found on ``device`` (default: the current CUDA device), if any; the report is emptied."""
    import torch

    device = torch.device("cuda", torch.cuda.current_device()) if device is None else torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    torch.cuda.synchronize(device)
    err = take_offs_error(device)
    if err is not None:
        raise err


def grouped_gemm_list(pairs, outs=None, *, config=None):
    """``[a_i @ b_i for (a_i, b_i) in pairs]`` in one launch: the pointer-array grouped GEMM.

    Every ``a_i`` is (M_i, K_i) with contiguous rows, every ``b_i`` (K_i, N_i) with
    the same layout (all K-contiguous or all N-contiguous), one dtype, one
    device; M_i may be 0. The problem table (addresses, sizes, strides) is built
    on the host and copied to the device with the launch. ``outs`` (when given) must share no memory with each
    other or with the inputs.
    """
    pairs = as_list("pairs", pairs, "(a, b) pairs of tensors")
    outs = None if outs is None else as_list("outs", outs, "output tensors")
    try:
        key = (tuple(_signature(ai, bi) for ai, bi in pairs), None if outs is None else _signature(*outs), config)
        if None in key[0] or (outs is not None and key[1] is None):
            key = None
    except (TypeError, ValueError):  # not (a, b) pairs: the checks say what is wrong
        key = None
    entry = _cached(_GROUPED, key)
    if entry is None:
        pairs, outs, major = check_list(pairs, outs)
        if config is not None:
            check_grouped_config(config, dtype_name(pairs[0][0].dtype))
    else:
        major = entry[0].problem.b_major
    live = [i for i, (ai, _) in enumerate(pairs) if ai.shape[0] > 0]  # the problems with rows: one table row each
    given = outs is not None
    if given:  # where the caller's outputs are: aligned, apart from each other and from every input
        rows = problem_table([pairs[i] for i in live], [outs[i] for i in live], major)
        check_table_pointers(rows, live, major, pairs[0][0].element_size(), outs_given=True)
    device = pairs[0][0].device
    if entry is None:
        grouped_machine(device, "gemmlab.grouped_gemm_list")
    import torch

    if not given:  # fresh outputs: only the inputs' starts to check
        outs = [torch.empty((ai.shape[0], bi.shape[1]), dtype=ai.dtype, device=ai.device) for ai, bi in pairs]
        rows = problem_table([pairs[i] for i in live], [outs[i] for i in live], major)
        check_table_pointers(rows, live, major, pairs[0][0].element_size(), outs_given=False)
    if not live:
        return outs
    table = torch.tensor(rows, dtype=torch.int64).to(device, non_blocking=True)
    if entry is None:
        shapes = [(pairs[i][0].shape[0], pairs[i][1].shape[1]) for i in live]
        entry = (make_grouped_plan(list_problem(pairs, major), device, config, shapes=shapes), None)
        if key is not None:
            _GROUPED[key] = entry
    first = live[0]
    entry[0].table(table, pairs[first][0], pairs[first][1], outs[first])
    return outs


def grouped_plans() -> list[GroupedPlan]:
    """Every grouped plan made in this process, one per call signature."""
    return [plan for plan, _ in _GROUPED.values()]


# --------------------------------------------------------------------------------------
# Gated NVFP4 (chapter 11)
# --------------------------------------------------------------------------------------

#: Gated plans by call signature: ``(plan, extents)``, ``extents`` the bytes each tensor spans.
_GATED: dict = {}


def gated_key(a, b1, b2, sfa, sfb1, sfb2, out=None):
    """What a gated plan depends on, as one flat tuple: each tensor's shape, strides, dtype and CUDA device index
    (``get_device()``: -1 off CUDA, where no plan is ever made), ``out``'s None when not given. None if an argument
    is not a tensor (the checks then say which). Flat and without ``torch.device`` objects, it costs about a
    microsecond less per call than :func:`_signature`."""
    try:
        return (a.shape, a.stride(), a.dtype, a.get_device(), b1.shape, b1.stride(), b1.dtype, b1.get_device(),
                b2.shape, b2.stride(), b2.dtype, b2.get_device(), sfa.shape, sfa.stride(), sfa.dtype, sfa.get_device(),
                sfb1.shape, sfb1.stride(), sfb1.dtype, sfb1.get_device(),
                sfb2.shape, sfb2.stride(), sfb2.dtype, sfb2.get_device(),
                None if out is None else (out.shape, out.stride(), out.dtype, out.get_device()))
    except (AttributeError, TypeError):
        return None


def gated_dual_gemm(a, b1, b2, sfa, sfb1, sfb2, out=None):
    """``silu(A B1^T) * (A B2^T)`` in FP16 from NVFP4 operands, on the kernel of this machine's GPU.

    ``a`` (M, K/2, 1), ``b1``/``b2`` (N, K/2, 1): packed FP4, two e2m1 values a byte, K-major with packed rows (uint8
    or ``float4_e2m1fn_x2``); ``sfa`` (M, K/16, 1), ``sfb1``/``sfb2`` (N, K/16, 1): plain e4m3 scales, one per
    16 K values, row-major; K a multiple of 256, N of 8; ``out`` (M, N, 1) FP16, compact, or None; every tensor
    16-byte aligned, ``out`` apart from the inputs. Returns ``out``.

    On an H100/H200 the kernel follows M and the time models (:func:`~gemmlab.family.heuristic_gated.choose_sm90`):
    the decode twin below 64 rows; the swap twin from 64 to 128 (A converted to FP16 once, in a workspace the call
    allocates; the weights converted in the MMA threads' registers), or the decode twin where no swap configuration
    fills the GPU (small N); from 129 whichever of the A16 twin (the same
    workspace; the weights converted into shared memory), the swap twin (up to 1024 rows) and the W16 route (A and the
    weights converted to FP16 workspaces inside the call, then chapter 07's GEMM with a gated epilogue) its model finds
    fastest. Nothing is kept between calls.

    Bad input raises ``TypeError`` / ``ValueError`` naming the argument, on every machine and before any
    compile or launch; a machine without a Hopper or datacenter Blackwell GPU then raises ``TierError``.
    """
    tensors = (a, b1, b2, sfa, sfb1, sfb2, out)
    key = gated_key(a, b1, b2, sfa, sfb1, sfb2, out)
    entry = _cached(_GATED, key)
    if entry is None:
        entry = (make_gated_plan(gated_problem(*tensors), tensors), spans(*tensors))
        if key is not None:
            _GATED[key] = entry
        return entry[0](a, b1, b2, sfa, sfb1, sfb2, out)
    # the signature vouches for everything but where the tensors start; the check reads the pointers once
    return entry[0].launch(check_gated_pointers(tensors, entry[1]), a, b1, b2, sfa, sfb1, sfb2, out)


def gated_plans() -> list[GatedPlan]:
    """Every gated plan made in this process, one per call signature."""
    return [plan for plan, _ in _GATED.values()]
