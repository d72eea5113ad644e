"""Catalogue facts against the published configs, HF config loading, and bad-input messages."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from advisor.catalog import (
    get_gpu,
    get_model,
    load_catalog,
    model_from_hf_config,
    resolve_draft,
)
from advisor.errors import BadInput

LLAMA_8B_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "vocab_size": 128256,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}


def test_llama_8b_parameter_count_matches_the_published_one() -> None:
    m = get_model("llama-3.1-8b")
    # By hand: per layer attn 4096*(4096+2*1024) + 4096*4096 = 41,943,040, MLP 3*4096*14336 =
    # 176,160,768, norms 8,192 -> 218,112,000; x32 = 6,979,584,000; embeddings and lm_head
    # 128256*4096 = 525,336,576 each; final norm 4,096. Total 8,030,261,248 (HF model card).
    assert m.total_params() == 8_030_261_248
    assert m.streamed_params() == 6_979_584_000 + 525_336_576
    assert m.kv_bytes_per_token() == 2 * 32 * 8 * 128 * 2  # K and V, 32 layers, bf16


@pytest.mark.parametrize(
    ("name", "billions"),
    [("llama-3.1-70b", 70.55), ("llama-3.2-1b", 1.236), ("qwen2.5-7b", 7.62),
     ("qwen2.5-14b", 14.77), ("qwen2.5-32b", 32.76), ("qwen2.5-0.5b", 0.494)],
)  # fmt: skip
def test_catalogue_models_match_published_sizes(name: str, billions: float) -> None:
    assert get_model(name).total_params() / 1e9 == pytest.approx(billions, rel=0.005)


def test_every_catalogue_entry_names_its_source() -> None:
    cat = load_catalog()
    assert {"h200", "h100", "b200", "a100-80g", "l40s", "rtx-pro-6000-blackwell"} <= set(cat.gpus)
    for entry in [*cat.gpus.values(), *cat.models.values()]:
        assert len(entry.source) > 10, entry.name
    assert get_gpu("H200").hbm_bandwidth_gbs == 4800
    assert get_gpu("a100-80g").peak_flops(1) == get_gpu("a100-80g").peak_flops(2)  # no FP8


def test_hf_config_gives_the_same_shapes_as_the_catalogue(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(LLAMA_8B_CONFIG))
    m = get_model(str(tmp_path / "config.json"))
    assert m.total_params() == get_model("llama-3.1-8b").total_params()
    assert model_from_hf_config(tmp_path).kind == "target"  # a folder holding config.json works


def test_eagle3_head_config_is_recognised(tmp_path: Path) -> None:
    head = {**LLAMA_8B_CONFIG, "architectures": ["LlamaForCausalLMEagle3"], "num_hidden_layers": 1,
            "draft_vocab_size": 32000}  # fmt: skip
    path = tmp_path / "config.json"
    path.write_text(json.dumps(head))
    spec = model_from_hf_config(path)
    assert spec.kind == "eagle3"
    assert spec.total_params() < 0.6e9  # one layer + fc + 32k-vocab head, embeddings shared
    target = get_model("llama-3.1-8b")
    assert resolve_draft("eagle3", str(path), target) == spec


def test_a_config_that_is_not_a_model_config_is_bad_input(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"_name_or_path": "tokenizer", "model_max_length": 8192}))
    with pytest.raises(BadInput, match=r"not a model config\.json: missing .*hidden_size"):
        get_model(str(path))
    path.write_text("not json")
    with pytest.raises(BadInput, match="not valid JSON"):
        get_model(str(path))


def test_unknown_names_list_the_valid_ones() -> None:
    with pytest.raises(BadInput, match=r"known GPUs: a100-80g, b200, h100, h200"):
        get_gpu("h900")
    with pytest.raises(BadInput, match=r"known models: .*llama-3\.1-8b"):
        get_model("gpt-5")
    with pytest.raises(BadInput, match=r"unknown model 'meta-llama/Llama-3\.1-8B' \(not a"):
        get_model("meta-llama/Llama-3.1-8B")  # a hub id is not a local file


def test_drafts_are_checked_against_the_method_and_target() -> None:
    target = get_model("llama-3.1-8b")
    with pytest.raises(BadInput, match="needs --draft"):
        resolve_draft("draft_model", None, target)
    with pytest.raises(BadInput, match="same tokenizer"):
        resolve_draft("draft_model", "qwen2.5-0.5b", target)
    with pytest.raises(BadInput, match="not used by method ngram"):
        resolve_draft("ngram", "llama-3.2-1b", target)
    assert resolve_draft("ngram", None, target) is None
    head = resolve_draft("eagle3", None, target)
    assert head is not None and head.kind == "eagle3" and head.layers == 1


def test_a_user_catalogue_adds_gpus_and_models(tmp_path: Path, monkeypatch) -> None:
    extra = tmp_path / "mine.json"
    gpu = {"memory_gb": 24, "hbm_bandwidth_gbs": 1000, "bf16_tflops": 100, "source": "our lab"}
    extra.write_text(json.dumps({"gpus": {"my-gpu": gpu}}))
    assert get_gpu("my-gpu", load_catalog(extra)).memory_gb == 24
    monkeypatch.setenv("ADVISOR_CATALOG", str(extra))
    assert "my-gpu" in load_catalog().gpus
    extra.write_text(json.dumps({"gpus": {"bad": {"memory_gb": "lots"}}}))
    with pytest.raises(BadInput, match=r"gpus\.bad"):
        load_catalog(extra)
