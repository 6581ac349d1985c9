"""Argument checks name the argument and the rule they enforce."""
import pytest
import torch

from gemmlab.checks import check_choice, check_int, check_same, check_tensor
from gemmlab.compile import check_target


def test_check_tensor_accepts_good_input():
    t = torch.zeros(64, dtype=torch.float32)
    assert check_tensor("x", t, dtypes=[torch.float32], ndim=1, device="cpu", align_bytes=16) is t


@pytest.mark.parametrize("kwargs,value,exc,match", [
    ({}, [1, 2], TypeError, "x must be a torch.Tensor"),
    ({"dtypes": [torch.bfloat16]}, torch.zeros(4), TypeError, "x must have dtype bfloat16; got float32"),
    ({"ndim": 2}, torch.zeros(4), ValueError, r"x must be 2-D; got shape \(4,\)"),
    ({"device": "cuda"}, torch.zeros(4), ValueError, "x must be on a cuda device; got cpu"),
    ({}, torch.zeros(4, 4).t(), ValueError, "x must be contiguous"),
    ({"numel_multiple": 8}, torch.zeros(12), ValueError, "multiple of 8 elements; got 12"),
    ({"min_numel": 1}, torch.zeros(0), ValueError, "at least 1 element"),
    ({"align_bytes": 16}, torch.zeros(8)[1:], ValueError, "16-byte aligned"),
])
def test_check_tensor_errors(kwargs, value, exc, match):
    with pytest.raises(exc, match=match):
        check_tensor("x", value, **{"device": "cpu", **kwargs})


def test_check_same():
    a = torch.zeros(4)
    check_same("a", a, "b", torch.ones(4))
    with pytest.raises(ValueError, match="a and b must have the same shape"):
        check_same("a", a, "b", torch.zeros(5))
    with pytest.raises(TypeError, match="same dtype"):
        check_same("a", a, "b", torch.zeros(4, dtype=torch.int32))


def test_check_int():
    assert check_int("stages", 4, lo=1, hi=8, power_of_two=True) == 4
    with pytest.raises(TypeError, match="stages must be an int"):
        check_int("stages", 4.0)
    with pytest.raises(TypeError):
        check_int("stages", True)
    with pytest.raises(ValueError, match="stages must be >= 1; got 0"):
        check_int("stages", 0, lo=1)
    with pytest.raises(ValueError, match="<= 8"):
        check_int("stages", 9, hi=8)
    with pytest.raises(ValueError, match="multiple of 16"):
        check_int("n", 20, multiple_of=16)
    with pytest.raises(ValueError, match="power of two"):
        check_int("n", 12, power_of_two=True)


def test_check_choice_and_target():
    assert check_choice("width", 4, (1, 2, 4)) == 4
    with pytest.raises(ValueError, match="width must be one of 1, 2, 4; got 3"):
        check_choice("width", 3, (1, 2, 4))
    assert check_target("sm_100a") == "sm_100a"
    with pytest.raises(ValueError, match="target must be one of sm_90a, sm_100a"):
        check_target("sm_90")
