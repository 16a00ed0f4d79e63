"""``continuous``: vLLM-style FCFS iteration-level batching over a paged KV cache.

Requests join and leave the batch at every step; KV blocks are allocated as tokens are produced
and, when they run out, the most recently admitted request is preempted (recompute or swap)
and requeued at the front. This is the base behaviour of the shared loop.
"""

from __future__ import annotations

from sim.core.policies import register_policy
from sim.core.policies.base import Policy


@register_policy("continuous")
class ContinuousPolicy(Policy):
    pass
