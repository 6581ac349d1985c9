"""The emulator's tcgen05 extensions, and NVIDIA's Blackwell CuTe DSL examples on the emulator.

Always on (CPU, hand-written PTX run on the emulator's machine, a few seconds):

* ``tcgen05.ld`` / ``st`` shapes: the lane and column of every register against hand-worked positions of
  CUTLASS's ``Copy_Traits<SM100_TMEM_LOAD_*>`` layouts, and end to end (st .32x32b, ld .16x...; st .16x...,
  ld .32x32b);
* the data-path layouts of D (Layouts A/D, F, B) on hand-worked rows and columns;
* registers written by ``tcgen05.ld`` are readable before ``tcgen05.wait::ld``; a TMEM write over a read
  not yet waited for is noted (or raises in strict mode), and nothing is noted after the wait;
* ``cta_group::2``: alloc/dealloc meet across the pair (same columns in both CTAs; a missing peer is a
  deadlock naming the collective), and ``tcgen05.cp`` fills both CTAs' TMEM, each from its own shared memory.

With a CUTLASS checkout (``GEMMLAB_CUTLASS=/path/to/cutlass``; the fetched mirror works:
``/work/.mirror/NVIDIA+cutlass/repo``), the quick cases of ``benchmarks/emulator_nvidia_examples.py``:
NVIDIA's dense_gemm_persistent (1-CTA, 2-CTA, multicast) and dense_blockscaled_gemm_persistent (NVFP4,
1-CTA and 2-CTA) compiled for sm_100a, run on the emulator and compared with CPU references.
"""
from __future__ import annotations

import importlib.util
import os
import struct
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from gemmlab.emulator import ptx as ptxmod  # noqa: E402
from gemmlab.emulator.errors import Deadlock, RaceError  # noqa: E402
from gemmlab.emulator.host import Launch  # noqa: E402
from gemmlab.emulator.isa import tcgen05 as T  # noqa: E402
from gemmlab.emulator.machine import Machine  # noqa: E402
from gemmlab.emulator.memory import GlobalMemory  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def run_ptx(text: str, *params, grid=(1, 1, 1), block=(32, 1, 1), cluster=(1, 1, 1), seed=0) -> Machine:
    """Run a hand-written PTX module's one kernel; ``params``: CPU tensors (their address) or integers (u64)."""
    module = ptxmod.parse(text)
    kernel = module.kernel()
    memory = GlobalMemory()
    raw = []
    for p in params:
        if isinstance(p, torch.Tensor):
            memory.add_tensor(p)
            raw.append(struct.pack("<Q", p.data_ptr()))
        else:
            raw.append(struct.pack("<Q", int(p)))
    m = Machine(module, kernel, Launch(kernel.name, grid, block, cluster, 0, raw), memory, seed=seed,
                arch=module.target)
    m.run()
    return m


HEAD = """
.version 8.7
.target sm_100a
.address_size 64
.shared .align 16 .b8 slot[16];
.shared .align 8 .b8 bar[8];
.shared .align 128 .b8 data[512];
"""


def _regs(first: int, n: int) -> str:
    return "{" + ", ".join(f"%r{first + j}" for j in range(n)) + "}"


# ---------------------------------------------------------------------------------------------
# tcgen05.ld / st shapes
# ---------------------------------------------------------------------------------------------


def test_ldst_map_hand_worked():
    """Positions read off CUTLASS's DstLayout/ValID of each shape by hand (copy_traits_sm100.hpp)."""
    lanes, cols = T.ldst_map("32x32b", 4)
    assert (lanes[7, 3], cols[7, 3]) == (7, 3)
    # 16x64b.x1: ((2,2,8),32):((512,32,64),1), ValID (64,16):(1,DP): thread 5 = (a=1, b=0, c=1) -> bit 512+64
    #   -> lane 9, column 0; thread 2 = (0,1,0) -> bit 32 -> lane 0, column 1
    lanes, cols = T.ldst_map("16x64b", 2)
    assert (lanes[5, 0], cols[5, 0]) == (9, 0)
    assert (lanes[2, 0], cols[2, 0]) == (0, 1)
    assert (lanes[2, 1], cols[2, 1]) == (0, 3)  # .x2: ((2,2,8),(32,2)):((1024,32,128),(1,64)) -> +64 bits
    # 16x128b.x1: ((4,8),(32,2)):((32,128),(1,1024)), ValID (128,16): thread 6 = (t0=2, t1=1):
    #   register 0 -> bit 64+128 -> lane 1, column 2; register 1 -> +1024 -> lane 9, column 2
    lanes, cols = T.ldst_map("16x128b", 1)
    assert (lanes[6, 0], cols[6, 0]) == (1, 2)
    assert (lanes[6, 1], cols[6, 1]) == (9, 2)
    # 16x256b.x2: ((4,8),(64,2,2)):((64,512),(1,4096,256)), ValID (512,16): thread 13 = (t0=1, t1=3):
    #   register 3 (v = 96: v0=32, v1=1) -> bit 64+1536+32+4096 -> lane 11, column 3;
    #   register 4 (v = 128: v2=1) -> bit 64+1536+256 -> lane 3, column 10
    lanes, cols = T.ldst_map("16x256b", 2)
    assert (lanes[13, 3], cols[13, 3]) == (11, 3)
    assert (lanes[13, 4], cols[13, 4]) == (3, 10)
    # 16x32bx2: thread 20 is in the second half: lane 4, columns from immHalfSplitoff on
    lanes, cols = T.ldst_map("16x32bx2", 2, half_offset=8)
    assert (lanes[20, 1], cols[20, 1]) == (4, 9)
    assert (lanes[3, 0], cols[3, 0]) == (3, 0)
    # every shape covers its lanes x columns exactly once
    for shape, num, width in (("16x64b", 4, 8), ("16x128b", 2, 8), ("16x256b", 1, 8), ("32x32b", 8, 8)):
        lanes, cols = T.ldst_map(shape, num)
        cells = set(zip(lanes.ravel().tolist(), cols.ravel().tolist()))
        nl = 32 if shape == "32x32b" else 16
        assert len(cells) == lanes.size == nl * width


def _ld_kernel(shape: str, num: int, lane: int, half: int = 0) -> tuple[str, int]:
    """Thread t stores lane t, column j = t * 256 + j (.32x32b.x32), then loads ``shape`` at ``lane``."""
    nregs = T.LDST_REGS[shape] * num
    imm = f", {half}" if shape == "16x32bx2" else ""
    body = [f"add.u32 %r{10 + j}, %r4, {j};" for j in range(32)]
    stores = [f"st.global.u32 [%rd3+{4 * j}], %r{100 + j};" for j in range(nregs)]
    text = HEAD + f"""
.visible .entry ld_shape(.param .u64 out)
{{
  .reg .b32 %r<300>;
  .reg .b64 %rd<10>;
  mov.u32 %r1, %tid.x;
  mov.u32 %r2, slot;
  tcgen05.alloc.cta_group::1.sync.aligned.shared::cta.b32 [%r2], 32;
  ld.shared.u32 %r3, [%r2];
  shl.b32 %r4, %r1, 8;
  {" ".join(body)}
  tcgen05.st.sync.aligned.32x32b.x32.b32 [%r3], {_regs(10, 32)};
  tcgen05.wait::st.sync.aligned;
  add.u32 %r5, %r3, {lane << 16};
  tcgen05.ld.sync.aligned.{shape}.x{num}.b32 {_regs(100, nregs)}, [%r5]{imm};
  tcgen05.wait::ld.sync.aligned;
  ld.param.u64 %rd1, [out];
  mul.wide.u32 %rd2, %r1, {4 * nregs};
  add.s64 %rd3, %rd1, %rd2;
  {" ".join(stores)}
  tcgen05.dealloc.cta_group::1.sync.aligned.b32 %r3, 32;
  tcgen05.relinquish_alloc_permit.cta_group::1.sync.aligned;
  ret;
}}
"""
    return text, nregs


@pytest.mark.parametrize("shape,num,lane,half", [("32x32b", 4, 0, 0), ("16x64b", 4, 16, 0), ("16x128b", 2, 0, 0),
                                                 ("16x256b", 2, 16, 0), ("16x32bx2", 2, 0, 8)])
def test_ld_shapes_on_the_emulator(shape, num, lane, half):
    text, nregs = _ld_kernel(shape, num, lane, half)
    out = torch.zeros(32, nregs, dtype=torch.int32)
    run_ptx(text, out)
    lanes, cols = T.ldst_map(shape, num, half)
    assert torch.equal(out, torch.from_numpy(((lane + lanes) * 256 + cols).astype(np.int32)))


def test_st_16x256b_then_ld_32x32b():
    """The store direction: thread t's register j lands where ldst_map says (the rest keeps its zeros)."""
    text = HEAD + f"""
.visible .entry st_shape(.param .u64 out)
{{
  .reg .b32 %r<300>;
  .reg .b64 %rd<10>;
  mov.u32 %r1, %tid.x;
  mov.u32 %r2, slot;
  tcgen05.alloc.cta_group::1.sync.aligned.shared::cta.b32 [%r2], 32;
  ld.shared.u32 %r3, [%r2];
  {" ".join(f"mov.u32 %r{10 + j}, 0;" for j in range(16))}
  tcgen05.st.sync.aligned.32x32b.x16.b32 [%r3], {_regs(10, 16)};
  shl.b32 %r4, %r1, 4;
  {" ".join(f"add.u32 %r{40 + j}, %r4, {j + 1};" for j in range(8))}
  tcgen05.st.sync.aligned.16x256b.x2.b32 [%r3], {_regs(40, 8)};
  tcgen05.wait::st.sync.aligned;
  tcgen05.ld.sync.aligned.32x32b.x16.b32 {_regs(100, 16)}, [%r3];
  ld.param.u64 %rd1, [out];
  mul.wide.u32 %rd2, %r1, 64;
  add.s64 %rd3, %rd1, %rd2;
  {" ".join(f"st.global.u32 [%rd3+{4 * j}], %r{100 + j};" for j in range(16))}
  tcgen05.dealloc.cta_group::1.sync.aligned.b32 %r3, 32;
  tcgen05.relinquish_alloc_permit.cta_group::1.sync.aligned;
  ret;
}}
"""
    out = torch.full((32, 16), -1, dtype=torch.int32)
    run_ptx(text, out)
    expect = np.zeros((32, 16), np.int32)
    lanes, cols = T.ldst_map("16x256b", 2)
    for t in range(32):
        for j in range(8):
            expect[lanes[t, j], cols[t, j]] = t * 16 + j + 1
    assert torch.equal(out, torch.from_numpy(expect))


def test_ld_outside_the_warps_lane_quarter_is_an_error():
    text, _ = _ld_kernel("16x256b", 1, 32)  # warp 0 may read lanes 0..31 only
    with pytest.raises(Exception, match="may access lanes 0..31 only"):
        run_ptx(text, torch.zeros(32, 4, dtype=torch.int32))


# ---------------------------------------------------------------------------------------------
# Data-path layouts of D
# ---------------------------------------------------------------------------------------------


def test_d_layouts_hand_worked():
    # Layout D (M = 128, cta_group::1): row r in lane r
    lanes, cols = T.d_layout(128, 1, 64)
    assert (lanes[77, 5], cols[77, 5]) == (77, 5)
    # Layout A (M = 256, cta_group::2): each CTA's 128 rows the same way
    lanes, cols = T.d_layout(256, 2, 32)
    assert lanes.shape == (128, 32) and (lanes[127, 31], cols[127, 31]) == (127, 31)
    # Layout F (M = 64): atom ((16,4),N):((1,32),128): row 37 = (5, 2) -> lane 5 + 64; from lane 16: 85
    lanes, cols = T.d_layout(64, 1, 16)
    assert (lanes[37, 3], cols[37, 3]) == (69, 3)
    lanes, cols = T.d_layout(64, 1, 16, lane0=16)
    assert (lanes[37, 3], cols[37, 3]) == (85, 3)
    assert sorted(set(lanes.ravel().tolist())) == [l for q in range(4) for l in range(32 * q + 16, 32 * q + 32)]
    # Layout B (M = 128, cta_group::2): atom (64,(N/2,2)):(1,(128,64)): N = 64, row 10, column 40 -> lane 74, col 8
    lanes, cols = T.d_layout(128, 2, 64)
    assert lanes.shape == (64, 64)
    assert (lanes[10, 40], cols[10, 40]) == (74, 8)
    assert (lanes[10, 31], cols[10, 31]) == (10, 31)
    with pytest.raises(Exception, match="lane 0 or 16"):
        T.d_layout(64, 1, 16, lane0=32)
    with pytest.raises(Exception, match="data-path layout of M = 32"):
        T.d_layout(32, 1, 16)


# ---------------------------------------------------------------------------------------------
# tcgen05.ld registers, the open TMEM read, tcgen05.wait::ld
# ---------------------------------------------------------------------------------------------


def _overwrite_kernel(wait: bool) -> str:
    """ld 32x32b.x4 from columns 0..3, use the registers at once, then tcgen05.cp over columns 0..3
    (with or without tcgen05.wait::ld before it), commit, wait for the copy; write the loaded values."""
    return HEAD + f"""
.visible .entry overwrite(.param .u64 out, .param .u64 desc_hi)
{{
  .reg .b32 %r<300>;
  .reg .b64 %rd<20>;
  .reg .pred %p<4>;
  mov.u32 %r1, %tid.x;
  mov.u32 %r2, slot;
  tcgen05.alloc.cta_group::1.sync.aligned.shared::cta.b32 [%r2], 32;
  ld.shared.u32 %r3, [%r2];
  mov.u32 %r6, bar;
  setp.eq.u32 %p1, %r1, 0;
  @%p1 mbarrier.init.shared.b64 [%r6], 1;
  shl.b32 %r4, %r1, 8;
  {" ".join(f"add.u32 %r{10 + j}, %r4, {j};" for j in range(4))}
  tcgen05.st.sync.aligned.32x32b.x4.b32 [%r3], {_regs(10, 4)};
  tcgen05.wait::st.sync.aligned;
  mov.u32 %r7, data;
  shl.b32 %r8, %r1, 4;
  add.u32 %r9, %r7, %r8;
  st.shared.v4.u32 [%r9], {{%r1, %r1, %r1, %r1}};
  fence.proxy.async.shared::cta;
  bar.sync 0;
  tcgen05.ld.sync.aligned.32x32b.x4.b32 {_regs(100, 4)}, [%r3];
  add.u32 %r104, %r100, %r103;
  {"tcgen05.wait::ld.sync.aligned;" if wait else ""}
  shr.u32 %r20, %r7, 4;
  cvt.u64.u32 %rd5, %r20;
  ld.param.u64 %rd6, [desc_hi];
  or.b64 %rd7, %rd6, %rd5;
  @%p1 tcgen05.cp.cta_group::1.32x128b.warpx4 [%r3], %rd7;
  @%p1 tcgen05.commit.cta_group::1.mbarrier::arrive::one.shared::cluster.b64 [%r6];
WAIT:
  mbarrier.try_wait.parity.shared.b64 %p2, [%r6], 0;
  @!%p2 bra WAIT;
  tcgen05.ld.sync.aligned.32x32b.x4.b32 {_regs(110, 4)}, [%r3];
  tcgen05.wait::ld.sync.aligned;
  ld.param.u64 %rd1, [out];
  mul.wide.u32 %rd2, %r1, 36;
  add.s64 %rd3, %rd1, %rd2;
  {" ".join(f"st.global.u32 [%rd3+{4 * j}], %r{100 + j};" for j in range(5))}
  {" ".join(f"st.global.u32 [%rd3+{20 + 4 * j}], %r{110 + j};" for j in range(4))}
  tcgen05.dealloc.cta_group::1.sync.aligned.b32 %r3, 32;
  tcgen05.relinquish_alloc_permit.cta_group::1.sync.aligned;
  ret;
}}
"""


#: A tcgen05 shared-memory descriptor without its start address: SBO = 128 bytes (8 rows of 16 bytes),
#: LBO = 16 (unused for 16 bytes of K), version 1 in bits 46-47, no swizzle.
DESC_HI = (16 >> 4) << 16 | (128 >> 4) << 32 | 1 << 46


@pytest.mark.parametrize("wait", [False, True])
def test_ld_registers_readable_before_wait_and_overwrite_notes(wait):
    out = torch.zeros(32, 9, dtype=torch.int32)
    m = run_ptx(_overwrite_kernel(wait), out, DESC_HI)
    t = torch.arange(32, dtype=torch.int32)
    loaded = t[:, None] * 256 + torch.arange(4, dtype=torch.int32)
    assert torch.equal(out[:, :4], loaded)  # the values of before the copy
    assert torch.equal(out[:, 4], loaded[:, 0] + loaded[:, 3])  # read before any tcgen05.wait::ld
    assert torch.equal(out[:, 5:], t[:, None].expand(32, 4))  # the copy: lane quarter 0 gets rows 0..31
    notes = getattr(m, "notes", [])
    if wait:
        assert notes == []
    else:
        assert len(notes) == 1 and "tcgen05.wait::ld" in notes[0] and "tcgen05.cp" in notes[0]


def test_overwrite_of_an_open_read_raises_in_strict_mode(monkeypatch):
    monkeypatch.setattr(T, "STRICT_LD_ORDER", True)
    with pytest.raises(RaceError, match="without a tcgen05.wait::ld"):
        run_ptx(_overwrite_kernel(False), torch.zeros(32, 9, dtype=torch.int32), DESC_HI)


# ---------------------------------------------------------------------------------------------
# cta_group::2: the collective alloc/dealloc and tcgen05.cp into both CTAs
# ---------------------------------------------------------------------------------------------


PAIR = HEAD + """
.visible .entry pair(.param .u64 out, .param .u64 desc_hi)
{
  .reg .b32 %r<300>;
  .reg .b64 %rd<20>;
  .reg .pred %p<4>;
  mov.u32 %r1, %tid.x;
  mov.u32 %r30, %cluster_ctarank;
  mov.u32 %r2, slot;
  mov.u32 %r6, bar;
  setp.eq.u32 %p1, %r1, 0;
  @%p1 mbarrier.init.shared.b64 [%r6], 1;
  mov.u32 %r7, data;
  shl.b32 %r8, %r1, 4;
  add.u32 %r9, %r7, %r8;
  shl.b32 %r31, %r30, 16;
  add.u32 %r32, %r31, %r1;
  st.shared.v4.u32 [%r9], {%r32, %r32, %r32, %r32};
  fence.proxy.async.shared::cta;
  tcgen05.alloc.cta_group::2.sync.aligned.shared::cta.b32 [%r2], 64;
  ld.shared.u32 %r3, [%r2];
  barrier.cluster.arrive.release.aligned;
  barrier.cluster.wait.acquire.aligned;
  setp.eq.u32 %p3, %r30, 0;
  and.pred %p3, %p3, %p1;
  shr.u32 %r20, %r7, 4;
  and.b32 %r20, %r20, 16383;
  cvt.u64.u32 %rd5, %r20;
  ld.param.u64 %rd6, [desc_hi];
  or.b64 %rd7, %rd6, %rd5;
  add.u32 %r33, %r3, 32;
  mov.u16 %rs1, 3;
  @%p3 tcgen05.cp.cta_group::2.32x128b.warpx4 [%r33], %rd7;
  @%p3 tcgen05.commit.cta_group::2.mbarrier::arrive::one.shared::cluster.multicast::cluster.b64 [%r6], %rs1;
WAIT:
  mbarrier.try_wait.parity.shared.b64 %p2, [%r6], 0;
  @!%p2 bra WAIT;
  tcgen05.ld.sync.aligned.32x32b.x4.b32 {%r100, %r101, %r102, %r103}, [%r33];
  tcgen05.wait::ld.sync.aligned;
  ld.param.u64 %rd1, [out];
  mul.wide.u32 %rd2, %r30, 1024;
  mul.wide.u32 %rd8, %r1, 16;
  add.s64 %rd3, %rd1, %rd2;
  add.s64 %rd3, %rd3, %rd8;
  st.global.v4.u32 [%rd3], {%r100, %r101, %r102, %r103};
  st.global.u32 [%rd3+512], %r3;
  barrier.cluster.arrive.release.aligned;
  barrier.cluster.wait.acquire.aligned;
  tcgen05.dealloc.cta_group::2.sync.aligned.b32 %r3, 64;
  tcgen05.relinquish_alloc_permit.cta_group::2.sync.aligned;
  ret;
}
"""


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_cta_pair_alloc_and_copy(seed):
    text = PAIR.replace(".reg .pred %p<4>;", ".reg .pred %p<4>;\n  .reg .b16 %rs<4>;")
    out = torch.zeros(2, 2, 32, 4, dtype=torch.int32)  # [rank][values, then the TMEM address][thread][word]
    m = run_ptx(text, out, DESC_HI, grid=(2, 1, 1), cluster=(2, 1, 1), seed=seed)
    t = torch.arange(32, dtype=torch.int32)
    for rank in range(2):
        # each CTA's TMEM holds its own shared memory's rows (rank << 16 | row)
        assert torch.equal(out[rank, 0], ((rank << 16) + t)[:, None].expand(32, 4))
    assert int(out[0, 1, 0, 0]) == int(out[1, 1, 0, 0]) == 0  # the same columns in both CTAs
    assert all(not c.tmem_alloc for c in m.ctas)


def test_cta_pair_alloc_without_the_peer_deadlocks():
    text = HEAD + """
.visible .entry lonely(.param .u64 out)
{
  .reg .b32 %r<10>;
  .reg .pred %p<2>;
  mov.u32 %r1, %cluster_ctarank;
  setp.ne.u32 %p1, %r1, 0;
  @%p1 bra DONE;
  mov.u32 %r2, slot;
  tcgen05.alloc.cta_group::2.sync.aligned.shared::cta.b32 [%r2], 32;
  ld.shared.u32 %r3, [%r2];
  tcgen05.dealloc.cta_group::2.sync.aligned.b32 %r3, 32;
DONE:
  ret;
}
"""
    with pytest.raises(Deadlock, match="peer CTA's warp to join tcgen05.alloc"):
        run_ptx(text, 0, grid=(2, 1, 1), cluster=(2, 1, 1))


# ---------------------------------------------------------------------------------------------
# NVIDIA's examples (need a CUTLASS checkout)
# ---------------------------------------------------------------------------------------------

CUTLASS = os.environ.get("GEMMLAB_CUTLASS")


def _script():
    import sys

    name = "emulator_nvidia_examples"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / "emulator_nvidia_examples.py")
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod  # its dataclasses look their module up
        spec.loader.exec_module(mod)
    return sys.modules[name]


@pytest.fixture(scope="module")
def nvidia(tmp_path_factory):
    if not CUTLASS:
        pytest.skip("set GEMMLAB_CUTLASS to a checkout (or bare git directory) of NVIDIA/cutlass to run NVIDIA's "
                    "Blackwell examples on the emulator")
    script = _script()
    directory, rev = script.extract(CUTLASS, os.environ.get("GEMMLAB_CUTLASS_REV", "HEAD"),
                                    into=str(tmp_path_factory.mktemp("nvidia-examples")))
    modules = {name: script.load(directory, name) for name in script.EXAMPLES}
    return script, modules


@pytest.mark.parametrize("index", [i for i, c in enumerate(_script().CASES) if c.quick] if CUTLASS else [None])
def test_nvidia_example_on_the_emulator(nvidia, index):
    script, modules = nvidia
    case = script.CASES[index]
    rows = script.run_case(modules, case, seeds=[index % 3])
    for r in rows:
        assert r["pass"], r


# ---------------------------------------------------------------------------------------------
# Block scaling: instruction descriptors and scale types
# ---------------------------------------------------------------------------------------------


def test_block_scaled_instruction_descriptors():
    """PTX ISA 9.7.16.4.2, Table 43 (mxf8f6f4) and 44 (mxf4, mxf4nvf4), assembled by hand."""
    # mxf8f6f4, A = E4M3 (0), B = E5M2 (1), N = 128, UE8M0 (bit 23), M = 256 (2 << 27), SFA_ID 3, SFB_ID 1
    v = (1 << 4) | (0 << 7) | (1 << 10) | ((128 >> 3) << 17) | (1 << 23) | (2 << 27) | (3 << 29)
    i = T.decode_idesc_block_scaled(v, "kind::mxf8f6f4")
    assert (i["a"], i["b"], i["n"], i["m"], i["k"], i["bits"]) == ("e4m3", "e5m2", 128, 256, 32, 8)
    assert (i["scale_format"], i["a_sf_id"], i["b_sf_id"]) == ("ue8m0", 3, 1)
    # mxf4nvf4, E2M1 (1) both, N = 64, UE4M3 (bit 23 clear), M = 128, IDs 0
    v = (1 << 7) | (1 << 10) | ((64 >> 3) << 17) | (1 << 27)
    i = T.decode_idesc_block_scaled(v, "kind::mxf4nvf4")
    assert (i["a"], i["n"], i["m"], i["k"], i["scale_format"]) == ("e2m1", 64, 128, 64, "ue4m3")
    with pytest.raises(Exception, match="type codes 5/5"):  # E2M1 inside mxf8f6f4: refused, not guessed
        T.decode_idesc_block_scaled((5 << 7) | (5 << 10) | (1 << 27), "kind::mxf8f6f4")
    with pytest.raises(Exception, match="K = 96"):
        T.decode_idesc_block_scaled((1 << 7) | (1 << 10) | (1 << 27) | (1 << 31), "kind::mxf4nvf4")


def test_scale_types():
    codes = np.array([127, 128, 120, 0, 254, 255], np.uint8)
    v = T.decode_scales(codes, "ue8m0")
    assert v[:5].tolist() == [1.0, 2.0, 2.0 ** -7, 2.0 ** -127, 2.0 ** 127] and np.isnan(v[5])
    assert T.decode_scales(np.array([0x38, 0x28, 0x47], np.uint8), "ue4m3").tolist() == [1.0, 0.25, 3.75]
