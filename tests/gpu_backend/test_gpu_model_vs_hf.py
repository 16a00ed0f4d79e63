"""The model with the torch reference attention generates what transformers generates."""

from __future__ import annotations

import dataclasses

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from gpu_backend.weights import build_model, hf_state_dict  # noqa: E402
from sim.cost.presets import MODELS, ModelSpec  # noqa: E402

TINY = MODELS["tiny"]
LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 64}
VARIANTS = {
    "llama": TINY,
    # llama3 scaling changes the mid and low frequencies of a 16-dim head with a 64-token window.
    "llama3-rope-tied": dataclasses.replace(TINY, rope_scaling=LLAMA3_ROPE, tie_word_embeddings=True),
    "qwen2-bias": dataclasses.replace(TINY, attention_bias=True, rms_norm_eps=1e-6, rope_theta=1e6),
}
PROMPTS = [[5, 17, 99, 3, 250, 8, 41], [7], list(range(30, 53)), [200, 1, 1, 2, 3, 5, 8, 13, 21, 34, 55]]
MAX_NEW = 8


def hf_model(spec: ModelSpec, ours) -> torch.nn.Module:
    rope = {"rope_type": "default", "rope_theta": spec.rope_theta, **(spec.rope_scaling or {})}
    common = {
        "vocab_size": spec.vocab_size, "hidden_size": spec.hidden_size,
        "intermediate_size": spec.intermediate_size,
        "num_hidden_layers": spec.num_layers, "num_attention_heads": spec.num_heads,
        "num_key_value_heads": spec.num_kv_heads, "max_position_embeddings": spec.max_model_len,
        "rms_norm_eps": spec.rms_norm_eps, "tie_word_embeddings": spec.tie_word_embeddings,
        "rope_parameters": rope,
    }
    if spec.attention_bias:
        model = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**common))
    else:
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**common))
    missing, unexpected = model.load_state_dict(hf_state_dict(ours), strict=False)
    # A tied checkpoint has no lm_head tensor; transformers ties it to the embedding.
    assert not unexpected and missing in ([], ["lm_head.weight"])
    return model.eval()


def hf_greedy(model: torch.nn.Module, prompt: list[int]) -> tuple[list[int], list[torch.Tensor]]:
    ids, logits = list(prompt), []
    with torch.no_grad():
        for _ in range(MAX_NEW):
            last = model(torch.tensor([ids])).logits[0, -1].float()
            logits.append(last)
            ids.append(int(last.argmax()))
    return ids[len(prompt):], logits


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("chunk", [None, 5], ids=["whole-prefill", "chunked-prefill"])
def test_greedy_tokens_match_transformers(variant: str, chunk: int | None, greedy) -> None:
    spec = VARIANTS[variant]
    # std 0.2: random logits spread widely enough that argmax is far from a tie.
    ours = build_model(spec, "cpu", torch.float32, seed=1, attention="torch", init_std=0.2)
    hf = hf_model(spec, ours)
    tokens, logits = greedy(ours, PROMPTS, MAX_NEW, block_size=4, chunk=chunk)
    for prompt, got, got_logits in zip(PROMPTS, tokens, logits, strict=True):
        want, want_logits = hf_greedy(hf, prompt)
        assert got == want
        torch.testing.assert_close(torch.stack(got_logits), torch.stack(want_logits), atol=1e-4, rtol=1e-4)


def test_llama3_rope_scaling_changes_outputs() -> None:
    # Guard for the variant above: the scaled frequencies must actually differ.
    from gpu_backend.rope import rope_inv_freq

    plain = rope_inv_freq(TINY.head_dim, TINY.rope_theta, None)
    scaled = rope_inv_freq(TINY.head_dim, TINY.rope_theta, LLAMA3_ROPE)
    assert torch.equal(plain[:1], scaled[:1]) and not torch.equal(plain, scaled)
