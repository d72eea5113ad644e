"""Stored calibrations (advisor.calibrations readers): list, one, and what moved between two."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, HTTPException, Query, Response
from pydantic import AnyHttpUrl, BaseModel, ConfigDict, Field, ValidationError

from advisor.calibrations import (
    CalibrationSummary,
    StoredCalibration,
    VerdictFlip,
    compare_verdicts,
    get_calibration,
    list_calibrations,
    parameter_drift,
    profile_for,
)
from advisor.errors import BadInput
from advisor.recommend import recommend as run_recommend
from advisor.schemas import Deployment, Method
from advisor.segments import Bands, Filters
from api.deps import V1, Db, Service, ServiceDep
from api.errors import ERROR_RESPONSES, ErrorBody
from api.jobs import Job, Progress
from api.routes_advice import Name
from calibration.run import Outcome, Plan, RunSettings, make_plan
from calibration.run import Progress as RunProgress
from calibration.run import calibrate as run_calibration
from calibration.sampling import Precision, Sampled
from calibration.servers import attach

router = APIRouter(prefix=V1, tags=["calibrations"], responses=ERROR_RESPONSES)
_NOT_FOUND = {404: {"model": ErrorBody, "description": "No such calibration."}}


class DriftOut(BaseModel):
    """One fitted parameter in calibrations a and b, and its relative change."""

    parameter: str
    a: float | None
    b: float | None
    change_pct: float | None


class CalibrationDiff(BaseModel):
    """`advisor calibrations diff A B`: drift of every fitted number, and verdict flips."""

    a: CalibrationSummary
    b: CalibrationSummary
    drift: list[DriftOut]
    verdicts_for: Deployment | None = Field(
        None, description="the deployment both calibrations' verdicts were computed for"
    )
    segments_compared: int = 0
    flips: list[VerdictFlip] = []
    only_under_one: list[str] = Field(
        default_factory=list, description="segments that exist under one calibration only"
    )
    note: str | None = None


def _get(con: Db, calibration_id: str) -> StoredCalibration:
    """`latest` or a known id; an unknown numeric id is 404 (its message lists the known ids)."""
    wanted = calibration_id.strip()
    if wanted.isdigit() and int(wanted) not in {c.id for c in list_calibrations(con)}:
        known = ", ".join(str(c.id) for c in list_calibrations(con)) or "none yet"
        raise HTTPException(404, f"There is no calibration {int(wanted)} (known: {known}).")
    return get_calibration(con, wanted)


@router.get("/calibrations", response_model=list[CalibrationSummary])
def calibrations(con: Db) -> list[CalibrationSummary]:
    """Every stored calibration, oldest first."""
    return list_calibrations(con)


@router.get(
    "/calibrations/{calibration_id}", response_model=StoredCalibration, responses=_NOT_FOUND
)
def calibration(calibration_id: str, con: Db) -> StoredCalibration:
    """One calibration (an id, or `latest` for the newest complete one) with its fit."""
    return _get(con, calibration_id)


def _verdict_deployment(svc: Service, cal: StoredCalibration, target: str | None) -> Deployment:
    """A's GPU, method and k with a catalogue model (a served model name often is not one)."""
    known = svc.catalog.models
    if target is not None and target.lower() not in known:
        raise BadInput(f"unknown model {target!r}; known models: {', '.join(sorted(known))}.")
    chosen = target or (cal.target if cal.target.lower() in known else None)
    draft = cal.draft if cal.draft and cal.draft.lower() in known else None
    dep = Deployment(gpu=cal.gpu, method=cal.method, draft=draft, k=cal.k)
    return dep.model_copy(update={"target": chosen}) if chosen else dep


class DiffQuery(BaseModel):
    """GET /v1/calibrations/{a}/diff/{b} parameters; unknown ones are refused (422)."""

    model_config = ConfigDict(extra="forbid")

    target: Name | None = Field(None, description="model for the verdicts")
    import_id: list[int] = Field(default_factory=list, description="traffic: only these imports")
    allow_partial: bool = Field(False, description="use a calibration that ended early")


@router.get("/calibrations/{a}/diff/{b}", response_model=CalibrationDiff, responses=_NOT_FOUND)
def diff(
    a: str, b: str, svc: ServiceDep, con: Db, query: Annotated[DiffQuery, Query()]
) -> CalibrationDiff:
    """What moved from calibration a to b: each fitted parameter (largest relative change first)
    and the segments of the imported traffic whose verdict flips."""
    target, import_id, allow_partial = query.target, query.import_id, query.allow_partial
    left, right = _get(con, a), _get(con, b)
    result = CalibrationDiff(
        a=CalibrationSummary(**left.model_dump(include=set(CalibrationSummary.model_fields))),
        b=CalibrationSummary(**right.model_dump(include=set(CalibrationSummary.model_fields))),
        drift=[
            DriftOut(parameter=d.parameter, a=d.a, b=d.b, change_pct=d.change_pct)
            for d in parameter_drift(left, right)
        ],
    )
    try:
        dep = _verdict_deployment(svc, left, target)
        filters = Filters(import_ids=import_id)
        profiles = [profile_for(con, c.id, allow_partial=allow_partial) for c in (left, right)]
        recs = [run_recommend(con, dep, p, filters, catalog=svc.catalog) for p in profiles]
    except (BadInput, ValidationError) as exc:
        why = str(exc) if isinstance(exc, BadInput) else f"calibration {left.id}'s deployment"
        result.note = f"Verdict flips not computed: {why}"
        return result
    cmp = compare_verdicts(*recs)
    result.verdicts_for = dep
    result.segments_compared, result.flips = cmp.segments_compared, cmp.flips
    result.only_under_one = cmp.only_under_one
    return result


class CalibrationJobRequest(BaseModel):
    """`advisor calibrate --baseline-url --speculative-url` as a body (attach mode only)."""

    model_config = ConfigDict(extra="forbid")

    baseline_url: AnyHttpUrl = Field(description="a running vLLM server without speculation")
    speculative_url: AnyHttpUrl = Field(description="a running vLLM server with speculation")
    method: Method = Field(description="what the speculative server runs (it does not say)")
    k: int = Field(ge=1, le=16, description="its num_speculative_tokens")
    gpu: Name = "h200"
    target: Name | None = Field(
        None, description="catalogue name of the served model; null: the name the server reports"
    )
    draft: Name | None = Field(None, description="catalogue name of the draft model or head")
    import_ids: list[int] = Field(default_factory=list, description="only these imports")
    since: datetime | None = Field(None, description="only arrivals at or after (UTC)")
    until: datetime | None = Field(None, description="only arrivals before (UTC)")
    model: str | None = Field(None, description="only requests logged for this model")
    tenant: str | None = Field(None, description="only this tenant / route")
    bands: Bands = Field(default_factory=Bands)
    precision: Precision = Field(default_factory=Precision)
    max_concurrency: int = Field(16, ge=1, le=1024)
    time_limit_minutes: float | None = Field(None, gt=0, description="whole run; then partial")
    seed: int = 0
    notes: str | None = Field(None, max_length=2000)

    def settings(self) -> RunSettings:
        return RunSettings(
            gpu=self.gpu, target=self.target or "(served model)", method=self.method,
            draft=self.draft, k=self.k, bands=self.bands, precision=self.precision,
            filters=Filters(import_ids=self.import_ids, since=self.since, until=self.until,
                            model=self.model, tenant=self.tenant),
            max_concurrency=self.max_concurrency, time_limit_minutes=self.time_limit_minutes,
            seed=self.seed, notes=self.notes,
        )  # fmt: skip


def _calibration_work(
    svc: Service, body: CalibrationJobRequest, plan: Plan, samples: dict[str, list[Sampled]]
):
    """The job: attach to both servers, replay, fit and store (calibration.run.calibrate)."""

    def work(progress: Progress) -> Outcome:
        progress(0.0, "attaching to the servers")
        baseline = attach(str(body.baseline_url), "baseline")
        speculative = attach(str(body.speculative_url), "speculative")
        if body.target is None:
            plan.settings.target = baseline.model

        def report(p: RunProgress) -> None:
            progress(
                p.done_requests / max(1, p.budget_requests),
                f"segment {p.segment_key}: {p.role}, round {p.round}",
            )

        cur = svc.con.cursor()
        try:
            return run_calibration(cur, plan, samples, baseline, speculative, report)
        finally:
            cur.close()

    return work


@router.post(
    "/calibrations",
    response_model=Job,
    status_code=202,
    responses={202: {"description": "The job started; poll GET /v1/jobs/{job_id}."}},
)
def start_calibration(
    body: CalibrationJobRequest, svc: ServiceDep, con: Db, response: Response
) -> Job:
    """Start a calibration against two running vLLM servers; returns the job to poll.

    The plan (segments and samples of the imported traffic) is made before answering, so a
    filter that matches nothing is a 400 now rather than a failed job later.
    """
    dep_names = [n for n in (body.target, body.draft) if n is not None]
    unknown = [n for n in dep_names if n.lower() not in svc.catalog.models]
    if unknown:
        known = ", ".join(sorted(svc.catalog.models))
        raise BadInput(f"unknown model {unknown[0]!r}; known models: {known}.")
    plan, samples = make_plan(con, body.settings())
    job = svc.jobs.submit("calibration", body, _calibration_work(svc, body, plan, samples))
    response.headers["Location"] = f"{V1}/jobs/{job.job_id}"
    return job
