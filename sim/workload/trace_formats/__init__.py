"""Readers for request-trace file formats, one module per format.

Each module exposes ``load(path, columns) -> TraceTable`` that parses one file into
columns of validated numbers with *raw* arrival times in seconds (any origin, any
order). Windowing, rescaling, sampling and tiling are format-independent and live in
:mod:`sim.workload.traces`, so a new format only has to get parsing and error
messages right.
"""
