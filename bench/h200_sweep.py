"""Step-cost sweep of vLLM 0.26.0 on one H200: baseline, EAGLE-3 and draft-model speculation.

Why: the advisor's performance model needs measured step costs, not datasheet guesses. Weights
are dummies (`load_format="dummy"`) because speed depends on shapes alone, and acceptance is set
with vLLM's synthetic rejection sampler (`synthetic_acceptance_rates = [a, a^2, ...]`), so each
point measures the real cost of drafting and verifying at a known acceptance. The spec-decode
counters are read around every point to confirm the acceptance that was actually realised.

One engine process per configuration (method, k, target); every (batch, prompt, output) point of
that configuration runs inside it. Acceptance is changed between points of one engine through
`LLM.collective_rpc` (it only rewrites the rejection sampler's rate tensor), which saves an
engine start per acceptance value.

Engine settings (same for every configuration, recorded in each record):
- torch.compile off, CUDA graphs on for decode (`cudagraph_mode=FULL_DECODE_ONLY`): decode and
  verify steps replay full CUDA graphs as in a default deployment, while start-up takes seconds
  instead of the 60-100 s of Inductor compilation per configuration. Prefill runs eagerly
  (compute-bound; a few percent slower than with Inductor).
- prefix caching off (every prompt is fresh random token ids anyway), greedy sampling, ignore_eos.

Run on the H200 (see ../shared/GPU.md section A):
  PYTHONPATH=/tmp/site VLLM_USE_FLASHINFER_SAMPLER=0 python3 bench/h200_sweep.py --out DIR
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
import zlib
from pathlib import Path
from typing import Any

# --- Real architectures' shapes (Hugging Face config.json of each model). ---
# meta-llama/Llama-3.1-8B config.json
LLAMA_8B: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "vocab_size": 128256,
    "max_position_embeddings": 131072,
    "rope_theta": 500000.0,
    "rms_norm_eps": 1e-5,
    "hidden_act": "silu",
    "tie_word_embeddings": False,
    "bos_token_id": 128000,
    "eos_token_id": 128001,
    "torch_dtype": "bfloat16",
}
# meta-llama/Llama-3.2-1B config.json
LLAMA_1B: dict[str, Any] = {
    **LLAMA_8B,
    "hidden_size": 2048,
    "intermediate_size": 8192,
    "num_hidden_layers": 16,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 64,
    "tie_word_embeddings": True,
}
# Qwen/Qwen2.5-14B config.json (48 layers, GQA 40/8, 14.7B parameters per the model card)
QWEN_14B: dict[str, Any] = {
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "hidden_size": 5120,
    "intermediate_size": 13824,
    "num_hidden_layers": 48,
    "num_attention_heads": 40,
    "num_key_value_heads": 8,
    "vocab_size": 152064,
    "max_position_embeddings": 131072,
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-6,
    "hidden_act": "silu",
    "tie_word_embeddings": False,
    "use_sliding_window": False,
    "bos_token_id": 151643,
    "eos_token_id": 151643,
    "torch_dtype": "bfloat16",
}


def eagle3_head(target: dict[str, Any]) -> dict[str, Any]:
    """An EAGLE-3 head for `target`: one Llama decoder layer at the target's width.

    Shape as in yuhuili/EAGLE3-LLaMA3.1-Instruct-8B (1 layer, target hidden size, 32k draft
    vocabulary mapped onto the target's vocabulary).
    """
    return {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "hidden_size": target["hidden_size"],
        "intermediate_size": target["intermediate_size"],
        "num_hidden_layers": 1,
        "num_attention_heads": target["num_attention_heads"],
        "num_key_value_heads": target["num_key_value_heads"],
        "head_dim": target["hidden_size"] // target["num_attention_heads"],
        "vocab_size": target["vocab_size"],
        "draft_vocab_size": 32000,
        "max_position_embeddings": target["max_position_embeddings"],
        "rope_theta": target["rope_theta"],
        "rms_norm_eps": target["rms_norm_eps"],
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "bos_token_id": target["bos_token_id"],
        "eos_token_id": target["eos_token_id"],
        "torch_dtype": "bfloat16",
    }


MODELS: dict[str, dict[str, Any]] = {
    "llama-3.1-8b": LLAMA_8B,
    "llama-3.2-1b": LLAMA_1B,
    "qwen2.5-14b": QWEN_14B,
    "eagle3-llama-3.1-8b": eagle3_head(LLAMA_8B),
    "eagle3-qwen2.5-14b": eagle3_head(QWEN_14B),
}

# --- The grid. (batch, prompt tokens, output tokens). ---
FULL: list[tuple[int, int, int]] = [
    (1, 1024, 128),
    (4, 1024, 128),
    (16, 1024, 128),
    (64, 1024, 128),
    (128, 128, 128),
    (1, 128, 128),
    (1, 4096, 128),
    (1, 8192, 128),
    (16, 128, 128),
    (16, 4096, 128),
    (16, 8192, 128),
    (64, 4096, 128),
    (1, 1024, 512),
    (16, 1024, 512),
]
SUBSET: list[tuple[int, int, int]] = [
    (1, 1024, 128),
    (16, 1024, 128),
    (64, 1024, 128),
    (128, 128, 128),
    (16, 4096, 128),
    (1, 1024, 512),
]


def cfg(
    name: str,
    target: str,
    method: str = "baseline",
    k: int = 0,
    plan: list[tuple[float, str]] | None = None,
) -> dict[str, Any]:
    """One engine configuration: `plan` lists (acceptance, grid name) in the order they run."""
    return {"name": name, "target": target, "method": method, "k": k, "plan": plan or []}


CONFIGS: list[dict[str, Any]] = [
    cfg("llama8b-base", "llama-3.1-8b", plan=[(0.0, "FULL")]),
    cfg(
        "llama8b-eagle3-k3",
        "llama-3.1-8b",
        "eagle3",
        3,
        [(0.8, "FULL"), (0.6, "SUBSET"), (0.9, "SUBSET"), (0.4, "SUBSET")],
    ),
    cfg("llama8b-draft-k3", "llama-3.1-8b", "draft_model", 3, [(0.8, "FULL"), (0.6, "SUBSET")]),
    cfg("qwen14b-base", "qwen2.5-14b", plan=[(0.0, "FULL")]),
    cfg("qwen14b-eagle3-k3", "qwen2.5-14b", "eagle3", 3, [(0.8, "FULL"), (0.6, "SUBSET")]),
    cfg("llama8b-eagle3-k1", "llama-3.1-8b", "eagle3", 1, [(0.8, "FULL"), (0.6, "SUBSET")]),
    cfg("llama8b-eagle3-k5", "llama-3.1-8b", "eagle3", 5, [(0.8, "FULL"), (0.9, "SUBSET")]),
    cfg("llama8b-eagle3-k2", "llama-3.1-8b", "eagle3", 2, [(0.8, "SUBSET"), (0.9, "SUBSET")]),
    cfg("llama8b-eagle3-k4", "llama-3.1-8b", "eagle3", 4, [(0.8, "SUBSET"), (0.6, "SUBSET")]),
    cfg("llama8b-draft-k1", "llama-3.1-8b", "draft_model", 1, [(0.8, "SUBSET")]),
    cfg("llama8b-draft-k5", "llama-3.1-8b", "draft_model", 5, [(0.8, "SUBSET")]),
]

MAX_NUM_SEQS = 128
MAX_MODEL_LEN = 9216
MAX_NUM_BATCHED_TOKENS = 16384
GPU_MEMORY_UTILIZATION = 0.90
CAPTURE_BATCHES = [1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128]


def rates(a: float, k: int) -> list[float]:
    """Unconditional per-position acceptance [a, a^2, ..., a^k] (a per-token acceptance a)."""
    return [round(a ** (i + 1), 6) for i in range(k)]


def write_models(root: Path) -> dict[str, str]:
    """Write every model's config.json under `root`; return name -> directory."""
    dirs = {}
    for name, conf in MODELS.items():
        d = root / name
        d.mkdir(parents=True, exist_ok=True)
        (d / "config.json").write_text(json.dumps(conf, indent=1))
        dirs[name] = str(d)
    return dirs


def engine_kwargs(c: dict[str, Any], dirs: dict[str, str]) -> dict[str, Any]:
    """Keyword arguments for `vllm.LLM` for one configuration."""
    k = c["k"]
    kw: dict[str, Any] = {
        "model": dirs[c["target"]],
        "load_format": "dummy",
        "skip_tokenizer_init": True,
        "dtype": "bfloat16",
        "max_model_len": MAX_MODEL_LEN,
        "max_num_seqs": MAX_NUM_SEQS,
        "max_num_batched_tokens": MAX_NUM_BATCHED_TOKENS,
        "gpu_memory_utilization": GPU_MEMORY_UTILIZATION,
        "enable_prefix_caching": False,
        "disable_log_stats": False,
        "seed": 0,
        "compilation_config": {
            "mode": 0,
            "cudagraph_mode": "FULL_DECODE_ONLY",
            "cudagraph_capture_sizes": sorted({b * (k + 1) for b in CAPTURE_BATCHES}),
        },
    }
    if c["method"] != "baseline":
        first_a = c["plan"][0][0]
        draft = {"eagle3": f"eagle3-{c['target']}", "draft_model": "llama-3.2-1b"}[c["method"]]
        kw["speculative_config"] = {
            "method": c["method"],
            "model": dirs[draft],
            "num_speculative_tokens": k,
            "rejection_sample_method": "synthetic",
            "synthetic_acceptance_rates": rates(first_a, k),
        }
    return kw


def _set_rates(worker: Any, conditional: list[float]) -> list[float]:
    """Runs inside each worker: overwrite the synthetic rejection sampler's conditional rates."""
    import torch

    t = worker.model_runner.rejection_sampler.synthetic_conditional_rates
    t.copy_(torch.tensor(conditional, dtype=t.dtype, device=t.device))
    torch.cuda.synchronize()
    return t.tolist()


def spec_counters(llm: Any) -> dict[str, Any]:
    """Sum of vLLM's spec-decode counters (all engines)."""
    out: dict[str, Any] = {"drafts": 0, "draft_tokens": 0, "accepted": 0, "per_pos": []}
    names = {
        "vllm:spec_decode_num_drafts": "drafts",
        "vllm:spec_decode_num_draft_tokens": "draft_tokens",
        "vllm:spec_decode_num_accepted_tokens": "accepted",
    }
    for m in llm.get_metrics():
        name = m.name.removesuffix("_total")
        if name in names:
            out[names[name]] += int(m.value)
        elif name == "vllm:spec_decode_num_accepted_tokens_per_pos":
            vals = list(m.values)
            pp = out["per_pos"]
            out["per_pos"] = [
                (pp[i] if i < len(pp) else 0) + (vals[i] if i < len(vals) else 0)
                for i in range(max(len(pp), len(vals)))
            ]
    return out


def _median(xs: list[float]) -> float | None:
    xs = sorted(x for x in xs if x is not None)
    if not xs:
        return None
    n = len(xs)
    return xs[n // 2] if n % 2 else 0.5 * (xs[n // 2 - 1] + xs[n // 2])


def run_child(spec: dict[str, Any]) -> None:
    """One engine: start it, warm each batch shape, time every point of its plan."""
    os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
    import torch
    import vllm
    from vllm import LLM, SamplingParams

    c, dirs, out, deadline = spec["config"], spec["dirs"], Path(spec["out"]), spec["deadline"]
    common = {
        "config": c["name"],
        "target": c["target"],
        "method": c["method"],
        "k": c["k"],
        "draft": {"eagle3": f"eagle3-{c['target']}", "draft_model": "llama-3.2-1b"}.get(
            c["method"]
        ),
        "vllm_version": vllm.__version__,
        "gpu": torch.cuda.get_device_name(0),
    }

    def emit(rec: dict[str, Any]) -> None:
        with (out / "h200_sweep.jsonl").open("a") as f:
            f.write(json.dumps({**common, **rec}) + "\n")
        print(json.dumps({**common, **rec}), flush=True)

    kw = engine_kwargs(c, dirs)
    t0 = time.perf_counter()
    try:
        llm = LLM(**kw)
    except Exception as e:  # the record says why this configuration is missing
        emit({"type": "error", "where": "engine start", "error": repr(e)[-800:]})
        raise
    startup = time.perf_counter() - t0
    cc = llm.llm_engine.vllm_config.cache_config
    kv_tokens = (cc.num_gpu_blocks or 0) * cc.block_size
    emit(
        {
            "type": "engine",
            "startup_s": round(startup, 2),
            "kv_capacity_tokens": kv_tokens,
            "engine_kwargs": {k: v for k, v in kw.items() if k not in ("model",)},
        }
    )
    rng = random.Random(zlib.crc32(c["name"].encode()))
    vocab = MODELS[c["target"]]["vocab_size"]

    def prompts(b: int, p: int) -> list[dict[str, list[int]]]:
        return [
            {"prompt_token_ids": [rng.randrange(100, vocab - 100) for _ in range(p)]}
            for _ in range(b)
        ]

    def generate(b: int, p: int, o: int) -> tuple[float, list[Any]]:
        sp = SamplingParams(
            max_tokens=o, min_tokens=o, ignore_eos=True, temperature=0.0, detokenize=False
        )
        ps = prompts(b, p)
        torch.cuda.synchronize()
        t = time.perf_counter()
        res = llm.generate(ps, sp, use_tqdm=False)
        return time.perf_counter() - t, res

    warmed: set[int] = set()
    for a, grid_name in c["plan"]:
        if c["method"] != "baseline":
            unc = rates(a, c["k"])
            cond = [r / q if q > 0 else 0.0 for r, q in zip(unc, [1.0, *unc[:-1]], strict=True)]
            try:
                llm.collective_rpc(_set_rates, args=(cond,))
            except Exception as e:  # record it and move to the next engine
                emit({"type": "error", "where": f"set acceptance {a}", "error": repr(e)[:500]})
                break
        for b, p, o in {"FULL": FULL, "SUBSET": SUBSET}[grid_name]:
            if time.time() > deadline - 8:
                emit({"type": "skipped", "reason": "deadline", "acceptance_set": a})
                return
            need = b * (p + o + c["k"] + 16)
            if kv_tokens and need > 0.95 * kv_tokens:
                emit({"type": "skipped", "reason": "kv capacity", "batch": b, "prompt_tokens": p})
                continue
            if b not in warmed:
                generate(b, 128, 16)
                warmed.add(b)
            before = spec_counters(llm)
            wall, res = generate(b, p, o)
            after = spec_counters(llm)
            n_out = sum(len(r.outputs[0].token_ids) for r in res)
            tpots, ttfts, firsts, lasts = [], [], [], []
            for r in res:
                m = r.metrics
                if m is None or not getattr(m, "first_token_ts", 0):
                    continue
                n = len(r.outputs[0].token_ids)
                firsts.append(m.first_token_ts)
                lasts.append(m.last_token_ts)
                ttfts.append(m.first_token_latency)
                if n > 1:
                    tpots.append((m.last_token_ts - m.first_token_ts) / (n - 1))
            d = {key: after[key] - before[key] for key in ("drafts", "draft_tokens", "accepted")}
            per_pos = [
                x - (before["per_pos"][i] if i < len(before["per_pos"]) else 0)
                for i, x in enumerate(after["per_pos"])
            ]
            decode_s = (max(lasts) - min(firsts)) if firsts else None
            emit(
                {
                    "type": "point",
                    "acceptance_set": a if c["method"] != "baseline" else None,
                    "acceptance_rates": rates(a, c["k"]) if c["method"] != "baseline" else None,
                    "batch": b,
                    "prompt_tokens": p,
                    "output_tokens": o,
                    "output_tokens_total": n_out,
                    "wall_s": round(wall, 5),
                    "output_tokens_per_s": round(n_out / wall, 3),
                    "total_tokens_per_s": round((n_out + b * p) / wall, 3),
                    "ttft_s_median": _median(ttfts),
                    "ttft_s_max": max(ttfts) if ttfts else None,
                    "tpot_ms_median": (_median(tpots) or 0.0) * 1e3 if tpots else None,
                    "decode_s": decode_s,
                    "num_drafts": d["drafts"],
                    "num_draft_tokens": d["draft_tokens"],
                    "num_accepted_tokens": d["accepted"],
                    "accepted_per_pos": per_pos,
                    "acceptance_measured": (
                        d["accepted"] / d["draft_tokens"] if d["draft_tokens"] else None
                    ),
                    "mean_acceptance_length": (
                        1 + d["accepted"] / d["drafts"] if d["drafts"] else None
                    ),
                    "ts": time.time(),
                }
            )


def wait_gpu_free(limit_s: float = 30.0) -> None:
    """Wait until the last engine's processes have released the GPU memory."""
    t = time.time()
    while time.time() - t < limit_s:
        r = subprocess.run(
            ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            check=False,
        )
        try:
            if float(r.stdout.split()[0]) < 2000:
                return
        except (IndexError, ValueError):
            return
        time.sleep(1)


def main() -> None:
    """Driver: one subprocess per configuration, each bounded by the remaining time."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="folder for h200_sweep.jsonl and the meta file")
    ap.add_argument("--configs", default="", help="comma-separated config names (default: all)")
    ap.add_argument("--budget-s", type=float, default=540.0, help="stop starting work after this")
    ap.add_argument("--min-engine-s", type=float, default=45.0, help="no new engine below this")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        run_child(json.loads(Path(args.child).read_text()))
        return
    start = time.time()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    dirs = write_models(Path("/tmp/sweep-models"))
    wanted = [n for n in args.configs.split(",") if n]
    todo = [c for c in CONFIGS if not wanted or c["name"] in wanted]
    meta = {
        "command": " ".join([sys.executable, *sys.argv]),
        "env": {k: os.environ.get(k) for k in ("PYTHONPATH", "VLLM_USE_FLASHINFER_SAMPLER")},
        "started": start,
        "configs": todo,
        "models": MODELS,
        "grids": {"FULL": FULL, "SUBSET": SUBSET},
    }
    gpu = subprocess.run(
        ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
        capture_output=True,
        text=True,
        check=False,
    )
    meta["nvidia_smi"] = gpu.stdout.strip()
    (out / f"meta-{int(start)}.json").write_text(json.dumps(meta, indent=1))
    for c in todo:
        left = args.budget_s - (time.time() - start)
        if left < args.min_engine_s:
            print(f"[sweep] no time left for {c['name']} ({left:.0f}s)", flush=True)
            continue
        spec = out / f"spec-{c['name']}.json"
        spec.write_text(
            json.dumps(
                {"config": c, "dirs": dirs, "out": str(out), "deadline": start + args.budget_s}
            )
        )
        print(f"[sweep] {c['name']} start, {left:.0f}s left", flush=True)
        t = time.time()
        try:
            rc = subprocess.run(
                [sys.executable, __file__, "--out", str(out), "--child", str(spec)],
                timeout=left + 20,
                check=False,
            ).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
        spec.unlink()
        wait_gpu_free()
        print(f"[sweep] {c['name']} done rc={rc} in {time.time() - t:.0f}s", flush=True)


if __name__ == "__main__":
    main()
