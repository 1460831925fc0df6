"""Fixtures: real `charon serve` processes ($CHARON_BIN) and private
`redis-server`s, each on free ports in a temporary directory of its own;
everything started here is killed at the end."""

from __future__ import annotations

import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Iterator

import pytest
import shells

HERE = Path(__file__).resolve().parent

LIMITS = """
resources:
  - { name: api/search, kind: rate, tiers: [ { limit: 5, window: 60s } ] }
  - { name: api/slow, kind: rate, tiers: [ { limit: 1, window: 60s } ] }
  - { name: api/short, kind: rate, tiers: [ { limit: 1, window: 300ms } ] }
  - { name: api/many, kind: rate, tiers: [ { limit: 5000, window: 3600s } ] }
  - { name: api/aio, kind: rate, tiers: [ { limit: 700, window: 3600s } ] }
  - { name: api/render, kind: rate, tiers: [ { limit: 2, window: 60s } ] }
  - { name: llm/tokens, kind: bucket, burst: 100, count: 100, period: 3600s }
  - { name: api/keys, kind: window, algorithm: fixed, limit: 3, window: 1h }
  - { name: sandbox/vm, kind: copy, domain_limit: 15 }
  - { name: db/conn, kind: copy, domain_limit: 8 }
  - { name: gpu, kind: copy, domain_limit: 3 }
  - { name: db/qps, kind: lease, capacity: 60, algorithm: fair_share, lease_length: 2s,
      refresh_interval: 200ms, learning_mode: 0s, safe_capacity: 10 }
  - { name: db/short, kind: lease, capacity: 60, algorithm: fair_share, lease_length: 1s,
      refresh_interval: 200ms, learning_mode: 0s, safe_capacity: 10 }
"""


def charon_bin() -> str:
    path = os.environ.get("CHARON_BIN")
    if not path or not os.access(path, os.X_OK):
        pytest.exit("set CHARON_BIN to the charon binary (target/debug/charon)", 2)
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def answers_ping(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")
    except OSError:
        return False


class Redis:
    """A private redis-server on a free port in a temporary directory."""

    def __init__(self) -> None:
        self.dir = tempfile.TemporaryDirectory(prefix="charon-py-redis-")
        for _attempt in range(5):
            self.port = free_port()
            self.proc = subprocess.Popen(
                ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1",
                 "--save", "", "--appendonly", "no", "--dir", self.dir.name,
                 "--logfile", ""],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )  # fmt: skip
            deadline = time.monotonic() + 10
            while self.proc.poll() is None and time.monotonic() < deadline:
                if answers_ping(self.port):
                    return
                time.sleep(0.02)
            self.kill()
        raise RuntimeError("redis-server did not start")

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    def store_args(self) -> list[str]:
        """`charon serve` flags for this Redis. A server on Redis is ready
        after about half its liveness TTL: a short one keeps the suite fast."""
        return ["--store", self.url, "--liveness-ttl", "2s"]

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()

    def close(self) -> None:
        self.kill()
        self.dir.cleanup()


class Charon:
    """`charon serve --config FILE` on free ports; waits for /readyz.
    ``files`` are written into its directory first (``{dir}`` in ``extra``
    names it); ``ssl_context`` probes /readyz over HTTPS (a TLS server)."""

    def __init__(
        self,
        config: str,
        extra: list[str],
        files: dict[str, bytes] | None = None,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.dir = tempfile.TemporaryDirectory(prefix="charon-py-")
        self.config_path = os.path.join(self.dir.name, "limits.yaml")
        with open(self.config_path, "w") as f:
            f.write(config)
        for name, data in (files or {}).items():
            with open(os.path.join(self.dir.name, name), "wb") as b:
                b.write(data)
        extra = [a.replace("{dir}", self.dir.name) for a in extra]
        self.ssl_context = ssl_context
        self.log_path = os.path.join(self.dir.name, "charon.log")
        self.proc: subprocess.Popen[bytes] | None = None
        # A port free a moment ago may be taken before the server binds it.
        for _attempt in range(4):
            self.grpc_port, self.http_port = free_port(), free_port()
            if self._spawn(extra) or "cannot listen on" not in self.log():
                break
        if self.proc is None or self.proc.poll() is not None or not self._ready():
            log = self.log()
            self.close()
            raise RuntimeError(f"charon serve did not become ready:\n{log}")

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def _spawn(self, extra: list[str]) -> bool:
        with open(self.log_path, "a") as log:
            self.proc = subprocess.Popen(
                [charon_bin(), "serve", "--config", self.config_path,
                 "--listen", self.target, "--http-listen", f"127.0.0.1:{self.http_port}",
                 "--keepalive", "2s", *extra],
                stdout=subprocess.DEVNULL, stderr=log,
            )  # fmt: skip
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self._ready():
                return True
            if self.proc.poll() is not None:
                return False
            time.sleep(0.025)
        self.proc.kill()
        self.proc.wait()
        return False

    def _ready(self) -> bool:
        scheme = "https" if self.ssl_context is not None else "http"
        try:
            with urllib.request.urlopen(
                f"{scheme}://127.0.0.1:{self.http_port}/readyz",
                timeout=2,
                context=self.ssl_context,
            ) as r:
                return bool(r.status == 200)
        except (urllib.error.HTTPError, OSError):
            return False

    def leases(self, resource: str) -> dict[str, object]:
        """The resource's entry of `GET /v1/leases` (what the server holds)."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.http_port}/v1/leases", timeout=5) as r:
            page = json.load(r)
        for entry in page["resources"]:
            if entry["resource"] == resource:
                return dict(entry)
        raise AssertionError(f"{resource} is not on the leases page: {page}")

    def log(self) -> str:
        try:
            with open(self.log_path) as f:
                return f.read()
        except OSError:
            return ""

    def signal(self, sig: int) -> None:
        """Sends ``sig``; for SIGSTOP, waits until every thread has stopped
        (the signal is only queued when ``kill`` returns, and a busy thread
        may still answer a request or two: a test that stops the server to
        hold requests in flight must not see that)."""
        assert self.proc is not None
        self.proc.send_signal(sig)
        if sig == signal.SIGSTOP:
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline and not self._stopped():
                time.sleep(0.001)

    def _stopped(self) -> bool:
        assert self.proc is not None
        tasks = f"/proc/{self.proc.pid}/task"
        try:
            for t in os.listdir(tasks):
                with open(f"{tasks}/{t}/stat") as f:
                    state = f.read().rsplit(") ", 1)[1][:1]
                if state not in ("T", "t"):
                    return False
        except OSError:
            return False
        return True

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
            self.proc.wait()

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.dir.cleanup()


@pytest.fixture
def charon():
    """A `charon serve` on the in-memory store with LIMITS."""
    c = Charon(LIMITS, [])
    yield c
    c.close()


@pytest.fixture
def charon_redis():
    """A `charon serve` on a private redis-server with LIMITS."""
    r = Redis()
    c = Charon(LIMITS, r.store_args())
    yield c
    c.close()
    r.close()


@pytest.fixture(params=["sync", "aio"])
def make_client(request: pytest.FixtureRequest) -> Iterator[shells.MakeClient]:
    """Makes clients of the sync shell, then (second run) of the asyncio
    one shown as sync: a test taking it is run on both."""
    yield from shells.shell(request.param)


@pytest.fixture(params=["memory", "redis"])
def any_store(request: pytest.FixtureRequest):
    """A `charon serve` with LIMITS, once on each store."""
    r = Redis() if request.param == "redis" else None
    c = Charon(LIMITS, r.store_args() if r else [])
    yield c
    c.close()
    if r:
        r.close()


def child(*args: str) -> subprocess.Popen[str]:
    """A Python child process running tests/child.py with `args`."""
    return subprocess.Popen(
        [sys.executable, str(HERE / "child.py"), *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
