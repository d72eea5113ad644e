"""`advisor predict`: the what-if for one operating point (capacity planning, accuracy checks)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, get_args

import typer
from pydantic import ValidationError
from rich.table import Table

from advisor.catalog import load_catalog
from advisor.errors import BadInput
from advisor.predict import predict as run_predict
from advisor.profile import Profile
from advisor.recommend import is_stored_calibration, resolve_profile
from advisor.schemas import Deployment, Method
from cli.common import DbOption, handles_errors, open_db, out

METHODS: tuple[str, ...] = get_args(Method)
DEFAULT_DEPLOYMENT = Deployment()

# The deployment flags `predict` and `recommend` share; defaults are Deployment's own.
GpuOption = Annotated[str, typer.Option(help="GPU catalogue name (see --catalog).")]
TargetOption = Annotated[str, typer.Option(help="Model name or HF config.json path.")]
MethodOption = Annotated[str, typer.Option(help=f"One of {', '.join(METHODS)}.")]
DraftOption = Annotated[str | None, typer.Option(help="Draft model / head (name or path).")]
KOption = Annotated[str, typer.Option("--k", help="Speculative tokens 1-16, or auto.")]
UtilOption = Annotated[float, typer.Option(help="vLLM's budget fraction.")]
TpOption = Annotated[int, typer.Option(help="Tensor-parallel GPUs.")]


def parse_k(value: str) -> int | None:
    """'auto' -> None (best k), else an integer 1..16."""
    if value.strip().lower() == "auto":
        return None
    try:
        k = int(value)
    except ValueError:
        raise BadInput(f"--k {value!r} must be a whole number from 1 to 16, or auto.") from None
    if not 1 <= k <= 16:
        raise BadInput(f"--k {k} must be from 1 to 16, or auto.")
    return k


def make_deployment(
    gpu: str, target: str, method: str, draft: str | None, k: str, util: float, tp: int
) -> Deployment:
    """Validate the deployment flags into one sentence per mistake."""
    if method not in METHODS:
        raise BadInput(f"--method {method!r} is not one of {', '.join(METHODS)}.")
    try:
        return Deployment(
            gpu=gpu, target=target, method=method, draft=draft, k=parse_k(k),
            gpu_memory_utilization=util, tp=tp,
        )  # fmt: skip
    except ValidationError as exc:
        first = exc.errors()[0]
        field = str(first["loc"][0]).replace("_", "-")
        raise BadInput(f"--{field} {first.get('input')!r}: {first['msg']}.") from None


def pick_profile(gpu: str, calibration: str | None, db: Path | None) -> Profile:
    """advisor.recommend.resolve_profile, opening the database only for a stored calibration."""
    if not is_stored_calibration(calibration):
        return resolve_profile(None, gpu, calibration)
    con = open_db(db, read_only=True)
    try:
        return resolve_profile(con, gpu, calibration)
    finally:
        con.close()


@handles_errors
def predict(
    gpu: GpuOption = DEFAULT_DEPLOYMENT.gpu,
    target: TargetOption = DEFAULT_DEPLOYMENT.target,
    method: MethodOption = DEFAULT_DEPLOYMENT.method,
    draft: DraftOption = None,
    k: KOption = "auto",
    acceptance: Annotated[
        float, typer.Option(help="Per-token acceptance probability alpha in [0, 1).")
    ] = 0.7,
    batch: Annotated[int, typer.Option(help="Concurrent requests arriving together.")] = 1,
    prompt_tokens: Annotated[int, typer.Option(help="Prompt tokens per request.")] = 512,
    output_tokens: Annotated[int, typer.Option(help="Output tokens per request.")] = 256,
    gpu_memory_utilization: UtilOption = DEFAULT_DEPLOYMENT.gpu_memory_utilization,
    tp: TpOption = DEFAULT_DEPLOYMENT.tp,
    profile: Annotated[
        str | None,
        typer.Option(
            "--calibration",
            "--profile",
            help="Stored calibration id or `latest` (needs --db), a shipped profile name or a "
            "profile JSON path (default: the GPU's shipped profile, else roofline).",
        ),
    ] = None,
    catalog: Annotated[
        Path | None,
        typer.Option(help="Extra GPU/model catalogue JSON file (also ADVISOR_CATALOG)."),
    ] = None,
    format_: Annotated[str, typer.Option("--format", help="table or json.")] = "table",
    db: DbOption = None,
) -> None:
    """Predict baseline vs speculative decoding for B requests of P prompt and O output tokens."""
    if format_ not in ("table", "json"):
        raise BadInput(f"--format {format_!r} must be table or json.")
    dep = make_deployment(gpu, target, method, draft, k, gpu_memory_utilization, tp)
    cat = load_catalog(catalog)
    prof = pick_profile(dep.gpu, profile, db)
    pred = run_predict(dep, acceptance, batch, prompt_tokens, output_tokens, prof, cat)
    if format_ == "json":
        typer.echo(pred.model_dump_json(indent=2))
        return
    table = Table("", "baseline", "speculative", title=(
        f"{dep.target} on {dep.gpu} x{dep.tp}, {dep.method} k={pred.k}, acceptance "
        f"{acceptance:.2f}, batch {batch}, {prompt_tokens} -> {output_tokens} tokens"
    ))  # fmt: skip
    table.add_row("output tokens/s (batch)", f"{pred.tokens_per_s_baseline:,.0f}",
                  f"{pred.tokens_per_s_speculative:,.0f}")  # fmt: skip
    table.add_row("time per output token (ms)", f"{pred.tpot_ms_baseline:.2f}",
                  f"{pred.tpot_ms_speculative:.2f}")  # fmt: skip
    table.add_row("TTFT, whole batch (ms)", f"{pred.ttft_ms:.1f}",
                  f"{pred.ttft_ms_speculative or pred.ttft_ms:.1f}")  # fmt: skip
    out.print(table)
    m = pred.memory
    out.print(
        f"speedup {pred.speedup:.2f}x (batch tokens/s, prefill included); decode "
        f"{pred.decode_speedup:.2f}x; e2e latency {pred.e2e_latency_speedup:.2f}x; "
        f"{pred.mean_acceptance_length:.2f} tokens per verification step; verification is "
        f"{pred.verify_bound}-bound."
    )
    out.print(
        f"memory {'fits' if m.fits else 'DOES NOT FIT'}: weights {m.target_weights_gb:.1f} + "
        f"{m.draft_weights_gb:.1f} GB, KV needs {m.kv_needed_gb:.1f} of {m.kv_available_gb:.1f} GB "
        f"(budget {m.budget_gb:.0f} GB)."
    )
    out.print(f"calibration: {pred.calibration.id} ({pred.calibration.kind}): "
              f"{pred.calibration.description}")  # fmt: skip
