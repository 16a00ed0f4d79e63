"""benchmarks/gpu_check.py --quick: every phase of the GPU check runs on a CPU, written as JSON lines."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[1]
PHASES = ("env", "ceilings", "build", "kernels", "runner", "decode", "prefill", "greedy", "mixed")


def gpu_check(out: Path, *args: str) -> tuple[subprocess.CompletedProcess, list[dict]]:
    proc = subprocess.run([sys.executable, "benchmarks/gpu_check.py", "--quick", "--out", str(out), *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    lines = (out / "gpu_check.jsonl").read_text().splitlines()
    return proc, [json.loads(line) for line in lines]


def test_quick_mode_runs_every_phase(tmp_path: Path) -> None:
    proc, records = gpu_check(tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    phases = {r["phase"]: r for r in records if "phase" in r}
    assert list(phases) == list(PHASES)
    failed = {p: r.get("error") for p, r in phases.items() if not r["ok"]}
    assert not failed, failed
    kernels = [r for r in records if "kernel" in r]
    assert {r["kernel"] for r in kernels} == {"decode", "prefill", "chunked", "mixed"}
    assert all(r["ok"] and r["store_exact"] and r["rel_err"] < 1e-4 for r in kernels)
    decode = [r for r in records if r.get("bench") == "decode"]
    assert {(r["batch"], r["ctx"]) for r in decode} == {(1, 64), (8, 64), (1, 256), (8, 256)}
    assert all(r["step_ms"] > 0 and r["tok_per_s"] > 0 for r in decode)
    assert [r["tokens"] for r in records if r.get("bench") == "prefill"] == [128, 512]
    greedy = next(r["greedy"] for r in records if "greedy" in r)
    assert greedy["token_match_fraction"] == 1.0 and greedy["argmax_agree"] == 1.0
    mixed = {(r["policy"], r["max_num_seqs"]): r for r in records if r.get("bench") == "mixed"}
    assert set(mixed) == {("static", 4), ("continuous", 4), ("continuous", 16)}
    for r in mixed.values():
        assert r["finished"] == r["requests"] == 24 and r["useful_tokens"] > 0
        assert 0 < r["ttft_p50_s"] <= r["ttft_p99_s"] and r["e2e_p50_s"] <= r["e2e_p99_s"]
    assert records[-1]["done"] is True
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert len(summary["targets"]) == 5
    assert set(summary["results"]) >= {"decode", "prefill", "mixed", "greedy"}
    assert "targets:" in proc.stdout and "mixed continuous_16" in proc.stdout


def test_a_spent_budget_still_records_every_phase(tmp_path: Path) -> None:
    proc, records = gpu_check(tmp_path, "--budget-s", "0")
    assert proc.returncode == 0, proc.stderr[-3000:]
    phases = {r["phase"]: r for r in records if "phase" in r}
    assert list(phases) == list(PHASES)
    assert not any(r["ok"] for r in phases.values())
    assert "skipped: the overall budget is spent" in phases["build"]["error"]
    assert "needs build" in phases["decode"]["error"]
    assert (tmp_path / "summary.json").exists()
