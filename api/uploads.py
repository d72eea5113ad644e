"""Receiving a log upload: multipart or a raw body, spooled to a temp file under a size limit.

The limit is enforced while the bytes arrive (and up front from Content-Length), so an
oversized upload is refused with 413 after at most `limit` bytes, never read whole first.
"""

from __future__ import annotations

import re
import shutil
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import BinaryIO

from fastapi import HTTPException, Request
from python_multipart.multipart import MultipartParser, parse_options_header
from starlette.requests import ClientDisconnect

from advisor.errors import BadInput

DEFAULT_MAX_UPLOAD_BYTES = 1 << 30
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
# Compressed uploads without a telling file name are recognised by their magic bytes.
_MAGIC = ((b"\x1f\x8b", ".gz"), (b"\x28\xb5\x2f\xfd", ".zst"))


def safe_name(name: str | None) -> str:
    """The base name of a client-given file name, reduced to harmless characters."""
    base = _UNSAFE.sub("_", Path((name or "").replace("\\", "/")).name).strip("._")
    return base[:120] or "upload"


def _too_large(limit: int) -> HTTPException:
    return HTTPException(413, f"The upload is larger than this service's limit of {limit} bytes.")


async def _limited(request: Request, limit: int) -> AsyncIterator[bytes]:
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise _too_large(limit)
    seen = 0
    try:
        async for chunk in request.stream():
            seen += len(chunk)
            if seen > limit:
                raise _too_large(limit)
            if chunk:
                yield chunk
    except ClientDisconnect:
        raise BadInput(f"The upload stopped after {seen} bytes; nothing was imported.") from None


class _FilePart:
    """Callbacks for python-multipart: write the part named `file` to `out`, skip the rest."""

    def __init__(self, out: BinaryIO) -> None:
        self.out = out
        self.filename: str | None = None
        self.found = False
        self._field = b""
        self._value = b""
        self._disposition: bytes | None = None
        self._writing = False

    def callbacks(self) -> dict:
        return {
            "on_part_begin": self._part_begin,
            "on_header_field": self._header_field,
            "on_header_value": self._header_value,
            "on_header_end": self._header_end,
            "on_headers_finished": self._headers_finished,
            "on_part_data": self._part_data,
            "on_part_end": self._part_end,
        }

    def _part_begin(self) -> None:
        self._disposition = None

    def _header_field(self, data: bytes, start: int, end: int) -> None:
        self._field += data[start:end]

    def _header_value(self, data: bytes, start: int, end: int) -> None:
        self._value += data[start:end]

    def _header_end(self) -> None:
        if self._field.lower() == b"content-disposition":
            self._disposition = self._value
        self._field, self._value = b"", b""

    def _headers_finished(self) -> None:
        if self._disposition is None or self.found:
            return
        _, params = parse_options_header(self._disposition)
        if params.get(b"name") == b"file":
            self.found = self._writing = True
            raw = params.get(b"filename")
            self.filename = raw.decode("utf-8", "replace") if raw else None

    def _part_data(self, data: bytes, start: int, end: int) -> None:
        if self._writing:
            self.out.write(data[start:end])

    def _part_end(self) -> None:
        self._writing = False


async def _receive_multipart(request: Request, out: BinaryIO, limit: int) -> str | None:
    _, params = parse_options_header(request.headers.get("content-type", ""))
    boundary = params.get(b"boundary")
    if not boundary:
        raise BadInput("The multipart upload has no boundary in its Content-Type header.")
    part = _FilePart(out)
    parser = MultipartParser(boundary, part.callbacks())
    try:
        async for chunk in _limited(request, limit):
            parser.write(chunk)
        parser.finalize()
    except HTTPException:
        raise
    except Exception as exc:  # python-multipart raises its own and ValueError subclasses
        raise BadInput(f"The multipart upload cannot be parsed: {exc}.") from None
    if not part.found:
        raise BadInput("The multipart upload has no part named 'file'; send the log as 'file'.")
    return part.filename


async def _receive_raw(request: Request, out: BinaryIO, limit: int) -> None:
    async for chunk in _limited(request, limit):
        out.write(chunk)


@asynccontextmanager
async def spooled_upload(
    request: Request, filename: str | None, limit: int
) -> AsyncIterator[tuple[Path, str]]:
    """Yield (temp path, client file name) for the uploaded log; the temp folder is removed after.

    The temp file keeps the client's file name, so `.gz`/`.zst` uploads are read decompressed.
    """
    folder = Path(tempfile.mkdtemp(prefix="advisor-upload-"))
    try:
        spool = folder / "body"
        with spool.open("wb") as out:
            if request.headers.get("content-type", "").startswith("multipart/form-data"):
                filename = await _receive_multipart(request, out, limit) or filename
            else:
                await _receive_raw(request, out, limit)
        if spool.stat().st_size == 0:
            raise BadInput("The upload is empty; send a log file as the body or as part 'file'.")
        name = safe_name(filename)
        with spool.open("rb") as f:
            head = f.read(4)
        for magic, suffix in _MAGIC:
            if head.startswith(magic) and not name.endswith(suffix):
                name += suffix
        path = folder / name
        spool.rename(path)
        yield path, name
    finally:
        shutil.rmtree(folder, ignore_errors=True)
