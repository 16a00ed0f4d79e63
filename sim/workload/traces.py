"""Trace replay: load a recorded request trace and shape it for a scenario.

A scenario names a trace either by file path or by a registered name
(``azure_conv``, ``mooncake_conversation``, ...). Registered names resolve through
a search path so scenarios stay portable across machines and the files never
need to ship with the repository: each directory in ``$CBSIM_TRACE_PATH``
(``os.pathsep``-separated), then the user cache ``~/.cache/cbsim/traces``
(``$XDG_CACHE_HOME/cbsim/traces`` when that is set). A registered file is checked
against its published SHA-256 so a truncated or re-encoded copy cannot silently
change a result; when it is missing, the error says exactly what to download
from where.

Parsing is per format (``TRACE_FORMATS``, one module each under
``sim.workload.trace_formats``); everything after parsing is shared and runs in
this order, each step on the result of the previous one:

1. sort by arrival and shift so the first request arrives at 0.0 s;
2. ``window_s=[a, b]``: keep requests with ``a <= t < b`` (trace time), re-zero;
3. ``sample_fraction``: keep that share of requests, chosen with the caller's RNG;
4. ``limit``: keep the first N;
5. ``speedup`` / ``target_rate``: rescale arrival times (after selection, so the
   replayed requests are the ones that have the target rate);
6. ``repeat``: tile the result end-to-end in time;
7. ``max_prompt_len`` / ``max_output_len``: clip lengths.

Bad input never surfaces as a traceback: every problem is a one-line
:class:`sim.errors.InputError` naming the file, line and column.
"""

from __future__ import annotations

import hashlib
import math
import os
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from sim.errors import InputError
from sim.workload.trace_formats import azure2023, burstgpt, generic, lengths, mooncake, vllm_bench
from sim.workload.trace_formats.generic import TraceColumns
from sim.workload.trace_formats.table import TraceTable

__all__ = [
    "REGISTERED_TRACES",
    "TRACE_FORMATS",
    "TRACE_PATH_ENV",
    "RegisteredTrace",
    "TraceColumns",
    "TraceLoader",
    "TraceSpec",
    "TraceTable",
    "file_sha256",
    "load_trace",
    "resolve_trace",
    "trace_search_path",
    "user_trace_cache",
]

TraceLoader = Callable[[Path, TraceColumns | None], TraceTable]
"""Parses one file into a TraceTable with raw arrival seconds (any origin, any order)."""

TRACE_FORMATS: dict[str, TraceLoader] = {
    "azure2023": azure2023.load,
    "mooncake": mooncake.load,
    "burstgpt": burstgpt.load,
    "lengths": lengths.load,
    "vllm_bench": vllm_bench.load,
    "generic": generic.load,
}
"""Trace formats by name. Add an entry to support a new format; TraceSpec accepts it at once."""

_FIXED_LAYOUT = frozenset({"azure2023", "mooncake", "burstgpt", "lengths", "vllm_bench"})
"""Built-in formats whose columns are fixed, so a ``columns`` mapping would be ignored."""

TRACE_PATH_ENV = "CBSIM_TRACE_PATH"


@dataclass(frozen=True)
class RegisteredTrace:
    """A published trace file that scenarios may name instead of giving a path."""

    name: str
    filename: str
    format: str
    repository: str
    commit: str
    source_path: str
    sha256: str
    size_bytes: int
    branch: str | None = None

    @property
    def url(self) -> str:
        """Where the exact published bytes can be fetched."""
        return f"https://github.com/{self.repository}/raw/{self.commit}/{self.source_path}"

    def download_hint(self, searched: list[Path]) -> str:
        """The one-line message for a missing file: what to fetch, from where, and where to put it."""
        on_branch = f" (branch {self.branch})" if self.branch else ""
        places = ", ".join(str(d) for d in searched)
        return (
            f"trace {self.name!r}: file {self.filename} not found (searched: {places}); "
            f"download {self.source_path} from {self.repository} at commit {self.commit}{on_branch} "
            f"[{self.url}], {self.size_bytes:,} bytes, SHA-256 {self.sha256}, and save it as "
            f"{self.filename} in {user_trace_cache()} or in a directory listed in ${TRACE_PATH_ENV}"
        )


_AZURE = ("Azure/AzurePublicDataset", "b469a11")
_MOONCAKE = ("kvcache-ai/Mooncake", "3b5a594")

REGISTERED_TRACES: dict[str, RegisteredTrace] = {
    entry.name: entry
    for entry in (
        RegisteredTrace(
            "azure_code", "azure2023_code.csv", "azure2023", *_AZURE,
            "data/AzureLLMInferenceTrace_code.csv",
            "54e9a6d2a4bd06ba1e060304b900abbc74cbea53de96506e60fe5bb4f2277fb6", 320_117,
        ),
        RegisteredTrace(
            "azure_conv", "azure2023_conv.csv", "azure2023", *_AZURE,
            "data/AzureLLMInferenceTrace_conv.csv",
            "2f1e5b666d4e3055fdbba98598ce2ec307767b9064e03e2fa46676dbcc7d0bf8", 719_188,
        ),
        RegisteredTrace(
            "mooncake_conversation", "mooncake_conversation.jsonl", "mooncake", *_MOONCAKE,
            "FAST25-release/traces/conversation_trace.jsonl",
            "b8cbb061a85206d729d91cdc2981f43c9e0d99209dce588d3af5f7934408b9df", 3_029_533,
        ),
        RegisteredTrace(
            "mooncake_synthetic", "mooncake_synthetic.jsonl", "mooncake", *_MOONCAKE,
            "FAST25-release/traces/synthetic_trace.jsonl",
            "bd070915a98fc0ed264d7cfef2ce746002eb3076a695ec31ba2674c0111ec131", 1_136_313,
        ),
        RegisteredTrace(
            "sharegpt_lengths", "sharegpt_lengths_llama2.csv", "lengths",
            "microsoft/sarathi-serve", "72339db",
            "data/processed_traces/sharegpt_8k_filtered_stats_llama2_tokenizer.csv",
            "6d6c296302a853e2669a674a96f269283e60c57e60363bd450588a1066919f9f", 949_600,
            branch="niyama_asplos2026",
        ),
        RegisteredTrace(
            "arxiv_lengths", "arxiv_summarization_lengths_llama2.csv", "lengths",
            "microsoft/vidur", "7d47513",
            "data/processed_traces/arxiv_summarization_stats_llama2_tokenizer_filtered_v2.csv",
            "9d3580538d915ca75e4aaaa54590b42dbb17abc6d74c8913310cf07c232adcdc", 884_932,
        ),
    )
}
"""Traces scenarios can name; files, sources and hashes as in shared/traces/README.md."""


def _allowed_formats() -> str:
    return ", ".join(sorted(TRACE_FORMATS))


class TraceSpec(BaseModel):
    """The ``trace:`` block of a scenario: which trace to replay and how to shape it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    path: str = Field(min_length=1, description="a trace file path or a registered trace name")
    format: str | None = Field(default=None, description="file format; inferred for registered names")
    columns: TraceColumns | None = Field(default=None, description="column mapping for format 'generic'")
    window_s: tuple[float, float] | None = Field(
        default=None, description="[start, end) in seconds of trace time; requests outside are dropped"
    )
    speedup: float | None = Field(default=None, gt=0, allow_inf_nan=False,
                                  description="divide arrival times by this factor")
    target_rate: float | None = Field(default=None, gt=0, allow_inf_nan=False,
                                      description="rescale arrivals to this many requests per second")
    sample_fraction: float = Field(default=1.0, gt=0, le=1, description="share of requests kept (seeded)")
    repeat: int = Field(default=1, ge=1, description="tile the trace end-to-end this many times")
    max_prompt_len: int | None = Field(default=None, ge=1, description="clip prompt lengths to this")
    max_output_len: int | None = Field(default=None, ge=1, description="clip output lengths to this")
    limit: int | None = Field(default=None, ge=1, description="keep only the first N requests")

    @field_validator("path", mode="before")
    @classmethod
    def _path_text(cls, value: Any) -> Any:
        return os.fspath(value) if isinstance(value, os.PathLike) else value

    @field_validator("format")
    @classmethod
    def _known_format(cls, value: str | None) -> str | None:
        if value is not None and value not in TRACE_FORMATS:
            raise ValueError(f"unknown trace format {value!r} (allowed: {_allowed_formats()})")
        return value

    @field_validator("window_s")
    @classmethod
    def _ordered_window(cls, value: tuple[float, float] | None) -> tuple[float, float] | None:
        if value is None:
            return None
        start, end = value
        if not (math.isfinite(start) and math.isfinite(end)) or start < 0 or end <= start:
            raise ValueError(f"window_s must be [start, end] with 0 <= start < end, got [{start:g}, {end:g}]")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> TraceSpec:
        if self.speedup is not None and self.target_rate is not None:
            raise ValueError("give speedup or target_rate, not both: each sets the arrival time scale")
        fmt = self.format or getattr(REGISTERED_TRACES.get(self.path), "format", None)
        if self.columns is not None and fmt in _FIXED_LAYOUT:
            raise ValueError(f"columns apply to format 'generic' only; format {fmt!r} has fixed columns")
        if fmt == "generic" and self.columns is None:
            raise ValueError(
                "format 'generic' needs columns: {prompt_len: ..., output_len: ..., arrival: ...}"
            )
        return self


def user_trace_cache() -> Path:
    """The per-user folder searched after ``$CBSIM_TRACE_PATH``."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "cbsim" / "traces"


def trace_search_path() -> list[Path]:
    """Directories searched for registered trace files, in order (read from the env on each call)."""
    dirs = [Path(d).expanduser() for d in os.environ.get(TRACE_PATH_ENV, "").split(os.pathsep) if d]
    dirs.append(user_trace_cache())
    return dirs


_DIGESTS: dict[tuple[str, int, int], str] = {}
"""SHA-256 by (resolved path, mtime_ns, size): each file version is hashed once per process."""


def file_sha256(path: Path) -> str:
    """SHA-256 hex digest of a file, cached per path and modification time."""
    stat = path.stat()
    key = (str(path.resolve()), stat.st_mtime_ns, stat.st_size)
    digest = _DIGESTS.get(key)
    if digest is None:
        hasher = hashlib.sha256()
        with path.open("rb") as handle:
            for chunk in iter(lambda: handle.read(1 << 20), b""):
                hasher.update(chunk)
        digest = _DIGESTS[key] = hasher.hexdigest()
    return digest


def _verify(path: Path, entry: RegisteredTrace) -> None:
    digest = file_sha256(path)
    if digest != entry.sha256:
        raise InputError(
            f"{path}: SHA-256 {digest} does not match registered trace {entry.name!r} "
            f"(expected {entry.sha256}); re-download {entry.source_path} from {entry.repository} "
            f"at commit {entry.commit} [{entry.url}]"
        )


def resolve_trace(path: str, fmt: str | None = None) -> tuple[Path, str]:
    """Find the file a spec's ``path`` refers to and the format to parse it with.

    A registered name is looked up on the search path and SHA-checked. A path is
    used as given; a bare file name that does not exist relative to the working
    directory is also looked up on the search path. A file named like a registered
    trace gets that trace's format unless ``fmt`` says otherwise.
    """
    entry = REGISTERED_TRACES.get(path)
    if entry is not None:
        if fmt is not None and fmt != entry.format:
            raise InputError(f"trace {path!r} is in format {entry.format!r}, not {fmt!r}")
        searched = trace_search_path()
        for directory in searched:
            candidate = directory / entry.filename
            if candidate.is_file():
                _verify(candidate, entry)
                return candidate, entry.format
        raise InputError(entry.download_hint(searched))

    candidate = Path(path).expanduser()
    if not candidate.is_file() and candidate.name == path:
        found = [d / path for d in trace_search_path() if (d / path).is_file()]
        candidate = found[0] if found else candidate
    if not candidate.is_file():
        what = "is not a file" if candidate.exists() else "does not exist"
        registered = ", ".join(REGISTERED_TRACES)
        raise InputError(
            f"trace {path!r} {what} and is not a registered trace name (registered: {registered})"
        )
    if fmt is None:
        by_filename = {e.filename: e.format for e in REGISTERED_TRACES.values()}
        fmt = by_filename.get(candidate.name)
    if fmt is None:
        raise InputError(f"trace {path!r}: say which format it is (format: one of {_allowed_formats()})")
    if fmt not in TRACE_FORMATS:
        raise InputError(f"unknown trace format {fmt!r} (allowed: {_allowed_formats()})")
    return candidate, fmt


def load_trace(spec: TraceSpec, rng: np.random.Generator) -> TraceTable:
    """Load, validate and shape the trace a :class:`TraceSpec` describes.

    ``rng`` is used only by ``sample_fraction`` (and not touched otherwise), so the
    same seed picks the same requests.
    """
    path, fmt = resolve_trace(spec.path, spec.format)
    if spec.columns is not None and fmt in _FIXED_LAYOUT:
        raise InputError(f"{path.name}: columns apply to format 'generic' only; {fmt!r} has fixed columns")
    table = TRACE_FORMATS[fmt](path, spec.columns)
    return _shape(table, spec, rng, path.name, fmt)


def _zeroed(table: TraceTable) -> TraceTable:
    """Shift arrivals so the first request arrives at 0.0 s."""
    if table.arrival_s is None or len(table) == 0 or table.arrival_s[0] == 0.0:
        return table
    return replace(table, arrival_s=table.arrival_s - table.arrival_s[0])


def _shape(table: TraceTable, spec: TraceSpec, rng: np.random.Generator, name: str, fmt: str) -> TraceTable:
    """Apply the spec's selection, time-scaling, tiling and clipping steps, in the module's order."""
    if table.arrival_s is None:
        needs_time = [opt for opt in ("window_s", "speedup", "target_rate") if getattr(spec, opt) is not None]
        if needs_time:
            raise InputError(
                f"{name}: format {fmt!r} has no arrival times, so {', '.join(needs_time)} cannot apply "
                "(pair the lengths with an arrival process instead)"
            )
    else:
        arrival = table.arrival_s
        if len(arrival) > 1 and np.any(arrival[1:] < arrival[:-1]):
            table = table.take(np.argsort(arrival, kind="stable"))
        table = _zeroed(table)

    if spec.window_s is not None and table.arrival_s is not None:
        start, end = spec.window_s
        inside = (table.arrival_s >= start) & (table.arrival_s < end)
        if not inside.any():
            raise InputError(
                f"{name}: window [{start:g}, {end:g}] s holds no requests "
                f"(trace spans 0–{table.span_s:.1f} s)"
            )
        table = _zeroed(table.take(inside))

    if spec.sample_fraction < 1.0:
        n = len(table)
        keep = max(1, round(spec.sample_fraction * n))
        table = _zeroed(table.take(np.sort(rng.choice(n, size=keep, replace=False))))

    if spec.limit is not None and spec.limit < len(table):
        table = table.take(np.arange(spec.limit))

    if table.arrival_s is not None and spec.speedup is not None:
        table = replace(table, arrival_s=table.arrival_s / spec.speedup)
    if table.arrival_s is not None and spec.target_rate is not None:
        span = table.span_s
        if span <= 0.0:
            raise InputError(
                f"{name}: cannot rescale to target_rate {spec.target_rate:g} req/s: "
                f"the {len(table)} selected requests all arrive at the same time"
            )
        # Rate as in shared/traces/README.md: requests / (last - first arrival).
        table = replace(table, arrival_s=table.arrival_s * (len(table) / (span * spec.target_rate)))

    if spec.repeat > 1:
        table = _tiled(table, spec.repeat)
    return _clipped(table, spec.max_prompt_len, spec.max_output_len)


def _tiled(table: TraceTable, copies: int) -> TraceTable:
    """Repeat the trace ``copies`` times back to back in time.

    Copy k starts one period after copy k-1, where the period is the span plus one
    mean inter-arrival gap, so the seam looks like any other gap and the rate is
    kept. Prefix-block ids and session ids are made distinct per copy: a repeat
    stands for *more* traffic like the original, not the same users re-sending the
    same prompts, which would inflate prefix-cache hit rates.
    """
    n = len(table)
    copy = np.repeat(np.arange(copies, dtype=np.int64), n)
    tiled = table.take(np.tile(np.arange(n), copies))
    changes: dict[str, Any] = {}
    if table.arrival_s is not None:
        span = table.span_s
        period = span + (span / (n - 1) if n > 1 else 0.0)
        changes["arrival_s"] = tiled.arrival_s + copy * period
    if table.hash_ids is not None:
        flat = [block for ids in table.hash_ids for block in ids]
        if flat:
            stride = max(flat) - min(flat) + 1
            changes["hash_ids"] = [
                tuple(block + k * stride for block in ids) if k else ids
                for k, ids in zip(copy.tolist(), tiled.hash_ids, strict=True)
            ]
    if table.session is not None:
        suffix = np.where(copy == 0, "", np.char.add("#", copy.astype(str)))
        changes["session"] = np.char.add(tiled.session.astype(str), suffix)
    return replace(tiled, **changes) if changes else tiled


def _clipped(table: TraceTable, max_prompt: int | None, max_output: int | None) -> TraceTable:
    """Cap lengths (e.g. at a model's context); prefix-block ids are cut to the clipped prompt."""
    changes: dict[str, Any] = {}
    if max_output is not None and np.any(table.output_len > max_output):
        changes["output_len"] = np.minimum(table.output_len, max_output)
    if max_prompt is not None and np.any(table.prompt_len > max_prompt):
        prompt = np.minimum(table.prompt_len, max_prompt)
        changes["prompt_len"] = prompt
        if table.hash_ids is not None and table.hash_block_tokens:
            blocks = -(-prompt // table.hash_block_tokens)
            changes["hash_ids"] = [ids[:b] for ids, b in zip(table.hash_ids, blocks.tolist(), strict=True)]
    return replace(table, **changes) if changes else table
