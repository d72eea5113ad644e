"""A calibration run: plan, replay segment by segment on both servers, fit, store.

plan: segment the imported requests (advisor.segments), draw a stratified sample per segment
(calibration.sampling) and estimate the GPU time it will take, touching no server.
run: in rounds chosen by the sequential rule, replay each unfinished segment's next requests on
the baseline and then on the speculative server (one segment at a time, so each spec-decode
counter delta belongs to one segment), until every segment is precise enough or out of budget.
Then fit acceptance (calibration.acceptance_fit) and step costs, and store everything in one
transaction. A run that ends early (Ctrl-C, --time-limit, a server that stops answering) still
stores what it measured, marked `partial`, which the advisor refuses to use unless told to.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime

import duckdb
from pydantic import BaseModel, Field

from advisor.concurrency import fill
from advisor.errors import AdvisorError, BadInput
from advisor.perf import request_latency_s, resolve
from advisor.profile import Profile, load_profile
from advisor.schemas import Deployment, Method
from advisor.segments import Bands, Filters, create_scope, segment
from calibration.acceptance_fit import AcceptanceFit, fit_acceptance, text_features
from calibration.metrics import MetricsError
from calibration.records import CalibrationHeader, SegmentSummary, store_calibration, summarize
from calibration.replay import replay_segment, warm_up
from calibration.sampling import Precision, Sampled, SegmentEstimate, draw, estimate, next_round
from calibration.sampling import to_requests as sampled_to_requests
from calibration.schemas import ReplayRequest, SegmentRun, ServerHandle
from calibration.step_fit import StepFit, StepMeasurement, fit_profile, predicted_walls, quality


class RunSettings(BaseModel):
    """Everything that decides what a calibration measures (stored with it)."""

    gpu: str = "h200"
    target: str
    method: Method
    draft: str | None = None
    k: int = Field(ge=1, le=16)
    filters: Filters = Field(default_factory=Filters)
    bands: Bands = Field(default_factory=Bands)
    precision: Precision = Field(default_factory=Precision)
    max_concurrency: int = Field(default=16, ge=1, description="cap on replay concurrency")
    time_limit_minutes: float | None = Field(default=None, gt=0, description="whole run")
    chat: bool = Field(
        default=False, description="replay through /v1/chat/completions (the chat template)"
    )
    seed: int = 0
    notes: str | None = None


class PlannedSegment(BaseModel):
    """One segment in the plan."""

    key: str
    task: str
    share: float
    n_logged: int
    concurrency: int = Field(description="replay concurrency: logged p50, capped")
    available: int = Field(description="requests drawn for it (the most it can replay)")
    pilot: int
    max_requests: int
    has_text: bool
    minutes_low: float = Field(description="GPU minutes for the pilot round")
    minutes_high: float = Field(description="GPU minutes at its request or minute budget")


class Plan(BaseModel):
    """What a run will replay; `advisor calibrate --dry-run` prints it."""

    settings: RunSettings
    requests_in_scope: int
    concurrency_estimated: bool
    segments: list[PlannedSegment]
    estimate_note: str | None = None

    @property
    def minutes_low(self) -> float:
        """Pilot rounds only (every segment precise at once)."""
        return sum(s.minutes_low for s in self.segments)

    @property
    def minutes_high(self) -> float:
        """Every segment at its request budget (capped by --max-minutes per segment)."""
        return sum(s.minutes_high for s in self.segments)


class Progress(BaseModel):
    """One event for a progress display: a batch started or finished."""

    segment_key: str
    role: str
    round: int
    requests: int
    done_requests: int = Field(description="requests replayed so far on both servers, all segments")
    budget_requests: int = Field(description="the most the run can replay on both servers")
    estimate: SegmentEstimate | None = None


class Outcome(BaseModel):
    """What `advisor calibrate` reports."""

    calibration_id: int
    status: str
    stop_reason: str | None
    segments_measured: int
    segments_planned: int
    acceptance_quality: dict[str, object] | None
    step_quality: dict[str, object] | None
    step_note: str
    estimates: list[SegmentEstimate]


def _deployment(settings: RunSettings) -> Deployment:
    return Deployment(
        gpu=settings.gpu,
        target=settings.target,
        method=settings.method,
        draft=settings.draft,
        k=settings.k,
    )


def make_plan(
    con: duckdb.DuckDBPyConnection, settings: RunSettings
) -> tuple[Plan, dict[str, list[Sampled]]]:
    """Segments, their samples and a GPU-time estimate; reads the database only."""
    profile = load_profile(settings.gpu)
    note = None
    try:
        setup = resolve(_deployment(settings), profile)
    except BadInput as exc:
        # The served model need not be in the catalogue (a served name, an odd local folder);
        # times are then those of the default target, and the plan says so.
        fallback = Deployment(gpu=settings.gpu, method=settings.method, k=settings.k)
        setup = resolve(fallback, profile)
        note = (
            f"GPU minutes estimated as for {fallback.target}: the target {settings.target} is "
            f"not one the advisor can size ({str(exc).split(';')[0]})."
        )

    def service_s(prompt: float, output: float, batch: float) -> float:
        return request_latency_s(setup, prompt, output, batch)[1]

    scope = create_scope(con, settings.filters)
    info = fill(con, service_s)
    segments = segment(con, settings.bands)
    samples = draw(con, segments, settings.bands, settings.precision.max_requests, settings.seed)
    rule = settings.precision
    planned = []
    for s in segments:
        conc = max(1, min(settings.max_concurrency, round(s.concurrency_p50)))
        available = len(samples[s.key])
        # closed loop at `conc` in flight: conc / e2e requests per second, on both servers
        e2e_s = request_latency_s(setup, s.prompt_p50, s.output_p50, conc)[1]
        per_request_min = 2 * e2e_s / conc / 60
        low = min(rule.pilot, available) * per_request_min
        high = min(rule.max_minutes, min(rule.max_requests, available) * per_request_min)
        planned.append(
            PlannedSegment(
                key=s.key, task=s.task, share=s.share, n_logged=s.n, concurrency=conc,
                available=available, pilot=min(rule.pilot, available),
                max_requests=min(rule.max_requests, available), has_text=s.has_text,
                minutes_low=low, minutes_high=high,
            )
        )  # fmt: skip
    plan = Plan(
        settings=settings,
        requests_in_scope=scope.n,
        concurrency_estimated=info.was_estimated,
        segments=planned,
        estimate_note=note,
    )
    return plan, samples


def _max_model_len(*handles: ServerHandle) -> int | None:
    lengths = [h.max_model_len for h in handles if h.max_model_len]
    return min(lengths) if lengths else None


def _text_features(requests: Sequence[ReplayRequest]) -> dict[str, float] | None:
    """Text features from logged prompts only: a synthesized prompt says nothing beyond its task."""
    logged = [r.prompt for r in requests if r.prompt_source == "logged" and r.prompt]
    return text_features(logged) if logged and len(logged) == len(requests) else None


class _Stop(Exception):
    """Ends the replay loop early; the message is the stored stop reason."""


def _check_role(handle: ServerHandle, run: SegmentRun) -> None:
    """Swapped or misconfigured URLs would give a calibration of nothing: stop at once."""
    if handle.role == "baseline" and run.delta is not None and run.delta.moved:
        raise _Stop(
            f"the baseline server at {handle.url} drafted tokens (it runs speculative decoding); "
            "check that --baseline-url and --speculative-url are not swapped"
        )
    if handle.role == "speculative" and run.delta is None:
        raise _Stop(
            f"the speculative server at {handle.url} exports no spec-decode counters on /metrics "
            "(is it running with --speculative-config?)"
        )


def replay_all(
    plan: Plan,
    samples: dict[str, list[Sampled]],
    baseline: ServerHandle,
    speculative: ServerHandle,
    on_progress: Callable[[Progress], None] | None = None,
) -> tuple[list[SegmentRun], dict[str, ReplayRequest], dict[str, SegmentEstimate], str | None]:
    """Replay rounds until the sequential rule is satisfied; returns what was measured and why it
    stopped early (None when it did not). Ctrl-C stops it as well: what was measured is kept."""
    settings, rule = plan.settings, plan.settings.precision
    max_len = _max_model_len(baseline, speculative)
    queues = {
        s.key: [
            r.model_copy(update={"chat": settings.chat})
            for r in sampled_to_requests(samples[s.key], max_model_len=max_len, seed=settings.seed)
        ]
        for s in plan.segments
    }
    conc = {s.key: s.concurrency for s in plan.segments}
    cursor = dict.fromkeys(queues, 0)
    runs: list[SegmentRun] = []
    estimates = {key: estimate(key, [], [], rule) for key in queues}
    budget = 2 * sum(min(rule.max_requests, len(q)) for q in queues.values())
    done = 0
    started = time.monotonic()
    stop: str | None = None
    try:
        for handle in (baseline, speculative):
            try:
                warm_up(handle)
            except RuntimeError as exc:
                raise _Stop(f"the {handle.role} server failed its warm-up request ({exc})") from exc
        rnd = 0
        while plan_ := next_round(
            list(estimates.values()),
            {k: len(q) - cursor[k] for k, q in queues.items()},
            rule,
        ):
            for key, n in plan_.items():
                limit = settings.time_limit_minutes
                if limit is not None and time.monotonic() - started > limit * 60:
                    raise _Stop(f"--time-limit {limit:g} min reached")
                batch = queues[key][cursor[key] : cursor[key] + n]
                cursor[key] += n
                pair = []
                for handle in (baseline, speculative):
                    if on_progress:
                        on_progress(Progress(segment_key=key, role=handle.role, round=rnd,
                                             requests=n, done_requests=done,
                                             budget_requests=budget))  # fmt: skip
                    run = replay_segment(handle, batch, conc[key], round=rnd)
                    done += len(batch)
                    if not run.ok_records:
                        first = run.records[0].error if run.records else "no records"
                        raise _Stop(
                            f"the {handle.role} server at {handle.url} answered no request of "
                            f"segment {key!r} ({first})"
                        )
                    _check_role(handle, run)
                    pair.append(run)
                runs += pair
                mine = [r for r in runs if r.segment_key == key]
                estimates[key] = estimate(
                    key,
                    [r for r in mine if r.role == "baseline"],
                    [r for r in mine if r.role == "speculative"],
                    rule,
                )
                if on_progress:
                    on_progress(Progress(segment_key=key, role="both", round=rnd, requests=n,
                                         done_requests=done, budget_requests=budget,
                                         estimate=estimates[key]))  # fmt: skip
            rnd += 1
    except (_Stop, MetricsError) as exc:
        stop = str(exc)
    except KeyboardInterrupt:
        stop = "interrupted"
    requests = {r.request_id: r for q in queues.values() for r in q}
    return runs, requests, estimates, stop


def _fit(
    summaries: Sequence[SegmentSummary], method: str, seed: int
) -> tuple[AcceptanceFit | None, str | None]:
    observations = [o for s in summaries if (o := s.observation(method)) is not None]
    if not observations:
        return None, "no segment drafted a token on the speculative server: acceptance not fitted"
    return fit_acceptance(observations, seed=seed), None


Store = duckdb.DuckDBPyConnection | Callable[[], duckdb.DuckDBPyConnection]


def step_measurements(runs: Sequence[SegmentRun], settings: RunSettings) -> list[StepMeasurement]:
    """Replayed batches as measurements of the performance model.

    A batch replays n requests with at most c in flight (closed loop), so it is about n / c
    waves of c requests: one wave - c requests arriving together, the wall time times c / n -
    is what advisor.perf.simulate_batch predicts. Acceptance is the tokens per step over all
    decode steps (steps without a proposal included), as in the acceptance fit.
    """
    points = []
    for run in runs:
        spec = run.role == "speculative"
        point = StepMeasurement.from_segment_run(
            run, gpu=settings.gpu, target=settings.target,
            method=settings.method if spec else "baseline", draft=settings.draft,
            k=settings.k if spec else 0,
        )  # fmt: skip
        if point is None:
            continue
        n = point.batch
        wave = min(run.concurrency, n)
        update: dict[str, object] = {"batch": wave, "wall_s": run.wall_s * wave / n}
        if spec and run.delta is not None and all(r.ok for r in run.records):
            steps = sum(r.output_tokens - 1 for r in run.records) - run.delta.num_accepted_tokens
            if steps >= run.delta.num_drafts > 0:
                update["mean_acceptance_length"] = 1 + run.delta.num_accepted_tokens / steps
        points.append(point.model_copy(update=update))
    return points


def _fit_steps(
    runs: Sequence[SegmentRun], settings: RunSettings, base: Profile
) -> tuple[StepFit | None, str]:
    """The step-cost fit (calibration.step_fit) on the replayed batches, or why there is none."""
    try:
        resolve(_deployment(settings), base)
    except BadInput as exc:
        return None, (
            f"step costs kept from the shipped profile {base.name!r}: the target "
            f"{settings.target} is not one the performance model can size "
            f"({str(exc).split(';')[0]}); pass --target NAME"
        )
    points = step_measurements(runs, settings)
    if not any(p.method == "baseline" for p in points) or all(
        p.method == "baseline" for p in points
    ):
        return None, f"step costs kept from the shipped profile {base.name!r}: too few batches"
    fit = fit_profile(points, base, name="calibration", gpu=settings.gpu.lower())
    before = quality(predicted_walls(points, base), [p.wall_s for p in points])
    if fit.wall_all.median_rel_error >= before.median_rel_error:
        # The bounded fit could not beat the starting profile on these batches (servers far off
        # the catalogue's GPU, say): a worse profile must not replace a better one.
        return None, (
            f"step costs kept from the shipped profile {base.name!r}: fitted on {len(points)} "
            f"batches the median error was {fit.wall_all.median_rel_error:.0%}, not better "
            f"than the shipped profile's {before.median_rel_error:.0%}"
        )
    return fit, (
        f"step costs fitted on {len(points)} replayed batches: median error "
        f"{before.median_rel_error:.0%} with the shipped profile {base.name!r}, "
        f"{fit.wall_all.median_rel_error:.0%} fitted ({fit.message})"
    )


def fit_and_store(
    store: Store,
    plan: Plan,
    runs: Sequence[SegmentRun],
    requests: dict[str, ReplayRequest],
    estimates: dict[str, SegmentEstimate],
    stop: str | None,
    baseline: ServerHandle,
    speculative: ServerHandle,
    created_at: datetime,
) -> Outcome:
    """Fit acceptance and step costs, then write the calibration in one
    transaction: to `store` when it is a connection, else to the one it opens (and closes)."""
    settings = plan.settings
    keys = [s.key for s in plan.segments]
    measured = [k for k in keys if any(r.segment_key == k for r in runs)]
    if not measured:
        raise AdvisorError(
            f"Calibration stopped before any segment was measured ({stop or 'nothing to replay'});"
            " nothing was stored."
        )
    summaries = []
    for key in measured:
        mine = [requests[r.request_id] for run in runs if run.segment_key == key
                for r in run.records if run.role == "speculative"]  # fmt: skip
        summaries.append(summarize(key, runs, requests, _text_features(mine)))
    acceptance, acceptance_note = _fit(summaries, settings.method, settings.seed)
    base = load_profile(settings.gpu)
    steps, steps_note = _fit_steps(runs, settings, base)
    fitted = steps.profile if steps else base
    profile = Profile.model_validate(
        {
            **fitted.model_dump(),
            "name": "calibration",
            "gpu": settings.gpu.lower(),
            "description": f"fitted by `advisor calibrate` from {len(measured)} replayed segments",
            "acceptance_logit": acceptance.profile_logits() if acceptance else [],
        }
    )
    status = "complete" if stop is None and len(measured) == len(keys) else "partial"
    if status == "partial" and stop is None:
        stop = f"{len(keys) - len(measured)} of {len(keys)} segments were not measured"
    versions = {baseline.vllm_version, speculative.vllm_version}
    fit: dict[str, object] = {
        "acceptance": acceptance.quality.model_dump() if acceptance else None,
        "acceptance_model": (
            acceptance.model.model_dump(exclude={"bootstrap"}) if acceptance else None
        ),
        "acceptance_note": acceptance_note,
        "step_costs": steps.model_dump(mode="json", exclude={"profile"}) if steps else None,
        "step_costs_note": steps_note,
        "segments": {k: e.model_dump() for k, e in estimates.items() if k in measured},
    }
    header = CalibrationHeader(
        created_at=created_at,
        finished_at=datetime.now(UTC).replace(tzinfo=None),
        status=status,
        stop_reason=stop,
        gpu=settings.gpu.lower(),
        vllm_version=" / ".join(sorted(versions)) if len(versions) > 1 else baseline.vllm_version,
        target=settings.target,
        draft=settings.draft,
        method=settings.method,
        k=settings.k,
        settings={
            **settings.model_dump(mode="json"),
            "servers": {
                h.role: h.model_dump(mode="json", exclude_none=True)
                for h in (baseline, speculative)
            },
            "plan": [s.model_dump() for s in plan.segments],
        },
        profile=profile.model_dump(mode="json"),
        fit=fit,
        notes=settings.notes,
    )
    if isinstance(store, duckdb.DuckDBPyConnection):
        cal_id = store_calibration(store, header, runs, summaries, requests)
    else:
        con = store()
        try:
            cal_id = store_calibration(con, header, runs, summaries, requests)
        finally:
            con.close()
    return Outcome(
        calibration_id=cal_id,
        status=status,
        stop_reason=stop,
        segments_measured=len(measured),
        segments_planned=len(keys),
        acceptance_quality=fit["acceptance"],  # type: ignore[arg-type]
        step_quality=steps.wall_all.model_dump() if steps else None,
        step_note=steps_note,
        estimates=[estimates[k] for k in measured],
    )


def calibrate(
    store: Store,
    plan: Plan,
    samples: dict[str, list[Sampled]],
    baseline: ServerHandle,
    speculative: ServerHandle,
    on_progress: Callable[[Progress], None] | None = None,
) -> Outcome:
    """Replay, fit and store; partial when it ended early but measured something.

    `store` is a connection, or a function that opens one: the CLI opens the database only to
    write the result, since a replay can take an hour and DuckDB lets one process write the file.
    """
    if not plan.segments or not any(s.available for s in plan.segments):
        raise BadInput("There is nothing to replay: no segment has a request to sample.")
    created = datetime.now(UTC).replace(tzinfo=None)
    runs, requests, estimates, stop = replay_all(plan, samples, baseline, speculative, on_progress)
    return fit_and_store(
        store, plan, runs, requests, estimates, stop, baseline, speculative, created
    )


def speculative_config(
    method: str, k: int, draft: str | None, extra: dict[str, object] | None = None
) -> dict[str, object]:
    """vLLM's --speculative-config for a method; `extra` (e.g. synthetic acceptance) overrides."""
    config: dict[str, object] = {"method": method, "num_speculative_tokens": k}
    if method in ("draft_model", "eagle", "eagle3"):
        if not draft:
            raise BadInput(f"--method {method} needs --draft (the draft model or head to load).")
        config["model"] = draft
    if method == "ngram":
        # vLLM's n-gram proposer: match the last 1..4 tokens against the prompt (vLLM docs,
        # "Speculating by matching n-grams in the prompt")
        config.update({"prompt_lookup_min": 1, "prompt_lookup_max": 4})
    return {**config, **(extra or {})}
