"""KV cache sizing, slot mapping, block tables and attention metadata."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from gpu_backend.kv_cache import (  # noqa: E402
    PagedKVCache,
    bytes_per_block,
    num_blocks_for_memory,
    padded_block_tables,
    slot_mapping,
)
from gpu_backend.metadata import SequenceChunk, build_metadata  # noqa: E402
from sim.cost.presets import MODELS  # noqa: E402
from sim.errors import InputError  # noqa: E402

GiB = 2**30


def test_allocate_shape_and_layer_views() -> None:
    spec = MODELS["tiny"]
    cache = PagedKVCache.allocate(spec, num_blocks=10, block_size=16, dtype=torch.float32, device="cpu")
    assert cache.data.shape == (2, 2, 10, 16, 2, 16)
    assert cache.num_blocks == 10 and cache.num_layers == 2
    k, v = cache.layer(1)
    k[3, 5] = 1.0
    assert cache.data[1, 0, 3, 5].eq(1.0).all() and v.eq(0).all()
    assert cache.data.numel() * 4 == 10 * bytes_per_block(spec, 16, torch.float32)


def test_bytes_per_block_matches_preset_kv_bytes() -> None:
    spec = MODELS["llama3-8b"]
    assert bytes_per_block(spec, 16, torch.bfloat16) == 16 * spec.kv_bytes_per_token


def test_num_blocks_for_memory() -> None:
    spec = MODELS["llama3-8b"]
    per_block = bytes_per_block(spec, 16, torch.bfloat16)  # 2 MiB
    # 80 GiB device, 20 GiB in use (weights), 90% cap, 2 GiB activations -> 50 GiB of blocks.
    mem = (60 * GiB, 80 * GiB)
    blocks = num_blocks_for_memory(spec, 16, torch.bfloat16, 0.9, 2 * GiB, mem_info=lambda: mem)
    assert blocks == int((0.9 * 80 - 20 - 2) * GiB // per_block)
    with pytest.raises(InputError, match="no room"):
        num_blocks_for_memory(spec, 16, torch.bfloat16, 0.2, 0, mem_info=lambda: (60 * GiB, 80 * GiB))
    with pytest.raises(InputError, match="gpu_memory_utilization"):
        num_blocks_for_memory(spec, 16, torch.bfloat16, 1.5, 0, mem_info=lambda: (60 * GiB, 80 * GiB))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only error")
def test_num_blocks_without_gpu_asks_for_override() -> None:
    with pytest.raises(InputError, match="num_gpu_blocks_override"):
        num_blocks_for_memory(MODELS["tiny"], 16, torch.float32, 0.9, 0)


def test_slot_mapping_and_padded_tables() -> None:
    assert slot_mapping([7, 2, 9], start=2, count=5, block_size=4) == [30, 31, 8, 9, 10]
    tables = padded_block_tables([[7, 2, 9], [4]])
    assert tables.dtype == torch.int32 and tables.tolist() == [[7, 2, 9], [4, 0, 0]]
    assert padded_block_tables([[1]], width=4, rows=3).shape == (3, 4)
    with pytest.raises(ValueError):
        padded_block_tables([[1, 2, 3]], width=2)


def test_build_metadata() -> None:
    positions, meta = build_metadata(
        [SequenceChunk(0, 3, [5]), SequenceChunk(6, 1, [1, 2]), SequenceChunk(4, 2, [3, 0])], block_size=4
    )
    assert positions.tolist() == [0, 1, 2, 6, 4, 5]
    assert meta.cu_seqlens_q.tolist() == [0, 3, 4, 6]
    assert meta.context_lens.tolist() == [3, 7, 6]
    assert meta.slot_mapping.tolist() == [20, 21, 22, 10, 0, 1]
    assert meta.last_token_indices.tolist() == [2, 3, 5]
    assert meta.max_query_len == 3 and meta.num_seqs == 3
    with pytest.raises(ValueError, match="cannot hold"):
        build_metadata([SequenceChunk(3, 2, [0])], block_size=4)
