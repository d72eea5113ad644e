"""Stored calibrations (advisor.calibrations readers): list, one, and what moved between two."""

from __future__ import annotations

from fastapi import APIRouter, HTTPException
from pydantic import BaseModel

from advisor.calibrations import (
    CalibrationSummary,
    StoredCalibration,
    get_calibration,
    list_calibrations,
    parameter_drift,
)
from api.deps import V1, Db
from api.errors import ERROR_RESPONSES, ErrorBody

router = APIRouter(prefix=V1, tags=["calibrations"], responses=ERROR_RESPONSES)
_NOT_FOUND = {404: {"model": ErrorBody, "description": "No such calibration."}}


class DriftOut(BaseModel):
    """One fitted parameter in calibrations a and b, and its relative change."""

    parameter: str
    a: float | None
    b: float | None
    change_pct: float | None


class CalibrationDiff(BaseModel):
    """`advisor calibrations diff A B`: the two calibrations and every fitted number that moved."""

    a: CalibrationSummary
    b: CalibrationSummary
    drift: list[DriftOut]


def _get(con: Db, calibration_id: str) -> StoredCalibration:
    """`latest` or a known id; an unknown numeric id is 404 (its message lists the known ids)."""
    wanted = calibration_id.strip()
    if wanted.isdigit() and int(wanted) not in {c.id for c in list_calibrations(con)}:
        known = ", ".join(str(c.id) for c in list_calibrations(con)) or "none yet"
        raise HTTPException(404, f"There is no calibration {int(wanted)} (known: {known}).")
    return get_calibration(con, wanted)


@router.get("/calibrations", response_model=list[CalibrationSummary])
def calibrations(con: Db) -> list[CalibrationSummary]:
    """Every stored calibration, oldest first."""
    return list_calibrations(con)


@router.get(
    "/calibrations/{calibration_id}", response_model=StoredCalibration, responses=_NOT_FOUND
)
def calibration(calibration_id: str, con: Db) -> StoredCalibration:
    """One calibration (an id, or `latest` for the newest complete one) with its fit."""
    return _get(con, calibration_id)


@router.get("/calibrations/{a}/diff/{b}", response_model=CalibrationDiff, responses=_NOT_FOUND)
def diff(a: str, b: str, con: Db) -> CalibrationDiff:
    """What moved from calibration a to b: each fitted parameter, largest relative change first."""
    left, right = _get(con, a), _get(con, b)
    drift = [
        DriftOut(parameter=d.parameter, a=d.a, b=d.b, change_pct=d.change_pct)
        for d in parameter_drift(left, right)
    ]
    return CalibrationDiff(
        a=CalibrationSummary(**left.model_dump(include=set(CalibrationSummary.model_fields))),
        b=CalibrationSummary(**right.model_dump(include=set(CalibrationSummary.model_fields))),
        drift=drift,
    )
