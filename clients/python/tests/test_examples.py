"""Every example of examples/ (the paper's figures 4-7 and a capacity
lease) runs as a user would run it: against `charon serve` with the
repository's own examples/limits.yaml, the file the README tells users to
start with."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import Charon, Redis

from charon_client import Client

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
COOKBOOK = Path(__file__).resolve().parents[3] / "examples" / "limits.yaml"
NAMES = sorted(p.name for p in EXAMPLES.glob("*.py"))


def cookbook() -> str:
    return COOKBOOK.read_text()


def run(name: str, *targets: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "CHARON_TARGET": targets[0], "CHARON_TARGET_2": targets[-1]}
    return subprocess.run(
        [sys.executable, str(EXAMPLES / name)], env=env, capture_output=True, text=True, timeout=60
    )


def test_the_examples_are_the_figures_and_the_lease() -> None:
    assert NAMES == [
        "fig4_max_wait.py",
        "fig5_hold.py",
        "fig6_transfer.py",
        "fig7_multi.py",
        "lease.py",
    ]


@pytest.mark.parametrize("name", NAMES)
def test_every_example_runs_against_the_cookbook(name: str) -> None:
    if name == "fig6_transfer.py":
        # Process 2 seizes on another server of the same store.
        redis = Redis()
        servers = [Charon(cookbook(), redis.store_args()) for _ in range(2)]
        try:
            done = run(name, servers[0].target, servers[1].target)
            assert done.returncode == 0, done.stderr
            assert "process 2 has 6" in done.stdout and "process 1 has 4" in done.stdout
        finally:
            for s in servers:
                s.close()
            redis.close()
        return
    server = Charon(cookbook(), [])
    try:
        done = run(name, server.target)
        assert done.returncode == 0, done.stderr
        assert done.stdout, name
        if name == "lease.py":
            assert "query 9" in done.stdout and "at 20 a second" in done.stdout, done.stdout
            assert server.leases("db/qps")["leases"] == []
        if name == "fig7_multi.py":
            assert "processing 2" in done.stdout, done.stdout
    finally:
        server.close()


def test_figure_4_gives_up_after_max_wait() -> None:
    server = Charon(cookbook(), [])
    try:
        # Six logins at once: five in the first tier, the sixth lands in the
        # prison tier (one login in 15 s), which the example then waits for
        # in vain for 5 s.
        client = Client(server.target, fail_open=False)
        assert all(client.request_rate("api/login", "user-42").success for _ in range(6))
        done = run("fig4_max_wait.py", server.target)
        assert done.returncode != 0
        assert "OverLimitError" in done.stderr, done.stderr
        client.close()
    finally:
        server.close()
