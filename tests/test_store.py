"""The store: migrations, the default path, busy and broken files."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import duckdb
import pytest

from advisor.errors import BadInput, DatabaseBusy
from advisor.store import connect, default_db_path, migrations, schema_version


def test_new_database_gets_every_migration(db_path):
    con = connect(db_path)
    assert schema_version(con) == migrations()[-1][0]
    tables = {
        r[0] for r in con.execute("SELECT table_name FROM information_schema.tables").fetchall()
    }
    assert {"requests", "imports", "rejects", "schema_version"} <= tables


def test_reopening_does_not_rerun_migrations(db_path):
    connect(db_path).close()
    con = connect(db_path)
    rows = con.execute("SELECT version FROM schema_version ORDER BY version").fetchall()
    assert [r[0] for r in rows] == [m[0] for m in migrations()]


def test_old_database_is_upgraded_in_place(db_path):
    """A file made by migration 1 alone keeps its rows and gains the later migrations."""
    first = migrations()[0]
    raw = duckdb.connect(str(db_path))
    raw.execute(
        "CREATE TABLE schema_version (version INTEGER PRIMARY KEY, name VARCHAR NOT NULL,"
        " applied_at TIMESTAMP NOT NULL DEFAULT current_timestamp)"
    )
    raw.execute(first[2])
    raw.execute("INSERT INTO schema_version (version, name) VALUES (?, ?)", [first[0], first[1]])
    raw.execute("INSERT INTO rejects VALUES (7, 'old.csv', 3, 'kept across the upgrade', NULL)")
    raw.close()
    con = connect(db_path)
    assert schema_version(con) == migrations()[-1][0]
    assert con.execute("SELECT reason FROM rejects").fetchall() == [("kept across the upgrade",)]


def test_default_path_follows_environment(monkeypatch, tmp_path):
    monkeypatch.delenv("ADVISOR_DB", raising=False)
    assert default_db_path().name == "advisor.duckdb"
    monkeypatch.setenv("ADVISOR_DB", str(tmp_path / "x.duckdb"))
    assert default_db_path() == tmp_path / "x.duckdb"


def test_not_a_database_is_bad_input(tmp_path):
    bogus = tmp_path / "notes.duckdb"
    bogus.write_text("these are not the bytes of a database\n" * 100)
    with pytest.raises(BadInput, match=r"notes\.duckdb"):
        connect(bogus)


def test_second_process_gets_busy(db_path):
    """While another process holds the file, connect says 'busy' instead of failing oddly."""
    connect(db_path).close()
    holder = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(f"""
            import sys, time, duckdb
            con = duckdb.connect({str(db_path)!r})
            print("holding", flush=True)
            time.sleep(60)
        """)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "holding"
        with pytest.raises(DatabaseBusy, match="busy"):
            connect(db_path)
    finally:
        holder.kill()
        holder.wait()
