"""The acceptance fit: counter inversion, text features, and recovering known relationships."""

from __future__ import annotations

import math

import numpy as np
import pytest

from calibration.acceptance_fit import (
    Observation,
    Query,
    alpha_from_counters,
    fit_acceptance,
    text_features,
)

TASK_EFFECT = {"json": 1.6, "code": 1.0, "chat": 0.0, "story": -0.6}
TEMP_SLOPE = -1.5
OUTPUT_SLOPE = 0.15  # per ln(1 + output tokens)


def true_alpha(task: str, temperature: float, output_tokens: float) -> float:
    z = (
        0.2
        + TASK_EFFECT[task]
        + TEMP_SLOPE * temperature
        + OUTPUT_SLOPE * math.log1p(output_tokens)
    )
    return 1 / (1 + math.exp(-z))


def simulate(
    task: str, temperature: float, output_tokens: float, rng: np.random.Generator, k: int = 4
) -> Observation:
    """Counters of a segment whose per-token acceptance is `true_alpha`, as vLLM counts them."""
    a = true_alpha(task, temperature, output_tokens)
    drafts = 2000
    # accepted tokens in one draft: the length of the accepted prefix, capped at k
    accepted_prefix = np.minimum(rng.geometric(1 - a, drafts) - 1, k)
    return Observation(
        segment_key=f"{task}/{temperature}/{output_tokens}",
        method="eagle3",
        task=task,
        temperature=temperature,
        prompt_tokens=float(rng.integers(200, 2000)),
        output_tokens=output_tokens,
        num_drafts=drafts,
        num_draft_tokens=drafts * k,
        num_accepted_tokens=int(accepted_prefix.sum()),
    )


def test_counter_inversion_matches_leviathan():
    """E = (1 - a^(k+1)) / (1 - a) read back through the counters gives a again."""
    for a in (0.1, 0.5, 0.8, 0.95):
        k, drafts = 4, 10_000
        e = (1 - a ** (k + 1)) / (1 - a)
        accepted = round((e - 1) * drafts)
        assert alpha_from_counters(drafts, drafts * k, accepted) == pytest.approx(a, abs=1e-3)
    assert alpha_from_counters(10, 40, 0) == 0.0
    assert alpha_from_counters(10, 40, 40) == 1.0
    with pytest.raises(ValueError):
        alpha_from_counters(0, 0, 0)


def test_counter_inversion_uses_measured_draft_length():
    """n-gram drafts shorter than k: 2 tokens per draft, all accepted, is alpha 1, not < 1."""
    assert alpha_from_counters(100, 200, 200) == 1.0
    assert alpha_from_counters(100, 200, 100) < alpha_from_counters(100, 400, 100) + 0.2


def test_text_features_separate_structured_from_prose():
    structured = text_features(['{"id": 1, "tags": ["a", "b"]}', "SELECT a, b FROM t WHERE x=1;"])
    prose = text_features(["Write a short story about a lighthouse keeper and the sea."])
    assert structured["punctuation_per_10_chars"] > 3 * prose["punctuation_per_10_chars"]
    assert "prompt_copy_overlap" not in structured  # no outputs, no overlap feature
    copy = text_features(
        ["rename the field user_id to account_id in this record"],
        ["rename the field user_id to account_id in this record please"],
    )
    fresh = text_features(["tell me a joke"], ["why did the chicken cross the road"])
    assert copy["prompt_copy_overlap"] > 0.8
    assert fresh["prompt_copy_overlap"] == 0.0


def test_fit_recovers_known_relationships():
    rng = np.random.default_rng(7)
    obs = [
        simulate(task, temp, out, rng)
        for task in TASK_EFFECT
        for temp in (0.0, 0.5, 1.0)
        for out in (32.0, 256.0)
    ]
    fit = fit_acceptance(obs, n_bootstrap=100, seed=1)
    coefs = fit.model.coefficients
    # ordering of task effects and the sign of the temperature slope come back
    by_task = sorted(TASK_EFFECT, key=lambda t: coefs[f"task={t}"])
    assert by_task == sorted(TASK_EFFECT, key=TASK_EFFECT.get)
    assert coefs["temperature"] == pytest.approx(TEMP_SLOPE, abs=0.4)
    assert coefs["log_output_tokens"] == pytest.approx(OUTPUT_SLOPE, abs=0.1)
    assert fit.quality.rmse < 0.03
    assert fit.quality.loo_rmse is not None and fit.quality.loo_rmse < 0.06
    # held-out point (temperature 0.7, 128 tokens): close to the truth and inside its interval
    for task in TASK_EFFECT:
        band = fit.predict(Query(method="eagle3", task=task, temperature=0.7, output_tokens=128))
        truth = true_alpha(task, 0.7, 128)
        assert band.value == pytest.approx(truth, abs=0.05)
        assert band.low <= truth <= band.high
        assert band.high - band.low < 0.4


def test_few_segments_give_honest_wide_intervals():
    """Two segments: the fit still orders them, but no interval claims to be tight."""
    rng = np.random.default_rng(3)
    obs = [simulate("json", 0.0, 128.0, rng), simulate("story", 1.0, 124.0, rng)]
    fit = fit_acceptance(obs, n_bootstrap=50)
    # a length that barely differs must not soak up the difference (and extrapolate wildly)
    assert abs(fit.model.coefficients["log_output_tokens"]) < 0.1
    json_band = fit.predict(Query(method="eagle3", task="json", output_tokens=128))
    story_band = fit.predict(
        Query(method="eagle3", task="story", temperature=1.0, output_tokens=128)
    )
    assert json_band.value > story_band.value
    assert fit.quality.loo_rmse is None
    assert json_band.high - json_band.low > 0.05


def test_text_features_enter_the_model_when_every_segment_has_text():
    rng = np.random.default_rng(5)
    obs = []
    for i, overlap in enumerate(np.linspace(0.0, 0.9, 8)):
        base = simulate("chat", 0.0, 64.0, rng)
        a = 1 / (1 + math.exp(-(-1.0 + 3.0 * overlap)))
        drafts = 3000
        accepted = int(np.minimum(rng.geometric(1 - a, drafts) - 1, 4).sum())
        obs.append(
            base.model_copy(
                update={
                    "segment_key": f"s{i}",
                    "num_accepted_tokens": accepted,
                    "num_drafts": drafts,
                    "num_draft_tokens": drafts * 4,
                    "text_features": {
                        "punctuation_per_10_chars": 0.5,
                        "prompt_copy_overlap": overlap,
                    },
                }
            )
        )
    fit = fit_acceptance(obs, n_bootstrap=50)
    assert fit.text_names == ["prompt_copy_overlap", "punctuation_per_10_chars"]
    assert fit.model.coefficients["prompt_copy_overlap"] == pytest.approx(3.0, abs=0.8)
    one_without_text = [*obs[:3], obs[3].model_copy(update={"text_features": None})]
    assert fit_acceptance(one_without_text).text_names == []


def test_no_observations_is_an_error():
    with pytest.raises(ValueError, match="no segment drafted"):
        fit_acceptance([])


def test_profile_form_reproduces_the_fit():
    """The stored AcceptanceLogit form predicts what the fit predicts (same logit, ln(1+n))."""
    rng = np.random.default_rng(11)
    obs = [simulate(t, tp, 128.0, rng) for t in ("json", "story") for tp in (0.0, 1.0)]
    fit = fit_acceptance(obs, n_bootstrap=50)
    (entry,) = fit.profile_logits()
    assert entry["method"] == "eagle3" and set(entry["task"]) == {"json", "story"}
    for task, temp in (("json", 0.2), ("story", 0.9)):
        z = (
            entry["intercept"]
            + entry["task"][task]
            + entry["temperature"] * temp
            + entry["log_prompt"] * math.log1p(700)
            + entry["log_output"] * math.log1p(128)
        )
        expected = fit.predict(
            Query(
                method="eagle3", task=task, temperature=temp, prompt_tokens=700, output_tokens=128
            )
        )
        assert 1 / (1 + math.exp(-z)) == pytest.approx(expected.value, abs=1e-9)
    assert entry["sd"] >= 0.25


def test_profile_form_gives_unseen_tasks_the_average_task():
    rng = np.random.default_rng(13)
    obs = [simulate(t, 0.0, 128.0, rng) for t in ("json", "story")]
    (entry,) = fit_acceptance(obs, n_bootstrap=20).profile_logits()
    assert entry["task"]["json"] == pytest.approx(-entry["task"]["story"])
    assert entry["task"]["json"] > 0


def test_steps_without_a_proposal_lower_the_effective_alpha():
    """Half the decode steps drafted nothing (no n-gram match): tokens per step over all steps
    are 1 + accepted / (2 * drafts), so the effective alpha solves that, not the drafted one."""
    k, drafts, a = 4, 1000, 0.8
    accepted = round(drafts * sum(a**i for i in range(1, k + 1)))
    drafted_only = alpha_from_counters(drafts, drafts * k, accepted)
    effective = alpha_from_counters(drafts, drafts * k, accepted, decode_steps=2 * drafts)
    assert drafted_only == pytest.approx(a, abs=1e-3)
    assert sum(effective**i for i in range(1, k + 1)) == pytest.approx(accepted / (2 * drafts))
    # fewer steps than drafts cannot happen; it is read as every step drafted
    assert alpha_from_counters(drafts, drafts * k, accepted, decode_steps=10) == drafted_only
