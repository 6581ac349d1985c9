"""Repository-wide pytest set-up: hardware tiers for tests and notebook cells.

* Unit tests carry markers (``gpu``, ``sm90``, ``sm100``); nbval cells carry the
  same words as cell tags. Work whose tier this machine lacks is skipped...
* ...unless ``$GEMMLAB_TIER`` says the machine has that tier: then it is
  mandatory and runs (and fails loudly if the GPU is not really there), so a
  broken GPU run can never pass by skipping.
* nbval's kernel is started without ``PYTEST_CURRENT_TEST``: ipykernel 7.4 stops
  capturing C-level stdout (``cute.printf``) when that variable is set.
"""
from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "lib"))

from gemmlab.course.notebook import needed_tier  # noqa: E402  (the one reading of tier words: cells and markers)
from gemmlab.tiers import detect_tier, required_tier, tier_satisfies  # noqa: E402


def _item_words(item) -> list[str]:
    cell = getattr(item, "cell", None)
    if cell is not None:  # an nbval cell
        return list(cell.get("metadata", {}).get("tags", []))
    return [m.name for m in item.iter_markers()]


def pytest_collection_modifyitems(config, items):
    have = detect_tier()
    declared = required_tier()
    for item in items:
        need = needed_tier(_item_words(item))
        if need is None or tier_satisfies(have, need):
            continue
        if declared is not None and tier_satisfies(declared, need):
            continue  # mandatory on this machine: let it run and fail if the GPU is missing
        item.add_marker(pytest.mark.skip(reason=f"needs tier {need}; this machine is tier {have}"))


def pytest_configure(config):
    try:
        import nbval.kernel as nbk
        import nbval.plugin as nbp
    except ImportError:
        return
    if getattr(nbk, "_gemmlab_patched", False):
        return
    original = nbk.start_new_kernel

    def start_new_kernel(*args, **kwargs):
        env = dict(os.environ)
        env.pop("PYTEST_CURRENT_TEST", None)
        kwargs.setdefault("env", env)
        return original(*args, **kwargs)

    nbk.start_new_kernel = start_new_kernel
    nbk._gemmlab_patched = True

    # Rendered library source (text/markdown) is derived from lib/gemmlab, which
    # is tested directly; comparing it would only force a notebook re-run for
    # every comment edit. Text outputs (PTX, tables, model results) stay strict.
    init = nbp.IPyNbFile.__init__

    def __init__(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self.skip_compare = tuple(self.skip_compare) + ("text/markdown", "text/html")

    nbp.IPyNbFile.__init__ = __init__


@pytest.fixture
def bench_script():
    """``bench_script("grouped_gemm")``: ``benchmarks/grouped_gemm.py`` loaded as a module (the benchmark
    scripts are not a package; tests check their tables and refusals without running them on a GPU)."""
    import importlib.util

    def load(name: str):
        path = os.path.join(os.path.dirname(__file__), "benchmarks", f"{name}.py")
        spec = importlib.util.spec_from_file_location(f"{name}_script", path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod

    return load


@pytest.fixture
def no_compile(monkeypatch):
    """Make any compile fail loudly: a test using it proves its refusals come before the DSL is reached."""
    import gemmlab.compile

    def refuse(*args, **kwargs):
        raise AssertionError("compiled before the arguments were checked")

    monkeypatch.setattr(gemmlab.compile, "compile_for", refuse)
