"""``static``: request-level (static) batching, as in a plain ``generate`` loop.

When the engine is idle it forms a batch of up to ``max_num_seqs`` waiting requests (each
reserving KV for ``prompt + max_tokens``), then runs that batch until its longest member is done:
nobody joins mid-batch and a member that finishes early keeps its slot as padding (its
response is returned with the batch). That idle slot is the waste continuous batching removes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sim.core.policies import register_policy
from sim.core.policies.base import Policy

if TYPE_CHECKING:
    from sim.core.scheduler import Scheduler


@register_policy("static")
class StaticPolicy(Policy):
    preempts = False
    reserve = "conservative"
    admits_continuously = False
    holds_finished = True
    supports_decode_runs = False  # padding members make every step of a batch distinct

    def form_batch(self, sched: Scheduler, now: float) -> None:
        if sched.running:
            return
        batch = []
        for req in self.waiting():
            if len(batch) >= sched.config.max_num_seqs:
                break
            if not sched.blocks.allocate(req, self.reserve_tokens(req, 0)):
                break
            batch.append(req)
        sched.admit_batch(batch, now)
