"""Which logged requests to replay, and when a segment has been measured enough.

Draw: per segment of advisor.segments (the temp tables `advisor_scope` and `advisor_segment_map`
that `segment()` leaves on the connection), a random order stratified by prompt-length quartile,
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
from advisor.segments import SCOPE, UNLABELLED, Bands, band_index_sql
from calibration.prompts import TokenCounter, approx_tokens, prompt_for
from calibration.schemas import ReplayRequest, SegmentRun

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


def draw(
    con: duckdb.DuckDBPyConnection,
    segments: Sequence[SegmentStats],
    bands: Bands,
    max_per_segment: int,
    seed: int = 0,
) -> dict[str, list[Sampled]]:
    """Up to `max_per_segment` requests per segment, in replay order (stratified prefixes).

    Logged prompt text comes from a logged request of the same task and prompt length (the scope
    table keeps lengths, not ids), which is an equivalent prompt for replay.
    """
    on = " AND ".join(
        f"m.{dim}_i = {band_index_sql('s.' + col, getattr(bands, dim))}"
        for dim, col in (
            ("temperature", "temperature"),
            ("prompt", "prompt_tokens"),
            ("output", "output_tokens"),
            ("concurrency", "concurrency"),
        )
    )
    try:
        rows = con.execute(
            f"""
            WITH member AS (
                SELECT s.rid, m.seg, s.task, s.prompt_tokens, s.output_tokens, s.temperature,
                       s.concurrency,
                       ntile({SUBSTRATA}) OVER (PARTITION BY m.seg ORDER BY s.prompt_tokens) AS q
                FROM {SCOPE} s JOIN advisor_segment_map m ON m.task = s.task AND {on}
            ), ranked AS (
                SELECT *, row_number() OVER (PARTITION BY seg, q ORDER BY hash(rid, $seed)) AS r
                FROM member
            ), chosen AS (
                SELECT *, row_number() OVER (PARTITION BY seg ORDER BY r, q) AS pick
                FROM ranked
            ), texts AS (
                SELECT coalesce(task, '{UNLABELLED}') AS task, prompt_tokens,
                       any_value(prompt_text) AS prompt_text
                FROM requests WHERE prompt_text IS NOT NULL GROUP BY ALL
            )
            SELECT c.seg, c.rid, c.task, c.prompt_tokens, c.output_tokens, c.temperature,
                   c.concurrency, t.prompt_text
            FROM chosen c LEFT JOIN texts t USING (task, prompt_tokens)
            WHERE c.pick <= $n ORDER BY c.seg, c.pick
            """,
            {"seed": seed, "n": max_per_segment},
        ).fetchall()
    except duckdb.CatalogException as exc:
        raise AdvisorError(
            "Sampling needs the segments of this connection: run advisor.segments.segment() "
            f"first ({exc})."
        ) from exc
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
) -> list[ReplayRequest]:
    """Replay requests: logged text or a bank prompt of the logged length, the logged output
    length forced, lengths scaled down together when they exceed the server's context."""
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


def request_acceptance(tokens: int, chunks: int, k: int) -> float | None:
    """Per-request acceptance from the stream: after the first chunk (prefill), each chunk is one
    verification step carrying 1 + accepted tokens. Used for the interval only; the point estimate
    comes from the server's counters."""
    if chunks < 2 or tokens < 2 or k < 1:
        return None
    per_step = (tokens - 1) / (chunks - 1)
    return min(1.0, max(0.0, (per_step - 1) / k))


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
    k = max((len(r.delta.accepted_per_pos) for r in speculative if r.delta), default=0)
    spec_records = [rec for run in speculative for rec in run.ok_records]
    per_request = [request_acceptance(r.output_tokens, r.chunks, k) for r in spec_records]
    acc_hw = _half_width([a for a in per_request if a is not None])
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
        acceptance=accepted / drafts if drafts else None,
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
