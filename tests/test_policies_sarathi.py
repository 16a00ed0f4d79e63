"""``sarathi`` (stall-free chunked prefill) versus ``prefill_first`` with long prompts."""

import numpy as np

from sim.core.blocks import BlockManager
from sim.core.policies import make_policy
from sim.core.request import Request
from sim.core.scheduler import Scheduler, SchedulerConfig
from tests.policy_workloads import poisson, run


def chat_with_documents():
    rng = np.random.default_rng(4)
    rows = [(t, 200, 300, "t", "chat") for t in poisson(rng, 4.0, 0, 20)]
    rows += [(t, 7000, 20, "t", "doc") for t in poisson(rng, 1.0, 0, 20)]
    return rows


def test_sarathi_lowers_p99_itl_against_prefill_first():
    rows = chat_with_documents()
    small = {"max_num_seqs": 64, "max_num_batched_tokens": 512}
    sarathi = run(rows, "sarathi", engine=small).summary
    stalled = run(rows, "prefill_first", engine=small).summary
    # vLLM v0's shape: whole prompts in one step, decodes wait for them
    v0 = run(rows, "prefill_first", engine={"max_num_seqs": 64, "enable_chunked_prefill": False,
                                             "max_num_batched_tokens": 8192}).summary
    assert sarathi["p99_itl_ms"] < 0.2 * stalled["p99_itl_ms"]
    assert sarathi["p99_itl_ms"] < 0.5 * v0["p99_itl_ms"]
    assert sarathi["completed"] == stalled["completed"] == len(rows)


def test_decodes_go_first_and_prefill_chunks_fill_the_rest():
    def step_with(policy):
        cfg = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=64, max_model_len=2048)
        sched = Scheduler(cfg, BlockManager(400, 16), make_policy(policy))
        long = Request(0, 0.0, 1000, 5)
        shorts = [Request(i, 0.0, 8, 50) for i in range(1, 4)]
        now = 0.0
        for r in shorts:
            sched.add_request(r, now)
        plan = sched.schedule(now)  # the short ones get in and start decoding
        sched.complete(plan, now := now + 0.01)
        sched.add_request(long, now)
        plan = sched.schedule(now)  # the long prompt gets the rest of this step
        sched.complete(plan, now := now + 0.01)
        return sched.schedule(now), long, shorts

    plan, long, shorts = step_with("sarathi")
    scheduled = dict((r.req_id, n) for r, n in plan.entries)
    assert all(scheduled.get(r.req_id) == 1 for r in shorts)  # every decode runs
    assert scheduled[long.req_id] == 64 - len(shorts)  # the chunk takes what is left
    plan, long, shorts = step_with("prefill_first")
    assert [r.req_id for r, _ in plan.entries] == [long.req_id]  # the prompt takes it all
