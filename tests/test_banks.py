"""Chapter 01: the bank-conflict model (the GPU measurement lives in the notebook and benchmarks)."""
import math

import pytest

from gemmlab import banks
from gemmlab.compile import ptx_lines


def test_bank_of():
    assert banks.bank_of(0) == 0
    assert banks.bank_of(4) == 1
    assert banks.bank_of(128) == 0
    assert banks.bank_of(127) == 31


@pytest.mark.parametrize("stride", range(1, 65))
def test_4_byte_stride_is_gcd_way(stride):
    assert banks.conflict_degree(banks.strided_addresses(stride, 4), 4) == math.gcd(stride, 32)


def test_hand_cases():
    assert banks.wavefronts(banks.strided_addresses(1, 4), 4) == 1
    assert banks.wavefronts(banks.strided_addresses(2, 4), 4) == 2
    assert banks.wavefronts(banks.strided_addresses(32, 4), 4) == 32
    assert banks.wavefronts(banks.strided_addresses(33, 4), 4) == 1
    # broadcast: every lane reads the same word
    assert banks.wavefronts([0] * 32, 4) == 1
    # two lanes on two different words of bank 0, the rest spread: 2 wavefronts
    assert banks.wavefronts([0, 128] + [4 * i for i in range(1, 31)], 4) == 2


def test_16_byte_accesses_go_by_quarter_warps():
    # contiguous 16-byte pieces: 4 phases of 8 lanes, each covering all 32 banks once
    assert banks.phase_wavefronts(banks.strided_addresses(1, 16), 16) == [1, 1, 1, 1]
    assert banks.conflict_degree(banks.strided_addresses(1, 16), 16) == 1
    # stride 2 pieces (32 bytes): each quarter-warp hits 16 banks twice
    assert banks.wavefronts(banks.strided_addresses(2, 16), 16) == 8
    # all lanes on one 16-byte piece: broadcast, one wavefront per phase
    assert banks.wavefronts([0] * 32, 16) == 4


def test_8_byte_accesses_go_by_half_warps():
    assert banks.phase_wavefronts(banks.strided_addresses(1, 8), 8) == [1, 1]
    assert banks.wavefronts(banks.strided_addresses(16, 8), 8) == 32


def test_bad_addresses():
    with pytest.raises(ValueError, match="multiples of width=16"):
        banks.wavefronts([8] * 4, 16)
    with pytest.raises(ValueError, match="1 to 32"):
        banks.wavefronts(list(range(0, 4 * 33, 4)), 4)
    with pytest.raises(ValueError, match="width"):
        banks.wavefronts([0], 2)
    with pytest.raises(ValueError, match="non-negative"):
        banks.wavefronts([-4], 4)


def test_figures_data():
    path, data = banks.stride_figure(name="01_test_banks_stride")
    assert path.exists()
    assert list(data[4][:8]) == [1, 2, 1, 4, 1, 2, 1, 8]
    assert data[4][31] == 32 and data[16][31] == 8
    path.unlink()
    path, degrees = banks.padding_figure(name="01_test_banks_padding")
    assert degrees == {32: 32.0, 33: 1.0}
    path.unlink()


@pytest.mark.parametrize("width,op", [(4, "ld.shared.u32"), (8, "ld.shared.v2.u32"), (16, "ld.shared.v4.u32")])
def test_measuring_kernel_ptx(width, op):
    c = banks.compile_bank_kernel("sm_90a", width)
    loads = ptx_lines(c, r"ld\.shared")
    assert len(loads) == banks.UNROLL and all(x.split()[0] == op for x in loads)
    assert len(ptx_lines(c, r"%clock64")) == 2


@pytest.mark.gpu
def test_hardware_8_byte_accesses_follow_the_model():
    """The 8-byte accesses chapter 01's exercise 1 asks about: 16 lanes per phase, measured cycles per warp-wide
    access within 10 % (plus 0.1) of the model's wavefronts, for strides 1..8."""
    rows = banks.measure_bank_conflicts(range(1, 9), width=8)
    for r in rows:
        assert abs(r["cycles/access"] - r["model wavefronts"]) <= 0.1 * r["model wavefronts"] + 0.1, r
