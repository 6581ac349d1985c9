"""The three machines of the course as data, and the roofline they imply.

Chapter 00 draws the course's target GPUs (H100 SXM5, H200 SXM, B200) on one
roofline: for a kernel that does ``F`` FLOPs while moving ``B`` bytes to and
from HBM, its *arithmetic intensity* is ``I = F / B`` (FLOP/byte) and the best
it can reach is ``min(peak, bandwidth * I)``. Below the *ridge point*
``peak / bandwidth`` a kernel is limited by memory, above it by the tensor cores.

Every number below is the vendor's, with its source in the ``sources`` field.
Two traps when reading NVIDIA datasheets:

* Tensor-core rates are quoted **with 2:4 structured sparsity**; the dense
  rate a GEMM can reach is half of it. This module stores dense rates only.
* NVIDIA's "KB" for on-chip memories means 1024 bytes (228 KB = 233,472 bytes):
  sizes here are in KiB. HBM capacity is in GB as the datasheet writes it.

The B200's memory bandwidth is quoted two ways: 8 TB/s (the GTC 2024
announcement and the GB200 NVL72 column of the Blackwell datasheet) and
7.7 TB/s (the HGX B200 column). We use 7.7 TB/s: the HGX B200 column is the
one our dense rates come from (the 1000 W part: 2.25/4.5/9 PFLOP/s dense).
Third parties report a B200's driver giving a 7680-bit bus at 3996 MHz (double
data rate), 7680 / 8 * 3.996e9 * 2 = 7.67 TB/s, which agrees; this project had
no B200 and read no such value itself (nor the SM count and L2 size below,
which are marked the same way).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

#: Data types the tensor-core peaks are given for, in the order tables show them.
DTYPES = ("bf16", "fp8", "fp4")

#: Bytes per element of each dtype (FP4 packs two values per byte).
DTYPE_BYTES = {"bf16": 2, "fp8": 1, "fp4": 0.5}

_DATASHEET_H100 = "NVIDIA H100 Tensor Core GPU datasheet, H100 SXM column"
_DATASHEET_H200 = "NVIDIA H200 Tensor Core GPU datasheet, H200 SXM column"
_DATASHEET_B200 = "NVIDIA Blackwell datasheet, 'Individual Blackwell GPU Specifications', HGX B200 column"
_HALF = " (datasheet rate is with sparsity; dense is half)"
_GUIDE = "CUDA C++ Programming Guide, technical specifications per compute capability"


@dataclass(frozen=True)
class GPUSpec:
    """One GPU's datasheet numbers that matter for GEMM (dense rates only)."""

    name: str                       #: full product name
    short: str                      #: key used in tables and figures
    architecture: str               #: Hopper / Blackwell
    compute_capability: tuple[int, int]
    target: str                     #: CuTe DSL --gpu-arch for its tensor-core kernels
    tier: str                       #: the course tier this GPU provides
    sms: int                        #: streaming multiprocessors
    bf16_tflops: float              #: dense BF16 tensor-core peak, TFLOP/s (FP32 accumulate)
    fp8_tflops: float               #: dense FP8 (e4m3/e5m2) tensor-core peak, TFLOP/s
    fp4_tflops: float | None        #: dense FP4 (e2m1) tensor-core peak, TFLOP/s; None: no FP4 MMA
    hbm_gb: float                   #: HBM capacity, GB as quoted
    hbm_tbps: float                 #: HBM bandwidth, TB/s (1e12 bytes/s)
    l2_mib: float                   #: L2 cache, MiB (as cudaDeviceProp.l2CacheSize reports it)
    smem_per_sm_kib: int            #: shared memory per SM (largest carveout), KiB
    smem_per_block_kib: int         #: shared memory one block can opt in to, KiB
    tmem_per_sm_kib: int | None     #: tensor memory per SM, KiB; None: no TMEM
    regs_per_sm: int                #: 32-bit registers per SM
    sources: tuple[tuple[str, str], ...] = ()  #: (field, where the number comes from)

    def peak_tflops(self, dtype: str) -> float | None:
        """Dense tensor-core peak for ``dtype`` (``bf16``, ``fp8``, ``fp4``); None if absent."""
        _check_dtype(dtype)
        return getattr(self, f"{dtype}_tflops")

    @property
    def register_file_kib(self) -> int:
        return self.regs_per_sm * 4 // 1024

    def source(self, field: str) -> str:
        """Where the value of ``field`` comes from."""
        for f, note in self.sources:
            if f == field:
                return note
        raise KeyError(f"{self.short}: no source recorded for {field!r}")


H100 = GPUSpec(
    name="NVIDIA H100 SXM5 80GB", short="H100", architecture="Hopper",
    compute_capability=(9, 0), target="sm_90a", tier="sm90",
    sms=132,
    bf16_tflops=989.4,   # 1,979 sparse; = 132 SMs x 4096 dense FLOP/clk x 1.83 GHz
    fp8_tflops=1978.9,   # 3,958 sparse
    fp4_tflops=None,     # Hopper tensor cores have no FP4 MMA
    hbm_gb=80, hbm_tbps=3.35, l2_mib=50,
    smem_per_sm_kib=228, smem_per_block_kib=227, tmem_per_sm_kib=None,
    regs_per_sm=65536,
    sources=(
        ("sms", _DATASHEET_H100 + " (132 SMs; full GH100 die has 144)"),
        ("bf16_tflops", _DATASHEET_H100 + ": BF16 Tensor Core 1,979 TFLOPS" + _HALF),
        ("fp8_tflops", _DATASHEET_H100 + ": FP8 Tensor Core 3,958 TFLOPS" + _HALF),
        ("fp4_tflops", "Hopper has no FP4 tensor-core instruction"),
        ("hbm_gb", _DATASHEET_H100 + ": 80 GB HBM3"),
        ("hbm_tbps", _DATASHEET_H100 + ": 3.35 TB/s"),
        ("l2_mib", "NVIDIA Hopper architecture whitepaper: 50 MB L2 on H100 SXM5"),
        ("smem_per_sm_kib", _GUIDE + ", 9.0: 228 KB per SM"),
        ("smem_per_block_kib", _GUIDE + ", 9.0: 227 KB per block (1 KB reserved by CUDA)"),
        ("tmem_per_sm_kib", "tensor memory is new in Blackwell (sm_100)"),
        ("regs_per_sm", _GUIDE + ", 9.0: 64K 32-bit registers per SM (256 KB)"),
    ),
)

H200 = GPUSpec(
    name="NVIDIA H200 SXM 141GB", short="H200", architecture="Hopper",
    compute_capability=(9, 0), target="sm_90a", tier="sm90",
    sms=132,
    bf16_tflops=989.4,   # same GH100 compute as H100 SXM5
    fp8_tflops=1978.9,
    fp4_tflops=None,
    hbm_gb=141, hbm_tbps=4.8, l2_mib=60,
    smem_per_sm_kib=228, smem_per_block_kib=227, tmem_per_sm_kib=None,
    regs_per_sm=65536,
    sources=(
        ("sms", "same GH100 configuration as H100 SXM5; cudaDeviceProp reports 132"),
        ("bf16_tflops", _DATASHEET_H200 + ": BF16 Tensor Core 1,979 TFLOPS" + _HALF),
        ("fp8_tflops", _DATASHEET_H200 + ": FP8 Tensor Core 3,958 TFLOPS" + _HALF),
        ("fp4_tflops", "Hopper has no FP4 tensor-core instruction"),
        ("hbm_gb", _DATASHEET_H200 + ": 141 GB HBM3e"),
        ("hbm_tbps", _DATASHEET_H200 + ": 4.8 TB/s"),
        ("l2_mib", "not in the H200 datasheet; cudaDeviceProp.l2CacheSize on an H200 reports "
                   "60 MiB (the same GH100 die, configured with 10 MiB more L2 than the H100 SXM5)"),
        ("smem_per_sm_kib", _GUIDE + ", 9.0: 228 KB per SM"),
        ("smem_per_block_kib", _GUIDE + ", 9.0: 227 KB per block"),
        ("tmem_per_sm_kib", "tensor memory is new in Blackwell (sm_100)"),
        ("regs_per_sm", _GUIDE + ", 9.0: 64K 32-bit registers per SM"),
    ),
)

B200 = GPUSpec(
    name="NVIDIA B200 (HGX, 1000 W)", short="B200", architecture="Blackwell",
    compute_capability=(10, 0), target="sm_100a", tier="sm100",
    sms=148,
    bf16_tflops=2250.0,  # 4.5 PFLOPS sparse
    fp8_tflops=4500.0,   # 9 PFLOPS sparse
    fp4_tflops=9000.0,   # 18 PFLOPS sparse
    hbm_gb=180, hbm_tbps=7.7, l2_mib=126.5,
    smem_per_sm_kib=228, smem_per_block_kib=227,
    tmem_per_sm_kib=256,  # 128 lanes x 512 columns x 4 bytes
    regs_per_sm=65536,
    sources=(
        ("sms", "148: cudaDeviceProp.multiProcessorCount as third parties report it on a B200 (not read by this "
                "project: no B200 was available; NVIDIA's datasheet does not list SMs)"),
        ("bf16_tflops", _DATASHEET_B200 + ": FP16/BF16 Tensor Core 4.5 PFLOPS" + _HALF),
        ("fp8_tflops", _DATASHEET_B200 + ": FP8/FP6 Tensor Core 9 PFLOPS" + _HALF),
        ("fp4_tflops", _DATASHEET_B200 + ": FP4 Tensor Core 18 PFLOPS" + _HALF),
        ("hbm_gb", _DATASHEET_B200 + ": 180 GB HBM3e (192 GB in the GTC 2024 announcement)"),
        ("hbm_tbps", _DATASHEET_B200 + ": 7.7 TB/s; 8 TB/s is the GB200 NVL72 figure "
                     "(see the module docstring)"),
        ("l2_mib", "126.5 MiB: cudaDeviceProp.l2CacheSize as third parties report it on a B200 (not read by this "
                   "project: no B200 was available)"),
        ("smem_per_sm_kib", _GUIDE + ", 10.0: 228 KB per SM"),
        ("smem_per_block_kib", _GUIDE + ", 10.0: 227 KB per block"),
        ("tmem_per_sm_kib", "PTX ISA, tensor memory: 128 lanes x 512 columns of 32-bit cells per CTA"),
        ("regs_per_sm", _GUIDE + ", 10.0: 64K 32-bit registers per SM"),
    ),
)

#: The course's machines, in the order tables and figures show them.
GPUS: tuple[GPUSpec, ...] = (H100, H200, B200)

# --------------------------------------------------------------------------------------
# Limits the kernels size themselves by (one home: every module reads them from here)
# --------------------------------------------------------------------------------------

#: Shared memory one CTA may opt in to, in bytes: 227 KiB on sm_90 and sm_100 alike
#: (228 KiB per SM, 1 KiB of which CUDA keeps per block).
SMEM_PER_BLOCK = H100.smem_per_block_kib * 1024
assert SMEM_PER_BLOCK == H200.smem_per_block_kib * 1024 == B200.smem_per_block_kib * 1024

#: Tensor memory (sm_100) per SM: 128 lanes x 512 columns of 32-bit cells.
TMEM_LANES = 128
TMEM_COLUMNS = B200.tmem_per_sm_kib * 1024 // (4 * TMEM_LANES)
assert TMEM_COLUMNS == 512

#: The spec whose kernels a CuTe DSL target builds, for compile-only sizing.
_TARGET_SPEC = {"sm_90a": H100, "sm_100a": B200}


def spec_for_target(target: str) -> GPUSpec:
    """The GPU a compile target is sized for when no GPU is present (``sm_90a``: H100, ``sm_100a``: B200)."""
    if target not in _TARGET_SPEC:
        raise ValueError(f"target must be one of {', '.join(_TARGET_SPEC)}; got {target!r}")
    return _TARGET_SPEC[target]


def sm_count(device=None) -> int:
    """SMs of CUDA ``device`` (default: the current one): what persistent grids are sized by.

    Queried once per device and cached: the GEMM sizes its grid by it on every call.
    """
    return _sm_count(_device_index(device))


def _device_index(device) -> int:
    """The CUDA index of torch ``device`` (None, or a device without an index: the current one)."""
    import torch

    index = None if device is None else torch.device(device).index
    return torch.cuda.current_device() if index is None else index


@functools.lru_cache(maxsize=None)
def _sm_count(index: int) -> int:
    import torch

    return torch.cuda.get_device_properties(index).multi_processor_count


#: An empty kernel, loaded only to ask the driver how many clusters of a size fit at once.
_EMPTY_PTX = b".version 8.0\n.target sm_90a\n.address_size 64\n.visible .entry gemmlab_empty() { ret; }\n"


def max_active_clusters(size: int, device=None, *, threads: int = 384, smem_bytes: int = 200 * 1024) -> int:
    """How many clusters of ``size`` CTAs (1, 2, 4 or 8) device ``device`` (default: the current one) runs at once when
    each CTA takes ``threads`` threads and ``smem_bytes`` of shared memory (the default: one CTA per SM, as the
    decode twin does), as the driver reports it (``cuOccupancyMaxActiveClusters`` on an empty kernel).

    Not simply SMs / size: a cluster's CTAs share one GPC, and an H100's 132 SMs sit in GPCs of unequal size, so
    clusters of 4 leave SMs idle. Queried once per (device, size, threads, smem) and cached.
    """
    from .checks import check_int

    size = check_int("size", size, lo=1, hi=8)
    threads = check_int("threads", threads, lo=1, hi=1024)
    smem_bytes = check_int("smem_bytes", smem_bytes, lo=0, hi=H100.smem_per_block_kib * 1024)
    return _max_active_clusters(_device_index(device), size, threads, smem_bytes)


@functools.lru_cache(maxsize=None)
def _max_active_clusters(index: int, size: int, threads: int, smem_bytes: int) -> int:
    import torch
    from cuda.bindings import driver as cu

    def ok(res):
        err, *rest = res if isinstance(res, tuple) else (res,)
        if err != cu.CUresult.CUDA_SUCCESS:
            raise RuntimeError(f"max_active_clusters: the driver answered {err}")
        return rest[0] if len(rest) == 1 else rest

    with torch.cuda.device(index):
        torch.cuda.init()
        torch.empty(1, device="cuda")  # the primary context, current
        mod = ok(cu.cuModuleLoadData(_EMPTY_PTX))
        fn = ok(cu.cuModuleGetFunction(mod, b"gemmlab_empty"))
        ok(cu.cuFuncSetAttribute(fn, cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                 smem_bytes))
        cfg = cu.CUlaunchConfig()
        cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = size * 1024, 1, 1
        cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = threads, 1, 1
        cfg.sharedMemBytes = smem_bytes
        attr = cu.CUlaunchAttribute()
        attr.id = cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
        attr.value.clusterDim.x, attr.value.clusterDim.y, attr.value.clusterDim.z = size, 1, 1
        cfg.attrs = [attr]
        cfg.numAttrs = 1
        n = int(ok(cu.cuOccupancyMaxActiveClusters(fn, cfg)))
        ok(cu.cuModuleUnload(mod))
    return n


@functools.lru_cache(maxsize=None)
def device_spec(index: int = 0) -> GPUSpec | None:
    """The datasheet spec of CUDA device ``index``, if it is one of the course's GPUs (else None)."""
    import torch

    return spec_for(torch.cuda.get_device_name(index))


def spec_of(device=None) -> GPUSpec | None:
    """The datasheet spec of torch ``device`` (default: the current one); None where it is not one of the
    course's GPUs, or without CUDA."""
    try:
        import torch

        index = torch.device(device).index if device is not None else None
        return device_spec(torch.cuda.current_device() if index is None else index)
    except (RuntimeError, AssertionError, ValueError):  # no CUDA
        return None


def _check_dtype(dtype) -> str:
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}; got {dtype!r}")
    return dtype


def get(short: str) -> GPUSpec:
    """The spec whose short name is ``short`` (``"H100"``, ``"H200"``, ``"B200"``)."""
    for g in GPUS:
        if g.short.lower() == str(short).lower():
            return g
    raise ValueError(f"unknown GPU {short!r}; expected one of {', '.join(g.short for g in GPUS)}")


def spec_for(device_name: str) -> GPUSpec | None:
    """The spec matching a CUDA device name (``torch.cuda.get_device_name()``), if any.

    ``"NVIDIA H100 80GB HBM3"`` is the H100 SXM5; PCIe and NVL boards have other
    clocks and bandwidths, so they match nothing.
    """
    up = device_name.upper()
    if "PCIE" in up or "NVL" in up:
        return None
    for g in GPUS:
        if g.short in up:
            return g
    return None


def _peak(spec: GPUSpec, dtype: str) -> float:
    peak = spec.peak_tflops(dtype)
    if peak is None:
        raise ValueError(f"{spec.short} has no {dtype} tensor-core rate ({spec.source(f'{dtype}_tflops')})")
    return peak


def roofline(spec: GPUSpec, dtype: str, intensity):
    """Attainable TFLOP/s at ``intensity`` FLOP/byte: ``min(peak, bandwidth x intensity)``.

    TB/s x FLOP/byte = TFLOP/s. ``intensity`` may be a number or a numpy array.
    """
    import numpy as np

    peak = _peak(spec, dtype)
    x = np.asarray(intensity, dtype=float)
    if np.any(x < 0):
        raise ValueError(f"intensity must be >= 0 FLOP/byte; got {intensity!r}")
    y = np.minimum(peak, spec.hbm_tbps * x)
    return float(y) if y.ndim == 0 else y


def ridge_point(spec: GPUSpec, dtype: str) -> float:
    """FLOP/byte where the bandwidth slope meets the compute roof: ``peak / bandwidth``."""
    return _peak(spec, dtype) / spec.hbm_tbps


def gemm_intensity(M: int, N: int, K: int, bytes_per_elem: float,
                   out_bytes_per_elem: float | None = None) -> float:
    """FLOP/byte of ``C[M,N] = A[M,K] @ B[K,N]`` if A and B are read once and C written once.

    ``2*M*N*K / (bytes(A) + bytes(B) + bytes(C))``: the best case, every operand
    touching HBM exactly once. ``out_bytes_per_elem`` defaults to the input size
    (an FP8 GEMM usually writes BF16: pass 2). Scale factors are not counted.
    """
    from .checks import check_int, check_real

    M, N, K = (check_int(name, v, lo=1) for name, v in (("M", M), ("N", N), ("K", K)))
    bytes_per_elem = check_real("bytes_per_elem", bytes_per_elem, lo=0, lo_open=True)
    out = bytes_per_elem if out_bytes_per_elem is None else check_real("out_bytes_per_elem", out_bytes_per_elem,
                                                                       lo=0, lo_open=True)
    nbytes = bytes_per_elem * (M * K + K * N) + out * M * N
    return 2 * M * N * K / nbytes


def _fmt(v, spec="") -> str:
    return "-" if v is None else format(v, spec)


def spec_rows() -> list[dict]:
    """The rows of :func:`spec_table`, one dict per GPU, values as text."""
    rows = []
    for g in GPUS:
        rows.append({
            "gpu": g.short, "arch": g.architecture, "cc": "%d.%d" % g.compute_capability,
            "sms": str(g.sms),
            "bf16": _fmt(g.bf16_tflops, ".0f"), "fp8": _fmt(g.fp8_tflops, ".0f"),
            "fp4": _fmt(g.fp4_tflops, ".0f"),
            "hbm_gb": _fmt(g.hbm_gb, "g"), "hbm_tbps": _fmt(g.hbm_tbps, ".2f"),
            "l2": _fmt(g.l2_mib, "g"), "smem_sm": str(g.smem_per_sm_kib),
            "smem_blk": str(g.smem_per_block_kib), "tmem": _fmt(g.tmem_per_sm_kib),
            "regs": str(g.register_file_kib),
        })
    return rows


def spec_table() -> str:
    """A fixed-width table of the three GPUs: dense TFLOP/s, HBM, on-chip memories."""
    from .figures import format_table

    cols = [
        ("gpu", "GPU", ""), ("arch", "arch", ""), ("cc", "cc", ""), ("sms", "SMs", ""),
        ("bf16", "BF16", ""), ("fp8", "FP8", ""), ("fp4", "FP4", ""),
        ("hbm_gb", "HBM GB", ""), ("hbm_tbps", "HBM TB/s", ""), ("l2", "L2 MiB", ""),
        ("smem_sm", "SMEM/SM", ""), ("smem_blk", "SMEM/block", ""),
        ("tmem", "TMEM/SM", ""), ("regs", "regs/SM", ""),
    ]
    return (format_table(spec_rows(), cols) + "\n"
            "BF16/FP8/FP4: dense tensor-core TFLOP/s (datasheet sparse rate / 2); "
            "SMEM, TMEM, registers: KiB; '-': not on this GPU")


def workloads() -> list[dict]:
    """Example kernels with their arithmetic intensity (machine-independent)."""
    n = 4096
    return [
        {"label": "copy", "intensity": 0.0, "dtype": None, "chapters": "01, 03, 05",
         "what": "moves bytes, does no math"},
        {"label": "vector add BF16", "intensity": 1 / 6, "dtype": "bf16", "chapters": "-",
         "what": "1 FLOP per 6 bytes (two BF16 read, one written)"},
        {"label": "GEMM 16x4096x4096 BF16", "intensity": gemm_intensity(16, n, n, 2),
         "dtype": "bf16", "chapters": "08", "what": "skinny: a decode step, weights dominate"},
        {"label": "GEMM 4096^3 BF16", "intensity": gemm_intensity(n, n, n, 2),
         "dtype": "bf16", "chapters": "06, 07, 10", "what": "square: N/3 FLOP/byte"},
        {"label": "GEMM 4096^3 FP4->BF16", "intensity": gemm_intensity(n, n, n, 0.5, 2),
         "dtype": "fp4", "chapters": "11", "what": "NVFP4 in, BF16 out"},
    ]


def workload_table() -> str:
    """Each workload's intensity and the TFLOP/s the roofline allows on each GPU."""
    from .figures import format_table

    rows = []
    for w in workloads():
        row = {"label": w["label"], "intensity": f"{w['intensity']:.2f}", "dtype": w["dtype"] or "-",
               "chapters": w["chapters"]}
        for g in GPUS:
            if w["dtype"] is None:  # no FLOPs: the only number that matters is bandwidth
                row[g.short] = f"{g.hbm_tbps:.2f} TB/s"
            elif g.peak_tflops(w["dtype"]) is None:
                row[g.short] = "no " + w["dtype"]
            else:
                att = roofline(g, w["dtype"], w["intensity"])
                bound = "mem" if w["intensity"] < ridge_point(g, w["dtype"]) else "math"
                row[g.short] = f"{att:.0f} ({bound})" if att >= 10 else f"{att:.2f} ({bound})"
        rows.append(row)
    cols = [("label", "kernel", ""), ("chapters", "chapters", ""), ("intensity", "FLOP/byte", ""),
            ("dtype", "roof", "")]
    cols += [(g.short, f"{g.short} TF/s", "") for g in GPUS]
    return format_table(rows, cols)


#: Colours per GPU and line styles per dtype in the roofline figure.
_COLOURS = {"H100": "tab:blue", "H200": "tab:green", "B200": "tab:red"}
_STYLES = {"bf16": "-", "fp8": "--", "fp4": ":"}
X_RANGE = (0.03, 1e4)  # FLOP/byte shown on the x axis


def roofline_data(n_points: int = 200) -> dict:
    """What :func:`draw_roofline` plots: lines, ridge points, workloads.

    ``lines``: ``{(gpu, dtype): (x, y)}`` for every GPU x dtype it has;
    ``ridges``: ``{(gpu, dtype): (ridge FLOP/byte, peak TFLOP/s)}``;
    ``workloads``: :func:`workloads` with, per GPU, the attainable TFLOP/s.
    """
    import numpy as np

    x = np.logspace(np.log10(X_RANGE[0]), np.log10(X_RANGE[1]), n_points)
    lines, ridges = {}, {}
    for g in GPUS:
        for d in DTYPES:
            if g.peak_tflops(d) is None:
                continue
            lines[(g.short, d)] = (x, roofline(g, d, x))
            ridges[(g.short, d)] = (ridge_point(g, d), g.peak_tflops(d))
    marks = []
    for w in workloads():
        if w["dtype"] is None:
            att = {g.short: 0.0 for g in GPUS}
        else:
            att = {g.short: (roofline(g, w["dtype"], w["intensity"]) if g.peak_tflops(w["dtype"]) else None)
                   for g in GPUS}
        marks.append({**w, "attainable": att})
    return {"lines": lines, "ridges": ridges, "workloads": marks, "x_range": X_RANGE}


def draw_roofline(name: str = "00_roofline") -> tuple[Path, dict]:
    """Draw the roofline of every GPU x dtype; save ``figures/<name>.png``.

    Returns ``(path, data)`` with ``data`` from :func:`roofline_data`.
    """
    from .figures import new_figure, save

    data = roofline_data()
    fig, ax = new_figure(figsize=(9.5, 6))
    for (gpu, d), (x, y) in data["lines"].items():
        rx, ry = data["ridges"][(gpu, d)]
        ax.plot(x, y, _STYLES[d], color=_COLOURS[gpu], lw=1.8,
                label=f"{gpu} {d.upper()}: ridge {rx:.0f} FLOP/B")
        ax.plot([rx], [ry], "o", color=_COLOURS[gpu], ms=6)
    lo, hi = data["x_range"]
    for w in data["workloads"]:
        xi = w["intensity"]
        if xi == 0:  # zero FLOPs: no place on a log axis; point at it from the left edge
            ax.annotate(f"{w['label']} (ch. {w['chapters']}): 0 FLOP/byte, off the axis;\n"
                        "only the bandwidth counts", xy=(lo, 0.14), xytext=(0.7, 0.14),
                        fontsize=8, va="center", color="0.25",
                        arrowprops=dict(arrowstyle="->", color="0.4"))
            continue
        ax.axvline(xi, color="0.6", lw=0.8, ls="-.", zorder=0)
        # Labels sit where no roof runs: low down if the lowest roof leaves room, else above the highest.
        ys = [y for y in w["attainable"].values() if y is not None]
        y_text = 0.3 if min(ys) >= 30 else max(ys) * 1.6
        ax.text(xi * 1.08, y_text, w["label"], rotation=90, fontsize=7.5, color="0.25", va="bottom")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(0.1, 3e4)
    ax.set_xlabel("arithmetic intensity (FLOP per byte of HBM traffic)")
    ax.set_ylabel("attainable dense TFLOP/s")
    ax.set_title("Roofline: H100 SXM5, H200 SXM, B200 (dense tensor-core peaks; dots = ridge points)")
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(loc="upper left", fontsize=7.5, ncol=2)
    return save(fig, name), data


__all__ = [
    "GPUSpec", "H100", "H200", "B200", "GPUS", "DTYPES", "get", "spec_for", "roofline",
    "ridge_point", "gemm_intensity", "spec_table", "workloads", "workload_table",
    "roofline_data", "draw_roofline", "SMEM_PER_BLOCK", "TMEM_LANES", "TMEM_COLUMNS", "spec_for_target",
    "sm_count", "device_spec",
]
