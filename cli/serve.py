"""`advisor serve`: the REST API (api/) under uvicorn."""

from __future__ import annotations

import ipaddress
from typing import Annotated

import typer

from cli.common import DbOption, err, handles_errors

MIB = 1 << 20


def is_loopback(host: str) -> bool:
    """True for 127.0.0.0/8, ::1 and localhost; any other name may be reachable from outside."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@handles_errors
def serve(
    host: Annotated[str, typer.Option(help="Address to bind.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=1, max=65535, help="Port to bind.")] = 8000,
    max_upload_mb: Annotated[
        int, typer.Option(min=1, help="Largest log upload accepted, in MiB (larger: 413).")
    ] = 1024,
    db: DbOption = None,
) -> None:
    """Serve the advisor over HTTP: JSON under /v1, OpenAPI at /openapi.json and /docs."""
    import uvicorn  # deferred with the app: FastAPI costs every other command ~0.6 s to import

    from api.app import create_app

    app = create_app(db, max_upload_bytes=max_upload_mb * MIB)
    if not app.state.service.keys.any_key and not is_loopback(host):
        err.print(
            f"[yellow]warning:[/yellow] serving on {host} with no API key: anyone who can reach "
            "this port can use the service. Stop it and run `advisor keys create --name NAME`."
        )
    uvicorn.run(app, host=host, port=port, log_level="info", access_log=False)
