"""Bad input: one line naming the field and what is allowed, exit 2, no traceback."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BASE = """
model: llama3-8b
workload:
  num_requests: 5
  arrival: {kind: poisson, rate: 1}
"""


def cbsim(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sim.cli", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)


@pytest.mark.parametrize(
    "text, expected",
    [
        (BASE + "bogus: 1\n", "unknown key 'bogus'"),
        (BASE + "engine: {max_num_seqz: 3}\n", "unknown key 'engine.max_num_seqz'; allowed: max_num_seqs"),
        (BASE + "policy: {name: nope}\n", "unknown policy 'nope'; allowed:"),
        (BASE.replace("rate: 1", "rate: -2"), "workload.arrival.poisson.rate"),
        (BASE + "engine: {block_size: 0}\n", "engine.block_size: Input should be greater than or equal to 1"),
        ("model: llama3-8b\nworkload: [1, 2\n", "line"),
        (BASE + "model: gpt-17\n", "unknown model 'gpt-17'; allowed: tiny"),
        ("", "the file is empty"),
        (BASE.replace("num_requests: 5", "num_requests: 1000000000000"),
         "workload.num_requests: Input should be less than or equal to 100000000"),
        (BASE + "cost_model: {path: /nonexistent.json}\n", "profile file not found"),
        (BASE + "workload: {requests: [{prompt_len: 9000, max_tokens: 10}]}\n",
         "workload.requests[0]: prompt_len + max_tokens = 9010 exceeds max_model_len = 8192"),
        (BASE + "engine: {num_gpu_blocks_override: 4}\n"
         "workload: {requests: [{prompt_len: 60, max_tokens: 10}]}\n",
         "is larger than the KV cache (64 tokens)"),
    ],
)
def test_bad_scenario_is_one_line_exit_2(tmp_path, text, expected):
    path = tmp_path / "s.yaml"
    path.write_text(text)
    proc = cbsim("run", str(path), "--out", str(tmp_path / "out"))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    lines = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
    assert len(lines) == 1, proc.stderr
    assert expected in lines[0], lines[0]


def test_missing_scenario_file():
    proc = cbsim("run", "no/such/file.yaml")
    assert proc.returncode == 2
    assert "scenario file not found: no/such/file.yaml" in proc.stderr


def test_bad_set_override(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(BASE)
    proc = cbsim("run", str(path), "--set", "engine.max_num_seqs=-1")
    assert proc.returncode == 2
    assert "engine.max_num_seqs" in proc.stderr
