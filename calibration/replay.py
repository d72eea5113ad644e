"""Replay requests on a vLLM server with a bounded, streaming async client.

Each segment's batch is replayed at the segment's concurrency (closed loop: that many requests in
flight) and bracketed by /metrics scrapes, so the spec-decode counters' delta belongs to it alone.
Segments therefore run one after another, never overlapped.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import statistics
import time
from collections.abc import Callable, Sequence

import httpx

from calibration import metrics
from calibration.schemas import (
    LatencySummary,
    ReplayRecord,
    ReplayRequest,
    SegmentRun,
    ServerHandle,
)

REQUEST_TIMEOUT_S = 600.0


def endpoint(request: ReplayRequest) -> str:
    """Chat requests go through the model's chat template; others are raw completions."""
    return "/v1/chat/completions" if request.chat else "/v1/completions"


def completion_payload(handle: ServerHandle, request: ReplayRequest) -> dict[str, object]:
    """The request body: forced length (max_tokens + ignore_eos), logged sampling, streamed with
    a final usage chunk (a speculative chunk can carry several tokens, so chunks are no count)."""
    payload: dict[str, object] = {"model": handle.model}
    if request.chat:
        payload["messages"] = [{"role": "user", "content": request.prompt}]
    else:
        payload["prompt"] = (
            request.prompt if request.prompt is not None else request.prompt_token_ids
        )
    payload |= {
        "max_tokens": request.max_tokens,
        "temperature": request.temperature,
        "top_p": request.top_p,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if request.ignore_eos:
        payload["ignore_eos"] = True  # a vLLM extension of the OpenAI API
    return payload


def summarize_gaps(gaps_ms: Sequence[float]) -> LatencySummary | None:
    """Mean, median, p95 and max of inter-chunk gaps."""
    if not gaps_ms:
        return None
    ordered = sorted(gaps_ms)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    return LatencySummary(
        n=len(ordered),
        mean_ms=statistics.fmean(ordered),
        p50_ms=statistics.median(ordered),
        p95_ms=p95,
        max_ms=ordered[-1],
    )


def _is_step(choice: dict[str, object]) -> bool:
    """Whether a streamed choice is one engine step's output. Text can be empty for a real
    step (bytes held back mid-character, or detokenize off on a --skip-tokenizer-init server),
    so only chat's opening role-only delta and a bare finish marker are not steps."""
    delta = choice.get("delta")
    if isinstance(delta, dict):
        if "role" in delta and not delta.get("content"):
            return False
        content = delta.get("content")
    else:
        content = choice.get("text")
    return bool(content or choice.get("token_ids")) or choice.get("finish_reason") is None


async def replay_one(
    client: httpx.AsyncClient,
    handle: ServerHandle,
    request: ReplayRequest,
    batch_t0: float,
) -> ReplayRecord:
    """Send one streaming completion and time its chunks."""
    start = time.perf_counter()
    chunk_times: list[float] = []
    usage: dict[str, int] = {}
    error: str | None = None
    try:
        async with client.stream(
            "POST", endpoint(request), json=completion_payload(handle, request)
        ) as response:
            if response.status_code != 200:
                body = (await response.aread()).decode(errors="replace")[:300]
                raise RuntimeError(f"HTTP {response.status_code}: {body}")
            async for line in response.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line.removeprefix("data:").strip()
                if data == "[DONE]":
                    break
                chunk = json.loads(data)
                now = time.perf_counter()
                if chunk.get("usage"):
                    usage = chunk["usage"]
                choices = chunk.get("choices") or []
                if any(_is_step(c) for c in choices):
                    chunk_times.append(now)
    except (httpx.HTTPError, RuntimeError, ValueError) as exc:
        error = f"{type(exc).__name__}: {exc}"
    end = time.perf_counter()
    output_tokens = int(usage.get("completion_tokens", len(chunk_times)))
    ok = error is None and output_tokens > 0
    ttft_ms = (chunk_times[0] - start) * 1000 if chunk_times else None
    e2e_ms = (end - start) * 1000
    gaps = [(b - a) * 1000 for a, b in itertools.pairwise(chunk_times)]
    return ReplayRecord(
        request_id=request.request_id,
        segment_key=request.segment_key,
        role=handle.role,
        prompt_tokens=int(usage.get("prompt_tokens", request.prompt_tokens)),
        output_tokens=output_tokens,
        max_tokens=request.max_tokens,
        temperature=request.temperature,
        top_p=request.top_p,
        ttft_ms=ttft_ms,
        tpot_ms=ReplayRecord.tpot(e2e_ms, ttft_ms, output_tokens) if ttft_ms is not None else None,
        e2e_ms=e2e_ms if ok else None,
        chunks=len(chunk_times),
        inter_chunk=summarize_gaps(gaps),
        start_offset_s=start - batch_t0,
        ok=ok,
        error=error if error else (None if ok else "the server returned no tokens"),
    )


async def replay_batch(
    handle: ServerHandle,
    requests: Sequence[ReplayRequest],
    concurrency: int,
    *,
    segment_key: str | None = None,
    round: int = 0,
    timeout_s: float = REQUEST_TIMEOUT_S,
) -> SegmentRun:
    """Replay one segment's batch with at most `concurrency` requests in flight, and take the
    spec-decode counters' delta around it."""
    if not requests:
        raise ValueError("replay_batch needs at least one request")
    key = segment_key or requests[0].segment_key
    limits = httpx.Limits(max_connections=concurrency + 2)
    async with httpx.AsyncClient(base_url=handle.url, timeout=timeout_s, limits=limits) as client:
        before = await metrics.scrape_counters(client, handle.url)
        queue: asyncio.Queue[ReplayRequest] = asyncio.Queue()
        for request in requests:
            queue.put_nowait(request)
        records: list[ReplayRecord] = []
        t0 = time.perf_counter()

        async def worker() -> None:
            while not queue.empty():
                records.append(await replay_one(client, handle, queue.get_nowait(), t0))

        await asyncio.gather(*(worker() for _ in range(min(concurrency, len(requests)))))
        wall_s = time.perf_counter() - t0
        after = await metrics.scrape_counters(client, handle.url)
    order = {r.request_id: i for i, r in enumerate(requests)}
    records.sort(key=lambda r: order[r.request_id])
    return SegmentRun(
        segment_key=key,
        role=handle.role,
        concurrency=concurrency,
        round=round,
        records=records,
        delta=metrics.delta(before, after),
        wall_s=wall_s,
    )


def replay_segment(
    handle: ServerHandle,
    requests: Sequence[ReplayRequest],
    concurrency: int,
    *,
    round: int = 0,
    timeout_s: float = REQUEST_TIMEOUT_S,
) -> SegmentRun:
    """Synchronous entry point for one segment's batch (segments run one after another)."""
    return asyncio.run(
        replay_batch(handle, requests, concurrency, round=round, timeout_s=timeout_s)
    )


def token_counter(handle: ServerHandle, timeout_s: float = 30.0) -> Callable[[str], int]:
    """Count tokens with the server's own tokenizer (vLLM's POST /tokenize), so synthesized
    prompts hit the logged length exactly rather than by a characters-per-token guess."""
    client = httpx.Client(base_url=handle.url, timeout=timeout_s)

    def count(text: str) -> int:
        response = client.post("/tokenize", json={"model": handle.model, "prompt": text})
        response.raise_for_status()
        return int(response.json()["count"])

    return count


def warm_up(handle: ServerHandle, prompt: str = "Hello", max_tokens: int = 8) -> None:
    """One short request so first-call compilation does not land in a segment's timings."""
    request = ReplayRequest(
        request_id="warm-up",
        segment_key="warm-up",
        prompt=prompt,
        prompt_tokens=1,
        max_tokens=max_tokens,
    )
    run = replay_segment(handle, [request], 1)
    if not run.records[0].ok:
        raise RuntimeError(f"warm-up request to {handle.url} failed: {run.records[0].error}")
