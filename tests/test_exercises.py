"""Every exercise's worked solution passes its own checker, and the checkers say wrong answers are wrong."""
import importlib
import pkgutil

import pytest

import gemmlab.exercises as ex

MODULES = [importlib.import_module(f"gemmlab.exercises.{m.name}") for m in pkgutil.iter_modules(ex.__path__)]
PAIRS = [(mod, name[len("check_"):]) for mod in MODULES for name in dir(mod) if name.startswith("check_")]


@pytest.mark.parametrize("mod,name", PAIRS, ids=[f"{m.__name__.split('.')[-1]}.{n}" for m, n in PAIRS])
def test_solution_passes_and_wrong_answers_fail(mod, name, capsys):
    check, solution = getattr(mod, f"check_{name}"), getattr(mod, f"solution_{name}")
    assert check(solution()) is True
    assert "right" in capsys.readouterr().out
    assert check(None) is False and "no answer yet" in capsys.readouterr().out
    assert check("certainly not") is False and "not yet" in capsys.readouterr().out


def test_chapter07_solutions_by_hand():
    from gemmlab.exercises import ch07
    from gemmlab.family.configs import Sm90Config
    from gemmlab.family.heuristic_sm90 import make_config, predict
    from gemmlab.family.problem import GemmProblem

    p = GemmProblem(2048, 2112, 7168)
    c = predict(p, Sm90Config(tile_n=256, stages=4, cluster=(2, 1)))
    assert (c.units, c.waves) == ch07.solution_units_and_waves() == (72, 2)
    assert ch07.solution_slices() == (14, 8)
    p = GemmProblem(4096, 576, 7168)
    assert round(predict(p, make_config(p, 128, 144)).l2_us * 7e12 / 1e12) == ch07.solution_l2_megabytes() == 367
