"""Imports: upload a log (collectors.ingest.ingest_file), list imports, rejects and segments."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Annotated

import anyio.to_thread
from fastapi import APIRouter, HTTPException, Query, Request
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
)

from advisor import concurrency, segments
from advisor.errors import BadInput
from advisor.perf import request_latency_s, resolve
from advisor.schemas import Deployment, ImportSummary, RejectRow, SegmentStats
from advisor.segments import Bands, Filters
from advisor.store import scalar, transaction
from api.deps import V1, Db, Service, ServiceDep
from api.errors import ERROR_RESPONSES, ErrorBody
from api.routes_advice import Name
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


# Query parameters are declared as models that refuse unknown names: a misspelt filter
# (`?import=1` for `?import_id=1`) is a 422, not silently ignored.


class UploadQuery(BaseModel):
    model_config = ConfigDict(extra="forbid")

    filename: str | None = Field(
        None, max_length=255, description="file name for a raw-body upload (.gz/.zst matter)"
    )
    format: str | None = Field(None, max_length=100, description="skip detection: a collector")
    task_key: str | None = Field(None, max_length=200, description="where the task label lives")
    store_text: bool = Field(False, description="keep prompt and output text")


class RejectsQuery(BaseModel):
    model_config = ConfigDict(extra="forbid")

    limit: int = Field(100, ge=1, le=10_000)
    offset: int = Field(0, ge=0)


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
    request: Request, svc: ServiceDep, query: Annotated[UploadQuery, Query()]
) -> ImportSummary:
    """Import a log file; returns rows accepted and rejected and the detected format."""
    options = Options(task_key=query.task_key)
    fmt, text = query.format, query.store_text
    async with spooled_upload(request, query.filename, svc.max_upload_bytes) as (path, name):
        return await anyio.to_thread.run_sync(
            lambda: _ingest(svc, path, name, options, format_name=fmt, store_text=text)
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
def list_rejects(import_id: int, con: Db, query: Annotated[RejectsQuery, Query()]) -> RejectPage:
    """The rows of one import that failed validation, with line number and reason."""
    limit, offset = query.limit, query.offset
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


_BANDS = Bands()


class SegmentQuery(BaseModel):
    """Filters and bands for GET /v1/segments (query parameters; lists repeat the name)."""

    model_config = ConfigDict(extra="forbid")

    import_id: list[int] = Field(default_factory=list, description="only these imports")
    since: datetime | None = Field(None, description="only arrivals at or after (UTC)")
    until: datetime | None = Field(None, description="only arrivals before (UTC)")
    model: str | None = Field(None, description="only requests logged for this model")
    tenant: str | None = Field(None, description="only this tenant / route")
    gpu: Name = Field("h200", description="for estimating concurrency from arrivals alone")
    target: Name = Field("llama-3.1-8b", description="likewise: the served model")
    prompt_bands: list[float] = Field(default_factory=lambda: list(_BANDS.prompt))
    output_bands: list[float] = Field(default_factory=lambda: list(_BANDS.output))
    temperature_bands: list[float] = Field(default_factory=lambda: list(_BANDS.temperature))
    concurrency_bands: list[float] = Field(default_factory=lambda: list(_BANDS.concurrency))
    min_share: float = Field(_BANDS.min_share, ge=0.0, le=0.5, description="merge smaller ones")

    @field_validator("prompt_bands", "output_bands", "temperature_bands", "concurrency_bands")
    @classmethod
    def _edges(cls, edges: list[float], info: ValidationInfo) -> list[float]:
        """advisor.segments.Bands' own rule for edges, so a bad list is a 422, not a 500."""
        dim = info.field_name.removesuffix("_bands")
        try:
            Bands.model_validate({dim: edges})
        except ValidationError as exc:
            raise ValueError(exc.errors()[0]["msg"].removeprefix("Value error, ")) from None
        return edges

    def bands(self) -> Bands:
        return Bands(
            prompt=self.prompt_bands, output=self.output_bands,
            temperature=self.temperature_bands, concurrency=self.concurrency_bands,
            min_share=self.min_share,
        )  # fmt: skip


class SegmentsPage(BaseModel):
    """The segments of the selected requests, largest first."""

    requests: int
    concurrency_estimated: bool
    segments: list[SegmentStats]


@router.get("/segments", response_model=SegmentsPage)
def list_segments(
    query: Annotated[SegmentQuery, Query()], svc: ServiceDep, con: Db
) -> SegmentsPage:
    """Segment the imported requests (task x temperature x prompt x output x concurrency band).

    The same steps as a recommendation's first half: scope by the filters, fill in concurrency
    (logged, derived from finish times, or estimated with the target's service time), segment.
    """
    bands = query.bands()
    dep = Deployment(gpu=query.gpu, target=query.target)
    svc.check_names(dep)
    setup = resolve(dep, svc.profile(dep.gpu, None), svc.catalog)
    filters = Filters(
        import_ids=query.import_id, since=query.since, until=query.until,
        model=query.model, tenant=query.tenant,
    )  # fmt: skip
    scope = segments.create_scope(con, filters)
    info = concurrency.fill(con, lambda p, o, b: request_latency_s(setup, p, o, b)[1])
    stats = segments.segment(con, bands)
    return SegmentsPage(requests=scope.n, concurrency_estimated=info.was_estimated, segments=stats)
