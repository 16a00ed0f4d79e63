"""Swap versus recompute preemption: costs accounted, swap space bounded, no block leaks."""

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sim.build import swap_seconds_per_block_of
from sim.config import validate
from sim.core.blocks import BlockManager
from sim.core.policies import make_policy
from sim.core.prefix_cache import PrefixCachingBlockManager
from sim.core.request import Request, RequestState
from sim.core.scheduler import Scheduler, SchedulerConfig
from sim.core.swap import SwapSpace
from tests.policy_workloads import drive, poisson, poisson_rows, run


def overload():
    return poisson_rows(11, 25.0, 8, 600, (100, 500))


def test_same_overload_different_preemption_costs_both_accounted():
    rows = overload()
    engine = {"max_num_seqs": 64, "num_gpu_blocks_override": 700}
    rec = run(rows, "continuous", engine={**engine, "preemption_mode": "recompute"}).summary
    swp = run(rows, "continuous", engine={**engine, "preemption_mode": "swap"}).summary
    assert rec["completed"] == swp["completed"] == len(rows)
    # recompute: positions run again, their share of step time counted; no host traffic
    assert rec["preemptions"] == rec["preemptions_recompute"] > 0
    assert rec["recompute_tokens"] > 0 and rec["recompute_seconds"] > 0 and rec["swap_seconds"] == 0
    # swap: KV copied out and back in over the host link; nothing recomputed
    assert swp["preemptions"] == swp["preemptions_swap"] > 0 and swp["swap_refused"] == 0
    assert swp["recompute_tokens"] == 0 and swp["swap_seconds"] > 0
    assert swp["swap_in_blocks"] == swp["swap_out_blocks"]
    sc = validate({"workload": {"num_requests": 1}}, "t")
    per_block = swap_seconds_per_block_of(sc)  # 16 tokens x 128 KiB over 55 GB/s
    assert abs(per_block - 16 * 131072 / 55e9) < 1e-12
    assert abs(swp["swap_seconds"] - 2 * swp["swap_out_blocks"] * per_block) < 1e-9
    assert swp["preemption_seconds"] != rec["preemption_seconds"]
    assert swp["wasted_tokens"] < rec["wasted_tokens"]


def test_full_swap_space_falls_back_to_recompute():
    rows = overload()
    engine = {"max_num_seqs": 64, "num_gpu_blocks_override": 700, "preemption_mode": "swap",
              "swap_space_gb": 0.1}
    s = run(rows, "continuous", engine=engine).summary
    assert s["swap_refused"] > 0 and s["preemptions_recompute"] > 0 and s["preemptions_swap"] > 0
    assert s["completed"] == len(rows)


def test_a_swapped_request_is_swapped_in_and_resumes_without_recompute():
    cfg = SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=512, max_model_len=1024,
                          preemption_mode="swap")
    swap = SwapSpace(100)
    sched = Scheduler(cfg, BlockManager(12, 16), make_policy("continuous"), swap=swap)
    a, b = Request(0, 0.0, 80, 100), Request(1, 0.0, 80, 100)
    sched.add_request(a, 0.0)
    sched.add_request(b, 0.0)
    now = 0.0
    while b.state != RequestState.SWAPPED:
        plan = sched.schedule(now)
        sched.complete(plan, now := now + 0.01)
    assert plan.swap_out_blocks == swap.used == len(swap.held) * 6  # 96 positions: 6 blocks
    kept = b.num_computed_tokens
    assert kept > 80 and not b.block_table
    while b.state != RequestState.RUNNING:
        plan = sched.schedule(now)
        sched.complete(plan, now := now + 0.01)
    assert plan.swap_in_blocks > 0 and swap.used == 0
    assert (b, 1) in plan.entries  # straight back to decoding
    assert b.computed_tokens_total == b.num_computed_tokens


def storm(wl, mode, policy, num_blocks, swap_blocks, caching, max_seqs):
    """Run a workload through a tight cache, checking the books after every step."""
    cfg = SchedulerConfig(max_num_seqs=max_seqs, max_num_batched_tokens=128, max_model_len=512,
                          preemption_mode=mode)
    bm = PrefixCachingBlockManager(num_blocks, 4, 16) if caching else BlockManager(num_blocks, 4)
    swap = SwapSpace(swap_blocks)
    params = {"min_token_share": {"c1": 0.3}} if policy == "class_budget" else {}
    sched = Scheduler(cfg, bm, make_policy(policy, params), swap=swap)
    reqs = [Request(i, a, p, m, priority=pr, tenant=f"t{fam}", cls=f"c{fam}",
                    hash_ids=tuple(range(fam * 100, fam * 100 + 13)), record_token_times=True)
            for i, (a, p, m, pr, fam) in enumerate(wl)]

    def check(s, plan):
        held = [b for r in s.running for b in r.block_table]
        assert s.blocks.num_used == len(set(held)) <= num_blocks
        if caching:
            s.blocks.check()
        else:
            assert len(held) == len(set(held))
        assert 0 <= swap.used <= swap.capacity_blocks
        assert swap.used == sum(swap.held.values())
        for r in swap.held:
            assert r.state == RequestState.SWAPPED and not r.block_table
        for r in s.running:
            assert len(r.block_table) * 4 >= r.num_computed_tokens

    done = drive(sched, reqs, check=check)
    assert sorted(r.req_id for r in done) == list(range(len(reqs)))
    for r in done:
        assert r.state in (RequestState.FINISHED, RequestState.REJECTED), r
        assert not r.block_table
        if r.state == RequestState.FINISHED:
            assert r.num_output_tokens == r.max_tokens
            assert all(x < y for x, y in zip(r.token_times, r.token_times[1:], strict=False))
    assert swap.used == 0 and not swap.held
    assert bm.num_free == num_blocks and bm.num_used == 0
    if caching:
        assert not any(bm.ref_count)
    if mode == "recompute":
        assert swap.swap_outs == 0
    return sched


POLICY_NAMES = ["continuous", "priority", "fair", "sjf", "edf", "class_budget", "lpm", "sarathi"]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    wl=st.lists(st.tuples(st.floats(0, 0.3), st.integers(1, 100), st.integers(1, 100),
                          st.integers(0, 3), st.integers(0, 2)), min_size=3, max_size=30),
    mode=st.sampled_from(["recompute", "swap"]),
    policy=st.sampled_from(POLICY_NAMES),
    num_blocks=st.integers(20, 60),
    swap_blocks=st.integers(0, 40),
    caching=st.booleans(),
    max_seqs=st.integers(2, 8),
)
def test_preemption_storms_end_every_request_once_without_leaks(
        wl, mode, policy, num_blocks, swap_blocks, caching, max_seqs):
    storm(wl, mode, policy, num_blocks, swap_blocks, caching, max_seqs)


def test_seeded_heavy_storms_swap_and_recompute_many_times():
    totals = {"swap": 0, "recompute": 0, "refused": 0}
    for seed in range(24):
        rng = np.random.default_rng(seed)
        n = 30
        wl = list(zip(rng.uniform(0, 0.2, n).tolist(), rng.integers(20, 100, n).tolist(),
                      rng.integers(20, 100, n).tolist(), rng.integers(0, 4, n).tolist(),
                      rng.integers(0, 3, n).tolist(), strict=True))
        mode = ("swap", "recompute")[seed % 2]
        sched = storm(wl, mode, POLICY_NAMES[seed % len(POLICY_NAMES)], 60, 30, seed % 3 == 0, 8)
        totals["swap"] += sched.swap.swap_outs if sched.swap else 0
        totals["refused"] += sched.swap.refused if sched.swap else 0
        totals["recompute"] += sched.num_recompute_preemptions
    assert totals["swap"] > 50 and totals["recompute"] > 50 and totals["refused"] > 0


def test_fast_path_matches_exact_steps_with_swap_and_prefix_caching():
    from tests.policy_workloads import table

    rng = np.random.default_rng(12)
    t = poisson(rng, 20.0, 0, 6)
    rows = [(a, int(p), int(o), "t", "x") for a, p, o in
            zip(t, rng.integers(100, 1500, len(t)), rng.integers(20, 400, len(t)), strict=True)]
    tbl = table(rows)
    tbl.hash_ids = [tuple(int(x) for x in rng.integers(0, 3, 3)) for _ in rows]
    engine = {"max_num_seqs": 32, "num_gpu_blocks_override": 500, "preemption_mode": "swap",
              "enable_prefix_caching": True, "prefix_block_tokens": 512}
    from sim.engine import Simulation

    out = []
    for exact in (False, True):
        sc = validate({"engine": engine, "workload": {"num_requests": 1},
                       "simulation": {"exact_steps": exact, "record_token_times": True}}, "t")
        out.append(Simulation(sc, tbl).run())
    fast, exact = out
    assert exact.summary["preemptions_swap"] > 0 and exact.summary["prefix_cache_hit_tokens"] > 0
    assert fast.frame().equals(exact.frame())
    for key in ("swap_seconds", "prefix_cache_hit_rate", "preemptions", "steps"):
        assert fast.summary[key] == exact.summary[key], key
