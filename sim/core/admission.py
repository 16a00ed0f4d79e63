"""Admission control and backpressure at a replica's front door, clock-free like the scheduler.

The scheduler consults an ``AdmissionController`` when a request arrives (``check``) and before
every step (``before_step``). It refuses what the server would refuse with a reason a client can
act on (``429 ...`` is retryable, ``400 ...`` is not), caps concurrency per tenant and overall,
and pauses background classes while interactive load is high: their requests wait in ``parked``,
outside the policy's queue, until the load falls below ``resume_fraction`` of the threshold
(hysteresis, so the switch does not flap). Queue expiry is a timer, so the engine owns it; its
length lives here with the other limits.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field, model_validator

from sim.core.request import Request, RequestState

if TYPE_CHECKING:
    from sim.core.scheduler import Scheduler

QUEUE_FULL = "429 queue full"
TOO_MANY_ACTIVE = "429 too many active sequences"
TENANT_CAP = "429 tenant concurrency cap"
EXPIRED = "expired in queue"
PROMPT_TOO_LONG = "400 prompt_len > max_input_tokens"
OUTPUT_TOO_LONG = "400 max_tokens > max_output_tokens"
PARKED = object()
"""``check`` returns this for a background request that waits until background work resumes."""


class BackgroundPauseConfig(BaseModel):
    """When to pause background classes (any threshold crossed) and when to resume (all below)."""

    model_config = ConfigDict(extra="forbid", defer_build=True)
    pause_waiting_over: int | None = Field(None, ge=1, description="requests waiting in the queue")
    pause_queue_wait_over_s: float | None = Field(
        None, gt=0, description="how long the request at the head of the queue has waited")
    resume_fraction: float = Field(0.5, gt=0, lt=1,
                                   description="resume when every signal is below this share")
    max_active: int | None = Field(
        None, ge=1, description="background requests queued or running at once, even unpaused")

    @model_validator(mode="after")
    def _some_threshold(self) -> BackgroundPauseConfig:
        if self.pause_waiting_over is None and self.pause_queue_wait_over_s is None:
            raise ValueError("give pause_waiting_over or pause_queue_wait_over_s")
        return self


class AdmissionConfig(BaseModel):
    """The ``admission:`` block of a scenario (TGI / vLLM front-end limits)."""

    model_config = ConfigDict(extra="forbid", defer_build=True)
    max_queue_len: int | None = Field(
        None, ge=0, description="requests waiting beyond this are refused with 429")
    max_active_seqs: int | None = Field(
        None, ge=1, description="requests in the system (waiting + running) beyond this get 429")
    max_concurrent_per_tenant: int | dict[str, int] | None = Field(
        None, description="in-flight requests per tenant (one cap for all, or per tenant name)")
    max_input_tokens: int | None = Field(None, ge=1, description="longer prompts get 400")
    max_output_tokens: int | None = Field(None, ge=1, description="larger max_tokens get 400")
    request_expiry_s: float | None = Field(
        None, gt=0, description="a request not started this long after arrival times out")
    background: BackgroundPauseConfig | None = None

    @model_validator(mode="after")
    def _positive_caps(self) -> AdmissionConfig:
        caps = self.max_concurrent_per_tenant
        if isinstance(caps, dict):
            for tenant, cap in caps.items():
                if cap < 1:
                    raise ValueError(f"max_concurrent_per_tenant.{tenant} must be >= 1 (got {cap})")
        elif caps is not None and caps < 1:
            raise ValueError(f"max_concurrent_per_tenant must be >= 1 (got {caps})")
        return self


class AdmissionController:
    def __init__(self, config: AdmissionConfig, background_classes: frozenset[str] = frozenset()):
        self.config = config
        self.background_classes = background_classes
        self.parked: deque[Request] = deque()
        self.paused = False
        self.num_pauses = 0
        self.paused_since: float | None = None
        self.paused_time = 0.0
        self.in_flight: set[Request] = set()
        self.in_flight_by_tenant: dict[str, int] = {}
        self.active_background: set[Request] = set()  # background, in the queue or running
        bg = config.background
        self._bg_cap = bg.max_active if bg is not None else None
        caps = config.max_concurrent_per_tenant
        self._tenant_cap = caps if isinstance(caps, dict) else None
        self._all_tenants_cap = caps if isinstance(caps, int) else None

    # -- intake ---------------------------------------------------------------------------
    def check(self, sched: Scheduler, req: Request, now: float):
        """None to queue ``req``, PARKED to hold it, or the reason it is refused."""
        cfg = self.config
        if cfg.max_input_tokens is not None and req.prompt_len > cfg.max_input_tokens:
            return PROMPT_TOO_LONG
        if cfg.max_output_tokens is not None and req.max_tokens > cfg.max_output_tokens:
            return OUTPUT_TOO_LONG
        if cfg.max_active_seqs is not None and len(self.in_flight) >= cfg.max_active_seqs:
            return TOO_MANY_ACTIVE
        cap = self._all_tenants_cap
        if self._tenant_cap is not None:
            cap = self._tenant_cap.get(req.tenant)
        if cap is not None and self.in_flight_by_tenant.get(req.tenant, 0) >= cap:
            return TENANT_CAP
        if cfg.max_queue_len is not None and self.num_queued(sched) >= cfg.max_queue_len:
            return QUEUE_FULL
        self.in_flight.add(req)
        self.in_flight_by_tenant[req.tenant] = self.in_flight_by_tenant.get(req.tenant, 0) + 1
        if req.cls in self.background_classes:
            cap = self._bg_cap
            if self.paused or (cap is not None and len(self.active_background) >= cap):
                self.parked.append(req)
                return PARKED
            self.active_background.add(req)
        return None

    def num_queued(self, sched: Scheduler) -> int:
        return sched.num_waiting + len(self.parked)

    def on_finished(self, req: Request) -> None:
        if req in self.in_flight:
            self.in_flight.discard(req)
            self.in_flight_by_tenant[req.tenant] -= 1
            self.active_background.discard(req)

    def unpark(self, req: Request) -> bool:
        try:
            self.parked.remove(req)
        except ValueError:
            return False
        return True

    # -- background pause -----------------------------------------------------------------
    def before_step(self, sched: Scheduler, now: float) -> None:
        bg = self.config.background
        if bg is None:
            return
        over_w = bg.pause_waiting_over
        over_q = bg.pause_queue_wait_over_s
        waiting, head_wait = self._queue_signals(sched, now)
        if not self.paused:
            if _over(waiting, head_wait, over_w, over_q):
                # The whole queue crossed a threshold; pause only if its interactive part did.
                waiting, head_wait = self._interactive_signals(sched, now)
                if _over(waiting, head_wait, over_w, over_q):
                    self._pause(sched, now)
                    return
            if self.parked:
                self._release(sched, now)
            return
        f = bg.resume_fraction
        if (over_w is None or waiting <= over_w * f) and (over_q is None or head_wait <= over_q * f):
            self._resume(sched, now)

    @staticmethod
    def _queue_signals(sched: Scheduler, now: float) -> tuple[int, float]:
        """Requests waiting and the wait of the queue's head: O(1). While paused the queue
        holds interactive requests only (background ones are parked)."""
        waiting = sched.num_waiting
        head = sched.policy.peek(now) if waiting else None
        return waiting, (now - head.arrival if head is not None else 0.0)

    def _interactive_signals(self, sched: Scheduler, now: float) -> tuple[int, float]:
        bg = self.background_classes
        waiting = 0
        oldest = now
        for req in sched.policy.waiting():
            if req.cls not in bg:
                waiting += 1
                if req.arrival < oldest:
                    oldest = req.arrival
        return waiting, now - oldest

    def _pause(self, sched: Scheduler, now: float) -> None:
        self.paused = True
        self.paused_since = now
        self.num_pauses += 1
        # Background requests still waiting step aside too; running ones finish their work.
        bg = self.background_classes
        for req in sched.policy.waiting():
            if req.cls in bg and req.state == RequestState.WAITING and sched.policy.remove(req):
                self.parked.append(req)
                self.active_background.discard(req)

    def _resume(self, sched: Scheduler, now: float) -> None:
        self.paused = False
        self.paused_time += now - self.paused_since
        self.paused_since = None
        self.parked = deque(sorted(self.parked, key=lambda r: r.arrival))
        self._release(sched, now)

    def _release(self, sched: Scheduler, now: float) -> None:
        """Move parked background requests to the queue, oldest first, up to ``max_active``."""
        cap = self._bg_cap
        parked = self.parked
        while parked and (cap is None or len(self.active_background) < cap):
            req = parked.popleft()
            self.active_background.add(req)
            sched.policy.enqueue(req, now)

    def stats(self, now: float) -> dict:
        paused = self.paused_time + (now - self.paused_since if self.paused_since is not None else 0.0)
        return {"background_pauses": self.num_pauses, "background_paused_s": paused}


def _over(waiting: int, head_wait: float, over_w: int | None, over_q: float | None) -> bool:
    return (over_w is not None and waiting > over_w) or (over_q is not None and head_wait > over_q)
