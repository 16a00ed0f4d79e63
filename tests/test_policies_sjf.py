"""``sjf``: shortest predicted job first lowers mean latency on a bimodal workload."""

import numpy as np

from sim.core.policies import make_policy
from sim.core.request import Request
from tests.policy_workloads import poisson, run


def bimodal():
    rng = np.random.default_rng(5)
    t = poisson(rng, 10.0, 0, 30)
    long = rng.random(len(t)) < 0.2
    return [(a, 200, 600 if is_long else 16, "t", "long" if is_long else "short")
            for a, is_long in zip(t, long, strict=True)]


def e2e(res):
    f = res.frame()
    assert (f.state == "finished").all()
    return f


def test_sjf_lowers_mean_e2e_on_a_bimodal_workload():
    rows = bimodal()
    engine = {"max_num_seqs": 4}
    fcfs = e2e(run(rows, "continuous", engine=engine))
    oracle = e2e(run(rows, "sjf", engine=engine))
    noisy = e2e(run(rows, "sjf", engine=engine, predictor="noisy", error_sigma=0.5))
    assert oracle.e2el.mean() < 0.7 * fcfs.e2el.mean()
    assert noisy.e2el.mean() < 0.8 * fcfs.e2el.mean()
    # short jobs gain most; long ones pay a little
    assert oracle[oracle.cls == "short"].e2el.mean() < 0.5 * fcfs[fcfs.cls == "short"].e2el.mean()


def test_aging_bounds_the_wait_of_a_long_job_in_a_stream_of_short_ones():
    rng = np.random.default_rng(2)
    rows = [(t, 200, 16, "t", "short") for t in poisson(rng, 25.0, 0, 30)]
    rows.append((1.0, 200, 600, "t", "long"))
    plain = e2e(run(rows, "sjf", engine={"max_num_seqs": 2}))
    aged = e2e(run(rows, "sjf", engine={"max_num_seqs": 2}, aging_rate=100.0))
    # without aging the long job waits for the whole stream; with it, ~ (600 - 16) / 100 s more
    assert plain[plain.cls == "long"].ttft.max() > 30.0
    assert aged[aged.cls == "long"].ttft.max() < 15.0


def test_noisy_predictor_is_seeded_and_log_normal():
    p = make_policy("sjf", {"predictor": "noisy", "error_sigma": 0.5, "seed": 1})
    reqs = [Request(i, 0.0, 10, 100) for i in range(2000)]
    pred = np.array([p.predicted_output(r) for r in reqs])
    assert np.allclose(pred, [p.predicted_output(r) for r in reqs])
    assert 0.45 < np.std(np.log(pred / 100)) < 0.55
