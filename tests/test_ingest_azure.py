"""Ingest on the real Azure 2023 traces, re-import, rejects, and files that are not logs."""

from __future__ import annotations

import gzip
import hashlib

import pytest
import zstandard

from collectors.ingest import ingest_file
from tests.conftest import AZURE_2023, run_cli

CODE = AZURE_2023 / "code.csv"
CONV = AZURE_2023 / "conv.csv"


def table_digest(con) -> str:
    """A fingerprint of everything stored, to prove a failed import changed nothing."""
    parts = []
    for table in ("imports", "requests", "rejects"):
        rows = con.execute(f"SELECT * FROM {table} ORDER BY ALL").fetchall()
        parts.append(repr(rows))
    return hashlib.sha256("".join(parts).encode()).hexdigest()


@pytest.mark.parametrize(("path", "rows"), [(CODE, 8819), (CONV, 19366)])
def test_azure_traces_import_with_exact_row_counts(con, path, rows):
    summary = ingest_file(con, path)
    assert summary.format == "azure"
    assert (summary.rows_read, summary.rows_accepted, summary.rows_rejected) == (rows, rows, 0)
    assert con.execute("SELECT count(*) FROM requests").fetchall()[0][0] == rows
    first = con.execute(
        "SELECT prompt_tokens, output_tokens, arrival_ts FROM requests ORDER BY line LIMIT 1"
    ).fetchall()[0]
    expected = {CODE: (4808, 10), CONV: (374, 44)}[path]
    assert first[:2] == expected
    assert first[2].year == 2023


def test_reimport_is_a_noop(con):
    first = ingest_file(con, CODE)
    again = ingest_file(con, CODE)
    assert again.already_imported and again.import_id == first.import_id
    assert con.execute("SELECT count(*) FROM requests").fetchall()[0][0] == 8819
    assert con.execute("SELECT count(*) FROM imports").fetchall()[0][0] == 1


def test_bad_rows_are_rejected_with_line_and_reason(con, tmp_path):
    log = tmp_path / "trace.csv"
    log.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:17:03.9799600,10,5\n"
        "2023-11-16 18:17:04,ten,5\n"
        "yesterday,1,2\n"
        "2023-11-16 18:17:05,1,2,3\n"
        "2023-11-16 18:17:06,-1,2\n"
        "2023-11-16 18:17:07,5,\n"
        "2023-11-16 18:17:08,99999999999,7\n"
        "2023-11-16 18:17:09,5,7\n"
    )
    summary = ingest_file(con, log)
    assert (summary.rows_accepted, summary.rows_rejected) == (2, 6)
    rejects = dict(con.execute("SELECT line, reason FROM rejects").fetchall())
    assert set(rejects) == {3, 4, 5, 6, 7, 8}
    assert "prompt_tokens 'ten' is not a number" in rejects[3]
    assert "arrival_ts 'yesterday' is not a timestamp" in rejects[4]
    assert "not valid CSV" in rejects[5]
    assert "prompt_tokens -1" in rejects[6]
    assert "output_tokens is missing" in rejects[7]
    assert "plausible maximum" in rejects[8]
    lines = [r[0] for r in con.execute("SELECT line FROM requests ORDER BY line").fetchall()]
    assert lines == [2, 9]


@pytest.mark.parametrize("suffix", [".gz", ".zst"])
def test_compressed_files_import_directly(con, tmp_path, suffix):
    data = CODE.read_bytes()
    packed = tmp_path / f"code.csv{suffix}"
    if suffix == ".gz":
        packed.write_bytes(gzip.compress(data))
    else:
        packed.write_bytes(zstandard.ZstdCompressor().compress(data))
    summary = ingest_file(con, packed)
    assert summary.rows_accepted == 8819


def test_bom_is_accepted(con, tmp_path):
    log = tmp_path / "bom.csv"
    log.write_bytes(b"\xef\xbb\xbf" + CODE.read_bytes()[:2000].rsplit(b"\n", 1)[0] + b"\n")
    summary = ingest_file(con, log)
    assert summary.format == "azure" and summary.rows_rejected == 0


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "is empty"),
        (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" * 50, "is binary"),
        (b"just some notes\nnothing like a log\n", "Could not tell the log format"),
        (b"TIMESTAMP,ContextTokens,GeneratedTokens\n", "holds no requests"),
        ("TIMESTAMP,Café,GeneratedTokens\n1,2,3\n".encode("latin-1"), "not UTF-8"),
    ],
    ids=["empty", "binary", "prose", "header-only", "latin-1"],
)
def test_unusable_files_exit_2_and_change_nothing(db_path, tmp_path, content, message):
    ok = run_cli("ingest", str(CODE), db=db_path)
    assert ok.returncode == 0, ok.stderr
    from advisor.store import connect

    con = connect(db_path)
    before = table_digest(con)
    con.close()
    bad = tmp_path / "bad.log"
    bad.write_bytes(content)
    result = run_cli("ingest", str(bad), db=db_path)
    assert result.returncode == 2
    assert message in result.stderr and "bad.log" in result.stderr
    assert "Traceback" not in result.stderr
    con = connect(db_path)
    assert table_digest(con) == before


def test_missing_file_exits_2(db_path):
    result = run_cli("ingest", "/nonexistent/trace.csv", db=db_path)
    assert result.returncode == 2 and "no such file" in result.stderr


def test_cli_ingest_imports_and_rejects(db_path, tmp_path):
    result = run_cli("ingest", str(CODE), db=db_path)
    assert result.returncode == 0, result.stderr
    assert "8819 imported, 0 rejected" in result.stdout
    again = run_cli("ingest", str(CODE), db=db_path)
    assert "already imported" in again.stdout
    listing = run_cli("imports", db=db_path)
    assert "azure" in listing.stdout and "8819" in listing.stdout
    bad = tmp_path / "t.csv"
    bad.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:00:00,7,x\n")
    run_cli("ingest", str(bad), db=db_path)
    rejects = run_cli("rejects", "2", db=db_path)
    assert "output_tokens 'x' is not a number" in rejects.stdout


def test_list_formats_names_every_collector():
    from collectors.registry import COLLECTORS

    result = run_cli("ingest", "--list-formats")
    assert result.returncode == 0
    for c in COLLECTORS:
        assert c.name in result.stdout


def test_unknown_format_lists_valid_ones(db_path):
    result = run_cli("ingest", str(CODE), "--format", "nope", db=db_path)
    assert result.returncode == 2 and "valid formats" in result.stderr and "azure" in result.stderr
