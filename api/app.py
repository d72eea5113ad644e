"""The FastAPI app: `create_app(db_path)` wires the routes over the advisor's own functions."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import Depends, FastAPI

from advisor.catalog import load_catalog
from advisor.store import connect, default_db_path
from api import errors, routes_advice, routes_calibrations, routes_imports, routes_jobs, routes_ops
from api.auth import KeyRing
from api.deps import Service, authorized
from api.jobs import JobRunner, mark_interrupted
from api.metrics import Metrics, MetricsMiddleware
from api.uploads import DEFAULT_MAX_UPLOAD_BYTES

API_VERSION = "1"


def create_app(
    db_path: str | Path | None = None, *, max_upload_bytes: int = DEFAULT_MAX_UPLOAD_BYTES
) -> FastAPI:
    """Open (and migrate) the database now, so a busy or broken file fails before serving.

    Jobs that a previous process left running are marked interrupted; the API keys are read.
    """
    con = connect(db_path)
    mark_interrupted(con)
    svc = Service(
        db_path=Path(db_path) if db_path else default_db_path(),
        con=con,
        keys=KeyRing.load(con),
        jobs=JobRunner(con),
        metrics=Metrics(),
        max_upload_bytes=max_upload_bytes,
        catalog=load_catalog(),
    )

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        # Job threads die with the process: say so now (the next start would say it too).
        mark_interrupted(con)
        con.close()

    app = FastAPI(
        title="spec-advisor",
        version=API_VERSION,
        summary="Does speculative decoding pay off for your traffic? The advisor over HTTP.",
        lifespan=lifespan,
    )
    app.state.service = svc
    errors.install(app)
    app.add_middleware(MetricsMiddleware, metrics=svc.metrics)

    for router in (
        routes_advice.router,
        routes_imports.router,
        routes_calibrations.router,
        routes_jobs.router,
    ):
        app.include_router(router, dependencies=[Depends(authorized)])
    app.include_router(routes_ops.router)
    return app
