"""Plots of a sweep table: latency against throughput over a rate sweep (one curve per policy or
variant), and throughput and latency against max_num_seqs, with the SLO lines."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np

from sim.plots_common import label, save, seqs_axis, slo_line

SEQS = "engine.max_num_seqs"


def _series(frame, params: list[str], x: str):
    """Rows grouped by every swept field except ``x``: (legend label, rows sorted by x)."""
    others = [p for p in params if p != x and p in frame.columns]
    if not others:
        yield "all points", frame.sort_values(x)
        return
    for values, rows in frame.groupby(others, sort=False, dropna=False):
        values = values if isinstance(values, tuple) else (values,)
        name = ", ".join(_value_label(k, v) for k, v in zip(others, values, strict=True))
        yield name, rows.sort_values(x)


def _value_label(param: str, value) -> str:
    if param == "variant":
        return str(value)
    if param == "rate":
        return f"{value:g} req/s offered"
    return f"{_short(param)}={value}"


def _short(param: str) -> str:
    return param.rsplit(".", 1)[-1] if param != "variant" else "variant"


def _slo_values(slo) -> dict[str, tuple[float, str]]:
    if slo is None:
        return {}
    out = {}
    if slo.ttft_ms:
        out["p99_ttft_ms"] = (slo.ttft_ms, f"TTFT SLO {slo.ttft_ms:g} ms")
    if slo.p99_ttft_ms:
        out["p99_ttft_ms"] = (slo.p99_ttft_ms, f"P99 TTFT SLO {slo.p99_ttft_ms:g} ms")
    if slo.tpot_ms:
        out["median_tpot_ms"] = (slo.tpot_ms, f"TPOT SLO {slo.tpot_ms:g} ms")
        out["p99_tpot_ms"] = (slo.tpot_ms, f"TPOT SLO {slo.tpot_ms:g} ms")
    if slo.p99_tpot_ms:
        out["p99_tpot_ms"] = (slo.p99_tpot_ms, f"P99 TPOT SLO {slo.p99_tpot_ms:g} ms")
    if slo.p99_itl_ms:
        out["p99_itl_ms"] = (slo.p99_itl_ms, f"P99 ITL SLO {slo.p99_itl_ms:g} ms")
    return out


def plot_latency_throughput(frame, params: list[str], stem: Path, slo=None,
                            title: str = "Latency against throughput over a rate sweep") -> list[Path]:
    """One curve per policy/variant: achieved throughput (x) against P99 TTFT and TPOT (y), one
    marker per offered rate."""
    lines = _slo_values(slo)
    metrics = ("p99_ttft_ms", "median_tpot_ms", "p99_itl_ms")
    fig, axes = plt.subplots(1, len(metrics), figsize=(5.2 * len(metrics), 4.2))
    for i, (name, rows) in enumerate(_series(frame, params, "rate")):
        for ax, m in zip(axes, metrics, strict=True):
            ax.plot(rows["request_throughput"], rows[m], marker="o", color=plt.cm.tab10(i),
                    label=name)
    for ax, m in zip(axes, metrics, strict=True):
        if m in lines:
            slo_line(ax, lines[m][0], lines[m][1])
        ax.set_xlabel(label("request_throughput"))
        ax.set_ylabel(label(m))
        if m == "p99_ttft_ms":
            ax.set_yscale("log")
        ax.grid(alpha=0.3, which="both")
        ax.set_title(label(m).split(" (")[0] + " vs throughput")
        ax.legend(fontsize=8)
    fig.suptitle(f"{title} (each marker is one offered rate)")
    return save(fig, stem)


def plot_max_num_seqs(frame, params: list[str], stem: Path, slo=None, recommended: int | None = None,
                      title: str = "Throughput and latency against max_num_seqs (one line per other "
                            "swept value)") -> list[Path]:
    """Throughput rises with max_num_seqs until compute or KV memory saturates while each
    request's ITL rises: throughput, P99 TTFT and ITL against max_num_seqs (log2 axis)."""
    lines = _slo_values(slo)
    panels = (("output_throughput", None), ("p99_ttft_ms", "log"), ("median_tpot_ms", None),
              ("kv_usage_max", None))
    fig, axes = plt.subplots(1, len(panels), figsize=(4.6 * len(panels), 4.2))
    for i, (name, rows) in enumerate(_series(frame, params, SEQS)):
        for ax, (m, _) in zip(axes, panels, strict=True):
            if m not in rows:
                continue
            y = rows[m] * (100 if m == "kv_usage_max" else 1)
            ax.plot(rows[SEQS], y, marker="o", color=plt.cm.tab10(i), label=name)
            if m == "median_tpot_ms" and "p99_itl_ms" in rows and rows["p99_itl_ms"].notna().any():
                ax.plot(rows[SEQS], rows["p99_itl_ms"], marker=".", linestyle=":",
                        color=plt.cm.tab10(i), label=f"{name} (P99 ITL)")
    for ax, (m, scale) in zip(axes, panels, strict=True):
        if m in lines:
            slo_line(ax, lines[m][0], lines[m][1])
        if recommended is not None:
            ax.axvline(recommended, color="#f9a825", linewidth=2, alpha=0.7,
                       label=f"recommended max_num_seqs={recommended}")
        seqs_axis(ax, frame[SEQS])
        if scale:
            ax.set_yscale(scale)
        ax.set_xlabel("max_num_seqs (log2 scale)")
        ax.set_ylabel({"kv_usage_max": "peak KV-cache usage (%)",
                       "median_tpot_ms": "per-request inter-token latency (ms)"}.get(m, label(m)))
        ax.set_title({"output_throughput": "Throughput", "p99_ttft_ms": "P99 time to first token",
                      "median_tpot_ms": "Inter-token latency (median TPOT; dotted P99 ITL)",
                      "kv_usage_max": "Peak KV-cache usage"}[m])
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7)
    fig.suptitle(title)
    return save(fig, stem)


def plot_points(frame, params: list[str], stem: Path) -> list[Path]:
    names = [", ".join(f"{_short(p)}={row[p]}" for p in params if p in frame.columns)
             for _, row in frame.iterrows()]
    metrics = ("output_throughput", "p99_ttft_ms", "median_tpot_ms")
    fig, axes = plt.subplots(1, len(metrics), figsize=(5 * len(metrics), 4 + 0.12 * len(names)))
    y = np.arange(len(names))
    for ax, m in zip(axes, metrics, strict=True):
        ax.barh(y, frame[m].fillna(0), color=plt.cm.tab10(0))
        ax.set_yticks(y, names if ax is axes[0] else [""] * len(names), fontsize=7)
        ax.set_xlabel(label(m))
        ax.set_title(label(m).split(" (")[0])
        ax.grid(axis="x", alpha=0.3)
    fig.suptitle("Sweep points")
    return save(fig, stem)


def plot_sweep(frame, params: list[str], folder: Path, slo=None) -> list[Path]:
    """The plots that fit the swept fields (a rate sweep, a max_num_seqs sweep, or bars)."""
    if frame is None or len(frame) == 0:
        return []
    paths: list[Path] = []
    if "rate" in params and frame["rate"].nunique() > 1:
        paths += plot_latency_throughput(frame, params, folder / "latency_throughput", slo)
    if SEQS in params and frame[SEQS].nunique() > 1:
        paths += plot_max_num_seqs(frame, params, folder / "max_num_seqs", slo)
    if not paths:
        paths += plot_points(frame, params, folder / "points")
    return paths
