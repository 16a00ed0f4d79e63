"""``edf``: earliest TTFT deadline first.

A request's deadline is ``arrival + TTFT SLO``; the SLO is the request's own ``ttft_slo``
(set from its class), else ``ttft_slo_by_class[cls]``, else ``default_ttft_slo`` (seconds;
none means no deadline, served after every request that has one). The waiting queue and the
running batch's token budget go to the earliest deadline first. With ``drop_unreachable`` a
request still waiting for its first token when its deadline passes is dropped (state
``timed_out``, reason ``ttft_slo_unreachable``) instead of spending capacity on a response that
is already late, which is what lifts SLO attainment under overload.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from pydantic import Field

from sim.core.policies import register_policy
from sim.core.policies.base import PolicyParams
from sim.core.policies.keyed import KeyedQueuePolicy
from sim.core.request import Request, RequestState

if TYPE_CHECKING:
    from sim.core.scheduler import Scheduler


class EDFParams(PolicyParams):
    default_ttft_slo: float | None = Field(None, gt=0, description="seconds")
    ttft_slo_by_class: dict[str, float] = Field(default_factory=dict, description="class -> s")
    drop_unreachable: bool = False


@register_policy("edf")
class EDFPolicy(KeyedQueuePolicy):
    Params = EDFParams
    fixed_order = False  # deadlines pass while time does
    supports_decode_runs = False

    def ttft_slo(self, req: Request) -> float | None:
        if req.ttft_slo is not None:
            return req.ttft_slo
        return self.params.ttft_slo_by_class.get(req.cls, self.params.default_ttft_slo)

    def key(self, req: Request) -> float:
        slo = self.ttft_slo(req)
        return math.inf if slo is None else req.arrival + slo

    def form_batch(self, sched: Scheduler, now: float) -> None:
        if self.params.drop_unreachable:
            while True:
                top = self._top()
                if top is None or top[0] >= now:
                    break
                req = top[4]
                if req.first_token_time is not None:
                    break  # already answered (preempted later): its TTFT is settled
                sched.abort(req, RequestState.TIMED_OUT, now, "ttft_slo_unreachable")
        if len(sched.running) > 1:
            sched.running.sort(key=lambda r: (self.key(r), r.arrival, r.req_id))
