"""Calibration: the grid's features are the StepPlan's, the fit recovers known coefficients
(and a knee only when it pays), profiles are checked on load, an interrupted run resumes."""

from __future__ import annotations

import json

import numpy as np
import pytest

from calibrate.fit import select_fit
from calibrate.grid import full_grid, make_grid, quick_grid
from sim.core.plan import StepPlan
from sim.cost import make_cost_model
from sim.cost.features import FEATURES, plan_features
from sim.cost.presets import MODELS, get_hardware, get_model
from sim.cost.profile import PROFILE_FORMAT, ProfileCostModel, load_profile
from sim.errors import InputError
from tests.test_cli_errors import cbsim


def synthetic_points(coef: dict[str, float], knee: int | None, noise: float = 0.0) -> list[dict]:
    rng = np.random.default_rng(0)
    points = []
    for s in full_grid():
        x = np.array(s.features(knee_tokens=knee) if knee is not None else s.features())
        c = np.array([coef.get(f, 0.0) for f in FEATURES])
        y = float(x @ c) * (1 + noise * rng.standard_normal())
        points.append({"key": s.key, "region": s.region, "prefill": [list(p) for p in s.prefill],
                       "decode_batch": len(s.decode), "features": list(s.features()), "median_s": y})
    return points


BASE = {"const": 7e-3, "has_prefill": 4e-3, "prefill_tokens": 2e-5, "prefill_attn_pairs": 3e-9,
        "decode_seqs": 3e-5, "decode_ctx_sum": 3e-8}


def test_grid_keys_are_unique_and_fit_the_cache() -> None:
    for shapes in (quick_grid(), full_grid()):
        keys = [s.key for s in shapes]
        assert len(keys) == len(set(keys))
        assert {s.region for s in shapes} == {"decode", "prefill", "mixed"}
    kept, dropped = make_grid("full", 8192, 64, 200_000)
    assert kept and dropped and all(s.kv_tokens <= 200_000 and len(s.decode) <= 64 for s in kept)
    with pytest.raises(InputError, match="unknown grid"):
        make_grid("huge", 8192, 64, 10**6)


def test_fit_recovers_base_coefficients_without_a_knee() -> None:
    fit = select_fit(synthetic_points(BASE, None, noise=0.01))
    assert fit["knee_tokens"] is None
    assert fit["cv"]["all"]["mean_abs_rel_error"] < 0.02
    for name, value in BASE.items():
        assert fit["coefficients"][FEATURES.index(name)] == pytest.approx(value, rel=0.15)


def test_fit_takes_the_knee_when_cross_validation_says_it_pays() -> None:
    truth = BASE | {"tokens_over_knee": 1e-4}
    fit = select_fit(synthetic_points(truth, 1024, noise=0.01))
    assert fit["knee_tokens"] == 1024
    assert fit["cv"]["all"]["mean_abs_rel_error"] < 0.03
    assert fit["candidates"]["1024"] < 0.5 * fit["candidates"]["none"]


def write(tmp_path, **fields) -> str:
    data = {"format": PROFILE_FORMAT, "model": "tiny", "hardware": "cpu", "coefficients_s": dict(BASE)}
    data.update(fields)
    path = tmp_path / "p.json"
    path.write_text(json.dumps(data))
    return str(path)


def test_profile_without_the_optional_knee_loads_and_one_with_it_steps_piecewise(tmp_path) -> None:
    model = make_cost_model("profile", get_model("tiny"), get_hardware("cpu"), write(tmp_path))
    assert model.coef[-1] == 0.0
    knee = ProfileCostModel(load_profile(write(tmp_path, coefficients_s=BASE | {"tokens_over_knee": 1e-3},
                                               knee_tokens=100)))
    from sim.core.request import Request

    for n, extra in ((50, 0.0), (300, 200 * 1e-3)):
        plan = StepPlan()
        plan.add(Request(0, 0.0, n, 1), n)
        assert knee.step_time(plan) == pytest.approx(model.step_time(plan) + extra)
        feats = plan_features(plan, 100)
        assert feats[-1] == max(0, n - 100)


@pytest.mark.parametrize("fields, message", [
    ({"coefficients_s": {k: v for k, v in BASE.items() if k != "decode_seqs"}}, "lacks decode_seqs"),
    ({"coefficients_s": BASE | {"tokens_over_knee": 1e-3}}, "needs 'knee_tokens'"),
    ({"coefficients_s": BASE | {"const": -1.0}}, "must be a number >= 0"),
    ({"model": "llama3-8b"}, "profile is for model 'llama3-8b'"),
    ({"format": "other/2"}, "'format' must be"),
])
def test_bad_profiles_are_refused_with_one_line(tmp_path, fields, message) -> None:
    with pytest.raises(InputError, match=message):
        make_cost_model("profile", get_model("tiny"), get_hardware("cpu"), write(tmp_path, **fields))


def test_cli_refuses_a_mismatched_profile(tmp_path) -> None:
    res = cbsim("validate", "scenarios/validate_tiny_cpu.yaml", "--profile", "profiles/h200-llama3-8b.json",
                "--out", str(tmp_path))
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert "profile is for model 'llama3-8b', the scenario uses 'tiny'" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1


torch = pytest.importorskip("torch")


def test_timed_shapes_build_the_plans_their_features_describe() -> None:
    from calibrate.timing import _requests, build_backend

    torch.set_num_threads(1)
    backend = build_backend("tiny", "cpu", num_blocks=2048)
    for shape in quick_grid():
        entries = _requests(backend, shape)
        plan = StepPlan()
        for req, n in entries:
            plan.add(req, n)
        assert plan_features(plan) == shape.features(), shape.key
        assert backend.runner.execute(plan).num_tokens == shape.num_tokens
        for req, _ in entries:
            backend.runner.release(req)
            backend.blocks.free(req)
    assert backend.blocks.num_free == 2048 and backend.runner.num_tracked == 0
    assert MODELS["tiny"].max_model_len == backend.max_model_len


def test_cli_refuses_a_device_that_is_not_there(tmp_path) -> None:
    res = cbsim("calibrate", "--model", "tiny", "--out", str(tmp_path / "p.json"), "--device", "tpu")
    assert res.returncode == 2 and "--device: 'tpu' is not one of cpu, cuda" in res.stderr
    if not torch.cuda.is_available():
        res = cbsim("calibrate", "--model", "tiny", "--out", str(tmp_path / "p.json"), "--device", "cuda")
        assert res.returncode == 2 and "no CUDA device here" in res.stderr
