"""The seeds' static-vs-continuous arithmetic, on the simulator."""

from sim.engine import simulate
from tests.helpers import scenario


def _three(policy: str, extra=()):
    reqs = [{"prompt_len": 16, "max_tokens": m} for m in (512, 32, 128, *extra)]
    sc = scenario(engine={"max_num_seqs": 3}, policy={"name": policy},
                  workload={"requests": reqs}, simulation={"record_steps": True,
                                                           "record_token_times": True})
    return simulate(sc)


def test_static_short_request_finishes_with_the_longest():
    res = _three("static")
    frame = res.frame().set_index("req_id")
    assert frame.loc[1, "finish"] == frame.loc[0, "finish"]
    assert frame.loc[2, "finish"] == frame.loc[0, "finish"]
    # Its 32 tokens came out in the first 32 decode positions; the slot then idles as padding.
    steps = res.steps
    slot_steps = sum(1 for s in steps for rid, _, kind in s.batch if rid == 1)
    useful = sum(1 for s in steps for rid, _, kind in s.batch if rid == 1 and kind != "padding")
    assert slot_steps == 512
    assert (slot_steps - useful) / slot_steps == (512 - 32) / 512


def test_continuous_short_request_leaves_at_step_32_and_slot_is_reused():
    res = _three("continuous", extra=(64,))
    frame = res.frame().set_index("req_id")
    steps = res.steps
    last_step_of_1 = max(i for i, s in enumerate(steps) if any(r == 1 for r, _, _ in s.batch))
    # Step 0 is the joint prefill that samples token 1; 31 decode steps give tokens 2..32.
    assert last_step_of_1 == 31
    assert frame.loc[1, "output_tokens"] == 32
    assert frame.loc[1, "finish"] < frame.loc[0, "finish"]
    nxt = steps[last_step_of_1 + 1]
    assert any(r == 3 for r, _, _ in nxt.batch), "the waiting request takes the freed slot next step"
    assert not any(r == 3 for s in steps[: last_step_of_1 + 1] for r, _, _ in s.batch)


def test_continuous_beats_static_on_the_shipped_scenario():
    from sim.config import expand_variants, load_scenario
    from sim.engine import simulate as sim

    _, raw = load_scenario("scenarios/static_vs_continuous.yaml",
                           ["workload.num_requests=200", "simulation.record_steps=false"])
    out = {k: sim(v).summary for k, v in expand_variants(raw, "svc").items()}
    assert out["continuous"]["output_throughput"] > 1.3 * out["static"]["output_throughput"]
    assert out["continuous"]["median_e2el_ms"] < out["static"]["median_e2el_ms"] / 3
