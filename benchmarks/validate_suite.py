"""Validation suite: hold-out workloads at three loads × three policies, one error table.

Each cell replays the suite's base scenario (a workload the calibration grid never timed) on
the backend in real time and simulates it with the profile and with the uncalibrated roofline.
Loads are fractions of the configuration's capacity, which the simulator estimates with the
profile (a saturated run of the same workload): about 50%, 80% and 110%.

    # CPU, tiny model (minutes):
    python -m calibrate ... ; python benchmarks/validate_suite.py --size tiny-cpu --profile P
    # GPU, Llama-3-8B shape on an H200:
    python benchmarks/validate_suite.py --size h200 --profile profiles/h200-llama3-8b.json \
        --out benchmarks/results/validation_h200
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from calibrate.validate import HEADLINE, validate_scenario  # noqa: E402
from sim.config import load_scenario, validate  # noqa: E402
from sim.engine import simulate  # noqa: E402

SIZES = {
    "tiny-cpu": {"scenario": "scenarios/validate_tiny_cpu.yaml", "requests": 100},
    "h200": {"scenario": "scenarios/validate_h200.yaml", "requests": 300},
}
LOADS = (0.5, 0.8, 1.1)
POLICIES = {
    "static": {"policy": {"name": "static"}, "engine": {"enable_chunked_prefill": False}},
    "continuous": {"policy": {"name": "continuous"}, "engine": {"enable_chunked_prefill": False}},
    "chunked": {"policy": {"name": "continuous"}, "engine": {"enable_chunked_prefill": True}},
}
# The GPU acceptance bounds: |error| on throughput and medians, and on P99s.
BOUND_MEDIAN, BOUND_P99 = 0.05, 0.10
COLUMNS = (("request_throughput", "req/s"), ("output_throughput", "tok/s"), ("median_ttft_ms", "TTFT p50"),
           ("median_tpot_ms", "TPOT p50"), ("median_e2el_ms", "E2E p50"), ("p99_ttft_ms", "TTFT p99"),
           ("p99_tpot_ms", "TPOT p99"), ("p99_e2el_ms", "E2E p99"))


def cell_scenario(raw: dict, policy: str, rate: float, requests: int, profile: str):
    data = json.loads(json.dumps(raw))
    data.pop("variants", None)
    over = POLICIES[policy]
    data["policy"] = over["policy"]
    data["engine"] = {**data.get("engine", {}), **over["engine"]}
    data["workload"] = {**data["workload"], "num_requests": requests,
                        "arrival": {"kind": "poisson", "rate": rate}}
    data["cost_model"] = {"kind": "profile", "path": profile}
    data["name"] = f"{data.get('name', 'suite')}-{policy}-{rate:.3g}"
    return validate(data, f"suite cell {policy} @ {rate:.3g} req/s")


def capacity(raw: dict, policy: str, requests: int, profile: str, num_blocks: int | None) -> float:
    """Saturated request throughput of this configuration, by the profile's simulator."""
    sc = cell_scenario(raw, policy, 1e6, max(requests, 200), profile)
    if num_blocks is not None:
        engine = sc.engine.model_copy(update={"num_gpu_blocks_override": num_blocks})
        sc = sc.model_copy(update={"engine": engine})
    return float(simulate(sc).summary["request_throughput"])


def build_runner(sc, device: str | None):
    """The backend every cell replays on (cells differ only in policy, rate and chunking)."""
    from gpu_backend.replay import build_engine
    from sim.workload.spec import build_workload

    return build_engine(sc, build_workload(sc.workload, sc.seed), device).runner


def bound_of(metric: str) -> float:
    return BOUND_P99 if metric.startswith("p99") else BOUND_MEDIAN


def run_suite(size: str, profile: str, out: Path | None = None, policies=None, loads=LOADS,
              requests: int | None = None, device: str | None = None, log=print) -> list[dict]:
    cfg = SIZES[size]
    sc0, raw = load_scenario(ROOT / cfg["scenario"])
    n = requests or cfg["requests"]
    rows = []
    runner = None  # one model, KV cache and set of CUDA graphs for every cell
    for policy in policies or POLICIES:
        cap = capacity(raw, policy, n, profile, sc0.engine.num_gpu_blocks_override)
        for load in loads:
            rate = cap * load
            sc = cell_scenario(raw, policy, rate, n, profile)
            t0 = time.perf_counter()
            if runner is None:
                runner = build_runner(sc, device)
            v = validate_scenario(sc, profile, device=device, runner=runner)
            errs = {m: v.error(m) for m, _ in COLUMNS}
            roof = {m: v.error(m, "roofline") for m, _ in COLUMNS}
            passed = all(e is not None and abs(e) <= bound_of(m) for m, e in errs.items())
            row = {"policy": policy, "load": load, "rate": rate, "capacity": cap, "errors": errs,
                   "roofline_errors": roof, "mean_abs_error": v.mean_abs_error(HEADLINE),
                   "roofline_mean_abs_error": v.mean_abs_error(HEADLINE, "roofline"),
                   "passes_gpu_bounds": passed,
                   "wall_s": time.perf_counter() - t0, "validation": v.to_json()}
            rows.append(row)
            log(f"{policy:10s} load {load:.0%} ({rate:.3g} req/s): mean |err| profile "
                f"{row['mean_abs_error']:.1%}, roofline {row['roofline_mean_abs_error']:.1%} "
                f"({row['wall_s']:.0f} s)")
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "validate_suite.json").write_text(json.dumps(
            {"size": size, "profile": profile, "bounds": {"median": BOUND_MEDIAN, "p99": BOUND_P99},
             "cells": rows}, indent=2, default=float) + "\n")
    return rows


def table(rows: list[dict], title: str):
    from rich.table import Table

    t = Table(title=title)
    t.add_column("policy")
    t.add_column("load", justify="right")
    for _, label in COLUMNS:
        t.add_column(label, justify="right")
    t.add_column("mean|err|", justify="right")
    t.add_column("roofline", justify="right")
    t.add_column("≤5/10%", justify="center")
    for r in rows:
        cells = []
        for m, _ in COLUMNS:
            e = r["errors"][m]
            cells.append("-" if e is None else f"{e:+.1%}")
        t.add_row(r["policy"], f"{r['load']:.0%}", *cells, f"{r['mean_abs_error']:.1%}",
                  f"{r['roofline_mean_abs_error']:.1%}", "yes" if r["passes_gpu_bounds"] else "no")
    return t


def plain_table(rows: list[dict]) -> str:
    from calibrate.__main__ import text_table

    headers = ["policy", "load", *(label for _, label in COLUMNS), "mean|err|", "roofline", "<=5/10%"]
    body = [[r["policy"], f"{r['load']:.0%}",
             *("-" if r["errors"][m] is None else f"{r['errors'][m]:+.1%}" for m, _ in COLUMNS),
             f"{r['mean_abs_error']:.1%}", f"{r['roofline_mean_abs_error']:.1%}",
             "yes" if r["passes_gpu_bounds"] else "no"] for r in rows]
    return text_table(headers, body)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="tiny-cpu")
    parser.add_argument("--profile", required=True)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--requests", type=int, help="requests per cell (default: the size's)")
    parser.add_argument("--policies", nargs="*", choices=sorted(POLICIES))
    parser.add_argument("--loads", nargs="*", type=float, default=list(LOADS))
    parser.add_argument("--device")
    args = parser.parse_args(argv)
    try:
        from rich.console import Console
    except ImportError:  # the lent GPU image has no rich: a plain-text table
        Console = None
    from sim.errors import InputError

    try:
        rows = run_suite(args.size, args.profile, args.out, args.policies, tuple(args.loads), args.requests,
                         args.device)
    except InputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    title = f"validation suite ({args.size}): simulated vs measured, relative error"
    if Console is None:
        print(title)
        print(plain_table(rows))
    else:
        Console(width=160).print(table(rows, title))
    return 0


if __name__ == "__main__":
    sys.exit(main())
