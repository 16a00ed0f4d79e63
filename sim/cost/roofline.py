"""``roofline``: an analytic step time from the model shape and the hardware datasheet.

A step reads every weight once and the KV of every attended position, and does 2 FLOPs per
weight per token plus the attention products; it takes the larger of compute time and memory
time at the hardware's achievable fractions of peak, plus a per-step overhead.
"""

from __future__ import annotations

from sim.core.plan import StepPlan
from sim.cost.presets import HardwareSpec, ModelSpec


class RooflineCostModel:
    name = "roofline"

    def __init__(self, model: ModelSpec, hardware: HardwareSpec) -> None:
        self.model = model
        self.hardware = hardware
        self._flops_rate = hardware.matmul_flops * hardware.compute_efficiency
        self._bytes_rate = hardware.hbm_bandwidth * hardware.memory_efficiency
        self._weight_s = model.weight_bytes / self._bytes_rate
        # The model's derived sizes, once: step_time runs for every simulated step.
        self._flops_per_token = model.flops_per_token
        self._attn_flops_per_pair = model.attn_flops_per_pair
        self._kv_bytes_per_token = model.kv_bytes_per_token
        self._step_overhead_s = hardware.step_overhead_s
        self._prefill_overhead_s = hardware.prefill_overhead_s

    def step_time(self, plan: StepPlan) -> float:
        tokens = plan.prefill_tokens + plan.decode_seqs
        pairs = plan.prefill_attn_pairs + plan.decode_ctx_sum
        flops = self._flops_per_token * tokens + self._attn_flops_per_pair * pairs
        kv_bytes = self._kv_bytes_per_token * (plan.decode_ctx_sum + tokens)
        compute = flops / self._flops_rate
        memory = self._weight_s + kv_bytes / self._bytes_rate
        t = compute if compute >= memory else memory  # max() without the call
        t += self._step_overhead_s
        if plan.prefill_tokens:
            t += self._prefill_overhead_s
        return t

    def decode_time(self, batch: int, ctx_sum: int) -> float:
        """``step_time`` of a decode-only step, by the same float operations (the fast path)."""
        flops = self._flops_per_token * batch + self._attn_flops_per_pair * ctx_sum
        kv_bytes = self._kv_bytes_per_token * (ctx_sum + batch)
        compute = flops / self._flops_rate
        memory = self._weight_s + kv_bytes / self._bytes_rate
        return (compute if compute >= memory else memory) + self._step_overhead_s
