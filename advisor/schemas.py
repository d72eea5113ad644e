"""Pydantic models at the boundaries shared by the CLI, the REST API and the collectors."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field


class ImportSummary(BaseModel):
    """What one `advisor ingest` of one file did."""

    import_id: int
    file: str
    format: str
    checksum: str
    rows_read: int
    rows_accepted: int
    rows_rejected: int
    already_imported: bool = False
    started_at: datetime
    finished_at: datetime

    def sentence(self) -> str:
        """One line for the terminal."""
        if self.already_imported:
            return (
                f"{self.file} was already imported as import {self.import_id} "
                f"({self.rows_accepted} rows); nothing changed."
            )
        return (
            f"{self.file} ({self.format}): {self.rows_accepted} imported, "
            f"{self.rows_rejected} rejected (import {self.import_id})."
        )


class RejectRow(BaseModel):
    """One input row that failed validation."""

    import_id: int
    file: str
    line: int
    reason: str
    raw: str | None = None


# --- The advisor's contract (issue 3). advisor/, api/ and cli/ all speak these models. ---

Method = Literal["eagle3", "eagle", "draft_model", "ngram", "suffix", "mtp"]
Verdict = Literal["enable", "disable", "try-it"]

SCHEMA_VERSION = "1"


class Interval(BaseModel):
    """A predicted quantity with its interval (JSON: {value, low, high})."""

    value: float
    low: float
    high: float


class Deployment(BaseModel):
    """What is being served, and how speculation would be configured."""

    gpu: str = "h200"
    target: str = "llama-3.1-8b"
    method: Method = "eagle3"
    draft: str | None = None
    k: int | None = Field(default=None, ge=1, le=16, description="None means choose the best k")
    gpu_memory_utilization: float = Field(default=0.9, gt=0.0, le=1.0)
    tp: int = Field(default=1, ge=1, le=64)


class MemoryFit(BaseModel):
    """Does target + draft + both KV caches fit the GPU budget at the load asked for?"""

    gpu_memory_gb: float
    budget_gb: float
    target_weights_gb: float
    draft_weights_gb: float
    kv_needed_gb: float
    kv_available_gb: float
    headroom_gb: float
    fits: bool


class CalibrationRef(BaseModel):
    """Which numbers a prediction used: a shipped profile, a stored calibration, or the roofline."""

    id: str
    kind: Literal["profile", "calibration", "roofline"]
    description: str


class Prediction(BaseModel):
    """`advisor predict`: B requests arriving together, each P prompt and O output tokens."""

    schema_version: str = SCHEMA_VERSION
    deployment: Deployment
    calibration: CalibrationRef
    acceptance: float
    batch: int
    prompt_tokens: int
    output_tokens: int
    k: int
    mean_acceptance_length: float
    speedup: float  # tokens/s over the whole batch, prefill included, speculative / baseline
    e2e_latency_speedup: float
    decode_speedup: float
    tokens_per_s_baseline: float
    tokens_per_s_speculative: float
    tpot_ms_baseline: float
    tpot_ms_speculative: float
    ttft_ms: float
    memory_fits: bool
    memory: MemoryFit
    ttft_ms_speculative: float | None = None  # the speculative engine also prefills its draft
    verify_bound: str | None = None  # "memory" or "compute": what limits the verification step


class SegmentStats(BaseModel):
    """One workload segment as measured from the `requests` table."""

    key: str
    task: str
    temperature_band: str
    prompt_band: str
    output_band: str
    concurrency_band: str
    n: int
    share: float
    prompt_p50: float
    prompt_p95: float
    output_p50: float
    output_p95: float
    temperature_p50: float | None
    concurrency_p50: float
    concurrency_p95: float
    concurrency_estimated: bool
    has_text: bool = False
    prompt_mean: float | None = None  # means size the fleet (GPU-hours); p50s pick the verdict
    output_mean: float | None = None


class CurvePoint(BaseModel):
    """Predicted speedups of a segment's median request at one concurrency (for plots)."""

    concurrency: float
    decode_speedup: float
    e2e_speedup: float


class SegmentVerdict(BaseModel):
    """The advisor's answer for one segment."""

    stats: SegmentStats
    share: float
    n: int
    verdict: Verdict
    method: Method
    best_k: int
    acceptance: Interval
    decode_speedup: Interval
    e2e_speedup: Interval
    throughput_change: Interval  # goodput ratio at the segment's p95 concurrency
    decode_share: float  # fraction of baseline request time spent decoding
    memory: MemoryFit
    reasons: list[str]
    what_to_measure: str | None = None
    baseline_latency_s: float | None = None  # median request at concurrency p50 (recommend)
    concurrency_curve: list[CurvePoint] = []  # filled by advisor.recommend for the plots


class FleetSummary(BaseModel):
    """Traffic-weighted effect of following every verdict."""

    e2e_speedup: Interval
    latency_change_pct: float
    gpu_hours_saved_per_day: float
    segments_enabled: int
    segments_disabled: int
    segments_try_it: int
    requests_per_s: float | None = None  # the trace's arrival rate (None: no arrival times)
    baseline_gpu_hours_per_day: float | None = None  # at that rate, without speculation
    e2e_speedup_if_all_enabled: Interval | None = None  # the same, enabling every segment


class Recommendation(BaseModel):
    """`advisor recommend --format json` and POST /v1/recommendations (same schema)."""

    schema_version: str = SCHEMA_VERSION
    deployment: Deployment
    calibration: CalibrationRef
    concurrency_estimated: bool
    notes: list[str] = []
    summary: FleetSummary
    segments: list[SegmentVerdict]
