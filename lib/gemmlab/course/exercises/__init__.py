"""Self-checking exercises: one module per chapter, a checker per exercise, worked solutions kept here.

A notebook's exercise cell holds the reader's answer (``None`` until they write one) and calls the
checker, which prints whether it is right and, if not, a hint. The solutions are functions of the
same module (``solution_<name>``); ``tests/test_exercises.py`` checks that every solution passes.
"""
from __future__ import annotations


def verdict(name: str, answer, expected, hint: str) -> bool:
    """Print the outcome of one exercise; True when ``answer == expected``."""
    if answer is None:
        print(f"{name}: no answer yet. {hint}")
        return False
    if answer == expected:
        print(f"{name}: right ({expected!r}).")
        return True
    print(f"{name}: not yet: {answer!r} is not it. {hint}")
    return False
