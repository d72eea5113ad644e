"""The embedded DuckDB store: opening it, migrating it, and telling a busy file from a broken one.

Schema changes are numbered SQL files in advisor/migrations/; `schema_version` records which ones
ran, so an older database file is upgraded in place and never rebuilt.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from importlib import resources
from pathlib import Path

import duckdb

from advisor.errors import BadInput, DatabaseBusy

DEFAULT_DB = "advisor.duckdb"
_MIGRATION_NAME = re.compile(r"^(\d{4})_[a-z0-9_]+\.sql$")


def default_db_path() -> Path:
    """`ADVISOR_DB` when set, else ./advisor.duckdb."""
    return Path(os.environ.get("ADVISOR_DB") or DEFAULT_DB)


def migrations() -> list[tuple[int, str, str]]:
    """(number, name, sql) of every shipped migration, in order."""
    found = []
    for entry in resources.files("advisor.migrations").iterdir():
        match = _MIGRATION_NAME.match(entry.name)
        if match:
            found.append((int(match.group(1)), entry.name, entry.read_text(encoding="utf-8")))
    return sorted(found)


def connect(
    path: str | Path | None = None, *, read_only: bool = False
) -> duckdb.DuckDBPyConnection:
    """Open (creating and migrating as needed) the database at `path`.

    Raises DatabaseBusy when another process holds the file, BadInput when it is not a database.
    """
    db = Path(path) if path is not None else default_db_path()
    if read_only and not db.exists():
        raise BadInput(f"Database {db} does not exist; run `advisor ingest` first or pass --db.")
    if db.parent and not db.parent.exists():
        raise BadInput(f"Cannot create database {db}: folder {db.parent} does not exist.")
    try:
        con = duckdb.connect(str(db), read_only=read_only)
    except duckdb.IOException as exc:
        text = str(exc)
        if "lock" in text.lower():
            holder = re.search(r"PID (\d+)", text)
            who = f" (process {holder.group(1)})" if holder else ""
            raise DatabaseBusy(
                f"Database {db} is busy: another process{who} is using it; "
                "try again when it has finished."
            ) from None
        raise BadInput(f"Cannot open database {db}: {text.splitlines()[0]}") from None
    except duckdb.Error as exc:
        raise BadInput(
            f"{db} is not a spec-advisor database ({str(exc).splitlines()[0]})."
        ) from None
    con.execute("SET TimeZone = 'UTC'")
    if not read_only:
        migrate(con)
    return con


def schema_version(con: duckdb.DuckDBPyConnection) -> int:
    """The number of the newest migration applied, 0 for an empty database."""
    exists = scalar(
        con, "SELECT count(*) FROM information_schema.tables WHERE table_name = 'schema_version'"
    )
    if not exists:
        return 0
    return int(scalar(con, "SELECT max(version) FROM schema_version") or 0)


def migrate(con: duckdb.DuckDBPyConnection) -> int:
    """Apply every migration newer than the database, each in its own transaction."""
    con.execute(
        "CREATE TABLE IF NOT EXISTS schema_version ("
        " version INTEGER PRIMARY KEY, name VARCHAR NOT NULL,"
        " applied_at TIMESTAMP NOT NULL DEFAULT current_timestamp)"
    )
    current = schema_version(con)
    for number, name, sql in migrations():
        if number <= current:
            continue
        with transaction(con):
            con.execute(sql)
            con.execute("INSERT INTO schema_version (version, name) VALUES (?, ?)", [number, name])
        current = number
    return current


@contextmanager
def transaction(con: duckdb.DuckDBPyConnection) -> Iterator[duckdb.DuckDBPyConnection]:
    """BEGIN ... COMMIT, rolling back on any exception (KeyboardInterrupt included)."""
    con.execute("BEGIN TRANSACTION")
    try:
        yield con
    except BaseException:
        con.execute("ROLLBACK")
        raise
    con.execute("COMMIT")


def one(con: duckdb.DuckDBPyConnection, sql: str, params: object = None) -> tuple | None:
    """The first row of `sql`, or None. Fetches everything: DuckDB 2 refuses new work on a
    connection while a result is only partly fetched."""
    rows = con.execute(sql, params).fetchall()
    return rows[0] if rows else None


def scalar(con: duckdb.DuckDBPyConnection, sql: str, params: object = None):
    """The first column of the first row of `sql` (None when there is no row)."""
    row = one(con, sql, params)
    return row[0] if row else None
