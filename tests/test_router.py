"""Routers: each one's choice on hand-built replica states, and clusters in the engine."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from sim.config import InputError
from sim.core.request import Request
from sim.engine import Simulation, simulate
from sim.router import ROUTERS, imbalance, make_router
from sim.workload.spec import build_workload
from tests.helpers import scenario


def replicas(outstanding, usage):
    return [SimpleNamespace(index=i, outstanding=o, routed=0,
                            scheduler=SimpleNamespace(blocks=SimpleNamespace(usage=u)))
            for i, (o, u) in enumerate(zip(outstanding, usage, strict=True))]


def req(i, session=None, hashes=None):
    return Request(i, 0.0, 64, 8, session=session, hash_ids=hashes)


def test_registry_names():
    assert {"round_robin", "random", "least_outstanding", "least_kv_usage", "session_affinity",
            "prefix_aware"} <= set(ROUTERS)
    with pytest.raises(InputError, match="allowed: round_robin"):
        make_router("nope", 2)


def test_round_robin_cycles():
    r = make_router("round_robin", 3)
    reps = replicas([0, 0, 0], [0, 0, 0])
    assert [r.pick(req(i), reps) for i in range(7)] == [0, 1, 2, 0, 1, 2, 0]


def test_random_is_seeded_and_spreads():
    reps = replicas([0] * 4, [0] * 4)
    a = [make_router("random", 4, seed=1).pick(req(i), reps) for i in range(1)]
    r1, r2, r3 = (make_router("random", 4, seed=s) for s in (1, 1, 2))
    s1 = [r1.pick(req(i), reps) for i in range(200)]
    s2 = [r2.pick(req(i), reps) for i in range(200)]
    s3 = [r3.pick(req(i), reps) for i in range(200)]
    assert s1 == s2 and s1 != s3 and a[0] == s1[0]
    assert set(s1) == {0, 1, 2, 3}


def test_least_outstanding_and_least_kv():
    reps = replicas([5, 2, 2], [0.1, 0.6, 0.3])
    assert make_router("least_outstanding", 3).pick(req(0), reps) == 2  # tie on 2 -> lower KV
    assert make_router("least_kv_usage", 3).pick(req(0), reps) == 0


def test_session_affinity_sticks():
    r = make_router("session_affinity", 3)
    reps = replicas([0, 0, 0], [0, 0, 0])
    first = r.pick(req(0, session="s1"), reps)
    reps[first].outstanding = 10  # busier now, but the session stays home
    assert r.pick(req(1, session="s1"), reps) == first
    assert r.pick(req(2, session="s2"), reps) != first


def test_prefix_aware_follows_shared_prefix():
    r = make_router("prefix_aware", 3)
    reps = replicas([0, 0, 0], [0, 0, 0])
    a = req(0, hashes=(1, 2, 3))
    first = r.pick(a, reps)
    r.observe(a, first)
    reps[first].outstanding = 3  # a little busier: the cached prefix still wins
    assert r.pick(req(1, hashes=(1, 2, 9)), reps) == first
    # No shared prefix: least loaded.
    assert r.pick(req(2, hashes=(7, 8)), reps) != first
    # Far busier than the others: balance wins over locality.
    reps[first].outstanding = 100
    assert r.pick(req(3, hashes=(1, 2, 3)), reps) != first


def test_imbalance():
    assert imbalance([5, 5, 5]) == 1.0
    assert imbalance([0, 0, 9]) == 3.0


@pytest.mark.parametrize("router", sorted(ROUTERS))
def test_cluster_runs_every_request_once(router):
    sc = scenario(workload__num_requests=120, workload__arrival={"kind": "poisson", "rate": 40},
                  cluster={"replicas": 3, "router": router}, engine={"max_num_seqs": 8})
    res = simulate(sc)
    s = res.summary
    per = s["per_replica"]
    assert s["num_replicas"] == 3 and s["router"] == router
    assert sum(p["routed"] for p in per) == 120
    assert sum(p["completed"] for p in per) == s["completed"] == 120
    assert set(res.frame().replica) <= {0, 1, 2}
    assert s["imbalance_requests"] >= 1.0
    if router in ("round_robin", "least_outstanding"):
        assert s["imbalance_requests"] < 1.1


def test_balancing_routers_beat_random_on_ttft():
    # Bursty load on 4 small replicas: joining the shortest queue beats a coin.
    base = dict(workload__num_requests=400, workload__arrival={"kind": "gamma", "rate": 30, "cv": 3},
                workload__output_len={"kind": "lognormal", "median": 100, "sigma": 1.0},
                engine={"max_num_seqs": 8})
    p99 = {}
    for router in ("random", "least_outstanding"):
        sc = scenario(cluster={"replicas": 4, "router": router}, **base)
        p99[router] = simulate(sc).summary["p99_ttft_ms"]
    assert p99["least_outstanding"] < p99["random"]


def test_cluster_block_and_default_replicas():
    sc = scenario(cluster={"replicas": 2})
    sim = Simulation(sc, build_workload(sc.workload, sc.seed))
    assert len(sim.replicas) == 2 and sim.router.name == "round_robin"
    with pytest.raises(InputError, match="cluster.router"):
        scenario(cluster={"replicas": 2, "router": "fastest"})


def test_prefix_aware_reads_the_replicas_prefix_caches():
    from sim.config import validate

    base = {"engine": {"max_num_seqs": 32, "enable_prefix_caching": True},
            "workload": {"trace": {"path": "mooncake_conversation", "limit": 300, "target_rate": 8,
                                   "max_prompt_len": 7000, "max_output_len": 200}}}
    hit = {}
    for router in ("round_robin", "prefix_aware"):
        data = dict(base, cluster={"replicas": 4, "router": router})
        try:
            res = simulate(validate(data, "t"))
        except InputError as exc:
            pytest.skip(f"trace not available: {exc}")
        hit[router] = res.summary["prefix_cache_hit_rate"]
    assert hit["prefix_aware"] > 1.3 * hit["round_robin"]
