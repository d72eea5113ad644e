"""Background jobs' status and progress."""

from __future__ import annotations

from fastapi import APIRouter, HTTPException

from api.deps import V1, Db
from api.errors import ERROR_RESPONSES, ErrorBody
from api.jobs import Job, get_job

router = APIRouter(prefix=V1, tags=["jobs"], responses=ERROR_RESPONSES)


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
