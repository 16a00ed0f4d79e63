"""Llama-family decoder (Llama 3, Mistral, Qwen2) over packed tokens and a paged KV cache.

q/k/v and gate/up are fused into one matrix each (one GEMM instead of three or two); the
weight loader splits Hugging Face checkpoints' separate matrices into these.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from gpu_backend.attention import AttentionBackend, get_attention_backend
from gpu_backend.kv_cache import PagedKVCache
from gpu_backend.metadata import AttentionMetadata
from gpu_backend.rope import RotaryEmbedding
from sim.cost.presets import ModelSpec


class Linear(nn.Module):
    """y = x W^T (+ b) with uninitialised storage: weights come from a seed or a checkpoint."""

    def __init__(self, in_features: int, out_features: int, bias: bool, dtype: torch.dtype,
                 device: torch.device | str) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_features, in_features, dtype=dtype, device=device),
                                   requires_grad=False)
        self.bias = (nn.Parameter(torch.empty(out_features, dtype=dtype, device=device), requires_grad=False)
                     if bias else None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float, dtype: torch.dtype, device: torch.device | str) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(size, dtype=dtype, device=device), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise in fp32 and scale after casting back, the order Llama checkpoints expect.
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


class Attention(nn.Module):
    def __init__(self, spec: ModelSpec, dtype: torch.dtype, device: torch.device | str) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = spec.num_heads, spec.num_kv_heads, spec.head_dim
        self.q_size = spec.num_heads * spec.head_dim
        self.kv_size = spec.num_kv_heads * spec.head_dim
        self.scale = spec.head_dim ** -0.5
        self.qkv_proj = Linear(spec.hidden_size, self.q_size + 2 * self.kv_size, spec.attention_bias,
                               dtype, device)
        self.o_proj = Linear(self.q_size, spec.hidden_size, False, dtype, device)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, rotary: RotaryEmbedding,
                k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata,
                backend: AttentionBackend) -> torch.Tensor:
        q, k, v = self.qkv_proj(x).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(-1, self.num_heads, self.head_dim)
        k = k.view(-1, self.num_kv_heads, self.head_dim)
        v = v.view(-1, self.num_kv_heads, self.head_dim)
        q, k = rotary(positions, q, k)
        backend.store_kv(k, v, k_cache, v_cache, meta.slot_mapping)
        out = backend.attend(q, k_cache, v_cache, meta, self.scale)
        return self.o_proj(out.flatten(1))


class MLP(nn.Module):
    def __init__(self, spec: ModelSpec, dtype: torch.dtype, device: torch.device | str) -> None:
        super().__init__()
        self.gate_up_proj = Linear(spec.hidden_size, 2 * spec.intermediate_size, False, dtype, device)
        self.down_proj = Linear(spec.intermediate_size, spec.hidden_size, False, dtype, device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class DecoderLayer(nn.Module):
    def __init__(self, spec: ModelSpec, dtype: torch.dtype, device: torch.device | str) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps, dtype, device)
        self.self_attn = Attention(spec, dtype, device)
        self.post_attention_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps, dtype, device)
        self.mlp = MLP(spec, dtype, device)


class LlamaModel(nn.Module):
    """Token ids in, next-token logits of each sequence's last packed token out."""

    def __init__(self, spec: ModelSpec, dtype: torch.dtype, device: torch.device | str,
                 attention: str = "torch") -> None:
        super().__init__()
        self.spec = spec
        self.attention: AttentionBackend = get_attention_backend(attention)
        self.embed_tokens = nn.Embedding(spec.vocab_size, spec.hidden_size, dtype=dtype, device=device)
        self.embed_tokens.weight.requires_grad_(False)
        self.layers = nn.ModuleList(DecoderLayer(spec, dtype, device) for _ in range(spec.num_layers))
        self.norm = RMSNorm(spec.hidden_size, spec.rms_norm_eps, dtype, device)
        self.lm_head = None if spec.tie_word_embeddings else Linear(spec.hidden_size, spec.vocab_size, False,
                                                                    dtype, device)
        self.rotary = RotaryEmbedding(spec.head_dim, spec.max_model_len, spec.rope_theta, spec.rope_scaling,
                                      device)

    @property
    def dtype(self) -> torch.dtype:
        return self.embed_tokens.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.embed_tokens.weight.device

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, kv_cache: PagedKVCache,
                meta: AttentionMetadata) -> torch.Tensor:
        """input_ids, positions [T] -> logits [B, vocab] (fp32) at meta.last_token_indices."""
        h = self.embed_tokens(input_ids)
        for i, layer in enumerate(self.layers):
            k_cache, v_cache = kv_cache.layer(i)
            h = h + layer.self_attn(layer.input_layernorm(h), positions, self.rotary, k_cache, v_cache,
                                    meta, self.attention)
            h = h + layer.mlp(layer.post_attention_layernorm(h))
        # Norm and project only the rows that are sampled: the LM head is the largest GEMM
        # of a prefill step and all but the last token's logits would be thrown away.
        h = self.norm(h[meta.last_token_indices])
        weight = self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        return F.linear(h, weight).float()


def default_dtype(device: torch.device | str) -> torch.dtype:
    """bf16 where kernels are fast in it (GPU); fp32 on CPU, where bf16 is slow and inexact."""
    return torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32
