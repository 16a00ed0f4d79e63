"""Runs of engine steps in closed form: the simulator's fast path.

Most engine steps in a busy server are alike: every running request decodes one token, and now
and then a new arrival's prompt joins the batch. Simulating each step through the scheduler
costs O(batch) Python per step; a run of them here costs O(steps + requests in it), and each
request's tokens, ITL and GPU time are read off per-step arrays (prefix sums, slices) when the
run is applied. The result is identical to stepping (``simulation.exact_steps: true``), bit for
bit on per-request records, because each step's time comes from the same cost-model call on
the same integer features and the clock advances by the same float additions SimPy would make.

A run starts from a plan ``schedule()`` made: decodes, plus fresh prompts that finish their
prefill in it (they decode from the next step on). It is taken only when:
  * nobody waiting could be admitted during it: the queue is empty, or the batch is full, or
    the queue head cannot get blocks (they only get scarcer), and the policy's order does not
    change with time. Requests may finish inside a run only when the queue is empty, since a
    finish frees a slot and blocks (clients react only to refusals and timeouts, never to a
    finish);
  * every block a step allocates is free then (counted step by step, frees included), so no
    step could preempt;
  * it ends strictly before the next event in the SimPy queue (an arrival, a client timer, the
    horizon, another replica's step), so nothing can observe the state mid-run.
When the engine says arrivals are *benign* (they only join the waiting queue and read nothing
a step changes: one replica, no admission control or client timers, a policy whose enqueue is
state-free, no request that add_request would refuse) it passes ``barrier``, the first event
that is not an arrival, and the feed of arrivals; the run may then go past arrivals:
  * with a policy that admits first come, first served at every step (``continuous``,
    ``orca``) and an empty queue, the run admits each arrival itself at the first step that
    starts at or after its event, as ``_admit_waiting`` would: its whole prompt within the
    step's token budget, a free slot, its blocks free. It ends before a step whose arrivals
    would not all get in, and leaves them to the arrival process and the scheduler;
  * otherwise its last step may be the one during which the next arrival comes: stepping, too,
    only sees the newcomer at that step's end, where the run ends.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from heapq import heappush
from itertools import accumulate
from operator import sub

import numpy as np
from simpy.core import NORMAL
from simpy.events import Event

from sim.core.blocks import blocks_for
from sim.core.plan import StepPlan
from sim.core.policies import Policy
from sim.core.request import Request, RequestState
from sim.core.scheduler import Scheduler
from sim.feed import ArrivalFeed

MIN_RUN = 2  # a run of one step is just a step
# Longest run: its per-step lists are the fast path's only memory that grows with a run, so
# a day-long busy stretch is cut into pieces of bounded size (a cut changes no result).
MAX_RUN = 1 << 16
# Hooks whose base versions make admission plain first come, first served.
_FIFO_HOOKS = ("enqueue", "peek", "pop", "may_admit", "form_batch", "on_scheduled", "cap_tokens")


@dataclass(slots=True)
class FastRun:
    # Every request that runs in it: those running at its start (in running order), then the
    # arrivals it admitted (in admission order).
    members: list[Request]
    join: list[int]  # the step a member's part starts at (0 for those running at the start)
    offset: list[int]  # a member decoding in step j has offset + j positions before it
    steps_of: list[int]  # steps each member takes part in (it finishes after its last one)
    finish_order: list[int]  # members that finish, in the order stepping records them
    joined: list[Request]  # the arrivals it admitted, in order (members from num_initial on)
    reserve: list[int]  # positions of KV each of those reserves when admitted
    durations: list[float]  # step times
    ends: list[float]  # the clock after each step
    batch: list[int]  # requests in each step
    decoders: list[int]  # of which decoding (the rest run their whole prompt)
    tokens: list[int]  # positions run in each step
    usage_during: list[int]  # blocks in use during each step (after its allocations)
    usage_after: list[int]  # blocks in use after each step completes (after its frees)
    running_after: list[int]  # requests still running after each step completes
    queued_before: int  # requests queued when the run starts
    num_initial: int  # members running at its start

    @property
    def steps(self) -> int:
        return len(self.durations)


def admits_in_arrival_order(policy: Policy) -> bool:
    """True when the policy admits waiting requests first come, first served at every step,
    with no gate, cap or hook of its own: what a run admitting arrivals itself reproduces."""
    cls = type(policy)
    return (policy.admits_continuously and not policy.holds_finished and not policy.caps_tokens
            and all(getattr(cls, hook) is getattr(Policy, hook) for hook in _FIFO_HOOKS))


def _admission_frozen(sched: Scheduler, batch: int) -> bool:
    """True when no waiting request can be admitted at any step of a pure decode run."""
    if sched.num_waiting == 0:
        return True
    cfg = sched.config
    if batch >= cfg.max_num_seqs or cfg.max_num_batched_tokens - batch <= 0:
        return True
    if not sched.policy.fixed_order:
        return False
    if getattr(sched.blocks, "caches_prefixes", False):
        return False  # the head's cached prefix lowers its need: not provably blocked
    head = sched.policy.peek(0.0)
    if head is None:
        return True
    n = sched.admission_chunk(head, head.num_computed_tokens, cfg.max_num_batched_tokens - batch)
    if n <= 0:
        return True
    reserve = max(sched.policy.reserve_tokens(head, n), head.num_computed_tokens + n)
    # Blocks only get scarcer during the run (nobody finishes), so a head that cannot fit now
    # never will.
    return not sched.blocks.can_allocate(head, reserve)


def _fresh_prefills_complete(plan: StepPlan) -> bool:
    """True when every prefill in ``plan`` is a never-run request's prompt finishing this step
    (it samples its first token at the step's end and decodes from then on)."""
    for r, n in plan.entries:
        if r.num_output_tokens == 0 and (r.num_computed_tokens + n != r.prompt_len
                                         or r.last_token_time is not None):
            return False
    return True


def _add_member(m: int, last: int, held: int, offset: int, block_size: int,
                finish_at: dict[int, list[int]], crossings: dict[int, int]) -> None:
    """Note member ``m``'s finish after step ``last`` and the steps its decodes take a block."""
    fin = finish_at.get(last)
    if fin is None:
        finish_at[last] = [m]
    else:
        fin.append(m)
    # Decoding in step j it needs offset + j + 1 positions: a new block once they pass what
    # it holds, then every block_size steps.
    for j in range(held * block_size - offset, last + 1, block_size):
        crossings[j] = crossings.get(j, 0) + 1


def plan_run(sched: Scheduler, plan: StepPlan, cost, now: float, next_event: float,
             barrier: float | None = None, feed: ArrivalFeed | None = None) -> FastRun | None:
    """The longest safe run starting with ``plan`` (already scheduled at ``now``), or None.

    ``next_event`` is the SimPy queue's next event; ``barrier`` (default: the same) the first
    one that is not a benign arrival, and ``feed`` the arrivals when they are benign. Every
    step ends before ``barrier``; a run that admits no arrivals has only its last step end at
    or after ``next_event``. Arrivals the run admits are taken from ``feed`` here, so that the
    arrival process skips them; ``apply_run`` admits them."""
    if plan.padding_seqs or plan.preempted or plan.swap_in_blocks or plan.swap_out_blocks \
            or plan.recompute_tokens or not sched.policy.supports_decode_runs:
        return None
    if barrier is None:
        barrier = next_event
    policy = sched.policy
    prefills = plan.prefill_seqs
    batch = plan.decode_seqs + prefills
    joins = (feed is not None and feed.cursor < feed.total and sched.num_waiting == 0
             and admits_in_arrival_order(policy))
    # Cheap exits before any O(batch) work (returning None is always safe): the first step
    # must end before the next event it may not pass and, for a decode step without joins,
    # two before the barrier (decode steps only grow while the batch is constant).
    dt = cost.step_time(plan)
    if now + dt >= (barrier if joins else next_event):
        return None
    if not joins and not prefills and now + 2.0 * dt >= barrier:
        return None
    if batch != len(sched.running) or not _admission_frozen(sched, batch):
        return None
    if getattr(sched, "_caching", False):
        return None  # prefix-cache LRU order depends on when each block fills
    admission = getattr(sched, "admission", None)
    if admission is not None and getattr(admission, "parked", None):
        return None  # parked background requests may be resumed by time-based rules
    if prefills and not _fresh_prefills_complete(plan):
        return None

    members = [r for r, _ in plan.entries]  # running order
    steps_of = [r.max_tokens - r.num_output_tokens for r in members]
    if sched.num_waiting:
        max_steps = min(steps_of) - 1  # stop before anyone finishes: a finish changes admission
        if max_steps < MIN_RUN:
            return None
        max_steps = min(max_steps, MAX_RUN)
    else:
        max_steps = MAX_RUN  # everyone may finish; the run ends when nobody is left
    # A decode has c positions before step 0, so c + j before step j; a prompt finishing in
    # step 0 has prompt_len - 1 + j from step 1 on. Decoding in step j, a member attends
    # offset + j + 1 keys.
    offset = [r.num_computed_tokens if r.num_output_tokens else r.prompt_len - 1 for r in members]
    join = [0] * len(members)
    blocks = sched.blocks
    bs = blocks.block_size
    # Step-indexed events: who finishes after step j (in running order), and how many blocks
    # step j's decodes take.
    finish_at: dict[int, list[int]] = {}
    crossings: dict[int, int] = {}
    held = [len(r.block_table) for r in members]  # blocks each member holds as it joins
    for m in range(len(members)):
        _add_member(m, steps_of[m] - 1, held[m], offset[m], bs, finish_at, crossings)
    finish_order: list[int] = []
    joined: list[Request] = []
    reserves: list[int] = []

    cfg = sched.config
    num_blocks = blocks.num_blocks
    used = blocks.num_used
    decode_time = getattr(cost, "decode_time", None)
    alive = batch  # members running after the current step's finishes
    ctx_base = sum(offset)  # the offsets of the members that decode in the next step
    n_dec = plan.decode_seqs  # the current step's decodes, and its prompts
    n_new = prefills
    step_tokens = plan.num_tokens
    staged: list[tuple[Request, int, int]] = []  # arrivals admitted in the current step
    durations: list[float] = []
    ends: list[float] = []
    sizes: list[int] = []
    decoders: list[int] = []
    tokens: list[int] = []
    usage_during: list[int] = []
    usage_after: list[int] = []
    running_after: list[int] = []
    next_arrival = math.inf  # when the next arrival not admitted fires (joins only)
    if joins:
        taken = feed.cursor  # that arrival's index, and when the one before it fired
        taken_time = feed.last_time
        next_arrival = feed.time_after(taken_time, taken)
        staged_upto, staged_time, staged_next = taken, taken_time, next_arrival
    # Without joins an arrival during a step makes it the last one (it may not pass it).
    last_before = math.inf if joins else next_event
    # Bound methods, once: this loop runs for every simulated step.
    add_duration, add_end, add_size = durations.append, ends.append, sizes.append
    add_decoders, add_tokens = decoders.append, tokens.append
    add_during, add_after, add_running = usage_during.append, usage_after.append, running_after.append
    pop_finishes, pop_crossings = finish_at.pop, crossings.pop
    max_seqs = cfg.max_num_seqs
    max_tokens = cfg.max_num_batched_tokens
    if decode_time is None:
        def decode_time(n_dec: int, ctx: int) -> float:
            return cost.step_time(StepPlan(decode_seqs=n_dec, decode_ctx_sum=ctx))
    stopped = False
    t = now
    j = 0
    while True:
        if not n_new:
            # Quiet steps: the same members decode, nobody finishes after the step and no
            # arrival is due by its end; only blocks are taken. The loop below does the rest.
            quiet_end = min(barrier, last_before, next_arrival)
            q0 = len(ends)
            while True:
                end = t + dt
                if end >= quiet_end or j in finish_at or j + 1 >= max_steps:
                    break
                add_duration(dt)
                add_end(end)
                add_during(used)
                t = end
                j += 1
                cross = pop_crossings(j, 0)
                if cross:
                    if cross > num_blocks - used:
                        stopped = True  # a decode would preempt: the scheduler decides
                        break
                    used += cross
                dt = decode_time(alive, ctx_base + alive * (j + 1))
            quiet = len(ends) - q0
            if quiet:
                same = [alive] * quiet
                sizes.extend(same)
                decoders.extend(same)
                tokens.extend(same)
                running_after.extend(same)
                usage_after.extend(usage_during[q0:])
            if stopped:
                break
        end = t + dt
        if end >= barrier:
            break
        last_step = end >= last_before
        add_duration(dt)
        add_end(end)
        add_size(n_dec + n_new)
        add_decoders(n_dec)
        add_tokens(step_tokens)
        add_during(used)
        t = end
        if staged:  # this step runs their prompts: they are members from now on
            for req, reserve, need in staged:
                m = len(members)
                off = req.prompt_len - 1 - j
                members.append(req)
                offset.append(off)
                join.append(j)
                steps_of.append(req.max_tokens)
                held.append(need)
                _add_member(m, j + req.max_tokens - 1, need, off, bs, finish_at, crossings)
                ctx_base += off
                joined.append(req)
                reserves.append(reserve)
            alive += len(staged)
            staged = []
            taken, taken_time, next_arrival = staged_upto, staged_time, staged_next
        fin = pop_finishes(j, None)
        if fin is not None:
            for m in fin:  # finishes at the end of step j: its blocks go back
                alive -= 1
                off = offset[m]
                ctx_base -= off
                need = blocks_for(off + j + 1, bs)  # the blocks its positions fill
                used -= need if need > held[m] else held[m]
            finish_order.extend(fin)
        add_after(used)
        add_running(alive)
        j += 1
        if last_step or j >= max_steps:
            break

        # Step j, as schedule() would build it: the decodes first (their new blocks), then
        # whoever arrived by its start, in order, while each fits.
        cross = pop_crossings(j, 0)
        if cross > num_blocks - used or alive > max_tokens:
            break  # a decode would preempt or wait: the scheduler decides that step
        used += cross
        n_dec = alive
        ctx = ctx_base + alive * (j + 1)
        if next_arrival <= end:
            budget = max_tokens - alive
            room = max_seqs - alive
            # This step's plan, as schedule() would build it: its decodes' aggregates, and
            # each admitted prompt added the scheduler's way (StepPlan.add's features).
            probe = StepPlan(decode_seqs=n_dec, decode_ctx_sum=ctx)
            i, when = taken, next_arrival
            while when <= end:
                if budget <= 0 or len(staged) >= room:
                    break
                req = feed.make_request(i)
                n = sched.admission_chunk(req, 0, budget)
                if n != req.prompt_len:
                    break  # chunked, or not this step: the scheduler decides
                reserve = policy.reserve_tokens(req, n)
                if reserve < n:
                    reserve = n
                need = blocks_for(reserve, bs)
                if need > num_blocks - used:
                    break
                used += need
                budget -= n
                probe.add(req, n)
                staged.append((req, reserve, need))
                staged_time = when
                i += 1
                when = feed.time_after(when, i) if i < feed.total else math.inf
            if when <= end:
                staged = []
                break  # someone due at step j would wait: the scheduler decides that step
            staged_upto, staged_next = i, when
        elif alive == 0:
            break  # nothing left to run: the replica idles
        n_new = len(staged)
        if staged:
            dt = cost.step_time(probe)
            step_tokens = probe.num_tokens
        else:
            dt = decode_time(n_dec, ctx)
            step_tokens = n_dec
    n = len(durations)
    if n < MIN_RUN:
        return None
    if joined:
        feed.take(taken, taken_time)
    steps_of = [s if s < n - a else n - a for s, a in zip(steps_of, join, strict=True)]
    return FastRun(members, join, offset, steps_of, finish_order, joined, reserves, durations,
                   ends, sizes, decoders, tokens, usage_during, usage_after, running_after,
                   sched.num_queued, batch)


def apply_run(sched: Scheduler, run: FastRun, itl_hist, record_tokens: bool) -> None:
    """Advance every member of ``run`` through its steps, as ``complete`` would have step by
    step: arrivals it took are admitted, finishers recorded in stepping's order."""
    ends = run.ends
    n = run.steps
    durations = run.durations
    tokens = run.tokens
    # C-level loops (map, accumulate): this runs for every step of every run.
    gaps = list(map(sub, ends[1:], ends))  # the same float subtraction as stepping does
    # GPU time each request is charged, as the stepping path does: a step's time split over
    # its positions in whole nanoseconds; prefix sums of a decode token's share.
    if n > 64:  # the same float operations, elementwise in numpy; floor is int() here (> 0)
        shares = np.floor(np.divide(durations, tokens) * 1e9 + 0.5).astype(np.int64)
        units = [0, *np.cumsum(shares).tolist()]
    else:
        units = [0, *accumulate(int(dt / size * 1e9 + 0.5)
                                for dt, size in zip(durations, tokens, strict=True))]
    blocks = sched.blocks
    bs = blocks.block_size
    members = run.members
    join = run.join
    offset = run.offset
    steps_of = run.steps_of
    n0 = run.num_initial
    finishing = bytearray(len(members))
    for m in run.finish_order:
        finishing[m] = 1
    # Finishers first (their blocks go back), in stepping's order; then the rest, in order.
    order = [*run.finish_order, *(m for m in range(len(members)) if not finishing[m])]
    first_gaps = []
    for m in order:
        r = members[m]
        a = join[m]
        s = steps_of[m]
        last = a + s - 1
        if m >= n0:
            sched.admit_arrival(r, run.reserve[m - n0], ends[a - 1])
        computed = offset[m] + last + 1
        if r.num_output_tokens:  # decoding since before the run (a == 0)
            r.gpu_ns += units[s]
            first_gap = ends[0] - r.last_token_time
            first_gaps.append(first_gap)
            top = max(gaps[:last]) if last else first_gap
            if first_gap > top:
                top = first_gap
        else:  # its prompt ran in step a, which sampled its first token
            chunk = r.prompt_len - r.num_computed_tokens
            r.gpu_ns += (int(durations[a] * chunk / tokens[a] * 1e9 + 0.5)
                         + units[a + s] - units[a + 1])
            r.first_token_time = ends[a]
            top = max(gaps[a:last]) if last > a else -math.inf
        if top > r.itl_max:
            r.itl_max = top
        r.computed_tokens_total += computed - r.num_computed_tokens
        r.num_computed_tokens = computed
        r.num_output_tokens += s
        r.last_token_time = ends[last]
        if record_tokens and r.token_times is not None:
            r.token_times.extend(ends[a:last + 1])
        if finishing[m]:
            sched._terminate(r, RequestState.FINISHED, ends[last], "length")
        elif computed > len(r.block_table) * bs:
            blocks.allocate(r, computed)
    if run.finish_order:
        sched.running = [r for r in sched.running if r.state == RequestState.RUNNING]
    itl_hist.add_many(first_gaps)
    itl_hist.add_weighted(gaps, run.decoders[1:n])
    # The first step's positions were announced by schedule(); these are the later steps'.
    sched.policy.on_decode_run(members[:n0], [s - 1 for s in steps_of[:n0]], ends[-1])


def timeout_at(env, when: float, priority: int = NORMAL):
    """A SimPy event that fires at absolute time ``when``.

    ``env.timeout(when - env.now)`` may land one ulp off (``now + (when - now)`` need not equal
    ``when`` in floating point, and under ties-to-even some targets are unreachable), and the
    step-by-step path's clock is a chain of ``now + dt`` additions we must match exactly. This
    does what ``simpy.Timeout`` does, with the absolute time (and SimPy's ``priority``).
    """
    event = Event(env)
    event._ok = True
    event._value = None
    heappush(env._queue, (when, priority, next(env._eid), event))
    return event
