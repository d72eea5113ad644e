"""Langfuse generation observations, exported as JSON (array), JSON lines or CSV.

One record per observation, as the Langfuse UI export and the public observations API give it:
`id`, `traceId`, `type` (GENERATION), `name`, `startTime`, `completionStartTime`, `endTime`
(ISO-8601), `model`, `modelParameters` ({temperature, top_p, max_tokens | maxTokens}), `usage`
({input, output, total, unit}; older SDKs: promptTokens / completionTokens) or `usageDetails`
({input, output}) or top-level `promptTokens` / `completionTokens`, `input` (chat messages or
text), `output` (a message, or text), `metadata`, `level` (ERROR for failed calls),
`statusMessage`, `latency` / `timeToFirstToken` (seconds). The snake_case export of Langfuse v3
(trace_id, start_time, completion_start_time, model_parameters, usage_details) is read too. In CSV,
nested objects are JSON text in their cells.

Task label: `--task-key PATH` (default `metadata.task`; e.g. `name` for the generation's name).
ttft_ms is completionStartTime - startTime (else timeToFirstToken); e2e_ms is endTime - startTime
(else latency). Non-generation observations (SPAN, EVENT) and ERROR-level generations are rejected
with that reason.
"""

from __future__ import annotations

from collectors.base import Collector, Options, Sample
from collectors.jsonsql import (
    columns,
    decoded,
    document,
    extract,
    keys_of,
    messages_text,
    ms_between,
)

JSON_CELLS = ("modelParameters", "model_parameters", "usage", "usageDetails", "usage_details",
              "metadata", "input", "output")  # fmt: skip
PARAMS = ("$.modelParameters", "$.model_parameters")
USAGE = ("$.usageDetails", "$.usage_details", "$.usage")


def _under(prefixes: tuple[str, ...], *names: str) -> tuple[str, ...]:
    return tuple(f"{p}.{n}" for n in names for p in prefixes)


def select(options: Options) -> str:
    paths = {
        "request_id": ("$.id",),
        "type": ("$.type",),
        "start": ("$.startTime", "$.start_time"),
        "first": ("$.completionStartTime", "$.completion_start_time"),
        "end": ("$.endTime", "$.end_time"),
        "latency_s": ("$.latency",),
        "ttft_s": ("$.timeToFirstToken", "$.time_to_first_token"),
        "prompt_tokens": (
            *_under(USAGE, "input", "promptTokens", "prompt_tokens"),
            *("$.promptTokens", "$.inputUsage", "$.prompt_tokens"),
        ),
        "output_tokens": (
            *_under(USAGE, "output", "completionTokens", "completion_tokens"),
            *("$.completionTokens", "$.outputUsage", "$.completion_tokens"),
        ),
        "temperature": _under(PARAMS, "temperature"),
        "top_p": _under(PARAMS, "top_p", "topP"),
        "max_tokens": _under(PARAMS, "max_tokens", "maxTokens", "max_completion_tokens"),
        "model": ("$.model", "$.providedModelName", "$.provided_model_name"),
        "tenant": ("$.metadata.tenant", "$.userId", "$.user_id"),
        "task": (options.task_path("metadata.task"),),
        "input": ("$.input.messages", "$.input"),
        "output": ("$.output.content", "$.output.choices[0].message.content", "$.output"),
        "level": ("$.level",),
        "status_message": ("$.statusMessage", "$.status_message"),
    }
    values, f = extract(paths, doc="d")
    start, first, end = f["start"], f["first"], f["end"]
    return f"""
        SELECT line, raw,
               {columns(f)},
               {start} AS arrival_ts,
               {end} AS finish_ts,
               coalesce({ms_between(start, first)},
                        TRY_CAST({f["ttft_s"]} AS DOUBLE) * 1000) AS ttft_ms,
               coalesce({ms_between(start, end)},
                        TRY_CAST({f["latency_s"]} AS DOUBLE) * 1000) AS e2e_ms,
               {messages_text(f["input"])} AS prompt_text,
               {messages_text(f["output"])} AS output_text,
               CASE WHEN upper({f["type"]}) <> 'GENERATION'
                         THEN 'observation type ' || {f["type"]} || ' is not a generation'
                    WHEN upper({f["level"]}) = 'ERROR'
                         THEN 'generation failed: '
                              || left(coalesce({f["status_message"]}, 'level ERROR'), 200)
               END AS reject_reason
        FROM (SELECT line, raw, {values} AS v
              FROM (SELECT line, raw, {decoded("doc", JSON_CELLS)} AS d FROM ({document()})))
    """


def detect(sample: Sample) -> bool:
    keys = keys_of(sample)
    ids = {"traceId", "startTime"} <= keys or {"trace_id", "start_time"} <= keys
    generation = {"completionStartTime", "completion_start_time", "modelParameters",
                  "model_parameters", "usageDetails", "usage_details", "promptTokens"}  # fmt: skip
    return ids and bool(generation & keys) and "call_type" not in keys


COLLECTOR = Collector(
    name="langfuse",
    summary="Langfuse generation observations export (JSON, JSON lines or CSV)",
    expects="fields traceId, startTime and completionStartTime/modelParameters/usageDetails",
    reader="json_array",
    readers=("json_array", "jsonl", "csv"),
    detect=detect,
    select=select,
)
