"""``class_budget``: per-class minimum shares of the token budget and the KV cache.

Classes named in ``min_token_share`` / ``min_kv_share`` are protected (interactive); every
other class is batch. Protected requests are queued and scheduled ahead of batch ones (FCFS
within each group). Each step, the protected classes keep up to ``sum(min_token_share)`` of
``max_num_batched_tokens`` for their own work (running and waiting); batch prefill chunks get
only the rest, so a flood of long batch prompts cannot take the whole step. A batch request
is admitted only if the KV blocks left after it still cover the part of the protected
``min_kv_share`` the protected classes are not using. Shares a protected class does not use
are idle capacity, and batch classes fill it. When blocks run out, batch requests are
preempted first.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

from pydantic import Field

from sim.core.blocks import blocks_for
from sim.core.policies import register_policy
from sim.core.policies.base import Policy, PolicyParams
from sim.core.request import Request

if TYPE_CHECKING:
    from sim.core.scheduler import Scheduler


class ClassBudgetParams(PolicyParams):
    min_token_share: dict[str, float] = Field(default_factory=dict,
                                              description="class -> share of the token budget")
    min_kv_share: dict[str, float] = Field(default_factory=dict,
                                           description="class -> share of the KV blocks")


@register_policy("class_budget")
class ClassBudgetPolicy(Policy):
    Params = ClassBudgetParams
    caps_tokens = True
    fixed_order = False
    supports_decode_runs = False

    def __init__(self, params: PolicyParams | None = None) -> None:
        super().__init__(params)
        p = self.params
        self.protected = frozenset(p.min_token_share) | frozenset(p.min_kv_share)
        self.token_share = min(1.0, sum(p.min_token_share.values()))
        self.kv_share = min(1.0, sum(p.min_kv_share.values()))
        self._prot: deque[Request] = deque()
        self._batch_left = 0
        self._kv_headroom = 0

    # -- waiting queue: protected first -----------------------------------------------------
    def _queue(self, req: Request) -> deque[Request]:
        return self._prot if req.cls in self.protected else self._waiting

    def __len__(self) -> int:
        return len(self._prot) + len(self._waiting)

    def enqueue(self, req: Request, now: float) -> None:
        self._queue(req).append(req)

    def requeue_preempted(self, req: Request, now: float) -> None:
        self._queue(req).appendleft(req)

    def peek(self, now: float) -> Request | None:
        if self._prot:
            return self._prot[0]
        return self._waiting[0] if self._waiting else None

    def pop(self, req: Request) -> None:
        q = self._queue(req)
        if q and q[0] is req:
            q.popleft()
        else:
            q.remove(req)

    def remove(self, req: Request) -> bool:
        try:
            self._queue(req).remove(req)
        except ValueError:
            return False
        return True

    def waiting(self) -> list[Request]:
        return [*self._prot, *self._waiting]

    # -- the step -------------------------------------------------------------------------
    def form_batch(self, sched: Scheduler, now: float) -> None:
        cfg = sched.config
        budget = cfg.max_num_batched_tokens
        running = sched.running
        prot = self.protected
        if len(running) > 1:
            running.sort(key=lambda r: r.cls not in prot)  # protected first
        demand = sum(r.remaining_tokens for r in running if r.cls in prot)
        demand += sum(r.remaining_tokens for r in self._prot)
        self._batch_left = budget - min(int(self.token_share * budget), demand)
        reserved_kv = int(self.kv_share * sched.blocks.num_blocks)
        used = sum(len(r.block_table) for r in running if r.cls in prot)
        self._kv_headroom = max(0, reserved_kv - used)

    def cap_tokens(self, req: Request, num_new: int) -> int:
        if req.cls in self.protected:
            return num_new
        n = min(num_new, self._batch_left)
        self._batch_left -= max(n, 0)
        return n

    def may_admit(self, sched: Scheduler, req: Request, now: float) -> bool:
        if req.cls in self.protected or not self._kv_headroom:
            return True
        first = min(req.num_tokens - req.num_computed_tokens, sched.config.max_num_batched_tokens)
        need = blocks_for(max(self.reserve_tokens(req, first), first), sched.blocks.block_size)
        return sched.blocks.num_free - need >= self._kv_headroom

    def pick_victim(self, candidates: list[Request]) -> Request:
        for r in reversed(candidates):
            if r.cls not in self.protected:
                return r
        return candidates[-1]
