"""What a collector is: a detector plus one SQL SELECT that maps a raw file onto `requests`.

A collector never loops over rows in Python. It receives the file as a DuckDB relation named
`src` (shaped by its reader, see collectors/reading.py) and returns a SELECT whose columns are
`line`, optionally `raw` and `reject_reason`, and any of the normalized FIELDS below as raw
values. Typing, validation and rejects are done once for all formats in collectors/normalize.py.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

Reader = Literal["jsonl", "text_lines", "csv", "json_array", "parquet"]

# The normalized columns a collector may produce (DESIGN.md, "Data").
FIELDS: tuple[str, ...] = (
    "request_id",
    "arrival_ts",
    "finish_ts",
    "prompt_tokens",
    "output_tokens",
    "temperature",
    "top_p",
    "max_tokens",
    "task",
    "model",
    "tenant",
    "concurrency",
    "ttft_ms",
    "e2e_ms",
    "prompt_text",
    "output_text",
)


@dataclass(frozen=True)
class Sample:
    """The head of a file, decoded, for format detection."""

    path: str
    kind: Literal["jsonl", "json_array", "csv", "parquet", "text"]
    text: str
    lines: list[str]
    first_record: dict[str, Any] | None = None
    columns: list[str] = field(default_factory=list)

    def has_columns(self, *names: str) -> bool:
        """True when every name is a column (CSV/Parquet) or a top-level key (JSON)."""
        keys = set(self.columns) | set(self.first_record or {})
        return all(name in keys for name in names)


@dataclass(frozen=True)
class Options:
    """User choices that shape a collector's SELECT."""

    task_key: str | None = None
    mapping: dict[str, str] = field(default_factory=dict)

    def task_path(self, default: str) -> str:
        """JSONPath of the task label: `--task-key metadata.task` -> `$.metadata.task`."""
        key = self.task_key or default
        return key if key.startswith("$") else "$." + key


@dataclass(frozen=True)
class Collector:
    """One log format. `select(options)` returns SQL over the relation `src`."""

    name: str
    summary: str
    expects: str
    reader: Reader
    detect: Callable[[Sample], bool]
    select: Callable[[Options], str]
    required: tuple[str, ...] = ("prompt_tokens", "output_tokens")
    readers: tuple[Reader, ...] = ()
    # Formats whose SQL depends on the file's own columns (generic --map) build a collector fitted
    # to this file here, or refuse it with BadInput; ingest calls it before reading.
    fit: Callable[[Sample, Options], Collector] | None = None

    def reader_for(self, sample: Sample) -> Reader:
        """The reader for this file: `reader`, or one of `readers` matching the file's kind."""
        kinds = {"jsonl": "jsonl", "json_array": "json_array", "csv": "csv", "parquet": "parquet"}
        wanted = kinds.get(sample.kind)
        if wanted in self.readers:
            return wanted  # type: ignore[return-value]
        return self.reader


def parse_mapping(flags: list[str], mapping_file: str | None = None) -> dict[str, str]:
    """`--map FIELD=COLUMN` flags (and an optional JSON or TOML file of the same pairs) as a dict.

    Flags override the file. Unknown fields are refused with the list of valid ones.
    """
    import json
    import tomllib
    from pathlib import Path

    from advisor.errors import BadInput

    mapping: dict[str, str] = {}
    if mapping_file:
        path = Path(mapping_file)
        try:
            text = path.read_text(encoding="utf-8-sig")
            loaded = tomllib.loads(text) if path.suffix == ".toml" else json.loads(text)
        except (OSError, ValueError) as exc:
            raise BadInput(f"Mapping file {path} cannot be read as JSON or TOML: {exc}.") from None
        if not isinstance(loaded, dict) or not all(isinstance(v, str) for v in loaded.values()):
            raise BadInput(f'Mapping file {path} must hold FIELD = "column" pairs.')
        mapping.update(loaded)
    for flag in flags:
        field_name, sep, column = flag.partition("=")
        if not sep or not field_name.strip() or not column.strip():
            raise BadInput(f"--map '{flag}' is not FIELD=COLUMN (e.g. prompt_tokens=input_len).")
        mapping[field_name.strip()] = column.strip()
    unknown = sorted(set(mapping) - set(FIELDS))
    if unknown:
        raise BadInput(
            f"--map names unknown field(s) {', '.join(unknown)}; valid fields: {', '.join(FIELDS)}."
        )
    return mapping
