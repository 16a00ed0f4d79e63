"""Paged KV-cache block accounting shared by the simulator and the GPU backend.

Blocks are real ids (the GPU backend indexes its cache tensors with them), handed out from a
free list. A request owns ``ceil(tokens / block_size)`` blocks for the positions it has cached.
"""

from __future__ import annotations

from sim.core.request import Request
from sim.errors import InputError


def blocks_for(num_tokens: int, block_size: int) -> int:
    return -(-num_tokens // block_size)


def derive_num_blocks(
    *,
    memory_bytes: int,
    gpu_memory_utilization: float,
    weight_bytes: int,
    activation_reserve_bytes: int,
    kv_bytes_per_token: int,
    block_size: int,
) -> int:
    """Blocks that fit in the memory left after weights and activations, as vLLM sizes its cache."""
    budget = memory_bytes * gpu_memory_utilization - weight_bytes - activation_reserve_bytes
    num_blocks = int(budget // (kv_bytes_per_token * block_size))
    if num_blocks <= 0:
        raise InputError(
            f"engine.gpu_memory_utilization: {gpu_memory_utilization} of {memory_bytes / 1e9:.1f} GB "
            f"leaves no room for the KV cache after {weight_bytes / 1e9:.1f} GB of weights and "
            f"{activation_reserve_bytes / 1e9:.1f} GB of activations; raise it or use a smaller model"
        )
    return num_blocks


class BlockManager:
    """Free list of KV blocks; never hands out more than it has."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks <= 0 or block_size <= 0:
            raise InputError("engine.block_size and the number of KV blocks must be positive")
        self.num_blocks = num_blocks
        self.block_size = block_size
        # Pop from the end so block 0 is handed out first (deterministic, easy to read in tests).
        self._free: list[int] = list(range(num_blocks - 1, -1, -1))

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self._free)

    @property
    def usage(self) -> float:
        return self.num_used / self.num_blocks

    def blocks_needed(self, req: Request, total_tokens: int) -> int:
        """New blocks ``req`` needs so that it holds ``total_tokens`` positions."""
        need = -(-total_tokens // self.block_size) - len(req.block_table)
        return need if need > 0 else 0

    def can_allocate(self, req: Request, total_tokens: int, spare: int = 0) -> bool:
        return self.blocks_needed(req, total_tokens) + spare <= len(self._free)

    def allocate(self, req: Request, total_tokens: int) -> bool:
        table = req.block_table
        need = -(-total_tokens // self.block_size) - len(table)
        if need <= 0:
            return True
        free = self._free
        if need > len(free):
            return False
        # The same ids, in the same order, as popping them one at a time from the end.
        chunk = free[-need:]
        chunk.reverse()
        table.extend(chunk)
        del free[-need:]
        return True

    def free(self, req: Request) -> None:
        if req.block_table:
            self._free.extend(reversed(req.block_table))
            req.block_table = []

    def match_prefix(self, req: Request) -> int:
        """Tokens of ``req``'s prompt already cached; plain paged attention caches none."""
        return 0
