"""Trace replay: every format against the published files, every option, every error path.

The published traces live outside the repository (``shared/traces`` next to it, or
wherever ``$CBSIM_TRACE_PATH`` points); tests that need them skip with a reason when
they are absent. Everything else runs on small files generated into ``tmp_path``.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from sim.errors import InputError
from sim.workload import traces
from sim.workload.traces import (
    REGISTERED_TRACES,
    TRACE_FORMATS,
    RegisteredTrace,
    TraceColumns,
    TraceSpec,
    TraceTable,
    file_sha256,
    load_trace,
    resolve_trace,
    trace_search_path,
)

REPO = Path(__file__).resolve().parents[1]
DEFAULT_TRACE_DIR = REPO.parent / "shared" / "traces"
TRACE_DIRS = [
    Path(d) for d in (os.environ.get("CBSIM_TRACE_PATH") or str(DEFAULT_TRACE_DIR)).split(os.pathsep) if d
]


@pytest.fixture(autouse=True)
def trace_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Point the search path at the shared traces and the user cache at an empty folder.

    The cache is isolated so a developer's ``~/.cache/cbsim/traces`` cannot change
    which file a test sees.
    """
    monkeypatch.setenv("CBSIM_TRACE_PATH", os.pathsep.join(str(d) for d in TRACE_DIRS))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))


def _registered_file(name: str) -> Path | None:
    entry = REGISTERED_TRACES[name]
    for directory in TRACE_DIRS:
        if (directory / entry.filename).is_file():
            return directory / entry.filename
    return None


def needs_trace(name: str) -> pytest.MarkDecorator:
    """Skip unless the published file for ``name`` is on the search path."""
    filename = REGISTERED_TRACES[name].filename
    return pytest.mark.skipif(
        _registered_file(name) is None,
        reason=f"{filename} not found in {', '.join(map(str, TRACE_DIRS))} (set CBSIM_TRACE_PATH)",
    )


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def load(path: str | Path, **options: object) -> TraceTable:
    return load_trace(TraceSpec(path=str(path), **options), rng())


def one_line_error(excinfo: pytest.ExceptionInfo[InputError]) -> str:
    message = str(excinfo.value)
    assert "\n" not in message
    return message


# --------------------------------------------------------------------------- published traces

# From shared/traces/README.md, "Summary statistics": requests, span (s), rate (req/s),
# CV of inter-arrival gaps, input p50/p90/p99/max/mean, output p50/p90/p99/max/mean.
README_SUMMARY = {
    "azure_code": (8_819, 3_435.9, 2.57, 13.15,
                   (1_469, 5_187.6, 7_436, 7_437, 2_047.8), (13, 55, 251.5, 1_899, 27.9)),
    "azure_conv": (19_366, 3_501.7, 5.53, 1.09,
                   (1_020, 2_734.5, 4_142, 14_050, 1_154.7), (129, 424, 601, 1_000, 211.1)),
    "mooncake_conversation": (12_031, 3_537.0, 3.40, 3.03,
                              (6_909, 27_367, 85_400.4, 126_195, 12_035.1),
                              (350, 597, 1_118.5, 2_000, 342.6)),
    "mooncake_synthetic": (3_993, 1_022.0, 3.91, 1.01,
                           (11_587, 38_611.2, 66_456.2, 191_378, 15_325.5), (69, 389, 768.1, 893, 149.1)),
    "sharegpt_lengths": (30_731, None, None, None,
                         (1_730, 5_696, 7_433.7, 8_141, 2_340.0), (415, 834, 998, 1_024, 438.7)),
    "arxiv_lengths": (28_257, None, None, None,
                      (2_730, 3_702, 3_933.4, 4_054, 2_588.1), (167, 372, 3_271.3, 4_056, 291.4)),
}


def _length_summary(values: np.ndarray) -> tuple[float, ...]:
    p50, p90, p99 = np.percentile(values, [50, 90, 99], method="linear")
    return (p50, p90, p99, float(values.max()), float(values.mean()))


@pytest.mark.parametrize("name", list(README_SUMMARY))
def test_published_trace_matches_readme_summary(name: str) -> None:
    if _registered_file(name) is None:
        pytest.skip(f"{REGISTERED_TRACES[name].filename} not on the trace search path (set CBSIM_TRACE_PATH)")
    count, span, rate, cv, inputs, outputs = README_SUMMARY[name]
    table = load(name)

    assert len(table) == count
    assert table.source.endswith(REGISTERED_TRACES[name].filename)
    # The README prints one decimal: agree to within half a unit of the last digit.
    assert _length_summary(table.prompt_len) == pytest.approx(inputs, abs=0.051)
    assert _length_summary(table.output_len) == pytest.approx(outputs, abs=0.051)
    if span is None:
        assert table.arrival_s is None
        return
    arrival = table.arrival_s
    assert arrival[0] == 0.0 and np.all(np.diff(arrival) >= 0)
    assert table.span_s == pytest.approx(span, abs=0.051)
    assert len(table) / table.span_s == pytest.approx(rate, abs=0.0051)
    gaps = np.diff(arrival)
    assert gaps.std() / gaps.mean() == pytest.approx(cv, abs=0.0051)


@pytest.mark.parametrize(
    ("name", "references", "distinct", "reuse"),
    [("mooncake_conversation", 288_500, 182_790, 0.366), ("mooncake_synthetic", 121_877, None, 0.640)],
)
def test_mooncake_prefix_blocks_match_readme(
    name: str, references: int, distinct: int | None, reuse: float
) -> None:
    if _registered_file(name) is None:
        pytest.skip(f"{REGISTERED_TRACES[name].filename} not on the trace search path (set CBSIM_TRACE_PATH)")
    table = load(name)
    assert table.hash_ids is not None and table.hash_block_tokens == 512
    blocks = np.array([len(ids) for ids in table.hash_ids])
    assert np.array_equal(blocks, -(-table.prompt_len // 512))  # ceil(input_length / 512)

    seen: set[int] = set()
    repeated = 0
    for ids in table.hash_ids:
        repeated += sum(block in seen for block in ids)
        seen.update(ids)
    assert blocks.sum() == references
    if distinct is not None:
        assert len(seen) == distinct
    assert repeated / references == pytest.approx(reuse, abs=0.0005)


@needs_trace("azure_conv")
def test_azure_conv_loads_fast() -> None:
    spec = TraceSpec(path="azure_conv")
    load_trace(spec, rng())  # the first call also hashes the file
    best = math.inf
    for _ in range(3):
        start = time.perf_counter()
        load_trace(spec, rng())
        best = min(best, time.perf_counter() - start)
    assert best < 0.3


@needs_trace("azure_conv")
def test_file_path_with_published_name_gets_its_format() -> None:
    path = _registered_file("azure_conv")
    by_path = load(path)
    by_name = load("azure_conv")
    assert np.array_equal(by_path.arrival_s, by_name.arrival_s)
    assert np.array_equal(by_path.prompt_len, by_name.prompt_len)
    assert resolve_trace(path.name) == (path, "azure2023")  # a bare file name is searched for


@needs_trace("azure_conv")
def test_window_and_target_rate_on_azure_conv() -> None:
    full = load("azure_conv")
    expected = int(np.count_nonzero((full.arrival_s >= 600) & (full.arrival_s < 1200)))
    table = load("azure_conv", window_s=(600, 1200), target_rate=10.0)
    assert len(table) == expected
    assert table.arrival_s[0] == 0.0
    assert len(table) / table.span_s == pytest.approx(10.0)


# --------------------------------------------------------------------------- small generated files


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def azure_csv(tmp_path: Path, rows: list[tuple[str, object, object]], name: str = "azure.csv") -> Path:
    lines = ["TIMESTAMP,ContextTokens,GeneratedTokens"] + [f"{t},{p},{o}" for t, p, o in rows]
    return write(tmp_path / name, "\n".join(lines))  # no trailing newline, as in the Azure files


def azure_rows(count: int, gap_s: float = 1.0) -> list[tuple[str, object, object]]:
    base = np.datetime64("2023-11-16T18:15:46.6800000", "ns")
    stamps = [base + np.timedelta64(int(i * gap_s * 1e9), "ns") for i in range(count)]
    return [(str(s).replace("T", " ")[:27], 100 + i, 10 + i) for i, s in enumerate(stamps)]


def mooncake_jsonl(tmp_path: Path, rows: list[dict[str, object]], name: str = "mooncake.jsonl") -> Path:
    return write(tmp_path / name, "".join(json.dumps(r) + "\n" for r in rows))


def test_azure2023_timestamps_become_seconds_since_first_row(tmp_path: Path) -> None:
    path = azure_csv(tmp_path, [
        ("2023-11-16 18:15:46.6800000", 374, 44),
        ("2023-11-16 18:15:50.9951690", 396, 109),
        ("2023-11-16 18:16:46.6800001", 879, 55),
    ])
    table = load(path, format="azure2023")
    assert table.arrival_s.tolist() == pytest.approx([0.0, 4.315169, 60.0000001], abs=1e-9)
    assert table.prompt_len.dtype == np.int64 and table.prompt_len.tolist() == [374, 396, 879]
    assert table.output_len.tolist() == [44, 109, 55]
    assert table.hash_ids is None and table.tenant is None and table.session is None


def test_mooncake_small_file(tmp_path: Path) -> None:
    path = mooncake_jsonl(tmp_path, [
        {"timestamp": 3000, "input_length": 600, "output_length": 5, "hash_ids": [0, 1]},
        {"timestamp": 0, "input_length": 512, "output_length": 7, "hash_ids": [0]},
        {"timestamp": 3000, "input_length": 1025, "output_length": 9, "hash_ids": [0, 2, 3]},
    ])
    table = load(path, format="mooncake")
    assert table.arrival_s.tolist() == [0.0, 3.0, 3.0]  # sorted, stable among equal times
    assert table.hash_ids == [(0,), (0, 1), (0, 2, 3)]
    assert table.prompt_len.tolist() == [512, 600, 1025]


def test_mooncake_rejects_hash_ids_for_another_block_size(tmp_path: Path) -> None:
    path = mooncake_jsonl(tmp_path, [
        {"timestamp": 0, "input_length": 100, "output_length": 5, "hash_ids": [0]},
        {"timestamp": 0, "input_length": 100, "output_length": 5, "hash_ids": [1, 2, 3, 4, 5, 6, 7]},
    ])
    with pytest.raises(InputError) as excinfo:
        load(path, format="mooncake")
    assert one_line_error(excinfo) == (
        "mooncake.jsonl line 2, key hash_ids: 7 block ids, but input_length 100 needs 1 blocks of 512 tokens"
    )


BURSTGPT_HEADER = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type"


def test_burstgpt_drops_failed_requests(tmp_path: Path) -> None:
    path = write(tmp_path / "BurstGPT_1.csv", "\n".join([
        BURSTGPT_HEADER,
        "5,ChatGPT,472,18,490,Conversation log",
        "45,ChatGPT,1087,0,1087,Conversation log",  # failure: 0 response tokens
        "118,GPT-4,417,276,693,API log",
        "140,ChatGPT,0,12,12,API log",  # empty prompt: cannot be served
        "166,GPT-4,1360,10,1370,Conversation log",
    ]) + "\n")
    table = load(path, format="burstgpt")
    assert len(table) == 3
    assert table.arrival_s.tolist() == [0.0, 113.0, 161.0]
    assert table.prompt_len.tolist() == [472, 417, 1360]
    assert table.output_len.tolist() == [18, 276, 10]
    assert table.tenant.tolist() == ["ChatGPT", "GPT-4", "GPT-4"]
    assert table.session is None


def test_burstgpt_session_column_and_spaced_header(tmp_path: Path) -> None:
    path = write(tmp_path / "burst.csv", "\n".join([
        "Timestamp, Model, Request tokens, Response tokens, Total tokens, Log Type, Session ID, Elapsed time",
        "0.5, ChatGPT, 10, 20, 30, Conversation log, s-1, 1.0",
        "1.5, ChatGPT, 11, 21, 32, Conversation log, s-1, 1.0",
    ]))
    table = load(path, format="burstgpt")
    assert table.session.tolist() == ["s-1", "s-1"]
    assert table.arrival_s.tolist() == [0.0, 1.0]


def test_burstgpt_all_failed_is_an_error(tmp_path: Path) -> None:
    path = write(tmp_path / "burst.csv", BURSTGPT_HEADER + "\n5,ChatGPT,472,0,472,API log\n")
    with pytest.raises(InputError, match=r"burst.csv: all 1 requests failed"):
        load(path, format="burstgpt")


def vllm_result(tmp_path: Path, **payload: object) -> Path:
    base: dict[str, object] = {"duration": 12.5, "completed": 3}
    return write(tmp_path / "result.json", json.dumps(base | payload))


def test_vllm_bench_keeps_successful_requests(tmp_path: Path) -> None:
    path = vllm_result(
        tmp_path,
        input_lens=[128, 256, 512, 1024],
        output_lens=[64, 0, 32, 16],
        errors=["", "Bad Request", "", ""],
        ttfts=[0.1, 0.0, 0.2, 0.3],
    )
    table = load(path, format="vllm_bench")
    assert table.arrival_s is None
    assert table.prompt_len.tolist() == [128, 512, 1024]
    assert table.output_len.tolist() == [64, 32, 16]


def test_vllm_bench_errors(tmp_path: Path) -> None:
    path = vllm_result(tmp_path, request_throughput=1.0)
    with pytest.raises(InputError) as excinfo:
        load(path, format="vllm_bench")
    assert "missing key 'input_lens'" in one_line_error(excinfo)
    assert "--save-detailed" in str(excinfo.value)

    path = vllm_result(tmp_path, input_lens=[1, 2], output_lens=[3])
    with pytest.raises(InputError, match=r"'input_lens' has 2 entries but 'output_lens' has 1"):
        load(path, format="vllm_bench")

    path = vllm_result(tmp_path, input_lens=[1, 2, "x"], output_lens=[3, 4, 5])
    with pytest.raises(InputError) as excinfo:
        load(path, format="vllm_bench")
    assert one_line_error(excinfo) == "result.json: input_lens[2]: 'x' is not an integer"

    write(tmp_path / "result.json", '{"input_lens": [1,\n')
    with pytest.raises(InputError, match=r"result.json line 2: not valid JSON"):
        load(tmp_path / "result.json", format="vllm_bench")


def test_lengths_format_has_no_arrivals(tmp_path: Path) -> None:
    path = write(tmp_path / "lens.csv", "num_prefill_tokens,num_decode_tokens,num_total_tokens,pd_ratio\n"
                 "74,918,992,0.08\n290,905,1195,0.32\n")
    table = load(path, format="lengths", repeat=2, limit=1)
    assert table.arrival_s is None and not table.has_arrivals
    assert table.prompt_len.tolist() == [74, 74]
    with pytest.raises(InputError) as excinfo:
        load(path, format="lengths", window_s=(0, 10), speedup=2.0)
    assert one_line_error(excinfo).startswith(
        "lens.csv: format 'lengths' has no arrival times, so window_s, speedup cannot apply"
    )


def test_generic_csv_with_mapping(tmp_path: Path) -> None:
    path = write(tmp_path / "requests.txt", "\n".join([
        "t_ms,in,out,who,prio,conv",
        "2500,10,1,alice,0,c1",
        "1000,20,2,bob,-1,c2",
        "1000,30,3,alice,2,c1",
    ]))
    columns = {"arrival": "t_ms", "arrival_unit": "ms", "prompt_len": "in", "output_len": "out",
               "tenant": "who", "priority": "prio", "session": "conv"}
    table = load(path, format="generic", columns=columns)
    assert table.arrival_s.tolist() == [0.0, 0.0, 1.5]
    assert table.prompt_len.tolist() == [20, 30, 10]
    assert table.tenant.tolist() == ["bob", "alice", "alice"]
    assert table.priority.dtype == np.int64 and table.priority.tolist() == [-1, 2, 0]
    assert table.session.tolist() == ["c2", "c1", "c1"]


def test_generic_jsonl_with_mapping(tmp_path: Path) -> None:
    path = write(tmp_path / "requests.jsonl", "\n".join([
        json.dumps({"ts": 100.25, "p": 5, "o": 6, "user": "u1", "extra": [1]}),
        "",
        json.dumps({"ts": 101.0, "p": 7, "o": 8, "user": "u2"}),
    ]))
    table = load(path, format="generic",
                 columns=TraceColumns(arrival="ts", prompt_len="p", output_len="o", tenant="user"))
    assert table.arrival_s.tolist() == [0.0, 0.75]
    assert table.output_len.tolist() == [6, 8]
    assert table.tenant.tolist() == ["u1", "u2"]

    lengths_only = load(path, format="generic", columns={"prompt_len": "p", "output_len": "o"})
    assert lengths_only.arrival_s is None and lengths_only.tenant is None


def test_generic_jsonl_errors_name_the_line(tmp_path: Path) -> None:
    columns = {"arrival": "ts", "prompt_len": "p", "output_len": "o"}
    path = write(tmp_path / "r.jsonl", '{"ts": 0, "p": 1, "o": 2}\n\n{"ts": 1, "p": 1}\n')
    with pytest.raises(InputError) as excinfo:
        load(path, format="generic", columns=columns)
    assert one_line_error(excinfo) == "r.jsonl line 3: missing key 'o' (have: ts, p)"

    write(path, '{"ts": 0, "p": 1, "o": 2}\n{"ts": 1, "p": 1, "o": 2.5}\n')
    with pytest.raises(InputError) as excinfo:
        load(path, format="generic", columns=columns)
    assert one_line_error(excinfo) == "r.jsonl line 2, key o: 2.5 is not an integer"

    write(path, '{"ts": 0, "p": 1, "o": 2}\n{"ts": 1, "p": 1, "o": 2,}\n')
    with pytest.raises(InputError, match=r"^r.jsonl line 2: not valid JSON"):
        load(path, format="generic", columns=columns)

    write(path, '{"ts": null, "p": 1, "o": 2}\n')
    with pytest.raises(InputError, match=r"^r.jsonl line 1, key ts: null \(expected a finite number\)$"):
        load(path, format="generic", columns=columns)


# --------------------------------------------------------------------------- error paths


def test_missing_column(tmp_path: Path) -> None:
    path = write(tmp_path / "azure2023_conv.csv", "TIMESTAMP,ContextTokens\n2023-11-16 18:15:46.6800000,5\n")
    with pytest.raises(InputError) as excinfo:
        load(path)
    assert one_line_error(excinfo) == (
        "azure2023_conv.csv: missing column 'GeneratedTokens' (have: TIMESTAMP, ContextTokens)"
    )


def test_bad_cell_names_its_line_and_column(tmp_path: Path) -> None:
    rows = azure_rows(20)
    rows[15] = (rows[15][0], "abc", 5)  # row 15 is file line 17: the header is line 1
    with pytest.raises(InputError) as excinfo:
        load(azure_csv(tmp_path, rows, "file.csv"), format="azure2023")
    assert one_line_error(excinfo) == "file.csv line 17, column ContextTokens: 'abc' is not an integer"


def test_blank_lines_still_count_for_line_numbers(tmp_path: Path) -> None:
    rows = azure_rows(3)
    text = "TIMESTAMP,ContextTokens,GeneratedTokens\n" + "\n".join(f"{t},{p},{o}" for t, p, o in rows[:2])
    text += f"\n\n{rows[2][0]},7,\n"
    with pytest.raises(InputError) as excinfo:
        load(write(tmp_path / "a.csv", text), format="azure2023")
    assert one_line_error(excinfo) == "a.csv line 5, column GeneratedTokens: empty cell (expected an integer)"


@pytest.mark.parametrize(
    ("prompt", "output", "message"),
    [
        (-3, 5, "column ContextTokens: -3 is negative (token counts must be >= 1)"),
        (5, 0, "column GeneratedTokens: 0 is below 1 (a request needs at least 1 token)"),
        (5, 2.5, "column GeneratedTokens: '2.5' is not an integer"),
    ],
)
def test_bad_lengths(tmp_path: Path, prompt: object, output: object, message: str) -> None:
    rows = azure_rows(4)
    rows[2] = (rows[2][0], prompt, output)
    with pytest.raises(InputError) as excinfo:
        load(azure_csv(tmp_path, rows), format="azure2023")
    assert one_line_error(excinfo) == f"azure.csv line 4, {message}"


def test_integral_floats_are_accepted(tmp_path: Path) -> None:
    rows = azure_rows(2)
    rows[1] = (rows[1][0], "12.0", "1e2")
    assert load(azure_csv(tmp_path, rows), format="azure2023").output_len.tolist() == [10, 100]


def test_bad_timestamp(tmp_path: Path) -> None:
    rows = azure_rows(3)
    rows[1] = ("16/11/2023 18:15", 1, 1)
    with pytest.raises(InputError) as excinfo:
        load(azure_csv(tmp_path, rows), format="azure2023")
    assert one_line_error(excinfo) == (
        "azure.csv line 3, column TIMESTAMP: '16/11/2023 18:15' is not a timestamp like "
        "'2023-11-16 18:15:46.6800000'"
    )


def test_empty_window(tmp_path: Path) -> None:
    path = azure_csv(tmp_path, azure_rows(11, gap_s=350.17), "azure2023_conv.csv")
    with pytest.raises(InputError) as excinfo:
        load(path, window_s=(5000, 6000))
    assert one_line_error(excinfo) == (
        "azure2023_conv.csv: window [5000, 6000] s holds no requests (trace spans 0–3501.7 s)"
    )


def test_unknown_format() -> None:
    with pytest.raises(ValidationError) as excinfo:
        TraceSpec(path="x.csv", format="splitwise")
    assert "unknown trace format 'splitwise' (allowed: azure2023, burstgpt, generic, lengths, " \
           "mooncake, vllm_bench)" in str(excinfo.value)
    with pytest.raises(InputError, match=r"unknown trace format 'splitwise' \(allowed: azure2023, "):
        resolve_trace(__file__, "splitwise")


def test_file_path_needs_a_format(tmp_path: Path) -> None:
    path = azure_csv(tmp_path, azure_rows(2))
    with pytest.raises(InputError) as excinfo:
        load(path)
    assert "say which format it is (format: one of azure2023, burstgpt" in one_line_error(excinfo)


def test_unknown_name_or_missing_file() -> None:
    with pytest.raises(InputError) as excinfo:
        load("azure_conversations")
    assert one_line_error(excinfo) == (
        "trace 'azure_conversations' does not exist and is not a registered trace name (registered: "
        "azure_code, azure_conv, mooncake_conversation, mooncake_synthetic, sharegpt_lengths, arxiv_lengths)"
    )


def test_missing_registered_trace_says_what_to_download(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("CBSIM_TRACE_PATH", str(tmp_path / "nowhere"))
    with pytest.raises(InputError) as excinfo:
        load("sharegpt_lengths")
    message = one_line_error(excinfo)
    assert message.startswith(
        "trace 'sharegpt_lengths': file sharegpt_lengths_llama2.csv not found (searched: "
    )
    for fragment in (
        str(tmp_path / "nowhere"),
        str(tmp_path / "xdg-cache" / "cbsim" / "traces"),
        "download data/processed_traces/sharegpt_8k_filtered_stats_llama2_tokenizer.csv",
        "from microsoft/sarathi-serve at commit 72339db (branch niyama_asplos2026)",
        "SHA-256 6d6c296302a853e2669a674a96f269283e60c57e60363bd450588a1066919f9f",
        "949,600 bytes",
        "$CBSIM_TRACE_PATH",
    ):
        assert fragment in message


def test_registered_names_match_the_traces_readme() -> None:
    readme = DEFAULT_TRACE_DIR / "README.md"
    if not readme.is_file():
        pytest.skip(f"{readme} not found")
    text = readme.read_text(encoding="utf-8")
    for entry in REGISTERED_TRACES.values():
        row = next(line for line in text.splitlines() if line.startswith(f"| `{entry.filename}`"))
        assert f"`{entry.source_path}`" in row and f"`{entry.sha256}`" in row
        assert f"{entry.repository}" in row and entry.commit in row
        assert f"{entry.size_bytes:,}" in row


def tiny_registered(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """Register a small generated file so search-path and SHA logic run without the real data."""
    source = azure_csv(tmp_path, azure_rows(5), "tiny.csv")
    digest = hashlib.sha256(source.read_bytes()).hexdigest()
    entry = RegisteredTrace("tiny", "tiny.csv", "azure2023", "example/repo", "abc1234", "data/tiny.csv",
                            digest, source.stat().st_size)
    monkeypatch.setitem(REGISTERED_TRACES, "tiny", entry)
    return source


def test_search_path_order_and_user_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    source = tiny_registered(monkeypatch, tmp_path)
    first, second = tmp_path / "first", tmp_path / "second"
    cache = tmp_path / "xdg-cache" / "cbsim" / "traces"
    for directory in (first, second, cache):
        directory.mkdir(parents=True)
    monkeypatch.setenv("CBSIM_TRACE_PATH", os.pathsep.join([str(first), "", str(second)]))
    assert trace_search_path() == [first, second, cache]

    (cache / "tiny.csv").write_bytes(source.read_bytes())
    assert resolve_trace("tiny") == (cache / "tiny.csv", "azure2023")
    (second / "tiny.csv").write_bytes(source.read_bytes())
    assert resolve_trace("tiny") == (second / "tiny.csv", "azure2023")
    assert len(load("tiny")) == 5

    with pytest.raises(InputError, match=r"trace 'tiny' is in format 'azure2023', not 'mooncake'"):
        resolve_trace("tiny", "mooncake")


def test_sha_mismatch_is_detected_and_hashing_is_cached(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    source = tiny_registered(monkeypatch, tmp_path)
    folder = tmp_path / "traces"
    folder.mkdir()
    copy = folder / "tiny.csv"
    copy.write_bytes(source.read_bytes())
    monkeypatch.setenv("CBSIM_TRACE_PATH", str(folder))
    load("tiny")

    hashed: list[int] = []
    real_sha256 = hashlib.sha256
    monkeypatch.setattr(traces.hashlib, "sha256", lambda: hashed.append(1) or real_sha256())
    load("tiny")
    assert hashed == []  # same path and mtime: not hashed again

    copy.write_bytes(source.read_bytes().replace(b",100,", b",101,"))
    os.utime(copy, ns=(time.time_ns(), time.time_ns() + 10**9))
    with pytest.raises(InputError) as excinfo:
        load("tiny")
    message = one_line_error(excinfo)
    assert hashed == [1]
    assert f"{copy}: SHA-256 {file_sha256(copy)} does not match registered trace 'tiny'" in message
    assert "re-download data/tiny.csv from example/repo at commit abc1234" in message


def test_spec_validation() -> None:
    with pytest.raises(ValidationError, match="give speedup or target_rate, not both"):
        TraceSpec(path="azure_conv", speedup=2, target_rate=3)
    with pytest.raises(ValidationError, match=r"window_s must be \[start, end\] with 0 <= start < end"):
        TraceSpec(path="azure_conv", window_s=(10, 5))
    with pytest.raises(ValidationError, match="columns apply to format 'generic' only"):
        TraceSpec(path="azure_conv", columns={"prompt_len": "a", "output_len": "b"})
    with pytest.raises(ValidationError, match="format 'generic' needs columns"):
        TraceSpec(path="x.csv", format="generic")
    with pytest.raises(ValidationError, match="Extra inputs are not permitted"):
        TraceSpec(path="x.csv", format="lengths", sampel_fraction=0.5)
    with pytest.raises(ValidationError, match="Extra inputs are not permitted"):
        TraceColumns(prompt_len="a", output_len="b", arival="t")
    for bad in ({"sample_fraction": 0}, {"sample_fraction": 1.5}, {"repeat": 0}, {"speedup": 0},
                {"target_rate": -1}, {"limit": 0}, {"max_prompt_len": 0}, {"speedup": math.inf}):
        with pytest.raises(ValidationError):
            TraceSpec(path="azure_conv", **bad)
    assert TraceSpec(path=Path("x.csv"), format="lengths").path == "x.csv"
    assert set(TRACE_FORMATS) == {"azure2023", "mooncake", "burstgpt", "lengths", "vllm_bench", "generic"}


def test_empty_and_malformed_files(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"^e.csv: file is empty"):
        load(write(tmp_path / "e.csv", ""), format="lengths")
    with pytest.raises(InputError, match=r"^h.csv: holds no requests$"):
        load(write(tmp_path / "h.csv", "num_prefill_tokens,num_decode_tokens\n"), format="lengths")
    ragged = write(tmp_path / "m.csv", "num_prefill_tokens,num_decode_tokens\n1,2\n3,4,5\n")
    with pytest.raises(InputError, match=r"^m.csv: not a readable CSV file \(Expected 2 fields in line 3"):
        load(ragged, format="lengths")


# --------------------------------------------------------------------------- shaping options


def regular_trace(tmp_path: Path, count: int = 101, gap_s: float = 1.0) -> Path:
    """Requests every ``gap_s`` seconds with distinct lengths, as generic CSV."""
    rows = [f"{i * gap_s + 1000.0},{i + 1},{2 * i + 1},s{i % 7}" for i in range(count)]
    return write(tmp_path / "regular.csv", "t,p,o,sess\n" + "\n".join(rows) + "\n")


REGULAR = {
    "format": "generic",
    "columns": {"arrival": "t", "prompt_len": "p", "output_len": "o", "session": "sess"},
}


def test_window(tmp_path: Path) -> None:
    table = load(regular_trace(tmp_path), window_s=(10, 20.5), **REGULAR)
    assert table.prompt_len.tolist() == list(range(11, 22))  # t in [10, 20.5): ten..twenty
    assert table.arrival_s.tolist() == [float(i) for i in range(11)]


def test_speedup_and_target_rate(tmp_path: Path) -> None:
    path = regular_trace(tmp_path)
    assert load(path, speedup=4, **REGULAR).span_s == pytest.approx(25.0)
    table = load(path, target_rate=20.0, **REGULAR)
    assert len(table) / table.span_s == pytest.approx(20.0)
    assert table.arrival_s[0] == 0.0

    single = write(tmp_path / "one.csv", "t,p,o,sess\n5,1,1,a\n5,2,2,b\n")
    with pytest.raises(InputError) as excinfo:
        load(single, target_rate=1.0, **REGULAR)
    assert one_line_error(excinfo) == (
        "one.csv: cannot rescale to target_rate 1 req/s: the 2 selected requests all arrive at the same time"
    )


def test_sample_fraction_is_seeded(tmp_path: Path) -> None:
    spec = TraceSpec(path=str(regular_trace(tmp_path)), sample_fraction=0.3, **REGULAR)
    first = load_trace(spec, rng(7))
    again = load_trace(spec, rng(7))
    other = load_trace(spec, rng(8))
    assert len(first) == 30
    assert np.array_equal(first.prompt_len, again.prompt_len)
    assert not np.array_equal(first.prompt_len, other.prompt_len)
    assert np.all(np.diff(first.prompt_len) > 0)  # trace order is kept
    assert first.arrival_s[0] == 0.0

    generator = rng(3)
    load_trace(TraceSpec(path=spec.path, **REGULAR), generator)
    assert generator.random() == rng(3).random()  # no sampling: the RNG is not consumed


def test_limit_then_target_rate(tmp_path: Path) -> None:
    table = load(regular_trace(tmp_path), limit=10, target_rate=2.0, **REGULAR)
    assert table.prompt_len.tolist() == list(range(1, 11))
    assert len(table) / table.span_s == pytest.approx(2.0)


def test_repeat_tiles_in_time(tmp_path: Path) -> None:
    table = load(regular_trace(tmp_path, count=5, gap_s=2.0), repeat=3, **REGULAR)
    assert len(table) == 15
    # span 8 s + one mean gap of 2 s: copies start 10 s apart
    assert table.arrival_s.tolist() == [float(t) for t in range(0, 30, 2)]
    assert table.prompt_len.tolist() == [1, 2, 3, 4, 5] * 3
    assert table.session.tolist()[:6] == ["s0", "s1", "s2", "s3", "s4", "s0#1"]
    assert table.session[-1] == "s4#2"


def test_repeat_keeps_prefix_reuse_within_copies(tmp_path: Path) -> None:
    path = mooncake_jsonl(tmp_path, [
        {"timestamp": 0, "input_length": 1000, "output_length": 5, "hash_ids": [3, 4]},
        {"timestamp": 1000, "input_length": 600, "output_length": 5, "hash_ids": [3, 9]},
    ])
    table = load(path, format="mooncake", repeat=2)
    assert table.hash_ids == [(3, 4), (3, 9), (10, 11), (10, 16)]
    assert table.arrival_s.tolist() == [0.0, 1.0, 2.0, 3.0]


def test_clipping(tmp_path: Path) -> None:
    path = mooncake_jsonl(tmp_path, [
        {"timestamp": 0, "input_length": 1500, "output_length": 900, "hash_ids": [1, 2, 3]},
        {"timestamp": 5, "input_length": 300, "output_length": 20, "hash_ids": [1]},
    ])
    table = load(path, format="mooncake", max_prompt_len=1024, max_output_len=512)
    assert table.prompt_len.tolist() == [1024, 300]
    assert table.output_len.tolist() == [512, 20]
    assert table.hash_ids == [(1, 2), (1,)]


def test_table_is_immutable(tmp_path: Path) -> None:
    table = load(regular_trace(tmp_path, count=3), **REGULAR)
    with pytest.raises(ValueError):
        table.prompt_len[0] = 7
    with pytest.raises(AttributeError):
        table.source = "elsewhere"  # type: ignore[misc]


# The autouse env fixture is function-scoped; these examples do not depend on it.
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    gaps=st.lists(st.floats(min_value=0.0, max_value=50.0, allow_nan=False), min_size=2, max_size=40),
    fraction=st.floats(min_value=0.05, max_value=1.0),
    repeat=st.integers(min_value=1, max_value=3),
    limit=st.one_of(st.none(), st.integers(min_value=1, max_value=50)),
    clip=st.integers(min_value=1, max_value=30),
    seed=st.integers(min_value=0, max_value=2**16),
)
def test_shaped_trace_invariants(
    tmp_path_factory: pytest.TempPathFactory,
    gaps: list[float],
    fraction: float,
    repeat: int,
    limit: int | None,
    clip: int,
    seed: int,
) -> None:
    """Whatever the options, arrivals start at 0 and never go backwards, and lengths respect clips."""
    folder = tmp_path_factory.mktemp("prop")
    arrivals = np.cumsum(gaps)
    order = np.random.default_rng(seed).permutation(len(gaps))  # files need not be sorted
    rows = [f"{float(arrivals[i])!r},{i + 1},{40 - i}" for i in order]
    path = write(folder / "p.csv", "t,p,o\n" + "\n".join(rows))
    columns = {"arrival": "t", "prompt_len": "p", "output_len": "o"}
    spec = TraceSpec(path=str(path), format="generic", columns=columns,
                     sample_fraction=fraction, repeat=repeat, limit=limit, max_prompt_len=clip)
    table = load_trace(spec, rng(seed))
    selected = min(max(1, round(fraction * len(gaps))), limit or len(gaps))
    assert len(table) == selected * repeat
    assert table.arrival_s[0] == 0.0
    assert np.all(np.diff(table.arrival_s) >= 0)
    assert table.prompt_len.max() <= clip and table.prompt_len.min() >= 1


def test_quoted_csv_fields_and_whitespace(tmp_path: Path) -> None:
    path = write(tmp_path / "q.csv", 'p,o,"team, name"\n 5 ,6,"north, east"\n7,8, south \n')
    columns = {"prompt_len": "p", "output_len": "o", "tenant": "team, name"}
    table = load(path, format="generic", columns=columns)
    assert table.prompt_len.tolist() == [5, 7]
    assert table.tenant.tolist() == ["north, east", "south"]
