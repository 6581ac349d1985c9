"""Chapter 01: the ldmatrix / stmatrix model, its PTX, and the hardware against it."""
import numpy as np
import pytest

from gemmlab import ldmatrix as lm
from gemmlab.compile import ptx_lines


def test_lane5_holds_row1_cols_2_3():
    assert lm.fragment_position(5, 0, False) == (1, 2)
    assert lm.fragment_position(5, 1, False) == (1, 3)
    # .trans: lane 5 holds column 1, rows 2 and 3
    assert lm.fragment_position(5, 0, True) == (2, 1)
    assert lm.fragment_position(5, 1, True) == (3, 1)


def test_owners_cover_each_element_once():
    for num in (1, 2, 4):
        for trans in (False, True):
            own = lm.owners(num, trans)
            for m in range(num):
                pairs = {(int(l), int(h)) for l, _, h in own[m].reshape(-1, 3)}
                assert len(pairs) == 64  # 32 lanes x 2 halves, each exactly once
                assert (own[m, ..., 1] == m).all()  # matrix m lands in register m


def test_address_lanes():
    assert lm.address_lane(0, 0) == 0
    assert lm.address_lane(1, 0) == 8
    assert lm.address_lane(3, 7) == 31


def test_ldmatrix_model_hand_case():
    smem = np.arange(256, dtype=np.uint16)
    rows = np.arange(32)  # lane l points at row l: matrix m = elements 64m .. 64m+63
    regs = lm.ldmatrix_model(smem, rows, 1, False)
    # lane 5: row 1, cols 2,3 of matrix 0 -> elements 10 and 11
    assert regs[5, 0] == 10 | (11 << 16)
    regs = lm.ldmatrix_model(smem, rows, 4, False)
    assert regs[0, 3] == (192 | (193 << 16))
    # .trans: lane 5 holds column 1, rows 2,3 -> elements 2*8+1 = 17 and 25
    regs = lm.ldmatrix_model(smem, rows, 1, True)
    assert regs[5, 0] == 17 | (25 << 16)


def test_ldmatrix_model_follows_row_addresses():
    smem = np.arange(256, dtype=np.uint16)
    rows = np.arange(32)[::-1].copy()  # lane 0 points at the last row
    regs = lm.ldmatrix_model(smem, rows, 1, False)
    # lane 0: row 0 of matrix 0 = smem row 31 -> elements 248, 249
    assert regs[0, 0] == 248 | (249 << 16)


def test_x1_ignores_lanes_8_to_31():
    smem = np.arange(256, dtype=np.uint16)
    rows = lm.LANE_ROWS.copy()
    a = lm.ldmatrix_model(smem, rows, 1, False)
    rows[8:] = 0
    assert (lm.ldmatrix_model(smem, rows, 1, False) == a).all()


@pytest.mark.parametrize("num", [1, 2, 4])
@pytest.mark.parametrize("trans", [False, True])
def test_stmatrix_inverts_ldmatrix(num, trans):
    rng = np.random.default_rng(num + 10 * trans)
    smem = rng.integers(0, 2**16, 256, dtype=np.uint16)
    rows = lm.LANE_ROWS
    regs = lm.ldmatrix_model(smem, rows, num, trans)
    back = lm.stmatrix_model(regs, rows, num, trans, lm.poisoned_smem())
    written = sorted(int(rows[l]) for l in range(8 * num))
    for r in range(32):
        piece = back[8 * r:8 * r + 8]
        if r in written:
            assert (piece == smem[8 * r:8 * r + 8]).all()
        else:
            assert (piece == lm.POISON16).all()


def test_model_bad_args():
    with pytest.raises(ValueError, match="num"):
        lm.owners(3, False)
    with pytest.raises(TypeError, match="trans"):
        lm.owners(4, 1)
    with pytest.raises(ValueError, match="tile"):
        lm.run_ldmatrix(4, False, tile=np.zeros(10, dtype=np.uint16))
    with pytest.raises(ValueError, match="regs"):
        lm.run_stmatrix(4, False, regs=np.zeros((32, 2), dtype=np.uint32))


def test_lane_rows_is_a_permutation():
    assert sorted(lm.LANE_ROWS.tolist()) == list(range(32))


@pytest.mark.parametrize("num", [1, 2, 4])
@pytest.mark.parametrize("trans", [False, True])
def test_ptx_instructions(num, trans):
    t = ".trans" if trans else ""
    ld = ptx_lines(lm.compile_ldmatrix("sm_90a", num, trans), r"^ldmatrix\.")
    st = ptx_lines(lm.compile_stmatrix("sm_90a", num, trans), r"^stmatrix\.")
    assert [x.split()[0] for x in ld] == [f"ldmatrix.sync.aligned.m8n8.x{num}{t}.shared.b16"]
    assert [x.split()[0] for x in st] == [f"stmatrix.sync.aligned.m8n8.x{num}{t}.shared.b16"]
    # num 32-bit registers and one 32-bit (shared-window) address register
    assert ld[0].count("%r") == num + 1


def test_dsl_atom_emits_the_same_instruction():
    lines = ptx_lines(lm.compile_dsl_ldmatrix("sm_90a"), r"^ldmatrix\.")
    assert [x.split()[0] for x in lines] == ["ldmatrix.sync.aligned.m8n8.x4.shared.b16"]


def test_fragment_figure_data():
    path, plain, trans = lm.fragment_figure(num=2, name="01_test_ldmatrix_fragments")
    assert path.exists()
    assert tuple(plain[1, 1, 2]) == (5, 1, 0)  # matrix 1, row 1, col 2: lane 5, reg 1, low half
    assert tuple(trans[0, 3, 1]) == (5, 0, 1)  # .trans: row 3, col 1: lane 5, high half
    path.unlink()


@pytest.mark.gpu
@pytest.mark.parametrize("num", [1, 2, 4])
@pytest.mark.parametrize("trans", [False, True])
def test_ldmatrix_on_gpu_matches_model(num, trans):
    for tile in (None, np.random.default_rng().integers(0, 2**16, 256, dtype=np.uint16)):
        ref_tile = np.arange(256, dtype=np.uint16) if tile is None else tile
        got = lm.run_ldmatrix(num, trans, tile)
        want = lm.ldmatrix_model(ref_tile, lm.LANE_ROWS, num, trans)
        bad = np.argwhere(got != want)
        assert bad.size == 0, f"{len(bad)} registers differ, first (lane, reg) {tuple(bad[0])}: " \
                              f"got {got[tuple(bad[0])]:#010x} want {want[tuple(bad[0])]:#010x}"


@pytest.mark.gpu
@pytest.mark.parametrize("num", [1, 2, 4])
@pytest.mark.parametrize("trans", [False, True])
def test_stmatrix_on_gpu_matches_model(num, trans):
    for regs in (None, np.random.default_rng().integers(0, 2**32, (32, num), dtype=np.uint32)):
        ref = lm.default_registers(num) if regs is None else regs
        got = lm.run_stmatrix(num, trans, regs)
        want = lm.stmatrix_model(ref, lm.LANE_ROWS, num, trans, lm.poisoned_smem())
        bad = np.flatnonzero(got != want)
        assert bad.size == 0, f"{bad.size} elements differ, first at {bad[0]}: got {got[bad[0]]:#06x} want {want[bad[0]]:#06x}"


@pytest.mark.gpu
def test_dsl_ldmatrix_round_trip():
    import torch

    tile = torch.randn(16, 16, dtype=torch.float16, device="cuda")
    out = lm.run_dsl_ldmatrix(tile)
    assert torch.equal(out.view(torch.int16), tile.view(torch.int16))
