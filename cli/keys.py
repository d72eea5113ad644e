"""`advisor keys create|revoke|list`: API keys for `advisor serve`.

The service reads keys when it starts, and DuckDB lets one process hold the file: manage keys
while the service is stopped, then start it again.
"""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from cli.common import DbOption, err, handles_errors, open_db, out

app = typer.Typer(help="Manage API keys for `advisor serve`.", no_args_is_help=True)


@app.command()
@handles_errors
def create(
    name: Annotated[str, typer.Option(help="Who or what uses the key, e.g. capacity-planner.")],
    db: DbOption = None,
) -> None:
    """Create a key and print it once (stdout); only its hash is stored."""
    from api.auth import create_key  # deferred: FastAPI is slow to import for other commands

    info, key = create_key(open_db(db), name)
    err.print(
        f"Created key {info.key_id} ({info.name}). It is shown only now; "
        "every /v1 request now needs 'Authorization: Bearer KEY'."
    )
    print(key)


@app.command()
@handles_errors
def revoke(
    key_id: Annotated[str, typer.Argument(help="The key's id, from `advisor keys list`.")],
    db: DbOption = None,
) -> None:
    """Revoke a key: requests that send it get 403 from the next start of the service on."""
    from api.auth import revoke_key

    info = revoke_key(open_db(db), key_id)
    out.print(f"Key {info.key_id} ({info.name}) is revoked.")


@app.command("list")
@handles_errors
def list_(db: DbOption = None) -> None:
    """List keys (ids and names; secrets are never stored)."""
    from api.auth import list_keys

    keys = list_keys(open_db(db))
    table = Table("id", "name", "created (UTC)", "revoked (UTC)")
    for k in keys:
        revoked = f"{k.revoked_at:%Y-%m-%d %H:%M:%S}" if k.revoked_at else ""
        table.add_row(k.key_id, k.name, f"{k.created_at:%Y-%m-%d %H:%M:%S}", revoked)
    out.print(table if keys else "No API keys: the service is open to anyone who can reach it.")
