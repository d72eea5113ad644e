"""Helicone request export (the @helicone/export tool, or the /v1/request/query API): JSON, JSON
lines or CSV.

One record per request (Helicone's HeliconeRequest): `request_id`, `request_created_at`,
`response_created_at` (ISO-8601), `request_body` (the OpenAI-style request: temperature, top_p,
max_tokens, messages | prompt), `response_body` (choices), `request_model` / `response_model` /
`model_override`, `prompt_tokens`, `completion_tokens`, `delay_ms` (latency),
`time_to_first_token` (ms), `response_status`, `request_user_id`, `request_properties` (custom
`Helicone-Property-*` headers). In CSV, nested objects are JSON text in their cells; bodies are
present only when the export included them (`--include-body`).

Task label: `--task-key PATH`, default the `task` (or `Task`) custom property. e2e_ms is
delay_ms, else response_created_at - request_created_at. Requests with an HTTP status >= 400
(or Helicone's 0 / -1 for no response) are rejected with their status.
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

JSON_CELLS = ("request_body", "response_body", "request_properties")


def _body(*names: str) -> tuple[str, ...]:
    return tuple(f"$.request_body.{n}" for n in names)


def select(options: Options) -> str:
    default_task = ("$.request_properties.task", "$.request_properties.Task")
    paths = {
        "request_id": ("$.request_id",),
        "start": ("$.request_created_at",),
        "end": ("$.response_created_at",),
        "delay_ms": ("$.delay_ms",),
        "ttft_ms": ("$.time_to_first_token",),
        "prompt_tokens": ("$.prompt_tokens",),
        "output_tokens": ("$.completion_tokens",),
        "temperature": _body("temperature"),
        "top_p": _body("top_p"),
        "max_tokens": _body("max_tokens", "max_completion_tokens", "max_output_tokens"),
        "model": ("$.model_override", "$.response_model", "$.request_model", "$.model"),
        "tenant": ("$.request_user_id", "$.request_properties.tenant"),
        "task": (options.task_path("request_properties.task"),)
        if options.task_key
        else default_task,
        "messages": _body("messages"),
        "prompt": _body("prompt"),
        "output": (
            "$.response_body.choices[0].message.content",
            "$.response_body.choices[0].text",
        ),
        "status": ("$.response_status",),
    }
    values, f = extract(paths, doc="d")
    status = f"TRY_CAST({f['status']} AS INTEGER)"
    return f"""
        SELECT line, raw,
               {columns(f)},
               {f["start"]} AS arrival_ts,
               {f["end"]} AS finish_ts,
               {f["ttft_ms"]} AS ttft_ms,
               coalesce(TRY_CAST({f["delay_ms"]} AS DOUBLE),
                        {ms_between(f["start"], f["end"])}) AS e2e_ms,
               coalesce({messages_text(f["messages"])}, {f["prompt"]}) AS prompt_text,
               {f["output"]} AS output_text,
               CASE WHEN {status} >= 400 OR {status} <= 0
                         THEN 'request failed with status ' || {f["status"]}
               END AS reject_reason
        FROM (SELECT line, raw, {values} AS v
              FROM (SELECT line, raw, {decoded("doc", JSON_CELLS)} AS d FROM ({document()})))
    """


def detect(sample: Sample) -> bool:
    keys = keys_of(sample)
    return {"request_id", "request_created_at"} <= keys and bool(
        {"prompt_tokens", "completion_tokens", "response_created_at"} & keys
    )


COLLECTOR = Collector(
    name="helicone",
    summary="Helicone request export (JSON, JSON lines or CSV)",
    expects="fields request_id, request_created_at and prompt_tokens/response_created_at",
    reader="json_array",
    readers=("json_array", "jsonl", "csv"),
    detect=detect,
    select=select,
)
