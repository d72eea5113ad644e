"""`advisor recommend`: segment the logged traffic, score every segment, sum up the fleet.

Pipeline: filters -> `advisor_scope` (segments.create_scope) -> concurrency per request (logged,
derived, or estimated from arrivals with the model's own service times) -> segments -> a verdict
per segment (scoring.score_segment) -> a FleetSummary that follows every verdict.

Fleet summary, with segment i's share w_i, baseline latency L_i of a request of its mean prompt
and output at its median concurrency c_i, and s_i its e2e speedup when the verdict is enable
(1 otherwise):
  e2e speedup   = sum w_i L_i / sum w_i L_i / s_i     (mean request latency, before / after)
  GPU-seconds per request = tp * L_i / c_i             (Little's law: c_i requests share a GPU)
  GPU-hours/day = rate * 86400 * sum w_i tp L_i / c_i / 3600, at the trace's arrival rate
  saved         = the enabled segments' GPU-hours x (1 - 1 / throughput change at p95)
The interval's ends use every enabled segment's low (high) speedup together: a conservative band.
"""

from __future__ import annotations

from collections.abc import Sequence

import duckdb

from advisor import concurrency, segments
from advisor.calibrations import profile_for
from advisor.catalog import GPU, Catalog
from advisor.errors import BadInput
from advisor.perf import Setup, decode_speedup, request_latency_s, resolve, steady_state
from advisor.profile import Profile, get_profile, load_profile, profile_names
from advisor.schemas import (
    CurvePoint,
    Deployment,
    FleetSummary,
    Interval,
    Recommendation,
    SegmentVerdict,
)
from advisor.scoring import THRESHOLD, score_segment
from advisor.segments import Bands, Filters

CURVE_CONCURRENCY = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)


def is_stored_calibration(calibration: str | None) -> bool:
    """`--calibration` names a stored calibration (an id or `latest`), not a shipped profile."""
    text = (calibration or "").strip().lower()
    return text.isdigit() or text == "latest"


def resolve_profile(
    con: duckdb.DuckDBPyConnection | None,
    gpu: str,
    calibration: str | None,
    *,
    allow_partial: bool = False,
) -> Profile:
    """The profile a prediction or recommendation runs on.

    None: the shipped profile for the GPU, else the roofline defaults. A number or `latest`: a
    stored calibration's fitted profile (a partial one only with `allow_partial`). Anything
    else: a shipped profile name or a JSON file.
    """
    if calibration is None:
        return load_profile(gpu)
    text = calibration.strip()
    if is_stored_calibration(text):
        if con is None:
            raise BadInput(f"--calibration {text} needs a database; pass --db.")
        return profile_for(con, text, allow_partial=allow_partial)
    if text.endswith(".json") or "/" in text or text in profile_names():
        return get_profile(text)
    raise BadInput(
        f"--calibration {text!r} is neither a calibration id (see `advisor calibrations list`) "
        f"nor a shipped profile ({', '.join(profile_names())}) nor a profile JSON file."
    )


def default_max_num_seqs(gpu: GPU) -> int:
    """vLLM's default --max-num-seqs for a GPU (vllm/engine/arg_utils.py,
    EngineArgs.get_batch_defaults): 1024 with >= 70 GiB of memory unless it is an A100, else 256.
    """
    big = gpu.memory_gb * 1e9 >= 70 * 2**30 and "a100" not in gpu.name.lower()
    return 1024 if big else 256


def recommend(
    con: duckdb.DuckDBPyConnection,
    deployment: Deployment,
    profile: Profile | None = None,
    filters: Filters | None = None,
    bands: Bands | None = None,
    *,
    threshold: float = THRESHOLD,
    catalog: Catalog | None = None,
) -> Recommendation:
    """A verdict per segment of the filtered requests, and the fleet-wide effect."""
    filters, bands = filters or Filters(), bands or Bands()
    setup = resolve(deployment, profile, catalog)
    profile = setup.profile
    scope = segments.create_scope(con, filters)
    info = concurrency.fill(
        con,
        lambda p, o, b: request_latency_s(setup, p, o, b)[1],
        max_batch=default_max_num_seqs(setup.gpu),
    )
    stats = segments.segment(con, bands)
    verdicts = []
    for st in stats:
        v = score_segment(st, deployment, profile, threshold=threshold, catalog=catalog)
        verdicts.append(
            v.model_copy(
                update={
                    "baseline_latency_s": round(_latency_s(setup, v), 4),
                    "concurrency_curve": curve(setup, v),
                }
            )
        )
    rate = scope.n / scope.duration_s if scope.duration_s else None
    return Recommendation(
        deployment=deployment,
        calibration=profile.calibration,
        concurrency_estimated=info.was_estimated,
        notes=_notes(profile, deployment, scope, info, bands, rate),
        summary=fleet_summary(verdicts, rate, deployment.tp),
        segments=verdicts,
    )


def _latency_s(setup: Setup, v: SegmentVerdict) -> float:
    """Baseline latency of a request of the segment's mean prompt and output at its median
    concurrency: means, because the fleet's request-seconds add up over every request."""
    st = v.stats
    prompt = st.prompt_mean if st.prompt_mean is not None else st.prompt_p50
    output = st.output_mean if st.output_mean is not None else st.output_p50
    return request_latency_s(
        setup, max(1.0, prompt), max(1.0, output), max(1.0, st.concurrency_p50)
    )[1]


def curve(setup: Setup, v: SegmentVerdict) -> list[CurvePoint]:
    """The segment's median request at each concurrency, with its own acceptance and best k."""
    p, o = max(1.0, v.stats.prompt_p50), max(1.0, v.stats.output_p50)
    alpha, k = v.acceptance.value, v.best_k
    points = []
    for c in CURVE_CONCURRENCY:
        base = steady_state(setup, c, p, o)
        spec = steady_state(setup, c, p, o, alpha, k)
        points.append(
            CurvePoint(
                concurrency=c,
                decode_speedup=round(decode_speedup(setup, c, p + o / 2, alpha, k), 4),
                e2e_speedup=round(base.e2e_ms / spec.e2e_ms, 4),
            )
        )
    return points


def fleet_summary(verdicts: Sequence[SegmentVerdict], rate: float | None, tp: int) -> FleetSummary:
    """Traffic-weighted effect of following every verdict (see the module docstring)."""
    e2e = _weighted_speedup(verdicts, only_enabled=True)
    gpu_hours = saved = 0.0
    if rate is not None:
        per_day = rate * 86400 / 3600  # requests per day x seconds -> hours
        for v in verdicts:
            hours = (
                per_day
                * v.share
                * tp
                * (v.baseline_latency_s or 0.0)
                / max(1.0, v.stats.concurrency_p50)
            )
            gpu_hours += hours
            if v.verdict == "enable" and v.throughput_change.value > 0:
                saved += hours * (1.0 - 1.0 / v.throughput_change.value)
    return FleetSummary(
        e2e_speedup=e2e,
        latency_change_pct=round(100.0 * (1.0 / e2e.value - 1.0), 2),
        gpu_hours_saved_per_day=round(saved, 3),
        segments_enabled=sum(v.verdict == "enable" for v in verdicts),
        segments_disabled=sum(v.verdict == "disable" for v in verdicts),
        segments_try_it=sum(v.verdict == "try-it" for v in verdicts),
        requests_per_s=round(rate, 4) if rate is not None else None,
        baseline_gpu_hours_per_day=round(gpu_hours, 3) if rate is not None else None,
        e2e_speedup_if_all_enabled=_weighted_speedup(verdicts, only_enabled=False),
    )


def _weighted_speedup(verdicts: Sequence[SegmentVerdict], only_enabled: bool) -> Interval:
    """Mean request latency before / after, speeding up the enabled (or all) segments."""
    before = sum(v.share * (v.baseline_latency_s or 0.0) for v in verdicts)
    if before <= 0:
        return Interval(value=1.0, low=1.0, high=1.0)

    def ratio(end: str) -> float:
        after = sum(
            v.share
            * (v.baseline_latency_s or 0.0)
            / (getattr(v.e2e_speedup, end) if v.verdict == "enable" or not only_enabled else 1.0)
            for v in verdicts
        )
        return round(before / after, 4)

    return Interval(value=ratio("value"), low=ratio("low"), high=ratio("high"))


def profile_notes(profile: Profile, deployment: Deployment) -> list[str]:
    """Which numbers answered, and the caveats of using them for this deployment."""
    ref = profile.calibration
    notes = [f"Calibration used: {ref.id} ({ref.kind}) - {ref.description.rstrip('.')}."]
    if ref.kind == "roofline":
        notes.append(
            f"No measured profile for {deployment.gpu}: the datasheet roofline with default "
            "efficiencies is used (fallback), so intervals are wider; `advisor calibrate` "
            "replaces it with your GPU's numbers."
        )
    if profile.gpu and profile.gpu.lower() != deployment.gpu.lower():
        notes.append(
            f"The profile was measured on {profile.gpu}, not {deployment.gpu}: step costs may "
            "not transfer."
        )
    return notes


def _notes(
    profile: Profile,
    deployment: Deployment,
    scope: segments.Scope,
    info: concurrency.ConcurrencyInfo,
    bands: Bands,
    rate: float | None,
) -> list[str]:
    notes = profile_notes(profile, deployment)
    total = scope.n
    if info.estimated:
        notes.append(
            f"Concurrency estimated for {info.estimated:,} of {total:,} requests: the log has "
            "arrival times but no finish times or concurrency, so each request's finish was "
            "predicted from its token counts and the baseline service time at its batch "
            f"({info.iterations} iterations, batch capped at vLLM's default max-num-seqs"
            f" {info.max_batch} for {deployment.gpu})."
        )
    if scope.models > 1 and info.estimated:
        notes.append(
            f"The scope holds {scope.models} models: concurrency is counted per model (each its "
            f"own server), but every segment is scored as {deployment.target}; pass --model to "
            "score one model's traffic."
        )
    if info.derived:
        notes.append(f"Concurrency of {info.derived:,} requests derived from arrival and finish.")
    if info.assumed:
        notes.append(
            f"{info.assumed:,} requests have no arrival time: their concurrency is assumed to "
            "be 1 (single-stream), which favours speculation."
        )
    if scope.without_output:
        notes.append(
            f"{scope.without_output:,} matching requests have no output token count and were "
            "left out."
        )
    if rate is not None:
        hours = (scope.duration_s or 0.0) / 3600
        notes.append(
            f"Traffic: {total:,} requests over {hours:.2f} h ({rate:.2f}/s); GPU-hours per day "
            "extrapolate this rate."
        )
    else:
        notes.append("No arrival times: GPU-hours per day are not computed (0).")
    notes.append(
        f"Segments: {len(bands.prompt) + 1} prompt x {len(bands.output) + 1} output x "
        f"{len(bands.temperature) + 1} temperature x {len(bands.concurrency) + 1} concurrency "
        f"bands per task; segments under {bands.min_share:.0%} of traffic merged into neighbours."
    )
    return notes
