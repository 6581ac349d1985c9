"""Chapter 01: PTX loads/stores and the copy kernels."""
import pytest
import torch

from gemmlab import ldst
from gemmlab.compile import ptx_lines


def _ops(compiled, pattern):
    """Instruction names of matching lines, predicate guard dropped."""
    return sorted({line.split()[1] if line.startswith("@") else line.split()[0] for line in ptx_lines(compiled, pattern)})


@pytest.mark.parametrize("width,name", [(1, "u32"), (2, "v2.u32"), (4, "v4.u32")])
@pytest.mark.parametrize("unroll", [1, 4])
def test_copy_ptx_has_the_width_and_unroll(width, name, unroll):
    c = ldst.compile_copy("sm_90a", width, nwords=4 * 3000, unroll=unroll)
    loads = ptx_lines(c, r"ld\.global")
    stores = ptx_lines(c, r"st\.global")
    assert _ops(c, r"ld\.global") == [f"ld.global.{name}"]
    assert _ops(c, r"st\.global") == [f"st.global.{name}"]
    assert len(loads) == unroll and len(stores) == unroll
    # every access is predicated (the tail) ...
    assert all(line.startswith("@%p") for line in loads + stores)
    # ... and all loads come before the first store: `unroll` loads in flight
    body = ptx_lines(c, r"ld\.global|st\.global")
    assert body[:unroll] == loads


def test_copy_compiles_for_sm100_too():
    c = ldst.compile_copy("sm_100a", 4, nwords=1 << 12)
    assert "ld.global.v4.u32" in _ops(c, r"ld\.global")


def test_inline_ptx_is_volatile():
    # The same address read twice: the plain DSL loads are merged into one
    # (and x + x becomes a shift); the two inline-PTX loads both stay.
    ptx = ptx_lines(ldst.compile_twice("sm_90a", True), r"^ld\.global")
    dsl = ptx_lines(ldst.compile_twice("sm_90a", False), r"^ld\.global")
    assert len(ptx) == 2 and len(dsl) == 1


def test_wrapper_strings():
    assert ldst._vec("w", 4) == "{{$w0}, {$w1}, {$w2}, {$w3}}"
    assert ldst._vec("r", 2, 1) == "{{$r1}, {$r2}}"
    assert ldst._vec("w", 1) == "{$w0}"


def test_compile_copy_bad_args():
    with pytest.raises(ValueError, match="width"):
        ldst.compile_copy("sm_90a", 3)
    with pytest.raises(ValueError, match="target"):
        ldst.compile_copy("sm_80", 4)
    with pytest.raises(ValueError, match="nwords"):
        ldst.compile_copy("sm_90a", 4, nwords=6)
    with pytest.raises(ValueError, match="unroll"):
        ldst.compile_copy("sm_90a", 4, unroll=0)


def _t(n, dtype=torch.float32, **kw):
    return torch.zeros(n, dtype=dtype, **kw)


@pytest.mark.parametrize("make,err,match", [
    (lambda: ([1, 2], _t(2)), TypeError, "src must be a torch.Tensor"),
    (lambda: (_t(8), "x"), TypeError, "dst must be a torch.Tensor"),
    (lambda: (_t(8), _t(8, torch.int32)), TypeError, "same dtype"),
    (lambda: (_t(8), _t(12)), ValueError, "same number of elements"),
    (lambda: (_t(16)[::2], _t(8)), ValueError, "src must be contiguous"),
    (lambda: (_t(8), _t(16).view(2, 8)[:, :4]), ValueError, "dst must be contiguous"),
    (lambda: (_t(9)[1:], _t(8)), ValueError, "16-byte aligned"),
    (lambda: (_t(6), _t(6)), ValueError, "multiple of 16 bytes"),
    (lambda: (_t(8), _t(8)), ValueError, "cuda device"),
])
def test_copy_bad_input(make, err, match):
    src, dst = make()
    with pytest.raises(err, match=match):
        ldst.copy(src, dst)


def test_copy_granule_follows_width():
    # 24 bytes: fine for width 2 (8-byte accesses), not for width 4
    with pytest.raises(ValueError, match="multiple of 16 bytes"):
        ldst.copy(_t(6), _t(6), width=4)
    with pytest.raises(ValueError, match="cuda device"):
        ldst.copy(_t(6), _t(6), width=2)
    with pytest.raises(ValueError, match="multiple of 4 bytes"):
        ldst.copy(_t(6, torch.uint8), _t(6, torch.uint8), width=1)


def test_copy_too_large_and_bad_width():
    big = torch.empty(2**31, dtype=torch.int32, device="meta")
    with pytest.raises(ValueError, match="at most"):
        ldst.copy(big, big)
    with pytest.raises(ValueError, match="width"):
        ldst.copy(_t(8), _t(8), width=8)


def test_copiers_cover_every_width():
    names = ldst.copiers()
    assert set(ldst.COPIERS.values()) == {(w, u) for w in (1, 2, 4) for u in (1, 4)}
    assert set(names) == set(ldst.COPIERS)


@pytest.mark.gpu
@pytest.mark.parametrize("width", [1, 2, 4])
@pytest.mark.parametrize("unroll", [1, 4])
@pytest.mark.parametrize("nbytes", [16 * 1000003, 1 << 24, 16])
def test_copy_matches_torch(width, unroll, nbytes):
    # 16 * 1000003 bytes: not a power of two and not a multiple of a CTA's
    # share, so the predicated tail is exercised; 16 bytes: a single CTA, one lane.
    src = torch.randint(0, 256, (nbytes,), dtype=torch.uint8, device="cuda")
    dst = torch.full_like(src, 0x7F)
    ldst.copy(src, dst, width=width, unroll=unroll)
    torch.cuda.synchronize()
    assert torch.equal(src, dst)


@pytest.mark.gpu
def test_copy_any_dtype_and_shape():
    src = torch.randn(3, 5, 7, 16, dtype=torch.bfloat16, device="cuda")
    dst = torch.full_like(src, float("nan"))
    out = ldst.copy(src, dst)
    torch.cuda.synchronize()
    assert out is dst
    assert torch.equal(src.view(torch.int16), dst.view(torch.int16))


@pytest.mark.gpu
def test_copiers_pass_copybench_check():
    from gemmlab.measure.copybench import check_copier

    for name, prep in ldst.copiers().items():
        check_copier(name, prep, 4 << 20)


def test_dsl_copy_atom_emits_16_byte_accesses():
    c = ldst.compile_dsl_v4("sm_90a")
    assert [x.split()[0] for x in ptx_lines(c, r"^(ld|st)\.global")] == ["ld.global.v4.b32", "st.global.v4.b32"]


def test_the_default_copy_is_the_fastest_measured_configuration():
    """ldst.copy's default (16-byte accesses, DEFAULT_UNROLL) is the best of the stored H200 table, within 0.5 %."""
    from gemmlab.measure.bench import load_results

    doc = load_results("copy_ldst", "NVIDIA H200")
    if doc is None:
        pytest.skip("no stored copy_ldst results")
    ratio = {r["kernel"]: r["vs torch"] for r in doc["rows"] if r["kernel"] in ldst.COPIERS}
    default = next(name for name, cfg in ldst.COPIERS.items() if cfg == (4, ldst.DEFAULT_UNROLL))
    assert ratio[default] >= max(ratio.values()) - 0.005, (default, ratio)


def test_inline_ptx_is_volatile_up_to_the_ptx_only():
    """Two identical inline-PTX loads stay two in the PTX, but ptxas merges them into one LDG; ld.volatile
    keeps two in SASS. The SASS is the DSL's own cubin, disassembled with nvdisasm (no GPU needed)."""
    from gemmlab.compile import sass_opcodes

    ldg = {u: [op for op in sass_opcodes(ldst.compile_twice("sm_90a", u), r"^LDG")] for u in ldst.TWICE_LOADS}
    assert len(ptx_lines(ldst.compile_twice("sm_90a", True), r"^ld\.global")) == 2
    assert ldg[False] == ["LDG.E"] and ldg[True] == ["LDG.E"]
    assert ldg["volatile"] == ["LDG.E.STRONG.SYS"] * 2
    assert len(ptx_lines(ldst.compile_twice("sm_90a", "volatile"), r"^ld\.volatile\.global")) == 2
