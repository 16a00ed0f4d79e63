"""A scenario replayed on the backend yields the simulator's records and summary metrics."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from gpu_backend.replay import replay  # noqa: E402
from sim.config import validate  # noqa: E402
from sim.engine import simulate  # noqa: E402
from sim.errors import InputError  # noqa: E402


def tiny_scenario(**engine) -> object:
    return validate({
        "model": "tiny", "hardware": "cpu", "cost_model": {"kind": "roofline"},
        "engine": {"block_size": 16, "max_num_batched_tokens": 64, **engine},
        "policy": {"name": "continuous"},
        "workload": {"requests": [{"arrival": 0.005 * i, "prompt_len": 10 + 7 * i, "max_tokens": 3 + i}
                                  for i in range(6)]},
    }, "test")


def test_replay_records_match_the_simulators() -> None:
    sc = tiny_scenario(num_gpu_blocks_override=64)
    sim, real = simulate(sc), replay(sc, device="cpu", attention="torch")
    sim_frame, real_frame = sim.frame(), real.frame()
    assert list(real_frame.columns) == list(sim_frame.columns)
    for col in ("req_id", "state", "prompt_len", "max_tokens", "output_tokens"):
        assert real_frame[col].tolist() == sim_frame[col].tolist()
    assert (real_frame.ttft > 0).all() and (real_frame.e2el >= real_frame.ttft).all()
    assert set(real.summary) == set(sim.summary)
    assert real.summary["completed"] == 6 and real.num_kv_blocks == 64
    assert all(len(real.tokens[i]) == 3 + i for i in range(6))


def test_replay_without_gpu_needs_a_block_count() -> None:
    if torch.cuda.is_available():
        pytest.skip("sizes the cache from GPU memory here")
    with pytest.raises(InputError, match="num_gpu_blocks_override"):
        replay(tiny_scenario(), device="cpu")
