"""The paged KV cache: fixed-size blocks of K and V per layer, addressed through block tables.

Block ids come from the shared `BlockManager`; this module only owns the memory and the
index arithmetic that turns (block table, position) into a physical slot.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from sim.cost.presets import ModelSpec
from sim.errors import InputError


@dataclass
class PagedKVCache:
    """All layers' K and V in one tensor [num_layers, 2, num_blocks, block_size, num_kv_heads, head_dim].

    One allocation keeps the cache contiguous and makes its size one number to reason about;
    `layer(i)` returns views, so kernels see plain [num_blocks, block_size, heads, dim] tensors.
    """

    data: torch.Tensor
    block_size: int

    @classmethod
    def allocate(cls, spec: ModelSpec, num_blocks: int, block_size: int,
                 dtype: torch.dtype, device: torch.device | str) -> PagedKVCache:
        if num_blocks < 1:
            raise InputError(f"num_gpu_blocks: need at least 1 KV block, got {num_blocks}")
        if block_size < 1:
            raise InputError(f"block_size: must be positive, got {block_size}")
        shape = (spec.num_layers, 2, num_blocks, block_size, spec.num_kv_heads, spec.head_dim)
        # Zeros, not empty: slots past a sequence's end are read (then masked) by the kernels,
        # and uninitialised memory may hold NaN bit patterns that survive a 0-weight multiply.
        return cls(torch.zeros(shape, dtype=dtype, device=device), block_size)

    @property
    def num_blocks(self) -> int:
        return self.data.shape[2]

    @property
    def num_layers(self) -> int:
        return self.data.shape[0]

    def layer(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.data[index, 0], self.data[index, 1]


def bytes_per_block(spec: ModelSpec, block_size: int, dtype: torch.dtype) -> int:
    elem = torch.empty((), dtype=dtype).element_size()
    return 2 * spec.num_layers * block_size * spec.num_kv_heads * spec.head_dim * elem


def num_blocks_for_memory(spec: ModelSpec, block_size: int, dtype: torch.dtype,
                          gpu_memory_utilization: float, activation_reserve_bytes: int,
                          mem_info: Callable[[], tuple[int, int]] | None = None) -> int:
    """KV blocks that fit in `total × gpu_memory_utilization` after what is already in use.

    Call after the weights are loaded: they are part of `total - free` (as in vLLM, the
    utilisation is a cap on this process's share of the whole device). The activation reserve
    covers the forward's temporaries at the largest step the scheduler may build.
    """
    if not 0.0 < gpu_memory_utilization <= 1.0:
        raise InputError(f"gpu_memory_utilization: must be in (0, 1], got {gpu_memory_utilization}")
    if mem_info is None:
        if not torch.cuda.is_available():
            raise InputError("num_gpu_blocks_override: required without a GPU (no free memory to size from)")
        mem_info = torch.cuda.mem_get_info
    free, total = mem_info()
    budget = total * gpu_memory_utilization - (total - free) - activation_reserve_bytes
    blocks = int(budget // bytes_per_block(spec, block_size, dtype))
    if blocks < 1:
        raise InputError(
            f"gpu_memory_utilization: {gpu_memory_utilization} leaves no room for KV blocks "
            f"(free {free / 2**30:.1f} GiB of {total / 2**30:.1f} GiB)"
        )
    return blocks


def slot_mapping(block_table: Sequence[int], start: int, count: int, block_size: int) -> list[int]:
    """Physical cache slots of positions [start, start + count) of one sequence."""
    return [block_table[p // block_size] * block_size + p % block_size for p in range(start, start + count)]


def padded_block_tables(block_tables: Sequence[Sequence[int]], width: int | None = None,
                        rows: int | None = None, device: torch.device | str = "cpu") -> torch.Tensor:
    """int32 [rows, width] block tables; padding is block 0, never read past a context length."""
    width = max((len(t) for t in block_tables), default=0) if width is None else width
    rows = len(block_tables) if rows is None else rows
    out = torch.zeros((rows, max(width, 1)), dtype=torch.int32)
    for i, table in enumerate(block_tables):
        if len(table) > width:
            raise ValueError(f"block table of {len(table)} blocks exceeds width {width}")
        out[i, : len(table)] = torch.tensor(table, dtype=torch.int32)
    return out.to(device)
