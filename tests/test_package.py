"""The package surface: light import, lazy public GEMM."""
import subprocess
import sys

import pytest

import gemmlab


def test_import_does_not_load_the_compiler():
    code = "import sys, gemmlab; print('cutlass' in sys.modules, 'torch.cuda' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split()[0] == "False"


def test_gemm_is_the_public_function():
    from gemmlab.family.api import gemm

    assert gemmlab.gemm is gemm and callable(gemmlab.gemm)


def test_unknown_attribute():
    with pytest.raises(AttributeError, match="nope"):
        gemmlab.nope


def test_family_imports_flow_one_way():
    """Each layer of gemmlab.family imports only the layers above it (no cycle), read from the source."""
    import ast
    from pathlib import Path

    order = ["problem", "configs", "heuristic_sm90", "heuristic_sm100", "heuristic_grouped", "heuristic_gated", "plan",
             "api"]
    kernels = {"gemm_sm90", "gemm_sm100"}  # imported by plan (below configs and the heuristics)
    root = Path(gemmlab.__file__).parent
    for i, name in enumerate(order):
        tree = ast.parse((root / "family" / f"{name}.py").read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level >= 1 and node.module:
                mod = node.module.split(".")[-1] if node.level == 1 else node.module.split(".")[0]
                if node.level == 1 and mod in order:
                    assert order.index(mod) < i, f"family.{name} imports family.{mod}, a layer below it"
                if node.level == 2 and node.module.split(".")[-1] in kernels:
                    assert name in ("plan",), f"family.{name} imports the kernel {mod}"
    for kernel in kernels:  # the kernels import the configs, never the plan, the api or the heuristics' users
        tree = ast.parse((root / "kernels" / f"{kernel}.py").read_text())
        mods = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        assert not mods & {"family.plan", "family.api"}, kernel


def test_grouped_layers_flow_one_way():
    """Chapter 08: the kernel module never imports the call layer; the call layer loads the kernel lazily."""
    import ast
    from pathlib import Path

    root = Path(gemmlab.__file__).parent

    def imports(name, top_level_only=False):
        tree = ast.parse((root / f"{name}.py").read_text())
        nodes = tree.body if top_level_only else list(ast.walk(tree))
        return {n.module for n in nodes if isinstance(n, ast.ImportFrom) and n.module}

    assert not imports("kernels/grouped_sm90") & {"family.api", "family.plan", "grouped_model", "measure"}
    assert "kernels.grouped_sm90" not in imports("family/plan", top_level_only=True)  # import gemmlab stays light
    assert gemmlab.grouped_gemm is gemmlab.family.api.grouped_gemm
