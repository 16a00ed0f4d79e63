"""Request classes and tenants: ``workload.classes`` in a scenario.

A class is a kind of traffic (chat, code completion, nightly batch) belonging to a tenant. Each
class either takes a ``share`` of the workload's own stream (synthetic, explicit or a trace) or
brings its own ``arrival`` process; it may set its own length distributions, a priority, SLOs
(TTFT, TPOT, E2E latency), a weight (for weighted fairness), whether it is ``background`` work
that admission control may pause, and its own client behaviour. Every metric is then reported per
class and per tenant (``summary.json``: ``per_class``, ``per_tenant``).

``workload.mix: {class: share}`` sets the shares in one place (handy in variants and ``--set``).
"""

from __future__ import annotations

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from sim.workload.arrivals import ArrivalProcess
from sim.workload.clients import ClientConfig
from sim.workload.distributions import LengthDist
from sim.workload.table import RequestTable

SHARE_TOLERANCE = 1e-6


class SLO(BaseModel):
    """A finished request meets its class's SLO when it is within every threshold given."""

    model_config = ConfigDict(extra="forbid", defer_build=True)
    ttft_s: float | None = Field(None, gt=0)
    tpot_s: float | None = Field(None, gt=0)
    e2el_s: float | None = Field(None, gt=0)

    def met(self, ttft: np.ndarray, tpot: np.ndarray, e2el: np.ndarray) -> np.ndarray:
        """Per record: within every threshold (a one-token answer has no TPOT and passes it)."""
        ok = np.ones(len(ttft), dtype=bool)
        if self.ttft_s is not None:
            ok &= ttft <= self.ttft_s
        if self.tpot_s is not None:
            ok &= np.isnan(tpot) | (tpot <= self.tpot_s)
        if self.e2el_s is not None:
            ok &= e2el <= self.e2el_s
        return ok


class RequestClass(BaseModel):
    model_config = ConfigDict(extra="forbid", defer_build=True)
    name: str = Field(min_length=1)
    tenant: str | None = Field(
        None, description="owner; default: the trace's tenant column, else 'default'")
    share: float | None = Field(None, gt=0, le=1, description="share of the workload's stream")
    arrival: ArrivalProcess | None = Field(None, description="this class's own arrival process")
    num_requests: int | None = Field(None, ge=1, description="own stream: stop after this many")
    duration_s: float | None = Field(None, gt=0, description="own stream: arrivals up to this time")
    prompt_len: LengthDist | None = None
    output_len: LengthDist | None = None
    priority: int | None = Field(None, description="lower is more urgent; default: the trace's, else 0")
    slo: SLO = Field(default_factory=SLO)
    weight: float = Field(1.0, gt=0, description="fair-share weight")
    background: bool = Field(False, description="admission control may pause this class")
    clients: ClientConfig | None = Field(None, description="overrides the scenario's clients block")

    @model_validator(mode="after")
    def _one_source(self) -> RequestClass:
        if self.share is not None and self.arrival is not None:
            raise ValueError(f"class {self.name!r}: give share or arrival, not both")
        if self.arrival is None and (self.num_requests is not None or self.duration_s is not None):
            raise ValueError(f"class {self.name!r}: num_requests and duration_s need an arrival")
        if self.arrival is not None and self.arrival.kind == "all_at_once" and self.num_requests is None:
            raise ValueError(f"class {self.name!r}: an all_at_once arrival needs num_requests")
        return self


def check_classes(classes: list[RequestClass], mix: dict[str, float] | None,
                  has_stream_bounds: bool) -> None:
    """Cross-class rules; raises ValueError with a message naming the field."""
    names = [c.name for c in classes]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ValueError(f"workload.classes: duplicate class name(s) {', '.join(dupes)}")
    if mix is not None:
        unknown = [n for n in mix if n not in names]
        if unknown:
            raise ValueError(f"workload.mix: unknown class {unknown[0]!r} (classes: {', '.join(names)})")
        bad = [n for n, s in mix.items() if not 0 < s <= 1]
        if bad:
            raise ValueError(f"workload.mix.{bad[0]}: a share is in (0, 1] (got {mix[bad[0]]})")
        owned = [c.name for c in classes if c.arrival is not None and c.name in mix]
        if owned:
            raise ValueError(f"workload.mix: class {owned[0]!r} has its own arrival, so no share")
        if any(c.share is not None for c in classes):
            raise ValueError("workload.mix: give shares in mix or in the classes, not both")
    shares = class_shares(classes, mix)
    if shares:
        total = sum(shares.values())
        if abs(total - 1.0) > SHARE_TOLERANCE:
            where = "workload.mix" if mix is not None else "workload.classes[*].share"
            raise ValueError(f"{where}: shares sum to {total:g}, must be 1")
    missing = [c.name for c in classes if c.arrival is None and c.name not in shares]
    if missing:
        if len(classes) == 1:
            return  # a single class takes the whole stream
        raise ValueError(f"workload.classes: class {missing[0]!r} needs a share or its own arrival")
    for c in classes:
        if c.arrival is not None and c.num_requests is None and c.duration_s is None \
                and not has_stream_bounds:
            raise ValueError(f"workload.classes: class {c.name!r} needs num_requests or duration_s "
                             "(or workload.duration_s)")


def class_shares(classes: list[RequestClass], mix: dict[str, float] | None) -> dict[str, float]:
    if mix is not None:
        return dict(mix)
    shares = {c.name: c.share for c in classes if c.share is not None}
    if not shares and len(classes) == 1 and classes[0].arrival is None:
        shares = {classes[0].name: 1.0}
    return shares


def _rng(seed: int, k: int) -> np.random.Generator:
    return np.random.default_rng([seed, 0xC1A5, k])


def apply_classes(cfg, main: RequestTable | None, seed: int, synthetic: bool) -> RequestTable:
    """Label the main stream with classes by share and add each own-arrival class's stream.

    ``synthetic``: the main stream's lengths were drawn from the workload's distributions, so
    a class with its own distributions redraws them; trace and explicit lengths are kept.
    """
    from sim.workload.spec import _count_for_duration

    classes: list[RequestClass] = cfg.classes
    shares = class_shares(classes, cfg.mix)
    parts: list[RequestTable] = []
    if main is not None and shares and len(main):
        names = list(shares)
        p = np.array([shares[n] for n in names], dtype=np.float64)
        pick = _rng(seed, 0).choice(len(names), size=len(main), p=p / p.sum())
        n = len(main)
        cls = np.array(names, dtype=object)[pick]
        tenant = main.tenant.astype(object) if main.tenant is not None else np.full(n, "default", object)
        prio = main.priority.copy() if main.priority is not None else np.zeros(n, np.int64)
        prompt, out = main.prompt_len.copy(), main.max_tokens.copy()
        by_name = {c.name: c for c in classes}
        for i, name in enumerate(names):
            c = by_name[name]
            mask = pick == i
            k = int(mask.sum())
            if c.tenant is not None:
                tenant[mask] = c.tenant
            if c.priority is not None:
                prio[mask] = c.priority
            if synthetic and c.prompt_len is not None:
                prompt[mask] = c.prompt_len.sample(_rng(seed, 100 + i), k)
            if synthetic and c.output_len is not None:
                out[mask] = c.output_len.sample(_rng(seed, 200 + i), k)
        parts.append(RequestTable(
            arrival=main.arrival, prompt_len=prompt, max_tokens=out, tenant=tenant, cls=cls,
            priority=prio, hash_ids=main.hash_ids, session=main.session, extra=main.extra))
    for i, c in enumerate(classes):
        if c.arrival is None:
            continue
        rng = _rng(seed, 300 + i)
        duration = c.duration_s if c.duration_s is not None else cfg.duration_s
        if c.num_requests is not None:
            arrival = c.arrival.times(rng, c.num_requests)
            if duration is not None:
                arrival = arrival[arrival < duration]
        else:
            arrival = _count_for_duration(c.arrival, rng, duration)
        k = len(arrival)
        prompt_dist = c.prompt_len or cfg.prompt_len
        output_dist = c.output_len or cfg.output_len
        parts.append(RequestTable(
            arrival=arrival,
            prompt_len=prompt_dist.sample(_rng(seed, 400 + i), k),
            max_tokens=output_dist.sample(_rng(seed, 500 + i), k),
            tenant=np.full(k, c.tenant or "default", dtype=object),
            cls=np.full(k, c.name, dtype=object),
            priority=np.full(k, c.priority or 0, dtype=np.int64),
        ))
    if not parts:
        return RequestTable(arrival=np.zeros(0), prompt_len=np.zeros(0, np.int64),
                            max_tokens=np.zeros(0, np.int64))
    return RequestTable.concat(parts) if len(parts) > 1 else parts[0].sorted_by_arrival()
