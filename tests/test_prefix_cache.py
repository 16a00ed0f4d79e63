"""Prefix caching: hash-chained full blocks, sharing, LRU eviction, cached tokens skip prefill."""

import json
import os
from pathlib import Path

import pytest

from sim.config import validate
from sim.core.policies import make_policy
from sim.core.prefix_cache import PrefixCachingBlockManager, chained_block_hashes
from sim.core.request import Request, RequestState
from sim.core.scheduler import Scheduler, SchedulerConfig
from sim.engine import simulate
from tests.policy_workloads import drive


def req(i, prompt, ids, out=4, arrival=0.0):
    return Request(i, arrival, prompt, out, hash_ids=tuple(ids))


def test_hashes_are_chained_and_follow_the_trace_blocks():
    a = chained_block_hashes((1, 2, 3), 1536, 16, 512)
    assert len(a) == 96
    b = chained_block_hashes((1, 9, 3), 1536, 16, 512)
    assert a[:32] == b[:32] and all(x != y for x, y in zip(a[32:], b[32:], strict=True))
    # a later id equal but an earlier one different: nothing after the difference matches
    c = chained_block_hashes((7, 2, 3), 1536, 16, 512)
    assert not set(a) & set(c)
    # partial last trace block: only full engine blocks are hashed
    assert len(chained_block_hashes((1, 2), 600, 16, 512)) == 600 // 16
    # an engine block size that straddles trace blocks still chains
    d = chained_block_hashes((1, 2, 3), 1536, 48, 512)
    e = chained_block_hashes((1, 2, 4), 1536, 48, 512)
    assert len(d) == 32 and d[:21] == e[:21] and d[21] != e[21]


def computed(bm, r, tokens):
    assert bm.allocate(r, tokens)
    r.num_computed_tokens = tokens
    bm.cache_blocks(r)


def test_reuse_refcounts_and_the_last_token_is_recomputed():
    bm = PrefixCachingBlockManager(64, 16, hash_block_tokens=16)
    a = req(0, 64, [1, 2, 3, 4])
    computed(bm, a, 64)
    assert bm.num_cached_blocks == 4
    b = req(1, 64, [1, 2, 3, 4])  # the same prompt: all but the last block may be reused
    assert bm.match_prefix(b) == 48
    c = req(2, 80, [1, 2, 9, 9, 9])
    assert bm.match_prefix(c) == 32
    assert bm.allocate_cached(b, 64, 48)
    assert b.block_table[:3] == a.block_table[:3] and b.block_table[3] != a.block_table[3]
    assert [bm.ref_count[x] for x in a.block_table] == [2, 2, 2, 1]
    bm.free(a)
    assert [bm.ref_count[x] for x in b.block_table[:3]] == [1, 1, 1]
    assert bm.num_free == 64 - 4  # a's last block is cached but evictable, so it counts as free
    bm.free(b)
    assert bm.num_free == 64 and bm.num_used == 0
    bm.check()


def test_lru_eviction_of_unreferenced_cached_blocks():
    bm = PrefixCachingBlockManager(8, 16, hash_block_tokens=16)
    old = req(0, 64, [1, 2, 3, 4])
    computed(bm, old, 64)
    bm.free(old)
    new = req(1, 64, [5, 6, 7, 8])
    computed(bm, new, 64)
    bm.free(new)
    assert bm.num_free == 8 and bm.num_cached_blocks == 8
    # one more block: the least recently freed goes first (old's tail, as vLLM frees tails first)
    filler = Request(2, 0.0, 16, 1)
    assert bm.allocate(filler, 16)
    assert bm.evictions == 1
    assert bm.match_prefix(req(3, 65, [1, 2, 3, 4, 0])) == 48
    assert bm.match_prefix(req(4, 65, [5, 6, 7, 8, 0])) == 64
    # a match revives evictable blocks: they are not free while referenced
    again = req(5, 65, [5, 6, 7, 8, 0])
    assert bm.allocate_cached(again, 65, 64)
    assert bm.num_free == 8 - 1 - 5
    bm.check()


def test_scheduler_skips_cached_tokens():
    cfg = SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=4096, max_model_len=4096)
    bm = PrefixCachingBlockManager(400, 16)
    sched = Scheduler(cfg, bm, make_policy("continuous"))
    first = req(0, 1500, [1, 2, 3], out=3)
    second = req(1, 1500, [1, 2, 4], out=3, arrival=1.0)
    done = drive(sched, [first, second])
    assert [r.state for r in done] == [RequestState.FINISHED] * 2
    assert first.num_cached_tokens == 0 and second.num_cached_tokens == 1024
    assert second.computed_tokens_total == first.computed_tokens_total - 1024
    assert sched.prefix_hit_tokens == 1024 and sched.prefix_query_tokens == 3000
    assert bm.num_free == 400
    bm.check()


def test_no_hash_ids_no_sharing_and_caching_off_is_the_plain_manager():
    from sim.build import build_scheduler
    from sim.core.blocks import BlockManager

    sc = validate({"workload": {"num_requests": 1}}, "t")
    assert type(build_scheduler(sc).blocks) is BlockManager
    bm = PrefixCachingBlockManager(16, 16)
    a = Request(0, 0.0, 64, 1)
    computed(bm, a, 64)
    assert bm.num_cached_blocks == 0 and bm.match_prefix(Request(1, 0.0, 64, 1)) == 0


def _trace_prefix_reuse(path: Path, end_ms: float, max_prompt: int) -> tuple[float, float]:
    """Share of block references repeating an earlier id (the traces README's reuse figure),
    and share of prompt tokens whose 512-token block chain appeared in an earlier request."""
    seen, hit, total, refs, repeats = set(), 0, 0, 0, 0
    with path.open() as fh:
        for line in fh:
            row = json.loads(line)
            if row["timestamp"] >= end_ms:
                break
            n = min(row["input_length"], max_prompt)
            ids = row["hash_ids"][: -(-n // 512)]
            refs += len(ids)
            repeats += sum(1 for h in ids if h in seen)
            k = 0
            while k < len(ids) and ids[k] in seen:
                k += 1
            hit += min(k * 512, n - 1) // 16 * 16
            total += n
            seen.update(ids)
    return repeats / refs, hit / total


def _mooncake():
    path = Path(os.environ.get("CBSIM_TRACE_PATH", "")) / "mooncake_conversation.jsonl"
    if not path.is_file():
        pytest.skip("mooncake_conversation.jsonl not on CBSIM_TRACE_PATH")
    return path


def test_mooncake_hit_rate_matches_the_trace_reuse_and_lowers_ttft():
    path = _mooncake()

    def run(caching: bool, blocks: int):
        sc = validate({
            "model": "llama3-8b", "hardware": "h200",
            "engine": {"enable_prefix_caching": caching, "num_gpu_blocks_override": blocks,
                       "max_model_len": 40_000, "max_num_seqs": 64},
            "workload": {"trace": {"path": "mooncake_conversation", "window_s": [0, 400],
                                   "speedup": 0.5, "max_prompt_len": 32_000}},
        }, "t")
        return simulate(sc).summary

    block_reuse, expected = _trace_prefix_reuse(path, 400_000, 32_000)
    unlimited = run(True, 1_000_000)
    assert unlimited["prefix_cache_evictions"] == 0
    # (on the whole trace, unclipped: 37.4% against the README's 36.6% block reuse)
    assert abs(unlimited["prefix_cache_hit_rate"] - expected) < 0.01
    assert abs(unlimited["prefix_cache_hit_rate"] - block_reuse) < 0.02
    off = run(False, 1_000_000)
    assert off["prefix_cache_hit_rate"] == 0.0
    assert unlimited["mean_ttft_ms"] < 0.7 * off["mean_ttft_ms"]
    # a cache of ~5M tokens evicts, so it hits less (an H200's ~1M tokens for Llama-3-8B: ~7%)
    small = run(True, 300_000)
    assert small["prefix_cache_evictions"] > 0
    assert 0.3 * expected < small["prefix_cache_hit_rate"] < unlimited["prefix_cache_hit_rate"]
