"""What every step-latency model offers the engine."""

from __future__ import annotations

from typing import Protocol

from sim.core.plan import StepPlan


class CostModel(Protocol):
    name: str

    def step_time(self, plan: StepPlan) -> float:
        """Seconds the step takes on the modelled hardware."""
        ...

    # Optional: ``decode_time(batch, ctx_sum) -> float``, exactly ``step_time`` of a decode-only
    # plan with those aggregates (same float operations); the simulator's fast path uses it.
