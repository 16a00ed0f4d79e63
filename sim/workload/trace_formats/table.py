"""The in-memory form of a request trace: one numpy column per request attribute."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np


def _readonly(array: np.ndarray) -> np.ndarray:
    """Freeze an array so a frozen TraceTable cannot be changed behind its back."""
    array.setflags(write=False)
    return array


@dataclass(frozen=True, eq=False, kw_only=True)
class TraceTable:
    """A request trace as parallel numpy columns, one row per request.

    Columns rather than a list of request objects: a 19k-row trace is windowed,
    rescaled and tiled with a handful of vectorized operations, and the workload
    layer builds ``Request`` objects only for the rows it replays.

    ``arrival_s`` is ``None`` for length-only traces (ShareGPT/arXiv statistics,
    ``vllm bench serve`` results); the caller pairs those with an arrival process.
    After :func:`sim.workload.traces.load_trace` it is sorted and starts at 0.0.
    ``hash_ids`` holds, per request, the ids of its prefix KV blocks of
    ``hash_block_tokens`` tokens each (Mooncake: 512); equal ids mean a reusable
    prefix block. All arrays are read-only.
    """

    arrival_s: np.ndarray | None
    prompt_len: np.ndarray
    output_len: np.ndarray
    hash_ids: list[tuple[int, ...]] | None = None
    tenant: np.ndarray | None = None
    priority: np.ndarray | None = None
    session: np.ndarray | None = None
    source: str = ""
    hash_block_tokens: int | None = None

    def __post_init__(self) -> None:
        n = len(self.prompt_len)
        columns = {
            "arrival_s": self.arrival_s,
            "output_len": self.output_len,
            "hash_ids": self.hash_ids,
            "tenant": self.tenant,
            "priority": self.priority,
            "session": self.session,
        }
        for name, column in columns.items():
            if column is not None and len(column) != n:
                raise ValueError(f"TraceTable.{name} has {len(column)} rows, prompt_len has {n}")
        if self.prompt_len.dtype != np.int64 or self.output_len.dtype != np.int64:
            raise ValueError("TraceTable lengths must be int64 arrays")
        if self.arrival_s is not None and self.arrival_s.dtype != np.float64:
            raise ValueError("TraceTable.arrival_s must be a float64 array")
        if self.priority is not None and self.priority.dtype != np.int64:
            raise ValueError("TraceTable.priority must be an int64 array")
        for array in (self.arrival_s, self.prompt_len, self.output_len, self.tenant,
                      self.priority, self.session):
            if array is not None:
                _readonly(array)

    def __len__(self) -> int:
        return len(self.prompt_len)

    @property
    def has_arrivals(self) -> bool:
        """Whether the trace carries its own arrival times (else pair it with a process)."""
        return self.arrival_s is not None

    @property
    def span_s(self) -> float:
        """Last arrival minus first arrival, 0.0 for length-only or single-request traces."""
        if self.arrival_s is None or len(self.arrival_s) == 0:
            return 0.0
        return float(self.arrival_s.max() - self.arrival_s.min())

    def take(self, index: np.ndarray) -> TraceTable:
        """Rows ``index`` (integer positions or a boolean mask) of every column, in that order."""
        index = np.asarray(index)
        if index.dtype == bool:
            index = np.flatnonzero(index)

        def pick(column: np.ndarray | None) -> np.ndarray | None:
            return None if column is None else column[index]

        hash_ids = None if self.hash_ids is None else [self.hash_ids[i] for i in index]
        return replace(
            self,
            arrival_s=pick(self.arrival_s),
            prompt_len=self.prompt_len[index],
            output_len=self.output_len[index],
            hash_ids=hash_ids,
            tenant=pick(self.tenant),
            priority=pick(self.priority),
            session=pick(self.session),
        )
