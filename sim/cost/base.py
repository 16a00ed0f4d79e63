"""What every step-latency model offers the engine."""

from __future__ import annotations

from typing import Protocol

from sim.core.plan import StepPlan


class CostModel(Protocol):
    name: str

    def step_time(self, plan: StepPlan) -> float:
        """Seconds the step takes on the modelled hardware."""
        ...

    # Optional: ``decode_terms() -> (c0, c_ds, c_dc) | None`` when a decode-only step takes
    # exactly ``c0 + c_ds * batch + c_dc * ctx_sum``; the simulator's fast path then evaluates
    # it inline (see ProfileCostModel).
