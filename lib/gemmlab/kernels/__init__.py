"""The GEMM family's device code: each module holds its kernels, their ``@cute.jit`` host functions and ``compile_*``.

Chapter 07: :mod:`.gemm_sm90`; chapter 08: :mod:`.grouped_sm90`; chapter 10: :mod:`.gemm_sm100`; chapter 11:
:mod:`.dual_gemm_sm90` (the simple Hopper twin), :mod:`.dual_gemm_sm90_pipelined` (the fast one), the decode, A16 and
swap twins (:mod:`.dual_gemm_sm90_decode`, :mod:`.dual_gemm_sm90_a16`, :mod:`.dual_gemm_sm90_swap`), the W16 route
(:mod:`.dual_gemm_sm90_w16`) and :mod:`.dual_gemm_sm100`. The host side that chooses, caches and launches them is :mod:`gemmlab.family`.
"""
