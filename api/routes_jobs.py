"""Background jobs' status and progress."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, HTTPException, Query
from pydantic import BaseModel, ConfigDict, Field

from api.deps import V1, Db
from api.errors import ERROR_RESPONSES, ErrorBody
from api.jobs import Job, JobStatus, get_job, list_jobs

router = APIRouter(prefix=V1, tags=["jobs"], responses=ERROR_RESPONSES)


class JobQuery(BaseModel):
    """GET /v1/jobs parameters; unknown ones are refused (422)."""

    model_config = ConfigDict(extra="forbid")

    status: JobStatus | None = Field(None, description="only jobs in this status")
    limit: int = Field(100, ge=1, le=1000)


@router.get("/jobs", response_model=list[Job])
def jobs(con: Db, query: Annotated[JobQuery, Query()]) -> list[Job]:
    """Background jobs, newest first."""
    return list_jobs(con, query.status, query.limit)


@router.get(
    "/jobs/{job_id}",
    response_model=Job,
    responses={404: {"model": ErrorBody, "description": "No such job."}},
)
def job_status(job_id: str, con: Db) -> Job:
    """Status (queued, running, done, failed, interrupted), progress 0-1, and the result."""
    job = get_job(con, job_id)
    if job is None:
        raise HTTPException(404, f"No job with id '{job_id}'.")
    return job
