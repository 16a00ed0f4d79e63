"""``cbsim plan``: the configuration that meets the SLOs at a target rate with the fewest GPUs.

For each candidate replica configuration (``max_num_seqs`` x ``max_num_batched_tokens``, and
optionally hardware and policy) the planner finds the highest rate one replica sustains with
the SLO attainment target met, DistServe's goodput, by bisection on the arrival rate (the same
seed at every rate, so only the rate changes). The fleet a candidate needs is then the fewest
replicas (from ``plan.replicas``) whose combined goodput covers the target; that fleet is
simulated at the target rate behind the scenario's router to confirm it, and one replica less
to confirm it is needed. The recommendation is the confirmed fleet with the fewest GPUs, then
the most goodput per GPU. "Binding SLO" is the check that fails first as the rate rises.
"""

from __future__ import annotations

import copy
import itertools
import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from sim.config import PlanConfig, SLOConfig, parse_set_option, set_dotted, validate
from sim.errors import InputError
from sim.sweep import make_executor, point_key, read_raw, set_rate

PER_REQUEST = (("ttft_ms", "ttft", "TTFT"), ("tpot_ms", "tpot", "TPOT"), ("e2el_ms", "e2el", "E2EL"))
PERCENTILE = (("p99_ttft_ms", "P99 TTFT"), ("p99_tpot_ms", "P99 TPOT"), ("p99_itl_ms", "P99 ITL"),
              ("p99_e2el_ms", "P99 E2EL"))


# -- SLO attainment -------------------------------------------------------------------------
@dataclass
class Check:
    name: str  # e.g. "attainment", "p99_ttft_ms"
    label: str  # readable: "TTFT<=2000ms & TPOT<=100ms for >=90% of requests"
    value: float | None
    limit: float
    ok: bool
    # value / limit for upper limits, limit / value for the attainment floor: > 1 fails.
    pressure: float
    short: str = ""  # for tables: "TTFT<=2000ms: 84% of requests (needs 90%)"


@dataclass
class SLOResult:
    attainment: float
    per_metric: dict[str, float]  # share of all requests within each per-request threshold
    checks: list[Check]
    goodput: float  # SLO-attaining requests per second

    @property
    def met(self) -> bool:
        return all(c.ok for c in self.checks)

    @property
    def failed(self) -> list[Check]:
        return [c for c in self.checks if not c.ok]

    @property
    def binding(self) -> Check | None:
        """The failing check furthest over its limit, else the one closest to its limit."""
        return max(self.checks, key=lambda c: c.pressure) if self.checks else None

    def row(self) -> dict[str, Any]:
        row = {"slo_attainment": self.attainment, "slo_met": self.met,
               "slo_failed": ",".join(c.name for c in self.failed), "slo_goodput": self.goodput}
        for name, share in self.per_metric.items():
            row[f"slo_{name}_attainment"] = share
        return row


def evaluate_slo(cols: dict[str, np.ndarray], summary: dict[str, Any], slo: SLOConfig) -> SLOResult:
    """Attainment over every request (unfinished, rejected or timed-out ones miss), from the
    record columns of ``requests.parquet`` (``state``, ``ttft``, ``tpot``, ``e2el``)."""
    n = len(cols["state"])
    ok_all = np.asarray(cols["state"] == "finished", dtype=bool)
    per_metric = {}
    parts = []
    worst = ("finished", 1.0)
    for field_name, col, label in PER_REQUEST:
        limit = getattr(slo, field_name)
        if limit is None:
            continue
        v = np.asarray(cols[col], dtype=np.float64) * 1e3
        within = np.asarray(cols["state"] == "finished", dtype=bool) & ((v <= limit) | np.isnan(v))
        if col == "ttft" or col == "e2el":
            within &= ~np.isnan(v)
        per_metric[col] = float(within.sum()) / n if n else 0.0
        ok_all &= within
        parts.append(f"{label}<={limit:g}ms")
        if per_metric[col] <= worst[1]:
            worst = (f"{label}<={limit:g}ms", per_metric[col])
    attainment = float(ok_all.sum()) / n if n else 0.0
    duration = summary.get("duration") or 1e-12
    checks = [Check(
        "attainment",
        f"{' & '.join(parts) or 'finished'} for >={slo.attainment:.0%} of requests",
        attainment, slo.attainment, attainment >= slo.attainment,
        slo.attainment / attainment if attainment > 0 else math.inf,
        (f"{worst[0]}: {worst[1]:.1%} of requests (needs {slo.attainment:.0%})"
         if worst[1] < slo.attainment or len(parts) < 2 else
         f"{' & '.join(parts)}: {attainment:.1%} of requests (needs {slo.attainment:.0%})"),
    )]
    for field_name, label in PERCENTILE:
        limit = getattr(slo, field_name)
        if limit is None:
            continue
        value = summary.get(field_name)
        ok = value is not None and value <= limit
        pressure = math.inf if value is None else value / limit
        got = "none finished" if value is None else f"{value:.0f}ms"
        checks.append(Check(field_name, f"{label}<={limit:g}ms", value, limit, ok, pressure,
                            f"{label}<={limit:g}ms: {got}"))
    return SLOResult(attainment, per_metric, checks, float(ok_all.sum()) / duration)


def slo_lines(slo: SLOConfig) -> dict[str, float]:
    """Latency limits to draw on plots, keyed by the summary metric they bound."""
    lines = {}
    for key, metric in (("ttft_ms", "p99_ttft_ms"), ("tpot_ms", "median_tpot_ms"),
                        ("e2el_ms", "p99_e2el_ms")):
        if getattr(slo, key) is not None:
            lines[metric] = getattr(slo, key)
    for key, _ in PERCENTILE:
        if getattr(slo, key) is not None:
            lines[key] = getattr(slo, key)
    return lines


# -- one probe ------------------------------------------------------------------------------
def probe(data: dict[str, Any]) -> dict[str, Any]:
    """Simulate one resolved scenario and judge it against its ``plan.slo`` (pure; pools and Ray
    run it)."""
    from sim.engine import simulate
    from sim.sweep import scalar_summary

    sc = validate(data, "plan probe")
    res = simulate(sc)
    slo = evaluate_slo(res.records.columns(), res.summary, sc.plan.slo)
    row = scalar_summary(res.summary)
    row.update(slo.row())
    row["checks"] = [asdict(c) for c in slo.checks]
    return row


class Prober:
    """Runs probes in parallel batches and remembers every result by its resolved scenario."""

    def __init__(self, executor) -> None:
        self.executor = executor
        self.cache: dict[str, dict[str, Any]] = {}
        self.runs = 0

    def run(self, datas: list[dict[str, Any]]) -> list[dict[str, Any]]:
        keys = [point_key(d) for d in datas]
        todo: dict[str, dict] = {}
        for k, d in zip(keys, datas, strict=True):
            if k not in self.cache and k not in todo:
                todo[k] = d
        items = list(todo.items())
        for i, row in self.executor.imap_unordered(probe, [d for _, d in items]):
            self.cache[items[i][0]] = row
            self.runs += 1
        return [self.cache[k] for k in keys]


# -- candidates -----------------------------------------------------------------------------
@dataclass
class Candidate:
    hardware: str
    policy: str
    max_num_seqs: int
    max_num_batched_tokens: int
    data: dict[str, Any] = field(repr=False)
    # bisection state: highest rate known to pass, lowest known to fail (per replica)
    lo: float = 0.0
    hi: float = math.inf
    lo_row: dict | None = field(default=None, repr=False)
    hi_row: dict | None = field(default=None, repr=False)
    iters: int = 0
    replicas: int | None = None  # fewest replicas confirmed to meet the SLOs at the target
    fleet_row: dict | None = field(default=None, repr=False)
    fewer_replicas: int | None = None  # one step down the replica list, confirmed to fail
    fewer_row: dict | None = field(default=None, repr=False)
    note: str = ""
    fleet_max_rate: float | None = None  # highest rate the confirmed fleet meets the SLOs at

    @property
    def label(self) -> str:
        return (f"{self.hardware}/{self.policy} max_num_seqs={self.max_num_seqs} "
                f"max_num_batched_tokens={self.max_num_batched_tokens}")

    @property
    def max_rate(self) -> float:
        """Goodput of one replica: the highest rate found to meet the SLOs (req/s)."""
        return self.lo

    def binding(self) -> str:
        row = self.hi_row
        if row is None:
            return "none up to the search limit"
        return _binding_text(row)


def _binding_text(row: dict) -> str:
    checks = row.get("checks") or []
    failing = [c for c in checks if not c["ok"]] or checks
    if not failing:
        return "-"
    return max(failing, key=lambda c: c["pressure"])["short"]


def _with(data: dict, **dotted) -> dict:
    out = copy.deepcopy(data)
    for k, v in dotted.items():
        set_dotted(out, k.replace("__", "."), v)
    return out


def base_rate(data: dict) -> float | None:
    w = data.get("workload") or {}
    trace = w.get("trace")
    if isinstance(trace, dict) and trace.get("target_rate"):
        return float(trace["target_rate"])
    arrival = w.get("arrival") or {}
    return float(arrival["rate"]) if arrival.get("rate") else None


def candidates(data: dict, plan: PlanConfig, source: str) -> list[Candidate]:
    sc = validate(data, source)
    out = []
    for hw, pol, mns, mnbt in itertools.product(
        plan.hardware or [sc.hardware], plan.policy or [sc.policy.name],
        plan.max_num_seqs, plan.max_num_batched_tokens,
    ):
        d = _with(data, hardware=hw, engine__max_num_seqs=mns, engine__max_num_batched_tokens=mnbt,
                  cluster__replicas=1)
        d.setdefault("policy", {})["name"] = pol
        try:
            validate(d, source)
        except InputError as exc:
            raise InputError(f"{source}: plan candidate {hw}/{pol}/{mns}/{mnbt} is invalid: {exc}") \
                from None
        out.append(Candidate(hw, pol, mns, mnbt, d))
    return out


def _at_rate(data: dict, rate: float, replicas: int = 1) -> dict:
    d = _with(data, cluster__replicas=replicas)
    set_rate(d, rate, "plan")
    return d


def bisect_rates(cands: list[Candidate], plan: PlanConfig, prober: Prober, log=print) -> None:
    """Each candidate's highest passing rate per replica, all candidates advancing together."""
    rs = plan.rate_search
    for c in cands:
        c.lo, c.hi = 0.0, math.inf
    # Both ends first: below low the candidate is infeasible, above high it is capped.
    rows = prober.run([_at_rate(c.data, rs.low) for c in cands] +
                      [_at_rate(c.data, rs.high) for c in cands])
    n = len(cands)
    for i, c in enumerate(cands):
        lo_row, hi_row = rows[i], rows[n + i]
        if not lo_row["slo_met"]:
            c.lo, c.hi, c.hi_row, c.note = 0.0, rs.low, lo_row, f"fails even at {rs.low:g} req/s"
        elif hi_row["slo_met"]:
            c.lo, c.lo_row, c.note = rs.high, hi_row, f"meets the SLOs at the search limit {rs.high:g} req/s"
        else:
            c.lo, c.lo_row, c.hi, c.hi_row = rs.low, lo_row, rs.high, hi_row
    for it in range(rs.max_iters):
        active = [c for c in cands if 0 < c.lo < c.hi < math.inf and c.hi / c.lo - 1 > rs.rel_tol]
        if not active:
            break
        mids = [math.sqrt(c.lo * c.hi) for c in active]
        log(f"  rate bisection round {it + 1}: {len(active)} candidates")
        rows = prober.run([_at_rate(c.data, m) for c, m in zip(active, mids, strict=True)])
        for c, m, row in zip(active, mids, rows, strict=True):
            c.iters += 1
            if row["slo_met"]:
                c.lo, c.lo_row = m, row
            else:
                c.hi, c.hi_row = m, row


def size_fleets(cands: list[Candidate], plan: PlanConfig, target: float, prober: Prober,
                log=print) -> None:
    """For each candidate the fewest replicas (from the list) that meet the SLOs at ``target``,
    confirmed by simulating the fleet, and the next smaller fleet confirmed to fail."""
    options = sorted(set(plan.replicas))
    state = {}
    for c in cands:
        if c.max_rate <= 0:
            c.note = c.note or "meets no rate"
            continue
        need = [n for n in options if n * c.max_rate >= target * (1 - plan.rate_search.rel_tol)]
        state[id(c)] = options.index(need[0]) if need else len(options) - 1
    # Walk each candidate's index up until its fleet passes, then make sure the one below fails.
    pending = [c for c in cands if id(c) in state]
    rounds = 0
    while pending and rounds < 2 * len(options) + 2:
        rounds += 1
        rows = prober.run([_at_rate(c.data, target, options[state[id(c)]]) for c in pending])
        below = [c for c in pending if state[id(c)] > 0]
        below_rows = prober.run([_at_rate(c.data, target, options[state[id(c)] - 1]) for c in below])
        below_of = {id(c): r for c, r in zip(below, below_rows, strict=True)}
        nxt = []
        for c, row in zip(pending, rows, strict=True):
            i = state[id(c)]
            if not row["slo_met"]:
                if i + 1 < len(options):
                    state[id(c)] = i + 1
                    nxt.append(c)
                else:
                    c.note = f"even {options[i]} replicas miss the SLOs at {target:g} req/s"
                    c.fewer_replicas, c.fewer_row = options[i], row
                continue
            low = below_of.get(id(c))
            if low is not None and low["slo_met"]:
                state[id(c)] = i - 1
                nxt.append(c)
                continue
            c.replicas, c.fleet_row = options[i], row
            if low is not None:
                c.fewer_replicas, c.fewer_row = options[i - 1], low
        pending = nxt
    log(f"  fleet sizing: {prober.runs} simulations so far")


def fleet_headroom(c: Candidate, plan: PlanConfig, target: float, prober: Prober) -> None:
    """The highest rate the candidate's confirmed fleet meets the SLOs at: bisection from the
    target, which it meets, to 1.25 x what its replicas sustain one by one (a fleet behind a
    router rarely beats that; if it does, that bound is reported)."""
    rs = plan.rate_search
    lo, hi = target, max(target, c.replicas * c.max_rate) * 1.25
    for _ in range(rs.max_iters):
        if hi / lo - 1 <= rs.rel_tol:
            break
        mid = math.sqrt(lo * hi)
        if prober.run([_at_rate(c.data, mid, c.replicas)])[0]["slo_met"]:
            lo = mid
        else:
            hi = mid
    c.fleet_max_rate = lo


@dataclass
class PlanResult:
    target_rate: float
    slo: SLOConfig
    candidates: list[Candidate]
    recommended: Candidate | None
    gpus_per_replica: int
    out: Path
    frame: Any = None
    plots: list[Path] = field(default_factory=list)

    def gpus(self, c: Candidate) -> int | None:
        return None if c.replicas is None else c.replicas * self.gpus_per_replica

    def scenario_overrides(self) -> list[str]:
        """``--set`` options that turn the planned scenario into the recommended one."""
        c = self.recommended
        if c is None:
            return []
        return [f"hardware={c.hardware}", f"policy.name={c.policy}",
                f"engine.max_num_seqs={c.max_num_seqs}",
                f"engine.max_num_batched_tokens={c.max_num_batched_tokens}",
                f"cluster.replicas={c.replicas}", f"workload.arrival.rate={self.target_rate:g}"
                if not _is_trace(c.data) else f"workload.trace.target_rate={self.target_rate:g}"]

    def why(self) -> list[str]:
        c = self.recommended
        if c is None:
            return ["no candidate meets the SLOs at the target rate with the replica counts tried"]
        lines = [
            f"{c.replicas} x {c.label} meets every SLO at {self.target_rate:g} req/s "
            f"(attainment {c.fleet_row['slo_attainment']:.1%}, P99 TTFT "
            f"{_ms(c.fleet_row.get('p99_ttft_ms'))}, P99 TPOT {_ms(c.fleet_row.get('p99_tpot_ms'))})",
            f"the fleet keeps meeting them up to {c.fleet_max_rate:.2f} req/s "
            f"({c.fleet_max_rate / self.target_rate - 1:+.0%} headroom over the target)"
            if c.fleet_max_rate is not None else "the fleet's headroom was not measured",
            f"one replica sustains {c.max_rate:.2f} req/s within the SLOs "
            f"({c.max_rate / self.gpus_per_replica:.2f} req/s of goodput per GPU); "
            f"above that the binding SLO is {c.binding()}",
        ]
        if c.fewer_row is not None:
            lines.append(f"with {c.fewer_replicas} replica(s) it fails: {_binding_text(c.fewer_row)}")
        return lines


def _ms(v) -> str:
    return "-" if v is None else f"{v:.0f} ms"


def _is_trace(data: dict) -> bool:
    return (data.get("workload") or {}).get("trace") is not None


def recommend(cands: list[Candidate]) -> Candidate | None:
    ok = [c for c in cands if c.replicas is not None]
    if not ok:
        return None
    return min(ok, key=lambda c: (c.replicas, -c.max_rate, c.max_num_seqs, c.max_num_batched_tokens))


def candidate_frame(result: PlanResult):
    import pandas as pd

    rows = []
    for c in result.candidates:
        fleet = c.fleet_row or {}
        rows.append({
            "hardware": c.hardware, "policy": c.policy, "max_num_seqs": c.max_num_seqs,
            "max_num_batched_tokens": c.max_num_batched_tokens,
            "max_rate_per_replica": c.max_rate,
            "goodput_per_gpu": c.max_rate / result.gpus_per_replica,
            "rate_upper_bound": None if math.isinf(c.hi) else c.hi,
            "binding_slo": c.binding(),
            "replicas": c.replicas, "gpus": result.gpus(c),
            "attainment_at_target": fleet.get("slo_attainment"),
            "p99_ttft_ms_at_target": fleet.get("p99_ttft_ms"),
            "p99_tpot_ms_at_target": fleet.get("p99_tpot_ms"),
            "p99_itl_ms_at_target": fleet.get("p99_itl_ms"),
            "fewer_replicas": c.fewer_replicas,
            "fewer_replicas_fails": None if c.fewer_row is None else _binding_text(c.fewer_row),
            "recommended": c is result.recommended,
            "note": c.note,
        })
    return pd.DataFrame(rows)


def load_plan(path: str | Path | dict, overrides: list[str]) -> tuple[dict, PlanConfig]:
    raw = read_raw(path)
    path = "scenario" if isinstance(path, dict) else path
    for option in overrides:
        key, value = parse_set_option(option)
        set_dotted(raw, key, value)
    sc = validate(raw, str(path))
    if sc.plan is None:
        raise InputError(f"{path}: no 'plan:' block (slo, target_rate, max_num_seqs, replicas, ...)")
    data = {k: v for k, v in raw.items() if k not in ("variants", "sweep")}
    return data, sc.plan


def run_plan(path: str | Path | dict, out: Path | None = None, overrides: list[str] | None = None,
             executor: str = "local", workers: int | None = None, address: str | None = None,
             log=print, plots: bool = True) -> PlanResult:
    data, plan = load_plan(path, overrides or [])
    path = "scenario" if isinstance(path, dict) else path
    name = data.get("name", "scenario")
    out = Path(out) if out is not None else Path("results") / str(name)
    target = plan.target_rate or base_rate(data)
    if target is None:
        raise InputError(f"{path}: plan.target_rate: give the fleet's request rate (req/s)")
    cands = candidates(data, plan, str(path))
    ex = make_executor(executor, workers, address)
    prober = Prober(ex)
    try:
        log(f"finding the highest rate each of {len(cands)} candidates sustains (bisection)")
        bisect_rates(cands, plan, prober, log)
        log(f"sizing fleets for {target:g} req/s")
        size_fleets(cands, plan, target, prober, log)
        result = PlanResult(target, plan.slo, cands, recommend(cands), plan.gpus_per_replica, out)
        if result.recommended is not None:
            log("measuring the recommended fleet's headroom")
            fleet_headroom(result.recommended, plan, target, prober)
        curve = capacity_curve(result, prober) if plots else None
    finally:
        ex.close()
    write_plan(result, curve, plots)
    return result


def capacity_curve(result: PlanResult, prober: Prober):
    """One replica of each max_num_seqs (the recommended config's other knobs) at the load one
    replica of the recommended fleet sees: throughput and latency against max_num_seqs."""
    import pandas as pd

    rec = result.recommended
    if rec is None:
        return None
    per_replica = result.target_rate / rec.replicas
    same = [c for c in result.candidates if (c.hardware, c.policy, c.max_num_batched_tokens)
            == (rec.hardware, rec.policy, rec.max_num_batched_tokens)]
    same.sort(key=lambda c: c.max_num_seqs)
    rows = prober.run([_at_rate(c.data, per_replica) for c in same])
    frame = pd.DataFrame([{k: v for k, v in r.items() if k != "checks"} for r in rows])
    frame.insert(0, "max_num_seqs", [c.max_num_seqs for c in same])
    frame.insert(1, "max_rate_per_replica", [c.max_rate for c in same])
    frame.insert(2, "rate_per_replica", per_replica)
    return frame


def write_plan(result: PlanResult, curve, plots: bool) -> None:
    folder = result.out / "plan"
    folder.mkdir(parents=True, exist_ok=True)
    frame = candidate_frame(result)
    result.frame = frame
    frame.to_parquet(folder / "candidates.parquet", index=False)
    frame.to_csv(folder / "candidates.csv", index=False)
    if curve is not None:
        curve.to_parquet(folder / "capacity_curve.parquet", index=False)
    rec = result.recommended
    summary = {
        "target_rate": result.target_rate,
        "slo": result.slo.model_dump(),
        "recommended": None if rec is None else {
            "hardware": rec.hardware, "policy": rec.policy, "max_num_seqs": rec.max_num_seqs,
            "max_num_batched_tokens": rec.max_num_batched_tokens, "replicas": rec.replicas,
            "gpus": result.gpus(rec), "max_rate_per_replica": rec.max_rate,
            "fleet_max_rate": rec.fleet_max_rate,
            "at_target": {k: v for k, v in (rec.fleet_row or {}).items() if k != "checks"},
            "fewer_replicas": rec.fewer_replicas,
            "fewer_replicas_fails": None if rec.fewer_row is None else _binding_text(rec.fewer_row),
            "set": result.scenario_overrides(),
        },
        "why": result.why(),
    }
    (folder / "recommendation.json").write_text(json.dumps(summary, indent=2, default=float) + "\n")
    if plots and curve is not None:
        from sim.plots_capacity import plot_capacity

        result.plots = plot_capacity(curve, result, folder / "capacity")
