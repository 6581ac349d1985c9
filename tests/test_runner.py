"""`make run`'s runner: skips cells for missing tiers, counts failures, survives bad inputs, prints the table."""
import os
from pathlib import Path

import nbformat
import pytest

from gemmlab.course import runner


def _nb(cells):
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells.append(nbformat.v4.new_markdown_cell("# a title, so code cell numbers differ from cell indices"))
    for src, tags in cells:
        c = nbformat.v4.new_code_cell(src)
        c.metadata["tags"] = list(tags)
        nb.cells.append(c)
    return nb


def _stored(nb, index, text):
    nb.cells[index].outputs = [nbformat.v4.new_output("stream", name="stdout", text=text)]
    nb.cells[index].execution_count = 7
    return nb


DEMO = [
    ("x = 1\nprint(x + 1)", []),
    ("import torch; torch.ones(1, device='cuda')", ["gpu"]),
    ("print('blackwell')", ["gpu", "sm100"]),
    ("raise RuntimeError('boom')", []),
]


def test_runner_skips_missing_tier_and_counts_failures(tmp_path):
    path = tmp_path / "demo.ipynb"
    nbformat.write(_stored(_nb(DEMO), 2, "stored GPU result\n"), path)
    out = tmp_path / "out.ipynb"
    row = runner.run_notebook(path, out, have="cpu", timeout=120)
    assert row["run"] == 2 and row["skipped"] == 2
    assert row["skipped_tiers"] == "gpu,sm100"
    assert row["failures"] == 1
    assert row["errors"] == ["code cell 4: RuntimeError: boom"]   # counts code cells, from 1
    done = nbformat.read(out, as_version=4)
    assert done.cells[1].outputs[0]["text"] == "2\n"
    # A skipped cell says so instead of showing a stale result of another machine.
    assert [o["text"] for o in done.cells[2].outputs] == ["skipped: needs tier sm90 or sm100; this machine is tier cpu\n"]
    assert done.cells[2].execution_count is None
    assert [o["text"] for o in done.cells[3].outputs] == ["skipped: needs tier sm100; this machine is tier cpu\n"]
    assert done.cells[2].metadata["tags"] == ["gpu"]  # our skip mark is removed again
    assert done.cells[4].outputs[0]["output_type"] == "error"
    table = runner.format_report([row], "cpu")
    assert "tier of this machine: cpu" in table and "demo" in table
    assert table.splitlines()[-1].startswith("total: 1 notebook(s), 2 code cells run, 2 skipped, 1 failure(s)")


def test_inplace_keeps_stored_outputs_of_skipped_cells(tmp_path):
    path = tmp_path / "demo.ipynb"
    nbformat.write(_stored(_nb(DEMO[:2]), 2, "stored GPU result\n"), path)
    row = runner.run_notebook(path, path, have="cpu", timeout=120, keep_skipped_outputs=True)
    assert row["failures"] == 0
    done = nbformat.read(path, as_version=4)
    assert done.cells[2].outputs[0]["text"] == "stored GPU result\n" and done.cells[2].execution_count == 7


def test_bad_inputs_and_timeouts_are_failed_rows_and_the_run_goes_on(tmp_path, capsys):
    bad = tmp_path / "bad.ipynb"
    bad.write_text("{this is not json")
    slow = tmp_path / "slow.ipynb"
    nbformat.write(_nb([("print('first')", []), ("import time; time.sleep(30)", []), ("print('never')", [])]), slow)
    good = tmp_path / "good.ipynb"
    nbformat.write(_nb([("print('ok')", [])]), good)
    out = tmp_path / "out"
    rc = runner.main([str(bad), str(tmp_path / "missing.ipynb"), str(slow), str(good), "--out", str(out), "--timeout", "3"])
    text = capsys.readouterr().out
    assert rc == 1
    assert "FAILED cannot read" in text and "bad.ipynb" in text
    assert "FAILED no such notebook" in text
    assert "FAILED code cell 2: timed out after 3 s (--timeout)" in text
    rows = [line.split() for line in text.splitlines() if line.split()[:1] in (["bad"], ["missing"], ["slow"], ["good"])]
    assert [(r[0], r[-2]) for r in rows] == [("bad", "1"), ("missing", "1"), ("slow", "1"), ("good", "0")]
    assert nbformat.read(out / "good.ipynb", as_version=4).cells[1].outputs[0]["text"] == "ok\n"
    assert f"executed notebooks written to {out}/" in text
    assert text.splitlines()[-1].startswith("total: 4 notebook(s)") and "3 failure(s) in 3 notebook(s)" in text


def test_same_name_from_two_folders_does_not_overwrite(tmp_path, capsys):
    a, b = tmp_path / "one" / "x.ipynb", tmp_path / "two" / "x.ipynb"
    c = tmp_path / "one" / "y.ipynb"
    outs = runner.output_paths([a, b, c], tmp_path / "build")
    assert outs == [tmp_path / "build" / "one" / "x.ipynb", tmp_path / "build" / "two" / "x.ipynb",
                    tmp_path / "build" / "y.ipynb"]
    assert len(set(outs)) == 3
    for p, text in ((a, "from one"), (b, "from two")):
        p.parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(_nb([(f"print({text!r})", [])]), p)
    assert runner.main([str(a), str(b), "--out", str(tmp_path / "build")]) == 0
    last = capsys.readouterr().out.splitlines()[-1]
    assert last.startswith("total: 2 notebook(s), 2 code cells run, 0 skipped, no failures")
    for p, text in ((outs[0], "from one\n"), (outs[1], "from two\n")):
        assert nbformat.read(p, as_version=4).cells[1].outputs[0]["text"] == text


@pytest.mark.parametrize("value,msg", [("0", "at least 1 second"), ("-5", "at least 1 second"), ("ten", "whole number")])
def test_timeout_must_be_positive(capsys, value, msg):
    with pytest.raises(SystemExit) as e:
        runner.main(["--timeout", value, "x.ipynb"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "--timeout" in err and msg in err


def test_outside_a_checkout_the_runner_says_so(tmp_path, monkeypatch, capsys):
    """A `pip install .` copy finds no notebooks next to itself: a clear error, not an empty table."""
    monkeypatch.setattr(runner.notebook, "NOTEBOOKS", tmp_path / "site-packages" / "notebooks")
    assert runner.main([]) == 2
    err = capsys.readouterr().err
    assert "no notebooks found" in err and "pass the notebook paths" in err
    (tmp_path / "site-packages" / "notebooks").mkdir(parents=True)   # present but empty: the same
    assert runner.main([]) == 2
    with pytest.raises(runner.NoNotebooks):
        runner.default_notebooks()


def test_the_repository_notebooks_are_found():
    names = [p.name for p in runner.default_notebooks()]
    assert "00_welcome.ipynb" in names and names == sorted(names)


@pytest.mark.parametrize("tags,need", [([], None), (["gpu"], "gpu"), (["gpu", "sm100"], "sm100"), (["sm90"], "sm90")])
def test_needed_tier(tags, need):
    assert runner.needed_tier(tags) == need


def test_a_non_editable_install_fails_clearly_and_runs_given_notebooks(tmp_path):
    """`pip install .` (no deps, no build isolation: offline) into a folder, run from elsewhere."""
    import os
    import shutil
    import subprocess
    import sys

    root = runner.REPO_ROOT
    src = tmp_path / "src"
    shutil.copytree(root / "lib" / "gemmlab", src / "lib" / "gemmlab", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(root / name, src / name)
    target = tmp_path / "site"
    pip = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                          "--disable-pip-version-check", "--target", str(target), str(src)],
                         capture_output=True, text=True)
    if pip.returncode:
        pytest.skip(f"pip could not build the package here: {pip.stderr.strip()[-300:]}")
    work = tmp_path / "work"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTEST_CURRENT_TEST")}
    # The interpreter's other paths stay (where a GPU machine's nbformat may come from); the checkout's lib/ goes.
    keep = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
            if p and os.path.realpath(p) != os.path.realpath(root / "lib")]
    env["PYTHONPATH"] = os.pathsep.join([str(target), *keep])
    cmd = [sys.executable, "-m", "gemmlab.course.runner"]
    done = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True)
    assert done.returncode == 2, done.stdout + done.stderr
    if "gemmlab[notebooks]" in done.stderr:  # this interpreter lacks the notebook stack: said in one line
        assert "running notebooks needs" in done.stderr and "Traceback" not in done.stderr
        return
    assert "no notebooks found" in done.stderr and "pip install ." in done.stderr
    files_before = sorted(p for p in target.rglob("*") if "__pycache__" not in p.parts)
    nbformat.write(_nb([("import gemmlab, os; print(os.path.dirname(gemmlab.__file__))", []),
                        ("from gemmlab.figures import new_figure, save\nfig, ax = new_figure()\n"
                         "print(save(fig, 'mine').relative_to(os.getcwd()))", [])]), work / "mine.ipynb")
    done = subprocess.run(cmd + ["mine.ipynb", "--timeout", "120"], cwd=work, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    out = work / "build" / "notebooks" / "mine.ipynb"   # beside the user, not inside site-packages
    cells = nbformat.read(out, as_version=4).cells
    assert cells[1].outputs[0]["text"] == f"{target / 'gemmlab'}\n"
    assert cells[2].outputs[0]["text"] == "figures/mine.png\n" and (work / "figures" / "mine.png").is_file()
    assert sorted(p for p in target.rglob("*") if "__pycache__" not in p.parts) == files_before  # nothing written there


def test_the_runner_names_the_missing_notebooks_extra(tmp_path):
    """Without nbformat (simulated: a package of that name that fails to import) the runner exits 2 and says
    which packages and which extra, instead of a ModuleNotFoundError from deep inside."""
    import os
    import subprocess
    import sys

    fake = tmp_path / "fake" / "nbformat"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('simulated: nbformat is not installed')\n")
    nb = tmp_path / "mine.ipynb"
    nbformat.write(_nb([("print(1)", [])]), nb)
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path / "fake"), str(runner.REPO_ROOT / "lib")])
    done = subprocess.run([sys.executable, "-m", "gemmlab.course.runner", str(nb)], cwd=tmp_path, env=env,
                          capture_output=True, text=True)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "needs nbformat" in done.stderr and "notebooks extra" in done.stderr
    assert "Traceback" not in done.stderr
    assert runner.missing_notebook_modules() is None  # here, with the lock installed, nothing is missing


# ---------------------------------------------------------------- never a lost notebook (issue: the runner under misuse)


def test_out_equal_to_an_inputs_folder_is_refused_and_the_input_kept(tmp_path, capsys):
    path = tmp_path / "demo.ipynb"
    nbformat.write(_stored(_nb(DEMO[:2]), 2, "stored GPU result\n"), path)
    before = path.read_bytes()
    for out in (tmp_path, tmp_path / "." / "sub" / ".."):
        assert runner.main([str(path), "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert "would be written over the input" in err and "--inplace" in err
    link = tmp_path / "link"
    link.symlink_to(tmp_path, target_is_directory=True)
    assert runner.main([str(path), "--out", str(link)]) == 2
    assert path.read_bytes() == before


def test_two_inputs_that_would_share_an_output_are_refused():
    a, b = Path("/x/one/n.ipynb"), Path("/x/two/n.ipynb")
    assert runner.check_outputs([a, b], [Path("/o/n.ipynb"), Path("/o/N.ipynb")]) is None
    assert "would both be written to" in runner.check_outputs([a, b], [Path("/o/n.ipynb"), Path("/o/./n.ipynb")])


def test_the_same_file_under_two_names_runs_once(tmp_path, capsys):
    path = tmp_path / "one" / "x.ipynb"
    path.parent.mkdir()
    nbformat.write(_nb([("print('once')", [])]), path)
    (tmp_path / "alias").symlink_to(tmp_path / "one", target_is_directory=True)
    assert runner.main([str(path), str(tmp_path / "alias" / "x.ipynb"), "--out", str(tmp_path / "out")]) == 0
    assert capsys.readouterr().out.splitlines()[-1].startswith("total: 1 notebook(s)")


def test_a_failed_write_is_a_failure_and_not_reported_as_written(tmp_path, capsys):
    path = tmp_path / "demo.ipynb"
    nbformat.write(_nb([("print(1)", [])]), path)
    out = tmp_path / "out"
    (out / "demo.ipynb").mkdir(parents=True)  # a folder where the file should go
    assert runner.main([str(path), "--out", str(out)]) == 1
    text = capsys.readouterr().out
    assert "FAILED cannot write" in text and "not written: demo" in text and "written to" not in text
    assert not [p for p in out.iterdir() if p.name.endswith(".tmp")]


@pytest.mark.parametrize("tags", ["gpu", None, [1], {"a": 1}])
def test_tags_that_are_not_a_list_fail_that_notebook_only(tmp_path, capsys, tags):
    bad = _nb([("print('never')", []), ("print('gpu?')", ["gpu"])])
    bad.cells[2].metadata["tags"] = tags
    nbformat.write(bad, tmp_path / "bad.ipynb")
    nbformat.write(_nb([("print('ok')", [])]), tmp_path / "good.ipynb")
    rc = runner.main([str(tmp_path / "bad.ipynb"), str(tmp_path / "good.ipynb"), "--out", str(tmp_path / "out")])
    text = capsys.readouterr().out
    assert rc == 1 and f"FAILED code cell 2: metadata.tags must be a list of strings; got {tags!r}" in text
    assert "1 failure(s) in 1 notebook(s)" in text
    assert nbformat.read(tmp_path / "out" / "good.ipynb", as_version=4).cells[1].outputs[0]["text"] == "ok\n"


def test_a_skipped_cells_stored_error_is_not_a_failure_of_this_run(tmp_path):
    path = tmp_path / "demo.ipynb"
    nb = _nb([("print(1)", []), ("raise RuntimeError('on the GPU machine')", ["gpu"])])
    nb.cells[2].outputs = [nbformat.v4.new_output("error", ename="RuntimeError", evalue="on the GPU machine",
                                                  traceback=[])]
    nbformat.write(nb, path)
    for keep in (True, False):
        row = runner.run_notebook(path, tmp_path / f"out{keep}.ipynb", have="cpu", timeout=120,
                                  keep_skipped_outputs=keep)
        assert row["failures"] == 0 and row["errors"] == [], row


def test_the_notebook_stack_missing_is_one_clear_line(monkeypatch, capsys):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "nbformat" else real(name, *a))
    assert runner.main(["x.ipynb"]) == 2
    err = capsys.readouterr().err
    assert "needs nbformat" in err and "gemmlab[notebooks]" in err
    from gemmlab.course import notebook

    assert notebook.main(["--check", "x.ipynb"]) == 2
    assert "gemmlab[notebooks]" in capsys.readouterr().err


def _slow_pair(tmp_path):
    slow = tmp_path / "slow.ipynb"
    nbformat.write(_stored(_nb([("print('started', flush=True)", []), ("import time; time.sleep(120)", []),
                                ("print('never')", [])]), 3, "stored\n"), slow)
    after = tmp_path / "after.ipynb"
    nbformat.write(_nb([("print('after')", [])]), after)
    return slow, after


@pytest.mark.parametrize("sig,rc", [("SIGINT", 130), ("SIGTERM", 143)])
@pytest.mark.parametrize("inplace", [False, True])
def test_a_signal_stops_the_whole_run(tmp_path, sig, rc, inplace):
    import os
    import signal
    import subprocess
    import sys
    import time

    slow, after = _slow_pair(tmp_path)
    before = slow.read_bytes()
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"}
    env["PYTHONPATH"] = str(runner.REPO_ROOT / "lib") + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    where = ["--inplace"] if inplace else ["--out", str(tmp_path / "out")]
    p = subprocess.Popen([sys.executable, "-m", "gemmlab.course.runner", str(slow), str(after), *where, "--timeout", "300"],
                         env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    t0 = time.time()
    time.sleep(8)  # the kernel is up and in the sleep
    p.send_signal(getattr(signal, sig))
    out, err = p.communicate(timeout=120)
    assert p.returncode == rc, out + err
    assert time.time() - t0 < 60  # not the 120 s of the cell
    assert "running after.ipynb" not in out and "interrupted" in out and f"by {sig}: 1 notebook(s) not run" in err
    assert "Task exception was never retrieved" not in err
    if inplace:
        assert slow.read_bytes() == before  # a half-run notebook is never written over its input
    else:
        assert not (tmp_path / "out" / "after.ipynb").exists()


def test_no_leftovers_and_no_tcp_warnings(tmp_path):
    import subprocess
    import sys
    import tempfile

    nbformat.write(_nb([("print('ok')", [])]), tmp_path / "a.ipynb")
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"}
    env["PYTHONPATH"] = str(runner.REPO_ROOT / "lib") + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    p = subprocess.Popen([sys.executable, "-m", "gemmlab.course.runner", "a.ipynb", "--out", "out"], cwd=tmp_path, env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = p.communicate(timeout=300)
    assert p.returncode == 0, out + err
    assert "without encryption" not in err  # was 1 warning per kernel started (12 per make run)
    assert not [n for n in os.listdir(tempfile.gettempdir()) if n.startswith(f"gemmlab-{p.pid}-")]


@pytest.mark.parametrize("tags", ["gpu", None])
def test_notebook_check_and_mark_name_tags_that_are_not_a_list(tmp_path, capsys, tags):
    from gemmlab.course import notebook

    nb = _nb([("import gemmlab.course.notebook; gemmlab.course.notebook.setup()", []), ("# tier: gpu\nprint(1)", ["gpu"])])
    nb.cells[2].metadata["tags"] = tags
    nbformat.write(nb, tmp_path / "bad.ipynb")
    before = (tmp_path / "bad.ipynb").read_bytes()
    for mode in ("--check", "--mark"):
        assert notebook.main([mode, str(tmp_path / "bad.ipynb")]) == 1
        assert f"code cell 2: metadata.tags must be a list of strings; got {tags!r}" in capsys.readouterr().out
    assert (tmp_path / "bad.ipynb").read_bytes() == before


def test_figures_are_replaced_whole_never_seen_half_written(tmp_path, monkeypatch):
    """A reader polling the PNG while it is saved again and again only ever sees a whole file."""
    import threading

    from gemmlab import figures

    monkeypatch.setattr(figures, "FIGURES_DIR", tmp_path)
    fig, ax = figures.new_figure()
    ax.plot(range(1000))
    path = figures.save(fig, "torn")
    whole = path.read_bytes()
    assert whole.endswith(b"IEND\xaeB`\x82")
    stop, seen = threading.Event(), []

    def reader():
        while not stop.is_set():
            data = path.read_bytes()
            seen.append(data.startswith(b"\x89PNG") and data.endswith(b"IEND\xaeB`\x82"))

    t = threading.Thread(target=reader)
    t.start()
    for _ in range(15):
        fig, ax = figures.new_figure()
        ax.plot(range(1000))
        figures.save(fig, "torn")
    stop.set()
    t.join()
    assert seen and all(seen)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["torn.png"]  # no temporary file left


def test_a_library_figure_leaves_the_notebooks_own_backend_alone():
    """``make lab`` kernels keep the inline backend: drawing a gemmlab figure must not switch it to Agg."""
    import subprocess
    import sys

    code = ("import matplotlib; matplotlib.use('svg')\n"
            "from gemmlab.figures import new_figure\n"
            "fig, axes = new_figure(1, 2, figsize=(4, 2), sharey=True)\n"
            "axes[0].plot([1, 2])\n"
            "import matplotlib.pyplot as plt\n"
            "print(matplotlib.get_backend(), len(axes), fig.get_size_inches().tolist(), plt.get_fignums())\n")
    env = {k: v for k, v in os.environ.items() if k not in ("MPLBACKEND", "PYTEST_CURRENT_TEST")}
    env["PYTHONPATH"] = str(runner.REPO_ROOT / "lib")
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["svg", "2", "[4.0,", "2.0]", "[]"]


def test_make_lab_takes_agg_out_of_the_kernels_environment_and_make_test_checks_the_stack():
    text = (runner.REPO_ROOT / "Makefile").read_text()
    lab = text[text.index("\nlab:"):text.index("\n\n", text.index("\nlab:"))]
    assert "env -u MPLBACKEND" in lab
    test = text[text.index("\ntest:"):text.index("\n\n", text.index("\ntest:"))]
    assert "STACK_GUARD" in test and "pytest, hypothesis" in text
