"""Scenario files: the pydantic schema, YAML loading, ``--set`` overrides and variants.

Every validation problem becomes one ``InputError`` line naming the file, the dotted field and
what is allowed, so the CLI can print it and exit 2.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from sim.core.admission import AdmissionConfig
from sim.errors import InputError
from sim.workload.clients import ClientConfig
from sim.workload.spec import WorkloadConfig


class _Strict(BaseModel):
    # defer_build (here and on the models a Scenario nests): no validator is built at import;
    # the first validate() builds Scenario's alone, which saves start-up time in every run.
    model_config = ConfigDict(extra="forbid", defer_build=True)


class EngineConfig(_Strict):
    """Knobs of one serving replica; names follow vLLM."""

    max_num_seqs: int = Field(256, ge=1)
    max_num_batched_tokens: int = Field(8192, ge=1)
    enable_chunked_prefill: bool = True
    long_prefill_token_threshold: int = Field(0, ge=0)
    block_size: int = Field(16, ge=1)
    gpu_memory_utilization: float = Field(0.9, gt=0, le=1)
    num_gpu_blocks_override: int | None = Field(None, ge=1)
    activation_reserve_gb: float = Field(2.0, ge=0)
    max_model_len: int | None = Field(None, ge=1)
    preemption_mode: Literal["recompute", "swap"] = "recompute"
    swap_space_gb: float = Field(4.0, ge=0)
    # Automatic prefix caching (vLLM): full prompt blocks named by the requests' hash_ids are
    # shared; prefix_block_tokens is the token count each hash id stands for (Mooncake: 512).
    enable_prefix_caching: bool = False
    prefix_block_tokens: int = Field(512, ge=1)


class PolicyConfig(BaseModel):
    """``name`` picks a policy from the registry; every other key is that policy's knob."""

    model_config = ConfigDict(extra="allow", defer_build=True)
    name: str = "continuous"

    @property
    def params(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


class CostModelConfig(_Strict):
    kind: Literal["roofline", "profile"] = "profile"
    path: str = "default"


class SimulationConfig(_Strict):
    horizon_s: float | None = Field(None, gt=0, description="stop here; unfinished are reported")
    exact_steps: bool = False
    record_token_times: bool = False
    record_steps: bool = Field(False, description="keep every step's batch (slot timelines)")
    timeseries_interval_s: float = Field(0.5, gt=0)


class ClusterConfig(_Strict):
    """Replicas of the engine behind a router (``sim.router.ROUTERS``)."""

    replicas: int = Field(1, ge=1)
    router: str = "round_robin"

    @field_validator("router")
    @classmethod
    def _known_router(cls, value: str) -> str:
        from sim.router import ROUTERS

        if value not in ROUTERS:
            raise ValueError(f"unknown router '{value}'; allowed: {', '.join(ROUTERS)}")
        return value


class SweepConfig(_Strict):
    """``sweep:``: the product of ``grid`` lists, times the rows of the zipped ``zip`` lists,
    times ``rates`` (the workload's arrival rate), times the scenario's variants."""

    grid: dict[str, list[Any]] = Field(default_factory=dict)
    zip: dict[str, list[Any]] = Field(default_factory=dict)
    rates: list[float] | None = None

    @model_validator(mode="after")
    def _shapes(self) -> SweepConfig:
        for key, values in self.grid.items():
            if not values:
                raise ValueError(f"grid.{key} is empty")
        lengths = {len(v) for v in self.zip.values()}
        if len(lengths) > 1:
            raise ValueError(f"zip lists must have one length, got {sorted(lengths)}")
        if self.rates is not None and any(r <= 0 for r in self.rates):
            raise ValueError("rates must be > 0")
        return self


class SLOConfig(_Strict):
    """Per-request thresholds (a request attains the SLO when it finished within all of them)
    with the share of requests that must attain it, and optional limits on P99s."""

    ttft_ms: float | None = Field(None, gt=0)
    tpot_ms: float | None = Field(None, gt=0)
    e2el_ms: float | None = Field(None, gt=0)
    attainment: float = Field(0.9, gt=0, le=1)
    p99_ttft_ms: float | None = Field(None, gt=0)
    p99_tpot_ms: float | None = Field(None, gt=0)
    p99_itl_ms: float | None = Field(None, gt=0)
    p99_e2el_ms: float | None = Field(None, gt=0)


class RateSearchConfig(_Strict):
    low: float = Field(0.25, gt=0, description="req/s per replica, start of the bisection")
    high: float = Field(64.0, gt=0, description="req/s per replica, end of the bisection")
    rel_tol: float = Field(0.05, gt=0, lt=1, description="stop when high/low - 1 is below this")
    max_iters: int = Field(12, ge=1)


class PlanConfig(_Strict):
    """``plan:``: the SLOs, the fleet's target rate and the configurations ``cbsim plan`` tries."""

    slo: SLOConfig = Field(default_factory=SLOConfig)
    target_rate: float | None = Field(None, gt=0, description="req/s for the whole fleet")
    max_num_seqs: list[int] = Field(default_factory=lambda: [16, 32, 64, 128, 256])
    max_num_batched_tokens: list[int] = Field(default_factory=lambda: [8192])
    replicas: list[int] = Field(default_factory=lambda: [1, 2, 3, 4, 6, 8])
    hardware: list[str] | None = None
    policy: list[str] | None = None
    gpus_per_replica: int = Field(1, ge=1)
    rate_search: RateSearchConfig = Field(default_factory=RateSearchConfig)


class Scenario(_Strict):
    name: str = "scenario"
    description: str = ""
    seed: int = 0
    model: str = "llama3-8b"
    hardware: str = "h200"
    engine: EngineConfig = Field(default_factory=EngineConfig)
    policy: PolicyConfig = Field(default_factory=PolicyConfig)
    cost_model: CostModelConfig = Field(default_factory=CostModelConfig)
    workload: WorkloadConfig
    simulation: SimulationConfig = Field(default_factory=SimulationConfig)
    cluster: ClusterConfig = Field(default_factory=ClusterConfig)
    sweep: SweepConfig | None = None
    plan: PlanConfig | None = None
    admission: AdmissionConfig | None = None
    clients: ClientConfig | None = None
    cost_per_gpu_hour: float | None = Field(
        None, ge=0, description="$ per GPU-hour; default: the hardware preset's price")
    variants: dict[str, dict[str, Any]] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _traffic_consistent(self) -> Scenario:
        classes = self.workload.classes or []
        configs = [("clients", self.clients)] + [
            (f"workload.classes.{c.name}.clients", c.clients) for c in classes]
        for where, cfg in configs:
            if cfg is not None and cfg.retry is not None and cfg.retry.max_attempts is None \
                    and self.simulation.horizon_s is None:
                raise ValueError(f"{where}.retry.max_attempts: unlimited retries need "
                                 "simulation.horizon_s (else a retry storm never ends)")
        if self.admission is not None and self.admission.background is not None:
            if not any(c.background for c in classes):
                raise ValueError("admission.background: no class in workload.classes has "
                                 "background: true, so there is nothing to pause")
        return self

    @model_validator(mode="after")
    def _budget_covers_prompts(self) -> Scenario:
        e = self.engine
        if not e.enable_chunked_prefill and e.max_model_len is not None:
            if e.max_num_batched_tokens < e.max_model_len:
                raise ValueError(
                    f"engine.max_num_batched_tokens ({e.max_num_batched_tokens}) must be >= "
                    f"max_model_len ({e.max_model_len}) when enable_chunked_prefill is false"
                )
        return self


# -- errors ---------------------------------------------------------------------------------
def _allowed_fields(loc: tuple) -> list[str]:
    """Field names allowed at the parent of ``loc`` (walks the schema along the path)."""
    model: Any = Scenario
    for part in loc[:-1]:
        field = getattr(model, "model_fields", {}).get(part)
        if field is None:
            return []
        ann = field.annotation
        candidates = [ann, *getattr(ann, "__args__", ())]
        model = next((c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)), None)
        if model is None:
            return []
    return list(getattr(model, "model_fields", {}))


def format_validation_error(exc: ValidationError, source: str) -> str:
    err = exc.errors()[0]
    loc = tuple(err["loc"])
    where = ".".join(str(p) for p in loc if not (isinstance(p, str) and p.endswith("Dist"))) or "(top)"
    if err["type"] == "extra_forbidden":
        allowed = _allowed_fields(loc)
        hint = f"; allowed: {', '.join(allowed)}" if allowed else ""
        return f"{source}: unknown key '{where}'{hint}"
    value = err.get("input")
    shown = "" if isinstance(value, dict | list) or value is None else f" (got {value!r})"
    msg = err["msg"].removeprefix("Value error, ")
    return f"{source}: {where}: {msg}{shown}"


# -- loading --------------------------------------------------------------------------------
def read_yaml(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise InputError(f"scenario file not found: {path}") from None
    except IsADirectoryError:
        raise InputError(f"{path}: is a directory, expected a YAML scenario file") from None
    import yaml  # only YAML files need it: validate() is on the simulator's start-up path

    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or "malformed YAML"
        raise InputError(f"{path}{where}: {problem}") from None
    if data is None:
        raise InputError(f"{path}: the file is empty; a scenario needs at least a workload: block")
    if not isinstance(data, dict):
        raise InputError(f"{path}: a scenario is a YAML mapping (key: value), got {type(data).__name__}")
    return data


def set_dotted(data: dict[str, Any], key: str, value: Any) -> None:
    parts = key.split(".")
    node = data
    for part in parts[:-1]:
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            raise InputError(f"--set {key}: '{part}' is not a mapping")
        node = child
    node[parts[-1]] = value


def parse_set_option(option: str) -> tuple[str, Any]:
    if "=" not in option:
        raise InputError(f"--set {option}: expected dotted.key=value")
    key, raw = option.split("=", 1)
    import yaml

    try:
        value = yaml.safe_load(raw) if raw else ""
    except yaml.YAMLError:
        value = raw
    return key.strip(), value


def validate(data: dict[str, Any], source: str) -> Scenario:
    try:
        return Scenario.model_validate(data)
    except ValidationError as exc:
        raise InputError(format_validation_error(exc, source)) from None


def load_scenario(path: str | Path, overrides: list[str] | None = None) -> tuple[Scenario, dict]:
    """The scenario with ``--set`` overrides applied, and its raw mapping (variants expand it)."""
    data = read_yaml(path)
    for option in overrides or []:
        key, value = parse_set_option(option)
        set_dotted(data, key, value)
    return validate(data, str(path)), data


def expand_variants(raw: dict[str, Any], source: str) -> dict[str, Scenario]:
    """One scenario per variant (its dotted overrides on the base); the base alone if none."""
    base = {k: v for k, v in raw.items() if k != "variants"}
    variants = raw.get("variants") or {}
    if not variants:
        return {raw.get("name", "scenario"): validate(base, source)}
    out = {}
    for name, overrides in variants.items():
        if not isinstance(overrides, dict):
            raise InputError(f"{source}: variants.{name} must map dotted keys to values")
        data = copy.deepcopy(base)
        for key, value in overrides.items():
            set_dotted(data, key, value)
        out[str(name)] = validate(data, f"{source} (variant {name})")
    return out
