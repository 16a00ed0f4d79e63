"""Registry of scheduling policies: ``POLICIES[name]`` is a Policy class.

Adding a policy is a new module with ``@register_policy("name")`` and an import below; the
engine and the scheduler loop do not change.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from sim.core.policies.base import Policy, PolicyParams
from sim.errors import InputError

POLICIES: dict[str, type[Policy]] = {}


def register_policy(name: str):
    def wrap(cls: type[Policy]) -> type[Policy]:
        cls.name = name
        POLICIES[name] = cls
        return cls

    return wrap


def make_policy(name: str, params: dict[str, Any] | None = None) -> Policy:
    try:
        cls = POLICIES[name]
    except KeyError:
        raise InputError(
            f"policy.name: unknown policy '{name}'; allowed: {', '.join(sorted(POLICIES))}"
        ) from None
    try:
        parsed = cls.Params(**(params or {}))
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(p) for p in err["loc"])
        allowed = ", ".join(cls.Params.model_fields) or "none"
        raise InputError(
            f"policy.{loc}: {err['msg']} (policy '{name}' takes: {allowed})"
        ) from None
    return cls(parsed)


# Policy modules register themselves on import.
from sim.core.policies import (  # noqa: E402,F401
    class_budget,
    continuous,
    edf,
    fair,
    lpm,
    orca,
    priority,
    sarathi,
    sjf,
    static,
)

__all__ = ["POLICIES", "Policy", "PolicyParams", "make_policy", "register_policy"]
