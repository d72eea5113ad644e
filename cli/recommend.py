"""`advisor recommend`: import log files if given, then a verdict per workload segment."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from advisor import report
from advisor.catalog import load_catalog
from advisor.errors import BadInput
from advisor.recommend import recommend as run_recommend
from advisor.recommend import resolve_profile
from advisor.schemas import Recommendation
from advisor.scoring import THRESHOLD
from advisor.segments import Bands, Filters, parse_edges
from cli.common import DbOption, err, handles_errors, interactive, open_db, out
from cli.predict import (
    DEFAULT_DEPLOYMENT,
    DraftOption,
    GpuOption,
    KOption,
    MethodOption,
    TargetOption,
    TpOption,
    UtilOption,
    make_deployment,
)
from collectors.ingest import ingest_file

FORMATS = ("table", "json", "markdown", "html")
_DEFAULT_BANDS = Bands()


def _edges_help(what: str, edges: list[float]) -> str:
    return f"{what} band edges, comma-separated (default {','.join(f'{e:g}' for e in edges)})."


def parse_time(flag: str, value: str | None) -> datetime | None:
    """ISO 8601 date or date-time (UTC), or BadInput naming the flag."""
    if value is None:
        return None
    try:
        parsed = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
    except ValueError:
        raise BadInput(
            f"{flag} {value!r} is not a date or time; expected ISO 8601 such as 2024-01-31 or "
            "2024-01-31T12:00:00."
        ) from None
    if parsed.tzinfo is not None:
        parsed = parsed.astimezone(UTC).replace(tzinfo=None)
    return parsed


def make_bands(
    prompt: str | None, output: str | None, temperature: str | None, conc: str | None,
    min_share: float,
) -> Bands:  # fmt: skip
    """Bands from the flags; unset flags keep the defaults."""
    if not 0.0 <= min_share <= 0.5:
        raise BadInput(f"--min-share {min_share} must be between 0 and 0.5 (a fraction).")
    given = {
        "prompt": (prompt, "--prompt-bands"),
        "output": (output, "--output-bands"),
        "temperature": (temperature, "--temperature-bands"),
        "concurrency": (conc, "--concurrency-bands"),
    }
    edges = {dim: parse_edges(flag, text) for dim, (text, flag) in given.items() if text}
    return Bands(min_share=min_share, **edges)


@handles_errors
def recommend(
    files: Annotated[
        list[Path] | None,
        typer.Argument(help="Log files to import first (any format `advisor ingest` reads)."),
    ] = None,
    import_ids: Annotated[
        list[int] | None,
        typer.Option("--import", help="Only these import ids (repeatable; see advisor imports)."),
    ] = None,
    since: Annotated[str | None, typer.Option(help="Only arrivals at or after (ISO, UTC).")] = None,
    until: Annotated[str | None, typer.Option(help="Only arrivals before (ISO, UTC).")] = None,
    model: Annotated[str | None, typer.Option(help="Only requests for this model.")] = None,
    tenant: Annotated[str | None, typer.Option(help="Only this tenant / route.")] = None,
    gpu: GpuOption = DEFAULT_DEPLOYMENT.gpu,
    target: TargetOption = DEFAULT_DEPLOYMENT.target,
    method: MethodOption = DEFAULT_DEPLOYMENT.method,
    draft: DraftOption = None,
    k: KOption = "auto",
    gpu_memory_utilization: UtilOption = DEFAULT_DEPLOYMENT.gpu_memory_utilization,
    tp: TpOption = DEFAULT_DEPLOYMENT.tp,
    calibration: Annotated[
        str | None,
        typer.Option(
            help="Stored calibration id or `latest` (see advisor calibrations list), or a "
            "profile name / JSON path. Default: the GPU's shipped profile, else the roofline."
        ),
    ] = None,
    allow_partial: Annotated[
        bool,
        typer.Option("--allow-partial", help="Accept a calibration that ended early (partial)."),
    ] = False,
    catalog: Annotated[
        Path | None, typer.Option(help="Extra GPU/model catalogue JSON (also ADVISOR_CATALOG).")
    ] = None,
    threshold: Annotated[
        float, typer.Option(help="Enable only when the e2e interval's low end clears this.")
    ] = THRESHOLD,
    format_: Annotated[
        str, typer.Option("--format", help=f"Output: {', '.join(FORMATS)}.")
    ] = "table",
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="Write the report here, not stdout.")
    ] = None,
    log_format: Annotated[
        str | None, typer.Option(help="Log format of FILES; skips detection.")
    ] = None,
    prompt_bands: Annotated[
        str | None, typer.Option(help=_edges_help("Prompt-token", _DEFAULT_BANDS.prompt))
    ] = None,
    output_bands: Annotated[
        str | None, typer.Option(help=_edges_help("Output-token", _DEFAULT_BANDS.output))
    ] = None,
    temperature_bands: Annotated[
        str | None, typer.Option(help=_edges_help("Temperature", _DEFAULT_BANDS.temperature))
    ] = None,
    concurrency_bands: Annotated[
        str | None, typer.Option(help=_edges_help("Concurrency", _DEFAULT_BANDS.concurrency))
    ] = None,
    min_share: Annotated[
        float, typer.Option(help="Segments under this share of traffic merge into neighbours.")
    ] = _DEFAULT_BANDS.min_share,
    db: DbOption = None,
) -> None:
    """Per workload segment: enable, disable or try speculative decoding, and why."""
    if format_ not in FORMATS:
        raise BadInput(f"--format {format_!r} must be one of {', '.join(FORMATS)}.")
    if output is not None and not output.parent.exists():
        raise BadInput(f"--output {output}: folder {output.parent} does not exist.")
    deployment = make_deployment(gpu, target, method, draft, k, gpu_memory_utilization, tp)
    bands = make_bands(prompt_bands, output_bands, temperature_bands, concurrency_bands, min_share)
    cat = load_catalog(catalog)
    filters = Filters(
        import_ids=list(import_ids or []),
        since=parse_time("--since", since),
        until=parse_time("--until", until),
        model=model,
        tenant=tenant,
    )
    con = open_db(db, read_only=not files)
    for path in files or []:
        summary = _import(con, path, log_format)
        err.print(summary.sentence())
        filters.import_ids.append(summary.import_id)
    profile = resolve_profile(con, deployment.gpu, calibration, allow_partial=allow_partial)
    rec = run_recommend(con, deployment, profile, filters, bands, threshold=threshold, catalog=cat)
    _emit(rec, format_, output)


def _import(con, path: Path, log_format: str | None):
    if not interactive():
        return ingest_file(con, path, format_name=log_format)
    with Progress(
        TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(),
        console=err, transient=True,
    ) as bar:  # fmt: skip
        task = bar.add_task(f"importing {path.name}", total=100)
        return ingest_file(
            con, path, format_name=log_format,
            on_progress=lambda pct: bar.update(task, completed=pct),
        )  # fmt: skip


def _emit(rec: Recommendation, format_: str, output: Path | None) -> None:
    """Render in the asked format to stdout or --output; always name the calibration used."""
    if format_ == "table":
        if output is None:
            out.print(report.table(rec))
            return
        with output.open("w", encoding="utf-8") as f:
            Console(file=f, width=220, no_color=True, highlight=False).print(report.table(rec))
    else:
        text = {
            "json": report.to_json,
            "markdown": report.markdown,
            "html": report.to_html,
        }[format_](rec)
        if output is None:
            typer.echo(text)
            return
        output.write_text(text, encoding="utf-8")
    err.print(f"wrote {output} ({format_}); calibration: {rec.calibration.id} "
              f"({rec.calibration.kind})")  # fmt: skip
