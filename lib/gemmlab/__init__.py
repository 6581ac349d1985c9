"""gemmlab: the library behind the notebook course.

Each chapter's code lives in a short module named after what it holds; the
notebooks import these modules and render their source. Import what you need::

    from gemmlab import tiers, ldst, mbarrier

The house, from the ground up (``DEVELOPING.md`` draws it): the core (``checks``,
``tiers``, ``hardware``, ``compile``, ``figures``); the chapter modules, flat;
the GEMM family's host side (:mod:`gemmlab.family`) around its device code
(:mod:`gemmlab.kernels`); measurement (:mod:`gemmlab.measure`); the course
machinery (:mod:`gemmlab.course`).

The family's four public calls, through :mod:`gemmlab.family.api`:

* ``gemmlab.gemm(a, b, out=None)``: ``a @ b``, chapter 07's persistent kernel on
  Hopper, chapter 10's on Blackwell;
* ``gemmlab.grouped_gemm(a, b, offs, out=None)``: chapter 08's grouped GEMM with
  ``torch._grouped_mm``'s ragged MoE meaning (``grouped_gemm_list`` for a list of
  independent problems), on Hopper;
* ``gemmlab.gated_dual_gemm``: chapter 11's NVFP4 ``silu(A B1^T) * (A B2^T)``
  (SM100 kernel on Blackwell, its Hopper twin on H100/H200).

The kernels are imported on a call's first use, so ``import gemmlab`` stays light
(no compiler).
"""
__version__ = "0.1.0"

from .family.api import (check_grouped_offs, gated_dual_gemm, gemm, grouped_gemm,  # noqa: F401  (kernels load lazily)
                         grouped_gemm_list)
from .tiers import TierError, detect_tier, require_tier  # noqa: F401
