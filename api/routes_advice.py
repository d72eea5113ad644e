"""Advice: POST /v1/predict, the same function and JSON as `advisor predict --format json`."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from advisor.predict import predict as run_predict
from advisor.schemas import Deployment, Method, Prediction
from api.deps import V1, ServiceDep
from api.errors import ERROR_RESPONSES

router = APIRouter(prefix=V1, tags=["advice"], responses=ERROR_RESPONSES)

# A catalogue or profile name. The CLI also accepts file paths in these places; over HTTP only
# names are taken (api.deps.Service.check_names), so a client cannot make the server read files.
Name = Annotated[
    str, StringConstraints(min_length=1, max_length=100, pattern=r"^[A-Za-z0-9][A-Za-z0-9._+-]*$")
]


class DeploymentIn(BaseModel):
    """What is served and how speculation would be configured."""

    model_config = ConfigDict(extra="forbid")

    gpu: Name = Field("h200", description="GPU catalogue name")
    target: Name = Field("llama-3.1-8b", description="target model catalogue name")
    method: Method = "eagle3"
    draft: Name | None = Field(None, description="draft model or head; null: the method's default")
    k: int | None = Field(None, ge=1, le=16, description="speculative tokens; null: the best k")
    gpu_memory_utilization: float = Field(0.9, gt=0.0, le=1.0)
    tp: int = Field(1, ge=1, le=64, description="tensor-parallel GPUs")

    def deployment(self) -> Deployment:
        return Deployment(**self.model_dump())


class PredictRequest(DeploymentIn):
    """`advisor predict`'s flags as a body: B requests arriving together, P prompt, O output."""

    acceptance: float = Field(0.7, ge=0.0, lt=1.0, description="per-token acceptance alpha")
    batch: int = Field(1, ge=1, le=4096, description="concurrent requests arriving together")
    prompt_tokens: int = Field(512, ge=1, le=1_048_576)
    output_tokens: int = Field(256, ge=1, le=1_048_576)
    profile: Name | None = Field(
        None, description="shipped profile name; null: the GPU's profile, else the roofline"
    )


@router.post("/predict", response_model=Prediction)
async def predict(body: PredictRequest, svc: ServiceDep) -> Prediction:
    """Predict baseline vs speculative decoding for one operating point."""
    # Runs on the event loop, not in a worker thread: it is ~1 ms of pure Python with no I/O,
    # and a thread hop plus GIL hand-offs would cost more than that under load.
    dep = body.deployment()
    svc.check_names(dep)
    return run_predict(
        dep,
        body.acceptance,
        body.batch,
        body.prompt_tokens,
        body.output_tokens,
        svc.profile(dep.gpu, body.profile),
        svc.catalog,
    )
