"""Chapter 11's exercises (NVFP4, the permuted scales, the baselines, the CPU model): checkers and solutions."""
from __future__ import annotations

from . import verdict


def check_sol_megabytes(answer) -> bool:
    """Predict: how many megabytes (1e6 bytes, two decimals) must cross HBM at least once for
    M x N x K = 256 x 4096 x 7168 (packed A, B1, B2, their scales, FP16 C)?"""
    return verdict("bytes at least once", answer, solution_sol_megabytes(),
                   "Half a byte per FP4 value of A (M x K) and of B1, B2 (N x K each); one byte per 16 values of "
                   "every row of all three for the scales; two bytes per element of C (M x N). Check with "
                   "dual_gemm.problem_bytes.")


def solution_sol_megabytes():
    from ...measure.dual_gemm import problem_bytes

    return round(problem_bytes(256, 4096, 7168)["total"] / 1e6, 2)  # 36.16


def check_permuted_offset(answer) -> bool:
    """Predict: at which byte of the permuted scales of a 256-row operand with K = 7168 (448 scales a row)
    does plain scale ``[200, 5]`` (row 200, k-block 5) sit?"""
    return verdict("permuted offset", answer, solution_permuted_offset(),
                   "Find its 512-byte atom first: row block 200 // 128 and k block 5 // 4, blocks ordered rows "
                   "outer, k inner (448 / 4 = 112 k blocks a row block). Inside the atom: line 200 % 32 of 16 "
                   "bytes, then 4 bytes per row quarter (200 % 128) // 32, then 5 % 4. Check with "
                   "nvfp4.permuted_offset.")


def solution_permuted_offset():
    from ...nvfp4 import permuted_offset

    return permuted_offset(200, 5, 256, 448)  # (1 * 112 + 1) * 512 + 8 * 16 + 2 * 4 + 1 = 57993


def check_stock_weight_ratio(answer) -> bool:
    """Predict, then run: how many times the bytes of the NVFP4 weights (values and scales) do baseline (b)'s
    BF16 weights take (two decimals)? What does that mean for a decode-sized M?"""
    return verdict("BF16 over NVFP4 bytes", answer, solution_stock_weight_ratio(),
                   "BF16 is 2 bytes a value; NVFP4 is half a byte a value plus one e4m3 byte per 16 values. "
                   "Check with dual_gemm.prepare_stock(...).nbytes on a small problem.")


def solution_stock_weight_ratio():
    from ...measure.dual_gemm import prepare_stock
    from ...nvfp4 import SF_VEC, generate

    n, k = 256, 512
    ops = generate(128, n, k)
    w = prepare_stock(ops.b1, ops.b2, ops.sfb1, ops.sfb2)
    return round(w.nbytes / (2 * (n * k // 2 + n * k // SF_VEC)), 2)  # 2 / (0.5 + 1/16) = 3.56


def check_unshifted_tiles(answer) -> bool:
    """Break it, then explain: run ``dual_gemm_model.run_model`` on a 128 x 256 x 256 problem with
    ``tile_n=64`` and ``bug="sfb_not_shifted"``. Which 64-column tiles of C (indices 0..3, as a tuple) come out
    wrong, and why exactly those?"""
    return verdict("tiles without the SFB shift", answer, solution_unshifted_tiles(),
                   "A 128-row atom of B's scales serves two 64-column tiles. Compare each 64-column block of "
                   "run.c with nvfp4.reference(...) using nvfp4.check_close; which tiles start in the middle "
                   "of an atom?")


def solution_unshifted_tiles():
    import torch

    from ...dual_gemm_model import run_model
    from ...nvfp4 import check_close, generate, reference

    ops = generate(128, 256, 256, seed=0)
    ref = reference(*ops.inputs())[..., 0]
    c = torch.from_numpy(run_model(ops, tile_n=64, bug="sfb_not_shifted").c)
    return tuple(j for j in range(4) if not check_close(c[:, 64 * j:64 * j + 64], ref[:, 64 * j:64 * j + 64]).ok)


def explain_unshifted_tiles() -> str:
    """Why tiles 1 and 3 go wrong without the SFB shift, and why tile_n = 128 never shows it."""
    return ("B's scales come in 128-row atoms (the permuted 128 x 4 layout). A 64-column tile of C uses 64 rows "
            "of B: tiles 0 and 2 start at the first row of an atom, tiles 1 and 3 at row 64 of one. The kernel "
            "loads whole atoms, so an odd tile must start reading the loaded scales 64 rows in (the shift). "
            "Without it, tiles 1 and 3 use the scales of rows 0-63 of their atom, those of tiles 0 and 2: "
            "wrong, while tiles 0 and 2 are right. With tile_n = 128 every tile starts at an atom's first row, "
            "so the shift is always 0 and the bug cannot show.")


def check_e4m3_byte(answer) -> bool:
    """Predict: which e4m3 byte (an int, 0..255) does the fast Hopper twin's bit move make of the e2m1 code
    ``0b1011`` (-1.5), and what value does ``cvt.rn.f16x2.e4m3x2`` then give (so what must the scale
    multiplier be)? Answer the byte."""
    return verdict("e4m3 byte of code 0b1011", answer, solution_e4m3_byte(),
                   "The sign goes to bit 7 and the three bits e1 e0 m to bits 4..2 (exponent field 0 0 e1 e0, "
                   "mantissa m 0 0); the byte then means the e2m1 value times 2^-6. Check with "
                   "fp4_dequant.e4m3_byte_of_code.")


def solution_e4m3_byte():
    from ...fp4_dequant import e4m3_byte_of_code

    return e4m3_byte_of_code(0b1011)  # 0x8C = 140: -1.5 x 2^-6, so the multiplier is 64 x scale


def check_setmaxnreg_budget(answer) -> bool:
    """Predict: the decode twin with two MMA warpgroups runs 384 threads; ptxas gives every thread 168 registers at
    entry. Its converter warpgroup drops to 64 with ``setmaxnreg.dec``. What is the most each of the two MMA
    warpgroups may ask for with ``setmaxnreg.inc`` (a multiple of 8) without waiting forever?"""
    return verdict("setmaxnreg for two MMA warpgroups", answer, solution_setmaxnreg_budget(),
                   "setmaxnreg only moves registers the CTA already has: 384 x 168 in all. Take the converter's "
                   "128 x 64 away, share the rest between 256 MMA threads, round down to a multiple of 8.")


def solution_setmaxnreg_budget():
    threads, entry, converter = 384, 168, 64
    return (threads * entry - 128 * converter) // 256 // 8 * 8  # (64,512 - 8,192) / 256 = 220 -> 216


def explain_setmaxnreg_budget() -> str:
    """Why (64, 224) hung on an H200 while the emulator ran it."""
    return ("With (64, 224) the warpgroups ask for 128 x 64 + 256 x 224 = 65,536 registers: the whole register file, "
            "but the CTA was given 384 x 168 = 64,512 at launch (65,536 / 384 = 170.7, rounded down to 168 by "
            "ptxas). setmaxnreg.inc waits until the warpgroups' setmaxnreg.dec have freed enough of the CTA's own "
            "registers; the converter frees 128 x (168 - 64) = 13,312, the two MMA warpgroups need 256 x (224 - 168) "
            "= 14,336, so they wait forever. The emulator executes setmaxnreg as a marker and keeps no register "
            "pool, so it cannot see the shortfall: this is a rule of the hardware's allocator, checked now by "
            "arithmetic (tests/test_dual_gemm_sm90_decode.py) instead. The fast twin asks for 128 x (96 + 2 x 208) "
            "= 65,536 as well, but ptxas ignores its setmaxnreg (note C7508: the kernel does not state a register "
            "count at entry), so its warps simply keep the 168 they start with.")


def check_a_conversions(answer) -> bool:
    """Predict: at 2048 x 14336 x 4096 the fast twin runs 128-row tiles ``tile_n`` = 64 columns wide. How many times
    does it convert each FP4 value of A in all (an int)? The A16 twin converts each once."""
    return verdict("conversions of each value of A", answer, solution_a_conversions(),
                   "Every CTA converts its own 128 rows of A, for each of its k-blocks; how many CTAs share the "
                   "same 128 rows?")


def solution_a_conversions():
    return 14336 // 64  # one CTA per 64 columns of N: 224 CTAs hold the same 128 rows of A, and each converts them


def explain_a_conversions() -> str:
    """What the A16 twin pays for converting A once, at 2048 x 14336 x 4096 with tile_n 128."""
    m, n, k, tile_n = 2048, 14336, 4096, 128
    ws = m * k * 2
    return (f"A becomes an FP16 workspace of {m} x {k} x 2 = {ws / 1e6:.1f} MB, written once by the pre-pass and read "
            f"back by TMA by each of the {n // tile_n} CTAs along N: {n // tile_n} x {ws / 1e6:.1f} MB = "
            f"{n // tile_n * ws / 1e9:.2f} GB of reads, almost all from L2 (the 50 MB L2 holds the whole workspace), "
            f"and about 3.6 times the bytes per A value of packed FP4 with its scales. In exchange the MMA "
            f"warpgroups convert nothing: they wait for A and B and issue WGMMA, and the converter warpgroup's "
            f"conversions of [B1; B2] serve 128 rows of A each, fed to one m64n256k16 WGMMA per 16 K (both GEMMs, "
            f"128 columns each) where the fast twin issues two m64n64k16. On the H100 the kernel took 839 us where the fast twin took 1,161 (2026-11-27).")


def check_a16_width(answer) -> bool:
    """Predict: at 512 x 3072 x 7168 on an H100's 132 SMs, which ``tile_n`` does the A16 twin's time model pick
    (:func:`~gemmlab.family.heuristic_gated.choose_a16`), and how many CTAs does that grid have? A tuple
    ``(tile_n, ctas)``."""
    return verdict("the A16 twin's width and grid", answer, solution_a16_width(),
                   "A CTA covers 128 rows and tile_n columns; one CTA fits an SM, so ceil(CTAs / 132) is the number "
                   "of waves. Per wave the model charges K/1024 x (2.94 + 11.89 tile_n / 128) us: count the waves "
                   "of 48, 64, ..., 128 first.")


def solution_a16_width():
    from ...family.heuristic_gated import choose_a16

    m, n, k = 512, 3072, 7168
    tile_n = choose_a16(m, n, k, 132).tile_n
    return tile_n, -(-m // 128) * -(-n // tile_n)  # (96, 128): one wave; 128 wide is 96 CTAs, each 4/3 as long


def explain_a16_width() -> str:
    """Why the A16 twin's narrower tile wins at 512 x 3072 x 7168, with the model's and the H100 sweep's numbers."""
    from ...family.heuristic_gated import a16_time

    m, n, k = 512, 3072, 7168
    t = {bn: a16_time(m, n, k, bn, 132) for bn in (80, 96, 128)}
    return (f"At 128 columns the grid is 4 x 24 = 96 CTAs: one wave that leaves 36 of the 132 SMs idle, each CTA "
            f"doing 128 x 256 columns (both GEMMs) over K. At 96 it is 4 x 32 = 128 CTAs, still one wave, each doing "
            f"three quarters of the work: the model says {t[96]:.0f} us against {t[128]:.0f}. A column costs about 6 % "
            f"more at 96 (the fitted per-wave time has a part that does not shrink with the width, 2.94 us per 1024 "
            f"of K), but a third more SMs at work pay for it. At 80 the grid is 4 x 39 = 156 CTAs: two waves, "
            f"{t[80]:.0f} us. On the H100 the sweep timed 87.4 us at 96 and 103.8 at 128 (2026-11-27). So the model "
            f"does not prefer wide tiles for their own sake: among widths with the same number of waves the narrowest "
            f"is shortest, and a wider one wins only where it saves waves (at 640 x 3072 x 7168, 128 columns make "
            f"5 x 24 = 120 CTAs, one wave, where 96 make 160, two).")


def check_w16_pass_megabytes(answer) -> bool:
    """Predict: at 2048 x 4096 x 7168 the W16 route converts B1 and B2 into one FP16 workspace before its GEMM. How
    many megabytes (1e6 bytes, one decimal) does that weight pass move through HBM at least: packed values and scales
    read, FP16 written?"""
    return verdict("megabytes the weight pass moves", answer, solution_w16_pass_megabytes(),
                   "Two N x K matrices; per value half a byte packed, one sixteenth of a byte of scale (one e4m3 per 16 "
                   "values) read, and two bytes of FP16 written.", tolerance=0.05)


def solution_w16_pass_megabytes():
    n, k = 4096, 7168
    return round(2 * n * k * (0.5 + 1 / 16 + 2) / 1e6, 1)  # 150.5


def explain_w16_pass_megabytes() -> str:
    """Why the W16 route wins at 2048 rows and loses at 512, with the model's and the H100's numbers."""
    from ...family.heuristic_gated import w16_pass_us

    mb = solution_w16_pass_megabytes()
    return (f"The weight pass moves {mb} MB, and the A pre-pass another 37.6 MB at 2048 rows: at the model's HBM rate "
            f"(3.35 TB/s x 0.85) both take {w16_pass_us(2048, 4096, 7168):.0f} us, whatever the GEMM does after. The "
            f"A16 twin instead converts each weight value once per 128-row tile of C, 16 times at M = 2048, in a "
            f"converter warpgroup that (Nsight Compute, section 12) keeps the tensor pipe 63 % busy; its time grows "
            f"with M at about 0.20 us a row here, the W16 route's at 0.14 (chapter 07's kernel, nothing to convert). "
            f"At M = 512 the two passes still take {w16_pass_us(512, 4096, 7168):.0f} us (the weights' part does not "
            f"shrink) but the GEMM is a quarter of the work, so they are two fifths of the route's time: the H100 "
            f"timed 139.5 us for the route against 107.0 for the A16 twin there, and 357.1 against 406.8 at 2048 "
            f"(2026-11-27, kernels alone). The models cross "
            f"between 1024 and 1536 rows on these weights; on an H200 (4.8 TB/s) the pass is cheaper and they cross "
            f"below 1024.")


def check_swap_grid(answer) -> bool:
    """Predict: at 640 x 4096 x 7168 the swap twin with 128 tokens and two MMA warpgroups (128 weight rows of each
    GEMM per CTA, no split): how many CTAs, and how many waves on an H100's 132 SMs (one CTA per SM)? A tuple
    ``(ctas, waves)``."""
    return verdict("the swap twin's grid and waves", answer, solution_swap_grid(),
                   "The grid's x covers N in blocks of 64 weight rows per MMA warpgroup; its y covers M in token tiles.")


def solution_swap_grid():
    m, n, tokens, rows = 640, 4096, 128, 128
    ctas = -(-n // rows) * -(-m // tokens)  # 32 x 5 = 160
    return ctas, -(-ctas // 132)  # (160, 2)


def explain_swap_grid() -> str:
    """Why the swap twin loses at 640 x 4096 x 7168 and wins at 512 x 4096 x 7168, with the H100 sweep's numbers."""
    from ...family.configs import SwapConfig
    from ...family.heuristic_gated import swap_time

    t512 = swap_time(SwapConfig(128, 2, 1, 2), 512, 4096, 7168)
    t640 = swap_time(SwapConfig(128, 2, 1, 2), 640, 4096, 7168)
    return (f"At 512 rows the grid is 32 x 4 = 128 CTAs: one wave on 132 SMs, each CTA streaming 28 k-blocks; the "
            f"model says {t512:.0f} us and the H100 timed 95.6, where the A16 twin's pick took 106.1. At 640 rows it is "
            f"32 x 5 = 160 CTAs: a full wave and a second of 28 CTAs, and every CTA is as long as before, so the time "
            f"almost doubles (model {t640:.0f} us; timed 179.8, and 172.1 with 112-token tiles, 6 x 32 = 192 CTAs). The "
            f"A16 twin's 80-column tiles make 5 x 52 = 260 CTAs, two fuller waves, in 145.2 us. So the choice between "
            f"the twins is mostly a choice of grids: the swap twin's CTA computes a 128 x 128 tile of C (256 weight "
            f"rows, both GEMMs) over the whole K, and a shape whose CTA count sits just above a multiple of 132 pays "
            f"for an almost empty wave. On the same grid (128 CTAs at 512 rows, one wave for both) it is the faster "
            f"kernel; the design difference is that its converted weights never touch shared memory (each MMA "
            f"thread converts its own RS fragment), while the A16 twin stores 2 tile_n x 64 FP16 values per slice "
            f"and both MMA warpgroups read them back.")
