"""``fair``: the Virtual Token Counter (VTC) of "Fairness in Serving Large Language Models"
(Sheng et al., OSDI'24).

Each tenant has a counter of the service it received, ``input_weight`` per prompt (prefill)
position and ``output_weight`` per generated (decode) position, divided by the tenant's
weight (``weights: {tenant: w}``, else the request's class ``weight``, else 1). The next
request admitted is the oldest one of the backlogged tenant with the smallest counter, so a
tenant that floods the server only gets what the others leave. When a tenant with nothing
queued sends a request again its counter is lifted to the smallest counter among the tenants
being served (backlogged or running), so it cannot bank service while idle; it never goes down.
VTC's bound: two tenants that stay backlogged differ in counter by at most about
``2 * max(input_weight * max_prompt_chunk, output_weight * max_running_decodes)``. When blocks
run out, the latest admitted request of the tenant with the largest counter is preempted.
"""

from __future__ import annotations

from collections import deque

from pydantic import Field

from sim.core.policies import register_policy
from sim.core.policies.base import Policy, PolicyParams
from sim.core.request import Request


class FairParams(PolicyParams):
    input_weight: float = Field(1.0, ge=0, description="counter cost of a prompt position")
    output_weight: float = Field(2.0, ge=0, description="counter cost of a generated position")
    weights: dict[str, float] = Field(default_factory=dict,
                                      description="tenant -> share weight (default 1)")


@register_policy("fair")
class FairPolicy(Policy):
    Params = FairParams
    enqueue_reads_running = True  # a returning tenant is lifted to the active minimum
    fixed_order = False  # counters grow with every decode step, so the head can change

    def __init__(self, params: PolicyParams | None = None) -> None:
        super().__init__(params)
        self.counters: dict[str, float] = {}
        self.queues: dict[str, deque[Request]] = {}
        self.running_per_tenant: dict[str, int] = {}
        self._running: set[Request] = set()
        self._count = 0

    # -- waiting queue --------------------------------------------------------------------
    def __len__(self) -> int:
        return self._count

    def _active_min(self, exclude: str) -> float | None:
        active = [c for t, c in self.counters.items()
                  if t != exclude and (self.queues.get(t) or self.running_per_tenant.get(t))]
        return min(active) if active else None

    def enqueue(self, req: Request, now: float) -> None:
        t = req.tenant
        q = self.queues.get(t)
        if q is None:
            q = self.queues[t] = deque()
        if not q and not self.running_per_tenant.get(t):
            # A returning tenant is lifted to the active minimum (it cannot bank idle time).
            floor = self._active_min(t)
            c = self.counters.get(t, 0.0)
            self.counters[t] = c if floor is None else max(c, floor)
        else:
            self.counters.setdefault(t, 0.0)
        q.append(req)
        self._count += 1

    def requeue_preempted(self, req: Request, now: float) -> None:
        self.queues[req.tenant].appendleft(req)
        self._count += 1
        self._running.discard(req)
        self._running_delta(req.tenant, -1)

    def peek(self, now: float) -> Request | None:
        best = None
        best_c = 0.0
        counters = self.counters
        for t, q in self.queues.items():
            if q and (best is None or counters[t] < best_c):
                best, best_c = q, counters[t]
        return best[0] if best is not None else None

    def pop(self, req: Request) -> None:
        q = self.queues[req.tenant]
        if q and q[0] is req:
            q.popleft()
        else:
            q.remove(req)
        self._count -= 1
        self._running.add(req)
        self._running_delta(req.tenant, +1)

    def remove(self, req: Request) -> bool:
        q = self.queues.get(req.tenant)
        if not q:
            return False
        try:
            q.remove(req)
        except ValueError:
            return False
        self._count -= 1
        return True

    def waiting(self) -> list[Request]:
        return sorted((r for q in self.queues.values() for r in q),
                      key=lambda r: (r.arrival, r.req_id))

    def _running_delta(self, tenant: str, d: int) -> None:
        self.running_per_tenant[tenant] = self.running_per_tenant.get(tenant, 0) + d

    # -- decisions ------------------------------------------------------------------------
    def on_scheduled(self, req: Request, num_new: int, now: float) -> None:
        p = self.params
        w = p.weights.get(req.tenant)
        if w is None:  # the request's class weight (workload.classes[*].weight), else 1
            w = req.extra.get("weight", 1.0) if req.extra is not None else 1.0
        prompt = max(0, min(num_new, req.prompt_len - req.num_computed_tokens))
        cost = p.input_weight * prompt + p.output_weight * (num_new - prompt)
        self.counters[req.tenant] += cost / w

    def on_finished(self, req: Request, now: float) -> None:
        if req in self._running:
            self._running.discard(req)
            self._running_delta(req.tenant, -1)

    def pick_victim(self, candidates: list[Request]) -> Request:
        counters = self.counters
        worst = max(counters[r.tenant] for r in candidates)
        for r in reversed(candidates):
            if counters[r.tenant] == worst:
                return r
        return candidates[-1]
