"""The performance model against hand-computed numbers, and its shape as hypothesis properties."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from advisor.perf import (
    baseline_step_ms,
    best_k,
    decode_speedup,
    estimate_concurrency,
    expected_tokens,
    forward,
    request_latency_s,
    resolve,
    simulate_batch,
    steady_state,
    tokens_variance,
    verify_step_ms,
)
from advisor.profile import MethodCost, get_profile
from advisor.schemas import Deployment

H200_BYTES_PER_MS = 4800e9 / 1e3  # datasheet 4.8 TB/s
H200_BF16_FLOPS_PER_MS = 989e12 / 1e3
LLAMA8B_STREAMED = 7_504_920_576  # 32 layers x 218,112,000 + lm_head 525,336,576 (by hand)


def ideal_profile():
    """Datasheet roofline with no engine overheads: numbers a reader can check by hand."""
    free = MethodCost(step_overhead_ms=0.0)
    base = get_profile("roofline")
    return base.model_copy(update={
        "bandwidth_efficiency": 1.0, "compute_efficiency": 1.0, "prefill_efficiency": 1.0,
        "methods": {m: free for m in base.methods},
    })  # fmt: skip


def setup(method: str = "eagle3", draft: str | None = None, profile=None, **kw):
    return resolve(Deployment(method=method, draft=draft, **kw), profile)


def test_leviathan_expected_tokens_by_hand() -> None:
    assert expected_tokens(0.8, 4) == pytest.approx(1 + 0.8 + 0.64 + 0.512 + 0.4096)
    assert expected_tokens(0.0, 5) == 1.0
    assert expected_tokens(1.0, 3) == 4.0
    # k=1: X is 1 or 2, P(2) = alpha, so Var = alpha (1 - alpha).
    assert tokens_variance(0.3, 1) == pytest.approx(0.3 * 0.7)


def test_memory_bound_step_by_hand() -> None:
    s = setup(profile=ideal_profile())
    # batch 1, 1000 cached tokens: bytes = 2*7,504,920,576 + 1000*131,072 = 15,140,913,152
    f = forward(s, s.target, 1, 1000, 1)
    assert f.memory_ms == pytest.approx(15_140_913_152 / H200_BYTES_PER_MS)  # 3.154 ms
    # flops = 2*7,504,920,576 + 4*32 layers*32 heads*128*1000 = 15,534,129,152
    assert f.compute_ms == pytest.approx(15_534_129_152 / H200_BF16_FLOPS_PER_MS)
    assert f.bound == "memory"
    assert baseline_step_ms(s, 1, 1000) == pytest.approx(f.memory_ms)


def test_compute_bound_verification_by_hand() -> None:
    s = setup(profile=ideal_profile())
    # 256 sequences x 5 tokens at context 0: flops = 1280 * 2 * 7,504,920,576 = 1.921e13
    f = forward(s, s.target, 256, 0, 5)
    assert f.compute_ms == pytest.approx(1280 * 2 * LLAMA8B_STREAMED / H200_BF16_FLOPS_PER_MS)
    assert f.bound == "compute"  # 19.4 ms of compute against 3.1 ms of weight reads
    assert verify_step_ms(s, 256, 0, 4) == pytest.approx(f.compute_ms)


def test_default_profile_matches_what_gpu_md_saw_on_h200() -> None:
    # GPU.md section A: ~5 ms per token for an 8B at batch 1; EAGLE-3 ~2x at a=0.8;
    # draft_model with a 1B draft and k=4 slower than baseline on vLLM 0.26.
    eagle = simulate_batch(setup(), 0.8, 4, 1, 512, 256)
    assert 4.0 < eagle.tpot_ms_baseline < 6.0
    assert 1.6 < eagle.speedup < 2.6
    dm = simulate_batch(setup("draft_model", "llama-3.2-1b"), 0.8, 4, 1, 512, 256)
    assert dm.speedup < 1.0


@settings(max_examples=40, deadline=None)
@given(
    a1=st.floats(0.0, 0.95), a2=st.floats(0.0, 0.95), k=st.integers(1, 8),
    batch=st.sampled_from([1, 8, 64, 256]), prompt=st.integers(16, 8192),
    output=st.integers(1, 2048), method=st.sampled_from(["eagle3", "ngram", "draft_model"]),
)  # fmt: skip
def test_speedup_rises_with_acceptance(a1, a2, k, batch, prompt, output, method) -> None:
    s = setup(method, "llama-3.2-1b" if method == "draft_model" else None)
    lo, hi = sorted((a1, a2))
    r_lo = simulate_batch(s, lo, k, batch, prompt, output)
    r_hi = simulate_batch(s, hi, k, batch, prompt, output)
    assert r_hi.decode_speedup >= r_lo.decode_speedup - 1e-12
    assert r_hi.e2e_latency_speedup >= r_lo.e2e_latency_speedup - 1e-12


@settings(max_examples=30, deadline=None)
@given(alpha=st.floats(0.5, 0.95), k=st.integers(1, 6), batch=st.sampled_from([1, 4, 32]))
def test_long_prompt_short_output_tends_to_no_gain(alpha, k, batch) -> None:
    s = setup("ngram")  # no draft prefill: the only difference is decode
    short = simulate_batch(s, alpha, k, batch, 32000, 1)
    assert short.e2e_latency_speedup == pytest.approx(1.0, abs=0.02)
    gains = [simulate_batch(s, alpha, k, batch, 8000, o).e2e_latency_speedup for o in (2, 50, 800)]
    assert gains == sorted(gains)  # more output, more of the request is accelerated


def test_gain_shrinks_and_inverts_at_high_concurrency_when_compute_bound() -> None:
    s = setup()
    gains = [decode_speedup(s, b, 256, 0.6, 4) for b in (1, 32, 64, 128, 256)]
    assert gains[0] > 1.4
    assert gains[1:] == sorted(gains[1:], reverse=True)  # past the ridge, every sequence costs
    assert gains[-1] < 1.0  # 256 x 5 tokens per step: the extra tokens cost more than they win
    assert forward(s, s.target, 256, 256, 5).bound == "compute"
    # Even the best k cannot rescue it: the batch-level speedup inverts too.
    k = best_k(s, 0.6, 256, 128, 256)
    assert simulate_batch(s, 0.6, k, 256, 128, 256).speedup < 1.0


def test_long_context_keeps_verification_cheap_at_larger_batch() -> None:
    # MagicDec (Chen et al., 2024): with long contexts KV reads dominate the step, so the same
    # batch that is compute-bound at short context is memory-bound and speculation pays again.
    s = setup()
    assert decode_speedup(s, 128, 32000, 0.7, 3) > decode_speedup(s, 128, 128, 0.7, 3) + 0.2
    assert forward(s, s.target, 128, 32000, 4).bound == "memory"


def test_best_k_is_the_argmax_and_grows_with_acceptance() -> None:
    s = setup()
    k = best_k(s, 0.9, 1, 512, 256)
    speedups = {j: simulate_batch(s, 0.9, j, 1, 512, 256).speedup for j in range(1, 9)}
    assert speedups[k] == max(speedups.values())
    assert best_k(s, 0.9, 1, 512, 256) >= best_k(s, 0.5, 1, 512, 256)
    assert best_k(s, 0.8, 256, 512, 256) <= best_k(s, 0.8, 1, 512, 256)


def test_request_latency_and_little_law_concurrency() -> None:
    dep = Deployment()
    ttft, e2e = request_latency_s(dep, 1500, 100, batch=4)
    assert 0 < ttft < e2e
    assert request_latency_s(dep, 1500, 200, batch=4)[1] > e2e
    assert request_latency_s(dep, 3000, 100, batch=4)[0] > ttft
    s = setup()
    c = estimate_concurrency(s, 5.0, 1500, 100)
    assert c == pytest.approx(5.0 * steady_state(s, c, 1500, 100).e2e_ms / 1e3, rel=0.01)
    assert estimate_concurrency(s, 10.0, 1500, 100) > c


def test_a_batch_larger_than_the_kv_cache_runs_in_waves() -> None:
    from advisor.memory import max_running

    s = setup("draft_model", "llama-3.2-1b", gpu="l40s")
    ctx = 8192 + 512
    # L40S: 43.2 GB budget - 16.06 (8B) - 2 reserve = 25.14 GB of KV -> 25.14e9 / (8704 x 131,072
    # B) = 22 sequences; the 1B draft (2.47 GB, +32,768 B/token) leaves 22.67 GB / (8704 x
    # 163,840 B) = 15.9, so 15.
    assert max_running(s, ctx, speculative=False) == 22
    assert max_running(s, ctx) == 15
    fits = simulate_batch(s, 0.8, 3, 64, 8192, 512)
    waves = simulate_batch(s, 0.8, 3, 64, 8192, 512, running=(22, 15))
    assert waves.makespan_ms_baseline > fits.makespan_ms_baseline
    assert waves.speedup < fits.speedup  # the draft's KV costs it concurrency


def test_optional_profile_knobs_behave_as_documented() -> None:
    base = ideal_profile()
    smooth = setup(profile=base.model_copy(update={"roofline_sharpness": 2.0}))
    f = forward(smooth, smooth.target, 1, 1000, 1)
    assert f.ms == pytest.approx((f.memory_ms**2 + f.compute_ms**2) ** 0.5)  # p-norm, p = 2
    slow_kv = setup(profile=base.model_copy(update={"kv_bandwidth_efficiency": 0.5}))
    # KV bytes at half the weights' bandwidth: 1000 x 131,072 B cost twice as long.
    extra = 1000 * 131072 / H200_BYTES_PER_MS
    assert forward(slow_kv, slow_kv.target, 1, 1000, 1).memory_ms == pytest.approx(
        forward(setup(profile=base), slow_kv.target, 1, 1000, 1).memory_ms + extra
    )


def test_position_decay_lowers_deep_acceptance() -> None:
    # a = 0.8, decay 0.9: positions accept 0.8, 0.72, 0.648 conditionally; by hand
    # E = 1 + 0.8 + 0.8*0.72 + 0.8*0.72*0.648 = 2.7492 (i.i.d. would be 1 + .8 + .64 + .512).
    assert expected_tokens(0.8, 3, 0.9) == pytest.approx(2.749248)
    assert expected_tokens(0.8, 3, 1.0) == pytest.approx(2.952)
    assert tokens_variance(0.3, 1, 0.5) == pytest.approx(0.3 * 0.7)  # position 0 is alpha
    base = get_profile("roofline")
    methods = dict(base.methods)
    methods["eagle3"] = methods["eagle3"].model_copy(update={"position_decay": 0.85})
    decayed = setup(profile=base.model_copy(update={"methods": methods}))
    assert best_k(decayed, 0.8, 1, 512, 256) < best_k(setup(), 0.8, 1, 512, 256)
