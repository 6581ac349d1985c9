"""What the emulator reports when a kernel does something a GPU would do silently wrong (or hang on).

Every error names where it happened: the CTA, the warp, the lane(s), the PTX line and
the statement, so a learner can find the instruction in the kernel's PTX (and, from
its neighbours, the line of the Python kernel that produced it).
"""
from __future__ import annotations


class EmulatorError(RuntimeError):
    """A kernel misbehaved on the emulator (base class)."""

    def __init__(self, message: str, *, where: str = ""):
        self.message = message
        self.where = where
        super().__init__(f"{message}\n  at {where}" if where else message)


class Unsupported(EmulatorError):
    """An instruction, a mode or an operand form the emulator does not implement (it never guesses)."""


class MemoryFault(EmulatorError):
    """An access outside every allocation (global), past shared memory or tensor memory, or misaligned."""


class Deadlock(EmulatorError):
    """Every warp waits and no asynchronous operation is left to complete."""


class RaceError(EmulatorError):
    """An ordering rule of the PTX memory model was broken (e.g. a register read before its async result was
    waited for, shared memory written by threads then read by TMA/UMMA without ``fence.proxy.async``)."""


class BarrierError(EmulatorError):
    """An mbarrier or named barrier used against its rules (too many arrivals, uninitialised, ...)."""


class TmemError(EmulatorError):
    """Tensor memory used against its rules (alloc/dealloc/relinquish, access outside the allocation)."""
