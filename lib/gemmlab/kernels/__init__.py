"""The GEMM family's device code: each module holds its kernels, their ``@cute.jit`` host functions and ``compile_*``.

Chapter 07: :mod:`.gemm_sm90`; chapter 08: :mod:`.grouped_sm90`; chapter 10: :mod:`.gemm_sm100`; chapter 11:
:mod:`.dual_gemm_sm90` (the simple Hopper twin), :mod:`.dual_gemm_sm90_pipelined` (the fast one) and
:mod:`.dual_gemm_sm100`. The host side that chooses, caches and launches them is :mod:`gemmlab.family`.
"""
