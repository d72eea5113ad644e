"""Advice: POST /v1/predict and POST /v1/recommendations.

The same functions and JSON as `advisor predict --format json` and `advisor recommend --format
json`: advisor.predict.predict, advisor.recommend.recommend for imported requests, and
advisor.summary.recommend_summary for a posted workload summary.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

import anyio.to_thread
from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator

from advisor.predict import predict as run_predict
from advisor.recommend import recommend as run_recommend
from advisor.schemas import Deployment, Method, Prediction, Recommendation
from advisor.scoring import THRESHOLD
from advisor.segments import Bands, Filters
from advisor.summary import WorkloadSummary, recommend_summary
from api.deps import V1, Service, ServiceDep
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
    calibration: Name | None = Field(
        None,
        description="a stored calibration id, `latest`, or a shipped profile name; "
        "null: the GPU's shipped profile, else the roofline",
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
        svc.calibrated(dep.gpu, body.calibration),
        svc.catalog,
    )


class DataRef(BaseModel):
    """Which imported requests to advise on (all of them when every field is left out)."""

    model_config = ConfigDict(extra="forbid")

    import_ids: list[int] = Field(default_factory=list, description="only these imports")
    since: datetime | None = Field(None, description="only arrivals at or after (UTC)")
    until: datetime | None = Field(None, description="only arrivals before (UTC)")
    model: str | None = Field(None, description="only requests logged for this model")
    tenant: str | None = Field(None, description="only this tenant / route")

    def filters(self) -> Filters:
        return Filters(**self.model_dump())


class RecommendationRequest(BaseModel):
    """A deployment plus either a workload summary or a reference to imported requests."""

    model_config = ConfigDict(extra="forbid")

    deployment: DeploymentIn = Field(default_factory=DeploymentIn)
    summary: WorkloadSummary | None = Field(None, description="segments with percentiles")
    data: DataRef | None = Field(None, description="imported requests: ids, time range, filters")
    bands: Bands = Field(default_factory=Bands, description="band edges and merging")
    calibration: Name | None = Field(
        None, description="a stored calibration id, `latest`, or a shipped profile name"
    )
    threshold: float = Field(
        THRESHOLD, ge=1.0, le=10.0, description="enable only when the e2e low end clears this"
    )

    @model_validator(mode="after")
    def _one_source(self) -> RecommendationRequest:
        if (self.summary is None) == (self.data is None):
            raise ValueError(
                "give exactly one of `summary` (a workload summary) and `data` (a reference to "
                "imported requests; {} means all of them)"
            )
        return self


@router.post("/recommendations", response_model=Recommendation)
async def recommendations(body: RecommendationRequest, svc: ServiceDep) -> Recommendation:
    """Per segment: enable, disable or try speculative decoding, with intervals and reasons."""
    return await anyio.to_thread.run_sync(_recommend, svc, body, limiter=svc.compute)


def _recommend(svc: Service, body: RecommendationRequest) -> Recommendation:
    dep = body.deployment.deployment()
    svc.check_names(dep)
    profile = svc.calibrated(dep.gpu, body.calibration)
    if body.summary is not None:
        return recommend_summary(
            body.summary, dep, profile, body.bands, threshold=body.threshold, catalog=svc.catalog
        )
    assert body.data is not None
    cur = svc.con.cursor()
    try:
        return run_recommend(
            cur, dep, profile, body.data.filters(), body.bands,
            threshold=body.threshold, catalog=svc.catalog,
        )  # fmt: skip
    finally:
        cur.close()
