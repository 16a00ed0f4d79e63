"""Shared, vectorized parsing of CSV / JSONL trace files into validated columns.

Files are read as text first (pyarrow for CSV) and converted column by column with
vectorized casts; only when a cast fails do we look for the column's *first* bad
row, so a good 19k-row file parses in milliseconds and a bad one still gets a
one-line ``InputError`` naming the file, the line and the column.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pa_compute
import pyarrow.csv as pa_csv

from sim.errors import InputError

_MISSING = object()
"""Stands for a key absent from a JSON line (distinct from an explicit null)."""


@dataclass(frozen=True)
class RawColumns:
    """Text (CSV) or decoded-JSON (JSONL) cells of the columns a format asked for.

    ``lines`` holds the 1-based file line of every row, so a bad cell found by a
    vectorized check can be reported where the user will look for it. ``kind`` is
    the word for a field in messages: ``column`` for CSV, ``key`` for JSONL, and
    ``index`` for a JSON document of parallel lists, where ``lines`` holds each
    row's list index instead of a line number.
    """

    file: str
    frame: pd.DataFrame
    lines: np.ndarray
    kind: str

    def __len__(self) -> int:
        return len(self.frame)

    def has(self, name: str) -> bool:
        return name in self.frame.columns

    def cell_error(self, row: int, column: str, what: str) -> InputError:
        """An InputError for one cell: ``file line N, column C: what`` (or ``file: C[i]: what``)."""
        if self.kind == "index":
            return InputError(f"{self.file}: {column}[{self.lines[row]}]: {what}")
        return InputError(f"{self.file} line {self.lines[row]}, {self.kind} {column}: {what}")


def _is_blank(value: Any) -> bool:
    return value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value)) or (
        isinstance(value, str) and not value.strip()
    )


def _not_a(value: Any, expected: str) -> str:
    """Why a cell was rejected: ``'abc' is not an integer`` or ``empty cell (expected an integer)``."""
    if value is None:
        return f"null (expected {expected})"
    if _is_blank(value):
        return f"empty cell (expected {expected})"
    return f"{value!r} is not {expected}"


def _first(mask: np.ndarray) -> int:
    return int(np.argmax(mask))


def _reject_booleans(raw: RawColumns, column: str, expected: str) -> None:
    """JSON ``true`` would pass as 1 through pandas; a count or time is never a boolean."""
    cells = raw.frame[column]
    if cells.dtype == object:
        is_bool = cells.map(lambda value: isinstance(value, bool)).to_numpy(dtype=bool)
        if is_bool.any():
            row = _first(is_bool)
            raise raw.cell_error(row, column, _not_a(cells.iloc[row], expected))


def _arrow_cast(cells: pd.Series, target: pa.DataType) -> np.ndarray | None:
    """Fast path for text columns: pyarrow's cast, or None when any cell needs a closer look."""
    if cells.dtype == object or not pd.api.types.is_string_dtype(cells.dtype):
        return None
    try:
        converted = pa_compute.cast(pa.array(cells.array), target)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError, TypeError):
        return None
    if converted.null_count:
        return None
    return converted.to_numpy(zero_copy_only=False)


def _csv_header(path: Path) -> list[str]:
    """The header row as written (quoting honoured), or an InputError for an empty file."""
    try:
        with path.open(encoding="utf-8", newline="") as handle:
            header = next(csv.reader(handle), None)
    except UnicodeDecodeError as exc:
        raise InputError(f"{path.name}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except (OSError, csv.Error) as exc:
        raise InputError(f"{path.name}: cannot read ({exc})") from None
    if not header or not any(name.strip() for name in header):
        raise InputError(f"{path.name}: file is empty (expected a CSV header)")
    return header


def _read_csv_with_pandas(path: Path) -> pd.DataFrame:
    """Slow path: pandas' C parser, whose errors name the offending line."""
    try:
        frame = pd.read_csv(path, dtype=str, keep_default_na=False, skip_blank_lines=False,
                            skipinitialspace=True)
    except pd.errors.EmptyDataError:
        raise InputError(f"{path.name}: file is empty (expected a CSV header)") from None
    except pd.errors.ParserError as exc:
        detail = str(exc).strip().splitlines()[-1]
        detail = detail.removeprefix("Error tokenizing data. ").removeprefix("C error: ")
        raise InputError(f"{path.name}: not a readable CSV file ({detail})") from None
    except UnicodeDecodeError as exc:
        raise InputError(f"{path.name}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    frame.columns = [str(c).strip() for c in frame.columns]
    return frame


def read_csv(path: Path, required: Iterable[str], optional: Iterable[str] = ()) -> RawColumns:
    """Read the named columns of a CSV file as text, keeping file line numbers.

    Header names and cells are compared after stripping surrounding spaces
    (``Timestamp, Model, ...`` headers); fully blank lines are skipped but still
    counted. pyarrow's multithreaded reader does the work (5x faster than pandas'
    string parsing on million-row BurstGPT files); if it rejects the file, pandas
    re-reads it to produce an error message with the line number.
    """
    required = list(required)
    optional = list(optional)
    header = _csv_header(path)
    names = [name.strip() for name in header]
    for name in required:
        if name not in names:
            raise InputError(f"{path.name}: missing column {name!r} (have: {', '.join(names)})")
    wanted = required + [name for name in optional if name in names]

    frame: pd.DataFrame | None = None
    if len(set(names)) == len(names):
        try:
            table = pa_csv.read_csv(
                path,
                parse_options=pa_csv.ParseOptions(ignore_empty_lines=False),
                convert_options=pa_csv.ConvertOptions(
                    column_types=dict.fromkeys(header, pa.string()),
                    strings_can_be_null=False,
                    quoted_strings_can_be_null=False,
                ),
            )
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            frame = None
        else:
            trimmed = {
                name: pa_compute.utf8_trim_whitespace(table.column(raw))
                for name, raw in zip(names, header, strict=True)
            }
            frame = pa.table(trimmed).to_pandas(types_mapper={pa.string(): pd.StringDtype("pyarrow")}.get)
    if frame is None:
        frame = _read_csv_with_pandas(path)

    lines = np.arange(2, len(frame) + 2, dtype=np.int64)
    blank = frame.eq("").all(axis=1).to_numpy(dtype=bool)
    frame = frame[wanted]
    if blank.any():
        frame = frame.loc[~blank].reset_index(drop=True)
        lines = lines[~blank]
    return RawColumns(file=path.name, frame=frame, lines=lines, kind="column")


def read_jsonl(path: Path, required: Iterable[str], optional: Iterable[str] = ()) -> RawColumns:
    """Read the named keys of a JSON-lines file (one object per line), keeping line numbers."""
    required = list(required)
    optional = list(optional)
    records: list[dict[str, Any]] = []
    lines: list[int] = []
    try:
        with path.open(encoding="utf-8") as handle:
            for lineno, text in enumerate(handle, start=1):
                if not text.strip():
                    continue
                try:
                    record = json.loads(text)
                except json.JSONDecodeError as exc:
                    raise InputError(
                        f"{path.name} line {lineno}: not valid JSON ({exc.msg} at column {exc.colno})"
                    ) from None
                if not isinstance(record, dict):
                    raise InputError(
                        f"{path.name} line {lineno}: expected a JSON object, got {type(record).__name__}"
                    )
                records.append(record)
                lines.append(lineno)
    except UnicodeDecodeError as exc:
        raise InputError(f"{path.name}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except OSError as exc:
        raise InputError(f"{path.name}: cannot read ({exc.strerror})") from None

    data: dict[str, list[Any]] = {}
    for name in required + optional:
        values = [record.get(name, _MISSING) for record in records]
        missing = [i for i, value in enumerate(values) if value is _MISSING]
        if missing and name in required:
            row = missing[0]
            have = ", ".join(records[row])
            raise InputError(f"{path.name} line {lines[row]}: missing key {name!r} (have: {have})")
        if missing and len(missing) < len(values):
            row = missing[0]
            raise InputError(
                f"{path.name} line {lines[row]}: missing key {name!r} that other lines have"
            )
        if not missing:
            data[name] = values
    frame = pd.DataFrame({name: pd.Series(values, dtype=object) for name, values in data.items()})
    if not data:
        frame = pd.DataFrame(index=range(len(records)))
    return RawColumns(file=path.name, frame=frame, lines=np.asarray(lines, dtype=np.int64), kind="key")


def int_column(raw: RawColumns, column: str, minimum: int | None = 1) -> np.ndarray:
    """Parse a column of whole numbers into int64, rejecting text, fractions and values below ``minimum``.

    ``minimum=1`` is the default because a token count of 0 cannot be served: every
    request needs at least one prompt token and generates at least one token.
    """
    cells = raw.frame[column]
    _reject_booleans(raw, column, "an integer")
    values = _arrow_cast(cells, pa.int64())
    if values is None:
        # Slow path: also accepts integral spellings such as "12.0" or "1e3".
        numbers = pd.to_numeric(cells, errors="coerce")
        floats = numbers.to_numpy(dtype=np.float64, na_value=np.nan)
        with np.errstate(invalid="ignore"):
            bad = ~np.isfinite(floats) | (floats != np.floor(floats)) | (np.abs(floats) >= 2.0**53)
        if bad.any():
            row = _first(bad)
            raise raw.cell_error(row, column, _not_a(cells.iloc[row], "an integer"))
        values = floats.astype(np.int64)
    if minimum is not None:
        low = values < minimum
        if low.any():
            row = _first(low)
            value = values[row]
            if value < 0:
                what = f"{value} is negative (token counts must be >= {minimum})"
            else:
                what = f"{value} is below {minimum} (a request needs at least {minimum} token)"
            raise raw.cell_error(row, column, what)
    return values


def float_column(raw: RawColumns, column: str) -> np.ndarray:
    """Parse a column of finite real numbers into float64."""
    cells = raw.frame[column]
    _reject_booleans(raw, column, "a number")
    values = _arrow_cast(cells, pa.float64())
    if values is None:
        values = pd.to_numeric(cells, errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
    bad = ~np.isfinite(values)
    if bad.any():
        row = _first(bad)
        raise raw.cell_error(row, column, _not_a(cells.iloc[row], "a finite number"))
    return values


def text_column(raw: RawColumns, column: str) -> np.ndarray:
    """A column of non-empty labels (tenant, session) as a numpy str array."""
    cells = raw.frame[column]
    if cells.dtype == object:
        empty = cells.map(_is_blank).to_numpy(dtype=bool)
    else:
        empty = (cells.isna() | cells.str.strip().eq("")).to_numpy(dtype=bool)
    if empty.any():
        row = _first(empty)
        raise raw.cell_error(row, column, _not_a(cells.iloc[row], "a label"))
    return cells.astype(str).str.strip().to_numpy(dtype=str)


def datetime_column(raw: RawColumns, column: str, layout: str) -> np.ndarray:
    """Parse wall-clock timestamps into float64 seconds since the earliest one.

    ``layout`` is shown in the error message so the user sees what was expected.
    """
    cells = raw.frame[column]
    # utc=True: naive stamps are taken as UTC and zoned ones converted, so a file that
    # mixes both still yields one comparable clock instead of a pandas exception.
    stamps = pd.to_datetime(cells, format="ISO8601", errors="coerce", utc=True)
    nanos = stamps.dt.tz_localize(None).to_numpy(dtype="datetime64[ns]")
    bad = np.isnat(nanos)
    if bad.any():
        row = _first(bad)
        raise raw.cell_error(row, column, _not_a(cells.iloc[row], f"a timestamp like {layout}"))
    ticks = nanos.astype(np.int64)
    return (ticks - ticks.min()).astype(np.float64) / 1e9


def require_rows(raw: RawColumns, path: Path) -> None:
    """Reject a file that parsed but holds no requests."""
    if len(raw) == 0:
        raise InputError(f"{path.name}: holds no requests")
