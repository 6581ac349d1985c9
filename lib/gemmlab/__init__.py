"""gemmlab: the library behind the notebook course.

Each chapter's code lives in a short module named after what it holds; the
notebooks import these modules and render their source. Import what you need::

    from gemmlab import tiers, ldst, mbarrier

``gemmlab.gemm(a, b, out=None)`` is the course's public GEMM (``a @ b``):
chapter 07's persistent kernel on Hopper, chapter 10's on Blackwell, through
the layers of :mod:`gemmlab.family`. The kernels are imported on its first
call, so ``import gemmlab`` stays light (no compiler).
"""
__version__ = "0.1.0"

from .family.api import gemm  # noqa: F401  (imports the kernels lazily)
from .tiers import TierError, detect_tier, require_tier  # noqa: F401
