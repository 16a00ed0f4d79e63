"""``orca``: iteration-level scheduling (Orca, OSDI'22) with KV reserved up front.

Like ``continuous`` requests join and leave at every step, but each admitted request reserves
KV for its whole ``prompt + max_tokens`` at admission, so a running request never runs out of
blocks and nothing is ever preempted; the price is fewer requests in flight.
"""

from __future__ import annotations

from sim.core.policies import register_policy
from sim.core.policies.base import Policy


@register_policy("orca")
class OrcaPolicy(Policy):
    preempts = False
    reserve = "conservative"
