"""`make run`'s runner: skips cells for missing tiers, counts failures, survives bad inputs, prints the table."""
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
    env["PYTHONPATH"] = str(target)
    cmd = [sys.executable, "-m", "gemmlab.course.runner"]
    done = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "no notebooks found" in done.stderr and "pip install ." in done.stderr
    nbformat.write(_nb([("import gemmlab, os; print(os.path.dirname(gemmlab.__file__))", [])]), work / "mine.ipynb")
    done = subprocess.run(cmd + ["mine.ipynb", "--timeout", "120"], cwd=work, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    out = work / "build" / "notebooks" / "mine.ipynb"   # beside the user, not inside site-packages
    assert nbformat.read(out, as_version=4).cells[1].outputs[0]["text"] == f"{target / 'gemmlab'}\n"
