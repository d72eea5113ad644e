"""What every command shares: the --db option, the consoles, and turning errors into exit codes."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, ParamSpec, TypeVar

import duckdb
import typer
from rich.console import Console

from advisor.errors import AdvisorError
from advisor.store import connect

# Piped output is read by scripts and logs: give tables room instead of rich's 80-column default.
_WIDTH = None if sys.stdout.isatty() else 220
out = Console(highlight=False, soft_wrap=True, width=_WIDTH)
err = Console(stderr=True, highlight=False, soft_wrap=True, width=_WIDTH)

DbOption = Annotated[
    Path | None,
    typer.Option(
        "--db",
        envvar="ADVISOR_DB",
        help="DuckDB file (default ./advisor.duckdb).",
        show_default=False,
    ),
]

P = ParamSpec("P")
R = TypeVar("R")


def handles_errors(fn: Callable[P, R]) -> Callable[P, R]:
    """Expected failures become one red sentence on stderr and DESIGN.md's exit code."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return fn(*args, **kwargs)
        except AdvisorError as exc:
            err.print(f"[red]error:[/red] {exc}")
            raise typer.Exit(exc.exit_code) from None
        except KeyboardInterrupt:
            err.print("[yellow]interrupted[/yellow]: nothing was half-written.")
            raise typer.Exit(130) from None

    return wrapper


def open_db(db: Path | None, *, read_only: bool = False) -> duckdb.DuckDBPyConnection:
    """The store for a command (see advisor.store.connect)."""
    return connect(db, read_only=read_only)


def interactive() -> bool:
    """Progress bars only on a terminal; pipes and CI stay quiet."""
    return sys.stderr.isatty()
