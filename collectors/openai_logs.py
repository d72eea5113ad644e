"""OpenAI-compatible request/response logs, one JSON object per line (chat and text completions).

Three line shapes are read, told apart per line by which paths exist:

1. A gateway/app log that wraps both sides of the call (the most common in-house format)::

     {"request_id": "r-1", "start_time": "2024-05-01T10:00:00.120Z",
      "end_time": "2024-05-01T10:00:02.410Z", "ttft_ms": 180.5,
      "request": {"model": "...", "messages": [...] | "prompt": "...",
                  "temperature": 0.2, "top_p": 0.9, "max_tokens": 512},
      "response": {"id": "chatcmpl-...", "object": "chat.completion", "created": 1714557600,
                   "model": "...", "choices": [...], "usage": {"prompt_tokens": 812,
                   "completion_tokens": 95}},
      "metadata": {"task": "code", "tenant": "search-team"}}

   Aliases: `request.body` / `body` for the request; `request_ts` / `timestamp` / `created_at`
   for the start and `response_ts` for the end (ISO-8601 or epoch s/ms/us); `latency_ms` /
   `duration_ms` for the end-to-end time (else end - start); `ttft_ms` /
   `time_to_first_token_ms` or a `first_token_time` instant for the time to first token.
2. An OpenAI Batch API output line: `{"custom_id": ..., "response": {"status_code": 200,
   "body": {...completion...}}, "error": null}` (sampling parameters live in the batch input
   file, so temperature etc. stay empty).
3. A bare completion object per line (`{"object": "chat.completion", "usage": ..., ...}`).

Detection needs one of these three in the first lines: a `request` (or `body`) object beside a
completion `response`, a `custom_id` line with a completion `response.body`, or a bare completion.

Responses API objects (`"object": "response"`, `/v1/responses`) are read in all three shapes:
usage.input_tokens / output_tokens, max_output_tokens, `input` (text or items), and the text of
the `output` message items (reasoning items skipped).

The arrival is the logged start, else the response's `created` / `created_at` (epoch
seconds). The task label is read from `--task-key` (default `metadata.task`), a path into the
whole line. Prompt text is the messages' contents (text parts joined) or `prompt` / `input`
(a list of several prompts gives none); output text is choices[0]'s message content or text.
A line whose call failed (`error` set or HTTP status >= 400) is rejected with the error. A
missing temperature is left empty, not assumed to be the server default.
"""

from __future__ import annotations

from collectors.base import Collector, Options, Sample
from collectors.jsonsql import columns, extract, messages_text, ms_between, records

REQUEST = ("$.request", "$.request.body", "$.body")
RESPONSE = ("$.response", "$.response.body", "$")
COMPLETION_OBJECTS = {"chat.completion", "text_completion", "response"}


def _under(prefixes: tuple[str, ...], *suffixes: str) -> tuple[str, ...]:
    return tuple(p + s for s in suffixes for p in prefixes)


def _is_completion(value: object) -> bool:
    return isinstance(value, dict) and (
        value.get("object") in COMPLETION_OBJECTS
        or (
            isinstance(value.get("usage"), dict)
            and bool({"prompt_tokens", "input_tokens"} & set(value["usage"]))
        )
        or ("choices" in value and "id" in value)
    )


def _is_log_line(record: dict) -> bool:
    """A request + response pair, a Batch API output line, or a bare completion object.

    A completion under `response` alone is not enough: LiteLLM's payload has one too.
    """
    response = record.get("response")
    request = record.get("request", record.get("body"))
    if isinstance(response, dict):
        if _is_completion(response.get("body")) and "custom_id" in record:
            return True
        if isinstance(request, dict) and (_is_completion(response) or "error" in response):
            return True
    return record.get("object") in COMPLETION_OBJECTS and bool({"choices", "output"} & set(record))


def detect(sample: Sample) -> bool:
    return any(_is_log_line(r) for r in records(sample))


def select(options: Options) -> str:
    paths = {
        "request_id": ("$.request_id", "$.custom_id", "$.id", "$.response.id"),
        "start": ("$.start_time", "$.request_ts", "$.timestamp", "$.created_at"),
        "created": _under(RESPONSE, ".created", ".created_at"),
        "end": ("$.end_time", "$.response_ts"),
        "first_token": ("$.first_token_time",),
        "ttft_ms": ("$.ttft_ms", "$.time_to_first_token_ms"),
        "e2e_ms": ("$.latency_ms", "$.duration_ms"),
        "prompt_tokens": _under(RESPONSE, ".usage.prompt_tokens", ".usage.input_tokens"),
        "output_tokens": _under(RESPONSE, ".usage.completion_tokens", ".usage.output_tokens"),
        "temperature": _under(REQUEST, ".temperature"),
        "top_p": _under(REQUEST, ".top_p"),
        "max_tokens": _under(
            REQUEST, ".max_tokens", ".max_completion_tokens", ".max_output_tokens"
        ),
        "model": _under(RESPONSE, ".model") + _under(REQUEST, ".model"),
        "tenant": ("$.metadata.tenant", *_under(REQUEST, ".user")),
        "task": (options.task_path("metadata.task"),),
        "messages": _under(REQUEST, ".messages"),
        "prompt": _under(REQUEST, ".prompt", ".input"),
        "output": _under(RESPONSE, ".choices[0].message.content", ".choices[0].text"),
        "output_items": _under(RESPONSE, ".output"),
        "error": (
            "$.error.message",
            "$.response.error.message",
            "$.response.body.error.message",
            "$.error",
            "$.response.error",
        ),
        "status": ("$.response.status_code", "$.status_code"),
    }
    values, f = extract(paths)
    start = f"coalesce({f['start']}, {f['created']})"
    return f"""
        SELECT line, raw,
               {columns(f)},
               {start} AS arrival_ts,
               {f["end"]} AS finish_ts,
               coalesce(TRY_CAST({f["ttft_ms"]} AS DOUBLE),
                        {ms_between(start, f["first_token"])}) AS ttft_ms,
               coalesce(TRY_CAST({f["e2e_ms"]} AS DOUBLE), {ms_between(start, f["end"])}) AS e2e_ms,
               coalesce({messages_text(f["messages"])},
                        {messages_text(f["prompt"])}) AS prompt_text,
               coalesce({f["output"]}, {messages_text(f["output_items"])}) AS output_text,
               CASE WHEN {f["error"]} IS NOT NULL
                         THEN 'request failed: ' || left({f["error"]}, 200)
                    WHEN TRY_CAST({f["status"]} AS INTEGER) >= 400
                         THEN 'request failed with HTTP status ' || {f["status"]}
                    WHEN {f["prompt_tokens"]} IS NULL AND {f["output_tokens"]} IS NULL
                         THEN 'response has no token usage'
                              || ' (a stream logged without stream_options.include_usage?)'
               END AS reject_reason
        FROM (SELECT line, raw, CASE WHEN json_valid(raw) THEN {values} END AS v FROM src)
    """


COLLECTOR = Collector(
    name="openai",
    summary="OpenAI-compatible request/response JSONL logs (chat and text completions)",
    expects="JSON lines holding a request beside its completion response, an OpenAI Batch "
    "output line, or a bare chat.completion/text_completion object",
    reader="jsonl",
    detect=detect,
    select=select,
)
