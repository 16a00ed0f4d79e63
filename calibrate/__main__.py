"""``python -m calibrate``: the calibrate and validate commands without typer or rich.

The same pipeline as ``cbsim calibrate`` / ``cbsim validate``, for a machine whose Python has
only torch, numpy, scipy, pandas, matplotlib, pyyaml (+ simpy, pydantic): the lent GPU image.

    python -m calibrate profile --model llama3-8b --hardware-name h200 --out profiles/h200-llama3-8b.json
    python -m calibrate validate scenarios/validate_h200.yaml --profile profiles/h200-llama3-8b.json \\
        --out benchmarks/results/validation_h200
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from sim.errors import InputError


def text_table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(str(c)) for c in col) for col in zip(headers, *rows, strict=True)]
    line = lambda cells: "  ".join(str(c).rjust(w) if i else str(c).ljust(w)  # noqa: E731
                                   for i, (c, w) in enumerate(zip(cells, widths, strict=True)))
    return "\n".join([line(headers), "  ".join("-" * w for w in widths), *(line(r) for r in rows)])


def profile_command(args: argparse.Namespace) -> None:
    from calibrate.calibration import calibrate, plot_path

    def progress(key: str, done: int, total: int) -> None:
        print(f"[{done}/{total}] {key}", flush=True)

    profile = calibrate(args.model, args.out, hardware_name=args.hardware_name, device=args.device,
                        grid=args.grid, warmup=args.warmup, repeats=args.repeats, progress=progress)
    rows = [[region, str(e["points"]), f"{e['mean_abs_rel_error']:.1%}", f"{e['p90_abs_rel_error']:.1%}",
             f"{e['max_abs_rel_error']:.1%}"] for region, e in profile["fit"]["cv_error_by_region"].items()]
    print(text_table(["region", "points", "CV mean |err|", "CV p90", "CV max"], rows))
    print(f"knee_tokens: {profile.get('knee_tokens')}; wrote {args.out} and {plot_path(args.out)}")


def validate_command(args: argparse.Namespace) -> None:
    from calibrate.validate import validate

    out = args.out or Path("results") / "validate" / Path(args.scenario).stem
    v, plots = validate(args.scenario, args.profile, out, args.set or [], device=args.device,
                        log=lambda m: print(m, flush=True))
    print(validation_text(v))
    print(f"results in {out}/ (validation.json); plots: " + ", ".join(p.name for p in plots))


def validation_text(v) -> str:
    from calibrate.validate import _fmt, _pct

    headers = ["metric", "measured", "simulated", "error"]
    if v.roofline is not None:
        headers += ["roofline", "roofline error"]
    rows = []
    for r in v.rows:
        m = r["metric"]
        row = [m, _fmt(r["measured"], m), _fmt(r["simulated"], m), _pct(r["rel_error"])]
        if v.roofline is not None:
            row += [_fmt(r["roofline"], m), _pct(r["roofline_rel_error"])]
        rows.append(row)
    return text_table(headers, rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m calibrate", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("profile", help="time the grid on the backend, fit, write the profile")
    p.add_argument("--model", required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--hardware-name")
    p.add_argument("--device")
    p.add_argument("--grid")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--repeats", type=int, default=7)
    p.set_defaults(run=profile_command)
    v = sub.add_parser("validate", help="replay a scenario on the backend and in the simulator")
    v.add_argument("scenario")
    v.add_argument("--profile", required=True)
    v.add_argument("--out", type=Path)
    v.add_argument("--set", action="append")
    v.add_argument("--device")
    v.set_defaults(run=validate_command)
    args = parser.parse_args(argv)
    try:
        args.run(args)
    except InputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted: measured shapes are kept in the output's .points.jsonl; rerun to resume",
              file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
