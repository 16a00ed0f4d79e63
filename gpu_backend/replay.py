"""Replay a scenario's workload on the real backend: the scenario's scheduler, a real model.

The scheduler is built by `sim.build` exactly as the simulator builds it, so a knob means the
same thing in both; only the KV block count comes from the device (unless overridden).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from gpu_backend.engine import GpuEngine, ReplayResult
from gpu_backend.kv_cache import PagedKVCache, num_blocks_for_memory
from gpu_backend.runner import ModelRunner
from gpu_backend.sampling import SamplingParams
from gpu_backend.weights import build_model
from sim.build import build_scheduler, scheduler_config
from sim.config import Scenario
from sim.core.request import Request
from sim.cost.presets import get_model
from sim.workload.table import RequestTable


def requests_from_table(table: RequestTable, record_token_times: bool = False) -> list[Request]:
    """One Request per row, built as the simulator's arrival process builds them."""
    out = []
    for i in range(len(table)):
        out.append(Request(
            i, float(table.arrival[i]), int(table.prompt_len[i]), int(table.max_tokens[i]),
            tenant="default" if table.tenant is None else str(table.tenant[i]),
            cls="default" if table.cls is None else str(table.cls[i]),
            priority=0 if table.priority is None else int(table.priority[i]),
            hash_ids=None if table.hash_ids is None else table.hash_ids[i],
            session=None if table.session is None else table.session[i],
            record_token_times=record_token_times,
        ))
    return out


def build_engine(sc: Scenario, device: str | torch.device | None = None, *, weights: str | Path | None = None,
                 attention: str | None = None, sampling: SamplingParams | None = None,
                 cuda_graphs: bool | None = None) -> GpuEngine:
    """Model, KV cache, runner and the scenario's scheduler, ready to replay."""
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    cfg = scheduler_config(sc)
    # The rotary table must reach the scenario's max_model_len, which may exceed the preset's.
    spec = dataclasses.replace(get_model(sc.model), max_model_len=cfg.max_model_len)
    model = build_model(spec, device, seed=sc.seed, weights=weights, attention=attention)
    e = sc.engine
    num_blocks = e.num_gpu_blocks_override
    if num_blocks is None:
        num_blocks = num_blocks_for_memory(spec, e.block_size, model.dtype, e.gpu_memory_utilization,
                                           int(e.activation_reserve_gb * 1e9))
    cache = PagedKVCache.allocate(spec, num_blocks, e.block_size, model.dtype, device)
    runner = ModelRunner(model, cache, sampling=sampling, prompt_seed=sc.seed, cuda_graphs=cuda_graphs,
                         max_graph_batch=min(e.max_num_seqs, 512), max_model_len=cfg.max_model_len)
    return GpuEngine(build_scheduler(sc, num_blocks), runner,
                     timeseries_interval_s=sc.simulation.timeseries_interval_s)


def replay(sc: Scenario, table: RequestTable | None = None, device: str | torch.device | None = None,
           **engine_kwargs) -> ReplayResult:
    """Run the scenario's workload (or `table`) in real time on the backend."""
    from sim.workload.spec import build_workload

    if table is None:
        table = build_workload(sc.workload, sc.seed)
    engine = build_engine(sc, device, **engine_kwargs)
    requests = requests_from_table(table, sc.simulation.record_token_times)
    return engine.run(requests, horizon_s=sc.simulation.horizon_s)
