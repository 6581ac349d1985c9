"""``gemmlab.gemm(a, b, out=None)``: the course's public GEMM, ``a @ b`` with torch's meaning.

The rules are the contract's (:mod:`gemmlab.family.problem`): ``a`` M x K
row-major, ``b`` K x N row-major or the ``w.t()`` view of an N x K weight,
BF16/FP16 in, FP32 accumulation, the output in ``out``'s dtype (default:
``a``'s), every contiguous dimension a multiple of 8, 16-byte aligned starts.
On Hopper it runs chapter 07's kernel, on Blackwell chapter 10's (compile-
verified only: it has never run on a B200); elsewhere it raises
:class:`gemmlab.tiers.TierError` after checking the arguments.

The call path is built to cost no more host time than ``torch.matmul``:
one dictionary lookup keyed on what a plan depends on (shapes, strides,
dtypes, device), the alignment check, and the plan's launch. Everything else
(argument checks, the heuristic, compiling) happens once per key, in
:func:`_new_plan`.
"""
from __future__ import annotations

from .plan import Plan, arch_of_machine, make_plan
from .problem import canonical_operands, check_alignment, check_devices, problem_of

#: Plans by call signature: (a's shape and strides, b's, out's or None, dtypes, device).
_PLANS: dict = {}


def gemm(a, b, out=None):
    """``out = a @ b`` on the GPU (see :mod:`gemmlab.family.problem` for the rules); returns ``out``."""
    o = None if out is None else (out.shape, out.stride(), out.dtype)
    key = (a.shape, a.stride(), b.shape, b.stride(), a.dtype, b.dtype, a.device, o)
    entry = _PLANS.get(key)
    if entry is None:
        entry = _new_plan(a, b, out, key)
    else:
        check_alignment(a, b, out)
    plan, fix = entry
    if out is None:
        import torch

        out = torch.empty((plan.problem.m, plan.problem.n), dtype=a.dtype, device=a.device)
    if fix:  # a size-1 dimension with a stride torch chose freely: pass the packed view
        a, b, out = canonical_operands(a, b, out, plan.problem.b_major)
    plan.launch(a, b, out)
    return out


def _new_plan(a, b, out, key) -> tuple[Plan, bool]:
    """Check everything, make (or share) the plan, remember it under ``key``.

    The order is the course's rule: the arguments first (any machine), then the
    tier (:class:`gemmlab.tiers.TierError` without a GPU), then the devices.
    """
    problem = problem_of(a, b, out)
    arch_of_machine()
    check_devices(a, b, out)
    plan = _plan_for(problem, a.device)
    fix = any(c is not t for c, t in zip(canonical_operands(a, b, out, problem.b_major), (a, b, out)))
    _PLANS[key] = (plan, fix)
    return plan, fix


_BY_PROBLEM: dict = {}


def _plan_for(problem, device) -> Plan:
    key = (problem, device)
    plan = _BY_PROBLEM.get(key)
    if plan is None:
        plan = _BY_PROBLEM[key] = make_plan(problem, device)
    return plan


def plans() -> list[Plan]:
    """Every plan made in this process (chapter 07 lists them)."""
    return list(_BY_PROBLEM.values())
