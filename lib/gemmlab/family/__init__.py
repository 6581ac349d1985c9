"""The GEMM family's host side, in layers: the dense GEMM (chapters 07, 10), the grouped GEMM (08), the gated
NVFP4 dual GEMM (11).

Like DeepGEMM's host side, a call goes down the layers, and imports flow the
same way (each module imports only the ones above it)::

    problem        the contracts: tensors -> a frozen GemmProblem / GroupedProblem / GatedProblem (every check)
    configs        every config dataclass: what a compiled kernel is (sizes from the dtype, fits checked)
    heuristic_sm90 / heuristic_sm100 / heuristic_grouped / heuristic_gated
                   problem + GPU -> the config to run (and the grouped grid and schedule)
    (kernels)      gemmlab.kernels: the kernels, their @cute.jit host code, compile_*(target, cfg, ...)
    plan           one compile cache for every kind; a plan per call signature: config, grid, schedule,
                   compiled function, workspace; its launch binds only the tensors
    api            gemmlab.gemm, grouped_gemm, grouped_gemm_list, gated_dual_gemm: a dictionary lookup
                   keyed on the call signature, then the plan's launch

What measures the family (benchmarks, tables, figures) is :mod:`gemmlab.measure`; nothing here imports it.
"""
