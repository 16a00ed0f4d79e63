"""Client behaviour: disconnects, patience for the first token, retries with backoff.

``ClientConfig`` is the ``clients:`` block of a scenario (and of a request class, which overrides
it). ``ClientBehaviour`` runs it inside a Simulation: every timer is a plain SimPy timeout with a
callback (no process per request), so the engine's fast path sees it through ``env.peek()`` and
a timer costs one heap entry. A timer that fires after its request ended does nothing.

Outcomes a client may retry: ``429`` (refused by admission control with a ``429 ...`` reason)
and ``timeout`` (expired in the queue, or the client's own patience ran out). A retry is a new
request attempt (``attempt + 1``, same ``client_id``, same lengths and prefix) that arrives after
``min(max_backoff_s, backoff_s * multiplier ** (attempt - 1))`` seconds, shortened by up to
``jitter`` of itself at random, so a refused crowd comes back spread out rather than in lockstep.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Literal, Union

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from sim.core.admission import EXPIRED
from sim.core.request import Request, RequestState

if TYPE_CHECKING:
    from sim.engine import Simulation

PATIENCE = "client patience"
DISCONNECTED = "client disconnected"


class _Delay(BaseModel):
    model_config = ConfigDict(extra="forbid", defer_build=True)

    def sample(self, rng: np.random.Generator) -> float:
        raise NotImplementedError


class FixedDelay(_Delay):
    kind: Literal["fixed"] = "fixed"
    value: float = Field(ge=0)

    def sample(self, rng: np.random.Generator) -> float:
        return self.value


class ExponentialDelay(_Delay):
    kind: Literal["exponential"] = "exponential"
    mean: float = Field(gt=0)

    def sample(self, rng: np.random.Generator) -> float:
        return float(rng.exponential(self.mean))


class UniformDelay(_Delay):
    kind: Literal["uniform"] = "uniform"
    min: float = Field(0.0, ge=0)
    max: float = Field(ge=0)

    @model_validator(mode="after")
    def _order(self) -> UniformDelay:
        if self.max < self.min:
            raise ValueError(f"max ({self.max}) must be >= min ({self.min})")
        return self

    def sample(self, rng: np.random.Generator) -> float:
        return float(rng.uniform(self.min, self.max))


class LognormalDelay(_Delay):
    kind: Literal["lognormal"] = "lognormal"
    median: float = Field(gt=0)
    sigma: float = Field(gt=0)

    def sample(self, rng: np.random.Generator) -> float:
        return float(rng.lognormal(np.log(self.median), self.sigma))


DelayDist = Annotated[
    Union[FixedDelay, ExponentialDelay, UniformDelay, LognormalDelay],  # noqa: UP007
    Field(discriminator="kind"),
]


def _number_is_fixed(value):
    """``patience_s: 5`` is shorthand for ``{kind: fixed, value: 5}`` (a negative number is
    then refused as ``<field>.fixed.value``)."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return {"kind": "fixed", "value": value}
    return value


class DisconnectConfig(BaseModel):
    """A share of clients hangs up after a delay, whatever state their request is in."""

    model_config = ConfigDict(extra="forbid", defer_build=True)
    probability: float = Field(1.0, ge=0, le=1)
    after_s: DelayDist

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, data):
        if isinstance(data, dict) and "after_s" in data:
            data = {**data, "after_s": _number_is_fixed(data["after_s"])}
        return data


class RetryConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", defer_build=True)
    when: list[Literal["429", "timeout"]] = Field(
        default_factory=lambda: ["429", "timeout"], description="outcomes that are retried")
    max_attempts: int | None = Field(
        3, ge=1, description="attempts per client including the first; null = no cap")
    backoff_s: float = Field(1.0, ge=0)
    multiplier: float = Field(2.0, ge=1)
    max_backoff_s: float = Field(60.0, ge=0)
    jitter: float = Field(0.5, ge=0, le=1, description="shorten each backoff by up to this share")

    @field_validator("when", mode="before")
    @classmethod
    def _codes_as_text(cls, value):
        return [str(v) for v in value] if isinstance(value, list) else value

    def delay(self, attempt: int, rng: np.random.Generator) -> float:
        base = min(self.max_backoff_s, self.backoff_s * self.multiplier ** (attempt - 1))
        if self.jitter:
            base *= 1.0 - self.jitter * float(rng.random())
        return base


class ClientConfig(BaseModel):
    """The ``clients:`` block: what clients do while they wait."""

    model_config = ConfigDict(extra="forbid", defer_build=True)
    streaming: bool = Field(
        True, description="tokens reach the client as produced; false: only the whole answer")
    patience_s: DelayDist | None = Field(
        None, description="cancel when the first token (the answer if not streaming) is this late")
    disconnect: DisconnectConfig | None = None
    retry: RetryConfig | None = None

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, data):
        if isinstance(data, dict) and "patience_s" in data:
            data = {**data, "patience_s": _number_is_fixed(data["patience_s"])}
        return data

    @property
    def is_passive(self) -> bool:
        return self.patience_s is None and self.disconnect is None and self.retry is None


class ClientBehaviour:
    """Runs client timers and retries for one Simulation (built only when something is set)."""

    def __init__(self, sim: Simulation, default: ClientConfig | None,
                 per_class: dict[str, ClientConfig], expiry_s: float | None, seed: int,
                 classes: dict | None = None) -> None:
        self.sim = sim
        self.env = sim.env
        self.default = default
        self.per_class = per_class
        self.expiry_s = expiry_s
        self.classes = classes or {}
        self.rng = np.random.default_rng([seed, 0xC11E])
        self.next_id = len(sim.table)
        self.retries_scheduled = 0
        self.retries_pending = 0

    @classmethod
    def build(cls, sim: Simulation) -> ClientBehaviour | None:
        """The behaviour a scenario asks for, or None when it asks for none (no overhead)."""
        sc = sim.sc
        classes = {c.name: c for c in sc.workload.classes or []}
        per_class = {c.name: c.clients for c in classes.values() if c.clients is not None}
        default = sc.clients if sc.clients is not None and not sc.clients.is_passive else None
        expiry = sc.admission.request_expiry_s if sc.admission is not None else None
        if not classes and default is None and not per_class and expiry is None:
            return None
        return cls(sim, default, per_class, expiry, sc.seed, classes)

    def stamp(self, req: Request) -> None:
        """Copy the request's class attributes a policy may use (TTFT SLO, deadline, weight)."""
        c = self.classes.get(req.cls)
        if c is None:
            return
        if c.slo.ttft_s is not None:
            req.ttft_slo = c.slo.ttft_s
        if c.slo.e2el_s is not None:
            req.deadline = req.arrival + c.slo.e2el_s
        if c.weight != 1.0:
            req.extra = {"weight": c.weight}

    def config_for(self, req: Request) -> ClientConfig | None:
        return self.per_class.get(req.cls, self.default)

    # -- timers ---------------------------------------------------------------------------
    def _after(self, delay: float, action, req: Request) -> None:
        ev = self.env.timeout(delay)
        ev.callbacks.append(lambda _ev: action(req))

    def on_arrival(self, req: Request) -> None:
        """Arm this attempt's timers; call right before the request is submitted."""
        if self.expiry_s is not None:
            self._after(self.expiry_s, self._expire, req)
        cfg = self.config_for(req)
        if cfg is None:
            return
        if cfg.patience_s is not None:
            self._after(cfg.patience_s.sample(self.rng), self._patience, req)
        dis = cfg.disconnect
        if dis is not None and (dis.probability >= 1.0 or self.rng.random() < dis.probability):
            self._after(dis.after_s.sample(self.rng), self._disconnect, req)

    def _expire(self, req: Request) -> None:
        if req.first_scheduled is None:
            self.sim.abort(req, RequestState.TIMED_OUT, EXPIRED)

    def _patience(self, req: Request) -> None:
        cfg = self.config_for(req)
        waiting = req.first_token_time is None if cfg.streaming else True
        if waiting:
            self.sim.abort(req, RequestState.CANCELLED, PATIENCE)

    def _disconnect(self, req: Request) -> None:
        self.sim.abort(req, RequestState.CANCELLED, DISCONNECTED)

    # -- retries --------------------------------------------------------------------------
    def on_terminal(self, req: Request) -> None:
        """Called once per attempt when it reaches a terminal state: maybe retry."""
        cfg = self.config_for(req)
        retry = cfg.retry if cfg is not None else None
        if retry is None or req.state == RequestState.FINISHED:
            return
        if retry.max_attempts is not None and req.attempt >= retry.max_attempts:
            return
        if not _retryable(req, retry.when):
            return
        new = Request(
            self.next_id, 0.0, req.prompt_len, req.max_tokens, tenant=req.tenant, cls=req.cls,
            priority=req.priority, ttft_slo=req.ttft_slo, hash_ids=req.hash_ids,
            session=req.session, attempt=req.attempt + 1, client_id=req.client_id,
            record_token_times=req.token_times is not None,
        )
        self.next_id += 1
        self.retries_scheduled += 1
        self.retries_pending += 1
        self._after(retry.delay(req.attempt, self.rng), self._resubmit, new)

    def _resubmit(self, req: Request) -> None:
        self.retries_pending -= 1
        req.arrival = self.env.now
        self.sim.admit_new(req)


def _retryable(req: Request, when: list[str]) -> bool:
    if req.state == RequestState.REJECTED:
        return "429" in when and req.reason.startswith("429")
    if req.state == RequestState.TIMED_OUT:
        return "timeout" in when
    if req.state == RequestState.CANCELLED:
        return "timeout" in when and req.reason == PATIENCE
    return False
