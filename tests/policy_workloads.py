"""Small synthetic workloads and a runner for the policy tests (each run well under a second)."""

from __future__ import annotations

import numpy as np

from sim.config import validate
from sim.engine import SimResult, Simulation
from sim.workload.table import RequestTable


def table(rows: list[tuple]) -> RequestTable:
    """Rows of (arrival, prompt_len, max_tokens[, tenant[, cls[, priority]]])."""
    rows = sorted(rows, key=lambda r: r[0])
    col = list(zip(*rows, strict=True))
    n = len(col)
    return RequestTable(
        arrival=np.array(col[0], dtype=np.float64),
        prompt_len=np.array(col[1], dtype=np.int64),
        max_tokens=np.array(col[2], dtype=np.int64),
        tenant=np.array(col[3], dtype=object) if n > 3 else None,
        cls=np.array(col[4], dtype=object) if n > 4 else None,
        priority=np.array(col[5], dtype=np.int64) if n > 5 else None,
    )


def poisson(rng: np.random.Generator, rate: float, start: float, end: float) -> np.ndarray:
    n = int((end - start) * rate * 2) + 10
    t = start + np.cumsum(rng.exponential(1.0 / rate, n))
    return t[t < end]


def poisson_rows(seed: int, rate: float, duration: float, prompt_len: int,
                 output_range: tuple[int, int]) -> list[tuple]:
    """Poisson arrivals over ``duration`` s, one prompt length, uniform output lengths in
    ``[lo, hi)``; tenant "t", class "x"."""
    rng = np.random.default_rng(seed)
    t = poisson(rng, rate, 0, duration)
    outputs = rng.integers(*output_range, len(t))
    return [(a, prompt_len, int(o), "t", "x") for a, o in zip(t, outputs, strict=True)]


def run(rows_or_table, policy: str = "continuous", engine: dict | None = None,
        horizon: float | None = None, **params) -> SimResult:
    tbl = rows_or_table if isinstance(rows_or_table, RequestTable) else table(rows_or_table)
    data = {
        "model": "llama3-8b", "hardware": "h200",
        "engine": {"max_num_seqs": 16, "max_num_batched_tokens": 2048, **(engine or {})},
        "policy": {"name": policy, **params},
        "workload": {"num_requests": 1},
    }
    if horizon is not None:
        data["simulation"] = {"horizon_s": horizon}
    return Simulation(validate(data, "test"), tbl).run()


def drive(sched, reqs, step: float = 0.01, max_steps: int = 200_000, check=None):
    """Run the clock-free scheduler with a fake clock (each step ``step`` s); ``check(sched,
    plan)`` runs after every schedule(). Returns the requests in the order they ended."""
    pending = sorted(reqs, key=lambda r: (r.arrival, r.req_id))
    now = 0.0
    done = []
    steps = 0
    while pending or sched.has_work:
        while pending and pending[0].arrival <= now:
            sched.add_request(pending.pop(0), now)
        plan = sched.schedule(now)
        if check is not None:
            check(sched, plan)
        if plan.is_empty:
            now = pending[0].arrival if pending else now + step
        else:
            now += step
            sched.complete(plan, now)
        done.extend(sched.drain_finished())
        steps += 1
        assert steps < max_steps, "scheduler made no progress"
    done.extend(sched.drain_finished())
    return done


def ttft(frame, mask=None):
    f = frame if mask is None else frame[mask]
    return f[f.state == "finished"].ttft.to_numpy()
