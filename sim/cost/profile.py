"""``profile``: a step-latency model fitted on a real backend, read from a JSON profile.

The profile is linear (non-negative) in the StepPlan features of ``sim.cost.features``. Its
JSON format (``cbsim-profile/1``) is written by ``calibrate`` and documented in the README:

    {"format": "cbsim-profile/1", "model": "llama3-8b", "hardware": "h200",
     "features": [...], "coefficients_s": {"const": 0.007, ...}, "knee_tokens": 1024,
     "provenance": {...}, "fit": {...}}

Optional features (``OPTIONAL_FEATURES``: the piecewise ``tokens_over_knee``) may be absent
and then count 0, so profiles written before they existed still load; a non-zero
``tokens_over_knee`` needs ``knee_tokens`` (an integer >= 0).
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

from sim.core.plan import StepPlan
from sim.cost.features import FEATURES, OPTIONAL_FEATURES
from sim.errors import InputError

PROFILE_FORMAT = "cbsim-profile/1"
DEFAULT_PROFILES = {("llama3-8b", "h200"): "h200-llama3-8b.json"}


def shipped_profile_path(name: str) -> Path:
    return Path(str(resources.files("profiles").joinpath(name)))


def resolve_profile_path(path: str, model: str, hardware: str) -> Path:
    """``default`` picks the shipped profile of this model and hardware; else a file path."""
    if path == "default":
        name = DEFAULT_PROFILES.get((model, hardware))
        if name is None:
            pairs = ", ".join(f"{m} on {h}" for m, h in DEFAULT_PROFILES)
            raise InputError(
                f"cost_model.path: no shipped profile for {model} on {hardware} (shipped: {pairs}); "
                "use cost_model.kind: roofline or give a profile path"
            )
        return shipped_profile_path(name)
    return Path(path)


def load_profile(path: Path, *, model: str | None = None, hardware: str | None = None) -> dict:
    """Read and check a profile; every problem is one line naming the file and the field."""
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise InputError(f"cost_model.path: profile file not found: {path}") from None
    except json.JSONDecodeError as exc:
        raise InputError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno})") from None
    if not isinstance(data, dict) or data.get("format") != PROFILE_FORMAT:
        raise InputError(f"{path}: 'format' must be '{PROFILE_FORMAT}'")
    coeffs = data.get("coefficients_s")
    if not isinstance(coeffs, dict):
        raise InputError(f"{path}: missing 'coefficients_s' (one per feature: {', '.join(FEATURES)})")
    missing = [f for f in FEATURES if f not in coeffs and f not in OPTIONAL_FEATURES]
    if missing:
        raise InputError(f"{path}: coefficients_s lacks {', '.join(missing)}")
    for name, value in coeffs.items():
        if name not in FEATURES:
            raise InputError(f"{path}: coefficients_s.{name} is not a feature ({', '.join(FEATURES)})")
        if not isinstance(value, int | float) or value < 0:
            raise InputError(f"{path}: coefficients_s.{name} must be a number >= 0, got {value!r}")
    knee = data.get("knee_tokens")
    if coeffs.get("tokens_over_knee") and (isinstance(knee, bool) or not isinstance(knee, int) or knee < 0):
        raise InputError(f"{path}: coefficients_s.tokens_over_knee needs 'knee_tokens', an integer >= 0, "
                         f"got {knee!r}")
    if model is not None and data.get("model") != model:
        raise InputError(
            f"{path}: profile is for model '{data.get('model')}', the scenario uses '{model}'"
        )
    if hardware is not None and data.get("hardware") != hardware:
        raise InputError(
            f"{path}: profile is for hardware '{data.get('hardware')}', the scenario uses '{hardware}'"
        )
    return data


class ProfileCostModel:
    name = "profile"

    def __init__(self, profile: dict) -> None:
        self.profile = profile
        c = profile["coefficients_s"]
        self.coef = tuple(float(c.get(f, 0.0)) for f in FEATURES)
        self.knee_tokens = int(profile.get("knee_tokens") or 0) if self.coef[6] else None

    def step_time(self, plan: StepPlan) -> float:
        c0, c_pf, c_pt, c_pa, c_ds, c_dc, c_knee = self.coef
        t = c0 + c_ds * plan.decode_seqs + c_dc * plan.decode_ctx_sum
        if plan.prefill_tokens:
            t += c_pf + c_pt * plan.prefill_tokens + c_pa * plan.prefill_attn_pairs
        if c_knee:
            over = plan.prefill_tokens + plan.decode_seqs - self.knee_tokens
            if over > 0:
                t += c_knee * over
        return t

    def decode_time(self, batch: int, ctx_sum: int) -> float:
        """``step_time`` of a decode-only step, by the same float operations (the fast path)."""
        c0, _, _, _, c_ds, c_dc, c_knee = self.coef
        t = c0 + c_ds * batch + c_dc * ctx_sum
        if c_knee:
            over = batch - self.knee_tokens
            if over > 0:
                t += c_knee * over
        return t
