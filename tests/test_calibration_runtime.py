"""Calibration runtime without vLLM: /metrics parsing on real captured text, replay over real
loopback HTTP against the shared fake server, the sampler and its stopping rule, prompt synthesis,
and launch failures with real processes (no orphan left behind)."""

from __future__ import annotations

import itertools
import math
import os
import re
import stat
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from advisor import concurrency
from advisor.segments import Bands, Filters, create_scope, segment
from calibration import metrics, prompts, replay, sampling, servers
from calibration.schemas import (
    ReplayRecord,
    ReplayRequest,
    SegmentRun,
    ServerHandle,
    ServerSpec,
    SpecDecodeDelta,
)
from tests.fake_vllm import fake_vllm

FIXTURES = Path(__file__).parent / "fixtures" / "metrics"


@pytest.fixture(autouse=True)
def short_stop_grace(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fake servers ignore SIGTERM on purpose; do not wait vLLM's grace time for them."""
    monkeypatch.setattr(servers, "STOP_GRACE_S", 1.0)


# --- metrics ---------------------------------------------------------------------------------


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


def test_real_vllm_metrics_parse_and_delta() -> None:
    before = metrics.parse_counters(fixture("vllm-0.32.0-ngram-k4-before.txt"))
    after = metrics.parse_counters(fixture("vllm-0.32.0-ngram-k4-after.txt"))
    assert before.present and after.present
    d = metrics.delta(before, after)
    assert d is not None and d.num_drafts > 0
    assert len(d.accepted_per_pos) == 4
    assert d.num_draft_tokens == 4 * d.num_drafts
    assert sum(d.accepted_per_pos) == d.num_accepted_tokens
    # Per-position acceptance is unconditional, so it cannot increase with the position.
    rates = d.per_position_rates
    assert all(a >= b for a, b in itertools.pairwise(rates))
    assert d.acceptance_rate == pytest.approx(d.num_accepted_tokens / d.num_draft_tokens)
    assert d.mean_acceptance_length == pytest.approx(1 + d.num_accepted_tokens / d.num_drafts)


def test_names_without_total_and_without_type_lines_read_the_same() -> None:
    text = fixture("vllm-0.32.0-ngram-k4-after.txt")
    bare = "\n".join(
        re.sub(r"^(vllm:spec_decode_\w+?)_total", r"\1", line)
        for line in text.splitlines()
        if not line.startswith("#")
    )
    assert "spec_decode_num_drafts_total" not in bare
    assert metrics.parse_counters(bare) == metrics.parse_counters(text)


def test_baseline_metrics_have_no_spec_decode_counters() -> None:
    counters = metrics.parse_counters(fixture("vllm-0.32.0-baseline.txt"))
    assert not counters.present
    assert metrics.delta(counters, counters) is None


def test_counters_going_backwards_is_an_error() -> None:
    before = metrics.parse_counters(fixture("vllm-0.32.0-ngram-k4-after.txt"))
    after = metrics.parse_counters(fixture("vllm-0.32.0-ngram-k4-before.txt"))
    with pytest.raises(metrics.MetricsError, match="restarted"):
        metrics.delta(before, after)


def test_counters_sum_over_engines() -> None:
    text = (
        "# TYPE vllm:spec_decode_num_drafts counter\n"
        'vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 3.0\n'
        'vllm:spec_decode_num_drafts_total{engine="1",model_name="m"} 4.0\n'
        'vllm:spec_decode_num_drafts_created{engine="1",model_name="m"} 1.7e9\n'
    )
    assert metrics.parse_counters(text).num_drafts == 7.0


def test_spec_decode_delta_without_drafts_has_no_rates() -> None:
    d = SpecDecodeDelta()
    assert d.acceptance_rate is None and d.mean_acceptance_length is None
    assert d.per_position_rates == [] and not d.moved


# --- replay against a fake server over real HTTP ----------------------------------------------


def requests_for(category: str, n: int, max_tokens: int = 24) -> list[ReplayRequest]:
    return [
        ReplayRequest(
            request_id=f"{category}-{i}",
            segment_key=category,
            prompt=prompts.synthesize(category, 120, seed=i),
            prompt_tokens=120,
            max_tokens=max_tokens,
        )
        for i in range(n)
    ]


def test_replay_records_latencies_tokens_and_counter_delta() -> None:
    with fake_vllm(speculative=True, k=4) as fake:
        handle = servers.attach(fake.url, "speculative")
        assert handle.vllm_version == "0.26.0" and handle.model == "fake-model"
        drafts_before = fake.drafts
        run = replay.replay_segment(handle, requests_for("json", 5), concurrency=2)
    assert [r.request_id for r in run.records] == [f"json-{i}" for i in range(5)]
    assert all(r.ok and r.output_tokens == 24 for r in run.records)
    for r in run.records:
        assert r.ttft_ms is not None and r.e2e_ms is not None and r.e2e_ms >= r.ttft_ms
        assert r.tpot_ms == pytest.approx((r.e2e_ms - r.ttft_ms) / 23)
        assert r.inter_chunk is not None and r.inter_chunk.n == r.chunks - 1
        assert r.chunks < 24  # speculative chunks carry several tokens
    assert run.delta is not None
    assert run.delta.num_drafts == fake.drafts - drafts_before
    assert run.output_tokens == 120 and run.tokens_per_s is not None


def test_replay_on_a_baseline_has_no_delta_and_one_token_per_chunk() -> None:
    with fake_vllm(speculative=False) as fake:
        run = replay.replay_segment(
            servers.attach(fake.url, "baseline"), requests_for("story", 3), concurrency=3
        )
        assert fake.hits["/metrics"] == 2  # scraped before and after the batch
    assert run.delta is None
    assert all(r.chunks == r.output_tokens == 24 for r in run.records)


def test_replay_payload_forces_length_and_counts_usage() -> None:
    with fake_vllm(speculative=False) as fake:
        handle = servers.attach(fake.url, "baseline")
    body = replay.completion_payload(handle, requests_for("sql", 1, max_tokens=7)[0])
    assert body["max_tokens"] == 7 and body["ignore_eos"] is True and body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}


def test_chat_requests_use_the_chat_endpoint_and_count_delta_content() -> None:
    with fake_vllm(speculative=False) as fake:
        handle = servers.attach(fake.url, "baseline")
    request = requests_for("chat", 1)[0].model_copy(update={"chat": True})
    body = replay.completion_payload(handle, request)
    assert replay.endpoint(request) == "/v1/chat/completions"
    assert body["messages"] == [{"role": "user", "content": request.prompt}]
    assert "prompt" not in body
    assert replay._is_step({"delta": {"content": "hi"}, "finish_reason": None})
    assert not replay._is_step({"delta": {"role": "assistant", "content": ""}})
    assert replay._is_step({"text": "", "finish_reason": None})  # detokenize off: still a step
    assert not replay._is_step({"text": "", "finish_reason": "length"})  # a bare finish marker
    with pytest.raises(ValueError, match="chat request needs prompt text"):
        ReplayRequest(request_id="x", segment_key="s", prompt_token_ids=[1], prompt_tokens=1,
                      max_tokens=1, chat=True)  # fmt: skip


def test_unreadable_metrics_stop_the_batch_with_the_url() -> None:
    with fake_vllm(speculative=False) as fake:
        handle = servers.attach(fake.url, "baseline").model_copy(update={"url": fake.url + "/x"})
        with pytest.raises(metrics.MetricsError, match="/x/metrics"):
            replay.replay_segment(handle, requests_for("chat", 1), concurrency=1)


class Refusing(BaseHTTPRequestHandler):
    """A server whose /metrics works but which refuses every completion."""

    def log_message(self, *args: object) -> None:
        """Quiet."""

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_POST(self) -> None:
        body = b'{"error": "max_tokens is too large"}'
        self.send_response(400)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def test_a_refused_request_is_recorded_not_raised() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Refusing)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        handle = ServerHandle(url=url, role="baseline", vllm_version="x", model="m")
        run = replay.replay_segment(handle, requests_for("json", 2), concurrency=2)
    finally:
        server.shutdown()
        server.server_close()
    assert [r.ok for r in run.records] == [False, False]
    errors = [r.error or "" for r in run.records]
    assert all("HTTP 400" in e and "too large" in e for e in errors)
    assert run.output_tokens == 0 and run.delta is None


def test_attach_to_something_that_is_not_vllm_names_the_url() -> None:
    port = servers.free_port()
    with pytest.raises(servers.ServerFailed, match=f"127.0.0.1:{port}"):
        servers.attach(f"http://127.0.0.1:{port}/v1", "baseline")


# --- prompts ---------------------------------------------------------------------------------


@pytest.mark.parametrize("category", prompts.CATEGORIES)
@pytest.mark.parametrize("target", [40, 300, 1500])
def test_synthesized_prompts_reach_the_length_without_overshooting_much(
    category: prompts.Category, target: int
) -> None:
    text = prompts.synthesize(category, target, seed=3)
    n = prompts.approx_tokens(text)
    assert n >= target or target < prompts.approx_tokens(prompts.synthesize(category, 1))
    assert n <= target + 80
    assert text == prompts.synthesize(category, target, seed=3)
    assert text != prompts.synthesize(category, target, seed=4)


def test_prompt_content_fits_the_task() -> None:
    assert prompts.category_for("coding") == "code_edit"
    assert prompts.category_for("Summarization") == "summarize"
    assert prompts.category_for(None) == "chat" and prompts.category_for("other") == "chat"
    assert "JSON" in prompts.synthesize(prompts.category_for("json_extraction"), 100)
    assert "def " in prompts.synthesize("code_edit", 100)
    assert prompts.prompt_for("story", 50, logged_text="logged!") == ("logged!", "logged")


def test_synthesis_uses_the_token_counter_given() -> None:
    calls: list[int] = []

    def words(text: str) -> int:
        calls.append(1)
        return len(text.split())

    text = prompts.synthesize("document_qa", 2000, count_tokens=words)
    assert 2000 <= len(text.split()) < 2100
    assert len(calls) < 40  # doubling + bisection, not one call per unit


# --- sampling and the sequential rule --------------------------------------------------------


def add_requests(con, rows: list[tuple[str, int, int, float, str | None]]) -> None:
    con.executemany(
        "INSERT INTO requests (request_id, source, import_id, line, prompt_tokens, output_tokens,"
        " temperature, task, concurrency, prompt_text) VALUES (?, 't', 1, ?, ?, ?, ?, ?, 2, ?)",
        [(f"r{i}", i, p, o, t, task, text) for i, (task, p, o, t, text) in enumerate(rows)],
    )


def test_draw_is_stratified_per_segment_and_replays_logged_text(con) -> None:
    rows = [("coding", 100 + 3 * i, 50, 0.0, None) for i in range(40)]
    rows += [("story", 1000 + i, 600, 1.0, f"once upon a time {i}") for i in range(10)]
    rows += [("sql", 5000 + i, 20, 0.0, None) for i in range(10)]  # as many as story
    add_requests(con, rows)
    create_scope(con, Filters())
    concurrency.fill(con, lambda p, o, b: 1.0)
    bands = Bands(min_share=0.0)
    segs = segment(con, bands)
    drawn = sampling.draw(con, segs, bands, max_per_segment=8, seed=1)
    assert sorted(len(v) for v in drawn.values()) == [8, 8, 8]
    for key, picks in drawn.items():  # each pick belongs to the segment it is filed under
        assert all(key.startswith(p.task) for p in picks)
    sql = next(v for k, v in drawn.items() if k.startswith("sql"))
    assert all(p.prompt_tokens >= 5000 and p.output_tokens == 20 for p in sql)
    coding = next(v for k, v in drawn.items() if k.startswith("coding"))
    # The first four picks come one from each prompt-length quartile.
    quartiles = sorted((s.prompt_tokens - 100) // 30 for s in coding[:4])
    assert quartiles == [0, 1, 2, 3]
    assert drawn == sampling.draw(con, segs, bands, max_per_segment=8, seed=1)
    with pytest.raises(sampling.AdvisorError, match="other segments"):
        sampling.draw(con, segs, Bands(prompt=[120], min_share=0.0), max_per_segment=8)
    assert drawn != sampling.draw(con, segs, bands, max_per_segment=8, seed=2)
    story = next(v for k, v in drawn.items() if k.startswith("story"))
    reqs = sampling.to_requests(story, max_model_len=None)
    assert all(r.prompt_source == "logged" and r.prompt.startswith("once") for r in reqs)
    assert {r.temperature for r in reqs} == {1.0} and {r.max_tokens for r in reqs} == {600}
    short = sampling.to_requests(story, max_model_len=1024)
    assert all(r.prompt_tokens + r.max_tokens <= 1024 for r in short)
    assert all(r.prompt_source == "synthesized" for r in short)  # logged text would not fit
    coding_reqs = sampling.to_requests(coding)
    assert all("def " in r.prompt for r in coding_reqs)


def test_draw_without_segments_says_what_to_do(con) -> None:
    with pytest.raises(sampling.AdvisorError, match=r"create_scope\(\)"):
        sampling.draw(con, [], Bands(), 4)


def fake_runs(
    key: str, n: int, base_ms: float, spec_ms: float, spread: float, alpha: float, k: int = 4
) -> tuple[SegmentRun, SegmentRun]:
    """Paired runs of n requests with known speedup and acceptance, deterministic noise."""

    def rec(i: int, role: str, e2e: float, chunks: int) -> ReplayRecord:
        return ReplayRecord(request_id=f"{key}{i}", segment_key=key, role=role,  # type: ignore[arg-type]
                            prompt_tokens=10, output_tokens=65, max_tokens=65, temperature=0.0,
                            e2e_ms=e2e, ttft_ms=5.0, chunks=chunks)  # fmt: skip

    noise = [math.sin(1.7 * i) for i in range(n)]
    per_step = 1 + alpha * k
    base = [rec(i, "baseline", base_ms * (1 + spread * noise[i]), 65) for i in range(n)]
    spec = [
        rec(i, "speculative", spec_ms * (1 + spread * math.cos(2.3 * i)),
            1 + round(64 / (per_step * (1 + spread * noise[(i + 3) % n]))))
        for i in range(n)
    ]  # fmt: skip
    drafts = sum(r.chunks - 1 for r in spec)
    accepted = round(alpha * k * drafts)
    delta = SpecDecodeDelta(
        num_drafts=drafts, num_draft_tokens=k * drafts, num_accepted_tokens=accepted,
        accepted_per_pos=[accepted, 0, 0, 0],
    )  # fmt: skip
    return (
        SegmentRun(segment_key=key, role="baseline", concurrency=1, records=base, wall_s=6.0),
        SegmentRun(segment_key=key, role="speculative", concurrency=1, records=spec, delta=delta,
                   wall_s=3.0),
    )  # fmt: skip


def test_estimate_recovers_acceptance_and_speedup_and_tightens_with_n() -> None:
    rule = sampling.Precision(acceptance_half_width=0.03, speedup_half_width=0.03)
    b, s = fake_runs("a", 6, 200.0, 100.0, 0.2, 0.5)
    small = sampling.estimate("a", [b], [s], rule)
    assert small.speedup == pytest.approx(2.0, rel=0.1)
    assert small.acceptance == pytest.approx(0.5, abs=0.01)
    assert not small.done and small.reason is None
    b2, s2 = fake_runs("a", 60, 200.0, 100.0, 0.2, 0.5)
    big = sampling.estimate("a", [b2], [s2], sampling.Precision(max_requests=500))
    assert big.acceptance_half_width < small.acceptance_half_width
    assert big.speedup_half_width < small.speedup_half_width


def test_stopping_rule_reasons() -> None:
    b, s = fake_runs("a", 40, 200.0, 100.0, 0.0, 0.5)
    exact = sampling.estimate("a", [b], [s], sampling.Precision(max_requests=500))
    assert exact.done and exact.reason == "precision reached"
    b, s = fake_runs("a", 10, 200.0, 100.0, 0.4, 0.5)
    capped = sampling.estimate("a", [b], [s], sampling.Precision(max_requests=10))
    assert capped.done and capped.reason == "max requests (10)"
    timed = sampling.estimate("a", [b], [s], sampling.Precision(max_minutes=0.1))
    assert timed.done and timed.reason == "max minutes (0.1)"
    one = sampling.estimate("a", [], [], sampling.Precision())
    assert one.n == 0 and math.isinf(one.acceptance_half_width) and not one.done


def estimate_of(key: str, n: int, spread: float, rule: sampling.Precision):
    base, spec = fake_runs(key, n, 200.0, 100.0, spread, 0.5)
    return sampling.estimate(key, [base], [spec], rule)


def test_next_round_sends_requests_where_the_uncertainty_is() -> None:
    rule = sampling.Precision(max_requests=200, round_max=100, pilot=6)
    noisy = sampling.estimate(
        "noisy", *map(lambda r: [r], fake_runs("noisy", 8, 200, 100, 0.5, 0.5)), rule
    )
    calm = sampling.estimate(
        "calm", *map(lambda r: [r], fake_runs("calm", 8, 200, 100, 0.05, 0.5)), rule
    )
    fresh = sampling.estimate("fresh", [], [], rule)
    plan = sampling.next_round([noisy, calm, fresh], {"noisy": 500, "calm": 500, "fresh": 3}, rule)
    assert plan["noisy"] > plan.get("calm", 0)
    assert plan["fresh"] == 3  # the pilot, capped by what the sample holds
    done = sampling.estimate(
        "done", *map(lambda r: [r], fake_runs("done", 40, 200, 100, 0.0, 0.5)), rule
    )
    assert "done" not in sampling.next_round([done], {"done": 100}, rule)


# --- launching: real processes, no vLLM needed ------------------------------------------------

FAKE_SERVER = r"""
import os, signal, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c",
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"])
open(os.environ["CHILD_PID_FILE"], "w").write(str(child.pid))
print("loading model", sys.argv[sys.argv.index("--model") + 1], flush=True)
if os.environ.get("FAKE_MODE") == "die":
    print("OSError: model folder not found", flush=True)
    sys.exit(1)
signal.signal(signal.SIGTERM, signal.SIG_IGN)
time.sleep(600)
"""


def fake_python(tmp_path: Path, has_vllm: bool) -> Path:
    """An 'interpreter' whose vLLM launch runs FAKE_SERVER: a server that forks a child which
    ignores SIGTERM, like vLLM's engine-core process."""
    script = tmp_path / "fake_server.py"
    script.write_text(FAKE_SERVER)
    exe = tmp_path / "python-fake"
    probe = "exit 0" if has_vllm else "exit 1"
    exe.write_text(
        f'#!/bin/sh\nif [ "$1" = "-c" ]; then {probe}; fi\nexec {sys.executable} {script} "$@"\n'
    )
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    return exe


def gone(pid: int) -> bool:
    """True when the process no longer runs (zombies awaiting a reaper count as gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except FileNotFoundError:
        return True
    return state in {"Z", "X"}


def spec_for(tmp_path: Path, python: Path, mode: str, timeout: float = 60) -> ServerSpec:
    pid_file = tmp_path / f"child-{mode}.pid"
    return ServerSpec(
        role="baseline", model=str(tmp_path / "no-such-model"), python=str(python),
        env={"CHILD_PID_FILE": str(pid_file), "FAKE_MODE": mode}, log_dir=tmp_path / "logs",
        startup_timeout_s=timeout,
    )  # fmt: skip


def test_missing_vllm_is_one_sentence_with_the_fix(tmp_path: Path) -> None:
    spec = spec_for(tmp_path, fake_python(tmp_path, has_vllm=False), "die")
    with pytest.raises(servers.VllmMissing) as info, servers.launched(spec):
        pass
    message = str(info.value)
    assert "vLLM is not installed" in message and "pip install vllm" in message
    assert "\n" not in message


def test_a_server_that_dies_gives_the_model_path_and_log_tail_and_leaves_no_orphan(
    tmp_path: Path,
) -> None:
    spec = spec_for(tmp_path, fake_python(tmp_path, has_vllm=True), "die")
    with pytest.raises(servers.ServerFailed) as info, servers.launched(spec):
        pytest.fail("the server must not come up")
    message = str(info.value)
    assert str(tmp_path / "no-such-model") in message and "no such local folder" in message
    assert "model folder not found" in message  # the log's tail
    child = int((tmp_path / "child-die.pid").read_text())
    assert gone(child)


def test_servers_sharing_a_gpu_start_one_after_the_other(tmp_path: Path) -> None:
    python = fake_python(tmp_path, has_vllm=True)
    first = spec_for(tmp_path, python, "die").model_copy(update={"gpu_memory_utilization": 0.45})
    second = first.model_copy(update={"role": "speculative", "speculative_config": {"k": 1}})
    with pytest.raises(servers.ServerFailed, match="baseline"), servers.launched(first, second):
        pytest.fail("the server must not come up")
    logs = sorted(p.name for p in (tmp_path / "logs").iterdir())
    assert len(logs) == 1 and logs[0].startswith("vllm-baseline-")  # the second never started
    together = first.model_copy(update={"gpu_memory_utilization": None})
    with (
        pytest.raises(servers.ServerFailed),
        servers.launched(together, second.model_copy(update={"gpu_memory_utilization": None})),
    ):
        pytest.fail("the server must not come up")
    assert len(list((tmp_path / "logs").iterdir())) == 3  # both started at once this time


def test_a_server_that_never_gets_healthy_times_out_and_its_group_is_killed(
    tmp_path: Path,
) -> None:
    spec = spec_for(tmp_path, fake_python(tmp_path, has_vllm=True), "hang", timeout=3)
    with pytest.raises(servers.ServerFailed, match="not healthy after 3 s"), servers.launched(spec):
        pytest.fail("the server must not come up")
    child = int((tmp_path / "child-hang.pid").read_text())
    assert gone(child)


def test_an_error_inside_the_block_still_stops_the_servers(tmp_path: Path) -> None:
    python = fake_python(tmp_path, has_vllm=True)
    spec = spec_for(tmp_path, python, "hang", timeout=3)
    # Healthy at once: point the spec at a fake vLLM that answers /health on the launch port.
    with fake_vllm(speculative=False) as fake:
        port = int(fake.url.rsplit(":", 1)[1])
        spec = spec.model_copy(update={"port": port})
        with pytest.raises(RuntimeError, match="boom"), servers.launched(spec) as handles:
            assert handles[0].launch_command is not None
            assert handles[0].launch_command[:3] == [str(python), "-m", servers.API_SERVER_MODULE]
            pid = handles[0].pid
            raise RuntimeError("boom")
    assert pid is not None and gone(pid)
    deadline = time.monotonic() + 10
    while not (tmp_path / "child-hang.pid").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    if (tmp_path / "child-hang.pid").exists():
        assert gone(int((tmp_path / "child-hang.pid").read_text()))


def test_launch_command_passes_everything_through() -> None:
    spec = ServerSpec(
        role="speculative", model="/m", port=9, gpu_memory_utilization=0.45,
        speculative_config={"method": "ngram", "num_speculative_tokens": 4},
        extra_args=["--enforce-eager"],
    )  # fmt: skip
    cmd = servers.launch_command(spec, "/py", 9)
    assert cmd[:5] == ["/py", "-m", servers.API_SERVER_MODULE, "--model", "/m"]
    assert cmd[cmd.index("--gpu-memory-utilization") + 1] == "0.45"
    assert '"num_speculative_tokens": 4' in cmd[cmd.index("--speculative-config") + 1]
    assert cmd[-1] == "--enforce-eager"
    assert os.path.basename(cmd[0]) == "py"
