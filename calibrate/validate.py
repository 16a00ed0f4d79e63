"""``cbsim validate``: one workload on the real backend (real-time arrivals) and in the simulator
with a profile; the error per metric, as a table, JSON and overlaid CDFs.

The simulator gets the backend's KV block count, so both schedule against the same cache; the
same request table feeds both. ``roofline=True`` also simulates with the uncalibrated roofline,
the baseline a profile must beat.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from sim.config import CostModelConfig, Scenario, load_scenario
from sim.engine import SimResult, simulate
from sim.errors import InputError

THROUGHPUT = ("request_throughput", "output_throughput", "total_token_throughput")
LATENCIES = ("ttft", "tpot", "itl", "e2el")
STATS = ("mean", "median", "p90", "p99")
METRICS: tuple[str, ...] = (
    *THROUGHPUT,
    *(f"{s}_{m}_ms" for m in LATENCIES for s in STATS),
    "preemptions",
    "kv_usage_max",
)
# The metrics the GPU acceptance bound names: throughput and medians within 5%, P99 within 10%.
HEADLINE = ("request_throughput", "output_throughput", "median_ttft_ms", "median_tpot_ms",
            "median_e2el_ms", "p99_ttft_ms", "p99_tpot_ms", "p99_e2el_ms")


def relative_error(simulated, measured) -> float | None:
    if simulated is None or measured is None:
        return None
    simulated, measured = float(simulated), float(measured)
    if math.isnan(simulated) or math.isnan(measured):
        return None
    if measured == 0:
        return 0.0 if simulated == 0 else None
    return (simulated - measured) / abs(measured)


@dataclass
class Validation:
    scenario: Scenario
    real: SimResult
    sim: SimResult
    roofline: SimResult | None = None
    rows: list[dict] = field(default_factory=list)
    # Reference step timed now over its time at calibration, before and after the replay.
    drift: list[float] = field(default_factory=list)

    def error(self, metric: str, model: str = "profile") -> float | None:
        for row in self.rows:
            if row["metric"] == metric:
                return row["rel_error" if model == "profile" else "roofline_rel_error"]
        raise KeyError(metric)

    def mean_abs_error(self, metrics=HEADLINE, model: str = "profile") -> float:
        errs = [abs(e) for m in metrics if (e := self.error(m, model)) is not None]
        return float(np.mean(errs)) if errs else float("nan")

    def to_json(self) -> dict:
        return {
            "scenario": self.scenario.name,
            "model": self.scenario.model,
            "hardware": self.scenario.hardware,
            "policy": self.scenario.policy.name,
            "enable_chunked_prefill": self.scenario.engine.enable_chunked_prefill,
            "requests": int(self.real.summary.get("num_requests", 0)),
            "kv_blocks": self.real.num_kv_blocks,
            "machine_drift": self.drift,
            "metrics": self.rows,
            "mean_abs_rel_error_headline": self.mean_abs_error(),
            "roofline_mean_abs_rel_error_headline": (self.mean_abs_error(model="roofline")
                                                     if self.roofline is not None else None),
        }


def compare(real: dict, sim: dict, roofline: dict | None) -> list[dict]:
    rows = []
    for m in METRICS:
        row = {"metric": m, "measured": real.get(m), "simulated": sim.get(m),
               "rel_error": relative_error(sim.get(m), real.get(m))}
        if roofline is not None:
            row["roofline"] = roofline.get(m)
            row["roofline_rel_error"] = relative_error(roofline.get(m), real.get(m))
        rows.append(row)
    return rows


def validate_scenario(sc: Scenario, profile: str | Path, *, table=None, device: str | None = None,
                      roofline: bool = True, threads: int = 1, check_drift: bool | None = None,
                      runner=None, log=None) -> Validation:
    """Replay ``sc`` on the backend, simulate it with ``profile`` (and the roofline), compare.

    ``runner``: a ModelRunner built earlier for the same model and engine shape (block size,
    max_num_seqs), reused instead of building the model, cache and CUDA graphs again."""

    from calibrate.calibration import cpu_threads, pick_device
    from gpu_backend.replay import replay
    from sim.build import build_cost_model
    from sim.workload.spec import build_workload

    if sc.cluster.replicas != 1:
        raise InputError("cluster.replicas: validate replays one replica on one device; set it to 1")
    sc = sc.model_copy(update={"simulation": sc.simulation.model_copy(update={"record_token_times": True})})
    profiled = sc.model_copy(update={"cost_model": CostModelConfig(kind="profile", path=str(profile))})
    build_cost_model(profiled)  # a malformed or mismatched profile fails here, before the replay
    dev = pick_device(device)
    if check_drift is None:
        check_drift = dev == "cpu"
    if table is None:
        table = build_workload(sc.workload, sc.seed)
    if log:
        log(f"replaying {len(table)} requests on the {dev} backend (real time)")
    with cpu_threads(threads, dev):
        drift = [machine_drift(profile, dev)] if check_drift else []
        if runner is None:
            real = replay(sc, table, device=dev)
        else:
            from gpu_backend.engine import GpuEngine

            real = GpuEngine(sc, table, runner).run()
        if check_drift:
            drift.append(machine_drift(profile, dev))
    blocks = {"num_gpu_blocks_override": real.num_kv_blocks}

    def on(s: Scenario) -> Scenario:
        return s.model_copy(update={"engine": s.engine.model_copy(update=blocks)})

    sim = simulate(on(profiled), table)
    base = None
    if roofline:
        base = simulate(on(sc.model_copy(update={"cost_model": CostModelConfig(kind="roofline")})), table)
    rows = compare(real.summary, sim.summary, base.summary if base else None)
    return Validation(sc, real, sim, base, rows, drift)


DRIFT_SHAPES = ("decode d=16x192", "decode d=32x1024")


def machine_drift(profile: str | Path, device: str, repeats: int = 9) -> float:
    """How much slower the machine is now than at calibration: a reference shape's step time
    now over the profile's measurement of it (1.0: unchanged). A shared CPU drifts a lot."""
    from calibrate.grid import StepShape
    from calibrate.timing import build_backend, time_shape

    data = json.loads(Path(profile).read_text())
    points = (data.get("fit") or {}).get("per_point") or {}
    key = next((k for k in DRIFT_SHAPES if k in points), None)
    if key is None:
        return float("nan")
    batch, ctx = key.split("=")[1].split("x")
    shape = StepShape("decode", decode=(int(ctx),) * int(batch))
    backend = getattr(machine_drift, "_backend", None)
    if backend is None or backend.model != data["model"]:
        backend = build_backend(data["model"], device, num_blocks=4096 if device == "cpu" else None,
                                max_batch=32)
        machine_drift._backend = backend
    now = time_shape(backend, shape, warmup=2, repeats=repeats)["median_s"]
    return now * 1e3 / points[key]["measured_ms"]


def validate(scenario: str, profile: str | Path, out: Path, overrides: list[str] | None = None, *,
             device: str | None = None, roofline: bool = True, log=None) -> tuple[Validation, list[Path]]:
    """``cbsim validate``: run, then write validation.json and the CDF overlays into ``out``."""
    sc, raw = load_scenario(scenario, overrides)
    if raw.get("variants"):
        raise InputError(f"{scenario}: variants: validate runs one configuration; pick one with --set")
    v = validate_scenario(sc, profile, device=device, roofline=roofline, log=log)
    out.mkdir(parents=True, exist_ok=True)
    payload = v.to_json() | {"profile": str(profile), "scenario_file": str(scenario)}
    (out / "validation.json").write_text(json.dumps(payload, indent=2, default=float) + "\n")
    plots = plot_cdfs(v, out)
    return v, plots


# -- report --------------------------------------------------------------------------------
def _fmt(value, metric: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if metric in ("preemptions",):
        return f"{int(value)}"
    if metric == "kv_usage_max":
        return f"{value:.0%}"
    return f"{value:.3g}" if abs(value) < 100 else f"{value:.0f}"


def _pct(e) -> str:
    return "-" if e is None else f"{e:+.1%}"


def error_table(v: Validation, title: str):
    from rich.table import Table

    table = Table(title=title)
    for col in ("metric", "measured", "simulated", "error"):
        table.add_column(col, justify="left" if col == "metric" else "right")
    if v.roofline is not None:
        table.add_column("roofline", justify="right")
        table.add_column("roofline error", justify="right")
    for row in v.rows:
        m = row["metric"]
        cells = [m, _fmt(row["measured"], m), _fmt(row["simulated"], m), _pct(row["rel_error"])]
        if v.roofline is not None:
            cells += [_fmt(row["roofline"], m), _pct(row["roofline_rel_error"])]
        table.add_row(*cells)
    return table


def _itl(result: SimResult) -> np.ndarray:
    times = result.records.token_times
    gaps = [np.diff(t) for t in times.values() if len(t) > 1]
    return np.concatenate(gaps) * 1e3 if gaps else np.array([])


def plot_cdfs(v: Validation, out: Path) -> list[Path]:
    """TTFT, E2E and ITL: the measured distribution against the simulated ones."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = {"measured (backend)": v.real, "simulated (profile)": v.sim}
    if v.roofline is not None:
        runs["simulated (roofline)"] = v.roofline
    styles = {"measured (backend)": ("k", "-"), "simulated (profile)": ("tab:blue", "--"),
              "simulated (roofline)": ("tab:orange", ":")}
    paths = []
    for name, label in (("ttft", "TTFT ms"), ("e2el", "E2E latency ms"), ("itl", "inter-token latency ms")):
        fig, ax = plt.subplots(figsize=(6, 4))
        drawn = False
        for run, res in runs.items():
            if name == "itl":
                values = _itl(res)
            else:
                frame = res.frame()
                values = frame.loc[frame.state == "finished", name].to_numpy() * 1e3
            values = np.sort(values[~np.isnan(values)])
            if len(values):
                color, style = styles[run]
                ax.plot(values, np.arange(1, len(values) + 1) / len(values), color=color, ls=style, label=run)
                drawn = True
        if not drawn:
            plt.close(fig)
            continue
        ax.set(xlabel=label, ylabel="fraction of requests" if name != "itl" else "fraction of tokens",
               title=f"{v.scenario.name}: {label.split(' ms')[0]}")
        ax.set_xscale("log")
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        path = out / f"cdf_{name}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths
