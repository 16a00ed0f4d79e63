"""Traffic schema: classes, shares, client behaviour and admission blocks; bad input is one line."""

import numpy as np
import pytest

from sim.config import validate
from sim.core.admission import AdmissionConfig, AdmissionController
from sim.core.blocks import BlockManager
from sim.core.policies import make_policy
from sim.core.request import Request, RequestState
from sim.core.scheduler import Scheduler, SchedulerConfig
from sim.errors import InputError
from sim.workload.clients import RetryConfig
from sim.workload.spec import build_workload
from tests.helpers import with_overrides


def _sc(**extra):
    data = {"workload": {"num_requests": 200, "arrival": {"kind": "poisson", "rate": 10}}}
    return validate(with_overrides(data, **extra), "t.yaml")


def _error(**extra) -> str:
    with pytest.raises(InputError) as exc:
        _sc(**extra)
    msg = str(exc.value)
    assert "\n" not in msg
    return msg


def test_negative_patience_is_one_line_naming_the_field():
    msg = _error(clients={"patience_s": -1})
    assert "clients.patience_s" in msg and "greater than or equal to 0" in msg, msg


def test_negative_disconnect_delay_is_refused():
    msg = _error(clients={"disconnect": {"after_s": -2}})
    assert "disconnect" in msg and "after_s" in msg


def test_unknown_class_in_mix():
    msg = _error(workload__classes=[{"name": "a"}, {"name": "b"}],
                 workload__mix={"a": 0.5, "c": 0.5})
    assert "workload.mix" in msg and "'c'" in msg and "a, b" in msg


def test_shares_must_sum_to_one():
    msg = _error(workload__classes=[{"name": "a", "share": 0.5}, {"name": "b", "share": 0.3}])
    assert "share" in msg and "sum to 0.8" in msg and "must be 1" in msg
    msg = _error(workload__classes=[{"name": "a"}, {"name": "b"}], workload__mix={"a": 0.9, "b": 0.3})
    assert "workload.mix" in msg and "sum to 1.2" in msg


def test_class_needs_share_or_arrival_and_not_both():
    assert "needs a share" in _error(workload__classes=[{"name": "a", "share": 1.0}, {"name": "b"}])
    msg = _error(workload__classes=[{"name": "a", "share": 1.0,
                                     "arrival": {"kind": "poisson", "rate": 1}}])
    assert "share or arrival" in msg


def test_duplicate_class_names():
    assert "duplicate" in _error(workload__classes=[{"name": "a", "share": 0.5},
                                                    {"name": "a", "share": 0.5}])


def test_unlimited_retries_need_a_horizon():
    msg = _error(clients={"retry": {"max_attempts": None}})
    assert "max_attempts" in msg and "horizon_s" in msg
    _sc(clients={"retry": {"max_attempts": None}}, simulation={"horizon_s": 10})


def test_background_pause_needs_a_background_class():
    msg = _error(admission={"background": {"pause_waiting_over": 4}})
    assert "admission.background" in msg


def test_unknown_key_in_admission_names_allowed():
    msg = _error(admission={"max_queue": 3})
    assert "max_queue" in msg


def test_shares_split_the_stream_and_classes_carry_attributes():
    sc = _sc(workload__classes=[
        {"name": "chat", "tenant": "acme", "share": 0.75, "priority": 0,
         "output_len": {"kind": "fixed", "value": 7}},
        {"name": "batch", "tenant": "initech", "share": 0.25, "priority": 2},
    ])
    t = build_workload(sc.workload, sc.seed)
    assert len(t) == 200
    chat = t.cls == "chat"
    assert 0.6 < chat.mean() < 0.9
    assert set(t.tenant[chat]) == {"acme"} and set(t.tenant[~chat]) == {"initech"}
    assert (t.priority[~chat] == 2).all() and (t.max_tokens[chat] == 7).all()
    assert (t.max_tokens[~chat] == 128).all()  # the workload's default output length
    again = build_workload(sc.workload, sc.seed)
    assert (again.cls == t.cls).all() and np.array_equal(again.arrival, t.arrival)


def test_own_arrival_classes_need_no_main_stream():
    sc = validate({"workload": {"classes": [
        {"name": "burst", "arrival": {"kind": "all_at_once", "start_s": 5}, "num_requests": 30},
        {"name": "steady", "arrival": {"kind": "constant", "rate": 2}, "duration_s": 10},
    ]}}, "t")
    t = build_workload(sc.workload, sc.seed)
    assert (t.cls == "burst").sum() == 30 and (t.cls == "steady").sum() == 20
    assert np.all(np.diff(t.arrival) >= 0)


def test_retry_backoff_grows_and_is_capped():
    r = RetryConfig(backoff_s=1, multiplier=2, max_backoff_s=5, jitter=0)
    rng = np.random.default_rng(0)
    assert [r.delay(a, rng) for a in (1, 2, 3, 4, 5)] == [1, 2, 4, 5, 5]
    j = RetryConfig(backoff_s=4, jitter=0.5)
    d = [j.delay(1, rng) for _ in range(200)]
    assert 2.0 <= min(d) < max(d) <= 4.0


def _sched(adm: AdmissionConfig, background=frozenset(), blocks=64, max_seqs=4):
    s = Scheduler(SchedulerConfig(max_num_seqs=max_seqs, max_model_len=4096),
                  BlockManager(blocks, 16), make_policy("continuous"))
    s.admission = AdmissionController(adm, background)
    return s


def test_admission_limits_reject_with_reasons():
    s = _sched(AdmissionConfig(max_queue_len=2, max_input_tokens=100, max_output_tokens=50,
                               max_concurrent_per_tenant={"a": 1}))
    reqs = [Request(0, 0, 200, 10), Request(1, 0, 10, 60), Request(2, 0, 10, 10, tenant="a"),
            Request(3, 0, 10, 10, tenant="a"), Request(4, 0, 10, 10), Request(5, 0, 10, 10)]
    ok = [s.add_request(r, 0.0) for r in reqs]
    assert ok == [False, False, True, False, True, False]
    assert [r.reason for r in reqs if r.state == RequestState.REJECTED] == [
        "400 prompt_len > max_input_tokens", "400 max_tokens > max_output_tokens",
        "429 tenant concurrency cap", "429 queue full"]
    s.abort(reqs[2], RequestState.CANCELLED, 0.1, "client disconnected")
    assert s.admission.in_flight_by_tenant["a"] == 0
    assert s.add_request(Request(6, 0.2, 10, 10, tenant="a"), 0.2)


def test_max_active_seqs_counts_waiting_and_running():
    s = _sched(AdmissionConfig(max_active_seqs=2))
    assert s.add_request(Request(0, 0, 10, 3), 0) and s.add_request(Request(1, 0, 10, 3), 0)
    r = Request(2, 0, 10, 3)
    assert not s.add_request(r, 0) and r.reason == "429 too many active sequences"


def test_background_pause_and_resume_with_hysteresis():
    from sim.core.admission import BackgroundPauseConfig

    cfg = AdmissionConfig(background=BackgroundPauseConfig(pause_waiting_over=2))
    s = _sched(cfg, frozenset({"bg"}), max_seqs=1)
    bg = [Request(i, 0, 10, 50, cls="bg") for i in range(2)]
    fg = [Request(10 + i, 0, 10, 5) for i in range(4)]
    for r in bg + fg:
        s.add_request(r, 0.0)
    s.schedule(0.0)  # 4 interactive requests wait (> 2): background steps aside before admission
    adm = s.admission
    assert adm.paused and set(adm.parked) == set(bg) and s.running == [fg[0]]
    assert s.num_queued == len(s.policy) + 2
    late = Request(20, 0.1, 10, 5, cls="bg")
    s.add_request(late, 0.1)
    assert late in adm.parked
    now = 0.0
    while adm.paused:
        plan = s.schedule(now)
        now += 0.01
        s.complete(plan, now)
        assert now < 10
    # Resumed only once the interactive queue is at most half the threshold.
    assert len(s.policy) >= 2 and not adm.parked and adm.num_pauses == 1


def test_requests_that_can_never_run_are_rejected_with_their_reason():
    s = Scheduler(SchedulerConfig(max_model_len=1000), BlockManager(50, 16),
                  make_policy("continuous"))
    assert s.max_request_tokens == 800  # the whole cache: 50 blocks of 16
    too_long, too_big, fits = Request(0, 0, 990, 20), Request(1, 0, 700, 101), Request(2, 0, 700, 100)
    assert [s.add_request(r, 0.0) for r in (too_long, too_big, fits)] == [False, False, True]
    assert too_long.reason == "prompt_len + max_tokens = 1010 exceeds max_model_len = 1000"
    assert too_big.reason == "needs 51 KV blocks, the cache has 50"
