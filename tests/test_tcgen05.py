"""Chapter 09: tcgen05.mma descriptors (against hand-worked values and the DSL's own PTX), wrappers, kernels."""
import re

import numpy as np
import pytest

from gemmlab import figures, tcgen05 as t5
from gemmlab.compile import ptx_lines

# ---------------------------------------------------------------- instruction descriptor

# Worked by hand from the PTX ISA table: bf16 (a_fmt=b_fmt=1 at bits 7, 10), f32 D (1 at bit 4),
# K-major both (bits 15, 16 = 0), N>>3 at bits 17-22, M>>4 at bits 24-28.
HAND_M128_N256 = (1 << 4) | (1 << 7) | (1 << 10) | ((256 >> 3) << 17) | ((128 >> 4) << 24)
HAND_M128_N64 = (1 << 4) | (1 << 7) | (1 << 10) | (8 << 17) | (8 << 24)


def test_instr_desc_hand_worked():
    assert t5.InstrDesc(m=128, n=256).encode() == HAND_M128_N256 == 0x08400490
    assert t5.InstrDesc(m=128, n=64).encode() == HAND_M128_N64 == 135267472
    assert t5.InstrDesc(m=256, n=128, cta_group=2).encode() == 0x10200490
    # f16 x f16 -> f16, A MN-major, negate B
    d = t5.InstrDesc(m=64, n=8, a_dtype="f16", b_dtype="f16", d_dtype="f16", a_major="MN", negate_b=True)
    assert d.encode() == (1 << 15) | (1 << 14) | (1 << 17) | (4 << 24)


def test_instr_desc_round_trip():
    cases = [
        t5.InstrDesc(),
        t5.InstrDesc(m=64, n=136, a_dtype="f16", b_dtype="f16", d_dtype="f16", b_major="MN"),
        t5.InstrDesc(m=128, n=16, negate_a=True, saturate=True, sparse=True, sparse_id2=3, max_shift=2),
        t5.InstrDesc(m=256, n=256, cta_group=2, a_major="MN", b_major="MN"),
    ]
    for d in cases:
        assert t5.InstrDesc.decode(d.encode(), d.cta_group) == d
    # every field lands where the table says, and nowhere else
    for name, lo, width, _ in t5.INSTR_DESC_FIELDS:
        mask = ((1 << width) - 1) << lo
        assert mask & t5.InstrDesc(m=128, n=256).encode() == t5.InstrDesc().field_values()[name] << lo
    assert "n_dim" in t5.InstrDesc().table() and "17-22" in t5.InstrDesc().table()


def test_instr_desc_rejects_bad_input():
    with pytest.raises(ValueError, match="steps of 8"):
        t5.InstrDesc(m=128, n=20)
    with pytest.raises(ValueError, match="N=264"):
        t5.InstrDesc(m=128, n=264)
    with pytest.raises(ValueError, match="M in"):
        t5.InstrDesc(m=256, n=128)  # M=256 needs a CTA pair
    with pytest.raises(ValueError, match="steps of 16"):
        t5.InstrDesc(m=256, n=24, cta_group=2)
    with pytest.raises(ValueError, match="steps of 16"):
        t5.InstrDesc(m=256, n=8, cta_group=2)
    with pytest.raises(ValueError, match="cta_group"):
        t5.InstrDesc(cta_group=4)
    with pytest.raises(ValueError, match="bf16 inputs accumulate in f32"):
        t5.InstrDesc(d_dtype="f16")
    with pytest.raises(ValueError, match="a_dtype == b_dtype"):
        t5.InstrDesc(a_dtype="f16")
    with pytest.raises(ValueError, match="reserved bit 23"):
        t5.InstrDesc.decode(HAND_M128_N64 | (1 << 23))
    with pytest.raises(ValueError, match="unknown A type"):
        t5.InstrDesc.decode(HAND_M128_N64 | (2 << 7))
    assert t5.valid_mma_shape(128, 24) and not t5.valid_mma_shape(128, 24, cta_group=2)


# ---------------------------------------------------------------- shared-memory descriptor


def test_smem_desc_hand_worked():
    # start 0x400 -> 0x40; LBO 16 -> 1 at bit 16; SBO 1024 -> 64 at bit 32; version 1 at bit 46; 128B swizzle = 2 at 61
    want = 0x40 | (1 << 16) | (64 << 32) | (1 << 46) | (2 << 61)
    assert t5.smem_desc_kmajor_sw128(0x400) == want == 0x4000404000010040
    d = t5.SmemDesc.decode(want)
    assert (d.start_addr, d.lbo, d.sbo, d.swizzle, d.version, d.base_offset, d.lbo_mode) == (
        0x400, 16, 1024, "128B", 1, 0, 0)
    # the SM100 layout field is 3 bits at 61-63; Hopper's 128B code (1 at 62) is "128B_base32B" (1 at 61) here
    assert t5.SmemDesc.decode(1 << 61 | 1 << 46).swizzle == "128B_base32B"
    assert t5.SmemDesc.decode(6 << 61 | 1 << 46).swizzle == "32B"


def test_smem_desc_round_trip_and_errors():
    for d in [t5.SmemDesc(0, 16, 1024), t5.SmemDesc(0x3FFF0, 0x100, 0x800, "64B", base_offset=3, lbo_mode=1),
              t5.SmemDesc(0x1230, 0, 256, "none")]:
        assert t5.SmemDesc.decode(d.encode()) == d
    with pytest.raises(ValueError, match="multiple of 16"):
        t5.smem_desc_kmajor_sw128(0x408)
    with pytest.raises(ValueError, match="reserved"):
        t5.SmemDesc.decode(t5.smem_desc_kmajor_sw128(0) | (1 << 14))
    with pytest.raises(ValueError, match="bits 46-48"):
        t5.SmemDesc.decode(2 << 61)  # version 0: a Hopper-style descriptor
    with pytest.raises(ValueError, match="unknown swizzle"):
        t5.SmemDesc.decode(3 << 61 | 1 << 46)


def test_sw128_offsets_hand_worked():
    # row 0 is not permuted; row 1 swaps chunk pairs; a new 64-element panel starts after rows*128 bytes
    assert t5.sw128_kmajor_offset(0, 0, 128) == 0
    assert t5.sw128_kmajor_offset(0, 9, 128) == 18
    assert t5.sw128_kmajor_offset(1, 0, 128) == 128 + 16
    assert t5.sw128_kmajor_offset(1, 8, 128) == 128 + 0
    assert t5.sw128_kmajor_offset(7, 63, 128) == 7 * 128 + (7 ^ 7) * 16 + 14
    assert t5.sw128_kmajor_offset(9, 3, 128) == 9 * 128 + 16 + 6
    assert t5.sw128_kmajor_offset(0, 64, 128) == 128 * 128
    # it is the address-bit swizzle bits[4:7] ^= bits[7:10] of the unswizzled row-major panel
    for row in range(16):
        for k in range(64):
            plain = row * 128 + 2 * k
            assert t5.sw128_kmajor_offset(row, k, 16) == plain ^ (((plain >> 7) & 7) << 4)
    # a permutation of the whole tile
    offs = {t5.sw128_kmajor_offset(r, k, 32) for r in range(32) for k in range(128)}
    assert offs == set(range(0, 32 * 128 * 2, 2))


def test_desc_sequence_steps_inside_the_atom_then_by_panel():
    seq = t5.kmajor_sw128_desc_sequence(0x400, rows=128, k=128)
    starts = [t5.SmemDesc.decode(d).start_addr for d in seq]
    assert starts == [0x400, 0x420, 0x440, 0x460, 0x400 + 16384, 0x420 + 16384, 0x440 + 16384, 0x460 + 16384]


# ---------------------------------------------------------------- against what the DSL emits


@pytest.mark.parametrize("m,n,k,g", [(128, 64, 64, 1), (128, 256, 128, 1), (256, 128, 128, 2)])
def test_encoders_match_the_dsl(m, n, k, g):
    c = t5.compile_dsl_reference("sm_100a", m, n, k, g)
    consts = t5.dsl_mma_constants(c)
    assert len(consts["opcodes"]) == k // 16
    assert all(op.startswith(f"tcgen05.mma.cta_group::{g}.kind::f16") for op in consts["opcodes"])
    (idesc,) = set(consts["idesc"])
    d = t5.InstrDesc.decode(idesc, g)
    assert (d.m, d.n, d.a_dtype, d.b_dtype, d.d_dtype, d.a_major, d.b_major) == (m, n, "bf16", "bf16", "f32", "K", "K")
    assert idesc == t5.InstrDesc(m=m, n=n, cta_group=g).encode()
    # the DSL ORs/adds these onto (address >> 4): our sequence from start address 0, bit for bit
    assert consts["a_desc"] == t5.kmajor_sw128_desc_sequence(0, 128, k)
    assert consts["b_desc"] == t5.kmajor_sw128_desc_sequence(0, n // g, k)  # each CTA of a pair: N/2 rows of B


def test_dsl_constants_parser_reads_registers():
    fake = """
    mov.b32 	%r17, 135267472;
    or.b64 	%rd5, %rd2, 4611756662049538048;
    add.s64 	%rd6, %rd1, 4611756662049538050;
    tcgen05.mma.cta_group::1.kind::f16 [%r4], %rd6, %rd5, %r17, %p4;
    """
    got = t5.dsl_mma_constants(fake)
    assert got == {"opcodes": ["tcgen05.mma.cta_group::1.kind::f16"], "idesc": [135267472],
                   "a_desc": [4611756662049538050], "b_desc": [4611756662049538048]}


# ---------------------------------------------------------------- our kernel's PTX


def test_tile_kernel_ptx_cta_group_1():
    c = t5.compile_mma_tile("sm_100a", n=64, k=128, num=32, cta_group=1)
    assert t5.tcgen05_instructions(c) == [
        "tcgen05.alloc.cta_group::1.sync.aligned.shared::cta.b32",
        "tcgen05.fence::before_thread_sync",
        "tcgen05.fence::after_thread_sync",
        "tcgen05.mma.cta_group::1.kind::f16",
        "tcgen05.commit.cta_group::1.mbarrier::arrive::one.shared::cluster.b64",
        "tcgen05.ld.sync.aligned.32x32b.x32.b32",
        "tcgen05.wait::ld.sync.aligned",
        "tcgen05.relinquish_alloc_permit.cta_group::1.sync.aligned",  # at the end, as NVIDIA's examples do
        "tcgen05.dealloc.cta_group::1.sync.aligned.b32",
    ]
    mmas = ptx_lines(c, r"tcgen05\.mma")
    assert len(mmas) == 128 // 16
    assert all(f", {t5.InstrDesc(m=128, n=64).encode()}, acc;" in line for line in mmas)
    assert "setp.ne.b32 acc, 0, 0" in mmas[0] and all("acc, 1, 0" in line for line in mmas[1:])
    # the descriptor's constant part, ORed onto (address >> 4): 16 of them (A and B per K step)
    hi = [int(x) for x in re.findall(r"or\.b64\s+%rd\d+, %rd\d+, (\d+);", c.__ptx__) if int(x) >= 1 << 32]
    assert hi == [t5.smem_desc_kmajor_sw128(0)] * 16
    assert len(ptx_lines(c, r"^tcgen05\.ld")) == 64 // 32
    assert ptx_lines(c, r"fence\.proxy\.async")  # generic stores -> tensor core


def test_tile_kernel_ptx_cta_pair():
    c = t5.compile_mma_tile("sm_100a", n=128, k=64, num=16, cta_group=2)
    names = t5.tcgen05_instructions(c)
    assert "tcgen05.mma.cta_group::2.kind::f16" in names
    assert "tcgen05.commit.cta_group::2.mbarrier::arrive::one.shared::cluster.multicast::cluster.b64" in names
    assert "tcgen05.alloc.cta_group::2.sync.aligned.shared::cta.b32" in names
    assert "tcgen05.dealloc.cta_group::2.sync.aligned.b32" in names
    assert all(f", {t5.InstrDesc(m=256, n=128, cta_group=2).encode()}, acc;" in line
               for line in ptx_lines(c, r"tcgen05\.mma"))
    assert ptx_lines(c, r"^barrier\.cluster\.arrive") and ptx_lines(c, r"^barrier\.cluster\.wait")
    assert len(ptx_lines(c, r"^tcgen05\.ld\.sync\.aligned\.32x32b\.x16")) == 128 // 16


@pytest.mark.parametrize("num", [1, 2, 4, 8, 16, 32, 64, 128])
def test_every_ld_shape_assembles(num):
    c = t5.compile_mma_tile("sm_100a", n=128, k=64, num=num)
    lines = ptx_lines(c, r"^tcgen05\.ld")
    assert len(lines) == 128 // num
    assert lines[0].startswith(f"tcgen05.ld.sync.aligned.32x32b.x{num}.b32")
    regs = lines[0][lines[0].index("{") + 1:lines[0].index("}")].split(",")
    assert len(regs) == num  # num 32-bit registers per thread


def test_tile_bad_input():
    with pytest.raises(ValueError, match="multiple of 16"):
        t5.compile_mma_tile("sm_100a", n=40)
    with pytest.raises(ValueError, match="<= 256"):
        t5.compile_mma_tile("sm_100a", n=272)
    with pytest.raises(ValueError, match="multiple of 64"):
        t5.compile_mma_tile("sm_100a", n=64, k=96)
    with pytest.raises(ValueError, match="num must divide n"):
        t5.compile_mma_tile("sm_100a", n=48, num=32)
    with pytest.raises(ValueError, match="shared memory"):
        t5.compile_mma_tile("sm_100a", n=256, k=512)
    with pytest.raises(ValueError, match="cta_group"):
        t5.compile_mma_tile("sm_100a", cta_group=3)
    torch = pytest.importorskip("torch")
    a = torch.zeros(128, 64, dtype=torch.bfloat16)
    with pytest.raises(TypeError, match="a must have dtype bfloat16"):
        t5.run_mma_tile(a.float(), a)
    with pytest.raises(ValueError, match="256 rows"):
        t5.run_mma_tile(a, a, cta_group=2)
    with pytest.raises(ValueError, match="share K"):
        t5.run_mma_tile(a, torch.zeros(64, 128, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="multiple of 16"):
        t5.run_mma_tile(a, torch.zeros(24, 64, dtype=torch.bfloat16))


# ---------------------------------------------------------------- probes and figures (CPU side)


def test_tile_smem_budget_is_a_teaching_budget_below_the_hardware_limit():
    from gemmlab.hardware import SMEM_PER_BLOCK

    assert not hasattr(t5, "SMEM_LIMIT")
    assert t5.TILE_SMEM_BUDGET == 192 * 1024 < SMEM_PER_BLOCK
    # (128 + 256) rows x 256 K x 2 bytes is exactly the budget; 320 K is over it.
    assert t5.tile_shapes(256, 256, 1) == (128, 128, 256)
    with pytest.raises(ValueError, match=f"budget is TILE_SMEM_BUDGET = {t5.TILE_SMEM_BUDGET} bytes"):
        t5.tile_shapes(256, 320, 1)


def test_probe_operands_name_their_cells():
    torch = pytest.importorskip("torch")
    for m, n in [(128, 64), (256, 256)]:
        a, b = t5.ld_probe_operands(m, n, 64)
        d = a.float() @ b.float().T
        want = 256 * torch.arange(m)[:, None] + torch.arange(n)[None, :]
        assert torch.equal(d, want.float())
    exp = t5.expected_probe_registers(64, 16, cta_group=2)
    assert exp[0, 0] == 0 and exp[37, 5] == 256 * 37 + 5 and exp[128 + 3, 63] == 256 * 131 + 63


def test_figures_data(tmp_path, monkeypatch):
    monkeypatch.setattr(figures, "FIGURES_DIR", tmp_path)
    path, data = t5.draw_instr_desc(t5.InstrDesc(m=128, n=256))
    assert path.exists()
    assert dict((f[0], f[3]) for f in data) == t5.InstrDesc(m=128, n=256).field_values()
    assert data[0][0] == "max_shift" and data[-1][0] == "sparse_id2"
    path, data = t5.draw_smem_desc()
    assert dict((f[0], f[3]) for f in data)["version"] == 1
    path, grid = t5.draw_sw128_atom()
    assert grid[0].tolist() == list(range(8)) and grid[3].tolist() == [c ^ 3 for c in range(8)]
    path, split = t5.draw_cta_pair(256)
    assert split[0]["issues MMA"] and not split[1]["issues MMA"]
    assert split[1]["B rows (N)"] == (128, 256) and split[1]["D rows in own TMEM"] == (128, 256)


# ---------------------------------------------------------------- GPU (Blackwell)


@pytest.mark.gpu
@pytest.mark.sm100
@pytest.mark.parametrize("n,k,num", [(64, 64, 32), (256, 128, 64), (48, 192, 16)])
def test_single_tile_mma_matches_torch(n, k, num):
    import torch

    torch.manual_seed(9)
    a = torch.randn(128, k, device="cuda").to(torch.bfloat16)
    b = torch.randn(n, k, device="cuda").to(torch.bfloat16)
    d, _ = t5.run_mma_tile(a, b, num=num)
    torch.testing.assert_close(d, a.float() @ b.float().T, atol=1e-2, rtol=1e-3)


@pytest.mark.gpu
@pytest.mark.sm100
@pytest.mark.parametrize("num", [1, 4, 32, 128])
def test_tmem_ld_layout_matches_model(num):
    a, b = t5.ld_probe_operands(128, 128, 64, device="cuda")
    _, regs = t5.run_mma_tile(a, b, num=num)
    assert np.array_equal(regs.cpu().numpy().astype(np.int64), t5.expected_probe_registers(128, num))


@pytest.mark.gpu
@pytest.mark.sm100
def test_cta_pair_mma():
    import torch

    a, b = t5.ld_probe_operands(256, 128, 64, device="cuda")
    _, regs = t5.run_mma_tile(a, b, num=32, cta_group=2)
    assert np.array_equal(regs.cpu().numpy().astype(np.int64), t5.expected_probe_registers(128, 32, 2))
    torch.manual_seed(10)
    a = torch.randn(256, 128, device="cuda").to(torch.bfloat16)
    b = torch.randn(128, 128, device="cuda").to(torch.bfloat16)
    d, _ = t5.run_mma_tile(a, b, num=32, cta_group=2)
    torch.testing.assert_close(d, a.float() @ b.float().T, atol=1e-2, rtol=1e-3)


def test_chapter09_exercise_solutions_by_hand():
    from gemmlab.course.exercises import ch09

    assert ch09.solution_idesc() == 1 << 4 | 1 << 7 | 1 << 10 | 16 << 17 | 16 << 24 == 0x10200490
    assert ch09.solution_ld_row() == 32 * (5 % 4) + 7 == 39
    assert ch09.solution_sm90_descriptor_on_sm100() == 1 << 46  # only the version bits differ
    assert [t5.sm90_swizzle_as_sm100(c) for c in (0, 1, 2, 3)] == [0, 2, 4, 6]
    with pytest.raises(ValueError, match="sm90_code"):
        t5.sm90_swizzle_as_sm100(4)


def test_tile_kernel_compiles_without_optimization_warnings():
    """Its fully unrolled epilogue loops (up to 128 iterations, vals a tuple of registers) are split into static loops
    of at most 32, so the DSL's DSLOptimizationWarning (static loops of 64+) does not fire; the PTX is the same."""
    import warnings

    from cutlass.base_dsl.ast_helpers import DSLOptimizationWarning

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", DSLOptimizationWarning)
        for num, n in ((1, 64), (64, 128), (128, 256)):
            t5.compile_mma_tile("sm_100a", n=n, k=64, num=num)
    assert not [w for w in caught if issubclass(w.category, DSLOptimizationWarning)]
