"""`advisor predict` and `advisor profiles` run as a user would, in a subprocess."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli.main import app
from tests.conftest import run_cli


def test_predict_json_has_the_documented_fields() -> None:
    r = run_cli("predict", "--acceptance", "0.8", "--batch", "4", "--prompt-tokens", "512",
                "--output-tokens", "256", "--k", "4", "--format", "json")  # fmt: skip
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    for key in ("speedup", "e2e_latency_speedup", "tokens_per_s_baseline",
                "tokens_per_s_speculative", "memory_fits"):  # fmt: skip
        assert key in got
    assert got["k"] == 4 and got["memory_fits"] is True
    ratio = got["tokens_per_s_speculative"] / got["tokens_per_s_baseline"]
    assert abs(got["speedup"] - ratio) < 1e-3  # speedup is the batch tokens/s ratio
    assert got["calibration"]["kind"] in ("roofline", "profile")


def test_predict_table_names_the_calibration_and_memory() -> None:
    r = run_cli("predict", "--gpu", "l40s", "--method", "draft_model", "--draft", "llama-3.2-1b")
    assert r.returncode == 0, r.stderr
    assert "speedup" in r.stdout and "memory fits" in r.stdout
    assert "no measured profile for l40s" in r.stdout


def test_predict_rejects_bad_input_with_exit_2(tmp_path: Path) -> None:
    cases = {
        ("--gpu", "h900"): "known GPUs: a100-80g, b200, h100, h200",
        ("--target", "gpt-5"): "known models:",
        ("--method", "medusa"): "is not one of eagle3",
        ("--k", "0"): "--k 0 must be from 1 to 16",
        ("--acceptance", "1.5"): "--acceptance 1.5 must be in [0, 1)",
        ("--method", "draft_model"): "needs --draft",
        ("--gpu", "l40s", "--target", "llama-3.1-70b"): "does not fit the KV cache",
    }
    not_model = tmp_path / "config.json"
    not_model.write_text(json.dumps({"model_max_length": 4096, "tokenizer_class": "X"}))
    cases[("--target", str(not_model))] = "is not a model config.json"
    # One real subprocess for the exit code and stderr as a user sees them ...
    r = run_cli("predict", "--gpu", "h900")
    assert r.returncode == 2 and "known GPUs: a100-80g" in r.stderr
    assert "Traceback" not in r.stderr
    # ... and the same command in-process for the rest (each subprocess pays the CLI's imports).
    runner = CliRunner()
    for args, message in cases.items():
        res = runner.invoke(app, ["predict", *args])
        assert res.exit_code == 2, (args, res.output)
        assert message in res.output.replace("\n", ""), (args, res.output)


def test_profiles_list_and_show() -> None:
    r = run_cli("profiles", "list")
    assert r.returncode == 0 and "roofline" in r.stdout
    r = run_cli("profiles", "show", "roofline")
    assert r.returncode == 0
    assert json.loads(r.stdout)["methods"]["draft_model"]["step_overhead_ms"] > 0
    r = run_cli("profiles", "show", "nope")
    assert r.returncode == 2 and "shipped profiles: " in r.stderr


def test_predict_takes_a_user_catalogue_and_a_local_config(tmp_path: Path) -> None:
    catalog = tmp_path / "catalog.json"
    gpu = {"memory_gb": 40, "hbm_bandwidth_gbs": 1000, "bf16_tflops": 200, "source": "lab"}
    catalog.write_text(json.dumps({"gpus": {"lab-gpu": gpu}}))
    config = tmp_path / "config.json"
    config.write_text(json.dumps({
        "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 3584,
        "intermediate_size": 18944, "num_hidden_layers": 28, "num_attention_heads": 28,
        "num_key_value_heads": 4, "vocab_size": 152064, "torch_dtype": "bfloat16",
    }))  # fmt: skip
    r = run_cli("predict", "--catalog", str(catalog), "--gpu", "lab-gpu", "--target",
                str(config), "--method", "ngram", "--format", "json")  # fmt: skip
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    # Qwen2.5-7B shapes: 7.62B params in bf16 = 15.23 GB of weights.
    assert got["memory"]["target_weights_gb"] == pytest.approx(15.23, abs=0.01)
    assert got["memory"]["gpu_memory_gb"] == 40


def test_predict_uses_a_profile_file_given_as_calibration(tmp_path: Path) -> None:
    from advisor.profile import get_profile

    slow = get_profile("roofline").model_copy(update={"name": "slow", "bandwidth_efficiency": 0.4})
    path = tmp_path / "slow.json"
    path.write_text(slow.model_dump_json())
    runner = CliRunner()
    args = ["predict", "--format", "json", "--k", "3", "--acceptance", "0.7"]
    default = json.loads(runner.invoke(app, args).output)
    mine = json.loads(runner.invoke(app, [*args, "--calibration", str(path)]).output)
    # Half the effective bandwidth: the memory-bound batch-1 step takes about twice as long.
    assert mine["tpot_ms_baseline"] > 1.6 * default["tpot_ms_baseline"]
    assert mine["calibration"] == slow.calibration.model_dump()  # the file names its source


def test_predict_reads_stored_calibrations_from_the_database(con, db_path: Path) -> None:
    con.close()  # the fixture created and migrated a real, empty database
    res = CliRunner().invoke(app, ["predict", "--calibration", "7", "--db", str(db_path)])
    assert res.exit_code == 2
    assert "There is no calibration 7 in this database" in res.output.replace("\n", "")
