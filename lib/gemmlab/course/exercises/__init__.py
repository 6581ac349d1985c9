"""Self-checking exercises: one module per chapter, a checker per exercise, worked solutions kept here.

A notebook's exercise cell holds the reader's answer (``None`` until they write one) and calls the
checker, which prints whether it is right and, if not, a hint. The solutions are functions of the
same module (``solution_<name>``); ``tests/test_exercises.py`` checks that every solution passes.

Answers are compared as values, not as Python types: numpy and torch scalars are numbers, arrays,
tensors and lists compare like tuples, and a real number given with more decimals than the answer
has is right when it rounds to it (the checker says so). A checker returns a :class:`Verdict`, true
when right; in a notebook it shows nothing more than the line the checker printed.
"""
from __future__ import annotations

import numbers


class Verdict:
    """What a checker returns: true when the answer was right. Jupyter shows nothing for it (no ``Out[]``)."""

    __slots__ = ("ok",)

    def __init__(self, ok: bool):
        self.ok = bool(ok)

    def __bool__(self) -> bool:
        return self.ok

    def __eq__(self, other) -> bool:
        if isinstance(other, (bool, Verdict)):
            return self.ok == bool(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.ok)

    def __repr__(self) -> str:
        return f"Verdict({self.ok})"

    def _ipython_display_(self) -> None:
        """Nothing: the checker has printed its verdict."""


def plain(value):
    """``value`` as plain Python: numpy/torch scalars as numbers, arrays, tensors and lists as (nested) tuples,
    sets as frozensets, strings stripped."""
    mod = type(value).__module__ or ""
    if mod.startswith(("numpy", "torch")) and hasattr(value, "tolist"):
        value = value.tolist()  # a scalar becomes a number, an array a (nested) list
    if isinstance(value, (list, tuple)):
        return tuple(plain(v) for v in value)
    if isinstance(value, (set, frozenset)):
        return frozenset(plain(v) for v in value)
    if isinstance(value, str):
        return value.strip()
    return value


def _number(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _decimals(x: float) -> int:
    """Decimals of ``x`` as written (``3.56`` -> 2, ``76.0`` -> 0)."""
    text = repr(float(x))
    if "e" in text or "." not in text:
        return 0
    return len(text.split(".")[1].rstrip("0"))


def _compare(answer, expected, tolerance: float) -> tuple[bool, str]:
    """``(right, note)``: whether ``answer`` is ``expected``, and a remark on how it was read (or why not)."""
    if _number(answer) and _number(expected):
        if answer != answer or answer in (float("inf"), float("-inf")):  # NaN or infinite: never right
            return False, ""
        if answer == expected or (tolerance and abs(answer - expected) <= tolerance):
            return True, ""
        if isinstance(expected, numbers.Integral):
            if answer != int(answer) and abs(answer - expected) < 1:
                return False, (f" {answer!r} is not a whole number: the answer is one (round yours as the exercise "
                               "asks).")
            return False, ""
        d = _decimals(expected)
        if round(answer, d) == expected:
            return True, f" ({answer!r} rounded to {d} decimal{'s' if d != 1 else ''})"
        if abs(answer - expected) < 10 ** -d:
            return False, f" Give it to {d} decimal{'s' if d != 1 else ''}: yours rounds to {round(answer, d)!r}."
        return False, ""
    try:
        return bool(answer == expected), ""
    except (TypeError, ValueError):  # something that does not compare to a plain value
        return False, ""


def verdict(name: str, answer, expected, hint: str, *, tolerance: float = 0) -> Verdict:
    """Print the outcome of one exercise; true when ``answer`` is ``expected`` (within ``tolerance`` for numbers)."""
    if answer is None:
        print(f"{name}: no answer yet. {hint}")
        return Verdict(False)
    a, e = plain(answer), plain(expected)
    right, note = _compare(a, e, tolerance)
    if right:
        print(f"{name}: right ({expected!r}){note}.")
        return Verdict(True)
    print(f"{name}: not yet: {answer!r} is not it.{note} {hint}")
    return Verdict(False)
