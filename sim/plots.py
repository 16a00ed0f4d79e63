"""Plots drawn from run results (matplotlib, Agg backend, PNG; SVG too where asked)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.colors import ListedColormap  # noqa: E402

from sim.engine import SimResult, StepTrace  # noqa: E402
from sim.plots_common import save  # noqa: E402

IDLE = -1
PADDING = -2


def slot_grid(steps: list[StepTrace], num_slots: int | None = None) -> np.ndarray:
    """Slots × steps: the request id occupying each slot, IDLE or PADDING.

    A request keeps the slot it first got until it leaves the batch, as a serving engine's
    batch rows do; the next newcomer takes the lowest free slot.
    """
    slot_of: dict[int, int] = {}
    width = num_slots or max((len(s.batch) for s in steps), default=1)
    grid = np.full((width, len(steps)), IDLE, dtype=np.int64)
    for col, step in enumerate(steps):
        present = {rid for rid, _, _ in step.batch}
        for rid in [r for r in slot_of if r not in present]:
            del slot_of[rid]
        used = set(slot_of.values())
        for rid, _, kind in step.batch:
            if rid not in slot_of:
                slot = next(i for i in range(width + len(step.batch)) if i not in used)
                slot_of[rid] = slot
                used.add(slot)
            slot = slot_of[rid]
            if slot >= grid.shape[0]:
                grid = np.vstack([grid, np.full((slot - grid.shape[0] + 1, grid.shape[1]), IDLE)])
            grid[slot, col] = PADDING if kind == "padding" else rid
    return grid


def plot_slot_timelines(results: dict[str, SimResult], path: Path, max_steps: int = 600) -> Path:
    """Side by side, as in the seeds' animation: who holds each batch slot at each step."""
    panels = {k: r for k, r in results.items() if r.steps}
    fig, axes = plt.subplots(1, len(panels), figsize=(6.5 * len(panels), 4.2), squeeze=False)
    width = max(r.scenario.engine.max_num_seqs for r in panels.values())
    width = min(width, max(max(len(s.batch) for s in r.steps) for r in panels.values()))
    for ax, (name, res) in zip(axes[0], panels.items(), strict=True):
        steps = res.steps[:max_steps]
        grid = slot_grid(steps, width)
        shown = np.where(grid >= 0, grid % 20 + 2, np.where(grid == PADDING, 1, 0))
        colors = ["#e6e6e6", "#9e9e9e"] + [plt.cm.tab20(i) for i in range(20)]
        ax.imshow(shown, aspect="auto", interpolation="nearest", cmap=ListedColormap(colors),
                  vmin=0, vmax=21)
        busy = (grid >= 0).sum()
        ax.set_title(f"{name}: {busy / grid.size:.0%} of slot-steps do useful work")
        ax.set_xlabel("engine step")
        ax.set_ylabel("batch slot")
    fig.suptitle("Batch slots over steps (colour = request, dark grey = finished but held "
                 "as padding, light grey = idle)")
    return save(fig, path)[0]  # PNG, plus SVG beside it


def plot_latency_cdfs(results: dict[str, SimResult], path: Path) -> Path:
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for name, res in results.items():
        frame = res.frame()
        ok = frame[frame.state == "finished"]
        for ax, col in zip(axes, ("ttft", "e2el"), strict=True):
            v = np.sort(ok[col].to_numpy() * 1e3)
            if len(v):
                ax.plot(v, np.arange(1, len(v) + 1) / len(v), label=name)
    for ax, title in zip(axes, ("Time to first token", "End-to-end latency"), strict=True):
        ax.set_xlabel("ms")
        ax.set_ylabel("fraction of finished requests")
        ax.set_title(f"{title} (CDF)")
        ax.set_xscale("log")
        ax.grid(alpha=0.3)
        ax.legend()
    return save(fig, path)[0]  # PNG, plus SVG beside it


def plot_timeseries(results: dict[str, SimResult], path: Path) -> Path:
    fig, axes = plt.subplots(3, 1, figsize=(10, 8), sharex=True)
    for name, res in results.items():
        ts = res.timeseries
        t = np.asarray(ts.time)
        axes[0].plot(t, np.asarray(ts.kv_usage) * 100, label=name)
        axes[1].plot(t, ts.running, label=name)
        axes[2].plot(t, ts.waiting, label=name)
    for ax, label in zip(axes, ("KV cache used (%)", "running requests", "waiting requests"),
                         strict=True):
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        ax.legend(loc="upper right")
    axes[-1].set_xlabel("simulated time (s)")
    axes[0].set_title("KV usage, running batch and queue over time")
    return save(fig, path)[0]  # PNG, plus SVG beside it


def plot_comparison(summaries: dict[str, dict], path: Path) -> Path:
    names = list(summaries)
    metrics = [("output_throughput", "output tok/s"), ("median_ttft_ms", "median TTFT (ms)"),
               ("p99_ttft_ms", "P99 TTFT (ms)"), ("median_e2el_ms", "median E2E (ms)")]
    fig, axes = plt.subplots(1, len(metrics), figsize=(4 * len(metrics), 3.6))
    for ax, (key, label) in zip(axes, metrics, strict=True):
        vals = [summaries[n].get(key) or 0.0 for n in names]
        ax.bar(names, vals, color=[plt.cm.tab10(i) for i in range(len(names))])
        ax.set_title(label)
        ax.tick_params(axis="x", rotation=30)
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle("Variants compared")
    return save(fig, path)[0]  # PNG, plus SVG beside it
