"""What route handlers share: the service state and a database cursor per request."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated

import anyio
import duckdb
from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials

from advisor.calibrations import profile_for
from advisor.catalog import Catalog, get_gpu, get_model
from advisor.errors import BadInput
from advisor.profile import Profile, load_profile, profile_names
from advisor.schemas import Deployment
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
    catalog: Catalog
    # One import at a time: imports are the writers; readers never wait for this lock.
    writer: threading.Lock = field(default_factory=threading.Lock)
    # Recommendations are CPU-bound Python (milliseconds each): at most two run at once, the
    # rest queue in order. Dozens of threads taking turns on the GIL would all finish late.
    compute: anyio.CapacityLimiter = field(default_factory=lambda: anyio.CapacityLimiter(2))
    _profiles: dict[tuple[str, str | None], Profile] = field(default_factory=dict)

    def check_names(self, dep: Deployment) -> None:
        """BadInput (400) listing the valid names unless every name is in the catalogue.

        Checked here, before the advisor sees them, because the advisor would take a name that
        looks like a path as a config file to read.
        """
        get_gpu(dep.gpu, self.catalog)
        for field_name, name in (("target", dep.target), ("draft", dep.draft)):
            if name is not None and name.lower() not in self.catalog.models:
                known = ", ".join(sorted(self.catalog.models))
                raise BadInput(f"unknown model {name!r} in {field_name}; known models: {known}.")
        get_model(dep.target, self.catalog)

    def calibrated(self, gpu: str, calibration: str | None) -> Profile:
        """The profile a request asked for: a stored calibration's fit (an id or `latest`), a
        shipped profile name, or by default the GPU's profile. Never a file path."""
        text = (calibration or "").strip()
        if text.isdigit() or text.lower() == "latest":
            cur = self.con.cursor()
            try:
                return profile_for(cur, text)
            finally:
                cur.close()
        if text and text not in profile_names():
            raise BadInput(
                f"calibration {text!r} is neither a stored calibration id (GET /v1/calibrations),"
                f" `latest`, nor a shipped profile ({', '.join(profile_names())})."
            )
        return self.profile(gpu, text or None)

    def profile(self, gpu: str, name: str | None) -> Profile:
        """advisor.profile.load_profile, read once per (gpu, name): shipped profiles are static."""
        key = (gpu.lower(), name)
        if key not in self._profiles:
            if name is not None and name not in profile_names():
                known = ", ".join(profile_names())
                raise BadInput(f"unknown profile {name!r}; shipped profiles: {known}.")
            self._profiles[key] = load_profile(gpu, name)
        return self._profiles[key]


# The dependencies below are `async def` although they never await: FastAPI runs a plain `def`
# dependency in a worker thread, and a thread hop per dependency per request is most of the
# cost of a fast endpoint.


async def service(request: Request) -> Service:
    return request.app.state.service


def cursor(request: Request) -> Iterator[duckdb.DuckDBPyConnection]:
    """A cursor of the process-wide connection for this request, closed after it."""
    cur = request.app.state.service.con.cursor()
    try:
        yield cur
    finally:
        cur.close()


async def authorized(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
) -> None:
    """The /v1 routes' key check (see api.auth.require_key)."""
    require_key(request, credentials)


Db = Annotated[duckdb.DuckDBPyConnection, Depends(cursor)]
ServiceDep = Annotated[Service, Depends(service)]
