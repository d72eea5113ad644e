"""`advisor predict`: one operating point, B requests arriving together (P prompt, O output)."""

from __future__ import annotations

from advisor.catalog import Catalog
from advisor.errors import BadInput
from advisor.memory import max_running, memory_fit
from advisor.perf import best_k, forward, resolve, simulate_batch
from advisor.profile import Profile
from advisor.schemas import Deployment, Prediction


def predict(
    deployment: Deployment,
    acceptance: float,
    batch: int,
    prompt_tokens: int,
    output_tokens: int,
    profile: Profile | None = None,
    catalog: Catalog | None = None,
) -> Prediction:
    """Predict baseline vs speculative for the batch; k=None in the deployment picks the best k.
    `speedup` is the batch's output tokens/s ratio with prefill included."""
    if not 0.0 <= acceptance < 1.0:
        raise BadInput(f"--acceptance {acceptance} must be in [0, 1).")
    if batch < 1 or prompt_tokens < 1 or output_tokens < 1:
        raise BadInput("--batch, --prompt-tokens and --output-tokens must each be at least 1.")
    s = resolve(deployment, profile, catalog)
    ctx = prompt_tokens + output_tokens
    running = (max_running(s, ctx, speculative=False), max_running(s, ctx))
    if min(running) < 1:
        raise BadInput(
            f"one request of {ctx} tokens does not fit the KV cache of {deployment.target} on "
            f"{deployment.gpu} x{deployment.tp}; raise --tp or --gpu-memory-utilization."
        )
    k = deployment.k or best_k(s, acceptance, batch, prompt_tokens, output_tokens,
                               running=running)  # fmt: skip
    r = simulate_batch(s, acceptance, k, batch, prompt_tokens, output_tokens, running)
    mem = memory_fit(s, batch, ctx)
    verify = forward(s, s.target, batch, prompt_tokens + output_tokens / 2, k + 1)
    return Prediction(
        deployment=deployment,
        calibration=s.profile.calibration,
        acceptance=acceptance,
        batch=batch,
        prompt_tokens=prompt_tokens,
        output_tokens=output_tokens,
        k=k,
        mean_acceptance_length=round(r.mean_acceptance_length, 4),
        speedup=round(r.speedup, 4),
        e2e_latency_speedup=round(r.e2e_latency_speedup, 4),
        decode_speedup=round(r.decode_speedup, 4),
        tokens_per_s_baseline=round(r.tokens_per_s_baseline, 2),
        tokens_per_s_speculative=round(r.tokens_per_s_speculative, 2),
        tpot_ms_baseline=round(r.tpot_ms_baseline, 4),
        tpot_ms_speculative=round(r.tpot_ms_speculative, 4),
        ttft_ms=round(r.ttft_ms_baseline, 3),
        ttft_ms_speculative=round(r.ttft_ms_speculative, 3),
        memory_fits=mem.fits,
        memory=mem,
        verify_bound=verify.bound,
    )
