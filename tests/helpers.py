"""Small builders shared by the tests."""

from __future__ import annotations

from sim.config import Scenario, validate


def scenario(**overrides) -> Scenario:
    data = {
        "model": "llama3-8b",
        "hardware": "h200",
        "workload": {"num_requests": 50, "arrival": {"kind": "poisson", "rate": 10}},
    }
    for key, value in overrides.items():
        node = data
        parts = key.split("__")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = value
    return validate(data, "test")
