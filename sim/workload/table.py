"""A workload as columns: one entry per request, sorted by arrival (cheap for a million requests)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class RequestTable:
    arrival: np.ndarray  # float64 seconds
    prompt_len: np.ndarray  # int64
    max_tokens: np.ndarray  # int64
    tenant: np.ndarray | None = None  # str per request
    cls: np.ndarray | None = None  # request class per request
    priority: np.ndarray | None = None  # int64, lower is more urgent
    hash_ids: list | None = None  # per request: tuple of prefix block hashes, or None
    session: np.ndarray | None = None
    extra: dict[str, np.ndarray] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.arrival)

    def sorted_by_arrival(self) -> RequestTable:
        order = np.argsort(self.arrival, kind="stable")
        if np.all(order[:-1] < order[1:]):
            return self
        return self.take(order)

    def take(self, idx: np.ndarray) -> RequestTable:
        def pick(a):
            return None if a is None else a[idx]

        return RequestTable(
            arrival=self.arrival[idx], prompt_len=self.prompt_len[idx],
            max_tokens=self.max_tokens[idx], tenant=pick(self.tenant), cls=pick(self.cls),
            priority=pick(self.priority),
            hash_ids=None if self.hash_ids is None else [self.hash_ids[i] for i in idx],
            session=pick(self.session), extra={k: v[idx] for k, v in self.extra.items()},
        )

    @staticmethod
    def concat(tables: list[RequestTable]) -> RequestTable:
        def cat(name: str, fill):
            cols = [getattr(t, name) for t in tables]
            if all(c is None for c in cols):
                return None
            return np.concatenate([
                c if c is not None else np.full(len(t), fill) for c, t in zip(cols, tables, strict=True)
            ])

        hashes = None
        if any(t.hash_ids is not None for t in tables):
            hashes = []
            for t in tables:
                hashes.extend(t.hash_ids if t.hash_ids is not None else [None] * len(t))
        keys = set().union(*(t.extra for t in tables))
        return RequestTable(
            arrival=np.concatenate([t.arrival for t in tables]),
            prompt_len=np.concatenate([t.prompt_len for t in tables]),
            max_tokens=np.concatenate([t.max_tokens for t in tables]),
            tenant=cat("tenant", "default"), cls=cat("cls", "default"),
            priority=cat("priority", 0), hash_ids=hashes, session=cat("session", ""),
            extra={k: np.concatenate([t.extra[k] for t in tables]) for k in keys},
        ).sorted_by_arrival()
