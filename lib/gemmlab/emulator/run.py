"""Running a compiled kernel on the emulator: ``run_on_emulator(compiled, *args)``.

The arguments are what the compiled function takes on a GPU, with CPU torch
tensors where it takes device tensors (they are converted with ``from_dlpack`` as
the GPU path converts device tensors) and the stream optional. The host code of
the compiled artifact builds every launch (:mod:`gemmlab.emulator.host`); each launch
then runs on a fresh :class:`~gemmlab.emulator.machine.Machine` whose global
memory is the tensors handed in.
"""
from __future__ import annotations

import time
import weakref
from dataclasses import dataclass, field

from . import ptx as ptxmod
from .host import HostRunner
from .machine import Machine
from .memory import GlobalMemory

_RUNNERS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_MODULES: dict = {}


@dataclass
class LaunchReport:
    """What one emulated launch did (functional counts, never a timing of the GPU)."""

    kernel: str
    grid: tuple
    block: tuple
    cluster: tuple
    smem: int
    warp_instructions: int
    async_ops: int
    seconds: float  # wall-clock seconds the emulator took on this machine
    warps: int = 0
    notes: list = field(default_factory=list)

    def __str__(self) -> str:
        return (f"{self.kernel[:60]}: grid {self.grid}, block {self.block}, cluster {self.cluster}, "
                f"{self.smem} B dynamic shared memory; {self.warp_instructions} warp instructions, "
                f"{self.async_ops} asynchronous operations, {self.seconds:.2f} s on the emulator")


def _runner(compiled) -> HostRunner:
    try:
        r = _RUNNERS.get(compiled)
    except TypeError:
        r = None
    if r is None:
        r = HostRunner(compiled)
        try:
            _RUNNERS[compiled] = r
        except TypeError:
            pass
    return r


def module_of(ptx_text: str) -> ptxmod.Module:
    mod = _MODULES.get(ptx_text)
    if mod is None:
        mod = _MODULES[ptx_text] = ptxmod.parse(ptx_text)
    return mod


def _convert(compiled, args):
    """torch tensors -> CuTe DSL tensors (as the GPU path does), plus the stream if it was left out."""
    import torch
    from cutlass.cute.runtime import from_dlpack

    memory = GlobalMemory()
    out = []
    for i, a in enumerate(args):
        if isinstance(a, torch.Tensor):
            if a.device.type != "cpu":
                raise ValueError(f"argument {i}: the emulator's global memory is the CPU's; got a tensor on {a.device}")
            memory.add_tensor(a, f"argument {i}")
            out.append(from_dlpack(a, assumed_align=16))
        else:
            out.append(a)
    n = compiled.execution_args._meta.arg_count
    if len(out) == n - 1:
        import cuda.bindings.driver as cuda

        out.append(cuda.CUstream(0))
    elif len(out) != n:
        raise TypeError(f"the compiled function takes {n} arguments (the stream last, optional here); got {len(args)}")
    return out, memory


def run_on_emulator(compiled, *args, seed: int = 0, trace=None, max_steps: int = 50_000_000,
                    extra_memory=(), ptx: str | None = None) -> list:
    """Run ``compiled`` (a ``cute.compile`` result, without TVM-FFI) on the emulator; returns a
    :class:`LaunchReport` per launch. Outputs land in the torch tensors passed in.

    ``seed`` picks the interleaving of warps and asynchronous completions (a kernel correct on one seed
    and wrong on another has a race). ``extra_memory``: more CPU tensors the kernel may address (e.g. a
    workspace whose pointer travels inside another tensor). ``ptx``: run this PTX instead of the compiled
    kernel's (the same kernel with an instruction changed, to see what a bug does; the launch and the
    parameters still come from the compiled host code).
    """
    runner = _runner(compiled)
    converted, memory = _convert(compiled, args)
    for t in extra_memory:
        memory.add_tensor(t, "extra")
    launches = runner(*converted)
    module = module_of(ptx if ptx is not None else runner.ptx)
    reports = []
    for launch in launches:
        if 0 in launch.grid:
            from .errors import EmulatorError

            raise EmulatorError(f"the host code launched {launch.kernel[:60]} with grid {launch.grid}: CUDA refuses a "
                                "zero grid dimension (invalid configuration). A kernel compiled with symbolic sizes "
                                "(cute.sym_int) reads them from its tensors: hand it CuTe tensors whose layout is "
                                "dynamic (from_dlpack(t).mark_layout_dynamic(), with the tensors in extra_memory), "
                                "not torch tensors, which are converted with static layouts")
        kernel = module.kernel(launch.kernel)
        t0 = time.perf_counter()
        m = Machine(module, kernel, launch, memory, seed=seed, arch=module.target, max_steps=max_steps,
                    trace=trace)
        nops = _count_ops(m)
        m.run()
        reports.append(LaunchReport(launch.kernel, launch.grid, launch.block, launch.cluster, launch.smem,
                                    m.steps, nops.count, time.perf_counter() - t0,
                                    warps=sum(len(c.warps) for c in m.ctas), notes=list(m.notes)))
    return reports


class _count_ops:
    """Counts the asynchronous operations a machine issues."""

    def __init__(self, machine):
        self.count = 0
        issue = machine.issue

        def counted(op):
            self.count += 1
            issue(op)
        machine.issue = counted


def emulate(host_fn, *args, target: str = "sm_100a", seed: int = 0, trace=None, max_steps: int = 50_000_000):
    """Compile ``host_fn`` (a ``@cute.jit`` host function taking tensors and a stream) for ``target`` with
    these CPU tensors, then run it on the emulator (the emulator's twin of :func:`gemmlab.compile.launcher`)."""
    import torch

    from ..compile import compile_for, fake_stream, to_cute

    conv = [to_cute(a) if isinstance(a, torch.Tensor) else a for a in args]
    key = (host_fn, target, tuple((a.dtype, tuple(a.shape), tuple(a.stride())) if isinstance(a, torch.Tensor)
                                  else ("v", a) for a in args))
    compiled = _COMPILED.get(key)
    if compiled is None:
        compiled = _COMPILED[key] = compile_for(target, host_fn, *conv, fake_stream())
    from ..compile import _constexpr_mask

    runtime = [a for a, const in zip(args, _constexpr_mask(host_fn, len(args))) if not const]
    return run_on_emulator(compiled, *runtime, seed=seed, trace=trace, max_steps=max_steps)


_COMPILED: dict = {}


def run_ptx(ptx_text: str, *params, grid=(1, 1, 1), block=(32, 1, 1), cluster=(1, 1, 1), smem: int = 0,
            kernel: str | None = None, seed: int = 0, trace=None, max_steps: int = 1_000_000) -> LaunchReport:
    """Run hand-written PTX: one launch of ``kernel`` (the module's only one by default).

    ``params`` follow the ``.entry`` parameters in order: a CPU torch tensor passes its address (and becomes
    global memory the kernel may touch), an int its little-endian bytes at the parameter's size, ``bytes``
    themselves. For tests of single instructions and for the course's small demonstrations.
    """
    import torch

    from .host import Launch

    module = module_of(ptx_text)
    k = module.kernel(kernel)
    if len(params) != len(k.params):
        raise TypeError(f"kernel {k.name} takes {len(k.params)} parameters; got {len(params)}")
    memory = GlobalMemory()
    raw = []
    for (name, size, _), p in zip(k.params, params):
        if isinstance(p, torch.Tensor):
            memory.add_tensor(p, name)
            p = p.data_ptr()
        if isinstance(p, (bytes, bytearray)):
            if len(p) != size:
                raise ValueError(f"parameter {name} takes {size} bytes; got {len(p)}")
            raw.append(bytes(p))
        else:
            raw.append(int(p).to_bytes(size, "little", signed=int(p) < 0))
    launch = Launch(k.name, tuple(grid), tuple(block), tuple(cluster), smem, raw)
    t0 = time.perf_counter()
    m = Machine(module, k, launch, memory, seed=seed, arch=module.target, max_steps=max_steps, trace=trace)
    nops = _count_ops(m)
    m.run()
    return LaunchReport(k.name, launch.grid, launch.block, launch.cluster, smem, m.steps, nops.count,
                        time.perf_counter() - t0, warps=sum(len(c.warps) for c in m.ctas),
                        notes=list(getattr(m, "notes", ())))
