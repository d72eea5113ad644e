"""Which logged requests to replay, and when a segment has been measured enough.

Draw: per segment of advisor.segments (the scoped rows and the `advisor_segment_map` table that
`segment()` leaves on the connection), a random order stratified by prompt-length quartile,
so that any prefix of it is a stratified sample. Sequential rule: replay a segment in rounds;
it stops when the 95% intervals on acceptance and on speedup are narrower than the precision
asked for, or at its request/minute budget. Each round's requests go to the segments whose
intervals are furthest from the target, so GPU time goes where the uncertainty is.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

import duckdb
from pydantic import BaseModel, Field

from advisor.errors import AdvisorError
from advisor.schemas import SegmentStats
from advisor.segments import (
    SCOPE,
    UNLABELLED,
    Bands,
    band_index_sql,
    band_label,
    merge_cells,
)
from advisor.store import scalar
from calibration.prompts import TokenCounter, approx_tokens, prompt_for
from calibration.schemas import ReplayRequest, SegmentRun

ROWS_VIEW = (
    "advisor_rows"  # the scope with concurrency filled in, where advisor.concurrency adds it
)
SUBSTRATA = 4  # prompt-length quartiles within a segment
CONTEXT_MARGIN = 8  # tokens kept free below max_model_len (chat templates, BOS)


@dataclass(frozen=True)
class Sampled:
    """One logged request chosen for replay (lengths, sampling, text if any was logged)."""

    segment_key: str
    rid: int
    task: str
    prompt_tokens: int
    output_tokens: int
    temperature: float | None
    concurrency: int | None
    prompt_text: str | None


_DIMS = (
    ("temperature", "temperature"),
    ("prompt", "prompt_tokens"),
    ("output", "output_tokens"),
    ("concurrency", "concurrency"),
)


def _map_cells(
    con: duckdb.DuckDBPyConnection, source: str, segments: Sequence[SegmentStats], bands: Bands
) -> str:
    """Rebuild segment membership with advisor.segments' public pieces (band_index_sql,
    merge_cells, band_label) into a temp table, and return the join condition. Each merged
    segment is matched to the given SegmentStats by its tasks, four band labels and size, so a
    mismatch is an error rather than a silent swap."""
    exprs = {dim: band_index_sql("s." + col, getattr(bands, dim)) for dim, col in _DIMS}
    cols = ", ".join(f"{exprs[dim]} AS {dim}_i" for dim, _ in _DIMS)
    rows = con.execute(
        f"SELECT task, {', '.join(d + '_i' for d, _ in _DIMS)}, count(*)"
        f" FROM (SELECT s.task, {cols} FROM {source} s) GROUP BY ALL"
    ).fetchall()
    merged = merge_cells({tuple(r[:5]): r[5] for r in rows}, bands.min_share)

    def signature(tasks: set[str], labels: list[str], n: int) -> tuple[object, ...]:
        return (frozenset(tasks), *labels, n)

    given = {
        signature(
            set(st.task.split("+")),
            [st.temperature_band, st.prompt_band, st.output_band, st.concurrency_band],
            st.n,
        ): i
        for i, st in enumerate(segments)
    }
    index = [
        given.get(
            signature(
                {c[0] for c in m.cells},
                [band_label(getattr(bands, d), {c[k + 1] for c in m.cells}) for k, (d, _) in
                 enumerate(_DIMS)],
                m.n,
            )
        )
        for m in merged
    ]  # fmt: skip
    if None in index or len(given) != len(segments) or sorted(index) != list(range(len(index))):
        raise AdvisorError(
            "Sampling found other segments than the ones given; compute the segments on this "
            "connection with advisor.segments.segment() and the same bands just before drawing."
        )
    members = [(index[i], c) for i, m in enumerate(merged) for c in m.cells]
    con.execute(
        "CREATE OR REPLACE TEMP TABLE calibration_cell_map AS SELECT unnest($seg) AS seg,"
        " unnest($task) AS task, unnest($t) AS temperature_i, unnest($p) AS prompt_i,"
        " unnest($o) AS output_i, unnest($c) AS concurrency_i",
        {
            "seg": [m[0] for m in members],
            "task": [m[1][0] for m in members],
            "t": [m[1][1] for m in members],
            "p": [m[1][2] for m in members],
            "o": [m[1][3] for m in members],
            "c": [m[1][4] for m in members],
        },
    )
    return " AND ".join([f"m.{dim}_i = {exprs[dim]}" for dim, _ in _DIMS] + ["m.task = s.task"])


def draw(
    con: duckdb.DuckDBPyConnection,
    segments: Sequence[SegmentStats],
    bands: Bands,
    max_per_segment: int,
    seed: int = 0,
) -> dict[str, list[Sampled]]:
    """Up to `max_per_segment` requests per segment, in replay order (stratified prefixes).

    Needs the scoped rows of advisor.segments on `con` (create_scope, concurrency.fill) and the
    `segments` computed from them with `bands`. Logged prompt text comes from a logged request
    of the same task and prompt length (the scope keeps lengths, not ids), which is an
    equivalent prompt for replay.
    """
    views = "SELECT count(*) FROM duckdb_views() WHERE view_name = ?"
    tables = "SELECT count(*) FROM duckdb_tables() WHERE table_name = ?"
    source = ROWS_VIEW if scalar(con, views, [ROWS_VIEW]) else SCOPE
    if source == SCOPE and not scalar(con, tables, [SCOPE]):
        raise AdvisorError(
            "Sampling needs the scoped requests on this connection: run "
            "advisor.segments.create_scope() and segment() first."
        )
    on = _map_cells(con, source, segments, bands)
    rows = con.execute(
        f"""
        WITH base AS (
            SELECT m.seg, s.task, s.prompt_tokens, s.output_tokens, s.temperature,
                   s.concurrency, hash(s, $seed) AS h
            FROM {source} s JOIN calibration_cell_map m ON {on}
        ), member AS (
            SELECT *,
                   row_number() OVER (ORDER BY h, prompt_tokens, output_tokens) AS rid,
                   ntile({SUBSTRATA}) OVER (PARTITION BY seg ORDER BY prompt_tokens, h) AS q
            FROM base
        ), ranked AS (
            SELECT *, row_number() OVER (PARTITION BY seg, q ORDER BY rid) AS r FROM member
        ), chosen AS (
            SELECT *, row_number() OVER (PARTITION BY seg ORDER BY r, q) AS pick FROM ranked
        ), texts AS (
            SELECT coalesce(task, '{UNLABELLED}') AS task, prompt_tokens,
                   min(prompt_text) AS prompt_text
            FROM requests WHERE prompt_text IS NOT NULL GROUP BY ALL
        )
        SELECT c.seg, c.rid, c.task, c.prompt_tokens, c.output_tokens, c.temperature,
               c.concurrency, t.prompt_text
        FROM chosen c LEFT JOIN texts t USING (task, prompt_tokens)
        WHERE c.pick <= $n ORDER BY c.seg, c.pick
        """,
        {"seed": seed, "n": max_per_segment},
    ).fetchall()
    out: dict[str, list[Sampled]] = {s.key: [] for s in segments}
    for seg, rid, task, p, o, temp, conc, text in rows:
        key = segments[seg].key
        out[key].append(Sampled(key, rid, task, p, o, temp, conc, text))
    return out


def to_requests(
    sampled: Sequence[Sampled],
    *,
    max_model_len: int | None = None,
    count_tokens: TokenCounter = approx_tokens,
    seed: int = 0,
    chat: bool = False,
) -> list[ReplayRequest]:
    """Replay requests: logged text or a bank prompt of the logged length, the logged output
    length forced, lengths scaled down together when they exceed the server's context. Pass
    replay.token_counter(handle) as `count_tokens` for exact lengths; `chat` sends each prompt
    through the model's chat template."""
    out = []
    for i, s in enumerate(sampled):
        prompt_len, output_len = s.prompt_tokens, max(1, s.output_tokens)
        if max_model_len is not None and prompt_len + output_len > max_model_len - CONTEXT_MARGIN:
            scale = (max_model_len - CONTEXT_MARGIN) / (prompt_len + output_len)
            prompt_len = max(1, math.floor(prompt_len * scale))
            output_len = max(1, math.floor(output_len * scale))
        text = s.prompt_text if prompt_len == s.prompt_tokens else None
        prompt, source = prompt_for(
            s.task, prompt_len, logged_text=text, seed=seed * 100_003 + i, count_tokens=count_tokens
        )
        out.append(
            ReplayRequest(
                request_id=f"{s.segment_key}#{s.rid}",
                segment_key=s.segment_key,
                prompt=prompt,
                prompt_tokens=prompt_len,
                max_tokens=output_len,
                temperature=s.temperature or 0.0,
                task=s.task,
                prompt_source=source,
                chat=chat,
            )
        )
    return out


class Precision(BaseModel):
    """When a segment is measured enough, and its budget."""

    acceptance_half_width: float = Field(default=0.05, gt=0, description="absolute, 95% CI")
    speedup_half_width: float = Field(default=0.05, gt=0, description="relative, 95% CI")
    max_requests: int = Field(default=64, ge=2)
    max_minutes: float = Field(default=10.0, gt=0)
    pilot: int = Field(default=8, ge=2, description="first round's requests per segment")
    round_max: int = Field(default=32, ge=1, description="most requests in one later round")


class SegmentEstimate(BaseModel):
    """Where a segment stands after its rounds so far."""

    segment_key: str
    n: int
    minutes: float
    acceptance: float | None
    acceptance_half_width: float
    speedup: float | None  # baseline e2e / speculative e2e, geometric mean over paired requests
    speedup_half_width: float  # relative
    done: bool
    reason: str | None


def _t975(df: int) -> float:
    """Student-t 97.5% quantile (Cornish-Fisher expansion; within 1% for df >= 3)."""
    z = 1.959963984540054
    if df <= 0:
        return math.inf
    g1 = (z**3 + z) / 4
    g2 = (5 * z**5 + 16 * z**3 + 3 * z) / 96
    return z + g1 / df + g2 / df**2


def _half_width(values: Sequence[float]) -> float:
    if len(values) < 2:
        return math.inf
    return _t975(len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))


def accepted_per_step(tokens: int, chunks: int) -> float | None:
    """Accepted tokens per decode step of one request, from its stream: after the first chunk
    (prefill), each chunk is one engine step carrying 1 + accepted tokens."""
    if chunks < 2 or tokens < 2:
        return None
    return (tokens - 1) / (chunks - 1) - 1


def estimate(
    key: str,
    baseline: Sequence[SegmentRun],
    speculative: Sequence[SegmentRun],
    rule: Precision,
) -> SegmentEstimate:
    """Acceptance (pooled counters) and e2e speedup (paired by request id), with 95% intervals,
    and whether the segment may stop."""
    drafts = sum(r.delta.num_draft_tokens for r in speculative if r.delta)
    accepted = sum(r.delta.num_accepted_tokens for r in speculative if r.delta)
    acceptance = accepted / drafts if drafts else None
    spec_records = [rec for run in speculative for rec in run.ok_records]
    # The counters give only batch totals, so the interval comes from the per-request spread of
    # accepted tokens per step (relative half-width, carried over to the counters' estimate; not
    # every step drafts with ngram, so the per-step figure itself is not the acceptance rate).
    per_step = [accepted_per_step(r.output_tokens, r.chunks) for r in spec_records]
    values = [v for v in per_step if v is not None]
    rel_hw = _half_width(values) / statistics.fmean(values) if values and any(values) else math.inf
    acc_hw = math.inf if acceptance is None else min(1.0, acceptance * rel_hw)
    base_e2e = {rec.request_id: rec.e2e_ms for run in baseline for rec in run.ok_records}
    log_ratios = [
        math.log(base_e2e[r.request_id] / r.e2e_ms)
        for r in spec_records
        if r.e2e_ms and base_e2e.get(r.request_id)
    ]
    speedup = math.exp(statistics.fmean(log_ratios)) if log_ratios else None
    log_hw = _half_width(log_ratios)
    speed_hw = math.expm1(log_hw) if log_hw < 50 else math.inf
    n = len({r.request_id for r in spec_records})
    minutes = sum(r.wall_s for r in (*baseline, *speculative)) / 60
    reason = None
    if acc_hw <= rule.acceptance_half_width and speed_hw <= rule.speedup_half_width:
        reason = "precision reached"
    elif n >= rule.max_requests:
        reason = f"max requests ({rule.max_requests})"
    elif minutes >= rule.max_minutes:
        reason = f"max minutes ({rule.max_minutes:g})"
    return SegmentEstimate(
        segment_key=key,
        n=n,
        minutes=minutes,
        acceptance=acceptance,
        acceptance_half_width=acc_hw,
        speedup=speedup,
        speedup_half_width=speed_hw,
        done=reason is not None,
        reason=reason,
    )


def next_round(
    estimates: Sequence[SegmentEstimate], available: dict[str, int], rule: Precision
) -> dict[str, int]:
    """Requests to add per unfinished segment in the next round.

    The half-width shrinks as 1/sqrt(n), so a segment needs about n((hw/target)^2 - 1) more
    requests; each gets that (capped by its budget, the requests left in its sample and
    `round_max`), so segments far from their target get more of the GPU.
    """
    plan = {}
    for est in estimates:
        left = min(rule.max_requests - est.n, available.get(est.segment_key, 0))
        if est.done or left <= 0:
            continue
        if est.n == 0:
            plan[est.segment_key] = min(rule.pilot, left)
            continue
        worst = max(
            est.acceptance_half_width / rule.acceptance_half_width,
            est.speedup_half_width / rule.speedup_half_width,
        )
        need = rule.round_max if math.isinf(worst) else math.ceil(est.n * (worst**2 - 1))
        plan[est.segment_key] = max(1, min(need, left, rule.round_max))
    return plan
