"""What every step-latency model offers the engine."""

from __future__ import annotations

from typing import Protocol

from sim.core.plan import StepPlan


class CostModel(Protocol):
    name: str

    def step_time(self, plan: StepPlan) -> float:
        """Seconds the step takes on the modelled hardware."""
        ...

    def linear_coefficients(self) -> tuple[float, ...] | None:
        """Coefficients over ``FEATURES`` when the model is linear in them (fast paths sum it)."""
        ...
