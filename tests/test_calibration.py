"""The simulator is calibrated on measured Hopper GEMMs (chapter 07) before it predicts a B200 (chapter 10)."""
import json

import pytest

from gemmlab import calibration as cal
from gemmlab.family.benchmark import CHAPTER07_SHAPES


@pytest.fixture(scope="module")
def rows():
    return cal.calibration_rows()


def test_points_are_chapter_07s_ten_shapes_on_both_gpus(rows):
    for dev in cal.DEVICES:
        assert sorted(r["shape"] for r in rows if r["device"] == dev) == sorted(CHAPTER07_SHAPES)
    by = {(r["device"], r["shape"]): r for r in rows}
    assert round(by[("nvidia-h200", (8192, 8192, 8192))]["measured_tflops"]) == 724  # as stored


def test_datasheet_model_misses_and_calibrated_model_does_not(rows):
    # The datasheet clock predicts ~97 % of peak at 8192^3 on the H200, 30 % above the measurement ...
    h200 = next(r for r in rows if r["device"] == "nvidia-h200" and r["shape"] == (8192, 8192, 8192))
    assert h200["datasheet_tflops"] > 0.95 * 989.4 and h200["datasheet_error"] > 0.25
    assert max(abs(r["datasheet_error"]) for r in rows) > 0.4
    # ... the calibrated one is within the +-10 % band on every shape of both GPUs.
    assert max(abs(r["error"]) for r in rows) <= cal.TOLERANCE
    for dev in cal.DEVICES:
        assert any(r["device"] == dev for r in rows)


def test_fitted_clocks_are_physical():
    # Nsight Compute on the H200 at 8192^3: 1.591 GHz with the tensor pipe 94.3 % busy = 1.50 GHz effective.
    prof = json.loads((cal.RESULTS / "nvidia-h200" / "gemm_sm90_profile.json").read_text())
    ours = prof["shapes"]["8192x8192x8192"][0]
    effective = ours["sm_clock_ghz"] * ours["tensor_pipe_active_pct"] / 100
    assert abs(cal.CALIBRATION.tensor_ghz["nvidia-h200"] - effective) < 0.1
    for ghz in cal.CALIBRATION.tensor_ghz.values():
        assert 1.2 < ghz < cal.SM90_SPEC_GHZ  # below the datasheet clock, above the lowest clocks seen


def test_fit_reproduces_the_stored_constants():
    got, worst = cal.fit(ghz_grid=[1.44, 1.45, 1.46, 1.47, 1.48, 1.49, 1.50, 1.51], epilogue_grid=(500, 1000, 1500),
                         latency_grid=(1e-6, 2e-6))
    assert got == cal.CALIBRATION and worst <= cal.TOLERANCE


def test_b200_prediction_is_a_range_below_the_roofline():
    r = cal.predict_b200((8192, 8192, 8192))
    assert r["low_tflops"] < r["predicted_tflops"] < r["high_tflops"] <= r["roofline_tflops"] == pytest.approx(2250)
    assert r["clock_fraction"] == pytest.approx((1.49 + 1.46) / 2 / 1.83)
    faster = cal.predict_b200((8192, 8192, 8192), cal=cal.with_clock(cal.CALIBRATION, "nvidia-h200", 1.8))
    assert faster["predicted_tflops"] > r["predicted_tflops"]


@pytest.mark.parametrize("bad,exc,msg", [
    ((4096, 4096), ValueError, "shape must be"),
    ((0, 1, 1), ValueError, "shape must be"),
])
def test_bad_input(bad, exc, msg):
    with pytest.raises(exc, match=msg):
        cal.predict_b200(bad)
    with pytest.raises(exc, match=msg):
        cal.predict_sm90(bad, "128x256 c2x1 m8 s4", "nvidia-h200")


def test_bad_config_device_and_calibration():
    with pytest.raises(ValueError, match="device must be one of"):
        cal.predict_sm90((64, 64, 64), "128x256 c2x1 m8 s4", "b200")
    with pytest.raises(ValueError, match="swapped or split"):
        cal.predict_sm90((64, 64, 64), "64x64 c1x1 m8 s8 swap", "nvidia-h200")
    with pytest.raises(ValueError, match="name must look like"):
        cal.predict_sm90((64, 64, 64), "big tiles", "nvidia-h200")
    with pytest.raises(TypeError, match="cfg must be an Sm100Config"):
        cal.predict_b200((256, 256, 256), cfg="256")
    with pytest.raises(ValueError, match="epilogue_cycles must be a finite number"):
        cal.Calibration({"nvidia-h200": 1.5}, epilogue_cycles=float("nan"))
    with pytest.raises(ValueError, match="tensor_ghz"):
        cal.Calibration({"nvidia-h200": 0})
    with pytest.raises(ValueError, match="points must hold"):
        cal.fit(points=[])


def test_calibration_figure(tmp_path, monkeypatch, rows):
    from gemmlab import figures

    monkeypatch.setattr(figures, "FIGURES_DIR", tmp_path)
    path, data = cal.draw_calibration(rows, name="10_test_calibration")
    assert path.exists() and set(data) == {"H100", "H200"} and all(len(v) == 10 for v in data.values())
    text = cal.format_calibration(rows)
    assert len(text.splitlines()) == 21 and "H200" in text
