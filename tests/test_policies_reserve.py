"""Admission reserve: ``optimistic`` (vLLM) versus ``conservative`` (TensorRT-LLM no-evict)."""

import pytest

from sim.core.policies import make_policy
from sim.errors import InputError
from tests.policy_workloads import poisson_rows, run


def tight_kv():
    return poisson_rows(6, 20.0, 10, 300, (50, 600))


def test_conservative_never_preempts_and_optimistic_admits_more():
    rows = tight_kv()
    engine = {"max_num_seqs": 64, "num_gpu_blocks_override": 600}
    opt = run(rows, "continuous", engine=engine).summary
    cons = run(rows, "continuous", engine=engine, reserve="conservative").summary
    ratio = run(rows, "continuous", engine=engine, reserve="conservative", reserve_ratio=0.5).summary
    assert cons["preemptions"] == 0 and cons["recompute_tokens"] == 0
    assert opt["preemptions"] > 0 and opt["recompute_seconds"] > 0
    assert opt["mean_running_batch"] > 1.2 * cons["mean_running_batch"]
    # SGLang-style partial reservation sits in between
    assert cons["mean_running_batch"] < ratio["mean_running_batch"] < opt["mean_running_batch"]
    assert 0 < ratio["preemptions"] < opt["preemptions"]
    assert opt["completed"] == cons["completed"] == len(rows)


def test_conservative_knob_on_other_policies_and_its_errors():
    assert make_policy("fair", {"reserve": "conservative"}).reserve == "conservative"
    assert make_policy("priority").reserve == "optimistic"
    with pytest.raises(InputError, match="never preempts"):
        make_policy("orca", {"reserve": "optimistic"})
    with pytest.raises(InputError, match="reserve"):
        make_policy("continuous", {"reserve": "maybe"})
