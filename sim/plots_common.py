"""Shared bits of the plot modules: one style, PNG + SVG output, SLO lines, labels."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

SLO_STYLE = {"color": "#c62828", "linestyle": "--", "linewidth": 1.4}
REC_STYLE = {"marker": "*", "s": 260, "color": "#f9a825", "edgecolor": "black", "zorder": 5}

METRIC_LABELS = {
    "request_throughput": "request throughput (req/s)",
    "output_throughput": "output throughput (tok/s)",
    "total_token_throughput": "token throughput (tok/s)",
    "p99_ttft_ms": "P99 TTFT (ms)",
    "median_ttft_ms": "median TTFT (ms)",
    "median_tpot_ms": "median TPOT (ms)",
    "p99_tpot_ms": "P99 TPOT (ms)",
    "median_itl_ms": "median ITL (ms)",
    "p99_itl_ms": "P99 ITL (ms)",
    "p99_e2el_ms": "P99 end-to-end latency (ms)",
    "median_e2el_ms": "median end-to-end latency (ms)",
    "slo_attainment": "SLO attainment (share of requests)",
    "kv_usage_max": "peak KV-cache usage (share)",
    "mean_running_batch": "mean running batch (requests)",
    "preemptions": "preemptions",
    "rate": "offered rate (req/s)",
    "engine.max_num_seqs": "max_num_seqs",
}


def label(metric: str) -> str:
    return METRIC_LABELS.get(metric, metric)


def save(fig, stem: Path) -> list[Path]:
    """Write ``stem.png`` and ``stem.svg``; returns both paths."""
    stem = Path(stem)
    stem.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    paths = [stem.with_suffix(".png"), stem.with_suffix(".svg")]
    fig.savefig(paths[0], dpi=110)
    fig.savefig(paths[1])
    plt.close(fig)
    return paths


def slo_line(ax, value: float | None, text: str, horizontal: bool = True, **style) -> None:
    """A dashed red line at an SLO limit, labelled for the legend (``style`` overrides)."""
    if value is None:
        return
    kw = {**SLO_STYLE, **style}
    if horizontal:
        ax.axhline(value, **kw, label=text)
    else:
        ax.axvline(value, **kw, label=text)


def seqs_axis(ax, values) -> None:
    """A log2 x axis labelled with the swept values themselves (16, 64, ...), not powers."""
    from matplotlib.ticker import NullLocator

    values = sorted({int(v) for v in values})
    ax.set_xscale("log", base=2)
    ax.set_xticks(values, [str(v) for v in values])
    ax.xaxis.set_minor_locator(NullLocator())
