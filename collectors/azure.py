"""Azure LLM inference traces (Azure Public Dataset, 2023 and 2024 releases).

Columns: TIMESTAMP (arrival, `YYYY-MM-DD HH:MM:SS.fffffff`, UTC), ContextTokens, GeneratedTokens.
Arrivals only: no finish time, text, temperature or task label. Splitwise (Patel et al., ISCA 2024).
"""

from __future__ import annotations

from collectors.base import Collector, Options, Sample

COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")


def detect(sample: Sample) -> bool:
    return sample.kind in ("csv", "parquet") and sample.has_columns(*COLUMNS)


def select(options: Options) -> str:
    # 7 fractional digits exceed TIMESTAMP's microseconds; DuckDB's cast rounds them away.
    return """
        SELECT line,
               concat_ws(',', "TIMESTAMP", "ContextTokens", "GeneratedTokens") AS raw,
               "TIMESTAMP" AS arrival_ts,
               "ContextTokens" AS prompt_tokens,
               "GeneratedTokens" AS output_tokens
        FROM src
    """


COLLECTOR = Collector(
    name="azure",
    summary="Azure LLM inference trace CSV (2023/2024): arrivals and token counts",
    expects="CSV columns TIMESTAMP, ContextTokens, GeneratedTokens",
    reader="csv",
    readers=("csv", "parquet"),
    detect=detect,
    select=select,
)
