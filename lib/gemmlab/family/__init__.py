"""The GEMM family's host side, in layers (chapters 07, 10; 08 and 11 build on it).

Like DeepGEMM's host side, a call goes down four layers, and imports flow the
same way (each module imports only the ones above it)::

    problem        the contract: tensors -> a frozen GemmProblem (checks, M = 1 handling)
    configs        one dataclass per architecture: what a compiled kernel is (sizes from the dtype)
    heuristic_sm90 / heuristic_sm100
                   problem + SM count -> the config to run
    (kernels)      gemmlab.kernels.gemm_sm90 / gemmlab.kernels.gemm_sm100: kernel + @cute.jit host code
    plan           problem -> compiled kernel (cached per config and layout) + its runtime
                   arguments; a Plan's launch binds only the tensors and the stream
    api            gemmlab.gemm(a, b, out=None): a dictionary lookup, then the plan's launch

``tables`` (benchmark tables and figures) and ``benchmark`` (the shape family and
its timing) sit beside ``api``; nothing below imports them.
"""
