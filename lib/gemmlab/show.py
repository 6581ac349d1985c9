"""Render library source inside a notebook: the reader sees the code that runs."""
from __future__ import annotations

import inspect
import textwrap


def source_of(obj) -> str:
    """Source text of a function/class/module, unwrapping CuTe DSL decorators."""
    target = obj
    for attr in ("__wrapped__", "func", "_func"):
        inner = getattr(target, attr, None)
        if inner is not None and callable(inner):
            target = inner
    return textwrap.dedent(inspect.getsource(target))


def show_source(*objs) -> None:
    """Display the source of ``objs`` as highlighted Python (Markdown code block)."""
    from IPython.display import Markdown, display

    for obj in objs:
        mod = getattr(obj, "__module__", None) or getattr(obj, "__name__", "")
        display(Markdown(f"`{mod}`\n\n```python\n{source_of(obj)}```"))
