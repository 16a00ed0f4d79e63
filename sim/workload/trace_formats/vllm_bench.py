"""``vllm bench serve`` result JSON: the lengths a real benchmark run sent and received.

Saved with ``--save-result --save-detailed``, the result holds parallel per-request
lists ``input_lens`` and ``output_lens`` (plus ``errors``, ``ttfts``, ...). Replaying
those lengths lets ``cbsim validate`` compare the simulator against the same run.
The file has no per-request arrival times, so ``arrival_s`` is ``None``.

Requests whose ``errors`` entry is non-empty are dropped: vLLM records them with an
output length of 0, and a request that failed carries no service time to replay.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pandas as pd

from sim.errors import InputError
from sim.workload.trace_formats.parsing import RawColumns, int_column
from sim.workload.trace_formats.table import TraceTable

logger = logging.getLogger(__name__)


def _read_result(path: Path) -> dict[str, object]:
    try:
        with path.open(encoding="utf-8") as handle:
            result = json.load(handle)
    except json.JSONDecodeError as exc:
        raise InputError(
            f"{path.name} line {exc.lineno}: not valid JSON ({exc.msg} at column {exc.colno})"
        ) from None
    except UnicodeDecodeError as exc:
        raise InputError(f"{path.name}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except OSError as exc:
        raise InputError(f"{path.name}: cannot read ({exc.strerror})") from None
    if not isinstance(result, dict):
        raise InputError(f"{path.name}: expected a JSON object (a vllm bench serve result)")
    return result


def load(path: Path, columns: object = None) -> TraceTable:
    """Parse a ``vllm bench serve`` result file, keeping the successful requests."""
    result = _read_result(path)
    lists: dict[str, list[object]] = {}
    for key in ("input_lens", "output_lens"):
        if key not in result:
            have = ", ".join(sorted(result)) or "nothing"
            raise InputError(
                f"{path.name}: missing key {key!r} (have: {have}); "
                "save the run with --save-result --save-detailed"
            )
        value = result[key]
        if not isinstance(value, list):
            raise InputError(f"{path.name}: {key!r} must be a list, got {type(value).__name__}")
        lists[key] = value
    n = len(lists["input_lens"])
    if len(lists["output_lens"]) != n:
        raise InputError(
            f"{path.name}: 'input_lens' has {n} entries but 'output_lens' has "
            f"{len(lists['output_lens'])}"
        )
    errors = result.get("errors")
    failed = np.zeros(n, dtype=bool)
    if isinstance(errors, list) and len(errors) == n:
        failed = np.fromiter((bool(e) for e in errors), dtype=bool, count=n)
    keep = np.flatnonzero(~failed)
    if failed.any():
        logger.info("%s: dropped %d failed requests", path.name, int(failed.sum()))
    if len(keep) == 0:
        raise InputError(f"{path.name}: holds no successful requests ({n} in total)")

    frame = pd.DataFrame(
        {key: pd.Series([values[i] for i in keep], dtype=object) for key, values in lists.items()}
    )
    raw = RawColumns(file=path.name, frame=frame, lines=keep.astype(np.int64), kind="index")
    return TraceTable(
        arrival_s=None,
        prompt_len=int_column(raw, "input_lens"),
        output_len=int_column(raw, "output_lens"),
        source=str(path),
    )
