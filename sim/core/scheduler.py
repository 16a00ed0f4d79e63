"""The clock-free scheduler: vLLM v1's token-budget loop with pluggable policies.

``schedule(now)`` returns the next StepPlan; a backend runs it (simulated or on a GPU) and calls
``complete(plan, now)`` when it is done. ``now`` is whatever clock the caller keeps: this module
imports neither SimPy nor torch (a test enforces it), so one policy runs in both worlds.
"""

from __future__ import annotations

from dataclasses import dataclass

from sim.core.blocks import BlockManager, blocks_for
from sim.core.plan import StepPlan
from sim.core.policies import Policy
from sim.core.request import Request, RequestState


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    enable_chunked_prefill: bool = True
    # A prefill chunk never exceeds this many tokens when > 0 (vLLM's
    # long_prefill_token_threshold), so long prompts cannot hog a step.
    long_prefill_token_threshold: int = 0
    max_model_len: int = 8192
    preemption_mode: str = "recompute"


class Scheduler:
    def __init__(self, config: SchedulerConfig, blocks: BlockManager, policy: Policy) -> None:
        self.config = config
        self.blocks = blocks
        self.policy = policy
        self.running: list[Request] = []
        self.num_preemptions = 0
        # Requests whose state changed to terminal inside schedule()/complete(); the engine
        # drains this to record them (static batches finish many members at once).
        self.finished: list[Request] = []
        # Inter-token gaps of the tokens sampled by complete(), drained by the engine (ITL).
        self.itl_gaps: list[float] = []

    # -- intake ---------------------------------------------------------------------------
    def add_request(self, req: Request, now: float) -> bool:
        """Queue ``req``; reject it at once if it can never run. Returns False when rejected."""
        total = req.prompt_len + req.max_tokens
        if total > self.config.max_model_len:
            self._terminate(req, RequestState.REJECTED, now,
                            f"prompt_len + max_tokens = {total} exceeds max_model_len = "
                            f"{self.config.max_model_len}")
            return False
        need = blocks_for(total, self.blocks.block_size)
        if need > self.blocks.num_blocks:
            self._terminate(req, RequestState.REJECTED, now,
                            f"needs {need} KV blocks, the cache has {self.blocks.num_blocks}")
            return False
        req.state = RequestState.WAITING
        self.policy.enqueue(req, now)
        return True

    @property
    def num_waiting(self) -> int:
        return len(self.policy)

    @property
    def has_work(self) -> bool:
        return bool(self.running) or len(self.policy) > 0

    def abort(self, req: Request, state: RequestState, now: float, reason: str) -> bool:
        """End a waiting or running request now (cancelled, timed out); its blocks are freed."""
        if req.is_terminal:
            return False
        if req.state == RequestState.RUNNING:
            self.running.remove(req)
        else:
            self.policy.remove(req)
        self._terminate(req, state, now, reason)
        return True

    # -- the step -------------------------------------------------------------------------
    def schedule(self, now: float) -> StepPlan:
        cfg = self.config
        policy = self.policy
        blocks = self.blocks
        plan = StepPlan()
        budget = cfg.max_num_batched_tokens
        chunked = cfg.enable_chunked_prefill
        threshold = cfg.long_prefill_token_threshold
        policy.form_batch(self, now)

        running = self.running
        i = 0
        while i < len(running) and budget > 0:
            req = running[i]
            if req.held:
                plan.add(req, 1, padding=True)
                budget -= 1
                i += 1
                continue
            n = req.num_tokens - req.num_computed_tokens
            if n > 1:
                if threshold and n > threshold:
                    n = threshold
                if n > budget:
                    if not chunked:
                        i += 1
                        continue
                    n = budget
            total = req.num_computed_tokens + n
            scheduled = True
            while not blocks.can_allocate(req, total):
                if not policy.preempts:
                    scheduled = False
                    break
                victim = policy.pick_victim(running[i:])
                self._preempt(victim, now, plan)
                if victim is req:
                    scheduled = False
                    break
            if not scheduled:
                if req.state == RequestState.RUNNING:
                    i += 1
                continue
            blocks.allocate(req, total)
            plan.add(req, n)
            policy.on_scheduled(req, n, now)
            budget -= n
            i += 1

        # As in vLLM v1, nobody new is admitted in a step that had to preempt.
        if policy.admits_continuously and not plan.preempted:
            self._admit_waiting(plan, budget, now)
        return plan

    def _admit_waiting(self, plan: StepPlan, budget: int, now: float) -> None:
        cfg = self.config
        policy = self.policy
        blocks = self.blocks
        running = self.running
        while budget > 0 and len(running) < cfg.max_num_seqs:
            req = policy.peek(now)
            if req is None or not policy.may_admit(self, req, now):
                break
            n = req.num_tokens - req.num_computed_tokens
            if n > budget and not cfg.enable_chunked_prefill:
                break
            if cfg.long_prefill_token_threshold and n > cfg.long_prefill_token_threshold:
                n = cfg.long_prefill_token_threshold
            n = min(n, budget)
            reserve = policy.reserve_tokens(req, n)
            if not blocks.allocate(req, max(reserve, req.num_computed_tokens + n)):
                break  # head-of-line: the first waiting request blocks the rest, as in vLLM
            policy.pop(req)
            self._start(req, now)
            plan.add(req, n)
            policy.on_scheduled(req, n, now)
            budget -= n

    def admit_batch(self, reqs: list[Request], now: float) -> None:
        """Move ``reqs`` (already reserved by the caller) into the running batch."""
        for req in reqs:
            self.policy.pop(req)
            self._start(req, now)

    def complete(self, plan: StepPlan, now: float) -> None:
        """Apply a finished step: advance computed positions, sample tokens, finish requests.

        Requests that reached a terminal state wait in ``finished`` for ``drain_finished()``.
        """
        hold = self.policy.holds_finished
        any_done = False
        for req, n in plan.entries:
            if req.state != RequestState.RUNNING or req.held:
                continue  # aborted while the step ran, or static-batch padding
            req.num_computed_tokens += n
            req.computed_tokens_total += n
            if req.num_computed_tokens >= req.prompt_len + req.num_output_tokens:
                req.num_output_tokens += 1
                gap = req.record_token(now)
                if gap >= 0.0:
                    self.itl_gaps.append(gap)
                if req.num_output_tokens >= req.max_tokens:
                    if hold:
                        req.held = True
                    else:
                        self._terminate(req, RequestState.FINISHED, now, "length")
                        any_done = True
        if hold and self.running and all(r.held for r in self.running):
            for req in self.running:
                self._terminate(req, RequestState.FINISHED, now, "length")
            any_done = True
        if any_done:
            self.running = [r for r in self.running if r.state == RequestState.RUNNING]

    def drain_finished(self) -> list[Request]:
        done, self.finished = self.finished, []
        return done

    # -- transitions ----------------------------------------------------------------------
    def _start(self, req: Request, now: float) -> None:
        req.state = RequestState.RUNNING
        if req.first_scheduled is None:
            req.first_scheduled = now
        self.running.append(req)

    def _preempt(self, victim: Request, now: float, plan: StepPlan) -> None:
        self.running.remove(victim)
        self.blocks.free(victim)
        victim.num_computed_tokens = 0
        victim.num_preemptions += 1
        victim.state = RequestState.PREEMPTED
        self.num_preemptions += 1
        plan.preempted.append(victim)
        self.policy.requeue_preempted(victim, now)

    def _terminate(self, req: Request, state: RequestState, now: float, reason: str) -> None:
        self.blocks.free(req)
        req.held = False
        req.finish(state, now, reason)
        self.policy.on_finished(req, now)
        self.finished.append(req)
