"""The designed grid of step shapes a calibration times.

A shape is what one engine step runs: prefill chunks given as (new tokens, prior context) and
decode tokens given by the context each already holds. Three regions cover what a
continuous-batching scheduler builds: pure decode (batch × context), pure prefill (chunk ×
prior context, one or several sequences) and mixed steps (a prefill chunk beside decodes that
fill a token budget).
"""

from __future__ import annotations

from dataclasses import dataclass

from sim.cost.features import shape_features
from sim.errors import InputError


@dataclass(frozen=True)
class StepShape:
    region: str  # "decode" | "prefill" | "mixed"
    prefill: tuple[tuple[int, int], ...] = ()  # (chunk tokens, prior context) per sequence
    decode: tuple[int, ...] = ()  # prior context of each decoding sequence

    @property
    def key(self) -> str:
        """A stable name: what an interrupted calibration matches to skip measured shapes."""
        parts = [self.region]
        if self.prefill:
            parts.append("p=" + ",".join(f"{n}@{c}" for n, c in self.prefill))
        if self.decode:
            ctx = sorted(set(self.decode))
            parts.append(f"d={len(self.decode)}x" + ",".join(str(c) for c in ctx))
        return " ".join(parts)

    @property
    def num_tokens(self) -> int:
        return sum(n for n, _ in self.prefill) + len(self.decode)

    @property
    def kv_tokens(self) -> int:
        """Positions the shape holds in the KV cache while it runs."""
        return sum(n + c for n, c in self.prefill) + sum(c + 1 for c in self.decode)

    @property
    def max_len(self) -> int:
        return max([n + c for n, c in self.prefill] + [c + 1 for c in self.decode] + [0])

    def features(self, knee_tokens: int | None = None) -> tuple[float, ...]:
        # A decode token attends its prior context plus itself.
        return shape_features(prefill_chunks=list(self.prefill),
                              decode_contexts=[c + 1 for c in self.decode], knee_tokens=knee_tokens)


def decode(batch: int, ctx: int) -> StepShape:
    return StepShape("decode", decode=(ctx,) * batch)


def prefill(chunk: int, prior: int = 0, seqs: int = 1) -> StepShape:
    return StepShape("prefill", prefill=((chunk, prior),) * seqs)


def mixed(budget: int, decodes: int, ctx: int, prior: int = 0) -> StepShape:
    """One prefill chunk beside ``decodes`` decode tokens, together filling ``budget`` tokens."""
    return StepShape("mixed", prefill=((budget - decodes, prior),), decode=(ctx,) * decodes)


def quick_grid() -> list[StepShape]:
    """A small grid for the tiny model on a CPU (CI): seconds, not minutes."""
    shapes = [decode(b, c) for b in (1, 4, 16, 40) for c in (16, 192, 768)]
    shapes += [prefill(n, p) for n in (8, 64, 256, 512) for p in (0, 384)]
    shapes += [prefill(64, 0, 4), prefill(192, 128, 3)]
    shapes += [mixed(budget, d, 256) for budget in (64, 256) for d in (4, 24)]
    shapes += [mixed(512, 16, 64, 256)]
    return shapes


def full_grid(max_model_len: int = 8192, max_batch: int = 256) -> list[StepShape]:
    """The complete grid for a GPU: decode batch × context, prefill chunk × prior context,
    several prefills at once, and mixed steps at several token budgets."""
    shapes = []
    for c in (128, 512, 1024, 2048, 4096, 8192):
        for b in (1, 2, 4, 8, 16, 32, 64, 96, 128, 192, 256):
            if c < max_model_len and b <= max_batch:
                shapes.append(decode(b, c))
    for n in (16, 64, 128, 256, 512, 1024, 2048, 4096, 8192):
        for p in (0, 1024, 4096):
            if n + p <= max_model_len:
                shapes.append(prefill(n, p))
    shapes += [prefill(256, 0, 8), prefill(512, 0, 4), prefill(1024, 512, 4), prefill(2048, 0, 2)]
    for budget in (512, 2048, 4096, 8192):
        for d in (8, 32, 128, 256):
            if d < budget and d <= max_batch:
                shapes.append(mixed(budget, d, 1024))
    shapes += [mixed(2048, 64, 4096, 2048), mixed(8192, 128, 2048, 0)]
    return shapes


GRIDS = {"quick": quick_grid, "full": full_grid}


def make_grid(name: str, max_model_len: int, max_batch: int,
              kv_tokens: int) -> tuple[list[StepShape], list[str]]:
    """The named grid's shapes that fit the model, the decode batch limit and the KV cache;
    and the keys of those left out."""
    if name not in GRIDS:
        raise InputError(f"--grid: unknown grid '{name}'; allowed: {', '.join(GRIDS)}")
    shapes = quick_grid() if name == "quick" else full_grid(max_model_len, max_batch)
    keep, dropped = [], []
    for s in shapes:
        ok = s.max_len <= max_model_len and len(s.decode) <= max_batch and s.kv_tokens <= kv_tokens
        (keep if ok else dropped).append(s if ok else s.key)
    return keep, dropped
