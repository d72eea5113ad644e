"""How well does `advisor predict` predict measured speedups on configurations it was not fitted on?

Why: a recommendation is worth its prediction error. Whole configurations of the H200 sweep
(bench/data/h200_sweep.jsonl) are held out - every point of one k, one prompt length, one batch
size, one acceptance, or the second target size - the profile is fitted on the rest
(bench/fit_h200_profile.py's fit), and advisor.predict.predict's `speedup` (tokens/s of the
batch, prefill included, speculative over baseline) is compared with the measured ratio of the
same batch on the speculative and the baseline engine. The acceptance given to predict is the
one that reproduces the measured mean acceptance length, so the figures measure the step-cost
model, not the acceptance prior.

Target (issue 5): median absolute error <= 8%, and no prediction on the wrong side of 1.0 where
the measurement is more than 5% away from it.

Usage: python bench/accuracy.py [--markdown]      (no GPU; a few seconds per held-out fit)
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # a checkout, not installed

from fit_h200_profile import fit_h200, load_sweep, measurement

from advisor.predict import predict
from advisor.profile import Profile
from advisor.schemas import Deployment
from calibration.step_fit import StepMeasurement, alpha_for

Holdout = tuple[str, Callable[[dict], bool]]
HOLDOUTS: list[Holdout] = [
    ("k=1", lambda r: r["k"] == 1),
    ("k=5", lambda r: r["k"] == 5),
    ("prompt 4096", lambda r: r["prompt_tokens"] == 4096),
    ("prompt 8192", lambda r: r["prompt_tokens"] == 8192),
    ("batch 128", lambda r: r["batch"] == 128),
    ("acceptance 0.4", lambda r: r["acceptance_set"] == 0.4),
    ("target qwen2.5-14b", lambda r: r["target"] == "qwen2.5-14b"),
]


@dataclass(frozen=True)
class Case:
    """One speculative point: the measured and the predicted speedup."""

    holdout: str
    config: str
    method: str
    measured: float
    predicted: float

    @property
    def rel_error(self) -> float:
        return abs(self.predicted / self.measured - 1.0)

    def same_side(self, line: float) -> bool:
        return (self.predicted > line) == (self.measured > line)

    @property
    def serious_miss(self) -> bool:
        """Wrong side of 1.0 although the measurement is more than 5% away from it."""
        return not self.same_side(1.0) and abs(self.measured - 1.0) > 0.05


def predicted_speedup(p: StepMeasurement, profile: Profile) -> float:
    """`advisor predict`'s speedup for the measured batch, at the measured acceptance length."""
    assert p.mean_acceptance_length is not None
    dep = Deployment(gpu=p.gpu, target=p.target, method=p.method, draft=p.draft, k=p.k)
    alpha = alpha_for(p.mean_acceptance_length, p.k, profile.cost(p.method).position_decay)
    pred = predict(
        dep,
        acceptance=min(alpha, 0.998),
        batch=p.batch,
        prompt_tokens=round(p.prompt_tokens),
        output_tokens=round(p.output_tokens),
        profile=profile,
    )
    return pred.speedup


def cases(holdout: str, rows: list[dict], all_rows: list[dict], profile: Profile) -> list[Case]:
    """Every speculative row of `rows` with a measured baseline of the same batch (looked up in
    `all_rows`: held out or not, it is a measurement), predicted under `profile`."""
    base = {p.pair_key(): p.wall_s for p in map(measurement, all_rows) if p.method == "baseline"}
    out = []
    for r in rows:
        p = measurement(r)
        if p.method == "baseline" or p.pair_key() not in base:
            continue
        measured = base[p.pair_key()] / p.wall_s
        out.append(Case(holdout, r["config"], p.method, measured, predicted_speedup(p, profile)))
    return out


def evaluate() -> tuple[list[Case], list[Case], dict]:
    """(held-out cases over all hold-outs, in-sample cases of the full fit, header)."""
    header, rows = load_sweep()
    held: list[Case] = []
    for name, out in HOLDOUTS:
        train = [measurement(r) for r in rows if not out(r)]
        fit = fit_h200(train, header)
        held += cases(name, [r for r in rows if out(r)], rows, fit.profile)
    full = fit_h200([measurement(r) for r in rows], header)
    return held, cases("in-sample", rows, rows, full.profile), header


def summary(cs: list[Case]) -> dict[str, float]:
    errs = [c.rel_error for c in cs]
    return {
        "n": len(cs),
        "median": statistics.median(errs),
        "p90": float(np.quantile(errs, 0.9)),
        "side_1.0": sum(c.same_side(1.0) for c in cs) / len(cs),
        "side_1.1": sum(c.same_side(1.1) for c in cs) / len(cs),
        "serious": sum(c.serious_miss for c in cs),
        "measured_range": (min(c.measured for c in cs), max(c.measured for c in cs)),
    }


def table(groups: dict[str, list[Case]]) -> list[str]:
    lines = [
        "| group | n | median abs error | p90 abs error | same side of 1.0 | same side of 1.1 "
        "| wrong side of 1.0, measured >5% away | measured speedups |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, cs in groups.items():
        if not cs:
            continue
        s = summary(cs)
        lo, hi = s["measured_range"]
        lines.append(
            f"| {name} | {s['n']} | {s['median']:.1%} | {s['p90']:.1%} | {s['side_1.0']:.0%} "
            f"| {s['side_1.1']:.0%} | {s['serious']} | {lo:.2f}-{hi:.2f} |"
        )
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--markdown", action="store_true", help="print only the markdown tables")
    args = ap.parse_args()
    held, insample, header = evaluate()
    methods = sorted({c.method for c in held})
    per_method = {f"held out, {m}": [c for c in held if c.method == m] for m in methods}
    per_holdout = {
        f"{h} ({m})": [c for c in held if c.holdout == h and c.method == m]
        for h, _ in HOLDOUTS
        for m in methods
    }
    in_sample = {f"in sample, {m}": [c for c in insample if c.method == m] for m in methods}
    if not args.markdown:
        print(f"sweep: {header['gpu']}, vLLM {header['vllm_version']}, {header['date']}")
    print("\n".join(table({**per_method, **in_sample})))
    print()
    print("\n".join(table(per_holdout)))
    misses = [c for c in held if c.serious_miss]
    for c in misses:
        print(
            f"serious miss: {c.holdout} {c.config} measured {c.measured:.3f} "
            f"predicted {c.predicted:.3f}"
        )


if __name__ == "__main__":
    main()
