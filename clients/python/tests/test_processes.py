"""Holds across processes: a holder killed with SIGKILL (the server ends
its session and releases its copies) and a transfer seized by another
process, on the in-memory store and across two servers of one Redis."""

from __future__ import annotations

import signal
import time

import pytest
from conftest import LIMITS, Charon, Redis, child

from charon_client import Client


def wait_for_all_copies(client: Client, resource: str, domain: str, copies: int) -> float:
    """Polls until all `copies` can be held again; returns the seconds it took."""
    started = time.monotonic()
    while time.monotonic() - started < 30:
        with client.hold_copy(resource, domain, copies=copies, min_copies=copies) as h:
            if h.success:
                return time.monotonic() - started
        time.sleep(0.05)
    pytest.fail(f"the copies of {resource} never came back")


@pytest.mark.parametrize("store", ["memory", "redis"])
def test_copies_return_when_the_holder_is_killed(store: str) -> None:
    redis = Redis() if store == "redis" else None
    charon = Charon(LIMITS, redis.store_args() if redis else [])
    try:
        holder = child("hold", charon.target, "sandbox/vm", "d", "15")
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "held 15"
        client = Client(charon.target)
        assert not client.hold_copy("sandbox/vm", "d").success
        holder.send_signal(signal.SIGKILL)
        holder.wait()
        wait_for_all_copies(client, "sandbox/vm", "d", 15)
    finally:
        charon.close()
        if redis:
            redis.close()


def test_transfer_to_a_second_process_on_another_server() -> None:
    redis = Redis()
    one = Charon(LIMITS, redis.store_args())
    two = Charon(LIMITS, redis.store_args())
    try:
        client = Client(one.target)
        with client.hold_copy("sandbox/vm", "d", copies=15) as mine:
            tid = mine.transfer(10, ttl=30)
            assert mine.copies == 5
            seizer = child("seize", two.target, tid)
            assert seizer.stdout is not None and seizer.stdin is not None
            assert seizer.stdout.readline().strip() == "seized 10"
            assert seizer.stdout.readline().strip() == "has 5"
            # 5 here, 5 there: 5 are free.
            with client.hold_copy("sandbox/vm", "d", copies=15) as free:
                assert free.granted == 5
            seizer.stdin.write("go\n")
            seizer.stdin.flush()
            assert seizer.stdout.readline().strip() == "released"
            assert seizer.wait() == 0
            with client.hold_copy("sandbox/vm", "d", copies=15) as free:
                assert free.granted == 10
        wait_for_all_copies(client, "sandbox/vm", "d", 15)
    finally:
        two.close()
        one.close()
        redis.close()
