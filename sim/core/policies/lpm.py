"""``lpm``: longest prefix match first (SGLang's cache-aware scheduling).

Before each step the waiting requests are ordered by how many of their prompt tokens the
prefix cache holds right now (most first, arrival order among equals), so requests that share
a cached prefix run while it is still cached instead of after it was evicted: a higher hit
rate and less prefill. Needs ``engine.enable_prefix_caching``; without it every match is 0 and
the order is FCFS. As in SGLang, a queue longer than ``max_queue`` is served FCFS, because
matching every waiting request each step would cost more than it saves.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

from pydantic import Field

from sim.core.policies import register_policy
from sim.core.policies.base import Policy, PolicyParams

if TYPE_CHECKING:
    from sim.core.scheduler import Scheduler


class LPMParams(PolicyParams):
    max_queue: int = Field(128, ge=1, description="longer queues fall back to FCFS")


@register_policy("lpm")
class LPMPolicy(Policy):
    Params = LPMParams
    fixed_order = False  # the order follows the cache's contents
    supports_decode_runs = False

    def form_batch(self, sched: Scheduler, now: float) -> None:
        waiting = self._waiting
        if len(waiting) < 2 or len(waiting) > self.params.max_queue:
            return
        if not getattr(sched.blocks, "caches_prefixes", False):
            return
        match = sched.blocks.match_prefix
        ranked = sorted(enumerate(waiting), key=lambda ir: (-match(ir[1]), ir[0]))
        self._waiting = deque(r for _, r in ranked)
