"""The capacity-planning figure: per max_num_seqs, the goodput one replica sustains and the
latency it gives at the recommended fleet's per-replica load, with the SLOs and the pick."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt

from sim.plots_common import REC_STYLE, label, save, seqs_axis, slo_line


def plot_capacity(curve, result, stem: Path) -> list[Path]:
    rec = result.recommended
    slo = result.slo
    x = curve["max_num_seqs"]
    load = float(curve["rate_per_replica"].iloc[0])
    at = curve["max_num_seqs"] == rec.max_num_seqs
    fig, axes = plt.subplots(1, 4, figsize=(19, 4.4))

    ax = axes[0]
    ax.plot(x, curve["max_rate_per_replica"], marker="o", label="max rate meeting the SLOs")
    ax.axhline(load, color="grey", linestyle=":", label=f"load per replica ({load:.2f} req/s)")
    ax.scatter(x[at], curve["max_rate_per_replica"][at], **REC_STYLE, label="recommended")
    ax.set_ylabel("goodput of one replica (req/s)")
    ax.set_title("Sustainable rate (SLO goodput)")

    ax = axes[1]
    ax.plot(x, curve["p99_ttft_ms"], marker="o", label="P99 TTFT")
    slo_line(ax, slo.ttft_ms, f"TTFT SLO {slo.ttft_ms:g} ms" if slo.ttft_ms else "")
    slo_line(ax, slo.p99_ttft_ms, f"P99 TTFT SLO {slo.p99_ttft_ms:g} ms" if slo.p99_ttft_ms else "",
             linestyle=":", color="#8e0000")
    ax.scatter(x[at], curve["p99_ttft_ms"][at], **REC_STYLE, label="recommended")
    ax.set_yscale("log")
    ax.set_ylabel(label("p99_ttft_ms"))
    ax.set_title(f"Time to first token at {load:.2f} req/s")

    ax = axes[2]
    ax.plot(x, curve["median_tpot_ms"], marker="o", label="median TPOT")
    if curve["p99_itl_ms"].notna().any():
        ax.plot(x, curve["p99_itl_ms"], marker=".", linestyle=":", label="P99 ITL")
    slo_line(ax, slo.tpot_ms, f"TPOT SLO {slo.tpot_ms:g} ms" if slo.tpot_ms else "")
    slo_line(ax, slo.p99_tpot_ms, f"P99 TPOT SLO {slo.p99_tpot_ms:g} ms" if slo.p99_tpot_ms else "",
             linestyle=":", color="#8e0000")
    slo_line(ax, slo.p99_itl_ms, f"P99 ITL SLO {slo.p99_itl_ms:g} ms" if slo.p99_itl_ms else "",
             linestyle="-.", color="#8e0000")
    ax.scatter(x[at], curve["median_tpot_ms"][at], **REC_STYLE, label="recommended")
    ax.set_ylabel("ms per output token")
    ax.set_title(f"Per-token latency at {load:.2f} req/s")

    ax = axes[3]
    ax.plot(x, curve["slo_attainment"] * 100, marker="o", label="requests within the SLOs")
    slo_line(ax, slo.attainment * 100, f"attainment target {slo.attainment:.0%}")
    ax.scatter(x[at], curve["slo_attainment"][at] * 100, **REC_STYLE, label="recommended")
    ax.set_ylim(0, 105)
    ax.set_ylabel("SLO attainment (%)")
    ax.set_title(f"SLO attainment at {load:.2f} req/s")

    for ax in axes:
        seqs_axis(ax, x)
        ax.set_xlabel("max_num_seqs (log2 scale)")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7)
    fig.suptitle(
        f"Capacity plan for {result.target_rate:g} req/s: {rec.replicas} x "
        f"max_num_seqs={rec.max_num_seqs}, max_num_batched_tokens={rec.max_num_batched_tokens} "
        f"on {rec.hardware} ({result.gpus(rec)} GPU(s))")
    return save(fig, stem)
