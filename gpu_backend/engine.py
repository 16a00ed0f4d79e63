"""The wall-clock engine: the shared Scheduler driving the real model in real time.

Same loop as the SimPy engine (`sim/engine.py`): schedule → run the step → complete, with the
same policies, admission and block accounting, but the step takes as long as the hardware
takes and `now` is the wall clock since the start of the replay. Records, step traces and the
summary are the simulator's own types, so a replay and a simulation compare column by column.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from gpu_backend.runner import ModelRunner
from sim.core.plan import StepPlan
from sim.core.request import Request, RequestState
from sim.core.scheduler import Scheduler
from sim.engine import StepTrace, TimeSeries, batch_kinds
from sim.errors import InputError
from sim.metrics import LogHistogram, summarize
from sim.records import RecordSink

TokenCallback = Callable[[Request, int, float], None]


@dataclass
class ReplayResult:
    records: RecordSink
    summary: dict
    timeseries: TimeSeries
    steps: list[StepTrace]
    num_kv_blocks: int
    tokens: dict[int, list[int]] = field(default_factory=dict)  # req_id -> generated ids
    device_step_s: list[float] = field(default_factory=list)  # runner-measured, one per step

    def frame(self):
        return self.records.to_frame()


@dataclass
class _Counters:
    busy_time: float = 0.0
    steps: int = 0
    kv_usage_integral: float = 0.0
    kv_usage_max: float = 0.0
    batch_integral: float = 0.0
    batch_max: int = 0
    padding_tokens: int = 0


class GpuEngine:
    def __init__(self, scheduler: Scheduler, runner: ModelRunner, *, on_token: TokenCallback | None = None,
                 clock: Callable[[], float] = time.perf_counter, sleep: Callable[[float], None] = time.sleep,
                 timeseries_interval_s: float = 0.5, idle_poll_s: float = 0.005) -> None:
        self.scheduler = scheduler
        self.runner = runner
        self.on_token = on_token
        self.clock = clock
        self.sleep = sleep
        self.timeseries_interval_s = timeseries_interval_s
        # Longest idle sleep, so a cancel() from another thread is seen promptly.
        self.idle_poll_s = idle_poll_s
        self._cancel_requests: deque[int] = deque()

    def cancel(self, req_id: int) -> None:
        """Cancel a submitted request at the next loop turn (safe to call from another thread)."""
        self._cancel_requests.append(req_id)

    def run(self, requests: Sequence[Request], cancel_at: Mapping[int, float] | None = None,
            horizon_s: float | None = None) -> ReplayResult:
        """Replay `requests` (arrivals in seconds from the start) until all are terminal.

        cancel_at maps req_id to the time its client goes away; the request is aborted then
        and its KV blocks freed at once. At `horizon_s` the replay stops and unfinished
        requests are recorded with reason "horizon", as in the simulator.
        """
        sched, runner = self.scheduler, self.runner
        by_id = {r.req_id: r for r in requests}
        if len(by_id) != len(requests):
            raise InputError("requests: req_id values must be unique within a replay")
        cancels = sorted((t, rid) for rid, t in (cancel_at or {}).items())
        for t, rid in cancels:
            if rid not in by_id:
                raise InputError(f"cancel_at: unknown req_id {rid}")
            if t < by_id[rid].arrival:
                raise InputError(f"cancel_at: request {rid} is cancelled at {t} before it arrives")
        pending = deque(sorted(requests, key=lambda r: r.arrival))
        cancel_queue = deque(cancels)
        submitted: set[int] = set()
        self._records = RecordSink()
        self._itl = LogHistogram()
        self._ts = TimeSeries()
        self._steps: list[StepTrace] = []
        self._device_times: list[float] = []
        self._tokens: dict[int, list[int]] = {}
        self._counters = _Counters()
        self._next_sample = 0.0
        t0 = self.clock()

        def now() -> float:
            return self.clock() - t0

        t = now()
        stop_reason = "horizon"
        while True:
            while pending and pending[0].arrival <= t:
                req = pending.popleft()
                submitted.add(req.req_id)
                sched.add_request(req, t)
            while cancel_queue and cancel_queue[0][0] <= t:
                self._abort(by_id[cancel_queue.popleft()[1]], t)
            while self._cancel_requests:
                rid = self._cancel_requests.popleft()
                if rid in submitted:
                    self._abort(by_id[rid], t)
            self._collect()
            if horizon_s is not None and t >= horizon_s:
                stop_reason = "horizon"
                break
            plan = sched.schedule(t) if sched.has_work else None
            if plan is None or plan.is_empty:
                self._collect()  # schedule() may have finished requests (static batches)
                upcoming = [x for x in (pending[0].arrival if pending else None,
                                        cancel_queue[0][0] if cancel_queue else None, horizon_s)
                            if x is not None]
                if not upcoming:
                    # All done, or work the scheduler can never run (nothing left to change it).
                    stop_reason = "stalled"
                    break
                self.sleep(max(0.0, min(min(upcoming) - t, self.idle_poll_s)))
                t = now()
                continue
            start, usage = t, sched.blocks.usage
            kinds = batch_kinds(plan)
            out = runner.execute(plan)
            t = now()
            sched.complete(plan, t)
            for req, tok in runner.accept(out):
                if self.on_token is not None:
                    self.on_token(req, tok, t)
            self._steps.append(StepTrace(0, start, t - start, kinds))
            self._device_times.append(out.elapsed_s)
            self._account(plan, start, t - start, usage)

        self._collect()
        end = t
        # Requests that never arrived are not recorded, as in the simulator.
        for req in [*sched.running, *sched.policy.waiting()]:
            req.reason = stop_reason
            self._records.add(req)
            self._tokens[req.req_id] = list(runner.output_ids(req))
            runner.release(req)
        return ReplayResult(self._records, self._summary(requests, end), self._ts, self._steps,
                            sched.blocks.num_blocks, self._tokens, self._device_times)

    # -- bookkeeping ----------------------------------------------------------------------
    def _abort(self, req: Request, t: float) -> None:
        self.scheduler.abort(req, RequestState.CANCELLED, t, "cancelled")

    def _collect(self) -> None:
        for req in self.scheduler.drain_finished():
            self._records.add(req)
            self._tokens[req.req_id] = list(self.runner.output_ids(req))
            self.runner.release(req)

    def _account(self, plan: StepPlan, start: float, dt: float, usage: float) -> None:
        c = self._counters
        c.busy_time += dt
        c.steps += 1
        c.kv_usage_integral += usage * dt
        c.kv_usage_max = max(c.kv_usage_max, usage)
        c.batch_integral += plan.num_seqs * dt
        c.batch_max = max(c.batch_max, plan.num_seqs)
        c.padding_tokens += plan.padding_seqs
        gaps = self.scheduler.itl_gaps
        for g in gaps:
            self._itl.add(g)
        gaps.clear()
        t = start + dt
        if t >= self._next_sample:
            sched = self.scheduler
            self._ts.time.append(t)
            self._ts.replica.append(0)
            self._ts.kv_usage.append(sched.blocks.usage)
            self._ts.running.append(len(sched.running))
            self._ts.waiting.append(sched.num_waiting)
            self._next_sample = (t // self.timeseries_interval_s + 1) * self.timeseries_interval_s

    def _summary(self, requests: Sequence[Request], end: float) -> dict:
        c = self._counters
        start = min((r.arrival for r in requests), default=0.0)
        span = max(end - start, 1e-12)
        stats = {
            "end_time": end,
            "num_replicas": 1,
            "num_kv_blocks": self.scheduler.blocks.num_blocks,
            "steps": c.steps,
            "gpu_busy_fraction": c.busy_time / span,
            "kv_usage_mean": c.kv_usage_integral / span,
            "kv_usage_max": c.kv_usage_max,
            "mean_running_batch": c.batch_integral / c.busy_time if c.busy_time else 0.0,
            "max_running_batch": c.batch_max,
            "padding_tokens": c.padding_tokens,
        }
        summary = summarize(self._records.columns(), itl=self._itl, run_stats=stats)
        summary.pop("end_time", None)
        return summary
