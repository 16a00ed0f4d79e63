"""What one packed forward needs besides the token ids: positions and attention metadata."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from gpu_backend.kv_cache import padded_block_tables, slot_mapping


@dataclass
class AttentionMetadata:
    """Where each sequence's queries sit in the packed batch and where its keys live in the cache.

    Sequence b owns packed tokens [cu_seqlens_q[b], cu_seqlens_q[b+1]); they are its last
    tokens, so query i of a chunk of length q has absolute position context_lens[b] - q + i
    and attends keys 0..that position.
    """

    cu_seqlens_q: torch.Tensor  # int32 [B + 1]
    context_lens: torch.Tensor  # int32 [B], cached + new tokens after this step
    block_tables: torch.Tensor  # int32 [B, max_blocks]
    slot_mapping: torch.Tensor  # int64 [T]; -1 = padding token, not stored
    last_token_indices: torch.Tensor  # int64 [B], the rows whose logits are sampled
    max_query_len: int
    block_size: int

    @property
    def num_seqs(self) -> int:
        return self.context_lens.shape[0]


@dataclass
class SequenceChunk:
    """One sequence's part of a step: `num_new` tokens after `num_computed` cached ones."""

    num_computed: int
    num_new: int
    block_table: Sequence[int]


def build_metadata(chunks: Sequence[SequenceChunk], block_size: int,
                   device: torch.device | str = "cpu") -> tuple[torch.Tensor, AttentionMetadata]:
    """Positions [T] and metadata for the packed tokens of `chunks`, in order."""
    positions: list[int] = []
    slots: list[int] = []
    cu = [0]
    for c in chunks:
        if c.num_new < 1:
            raise ValueError("every scheduled sequence needs at least one new token")
        if len(c.block_table) * block_size < c.num_computed + c.num_new:
            raise ValueError(f"block table of {len(c.block_table)} blocks cannot hold "
                             f"{c.num_computed + c.num_new} tokens")
        positions.extend(range(c.num_computed, c.num_computed + c.num_new))
        slots.extend(slot_mapping(c.block_table, c.num_computed, c.num_new, block_size))
        cu.append(cu[-1] + c.num_new)
    meta = AttentionMetadata(
        cu_seqlens_q=torch.tensor(cu, dtype=torch.int32, device=device),
        context_lens=torch.tensor([c.num_computed + c.num_new for c in chunks], dtype=torch.int32,
                                  device=device),
        block_tables=padded_block_tables([c.block_table for c in chunks], device=device),
        slot_mapping=torch.tensor(slots, dtype=torch.int64, device=device),
        last_token_indices=torch.tensor([x - 1 for x in cu[1:]], dtype=torch.int64, device=device),
        max_query_len=max(c.num_new for c in chunks),
        block_size=block_size,
    )
    return torch.tensor(positions, dtype=torch.int64, device=device), meta
