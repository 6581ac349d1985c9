"""gemmlab: the library behind the notebook course.

Each chapter's code lives in a short module named after what it holds; the
notebooks import these modules and render their source. Import what you need::

    from gemmlab import tiers, ldst, mbarrier
"""
__version__ = "0.1.0"

from .tiers import TierError, detect_tier, require_tier  # noqa: F401
