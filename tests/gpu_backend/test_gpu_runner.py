"""Runner pieces: prompt ids, sampling, and one executed step's output."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from gpu_backend.decode_graphs import bucket_for  # noqa: E402
from gpu_backend.kv_cache import PagedKVCache  # noqa: E402
from gpu_backend.runner import ModelRunner, prompt_token_ids  # noqa: E402
from gpu_backend.sampling import Sampler, SamplingParams  # noqa: E402
from gpu_backend.weights import build_model  # noqa: E402
from sim.core.plan import StepPlan  # noqa: E402
from sim.core.request import Request  # noqa: E402
from sim.cost.presets import MODELS  # noqa: E402
from sim.errors import InputError  # noqa: E402


def test_prompt_ids_are_deterministic_per_request_and_seed() -> None:
    a, b = Request(3, 0.0, 50, 1), Request(4, 0.0, 50, 1)
    ids = prompt_token_ids(a, 0, 256)
    assert len(ids) == 50 and all(0 <= t < 256 for t in ids)
    assert ids == prompt_token_ids(Request(3, 9.0, 50, 7), 0, 256)
    assert ids != prompt_token_ids(b, 0, 256) and ids != prompt_token_ids(a, 1, 256)


def test_prompt_ids_given_on_the_request_are_used() -> None:
    req = Request(0, 0.0, 3, 1)
    req.extra = {"prompt_token_ids": [7, 8, 9]}
    assert prompt_token_ids(req, 0, 256) == [7, 8, 9]
    req.extra = {"prompt_token_ids": [7, 8]}
    with pytest.raises(ValueError, match="prompt_len"):
        prompt_token_ids(req, 0, 256)


def test_sampling() -> None:
    logits = torch.randn(64, 100, generator=torch.Generator().manual_seed(0)) * 3
    greedy = logits.argmax(-1)
    assert torch.equal(Sampler(SamplingParams(), "cpu")(logits), greedy)
    # A tiny nucleus keeps only the top token, whatever the temperature.
    assert torch.equal(Sampler(SamplingParams(temperature=5.0, top_p=1e-6), "cpu")(logits), greedy)
    hot = SamplingParams(temperature=1.0, top_p=0.9, seed=3)
    first, again = Sampler(hot, "cpu")(logits), Sampler(hot, "cpu")(logits)
    assert torch.equal(first, again) and not torch.equal(first, greedy)
    # top_p 0.9 never picks a token outside the smallest set holding 90% of the mass.
    probs = torch.softmax(logits, -1)
    sorted_p, order = probs.sort(-1, descending=True)
    rank = (order == first[:, None]).float().argmax(-1)
    assert ((sorted_p.cumsum(-1) - sorted_p).gather(1, rank[:, None]) < 0.9).all()
    for bad in ({"temperature": -1.0}, {"top_p": 0.0}, {"top_p": 1.5}):
        with pytest.raises(InputError):
            SamplingParams(**bad)


def test_bucket_for() -> None:
    sizes = (1, 2, 4, 8)
    assert [bucket_for(n, sizes) for n in (1, 2, 3, 5, 8, 9)] == [1, 2, 4, 8, 8, None]


def test_execute_samples_only_requests_whose_prompt_is_done() -> None:
    spec = MODELS["tiny"]
    model = build_model(spec, "cpu", torch.float32, seed=1)
    cache = PagedKVCache.allocate(spec, 8, 4, torch.float32, "cpu")
    runner = ModelRunner(model, cache)
    whole, partial = Request(0, 0.0, 5, 2), Request(1, 0.0, 9, 2)
    whole.block_table, partial.block_table = [0, 1], [2, 3, 4]
    plan = StepPlan()
    plan.add(whole, 5)
    plan.add(partial, 4)  # first chunk of 9: nothing to sample yet
    out = runner.execute(plan)
    assert [r.req_id for r, _ in out.tokens] == [0]
    assert out.num_tokens == 9 and out.elapsed_s > 0 and not out.used_decode_graph
    with pytest.raises(ValueError, match="CUDA"):
        ModelRunner(model, cache, cuda_graphs=True)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
def test_cuda_graph_decodes_match_eager() -> None:
    from gpu_engine_helpers import request_table, tiny_scenario

    from gpu_backend.engine import GpuEngine

    spec = MODELS["tiny"]
    model = build_model(spec, "cuda", torch.float32, seed=1, attention="triton", init_std=0.2)
    sc = tiny_scenario(blocks=64, engine={"block_size": 16})
    table = request_table([(0.0, 5 + 9 * i, 12) for i in range(6)])
    tokens, graph_steps = {}, {}
    for graphs in (False, True):
        cache = PagedKVCache.allocate(spec, 64, 16, model.dtype, model.device)
        runner = ModelRunner(model, cache, cuda_graphs=graphs, max_graph_batch=8)
        used = []
        execute = runner.execute

        def spy(plan, execute=execute, used=used):
            out = execute(plan)
            used.append(out.used_decode_graph)
            return out

        runner.execute = spy
        tokens[graphs] = GpuEngine(sc, table, runner).run().tokens
        graph_steps[graphs] = sum(used)
    assert tokens[True] == tokens[False]
    assert graph_steps[True] > 0 and graph_steps[False] == 0
