"""Next-token sampling: greedy by default; temperature and nucleus (top-p) with a seeded generator."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sim.errors import InputError


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise InputError(f"sampling.temperature: must be >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise InputError(f"sampling.top_p: must be in (0, 1], got {self.top_p}")


class Sampler:
    """One generator for the whole run: the same seed and the same steps give the same tokens."""

    def __init__(self, params: SamplingParams, device: torch.device | str) -> None:
        self.params = params
        self.generator = torch.Generator(device=device).manual_seed(params.seed)

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        """Token ids [N] from fp32 logits [N, vocab]."""
        p = self.params
        if p.temperature == 0.0 or logits.shape[0] == 0:
            return logits.argmax(dim=-1)
        probs = torch.softmax(logits / p.temperature, dim=-1)
        if p.top_p < 1.0:
            sorted_probs, order = probs.sort(dim=-1, descending=True)
            # Keep the smallest prefix whose mass reaches top_p (the top token always stays).
            outside = sorted_probs.cumsum(dim=-1) - sorted_probs >= p.top_p
            sorted_probs = sorted_probs.masked_fill(outside, 0.0)
            probs = torch.zeros_like(probs).scatter_(-1, order, sorted_probs)
        return torch.multinomial(probs, 1, generator=self.generator).squeeze(1)
