"""What one engine step runs: the StepPlan the scheduler hands to a backend, with its cost features."""

from __future__ import annotations

from dataclasses import dataclass, field

from sim.core.request import Request


@dataclass(slots=True)
class StepPlan:
    """Requests scheduled this step, each with the number of new positions it runs.

    The aggregates are filled in while the scheduler builds the plan, so a cost model reads them
    without walking the entries again (see ``sim.cost.features``).
    """

    entries: list[tuple[Request, int]] = field(default_factory=list)
    preempted: list[Request] = field(default_factory=list)
    prefill_tokens: int = 0  # positions run for requests still prefilling (chunks, recomputes)
    prefill_seqs: int = 0
    prefill_attn_pairs: int = 0  # sum over chunks of (query, key) pairs: n*c + n(n+1)/2
    decode_seqs: int = 0
    decode_ctx_sum: int = 0  # sum of keys attended by decode tokens (KV read)
    padding_seqs: int = 0  # static batching: finished members still riding in the batch
    swap_in_blocks: int = 0
    swap_out_blocks: int = 0
    recompute_tokens: int = 0  # positions recomputed after a recompute preemption

    @property
    def num_seqs(self) -> int:
        return len(self.entries)

    @property
    def num_tokens(self) -> int:
        return self.prefill_tokens + self.decode_seqs

    @property
    def is_empty(self) -> bool:
        return not self.entries

    def add(self, req: Request, num_new: int, *, padding: bool = False) -> None:
        self.entries.append((req, num_new))
        prior = req.num_computed_tokens
        if num_new == 1 and not req.is_prefill:
            self.decode_seqs += 1
            self.decode_ctx_sum += prior + 1
            if padding:
                self.padding_seqs += 1
        else:
            self.prefill_seqs += 1
            self.prefill_tokens += num_new
            self.prefill_attn_pairs += num_new * prior + num_new * (num_new + 1) // 2
