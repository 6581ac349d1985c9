"""Compile-only helpers: explicit targets, PTX kept, opcodes extracted."""
import cutlass
import cutlass.cute as cute
import cuda.bindings.driver as cuda
import pytest

from gemmlab.compile import (compile_for, fake_stream, fake_tensor, line_index, ptx_instructions, ptx_lines, ptx_of,
                             ptx_opcodes, ptx_sequence)


@cute.kernel
def _add_one(src: cute.Tensor, dst: cute.Tensor):
    tidx, _, _ = cute.arch.thread_idx()
    dst[tidx] = src[tidx] + cutlass.Float32(1.0)


@cute.jit
def _host(src: cute.Tensor, dst: cute.Tensor, stream: cuda.CUstream):
    _add_one(src, dst).launch(grid=(1, 1, 1), block=(128, 1, 1), stream=stream)


@pytest.mark.parametrize("target", ["sm_90a", "sm_100a"])
def test_compile_for_names_the_target(target):
    c = compile_for(target, _host, fake_tensor(cutlass.Float32, (128,)), fake_tensor(cutlass.Float32, (128,)), fake_stream())
    assert ptx_lines(c, r"^\.target") == [f".target {target}"]
    assert "add.f32" in ptx_opcodes(c, r"^add\.")
    assert ptx_opcodes(c, r"ld\.global") == ["ld.global.b32"]  # the DSL loads raw 32-bit words


def test_ptx_lines_skips_comments_and_matches_any_pattern():
    ptx = "// ld.global.f32 in a comment\n\tld.global.f32 %f1, [%rd1];\n\tst.global.f32 [%rd2], %f1;\n"
    assert ptx_lines(ptx, r"ld\.global") == ["ld.global.f32 %f1, [%rd1];"]
    assert len(ptx_lines(ptx, r"ld\.", r"st\.")) == 2
    assert ptx_opcodes("@%p1 bra $L1;\n", r"bra") == ["@%p1 bra"]


def test_compile_for_rejects_unknown_target():
    with pytest.raises(ValueError, match="target must be one of"):
        compile_for("sm_80", _host)


def test_ptx_sequence_keeps_order_and_collapses_runs():
    ptx = "st.shared.u32 [%r1], %r2;\nst.shared.u32 [%r3], %r4;\nfence.proxy.async.shared::cta;\nbar.sync 0;\n"
    assert ptx_sequence(ptx, r"^st\.", r"^fence", r"^bar") == [
        "st.shared.u32 x 2", "fence.proxy.async.shared::cta", "bar.sync"]


def test_ptx_instructions_looks_inside_inline_asm_blocks():
    ptx = "{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%r1], 0; }\nmbarrier.arrive.shared::cta.b64 _, [%r1];\n"
    assert ptx_opcodes(ptx, r"mbarrier") == ["{", "mbarrier.arrive.shared::cta.b64"]
    assert ptx_instructions(ptx, r"mbarrier[\w.:]*") == [
        "mbarrier.try_wait.parity.shared::cta.b64", "mbarrier.arrive.shared::cta.b64"]


def test_line_index_finds_in_order():
    lines = ["st.shared.u32 a", "fence.proxy.async", "bar.sync 0", "fence.proxy.async"]
    assert line_index(lines, r"^fence") == 1
    assert line_index(lines, r"^fence", 2) == 3
    with pytest.raises(AssertionError, match="not found after line 2"):
        line_index(lines, r"^st\.", 2)


_RACE = '''
import struct, sys
import cutlass
import cutlass.cute as cute
import cuda.bindings.driver as cuda
from gemmlab.compile import compile_for, fake_stream, fake_tensor

VALUE = float(sys.argv[1])

@cute.kernel
def _scale(src: cute.Tensor, dst: cute.Tensor):
    tidx, _, _ = cute.arch.thread_idx()
    dst[tidx] = src[tidx] * cutlass.Float32(VALUE)

@cute.jit
def host(src: cute.Tensor, dst: cute.Tensor, stream: cuda.CUstream):
    _scale(src, dst).launch(grid=(1, 1, 1), block=(128, 1, 1), stream=stream)

mine = "0f%08X" % struct.unpack("<I", struct.pack("<f", VALUE))[0]
foreign = 0
for _ in range(12):
    c = compile_for("sm_90a", host, fake_tensor(cutlass.Float32, (128,)), fake_tensor(cutlass.Float32, (128,)), fake_stream())
    foreign += mine not in c.__ptx__
print(f"{mine} foreign={foreign}")
'''


def test_two_processes_compiling_the_same_signature_read_their_own_ptx(tmp_path):
    """The DSL names kept PTX after the argument types only: each process needs its own directory.

    Both processes compile a kernel of the same name and signature (so the same PTX file
    name) whose constant differs, at the same time; each must read its own constant.
    With one shared directory this read the other's PTX in about a quarter of the rounds.
    """
    import os
    import subprocess
    import sys

    script = tmp_path / "race.py"
    script.write_text(_RACE)
    import gemmlab

    env = dict(os.environ)
    lib = os.path.dirname(os.path.dirname(gemmlab.__file__))
    env["PYTHONPATH"] = lib + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    procs = [subprocess.Popen([sys.executable, str(script), v], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=env) for v in ("3.0", "5.0")]
    outs = [p.communicate(timeout=300) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err[-2000:]
    assert sorted(o.strip() for o, _ in outs) == ["0f40400000 foreign=0", "0f40A00000 foreign=0"]


def test_ptx_of_refuses_a_function_without_kept_ptx():
    class NoPtx:
        __ptx__ = "/tmp/x.ptx"   # what the DSL leaves when the file was never written

    with pytest.raises(RuntimeError, match="no PTX kept"):
        ptx_of(NoPtx())
    with pytest.raises(RuntimeError, match="no PTX kept"):
        ptx_of(object())
