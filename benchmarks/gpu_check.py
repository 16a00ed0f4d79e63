"""One-shot check of the real backend on a lent GPU: correctness at real sizes, step speed, serving.

    python benchmarks/gpu_check.py --out DIR            # an H200: Llama-3-8B shapes, random bf16 weights
    python benchmarks/gpu_check.py --out DIR --quick    # any CPU: the tiny model, the same phases, seconds

Phases, each under its own deadline and try/except (one failure keeps the rest):
  env       torch / triton / GPU name and memory, package versions
  ceilings  HBM copy bandwidth and bf16 matmul rate on this card (METHOD.md's two numbers)
  build     the model (random weights, built once and reused), a paged KV cache filled with random values
  kernels   Triton KV store (exact) and paged attention (‖out-ref‖/‖ref‖ vs an fp32 torch reference)
            on decode, prefill, chunked-prefill and mixed batches up to 8,192 context
  runner    the ModelRunner with its decode CUDA graphs captured (batch 1..256)
  decode    batch {1,8,32,64,128,256} x context {512,2048,8192} (what fits the cache): CUDA-graph
            replay ms/step against the HBM floor and plain torch's graph (shared/anchors), tok/s,
            and the full runner step (host preparation + sampling included)
  prefill   one sequence of 128 .. 16,384 tokens: ms and TFLOP/s against the anchors
  greedy    the full engine, Triton vs torch attention, same prompts: greedy tokens matched, and
            teacher-forced logits (relative error, argmax agreement)
  mixed     the anchors' mixed workload (128 requests at t=0) on the real engine: continuous (128),
            continuous (32) and static (32): useful tok/s, TTFT and E2E p50/p99 vs HF's

Every record is appended to DIR/gpu_check.jsonl as it is measured (a timeout keeps what was done);
DIR/summary.json and a table of the must-show targets come last.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# shared/anchors (one H200, torch 2.11 + CUDA 13, Llama-3-8B shapes, random bf16 weights).
# Decode: (batch, context) -> (plain-torch CUDA-graph ms/step, HBM floor ms at 4.25 TB/s).
ANCHOR_DECODE = {
    (1, 512): (7.009, 3.548), (8, 512): (7.502, 3.658), (32, 512): (7.906, 4.038),
    (64, 512): (8.607, 4.544), (128, 512): (11.282, 5.557), (256, 512): (14.229, 7.582),
    (1, 2048): (7.079, 3.595), (32, 2048): (9.299, 5.554), (64, 2048): (11.344, 7.576),
    (128, 2048): (16.734, 11.62), (1, 8192): (7.278, 3.784), (32, 8192): (14.787, 11.617),
}
ANCHOR_PREFILL_MS = {128: 29.328, 512: 28.477, 2048: 55.967, 8192: 247.109, 16384: 554.347}
ANCHOR_HBM_TBPS = 4.25
# HF transformers 5.17 on the mixed workload: useful tok/s, TTFT p50, E2E p50 / p99 (seconds).
ANCHOR_HF = {
    "static_32": {"useful_tok_per_s": 104.2, "e2e_p50_s": 115.29, "e2e_p99_s": 147.08},
    "continuous_32": {"useful_tok_per_s": 197.9, "ttft_p50_s": 18.808, "ttft_p99_s": 48.207,
                      "e2e_p50_s": 32.59, "e2e_p99_s": 70.6},
    "continuous_128": {"useful_tok_per_s": 312.0, "ttft_p50_s": 3.9, "ttft_p99_s": 8.5,
                       "e2e_p50_s": 16.3, "e2e_p99_s": 46.8},
}
TARGETS = {
    "decode_b1_ctx512_ms_max": 4.6,
    "decode_b128_ctx512_tok_per_s_min": 14_000,
    "continuous_useful_tok_per_s_min": 15 * 198,
}


@dataclasses.dataclass
class Config:
    model: str
    max_model_len: int
    block_size: int
    kv_cap_gib: float  # at most this much KV cache (GPU), leaving room for activations
    cpu_blocks: int  # KV blocks without a GPU (no free-memory query)
    kernel_cases: dict  # name -> [(context after the step, new tokens)]
    decode_batches: tuple
    decode_contexts: tuple
    graph_reps: int
    step_reps: int
    prefill_tokens: tuple
    greedy_requests: int
    greedy_prompt: tuple
    greedy_new: int
    greedy_first: int
    mixed_requests: int
    mixed_prompt: tuple  # median, min, max
    mixed_outputs: tuple  # (weight, lo, hi) uniform components
    mixed_runs: tuple  # (policy, max_num_seqs)
    mixed_token_budget: int
    budget_s: float
    phase_s: dict


FULL = Config(
    model="llama3-8b", max_model_len=16384, block_size=16, kv_cap_gib=96.0, cpu_blocks=4096,
    kernel_cases={
        "decode": [(1, 1), (17, 1), (512, 1), (2048, 1), (8192, 1), (1000, 1)],
        "prefill": [(128, 128), (1000, 1000), (77, 77)],
        "chunked": [(600, 88), (4101, 512), (8192, 2048)],
        "mixed": [(300, 1), (2000, 1), (700, 200), (64, 64), (8000, 1), (1500, 1000)],
    },
    decode_batches=(1, 8, 32, 64, 128, 256), decode_contexts=(512, 2048, 8192),
    graph_reps=30, step_reps=10,
    prefill_tokens=(128, 512, 2048, 8192, 16384),
    greedy_requests=4, greedy_prompt=(64, 400), greedy_new=24, greedy_first=8,
    mixed_requests=128, mixed_prompt=(400, 32, 2048),
    mixed_outputs=((0.6, 16, 64), (0.3, 64, 256), (0.1, 256, 512)),
    mixed_runs=(("continuous", 128), ("continuous", 32), ("static", 32)), mixed_token_budget=8192,
    budget_s=400.0,
    phase_s={"env": 30, "ceilings": 20, "build": 90, "kernels": 60, "runner": 90, "decode": 90,
             "prefill": 45, "greedy": 60, "mixed": 260},
)

QUICK = Config(
    model="tiny", max_model_len=2048, block_size=16, kv_cap_gib=1.0, cpu_blocks=1024,
    kernel_cases={
        "decode": [(1, 1), (17, 1), (300, 1)],
        "prefill": [(64, 64), (100, 100)],
        "chunked": [(200, 40), (513, 128)],
        "mixed": [(90, 1), (64, 64), (300, 20)],
    },
    decode_batches=(1, 8), decode_contexts=(64, 256), graph_reps=5, step_reps=3,
    prefill_tokens=(128, 512),
    greedy_requests=2, greedy_prompt=(16, 64), greedy_new=8, greedy_first=4,
    mixed_requests=24, mixed_prompt=(48, 16, 256),
    mixed_outputs=((0.6, 4, 8), (0.3, 8, 16), (0.1, 16, 32)),
    mixed_runs=(("continuous", 16), ("continuous", 4), ("static", 4)), mixed_token_budget=256,
    budget_s=300.0,  # seconds of work; generous so a loaded CI machine still finishes every run
    phase_s={"env": 30, "ceilings": 10, "build": 30, "kernels": 30, "runner": 30, "decode": 30,
             "prefill": 30, "greedy": 60, "mixed": 180},
)

PHASES = ("env", "ceilings", "build", "kernels", "runner", "decode", "prefill", "greedy", "mixed")


class Log:
    """JSON lines, flushed one by one."""

    def __init__(self, out: Path) -> None:
        out.mkdir(parents=True, exist_ok=True)
        self.path = out / "gpu_check.jsonl"
        self.file = self.path.open("w")
        self.records: list[dict] = []

    def __call__(self, **rec) -> dict:
        rec["t"] = round(time.time(), 3)
        self.file.write(json.dumps(rec, default=_plain) + "\n")
        self.file.flush()
        self.records.append(rec)
        short = {k: v for k, v in rec.items() if k not in ("t", "traceback", "env")}
        print(json.dumps(short, default=_plain)[:300], flush=True)
        return rec


def _plain(x):
    if hasattr(x, "item"):
        return x.item()
    return str(x)


class Deadline:
    def __init__(self, seconds: float) -> None:
        self.end = time.monotonic() + seconds

    @property
    def left(self) -> float:
        return self.end - time.monotonic()

    def expired(self) -> bool:
        return self.left <= 0


class Check:
    """State shared by the phases: config, device, model, cache, runner, results."""

    def __init__(self, cfg: Config, device: str, log: Log, quick: bool) -> None:
        self.cfg, self.device, self.log, self.quick = cfg, device, log, quick
        self.cuda = device.startswith("cuda")
        self.t0 = time.monotonic()
        self.model = self.cache = self.runner = self.spec = None
        self.copy_tbps: float | None = None
        self.results: dict[str, dict] = {}

    def left(self) -> float:
        return self.cfg.budget_s - (time.monotonic() - self.t0)

    def sync(self) -> None:
        if self.cuda:
            import torch

            torch.cuda.synchronize()


def run_phase(chk: Check, name: str, fn: Callable[[Check, Deadline], None]) -> None:
    budget = min(chk.cfg.phase_s[name], chk.left())
    if budget <= 1:
        chk.log(phase=name, ok=False, error="skipped: the overall budget is spent", wall_s=0.0)
        return
    t0 = time.monotonic()
    try:
        fn(chk, Deadline(budget))
    except Exception as exc:  # one phase's failure must not lose the others
        chk.log(phase=name, ok=False, error=f"{type(exc).__name__}: {exc}"[:600],
                traceback=traceback.format_exc()[-3000:], wall_s=round(time.monotonic() - t0, 2))
        return
    chk.log(phase=name, ok=True, wall_s=round(time.monotonic() - t0, 2))


# -- env and ceilings ---------------------------------------------------------------------
def phase_env(chk: Check, dl: Deadline) -> None:
    import importlib
    import platform

    import torch

    env = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
           "device": chk.device, "model": chk.cfg.model}
    for mod in ("triton", "simpy", "pydantic", "numpy", "pandas", "yaml", "transformers"):
        try:
            env[mod] = getattr(importlib.import_module(mod), "__version__", "?")
        except ImportError:
            env[mod] = None
    if chk.cuda:
        props = torch.cuda.get_device_properties(0)
        free, total = torch.cuda.mem_get_info()
        env.update(gpu=props.name, mem_GiB=round(total / 2**30, 1), free_GiB=round(free / 2**30, 1),
                   sms=props.multi_processor_count, capability=f"{props.major}.{props.minor}")
    chk.results["env"] = env
    chk.log(env=env)


def _event_ms(fn: Callable[[], None], reps: int) -> float:
    """Median ms of ``fn`` by CUDA events, after two warm-up calls."""
    import torch

    fn()
    fn()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def phase_ceilings(chk: Check, dl: Deadline) -> None:
    import torch

    if not chk.cuda:
        chk.log(metric="ceilings", skipped="no CUDA device")
        return
    n = 2 * 2**30  # 2 GiB each way
    src = torch.empty(n // 2, dtype=torch.bfloat16, device=chk.device).normal_()
    dst = torch.empty_like(src)
    ms = _event_ms(lambda: dst.copy_(src), 10)
    chk.copy_tbps = 2 * n / (ms / 1e3) / 1e12
    chk.log(metric="copy_bw_TBps", value=round(chk.copy_tbps, 3))
    src = dst = None  # free 4 GiB before the matmul
    torch.cuda.empty_cache()
    a = torch.randn(8192, 8192, dtype=torch.bfloat16, device=chk.device)
    b = torch.randn(8192, 8192, dtype=torch.bfloat16, device=chk.device)
    ms = _event_ms(lambda: a @ b, 10)
    tflops = 2 * 8192**3 / (ms / 1e3) / 1e12
    chk.results["ceilings"] = {"copy_TBps": chk.copy_tbps, "bf16_matmul_TFLOPs": tflops}
    a = b = None
    torch.cuda.empty_cache()
    chk.log(metric="bf16_matmul_TFLOPs", value=round(tflops, 1))


# -- build --------------------------------------------------------------------------------
def phase_build(chk: Check, dl: Deadline) -> None:
    import torch

    from gpu_backend.kv_cache import PagedKVCache, bytes_per_block
    from gpu_backend.weights import build_model
    from sim.cost.presets import get_model

    cfg = chk.cfg
    chk.spec = dataclasses.replace(get_model(cfg.model), max_model_len=cfg.max_model_len)
    t0 = time.monotonic()
    chk.model = build_model(chk.spec, chk.device, seed=0)
    chk.sync()
    build_s = time.monotonic() - t0
    params = sum(p.numel() for p in chk.model.parameters())
    per_block = bytes_per_block(chk.spec, cfg.block_size, chk.model.dtype)
    if chk.cuda:
        torch.cuda.empty_cache()
        free, _ = torch.cuda.mem_get_info()
        reserve = 14 * 2**30  # prefill of 16k tokens, graphs, logits, the kernel check's caches
        kv_bytes = max(min(free - reserve, cfg.kv_cap_gib * 2**30), per_block)
        num_blocks = int(kv_bytes // per_block)
    else:
        num_blocks = cfg.cpu_blocks
    t1 = time.monotonic()
    chk.cache = PagedKVCache.allocate(chk.spec, num_blocks, cfg.block_size, chk.model.dtype, chk.device)
    # Random K/V: timing never runs on zeros (METHOD.md); one layer at a time, no big temporaries.
    gen = torch.Generator(device=chk.device).manual_seed(1)
    for layer in range(chk.cache.num_layers):
        chk.cache.data[layer].normal_(0.0, 1.0, generator=gen)
    chk.sync()
    chk.results["build"] = {"params_B": params / 1e9, "model_build_s": build_s, "kv_blocks": num_blocks,
                            "kv_tokens": num_blocks * cfg.block_size,
                            "kv_GiB": num_blocks * per_block / 2**30,
                            "cache_alloc_fill_s": time.monotonic() - t1,
                            "attention": chk.model.attention.name, "dtype": str(chk.model.dtype)}
    chk.log(build=chk.results["build"])


# -- kernels ------------------------------------------------------------------------------
def phase_kernels(chk: Check, dl: Deadline) -> None:
    import torch

    from gpu_backend.attention import TorchAttention
    from gpu_backend.metadata import SequenceChunk, build_metadata

    spec, dev, bs = chk.spec, chk.device, chk.cfg.block_size
    impl = chk.model.attention
    dtype = chk.model.dtype
    ref = TorchAttention()
    tol = 1e-2 if dtype in (torch.bfloat16, torch.float16) else 1e-4
    gen = torch.Generator(device=dev).manual_seed(7)
    worst = 0.0
    all_ok = True
    for name, seqs in chk.cfg.kernel_cases.items():
        if dl.expired():
            chk.log(kernel=name, skipped="deadline")
            all_ok = False
            continue
        need = sum(-(-ctx // bs) for ctx, _ in seqs)
        num_blocks = need + 8
        perm = torch.randperm(num_blocks, generator=torch.Generator().manual_seed(len(name))).tolist()
        chunks, used = [], 0
        for ctx, new in seqs:
            nb = -(-ctx // bs)
            chunks.append(SequenceChunk(ctx - new, new, perm[used: used + nb]))
            used += nb
        positions, meta = build_metadata(chunks, bs, dev)
        tokens = positions.shape[0]
        shape = (num_blocks, bs, spec.num_kv_heads, spec.head_dim)
        kc = torch.randn(shape, dtype=dtype, device=dev, generator=gen)
        vc = torch.randn(shape, dtype=dtype, device=dev, generator=gen)
        k = torch.randn((tokens, spec.num_kv_heads, spec.head_dim), dtype=dtype, device=dev, generator=gen)
        v = torch.randn_like(k)
        q = torch.randn((tokens, spec.num_heads, spec.head_dim), dtype=dtype, device=dev, generator=gen)
        # Store: exact against the reference; the last token is padding (slot -1): nothing stored.
        slots = meta.slot_mapping.clone()
        slots[-1] = -1
        kc_ref, vc_ref = kc.clone(), vc.clone()
        ref.store_kv(k, v, kc_ref, vc_ref, slots)
        impl.store_kv(k, v, kc, vc, slots)
        chk.sync()
        store_exact = bool(torch.equal(kc, kc_ref) and torch.equal(vc, vc_ref))
        # Now the real step: every new token stored, then attention over the cache.
        impl.store_kv(k, v, kc, vc, meta.slot_mapping)
        scale = spec.head_dim ** -0.5
        out = impl.attend(q, kc, vc, meta, scale)
        chk.sync()
        wide = torch.float32 if chk.cuda else torch.float64  # the reference in higher precision
        expect = ref.attend(q.to(wide), kc.to(wide), vc.to(wide), meta, scale)
        finite = bool(torch.isfinite(out).all())
        rel = float((out.to(expect.dtype) - expect).norm() / expect.norm())
        ok = store_exact and finite and rel <= tol
        all_ok &= ok
        worst = max(worst, rel)
        chk.log(kernel=name, impl=impl.name, seqs=[list(s) for s in seqs], tokens=tokens,
                store_exact=store_exact, finite=finite, rel_err=rel, tol=tol, ok=ok)
        del kc, vc, kc_ref, vc_ref, k, v, q, out, expect
    chk.results["kernels"] = {"impl": impl.name, "worst_rel_err": worst, "tol": tol, "ok": all_ok}


# -- runner, decode, prefill --------------------------------------------------------------
def phase_runner(chk: Check, dl: Deadline) -> None:
    from gpu_backend.runner import ModelRunner

    t0 = time.monotonic()
    chk.runner = ModelRunner(chk.model, chk.cache, max_graph_batch=max(chk.cfg.decode_batches + (
        max(n for _, n in chk.cfg.mixed_runs),)), max_model_len=chk.spec.max_model_len)
    chk.sync()
    graphs = chk.runner.decode_graphs
    chk.results["runner"] = {"capture_s": time.monotonic() - t0,
                             "graph_sizes": sorted(graphs.graphs) if graphs is not None else []}
    chk.log(runner=chk.results["runner"])


class _Ids:
    next = 1_000_000


def _decode_requests(chk: Check, blocks, batch: int, context: int) -> list:
    """``batch`` requests one decode step from ``context`` positions, blocks allocated."""
    from gpu_backend.runner import StepOutput
    from sim.core.request import Request

    reqs = []
    for _ in range(batch):
        _Ids.next += 1
        req = Request(_Ids.next, 0.0, context - 1, 2)
        chk.runner.token_ids(req)
        req.num_output_tokens = 1
        chk.runner.accept(StepOutput([(req, 0)], 0.0, 0, False))
        req.num_computed_tokens = context - 1
        if not blocks.allocate(req, context):
            _release(chk, blocks, [*reqs, req])
            return []
        reqs.append(req)
    return reqs


def _release(chk: Check, blocks, reqs: list) -> None:
    for r in reqs:
        chk.runner.release(r)
        blocks.free(r)


def _kv_bytes(spec, tokens: int) -> int:
    return tokens * 2 * spec.num_layers * spec.num_kv_heads * spec.head_dim * 2  # bf16


def phase_decode(chk: Check, dl: Deadline) -> None:
    from gpu_backend.decode_graphs import bucket_for
    from sim.core.blocks import BlockManager
    from sim.core.plan import StepPlan

    cfg, spec, runner = chk.cfg, chk.spec, chk.runner
    blocks = BlockManager(chk.cache.num_blocks, cfg.block_size)
    params = sum(p.numel() for p in chk.model.parameters())
    streamed = (params - spec.vocab_size * spec.hidden_size) * 2  # the embedding reads one row
    rows = []
    for context in cfg.decode_contexts:
        for batch in cfg.decode_batches:
            if dl.left < 3:
                chk.log(decode=[batch, context], skipped="deadline")
                continue
            if batch * context > blocks.num_blocks * cfg.block_size:
                chk.log(decode=[batch, context], skipped="KV cache too small")
                continue
            reqs = _decode_requests(chk, blocks, batch, context)
            if not reqs:
                chk.log(decode=[batch, context], skipped="KV cache too small")
                continue
            plan = StepPlan()
            for r in reqs:
                plan.add(r, 1)
            try:
                for _ in range(2):
                    runner.execute(plan)
                step_ms = statistics.median(
                    runner.execute(plan).elapsed_s for _ in range(cfg.step_reps)) * 1e3
                graph_ms = None
                graphs = runner.decode_graphs
                if chk.cuda and graphs is not None and graphs.graphs:
                    graph = graphs.graphs[bucket_for(batch, graphs.sizes)]
                    runner.execute(plan)  # the graph's buffers hold this batch
                    graph_ms = _event_ms(graph.replay, cfg.graph_reps)
            finally:
                _release(chk, blocks, reqs)
            floor_ms = (streamed + _kv_bytes(spec, batch * context)) / (ANCHOR_HBM_TBPS * 1e12) * 1e3
            anchor = ANCHOR_DECODE.get((batch, context)) if cfg.model == "llama3-8b" else None
            ms = graph_ms if graph_ms is not None else step_ms
            row = {"batch": batch, "ctx": context, "graph_ms": graph_ms, "step_ms": step_ms,
                   "tok_per_s": batch / ms * 1e3, "step_tok_per_s": batch / step_ms * 1e3,
                   "hbm_floor_ms": anchor[1] if anchor else floor_ms,
                   "torch_graph_ms": anchor[0] if anchor else None}
            row["vs_floor"] = ms / row["hbm_floor_ms"]
            if chk.copy_tbps:
                row["floor_ms_measured_bw"] = (streamed + _kv_bytes(spec, batch * context)) / (
                    chk.copy_tbps * 1e12) * 1e3
            rows.append(row)
            chk.log(bench="decode", **row)
    chk.results["decode"] = {"rows": rows}


def phase_prefill(chk: Check, dl: Deadline) -> None:
    from sim.core.blocks import BlockManager
    from sim.core.plan import StepPlan
    from sim.core.request import Request

    cfg, spec, runner = chk.cfg, chk.spec, chk.runner
    blocks = BlockManager(chk.cache.num_blocks, cfg.block_size)
    params = sum(p.numel() for p in chk.model.parameters())
    flops_per_token = 2 * (params - spec.vocab_size * spec.hidden_size)
    rows = []
    for n in cfg.prefill_tokens:
        if dl.left < 3 or n > spec.max_model_len:
            chk.log(prefill=n, skipped="deadline" if dl.left < 3 else "over max_model_len")
            continue
        _Ids.next += 1
        req = Request(_Ids.next, 0.0, n, 1)
        runner.token_ids(req)
        if not blocks.allocate(req, n):
            chk.log(prefill=n, skipped="KV cache too small")
            continue
        plan = StepPlan()
        plan.add(req, n)
        try:
            runner.execute(plan)
            reps = 2 if n >= 8192 else 4
            ms = statistics.median(runner.execute(plan).elapsed_s for _ in range(reps)) * 1e3
        finally:
            _release(chk, blocks, [req])
        anchor = ANCHOR_PREFILL_MS.get(n) if cfg.model == "llama3-8b" else None
        row = {"tokens": n, "ms": ms, "tflops": flops_per_token * n / (ms / 1e3) / 1e12, "torch_ms": anchor}
        rows.append(row)
        chk.log(bench="prefill", **row)
    chk.results["prefill"] = {"rows": rows}


# -- greedy: the engine with Triton vs torch attention -------------------------------------
def _scenario(chk: Check, policy: str, max_num_seqs: int, token_budget: int, horizon: float | None,
              record_steps: bool = False):
    from sim.config import validate

    return validate({
        "name": f"gpu_check_{policy}_{max_num_seqs}", "seed": 0, "model": chk.cfg.model,
        "hardware": "h200" if chk.cuda else "cpu", "cost_model": {"kind": "roofline"},
        "engine": {"block_size": chk.cfg.block_size, "num_gpu_blocks_override": chk.cache.num_blocks,
                   "max_num_seqs": max_num_seqs, "max_num_batched_tokens": token_budget,
                   "max_model_len": min(chk.spec.max_model_len, 8192)},
        "policy": {"name": policy},
        "simulation": {"horizon_s": horizon, "record_steps": record_steps},
        "workload": {"requests": [{"prompt_len": 1, "max_tokens": 1}]},
    }, "gpu_check")


def phase_greedy(chk: Check, dl: Deadline) -> None:
    import numpy as np
    import torch

    from gpu_backend.attention import TorchAttention
    from gpu_backend.engine import GpuEngine
    from gpu_backend.metadata import SequenceChunk, build_metadata
    from gpu_backend.runner import ModelRunner, prompt_token_ids
    from sim.core.request import Request
    from sim.workload.table import RequestTable

    cfg, model = chk.cfg, chk.model
    rng = np.random.default_rng(5)
    n = cfg.greedy_requests
    prompts = rng.integers(cfg.greedy_prompt[0], cfg.greedy_prompt[1] + 1, size=n)
    table = RequestTable(arrival=np.zeros(n), prompt_len=prompts.astype(np.int64),
                         max_tokens=np.full(n, cfg.greedy_new, dtype=np.int64))
    fast = model.attention
    tokens: dict[str, dict[int, list[int]]] = {}
    sc = _scenario(chk, "continuous", n, 8192, max(dl.left - 5, 1.0))
    try:
        for label in ("impl", "torch"):
            if label == "torch":
                model.attention = TorchAttention()
                runner = ModelRunner(model, chk.cache, cuda_graphs=False,
                                     max_model_len=chk.spec.max_model_len)
            else:
                runner = chk.runner
            tokens[label] = GpuEngine(sc, table, runner).run().tokens
    finally:
        model.attention = fast
    first = cfg.greedy_first
    prefix, same_first, match = [], 0, []
    for i in range(n):
        a, b = tokens["impl"].get(i, []), tokens["torch"].get(i, [])
        k = next((j for j, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
        prefix.append(k)
        same_first += a[:first] == b[:first] and len(a) >= first
        match += [x == y for x, y in zip(a, b, strict=False)]
    # Teacher-forced: the same ids through both backends, logits at every position.
    probe = Request(0, 0.0, int(prompts[0]), 1)
    ids = prompt_token_ids(probe, chk.runner.prompt_seed, chk.spec.vocab_size,
                           chk.runner.prefix_block_tokens) + tokens["impl"].get(0, [])
    length = len(ids)
    table_blocks = list(range(-(-length // cfg.block_size)))
    positions, meta = build_metadata([SequenceChunk(0, length, table_blocks)], cfg.block_size, chk.device)
    meta.last_token_indices = torch.arange(length, device=chk.device)
    x = torch.tensor(ids, dtype=torch.int64, device=chk.device)
    logits = {}
    try:
        for label, backend in (("impl", fast), ("torch", TorchAttention())):
            model.attention = backend
            logits[label] = model(x, positions, chk.cache, meta)
    finally:
        model.attention = fast
    rel = float((logits["impl"] - logits["torch"]).norm() / logits["torch"].norm())
    agree = float((logits["impl"].argmax(-1) == logits["torch"].argmax(-1)).float().mean())
    res = {"impl": fast.name, "requests": n, "new_tokens": cfg.greedy_new,
           "first_n": first, "requests_same_first_n": int(same_first),
           "token_match_fraction": float(np.mean(match)) if match else 0.0,
           "prefix_match": prefix, "logits_rel_err": rel, "argmax_agree": agree,
           "ok": rel <= 5e-2 and agree >= 0.9}
    chk.results["greedy"] = res
    chk.log(greedy=res)


# -- the anchors' mixed workload on the real engine ----------------------------------------
def mixed_table(cfg: Config, seed: int = 0):
    """128 requests at t=0: prompts lognormal (median 400, 32-2048), outputs 60/30/10 uniform."""
    import numpy as np

    from sim.workload.table import RequestTable

    rng = np.random.default_rng(seed)
    n = cfg.mixed_requests
    median, lo, hi = cfg.mixed_prompt
    prompts = np.clip(np.round(rng.lognormal(math.log(median), 0.7, size=n)), lo, hi).astype(np.int64)
    weights = np.array([w for w, _, _ in cfg.mixed_outputs])
    which = rng.choice(len(weights), size=n, p=weights / weights.sum())
    outputs = np.array([rng.integers(cfg.mixed_outputs[c][1], cfg.mixed_outputs[c][2] + 1) for c in which],
                       dtype=np.int64)
    return RequestTable(arrival=np.zeros(n), prompt_len=prompts, max_tokens=outputs)


def phase_mixed(chk: Check, dl: Deadline) -> None:
    import numpy as np

    from gpu_backend.engine import GpuEngine

    cfg = chk.cfg
    table = mixed_table(cfg)
    chk.log(mixed_workload={"requests": len(table), "output_tokens": int(table.max_tokens.sum()),
                            "prompt_tokens": int(table.prompt_len.sum()),
                            "max_output": int(table.max_tokens.max())})
    runs = {}
    for i, (policy, seqs) in enumerate(cfg.mixed_runs):
        key = f"{policy}_{seqs}"
        # An equal share of what is left each; static (last, slowest) may stop at its horizon,
        # and then its rate is that of the requests it finished.
        share = dl.left / (len(cfg.mixed_runs) - i)
        horizon = max(share - 3, 1.0)
        if horizon < 5 and not chk.quick:
            chk.log(mixed=key, skipped="deadline")
            continue
        sc = _scenario(chk, policy, seqs, cfg.mixed_token_budget, horizon)
        t0 = time.monotonic()
        res = GpuEngine(sc, table, chk.runner).run()
        wall = time.monotonic() - t0
        cols = res.records.columns()
        done = cols["state"] == "finished"
        finish = cols["finish"][done]
        span = float(np.max(finish) - np.min(cols["arrival"])) if done.any() else float("nan")
        useful = int(cols["output_tokens"][done].sum())
        row = {"policy": policy, "max_num_seqs": seqs, "finished": int(done.sum()), "requests": len(table),
               "useful_tokens": useful, "span_s": span, "wall_s": wall, "horizon_s": horizon,
               "useful_tok_per_s": useful / span if done.any() else 0.0,
               "ttft_p50_s": _pct(cols["ttft"][done], 50), "ttft_p99_s": _pct(cols["ttft"][done], 99),
               "e2e_p50_s": _pct(cols["e2el"][done], 50), "e2e_p99_s": _pct(cols["e2el"][done], 99),
               "steps": res.summary["steps"], "device_busy_s": float(sum(res.device_step_s)),
               "preemptions": res.summary.get("preemptions")}
        hf = ANCHOR_HF.get(key) if cfg.model == "llama3-8b" else None
        if hf:
            row["hf"] = hf
            row["x_hf"] = row["useful_tok_per_s"] / hf["useful_tok_per_s"]
        runs[key] = row
        chk.log(bench="mixed", **row)
    chk.results["mixed"] = runs


def _pct(values, q: float) -> float | None:
    import numpy as np

    return float(np.percentile(values, q)) if len(values) else None


# -- summary ------------------------------------------------------------------------------
def verdicts(chk: Check) -> list[tuple[str, str, str]]:
    """(target, measured, PASS/FAIL/n.a.) for the must-show targets."""
    out = []
    rows = {(r["batch"], r["ctx"]): r for r in chk.results.get("decode", {}).get("rows", [])}
    full = chk.cfg.model == "llama3-8b"

    def add(name, value, ok):
        out.append((name, value, "n.a." if not full else ("PASS" if ok else "FAIL")))

    r = rows.get((1, 512))
    add(f"decode b1 ctx512 <= {TARGETS['decode_b1_ctx512_ms_max']} ms",
        f"{r['graph_ms'] or r['step_ms']:.2f} ms" if r else "missing",
        bool(r) and (r["graph_ms"] or r["step_ms"]) <= TARGETS["decode_b1_ctx512_ms_max"])
    r = rows.get((128, 512))
    add(f"decode b128 ctx512 >= {TARGETS['decode_b128_ctx512_tok_per_s_min']:,} tok/s",
        f"{r['tok_per_s']:,.0f} tok/s" if r else "missing",
        bool(r) and r["tok_per_s"] >= TARGETS["decode_b128_ctx512_tok_per_s_min"])
    mixed = chk.results.get("mixed", {})
    cont = [v for k, v in mixed.items() if k.startswith("continuous") and v["finished"] == v["requests"]]
    best = max((v["useful_tok_per_s"] for v in cont), default=None)
    add(f"mixed continuous >= {TARGETS['continuous_useful_tok_per_s_min']:,} useful tok/s",
        f"{best:,.0f} tok/s" if best is not None else "missing",
        best is not None and best >= TARGETS["continuous_useful_tok_per_s_min"])
    static = next((v for k, v in mixed.items() if k.startswith("static")), None)
    s_rate = static["useful_tok_per_s"] if static else None
    add("mixed static well behind continuous (< 0.5x)",
        f"{s_rate:,.0f} vs {best:,.0f} tok/s" if s_rate is not None and best else "missing",
        s_rate is not None and best is not None and s_rate < 0.5 * best)
    k = chk.results.get("kernels")
    add("Triton kernels vs torch reference", f"worst rel err {k['worst_rel_err']:.1e}" if k else "missing",
        bool(k) and k["ok"])
    return out


def print_summary(chk: Check) -> None:
    lines = ["", f"gpu_check ({chk.cfg.model}, {chk.device}) in {time.monotonic() - chk.t0:.0f} s"]
    phases = {r["phase"]: r for r in chk.log.records if "phase" in r}
    env = chk.results.get("env", {})
    keys = ("gpu", "mem_GiB", "torch", "cuda", "triton", "python")
    lines.append("env: " + ", ".join(f"{k} {env.get(k)}" for k in keys if k in env))
    b = chk.results.get("build")
    if b:
        lines.append(f"model {b['params_B']:.2f}B params built in {b['model_build_s']:.1f} s; KV cache "
                     f"{b['kv_GiB']:.1f} GiB ({b['kv_tokens']:,} tokens); attention {b['attention']}")
    c = chk.results.get("ceilings")
    if c:
        lines.append(f"ceilings: copy {c['copy_TBps']:.2f} TB/s, "
                     f"bf16 matmul {c['bf16_matmul_TFLOPs']:.0f} TFLOP/s")
    state = {p: ("ok" if r["ok"] else "FAIL") for p, r in phases.items()}
    lines.append("phases: " + ", ".join(f"{p}={state.get(p, 'not run')}" for p in PHASES))
    rows = chk.results.get("decode", {}).get("rows", [])
    if rows:
        lines.append(f"{'batch':>5} {'ctx':>5} {'graph ms':>9} {'step ms':>8} {'floor ms':>8} "
                     f"{'torch ms':>8} {'tok/s':>9}")
        for r in rows:
            g = f"{r['graph_ms']:.2f}" if r["graph_ms"] is not None else "-"
            t = f"{r['torch_graph_ms']:.2f}" if r["torch_graph_ms"] is not None else "-"
            lines.append(f"{r['batch']:>5} {r['ctx']:>5} {g:>9} {r['step_ms']:>8.2f} "
                         f"{r['hbm_floor_ms']:>8.2f} {t:>8} {r['tok_per_s']:>9,.0f}")
    for r in chk.results.get("prefill", {}).get("rows", []):
        t = f"{r['torch_ms']:.1f}" if r["torch_ms"] else "-"
        lines.append(f"prefill {r['tokens']:>6} tok: {r['ms']:8.1f} ms  {r['tflops']:6.1f} TFLOP/s  "
                     f"(torch {t} ms)")
    for key, r in chk.results.get("mixed", {}).items():
        hf = f"  HF {r['hf']['useful_tok_per_s']:.0f} ({r['x_hf']:.1f}x)" if "hf" in r else ""
        lines.append(f"mixed {key:<15} {r['finished']}/{r['requests']} done  {r['useful_tok_per_s']:8,.0f} "
                     f"useful tok/s  TTFT p50/p99 {_s(r['ttft_p50_s'])}/{_s(r['ttft_p99_s'])}  "
                     f"E2E p50/p99 {_s(r['e2e_p50_s'])}/{_s(r['e2e_p99_s'])}{hf}")
    g = chk.results.get("greedy")
    if g:
        lines.append(f"greedy {g['impl']} vs torch: {g['requests_same_first_n']}/{g['requests']} requests "
                     f"same first {g['first_n']} tokens, {g['token_match_fraction']:.0%} tokens match, "
                     f"logits rel err {g['logits_rel_err']:.1e}, argmax agree {g['argmax_agree']:.1%}")
    lines.append("targets:")
    for name, value, verdict in verdicts(chk):
        lines.append(f"  [{verdict:>4}] {name}: {value}")
    print("\n".join(lines), flush=True)


def _s(x) -> str:
    return "-" if x is None else f"{x:.2f}s"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True, help="folder for gpu_check.jsonl and summary.json")
    ap.add_argument("--quick", action="store_true", help="the tiny model on a CPU (tests this script)")
    ap.add_argument("--device", default=None, help="cuda or cpu (default: cuda if present, cpu with --quick)")
    ap.add_argument("--budget-s", type=float, default=None, help="overall budget (default 400; quick 300)")
    ap.add_argument("--only", nargs="*", choices=PHASES, help="run these phases (build is always run)")
    args = ap.parse_args(argv)
    import torch

    cfg = QUICK if args.quick else FULL
    if args.budget_s is not None:
        cfg = dataclasses.replace(cfg, budget_s=args.budget_s)
    device = args.device or ("cuda" if torch.cuda.is_available() and not args.quick else "cpu")
    log = Log(args.out)
    chk = Check(cfg, device, log, args.quick)
    log(start={"model": cfg.model, "device": device, "budget_s": cfg.budget_s, "argv": sys.argv[1:]})
    needs = {"kernels": ["build"], "runner": ["build"], "decode": ["build", "runner"],
             "prefill": ["build", "runner"], "greedy": ["build", "runner"], "mixed": ["build", "runner"]}
    wanted = set(args.only or PHASES)
    for p in list(wanted):
        wanted.update(needs.get(p, []))
    fns = {"env": phase_env, "ceilings": phase_ceilings, "build": phase_build, "kernels": phase_kernels,
           "runner": phase_runner, "decode": phase_decode, "prefill": phase_prefill, "greedy": phase_greedy,
           "mixed": phase_mixed}
    for name in PHASES:
        if name not in wanted:
            continue
        built = {"build": chk.model, "runner": chk.runner}
        missing = [d for d in needs.get(name, []) if built[d] is None]
        if missing:
            log(phase=name, ok=False, error=f"skipped: needs {', '.join(missing)}", wall_s=0.0)
            continue
        run_phase(chk, name, fns[name])
    summary = {"results": chk.results, "targets": [list(v) for v in verdicts(chk)],
               "wall_s": time.monotonic() - chk.t0}
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2, default=_plain) + "\n")
    log(done=True, wall_s=round(time.monotonic() - chk.t0, 1))
    print_summary(chk)
    return 0


if __name__ == "__main__":
    sys.exit(main())
