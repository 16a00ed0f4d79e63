"""``cbsim run``: simulate a scenario (and its variants), write results and plots."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from sim.config import Scenario, expand_variants, load_scenario
from sim.engine import SimResult, simulate
from sim.errors import InputError
from sim.plots import plot_comparison, plot_latency_cdfs, plot_slot_timelines, plot_timeseries

SUMMARY_COLUMNS = (
    ("completed", "done", "{:d}"),
    ("request_throughput", "req/s", "{:.2f}"),
    ("output_throughput", "out tok/s", "{:.0f}"),
    ("median_ttft_ms", "TTFT p50 ms", "{:.0f}"),
    ("p99_ttft_ms", "TTFT p99 ms", "{:.0f}"),
    ("median_tpot_ms", "TPOT p50 ms", "{:.1f}"),
    ("p99_itl_ms", "ITL p99 ms", "{:.1f}"),
    ("median_e2el_ms", "E2E p50 ms", "{:.0f}"),
    ("p99_e2el_ms", "E2E p99 ms", "{:.0f}"),
    ("preemptions", "preempt", "{:d}"),
    ("mean_running_batch", "batch", "{:.1f}"),
    ("kv_usage_max", "KV max", "{:.0%}"),
)
# Rows shown only when some variant has a non-zero value (client behaviour, admission control).
TRAFFIC_COLUMNS = (
    ("rejected", "rejected", "{:d}"),
    ("cancelled", "cancelled", "{:d}"),
    ("timed_out", "timed out", "{:d}"),
    ("retries", "retries", "{:d}"),
    ("wasted_gpu_fraction", "GPU wasted", "{:.0%}"),
    ("goodput", "goodput req/s", "{:.2f}"),
    ("slo_attainment", "SLO attained", "{:.0%}"),
)
# Many variants (a policy sweep): one row per variant with these columns.
COMPARISON_COLUMNS = (
    ("completed", "done", "{:d}"),
    ("output_throughput", "tok/s", "{:.0f}"),
    ("median_ttft_ms", "TTFT p50 ms", "{:.0f}"),
    ("p99_ttft_ms", "TTFT p99 ms", "{:.0f}"),
    ("p99_itl_ms", "ITL p99 ms", "{:.0f}"),
    ("mean_e2el_ms", "E2E mean ms", "{:.0f}"),
    ("slo_attainment", "SLO met", "{:.0%}"),
    ("preemptions", "preempt", "{:d}"),
    ("preemption_seconds", "preempt s", "{:.1f}"),
    ("prefix_cache_hit_rate", "prefix hit", "{:.0%}"),
    ("timed_out", "dropped", "{:d}"),
)


def fmt(value, pattern: str) -> str:
    if value is None:
        return "-"
    try:
        return pattern.format(value)
    except (ValueError, TypeError):
        return str(value)


def write_result(result: SimResult, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps(result.summary, indent=2, default=float) + "\n")
    result.records.write_parquet(out / "requests.parquet")
    ts = result.timeseries
    import pandas as pd

    pd.DataFrame({"time": ts.time, "replica": ts.replica, "kv_usage": ts.kv_usage,
                  "running": ts.running, "waiting": ts.waiting}).to_parquet(
        out / "timeseries.parquet", index=False)


def write_plots(results: dict[str, SimResult], out: Path) -> list[Path]:
    paths = [plot_latency_cdfs(results, out / "latency_cdf.png"),
             plot_timeseries(results, out / "timeseries.png")]
    if any(r.steps for r in results.values()):
        paths.append(plot_slot_timelines(results, out / "slot_timeline.png"))
        from sim.animation import write_animation

        paths.append(write_animation(results, out / "slot_animation.html",
                                     f"{next(iter(results.values())).scenario.name}: batch slots"))
    if len(results) > 1:
        paths.append(plot_comparison({k: r.summary for k, r in results.items()},
                                     out / "comparison.png"))
    if len(results) > 4 or (len(results) > 1 and any(
            len(r.summary.get("per_tenant") or {}) > 1 for r in results.values())):
        from sim.plots_policy import plot_policy_comparison

        paths.append(plot_policy_comparison({k: r.summary for k, r in results.items()},
                                            out / "policy_comparison.png"))
    clusters = {k: r.summary for k, r in results.items() if r.summary.get("per_replica")}
    if clusters:
        from sim.plots_batching import plot_replicas

        paths.append(plot_replicas(clusters, out / "replicas")[0])
    return paths


GPU_INSTALL_HINT = ("--backend gpu needs PyTorch: pip install 'cbsim[gpu]' "
                    "(on a GPU host install the CUDA build of torch first)")


@dataclass
class GpuOptions:
    """``cbsim run --backend gpu``: where and how the real engine runs (gpu_backend.replay)."""

    device: str | None = None  # cuda or cpu; default cuda when present
    weights: str | None = None  # Hugging Face safetensors folder; default seeded random weights
    attention: str | None = None  # torch or triton; default triton on CUDA


def check_gpu_backend() -> None:
    """Raise InputError (one line, exit 2) when the GPU backend cannot be imported."""
    try:
        import torch  # noqa: F401
    except ImportError:
        raise InputError(GPU_INSTALL_HINT) from None


def run_gpu(sc: Scenario, gpu: GpuOptions) -> SimResult:
    """The scenario's workload replayed in real time on the backend (gpu_backend.replay)."""
    from gpu_backend.replay import replay

    if gpu.attention not in (None, "torch", "triton"):
        raise InputError(f"--attention: '{gpu.attention}' is not one of torch, triton")
    if gpu.device is not None and gpu.device.split(":")[0] not in ("cuda", "cpu"):
        raise InputError(f"--device: '{gpu.device}' is not one of cuda, cpu")
    res = replay(sc, device=gpu.device, weights=gpu.weights, attention=gpu.attention)
    steps = res.device_step_s
    res.summary["backend"] = {
        "kind": "gpu", "device": gpu.device or "default", "attention": gpu.attention or "default",
        "weights": gpu.weights or "random", "device_steps": len(steps),
        "device_step_s_total": float(sum(steps)),
    }
    return res


def run_variants(variants: dict[str, Scenario], out: Path, on_done=None,
                 on_progress=None, gpu: GpuOptions | None = None) -> dict[str, SimResult]:
    """Simulate each variant (or, with ``gpu``, run it on the real engine); ``on_progress(name,
    arrived, total)`` drives a progress bar."""
    results: dict[str, SimResult] = {}
    for name, sc in variants.items():
        progress = None if on_progress is None else (
            lambda done, total, name=name: on_progress(name, done, total))
        res = simulate(sc, progress=progress) if gpu is None else run_gpu(sc, gpu)
        results[name] = res
        write_result(res, out / name if len(variants) > 1 else out)
        if on_done:
            on_done(name, res)
    if len(variants) > 1:
        table = {name: r.summary for name, r in results.items()}
        (out / "comparison.json").write_text(json.dumps(table, indent=2, default=float) + "\n")
    return results


def run_scenario(path: str, out: Path | None, overrides: list[str], on_done=None,
                 on_progress=None, gpu: GpuOptions | None = None):
    """Load, expand and run a scenario; ``gpu`` runs it on the real engine instead."""
    if gpu is not None:
        check_gpu_backend()
    scenario, raw = load_scenario(path, overrides)
    variants = expand_variants(raw, path)
    out = out or Path("results") / scenario.name
    results = run_variants(variants, out, on_done, on_progress, gpu)
    plots = write_plots(results, out)
    return scenario, results, out, plots
