"""The fast path (closed-form decode runs) gives the same per-request results as stepping."""

import math

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sim.core.policies import POLICIES
from sim.engine import simulate
from tests.helpers import scenario


def _pair(sc):
    fast = simulate(sc)
    exact = simulate(sc.model_copy(update={"simulation": sc.simulation.model_copy(
        update={"exact_steps": True})}))
    return fast, exact


def _assert_same(fast, exact):
    a, b = fast.frame(), exact.frame()
    assert a.equals(b), (a.compare(b) if a.shape == b.shape else (a.shape, b.shape))
    for key in ("completed", "steps", "preemptions", "max_running_batch", "total_output_tokens"):
        assert fast.summary[key] == exact.summary[key], key
    for key in ("gpu_busy_fraction", "kv_usage_mean", "kv_usage_max", "mean_itl_ms", "p99_itl_ms",
                "mean_running_batch"):
        x, y = fast.summary[key], exact.summary[key]
        if x is None or y is None:
            assert x is y, key
            continue
        assert math.isclose(x, y, rel_tol=1e-9, abs_tol=1e-12), (key, x, y)
    assert fast.timeseries.time == exact.timeseries.time
    assert fast.timeseries.kv_usage == exact.timeseries.kv_usage
    assert fast.timeseries.running == exact.timeseries.running
    assert fast.timeseries.waiting == exact.timeseries.waiting


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 10_000),
    policy=st.sampled_from(sorted(POLICIES)),
    rate=st.floats(0.5, 60),
    blocks=st.integers(40, 2000),
    max_seqs=st.integers(1, 64),
    chunked=st.booleans(),
    cost=st.sampled_from(["profile", "roofline"]),
    horizon=st.one_of(st.none(), st.floats(1, 30)),
)
def test_fast_path_matches_exact_steps(seed, policy, rate, blocks, max_seqs, chunked, cost, horizon):
    sc = scenario(
        seed=seed, policy={"name": policy}, cost_model={"kind": cost},
        engine={"num_gpu_blocks_override": blocks, "max_num_seqs": max_seqs,
                "enable_chunked_prefill": chunked, "max_num_batched_tokens": 2048 if chunked else 8192,
                "block_size": 16},
        workload={"num_requests": 60, "arrival": {"kind": "gamma", "rate": rate, "cv": 2.0},
                  "prompt_len": {"kind": "lognormal", "median": 300, "sigma": 1.0, "max": 3000},
                  "output_len": {"kind": "lognormal", "median": 80, "sigma": 1.0, "max": 900}},
        simulation={"record_token_times": True, "timeseries_interval_s": 0.05, "horizon_s": horizon},
    )
    fast, exact = _pair(sc)
    _assert_same(fast, exact)
    for rid, times in exact.records.token_times.items():
        assert fast.records.token_times[rid] == times


def test_fast_path_takes_runs_on_a_busy_server():
    sc = scenario(workload={"num_requests": 300, "arrival": {"kind": "poisson", "rate": 5},
                            "prompt_len": {"kind": "fixed", "value": 500},
                            "output_len": {"kind": "fixed", "value": 300}})
    fast, exact = _pair(sc)
    _assert_same(fast, exact)


def test_runs_straddle_benign_arrivals_only(monkeypatch):
    """A run may end with the step an arrival lands in (one replica, FCFS), never past any other
    event; fair share reads running state on enqueue, so its runs stop short of arrivals."""
    import sim.engine as engine

    seen = []

    def spy(sched, plan, cost, now, next_event, barrier=None):
        run = plan_decode_run(sched, plan, cost, now, next_event, barrier)
        if run is not None:
            seen.append((run.ends[-1] >= next_event, run.ends[-1] < (barrier or next_event)))
        return run

    plan_decode_run = engine.plan_decode_run
    monkeypatch.setattr(engine, "plan_decode_run", spy)
    work = {"num_requests": 200, "arrival": {"kind": "poisson", "rate": 5},
            "prompt_len": {"kind": "fixed", "value": 500},
            "output_len": {"kind": "fixed", "value": 300}}
    _assert_same(*_pair(scenario(workload=work)))
    assert any(straddles for straddles, _ in seen) and all(before for _, before in seen)
    seen.clear()
    _assert_same(*_pair(scenario(workload=work, policy={"name": "fair"})))
    assert seen and not any(straddles for straddles, _ in seen)
