"""A fake vLLM OpenAI-compatible server for tests: real HTTP on a free loopback port.

It answers what the calibration client uses: /health, /version, /v1/models, streaming
/v1/completions and /v1/chat/completions (SSE chunks, a final usage chunk, `[DONE]`), and
/metrics in Prometheus text with vLLM's spec-decode counters. A speculative fake drafts k tokens
per step and accepts a prefix whose per-token acceptance depends on the prompt (structured text
drafts well, prose does not, a higher temperature lowers it), so tests can check that a
calibration recovers a known ordering.
It also counts the requests it got, so a test can prove that a command touched no server, and
can be told to fail every completion after the first N (an engine that died mid-run).
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

STRUCTURED = set('{}[]()<>:;="')  # JSON/code/SQL syntax; prose has almost none of these


def default_alpha(prompt: str, temperature: float) -> float:
    """Per-token acceptance: high for punctuation-dense (JSON/code/SQL) prompts, lower for prose,
    and lower again at higher temperature."""
    text = prompt.replace(" ", "")
    density = sum(c in STRUCTURED for c in text) / max(1, len(text))
    base = 0.85 if density > 0.03 else 0.55
    return max(0.05, base - 0.3 * temperature)


@dataclass
class FakeVllm:
    """State of one fake server; `url` is its base URL (no /v1)."""

    speculative: bool
    k: int = 4
    version: str = "0.26.0"
    model: str = "fake-model"
    step_s: float = 0.001
    alpha_fn: Callable[[str, float], float] = default_alpha
    fail_after: int | None = None  # completions answered before it fails every request (HTTP 500)
    url: str = ""
    hits: dict[str, int] = field(default_factory=dict)
    drafts: int = 0
    draft_tokens: int = 0
    accepted: int = 0
    accepted_per_pos: list[int] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def metrics_text(self) -> str:
        """/metrics as vLLM 0.26 exposes it (counters with `_total`)."""
        lines = ["# HELP vllm:num_requests_running Requests running.",
                 "# TYPE vllm:num_requests_running gauge",
                 f'vllm:num_requests_running{{model_name="{self.model}"}} 0.0']  # fmt: skip
        if self.speculative:
            label = f'model_name="{self.model}"'
            for name, value in (
                ("num_drafts", self.drafts),
                ("num_draft_tokens", self.draft_tokens),
                ("num_accepted_tokens", self.accepted),
            ):
                lines += [
                    f"# HELP vllm:spec_decode_{name} Spec decode counter.",
                    f"# TYPE vllm:spec_decode_{name} counter",
                    f"vllm:spec_decode_{name}_total{{{label}}} {float(value)}",
                ]
            lines += [
                "# HELP vllm:spec_decode_num_accepted_tokens_per_pos Accepted per position.",
                "# TYPE vllm:spec_decode_num_accepted_tokens_per_pos counter",
            ]
            lines += [
                f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{label},position="{i}"}}'
                f" {float(v)}"
                for i, v in enumerate(self.accepted_per_pos)
            ]
        return "\n".join(lines) + "\n"

    def chunks(self, prompt: str, max_tokens: int, temperature: float) -> Iterator[int]:
        """Token counts of successive stream chunks; updates the counters as vLLM would."""
        rng = random.Random(f"{prompt[:64]}:{max_tokens}")
        left = max_tokens
        first = True
        while left > 0:
            time.sleep(self.step_s)
            if first or not self.speculative:
                first = False
                left -= 1
                yield 1
                continue
            alpha = self.alpha_fn(prompt, temperature)
            n_acc = 0
            while n_acc < self.k and rng.random() < alpha:
                n_acc += 1
            with self.lock:
                self.drafts += 1
                self.draft_tokens += self.k
                self.accepted += n_acc
                for i in range(n_acc):
                    self.accepted_per_pos[i] += 1
            emitted = min(left, n_acc + 1)
            left -= emitted
            yield emitted


def _handler(state: FakeVllm) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.0"  # body ends when the connection closes: simple streaming

        def log_message(self, *args: object) -> None:
            """Quiet: tests read the counters, not an access log."""

        def _count(self) -> None:
            with state.lock:
                state.hits[self.path] = state.hits.get(self.path, 0) + 1

        def _send(self, body: str, content_type: str = "application/json") -> None:
            data = body.encode()
            self.send_response(200)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            self._count()
            if self.path == "/health":
                self._send("")
            elif self.path == "/version":
                self._send(json.dumps({"version": state.version}))
            elif self.path == "/v1/models":
                models = [{"id": state.model, "object": "model", "max_model_len": 4096}]
                self._send(json.dumps({"object": "list", "data": models}))
            elif self.path == "/metrics":
                self._send(state.metrics_text(), "text/plain; version=0.0.4")
            else:
                self.send_error(404)

        def do_POST(self) -> None:
            self._count()
            if self.path not in ("/v1/completions", "/v1/chat/completions"):
                self.send_error(404)
                return
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            chat = self.path == "/v1/chat/completions"
            if chat:
                body["prompt"] = "\n".join(m["content"] for m in body["messages"])
            if state.fail_after is not None and state.hits[self.path] > state.fail_after:
                self.send_error(500, "engine dead")
                return
            prompt = body["prompt"]
            text = prompt if isinstance(prompt, str) else " ".join(map(str, prompt))
            prompt_tokens = len(prompt) if isinstance(prompt, list) else len(text.split())
            max_tokens = int(body.get("max_tokens") or 16)
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            sent = 0
            for n in state.chunks(text, max_tokens, float(body.get("temperature") or 0.0)):
                sent += n
                piece = {"delta": {"content": " tok" * n}} if chat else {"text": " tok" * n}
                chunk = {"choices": [{"index": 0, **piece, "finish_reason": None}]}
                self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                self.wfile.flush()
            usage = {"prompt_tokens": prompt_tokens, "completion_tokens": sent,
                     "total_tokens": prompt_tokens + sent}  # fmt: skip
            self.wfile.write(f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n".encode())
            self.wfile.write(b"data: [DONE]\n\n")

    return Handler


@contextmanager
def fake_vllm(speculative: bool, **options: object) -> Iterator[FakeVllm]:
    """Serve a FakeVllm on 127.0.0.1 at a free port for the duration of the block."""
    state = FakeVllm(speculative=speculative, **options)  # type: ignore[arg-type]
    state.accepted_per_pos = [0] * state.k
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(state))
    server.daemon_threads = True
    state.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
