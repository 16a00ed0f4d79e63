"""``cbsim calibrate``: time the grid on the backend, fit the profile, write it with provenance.

Every measured point is appended to ``<out>.points.jsonl`` as soon as it is measured; a rerun
with the same output skips the shapes already there, so an interrupted calibration keeps what
it measured.
"""

from __future__ import annotations

import json
import platform
import subprocess
from collections.abc import Callable
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from calibrate.fit import coefficients_dict, select_fit
from calibrate.grid import make_grid
from sim.cost.features import FEATURES
from sim.cost.presets import get_hardware, get_model
from sim.cost.profile import PROFILE_FORMAT
from sim.errors import InputError

Progress = Callable[[str, int, int], None]  # (shape key, done, total)


def points_path(out: Path) -> Path:
    return out.with_name(out.stem + ".points.jsonl")


def plot_path(out: Path) -> Path:
    return out.with_name(out.stem + ".fit.png")


def read_points(path: Path, model: str, device: str) -> list[dict]:
    """Points measured earlier for this model on this kind of device (others are refused)."""
    if not path.exists():
        return []
    points = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            p = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut short by the interruption
        if p.get("model") != model or p.get("device") != device:
            raise InputError(f"{path} line {n}: measured {p.get('model')} on {p.get('device')}, not {model} "
                             f"on {device}; use another --out or delete it")
        points.append(p)
    return points


def backend_version() -> str:
    import torch

    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                cwd=Path(__file__).resolve().parents[1], timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = ""
    return f"cbsim gpu_backend {commit or 'unknown'}; torch {torch.__version__}"


def device_name(device: str) -> str:
    import torch

    if device == "cuda":
        return torch.cuda.get_device_name()
    return f"{platform.processor() or platform.machine()} ({torch.get_num_threads()} threads)"


def pick_device(device: str | None) -> str:
    """``cuda`` when present unless told otherwise; asking for a GPU that is not there is one line."""
    import torch

    if device is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device not in ("cpu", "cuda"):
        raise InputError(f"--device: '{device}' is not one of cpu, cuda")
    if device == "cuda" and not torch.cuda.is_available():
        raise InputError("--device cuda: no CUDA device here (torch.cuda.is_available() is False)")
    return device


@contextmanager
def cpu_threads(n: int, device: str):
    """One intra-op thread by default on a CPU: on a small shared CPU, torch's thread pool
    spinning against other processes makes tiny-model steps 10-50x slower and erratic.
    Validation uses the same; the previous setting comes back afterwards."""
    import torch

    if device != "cpu":
        yield
        return
    old = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)


def calibrate(model: str, out: Path, *, hardware_name: str | None = None, device: str | None = None,
              grid: str | None = None, warmup: int = 2, repeats: int = 7, block_size: int = 16,
              num_blocks: int | None = None, max_batch: int = 256, engine_overhead: bool = True,
              threads: int = 1, progress: Progress | None = None, plot: bool = True) -> dict:
    """Measure (or resume), fit and write the profile; returns it."""

    get_model(model)
    dev = pick_device(device)
    hardware = hardware_name or ("cpu" if dev == "cpu" else None)
    if hardware is None:
        raise InputError("--hardware-name: required on a GPU (the preset the profile is for, e.g. h200)")
    get_hardware(hardware)
    grid = grid or ("full" if dev == "cuda" else "quick")
    if dev == "cpu":
        num_blocks = num_blocks or 2048
    with cpu_threads(threads, dev):
        return _calibrate(model, out, hardware, dev, grid, warmup, repeats, block_size, num_blocks, max_batch,
                          engine_overhead, threads, progress, plot)


def _calibrate(model, out, hardware, dev, grid, warmup, repeats, block_size, num_blocks, max_batch,
               engine_overhead, threads, progress, plot) -> dict:
    from calibrate.timing import build_backend, time_shape
    from calibrate.timing import engine_overhead as measure_overhead

    backend = build_backend(model, dev, block_size=block_size, num_blocks=num_blocks, max_batch=max_batch)
    shapes, dropped = make_grid(grid, backend.max_model_len, max_batch, backend.kv_tokens)
    out.parent.mkdir(parents=True, exist_ok=True)
    ppath = points_path(out)
    points = read_points(ppath, model, backend.device)
    done = {p["key"] for p in points}
    todo = [s for s in shapes if s.key not in done]
    total = len(shapes)
    with ppath.open("a") as sink:
        for i, shape in enumerate(todo):
            if progress is not None:
                progress(shape.key, total - len(todo) + i, total)
            point = time_shape(backend, shape, warmup=warmup, repeats=repeats)
            point.update(model=model, device=backend.device)
            sink.write(json.dumps(point) + "\n")
            sink.flush()
            points.append(point)
    if progress is not None:
        progress("fit", total, total)
    wanted = {s.key for s in shapes}
    points = [p for p in points if p["key"] in wanted]
    if len(points) < len(FEATURES) + 2:
        raise InputError(f"--grid {grid}: only {len(points)} shapes fit this model and KV cache; need "
                         f"at least {len(FEATURES) + 2}")
    fit = select_fit(points)
    coef = fit["coefficients"].copy()
    overhead = measure_overhead(backend) if engine_overhead else None
    if overhead is not None:
        coef[FEATURES.index("const")] += overhead["per_step_s"]
        coef[FEATURES.index("decode_seqs")] += overhead["per_seq_s"]
    profile = {
        "format": PROFILE_FORMAT,
        "model": model,
        "hardware": hardware,
        "features": list(FEATURES),
        "coefficients_s": coefficients_dict(coef),
        "provenance": {
            "source": "cbsim calibrate: step shapes timed on cbsim's own backend "
                      f"({'CUDA events' if backend.device == 'cuda' else 'monotonic clock'}, median of "
                      f"{repeats} after {warmup} warm-up)",
            "backend": f"gpu_backend attention={backend.attention} cuda_graphs={backend.cuda_graphs} "
                       f"block_size={block_size} kv_blocks={backend.blocks.num_blocks}",
            "backend_version": backend_version(),
            "device": device_name(backend.device),
            "cpu_threads": threads if backend.device == "cpu" else None,
            "date": datetime.now(UTC).isoformat(timespec="seconds"),
            "points": len(points),
            "grid": {"name": grid, "shapes": len(shapes), "left_out": dropped, "warmup": warmup,
                     "repeats": repeats},
            "engine_overhead": overhead,
        },
        "fit": {
            "objective": "non-negative least squares on relative error",
            "mean_abs_rel_error": fit["in_sample"]["all"]["mean_abs_rel_error"],
            "max_abs_rel_error": fit["in_sample"]["all"]["max_abs_rel_error"],
            "cv": "leave-one-out",
            "cv_error_by_region": fit["cv"],
            "in_sample_error_by_region": fit["in_sample"],
            "knee_candidates_cv_error": fit["candidates"],
            "per_point": {p["key"]: {"measured_ms": round(p["median_s"] * 1e3, 4),
                                     "predicted_ms": round(pred * 1e3, 4), "cv_rel_error": round(e, 4)}
                          for p, pred, e in zip(points, fit["predicted_s"], fit["cv_rel_errors"],
                                                strict=True)},
        },
    }
    if fit["knee_tokens"] is not None:
        profile["knee_tokens"] = int(fit["knee_tokens"])
    out.write_text(json.dumps(profile, indent=2) + "\n")
    if plot:
        plot_fit(points, np.array(fit["predicted_s"]), plot_path(out), f"{model} on {hardware}")
    return profile


def plot_fit(points: list[dict], predicted: np.ndarray, path: Path, title: str) -> Path:
    """Predicted against measured step time, per region, with the ±5% band."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    measured = np.array([p["median_s"] for p in points]) * 1e3
    pred = predicted * 1e3
    fig, ax = plt.subplots(figsize=(5.5, 5))
    for region, marker in (("decode", "o"), ("prefill", "s"), ("mixed", "^")):
        sel = np.array([p["region"] == region for p in points])
        if sel.any():
            ax.scatter(measured[sel], pred[sel], marker=marker, label=region, alpha=0.8)
    lo, hi = min(measured.min(), pred.min()) * 0.8, max(measured.max(), pred.max()) * 1.25
    line = np.array([lo, hi])
    ax.plot(line, line, "k-", lw=1)
    ax.fill_between(line, line * 0.95, line * 1.05, color="gray", alpha=0.2, label="±5%")
    ax.set(xscale="log", yscale="log", xlim=(lo, hi), ylim=(lo, hi), xlabel="measured step ms",
           ylabel="profile's step ms", title=f"calibration fit: {title}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
