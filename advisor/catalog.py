"""Catalogues of GPUs and models: the datasheet and config.json facts the roofline runs on.

Built-in entries live in advisor/data/{gpus,models}.json, each with a `source` naming the datasheet
or HF config it was copied from. A user adds or overrides entries with their own JSON file
(`{"gpus": {...}, "models": {...}}`) passed as `catalog=` / `--catalog`, or named by the
ADVISOR_CATALOG environment variable. A target or draft may also be a local HF config.json path;
its parameter count is computed from the shapes.
"""

from __future__ import annotations

import json
import os
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ValidationError

from advisor.errors import BadInput

ModelKind = Literal["target", "eagle", "eagle3", "mtp"]

# dtype names in HF configs -> bytes per weight (and per KV element: vLLM's default kv dtype is
# the model dtype).
_DTYPE_BYTES = {
    "float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2,
    "float8_e4m3fn": 1, "fp8": 1, "float8": 1,
}  # fmt: skip

# HF architectures that are speculative heads rather than full models (vLLM's names).
_HEAD_ARCHITECTURES: dict[str, ModelKind] = {
    "LlamaForCausalLMEagle3": "eagle3",
    "Eagle3LlamaForCausalLM": "eagle3",
    "Eagle3Qwen2ForCausalLM": "eagle3",
    "EagleLlamaForCausalLM": "eagle",
    "LlamaForCausalLMEagle": "eagle",
    "EagleQwen2ForCausalLM": "eagle",
}


class GPU(BaseModel):
    """One accelerator, per device (tensor parallelism multiplies these)."""

    name: str
    display_name: str = ""
    memory_gb: float
    hbm_bandwidth_gbs: float
    bf16_tflops: float
    fp8_tflops: float | None = None
    source: str

    def peak_flops(self, dtype_bytes: int) -> float:
        """Dense peak FLOP/s for the weights' dtype (FP8 falls back to BF16 where unsupported)."""
        if dtype_bytes <= 1 and self.fp8_tflops:
            return self.fp8_tflops * 1e12
        return self.bf16_tflops * 1e12


class ModelSpec(BaseModel):
    """A model's shapes. Heads (eagle/eagle3/mtp) share the target's embeddings (vLLM does)."""

    name: str
    kind: ModelKind = "target"
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    draft_vocab: int | None = None
    tied_embeddings: bool = False
    qkv_bias: bool = False
    dtype_bytes: int = 2
    params: float | None = None  # given explicitly, or computed from the shapes
    for_target: str | None = None
    source: str

    def _attention_in(self) -> int:
        # EAGLE-3's decoder layer attends over [embedding ; fused hidden state] = 2h inputs.
        return 2 * self.hidden if self.kind == "eagle3" else self.hidden

    def layer_params(self) -> float:
        """Weights of one decoder layer (attention + gated MLP + norms)."""
        q = self.heads * self.head_dim
        kv = self.kv_heads * self.head_dim
        attn = self._attention_in() * (q + 2 * kv) + q * self.hidden
        if self.qkv_bias:
            attn += q + 2 * kv
        mlp = 3 * self.hidden * self.intermediate
        return attn + mlp + 2 * self.hidden

    def head_extra_params(self) -> float:
        """A head's fusion projection (EAGLE fc 2h->h, EAGLE-3 3h->h, MTP 2h->h)."""
        if self.kind == "eagle3":
            return 3 * self.hidden * self.hidden
        if self.kind in ("eagle", "mtp"):
            return 2 * self.hidden * self.hidden
        return 0.0

    def own_lm_head_params(self) -> float:
        """Output head this model stores itself (EAGLE-3 has a reduced-vocab head of its own)."""
        if self.kind == "eagle3":
            return (self.draft_vocab or self.vocab) * self.hidden
        if self.kind in ("eagle", "mtp"):
            return 0.0
        return 0.0 if self.tied_embeddings else self.vocab * self.hidden

    def total_params(self) -> float:
        """Parameters held in GPU memory (what the weights cost)."""
        if self.params is not None:
            return self.params
        embed = self.vocab * self.hidden if self.kind == "target" else 0.0
        return (
            self.layers * self.layer_params()
            + self.head_extra_params()
            + embed
            + self.own_lm_head_params()
            + self.hidden
        )

    def lm_head_params(self) -> float:
        """Output projection run once per generated position (shared ones included)."""
        if self.kind == "eagle3":
            return (self.draft_vocab or self.vocab) * self.hidden
        return self.vocab * self.hidden

    def streamed_params(self) -> float:
        """Weights read from HBM per forward step: the input embedding is a row gather, not a
        full read, while an output head (own or shared with the target) is read in full."""
        body = self.layers * self.layer_params() + self.head_extra_params()
        return body + self.lm_head_params()

    def weight_bytes(self) -> float:
        return self.total_params() * self.dtype_bytes

    def kv_bytes_per_token(self) -> float:
        """K and V for every layer for one token."""
        return 2 * self.layers * self.kv_heads * self.head_dim * self.dtype_bytes

    def attention_flops_per_token(self, context: float) -> float:
        """QK^T and PV for one query token over `context` cached tokens, all layers."""
        return 4 * self.layers * self.heads * self.head_dim * context


class Catalog(BaseModel):
    gpus: dict[str, GPU]
    models: dict[str, ModelSpec]


def _read_builtin(name: str) -> dict[str, Any]:
    return json.loads(resources.files("advisor").joinpath("data", name).read_text())


def _entries(kind: str, raw: dict[str, Any], where: str) -> dict[str, Any]:
    cls = GPU if kind == "gpus" else ModelSpec
    out: dict[str, Any] = {}
    for name, fields in raw.items():
        if not isinstance(fields, dict):
            raise BadInput(f"{where}: {kind}.{name} must be an object of fields.")
        try:
            out[name.lower()] = cls(name=name.lower(), **{k: v for k, v in fields.items()})
        except ValidationError as exc:
            first = exc.errors()[0]
            loc = ".".join(str(p) for p in first["loc"])
            raise BadInput(f"{where}: {kind}.{name}.{loc}: {first['msg']}.") from None
    return out


@cache
def _builtin() -> Catalog:
    return Catalog(
        gpus=_entries("gpus", _read_builtin("gpus.json"), "advisor/data/gpus.json"),
        models=_entries("models", _read_builtin("models.json"), "advisor/data/models.json"),
    )


def load_catalog(path: str | Path | None = None) -> Catalog:
    """Built-in catalogue, extended/overridden by ADVISOR_CATALOG and then by `path`."""
    base = _builtin()
    gpus, models = dict(base.gpus), dict(base.models)
    for extra in (os.environ.get("ADVISOR_CATALOG"), path):
        if not extra:
            continue
        p = Path(extra)
        try:
            raw = json.loads(p.read_text())
        except FileNotFoundError:
            raise BadInput(f"catalogue file {p} does not exist.") from None
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise BadInput(f"catalogue file {p} is not valid JSON ({exc}).") from None
        if not isinstance(raw, dict) or not set(raw) <= {"gpus", "models"}:
            raise BadInput(f'catalogue file {p} must be an object with "gpus" and/or "models".')
        gpus.update(_entries("gpus", raw.get("gpus", {}), str(p)))
        models.update(_entries("models", raw.get("models", {}), str(p)))
    return Catalog(gpus=gpus, models=models)


def get_gpu(name: str, catalog: Catalog | None = None) -> GPU:
    cat = catalog or load_catalog()
    gpu = cat.gpus.get(name.lower())
    if gpu is None:
        raise BadInput(f"unknown GPU {name!r}; known GPUs: {', '.join(sorted(cat.gpus))}.")
    return gpu


def _looks_like_path(name: str) -> bool:
    return name.endswith(".json") or os.sep in name or Path(name).is_dir()


def get_model(name: str, catalog: Catalog | None = None) -> ModelSpec:
    """A catalogue model by name, or a local HF config.json (or a folder holding one)."""
    cat = catalog or load_catalog()
    spec = cat.models.get(name.lower())
    if spec is not None:
        return spec
    if _looks_like_path(name) and Path(name).exists():
        return model_from_hf_config(name)
    raise BadInput(
        f"unknown model {name!r} (not a catalogue name, not an existing local config.json); "
        f"known models: {', '.join(sorted(cat.models))}."
    )


def model_from_hf_config(path: str | Path) -> ModelSpec:
    """Shapes from a Hugging Face config.json; the parameter count is computed from them."""
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    try:
        raw = json.loads(p.read_text())
    except FileNotFoundError:
        raise BadInput(f"model config {p} does not exist.") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BadInput(f"model config {p} is not valid JSON ({exc}).") from None
    if not isinstance(raw, dict):
        raise BadInput(f"{p} is not a model config.json: expected a JSON object.")
    cfg = raw.get("text_config", raw) if isinstance(raw.get("text_config"), dict) else raw
    required = ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size")
    missing = [k for k in required if not isinstance(cfg.get(k), int)]
    if missing:
        raise BadInput(
            f"{p} is not a model config.json: missing or non-integer {', '.join(missing)}."
        )
    if any(k in cfg for k in ("num_experts", "num_local_experts", "n_routed_experts")):
        raise BadInput(f"{p} is a mixture-of-experts config, which the roofline does not model.")
    hidden, heads = cfg["hidden_size"], cfg["num_attention_heads"]
    archs = cfg.get("architectures") or []
    kind: ModelKind = next((_HEAD_ARCHITECTURES[a] for a in archs if a in _HEAD_ARCHITECTURES),
                           "target")  # fmt: skip
    dtype = str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16").lower()
    return ModelSpec(
        name=str(p),
        kind=kind,
        layers=cfg["num_hidden_layers"],
        hidden=hidden,
        heads=heads,
        kv_heads=int(cfg.get("num_key_value_heads") or heads),
        head_dim=int(cfg.get("head_dim") or hidden // heads),
        intermediate=int(cfg.get("intermediate_size") or 4 * hidden),
        vocab=cfg["vocab_size"],
        draft_vocab=cfg.get("draft_vocab_size"),
        tied_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        qkv_bias=bool(cfg.get("attention_bias", cfg.get("model_type") == "qwen2")),
        dtype_bytes=_DTYPE_BYTES.get(dtype.replace("torch.", ""), 2),
        source=f"local config {p}",
    )


def default_head(method: str, target: ModelSpec) -> ModelSpec:
    """A one-layer EAGLE/EAGLE-3/MTP head shaped like the target, when no --draft is given."""
    kind: ModelKind = "eagle3" if method == "eagle3" else "mtp" if method == "mtp" else "eagle"
    return target.model_copy(
        update={
            "name": f"{method}-head-for-{target.name}",
            "kind": kind,
            "layers": 1,
            "params": None,
            "draft_vocab": 32000 if kind == "eagle3" else None,  # EAGLE-3 reference heads
            "for_target": target.name,
            "source": f"one decoder layer shaped like {target.name} (EAGLE/EAGLE-3 papers; "
            "DeepSeek-V3 MTP module)",
        }
    )


def resolve_draft(
    method: str, draft: str | None, target: ModelSpec, catalog: Catalog | None = None
) -> ModelSpec | None:
    """The draft a method runs: a small model, a head, or nothing (ngram/suffix)."""
    if method in ("ngram", "suffix"):
        if draft:
            raise BadInput(f"--draft is not used by method {method}; drop it.")
        return None
    if method == "draft_model":
        if not draft:
            raise BadInput("method draft_model needs --draft (e.g. llama-3.2-1b or a config path).")
        spec = get_model(draft, catalog)
        if spec.kind != "target":
            raise BadInput(f"--draft {draft} is an {spec.kind} head; draft_model needs a model.")
        if spec.vocab != target.vocab:
            raise BadInput(
                f"--draft {draft} has vocab {spec.vocab} but target {target.name} has "
                f"{target.vocab}; draft_model needs the same tokenizer."
            )
        return spec
    if not draft:
        return default_head(method, target)
    spec = get_model(draft, catalog)
    if spec.kind == "target":
        raise BadInput(
            f"--draft {draft} is a full model; method {method} needs a {method} head "
            "(or use --method draft_model)."
        )
    return spec


def gpu_names(catalog: Catalog | None = None) -> list[str]:
    return sorted((catalog or load_catalog()).gpus)


def model_names(catalog: Catalog | None = None) -> list[str]:
    return sorted((catalog or load_catalog()).models)
