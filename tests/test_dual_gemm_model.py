"""Chapter 11, CPU tier: the SM100 dual GEMM's data flow model reproduces the reference and catches bugs."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")

from gemmlab import dual_gemm_model as dm  # noqa: E402
from gemmlab import nvfp4 as fp4  # noqa: E402
from gemmlab.family.configs import TMEM_COLUMNS  # noqa: E402
from gemmlab.hardware import SMEM_PER_BLOCK  # noqa: E402

# (M, N, K): partial M and N tiles, several k-blocks, more tiles than CTAs; 400 columns give tile_n 192
# and 64 an odd tile that starts in the middle of a 128-row scale atom.
SHAPES = [(200, 136, 768), (128, 128, 256), (384, 400, 512), (64, 96, 1024)]


@pytest.fixture(scope="module")
def problems():
    return {s: fp4.generate(*s, seed=sum(s)) for s in SHAPES}


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("tile_n", dm.TILE_N_CHOICES)
def test_model_matches_reference(problems, shape, tile_n):
    ops = problems[shape]
    res = dm.check_model(ops, tile_n=tile_n, num_ctas=2)
    assert res.ok, str(res)


def test_model_writes_every_element_and_every_tile_once(problems):
    ops = problems[(384, 400, 512)]
    run = dm.run_model(ops, tile_n=128, num_ctas=3)
    assert not np.isnan(run.c.astype(np.float32)).any()
    tiles = [t for lst in run.cta_tiles for t in lst]
    assert sorted(tiles) == [(i, j) for i in range(3) for j in range(4)]
    assert len(run.cta_tiles) == 3 and all(len(lst) == 4 for lst in run.cta_tiles)
    # 2 GEMMs x 4 MMAs per k-block x 2 k-blocks per tile x 12 tiles
    assert run.mmas == 2 * 4 * 2 * 12


def test_model_reads_the_permuted_scales(problems):
    # Given the operands object, the model computes from the permuted tensors alone: spoil the plain
    # copies after the reference is taken and the result does not change.
    ops = problems[(200, 136, 768)]
    ref = fp4.reference(*ops.inputs())[..., 0]
    spoilt = fp4.DualGemmOperands(*ops.inputs()[:3], *(torch.zeros_like(s.float()).to(s.dtype)
                                                       for s in (ops.sfa, ops.sfb1, ops.sfb2)),
                                  ops.sfa_perm, ops.sfb1_perm, ops.sfb2_perm, ops.c)
    run = dm.run_model(spoilt, tile_n=64)
    assert fp4.check_close(torch.from_numpy(run.c), ref).ok
    # one scale changed in the permuted tensor changes exactly that row's outputs
    perm = ops.sfa_perm.clone()
    perm[fp4.permuted_index(37, 5) + (0,)] = torch.tensor(448.0).to(torch.float8_e4m3fn)
    changed = fp4.DualGemmOperands(*ops.inputs(), perm, ops.sfb1_perm, ops.sfb2_perm, ops.c)
    run2 = dm.run_model(changed, tile_n=64)
    diff = np.argwhere(run.c != run2.c)
    assert set(diff[:, 0].tolist()) == {37}


def test_model_rejects_a_wrongly_shaped_permuted_tensor(problems):
    ops = problems[(128, 128, 256)]
    bad = fp4.DualGemmOperands(*ops.inputs(), ops.sfa, ops.sfb1_perm, ops.sfb2_perm, ops.c)
    with pytest.raises(ValueError, match="sfa_perm must have the permuted shape"):
        dm.run_model(bad)


BUG_CASES = [b for b in dm.BUGS if b is not None and b != "sfb_not_shifted"]


@pytest.mark.parametrize("bug", BUG_CASES)
@pytest.mark.parametrize("tile_n", [64, 128])
def test_each_bug_fails_the_check(problems, bug, tile_n):
    res = dm.check_model(problems[(200, 136, 768)], tile_n=tile_n, num_ctas=2, bug=bug)
    assert not res.ok, f"{bug} went unnoticed"
    assert res.bad > 1000  # not a rounding accident: a large part of C is wrong


@pytest.mark.parametrize("tile_n", [64, 192])
def test_sfb_shift_matters_only_for_tiles_that_start_mid_atom(problems, tile_n):
    ops = problems[(384, 400, 512)]
    assert not dm.check_model(ops, tile_n=tile_n, bug="sfb_not_shifted").ok
    assert dm.check_model(problems[(200, 136, 768)], tile_n=128, bug="sfb_not_shifted").ok  # nothing to shift


def test_no_accumulate_reset_is_caught_even_for_one_tile_per_cta(problems):
    # One tile, one CTA: the first MMA must overwrite TMEM's garbage.
    res = dm.check_model(problems[(128, 128, 256)], tile_n=128, num_ctas=1, bug="no_accumulate_reset")
    assert not res.ok


def test_reset_every_kblock_needs_two_kblocks(problems):
    # With a single k-block, resetting at every k-block is the same as resetting once: the check passes.
    assert dm.check_model(problems[(128, 128, 256)], tile_n=128, bug="reset_every_kblock").ok
    assert not dm.check_model(problems[(64, 96, 1024)], tile_n=64, bug="reset_every_kblock").ok


def test_model_rejects_bad_arguments(problems):
    ops = problems[(128, 128, 256)]
    with pytest.raises(ValueError, match="bug must be one of"):
        dm.run_model(ops, bug="typo")
    with pytest.raises(ValueError, match="tile_n must be a multiple of 16"):
        dm.run_model(ops, tile_n=100)
    with pytest.raises(ValueError, match="TMEM columns"):
        dm.run_model(ops, tile_n=256)
    a, b1, b2, sfa, sfb1, sfb2 = ops.inputs()
    with pytest.raises(TypeError, match="sfa must have dtype float8_e4m3fn"):
        dm.run_model((a, b1, b2, sfa.float(), sfb1, sfb2))


# ---------------------------------------------------------------- TMEM placement of the scales


def test_tcgen05_cp_places_atom_lines_in_every_subpartition():
    cta = dm._Cta(np.random.default_rng(0))
    atoms = np.arange(4 * 512, dtype=np.int64).reshape(1, 4, 512) % 251
    atoms = atoms.astype(np.uint8)
    dm._copy_sf_to_tmem(cta, atoms, 300, None)
    for q in range(4):
        for r in (0, 17, 31):
            for s in range(4):
                for c in range(4):
                    assert cta.bytes[q * 32 + r, 300 + 4 * s + c].tolist() == atoms[0, s, r * 16 + c * 4:r * 16 + c * 4 + 4].tolist()


def test_mma_reads_the_scales_of_its_own_row():
    # Fill the SFA region through the permuted layout, then check what the MMA of each step reads for rows
    # 0, 31, 32, 127: the 4 scales of that row for K values 64 s .. 64 s + 63.
    sf = torch.arange(128 * 16, dtype=torch.int64).remainder(120).add(1).to(torch.uint8).view(128, 16, 1)
    flat = fp4.blocked_bytes(fp4.permute_scales(sf.view(torch.float8_e4m3fn))).numpy()
    atoms = dm._sf_atoms(flat, 128, 16, 0, 0, 1)
    cta = dm._Cta(np.random.default_rng(0))
    dm._copy_sf_to_tmem(cta, atoms, 256, None)
    plain = sf[..., 0].numpy()
    for s in range(4):
        read = dm._mma_scales_a(cta, 256, s, None)
        for i in (0, 31, 32, 127):
            assert read[i].tolist() == plain[i, 4 * s:4 * s + 4].tolist()
        wrong = dm._mma_scales_a(cta, 256, s, "wrong_scale_index")
        assert wrong[32].tolist() == plain[0, 4 * s:4 * s + 4].tolist()


# ---------------------------------------------------------------- budget


def test_tmem_columns_hand_worked():
    assert dm.tmem_columns(128) == dict(acc1=0, acc2=128, sfa=256, sfb1=272, sfb2=288, used=304, alloc=512)
    assert dm.tmem_columns(64) == dict(acc1=0, acc2=64, sfa=128, sfb1=144, sfb2=160, used=176, alloc=256)
    assert dm.tmem_columns(192)["sfb2"] == 384 + 16 + 32 and dm.tmem_columns(192)["used"] == 464
    assert dm.tmem_columns(256)["used"] == 592 > TMEM_COLUMNS  # two 256-column accumulators leave no room


def test_budget_hand_worked():
    b = dm.budget(128, 3)
    assert b.smem_per_stage == dict(A=16384, B1=16384, B2=16384, SFA=2048, SFB1=2048, SFB2=2048)
    assert b.smem_stage_bytes == 55296
    assert b.smem_total == 3 * 55296 + 2 * 128 * 32 * 2 + 1024
    assert b.fits and "does NOT fit" not in b.describe()
    assert not dm.budget(128, 4).fits  # 4 x 54 KiB + C staging > 227 KiB
    assert dm.budget(64, 1).smem_per_stage["SFB1"] == 2048  # scales of B rounded up to a 128-row atom


@pytest.mark.parametrize("tile_n, stages", [(64, 5), (128, 3), (192, 2), (256, 0)])
def test_max_stages(tile_n, stages):
    assert dm.max_stages(tile_n) == stages
    if stages:
        assert dm.budget(tile_n, stages).smem_total <= SMEM_PER_BLOCK < dm.budget(tile_n, stages + 1).smem_total


def test_double_buffered_accumulators_fit_only_for_small_tiles():
    assert dm.budget(64, 2, acc_stages=2).fits
    assert not dm.budget(128, 2, acc_stages=2).fits
    assert dm.max_stages(128, acc_stages=2) == 0


def test_budget_rejects_bad_arguments():
    with pytest.raises(ValueError, match="tile_n must be a multiple of 16"):
        dm.budget(100, 2)
    with pytest.raises(ValueError, match="ab_stages must be >= 1"):
        dm.budget(128, 0)
