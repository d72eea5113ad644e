"""Collectors for request logs: OpenAI-compatible JSONL, vLLM logs, LiteLLM, Langfuse, Helicone.

Every sample under tests/data/ is imported through the real ingest path (detection included) into
a real DuckDB file; the assertions pin counts, field values and rejects with their line numbers.
"""

from __future__ import annotations

import gzip
import json
from datetime import UTC, date, datetime
from pathlib import Path

import pytest

from collectors.base import Options
from collectors.ingest import ingest_file
from collectors.reading import sample
from collectors.registry import COLLECTORS
from tests.conftest import run_cli

DATA = Path(__file__).resolve().parent / "data"


def rows(con, sql: str, params: list | None = None) -> list[tuple]:
    return con.execute(sql, params or []).fetchall()


def request(con, request_id: str) -> dict:
    """One stored request as a dict of column -> value."""
    cur = con.execute("SELECT * FROM requests WHERE request_id = ?", [request_id])
    names = [d[0] for d in cur.description]
    found = cur.fetchall()
    assert len(found) == 1, f"{request_id}: {len(found)} rows"
    return dict(zip(names, found[0], strict=True))


def rejects(con, import_id: int) -> dict[int, str]:
    return dict(rows(con, "SELECT line, reason FROM rejects WHERE import_id = ?", [import_id]))


def detected(path: Path) -> list[str]:
    """Names of every registered collector that claims the file (detection must be unambiguous)."""
    head = sample(path)
    return [c.name for c in COLLECTORS if c.detect(head)]


# --- OpenAI-compatible logs -----------------------------------------------------------------

OPENAI = DATA / "openai" / "gateway.jsonl"
OPENAI_BATCH = DATA / "openai" / "batch_output.jsonl"


def test_openai_gateway_log_imports_with_values_and_rejects(con):
    summary = ingest_file(con, OPENAI, store_text=True)
    assert summary.format == "openai"
    assert (summary.rows_read, summary.rows_accepted, summary.rows_rejected) == (35, 31, 4)

    chat = request(con, "req-0002")
    assert (chat["prompt_tokens"], chat["output_tokens"]) == (237, 31)
    assert (chat["temperature"], chat["top_p"], chat["max_tokens"]) == (0.2, 0.95, 1024)
    assert (chat["task"], chat["tenant"]) == ("chat", "assistant")
    assert chat["model"] == "Qwen/Qwen2.5-7B-Instruct"
    assert chat["arrival_ts"] == datetime(2024, 5, 1, 10, 0, 1, 537000)
    assert chat["finish_ts"] == datetime(2024, 5, 1, 10, 0, 1, 992000)
    assert (chat["ttft_ms"], chat["e2e_ms"]) == (83.5, 455.0)
    assert chat["prompt_text"] == (
        "You are a careful assistant.\n[chat] request number 2: please help."
    )
    assert chat["output_text"] == "Answer 2 for chat."

    completion = request(con, "req-0004")  # a /v1/completions line
    assert completion["prompt_text"].startswith("def f3(x):")
    assert completion["output_text"].strip() == "return x + 3"
    assert (completion["prompt_tokens"], completion["max_tokens"]) == (311, 256)

    epoch = request(con, "req-epoch")  # epoch-ms times, max_completion_tokens, content parts
    assert epoch["arrival_ts"] == datetime(2024, 5, 1, 10, 1, 1)
    assert epoch["e2e_ms"] == 2500.0 and epoch["max_tokens"] == 300
    assert epoch["prompt_text"] == "Describe this image."
    assert epoch["task"] == "vision" and epoch["ttft_ms"] is None

    assert rejects(con, summary.import_id) == {
        31: "line is not valid JSON (truncated or corrupt)",
        32: "response has no token usage (a stream logged without stream_options.include_usage?)",
        33: "temperature 'warm' is not a number",
        34: "request failed: Rate limit reached for requests",
    }


def test_openai_text_is_stored_only_on_request(con):
    ingest_file(con, OPENAI)
    assert rows(con, "SELECT count(*) FROM requests WHERE prompt_text IS NOT NULL")[0][0] == 0
    assert rows(con, "SELECT count(*) FROM requests WHERE output_text IS NOT NULL")[0][0] == 0


def test_openai_task_key_option_picks_another_metadata_field(con):
    ingest_file(con, OPENAI, options=Options(task_key="metadata.team"))
    tasks = rows(con, "SELECT task, count(*) FROM requests GROUP BY task ORDER BY task")
    assert tasks == [("platform", 30), (None, 1)]  # req-epoch has no metadata.team


def test_openai_batch_output_imports(con):
    summary = ingest_file(con, OPENAI_BATCH)
    assert summary.format == "openai"
    assert (summary.rows_accepted, summary.rows_rejected) == (6, 1)
    doc = request(con, "doc-2")
    assert (doc["prompt_tokens"], doc["output_tokens"]) == (520, 42)
    assert doc["arrival_ts"] == datetime(2024, 5, 1, 10, 40, 2)  # response `created`
    assert doc["temperature"] is None and doc["model"] == "gpt-4o-mini-2024-07-18"
    assert rejects(con, summary.import_id)[7].startswith("request failed: This request could")


def test_openai_bare_completion_objects(con, tmp_path):
    log = tmp_path / "responses.jsonl"
    completion = {
        "id": "chatcmpl-1", "object": "chat.completion", "created": 1714557600, "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}}],
        "usage": {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15},
    }  # fmt: skip
    log.write_text(json.dumps(completion) + "\n")
    summary = ingest_file(con, log)
    assert summary.format == "openai" and summary.rows_accepted == 1
    stored = request(con, "chatcmpl-1")
    assert (stored["prompt_tokens"], stored["output_tokens"]) == (12, 3)


def test_openai_responses_api_lines(con, tmp_path):
    body = {
        "model": "gpt-4.1-mini", "temperature": 0.4, "max_output_tokens": 300,
        "input": [{"role": "user", "content": [{"type": "input_text", "text": "Hi there"}]}],
    }  # fmt: skip
    reply = {
        "id": "resp_1", "object": "response", "created_at": 1714557600, "status": "completed",
        "model": "gpt-4.1-mini", "error": None,
        "output": [
            {"type": "reasoning", "id": "rs_1", "summary": []},
            {"type": "message", "role": "assistant",
             "content": [{"type": "output_text", "text": "Hello!", "annotations": []}]},
        ],
        "usage": {"input_tokens": 21, "output_tokens": 7, "total_tokens": 28},
    }  # fmt: skip
    log = tmp_path / "responses.jsonl"
    log.write_text(json.dumps({"request_id": "r1", "request": body, "response": reply}))
    summary = ingest_file(con, log, store_text=True)
    assert (summary.format, summary.rows_accepted) == ("openai", 1)
    stored = request(con, "r1")
    assert (stored["prompt_tokens"], stored["output_tokens"]) == (21, 7)
    assert (stored["temperature"], stored["max_tokens"]) == (0.4, 300)
    assert stored["arrival_ts"] == datetime(2024, 5, 1, 10, 0)
    assert (stored["prompt_text"], stored["output_text"]) == ("Hi there", "Hello!")


def test_generic_jsonl_is_not_taken_for_openai(tmp_path):
    log = tmp_path / "export.jsonl"
    log.write_text('{"ts": 1, "prompt_tokens": 10, "completion_tokens": 5, "response": "hi"}\n')
    assert "openai" not in detected(log)


# --- LiteLLM ----------------------------------------------------------------------------------

LITELLM_PAYLOAD = DATA / "litellm" / "standard_logging.jsonl"
SPEND_CSV = DATA / "litellm" / "spend_logs.csv"
SPEND_JSON = DATA / "litellm" / "spend_logs.json"


def test_litellm_standard_logging_payload(con):
    summary = ingest_file(con, LITELLM_PAYLOAD, store_text=True)
    assert summary.format == "litellm"
    assert (summary.rows_read, summary.rows_accepted, summary.rows_rejected) == (34, 28, 6)

    streamed = request(con, "chatcmpl-0001-ll")
    assert (streamed["prompt_tokens"], streamed["output_tokens"]) == (341, 24)
    assert (streamed["temperature"], streamed["top_p"], streamed["max_tokens"]) == (0.3, 0.9, 800)
    assert streamed["task"] == "rag"  # from the request tag task:rag, ahead of the metadata
    assert (streamed["tenant"], streamed["model"]) == ("support", "llama-3.1-8b")
    assert streamed["arrival_ts"] == datetime(2024, 6, 3, 14, 0, 2, 250000)
    assert streamed["finish_ts"] == datetime(2024, 6, 3, 14, 0, 2, 644000)
    assert (streamed["ttft_ms"], streamed["e2e_ms"]) == pytest.approx((130.0, 394.0))
    assert streamed["prompt_text"] == "Be concise.\nQuestion 1 about rag"
    assert streamed["output_text"] == "Reply 1"

    blocking = request(con, "chatcmpl-0002-ll")  # not streamed: completionStartTime == endTime
    assert blocking["ttft_ms"] is None and blocking["e2e_ms"] == pytest.approx(503.0)

    assert rejects(con, summary.import_id) == {
        29: "line is not valid JSON (truncated or corrupt)",
        30: "request failed: litellm.RateLimitError: RateLimitError: Hosted_vllmException"
        " - rate limit",
        31: "served from the LiteLLM cache (no model call)",
        32: "call_type aembedding is not a text generation",
        33: "temperature 'hot' is not a number",
        34: "output_tokens is missing",
    }


def test_litellm_task_key_overrides_tags(con):
    ingest_file(con, LITELLM_PAYLOAD, options=Options(task_key="metadata.requester_metadata.task"))
    assert request(con, "chatcmpl-0001-ll")["task"] == "fallback-rag"


def test_litellm_spend_logs_csv(con):
    summary = ingest_file(con, SPEND_CSV, store_text=True)
    assert summary.format == "litellm_spendlogs"
    assert (summary.rows_read, summary.rows_accepted, summary.rows_rejected) == (28, 24, 4)

    row = request(con, "b3f1c2d4-0000-4000-8000-000000000001")
    assert (row["prompt_tokens"], row["output_tokens"]) == (173, 47)
    # temperature etc. come from the proxy_server_request JSON cell
    assert (row["temperature"], row["top_p"], row["max_tokens"]) == (0.7, 0.8, 512)
    assert (row["task"], row["tenant"], row["model"]) == ("chat", "support", "qwen2.5-7b")
    assert row["arrival_ts"] == datetime(2024, 6, 3, 15, 0, 3, 500000)
    assert (row["ttft_ms"], row["e2e_ms"]) == pytest.approx((94.0, 705.0))
    assert row["prompt_text"] == "Ticket 1: chat"
    assert row["line"] == 3

    assert request(con, "b3f1c2d4-0000-4000-8000-000000000003")["ttft_ms"] is None  # not streamed
    assert request(con, "b3f1c2d4-0000-4000-8000-000000000010")["line"] == 13  # after the bad row
    found = rejects(con, summary.import_id)
    assert set(found) == {12, 27, 28, 29}
    assert found[12].startswith("row is not valid CSV")
    assert found[27] == "output_tokens is missing"
    assert found[28] == "temperature 'NaN-ish' is not a number"
    assert found[29] == "request failed: Connection refused"


def test_litellm_spend_logs_json_export(con):
    summary = ingest_file(con, SPEND_JSON)
    assert summary.format == "litellm_spendlogs"
    assert (summary.rows_accepted, summary.rows_rejected) == (5, 0)
    row = request(con, "b3f1c2d4-0000-4000-8000-000000000042")
    assert (row["prompt_tokens"], row["output_tokens"], row["temperature"]) == (2346, 334, 0.0)
    assert row["arrival_ts"] == datetime(2024, 6, 3, 15, 2, 27)
    assert (row["ttft_ms"], row["task"]) == (pytest.approx(258.0), "summarize")


# --- Langfuse ---------------------------------------------------------------------------------

LANGFUSE = DATA / "langfuse"


def test_langfuse_json_export(con):
    summary = ingest_file(con, LANGFUSE / "generations.json", store_text=True)
    assert summary.format == "langfuse"
    assert (summary.rows_read, summary.rows_accepted, summary.rows_rejected) == (31, 27, 4)

    gen = request(con, "gen-0001")
    assert (gen["prompt_tokens"], gen["output_tokens"]) == (213, 29)
    assert (gen["temperature"], gen["top_p"], gen["max_tokens"]) == (0.5, 0.95, 512)
    assert (gen["task"], gen["tenant"], gen["model"]) == ("classify", "globex", "gpt-4o-mini")
    assert gen["arrival_ts"] == datetime(2024, 7, 1, 9, 0, 4, 250000)
    assert gen["finish_ts"] == datetime(2024, 7, 1, 9, 0, 4, 870000)
    assert (gen["ttft_ms"], gen["e2e_ms"]) == pytest.approx((185.0, 620.0))
    assert gen["prompt_text"] == "You are an analyst.\nDoc 1: please classify."
    assert gen["output_text"] == "Result 1"

    old_sdk = request(con, "gen-0005")  # usage.promptTokens, string modelParameters, maxTokens
    assert (old_sdk["prompt_tokens"], old_sdk["output_tokens"]) == (465, 97)
    assert (old_sdk["temperature"], old_sdk["max_tokens"]) == (0.5, 1000)

    text = request(con, "gen-0030")  # plain-text input/output, ttft from timeToFirstToken (s)
    assert text["prompt_text"] == "Translate 'cat' to French." and text["output_text"] == "chat"
    assert text["ttft_ms"] == pytest.approx(330.0)

    assert rejects(con, summary.import_id) == {
        27: "temperature 'creative' is not a number",
        28: "prompt_tokens is missing",
        29: "observation type SPAN is not a generation",
        30: "generation failed: Error code: 400 - context_length_exceeded",
    }


def test_langfuse_jsonl_and_csv_exports(con):
    jsonl = ingest_file(con, LANGFUSE / "generations.jsonl")
    assert (jsonl.format, jsonl.rows_accepted, jsonl.rows_rejected) == ("langfuse", 6, 1)
    assert rejects(con, jsonl.import_id) == {4: "line is not valid JSON (truncated or corrupt)"}
    assert request(con, "gen-0043")["line"] == 5

    table = ingest_file(con, LANGFUSE / "generations.csv")
    assert (table.format, table.rows_accepted, table.rows_rejected) == ("langfuse", 12, 1)
    assert rejects(con, table.import_id) == {14: "prompt_tokens is missing"}
    row = request(con, "gen-0065")  # JSON cells: usage with promptTokens, string temperature
    assert (row["prompt_tokens"], row["output_tokens"], row["temperature"]) == (4245, 1117, 0.5)
    assert (row["task"], row["ttft_ms"]) == ("classify", pytest.approx(505.0))


def test_langfuse_task_key_can_use_generation_name(con):
    ingest_file(con, LANGFUSE / "generations.jsonl", options=Options(task_key="name"))
    assert request(con, "gen-0040")["task"] == "summarize-step"


# --- Helicone ---------------------------------------------------------------------------------

HELICONE = DATA / "helicone"


def test_helicone_json_export(con):
    summary = ingest_file(con, HELICONE / "requests.json", store_text=True)
    assert summary.format == "helicone"
    assert (summary.rows_read, summary.rows_accepted, summary.rows_rejected) == (30, 27, 3)

    req = request(con, "9a1e0001-1111-4222-8333-000000000001")
    assert (req["prompt_tokens"], req["output_tokens"]) == (119, 38)
    assert (req["temperature"], req["top_p"], req["max_tokens"]) == (0.6, 1.0, 700)
    assert (req["task"], req["tenant"]) == ("code", "user-1")
    assert req["model"] == "gpt-4o-mini-2024-07-18"
    assert req["arrival_ts"] == datetime(2024, 8, 2, 0, 1, 5, 123000)
    assert req["finish_ts"] == datetime(2024, 8, 2, 0, 1, 5, 811000)
    assert (req["ttft_ms"], req["e2e_ms"]) == (156.0, 688.0)
    assert (req["prompt_text"], req["output_text"]) == ("Ask 1: code", "Ans 1")

    assert rejects(con, summary.import_id) == {
        28: "request failed with status 429",
        29: "prompt_tokens is missing",
        30: "temperature 'default' is not a number",
    }


def test_helicone_jsonl_and_csv_exports(con):
    jsonl = ingest_file(con, HELICONE / "requests.jsonl")
    assert (jsonl.format, jsonl.rows_accepted, jsonl.rows_rejected) == ("helicone", 6, 1)
    assert rejects(con, jsonl.import_id) == {3: "line is not valid JSON (truncated or corrupt)"}

    table = ingest_file(con, HELICONE / "requests.csv")
    assert (table.format, table.rows_accepted, table.rows_rejected) == ("helicone", 12, 1)
    assert rejects(con, table.import_id) == {14: "output_tokens 'n/a' is not a number"}
    row = request(con, "9a1e0061-1111-4222-8333-000000000061")  # ClickHouse-style timestamps
    assert row["arrival_ts"] == datetime(2024, 8, 2, 0, 6, 5, 123000)
    assert (row["prompt_tokens"], row["temperature"], row["task"]) == (1859, 0.6, "code")


# --- vLLM server logs -------------------------------------------------------------------------

VLLM = DATA / "vllm"


def log_year(month: int, day: int) -> int:
    """vLLM's default log dates have no year: the most recent year not in the future."""
    today = datetime.now(UTC).date()
    return today.year - 1 if date(today.year, month, day) > today else today.year


def test_vllm_server_log_joins_requests_with_outputs(con):
    summary = ingest_file(con, VLLM / "server.log", store_text=True)
    assert summary.format == "vllm"
    assert (summary.rows_read, summary.rows_accepted, summary.rows_rejected) == (29, 26, 3)

    year = log_year(8, 21)
    req = request(con, "chatcmpl-5a181dab0003")
    assert req["line"] == 18
    assert (req["prompt_tokens"], req["output_tokens"]) == (109, 17)  # lengths of the id lists
    assert (req["temperature"], req["top_p"], req["max_tokens"]) == (0.2, 1.0, 2048)
    assert req["arrival_ts"] == datetime(year, 8, 21, 14, 0, 9)
    assert req["finish_ts"] == datetime(year, 8, 21, 14, 0, 10)
    assert req["task"] is None and req["ttft_ms"] is None and req["e2e_ms"] is None
    assert req["model"] == "meta-llama/Llama-3.1-8B-Instruct"  # from the startup args line
    assert req["prompt_text"].startswith("<|begin_of_text|><|start_header_id|>user")
    assert "\n\nQuestion 3: what is next?" in req["prompt_text"]
    assert req["output_text"] == "Answer 3: it's fine.\nDone."  # repr() escapes undone

    streamed = request(con, "chatcmpl-5a1a2b8a0020")  # delta token ids are summed
    assert (streamed["prompt_tokens"], streamed["output_tokens"]) == (500, 85)
    assert streamed["output_text"].strip() == "part0 part1"

    assert rejects(con, summary.import_id) == {
        117: "no output line for this request (vLLM logs outputs with --enable-log-outputs)",
        118: "request was aborted (client disconnected)",
        119: "request line is incomplete (no params logged)",
    }


def test_vllm_debug_log_of_newer_versions(con):
    summary = ingest_file(con, VLLM / "server_debug.log", store_text=True)
    assert (summary.format, summary.rows_accepted, summary.rows_rejected) == ("vllm", 5, 1)
    req = request(con, "cmpl-beef02-0")  # token ids from the DEBUG `details` lines
    assert (req["prompt_tokens"], req["output_tokens"], req["temperature"]) == (120, 22, 0.2)
    assert req["arrival_ts"] == datetime(log_year(11, 3), 11, 3, 9, 0, 10)
    assert req["prompt_text"] == "def add(a, b):"
    assert rejects(con, summary.import_id) == {
        23: "output token ids not logged (vLLM 0.11+ logs them only at --log-level DEBUG)"
    }


def test_vllm_old_format_with_full_timestamps(con, tmp_path):
    params = "SamplingParams(n=1, temperature=0.8, top_p=0.95, top_k=-1, max_tokens=None)"
    log = tmp_path / "vllm.log"
    log.write_text(
        "2024-05-06 10:21:31,250 INFO [logger.py:39] Received request cmpl-7-0: prompt: "
        f"'a, params: b', params: {params}, prompt_token_ids: [1, 2, 3], lora_request: None,"
        " prompt_adapter_request: None.\n"
        "2024-05-06 10:21:33,500 INFO [logger.py:60] Generated response cmpl-7-0: output:"
        " 'xy', output_token_ids: [4, 5], finish_reason: stop\n"
    )
    summary = ingest_file(con, log, store_text=True)
    assert (summary.format, summary.rows_accepted) == ("vllm", 1)
    req = request(con, "cmpl-7-0")
    assert (req["prompt_tokens"], req["output_tokens"], req["max_tokens"]) == (3, 2, None)
    assert (req["temperature"], req["top_p"]) == (0.8, 0.95)
    assert req["arrival_ts"] == datetime(2024, 5, 6, 10, 21, 31, 250000)
    assert req["finish_ts"] == datetime(2024, 5, 6, 10, 21, 33, 500000)
    assert req["prompt_text"] == "a, params: b"


# --- Detection ----------------------------------------------------------------------------------

MINE = {"openai", "litellm", "litellm_spendlogs", "langfuse", "helicone", "vllm"}
SAMPLES = {
    OPENAI: "openai",
    OPENAI_BATCH: "openai",
    LITELLM_PAYLOAD: "litellm",
    SPEND_CSV: "litellm_spendlogs",
    SPEND_JSON: "litellm_spendlogs",
    LANGFUSE / "generations.json": "langfuse",
    LANGFUSE / "generations.jsonl": "langfuse",
    LANGFUSE / "generations.csv": "langfuse",
    HELICONE / "requests.json": "helicone",
    HELICONE / "requests.jsonl": "helicone",
    HELICONE / "requests.csv": "helicone",
    VLLM / "server.log": "vllm",
    VLLM / "server_debug.log": "vllm",
}


@pytest.mark.parametrize(("path", "name"), SAMPLES.items(), ids=[p.name for p in SAMPLES])
def test_detection_is_unambiguous(path, name):
    claims = detected(path)
    assert claims[0] == name  # the first claim is the one ingest uses
    assert [c for c in claims if c in MINE] == [name]
    assert "azure" not in claims


@pytest.mark.parametrize(
    "content",
    [
        "request_id,prompt_tokens,completion_tokens,created_at\nr1,10,5,2024-01-01\n",
        '{"id": "x", "startTime": 1, "prompt_tokens": 3, "completion_tokens": 4}\n',
        '[{"request_id": "r", "prompt_tokens": 3, "completion_tokens": 4, "model": "m"}]\n',
        "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03,10,5\n",
        "INFO 05-06 10:21:31 [engine.py:310] Added request chatcmpl-1.\n",
    ],
    ids=["generic-csv", "generic-jsonl", "generic-json", "azure", "vllm-without-requests"],
)
def test_generic_exports_are_not_taken_for_log_formats(tmp_path, content):
    path = tmp_path / "export.txt"
    path.write_text(content)
    assert not set(detected(path)) & MINE


def test_cli_detects_log_formats_and_lists_their_rejects(db_path):
    logs = [OPENAI, LITELLM_PAYLOAD, VLLM / "server.log", HELICONE / "requests.csv"]
    result = run_cli("ingest", *map(str, logs), "--store-text", db=db_path)
    assert result.returncode == 0, result.stderr
    for counts in ("31 imported, 4 rejected", "28 imported, 6 rejected",
                   "26 imported, 3 rejected", "12 imported, 1 rejected"):  # fmt: skip
        assert counts in result.stdout
    listed = run_cli("rejects", "1", db=db_path)
    assert "request failed: Rate limit reached for requests" in listed.stdout
    from advisor.store import connect

    con = connect(db_path)
    formats = rows(con, "SELECT format FROM imports ORDER BY import_id")
    assert formats == [("openai",), ("litellm",), ("vllm",), ("helicone",)]
    assert rows(con, "SELECT count(*) FROM requests WHERE prompt_text IS NULL")[0][0] == 0
    con.close()


@pytest.mark.parametrize(
    ("path", "counts"),
    [
        (VLLM / "server.log", (29, 26, 3)),
        (LANGFUSE / "generations.json", (31, 27, 4)),
        (SPEND_CSV, (28, 24, 4)),
        (OPENAI, (35, 31, 4)),
    ],
    ids=["vllm", "langfuse-json", "spendlogs-csv", "openai"],
)
def test_gzipped_logs_import_like_plain_ones(con, tmp_path, path, counts):
    packed = tmp_path / (path.name + ".gz")
    packed.write_bytes(gzip.compress(path.read_bytes()))
    summary = ingest_file(con, packed)
    assert (summary.rows_read, summary.rows_accepted, summary.rows_rejected) == counts
    assert summary.format == SAMPLES[path]
