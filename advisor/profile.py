"""Profiles: every tunable number of the performance model, JSON-serialisable.

The roofline's datasheet numbers are never reached in practice; a profile says how far off they
are (efficiencies) and what the engine adds per step (overheads, per method, because vLLM runs
methods differently: on 0.26 draft_model has no asynchronous scheduling). Built-in profiles are
package data in advisor/profiles/*.json: `roofline.json` holds defaults for any GPU, and
`<gpu>.json` (e.g. h200.json, fitted from a measured sweep) is used for that GPU when present.
A calibration writes a Profile too, including fitted acceptance overrides.
"""

from __future__ import annotations

import json
import math
from importlib import resources
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, ValidationError

from advisor.errors import BadInput
from advisor.schemas import CalibrationRef

StepMethod = Literal["baseline", "eagle3", "eagle", "draft_model", "ngram", "suffix", "mtp"]


class MethodCost(BaseModel):
    """What the engine adds for one way of stepping, on top of the roofline."""

    step_overhead_ms: float = Field(ge=0, description="fixed cost per engine step (scheduler, "
                                    "launch, sampling, rejection sampler)")  # fmt: skip
    per_seq_overhead_ms: float = Field(default=0.0, ge=0, description="per sequence per step")
    draft_step_overhead_ms: float = Field(default=0.0, ge=0, description="per draft forward")
    draft_cost_factor: float = Field(default=1.0, ge=0, description="x the draft's roofline time")
    verify_ms_per_token: float = Field(default=0.0, ge=0, description="per verified position")
    cpu_draft_ms_per_seq: float = Field(default=0.0, ge=0, description="ngram/suffix CPU cost")
    position_decay: float = Field(
        default=1.0, gt=0, le=1.0, description="acceptance at draft position i = alpha * decay^i"
    )


class AcceptanceEntry(BaseModel):
    """A fitted acceptance for method x task x temperature band ('*' matches any)."""

    method: str
    task: str = "*"
    temperature_band: str = "*"
    alpha: float = Field(ge=0.0, le=0.999)
    low: float = Field(ge=0.0, le=0.999)
    high: float = Field(ge=0.0, le=0.999)
    n: int = 0


class AcceptanceLogit(BaseModel):
    """logit(alpha) = intercept + task[task] + temperature*T + log_prompt*ln(1+P)
    + log_output*ln(1+O); interval = +-sd on the logit scale."""

    method: str
    intercept: float
    task: dict[str, float] = {}
    temperature: float = 0.0
    log_prompt: float = 0.0
    log_output: float = 0.0
    sd: float = Field(default=0.5, ge=0.0)
    n: int = 0

    def predict(
        self, task: str, temperature: float | None, prompt_tokens: float, output_tokens: float
    ) -> tuple[float, float, float]:
        z = (
            self.intercept
            + self.task.get(task, 0.0)
            + self.temperature * (temperature if temperature is not None else 0.7)
            + self.log_prompt * math.log1p(prompt_tokens)
            + self.log_output * math.log1p(output_tokens)
        )
        # Unknown temperature: widen by one temperature coefficient's worth.
        sd = self.sd + (abs(self.temperature) * 0.5 if temperature is None else 0.0)

        def sig(x: float) -> float:
            return min(0.999, 1.0 / (1.0 + math.exp(-x)))

        return sig(z), sig(z - 1.645 * sd), sig(z + 1.645 * sd)


class Profile(BaseModel):
    """All tunable parameters of advisor.perf, plus where they came from."""

    name: str
    gpu: str | None = None  # None: applies to any GPU
    description: str = ""
    bandwidth_efficiency: float = Field(gt=0, le=1.0, description="achieved / datasheet HBM bw")
    kv_bandwidth_efficiency: float | None = Field(
        default=None, gt=0, le=1.0, description="for KV reads in attention; None: as weights"
    )
    roofline_sharpness: float | None = Field(
        default=None, ge=1.0, description="p of a smooth max(memory, compute); None: hard max"
    )
    compute_efficiency: float = Field(gt=0, le=1.0, description="achieved / dense peak, decode")
    prefill_efficiency: float = Field(gt=0, le=1.0, description="achieved / dense peak, prefill")
    tp_efficiency: float = Field(default=0.9, gt=0, le=1.0, description="kept under TP > 1")
    prefill_chunk_tokens: int = Field(default=8192, ge=256,
                                      description="vLLM max_num_batched_tokens")  # fmt: skip
    runtime_reserve_gb: float = Field(default=2.0, ge=0, description="activations, graphs / GPU")
    methods: dict[StepMethod, MethodCost]
    fit_error: float = Field(default=0.15, ge=0, description="relative sd of predicted speedup")
    acceptance_table: list[AcceptanceEntry] = []
    acceptance_logit: list[AcceptanceLogit] = []
    calibration: CalibrationRef

    def cost(self, method: str) -> MethodCost:
        got = self.methods.get(method)  # type: ignore[call-overload]
        if got is None:
            raise BadInput(f"profile {self.name} has no costs for method {method!r}.")
        return got


def _profiles_dir():
    return resources.files("advisor").joinpath("profiles")


def profile_names() -> list[str]:
    return sorted(
        p.name.removesuffix(".json") for p in _profiles_dir().iterdir() if p.name.endswith(".json")
    )


def _parse(text: str, where: str) -> Profile:
    try:
        return Profile.model_validate(json.loads(text))
    except json.JSONDecodeError as exc:
        raise BadInput(f"profile {where} is not valid JSON ({exc}).") from None
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(p) for p in first["loc"])
        raise BadInput(f"profile {where}: field {loc}: {first['msg']}.") from None


def get_profile(name: str) -> Profile:
    """A shipped profile by name, or a profile JSON file by path."""
    if name.endswith(".json") or "/" in name:
        p = Path(name)
        if not p.is_file():
            raise BadInput(f"profile file {p} does not exist.")
        return _parse(p.read_text(), str(p))
    names = profile_names()
    if name not in names:
        raise BadInput(f"unknown profile {name!r}; shipped profiles: {', '.join(names)}.")
    return _parse(_profiles_dir().joinpath(f"{name}.json").read_text(), name)


def load_profile(gpu: str, calibration: Profile | str | None = None) -> Profile:
    """The profile a prediction uses: a given calibration/profile, else advisor/profiles/<gpu>.json
    (measured), else the roofline defaults - whose CalibrationRef says they are unmeasured."""
    if isinstance(calibration, Profile):
        return calibration
    if calibration:
        return get_profile(calibration)
    if gpu.lower() in profile_names():
        return get_profile(gpu.lower())
    base = get_profile("roofline")
    ref = CalibrationRef(
        id="roofline",
        kind="roofline",
        description=f"no measured profile for {gpu}: datasheet roofline with default "
        "efficiencies and overheads (unmeasured; wider intervals)",
    )
    return base.model_copy(update={"gpu": gpu.lower(), "calibration": ref})
