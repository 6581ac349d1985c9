"""Measurement: the timing harness, the benchmarks' drivers, their tables, figures and analysis, the README report.

Nothing in the chapter modules, :mod:`gemmlab.kernels` or :mod:`gemmlab.family` imports this package: a kernel is
measured from here, never the other way round. ``benchmarks/*.py`` are thin command-line scripts over it.
"""
