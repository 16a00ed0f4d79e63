"""Scheduler invariants under random workloads and knobs (hypothesis)."""

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sim.core.blocks import BlockManager
from sim.core.policies import POLICIES, make_policy
from sim.core.request import Request, RequestState
from sim.core.scheduler import Scheduler, SchedulerConfig
from sim.engine import simulate
from tests.helpers import scenario
from tests.policy_workloads import drive

workloads = st.lists(
    st.tuples(st.floats(0, 5), st.integers(1, 300), st.integers(1, 120)), min_size=1, max_size=40
)


def check_blocks_and_budget(sched: Scheduler, plan) -> None:
    """After every schedule(): blocks owned by running requests are exactly the pool's used
    blocks, within the pool; batch and token budget hold."""
    owned = sum(len(r.block_table) for r in sched.running)
    assert sched.blocks.num_used == owned <= sched.blocks.num_blocks
    assert len(sched.running) <= sched.config.max_num_seqs
    assert plan.num_tokens <= sched.config.max_num_batched_tokens


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    wl=workloads,
    policy=st.sampled_from(sorted(POLICIES)),
    num_blocks=st.integers(8, 80),
    block_size=st.sampled_from([4, 16]),
    max_seqs=st.integers(1, 8),
    budget=st.integers(16, 512),
    chunked=st.booleans(),
)
def test_every_request_ends_once_and_blocks_balance(wl, policy, num_blocks, block_size, max_seqs,
                                                    budget, chunked):
    cfg = SchedulerConfig(max_num_seqs=max_seqs, max_num_batched_tokens=budget if chunked else 512,
                          enable_chunked_prefill=chunked, max_model_len=512)
    sched = Scheduler(cfg, BlockManager(num_blocks, block_size), make_policy(policy))
    reqs = [Request(i, a, p, m, record_token_times=True) for i, (a, p, m) in enumerate(wl)]
    done = drive(sched, reqs, check=check_blocks_and_budget)
    assert sorted(r.req_id for r in done) == list(range(len(reqs)))
    for r in done:
        assert r.state in (RequestState.FINISHED, RequestState.REJECTED)
        if r.state == RequestState.FINISHED:
            assert r.num_output_tokens == r.max_tokens
            assert all(a < b for a, b in zip(r.token_times, r.token_times[1:], strict=False))
            assert not r.block_table
    assert sched.blocks.num_free == num_blocks


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 10_000), policy=st.sampled_from(sorted(POLICIES)),
       blocks=st.integers(60, 400))
def test_same_seed_same_results(seed, policy, blocks):
    sc = scenario(seed=seed, policy={"name": policy},
                  engine={"num_gpu_blocks_override": blocks, "max_num_seqs": 16},
                  workload={"num_requests": 40, "arrival": {"kind": "poisson", "rate": 50},
                            "prompt_len": {"kind": "uniform", "min": 10, "max": 900},
                            "output_len": {"kind": "uniform", "min": 1, "max": 300}})
    a = simulate(sc).frame()
    b = simulate(sc).frame()
    assert a.equals(b)
    assert a.state.isin(["finished", "rejected"]).all()
    too_big = -(-(a.prompt_len + a.max_tokens) // 16) > blocks
    assert ((a.state == "rejected") == too_big).all()
