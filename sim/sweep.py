"""``cbsim sweep``: run a scenario over a grid of its fields, locally or on a Ray cluster.

A scenario's ``sweep:`` block names dotted fields and their values::

    sweep:
      grid: {engine.max_num_seqs: [16, 64, 256], policy.name: [static, continuous]}  # product
      zip: {engine.max_num_batched_tokens: [2048, 8192], engine.block_size: [16, 32]}  # rows
      rates: [2, 4, 8]              # the workload's arrival rate (a trace's target rate)

Points are the product of the grid, the zipped rows, the rates and the scenario's variants.
Each point is keyed by a hash of its fully resolved scenario; its row is written to its own
small Parquet file under ``OUT/sweep/points/`` (written to a temporary name, then renamed) as
soon as it finishes, so a sweep that is stopped, killed or crashes keeps every finished point
and a rerun only runs the rest. ``OUT/sweep/results.parquet`` is the combined table, in point
order. Every point uses the scenario's own seed, never one derived from a worker or the order
of completion, so the local and Ray executors produce the same table.
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import json
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sim.config import Scenario, read_yaml, set_dotted, validate
from sim.errors import InputError

RATE = "rate"
VARIANT = "variant"
RAY_INSTALL_HINT = 'the ray executor needs Ray: pip install "cbsim[ray]" (or pip install "ray>=2.9")'


# -- points ---------------------------------------------------------------------------------
@dataclass
class Point:
    index: int
    params: dict[str, Any]  # dotted field (or "variant", "rate") -> value, in sweep order
    data: dict[str, Any]  # the resolved scenario mapping
    key: str = ""


def set_rate(data: dict[str, Any], rate: float, source: str = "rate") -> None:
    """Make the workload arrive at ``rate`` req/s: a trace is rescaled to it, a synthetic
    arrival process gets it as its rate."""
    workload = data.setdefault("workload", {})
    arrival = workload.get("arrival") or {"kind": "poisson"}
    if workload.get("trace") is not None:
        trace = workload["trace"]
        if isinstance(trace, str):
            trace = {"path": trace}
        workload["trace"] = {**trace, "target_rate": float(rate)}
        if arrival.get("kind", "poisson") == "all_at_once":
            return
    elif arrival.get("kind") == "all_at_once" or workload.get("requests") is not None:
        raise InputError(f"{source}: the workload has no arrival rate to set (it is "
                         "all_at_once or an explicit request list); use a poisson, gamma or "
                         "constant arrival or a timed trace")
    workload["arrival"] = {**arrival, "rate": float(rate)}


def point_key(data: dict[str, Any]) -> str:
    """A stable hash of a resolved scenario: the same point gets the same key on every run."""
    canonical = json.dumps(data, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def _apply(data: dict[str, Any], params: dict[str, Any], variants: dict, source: str) -> None:
    for name, value in params.items():
        if name == VARIANT:
            for k, v in variants[value].items():
                set_dotted(data, k, copy.deepcopy(v))
        elif name == RATE:
            set_rate(data, value, f"{source}: sweep.rates")
        else:
            set_dotted(data, name, copy.deepcopy(value))


def expand_points(raw: dict[str, Any], source: str = "scenario") -> list[Point]:
    """Every point of the sweep (variants x grid x zipped rows x rates), validated."""
    sc = validate(raw, source)
    spec = sc.sweep
    variants = raw.get("variants") or {}
    base = {k: v for k, v in raw.items() if k not in ("variants", "sweep")}
    dims: list[list[dict[str, Any]]] = []
    if variants:
        dims.append([{VARIANT: name} for name in variants])
    if spec is not None:
        for name, values in spec.grid.items():
            dims.append([{name: v} for v in values])
        if spec.zip:
            keys = list(spec.zip)
            rows = zip(*(spec.zip[k] for k in keys), strict=True)
            dims.append([dict(zip(keys, row, strict=True)) for row in rows])
        if spec.rates:
            dims.append([{RATE: r} for r in spec.rates])
    points = []
    for i, combo in enumerate(itertools.product(*dims)):
        params: dict[str, Any] = {}
        for part in combo:
            params.update(part)
        data = copy.deepcopy(base)
        _apply(data, params, variants, source)
        where = f"{source} (sweep point {_label(params)})"
        validate(data, where)
        points.append(Point(i, params, data, point_key(data)))
    keys = [p.key for p in points]
    if len(set(keys)) != len(keys):
        raise InputError(f"{source}: sweep: two points resolve to the same scenario; "
                         "remove the repeated values")
    return points


def _label(params: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in params.items()) or "base"


# -- one point ------------------------------------------------------------------------------
def scalar_summary(summary: dict[str, Any]) -> dict[str, Any]:
    """The summary's numbers and strings (nested breakdowns are left to summary.json)."""
    out = {}
    for k, v in summary.items():
        if isinstance(v, bool | int | float | str) or v is None:
            out[k] = v
    return out


def evaluate(data: dict[str, Any]) -> dict[str, Any]:
    """Simulate one resolved scenario; its summary numbers and, given ``plan.slo``, SLO columns.

    Module level and pure (the result depends on ``data`` only): process pools and Ray run it.
    """
    from sim.engine import simulate
    from sim.plan import evaluate_slo

    sc = validate(data, "sweep point")
    res = simulate(sc)
    row = scalar_summary(res.summary)
    if sc.plan is not None:
        row.update(evaluate_slo(res.records.columns(), res.summary, sc.plan.slo).row())
    return row


# -- executors ------------------------------------------------------------------------------
class LocalExecutor:
    """A process pool over all cores (or ``workers``); one worker runs in this process."""

    name = "local"

    def __init__(self, workers: int | None = None) -> None:
        self.workers = max(1, workers or os.cpu_count() or 1)
        self._pool = None

    def imap_unordered(self, fn: Callable, items: list) -> Iterator[tuple[int, Any]]:
        if self.workers == 1 or len(items) <= 1:
            for i, item in enumerate(items):
                yield i, fn(item)
            return
        import multiprocessing as mp
        from concurrent.futures import ProcessPoolExecutor, as_completed

        if self._pool is None:
            ctx = mp.get_context("fork") if "fork" in mp.get_all_start_methods() else None
            self._pool = ProcessPoolExecutor(self.workers, mp_context=ctx)
        futures = {self._pool.submit(fn, item): i for i, item in enumerate(items)}
        try:
            for fut in as_completed(futures):
                yield futures[fut], fut.result()
        finally:
            for fut in futures:
                fut.cancel()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None


class RayExecutor:
    """Tasks on a Ray cluster: ``address`` "auto" joins a running cluster, "ray://host:port" a
    remote one through Ray Client; None starts a local one (``workers`` CPUs)."""

    name = "ray"

    def __init__(self, address: str | None = None, workers: int | None = None) -> None:
        try:
            import ray
        except ImportError:
            raise InputError(RAY_INSTALL_HINT) from None
        self.ray = ray
        self._started = False
        if not ray.is_initialized():
            root = str(Path(__file__).resolve().parents[1])
            if address is None or address == "local":
                runtime_env = {"env_vars": {"PYTHONPATH": root}}
                ray.init(num_cpus=workers, runtime_env=runtime_env, include_dashboard=False,
                         log_to_driver=False, configure_logging=False)
            else:
                # Ship this checkout's packages to the cluster's workers (the simulator and the
                # cost profiles it loads), so the cluster needs only the dependencies installed.
                runtime_env = {"py_modules": [str(Path(root) / "sim"), str(Path(root) / "profiles")]}
                try:
                    ray.init(address=address, runtime_env=runtime_env, log_to_driver=False)
                except ConnectionError as exc:
                    raise InputError(f"--address {address}: no Ray cluster there ({exc})") from None
            self._started = True
        self._remote = {}

    def imap_unordered(self, fn: Callable, items: list) -> Iterator[tuple[int, Any]]:
        ray = self.ray
        remote = self._remote.get(fn)
        if remote is None:
            remote = self._remote[fn] = ray.remote(num_cpus=1)(fn)
        refs = {remote.remote(item): i for i, item in enumerate(items)}
        pending = list(refs)
        try:
            while pending:
                done, pending = ray.wait(pending, num_returns=1)
                for ref in done:
                    yield refs[ref], ray.get(ref)
        finally:
            for ref in pending:
                ray.cancel(ref)

    def close(self) -> None:
        if self._started:
            self.ray.shutdown()
            self._started = False


def make_executor(name: str = "local", workers: int | None = None, address: str | None = None):
    if name == "local":
        if address is not None:
            raise InputError("--address is for --executor ray")
        return LocalExecutor(workers)
    if name == "ray":
        return RayExecutor(address, workers)
    raise InputError(f"--executor: unknown executor '{name}'; allowed: local, ray")


# -- the table ------------------------------------------------------------------------------
@dataclass
class SweepResult:
    frame: Any  # pandas.DataFrame, one row per point in point order
    out: Path
    ran: int  # points run now (the rest were already on disk)
    points: list[Point] = field(default_factory=list)
    plots: list[Path] = field(default_factory=list)

    @property
    def table_path(self) -> Path:
        return self.out / "sweep" / "results.parquet"


def _write_part(folder: Path, point: Point, row: dict[str, Any]) -> None:
    import pandas as pd

    record = {"point": point.index, "key": point.key, **_param_columns(point.params), **row}
    tmp = folder / f".{point.key}.parquet.tmp"
    pd.DataFrame([record]).to_parquet(tmp, index=False)
    os.replace(tmp, folder / f"{point.key}.parquet")


def _param_columns(params: dict[str, Any]) -> dict[str, Any]:
    return {k: (json.dumps(v) if isinstance(v, dict | list) else v) for k, v in params.items()}


def done_keys(folder: Path) -> set[str]:
    return {p.stem for p in folder.glob("*.parquet")} if folder.is_dir() else set()


def combine(folder: Path, points: list[Point]):
    """The points' rows in point order (parts of points no longer in the sweep are ignored)."""
    import pandas as pd

    order = {p.key: p.index for p in points}
    frames = []
    for path in sorted(folder.glob("*.parquet")):
        if path.stem in order:
            frames.append(pd.read_parquet(path))
    if not frames:
        return pd.DataFrame()
    frame = pd.concat(frames, ignore_index=True)
    frame["point"] = frame["key"].map(order)
    frame = frame.sort_values("point", kind="stable").reset_index(drop=True)
    for col in frame.columns:
        if frame[col].dtype == object:
            types = {type(v) for v in frame[col] if v is not None}
            if len(types) > 1:
                frame[col] = frame[col].map(lambda v: None if v is None else str(v))
    return frame


def run_points(points: list[Point], out: Path, executor, on_done=None) -> int:
    """Run the points not yet on disk under ``out/sweep/points``; returns how many ran."""
    folder = out / "sweep" / "points"
    folder.mkdir(parents=True, exist_ok=True)
    for stale in folder.glob(".*.tmp"):
        stale.unlink()
    have = done_keys(folder)
    todo = [p for p in points if p.key not in have]
    if on_done:
        on_done(None, len(points) - len(todo), len(points))
    ran = 0
    for i, row in executor.imap_unordered(evaluate, [p.data for p in todo]):
        _write_part(folder, todo[i], row)
        ran += 1
        if on_done:
            on_done(todo[i], len(points) - len(todo) + ran, len(points))
    return ran


def read_raw(path: str | Path | dict) -> dict[str, Any]:
    """A scenario mapping from a YAML file, or a copy of one given directly (notebooks)."""
    return copy.deepcopy(path) if isinstance(path, dict) else read_yaml(path)


def load_sweep(path: str | Path | dict, overrides: Iterable[str] = ()) -> tuple[dict, list[Point]]:
    from sim.config import parse_set_option

    raw = read_raw(path)
    for option in overrides:
        key, value = parse_set_option(option)
        set_dotted(raw, key, value)
    return raw, expand_points(raw, _source(path))


def _source(path) -> str:
    return "scenario" if isinstance(path, dict) else str(path)


def run_sweep(path: str | Path | dict, out: Path | None = None, overrides: Iterable[str] = (),
              executor: str = "local", workers: int | None = None, address: str | None = None,
              on_done=None, plots: bool = True) -> SweepResult:
    raw, points = load_sweep(path, list(overrides))
    sc: Scenario = validate(raw, _source(path))
    out = Path(out) if out is not None else Path("results") / sc.name
    ex = make_executor(executor, workers, address)
    ran = 0
    try:
        ran = run_points(points, out, ex, on_done)
    finally:
        ex.close()
        # Also when stopped (Ctrl-C, an error): the table then holds the points finished so far.
        frame = write_table(out, points)
    result = SweepResult(frame, out, ran, points)
    if plots:
        from sim.plots_sweep import plot_sweep

        slo = sc.plan.slo if sc.plan is not None else None
        result.plots = plot_sweep(frame, param_names(points), out / "sweep", slo)
    return result


def write_table(out: Path, points: list[Point]):
    """Combine the finished points' parts into ``out/sweep/results.parquet`` (atomically)."""
    frame = combine(out / "sweep" / "points", points)
    path = out / "sweep" / "results.parquet"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    frame.to_parquet(tmp, index=False)
    os.replace(tmp, path)
    return frame


def param_names(points: list[Point]) -> list[str]:
    names: list[str] = []
    for p in points:
        for k in p.params:
            if k not in names:
                names.append(k)
    return names


SUMMARY_METRICS = (
    ("request_throughput", "req/s", "{:.2f}"),
    ("output_throughput", "out tok/s", "{:.0f}"),
    ("p99_ttft_ms", "TTFT p99 ms", "{:.0f}"),
    ("median_tpot_ms", "TPOT p50 ms", "{:.1f}"),
    ("p99_itl_ms", "ITL p99 ms", "{:.1f}"),
    ("preemptions", "preempt", "{:.0f}"),
    ("slo_attainment", "SLO att.", "{:.0%}"),
)
