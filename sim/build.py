"""Turn a validated Scenario into the shared pieces: scheduler config, blocks, policy, cost model.

Both the SimPy engine and the GPU engine build their replicas here, so a knob means the same
thing in both.
"""

from __future__ import annotations

from sim.config import Scenario
from sim.core.admission import AdmissionController
from sim.core.blocks import BlockManager, derive_num_blocks
from sim.core.policies import make_policy
from sim.core.prefix_cache import PrefixCachingBlockManager
from sim.core.scheduler import Scheduler, SchedulerConfig
from sim.core.swap import SwapSpace, swap_capacity_blocks, swap_seconds_per_block
from sim.cost import make_cost_model
from sim.cost.presets import get_hardware, get_model
from sim.errors import InputError


def scheduler_config(sc: Scenario) -> SchedulerConfig:
    e = sc.engine
    model = get_model(sc.model)
    return SchedulerConfig(
        max_num_seqs=e.max_num_seqs,
        max_num_batched_tokens=e.max_num_batched_tokens,
        enable_chunked_prefill=e.enable_chunked_prefill,
        long_prefill_token_threshold=e.long_prefill_token_threshold,
        max_model_len=e.max_model_len or model.max_model_len,
        preemption_mode=e.preemption_mode,
    )


def num_kv_blocks(sc: Scenario) -> int:
    e = sc.engine
    if e.num_gpu_blocks_override is not None:
        return e.num_gpu_blocks_override
    model = get_model(sc.model)
    hw = get_hardware(sc.hardware)
    return derive_num_blocks(
        memory_bytes=hw.memory_bytes,
        gpu_memory_utilization=e.gpu_memory_utilization,
        weight_bytes=model.weight_bytes,
        activation_reserve_bytes=int(e.activation_reserve_gb * 1e9),
        kv_bytes_per_token=model.kv_bytes_per_token,
        block_size=e.block_size,
    )


def build_blocks(sc: Scenario, num_blocks: int | None = None) -> BlockManager:
    e = sc.engine
    n = num_blocks or num_kv_blocks(sc)
    if e.enable_prefix_caching:
        return PrefixCachingBlockManager(n, e.block_size, e.prefix_block_tokens)
    return BlockManager(n, e.block_size)


def build_swap(sc: Scenario) -> SwapSpace | None:
    e = sc.engine
    if e.preemption_mode != "swap":
        return None
    kv = get_model(sc.model).kv_bytes_per_token
    return SwapSpace(swap_capacity_blocks(e.swap_space_gb, e.block_size, kv))


def swap_seconds_per_block_of(sc: Scenario) -> float:
    """Seconds to copy one KV block between GPU and host over the hardware's host link."""
    return swap_seconds_per_block(sc.engine.block_size, get_model(sc.model).kv_bytes_per_token,
                                  get_hardware(sc.hardware).host_link_bandwidth)


def build_scheduler(sc: Scenario, num_blocks: int | None = None) -> Scheduler:
    blocks = build_blocks(sc, num_blocks)
    policy = make_policy(sc.policy.name, sc.policy.params)
    sched = Scheduler(scheduler_config(sc), blocks, policy, swap=build_swap(sc))
    if sc.admission is not None:
        background = frozenset(c.name for c in sc.workload.classes or [] if c.background)
        sched.admission = AdmissionController(sc.admission, background)
    return sched


def build_cost_model(sc: Scenario):
    return make_cost_model(
        sc.cost_model.kind, get_model(sc.model), get_hardware(sc.hardware), sc.cost_model.path
    )


def check_explicit_requests(sc: Scenario, sched: Scheduler) -> None:
    """Requests the user listed one by one must fit the engine: that is a scenario error.

    Generated and replayed traffic is different: a request that can never fit is rejected at
    arrival with its reason, as a server would, and counted.
    """
    for i, req in enumerate(sc.workload.requests or []):
        total = req.prompt_len + req.max_tokens
        if total > sched.config.max_model_len:
            raise InputError(
                f"workload.requests[{i}]: prompt_len + max_tokens = {total} exceeds "
                f"max_model_len = {sched.config.max_model_len}; shorten it or raise engine.max_model_len"
            )
        capacity = sched.blocks.num_blocks * sched.blocks.block_size
        if total > capacity:
            raise InputError(
                f"workload.requests[{i}]: prompt_len + max_tokens = {total} tokens is larger than "
                f"the KV cache ({capacity} tokens); raise engine.num_gpu_blocks_override or "
                "gpu_memory_utilization"
            )
