"""gemmlab.course.show: whole sources and regions cut at existing comments."""
import pytest

from gemmlab.course import show


def sample(x):
    # ---- setup: the first section
    y = x + 1
    if y > 2:
        # ---- inner: inside the branch
        y = y * 2
        z = y - 1  # trailing comment: marker in a code line
        y = z
    # ---- finish
    return y  # ---- setup is also named here, so "setup" alone is ambiguous


def _lines(text):
    return [line for line in text.splitlines() if line.strip()]


def test_source_of_is_unchanged():
    text = show.source_of(sample)
    assert text.startswith("def sample(x):\n")
    assert "return y" in text


def test_region_between_two_markers():
    text = show.source_region(sample, "---- setup: the first", "---- finish")
    assert _lines(text) == ["# ---- setup: the first section", "y = x + 1", "if y > 2:",
                            "    # ---- inner: inside the branch", "    y = y * 2",
                            "    z = y - 1  # trailing comment: marker in a code line", "    y = z"]
    assert text.endswith("\n")


def test_region_stops_at_the_end_of_its_block():
    # No end marker: the region is the rest of the branch it starts in, dedented.
    assert _lines(show.source_region(sample, "---- inner")) == [
        "# ---- inner: inside the branch", "y = y * 2", "z = y - 1  # trailing comment: marker in a code line",
        "y = z"]
    # An end marker outside the block: the block still ends the region first.
    assert show.source_region(sample, "---- inner", "---- finish") == show.source_region(sample, "---- inner")


def test_region_from_the_start_and_from_a_trailing_comment():
    text = show.source_region(sample, None, "---- setup: the first")
    assert _lines(text) == ["def sample(x):"]
    assert _lines(show.source_region(sample, "trailing comment")) == [
        "z = y - 1  # trailing comment: marker in a code line", "y = z"]
    first, last = show.region_lines(sample, "---- finish")
    assert (first, last) == (9, 10)


def test_missing_marker_is_an_error():
    with pytest.raises(ValueError, match=r"start marker '---- nowhere' is in no comment of .*sample"):
        show.source_region(sample, "---- nowhere")
    with pytest.raises(ValueError, match=r"end marker 'nope' is in no comment"):
        show.source_region(sample, "---- inner", "nope")
    # Code that is not in a comment is not a marker.
    with pytest.raises(ValueError, match="in no comment"):
        show.source_region(sample, "y = x + 1")


def test_ambiguous_and_misordered_markers_are_errors():
    with pytest.raises(ValueError, match=r"'---- setup' is in 2 comments .*lines 2, 10.*exactly one"):
        show.source_region(sample, "---- setup")
    with pytest.raises(ValueError, match="must come after the start marker"):
        show.source_region(sample, "---- finish", "---- inner")
    with pytest.raises(TypeError, match="start must be a non-empty string"):
        show.source_region(sample, 3)
    with pytest.raises(TypeError, match="end must be a non-empty string"):
        show.source_region(sample, "---- inner", "  ")


# The sections chapter 07 shows of gemm_sm90.gemm_kernel, in reading order.
CH07_SECTIONS = [(None, "---- shared memory"), ("---- shared memory", "---- global tiles"),
                 ("---- global tiles", "producer warpgroup"), ("producer warpgroup", None),
                 ("consumer warpgroups", "---- main loop"), ("---- main loop", "---- epilogue:"),
                 ("---- epilogue:", None), ("store warp drains", None), ("---- split-K epilogue", None)]


def test_chapter07_sections_of_the_kernel():
    from gemmlab.kernels import gemm_sm90 as g7

    ranges = [show.region_lines(g7.gemm_kernel, s, e) for s, e in CH07_SECTIONS]
    body = show.source_of(g7.gemm_kernel).splitlines()
    shown = {i for first, last in ranges for i in range(first, last + 1)}
    hidden = [body[i - 1].strip() for i in range(1, len(body) + 1) if i not in shown and body[i - 1].strip()]
    # Everything is shown but the branch keywords between sections and the step to the next work unit.
    assert hidden == ["else:", "else:", "linear = linear + step"], hidden
    # One epilogue variant per section: the TMA-store one (its body is gemm_sm90.store_tile) ...
    tma = show.source_region(g7.gemm_kernel, "---- epilogue:")
    assert "store_tile(" in tma and "tCgW" not in tma
    assert "cp_async_bulk_commit_group" in show.source_of(g7.store_tile)
    # ... and the split-K one: publish the partial tile, count it; the tile's last unit adds them all, then the
    # same TMA-store epilogue.
    splitk = show.source_region(g7.gemm_kernel, "---- split-K epilogue")
    assert all(f in splitk for f in ("store_partial(", "arrive(", "add_partials(", "store_tile("))
    loop = show.source_region(g7.gemm_kernel, "---- main loop", "---- epilogue:")
    assert "mma_tile(" in loop and "tma_b" not in loop and "store_tile" not in loop
    assert "warpgroup.wait_group(1)" in show.source_of(g7.mma_tile)
    producer = show.source_region(g7.gemm_kernel, "producer warpgroup")
    assert "mcast_mask=a_mask" in producer and "mcast_mask=b_mask" in producer and "cute.gemm" not in producer
    # "epilogue" alone names three comments: refused rather than guessed.
    with pytest.raises(ValueError, match="exactly one comment"):
        show.region_lines(g7.gemm_kernel, "epilogue")


def test_show_region_displays_file_lines(monkeypatch):
    import inspect

    import IPython.display

    shown = []
    monkeypatch.setattr(IPython.display, "display", lambda obj: shown.append(obj))
    show.show_region(sample, "---- inner")
    (md,) = shown
    first = inspect.getsourcelines(sample)[1]
    assert md.data.startswith(f"`{__name__}.sample` (test_show.py, lines {first + 4}–{first + 7})")
    assert "```python\n# ---- inner: inside the branch\n" in md.data


def test_chapter07_barrier_exercise_matches_the_kernel():
    """The exercise asks for the counts the kernel's shared-memory piece initialises and the producer arms."""
    from gemmlab.kernels import gemm_sm90 as g7
    from gemmlab.course.exercises import ch07

    prologue = show.source_region(g7.gemm_kernel, "---- shared memory", "---- global tiles")
    assert "cute.arch.mbarrier_init(empty + s, 4 * readers * CS)" in prologue and "readers = cfg.tile_warpgroups" in prologue
    assert "cute.arch.mbarrier_init(full + s, 1)" in prologue
    assert "mbarrier_arrive_and_expect_tx(full + state.index, stage_bytes)" in show.source_region(
        g7.gemm_kernel, "producer warpgroup")
    assert ch07.solution_barrier_counts() == (4 * 2 * 2, (128 + 256) * 64 * 2)
