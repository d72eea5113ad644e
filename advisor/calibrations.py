"""Reading stored calibrations: list, get, compare, and the Profile a calibration fitted.

The advisor, the CLI and the API read calibrations through this module only, so none of them
needs the calibration package (which talks to vLLM). A partial calibration (a run that ended
early) is never used without the caller saying so.
"""

from __future__ import annotations

import json
import math
from datetime import datetime
from typing import Literal

import duckdb
from pydantic import BaseModel, ValidationError

from advisor.errors import BadInput
from advisor.profile import Profile
from advisor.schemas import CalibrationRef, Recommendation, Verdict
from advisor.store import scalar

_SUMMARY_COLUMNS = (
    "c.id, c.created_at, c.finished_at, c.status, c.stop_reason, c.gpu, c.vllm_version,"
    " c.target, c.draft, c.method, c.k, c.notes,"
    " (SELECT count(*) FROM calibration_segments s WHERE s.calibration_id = c.id),"
    " (SELECT count(*) FROM calibration_samples r WHERE r.calibration_id = c.id)"
)


class CalibrationSummary(BaseModel):
    """One line of `advisor calibrations list`."""

    id: int
    created_at: datetime
    finished_at: datetime
    status: Literal["complete", "partial"]
    stop_reason: str | None
    gpu: str
    vllm_version: str | None
    target: str
    draft: str | None
    method: str
    k: int
    notes: str | None
    n_segments: int
    n_samples: int

    def describe(self) -> str:
        """One phrase naming what was calibrated, for CalibrationRef and headings."""
        draft = f" + {self.draft}" if self.draft else ""
        version = f", vLLM {self.vllm_version}" if self.vllm_version else ""
        partial = " (PARTIAL)" if self.status == "partial" else ""
        return (
            f"calibration {self.id}{partial}: {self.target}{draft} {self.method} k={self.k} "
            f"on {self.gpu}{version}, {self.finished_at:%Y-%m-%d %H:%M} UTC"
        )


class SegmentMeasurement(BaseModel):
    """What one replayed segment measured (a `calibration_segments` row)."""

    segment_key: str
    task: str | None
    temperature: float | None
    prompt_tokens: float | None
    output_tokens: float | None
    concurrency: int | None
    n_requests: int
    acceptance_rate: float | None
    mean_acceptance_length: float | None
    alpha: float | None
    accepted_per_pos: list[int] | None
    baseline_tpot_ms: float | None
    speculative_tpot_ms: float | None
    baseline_e2e_ms: float | None
    speculative_e2e_ms: float | None

    @property
    def decode_speedup(self) -> float | None:
        """Measured baseline TPOT over speculative TPOT (medians)."""
        if not self.baseline_tpot_ms or not self.speculative_tpot_ms:
            return None
        return self.baseline_tpot_ms / self.speculative_tpot_ms

    @property
    def e2e_speedup(self) -> float | None:
        """Measured baseline e2e over speculative e2e (medians)."""
        if not self.baseline_e2e_ms or not self.speculative_e2e_ms:
            return None
        return self.baseline_e2e_ms / self.speculative_e2e_ms


class StoredCalibration(CalibrationSummary):
    """A calibration with its settings, fitted profile, fit quality and segments."""

    settings: dict[str, object]
    profile: dict[str, object]
    fit: dict[str, object]
    segments: list[SegmentMeasurement]

    def ref(self) -> CalibrationRef:
        """How a recommendation names the calibration it used."""
        return CalibrationRef(id=str(self.id), kind="calibration", description=self.describe())


class Drift(BaseModel):
    """One fitted parameter in two calibrations."""

    parameter: str
    a: float | None
    b: float | None

    @property
    def change_pct(self) -> float | None:
        """Relative change from a to b, percent; None when either is missing or a is 0."""
        if self.a is None or self.b is None or self.a == 0:
            return None
        return 100.0 * (self.b - self.a) / abs(self.a)


def _has_tables(con: duckdb.DuckDBPyConnection) -> bool:
    """False on a database created before calibrations existed and opened read-only."""
    return bool(
        scalar(
            con,
            "SELECT count(*) FROM information_schema.tables WHERE table_name = 'calibrations'",
        )
    )


def list_calibrations(con: duckdb.DuckDBPyConnection) -> list[CalibrationSummary]:
    """Every stored calibration, oldest first."""
    if not _has_tables(con):
        return []
    rows = con.execute(f"SELECT {_SUMMARY_COLUMNS} FROM calibrations c ORDER BY c.id").fetchall()
    return [_summary(row) for row in rows]


def _summary(row: tuple) -> CalibrationSummary:
    names = list(CalibrationSummary.model_fields)
    return CalibrationSummary(**dict(zip(names, row, strict=True)))


def resolve_id(con: duckdb.DuckDBPyConnection, calibration_id: str | int) -> int:
    """A calibration id from user input: a number, or `latest` (newest complete one)."""
    known = list_calibrations(con)
    if str(calibration_id).strip().lower() == "latest":
        complete = [c.id for c in known if c.status == "complete"]
        if not complete:
            raise BadInput(
                "There is no complete calibration in this database; run `advisor calibrate` first."
            )
        return complete[-1]
    try:
        wanted = int(str(calibration_id).strip())
    except ValueError:
        raise BadInput(
            f"Calibration id {calibration_id!r} is not a number; "
            "expected an id from `advisor calibrations list` or `latest`."
        ) from None
    if wanted not in {c.id for c in known}:
        ids = ", ".join(str(c.id) for c in known) or "none yet; run `advisor calibrate`"
        raise BadInput(f"There is no calibration {wanted} in this database (known: {ids}).")
    return wanted


def get_calibration(con: duckdb.DuckDBPyConnection, calibration_id: str | int) -> StoredCalibration:
    """One calibration with everything stored about it; BadInput for an unknown id."""
    cal_id = resolve_id(con, calibration_id)
    row = con.execute(
        f"SELECT {_SUMMARY_COLUMNS}, c.settings, c.profile, c.fit FROM calibrations c"
        " WHERE c.id = ?",
        [cal_id],
    ).fetchall()[0]
    summary = _summary(row[:14])
    segments = con.execute(
        "SELECT segment_key, task, temperature, prompt_tokens, output_tokens, concurrency,"
        " n_requests, acceptance_rate, mean_acceptance_length, alpha, accepted_per_pos,"
        " baseline_tpot_ms, speculative_tpot_ms, baseline_e2e_ms, speculative_e2e_ms"
        " FROM calibration_segments WHERE calibration_id = ? ORDER BY segment_key",
        [cal_id],
    ).fetchall()
    names = list(SegmentMeasurement.model_fields)
    measured = []
    for seg in segments:
        fields = dict(zip(names, seg, strict=True))
        per_pos = fields["accepted_per_pos"]
        fields["accepted_per_pos"] = json.loads(per_pos) if per_pos else None
        measured.append(SegmentMeasurement(**fields))
    return StoredCalibration(
        **summary.model_dump(),
        settings=json.loads(row[14]),
        profile=json.loads(row[15]),
        fit=json.loads(row[16]),
        segments=measured,
    )


def usable(cal: StoredCalibration, *, allow_partial: bool = False) -> StoredCalibration:
    """The calibration itself, or BadInput when it is partial and that was not allowed."""
    if cal.status == "partial" and not allow_partial:
        why = f" ({cal.stop_reason})" if cal.stop_reason else ""
        raise BadInput(
            f"Calibration {cal.id} is partial{why}: it measured only {len(cal.segments)} "
            "segment(s), so it is not used unless you pass --allow-partial "
            "(or run `advisor calibrate` again to completion)."
        )
    return cal


def profile_for(
    con: duckdb.DuckDBPyConnection, calibration_id: str | int, *, allow_partial: bool = False
) -> Profile:
    """The Profile a stored calibration fitted, naming that calibration as its source.

    BadInput for an unknown id, for a partial calibration unless `allow_partial`, and for a
    stored profile this version of the advisor cannot read.
    """
    cal = usable(get_calibration(con, calibration_id), allow_partial=allow_partial)
    try:
        fitted = Profile.model_validate(cal.profile)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise BadInput(
            f"Calibration {cal.id} stores a profile this advisor cannot read (field {where}: "
            f"{first['msg']}); run `advisor calibrate` again."
        ) from None
    return fitted.model_copy(update={"calibration": cal.ref()})


def _numeric_leaves(value: object, prefix: str = "") -> dict[str, float]:
    """Flatten nested dicts/lists to dotted paths of their numbers."""
    found: dict[str, float] = {}
    if isinstance(value, bool):
        return found
    if isinstance(value, int | float):
        if math.isfinite(value):
            found[prefix] = float(value)
    elif isinstance(value, dict):
        for key, item in value.items():
            found.update(_numeric_leaves(item, f"{prefix}.{key}" if prefix else str(key)))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            found.update(_numeric_leaves(item, f"{prefix}[{i}]"))
    return found


def parameter_drift(a: StoredCalibration, b: StoredCalibration) -> list[Drift]:
    """Every fitted number that differs between the two profiles, largest relative move first."""
    left, right = _numeric_leaves(a.profile), _numeric_leaves(b.profile)
    drifts = [
        Drift(parameter=name, a=left.get(name), b=right.get(name))
        for name in sorted(left.keys() | right.keys())
        if left.get(name) != right.get(name)
    ]
    return sorted(drifts, key=lambda d: -abs(d.change_pct) if d.change_pct is not None else -1e18)


class VerdictFlip(BaseModel):
    """A segment whose verdict differs under calibrations a and b, on the same traffic."""

    segment: str
    share: float
    a: Verdict
    b: Verdict
    e2e_speedup_a: float
    e2e_speedup_b: float


class VerdictComparison(BaseModel):
    """Two recommendations for the same traffic under calibrations a and b, segment by segment."""

    segments_compared: int
    flips: list[VerdictFlip]  # largest share first
    only_under_one: list[str]  # segments that exist under one calibration only


def compare_verdicts(a: Recommendation, b: Recommendation) -> VerdictComparison:
    """Which segments' verdicts flip from `a` to `b`. Segments are matched by key; estimated
    concurrency can differ between profiles, so a few may exist under one of them only."""
    by_a = {v.stats.key: v for v in a.segments}
    by_b = {v.stats.key: v for v in b.segments}
    both = by_a.keys() & by_b.keys()
    flips = [
        VerdictFlip(
            segment=key,
            share=va.share,
            a=va.verdict,
            b=vb.verdict,
            e2e_speedup_a=va.e2e_speedup.value,
            e2e_speedup_b=vb.e2e_speedup.value,
        )
        for key in sorted(both, key=lambda k: -by_a[k].share)
        if (va := by_a[key]).verdict != (vb := by_b[key]).verdict
    ]
    return VerdictComparison(
        segments_compared=len(both),
        flips=flips,
        only_under_one=sorted(by_a.keys() ^ by_b.keys()),
    )
