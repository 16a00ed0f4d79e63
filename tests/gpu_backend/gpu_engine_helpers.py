"""Builders for the engine tests: a tiny-model scenario, its request table, an engine on CPU."""

from __future__ import annotations

from typing import Any

import numpy as np

from sim.config import Scenario, validate
from sim.cost.presets import MODELS
from sim.workload.table import RequestTable

SPEC = MODELS["tiny"]
BLOCK = 4
SEED = 11


def tiny_scenario(policy: str = "continuous", blocks: int = 512, chunked: bool = True, budget: int = 2048,
                  max_seqs: int = 256, **top: Any) -> Scenario:
    engine = {"block_size": BLOCK, "num_gpu_blocks_override": blocks, "enable_chunked_prefill": chunked,
              "max_num_batched_tokens": budget, "max_num_seqs": max_seqs, **top.pop("engine", {})}
    data = {"model": "tiny", "hardware": "cpu", "seed": SEED, "cost_model": {"kind": "roofline"},
            "engine": engine, "policy": {"name": policy},
            "workload": {"requests": [{"prompt_len": 1, "max_tokens": 1}]}, **top}
    return validate(data, "test")


def request_table(rows: list[tuple[float, int, int]], hash_ids: list | None = None) -> RequestTable:
    """(arrival, prompt_len, max_tokens) rows, in arrival order."""
    return RequestTable(
        arrival=np.array([r[0] for r in rows], dtype=np.float64),
        prompt_len=np.array([r[1] for r in rows], dtype=np.int64),
        max_tokens=np.array([r[2] for r in rows], dtype=np.int64),
        hash_ids=hash_ids,
    )
