"""The traffic scenarios end to end: real trace slices, overload with and without backpressure,
retry storms, tenants."""

from pathlib import Path

import numpy as np
import pytest

from sim.config import expand_variants, load_scenario, validate
from sim.engine import Simulation, simulate
from sim.workload.spec import build_workload
from sim.workload.traces import REGISTERED_TRACES, resolve_trace

SCENARIOS = Path(__file__).resolve().parents[1] / "scenarios"


def _variants(name: str, overrides: list[str] | None = None):
    path = str(SCENARIOS / name)
    _, raw = load_scenario(path, overrides)
    return expand_variants(raw, path)


def _needs(trace: str):
    try:
        resolve_trace(trace)
    except Exception:  # noqa: BLE001 - a missing file is reported by the skip reason
        pytest.skip(f"{REGISTERED_TRACES[trace].filename} not on the trace search path "
                    "(set CBSIM_TRACE_PATH)")


def test_every_traffic_scenario_validates():
    for name in ("azure_conv_replay.yaml", "azure_code_replay.yaml", "mooncake_replay.yaml",
                 "overload_backpressure.yaml", "cancellation.yaml", "multi_tenant.yaml"):
        assert len(_variants(name)) >= 2, name


def test_overload_backpressure_admission_control_wins(capsys):
    results = {name: simulate(sc).summary for name, sc in
               _variants("overload_backpressure.yaml").items()}
    free, limited = results["no_limit"], results["queue_limit"]
    rows = [("completed", "completed"), ("p99 TTFT admitted (ms)", "p99_ttft_ms"),
            ("rejected (429)", "rejected"), ("cancelled", "cancelled"), ("retries", "retries"),
            ("GPU wasted", "wasted_gpu_fraction"), ("goodput req/s", "goodput")]
    with capsys.disabled():
        print("\noverload_backpressure        no_limit   queue_limit")
        for label, key in rows:
            a, b = free[key], limited[key]
            print(f"  {label:24s} {a:>10.4g} {b:>12.4g}")
    assert limited["p99_ttft_ms"] < free["p99_ttft_ms"]
    assert limited["completed"] > free["completed"]
    assert limited["goodput"] > free["goodput"]
    # Without a limit nobody is refused, and most clients give up; with one the refusals are
    # immediate 429s and the GPU spends far less on abandoned work.
    assert free["rejected"] == 0 and free["count_by_reason"]["cancelled"]["client patience"] > 0
    assert limited["count_by_reason"]["rejected"]["429 queue full"] > 0
    assert limited["queue_len_max"] <= 24 < free["queue_len_max"]
    assert limited["wasted_gpu_fraction"] < free["wasted_gpu_fraction"]


def _overload(max_attempts, horizon=None):
    data = {
        "seed": 1,
        "engine": {"max_num_seqs": 32},
        "workload": {"duration_s": 20, "arrival": {"kind": "poisson", "rate": 30},
                     "prompt_len": {"kind": "fixed", "value": 1000},
                     "output_len": {"kind": "fixed", "value": 200}},
        "clients": {"patience_s": 3, "retry": {"max_attempts": max_attempts, "backoff_s": 0.5,
                                               "multiplier": 2, "max_backoff_s": 4}},
        "admission": {"max_queue_len": 16},
    }
    if horizon:
        data["simulation"] = {"horizon_s": horizon}
    return validate(data, "overload")


def test_retries_with_a_cap_stay_bounded():
    s = simulate(_overload(3)).summary
    assert s["retries"] > 0 and s["attempts_per_client_max"] == 3
    assert s["attempts"] <= 3 * s["clients"]
    assert s["retries_pending_at_end"] == 0


def test_uncapped_retry_storm_ends_at_the_horizon_and_is_reported():
    sc = _overload(None, horizon=40)
    sim = Simulation(sc, build_workload(sc.workload, sc.seed))
    res = sim.run()
    s = res.summary
    assert sim.env.now == 40
    assert s["attempts_per_client_max"] > 3
    assert s["retries"] > 3 * s["clients"]  # the storm: far more retries than clients
    capped = simulate(_overload(3)).summary
    assert s["attempts"] > 2 * capped["attempts"]
    # Still in flight at the horizon: reported, not lost.
    frame = res.frame()
    assert (frame.reason == "horizon").sum() + s["retries_pending_at_end"] > 0


def test_azure_code_replay_keeps_the_burst():
    _needs("azure_code")
    variants = _variants("azure_code_replay.yaml", ["workload.trace.window_s=[840, 900]"])
    sc = variants["one_gpu"]
    table = build_workload(sc.workload, sc.seed)
    a = table.arrival
    in_one_second = np.searchsorted(a, a + 1.0, side="left") - np.arange(len(a))
    assert in_one_second.max() >= 67  # the trace's peak second, replayed as recorded
    res = simulate(sc)
    assert len(res.records) == len(table)
    s = res.summary
    assert s["per_class"]["completion"]["num_requests"] == len(table)
    assert s["count_by_state"]["finished"] + s["cancelled"] == len(table)


def test_azure_conv_replay_slice():
    _needs("azure_conv")
    variants = _variants("azure_conv_replay.yaml", ["workload.trace.window_s=[0, 60]"])
    a, b = (simulate(v).summary for v in variants.values())
    from sim.workload.traces import TraceSpec, load_trace

    rows = len(load_trace(TraceSpec(path="azure_conv", window_s=(0, 60)), np.random.default_rng(0)))
    assert a["num_requests"] == b["num_requests"] == rows > 150
    assert b["mean_running_batch"] > a["mean_running_batch"]  # 3x the arrival rate


def test_mooncake_replay_passes_prefix_hashes_through():
    _needs("mooncake_conversation")
    variants = _variants("mooncake_replay.yaml", ["workload.trace.window_s=[0, 30]"])
    sc = variants["prefix_cache"]
    table = build_workload(sc.workload, sc.seed)
    assert table.hash_ids is not None and all(len(h) == -(-p // 512) for h, p in
                                              zip(table.hash_ids, table.prompt_len, strict=True))
    cached = simulate(sc).summary
    plain = simulate(variants["no_prefix_cache"]).summary
    assert cached.get("prefix_cache_hit_tokens", 0) > 0 == plain.get("prefix_cache_hit_tokens", 0)
    assert cached["median_ttft_ms"] < plain["median_ttft_ms"]
    assert cached["count_by_reason"].get("rejected", {}).get("400 prompt_len > max_input_tokens", 0) \
        == int((table.prompt_len > 65536).sum())


def test_length_only_trace_with_any_arrival_process():
    _needs("sharegpt_lengths")
    sc = validate({"workload": {"trace": {"path": "sharegpt_lengths", "limit": 50},
                                "duration_s": 10, "arrival": {"kind": "gamma", "rate": 8, "cv": 3},
                                "classes": [{"name": "a", "share": 0.5},
                                            {"name": "b", "share": 0.5, "tenant": "t2"}]}}, "t")
    table = build_workload(sc.workload, sc.seed)
    assert 30 < len(table) < 150 and table.arrival.max() < 10
    from sim.workload.traces import TraceSpec, load_trace

    trace = load_trace(TraceSpec(path="sharegpt_lengths", limit=50), np.random.default_rng(0))
    # Lengths in trace order, from the start again once the 50 rows are used up.
    idx = np.arange(len(table)) % 50
    assert np.array_equal(np.sort(table.prompt_len), np.sort(trace.prompt_len[idx]))
    s = simulate(sc).summary
    assert set(s["per_tenant"]) == {"default", "t2"} and set(s["per_class"]) == {"a", "b"}


def test_tenants_and_priorities_from_a_trace(tmp_path):
    path = tmp_path / "mine.csv"
    rows = ["t,in,out,who,prio"] + [f"{i * 0.1:.1f},{100 + i},{20 + i % 7},{'ab'[i % 2]},{i % 3}"
                                    for i in range(40)]
    path.write_text("\n".join(rows) + "\n")
    sc = validate({"workload": {"trace": {
        "path": str(path), "format": "generic",
        "columns": {"arrival": "t", "prompt_len": "in", "output_len": "out", "tenant": "who",
                    "priority": "prio"}},
        "classes": [{"name": "x", "slo": {"ttft_s": 10}}]}}, "t")
    res = simulate(sc)
    frame = res.frame()
    assert set(frame.tenant) == {"a", "b"} and set(frame.priority) == {0, 1, 2}
    assert (frame.tenant == np.where(frame.req_id % 2 == 0, "a", "b")).all()
    s = res.summary
    assert set(s["per_tenant"]) == {"a", "b"} and s["per_class"]["x"]["num_requests"] == 40
    assert s["fairness_jain_tenants"] > 0.9
    assert s["slo_attainment"] == 1.0 and s["goodput"] == pytest.approx(40 / s["duration"])


def test_multi_tenant_burst_and_what_the_others_see():
    results = {n: simulate(sc).summary for n, sc in _variants("multi_tenant.yaml").items()}
    shared, paused = results["shared_fcfs"], results["pause_background"]
    for tenant in ("acme", "globex"):
        assert paused["per_tenant"][tenant]["p99_ttft_ms"] < shared["per_tenant"][tenant]["p99_ttft_ms"] / 5
        assert paused["per_tenant"][tenant]["slo_attainment"] > shared["per_tenant"][tenant]["slo_attainment"]
    assert paused["background_pauses"] >= 1
    capped = results["tenant_cap"]
    assert capped["per_tenant"]["initech"]["count_by_state"]["rejected"] > 0
    assert capped["count_by_reason"]["rejected"] == {
        "429 tenant concurrency cap": capped["per_tenant"]["initech"]["count_by_state"]["rejected"]}
    assert capped["per_tenant"]["initech"]["attempts_per_client"] > 1
    for s in results.values():
        assert 0 < s["fairness_jain_tenants"] <= 1
        assert s["cost_per_successful_request"] > 0


def test_cancellation_scenario_reports_waste():
    results = {n: simulate(sc).summary for n, sc in _variants("cancellation.yaml").items()}
    patient, impatient = results["patient"], results["impatient"]
    assert patient["wasted_gpu_seconds"] == 0 and patient["cancelled"] == 0
    reasons = impatient["count_by_reason"]
    assert reasons["cancelled"]["client disconnected"] > 0
    assert reasons["cancelled"]["client patience"] > 0
    assert reasons["timed_out"]["expired in queue"] > 0
    assert impatient["generation_cancelled"] > 0 and impatient["wasted_gpu_seconds"] > 0
    assert impatient["p99_ttft_ms"] < patient["p99_ttft_ms"]
    assert results["impatient_retry"]["retries"] > 0
