"""Length-only traces: ``num_prefill_tokens, num_decode_tokens`` per request.

This is the layout of the ShareGPT and arXiv-summarization statistics shipped with
Vidur and Sarathi-Serve. They carry no arrival times (``arrival_s`` is ``None``):
the caller pairs them with an arrival process. Other columns (``num_total_tokens``,
``pd_ratio``) are derived and ignored.
"""

from __future__ import annotations

from pathlib import Path

from sim.workload.trace_formats.parsing import int_column, read_csv, require_rows
from sim.workload.trace_formats.table import TraceTable

COLUMNS = ("num_prefill_tokens", "num_decode_tokens")


def load(path: Path, columns: object = None) -> TraceTable:
    """Parse a length-only CSV (``columns`` is unused: the layout is fixed)."""
    raw = read_csv(path, COLUMNS)
    require_rows(raw, path)
    return TraceTable(
        arrival_s=None,
        prompt_len=int_column(raw, "num_prefill_tokens"),
        output_len=int_column(raw, "num_decode_tokens"),
        source=str(path),
    )
