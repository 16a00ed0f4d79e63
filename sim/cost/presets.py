"""Model and hardware presets shared by the cost models, the block manager and the GPU backend.

Model shapes are the published configs of each family; hardware numbers are datasheet peaks
(dense bf16 matrix rate, HBM bandwidth, host link) with efficiency factors that say how much of
the peak a well-tuned serving engine reaches.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sim.errors import InputError


@dataclass(frozen=True)
class ModelSpec:
    name: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    vocab_size: int
    max_model_len: int
    rope_theta: float = 500000.0
    rope_scaling: dict | None = None
    rms_norm_eps: float = 1e-5
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # Qwen2 has q/k/v biases
    dtype_bytes: int = 2
    head_dim_override: int | None = None

    @property
    def head_dim(self) -> int:
        return self.head_dim_override or self.hidden_size // self.num_heads

    @property
    def kv_bytes_per_token(self) -> int:
        """Bytes of K and V cached per token across all layers."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.dtype_bytes

    @property
    def num_params(self) -> int:
        h, d = self.hidden_size, self.head_dim
        attn = h * (self.num_heads * d) + 2 * h * (self.num_kv_heads * d) + (self.num_heads * d) * h
        mlp = 3 * h * self.intermediate_size
        per_layer = attn + mlp + 2 * h
        embed = self.vocab_size * h
        lm_head = 0 if self.tie_word_embeddings else self.vocab_size * h
        return self.num_layers * per_layer + embed + lm_head + h

    @property
    def weight_bytes(self) -> int:
        return self.num_params * self.dtype_bytes

    @property
    def flops_per_token(self) -> float:
        """Matrix FLOPs per token outside attention (2 per multiply-add); embedding is a lookup."""
        embed = self.vocab_size * self.hidden_size
        return 2.0 * (self.num_params - embed)

    @property
    def attn_flops_per_pair(self) -> float:
        """FLOPs of QK^T and PV for one (query, key) pair across all layers."""
        return 4.0 * self.num_layers * self.num_heads * self.head_dim


@dataclass(frozen=True)
class HardwareSpec:
    name: str
    memory_bytes: int
    hbm_bandwidth: float  # bytes/s, datasheet
    matmul_flops: float  # dense bf16 FLOP/s, datasheet
    host_link_bandwidth: float  # bytes/s one direction (PCIe / NVLink-C2C), used by swap
    memory_efficiency: float = 0.88
    compute_efficiency: float = 0.72
    step_overhead_s: float = 0.0035  # launch and scheduling overhead of one engine step
    prefill_overhead_s: float = 0.006  # extra for steps with a prefill (no CUDA graph)
    cost_per_hour: float = 0.0
    extras: dict = field(default_factory=dict)


MODELS: dict[str, ModelSpec] = {
    "tiny": ModelSpec(
        "tiny", num_layers=2, hidden_size=64, num_heads=4, num_kv_heads=2,
        intermediate_size=128, vocab_size=256, max_model_len=2048, rope_theta=10000.0,
        dtype_bytes=4,
    ),
    "llama2-7b": ModelSpec(
        "llama2-7b", num_layers=32, hidden_size=4096, num_heads=32, num_kv_heads=32,
        intermediate_size=11008, vocab_size=32000, max_model_len=4096, rope_theta=10000.0,
    ),
    "llama3-8b": ModelSpec(
        "llama3-8b", num_layers=32, hidden_size=4096, num_heads=32, num_kv_heads=8,
        intermediate_size=14336, vocab_size=128256, max_model_len=8192, rope_theta=500000.0,
    ),
    "llama3-70b": ModelSpec(
        "llama3-70b", num_layers=80, hidden_size=8192, num_heads=64, num_kv_heads=8,
        intermediate_size=28672, vocab_size=128256, max_model_len=8192, rope_theta=500000.0,
    ),
    "qwen2.5-7b": ModelSpec(
        "qwen2.5-7b", num_layers=28, hidden_size=3584, num_heads=28, num_kv_heads=4,
        intermediate_size=18944, vocab_size=152064, max_model_len=32768, rope_theta=1000000.0,
        rms_norm_eps=1e-6, attention_bias=True,
    ),
    "mistral-7b": ModelSpec(
        "mistral-7b", num_layers=32, hidden_size=4096, num_heads=32, num_kv_heads=8,
        intermediate_size=14336, vocab_size=32768, max_model_len=32768, rope_theta=1000000.0,
    ),
}

GB = 1e9
TB = 1e12

HARDWARE: dict[str, HardwareSpec] = {
    # H200 SXM: 141 GB HBM3e at 4.8 TB/s, 989 TFLOP/s dense bf16, PCIe Gen5 x16.
    "h200": HardwareSpec("h200", memory_bytes=int(141 * GB), hbm_bandwidth=4.8 * TB,
                         matmul_flops=989e12, host_link_bandwidth=55 * GB, cost_per_hour=3.5),
    # H100 SXM: 80 GB HBM3 at 3.35 TB/s.
    "h100": HardwareSpec("h100", memory_bytes=int(80 * GB), hbm_bandwidth=3.35 * TB,
                         matmul_flops=989e12, host_link_bandwidth=55 * GB, cost_per_hour=2.5),
    # A100 SXM 80 GB: HBM2e at 2.039 TB/s, 312 TFLOP/s dense bf16, PCIe Gen4 x16.
    "a100-80g": HardwareSpec("a100-80g", memory_bytes=int(80 * GB), hbm_bandwidth=2.039 * TB,
                             matmul_flops=312e12, host_link_bandwidth=25 * GB, cost_per_hour=1.6),
    # L40S: 48 GB GDDR6 at 864 GB/s, 362 TFLOP/s dense bf16, PCIe Gen4 x16.
    "l40s": HardwareSpec("l40s", memory_bytes=int(48 * GB), hbm_bandwidth=864 * GB,
                         matmul_flops=362e12, host_link_bandwidth=25 * GB, cost_per_hour=1.0),
    # A modest CPU, so the tiny model's roofline has a meaning on the CPU backend.
    "cpu": HardwareSpec("cpu", memory_bytes=int(16 * GB), hbm_bandwidth=20 * GB,
                        matmul_flops=100e9, host_link_bandwidth=20 * GB,
                        step_overhead_s=0.001, prefill_overhead_s=0.0),
}


def get_model(name: str) -> ModelSpec:
    try:
        return MODELS[name]
    except KeyError:
        raise InputError(f"model: unknown model '{name}'; allowed: {', '.join(MODELS)}") from None


def get_hardware(name: str) -> HardwareSpec:
    try:
        return HARDWARE[name]
    except KeyError:
        raise InputError(
            f"hardware: unknown hardware '{name}'; allowed: {', '.join(HARDWARE)}"
        ) from None
