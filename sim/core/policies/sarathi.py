"""``sarathi`` and ``prefill_first``: where prefill chunks go in a step's token budget.

``sarathi`` (Sarathi-Serve, OSDI'24, stall-free batching): every step first schedules the
decodes of all running requests, then fills the rest of the token budget
(``engine.max_num_batched_tokens``, Sarathi's chunk budget) with prefill chunks, so a long
prompt is spread over several steps and never stalls the ongoing decodes: inter-token latency
stays near one decode step whatever arrives.

``prefill_first`` is the prefill-prioritising order it improves on (vLLM v0's default):
running prefills take the budget before decodes, and decodes run in what is left. A long
prompt fills whole steps with its chunks and every decode waits for it (a generation stall),
which shows up as a long tail of inter-token latency.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sim.core.policies import register_policy
from sim.core.policies.base import Policy

if TYPE_CHECKING:
    from sim.core.scheduler import Scheduler


@register_policy("sarathi")
class SarathiPolicy(Policy):
    def form_batch(self, sched: Scheduler, now: float) -> None:
        if len(sched.running) > 1:
            sched.running.sort(key=lambda r: r.is_prefill)  # decodes (False) first, stable otherwise


@register_policy("prefill_first")
class PrefillFirstPolicy(Policy):
    def form_batch(self, sched: Scheduler, now: float) -> None:
        if len(sched.running) > 1:
            sched.running.sort(key=lambda r: not r.is_prefill)  # prefills first
