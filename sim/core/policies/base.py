"""The policy interface: how a scheduling policy plugs into the shared token-budget loop.

A policy owns the waiting queue (its order is the policy's main idea), chooses preemption
victims, says how much KV a request reserves when admitted, and may gate admission. The loop
itself (``sim.core.scheduler``) is shared, so every policy runs unchanged in the simulator and
on the GPU backend.
"""

from __future__ import annotations

import math
from collections import deque
from typing import TYPE_CHECKING, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from sim.core.request import Request
from sim.errors import InputError

if TYPE_CHECKING:
    from sim.core.scheduler import Scheduler


class PolicyParams(BaseModel):
    """Knobs of a policy; each policy subclasses this with its own fields.

    ``reserve`` (every policy): how much KV a request holds when admitted. ``optimistic``
    (vLLM) allocates blocks as tokens come and preempts when they run out; ``conservative``
    reserves ``prompt + reserve_ratio * max_tokens`` up front (TensorRT-LLM's
    guaranteed-no-evict at ratio 1, which never preempts; SGLang's ``new_token_ratio`` below
    1, which may). Unset keeps the policy's own default.
    """

    model_config = ConfigDict(extra="forbid", defer_build=True)
    reserve: Literal["optimistic", "conservative"] | None = None
    reserve_ratio: float = Field(1.0, gt=0, le=1)


class Policy:
    name: ClassVar[str] = "base"
    Params: ClassVar[type[PolicyParams]] = PolicyParams
    # Preempt running requests when KV blocks run out (vLLM); False waits instead (Orca).
    preempts: ClassVar[bool] = True
    # "optimistic": blocks as tokens come; "conservative": prompt + max_tokens up front.
    reserve: ClassVar[str] = "optimistic"
    # New requests join between steps (iteration-level batching); static batching says False.
    admits_continuously: ClassVar[bool] = True
    # Finished requests stay in the batch as padding until the whole batch is done.
    holds_finished: ClassVar[bool] = False
    # The waiting order never changes while time passes (no aging, no deadlines): lets the
    # simulator's fast path know that a blocked queue head stays blocked during a decode run.
    fixed_order: ClassVar[bool] = True
    # The simulator may advance runs of pure decode steps in closed form (sim/fastpath.py);
    # a policy whose decisions depend on each decode step's timing sets this False.
    supports_decode_runs: ClassVar[bool] = True
    # ``enqueue`` reads state that running steps change (fair share's counters): an arrival
    # must then not land inside a fast-path decode run, whose state is applied at its end.
    enqueue_reads_running: ClassVar[bool] = False

    # Calls cap_tokens(req, n) on each prefill chunk (per-class token budgets).
    caps_tokens: ClassVar[bool] = False

    @property
    def uses_on_scheduled(self) -> bool:
        """False when ``on_scheduled`` is the base no-op, so the loop can skip the call."""
        return type(self).on_scheduled is not Policy.on_scheduled

    def __init__(self, params: PolicyParams | None = None) -> None:
        self.params = params or self.Params()
        self._waiting: deque[Request] = deque()
        if self.params.reserve is not None and self.params.reserve != self.reserve:
            if not self.preempts:
                raise InputError(
                    f"policy.reserve: '{self.name}' never preempts, so it must reserve KV "
                    f"conservatively; 'optimistic' would deadlock when blocks run out"
                )
            self.reserve = self.params.reserve
        self._ratio = self.params.reserve_ratio

    # -- waiting queue --------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._waiting)

    def enqueue(self, req: Request, now: float) -> None:
        self._waiting.append(req)

    def requeue_preempted(self, req: Request, now: float) -> None:
        """A preempted request goes back to the front: it was admitted before everyone waiting."""
        self._waiting.appendleft(req)

    def peek(self, now: float) -> Request | None:
        return self._waiting[0] if self._waiting else None

    def pop(self, req: Request) -> None:
        """Remove ``req`` (the one ``peek`` returned) because it is being admitted."""
        if self._waiting and self._waiting[0] is req:
            self._waiting.popleft()
        else:
            self._waiting.remove(req)

    def remove(self, req: Request) -> bool:
        """Drop a waiting request (cancelled, expired); False if it was not waiting."""
        try:
            self._waiting.remove(req)
        except ValueError:
            return False
        return True

    def waiting(self) -> list[Request]:
        return list(self._waiting)

    # -- decisions ------------------------------------------------------------------------
    def pick_victim(self, candidates: list[Request]) -> Request:
        """The running request to preempt; vLLM FCFS takes the most recently admitted."""
        return candidates[-1]

    def reserve_tokens(self, req: Request, scheduled_tokens: int) -> int:
        """Positions to hold blocks for when ``req`` is admitted with ``scheduled_tokens`` now."""
        if self.reserve == "conservative":
            if self._ratio < 1.0:
                return req.prompt_len + math.ceil(req.max_tokens * self._ratio)
            return req.prompt_len + req.max_tokens
        return req.num_computed_tokens + scheduled_tokens

    def may_admit(self, sched: Scheduler, req: Request, now: float) -> bool:
        return True

    def cap_tokens(self, req: Request, num_new: int) -> int:
        """At most how many of ``num_new`` prefill positions ``req`` may run this step
        (only called when ``caps_tokens``); 0 skips it this step."""
        return num_new

    def form_batch(self, sched: Scheduler, now: float) -> None:
        """Hook run before each step; static batching forms its next batch here."""

    def on_scheduled(self, req: Request, num_new: int, now: float) -> None:
        """Hook after a request gets ``num_new`` positions this step (fair-share counters)."""

    def on_decode_run(self, reqs: list[Request], steps: list[int], now: float) -> None:
        """Decode steps done at once by the simulator's fast path: ``reqs[i]`` decoded
        ``steps[i]`` tokens. By default the same as that many ``on_scheduled`` calls
        (skipped when the policy does not use them)."""
        if self.uses_on_scheduled:
            for req, count in zip(reqs, steps, strict=True):
                for _ in range(count):
                    self.on_scheduled(req, 1, now)

    def on_finished(self, req: Request, now: float) -> None:
        """Hook when a request leaves the scheduler for any terminal state."""
