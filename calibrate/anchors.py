"""Derive the shipped H200 + Llama-3-8B profile from the reference measurements in shared/anchors.

The anchors time plain torch with CUDA graphs for decode and eager prefill of one sequence;
this fits the profile's coefficients to them so the simulator has a sane default before the
real backend is calibrated. ``python -m calibrate.anchors ../shared/anchors`` rewrites it.
"""

from __future__ import annotations

import json
import sys
from datetime import date
from pathlib import Path

import numpy as np

from calibrate.fit import coefficients_dict, fit_nonnegative, relative_errors
from sim.cost.features import FEATURES, shape_features
from sim.cost.profile import PROFILE_FORMAT


def anchor_rows(anchor_dir: Path) -> tuple[np.ndarray, np.ndarray, list[str]]:
    xs, ys, labels = [], [], []
    for line in (anchor_dir / "h200_torch_floor.jsonl").read_text().splitlines():
        row = json.loads(line)
        if row.get("kind") == "decode":
            b, ctx = row["batch"], row["ctx"]
            xs.append(shape_features(decode_contexts=[ctx + 1] * b))
            ys.append(row["graph_ms"] / 1e3)
            labels.append(f"decode b={b} ctx={ctx}")
        elif row.get("kind") == "prefill":
            n = row["tokens"]
            xs.append(shape_features(prefill_chunks=[(n, 0)]))
            ys.append(row["ms"] / 1e3)
            labels.append(f"prefill {n}")
    return np.array(xs), np.array(ys), labels


def derive(anchor_dir: Path) -> dict:
    x, y, labels = anchor_rows(anchor_dir)
    coef = fit_nonnegative(x, y)
    err = relative_errors(x, y, coef)
    return {
        "format": PROFILE_FORMAT,
        "model": "llama3-8b",
        "hardware": "h200",
        "features": list(FEATURES),
        "coefficients_s": coefficients_dict(coef),
        "provenance": {
            "source": "derived from shared/anchors/h200_torch_floor.jsonl (plain torch, dense KV, "
                      "SDPA, CUDA graph per decode step; eager single-sequence prefill), "
                      "not from cbsim's own backend; replaced when the real calibration lands",
            "backend": "plain-torch-anchor",
            "date": date.today().isoformat(),
            "points": len(y),
        },
        "fit": {
            "mean_abs_rel_error": float(np.mean(np.abs(err))),
            "max_abs_rel_error": float(np.max(np.abs(err))),
            "per_point": {lab: round(float(e), 4) for lab, e in zip(labels, err, strict=True)},
        },
    }


def main(argv: list[str]) -> None:
    anchor_dir = Path(argv[0]) if argv else Path(__file__).resolve().parents[2] / "shared/anchors"
    default_out = Path(__file__).resolve().parents[1] / "profiles/h200-llama3-8b.json"
    out = Path(argv[1]) if len(argv) > 1 else default_out
    profile = derive(anchor_dir)
    out.write_text(json.dumps(profile, indent=2) + "\n")
    print(f"wrote {out}: mean |rel err| {profile['fit']['mean_abs_rel_error']:.3f}")


if __name__ == "__main__":
    main(sys.argv[1:])
