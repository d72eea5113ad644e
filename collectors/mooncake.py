"""Mooncake traces (Qin et al., "Mooncake: A KVCache-centric Disaggregated Architecture for LLM
Serving", FAST 2025; github.com/kvcache-ai/Mooncake, FAST25-release/traces).

JSON lines: timestamp (arrival, milliseconds since the first request), input_length and
output_length (tokens), hash_ids (one id per 512-token prompt block; shared ids mean a shared
prefix). hash_ids are not stored: the requests table has no prefix column.

Like BurstGPT, the timestamps are relative: they are stored as that many milliseconds after
1970-01-01 00:00:00 UTC, which keeps the gaps between arrivals; the date means nothing.
"""

from __future__ import annotations

from collectors.base import Collector, Options, Sample


def detect(sample: Sample) -> bool:
    record = sample.first_record or {}
    return (
        sample.kind == "jsonl"
        and sample.has_columns("input_length", "output_length")
        and ("hash_ids" in record or "timestamp" in record)
    )


def select(options: Options) -> str:
    # One JSON parse per line for all three fields; try() leaves a truncated line's fields NULL
    # (the normalizer rejects it as invalid JSON).
    return """
        SELECT line, raw,
               CASE WHEN ms IS NULL THEN j[1] ELSE CAST(ms / 1000 AS VARCHAR) END AS arrival_ts,
               j[2] AS prompt_tokens,
               j[3] AS output_tokens,
               CASE WHEN ms < 0 THEN 'timestamp ' || j[1] || ' is negative (expected milliseconds'
                    || ' since the first request)' END AS reject_reason
        FROM (
            SELECT line, raw, j, TRY_CAST(j[1] AS DOUBLE) AS ms
            FROM (
                SELECT line, raw,
                       try(json_extract_string(
                           raw, ['$.timestamp', '$.input_length', '$.output_length'])) AS j
                FROM src
            )
        )
    """


COLLECTOR = Collector(
    name="mooncake",
    summary="Mooncake / FAST'25 trace JSONL: arrivals (ms from trace start) and token counts",
    expects="JSON lines with timestamp, input_length, output_length (and hash_ids)",
    reader="jsonl",
    detect=detect,
    select=select,
)
