"""The emulator's memories and the address windows that reach them.

* **Global**: the process's own memory. The tensors handed to a run (CPU torch
  tensors) are registered as allocations; any global access outside them is a
  :class:`~gemmlab.emulator.errors.MemoryFault` instead of a stray read.
* **Shared**: one byte array per CTA. The CTA of cluster rank ``r`` sees its own
  shared memory at ``r << 24 | (SHARED_BASE + offset)`` (``SHARED_BASE`` is
  1024-aligned, so swizzled tiles keep their alignment), and that address is also
  its ``shared::cluster`` address: PTX says the shared::cta window is contained in
  the shared::cluster window, and the rank in bits 24 and up is what CUTLASS and the
  DSL rely on when they clear bit 24 of a barrier's address to name the even CTA of
  a pair (``Sm100MmaPeerBitMask = 0xFEFFFFFF`` in CUTLASS; the ``and.b32 ...,
  -16777224`` in chapter 10's PTX).
* **Generic** addresses: host addresses are global; ``GENERIC_SHARED + s`` is the
  shared(::cluster) address ``s``; ``GENERIC_PARAM + o`` is byte ``o`` of the
  kernel's parameter buffer (``cvta.param``: how kernels hand a tensor map in a
  parameter to ``cp.async.bulk.tensor``).
* **Tensor memory** (sm_100): per CTA 128 lanes x 512 columns of 32 bits; an address
  is ``lane << 16 | column`` (PTX ISA, "Tensor Memory" / tcgen05 addressing).
"""
from __future__ import annotations

import bisect
import ctypes

import numpy as np

from .errors import MemoryFault

SHARED_BASE = 0x400
CLUSTER_SHIFT = 24
GENERIC_SHARED = 0xA000_0000_0000_0000
GENERIC_PARAM = 0xB000_0000_0000_0000
GENERIC_LOCAL = 0xC000_0000_0000_0000
WINDOW_MASK = 0xF000_0000_0000_0000
TMEM_LANES = 128
TMEM_COLUMNS = 512


def split_cluster(addr: int, own_rank: int = 0) -> tuple[int, int]:
    """A ``shared::cluster`` address -> ``(CTA rank in the cluster, the same address)``."""
    return addr >> CLUSTER_SHIFT, addr


def cluster_address(rank: int, addr: int) -> int:
    """The address of the same shared variable in the CTA of cluster rank ``rank`` (``mapa``)."""
    return (rank << CLUSTER_SHIFT) | (addr & ((1 << CLUSTER_SHIFT) - 1))


def shared_base(rank: int) -> int:
    """Where the shared memory of the CTA of cluster rank ``rank`` starts in the shared window."""
    return (rank << CLUSTER_SHIFT) | SHARED_BASE


class GlobalMemory:
    """Registered host allocations; reads and writes go straight to their bytes."""

    def __init__(self):
        self._starts: list[int] = []
        self._regions: list[tuple[int, int, str, np.ndarray, object]] = []

    def add(self, start: int, nbytes: int, name: str, keep=None):
        """Register ``nbytes`` at host address ``start`` (``keep``: an object that owns the memory)."""
        if nbytes <= 0:
            return
        view = np.frombuffer((ctypes.c_uint8 * nbytes).from_address(start), dtype=np.uint8)
        i = bisect.bisect_left(self._starts, start)
        for s, e, n, _, _ in self._regions:
            if s < start + nbytes and start < e and not (s == start and e == start + nbytes):
                if s <= start and start + nbytes <= e:
                    return  # inside a registered allocation already (a view of the same storage)
        if i < len(self._starts) and self._starts[i] == start:
            return
        self._starts.insert(i, start)
        self._regions.insert(i, (start, start + nbytes, name, view, keep))

    def add_tensor(self, t, name: str = "tensor"):
        """Register the whole storage of a CPU torch tensor."""
        if t.device.type != "cpu":
            raise ValueError(f"{name} must be a CPU tensor for the emulator; got device {t.device}")
        st = t.untyped_storage()
        self.add(st.data_ptr(), st.nbytes(), name, keep=t)

    def region(self, addr: int, nbytes: int):
        i = bisect.bisect_right(self._starts, addr) - 1
        if i >= 0:
            s, e, name, view, _ = self._regions[i]
            if addr + nbytes <= e:
                return s, view, name
        raise MemoryFault(f"global access of {nbytes} bytes at 0x{addr:x} is outside every allocation "
                          f"handed to the run ({self.describe()})")

    def describe(self) -> str:
        return ", ".join(f"{n} 0x{s:x}..0x{e:x}" for s, e, n, _, _ in self._regions) or "none"

    def read(self, addr: int, nbytes: int) -> np.ndarray:
        s, view, _ = self.region(addr, nbytes)
        return view[addr - s:addr - s + nbytes].copy()

    def write(self, addr: int, data) -> None:
        data = np.asarray(data, dtype=np.uint8).reshape(-1)
        s, view, _ = self.region(addr, len(data))
        view[addr - s:addr - s + len(data)] = data

    def gather(self, addrs: np.ndarray, size: int) -> np.ndarray:
        """Bytes ``[addr, addr + size)`` for each address: a ``(n, size)`` uint8 array."""
        if len(addrs) == 0:
            return np.zeros((0, size), np.uint8)
        lo, hi = int(addrs.min()), int(addrs.max())
        try:
            s, view, _ = self.region(lo, hi - lo + size)
        except MemoryFault:
            return np.stack([self.read(int(a), size) for a in addrs])
        idx = (addrs.astype(np.int64) - s)[:, None] + np.arange(size)
        return view[idx]

    def scatter(self, addrs: np.ndarray, data: np.ndarray) -> None:
        """Write row ``i`` of ``data`` (uint8, (n, size)) at ``addrs[i]``; later rows win on overlap, like lane
        order (the ISA leaves the winner of same-address stores unspecified)."""
        if len(addrs) == 0:
            return
        size = data.shape[1]
        lo, hi = int(addrs.min()), int(addrs.max())
        try:
            s, view, _ = self.region(lo, hi - lo + size)
        except MemoryFault:
            for a, row in zip(addrs, data):
                self.write(int(a), row)
            return
        idx = (addrs.astype(np.int64) - s)[:, None] + np.arange(size)
        view[idx] = data


class SharedMemory:
    """One CTA's shared memory: ``size`` bytes at ``base`` (:func:`shared_base` of its rank)."""

    def __init__(self, size: int, base: int = SHARED_BASE):
        self.size = size
        self.base = base
        self.data = np.zeros(max(size, 1), dtype=np.uint8)
        # who last wrote each byte through the generic proxy and has not fenced it for the async proxy:
        # 0 = clean, else 1 + thread index in the CTA (see Machine.check_async_read)
        self.unfenced = np.zeros(max(size, 1), dtype=np.int32)
        self.unfenced_any = False

    def offsets(self, addrs: np.ndarray, size: int, what: str) -> np.ndarray:
        off = addrs.astype(np.int64) - self.base
        if len(off) and (off.min() < 0 or off.max() + size > self.size):
            bad = int(addrs[(off < 0) | (off + size > self.size)][0])
            raise MemoryFault(f"{what}: shared address 0x{bad:x} (+{size} bytes) is outside this CTA's "
                              f"{self.size} bytes of shared memory (0x{self.base:x}..0x{self.base + self.size:x})")
        return off

    def gather(self, addrs: np.ndarray, size: int, what: str = "load") -> np.ndarray:
        off = self.offsets(addrs, size, what)
        return self.data[off[:, None] + np.arange(size)]

    def scatter(self, addrs: np.ndarray, data: np.ndarray, what: str = "store", writer=None) -> None:
        off = self.offsets(addrs, data.shape[1], what)
        idx = off[:, None] + np.arange(data.shape[1])
        self.data[idx] = data
        if writer is not None:  # generic-proxy writes, remembered until the writer's fence.proxy.async
            self.unfenced[idx] = (np.asarray(writer)[:, None] + 1)
            self.unfenced_any = True

    def read(self, addr: int, nbytes: int, what: str = "read") -> np.ndarray:
        off = int(self.offsets(np.array([addr]), nbytes, what)[0])
        return self.data[off:off + nbytes].copy()

    def write(self, addr: int, data, what: str = "write") -> None:
        data = np.asarray(data, dtype=np.uint8).reshape(-1)
        off = int(self.offsets(np.array([addr]), len(data), what)[0])
        self.data[off:off + len(data)] = data
