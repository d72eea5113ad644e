"""Background jobs (calibration runs) whose status lives in the `jobs` table.

A job runs in a daemon thread and writes its progress to its row, so GET /v1/jobs/{id} reads
the database, not process memory. When the service starts, every job still queued or running
was cut off by the previous process: it is marked interrupted, never done.
"""

from __future__ import annotations

import json
import logging
import secrets
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, Literal

import duckdb
from pydantic import BaseModel, Field

from advisor.errors import AdvisorError
from advisor.store import one

log = logging.getLogger("advisor.api.jobs")

JobStatus = Literal["queued", "running", "done", "failed", "interrupted"]
Progress = Callable[[float, str], None]
Work = Callable[[Progress], BaseModel]


class Job(BaseModel):
    """A background job as GET /v1/jobs/{id} reports it."""

    job_id: str
    kind: str
    status: JobStatus
    progress: float = Field(ge=0.0, le=1.0, description="fraction done, 0 to 1")
    message: str | None = None
    params: dict[str, Any] = {}
    result: dict[str, Any] | None = None
    error: str | None = None
    created_at: datetime
    started_at: datetime | None = None
    finished_at: datetime | None = None


_COLUMNS = (
    "job_id, kind, status, progress, message, params, result, error,"
    " created_at, started_at, finished_at"
)


def _now() -> datetime:
    return datetime.now(UTC).replace(tzinfo=None)


def mark_interrupted(con: duckdb.DuckDBPyConnection) -> int:
    """Mark jobs left queued or running by a previous process as interrupted; returns how many."""
    rows = con.execute(
        "UPDATE jobs SET status = 'interrupted', finished_at = ?,"
        " error = 'the service stopped while this job ran; start it again'"
        " WHERE status IN ('queued', 'running') RETURNING job_id",
        [_now()],
    ).fetchall()
    return len(rows)


def get_job(con: duckdb.DuckDBPyConnection, job_id: str) -> Job | None:
    """The job called `job_id`, or None."""
    row = one(con, f"SELECT {_COLUMNS} FROM jobs WHERE job_id = ?", [job_id])
    if row is None:
        return None
    values = dict(zip(_COLUMNS.replace(" ", "").split(","), row, strict=True))
    values["params"] = json.loads(values["params"]) if values["params"] else {}
    values["result"] = json.loads(values["result"]) if values["result"] else None
    return Job(**values)


def list_jobs(
    con: duckdb.DuckDBPyConnection, status: JobStatus | None = None, limit: int = 100
) -> list[Job]:
    """Jobs newest first, optionally only those in one status."""
    where = "WHERE status = ?" if status else ""
    rows = con.execute(
        f"SELECT job_id FROM jobs {where} ORDER BY created_at DESC, job_id LIMIT ?",
        [*([status] if status else []), limit],
    ).fetchall()
    return [job for (job_id,) in rows if (job := get_job(con, job_id)) is not None]


class JobRunner:
    """Starts jobs in threads; each thread writes its own row through its own cursor."""

    def __init__(self, con: duckdb.DuckDBPyConnection) -> None:
        self._con = con

    def submit(self, kind: str, params: BaseModel, work: Work) -> Job:
        """Record a queued job and start `work(progress)` in a thread; returns at once."""
        job_id = secrets.token_hex(8)
        cur = self._con.cursor()
        try:
            cur.execute(
                f"INSERT INTO jobs ({_COLUMNS}) VALUES (?, ?, 'queued', 0, NULL, ?, NULL, NULL,"
                " ?, NULL, NULL)",
                [job_id, kind, params.model_dump_json(), _now()],
            )
            job = get_job(cur, job_id)
        finally:
            cur.close()
        thread = threading.Thread(
            target=self._run, args=(job_id, work), name=f"job-{job_id}", daemon=True
        )
        thread.start()
        assert job is not None
        return job

    def _run(self, job_id: str, work: Work) -> None:
        cur = self._con.cursor()
        try:
            cur.execute(
                "UPDATE jobs SET status = 'running', started_at = ? WHERE job_id = ?",
                [_now(), job_id],
            )

            def progress(fraction: float, message: str) -> None:
                cur.execute(
                    "UPDATE jobs SET progress = ?, message = ? WHERE job_id = ?",
                    [min(max(float(fraction), 0.0), 1.0), message, job_id],
                )

            try:
                result = work(progress)
            except AdvisorError as exc:
                self._finish(cur, job_id, "failed", error=str(exc))
            except Exception as exc:
                log.exception("job %s failed", job_id)
                self._finish(cur, job_id, "failed", error=f"internal error ({type(exc).__name__})")
            else:
                self._finish(cur, job_id, "done", result=result.model_dump_json())
        finally:
            cur.close()

    @staticmethod
    def _finish(
        cur: duckdb.DuckDBPyConnection,
        job_id: str,
        status: JobStatus,
        *,
        result: str | None = None,
        error: str | None = None,
    ) -> None:
        cur.execute(
            "UPDATE jobs SET status = ?, result = ?, error = ?, finished_at = ?,"
            " progress = CASE WHEN ? = 'done' THEN 1 ELSE progress END WHERE job_id = ?",
            [status, result, error, _now(), status, job_id],
        )
