"""Step-latency cost models behind a registry: ``make_cost_model(kind, ...)``."""

from __future__ import annotations

from sim.cost.presets import HardwareSpec, ModelSpec
from sim.cost.profile import ProfileCostModel, load_profile, resolve_profile_path
from sim.cost.roofline import RooflineCostModel
from sim.errors import InputError

COST_MODELS = ("roofline", "profile")


def make_cost_model(kind: str, model: ModelSpec, hardware: HardwareSpec, path: str = "default"):
    if kind == "roofline":
        return RooflineCostModel(model, hardware)
    if kind == "profile":
        profile_path = resolve_profile_path(path, model.name, hardware.name)
        return ProfileCostModel(load_profile(profile_path, model=model.name, hardware=hardware.name))
    raise InputError(f"cost_model.kind: unknown '{kind}'; allowed: {', '.join(COST_MODELS)}")
