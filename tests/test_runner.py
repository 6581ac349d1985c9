"""`make run`'s runner: skips cells for missing tiers, counts failures, prints the table."""
import nbformat
import pytest

from gemmlab import runner


def _nb(cells):
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    for src, tags in cells:
        c = nbformat.v4.new_code_cell(src)
        c.metadata["tags"] = list(tags)
        nb.cells.append(c)
    return nb


def test_runner_skips_missing_tier_and_counts_failures(tmp_path):
    path = tmp_path / "demo.ipynb"
    nbformat.write(_nb([
        ("x = 1\nprint(x + 1)", []),
        ("import torch; torch.ones(1, device='cuda')", ["gpu"]),
        ("print('blackwell')", ["gpu", "sm100"]),
        ("raise RuntimeError('boom')", []),
    ]), path)
    out = tmp_path / "out.ipynb"
    row = runner.run_notebook(path, out, have="cpu", timeout=120)
    assert row["run"] == 2 and row["skipped"] == 2
    assert row["skipped_tiers"] == "gpu,sm100"
    assert row["failures"] == 1
    assert row["errors"] == ["cell 3: RuntimeError: boom"]
    done = nbformat.read(out, as_version=4)
    assert done.cells[0].outputs[0]["text"] == "2\n"
    assert done.cells[1].outputs == []          # skipped, not executed
    assert done.cells[1].metadata["tags"] == ["gpu"]  # our skip mark is removed again
    assert done.cells[3].outputs[0]["output_type"] == "error"
    table = runner.format_report([row], "cpu")
    assert "tier of this machine: cpu" in table and "demo" in table


@pytest.mark.parametrize("tags,need", [([], None), (["gpu"], "gpu"), (["gpu", "sm100"], "sm100"), (["sm90"], "sm90")])
def test_needed_tier(tags, need):
    assert runner.needed_tier(tags) == need
