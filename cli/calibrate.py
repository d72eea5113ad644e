"""`advisor calibrate` and `advisor calibrations list|show|diff`."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated

import duckdb
import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from advisor.calibrations import (
    StoredCalibration,
    compare_verdicts,
    get_calibration,
    list_calibrations,
    parameter_drift,
    profile_for,
)
from advisor.errors import BadInput, DatabaseBusy
from advisor.perf import resolve
from advisor.recommend import recommend as run_recommend
from advisor.schemas import Deployment, Recommendation
from advisor.segments import Filters
from calibration.run import Outcome, Plan, RunSettings, make_plan, speculative_config
from calibration.run import Progress as RunProgress
from calibration.run import calibrate as run_calibration
from calibration.sampling import Precision
from calibration.schemas import ServerSpec
from calibration.servers import attach, launched
from cli.common import DbOption, err, handles_errors, interactive, open_db, out
from cli.predict import METHODS
from cli.recommend import make_bands, parse_time

ImportOption = Annotated[
    list[int] | None,
    typer.Option("--import", help="Only these import ids (repeatable; see advisor imports)."),
]
SinceOption = Annotated[str | None, typer.Option(help="Only arrivals at or after (ISO, UTC).")]
UntilOption = Annotated[str | None, typer.Option(help="Only arrivals before (ISO, UTC).")]
ModelOption = Annotated[str | None, typer.Option(help="Only requests for this model.")]
TenantOption = Annotated[str | None, typer.Option(help="Only this tenant / route.")]
AllowPartial = Annotated[
    bool, typer.Option("--allow-partial", help="Use a calibration that ended early.")
]


def _filters(
    import_ids: list[int] | None, since: str | None, until: str | None,
    model: str | None, tenant: str | None,
) -> Filters:  # fmt: skip
    return Filters(
        import_ids=list(import_ids or []),
        since=parse_time("--since", since),
        until=parse_time("--until", until),
        model=model,
        tenant=tenant,
    )


def _fmt(value: float | None, spec: str = ".3f", missing: str = "-") -> str:
    return missing if value is None else format(value, spec)


@handles_errors
def calibrate(
    ctx: typer.Context,
    baseline_url: Annotated[
        str | None, typer.Option(help="Attach: a running vLLM server without speculation.")
    ] = None,
    speculative_url: Annotated[
        str | None, typer.Option(help="Attach: a running vLLM server with speculation.")
    ] = None,
    launch: Annotated[
        bool, typer.Option("--launch", help="Start both vLLM servers here (side by side).")
    ] = False,
    target: Annotated[
        str | None,
        typer.Option(help="Model to serve (launch), or its catalogue name / config path."),
    ] = None,
    method: Annotated[str | None, typer.Option(help=f"One of {', '.join(METHODS)}.")] = None,
    draft: Annotated[str | None, typer.Option(help="Draft model / EAGLE head to load.")] = None,
    k: Annotated[int | None, typer.Option("--k", help="Speculative tokens per step.")] = None,
    speculative_config_json: Annotated[
        str | None,
        typer.Option(
            "--speculative-config",
            help="JSON merged into the generated --speculative-config (launch), e.g. synthetic "
            "acceptance rates.",
        ),
    ] = None,
    gpu: Annotated[str, typer.Option(help="GPU catalogue name the servers run on.")] = "h200",
    gpu_memory_utilization: Annotated[
        float | None,
        typer.Option(help="Per launched server (default 0.45 side by side on one GPU, else 0.9)."),
    ] = None,
    devices: Annotated[
        str | None,
        typer.Option(
            "--devices",
            help="Launch on separate GPUs: CUDA device ids of the baseline and the speculative "
            "server, e.g. 0,1 (default: both on the visible GPU, side by side).",
        ),
    ] = None,
    vllm_python: Annotated[
        str | None,
        typer.Option(help="Interpreter with vLLM installed (also VLLM_PYTHON); default: this."),
    ] = None,
    log_dir: Annotated[Path, typer.Option(help="Where launched servers' logs go.")] = Path(
        "calibration-logs"
    ),
    startup_timeout: Annotated[
        float, typer.Option(help="Seconds to wait for /health of a launched server.")
    ] = 900.0,
    precision: Annotated[
        float,
        typer.Option(
            help="Stop a segment when its 95% intervals are this tight: +- acceptance "
            "(absolute) and +- speedup (relative)."
        ),
    ] = 0.05,
    max_requests: Annotated[int, typer.Option(help="Most requests per segment.")] = 64,
    max_minutes: Annotated[float, typer.Option(help="Most replay minutes per segment.")] = 10.0,
    time_limit: Annotated[
        float | None,
        typer.Option(help="Minutes for the whole run; stops early (stored as partial)."),
    ] = None,
    max_concurrency: Annotated[
        int, typer.Option(help="Cap on the replay concurrency of a segment.")
    ] = 16,
    chat: Annotated[
        bool,
        typer.Option("--chat", help="Replay as chat messages (the model's chat template)."),
    ] = False,
    seed: Annotated[int, typer.Option(help="Sampling and prompt seed.")] = 0,
    notes: Annotated[str | None, typer.Option(help="Free text stored with the run.")] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Print the plan; touch no server.")
    ] = False,
    import_ids: ImportOption = None,
    since: SinceOption = None,
    until: UntilOption = None,
    model: ModelOption = None,
    tenant: TenantOption = None,
    prompt_bands: Annotated[str | None, typer.Option(help="Prompt-token band edges.")] = None,
    output_bands: Annotated[str | None, typer.Option(help="Output-token band edges.")] = None,
    temperature_bands: Annotated[str | None, typer.Option(help="Temperature band edges.")] = None,
    concurrency_bands: Annotated[str | None, typer.Option(help="Concurrency band edges.")] = None,
    min_share: Annotated[float, typer.Option(help="Segments under this share merge.")] = 0.02,
    db: DbOption = None,
) -> None:
    """Measure speculation on real vLLM servers with your traffic, fit and store the result.

    Replays a stratified sample of the imported requests on a baseline and a speculative vLLM
    server, fits acceptance and step costs, and stores the calibration. Extra vLLM arguments go
    after `--`.
    """
    extra_args = list(ctx.args)
    attach_mode = baseline_url is not None or speculative_url is not None
    if launch == attach_mode:
        raise BadInput(
            "Give either --baseline-url and --speculative-url (attach) or --launch --target "
            "MODEL (launch), not both and not neither."
        )
    if attach_mode and (baseline_url is None or speculative_url is None):
        raise BadInput("Attach mode needs both --baseline-url and --speculative-url.")
    if attach_mode and extra_args:
        raise BadInput(f"Extra vLLM arguments ({' '.join(extra_args)}) only apply with --launch.")
    if launch and not target:
        raise BadInput("--launch needs --target MODEL (an HF id or a local model folder).")
    if method not in METHODS:
        raise BadInput(
            f"--method {method!r} must be one of {', '.join(METHODS)} (the servers do not "
            "report it, so it is always given)."
        )
    if k is None or not 1 <= k <= 16:
        raise BadInput(f"--k {k} must be the speculative tokens per step, from 1 to 16.")
    if precision <= 0 or max_requests < 2 or max_minutes <= 0:
        raise BadInput(
            "--precision and --max-minutes must be positive and --max-requests at least 2."
        )
    extra_config = _json_object("--speculative-config", speculative_config_json)
    spec_config = speculative_config(method, k, draft, extra_config) if launch else None
    if attach_mode and (devices or gpu_memory_utilization):
        raise BadInput("--devices and --gpu-memory-utilization only apply with --launch.")
    envs = _device_envs(devices)
    settings = RunSettings(
        gpu=gpu, target=target or "(served model)", method=method, draft=draft, k=k,
        filters=_filters(import_ids, since, until, model, tenant),
        bands=make_bands(prompt_bands, output_bands, temperature_bands, concurrency_bands,
                         min_share),
        precision=Precision(acceptance_half_width=precision, speedup_half_width=precision,
                            max_requests=max_requests, max_minutes=max_minutes),
        max_concurrency=max_concurrency, time_limit_minutes=time_limit, chat=chat, seed=seed,
        notes=notes,
    )  # fmt: skip
    con = open_db(db, read_only=True)
    try:
        plan, samples = make_plan(con, settings)
    finally:
        con.close()
    if dry_run:
        _print_plan(plan, spec_config, envs)
        return
    if attach_mode:
        assert baseline_url is not None and speculative_url is not None
        baseline, speculative = (
            attach(baseline_url, "baseline"),
            attach(speculative_url, "speculative"),
        )
        if target is None:
            plan.settings.target = baseline.model
        outcome = _run(db, plan, samples, baseline, speculative)
    else:
        assert target is not None and spec_config is not None
        util = gpu_memory_utilization or (0.9 if devices else 0.45)
        common = dict(model=target, gpu_memory_utilization=util, extra_args=extra_args,
                      python=vllm_python, log_dir=log_dir,
                      startup_timeout_s=startup_timeout)  # fmt: skip
        specs = (
            ServerSpec(role="baseline", env=envs[0], **common),
            ServerSpec(role="speculative", speculative_config=spec_config, env=envs[1], **common),
        )
        err.print(f"starting 2 vLLM servers for {target} (logs in {log_dir}/) ...")
        with launched(*specs) as (baseline, speculative):
            err.print(f"servers ready: vLLM {baseline.vllm_version} at {baseline.url} and "
                      f"{speculative.url}")  # fmt: skip
            outcome = _run(db, plan, samples, baseline, speculative)
    _print_outcome(outcome)
    if outcome.status == "partial":
        raise typer.Exit(130 if outcome.stop_reason == "interrupted" else 1)


def _device_envs(devices: str | None) -> tuple[dict[str, str], dict[str, str]]:
    """CUDA_VISIBLE_DEVICES for the baseline and the speculative server (`--devices 0,1`)."""
    if devices is None:
        return {}, {}
    ids = [d.strip() for d in devices.split(",")]
    if len(ids) != 2 or not all(d.isdigit() for d in ids) or ids[0] == ids[1]:
        raise BadInput(
            f"--devices {devices!r} must be two different CUDA device ids, baseline first, "
            "e.g. --devices 0,1."
        )
    return {"CUDA_VISIBLE_DEVICES": ids[0]}, {"CUDA_VISIBLE_DEVICES": ids[1]}


def _json_object(flag: str, text: str | None) -> dict[str, object] | None:
    if text is None:
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise BadInput(f"{flag} is not valid JSON ({exc.msg}); expected an object.") from None
    if not isinstance(value, dict):
        raise BadInput(f"{flag} must be a JSON object, e.g. '{{\"num_speculative_tokens\": 4}}'.")
    return value


def _open_when_free(db: Path | None, wait_s: float = 600.0) -> duckdb.DuckDBPyConnection:
    """The store for writing the result; waits (up to `wait_s`) while another process holds it,
    rather than losing a run that took GPU time."""
    deadline = time.monotonic() + wait_s
    warned = False
    while True:
        try:
            return open_db(db)
        except DatabaseBusy as exc:
            if time.monotonic() > deadline:
                raise DatabaseBusy(
                    f"{exc} The calibration was measured but could not be stored after waiting "
                    f"{wait_s:.0f} s."
                ) from None
            if not warned:
                err.print(f"waiting to store the calibration: {exc}")
                warned = True
            time.sleep(2.0)


def _run(db: Path | None, plan: Plan, samples, baseline, speculative) -> Outcome:
    def store() -> duckdb.DuckDBPyConnection:
        return _open_when_free(db)

    if not interactive():
        return run_calibration(store, plan, samples, baseline, speculative)
    with Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        console=err, transient=True,
    ) as bar:  # fmt: skip
        task = bar.add_task("calibrating", total=None)

        def show(p: RunProgress) -> None:
            what = f"round {p.round}, {p.requests} req on {p.role}: {p.segment_key}"
            if p.estimate is not None and p.estimate.acceptance is not None:
                what = (
                    f"acceptance {p.estimate.acceptance:.2f} +-"
                    f"{p.estimate.acceptance_half_width:.2f} after round {p.round}: {p.segment_key}"
                )
            bar.update(task, description=what, completed=p.done_requests,
                       total=p.budget_requests)  # fmt: skip

        return run_calibration(store, plan, samples, baseline, speculative, on_progress=show)


def _print_plan(
    plan: Plan,
    spec_config: dict[str, object] | None,
    envs: tuple[dict[str, str], dict[str, str]],
) -> None:
    s = plan.settings
    out.print(
        f"Plan (dry run, no server touched): {len(plan.segments)} segments from "
        f"{plan.requests_in_scope} requests; {s.method} k={s.k} on {s.gpu}; precision "
        f"+-{s.precision.acceptance_half_width:g}, at most {s.precision.max_requests} requests "
        f"and {s.precision.max_minutes:g} min per segment."
    )
    table = Table("segment", "share", "logged", "concurrency", "pilot", "max requests",
                  "text", "GPU min (pilot-max)")  # fmt: skip
    for seg in plan.segments:
        table.add_row(
            seg.key, f"{seg.share:.1%}", str(seg.n_logged), str(seg.concurrency),
            str(seg.pilot), str(seg.max_requests), "logged" if seg.has_text else "synthesized",
            f"{seg.minutes_low:.1f}-{seg.minutes_high:.1f}",
        )  # fmt: skip
    out.print(table)
    out.print(
        f"Estimated GPU time: {plan.minutes_low:.1f} to {plan.minutes_high:.1f} minutes "
        "(both servers, server start-up not included)."
    )
    if plan.estimate_note:
        out.print(f"note: {plan.estimate_note}")
    if plan.concurrency_estimated:
        out.print("note: concurrency was estimated from arrival times (the log has no finish).")
    if spec_config is not None:
        out.print(f"speculative server: --speculative-config '{json.dumps(spec_config)}'")
    if envs[0]:
        out.print(
            f"baseline on CUDA device {envs[0]['CUDA_VISIBLE_DEVICES']}, speculative on "
            f"{envs[1]['CUDA_VISIBLE_DEVICES']}"
        )


def _print_outcome(o: Outcome) -> None:
    state = "complete" if o.status == "complete" else f"PARTIAL ({o.stop_reason})"
    out.print(
        f"Calibration {o.calibration_id} stored: {state}; "
        f"{o.segments_measured} of {o.segments_planned} segments measured."
    )
    q = o.acceptance_quality
    if q:
        loo = q.get("loo_rmse")
        out.print(
            f"Acceptance fit on {q['n_segments']} segments: RMSE {q['rmse']:.3f}"
            + (f", leave-one-out RMSE {loo:.3f}" if loo is not None else "")
            + f", {q['interval_coverage']:.0%} of segments inside their 90% interval."
        )
    else:
        out.print("Acceptance was not fitted: no segment drafted a token.")
    if o.step_quality:
        sq = o.step_quality
        out.print(
            f"Step-cost fit on {sq['n']} replayed batches: median error "
            f"{sq['median_rel_error']:.1%}, p90 {sq['p90_rel_error']:.1%} of batch wall time."
        )
    else:
        out.print(f"note: {o.step_note}")
    table = Table("segment", "n", "acceptance", "+-", "e2e speedup", "+-", "stopped because")
    for e in o.estimates:
        table.add_row(
            e.segment_key, str(e.n), _fmt(e.acceptance), _fmt(e.acceptance_half_width),
            _fmt(e.speedup, ".2f"), _fmt(e.speedup_half_width, ".1%"), e.reason or "-",
        )  # fmt: skip
    out.print(table)
    if o.status == "complete":
        out.print(f"Use it: advisor recommend --calibration {o.calibration_id}")
    else:
        out.print(
            "A partial calibration is refused by `advisor recommend` unless you pass "
            f"--allow-partial; `advisor calibrations show {o.calibration_id}` shows what it has."
        )


calibrations_app = typer.Typer(
    help="Stored calibrations: list, show one, compare two.", no_args_is_help=True
)


@calibrations_app.command("list")
@handles_errors
def list_command(db: DbOption = None) -> None:
    """List stored calibrations, oldest first."""
    rows = list_calibrations(open_db(db, read_only=True))
    if not rows:
        out.print("No calibrations yet; run `advisor calibrate`.")
        return
    table = Table("id", "finished (UTC)", "status", "gpu", "vLLM", "target", "method", "k",
                  "segments", "requests")  # fmt: skip
    for c in rows:
        table.add_row(
            str(c.id), f"{c.finished_at:%Y-%m-%d %H:%M}",
            c.status if c.status == "complete" else f"partial: {c.stop_reason}",
            c.gpu, c.vllm_version or "-", c.target + (f" + {c.draft}" if c.draft else ""),
            c.method, str(c.k), str(c.n_segments), str(c.n_samples),
        )  # fmt: skip
    out.print(table)


@calibrations_app.command("show")
@handles_errors
def show_command(
    calibration_id: Annotated[str, typer.Argument(help="Id from `list`, or latest.")],
    format_: Annotated[str, typer.Option("--format", help="table or json.")] = "table",
    db: DbOption = None,
) -> None:
    """Everything about one calibration: settings, fit quality, fitted acceptance, segments."""
    if format_ not in ("table", "json"):
        raise BadInput(f"--format {format_!r} must be table or json.")
    cal = get_calibration(open_db(db, read_only=True), calibration_id)
    if format_ == "json":
        typer.echo(cal.model_dump_json(indent=2))
        return
    out.print(cal.describe())
    if cal.status == "partial":
        out.print(f"[yellow]partial[/yellow]: {cal.stop_reason}; not used unless --allow-partial.")
    servers = cal.settings.get("servers") or {}
    for role, info in servers.items():
        how = " ".join(info.get("launch_command") or []) or "attached"
        out.print(f"{role}: {info.get('url')} ({how})")
    q = cal.fit.get("acceptance")
    if q:
        out.print(
            f"acceptance fit: {q['n_segments']} segments, RMSE {q['rmse']:.3f}, "
            f"leave-one-out {_fmt(q.get('loo_rmse'))}, coverage {q['interval_coverage']:.0%}"
        )
    steps = cal.fit.get("step_costs")
    if steps:
        sq = steps["wall_all"]
        fitted = ", ".join(f"{k} {v:.4g}" for k, v in steps["parameters"].items())
        out.print(
            f"step-cost fit: {sq['n']} batches, median error {sq['median_rel_error']:.1%}, "
            f"p90 {sq['p90_rel_error']:.1%}; fitted {fitted}"
        )
    for note in ("acceptance_note", "step_costs_note"):
        if cal.fit.get(note):
            out.print(f"note: {cal.fit[note]}")
    for entry in cal.profile.get("acceptance_logit") or []:
        tasks = ", ".join(f"{t} {v:+.2f}" for t, v in sorted(entry["task"].items()))
        out.print(
            f"fitted logit(alpha) for {entry['method']}: {entry['intercept']:+.2f}"
            f" + task ({tasks}) {entry['temperature']:+.2f}*T"
            f" {entry['log_prompt']:+.2f}*ln(1+P) {entry['log_output']:+.2f}*ln(1+O),"
            f" sd {entry['sd']:.2f}"
        )
    table = Table("segment", "n", "conc", "prompt p50", "output p50", "acc. rate",
                  "mean acc. len", "alpha", "TPOT base/spec ms", "decode x", "e2e x")  # fmt: skip
    for s in cal.segments:
        table.add_row(
            s.segment_key, str(s.n_requests), str(s.concurrency or "-"),
            _fmt(s.prompt_tokens, ".0f"), _fmt(s.output_tokens, ".0f"),
            _fmt(s.acceptance_rate), _fmt(s.mean_acceptance_length, ".2f"), _fmt(s.alpha),
            f"{_fmt(s.baseline_tpot_ms, '.2f')}/{_fmt(s.speculative_tpot_ms, '.2f')}",
            _fmt(s.decode_speedup, ".2f"), _fmt(s.e2e_speedup, ".2f"),
        )  # fmt: skip
    out.print(table)


@calibrations_app.command("diff")
@handles_errors
def diff_command(
    a: Annotated[str, typer.Argument(help="The older calibration id.")],
    b: Annotated[str, typer.Argument(help="The newer calibration id (or latest).")],
    target: Annotated[
        str | None, typer.Option(help="Model for the verdicts (default: A's, when known).")
    ] = None,
    allow_partial: AllowPartial = False,
    import_ids: ImportOption = None,
    since: SinceOption = None,
    until: UntilOption = None,
    model: ModelOption = None,
    tenant: TenantOption = None,
    db: DbOption = None,
) -> None:
    """What moved between two calibrations, and which segments' verdicts flip on your traffic."""
    con = open_db(db, read_only=True)
    cal_a, cal_b = get_calibration(con, a), get_calibration(con, b)
    profile_a = profile_for(con, cal_a.id, allow_partial=allow_partial)
    profile_b = profile_for(con, cal_b.id, allow_partial=allow_partial)
    out.print(f"A: {cal_a.describe()}\nB: {cal_b.describe()}")
    _print_drift(cal_a, cal_b)
    deployment, note = _diff_deployment(cal_a, target)
    if note:
        out.print(f"note: {note}")
    filters = _filters(import_ids, since, until, model, tenant)
    try:
        rec_a = run_recommend(con, deployment, profile_a, filters)
        rec_b = run_recommend(con, deployment, profile_b, filters)
    except BadInput as exc:
        out.print(f"Verdict flips not computed: {exc}")
        return
    _print_flips(rec_a, rec_b, deployment)


def _diff_deployment(cal: StoredCalibration, target: str | None) -> tuple[Deployment, str | None]:
    """The deployment both profiles are run with: A's GPU, method and k, and a model the
    catalogue knows (a served model name often is not one)."""
    wanted = Deployment(gpu=cal.gpu, target=target or cal.target, method=cal.method,
                        draft=cal.draft, k=cal.k)  # fmt: skip
    try:
        resolve(wanted)
        return wanted, None
    except BadInput as exc:
        if target is not None:
            raise
        fallback = Deployment(gpu=cal.gpu, method=cal.method, k=cal.k)
        try:
            resolve(fallback)
        except BadInput:
            raise BadInput(f"{exc} Pass --target MODEL for the verdicts.") from None
        return fallback, f"verdicts use {fallback.target} ({exc.args[0]} pass --target to change)"


def _print_drift(a: StoredCalibration, b: StoredCalibration, limit: int = 25) -> None:
    drift = parameter_drift(a, b)
    if not drift:
        out.print("No fitted parameter changed.")
        return
    table = Table("parameter", "A", "B", "change")
    for d in drift[:limit]:
        change = "new" if d.a is None else "gone" if d.b is None else _fmt(d.change_pct, "+.1f")
        table.add_row(d.parameter, _fmt(d.a, ".4g"), _fmt(d.b, ".4g"),
                      change + ("%" if d.change_pct is not None else ""))  # fmt: skip
    out.print(table)
    if len(drift) > limit:
        out.print(f"... {len(drift) - limit} more changed parameters (see calibrations show).")
    acc_a, acc_b = _measured(a), _measured(b)
    shared = sorted(acc_a.keys() & acc_b.keys())
    if shared:
        table = Table("segment (replayed in both)", "alpha A", "alpha B", "change")
        for key in shared:
            table.add_row(key, _fmt(acc_a[key]), _fmt(acc_b[key]),
                          _fmt(acc_b[key] - acc_a[key], "+.3f"))  # fmt: skip
        out.print(table)


def _measured(cal: StoredCalibration) -> dict[str, float]:
    return {s.segment_key: s.alpha for s in cal.segments if s.alpha is not None}


def _print_flips(a: Recommendation, b: Recommendation, deployment: Deployment) -> None:
    cmp = compare_verdicts(a, b)
    out.print(
        f"Verdicts on {len(a.segments)} segments of your traffic ({deployment.target}, "
        f"{deployment.method}, k={deployment.k}): {len(cmp.flips)} flip."
    )
    if cmp.flips:
        table = Table("segment", "share", "A", "B", "e2e A", "e2e B")
        for f in cmp.flips:
            table.add_row(f.segment, f"{f.share:.1%}", f.a, f.b,
                          f"{f.e2e_speedup_a:.2f}", f"{f.e2e_speedup_b:.2f}")  # fmt: skip
        out.print(table)
    if cmp.only_under_one:
        out.print(f"{len(cmp.only_under_one)} segment(s) exist under one calibration only (their "
                  "estimated concurrency differs): " + "; ".join(cmp.only_under_one))  # fmt: skip
