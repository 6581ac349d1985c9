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
    assert check(solution()) is True
    assert "right" in capsys.readouterr().out
    assert check(None) is False and "no answer yet" in capsys.readouterr().out
    assert check("certainly not") is False and "not yet" in capsys.readouterr().out


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
    assert ch06.check_fence_points(["c", "a"]) is True and ch06.check_fence_points("abc") is False
    assert ch06.solution_one_warpgroup_128x256() > 255
