"""Chapter 07's feature ladder: the rungs, and the table and figure drawn from a results file (no GPU)."""
import json
from pathlib import Path

import pytest

from gemmlab.measure import gemm_ladder as ladder
from gemmlab.family.configs import Sm90Config


# ---- the rungs


def test_rung_keys_unique_and_ladder_first():
    keys = [r.key for r in ladder.RUNGS]
    assert len(keys) == len(set(keys))
    steps = [r.step for r in ladder.RUNGS]
    assert steps == sorted(steps, reverse=True), "the ladder's rungs come before the variations"
    assert ladder.RUNGS[0].kernel == "ch06"


def test_each_rung_changes_one_knob():
    steps = [r for r in ladder.RUNGS if r.step and r.kernel == "ch07"]
    for before, after in zip(steps, steps[1:]):
        assert len(ladder.changed_fields(before.config, after.config)) == 1, (before.key, after.key)
    assert ladder.changed_fields(steps[0].config, steps[1].config) == ["tile_m"]
    top = steps[-1].config
    assert top == Sm90Config(), "the ladder ends at the default configuration"
    expect = {"stages3": ["stages"], "epi64x2": ["epi_n", "epi_stages"], "epi16x4": ["epi_n"],
              "epi32x2": ["epi_stages"], "cluster1x2": ["cluster"], "group16": ["group"]}
    for r in ladder.RUNGS:
        if not r.step and r.config is not None:
            assert ladder.changed_fields(top, r.config) == expect[r.key], r.key
    assert [r.key for r in ladder.RUNGS if r.config is None and r.kernel == "ch07"] == ["heuristic"]


def test_chapter06_rung_fits_the_shapes():
    from gemmlab import wgmma

    (rung,) = [r for r in ladder.RUNGS if r.kernel == "ch06"]
    tm, tn, st = rung.tile
    wgmma._check_config(tm, tn, st)
    for m, n, k in ladder.LADDER_SHAPES:
        wgmma._check_shape(m, n, k, tm, tn)  # no partial tiles in chapter 06's kernel
    # The first chapter 07 rung holds as many accumulators per thread as chapter 06's tile.
    first = next(r for r in ladder.RUNGS if r.kernel == "ch07")
    assert first.config.tile_m * first.config.tile_n // (128 * first.config.consumers) == tm * tn // 128


def test_rung_validation_and_table():
    with pytest.raises(ValueError, match="kernel must be 'ch06' or 'ch07'"):
        ladder.Rung("x", "x", "x", "cublas")
    with pytest.raises(ValueError, match=r"a ch06 rung needs tile=\(tile_m, tile_n, stages\)"):
        ladder.Rung("x", "x", "x", "ch06", tile=(128, 128))
    text = ladder.rung_table()
    short = ladder.rung_table(adds=False)
    for r in ladder.RUNGS:
        assert f"{r.key}: {r.adds}" in text and r.adds not in short and r.label in short
    assert "128x256 c2x1 m8 s4 e32x4" in text and "128x256 c2x1 m8 s4 e64x2" in text
    assert "128x128 s6 (one CTA per tile)" in text


def test_every_rung_compiles_for_sm90a():
    """No rung may fail on the GPU for a reason a compile shows: each compiles, with its tile and multicast."""
    from gemmlab.kernels import gemm_sm90 as g7
    from gemmlab import wgmma
    from gemmlab.compile import ptx_opcodes

    for r in ladder.RUNGS:
        if r.kernel == "ch06":
            tm, tn, st = r.tile
            for m, n, k in ladder.LADDER_SHAPES:  # chapter 06's kernel is compiled per shape
                ops = ptx_opcodes(wgmma.compile_gemm_nt("sm_90a", m, n, k, tile_m=tm, tile_n=tn, stages=st),
                                  r"^wgmma\.mma_async")
                assert ops == [f"wgmma.mma_async.sync.aligned.m64n{tn}k16.f32.bf16.bf16"], ops
            continue
        if r.config is None:
            continue
        ops = ptx_opcodes(g7.compile_gemm("sm_90a", r.config), r"^wgmma\.mma_async", r"^cp\.async\.bulk\.tensor")
        assert f"wgmma.mma_async.sync.aligned.m64n{r.config.tile_n}k16.f32.bf16.bf16" in ops, r.key
        multicast = any(".multicast::cluster" in op for op in ops)
        assert multicast == (r.config.cluster_size > 1), r.key
        assert any(op.startswith("cp.async.bulk.tensor.2d.global.shared::cta") for op in ops), r.key  # TMA store


# ---- a synthetic results file

TFLOPS = {"ch06": 400.0, "persistent": 500.0, "two_consumers": 600.0, "grouped": 630.0, "cluster": 660.0,
          "stages3": 594.0, "epi64x2": 660.0, "epi16x4": 655.0, "epi32x2": 640.0, "cluster1x2": 650.0,
          "group16": 666.0, "heuristic": 660.0}


def synthetic_doc(device="NVIDIA H100 80GB HBM3", shapes=ladder.LADDER_SHAPES, fail=("epi16x4",), cublas=700.0):
    rows = []
    for m, n, k in shapes:
        flop = 2 * m * n * k
        for r in ladder.RUNGS:
            if r.key in fail:
                rows.append({"rung": r.key, "m": m, "n": n, "k": k, "ok": False, "config": r.config_name,
                             "error": "RuntimeError: launch failed"})
                continue
            tf = TFLOPS[r.key]
            config = r.config_name if r.config is not None or r.kernel == "ch06" else "128x144 c2x1 m8 s6 e16x4"
            rows.append({"rung": r.key, "m": m, "n": n, "k": k, "ok": True, "config": config,
                         "rel_err": 1.5e-3, "us": flop / tf / 1e6, "tflops": tf,
                         "cublas_us": flop / cublas / 1e6, "cublas_tflops": cublas})
    return {"benchmark": "gemm_ladder", "device": device, "date": "2026-11-23 18:00:00 UTC",
            "rungs": [r.meta() for r in ladder.RUNGS], "rows": rows, "method": ladder.METHOD}


def test_gains_are_against_the_rung_before():
    doc = synthetic_doc()
    rows = ladder.ladder_rows(doc, (8192, 8192, 8192))
    by = {r["rung"]: r for r in rows}
    assert [r["rung"] for r in rows] == [r.key for r in ladder.RUNGS]
    assert by["ch06"]["gain"] is None and by["ch06"]["vs_ch06"] == pytest.approx(1.0)
    assert by["persistent"]["gain"] == pytest.approx(1.25)
    assert by["two_consumers"]["gain"] == pytest.approx(1.2)
    assert by["cluster"]["gain"] == pytest.approx(660 / 630)
    assert by["cluster"]["vs_ch06"] == pytest.approx(1.65)
    assert by["cluster"]["vs_cublas"] == pytest.approx(660 / 700)
    # Variations are measured against the top rung, not against each other.
    assert by["stages3"]["gain"] == pytest.approx(0.9)
    assert by["epi32x2"]["gain"] == pytest.approx(640 / 660)
    assert by["epi16x4"]["gain"] is None and by["epi16x4"]["vs_cublas"] is None
    assert by["heuristic"]["label"] == "gemmlab.gemm's choice (128x144 c2x1 m8 s6 e16x4)"


def test_a_failed_step_breaks_the_chain_of_gains():
    doc = synthetic_doc(fail=("two_consumers",))
    by = {r["rung"]: r for r in ladder.ladder_rows(doc, (4096, 7168, 2048))}
    assert by["two_consumers"]["gain"] is None
    assert by["grouped"]["gain"] is None, "no gain over a rung that did not run"
    assert by["cluster"]["gain"] == pytest.approx(660 / 630)
    doc = synthetic_doc(fail=("ch06",))
    by = {r["rung"]: r for r in ladder.ladder_rows(doc, (4096, 7168, 2048))}
    assert by["cluster"]["vs_ch06"] is None and by["persistent"]["gain"] is None


def test_table_shows_numbers_and_failures():
    text = ladder.ladder_table(synthetic_doc())
    assert "8192 x 8192 x 8192: cuBLAS 700 TFLOP/s" in text and "4096 x 7168 x 2048" in text
    assert "x1.250" in text and "x1.65" in text and "0.943" in text  # 660 / 700
    assert text.count("variation: epilogue 64x16, ring 4 failed: RuntimeError: launch failed") == 2
    line = next(ln for ln in text.splitlines() if ln.strip().startswith("variation: epilogue 64x16"))
    assert "failed" in line


def test_figure_from_two_devices(tmp_path, monkeypatch):
    from gemmlab import figures

    monkeypatch.setattr(figures, "FIGURES_DIR", tmp_path)
    docs = [synthetic_doc(), synthetic_doc("NVIDIA H200", shapes=ladder.LADDER_SHAPES[:1])]
    path = ladder.draw_ladder(docs)
    assert path == tmp_path / "07_ladder.png" and path.stat().st_size > 10_000
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bad_documents_are_refused():
    with pytest.raises(ValueError, match="non-empty list"):
        ladder.draw_ladder([])
    with pytest.raises(ValueError, match="benchmark 'gemm_ladder'.*benchmark 'gemm_family'"):
        ladder.ladder_table({"benchmark": "gemm_family", "rows": []})
    doc = synthetic_doc()
    with pytest.raises(ValueError, match="no rows"):
        ladder.ladder_table({**doc, "rows": []})
    with pytest.raises(ValueError, match="'rungs' entry"):
        ladder.ladder_table({k: v for k, v in doc.items() if k != "rungs"})
    with pytest.raises(ValueError, match="row 'warp_specialized' names no rung"):
        ladder.ladder_table({**doc, "rows": doc["rows"] + [{**doc["rows"][0], "rung": "warp_specialized"}]})
    with pytest.raises(ValueError, match=r"shape must be one of the measured shapes.*got \(1, 2, 3\)"):
        ladder.ladder_rows(doc, (1, 2, 3))


def test_not_measured_names_the_command_and_the_file():
    line = ladder.not_measured("NVIDIA H200")
    assert "python benchmarks/gemm_ladder.py" in line and "results/nvidia-h200/gemm_ladder.json" in line


# ---- the benchmark script, without a GPU


def test_script_arguments(bench_script):
    s = bench_script("gemm_ladder")
    assert s.parse_shapes("8192x8192x8192, 4096X7168X2048") == [(8192, 8192, 8192), (4096, 7168, 2048)]
    with pytest.raises(Exception, match="MxNxK with positive integers; got '8192x8192'"):
        s.parse_shapes("8192x8192")
    with pytest.raises(Exception, match="MxNxK"):
        s.parse_shapes("0x8x8")
    assert [r.key for r in s.parse_rungs("ch06,cluster")] == ["ch06", "cluster"]
    with pytest.raises(Exception, match="--rungs: names from ch06"):
        s.parse_rungs("ch06,warp_specialized")
    with pytest.raises(SystemExit):
        s.main(["--rounds", "0"])


def test_script_needs_hopper(capsys, bench_script):
    from gemmlab.tiers import detect_tier

    if detect_tier() == "sm90":
        pytest.skip("this machine is a Hopper GPU: the script would run")
    assert bench_script("gemm_ladder").main([]) == 2
    assert "needs a Hopper GPU (tier sm90" in capsys.readouterr().out


def test_script_writes_what_the_table_reads(tmp_path, bench_script):
    s = bench_script("gemm_ladder")
    doc = synthetic_doc()
    path = s.write(doc["rows"], ladder.RUNGS, ladder.LADDER_SHAPES, str(tmp_path), rounds=3, per_round=4)
    stored = json.loads(Path(path).read_text())
    assert stored["benchmark"] == "gemm_ladder" and stored["rounds"] == 3 and stored["method"] == ladder.METHOD
    assert ladder.ladder_table(stored).split("\n", 1)[1] == ladder.ladder_table(doc).split("\n", 1)[1]


def test_a_failing_rung_is_a_row_and_the_run_goes_on(monkeypatch, bench_script):
    import torch

    s = bench_script("gemm_ladder")

    class Props:
        L2_cache_size = 50 * 2 ** 20

    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: Props())
    monkeypatch.setattr(s, "_operands", lambda m, n, k, sets: [(torch.ones(m, k), torch.ones(n, k), None)])

    def fake_time_rung(rung, shape, data, ref, *, rounds, per_round):
        if rung.key == "grouped":
            raise RuntimeError("cudaErrorIllegalInstruction")
        return {"rung": rung.key, "m": shape[0], "n": shape[1], "k": shape[2], "ok": True, "config": "x",
                "us": 1.0, "tflops": 1.0, "cublas_us": 1.0, "cublas_tflops": 1.0, "rel_err": 0.0}

    monkeypatch.setattr(s, "time_rung", fake_time_rung)
    lines = []
    rungs = [r for r in ladder.RUNGS if r.key in ("ch06", "grouped", "cluster")]
    rows = s.measure([(64, 64, 64), (128, 64, 64)], rungs, progress=lines.append)
    assert [(r["m"], r["rung"], r["ok"]) for r in rows] == [
        (64, "ch06", True), (64, "grouped", False), (64, "cluster", True),
        (128, "ch06", True), (128, "grouped", False), (128, "cluster", True)]
    assert rows[1]["error"] == "RuntimeError: cudaErrorIllegalInstruction"
    assert rows[1]["config"] == "128x256 c1x1 m8 s4 e32x4"
    assert "FAILED RuntimeError: cudaErrorIllegalInstruction" in lines[1]
