"""Breaking a compiled kernel on purpose: the same PTX with one instruction removed, changed or added.

``run_on_emulator(compiled, ..., ptx=mutate(...))`` runs the changed kernel with the
launch the compiled host code builds, so a learner can delete the ``tcgen05.wait::ld``
of chapter 10's epilogue (or keep ACCUMULATE on for the first MMA of a tile, or free
tensor memory early, or drop the ``fence.proxy.async`` before a TMA store) and read
what the emulator says: an error naming the warp and the PTX line, or a note in the launch report. Every edit must match: an edit that matches nothing raises,
so a test cannot pass by injecting nothing.
"""
from __future__ import annotations

import re


def _code_lines(ptx: str):
    return [i for i, ln in enumerate(ptx.splitlines()) if ln.strip() and not ln.strip().startswith("//")]


def mutate(ptx: str, *, drop: str | None = None, replace: tuple | None = None, before: tuple | None = None,
           count: int | None = None) -> str:
    """Return ``ptx`` changed by one kind of edit (regular expressions on instruction lines):

    * ``drop=PATTERN``: remove the instructions matching ``PATTERN``;
    * ``replace=(PATTERN, REPL)``: ``re.sub`` on the instructions matching ``PATTERN``;
    * ``before=(PATTERN, TEXT)``: insert ``TEXT`` (PTX statements) before the first instruction matching.

    ``count``: change only the first ``count`` matches (default: all; ``before`` inserts once).
    Raises ``ValueError`` when nothing matches.
    """
    edits = sum(x is not None for x in (drop, replace, before))
    if edits != 1:
        raise ValueError("give exactly one of drop=, replace=, before=")
    lines = ptx.splitlines()
    pattern = re.compile(drop or (replace or before)[0])
    done = 0
    out = []
    for i, ln in enumerate(lines):
        s = ln.strip()
        hit = bool(s) and not s.startswith("//") and pattern.search(s) and (count is None or done < count)
        if before is not None and hit and done == 0:
            out.append("\t" + before[1])
            done += 1
            out.append(ln)
            continue
        if hit and drop is not None:
            done += 1
            continue
        if hit and replace is not None:
            new = pattern.sub(replace[1], s)
            if new == s:
                raise ValueError(f"the replacement for {pattern.pattern!r} leaves {s!r} unchanged")
            done += 1
            out.append(ln[:len(ln) - len(ln.lstrip())] + new)
            continue
        out.append(ln)
    if not done:
        raise ValueError(f"no instruction matches {pattern.pattern!r}: nothing was injected")
    return "\n".join(out) + "\n"
