"""Fixtures: real `charon serve` processes and private `redis-server`s.

The binary is `$CHARON_BIN` (the Rust runner `crates/cli/tests/cli/envoy_python.rs`
sets it to the `charon` cargo built). Each server gets free ports and a
temporary directory of its own; everything started here is killed at the end.
"""

import os
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request

import grpc
import pytest

from envoy.service.ratelimit.v3 import rls_pb2_grpc


def charon_bin():
    path = os.environ.get("CHARON_BIN")
    if not path or not os.access(path, os.X_OK):
        pytest.exit("set CHARON_BIN to the charon binary (target/debug/charon)", 2)
    return path


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def answers_ping(port):
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")
    except OSError:
        return False


class Redis:
    """A private redis-server on a free port in a temporary directory."""

    def __init__(self):
        self.dir = tempfile.TemporaryDirectory(prefix="charon-envoy-redis-")
        for _attempt in range(5):
            self.port = free_port()
            self.proc = subprocess.Popen(
                ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1",
                 "--save", "", "--appendonly", "no", "--dir", self.dir.name,
                 "--logfile", ""],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )
            deadline = time.monotonic() + 10
            while self.proc.poll() is None and time.monotonic() < deadline:
                if answers_ping(self.port):
                    return
                time.sleep(0.02)
            self.kill()
        raise RuntimeError("redis-server did not start")

    @property
    def url(self):
        return f"redis://127.0.0.1:{self.port}"

    def stop(self):
        """SIGSTOP: the port stays open, nothing answers (a hung Redis)."""
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self):
        self.proc.send_signal(signal.SIGCONT)

    def kill(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
        self.proc.wait()

    def close(self):
        self.kill()
        self.dir.cleanup()


class Charon:
    """`charon serve --config FILE` on free ports; waits for /readyz."""

    def __init__(self, config, extra=()):
        self.dir = tempfile.TemporaryDirectory(prefix="charon-envoy-")
        self.config_path = os.path.join(self.dir.name, "limits.yaml")
        with open(self.config_path, "w") as f:
            f.write(config)
        self.log_path = os.path.join(self.dir.name, "charon.log")
        self.proc = None
        self.channel = None
        # A port free a moment ago may be taken before the server binds it.
        for _attempt in range(4):
            self.grpc_port, self.http_port = free_port(), free_port()
            if self._spawn(extra):
                break
            if "cannot listen on" not in self.log():
                break
        if self.proc is None or self.proc.poll() is not None or not self._ready():
            log = self.log()
            self.close()
            raise RuntimeError(f"charon serve did not become ready:\n{log}")
        self.channel = grpc.insecure_channel(f"127.0.0.1:{self.grpc_port}")
        self.stub = rls_pb2_grpc.RateLimitServiceStub(self.channel)

    def _spawn(self, extra):
        with open(self.log_path, "a") as log:
            self.proc = subprocess.Popen(
                [charon_bin(), "serve", "--config", self.config_path,
                 "--listen", f"127.0.0.1:{self.grpc_port}",
                 "--http-listen", f"127.0.0.1:{self.http_port}", *extra],
                stdout=subprocess.DEVNULL, stderr=log,
                env={**os.environ, "RUST_LOG": "info"},
            )
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

    def _ready(self):
        return self.http_get("/readyz")[0] == 200

    def http_get(self, path):
        try:
            with urllib.request.urlopen(
                f"http://127.0.0.1:{self.http_port}{path}", timeout=2
            ) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()
        except OSError:
            return None, ""

    def log(self):
        try:
            with open(self.log_path) as f:
                return f.read()
        except OSError:
            return ""

    def close(self):
        if self.channel is not None:
            self.channel.close()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.dir.cleanup()


@pytest.fixture
def redis():
    r = Redis()
    yield r
    r.close()


@pytest.fixture(params=["memory", "redis"])
def serve(request):
    """A factory: `serve(config)` starts charon serve on `config` in the
    embedded in-memory store or in the Redis store on a private Redis
    (`serve.redis`), both killed at the end."""
    started = []

    class Factory:
        store = request.param
        redis = None

        def __call__(self, config, extra=()):
            extra = list(extra)
            if self.store == "redis":
                if self.redis is None:
                    self.redis = Redis()
                    started.append(self.redis)
                # A fresh Redis generation opens copy reserves (and
                # /readyz) after half a liveness ttl: 0.5 s, not 5 s.
                extra += ["--store", self.redis.url, "--liveness-ttl", "1s"]
            c = Charon(config, extra)
            started.append(c)
            return c

    yield Factory()
    for thing in reversed(started):
        thing.close()
