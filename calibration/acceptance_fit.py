"""Fitting the acceptance model from replayed segments (scikit-learn), with intervals.

Each replayed segment gives one observation: vLLM's spec-decode counter deltas over its batch,
with the segment's method, task, temperature, lengths and (when text was replayed) text features.
The target is the per-token acceptance alpha implied by the measured mean acceptance length,
because that is the quantity the advisor's Leviathan formula E = (1 - a^(k+1)) / (1 - a) uses
(Leviathan et al., 2023, "Fast Inference from Transformers via Speculative Decoding", eq. 1).

The model is a ridge regression on logit(alpha): few segments (tens at most) are replayed per
calibration, so a linear model with shrinkage is what the data can support; it is also a set of
named coefficients that can be stored as JSON and read back without scikit-learn. Intervals come
from a bootstrap over segments plus each segment's own binomial noise, widened by the
out-of-sample (leave-one-out) residual spread, so an interval is a prediction interval for a new
segment, not only the uncertainty of the mean.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

import numpy as np
from pydantic import BaseModel, Field

# Text features: structured output (JSON, code, SQL) is dense in these characters. Density is
# counted per 10 characters so that, like every other feature, one unit is a sizeable change.
_STRUCTURE_CHARS = set('{}[]()<>:;=,"')
_WORD = re.compile(r"\w+|[^\w\s]")
NUMERIC = ("temperature", "log_prompt_tokens", "log_output_tokens")
# Below three segments there is no out-of-sample residual; this logit spread (about +-6
# percentage points at alpha = 0.5) keeps such an interval from claiming a precision it lacks.
MIN_LOGIT_SIGMA = 0.25
_EPS = 1e-4


class Observation(BaseModel):
    """One replayed segment on the speculative server."""

    segment_key: str
    method: str
    task: str = "unlabelled"
    temperature: float = Field(ge=0.0)
    prompt_tokens: float = Field(gt=0)
    output_tokens: float = Field(gt=0)
    num_drafts: int = Field(gt=0)
    num_draft_tokens: int = Field(gt=0)
    num_accepted_tokens: int = Field(ge=0)
    decode_steps: int | None = Field(default=None, description="all decode steps, drafted or not")
    text_features: dict[str, float] | None = None

    @property
    def alpha(self) -> float:
        """Per-token acceptance implied by this segment's counters (over all decode steps)."""
        return alpha_from_counters(
            self.num_drafts, self.num_draft_tokens, self.num_accepted_tokens, self.decode_steps
        )


class Query(BaseModel):
    """A point to predict acceptance for."""

    method: str
    task: str = "unlabelled"
    temperature: float = Field(default=0.0, ge=0.0)
    prompt_tokens: float = Field(default=512.0, gt=0)
    output_tokens: float = Field(default=256.0, gt=0)
    text_features: dict[str, float] | None = None


class Band(BaseModel):
    """Predicted per-token acceptance with its interval."""

    value: float
    low: float
    high: float


class LinearLogitModel(BaseModel):
    """logit(alpha) = intercept + sum of the named terms; JSON-friendly, no scikit-learn needed.

    Categorical terms are named `method=eagle3`, `task=code`; an unseen category adds nothing.
    """

    intercept: float
    coefficients: dict[str, float]
    residual_sigma: float = Field(description="logit-space spread added for a new segment")
    bootstrap: list[dict[str, float]] = Field(
        default_factory=list, description="coefficient sets (with 'intercept') from the bootstrap"
    )

    def logit(self, features: dict[str, float], coefficients: dict[str, float]) -> float:
        """Linear predictor for a feature dict under one coefficient set."""
        return coefficients.get("intercept", self.intercept) + sum(
            coefficients.get(name, 0.0) * value for name, value in features.items()
        )


class FitQuality(BaseModel):
    """How well the acceptance model fits the replayed segments (alpha scale)."""

    n_segments: int
    features: list[str]
    rmse: float
    loo_rmse: float | None = Field(description="leave-one-out error; None below 3 segments")
    max_abs_error: float
    interval_coverage: float = Field(description="share of segments inside their own interval")
    residuals: dict[str, float] = Field(description="measured - fitted alpha per segment")


class AcceptanceFit(BaseModel):
    """The fitted model, its quality, and the data ranges it was fitted on."""

    model: LinearLogitModel
    quality: FitQuality
    methods: list[str]
    tasks: list[str]
    temperature_range: tuple[float, float]
    text_names: list[str] = Field(
        default_factory=list, description="text features used (every segment had them)"
    )
    task_text_means: dict[str, dict[str, float]] = Field(default_factory=dict)
    mean_bootstrap_var: float = Field(
        default=0.0, description="logit-scale variance of the fitted mean, averaged over segments"
    )

    def predict(self, query: Query, level: float = 0.9) -> Band:
        """Acceptance and its `level` prediction interval at one point."""
        feats = features_of(query, self.text_names, self.task_text_means)
        return _band(self.model, feats, level)

    def profile_logits(self) -> list[dict[str, object]]:
        """The fit in advisor.profile.AcceptanceLogit form, one entry per method.

        That form has no text features, so each task's mean text features fold into its task
        term; its single logit-scale sd is the residual spread plus the bootstrap spread
        averaged over the fitted segments. Only tasks that were replayed get a task term.
        Task labels are matched lower-cased by the advisor, as they are stored here.
        """
        c = self.model.coefficients
        tasks = {}
        for task in self.tasks:
            text = self.task_text_means.get(task, {})
            tasks[task] = c.get(f"task={task}", 0.0) + sum(
                c.get(name, 0.0) * value for name, value in text.items()
            )
        # Centre the task terms on their mean: a task that was not replayed then gets the
        # average of those that were, instead of an arbitrary reference level.
        centre = float(np.mean(list(tasks.values()))) if tasks else 0.0
        tasks = {task: value - centre for task, value in tasks.items()}
        entries = []
        for method in self.methods:
            entries.append(
                {
                    "method": method,
                    "intercept": self.model.intercept + centre + c.get(f"method={method}", 0.0),
                    "task": tasks,
                    "temperature": c.get("temperature", 0.0),
                    "log_prompt": c.get("log_prompt_tokens", 0.0),
                    "log_output": c.get("log_output_tokens", 0.0),
                    "sd": math.sqrt(self.model.residual_sigma**2 + self.mean_bootstrap_var),
                    "n": self.quality.n_segments,
                }
            )
        return entries


def alpha_from_counters(
    num_drafts: int, num_draft_tokens: int, num_accepted: int, decode_steps: int | None = None
) -> float:
    """Solve accepted / steps = sum_{i=1..k} a^i for a, with k = draft tokens per draft.

    n-gram drafters propose fewer than k tokens, or none, when they find no match: k is the
    measured mean, and with `decode_steps` (every decode step of the batch, drafted or not) the
    steps without a proposal count as steps that accepted nothing, so a is the per-token
    acceptance that gives the measured tokens per step over all steps - what the advisor's
    E(a, k) needs. The sum is monotone in a, so bisection is exact enough.
    """
    if num_drafts <= 0 or num_draft_tokens <= 0:
        raise ValueError("no drafts: acceptance is undefined")
    k = num_draft_tokens / num_drafts
    steps = max(num_drafts, decode_steps or 0)
    target = min(num_accepted / steps, k)
    if target <= 0:
        return 0.0
    if target >= k:
        return 1.0

    def accepted_per_step(a: float) -> float:
        return a * (1 - a**k) / (1 - a)

    lo, hi = 0.0, 1.0 - 1e-12
    for _ in range(80):
        mid = (lo + hi) / 2
        if accepted_per_step(mid) < target:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def text_features(prompts: Sequence[str], outputs: Sequence[str] | None = None) -> dict[str, float]:
    """Mean structure-character density of the prompts (per 10 non-space characters) and, when
    outputs are given, their prompt-copy overlap: the share of the output's word 3-grams that
    also occur in its prompt, what n-gram / prompt-lookup drafting feeds on (Saxena, 2023,
    "Prompt Lookup Decoding")."""
    density = [
        10 * sum(c in _STRUCTURE_CHARS for c in p) / max(1, len(p) - p.count(" ")) for p in prompts
    ]
    result = {"punctuation_per_10_chars": float(np.mean(density)) if density else 0.0}
    if outputs:
        overlaps = []
        for prompt, output in zip(prompts, outputs, strict=False):
            out_grams = _trigrams(output)
            if out_grams:
                overlaps.append(len(out_grams & _trigrams(prompt)) / len(out_grams))
        result["prompt_copy_overlap"] = float(np.mean(overlaps)) if overlaps else 0.0
    return result


def _trigrams(text: str) -> set[tuple[str, ...]]:
    words = _WORD.findall(text.lower())
    return {tuple(words[i : i + 3]) for i in range(len(words) - 2)}


def features_of(
    point: Observation | Query,
    text_names: Sequence[str],
    task_text_means: dict[str, dict[str, float]],
) -> dict[str, float]:
    """Named features of one point; text features fall back to the task's mean when absent."""
    feats = {
        f"method={point.method}": 1.0,
        f"task={point.task}": 1.0,
        "temperature": point.temperature,
        # ln(1 + n), as advisor.profile.AcceptanceLogit evaluates it
        "log_prompt_tokens": math.log1p(point.prompt_tokens),
        "log_output_tokens": math.log1p(point.output_tokens),
    }
    given = point.text_features or task_text_means.get(point.task, {})
    for name in text_names:
        feats[name] = float(given.get(name, 0.0))
    return feats


def _logit(p: np.ndarray | float) -> np.ndarray:
    p = np.clip(p, _EPS, 1 - _EPS)
    return np.log(p / (1 - p))


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


def _logit_se(obs: Observation) -> float:
    """Binomial standard error of logit(alpha), from the number of drafted tokens."""
    a = min(max(obs.alpha, 0.01), 0.99)
    return 1.0 / math.sqrt(obs.num_draft_tokens * a * (1 - a))


# Prior scale of each feature's effect: "about a logit per unit", except lengths, where it is a
# logit per 3 e-folds (20x the length). Published acceptance is reported per task and sampling
# temperature (Spec-Bench, Xia et al., 2024), not per length; with few segments, a length that
# happens to differ between them must not take over the task's effect.
PRIOR_UNIT = {"log_prompt_tokens": 3.0, "log_output_tokens": 3.0}


def _fit_once(
    x: np.ndarray, y: np.ndarray, w: np.ndarray, names: list[str], ridge: float
) -> dict[str, float]:
    """Ridge on centred columns in their prior units, as raw coefficients with 'intercept'.

    Columns are not scaled to unit variance on purpose: the penalty then encodes PRIOR_UNIT. A
    feature that barely varies among few segments (two segments whose output lengths differ by
    3%) cannot soak up their difference with a huge slope that would extrapolate wildly.
    """
    unit = np.array([PRIOR_UNIT.get(name, 1.0) for name in names])
    mean = np.average(x, axis=0, weights=w)
    from sklearn.linear_model import Ridge  # deferred: 2 s of import for every CLI start

    model = Ridge(alpha=ridge).fit((x - mean) / unit, y, sample_weight=w)
    raw = model.coef_ / unit
    coefs = {name: float(c) for name, c in zip(names, raw, strict=True)}
    coefs["intercept"] = float(model.intercept_ - np.dot(raw, mean))
    return coefs


def _band(model: LinearLogitModel, feats: dict[str, float], level: float) -> Band:
    central = model.logit(feats, {"intercept": model.intercept, **model.coefficients})
    draws = np.array([model.logit(feats, c) for c in model.bootstrap] or [central])
    # Prediction interval: bootstrap spread of the mean and a new segment's own spread, added
    # in quadrature (both roughly normal in logit space).
    sigma = math.sqrt(float(np.var(draws)) + model.residual_sigma**2)
    z = _normal_quantile(0.5 + level / 2)
    return Band(
        value=_sigmoid(central),
        low=_sigmoid(central - z * sigma),
        high=_sigmoid(central + z * sigma),
    )


def _normal_quantile(p: float) -> float:
    """Inverse standard normal CDF by bisection on erf (no scipy needed for one number)."""
    lo, hi = -10.0, 10.0
    for _ in range(100):
        mid = (lo + hi) / 2
        if 0.5 * (1 + math.erf(mid / math.sqrt(2))) < p:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def fit_acceptance(
    observations: Sequence[Observation],
    *,
    ridge: float = 0.1,
    n_bootstrap: int = 200,
    level: float = 0.9,
    seed: int = 0,
) -> AcceptanceFit:
    """Fit logit(alpha) on the observations' features; raises ValueError without observations."""
    if not observations:
        raise ValueError("no segment drafted any token: there is no acceptance to fit")
    obs = list(observations)
    text_names = sorted(set.intersection(*(set(o.text_features or {}) for o in obs)))
    task_text_means: dict[str, dict[str, float]] = {}
    for task in sorted({o.task for o in obs}) if text_names else []:
        rows = [o.text_features or {} for o in obs if o.task == task]
        task_text_means[task] = {n: float(np.mean([r[n] for r in rows])) for n in text_names}
    feats = [features_of(o, text_names, task_text_means) for o in obs]
    names = sorted({name for f in feats for name in f})
    x = np.array([[f.get(n, 0.0) for n in names] for f in feats])
    y = _logit(np.array([o.alpha for o in obs]))
    w = np.array([float(o.num_draft_tokens) for o in obs])
    w = w / w.mean()
    se = np.array([_logit_se(o) for o in obs])

    central = _fit_once(x, y, w, names, ridge)
    rng = np.random.default_rng(seed)
    n = len(obs)
    boot = []
    for _ in range(n_bootstrap):
        idx = rng.integers(0, n, n) if n >= 4 else np.arange(n)
        noisy = y[idx] + rng.normal(0.0, se[idx])
        boot.append(_fit_once(x[idx], noisy, w[idx], names, ridge))

    loo = None
    if n >= 3:
        loo_res = []
        for i in range(n):
            keep = np.arange(n) != i
            c = _fit_once(x[keep], y[keep], w[keep], names, ridge)
            pred = c["intercept"] + sum(c[nm] * feats[i].get(nm, 0.0) for nm in names)
            loo_res.append(float(y[i] - pred))
        loo = loo_res
    sigma = (
        max(MIN_LOGIT_SIGMA, float(np.sqrt(np.average(np.square(loo), weights=w))))
        if loo is not None
        else MIN_LOGIT_SIGMA
    )
    model = LinearLogitModel(
        intercept=central.pop("intercept"),
        coefficients=central,
        residual_sigma=sigma,
        bootstrap=boot,
    )
    fitted = [_band(model, f, level) for f in feats]
    alphas = [o.alpha for o in obs]
    residuals = {o.segment_key: a - b.value for o, a, b in zip(obs, alphas, fitted, strict=True)}
    loo_rmse = None
    if loo is not None:
        loo_alpha = [a - _sigmoid(float(_logit(a)) - r) for a, r in zip(alphas, loo, strict=True)]
        loo_rmse = float(np.sqrt(np.mean(np.square(loo_alpha))))
    quality = FitQuality(
        n_segments=n,
        features=names,
        rmse=float(np.sqrt(np.mean(np.square(list(residuals.values()))))),
        loo_rmse=loo_rmse,
        max_abs_error=float(max(abs(r) for r in residuals.values())),
        interval_coverage=float(
            np.mean([b.low <= a <= b.high for a, b in zip(alphas, fitted, strict=True)])
        ),
        residuals=residuals,
    )
    temps = [o.temperature for o in obs]
    boot_var = [
        float(np.var([model.logit(f, c) for c in model.bootstrap])) if model.bootstrap else 0.0
        for f in feats
    ]
    return AcceptanceFit(
        model=model,
        quality=quality,
        methods=sorted({o.method for o in obs}),
        tasks=sorted({o.task for o in obs}),
        temperature_range=(min(temps), max(temps)),
        text_names=text_names,
        task_text_means=task_text_means,
        mean_bootstrap_var=float(np.mean(boot_var)),
    )
