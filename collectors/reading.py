"""Opening a log file: refusing empty or binary files, sampling its head, and the `src` relation.

DuckDB reads .gz and .zst files itself; the sample is decompressed here with the standard
library and `zstandard`, and only its first 64 KiB.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
from pathlib import Path

import duckdb
import zstandard

from advisor.errors import BadInput
from collectors.base import Reader, Sample

SAMPLE_BYTES = 64 * 1024
# DuckDB's CSV reader refuses lines over 2 MB by default; a logged request with a long document
# in its prompt (and its answer) can exceed that, and would fail the whole file. Its read buffer
# (16x the line limit unless set) must hold a line, and counts against the import's memory cap.
MAX_LINE_BYTES = 16 * 1024 * 1024
LINE_BUFFER_BYTES = 2 * MAX_LINE_BYTES
PARQUET_MAGIC = b"PAR1"


def sql_str(value: str) -> str:
    """A SQL string literal."""
    return "'" + value.replace("'", "''") + "'"


def _head(path: Path) -> bytes:
    try:
        if path.suffix == ".gz":
            with gzip.open(path, "rb") as f:
                return f.read(SAMPLE_BYTES)
        if path.suffix == ".zst":
            with path.open("rb") as raw:
                reader = zstandard.ZstdDecompressor().stream_reader(raw)
                return reader.read(SAMPLE_BYTES)
        with path.open("rb") as f:
            return f.read(SAMPLE_BYTES)
    except FileNotFoundError:
        raise BadInput(f"{path}: no such file.") from None
    except IsADirectoryError:
        raise BadInput(f"{path} is a folder; expected a log file.") from None
    except PermissionError:
        raise BadInput(f"{path} cannot be read (permission denied).") from None
    except (OSError, EOFError, zstandard.ZstdError) as exc:
        raise BadInput(
            f"{path} cannot be decompressed ({exc}); expected a valid {path.suffix} file."
        ) from None


def sample(path: Path) -> Sample:
    """Read the head of `path` and classify it; BadInput for empty, binary or undecodable files."""
    head = _head(path)
    if head.startswith(PARQUET_MAGIC):
        con = duckdb.connect()
        try:
            cols = [
                r[0]
                for r in con.execute(
                    f"DESCRIBE SELECT * FROM read_parquet({sql_str(str(path))})"
                ).fetchall()
            ]
        except duckdb.Error:
            raise BadInput(f"{path} starts like Parquet but cannot be read as Parquet.") from None
        return Sample(str(path), "parquet", "", [], None, cols)
    if not head.strip():
        raise BadInput(f"{path} is empty; expected a log export with at least one request.")
    if b"\x00" in head:
        raise BadInput(
            f"{path} is binary, not a text log; expected JSON lines, JSON, CSV or Parquet."
        )
    try:
        text = head.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        # The sample may end inside a multi-byte character; only an early failure is real.
        if exc.start < len(head) - 4:
            raise BadInput(
                f"{path} is not UTF-8 text (bad byte at offset {exc.start}); expected a UTF-8 log."
            ) from None
        text = head[: exc.start].decode("utf-8-sig")
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if len(head) == SAMPLE_BYTES and len(lines) > 1:
        lines = lines[:-1]  # the last line may be cut by the sample
    stripped = text.lstrip()
    if stripped.startswith("{"):
        try:
            record = json.loads(lines[0])
        except (json.JSONDecodeError, IndexError):
            record = None
        if isinstance(record, dict):
            return Sample(str(path), "jsonl", text, lines, record)
    if stripped.startswith("["):
        return Sample(str(path), "json_array", text, lines, _first_array_record(path))
    header = next(csv.reader(io.StringIO(lines[0]))) if lines else []
    if len(header) > 1 and all(h.strip() for h in header):
        return Sample(str(path), "csv", text, lines, None, [h.strip() for h in header])
    return Sample(str(path), "text", text, lines)


def _first_array_record(path: Path) -> dict | None:
    con = duckdb.connect()
    try:
        rows = con.execute(
            f"SELECT json FROM read_json_objects({sql_str(str(path))}, format='array') LIMIT 1"
        ).fetchall()
    except duckdb.Error:
        return None
    if not rows:
        return None
    value = json.loads(rows[0][0])
    return value if isinstance(value, dict) else None


def source_sql(path: Path, reader: Reader, rejects_table: str = "reject_errors") -> str:
    """The `src` relation for `reader`: always a `line` column, plus the reader's own columns.

    - jsonl / text_lines: `raw` VARCHAR, one row per non-blank line.
    - csv: every column as VARCHAR under its header name (line = row number + 1 for the header);
      malformed rows go to the temp table `rejects_table` instead.
    - json_array: `raw` JSON text of each element (line = element number).
    - parquet: the file's columns (line = row number).
    """
    p = sql_str(str(path))
    if reader in ("jsonl", "text_lines"):
        return (
            "SELECT ordinality AS line, l AS raw FROM read_csv("
            f"{p}, columns={{'l': 'VARCHAR'}}, header=false, delim='\\0', quote='', escape='',"
            f" auto_detect=false, strict_mode=false, max_line_size={MAX_LINE_BYTES},"
            f" buffer_size={LINE_BUFFER_BYTES})"
            " WITH ORDINALITY"
            # Blank lines are skipped; trim() only for lines that start with white space, since
            # trimming every line costs as much as reading it.
            " WHERE l IS NOT NULL AND l <> ''"
            " AND (ascii(l) NOT IN (9, 13, 32) OR trim(l, chr(9) || chr(13) || ' ') <> '')"
        )
    if reader == "csv":
        return (
            f"SELECT ordinality + 1 AS line, * EXCLUDE (ordinality) FROM read_csv({p},"
            f" header=true, all_varchar=true, store_rejects=true, rejects_table='{rejects_table}',"
            f" rejects_scan='{rejects_table}_scans') WITH ORDINALITY"
        )
    if reader == "json_array":
        return (
            f"SELECT ordinality AS line, json AS raw FROM read_json_objects({p}, format='array')"
            " WITH ORDINALITY"
        )
    return (
        f"SELECT ordinality AS line, * EXCLUDE (ordinality) FROM read_parquet({p}) WITH ORDINALITY"
    )
