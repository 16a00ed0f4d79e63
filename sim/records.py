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

    def __len__(self) -> int:
        return len(self.ints["req_id"])

    def add(self, req: Request) -> None:
        f, i, s = self.floats, self.ints, self.strs
        first = req.first_token_time
        fin = req.finish_time
        out = req.num_output_tokens
        f["arrival"].append(req.arrival)
        f["first_scheduled"].append(NAN if req.first_scheduled is None else req.first_scheduled)
        f["first_token"].append(NAN if first is None else first)
        f["finish"].append(NAN if fin is None else fin)
        f["ttft"].append(NAN if first is None else first - req.arrival)
        f["e2el"].append(NAN if fin is None else fin - req.arrival)
        # vLLM's TPOT: time after the first token over the tokens after it.
        f["tpot"].append((req.last_token_time - first) / (out - 1) if out > 1 else NAN)
        f["itl_max"].append(req.itl_max if out > 1 else NAN)
        f["queue_wait"].append(
            NAN if req.first_scheduled is None else req.first_scheduled - req.arrival
        )
        f["gpu_seconds"].append(req.gpu_ns * 1e-9)
        i["req_id"].append(req.req_id)
        i["replica"].append(req.replica)
        i["prompt_len"].append(req.prompt_len)
        i["max_tokens"].append(req.max_tokens)
        i["output_tokens"].append(out)
        i["priority"].append(req.priority)
        i["preemptions"].append(req.num_preemptions)
        i["computed_tokens"].append(req.computed_tokens_total)
        i["cached_tokens"].append(req.num_cached_tokens)
        i["attempt"].append(req.attempt)
        i["client_id"].append(req.client_id)
        s["state"].append(req.state.value)
        s["reason"].append(req.reason)
        s["tenant"].append(req.tenant)
        s["cls"].append(req.cls)
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
