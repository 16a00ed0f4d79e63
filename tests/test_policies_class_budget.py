"""``class_budget``: interactive classes keep a minimum share; batch classes fill the rest."""

import numpy as np

from sim.core.blocks import BlockManager
from sim.core.policies import make_policy
from sim.core.request import Request
from sim.core.scheduler import Scheduler, SchedulerConfig
from tests.policy_workloads import poisson, run

SHARES = {"min_token_share": {"chat": 0.25}, "min_kv_share": {"chat": 0.2}}


def test_interactive_class_keeps_low_ttft_under_a_batch_flood():
    rng = np.random.default_rng(9)
    rows = [(t, 200, 100, "t", "chat") for t in poisson(rng, 2.0, 0, 30)]
    rows += [(t, 4000, 100, "t", "batch") for t in poisson(rng, 8.0, 0, 10)]
    engine = {"max_num_seqs": 32, "max_num_batched_tokens": 2048, "num_gpu_blocks_override": 3000}
    fcfs = run(rows, "continuous", engine=engine).frame()
    budget = run(rows, "class_budget", engine=engine, **SHARES).frame()
    p99 = {name: f[f.cls == "chat"].ttft.quantile(0.99) for name, f in
           (("fcfs", fcfs), ("budget", budget))}
    assert p99["budget"] < 0.1 * p99["fcfs"]
    assert (budget.state == "finished").all()


def _sched():
    cfg = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=400, max_model_len=4096)
    return Scheduler(cfg, BlockManager(1000, 16), make_policy("class_budget", SHARES))


def test_batch_prefill_leaves_the_interactive_share_and_fills_it_when_idle():
    sched = _sched()
    big = Request(0, 0.0, 3000, 10, cls="batch")
    sched.add_request(big, 0.0)
    plan = sched.schedule(0.0)
    assert plan.entries == [(big, 400)]  # no interactive demand: batch takes the whole budget
    sched.complete(plan, 0.01)
    chat = Request(1, 0.01, 300, 10, cls="chat")
    sched.add_request(chat, 0.01)
    plan = sched.schedule(0.01)
    got = {r.req_id: n for r, n in plan.entries}
    assert got == {0: 300, 1: 100}  # chat keeps 25% of 400, batch gets the rest


def test_batch_admission_keeps_kv_headroom_for_interactive():
    sched = _sched()
    hog = [Request(i, 0.0, 1500, 10, cls="batch") for i in range(8)]
    for r in hog:
        sched.add_request(r, 0.0)
    now = 0.0
    for _ in range(40):
        plan = sched.schedule(now)
        sched.complete(plan, now := now + 0.01)
        # 20% of 1000 blocks stay free for chat while no chat request holds any
        assert sched.blocks.num_free >= 200 or sched.blocks.num_free >= 1000 - sum(
            len(r.block_table) for r in sched.running)
    assert sched.blocks.num_used <= 800
