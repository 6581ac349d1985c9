"""NVIDIA's own Blackwell CuTe DSL examples on the emulator: the independent check of its tcgen05 semantics.

    python benchmarks/emulator_nvidia_examples.py --cutlass PATH [--rev REV] [--seeds 0,1,2] [--quick]

``PATH`` is a checkout of NVIDIA/cutlass (a git work tree or a bare git directory such as
``/work/.mirror/NVIDIA+cutlass/repo``). The two examples

* ``examples/python/CuTeDSL/cute/blackwell/kernel/dense_gemm/dense_gemm_persistent.py`` and
* ``examples/python/CuTeDSL/cute/blackwell/kernel/blockscaled_gemm/dense_blockscaled_gemm_persistent.py``

are read from revision ``REV`` (default ``HEAD``; needs a revision whose imports the installed
nvidia-cutlass-dsl satisfies) into a temporary directory outside the repository, imported from there,
their kernel classes compiled for ``sm_100a`` at small shapes (several tiles per CTA, partial tiles, K of
several k-blocks), run on the emulator (:func:`gemmlab.emulator.run.run_on_emulator`) and compared with a
CPU reference of our own:

* dense: integer-valued BF16/FP16 inputs (as NVIDIA's own test draws them), so the FP32 accumulation is
  exact and the output must equal ``(A @ B^T)`` rounded to the output type bit for bit;
* block-scaled (NVFP4: E2M1 operands, UE4M3 scales, 16 values of K per scale; optionally NVFP4 with UE8M0
  scales, MXF4, MXF8 E4M3/E5M2 with UE8M0 scales per 32): random codes and scales, dequantized
  independently here (the E2M1 table, torch's float8 types, 2^(e - 127), the scale-factor layout
  ((32,4),(sf_vec,4)) : ((16,4),(0,1)) tiled over M/N then K, written out below), FP64 reference; each
  output element must be within 1e-5 (FP32 out; 2^-8 for 16-bit out) of the sum of the absolute values of
  its products (the tensor core's summation order is not FP64's; a wrong scale factor is far outside).

None of this is a B200 measurement: "emulator seconds" is how long the CPU took to emulate, and "warp
instructions" counts what the emulator executed. Results go to ``results/cpu/emulator_nvidia_examples.json``
with the example revision. NVIDIA's code never enters the repository.
"""
from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "lib"))

EXAMPLES = {
    "dense_gemm_persistent": "examples/python/CuTeDSL/cute/blackwell/kernel/dense_gemm/dense_gemm_persistent.py",
    "dense_blockscaled_gemm_persistent":
        "examples/python/CuTeDSL/cute/blackwell/kernel/blockscaled_gemm/dense_blockscaled_gemm_persistent.py",
}


# ---------------------------------------------------------------------------------------------
# The examples, from a checkout, outside the repository
# ---------------------------------------------------------------------------------------------


def _git(path: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(path), *args], check=True, capture_output=True, text=True).stdout


def extract(cutlass: str, rev: str = "HEAD", into: str | None = None) -> tuple[Path, dict]:
    """Write the two example files of ``cutlass`` at ``rev`` into a temporary directory (outside the
    repository); return it and a description of the revision."""
    src = Path(cutlass).resolve()
    if ROOT in src.parents or src == ROOT:
        raise ValueError("the CUTLASS checkout must live outside this repository")
    out = Path(into or tempfile.mkdtemp(prefix="gemmlab-nvidia-examples-"))
    if ROOT in out.resolve().parents:
        raise ValueError("the examples must be extracted outside this repository")
    out.mkdir(parents=True, exist_ok=True)
    info = {"cutlass": str(src)}
    try:
        commit = _git(src, "rev-parse", "--verify", f"{rev}^{{commit}}").strip()
        info.update(rev=rev, commit=commit, date=_git(src, "log", "-1", "--format=%cI", commit).strip(),
                    subject=_git(src, "log", "-1", "--format=%s", commit).strip())
        try:
            info["describe"] = _git(src, "describe", "--tags", commit).strip()
        except subprocess.CalledProcessError:
            pass
        for name, rel in EXAMPLES.items():
            (out / f"{name}.py").write_text(_git(src, "show", f"{commit}:{rel}"))
    except (subprocess.CalledProcessError, FileNotFoundError):
        if rev != "HEAD":
            raise
        info.update(rev="(plain checkout, no git)", commit=None)
        for name, rel in EXAMPLES.items():
            (out / f"{name}.py").write_text((src / rel).read_text())
    return out, info


def load(directory: Path, name: str):
    key = f"nvidia_example_{name}"
    spec = importlib.util.spec_from_file_location(key, directory / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[key] = mod  # dataclasses and the DSL's decorators look the module up
    spec.loader.exec_module(mod)
    return mod


# ---------------------------------------------------------------------------------------------
# Cases
# ---------------------------------------------------------------------------------------------


@dataclass
class Case:
    example: str  # "dense" or "blockscaled"
    config: str
    m: int
    n: int
    k: int
    tiler: tuple
    cluster: tuple
    two_cta: bool = False
    tma_store: bool = True
    dtype: str = "bf16"  # dense: the A/B/C type; blockscaled: the C type (the format is extra["format"])
    max_clusters: int = 2  # max_active_clusters: fewer clusters than tiles, so each does several
    quick: bool = False
    extra: dict = field(default_factory=dict)

    @property
    def shape(self) -> str:
        return f"{self.m}x{self.n}x{self.k}"


CASES = [
    # dense_gemm_persistent: mma tiler (M, N), cluster (M, N); tiles of K = 4 MMAs (64 for 16-bit types)
    Case("dense", "1-CTA MMA, cluster 1x1, TMA store", 200, 136, 320, (128, 64), (1, 1), quick=True),
    Case("dense", "1-CTA MMA, cluster 1x1, TMA store", 256, 192, 256, (128, 64), (1, 1), dtype="fp16"),
    Case("dense", "1-CTA MMA, cluster 1x1, direct store", 256, 192, 256, (128, 64), (1, 1), tma_store=False),
    Case("dense", "2-CTA MMA (M=256), cluster 2x1, TMA store", 384, 192, 256, (256, 64), (2, 1), two_cta=True,
         quick=True),
    Case("dense", "2-CTA MMA (M=256), cluster 2x2 multicast A and B", 512, 256, 192, (256, 128), (2, 2),
         two_cta=True, max_clusters=1),
    Case("dense", "2-CTA MMA (M=256), cluster 4x1 multicast B", 512, 128, 256, (256, 64), (4, 1), two_cta=True,
         max_clusters=1),
    Case("dense", "1-CTA MMA, cluster 2x2 multicast A and B", 256, 256, 256, (128, 64), (2, 2), max_clusters=1,
         quick=True),
    Case("dense", "2-CTA MMA (M=128, Layout B), cluster 2x2", 256, 256, 256, (128, 128), (2, 2), two_cta=True,
         max_clusters=1),
    Case("dense", "1-CTA MMA (M=64, Layout F), direct store", 256, 192, 256, (64, 64), (1, 1), tma_store=False),
    # dense_blockscaled_gemm_persistent: NVFP4 (Float4E2M1FN, scale Float8E4M3FN, sf_vec_size 16; K tile 256)
    Case("blockscaled", "NVFP4, 1-CTA MMA, cluster 1x1", 200, 136, 320, (128, 128), (1, 1), dtype="fp32", quick=True),
    Case("blockscaled", "NVFP4, 1-CTA MMA (N=192), cluster 1x1", 256, 384, 512, (128, 192), (1, 1), dtype="fp32"),
    Case("blockscaled", "NVFP4, 1-CTA MMA (N=256), cluster 1x2 multicast A", 256, 512, 256, (128, 256), (1, 2),
         dtype="fp32", max_clusters=1),
    Case("blockscaled", "NVFP4, 2-CTA MMA (M=256), cluster 2x1", 256, 256, 512, (256, 128), (2, 1), two_cta=True,
         dtype="fp32", quick=True),
    Case("blockscaled", "NVFP4, 2-CTA MMA (M=256, N=64), cluster 2x2", 512, 128, 256, (256, 64), (2, 2),
         two_cta=True, dtype="fp16", max_clusters=1),
    # the optional formats: scales Float8E8M0FNU; MXF8 K tile 128 (four 1X MMAs, scale factor IDs 0..3)
    Case("blockscaled", "NVFP4 with UE8M0 scales, 1-CTA MMA", 256, 256, 512, (128, 128), (1, 1), dtype="fp32",
         extra={"format": "nvfp4-ue8m0"}),
    Case("blockscaled", "MXF4, 1-CTA MMA", 200, 136, 320, (128, 128), (1, 1), dtype="fp32",
         extra={"format": "mxf4"}),
    Case("blockscaled", "MXF8 E4M3, 1-CTA MMA", 200, 136, 320, (128, 128), (1, 1), dtype="fp32",
         extra={"format": "mxf8-e4m3"}),
    Case("blockscaled", "MXF8 E5M2, 2-CTA MMA (M=256), cluster 2x1", 256, 256, 256, (256, 128), (2, 1),
         two_cta=True, dtype="fp32", extra={"format": "mxf8-e5m2"}),
]


# ---------------------------------------------------------------------------------------------
# Runs
# ---------------------------------------------------------------------------------------------


def _stream():
    import cuda.bindings.driver as cuda

    return cuda.CUstream(0)


class CantImplement(Exception):
    pass


def compile_dense(mod, case: Case):
    """NVIDIA's PersistentDenseGemmKernel compiled for sm_100a; returns ``(compiled, make_args)``."""
    import cutlass
    import torch
    from cutlass.cute.runtime import from_dlpack

    from gemmlab.compile import compile_for

    cdt = {"bf16": (cutlass.BFloat16, torch.bfloat16), "fp16": (cutlass.Float16, torch.float16)}[case.dtype]
    gemm = mod.PersistentDenseGemmKernel(cutlass.Float32, case.two_cta, case.tiler, case.cluster, case.tma_store)
    if not gemm.can_implement((case.m, case.n, case.k, 1), cdt[0], cdt[0], cdt[0], "k", "k", "n"):
        raise CantImplement(f"the example refuses {case}")

    def tensors(seed):
        g = torch.Generator().manual_seed(seed)
        # (l, m, k) storage seen as (m, k, l), as the example's prepare_tensors / bmm do; values in [-2, 2]
        a = torch.randint(-2, 3, (1, case.m, case.k), generator=g).to(cdt[1]).permute(1, 2, 0)
        b = torch.randint(-2, 3, (1, case.n, case.k), generator=g).to(cdt[1]).permute(1, 2, 0)
        c = torch.full((1, case.m, case.n), float("nan"), dtype=cdt[1]).permute(1, 2, 0)
        cute_args = [from_dlpack(x, assumed_align=16).mark_layout_dynamic(leading_dim=1) for x in (a, b, c)]
        return (a, b, c), cute_args

    (_, cute_args) = tensors(0)
    compiled = compile_for("sm_100a", gemm, *cute_args, case.max_clusters, _stream())
    return compiled, tensors


def run_dense(compiled, tensors, case: Case, seed: int) -> dict:
    import torch

    from gemmlab.emulator.run import run_on_emulator

    (a, b, c), cute_args = tensors(seed)
    reports = run_on_emulator(compiled, *cute_args, seed=seed, extra_memory=(a, b, c))
    ref = (a[..., 0].double() @ b[..., 0].double().T).to(c.dtype)  # exact: integer sums < 2^24
    out = c[..., 0]
    err = (out.double() - ref.double()).abs().max().item()
    return {"max_err": err, "tolerance": 0.0, "pass": bool(torch.equal(out, ref)), "nan": int(out.isnan().sum()),
            "reports": reports}


E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)


def blocked_scales(sf, rows: int, sf_k: int):
    """Scale factors ``(rows, sf_k)`` (uint8 codes) in the layout the example's host code gives them
    (blockscaled_layout.tile_atom_to_shape_SF): atom ((32, 4), (16, 4)) : ((16, 4), (0, 1)) over
    (row, K), tiled K-blocks first, then row blocks: byte offset of (row r, scale block kb) =
    (kb % 4) + 4 * ((r % 128) // 32) + 16 * (r % 32) + 512 * (kb // 4 + ceil(sf_k / 4) * (r // 128))."""
    import torch

    rm, rk = -(-rows // 128), -(-sf_k // 4)
    pad = torch.zeros(rm * 128, rk * 4, dtype=torch.uint8)
    pad[:rows, :sf_k] = sf
    # (rm, r1, r0, rk, kb0) with r = 128 rm + 32 r1 + r0, kb = 4 rk + kb0 -> (rm, rk, r0, r1, kb0)
    return pad.view(rm, 4, 32, rk, 4).permute(0, 3, 2, 1, 4).contiguous().view(-1)


#: Block-scaled formats: A/B element type, scale type, values of K per scale (the example's sf_vec_size).
FORMATS = {"nvfp4": ("e2m1", "ue4m3", 16), "nvfp4-ue8m0": ("e2m1", "ue8m0", 16), "mxf4": ("e2m1", "ue8m0", 32),
           "mxf8-e4m3": ("e4m3", "ue8m0", 32), "mxf8-e5m2": ("e5m2", "ue8m0", 32)}


def compile_blockscaled(mod, case: Case):
    """NVIDIA's Sm100BlockScaledPersistentDenseGemmKernel for ``case.extra["format"]`` (default NVFP4)."""
    import cutlass
    import cutlass.cute as cute
    import torch
    from cutlass.cute.nvgpu import OperandMajorMode
    from cutlass.cute.runtime import make_ptr

    from gemmlab.compile import compile_for

    try:
        from cutlass.tensor_utils import LayoutEnum
    except ImportError:  # older DSLs
        from cutlass.utils import LayoutEnum
    ab, sft, vec = FORMATS[case.extra.get("format", "nvfp4")]
    cdt = {"fp32": (cutlass.Float32, torch.float32), "fp16": (cutlass.Float16, torch.float16),
           "bf16": (cutlass.BFloat16, torch.bfloat16)}[case.dtype]
    abt = {"e2m1": cutlass.Float4E2M1FN, "e4m3": cutlass.Float8E4M3FN, "e5m2": cutlass.Float8E5M2}[ab]
    sf = {"ue4m3": cutlass.Float8E4M3FN, "ue8m0": cutlass.Float8E8M0FNU}[sft]
    try:  # the signature of HEAD (2026); other revisions may differ, then the kernel's own checks decide
        ok = mod.Sm100BlockScaledPersistentDenseGemmKernel.can_implement(
            (case.m, case.n, case.k, 1), abt, abt, sf, cdt[0], "k", "k", "n", vec, case.tiler, case.cluster)
    except TypeError:
        ok = True
    if not ok:
        raise CantImplement(f"the example refuses {case}")
    gemm = mod.Sm100BlockScaledPersistentDenseGemmKernel(vec, case.tiler, case.cluster)

    def ptr(dtype, t, align):
        return make_ptr(dtype, 0 if t is None else t.data_ptr(), cute.AddressSpace.gmem, assumed_align=align)

    compiled = compile_for("sm_100a", gemm, ptr(abt, None, 16), ptr(abt, None, 16), ptr(sf, None, 32),
                           ptr(sf, None, 32), ptr(cdt[0], None, 16),
                           (OperandMajorMode.K, OperandMajorMode.K, LayoutEnum.ROW_MAJOR),
                           (cutlass.Int32(0),) * 4, case.max_clusters, _stream())

    def tensors(seed):
        g = torch.Generator().manual_seed(seed)
        m, n, k = case.m, case.n, case.k
        if ab == "e2m1":  # two E2M1 codes a byte, low nibble first
            a = torch.randint(0, 256, (m, k // 2), generator=g, dtype=torch.uint8)
            b = torch.randint(0, 256, (n, k // 2), generator=g, dtype=torch.uint8)
        else:  # random FP8 codes, the non-finite ones replaced by zero
            a = torch.randint(0, 256, (m, k), generator=g, dtype=torch.uint8)
            b = torch.randint(0, 256, (n, k), generator=g, dtype=torch.uint8)
            for t in (a, b):
                t[~element_values(t, ab).isfinite()] = 0
        if sft == "ue4m3":  # UE4M3 codes 0x28..0x47: 0.25 .. 3.75 (exponent and mantissa both vary)
            lo, hi = 0x28, 0x48
        else:  # UE8M0 codes 2^-6 .. 2^6
            lo, hi = 121, 134
        sfa = torch.randint(lo, hi, (m, k // vec), generator=g, dtype=torch.uint8)
        sfb = torch.randint(lo, hi, (n, k // vec), generator=g, dtype=torch.uint8)
        c = torch.full((m, n), float("nan"), dtype=cdt[1])
        mem = (a, b, blocked_scales(sfa, m, k // vec), blocked_scales(sfb, n, k // vec), c)
        args = [ptr(abt, mem[0], 16), ptr(abt, mem[1], 16), ptr(sf, mem[2], 32), ptr(sf, mem[3], 32),
                ptr(cdt[0], c, 16), (m, n, k, 1)]
        return (a, b, sfa, sfb, c), mem, args

    return compiled, tensors


def element_values(q, fmt: str):
    """Codes -> float64: E2M1 nibbles by the table (low nibble first), FP8 through torch's float8 types."""
    import torch

    if fmt == "e2m1":
        table = torch.tensor(E2M1, dtype=torch.float64)
        return torch.stack([table[(q & 15).long()], table[(q >> 4).long()]], -1).reshape(q.shape[0], -1)
    return q.view({"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}[fmt]).double()


def scale_values(s, fmt: str, vec: int):
    import torch

    if fmt == "ue4m3":
        v = s.view(torch.float8_e4m3fn).double()
    else:  # UE8M0: 2^(code - 127)
        v = torch.pow(2.0, s.double() - 127)
    return v.repeat_interleave(vec, 1)


def blockscaled_reference(a, b, sfa, sfb, fmt: str = "nvfp4"):
    """``(A * scale_A) @ (B * scale_B)^T`` in FP64, and the same with absolute values (the size of what
    is summed, against which the FP32 summation's rounding is measured)."""
    ab, sft, vec = FORMATS[fmt]
    x = element_values(a, ab) * scale_values(sfa, sft, vec)
    y = element_values(b, ab) * scale_values(sfb, sft, vec)
    return x @ y.T, x.abs() @ y.abs().T


def run_blockscaled(compiled, tensors, case: Case, seed: int) -> dict:
    """Error of each element relative to the sum of the absolute values of its products: FP32 summation
    stays near 2^-24 * sqrt(K) of it, while one wrong scale factor (a factor of 2 or more on one block of
    K) moves an element by a sizeable fraction of it."""
    from gemmlab.emulator.run import run_on_emulator

    (a, b, sfa, sfb, c), mem, args = tensors(seed)
    reports = run_on_emulator(compiled, *args, seed=seed, extra_memory=mem)
    ref, size = blockscaled_reference(a, b, sfa, sfb, case.extra.get("format", "nvfp4"))
    size = size.clamp_min(1e-30)
    err = ((c.double() - ref).abs() / size).max().item()
    tol = 1e-5 if case.dtype == "fp32" else 2.0 ** -8  # FP32 out; 16-bit out: its rounding (8 or 11 bits)
    return {"max_err": err, "tolerance": tol, "pass": err <= tol and not c.isnan().any(),
            "nan": int(c.isnan().sum()), "reports": reports}


RUNNERS = {"dense": ("dense_gemm_persistent", compile_dense, run_dense),
           "blockscaled": ("dense_blockscaled_gemm_persistent", compile_blockscaled, run_blockscaled)}


def run_case(modules: dict, case: Case, seeds) -> list[dict]:
    """Compile ``case`` once and run it on the emulator for each seed; one row per seed."""
    name, compile_fn, run_fn = RUNNERS[case.example]
    dtype = case.dtype if case.example == "dense" else f"{case.extra.get('format', 'nvfp4')} -> {case.dtype}"
    base = {"example": name, "config": case.config, "shape": case.shape, "dtype": dtype,
            "mma_tiler": list(case.tiler), "cluster": list(case.cluster), "use_2cta_instrs": case.two_cta,
            "tma_store": case.tma_store, "max_active_clusters": case.max_clusters}
    t0 = time.perf_counter()
    try:
        compiled, tensors = compile_fn(modules[name], case)
    except CantImplement as e:
        return [{**base, "seed": None, "outcome": "refused by the example", "detail": str(e), "pass": False}]
    compile_s = time.perf_counter() - t0
    rows = []
    for seed in seeds:
        row = {**base, "seed": seed, "compile_s": round(compile_s, 2)}
        try:
            r = run_fn(compiled, tensors, case, seed)
        except Exception as e:  # an emulator error is an outcome to record, not a crash of the script
            row.update(outcome="error", pass_=False, detail=f"{type(e).__name__}: {str(e).splitlines()[0][:400]}")
            row["pass"] = row.pop("pass_")
            rows.append(row)
            continue
        reps = r.pop("reports")
        row.update(outcome="pass" if r["pass"] else "FAIL", max_err=r["max_err"], tolerance=r["tolerance"],
                   nan=r["nan"], pass_=r["pass"],
                   emulator_s=round(sum(x.seconds for x in reps), 3),
                   warp_instructions=sum(x.warp_instructions for x in reps),
                   async_ops=sum(x.async_ops for x in reps),
                   grid=list(reps[0].grid), block=list(reps[0].block), cluster_dims=list(reps[0].cluster),
                   smem=reps[0].smem, notes=[n for x in reps for n in x.notes])
        row["pass"] = row.pop("pass_")
        rows.append(row)
    return rows


COLUMNS = [("example", "example", ""), ("config", "config", ""), ("shape", "M x N x K", ""), ("dtype", "type", ""),
           ("seed", "seed", ""), ("err", "max error", ""), ("outcome", "outcome", ""),
           ("secs", "emulator s", ""), ("winst", "warp instr.", ""), ("nnotes", "ISA notes", "")]


def table(rows: list[dict]) -> str:
    from gemmlab.figures import format_table

    view = []
    for r in rows:
        view.append({**r, "example": {"dense_gemm_persistent": "dense_gemm",
                                      "dense_blockscaled_gemm_persistent": "blockscaled"}[r["example"]],
                     "err": f"{r['max_err']:.3g} (tol {r['tolerance']:.2g})" if "max_err" in r else "-",
                     "secs": f"{r['emulator_s']:.2f}" if "emulator_s" in r else "-",
                     "winst": str(r.get("warp_instructions", "-")),
                     "nnotes": str(len(r["notes"]) if "notes" in r else r.get("isa_notes", "-")),
                     "seed": str(r["seed"])})
    return format_table(view, COLUMNS)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cutlass", required=True, help="a checkout (or bare git directory) of NVIDIA/cutlass")
    p.add_argument("--rev", default="HEAD", help="the revision to take the examples from (default HEAD)")
    p.add_argument("--seeds", default="0,1,2", help="emulator scheduling seeds (also the inputs' seeds)")
    p.add_argument("--quick", action="store_true", help="only the cases marked quick (one per kind)")
    p.add_argument("--only", default="", help="run only cases whose config contains this text")
    p.add_argument("--out", default=None, help="folder for the result file (default results/cpu)")
    args = p.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]

    import cutlass

    from gemmlab.measure import bench

    directory, rev = extract(args.cutlass, args.rev)
    modules = {name: load(directory, name) for name in EXAMPLES}
    cases = [c for c in CASES if (c.quick or not args.quick) and args.only in c.config]
    rows = []
    t0 = time.perf_counter()
    for case in cases:
        new = run_case(modules, case, seeds)
        rows += new
        for r in new:
            print(f"  {r['example']:<34} {r['config']:<50} {r['shape']:>12} seed {r['seed']}: {r['outcome']}"
                  + (f", max error {r['max_err']:.3g}, {r['emulator_s']:.2f} s, {r['warp_instructions']} warp "
                     "instructions" if "max_err" in r else f" ({r.get('detail', '')})"), flush=True)
    total = time.perf_counter() - t0
    print()
    print(f"NVIDIA/cutlass {rev.get('commit') or rev['rev']} ({rev.get('describe', '')} {rev.get('date', '')}), "
          f"nvidia-cutlass-dsl {getattr(cutlass, '__version__', '?')}, on the emulator (CPU), {total:.0f} s in all")
    print(table(rows))
    passed = sum(r["pass"] for r in rows)
    print(f"\n{passed} of {len(rows)} runs pass. ISA notes: TMEM written or freed while a tcgen05.ld read of it was "
          "never waited for (tcgen05.wait::ld): NVIDIA's DSL epilogues never wait (see isa/tcgen05.py)")
    # the notes repeat from run to run: keep each row's count, and each distinct note once (a few per example)
    distinct: dict = {}
    for r in rows:
        notes = r.pop("notes", [])
        r["isa_notes"] = len(notes)
        for n in notes:
            kind = (r["example"], n.split(" of CTA")[0].split(" by CTA")[0])
            distinct.setdefault(kind, f"{r['example']} ({r['config']}, seed {r['seed']}): {n}")
    path = bench.write_results("emulator_nvidia_examples", rows, out_dir=args.out or bench.RESULTS_DIR / "cpu",
                               tier="emulator", examples=EXAMPLES, revision=rev, isa_notes=list(distinct.values()),
                               dsl=getattr(cutlass, "__version__", None), seeds=seeds, total_s=round(total, 1),
                               note="functional emulation on the CPU (gemmlab.emulator); not a B200 measurement")
    print(f"wrote {path.relative_to(ROOT) if ROOT in path.parents else path}")
    return 0 if passed == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
