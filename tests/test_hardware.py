"""The GPU spec table, the roofline model and the figure data of chapter 00."""
import dataclasses

import numpy as np
import pytest

from gemmlab import figures, hardware as hw

# A made-up GPU with round numbers, so every expected value is worked by hand.
TOY = dataclasses.replace(hw.H100, short="TOY", bf16_tflops=1000.0, fp8_tflops=2000.0,
                          fp4_tflops=None, hbm_tbps=4.0)


# ---- roofline and ridge point ------------------------------------------------

def test_ridge_point_is_peak_over_bandwidth():
    assert hw.ridge_point(TOY, "bf16") == pytest.approx(250.0)     # 1000 TFLOP/s / 4 TB/s
    assert hw.ridge_point(TOY, "fp8") == pytest.approx(500.0)      # 2000 / 4
    assert hw.ridge_point(hw.H100, "bf16") == pytest.approx(989.4 / 3.35)  # 295.3
    assert hw.ridge_point(hw.H200, "bf16") == pytest.approx(989.4 / 4.8)   # 206.1
    assert hw.ridge_point(hw.B200, "fp4") == pytest.approx(9000 / 7.7)     # 1168.8


def test_roofline_below_at_and_above_the_ridge():
    assert hw.roofline(TOY, "bf16", 100) == pytest.approx(400.0)    # memory bound: 4 TB/s x 100
    assert hw.roofline(TOY, "bf16", 250) == pytest.approx(1000.0)   # at the ridge both limits agree
    assert hw.roofline(TOY, "bf16", 1000) == pytest.approx(1000.0)  # compute bound: the peak
    assert hw.roofline(TOY, "bf16", 0) == 0.0                       # a copy does no FLOPs
    y = hw.roofline(TOY, "fp8", np.array([1.0, 500.0, 1e4]))
    np.testing.assert_allclose(y, [4.0, 2000.0, 2000.0])


def test_roofline_rejects_bad_input():
    with pytest.raises(ValueError, match="intensity must be >= 0"):
        hw.roofline(TOY, "bf16", -1)
    with pytest.raises(ValueError, match="H100 has no fp4"):
        hw.roofline(hw.H100, "fp4", 10)
    with pytest.raises(ValueError, match="dtype must be one of bf16, fp8, fp4"):
        hw.ridge_point(TOY, "fp16")


# ---- GEMM arithmetic intensity -----------------------------------------------

def test_gemm_intensity_4096_cubed_bf16_by_hand():
    # FLOPs: 2 * 4096^3 = 137,438,953,472. Bytes: A, B, C each 4096^2 x 2 B = 33,554,432,
    # together 100,663,296. Ratio = 1365.33 = 4096 / 3.
    assert hw.gemm_intensity(4096, 4096, 4096, 2) == pytest.approx(137_438_953_472 / 100_663_296)
    assert hw.gemm_intensity(4096, 4096, 4096, 2) == pytest.approx(4096 / 3)


def test_gemm_intensity_other_shapes_by_hand():
    # FP8 in, BF16 out: bytes = 4096^2 x (1 + 1 + 2) -> 2 * 4096 / 4 = 2048.
    assert hw.gemm_intensity(4096, 4096, 4096, 1, out_bytes_per_elem=2) == pytest.approx(2048)
    # Skinny M=16: 536,870,912 FLOP / (2 x (65,536 + 16,777,216 + 65,536)) B = 15.876.
    assert hw.gemm_intensity(16, 4096, 4096, 2) == pytest.approx(536_870_912 / 33_816_576)
    # 1x1x1 in FP32: 2 FLOP / 12 bytes.
    assert hw.gemm_intensity(1, 1, 1, 4) == pytest.approx(1 / 6)


@pytest.mark.parametrize("args,match", [
    ((0, 8, 8, 2), "M must be >= 1"),
    ((8, 8.0, 8, 2), "N must be an int; got float 8.0"),
    ((8, 8, 8, 0), "bytes_per_elem must be > 0"),
])
def test_gemm_intensity_rejects_bad_input(args, match):
    with pytest.raises((TypeError, ValueError), match=match):
        hw.gemm_intensity(*args)


# ---- the numbers themselves ----------------------------------------------------

def test_dense_rates_not_sparse():
    # Datasheet (sparse) 1,979 TFLOPS halves to ~989.4 dense.
    assert hw.H100.bf16_tflops == pytest.approx(989.4, rel=0.01)
    # Cross-check from the hardware: 132 SMs x 4096 dense BF16 FLOP/clk/SM x 1.83 GHz boost.
    assert 132 * 4096 * 1.83e9 / 1e12 == pytest.approx(hw.H100.bf16_tflops, rel=1e-3)
    assert hw.B200.bf16_tflops == pytest.approx(2250)
    for g in hw.GPUS:
        assert g.fp8_tflops == pytest.approx(2 * g.bf16_tflops, rel=1e-3)
    assert hw.B200.fp4_tflops == pytest.approx(2 * hw.B200.fp8_tflops)


def test_sanity_relations_between_the_gpus():
    assert hw.H200.hbm_tbps > hw.H100.hbm_tbps
    assert hw.H200.hbm_gb > hw.H100.hbm_gb
    assert (hw.H200.bf16_tflops, hw.H200.fp8_tflops) == (hw.H100.bf16_tflops, hw.H100.fp8_tflops)
    assert hw.B200.hbm_tbps > hw.H200.hbm_tbps
    assert hw.B200.fp4_tflops is not None and hw.B200.tmem_per_sm_kib is not None
    for g in (hw.H100, hw.H200):
        assert g.fp4_tflops is None and g.tmem_per_sm_kib is None
        assert g.peak_tflops("fp4") is None


def test_on_chip_memories():
    assert hw.B200.tmem_per_sm_kib == 128 * 512 * 4 // 1024 == 256
    for g in hw.GPUS:
        assert g.smem_per_sm_kib == 228
        assert g.smem_per_block_kib == g.smem_per_sm_kib - 1   # CUDA reserves 1 KiB per block
        assert g.register_file_kib == 256                       # 65536 x 4 bytes


def test_gpus_match_course_tiers():
    from gemmlab.tiers import TIER_TARGET

    for g in hw.GPUS:
        assert TIER_TARGET[g.tier] == g.target
    assert [g.tier for g in hw.GPUS] == ["sm90", "sm90", "sm100"]


def test_every_number_has_a_source():
    numeric = [f.name for f in dataclasses.fields(hw.GPUSpec)
               if f.name not in ("name", "short", "architecture", "compute_capability", "target",
                                 "tier", "sources")]
    for g in hw.GPUS:
        for name in numeric:
            assert g.source(name), (g.short, name)
    assert "sparsity" in hw.H100.source("bf16_tflops")
    with pytest.raises(KeyError):
        hw.H100.source("colour")


def test_get_and_spec_for():
    assert hw.get("h200") is hw.H200
    with pytest.raises(ValueError, match="unknown GPU 'A100'"):
        hw.get("A100")
    assert hw.spec_for("NVIDIA H100 80GB HBM3") is hw.H100
    assert hw.spec_for("NVIDIA H200") is hw.H200
    assert hw.spec_for("NVIDIA B200") is hw.B200
    assert hw.spec_for("NVIDIA H100 PCIe") is None      # other clocks and memory
    assert hw.spec_for("NVIDIA A100-SXM4-80GB") is None


# ---- tables --------------------------------------------------------------------

def test_spec_table_has_one_row_per_gpu():
    lines = hw.spec_table().splitlines()
    body = [ln for ln in lines if ln.split() and ln.split()[0] in ("H100", "H200", "B200")]
    assert [ln.split()[0] for ln in body] == ["H100", "H200", "B200"]
    assert lines[0].split()[:4] == ["GPU", "arch", "cc", "SMs"]
    assert set(lines[1].replace(" ", "")) == {"-"}
    h100 = body[0].split()
    assert h100[4:7] == ["989", "1979", "-"]      # dense BF16, FP8; no FP4
    assert body[2].split()[6] == "9000"


def test_workload_table_rows():
    text = hw.workload_table()
    assert "989 (math)" in text           # 4096^3 BF16 on Hopper: compute bound
    assert "53 (mem)" in text             # M=16 on H100: 3.35 x 15.88 = 53.2
    assert "no fp4" in text
    assert len(text.splitlines()) == 2 + len(hw.workloads())


# ---- the figure's data -----------------------------------------------------------

def test_roofline_data():
    data = hw.roofline_data(n_points=50)
    assert set(data["lines"]) == {("H100", "bf16"), ("H100", "fp8"), ("H200", "bf16"),
                                  ("H200", "fp8"), ("B200", "bf16"), ("B200", "fp8"),
                                  ("B200", "fp4")}
    x, y = data["lines"][("H100", "bf16")]
    assert len(x) == 50 and x[0] == pytest.approx(hw.X_RANGE[0]) and x[-1] == pytest.approx(hw.X_RANGE[1])
    assert y.max() == pytest.approx(989.4) and y[0] == pytest.approx(3.35 * hw.X_RANGE[0])
    assert np.all(np.diff(y) >= 0)
    assert data["ridges"][("H200", "fp8")] == pytest.approx((1978.9 / 4.8, 1978.9))
    marks = {w["label"]: w for w in data["workloads"]}
    assert marks["copy"]["intensity"] == 0 and marks["copy"]["attainable"]["B200"] == 0
    assert marks["GEMM 4096^3 BF16"]["attainable"]["H100"] == pytest.approx(989.4)
    assert marks["GEMM 16x4096x4096 BF16"]["attainable"]["H100"] == pytest.approx(3.35 * 536_870_912 / 33_816_576)
    assert marks["GEMM 4096^3 FP4->BF16"]["attainable"] == {"H100": None, "H200": None, "B200": 9000.0}


def test_draw_roofline_saves_the_figure(tmp_path, monkeypatch):
    monkeypatch.setattr(figures, "FIGURES_DIR", tmp_path)
    path, data = hw.draw_roofline("00_roofline_test")
    assert path == tmp_path / "00_roofline_test.png" and path.stat().st_size > 10_000
    assert len(data["lines"]) == 7


@pytest.mark.gpu
def test_sm_count_matches_the_device():
    import torch

    assert hw.sm_count() == torch.cuda.get_device_properties(0).multi_processor_count > 0


@pytest.mark.parametrize("size, exc", [(0, ValueError), (9, ValueError), (2.0, TypeError), ("4", TypeError)])
def test_max_active_clusters_rejects_bad_sizes(size, exc):
    with pytest.raises(exc, match="size"):
        hw.max_active_clusters(size)


@pytest.mark.parametrize("kwargs, exc, match", [
    (dict(threads=0), ValueError, "threads must be >= 1"), (dict(threads=2048), ValueError, "threads must be <= 1024"),
    (dict(threads=384.0), TypeError, "threads must be an int"),
    (dict(smem_bytes=-1), ValueError, "smem_bytes must be >= 0"),
    (dict(smem_bytes=300 * 1024), ValueError, "smem_bytes must be <= 232448"),
])
def test_max_active_clusters_rejects_bad_launch_shapes_before_the_driver(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        hw.max_active_clusters(2, **kwargs)


@pytest.mark.gpu
def test_max_active_clusters_on_this_gpu():
    """One CTA per SM: clusters of 1 fill every SM; a cluster's CTAs share a GPC, so pairs and quads fit at most
    SMs / size, and at least one of each fits."""
    sms = hw.sm_count()
    assert hw.max_active_clusters(1) == sms
    for size in (2, 4):
        assert 1 <= hw.max_active_clusters(size) <= sms // size
