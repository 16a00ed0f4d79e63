"""Closed-form runs of decode steps: the simulator's fast path.

Most engine steps in a busy server are alike: every running request decodes one token and
nobody new arrives or is admitted. Simulating each such step through the scheduler costs
O(batch) Python per step; here a whole run of them costs O(batch + steps). The result is
identical to stepping (``simulation.exact_steps: true``), bit for bit on per-request records,
because each step's time comes from the same cost-model call on the same integer features and
the clock advances by the same float additions SimPy would make.

A run of ``n`` steps, starting from an already scheduled pure-decode plan, is taken only when:
  * nobody could be admitted during it: the queue is empty, or the batch is full, or the queue
    head cannot get blocks (they only get scarcer), and the policy's order does not change
    with time. Requests may finish inside a run only when the queue is empty, since a finish
    frees a slot and blocks (clients react only to refusals and timeouts, never to a finish);
  * the KV blocks the run allocates are free at its start, so no step could preempt;
  * it ends strictly before the next event in the SimPy queue (an arrival, a client timer, the
    horizon, another replica's step), so nothing can observe the state mid-run. One exception:
    when the engine says arrivals are *benign* (they only join the waiting queue and read
    nothing a step changes: one replica, no admission control or client timers, a policy whose
    enqueue is state-free, no request that add_request would refuse), the run's last step may
    be the one during which the next arrival comes: stepping, too, only sees the newcomer at
    that step's end, where the run ends. ``barrier`` is then the first non-arrival event.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from heapq import heappush
from itertools import accumulate
from operator import sub

from simpy.core import NORMAL
from simpy.events import Event

from sim.core.plan import StepPlan
from sim.core.request import Request, RequestState
from sim.core.scheduler import Scheduler

MIN_RUN = 2  # a run of one step is just a step


@dataclass(slots=True)
class DecodeRun:
    reqs: list[Request]  # sorted by the number of steps they take part in
    computed0: list[int]  # num_computed_tokens of each request when the run starts
    steps_of: list[int]  # steps each request takes part in (it finishes after its last one)
    durations: list[float]  # step times
    ends: list[float]  # the clock after each step
    batch: list[int]  # requests in each step
    usage_during: list[int]  # blocks in use during each step (after its allocations)
    usage_after: list[int]  # blocks in use after each step completes (after its frees)
    running_after: list[int]  # requests still running after each step completes
    queued_before: int  # requests queued when the run starts (arrivals may join in its last step)

    @property
    def steps(self) -> int:
        return len(self.durations)


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
    # Blocks only get scarcer during the run, so a head that cannot fit now never will.
    return not sched.blocks.can_allocate(head, reserve)


def plan_decode_run(sched: Scheduler, plan: StepPlan, cost, now: float, next_event: float,
                    barrier: float | None = None) -> DecodeRun | None:
    """The longest safe run starting with ``plan`` (already scheduled), or None.

    ``next_event`` is the SimPy queue's next event; ``barrier`` (default: the same) the first
    one that is not a benign arrival. Only the last step may end at or after ``next_event``,
    and every step ends before ``barrier``."""
    if plan.prefill_seqs or plan.padding_seqs or plan.preempted or plan.swap_in_blocks \
            or plan.swap_out_blocks or not sched.policy.supports_decode_runs:
        return None
    if barrier is None:
        barrier = next_event
    batch = plan.decode_seqs
    # Cheap exit before any O(batch) work: the first step must end before the next event and
    # two before the barrier (decode steps only grow while the batch is constant; returning
    # None is always safe).
    dt0 = cost.step_time(plan)
    if now + dt0 >= next_event or now + 2.0 * dt0 >= barrier:
        return None
    if batch != len(sched.running) or not _admission_frozen(sched, batch):
        return None
    if getattr(sched, "_caching", False):
        return None  # prefix-cache LRU order depends on when each block fills
    admission = getattr(sched, "admission", None)
    if admission is not None and getattr(admission, "parked", None):
        return None  # parked background requests may be resumed by time-based rules

    reqs = sorted((r for r, _ in plan.entries), key=lambda r: r.max_tokens - r.num_output_tokens)
    remaining = [r.max_tokens - r.num_output_tokens for r in reqs]
    if sched.num_waiting == 0:
        limit = remaining[-1]
    else:
        limit = remaining[0] - 1  # stop before anyone finishes: a finish changes admission
    if limit < MIN_RUN:
        return None

    # Step times from the cost model itself, on the same integer features as the stepping path.
    decode_time = getattr(cost, "decode_time", None)
    probe = StepPlan()
    active = batch
    ctx_base = plan.decode_ctx_sum - batch  # sum of computed positions of the active requests
    k = 0  # requests finished so far
    durations: list[float] = []
    ends: list[float] = []
    sizes: list[int] = []
    running_after: list[int] = []
    t = now
    for j in range(limit):
        ctx = ctx_base + active * (j + 1)
        if decode_time is not None:
            dt = decode_time(active, ctx)
        else:
            probe.decode_seqs = active
            probe.decode_ctx_sum = ctx
            dt = cost.step_time(probe)
        end = t + dt
        last = end >= next_event  # the next arrival comes during this step: it ends the run
        if last and end >= barrier:
            break
        durations.append(dt)
        ends.append(end)
        sizes.append(active)
        t = end
        while k < batch and remaining[k] == j + 1:  # finishes at the end of step j
            ctx_base -= reqs[k].num_computed_tokens
            active -= 1
            k += 1
        running_after.append(active)
        if last:
            break
    n = len(durations)
    if n < MIN_RUN:
        return None

    # Blocks: request r crosses into a new block when its positions c + j + 1 pass
    # len(table) * block_size, then every block_size steps; frees come after its last step.
    blocks = sched.blocks
    bs = blocks.block_size
    alloc = [0] * n
    freed = [0] * n
    computed0 = []
    steps_of = []
    for r, rem in zip(reqs, remaining, strict=True):
        c = r.num_computed_tokens
        computed0.append(c)
        s = rem if rem < n else n
        steps_of.append(s)
        table = len(r.block_table)
        for j in range(table * bs - c, s, bs):
            alloc[j] += 1
        if s == rem:
            freed[s - 1] += max(table, -(-(c + s) // bs))
    free = blocks.num_free
    used = blocks.num_used
    usage_during: list[int] = []
    usage_after: list[int] = []
    allocated = 0
    for j in range(n):
        allocated += alloc[j]
        if allocated > free:  # frees ignored: conservative, the stepping path takes over
            break
        used += alloc[j]
        usage_during.append(used)
        used -= freed[j]
        usage_after.append(used)
    if len(usage_during) < n:
        n = len(usage_during)
        if n < MIN_RUN:
            return None
        steps_of = [min(s, n) for s in steps_of]
        del durations[n:], ends[n:], sizes[n:], running_after[n:]
    return DecodeRun(reqs, computed0, steps_of, durations, ends, sizes, usage_during, usage_after,
                     running_after, sched.num_queued)


def apply_decode_run(sched: Scheduler, run: DecodeRun, itl_hist, record_tokens: bool) -> None:
    """Advance every request of ``run`` by its steps, as ``complete`` would have step by step."""
    ends = run.ends
    n = run.steps
    # C-level loops (map, accumulate): this runs for every step of every run.
    gaps = list(map(sub, ends[1:], ends))  # the same float subtraction as stepping does
    prefix_max = [-math.inf, *accumulate(gaps, max)]  # prefix_max[s]: largest of first s gaps
    # GPU time each request is charged, as the stepping path does: a step's time split over
    # its tokens in whole nanoseconds; prefix sums because every active request gets the same.
    charged = [0, *accumulate(int(dt / size * 1e9 + 0.5)
                              for dt, size in zip(run.durations, run.batch, strict=True))]
    blocks = sched.blocks
    first_gaps = []
    finished = False
    bs = blocks.block_size
    for r, c, s in zip(run.reqs, run.computed0, run.steps_of, strict=True):
        if c + s > len(r.block_table) * bs:
            blocks.allocate(r, c + s)
        r.num_computed_tokens = c + s
        r.computed_tokens_total += s
        r.num_output_tokens += s
        r.gpu_ns += charged[s]
        first_gap = ends[0] - r.last_token_time
        first_gaps.append(first_gap)
        top = prefix_max[s - 1]
        if first_gap > top:
            top = first_gap
        if top > r.itl_max:
            r.itl_max = top
        r.last_token_time = ends[s - 1]
        if record_tokens and r.token_times is not None:
            r.token_times.extend(ends[:s])
        if r.num_output_tokens >= r.max_tokens:
            sched._terminate(r, RequestState.FINISHED, ends[s - 1], "length")
            finished = True
    if finished:
        sched.running = [r for r in sched.running if r.state == RequestState.RUNNING]
    itl_hist.add_many(first_gaps)
    itl_hist.add_weighted(gaps, run.batch[1:n])
    sched.policy.on_decode_run(run.reqs, run.steps_of, ends[-1])


def timeout_at(env, when: float):
    """A SimPy event that fires at absolute time ``when``.

    ``env.timeout(when - env.now)`` may land one ulp off (``now + (when - now)`` need not equal
    ``when`` in floating point, and under ties-to-even some targets are unreachable), and the
    step-by-step path's clock is a chain of ``now + dt`` additions we must match exactly. This
    does what ``simpy.Timeout`` does, with the absolute time.
    """
    event = Event(env)
    event._ok = True
    event._value = None
    heappush(env._queue, (when, NORMAL, next(env._eid), event))
    return event
