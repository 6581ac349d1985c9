"""The plan layer: one compile cache for the family, and a plan per call signature that binds only tensors.

A plan is made once per problem (sizes, dtypes, layouts, device) and resolves
everything a call signature decides: the heuristic's config, the grid, the
schedule and store choices, the compiled function, the workspace. Calling it
then does only what cannot be cached: it hands the tensors to the compiled
function, which launches on torch's current stream.

* :class:`Plan`: ``gemmlab.gemm`` (chapters 07, 10). The Hopper kernel is compiled
  once per config and layout (it takes M, N, K at run time, so every problem size
  shares it); chapter 10's per shape.
* :class:`GroupedPlan`: ``gemmlab.grouped_gemm`` and ``grouped_gemm_list`` (chapter 08),
  one compiled variant per (tile, mode, B's layout, schedule) for every size and group
  count; the descriptor workspace is shared per device.
* :class:`GatedPlan`: ``gemmlab.gated_dual_gemm`` (chapter 11), compiled per shape.

Every kernel goes through :func:`compiled`, the one cache (:data:`_KERNELS`; the seconds
each compile took in :data:`COMPILE_SECONDS`).

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

from .. import hardware, tiers
from ..checks import check_int
from . import heuristic_gated, heuristic_grouped, tune
from .configs import (DECODE_SPLITS, DESC_WORDS, TABLE_COLUMNS, A16Config, DecodeConfig, PipelinedConfig, Sm90Config,
                      Sm100Config, SwapConfig, W16Config, check_grouped_smem, effective_splits, slots_per_cta)
from .heuristic_grouped import L2_PROMOTION, GroupedSchedule
from .problem import (GatedProblem, GemmProblem, GroupedProblem, canonical_operands, check_devices, offs_rule, pad_rows,
                      problem_of)

#: Every compiled kernel of the family, by what it was compiled for (the kernel's module and its compile-time
#: choices): the dense Hopper kernel shared by every problem size, the grouped one by every size and group count.
_KERNELS: dict = {}
#: Seconds each compile took, by the same key (chapter 07 prints them).
COMPILE_SECONDS: dict = {}


@functools.lru_cache(maxsize=None)
def _have_tvm_ffi() -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec("tvm_ffi") is not None
    except (ImportError, ValueError):  # a broken or blocked package (sys.modules["tvm_ffi"] = None)
        return False


#: The package the Hopper kernels' call path needs (in requirements.lock and gemmlab's dependencies).
TVM_FFI_PACKAGE = "apache-tvm-ffi"


def require_tvm_ffi(what: str) -> None:
    """Raise ``ImportError`` naming ``apache-tvm-ffi`` unless ``tvm_ffi`` is importable.

    The Hopper kernels (``gemmlab.gemm`` on sm90, ``gemmlab.grouped_gemm``) take every size at run time and are
    called through TVM-FFI with torch tensors; they have no slow path (the sm100 GEMM, compiled per shape, has
    one). Without the package the DSL would fail deep inside the call ("Missing required arguments: ['stream']").
    """
    if not _have_tvm_ffi():
        raise ImportError(f"{what} on Hopper needs the package {TVM_FFI_PACKAGE} (module tvm_ffi), which this "
                          f"interpreter cannot import: pip install {TVM_FFI_PACKAGE} (it is in requirements.lock)")


def compiled(key: tuple, build):
    """The compiled function under ``key`` (``key[0]``: the kernel's module): ``build()`` on first use, then cached."""
    fn = _KERNELS.get(key)
    if fn is None:
        t0 = time.perf_counter()
        fn = build()
        COMPILE_SECONDS[key] = time.perf_counter() - t0
        _KERNELS[key] = fn
    return fn


def raw_function(fn):
    """With TVM-FFI, the compiled function's raw ``tvm_ffi.Function`` (no Python wrapper): what plans call."""
    return fn.__tvm_ffi_object__() if _have_tvm_ffi() and hasattr(fn, "__tvm_ffi_object__") else fn


def compiled_kernel(problem: GemmProblem, cfg, arch: str):
    """The compiled function of ``cfg`` for ``problem``'s layout (compiled on first use, then cached)."""
    if arch == "sm90":
        def build():
            from ..kernels.gemm_sm90 import compile_gemm

            require_tvm_ffi("gemmlab.gemm")
            return compile_gemm("sm_90a", cfg, problem.b_major, tvm_ffi=True)

        return compiled(("gemm_sm90", cfg.kernel_key, problem.b_major), build)

    def build_sm100():
        from ..kernels.gemm_sm100 import compile_gemm_sm100

        m = max(problem.m, 2)  # static shapes: M = 1 runs padded to two rows (problem.pad_rows)
        return compile_gemm_sm100("sm_100a", cfg, m, problem.n, problem.k, tvm_ffi=_have_tvm_ffi())

    return compiled(("gemm_sm100", cfg, problem.m, problem.n, problem.k), build_sm100)


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
        fn = raw_function(compiled_kernel(problem, config, arch))
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

    max_clusters = cfg.clusters_on(num_sms)
    if not cfg.split_k:
        return lambda a, b, out: fn(a, b, out, max_clusters)
    import torch

    splits, dp_tiles, ws_floats, tiles = split_launch(problem, cfg, max_clusters)
    sets = SplitBuffers(tiles, ws_floats)
    buffers = sets.buffers

    def launch_split(a, b, out):
        # The plan's workspace and counters for the current stream: launches on one stream run one after the
        # other, so one set serves them all (the counters are zero between launches); another stream gets its own.
        ws, counters = buffers(out.device)
        fn(a, b, out, ws, counters, splits, dp_tiles, max_clusters)

    launch_split.counters = sets  # for tests and the curious: every set's counters are zero between launches
    launch_split.dp_tiles = dp_tiles
    return launch_split


def split_launch(problem: GemmProblem, cfg: Sm90Config, max_clusters: int) -> tuple[int, int, int, int]:
    """What a split-K launch of ``cfg`` on a persistent grid of ``max_clusters`` clusters passes the kernel:
    ``(splits, dp_tiles, workspace floats, counters)``.

    ``splits`` is the run-time slice count (:func:`~gemmlab.family.configs.effective_splits`); ``dp_tiles`` the
    cluster tiles that run whole before the split tail (:func:`~gemmlab.family.configs.hybrid_tiles` on the clusters
    the launch runs: ``min(units, max_clusters)`` is ``max_clusters`` whenever any tile runs whole). The workspace
    and the counters hold the tail's CTA tiles only; at least one of each, so that no tensor is empty even where
    the tiles fill whole waves and nothing is split.
    """
    max_clusters = check_int("max_clusters", max_clusters, lo=1)
    splits = effective_splits(-(-problem.k // cfg.tile_k), cfg.splits)
    dp_tiles, _ = cfg.hybrid(problem.m, problem.n, max_clusters)
    return (splits, dp_tiles, max(1, cfg.workspace_floats(problem.m, problem.n, splits, max_clusters)),
            max(1, cfg.split_tiles(problem.m, problem.n, max_clusters)))


class SplitBuffers:
    """What a split-K launch of one dense plan needs beside the operands, one set per (device, stream), made on first
    use: ``tiles`` int32 tile counters (zeros) and the FP32 workspace of ``workspace_floats`` partial-tile floats.

    The workspace is reused, not allocated per call: a launch writes every partial tile it later reads (each unit
    its own slice before the tile's last unit reads them back), so nothing carries over from one launch to the next,
    and launches on one stream do not overlap. Allocating it per call from torch's caching allocator cost the public
    call 3 to 5 us more than an unsplit plan's on the H200 (2026-12-02, ``results/nvidia-h200/gemm_family.json``:
    256 x 2112 x 7168 in two slices, 24.4 us a call against 18.8 for the launch), where the kernel is as short as the
    host's work per call.

    The kernel counts each tile's units on its counter and the tile's last unit
    puts it back to zero (:mod:`gemmlab.splitk`), so the counters are zeroed
    once, when made, and never again: no memset launch per call. The rule for
    concurrent launches: two launches of one plan that may run at the same time
    must not share counters (they would count each other's units) or a workspace.
    Launches on one stream run one after the other; launches on two streams get two sets,
    keyed by torch's current stream when the call is made. A launch that dies
    midway (a device error) may leave counters non-zero: the context is lost then
    anyway. A CUDA graph replays the buffers it captured: two replays of one
    graph must not overlap either.
    """

    __slots__ = ("tiles", "workspace_floats", "by_stream", "workspaces", "_current")

    def __init__(self, tiles: int, workspace_floats: int):
        import torch

        self.tiles, self.by_stream = check_int("tiles", tiles, lo=1), {}  # the counters of each (device, stream)
        self.workspace_floats, self.workspaces = check_int("workspace_floats", workspace_floats, lo=1), {}
        # torch's current stream id in one C call (torch.cuda.current_stream builds a Stream object: slower)
        self._current = getattr(torch._C, "_cuda_getCurrentStream", None)

    def buffers(self, device):
        """``(workspace, counters)`` for ``device`` and the current stream (on a CPU device, one set: the tests'
        stand-ins)."""
        if device.type == "cuda":
            if self._current is not None:
                sid = self._current(device.index)  # (stream id, device index, device type) in torch >= 2.1
                key = (device.index, sid[0] if isinstance(sid, tuple) else sid)
            else:  # pragma: no cover - every CUDA build of torch has it
                import torch

                key = (device.index, torch.cuda.current_stream(device).cuda_stream)
        else:
            key = (str(device), 0)
        t = self.by_stream.get(key)
        if t is None:
            import torch

            t = self.by_stream[key] = torch.zeros(self.tiles, dtype=torch.int32, device=device)
            self.workspaces[key] = torch.empty(self.workspace_floats, dtype=torch.float32, device=device)
        return self.workspaces[key], t


def _call(fn, *tensors):
    """Call a compiled function that takes a stream argument when TVM-FFI is absent (slow path)."""
    if _have_tvm_ffi():
        return fn(*tensors)
    from ..compile import current_stream, to_cute  # pragma: no cover - without apache-tvm-ffi

    return fn(*(to_cute(t) for t in tensors), current_stream())  # pragma: no cover


def arch_of_machine(caller: str = "gemmlab.gemm") -> str:
    """``"sm90"`` or ``"sm100"``: the architecture whose kernels this machine launches (TierError on cpu)."""
    tier = tiers.detect_tier()
    if tier in ("sm90", "sm100"):
        return tier
    return tiers.require_tier("gpu", caller)  # raises TierError: no GPU of a course tier


def choose_config(problem: GemmProblem, arch: str, num_sms: int, spec=None):
    """The architecture's heuristic (``spec``: the GPU's datasheet numbers, for the Hopper model)."""
    if arch == "sm90":
        from .heuristic_sm90 import choose, model_for

        return choose(problem, num_sms, model_for(spec))
    from .heuristic_sm100 import choose

    return choose(problem, num_sms)


def make_plan(problem: GemmProblem, device=None, config=None, tensors=None) -> Plan:
    """The plan for ``problem`` on ``device`` (default: the current one); ``config`` overrides the heuristic.

    ``tensors``: the caller's ``(a, b, out)`` (``out`` may be None). With them on a Hopper GPU, the model's few best
    configurations are timed on the first plan of a problem and the fastest is kept (:mod:`gemmlab.family.tune`;
    ``GEMMLAB_TUNE=1``: the model's choice alone).
    """
    arch = arch_of_machine()
    sms = hardware.sm_count(device)
    if config is not None:
        cfg = config
    elif arch == "sm90" and tensors is not None and getattr(tensors[0], "is_cuda", False) and tune.tune_top() > 1:
        cfg = _timed_choice(problem, sms, hardware.spec_of(device), tensors)
    else:
        cfg = choose_config(problem, arch, sms, hardware.spec_of(device))
    want = Sm90Config if arch == "sm90" else Sm100Config
    if not isinstance(cfg, want):
        raise TypeError(f"config must be an {want.__name__} on this {arch} machine; got {type(cfg).__name__}")
    if arch == "sm90" and cfg.gated:
        raise ValueError(f"config {cfg.name}: a gated config stores silu(first half) * second half of each tile, the "
                         f"NVFP4 W16 route's epilogue (gemmlab.kernels.dual_gemm_sm90_w16), not a @ b: pass gated=False")
    if arch == "sm90" and (cfg.dtype, cfg.out_dtype) != (problem.dtype, problem.out_dtype):
        raise ValueError(f"config is for {cfg.dtype} -> {cfg.out_dtype}; the problem is "
                         f"{problem.dtype} -> {problem.out_dtype}")
    if arch == "sm100":
        if problem.out_dtype != problem.dtype:  # chapter 10's kernel stores C in A's dtype
            raise TypeError(f"out must have a's dtype {problem.dtype} on Blackwell (chapter 10's kernel writes C in "
                            f"its inputs' dtype); got {problem.out_dtype}")
        if (cfg.dtype, cfg.b_major) != (problem.dtype, problem.b_major):
            raise ValueError(f"config is for {cfg.dtype} with b {cfg.b_major}-major; the problem is "
                             f"{problem.dtype} with b {problem.b_major}-major")
    return Plan(problem, cfg, arch, sms)


def _timed_choice(problem: GemmProblem, sms: int, spec, tensors) -> Sm90Config:
    """:func:`gemmlab.family.tune.choose_by_timing` over the model's best :func:`~gemmlab.family.tune.tune_top`
    configurations, each launched on the caller's tensors (into a scratch output when ``out`` is None)."""
    import torch

    from .heuristic_sm90 import candidates, model_for

    configs = tune.shortlist(candidates(problem, sms, model_for(spec)), tune.tune_top())
    a, b, out = tensors
    if out is None:
        out = torch.empty((problem.m, problem.n), dtype=getattr(torch, problem.out_dtype), device=a.device)
    a, b, out = canonical_operands(a, b, out, problem.b_major)

    def time_us(cfg):
        launch = Plan(problem, cfg, "sm90", sms).launch
        return tune.time_launch(lambda: launch(a, b, out), a.device)

    return tune.choose_by_timing((problem, a.device), configs, time_us)


def prepare(a, b, out, config=None):
    """Check the tensors once and return ``run()``: the launch of ``out = a @ b`` with nothing else per call.

    What benchmarks time as "the prepared launch"; ``config`` forces a configuration
    (tests of every variant, tuning sweeps).
    """
    if out is None:
        raise ValueError("out must be given to prepare (the launch writes into it)")
    problem = problem_of(a, b, out)
    arch_of_machine("gemmlab.family.plan.prepare")  # the tier before the devices, as gemmlab.gemm
    check_devices(a, b, out)
    plan = make_plan(problem, a.device, config, (a, b, out))
    a, b, out = canonical_operands(a, b, out, problem.b_major)
    launch = plan.launch

    def run():
        launch(a, b, out)

    run.plan = plan
    return run


# --------------------------------------------------------------------------------------
# Grouped (chapter 08)
# --------------------------------------------------------------------------------------

#: Descriptor workspaces by (device, grid, slots per CTA), and placeholder offs / table tensors by device.
_WORKSPACES: dict = {}
_DUMMIES: dict = {}


def grouped_kernel(cfg: Sm90Config, mode: str, b_major: str, sched: GroupedSchedule, *, fences: bool = True,
                   l2_promotion: int | None = L2_PROMOTION, trace: bool = False):
    """The grouped kernel of tile ``cfg`` for ``mode``, B's layout and ``sched`` (compiled on first use, then
    cached; the raw function: torch tensors in, torch's current stream)."""
    def build():
        from ..kernels.grouped_sm90 import compile_grouped

        require_tvm_ffi("gemmlab.grouped_gemm")  # called with torch tensors: there is no other call path
        return compile_grouped("sm_90a", cfg, mode, b_major, tvm_ffi=True, fences=fences,
                               by_size=sched.by_size, l2_promotion=l2_promotion, trace=trace, dynamic=sched.dynamic,
                               overlap_store=sched.overlap_store, mixed=sched.mixed, burst=sched.burst)

    key = ("grouped_sm90", cfg, mode, b_major, fences, sched.by_size, l2_promotion, trace, sched.dynamic,
           sched.overlap_store, sched.mixed, sched.burst)
    return raw_function(compiled(key, build))


def workspace(device, grid: int, cfg: Sm90Config, mixed: bool = False):
    """The descriptor slots: (grid, slots, 16) int64, one set per CTA, cached per device.

    Calls on one stream reuse it safely (a launch starts after the previous one
    ended). Calls that run at the same time on two streams of one device would
    rewrite each other's descriptors: that is not supported.
    """
    key = (device, grid, slots_per_cta(cfg, mixed=mixed))
    ws = _WORKSPACES.get(key)
    if ws is None:
        ws = _WORKSPACES[key] = new_workspace(device, grid, cfg, mixed=mixed)
    return ws


def new_workspace(device, grid: int, cfg: Sm90Config, trace: bool = False, mixed: bool = False):
    """A zeroed workspace: (grid, slots, 16) int64 (the tile counters at 0), one more slot with ``trace``, the
    light stream's descriptor slots with ``mixed``."""
    import torch

    return torch.zeros((grid, slots_per_cta(cfg, trace, mixed), DESC_WORDS), dtype=torch.int64, device=device)


def dummies(device):
    """Placeholder offs / table tensors for the mode that does not use them."""
    d = _DUMMIES.get(device)
    if d is None:
        import torch

        d = _DUMMIES[device] = (torch.zeros(1, dtype=torch.int32, device=device),
                                torch.zeros((1, len(TABLE_COLUMNS)), dtype=torch.int64, device=device))
    return d


def problem_table(pairs, outs, b_major: str):
    """The (G, 9) int64 rows of :data:`gemmlab.family.configs.TABLE_COLUMNS` for independent problems.

    ``b_major``: the layout every ``b`` has (checked by the caller): B's leading
    dimension is its row stride when N-contiguous, its column stride when K-contiguous.
    """
    ldb = 0 if b_major == "n" else 1
    return [(ai.data_ptr(), bi.data_ptr(), ci.data_ptr(), ai.shape[0], bi.shape[1], ai.shape[1],
             ai.stride(0), bi.stride(ldb), ci.stride(0)) for (ai, bi), ci in zip(pairs, outs)]


class GroupedPlan:
    """A grouped GEMM for one call signature: :meth:`GroupedPlan.ragged` or :meth:`GroupedPlan.table` launch it on
    tensors of that signature.

    ``config`` (the tile), ``schedule`` (:class:`~gemmlab.family.heuristic_grouped.GroupedSchedule`) and ``grid``
    are the heuristic's (or what the caller forced); ``workspace`` holds every CTA's descriptor slots.
    """

    __slots__ = ("problem", "config", "schedule", "grid", "fn", "workspace", "offs", "table_rows")

    def __init__(self, problem: GroupedProblem, config: Sm90Config, schedule: GroupedSchedule, grid: int, fn,
                 workspace, dummy_offs, dummy_table):
        self.problem, self.config, self.schedule, self.grid, self.fn = problem, config, schedule, grid, fn
        self.workspace, self.offs, self.table_rows = workspace, dummy_offs, dummy_table

    def ragged(self, a, b, out, offs, report: int = 0):
        """``out[offs[g-1]:offs[g]] = a[offs[g-1]:offs[g]] @ b[g]``: the ragged form's launch. ``report``: the
        address of an :class:`OffsReport` for the kernel's check of ``offs``, 0 for none."""
        self.fn(a, b, out, offs, self.table_rows, self.workspace, self.problem.groups, self.grid, report)

    def table(self, table, a0, b0, c0):
        """The list form's launch: ``table`` (G, 9) on the device, ``a0, b0, c0`` the first problem's tensors (the
        template every group's descriptors are rewritten from)."""
        self.fn(a0, b0, c0, self.offs, table, self.workspace, self.problem.groups, self.grid, 0)

    def __repr__(self) -> str:
        p, s = self.problem, self.schedule
        return (f"GroupedPlan({p.mode}, {p.tokens} tokens in {p.groups} groups, N={p.n}, K={p.k}: {self.config.name}, "
                f"grid {self.grid}, dynamic={s.dynamic}, by_size={s.by_size}, overlap_store={s.overlap_store}, "
                f"mixed={s.mixed})")


class OffsReport:
    """Where the grouped kernel reports a bad ``offs`` (:func:`gemmlab.kernels.grouped_sm90.check_offs`): four int32
    words of pinned host memory, which the GPU writes through the same address (unified addressing) and the host
    reads without waiting for the GPU. One per device; :func:`offs_report` makes it.

    Word 0 is the first bad group + 1 (0: nothing to report), then that group's ``offs``, the previous end and the
    rows of ``a``. The kernel writes only into an empty report, so the first error stays until :meth:`take` reads it.
    """

    __slots__ = ("device", "words", "view", "address")

    def __init__(self, device):
        import torch

        self.device = device
        # pinned for a GPU; plain memory for the CPU stand-ins of the tests, whose "kernels" never write it
        self.words = torch.zeros(4, dtype=torch.int32, pin_memory=torch.device(device).type == "cuda")
        self.view = self.words.numpy()  # reads host memory directly: no copy, no synchronisation
        self.address = self.words.data_ptr()

    def take(self):
        """The pending error as a ``ValueError`` (the report emptied), or None."""
        if not self.view[0]:
            return None
        g, end, prev, rows = (int(x) for x in self.view)
        self.view[:] = 0
        rule = offs_rule(g - 1, end, prev, rows)
        return ValueError(f"an earlier gemmlab.grouped_gemm call on {self.device} had a bad offs ({rule}); the "
                          "kernel found it while that call ran. That call's groups were clamped to the valid rows, "
                          "so it wrote nothing outside out, but its output is not the product of the offs given. "
                          "Pass validate='sync' to have offs checked (and waited for) inside the call itself")


_REPORTS: dict = {}


def offs_report(device) -> OffsReport:
    """The device's :class:`OffsReport` (made on first use)."""
    r = _REPORTS.get(device)
    if r is None:
        r = _REPORTS[device] = OffsReport(device)
    return r


def take_offs_error(device) -> ValueError | None:
    """The pending error of ``device``'s report (emptied), or None; a device without a report has none."""
    r = _REPORTS.get(device)
    return None if r is None else r.take()


def grouped_machine(device, caller: str = "gemmlab.grouped_gemm") -> None:
    """After the arguments, the machine: a Hopper GPU (:class:`gemmlab.tiers.TierError` elsewhere: the grouped kernel
    is sm_90a only), then the tensors' device (checked one device already) must be a CUDA one."""
    tiers.require_tier("sm90", caller)
    if device.type != "cuda":
        raise ValueError(f"the grouped GEMM runs on a CUDA device; the tensors are on {device}")


def make_grouped_plan(problem: GroupedProblem, device, config: Sm90Config | None = None, *, shapes=None,
                      fences: bool = True, l2_promotion: int | None = L2_PROMOTION, **overrides) -> GroupedPlan:
    """The plan of ``problem`` on CUDA ``device``: the tile (``config``, else the heuristic's for this GPU), the
    schedule (``overrides``: ``dynamic``, ``by_size``, ``overlap_store``, ``mixed``, ``burst``; None lets the rule
    decide), the grid (the list form needs the problems' ``(M, N)`` ``shapes``), the compiled kernel, the workspace."""
    cfg = config or heuristic_grouped.default_config(problem.tokens, problem.groups, problem.n, problem.k, device,
                                                      problem.dtype)
    sms = hardware.sm_count(device)
    if problem.mode == "ragged":
        grid = heuristic_grouped.ragged_grid(cfg, sms, problem.tokens, problem.groups, problem.n)
    else:
        grid = heuristic_grouped.table_grid(cfg, sms, shapes)
    sched = heuristic_grouped.schedule(cfg, problem, **overrides)
    check_grouped_smem(cfg, by_size=sched.by_size, dynamic=sched.dynamic, mixed=bool(sched.mixed))
    fn = grouped_kernel(cfg, problem.mode, problem.b_major, sched, fences=fences, l2_promotion=l2_promotion)
    offs, table = dummies(device)
    return GroupedPlan(problem, cfg, sched, grid, fn, workspace(device, sms, cfg, mixed=bool(sched.mixed)), offs, table)


# --------------------------------------------------------------------------------------
# Gated NVFP4 (chapter 11)
# --------------------------------------------------------------------------------------


def sm100_kernels():
    """:mod:`gemmlab.kernels.dual_gemm_sm100`, or None where this checkout does not have it (imported on first use)."""
    import importlib

    name = "gemmlab.kernels.dual_gemm_sm100"
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as e:
        if e.name != name:
            raise  # the module exists but something it imports is missing: say so
        return None


def gated_kernel(cfg: PipelinedConfig | DecodeConfig | A16Config | SwapConfig | W16Config, m: int, n: int, k: int,
                 out_stride: tuple = None):
    """A Hopper twin compiled for M x N x K (static shapes; cached): the decode twin for a
    :class:`~gemmlab.family.configs.DecodeConfig`, the A16 twin (pre-pass and main kernel; it takes an (M, K) FP16
    workspace after the inputs) for an :class:`~gemmlab.family.configs.A16Config`, the swap twin (the same pre-pass,
    the same workspace) for a :class:`~gemmlab.family.configs.SwapConfig`, the W16 route (three kernels; it
    takes the (M, K) and (2 N, K) FP16 workspaces after the inputs and ``max_clusters`` after ``out``) for a
    :class:`~gemmlab.family.configs.W16Config`, else the fast twin. With TVM-FFI
    the pointer-taking host function the plan calls (:func:`~gemmlab.kernels.dual_gemm_sm90.compile_with_pointers`,
    for an output of strides ``out_stride``), else the tensor-taking one."""
    out_stride = tuple(out_stride) if out_stride is not None else (n, 1, 1)
    decode = isinstance(cfg, DecodeConfig)
    a16 = isinstance(cfg, A16Config)
    swap = isinstance(cfg, SwapConfig)
    w16 = isinstance(cfg, W16Config)
    name = ("dual_gemm_sm90_decode" if decode else "dual_gemm_sm90_a16" if a16 else "dual_gemm_sm90_swap" if swap
            else "dual_gemm_sm90_w16" if w16 else "dual_gemm_sm90_pipelined")

    def build():
        if decode:
            from ..kernels import dual_gemm_sm90_decode as mod

            compile_ptrs, compile_tensors = mod.compile_decode_ptrs, mod.compile_decode
        elif a16:
            from ..kernels import dual_gemm_sm90_a16 as mod

            compile_ptrs, compile_tensors = mod.compile_a16_ptrs, mod.compile_a16
        elif swap:
            from ..kernels import dual_gemm_sm90_swap as mod

            compile_ptrs, compile_tensors = mod.compile_swap_ptrs, mod.compile_swap
        elif w16:
            from ..kernels import dual_gemm_sm90_w16 as mod

            compile_ptrs, compile_tensors = mod.compile_w16_ptrs, mod.compile_w16
        else:
            from ..kernels import dual_gemm_sm90_pipelined as mod

            compile_ptrs, compile_tensors = mod.compile_pipelined_ptrs, mod.compile_pipelined
        if _have_tvm_ffi():
            return compile_ptrs("sm_90a", cfg, m, n, k, out_stride)
        return compile_tensors("sm_90a", cfg, m, n, k)  # pragma: no cover - without apache-tvm-ffi

    if not _have_tvm_ffi():  # pragma: no cover
        return compiled((name, cfg, m, n, k), build)
    return compiled((name + "_ptrs", cfg, m, n, k, out_stride), build)


class GatedPlan:
    """``gated_dual_gemm`` for one call signature: ``plan(a, b1, b2, sfa, sfb1, sfb2, out)`` returns ``out``.

    On Hopper a twin's compiled kernel: the decode twin for ``config`` a :class:`~gemmlab.family.configs.DecodeConfig`
    (M <= 128), the A16 twin for an :class:`~gemmlab.family.configs.A16Config` and the swap twin for a
    :class:`~gemmlab.family.configs.SwapConfig` (their FP16 A workspace allocated per call), the W16 route for a :class:`~gemmlab.family.configs.W16Config` (its FP16 A and weight workspaces allocated
    per call; its GEMM's persistent grid sized for ``num_sms``), else the fast twin (a
    :class:`~gemmlab.family.configs.PipelinedConfig`),
    called with the inputs' data pointers and ``out`` itself: the signature fixes every layout, so no view is made
    per call (:func:`~gemmlab.kernels.dual_gemm_sm90.pointer_host`). ``out_stride``: the strides
    of the outputs this signature passes (None: the plan allocates compact ones). On Blackwell the SM100 kernel's
    own call (compile-verified only: it permutes the scales on every call).
    """

    __slots__ = ("problem", "config", "arch", "fn", "_pointers", "_workspace", "_tail")

    def __init__(self, problem: GatedProblem, config, arch: str, out_stride: tuple = None, num_sms: int | None = None):
        self.problem, self.config, self.arch = problem, config, arch
        self._pointers = False
        # FP16 workspaces allocated per call: the A16 and swap twins' A (M, K); the W16 route's A and weights (2 N, K)
        self._workspace = isinstance(config, (A16Config, SwapConfig, W16Config))
        self._tail = ()  # arguments after out: the W16 route's persistent grid (clusters)
        if isinstance(config, W16Config):
            sms = hardware.sm_count() if num_sms is None else check_int("num_sms", num_sms, lo=1)
            self._tail = (config.gemm.clusters_on(sms),)
        if arch == "sm100":
            mod = sm100_kernels()
            if mod is None:
                raise RuntimeError("gemmlab.gated_dual_gemm on a B200 needs gemmlab.kernels.dual_gemm_sm100, which "
                                   "this checkout does not have")
            self.fn = mod.gated_dual_gemm_sm100
        else:
            self.fn = raw_function(gated_kernel(config, problem.m, problem.n, problem.k, out_stride))
            self._pointers = _have_tvm_ffi()

    def bind(self, a, b1, b2, sfa, sfb1, sfb2, out):
        """A zero-argument launch on these tensors (a prepared launch: their pointers read once)."""
        fn = self.fn
        if self.arch == "sm100":
            return lambda: fn(a, b1, b2, sfa, sfb1, sfb2, out=out)
        ws = self.workspace(a) if self._workspace else []  # one set for this prepared launch
        tail = self._tail
        if self._pointers:
            ptrs = [t.data_ptr() for t in (a, b1, b2, sfa, sfb1, sfb2, *ws)]
            return lambda: fn(*ptrs, out, *tail)
        from ..compile import current_stream, to_cute  # pragma: no cover - without apache-tvm-ffi
        from ..kernels.dual_gemm_sm90 import operands_2d  # pragma: no cover

        ops = operands_2d(a, b1, b2, sfa, sfb1, sfb2, out)  # pragma: no cover
        conv = [to_cute(t) for t in (*ops[:6], *ws, ops[6])]  # pragma: no cover
        return lambda: fn(*conv, *tail, current_stream())  # pragma: no cover

    def workspace(self, a) -> list:
        """The FP16 workspaces of one call (from torch's caching allocator, on ``a``'s device and current stream, so
        calls on other streams never share them): the A16 and swap twins' (M, K) A; the W16 route's A and its (2 N, K)
        weights."""
        import torch

        p = self.problem
        ws = [torch.empty((p.m, p.k), dtype=torch.float16, device=a.device)]
        if isinstance(self.config, W16Config):
            ws.append(torch.empty((2 * p.n, p.k), dtype=torch.float16, device=a.device))
        return ws

    def launch(self, ptrs, a, b1, b2, sfa, sfb1, sfb2, out=None):
        """The call with the inputs' data pointers already read (``ptrs``: a, b1, b2, sfa, sfb1, sfb2, as the
        public call's pointer check returns them); returns ``out`` (allocated when None)."""
        if out is None:
            import torch

            out = torch.empty((self.problem.m, self.problem.n, 1), dtype=torch.float16, device=a.device)
        if self._pointers:
            if self._workspace:
                self.fn(*ptrs, *(t.data_ptr() for t in self.workspace(a)), out, *self._tail)
            else:
                self.fn(*ptrs, out)
        else:  # pragma: no cover - without apache-tvm-ffi, or the sm100 call
            self(a, b1, b2, sfa, sfb1, sfb2, out)
        return out

    def __call__(self, a, b1, b2, sfa, sfb1, sfb2, out=None):
        if self.arch == "sm100":
            return self.fn(a, b1, b2, sfa, sfb1, sfb2, out=out)
        if out is None:
            import torch

            out = torch.empty((self.problem.m, self.problem.n, 1), dtype=torch.float16, device=a.device)
        self.bind(a, b1, b2, sfa, sfb1, sfb2, out)()
        return out

    def __repr__(self) -> str:
        p = self.problem
        return f"GatedPlan({p.m}x{p.n}x{p.k}, {self.arch}: {self.config})"


def decode_clusters(device=None) -> tuple[int, ...]:
    """The clusters of 1, 2 and 4 CTAs (the decode twin's splits) ``device`` runs at once with one CTA per SM, as the
    driver reports them (:func:`~gemmlab.hardware.max_active_clusters`)."""
    return tuple(hardware.max_active_clusters(s, device) for s in DECODE_SPLITS)


def gated_sm90_config(problem: GatedProblem, device
                      ) -> PipelinedConfig | DecodeConfig | A16Config | SwapConfig | W16Config:
    """The heuristic's Hopper configuration on ``device``: its SMs, for the decode and swap twins its cluster capacity
    (:func:`decode_clusters`), for the W16 route chapter 07's model of its datasheet."""
    from .heuristic_sm90 import model_for

    clusters = decode_clusters(device) if problem.m <= heuristic_gated.SWAP_UP_TO else None
    return heuristic_gated.choose_sm90(problem, hardware.sm_count(device), clusters,
                                       model_for(hardware.spec_of(device)))


def make_gated_plan(problem: GatedProblem, tensors, config=None) -> GatedPlan:
    """The plan of ``problem`` for ``tensors`` (a, b1, b2, sfa, sfb1, sfb2, out, as
    :func:`~gemmlab.family.problem.gated_problem` accepted them) on this machine: the architecture's heuristic
    config (or ``config``), the compiled kernel. A machine without a Hopper or datacenter Blackwell GPU raises
    ``TierError``."""
    tier = tiers.detect_tier()
    if tier == "sm100":
        return GatedPlan(problem, config or heuristic_gated.choose_sm100(problem), "sm100")
    if tier != "sm90":
        tiers.require_tier("gpu", "gemmlab.gated_dual_gemm")  # raises TierError on this machine
        raise AssertionError("unreachable: require_tier accepted a cpu tier")  # pragma: no cover
    from ..kernels.dual_gemm_sm90 import check_devices as check_cuda

    cfg = config or gated_sm90_config(problem, tensors[0].device)
    if not isinstance(cfg, (PipelinedConfig, DecodeConfig, A16Config, SwapConfig, W16Config)):
        raise TypeError(f"cfg must be a PipelinedConfig, a DecodeConfig, an A16Config, a SwapConfig or a W16Config; "
                        f"got {type(cfg).__name__}")
    check_cuda(*tensors)
    out = tensors[6]
    return GatedPlan(problem, cfg, "sm90", None if out is None else tuple(out.stride()),
                     hardware.sm_count(tensors[0].device))


def prepare_gated(a, b1, b2, sfa, sfb1, sfb2, out, config=None):
    """``gated_dual_gemm`` as a zero-argument launch on these tensors: checked, compiled and converted once.

    On Hopper the heuristic's twin bound to these tensors (what the public call launches, without its
    per-call work); on a B200, a closure around the SM100 call. ``config`` forces a configuration (probes, sweeps).
    """
    from .problem import gated_problem

    problem = gated_problem(a, b1, b2, sfa, sfb1, sfb2, out)
    if out is None:
        raise ValueError("out must be a tensor for a prepared launch (it binds the output's pointer)")
    tier = tiers.detect_tier()
    if tier == "sm90":
        from ..kernels.dual_gemm_sm90 import check_devices as check_cuda

        check_cuda(a, b1, b2, sfa, sfb1, sfb2, out)
        plan = GatedPlan(problem, config or gated_sm90_config(problem, a.device), "sm90", tuple(out.stride()),
                         hardware.sm_count(a.device))
        run = plan.bind(a, b1, b2, sfa, sfb1, sfb2, out)
        run.plan = plan
        return run
    if tier == "sm100":
        plan = make_gated_plan(problem, (a, b1, b2, sfa, sfb1, sfb2, out), config)
        plan(a, b1, b2, sfa, sfb1, sfb2, out)  # compile now, not in the first timed launch
        return plan.bind(a, b1, b2, sfa, sfb1, sfb2, out)
    tiers.require_tier("gpu", "gemmlab.family.plan.prepare_gated")
    raise AssertionError("unreachable")  # pragma: no cover
