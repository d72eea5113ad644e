"""Public traces: BurstGPT, Mooncake, ShareGPT, Spec-Bench and the Azure 2024 release.

The sample files under tests/data/ were written by the project in each release's exact format
(headers, key names, timestamp style), with bad rows mixed in.
"""

from __future__ import annotations

import json
import math
from datetime import datetime
from pathlib import Path

import pytest

from collectors.ingest import ingest_file

DATA = Path(__file__).parent / "data"
BURSTGPT = DATA / "burstgpt" / "BurstGPT_sample.csv"
MOONCAKE = DATA / "mooncake" / "conversation_trace_sample.jsonl"
SHAREGPT = DATA / "sharegpt" / "sharegpt_sample.json"
SPECBENCH = DATA / "specbench" / "question.jsonl"
AZURE_2024 = DATA / "azure2024" / "AzureLLMInferenceTrace_code_1week_sample.csv"


def rejects(con) -> dict[int, str]:
    return dict(con.execute("SELECT line, reason FROM rejects ORDER BY line").fetchall())


@pytest.mark.parametrize(
    ("path", "fmt", "accepted", "rejected"),
    [
        (BURSTGPT, "burstgpt", 32, 8),
        (MOONCAKE, "mooncake", 36, 4),
        (SHAREGPT, "sharegpt", 25, 3),
        (SPECBENCH, "specbench", 31, 3),
        (AZURE_2024, "azure", 40, 0),
    ],
)
def test_each_trace_is_detected_and_counted(con, path, fmt, accepted, rejected):
    summary = ingest_file(con, path)
    assert summary.format == fmt
    assert (summary.rows_accepted, summary.rows_rejected) == (accepted, rejected)
    stored = con.execute("SELECT count(*), count(DISTINCT line) FROM requests").fetchall()[0]
    ids = con.execute("SELECT count(request_id), count(DISTINCT request_id) FROM requests")
    if fmt in ("sharegpt", "specbench"):  # ids made from the conversation/question id and turn
        assert ids.fetchall()[0] == (accepted, accepted)
    else:  # the trace has no request ids: rows are told apart by their line
        assert stored == (accepted, accepted) and ids.fetchall()[0] == (0, 0)
    assert ingest_file(con, path).already_imported


def test_burstgpt_failed_requests_are_rejects_and_times_are_trace_relative(con):
    ingest_file(con, BURSTGPT)
    reasons = rejects(con)
    failed = [line for line, r in reasons.items() if r == "failed request (0 response tokens)"]
    assert failed == [2, 11, 18, 33]
    assert "prompt_tokens 'abc' is not a number" in reasons[13]
    assert "arrival_ts 'later' is not a timestamp" in reasons[26]
    assert "output_tokens is missing" in reasons[31]
    row = con.execute(
        "SELECT arrival_ts, prompt_tokens, output_tokens, model, tenant FROM requests"
        " WHERE line = 4"
    ).fetchall()[0]
    # Timestamp 27 s from the trace start is stored on the Unix epoch (see collectors/burstgpt).
    assert row == (datetime(1970, 1, 1, 0, 0, 27), 159, 49, "GPT-4", "Conversation log")


def test_mooncake_milliseconds_and_rejects(con):
    ingest_file(con, MOONCAKE)
    first = con.execute(
        "SELECT arrival_ts, prompt_tokens, output_tokens FROM requests ORDER BY line LIMIT 2"
    ).fetchall()
    assert first == [
        (datetime(1970, 1, 1), 11019, 522),
        (datetime(1970, 1, 1, 0, 0, 0, 412000), 10585, 814),
    ]
    reasons = rejects(con)
    assert set(reasons) == {9, 18, 26, 34}
    assert "prompt_tokens 'many' is not a number" in reasons[9]
    assert "not valid JSON" in reasons[18]
    assert "output_tokens is missing" in reasons[26]
    assert "negative" in reasons[34]


def test_sharegpt_one_request_per_answered_turn_with_estimated_tokens(con):
    ingest_file(con, SHAREGPT, store_text=True)
    conversation = json.loads(SHAREGPT.read_text())[3]["conversations"]  # 3 answered turns
    rows = con.execute(
        "SELECT request_id, prompt_tokens, output_tokens, task, prompt_text, output_text"
        " FROM requests WHERE request_id LIKE 'hRPPgZT_0#%' ORDER BY request_id"
    ).fetchall()
    assert [r[0] for r in rows] == ["hRPPgZT_0#1", "hRPPgZT_0#3", "hRPPgZT_0#5"]
    second = rows[1]
    history = "\n\n".join(t["value"] for t in conversation[:3])
    assert second[4] == history and second[5] == conversation[3]["value"]
    assert second[1] == math.ceil(len(history) / 4)
    assert second[2] == math.ceil(len(conversation[3]["value"]) / 4)
    assert {r[3] for r in rows} == {"chat"}
    reasons = rejects(con)
    assert reasons == {
        9: "no human turn followed by an answer",
        10: "conversations is missing or empty",
        11: "conversations is missing or empty",
    }


def test_sharegpt_as_json_lines(con, tmp_path):
    records = json.loads(SHAREGPT.read_text())[:5]
    path = tmp_path / "sharegpt.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n{truncated\n")
    summary = ingest_file(con, path)
    assert summary.format == "sharegpt"
    assert (summary.rows_accepted, summary.rows_rejected) == (8, 1)
    assert "not valid JSON" in rejects(con)[6]


def test_specbench_prompts_without_outputs(con):
    ingest_file(con, SPECBENCH, store_text=True)
    rows = con.execute(
        "SELECT task, count(*), count(output_tokens) FROM requests GROUP BY task ORDER BY task"
    ).fetchall()
    tasks = {r[0]: r[1] for r in rows}
    assert tasks["writing"] == 4 and tasks["translation"] == 3 and tasks["rag"] == 2
    assert all(r[2] == 0 for r in rows)  # no outputs in Spec-Bench
    turns = json.loads(SPECBENCH.read_text().splitlines()[0])["turns"]
    second = con.execute(
        "SELECT prompt_tokens, prompt_text FROM requests WHERE request_id = '81#2'"
    ).fetchall()[0]
    assert second == (math.ceil(len("\n\n".join(turns)) / 4), "\n\n".join(turns))
    reasons = rejects(con)
    assert set(reasons) == {11, 16, 21}
    assert "not valid JSON" in reasons[16] and "turns is missing" in reasons[21]


def test_azure_2024_release_timestamps_with_utc_offset(con, tmp_path):
    ingest_file(con, AZURE_2024)
    times = [r[0] for r in con.execute("SELECT arrival_ts FROM requests ORDER BY line").fetchall()]
    assert times[0] == datetime(2024, 5, 10, 0, 0, 0, 9930)
    assert times[6] == datetime(2024, 5, 10, 0, 0, 8)  # a row without fractional seconds
    assert times == sorted(times)
    shifted = tmp_path / "offset.csv"
    shifted.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n2024-05-10 02:00:00.500000+02:00,10,2\n"
    )
    ingest_file(con, shifted)
    stored = con.execute("SELECT arrival_ts FROM requests WHERE prompt_tokens = 10").fetchall()
    assert stored == [(datetime(2024, 5, 10, 0, 0, 0, 500000),)]
