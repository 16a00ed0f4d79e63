"""Execute one StepPlan: all scheduled requests' new tokens in one packed forward, then sample.

The runner owns the token ids (requests carry only lengths): a prompt's ids come from the
request when it has them, otherwise from a seeded generator keyed by the request id, and
each accepted sampled token is appended. Block ids are the shared BlockManager's, read from
`request.block_table`; the runner never allocates.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch

from gpu_backend.decode_graphs import DecodeGraphs
from gpu_backend.kv_cache import PagedKVCache
from gpu_backend.metadata import SequenceChunk, build_metadata
from gpu_backend.model import LlamaModel
from gpu_backend.sampling import Sampler, SamplingParams
from sim.core.plan import StepPlan
from sim.core.request import Request


def prompt_token_ids(req: Request, seed: int, vocab_size: int, hash_block_tokens: int = 512) -> list[int]:
    """The request's own prompt ids, or deterministic pseudo-random ones.

    Generated ids depend on the client, not the attempt, so a retry sends the same prompt.
    Positions covered by `hash_ids` (trace prefix blocks of `hash_block_tokens` tokens) are
    drawn from their block's id instead: requests that share a prefix chain share its tokens,
    so KV reused through the prefix cache is the KV those tokens really have.
    """
    given = getattr(req, "prompt_token_ids", None)
    if given is None and req.extra:
        given = req.extra.get("prompt_token_ids")
    if given is not None:
        ids = [int(t) for t in given]
        if len(ids) != req.prompt_len:
            raise ValueError(f"request {req.req_id}: {len(ids)} prompt ids for prompt_len {req.prompt_len}")
        return ids
    ids = np.random.default_rng([seed, req.client_id]).integers(0, vocab_size, size=req.prompt_len)
    for k, block_id in enumerate(req.hash_ids or ()):
        lo = k * hash_block_tokens
        if lo >= req.prompt_len:
            break
        hi = min(lo + hash_block_tokens, req.prompt_len)
        rng = np.random.default_rng([seed, 0x9A5B, int(block_id) & 0xFFFFFFFFFFFFFFFF])
        ids[lo:hi] = rng.integers(0, vocab_size, size=hash_block_tokens)[: hi - lo]
    return ids.tolist()


@dataclass
class StepOutput:
    tokens: list[tuple[Request, int]]  # one sampled token per request whose step completed it
    elapsed_s: float  # device time of the step (CUDA events on GPU, perf_counter on CPU)
    num_tokens: int  # packed positions run, padding rows included
    used_decode_graph: bool
    swap_in_s: float = 0.0  # host-to-device KV copies for requests swapped back in


class ModelRunner:
    def __init__(self, model: LlamaModel, kv_cache: PagedKVCache, *,
                 sampling: SamplingParams | None = None, prompt_seed: int = 0,
                 cuda_graphs: bool | None = None, pad_decode_batches: bool = False,
                 max_graph_batch: int = 256, max_model_len: int | None = None,
                 prefix_block_tokens: int = 512) -> None:
        """cuda_graphs: None = on for CUDA with Triton attention (the torch reference syncs
        with the host, so it cannot be captured). pad_decode_batches runs decode steps through
        the same padded buffers eagerly, without a GPU (tests, debugging)."""
        self.model = model
        self.kv_cache = kv_cache
        self.block_size = kv_cache.block_size
        self.prompt_seed = prompt_seed
        self.prefix_block_tokens = prefix_block_tokens
        self.sampler = Sampler(sampling or SamplingParams(), model.device)
        self.on_cuda = model.device.type == "cuda"
        if cuda_graphs is None:
            cuda_graphs = self.on_cuda and model.attention.name == "triton"
        if cuda_graphs and not self.on_cuda:
            raise ValueError("cuda_graphs needs the model on a CUDA device")
        self.decode_graphs: DecodeGraphs | None = None
        if cuda_graphs or pad_decode_batches:
            self.decode_graphs = DecodeGraphs(model, kv_cache, max_graph_batch,
                                              max_model_len or model.spec.max_model_len, capture=cuda_graphs)
        self._tokens: dict[Request, list[int]] = {}
        self._num_generated: dict[Request, int] = {}
        self._swapped: dict[Request, torch.Tensor] = {}  # host copies of swapped-out KV blocks

    # -- token ids ------------------------------------------------------------------------
    def token_ids(self, req: Request) -> list[int]:
        """Prompt ids followed by the accepted generated ids."""
        ids = self._tokens.get(req)
        if ids is None:
            ids = self._tokens[req] = prompt_token_ids(req, self.prompt_seed, self.model.spec.vocab_size,
                                                       self.prefix_block_tokens)
            self._num_generated[req] = 0
        return ids

    def output_ids(self, req: Request) -> list[int]:
        return self.token_ids(req)[req.prompt_len:]

    def release(self, req: Request) -> None:
        """Forget a terminal request's ids (its KV blocks are the BlockManager's to free)."""
        self._tokens.pop(req, None)
        self._num_generated.pop(req, None)
        self._swapped.pop(req, None)

    @property
    def num_tracked(self) -> int:
        return len(self._tokens) + len(self._swapped)

    # -- swap preemption ------------------------------------------------------------------
    def swap_out(self, req: Request, blocks: list[int]) -> float:
        """Copy a swapped-out request's KV blocks to host memory; returns the seconds it took.

        Call after `schedule()` preempted it and before the step runs: its blocks are free
        now and the step may already write another request's KV into them.
        """
        timer = _Timer(self.on_cuda)
        index = torch.tensor(blocks, dtype=torch.int64, device=self.kv_cache.data.device)
        host = self.kv_cache.data[:, :, index].to("cpu")
        self._swapped[req] = host.pin_memory() if self.on_cuda else host
        return timer.stop()

    def _swap_in(self, req: Request) -> None:
        host = self._swapped.pop(req)
        device = self.kv_cache.data.device
        index = torch.tensor(req.block_table[: host.shape[2]], dtype=torch.int64, device=device)
        self.kv_cache.data[:, :, index] = host.to(device, non_blocking=True)

    def accept(self, out: StepOutput) -> list[tuple[Request, int]]:
        """After `Scheduler.complete`: keep each sampled token the scheduler counted.

        A request aborted while its step ran gets no token from `complete` (and may be
        released already), so its sample is dropped here; the check keeps ids and
        `num_output_tokens` in lockstep.
        """
        accepted = []
        for req, tok in out.tokens:
            generated = self._num_generated.get(req)
            if generated is not None and req.num_output_tokens == generated + 1:
                self._tokens[req].append(tok)
                self._num_generated[req] += 1
                accepted.append((req, tok))
        return accepted

    # -- the step -------------------------------------------------------------------------
    def execute(self, plan: StepPlan) -> StepOutput:
        swap_in_s = 0.0
        if self._swapped:
            returning = [req for req, _ in plan.entries if req in self._swapped]
            if returning:
                swap_timer = _Timer(self.on_cuda)
                for req in returning:
                    self._swap_in(req)
                swap_in_s = swap_timer.stop()
        timer = _Timer(self.on_cuda)
        chunks: list[SequenceChunk] = []
        ids: list[int] = []
        padding_rows: list[int] = []
        sample_rows: list[int] = []
        for row, (req, n) in enumerate(plan.entries):
            tokens = self.token_ids(req)
            start = req.num_computed_tokens
            if req.held:
                # Static-batch padding: a finished member still occupies its row. Re-run its
                # last cached position so the step costs what a real padded batch costs, and
                # store nothing (the slot after it may not be allocated).
                chunks.append(SequenceChunk(start - 1, 1, req.block_table))
                ids.append(tokens[start - 1])
                padding_rows.append(row)
                continue
            chunks.append(SequenceChunk(start, n, req.block_table))
            ids.extend(tokens[start: start + n])
            if start + n >= req.num_tokens:
                sample_rows.append(row)
        used_graph = False
        if self.decode_graphs is not None and all(c.num_new == 1 for c in chunks) \
                and len(chunks) <= self.decode_graphs.max_batch:
            logits = self._decode_with_graphs(chunks, ids, padding_rows)
            used_graph = True
        else:
            logits = self._forward(chunks, ids, padding_rows)
        sampled = self.sampler(logits[sample_rows]).tolist() if sample_rows else []
        elapsed = timer.stop()
        entries = plan.entries
        return StepOutput([(entries[r][0], t) for r, t in zip(sample_rows, sampled, strict=True)],
                          elapsed, len(ids), used_graph, swap_in_s)

    def _forward(self, chunks: list[SequenceChunk], ids: list[int], padding_rows: list[int]) -> torch.Tensor:
        dev = self.model.device
        positions, meta = build_metadata(chunks, self.block_size, dev)
        if padding_rows:
            meta.slot_mapping[meta.last_token_indices[padding_rows]] = -1
        return self.model(torch.tensor(ids, dtype=torch.int64, device=dev), positions, self.kv_cache, meta)

    def _decode_with_graphs(self, chunks: list[SequenceChunk], ids: list[int],
                            padding_rows: list[int]) -> torch.Tensor:
        bs = self.block_size
        positions = [c.num_computed for c in chunks]
        slots = [c.block_table[p // bs] * bs + p % bs for c, p in zip(chunks, positions, strict=True)]
        for row in padding_rows:
            slots[row] = -1
        return self.decode_graphs.run(ids, positions, slots, [p + 1 for p in positions],
                                      [c.block_table for c in chunks])


class _Timer:
    """Step time on the device's own clock: CUDA events bracket the queued work on a GPU."""

    def __init__(self, cuda: bool) -> None:
        self.cuda = cuda
        if cuda:
            self.start = torch.cuda.Event(enable_timing=True)
            self.end = torch.cuda.Event(enable_timing=True)
            self.start.record()
        else:
            self.t0 = time.perf_counter()

    def stop(self) -> float:
        if self.cuda:
            self.end.record()
            self.end.synchronize()
            return self.start.elapsed_time(self.end) / 1e3
        return time.perf_counter() - self.t0
