"""Fit the performance model's step-cost parameters to measured batches.

Why: the roofline's datasheet numbers are never reached, and engines add per-step costs that
differ by method (vLLM 0.26 runs draft_model without asynchronous scheduling, for instance). A
measured batch - B requests of P prompt and O output tokens arriving together, timed end to end
- is what `advisor predict` predicts, so the fit adjusts the Profile's efficiencies and each
method's MethodCost until advisor.perf.simulate_batch reproduces the measured wall times. The
model itself is advisor.perf's; nothing here re-implements it.

Residuals are ln(predicted / measured wall time), so a 10% miss weighs the same on a 0.3 s and
an 8 s batch. A weak pull towards the starting profile (`prior_weight`) keeps parameters that
the points cannot separate (say, a per-draft-step overhead against a draft cost factor when only
one k was measured) at their starting values instead of wandering to a bound.

Callers: bench/fit_h200_profile.py (the H200 sweep in bench/data) and the calibration run
(replayed segments, through StepMeasurement.from_segment_run).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Literal

import numpy as np
from pydantic import BaseModel, Field, model_validator

from advisor.catalog import Catalog, load_catalog
from advisor.memory import max_running
from advisor.perf import Setup, expected_tokens, resolve, simulate_batch
from advisor.profile import MethodCost, Profile
from advisor.schemas import CalibrationRef, Deployment
from calibration.schemas import SegmentRun

StepMethod = Literal["baseline", "eagle3", "eagle", "draft_model", "ngram", "suffix", "mtp"]


class StepMeasurement(BaseModel):
    """One measured batch: `batch` requests arriving together, timed from send to last token."""

    gpu: str = "h200"
    target: str
    method: StepMethod
    draft: str | None = Field(default=None, description="draft model or head; None: default")
    k: int = Field(default=0, ge=0, description="num_speculative_tokens; 0 for the baseline")
    batch: int = Field(ge=1)
    prompt_tokens: float = Field(gt=0)
    output_tokens: float = Field(ge=1)
    wall_s: float = Field(gt=0, description="whole batch, prefill included")
    mean_acceptance_length: float | None = Field(
        default=None, ge=1.0, description="vLLM's tokens per verification step (spec only)"
    )
    tp: int = Field(default=1, ge=1)
    source: str = ""

    @model_validator(mode="after")
    def _spec_has_acceptance(self) -> StepMeasurement:
        if self.method == "baseline":
            if self.k:
                raise ValueError("a baseline measurement has k = 0")
        else:
            if self.k < 1:
                raise ValueError(f"a {self.method} measurement needs k >= 1")
            if self.mean_acceptance_length is None:
                raise ValueError(f"a {self.method} measurement needs mean_acceptance_length")
        return self

    @property
    def output_tokens_per_s(self) -> float:
        return self.batch * self.output_tokens / self.wall_s

    def pair_key(self) -> tuple[object, ...]:
        """Points with the same key measure the same batch on different engines."""
        return (self.gpu, self.target, self.tp, self.batch, self.prompt_tokens, self.output_tokens)

    @classmethod
    def from_segment_run(
        cls,
        run: SegmentRun,
        *,
        gpu: str,
        target: str,
        method: StepMethod,
        draft: str | None = None,
        k: int = 0,
        tp: int = 1,
    ) -> StepMeasurement | None:
        """A replayed batch (all requests sent together) as a measurement; None when nothing
        completed or a speculative run reported no drafts."""
        ok = run.ok_records
        if not ok or run.wall_s <= 0:
            return None
        mal = None
        if method != "baseline":
            if run.delta is None or run.delta.mean_acceptance_length is None:
                return None
            mal = run.delta.mean_acceptance_length
        return cls(
            gpu=gpu,
            target=target,
            method=method,
            draft=draft,
            k=k if method != "baseline" else 0,
            batch=len(ok),
            prompt_tokens=float(np.mean([r.prompt_tokens for r in ok])),
            output_tokens=max(1.0, float(np.mean([r.output_tokens for r in ok]))),
            wall_s=run.wall_s,
            mean_acceptance_length=mal,
            tp=tp,
            source=f"segment {run.segment_key} round {run.round} ({run.role})",
        )


class FitQuality(BaseModel):
    """How well the fitted model reproduces measured wall times (or speedups)."""

    n: int
    median_rel_error: float = Field(description="median |predicted / measured - 1|")
    p90_rel_error: float
    r2: float | None = Field(description="1 - SS_res / SS_tot; None with fewer than 2 points")


class StepFit(BaseModel):
    """The fitted profile, the fitted values, and the goodness of fit."""

    profile: Profile
    parameters: dict[str, float]
    wall: dict[str, FitQuality] = Field(description="per method, on batch wall time")
    wall_all: FitQuality
    speedup: dict[str, FitQuality] = Field(
        default_factory=dict, description="per method, on speedup vs the paired baseline"
    )
    converged: bool
    message: str


# (name, lower, upper) of every parameter the fit may move. Efficiencies are fractions of the
# datasheet; overheads are milliseconds.
GLOBAL_BOUNDS: dict[str, tuple[float, float]] = {
    "bandwidth_efficiency": (0.3, 1.0),
    "kv_bandwidth_efficiency": (0.1, 1.0),
    "compute_efficiency": (0.1, 1.0),
    "prefill_efficiency": (0.1, 1.0),
    # p of the smooth max (memory^p + compute^p)^(1/p): near the ridge a step is neither purely
    # memory- nor compute-bound (without it, held-out batch-128 points missed by 12%).
    "roofline_sharpness": (1.0, 30.0),
}
SHARPNESS_START = 4.0  # where the fit starts when the base profile uses a hard max
METHOD_BOUNDS: dict[str, tuple[float, float]] = {
    "step_overhead_ms": (0.0, 50.0),
    "per_seq_overhead_ms": (0.0, 1.0),
    "draft_step_overhead_ms": (0.0, 20.0),
    "draft_cost_factor": (0.0, 20.0),
    "verify_ms_per_token": (0.0, 1.0),
}
_BASELINE_FIELDS = ("step_overhead_ms", "per_seq_overhead_ms")
_NGRAM_FIELDS = (*_BASELINE_FIELDS, "draft_step_overhead_ms", "verify_ms_per_token")


def alpha_for(mal: float, k: int, decay: float = 1.0) -> float:
    """The per-token acceptance whose E(alpha, k) equals the measured mean acceptance length
    (bisection; E rises with alpha), so the model sees exactly the measured tokens per step."""
    target = min(max(mal, 1.0), k + 1.0)
    lo, hi = 0.0, 0.999999
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        if expected_tokens(mid, k, decay) < target:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


def _method_fields(method: str) -> tuple[str, ...]:
    if method == "baseline":
        return _BASELINE_FIELDS
    if method in ("ngram", "suffix"):
        return _NGRAM_FIELDS
    return tuple(METHOD_BOUNDS)


def free_parameters(points: Sequence[StepMeasurement]) -> list[str]:
    """Parameters the points can inform: the global efficiencies (when any point is given) and
    the cost terms of every method that was measured."""
    methods = sorted({p.method for p in points})
    names = list(GLOBAL_BOUNDS) if points else []
    for m in methods:
        names += [f"{m}.{f}" for f in _method_fields(m)]
    return names


def _bounds(name: str) -> tuple[float, float]:
    if "." in name:
        return METHOD_BOUNDS[name.split(".", 1)[1]]
    return GLOBAL_BOUNDS[name]


def _get(profile: Profile, name: str) -> float:
    if "." in name:
        method, field = name.split(".", 1)
        return float(getattr(profile.cost(method), field))
    value = getattr(profile, name)
    if value is None and name == "kv_bandwidth_efficiency":
        return profile.bandwidth_efficiency
    if value is None and name == "roofline_sharpness":
        return SHARPNESS_START
    return float(value)


def with_parameters(profile: Profile, values: dict[str, float]) -> Profile:
    """A copy of `profile` with the named parameters ('field' or 'method.field') replaced."""
    top = {k: v for k, v in values.items() if "." not in k}
    methods = dict(profile.methods)
    for name, value in values.items():
        if "." in name:
            method, field = name.split(".", 1)
            base = methods.get(method) or MethodCost(step_overhead_ms=0.0)  # type: ignore[call-overload]
            methods[method] = base.model_copy(update={field: value})  # type: ignore[index]
    return profile.model_copy(update={**top, "methods": methods})


@dataclasses.dataclass(frozen=True)
class _Prepared:
    point: StepMeasurement
    setup: Setup
    alpha: float
    running: tuple[int, int]


def _deployment(p: StepMeasurement) -> Deployment:
    # The baseline's wall time does not depend on the method; any method resolves the target.
    method = "eagle3" if p.method == "baseline" else p.method
    return Deployment(gpu=p.gpu, target=p.target, method=method, draft=p.draft, k=p.k or 1, tp=p.tp)


def _prepare(
    points: Sequence[StepMeasurement], profile: Profile, catalog: Catalog
) -> list[_Prepared]:
    out = []
    for p in points:
        s = resolve(_deployment(p), profile, catalog)
        ctx = p.prompt_tokens + p.output_tokens
        running = (max(1, max_running(s, ctx, speculative=False)), max(1, max_running(s, ctx)))
        alpha = 0.0
        if p.method != "baseline":
            assert p.mean_acceptance_length is not None
            alpha = alpha_for(p.mean_acceptance_length, p.k, profile.cost(p.method).position_decay)
        out.append(_Prepared(p, s, alpha, running))
    return out


def predicted_wall_s(prep: _Prepared, profile: Profile) -> float:
    """The model's wall time for one measured batch under `profile`."""
    p = prep.point
    s = dataclasses.replace(prep.setup, profile=profile)
    r = simulate_batch(
        s,
        prep.alpha,
        max(1, p.k),
        p.batch,
        round(p.prompt_tokens),
        round(p.output_tokens),
        prep.running,
    )
    ms = r.makespan_ms_baseline if p.method == "baseline" else r.makespan_ms_speculative
    return ms / 1e3


def predicted_walls(
    points: Sequence[StepMeasurement], profile: Profile, catalog: Catalog | None = None
) -> list[float]:
    """The model's wall time (s) for each measured batch under `profile`."""
    prepared = _prepare(points, profile, catalog or load_catalog())
    return [predicted_wall_s(q, profile) for q in prepared]


def quality(predicted: Sequence[float], measured: Sequence[float]) -> FitQuality:
    """Median / p90 relative error and R^2 of predicted against measured values."""
    pr, me = np.asarray(predicted, float), np.asarray(measured, float)
    rel = np.abs(pr / me - 1.0)
    r2 = None
    if len(me) >= 2:
        ss_tot = float(np.sum((me - me.mean()) ** 2))
        r2 = 1.0 - float(np.sum((pr - me) ** 2)) / ss_tot if ss_tot > 0 else None
    return FitQuality(
        n=len(me),
        median_rel_error=round(float(np.median(rel)), 5),
        p90_rel_error=round(float(np.quantile(rel, 0.9)), 5),
        r2=None if r2 is None else round(r2, 5),
    )


def speedup_pairs(
    points: Sequence[StepMeasurement], walls: Sequence[float]
) -> dict[str, tuple[list[float], list[float]]]:
    """Per method, (speedups from `walls`, measured speedups) over points that have a baseline
    measured at the same batch, lengths, target and GPU. `walls` are per point, in order."""
    base = {
        p.pair_key(): (w, p.wall_s)
        for p, w in zip(points, walls, strict=True)
        if p.method == "baseline"
    }
    out: dict[str, tuple[list[float], list[float]]] = {}
    for p, w in zip(points, walls, strict=True):
        if p.method == "baseline" or p.pair_key() not in base:
            continue
        bw, bm = base[p.pair_key()]
        pred, meas = out.setdefault(p.method, ([], []))
        pred.append(bw / w)
        meas.append(bm / p.wall_s)
    return out


def fit_profile(
    points: Sequence[StepMeasurement],
    base: Profile,
    *,
    name: str,
    gpu: str | None = None,
    description: str = "",
    free: Sequence[str] | None = None,
    prefill_chunk_tokens: int | None = None,
    prior_weight: float = 0.02,
    catalog: Catalog | None = None,
) -> StepFit:
    """Least-squares fit of `free` parameters (default: free_parameters(points)) starting from
    `base`; returns the fitted Profile (named `name`) and its goodness of fit."""
    from scipy.optimize import least_squares  # deferred: only a fit needs scipy

    if not points:
        raise ValueError("no measurements to fit")
    cat = catalog or load_catalog()
    start = base
    if prefill_chunk_tokens:
        start = start.model_copy(update={"prefill_chunk_tokens": prefill_chunk_tokens})
    names = list(free) if free is not None else free_parameters(points)
    for m in {p.method for p in points}:
        if m not in start.methods:
            start = with_parameters(start, {f"{m}.step_overhead_ms": 0.0})
    prepared = _prepare(points, start, cat)
    measured = np.array([p.wall_s for p in points])
    lo = np.array([_bounds(n)[0] for n in names])
    hi = np.array([_bounds(n)[1] for n in names])
    x0 = np.clip(np.array([_get(start, n) for n in names]), lo, hi)
    scale = np.maximum(hi - lo, 1e-9)

    def profile_at(x: np.ndarray) -> Profile:
        return with_parameters(start, dict(zip(names, map(float, x), strict=True)))

    def residuals(x: np.ndarray) -> np.ndarray:
        prof = profile_at(x)
        pred = np.array([predicted_wall_s(q, prof) for q in prepared])
        prior = math.sqrt(prior_weight) * (x - x0) / scale
        return np.concatenate([np.log(pred / measured), prior])

    if names:
        res = least_squares(residuals, x0, bounds=(lo, hi), x_scale=scale, method="trf")
        x, converged, message = res.x, bool(res.success), str(res.message)
    else:
        x, converged, message = x0, True, "nothing to fit"
    fitted = profile_at(x)
    walls = [predicted_wall_s(q, fitted) for q in prepared]
    per_method = {
        m: quality(
            [w for w, p in zip(walls, points, strict=True) if p.method == m],
            [p.wall_s for p in points if p.method == m],
        )
        for m in sorted({p.method for p in points})
    }
    speed = {m: quality(*pm) for m, pm in speedup_pairs(points, walls).items()}
    logs = [
        math.log(a / b)
        for pm in speedup_pairs(points, walls).values()
        for a, b in zip(*pm, strict=True)
    ]
    fit_error = float(np.std(logs)) if len(logs) >= 2 else base.fit_error
    ref = CalibrationRef(
        id=name,
        kind="profile",
        description=description or f"fitted on {len(points)} measured batches",
    )
    fitted = fitted.model_copy(
        update={
            "name": name,
            "gpu": gpu if gpu is not None else base.gpu,
            "description": description or base.description,
            "fit_error": round(max(fit_error, 0.01), 4),
            "calibration": ref,
        }
    )
    return StepFit(
        profile=fitted,
        parameters={n: round(float(v), 6) for n, v in zip(names, x, strict=True)},
        wall=per_method,
        wall_all=quality(walls, measured.tolist()),
        speedup=speed,
        converged=converged,
        message=message,
    )
