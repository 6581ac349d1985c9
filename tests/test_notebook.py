"""Run All without the tier: the '# tier:' marker, the IPython transformer and the --mark/--check tool."""
import nbformat
import pytest

from gemmlab.course import notebook as gnb


@pytest.fixture
def shell():
    from IPython.core.interactiveshell import InteractiveShell

    sh = InteractiveShell.instance()
    yield sh
    InteractiveShell.clear_instance()


def _run(shell, capsys, src):
    capsys.readouterr()
    result = shell.run_cell(src)
    return result, capsys.readouterr().out


@pytest.mark.parametrize("need,msg", [
    ("sm90", "skipped: needs tier sm90; this machine is tier cpu\n"),
    ("sm100", "skipped: needs tier sm100; this machine is tier cpu\n"),
    ("gpu", "skipped: needs tier sm90 or sm100; this machine is tier cpu\n"),
])
def test_transformer_skips_missing_tier_with_one_line(shell, capsys, monkeypatch, need, msg):
    monkeypatch.delenv("GEMMLAB_TIER", raising=False)
    gnb.setup(shell, have="cpu")
    result, out = _run(shell, capsys, f"# tier: {need}\nimport torch\nraise RuntimeError('launched')\n")
    assert result.success, result.error_in_exec
    assert out == msg


def test_transformer_runs_cells_the_tier_has_and_keeps_last_expression(shell, capsys, monkeypatch):
    monkeypatch.delenv("GEMMLAB_TIER", raising=False)
    gnb.setup(shell, have="sm90")
    result, out = _run(shell, capsys, "# tier: sm90\nx = 20\nx + 22\n")
    assert result.success and result.result == 42   # ran, and the last expression is still displayed
    result, out = _run(shell, capsys, "# tier: gpu\ny = 1\ny\n")
    assert result.result == 1
    result, out = _run(shell, capsys, "# tier: sm100\nz = 1\n")
    assert out == "skipped: needs tier sm100; this machine is tier sm90\n"
    assert "z" not in shell.user_ns                     # the cell's code did not run
    result, out = _run(shell, capsys, "print('untagged')\n")
    assert out == "untagged\n"


def test_transformer_marker_after_cell_magic_and_blank_lines(shell, capsys, monkeypatch):
    monkeypatch.delenv("GEMMLAB_TIER", raising=False)
    gnb.setup(shell, have="cpu")
    _, out = _run(shell, capsys, "%%capture\n# tier: gpu\nprint('no')\n")
    assert out == "skipped: needs tier sm90 or sm100; this machine is tier cpu\n"
    _, out = _run(shell, capsys, "\n\n# tier: sm90\nprint('no')\n")
    assert out.startswith("skipped: needs tier sm90")
    # A marker is only the first line: a later comment is just a comment.
    _, out = _run(shell, capsys, "print('yes')\n# tier: sm90\n")
    assert out == "yes\n"


def test_transformer_rejects_unknown_marker_word(shell, capsys, monkeypatch):
    monkeypatch.delenv("GEMMLAB_TIER", raising=False)
    gnb.setup(shell, have="cpu")
    result, _ = _run(shell, capsys, "# tier: sm09\nprint('x')\n")
    assert isinstance(result.error_in_exec, ValueError)
    assert "must name one of sm100, sm90, gpu" in str(result.error_in_exec)


def test_declared_tier_makes_cells_mandatory(shell, capsys, monkeypatch):
    monkeypatch.setenv("GEMMLAB_TIER", "sm90")
    gnb.setup(shell, have="cpu")   # a GPU machine whose GPU went missing: run, and fail loudly
    result, out = _run(shell, capsys, "# tier: sm90\nraise RuntimeError('launched')\n")
    assert isinstance(result.error_in_exec, RuntimeError)
    result, out = _run(shell, capsys, "# tier: sm100\nprint('x')\n")
    assert out.startswith("skipped: needs tier sm100")


def test_setup_is_idempotent_and_validates(shell, monkeypatch):
    monkeypatch.delenv("GEMMLAB_TIER", raising=False)
    gnb.setup(shell, have="cpu")
    gnb.setup(shell, have="sm90")
    gates = [t for t in shell.input_transformers_cleanup if getattr(t, "_gemmlab_tier_gate", False)]
    assert len(gates) == 1 and shell.input_transformers_cleanup[0] is gates[0]
    with pytest.raises(ValueError, match="have must be one of cpu, sm90, sm100"):
        gnb.setup(shell, have="h100")
    monkeypatch.setenv("GEMMLAB_TIER", "b200")
    with pytest.raises(ValueError, match="GEMMLAB_TIER"):
        gnb.setup(shell, have="cpu")


def test_setup_outside_ipython_does_nothing(monkeypatch):
    monkeypatch.delenv("GEMMLAB_TIER", raising=False)
    assert gnb.setup() is None


def test_cell_marker_and_skip_message():
    assert gnb.cell_marker("# tier: sm90\nx") == "sm90"
    assert gnb.cell_marker("#tier:gpu") == "gpu"
    assert gnb.cell_marker("x = 1\n# tier: sm90") is None
    assert gnb.cell_marker("") is None
    with pytest.raises(ValueError, match="need must be one of"):
        gnb.marker("cpu")


# --- the --mark / --check tool on synthetic notebooks ---------------------------------------------


def _nb(cells):
    nb = nbformat.v4.new_notebook()
    nb.cells.append(nbformat.v4.new_markdown_cell("# title"))
    for src, tags in cells:
        c = nbformat.v4.new_code_cell(src)
        c.metadata["tags"] = list(tags)
        c.outputs = [nbformat.v4.new_output("stream", name="stdout", text="stored\n")]
        nb.cells.append(c)
    return nb


def _write(tmp_path, name, cells):
    p = tmp_path / name
    nbformat.write(_nb(cells), p)
    return p


def _sources(p):
    return [c.source for c in nbformat.read(p, as_version=4).cells if c.cell_type == "code"]


def test_mark_makes_markers_match_tags_and_is_idempotent(tmp_path, capsys):
    p = _write(tmp_path, "a.ipynb", [
        ("import torch", []),
        ("torch.ones(1, device='cuda')", ["gpu", "nbval-ignore-output"]),
        ("# tier: gpu\nrun_blackwell()", ["gpu", "sm100"]),   # wrong tier
        ("# tier: sm90\nprint(1)", []),                        # stray marker
        ("%%time\nwgmma()", ["sm90"]),                          # cell magic stays first
        ("# tier: sm90\nwgmma()", ["gpu", "sm90"]),             # already right
    ])
    assert gnb.main(["--check", str(p)]) == 1
    out = capsys.readouterr().out
    assert "code cell 1 does not call gemmlab.course.notebook.setup()" in out
    assert "code cell 2: tagged gpu but its first line is not '# tier: gpu'" in out
    assert "code cell 3: tagged sm100 but its marker says '# tier: gpu'" in out
    assert "code cell 4: untagged but its first line is a marker ('# tier: sm90')" in out
    assert "code cell 6" not in out

    assert gnb.main(["--mark", str(p)]) == 0
    assert _sources(p) == [
        gnb.SETUP_LINE + "\nimport torch",
        "# tier: gpu\ntorch.ones(1, device='cuda')",
        "# tier: sm100\nrun_blackwell()",
        "print(1)",
        "%%time\n# tier: sm90\nwgmma()",
        "# tier: sm90\nwgmma()",
    ]
    nb = nbformat.read(p, as_version=4)
    assert all(c.outputs[0]["text"] == "stored\n" for c in nb.cells if c.cell_type == "code")  # outputs untouched
    assert nb.cells[2].metadata["tags"] == ["gpu", "nbval-ignore-output"]
    before = p.read_bytes()
    capsys.readouterr()
    assert gnb.main(["--mark", str(p)]) == 0
    assert p.read_bytes() == before                      # idempotent: nothing rewritten
    assert gnb.main(["--check", str(p)]) == 0
    assert "markers agree with tags" in capsys.readouterr().out


def test_mark_inserts_setup_cell_before_a_tagged_first_cell(tmp_path):
    p = _write(tmp_path, "b.ipynb", [("launch()", ["gpu"]), ("print(2)", [])])
    assert gnb.problems(nbformat.read(p, as_version=4))[0].startswith("code cell 1 is tagged")
    gnb.main(["--mark", str(p)])
    nb = nbformat.read(p, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code[0].source == gnb.SETUP_LINE and code[0].metadata.get("tags", []) == []
    assert code[1].source == "# tier: gpu\nlaunch()"
    assert gnb.problems(nb) == []


def test_setup_line_runs_in_a_kernel_shell(shell, capsys, monkeypatch):
    """The inserted line itself registers the transformer (no extra import needed)."""
    monkeypatch.delenv("GEMMLAB_TIER", raising=False)
    monkeypatch.setattr("gemmlab.course.notebook.detect_tier", lambda: "cpu")
    result, out = _run(shell, capsys, gnb.SETUP_LINE + "\n")
    assert result.success and out == ""
    _, out = _run(shell, capsys, "# tier: sm90\nprint('no')\n")
    assert out == "skipped: needs tier sm90; this machine is tier cpu\n"


def test_check_reports_unreadable_notebook(tmp_path, capsys):
    bad = tmp_path / "bad.ipynb"
    bad.write_text("{not json")
    assert gnb.main(["--check", str(bad), str(tmp_path / "missing.ipynb")]) == 1
    out = capsys.readouterr().out
    assert "bad.ipynb: cannot read" in out and "missing.ipynb: cannot read" in out
    assert "2 of 2 notebook(s)" in out


def test_run_all_in_a_real_kernel_goes_past_cells_for_a_missing_tier(tmp_path, monkeypatch):
    """What JupyterLab's Run All and `jupyter nbconvert --execute` do: send every cell, tags unseen."""
    from nbclient import NotebookClient

    from gemmlab.course import runner
    from gemmlab.tiers import detect_tier, tier_satisfies

    monkeypatch.delenv("GEMMLAB_TIER", raising=False)
    p = _write(tmp_path, "c.ipynb", [("x = 1", []), ("print('ran sm100')", ["gpu", "sm100"]), ("print(x + 1)", [])])
    gnb.main(["--mark", str(p)])
    nb = nbformat.read(p, as_version=4)
    for key, value in runner._kernel_env().items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("PYTEST_CURRENT_TEST", raising=False)
    monkeypatch.setenv("JUPYTER_PATH", runner._kernelspec_dir())
    NotebookClient(nb, timeout=120, kernel_name="python3").execute()   # raises on any cell error
    code = [c for c in nb.cells if c.cell_type == "code"]
    have = detect_tier()
    want = "ran sm100\n" if tier_satisfies(have, "sm100") else f"skipped: needs tier sm100; this machine is tier {have}\n"
    assert [o["text"] for o in code[1].outputs] == [want]
    assert code[2].outputs[0]["text"] == "2\n"


def test_setup_line_goes_after_future_imports_and_cell_magics(tmp_path):
    p = _write(tmp_path, "d.ipynb", [("from __future__ import annotations\nimport os", []), ("print(1)", [])])
    gnb.main(["--mark", str(p)])
    assert _sources(p)[0] == f"from __future__ import annotations\n{gnb.SETUP_LINE}\nimport os"
    compile(_sources(p)[0], "cell", "exec")   # still valid Python
    q = _write(tmp_path, "e.ipynb", [("%%capture\nimport os", [])])
    gnb.main(["--mark", str(q)])
    assert _sources(q)[0] == f"%%capture\n{gnb.SETUP_LINE}\nimport os"


def test_outside_a_checkout_the_tool_says_so(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(gnb, "NOTEBOOKS", tmp_path / "nowhere")
    assert gnb.main(["--check"]) == 2
    assert "no notebooks found" in capsys.readouterr().err


# ---------------------------------------------------------------- Run All on a laptop, then Save: the GPU results stay


def _stored_notebook(path, src):
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell(src)
    cell.metadata["tags"] = ["gpu"]
    cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text="H100: 812 TFLOP/s\n"),
                    nbformat.v4.new_output("display_data", data={"text/plain": "<stored figure>"})]
    nb.cells.append(cell)
    nbformat.write(nb, path)
    return nb


def test_a_skipped_cell_shows_its_stored_outputs_again_in_jupyterlab(shell, capsys, monkeypatch, tmp_path):
    src = "# tier: gpu\nprint('launching')\n"
    path = tmp_path / "chapter.ipynb"
    _stored_notebook(path, src)
    monkeypatch.delenv("GEMMLAB_TIER", raising=False)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("JPY_SESSION_NAME", "notebooks/chapter.ipynb")  # relative to the server's root
    gnb.setup(shell, have="cpu")
    result, out = _run(shell, capsys, src)
    assert result.success, result.error_in_exec
    assert out.startswith("skipped: needs tier sm90 or sm100; this machine is tier cpu\n" + gnb.STORED_NOTE + "\n")
    assert "H100: 812 TFLOP/s\n" in out and "<stored figure>" in out and "launching" not in out


def test_stored_outputs_do_not_pile_up_over_saves(tmp_path):
    src = "# tier: gpu\nprint('launching')\n"
    path = tmp_path / "chapter.ipynb"
    nb = _stored_notebook(path, src)
    # What the frontend saved after one Run All: our two lines merged with the stored stream, then the rest.
    cell = nb.cells[0]
    cell.outputs[0]["text"] = ("skipped: needs tier sm90 or sm100; this machine is tier cpu\n" + gnb.STORED_NOTE + "\n"
                               + cell.outputs[0]["text"])
    nbformat.write(nb, path)
    outs = gnb.stored_outputs(src, path)
    assert [o["output_type"] for o in outs] == ["stream", "display_data"]
    assert outs[0]["text"] == "H100: 812 TFLOP/s\n"
    assert gnb.stored_outputs("# tier: gpu\nprint('edited')\n", path) == []


def test_without_a_frontend_a_skipped_cell_prints_one_line(shell, capsys, monkeypatch, tmp_path):
    src = "# tier: sm90\nprint('launching')\n"
    _stored_notebook(tmp_path / "chapter.ipynb", src)
    monkeypatch.delenv("GEMMLAB_TIER", raising=False)
    monkeypatch.delenv("JPY_SESSION_NAME", raising=False)  # nbconvert, nbclient, the runner
    monkeypatch.chdir(tmp_path)
    gnb.setup(shell, have="cpu")
    _, out = _run(shell, capsys, src)
    assert out == "skipped: needs tier sm90; this machine is tier cpu\n"
    monkeypatch.setenv("JPY_SESSION_NAME", "missing.ipynb")
    _, out = _run(shell, capsys, src)
    assert out == "skipped: needs tier sm90; this machine is tier cpu\n"
