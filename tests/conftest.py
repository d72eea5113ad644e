"""Shared fixtures: real DuckDB files in tmp_path, the real traces in ../shared/data, the CLI."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SHARED_DATA = ROOT.parent / "shared" / "data"
AZURE_2023 = SHARED_DATA / "azure-llm-2023"


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "advisor.duckdb"


@pytest.fixture
def con(db_path: Path):
    from advisor.store import connect

    connection = connect(db_path)
    yield connection
    connection.close()


def run_cli(
    *args: str, db: Path | None = None, input_text: str | None = None, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    """Run the real `advisor` command in a subprocess, as a user would."""
    env = dict(os.environ)
    env.pop("ADVISOR_DB", None)
    cmd = [sys.executable, "-m", "cli", *args]
    if db is not None:
        cmd += ["--db", str(db)]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, input=input_text,
                          timeout=timeout)  # fmt: skip
