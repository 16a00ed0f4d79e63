"""The ``workload:`` block of a scenario and how it becomes a RequestTable."""

from __future__ import annotations

from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from sim.errors import InputError
from sim.workload.arrivals import ArrivalProcess, PoissonArrival
from sim.workload.classes import RequestClass, apply_classes, check_classes, class_shares
from sim.workload.distributions import FixedDist, LengthDist
from sim.workload.table import RequestTable


class ExplicitRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", defer_build=True)
    arrival: float = Field(0.0, ge=0)
    prompt_len: int = Field(ge=1)
    max_tokens: int = Field(ge=1)
    tenant: str = "default"
    priority: int = 0


class WorkloadConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", defer_build=True)
    # Generated columns take ~40 bytes a request: 10^8 is a few GB, beyond that is a typo.
    num_requests: int | None = Field(None, ge=1, le=100_000_000)
    duration_s: float | None = Field(None, gt=0, description="generate arrivals up to this time")
    arrival: ArrivalProcess = Field(default_factory=lambda: PoissonArrival(rate=1.0))
    prompt_len: LengthDist = Field(default_factory=lambda: FixedDist(value=512))
    output_len: LengthDist = Field(default_factory=lambda: FixedDist(value=128))
    # Vidur-style lengths: a total length split into prompt and output by a prefill:decode ratio.
    total_len: LengthDist | None = None
    prefill_decode_ratio: float | None = Field(None, gt=0)
    requests: list[ExplicitRequest] | None = None
    trace: Any | None = None  # sim.workload.traces.TraceSpec, validated when used
    # Tenants and request classes (sim.workload.classes); mix: {class: share of the stream}.
    classes: list[RequestClass] | None = None
    mix: dict[str, float] | None = None

    @model_validator(mode="after")
    def _one_source(self) -> WorkloadConfig:
        own_streams_only = self.classes is not None and not class_shares(self.classes, self.mix)
        if self.requests is None and self.trace is None and not own_streams_only:
            if self.num_requests is None and self.duration_s is None:
                raise ValueError("give num_requests or duration_s (or requests, or trace)")
        if (self.total_len is None) != (self.prefill_decode_ratio is None):
            raise ValueError("total_len and prefill_decode_ratio go together")
        if self.mix is not None and self.classes is None:
            raise ValueError("workload.mix: names shares of workload.classes, which is not given")
        if self.classes is not None:
            check_classes(self.classes, self.mix,
                          self.duration_s is not None or self.num_requests is not None)
        return self


def _streams(seed: int, n: int) -> list[np.random.Generator]:
    """Independent generators so that changing one knob does not reshuffle the others."""
    return [np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(n)]


def _count_for_duration(arrival, rng: np.random.Generator, duration: float) -> np.ndarray:
    times = arrival.times(rng, 1024)
    while times[-1] < duration:
        more = arrival.times(rng, len(times))
        times = np.concatenate([times, times[-1] + more - arrival.start_s])
    return times[times < duration]


def synthetic_lengths(cfg: WorkloadConfig, rngs, n: int) -> tuple[np.ndarray, np.ndarray]:
    if cfg.total_len is not None:
        total = cfg.total_len.sample(rngs[0], n)
        out = np.maximum(1, np.rint(total / (1.0 + cfg.prefill_decode_ratio))).astype(np.int64)
        prompt = np.maximum(1, total - out)
        return prompt, out
    return cfg.prompt_len.sample(rngs[0], n), cfg.output_len.sample(rngs[1], n)


def build_workload(cfg: WorkloadConfig, seed: int) -> RequestTable:
    if cfg.classes is None:
        return _main_stream(cfg, seed)
    shares = class_shares(cfg.classes, cfg.mix)
    main = _main_stream(cfg, seed) if shares else None
    synthetic = cfg.requests is None and cfg.trace is None
    return apply_classes(cfg, main, seed, synthetic)


def _main_stream(cfg: WorkloadConfig, seed: int) -> RequestTable:
    rng_arrival, rng_prompt, rng_output, rng_trace = _streams(seed, 4)
    if cfg.requests is not None:
        reqs = cfg.requests
        return RequestTable(
            arrival=np.array([r.arrival for r in reqs], dtype=np.float64),
            prompt_len=np.array([r.prompt_len for r in reqs], dtype=np.int64),
            max_tokens=np.array([r.max_tokens for r in reqs], dtype=np.int64),
            tenant=np.array([r.tenant for r in reqs]),
            priority=np.array([r.priority for r in reqs], dtype=np.int64),
        ).sorted_by_arrival()
    if cfg.trace is not None:
        return trace_workload(cfg, rng_trace, rng_arrival)
    if cfg.duration_s is not None:
        arrival = _count_for_duration(cfg.arrival, rng_arrival, cfg.duration_s)
        if cfg.num_requests is not None:
            arrival = arrival[: cfg.num_requests]
    else:
        arrival = cfg.arrival.times(rng_arrival, cfg.num_requests)
    prompt, out = synthetic_lengths(cfg, [rng_prompt, rng_output], len(arrival))
    return RequestTable(arrival=arrival, prompt_len=prompt, max_tokens=out)


def trace_workload(cfg: WorkloadConfig, rng_trace, rng_arrival) -> RequestTable:
    from pydantic import ValidationError

    from sim.workload.traces import TraceSpec, load_trace

    try:
        spec = cfg.trace if isinstance(cfg.trace, TraceSpec) else TraceSpec.model_validate(cfg.trace)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        raise InputError(f"workload.trace.{where}: {err['msg']}") from None
    table = load_trace(spec, rng_trace)
    n = len(table.prompt_len)
    if n == 0:
        raise InputError(f"workload.trace: {spec.path} holds no requests")
    if table.arrival_s is None:
        # Length-only traces take arrivals from the scenario's arrival process, and their
        # lengths in trace order (from the start again when the arrivals outnumber the rows).
        if cfg.duration_s is not None:
            arrival = _count_for_duration(cfg.arrival, rng_arrival, cfg.duration_s)
            if cfg.num_requests is not None:
                arrival = arrival[: cfg.num_requests]
        else:
            arrival = cfg.arrival.times(rng_arrival, cfg.num_requests or n)
        idx = np.arange(len(arrival)) % n
    else:
        arrival = table.arrival_s
        idx = np.arange(n)
        if cfg.num_requests is not None:
            idx = idx[: cfg.num_requests]
            arrival = arrival[idx]
    return RequestTable(
        arrival=np.asarray(arrival, dtype=np.float64),
        prompt_len=np.asarray(table.prompt_len[idx], dtype=np.int64),
        max_tokens=np.asarray(table.output_len[idx], dtype=np.int64),
        tenant=None if table.tenant is None else table.tenant[idx],
        priority=None if table.priority is None else table.priority[idx],
        hash_ids=None if table.hash_ids is None else [table.hash_ids[i] for i in idx],
        session=None if table.session is None else table.session[idx],
    ).sorted_by_arrival()
