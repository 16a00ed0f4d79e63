"""``priority``: vLLM's priority scheduling, with aging so that no class starves.

The waiting queue is ordered by ``priority`` (lower value first), ties by arrival. When KV
blocks run out the running request with the worst priority (the latest among equals) is
preempted, and a waiting request that cannot start (no blocks, or the batch is full) preempts
running requests of strictly worse priority (vLLM's priority preemption). The running batch is
kept in priority order, so the token budget goes to the most urgent requests first.

Aging: a request's effective priority falls by ``aging_rate`` per second it has waited since
arrival, ``priority - aging_rate * (now - arrival)``. Every request ages at the same rate, so
the order is that of ``priority + aging_rate * arrival`` and never needs re-sorting; a
low-priority request overtakes newer high-priority ones once it has waited
``(its priority - theirs) / aging_rate`` seconds longer than them, so it cannot starve.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import Field

from sim.core.policies import register_policy
from sim.core.policies.base import PolicyParams
from sim.core.policies.keyed import KeyedQueuePolicy
from sim.core.request import Request

if TYPE_CHECKING:
    from sim.core.scheduler import Scheduler


class PriorityParams(PolicyParams):
    aging_rate: float = Field(0.0, ge=0, description="priority levels gained per second waited")
    preempt_for_waiting: bool = Field(
        True, description="a waiting request preempts running ones of worse priority")


@register_policy("priority")
class PriorityPolicy(KeyedQueuePolicy):
    Params = PriorityParams
    supports_decode_runs = False  # priority preemption looks at the queue every step

    def key(self, req: Request) -> float:
        return req.priority + self.params.aging_rate * req.arrival

    def _rank(self, req: Request) -> tuple:
        return (self.key(req), req.arrival, req.req_id)

    def form_batch(self, sched: Scheduler, now: float) -> None:
        running = sched.running
        if not running:
            return
        running.sort(key=self._rank)
        if not self.params.preempt_for_waiting:
            return
        cfg = sched.config
        blocks = sched.blocks
        while running:
            head = self.peek(now)
            if head is None or self._rank(running[-1]) <= self._rank(head):
                return
            n = head.num_tokens - head.num_computed_tokens
            if cfg.long_prefill_token_threshold:
                n = min(n, cfg.long_prefill_token_threshold)
            n = min(n, cfg.max_num_batched_tokens)
            need = max(self.reserve_tokens(head, n), head.num_computed_tokens + n)
            if len(running) < cfg.max_num_seqs and blocks.can_allocate(head, need):
                return
            sched.preempt(running[-1], now)
