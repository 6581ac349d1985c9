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
    from gemmlab.gemm_api import gemm

    assert gemmlab.gemm is gemm and callable(gemmlab.gemm)
    import gemmlab.gemm_api as api  # importing the module must not shadow the function

    assert gemmlab.gemm is api.gemm


def test_unknown_attribute():
    with pytest.raises(AttributeError, match="nope"):
        gemmlab.nope


def test_gemm_dispatches_by_tier(monkeypatch):
    import torch

    import gemmlab.gemm_api as api
    import gemmlab.gemm_sm100 as g100
    from gemmlab import tiers

    a = torch.zeros(64, 32, dtype=torch.bfloat16)
    b = torch.zeros(32, 48, dtype=torch.bfloat16)
    monkeypatch.setattr(api, "detect_tier", lambda: "sm100")
    monkeypatch.setattr(g100, "gemm_sm100", lambda a, b, out=None: ("sm100 path", tuple(b.shape)))
    assert gemmlab.gemm(a, b) == ("sm100 path", (32, 48))
    for tier in ("cpu",):
        monkeypatch.setattr(api, "detect_tier", lambda: tier)
        monkeypatch.setattr(tiers, "detect_tier", lambda: tier)
        with pytest.raises(gemmlab.TierError, match="gemmlab.gemm needs tier sm90 or sm100"):
            gemmlab.gemm(a, b)
    with pytest.raises(ValueError, match="K x N"):  # arguments are checked before any tier question
        gemmlab.gemm(a, torch.zeros(48, 40, dtype=torch.bfloat16))
