"""The SimPy engine: arrivals, one process per replica, step times from the cost model.

Each replica process loops schedule → sleep(step time) → complete, and sleeps on an event
when it has nothing to do; an arrival wakes it. All scheduling decisions are the shared,
clock-free ``Scheduler``'s; this module only keeps time and records what happened.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from dataclasses import dataclass, field
from operator import mul

import numpy as np
import simpy
from simpy.core import URGENT

from sim.build import build_cost_model, build_scheduler, check_explicit_requests, swap_seconds_per_block_of
from sim.config import Scenario
from sim.core.plan import StepPlan
from sim.core.request import Request, RequestState
from sim.core.scheduler import Scheduler
from sim.fastpath import FastRun, apply_run, plan_run, timeout_at
from sim.feed import ArrivalFeed
from sim.metrics import LogHistogram, summarize
from sim.records import RecordSink
from sim.router import make_router
from sim.workload.clients import ClientBehaviour
from sim.workload.table import RequestTable


@dataclass
class StepTrace:
    """One step, kept only when ``simulation.record_steps`` is on (slot timelines)."""

    replica: int
    start: float
    duration: float
    # (req_id, new positions, kind) with kind "prefill" | "decode" | "padding"
    batch: list[tuple[int, int, str]]


@dataclass
class Replica:
    index: int
    scheduler: Scheduler
    wake: simpy.Event | None = None
    busy_time: float = 0.0
    steps: int = 0
    kv_usage_integral: float = 0.0
    kv_usage_max: float = 0.0
    batch_integral: float = 0.0
    batch_max: int = 0
    padding_tokens: int = 0
    plan: StepPlan | None = None  # the step running now (a cancellation counts its work)
    next_sample: float = 0.0
    outstanding: int = 0
    routed: int = 0
    swap_seconds: float = 0.0  # host-link copy time added to steps (swap preemption)
    recompute_seconds: float = 0.0  # step time spent recomputing preempted positions
    recompute_tokens: int = 0


@dataclass
class TimeSeries:
    time: list[float] = field(default_factory=list)
    replica: list[int] = field(default_factory=list)
    kv_usage: list[float] = field(default_factory=list)
    running: list[int] = field(default_factory=list)
    waiting: list[int] = field(default_factory=list)


@dataclass
class SimResult:
    scenario: Scenario
    records: RecordSink
    summary: dict
    timeseries: TimeSeries
    steps: list[StepTrace] | None
    num_kv_blocks: int

    def frame(self):
        return self.records.to_frame()


def batch_kinds(plan: StepPlan) -> list[tuple[int, int, str]]:
    """Each scheduled request's id, new positions and role, read before the step completes."""
    out = []
    for r, k in plan.entries:
        if r.held:
            kind = "padding"
        elif k == 1 and not r.is_prefill:
            kind = "decode"
        else:
            kind = "prefill"
        out.append((r.req_id, k, kind))
    return out


class Simulation:
    def __init__(self, scenario: Scenario, table: RequestTable, num_replicas: int | None = None,
                 progress=None) -> None:
        self.sc = scenario
        self.table = table
        self.env = simpy.Environment()
        self.cost = build_cost_model(scenario)
        if num_replicas is None:
            num_replicas = scenario.cluster.replicas
        self.replicas = [Replica(i, build_scheduler(scenario)) for i in range(num_replicas)]
        check_explicit_requests(scenario, self.replicas[0].scheduler)
        self.router = make_router(scenario.cluster.router, num_replicas, scenario.seed)
        self.records = RecordSink()
        self.itl = LogHistogram()
        self.ts = TimeSeries()
        self.steps: list[StepTrace] | None = [] if scenario.simulation.record_steps else None
        # Classes (SLOs, weights) and client behaviour: sim.workload.clients; None when unused.
        self.clients = ClientBehaviour.build(self)
        self._swap_s_per_block = swap_seconds_per_block_of(scenario)
        arrival, self.make_request = self._request_maker()
        # progress(arrived, total), every sim.feed.PROGRESS_EVERY arrivals (a progress bar).
        self.feed = ArrivalFeed(arrival, self.make_request, progress)
        # The arrival process's pending timeout, and whether arrivals are benign for the fast
        # path (sim/fastpath.py): they only join the queue, so a run may straddle or take them.
        self._arrival_wait: simpy.Event | None = None
        self._benign_arrivals = self._arrivals_only_enqueue()
        self._refused = self._refused_arrivals() if self._benign_arrivals else []

    def _arrivals_only_enqueue(self) -> bool:
        """True when an arrival reads nothing a running step changes: one replica, no
        admission control, no client timers, a state-free ``enqueue``."""
        if len(self.replicas) != 1 or self.clients is not None:
            return False
        sched = self.replicas[0].scheduler
        return sched.admission is None and not sched.policy.enqueue_reads_running

    def _refused_arrivals(self) -> list[int]:
        """Rows ``add_request`` will refuse on arrival: recording one is an event a fast-path
        run must not pass."""
        limit = self.replicas[0].scheduler.max_request_tokens
        return np.flatnonzero(self.table.prompt_len + self.table.max_tokens > limit).tolist()

    def _barrier(self) -> float:
        """When the first SimPy event that is not the next arrival fires, or a little before
        the next arrival that will be refused (inf if none)."""
        wait = self._arrival_wait
        first = min((e[0] for e in self.env._queue if e[3] is not wait), default=math.inf)
        refused = self._refused
        k = bisect_left(refused, self.feed.cursor)
        if k < len(refused):
            # Its event fires within an ulp of its table time; stopping short is always safe.
            at = self.feed.arrival[refused[k]]
            first = min(first, at - abs(at) * 1e-12)
        return first

    # -- processes ------------------------------------------------------------------------
    def arrivals(self):
        """The SimPy process that submits the table's requests at their arrival times.

        Arrivals fire with SimPy's URGENT priority: one due at the very moment a step ends is
        queued before that step's end is handled, in every path (the fast path relies on it).
        A replica's fast-path run may take arrivals from the feed itself; this process then
        wakes at a time it no longer needs and moves on to the next arrival not taken."""
        env = self.env
        feed = self.feed
        while feed.cursor < feed.total:
            when = feed.next_time()
            if when > env.now:
                self._arrival_wait = timeout_at(env, when, URGENT)
                yield self._arrival_wait
                continue
            i = feed.cursor
            feed.take(i + 1, when)
            self.admit_new(self.make_request(i))

    def _request_maker(self):
        """``make_request(i)``: the table's row ``i`` as a new Request."""
        t = self.table
        record_times = self.sc.simulation.record_token_times
        # Plain lists: indexing numpy arrays one scalar at a time is slow on a million rows.
        arrival = t.arrival.tolist()
        prompt = t.prompt_len.tolist()
        max_tokens = t.max_tokens.tolist()
        tenant = None if t.tenant is None else t.tenant.tolist()
        cls = None if t.cls is None else t.cls.tolist()
        prio = None if t.priority is None else t.priority.tolist()
        hashes = t.hash_ids
        session = t.session

        def make_request(i: int) -> Request:
            return Request(
                i, arrival[i], prompt[i], max_tokens[i],
                tenant="default" if tenant is None else str(tenant[i]),
                cls="default" if cls is None else str(cls[i]),
                priority=0 if prio is None else prio[i],
                hash_ids=None if hashes is None else hashes[i],
                session=None if session is None else session[i],
                record_token_times=record_times,
            )

        return arrival, make_request

    def admit_new(self, req: Request) -> None:
        """A new attempt arrives now: stamp its class, submit it, arm its client timers."""
        clients = self.clients
        if clients is None:
            self.submit(req)
            return
        clients.stamp(req)
        self.submit(req)
        if not req.is_terminal:
            clients.on_arrival(req)

    def abort(self, req: Request, state, reason: str) -> bool:
        """End ``req`` now (cancelled, timed out): blocks free at once, recorded at once.

        Positions of the step running now are counted as computed (the GPU is doing them)."""
        if req.is_terminal:
            return False
        rep = self.replicas[req.replica]
        if rep.plan is not None and req.state == RequestState.RUNNING:
            for r, k in rep.plan.entries:
                if r is req:
                    req.computed_tokens_total += k
                    break
        rep.scheduler.abort(req, state, self.env.now, reason)
        self.collect(rep)
        return True

    def next_event_time(self) -> float:
        """When the next SimPy event (arrival, client timer, step end) fires; inf if none."""
        return self.env.peek()

    def route(self, req: Request) -> Replica:
        if len(self.replicas) == 1:
            return self.replicas[0]
        rep = self.replicas[self.router.pick(req, self.replicas)]
        self.router.observe(req, rep.index)
        return rep

    def submit(self, req: Request) -> None:
        rep = self.route(req)
        self._count_in(rep, req)
        rep.scheduler.add_request(req, self.env.now)
        self.collect(rep)
        if rep.wake is not None and not rep.wake.triggered:
            rep.wake.succeed()

    @staticmethod
    def _count_in(rep: Replica, req: Request) -> None:
        """``req`` is routed to ``rep`` (and counts as outstanding there until recorded)."""
        req.replica = rep.index
        rep.outstanding += 1
        rep.routed += 1

    def _replica_loop(self, rep: Replica):
        env = self.env
        sched = rep.scheduler
        cost = self.cost
        blocks = sched.blocks
        sim_cfg = self.sc.simulation
        fast = not sim_cfg.exact_steps and self.steps is None
        benign = self._benign_arrivals
        feed = self.feed if benign else None
        record_tokens = sim_cfg.record_token_times
        while True:
            plan = sched.schedule(env.now) if sched.has_work else None
            if plan is None or plan.is_empty:
                self.collect(rep)
                rep.wake = env.event()
                yield rep.wake
                rep.wake = None
                continue
            if fast:
                next_event = env.peek()
                barrier = self._barrier() if benign and next_event < math.inf else next_event
                run = plan_run(sched, plan, cost, env.now, next_event, barrier, feed)
                if run is not None:
                    yield timeout_at(env, run.ends[-1])
                    for req in run.joined:  # arrivals the run took from the feed
                        self._count_in(rep, req)
                    apply_run(sched, run, self.itl, record_tokens)
                    self._account_run(rep, run)
                    self.collect(rep)
                    continue
            dt = cost.step_time(plan)
            swap_s = 0.0
            if plan.swap_in_blocks or plan.swap_out_blocks:
                swap_s = (plan.swap_in_blocks + plan.swap_out_blocks) * self._swap_s_per_block
                dt += swap_s
            start = env.now
            usage = blocks.usage
            self.charge_step(rep, plan, start, dt, swap_s)
            rep.plan = plan
            yield env.timeout(dt)
            rep.plan = None
            sched.complete(plan, env.now)
            self.account_step(rep, plan, start, dt, usage)

    # -- bookkeeping (shared with gpu_backend.engine.GpuEngine, which runs steps for real) --
    def charge_step(self, rep: Replica, plan: StepPlan, start: float, dt: float, swap_s: float = 0.0,
                    kinds: list[tuple[int, int, str]] | None = None) -> None:
        """A step of ``dt`` seconds (``swap_s`` of it host-link copies) starting at ``start``:
        swap and recompute time, the step trace, and each request's share of GPU time.

        Called before the step's requests complete, so one aborted during the step is recorded
        with this step's share. ``kinds`` is ``batch_kinds(plan)`` read before the step ran,
        for an engine that charges the step after running it."""
        if swap_s:
            rep.swap_seconds += swap_s
        if plan.recompute_tokens:
            rep.recompute_tokens += plan.recompute_tokens
            rep.recompute_seconds += dt * plan.recompute_tokens / plan.num_tokens
        if self.steps is not None:
            self.steps.append(StepTrace(rep.index, start, dt, batch_kinds(plan) if kinds is None else kinds))
        total = plan.num_tokens
        unit = int(dt / total * 1e9 + 0.5)  # a decode token's share (the fast path's too)
        for r, k in plan.entries:
            r.gpu_ns += unit if k == 1 else int(dt * k / total * 1e9 + 0.5)

    def account_step(self, rep: Replica, plan: StepPlan, start: float, dt: float, usage: float) -> None:
        """After ``Scheduler.complete(plan)``: busy time, KV usage (``usage``: before the step)
        and batch integrals, ITL gaps, a time-series sample; then collect finished requests."""
        rep.busy_time += dt
        rep.steps += 1
        rep.kv_usage_integral += usage * dt
        if usage > rep.kv_usage_max:
            rep.kv_usage_max = usage
        n = plan.num_seqs
        rep.batch_integral += n * dt
        if n > rep.batch_max:
            rep.batch_max = n
        rep.padding_tokens += plan.padding_seqs
        now = start + dt
        gaps = rep.scheduler.itl_gaps
        if gaps:
            self.itl.add_many(gaps)
            gaps.clear()
        if now >= rep.next_sample:
            sched = rep.scheduler
            self._sample(rep, now, sched.blocks.usage, len(sched.running), sched.num_queued)
        self.collect(rep)

    def _account_run(self, rep: Replica, run: FastRun) -> None:
        """The bookkeeping of ``account_step`` for every step of a fast-path run.

        Sums run in C (``sum``/``map``); they may differ from step-by-step accumulation in the
        last bits, which only the run-level aggregates (busy fraction, mean KV use) see.
        """
        num_blocks = rep.scheduler.blocks.num_blocks
        durations = run.durations
        batch = run.batch
        rep.busy_time += sum(durations)
        rep.kv_usage_integral += sum(map(mul, run.usage_during, durations)) / num_blocks
        rep.batch_integral += sum(map(mul, batch, durations))
        peak = max(run.usage_during) / num_blocks
        if peak > rep.kv_usage_max:
            rep.kv_usage_max = peak
        ends = run.ends
        last = len(ends) - 1
        j = bisect_left(ends, rep.next_sample)
        while j <= last:  # the first step end in each sampling interval, as stepping does
            # Queued at step j's end: those the run admits at step j + 1; after its last step,
            # whoever is waiting now (arrivals during that step).
            if j < last:
                queued = run.queued_before + batch[j + 1] - run.decoders[j + 1]
            else:
                queued = rep.scheduler.num_queued
            self._sample(rep, ends[j], run.usage_after[j] / num_blocks, run.running_after[j],
                         queued)
            j = bisect_left(ends, rep.next_sample, j + 1)
        rep.steps += run.steps
        top = max(batch)
        if top > rep.batch_max:
            rep.batch_max = top

    def _sample(self, rep: Replica, now: float, usage: float, running: int, waiting: int) -> None:
        """One time-series point of this replica, taken at its first step end in each interval."""
        interval = self.sc.simulation.timeseries_interval_s
        self.ts.time.append(now)
        self.ts.replica.append(rep.index)
        self.ts.kv_usage.append(usage)
        self.ts.running.append(running)
        self.ts.waiting.append(waiting)
        rep.next_sample = (now // interval + 1) * interval

    def collect(self, rep: Replica) -> None:
        """Record the replica's newly terminal requests (and tell their clients)."""
        if not rep.scheduler.finished:
            return
        done = rep.scheduler.drain_finished()
        rep.outstanding -= len(done)
        for req in done:
            self.records.add(req)
        if self.clients is not None:
            for req in done:
                self.clients.on_terminal(req)

    # -- run ------------------------------------------------------------------------------
    def run(self) -> SimResult:
        env = self.env
        env.process(self.arrivals())
        for rep in self.replicas:
            env.process(self._replica_loop(rep))
        horizon = self.sc.simulation.horizon_s
        env.run(until=horizon)
        end = env.now
        for rep in self.replicas:
            self.record_unfinished(rep)
        return SimResult(self.sc, self.records, self.summary(end), self.ts, self.steps,
                         self.replicas[0].scheduler.blocks.num_blocks)

    def record_unfinished(self, rep: Replica) -> list[Request]:
        """At the end of a run, record what is still queued, parked or running (reason
        "horizon") after what finished; returns those unfinished requests."""
        self.collect(rep)
        adm = rep.scheduler.admission
        parked = list(adm.parked) if adm is not None else []
        left = [*rep.scheduler.running, *rep.scheduler.policy.waiting(), *parked]
        for req in left:
            req.reason = "horizon"
            self.records.add(req)
        return left

    def summary(self, end: float) -> dict:
        """The run's summary metrics (``SimResult.summary``), the run having ended at ``end``."""
        busy = sum(r.busy_time for r in self.replicas)
        start = float(self.table.arrival[0]) if len(self.table) else 0.0
        span = max(end - start, 1e-12)
        n = len(self.replicas)
        stats = {
            "end_time": end,
            "num_replicas": n,
            "num_kv_blocks": self.replicas[0].scheduler.blocks.num_blocks,
            "steps": sum(r.steps for r in self.replicas),
            "gpu_busy_fraction": busy / (span * n),
            "kv_usage_mean": sum(r.kv_usage_integral for r in self.replicas) / (span * n),
            "kv_usage_max": max(r.kv_usage_max for r in self.replicas),
            "mean_running_batch": (sum(r.batch_integral for r in self.replicas) / busy) if busy else 0.0,
            "max_running_batch": max(r.batch_max for r in self.replicas),
            "padding_tokens": sum(r.padding_tokens for r in self.replicas),
        }
        cols = self.records.columns()
        summary = summarize(cols, itl=self.itl, run_stats=stats)
        summary.pop("end_time", None)
        summary.update(self._traffic_summary(cols, summary["duration"], end))
        summary.update(replica_stats(self.replicas, cols, span, self.sc.cluster.router))
        summary.update(cache_and_preemption_stats(self.replicas))
        return summary

    def _traffic_summary(self, cols: dict, duration: float, end: float) -> dict:
        """States, reasons, retries, wasted work, goodput, per class / tenant, cost (sim.metrics)."""
        from sim.cost.presets import get_hardware
        from sim.metrics import traffic_summary

        sc = self.sc
        classes = sc.workload.classes or []
        weights: dict[str, list[float]] = {}
        for c in classes:
            weights.setdefault(c.tenant or "default", []).append(c.weight)
        price = sc.cost_per_gpu_hour
        if price is None:
            price = get_hardware(sc.hardware).cost_per_hour
        extra: dict = {}
        if self.clients is not None:
            extra["retries_pending_at_end"] = self.clients.retries_pending
        adms = [r.scheduler.admission for r in self.replicas if r.scheduler.admission is not None]
        if adms:
            stats = [a.stats(end) for a in adms]
            extra["background_pauses"] = sum(s["background_pauses"] for s in stats)
            extra["background_paused_s"] = sum(s["background_paused_s"] for s in stats)
        return traffic_summary(
            cols, duration=duration, slos={c.name: c.slo for c in classes},
            weights={t: sum(w) / len(w) for t, w in weights.items()},
            num_replicas=len(self.replicas), price_per_gpu_hour=price,
            queue_len=self.ts.waiting, extra=extra)


def cache_and_preemption_stats(replicas: list[Replica]) -> dict:
    """Prefix-cache hit rate, and what preemption cost: swaps (host-link seconds) and
    recomputes (positions run again, and the share of step time they took)."""
    scheds = [r.scheduler for r in replicas]
    query = sum(s.prefix_query_tokens for s in scheds)
    swaps = [s.swap for s in scheds if s.swap is not None]
    swap_s = sum(r.swap_seconds for r in replicas)
    recompute_s = sum(r.recompute_seconds for r in replicas)
    return {
        "prefix_caching": any(s._caching for s in scheds),
        "prefix_cache_queried_tokens": query,
        "prefix_cache_hit_tokens": sum(s.prefix_hit_tokens for s in scheds),
        "prefix_cache_hit_rate": (sum(s.prefix_hit_tokens for s in scheds) / query) if query else 0.0,
        "prefix_cache_evictions": sum(getattr(s.blocks, "evictions", 0) for s in scheds),
        "preemptions_recompute": sum(s.num_recompute_preemptions for s in scheds),
        "preemptions_swap": sum(sw.swap_outs for sw in swaps),
        "swap_refused": sum(sw.refused for sw in swaps),
        "swap_out_blocks": sum(sw.blocks_out for sw in swaps),
        "swap_in_blocks": sum(sw.blocks_in for sw in swaps),
        "swap_seconds": swap_s,
        "recompute_tokens": sum(r.recompute_tokens for r in replicas),
        "recompute_seconds": recompute_s,
        "preemption_seconds": swap_s + recompute_s,
    }


def replica_stats(replicas: list[Replica], cols: dict, span: float, router: str) -> dict:
    """Per-replica load and latency, and how uneven the router left them (max / mean)."""
    import numpy as np

    from sim.router import imbalance

    per = []
    finished = cols["state"] == "finished"
    for rep in replicas:
        mine = finished & (cols["replica"] == rep.index)
        ttft = cols["ttft"][mine]
        per.append({
            "replica": rep.index,
            "routed": rep.routed,
            "completed": int(mine.sum()),
            "output_throughput": float(cols["output_tokens"][mine].sum()) / span,
            "gpu_busy_fraction": rep.busy_time / span,
            "kv_usage_mean": rep.kv_usage_integral / span,
            "mean_running_batch": rep.batch_integral / rep.busy_time if rep.busy_time else 0.0,
            "p99_ttft_ms": float(np.percentile(ttft, 99) * 1e3) if len(ttft) else None,
        })
    out = {
        "router": router,
        "imbalance_requests": imbalance(p["routed"] for p in per),
        "imbalance_busy": imbalance(p["gpu_busy_fraction"] for p in per),
    }
    if len(replicas) > 1:
        out["per_replica"] = per
    return out


def simulate(scenario: Scenario, table: RequestTable | None = None, progress=None) -> SimResult:
    from sim.workload.spec import build_workload

    if table is None:
        table = build_workload(scenario.workload, scenario.seed)
    result = Simulation(scenario, table, progress=progress).run()
    if progress is not None:
        progress(len(table), len(table))
    return result

