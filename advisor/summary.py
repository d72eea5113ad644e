"""Recommend from a workload summary instead of a log: segments given by their percentiles.

Capacity-planning tools often hold only aggregates (per workload: request count, prompt and
output length percentiles, temperature, task, concurrency). Each posted segment becomes the same
SegmentStats that advisor.segments measures from logs and is scored by the same
scoring.score_segment; the fleet summary and curves come from advisor.recommend. The answer is a
Recommendation, the schema of `advisor recommend --format json`. Posted segments are taken as
given: not re-banded and not merged.
"""

from __future__ import annotations

from bisect import bisect_right

from pydantic import BaseModel, ConfigDict, Field, model_validator

from advisor.catalog import Catalog
from advisor.perf import request_latency_s, resolve
from advisor.profile import Profile
from advisor.recommend import curve, fleet_summary, profile_notes
from advisor.schemas import Deployment, Recommendation, SegmentStats
from advisor.scoring import THRESHOLD, score_segment
from advisor.segments import UNLABELLED, Bands, band_label


class Percentiles(BaseModel):
    """A distribution given by its median and 95th percentile (p95 defaults to the median)."""

    model_config = ConfigDict(extra="forbid")

    p50: float = Field(gt=0, le=10_000_000)
    p95: float | None = Field(None, gt=0, le=10_000_000)

    @model_validator(mode="after")
    def _ordered(self) -> Percentiles:
        if self.p95 is not None and self.p95 < self.p50:
            raise ValueError(f"p95 ({self.p95:g}) must be at least p50 ({self.p50:g})")
        return self

    @property
    def high(self) -> float:
        return self.p95 if self.p95 is not None else self.p50


class Concurrency(Percentiles):
    """Requests in flight at arrival, this one included: at least 1."""

    p50: float = Field(ge=1, le=10_000_000)
    p95: float | None = Field(None, ge=1, le=10_000_000)


class SummarySegment(BaseModel):
    """One workload segment as a capacity tool knows it."""

    model_config = ConfigDict(extra="forbid")

    name: str | None = Field(None, max_length=200, description="label; default: built from bands")
    task: str = Field(UNLABELLED, min_length=1, max_length=100, description="e.g. code, chat")
    temperature: float | None = Field(None, ge=0, le=5, description="median; null: unknown")
    requests: int = Field(ge=1, le=10**12, description="request count (weights the fleet)")
    prompt_tokens: Percentiles
    output_tokens: Percentiles
    concurrency: Concurrency


class WorkloadSummary(BaseModel):
    """The traffic to advise on, as segments."""

    model_config = ConfigDict(extra="forbid")

    segments: list[SummarySegment] = Field(min_length=1, max_length=500)
    requests_per_s: float | None = Field(
        None, gt=0, le=10**7, description="arrival rate, for GPU-hours per day; null: not computed"
    )


def _band(edges: list[float], value: float | None) -> str:
    """The label of the band `value` falls in, as advisor.segments labels it."""
    return band_label(edges, {-1 if value is None else bisect_right(edges, value)})


def segment_stats(summary: WorkloadSummary, bands: Bands | None = None) -> list[SegmentStats]:
    """SegmentStats of the posted segments, labelled with `bands`; keys are unique."""
    bands = bands or Bands()
    total = sum(s.requests for s in summary.segments)
    stats, seen = [], set()
    for seg in summary.segments:
        labels = {
            "temperature": _band(bands.temperature, seg.temperature),
            "prompt": _band(bands.prompt, seg.prompt_tokens.p50),
            "output": _band(bands.output, seg.output_tokens.p50),
            "concurrency": _band(bands.concurrency, seg.concurrency.p50),
        }
        key = seg.name or (
            f"{seg.task} | temp {labels['temperature']} | prompt {labels['prompt']}"
            f" | out {labels['output']} | conc {labels['concurrency']}"
        )
        base, n = key, 2
        while key in seen:
            key, n = f"{base} #{n}", n + 1
        seen.add(key)
        stats.append(
            SegmentStats(
                key=key,
                task=seg.task,
                temperature_band=labels["temperature"],
                prompt_band=labels["prompt"],
                output_band=labels["output"],
                concurrency_band=labels["concurrency"],
                n=seg.requests,
                share=seg.requests / total,
                prompt_p50=seg.prompt_tokens.p50,
                prompt_p95=seg.prompt_tokens.high,
                output_p50=seg.output_tokens.p50,
                output_p95=seg.output_tokens.high,
                temperature_p50=seg.temperature,
                concurrency_p50=seg.concurrency.p50,
                concurrency_p95=seg.concurrency.high,
                concurrency_estimated=False,
            )
        )
    return stats


def recommend_summary(
    summary: WorkloadSummary,
    deployment: Deployment,
    profile: Profile | None = None,
    bands: Bands | None = None,
    *,
    threshold: float = THRESHOLD,
    catalog: Catalog | None = None,
) -> Recommendation:
    """A verdict per posted segment and the fleet-wide effect (advisor.recommend's summary)."""
    setup = resolve(deployment, profile, catalog)
    verdicts = []
    for st in segment_stats(summary, bands):
        v = score_segment(st, deployment, setup.profile, threshold=threshold, catalog=catalog)
        latency = request_latency_s(
            setup, max(1.0, st.prompt_p50), max(1.0, st.output_p50), max(1.0, st.concurrency_p50)
        )[1]
        extra = {"baseline_latency_s": round(latency, 4), "concurrency_curve": curve(setup, v)}
        verdicts.append(v.model_copy(update=extra))
    return Recommendation(
        deployment=deployment,
        calibration=setup.profile.calibration,
        concurrency_estimated=False,
        notes=_notes(summary, deployment, setup.profile),
        summary=fleet_summary(verdicts, summary.requests_per_s, deployment.tp),
        segments=verdicts,
    )


def _notes(summary: WorkloadSummary, deployment: Deployment, profile: Profile) -> list[str]:
    notes = profile_notes(profile, deployment)
    total = sum(s.requests for s in summary.segments)
    notes.append(
        f"Workload summary: {len(summary.segments)} posted segments, {total:,} requests; "
        "percentiles and concurrency as given (not re-banded, not merged)."
    )
    if summary.requests_per_s is None:
        notes.append("No requests_per_s given: GPU-hours per day are not computed (0).")
    else:
        notes.append(
            f"Traffic: {summary.requests_per_s:g} requests/s; GPU-hours per day extrapolate it."
        )
    return notes
