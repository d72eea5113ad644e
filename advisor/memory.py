"""Memory fit: do target + draft weights and both KV caches fit at the load asked for?

budget        = gpu memory * gpu_memory_utilization * tp          (what vLLM may allocate)
kv_available  = budget - target weights - draft weights - runtime reserve * tp
kv_needed     = concurrency * context * (target KV/token + draft KV/token)
headroom      = kv_available - kv_needed; fits when headroom >= 0
A draft that pushes the KV cache below what the load needs makes vLLM preempt requests, which
costs more than speculation saves; hence "disable" when it does not fit.
"""

from __future__ import annotations

from advisor.perf import Setup
from advisor.schemas import MemoryFit

GB = 1e9


def memory_fit(
    s: Setup, concurrency: float, context_tokens: float, speculative: bool = True
) -> MemoryFit:
    """Fit at `concurrency` sequences of `context_tokens` each (prompt + output, e.g. p95s)."""
    budget = s.gpu.memory_gb * s.gpu_memory_utilization * s.tp
    target_gb = s.target.weight_bytes() / GB
    draft = s.draft if speculative else None
    draft_gb = draft.weight_bytes() / GB if draft is not None else 0.0
    kv_per_token = s.target.kv_bytes_per_token() + (
        draft.kv_bytes_per_token() if draft is not None else 0.0
    )
    kv_needed = max(1.0, concurrency) * context_tokens * kv_per_token / GB
    kv_available = budget - target_gb - draft_gb - s.profile.runtime_reserve_gb * s.tp
    headroom = kv_available - kv_needed
    return MemoryFit(
        gpu_memory_gb=s.gpu.memory_gb * s.tp,
        budget_gb=round(budget, 3),
        target_weights_gb=round(target_gb, 3),
        draft_weights_gb=round(draft_gb, 3),
        kv_needed_gb=round(kv_needed, 3),
        kv_available_gb=round(kv_available, 3),
        headroom_gb=round(headroom, 3),
        fits=headroom >= 0,
    )


def max_running(s: Setup, context_tokens: float, speculative: bool = True) -> int:
    """How many sequences of `context_tokens` the KV cache holds at once (vLLM admits no more;
    the rest wait), for the baseline or the speculative engine."""
    fit = memory_fit(s, 1, context_tokens, speculative)
    draft = s.draft if speculative else None
    per_seq = context_tokens * (
        s.target.kv_bytes_per_token() + (draft.kv_bytes_per_token() if draft is not None else 0.0)
    )
    return max(0, int(fit.kv_available_gb * GB / per_seq)) if per_seq > 0 else 1 << 30
