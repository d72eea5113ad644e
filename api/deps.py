"""What route handlers share: the service state and a database cursor per request."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated

import duckdb
from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials

from api.auth import KeyRing, bearer, require_key
from api.jobs import JobRunner
from api.metrics import Metrics

# Every versioned route lives under this prefix; routers carry it so route templates are whole.
V1 = "/v1"


@dataclass
class Service:
    """Process-wide state. DuckDB lets one process open the file, so there is one connection
    here and every request works on its own cursor of it (many readers, one writer)."""

    db_path: Path
    con: duckdb.DuckDBPyConnection
    keys: KeyRing
    jobs: JobRunner
    metrics: Metrics
    max_upload_bytes: int
    # One import at a time: imports are the writers; readers never wait for this lock.
    writer: threading.Lock = field(default_factory=threading.Lock)


def service(request: Request) -> Service:
    return request.app.state.service


def cursor(request: Request) -> Iterator[duckdb.DuckDBPyConnection]:
    """A cursor of the process-wide connection for this request, closed after it."""
    cur = service(request).con.cursor()
    try:
        yield cur
    finally:
        cur.close()


def authorized(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
) -> None:
    """The /v1 routes' key check (see api.auth.require_key)."""
    require_key(request, credentials)


Db = Annotated[duckdb.DuckDBPyConnection, Depends(cursor)]
ServiceDep = Annotated[Service, Depends(service)]
