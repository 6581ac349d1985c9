"""The GEMM contract: what ``gemmlab.gemm`` accepts, checked once, as a frozen problem.

``C = A @ B`` with the meaning of ``torch.matmul``, on both architectures:

* ``a``: M x K, K-contiguous (row-major, rows packed: stride (K, 1)).
* ``b``: K x N, either N-contiguous (row-major K x N) or K-contiguous (the
  ``w.t()`` view of an N x K weight stored row-major, as a linear layer keeps
  it). Both are free views; nothing is copied.
* BF16 or FP16 in (``a`` and ``b`` alike), FP32 accumulation, the output in
  ``out``'s dtype (BF16 or FP16; by default ``a``'s dtype), M x N row-major.
* Any M, N, K >= 1, as long as every contiguous dimension (K of ``a``, the
  contiguous one of ``b``, N of ``out``) is a multiple of 8 elements (16 bytes:
  TMA's rule for global strides) and every tensor starts 16-byte aligned.

Everything here runs on the CPU tier: bad input gets a ``TypeError`` or
``ValueError`` naming the argument and the rule before anything compiles or
launches. The only per-call work that cannot be cached by shape, the
alignment of the data pointers, is :func:`check_alignment`.

M = 1 (and any size-1 dimension): torch may give a size-1 dimension any
stride (``torch.randn(k, 1).t()`` has strides (1, 1)); the stride of a
dimension of size 1 never addresses anything, so :func:`canonical` rewrites it
to the packed value before a tensor map is built from it. Kernels compiled for
static shapes (chapter 10's) also meet the DSL folding an extent of 1 away;
:func:`pad_rows` is their fix (two rows, one of them zero).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..checks import check_choice, check_int

#: TMA's alignment rule: tensor starts and every stride but the innermost a multiple of 16 bytes.
ALIGN_BYTES = 16
#: The dtypes ``gemmlab.gemm`` takes and writes, by torch name.
IN_DTYPES = ("bfloat16", "float16")
OUT_DTYPES = ("bfloat16", "float16")
#: Bits per element of every dtype the family knows (FP4 packs two values per byte).
DTYPE_BITS = {"bfloat16": 16, "float16": 16, "float32": 32, "float8_e4m3fn": 8, "float8_e5m2": 8,
              "float4_e2m1": 4}


def dtype_name(dtype) -> str:
    """``torch.bfloat16`` -> ``"bfloat16"`` (also accepts the name itself)."""
    return str(dtype).replace("torch.", "")


def dtype_bytes(name: str) -> float:
    check_choice("dtype", name, tuple(DTYPE_BITS))
    return DTYPE_BITS[name] / 8


@dataclass(frozen=True)
class GemmProblem:
    """One GEMM as the heuristics and plans see it: sizes, dtypes and B's layout, nothing else."""

    m: int
    n: int
    k: int
    dtype: str = "bfloat16"  # of a and b
    out_dtype: str = "bfloat16"
    b_major: str = "k"  # "k": b is w.t() of an N x K weight; "n": b is row-major K x N

    def __post_init__(self):
        for name in ("m", "n", "k"):  # stored as Python ints: numpy ints overflow in .flops
            object.__setattr__(self, name, check_int(name, getattr(self, name), lo=1))
        check_choice("dtype", self.dtype, IN_DTYPES)
        check_choice("out_dtype", self.out_dtype, OUT_DTYPES)
        check_choice("b_major", self.b_major, ("k", "n"))
        align = int(ALIGN_BYTES // dtype_bytes(self.dtype))
        if self.k % align:
            raise ValueError(f"K must be a multiple of {align} (16 bytes of a's rows); got K={self.k}")
        if self.n % align:
            raise ValueError(f"N must be a multiple of {align} (16 bytes of the output's rows); got N={self.n}")

    @property
    def flops(self) -> int:
        return 2 * self.m * self.n * self.k

    def min_bytes(self) -> float:
        """Bytes of A + B read once and C written once: the memory floor of any kernel."""
        e, o = dtype_bytes(self.dtype), dtype_bytes(self.out_dtype)
        return e * (self.m * self.k + self.k * self.n) + o * self.m * self.n


def _torch_dtypes():
    import torch

    return {"bfloat16": torch.bfloat16, "float16": torch.float16}


def _packed(t) -> bool:
    """Row-major with rows packed, ignoring the stride of size-1 dimensions (they address nothing)."""
    rows, cols = t.shape
    return (t.stride(1) == 1 or cols == 1) and (t.stride(0) == cols or rows == 1)


def problem_of(a, b, out=None) -> GemmProblem:
    """Validate ``gemm``'s arguments and describe them as a :class:`GemmProblem`. No GPU needed."""
    import torch

    dts = tuple(_torch_dtypes().values())
    for name, t in (("a", a), ("b", b)) + ((("out", out),) if out is not None else ()):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor; got {type(t).__name__}")
        if t.dtype not in dts:
            raise TypeError(f"{name} must have dtype bfloat16 or float16; got {dtype_name(t.dtype)}")
        if t.dim() != 2:
            raise ValueError(f"{name} must be 2-D; got shape {tuple(t.shape)}")
        if t.numel() == 0:
            raise ValueError(f"{name} must hold at least one element; got shape {tuple(t.shape)}")
    if a.dtype != b.dtype:
        raise TypeError(f"a and b must have the same dtype; got {dtype_name(a.dtype)} and {dtype_name(b.dtype)}")
    m, k = a.shape
    if b.shape[0] != k:
        raise ValueError(f"b must be K x N with K = a.shape[1] = {k} (C = a @ b); got shape {tuple(b.shape)}. "
                         "For an N x K weight w pass w.t().")
    n = b.shape[1]
    if a.stride(1) != 1 and k > 1:
        raise ValueError(f"a must be K-contiguous (row-major M x K, stride 1 along K); got strides {tuple(a.stride())}. Pass a.contiguous().")
    if not _packed(a):
        raise ValueError(f"a's rows must be packed (row stride = K = {k}); got strides {tuple(a.stride())}. "
                         "Pass a.contiguous() for a row-strided view.")
    if _packed(b):  # K and N are multiples of 8, so at most one of the two layouts can match
        b_major = "n"
    elif _packed(b.t()):
        b_major = "k"
    else:
        raise ValueError("b must be N-contiguous (row-major K x N) or K-contiguous (w.t() of a row-major "
                         f"N x K w), with packed rows; got strides {tuple(b.stride())}")
    out_dtype = dtype_name(out.dtype if out is not None else a.dtype)
    if out is not None:
        if tuple(out.shape) != (m, n):
            raise ValueError(f"out must have shape (M, N) = ({m}, {n}); got {tuple(out.shape)}")
        if not _packed(out):
            raise ValueError(f"out must be contiguous (row-major M x N, rows packed); got strides {tuple(out.stride())}")
    prob = GemmProblem(m, n, k, dtype_name(a.dtype), out_dtype, b_major)
    check_alignment(a, b, out)
    return prob


def check_alignment(a, b, out=None) -> None:
    """Every tensor must start 16-byte aligned (TMA's rule); the one check repeated on every call."""
    if (a.data_ptr() | b.data_ptr() | (out.data_ptr() if out is not None else 0)) % ALIGN_BYTES:
        for name, t in (("a", a), ("b", b), ("out", out)):
            if t is not None and t.data_ptr() % ALIGN_BYTES:
                raise ValueError(f"{name} must start at a 16-byte aligned address; its data pointer is "
                                 f"{t.data_ptr() % ALIGN_BYTES} bytes past alignment")


def check_devices(a, b, out=None) -> None:
    """All tensors on one CUDA device (checked when a plan is made; the plan cache is keyed by device)."""
    dev = a.device
    for name, t in (("a", a), ("b", b), ("out", out)):
        if t is None:
            continue
        if t.device.type != "cuda":
            raise ValueError(f"{name} must be on a cuda device; got {t.device}")
        if t.device != dev:
            raise ValueError(f"a, b and out must be on the same device; got {dev} and {t.device} ({name})")


def canonical(t, row_major: bool = True):
    """``t`` with packed strides, rewriting the stride of a size-1 dimension (a free view; ``t`` if already so).

    ``row_major``: strides ``(cols, 1)``; else ``(1, rows)`` (a K-contiguous ``b``).
    """
    want = (t.shape[1], 1) if row_major else (1, t.shape[0])
    return t if t.stride() == want else t.as_strided(t.shape, want)


def canonical_operands(a, b, out, b_major: str):
    """``(a, b, out)`` as the compiled kernels expect them: :func:`canonical` of each (``out`` may be None)."""
    return canonical(a), canonical(b, row_major=b_major == "n"), None if out is None else canonical(out)


def pad_rows(a, out):
    """For kernels compiled with static shapes: M = 1 becomes two rows (the second zero); returns ``(a2, out2)``.

    With static shapes CuTe DSL folds an extent of 1 away, so A's and C's tensor
    maps would become 1-D while the kernel issues 2-D boxes (found on an H200:
    an illegal instruction). The caller copies ``out2[:1]`` back.
    """
    import torch

    a2 = torch.zeros((2, a.shape[1]), dtype=a.dtype, device=a.device)
    a2[:1].copy_(a)
    out2 = torch.empty((2, out.shape[1]), dtype=out.dtype, device=out.device)
    return a2, out2
