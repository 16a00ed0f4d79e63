"""``edf``: earliest TTFT deadline first raises TTFT-SLO attainment."""

import numpy as np

from tests.policy_workloads import poisson, run

SLO = {"chat": 1.0, "batch": 30.0}


def mixed():
    rng = np.random.default_rng(7)
    rows = [(t, 300, 60, "t", "chat") for t in poisson(rng, 8.0, 0, 20)]
    rows += [(t, 1500, 200, "t", "batch") for t in poisson(rng, 6.0, 0, 20)]
    return rows


def attainment(res):
    f = res.frame()
    slo = f.cls.map(SLO)
    met = (f.state == "finished") & (f.ttft <= slo)
    return met.mean(), f


def test_edf_raises_ttft_slo_attainment():
    rows = mixed()
    fcfs, _ = attainment(run(rows, "continuous"))
    edf, f = attainment(run(rows, "edf", ttft_slo_by_class=SLO))
    assert edf > fcfs + 0.2
    assert (f.state == "finished").all()


def test_dropping_unreachable_requests_lifts_attainment_further_under_overload():
    rng = np.random.default_rng(8)
    rows = [(t, 300, 60, "t", "chat") for t in poisson(rng, 8.0, 0, 20)]
    rows += [(t, 1500, 200, "t", "batch") for t in poisson(rng, 2.0, 0, 20)]
    engine = {"max_num_seqs": 4}
    fcfs, _ = attainment(run(rows, "continuous", engine=engine))
    keep, _ = attainment(run(rows, "edf", engine=engine, ttft_slo_by_class=SLO))
    drop, f = attainment(run(rows, "edf", engine=engine, ttft_slo_by_class=SLO, drop_unreachable=True))
    # Past saturation, serving requests that are already late makes every later one late too.
    assert drop > max(keep, fcfs) + 0.3
    dropped = f[f.state == "timed_out"]
    assert len(dropped) and (dropped.reason == "ttft_slo_unreachable").all()
    assert dropped.first_token.isna().all()
