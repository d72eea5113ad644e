"""Latency and throughput of `advisor serve` on loopback: p50/p99 and req/s at 1, 8, 32 clients.

    python bench/api.py [--requests 2000] [--clients 1,8,32] [--url http://127.0.0.1:8000]

Without --url it starts the real `advisor serve` in a subprocess on a free port with a fresh
database. Each client is one keep-alive HTTP/1.1 connection sending its requests back to back
(a closed loop); the load generator is a few lines of asyncio over raw sockets, so that on a
2-core machine the client takes as little CPU from the server as possible. Bodies vary over a
seeded set of operating points, one per request (k=null: the best k is searched every time).
Besides wall-clock figures it reports the server's CPU time per request (from /proc), which
other load on a shared machine disturbs far less than latency.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def predict_bodies(n: int, seed: int = 1) -> list[dict]:
    """Operating points across the range capacity tools ask about; k=null picks the best k."""
    rng = random.Random(seed)
    return [
        {
            "gpu": rng.choice(["h200", "h100", "a100-80g"]),
            "target": "llama-3.1-8b",
            "method": rng.choice(["eagle3", "ngram", "draft_model"]),
            "acceptance": rng.uniform(0.3, 0.9),
            "batch": rng.choice([1, 2, 4, 8, 16, 32, 64]),
            "prompt_tokens": rng.choice([128, 512, 2048, 8192]),
            "output_tokens": rng.choice([32, 128, 256, 1024]),
            "k": None,
        }
        for _ in range(n)
    ]


def fix_drafts(body: dict) -> dict:
    if body["method"] == "draft_model":
        body["draft"] = "llama-3.2-1b"
    return body


def summary_bodies(n: int, seed: int = 2) -> list[dict]:
    """Workload summaries of 3-6 segments, as a capacity-planning tool would post them."""
    rng = random.Random(seed)
    tasks = ["code", "chat", "summarize", "json", "story"]
    bodies = []
    for _ in range(n):
        segments = []
        for _ in range(rng.randint(3, 6)):
            p50 = rng.choice([200, 800, 3000, 12000])
            o50 = rng.choice([20, 100, 300, 800])
            c50 = rng.choice([1, 4, 16, 48])
            segments.append(
                {
                    "task": rng.choice(tasks),
                    "temperature": rng.choice([0.0, 0.7, 1.0]),
                    "requests": rng.randint(100, 10000),
                    "prompt_tokens": {"p50": p50, "p95": p50 * 3},
                    "output_tokens": {"p50": o50, "p95": o50 * 2},
                    "concurrency": {"p50": c50, "p95": c50 * 2},
                }
            )
        bodies.append({"deployment": {"gpu": "h200", "target": "llama-3.1-8b"},
                       "summary": {"segments": segments}})  # fmt: skip
    return bodies


def _request(host: str, port: int, path: str, body: dict) -> bytes:
    data = json.dumps(body).encode()
    return (
        f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(data)}\r\n\r\n"
    ).encode() + data


async def _client(
    host: str, port: int, payloads: list[bytes], latencies: list[float], errors: list[str]
) -> None:
    reader, writer = await asyncio.open_connection(host, port)
    try:
        for payload in payloads:
            start = time.perf_counter()
            writer.write(payload)
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n"):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
            body = await reader.readexactly(length)
            latencies.append(time.perf_counter() - start)
            if not head.startswith(b"HTTP/1.1 200"):
                errors.append(head.split(b"\r\n")[0].decode() + " " + body[:200].decode())
    finally:
        writer.close()


async def _run(host: str, port: int, path: str, bodies: list[dict], clients: int, total: int):
    per_client = max(1, total // clients)
    plans = [
        [_request(host, port, path, bodies[(c * per_client + i) % len(bodies)])
         for i in range(per_client)]
        for c in range(clients)
    ]  # fmt: skip
    latencies: list[float] = []
    errors: list[str] = []
    start = time.perf_counter()
    await asyncio.gather(*(_client(host, port, p, latencies, errors) for p in plans))
    wall = time.perf_counter() - start
    return latencies, errors, wall


def _cpu_s(pid: int | None) -> float:
    """User + system CPU seconds of process `pid` so far (0 when unknown)."""
    if pid is None:
        return 0.0
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(
    url: str, path: str, bodies: list[dict], clients: int, total: int, pid: int | None = None
) -> dict:
    host, port = url.removeprefix("http://").split(":")
    # Warm-up: first calls load profiles and fill caches; not counted.
    asyncio.run(_run(host, int(port), path, bodies, clients, max(clients * 5, 50)))
    cpu_before = _cpu_s(pid)
    latencies, errors, wall = asyncio.run(_run(host, int(port), path, bodies, clients, total))
    cpu = _cpu_s(pid) - cpu_before
    if errors:
        raise SystemExit(f"{path}: {len(errors)} non-200 answers, e.g. {errors[0]}")
    q = statistics.quantiles(latencies, n=100, method="inclusive")
    return {
        "endpoint": f"POST {path}",
        "clients": clients,
        "requests": len(latencies),
        "p50_ms": round(q[49] * 1e3, 2),
        "p99_ms": round(q[98] * 1e3, 2),
        "req_per_s": round(len(latencies) / wall, 1),
        "server_cpu_ms": round(cpu / len(latencies) * 1e3, 3) if pid else None,
    }


@contextmanager
def advisor_serve() -> Iterator[tuple[str, int | None]]:
    """The real `advisor serve` on a free loopback port with a fresh database."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    folder = tempfile.mkdtemp(prefix="advisor-bench-")
    env = {k: v for k, v in os.environ.items() if k != "ADVISOR_DB"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "cli", "serve", "--port", str(port),
         "--db", str(Path(folder) / "bench.duckdb")],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            try:
                with urllib.request.urlopen(f"{url}/healthz", timeout=1):
                    break
            except OSError:
                if proc.poll() is not None:
                    raise SystemExit(f"advisor serve failed: {proc.stderr.read()}") from None
                time.sleep(0.1)
        yield url, proc.pid
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="an already running service (default: start one)")
    parser.add_argument("--requests", type=int, default=2000, help="per endpoint and level")
    parser.add_argument("--clients", default="1,8,32", help="comma-separated client counts")
    args = parser.parse_args()
    levels = [int(c) for c in args.clients.split(",")]
    # A distinct operating point per request: every call does the full computation.
    n = args.requests + 32 * 5
    cases = [
        ("/v1/predict", [fix_drafts(b) for b in predict_bodies(n)]),
        ("/v1/recommendations", summary_bodies(n)),
    ]
    load_before = os.getloadavg()[0]
    with advisor_serve() if args.url is None else _given(args.url) as (url, pid):
        rows = [measure(url, path, bodies, c, args.requests, pid)
                for path, bodies in cases for c in levels]  # fmt: skip
    print(f"{os.cpu_count()} CPUs; 1-minute load average {load_before:.2f} before, "
          f"{os.getloadavg()[0]:.2f} after")  # fmt: skip
    print("| endpoint | clients | requests | p50 ms | p99 ms | req/s | server CPU ms/req |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['endpoint']} | {r['clients']} | {r['requests']} | {r['p50_ms']} "
              f"| {r['p99_ms']} | {r['req_per_s']} | {r['server_cpu_ms'] or '-'} |")  # fmt: skip


@contextmanager
def _given(url: str) -> Iterator[tuple[str, None]]:
    yield url.rstrip("/"), None


if __name__ == "__main__":
    main()
