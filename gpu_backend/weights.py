"""Model weights: seeded random initialisation, or a local Hugging Face safetensors folder.

Checkpoints use Hugging Face names (`model.layers.N.self_attn.q_proj.weight`, ...); our model
fuses q/k/v and gate/up, so loading concatenates and saving splits.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import torch

from gpu_backend.model import LlamaModel, default_dtype
from sim.cost.presets import ModelSpec
from sim.errors import InputError


def build_model(spec: ModelSpec, device: torch.device | str = "cpu", dtype: torch.dtype | None = None,
                seed: int = 0, weights: str | Path | None = None, attention: str | None = None,
                init_std: float = 0.02) -> LlamaModel:
    """A ready model: random weights from `seed`, or those in the folder `weights`.

    attention defaults to the Triton kernels on CUDA and the torch reference elsewhere.
    """
    dtype = dtype or default_dtype(device)
    attention = attention or ("triton" if torch.device(device).type == "cuda" else "torch")
    model = LlamaModel(spec, dtype, device, attention).eval()
    if weights is None:
        init_random_weights(model, seed, init_std)
    else:
        load_safetensors(model, weights)
    return model


def init_random_weights(model: LlamaModel, seed: int, std: float = 0.02) -> None:
    """Normal(0, std) matrices and biases, unit norms, drawn in a fixed order from one generator.

    Drawn on the model's device (a CPU draw of an 8B model takes minutes); the same seed gives
    the same weights on the same kind of device.
    """
    gen = torch.Generator(device=model.device).manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.fill_(1.0)
            else:
                param.normal_(0.0, std, generator=gen)


def _hf_names(model: LlamaModel) -> Iterator[tuple[str, list[str]]]:
    """(our parameter name, the HF tensors concatenated along dim 0 to make it)."""
    yield "embed_tokens.weight", ["model.embed_tokens.weight"]
    for i, layer in enumerate(model.layers):
        ours, hf = f"layers.{i}.", f"model.layers.{i}."
        kinds = ["weight", "bias"] if layer.self_attn.qkv_proj.bias is not None else ["weight"]
        for kind in kinds:
            yield f"{ours}self_attn.qkv_proj.{kind}", [f"{hf}self_attn.{p}_proj.{kind}" for p in "qkv"]
        yield f"{ours}self_attn.o_proj.weight", [f"{hf}self_attn.o_proj.weight"]
        yield f"{ours}mlp.gate_up_proj.weight", [f"{hf}mlp.gate_proj.weight", f"{hf}mlp.up_proj.weight"]
        yield f"{ours}mlp.down_proj.weight", [f"{hf}mlp.down_proj.weight"]
        yield f"{ours}input_layernorm.weight", [f"{hf}input_layernorm.weight"]
        yield f"{ours}post_attention_layernorm.weight", [f"{hf}post_attention_layernorm.weight"]
    yield "norm.weight", ["model.norm.weight"]
    if model.lm_head is not None:
        yield "lm_head.weight", ["lm_head.weight"]


def load_safetensors(model: LlamaModel, folder: str | Path) -> None:
    """Copy a Hugging Face safetensors checkpoint (one file or shards) into `model`."""
    from safetensors import safe_open

    files = sorted(Path(folder).glob("*.safetensors"))
    if not files:
        raise InputError(f"weights: no *.safetensors files in '{folder}'")
    where: dict[str, Path] = {}
    for f in files:
        with safe_open(str(f), framework="pt") as st:
            where.update((k, f) for k in st.keys())  # noqa: SIM118 (safe_open is not a dict)
    params = dict(model.named_parameters())
    # Tensors are read one at a time so host memory holds at most one matrix of a large model.
    for ours, sources in _hf_names(model):
        missing = [s for s in sources if s not in where]
        if missing:
            raise InputError(f"weights: '{folder}' lacks {missing[0]} "
                             f"(is it a {model.spec.name} checkpoint?)")
        parts = []
        for s in sources:
            with safe_open(str(where[s]), framework="pt", device=str(model.device)) as st:
                parts.append(st.get_tensor(s))
        value = torch.cat(parts) if len(parts) > 1 else parts[0]
        target = params[ours]
        if value.shape != target.shape:
            raise InputError(f"weights: {sources[0]} has shape {tuple(value.shape)}, "
                             f"model '{model.spec.name}' expects {tuple(target.shape)} (after fusing)")
        with torch.no_grad():
            target.copy_(value)


def hf_state_dict(model: LlamaModel) -> dict[str, torch.Tensor]:
    """The weights under Hugging Face names (fused matrices split back), on the CPU."""
    params = dict(model.named_parameters())
    tensors: dict[str, torch.Tensor] = {}
    for ours, sources in _hf_names(model):
        value = params[ours].detach().cpu()
        for name, part in zip(sources, value.split(_split_sizes(model, ours)), strict=True):
            tensors[name] = part.contiguous()
    return tensors


def save_safetensors(model: LlamaModel, folder: str | Path) -> None:
    """Write the weights under Hugging Face names plus a config.json, loadable by both sides."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    save_file(hf_state_dict(model), str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(hf_config_dict(model.spec), indent=2))


def _split_sizes(model: LlamaModel, ours: str) -> list[int]:
    spec = model.spec
    if "qkv_proj" in ours:
        kv = spec.num_kv_heads * spec.head_dim
        return [spec.num_heads * spec.head_dim, kv, kv]
    if "gate_up_proj" in ours:
        return [spec.intermediate_size] * 2
    return [model.get_parameter(ours).shape[0]]


def hf_config_dict(spec: ModelSpec) -> dict:
    """The Hugging Face config.json fields that describe `spec` (Qwen2 when it has q/k/v biases)."""
    return {
        "architectures": ["Qwen2ForCausalLM" if spec.attention_bias else "LlamaForCausalLM"],
        "model_type": "qwen2" if spec.attention_bias else "llama",
        "hidden_size": spec.hidden_size,
        "intermediate_size": spec.intermediate_size,
        "num_hidden_layers": spec.num_layers,
        "num_attention_heads": spec.num_heads,
        "num_key_value_heads": spec.num_kv_heads,
        "head_dim": spec.head_dim,
        "vocab_size": spec.vocab_size,
        "max_position_embeddings": spec.max_model_len,
        "rope_theta": spec.rope_theta,
        "rope_scaling": spec.rope_scaling,
        "rms_norm_eps": spec.rms_norm_eps,
        "tie_word_embeddings": spec.tie_word_embeddings,
        "attention_bias": spec.attention_bias,
    }


def spec_from_hf_config(folder: str | Path, name: str | None = None) -> ModelSpec:
    """A ModelSpec read from a checkpoint's config.json (Llama / Mistral / Qwen2 fields)."""
    path = Path(folder) / "config.json"
    try:
        cfg = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise InputError(f"weights: cannot read '{path}': {e}") from None
    rope = cfg.get("rope_parameters") or {}
    scaling = cfg.get("rope_scaling") or (rope if rope.get("rope_type", "default") != "default" else None)
    head_dim = cfg.get("head_dim")
    default_head_dim = cfg["hidden_size"] // cfg["num_attention_heads"]
    return ModelSpec(
        name=name or Path(folder).name,
        num_layers=cfg["num_hidden_layers"],
        hidden_size=cfg["hidden_size"],
        num_heads=cfg["num_attention_heads"],
        num_kv_heads=cfg.get("num_key_value_heads", cfg["num_attention_heads"]),
        intermediate_size=cfg["intermediate_size"],
        vocab_size=cfg["vocab_size"],
        max_model_len=cfg.get("max_position_embeddings", 4096),
        rope_theta=float(cfg.get("rope_theta", rope.get("rope_theta", 10000.0))),
        rope_scaling=scaling,
        rms_norm_eps=cfg.get("rms_norm_eps", 1e-5),
        tie_word_embeddings=cfg.get("tie_word_embeddings", False),
        attention_bias=cfg.get("attention_bias", cfg.get("model_type") == "qwen2"),
        head_dim_override=head_dim if head_dim and head_dim != default_head_dim else None,
    )
