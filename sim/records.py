"""Per-request records, kept as typed columns (8 bytes a value, not a Python object each).

One row per request attempt when it reaches a terminal state (or the horizon). Column names
are the ones in ``requests.parquet``.
"""

from __future__ import annotations

from array import array
from pathlib import Path

import numpy as np

from sim.core.request import Request

NAN = float("nan")

FLOAT_COLUMNS = (
    "arrival", "first_scheduled", "first_token", "finish", "ttft", "e2el", "tpot",
    "itl_max", "queue_wait", "gpu_seconds",
)
INT_COLUMNS = (
    "req_id", "replica", "prompt_len", "max_tokens", "output_tokens", "priority",
    "preemptions", "computed_tokens", "cached_tokens", "attempt", "client_id",
)
STR_COLUMNS = ("state", "reason", "tenant", "cls")


class RecordSink:
    """Rows go into one typed array per kind (floats, ints) and one list of string tuples:
    three appends a request instead of one per column, which a million-request run feels."""

    def __init__(self) -> None:
        self._floats = array("d")
        self._ints = array("q")
        self._strs: list[tuple[str, str, str, str]] = []
        self.token_times: dict[int, list[float]] = {}

    def __len__(self) -> int:
        return len(self._strs)

    def add(self, req: Request) -> None:
        first = req.first_token_time
        fin = req.finish_time
        out = req.num_output_tokens
        arrival = req.arrival
        scheduled = req.first_scheduled
        self._floats.extend((
            arrival,
            NAN if scheduled is None else scheduled,
            NAN if first is None else first,
            NAN if fin is None else fin,
            NAN if first is None else first - arrival,  # ttft
            NAN if fin is None else fin - arrival,  # e2el
            # vLLM's TPOT: time after the first token over the tokens after it.
            (req.last_token_time - first) / (out - 1) if out > 1 else NAN,
            req.itl_max if out > 1 else NAN,
            NAN if scheduled is None else scheduled - arrival,  # queue_wait
            req.gpu_ns * 1e-9,
        ))
        self._ints.extend((
            req.req_id, req.replica, req.prompt_len, req.max_tokens, out, req.priority,
            req.num_preemptions, req.computed_tokens_total, req.num_cached_tokens, req.attempt,
            req.client_id,
        ))
        self._strs.append((req.state.value, req.reason, req.tenant, req.cls))
        if req.token_times is not None:
            self.token_times[req.req_id] = req.token_times

    def columns(self) -> dict[str, np.ndarray]:
        n = len(self._strs)
        floats = np.frombuffer(self._floats, dtype=np.float64).reshape(n, len(FLOAT_COLUMNS)) \
            if n else np.zeros((0, len(FLOAT_COLUMNS)))
        ints = np.frombuffer(self._ints, dtype=np.int64).reshape(n, len(INT_COLUMNS)) \
            if n else np.zeros((0, len(INT_COLUMNS)), np.int64)
        cols: dict[str, np.ndarray] = {}
        for k, name in enumerate(FLOAT_COLUMNS):
            cols[name] = floats[:, k].copy()
        for k, name in enumerate(INT_COLUMNS):
            cols[name] = ints[:, k].copy()
        strs = np.array(self._strs, dtype=object).reshape(n, len(STR_COLUMNS))
        for k, name in enumerate(STR_COLUMNS):
            cols[name] = strs[:, k]
        return cols

    def to_frame(self):
        import pandas as pd

        frame = pd.DataFrame(self.columns())
        return frame.sort_values("req_id", kind="stable").reset_index(drop=True)

    def write_parquet(self, path: Path) -> None:
        frame = self.to_frame()
        for name in STR_COLUMNS:
            frame[name] = frame[name].astype("category")
        frame.to_parquet(path, index=False)
