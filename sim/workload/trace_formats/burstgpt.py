"""BurstGPT (HPMLL/BurstGPT): Azure OpenAI GPT-3.5/GPT-4 request logs.

CSV columns ``Timestamp, Model, Request tokens, Response tokens, Total tokens, Log Type``
(newer files add ``Session ID`` and ``Elapsed time``). ``Timestamp`` is seconds since
the start of the collection.

Failed requests are **dropped**: BurstGPT records a failure as a row with
``Response tokens == 0`` (its ``*_without_fails_*`` files are the same data minus
those rows), and a request that produced nothing carries no service time to
replay. Rows with ``Request tokens == 0`` are dropped for the same reason: no
server admits an empty prompt. Both counts are logged at INFO level.

``Model`` becomes the tenant, because ChatGPT and GPT-4 traffic differ in burstiness
and lengths and per-tenant metrics should keep them apart; ``Session ID``, when
present, becomes the session.
"""

from __future__ import annotations

import logging
from pathlib import Path

from sim.errors import InputError
from sim.workload.trace_formats.parsing import (
    float_column,
    int_column,
    read_csv,
    require_rows,
    text_column,
)
from sim.workload.trace_formats.table import TraceTable

COLUMNS = ("Timestamp", "Model", "Request tokens", "Response tokens")
SESSION = "Session ID"

logger = logging.getLogger(__name__)


def load(path: Path, columns: object = None) -> TraceTable:
    """Parse a BurstGPT CSV, leaving out failed (zero-token) requests."""
    raw = read_csv(path, COLUMNS, optional=(SESSION,))
    require_rows(raw, path)
    arrival_s = float_column(raw, "Timestamp")
    prompt_len = int_column(raw, "Request tokens", minimum=0)
    output_len = int_column(raw, "Response tokens", minimum=0)
    tenant = text_column(raw, "Model")
    session = text_column(raw, SESSION) if raw.has(SESSION) else None

    failed = output_len == 0
    empty_prompt = (prompt_len == 0) & ~failed
    keep = ~(failed | empty_prompt)
    if not keep.all():
        logger.info(
            "%s: dropped %d failed requests (0 response tokens) and %d with 0 request tokens",
            path.name, int(failed.sum()), int(empty_prompt.sum()),
        )
    if not keep.any():
        raise InputError(f"{path.name}: all {len(keep)} requests failed (0 response tokens)")
    table = TraceTable(
        arrival_s=arrival_s,
        prompt_len=prompt_len,
        output_len=output_len,
        tenant=tenant,
        session=session,
        source=str(path),
    )
    return table if keep.all() else table.take(keep)
