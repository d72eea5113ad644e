"""Operations: liveness, readiness, and Prometheus metrics. Open without a key (probes)."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel

from advisor.store import migrations, schema_version
from api.deps import ServiceDep

router = APIRouter(tags=["operations"])


class Health(BaseModel):
    status: str


class Readiness(BaseModel):
    status: str
    schema_version: int
    detail: str | None = None


@router.get("/healthz", response_model=Health)
async def healthz() -> Health:
    """The process is up and serving HTTP."""
    return Health(status="ok")


@router.get(
    "/readyz",
    response_model=Readiness,
    responses={503: {"model": Readiness, "description": "The database is not usable."}},
)
def readyz(svc: ServiceDep) -> Readiness | JSONResponse:
    """The database answers and carries every migration this version ships."""
    cur = svc.con.cursor()
    try:
        version = schema_version(cur)
    except Exception as exc:  # any database failure means not ready; say which
        body = Readiness(status="unavailable", schema_version=0, detail=type(exc).__name__)
        return JSONResponse(body.model_dump(), status_code=503)
    finally:
        cur.close()
    newest = migrations()[-1][0]
    if version != newest:
        body = Readiness(
            status="unavailable",
            schema_version=version,
            detail=f"database schema {version}, this version needs {newest}",
        )
        return JSONResponse(body.model_dump(), status_code=503)
    return Readiness(status="ready", schema_version=version)


@router.get("/metrics", response_class=Response, responses={200: {"content": {"text/plain": {}}}})
def metrics(svc: ServiceDep) -> Response:
    """Request counts and latency of this service, in Prometheus' text format."""
    return Response(generate_latest(svc.metrics.registry), media_type=CONTENT_TYPE_LATEST)
