"""The contracts of the family's four calls: tensors in, checked once, a frozen problem out.

One problem kind per call, each built once per call signature (the plans cache them):

* :class:`GemmProblem` (``gemmlab.gemm``, chapters 07 and 10): :func:`problem_of`.
* :class:`GroupedProblem` (``gemmlab.grouped_gemm`` / ``grouped_gemm_list``, chapter 08):
  :func:`ragged_problem` (torch's ragged MoE convention) and :func:`list_problem` (independent problems).
* :class:`GatedProblem` (``gemmlab.gated_dual_gemm``, chapter 11): :func:`gated_problem`.

Everything here runs on the CPU tier: bad input gets a ``TypeError`` or ``ValueError``
naming the argument and the rule before anything compiles or launches. What a
signature cannot vouch for, where the tensors start (16-byte alignment, and an output sharing no byte with
an input), is checked on every call (:func:`check_pointers` and its grouped and gated kin).

The dense contract, ``C = A @ B`` with the meaning of ``torch.matmul``, on both architectures:

* ``a``: M x K, K-contiguous (row-major, rows packed: stride (K, 1)).
* ``b``: K x N, either N-contiguous (row-major K x N) or K-contiguous (the
  ``w.t()`` view of an N x K weight stored row-major, as a linear layer keeps
  it). Both are free views; nothing is copied.
* BF16 or FP16 in (``a`` and ``b`` alike), FP32 accumulation, the output in
  ``out``'s dtype (BF16 or FP16; by default ``a``'s dtype; chapter 10's kernel
  writes ``a``'s dtype only), M x N row-major, sharing no byte with ``a`` or ``b``.
* Any M, N, K from 1 to 2^31 - 1 (the kernels' sizes are 32-bit ints), as long
  as every contiguous dimension (K of ``a``, the contiguous one of ``b``, N of
  ``out``) is a multiple of 8 elements (16 bytes: TMA's rule for global strides)
  and every tensor starts 16-byte aligned.

M = 1 (and any size-1 dimension): torch may give a size-1 dimension any
stride (``torch.randn(k, 1).t()`` has strides (1, 1)); the stride of a
dimension of size 1 never addresses anything, so :func:`canonical` rewrites it
to the packed value before a tensor map is built from it. Kernels compiled for
static shapes (chapter 10's) also meet the DSL folding an extent of 1 away;
:func:`pad_rows` is their fix (two rows, one of them zero).
"""
from __future__ import annotations

from dataclasses import dataclass

from .. import nvfp4 as fp4
from ..checks import check_choice, check_int

#: TMA's alignment rule: tensor starts and every stride but the innermost a multiple of 16 bytes.
ALIGN_BYTES = 16
#: The dtypes ``gemmlab.gemm`` takes and writes, by torch name.
IN_DTYPES = ("bfloat16", "float16")
OUT_DTYPES = ("bfloat16", "float16")
#: The largest extent a tensor of the family's calls may have: the kernels take sizes as 32-bit ints.
MAX_EXTENT = 2 ** 31 - 1
#: Bits per element of every dtype the family knows (FP4 packs two values per byte).
DTYPE_BITS = {"bfloat16": 16, "float16": 16, "float32": 32, "float8_e4m3fn": 8, "float8_e5m2": 8,
              "float4_e2m1": 4}


def dtype_name(dtype) -> str:
    """``torch.bfloat16`` -> ``"bfloat16"`` (also accepts the name itself)."""
    return str(dtype).replace("torch.", "")


def dtype_bytes(name: str) -> float:
    check_choice("dtype", name, tuple(DTYPE_BITS))
    return DTYPE_BITS[name] / 8


@dataclass(frozen=True)
class GemmProblem:
    """One GEMM as the heuristics and plans see it: sizes, dtypes and B's layout, nothing else."""

    m: int
    n: int
    k: int
    dtype: str = "bfloat16"  # of a and b
    out_dtype: str = "bfloat16"
    b_major: str = "k"  # "k": b is w.t() of an N x K weight; "n": b is row-major K x N

    def __post_init__(self):
        for name in ("m", "n", "k"):  # stored as Python ints: numpy ints overflow in .flops
            object.__setattr__(self, name, check_int(name, getattr(self, name), lo=1))
        check_choice("dtype", self.dtype, IN_DTYPES)
        check_choice("out_dtype", self.out_dtype, OUT_DTYPES)
        check_choice("b_major", self.b_major, ("k", "n"))
        align = int(ALIGN_BYTES // dtype_bytes(self.dtype))
        if self.k % align:
            raise ValueError(f"K must be a multiple of {align} (16-byte rows of a); got K={self.k}")
        if self.n % align:
            raise ValueError(f"N must be a multiple of {align} (16-byte rows of the output); got N={self.n}")

    @property
    def flops(self) -> int:
        return 2 * self.m * self.n * self.k

    def min_bytes(self) -> float:
        """Bytes of A + B read once and C written once: the memory floor of any kernel."""
        e, o = dtype_bytes(self.dtype), dtype_bytes(self.out_dtype)
        return e * (self.m * self.k + self.k * self.n) + o * self.m * self.n


def _torch_dtypes():
    import torch

    return {"bfloat16": torch.bfloat16, "float16": torch.float16}


def check_extents(name: str, t) -> None:
    """Every extent of ``t`` at most :data:`MAX_EXTENT` (the kernels' sizes are 32-bit ints)."""
    if any(s > MAX_EXTENT for s in t.shape):
        raise ValueError(f"{name} has shape {tuple(t.shape)}: the kernels take sizes as 32-bit ints, each at most "
                         f"2^31 - 1")


def _packed(t) -> bool:
    """Row-major with rows packed, ignoring the stride of size-1 dimensions (they address nothing)."""
    rows, cols = t.shape
    return (t.stride(1) == 1 or cols == 1) and (t.stride(0) == cols or rows == 1)


def problem_of(a, b, out=None) -> GemmProblem:
    """Validate ``gemm``'s arguments and describe them as a :class:`GemmProblem`. No GPU needed."""
    import torch

    dts = tuple(_torch_dtypes().values())
    for name, t in (("a", a), ("b", b)) + ((("out", out),) if out is not None else ()):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor; got {type(t).__name__}")
        if t.dtype not in dts:
            raise TypeError(f"{name} must have dtype bfloat16 or float16; got {dtype_name(t.dtype)}")
        if t.dim() != 2:
            raise ValueError(f"{name} must be 2-D; got shape {tuple(t.shape)}")
        if t.numel() == 0:
            raise ValueError(f"{name} must hold at least one element; got shape {tuple(t.shape)}")
        check_extents(name, t)
    if a.dtype != b.dtype:
        raise TypeError(f"a and b must have the same dtype; got {dtype_name(a.dtype)} and {dtype_name(b.dtype)}")
    m, k = a.shape
    if b.shape[0] != k:
        raise ValueError(f"b must be K x N with K = a.shape[1] = {k} (C = a @ b); got shape {tuple(b.shape)}. "
                         "For an N x K weight w pass w.t().")
    n = b.shape[1]
    if a.stride(1) != 1 and k > 1:
        raise ValueError(f"a must be K-contiguous (row-major M x K, stride 1 along K); got strides {tuple(a.stride())}. Pass a.contiguous().")
    if not _packed(a):
        raise ValueError(f"a's rows must be packed (row stride = K = {k}); got strides {tuple(a.stride())}. "
                         "Pass a.contiguous() for a row-strided view.")
    if _packed(b):  # K and N are multiples of 8, so at most one of the two layouts can match
        b_major = "n"
    elif _packed(b.t()):
        b_major = "k"
    else:
        raise ValueError("b must be N-contiguous (row-major K x N) or K-contiguous (w.t() of a row-major "
                         f"N x K w), with packed rows; got strides {tuple(b.stride())}")
    out_dtype = dtype_name(out.dtype if out is not None else a.dtype)
    if out is not None:
        if tuple(out.shape) != (m, n):
            raise ValueError(f"out must have shape (M, N) = ({m}, {n}); got {tuple(out.shape)}")
        if not _packed(out):
            raise ValueError(f"out must be contiguous (row-major M x N, rows packed); got strides {tuple(out.stride())}")
    prob = GemmProblem(m, n, k, dtype_name(a.dtype), out_dtype, b_major)
    check_pointers(a, b, out)
    return prob


def span(t) -> int:
    """The bytes ``t`` addresses, from its first element to one past its last (0 when empty): with its data
    pointer, the address range two tensors must not share when one is written and the other read."""
    if t.numel() == 0:
        return 0
    return (sum((s - 1) * st for s, st in zip(t.shape, t.stride())) + 1) * t.element_size()


def spans(*tensors) -> tuple:
    """:func:`span` of each tensor (0 for None): fixed by a call signature, so a plan's entry keeps them."""
    return tuple(0 if t is None else span(t) for t in tensors)


def overlap_error(out_name: str, name: str) -> ValueError:
    return ValueError(f"{out_name} overlaps {name} in memory ({out_name}={name}, or a view of the same storage): "
                      f"the kernel would overwrite {name} while it still reads it; pass a separate output tensor")


def check_pointers(a, b, out=None, extents=None) -> None:
    """What no call signature can vouch for, checked on every call: every tensor starts 16-byte aligned (TMA's
    rule), and ``out`` shares no byte with ``a`` or ``b`` (``extents``: their :func:`spans`, kept by the plan's
    entry; computed here when not given). A disjoint slice of the same storage is fine."""
    pa, pb = a.data_ptr(), b.data_ptr()
    if out is None:
        if (pa | pb) % ALIGN_BYTES:
            _misaligned((("a", a), ("b", b)))
        return
    po = out.data_ptr()
    if (pa | pb | po) % ALIGN_BYTES:
        _misaligned((("a", a), ("b", b), ("out", out)))
    sa, sb, so = extents or spans(a, b, out)
    if po < pa + sa and pa < po + so:
        raise overlap_error("out", "a")
    if po < pb + sb and pb < po + so:
        raise overlap_error("out", "b")


def check_aligned(name: str, t):
    """``t`` starts 16-byte aligned (TMA's rule)."""
    if t.data_ptr() % ALIGN_BYTES:
        raise ValueError(f"{name} must start at a 16-byte aligned address; its data pointer is "
                         f"{t.data_ptr() % ALIGN_BYTES} bytes past alignment")


def _misaligned(named) -> None:
    """The error for the first misaligned tensor of ``named`` ((name, tensor) pairs; one of them is)."""
    for name, t in named:
        check_aligned(name, t)


def check_devices(a, b, out=None) -> None:
    """All tensors on one CUDA device (checked when a plan is made; the plan cache is keyed by device)."""
    dev = a.device
    for name, t in (("a", a), ("b", b), ("out", out)):
        if t is None:
            continue
        if t.device.type != "cuda":
            raise ValueError(f"{name} must be on a cuda device; got {t.device}")
        if t.device != dev:
            raise ValueError(f"a, b and out must be on the same device; got {dev} and {t.device} ({name})")


def canonical(t, row_major: bool = True):
    """``t`` with packed strides, rewriting the stride of a size-1 dimension (a free view; ``t`` if already so).

    ``row_major``: strides ``(cols, 1)``; else ``(1, rows)`` (a K-contiguous ``b``).
    """
    want = (t.shape[1], 1) if row_major else (1, t.shape[0])
    return t if t.stride() == want else t.as_strided(t.shape, want)


def canonical_operands(a, b, out, b_major: str):
    """``(a, b, out)`` as the compiled kernels expect them: :func:`canonical` of each (``out`` may be None)."""
    return canonical(a), canonical(b, row_major=b_major == "n"), None if out is None else canonical(out)


def pad_rows(a, out):
    """For kernels compiled with static shapes: M = 1 becomes two rows (the second zero); returns ``(a2, out2)``.

    With static shapes CuTe DSL folds an extent of 1 away, so A's and C's tensor
    maps would become 1-D while the kernel issues 2-D boxes (found on an H200:
    an illegal instruction). The caller copies ``out2[:1]`` back.
    """
    import torch

    a2 = torch.zeros((2, a.shape[1]), dtype=a.dtype, device=a.device)
    a2[:1].copy_(a)
    out2 = torch.empty((2, out.shape[1]), dtype=out.dtype, device=out.device)
    return a2, out2


# --------------------------------------------------------------------------------------
# Grouped (chapter 08): torch's ragged MoE convention, and a list of independent problems
# --------------------------------------------------------------------------------------

GROUPED_MODES = ("ragged", "table")


@dataclass(frozen=True)
class GroupedProblem:
    """One grouped GEMM as its heuristic and plan see it (the host never reads ``offs``: group sizes stay on the GPU).

    ``mode``: ``"ragged"`` (``a`` (T, K) holds every group's rows, ``b`` (G, K, N)) or ``"table"`` (independent
    problems, one row of a table each). ``tokens``: the rows of ``a`` (ragged) or of all problems together
    (table); ``groups``: G (ragged) or the problems with rows (table); ``n``: N (table: the widest); ``k``: K
    (table: 0, every problem has its own); ``b_major``: ``"k"`` or ``"n"``, the same for every group.
    """

    mode: str
    tokens: int
    groups: int
    n: int
    k: int
    dtype: str = "bfloat16"
    b_major: str = "k"

    def __post_init__(self):
        check_choice("mode", self.mode, GROUPED_MODES)
        for name in ("tokens", "groups", "n", "k"):  # stored as Python ints, as GemmProblem's
            object.__setattr__(self, name, check_int(name, getattr(self, name), lo=0))
        check_choice("dtype", self.dtype, IN_DTYPES)
        check_choice("b_major", self.b_major, ("k", "n"))


def _check_matrix(name: str, t, dtype: str):
    import torch
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor; got {type(t).__name__}")
    if dtype_name(t.dtype) != dtype:
        raise TypeError(f"{name} must be {dtype} like a; got {dtype_name(t.dtype)}")


def check_row_major(name: str, t):
    """Rows contiguous (stride 1 along the last dimension), the row stride a multiple of 16 bytes, the start
    16-byte aligned (the one part of it a call signature cannot vouch for)."""
    rows, cols = t.shape[-2], t.shape[-1]
    if t.stride(-1) != 1 and cols > 1:
        raise ValueError(f"{name} must have contiguous rows (stride 1 along its last dimension); "
                         f"got strides {tuple(t.stride())}")
    if rows > 1 and (t.stride(-2) * t.element_size()) % 16:
        raise ValueError(f"{name}'s row stride must be a multiple of 16 bytes (TMA); got "
                         f"{t.stride(-2)} elements of {t.element_size()} bytes")
    if t.data_ptr() % 16:
        raise ValueError(f"{name} must start at a 16-byte-aligned address (TMA); it starts at {t.data_ptr():#x}")


def check_output_rows(name: str, t):
    """An output's rows must not overlap (a row stride of at least its width: not 0, not a sliding window), or
    the kernel's stores of one row would land in another's."""
    rows, cols = t.shape[-2], t.shape[-1]
    if rows > 1 and t.stride(-2) < cols:
        raise ValueError(f"{name}'s rows overlap (row stride {t.stride(-2)} < its {cols} columns): every row "
                         f"must have memory of its own")


def b_major_of(name: str, b) -> str:
    """``"n"`` when the weights' rows (N) are contiguous, ``"k"`` when each column of K is; else an error."""
    k, n = b.shape[-2], b.shape[-1]
    if b.stride(-1) == 1 and (b.stride(-2) == n or k == 1):
        return "n"
    if b.stride(-2) == 1 and (b.stride(-1) == k or n == 1):
        return "k"
    raise ValueError(f"{name} must be dense along K or along N in its last two dimensions (K x N, either "
                     f"contiguous order); got shape {tuple(b.shape)} with strides {tuple(b.stride())}")


def check_offs(offs, groups: int, rows: int, *, validate: bool = True) -> None:
    """``offs``: int32, shape (G,), contiguous; with ``validate`` (one device-to-host copy) also non-decreasing
    and at most T."""
    import torch
    if not isinstance(offs, torch.Tensor):
        raise TypeError(f"offs must be a torch.Tensor of int32; got {type(offs).__name__}")
    if offs.dtype != torch.int32:
        raise TypeError(f"offs must be int32 (cumulative end row of each group); got {dtype_name(offs.dtype)}")
    if offs.dim() != 1 or offs.shape[0] != groups:
        raise ValueError(f"offs must have shape ({groups},): one end row per group of b; got {tuple(offs.shape)}")
    if offs.stride(0) != 1 and groups > 1:
        raise ValueError("offs must be contiguous")
    if validate and groups:
        check_offs_values(offs, rows)


def offs_rule(g: int, end: int, prev: int, rows: int) -> str:
    """Which rule ``offs[g] = end`` breaks (``prev``: the end before it, 0 for group 0): decreasing, else past
    ``rows``. The host check (:func:`check_offs_values`) and the kernel's report
    (:class:`gemmlab.family.plan.OffsReport`) say it in these words."""
    if end < prev:
        return f"offs must be non-decreasing from 0: offs[{g}] = {end} < {'offs[%d] = %d' % (g - 1, prev) if g else 0}"
    return f"offs[{g}] = {end} is past the {rows} rows of a"


def check_offs_values(offs, rows: int) -> None:
    """``offs`` non-decreasing from 0 and at most ``rows``: one device-to-host copy, which waits for the GPU."""
    host = offs.tolist()
    if not host or (host[0] >= 0 and host[-1] <= rows and host == sorted(host)):
        return  # the common case, at C speed (a Python loop over 128 groups costs a few microseconds)
    prev = 0
    for g, end in enumerate(host):
        if end < prev:
            raise ValueError(offs_rule(g, end, prev, rows))
        prev = end
    if prev > rows:
        raise ValueError(offs_rule(-1, prev, prev, rows))


def check_ragged(a, b, offs, out, *, validate: bool = True) -> str:
    """Every rule of ``grouped_gemm``'s arguments (the device's kind is the machine's question, asked after the
    tier: :func:`gemmlab.family.plan.grouped_machine`); returns B's layout ("k" or "n")."""
    import torch
    if not isinstance(a, torch.Tensor):
        raise TypeError(f"a must be a torch.Tensor; got {type(a).__name__}")
    dtype = dtype_name(a.dtype)
    if dtype not in ("bfloat16", "float16"):
        raise TypeError(f"a must be bfloat16 or float16; got {dtype}")
    _check_matrix("b", b, dtype)
    if out is not None:
        _check_matrix("out", out, dtype)
    if a.dim() != 2:
        raise ValueError(f"a must be 2-D (tokens x K); got shape {tuple(a.shape)}")
    if b.dim() != 3:
        raise ValueError(f"b must be 3-D (groups x K x N); got shape {tuple(b.shape)}")
    for name, t in (("a", a), ("b", b)):
        check_extents(name, t)
    rows, k = a.shape
    groups, kb, n = b.shape
    if kb != k:
        raise ValueError(f"a is {rows} x {k} but b is {groups} x {kb} x {n}: K must match")
    if k % 8 or n % 8:
        raise ValueError(f"K and N must be multiples of 8 (16-byte TMA rows); got K = {k}, N = {n}")
    if k == 0 or n == 0 or groups == 0:
        raise ValueError(f"K, N and the group count must be positive; got K = {k}, N = {n}, G = {groups}")
    check_offs(offs, groups, rows, validate=False)
    check_row_major("a", a)
    major = b_major_of("b", b)
    if groups > 1 and (b.stride(0) * b.element_size()) % 16:
        raise ValueError(f"b's group stride must be a multiple of 16 bytes; got {b.stride(0)} elements")
    if out is not None:
        if tuple(out.shape) != (rows, n):
            raise ValueError(f"out must have shape ({rows}, {n}); got {tuple(out.shape)}")
        check_row_major("out", out)
        check_output_rows("out", out)
    devices = {t.device for t in (a, b, offs) + ((out,) if out is not None else ())}
    if len(devices) != 1:
        raise ValueError(f"a, b, offs and out must be on one device; got {sorted(map(str, devices))}")
    check_pointers(a, b, out)
    if validate and groups:
        check_offs_values(offs, rows)
    return major


def ragged_problem(a, b, offs, out=None, *, validate: bool = False) -> GroupedProblem:
    """:func:`check_ragged` and the problem it describes; ``offs`` is read back (waiting for the GPU) only with
    ``validate``."""
    major = check_ragged(a, b, offs, out, validate=validate)
    (rows, k), (groups, _, n) = a.shape, b.shape
    return GroupedProblem("ragged", rows, groups, n, k, dtype_name(a.dtype), major)


def as_list(name: str, items, what: str) -> list:
    """``items`` (any iterable but a tensor or a string) as a list; else a ``TypeError`` naming ``name``."""
    import torch
    if isinstance(items, (str, bytes, dict, torch.Tensor)):
        raise TypeError(f"{name} must be a list of {what}; got {type(items).__name__}")
    try:
        return list(items)
    except TypeError:
        raise TypeError(f"{name} must be a list of {what}; got {type(items).__name__}") from None


def check_list(pairs, outs=None) -> tuple[list, list | None, str]:
    """Every rule of ``grouped_gemm_list``'s arguments (the device's kind is asked after the tier); returns
    ``(pairs, outs, b_major)`` (lists; ``outs`` None when not given)."""
    import torch
    pairs = as_list("pairs", pairs, "(a, b) pairs of tensors")
    if not pairs:
        raise ValueError("pairs must hold at least one (a, b) problem")
    for i, pair in enumerate(pairs):
        if isinstance(pair, (str, bytes, torch.Tensor)) or not hasattr(pair, "__len__") or len(pair) != 2:
            size = f" of {len(pair)}" if hasattr(pair, "__len__") and not isinstance(pair, torch.Tensor) else ""
            raise TypeError(f"pairs[{i}] must be an (a, b) pair of tensors; got {type(pair).__name__}{size}")
    a0 = pairs[0][0]
    if not isinstance(a0, torch.Tensor):
        raise TypeError(f"pairs[0][0] must be a torch.Tensor; got {type(a0).__name__}")
    dtype = dtype_name(a0.dtype)
    if dtype not in ("bfloat16", "float16"):
        raise TypeError(f"pairs[0][0] must be bfloat16 or float16; got {dtype}")
    majors = set()
    for i, (ai, bi) in enumerate(pairs):
        _check_matrix(f"pairs[{i}][0]", ai, dtype)
        _check_matrix(f"pairs[{i}][1]", bi, dtype)
        if ai.dim() != 2 or bi.dim() != 2:
            raise ValueError(f"pairs[{i}] must hold 2-D matrices; got {tuple(ai.shape)} and {tuple(bi.shape)}")
        check_extents(f"pairs[{i}][0]", ai)
        check_extents(f"pairs[{i}][1]", bi)
        if ai.shape[1] != bi.shape[0]:
            raise ValueError(f"pairs[{i}]: a is {tuple(ai.shape)}, b is {tuple(bi.shape)}: K must match")
        kk, nn = bi.shape
        if kk % 8 or nn % 8 or kk == 0 or nn == 0:
            raise ValueError(f"pairs[{i}]: K and N must be positive multiples of 8; got K = {kk}, N = {nn}")
        check_row_major(f"pairs[{i}][0]", ai)
        majors.add(b_major_of(f"pairs[{i}][1]", bi))
        check_aligned(f"pairs[{i}][1]", bi)
        if ai.device != a0.device or bi.device != a0.device:
            raise ValueError(f"pairs[{i}] is not on {a0.device} like pairs[0][0]")
    if len(majors) > 1:
        raise ValueError("every b must have the same layout (all K-contiguous or all N-contiguous); got both")
    if outs is not None:
        outs = as_list("outs", outs, "output tensors")
        if len(outs) != len(pairs):
            raise ValueError(f"outs must hold one matrix per pair: {len(pairs)}; got {len(outs)}")
        for i, ((ai, bi), ci) in enumerate(zip(pairs, outs)):
            _check_matrix(f"outs[{i}]", ci, dtype)
            if tuple(ci.shape) != (ai.shape[0], bi.shape[1]):
                raise ValueError(f"outs[{i}] must have shape ({ai.shape[0]}, {bi.shape[1]}); got {tuple(ci.shape)}")
            check_row_major(f"outs[{i}]", ci)
            check_output_rows(f"outs[{i}]", ci)
            if ci.device != a0.device:
                raise ValueError(f"outs[{i}] is not on {a0.device} like pairs[0][0]")
    return pairs, outs, majors.pop()


def check_table_pointers(rows, index, b_major: str, element_size: int, *, outs_given: bool) -> None:
    """The list form's per-call checks, read from its problem table (:func:`gemmlab.family.plan.problem_table`:
    one row per problem with rows, ``index`` its place in ``pairs``): every ``a``, ``b`` and ``out`` starts 16-byte
    aligned, and, when the caller gave ``outs``, no output shares a byte with another output or with any input.
    One sort and a binary search per input: O(G log G), nothing when ``outs`` were made here."""
    from bisect import bisect_left
    for (pa, pb, pc, *_), i in zip(rows, index):
        if (pa | pb | pc) % ALIGN_BYTES:
            for name, p in ((f"pairs[{i}][0]", pa), (f"pairs[{i}][1]", pb), (f"outs[{i}]", pc)):
                if p % ALIGN_BYTES:
                    raise ValueError(f"{name} must start at a 16-byte aligned address; its data pointer is "
                                     f"{p % ALIGN_BYTES} bytes past alignment")
    if not outs_given:
        return
    es, written, read = element_size, [], []
    for (pa, pb, pc, m, n, k, lda, ldb, ldc), i in zip(rows, index):
        written.append((pc, pc + ((m - 1) * ldc + n) * es, i))
        read.append((pa, pa + ((m - 1) * lda + k) * es, f"pairs[{i}][0]"))
        b_span = ((k - 1) * ldb + n) if b_major == "n" else ((n - 1) * ldb + k)
        read.append((pb, pb + b_span * es, f"pairs[{i}][1]"))
    written.sort()
    for (_, end, i), (start, _, j) in zip(written, written[1:]):
        if start < end:
            raise overlap_error(f"outs[{j}]", f"outs[{i}]")
    starts = [w[0] for w in written]
    for start, end, name in read:
        j = bisect_left(starts, end) - 1  # the last output starting before this input ends
        if j >= 0 and written[j][1] > start:
            raise overlap_error(f"outs[{written[j][2]}]", name)


def list_problem(pairs, b_major: str) -> GroupedProblem:
    """The table-mode problem of checked ``pairs`` (:func:`check_list`): the problems with rows, their rows
    together, the widest N."""
    live = [(a, b) for a, b in pairs if a.shape[0] > 0]
    return GroupedProblem("table", sum(a.shape[0] for a, _ in live), len(live),
                          max((b.shape[1] for _, b in live), default=0), 0, dtype_name(pairs[0][0].dtype), b_major)


# --------------------------------------------------------------------------------------
# Gated NVFP4 (chapter 11): silu(A B1^T) * (A B2^T)
# --------------------------------------------------------------------------------------


def check_gated_sizes(m, n, k) -> tuple[int, int, int]:
    """Sizes the gated kernels take, as Python ints: :func:`gemmlab.nvfp4.check_problem`'s (M, N >= 1, K a positive
    multiple of 256) and N a multiple of 8: C's FP16 rows are stored in 16-byte pieces."""
    m, n, k, _ = fp4.check_problem(m, n, k)
    if n % 8:
        raise ValueError(f"N must be a multiple of 8 (16-byte rows of the FP16 output); got N={n}")
    return m, n, k


@dataclass(frozen=True)
class GatedProblem:
    """``C = silu(A B1^T) * (A B2^T)`` in FP16 from NVFP4 operands (GPU MODE's layouts, L = 1): M, N, K."""

    m: int
    n: int
    k: int

    def __post_init__(self):
        m, n, k = check_gated_sizes(self.m, self.n, self.k)  # stored as Python ints, as GemmProblem's
        for name, v in (("m", m), ("n", n), ("k", k)):
            object.__setattr__(self, name, v)


def check_gated_output(out, m: int, n: int):
    """``out`` must be None or an FP16 ``(M, N, 1)`` tensor, row-major with packed rows (strides (N, 1) over M, N:
    both kernels store C with row stride N)."""
    import torch

    from ..checks import check_tensor

    if out is None:
        return
    check_tensor("out", out, dtypes=(torch.float16,), ndim=3, contiguous=False, device=None)
    if tuple(out.shape) != (m, n, 1):
        raise ValueError(f"out must have shape {(m, n, 1)} (M, N, L); got {tuple(out.shape)}")
    if out[..., 0].stride(1) != 1:
        raise ValueError(f"out must be N-major (stride 1 along N); got strides {out.stride()}")
    if m > 1 and out.stride(0) != n:
        raise ValueError(f"out must be compact (row stride N={n}); got strides {out.stride()}")


def _check_packed_rows(name: str, t, width: int, what: str):
    """``t`` (rows, width, 1) row-major with packed rows: the kernels read rows of ``width`` bytes, one after the
    other (a row stride of ``width``; stride 1 along them)."""
    rows = t.shape[0]
    if (t.stride(1) != 1 and width > 1) or (rows > 1 and t.stride(0) != width):
        raise ValueError(f"{name} must be row-major with packed rows ({what}: strides ({width}, 1) over its first "
                         f"two dimensions); got strides {tuple(t.stride())}. Pass {name}.contiguous()")


GATED_NAMES = ("a", "b1", "b2", "sfa", "sfb1", "sfb2", "out")


def check_gated_arguments(a, b1, b2, sfa, sfb1, sfb2, out=None) -> tuple:
    """Everything ``gated_dual_gemm`` checks before it looks at the hardware; returns ``(M, N, K)``."""
    m, n, k, l = fp4.check_operands(a, b1, b2, sfa, sfb1, sfb2)
    if l != 1:
        raise ValueError(f"L must be 1 (the kernels' batch is one problem); got L={l}")
    check_gated_sizes(m, n, k)
    for name, t in (("a", a), ("b1", b1), ("b2", b2)):
        check_extents(name, t)
        _check_packed_rows(name, t, k // 2, "K/2 packed bytes a row")
    for name, t in (("sfa", sfa), ("sfb1", sfb1), ("sfb2", sfb2)):
        _check_packed_rows(name, t, k // fp4.SF_VEC, "K/16 scales a row")
    check_gated_output(out, m, n)
    if out is not None and out.device != a.device:
        raise ValueError(f"out must be on a's device {a.device}; got {out.device}")
    tensors = (a, b1, b2, sfa, sfb1, sfb2, out)
    check_gated_pointers(tensors, spans(*tensors))
    return m, n, k


def check_gated_pointers(tensors, extents) -> tuple:
    """``gated_dual_gemm``'s per-call checks (a signature cannot vouch for them): every tensor of ``tensors`` (a, b1,
    b2, sfa, sfb1, sfb2, out) starts 16-byte aligned (the kernels' TMA copies), and ``out`` shares no byte with an
    input (``extents``: their :func:`spans`). Returns the six inputs' data pointers (the plan launches with them)."""
    a, b1, b2, sfa, sfb1, sfb2, out = tensors
    ptrs = (a.data_ptr(), b1.data_ptr(), b2.data_ptr(), sfa.data_ptr(), sfb1.data_ptr(), sfb2.data_ptr())
    po = 0 if out is None else out.data_ptr()
    if (ptrs[0] | ptrs[1] | ptrs[2] | ptrs[3] | ptrs[4] | ptrs[5] | po) % ALIGN_BYTES:
        _misaligned([(name, t) for name, t in zip(GATED_NAMES, tensors) if t is not None])
    if out is not None:
        end = po + extents[6]
        for name, p, size in zip(GATED_NAMES, ptrs, extents):
            if po < p + size and p < end:
                raise overlap_error("out", name)
    return ptrs


def gated_problem(a, b1, b2, sfa, sfb1, sfb2, out=None) -> GatedProblem:
    """:func:`check_gated_arguments` and the problem it describes. No GPU needed."""
    return GatedProblem(*check_gated_arguments(a, b1, b2, sfa, sfb1, sfb2, out))
