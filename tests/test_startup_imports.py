"""The simulator's start-up path (validate a scenario mapping, simulate it) imports no heavy or
file-format module: each costs every run (and benchmarks/sim_speed.py) its import time."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Imported where they are used: YAML files and --set values, traces, tables, plots.
LAZY = ["yaml", "pandas", "pyarrow", "matplotlib", "scipy", "torch"]


def test_validate_and_simulate_import_no_heavy_module():
    code = (
        "import json, sys\n"
        "from sim.config import validate\n"
        "from sim.engine import simulate\n"
        "validate({'workload': {'num_requests': 1}}, 'startup')\n"
        f"print(json.dumps(sorted({{m.split('.')[0] for m in sys.modules}} & set({LAZY!r}))))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


def test_yaml_still_loads_scenarios(tmp_path):
    from sim.config import load_scenario, parse_set_option

    path = tmp_path / "s.yaml"
    path.write_text("workload: {num_requests: 3}\nengine: {max_num_seqs: 4}\n")
    sc, raw = load_scenario(path, ["engine.block_size=32"])
    assert (sc.engine.max_num_seqs, sc.engine.block_size, raw["workload"]) == (4, 32, {"num_requests": 3})
    assert parse_set_option("a.b=[1, 2]") == ("a.b", [1, 2])
