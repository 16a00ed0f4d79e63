"""Weights: seeded init is reproducible, and a saved checkpoint loads back (ours and transformers')."""

from __future__ import annotations

import dataclasses
import json

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")

from gpu_backend.kv_cache import PagedKVCache  # noqa: E402
from gpu_backend.metadata import SequenceChunk, build_metadata  # noqa: E402
from gpu_backend.weights import (  # noqa: E402
    build_model,
    hf_config_dict,
    save_safetensors,
    spec_from_hf_config,
)
from sim.cost.presets import MODELS  # noqa: E402
from sim.errors import InputError  # noqa: E402

TINY = MODELS["tiny"]
QWEN_TINY = dataclasses.replace(TINY, name="qwen-tiny", attention_bias=True, tie_word_embeddings=True,
                                rope_scaling={"rope_type": "linear", "factor": 2.0})


def params(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.named_parameters()}


def test_seeded_init_is_reproducible_and_seed_dependent() -> None:
    a, b, c = (params(build_model(TINY, seed=s)) for s in (3, 3, 4))
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["layers.0.self_attn.qkv_proj.weight"], c["layers.0.self_attn.qkv_proj.weight"])
    assert torch.equal(a["norm.weight"], torch.ones(TINY.hidden_size))


@pytest.mark.parametrize("spec", [TINY, QWEN_TINY], ids=["llama", "qwen2-tied"])
def test_safetensors_round_trip(spec, tmp_path) -> None:
    original = build_model(spec, seed=7)
    save_safetensors(original, tmp_path)
    loaded_spec = spec_from_hf_config(tmp_path, name=spec.name)
    assert loaded_spec == dataclasses.replace(spec, dtype_bytes=2)  # config.json does not carry dtype
    loaded = build_model(spec, weights=tmp_path)
    want, got = params(original), params(loaded)
    assert want.keys() == got.keys()
    assert all(torch.equal(want[k], got[k]) for k in want)


def test_checkpoint_loads_in_transformers_and_gives_same_logits(tmp_path) -> None:
    transformers = pytest.importorskip("transformers")
    ours = build_model(TINY, seed=7, init_std=0.2)
    save_safetensors(ours, tmp_path)
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    prompt = [3, 1, 4, 1, 5, 9, 2, 6]
    positions, meta = build_metadata([SequenceChunk(0, len(prompt), [0, 1])], 4)
    cache = PagedKVCache.allocate(TINY, 2, 4, torch.float32, "cpu")
    got = ours(torch.tensor(prompt), positions, cache, meta)[0]
    with torch.no_grad():
        want = hf(torch.tensor([prompt])).logits[0, -1]
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


def test_load_errors_are_one_line_input_errors(tmp_path) -> None:
    with pytest.raises(InputError, match="no \\*.safetensors"):
        build_model(TINY, weights=tmp_path)
    save_safetensors(build_model(TINY), tmp_path)
    bigger = dataclasses.replace(TINY, intermediate_size=256)
    with pytest.raises(InputError, match="expects"):
        build_model(bigger, weights=tmp_path)
    with pytest.raises(InputError, match="lacks"):
        build_model(dataclasses.replace(TINY, num_layers=3), weights=tmp_path)


def test_hf_config_fields_for_qwen() -> None:
    cfg = hf_config_dict(QWEN_TINY)
    assert cfg["model_type"] == "qwen2" and cfg["tie_word_embeddings"] is True
    json.dumps(cfg)  # must be serialisable as written to config.json
