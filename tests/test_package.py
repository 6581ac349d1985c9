"""The package surface: light import, lazy public GEMM."""
import subprocess
import sys

import pytest

import gemmlab


def test_import_does_not_load_the_compiler():
    code = "import sys, gemmlab; print('cutlass' in sys.modules, 'torch.cuda' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split()[0] == "False"


def test_unknown_attribute():
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        gemmlab.nope
