"""Writing a calibration: its header, every replayed request, and each segment's summary.

All three go in one transaction, so a calibration is in the database whole or not at all (an
interrupted run that still has data is stored whole as `partial`, never half-written).
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Literal

import duckdb
from pydantic import BaseModel, Field

from advisor.store import scalar, transaction
from calibration.acceptance_fit import Observation, alpha_from_counters
from calibration.schemas import ReplayRequest, SegmentRun, SpecDecodeDelta

Status = Literal["complete", "partial"]


class SegmentSummary(BaseModel):
    """One segment over all its rounds, on both servers: what the fits and `show` read."""

    segment_key: str
    task: str | None = None
    temperature: float | None = None
    prompt_tokens: float | None = Field(default=None, description="median of replayed requests")
    output_tokens: float | None = None
    concurrency: int = 1
    n_requests: int = 0
    delta: SpecDecodeDelta | None = None
    decode_steps: int | None = Field(
        default=None,
        description="speculative decode steps: output tokens after the first - accepted",
    )
    text_features: dict[str, float] | None = None
    baseline_tpot_ms: float | None = None
    speculative_tpot_ms: float | None = None
    baseline_e2e_ms: float | None = None
    speculative_e2e_ms: float | None = None

    @property
    def alpha(self) -> float | None:
        """Per-token acceptance over all decode steps (steps where an n-gram drafter found
        nothing to propose count as accepting nothing); None when nothing was drafted."""
        d = self.delta
        if d is None or d.num_drafts <= 0 or d.num_draft_tokens <= 0:
            return None
        return alpha_from_counters(
            d.num_drafts, d.num_draft_tokens, d.num_accepted_tokens, self.decode_steps
        )

    def observation(self, method: str) -> Observation | None:
        """This segment as an acceptance-fit observation; None without drafts or lengths."""
        d = self.delta
        if self.alpha is None or d is None or not self.prompt_tokens or not self.output_tokens:
            return None
        return Observation(
            segment_key=self.segment_key,
            method=method,
            task=(self.task or "unlabelled").strip().lower(),
            temperature=self.temperature or 0.0,
            prompt_tokens=self.prompt_tokens,
            output_tokens=self.output_tokens,
            num_drafts=d.num_drafts,
            num_draft_tokens=d.num_draft_tokens,
            num_accepted_tokens=d.num_accepted_tokens,
            decode_steps=self.decode_steps,
            text_features=self.text_features,
        )


class CalibrationHeader(BaseModel):
    """The `calibrations` row: what was calibrated, how, and what came out."""

    created_at: datetime
    finished_at: datetime
    status: Status
    stop_reason: str | None = None
    gpu: str
    vllm_version: str | None = None
    target: str
    draft: str | None = None
    method: str
    k: int = Field(ge=1)
    settings: dict[str, object] = Field(default_factory=dict)
    profile: dict[str, object]
    fit: dict[str, object] = Field(default_factory=dict)
    notes: str | None = None


def _median(values: Iterable[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def sum_deltas(deltas: Sequence[SpecDecodeDelta]) -> SpecDecodeDelta | None:
    """Counters over several rounds of one segment (they are additive)."""
    if not deltas:
        return None
    width = max(len(d.accepted_per_pos) for d in deltas)
    return SpecDecodeDelta(
        num_drafts=sum(d.num_drafts for d in deltas),
        num_draft_tokens=sum(d.num_draft_tokens for d in deltas),
        num_accepted_tokens=sum(d.num_accepted_tokens for d in deltas),
        accepted_per_pos=[
            sum(d.accepted_per_pos[i] for d in deltas if i < len(d.accepted_per_pos))
            for i in range(width)
        ],
    )


def summarize(
    segment_key: str,
    runs: Sequence[SegmentRun],
    requests: Mapping[str, ReplayRequest],
    text_features: dict[str, float] | None = None,
) -> SegmentSummary:
    """Merge a segment's rounds on both servers into one summary."""
    mine = [r for r in runs if r.segment_key == segment_key]
    base = [rec for r in mine if r.role == "baseline" for rec in r.ok_records]
    spec = [rec for r in mine if r.role == "speculative" for rec in r.ok_records]
    replayed = [requests[rec.request_id] for rec in spec or base if rec.request_id in requests]
    tasks = [q.task for q in replayed if q.task]
    delta = sum_deltas([r.delta for r in mine if r.role == "speculative" and r.delta])
    # Each decode step emits 1 + accepted tokens, the first token comes from prefill; valid
    # only when every request of the batches completed (the counters include failed ones).
    all_ok = all(rec.ok for r in mine if r.role == "speculative" for rec in r.records)
    steps = sum(rec.output_tokens - 1 for rec in spec) - (delta.num_accepted_tokens if delta else 0)
    return SegmentSummary(
        segment_key=segment_key,
        task=statistics.mode(tasks) if tasks else None,
        temperature=_median(rec.temperature for rec in spec or base),
        prompt_tokens=_median(rec.prompt_tokens for rec in spec or base),
        output_tokens=_median(rec.output_tokens for rec in spec or base),
        concurrency=max((r.concurrency for r in mine), default=1),
        n_requests=len({rec.request_id for rec in base + spec}),
        delta=delta,
        decode_steps=steps if delta and all_ok and steps >= delta.num_drafts else None,
        text_features=text_features,
        baseline_tpot_ms=_median(rec.tpot_ms for rec in base),
        speculative_tpot_ms=_median(rec.tpot_ms for rec in spec),
        baseline_e2e_ms=_median(rec.e2e_ms for rec in base),
        speculative_e2e_ms=_median(rec.e2e_ms for rec in spec),
    )


def store_calibration(
    con: duckdb.DuckDBPyConnection,
    header: CalibrationHeader,
    runs: Sequence[SegmentRun],
    segments: Sequence[SegmentSummary],
    requests: Mapping[str, ReplayRequest],
) -> int:
    """Insert the calibration, its samples and segment summaries in one transaction; its id."""
    sample_rows = []
    seq: dict[tuple[str, str], int] = {}
    for run in runs:
        for rec in run.records:
            slot = (rec.segment_key, rec.role)
            seq[slot] = seq.get(slot, -1) + 1
            asked = requests.get(rec.request_id)
            sample_rows.append(
                (
                    rec.segment_key, rec.role, seq[slot], rec.request_id,
                    asked.task if asked else None, rec.temperature, rec.prompt_tokens,
                    rec.max_tokens, run.concurrency, rec.ttft_ms, rec.tpot_ms, rec.e2e_ms,
                    rec.output_tokens, rec.ok, rec.error,
                )
            )  # fmt: skip
    with transaction(con):
        cal_id = int(scalar(con, "SELECT nextval('calibration_id_seq')"))
        con.execute(
            "INSERT INTO calibrations (id, created_at, finished_at, status, stop_reason, gpu,"
            " vllm_version, target, draft, method, k, settings, profile, fit, notes)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [
                cal_id, header.created_at, header.finished_at, header.status,
                header.stop_reason, header.gpu, header.vllm_version, header.target,
                header.draft, header.method, header.k, json.dumps(header.settings, default=str),
                json.dumps(header.profile), json.dumps(header.fit, default=str), header.notes,
            ],
        )  # fmt: skip
        if sample_rows:
            con.executemany(
                "INSERT INTO calibration_samples (calibration_id, segment_key, role, seq,"
                " request_id, task, temperature, prompt_tokens, max_tokens, concurrency,"
                " ttft_ms, tpot_ms, e2e_ms, output_tokens, ok, error)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [(cal_id, *row) for row in sample_rows],
            )
        for s in segments:
            d = s.delta
            con.execute(
                "INSERT INTO calibration_segments VALUES"
                " (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [
                    cal_id, s.segment_key, s.task, s.temperature, s.prompt_tokens,
                    s.output_tokens, s.concurrency, s.n_requests,
                    d.num_drafts if d else None, d.num_draft_tokens if d else None,
                    d.num_accepted_tokens if d else None,
                    json.dumps(d.accepted_per_pos) if d else None,
                    d.acceptance_rate if d else None, d.mean_acceptance_length if d else None,
                    s.alpha, json.dumps(s.text_features) if s.text_features else None,
                    s.baseline_tpot_ms, s.speculative_tpot_ms, s.baseline_e2e_ms,
                    s.speculative_e2e_ms,
                ],
            )  # fmt: skip
    return cal_id
