"""The wall-clock engine: the simulator's own engine with its clock following the wall clock.

`GpuEngine` is a `sim.engine.Simulation` whose replica loop runs each StepPlan on the real
model instead of sleeping for a cost-model time. Everything else is the simulator's: the
arrival process, client timers (patience, disconnects, retries), admission, the shared
Scheduler and its policies, and the bookkeeping that turns requests into records and a
summary. SimPy's clock is advanced to the wall clock before every decision and after every
step, so arrivals and timers that fall inside a step fire at their own times, exactly as in
a simulation; only step durations differ (measured, not modelled).
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from gpu_backend.runner import ModelRunner
from sim.config import CostModelConfig, Scenario
from sim.core.plan import StepPlan
from sim.core.request import Request, RequestState
from sim.engine import Replica, SimResult, Simulation, batch_kinds
from sim.errors import InputError
from sim.workload.table import RequestTable

TokenCallback = Callable[[Request, int, float], None]


@dataclass
class ReplayResult(SimResult):
    tokens: dict[int, list[int]] = field(default_factory=dict)  # req_id -> generated ids
    device_step_s: list[float] = field(default_factory=list)  # runner-measured, one per step


class GpuEngine(Simulation):
    def __init__(self, scenario: Scenario, table: RequestTable, runner: ModelRunner, *,
                 on_token: TokenCallback | None = None, clock: Callable[[], float] = time.perf_counter,
                 sleep: Callable[[float], None] = time.sleep, idle_poll_s: float = 0.005) -> None:
        cache = runner.kv_cache
        if scenario.engine.block_size != cache.block_size:
            raise InputError(f"engine.block_size: {scenario.engine.block_size} differs from the KV cache's "
                             f"{cache.block_size}")
        # One device is one replica. The scheduler gets the cache's real block count, and the
        # cost model is never consulted (steps are measured), so any model/hardware pair works.
        scenario = scenario.model_copy(update={
            "engine": scenario.engine.model_copy(update={"num_gpu_blocks_override": cache.num_blocks}),
            "cost_model": CostModelConfig(kind="roofline"),
        })
        super().__init__(scenario, table, num_replicas=1)
        self.runner = runner
        self.on_token = on_token
        self.clock = clock
        self.sleep = sleep
        # Longest idle sleep, so a cancel() from another thread is seen promptly.
        self.idle_poll_s = idle_poll_s
        self.tokens: dict[int, list[int]] = {}
        self.device_step_s: list[float] = []
        self._live: dict[int, Request] = {}
        self._cancels: deque[int] = deque()
        self._t0 = 0.0

    # -- hooks into the simulator ---------------------------------------------------------
    def admit_new(self, req: Request) -> None:
        self._live[req.req_id] = req
        super().admit_new(req)

    def collect(self, rep: Replica) -> None:
        for req in rep.scheduler.finished:
            self._forget(req)
        super().collect(rep)

    def _forget(self, req: Request) -> None:
        self.tokens[req.req_id] = list(self.runner.output_ids(req))
        self.runner.release(req)
        self._live.pop(req.req_id, None)

    # -- control --------------------------------------------------------------------------
    def cancel(self, req_id: int) -> None:
        """Cancel a request at the next loop turn (safe to call from another thread or a
        token callback); its KV blocks are freed then."""
        self._cancels.append(req_id)

    def _wall(self) -> float:
        return self.clock() - self._t0

    def _advance(self, t: float) -> None:
        """Fire arrivals and client timers due by `t`; SimPy's clock then reads `t`."""
        horizon = self.sc.simulation.horizon_s
        if horizon is not None:
            t = min(t, horizon)
        env = self.env
        if t > env.now:
            env.run(until=t)
        # SimPy leaves its stop event queued at `now` after run(until=...); process it (and any
        # event due now) so peek() shows the next real arrival or timer.
        while env.peek() <= env.now:
            env.step()

    # -- the loop -------------------------------------------------------------------------
    def run(self) -> ReplayResult:
        env = self.env
        rep = self.replicas[0]
        sched = rep.scheduler
        horizon = self.sc.simulation.horizon_s
        env.process(self.arrivals())
        self._t0 = self.clock()
        while True:
            self._advance(self._wall())
            while self._cancels:
                req = self._live.get(self._cancels.popleft())
                if req is not None:
                    self.abort(req, RequestState.CANCELLED, "cancelled")
            if horizon is not None and env.now >= horizon:
                break
            # Swap preemption frees a victim's blocks inside schedule(); keep its table to copy from.
            tables = {r: list(r.block_table) for r in sched.running} if sched.swap is not None else None
            plan = sched.schedule(env.now) if sched.has_work else None
            if plan is None or plan.is_empty:
                self.collect(rep)
                upcoming = env.peek()
                if math.isinf(upcoming) and not self._cancels:
                    break  # no arrival or timer left to change anything
                self.sleep(max(0.0, min(upcoming - self._wall(), self.idle_poll_s)))
                continue
            self._step(rep, plan, tables)
        return self._finish(rep)

    def _step(self, rep: Replica, plan: StepPlan, tables: dict[Request, list[int]] | None) -> None:
        env, sched, runner = self.env, rep.scheduler, self.runner
        start = env.now
        usage = sched.blocks.usage
        kinds = batch_kinds(plan) if self.steps is not None else None
        swap_s = 0.0
        if tables is not None:
            for victim in plan.preempted:
                if victim.state == RequestState.SWAPPED:
                    swap_s += runner.swap_out(victim, tables[victim])
        rep.plan = plan  # a request aborted during the step has this step's work counted
        out = runner.execute(plan)
        now = self._wall()
        horizon = self.sc.simulation.horizon_s
        if horizon is not None:
            now = min(now, horizon)
        dt = now - start
        moved = plan.swap_in_blocks or plan.swap_out_blocks
        self.charge_step(rep, plan, start, dt, swap_s + out.swap_in_s if moved else 0.0, kinds)
        self._advance(now)
        rep.plan = None
        sched.complete(plan, env.now)
        for req, tok in runner.accept(out):
            if self.on_token is not None:
                self.on_token(req, tok, env.now)
        self.device_step_s.append(out.elapsed_s)
        self.account_step(rep, plan, start, dt, usage)

    def _finish(self, rep: Replica) -> ReplayResult:
        """As `Simulation.run` ends: unfinished requests are recorded with reason "horizon"."""
        end = self.env.now
        for req in self.record_unfinished(rep):
            self._forget(req)
        return ReplayResult(self.sc, self.records, self.summary(end), self.ts, self.steps,
                            rep.scheduler.blocks.num_blocks, self.tokens, self.device_step_s)
