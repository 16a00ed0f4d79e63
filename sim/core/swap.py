"""Host swap space for ``preemption_mode: swap`` (vLLM v0's CPU swap).

A preempted request's KV blocks are copied to host memory over the host link (PCIe) instead
of being dropped; it keeps its computed positions and, when it is admitted again, its blocks
are copied back before it runs. The host space is finite (``engine.swap_space_gb``): a victim
whose blocks do not fit is preempted by recompute instead (vLLM v0 would abort it).

Copy time is the engine's business (``StepPlan.swap_in_blocks`` / ``swap_out_blocks`` times
``swap_seconds_per_block``); this module only keeps the books.
"""

from __future__ import annotations

from sim.core.request import Request


def swap_capacity_blocks(swap_space_gb: float, block_size: int, kv_bytes_per_token: int) -> int:
    return int(swap_space_gb * 1e9 // (block_size * kv_bytes_per_token))


def swap_seconds_per_block(block_size: int, kv_bytes_per_token: int,
                           host_link_bandwidth: float) -> float:
    return block_size * kv_bytes_per_token / host_link_bandwidth


class SwapSpace:
    """Host blocks held by swapped-out requests; never more than ``capacity_blocks``."""

    def __init__(self, capacity_blocks: int) -> None:
        self.capacity_blocks = capacity_blocks
        self.held: dict[Request, int] = {}  # swapped request -> host blocks
        self.used = 0
        self.swap_outs = 0
        self.swap_ins = 0
        self.blocks_out = 0
        self.blocks_in = 0
        self.refused = 0  # victims that did not fit and were recomputed instead

    @property
    def num_free(self) -> int:
        return self.capacity_blocks - self.used

    def swap_out(self, req: Request, num_blocks: int) -> bool:
        if num_blocks > self.capacity_blocks - self.used:
            self.refused += 1
            return False
        assert req not in self.held, req
        self.held[req] = num_blocks
        self.used += num_blocks
        self.swap_outs += 1
        self.blocks_out += num_blocks
        return True

    def swap_in(self, req: Request) -> int:
        """Release ``req``'s host blocks as they are copied back; returns how many."""
        n = self.held.pop(req)
        self.used -= n
        self.swap_ins += 1
        self.blocks_in += n
        return n

    def release(self, req: Request) -> None:
        """Drop a swapped request's host copy without copying it back (aborted)."""
        n = self.held.pop(req, 0)
        self.used -= n
