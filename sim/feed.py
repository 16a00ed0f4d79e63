"""The workload's arrivals in order, each with the time its SimPy event fires.

The arrival process submits them one by one; the fast path (``sim.fastpath``) may admit some
itself while it plans a run. Both take them from here, so an arrival happens at the same float
time whoever takes it: arrival ``i`` fires at ``T_i = T_{i-1} + (a_i - T_{i-1})`` when its
table time ``a_i`` is later than ``T_{i-1}`` (what ``env.timeout(a_i - now)`` gives when taken
at the previous arrival), else at ``T_{i-1}``.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from sim.core.request import Request

PROGRESS_EVERY = 2000


class ArrivalFeed:
    def __init__(self, arrival: list[float], make_request: Callable[[int], Request],
                 progress: Callable[[int, int], None] | None = None) -> None:
        self.arrival = arrival
        self.total = len(arrival)
        self.make_request = make_request
        self.progress = progress  # progress(arrived, total) every PROGRESS_EVERY arrivals
        self.cursor = 0  # the next arrival not taken yet
        self.last_time = 0.0  # the event time of the last one taken

    def time_after(self, prev: float, i: int) -> float:
        """Arrival ``i``'s event time when arrival ``i - 1``'s fired at ``prev``."""
        a = self.arrival[i]
        return prev + (a - prev) if a > prev else prev

    def next_time(self) -> float:
        """When the next arrival not taken yet fires; inf when there is none."""
        if self.cursor >= self.total:
            return math.inf
        return self.time_after(self.last_time, self.cursor)

    def take(self, upto: int, last_time: float) -> None:
        """Arrivals before index ``upto`` are taken; the last of them fired at ``last_time``."""
        if self.progress is not None:
            for i in range(self.cursor, upto):
                if i % PROGRESS_EVERY == 0:
                    self.progress(i, self.total)
        self.cursor = upto
        self.last_time = last_time
