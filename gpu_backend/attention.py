"""Paged attention backends, chosen by name: a torch reference (the oracle) and Triton kernels.

Both implement the same two calls per layer: store the step's new K/V at their slots, then
attend every packed query over its sequence's cached keys, causally by absolute position.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import torch
import torch.nn.functional as F

from gpu_backend.metadata import AttentionMetadata
from sim.errors import InputError


class AttentionBackend(Protocol):
    name: str

    def store_kv(self, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 slot_mapping: torch.Tensor) -> None:
        """Write k, v [T, Hkv, D] into caches [num_blocks, block_size, Hkv, D]; slot -1 is skipped."""

    def attend(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
               meta: AttentionMetadata, scale: float) -> torch.Tensor:
        """Attention output [T, Hq, D] for packed queries q [T, Hq, D]."""


class TorchAttention:
    """Per-sequence gather + SDPA. Slow and simple: it is what the kernels are checked against."""

    name = "torch"

    def store_kv(self, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 slot_mapping: torch.Tensor) -> None:
        keep = slot_mapping >= 0
        slots = slot_mapping[keep]
        k_cache.view(-1, *k_cache.shape[2:])[slots] = k[keep]
        v_cache.view(-1, *v_cache.shape[2:])[slots] = v[keep]

    def attend(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
               meta: AttentionMetadata, scale: float) -> torch.Tensor:
        out = torch.zeros_like(q)
        group = q.shape[1] // k_cache.shape[2]
        block_size = k_cache.shape[1]
        cu = meta.cu_seqlens_q.tolist()
        for b, ctx in enumerate(meta.context_lens.tolist()):
            start, end = cu[b], cu[b + 1]
            if end == start:
                continue
            pages = meta.block_tables[b, : -(-ctx // block_size)].long()
            k = k_cache[pages].flatten(0, 1)[:ctx].repeat_interleave(group, dim=1)
            v = v_cache[pages].flatten(0, 1)[:ctx].repeat_interleave(group, dim=1)
            q_pos = torch.arange(ctx - (end - start), ctx, device=q.device)
            mask = torch.arange(ctx, device=q.device)[None, :] <= q_pos[:, None]
            o = F.scaled_dot_product_attention(
                q[start:end].transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1),
                attn_mask=mask, scale=scale,
            )
            out[start:end] = o.transpose(0, 1)
        return out


def _triton_backend() -> AttentionBackend:
    # Imported here so the package (and the CPU reference) works where triton is absent.
    from gpu_backend.triton_attention import TritonAttention

    return TritonAttention()


ATTENTION_BACKENDS: dict[str, Callable[[], AttentionBackend]] = {
    "torch": TorchAttention,
    "triton": _triton_backend,
}


def get_attention_backend(name: str) -> AttentionBackend:
    try:
        factory = ATTENTION_BACKENDS[name]
    except KeyError:
        allowed = ", ".join(ATTENTION_BACKENDS)
        raise InputError(f"attention: unknown backend '{name}'; allowed: {allowed}") from None
    return factory()
