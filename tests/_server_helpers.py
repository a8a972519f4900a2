"""Helpers for the server tests: free ports, a `lazyenc serve` subprocess, a uvicorn thread."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    """A port nobody listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def child_env(**extra: str) -> dict[str, str]:
    """os.environ plus this worktree on PYTHONPATH, offline hubs, and ``extra``."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["HF_HUB_OFFLINE"] = "1"
    env.update(extra)
    return env


def wait_ready(
    url: str,
    *,
    headers: dict[str, str] | None = None,
    proc: Any = None,
    log: Path | None = None,
    deadline_s: float = 90.0,
) -> httpx.Response:
    """Poll GET /v1/models until it answers; fail with the server's log if it dies or never answers."""
    end = time.monotonic() + deadline_s
    last: Exception | None = None
    while time.monotonic() < end:
        if proc is not None and proc.poll() is not None:
            text = log.read_text() if log else ""
            raise RuntimeError(f"server exited with {proc.returncode}:\n{text}")
        try:
            return httpx.get(f"{url}/v1/models", headers=headers, timeout=2.0)
        except httpx.TransportError as exc:
            last = exc
            time.sleep(0.1)
    raise RuntimeError(f"server at {url} not ready after {deadline_s} s: {last}")


@dataclass
class ServerProcess:
    """A `python -m lazyenc serve` child."""

    proc: subprocess.Popen[bytes]
    url: str
    log: Path
    headers: dict[str, str] = field(default_factory=dict)
    initial_models: Any = None  # the first GET /v1/models answer

    def terminate(self, timeout: float = 60.0) -> int:
        """SIGTERM, then wait; returns the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise


def start_server(
    config: Path,
    log: Path,
    *,
    env: dict[str, str],
    headers: dict[str, str] | None = None,
    extra_args: tuple[str, ...] = (),
) -> ServerProcess:
    """Start `lazyenc serve` on a free port and wait until /v1/models answers."""
    port = free_port()
    out = log.open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "lazyenc", "serve", "--config", str(config), "--port", str(port), *extra_args],
        stdout=out,
        stderr=subprocess.STDOUT,
        env=env,
        cwd=str(ROOT),
    )
    out.close()
    server = ServerProcess(proc, f"http://127.0.0.1:{port}", log, dict(headers or {}))
    try:
        first = wait_ready(server.url, headers=headers, proc=proc, log=log)
    except BaseException:
        server.terminate()
        raise
    server.initial_models = first.json()
    return server


class ThreadServer:
    """uvicorn.Server running an app in a thread; ``stop()`` asks for the graceful shutdown SIGTERM starts."""

    def __init__(self, app: Any) -> None:
        import uvicorn

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(
            uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning")
        )
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> ThreadServer:
        self.thread.start()
        wait_ready(self.url, deadline_s=30.0)
        return self

    def stop(self) -> None:
        """What uvicorn's SIGTERM handler does: stop accepting, finish in-flight requests, shut down."""
        self.server.should_exit = True

    def __exit__(self, *exc: Any) -> None:
        self.stop()
        self.thread.join(timeout=30)
