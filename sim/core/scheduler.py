"""The clock-free scheduler: vLLM v1's token-budget loop with pluggable policies.

``schedule(now)`` returns the next StepPlan; a backend runs it (simulated or on a GPU) and calls
``complete(plan, now)`` when it is done. ``now`` is whatever clock the caller keeps: this module
imports neither SimPy nor torch (a test enforces it), so one policy runs in both worlds.
"""

from __future__ import annotations

from dataclasses import dataclass

from sim.core.admission import PARKED, AdmissionController
from sim.core.blocks import BlockManager, blocks_for
from sim.core.plan import StepPlan
from sim.core.policies import Policy
from sim.core.request import Request, RequestState
from sim.core.swap import SwapSpace


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
    def __init__(self, config: SchedulerConfig, blocks: BlockManager, policy: Policy,
                 swap: SwapSpace | None = None) -> None:
        self.config = config
        self.blocks = blocks
        self.policy = policy
        self.running: list[Request] = []
        self.num_preemptions = 0
        # Host swap space when preemption_mode is swap (sim.core.swap); None recomputes.
        self.swap = swap if config.preemption_mode == "swap" else None
        self.num_recompute_preemptions = 0
        # Prefix caching (sim.core.prefix_cache): prompt tokens looked up and found cached at
        # each request's first admission.
        self._caching = getattr(blocks, "caches_prefixes", False)
        self.prefix_query_tokens = 0
        self.prefix_hit_tokens = 0
        self._plan: StepPlan | None = None
        # Requests whose state changed to terminal inside schedule()/complete(); the engine
        # drains this to record them (static batches finish many members at once).
        self.finished: list[Request] = []
        # Inter-token gaps of the tokens sampled by complete(), drained by the engine (ITL).
        self.itl_gaps: list[float] = []
        # Front-door limits and background pausing (sim.core.admission); None admits everyone.
        self.admission: AdmissionController | None = None

    # -- intake ---------------------------------------------------------------------------
    @property
    def max_request_tokens(self) -> int:
        """The longest prompt + max_tokens a request may have; ``add_request`` rejects longer
        ones at once (over max_model_len, or more blocks than the whole cache)."""
        return min(self.config.max_model_len, self.blocks.num_blocks * self.blocks.block_size)

    def add_request(self, req: Request, now: float) -> bool:
        """Queue ``req``; reject it at once if it can never run. Returns False when rejected."""
        total = req.prompt_len + req.max_tokens
        if total > self.max_request_tokens:
            if total > self.config.max_model_len:
                reason = (f"prompt_len + max_tokens = {total} exceeds max_model_len = "
                          f"{self.config.max_model_len}")
            else:
                reason = (f"needs {blocks_for(total, self.blocks.block_size)} KV blocks, the "
                          f"cache has {self.blocks.num_blocks}")
            self._terminate(req, RequestState.REJECTED, now, reason)
            return False
        req.state = RequestState.WAITING
        if self.admission is not None:
            verdict = self.admission.check(self, req, now)
            if verdict is PARKED:
                return True
            if verdict is not None:
                self._terminate(req, RequestState.REJECTED, now, verdict)
                return False
        self.policy.enqueue(req, now)
        return True

    @property
    def num_waiting(self) -> int:
        return len(self.policy)

    @property
    def num_queued(self) -> int:
        """Waiting requests, including background ones parked by admission control."""
        adm = self.admission
        return len(self.policy) + (len(adm.parked) if adm is not None else 0)

    @property
    def has_work(self) -> bool:
        return bool(self.running) or len(self.policy) > 0 or (
            self.admission is not None and bool(self.admission.parked))

    def abort(self, req: Request, state: RequestState, now: float, reason: str) -> bool:
        """End a waiting or running request now (cancelled, timed out); its blocks are freed."""
        if req.is_terminal:
            return False
        if req.state == RequestState.RUNNING:
            self.running.remove(req)
        elif not self.policy.remove(req) and self.admission is not None:
            self.admission.unpark(req)
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
        if self.admission is not None:
            self.admission.before_step(self, now)
        self._plan = plan
        policy.form_batch(self, now)
        # Preemptions a policy made in form_batch (priority) do not hold back admission.
        early_preempted = len(plan.preempted)
        caps = policy.caps_tokens

        running = self.running
        entries = plan.entries
        block_size = blocks.block_size
        notify = policy.uses_on_scheduled
        i = 0
        while i < len(running) and budget > 0:
            req = running[i]
            if req.held:
                plan.add(req, 1, padding=True)
                budget -= 1
                i += 1
                continue
            computed = req.num_computed_tokens
            n = req.prompt_len + req.num_output_tokens - computed
            if n == 1 and req.num_output_tokens and len(req.block_table) * block_size > computed:
                # The common case, a decode whose last block has room: no allocation, no
                # preemption check, so take it without the general path's calls.
                entries.append((req, 1))
                plan.decode_seqs += 1
                plan.decode_ctx_sum += computed + 1
                if notify:
                    policy.on_scheduled(req, 1, now)
                budget -= 1
                i += 1
                continue
            if n > 1:
                if threshold and n > threshold:
                    n = threshold
                if n > budget:
                    if not chunked:
                        i += 1
                        continue
                    n = budget
                if caps:
                    n = policy.cap_tokens(req, n)
                    if n <= 0:
                        i += 1
                        continue
            total = req.num_computed_tokens + n
            # allocate() takes nothing when the blocks are not there; then preempt and retry.
            scheduled = blocks.allocate(req, total)
            while not scheduled and policy.preempts:
                victim = policy.pick_victim(running[i:])
                self._preempt(victim, now, plan)
                if victim is req:
                    break
                scheduled = blocks.allocate(req, total)
            if not scheduled:
                if req.state == RequestState.RUNNING:
                    i += 1
                continue
            if req.num_preemptions:
                self._note_recompute(req, req.num_computed_tokens, n, plan)
            plan.add(req, n)
            if notify:
                policy.on_scheduled(req, n, now)
            budget -= n
            i += 1

        # As in vLLM v1, nobody new is admitted in a step that had to preempt.
        if policy.admits_continuously and len(plan.preempted) == early_preempted and len(policy):
            self._admit_waiting(plan, budget, now)
        return plan

    def _admit_waiting(self, plan: StepPlan, budget: int, now: float) -> None:
        cfg = self.config
        policy = self.policy
        blocks = self.blocks
        running = self.running
        caching = self._caching
        while budget > 0 and len(running) < cfg.max_num_seqs:
            req = policy.peek(now)
            if req is None or not policy.may_admit(self, req, now):
                break
            # Prefix caching: the cached part of the prompt is not computed again.
            cached = blocks.match_prefix(req) if caching and not req.num_computed_tokens else 0
            start = req.num_computed_tokens + cached
            n = self.admission_chunk(req, start, budget)
            if n <= 0:
                break
            reserve = max(policy.reserve_tokens(req, n), start + n)
            ok = (blocks.allocate_cached(req, reserve, cached) if cached
                  else blocks.allocate(req, reserve))
            if not ok:
                break  # head-of-line: the first waiting request blocks the rest, as in vLLM
            policy.pop(req)
            if req.state == RequestState.SWAPPED:
                plan.swap_in_blocks += self.swap.swap_in(req)
            if cached:
                req.num_computed_tokens = cached
            if req.num_preemptions:
                self._note_recompute(req, start, n, plan)
            self._begin(req, cached, now)
            plan.add(req, n)
            policy.on_scheduled(req, n, now)
            budget -= n

    def admission_chunk(self, req: Request, start: int, budget: int) -> int:
        """Positions a waiting ``req`` would run from ``start`` if admitted now with ``budget``
        tokens left; 0 when it cannot start this step."""
        cfg = self.config
        n = req.num_tokens - start
        if n > budget and not cfg.enable_chunked_prefill:
            return 0
        if cfg.long_prefill_token_threshold and n > cfg.long_prefill_token_threshold:
            n = cfg.long_prefill_token_threshold
        n = min(n, budget)
        if self.policy.caps_tokens and n > 1:
            n = self.policy.cap_tokens(req, n)
        return n

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
        caching = self._caching
        itl_gaps = self.itl_gaps
        any_done = False
        for req, n in plan.entries:
            if req.state != RequestState.RUNNING or req.held:
                continue  # aborted while the step ran, or static-batch padding
            req.num_computed_tokens += n
            req.computed_tokens_total += n
            if caching:
                self.blocks.cache_blocks(req)
            if req.num_computed_tokens >= req.prompt_len + req.num_output_tokens:
                req.num_output_tokens += 1
                last = req.last_token_time
                if last is None:
                    req.record_token(now)
                else:  # Request.record_token inlined: this runs for every token of a run
                    gap = now - last
                    itl_gaps.append(gap)
                    if gap > req.itl_max:
                        req.itl_max = gap
                    req.last_token_time = now
                    if req.token_times is not None:
                        req.token_times.append(now)
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

    def admit_arrival(self, req: Request, reserve: int, now: float) -> None:
        """Admit a request that has just arrived straight into the batch at ``now``, holding KV
        for ``reserve`` positions: what ``_admit_waiting`` does for the head of an otherwise
        empty FIFO queue. The simulator's fast path calls it after checking, as that loop
        would, that the prompt fits this step's budget and the blocks are free."""
        if not self.blocks.allocate(req, reserve):
            raise RuntimeError(f"request {req.req_id}: {reserve} positions of KV are not free")
        self._begin(req, 0, now)

    # -- transitions ----------------------------------------------------------------------
    def _begin(self, req: Request, cached: int, now: float) -> None:
        """An admitted request starts running; its first admission counts prefix-cache hits."""
        if req.first_scheduled is None:
            self.prefix_query_tokens += req.prompt_len
            self.prefix_hit_tokens += cached
            req.num_cached_tokens = cached
        self._start(req, now)

    def _start(self, req: Request, now: float) -> None:
        req.state = RequestState.RUNNING
        if req.first_scheduled is None:
            req.first_scheduled = now
        self.running.append(req)

    def preempt(self, victim: Request, now: float) -> None:
        """Preempt a running request from a policy's ``form_batch`` (priority preemption)."""
        self._preempt(victim, now, self._plan)

    def _preempt(self, victim: Request, now: float, plan: StepPlan) -> None:
        self.running.remove(victim)
        held = len(victim.block_table)
        if self.swap is not None and self.swap.swap_out(victim, held):
            # Swap: the KV goes to host memory; the request keeps its computed positions.
            plan.swap_out_blocks += held
            self.blocks.free(victim)
            victim.state = RequestState.SWAPPED
        else:
            self.blocks.free(victim)
            if victim.num_computed_tokens:
                # Remember how far it had got: positions below this mark are recomputed work.
                extra = victim.extra
                if extra is None:
                    extra = victim.extra = {}
                if victim.num_computed_tokens > extra.get("recompute_to", 0):
                    extra["recompute_to"] = victim.num_computed_tokens
            victim.num_computed_tokens = 0
            victim.state = RequestState.PREEMPTED
            self.num_recompute_preemptions += 1
        victim.num_preemptions += 1
        self.num_preemptions += 1
        plan.preempted.append(victim)
        self.policy.requeue_preempted(victim, now)

    @staticmethod
    def _note_recompute(req: Request, start: int, n: int, plan: StepPlan) -> None:
        """Count the positions of this chunk that a recompute preemption had computed before."""
        mark = req.extra.get("recompute_to", 0) if req.extra is not None else 0
        if mark > start:
            plan.recompute_tokens += min(mark, start + n) - start

    def _terminate(self, req: Request, state: RequestState, now: float, reason: str) -> None:
        self.blocks.free(req)
        if self.swap is not None and req.state == RequestState.SWAPPED:
            self.swap.release(req)
        req.held = False
        req.finish(state, now, reason)
        self.policy.on_finished(req, now)
        if self.admission is not None:
            self.admission.on_finished(req)
        self.finished.append(req)
