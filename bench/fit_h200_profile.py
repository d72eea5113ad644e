"""Fit the shipped H200 profile (advisor/profiles/h200.json) from the committed sweep.

Why: the default profile for `--gpu h200` must come from measurements, and anyone must be able
to re-fit it without a GPU. Input: bench/data/h200_sweep.jsonl (bench/h200_sweep.py on one H200,
vLLM 0.26.0). Usage: python bench/fit_h200_profile.py [--check]
(--check fits and reports without writing the profile).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # runs from a checkout without installing the package

from advisor.profile import Profile, get_profile  # noqa: E402
from calibration.step_fit import StepFit, StepMeasurement, fit_profile  # noqa: E402

SWEEP = ROOT / "bench" / "data" / "h200_sweep.jsonl"
PROFILE = ROOT / "advisor" / "profiles" / "h200.json"
PREFILL_CHUNK_TOKENS = 16384  # the sweep's max_num_batched_tokens


def load_sweep(path: Path = SWEEP) -> tuple[dict, list[dict]]:
    """(header record, point records) of the sweep file."""
    lines = [json.loads(s) for s in path.read_text().splitlines() if s.strip()]
    header = next(r for r in lines if r["type"] == "header")
    return header, [r for r in lines if r["type"] == "point"]


def measurement(r: dict) -> StepMeasurement:
    """One sweep point as the fit's input record."""
    spec = r["method"] != "baseline"
    return StepMeasurement(
        gpu="h200",
        target=r["target"],
        method=r["method"],
        draft=r["draft"] if r["method"] == "draft_model" else None,
        k=r["k"] if spec else 0,
        batch=r["batch"],
        prompt_tokens=r["prompt_tokens"],
        output_tokens=r["output_tokens"],
        wall_s=r["wall_s"],
        mean_acceptance_length=r["mean_acceptance_length"] if spec else None,
        source=f"{r['config']} a={r['acceptance_set']}",
    )


# Methods the sweep did not run. vLLM 0.26 drives EAGLE-1 and MTP heads through the same
# proposer as EAGLE-3, so they take EAGLE-3's fitted costs; ngram and suffix keep the roofline
# defaults (unmeasured), as the profile's description says.
SAME_AS_EAGLE3 = ("eagle", "mtp")


def _rounded(x: float) -> float:
    """Six significant digits; fitted values at a zero bound come back as about 1e-11."""
    return 0.0 if abs(x) < 1e-6 else float(f"{x:.6g}")


def shipped(fit: StepFit) -> Profile:
    """The fitted profile as shipped: EAGLE-3 costs copied to EAGLE/MTP, numbers rounded."""
    prof = fit.profile
    methods = dict(prof.methods)
    for m in SAME_AS_EAGLE3:
        methods[m] = methods["eagle3"]
    methods = {
        m: c.model_copy(update={k: _rounded(v) for k, v in c.model_dump().items()})
        for m, c in methods.items()
    }
    top = {
        k: _rounded(getattr(prof, k))
        for k in (
            "bandwidth_efficiency",
            "kv_bandwidth_efficiency",
            "compute_efficiency",
            "prefill_efficiency",
            "roofline_sharpness",
        )
    }
    return prof.model_copy(update={**top, "methods": methods})


def fit_h200(points: list[StepMeasurement], header: dict) -> StepFit:
    """The H200 fit: roofline defaults as the start, every measured method's costs free."""
    configs = sorted({p.source.split(" ")[0] for p in points})
    desc = (
        f"Fitted on {len(points)} batches measured on one {header['gpu']} with vLLM "
        f"{header['vllm_version']} ({header['date']}; bench/data/h200_sweep.jsonl): "
        f"{', '.join(configs)}. Dummy weights, synthetic acceptance, CUDA graphs for decode, "
        "no torch.compile, max_num_batched_tokens 16384. Measured methods: baseline, eagle3, "
        "draft_model; eagle and mtp reuse eagle3's costs; ngram and suffix keep the roofline "
        "defaults."
    )
    return fit_profile(
        points,
        get_profile("roofline"),
        name="h200",
        gpu="h200",
        description=desc,
        prefill_chunk_tokens=PREFILL_CHUNK_TOKENS,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="report only; do not write h200.json")
    args = ap.parse_args()
    header, rows = load_sweep()
    points = [measurement(r) for r in rows]
    fit = fit_h200(points, header)
    print(f"converged: {fit.converged} ({fit.message})")
    for name, value in fit.parameters.items():
        print(f"  {name:40s} {value:10.5f}")
    print("wall time   n   median  p90     R^2")
    for m, q in {**fit.wall, "all": fit.wall_all}.items():
        print(f"  {m:12s} {q.n:3d} {q.median_rel_error:6.3f} {q.p90_rel_error:6.3f} {q.r2}")
    print("speedup     n   median  p90     R^2")
    for m, q in fit.speedup.items():
        print(f"  {m:12s} {q.n:3d} {q.median_rel_error:6.3f} {q.p90_rel_error:6.3f} {q.r2}")
    if not args.check:
        PROFILE.write_text(shipped(fit).model_dump_json(indent=2) + "\n")
        print(f"wrote {PROFILE.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
