"""The emulator's machine on hand-written PTX: instruction semantics on hand-worked cases, and the errors
that turn a GPU's silent misbehaviour into a message naming the warp, the lane and the PTX line."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from gemmlab.emulator import errors
from gemmlab.emulator.ptx import PTXSyntaxError, parse
from gemmlab.emulator.run import run_ptx
from gemmlab.emulator.values import E2M1, E4M3, encode_small

HEAD = ".version 8.7\n.target sm_90a\n.address_size 64\n"


def kernel(body: str, params: str = ".param .u64 out", regs: str = "") -> str:
    return (HEAD + ".extern .shared .align 1024 .b8 smem[];\n"
            f".visible .entry k({params})\n{{\n"
            ".reg .pred %p<8>;\n.reg .b16 %rs<8>;\n.reg .b32 %r<32>;\n.reg .b64 %rd<16>;\n.reg .f32 %f<8>;\n"
            f"{regs}{body}\n}}\n")


STORE_LANE = """
    ld.param.u64 %rd1, [out];
    mov.u32 %r1, %tid.x;
    mul.wide.u32 %rd2, %r1, 4;
    add.s64 %rd3, %rd1, %rd2;
"""


def run_lanes(body: str, n: int = 32, **kw) -> torch.Tensor:
    out = torch.full((n,), -1, dtype=torch.int32)
    run_ptx(kernel(STORE_LANE + body + "\n    st.global.u32 [%rd3], %r2;\n    ret;"), out, block=(n, 1, 1), **kw)
    return out


def test_integer_arithmetic_wraps_and_shifts_clamp():
    out = run_lanes("""
    mov.u32 %r4, 0xFFFFFFFF;
    add.u32 %r5, %r4, %r1;          // wraps: r1 - 1
    shl.b32 %r6, %r1, 33;           // a shift past the width gives 0
    add.u32 %r2, %r5, %r6;
    """)
    assert out.tolist() == [(i - 1) if i else -1 for i in range(32)]


def test_dp2a_and_dp4a_add_products_of_packed_fields():
    # a = 0x0007FFFD + lane: halves (-3 + lane, 7), the low half carrying into the high from lane 3 on;
    # b bytes 0..3 = (lane - 16, 2, 5, -1 as s8); c = 1000
    out = run_lanes("""
    add.u32 %r4, %r1, 0x0007FFFD;
    sub.u32 %r5, %r1, 16;
    and.b32 %r5, %r5, 0xFF;
    or.b32 %r5, %r5, 0xFF050200;    // bytes: lane - 16, 2, 5, -1
    dp2a.lo.s32.s32 %r6, %r4, %r5, 1000;
    dp2a.hi.s32.s32 %r7, %r4, %r5, 0;
    dp4a.s32.s32 %r8, %r5, %r5, 0;  // sum of squares of the four signed bytes
    dp4a.u32.u32 %r9, %r5, 0x01010101, 0;  // sum of the four unsigned bytes
    add.u32 %r2, %r6, %r7;
    add.u32 %r2, %r2, %r8;
    add.u32 %r2, %r2, %r9;
    """)
    want = []
    for lane in range(32):
        word = 0x0007FFFD + lane
        a_lo, a_hi = [(h ^ 0x8000) - 0x8000 for h in (word & 0xFFFF, word >> 16)]  # signed halves
        b = [lane - 16, 2, 5, -1]
        lo = 1000 + a_lo * b[0] + a_hi * b[1]
        hi = a_lo * b[2] + a_hi * b[3]
        sq = sum(x * x for x in b)
        usum = sum(x & 0xFF for x in b)
        want.append(lo + hi + sq + usum)
    assert out.tolist() == want


def test_divergent_branches_reconverge():
    # odd lanes take one arm, even lanes the other; both meet at JOIN and store
    out = run_lanes("""
    and.b32 %r4, %r1, 1;
    setp.eq.u32 %p1, %r4, 1;
    @%p1 bra ODD;
    mov.u32 %r2, 100;
    bra.uni JOIN;
ODD:
    mov.u32 %r2, 200;
JOIN:
    add.u32 %r2, %r2, %r1;
    """)
    assert out.tolist() == [(200 if i % 2 else 100) + i for i in range(32)]


def test_shfl_sync_idx_and_bfly():
    out = run_lanes("""
    shfl.sync.idx.b32 %r4, %r1, 5, 31, -1;     // every lane gets lane 5's value
    shfl.sync.bfly.b32 %r5, %r1, 1, 31, -1;    // neighbours swap
    mad.lo.u32 %r2, %r4, 100, %r5;
    """)
    assert out.tolist() == [500 + (i ^ 1) for i in range(32)]


def test_elect_sync_picks_the_lowest_active_lane():
    out = run_lanes("""
    elect.sync %r4|%p1, -1;
    selp.u32 %r2, 1, 0, %p1;
    add.u32 %r2, %r2, %r4;
    """)
    assert out.tolist() == [1] + [0] * 31


def test_fp8_and_fp4_tables_and_rounding():
    assert E4M3[0x7E] == 448.0 and np.isnan(E4M3[0x7F]) and E4M3[0x01] == 2.0 ** -9
    assert list(E2M1[:8]) == [0, 0.5, 1, 1.5, 2, 3, 4, 6]
    # round to nearest even: 1.25 lies between 1.0 (code 2) and 1.5 (code 3) -> even code 2
    assert encode_small(np.array([1.25, 5.0, 100.0, -0.26], np.float32), "e2m1").tolist() == [2, 6, 7, 9]


def test_cvt_packs_a_into_the_upper_half():
    out = run_lanes("""
    mov.f32 %f1, 0f3F800000;      // 1.0
    mov.f32 %f2, 0f40000000;      // 2.0
    cvt.rn.bf16x2.f32 %r2, %f1, %f2;
    """)
    assert out[0].item() == 0x3F80_4000  # bf16(1.0) = 0x3F80 upper, bf16(2.0) = 0x4000 lower


def test_packed_f16x2_arithmetic_keeps_each_half_in_place():
    """mul and fma .f16x2 work on each 16-bit half and leave it where it was (PTX ISA, half-precision arithmetic):
    (lo 1, hi 2) x (lo 3, hi 5) = (lo 3, hi 10); + (lo 1, hi 2) = (lo 4, hi 12)."""
    out = run_lanes("""
    mov.b32 %r3, 0x40003C00;      // hi 2.0, lo 1.0
    mov.b32 %r4, 0x45004200;      // hi 5.0, lo 3.0
    mul.rn.f16x2 %r2, %r3, %r4;
    """)
    assert out[0].item() == 0x4900_4200  # f16(10.0) = 0x4900 upper, f16(3.0) = 0x4200 lower
    out = run_lanes("""
    mov.b32 %r3, 0x40003C00;
    mov.b32 %r4, 0x45004200;
    fma.rn.f16x2 %r2, %r3, %r4, %r3;
    """)
    assert out[0].item() == 0x4A00_4400  # f16(12.0) upper, f16(4.0) lower


def test_out_of_bounds_global_store_names_the_line_and_lane():
    out = torch.zeros(8, dtype=torch.int32)
    src = kernel(STORE_LANE + "    st.global.u32 [%rd3], %r1;\n    ret;")
    with pytest.raises(errors.MemoryFault) as e:
        run_ptx(src, out, block=(32, 1, 1))
    msg = str(e.value)
    assert "outside every allocation" in msg and "PTX line" in msg and "st.global.u32" in msg


def test_deadlock_reports_every_waiting_warp_and_mbarrier():
    src = kernel("""
    mov.u32 %r1, smem;
    mov.u32 %r2, %tid.x;
    setp.ne.u32 %p1, %r2, 0;
    @%p1 bra WAIT;
    mbarrier.init.shared::cta.b64 [%r1], 2;
WAIT:
    bar.sync 0;
    mbarrier.arrive.shared::cta.b64 _, [%r1];     // 32 threads arrive on a barrier that expects 2 per phase
LOOP:
    mbarrier.try_wait.parity.shared::cta.b64 %p2, [%r1], 0;
    @!%p2 bra LOOP;
    ret;
    """, params=".param .u64 out")
    with pytest.raises(errors.BarrierError, match="completed 16 phases"):
        run_ptx(src, 0, block=(32, 1, 1), smem=64)
    hang = src.replace("mbarrier.arrive.shared::cta.b64 _, [%r1];", "")
    with pytest.raises(errors.Deadlock) as e:
        run_ptx(hang, 0, block=(64, 1, 1), smem=64)
    msg = str(e.value)
    assert "warp 0" in msg and "warp 1" in msg and "phase 0" in msg and "2 of 2 arrivals pending" in msg


def test_unimplemented_instructions_are_named_not_guessed():
    src = kernel("    mov.u32 %r1, 0;\n    brev.b32 %r2, %r1;\n    madc.hi.cc.u32 %r3, %r1, %r1, %r1;\n    ret;")
    with pytest.raises(errors.Unsupported, match="madc"):
        run_ptx(src, 0)


def test_parser_scopes_inline_asm_names():
    m = parse(kernel("""
    { .reg .pred p; L: setp.eq.u32 p, 0, 1; @p bra L; }
    { .reg .pred p; L: setp.eq.u32 p, 0, 1; @p bra L; }
    ret;
    """))
    k = m.kernel()
    targets = [i.operands[0].name for i in k.body if i.opcode == "bra"]
    assert len(set(targets)) == 2  # each block's branch goes to its own label


def test_parser_names_the_line_of_bad_syntax():
    with pytest.raises(PTXSyntaxError, match="line"):
        parse(kernel("    bra NOWHERE;\n    ret;"))
