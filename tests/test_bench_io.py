"""Benchmark results files: one writer for every benchmark, into results/<device>/ or a run's --out folder."""
import json
import pytest

from gemmlab.measure import bench, copybench


def test_write_doc_into_out_dir_keeps_rows_and_metadata(tmp_path):
    path = bench.write_doc("probe", {"rows": [{"x": 1}, {"x": 2}], "summary": {"geomean": 1.5}}, tmp_path / "out")
    assert path == tmp_path / "out" / "probe.json"
    doc = json.loads(path.read_text())
    assert doc["rows"] == [{"x": 1}, {"x": 2}] and doc["summary"] == {"geomean": 1.5}
    assert doc["benchmark"] == "probe" and doc["device"] == bench.device_name() and "date" in doc


def test_write_doc_does_not_consume_the_callers_dict(tmp_path):
    doc = {"rows": [{"x": 1}], "note": "n"}
    bench.write_doc("probe", doc, tmp_path)
    assert doc == {"rows": [{"x": 1}], "note": "n"}


def test_line_fit_recovers_a_hand_made_line_and_rejects_one_point():
    from gemmlab.measure.bench import line_fit
    fixed, slope = line_fit([(1, 12.0), (3, 16.0), (6, 22.0)])  # y = 10 + 2x
    assert fixed == pytest.approx(10.0) and slope == pytest.approx(2.0)
    with pytest.raises(ValueError, match="two distinct x"):
        line_fit([(2, 1.0), (2, 3.0)])


def test_measured_copy_tbps(tmp_path, monkeypatch):
    monkeypatch.setattr(bench, "RESULTS_DIR", tmp_path)
    assert copybench.measured_copy_tbps() is None
    d = tmp_path / "nvidia-h100-80gb-hbm3"
    d.mkdir()
    (d / "copy_bandwidth.json").write_text(json.dumps({
        "device": "NVIDIA H100 80GB HBM3",
        "rows": [{"kernel": "torch copy_", "GB/s": 2900.0}, {"kernel": "v4", "GB/s": 3000.0}],
    }))
    assert copybench.measured_copy_tbps() == {"NVIDIA H100 80GB HBM3": pytest.approx(3.0)}
