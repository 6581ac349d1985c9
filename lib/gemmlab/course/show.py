"""Render library source inside a notebook: the reader sees the code that runs.

* :func:`source_of` / :func:`show_source`: a whole function, class or module.
* :func:`source_region` / :func:`show_region`: one section of a long function, cut at
  comments that are already in its source (so a kernel is read in pieces, in the order
  it runs, without changing it).
* :func:`numbered_sections` / :func:`show_numbered_section`: a kernel whose body is
  organised by numbered comments (``# 1. ...``), cut at every one of them.
"""
from __future__ import annotations

import inspect
import textwrap
from pathlib import Path


def _unwrap(obj):
    target = obj
    for attr in ("__wrapped__", "func", "_func"):
        inner = getattr(target, attr, None)
        if inner is not None and callable(inner):
            target = inner
    return target


def source_of(obj) -> str:
    """Source text of a function/class/module, unwrapping CuTe DSL decorators."""
    return textwrap.dedent(inspect.getsource(_unwrap(obj)))


def show_source(*objs) -> None:
    """Display the source of ``objs`` as highlighted Python (Markdown code block)."""
    from IPython.display import Markdown, display

    for obj in objs:
        mod = getattr(obj, "__module__", None) or getattr(obj, "__name__", "")
        display(Markdown(f"`{mod}`\n\n```python\n{source_of(obj)}```"))


def _qualname(obj) -> str:
    target = _unwrap(obj)
    mod = getattr(target, "__module__", None) or ""
    name = getattr(target, "__qualname__", None) or getattr(target, "__name__", "") or repr(obj)
    return f"{mod}.{name}" if mod else name


def _marker_line(lines: list[str], marker: str, what: str, obj) -> int:
    """Index of the one line whose comment (the text from its first ``#``) contains ``marker``."""
    hits = [i for i, line in enumerate(lines) if "#" in line and marker in line[line.index("#"):]]
    if not hits:
        raise ValueError(f"{what} marker {marker!r} is in no comment of {_qualname(obj)}: a region starts and "
                         f"ends at comments that exist in the source")
    if len(hits) > 1:
        raise ValueError(f"{what} marker {marker!r} is in {len(hits)} comments of {_qualname(obj)} (lines "
                         f"{', '.join(str(i + 1) for i in hits)}): a marker must name exactly one comment")
    return hits[0]


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def region_lines(obj, start: str | None, end: str | None = None) -> tuple[int, int]:
    """``(first, last)``: 1-based line numbers, within :func:`source_of` ``(obj)``, of a region.

    The region starts at the line whose comment contains ``start`` (``None``: the
    first line of the source) and ends before the first of: the line whose comment
    contains ``end``; the first non-blank line indented less than the start line
    (the end of the start line's block: a region never runs out of the branch or
    loop it starts in); the end of the source. Trailing blank lines are dropped.

    Each marker must occur in exactly one comment (a line's text from its first
    ``#``), and ``end`` must come after ``start``: otherwise ``ValueError``.
    """
    for name, value in (("start", start), ("end", end)):
        if value is not None and (not isinstance(value, str) or not value.strip()):
            raise TypeError(f"{name} must be a non-empty string (text of a comment in the source) or None; "
                            f"got {value!r}")
    lines = source_of(obj).splitlines()
    first = 0 if start is None else _marker_line(lines, start, "start", obj)
    stop = len(lines)
    if end is not None:
        stop = _marker_line(lines, end, "end", obj)
        if stop <= first:
            raise ValueError(f"end marker {end!r} (line {stop + 1}) must come after the start marker "
                             f"{start!r} (line {first + 1}) in {_qualname(obj)}")
    if start is not None:
        depth = _indent(lines[first])
        for i in range(first + 1, stop):
            if lines[i].strip() and _indent(lines[i]) < depth:
                stop = i
                break
    while stop > first + 1 and not lines[stop - 1].strip():
        stop -= 1
    return first + 1, stop


def source_region(obj, start: str | None, end: str | None = None) -> str:
    """The source of one region of ``obj`` (see :func:`region_lines`), dedented; ends with a newline."""
    first, last = region_lines(obj, start, end)
    lines = source_of(obj).splitlines()[first - 1:last]
    return textwrap.dedent("\n".join(lines)) + "\n"


def show_region(obj, start: str | None, end: str | None = None) -> None:
    """Display one region of ``obj``'s source (:func:`source_region`), headed by its name and line numbers."""
    from IPython.display import Markdown, display

    first, last = region_lines(obj, start, end)
    target = _unwrap(obj)
    try:
        offset = inspect.getsourcelines(target)[1] - 1
        where = f"{Path(inspect.getsourcefile(target)).name}, lines {first + offset}–{last + offset}"
    except (OSError, TypeError):
        where = f"lines {first}–{last}"
    display(Markdown(f"`{_qualname(obj)}` ({where})\n\n```python\n{source_region(obj, start, end)}```"))


def numbered_sections(fn, first: str = "warp = ") -> dict[str, str]:
    """The source of ``fn`` from its first line starting with ``first``, cut at its numbered comments.

    A comment ``# 3. Title: ...`` opens section ``"3. Title"``; key ``"0. Coordinates"`` is
    what precedes section 1. Each text is the code that compiles, dedented.
    """
    import re

    body = source_of(fn).splitlines()
    start = next(i for i, line in enumerate(body) if line.lstrip().startswith(first))
    sections, title, chunk = {}, "0. Coordinates", []
    for line in body[start:]:
        mt = re.match(r"\s*# (\d+\. [^:(]+?)[:(.]", line)
        if mt:
            sections[title] = textwrap.dedent("\n".join(chunk)).strip("\n")
            title, chunk = mt.group(1).strip(), []
        chunk.append(line)
    sections[title] = textwrap.dedent("\n".join(chunk)).strip("\n")
    return sections


def show_numbered_section(fn, number: int) -> None:
    """Display section ``number`` of :func:`numbered_sections` ``(fn)``; ValueError if it has none."""
    from IPython.display import Markdown, display

    from ..checks import check_int

    check_int("number", number, lo=0)
    for title, text in numbered_sections(fn).items():
        if title.startswith(f"{number}."):
            display(Markdown(f"`{_qualname(fn)}`, section {title}\n\n```python\n{text}\n```"))
            return
    raise ValueError(f"{_qualname(fn).rsplit('.', 1)[-1]} has no section {number}")
