"""Side by side: threads compiling at once, processes compiling and running the runner at once, temp folders.

Each scenario runs in subprocesses, so a crash (the DSL aborts the process when two threads compile
at once without :data:`gemmlab.compile.COMPILE_LOCK`) fails the test instead of killing pytest.
"""
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import nbformat
import pytest

LIB = str(Path(__file__).resolve().parents[1] / "lib")

#: Three threads, each compiling three chapter 01 copy kernels of its own width (nine configurations).
THREADS = textwrap.dedent("""
    import sys, threading
    from gemmlab import compile as gc
    from gemmlab.ldst import compile_copy
    errors, ptx = [], {}
    def work(width):
        try:
            for unroll in (1, 2, 4):
                ptx[(width, unroll)] = gc.ptx_opcodes(compile_copy("sm_90a", width=width, unroll=unroll), r"ld\\.global")
        except BaseException as exc:
            errors.append(repr(exc))
    threads = [threading.Thread(target=work, args=(w,)) for w in (1, 2, 4)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    print("errors", errors)
    print("configs", len(ptx))
    print("scratch", gc.scratch_dir())
""")


def _env(**extra):
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"}
    env["PYTHONPATH"] = LIB + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("MPLBACKEND", "Agg")
    env.update(extra)
    return env


def _lines(text, key):
    return [line.split(" ", 1)[1] for line in text.splitlines() if line.startswith(key + " ")]


def test_threads_compiling_different_configs_at_once_do_not_crash(tmp_path):
    done = subprocess.run([sys.executable, "-c", THREADS], env=_env(), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr[-2000:]
    assert _lines(done.stdout, "errors") == ["[]"] and _lines(done.stdout, "configs") == ["9"]
    assert not os.path.exists(_lines(done.stdout, "scratch")[0])  # removed at exit


def _notebook(path: Path, width: int):
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells.append(nbformat.v4.new_code_cell(
        "from gemmlab.compile import ptx_opcodes\nfrom gemmlab.ldst import compile_copy\n"
        f"print(ptx_opcodes(compile_copy('sm_90a', width={width}), r'ld\\.global'))"))
    nbformat.write(nb, path)


def test_runners_and_compiles_side_by_side(tmp_path):
    """Two runners on the same notebooks (their own --out) and a threaded compile, all at once."""
    nbs = []
    for w in (1, 4):
        _notebook(tmp_path / f"w{w}.ipynb", w)
        nbs.append(str(tmp_path / f"w{w}.ipynb"))
    cmd = [sys.executable, "-m", "gemmlab.course.runner", *nbs, "--timeout", "300"]
    procs = [subprocess.Popen(cmd + ["--out", str(tmp_path / f"out{i}")], env=_env(), cwd=tmp_path,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(2)]
    procs.append(subprocess.Popen([sys.executable, "-c", THREADS], env=_env(), stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True))
    outs = [p.communicate(timeout=600) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, out + err[-2000:]
    assert _lines(outs[2][0], "errors") == ["[]"]
    for i in range(2):
        for w in (1, 4):
            text = nbformat.read(tmp_path / f"out{i}" / f"w{w}.ipynb", as_version=4).cells[0].outputs[0]["text"]
            assert "ld.global" in text and ("ld.global.v4.u32" in text) == (w == 4), text
    for name in ("w1.ipynb", "w4.ipynb"):  # the inputs were never written
        assert not nbformat.read(tmp_path / name, as_version=4).cells[0].outputs


def test_scratch_folders_are_removed_at_exit_and_after_a_kill(tmp_path):
    import tempfile

    from gemmlab import compile as gc

    code = ("import sys, time\nfrom gemmlab.compile import scratch_dir\n"
            "print(scratch_dir('ptx'), flush=True)\nif sys.argv[1] == 'hang': time.sleep(600)\n")
    done = subprocess.run([sys.executable, "-c", code, "exit"], env=_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and not os.path.exists(done.stdout.strip())
    # Killed: its folder stays until the next process that makes one sweeps it.
    p = subprocess.Popen([sys.executable, "-c", code, "hang"], env=_env(), stdout=subprocess.PIPE, text=True)
    left = Path(p.stdout.readline().strip()).parent
    p.kill()
    p.wait()
    assert left.is_dir() and left.name.startswith(f"gemmlab-{p.pid}-")
    assert str(left) in gc.sweep_stale_scratch(tempfile.gettempdir())
    assert not left.exists()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_leaves_the_parents_scratch_folder_alone(tmp_path):
    code = textwrap.dedent("""
        import os, sys
        from gemmlab.compile import scratch_dir
        mine = scratch_dir()
        pid = os.fork()
        if pid == 0:
            child = scratch_dir()
            print("child", child, flush=True)
            sys.exit(0)  # runs atexit: must remove the child's folder only
        os.waitpid(pid, 0)
        print("parent", mine, os.path.isdir(mine), flush=True)
    """)
    done = subprocess.run([sys.executable, "-c", code], env=_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    parent = _lines(done.stdout, "parent")[0].split()
    child = _lines(done.stdout, "child")[0]
    assert parent[1] == "True" and child != parent[0] and not os.path.exists(child)
