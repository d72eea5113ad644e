"""Typing and validating a collector's raw columns, once for every format.

Each normalized field has a kind; the SQL here turns the collector's raw value into that type
and, when it cannot, writes a reject reason naming the field, the value and what was expected.
The first failing check of a row is its reason.
"""

from __future__ import annotations

from dataclasses import dataclass

from collectors.base import FIELDS


@dataclass(frozen=True)
class Count:
    """A non-negative integer up to `maximum`."""

    maximum: int


@dataclass(frozen=True)
class Number:
    """A float within [low, high]."""

    low: float
    high: float


class Text:
    """Free text; empty strings become NULL."""


class Time:
    """An instant: epoch seconds/ms/us/ns (by magnitude) or an ISO-8601 string, stored as UTC."""


# 10M tokens is beyond every context window shipped to date; larger counts are logging errors.
KINDS: dict[str, Count | Number | type[Text] | type[Time]] = {
    "request_id": Text,
    "arrival_ts": Time,
    "finish_ts": Time,
    "prompt_tokens": Count(10_000_000),
    "output_tokens": Count(10_000_000),
    "temperature": Number(0.0, 5.0),
    "top_p": Number(0.0, 1.0),
    "max_tokens": Count(10_000_000),
    "task": Text,
    "model": Text,
    "tenant": Text,
    "concurrency": Count(1_000_000),
    "ttft_ms": Number(0.0, 86_400_000.0),
    "e2e_ms": Number(0.0, 86_400_000.0),
    "prompt_text": Text,
    "output_text": Text,
}
assert tuple(KINDS) == FIELDS


# "A helpful rule of thumb is that one token generally corresponds to ~4 characters of text for
# common English text" (OpenAI Help Center, "What are tokens and how to count them?"). Used only
# for formats that carry text but no token counts (ShareGPT, Spec-Bench).
CHARS_PER_TOKEN = 4


def estimated_tokens(text_sql: str) -> str:
    """SQL estimating the token count of a text expression from its length in characters."""
    return f"CAST(ceil(length({text_sql}) / {CHARS_PER_TOKEN}.0) AS BIGINT)"


def _q(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _epoch(num: str) -> str:
    """Epoch number to TIMESTAMP, telling seconds, ms, us and ns apart by magnitude."""
    return (
        f"CASE WHEN {num} IS NULL THEN NULL"
        f" WHEN abs({num}) >= 1e17 THEN make_timestamp(CAST({num} / 1000 AS BIGINT))"
        f" WHEN abs({num}) >= 1e14 THEN make_timestamp(CAST({num} AS BIGINT))"
        f" WHEN abs({num}) >= 1e11 THEN make_timestamp(CAST({num} * 1000 AS BIGINT))"
        f" ELSE make_timestamp(CAST({num} * 1000000 AS BIGINT)) END"
    )


def _raw(name: str) -> str:
    """The collector's raw value of `name`, as trimmed text (NULL when blank)."""
    return f"NULLIF(trim(CAST(c.{_q(name)} AS VARCHAR)), '')"


def typed_expr(name: str, column_type: str | None) -> str:
    """SQL for the typed value of field `name` from collector column `c.<name>` of `column_type`."""
    if column_type is None:
        return "NULL"
    kind = KINDS[name]
    raw = _raw(name)
    if kind is Text:
        return raw
    if kind is Time:
        if column_type.startswith("TIMESTAMP"):
            return f"CAST(c.{_q(name)} AS TIMESTAMP)"
        return (
            f"COALESCE({_epoch(f'TRY_CAST({raw} AS DOUBLE)')},"
            f" CAST(TRY_CAST({raw} AS TIMESTAMPTZ) AS TIMESTAMP))"
        )
    return f"TRY_CAST({raw} AS DOUBLE)"


def reason_branches(name: str, column_type: str | None, required: bool) -> list[str]:
    """CASE branches (WHEN ... THEN ...) that reject a bad value of field `name`."""
    if column_type is None:
        return [f"WHEN true THEN '{name} is missing'"] if required else []
    raw = f"v.{_q('raw__' + name)}"
    shown = f"left({raw}, 40)"
    value = f"v.{_q(name)}"
    quoted = f"'{name} ''' || {shown} || '''"
    branches = [f"WHEN {raw} IS NULL THEN '{name} is missing'"] if required else []
    kind = KINDS[name]
    if kind is Time:
        branches.append(
            f"WHEN {raw} IS NOT NULL AND {value} IS NULL THEN "
            f"{quoted} is not a timestamp (expected ISO-8601 or epoch)'"
        )
    elif isinstance(kind, Count | Number):
        low, high = (0, kind.maximum) if isinstance(kind, Count) else (kind.low, kind.high)
        plain = f"'{name} ' || {shown} || '"
        branches += [
            f"WHEN {raw} IS NOT NULL AND {value} IS NULL THEN {quoted} is not a number'",
            f"WHEN {value} < {low} THEN {plain} is below {low:g}'",
            f"WHEN {value} > {high} THEN {plain} is above the plausible maximum {high:g}'",
        ]
        if isinstance(kind, Count):
            branches.append(f"WHEN {value} <> floor({value}) THEN {plain} is not a whole number'")
    return branches


def normalized_sql(
    collector_sql: str, columns: dict[str, str], required: tuple[str, ...], json_lines: bool
) -> str:
    """The staging SELECT: `line`, `raw`, every typed FIELD and `reject_reason`.

    `columns` maps the collector SELECT's column names to their DuckDB types.
    """
    present = [n for n in FIELDS if n in columns]
    raw = "CAST(c.raw AS VARCHAR)" if "raw" in columns else "NULL"
    cols = ["c.line AS line", f"{raw} AS raw"]
    cols += [f"{_raw(n)} AS {_q('raw__' + n)}" for n in present]
    cols += [f"{typed_expr(n, columns.get(n))} AS {_q(n)}" for n in FIELDS]
    branches = []
    if json_lines:
        branches.append(
            "WHEN NOT json_valid(v.raw) THEN 'line is not valid JSON (truncated or corrupt)'"
        )
    if "reject_reason" in columns:
        cols.append("c.reject_reason AS collector_reason")
        branches.append("WHEN v.collector_reason IS NOT NULL THEN v.collector_reason")
    for n in FIELDS:
        branches.extend(reason_branches(n, columns.get(n), n in required))
    branches.append("WHEN v.finish_ts < v.arrival_ts THEN 'finish_ts is before arrival_ts'")
    outputs = [
        f"CAST(round(v.{_q(n)}) AS BIGINT) AS {_q(n)}"
        if isinstance(KINDS[n], Count)
        else f"v.{_q(n)}"
        for n in FIELDS
    ]
    sep = ",\n    "
    return (
        f"WITH c AS ({collector_sql}),\n"
        f"v AS (SELECT {sep.join(cols)} FROM c)\n"
        f"SELECT v.line, v.raw, {', '.join(outputs)},\n"
        f"  CASE {' '.join(branches)} ELSE NULL END AS reject_reason\n"
        "FROM v"
    )
