"""Plots for policy sweeps: how each variant treats each class and tenant, and what
preemption and prefix caching did (drawn when a run has more than four variants)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from sim.plots_common import save  # noqa: E402


def _grouped(ax, summaries: dict[str, dict], groups: list[str], value, label: str) -> None:
    names = list(summaries)
    width = 0.8 / max(len(groups), 1)
    x = np.arange(len(names))
    for j, g in enumerate(groups):
        vals = [value(summaries[n], g) for n in names]
        ax.bar(x + (j - (len(groups) - 1) / 2) * width, [v if v is not None else 0 for v in vals],
               width, label=g, color=plt.cm.tab10(j))
    ax.set_xticks(x, names, rotation=35, ha="right")
    ax.set_title(label)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8)


def plot_policy_comparison(summaries: dict[str, dict], path: Path) -> Path:
    """Per-class P99 TTFT and SLO attainment, per-tenant throughput, and the cost of
    preemption next to the prefix-cache hit rate, one group of bars per variant."""
    first = next(iter(summaries.values()))
    classes = sorted(first.get("per_class") or {}) or ["all"]
    tenants = sorted(first.get("per_tenant") or {}) or ["all"]

    def per(kind: str, key: str, scale: float = 1.0):
        def value(s: dict, g: str):
            block = (s.get(kind) or {}).get(g) if g != "all" else s
            v = (block or {}).get(key)
            return None if v is None else v * scale
        return value

    fig, axes = plt.subplots(2, 2, figsize=(15, 9))
    _grouped(axes[0, 0], summaries, classes, per("per_class", "p99_ttft_ms", 1e-3),
             "P99 TTFT per class (s, log)")
    axes[0, 0].set_yscale("log")
    _grouped(axes[0, 1], summaries, classes, per("per_class", "slo_attainment", 100.0),
             "SLO attainment per class (%)")
    _grouped(axes[1, 0], summaries, tenants, per("per_tenant", "output_tokens"),
             "output tokens served per tenant")
    names = list(summaries)
    x = np.arange(len(names))
    ax = axes[1, 1]
    ax.bar(x - 0.2, [summaries[n].get("preemption_seconds") or 0.0 for n in names], 0.4,
           label="preemption cost (s)", color="tab:red")
    ax.set_ylabel("seconds of step time lost to preemption")
    ax.set_xticks(x, names, rotation=35, ha="right")
    ax2 = ax.twinx()
    ax2.bar(x + 0.2, [100 * (summaries[n].get("prefix_cache_hit_rate") or 0.0) for n in names], 0.4,
            label="prefix-cache hit rate (%)", color="tab:green")
    ax2.set_ylabel("prefix-cache hit rate (%)")
    ax.set_title("Preemption cost and prefix-cache hits")
    ax.legend(loc="upper left", fontsize=8)
    ax2.legend(loc="upper right", fontsize=8)
    fig.suptitle("Policies compared")
    return save(fig, path)[0]  # PNG, plus SVG beside it
