"""Argument checks at the Python boundary: bad input fails before any launch.

Each check raises ``TypeError`` (wrong kind of object or dtype) or ``ValueError``
(wrong shape, layout, alignment or device) with a message that names the
argument and the rule it broke.
"""
from __future__ import annotations

import math
import numbers
from typing import Iterable


def check_tensor(
    name: str,
    t,
    *,
    dtypes: Iterable | None = None,
    ndim: int | None = None,
    contiguous: bool = True,
    device: str | None = "cuda",
    align_bytes: int = 0,
    numel_multiple: int = 1,
    min_numel: int = 1,
):
    """Validate tensor argument ``name``; return it unchanged.

    ``align_bytes``: the data pointer must be a multiple of it (vector and bulk
    copies move 16-byte pieces). ``numel_multiple``: the element count must be a
    multiple of it (a kernel with no tail handling).
    """
    import torch

    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor; got {type(t).__name__}")
    if dtypes is not None:
        dtypes = tuple(dtypes)
        if t.dtype not in dtypes:
            allowed = ", ".join(str(d).replace("torch.", "") for d in dtypes)
            raise TypeError(f"{name} must have dtype {allowed}; got {str(t.dtype).replace('torch.', '')}")
    if ndim is not None and t.dim() != ndim:
        raise ValueError(f"{name} must be {ndim}-D; got shape {tuple(t.shape)}")
    if device is not None and t.device.type != device:
        raise ValueError(f"{name} must be on a {device} device; got {t.device}")
    if contiguous and not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous (row-major, no gaps); got strides {tuple(t.stride())}")
    if t.numel() < min_numel:
        raise ValueError(f"{name} must hold at least {min_numel} element(s); got {t.numel()}")
    if numel_multiple > 1 and t.numel() % numel_multiple:
        raise ValueError(
            f"{name} must hold a multiple of {numel_multiple} elements; got {t.numel()}"
        )
    if align_bytes > 1 and t.data_ptr() % align_bytes:
        raise ValueError(
            f"{name} must start at a {align_bytes}-byte aligned address; "
            f"its data pointer is {t.data_ptr() % align_bytes} bytes past alignment"
        )
    return t


def check_same(name_a: str, a, name_b: str, b):
    """``a`` and ``b`` must match in shape, dtype and device."""
    if a.shape != b.shape:
        raise ValueError(f"{name_a} and {name_b} must have the same shape; got {tuple(a.shape)} and {tuple(b.shape)}")
    if a.dtype != b.dtype:
        raise TypeError(f"{name_a} and {name_b} must have the same dtype; got {a.dtype} and {b.dtype}")
    if a.device != b.device:
        raise ValueError(f"{name_a} and {name_b} must be on the same device; got {a.device} and {b.device}")


def scalar(value):
    """``value`` with a 0-d numpy array or 0-d torch tensor unwrapped to its Python number; anything else as is.

    numpy scalars (``np.int64``, ``np.float32``) already are :mod:`numbers`; a 0-d array or tensor is the
    same number in a box (``torch.tensor(3)``, ``x.sum()``), so the checks take it too.
    """
    mod = type(value).__module__ or ""
    if mod.startswith(("torch", "numpy")) and getattr(value, "ndim", None) == 0 and hasattr(value, "item"):
        return value.item()
    return value


def _shown(value) -> str:
    """A short description of ``value`` for a message: its type, and its value when that is short."""
    text = repr(value)
    name = type(value).__name__
    return name if len(text) > 60 or text == name else f"{name} {text}"


def _is_bool(value) -> bool:
    return isinstance(value, bool) or type(value).__name__ == "bool_"


def check_int(name: str, value, *, lo: int | None = None, hi: int | None = None, multiple_of: int = 1,
              power_of_two: bool = False) -> int:
    """An integer argument within bounds, returned as a Python ``int``.

    numpy integers and 0-d integer arrays or tensors count (``numbers.Integral``); ``bool`` and floats
    (even ``128.0``) do not: nothing is silently reinterpreted.
    """
    value = scalar(value)
    if _is_bool(value) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int; got {_shown(value)}")
    value = int(value)
    if lo is not None and value < lo:
        raise ValueError(f"{name} must be >= {lo}; got {value}")
    if hi is not None and value > hi:
        raise ValueError(f"{name} must be <= {hi}; got {value}")
    if multiple_of > 1 and value % multiple_of:
        raise ValueError(f"{name} must be a multiple of {multiple_of}; got {value}")
    if power_of_two and value & (value - 1):
        raise ValueError(f"{name} must be a power of two; got {value}")
    return value


def check_real(name: str, value, *, lo: float | None = None, hi: float | None = None, lo_open: bool = False,
               hi_open: bool = False) -> float:
    """A finite real argument within bounds, returned as a Python ``float``.

    Ints, floats, numpy scalars and 0-d arrays or tensors count (``numbers.Real``); ``bool``, NaN and
    infinities do not. ``lo_open`` / ``hi_open``: the bound itself is excluded (``> lo`` instead of ``>= lo``).
    """
    value = scalar(value)
    if _is_bool(value) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number; got {_shown(value)}")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number; got {value}")
    if lo is not None and (value <= lo if lo_open else value < lo):
        raise ValueError(f"{name} must be {'>' if lo_open else '>='} {lo:g}; got {value:g}")
    if hi is not None and (value >= hi if hi_open else value > hi):
        raise ValueError(f"{name} must be {'<' if hi_open else '<='} {hi:g}; got {value:g}")
    return value


def _same_kind(value, choice) -> bool:
    """Whether ``value`` is the same kind of thing as ``choice`` (so ``==`` between them means the same)."""
    if _is_bool(choice):
        return _is_bool(value)
    if isinstance(choice, numbers.Integral):
        return isinstance(value, numbers.Integral) and not _is_bool(value)
    if isinstance(choice, numbers.Real):
        return isinstance(value, numbers.Real) and not _is_bool(value)
    if isinstance(choice, str):
        return isinstance(value, str)
    if isinstance(choice, tuple):
        return (isinstance(value, (tuple, list)) and len(value) == len(choice)
                and all(_same_kind(scalar(v), c) for v, c in zip(value, choice)))
    return True


def check_choice(name: str, value, choices):
    """``value`` must be one of ``choices``, and of the same kind (``128.0`` is not the choice ``128``, ``1`` is
    not ``True``, ``(2.0, 1)`` is not ``(2, 1)``); returns the matching choice itself."""
    v = scalar(value)
    allowed = ", ".join(map(repr, choices))
    for c in choices:
        same = _same_kind(v, c)
        if isinstance(c, tuple) and same:
            equal = tuple(scalar(x) for x in v) == c
        else:
            try:
                equal = bool(v == c)
            except Exception:  # an array or tensor compared elementwise: not one of the choices
                equal = False
        if equal and same:
            return c
        if equal:
            raise TypeError(f"{name} must be one of {allowed}; got {_shown(value)}, equal to {c!r} but of "
                            f"another type")
    raise ValueError(f"{name} must be one of {allowed}; got {value!r}")
