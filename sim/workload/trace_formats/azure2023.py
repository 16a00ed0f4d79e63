"""Azure LLM inference trace (Splitwise, 2023; the 2024 week-long files share the layout).

CSV columns ``TIMESTAMP, ContextTokens, GeneratedTokens``; ``TIMESTAMP`` is wall-clock
time like ``2023-11-16 18:15:46.6800000`` (7 fractional digits, no zone), which we turn
into seconds since the earliest row so the trace can be replayed from t = 0.
"""

from __future__ import annotations

from pathlib import Path

from sim.workload.trace_formats.parsing import (
    datetime_column,
    int_column,
    read_csv,
    require_rows,
)
from sim.workload.trace_formats.table import TraceTable

COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")


def load(path: Path, columns: object = None) -> TraceTable:
    """Parse an Azure LLM inference trace CSV (``columns`` is unused: the layout is fixed)."""
    raw = read_csv(path, COLUMNS)
    require_rows(raw, path)
    return TraceTable(
        arrival_s=datetime_column(raw, "TIMESTAMP", "'2023-11-16 18:15:46.6800000'"),
        prompt_len=int_column(raw, "ContextTokens"),
        output_len=int_column(raw, "GeneratedTokens"),
        source=str(path),
    )
