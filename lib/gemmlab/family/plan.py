"""The plan layer: a problem's compiled kernel and run-time arguments, cached; a launch binds tensors only.

A :class:`Plan` is made once per problem (sizes, dtypes, B's layout, device):
the architecture's heuristic picks a config, the config's kernel is compiled
(once per config and layout: the Hopper kernel takes M, N, K at run time, so
every problem size shares it) and the run-time scalars are fixed. Calling
the plan then does only what cannot be cached: it hands the tensors to the
compiled function, which launches on torch's current stream.

Why the call is cheap: the kernels are compiled with TVM-FFI
(``--enable-tvm-ffi``, package ``apache-tvm-ffi``). The compiled function
takes ``torch.Tensor`` arguments directly: shapes, strides and the data
pointer are read in C through DLPack, checked against the compiled signature,
and the TMA descriptors are built in the compiled host code. Without it, every
call converts each tensor in Python (``from_dlpack``, a few microseconds each)
and looks up the stream, which is most of the ~120 us a call used to cost.

Compile time is paid on the first call of a new config and layout, then cached for
the process: 0.5-1.3 s per variant on the H100/H200 machines' CPUs, about 3.5 s for
the first compile of a process (the DSL's own start-up); chapter 07 prints it.
"""
from __future__ import annotations

import functools
import time

from .. import tiers
from ..hardware import spec_of as _spec_of
from .configs import Sm90Config, Sm100Config, effective_splits
from .problem import GemmProblem, canonical_operands, check_devices, pad_rows, problem_of

#: Compiled kernels, by (architecture, kernel key, B's layout): shared by every problem size (sm90).
_KERNELS: dict = {}
#: Seconds each compile took, by the same key (chapter 07 prints them).
COMPILE_SECONDS: dict = {}


@functools.lru_cache(maxsize=None)
def _have_tvm_ffi() -> bool:
    import importlib.util

    return importlib.util.find_spec("tvm_ffi") is not None


def compiled_kernel(problem: GemmProblem, cfg, arch: str):
    """The compiled function of ``cfg`` for ``problem``'s layout (compiled on first use, then cached)."""
    if arch == "sm90":
        key = ("sm90", cfg.kernel_key, problem.b_major)
    else:
        key = ("sm100", cfg, problem.m, problem.n, problem.k)
    fn = _KERNELS.get(key)
    if fn is None:
        t0 = time.perf_counter()
        if arch == "sm90":
            from ..kernels.gemm_sm90 import compile_gemm

            fn = compile_gemm("sm_90a", cfg, problem.b_major, tvm_ffi=_have_tvm_ffi())
        else:
            from ..kernels.gemm_sm100 import compile_gemm_sm100

            m = max(problem.m, 2)  # static shapes: M = 1 runs padded to two rows (problem.pad_rows)
            fn = compile_gemm_sm100(cfg, m, problem.n, problem.k, tvm_ffi=_have_tvm_ffi())
        COMPILE_SECONDS[key] = time.perf_counter() - t0
        _KERNELS[key] = fn
    return fn


class Plan:
    """``out = a @ b`` for one problem on one device: call ``plan(a, b, out)``.

    ``config`` is what the heuristic chose (or what the caller forced);
    ``launch`` is the bound call of the compiled function. The tensors must
    match the problem the plan was made for (:func:`gemmlab.gemm` guarantees
    it by keying its cache on shapes, strides, dtypes and device).
    """

    __slots__ = ("problem", "config", "arch", "num_sms", "launch")

    def __init__(self, problem: GemmProblem, config, arch: str, num_sms: int):
        self.problem, self.config, self.arch, self.num_sms = problem, config, arch, num_sms
        fn = compiled_kernel(problem, config, arch)
        if _have_tvm_ffi():
            fn = fn.__tvm_ffi_object__() if hasattr(fn, "__tvm_ffi_object__") else fn
        self.launch = _bind(fn, problem, config, arch, num_sms)

    def __call__(self, a, b, out):
        self.launch(a, b, out)
        return out

    def __repr__(self) -> str:
        p = self.problem
        name = self.config.name if isinstance(self.config, Sm90Config) else repr(self.config)
        return f"Plan({p.m}x{p.n}x{p.k} {p.dtype}, b {p.b_major}-major, {self.arch}: {name})"


def _bind(fn, problem: GemmProblem, cfg, arch: str, num_sms: int):
    """The launch closure: the fewest Python operations between the caller and the compiled function."""
    if arch == "sm100":
        if problem.m == 1:
            def launch_padded(a, b, out):
                a2, out2 = pad_rows(a, out)
                _call(fn, a2, b, out2)
                out.copy_(out2[:1])

            return launch_padded
        return lambda a, b, out: _call(fn, a, b, out)

    max_clusters = max(1, num_sms // cfg.cluster_size)
    if not cfg.split_k:
        return lambda a, b, out: fn(a, b, out, max_clusters)
    import torch

    splits = effective_splits(-(-problem.k // cfg.tile_k), cfg.splits)
    ws_shape = (splits, problem.m, problem.n)
    f32 = torch.float32

    def launch_split(a, b, out):
        # A fresh workspace per call from torch's caching allocator: safe on any stream.
        fn(a, b, out, torch.empty(ws_shape, dtype=f32, device=out.device), splits, max_clusters)

    return launch_split


def _call(fn, *tensors):
    """Call a compiled function that takes a stream argument when TVM-FFI is absent (slow path)."""
    if _have_tvm_ffi():
        return fn(*tensors)
    from ..compile import current_stream, to_cute  # pragma: no cover - without apache-tvm-ffi

    return fn(*(to_cute(t) for t in tensors), current_stream())  # pragma: no cover


def arch_of_machine() -> str:
    """``"sm90"`` or ``"sm100"``: the architecture whose kernels this machine launches (TierError on cpu)."""
    tier = tiers.detect_tier()
    if tier in ("sm90", "sm100"):
        return tier
    return tiers.require_tier("gpu", "gemmlab.gemm")  # raises TierError: no GPU of a course tier


def choose_config(problem: GemmProblem, arch: str, num_sms: int, spec=None):
    """The architecture's heuristic (``spec``: the GPU's datasheet numbers, for the Hopper model)."""
    if arch == "sm90":
        from .heuristic_sm90 import choose, model_for

        return choose(problem, num_sms, model_for(spec))
    from .heuristic_sm100 import choose

    return choose(problem, num_sms)


def make_plan(problem: GemmProblem, device=None, config=None) -> Plan:
    """The plan for ``problem`` on ``device`` (default: the current one); ``config`` overrides the heuristic."""
    from .. import hardware

    arch = arch_of_machine()
    sms = hardware.sm_count(device)
    cfg = config or choose_config(problem, arch, sms, _spec_of(device))
    want = Sm90Config if arch == "sm90" else Sm100Config
    if not isinstance(cfg, want):
        raise TypeError(f"config must be an {want.__name__} on this {arch} machine; got {type(cfg).__name__}")
    if arch == "sm90" and (cfg.dtype, cfg.out_dtype) != (problem.dtype, problem.out_dtype):
        raise ValueError(f"config is for {cfg.dtype} -> {cfg.out_dtype}; the problem is "
                         f"{problem.dtype} -> {problem.out_dtype}")
    return Plan(problem, cfg, arch, sms)


def prepare(a, b, out, config=None):
    """Check the tensors once and return ``run()``: the launch of ``out = a @ b`` with nothing else per call.

    What benchmarks time as "the prepared launch"; ``config`` forces a configuration
    (tests of every variant, tuning sweeps).
    """
    if out is None:
        raise ValueError("out must be given to prepare (the launch writes into it)")
    problem = problem_of(a, b, out)
    check_devices(a, b, out)
    plan = make_plan(problem, a.device, config)
    a, b, out = canonical_operands(a, b, out, problem.b_major)
    launch = plan.launch

    def run():
        launch(a, b, out)

    run.plan = plan
    return run
