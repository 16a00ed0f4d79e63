"""``priority``: lower value first, priority preemption, aging so nothing starves."""

import numpy as np

from sim.core.blocks import BlockManager
from sim.core.policies import make_policy
from sim.core.request import Request, RequestState
from sim.core.scheduler import Scheduler, SchedulerConfig
from tests.policy_workloads import poisson, run


def stream():
    """A high-priority stream above capacity for 30 s, with a trickle of low-priority work."""
    rng = np.random.default_rng(1)
    hi = poisson(rng, 9.0, 0, 30)
    lo = poisson(rng, 1.0, 0, 30)
    return [(t, 400, 150, "a", "hi", 0) for t in hi] + [(t, 400, 150, "b", "lo", 1) for t in lo]


def by_class(res):
    f = res.frame()
    assert (f.state == "finished").all()
    return f[f.cls == "hi"], f[f.cls == "lo"]


def test_priority_serves_high_first_and_aging_serves_every_low_request():
    rows = stream()
    last_hi = max(r[0] for r in rows if r[4] == "hi")
    fcfs_hi, fcfs_lo = by_class(run(rows, "continuous", engine={"max_num_seqs": 8}))
    pri_hi, pri_lo = by_class(run(rows, "priority", engine={"max_num_seqs": 8}))
    aged_hi, aged_lo = by_class(run(rows, "priority", engine={"max_num_seqs": 8}, aging_rate=0.2))
    # High priority waits far less than under FCFS ...
    assert pri_hi.ttft.mean() < 0.8 * fcfs_hi.ttft.mean()
    # ... and without aging no low-priority request starts while the stream lasts (starved).
    assert pri_lo.first_token.min() > last_hi
    # With aging every low-priority request is served during the stream, within a bounded wait,
    # while high priority still goes first (FCFS would treat both alike).
    # (aging 0.2/s: one priority level is worth 5 s of waiting, so a low request waits at most
    # about 5 s longer than the worst high one)
    assert aged_lo.ttft.max() <= aged_hi.ttft.max() + 1 / 0.2 + 1.0
    assert (aged_lo.first_token < last_hi).mean() > 0.4  # none without aging
    assert aged_lo.ttft.max() < 0.6 * pri_lo.ttft.max()
    assert aged_lo.ttft.mean() - aged_hi.ttft.mean() > 3.0
    assert abs(fcfs_lo.ttft.mean() - fcfs_hi.ttft.mean()) < 1.0


def test_waiting_high_priority_preempts_the_lowest_priority_running_request():
    cfg = SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=256, max_model_len=512)
    sched = Scheduler(cfg, BlockManager(10, 16), make_policy("priority"))
    lows = [Request(i, 0.0, 60, 50, priority=p) for i, p in enumerate((2, 1))]
    for r in lows:
        sched.add_request(r, 0.0)
    plan = sched.schedule(0.0)
    sched.complete(plan, 0.01)
    assert len(sched.running) == 2 and sched.blocks.num_free == 2
    urgent = Request(9, 0.01, 60, 10, priority=0)
    sched.add_request(urgent, 0.01)
    plan = sched.schedule(0.01)
    # priority 2 (the worst) is preempted, the urgent one admitted in the same step
    assert plan.preempted == [lows[0]] and lows[0].state == RequestState.PREEMPTED
    assert urgent.state == RequestState.RUNNING and lows[1].state == RequestState.RUNNING
    # running order follows priority, so the token budget goes to the most urgent first
    sched.complete(plan, 0.02)
    plan = sched.schedule(0.02)
    assert plan.entries[0][0] is urgent


def test_kv_exhaustion_preempts_the_worst_priority():
    cfg = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=1024, max_model_len=512)
    sched = Scheduler(cfg, BlockManager(30, 16), make_policy("priority", {"preempt_for_waiting": False}))
    reqs = [Request(i, 0.0, 60, 200, priority=p) for i, p in enumerate((0, 3, 1))]
    victims = []
    now = 0.0
    for r in reqs:
        sched.add_request(r, now)
    while sched.has_work and not victims:
        plan = sched.schedule(now)
        victims.extend(plan.preempted)
        now += 0.01
        sched.complete(plan, now)
    assert victims[0] is reqs[1]
