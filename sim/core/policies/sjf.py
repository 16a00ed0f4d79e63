"""``sjf``: shortest predicted job first, with aging.

The waiting queue is ordered by a prediction of each request's job size, ``predicted output
tokens + prompt_weight * prompt tokens``. The predictor is an ``oracle`` (the request's real
output length; in the simulator that is ``max_tokens``) or ``noisy``: the real length times
``exp(error_sigma * z)``, z standard normal, drawn once per request from ``seed`` (a
log-normal error, as learned length predictors show). Short jobs stop waiting behind long
ones, which lowers mean latency; aging (``aging_rate`` tokens of predicted size forgiven per
second waited) keeps long jobs from starving. When blocks run out the running request with the
largest predicted size is preempted.
"""

from __future__ import annotations

import math
import random
from typing import Literal

from pydantic import Field

from sim.core.policies import register_policy
from sim.core.policies.base import PolicyParams
from sim.core.policies.keyed import KeyedQueuePolicy
from sim.core.request import Request


class SJFParams(PolicyParams):
    predictor: Literal["oracle", "noisy"] = "oracle"
    error_sigma: float = Field(0.5, ge=0, description="log-normal sigma of the noisy predictor")
    seed: int = 0
    prompt_weight: float = Field(0.0, ge=0, description="job size per prompt token")
    aging_rate: float = Field(0.0, ge=0, description="predicted tokens forgiven per second waited")


@register_policy("sjf")
class SJFPolicy(KeyedQueuePolicy):
    Params = SJFParams

    def predicted_output(self, req: Request) -> float:
        p = self.params
        if p.predictor == "oracle":
            return float(req.max_tokens)
        z = random.Random(p.seed * 1_000_003 + req.req_id).gauss(0.0, 1.0)
        return req.max_tokens * math.exp(p.error_sigma * z)

    def key(self, req: Request) -> float:
        p = self.params
        return (self.predicted_output(req) + p.prompt_weight * req.prompt_len
                + p.aging_rate * req.arrival)
