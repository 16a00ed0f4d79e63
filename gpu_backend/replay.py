"""Replay a scenario's workload on the real backend: the scenario's engine, a real model.

Everything but the step times comes from the scenario exactly as the simulator reads it
(`GpuEngine` is the simulator's engine); the KV block count comes from the device unless
`engine.num_gpu_blocks_override` is set.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from gpu_backend.engine import GpuEngine, ReplayResult, TokenCallback
from gpu_backend.kv_cache import PagedKVCache, num_blocks_for_memory
from gpu_backend.runner import ModelRunner
from gpu_backend.sampling import SamplingParams
from gpu_backend.weights import build_model
from sim.build import scheduler_config
from sim.config import Scenario
from sim.cost.presets import get_model
from sim.workload.table import RequestTable


def build_engine(sc: Scenario, table: RequestTable, device: str | torch.device | None = None, *,
                 weights: str | Path | None = None, attention: str | None = None,
                 sampling: SamplingParams | None = None, cuda_graphs: bool | None = None,
                 on_token: TokenCallback | None = None) -> GpuEngine:
    """Model, KV cache and runner for `sc`, inside the simulator's engine, ready to run."""
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    max_model_len = scheduler_config(sc).max_model_len
    # The rotary table must reach the scenario's max_model_len, which may exceed the preset's.
    spec = dataclasses.replace(get_model(sc.model), max_model_len=max_model_len)
    model = build_model(spec, device, seed=sc.seed, weights=weights, attention=attention)
    e = sc.engine
    num_blocks = e.num_gpu_blocks_override
    if num_blocks is None:
        num_blocks = num_blocks_for_memory(spec, e.block_size, model.dtype, e.gpu_memory_utilization,
                                           int(e.activation_reserve_gb * 1e9))
    cache = PagedKVCache.allocate(spec, num_blocks, e.block_size, model.dtype, device)
    runner = ModelRunner(model, cache, sampling=sampling, prompt_seed=sc.seed, cuda_graphs=cuda_graphs,
                         max_graph_batch=min(e.max_num_seqs, 512), max_model_len=max_model_len,
                         prefix_block_tokens=e.prefix_block_tokens)
    return GpuEngine(sc, table, runner, on_token=on_token)


def replay(sc: Scenario, table: RequestTable | None = None, device: str | torch.device | None = None,
           **engine_kwargs) -> ReplayResult:
    """Run the scenario's workload (or `table`) in real time on the backend."""
    from sim.workload.spec import build_workload

    if table is None:
        table = build_workload(sc.workload, sc.seed)
    return build_engine(sc, table, device, **engine_kwargs).run()
