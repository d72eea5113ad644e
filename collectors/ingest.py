"""Importing one log file into the store: detect, stage in SQL, validate, commit or leave no trace.

The whole import is one DuckDB transaction: rows, rejects and the `imports` record appear
together or not at all (Ctrl-C and kill -9 included). A file whose checksum is already in
`imports` is not read again.

One pass over the file: DuckDB reads, types and validates it into a lean temp table (typed
fields and reasons; raw text only for rejected rows), from which the accepted rows and the
rejects are inserted. bench/ingest.py measures this against DuckDB's bare read of the file.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

import duckdb

from advisor.concurrency import overlap_counts_sql
from advisor.errors import BadInput
from advisor.schemas import ImportSummary
from advisor.store import one, scalar, transaction
from collectors.base import FIELDS, Collector, Options, Sample
from collectors.normalize import normalized_sql
from collectors.reading import sample as read_sample
from collectors.reading import source_sql, sql_str
from collectors.registry import COLLECTORS, by_name

ProgressFn = Callable[[float], None]
# The bound is 1.5 GB of peak RSS; DuckDB's buffer pool gets 1 GB of it, the rest is
# the interpreter and DuckDB's allocations outside the pool.
IMPORT_MEMORY_LIMIT = "1GB"
_CSV_REJECTS = "csv_reject_errors"


def checksum(path: Path) -> str:
    """sha256 of the file's bytes as stored (compressed files hash their compressed bytes)."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()


def detect(sample: Sample) -> Collector:
    """The first registered collector that recognises the sample, or BadInput listing them all."""
    for collector in COLLECTORS:
        if collector.detect(sample):
            return collector
    tried = "; ".join(f"{c.name} ({c.expects})" for c in COLLECTORS)
    raise BadInput(
        f"Could not tell the log format of {sample.path}. Tried: {tried}. "
        "Pass --format NAME, or --map FIELD=COLUMN for a generic CSV/JSONL/Parquet export."
    )


def choose(sample: Sample, format_name: str | None, options: Options) -> Collector:
    """The collector named by --format, the generic one when only --map is given, else detected."""
    if format_name:
        return by_name(format_name)
    if options.mapping:
        return by_name("generic")
    return detect(sample)


def ingest_file(
    con: duckdb.DuckDBPyConnection,
    path: str | Path,
    *,
    format_name: str | None = None,
    options: Options | None = None,
    store_text: bool = False,
    on_progress: ProgressFn | None = None,
) -> ImportSummary:
    """Import `path` into `requests`/`rejects`/`imports`; BadInput leaves the database unchanged."""
    path = Path(path)
    options = options or Options()
    sample = read_sample(path)
    collector = choose(sample, format_name, options)
    if collector.fit is not None:
        collector = collector.fit(sample, options)
    started = _now()
    size = path.stat().st_size
    # Identical content has an identical size: only then can this be a re-import, and only then
    # is the checksum needed before reading. Otherwise it is computed in a thread while DuckDB
    # parses the file (hashlib releases the GIL), instead of in a pass of its own.
    hasher = _Checksum(path)
    if scalar(con, "SELECT count(*) FROM imports WHERE size_bytes = ?", [size]):
        hasher.run()
        previous = one(
            con,
            "SELECT import_id, format, rows_read, rows_accepted, rows_rejected, started_at,"
            " finished_at FROM imports WHERE checksum = ?",
            [hasher.result()],
        )
        if previous:
            return ImportSummary(
                import_id=previous[0], file=str(path), format=previous[1],
                checksum=hasher.result(), rows_read=previous[2], rows_accepted=previous[3],
                rows_rejected=previous[4], already_imported=True, started_at=previous[5],
                finished_at=previous[6],
            )  # fmt: skip
    else:
        hasher.start()

    reader = collector.reader_for(sample)
    csv_reader = reader == "csv"
    src = source_sql(path, reader, rejects_table=_CSV_REJECTS)
    # A subquery, so that a collector's SELECT may open with its own WITH.
    collector_sql = f"WITH src AS ({src}) SELECT * FROM ({collector.select(options)})"
    try:
        columns = {row[0]: row[1] for row in con.execute(f"DESCRIBE {collector_sql}").fetchall()}
    except duckdb.Error as exc:
        raise BadInput(
            f"{path} cannot be read as {collector.name} ({collector.expects}): "
            f"{str(exc).splitlines()[0]}"
        ) from None
    if "line" not in columns:
        raise AssertionError(f"collector {collector.name} must select a `line` column")
    staging, fields = normalized_sql(
        collector_sql, columns, collector.required, reader == "jsonl", store_text
    )
    timed = "arrival_ts" in fields and "finish_ts" in fields

    with _interrupt_is_keyboard(), _memory_capped(con), transaction(con):
        if csv_reader:
            con.execute(f"DROP TABLE IF EXISTS temp.{_CSV_REJECTS}")
        try:
            _run_with_progress(con, f"CREATE TEMP TABLE staged AS {staging}", on_progress)
        except duckdb.Error as exc:
            if isinstance(exc, duckdb.InterruptException):
                raise
            raise BadInput(
                f"{path} cannot be read as {collector.name}: {str(exc).splitlines()[0]}"
            ) from None
        if csv_reader:
            _fix_csv_lines(con)
        with_finish = (
            "count(*) FILTER (WHERE reject_reason IS NULL AND arrival_ts IS NOT NULL"
            " AND finish_ts IS NOT NULL)"
            if timed
            else "0"
        )
        rows, rejected, finished_rows = one(
            con,
            "SELECT count(*), count(*) FILTER (WHERE reject_reason IS NOT NULL),"
            f" {with_finish} FROM staged",
        )
        csv_bad = _csv_reject_count(con) if csv_reader else 0
        rows_read, rows_rejected = rows + csv_bad, rejected + csv_bad
        if rows_read == 0:
            raise BadInput(f"{path} holds no requests; expected at least one {collector.name} row.")
        import_id = scalar(con, "SELECT nextval('import_id_seq')")
        _insert_requests(con, import_id, collector.name, fields, derive=finished_rows > 0)
        _insert_rejects(con, import_id, str(path), csv_reader)
        digest = hasher.result()
        finished = _now()
        con.execute(
            "INSERT INTO imports VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [
                import_id, str(path), collector.name, digest, size, rows_read,
                rows_read - rows_rejected, rows_rejected,
                json.dumps({"task_key": options.task_key, "mapping": options.mapping,
                            "store_text": store_text}),
                started, finished,
            ],
        )  # fmt: skip
        con.execute("DROP TABLE staged")
    return ImportSummary(
        import_id=import_id, file=str(path), format=collector.name, checksum=digest,
        rows_read=rows_read, rows_accepted=rows_read - rows_rejected, rows_rejected=rows_rejected,
        started_at=started, finished_at=finished,
    )  # fmt: skip


class _Checksum(threading.Thread):
    """`checksum(path)`, run inline (`run`) or beside the import (`start`); `result` waits."""

    def __init__(self, path: Path) -> None:
        super().__init__(name=f"checksum {path.name}", daemon=True)
        self.path = path
        self.digest: str | None = None
        self.error: OSError | None = None

    def run(self) -> None:
        try:
            self.digest = checksum(self.path)
        except OSError as exc:
            self.error = exc

    def result(self) -> str:
        if self.is_alive():
            self.join()
        if self.digest is None:
            raise BadInput(f"{self.path} could not be read to its end: {self.error}.")
        return self.digest


@contextmanager
def _memory_capped(con: duckdb.DuckDBPyConnection) -> Iterator[None]:
    """DuckDB's default memory limit (80% of RAM) lowered to IMPORT_MEMORY_LIMIT for the import.

    Past the limit DuckDB spills the staging table to disk instead of growing, so a 2M-row import
    peaks near 1 GB of RSS (bench/RESULTS.md) whatever the machine's RAM. A limit the caller set
    on the connection is left as it is.
    """
    setting = "SELECT current_setting('memory_limit')"
    with duckdb.connect() as fresh:  # a new in-memory instance shows the default
        default = scalar(fresh, setting)
    if scalar(con, setting) != default:
        yield
        return
    con.execute(f"SET memory_limit = '{IMPORT_MEMORY_LIMIT}'")
    try:
        yield
    finally:
        con.execute("RESET memory_limit")


@contextmanager
def _interrupt_is_keyboard() -> Iterator[None]:
    """Ctrl-C during a query surfaces from DuckDB as an error; raise it as what it is.

    The transaction inside has already rolled back when this sees the error.
    """
    try:
        yield
    except (duckdb.InterruptException, RuntimeError) as exc:
        if not isinstance(exc, duckdb.InterruptException) and "interrupted" not in str(exc):
            raise
        raise KeyboardInterrupt from None


def _now() -> datetime:
    return datetime.now(UTC).replace(tzinfo=None)


def _run_with_progress(con: duckdb.DuckDBPyConnection, sql: str, on_progress: ProgressFn | None):
    """Run `sql`, reporting DuckDB's own query progress (0-100) from a watcher thread."""
    if on_progress is None:
        con.execute(sql)
        return
    done = threading.Event()

    def watch() -> None:
        while not done.wait(0.2):
            value = con.query_progress()
            if value >= 0:
                on_progress(value)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        con.execute(sql)
    finally:
        done.set()
        watcher.join()
    on_progress(100.0)


def _insert_requests(
    con: duckdb.DuckDBPyConnection, import_id: int, source: str, fields: list[str], derive: bool
) -> None:
    """The accepted rows, in one INSERT; `fields` are the staged ones, the others stay NULL.

    request_id stays NULL where the log gives none. With `derive`, rows that log arrival and
    finish but no concurrency get the in-flight count at their arrival (advisor.concurrency's
    sweep over this import's rows), computed here rather than by an UPDATE afterwards.
    """
    names = [f for f in FIELDS if f in fields and f != "concurrency"]
    logged = "s.concurrency" if "concurrency" in fields else "NULL"
    concurrency = logged
    source_of = f"CASE WHEN {logged} IS NOT NULL THEN 'log' END"
    join = ""
    if derive:
        timed = (
            "SELECT rowid AS k, arrival_ts, finish_ts FROM staged WHERE reject_reason IS NULL"
            " AND arrival_ts IS NOT NULL AND finish_ts IS NOT NULL"
        )
        join = f" LEFT JOIN ({overlap_counts_sql(timed, 'finish_ts', 'k')}) d ON d.k = s.rowid"
        concurrency = f"coalesce({logged}, d.c)"
        source_of = (
            f"CASE WHEN {logged} IS NOT NULL THEN 'log' WHEN d.c IS NOT NULL THEN 'derived' END"
        )
    targets = ", ".join(["source", "import_id", "line", *names, "concurrency"])
    values = ", ".join([sql_str(source), str(import_id), "s.line", *(f"s.{n}" for n in names)])
    con.execute(
        f"INSERT INTO requests ({targets}, concurrency_source)"
        f" SELECT {values}, {concurrency}, {source_of}"
        f" FROM staged s{join} WHERE s.reject_reason IS NULL"
    )


def _insert_rejects(con: duckdb.DuckDBPyConnection, import_id: int, file: str, csv_reader: bool):
    con.execute(
        "INSERT INTO rejects SELECT ?, ?, line, reject_reason, left(raw, 500)"
        " FROM staged WHERE reject_reason IS NOT NULL ORDER BY line",
        [import_id, file],
    )
    if csv_reader:
        con.execute(
            "INSERT INTO rejects SELECT ?, ?, line,"
            " 'row is not valid CSV: ' || string_agg(DISTINCT error_message, '; '),"
            f" left(any_value(csv_line), 500) FROM temp.{_CSV_REJECTS} GROUP BY line ORDER BY line",
            [import_id, file],
        )


def _csv_reject_count(con: duckdb.DuckDBPyConnection) -> int:
    return scalar(con, f"SELECT count(DISTINCT line) FROM temp.{_CSV_REJECTS}")


def _fix_csv_lines(con: duckdb.DuckDBPyConnection) -> None:
    """Shift good rows' line numbers past the malformed CSV lines DuckDB skipped.

    Good row k (line k+1 before the fix) lies after the i-th bad line r_i (0-based i) exactly
    when k > r_i - 2 - i, the number of good rows before that bad line.
    """
    if not _csv_reject_count(con):
        return
    con.execute(
        "UPDATE staged SET line = line + (SELECT count(*) FROM ("
        "  SELECT line - 2 - (row_number() OVER (ORDER BY line) - 1) AS good_before"
        f"  FROM (SELECT DISTINCT line FROM temp.{_CSV_REJECTS})) b"
        " WHERE b.good_before < staged.line - 1)"
    )
