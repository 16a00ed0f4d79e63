"""`cbsim run --backend gpu`: the scenario runs on the real engine and writes the simulator's outputs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[1]


def cbsim(*args: str, prelude: str = "pass") -> subprocess.CompletedProcess:
    code = f"import sys; {prelude}; from sim.cli import main; sys.argv = ['cbsim', *sys.argv[1:]]; main()"
    return subprocess.run([sys.executable, "-c", code, *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=180)


def test_gpu_backend_runs_the_tiny_scenario_on_cpu(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    out = tmp_path / "out"
    proc = cbsim("run", "scenarios/gpu_tiny_cpu.yaml", "--backend", "gpu", "--device", "cpu",
                 "--out", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for variant in ("static", "continuous"):
        summary = json.loads((out / variant / "summary.json").read_text())
        frame = pd.read_parquet(out / variant / "requests.parquet")
        assert summary["backend"]["kind"] == "gpu" and summary["backend"]["device"] == "cpu"
        assert summary["backend"]["device_steps"] == summary["steps"] > 0
        assert summary["completed"] == len(frame) == 24
        assert (frame.state == "finished").all()
        assert (frame.output_tokens == frame.max_tokens).all()
        assert (frame.ttft > 0).all() and (frame.e2el >= frame.ttft).all()
        assert (out / variant / "timeseries.parquet").exists()
    for plot in ("latency_cdf.png", "timeseries.png", "slot_timeline.png", "comparison.png"):
        assert (out / plot).stat().st_size > 0, plot
    assert (out / "comparison.json").exists()
    assert "continuous" in proc.stdout


def test_gpu_backend_without_torch_says_how_to_install(tmp_path: Path) -> None:
    proc = cbsim("run", "scenarios/gpu_tiny_cpu.yaml", "--backend", "gpu", "--out", str(tmp_path),
                 prelude="sys.modules['torch'] = None")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "pip install 'cbsim[gpu]'" in lines[0], proc.stderr
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("args, expected", [
    (["--backend", "tpu"], "--backend: 'tpu' is not one of sim, gpu"),
    (["--backend", "gpu", "--attention", "flash"], "--attention: 'flash' is not one of torch, triton"),
])
def test_bad_backend_options_are_one_line(tmp_path: Path, args: list[str], expected: str) -> None:
    if "gpu" in args:
        pytest.importorskip("torch")
    proc = cbsim("run", "scenarios/gpu_tiny_cpu.yaml", *args, "--out", str(tmp_path / "o"))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert expected in proc.stderr and "Traceback" not in proc.stderr
