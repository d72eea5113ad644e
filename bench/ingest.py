"""Ingest speed and memory against DuckDB's own raw read of the same file, side by side.

    python bench/ingest.py [--rows 2000000] [--dir /tmp/spec-advisor-bench] [--repeat 1]

Generates a gateway-style OpenAI chat-completions JSONL log (the shape collectors/openai_logs.py
reads: request body, response with usage, start/end times, metadata.task) and an Azure-trace CSV,
each with `--rows` requests. For each file it runs, each in a fresh subprocess:

- project: `collectors.ingest.ingest_file` into a new DuckDB file (detection, checksum, typing,
  validation, rejects, concurrency derivation, one transaction);
- raw: `CREATE TABLE t AS SELECT * FROM read_json_auto(...)` / `read_csv_auto(...)` into a new
  DuckDB file.

Reported: seconds of the work itself (interpreter start-up excluded, the same for both), the
ratio project / raw, and each subprocess's peak RSS (os.wait4's ru_maxrss). Target (issue 2):
ratio <= 2 and project peak RSS < 1.5 GB. This is a benchmark, not a test: nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import duckdb

ROOT = Path(__file__).resolve().parent.parent

# One request per row; lengths and settings vary with i so that no column is constant.
OPENAI_SQL = """
COPY (
  SELECT
    'req-' || i AS request_id,
    strftime(TIMESTAMP '2024-05-01 00:00:00' + to_microseconds(i * 40000),
             '%Y-%m-%dT%H:%M:%S.%fZ') AS start_time,
    strftime(TIMESTAMP '2024-05-01 00:00:00'
             + to_microseconds(i * 40000 + 300000 + (i % 97) * 9000),
             '%Y-%m-%dT%H:%M:%S.%fZ') AS end_time,
    40.0 + (i % 53) AS ttft_ms,
    {'model': 'meta-llama/Llama-3.1-8B-Instruct',
     'messages': [{'role': 'system', 'content': 'You are a careful assistant.'},
                  {'role': 'user',
                   'content': 'Request ' || i || ': ' || repeat('please help. ', 1 + i % 9)}],
     'temperature': [0.0, 0.2, 0.7, 1.0][1 + i % 4], 'top_p': 0.95,
     'max_tokens': 1024, 'stream': false} AS request,
    {'id': 'chatcmpl-' || i, 'object': 'chat.completion', 'created': 1714521600 + i // 25,
     'model': 'meta-llama/Llama-3.1-8B-Instruct',
     'choices': [{'index': 0,
                  'message': {'role': 'assistant',
                              'content': 'Answer ' || i || '. ' || repeat('ok ', 1 + i % 13)},
                  'finish_reason': 'stop'}],
     'usage': {'prompt_tokens': 20 + (i * 7919) % 3000, 'completion_tokens': 1 + (i * 104729) % 700,
               'total_tokens': 21 + (i * 7919) % 3000 + (i * 104729) % 700}} AS response,
    {'task': ['chat', 'code', 'summarize', 'qa', 'extract'][1 + i % 5],
     'tenant': 'team-' || (i % 7)} AS metadata
  FROM range({rows}) t(i)
) TO '{path}' (FORMAT json)
"""

AZURE_SQL = """
COPY (
  SELECT strftime(TIMESTAMP '2023-11-16 18:00:00' + to_microseconds(i * 1000),
                  '%Y-%m-%d %H:%M:%S.%f') || '0' AS "TIMESTAMP",
         20 + (i * 7919) % 8000 AS "ContextTokens", 1 + (i * 104729) % 700 AS "GeneratedTokens"
  FROM range({rows}) t(i)
) TO '{path}' (HEADER)
"""

PROJECT = """
import json, sys, time
from advisor.store import connect
from collectors.ingest import ingest_file
con = connect(sys.argv[1])
start = time.perf_counter()
summary = ingest_file(con, sys.argv[2])
seconds = time.perf_counter() - start
con.close()
print(json.dumps({"seconds": seconds, "rows": summary.rows_accepted,
                  "rejected": summary.rows_rejected, "format": summary.format}))
"""

RAW = """
import json, sys, time
import duckdb
con = duckdb.connect(sys.argv[1])
start = time.perf_counter()
con.execute(f"CREATE TABLE t AS SELECT * FROM {sys.argv[3]}('{sys.argv[2]}')")
rows = con.execute("SELECT count(*) FROM t").fetchall()[0][0]
seconds = time.perf_counter() - start
con.close()
print(json.dumps({"seconds": seconds, "rows": rows}))
"""


def generate(folder: Path, rows: int) -> dict[str, Path]:
    folder.mkdir(parents=True, exist_ok=True)
    files = {"openai": folder / f"openai_{rows}.jsonl", "azure": folder / f"azure_{rows}.csv"}
    for name, sql in (("openai", OPENAI_SQL), ("azure", AZURE_SQL)):
        if not files[name].exists():
            duckdb.sql(sql.replace("{rows}", str(rows)).replace("{path}", str(files[name])))
    return files


def measure(script: str, *args: str) -> dict:
    """Run `script` in a fresh interpreter; its JSON line plus the child's peak RSS in MB."""
    proc = subprocess.Popen(
        [sys.executable, "-c", script, *args], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    _, status, usage = os.wait4(proc.pid, 0)
    out = proc.stdout.read()
    proc.stdout.close()
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"benchmark step failed: {script.splitlines()[1]} {args}")
    result = json.loads(out.strip().splitlines()[-1])
    result["peak_rss_mb"] = usage.ru_maxrss / 1024  # Linux reports KiB
    return result


def fresh(path: Path) -> str:
    for suffix in ("", ".wal"):
        Path(str(path) + suffix).unlink(missing_ok=True)
    return str(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--dir", type=Path, default=Path("/tmp/spec-advisor-bench"))
    parser.add_argument("--repeat", type=int, default=1, help="runs per side; best time kept")
    args = parser.parse_args()

    started = time.perf_counter()
    files = generate(args.dir, args.rows)
    sizes = ", ".join(f"{p.name} {p.stat().st_size / 1e6:.0f} MB" for p in files.values())
    print(f"files ready in {time.perf_counter() - started:.1f} s: {sizes}")
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
          f"Python {platform.python_version()}, DuckDB {duckdb.__version__}")  # fmt: skip
    print()
    print(f"{'file':8} {'project s':>10} {'raw s':>8} {'ratio':>6} {'project RSS MB':>15}"
          f" {'raw RSS MB':>11}  rows imported / read")  # fmt: skip
    readers = {"openai": "read_json_auto", "azure": "read_csv_auto"}
    for name, path in files.items():
        project = [
            measure(PROJECT, fresh(args.dir / "project.duckdb"), str(path))
            for _ in range(args.repeat)
        ]
        raw = [
            measure(RAW, fresh(args.dir / "raw.duckdb"), str(path), readers[name])
            for _ in range(args.repeat)
        ]
        p = min(project, key=lambda r: r["seconds"])
        r = min(raw, key=lambda r: r["seconds"])
        print(
            f"{name:8} {p['seconds']:10.2f} {r['seconds']:8.2f} {p['seconds'] / r['seconds']:6.2f}"
            f" {max(x['peak_rss_mb'] for x in project):15.0f}"
            f" {max(x['peak_rss_mb'] for x in raw):11.0f}  {p['rows']} / {r['rows']}"
        )
    for leftover in ("project.duckdb", "raw.duckdb"):
        fresh(args.dir / leftover)


if __name__ == "__main__":
    main()
