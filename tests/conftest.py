import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED_TRACES = ROOT.parent / "shared" / "traces"

# Real traces live outside the repo; point the search path at them unless the caller did.
if "CBSIM_TRACE_PATH" not in os.environ and SHARED_TRACES.is_dir():
    os.environ["CBSIM_TRACE_PATH"] = str(SHARED_TRACES)
