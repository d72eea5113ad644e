"""Imports: upload a log (ingested by collectors.ingest.ingest_file), list them, their rejects."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import anyio.to_thread
from fastapi import APIRouter, HTTPException, Query, Request
from pydantic import BaseModel

from advisor.errors import BadInput
from advisor.schemas import ImportSummary, RejectRow
from advisor.store import scalar, transaction
from api.deps import V1, Db, Service, ServiceDep
from api.errors import ERROR_RESPONSES, ErrorBody
from api.uploads import spooled_upload
from collectors.base import Options
from collectors.ingest import ingest_file

router = APIRouter(prefix=V1, tags=["imports"], responses=ERROR_RESPONSES)

_UPLOAD_BODY = {
    "requestBody": {
        "required": True,
        "description": "The log file: as multipart part `file`, or as the raw request body.",
        "content": {
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "properties": {"file": {"type": "string", "format": "binary"}},
                    "required": ["file"],
                }
            },
            "application/octet-stream": {"schema": {"type": "string", "format": "binary"}},
        },
    }
}


class RejectPage(BaseModel):
    """Rejected rows of one import, a page at a time."""

    import_id: int
    total: int
    rejects: list[RejectRow]


def _summary_sql(where: str) -> str:
    return (
        "SELECT import_id, file, format, checksum, rows_read, rows_accepted, rows_rejected,"
        f" started_at, finished_at FROM imports {where} ORDER BY import_id"
    )


def _summaries(con: Db, where: str = "", params: list | None = None) -> list[ImportSummary]:
    names = ImportSummary.model_fields
    cols = [c for c in names if c != "already_imported"]
    rows = con.execute(_summary_sql(where), params or []).fetchall()
    return [ImportSummary(**dict(zip(cols, r, strict=True))) for r in rows]


def _ingest(svc: Service, path: Path, name: str, options: Options, **kwargs) -> ImportSummary:
    """Runs in a worker thread, one import at a time, on its own cursor."""
    with svc.writer:
        cur = svc.con.cursor()
        try:
            label = f"upload:{name}"
            try:
                summary = ingest_file(cur, path, options=options, **kwargs)
            except BadInput as exc:
                raise BadInput(str(exc).replace(str(path), f"Uploaded file '{name}'")) from None
            if not summary.already_imported:
                # Provenance names the uploaded file, not the temp file it was spooled to.
                with transaction(cur):
                    cur.execute(
                        "UPDATE imports SET file = ? WHERE import_id = ?",
                        [label, summary.import_id],
                    )
                    cur.execute(
                        "UPDATE rejects SET file = ? WHERE import_id = ?",
                        [label, summary.import_id],
                    )
            return summary.model_copy(update={"file": label})
        finally:
            cur.close()


@router.post(
    "/imports",
    response_model=ImportSummary,
    openapi_extra=_UPLOAD_BODY,
    responses={413: {"model": ErrorBody, "description": "The upload is over the size limit."}},
)
async def upload(
    request: Request,
    svc: ServiceDep,
    filename: Annotated[
        str | None, Query(description="File name for a raw-body upload (.gz/.zst matter).")
    ] = None,
    format: Annotated[str | None, Query(description="Skip detection: a collector name.")] = None,
    task_key: Annotated[str | None, Query(description="Where the task label lives.")] = None,
    store_text: Annotated[bool, Query(description="Keep prompt and output text.")] = False,
) -> ImportSummary:
    """Import a log file; returns rows accepted and rejected and the detected format."""
    options = Options(task_key=task_key)
    async with spooled_upload(request, filename, svc.max_upload_bytes) as (path, name):
        return await anyio.to_thread.run_sync(
            lambda: _ingest(svc, path, name, options, format_name=format, store_text=store_text)
        )


@router.get("/imports", response_model=list[ImportSummary])
def list_imports(con: Db) -> list[ImportSummary]:
    """Every import, oldest first."""
    return _summaries(con)


@router.get(
    "/imports/{import_id}",
    response_model=ImportSummary,
    responses={404: {"model": ErrorBody, "description": "No such import."}},
)
def get_import(import_id: int, con: Db) -> ImportSummary:
    """One import's summary."""
    found = _summaries(con, "WHERE import_id = ?", [import_id])
    if not found:
        raise HTTPException(404, f"No import with id {import_id}; GET /v1/imports lists them.")
    return found[0]


@router.get(
    "/imports/{import_id}/rejects",
    response_model=RejectPage,
    responses={404: {"model": ErrorBody, "description": "No such import."}},
)
def list_rejects(
    import_id: int,
    con: Db,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 100,
    offset: Annotated[int, Query(ge=0)] = 0,
) -> RejectPage:
    """The rows of one import that failed validation, with line number and reason."""
    get_import(import_id, con)
    total = scalar(con, "SELECT count(*) FROM rejects WHERE import_id = ?", [import_id])
    rows = con.execute(
        "SELECT import_id, file, line, reason, raw FROM rejects WHERE import_id = ?"
        " ORDER BY line LIMIT ? OFFSET ?",
        [import_id, limit, offset],
    ).fetchall()
    cols = ("import_id", "file", "line", "reason", "raw")
    rejects = [RejectRow(**dict(zip(cols, r, strict=True))) for r in rows]
    return RejectPage(import_id=import_id, total=total, rejects=rejects)
