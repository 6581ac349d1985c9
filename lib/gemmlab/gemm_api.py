"""``gemmlab.gemm(a, b, out=None)``: the course's public GEMM, dispatched by hardware tier.

(The module is ``gemm_api`` so that ``gemmlab.gemm`` can be the function.)

``C = A @ B`` with the meaning of ``torch.matmul``:

* ``a``: M x K, K-contiguous (row-major).
* ``b``: K x N, either N-contiguous (row-major K x N) or K-contiguous: the
  transposed view ``w.t()`` of an N x K weight stored row-major, as a linear
  layer keeps it. Both are free views; nothing is copied.
* BF16 or FP16 in (``a`` and ``b`` alike), FP32 accumulation, the output in
  ``out``'s dtype (BF16 or FP16; by default ``a``'s dtype), M x N row-major.
* Any M, N, K, as long as every contiguous dimension (K of ``a``, the
  contiguous one of ``b``, N of ``out``) is a multiple of 8 elements (16
  bytes: TMA's rule for global strides) and every tensor starts 16-byte
  aligned. Partial tiles are handled by TMA (zero fill, clipped stores).

Dispatch: on tier ``sm90`` the persistent kernel of :mod:`gemmlab.gemm_sm90`
with the configuration :func:`gemmlab.heuristic.choose` picks; on tier
``sm100`` the 2-CTA tcgen05 kernel of :mod:`gemmlab.gemm_sm100` (compile-verified
only: it has never run on a B200); a machine without either raises
:class:`gemmlab.tiers.TierError`. Kernels are compiled once per
(configuration, shapes, strides, dtypes) and cached, so a second call with
the same shapes launches without compiling.
"""
from __future__ import annotations

from .checks import check_tensor
from .tiers import detect_tier, require_tier, sm_count

#: Elements per 16 bytes for 2-byte types: the TMA alignment rule.
ALIGN_ELEMS = 8


def _dtypes():
    import torch

    return (torch.bfloat16, torch.float16)


def check_gemm_args(a, b, out=None):
    """Validate ``gemm``'s arguments; return ``(M, N, K, b_k_major)``. No GPU needed."""
    check_tensor("a", a, dtypes=_dtypes(), ndim=2, contiguous=False, device=None)
    check_tensor("b", b, dtypes=_dtypes(), ndim=2, contiguous=False, device=None)
    if a.dtype != b.dtype:
        raise TypeError(f"a and b must have the same dtype; got {a.dtype} and {b.dtype}")
    m, k = a.shape
    if b.shape[0] != k:
        raise ValueError(f"b must be K x N with K = a.shape[1] = {k} (C = a @ b); got shape {tuple(b.shape)}. "
                         "For an N x K weight w pass w.t().")
    n = b.shape[1]
    if a.stride(1) != 1 or a.stride(0) != k:
        raise ValueError(f"a must be K-contiguous (row-major M x K); got strides {tuple(a.stride())}")
    if k % ALIGN_ELEMS:
        raise ValueError(f"a's contiguous dimension K must be a multiple of {ALIGN_ELEMS} (16 bytes); got K={k}")
    if b.stride() == (n, 1):
        b_k_major = False
        if n % ALIGN_ELEMS:
            raise ValueError(f"b is N-contiguous, so N must be a multiple of {ALIGN_ELEMS} (16 bytes); got N={n}")
    elif b.stride() == (1, k):
        b_k_major = True
        if k % ALIGN_ELEMS:  # pragma: no cover - already caught for a
            raise ValueError(f"b is K-contiguous, so K must be a multiple of {ALIGN_ELEMS}; got K={k}")
    else:
        raise ValueError("b must be N-contiguous (row-major K x N) or K-contiguous (w.t() of a row-major "
                         f"N x K w); got strides {tuple(b.stride())}")
    if n % ALIGN_ELEMS:
        raise ValueError(f"the output's contiguous dimension N must be a multiple of {ALIGN_ELEMS} (16 bytes); "
                         f"got N={n}")
    for name, t in (("a", a), ("b", b)):
        if t.data_ptr() % 16:
            raise ValueError(f"{name} must start at a 16-byte aligned address")
    if out is not None:
        check_tensor("out", out, dtypes=_dtypes(), ndim=2, contiguous=True, device=None, align_bytes=16)
        if tuple(out.shape) != (m, n):
            raise ValueError(f"out must have shape (M, N) = ({m}, {n}); got {tuple(out.shape)}")
    return m, n, k, b_k_major


def gemm(a, b, out=None):
    """``out = a @ b`` on the GPU (see the module docstring for the rules); returns ``out``."""
    import torch

    m, n, k, b_k_major = check_gemm_args(a, b, out)
    tier = detect_tier()
    if tier == "sm90":
        for name, t in (("a", a), ("b", b)) + ((("out", out),) if out is not None else ()):
            if t.device.type != "cuda":
                raise ValueError(f"{name} must be on a cuda device; got {t.device}")
        if out is None:
            out = torch.empty((m, n), dtype=a.dtype, device=a.device)
        return _gemm_sm90(a, b, out)
    if tier == "sm100":
        from .gemm_sm100 import gemm_sm100

        return gemm_sm100(a, b, out)
    require_tier("gpu", "gemmlab.gemm")
    raise AssertionError("unreachable")  # pragma: no cover


def sm90_launch(a, b, out, cfg=None):
    """The compiled launch (``run()``) of the sm90 kernel for these tensors; cached compile."""
    from .compile import launcher
    from .gemm_sm90 import gemm_host
    from .heuristic import choose

    m, k = a.shape
    n = b.shape[1]
    sms = sm_count(a.device)
    cfg = cfg or choose(m, n, k, sms)
    mct, nct = cfg.cluster_tiles(m, n)
    clusters = min(mct * nct, sms // cfg.cluster_size)
    # The kernel reads B as N x K: b.t() is a free view with the same memory.
    return launcher(gemm_host(cfg, clusters), a, b.t(), out)


def _gemm_sm90(a, b, out):
    import torch

    if a.shape[0] == 1:
        # Found on an H200: with static shapes CuTe DSL folds an extent of 1 away, so
        # A's and C's tensor maps become 1-D and the kernel (built for 2-D boxes)
        # dies with an illegal instruction. Pad M = 1 to two rows (a tiny copy).
        a2 = torch.zeros((2, a.shape[1]), dtype=a.dtype, device=a.device)
        a2[:1].copy_(a)
        out2 = torch.empty((2, out.shape[1]), dtype=out.dtype, device=out.device)
        sm90_launch(a2, b, out2)()
        out.copy_(out2[:1])
        return out
    sm90_launch(a, b, out)()
    return out
