"""Per-segment verdicts: the behaviour issue 3 requires, on hand-built segments."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from advisor.acceptance import (
    acceptance_for,
    alpha_from_counters,
    effective_alpha,
    prior,
    task_class,
    temperature_band,
    vllm_acceptance_rate,
)
from advisor.perf import expected_tokens
from advisor.profile import AcceptanceEntry, get_profile, load_profile
from advisor.schemas import CalibrationRef, Deployment, SegmentStats
from advisor.scoring import score_segment, widen


def segment(
    prompt: float = 1500, output: float = 129, c50: float = 4, c95: float = 12,
    task: str = "unlabelled", temperature: float | None = None, ctx_scale: float = 2.0,
) -> SegmentStats:  # fmt: skip
    return SegmentStats(
        key="s", task=task, temperature_band="any", prompt_band="any", output_band="any",
        concurrency_band="any", n=1000, share=0.5, prompt_p50=prompt,
        prompt_p95=prompt * ctx_scale, output_p50=output, output_p95=output * ctx_scale,
        temperature_p50=temperature, concurrency_p50=c50, concurrency_p95=c95,
        concurrency_estimated=False,
    )  # fmt: skip


def test_widen_combines_acceptance_spread_and_fit_error_in_log_space() -> None:
    iv = widen(2.0, 1.5, 2.4, 0.1)
    # low = 2 * exp(-sqrt(ln(2/1.5)^2 + (1.645*0.1)^2)) by hand
    assert iv.low == pytest.approx(2.0 * math.exp(-math.hypot(math.log(2 / 1.5), 0.1645)), 1e-3)
    assert iv.high == pytest.approx(2.0 * math.exp(math.hypot(math.log(2.4 / 2), 0.1645)), 1e-3)
    assert widen(1.0, 1.0, 1.0, 0.0).low == 1.0


def test_predictable_code_at_low_load_is_enabled() -> None:
    v = score_segment(segment(task="code", temperature=0.0, output=400, prompt=300), Deployment())
    assert v.verdict == "enable"
    assert v.e2e_speedup.low >= 1.10
    assert v.acceptance.low <= v.acceptance.value <= v.acceptance.high
    assert v.e2e_speedup.low <= v.e2e_speedup.value <= v.e2e_speedup.high
    assert any(r.startswith("Predictable output: eagle3 acceptance 0.80") for r in v.reasons)


def test_short_outputs_gain_much_less_and_the_reason_is_the_decode_share() -> None:
    # Azure 2023: prompt p50 ~1.5k in both traces, output p50 13 (code) against 129 (conv).
    code = score_segment(segment(output=13), Deployment())
    conv = score_segment(segment(output=129), Deployment())
    assert code.e2e_speedup.value < conv.e2e_speedup.value - 0.2
    assert code.decode_share < conv.decode_share
    share_reason = next(r for r in code.reasons if r.startswith("Decode share"))
    assert f"{code.decode_share:.0%}" in share_reason and "output p50 13 tokens" in share_reason


def test_a_draft_that_does_not_fit_disables_with_the_memory_numbers() -> None:
    # L40S, 48 GB x 0.9 = 43.2 GB budget; Llama-3.1-8B 16.06 GB + Llama-3.2-1B 2.47 GB + 2 GB
    # reserve leave 22.67 GB for KV. 22 requests x 8000 tokens x (131,072 + 32,768) B/token
    # = 28.8 GB needed: the draft does not fit, though the target alone (23.1 of 25.1 GB) does.
    dep = Deployment(gpu="l40s", method="draft_model", draft="llama-3.2-1b")
    v = score_segment(segment(prompt=3000, output=1000, c50=10, c95=22), dep)
    assert v.verdict == "disable"
    assert not v.memory.fits
    assert v.memory.kv_needed_gb == pytest.approx(22 * 8000 * 163840 / 1e9, rel=1e-3)
    assert v.memory.kv_available_gb == pytest.approx(43.2 - 16.061 - 2.471 - 2.0, abs=0.01)
    assert "memory does not fit" in v.reasons[0]
    vram = next(r for r in v.reasons if r.startswith("Spare VRAM"))
    assert "28.8 GB" in vram and "preempt" in vram


def test_a_method_slower_than_baseline_is_disabled() -> None:
    dep = Deployment(method="draft_model", draft="llama-3.2-1b")  # vLLM 0.26: no async scheduling
    v = score_segment(segment(task="creative", temperature=1.0), dep)
    assert v.e2e_speedup.high < 1.0
    assert v.verdict == "disable"


def test_high_concurrency_on_a_compute_bound_step_loses_throughput() -> None:
    low = score_segment(segment(prompt=200, output=300, c50=4, c95=8), Deployment(k=4))
    high = score_segment(segment(prompt=200, output=300, c50=200, c95=400), Deployment(k=4))
    assert high.throughput_change.value < low.throughput_change.value
    assert high.throughput_change.value < 1.0
    assert high.verdict in ("disable", "try-it")
    load = next(r for r in high.reasons if r.startswith("GPU load"))
    assert "compute-bound" in load


def test_a_profile_with_fitted_acceptance_replaces_the_prior() -> None:
    base = get_profile("roofline")
    fitted = base.model_copy(update={"acceptance_table": [
        AcceptanceEntry(method="eagle3", task="code", alpha=0.55, low=0.5, high=0.6, n=300),
    ]})  # fmt: skip
    est = acceptance_for(segment(task="code", temperature=0.0), "eagle3", fitted)
    assert est.fitted and est.interval.value == 0.55 and "n=300" in est.source
    assert not acceptance_for(segment(task="chat"), "eagle3", fitted).fitted


def test_unlabelled_traffic_gets_the_widest_interval() -> None:
    labelled = prior("eagle3", "code", "greedy")
    unknown = acceptance_for(segment(task="unlabelled", temperature=None), "eagle3").interval
    assert unknown.high - unknown.low > labelled.high - labelled.low
    assert task_class("Code completion") == "code" and task_class("conversation") == "chat"
    assert task_class(None) == "unlabelled" and temperature_band(None) == "unknown"
    # answering from a supplied document copies from the prompt (rag), unlike closed-book qa
    assert task_class("document_qa") == "rag"
    assert prior("ngram", "creative", "high").value < prior("ngram", "creative", "greedy").value


def test_alpha_round_trips_through_vllm_counters() -> None:
    # 1000 drafts of k=4 at alpha 0.7: accepted = 1000*(0.7+0.49+0.343+0.2401) = 1773.1
    assert alpha_from_counters(1000, 1773.1, 4) == pytest.approx(0.7, abs=1e-6)
    assert vllm_acceptance_rate(0.7, 4) == pytest.approx(1773.1 / 4000)
    assert expected_tokens(0.7, 4) == pytest.approx(1 + 1773.1 / 1000)


def test_the_default_profile_says_it_is_unmeasured_for_gpus_without_one() -> None:
    assert load_profile("l40s").calibration.kind == "roofline"
    assert "no measured profile for l40s" in load_profile("l40s").calibration.description


@settings(max_examples=25, deadline=None)
@given(
    prompt=st.integers(8, 16000), output=st.integers(1, 4000), c50=st.integers(1, 256),
    extra=st.integers(0, 256), task=st.sampled_from(["code", "chat", "unlabelled", "rag"]),
    temperature=st.sampled_from([None, 0.0, 0.5, 1.0]),
    method=st.sampled_from(["eagle3", "ngram", "suffix", "mtp"]),
)  # fmt: skip
def test_verdicts_are_consistent_with_their_intervals(
    prompt, output, c50, extra, task, temperature, method
) -> None:
    v = score_segment(
        segment(prompt, output, c50, c50 + extra, task, temperature), Deployment(method=method)
    )
    for iv in (v.acceptance, v.decode_speedup, v.e2e_speedup, v.throughput_change):
        assert iv.low <= iv.value <= iv.high
    assert 0.0 <= v.decode_share <= 1.0
    assert v.e2e_speedup.value <= max(1.0, v.decode_speedup.value) + 1e-6  # Amdahl
    if v.verdict == "enable":
        assert v.e2e_speedup.low >= 1.10 and v.memory.fits
    if v.e2e_speedup.high < 1.0 or not v.memory.fits:
        assert v.verdict == "disable"
    assert len(v.reasons) == 5 and (v.verdict != "try-it" or v.what_to_measure)


def test_tensor_parallelism_splits_the_weights_across_gpus() -> None:
    small = segment(prompt=1000, output=200, c50=2, c95=4)
    one = score_segment(small, Deployment(gpu="h100", target="llama-3.1-70b"))
    assert one.verdict == "disable" and not one.memory.fits
    assert "Even without speculation" in next(r for r in one.reasons if r.startswith("Spare"))
    # 141 GB of bf16 weights + a 2.8 GB EAGLE-3 head: 2 x H100 (144 GB budget) is not enough.
    assert not score_segment(
        small, Deployment(gpu="h100", target="llama-3.1-70b", tp=2)
    ).memory.fits
    four = score_segment(small, Deployment(gpu="h100", target="llama-3.1-70b", tp=4))
    assert four.memory.fits
    assert four.memory.budget_gb == pytest.approx(4 * 80 * 0.9)


def test_effective_alpha_folds_in_steps_without_a_proposal() -> None:
    assert effective_alpha(0.9, 1.0, 4) == pytest.approx(0.9, abs=1e-9)
    assert effective_alpha(0.9, 0.0, 4) == pytest.approx(0.0, abs=1e-9)
    a = effective_alpha(0.9, 0.5, 4)
    # Same tokens per step: E(a, 4) = 0.5 * E(0.9, 4) + 0.5 (by Leviathan's formula).
    assert expected_tokens(a, 4) == pytest.approx(0.5 * expected_tokens(0.9, 4) + 0.5)


def test_a_gpu_with_its_own_profile_file_uses_it(tmp_path, monkeypatch) -> None:
    import advisor.profile as profile_mod

    roofline = get_profile("roofline")
    measured = roofline.model_copy(update={
        "name": "l40s", "gpu": "l40s", "bandwidth_efficiency": 0.7,
        "calibration": CalibrationRef(id="l40s", kind="profile", description="measured sweep"),
    })  # fmt: skip
    (tmp_path / "roofline.json").write_text(roofline.model_dump_json())
    (tmp_path / "l40s.json").write_text(measured.model_dump_json())
    monkeypatch.setattr(profile_mod, "_profiles_dir", lambda: tmp_path)
    assert load_profile("l40s").calibration.kind == "profile"
    assert load_profile("L40S").bandwidth_efficiency == 0.7
    assert load_profile("h100").calibration.kind == "roofline"
