"""The REST service over real HTTP: uvicorn on a free loopback port, httpx as the client."""

from __future__ import annotations

import gzip
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path

import duckdb
import httpx
import pytest
import uvicorn

from advisor.store import connect
from api.app import create_app
from api.auth import create_key, revoke_key
from tests.conftest import AZURE_2023, ROOT

CODE_CSV = AZURE_2023 / "code.csv"


@contextmanager
def serve(db_path: Path, **app_kwargs) -> Iterator[str]:
    """Run the real app under uvicorn in a thread on a socket bound to a free port."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    app = create_app(db_path, **app_kwargs)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:
        if not thread.is_alive():
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()


@pytest.fixture
def base_url(db_path: Path) -> Iterator[str]:
    with serve(db_path) as url:
        yield url


@pytest.fixture
def client(base_url: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=base_url, timeout=120) as c:
        yield c


def _no_trace(response: httpx.Response) -> None:
    assert "Traceback" not in response.text
    assert 'File "' not in response.text


# --- operations ---------------------------------------------------------------------------


def test_health_ready_and_metrics_count_requests(client: httpx.Client) -> None:
    assert client.get("/healthz").json() == {"status": "ok"}
    ready = client.get("/readyz").json()
    assert ready["status"] == "ready" and ready["schema_version"] >= 3
    for _ in range(3):
        assert client.get("/v1/imports").status_code == 200
    assert client.get("/v1/imports/12345").status_code == 404
    text = client.get("/metrics").text
    assert 'advisor_http_requests_total{method="GET",route="/v1/imports",status="200"} 3.0' in text
    assert 'route="/v1/imports/{import_id}",status="404"} 1.0' in text
    assert 'advisor_http_request_duration_seconds_count{method="GET",route="/v1/imports"}' in text


def test_openapi_document_lists_versioned_routes(client: httpx.Client) -> None:
    doc = client.get("/openapi.json").json()
    paths = set(doc["paths"])
    assert {"/v1/imports", "/v1/imports/{import_id}", "/v1/imports/{import_id}/rejects"} <= paths
    assert {"/healthz", "/readyz", "/metrics", "/v1/jobs/{job_id}"} <= paths
    upload = doc["paths"]["/v1/imports"]["post"]["requestBody"]["content"]
    assert {"multipart/form-data", "application/octet-stream"} <= set(upload)


# --- advice -------------------------------------------------------------------------------


def test_predict_returns_what_advisor_predict_prints(client: httpx.Client) -> None:
    body = {"gpu": "h100", "method": "draft_model", "draft": "llama-3.2-1b", "k": 3,
            "acceptance": 0.6, "batch": 4, "prompt_tokens": 1024, "output_tokens": 128}  # fmt: skip
    r = client.post("/v1/predict", json=body)
    assert r.status_code == 200, r.text
    cli = subprocess.run(
        [sys.executable, "-m", "cli", "predict", "--gpu", "h100", "--method", "draft_model",
         "--draft", "llama-3.2-1b", "--k", "3", "--acceptance", "0.6", "--batch", "4",
         "--prompt-tokens", "1024", "--output-tokens", "128", "--format", "json"],
        capture_output=True, text=True, cwd=ROOT, timeout=120,
    )  # fmt: skip
    assert cli.returncode == 0, cli.stderr
    assert r.json() == json.loads(cli.stdout)
    auto = client.post("/v1/predict", json={"batch": 2}).json()
    assert 1 <= auto["k"] <= 16 and auto["deployment"]["k"] is None


@pytest.mark.parametrize(
    ("body", "names"),
    [
        ({"gpu": "h900"}, "h200"),
        ({"target": "llama-9"}, "llama-3.1-8b"),
        ({"target": "config.json"}, "llama-3.1-8b"),  # a path is never opened over HTTP
        ({"method": "draft_model", "draft": "tiny"}, "llama-3.2-1b"),
        ({"calibration": "nope"}, "roofline"),
        ({"calibration": "7"}, "no calibration 7"),
    ],
)
def test_predict_unknown_names_get_400_with_the_valid_ones(
    client: httpx.Client, body: dict, names: str
) -> None:
    r = client.post("/v1/predict", json=body)
    assert r.status_code == 400, r.text
    assert names in r.json()["detail"]
    _no_trace(r)


def test_predict_invalid_body_names_each_bad_field(client: httpx.Client) -> None:
    r = client.post(
        "/v1/predict",
        json={"acceptance": 1.5, "batch": 0, "k": 99, "method": "magic", "target": "../x"},
    )
    assert r.status_code == 422
    paths = {e["path"] for e in r.json()["errors"]}
    assert paths == {"body.acceptance", "body.batch", "body.k", "body.method", "body.target"}
    bad_json = client.post(
        "/v1/predict", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert bad_json.status_code == 422
    _no_trace(bad_json)


def _upload_code_trace(c: httpx.Client) -> dict:
    with CODE_CSV.open("rb") as f:
        r = c.post("/v1/imports", files={"file": ("code.csv", f, "text/csv")})
    assert r.status_code == 200, r.text
    return r.json()


def test_recommendations_from_imported_data_equal_advisor_recommend(
    client: httpx.Client, tmp_path: Path
) -> None:
    imported = _upload_code_trace(client)
    body = {"deployment": {"gpu": "h200", "method": "eagle3"},
            "data": {"import_ids": [imported["import_id"]]}}  # fmt: skip
    r = client.post("/v1/recommendations", json=body)
    assert r.status_code == 200, r.text
    cli = subprocess.run(
        [sys.executable, "-m", "cli", "recommend", str(CODE_CSV), "--gpu", "h200", "--method",
         "eagle3", "--format", "json", "--db", str(tmp_path / "cli.duckdb")],
        capture_output=True, text=True, cwd=ROOT, timeout=300,
    )  # fmt: skip
    assert cli.returncode == 0, cli.stderr
    assert r.json() == json.loads(cli.stdout)


def test_a_posted_summary_gets_the_verdict_its_logged_segment_gets(client: httpx.Client) -> None:
    _upload_code_trace(client)
    from_log = client.post("/v1/recommendations", json={"data": {}}).json()
    st = from_log["segments"][0]["stats"]
    posted = {
        "task": st["task"],
        "temperature": st["temperature_p50"],
        "requests": st["n"],
        "prompt_tokens": {"p50": st["prompt_p50"], "p95": st["prompt_p95"]},
        "output_tokens": {"p50": st["output_p50"], "p95": st["output_p95"]},
        "concurrency": {"p50": st["concurrency_p50"], "p95": st["concurrency_p95"]},
    }
    other = {**posted, "requests": 3 * st["n"], "name": "three times as many"}
    r = client.post("/v1/recommendations", json={"summary": {"segments": [posted, other]}})
    assert r.status_code == 200, r.text
    rec = r.json()
    assert rec["schema_version"] == from_log["schema_version"]
    first, second = rec["segments"]
    assert first["stats"]["key"] == st["key"]  # labelled with the same bands
    assert second["stats"]["key"] == "three times as many"
    assert (first["share"], second["share"]) == (0.25, 0.75)
    logged = from_log["segments"][0]
    for field in ("verdict", "best_k", "method", "acceptance", "e2e_speedup", "decode_speedup",
                  "throughput_change", "memory"):  # fmt: skip
        assert first[field] == logged[field], field
    # The log's concurrency was estimated from arrivals; a posted one is taken as given.
    estimated = " (estimated from arrivals)"
    assert first["reasons"] == [x.replace(estimated, "") for x in logged["reasons"]]
    assert any("Workload summary: 2 posted segments" in n for n in rec["notes"])


@pytest.mark.parametrize(
    ("body", "paths"),
    [
        ({}, {"body"}),
        ({"data": {}, "summary": {"segments": []}}, {"body.summary.segments"}),
        ({"summary": {"segments": [{"requests": 0, "prompt_tokens": {"p50": 100, "p95": 10},
                                    "output_tokens": {"p50": 5}, "concurrency": {"p50": 0.5}}]}},
         {"body.summary.segments.0.requests", "body.summary.segments.0.prompt_tokens",
          "body.summary.segments.0.concurrency.p50"}),
        ({"data": {"import_ids": ["x"]}, "deployment": {"k": 0}},
         {"body.data.import_ids.0", "body.deployment.k"}),
    ],
)  # fmt: skip
def test_recommendations_invalid_bodies_name_each_path(
    client: httpx.Client, body: dict, paths: set[str]
) -> None:
    r = client.post("/v1/recommendations", json=body)
    assert r.status_code == 422, r.text
    assert {e["path"] for e in r.json()["errors"]} >= paths


def test_recommendations_bad_names_and_empty_data_get_400(client: httpx.Client) -> None:
    summary = {"segments": [{"requests": 5, "prompt_tokens": {"p50": 100},
                             "output_tokens": {"p50": 50}, "concurrency": {"p50": 1}}]}  # fmt: skip
    r = client.post("/v1/recommendations", json={"summary": summary, "deployment": {"gpu": "x"}})
    assert r.status_code == 400 and "h200" in r.json()["detail"]
    r = client.post("/v1/recommendations", json={"summary": summary, "calibration": "latest"})
    assert r.status_code == 400 and "no complete calibration" in r.json()["detail"]
    r = client.post("/v1/recommendations", json={"data": {"import_ids": [9]}})
    assert r.status_code == 400 and "No requests match" in r.json()["detail"]


def test_segments_of_imported_requests(client: httpx.Client) -> None:
    imported = _upload_code_trace(client)
    page = client.get("/v1/segments", params={"import_id": imported["import_id"]}).json()
    assert page["requests"] == imported["rows_accepted"]
    assert sum(s["n"] for s in page["segments"]) == page["requests"]
    assert sum(s["share"] for s in page["segments"]) == pytest.approx(1.0)
    one_band = {"prompt_bands": 10**7, "output_bands": 10**7, "concurrency_bands": 10**7}
    coarse = client.get("/v1/segments", params=one_band)
    assert len(coarse.json()["segments"]) == 1
    bad = client.get("/v1/segments", params={"prompt_bands": [10, 5], "gpu": "h200/../x"})
    assert bad.status_code == 422
    assert {e["path"] for e in bad.json()["errors"]} == {"query.prompt_bands", "query.gpu"}
    assert "increasing" in bad.json()["detail"]
    none = client.get("/v1/segments", params={"tenant": "nobody"})
    assert none.status_code == 400 and "No requests match" in none.json()["detail"]


# --- imports --------------------------------------------------------------------------------


def test_multipart_upload_imports_real_trace_and_lists_it(client: httpx.Client) -> None:
    with CODE_CSV.open("rb") as f:
        r = client.post("/v1/imports", files={"file": ("code.csv", f, "text/csv")})
    assert r.status_code == 200, r.text
    summary = r.json()
    assert summary["format"] == "azure"
    assert summary["file"] == "upload:code.csv"
    assert summary["rows_read"] == summary["rows_accepted"] + summary["rows_rejected"]
    assert summary["rows_accepted"] > 8000  # 8818 data lines in the trace
    assert summary["already_imported"] is False

    listed = client.get("/v1/imports").json()
    assert [i["import_id"] for i in listed] == [summary["import_id"]]
    one = client.get(f"/v1/imports/{summary['import_id']}").json()
    assert one["rows_accepted"] == summary["rows_accepted"]
    page = client.get(f"/v1/imports/{summary['import_id']}/rejects").json()
    assert page["total"] == summary["rows_rejected"]

    with CODE_CSV.open("rb") as f:
        again = client.post("/v1/imports", files={"file": ("copy.csv", f)}).json()
    assert again["already_imported"] is True
    assert again["import_id"] == summary["import_id"]
    assert len(client.get("/v1/imports").json()) == 1


def test_raw_gzip_body_is_recognised_without_a_file_name(client: httpx.Client) -> None:
    r = client.post(
        "/v1/imports",
        content=gzip.compress(CODE_CSV.read_bytes()),
        headers={"content-type": "application/octet-stream"},
    )
    assert r.status_code == 200, r.text
    assert r.json()["format"] == "azure"
    assert r.json()["file"] == "upload:upload.gz"


def test_rejected_rows_are_listed_with_line_and_reason(client: httpx.Client) -> None:
    body = b"TIMESTAMP,ContextTokens,GeneratedTokens\n"
    body += b"2023-11-16 18:17:03.97,4808,10\n2023-11-16 18:17:04.03,-5,8\n"
    body += b"2023-11-16 18:17:05.00,12,7\n"
    r = client.post("/v1/imports", params={"filename": "small.csv"}, content=body)
    assert r.status_code == 200, r.text
    summary = r.json()
    assert (summary["rows_accepted"], summary["rows_rejected"]) == (2, 1)
    page = client.get(f"/v1/imports/{summary['import_id']}/rejects").json()
    assert page["total"] == 1
    assert page["rejects"][0]["line"] == 3
    assert page["rejects"][0]["file"] == "upload:small.csv"
    assert page["rejects"][0]["reason"]


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({"content": b"\x00\x01\x02binary\x00"}, "binary"),
        ({"content": b""}, "empty"),
        ({"files": {"other": ("x.csv", b"a,b\n1,2\n")}}, "part named 'file'"),
        ({"content": b"TIMESTAMP,ContextTokens,GeneratedTokens\n", "params": {"format": "nope"}},
         "valid formats"),
    ],
)  # fmt: skip
def test_bad_uploads_get_400_with_one_sentence(
    client: httpx.Client, kwargs: dict, expected: str
) -> None:
    r = client.post("/v1/imports", **kwargs)
    assert r.status_code == 400, r.text
    assert expected in r.json()["detail"]
    assert "/tmp" not in r.json()["detail"]  # the spool file's path is not the user's business
    _no_trace(r)
    assert client.get("/v1/imports").json() == []


def test_invalid_parameters_get_422_naming_each_path(client: httpx.Client) -> None:
    r = client.get("/v1/imports/1/rejects", params={"limit": 0, "offset": -1})
    assert r.status_code == 422
    paths = {e["path"] for e in r.json()["errors"]}
    assert paths == {"query.limit", "query.offset"}
    assert "query.limit" in r.json()["detail"]
    r = client.get("/v1/imports/not-a-number")
    assert r.status_code == 422
    assert r.json()["errors"][0]["path"] == "path.import_id"
    # A misspelt filter is refused, not ignored (which would widen the selection silently).
    for path, params in (("/v1/segments", {"import": 1}), ("/v1/jobs", {"state": "done"}),
                         ("/v1/imports/1/rejects", {"limt": 5})):  # fmt: skip
        r = client.get(path, params=params)
        assert r.status_code == 422, path
        assert r.json()["errors"][0]["path"] == f"query.{next(iter(params))}"


def _raw_http(base_url: str, request: bytes, then: bytes = b"") -> bytes:
    """Send `request` (and `then`) on a raw socket and read what the server answers."""
    host, port = base_url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as s:
        s.sendall(request)
        if then:
            s.sendall(then)
        answer = b""
        while b"\r\n\r\n" not in answer:
            answer += s.recv(65536)
        head, _, body = answer.partition(b"\r\n\r\n")
        length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
        while len(body) < length:
            body += s.recv(65536)
        return head + b"\r\n\r\n" + body


def test_upload_over_the_limit_gets_413_before_the_body_ends(db_path: Path) -> None:
    limit = 64 * 1024
    with serve(db_path, max_upload_bytes=limit) as url:
        # Declared too large: refused from the header alone; not one body byte is sent.
        head = (
            b"POST /v1/imports HTTP/1.1\r\nHost: x\r\n"
            b"Content-Type: application/octet-stream\r\nContent-Length: 10000000000\r\n\r\n"
        )
        assert _raw_http(url, head).startswith(b"HTTP/1.1 413")
        # Streamed (chunked, no length): refused once the limit is passed while the body is
        # still open; the final chunk never comes, so a server that read it all would hang.
        chunked = (
            b"POST /v1/imports HTTP/1.1\r\nHost: x\r\n"
            b"Content-Type: application/octet-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
        )
        chunk = b"x" * 16384
        body = (b"%x\r\n" % len(chunk) + chunk + b"\r\n") * 5
        answer = _raw_http(url, chunked, body)
        assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
        assert b"limit of 65536 bytes" in answer
        # A client that goes away mid-body (here after a valid CSV head): the part that came is
        # not imported as if it were the whole file, and the service counts a 400.
        host, port = url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port))) as s:
            s.sendall(head.replace(b"10000000000", b"50000") + CODE_CSV.read_bytes()[:3000])
        cut_off = 'advisor_http_requests_total{method="POST",route="/v1/imports",status="400"} 1.0'
        with httpx.Client(base_url=url) as c:
            for _ in range(200):
                if cut_off in c.get("/metrics").text:
                    break
                time.sleep(0.05)
            assert cut_off in c.get("/metrics").text
            assert c.get("/v1/imports").json() == []
            small = CODE_CSV.read_bytes()[:60000]
            ok = c.post("/v1/imports", params={"filename": "s.csv"}, content=small)
            assert ok.status_code == 200  # under the limit still works


def _azure_csv(path: Path, rows: int) -> Path:
    """A large trace in the Azure 2023 format, written by DuckDB (fast, deterministic)."""
    duckdb.connect().execute(
        "COPY (SELECT strftime(TIMESTAMP '2023-11-16 00:00:00' + to_milliseconds(i * 10),"
        " '%Y-%m-%d %H:%M:%S.%f') AS \"TIMESTAMP\", 100 + i % 4000 AS ContextTokens,"
        f" 10 + i % 500 AS GeneratedTokens FROM range({rows}) t(i)) TO '{path}' (HEADER)"
    )
    return path


def test_a_long_import_does_not_block_predictions_or_recommendations(
    db_path: Path, tmp_path: Path
) -> None:
    """Parallel clients keep getting answers while a large upload is being imported.

    A reader's GET /v1/imports that still shows no import, answered after the whole upload
    body was sent, ran while the import was in progress (its transaction not yet committed);
    the prediction and recommendation answered just before it on the same client ran then too.
    """
    rows = 1_500_000
    big = _azure_csv(tmp_path / "big.csv", rows)
    with serve(db_path) as url:
        body_sent = threading.Event()
        upload: dict[str, httpx.Response] = {}

        def body() -> Iterator[bytes]:
            with big.open("rb") as f:
                while chunk := f.read(1 << 20):
                    yield chunk
            body_sent.set()

        def do_upload() -> None:
            with httpx.Client(base_url=url, timeout=600) as c:
                upload["r"] = c.post("/v1/imports", params={"filename": "big.csv"}, content=body())

        uploader = threading.Thread(target=do_upload)
        uploader.start()
        assert body_sent.wait(timeout=300)
        overlapped: list[dict] = []
        statuses: list[int] = []

        def reader(n: int) -> None:
            payload = {"batch": 1 + n, "acceptance": 0.5 + n / 20, "k": 3}
            segment = {"requests": 10, "prompt_tokens": {"p50": 500}, "output_tokens": {"p50": 200},
                       "concurrency": {"p50": 1 + n}}  # fmt: skip
            summary = {"deployment": {"k": 3}, "summary": {"segments": [segment]}}
            with httpx.Client(base_url=url, timeout=120) as c:
                while uploader.is_alive():
                    pred = c.post("/v1/predict", json=payload)
                    rec = c.post("/v1/recommendations", json=summary)
                    listed = c.get("/v1/imports")
                    statuses.extend([pred.status_code, rec.status_code, listed.status_code])
                    if listed.status_code == 200 and listed.json() == [] and uploader.is_alive():
                        overlapped.append({"predict": pred.json(), "recommend": rec.json()})

        readers = [threading.Thread(target=reader, args=(n,)) for n in range(4)]
        for t in readers:
            t.start()
        uploader.join(timeout=600)
        for t in readers:
            t.join(timeout=120)
        assert upload["r"].status_code == 200, upload["r"].text
        assert upload["r"].json()["rows_accepted"] == rows
        assert set(statuses) == {200}
        assert len(overlapped) >= 3, "no reader was answered while the import ran"
        assert all(o["predict"]["k"] == 3 for o in overlapped)
        assert all(o["recommend"]["segments"][0]["best_k"] == 3 for o in overlapped)
        with httpx.Client(base_url=url) as c:
            assert len(c.get("/v1/imports").json()) == 1


# --- keys -----------------------------------------------------------------------------------


def test_keys_guard_every_v1_route_once_one_exists(db_path: Path) -> None:
    con = connect(db_path)
    _, good = create_key(con, "planner")
    old_info, old = create_key(con, "retired")
    revoke_key(con, old_info.key_id)
    con.close()
    with serve(db_path) as url, httpx.Client(base_url=url) as c:
        missing = c.get("/v1/imports")
        assert missing.status_code == 401
        assert missing.headers["www-authenticate"] == "Bearer"
        assert "Authorization: Bearer" in missing.json()["detail"]
        assert c.get("/v1/imports", headers={"Authorization": "Bearer sa_nope"}).status_code == 403
        assert c.get("/v1/imports", headers={"Authorization": f"Bearer {old}"}).status_code == 403
        assert c.post("/v1/imports", content=b"x").status_code == 401  # before reading any body
        assert c.get("/v1/jobs/abc").status_code == 401
        auth = {"Authorization": f"Bearer {good}"}
        assert c.get("/v1/imports", headers=auth).status_code == 200
        assert c.get("/healthz").status_code == 200  # probes stay open
        assert c.get("/metrics").status_code == 200


def test_without_keys_the_service_is_open(client: httpx.Client) -> None:
    assert client.get("/v1/imports").status_code == 200


def test_keys_cli_stores_only_a_hash(db_path: Path) -> None:
    created = subprocess.run(
        [sys.executable, "-m", "cli", "keys", "create", "--name", "ci", "--db", str(db_path)],
        capture_output=True, text=True, cwd=ROOT, timeout=120,
    )  # fmt: skip
    assert created.returncode == 0, created.stderr
    key = created.stdout.strip()
    assert key.startswith("sa_")
    key_id = key.split("_")[1]
    raw = duckdb.connect(str(db_path))
    stored = raw.execute("SELECT key_id, key_hash FROM api_keys").fetchall()
    raw.close()
    assert stored[0][0] == key_id
    assert key not in stored[0][1] and key.split("_", 2)[2] not in stored[0][1]
    listed = subprocess.run(
        [sys.executable, "-m", "cli", "keys", "list", "--db", str(db_path)],
        capture_output=True, text=True, cwd=ROOT, timeout=120,
    )  # fmt: skip
    assert key_id in listed.stdout and key not in listed.stdout
    revoked = subprocess.run(
        [sys.executable, "-m", "cli", "keys", "revoke", "deadbeef", "--db", str(db_path)],
        capture_output=True, text=True, cwd=ROOT, timeout=120,
    )  # fmt: skip
    assert revoked.returncode == 2
    assert key_id in revoked.stderr  # names the valid ids


# --- advisor serve, restarts and jobs ------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def advisor_serve(db_path: Path, *args: str) -> Iterator[str]:
    """The real `advisor serve` command in a subprocess; stopped with SIGTERM."""
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if k != "ADVISOR_DB"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "cli", "serve", "--port", str(port), "--db", str(db_path), *args],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            try:
                if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                if proc.poll() is not None:
                    raise RuntimeError(proc.stderr.read()) from None
                time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_restart_marks_a_running_calibration_interrupted_never_done(db_path: Path) -> None:
    """A real calibration job is running when `advisor serve` is stopped; after a restart the
    job reads interrupted (and a finished job keeps its status)."""
    from tests.fake_vllm import fake_vllm

    _requests_db(db_path)
    con = connect(db_path)
    con.execute(
        "INSERT INTO jobs (job_id, kind, status, progress, created_at, finished_at)"
        " VALUES ('fine', 'calibration', 'done', 1.0, now(), now())"
    )
    con.close()
    with fake_vllm(False, step_s=0.05) as base, fake_vllm(True, step_s=0.05) as spec:
        body = {"baseline_url": base.url, "speculative_url": spec.url, "method": "ngram", "k": 4}
        with advisor_serve(db_path) as url, httpx.Client(base_url=url, timeout=60) as c:
            job_id = c.post("/v1/calibrations", json=body).json()["job_id"]
            running = _wait_for_job(c, job_id, {"running", "done", "failed"})
            assert running["status"] == "running"
            for _ in range(600):  # until the replay itself has begun
                if base.hits.get("/v1/completions"):
                    break
                time.sleep(0.05)
        with advisor_serve(db_path) as url, httpx.Client(base_url=url) as c:
            cut = c.get(f"/v1/jobs/{job_id}").json()
            assert cut["status"] == "interrupted"
            assert "stopped" in cut["error"] and cut["result"] is None
            assert c.get("/v1/jobs/fine").json()["status"] == "done"
            assert c.get("/v1/jobs/none").status_code == 404
            assert [j["job_id"] for j in c.get("/v1/jobs").json()] == [job_id, "fine"]
            listed = c.get("/v1/jobs", params={"status": "interrupted"}).json()
            assert [j["job_id"] for j in listed] == [job_id]
            assert c.get("/v1/jobs", params={"status": "lost"}).status_code == 422
            assert c.get("/v1/calibrations").json() == []  # nothing half-stored


def test_serve_refuses_a_busy_database_in_one_sentence(db_path: Path) -> None:
    with advisor_serve(db_path):
        second = subprocess.run(
            [sys.executable, "-m", "cli", "serve", "--port", str(_free_port()),
             "--db", str(db_path)],
            capture_output=True, text=True, cwd=ROOT, timeout=120,
        )  # fmt: skip
    assert second.returncode == 1
    assert "busy" in second.stderr and "Traceback" not in second.stderr


def test_serve_warns_when_binding_beyond_loopback_without_a_key(db_path: Path) -> None:
    # 192.0.2.1 is TEST-NET-1 (RFC 5737): never assigned here, so the bind fails after the
    # warning and nothing listens beyond loopback during the test.
    run = subprocess.run(
        [sys.executable, "-m", "cli", "serve", "--host", "192.0.2.1", "--port",
         str(_free_port()), "--db", str(db_path)],
        capture_output=True, text=True, cwd=ROOT, timeout=120,
    )  # fmt: skip
    assert "no API key" in run.stderr
    assert run.returncode != 0


# --- calibrations ---------------------------------------------------------------------------


def _store_calibration(con: duckdb.DuckDBPyConnection, bandwidth: float, status: str) -> int:
    from calibration.records import CalibrationHeader, store_calibration

    when = datetime(2026, 11, 30, 12, 0)
    header = CalibrationHeader(
        created_at=when, finished_at=when, status=status, gpu="h200", vllm_version="0.26.0",
        target="llama-3.1-8b", method="eagle3", k=4,
        profile={"bandwidth_efficiency": bandwidth, "methods": {"eagle3": {"overhead_ms": 2}}},
    )  # fmt: skip
    return store_calibration(con, header, [], [], {})


def test_calibrations_list_get_and_diff(db_path: Path) -> None:
    con = connect(db_path)
    first = _store_calibration(con, 0.8, "complete")
    second = _store_calibration(con, 0.6, "partial")
    con.close()
    with serve(db_path) as url, httpx.Client(base_url=url) as c:
        listed = c.get("/v1/calibrations").json()
        assert [(x["id"], x["status"]) for x in listed] == [
            (first, "complete"),
            (second, "partial"),
        ]
        one = c.get(f"/v1/calibrations/{second}").json()
        assert one["profile"]["bandwidth_efficiency"] == 0.6
        assert c.get("/v1/calibrations/latest").json()["id"] == first  # newest complete
        missing = c.get("/v1/calibrations/99")
        assert missing.status_code == 404
        assert f"known: {first}, {second}" in missing.json()["detail"]
        assert c.get("/v1/calibrations/abc").status_code == 400
        diff = c.get(f"/v1/calibrations/{first}/diff/{second}").json()
        assert diff["a"]["id"] == first and diff["b"]["id"] == second
        [moved] = diff["drift"]
        assert (moved["parameter"], moved["a"], moved["b"]) == ("bandwidth_efficiency", 0.8, 0.6)
        assert moved["change_pct"] == pytest.approx(-25.0)
        # No traffic imported, and b is partial: the flips are not computed, and the note says why.
        assert diff["flips"] == [] and "Verdict flips not computed" in diff["note"]


def _requests_db(db_path: Path, n: int = 60) -> None:
    """Logged requests in two tasks (json, story), greedy, short, concurrency 1-2."""
    con = connect(db_path)
    con.executemany(
        "INSERT INTO requests (request_id, source, import_id, line, prompt_tokens, output_tokens,"
        " temperature, task, concurrency, concurrency_source) VALUES (?, 'test', 1, ?, ?, ?, 0.0,"
        " ?, ?, 'log')",
        [(f"r{i}", i, 60 + i, 40 + i % 8, "json" if i % 2 else "story", 1 + i % 2)
         for i in range(n)],
    )  # fmt: skip
    con.close()


def _wait_for_job(c: httpx.Client, job_id: str, until: set[str]) -> dict:
    for _ in range(1200):
        job = c.get(f"/v1/jobs/{job_id}").json()
        if job["status"] in until:
            return job
        time.sleep(0.1)
    raise AssertionError(f"job {job_id} stayed {job['status']}")


def test_calibration_job_replays_on_two_servers_and_stores_the_calibration(
    db_path: Path,
) -> None:
    from tests.fake_vllm import fake_vllm

    _requests_db(db_path)
    with fake_vllm(False) as base, fake_vllm(True) as spec, serve(db_path) as url, \
            httpx.Client(base_url=url, timeout=60) as c:  # fmt: skip
        body = {"baseline_url": base.url, "speculative_url": spec.url, "method": "ngram", "k": 4,
                "precision": {"max_requests": 8, "pilot": 4}, "notes": "from the API"}  # fmt: skip
        started = c.post("/v1/calibrations", json=body)
        assert started.status_code == 202, started.text
        job = started.json()
        assert started.headers["location"] == f"/v1/jobs/{job['job_id']}"
        assert job["kind"] == "calibration" and job["status"] in {"queued", "running"}
        done = _wait_for_job(c, job["job_id"], {"done", "failed"})
        assert done["status"] == "done", done["error"]
        assert done["progress"] == 1.0
        cal_id = done["result"]["calibration_id"]
        stored = c.get(f"/v1/calibrations/{cal_id}").json()
        assert (stored["method"], stored["k"], stored["notes"]) == ("ngram", 4, "from the API")
        assert stored["target"] == "fake-model"  # what the server reports, as the CLI does
        assert base.hits["/v1/completions"] == spec.hits["/v1/completions"] > 0


def test_calibration_job_bad_input_and_dead_servers(db_path: Path) -> None:
    _requests_db(db_path)
    dead = f"http://127.0.0.1:{_free_port()}"
    with serve(db_path) as url, httpx.Client(base_url=url, timeout=60) as c:
        body = {"baseline_url": dead, "speculative_url": dead, "method": "ngram", "k": 4}
        no_match = c.post("/v1/calibrations", json={**body, "import_ids": [42]})
        assert no_match.status_code == 400 and "No requests match" in no_match.json()["detail"]
        bad = c.post("/v1/calibrations", json={**body, "baseline_url": "ftp://x", "k": 0})
        assert bad.status_code == 422
        assert {e["path"] for e in bad.json()["errors"]} == {"body.baseline_url", "body.k"}
        unknown = c.post("/v1/calibrations", json={**body, "target": "gpt-9"})
        assert unknown.status_code == 400 and "llama-3.1-8b" in unknown.json()["detail"]
        job = c.post("/v1/calibrations", json=body).json()
        failed = _wait_for_job(c, job["job_id"], {"done", "failed"})
        assert failed["status"] == "failed"
        assert "did not answer /health" in failed["error"]
        assert "Traceback" not in failed["error"]


def test_calibration_diff_lists_verdicts_that_flip_on_the_imported_traffic(db_path: Path) -> None:
    from advisor.profile import get_profile
    from calibration.records import CalibrationHeader, store_calibration

    shipped = get_profile("h200").model_dump(mode="json")
    ids = []
    con = connect(db_path)
    for intercept in (3.0, -3.0):  # acceptance ~0.95, then ~0.05, for every eagle3 segment
        logit = {"method": "eagle3", "intercept": intercept, "sd": 0.1, "n": 10}
        when = datetime(2026, 11, 30, 12, 0)
        ids.append(store_calibration(con, CalibrationHeader(
            created_at=when, finished_at=when, status="complete", gpu="h200",
            target="llama-3.1-8b", method="eagle3", k=3,
            profile={**shipped, "name": "calibration", "acceptance_logit": [logit]},
        ), [], [], {}))  # fmt: skip
    con.close()
    with serve(db_path) as url, httpx.Client(base_url=url, timeout=120) as c:
        _upload_code_trace(c)
        diff = c.get(f"/v1/calibrations/{ids[0]}/diff/{ids[1]}").json()
        assert diff["note"] is None
        assert diff["verdicts_for"]["target"] == "llama-3.1-8b"
        assert diff["verdicts_for"]["k"] == 3
        assert diff["segments_compared"] >= 1
        assert diff["flips"], diff
        assert all(f["a"] != f["b"] and f["b"] != "enable" for f in diff["flips"])
        assert all(f["e2e_speedup_a"] > f["e2e_speedup_b"] for f in diff["flips"])
        assert any("acceptance_logit" in d["parameter"] for d in diff["drift"])
