"""Chapters 01-08's sm_90a kernels at small shapes: on the emulator, on the GPU, and against the course's models.

Each :class:`Case` is one kernel in one configuration at one small shape, with

* ``make(seed)``: fresh inputs (CPU tensors; outputs start poisoned),
* ``emulate(inputs, seed)``: the kernel compiled by its module's ``compile_*`` function for
  ``sm_90a`` and run on the emulator; returns ``(outputs, launch reports)``,
* ``gpu(inputs)``: the same kernel through the course's GPU path on a copy of the same
  inputs (an H100/H200 only); returns the outputs on the CPU,
* ``reference(inputs)``: what the course's CPU model or torch says the outputs are,
* ``checks``: how each output is compared (:class:`Exact`, :class:`Mma`, :class:`Completes`, :class:`Broken`).

``tests/test_emulator_sm90.py`` runs the emulator half against the references;
``benchmarks/emulator_vs_gpu.py`` runs both halves and compares the emulator with the GPU.

Numerics of the MMA kernels (:class:`Mma`). The emulator sums a WGMMA's products in FP32
with torch, in torch's order; the tensor core sums them in its own order, with its own
rounding. Both are FP32 accumulations of the same exact products (BF16/FP16 products are
exact in FP32), so each is within the bound of recursive summation of the exact sum:
``|acc - exact| <= K * u * sum_k |a_k b_k|`` with ``u = 2^-23`` (one unit of FP32, which also
covers truncating instead of rounding each addition). FP32 accumulators (chapter 06's probe
registers, chapter 07's split-K workspace) are therefore checked to within that bound of the
exact product, and the emulator's to within twice it of the GPU's. An output rounded to BF16/FP16
adds one rounding of that type: where the two accumulators straddle a rounding boundary, the
outputs differ by one unit in the last place; the check allows one ulp of the output type on top.

Everything is called through the chapter modules' and :mod:`gemmlab.kernels`' public ``compile_*`` functions
(with keyword arguments) and the course's public calls (:mod:`gemmlab.family.api`, :mod:`gemmlab.family.plan`).
"""
from __future__ import annotations

import functools
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

TARGET = "sm_90a"
U32 = 2.0 ** -23  # FP32 accumulation: one unit in the last place of 1.0 (truncation included)


# ---------------------------------------------------------------------------------------------
# Comparisons
# ---------------------------------------------------------------------------------------------


@dataclass
class Verdict:
    ok: bool
    comparison: str  # what was compared, in words
    max_diff: float  # the largest absolute difference found
    detail: str = ""
    of_bound: float | None = None  # MMA checks: the largest difference as a fraction of its element's bound


def _bytes(t):
    import torch

    t = t.detach().cpu().contiguous()
    return t.view(-1).view(torch.uint8) if t.dtype != torch.uint8 else t.view(-1)


class Exact:
    """Bit for bit: the same bytes."""

    comparison = "bit for bit"

    def compare(self, got, want, inputs, sides: int = 2) -> Verdict:
        import torch

        if tuple(got.shape) != tuple(want.shape) or got.dtype != want.dtype:
            return Verdict(False, self.comparison, float("inf"),
                           f"shape/dtype {tuple(got.shape)} {got.dtype} vs {tuple(want.shape)} {want.dtype}")
        a, b = _bytes(got), _bytes(want)
        bad = int((a != b).sum())
        diff = 0.0
        if bad and got.dtype.is_floating_point:
            diff = float((got.double() - want.double()).abs().nan_to_num(float("inf")).max())
        elif bad:
            diff = float((got.to(torch.int64) - want.to(torch.int64)).abs().max()) if got.dtype != torch.bool else 1.0
        return Verdict(bad == 0, self.comparison, diff, f"{bad} of {a.numel()} bytes differ" if bad else "")


def _ulp(x, dtype) -> "torch.Tensor":
    """One unit in the last place of ``|x|`` in ``dtype`` (BF16: 8 bits of precision, FP16: 11, FP32: 24)."""
    import torch

    bits = {torch.bfloat16: 8, torch.float16: 11, torch.float32: 24}[dtype]
    tiny = {torch.bfloat16: 2.0 ** -133, torch.float16: 2.0 ** -24, torch.float32: 2.0 ** -149}[dtype]
    e = torch.floor(torch.log2(x.abs().clamp_min(tiny)))
    return torch.clamp_min(torch.exp2(e - (bits - 1)), tiny)


class Mma:
    """Within the FP32 summation bound (see the module docstring), plus one ulp where the output is rounded.

    ``operands(inputs)``: ``[(index, a, b), ...]`` with ``out[index] ~ a @ b`` (``a`` M x K, ``b`` K x N);
    ``acc``: the output holds FP32 accumulators (no further rounding).
    """

    def __init__(self, operands: Callable, acc: bool = False):
        self.operands = operands
        self.acc = acc
        self.comparison = ("FP32 accumulators within sides x K 2^-23 sum|ab|" if acc else
                           "1 ulp + sides x K 2^-23 sum|ab|")

    def compare(self, got, want, inputs, sides: int = 2) -> Verdict:
        import torch

        if tuple(got.shape) != tuple(want.shape):
            return Verdict(False, self.comparison, float("inf"), f"shape {tuple(got.shape)} vs {tuple(want.shape)}")
        worst, identical, total, biggest, bad = 0.0, 0, 0, 0.0, 0
        err2, ref2 = 0.0, 0.0
        for index, a, b in self.operands(inputs):
            x, y = got[index].double(), want[index].double()
            a64, b64 = a.double(), b.double()
            bound = sides * a64.shape[1] * U32 * (a64.abs() @ b64.abs())
            if not self.acc:
                bound = bound + _ulp(torch.maximum(x.abs(), y.abs()), got.dtype)
            if y.shape != x.shape:
                return Verdict(False, self.comparison, float("inf"), f"region shapes {x.shape} vs {y.shape}")
            d = (x - y).abs().nan_to_num(float("inf"))
            bad += int((d > bound).sum())
            ratio = torch.where(bound > 0, d / bound, torch.where(d > 0, torch.inf, 0.0))
            worst = max(worst, float(ratio.max()) if ratio.numel() else 0.0)
            biggest = max(biggest, float(d.max()) if d.numel() else 0.0)
            identical += int((d == 0).sum())
            total += d.numel()
            err2 += float(((x - y) ** 2).nan_to_num(float("inf")).sum())
            ref2 += float((y ** 2).sum())
        detail = ((f"{identical} of {total} identical, " if sides > 1 else "")
                  + f"worst difference {worst:.3g} of its bound" + (f", {bad} beyond it" if bad else ""))
        if self.acc and ref2 > 0:
            detail += f", relative error {(err2 / ref2) ** 0.5:.2e} (Frobenius)"
        return Verdict(bad == 0, self.comparison.replace("sides", str(sides)), biggest, detail, worst)


class Completes:
    """No defined data to compare: the kernel ran to its end (``out[0]`` holds a positive clock difference)."""

    comparison = "completes (no defined output)"

    def compare(self, got, want, inputs, sides: int = 2) -> Verdict:
        ran = [int(got.view(-1)[0]) > 0] + ([int(want.view(-1)[0]) > 0] if sides > 1 else [])  # and the GPU's
        return Verdict(all(ran), self.comparison, 0.0, "" if all(ran) else "a run did not record its clock")


class Broken:
    """A deliberately broken variant: the output must be *wrong* (differ from the reference)."""

    comparison = "wrong, as on the GPU"

    def __init__(self, inner):
        self.inner = inner

    def compare(self, got, want, inputs, sides: int = 1) -> Verdict:
        v = self.inner.compare(got, want, inputs, sides)
        return Verdict(not v.ok, self.comparison, v.max_diff, v.detail)


# ---------------------------------------------------------------------------------------------
# Cases
# ---------------------------------------------------------------------------------------------


@dataclass
class Case:
    chapter: int
    kernel: str
    config: str
    shape: str
    make: Callable  # seed -> {name: CPU tensor}
    emulate: Callable  # (inputs, seed) -> ({name: CPU tensor}, [LaunchReport])
    gpu: Callable  # inputs -> {name: CPU tensor}
    reference: Callable  # inputs -> {name: CPU tensor}
    checks: dict  # output name -> comparison
    seeds: tuple = (0,)  # interleavings the tests run (several where the schedule matters)
    quick: bool = True  # part of tests/test_emulator_sm90.py (the benchmark runs every case)

    @property
    def name(self) -> str:
        return f"{self.kernel} [{self.config}] {self.shape}"


def _gen(seed: int):
    import torch

    return torch.Generator().manual_seed(1000 + seed)


def _randint32(n, g):
    import torch

    return torch.randint(-2 ** 31, 2 ** 31 - 1, (n,), dtype=torch.int32, generator=g)


def _randbytes(n, g):
    import torch

    return torch.randint(0, 256, (n,), dtype=torch.uint8, generator=g)


def _randn(shape, dtype, g):
    import torch

    return torch.randn(shape, generator=g).to(dtype)


def _cuda(inputs: dict) -> dict:
    return {k: (v.cuda() if hasattr(v, "cuda") else v) for k, v in inputs.items()}


def _cpu(outputs: dict) -> dict:
    import torch

    torch.cuda.synchronize()
    return {k: v.detach().cpu() for k, v in outputs.items()}


_COMPILED: dict = {}


def _compiled(key, build):
    """Compile once per process (the compile_* functions themselves do not cache)."""
    c = _COMPILED.get(key)
    if c is None:
        t0 = time.perf_counter()
        c = _COMPILED[key] = build()
        _COMPILE_SECONDS[key] = time.perf_counter() - t0
    return c


_COMPILE_SECONDS: dict = {}


def _dynamic(t, align: int = 16):
    """A CPU tensor as the CuTe DSL tensor a kernel compiled with symbolic sizes takes (layout marked dynamic).

    The plans pass torch tensors through TVM-FFI, which reads sizes and strides at run time; without TVM-FFI a
    ``from_dlpack`` tensor keeps a static layout and the host code of such a kernel reads zeros for its sizes.
    """
    from cutlass.cute.runtime import from_dlpack

    lead = [i for i in range(t.dim()) if t.stride(i) == 1 and t.shape[i] > 1] or \
        [i for i in range(t.dim()) if t.stride(i) == 1]
    return from_dlpack(t, assumed_align=align).mark_layout_dynamic(leading_dim=lead[-1])


def _emulate(compiled, args, seed, *, dynamic=False, aligns=None, extra=()):
    """Run ``compiled`` on the emulator with ``args`` (CPU tensors and scalars)."""
    import torch

    from .run import run_on_emulator

    if not dynamic:
        return run_on_emulator(compiled, *args, seed=seed, extra_memory=extra)
    aligns = aligns or {}
    conv = [(_dynamic(a, aligns.get(i, 16)) if isinstance(a, torch.Tensor) else a) for i, a in enumerate(args)]
    memory = [a for a in args if isinstance(a, torch.Tensor)] + list(extra)
    return run_on_emulator(compiled, *conv, seed=seed, extra_memory=memory)


def _gpu_compiled(compiled, args, *, dynamic=False, aligns=None):
    """Launch a compiled artifact (the one the emulator runs) on the GPU, on torch's current stream."""
    import torch

    from ..compile import current_stream, to_cute

    aligns = aligns or {}
    conv = [((_dynamic(a, aligns.get(i, 16)) if dynamic else to_cute(a)) if isinstance(a, torch.Tensor) else a)
            for i, a in enumerate(args)]
    compiled(*conv, current_stream())


# ---- chapter 01 -------------------------------------------------------------------------------


def _copy_cases():
    from .. import ldst

    out = []
    nwords = 3 * 1024 + 20  # several CTAs; the last one partly idle (a tail of 20 words)
    for width, unroll in ((1, 1), (1, 4), (2, 1), (2, 4), (4, 1), (4, 4)):
        n = nwords - nwords % width

        def make(seed, n=n):
            import torch

            g = _gen(seed)
            return {"src": _randint32(n, g), "dst": torch.full((n,), -1, dtype=torch.int32)}

        def emulate(x, seed, width=width, unroll=unroll, n=n):
            c = _compiled(("copy", width, unroll, n),
                          lambda: ldst.compile_copy(target=TARGET, width=width, nwords=n, unroll=unroll))
            dst = x["dst"].clone()
            return {"dst": dst}, _emulate(c, [x["src"], dst], seed)

        def gpu(x, width=width, unroll=unroll):
            d = _cuda(x)
            ldst.copy(d["src"], d["dst"], width=width, unroll=unroll)
            return _cpu({"dst": d["dst"]})

        out.append(Case(1, "ldst.copy", f"{['', 'u32', 'v2', '', 'v4'][width]} x{unroll}", f"{n} words", make,
                        emulate, gpu, lambda x: {"dst": x["src"].clone()}, {"dst": Exact()}))
    return out


def _bank_cases():
    from cutlass import Int32

    from .. import banks

    out = []
    for width, stride in ((4, 32), (16, 3)):
        def make(seed):
            import torch

            return {"out": torch.full((1 + banks.MEASURE_THREADS,), -1, dtype=torch.int32)}

        def emulate(x, seed, width=width, stride=stride):
            c = _compiled(("banks", width), lambda: banks.compile_bank_kernel(target=TARGET, width=width))
            o = x["out"].clone()
            return {"out": o}, _emulate(c, [o, Int32(stride)], seed)

        def gpu(x, width=width, stride=stride):
            from ..compile import launcher

            d = _cuda(x)
            launcher(banks.bank_host(width), d["out"], Int32(stride))()
            return _cpu({"out": d["out"]})

        out.append(Case(1, "banks.bank_kernel", f"{width}-byte loads, stride {stride}", "32 warps x 1024 loads",
                        make, emulate, gpu, lambda x: {"out": x["out"]}, {"out": Completes()},
                        quick=width == 16))
    return out


def _ldmatrix_cases():
    from .. import ldmatrix as lm

    out = []
    for num in lm.NUMS:
        for trans in (False, True):
            def make(seed, num=num):
                import torch

                g = _gen(seed)
                tile = torch.randint(0, 1 << 16, (lm.ROWS * lm.ROW_ELEMS,), dtype=torch.int32, generator=g)
                lo, hi = torch.randint(0, 1 << 16, (2, 32, num), dtype=torch.int64, generator=g)
                word = lo | (hi << 16)
                return {"tile": tile, "regs": torch.where(word >= 1 << 31, word - (1 << 32), word).to(torch.int32)}

            def tile_np(x):
                return x["tile"].numpy().astype(np.uint16)

            def emulate(x, seed, num=num, trans=trans):
                import torch

                c = _compiled(("ldmatrix", num, trans),
                              lambda: lm.compile_ldmatrix(target=TARGET, num=num, trans=trans))
                tile = tile_np(x)
                rows = torch.from_numpy(lm.LANE_ROWS.copy())
                regs = torch.full((32 * num,), -0x21524111, dtype=torch.int32)
                r1 = _emulate(c, [torch.from_numpy(tile.view(np.int32).copy()), rows, regs], seed)
                c = _compiled(("stmatrix", num, trans),
                              lambda: lm.compile_stmatrix(target=TARGET, num=num, trans=trans))
                smem = torch.full((lm.ROWS * 4,), -0x21524111, dtype=torch.int32)
                r2 = _emulate(c, [x["regs"].reshape(-1).clone(), rows, smem], seed)
                return {"ldmatrix": regs.view(32, num), "stmatrix": smem.view(torch.int16)}, r1 + r2

            def gpu(x, num=num, trans=trans):
                import torch

                regs = lm.run_ldmatrix(num=num, trans=trans, tile=tile_np(x))
                smem = lm.run_stmatrix(num=num, trans=trans, regs=x["regs"].numpy().view(np.uint32).copy())
                return {"ldmatrix": torch.from_numpy(regs.view(np.int32).copy()),
                        "stmatrix": torch.from_numpy(smem.view(np.int16).copy())}

            def reference(x, num=num, trans=trans):
                import torch

                regs = lm.ldmatrix_model(tile_np(x), lm.LANE_ROWS, num, trans)
                smem = lm.stmatrix_model(x["regs"].numpy().view(np.uint32), lm.LANE_ROWS, num, trans,
                                         lm.poisoned_smem())
                return {"ldmatrix": torch.from_numpy(regs.view(np.int32).copy()),
                        "stmatrix": torch.from_numpy(smem.view(np.int16).copy())}

            out.append(Case(1, "ldmatrix/stmatrix", f"x{num}{' .trans' if trans else ''}", "8x8 b16 matrices",
                            make, emulate, gpu, reference, {"ldmatrix": Exact(), "stmatrix": Exact()}))

    def make_dsl(seed):
        import torch

        return {"tile": _randn((16, 16), torch.float16, _gen(seed))}

    def emulate_dsl(x, seed):
        import torch

        c = _compiled(("dsl_ldmatrix",), lambda: lm.compile_dsl_ldmatrix(target=TARGET))
        o = torch.full((16, 16), float("nan"), dtype=torch.float16)
        return {"tile": o}, _emulate(c, [x["tile"], o], seed)

    def gpu_dsl(x):
        return {"tile": lm.run_dsl_ldmatrix(x["tile"].cuda()).cpu()}

    out.append(Case(1, "ldmatrix (DSL copy atom)", "LdMatrix8x8x16bOp x4 + mma A partition", "16x16 fp16",
                    make_dsl, emulate_dsl, gpu_dsl, lambda x: {"tile": x["tile"].clone()}, {"tile": Exact()}))
    return out


# ---- chapter 02 -------------------------------------------------------------------------------


def _mbarrier_cases():
    import torch

    from .. import mbarrier as mb
    from .. import pipeline as pl

    out = []
    rounds = 3

    def emulate_phase(x, seed):
        c = _compiled(("phase", rounds), lambda: mb.compile_phase_demo(target=TARGET, rounds=rounds))
        rec = torch.full((2 * (1 + 3 * rounds),), -1, dtype=torch.int32)
        return {"probes": rec.view(-1, 2)}, _emulate(c, [rec], seed)

    out.append(Case(2, "mbarrier.phase_demo", f"{rounds} rounds", "64 threads", lambda seed: {}, emulate_phase,
                    lambda x: {"probes": torch.tensor(mb.run_phase_demo(rounds=rounds), dtype=torch.int32)},
                    lambda x: {"probes": torch.tensor(mb.model_pairs(mb.phase_demo_model(rounds)), dtype=torch.int32)},
                    {"probes": Exact()}))

    for start in (0, 1):
        def emulate_trace(x, seed, start=start):
            c = _compiled(("trace", start), lambda: pl.compile_state_trace(target=TARGET, stages=3, tiles=3, k_tiles=5,
                                                                           start_phase=start))
            o = torch.full((45,), -1, dtype=torch.int32)
            return {"states": o.view(-1, 3)}, _emulate(c, [o], seed)

        out.append(Case(2, "pipeline.state_trace", f"3 stages, start phase {start}", "3 tiles x 5 k", lambda seed: {},
                        emulate_trace,
                        lambda x, start=start: {"states": torch.tensor(pl.run_state_trace(stages=3, tiles=3, k_tiles=5,
                                                                                           start_phase=start),
                                                                        dtype=torch.int32)},
                        lambda x, start=start: {"states": torch.tensor(pl.state_sequence(3, 15, start),
                                                                        dtype=torch.int32)},
                        {"states": Exact()}, quick=start == 1))

    for stages, consumers, items in ((4, 2, 15), (2, 1, 10), (3, 4, 15)):
        def make(seed, items=items):
            g = _gen(seed)
            return {"src": _randint32(items * pl.ITEM_WORDS, g).view(items, pl.ITEM_WORDS)}

        def emulate_ring(x, seed, stages=stages, consumers=consumers, items=items):
            c = _compiled(("ring", stages, consumers, items),
                          lambda: pl.compile_ring(target=TARGET, stages=stages, items=items, k_tiles=5,
                                                  consumer_warps=consumers))
            dst = torch.full_like(x["src"], pl.POISON)
            trace = torch.full((items, 2), pl.POISON, dtype=torch.int32)
            return {"dst": dst, "trace": trace}, _emulate(c, [x["src"].view(-1), dst.view(-1), trace.view(-1)], seed)

        def gpu_ring(x, stages=stages, consumers=consumers):
            dst, trace = pl.ring_copy(x["src"].cuda(), stages=stages, k_tiles=5, consumer_warps=consumers)
            return _cpu({"dst": dst, "trace": trace})

        def ref_ring(x, stages=stages, items=items):
            return {"dst": x["src"].clone(), "trace": torch.tensor(pl.expected_trace(items, stages), dtype=torch.int32)}

        out.append(Case(2, "pipeline.ring", f"{stages} stages, {consumers} consumer warps", f"{items} items x 512 B",
                        make, emulate_ring, gpu_ring, ref_ring, {"dst": Exact(), "trace": Exact()}, seeds=(0, 1, 2),
                        quick=stages != 3))
    return out


# ---- chapter 03 -------------------------------------------------------------------------------


def _async_copy_cases():
    import torch

    from .. import async_copy as ac
    from ..compile import launcher

    out = []

    def make_bytes(n):
        def make(seed):
            return {"src": _randbytes(n, _gen(seed))}
        return make

    # cp.async: 7 tiles of 2 KiB and a 80-byte tail over 3 CTAs, so each CTA's ring wraps
    for cache, stages in (("cg", 4), ("ca", 2)):
        n, ctas = 7 * ac.CP_ASYNC_TILE + 80, 3

        def emulate(x, seed, cache=cache, stages=stages, n=n, ctas=ctas):
            c = _compiled(("cp.async", cache, stages, n, ctas),
                          lambda: ac.compile_cp_async_copy(target=TARGET, nbytes=n, cache=cache, stages=stages,
                                                           ctas=ctas))
            dst = torch.full((n,), 0x5A, dtype=torch.uint8)
            return {"dst": dst}, _emulate(c, [x["src"], dst], seed)

        def gpu(x, cache=cache, stages=stages, n=n, ctas=ctas):
            d = _cuda(x)
            dst = torch.full((n,), 0x5A, dtype=torch.uint8, device="cuda")
            launcher(ac.cp_async_copy_host, d["src"], dst, ctas, cache, stages)()  # the grid of 3 made explicit
            return _cpu({"dst": dst})

        out.append(Case(3, "async_copy.cp_async_copy", f"cp.async.{cache}, {stages} stages, {ctas} CTAs", f"{n} bytes",
                        make_bytes(n), emulate, gpu, lambda x: {"dst": x["src"].clone()}, {"dst": Exact()},
                        seeds=(0, 1)))

    n, stages, stage_bytes, ctas = 9 * 4096 + 48, 3, 4096, 2

    def emulate_bulk(x, seed):
        c = _compiled(("bulk", n), lambda: ac.compile_bulk_copy(target=TARGET, nbytes=n, stages=stages,
                                                                stage_bytes=stage_bytes, ctas=ctas))
        dst = torch.full((n,), 0x5A, dtype=torch.uint8)
        return {"dst": dst}, _emulate(c, [x["src"], dst], seed)

    def gpu_bulk(x):
        d = _cuda(x)
        dst = torch.full((n,), 0x5A, dtype=torch.uint8, device="cuda")
        launcher(ac.bulk_copy_host, d["src"], dst, ctas, stages, stage_bytes)()
        return _cpu({"dst": dst})

    out.append(Case(3, "async_copy.bulk_copy", f"cp.async.bulk, {stages} x {stage_bytes} B, {ctas} CTAs",
                    f"{n} bytes", make_bytes(n), emulate_bulk, gpu_bulk, lambda x: {"dst": x["src"].clone()},
                    {"dst": Exact()}, seeds=(0, 1)))

    nf = 2 * ac.FENCED_TILE

    def emulate_fenced(x, seed):
        c = _compiled(("fenced",), lambda: ac.compile_fenced_store(target=TARGET, n=nf, fence=True))
        o = torch.full((nf,), float("nan"))
        return {"out": o}, _emulate(c, [x["src"], o], seed)

    def gpu_fenced(x):
        d = _cuda(x)
        o = torch.full((nf,), float("nan"), device="cuda")
        ac.fenced_store(d["src"], o)
        return _cpu({"out": o})

    out.append(Case(3, "async_copy.fenced_store", "bulk G->S, st.shared, fence.proxy.async, bulk S->G", f"{nf} fp32",
                    lambda seed: {"src": _randn((nf,), torch.float32, _gen(seed))}, emulate_fenced, gpu_fenced,
                    lambda x: {"out": x["src"] * 2 + 1}, {"out": Exact()}))

    tiles, tile_bytes = 4, 1024

    def emulate_swap(x, seed):
        c = _compiled(("swap",), lambda: ac.compile_cluster_swap(target=TARGET, tiles=tiles, tile_bytes=tile_bytes))
        o = torch.full((tiles * tile_bytes,), 0x5A, dtype=torch.uint8)
        return {"out": o.view(tiles, tile_bytes)}, _emulate(c, [x["src"].view(-1), o], seed)

    def gpu_swap(x):
        return {"out": ac.cluster_swap(x["src"].cuda()).cpu()}

    out.append(Case(3, "async_copy.cluster_swap", "cluster 2x1, mapa + cp.async.bulk shared::cluster",
                    f"{tiles} x {tile_bytes} B", lambda seed: {"src": _randbytes(tiles * tile_bytes, _gen(seed))
                                                               .view(tiles, tile_bytes)},
                    emulate_swap, gpu_swap,
                    lambda x: {"out": x["src"].view(tiles // 2, 2, tile_bytes).flip(1).reshape(tiles, tile_bytes)},
                    {"out": Exact()}, seeds=(0, 1)))
    return out


# ---- chapter 04 -------------------------------------------------------------------------------


def _tma_cases():
    import torch

    from .. import tma

    out = []
    # (dtype, source shape, box, swizzle, cache hint): every source hangs over its last boxes (zero fill / clipping)
    configs = [("float16", (40, 104), (16, 40), "none", None),
               ("float16", (40, 40), (16, 16), "32B", None),
               ("float16", (40, 72), (16, 32), "64B", None),
               ("float16", (40, 136), (16, 64), "128B", None),
               ("float32", (24, 40), (8, 32), "128B", "evict_first"),
               ("uint8", (20, 304), (8, 128), "128B", None)]
    for dtype, shape, box, swizzle, hint in configs:
        def make(seed, dtype=dtype, shape=shape):
            g = _gen(seed)
            if dtype == "uint8":
                return {"src": torch.randint(0, 256, shape, dtype=torch.uint8, generator=g)}
            return {"src": _randn(shape, getattr(torch, dtype), g)}

        def emulate(x, seed, dtype=dtype, shape=shape, box=box, swizzle=swizzle, hint=hint):
            c = _compiled(("tma_rt", dtype, shape, box, swizzle, hint),
                          lambda: tma.compile_roundtrip(target=TARGET, shape=shape, dtype=dtype, box=box,
                                                        swizzle=swizzle, cache_hint=hint))
            src = x["src"]
            o = torch.empty(shape, dtype=src.dtype)
            o.view(torch.uint8).fill_(tma.POISON_BYTE)
            tiles = (-(-shape[0] // box[0]), -(-shape[1] // box[1]))
            tb = box[0] * box[1] * src.element_size()
            raw = torch.full((tiles[0] * tiles[1] * tb // 4,), 0x5A5A5A5A, dtype=torch.int32)
            rep = _emulate(c, [src, o, raw], seed)
            return {"out": o, "smem": raw.view(torch.uint8).view(tiles[0], tiles[1], tb)}, rep

        def gpu(x, box=box, swizzle=swizzle, hint=hint):
            o, raw = tma.tma_roundtrip(x["src"].cuda(), box=box, swizzle=swizzle, cache_hint=hint)
            return _cpu({"out": o, "smem": raw})

        def reference(x, box=box, swizzle=swizzle):
            return {"out": x["src"].clone(), "smem": torch.from_numpy(tma.expected_raw(x["src"], box, swizzle))}

        out.append(Case(4, "tma.roundtrip", f"{swizzle} swizzle" + (f", L2 {hint}" if hint else ""),
                        f"{dtype} {shape[0]}x{shape[1]}, box {box[0]}x{box[1]}", make, emulate, gpu, reference,
                        {"out": Exact(), "smem": Exact()}, quick=dtype != "uint8"))

    clusters, box, swizzle = 2, (16, 64), "128B"

    def emulate_mc(x, seed):
        c = _compiled(("tma_mc",), lambda: tma.compile_multicast(target=TARGET, clusters=clusters, dtype="float16",
                                                                  box=box, swizzle=swizzle))
        o = torch.empty((2 * clusters * box[0], box[1]), dtype=torch.float16)
        o.view(torch.uint8).fill_(tma.POISON_BYTE)
        return {"out": o.view(clusters, 2, *box)}, _emulate(c, [x["src"], o], seed)

    out.append(Case(4, "tma.multicast", f"cluster 2x1, .multicast::cluster, {swizzle}",
                    f"{clusters} boxes of 16x64 fp16",
                    lambda seed: {"src": _randn((clusters * box[0], box[1]), torch.float16, _gen(seed))}, emulate_mc,
                    lambda x: {"out": tma.multicast_demo(x["src"].cuda(), box=box, swizzle=swizzle).cpu()},
                    lambda x: {"out": x["src"].view(clusters, 1, *box).expand(clusters, 2, *box).contiguous()},
                    {"out": Exact()}, seeds=(0, 1)))
    return out


# ---- chapter 05 -------------------------------------------------------------------------------


def _row_scale_cases():
    import torch

    from .. import tma_pipeline as tp

    out = []
    for dtype, out_dtype, block, stages, design, shape in (("bfloat16", "bfloat16", (16, 64), 3, "carried", (70, 200)),
                                                           ("float32", "bfloat16", (16, 32), 2, "unrolled", (50, 72)),
                                                           ("float16", "float32", (16, 64), 4, "carried", (37, 136))):
        ctas = 2

        def make(seed, dtype=dtype, shape=shape):
            g = _gen(seed)
            return {"x": _randn(shape, getattr(torch, dtype), g), "scale": torch.randn(shape[0], generator=g)}

        def emulate(x, seed, dtype=dtype, out_dtype=out_dtype, block=block, stages=stages, design=design,
                    shape=shape, ctas=ctas):
            c = _compiled(("row_scale", dtype, out_dtype, block, stages, design, shape),
                          lambda: tp.compile_row_scale(target=TARGET, shape=shape, dtype=dtype, out_dtype=out_dtype,
                                                       block=block, stages=stages, design=design, ctas=ctas))
            y = torch.full(shape, float("nan"), dtype=getattr(torch, out_dtype))
            return {"y": y}, _emulate(c, [x["x"], y, x["scale"]], seed)

        def gpu(x, out_dtype=out_dtype, block=block, stages=stages, design=design, shape=shape, ctas=ctas):
            d = _cuda(x)
            y = torch.full(shape, float("nan"), dtype=getattr(torch, out_dtype), device="cuda")
            tp.row_scale(d["x"], d["scale"], y, block=block, stages=stages, design=design, ctas=ctas)
            return _cpu({"y": y})

        out.append(Case(5, "tma_pipeline.row_scale",
                        f"{design}, block {block[0]}x{block[1]}, {stages} stages, {ctas} CTAs",
                        f"{dtype}->{out_dtype} {shape[0]}x{shape[1]}", make, emulate, gpu,
                        lambda x, out_dtype=out_dtype: {"y": tp.reference(x["x"], x["scale"],
                                                                          getattr(torch, out_dtype))},
                        {"y": Exact()}, seeds=(0, 1), quick=dtype != "float16"))
    return out


# ---- chapter 06 -------------------------------------------------------------------------------


def _wgmma_cases():
    import torch

    from .. import wgmma as wg

    out = []
    n = 64

    def probe_matrix(regs):
        """The probe's registers (128 threads x n/2) back in (row, column) order, by the course's fragment map."""
        m = torch.empty(64, n, dtype=regs.dtype)
        for t in range(wg.WARPGROUP):
            for r in range(n // 2):
                i, j = wg.acc_coord(t, r, n)
                m[i, j] = regs[t, r]
        return m

    def emulate_probe(x, seed):
        c = _compiled(("probe", n), lambda: wg.compile_fragment_probe(target=TARGET, n=n))
        o = torch.full((wg.WARPGROUP, n // 2), -1.0)
        return {"regs": o}, _emulate(c, [x["a"], x["b"], o], seed)

    a, b = wg.probe_inputs(n, device="cpu")
    out.append(Case(6, "wgmma.fragment_probe", "integer probe (register -> element)", f"m64n{n}k16",
                    lambda seed: {"a": a.clone(), "b": b.clone()}, emulate_probe,
                    lambda x: {"regs": torch.from_numpy(
                        (lambda p: (p[..., 0] * 256 + p[..., 1]).astype(np.float32))(wg.run_fragment_probe(n=n)))},
                    lambda x: {"regs": torch.from_numpy(
                        (lambda p: (p[..., 0] * 256 + p[..., 1]).astype(np.float32))(wg.expected_probe(n)))},
                    {"regs": Exact()}))

    def gpu_probe_random(x):
        o = torch.full((wg.WARPGROUP, n // 2), -1.0, device="cuda")
        c = _compiled(("probe", n), lambda: wg.compile_fragment_probe(target=TARGET, n=n))
        d = _cuda(x)
        _gpu_compiled(c, [d["a"], d["b"], o])
        return _cpu({"regs": o})

    def acc_operands(x):
        return [((slice(None), slice(None)), x["a"].float(), x["b"].float().t())]

    out.append(Case(6, "wgmma.fragment_probe", "random BF16, one wgmma (FP32 accumulators)", f"m64n{n}k16",
                    lambda seed: {"a": _randn((64, 16), torch.bfloat16, _gen(seed)),
                                  "b": _randn((n, 16), torch.bfloat16, _gen(seed + 100))},
                    lambda x, seed: (lambda o, r: ({"regs": probe_matrix(o["regs"])}, r))(*emulate_probe(x, seed)),
                    lambda x: {"regs": probe_matrix(gpu_probe_random(x)["regs"])},
                    lambda x: {"regs": (x["a"].double() @ x["b"].double().t()).float()},
                    {"regs": Mma(acc_operands, acc=True)}))

    for (m, nn, k, tm, tn, stages) in ((128, 128, 192, 64, 64, 2), (128, 128, 128, 128, 128, 3)):
        def make(seed, m=m, nn=nn, k=k):
            g = _gen(seed)
            return {"a": _randn((m, k), torch.bfloat16, g), "b": _randn((nn, k), torch.bfloat16, g)}

        def emulate(x, seed, m=m, nn=nn, k=k, tm=tm, tn=tn, stages=stages):
            c = _compiled(("gemm_nt", m, nn, k, tm, tn, stages),
                          lambda: wg.compile_gemm_nt(target=TARGET, m=m, n=nn, k=k, tile_m=tm, tile_n=tn,
                                                     stages=stages, dtype="bf16"))
            o = torch.full((m, nn), float("nan"), dtype=torch.bfloat16)
            return {"c": o}, _emulate(c, [x["a"], x["b"], o], seed)

        def gpu(x, tm=tm, tn=tn, stages=stages):
            d = _cuda(x)
            o = torch.full((d["a"].shape[0], d["b"].shape[0]), float("nan"), dtype=torch.bfloat16, device="cuda")
            wg.gemm_nt(d["a"], d["b"], o, tile_m=tm, tile_n=tn, stages=stages)
            return _cpu({"c": o})

        def operands(x):
            return [((slice(None), slice(None)), x["a"].float(), x["b"].float().t())]

        out.append(Case(6, "wgmma.gemm_nt", f"{tm}x{tn} tile, {stages} stages", f"{m}x{nn}x{k} bf16", make, emulate,
                        gpu,
                        lambda x: {"c": x["a"].double() @ x["b"].double().t()}, {"c": Mma(operands)},
                        seeds=(0, 1)))
    return out


# ---- chapter 07 -------------------------------------------------------------------------------


def _counters_left(counters):
    """How many split-K tile counters a launch left non-zero, as a 1-element tensor (the emulator's grid and a GPU's
    split different numbers of tiles, so their counter arrays differ in length)."""
    import torch

    return torch.tensor([int(counters.count_nonzero())], dtype=torch.int32)


def _gemm_cases():
    import torch
    from cutlass import Int32

    from ..family import plan as P
    from ..family.configs import Sm90Config
    from ..family.problem import GemmProblem

    out = []
    variants = [
        ("64-row tile, partial tiles", Sm90Config(tile_m=64, tile_n=64, stages=4, cluster=(1, 1)), (130, 136, 200), "k",
         1),
        ("128-row tile, cluster 2x1 (B multicast)", Sm90Config(tile_m=128, tile_n=64, stages=3, cluster=(2, 1)),
         (300, 136, 136), "k", 2),
        ("128-row tile, cluster 1x2 (A multicast)", Sm90Config(tile_m=128, tile_n=64, stages=3, cluster=(1, 2)),
         (200, 200, 136), "k", 2),
        ("192-row tile (three consumers), cluster 2x1", Sm90Config(tile_m=192, tile_n=64, stages=3, cluster=(2, 1),
                                                                    epi_stages=2), (400, 136, 136), "k", 2),
        ("swap-AB, 64x32, epi_n 16", Sm90Config(tile_m=64, tile_n=32, stages=4, cluster=(1, 1), swap_ab=True, epi_n=16),
         (40, 136, 136), "k", 2),
        # on the emulator's 3 CTAs, 3 of the 4 tiles run whole and the 4th is split (a GPU's grid splits all 4)
        ("split-K 3 in one launch", Sm90Config(tile_m=64, tile_n=64, stages=4, cluster=(1, 1), splits=3),
         (100, 72, 264), "k", 3),
        ("B N-major, epi 64x2", Sm90Config(tile_m=64, tile_n=128, stages=3, cluster=(1, 1), epi_n=64, epi_stages=2),
         (130, 136, 200), "n", 2),
        # a token tile 8 columns past a multiple of 16 (two-matrix stmatrix), two token tiles sharing the weight
        ("swap-AB token tiles 64x40, epi_n 8, cluster 1x2", Sm90Config(tile_m=64, tile_n=40, stages=4, cluster=(1, 2),
                                                                      swap_ab=True, epi_n=8, epi_stages=4),
         (72, 136, 136), "k", 2),
        ("swap-AB 64x24 epi_n 24, split-K 2", Sm90Config(tile_m=64, tile_n=24, stages=4, cluster=(1, 1), swap_ab=True,
                                                         epi_n=24, epi_stages=2, splits=2), (20, 136, 264), "k", 3),
        ("swap-AB 192-row weight tile, 40 wide", Sm90Config(tile_m=192, tile_n=40, stages=3, cluster=(1, 1),
                                                           swap_ab=True, epi_n=40, epi_stages=2), (36, 400, 136), "k",
         2),
        # a 2-D cluster: each CTA loads half its A' panel and half its B' panel and multicasts each to the two CTAs
        # that share it (masks 0b0101 / 0b1010 for A', 0b0011 / 0b1100 for B'); 5 N tiles pad the cluster grid to 6
        ("64-row tile, cluster 2x2 (A and B multicast)", Sm90Config(tile_m=64, tile_n=64, stages=3, cluster=(2, 2)),
         (200, 264, 136), "k", 1),
        ("swap-AB 64x32, cluster 2x4, split-K 2", Sm90Config(tile_m=64, tile_n=32, stages=3, cluster=(2, 4),
                                                             swap_ab=True, epi_n=16, splits=2), (100, 136, 264), "k",
         1),
        ("FP16, cluster 2x1, swap-AB", Sm90Config(tile_m=64, tile_n=48, stages=4, cluster=(2, 1), swap_ab=True,
                                                 epi_n=16, dtype="float16", out_dtype="float16"), (72, 200, 136), "k",
         2),
    ]
    for label, cfg, (m, n, k), b_major, clusters in variants:
        dtype = getattr(torch, cfg.dtype)

        def make(seed, m=m, n=n, k=k, b_major=b_major, dtype=dtype):
            g = _gen(seed)
            a = _randn((m, k), dtype, g)
            b = _randn((n, k), dtype, g).t() if b_major == "k" else _randn((k, n), dtype, g)
            return {"a": a, "b": b}

        def compiled(cfg=cfg, b_major=b_major, tvm=False):
            from ..kernels import gemm_sm90

            return _compiled(("gemm", cfg, b_major),
                             lambda: gemm_sm90.compile_gemm(target=TARGET, cfg=cfg, b_major=b_major))

        def launch(x, clusters, cfg=cfg):
            """Split-K on ``clusters`` clusters: what the plan passes the kernel, ``(splits, dp_tiles, workspace
            floats, counters)``."""
            problem = GemmProblem(x["a"].shape[0], x["b"].shape[1], x["a"].shape[1], cfg.dtype, cfg.out_dtype)
            return P.split_launch(problem, cfg, clusters)

        def args(x, out, ws, cfg=cfg, clusters=clusters, launch=launch):
            extra = [*ws, *(Int32(v) for v in launch(x, clusters)[:2])] if cfg.split_k else []
            return [x["a"], x["b"], out, *extra, Int32(clusters)]

        def fresh(x, cfg=cfg, device="cpu", clusters=clusters, launch=launch):
            """Poisoned C; with split-K a poisoned workspace and zeroed tile counters (the plan's state at rest), sized
            for the tail's tiles on ``clusters`` clusters."""
            m_, n_ = x["a"].shape[0], x["b"].shape[1]
            o = torch.full((m_, n_), float("nan"), dtype=getattr(torch, cfg.out_dtype), device=device)
            ws = None
            if cfg.split_k:
                _, _, floats, tiles = launch(x, clusters)
                ws = (torch.full((floats,), float("nan"), device=device),
                      torch.zeros(tiles, dtype=torch.int32, device=device))
            return o, ws

        def emulate(x, seed, cfg=cfg, compiled=compiled, args=args, fresh=fresh):
            o, ws = fresh(x)
            rep = _emulate(compiled(), args(x, o, ws), seed, dynamic=True, aligns={4: 4})
            return ({"c": o, "counters_left": _counters_left(ws[1])} if cfg.split_k else {"c": o}), rep

        def gpu(x, cfg=cfg, compiled=compiled, args=args, fresh=fresh):
            d = _cuda(x)
            o, _ = fresh(d, device="cuda")
            P.prepare(d["a"], d["b"], o, cfg)()  # the plan: the course's call path (TVM-FFI)
            outs = {"c": o}
            if cfg.split_k:
                # The plan's counters are internal: launch the emulator's artifact once more on the GPU, on the
                # plan's grid with counters of its own, to read them back (zero again), and check its C against
                # the plan's, bit for bit.
                grid = cfg.clusters_on(_sms())
                o2, ws = fresh(d, device="cuda", clusters=grid)
                _gpu_compiled(compiled(), args(d, o2, ws, clusters=grid), dynamic=True, aligns={4: 4})
                outs.update(counters_left=_counters_left(ws[1]), c_artifact=o2)
            return _cpu(outs)

        def reference(x, cfg=cfg):
            a, b = x["a"].double(), x["b"].double()
            ref = {"c": a @ b}
            if cfg.split_k:  # every tile's last unit put its counter back to zero
                ref["counters_left"] = torch.zeros(1, dtype=torch.int32)
            return ref

        def c_operands(x):
            return [((slice(None), slice(None)), x["a"].float(), x["b"].float())]

        checks = {"c": Mma(c_operands)}
        if cfg.split_k:
            checks["counters_left"] = Exact()
        name = f"{label} ({cfg.name}{', B N-major' if b_major == 'n' else ''})"
        out.append(Case(7, "gemm_sm90 (persistent)", name, f"{m}x{n}x{k} {cfg.dtype}", make, emulate, gpu, reference,
                        checks, seeds=(0, 1) if cfg.cluster != (1, 1) else (0,)))

    # the split-K reduction alone: the same FP32 partial sums in, the same order of additions: bit for bit
    from .. import splitk

    m, n, s = 40, 72, 3

    def make_reduce(seed):
        return {"ws": torch.randn((s, m, n), generator=_gen(seed))}

    def emulate_reduce(x, seed):
        c = _compiled(("reduce",), lambda: splitk.compile_reduce(target=TARGET, out_dtype="bfloat16"))
        o = torch.full((m, n), float("nan"), dtype=torch.bfloat16)
        return {"c": o}, _emulate(c, [x["ws"], o, Int32(s)], seed, dynamic=True)

    def gpu_reduce(x):
        c = _compiled(("reduce",), lambda: splitk.compile_reduce(target=TARGET, out_dtype="bfloat16"))
        d = _cuda(x)
        o = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
        _gpu_compiled(c, [d["ws"], o, Int32(s)], dynamic=True)
        return _cpu({"c": o})

    def reference_reduce(x):
        acc = torch.zeros((m, n))
        for i in range(s):  # the kernel's order of additions, in FP32
            acc = acc + x["ws"][i]
        return {"c": acc.to(torch.bfloat16)}

    out.append(Case(7, "splitk.reduce", "3 slices -> bf16 (cvt.rn.bf16x2.f32)", f"{m}x{n}", make_reduce, emulate_reduce,
                    gpu_reduce, reference_reduce, {"c": Exact()}))

    from .. import scheduler as sc

    for sched in (sc.TileScheduler(6, 5, "m", 4), sc.TileScheduler(7, 9, "n", 2)):
        def emulate_order(x, seed, sched=sched):
            c = _compiled(("order", sched), lambda: sc.compile_tile_order(target=TARGET, sched=sched, fold=False))
            o = torch.full((2 * sched.num_tiles,), -1, dtype=torch.int32)
            return {"order": o.view(-1, 2)}, _emulate(c, [o], seed)

        out.append(Case(7, "scheduler.tile_order", f"raster {sched.raster}, group {sched.group}",
                        f"{sched.m_tiles}x{sched.n_tiles} tiles", lambda seed: {}, emulate_order,
                        lambda x, sched=sched: {"order": torch.tensor(sc.run_tile_order(sched), dtype=torch.int32)},
                        lambda x, sched=sched: {"order": torch.tensor(sched.order(), dtype=torch.int32)},
                        {"order": Exact()}, quick=sched.raster == "n"))
    return out


@functools.lru_cache(maxsize=None)
def _sms() -> int:
    from ..hardware import sm_count

    return sm_count()


# ---- chapter 08 -------------------------------------------------------------------------------


def _grouped_cases():
    import torch
    from cutlass import Int32, Int64

    from .. import grouped_model
    from ..family import api, heuristic_grouped, plan
    from ..family.configs import Sm90Config
    from ..kernels import grouped_sm90 as gs

    out = []
    small = Sm90Config(tile_m=64, tile_n=64, stages=4, cluster=(1, 1))
    pair = Sm90Config(tile_m=64, tile_n=64, stages=4, cluster=(2, 1))
    wide = Sm90Config(tile_m=128, tile_n=64, stages=3, cluster=(1, 1))
    four = (70, 0, 20, 130)  # an empty group, a group smaller than a tile, partial tiles
    five = (70, 0, 20, 130, 30)
    ragged = [
        # label, cfg, b_major, fences, dynamic, by_size, overlap_store, (mixed rows, burst), grid, sizes, seeds
        ("static, largest first", small, "k", True, False, True, False, (0, 1), 2, four, (0, 1)),
        ("static, index order, B N-major", small, "n", True, False, False, False, (0, 1), 3, four, (0,)),
        ("dynamic (atomic tile counter)", small, "k", True, True, True, False, (0, 1), 2, four, (0, 1)),
        ("2-CTA tile (B multicast), static", pair, "k", True, False, True, False, (0, 1), 4, four, (0, 1)),
        ("2-CTA tile, dynamic (mailbox)", pair, "k", True, True, True, False, (0, 1), 4, four, (0,)),
        ("128-row tile, store under the next main loop", wide, "k", True, False, True, True, (0, 1), 2, four, (0,)),
        ("dynamic, light groups (<= 64 rows) mixed in, bursts of 2", small, "k", True, True, True, False, (64, 2),
         2, five, (0,)),
    ]
    n, k = 72, 136
    for label, cfg, b_major, fences, dynamic, by_size, overlap, (mixed, burst), grid, sizes, seeds in ragged:
        def make(seed, b_major=b_major, sizes=sizes):
            g = _gen(seed)
            t = sum(sizes)
            a = _randn((t, k), torch.bfloat16, g)
            b = (_randn((len(sizes), n, k), torch.bfloat16, g).transpose(1, 2) if b_major == "k"
                 else _randn((len(sizes), k, n), torch.bfloat16, g))
            return {"a": a, "b": b, "offs": torch.tensor(np.cumsum(sizes), dtype=torch.int32)}

        def compiled(cfg=cfg, b_major=b_major, fences=fences, dynamic=dynamic, by_size=by_size, overlap=overlap,
                     mixed=mixed, burst=burst):
            return _compiled(("grouped", cfg, "ragged", b_major, fences, dynamic, by_size, overlap, mixed, burst),
                             lambda: gs.compile_grouped(cfg=cfg, mode="ragged", b_major=b_major, target=TARGET,
                                                        fences=fences, by_size=by_size, dynamic=dynamic,
                                                        overlap_store=overlap, mixed=mixed, burst=burst,
                                                        l2_promotion=heuristic_grouped.L2_PROMOTION))

        def emulate(x, seed, cfg=cfg, compiled=compiled, grid=grid, mixed=mixed):
            o = torch.full((x["a"].shape[0], n), float("nan"), dtype=torch.bfloat16)
            table = torch.zeros((1, len(gs.TABLE_COLUMNS)), dtype=torch.int64)
            ws = torch.zeros((grid, gs.slots_per_cta(cfg, False, bool(mixed)), gs.DESC_WORDS), dtype=torch.int64)
            groups = x["offs"].numel()
            rep = _emulate(compiled(), [x["a"], x["b"], o, x["offs"], table, ws, Int32(groups), Int32(grid),
                                        Int64(0)], seed, dynamic=True, aligns={3: 4, 4: 8})
            return {"c": o}, rep

        def gpu(x, cfg=cfg, fences=fences, dynamic=dynamic, by_size=by_size, overlap=overlap, mixed=mixed,
                burst=burst):
            d = _cuda(x)
            o = torch.full((d["a"].shape[0], n), float("nan"), dtype=torch.bfloat16, device="cuda")
            api.grouped_gemm(d["a"], d["b"], d["offs"], o, config=cfg, fences=fences, by_size=by_size,
                             dynamic=dynamic, overlap_store=overlap, mixed=mixed, burst=burst)
            return _cpu({"c": o})

        def operands(x):
            regions, start = [], 0
            for g, end in enumerate(x["offs"].tolist()):
                if end > start:
                    regions.append(((slice(start, end), slice(None)), x["a"][start:end].float(), x["b"][g].float()))
                start = end
            return regions

        out.append(Case(8, "grouped_sm90 (ragged)", f"{label} ({cfg.name})", f"groups {list(sizes)}, N {n}, K {k}",
                        make, emulate, gpu, lambda x: {"c": grouped_model.reference(x["a"], x["b"], x["offs"]).double()},
                        {"c": Mma(operands)}, seeds=seeds))

    # table mode: independent problems, the descriptors rewritten from each row's addresses, sizes and strides
    shapes = ((130, 64, 64), (0, 128, 64), (7, 72, 136), (64, 64, 192))
    for b_major in ("k", "n"):
        def make_table(seed, b_major=b_major):
            g = _gen(seed)
            x = {}
            for i, (m, nn, kk) in enumerate(shapes):
                x[f"a{i}"] = _randn((m, kk), torch.bfloat16, g)
                x[f"b{i}"] = _randn((nn, kk), torch.bfloat16, g).t() if b_major == "k" else _randn((kk, nn),
                                                                                                  torch.bfloat16, g)
            return x

        def variant(b_major=b_major):
            tokens = sum(s[0] for s in shapes)
            dynamic = heuristic_grouped.dynamic_schedule(small)
            return dynamic, heuristic_grouped.largest_first(small, tokens, dynamic)

        def emulate_table(x, seed, b_major=b_major, variant=variant):
            dynamic, by_size = variant()
            c = _compiled(("grouped", small, "table", b_major, dynamic, by_size),
                          lambda: gs.compile_grouped(cfg=small, mode="table", b_major=b_major, target=TARGET,
                                                     dynamic=dynamic, by_size=by_size,
                                                     l2_promotion=heuristic_grouped.L2_PROMOTION))
            pairs = [(x[f"a{i}"], x[f"b{i}"]) for i in range(len(shapes))]
            outs = [torch.full((a.shape[0], b.shape[1]), float("nan"), dtype=torch.bfloat16) for a, b in pairs]
            live = [(p, o) for p, o in zip(pairs, outs) if p[0].shape[0] > 0]
            table = torch.tensor(plan.problem_table([p for p, _ in live], [o for _, o in live], b_major),
                                 dtype=torch.int64)
            grid = 2
            ws = torch.zeros((grid, gs.slots_per_cta(small), gs.DESC_WORDS), dtype=torch.int64)
            offs = torch.zeros(1, dtype=torch.int32)
            (a0, b0), c0 = live[0]
            extra = [t for p in pairs for t in p] + outs
            rep = _emulate(c, [a0, b0, c0, offs, table, ws, Int32(len(live)), Int32(grid), Int64(0)], seed,
                           dynamic=True, aligns={3: 4, 4: 8}, extra=extra)
            return {f"c{i}": o for i, o in enumerate(outs)}, rep

        def gpu_table(x):
            d = _cuda(x)
            pairs = [(d[f"a{i}"], d[f"b{i}"]) for i in range(len(shapes))]
            outs = [torch.full((a.shape[0], b.shape[1]), float("nan"), dtype=torch.bfloat16, device="cuda")
                    for a, b in pairs]
            api.grouped_gemm_list(pairs, outs, config=small)
            return _cpu({f"c{i}": o for i, o in enumerate(outs)})

        def ops(i):
            return lambda x: [((slice(None), slice(None)), x[f"a{i}"].float(), x[f"b{i}"].float())]

        out.append(Case(8, "grouped_sm90 (table)", f"pointer table, B {b_major.upper()}-major ({small.name})",
                        " ".join(f"{m}x{nn}x{kk}" for m, nn, kk in shapes), make_table, emulate_table, gpu_table,
                        lambda x: {f"c{i}": x[f"a{i}"].double() @ x[f"b{i}"].double() for i in range(len(shapes))},
                        {f"c{i}": Mma(ops(i)) for i in range(len(shapes))}, quick=b_major == "k"))
    return out


def unfenced_grouped_case() -> Case:
    """Chapter 08's "break it": descriptors published with plain stores, no release, no acquire (``fences=False``)."""
    import torch
    from cutlass import Int32, Int64

    from ..family import api, heuristic_grouped
    from ..family.configs import Sm90Config
    from ..kernels import grouped_sm90 as gs

    base = next(c for c in _grouped_cases() if c.config.startswith("static, largest first"))
    cfg = Sm90Config(tile_m=64, tile_n=64, stages=4, cluster=(1, 1))
    n = 72

    def emulate(x, seed):
        c = _compiled(("grouped", cfg, "ragged", "k", False),
                      lambda: gs.compile_grouped(cfg=cfg, mode="ragged", b_major="k", target=TARGET, fences=False,
                                                 by_size=True, dynamic=False,
                                                 l2_promotion=heuristic_grouped.L2_PROMOTION))
        grid = 2
        o = torch.full((x["a"].shape[0], n), float("nan"), dtype=torch.bfloat16)
        table = torch.zeros((1, len(gs.TABLE_COLUMNS)), dtype=torch.int64)
        ws = torch.zeros((grid, gs.slots_per_cta(cfg), gs.DESC_WORDS), dtype=torch.int64)
        rep = _emulate(c, [x["a"], x["b"], o, x["offs"], table, ws, Int32(x["offs"].numel()), Int32(grid), Int64(0)],
                       seed, dynamic=True, aligns={3: 4, 4: 8})
        return {"c": o}, rep

    def gpu(x):
        d = _cuda(x)
        o = torch.full((d["a"].shape[0], n), float("nan"), dtype=torch.bfloat16, device="cuda")
        api.grouped_gemm(d["a"], d["b"], d["offs"], o, config=cfg, fences=False, by_size=True, dynamic=False,
                         overlap_store=False, mixed=0)
        return _cpu({"c": o})

    return Case(8, "grouped_sm90 (ragged)", "fences=False: descriptors rewritten without release/acquire",
                base.shape, base.make, emulate, gpu, base.reference, {"c": Broken(base.checks["c"])}, seeds=(0,))


# ---------------------------------------------------------------------------------------------
# All of them
# ---------------------------------------------------------------------------------------------


def all_cases() -> list[Case]:
    """Every case, chapter by chapter (the benchmark runs all; the tests the ``quick`` ones)."""
    cases = []
    for build in (_copy_cases, _bank_cases, _ldmatrix_cases, _mbarrier_cases, _async_copy_cases, _tma_cases,
                  _row_scale_cases, _wgmma_cases, _gemm_cases, _grouped_cases):
        cases += build()
    cases.append(unfenced_grouped_case())
    return cases


def find(name: str) -> Case:
    for c in all_cases():
        if c.name == name:
            return c
    raise KeyError(name)


def check_outputs(case: Case, got: dict, want: dict, inputs: dict, *, sides: int) -> dict:
    """``{output: Verdict}`` for ``got`` against ``want`` (``sides``: 1 against an exact reference, 2 against a GPU)."""
    return {key: check.compare(got[key], want[key], inputs, sides) for key, check in case.checks.items()}


def run_emulator(case: Case, inputs: dict, seed: int = 0) -> tuple[dict, list, float, float]:
    """The emulator half: ``(outputs, reports, compile seconds, emulator seconds)``."""
    before = dict(_COMPILE_SECONDS)
    t0 = time.perf_counter()
    outs, reports = case.emulate(inputs, seed)
    total = time.perf_counter() - t0
    compile_s = sum(v for k, v in _COMPILE_SECONDS.items() if k not in before)
    return outs, reports, compile_s, total - compile_s
