"""The package surface (light import, lazy public calls) and the house's layers: imports flow one way, no circles.

The layers, from the ground up (DEVELOPING.md draws them):

    core        checks, tiers, hardware, compile, figures
    chapters    the flat teaching modules (ldst ... tcgen05, the CPU models)
    family      problem -> configs -> heuristic_* (what a call is, what runs it)
    kernels     the family's device code
    family      plan -> api (the compile cache, the plans, the public calls)
    measure     timing, benchmark drivers, tables, figures, analysis
    course      notebook set-up, runner, source display, exercises

    emulator    beside measure: a PTX emulator whose machine stands on core alone (compile, figures) and whose
                catalogue of the course's kernels (emulator.sm90_cases) calls the chapters, kernels and plans;
                only the course machinery (chapter 12's exercises) imports it, besides tests, benchmarks and
                notebooks

Every import is read from the source, function-local ones included.
"""
import ast
import subprocess
import sys
from pathlib import Path

import pytest

import gemmlab

ROOT = Path(gemmlab.__file__).parent
CORE = {"checks", "tiers", "hardware", "compile", "figures"}
#: The family's host layers in the order they may import each other (each only the ones before it).
FAMILY = ["family.problem", "family.configs", "family.heuristic_sm90", "family.heuristic_sm100",
          "family.heuristic_grouped", "family.heuristic_gated", "family.plan", "family.api"]
FAMILY_BELOW_KERNELS = set(FAMILY[:-2])


def _modules() -> dict[str, Path]:
    """Every module of the package by its dotted name under gemmlab ("" is the package itself)."""
    out = {}
    for path in ROOT.rglob("*.py"):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _imports(name: str, path: Path, modules, top_level_only: bool = False) -> dict[str, int]:
    """The gemmlab modules ``name`` imports (function-local imports too, unless ``top_level_only``): ``{module:
    line}``. ``from . import x`` counts module ``x`` when it is one, else the package."""
    is_pkg = path.name == "__init__.py"
    pkg = name.split(".") if is_pkg else name.split(".")[:-1]
    if name == "":
        pkg = []
    tree = ast.parse(path.read_text())
    nodes = tree.body if top_level_only else ast.walk(tree)
    found = {}

    def add(target, line):
        while target not in modules and "." in target:
            target = target.rsplit(".", 1)[0]
        if target in modules and target != name:
            found.setdefault(target, line)

    for node in nodes:
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "gemmlab" or alias.name.startswith("gemmlab."):
                    add(alias.name[len("gemmlab."):] if "." in alias.name else "", node.lineno)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg[:len(pkg) - (node.level - 1)] if node.level > 1 else pkg
                mod = ".".join(base + ([node.module] if node.module else []))
            elif node.module and (node.module == "gemmlab" or node.module.startswith("gemmlab.")):
                mod = node.module[len("gemmlab."):] if "." in node.module else ""
            else:
                continue
            for alias in node.names:
                sub = f"{mod}.{alias.name}" if mod else alias.name
                add(sub if sub in modules else mod, node.lineno)
    return found


@pytest.fixture(scope="module")
def graph():
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def _layer(name: str) -> str:
    if name in CORE:
        return "core"
    top = name.split(".")[0]
    if top in ("kernels", "measure", "course", "emulator"):
        return top
    if name in ("family.plan", "family.api"):
        return "calls"
    if top == "family":
        return "description"
    return "package" if name == "" else "chapters"


#: What each layer may never import.
FORBIDDEN = {
    "core": {"chapters", "description", "kernels", "calls", "measure", "course", "emulator"},
    "chapters": {"kernels", "calls", "measure", "course", "emulator"},
    "description": {"kernels", "calls", "measure", "course", "emulator"},
    "kernels": {"calls", "measure", "course", "emulator"},
    "calls": {"measure", "course", "emulator"},
    "measure": {"course", "emulator"},
    "course": set(),
    "emulator": {"measure", "course"},
}
#: The emulator's catalogue of the course's kernels: the one emulator module that may import above core.
EMULATOR_CASES = {"emulator.sm90_cases"}


def _circles(graph: dict[str, dict]) -> list[list[str]]:
    """Every strongly connected group of two or more modules (Tarjan), each sorted."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_circle_finder_finds_circles():
    assert _circles({"a": {"b": 1}, "b": {"c": 1}, "c": {"a": 1}, "d": {"a": 1}}) == [["a", "b", "c"]]
    assert _circles({"a": {"b": 1}, "b": {}}) == []


def test_no_import_circles(graph):
    """No two modules import each other, directly or around a loop, counting function-local imports.

    One exception, inside the emulator only: its instruction handlers (``emulator.isa.*``) register into the
    dispatch table of ``emulator.isa`` and call back into ``emulator.machine``, which dispatches through them, so
    those modules form one circle (a design of the emulator's, older than this rule). A circle that reaches outside
    the emulator, or any other, fails."""
    circles = _circles(graph)
    inside_emulator = [c for c in circles if all(_layer(m) == "emulator" for m in c)]
    assert [c for c in circles if c not in inside_emulator] == []
    assert all(m.startswith(("emulator.isa", "emulator.machine")) for c in inside_emulator for m in c), inside_emulator


def test_imports_flow_one_way(graph):
    """Core <- chapters and the family's description <- kernels <- plan, api <- measure <- course: never upward."""
    wrong = [f"{a} ({_layer(a)}) imports {b} ({_layer(b)}), line {line}"
             for a, deps in sorted(graph.items()) for b, line in sorted(deps.items())
             if _layer(b) in FORBIDDEN.get(_layer(a), ())]
    assert wrong == []


def test_the_emulators_machine_stands_on_core_alone(graph):
    """The emulator runs any compiled kernel's PTX: its machine (everything but the catalogue of the course's kernels)
    imports only core and itself, so a course module can change without touching it; the catalogue imports the
    kernels it runs, and no library module outside the emulator and the course machinery imports any of it."""
    emulator = [n for n in graph if _layer(n) == "emulator"]
    assert "emulator.machine" in emulator and EMULATOR_CASES <= set(emulator)
    wrong = [f"{a} imports {b}, line {line}" for a in sorted(emulator) if a not in EMULATOR_CASES
             for b, line in sorted(graph[a].items()) if _layer(b) not in ("core", "emulator")]
    assert wrong == []
    assert any(_layer(b) == "kernels" for b in graph["emulator.sm90_cases"])  # the layer check sees its imports
    users = [a for a, deps in graph.items()
             if _layer(a) not in ("emulator", "course") and any(_layer(b) == "emulator" for b in deps)]
    assert users == []


def test_every_import_of_gemmlab_names_a_module_or_a_name_it_has(graph):
    """An import the layer checks cannot place (a module that moved away: ``from .bench import x`` in a chapter module
    after bench moved to measure/) fails here instead of passing them unseen."""
    import importlib

    modules = _modules()
    missing = []
    for name, path in sorted(modules.items()):
        is_pkg = path.name == "__init__.py"
        pkg = [] if name == "" else name.split(".") if is_pkg else name.split(".")[:-1]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level:
                base = pkg[:len(pkg) - (node.level - 1)] if node.level > 1 else pkg
                mod = ".".join(base + ([node.module] if node.module else []))
            elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "gemmlab":
                mod = node.module[len("gemmlab."):] if "." in node.module else ""
            else:
                continue
            if mod not in modules:
                missing.append(f"{name}, line {node.lineno}: no module gemmlab.{mod}")
                continue
            for alias in node.names:
                sub = f"{mod}.{alias.name}" if mod else alias.name
                if sub not in modules and alias.name != "*" and not hasattr(
                        importlib.import_module("gemmlab" + (f".{mod}" if mod else "")), alias.name):
                    missing.append(f"{name}, line {node.lineno}: gemmlab.{mod} has no {alias.name}")
    assert missing == []


def test_family_layers_flow_one_way(graph):
    """Each host layer of gemmlab.family imports only the layers before it; of the family only the plan imports the
    kernels, and only inside functions (so import gemmlab stays light)."""
    for i, name in enumerate(FAMILY):
        for dep in graph[name]:
            if dep in FAMILY:
                assert FAMILY.index(dep) < i, f"{name} imports {dep}, a layer after it"
            if dep.startswith("kernels"):
                assert name == "family.plan", f"{name} imports the kernel {dep}"
    modules = _modules()
    for name in FAMILY:
        top = _imports(name, modules[name], modules, top_level_only=True)
        assert not [d for d in top if d.startswith("kernels")], f"{name} imports a kernel at import time"
    for kernel in (n for n in graph if n.startswith("kernels.")):
        assert not set(graph[kernel]) & {"family.plan", "family.api"}, kernel
        assert set(graph[kernel]) & set(FAMILY) <= FAMILY_BELOW_KERNELS, kernel


def test_import_does_not_load_the_compiler():
    code = "import sys, gemmlab; print('cutlass' in sys.modules, 'torch.cuda' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split()[0] == "False"


def test_the_public_calls_are_the_family_api():
    from gemmlab.family import api

    for name in ("gemm", "grouped_gemm", "grouped_gemm_list", "gated_dual_gemm"):
        assert getattr(gemmlab, name) is getattr(api, name) and callable(getattr(gemmlab, name))


def test_unknown_attribute():
    with pytest.raises(AttributeError, match="nope"):
        gemmlab.nope
