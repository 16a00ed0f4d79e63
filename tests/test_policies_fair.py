"""``fair`` (VTC): a flooding tenant cannot crowd out light ones; counters stay within the bound."""

import numpy as np

from sim.core.blocks import BlockManager
from sim.core.policies import make_policy
from sim.core.policies.fair import FairPolicy
from sim.core.request import Request
from sim.core.scheduler import Scheduler, SchedulerConfig
from tests.policy_workloads import drive, poisson, run


def flood():
    rng = np.random.default_rng(3)
    rows = [(t, 500, 120, "flood", "default") for t in poisson(rng, 30.0, 0, 10)]
    for tenant in ("light1", "light2"):
        rows += [(t, 300, 80, tenant, "default") for t in poisson(rng, 1.0, 0, 20)]
    return rows


def test_light_tenants_keep_low_ttft_under_a_flood():
    rows = flood()
    f_fcfs = run(rows, "continuous").frame()
    f_vtc = run(rows, "fair").frame()
    light = f_vtc.tenant != "flood"
    p99_vtc = np.percentile(f_vtc[light].ttft, 99)
    p99_fcfs = np.percentile(f_fcfs[f_fcfs.tenant != "flood"].ttft, 99)
    assert p99_vtc < 0.2 * p99_fcfs
    # the flood still gets the rest: everything finishes
    assert (f_vtc.state == "finished").all()


def test_tenant_weights_split_service():
    # Two tenants both flooding; weight 3:1 gives the heavy-weight tenant ~3x the service early on.
    rows = [(0.0, 200, 100, "a", "default") for _ in range(200)]
    rows += [(0.0, 200, 100, "b", "default") for _ in range(200)]
    res = run(rows, "fair", horizon=15.0, weights={"a": 3.0, "b": 1.0})
    f = res.frame()
    done = f[f.state == "finished"].groupby("tenant").size()
    assert 2.0 < done["a"] / done["b"] < 4.5


class _Counting:
    """The VTC counter of each tenant under some other policy's order (for the comparison)."""

    def __init__(self, policy, wi=1.0, wo=2.0):
        self.policy = policy
        self.counters = {}
        inner = policy.on_scheduled

        def on_scheduled(req, n, now):
            prompt = max(0, min(n, req.prompt_len - req.num_computed_tokens))
            self.counters[req.tenant] = self.counters.get(req.tenant, 0.0) + wi * prompt + wo * (n - prompt)
            inner(req, n, now)

        policy.on_scheduled = on_scheduled


def backlogged_gap(policy_name):
    cfg = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=512, max_model_len=2048)
    policy = make_policy(policy_name)
    counting = _Counting(policy)
    sched = Scheduler(cfg, BlockManager(4000, 16), policy)
    reqs = [Request(i, 0.0, 300, 60, tenant="heavy") for i in range(120)]
    reqs += [Request(1000 + i, 0.0, 300, 60, tenant="light") for i in range(40)]
    gaps = []

    def check(s, plan):
        waiting = {r.tenant for r in s.policy.waiting()}
        if {"heavy", "light"} <= waiting:
            c = counting.counters
            gaps.append(abs(c.get("heavy", 0.0) - c.get("light", 0.0)))

    drive(sched, reqs, check=check)
    return max(gaps), policy


def test_vtc_counter_gap_stays_within_the_bound():
    gap, policy = backlogged_gap("fair")
    assert isinstance(policy, FairPolicy)
    # VTC's bound: 2 * max(w_in * largest prefill chunk, w_out * batch of decodes) (+ one request)
    bound = 2 * max(1.0 * 512, 2.0 * 8) + 1.0 * 300 + 2.0 * 60
    assert gap <= bound
    fcfs_gap, _ = backlogged_gap("continuous")
    assert fcfs_gap > 5 * bound  # FCFS serves the heavy tenant's 120 requests first


def test_returning_tenant_is_lifted_to_the_active_minimum():
    policy = make_policy("fair")
    a = Request(0, 0.0, 100, 10, tenant="a")
    policy.enqueue(a, 0.0)
    policy.pop(a)
    policy.on_scheduled(a, 100, 0.0)  # a is running with counter 100
    b = Request(1, 1.0, 100, 10, tenant="b")
    policy.enqueue(b, 1.0)  # b was idle: lifted from 0 to a's 100
    assert policy.counters["b"] == 100.0
