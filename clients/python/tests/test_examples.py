"""The README's figures 4-7 and its lease example (examples/*.py) run
against real servers."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import LIMITS, Charon, Redis

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def run(name: str, *targets: str) -> str:
    env = {**os.environ, "CHARON_TARGET": targets[0], "CHARON_TARGET_2": targets[-1]}
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / name)], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.parametrize("name", ["fig4_max_wait.py", "fig5_hold.py", "fig7_multi.py"])
def test_figure(charon: Charon, name: str) -> None:
    assert run(name, charon.target)


def test_lease_example(charon: Charon) -> None:
    out = run("lease.py", charon.target)
    assert "query 9" in out and "at 20 a second" in out, out
    assert charon.leases("db/qps")["leases"] == []


def test_figure_4_gives_up_after_max_wait(charon: Charon) -> None:
    for _ in range(5):
        run("fig4_max_wait.py", charon.target)
    env = {**os.environ, "CHARON_TARGET": charon.target}
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / "fig4_max_wait.py")], env=env, capture_output=True,
        text=True, timeout=60,
    )  # fmt: skip
    assert "OverLimitError" in done.stderr


def test_figure_6_across_two_servers() -> None:
    redis = Redis()
    one = Charon(LIMITS, redis.store_args())
    two = Charon(LIMITS, redis.store_args())
    try:
        out = run("fig6_transfer.py", one.target, two.target)
        assert "process 2 has 10" in out and "process 1 has 5" in out
    finally:
        two.close()
        one.close()
        redis.close()
