"""Compiling CuTe DSL kernels for an explicit target, and reading their PTX.

Compile-only cells name the target (``sm_90a`` or ``sm_100a``) so that they print
the same PTX on a laptop, in CI and on the GPU machine. Launching cells compile
for :func:`gemmlab.tiers.device_target`.
"""
from __future__ import annotations

import os
import re
import tempfile
import threading

TARGETS = ("sm_90a", "sm_100a")

#: One compile at a time in this process. The DSL's MLIR context is not thread-safe: two threads
#: compiling at once abort the whole process ("An MLIR function requires a Location ..."), so
#: :func:`compile_for` (through which every compile of the library goes) holds this lock.
COMPILE_LOCK = threading.RLock()

#: The temporary folder of this process: ``gemmlab-<pid>-*`` in the system's temp dir, made on first
#: use, removed at exit. A process ended by a signal cannot remove its own; the next process that
#: makes one removes those of processes that no longer run.
SCRATCH_PREFIX = "gemmlab-"
_SCRATCH: tuple[int, str] | None = None  # (pid, path)
_SCRATCH_LOCK = threading.Lock()
_SCRATCH_RE = re.compile(r"^gemmlab-(\d+)-[^/]+$")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True  # another user's process, or we cannot tell: leave it alone
    return True


def _remove_scratch(pid: int, path: str) -> None:
    import shutil

    if os.getpid() == pid:  # never a parent's folder from a forked child
        shutil.rmtree(path, ignore_errors=True)


def sweep_stale_scratch(tmp: str | None = None) -> list[str]:
    """Remove the temporary folders of gemmlab processes that no longer run (ours only); return them."""
    import shutil

    tmp = tmp or tempfile.gettempdir()
    removed = []
    try:
        names = os.listdir(tmp)
    except OSError:
        return removed
    for name in names:
        m = _SCRATCH_RE.match(name)
        path = os.path.join(tmp, name)
        if not m or int(m.group(1)) == os.getpid() or _pid_alive(int(m.group(1))):
            continue
        try:
            if os.stat(path).st_uid != os.getuid() or not os.path.isdir(path):
                continue
        except (OSError, AttributeError):
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed


def scratch_dir(sub: str | None = None) -> str:
    """This process's one temporary folder (or its sub-folder ``sub``), made on first use, removed at exit.

    Kept PTX goes to ``ptx/`` (the DSL names the file after the argument types only, so two processes
    sharing a folder could read each other's PTX); the runner keeps its kernelspec and kernel sockets here.
    """
    global _SCRATCH
    with _SCRATCH_LOCK:
        if _SCRATCH is None or _SCRATCH[0] != os.getpid() or not os.path.isdir(_SCRATCH[1]):
            import atexit

            sweep_stale_scratch()
            path = tempfile.mkdtemp(prefix=f"{SCRATCH_PREFIX}{os.getpid()}-")
            _SCRATCH = (os.getpid(), path)
            atexit.register(_remove_scratch, os.getpid(), path)
        path = _SCRATCH[1]
    if sub:
        path = os.path.join(path, sub)
        os.makedirs(path, exist_ok=True)
    return path


def _dump_dir() -> str:
    return scratch_dir("ptx")


def check_target(target: str) -> str:
    if target not in TARGETS:
        raise ValueError(f"target must be one of {', '.join(TARGETS)}; got {target!r}")
    return target


def compile_options(target: str, tvm_ffi: bool = False) -> str:
    """The ``cute.compile`` options string used everywhere in the course."""
    check_target(target)
    return f"--gpu-arch {target} --keep-ptx --dump-dir {_dump_dir()}" + (" --enable-tvm-ffi" if tvm_ffi else "")


def compile_for(target: str, fn, *args, tvm_ffi: bool = False):
    """``cute.compile(fn, *args)`` for ``target``, keeping the PTX (``.__ptx__``).

    ``tvm_ffi``: compile through TVM-FFI (package ``apache-tvm-ffi``), the call path
    of the GEMM plans: the compiled function then takes torch tensors directly and,
    with a :func:`fake_stream` ``(env=True)`` argument, launches on torch's current
    stream without a stream argument. A call costs a few microseconds instead of
    the tens that converting arguments in Python costs (chapter 07 measures both).
    """
    import cutlass.cute as cute

    with COMPILE_LOCK:
        return cute.compile(fn, *args, options=compile_options(target, tvm_ffi))


def ptx_of(compiled) -> str:
    """The PTX text of a function compiled by :func:`compile_for`."""
    ptx = getattr(compiled, "__ptx__", None)
    # The DSL leaves the file's path in __ptx__ when the file was not written.
    if not ptx or not isinstance(ptx, str) or "\n" not in ptx:
        raise RuntimeError("no PTX kept: compile with gemmlab.compile.compile_for")
    return ptx


def ptx_lines(ptx, *patterns: str) -> list[str]:
    """The PTX lines (stripped) matching any of the regular expressions ``patterns``.

    ``ptx`` is PTX text or a compiled function. Registers are renumbered by the
    compiler between versions, so tests match instruction names, not operands.
    """
    if not isinstance(ptx, str):
        ptx = ptx_of(ptx)
    regexes = [re.compile(p) for p in patterns]
    out = []
    for line in ptx.splitlines():
        s = line.strip()
        if s.startswith("//") or not s:
            continue
        if any(r.search(s) for r in regexes):
            out.append(s)
    return out


def ptx_opcodes(ptx, *patterns: str) -> list[str]:
    """Like :func:`ptx_lines` but only the instruction (no operands), de-duplicated in order.

    This is what compile-only cells print: it does not change when the register
    allocator renumbers, so it is identical on every machine.
    """
    seen: dict[str, None] = {}
    for line in ptx_lines(ptx, *patterns):
        op = line.split()[0] if not line.startswith("@") else " ".join(line.split()[:2])
        seen.setdefault(op, None)
    return list(seen)


def ptx_sequence(ptx, *patterns: str) -> list[str]:
    """The instructions matching ``patterns`` in program order, runs of one instruction collapsed (``op x n``).

    Like :func:`ptx_opcodes` (names only, so identical on every machine) but
    keeping order and repeats: it shows *where* a fence or a wait sits
    relative to the stores around it.
    """
    out: list[list] = []
    for line in ptx_lines(ptx, *patterns):
        op = line.split()[0].rstrip(";")
        if out and out[-1][0] == op:
            out[-1][1] += 1
        else:
            out.append([op, 1])
    return [op if n == 1 else f"{op} x {n}" for op, n in out]


def line_index(lines: list[str], pattern: str, start: int = 0) -> int:
    """Index of the first of ``lines`` at or after ``start`` matching ``pattern``; AssertionError if none.

    Tests use it to assert the *order* of instructions in a kernel (a fence
    before the barrier before the store, say).
    """
    for i in range(start, len(lines)):
        if re.search(pattern, lines[i]):
            return i
    raise AssertionError(f"{pattern!r} not found after line {start}")


def ptx_instructions(ptx, pattern: str) -> list[str]:
    """Instruction names matching ``pattern`` anywhere in a line, in order, once each.

    Unlike :func:`ptx_opcodes` this also finds instructions inside inline-asm
    ``{ ... }`` blocks (where our wrappers put probes and spin loops), because
    it matches the name itself rather than a line's first token.
    """
    rx = re.compile(pattern)
    seen: dict[str, None] = {}
    for line in ptx_lines(ptx, pattern):
        for name in rx.findall(line):
            seen.setdefault(name.rstrip(".;"), None)
    return list(seen)


# --------------------------------------------------------------------------------------
# SASS: the machine code ptxas made from the PTX (chapter 01)
# --------------------------------------------------------------------------------------

#: Where ``nvdisasm`` comes from when it is not on ``PATH``: the ``nvidia-cuda-nvdisasm`` wheel of requirements.lock.
NVDISASM_PACKAGE = "nvidia-cuda-nvdisasm"


def cubin_of(compiled) -> bytes:
    """The kernel's machine code (an ELF cubin) from a compiled function, no GPU needed.

    The DSL embeds the fatbin it built with its own ``ptxas`` as the string constant
    ``@kernels_binary`` of ``compiled.ir_module``; the cubin is the ELF inside it.
    """
    import struct

    m = re.search(r'@kernels_binary\("((?:[^"\\]|\\.)*)"', str(compiled.ir_module))
    if m is None:
        raise ValueError("compiled has no @kernels_binary in its IR module (not a compiled CuTe DSL function?)")
    lit, blob, i = m[1], bytearray(), 0
    while i < len(lit):  # MLIR string escapes: \\ and \XX (two hex digits)
        if lit[i] != "\\":
            blob += lit[i].encode("latin-1")
            i += 1
        elif lit[i + 1] == "\\":
            blob.append(0x5C)
            i += 2
        else:
            blob.append(int(lit[i + 1:i + 3], 16))
            i += 3
    blob = bytes(blob)
    k = blob.find(b"\x7fELF")
    if k < 0:
        raise ValueError("the embedded fatbin holds no ELF cubin")
    phoff, shoff = struct.unpack_from("<QQ", blob, k + 0x20)
    phentsize, phnum, shentsize, shnum = struct.unpack_from("<HHHH", blob, k + 0x36)
    return blob[k:k + max(phoff + phentsize * phnum, shoff + shentsize * shnum)]


def nvdisasm_path() -> str:
    """The ``nvdisasm`` executable: on ``PATH``, else the one the ``nvidia-cuda-nvdisasm`` wheel installs."""
    import importlib.util
    import shutil

    found = shutil.which("nvdisasm")
    if found:
        return found
    spec = importlib.util.find_spec("nvidia")
    for root in (spec.submodule_search_locations or []) if spec else []:
        for cand in sorted(__import__("pathlib").Path(root).glob("cu*/bin/nvdisasm")):
            return str(cand)
    raise FileNotFoundError(f"nvdisasm not found: install the {NVDISASM_PACKAGE} wheel (it is in requirements.lock) "
                            f"or put CUDA's nvdisasm on PATH")


def sass_of(compiled) -> str:
    """The SASS of a compiled function, as ``nvdisasm -c`` prints it (no GPU needed)."""
    import subprocess

    with tempfile.TemporaryDirectory(prefix="gemmlab-sass-") as d:
        path = os.path.join(d, "kernel.cubin")
        with open(path, "wb") as f:
            f.write(cubin_of(compiled))
        done = subprocess.run([nvdisasm_path(), "-c", path], capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"nvdisasm failed: {done.stderr.strip()}")
    return done.stdout


def sass_opcodes(compiled, pattern: str = r".") -> list[str]:
    """The SASS instruction names (``LDG.E``, ``IADD3``, ...) matching ``pattern``, in program order.

    Names only, no registers or addresses: what a notebook prints is the same on every machine.
    """
    rx = re.compile(pattern)
    names = []
    for line in sass_of(compiled).splitlines():
        m = re.match(r"\s*/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", line)
        if m and rx.search(m[1]):
            names.append(m[1])
    return names


def fake_tensor(dtype, shape, *, align: int = 16, stride_order=None):
    """A compile-time stand-in for a global tensor (no memory, no GPU needed).

    ``shape`` entries may be ints or ``cute.sym_int()`` for dynamic extents.
    """
    import numbers

    from cutlass.cute.runtime import make_fake_compact_tensor

    # numpy and torch integers are ints here (the DSL takes Python ints or its symbolic ones only).
    shape = tuple(int(e) if isinstance(e, numbers.Integral) and not isinstance(e, bool) else e for e in shape)
    return make_fake_compact_tensor(dtype, shape, assumed_align=align, stride_order=stride_order)


def fake_stream(env: bool = False):
    """A stream argument for compile-only calls (never launched).

    ``env=True`` (with ``tvm_ffi``): the compiled function has no stream parameter
    and launches on the caller's current stream (torch's, when called with torch tensors).
    """
    if env:
        from cutlass.cute.runtime import make_fake_stream

        return make_fake_stream(use_tvm_ffi_env_stream=True)
    import cuda.bindings.driver as cuda

    return cuda.CUstream(0)


def current_stream():
    """torch's current CUDA stream as the ``cuda.CUstream`` CuTe DSL kernels launch on."""
    import cuda.bindings.driver as cuda
    import torch

    return cuda.CUstream(torch.cuda.current_stream().cuda_stream)


def to_cute(t, align: int = 16):
    """A torch tensor as a CuTe DSL tensor (shared memory, no copy)."""
    from cutlass.cute.runtime import from_dlpack

    return from_dlpack(t, assumed_align=align)


_CACHE: dict = {}


def _key_of(arg):
    import torch

    if isinstance(arg, torch.Tensor):
        return ("tensor", arg.dtype, tuple(arg.shape), tuple(arg.stride()), arg.device.type)
    return ("value", type(arg).__name__, arg if isinstance(arg, (int, float, str, bool, tuple)) else id(arg))


def _constexpr_mask(fn, n: int) -> list[bool]:
    """For the first ``n`` parameters of host function ``fn``: is it a ``Constexpr``?"""
    import inspect

    import cutlass

    params = list(inspect.signature(fn).parameters.values())[:n]
    mask = []
    for p in params:
        ann = p.annotation
        name = ann if isinstance(ann, str) else getattr(ann, "__name__", "")
        mask.append(ann is cutlass.Constexpr or str(name).split(".")[-1] == "Constexpr")
    return mask + [False] * (n - len(mask))


def launcher(fn, *args, target: str | None = None, align: int = 16):
    """Compile ``fn`` (a ``@cute.jit`` host function) for ``args`` once; return a launch.

    ``args`` are torch tensors and Python values; the last parameter of ``fn``
    is the stream and is supplied here. Kernels are specialised on static
    shapes (the extents are baked into the code), and compiled functions are
    cached per (function, target, dtypes, shapes, strides, values), so a second
    call with the same configuration does not compile. The returned ``run()``
    launches on torch's current stream with exactly these arguments (converted
    once, so timing loops measure the kernel, not the conversion).
    """
    import torch

    from .tiers import device_target

    target = target or device_target()
    key = (fn, target, align, tuple(_key_of(a) for a in args))
    conv = [to_cute(a, align) if isinstance(a, torch.Tensor) else a for a in args]
    with COMPILE_LOCK:
        compiled = _CACHE.get(key)
        if compiled is None:
            compiled = compile_for(target, fn, *conv, current_stream())
            _CACHE[key] = compiled

    # The compiled function takes only the runtime parameters: Constexpr values
    # are baked into the code, and passing them again would shift the stream
    # into the wrong slot (the DSL reports extra "workspace arguments").
    runtime = [a for a, const in zip(conv, _constexpr_mask(fn, len(conv))) if not const]

    def run():
        compiled(*runtime, current_stream())

    run.compiled = compiled
    return run
