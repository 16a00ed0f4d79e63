"""The wall-clock engine around the shared scheduler: tokens do not depend on how requests are
batched, chunked or preempted, and cancellation or preemption leaks no KV blocks."""

from __future__ import annotations

import random

import pytest

torch = pytest.importorskip("torch")

from gpu_backend.engine import GpuEngine  # noqa: E402
from gpu_backend.kv_cache import PagedKVCache  # noqa: E402
from gpu_backend.runner import ModelRunner, prompt_token_ids  # noqa: E402
from gpu_backend.weights import build_model  # noqa: E402
from sim.core.blocks import BlockManager  # noqa: E402
from sim.core.policies import make_policy  # noqa: E402
from sim.core.request import Request, RequestState  # noqa: E402
from sim.core.scheduler import Scheduler, SchedulerConfig  # noqa: E402
from sim.cost.presets import MODELS  # noqa: E402

SPEC = MODELS["tiny"]
BLOCK = 4
SEED = 11


@pytest.fixture(scope="module")
def model():
    return build_model(SPEC, "cpu", torch.float32, seed=1, attention="torch", init_std=0.2)


def make_requests(n: int = 8, seed: int = 0, spread_s: float = 0.004) -> list[Request]:
    rng = random.Random(seed)
    return [Request(i, i * spread_s, rng.randint(1, 30), rng.randint(1, 10)) for i in range(n)]


def reference_tokens(model, requests: list[Request], greedy) -> dict[int, list[int]]:
    prompts = [prompt_token_ids(r, SEED, SPEC.vocab_size) for r in requests]
    longest = max(r.max_tokens for r in requests)
    tokens, _ = greedy(model, prompts, longest, block_size=BLOCK)
    # Greedy decoding is prefix-stable: a shorter max_tokens is a prefix of the longest run.
    return {r.req_id: t[: r.max_tokens] for r, t in zip(requests, tokens, strict=True)}


def make_engine(model, policy: str, num_blocks: int, chunked: bool = True, budget: int = 2048,
                max_num_seqs: int = 256, pad_decode: bool = False, on_token=None) -> GpuEngine:
    config = SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=budget,
                             enable_chunked_prefill=chunked, max_model_len=SPEC.max_model_len)
    sched = Scheduler(config, BlockManager(num_blocks, BLOCK), make_policy(policy))
    cache = PagedKVCache.allocate(SPEC, num_blocks, BLOCK, model.dtype, model.device)
    runner = ModelRunner(model, cache, prompt_seed=SEED, pad_decode_batches=pad_decode, max_graph_batch=4)
    return GpuEngine(sched, runner, on_token=on_token)


CONFIGS = {
    # name: (policy, KV blocks, chunked prefill, token budget, max_num_seqs)
    "continuous": ("continuous", 512, True, 2048, 256),
    "continuous-no-chunking": ("continuous", 512, False, 2048, 256),
    "continuous-chunks-of-7": ("continuous", 512, True, 7, 256),
    # 12 blocks of 4 = 48 positions for 8 requests of up to 40: recompute preemption is certain.
    "continuous-tiny-cache": ("continuous", 12, True, 16, 256),
    "continuous-tiny-cache-no-chunking": ("continuous", 9, False, 32, 256),
    "static": ("static", 512, True, 2048, 3),
    "static-no-chunking": ("static", 512, False, 2048, 3),
    "orca": ("orca", 24, True, 16, 256),
}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_tokens_independent_of_batching_chunking_and_preemption(name: str, model, greedy) -> None:
    policy, blocks, chunked, budget, max_seqs = CONFIGS[name]
    # All arrive at once, so the batches (and the preemptions) do not depend on timing.
    requests = make_requests(spread_s=0.0)
    want = reference_tokens(model, make_requests(), greedy)
    engine = make_engine(model, policy, blocks, chunked, budget, max_seqs)
    result = engine.run(requests)
    frame = result.frame()
    assert (frame.state == "finished").all(), frame[["req_id", "state", "reason"]]
    assert result.tokens == want
    assert (frame.output_tokens == frame.max_tokens).all()
    if "tiny-cache" in name:
        assert result.summary["preemptions"] > 0
    if policy == "static":
        assert result.summary["padding_tokens"] > 0  # finished members rode along as padding
    assert engine.scheduler.blocks.num_free == blocks and engine.runner.num_tracked == 0
    assert result.summary["steps"] == len(result.steps) == len(result.device_step_s)
    assert all(s > 0 for s in result.device_step_s)


def test_padded_decode_path_gives_the_same_tokens(model, greedy) -> None:
    requests = make_requests(n=6, spread_s=0.0)
    engine = make_engine(model, "continuous", 512, pad_decode=True)
    used = []
    execute = engine.runner.execute

    def spy(plan):
        out = execute(plan)
        used.append(out.used_decode_graph)
        return out

    engine.runner.execute = spy
    result = engine.run(requests)
    assert result.tokens == reference_tokens(model, make_requests(n=6, spread_s=0.0), greedy)
    # Batches of 6 exceed the largest padded size (4), so some decode steps go eager.
    assert any(used) and not all(used)


def test_cancel_frees_blocks_at_once(model) -> None:
    requests = [Request(0, 0.0, 10, 50), Request(1, 0.0, 12, 20)]
    seen: list[tuple[int, int, list[int], RequestState]] = []

    def on_token(req, tok, now) -> None:
        victim = requests[0]
        seen.append((req.req_id, req.num_output_tokens, list(victim.block_table), victim.state))
        if req.req_id == 0 and req.num_output_tokens == 2:
            engine.cancel(0)

    engine = make_engine(model, "continuous", 64, on_token=on_token)
    result = engine.run(requests)
    frame = result.frame().set_index("req_id")
    assert frame.loc[0, "state"] == "cancelled" and frame.loc[0, "output_tokens"] == 2
    assert frame.loc[1, "state"] == "finished" and len(result.tokens[0]) == 2
    # From the step after the cancel on, request 0 holds no blocks.
    after = [s for s in seen if s[0] == 1 and s[1] >= 3]
    assert after and all(not table and state == RequestState.CANCELLED for _, _, table, state in after)
    assert engine.scheduler.blocks.num_free == 64


@pytest.mark.parametrize("seed", [0, 1])
def test_random_stream_with_cancellations_and_preemption_leaks_nothing(seed: int, model, greedy) -> None:
    rng = random.Random(seed)
    n = 24
    requests = [Request(i, rng.uniform(0, 0.05), rng.randint(1, 40), rng.randint(1, 12)) for i in range(n)]
    fresh = [Request(r.req_id, r.arrival, r.prompt_len, r.max_tokens) for r in requests]
    cancel_at = {r.req_id: r.arrival + rng.uniform(0, 0.03) for r in requests if rng.random() < 0.35}
    engine = make_engine(model, "continuous", 14, budget=24)
    result = engine.run(requests, cancel_at=cancel_at)
    frame = result.frame()
    assert sorted(frame.req_id) == list(range(n))
    assert set(frame.state) <= {"finished", "cancelled"}
    assert (frame.state == "cancelled").sum() >= 1 and result.summary["preemptions"] > 0
    assert engine.scheduler.blocks.num_free == 14
    assert not engine.scheduler.running and engine.scheduler.num_waiting == 0
    assert engine.runner.num_tracked == 0
    # Finished requests still got exactly the greedy tokens; cancelled ones a prefix of them.
    want = reference_tokens(model, fresh, greedy)
    for rid, toks in result.tokens.items():
        assert toks == want[rid][: len(toks)]


def test_horizon_stops_and_records_unfinished(model) -> None:
    requests = [Request(0, 0.0, 8, 1000), Request(1, 10.0, 8, 4)]
    engine = make_engine(model, "continuous", 512)
    result = engine.run(requests, horizon_s=0.05)
    frame = result.frame()
    # Request 1 never arrived: not recorded (as in the simulator); request 0 was cut off.
    assert list(frame.req_id) == [0]
    assert frame.state[0] == "running" and frame.reason[0] == "horizon"
    assert engine.runner.num_tracked == 0


def test_oversized_requests_are_rejected_like_in_the_simulator(model) -> None:
    requests = [Request(0, 0.0, 60, 10), Request(1, 0.0, 5, 3)]
    result = make_engine(model, "continuous", 8).run(requests)  # 8 blocks = 32 positions
    frame = result.frame().set_index("req_id")
    assert frame.loc[0, "state"] == "rejected" and frame.loc[1, "state"] == "finished"
