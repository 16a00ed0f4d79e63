"""Summary metrics of a run, named as in ``vllm bench serve``'s result JSON, plus ours."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np

from sim.core.request import RequestState

PERCENTILES = (50, 90, 95, 99)


class LogHistogram:
    """Counts of positive values in log-spaced bins (0.05% wide): exact count, mean and std,
    percentiles to 0.05%, in constant memory however many inter-token gaps a run has.

    Values are buffered and binned with numpy in bulk, because a long run adds millions.
    """

    RATIO = 1.001
    LOW = 1e-7
    FLUSH_AT = 1 << 16

    def __init__(self) -> None:
        self.counts = np.zeros(0, dtype=np.int64)
        self.n = 0
        self.total = 0.0
        self.total_sq = 0.0
        self._values: list[float] = []
        self._weights: list[int] = []

    def add(self, value: float, count: int = 1) -> None:
        self._values.append(value)
        self._weights.append(count)
        if len(self._values) >= self.FLUSH_AT:
            self._flush()

    def add_many(self, values: list[float]) -> None:
        self.add_weighted(values, [1] * len(values))

    def add_weighted(self, values: list[float], counts: list[int]) -> None:
        """``values[i]`` seen ``counts[i]`` times each."""
        self._values.extend(values)
        self._weights.extend(counts)
        if len(self._values) >= self.FLUSH_AT:
            self._flush()

    def _flush(self) -> None:
        if not self._values:
            return
        v = np.asarray(self._values, dtype=np.float64)
        w = np.asarray(self._weights, dtype=np.int64)
        self._values, self._weights = [], []
        bins = (np.log(np.maximum(v, self.LOW) / self.LOW) / math.log(self.RATIO)).astype(np.int64)
        if len(bins) and bins.max() >= len(self.counts):
            grown = np.zeros(int(bins.max()) + 1, dtype=np.int64)
            grown[: len(self.counts)] = self.counts
            self.counts = grown
        np.add.at(self.counts, bins, w)
        self.n += int(w.sum())
        self.total += float(np.dot(v, w))
        self.total_sq += float(np.dot(v * v, w))

    def percentile(self, q: float) -> float:
        self._flush()
        if not self.n:
            return float("nan")
        cum = np.cumsum(self.counts)
        b = int(np.searchsorted(cum, q / 100.0 * (self.n - 1), side="right"))
        return self.LOW * self.RATIO ** (b + 0.5)

    @property
    def mean(self) -> float:
        self._flush()
        return self.total / self.n if self.n else float("nan")

    @property
    def std(self) -> float:
        self._flush()
        if not self.n:
            return float("nan")
        var = self.total_sq / self.n - self.mean**2
        return math.sqrt(max(var, 0.0))

    def __len__(self) -> int:
        self._flush()
        return self.n


def value_counts(values: np.ndarray) -> dict[str, int]:
    """How often each value occurs, by value (np.unique's order) as ``{str: int}``; hashing
    instead of sorting, which matters for object (string) columns of a million rows."""
    return {str(v): c for v, c in sorted(Counter(values.tolist()).items())}


def _stats(prefix: str, values_s: np.ndarray, out: dict) -> None:
    v = values_s[~np.isnan(values_s)] * 1e3 if len(values_s) else np.zeros(0)
    if len(v) == 0:
        for key in ("mean", "median", "std", *(f"p{p}" for p in PERCENTILES[1:])):
            out[f"{key}_{prefix}_ms"] = None
        return
    out[f"mean_{prefix}_ms"] = float(v.mean())
    out[f"median_{prefix}_ms"] = float(np.median(v))
    out[f"std_{prefix}_ms"] = float(v.std())
    qs = PERCENTILES[1:]
    for p, x in zip(qs, np.percentile(v, qs).tolist(), strict=True):  # one partition for all
        out[f"p{p}_{prefix}_ms"] = x


def _hist_stats(prefix: str, hist: LogHistogram, out: dict) -> None:
    if not len(hist):
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
    summary["count_by_state"] = value_counts(state)
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


# -- traffic: terminal states, retries, wasted work, SLOs per class and tenant, cost ----------
TRAFFIC_PERCENTILES = (50, 95, 99)
_UNFINISHED = ("waiting", "running", "preempted", "swapped")


def _pcts(prefix: str, values_s: np.ndarray, out: dict) -> None:
    v = values_s[~np.isnan(values_s)] * 1e3
    qs = TRAFFIC_PERCENTILES
    values = np.percentile(v, qs).tolist() if len(v) else [None] * len(qs)
    for p, x in zip(qs, values, strict=True):
        out[f"p{p}_{prefix}_ms"] = x


def client_arrival(cols: dict[str, np.ndarray]) -> np.ndarray:
    """Per record: when its client first asked (the first attempt's arrival)."""
    client = cols["client_id"]
    arrival = cols["arrival"]
    if len(client) == 0:
        return arrival
    ids, inverse = np.unique(client, return_inverse=True)
    first = np.full(len(ids), np.inf)
    np.minimum.at(first, inverse, arrival)
    return first[inverse]


def slo_met(cols: dict[str, np.ndarray], slos: dict) -> np.ndarray:
    """Per record: finished and within every SLO of its class, latencies counted from when the
    client first asked (so a retried request pays for its refusals and backoff); classes
    without SLOs: finished."""
    ok = cols["state"] == RequestState.FINISHED.value
    met = ok.copy()
    cls = cols["cls"]
    origin = client_arrival(cols) if slos else None
    for name, slo in slos.items():
        mask = ok & (cls == name)
        if mask.any():
            o = origin[mask]
            met[mask] = slo.met(cols["first_token"][mask] - o, cols["tpot"][mask],
                                cols["finish"][mask] - o)
    return met


def jain_index(values) -> float | None:
    """Jain's fairness index: 1 when all equal, 1/n when one takes everything."""
    x = np.asarray(list(values), dtype=np.float64)
    if len(x) == 0 or not np.any(x):
        return None
    return float(x.sum() ** 2 / (len(x) * (x * x).sum()))


def _wasted(cols: dict[str, np.ndarray], sel: np.ndarray) -> tuple[int, float]:
    """Positions and GPU seconds spent on ``sel`` that produced nothing a client kept:
    all of a cancelled / timed-out / failed attempt's work, a finished one's recomputes."""
    state = cols["state"][sel]
    computed = cols["computed_tokens"][sel]
    gpu = cols["gpu_seconds"][sel]
    lost = np.isin(state, ("cancelled", "timed_out", "failed", "rejected"))
    ok = state == RequestState.FINISHED.value
    useful = (cols["prompt_len"][sel] + cols["output_tokens"][sel] - 1 - cols["cached_tokens"][sel])
    extra = np.where(ok, np.maximum(computed - useful, 0), 0)
    tokens = int(computed[lost].sum() + extra.sum())
    share = np.divide(extra, computed, out=np.zeros(len(computed)), where=computed > 0)
    seconds = float(gpu[lost].sum() + (gpu * share)[ok].sum())
    return tokens, seconds


def group_summary(cols: dict[str, np.ndarray], sel: np.ndarray, met: np.ndarray,
                  duration: float) -> dict:
    """Counts, latency percentiles, goodput and SLO attainment of the records in ``sel``."""
    state = cols["state"][sel]
    ok = state == RequestState.FINISHED.value
    n = int(sel.sum())
    good = int(met[sel].sum())
    out: dict = {
        "num_requests": n,
        "count_by_state": value_counts(state),
        "completed": int(ok.sum()),
        "request_throughput": float(ok.sum()) / duration,
        "output_tokens": int(cols["output_tokens"][sel][ok].sum()),
        "served_tokens": int((cols["prompt_len"][sel] + cols["output_tokens"][sel])[ok].sum()),
        "goodput": good / duration,
        "clients": int(len(np.unique(cols["client_id"][sel]))),
    }
    # Share of clients (a request and its retries) served within every SLO of their class.
    out["slo_attainment"] = good / out["clients"] if out["clients"] else None
    out["attempts_per_client"] = n / out["clients"] if out["clients"] else None
    for name in ("ttft", "tpot", "e2el", "queue_wait"):
        _pcts(name, cols[name][sel][ok], out)
    tokens, seconds = _wasted(cols, sel)
    out["wasted_tokens"] = tokens
    out["wasted_gpu_seconds"] = seconds
    return out


def traffic_summary(cols: dict[str, np.ndarray], *, duration: float, slos: dict,
                    weights: dict[str, float], num_replicas: int, price_per_gpu_hour: float,
                    queue_len: list[int] | None = None, extra: dict | None = None) -> dict:
    """Terminal states and reasons, retries, wasted work, goodput, per class / tenant, cost."""
    state = cols["state"]
    reason = cols["reason"]
    n = len(state)
    everything = np.ones(n, dtype=bool)
    met = slo_met(cols, slos)
    by_reason: dict[str, dict[str, int]] = {}
    for i in np.flatnonzero(state != RequestState.FINISHED.value).tolist():
        inner = by_reason.setdefault(str(state[i]), {})
        r = str(reason[i]) or "-"
        inner[r] = inner.get(r, 0) + 1
    state_counts = value_counts(state)
    client = cols["client_id"]
    num_clients = int(len(np.unique(client)))
    # A client succeeded when any of its attempts finished.
    ok = state == RequestState.FINISHED.value
    good_clients = int(len(np.unique(client[ok])))
    lost = np.isin(state, ("cancelled", "timed_out"))
    _, seconds = _wasted(cols, everything)
    gpu_total = float(cols["gpu_seconds"].sum())
    completed = int(ok.sum())
    gpu_hours = num_replicas * duration / 3600.0
    cost = gpu_hours * price_per_gpu_hour
    out: dict = {
        "rejected": int((state == RequestState.REJECTED.value).sum()),
        "cancelled": int((state == RequestState.CANCELLED.value).sum()),
        "timed_out": int((state == RequestState.TIMED_OUT.value).sum()),
        "rate_by_state": {v: c / duration for v, c in state_counts.items()},
        "count_by_reason": by_reason,
        "clients": num_clients,
        "attempts": n,
        "retries": n - num_clients,
        "attempts_per_client_mean": n / num_clients if num_clients else None,
        "attempts_per_client_max": int(np.bincount(np.unique(client, return_inverse=True)[1]).max())
        if n else 0,
        "client_success_rate": good_clients / num_clients if num_clients else None,
        # Attempts ended by a client or by expiry after the GPU had started on them.
        "generation_cancelled": int((lost & (cols["computed_tokens"] > 0)).sum()),
        "wasted_gpu_seconds": seconds,
        "wasted_tokens_by_state": {},
        "wasted_gpu_seconds_by_state": {},
        "gpu_seconds": gpu_total,
        "wasted_gpu_fraction": seconds / gpu_total if gpu_total else 0.0,
        "goodput": float(met.sum()) / duration,
        "slo_attainment": float(met.sum()) / num_clients if num_clients else None,
        "cost_per_gpu_hour": price_per_gpu_hour,
        "cost_total": cost,
        "cost_per_successful_request": cost / completed if completed else None,
        "cost_per_good_request": cost / float(met.sum()) if met.any() else None,
    }
    for s in ("finished", "cancelled", "timed_out", "failed"):
        t, sec = _wasted(cols, state == s)
        out["wasted_tokens_by_state"][s] = t
        out["wasted_gpu_seconds_by_state"][s] = sec
    if queue_len:
        q = np.asarray(queue_len)
        out["queue_len_mean"] = float(q.mean())
        out["queue_len_max"] = int(q.max())
    out["per_class"] = {str(c): group_summary(cols, cols["cls"] == c, met, duration)
                        for c in sorted(set(cols["cls"].tolist()))}
    tenants = sorted(set(cols["tenant"].tolist()))
    out["per_tenant"] = {str(t): group_summary(cols, cols["tenant"] == t, met, duration)
                         for t in tenants}
    if len(tenants) > 1:
        served = [out["per_tenant"][t]["served_tokens"] / weights.get(t, 1.0) for t in tenants]
        out["fairness_jain_tenants"] = jain_index(served)
    if extra:
        out.update(extra)
    return out
