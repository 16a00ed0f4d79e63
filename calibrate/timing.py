"""Time step shapes on the backend: real requests holding real KV blocks, run by the ModelRunner.

Each shape becomes a StepPlan of requests whose block tables come from a BlockManager, exactly
as the scheduler would hand it over; ``ModelRunner.execute`` times it (CUDA events on a GPU, a
monotonic clock on a CPU). Warm-up runs first (Triton compiles, caches fill), then repeats, and
the median is the shape's step time. Re-running a plan is harmless: the runner writes the same
KV slots again and samples, but nothing is accepted, so requests do not advance.

``engine_overhead`` measures what the timed forward does not include but a served step does:
the scheduler, token bookkeeping and records around each step of the wall-clock engine.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import numpy as np

from calibrate.grid import StepShape
from sim.core.blocks import BlockManager
from sim.core.plan import StepPlan
from sim.core.request import Request


@dataclass
class Backend:
    """A runner with its KV cache, and the BlockManager that hands out the cache's blocks."""

    runner: object  # gpu_backend.runner.ModelRunner
    blocks: BlockManager
    model: str
    device: str
    attention: str
    cuda_graphs: bool
    max_model_len: int
    max_batch: int

    @property
    def kv_tokens(self) -> int:
        return self.blocks.num_blocks * self.blocks.block_size


def build_backend(model: str, device: str | None = None, *, block_size: int = 16,
                  num_blocks: int | None = None, attention: str | None = None,
                  cuda_graphs: bool | None = None, max_batch: int = 256, seed: int = 0,
                  gpu_memory_utilization: float = 0.9, activation_reserve_gb: float = 2.0) -> Backend:
    """The model (random weights), a paged KV cache and a runner, built as ``replay`` builds them."""
    import torch

    from gpu_backend.kv_cache import PagedKVCache, num_blocks_for_memory
    from gpu_backend.runner import ModelRunner
    from gpu_backend.weights import build_model
    from sim.cost.presets import get_model

    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    spec = get_model(model)
    net = build_model(spec, dev, seed=seed, attention=attention)
    if num_blocks is None:
        num_blocks = num_blocks_for_memory(spec, block_size, net.dtype, gpu_memory_utilization,
                                           int(activation_reserve_gb * 1e9))
    cache = PagedKVCache.allocate(spec, num_blocks, block_size, net.dtype, dev)
    runner = ModelRunner(net, cache, prompt_seed=seed, cuda_graphs=cuda_graphs,
                         max_graph_batch=max_batch, max_model_len=spec.max_model_len)
    return Backend(runner, BlockManager(num_blocks, block_size), model, dev.type, net.attention.name,
                   runner.decode_graphs is not None and dev.type == "cuda", spec.max_model_len, max_batch)


class _Ids:
    next = 0


def _requests(backend: Backend, shape: StepShape) -> list[tuple[Request, int]]:
    """Requests in the state the shape needs, their blocks allocated: (request, new positions)."""
    from gpu_backend.runner import StepOutput

    runner, blocks = backend.runner, backend.blocks
    out = []
    for n, prior in shape.prefill:
        _Ids.next += 1
        req = Request(_Ids.next, 0.0, prior + n, 1)
        req.num_computed_tokens = prior
        out.append((req, n))
    for prior in shape.decode:
        _Ids.next += 1
        req = Request(_Ids.next, 0.0, prior, 2)
        runner.token_ids(req)
        # One generated token, accepted through the runner's own path, so it has the id to feed.
        req.num_output_tokens = 1
        runner.accept(StepOutput([(req, 0)], 0.0, 0, False))
        req.num_computed_tokens = prior
        out.append((req, 1))
    for req, n in out:
        if not blocks.allocate(req, req.num_computed_tokens + n):
            for r, _ in out:
                blocks.free(r)
                runner.release(r)
            raise ValueError(f"shape '{shape.key}' needs more KV blocks than the cache has")
    return out


def time_shape(backend: Backend, shape: StepShape, *, warmup: int = 2, repeats: int = 7,
               max_rounds: int = 4) -> dict:
    """One measured point: the shape's features and the median of ``repeats`` timed steps."""
    entries = _requests(backend, shape)
    plan = StepPlan()
    for req, n in entries:
        plan.add(req, n)
    try:
        for _ in range(warmup):
            backend.runner.execute(plan)
        samples = [backend.runner.execute(plan).elapsed_s for _ in range(repeats)]
        # A noisy machine (other processes on a shared CPU): more samples until the middle half
        # is within 25% of the median, at most ``max_rounds`` times as many.
        for _ in range(max_rounds - 1):
            q1, med, q3 = np.percentile(samples, (25, 50, 75))
            if q3 - q1 <= 0.25 * med:
                break
            samples += [backend.runner.execute(plan).elapsed_s for _ in range(repeats)]
    finally:
        for req, _ in entries:
            backend.runner.release(req)
            backend.blocks.free(req)
    return {
        "key": shape.key,
        "region": shape.region,
        "prefill": [list(p) for p in shape.prefill],
        "decode_batch": len(shape.decode),
        "decode_ctx": sorted(set(shape.decode)),
        "features": list(shape.features()),
        "median_s": statistics.median(samples),
        "samples_s": samples,
    }


def engine_overhead(backend: Backend, *, requests: int = 32, seed: int = 1) -> dict:
    """Host time per engine step beyond the timed forward, fitted as a + b × sequences.

    Replays a burst of requests (all at t=0, so the engine never idles) through the
    wall-clock engine on this backend's runner; each step's cycle (one step start to the
    next) minus the runner's measured step time is host work the simulator must charge.
    """
    from gpu_backend.engine import GpuEngine
    from sim.config import validate
    from sim.workload.table import RequestTable

    rng = np.random.default_rng(seed)
    max_len = min(backend.max_model_len, 1024)
    prompts = rng.integers(16, max_len // 4, size=requests)
    outputs = rng.integers(8, 48, size=requests)
    table = RequestTable(arrival=np.zeros(requests), prompt_len=prompts.astype(np.int64),
                         max_tokens=outputs.astype(np.int64))
    runner = backend.runner
    sc = validate({
        "name": "engine-overhead-probe", "model": backend.model, "hardware": "cpu",
        "cost_model": {"kind": "roofline"},
        "engine": {"block_size": backend.blocks.block_size,
                   "num_gpu_blocks_override": runner.kv_cache.num_blocks,
                   "max_num_seqs": min(requests, backend.max_batch), "max_num_batched_tokens": 512},
        "simulation": {"record_steps": True},
        "workload": {"requests": [{"prompt_len": 1, "max_tokens": 1}]},
    }, "engine overhead probe")
    engine = GpuEngine(sc, table, runner)
    res = engine.run()
    steps = res.steps or []
    device = engine.device_step_s
    cycles, seqs = [], []
    for i in range(1, len(steps) - 1):  # the first step pays warm-up; the last has no successor
        cycle = steps[i + 1].start - steps[i].start
        cycles.append(cycle - device[i])
        seqs.append(len(steps[i].batch))
    if not cycles:
        return {"per_step_s": 0.0, "per_seq_s": 0.0, "steps": 0}
    from calibrate.fit import fit_nonnegative

    x = np.column_stack([np.ones(len(seqs)), np.array(seqs, dtype=float)])
    y = np.maximum(np.array(cycles), 1e-7)
    # Absolute (not relative) least squares on the median-filtered overhead: robust to GC spikes.
    keep = y <= np.percentile(y, 95)
    coef = fit_nonnegative(x[keep], y[keep], relative=False)
    return {"per_step_s": float(coef[0]), "per_seq_s": float(coef[1]), "steps": int(keep.sum()),
            "median_s": float(np.median(y))}


