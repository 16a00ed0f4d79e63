"""Shared helpers for the GPU-backend tests: a minimal paged greedy loop over the model.

It stands in for the runner in the model-level tests: packed steps mixing prefill chunks and
decodes, blocks handed out in a shuffled order so pages of a sequence are never adjacent.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:  # torch is optional: the simulator's suite runs without it
    import torch

    from gpu_backend.model import LlamaModel


def paged_greedy(model: LlamaModel, prompts: Sequence[Sequence[int]], max_new: int, block_size: int = 4,
                 chunk: int | None = None, num_blocks: int = 256,
                 seed: int = 0) -> tuple[list[list[int]], list[list[torch.Tensor]]]:
    """Greedy tokens and the logits they came from, per prompt, all prompts batched per step."""
    import torch

    from gpu_backend.kv_cache import PagedKVCache
    from gpu_backend.metadata import SequenceChunk, build_metadata

    cache = PagedKVCache.allocate(model.spec, num_blocks, block_size, model.dtype, model.device)
    pool = list(range(num_blocks))
    random.Random(seed).shuffle(pool)
    seqs = [list(p) for p in prompts]
    computed = [0] * len(prompts)
    tables: list[list[int]] = [[] for _ in prompts]
    tokens: list[list[int]] = [[] for _ in prompts]
    logits: list[list[torch.Tensor]] = [[] for _ in prompts]
    while any(len(t) < max_new for t in tokens):
        active = [i for i in range(len(prompts)) if len(tokens[i]) < max_new]
        chunks, ids = [], []
        for i in active:
            n_new = len(seqs[i]) - computed[i]
            n_new = min(n_new, chunk) if chunk else n_new
            while len(tables[i]) * block_size < computed[i] + n_new:
                tables[i].append(pool.pop())
            chunks.append(SequenceChunk(computed[i], n_new, list(tables[i])))
            ids.extend(seqs[i][computed[i]: computed[i] + n_new])
        positions, meta = build_metadata(chunks, block_size, model.device)
        out = model(torch.tensor(ids, device=model.device), positions, cache, meta)
        for row, i in enumerate(active):
            computed[i] += chunks[row].num_new
            if computed[i] == len(seqs[i]):  # the whole sequence is cached: sample the next token
                tok = int(out[row].argmax())
                seqs[i].append(tok)
                tokens[i].append(tok)
                logits[i].append(out[row].cpu())
    return tokens, logits


@pytest.fixture
def greedy() -> Callable[..., tuple[list[list[int]], list[list[torch.Tensor]]]]:
    return paged_greedy
