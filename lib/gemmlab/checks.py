"""Argument checks at the Python boundary: bad input fails before any launch.

Each check raises ``TypeError`` (wrong kind of object or dtype) or ``ValueError``
(wrong shape, layout, alignment or device) with a message that names the
argument and the rule it broke.
"""
from __future__ import annotations

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


def check_int(name: str, value, *, lo: int | None = None, hi: int | None = None, multiple_of: int = 1,
              power_of_two: bool = False) -> int:
    """An integer argument within bounds (numpy integers accepted, returned as ``int``)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int; got {type(value).__name__}")
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


def check_choice(name: str, value, choices):
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, choices))}; got {value!r}")
    return value
