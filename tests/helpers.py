"""Small builders shared by the tests."""

from __future__ import annotations

from sim.config import Scenario, validate


def scenario(**overrides) -> Scenario:
    data = {
        "model": "llama3-8b",
        "hardware": "h200",
        "workload": {"num_requests": 50, "arrival": {"kind": "poisson", "rate": 10}},
    }
    return validate(with_overrides(data, **overrides), "test")


def with_overrides(data: dict, **overrides) -> dict:
    """``engine__max_num_seqs=8`` sets ``data["engine"]["max_num_seqs"] = 8`` (in place)."""
    for key, value in overrides.items():
        node = data
        parts = key.split("__")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = value
    return data
