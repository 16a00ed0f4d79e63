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
    err_console.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    raise typer.Exit(2)


def summary_table(title: str, summaries: dict[str, dict]) -> Table:
    from sim.run import SUMMARY_COLUMNS, fmt

    # Metrics down, variants across: stays readable in an 80-column terminal.
    table = Table(title=title)
    table.add_column("metric")
    for name in summaries:
        table.add_column(name, justify="right")
    for key, label, pattern in SUMMARY_COLUMNS:
        table.add_row(label, *(fmt(s.get(key), pattern) for s in summaries.values()))
    return table


@app.command()
def run(
    scenario: Annotated[str, typer.Argument(help="scenario YAML file")],
    out: Annotated[Path | None, typer.Option("--out", help="output folder")] = None,
    set_: Annotated[list[str] | None, typer.Option("--set", help="dotted.key=value override")] = None,
) -> None:
    """Simulate SCENARIO (every variant), print a summary table, write results and plots."""
    from sim.run import run_scenario

    try:
        with console.status("simulating...") as status:
            def done(name, res):
                status.update(f"simulated {name}: {res.summary['completed']} requests finished")

            sc, results, out_dir, plots = run_scenario(scenario, out, set_ or [], done)
    except InputError as exc:
        fail(str(exc))
    console.print(summary_table(sc.name, {k: r.summary for k, r in results.items()}))
    console.print(f"results in {out_dir}/ (summary.json, requests.parquet); plots: "
                  + ", ".join(p.name for p in plots))


def main() -> None:
    try:
        app()
    except InputError as exc:  # raised outside a command's own handler
        err_console.print(f"[bold red]error:[/] {exc}", highlight=False)
        sys.exit(2)


if __name__ == "__main__":
    main()
