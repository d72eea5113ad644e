"""The performance model: roofline step times, Leviathan's expected tokens, and the speedups.

Equations (times in ms; b = sequences in the batch, L = cached context tokens per sequence,
q = tokens per sequence in the step, W = weights streamed per step, kv = KV bytes per token):

  forward(b, L, q)  = max(bytes / BW_eff, flops / PEAK_eff)
      bytes         = W*dtype + b*L*kv                      (weights once, every sequence's KV)
      flops         = b*q*(2*W + 4*layers*heads*head_dim*L)  (GEMMs + attention)
      BW_eff        = datasheet bandwidth * bandwidth_efficiency * tp (* tp_efficiency if tp>1)
      PEAK_eff      = dense peak for the dtype * compute_efficiency * tp (* tp_efficiency)
  baseline step     = forward_target(b, L, 1) + o_base + b*s_base
  verify step       = forward_target(b, L, k+1) + o_m + b*s_m + b*(k+1)*v_m
  draft step        = draft_model / eagle / eagle3 / mtp: c_m*forward_draft(b, L, 1) + d_m, k times
                      ngram / suffix: b*cpu_m + d_m, once (CPU proposal, no GPU forward)
  E(alpha, k)       = (1 - alpha^(k+1)) / (1 - alpha)       (Leviathan et al., 2023); with a
                      profile's position_decay d < 1: sum_{j=0..k} prod_{i<j} alpha*d^i
  TPOT_base         = baseline step;  TPOT_spec = (draft steps + verify step) / E
  decode speedup    = TPOT_base / TPOT_spec
  prefill(B, P)     = n_chunks*o_base + max(flops / (peak*prefill_eff), n_chunks*W*dtype / BW_eff)
      flops         = B*(2*W*P + 2*layers*heads*head_dim*P^2)   (causal attention)
  A batch of B requests arriving together (`advisor predict`): prefill (target + draft's own),
  then O tokens each. The batch's makespan adds the slowest sequence's spread in cycles,
  sd = sqrt(O*Var(X)/E^3) times the expected maximum of B standard normals.
  Steady state at concurrency C (continuous batching): each iteration also carries the prefill of
  the requests that replace finished ones, C*tokens_per_iter/O prompts per iteration.

The o/s/v/c/d/cpu terms are per-method Profile parameters: engines run methods differently.
Small batch: bytes dominate, so verifying k+1 tokens costs about one step. Large batch: flops
dominate and the k extra tokens cost real time. Long context: b*L*kv dominates bytes again, and
verification is cheap even at larger batch (MagicDec, Chen et al., 2024).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

from advisor.catalog import GPU, Catalog, ModelSpec, get_gpu, get_model, load_catalog, resolve_draft
from advisor.errors import BadInput
from advisor.profile import Profile, load_profile
from advisor.schemas import Deployment

K_MAX = 8


@dataclass(frozen=True)
class Setup:
    """A deployment resolved against the catalogue and a profile."""

    gpu: GPU
    target: ModelSpec
    draft: ModelSpec | None
    method: str
    tp: int
    gpu_memory_utilization: float
    profile: Profile


def resolve(
    deployment: Deployment, profile: Profile | None = None, catalog: Catalog | None = None
) -> Setup:
    cat = catalog or load_catalog()
    gpu = get_gpu(deployment.gpu, cat)
    target = get_model(deployment.target, cat)
    if target.kind != "target":
        raise BadInput(f"--target {deployment.target} is a {target.kind} head, not a model.")
    draft = resolve_draft(deployment.method, deployment.draft, target, cat)
    return Setup(
        gpu=gpu,
        target=target,
        draft=draft,
        method=deployment.method,
        tp=deployment.tp,
        gpu_memory_utilization=deployment.gpu_memory_utilization,
        profile=profile or load_profile(gpu.name),
    )


@dataclass(frozen=True)
class Forward:
    """One forward pass's roofline: which side binds, and by how much."""

    memory_ms: float
    compute_ms: float
    sharpness: float | None = None  # Profile.roofline_sharpness

    @property
    def ms(self) -> float:
        """max(memory, compute), or the smooth p-norm (m^p + c^p)^(1/p) a profile may fit."""
        p = self.sharpness
        if not p:
            return max(self.memory_ms, self.compute_ms)
        top = max(self.memory_ms, self.compute_ms)
        if top <= 0:
            return 0.0
        return top * ((self.memory_ms / top) ** p + (self.compute_ms / top) ** p) ** (1 / p)

    @property
    def bound(self) -> str:
        return "memory" if self.memory_ms >= self.compute_ms else "compute"


def _tp_scale(s: Setup) -> float:
    return s.tp * (s.profile.tp_efficiency if s.tp > 1 else 1.0)


def bandwidth_bytes_per_ms(s: Setup) -> float:
    return s.gpu.hbm_bandwidth_gbs * 1e9 * s.profile.bandwidth_efficiency * _tp_scale(s) / 1e3


def peak_flops_per_ms(s: Setup, model: ModelSpec, efficiency: float | None = None) -> float:
    eff = s.profile.compute_efficiency if efficiency is None else efficiency
    return s.gpu.peak_flops(model.dtype_bytes) * eff * _tp_scale(s) / 1e3


def forward(s: Setup, model: ModelSpec, batch: float, context: float, tokens: float) -> Forward:
    """Roofline of one decode/verify forward: `tokens` new tokens for each of `batch` sequences."""
    w = model.streamed_params()
    bw = bandwidth_bytes_per_ms(s)
    kv_eff = s.profile.kv_bandwidth_efficiency
    kv_bw = bw if kv_eff is None else bw * kv_eff / s.profile.bandwidth_efficiency
    memory = w * model.dtype_bytes / bw + batch * context * model.kv_bytes_per_token() / kv_bw
    flops = batch * tokens * (2 * w + model.attention_flops_per_token(context))
    return Forward(memory, flops / peak_flops_per_ms(s, model), s.profile.roofline_sharpness)


def baseline_step_ms(s: Setup, batch: float, context: float) -> float:
    c = s.profile.cost("baseline")
    fwd = forward(s, s.target, batch, context, 1).ms
    return fwd + c.step_overhead_ms + batch * c.per_seq_overhead_ms


def verify_step_ms(s: Setup, batch: float, context: float, k: int) -> float:
    c = s.profile.cost(s.method)
    fwd = forward(s, s.target, batch, context, k + 1).ms
    return (
        fwd
        + c.step_overhead_ms
        + batch * c.per_seq_overhead_ms
        + batch * (k + 1) * c.verify_ms_per_token
    )


def draft_ms(s: Setup, batch: float, context: float, k: int) -> float:
    """All drafting for one speculative cycle of k tokens."""
    c = s.profile.cost(s.method)
    if s.draft is None:  # ngram / suffix: a CPU lookup per sequence, once per cycle
        return batch * c.cpu_draft_ms_per_seq + c.draft_step_overhead_ms
    one = c.draft_cost_factor * forward(s, s.draft, batch, context, 1).ms + c.draft_step_overhead_ms
    return k * one


def _survival(alpha: float, j: int, decay: float) -> float:
    """P(at least j tokens from a step) = prod of the first j-1 positions' conditional
    acceptances, alpha * decay^i at position i (decay 1: i.i.d., Leviathan's assumption)."""
    return alpha ** (j - 1) * decay ** ((j - 1) * (j - 2) / 2)


def expected_tokens(alpha: float, k: int, decay: float = 1.0) -> float:
    """Leviathan et al. (2023), eq. 1: tokens per verification step, E = (1-a^(k+1))/(1-a).
    This is vLLM's "mean acceptance length". With decay < 1 the conditional acceptance falls
    with the position (alpha * decay^i), as drafts reused deeper (MTP, EAGLE) tend to."""
    if decay == 1.0:
        if alpha >= 1.0:
            return k + 1.0
        return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)
    return sum(_survival(alpha, j, decay) for j in range(1, k + 2))


def tokens_variance(alpha: float, k: int, decay: float = 1.0) -> float:
    """Var of tokens per step X, from P(X >= j), j = 1..k+1."""
    ex2 = sum((2 * j - 1) * _survival(alpha, j, decay) for j in range(1, k + 2))
    return max(0.0, ex2 - expected_tokens(alpha, k, decay) ** 2)


def position_decay(s: Setup) -> float:
    """The profile's per-position acceptance decay for this method (1.0 = i.i.d.)."""
    return s.profile.cost(s.method).position_decay if s.method != "baseline" else 1.0


def cycle_ms(s: Setup, batch: float, context: float, k: int) -> float:
    return draft_ms(s, batch, context, k) + verify_step_ms(s, batch, context, k)


def decode_tpot_ms(
    s: Setup, batch: float, context: float, alpha: float, k: int
) -> tuple[float, float]:
    """(baseline, speculative) time per output token of each sequence, decode only."""
    e = expected_tokens(alpha, k, position_decay(s))
    return baseline_step_ms(s, batch, context), cycle_ms(s, batch, context, k) / e


def decode_speedup(s: Setup, batch: float, context: float, alpha: float, k: int) -> float:
    base, spec = decode_tpot_ms(s, batch, context, alpha, k)
    return base / spec


def prefill_compute_ms(s: Setup, model: ModelSpec, prompts: float, prompt_tokens: float) -> float:
    """FLOP time of prefilling `prompts` prompts of `prompt_tokens` each (causal attention)."""
    w = model.streamed_params()
    attn = 2 * model.layers * model.heads * model.head_dim * prompt_tokens**2
    flops = prompts * (2 * w * prompt_tokens + attn)
    return flops / peak_flops_per_ms(s, model, s.profile.prefill_efficiency)


def prefill_ms(s: Setup, model: ModelSpec, prompts: float, prompt_tokens: float) -> float:
    """Chunked prefill of a batch that arrived together: each chunk reads the weights once."""
    chunks = max(1, math.ceil(prompts * prompt_tokens / s.profile.prefill_chunk_tokens))
    weights = chunks * model.streamed_params() * model.dtype_bytes / bandwidth_bytes_per_ms(s)
    over = chunks * s.profile.cost("baseline").step_overhead_ms
    return over + max(prefill_compute_ms(s, model, prompts, prompt_tokens), weights)


def spec_prefill_ms(s: Setup, prompts: float, prompt_tokens: float) -> float:
    """Speculative engines prefill the draft (or head) as well; ngram/suffix do not."""
    t = prefill_ms(s, s.target, prompts, prompt_tokens)
    if s.draft is not None:
        t += prefill_compute_ms(s, s.draft, prompts, prompt_tokens)
    return t


@dataclass(frozen=True)
class BatchResult:
    """B requests arriving together, each P prompt and O output tokens."""

    k: int
    mean_acceptance_length: float
    ttft_ms_baseline: float
    ttft_ms_speculative: float
    tpot_ms_baseline: float
    tpot_ms_speculative: float
    makespan_ms_baseline: float
    makespan_ms_speculative: float
    latency_ms_baseline: float  # mean request latency (no straggler spread)
    latency_ms_speculative: float
    output_tokens_total: float

    @property
    def tokens_per_s_baseline(self) -> float:
        return self.output_tokens_total / self.makespan_ms_baseline * 1e3

    @property
    def tokens_per_s_speculative(self) -> float:
        return self.output_tokens_total / self.makespan_ms_speculative * 1e3

    @property
    def speedup(self) -> float:
        return self.makespan_ms_baseline / self.makespan_ms_speculative

    @property
    def e2e_latency_speedup(self) -> float:
        return self.latency_ms_baseline / self.latency_ms_speculative

    @property
    def decode_speedup(self) -> float:
        return self.tpot_ms_baseline / self.tpot_ms_speculative


def _expected_max_normal(n: int) -> float:
    """Expected maximum of n standard normals (Blom's approximation)."""
    if n <= 1:
        return 0.0
    return NormalDist().inv_cdf((n - 0.375) / (n + 0.25))


def simulate_batch(
    s: Setup,
    alpha: float,
    k: int,
    batch: int,
    prompt_tokens: int,
    output_tokens: int,
    running: tuple[int, int] | None = None,
) -> BatchResult:
    """`running` = (baseline, speculative) sequences the KV cache holds at once (see
    memory.max_running); when fewer than `batch`, the rest wait and decode runs in waves."""
    context = prompt_tokens + output_tokens / 2
    r_b, r_s = (max(1, min(batch, r)) for r in (running or (batch, batch)))
    base_tpot = baseline_step_ms(s, r_b, context)
    decay = position_decay(s)
    spec_tpot = cycle_ms(s, r_s, context, k) / expected_tokens(alpha, k, decay)
    waves_b, waves_s = batch / r_b, batch / r_s
    ttft_b = prefill_ms(s, s.target, batch, prompt_tokens)
    ttft_s = spec_prefill_ms(s, batch, prompt_tokens)
    e = expected_tokens(alpha, k, decay)
    spread = math.sqrt(output_tokens * tokens_variance(alpha, k, decay) / e**3)
    straggler = spread * _expected_max_normal(r_s) * spec_tpot * e
    decode_b, decode_s = output_tokens * base_tpot, output_tokens * spec_tpot
    return BatchResult(
        k=k,
        mean_acceptance_length=e,
        ttft_ms_baseline=ttft_b,
        ttft_ms_speculative=ttft_s,
        tpot_ms_baseline=base_tpot,
        tpot_ms_speculative=spec_tpot,
        makespan_ms_baseline=ttft_b + waves_b * decode_b,
        makespan_ms_speculative=ttft_s + waves_s * (decode_s + straggler),
        latency_ms_baseline=ttft_b + (waves_b + 1) / 2 * decode_b,
        latency_ms_speculative=ttft_s + (waves_s + 1) / 2 * decode_s,
        output_tokens_total=float(batch * output_tokens),
    )


def best_k(
    s: Setup,
    alpha: float,
    batch: int,
    prompt_tokens: int,
    output_tokens: int,
    k_max: int = K_MAX,
    running: tuple[int, int] | None = None,
) -> int:
    """The k (num_speculative_tokens) that maximises the batch's predicted speedup."""
    return max(
        range(1, k_max + 1),
        key=lambda k: (
            simulate_batch(s, alpha, k, batch, prompt_tokens, output_tokens, running).speedup
        ),
    )


@dataclass(frozen=True)
class SteadyState:
    """Continuous batching at a fixed concurrency: per-request latency and the GPU's goodput."""

    ttft_ms: float
    tpot_ms: float  # per output token per sequence, others' prefills included
    e2e_ms: float
    tokens_per_s: float


def steady_state(
    s: Setup,
    concurrency: float,
    prompt_tokens: float,
    output_tokens: float,
    alpha: float | None = None,
    k: int | None = None,
) -> SteadyState:
    """Baseline when alpha is None, else speculative with k tokens."""
    c = max(1.0, concurrency)
    o = max(1.0, output_tokens)
    context = prompt_tokens + o / 2
    if alpha is None or k is None:
        step, per_iter = baseline_step_ms(s, c, context), 1.0
        one_prefill = prefill_compute_ms(s, s.target, 1, prompt_tokens)
    else:
        step = cycle_ms(s, c, context, k)
        per_iter = expected_tokens(alpha, k, position_decay(s))
        one_prefill = prefill_compute_ms(s, s.target, 1, prompt_tokens)
        if s.draft is not None:
            one_prefill += prefill_compute_ms(s, s.draft, 1, prompt_tokens)
    # Each iteration finishes c*per_iter/o requests on average; their replacements' prefills
    # ride along in the same iterations (chunked prefill).
    iteration = step + (c - 1) * per_iter / o * one_prefill
    tpot = iteration / per_iter
    ttft = one_prefill + step + s.profile.cost("baseline").step_overhead_ms
    e2e = ttft + o * tpot
    return SteadyState(ttft_ms=ttft, tpot_ms=tpot, e2e_ms=e2e, tokens_per_s=c / tpot * 1e3)


def request_latency_s(
    deployment: Deployment | Setup,
    prompt_tokens: float,
    output_tokens: float,
    batch: float = 1.0,
    profile: Profile | None = None,
    catalog: Catalog | None = None,
) -> tuple[float, float]:
    """(TTFT, end-to-end) seconds of one baseline request among `batch` in flight. Segmentation
    uses it to estimate concurrency from arrivals alone (Little's law)."""
    s = deployment if isinstance(deployment, Setup) else resolve(deployment, profile, catalog)
    st = steady_state(s, batch, prompt_tokens, output_tokens)
    return st.ttft_ms / 1e3, st.e2e_ms / 1e3


def estimate_concurrency(
    s: Setup, arrivals_per_s: float, prompt_tokens: float, output_tokens: float
) -> float:
    """Fixed point of C = rate * e2e(C) (Little's law); capped at 4096 when the load diverges."""
    c = 1.0
    for _ in range(100):
        nxt = max(
            1.0, arrivals_per_s * steady_state(s, c, prompt_tokens, output_tokens).e2e_ms / 1e3
        )
        if nxt > 4096:
            return 4096.0
        if abs(nxt - c) < 1e-3 * c:
            return nxt
        c = 0.5 * (c + nxt)
    return c


def best_k_steady(
    s: Setup, alpha: float, concurrency: float, prompt_tokens: float, output_tokens: float,
    k_max: int = K_MAX,
) -> int:  # fmt: skip
    """The k that minimises a request's end-to-end latency at a steady concurrency."""
    return min(
        range(1, k_max + 1),
        key=lambda k: steady_state(s, concurrency, prompt_tokens, output_tokens, alpha, k).e2e_ms,
    )
