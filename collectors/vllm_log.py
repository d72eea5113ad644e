"""vLLM OpenAI-compatible server logs (`vllm serve --enable-log-requests --enable-log-outputs`).

Request lines (vllm/entrypoints/logger.py, RequestLogger), in the shapes vLLM has printed:

- up to 0.10: `Received request ID: prompt: '...', params: SamplingParams(...),
  prompt_token_ids: [...], [prompt_embeds shape: None, ]lora_request: None[, ...].`
- 0.11 and later: `Received request ID: params: SamplingParams(...), lora_request: None.` at INFO,
  with `Request ID details: prompt: '...', prompt_token_ids: [...], ...` at DEBUG.

Output lines: `Generated response ID: output: '...', output_token_ids: [...], finish_reason: ...`
(0.11+: the token ids move to a DEBUG line `Generated response ID details: output_token_ids:
[...]`); streamed requests log `(streaming delta)` lines, whose token ids are summed, and a
`(streaming complete)` line. `Aborted request ID.` marks a request the client dropped.

One row per `Received request` line, joined on the request id in SQL. Arrival is that line's
timestamp, finish the last output line's (vLLM's default log format has one-second resolution and
no year: an `MM-DD` date takes the most recent year that puts it not in the future; a logging
config with full `YYYY-MM-DD HH:MM:SS[.fff]` times is read as is). temperature, top_p and
max_tokens come from SamplingParams, the model from the startup `args` line when the log has it;
prompt/output token counts are the lengths of the logged token id lists. vLLM logs no
per-request latency, so ttft_ms and e2e_ms stay empty, and no task label. `--max-log-len`
truncates the logged id lists, so set it high (or leave it unset) for true counts. Requests
without a logged output token count, aborted requests and pooling (embedding) requests are
rejected with that reason.
"""

from __future__ import annotations

import re

from collectors.base import Collector, Options, Sample

RECEIVED = re.compile(r"Received request \S+: (prompt|params): ")
# The served model from the startup line: `non-default args: {'model_tag': '...'}` (0.8+)
# or `args: Namespace(... model='...', ...)` (older). SQL-quoted.
MODEL_ARG = r"""\bmodel(?:_tag)?''?(?::|=) ?''([^'']+)''"""


def _ts(raw: str) -> str:
    """The log line's timestamp as TIMESTAMP: full ISO-like date, else vLLM's `MM-DD HH:MM:SS`."""
    full = rf"""regexp_extract({raw}, '(\d{{4}}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:[.,]\d+)?)', 1)"""
    short = rf"""regexp_extract({raw}, '\b(\d\d)-(\d\d) (\d\d:\d\d:\d\d)\b', ['m', 'd', 't'])"""
    this_year = f"strftime(current_date, '%Y') || '-' || {short}.m || '-' || {short}.d"
    year = (
        f"CASE WHEN TRY_CAST({this_year} AS DATE) > current_date"
        " THEN year(current_date) - 1 ELSE year(current_date) END"
    )
    return (
        f"CASE WHEN {full} <> '' THEN TRY_CAST(replace({full}, ',', '.') AS TIMESTAMP)"
        f" WHEN {short}.t <> '' THEN TRY_CAST({year} || '-' || {short}.m || '-' || {short}.d"
        f" || ' ' || {short}.t AS TIMESTAMP) END"
    )


def _count(ids: str) -> str:
    """Length of a logged token id list given its inside (`1, 2, 3`); NULL when not logged."""
    return (
        f"CASE WHEN {ids} IS NULL THEN NULL WHEN trim({ids}) = '' THEN 0"
        f" ELSE length({ids}) - length(replace({ids}, ',', '')) + 1 END"
    )


def _unrepr(text: str) -> str:
    """Best-effort undo of Python's repr() of a string: drop the quotes, common escapes."""
    inner = f"{text}[2:-2]"
    # SQL literals: backslashes are literal in DuckDB strings, a quote is doubled.
    backslash = "\\"
    for escaped, plain in (
        ("n", "chr(10)"),
        ("t", "chr(9)"),
        ("''", "''''"),
        ('"', "'\"'"),
        (backslash, f"'{backslash}'"),
    ):
        inner = f"replace({inner}, '{backslash}{escaped}', {plain})"
    return f"CASE WHEN regexp_full_match({text}, '(''.*''|\".*\")') THEN {inner} END"


def _ids(raw: str, anchor: str) -> str:
    """Inside of the last `anchor[...]` list on the line (greedy: skips look-alikes in a prompt)."""
    return f"NULLIF(regexp_extract({raw}, '.*{anchor}\\[([^\\]]*)\\]', 1), '')"


def select(options: Options) -> str:
    del options  # vLLM logs carry no metadata to pick a task label from
    sp = r"regexp_extract(raw, '.*params: SamplingParams\((.*)', 1)"
    prompt_ids = _count(_ids("raw", "prompt_token_ids: "))
    output_ids = _count(_ids("raw", "output_token_ids: "))
    received_prompt = _unrepr(r"regexp_extract(raw, 'prompt: (.*), params: SamplingParams\(', 1)")
    details_prompt = _unrepr(r"regexp_extract(raw, 'prompt: (.*), prompt_token_ids: ', 1)")
    output = _unrepr(
        r"coalesce(NULLIF(regexp_extract(raw, 'output: (.*), output_token_ids: \[', 1), ''),"
        r" regexp_extract(raw, 'output: (.*), finish_reason: ', 1))"
    )
    out_id = (
        r"regexp_extract(raw, 'Generated response (\S+?)"
        r"(?: \(streaming (?:delta|complete)\))?(?: details)?: ', 1)"
    )
    return rf"""
        SELECT * FROM (
        WITH ev AS (
            SELECT line, raw, {_ts("raw")} AS ts,
                   regexp_extract(raw, 'Received request (\S+): (?:prompt|params): ', 1) AS rid,
                   regexp_extract(raw, 'Request (\S+) details: prompt: ', 1) AS did,
                   {out_id} AS oid,
                   regexp_extract(raw, 'Aborted request (\S+?)\.?$', 1) AS aid,
                   raw LIKE '%(streaming complete)%' AS complete,
                   raw LIKE '%(streaming delta)%' AS delta
            FROM src
            WHERE raw LIKE '%Received request %' OR raw LIKE '%Request % details: %'
               OR raw LIKE '%Generated response %' OR raw LIKE '%Aborted request %'
        ),
        received AS (
            SELECT line, raw, rid, ts,
                   {prompt_ids} AS prompt_n,
                   regexp_extract(raw, 'params: (\w+)\(', 1) AS params_kind,
                   regexp_extract({sp}, '\btemperature=([^,)]+)', 1) AS temperature,
                   regexp_extract({sp}, '\btop_p=([^,)]+)', 1) AS top_p,
                   NULLIF(regexp_extract({sp}, '\bmax_tokens=([^,)]+)', 1), 'None') AS max_tokens,
                   {received_prompt} AS prompt_text
            FROM ev WHERE rid <> ''
        ),
        details AS (
            SELECT did AS id,
                   max({prompt_ids}) AS prompt_n,
                   any_value({details_prompt}) AS prompt_text
            FROM ev WHERE did <> '' GROUP BY did
        ),
        outputs AS (
            SELECT oid AS id, max(ts) AS finish,
                   sum({output_ids}) FILTER (WHERE NOT complete) AS output_n,
                   coalesce(
                       any_value({output}) FILTER (WHERE NOT delta AND raw LIKE '%: output: %'),
                       string_agg({output}, '' ORDER BY line) FILTER (WHERE delta)) AS output_text
            FROM ev WHERE oid <> '' GROUP BY oid
        ),
        aborted AS (SELECT DISTINCT aid AS id FROM ev WHERE aid <> ''),
        served AS (
            SELECT NULLIF(regexp_extract(raw, '{MODEL_ARG}', 1), '') AS model FROM src
            WHERE raw LIKE '%args: %' AND regexp_matches(raw, '{MODEL_ARG}') ORDER BY line LIMIT 1
        )
        SELECT r.line, r.raw, r.rid AS request_id, r.ts AS arrival_ts, o.finish AS finish_ts,
               coalesce(r.prompt_n, d.prompt_n) AS prompt_tokens,
               o.output_n AS output_tokens,
               r.temperature, r.top_p, r.max_tokens, (SELECT model FROM served) AS model,
               coalesce(r.prompt_text, d.prompt_text) AS prompt_text,
               o.output_text,
               CASE WHEN r.params_kind = '' THEN 'request line is incomplete (no params logged)'
                    WHEN r.params_kind <> 'SamplingParams'
                         THEN 'not a text generation request (' || r.params_kind || ')'
                    WHEN a.id IS NOT NULL THEN 'request was aborted (client disconnected)'
                    WHEN o.id IS NULL THEN 'no output line for this request'
                         || ' (vLLM logs outputs with --enable-log-outputs)'
                    WHEN o.output_n IS NULL THEN 'output token ids not logged'
                         || ' (vLLM 0.11+ logs them only at --log-level DEBUG)'
                    WHEN coalesce(r.prompt_n, d.prompt_n) IS NULL THEN 'prompt token ids not'
                         || ' logged (vLLM 0.11+ logs them only at --log-level DEBUG)'
               END AS reject_reason
        FROM received r
        LEFT JOIN details d ON d.id = r.rid
        LEFT JOIN outputs o ON o.id = r.rid
        LEFT JOIN aborted a ON a.id = r.rid
        )
    """


def detect(sample: Sample) -> bool:
    return sample.kind != "parquet" and any(RECEIVED.search(line) for line in sample.lines)


COLLECTOR = Collector(
    name="vllm",
    summary="vLLM server log (--enable-log-requests --enable-log-outputs)",
    expects="text lines 'Received request ID: ... params: SamplingParams(...)'",
    reader="text_lines",
    detect=detect,
    select=select,
)
