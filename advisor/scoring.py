"""Per-segment verdicts: acceptance interval -> speedup intervals -> enable / disable / try-it.

Intervals: the speedups are computed at the acceptance interval's low, value and high, then
widened by the profile's fit error (relative sd, 90% band: z = 1.645), combined in log space:
  low = s(a_value) * exp(-sqrt(ln(s(a_value)/s(a_low))^2 + (z*fit_error)^2)), high likewise.
Rules (DESIGN.md "The decision model", issue 3):
  disable  when memory does not fit at p95 concurrency and context, when the e2e interval's high
           end is below 1.0, or when throughput at p95 concurrency drops for sure (high < 1.0);
  enable   when the e2e interval's low end >= threshold (default 1.10) and throughput at p95
           concurrency does not drop (value >= 1.0);
  try-it   otherwise, saying what to measure.
"""

from __future__ import annotations

import math

from advisor.acceptance import AcceptanceEstimate, acceptance_for
from advisor.catalog import Catalog
from advisor.memory import memory_fit
from advisor.perf import (
    Setup,
    baseline_step_ms,
    best_k_steady,
    decode_speedup,
    expected_tokens,
    forward,
    position_decay,
    resolve,
    steady_state,
    verify_step_ms,
)
from advisor.profile import Profile
from advisor.schemas import Deployment, Interval, MemoryFit, SegmentStats, SegmentVerdict

THRESHOLD = 1.10
Z90 = 1.645


def widen(value: float, low: float, high: float, fit_error: float) -> Interval:
    """Combine an acceptance-driven spread with the model's own relative error (log space)."""
    lo, hi = min(low, value, high), max(low, value, high)
    m = Z90 * fit_error
    dlo = math.sqrt(math.log(value / lo) ** 2 + m**2)
    dhi = math.sqrt(math.log(hi / value) ** 2 + m**2)
    return Interval(
        value=round(value, 4),
        low=round(value * math.exp(-dlo), 4),
        high=round(value * math.exp(dhi), 4),
    )


def _speedups(
    s: Setup, alpha: float, k: int, c50: float, c95: float, p: float, o: float
) -> tuple[float, float, float]:
    """(decode speedup at p50 concurrency, e2e speedup at p50, goodput ratio at p95)."""
    base50 = steady_state(s, c50, p, o)
    spec50 = steady_state(s, c50, p, o, alpha, k)
    base95 = steady_state(s, c95, p, o)
    spec95 = steady_state(s, c95, p, o, alpha, k)
    dec = decode_speedup(s, c50, p + o / 2, alpha, k)
    return dec, base50.e2e_ms / spec50.e2e_ms, spec95.tokens_per_s / base95.tokens_per_s


def _memory_reason(s: Setup, mem: MemoryFit, base: MemoryFit, c95: float, ctx: float) -> str:
    what = f"{s.target.name} {mem.target_weights_gb:.1f} GB"
    if s.draft is not None:
        what += f" + draft {mem.draft_weights_gb:.1f} GB"
    text = (
        f"Spare VRAM: {what} of a {mem.budget_gb:.0f} GB budget leave {mem.kv_available_gb:.1f} GB "
        f"for KV cache; {c95:.0f} concurrent requests x {ctx:.0f} tokens (p95) need "
        f"{mem.kv_needed_gb:.1f} GB, headroom {mem.headroom_gb:+.1f} GB."
    )
    if not mem.fits and base.fits:
        text += " The draft pushes the KV cache below what the load needs: vLLM would preempt."
    elif not mem.fits:
        text += " Even without speculation this load does not fit; add GPUs (--tp) first."
    return text


def score_segment(
    stats: SegmentStats,
    deployment: Deployment,
    profile: Profile | None = None,
    *,
    threshold: float = THRESHOLD,
    catalog: Catalog | None = None,
    acceptance: AcceptanceEstimate | None = None,
) -> SegmentVerdict:
    """The verdict for one segment, with intervals, best k and reasons answering the four
    questions (predictable output? spare VRAM? GPU saturated? enough decode share?)."""
    s = resolve(deployment, profile, catalog)
    acc = acceptance or acceptance_for(stats, deployment.method, s.profile)
    a = acc.interval
    c50 = max(1.0, stats.concurrency_p50)
    c95 = max(c50, stats.concurrency_p95)
    p, o = max(1.0, stats.prompt_p50), max(1.0, stats.output_p50)
    k = deployment.k or best_k_steady(s, a.value, c50, p, o)
    lo, mid, hi = (_speedups(s, x, k, c50, c95, p, o) for x in (a.low, a.value, a.high))
    fe = s.profile.fit_error
    dec = widen(mid[0], lo[0], hi[0], fe)
    e2e = widen(mid[1], lo[1], hi[1], fe)
    thr = widen(mid[2], lo[2], hi[2], fe)

    ctx = stats.prompt_p95 + stats.output_p95
    mem = memory_fit(s, c95, ctx)
    base_mem = memory_fit(s, c95, ctx, speculative=False)
    base50 = steady_state(s, c50, p, o)
    # Time in this request's own decode steps; the rest is prefill (its own, and the prompts of
    # requests arriving meanwhile, which chunked prefill interleaves): none of it speeds up.
    decode_share = min(1.0, o * baseline_step_ms(s, c50, p + o / 2) / base50.e2e_ms)
    context95 = p + o / 2
    step = forward(s, s.target, c95, context95, 1)
    verify_cost = verify_step_ms(s, c95, context95, k) / baseline_step_ms(s, c95, context95)
    e = expected_tokens(a.value, k, position_decay(s))

    reasons: list[str] = []
    what: str | None = None
    if not mem.fits:
        verdict = "disable"
        reasons.append(
            f"disable: memory does not fit at p95 load (headroom {mem.headroom_gb:+.1f} GB)."
        )
    elif e2e.high < 1.0:
        verdict = "disable"
        reasons.append(
            f"disable: even the optimistic end-to-end speedup {e2e.high:.2f}x is below 1.0."
        )
    elif thr.high < 1.0:
        verdict = "disable"
        reasons.append(
            f"disable: throughput at p95 concurrency {c95:.0f} drops to {thr.value:.2f}x "
            f"({thr.low:.2f}-{thr.high:.2f}); speculation would cut peak capacity."
        )
    elif e2e.low >= threshold and thr.value >= 1.0:
        verdict = "enable"
        reasons.append(
            f"enable: end-to-end speedup {e2e.value:.2f}x ({e2e.low:.2f}-{e2e.high:.2f}) clears "
            f"the {threshold:.2f} threshold with k={k}."
        )
    else:
        verdict = "try-it"
        if thr.value < 1.0:
            what = (
                f"Measure tokens/s at concurrency {c95:.0f} with and without {deployment.method} "
                f"(k={k}): the model predicts {thr.value:.2f}x, a capacity loss at peak."
            )
        else:
            what = (
                f"Replay a sample of this segment with {deployment.method} k={k} and read "
                "vllm:spec_decode_num_accepted_tokens / vllm:spec_decode_num_drafts: the verdict "
                f"turns on acceptance, now {a.low:.2f}-{a.high:.2f}."
            )
        reasons.append(
            f"try it: end-to-end speedup {e2e.value:.2f}x ({e2e.low:.2f}-{e2e.high:.2f}) is "
            f"uncertain around the {threshold:.2f} threshold."
        )
    reasons.append(
        f"Predictable output: {deployment.method} acceptance {a.value:.2f} "
        f"({a.low:.2f}-{a.high:.2f}) for {acc.task_class} traffic at {acc.temperature_band} "
        f"temperature ({acc.source}); {e:.2f} tokens per verification step at k={k}."
    )
    reasons.append(_memory_reason(s, mem, base_mem, c95, ctx))
    load = (
        f"GPU load: at p95 concurrency {c95:.0f}"
        f"{' (estimated from arrivals)' if stats.concurrency_estimated else ''} a decode step is "
        f"{step.bound}-bound (memory {step.memory_ms:.1f} ms, compute {step.compute_ms:.1f} ms); "
        f"verifying {k + 1} tokens per sequence costs {verify_cost:.2f}x a plain step, so "
        f"throughput changes {thr.value:.2f}x ({thr.low:.2f}-{thr.high:.2f})."
    )
    reasons.append(load)
    reasons.append(
        f"Decode share: {decode_share:.0%} of a request's time is decoding (prompt p50 {p:.0f}, "
        f"output p50 {o:.0f} tokens); prefill is not accelerated, so {dec.value:.2f}x faster "
        f"decoding gives {e2e.value:.2f}x end to end."
    )
    return SegmentVerdict(
        stats=stats,
        share=stats.share,
        n=stats.n,
        verdict=verdict,
        method=deployment.method,
        best_k=k,
        acceptance=Interval(value=round(a.value, 4), low=round(a.low, 4), high=round(a.high, 4)),
        decode_speedup=dec,
        e2e_speedup=e2e,
        throughput_change=thr,
        decode_share=round(decode_share, 4),
        memory=mem,
        reasons=reasons,
        what_to_measure=what,
    )
