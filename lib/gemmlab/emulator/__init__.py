"""A functional emulator of the PTX that ``cute.compile`` produces for the course's kernels.

It runs a compiled kernel on the CPU, with CPU torch tensors as global memory: the
host code of the same compiled artifact the GPU path launches builds the launch
(:mod:`gemmlab.emulator.host`), and the kernel's PTX executes warp by warp.
It is functional only: it models what each instruction computes and the order
asynchronous units may complete in, never how long anything takes.
"""
