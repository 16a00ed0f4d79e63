"""A waiting queue ordered by a per-request key (a heap), for priority, sjf and edf.

Each policy's key is fixed when the request is queued: aging that lowers every waiting
request's value at the same rate keeps the order, so ``value - rate * (now - arrival)`` sorts
as ``value + rate * arrival`` and never needs re-sorting. Ties break by arrival, then id.
Removal from the middle (cancellation, admission of a non-head request) is lazy.
"""

from __future__ import annotations

import heapq
from typing import ClassVar

from sim.core.policies.base import Policy, PolicyParams
from sim.core.request import Request


class KeyedQueuePolicy(Policy):
    """Subclasses define ``key(req)``; smaller goes first."""

    name: ClassVar[str] = "keyed"

    def __init__(self, params: PolicyParams | None = None) -> None:
        super().__init__(params)
        self._heap: list[list] = []  # [key, arrival, req_id, seq, req or None when removed]
        self._entry: dict[int, list] = {}  # id(req) -> its live heap entry
        self._count = 0
        self._seq = 0

    def key(self, req: Request) -> float:
        raise NotImplementedError

    # -- waiting queue --------------------------------------------------------------------
    def __len__(self) -> int:
        return self._count

    def enqueue(self, req: Request, now: float) -> None:
        self._seq += 1
        entry = [self.key(req), req.arrival, req.req_id, self._seq, req]
        self._entry[id(req)] = entry
        heapq.heappush(self._heap, entry)
        self._count += 1

    def requeue_preempted(self, req: Request, now: float) -> None:
        self.enqueue(req, now)

    def _top(self) -> list | None:
        heap = self._heap
        while heap and heap[0][4] is None:
            heapq.heappop(heap)
        return heap[0] if heap else None

    def peek(self, now: float) -> Request | None:
        top = self._top()
        return top[4] if top is not None else None

    def pop(self, req: Request) -> None:
        self.remove(req)

    def remove(self, req: Request) -> bool:
        entry = self._entry.pop(id(req), None)
        if entry is None:
            return False
        entry[4] = None
        self._count -= 1
        top = self._top()  # drop dead entries at the top right away
        del top
        return True

    def waiting(self) -> list[Request]:
        return [e[4] for e in sorted((e for e in self._heap if e[4] is not None), key=lambda e: e[:4])]

    # -- decisions ------------------------------------------------------------------------
    def pick_victim(self, candidates: list[Request]) -> Request:
        """The worst-keyed running request, the latest arrival among equals."""
        return max(candidates, key=lambda r: (self.key(r), r.arrival, r.req_id))
