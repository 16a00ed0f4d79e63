"""The StepPlan features a step-latency model sees; calibration fits coefficients over the same."""

from __future__ import annotations

from sim.core.plan import StepPlan

# Order matters: profiles store coefficients by name, fits build design matrices in this order.
FEATURES: tuple[str, ...] = (
    "const",  # per-step overhead (launches, sampling, scheduler)
    "has_prefill",  # extra overhead of a step that runs eagerly (no decode CUDA graph)
    "prefill_tokens",  # matmul work of prefill positions
    "prefill_attn_pairs",  # attention work of prefill chunks (query, key) pairs
    "decode_seqs",  # per-sequence work of decode tokens (matmul rows, sampling)
    "decode_ctx_sum",  # KV bytes read by decode attention
    # Piecewise term: step tokens beyond the profile's ``knee_tokens`` (where the matmuls turn
    # compute-bound). Optional: a profile without it, or without its knee, reads it as 0.
    "tokens_over_knee",
)
OPTIONAL_FEATURES: frozenset[str] = frozenset({"tokens_over_knee"})


def over_knee(num_tokens: int, knee_tokens: int | None) -> float:
    return float(max(0, num_tokens - knee_tokens)) if knee_tokens is not None else 0.0


def plan_features(plan: StepPlan, knee_tokens: int | None = None) -> tuple[float, ...]:
    decode = plan.decode_seqs
    return (
        1.0,
        1.0 if plan.prefill_tokens else 0.0,
        float(plan.prefill_tokens),
        float(plan.prefill_attn_pairs),
        float(decode),
        float(plan.decode_ctx_sum),
        over_knee(plan.prefill_tokens + decode, knee_tokens),
    )


def shape_features(
    *, prefill_chunks: list[tuple[int, int]] = (), decode_contexts: list[int] = (),
    knee_tokens: int | None = None,
) -> tuple[float, ...]:
    """Features of a step given as prefill (chunk, prior context) pairs and decode contexts.

    ``decode_contexts`` are the keys each decode token attends (its prior context + 1).
    """
    prefill_tokens = sum(n for n, _ in prefill_chunks)
    pairs = sum(n * c + n * (n + 1) // 2 for n, c in prefill_chunks)
    return (
        1.0,
        1.0 if prefill_tokens else 0.0,
        float(prefill_tokens),
        float(pairs),
        float(len(decode_contexts)),
        float(sum(decode_contexts)),
        over_knee(prefill_tokens + len(decode_contexts), knee_tokens),
    )
