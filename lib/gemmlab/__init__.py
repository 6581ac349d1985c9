"""gemmlab: the library behind the notebook course.

Each chapter's code lives in a short module named after what it holds; the
notebooks import these modules and render their source. Import what you need::

    from gemmlab import tiers, ldst, mbarrier

``gemmlab.gemm(a, b, out=None)`` is the course's public GEMM (``a @ b``):
chapter 07's persistent kernel on Hopper, chapter 10's on Blackwell, through
the layers of :mod:`gemmlab.family`. The kernels are imported on its first
call, so ``import gemmlab`` stays light (no compiler).

``gemmlab.grouped_gemm(a, b, offs, out=None)`` is chapter 08's grouped GEMM
with ``torch._grouped_mm``'s ragged MoE meaning (``grouped_gemm_list`` for a
list of independent problems), on Hopper. ``gemmlab.gated_dual_gemm`` is
chapter 11's NVFP4 ``silu(A B1^T) * (A B2^T)`` (SM100 kernel on Blackwell, its
Hopper twin on H100/H200).
"""
__version__ = "0.1.0"

from .family.api import gemm  # noqa: F401  (imports the kernels lazily)
from .grouped import grouped_gemm, grouped_gemm_list  # noqa: F401  (likewise)
from .measure.dual_gemm import gated_dual_gemm  # noqa: F401  (likewise)
from .tiers import TierError, detect_tier, require_tier  # noqa: F401
