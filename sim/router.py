"""Routers: which replica of a cluster gets each arriving request.

``cluster: {replicas: N, router: NAME}`` in a scenario picks one from ``ROUTERS``. A router sees
the replicas as the engine keeps them (their schedulers, block managers and counters of
outstanding requests) and returns an index. Routers are deterministic given the scenario seed.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Protocol

import numpy as np

from sim.core.request import Request
from sim.errors import InputError


class ReplicaView(Protocol):
    index: int
    outstanding: int
    routed: int
    scheduler: object


class Router:
    """Base: subclasses implement ``pick``; ``observe`` sees each routed request afterwards."""

    name = "base"

    def __init__(self, num_replicas: int, seed: int = 0) -> None:
        self.num_replicas = num_replicas
        self.seed = seed

    def pick(self, req: Request, replicas: list) -> int:
        raise NotImplementedError

    def observe(self, req: Request, index: int) -> None:
        """Called once the request is on replica ``index`` (prefix tables, session maps)."""


ROUTERS: dict[str, type[Router]] = {}


def register_router(cls: type[Router]) -> type[Router]:
    ROUTERS[cls.name] = cls
    return cls


def make_router(name: str, num_replicas: int, seed: int = 0) -> Router:
    try:
        cls = ROUTERS[name]
    except KeyError:
        raise InputError(
            f"cluster.router: unknown router '{name}'; allowed: {', '.join(ROUTERS)}"
        ) from None
    return cls(num_replicas, seed)


def _least_loaded(replicas: list, candidates=None) -> int:
    """Fewest outstanding requests, then lowest KV usage, then lowest index."""
    pool = replicas if candidates is None else [replicas[i] for i in candidates]
    best = min(pool, key=lambda r: (r.outstanding, r.scheduler.blocks.usage, r.index))
    return best.index


@register_router
class RoundRobin(Router):
    name = "round_robin"

    def __init__(self, num_replicas: int, seed: int = 0) -> None:
        super().__init__(num_replicas, seed)
        self._next = 0

    def pick(self, req, replicas):
        i = self._next % len(replicas)
        self._next += 1
        return i


@register_router
class Random(Router):
    name = "random"

    def __init__(self, num_replicas: int, seed: int = 0) -> None:
        super().__init__(num_replicas, seed)
        # Its own stream, derived from the scenario seed only.
        self._rng = np.random.default_rng(np.random.SeedSequence([seed, 0x524F55]))

    def pick(self, req, replicas):
        return int(self._rng.integers(len(replicas)))


@register_router
class LeastOutstanding(Router):
    """Join the shortest queue: fewest requests waiting or running on the replica."""

    name = "least_outstanding"

    def pick(self, req, replicas):
        return _least_loaded(replicas)


@register_router
class LeastKVUsage(Router):
    """Lowest KV-cache usage (blocks held), then fewest outstanding requests."""

    name = "least_kv_usage"

    def pick(self, req, replicas):
        best = min(replicas, key=lambda r: (r.scheduler.blocks.usage, r.outstanding, r.index))
        return best.index


@register_router
class SessionAffinity(Router):
    """Requests of one session stay on one replica (its KV/prefix stays warm there).

    A session's first request goes to the least-loaded replica; requests without a session are
    spread by least outstanding.
    """

    name = "session_affinity"

    def __init__(self, num_replicas: int, seed: int = 0) -> None:
        super().__init__(num_replicas, seed)
        self._home: dict[str, int] = {}

    def pick(self, req, replicas):
        key = req.session
        if key is None:
            return _least_loaded(replicas)
        home = self._home.get(str(key))
        if home is None:
            home = self._home[str(key)] = _least_loaded(replicas)
        return home


@register_router
class PrefixAware(Router):
    """Send a request where the longest leading run of its prompt blocks is already cached.

    Reads the replica's prefix cache when it has one (``engine.enable_prefix_caching``: the
    block manager's ``match_prefix``); otherwise keeps its own approximate table of the block
    hashes it sent to each replica (as SGLang's cache-aware router does), bounded per replica.
    Ties, and requests without block hashes, go to the least-loaded replica; a replica more than
    ``balance_slack`` requests busier than the least loaded one is skipped, so one hot prefix
    cannot pile everything onto one replica.
    """

    name = "prefix_aware"
    table_size = 200_000
    balance_slack = 32

    def __init__(self, num_replicas: int, seed: int = 0) -> None:
        super().__init__(num_replicas, seed)
        self._tables: list[OrderedDict[int, None]] = [OrderedDict() for _ in range(num_replicas)]

    def _matched(self, rep, req) -> int:
        blocks = rep.scheduler.blocks
        if getattr(blocks, "caches_prefixes", False):
            return blocks.match_prefix(req)  # tokens cached there now (a pure query)
        table = self._tables[rep.index]
        n = 0
        for h in req.hash_ids:
            if h not in table:
                break
            n += 1
        return n

    def pick(self, req, replicas):
        hashes = req.hash_ids
        if not hashes:
            return _least_loaded(replicas)
        floor = min(r.outstanding for r in replicas)
        allowed = [r for r in replicas if r.outstanding <= floor + self.balance_slack]
        scores = [(self._matched(r, req), -r.outstanding, -r.index) for r in allowed]
        best = max(range(len(allowed)), key=lambda i: scores[i])
        if scores[best][0] == 0:
            return _least_loaded(replicas, [r.index for r in allowed])
        return allowed[best].index

    def observe(self, req, index):
        if not req.hash_ids:
            return
        table = self._tables[index]
        for h in req.hash_ids:
            table[h] = None
            table.move_to_end(h)
        while len(table) > self.table_size:
            table.popitem(last=False)


def imbalance(values) -> float:
    """max / mean of per-replica loads (1.0 = perfectly even; N = everything on one of N)."""
    v = np.asarray(list(values), dtype=np.float64)
    if len(v) == 0 or v.mean() <= 0:
        return 1.0
    return float(v.max() / v.mean())
