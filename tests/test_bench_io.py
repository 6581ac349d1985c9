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


def test_figures_of_measurements_name_the_device_and_the_date(monkeypatch):
    """Every figure that shows a measurement says on which GPU and when (from the stored result it is drawn from)."""
    from gemmlab import figures
    from gemmlab.measure import banks as measure_banks
    from gemmlab.measure import dual_gemm_tables, gemm_tables as tables, tma_pipeline

    titles = {}

    def fake_save(fig, name):
        titles[name] = " | ".join([fig._suptitle.get_text() if fig._suptitle else ""] +
                                  [ax.get_title() for ax in fig.axes])
        import matplotlib.pyplot as plt
        plt.close(fig)
        return name

    monkeypatch.setattr(figures, "save", fake_save)
    for module in (copybench, dual_gemm_tables, measure_banks, tma_pipeline):  # they hold gemmlab.figures.save by name
        monkeypatch.setattr(module, "save", fake_save)
    doc = {"device": "NVIDIA H200", "date": "2026-11-21 06:56:14 UTC"}
    assert bench.measured_on(doc) == "NVIDIA H200, 2026-11-21"
    on = bench.measured_on(doc)
    measure_banks.draw_bank_conflicts([{"stride": 1, "width": 4, "model wavefronts": 1, "cycles/access": 1.03}],
                                      measured_on=on)
    copybench.draw_stage_sweep([{"stages": 2, "ctas/SM": 1, "GB/s": 2900.0, "vs torch": 0.7}], measured_on=on)
    tma_pipeline.draw_stage_sweep([{"stages": 2, "KiB/stage": 16, "ctas/SM": 1, "GB/s": 3000.0, "vs torch": 0.73}],
                                  measured_on=on)
    tma_pipeline.draw_tail_bubble([{"spin": 0, "stages": 2, "k": 3, "extra us": 0.3, "net extra us": None,
                                    "model extra us": 0.4}], measured_on=on)
    for name in ("01_bank_conflicts_measured", "03_bulk_stages", "05_bandwidth_vs_stages", "05_tail_bubble"):
        assert "NVIDIA H200, 2026-11-21" in titles[name], (name, titles[name])
    fam = {**doc, "rows": [{"group": "family", "m": 64, "n": 2112, "k": 7168, "ratio_public": 0.9},
                           {"group": "square", "m": 4096, "n": 4096, "k": 4096, "ratio_public": 2.0}]}
    tables.draw_family([fam])
    assert "'family' group (1 shapes" in titles["07_gemm_family"] and "0.900" in titles["07_gemm_family"]
    assert "2026-11-21" in titles["07_gemm_family"]
    row = {"m": 256, "n": 4096, "k": 7168, "gemmlab_us": 1.0, "prepared_kernel_us": 1.0, "stock_b_us": 2.0,
           "reference_a_us": 20.0, "roofline_us": 0.5}
    dual_gemm_tables.draw_benchmark([{**doc, "rows": [row]}, {"device": "NVIDIA H100 80GB HBM3",
                                                               "date": "2026-11-23", "rows": [row]}])
    assert "NVIDIA H100 80GB HBM3, 2026-11-23" in titles["11_benchmark"]


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
