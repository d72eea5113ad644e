"""Every error leaves the service as JSON with one sentence, never as a stack trace."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException

from advisor.errors import AdvisorError, BadInput, DatabaseBusy

log = logging.getLogger("advisor.api")


class FieldError(BaseModel):
    """One invalid field: where it is in the request, and what was expected."""

    path: str
    message: str


class ErrorBody(BaseModel):
    """The body of every 4xx/5xx response."""

    detail: str
    errors: list[FieldError] = []


def _json(status: int, detail: str, errors: list[FieldError] | None = None, headers=None):
    body = ErrorBody(detail=detail, errors=errors or [])
    return JSONResponse(body.model_dump(), status_code=status, headers=headers)


def _path(loc: tuple | list) -> str:
    return ".".join(str(part) for part in loc)


async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
    errors = [FieldError(path=_path(e["loc"]), message=e["msg"]) for e in exc.errors()]
    where = "; ".join(f"{e.path}: {e.message}" for e in errors)
    return _json(422, f"The request is invalid: {where}.", errors)


async def _advisor(_: Request, exc: AdvisorError) -> JSONResponse:
    if isinstance(exc, BadInput):
        return _json(400, str(exc))
    if isinstance(exc, DatabaseBusy):
        return _json(503, str(exc), headers={"Retry-After": "5"})
    return _json(500, str(exc))


async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    headers = getattr(exc, "headers", None)
    if exc.status_code == 405:
        # Starlette names only the first matching route's methods; GET and POST on one path
        # are two routes here, so list every method the path takes.
        allowed = sorted(
            {m for r in request.app.routes if isinstance(r, APIRoute)
             and r.path_regex.match(request.url.path) for m in r.methods}
        )  # fmt: skip
        headers = {**(headers or {}), "Allow": ", ".join(allowed)}
        detail = f"{request.method} is not allowed here; use {' or '.join(allowed)}."
        return _json(405, detail, headers=headers)
    return _json(exc.status_code, str(exc.detail), headers=headers)


async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
    log.error("unexpected error on %s %s", request.method, request.url.path, exc_info=exc)
    return _json(500, "Internal error; the service log has the details.")


def install(app: FastAPI) -> None:
    """Register the handlers on `app`."""
    app.add_exception_handler(RequestValidationError, _validation)
    app.add_exception_handler(AdvisorError, _advisor)
    app.add_exception_handler(StarletteHTTPException, _http)
    app.add_exception_handler(Exception, _unexpected)


# Declared on routes so the OpenAPI document describes the error bodies clients get.
ERROR_RESPONSES: dict[int | str, dict] = {
    400: {"model": ErrorBody, "description": "Bad input, e.g. an unknown GPU or model name."},
    401: {"model": ErrorBody, "description": "No API key was sent and the service needs one."},
    403: {"model": ErrorBody, "description": "The API key is wrong or revoked."},
    422: {"model": ErrorBody, "description": "Invalid body or parameters; `errors` names each."},
    503: {"model": ErrorBody, "description": "The database is busy; retry."},
}
