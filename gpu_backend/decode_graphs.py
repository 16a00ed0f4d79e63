"""Decode steps at fixed batch sizes: padded input buffers, captured as CUDA graphs on a GPU.

A decode-only step (one new token per sequence) has the same shapes at every step of the same
batch size, so it can be captured once and replayed, removing the per-kernel launch cost that
dominates small decode batches. Batches are padded up to the next captured size: padding rows
store no KV (slot -1) and attend one key of block 0, and their logits are dropped.

Without CUDA the same padded buffers run eagerly, which is how the padding is tested on CPU.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from gpu_backend.kv_cache import PagedKVCache
from gpu_backend.metadata import AttentionMetadata
from gpu_backend.model import LlamaModel

GRAPH_BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)


def bucket_for(batch: int, sizes: Sequence[int]) -> int | None:
    """The smallest size that holds `batch` rows, or None when the batch is too large."""
    return next((s for s in sizes if s >= batch), None)


class DecodeGraphs:
    def __init__(self, model: LlamaModel, kv_cache: PagedKVCache, max_batch: int, max_model_len: int,
                 capture: bool) -> None:
        self.model = model
        self.kv_cache = kv_cache
        self.sizes = tuple(s for s in GRAPH_BATCH_SIZES if s <= max_batch) or (1,)
        n = self.sizes[-1]
        self.max_blocks = -(-max_model_len // kv_cache.block_size)
        dev = model.device
        # Fixed addresses: a captured graph reads these tensors, so steps copy into them.
        self.input_ids = torch.zeros(n, dtype=torch.int64, device=dev)
        self.positions = torch.zeros(n, dtype=torch.int64, device=dev)
        self.slot_mapping = torch.full((n,), -1, dtype=torch.int64, device=dev)
        self.context_lens = torch.ones(n, dtype=torch.int32, device=dev)
        self.block_tables = torch.zeros((n, self.max_blocks), dtype=torch.int32, device=dev)
        self.cu_seqlens_q = torch.arange(n + 1, dtype=torch.int32, device=dev)
        self.last_token_indices = torch.arange(n, dtype=torch.int64, device=dev)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.logits: dict[int, torch.Tensor] = {}
        if capture:
            self._capture_all()

    @property
    def max_batch(self) -> int:
        return self.sizes[-1]

    def _meta(self, size: int) -> AttentionMetadata:
        return AttentionMetadata(
            cu_seqlens_q=self.cu_seqlens_q[: size + 1], context_lens=self.context_lens[:size],
            block_tables=self.block_tables[:size], slot_mapping=self.slot_mapping[:size],
            last_token_indices=self.last_token_indices[:size], max_query_len=1,
            block_size=self.kv_cache.block_size,
        )

    def _forward(self, size: int) -> torch.Tensor:
        return self.model(self.input_ids[:size], self.positions[:size], self.kv_cache, self._meta(size))

    def _capture_all(self) -> None:
        # Largest first, sharing one memory pool, as vLLM does: smaller graphs reuse its blocks.
        pool = torch.cuda.graph_pool_handle()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for size in reversed(self.sizes):
                self._forward(size)  # warm-up: Triton compiles and autotunes outside capture
        torch.cuda.current_stream().wait_stream(stream)
        for size in reversed(self.sizes):
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self.logits[size] = self._forward(size)
            self.graphs[size] = graph
        torch.cuda.synchronize()

    def run(self, input_ids: Sequence[int], positions: Sequence[int], slots: Sequence[int],
            context_lens: Sequence[int], block_tables: Sequence[Sequence[int]]) -> torch.Tensor:
        """Logits [B, vocab] of a decode step of B <= max_batch sequences."""
        b = len(input_ids)
        size = bucket_for(b, self.sizes)
        assert size is not None, f"decode batch {b} exceeds the largest graph size {self.max_batch}"
        dev = self.input_ids.device
        self.input_ids[:b].copy_(torch.tensor(input_ids, dtype=torch.int64), non_blocking=True)
        self.positions[:b].copy_(torch.tensor(positions, dtype=torch.int64), non_blocking=True)
        self.slot_mapping[:b].copy_(torch.tensor(slots, dtype=torch.int64), non_blocking=True)
        self.context_lens[:b].copy_(torch.tensor(context_lens, dtype=torch.int32), non_blocking=True)
        width = max(len(t) for t in block_tables)
        tables = torch.zeros((b, width), dtype=torch.int32)
        for i, t in enumerate(block_tables):
            tables[i, : len(t)] = torch.tensor(t, dtype=torch.int32)
        self.block_tables[:b, :width].copy_(tables.to(dev, non_blocking=True))
        # Padding rows: token 0 at position 0, one key, nothing stored.
        self.input_ids[b:size].zero_()
        self.positions[b:size].zero_()
        self.slot_mapping[b:size].fill_(-1)
        self.context_lens[b:size].fill_(1)
        self.block_tables[b:size].zero_()
        if size in self.graphs:
            self.graphs[size].replay()
            return self.logits[size][:b]
        return self._forward(size)[:b]
