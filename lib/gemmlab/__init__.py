"""gemmlab: the library behind the notebook course.

Each chapter's code lives in a short module named after what it holds; the
notebooks import these modules and render their source. Import what you need::

    from gemmlab import tiers, ldst, mbarrier

``gemmlab.gemm(a, b, out=None)`` is the course's public GEMM: chapter 07's
persistent kernel on Hopper, chapter 10's on Blackwell. It is imported on first
use, so ``import gemmlab`` stays light (no compiler import).
"""
__version__ = "0.1.0"

from .tiers import TierError, detect_tier, require_tier  # noqa: F401


def __getattr__(name):
    if name == "gemm":
        from .gemm import gemm

        return gemm
    raise AttributeError(f"module 'gemmlab' has no attribute {name!r}")
