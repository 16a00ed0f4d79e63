"""Arrival processes: when requests arrive, one pydantic model per kind."""

from __future__ import annotations

from typing import Annotated, Literal, Union

import numpy as np
from pydantic import BaseModel, ConfigDict, Field


class _Arrival(BaseModel):
    model_config = ConfigDict(extra="forbid", defer_build=True)
    start_s: float = Field(0.0, ge=0)

    def times(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return self.start_s + self._offsets(rng, n)

    def _offsets(self, rng: np.random.Generator, n: int) -> np.ndarray:
        raise NotImplementedError


class PoissonArrival(_Arrival):
    kind: Literal["poisson"] = "poisson"
    rate: float = Field(gt=0, description="requests per second")

    def _offsets(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return np.cumsum(rng.exponential(1.0 / self.rate, size=n))


class GammaArrival(_Arrival):
    """Gamma inter-arrival gaps with a coefficient of variation; cv=1 is Poisson, >1 is bursty.

    ``vllm bench serve --burstiness b`` is this with cv = 1/sqrt(b).
    """

    kind: Literal["gamma"] = "gamma"
    rate: float = Field(gt=0)
    cv: float = Field(gt=0)

    def _offsets(self, rng: np.random.Generator, n: int) -> np.ndarray:
        shape = 1.0 / self.cv**2
        return np.cumsum(rng.gamma(shape, 1.0 / (self.rate * shape), size=n))


class ConstantArrival(_Arrival):
    kind: Literal["constant"] = "constant"
    rate: float = Field(gt=0)

    def _offsets(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return np.arange(n, dtype=np.float64) / self.rate


class AllAtOnceArrival(_Arrival):
    kind: Literal["all_at_once"] = "all_at_once"

    def _offsets(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return np.zeros(n)


ArrivalProcess = Annotated[
    Union[PoissonArrival, GammaArrival, ConstantArrival, AllAtOnceArrival],  # noqa: UP007
    Field(discriminator="kind"),
]
