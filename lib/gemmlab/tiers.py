"""Hardware tiers: which part of the course this machine can run.

The course has three tiers (see COURSE.md):

==========  =========================  ==========================================
tier        machine                    what runs
==========  =========================  ==========================================
``cpu``     any machine, no GPU        host code, models, compile-only cells
``sm90``    H100 / H200                plus every Hopper kernel launch
``sm100``   B200 / GB200               plus the tcgen05 kernels
==========  =========================  ==========================================

Tiers are ordered: a cell that needs ``sm90`` work runs on an ``sm100`` machine
only if its kernel is portable (the ``gpu`` tag), while ``sm90``-only kernels
(``wgmma``) are tagged ``sm90`` and ``sm100``-only kernels ``sm100``.
"""
from __future__ import annotations

import functools
import os

TIERS = ("cpu", "sm90", "sm100")

#: What each tier means to a person reading an error message.
TIER_HARDWARE = {
    "cpu": "any machine (no GPU needed)",
    "sm90": "an NVIDIA Hopper GPU (H100/H200, compute capability 9.0)",
    "sm100": "an NVIDIA Blackwell datacenter GPU (B200/GB200, compute capability 10.0)",
}

#: The CuTe DSL target that kernels of a GPU tier are compiled for.
TIER_TARGET = {"sm90": "sm_90a", "sm100": "sm_100a"}

#: Environment variable a GPU machine sets to say "this machine has that tier":
#: tests and notebook cells that need it then become mandatory (they fail, never skip).
REQUIRE_ENV = "GEMMLAB_TIER"


class TierError(RuntimeError):
    """Raised when a call needs hardware this machine does not have."""


def _tier_from_capability(major: int, minor: int) -> str:
    if major == 9:
        return "sm90"
    if major == 10:
        return "sm100"
    # Ampere/Ada/consumer Blackwell run none of the course's GPU cells: no TMA
    # multicast/wgmma (pre-Hopper) or no tcgen05 (sm_120).
    return "cpu"


@functools.lru_cache(maxsize=None)
def detect_tier() -> str:
    """The tier of this machine: ``"cpu"``, ``"sm90"`` or ``"sm100"``.

    Looks at CUDA device 0 through torch. A machine whose GPU is neither
    Hopper nor datacenter Blackwell counts as ``cpu``.
    """
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a hard dependency
        return "cpu"
    if not torch.cuda.is_available():
        return "cpu"
    major, minor = torch.cuda.get_device_capability(0)
    return _tier_from_capability(major, minor)


def required_tier() -> str | None:
    """The tier the environment says this machine has (``$GEMMLAB_TIER``), if any."""
    value = os.environ.get(REQUIRE_ENV, "").strip()
    if not value:
        return None
    if value not in TIERS:
        raise ValueError(f"${REQUIRE_ENV} must be one of {', '.join(TIERS)}; got {value!r}")
    return value


def tier_satisfies(have: str, need: str) -> bool:
    """Whether a machine of tier ``have`` runs work that needs tier ``need``.

    ``need`` may also be ``"gpu"``: any GPU tier.
    """
    if have not in TIERS:
        raise ValueError(f"unknown machine tier {have!r}; expected {', '.join(TIERS)}")
    if need == "gpu":
        return have in ("sm90", "sm100")
    if need == "sm90":
        # sm_90a kernels (wgmma, setmaxnreg) only run on Hopper itself.
        return have == "sm90"
    if need == "sm100":
        return have == "sm100"
    if need == "cpu":
        return True
    raise ValueError(f"unknown tier {need!r}; expected cpu, gpu, sm90 or sm100")


def require_tier(need: str, what: str) -> str:
    """Raise :class:`TierError` unless this machine runs ``what``, which needs ``need``.

    Returns the machine's tier. ``need`` is ``"gpu"`` (any course GPU),
    ``"sm90"`` or ``"sm100"``.
    """
    have = detect_tier()
    if tier_satisfies(have, need):
        return have
    if need == "gpu":
        wanted = "tier sm90 or sm100 (an H100/H200 or B200 GPU)"
    else:
        wanted = f"tier {need} ({TIER_HARDWARE[need]})"
    raise TierError(
        f"{what} needs {wanted}; this machine is tier {have}"
        + (" (no usable CUDA GPU visible)" if have == "cpu" else "")
        + ". Compile-only functions (compile_*) run on any tier."
    )


def device_target() -> str:
    """The CuTe DSL ``--gpu-arch`` for the GPU of this machine (``sm_90a``/``sm_100a``)."""
    have = require_tier("gpu", "compiling for this machine's GPU")
    return TIER_TARGET[have]
