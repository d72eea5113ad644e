"""Pydantic models shared by the calibration runtime (servers, replay, metrics) and its fit/store.

These are the contract between the pieces that talk to vLLM (servers.py, replay.py, metrics.py,
sampling.py) and the pieces that fit and store a calibration. Extend by adding fields only.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, computed_field, model_validator

Role = Literal["baseline", "speculative"]


class ServerSpec(BaseModel):
    """How to launch one vLLM OpenAI-compatible server (`vllm serve MODEL ...`)."""

    role: Role
    model: str = Field(description="HF id or local folder passed to vllm serve")
    speculative_config: dict[str, object] | None = Field(
        default=None, description="JSON for --speculative-config; None for the baseline"
    )
    host: str = "127.0.0.1"
    port: int | None = Field(default=None, description="None picks a free port")
    gpu_memory_utilization: float | None = Field(default=None, gt=0.0, le=1.0)
    extra_args: list[str] = Field(default_factory=list, description="passed through to vLLM")
    env: dict[str, str] = Field(default_factory=dict, description="added to the environment")
    python: str | None = Field(
        default=None, description="interpreter that has vLLM installed; None: this one / PATH"
    )
    startup_timeout_s: float = Field(default=900.0, gt=0)
    log_dir: Path = Path(".")

    @model_validator(mode="after")
    def _role_matches_config(self) -> ServerSpec:
        if self.role == "speculative" and not self.speculative_config:
            raise ValueError("a speculative server needs a speculative_config")
        if self.role == "baseline" and self.speculative_config:
            raise ValueError("a baseline server must not have a speculative_config")
        return self


class ServerHandle(BaseModel):
    """A server that answered /health: launched by us, or attached to by URL."""

    url: str = Field(description="base URL without /v1, e.g. http://127.0.0.1:8000")
    role: Role
    vllm_version: str = Field(description="from GET /version")
    model: str = Field(description="served model name, from GET /v1/models")
    max_model_len: int | None = Field(default=None, description="from /v1/models when reported")
    launch_command: list[str] | None = Field(default=None, description="None when attached")
    log_path: Path | None = None
    pid: int | None = None
    startup_s: float | None = Field(default=None, description="launch to healthy, seconds")
    speculative_config: dict[str, object] | None = None


class ReplayRequest(BaseModel):
    """One request to replay: logged or synthesized prompt, forced output length."""

    request_id: str
    segment_key: str
    prompt: str | None = None
    prompt_token_ids: list[int] | None = None
    prompt_tokens: int = Field(ge=1, description="logged (target) prompt length")
    max_tokens: int = Field(ge=1)
    temperature: float = Field(default=0.0, ge=0.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    ignore_eos: bool = True
    chat: bool = Field(
        default=False, description="send as one user message to /v1/chat/completions (template)"
    )
    task: str | None = None
    prompt_source: Literal["logged", "synthesized", "token_ids"] = "synthesized"

    @model_validator(mode="after")
    def _has_prompt(self) -> ReplayRequest:
        if (self.prompt is None) == (self.prompt_token_ids is None):
            raise ValueError("give exactly one of prompt and prompt_token_ids")
        if self.chat and self.prompt is None:
            raise ValueError("a chat request needs prompt text")
        return self


class LatencySummary(BaseModel):
    """Summary of one request's inter-chunk gaps (ms); a chunk may carry several tokens."""

    n: int
    mean_ms: float
    p50_ms: float
    p95_ms: float
    max_ms: float


class ReplayRecord(BaseModel):
    """What one replayed request measured, on one server."""

    request_id: str
    segment_key: str
    role: Role
    prompt_tokens: int = Field(description="as the server counted them (usage), else requested")
    output_tokens: int = Field(description="as the server counted them (usage), else chunks")
    max_tokens: int
    temperature: float
    top_p: float = 1.0
    ttft_ms: float | None = None
    tpot_ms: float | None = Field(
        default=None, description="(e2e - ttft) / (output_tokens - 1); None below 2 tokens"
    )
    e2e_ms: float | None = None
    chunks: int = 0
    inter_chunk: LatencySummary | None = None
    start_offset_s: float = Field(default=0.0, description="send time since the batch began")
    ok: bool = True
    error: str | None = None

    @staticmethod
    def tpot(e2e_ms: float, ttft_ms: float, output_tokens: int) -> float | None:
        """Time per output token after the first; chunks can carry several tokens, so by count."""
        if output_tokens < 2:
            return None
        return (e2e_ms - ttft_ms) / (output_tokens - 1)


class SpecDecodeDelta(BaseModel):
    """Change of vLLM's spec-decode counters over one batch (after minus before)."""

    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_pos: list[int] = Field(default_factory=list)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def acceptance_rate(self) -> float | None:
        """Accepted / proposed draft tokens; None when nothing was drafted."""
        if self.num_draft_tokens <= 0:
            return None
        return self.num_accepted_tokens / self.num_draft_tokens

    @computed_field  # type: ignore[prop-decorator]
    @property
    def mean_acceptance_length(self) -> float | None:
        """Tokens emitted per verification step: 1 (the bonus/corrected token) + accepted/drafts."""
        if self.num_drafts <= 0:
            return None
        return 1.0 + self.num_accepted_tokens / self.num_drafts

    @computed_field  # type: ignore[prop-decorator]
    @property
    def per_position_rates(self) -> list[float]:
        """Unconditional acceptance at each draft position: accepted at pos i / drafts."""
        if self.num_drafts <= 0:
            return []
        return [a / self.num_drafts for a in self.accepted_per_pos]

    @property
    def moved(self) -> bool:
        """True when the server drafted anything during the batch."""
        return self.num_drafts > 0


class SegmentRun(BaseModel):
    """One batch of one segment replayed on one server (segments run one after another)."""

    segment_key: str
    role: Role
    concurrency: int = Field(ge=1)
    round: int = Field(default=0, ge=0, description="sequential-sampling round, from 0")
    records: list[ReplayRecord]
    delta: SpecDecodeDelta | None = Field(default=None, description="None on the baseline")
    wall_s: float = Field(ge=0.0)

    @property
    def ok_records(self) -> list[ReplayRecord]:
        """Requests that completed."""
        return [r for r in self.records if r.ok]

    @computed_field  # type: ignore[prop-decorator]
    @property
    def output_tokens(self) -> int:
        """Output tokens over the completed requests."""
        return sum(r.output_tokens for r in self.ok_records)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def tokens_per_s(self) -> float | None:
        """Output throughput of the batch at its concurrency."""
        if self.wall_s <= 0:
            return None
        return self.output_tokens / self.wall_s
