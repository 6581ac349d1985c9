"""Every exercise's worked solution passes its own checker, and the checkers say wrong answers are wrong."""
import importlib
import pkgutil

import pytest

import gemmlab.course.exercises as ex

MODULES = [importlib.import_module(f"gemmlab.course.exercises.{m.name}") for m in pkgutil.iter_modules(ex.__path__)]
PAIRS = [(mod, name[len("check_"):]) for mod in MODULES for name in dir(mod) if name.startswith("check_")]


@pytest.mark.parametrize("mod,name", PAIRS, ids=[f"{m.__name__.split('.')[-1]}.{n}" for m, n in PAIRS])
def test_solution_passes_and_wrong_answers_fail(mod, name, capsys):
    check, solution = getattr(mod, f"check_{name}"), getattr(mod, f"solution_{name}")
    assert check(solution()) == True  # noqa: E712 (a Verdict, equal to the bool)
    assert "right" in capsys.readouterr().out
    assert check(None) == False and "no answer yet" in capsys.readouterr().out  # noqa: E712
    assert check("certainly not") == False and "not yet" in capsys.readouterr().out  # noqa: E712


def test_chapter07_solutions_by_hand():
    from gemmlab.course.exercises import ch07
    from gemmlab.family.configs import Sm90Config
    from gemmlab.family.heuristic_sm90 import make_config, predict
    from gemmlab.family.problem import GemmProblem

    p = GemmProblem(2048, 2112, 7168)
    c = predict(p, Sm90Config(tile_n=256, stages=4, cluster=(2, 1)))
    assert (c.units, c.waves) == ch07.solution_units_and_waves() == (72, 2)
    assert ch07.solution_slices() == (14, 8)
    p = GemmProblem(4096, 576, 7168)
    assert round(predict(p, make_config(p, 128, 144)).l2_us * 7e12 / 1e12) == ch07.solution_l2_megabytes() == 367
    # 384 rows in 2, 3, 4 token tiles on 32 weight tiles: 64, 96, 128 CTAs; the last fills 132 SMs best
    assert ch07.solution_token_tiles() == (96, 32 * 4) == (96, 128)
    c = make_config(GemmProblem(384, 4096, 4096), 128, 96, swap=True, cluster=(1, 2))
    assert c.tiles(384, 4096) == (32, 4)
    # 128 x 160: two warpgroups of 64 x 160 over 128 threads each, or one of 128 x 160
    assert ch07.solution_accumulators() == (10240 // 128, 20480 // 128) == (80, 160)


def test_chapters_00_to_06_solutions_by_hand():
    """Each solution against arithmetic done independently of the library function it calls."""
    import math

    from gemmlab.course.exercises import ch00, ch01, ch02, ch03, ch04, ch05, ch06

    assert ch00.solution_ridge_h200() == round(989 / 4.8) == 206
    decode_intensity = 2 * 16 * 4096 * 4096 / (2 * (16 * 4096 + 4096 * 4096 + 16 * 4096))
    assert ch00.solution_decode_roof() == round(4.8 * decode_intensity) == 76
    assert ch00.solution_compute_bound_m() == 512  # M=256: 228 FLOP/byte < 295 <= 410 at M=512
    assert ch01.solution_v2_stride2() == 4 and ch01.solution_pad_by_two() == math.gcd(34, 32)
    assert ch01.solution_ldmatrix_trans() == (2 * (13 % 4), 13 // 4)
    assert ch02.solution_parity_probe() == (False, True) and ch02.solution_state_after() == (10 % 4, (10 // 4) % 2)
    assert ch02.solution_safe_resets() == (6, 12)  # multiples of 2 x stages
    assert ch03.solution_missing_fence() == "fence.proxy.async.shared::cta"
    assert ch03.solution_kib_loading() == 160 and ch03.solution_stages_per_cta() == 227 // 16
    assert ch04.solution_swizzle_64b() == 256 + ((2 ^ 2) * 16) + 12
    assert ch04.solution_unswizzled_64b_rows() == 4 and ch04.solution_local_tile_element() == (133, 131)
    assert ch04.solution_partial_box_bytes() == 64 * 64 * 2
    assert ch05.solution_min_stages() == math.ceil((5 + 2) / 2) and ch05.solution_tail_cost() == 14
    assert ch05.solution_stages_two_ctas() == 5
    desc = ch06.solution_descriptor()
    assert desc & 0x3FFF == (0x4000 + 64) >> 4 and (desc >> 32) & 0x3FFF == 1024 >> 4 and desc >> 62 == 1
    assert ch06.solution_acc_element() == (16 * 1 + 5 // 4 + 8 * ((5 // 2) % 2), 8 * (5 // 4) + 2 * (5 % 4) + 5 % 2)
    assert ch06.check_fence_points(["c", "a"]) and not ch06.check_fence_points("abc")
    assert ch06.solution_one_warpgroup_128x256() > 255


def _exercise_cells():
    """(notebook, question markdown, module name, exercise name) for every exercise cell of every chapter."""
    import json
    import re

    from gemmlab.figures import REPO_ROOT

    for path in sorted((REPO_ROOT / "notebooks").glob("*.ipynb")):
        cells = json.loads(path.read_text())["cells"]
        for prev, cell in zip(cells, cells[1:]):
            m = re.search(r"\b(ch\d\d)\.check_(\w+)\(", "".join(cell["source"]))
            if cell["cell_type"] == "code" and m:
                question = "".join(prev["source"])
                starts = [q.start() for q in re.finditer(r"\*\*\d+ ·", question)]
                yield path.name, question[starts[-1]:] if starts else question, m[1], m[2]


def test_every_exercise_that_asks_why_has_a_worked_explanation():
    import re

    asked = [(nb, mod, name) for nb, question, mod, name in _exercise_cells()
             if re.search(r"\b(explain|why)\b", question, re.IGNORECASE)]
    assert len(asked) >= 12
    for nb, mod, name in asked:
        explain = getattr(importlib.import_module(f"gemmlab.course.exercises.{mod}"), f"explain_{name}", None)
        assert explain is not None, f"{nb}: exercise {name} asks why, but {mod}.explain_{name} is missing"
        text = explain()
        assert isinstance(text, str) and len(text) > 200, (nb, name)


def test_the_exercises_say_where_the_solutions_are_and_how_to_read_them_from_the_notebook():
    """The path named is the real one (a notebook started on notebooks/ cannot browse to it), and the notebook
    says how to print a solution instead."""
    import json
    import re

    from gemmlab.figures import REPO_ROOT

    for path in sorted((REPO_ROOT / "notebooks").glob("*.ipynb")):
        text = "\n".join("".join(c["source"]) for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "markdown")
        named = re.findall(r"`([\w/]*exercises/ch\d\d\.py)`", text)
        assert named, f"{path.name} does not say where its solutions are"
        for rel in named:
            assert (REPO_ROOT / rel).is_file(), f"{path.name} names {rel}, which does not exist"
        ch = re.search(r"ch\d\d", named[0])[0]
        assert f"show_source({ch}.solution_<name>)" in text and f"{ch}.explain_<name>()" in text, path.name


# ---------------------------------------------------------------- answers as a reader types them


@pytest.fixture
def cached_solutions(monkeypatch):
    """Each solution computed once for the tests below (some compile kernels or run models)."""
    import functools

    for mod, name in PAIRS:
        monkeypatch.setattr(mod, f"solution_{name}", functools.cache(getattr(mod, f"solution_{name}")))


def _solutions_as(kind):
    """Every (checker, solution) pair whose solution can be written as ``kind``: numpy/torch scalars, lists, arrays."""
    import numpy as np
    import torch

    out = []
    for mod, name in PAIRS:
        sol = getattr(mod, f"solution_{name}")()
        if kind == "numpy" and isinstance(sol, (int, float)) and not isinstance(sol, bool):
            out.append((mod, name, np.float32(sol) if isinstance(sol, float) else np.int64(sol)))
        elif kind == "torch" and isinstance(sol, int) and not isinstance(sol, bool) and abs(sol) < 2 ** 62:
            out.append((mod, name, torch.tensor(sol)))
        elif kind == "list" and isinstance(sol, tuple):
            out.append((mod, name, list(sol)))
        elif kind == "array" and isinstance(sol, tuple) and all(isinstance(v, int) for v in sol):
            out.append((mod, name, np.array(sol)))
    return out


@pytest.mark.parametrize("kind", ["numpy", "torch", "list", "array"])
def test_right_answers_of_any_numeric_type_are_right(kind, capsys, cached_solutions):
    cases = _solutions_as(kind)
    assert cases, kind
    for mod, name, answer in cases:
        assert getattr(mod, f"check_{name}")(answer), (mod.__name__, name, answer)
        assert "right" in capsys.readouterr().out


def test_unrounded_answers_are_read_as_the_exercise_asks_and_said_so(capsys):
    from gemmlab.course.exercises import ch00, ch10, ch11

    exact = ch11.solution_stock_weight_ratio()  # 3.56: "two decimals"
    assert ch11.check_stock_weight_ratio(3.5556)
    assert "3.5556 rounded to 2 decimals" in capsys.readouterr().out
    assert not ch11.check_stock_weight_ratio(3.6) and "not yet" in capsys.readouterr().out
    assert exact == 3.56
    assert not ch00.check_decode_roof(76.2046)  # a whole number is asked for: say so, give nothing away
    out = capsys.readouterr().out
    assert "is not a whole number" in out and "76" not in out.replace("76.2046", "")
    assert ch00.check_decode_roof(76.0)
    assert ch10.check_held_clock_effect(ch10.solution_held_clock_effect() + 0.001)


def test_checkers_survive_any_kind_of_answer(capsys, cached_solutions):
    import numpy as np
    import torch

    from gemmlab.course.exercises import ch06, ch08

    odd = [2, 2.5, "x", [], (), {}, set(), np.array([1, 2]), torch.zeros(3), object(), float("nan"), b"ac"]
    for mod, name in PAIRS:
        for answer in odd:
            assert getattr(mod, f"check_{name}")(answer) in (True, False)
    capsys.readouterr()
    assert not ch08.check_fence_instructions(2)
    assert ch08.check_fence_instructions(list(ch08.solution_fence_instructions()))
    for answer in ("ac", "a, c", "a;c", "A C", ["c", "a"], {"a", "c"}):
        assert ch06.check_fence_points(answer), answer


def test_a_checker_cell_shows_no_trailing_value():
    """In Jupyter a checker's result is displayed as nothing (the printed line is the whole output)."""
    from gemmlab.course.exercises import Verdict, ch00

    v = ch00.check_ridge_h200(None)
    assert isinstance(v, Verdict) and v._ipython_display_() is None and not v
    from IPython.core.formatters import DisplayFormatter

    assert DisplayFormatter().format(v) == ({}, {})
