"""`advisor ingest`, `advisor imports`, `advisor rejects`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from advisor.store import one
from cli.common import DbOption, err, handles_errors, interactive, open_db, out
from collectors.base import Options, parse_mapping
from collectors.ingest import ingest_file
from collectors.registry import COLLECTORS


@handles_errors
def ingest(
    files: Annotated[
        list[Path] | None, typer.Argument(help="Log files (.gz/.zst are fine).")
    ] = None,
    format_name: Annotated[
        str | None, typer.Option("--format", help="Skip detection; see --list-formats.")
    ] = None,
    map_: Annotated[
        list[str] | None,
        typer.Option("--map", help="FIELD=COLUMN for generic exports; repeatable."),
    ] = None,
    map_file: Annotated[
        str | None, typer.Option("--map-file", help="JSON/TOML file of FIELD = column pairs.")
    ] = None,
    task_key: Annotated[
        str | None, typer.Option(help="Where the task label lives, e.g. metadata.task.")
    ] = None,
    store_text: Annotated[
        bool, typer.Option("--store-text", help="Keep prompt and output text (opt-in).")
    ] = False,
    list_formats: Annotated[
        bool, typer.Option("--list-formats", help="List the known formats and exit.")
    ] = False,
    db: DbOption = None,
) -> None:
    """Import request logs into the database, one transaction per file."""
    if list_formats:
        table = Table("format", "what it reads", "detected by")
        for c in COLLECTORS:
            table.add_row(c.name, c.summary, c.expects)
        out.print(table)
        return
    if not files:
        err.print("error: give at least one log file (or --list-formats).")
        raise typer.Exit(2)
    options = Options(task_key=task_key, mapping=parse_mapping(map_ or [], map_file))
    con = open_db(db)
    for path in files:
        if interactive():
            with Progress(
                TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(),
                console=err, transient=True,
            ) as bar:  # fmt: skip
                task = bar.add_task(f"importing {path.name}", total=100)
                summary = ingest_file(
                    con, path, format_name=format_name, options=options, store_text=store_text,
                    on_progress=lambda pct, t=task: bar.update(t, completed=pct),
                )  # fmt: skip
        else:
            summary = ingest_file(
                con, path, format_name=format_name, options=options, store_text=store_text
            )
        out.print(summary.sentence())


@handles_errors
def imports(db: DbOption = None) -> None:
    """List the imports in the database."""
    con = open_db(db, read_only=True)
    rows = con.execute(
        "SELECT import_id, format, rows_accepted, rows_rejected, finished_at, file"
        " FROM imports ORDER BY import_id"
    ).fetchall()
    table = Table("id", "format", "imported", "rejected", "finished (UTC)", "file")
    for r in rows:
        table.add_row(str(r[0]), r[1], str(r[2]), str(r[3]), f"{r[4]:%Y-%m-%d %H:%M:%S}", r[5])
    out.print(table if rows else "No imports yet.")


@handles_errors
def rejects(
    import_id: Annotated[int | None, typer.Argument(help="Only this import.")] = None,
    limit: Annotated[int, typer.Option(help="At most this many rows.")] = 50,
    db: DbOption = None,
) -> None:
    """Show rejected rows with their line and reason."""
    con = open_db(db, read_only=True)
    where = "WHERE import_id = ?" if import_id is not None else ""
    params = [import_id] if import_id is not None else []
    total = one(con, f"SELECT count(*) FROM rejects {where}", params)[0]
    rows = con.execute(
        f"SELECT import_id, file, line, reason FROM rejects {where}"
        f" ORDER BY import_id, line LIMIT {int(limit)}",
        params,
    ).fetchall()
    table = Table("import", "file", "line", "reason")
    for r in rows:
        table.add_row(str(r[0]), r[1], str(r[2]), r[3])
    out.print(table if rows else "No rejected rows.")
    if total > len(rows):
        out.print(f"... {total - len(rows)} more (use --limit).")
