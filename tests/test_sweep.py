"""Sweeps: point expansion, resume after a kill, the Ray executor's table equals the local one."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml

from sim.errors import InputError
from sim.sweep import expand_points, load_sweep, make_executor, run_sweep

ROOT = Path(__file__).resolve().parents[1]

TINY = {
    "name": "tiny",
    "seed": 2,
    "engine": {"max_num_seqs": 16},
    "workload": {"num_requests": 60, "arrival": {"kind": "poisson", "rate": 8},
                 "prompt_len": {"kind": "uniform", "min": 64, "max": 512},
                 "output_len": {"kind": "uniform", "min": 8, "max": 128}},
    "plan": {"slo": {"ttft_ms": 500, "tpot_ms": 50}},
    "sweep": {"grid": {"engine.max_num_seqs": [4, 16]},
              "zip": {"engine.max_num_batched_tokens": [1024, 4096], "engine.block_size": [16, 32]},
              "rates": [4, 16]},
}


def write(tmp_path: Path, data: dict, name: str = "s.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data))
    return path


def test_points_are_grid_times_zip_times_rates_times_variants(tmp_path):
    data = dict(TINY, variants={"a": {"policy.name": "static"}, "b": {"policy.name": "continuous"}})
    _, points = load_sweep(write(tmp_path, data))
    assert len(points) == 2 * 2 * 2 * 2
    p = points[-1]
    assert p.params == {"variant": "b", "engine.max_num_seqs": 16,
                        "engine.max_num_batched_tokens": 4096, "engine.block_size": 32, "rate": 16}
    assert p.data["engine"] == {"max_num_seqs": 16, "max_num_batched_tokens": 4096, "block_size": 32}
    assert p.data["workload"]["arrival"]["rate"] == 16.0
    assert p.data["policy"]["name"] == "continuous"
    # Keys hash the resolved scenario: stable across loads, distinct across points.
    _, again = load_sweep(write(tmp_path, data))
    assert [q.key for q in again] == [q.key for q in points]
    assert len({q.key for q in points}) == len(points)


def test_trace_rate_sweep_sets_the_trace_target_rate():
    raw = {"workload": {"trace": {"path": "x.csv"}}, "sweep": {"rates": [3]}}
    (p,) = expand_points(raw)
    assert p.data["workload"]["trace"]["target_rate"] == 3.0


@pytest.mark.parametrize("sweep, message", [
    ({"grid": {"engine.max_num_seqs": []}}, "grid.engine.max_num_seqs is empty"),
    ({"zip": {"a.b": [1, 2], "c.d": [1]}}, "one length"),
    ({"grid": {"engine.max_num_seqs": [0]}}, "engine.max_num_seqs"),
    ({"grid": {"engine.bogus": [1]}}, "unknown key 'engine.bogus'"),
    ({"rates": [-1]}, "rates must be > 0"),
])
def test_bad_sweep_blocks_are_one_line_errors(tmp_path, sweep, message):
    with pytest.raises(InputError, match=message):
        load_sweep(write(tmp_path, dict(TINY, sweep=sweep)))


def test_rate_sweep_needs_an_arrival_rate():
    raw = dict(TINY, workload={"requests": [{"prompt_len": 8, "max_tokens": 4}]}, sweep={"rates": [2]})
    with pytest.raises(InputError, match="no arrival rate"):
        expand_points(raw)


def test_unknown_executor():
    with pytest.raises(InputError, match="allowed: local, ray"):
        make_executor("dask")


def test_interrupted_sweep_resumes_to_the_same_table(tmp_path):
    path = write(tmp_path, TINY)
    full = run_sweep(path, tmp_path / "full", workers=1, plots=False)
    assert full.ran == 8 and list(full.frame.point) == list(range(8))
    assert full.table_path.exists()

    class Stop(Exception):
        pass

    def stop_after_three(point, finished, total):
        if point is not None and finished - 0 >= 3:
            raise Stop

    with pytest.raises(Stop):
        run_sweep(path, tmp_path / "cut", workers=1, on_done=stop_after_three, plots=False)
    assert len(list((tmp_path / "cut/sweep/points").glob("*.parquet"))) == 3
    # The table written on the way out holds the three finished points.
    assert len(pd.read_parquet(tmp_path / "cut/sweep/results.parquet")) == 3
    again = run_sweep(path, tmp_path / "cut", workers=2, plots=False)
    assert again.ran == 5
    pd.testing.assert_frame_equal(again.frame, full.frame)
    pd.testing.assert_frame_equal(pd.read_parquet(again.table_path), full.frame)
    # A third run has nothing left to do.
    assert run_sweep(path, tmp_path / "cut", workers=1, plots=False).ran == 0


def test_killed_sweep_process_resumes(tmp_path):
    data = dict(TINY, sweep={"grid": {"engine.max_num_seqs": [2, 4, 8, 16, 32, 64]}, "rates": [4, 16]})
    data["workload"] = dict(TINY["workload"], num_requests=150)
    path = write(tmp_path, data)
    out = tmp_path / "killed"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-m", "sim.cli", "sweep", str(path), "--out", str(out),
                             "--workers", "1"], env=env, cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    parts = out / "sweep" / "points"
    deadline = time.time() + 60
    while time.time() < deadline and len(list(parts.glob("*.parquet"))) < 3 and proc.poll() is None:
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    done = len(list(parts.glob("*.parquet")))
    assert 3 <= done < 12, "the sweep should have been killed part way"
    resumed = run_sweep(path, out, workers=2, plots=False)
    assert resumed.ran == 12 - done
    whole = run_sweep(path, tmp_path / "whole", workers=2, plots=False)
    pd.testing.assert_frame_equal(resumed.frame, whole.frame)


def test_ray_executor_gives_the_local_table(tmp_path):
    pytest.importorskip("ray")
    path = write(tmp_path, dict(TINY, sweep={"grid": {"engine.max_num_seqs": [4, 16]}, "rates": [4, 16]}))
    local = run_sweep(path, tmp_path / "local", workers=2, plots=False)
    ray_run = run_sweep(path, tmp_path / "ray", executor="ray", workers=2, plots=False)
    assert ray_run.ran == 4
    pd.testing.assert_frame_equal(ray_run.frame, local.frame)


def test_ray_missing_says_how_to_install(monkeypatch):
    import builtins

    real = builtins.__import__

    def no_ray(name, *a, **k):
        if name == "ray":
            raise ImportError("no ray")
        return real(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_ray)
    with pytest.raises(InputError, match=r'pip install "cbsim\[ray\]"'):
        make_executor("ray")


def test_cli_sweep_prints_table_and_bad_input_exits_2(tmp_path):
    from typer.testing import CliRunner

    from sim.cli import app

    path = write(tmp_path, dict(TINY, sweep={"rates": [4, 8]}))
    res = CliRunner().invoke(app, ["sweep", str(path), "--out", str(tmp_path / "o"), "--workers", "1"])
    assert res.exit_code == 0, res.output
    assert "sweep: 2 points" in res.output and "results.parquet" in res.output
    assert (tmp_path / "o/sweep/latency_throughput.png").exists()
    bad = CliRunner().invoke(app, ["sweep", str(path), "--executor", "spark"])
    assert bad.exit_code == 2 and "allowed: local, ray" in bad.output


@pytest.mark.parametrize("name, points", [("rate_sweep", 18), ("capacity_plan", 9),
                                          ("cluster_routing", 5)])
def test_shipped_scenarios_expand(name, points):
    _, pts = load_sweep(ROOT / "scenarios" / f"{name}.yaml")
    assert len(pts) == points


def test_cluster_routing_scenario_runs_every_router():
    from sim.config import validate
    from sim.engine import simulate

    raw, pts = load_sweep(ROOT / "scenarios/cluster_routing.yaml")
    for p in pts:
        p.data["workload"]["trace"]["limit"] = 120
        try:
            res = simulate(validate(p.data, "cluster_routing"))
        except InputError as exc:
            pytest.skip(f"trace not available: {exc}")
        s = res.summary
        assert s["router"] == p.params["variant"] and len(s["per_replica"]) == 4
        assert sum(r["routed"] for r in s["per_replica"]) == 120
