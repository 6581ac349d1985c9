"""README's results tables are exactly what the stored benchmark JSON says."""
import json

import pytest

from gemmlab.measure import report


def test_readme_results_match_the_stored_json():
    text = report.README.read_text()
    assert report.splice(text, report.render()) == text, "run: python -m gemmlab.measure.report --write"


def test_every_copy_row_reaches_the_readme():
    text = report.README.read_text()
    for path in report.RESULTS.glob("*/copy_bandwidth.json"):
        doc = json.loads(path.read_text())
        assert doc["device"] in text
        for row in doc["rows"]:
            assert f"| {row['kernel']} | {row['ms']:.3f} | {row['GB/s']:.0f} |" in text


def test_prediction_is_labelled():
    assert "PREDICTION, not a measurement" in report.render()


def test_splice_needs_markers():
    with pytest.raises(ValueError, match="markers"):
        report.splice("no markers here", "x")
    assert report.splice(f"a{report.START}old{report.END}b", "new") == f"a{report.START}\nnew\n{report.END}b"


def test_sanitizer_summary_reaches_the_readme():
    for path in report.RESULTS.glob("*/gemm_sm90_sanitizer.txt"):
        text = path.read_text()
        assert "ERROR SUMMARY: 0 errors" in text and "RACECHECK SUMMARY: 0 hazards" in text
        assert "ERROR SUMMARY: 0 errors" in report.README.read_text()


def test_bf16_path_section_names_each_calls_kernel_and_drops_failed_rows():
    row = dict(m=64, n=4096, k=7168, ok=True, config="DecodeConfig(tokens=64, mma_warpgroups=1, split=2, stages=6)",
               gemmlab_us=33.3, bf16_path_us=54.7, prepared_kernel_us=33.4, bf16_path_kernel_us=52.9,
               vs_bf16_path=54.7 / 33.3, vs_bf16_path_kernel=52.9 / 33.4)
    doc = {"device": "NVIDIA H100 80GB HBM3", "date": "2026-11-27 11:00:00 UTC", "torch": "2.11.0+cu130",
           "summary": {"gpu_mode_call_geomean": 0.9, "gpu_mode_kernel_geomean": 0.84, "correct": 1, "shapes": 2},
           "rows": [row, dict(m=1, n=64, k=256, ok=False, error="boom")]}
    text = report._dual_gemm_bf16_section(doc)
    assert "0.90× as called" in text and "**0.84×** kernels alone" in text and "1 of 2 shapes correct" in text
    assert "| 64×4096×7168 | DecodeConfig | 33.3 | 54.7 | 33.4 | 52.9 | 1.64 | 1.58 |" in text
    assert "1×64×256" not in text
