"""Imports that are killed, interrupted or blocked leave the database as it was; compressed input
and quiet output when nobody is watching.

The kill and Ctrl-C tests run the real CLI on a 3M-row CSV and strike once the process has read
1.8 times the file's size: its checksum pass reads it once, so DuckDB has read a good part of it,
inside the import's transaction. A process that finished first fails the test (it must die
by the signal), so these tests cannot pass by accident.
"""

from __future__ import annotations

import gzip
import json
import os
import pty
import signal
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import pytest
import zstandard

from advisor.store import connect
from collectors.ingest import ingest_file
from tests.conftest import ROOT, run_cli

DATA = Path(__file__).parent / "data"
MOONCAKE = DATA / "mooncake" / "conversation_trace_sample.jsonl"
SHAREGPT = DATA / "sharegpt" / "sharegpt_sample.json"
BURSTGPT = DATA / "burstgpt" / "BurstGPT_sample.csv"


def azure_csv(path: Path, rows: int) -> Path:
    """An Azure-trace-shaped CSV of `rows` requests, written by DuckDB in about a second."""
    duckdb.sql(
        "COPY (SELECT strftime(TIMESTAMP '2023-11-16 18:00:00' + to_microseconds(i * 1000),"
        " '%Y-%m-%d %H:%M:%S.%f') || '0' AS \"TIMESTAMP\", 100 + i % 4000 AS \"ContextTokens\","
        f" 1 + i % 500 AS \"GeneratedTokens\" FROM range({rows}) t(i)) TO '{path}' (HEADER)"
    )
    return path


@pytest.fixture(scope="module")
def big_csv(tmp_path_factory) -> Path:
    return azure_csv(tmp_path_factory.mktemp("big") / "big.csv", 3_000_000)


def counts(db: Path) -> tuple[int, int, int]:
    con = connect(db)
    try:
        return tuple(
            con.execute(f"SELECT count(*) FROM {t}").fetchall()[0][0]
            for t in ("requests", "imports", "rejects")
        )
    finally:
        con.close()


def bytes_read(pid: int) -> int:
    with open(f"/proc/{pid}/io") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("rchar"))


def strike_mid_import(db: Path, csv: Path, sig: signal.Signals) -> subprocess.CompletedProcess:
    """Start an import of `csv` and send `sig` once DuckDB is reading it inside the transaction."""
    env = dict(os.environ)
    env.pop("ADVISOR_DB", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "cli", "ingest", str(csv), "--db", str(db)],
        cwd=ROOT, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    threshold = int(csv.stat().st_size * 1.8)
    deadline = time.monotonic() + 240
    while proc.poll() is None and time.monotonic() < deadline:
        if bytes_read(proc.pid) > threshold:
            proc.send_signal(sig)
            break
        time.sleep(0.01)
    out, err = proc.communicate(timeout=240)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


@pytest.mark.skipif(not Path("/proc/self/io").exists(), reason="needs Linux /proc/PID/io")
def test_kill_9_mid_import_leaves_no_trace(db_path, big_csv):
    result = strike_mid_import(db_path, big_csv, signal.SIGKILL)
    assert result.returncode == -signal.SIGKILL, (result.stdout, result.stderr)
    assert counts(db_path) == (0, 0, 0)
    again = run_cli("ingest", str(BURSTGPT), db=db_path)
    assert again.returncode == 0, again.stderr
    assert counts(db_path) == (32, 1, 8)


@pytest.mark.skipif(not Path("/proc/self/io").exists(), reason="needs Linux /proc/PID/io")
def test_ctrl_c_mid_import_says_one_sentence_and_leaves_no_rows(db_path, big_csv):
    result = strike_mid_import(db_path, big_csv, signal.SIGINT)
    assert result.returncode == 130, (result.stdout, result.stderr)
    assert result.stderr.strip() == "interrupted: nothing was half-written."
    assert result.stdout == ""
    assert counts(db_path) == (0, 0, 0)
    assert run_cli("ingest", str(BURSTGPT), db=db_path).returncode == 0
    assert counts(db_path) == (32, 1, 8)


def test_second_writer_gets_database_is_busy(db_path):
    code = (
        "import sys; from advisor.store import connect; from collectors.ingest import ingest_file;"
        f" con = connect({str(db_path)!r}); ingest_file(con, {str(MOONCAKE)!r});"
        " print('ready', flush=True); sys.stdin.read(); con.close()"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", code], cwd=ROOT, text=True, stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "ready"
        blocked = run_cli("ingest", str(BURSTGPT), db=db_path)
        assert blocked.returncode == 1
        message = blocked.stderr.strip()
        assert "is busy" in message and str(db_path) in message
        assert "\n" not in message and "Traceback" not in message
    finally:
        holder.stdin.close()
        holder.wait(timeout=60)
    assert holder.returncode == 0
    assert counts(db_path) == (36, 1, 4)  # the holder's import, intact
    assert run_cli("ingest", str(BURSTGPT), db=db_path).returncode == 0
    assert counts(db_path) == (68, 2, 12)


@pytest.mark.parametrize("suffix", [".gz", ".zst"])
@pytest.mark.parametrize(("source", "accepted", "rejected"), [(MOONCAKE, 36, 4), (SHAREGPT, 25, 3)])
def test_compressed_json_is_read_directly(con, tmp_path, suffix, source, accepted, rejected):
    data = source.read_bytes()
    packed = tmp_path / (source.name + suffix)
    if suffix == ".gz":
        packed.write_bytes(gzip.compress(data))
    else:
        packed.write_bytes(zstandard.ZstdCompressor().compress(data))
    summary = ingest_file(con, packed)
    assert (summary.rows_accepted, summary.rows_rejected) == (accepted, rejected)


def test_progress_is_quiet_without_a_terminal_and_shown_on_one(tmp_path):
    csv = azure_csv(tmp_path / "mid.csv", 600_000)
    piped = run_cli("ingest", str(csv), db=tmp_path / "piped.duckdb")
    assert piped.returncode == 0
    assert piped.stderr == ""
    assert piped.stdout.strip() == f"{csv} (azure): 600000 imported, 0 rejected (import 1)."

    primary, secondary = pty.openpty()
    env = {**os.environ, "TERM": "xterm-256color", "COLUMNS": "120"}
    env.pop("ADVISOR_DB", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "cli", "ingest", str(csv), "--db", str(tmp_path / "tty.duckdb")],
        cwd=ROOT, env=env, stdin=secondary, stdout=secondary, stderr=secondary,
    )  # fmt: skip
    os.close(secondary)
    shown = b""
    while True:
        try:
            chunk = os.read(primary, 65536)
        except OSError:  # the terminal closed with the process
            break
        if not chunk:
            break
        shown += chunk
    os.close(primary)
    assert proc.wait(timeout=120) == 0
    assert b"importing mid.csv" in shown


def test_duckdb_memory_is_capped_during_an_import_and_restored(con):
    setting = "SELECT current_setting('memory_limit')"
    default = con.execute(setting).fetchall()[0][0]
    during = []

    def progress(pct: float) -> None:
        if pct == 100.0:  # called in the importing thread, inside the import's transaction
            during.append(con.execute(setting).fetchall()[0][0])

    ingest_file(con, BURSTGPT, on_progress=progress)
    assert during == ["953.6 MiB"]  # IMPORT_MEMORY_LIMIT, 1 GB, as DuckDB shows it
    assert con.execute(setting).fetchall()[0][0] == default
    con.execute("SET memory_limit = '3GB'")
    mine = con.execute(setting).fetchall()[0][0]
    ingest_file(con, MOONCAKE, on_progress=progress)
    assert during[-1] == mine and con.execute(setting).fetchall()[0][0] == mine


def test_json_line_longer_than_duckdbs_default_limit(con, tmp_path):
    """A logged prompt with a long document makes a line of several MB (DuckDB's default: 2 MB)."""
    lines = [MOONCAKE.read_text().splitlines()[0]]
    long = json.loads(lines[0]) | {"prompt": "lorem ipsum " * 300_000}  # 3.6 MB
    lines += [json.dumps(long), lines[0]]
    path = tmp_path / "long.jsonl"
    path.write_text("\n".join(lines) + "\n")
    summary = ingest_file(con, path)
    assert (summary.format, summary.rows_accepted, summary.rows_rejected) == ("mooncake", 3, 0)
