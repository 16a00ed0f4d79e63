"""Capacity planning: SLO attainment, the rate bisection, and the plan's promise kept by `cbsim run`."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from sim.cli import app
from sim.config import SLOConfig
from sim.errors import InputError
from sim.plan import evaluate_slo, run_plan

ROOT = Path(__file__).resolve().parents[1]
SCENARIO = str(ROOT / "scenarios" / "capacity_plan.yaml")
# The shipped search, narrowed so the test runs in seconds: two max_num_seqs, one token budget.
NARROW = ["plan.max_num_seqs=[32, 128]", "plan.max_num_batched_tokens=[2048]",
          "plan.replicas=[1, 2, 3, 4]"]


def cols(state, ttft, tpot, e2el=None):
    n = len(state)
    return {"state": np.array(state, dtype=object), "ttft": np.array(ttft, dtype=float),
            "tpot": np.array(tpot, dtype=float),
            "e2el": np.array(e2el if e2el is not None else [1.0] * n, dtype=float)}


def test_attainment_counts_every_request_and_both_thresholds():
    c = cols(["finished", "finished", "finished", "finished", "rejected"],
             [0.1, 0.1, 3.0, 0.1, math.nan], [0.01, 0.2, 0.01, math.nan, math.nan])
    slo = SLOConfig(ttft_ms=2000, tpot_ms=100, attainment=0.5)
    r = evaluate_slo(c, {"duration": 10.0}, slo)
    # 1: ok; 2: TPOT too slow; 3: TTFT too slow; 4: one output token (no TPOT) ok; 5: rejected.
    assert r.attainment == pytest.approx(2 / 5)
    assert r.per_metric == {"ttft": pytest.approx(3 / 5), "tpot": pytest.approx(3 / 5)}
    assert not r.met and r.failed[0].name == "attainment"
    assert r.goodput == pytest.approx(0.2)
    assert evaluate_slo(c, {"duration": 10.0}, SLOConfig(ttft_ms=2000, tpot_ms=100,
                                                         attainment=0.4)).met


def test_percentile_limits():
    c = cols(["finished"] * 3, [0.1] * 3, [0.01] * 3)
    slo = SLOConfig(ttft_ms=2000, p99_ttft_ms=500, attainment=0.9)
    assert evaluate_slo(c, {"p99_ttft_ms": 400.0, "duration": 1}, slo).met
    r = evaluate_slo(c, {"p99_ttft_ms": 900.0, "duration": 1}, slo)
    assert [ch.name for ch in r.failed] == ["p99_ttft_ms"]
    assert r.binding.name == "p99_ttft_ms"


@pytest.fixture(scope="module")
def planned(tmp_path_factory):
    out = tmp_path_factory.mktemp("plan")
    return run_plan(SCENARIO, out, NARROW, workers=2, log=lambda m: None)


def test_plan_recommends_fewest_gpus(planned):
    rec = planned.recommended
    assert rec is not None and rec.replicas is not None
    frame = planned.frame
    assert frame.recommended.sum() == 1
    ok = frame[frame.replicas.notna()]
    assert planned.gpus(rec) == ok.gpus.min()
    # Goodput per replica rises with max_num_seqs on this workload (more requests in flight).
    rates = frame.set_index("max_num_seqs").max_rate_per_replica
    assert rates[128] > rates[32] > 0
    # Bisection bracket: the pass/fail rates are within the tolerance.
    for c in planned.candidates:
        assert c.hi / c.lo - 1 <= 0.08 + 1e-9 or c.iters == 12
        assert c.lo_row["slo_met"] and not c.hi_row["slo_met"]
    rec_json = json.loads((planned.out / "plan/recommendation.json").read_text())
    assert rec_json["recommended"]["replicas"] == rec.replicas
    # The fleet's own goodput: at least the target, within the bracket searched.
    assert planned.target_rate <= rec.fleet_max_rate <= rec.replicas * rec.max_rate * 1.25
    assert rec_json["recommended"]["fleet_max_rate"] == rec.fleet_max_rate
    assert (planned.out / "plan/capacity.png").exists() and (planned.out / "plan/capacity.svg").exists()
    curve = pd.read_parquet(planned.out / "plan/capacity_curve.parquet")
    assert list(curve.max_num_seqs) == [32, 128]
    assert curve.rate_per_replica.iloc[0] == pytest.approx(planned.target_rate / rec.replicas)


def run_cli(tmp: Path, overrides: list[str]) -> tuple[dict, pd.DataFrame]:
    args = ["run", SCENARIO, "--out", str(tmp)]
    for o in overrides:
        args += ["--set", o]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    return json.loads((tmp / "summary.json").read_text()), pd.read_parquet(tmp / "requests.parquet")


def test_cbsim_run_of_the_recommendation_meets_its_slos_and_one_replica_less_fails(planned, tmp_path):
    rec = planned.recommended
    overrides = planned.scenario_overrides()
    summary, frame = run_cli(tmp_path / "rec", overrides)
    c = {k: frame[k].to_numpy() for k in ("ttft", "tpot", "e2el")}
    c["state"] = frame["state"].astype(str).to_numpy(dtype=object)
    verdict = evaluate_slo(c, summary, planned.slo)
    assert verdict.met, [ch.short for ch in verdict.failed]
    assert summary["num_replicas"] == rec.replicas
    assert verdict.attainment == pytest.approx(rec.fleet_row["slo_attainment"])
    # The next cheaper fleet: one replica fewer.
    cheaper = [o for o in overrides if not o.startswith("cluster.replicas=")]
    cheaper.append(f"cluster.replicas={rec.fewer_replicas}")
    assert rec.fewer_replicas < rec.replicas
    summary2, frame2 = run_cli(tmp_path / "cheaper", cheaper)
    c2 = {k: frame2[k].to_numpy() for k in ("ttft", "tpot", "e2el")}
    c2["state"] = frame2["state"].astype(str).to_numpy(dtype=object)
    assert not evaluate_slo(c2, summary2, planned.slo).met


def test_plan_needs_a_plan_block(tmp_path):
    p = tmp_path / "s.yaml"
    p.write_text("workload: {num_requests: 5}\n")
    with pytest.raises(InputError, match="no 'plan:' block"):
        run_plan(p, tmp_path)
    res = CliRunner().invoke(app, ["plan", str(p)])
    assert res.exit_code == 2 and "plan:" in res.output


def test_candidates_span_hardware_policy_and_knobs():
    from sim.config import PlanConfig
    from sim.plan import _at_rate, candidates

    data = {"workload": {"duration_s": 10, "arrival": {"kind": "poisson", "rate": 3}},
            "cluster": {"replicas": 4}}
    plan = PlanConfig(hardware=["h200", "l40s"], policy=["static", "continuous"],
                      max_num_seqs=[8, 16], max_num_batched_tokens=[2048])
    cands = candidates(data, plan, "t")
    assert len(cands) == 8
    assert {(c.hardware, c.policy, c.max_num_seqs) for c in cands} == {
        (h, p, m) for h in ("h200", "l40s") for p in ("static", "continuous") for m in (8, 16)}
    for c in cands:
        assert c.data["cluster"]["replicas"] == 1 and c.data["hardware"] == c.hardware
        assert c.data["engine"]["max_num_batched_tokens"] == 2048
    probe = _at_rate(cands[0].data, 7.5, replicas=3)
    assert probe["workload"]["arrival"]["rate"] == 7.5 and probe["cluster"]["replicas"] == 3
    assert data["cluster"]["replicas"] == 4  # the caller's mapping is never modified
