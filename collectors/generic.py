"""Any CSV, JSON lines, JSON array or Parquet export, read through a user-given column mapping.

`--map prompt_tokens=input_len --map arrival_ts=ts` (or `--map-file`) names, for each normalized
field, a column of a CSV/Parquet file or a key of a JSON record; JSON keys may be dotted paths
(`usage.prompt_tokens`, `choices.0.text`). Never detected: chosen when --map is given. A mapping
that names a column the file lacks is refused up front, listing the columns the file has.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from advisor.errors import BadInput
from collectors.base import Collector, Options, Sample
from collectors.reading import sql_str

_TABLE_KINDS = ("csv", "parquet")
_JSON_KINDS = ("jsonl", "json_array")


def _q(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def json_path(key: str) -> str:
    """`a.b.0.c` -> `$."a"."b"[0]."c"`; a key already starting with `$` is kept as JSONPath."""
    if key.startswith("$"):
        return key
    parts = []
    for part in key.split("."):
        parts.append(f"[{part}]" if part.isdigit() else "." + _q(part))
    return "$" + "".join(parts)


def _resolve(record: Any, key: str) -> bool:
    """True when dotted `key` leads to a value in `record`."""
    value = record
    for part in key.split("."):
        if isinstance(value, dict) and part in value:
            value = value[part]
        elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        else:
            return False
    return True


def _keys(record: Any, prefix: str = "", depth: int = 3) -> list[str]:
    """Dotted paths of a record's scalar values (and of its objects below `depth`)."""
    if not isinstance(record, dict):
        return []
    found = []
    for key, value in record.items():
        path = prefix + key
        if isinstance(value, dict) and value and depth > 1:
            found += _keys(value, path + ".", depth - 1)
        else:
            found.append(path)
    return found


def _records(sample: Sample) -> list[Any]:
    if sample.kind == "json_array":
        return [sample.first_record] if sample.first_record else []
    found = []
    for line in sample.lines[:200]:
        try:
            found.append(json.loads(line))
        except ValueError:
            continue
    return found


def _required(mapping: dict[str, str]) -> tuple[str, ...]:
    return tuple(f for f in ("prompt_tokens", "output_tokens") if f in mapping)


def _json_select(mapping: dict[str, str]) -> str:
    fields = list(mapping)
    paths = "[" + ", ".join(sql_str(json_path(mapping[f])) for f in fields) + "]"
    picks = ", ".join(f"v[{i + 1}] AS {_q(f)}" for i, f in enumerate(fields))
    # One JSON parse per line for every mapped field; a corrupt line's fields stay NULL.
    return (
        f"SELECT line, CAST(raw AS VARCHAR) AS raw, {picks} FROM"
        f" (SELECT line, raw, try(json_extract_string(raw, {paths})) AS v FROM src)"
    )


def _column_select(mapping: dict[str, str], columns: list[str]) -> str:
    raw = "concat_ws(',', " + ", ".join(f"CAST({_q(c)} AS VARCHAR)" for c in columns) + ")"
    picks = ", ".join(f"{_q(column)} AS {_q(f)}" for f, column in mapping.items())
    return f"SELECT line, {raw} AS raw, {picks} FROM src"


def select(options: Options) -> str:
    """The SELECT for JSON records; CSV and Parquet files get theirs from `fit`."""
    return _json_select(options.mapping)


def fit(sample: Sample, options: Options) -> Collector:
    """This collector for `sample`'s kind, after checking that every mapped column exists."""
    mapping = options.mapping
    if "prompt_tokens" not in mapping:
        raise BadInput(
            f"{sample.path}: the generic format needs at least --map prompt_tokens=COLUMN "
            "(and usually output_tokens=COLUMN, arrival_ts=COLUMN)."
        )
    if sample.kind in _TABLE_KINDS:
        available = sample.columns
        missing = [(f, c) for f, c in mapping.items() if c not in available]
    elif sample.kind in _JSON_KINDS:
        records = _records(sample)
        available = list(dict.fromkeys(k for r in records[:20] for k in _keys(r)))
        missing = [
            (f, c)
            for f, c in mapping.items()
            if not c.startswith("$") and not any(_resolve(r, c) for r in records)
        ]
    else:
        raise BadInput(
            f"{sample.path} is not CSV with a header row, JSON lines, a JSON array or Parquet; "
            "a --map mapping needs one of those."
        )
    if missing:
        field, column = missing[0]
        shown = ", ".join(available[:40]) + (" ..." if len(available) > 40 else "")
        raise BadInput(
            f"--map {field}={column}: {sample.path} has no column '{column}'; "
            f"its columns are: {shown or '(none found)'}."
        )
    required = _required(mapping)
    if sample.kind in _TABLE_KINDS:
        return dataclasses.replace(
            COLLECTOR,
            select=lambda o: _column_select(o.mapping, sample.columns),
            required=required,
        )
    return dataclasses.replace(COLLECTOR, required=required)


COLLECTOR = Collector(
    name="generic",
    summary="Any CSV / JSONL / JSON / Parquet export through --map FIELD=COLUMN (never detected)",
    expects="--map FIELD=COLUMN for at least prompt_tokens",
    reader="jsonl",
    readers=("csv", "parquet", "json_array", "jsonl"),
    detect=lambda sample: False,
    select=select,
    fit=fit,
)
