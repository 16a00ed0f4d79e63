"""The shipped policy scenarios: policy_sweep.yaml (every policy, one table, plots) and
fairness.yaml (one tenant floods), run on shortened workloads."""

import os
from pathlib import Path

import numpy as np
import pytest
from rich.console import Console

from sim.cli import summary_table
from sim.config import expand_variants, read_yaml
from sim.core.policies import POLICIES
from sim.run import run_variants, write_plots

ROOT = Path(__file__).resolve().parents[1]


def test_policy_sweep_compares_every_policy_in_one_table(tmp_path):
    if not (Path(os.environ.get("CBSIM_TRACE_PATH", "")) / "mooncake_conversation.jsonl").is_file():
        pytest.skip("mooncake_conversation.jsonl not on CBSIM_TRACE_PATH")
    raw = read_yaml(ROOT / "scenarios/policy_sweep.yaml")
    raw["workload"]["trace"]["window_s"] = [0, 15]
    chat, batch = raw["workload"]["classes"][1:]
    chat["duration_s"] = 40
    batch["num_requests"] = 20
    batch["arrival"]["start_s"] = 5
    variants = expand_variants(raw, "policy_sweep.yaml")
    used = {sc.policy.name for sc in variants.values()}
    assert used >= set(POLICIES) - {"static", "orca"}
    modes = {(sc.engine.preemption_mode, sc.policy.params.get("reserve")) for sc in variants.values()}
    assert {("recompute", None), ("swap", None), ("recompute", "conservative")} <= modes
    results = run_variants(variants, tmp_path)
    plots = write_plots(results, tmp_path)
    assert {p.name for p in plots} >= {"comparison.png", "policy_comparison.png"}
    assert all(p.stat().st_size > 10_000 for p in plots)
    console = Console(record=True, width=150)
    console.print(summary_table("policy_sweep", {k: r.summary for k, r in results.items()}))
    text = console.export_text()
    assert all(name in text for name in variants)
    assert "prefix hit" in text and "preempt s" in text
    s = {k: r.summary for k, r in results.items()}
    assert s["small_kv_conservative"]["preemptions"] == 0
    assert s["lpm"]["prefix_cache_hit_rate"] > 0


def test_fairness_scenario_protects_the_light_tenants(tmp_path):
    raw = read_yaml(ROOT / "scenarios/fairness.yaml")
    raw["workload"]["duration_s"] = 25
    variants = expand_variants(raw, "fairness.yaml")
    results = run_variants({k: variants[k] for k in ("fcfs", "fair")}, tmp_path)

    def light_p99(name):
        f = results[name].frame()
        return np.percentile(f[f.tenant != "megacorp"].ttft.dropna(), 99)

    assert light_p99("fair") < 0.2 * light_p99("fcfs")
    per = results["fair"].summary["per_tenant"]
    assert set(per) == {"megacorp", "alice", "bob"}
