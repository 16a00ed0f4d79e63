"""Length distributions for synthetic workloads, one pydantic model per kind (a registry by tag)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal, Union

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from sim.errors import InputError


class _Dist(BaseModel):
    model_config = ConfigDict(extra="forbid", defer_build=True)
    min: int = Field(1, ge=1)
    max: int | None = Field(None, ge=1)

    def _clip(self, values: np.ndarray) -> np.ndarray:
        hi = self.max if self.max is not None else np.iinfo(np.int64).max
        return np.clip(np.rint(values), self.min, hi).astype(np.int64)

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        raise NotImplementedError


class FixedDist(_Dist):
    kind: Literal["fixed"] = "fixed"
    value: int = Field(ge=1)

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return np.full(n, self.value, dtype=np.int64)


class UniformDist(_Dist):
    kind: Literal["uniform"] = "uniform"
    max: int = Field(ge=1)

    @model_validator(mode="after")
    def _order(self) -> UniformDist:
        if self.max < self.min:
            raise ValueError(f"max ({self.max}) must be >= min ({self.min})")
        return self

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return rng.integers(self.min, self.max + 1, size=n, dtype=np.int64)


class LognormalDist(_Dist):
    """Lognormal with the given median (the usual way to describe token lengths) and sigma."""

    kind: Literal["lognormal"] = "lognormal"
    median: float = Field(gt=0)
    sigma: float = Field(gt=0)

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return self._clip(rng.lognormal(np.log(self.median), self.sigma, size=n))


class ZipfDist(_Dist):
    """Zipf over the integers [min, max]: P(min + k) proportional to 1 / (k + 1)^theta (Vidur's)."""

    kind: Literal["zipf"] = "zipf"
    theta: float = Field(gt=0)
    max: int = Field(ge=1)
    scramble: bool = False

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        ranks = np.arange(1, self.max - self.min + 2, dtype=np.float64)
        p = ranks ** -self.theta
        p /= p.sum()
        k = rng.choice(len(ranks), size=n, p=p)
        if self.scramble:
            k = np.random.default_rng(0).permutation(len(ranks))[k]
        return (self.min + k).astype(np.int64)


class EmpiricalDist(_Dist):
    """Resample observed lengths: a list in the YAML, or a column of a CSV file."""

    kind: Literal["empirical"] = "empirical"
    values: list[int] | None = None
    path: str | None = None
    column: str | None = None

    @model_validator(mode="after")
    def _source(self) -> EmpiricalDist:
        if (self.values is None) == (self.path is None):
            raise ValueError("give exactly one of 'values' or 'path' (+ 'column')")
        if self.path is not None and not self.column:
            raise ValueError("'column' is required with 'path'")
        return self

    def observed(self) -> np.ndarray:
        if self.values is not None:
            return np.asarray(self.values, dtype=np.int64)
        import pandas as pd

        path = Path(self.path)
        if not path.exists():
            raise InputError(f"empirical.path: file not found: {path}")
        head = pd.read_csv(path, nrows=0)
        if self.column not in head.columns:
            raise InputError(
                f"{path}: missing column '{self.column}' (have: {', '.join(head.columns)})"
            )
        col = pd.to_numeric(pd.read_csv(path, usecols=[self.column])[self.column], errors="coerce")
        bad = col.isna() | (col < 1)
        if bad.any():
            line = int(np.argmax(bad.to_numpy())) + 2
            raise InputError(f"{path} line {line}, column {self.column}: not a positive integer")
        return col.to_numpy(dtype=np.int64)

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        data = self.observed()
        return self._clip(data[rng.integers(0, len(data), size=n)])


class MixtureComponent(BaseModel):
    model_config = ConfigDict(extra="forbid", defer_build=True)
    weight: float = Field(gt=0)
    dist: LengthDist


class MixtureDist(_Dist):
    """A weighted mixture, e.g. 60% short answers, 30% medium, 10% long."""

    kind: Literal["mixture"] = "mixture"
    components: list[MixtureComponent] = Field(min_length=1)

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        w = np.array([c.weight for c in self.components])
        pick = rng.choice(len(w), size=n, p=w / w.sum())
        out = np.empty(n, dtype=np.int64)
        for i, comp in enumerate(self.components):
            mask = pick == i
            out[mask] = comp.dist.sample(rng, int(mask.sum()))
        return self._clip(out)


LengthDist = Annotated[
    Union[FixedDist, UniformDist, LognormalDist, ZipfDist, EmpiricalDist, MixtureDist],  # noqa: UP007
    Field(discriminator="kind"),
]
