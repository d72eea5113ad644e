"""API keys: created and revoked by `advisor keys`, checked on every /v1 request.

A key is `sa_<key_id>_<secret>`; only the sha256 of the whole key is stored. A salted slow hash
is not needed: the secret is 256 random bits, so there is nothing to brute-force.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime

import duckdb
from fastapi import HTTPException, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel

from advisor.errors import BadInput
from advisor.store import one, transaction

_PREFIX = "sa_"
bearer = HTTPBearer(auto_error=False, description="An API key from `advisor keys create`.")


class KeyInfo(BaseModel):
    """One stored key, without its secret."""

    key_id: str
    name: str
    created_at: datetime
    revoked_at: datetime | None = None


def _hash(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def _now() -> datetime:
    return datetime.now(UTC).replace(tzinfo=None)


def create_key(con: duckdb.DuckDBPyConnection, name: str) -> tuple[KeyInfo, str]:
    """Store a new key and return it with its plain text, which is shown once and never again."""
    if not name.strip():
        raise BadInput("A key needs a non-empty --name saying who or what uses it.")
    key_id = secrets.token_hex(4)
    key = f"{_PREFIX}{key_id}_{secrets.token_urlsafe(32)}"
    info = KeyInfo(key_id=key_id, name=name.strip(), created_at=_now())
    with transaction(con):
        con.execute(
            "INSERT INTO api_keys VALUES (?, ?, ?, ?, NULL)",
            [info.key_id, info.name, _hash(key), info.created_at],
        )
    return info, key


def revoke_key(con: duckdb.DuckDBPyConnection, key_id: str) -> KeyInfo:
    """Mark a key revoked (kept for the record); BadInput when there is no such key."""
    row = one(con, "SELECT revoked_at FROM api_keys WHERE key_id = ?", [key_id])
    if row is None:
        known = ", ".join(k.key_id for k in list_keys(con)) or "none"
        raise BadInput(f"No API key with id '{key_id}'; known ids: {known}.")
    if row[0] is None:
        with transaction(con):
            con.execute("UPDATE api_keys SET revoked_at = ? WHERE key_id = ?", [_now(), key_id])
    return next(k for k in list_keys(con) if k.key_id == key_id)


def list_keys(con: duckdb.DuckDBPyConnection) -> list[KeyInfo]:
    """Every key ever created, oldest first."""
    rows = con.execute(
        "SELECT key_id, name, created_at, revoked_at FROM api_keys ORDER BY created_at, key_id"
    ).fetchall()
    return [KeyInfo(key_id=r[0], name=r[1], created_at=r[2], revoked_at=r[3]) for r in rows]


@dataclass(frozen=True)
class KeyRing:
    """The keys the service accepts, read once at start-up.

    Reading them once is exact, not a cache: DuckDB lets one process open the file, so
    `advisor keys` cannot change them while the service runs (restart it to apply a change).
    """

    active: frozenset[str]
    any_key: bool

    @classmethod
    def load(cls, con: duckdb.DuckDBPyConnection) -> KeyRing:
        rows = con.execute("SELECT key_hash, revoked_at FROM api_keys").fetchall()
        return cls(frozenset(h for h, revoked in rows if revoked is None), bool(rows))

    def check(self, key: str) -> bool:
        """True for an active key; compares digests in constant time."""
        digest = _hash(key)
        return any(secrets.compare_digest(digest, known) for known in self.active)


def require_key(request: Request, credentials: HTTPAuthorizationCredentials | None) -> None:
    """401 without a bearer key, 403 with a wrong or revoked one, once any key exists."""
    ring: KeyRing = request.app.state.service.keys
    if not ring.any_key:
        return
    if credentials is None or credentials.scheme.lower() != "bearer":
        raise HTTPException(
            401,
            "This service needs an API key: send 'Authorization: Bearer KEY'.",
            headers={"WWW-Authenticate": "Bearer"},
        )
    if not ring.check(credentials.credentials):
        raise HTTPException(403, "The API key is not valid or has been revoked.")
