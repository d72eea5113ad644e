"""`advisor profiles list|show`: the performance-model profiles shipped as package data."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from advisor.profile import get_profile, profile_names
from cli.common import handles_errors, out

app = typer.Typer(help="Performance-model profiles shipped with the advisor.", no_args_is_help=True)


@app.command("list")
@handles_errors
def list_profiles() -> None:
    """List shipped profiles (a GPU's own profile is used for it by default; else roofline)."""
    table = Table("name", "gpu", "kind", "fit error", "description")
    for name in profile_names():
        p = get_profile(name)
        table.add_row(name, p.gpu or "any", p.calibration.kind, f"{p.fit_error:.0%}",
                      p.description)  # fmt: skip
    out.print(table)


@app.command("show")
@handles_errors
def show(
    name: Annotated[str, typer.Argument(help="Profile name (see `profiles list`) or JSON path.")],
) -> None:
    """Print one profile's parameters as JSON."""
    typer.echo(get_profile(name).model_dump_json(indent=2))
