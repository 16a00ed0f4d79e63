"""Triton KV-store and paged-attention kernels agree with the torch reference.

Without a GPU the kernels run in Triton's interpreter (TRITON_INTERPRET=1, which must be set
before triton is first imported), on small shapes so the whole module takes seconds.
"""

from __future__ import annotations

import os
import random

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
try:
    import triton  # noqa: F401
except Exception as e:  # noqa: BLE001 (triton wheels raise more than ImportError on unsupported platforms)
    pytest.skip(f"triton is not importable: {e}", allow_module_level=True)

from gpu_backend.attention import TorchAttention, get_attention_backend  # noqa: E402
from gpu_backend.metadata import SequenceChunk, build_metadata  # noqa: E402
from gpu_backend.weights import build_model  # noqa: E402
from sim.cost.presets import MODELS  # noqa: E402
from sim.errors import InputError  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# (num_computed, num_new): prefill from zero, decodes, a chunk after a cached prefix, a
# one-token prompt, and a chunk long enough to span several query tiles.
MIXED = [(0, 37), (20, 1), (5, 12), (47, 1), (0, 1), (16, 150)]


def make_batch(lengths, page: int, num_kv_heads: int, head_dim: int, dtype, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    pool = list(range(64))
    random.Random(seed).shuffle(pool)
    chunks = []
    for computed, new in lengths:
        n_blocks = -(-(computed + new) // page)
        chunks.append(SequenceChunk(computed, new, [pool.pop() for _ in range(n_blocks)]))
    _, meta = build_metadata(chunks, page, DEVICE)
    shape = (64, page, num_kv_heads, head_dim)
    # The whole cache is random, so a kernel that reads a wrong page or slot gets wrong keys.
    k_cache = torch.randn(shape, generator=gen).to(DEVICE, dtype)
    v_cache = torch.randn(shape, generator=gen).to(DEVICE, dtype)
    return meta, k_cache, v_cache, gen


@pytest.mark.parametrize(
    ("num_heads", "num_kv_heads", "head_dim", "page"),
    [(4, 2, 16, 16), (14, 2, 24, 16), (8, 8, 32, 32), (8, 1, 16, 16)],
    ids=["gqa2", "gqa7-dim24", "mha-page32", "mqa"],
)
@pytest.mark.parametrize("lengths", [MIXED, [(3, 1), (40, 1), (0, 1)]], ids=["mixed", "decode-only"])
def test_paged_attention_matches_reference(num_heads, num_kv_heads, head_dim, page, lengths) -> None:
    meta, k_cache, v_cache, gen = make_batch(lengths, page, num_kv_heads, head_dim, torch.float32)
    q = torch.randn(int(meta.cu_seqlens_q[-1]), num_heads, head_dim, generator=gen).to(DEVICE)
    scale = head_dim ** -0.5
    want = TorchAttention().attend(q, k_cache, v_cache, meta, scale)
    got = get_attention_backend("triton").attend(q, k_cache, v_cache, meta, scale)
    torch.testing.assert_close(got, want, atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_paged_attention_half_precision(dtype: str) -> None:
    if dtype == "bfloat16" and os.environ.get("TRITON_INTERPRET") == "1":
        pytest.skip("Triton's interpreter multiplies bf16 tl.dot operands as raw bits (triton#11584)")
    dt = getattr(torch, dtype)
    meta, k_cache, v_cache, gen = make_batch(MIXED[:4], 16, 2, 16, dt)
    q = torch.randn(int(meta.cu_seqlens_q[-1]), 4, 16, generator=gen).to(DEVICE, dt)
    want = TorchAttention().attend(q.float(), k_cache.float(), v_cache.float(), meta, 0.25)
    got = get_attention_backend("triton").attend(q, k_cache, v_cache, meta, 0.25)
    assert got.dtype == dt
    torch.testing.assert_close(got.float(), want, atol=3e-2, rtol=3e-2)


def test_store_kv_matches_reference_and_skips_padding() -> None:
    meta, k_cache, v_cache, gen = make_batch(MIXED, 16, 2, 24, torch.float32)
    slots = meta.slot_mapping.clone()
    slots[::3] = -1  # padding tokens: must leave the cache untouched
    k = torch.randn(slots.shape[0], 2, 24, generator=gen).to(DEVICE)
    v = torch.randn(slots.shape[0], 2, 24, generator=gen).to(DEVICE)
    want_k, want_v = k_cache.clone(), v_cache.clone()
    TorchAttention().store_kv(k, v, want_k, want_v, slots)
    get_attention_backend("triton").store_kv(k, v, k_cache, v_cache, slots)
    assert torch.equal(k_cache, want_k) and torch.equal(v_cache, want_v)


def test_triton_rejects_block_size_it_cannot_tile() -> None:
    meta, k_cache, v_cache, gen = make_batch([(0, 5)], 8, 2, 16, torch.float32)
    q = torch.randn(5, 4, 16, generator=gen)
    with pytest.raises(InputError, match="block_size"):
        get_attention_backend("triton").attend(q, k_cache, v_cache, meta, 0.25)


def test_model_greedy_same_with_triton_and_torch(greedy) -> None:
    spec = MODELS["tiny"]
    prompts = [[5, 17, 99, 3, 250, 8, 41], [7], list(range(30, 53))]
    runs = {}
    for backend in ("torch", "triton"):
        model = build_model(spec, DEVICE, torch.float32, seed=1, attention=backend, init_std=0.2)
        runs[backend] = greedy(model, prompts, 6, block_size=16, chunk=9)
    assert runs["triton"][0] == runs["torch"][0]
    for got, want in zip(runs["triton"][1], runs["torch"][1], strict=True):
        torch.testing.assert_close(torch.stack(got), torch.stack(want), atol=1e-4, rtol=1e-4)


def test_engine_with_triton_and_padded_decode_matches_torch() -> None:
    from gpu_engine_helpers import request_table, tiny_scenario

    from gpu_backend.engine import GpuEngine
    from gpu_backend.kv_cache import PagedKVCache
    from gpu_backend.runner import ModelRunner

    spec = MODELS["tiny"]
    # 5 blocks of 16 for 4 requests of up to 38 positions: preemption and recompute happen.
    sc = tiny_scenario(blocks=5, budget=16, engine={"block_size": 16})
    table = request_table([(0.0, 30, 8), (0.0, 9, 6), (0.0, 21, 5), (0.0, 3, 7)])
    tokens = {}
    for backend in ("torch", "triton"):
        model = build_model(spec, DEVICE, torch.float32, seed=1, attention=backend, init_std=0.2)
        cache = PagedKVCache.allocate(spec, 5, 16, model.dtype, model.device)
        runner = ModelRunner(model, cache, pad_decode_batches=True, max_graph_batch=4)
        result = GpuEngine(sc, table, runner).run()
        assert result.summary["preemptions"] > 0 and result.summary["completed"] == 4
        tokens[backend] = result.tokens
    assert tokens["triton"] == tokens["torch"]
