"""Generic CSV / JSONL / Parquet exports through --map and --map-file, via the real CLI."""

from __future__ import annotations

import json
from datetime import datetime

import duckdb

from advisor.store import connect
from tests.conftest import run_cli
from tests.test_ingest_azure import table_digest

CSV = (
    "when,model_name,input_len,output_len,temp,team\n"
    "2024-06-01T10:00:00Z,llama-3.1-8b,812,95,0.2,search\n"
    "2024-06-01T10:00:01.5Z,llama-3.1-8b,90,12,0.7,ads\n"
    "2024-06-01T10:00:02Z,llama-3.1-8b,ninety,12,0.7,ads\n"
    "2024-06-01T10:00:03Z,llama-3.1-8b,44,7,hot,ads\n"
)
CSV_MAP = [
    "--map", "arrival_ts=when", "--map", "model=model_name", "--map", "prompt_tokens=input_len",
    "--map", "output_tokens=output_len", "--map", "temperature=temp", "--map", "tenant=team",
]  # fmt: skip


def stored(db_path) -> list[tuple]:
    con = connect(db_path)
    rows = con.execute(
        "SELECT line, arrival_ts, prompt_tokens, output_tokens, temperature, model, tenant, task"
        " FROM requests ORDER BY line"
    ).fetchall()
    con.close()
    return rows


def test_csv_with_map_flags(db_path, tmp_path):
    path = tmp_path / "export.csv"
    path.write_text(CSV)
    result = run_cli("ingest", str(path), *CSV_MAP, db=db_path)
    assert result.returncode == 0, result.stderr
    assert "(generic): 2 imported, 2 rejected" in result.stdout
    assert stored(db_path) == [
        (2, datetime(2024, 6, 1, 10), 812, 95, 0.2, "llama-3.1-8b", "search", None),
        (3, datetime(2024, 6, 1, 10, 0, 1, 500000), 90, 12, 0.7, "llama-3.1-8b", "ads", None),
    ]
    rejects = run_cli("rejects", db=db_path).stdout
    assert "prompt_tokens 'ninety' is not a number" in rejects
    assert "temperature 'hot' is not a number" in rejects


def test_jsonl_with_dotted_paths_from_a_mapping_file(db_path, tmp_path):
    lines = [
        {"ts": 1717236000.25, "usage": {"in": 10, "out": 5}, "meta": {"task": "qa"},
         "choices": [{"text": "Paris."}]},
        {"ts": 1717236001, "usage": {"in": 11, "out": 0}, "meta": {"task": "code"},
         "choices": [{"text": ""}]},
        {"ts": 1717236002, "usage": {"in": 12, "out": 6}, "meta": {"task": "code"},
         "choices": [{"text": "    return x\n"}]},
    ]  # fmt: skip
    path = tmp_path / "calls.jsonl"
    path.write_text("\n".join(json.dumps(x) for x in lines) + '\n{"ts": 17172\n')
    mapping = tmp_path / "map.json"
    fields = {
        "prompt_tokens": "usage.in",
        "output_tokens": "usage.out",
        "arrival_ts": "ts",
        "task": "meta.task",
        "output_text": "choices.0.text",
    }
    mapping.write_text(json.dumps(fields))
    result = run_cli("ingest", str(path), "--map-file", str(mapping), "--store-text", db=db_path)
    assert result.returncode == 0, result.stderr
    assert "3 imported, 1 rejected" in result.stdout
    rows = stored(db_path)
    assert rows[0][:4] == (1, datetime(2024, 6, 1, 10, 0, 0, 250000), 10, 5)
    assert [r[7] for r in rows] == ["qa", "code", "code"]
    con = connect(db_path)
    # code output keeps its indentation and newline: it is replayed as logged
    assert con.execute("SELECT output_text FROM requests ORDER BY line").fetchall() == [
        ("Paris.",),
        (None,),
        ("    return x\n",),
    ]
    con.close()


def test_toml_mapping_file_and_flags_override_it(db_path, tmp_path):
    path = tmp_path / "export.csv"
    path.write_text(CSV)
    mapping = tmp_path / "map.toml"
    mapping.write_text('prompt_tokens = "nope"\noutput_tokens = "output_len"\n')
    result = run_cli(
        "ingest", str(path), "--map-file", str(mapping), "--map", "prompt_tokens=input_len",
        db=db_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert [r[2] for r in stored(db_path)] == [812, 90, 44]


def test_parquet_written_by_duckdb(db_path, tmp_path):
    csv = tmp_path / "export.csv"
    csv.write_text(CSV)
    parquet = tmp_path / "export.parquet"
    duckdb.sql(
        f'COPY (SELECT * REPLACE (CAST("when" AS TIMESTAMP) AS "when")'
        f" FROM read_csv('{csv}') WHERE input_len <> 'ninety') TO '{parquet}' (FORMAT parquet)"
    )
    result = run_cli("ingest", str(parquet), *CSV_MAP, db=db_path)
    assert result.returncode == 0, result.stderr
    assert "(generic): 2 imported, 1 rejected" in result.stdout
    assert [r[:4] for r in stored(db_path)] == [
        (1, datetime(2024, 6, 1, 10), 812, 95),
        (2, datetime(2024, 6, 1, 10, 0, 1, 500000), 90, 12),
    ]


def test_mapping_to_a_missing_column_exits_2_listing_the_columns(db_path, tmp_path):
    path = tmp_path / "export.csv"
    path.write_text(CSV)
    assert run_cli("ingest", str(path), *CSV_MAP, db=db_path).returncode == 0
    con = connect(db_path)
    before = table_digest(con)
    con.close()
    other = tmp_path / "other.csv"
    other.write_text(CSV.replace("input_len", "prompt_len"))
    result = run_cli("ingest", str(other), *CSV_MAP, db=db_path)
    assert result.returncode == 2
    assert "has no column 'input_len'" in result.stderr
    assert "when, model_name, prompt_len, output_len, temp, team" in result.stderr
    assert "Traceback" not in result.stderr
    jsonl = tmp_path / "calls.jsonl"
    jsonl.write_text('{"usage": {"in": 1, "out": 2}}\n')
    result = run_cli("ingest", str(jsonl), "--map", "prompt_tokens=usage.input", db=db_path)
    assert result.returncode == 2
    assert "no column 'usage.input'" in result.stderr and "usage.in, usage.out" in result.stderr
    con = connect(db_path)
    assert table_digest(con) == before
    con.close()


def test_generic_needs_prompt_tokens_and_is_never_detected(db_path, tmp_path):
    path = tmp_path / "export.csv"
    path.write_text(CSV)
    result = run_cli("ingest", str(path), db=db_path)
    assert result.returncode == 2 and "--map" in result.stderr
    result = run_cli("ingest", str(path), "--format", "generic", db=db_path)
    assert result.returncode == 2 and "prompt_tokens" in result.stderr
    result = run_cli("ingest", str(path), "--map", "latency=when", db=db_path)
    assert result.returncode == 2 and "unknown field" in result.stderr
