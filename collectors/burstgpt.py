"""BurstGPT traces (Wang et al., "BurstGPT: A Real-world Workload Dataset to Optimize LLM Serving
Systems", 2024; github.com/HPMLL/BurstGPT): Azure OpenAI GPT-3.5/GPT-4 requests over months.

Columns: Timestamp, Model, Request tokens, Response tokens, Total tokens, Log Type (release v2
adds Session ID and Elapsed time, which are read past). A row with 0 response tokens is a failed
request (the BurstGPT README says so); it is rejected with that reason, never silently dropped.

Timestamp counts seconds from the start of the trace, not from 1970: the trace has no calendar
date. It is stored as that many seconds after 1970-01-01 00:00:00 UTC, which keeps the gaps
between arrivals (all that concurrency and burstiness need) and the time of day when the trace
starts at midnight; the date itself means nothing.
"""

from __future__ import annotations

from collectors.base import Collector, Options, Sample

COLUMNS = ("Timestamp", "Model", "Request tokens", "Response tokens", "Log Type")


def detect(sample: Sample) -> bool:
    return sample.kind in ("csv", "parquet") and sample.has_columns(*COLUMNS)


def select(options: Options) -> str:
    return """
        SELECT line,
               concat_ws(',', "Timestamp", "Model", "Request tokens", "Response tokens",
                         "Log Type") AS raw,
               "Timestamp" AS arrival_ts,
               "Request tokens" AS prompt_tokens,
               "Response tokens" AS output_tokens,
               "Model" AS model,
               "Log Type" AS tenant,
               CASE WHEN TRY_CAST("Response tokens" AS DOUBLE) = 0
                    THEN 'failed request (0 response tokens)' END AS reject_reason
        FROM src
    """


COLLECTOR = Collector(
    name="burstgpt",
    summary="BurstGPT trace CSV: arrivals (seconds from trace start), model, token counts; "
    "failed requests (0 response tokens) go to rejects",
    expects="CSV columns Timestamp, Model, Request tokens, Response tokens, Log Type",
    reader="csv",
    readers=("csv", "parquet"),
    detect=detect,
    select=select,
)
