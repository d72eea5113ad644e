"""LiteLLM proxy logs: StandardLoggingPayload JSON lines and the LiteLLM_SpendLogs table export.

StandardLoggingPayload (docs/proxy/logging_spec.md in BerriAI/litellm) is what LiteLLM's logging
callbacks emit per call: `id`, `call_type`, `status`, `prompt_tokens`, `completion_tokens`,
`startTime` / `completionStartTime` / `endTime` (epoch seconds, float), `model`, `metadata`
(user_api_key_team_alias, spend_logs_metadata, requester_metadata, ...), `request_tags`,
`messages`, `response` (OpenAI-format), `model_parameters` (temperature, top_p, max_tokens),
`cache_hit`, `error_str`. One JSON object per line, or a JSON array of them.

LiteLLM_SpendLogs is the proxy's Postgres table, exported as CSV (psql `\\copy ... CSV HEADER`)
or JSON (the /spend/logs API): `request_id`, `call_type`, `spend`, `prompt_tokens`,
`completion_tokens`, `startTime`, `endTime`, `completionStartTime` (timestamps), `model`,
`team_id`, `cache_hit`, `status`, and JSON cells `metadata`, `request_tags`, `messages`,
`response`, `proxy_server_request` (the request body, where temperature etc. live when the proxy
stores prompts). Lower-cased column names (startTime -> starttime) are accepted too.

Task label: `--task-key PATH` (a path into the record, e.g. `metadata.requester_metadata.task`),
else a request tag `task:LABEL` (or `task=LABEL`), else `task` in spend_logs_metadata or
requester_metadata. ttft_ms = completionStartTime - startTime, kept only when the first token
came before the end (LiteLLM sets completionStartTime = endTime for non-streaming calls, where the
time to first token is unknown). Failed calls, cache hits (no model call) and non-generation call
types (embeddings, images, audio, rerank, moderation) are rejected with that reason.
"""

from __future__ import annotations

from collectors.base import Collector, Options, Sample
from collectors.jsonsql import (
    columns,
    decoded,
    document,
    extract,
    instant,
    keys_of,
    messages_text,
    ms_between,
)

JSON_CELLS = ("metadata", "request_tags", "messages", "response", "proxy_server_request",
              "model_parameters")  # fmt: skip
NOT_GENERATION = "embedding|image|transcription|speech|rerank|moderation"


def _task_paths(options: Options) -> tuple[str, ...]:
    if options.task_key:
        return (options.task_path("metadata.task"),)
    return (
        "$.metadata.spend_logs_metadata.task",
        "$.metadata.requester_metadata.task",
        "$.metadata.task",
    )


def _select(paths: dict[str, tuple[str, ...]], options: Options) -> str:
    """The SELECT shared by both LiteLLM shapes, over their (differently named) paths."""
    paths = {
        **paths,
        "task": _task_paths(options),
        "tags": ("$.request_tags",),
        "status": ("$.status",),
        "cache_hit": ("$.cache_hit",),
        "call_type": ("$.call_type",),
        "request_messages": ("$.proxy_server_request.messages",),
    }
    values, f = extract(paths, doc="d")
    tag_task = f"""NULLIF(regexp_extract({f["tags"]}, '"task[:=]([^"]*)"', 1), '')"""
    task = f["task"] if options.task_key else f"coalesce({tag_task}, {f['task']})"
    start, first, end = f["start"], f["first"], f["end"]
    ttft = f"CASE WHEN {instant(first)} < {instant(end)} THEN {ms_between(start, first)} END"
    return f"""
        SELECT line, raw,
               {columns(f, task=task)},
               {start} AS arrival_ts,
               {end} AS finish_ts,
               {ttft} AS ttft_ms,
               {ms_between(start, end)} AS e2e_ms,
               coalesce({messages_text(f["messages"])},
                        {messages_text(f["request_messages"])}) AS prompt_text,
               {f["output"]} AS output_text,
               CASE WHEN lower({f["status"]}) = 'failure'
                         THEN 'request failed: '
                              || left(coalesce({f["error"]}, 'status failure'), 200)
                    WHEN lower({f["cache_hit"]}) = 'true'
                         THEN 'served from the LiteLLM cache (no model call)'
                    WHEN regexp_matches(lower({f["call_type"]}), '{NOT_GENERATION}')
                         THEN 'call_type ' || {f["call_type"]} || ' is not a text generation'
               END AS reject_reason
        FROM (SELECT line, raw, {values} AS v
              FROM (SELECT line, raw, {decoded("doc", JSON_CELLS)} AS d FROM ({document()})))
    """


OUTPUT = ("$.response.choices[0].message.content", "$.response.choices[0].text")


def select_payload(options: Options) -> str:
    return _select(
        {
            "request_id": ("$.id",),
            "start": ("$.startTime",),
            "first": ("$.completionStartTime",),
            "end": ("$.endTime",),
            "prompt_tokens": ("$.prompt_tokens",),
            "output_tokens": ("$.completion_tokens",),
            "temperature": ("$.model_parameters.temperature",),
            "top_p": ("$.model_parameters.top_p",),
            "max_tokens": (
                "$.model_parameters.max_tokens",
                "$.model_parameters.max_completion_tokens",
            ),
            "model": ("$.model", "$.model_group"),
            "tenant": (
                "$.metadata.user_api_key_team_alias",
                "$.metadata.user_api_key_team_id",
                "$.end_user",
            ),
            "messages": ("$.messages",),
            "output": OUTPUT,
            "error": ("$.error_str", "$.error_information.error_message"),
        },
        options,
    )


def _params(name: str) -> tuple[str, ...]:
    where = ("proxy_server_request", "model_parameters", "metadata.model_parameters")
    return tuple(f"$.{w}.{name}" for w in where)


def select_spend_logs(options: Options) -> str:
    return _select(
        {
            "request_id": ("$.request_id",),
            "start": ("$.startTime", "$.starttime"),
            "first": ("$.completionStartTime", "$.completionstarttime"),
            "end": ("$.endTime", "$.endtime"),
            "prompt_tokens": ("$.prompt_tokens",),
            "output_tokens": ("$.completion_tokens",),
            "temperature": _params("temperature"),
            "top_p": _params("top_p"),
            "max_tokens": _params("max_tokens") + _params("max_completion_tokens"),
            "model": ("$.model", "$.model_group"),
            "tenant": ("$.metadata.user_api_key_team_alias", "$.team_id", "$.end_user"),
            "messages": ("$.messages",),
            "output": OUTPUT,
            "error": ("$.metadata.error_information.error_message", "$.metadata.error_str"),
        },
        options,
    )


def detect_payload(sample: Sample) -> bool:
    keys = keys_of(sample)
    return sample.kind in ("jsonl", "json_array") and {
        "call_type", "startTime", "completionStartTime", "model_parameters", "prompt_tokens",
    } <= keys  # fmt: skip


def detect_spend_logs(sample: Sample) -> bool:
    keys = {k.lower() for k in keys_of(sample)}
    return {
        "request_id",
        "spend",
        "starttime",
        "endtime",
        "prompt_tokens",
        "completion_tokens",
    } <= keys


PAYLOAD = Collector(
    name="litellm",
    summary="LiteLLM StandardLoggingPayload JSON lines (logging callbacks)",
    expects="JSON objects with call_type, startTime, completionStartTime, model_parameters, "
    "prompt_tokens",
    reader="jsonl",
    readers=("jsonl", "json_array"),
    detect=detect_payload,
    select=select_payload,
)

SPEND_LOGS = Collector(
    name="litellm_spendlogs",
    summary="LiteLLM_SpendLogs table exported to CSV or JSON",
    expects="columns request_id, spend, startTime, endTime, prompt_tokens, completion_tokens",
    reader="csv",
    readers=("csv", "jsonl", "json_array"),
    detect=detect_spend_logs,
    select=select_spend_logs,
)
