"""Any CSV or JSON-lines trace, given which column holds which request attribute.

The mapping (:class:`TraceColumns`) names the file's columns for ``prompt_len`` and
``output_len`` and, optionally, ``arrival`` (numbers in ``arrival_unit``: ``s`` or
``ms``, any origin, any order), ``tenant``, ``priority`` and ``session``. Without an
``arrival`` column the trace is length-only. CSV versus JSONL is decided from the
content (a first ``{`` means JSON lines), so file extensions do not matter.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from sim.errors import InputError
from sim.workload.trace_formats.parsing import (
    RawColumns,
    float_column,
    int_column,
    read_csv,
    read_jsonl,
    require_rows,
    text_column,
)
from sim.workload.trace_formats.table import TraceTable

_UNIT_SECONDS = {"s": 1.0, "ms": 1e-3}


class TraceColumns(BaseModel):
    """Which file column holds each request attribute, for the ``generic`` format."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    prompt_len: str = Field(min_length=1, description="column of prompt (input) token counts")
    output_len: str = Field(min_length=1, description="column of output (generated) token counts")
    arrival: str | None = Field(default=None, min_length=1, description="column of arrival times")
    arrival_unit: Literal["s", "ms"] = Field(default="s", description="unit of the arrival column")
    tenant: str | None = Field(default=None, min_length=1)
    priority: str | None = Field(default=None, min_length=1)
    session: str | None = Field(default=None, min_length=1)


def _is_jsonl(path: Path) -> bool:
    """Sniff the first non-blank byte: JSON lines start with ``{``, a CSV with a header."""
    try:
        with path.open("rb") as handle:
            head = handle.read(4096).lstrip()
    except OSError as exc:
        raise InputError(f"{path.name}: cannot read ({exc.strerror})") from None
    if head.startswith(b"["):
        raise InputError(f"{path.name}: a JSON array is not supported; write one object per line (JSONL)")
    return head.startswith(b"{")


def load(path: Path, columns: TraceColumns | None) -> TraceTable:
    """Parse a CSV/JSONL file through the user's column mapping."""
    if columns is None:
        raise InputError(
            f"{path.name}: format 'generic' needs a 'columns' mapping (prompt_len, output_len, ...)"
        )
    required = [columns.prompt_len, columns.output_len]
    optional_names = [columns.arrival, columns.tenant, columns.priority, columns.session]
    required += [name for name in optional_names if name is not None]
    reader = read_jsonl if _is_jsonl(path) else read_csv
    raw: RawColumns = reader(path, dict.fromkeys(required))
    require_rows(raw, path)

    arrival_s = None
    if columns.arrival is not None:
        arrival_s = float_column(raw, columns.arrival) * _UNIT_SECONDS[columns.arrival_unit]
    return TraceTable(
        arrival_s=arrival_s,
        prompt_len=int_column(raw, columns.prompt_len),
        output_len=int_column(raw, columns.output_len),
        tenant=None if columns.tenant is None else text_column(raw, columns.tenant),
        priority=None if columns.priority is None else int_column(raw, columns.priority, minimum=None),
        session=None if columns.session is None else text_column(raw, columns.session),
        source=str(path),
    )
