"""The scheduler core is clock-free: it must not import SimPy or torch."""

import ast
from pathlib import Path

CORE = Path(__file__).resolve().parents[1] / "sim" / "core"
FORBIDDEN = {"simpy", "torch", "triton", "time"}


def test_core_imports_no_clock_or_backend():
    for path in CORE.rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            for name in names:
                assert name.split(".")[0] not in FORBIDDEN, f"{path.name} imports {name}"
