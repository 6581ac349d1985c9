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
