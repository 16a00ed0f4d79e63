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
    # Recorded in the same order too (the summary's means sum the columns in that order).
    assert fast.records.ints["req_id"] == exact.records.ints["req_id"]
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
    for rid, times in exact.records.token_times.items():  # when record_token_times is on
        assert fast.records.token_times[rid] == times


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
    _assert_same(*_pair(sc))


def test_fast_path_takes_runs_on_a_busy_server():
    sc = scenario(workload={"num_requests": 300, "arrival": {"kind": "poisson", "rate": 5},
                            "prompt_len": {"kind": "fixed", "value": 500},
                            "output_len": {"kind": "fixed", "value": 300}})
    fast, exact = _pair(sc)
    _assert_same(fast, exact)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 10_000),
    policy=st.sampled_from(["continuous", "orca", "sarathi"]),
    arrival=st.sampled_from(["poisson", "gamma", "constant"]),
    rate=st.floats(0.5, 80),
    max_seqs=st.integers(1, 48),
    budget=st.sampled_from([256, 700, 2048, 8192]),
    threshold=st.sampled_from([0, 0, 400]),
    blocks=st.integers(260, 3000),
    chunked=st.booleans(),
    cost=st.sampled_from(["profile", "roofline"]),
    horizon=st.one_of(st.none(), st.floats(1, 20)),
)
def test_runs_admitting_arrivals_match_exact_steps(seed, policy, arrival, rate, max_seqs, budget,
                                                    threshold, blocks, chunked, cost, horizon):
    """Benign arrivals (one replica, a cache every request fits): runs admit them themselves
    (FIFO policies) or end in the step they land in (others); prompts that need chunking, a
    full batch, a tight token budget or KV pressure hand the step back to the scheduler."""
    if not chunked and budget < 3000:
        budget = 8192  # unchunked, a prompt must fit one step's budget
    sc = scenario(
        seed=seed, policy={"name": policy}, cost_model={"kind": cost},
        engine={"num_gpu_blocks_override": blocks, "max_num_seqs": max_seqs,
                "enable_chunked_prefill": chunked, "max_num_batched_tokens": budget,
                "long_prefill_token_threshold": threshold if chunked else 0, "block_size": 16},
        workload={"num_requests": 80,
                  "arrival": {"kind": arrival, "rate": rate, **({"cv": 2.0} if arrival == "gamma" else {})},
                  "prompt_len": {"kind": "lognormal", "median": 200, "sigma": 1.0, "max": 3000},
                  "output_len": {"kind": "lognormal", "median": 60, "sigma": 1.0, "max": 900}},
        simulation={"record_token_times": True, "timeseries_interval_s": 0.05, "horizon_s": horizon},
    )
    _assert_same(*_pair(sc))


def test_refused_arrival_stops_a_run():
    """A request longer than max_model_len is refused on arrival, mid-traffic: runs end before
    it (its record comes between the others'), and never admit it themselves."""
    sc = scenario(engine={"max_num_seqs": 16, "max_model_len": 2048},
                  workload={"num_requests": 300, "arrival": {"kind": "poisson", "rate": 4},
                            "prompt_len": {"kind": "fixed", "value": 200},
                            "output_len": {"kind": "lognormal", "median": 60, "sigma": 1.5,
                                           "max": 3000}},
                  simulation={"record_token_times": True})
    fast, exact = _pair(sc)
    _assert_same(fast, exact)
    assert 0 < fast.summary["count_by_state"]["rejected"] < 20


def test_arrival_at_a_step_end_joins_that_step():
    """An arrival due at the very instant a step ends is queued before that step's end is
    handled (arrivals are URGENT in SimPy), so the next step admits it, in both paths."""
    base = {"engine": {"max_num_seqs": 8},
            "simulation": {"record_token_times": True}}
    first = simulate(scenario(**base, workload={"requests": [
        {"arrival": 0.0, "prompt_len": 300, "max_tokens": 40}]}))
    tick = first.records.token_times[0][5]  # the end of a decode step
    sc = scenario(**base, workload={"requests": [
        {"arrival": 0.0, "prompt_len": 300, "max_tokens": 40},
        {"arrival": tick, "prompt_len": 100, "max_tokens": 20}]})
    fast, exact = _pair(sc)
    _assert_same(fast, exact)
    assert fast.frame()["first_scheduled"][1] == tick


def test_runs_pass_benign_arrivals_only(monkeypatch):
    """With benign arrivals (one replica, nothing refused) a FIFO policy's runs admit them
    and another policy's runs may end in the step one lands in; never past any other event.
    Fair share reads running state on enqueue, so its runs stop short of arrivals."""
    import sim.engine as engine

    seen = []
    joined = []

    def spy(sched, plan, cost, now, next_event, barrier=None, feed=None):
        run = plan_run(sched, plan, cost, now, next_event, barrier, feed)
        if run is not None:
            seen.append((run.ends[-1] >= next_event, run.ends[-1] < (barrier or next_event)))
            joined.extend(run.joined)
        return run

    plan_run = engine.plan_run
    monkeypatch.setattr(engine, "plan_run", spy)
    work = {"num_requests": 200, "arrival": {"kind": "poisson", "rate": 5},
            "prompt_len": {"kind": "fixed", "value": 500},
            "output_len": {"kind": "fixed", "value": 300}}
    _assert_same(*_pair(scenario(workload=work)))
    # FIFO: runs admit most arrivals themselves and may pass them; never any other event.
    assert len(joined) > 100 and all(before for _, before in seen)
    seen.clear()
    joined.clear()
    _assert_same(*_pair(scenario(workload=work, policy={"name": "sarathi"})))
    assert any(straddles for straddles, _ in seen) and not joined
    seen.clear()
    _assert_same(*_pair(scenario(workload=work, policy={"name": "fair"})))
    assert seen and not any(straddles for straddles, _ in seen) and not joined


def test_fair_share_counters_match_exact_steps():
    """Runs tell the policy about every decode step once: VTC's per-tenant service counters end
    the same as stepping's (the first step of a run is announced by schedule itself)."""
    from sim.engine import Simulation
    from sim.workload.spec import build_workload

    def counters(exact: bool) -> dict:
        sc = scenario(policy={"name": "fair"}, simulation={"exact_steps": exact},
                      workload={"duration_s": 20, "classes": [
                          {"name": "a", "tenant": "a", "arrival": {"kind": "poisson", "rate": 3},
                           "output_len": {"kind": "fixed", "value": 120}},
                          {"name": "b", "tenant": "b", "arrival": {"kind": "poisson", "rate": 1},
                           "output_len": {"kind": "fixed", "value": 60}}]})
        sim = Simulation(sc, build_workload(sc.workload, sc.seed))
        sim.run()
        return dict(sim.replicas[0].scheduler.policy.counters)

    fast, exact = counters(False), counters(True)
    assert fast.keys() == exact.keys() and all(
        math.isclose(fast[t], exact[t], rel_tol=1e-12) for t in exact), (fast, exact)
