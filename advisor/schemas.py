"""Pydantic models at the boundaries shared by the CLI, the REST API and the collectors."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel


class ImportSummary(BaseModel):
    """What one `advisor ingest` of one file did."""

    import_id: int
    file: str
    format: str
    checksum: str
    rows_read: int
    rows_accepted: int
    rows_rejected: int
    already_imported: bool = False
    started_at: datetime
    finished_at: datetime

    def sentence(self) -> str:
        """One line for the terminal."""
        if self.already_imported:
            return (
                f"{self.file} was already imported as import {self.import_id} "
                f"({self.rows_accepted} rows); nothing changed."
            )
        return (
            f"{self.file} ({self.format}): {self.rows_accepted} imported, "
            f"{self.rows_rejected} rejected (import {self.import_id})."
        )


class RejectRow(BaseModel):
    """One input row that failed validation."""

    import_id: int
    file: str
    line: int
    reason: str
    raw: str | None = None
