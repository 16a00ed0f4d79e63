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

    def step_time(self, plan: StepPlan) -> float:
        m = self.model
        tokens = plan.prefill_tokens + plan.decode_seqs
        pairs = plan.prefill_attn_pairs + plan.decode_ctx_sum
        flops = m.flops_per_token * tokens + m.attn_flops_per_pair * pairs
        kv_bytes = m.kv_bytes_per_token * (plan.decode_ctx_sum + tokens)
        t = max(flops / self._flops_rate, self._weight_s + kv_bytes / self._bytes_rate)
        t += self.hardware.step_overhead_s
        if plan.prefill_tokens:
            t += self.hardware.prefill_overhead_s
        return t
