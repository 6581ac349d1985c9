"""No silent wrong answers: bad arguments get a TypeError/ValueError that names the argument and the rule.

Each case here once returned a wrong result or a raw Python/DSL error. Numpy integers are
accepted wherever the rule is "an int" (they are what indexing numpy arrays gives back).
"""
import numpy as np
import pytest

from gemmlab import banks, ldmatrix as lm, swizzle as swz, tma, tmem
from gemmlab.family import heuristic_sm90 as h
from gemmlab.family.configs import Sm90Config
from gemmlab.family.problem import GemmProblem

# --- swizzle_offset -------------------------------------------------------------------------------


@pytest.mark.parametrize("offset,exc,words", [
    (np.array([0, 16, -128]), ValueError, "byte_offset must be non-negative; got an entry of -128"),
    (-16, ValueError, "byte_offset must be non-negative; got -16"),
    (np.int64(-16), ValueError, "byte_offset must be non-negative"),
    (1.5, TypeError, "byte_offset must be an int or an integer numpy array; got float"),
    (np.array([0.0, 16.0]), TypeError, "integer numpy array; got dtype float64"),
    (True, TypeError, "got bool"),
    ("128", TypeError, "got str"),
])
def test_swizzle_offset_rejects(offset, exc, words):
    with pytest.raises(exc) as e:
        swz.swizzle_offset("128B", offset)
    assert words in str(e.value)


def test_swizzle_offset_accepts_numpy_integers():
    assert swz.swizzle_offset("128B", np.int64(128)) == swz.swizzle_offset("128B", 128) == 144
    assert swz.swizzle_offset("128B", np.uint32(128)) == 144
    out = swz.swizzle_offset("64B", np.arange(0, 512, 16, dtype=np.int32))
    assert sorted(out.tolist()) == list(range(0, 512, 16))   # a permutation of the chunks
    assert swz.swizzle_offset("128B", np.array([], dtype=np.int64)).size == 0


# --- banks ----------------------------------------------------------------------------------------


def test_bank_of_rejects_negative_and_non_integers():
    with pytest.raises(ValueError, match="byte_address must be a non-negative byte address; got -4"):
        banks.bank_of(-4)
    with pytest.raises(TypeError, match="byte_address must be an int"):
        banks.bank_of(4.0)
    assert banks.bank_of(np.int64(132)) == banks.bank_of(132) == 1


def test_bank_addresses_are_whole_and_non_negative():
    with pytest.raises(TypeError, match=r"addresses\[1\] must be an int"):
        banks.wavefronts([0, 4.5])          # used to be truncated to 4 silently
    with pytest.raises(ValueError, match=r"addresses\[0\] must be a non-negative byte address"):
        banks.wavefronts([-4])
    with pytest.raises(TypeError, match="addresses must be a sequence"):
        banks.wavefronts(128)
    assert banks.wavefronts(np.arange(0, 128, 4)) == 1   # a numpy array of lane addresses


# --- tensor memory --------------------------------------------------------------------------------


@pytest.mark.parametrize("addr,words", [
    (128 << 16, "lane 128"),            # one lane past the last
    ((5 << 16) | 512, "column 512"),    # one column past the last
    (0xFFFFFFFF, "lane 65535"),
])
def test_tmem_addr_fields_rejects_cells_that_do_not_exist(addr, words):
    with pytest.raises(ValueError) as e:
        tmem.tmem_addr_fields(addr)
    assert "lane 0..127 in bits 31-16 and a column 0..511" in str(e.value) and words in str(e.value)


def test_tmem_addr_fields_roundtrip_at_the_edges():
    for lane, col in ((0, 0), (127, 511), (64, 32)):
        assert tmem.tmem_addr_fields(tmem.tmem_addr(lane, col)) == (lane, col)


def test_registers_to_tile_checks_num_before_using_it():
    with pytest.raises(ValueError, match="num must be one of"):
        tmem.registers_to_tile(np.zeros((128, 8)), 0)
    with pytest.raises(ValueError, match="regs must be a 2-D array"):
        tmem.registers_to_tile(np.zeros(128), 4)
    with pytest.raises(ValueError, match="num must be one of"):
        tmem.accumulator_coords(0, 3)


# --- tensor maps ----------------------------------------------------------------------------------


@pytest.mark.parametrize("kw,exc,words", [
    (dict(shape=(0, 64)), ValueError, "src's shape[0] must be >= 1; got 0"),
    (dict(shape=(64, -64)), ValueError, "src's shape[1] must be >= 1; got -64"),
    (dict(shape=(64.0, 64)), TypeError, "src's shape[0] must be an int; got float"),
    (dict(shape=(64, 128), strides=(64, 1)), ValueError, "row stride must be >= its row length (128 elements), or rows overlap"),
    (dict(shape=(64, 64), strides=(0, 1)), ValueError, "rows overlap"),
    (dict(shape=(64, 64), strides=(-64, 1)), ValueError, "src's strides[0] must be >= 0"),
    (dict(shape=(64, 64), strides=(64,)), ValueError, "strides must be a pair"),
    (dict(shape=(64, 64), box=(0, 64)), ValueError, "box[0] must be between 1 and 256"),
    (dict(shape=(64, 64), box=(64.0, 64)), TypeError, "box[0] must be an int"),
])
def test_describe_tensor_map_rejects(kw, exc, words):
    args = dict(shape=(100, 200), dtype="float16", box=(64, 64), swizzle="128B")
    args.update(kw)
    with pytest.raises(exc) as e:
        tma.describe_tensor_map(args.pop("shape"), args.pop("dtype"), args.pop("box"), **args)
    assert words in str(e.value)


def test_describe_tensor_map_accepts_numpy_integers_and_prints_plain_ints():
    want = tma.describe_tensor_map((100, 200), "float16", (64, 64))
    got = tma.describe_tensor_map((np.int64(100), np.int32(200)), "float16", (np.int64(64), 64),
                                  strides=(np.int64(200), np.int64(1)))
    assert got == want
    assert "np." not in tma.format_tensor_map(got)
    # a padded row stride (rows apart by more than their length) is fine
    assert tma.describe_tensor_map((100, 200), "float16", (64, 64), strides=(256, 1))["globalStrides"] == (512,)


# --- ldmatrix / stmatrix model --------------------------------------------------------------------


SMEM = np.arange(256, dtype=np.uint16)   # 32 rows of 8 elements


@pytest.mark.parametrize("rows,words", [
    (10**6, "one row per lane (32 entries)"),
    (np.arange(16), "one row per lane (32 entries)"),
    (np.full(32, 32), "lane 0 has 32"),
    (np.r_[np.arange(7), -1, np.arange(24)], "lane 7 has -1"),
    (np.arange(32) + 0.5, "integer array"),
])
def test_ldmatrix_model_rejects_rows_outside_shared_memory(rows, words):
    with pytest.raises(ValueError) as e:
        lm.ldmatrix_model(SMEM, rows, 1, False)
    assert words in str(e.value)


def test_ldmatrix_model_checks_only_the_lanes_it_reads_and_the_smem():
    rows = np.arange(32)
    rows[8:] = 10**6        # x1 reads lanes 0-7 only: the rest are ignored, as on the hardware
    assert lm.ldmatrix_model(SMEM, rows, 1, False).shape == (32, 1)
    with pytest.raises(ValueError, match="lane 8 has 1000000"):
        lm.ldmatrix_model(SMEM, rows, 2, False)
    with pytest.raises(ValueError, match="smem must be a 1-D integer array of whole 8-element rows"):
        lm.ldmatrix_model(SMEM[:100], np.zeros(32, dtype=int), 1, False)
    with pytest.raises(ValueError, match="16-bit values"):
        lm.ldmatrix_model(SMEM.astype(np.int64) - 1, np.zeros(32, dtype=int), 1, False)


def test_stmatrix_model_rejects_bad_registers_and_rows():
    rows = lm.LANE_ROWS
    with pytest.raises(ValueError, match=r"regs must be an integer array of shape \(32, 2\)"):
        lm.stmatrix_model(np.zeros((32, 1), dtype=np.uint32), rows, 2, False, lm.poisoned_smem())
    with pytest.raises(ValueError, match="32-bit values"):
        lm.stmatrix_model(np.full((32, 1), 2**33), rows, 1, False, lm.poisoned_smem())
    with pytest.raises(ValueError, match="lane 0 has 99"):
        lm.stmatrix_model(np.zeros((32, 1), dtype=np.uint32), np.full(32, 99), 1, False, lm.poisoned_smem())


# --- the Hopper heuristic -------------------------------------------------------------------------


def test_choose_on_one_sm_never_returns_a_cluster():
    for shape in ((4096, 4096, 4096), (4096, 576, 7168), (64, 2112, 7168)):
        assert h.choose(GemmProblem(*shape), 1).cluster_size == 1


@pytest.mark.parametrize("num_sms,exc,words", [
    (0, ValueError, "num_sms must be >= 1; got 0"),
    (-132, ValueError, "num_sms must be >= 1"),
    (1.5, TypeError, "num_sms must be an int; got float"),
    ([132], TypeError, "num_sms must be an int; got list"),   # used to be lru_cache's "unhashable type"
    (True, TypeError, "got bool"),
])
def test_choose_rejects_bad_num_sms(num_sms, exc, words):
    with pytest.raises(exc) as e:
        h.choose(GemmProblem(256, 256, 256), num_sms)
    assert words in str(e.value)


def test_choose_and_predict_accept_numpy_integers():
    p = GemmProblem(4096, 4096, 4096)
    assert h.choose(p, np.int64(132)) == h.choose(p, 132)
    cfg = Sm90Config(cluster=(2, 1))
    assert h.predict(p, cfg, np.int32(132)) == h.predict(p, cfg, 132)


def test_predict_rejects_a_cluster_larger_than_the_machine():
    with pytest.raises(ValueError, match=r"num_sms must be >= cfg's cluster size \(2\)"):
        h.predict(GemmProblem(4096, 4096, 4096), Sm90Config(cluster=(2, 1)), 1)
    with pytest.raises(TypeError, match="cfg must be an Sm90Config"):
        h.predict(GemmProblem(4096, 4096, 4096), "128x256", 132)
    with pytest.raises(TypeError, match="problem must be a GemmProblem"):
        h.predict((4096, 4096, 4096), Sm90Config(), 132)
    with pytest.raises(TypeError, match="model must be a MachineModel"):
        h.choose(GemmProblem(4096, 4096, 4096), 132, model="h100")


# --- compile_gemm ---------------------------------------------------------------------------------


@pytest.mark.parametrize("kw,exc,words", [
    (dict(target="sm_100a"), ValueError, "needs target sm_90a"),
    (dict(target="sm_80"), ValueError, "target must be one of sm_90a, sm_100a"),
    (dict(cfg=(128, 256)), TypeError, "cfg must be an Sm90Config"),
    (dict(b_major="m"), ValueError, "b_major must be one of"),
    (dict(tvm_ffi="yes"), TypeError, "tvm_ffi must be a bool"),
])
def test_compile_gemm_rejects_before_the_compiler(kw, exc, words):
    from gemmlab.kernels import gemm_sm90

    with pytest.raises(exc) as e:
        gemm_sm90.compile_gemm(**kw)
    assert words in str(e.value) and "\x1b[" not in str(e.value)   # our message, not the DSL's coloured one


# --- numpy integers through gemmlab.checks.check_int ----------------------------------------------


def _check_int_accepts_numpy() -> bool:
    from gemmlab.checks import check_int

    try:
        check_int("x", np.int64(1))
    except TypeError:
        return False
    return True


@pytest.mark.xfail(not _check_int_accepts_numpy(), strict=True,
                   reason="gemmlab.checks.check_int rejects numpy integers (it tests isinstance(value, int))")
@pytest.mark.parametrize("call", [
    lambda: tmem.tmem_addr(np.int64(5), np.int64(7)) == (5 << 16) | 7,
    lambda: tmem.tmem_addr_fields(np.uint32(5 << 16)) == (5, 0),
    lambda: swz.tile_layout("128B", np.int64(8), 128).shape == (8, 8, 2),
    lambda: banks.strided_addresses(np.int64(2))[1] == 8,
    lambda: GemmProblem(np.int64(128), 256, 512).m == 128,
])
def test_numpy_integers_accepted_where_ints_are(call):
    assert call()


@pytest.mark.parametrize("kw,words", [
    (dict(cluster=(3, 1)), "cluster must be one of"),
    (dict(cluster=(4, 4)), "cluster must be one of"),  # 16 CTAs: past the portable 8
    (dict(tile_m=64, tile_n=64, stages=8, cluster=(1, 8)), "cluster must be one of"),
    (dict(tile_m=128, tile_n=112, stages=6, cluster=(4, 1), swap_ab=True, epi_n=16), "tile_n of 32"),
    (dict(tile_m=128, tile_n=104, stages=6, cluster=(2, 2), swap_ab=True, epi_n=8), "tile_n of 16"),
])
def test_wide_clusters_need_tiles_that_cut_into_whole_atoms(kw, words):
    # each of CM CTAs loads tile_n / CM rows of the B' panel: 112 / 4 = 28 and 104 / 2 = 52 are not whole 8-row atoms
    # (a pair keeps the rule it always had: a 104-wide token tile still pairs along M' in a 1-D cluster)
    with pytest.raises(ValueError, match=words):
        Sm90Config(**kw)


def test_persistent_grids_of_wide_clusters_fit_the_gpcs():
    # a 132-SM GH100 runs 66 pairs but only 30 clusters of 4 and 15 of 8 at once (120 SMs)
    assert Sm90Config(cluster=(2, 1)).clusters_on(132) == 66
    assert Sm90Config(tile_n=128, stages=6, cluster=(2, 2)).clusters_on(132) == 30
    assert Sm90Config(tile_m=64, tile_n=64, stages=8, cluster=(4, 2)).clusters_on(132) == 15
    assert Sm90Config(tile_m=64, tile_n=64, stages=8, cluster=(1, 4)).clusters_on(16) == 4  # no table: SMs // 4
    assert Sm90Config(tile_m=64, tile_n=64, stages=8, cluster=(4, 2)).clusters_on(6) == 1  # at least one


def test_the_heuristic_keeps_to_pairs():
    # clusters of 4 and 8 were no faster on the weakest shapes (H200, gemm_family_clusters.json): never picked
    for shape in ((256, 2112, 7168), (1024, 576, 7168), (64, 4096, 7168), (640, 3584, 18944), (4096, 4096, 4096)):
        assert h.choose(GemmProblem(*shape), 132).cluster_size <= 2
