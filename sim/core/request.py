"""A request and its lifecycle, as the clock-free scheduler sees it.

Token accounting follows vLLM v1: a request's token sequence is its prompt followed by the
tokens generated so far; ``num_computed_tokens`` counts the positions whose KV is in the cache.
A step schedules ``num_tokens - num_computed_tokens`` new positions (a prefill chunk, or 1 for
decode); when a step brings ``num_computed_tokens`` up to ``num_tokens`` the model samples one
more token. Recompute preemption resets ``num_computed_tokens`` to 0, so prompt and generated
tokens are prefilled again.
"""

from __future__ import annotations

from enum import StrEnum


class RequestState(StrEnum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"
    SWAPPED = "swapped"
    FINISHED = "finished"
    REJECTED = "rejected"
    CANCELLED = "cancelled"
    TIMED_OUT = "timed_out"
    FAILED = "failed"


TERMINAL_STATES = frozenset(
    {RequestState.FINISHED, RequestState.REJECTED, RequestState.CANCELLED,
     RequestState.TIMED_OUT, RequestState.FAILED}
)


class Request:
    """One request attempt. ``__slots__`` because a day-long simulation holds many at once."""

    __slots__ = (
        "req_id", "arrival", "prompt_len", "max_tokens", "tenant", "cls", "priority",
        "ttft_slo", "deadline", "hash_ids", "session", "attempt", "client_id",
        "state", "reason", "num_computed_tokens", "num_output_tokens", "block_table",
        "first_scheduled", "first_token_time", "last_token_time", "finish_time",
        "token_times", "itl_max", "num_preemptions", "held", "num_cached_tokens",
        "computed_tokens_total", "reserved_tokens", "replica", "extra", "gpu_ns",
    )

    def __init__(
        self,
        req_id: int,
        arrival: float,
        prompt_len: int,
        max_tokens: int,
        *,
        tenant: str = "default",
        cls: str = "default",
        priority: int = 0,
        ttft_slo: float | None = None,
        deadline: float | None = None,
        hash_ids: tuple[int, ...] | None = None,
        session: str | None = None,
        attempt: int = 1,
        client_id: int | None = None,
        record_token_times: bool = False,
    ) -> None:
        self.req_id = req_id
        self.arrival = arrival
        self.prompt_len = prompt_len
        self.max_tokens = max_tokens
        self.tenant = tenant
        self.cls = cls
        self.priority = priority
        self.ttft_slo = ttft_slo
        self.deadline = deadline
        self.hash_ids = hash_ids
        self.session = session
        self.attempt = attempt
        self.client_id = req_id if client_id is None else client_id
        self.state = RequestState.WAITING
        self.reason = ""
        self.num_computed_tokens = 0
        self.num_output_tokens = 0
        self.block_table: list[int] = []
        self.first_scheduled: float | None = None
        self.first_token_time: float | None = None
        self.last_token_time: float | None = None
        self.finish_time: float | None = None
        self.token_times: list[float] | None = [] if record_token_times else None
        self.itl_max = 0.0
        self.num_preemptions = 0
        # Static batching keeps a finished member in its batch (as padding) until the batch ends.
        self.held = False
        self.num_cached_tokens = 0
        # Every position the engine ran through the model for this request, recomputes included;
        # the difference from the useful tokens is the work preemption and cancellation wasted.
        self.computed_tokens_total = 0
        # Step time attributed to this request in proportion to its share of each step's tokens,
        # in integer nanoseconds so that the sum does not depend on how steps are grouped.
        self.gpu_ns = 0
        self.reserved_tokens = 0
        self.replica = 0
        self.extra: dict | None = None

    # -- token accounting -------------------------------------------------------------
    @property
    def num_tokens(self) -> int:
        return self.prompt_len + self.num_output_tokens

    @property
    def remaining_tokens(self) -> int:
        """Positions still to run through the model before the next token is sampled."""
        return self.prompt_len + self.num_output_tokens - self.num_computed_tokens

    @property
    def is_prefill(self) -> bool:
        return self.num_computed_tokens < self.num_tokens - 1 or self.num_output_tokens == 0

    @property
    def is_terminal(self) -> bool:
        return self.state in TERMINAL_STATES

    def record_token(self, now: float) -> float:
        """Stamp a new token; returns the inter-token gap, or -1.0 for the first token."""
        gap = -1.0
        if self.first_token_time is None:
            self.first_token_time = now
        else:
            gap = now - self.last_token_time
            if gap > self.itl_max:
                self.itl_max = gap
        self.last_token_time = now
        if self.token_times is not None:
            self.token_times.append(now)
        return gap

    def finish(self, state: RequestState, now: float, reason: str = "") -> None:
        assert state in TERMINAL_STATES, state
        assert not self.is_terminal, (self.req_id, self.state, state)
        self.state = state
        self.reason = reason
        self.finish_time = now

    def __repr__(self) -> str:
        return (
            f"Request({self.req_id}, t={self.arrival:.3f}, prompt={self.prompt_len}, "
            f"max_tokens={self.max_tokens}, {self.state.value}, out={self.num_output_tokens})"
        )
