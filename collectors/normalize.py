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


_NUMERIC = (
    "TINYINT", "SMALLINT", "INTEGER", "BIGINT", "HUGEINT", "UTINYINT", "USMALLINT", "UINTEGER",
    "UBIGINT", "UHUGEINT", "FLOAT", "DOUBLE", "DECIMAL",
)  # fmt: skip


def _is_numeric(column_type: str) -> bool:
    return column_type.startswith(_NUMERIC)


def _is_typed(column_type: str) -> bool:
    """A number or an instant already: nothing to trim or parse."""
    return _is_numeric(column_type) or column_type.startswith("TIMESTAMP")


def _epoch(num: str) -> str:
    """Epoch number to TIMESTAMP, telling seconds, ms, us and ns apart by magnitude."""
    return (
        f"CASE WHEN abs({num}) >= 1e17 THEN make_timestamp(CAST({num} / 1000 AS BIGINT))"
        f" WHEN abs({num}) >= 1e14 THEN make_timestamp(CAST({num} AS BIGINT))"
        f" WHEN abs({num}) >= 1e11 THEN make_timestamp(CAST({num} * 1000 AS BIGINT))"
        f" ELSE make_timestamp(CAST({num} * 1000000 AS BIGINT)) END"
    )


# Prompt and output text are replayed as logged: leading indentation and newlines are content.
VERBATIM = frozenset({"prompt_text", "output_text"})


def _raw_expr(name: str, column_type: str) -> str:
    """The collector's value of `name` as it came: text trimmed (NULL when blank; prompt and
    output text only NULL when empty), else as is."""
    col = f"c.{_q(name)}"
    if _is_typed(column_type):
        return col
    if name in VERBATIM:
        return f"NULLIF(CAST({col} AS VARCHAR), '')"
    return f"NULLIF(trim(CAST({col} AS VARCHAR)), '')"


def _number_expr(name: str, column_type: str) -> str:
    """The value as DOUBLE (NULL when it is not a number), from the raw layer."""
    raw = f"r.{_q('raw__' + name)}"
    if _is_numeric(column_type):
        return f"CAST({raw} AS DOUBLE)"
    if KINDS[name] is Time:
        # Epoch numbers never hold ':', ISO-8601 times always do: skip the doomed number parse.
        return f"CASE WHEN contains({raw}, ':') THEN NULL ELSE TRY_CAST({raw} AS DOUBLE) END"
    return f"TRY_CAST({raw} AS DOUBLE)"


def _has_number(name: str, column_type: str) -> bool:
    return KINDS[name] is not Text and not column_type.startswith("TIMESTAMP")


def _typed_expr(name: str, column_type: str) -> str:
    """The typed value of field `name` from the number layer (`n.raw__x`, `n.num__x`)."""
    kind = KINDS[name]
    raw = f"n.{_q('raw__' + name)}"
    num = f"n.{_q('num__' + name)}"
    if kind is Text:
        return raw if column_type.startswith("VARCHAR") else f"CAST({raw} AS VARCHAR)"
    if kind is not Time:
        return num
    if column_type.startswith("TIMESTAMP"):
        return f"CAST({raw} AS TIMESTAMP)"
    if _is_numeric(column_type):
        return _epoch(num)
    # Only what is not a number is parsed as ISO-8601 text: one parse per value, not two.
    text_ts = f"CAST(TRY_CAST({raw} AS TIMESTAMPTZ) AS TIMESTAMP)"
    return f"CASE WHEN {num} IS NULL THEN {text_ts} ELSE {_epoch(num)} END"


def reason_branches(name: str, column_type: str | None, required: bool) -> list[str]:
    """CASE branches (WHEN ... THEN ...) that reject a bad value of field `name`."""
    if column_type is None:
        return [f"WHEN true THEN '{name} is missing'"] if required else []
    raw = f"v.{_q('raw__' + name)}"
    shown = f"left(CAST({raw} AS VARCHAR), 40)"
    value = f"v.{_q(name)}"
    quoted = f"'{name} ''' || {shown} || '''"
    branches = [f"WHEN {raw} IS NULL THEN '{name} is missing'"] if required else []
    kind = KINDS[name]
    parsed = not _is_typed(column_type)
    if kind is Time and parsed:
        branches.append(
            f"WHEN {raw} IS NOT NULL AND {value} IS NULL THEN "
            f"{quoted} is not a timestamp (expected ISO-8601 or epoch)'"
        )
    elif isinstance(kind, Count | Number):
        low, high = (0, kind.maximum) if isinstance(kind, Count) else (kind.low, kind.high)
        plain = f"'{name} ' || {shown} || '"
        if parsed:
            branches.append(
                f"WHEN {raw} IS NOT NULL AND {value} IS NULL THEN {quoted} is not a number'"
            )
        branches += [
            f"WHEN {value} < {low} THEN {plain} is below {low:g}'",
            f"WHEN {value} > {high} THEN {plain} is above the plausible maximum {high:g}'",
        ]
        if isinstance(kind, Count):
            branches.append(f"WHEN {value} <> floor({value}) THEN {plain} is not a whole number'")
    return branches


def normalized_sql(
    collector_sql: str,
    columns: dict[str, str],
    required: tuple[str, ...],
    json_lines: bool,
    store_text: bool = False,
) -> tuple[str, list[str]]:
    """The staging SELECT and the FIELDS it yields (those the collector gives, typed).

    Its columns: `line`, `raw` (rejected rows only), those fields, and `reject_reason`; fields
    the collector lacks are left out rather than carried as NULL columns.

    `columns` maps the collector SELECT's column names to their DuckDB types. In layers (r: raw
    text, n: numbers, v: typed, w: reason) each value is trimmed once, cast to a number once and
    parsed as a timestamp at most once. Text fields stay NULL unless `store_text`, so DuckDB
    never computes them; the raw line is kept for rejected rows only. Whether a JSON line parses
    is asked only of rows already rejected: a corrupt line yields no fields, so it is among them.
    """
    skipped = set() if store_text else {"prompt_text", "output_text"}
    present = {n: columns[n] for n in FIELDS if n in columns and n not in skipped}
    raw = "CAST(c.raw AS VARCHAR)" if "raw" in columns else "CAST(NULL AS VARCHAR)"
    own = "reject_reason" in columns
    raws = "".join(f", {_raw_expr(n, t)} AS {_q('raw__' + n)}" for n, t in present.items())
    nums = "".join(
        f", {_number_expr(n, t)} AS {_q('num__' + n)}"
        for n, t in present.items()
        if _has_number(n, t)
    )
    carried = ["n.line", "n.raw"] + (["n.collector_reason"] if own else [])
    carried += [f"n.{_q('raw__' + n)}" for n in present]
    typed = [f"{_typed_expr(n, t)} AS {_q(n)}" for n, t in present.items()]
    branches = ["WHEN v.collector_reason IS NOT NULL THEN v.collector_reason"] if own else []
    for n in FIELDS:
        branches.extend(reason_branches(n, present.get(n), n in required))
    if "arrival_ts" in present and "finish_ts" in present:
        branches.append("WHEN v.finish_ts < v.arrival_ts THEN 'finish_ts is before arrival_ts'")
    reason = f"CASE {' '.join(branches)} ELSE NULL END"
    final = "w.reason"
    if json_lines:
        final = (
            "CASE WHEN w.reason IS NOT NULL AND NOT json_valid(w.raw)"
            " THEN 'line is not valid JSON (truncated or corrupt)' ELSE w.reason END"
        )
    outputs = [
        f"CAST(round(w.{_q(n)}) AS BIGINT) AS {_q(n)}"
        if isinstance(KINDS[n], Count)
        else f"w.{_q(n)}"
        for n in present
    ]
    collector_reason = ", c.reject_reason AS collector_reason" if own else ""
    sep = ",\n    "
    final_cols = [
        "w.line",
        "CASE WHEN w.reason IS NOT NULL THEN left(w.raw, 500) END AS raw",
        *outputs,
        f"{final} AS reject_reason",
    ]
    sql = (
        f"WITH c AS ({collector_sql}),\n"
        f"r AS (SELECT c.line, {raw} AS raw{collector_reason}{raws} FROM c),\n"
        f"n AS (SELECT r.*{nums} FROM r),\n"
        f"v AS (SELECT {sep.join(carried + typed)} FROM n),\n"
        f"w AS (SELECT v.*, {reason} AS reason FROM v)\n"
        f"SELECT {', '.join(final_cols)} FROM w"
    )
    return sql, list(present)
