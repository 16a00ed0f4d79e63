"""Static vs continuous batching, runs over time, tenants and replicas (PNG + SVG each)."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np

from sim.plots import plot_slot_timelines, plot_timeseries
from sim.plots_common import label, save, slo_line


def slot_timelines(results: dict, stem: Path, max_steps: int = 600) -> list[Path]:
    """Side by side: who holds each batch slot at each step (static vs continuous)."""
    stem = Path(stem)
    stem.parent.mkdir(parents=True, exist_ok=True)
    return [plot_slot_timelines(results, stem.with_suffix(ext), max_steps) for ext in (".png", ".svg")]


def timeseries(results: dict, stem: Path) -> list[Path]:
    """KV-cache usage, running batch and waiting queue over simulated time."""
    stem = Path(stem)
    stem.parent.mkdir(parents=True, exist_ok=True)
    return [plot_timeseries(results, stem.with_suffix(ext)) for ext in (".png", ".svg")]


def throughput_ratio_frame(frame, spread: str, slow: str = "static", fast: str = "continuous"):
    """Per spread value: both runs' output throughput and their ratio (fast / slow)."""
    import pandas as pd

    rows = []
    for value, g in frame.groupby(spread, sort=True):
        by = g.set_index("variant")["output_throughput"]
        rows.append({spread: value, slow: float(by[slow]), fast: float(by[fast]),
                     "ratio": float(by[fast] / by[slow])})
    return pd.DataFrame(rows)


def plot_throughput_ratio(ratios, spread: str, stem: Path, spread_label: str,
                          slow: str = "static", fast: str = "continuous") -> list[Path]:
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    x = ratios[spread]
    axes[0].plot(x, ratios[slow], marker="o", label=slow)
    axes[0].plot(x, ratios[fast], marker="o", label=fast)
    axes[0].set_ylabel(label("output_throughput"))
    axes[0].set_title("Throughput of each batching discipline")
    axes[1].plot(x, ratios["ratio"], marker="o", color="#2e7d32")
    axes[1].axhline(1.0, color="grey", linestyle=":", label="equal throughput")
    for v, r in zip(x, ratios["ratio"], strict=True):
        axes[1].annotate(f"{r:.1f}x", (v, r), textcoords="offset points", xytext=(0, 6),
                         ha="center", fontsize=8)
    axes[1].margins(y=0.15)
    axes[1].set_ylabel(f"{fast} / {slow} throughput (x)")
    axes[1].set_title(f"{fast.capitalize()} over {slow} batching")
    for ax in axes:
        ax.set_xlabel(spread_label)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle("The wider the spread of output lengths, the more continuous batching gains")
    return save(fig, stem)


def tenant_frame(frames: dict, slo=None):
    """Per run and tenant: requests, finished per second, P99 TTFT, median TPOT, attainment."""
    import pandas as pd

    from sim.plan import evaluate_slo

    rows = []
    for run, frame in frames.items():
        duration = max(float(np.nanmax(frame["finish"]) - frame["arrival"].min()), 1e-9)
        for tenant, g in frame.groupby("tenant", sort=True, observed=True):
            ok = g[g.state == "finished"]
            row = {"run": run, "tenant": tenant, "requests": len(g),
                   "request_throughput": len(ok) / duration,
                   "p99_ttft_ms": float(np.percentile(ok.ttft, 99) * 1e3) if len(ok) else np.nan,
                   "median_tpot_ms": float(np.nanmedian(ok.tpot) * 1e3) if len(ok) else np.nan}
            if slo is not None:
                cols = {c: g[c].to_numpy() for c in ("state", "ttft", "tpot", "e2el")}
                cols["state"] = cols["state"].astype(object)
                row["slo_attainment"] = evaluate_slo(cols, {"duration": duration}, slo).attainment
            rows.append(row)
    return pd.DataFrame(rows)


def plot_tenants(tenants, stem: Path, slo=None) -> list[Path]:
    metrics = ["request_throughput", "p99_ttft_ms", "median_tpot_ms"]
    if "slo_attainment" in tenants:
        metrics.append("slo_attainment")
    runs = list(dict.fromkeys(tenants["run"]))
    names = list(dict.fromkeys(tenants["tenant"]))
    fig, axes = plt.subplots(1, len(metrics), figsize=(4.6 * len(metrics), 4.2))
    width = 0.8 / len(runs)
    x = np.arange(len(names))
    for i, run in enumerate(runs):
        rows = tenants[tenants.run == run].set_index("tenant").reindex(names)
        for ax, m in zip(axes, metrics, strict=True):
            scale = 100 if m == "slo_attainment" else 1
            ax.bar(x + (i - (len(runs) - 1) / 2) * width, rows[m] * scale, width, label=run,
                   color=plt.cm.tab10(i))
    for ax, m in zip(axes, metrics, strict=True):
        ax.set_xticks(x, names, rotation=20)
        ax.set_xlabel("tenant")
        ax.set_ylabel("requests within the SLOs (%)" if m == "slo_attainment" else label(m))
        ax.set_title(label(m).split(" (")[0])
        if m == "p99_ttft_ms":
            ax.set_yscale("log")
            if slo is not None and slo.ttft_ms:
                slo_line(ax, slo.ttft_ms, f"TTFT SLO {slo.ttft_ms:g} ms")
        if m == "median_tpot_ms" and slo is not None and slo.tpot_ms:
            slo_line(ax, slo.tpot_ms, f"TPOT SLO {slo.tpot_ms:g} ms")
        if m == "slo_attainment" and slo is not None:
            slo_line(ax, slo.attainment * 100, f"target {slo.attainment:.0%}")
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("Per-tenant service")
    return save(fig, stem)


def plot_replicas(summaries: dict, stem: Path) -> list[Path]:
    """Per router: each replica's routed requests and busy share, with the imbalance (max/mean)."""
    metrics = (("routed", "requests routed"), ("gpu_busy_fraction", "GPU busy (%)"),
               ("p99_ttft_ms", "P99 TTFT (ms)"))
    fig, axes = plt.subplots(1, len(metrics), figsize=(5 * len(metrics), 4.2))
    runs = list(summaries)
    n = max(len(s.get("per_replica", [])) for s in summaries.values())
    width = 0.8 / len(runs)
    x = np.arange(n)
    for i, run in enumerate(runs):
        per = summaries[run].get("per_replica", [])
        for ax, (m, _) in zip(axes, metrics, strict=True):
            vals = [(p[m] or 0) * (100 if m == "gpu_busy_fraction" else 1) for p in per]
            lab = f"{run} (imbalance {summaries[run]['imbalance_requests']:.2f})" if m == "routed" else run
            ax.bar(x[:len(vals)] + (i - (len(runs) - 1) / 2) * width, vals, width, label=lab,
                   color=plt.cm.tab10(i))
    for ax, (_, title) in zip(axes, metrics, strict=True):
        ax.set_xticks(x, [f"replica {j}" for j in range(n)])
        ax.set_ylabel(title)
        ax.set_title(title.split(" (")[0] + " per replica")
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=2)
    fig.suptitle("Load across replicas per router (imbalance = max / mean requests routed)")
    return save(fig, stem)
