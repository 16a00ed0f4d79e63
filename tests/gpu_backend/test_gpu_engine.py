"""The wall-clock engine: tokens do not depend on how requests are batched, chunked, preempted
(recompute or swap) or served from the prefix cache, and nothing leaks KV blocks."""

from __future__ import annotations

import random

import pytest

torch = pytest.importorskip("torch")

from gpu_engine_helpers import BLOCK, SEED, SPEC, request_table, tiny_scenario  # noqa: E402

from gpu_backend.engine import GpuEngine  # noqa: E402
from gpu_backend.kv_cache import PagedKVCache  # noqa: E402
from gpu_backend.runner import ModelRunner, prompt_token_ids  # noqa: E402
from gpu_backend.weights import build_model  # noqa: E402
from sim.core.request import Request, RequestState  # noqa: E402


@pytest.fixture(scope="module")
def model():
    return build_model(SPEC, "cpu", torch.float32, seed=1, attention="torch", init_std=0.2)


def rows(n: int = 8, seed: int = 0, spread_s: float = 0.0) -> list[tuple[float, int, int]]:
    rng = random.Random(seed)
    return [(i * spread_s, rng.randint(1, 30), rng.randint(1, 10)) for i in range(n)]


def reference_tokens(model, table, greedy, hash_block_tokens: int = 512) -> dict[int, list[int]]:
    """Greedy tokens of each request run alone-ish (one batch, no preemption, no prefix cache)."""
    hashes = table.hash_ids or [None] * len(table)
    reqs = [Request(i, 0.0, int(table.prompt_len[i]), int(table.max_tokens[i]), hash_ids=hashes[i])
            for i in range(len(table))]
    prompts = [prompt_token_ids(r, SEED, SPEC.vocab_size, hash_block_tokens) for r in reqs]
    tokens, _ = greedy(model, prompts, max(r.max_tokens for r in reqs), block_size=BLOCK)
    # Greedy decoding is prefix-stable: a shorter max_tokens is a prefix of the longest run.
    return {r.req_id: t[: r.max_tokens] for r, t in zip(reqs, tokens, strict=True)}


def make_engine(model, sc, table, pad_decode: bool = False, on_token=None) -> GpuEngine:
    blocks = sc.engine.num_gpu_blocks_override
    cache = PagedKVCache.allocate(SPEC, blocks, BLOCK, model.dtype, model.device)
    runner = ModelRunner(model, cache, prompt_seed=SEED, pad_decode_batches=pad_decode, max_graph_batch=4,
                         prefix_block_tokens=sc.engine.prefix_block_tokens)
    return GpuEngine(sc, table, runner, on_token=on_token)


def assert_nothing_leaked(engine: GpuEngine) -> None:
    sched = engine.replicas[0].scheduler
    assert sched.blocks.num_free == sched.blocks.num_blocks
    assert not sched.running and sched.num_waiting == 0
    assert engine.runner.num_tracked == 0


CONFIGS = {
    # name: (policy, KV blocks, chunked prefill, token budget, max_num_seqs, extra engine knobs)
    "continuous": ("continuous", 512, True, 2048, 256, {}),
    "continuous-no-chunking": ("continuous", 512, False, 2048, 256, {}),
    "continuous-chunks-of-7": ("continuous", 512, True, 7, 256, {}),
    # 12 blocks of 4 = 48 positions for 8 requests of up to 40: preemption is certain.
    "recompute-tiny-cache": ("continuous", 12, True, 16, 256, {}),
    "recompute-tiny-cache-no-chunking": ("continuous", 9, False, 32, 256, {}),
    "swap-tiny-cache": ("continuous", 12, True, 16, 256,
                        {"preemption_mode": "swap", "swap_space_gb": 0.001}),
    "static": ("static", 512, True, 2048, 3, {}),
    "static-no-chunking": ("static", 512, False, 2048, 3, {}),
    "orca": ("orca", 24, True, 16, 256, {}),
}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_tokens_independent_of_batching_chunking_and_preemption(name: str, model, greedy) -> None:
    policy, blocks, chunked, budget, max_seqs, knobs = CONFIGS[name]
    sc = tiny_scenario(policy, blocks, chunked, budget, max_seqs, engine=knobs)
    # All arrive at once, so the batches (and the preemptions) do not depend on timing.
    table = request_table(rows())
    engine = make_engine(model, sc, table)
    result = engine.run()
    frame = result.frame()
    assert (frame.state == "finished").all(), frame[["req_id", "state", "reason"]]
    assert result.tokens == reference_tokens(model, table, greedy)
    assert (frame.output_tokens == frame.max_tokens).all()
    if "recompute" in name:
        assert result.summary["preemptions_recompute"] > 0
    if "swap" in name:
        assert result.summary["preemptions_swap"] > 0 and result.summary["swap_in_blocks"] > 0
    if policy == "static":
        assert result.summary["padding_tokens"] > 0  # finished members rode along as padding
    assert_nothing_leaked(engine)
    assert result.summary["steps"] == len(result.device_step_s) and all(s > 0 for s in result.device_step_s)


def test_prefix_cache_hits_reuse_real_kv(model, greedy) -> None:
    # Trace blocks of 8 tokens; requests share the chains (1, 2) and (1, 2, 3). Arrivals are
    # spaced so each earlier prompt is cached before the next arrives.
    hashes = [(1, 2, 3), (1, 2, 4), (1, 2, 3, 5), (9,), (1, 2, 3)]
    table = request_table([(0.05 * i, 8 * len(h) - 1, 6) for i, h in enumerate(hashes)], hash_ids=hashes)
    sc = tiny_scenario(engine={"enable_prefix_caching": True, "prefix_block_tokens": 8})
    engine = make_engine(model, sc, table)
    result = engine.run()
    assert result.summary["prefix_cache_hit_tokens"] > 0
    assert result.tokens == reference_tokens(model, table, greedy, hash_block_tokens=8)
    assert engine.runner.num_tracked == 0


def test_padded_decode_path_gives_the_same_tokens(model, greedy) -> None:
    table = request_table(rows(n=6))
    engine = make_engine(model, tiny_scenario(), table, pad_decode=True)
    used = []
    execute = engine.runner.execute

    def spy(plan):
        out = execute(plan)
        used.append(out.used_decode_graph)
        return out

    engine.runner.execute = spy
    result = engine.run()
    assert result.tokens == reference_tokens(model, table, greedy)
    # Batches of 6 exceed the largest padded size (4), so some decode steps go eager.
    assert any(used) and not all(used)


def test_cancel_frees_blocks_at_once(model) -> None:
    seen: list[tuple[int, int, list[int], RequestState]] = []
    victim: list[Request] = []

    def on_token(req, tok, now) -> None:
        if req.req_id == 0:
            victim[:] = [req]
        v = victim[0]
        seen.append((req.req_id, req.num_output_tokens, list(v.block_table), v.state))
        if req.req_id == 0 and req.num_output_tokens == 2:
            engine.cancel(0)

    engine = make_engine(model, tiny_scenario(blocks=64), request_table([(0.0, 10, 50), (0.0, 12, 20)]),
                         on_token=on_token)
    result = engine.run()
    frame = result.frame().set_index("req_id")
    assert frame.loc[0, "state"] == "cancelled" and frame.loc[0, "output_tokens"] == 2
    assert frame.loc[1, "state"] == "finished" and len(result.tokens[0]) == 2
    # From the step after the cancel on, request 0 holds no blocks.
    after = [s for s in seen if s[0] == 1 and s[1] >= 3]
    assert after and all(not table and state == RequestState.CANCELLED for _, _, table, state in after)
    assert_nothing_leaked(engine)


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_random_stream_with_disconnects_and_preemption_leaks_nothing(mode: str, model, greedy) -> None:
    rng = random.Random(5)
    n = 24
    table = request_table(sorted((rng.uniform(0, 0.05), rng.randint(1, 40), rng.randint(1, 12))
                                 for _ in range(n)))
    sc = tiny_scenario(blocks=14, budget=24, engine={"preemption_mode": mode, "swap_space_gb": 0.00002},
                       clients={"disconnect": {"probability": 0.35,
                                               "after_s": {"kind": "uniform", "min": 0.0, "max": 0.03}}})
    engine = make_engine(model, sc, table)
    result = engine.run()
    frame = result.frame()
    assert sorted(frame.req_id) == list(range(n))
    assert set(frame.state) <= {"finished", "cancelled"}
    assert (frame.state == "cancelled").sum() >= 1 and result.summary["preemptions"] > 0
    assert_nothing_leaked(engine)
    # Finished requests got exactly the greedy tokens; cancelled ones a prefix of them.
    want = reference_tokens(model, table, greedy)
    for rid, toks in result.tokens.items():
        assert toks == want[rid][: len(toks)]


def test_horizon_stops_and_records_unfinished(model) -> None:
    sc = tiny_scenario(simulation={"horizon_s": 0.05})
    engine = make_engine(model, sc, request_table([(0.0, 8, 1000), (10.0, 8, 4)]))
    result = engine.run()
    frame = result.frame()
    # Request 1 never arrived: not recorded (as in the simulator); request 0 was cut off.
    assert list(frame.req_id) == [0]
    assert frame.state[0] == "running" and frame.reason[0] == "horizon"
    assert engine.runner.num_tracked == 0


def test_oversized_requests_are_rejected_like_in_the_simulator(model) -> None:
    table = request_table([(0.0, 60, 10), (0.0, 5, 3)])
    result = make_engine(model, tiny_scenario(blocks=8), table).run()  # 8 blocks = 32 positions
    frame = result.frame().set_index("req_id")
    assert frame.loc[0, "state"] == "rejected" and frame.loc[1, "state"] == "finished"
