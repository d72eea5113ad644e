"""SQL building blocks shared by the JSON-shaped log collectors (OpenAI, LiteLLM, Langfuse, ...).

Why a module: these formats nest the same facts under several alternative paths. `extract`
pulls all of them with ONE `json_extract_string(doc, [paths])` call, which parses each line once
(about 10x faster than one call per path on 200k-line logs), then coalesces the alternatives.
`document` gives one JSON value per row whatever reader produced `src` (JSON lines, a JSON array
or a CSV whose cells hold JSON text), so a multi-reader collector needs one SELECT only.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from collectors.base import Sample
from collectors.reading import sql_str


def extract(fields: Mapping[str, Sequence[str]], doc: str = "raw") -> tuple[str, dict[str, str]]:
    """(`json_extract_string(doc, [...])`, {field: coalesce over `v[i]`}) for alternative paths.

    The first SQL goes into a CTE as column `v`; each field's SQL reads the first non-null path.
    """
    paths: list[str] = []
    for alternatives in fields.values():
        for path in alternatives:
            if path not in paths:
                paths.append(path)
    listing = "[" + ", ".join(sql_str(p) for p in paths) + "]"
    exprs = {}
    for name, alternatives in fields.items():
        picks = [f"v[{paths.index(p) + 1}]" for p in alternatives]
        exprs[name] = picks[0] if len(picks) == 1 else f"coalesce({', '.join(picks)})"
    return f"json_extract_string({doc}, {listing})", exprs


# Fields that JSON collectors take as found: the extracted path, under the field's own name.
AS_FOUND = (
    "request_id", "prompt_tokens", "output_tokens", "temperature", "top_p", "max_tokens",
    "task", "model", "tenant",
)  # fmt: skip


def columns(found: Mapping[str, str], **computed: str) -> str:
    """The SELECT list `expr AS field`: each AS_FOUND field from `found` (the second value of
    `extract`), then the fields the collector computes (`computed` overrides `found`)."""
    exprs = {name: found[name] for name in AS_FOUND if name in found and name not in computed}
    exprs.update(computed)
    return ",\n".join(f"{expr} AS {name}" for name, expr in exprs.items())


def document() -> str:
    """SELECT over `src` giving `line`, `raw` (text) and `doc` (JSON, NULL when unparseable).

    JSON lines arrive as text in `raw`, JSON arrays as JSON in `raw`, CSV rows as columns: the row
    becomes a JSON object of its cells (nested JSON cells are decoded by `json_cell`).
    """
    return """
        SELECT line,
               coalesce(r ->> '$.raw', CAST(r AS VARCHAR)) AS raw,
               CASE WHEN json_type(r, '$.raw') = 'OBJECT' THEN r -> '$.raw'
                    WHEN json_type(r, '$.raw') = 'VARCHAR' THEN
                         CASE WHEN json_valid(r ->> '$.raw') THEN CAST(r ->> '$.raw' AS JSON) END
                    WHEN (r -> '$.raw') IS NULL THEN r END AS doc
        FROM (SELECT line, to_json(src) AS r FROM src)
    """


def json_cell(text: str) -> str:
    """A JSON value that may itself be JSON-encoded text (a CSV cell, a stringified dict)."""
    return f"CASE WHEN json_valid({text}) THEN CAST({text} AS JSON) END"


def decoded(doc: str, keys: Sequence[str]) -> str:
    """`doc` with the named members parsed when they hold JSON text (CSV cells, stringified JSON).

    A member that is already an object, or plain text that is not JSON, stays as it is.
    """
    pairs = []
    for key in keys:
        path = sql_str("$." + key)
        parsed = json_cell(f"({doc} ->> {path})")
        pairs.append(f"{sql_str(key)}, coalesce({parsed}, {doc} -> {path})")
    return f"json_merge_patch({doc}, json_object({', '.join(pairs)}))"


def instant(text: str) -> str:
    """TIMESTAMP (UTC) from epoch seconds/ms/us (told apart by magnitude) or ISO-8601 text."""
    num = f"TRY_CAST({text} AS DOUBLE)"
    return (
        f"CASE WHEN {num} IS NULL THEN CAST(TRY_CAST({text} AS TIMESTAMPTZ) AS TIMESTAMP)"
        f" WHEN abs({num}) >= 1e14 THEN make_timestamp(CAST({num} AS BIGINT))"
        f" WHEN abs({num}) >= 1e11 THEN make_timestamp(CAST({num} * 1000 AS BIGINT))"
        f" ELSE make_timestamp(CAST({num} * 1000000 AS BIGINT)) END"
    )


def ms_between(start: str, end: str) -> str:
    """Milliseconds from instant `start` to instant `end` (raw texts), NULL when either is."""
    return f"(epoch_us({instant(end)}) - epoch_us({instant(start)})) / 1000.0"


def messages_text(messages: str) -> str:
    """Chat messages (JSON text) as one string: each content, text parts joined, one per line.

    Plain text passes through; other JSON (an empty `{}` placeholder) gives NULL. Cheap checks
    (first character, then json_valid) come first: this runs on every row of multi-GB logs.
    """
    parts = (
        "lambda c: CASE WHEN starts_with(c, '[') AND json_valid(c)"
        " THEN array_to_string(json_extract_string(c, '$[*].text'), '') ELSE c END"
    )
    return (
        f"CASE WHEN starts_with({messages}, '[') AND json_valid({messages}) THEN"
        f" array_to_string(list_transform(json_extract_string({messages}, '$[*].content'),"
        f" {parts}), chr(10))"
        f" WHEN starts_with({messages}, '{{') AND json_valid({messages}) THEN NULL"
        f" ELSE {messages} END"
    )


def records(sample: Sample, limit: int = 20) -> list[dict[str, Any]]:
    """The JSON objects among the sample's first lines (or its first array element).

    Detection looks at several records so that one truncated or failed first line does not hide
    the format.
    """
    if sample.kind == "json_array":
        return [sample.first_record] if sample.first_record else []
    if sample.kind != "jsonl":
        return []
    found = []
    for line in sample.lines[:limit]:
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict):
            found.append(value)
    return found


def keys_of(sample: Sample) -> set[str]:
    """Top-level keys of the first JSON records, or the CSV/Parquet header."""
    keys = set(sample.columns)
    for record in records(sample):
        keys |= set(record)
    return keys
