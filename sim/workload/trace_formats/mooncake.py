"""Mooncake (Kimi) FAST'25 traces: JSON lines with arrivals, lengths and prefix-block hashes.

Each line is ``{"timestamp": ms, "input_length": n, "output_length": m, "hash_ids": [...]}``.
``hash_ids`` are remapped ids of the prompt's 512-token blocks; equal ids across
requests mark a reusable prefix KV block, which is what prefix-caching studies need,
so we keep them (as tuples) and check that each request lists exactly
``ceil(input_length / 512)`` of them: a file built with another block size would
otherwise silently distort cache-hit rates.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from sim.workload.trace_formats.parsing import (
    float_column,
    int_column,
    read_jsonl,
    require_rows,
)
from sim.workload.trace_formats.table import TraceTable

BLOCK_TOKENS = 512
KEYS = ("timestamp", "input_length", "output_length")


def load(path: Path, columns: object = None) -> TraceTable:
    """Parse a Mooncake JSONL trace (``columns`` is unused: the layout is fixed)."""
    raw = read_jsonl(path, KEYS, optional=("hash_ids",))
    require_rows(raw, path)
    arrival_s = float_column(raw, "timestamp") / 1000.0
    prompt_len = int_column(raw, "input_length")
    output_len = int_column(raw, "output_length")

    hash_ids: list[tuple[int, ...]] | None = None
    if raw.has("hash_ids"):
        hash_ids = []
        for row, value in enumerate(raw.frame["hash_ids"]):
            if not isinstance(value, list) or not all(type(item) is int for item in value):
                raise raw.cell_error(row, "hash_ids", "expected a list of integer block ids")
            hash_ids.append(tuple(value))
        counts = np.fromiter((len(ids) for ids in hash_ids), dtype=np.int64, count=len(hash_ids))
        expected = -(-prompt_len // BLOCK_TOKENS)
        wrong = counts != expected
        if wrong.any():
            row = int(np.argmax(wrong))
            raise raw.cell_error(
                row,
                "hash_ids",
                f"{counts[row]} block ids, but input_length {prompt_len[row]} needs "
                f"{expected[row]} blocks of {BLOCK_TOKENS} tokens",
            )
    return TraceTable(
        arrival_s=arrival_s,
        prompt_len=prompt_len,
        output_len=output_len,
        hash_ids=hash_ids,
        source=str(path),
        hash_block_tokens=BLOCK_TOKENS if hash_ids is not None else None,
    )
