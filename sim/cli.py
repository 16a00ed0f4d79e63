"""The ``cbsim`` command line. Bad input prints one line and exits 2, never a traceback."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from sim.errors import InputError

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="cbsim: simulate continuous-batching LLM serving.")
console = Console()
err_console = Console(stderr=True)


@app.callback()
def _group() -> None:
    """cbsim: simulate continuous-batching LLM serving."""


def fail(message: str) -> None:
    from rich.markup import escape

    err_console.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    raise typer.Exit(2)


def summary_table(title: str, summaries: dict[str, dict]) -> Table:
    from sim.run import COMPARISON_COLUMNS, SUMMARY_COLUMNS, TRAFFIC_COLUMNS, fmt

    if len(summaries) > 4:
        # Many variants (a policy sweep): variants down, a compact set of metrics across.
        table = Table(title=title)
        table.add_column("variant")
        for _, label, _ in COMPARISON_COLUMNS:
            table.add_column(label, justify="right")
        for name, s in summaries.items():
            table.add_row(name, *(fmt(s.get(key), pattern) for key, _, pattern in COMPARISON_COLUMNS))
        return table
    # Metrics down, variants across: stays readable in an 80-column terminal.
    table = Table(title=title)
    table.add_column("metric")
    for name in summaries:
        table.add_column(name, justify="right")
    for key, label, pattern in SUMMARY_COLUMNS:
        table.add_row(label, *(fmt(s.get(key), pattern) for s in summaries.values()))
    traffic = any(s.get(k) for k in ("rejected", "cancelled", "timed_out", "retries")
                  for s in summaries.values())
    for key, label, pattern in TRAFFIC_COLUMNS if traffic else ():
        table.add_row(label, *(fmt(s.get(key), pattern) for s in summaries.values()))
    tenants = sorted(set().union(*((s.get("per_tenant") or {}) for s in summaries.values())))
    for tenant in tenants if len(tenants) > 1 else ():
        table.add_row(f"TTFT p99 ms {tenant}", *(
            fmt(((s.get("per_tenant") or {}).get(tenant) or {}).get("p99_ttft_ms"), "{:.0f}")
            for s in summaries.values()))
    return table


@app.command()
def run(
    scenario: Annotated[str, typer.Argument(help="scenario YAML file")],
    out: Annotated[Path | None, typer.Option("--out", help="output folder")] = None,
    set_: Annotated[list[str] | None, typer.Option("--set", help="dotted.key=value override")] = None,
    backend: Annotated[str, typer.Option(
        "--backend", help="sim (the simulator) or gpu (the real engine, in real time)")] = "sim",
    device: Annotated[str | None, typer.Option(
        "--device", help="gpu backend: cuda or cpu (default: cuda if present)")] = None,
    weights: Annotated[str | None, typer.Option(
        "--weights", help="gpu backend: Hugging Face safetensors folder (default: random weights)")] = None,
    attention: Annotated[str | None, typer.Option(
        "--attention", help="gpu backend: torch or triton (default: triton on CUDA)")] = None,
) -> None:
    """Simulate SCENARIO (every variant), print a summary table, write results and plots.

    With --backend gpu each variant runs on the real engine instead (arrivals in real time)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from sim.run import GpuOptions, run_scenario

    if backend not in ("sim", "gpu"):
        fail(f"--backend: '{backend}' is not one of sim, gpu")
    gpu = GpuOptions(device, weights, attention) if backend == "gpu" else None

    try:
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                      TimeElapsedColumn(), console=err_console, transient=True) as bar:
            tasks: dict[str, int] = {}

            def progress(name: str, arrived: int, total: int) -> None:
                if name not in tasks:
                    tasks[name] = bar.add_task(f"simulating {name}", total=total)
                bar.update(tasks[name], completed=arrived)

            sc, results, out_dir, plots = run_scenario(scenario, out, set_ or [], None, progress, gpu)
    except InputError as exc:
        fail(str(exc))
    table = summary_table(sc.name, {k: r.summary for k, r in results.items()})
    # A sweep's wide table is not squeezed into 80 columns when the output is a file or pipe.
    (console if console.is_terminal or len(results) <= 4 else Console(width=150)).print(table)
    console.print(f"results in {out_dir}/ (summary.json, requests.parquet); plots: "
                  + ", ".join(p.name for p in plots))



@app.command()
def sweep(
    scenario: Annotated[str, typer.Argument(help="scenario YAML file with a sweep: block")],
    out: Annotated[Path | None, typer.Option("--out", help="output folder")] = None,
    set_: Annotated[list[str] | None, typer.Option("--set", help="dotted.key=value override")] = None,
    executor: Annotated[str, typer.Option("--executor", help="local (process pool) or ray")] = "local",
    address: Annotated[str | None, typer.Option(
        "--address", help="ray: 'auto' (running cluster), 'ray://host:port'; unset: a local one")] = None,
    workers: Annotated[int | None, typer.Option("--workers", help="processes (default: all cores)")] = None,
) -> None:
    """Run SCENARIO over its sweep: block; finished points survive interruption (rerun resumes)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from sim.sweep import SUMMARY_METRICS, param_names, run_sweep

    try:
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                      TimeElapsedColumn(), console=console) as progress:
            task = progress.add_task("sweep", total=None)

            def done(point, finished, total):
                progress.update(task, total=total, completed=finished,
                                description="sweep" if point is None else f"point {point.index}")

            res = run_sweep(scenario, out, set_ or [], executor, workers, address, done)
    except InputError as exc:
        fail(str(exc))
    from sim.run import fmt

    params = param_names(res.points)
    table = Table(title=f"sweep: {len(res.frame)} points ({res.ran} run now)")
    for p in params:
        table.add_column(p.rsplit(".", 1)[-1] if p.startswith("engine.") else p)
    metrics = [m for m in SUMMARY_METRICS if m[0] in res.frame.columns]
    for _, label, _ in metrics:
        table.add_column(label, justify="right")
    for _, row in res.frame.iterrows():
        table.add_row(*(str(row.get(p)) for p in params),
                      *(fmt(row.get(k), pat) for k, _, pat in metrics))
    # Not squeezed into 80 columns when the output is a file or a pipe.
    (console if console.is_terminal else Console(width=160)).print(table)
    console.print(f"table: {res.table_path}; plots: " + ", ".join(p.name for p in res.plots),
                  soft_wrap=True)


@app.command()
def plan(
    scenario: Annotated[str, typer.Argument(help="scenario YAML file with a plan: block")],
    out: Annotated[Path | None, typer.Option("--out", help="output folder")] = None,
    set_: Annotated[list[str] | None, typer.Option("--set", help="dotted.key=value override")] = None,
    executor: Annotated[str, typer.Option("--executor", help="local (process pool) or ray")] = "local",
    address: Annotated[str | None, typer.Option("--address", help="ray cluster address")] = None,
    workers: Annotated[int | None, typer.Option("--workers", help="processes (default: all cores)")] = None,
) -> None:
    """Find the configuration that meets the plan's SLOs at its target rate with the fewest GPUs."""
    from sim.plan import run_plan

    try:
        res = run_plan(scenario, out, set_ or [], executor, workers, address,
                       log=lambda m: console.print(m, highlight=False))
    except InputError as exc:
        fail(str(exc))
    table = Table(title=f"candidates for {res.target_rate:g} req/s")
    cols = [("hardware", "hw"), ("policy", "policy"), ("max_num_seqs", "seqs"),
            ("max_num_batched_tokens", "tokens"), ("max_rate_per_replica", "req/s/rep"),
            ("replicas", "replicas"), ("gpus", "GPUs"), ("binding_slo", "binding SLO")]
    cols = [c for c in cols if c[0] not in ("hardware", "policy") or res.frame[c[0]].nunique() > 1]
    for _, name in cols:
        table.add_column(name, justify="right" if name not in ("binding SLO", "hw", "policy") else "left")
    for _, row in res.frame.iterrows():
        cells = []
        for key, _ in cols:
            v = row[key]
            if key == "binding_slo":
                v = str(v).split(" of requests")[0]
            cells.append("-" if v is None or v != v else (f"{v:.2f}" if isinstance(v, float) else str(v)))
        style = "bold green" if row["recommended"] else None
        table.add_row(*cells, style=style)
    (console if console.is_terminal else Console(width=160)).print(table)
    for line in res.why():
        console.print(f"- {line}", highlight=False, soft_wrap=True)
    if res.recommended is not None:
        console.print("re-run it: cbsim run " + scenario + " " +
                      " ".join(f"--set {o}" for o in res.scenario_overrides()), highlight=False,
                      soft_wrap=True)
    console.print(f"results in {res.out / 'plan'}/ (candidates.csv, recommendation.json); plots: "
                  + ", ".join(p.name for p in res.plots), soft_wrap=True)


@app.command()
def calibrate(
    model: Annotated[str, typer.Option("--model", help="model preset, e.g. llama3-8b or tiny")],
    out: Annotated[Path, typer.Option(
        "--out", help="profile JSON to write, e.g. profiles/h200-llama3-8b.json")],
    hardware_name: Annotated[str | None, typer.Option(
        "--hardware-name", help="hardware preset the profile is for (default: cpu on a CPU)")] = None,
    device: Annotated[str | None, typer.Option(
        "--device", help="cuda or cpu (default: cuda if present)")] = None,
    grid: Annotated[str | None, typer.Option("--grid", help="quick or full (default: full on a GPU)")] = None,
    warmup: Annotated[int, typer.Option("--warmup", min=0)] = 2,
    repeats: Annotated[int, typer.Option("--repeats", min=1)] = 7,
) -> None:
    """Time a grid of step shapes on the backend, fit the step-latency profile, write it.

    Measured points go to OUT's .points.jsonl as they are measured; a rerun resumes."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from calibrate.calibration import calibrate as run_calibration
    from calibrate.calibration import plot_path

    try:
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                      TimeElapsedColumn(), console=err_console, transient=True) as bar:
            task = bar.add_task("calibrating", total=None)

            def progress(key: str, done: int, total: int) -> None:
                bar.update(task, total=total, completed=done, description=key[:40])

            profile = run_calibration(model, out, hardware_name=hardware_name, device=device, grid=grid,
                                      warmup=warmup, repeats=repeats, progress=progress)
    except InputError as exc:
        fail(str(exc))
    except KeyboardInterrupt:
        from calibrate.calibration import points_path

        err_console.print(f"interrupted: the shapes measured so far are in {points_path(out)}; "
                          "the same command resumes", highlight=False, soft_wrap=True)
        raise typer.Exit(130) from None
    fit = profile["fit"]
    table = Table(title=f"profile {out} ({profile['provenance']['points']} shapes)")
    for col in ("region", "points", "CV mean |err|", "CV p90", "CV max"):
        table.add_column(col, justify="left" if col == "region" else "right")
    for region, e in fit["cv_error_by_region"].items():
        table.add_row(region, str(e["points"]), f"{e['mean_abs_rel_error']:.1%}",
                      f"{e['p90_abs_rel_error']:.1%}", f"{e['max_abs_rel_error']:.1%}")
    console.print(table)
    knee = profile.get("knee_tokens")
    console.print("piecewise term: " + (f"tokens over {knee}" if knee is not None else "none (CV: no gain)")
                  + f"; fit plot: {plot_path(out)}", soft_wrap=True)


@app.command()
def validate(
    scenario: Annotated[str, typer.Argument(help="scenario YAML file (one configuration)")],
    profile: Annotated[str, typer.Option("--profile", help="profile JSON from cbsim calibrate")],
    out: Annotated[Path | None, typer.Option("--out", help="output folder")] = None,
    set_: Annotated[list[str] | None, typer.Option("--set", help="dotted.key=value override")] = None,
    device: Annotated[str | None, typer.Option(
        "--device", help="cuda or cpu (default: cuda if present)")] = None,
) -> None:
    """Replay SCENARIO on the real backend and in the simulator; report the error per metric."""
    from calibrate.validate import error_table
    from calibrate.validate import validate as run_validation

    out = out or Path("results") / "validate" / Path(scenario).stem
    try:
        v, plots = run_validation(scenario, profile, out, set_ or [], device=device,
                                  log=lambda m: err_console.print(m, highlight=False))
    except InputError as exc:
        fail(str(exc))
    console.print(error_table(v, f"{v.scenario.name}: simulated vs measured"))
    console.print(f"results in {out}/ (validation.json); plots: " + ", ".join(p.name for p in plots),
                  soft_wrap=True)


def main() -> None:
    try:
        app()
    except InputError as exc:  # raised outside a command's own handler
        err_console.print(f"[bold red]error:[/] {exc}", highlight=False)
        sys.exit(2)


if __name__ == "__main__":
    main()
