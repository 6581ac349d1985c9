"""Run a compiled kernel's *host* code on the CPU and record the launches it makes.

``cute.compile`` turns a ``@cute.jit`` host function into LLVM code that, on a GPU
machine, builds the kernel's parameters (tensor maps included: the DSL encodes the
128-byte ``CUtensorMap`` itself, in the host code) and calls the CUDA runtime through
a handful of entry points (``_cudaLibraryLoadData``, ``_cudaLibraryGetKernel``,
``_cudaLaunchKernelEx``, ...) exported by the DSL's runtime library.

Here the same host module (``compiled.ir_module``) is JIT-compiled a second time,
with those entry points bound to Python stand-ins instead of the runtime library.
Calling it runs the exact host code the GPU path runs: the launch geometry (grid,
block, cluster, dynamic shared memory) and the parameter bytes the emulator gets are
the ones a GPU would get, read from the compiled artifact, not written per kernel.
"""
from __future__ import annotations

import ctypes
import re
import threading
from dataclasses import dataclass, field

#: ``cudaLaunchAttributeID`` values the launches use (CUDA runtime API, ``driver_types.h``).
ATTR_COOPERATIVE = 2
ATTR_CLUSTER_DIMENSION = 4

_P = ctypes.c_void_p
_I32 = ctypes.c_int32


class _LaunchConfig(ctypes.Structure):
    # cudaLaunchConfig_t as the host code builds it: struct<(array<3 x i32>, array<3 x i32>, i64, ptr, ptr, i32)>
    _fields_ = [("grid", ctypes.c_uint32 * 3), ("block", ctypes.c_uint32 * 3), ("smem", ctypes.c_uint64),
                ("stream", _P), ("attrs", _P), ("num_attrs", ctypes.c_uint32)]


#: One launch attribute: struct<(i32, array<4 x i8>, array<64 x i8>)> (id, padding, value union).
_ATTR_BYTES = 72


@dataclass
class Launch:
    """One kernel launch as the host code asked for it."""

    kernel: str  # the PTX ``.entry`` name
    grid: tuple
    block: tuple
    cluster: tuple
    smem: int  # dynamic shared memory in bytes
    params: list  # the bytes of each kernel parameter, in ``.entry`` order
    attributes: dict = field(default_factory=dict)  # attribute id -> its 64 raw value bytes

    @property
    def ctas(self) -> int:
        return self.grid[0] * self.grid[1] * self.grid[2]

    @property
    def threads(self) -> int:
        return self.block[0] * self.block[1] * self.block[2]


def entry_params(ptx: str) -> dict:
    """``{entry name: [(param name, size in bytes), ...]}`` from the ``.entry`` declarations of ``ptx``."""
    out = {}
    for m in re.finditer(r"\.entry\s+(\w+)\s*\((.*?)\)", ptx, re.S):
        params = []
        for p in re.finditer(r"\.param\s+(?:\.align\s+\d+\s+)?\.(\w+)\s+(\w+)(?:\[(\d+)\])?", m.group(2)):
            kind, name, count = p.group(1), p.group(2), p.group(3)
            bits = int(re.sub(r"\D", "", kind) or 8) if kind != "pred" else 8
            params.append((name, bits // 8 * (int(count) if count else 1)))
        out[m.group(1)] = params
    if not out:
        raise ValueError("no .entry in the PTX")
    return out


_LOCK = threading.Lock()  # the JIT and its callbacks are process-wide state


class HostRunner:
    """The compiled function's host code, JIT-compiled against a stand-in CUDA runtime."""

    def __init__(self, compiled):
        from cutlass._mlir import ir
        from cutlass._mlir.execution_engine import ExecutionEngine

        self.compiled = compiled
        ptx = getattr(compiled, "__ptx__", None)
        if not isinstance(ptx, str) or ".entry" not in ptx:
            raise ValueError("the compiled function kept no PTX: compile it with gemmlab.compile.compile_for "
                             "(--keep-ptx)")
        if getattr(compiled, "ir_module", None) is None:
            raise ValueError("the compiled function has no host module (ir_module)")
        self.ptx = ptx
        self.params = entry_params(ptx)
        text = str(compiled.ir_module)
        if "--enable-tvm-ffi" in text or "__tvm_ffi" in text:
            raise ValueError("compile without TVM-FFI for the emulator (the launch path is the same kernel)")
        self._runtime = sorted(set(re.findall(r"llvm\.func @(_cu\w+)\(", text)))
        with compiled.ir_module.context:
            module = ir.Module.parse(text)
        self._engine = ExecutionEngine(module, opt_level=2, shared_libs=[])
        self._keep = []
        self._kernels: list[str] = []
        self.launches: list[Launch] = []
        self._bind()
        # cuda_init / cuda_load take a pointer to the library handle; raw_lookup gives the packed
        # wrapper (``_mlir_<name>``: an array of pointers to the arguments, then to the result).
        self._library = ctypes.c_void_p(0)
        for fn in ("cuda_init", "cuda_load"):
            addr = self._engine.raw_lookup(fn)
            if addr:
                arg, rc = ctypes.c_void_p(ctypes.addressof(self._library)), ctypes.c_int32(0)
                packed = (_P * 2)(ctypes.addressof(arg), ctypes.addressof(rc))
                ctypes.CFUNCTYPE(None, _P)(addr)(ctypes.addressof(packed))
                if rc.value:
                    raise RuntimeError(f"the host module's {fn} failed ({rc.value})")
        self._entry = self._engine.lookup(compiled.function_name)

    # ---- the stand-in CUDA runtime
    def _register(self, name, restype, argtypes, fn):
        cb = ctypes.CFUNCTYPE(restype, *argtypes)(fn)
        self._keep.append(cb)
        self._engine.raw_register_runtime(name, ctypes.cast(cb, _P))

    def _bind(self):
        def ok(*_):
            return 0

        def get_device(out):
            ctypes.c_int32.from_address(out).value = 0
            return 0

        def device_attribute(out, attr, dev):
            # 97 = cudaDevAttrMaxSharedMemoryPerBlockOptin (232448 on sm_90 and sm_100); others 0
            ctypes.c_int32.from_address(out).value = 232448 if attr == 97 else 0
            return 0

        def library_get_kernel(out, library, name):
            self._kernels.append(ctypes.string_at(name).decode())
            ctypes.c_void_p.from_address(out).value = 0x1000 + len(self._kernels)
            return 0

        def kernel_attribute(out, attr, kernel, dev):
            ctypes.c_int32.from_address(out).value = 0  # static shared memory: the DSL uses dynamic only
            return 0

        def occupancy(out, *_):
            ctypes.c_int32.from_address(out).value = 1
            return 0

        def launch_ex(config, kernel, args):
            self._record(ctypes.cast(config, ctypes.POINTER(_LaunchConfig)).contents, kernel, args)
            return 0

        def launch(kernel, gx, gy, gz, bx, by, bz, args, smem, stream):
            cfg = _LaunchConfig()
            cfg.grid[:] = (gx, gy, gz)
            cfg.block[:] = (bx, by, bz)
            cfg.smem, cfg.num_attrs = smem, 0
            self._record(cfg, kernel, args)
            return 0

        table = {
            "_cudaGetDevice": (_I32, (_P,), get_device),
            "_cudaDeviceGetAttribute": (_I32, (_P, _I32, _I32), device_attribute),
            "_cudaLibraryLoadData": (_I32, (_P, _P, _P, _P, _I32, _P, _P, _I32), ok),
            "_cudaLibraryGetKernel": (_I32, (_P, _P, _P), library_get_kernel),
            "_cuKernelGetAttribute": (_I32, (_P, _I32, _P, _I32), kernel_attribute),
            "_cudaFuncSetAttribute": (_I32, (_P, _I32, _I32), ok),
            "_cudaKernelSetAttributeForDevice": (_I32, (_P, _I32, _I32, _I32), ok),
            "_cudaOccupancyMaxActiveBlocksPerMultiprocessor": (_I32, (_P, _P, _I32, ctypes.c_int64), occupancy),
            "_cudaLaunchKernelEx": (_I32, (_P, _P, _P), launch_ex),
            "_cudaLaunchKernel": (_I32, (_P, _I32, _I32, _I32, _I32, _I32, _I32, _P, ctypes.c_int64, _P), launch),
        }
        missing = [n for n in self._runtime if n not in table]
        if missing:
            raise NotImplementedError(f"the host code calls CUDA runtime entry points the emulator's stand-in "
                                      f"does not provide: {', '.join(missing)}")
        for name in self._runtime:
            restype, argtypes, fn = table[name]
            self._register(name, restype, argtypes, fn)

    def _record(self, cfg, kernel, args):
        index = (kernel or 0) - 0x1001
        if not 0 <= index < len(self._kernels):
            raise RuntimeError("the host code launched a kernel it never loaded")
        name = self._kernels[index]
        attrs = {}
        for i in range(cfg.num_attrs):
            base = cfg.attrs + i * _ATTR_BYTES
            attrs[ctypes.c_int32.from_address(base).value] = ctypes.string_at(base + 8, 64)
        cluster = (1, 1, 1)
        if ATTR_CLUSTER_DIMENSION in attrs:
            cluster = tuple(int.from_bytes(attrs[ATTR_CLUSTER_DIMENSION][4 * j:4 * j + 4], "little")
                            for j in range(3))
        argv = ctypes.cast(args, ctypes.POINTER(_P))
        params = [ctypes.string_at(argv[i], size) for i, (_, size) in enumerate(self.params[name])]
        self.launches.append(Launch(name, tuple(cfg.grid), tuple(cfg.block), cluster, int(cfg.smem), params, attrs))

    # ---- calling it
    def __call__(self, *args) -> list:
        """Run the host code with ``args`` (what the compiled function takes, the stream last); return its launches.

        Tensors are CuTe DSL tensors over CPU memory (``from_dlpack`` of CPU torch tensors): the
        addresses the host code puts into parameters and tensor maps are then host addresses,
        which the emulator's global memory serves.
        """
        exe_args, _adapted = self.compiled.execution_args.generate_execution_args(tuple(args), {})
        result = ctypes.c_int32(0)
        packed = (_P * (len(exe_args) + 1))()
        for i, x in enumerate(exe_args):
            packed[i] = x if type(x) is _P else _P(x).value
        packed[len(exe_args)] = ctypes.addressof(result)
        with _LOCK:
            start = len(self.launches)
            self._entry(packed)
            if result.value:
                raise RuntimeError(f"the host code returned CUDA error {result.value}")
            return self.launches[start:]


def capture_launches(compiled, *args) -> list:
    """The launches ``compiled(*args)`` would make, without a GPU (see :class:`HostRunner`)."""
    return HostRunner(compiled)(*args)
