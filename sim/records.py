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
    def __init__(self) -> None:
        self.floats = {c: array("d") for c in FLOAT_COLUMNS}
        self.ints = {c: array("q") for c in INT_COLUMNS}
        self.strs: dict[str, list[str]] = {c: [] for c in STR_COLUMNS}
        self.token_times: dict[int, list[float]] = {}
        self._float_appends = tuple(self.floats[c].append for c in FLOAT_COLUMNS)
        self._int_appends = tuple(self.ints[c].append for c in INT_COLUMNS)
        self._str_appends = tuple(self.strs[c].append for c in STR_COLUMNS)

    def __len__(self) -> int:
        return len(self.ints["req_id"])

    def add(self, req: Request) -> None:
        # Bound appends in column order, fetched once per call: this runs for every request.
        (arrival, first_scheduled, first_token, finish, ttft, e2el, tpot, itl_max, queue_wait,
         gpu_seconds) = self._float_appends
        (req_id, replica, prompt_len, max_tokens, output_tokens, priority, preemptions,
         computed_tokens, cached_tokens, attempt, client_id) = self._int_appends
        state, reason, tenant, cls = self._str_appends
        first = req.first_token_time
        fin = req.finish_time
        sched = req.first_scheduled
        out = req.num_output_tokens
        at = req.arrival
        arrival(at)
        first_scheduled(NAN if sched is None else sched)
        first_token(NAN if first is None else first)
        finish(NAN if fin is None else fin)
        ttft(NAN if first is None else first - at)
        e2el(NAN if fin is None else fin - at)
        # vLLM's TPOT: time after the first token over the tokens after it.
        tpot((req.last_token_time - first) / (out - 1) if out > 1 else NAN)
        itl_max(req.itl_max if out > 1 else NAN)
        queue_wait(NAN if sched is None else sched - at)
        gpu_seconds(req.gpu_ns * 1e-9)
        req_id(req.req_id)
        replica(req.replica)
        prompt_len(req.prompt_len)
        max_tokens(req.max_tokens)
        output_tokens(out)
        priority(req.priority)
        preemptions(req.num_preemptions)
        computed_tokens(req.computed_tokens_total)
        cached_tokens(req.num_cached_tokens)
        attempt(req.attempt)
        client_id(req.client_id)
        state(req.state.value)
        reason(req.reason)
        tenant(req.tenant)
        cls(req.cls)
        if req.token_times is not None:
            self.token_times[req.req_id] = req.token_times

    def columns(self) -> dict[str, np.ndarray]:
        cols: dict[str, np.ndarray] = {}
        for name, arr in self.floats.items():
            cols[name] = np.frombuffer(arr, dtype=np.float64) if len(arr) else np.zeros(0)
        for name, arr in self.ints.items():
            cols[name] = np.frombuffer(arr, dtype=np.int64) if len(arr) else np.zeros(0, np.int64)
        for name, values in self.strs.items():
            cols[name] = np.asarray(values, dtype=object)
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
