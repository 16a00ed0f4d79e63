"""Summary metrics of a run, named as in ``vllm bench serve``'s result JSON, plus ours."""

from __future__ import annotations

import math

import numpy as np

from sim.core.request import RequestState

PERCENTILES = (50, 90, 95, 99)


class LogHistogram:
    """Counts of positive values in log-spaced bins (0.05% wide): exact count, mean and std,
    percentiles to 0.05%, in constant memory however many inter-token gaps a run has."""

    RATIO = 1.001
    LOW = 1e-7

    def __init__(self) -> None:
        self.counts: dict[int, int] = {}
        self.n = 0
        self.total = 0.0
        self.total_sq = 0.0
        self._log_ratio = math.log(self.RATIO)

    def add(self, value: float, count: int = 1) -> None:
        b = int(math.log(max(value, self.LOW) / self.LOW) / self._log_ratio)
        self.counts[b] = self.counts.get(b, 0) + count
        self.n += count
        self.total += value * count
        self.total_sq += value * value * count

    def add_many(self, values) -> None:
        for v in values:
            self.add(v)

    def percentile(self, q: float) -> float:
        if not self.n:
            return float("nan")
        target = q / 100.0 * (self.n - 1)
        seen = 0
        for b in sorted(self.counts):
            seen += self.counts[b]
            if seen > target:
                return self.LOW * self.RATIO ** (b + 0.5)
        return self.LOW * self.RATIO ** (max(self.counts) + 0.5)

    @property
    def mean(self) -> float:
        return self.total / self.n if self.n else float("nan")

    @property
    def std(self) -> float:
        if not self.n:
            return float("nan")
        var = self.total_sq / self.n - self.mean**2
        return math.sqrt(max(var, 0.0))


def _stats(prefix: str, values_s: np.ndarray, out: dict) -> None:
    v = values_s[~np.isnan(values_s)] * 1e3 if len(values_s) else np.zeros(0)
    if len(v) == 0:
        for key in ("mean", "median", "std", *(f"p{p}" for p in PERCENTILES[1:])):
            out[f"{key}_{prefix}_ms"] = None
        return
    out[f"mean_{prefix}_ms"] = float(v.mean())
    out[f"median_{prefix}_ms"] = float(np.median(v))
    out[f"std_{prefix}_ms"] = float(v.std())
    for p in PERCENTILES[1:]:
        out[f"p{p}_{prefix}_ms"] = float(np.percentile(v, p))


def _hist_stats(prefix: str, hist: LogHistogram, out: dict) -> None:
    if not hist.n:
        return _stats(prefix, np.zeros(0), out)
    out[f"mean_{prefix}_ms"] = hist.mean * 1e3
    out[f"median_{prefix}_ms"] = hist.percentile(50) * 1e3
    out[f"std_{prefix}_ms"] = hist.std * 1e3
    for p in PERCENTILES[1:]:
        out[f"p{p}_{prefix}_ms"] = hist.percentile(p) * 1e3


def summarize(cols: dict[str, np.ndarray], *, itl: LogHistogram, run_stats: dict) -> dict:
    """The summary of one run from its record columns, ITL histogram and engine counters."""
    state = cols["state"]
    ok = state == RequestState.FINISHED.value
    arrival = cols["arrival"]
    finish = cols["finish"]
    start = float(arrival.min()) if len(arrival) else 0.0
    end_candidates = finish[~np.isnan(finish)]
    end = float(end_candidates.max()) if len(end_candidates) else start
    end = max(end, run_stats.get("end_time", end))
    duration = max(end - start, 1e-12)
    out_tok = int(cols["output_tokens"][ok].sum())
    in_tok = int(cols["prompt_len"][ok].sum())
    completed = int(ok.sum())
    summary: dict = {
        "duration": duration,
        "completed": completed,
        "num_requests": len(state),
        "total_input_tokens": in_tok,
        "total_output_tokens": out_tok,
        "request_throughput": completed / duration,
        "output_throughput": out_tok / duration,
        "total_token_throughput": (in_tok + out_tok) / duration,
    }
    _stats("ttft", cols["ttft"][ok], summary)
    _stats("tpot", cols["tpot"][ok], summary)
    _hist_stats("itl", itl, summary)
    _stats("e2el", cols["e2el"][ok], summary)
    _stats("queue_wait", cols["queue_wait"][ok], summary)
    values, counts = np.unique(state, return_counts=True) if len(state) else ([], [])
    summary["count_by_state"] = {str(v): int(c) for v, c in zip(values, counts, strict=True)}
    for s in RequestState:
        summary.setdefault("count_by_state", {}).setdefault(s.value, 0)
    summary["unfinished"] = sum(
        summary["count_by_state"][s.value]
        for s in (RequestState.WAITING, RequestState.RUNNING, RequestState.PREEMPTED,
                  RequestState.SWAPPED)
    )
    summary["preemptions"] = int(cols["preemptions"].sum())
    computed = int(cols["computed_tokens"].sum())
    # A finished request needs prompt + output - 1 positions run (the last token is never fed
    # back), less what the prefix cache supplied; anything computed beyond that was wasted
    # (recompute after preemption, work on requests cancelled or timed out).
    useful = int(
        (cols["prompt_len"][ok] + cols["output_tokens"][ok] - 1 - cols["cached_tokens"][ok]).sum()
    )
    summary["computed_tokens"] = computed
    summary["wasted_tokens"] = computed - useful
    summary.update(run_stats)
    return summary
