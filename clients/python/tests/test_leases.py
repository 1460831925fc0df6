"""Capacity leases (SPEC §12), sync and asyncio, against real `charon serve`
processes; the server's side is read from `GET /v1/leases`. `db/qps` and
`db/short` share 60 by fair share, refreshed every 200 ms, leases of 2 s
and 1 s, safe capacity 10 (conftest.LIMITS)."""

from __future__ import annotations

import asyncio
import gc
import math
import threading
import time
from typing import Callable

import pytest
from conftest import Charon, free_port

from charon_client import Client, ClientError, LeaseSource, LeaseStatus, ServerError, aio


def wait_until(done: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            pytest.fail(f"not within {timeout} s: {what}")
        time.sleep(0.02)


def holders(charon: Charon, resource: str) -> list[tuple[str, float, float]]:
    """(client, capacity, wants) of each lease the server holds."""
    leases = charon.leases(resource)["leases"]
    assert isinstance(leases, list)
    return sorted((x["client"], x["capacity"], x["wants"]) for x in leases)


def test_two_leases_settle_on_fair_shares(charon: Charon) -> None:
    client = Client(charon.target)
    with client.lease("db/qps", 60, client_id="a") as a:
        s = a.status()
        assert (s.capacity, s.source, s.wants, s.safe_capacity) == (60, LeaseSource.SERVER, 60, 10)
        assert 1000 < s.expires_in_ms <= 2000 and (s.refreshes, s.failures) == (1, 0)
        with client.lease("db/qps", 60, client_id="b") as b:
            # b gets what a does not hold (0) until a shrinks at its refresh.
            wait_until(lambda: a.capacity == 30 and b.capacity == 30, 5, "30 each")
            assert b.status().refreshes >= 2 and b.status().failures == 0
            page = charon.leases("db/qps")
            assert (page["capacity"], page["leased"], page["wanted"], page["clients"]) == (
                60,
                60,
                120,
                2,
            )
            assert holders(charon, "db/qps") == [("a", 30, 60), ("b", 30, 60)]
        # Leaving b's block gave it back; a takes it all at a refresh.
        assert [h[0] for h in holders(charon, "db/qps")] == ["a"]
        wait_until(lambda: a.capacity == 60, 5, "a back to 60")
    assert holders(charon, "db/qps") == []
    assert a.status().source is LeaseSource.RELEASED and a.capacity == 0


def test_acquire_never_goes_faster_than_the_lease(charon: Charon) -> None:
    client = Client(charon.target)
    with client.lease("db/short", 1) as slow:
        assert slow.try_acquire(), "the first unit at once"
        assert not slow.try_acquire(), "the next one a second later"
        assert not slow.acquire(timeout=0.01)
    with client.lease("db/qps", 40) as lease:
        assert lease.capacity == 40
        # Four threads share the lease: 40 units a second in all.
        counts = [0] * 4
        started = time.monotonic()

        def spend(i: int) -> None:
            while time.monotonic() - started < 0.5:
                assert lease.acquire()
                counts[i] += 1

        threads = [threading.Thread(target=spend, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        elapsed = time.monotonic() - started
        assert 0 < sum(counts) <= 40 * elapsed + 1, (counts, elapsed)
        assert sum(counts) >= 10, counts
        assert all(counts), counts


def test_released_on_an_exception_on_close_and_when_dropped(charon: Charon) -> None:
    client = Client(charon.target)
    with pytest.raises(RuntimeError, match="boom"):
        with client.lease("db/qps", 10, client_id="boom") as lease:
            assert holders(charon, "db/qps") == [("boom", 10, 10)]
            raise RuntimeError("boom")
    assert holders(charon, "db/qps") == []
    assert lease.released and lease.release() is False
    with pytest.raises(ClientError, match="released"):
        lease.acquire()
    # Closing the client gives back what it still holds.
    kept = client.lease("db/qps", 10, client_id="kept")
    other = Client(charon.target)
    dropped = other.lease("db/qps", 10, client_id="dropped")
    assert [h[0] for h in holders(charon, "db/qps")] == ["dropped", "kept"]
    client.close()
    assert kept.released and [h[0] for h in holders(charon, "db/qps")] == ["dropped"]
    # A lease merely dropped is given back by its refresher.
    del dropped
    gc.collect()
    wait_until(lambda: holders(charon, "db/qps") == [], 2, "the dropped lease given back")
    other.close()


def test_modes_once_the_lease_expired_without_a_server(charon: Charon) -> None:
    client = Client(charon.target, request_timeout=0.3)
    leases = {
        mode: client.lease("db/qps", 100, client_id=mode, mode=mode)
        for mode in ("safe", "optimistic", "pessimistic")
    }
    wait_until(lambda: all(x.capacity == 20 for x in leases.values()), 5, "20 each")
    charon.kill()

    # Refreshes fail, and the lease in hand holds until it expires (2 s
    # after the last refresh).
    def failed_on_the_lease_in_hand(status: LeaseStatus) -> bool:
        assert status.source is LeaseSource.SERVER or status.failures, status
        return status.failures > 0 and (status.capacity, status.source) == (20, LeaseSource.SERVER)

    wait_until(
        lambda: all(failed_on_the_lease_in_hand(x.status()) for x in leases.values()),
        1.5,
        "a failure while the lease holds",
    )
    assert all(isinstance(x.last_error, ServerError) for x in leases.values())
    wait_until(
        lambda: all(x.status().source is not LeaseSource.SERVER for x in leases.values()),
        3,
        "the leases expire",
    )
    safe, optimistic, pessimistic = (x.status() for x in leases.values())
    assert (safe.capacity, safe.source) == (10, LeaseSource.SAFE)
    assert (optimistic.capacity, optimistic.source) == (100, LeaseSource.OPTIMISTIC)
    assert (pessimistic.capacity, pessimistic.source) == (0, LeaseSource.PESSIMISTIC)
    assert safe.expires_in_ms == 0 and safe.safe_capacity == 10
    assert leases["optimistic"].acquire(timeout=1)
    assert not leases["pessimistic"].try_acquire()
    assert not leases["pessimistic"].acquire(timeout=0.05)
    with pytest.raises(ServerError):
        leases["safe"].release()  # the server cannot be told


def test_no_server_at_all_starts_in_the_mode() -> None:
    client = Client(f"127.0.0.1:{free_port()}", request_timeout=0.3)
    safe = client.lease("db/qps", 5)
    s = safe.status()
    # Safe mode with no answer ever: no safe capacity known, so nothing.
    assert (s.capacity, s.source, s.refreshes, s.failures) == (0, LeaseSource.SAFE, 0, 1)
    assert isinstance(safe.last_error, ServerError)
    optimistic = client.lease("db/qps", 5, mode="optimistic")
    assert (optimistic.capacity, optimistic.status().source) == (5, LeaseSource.OPTIMISTIC)
    assert optimistic.try_acquire()
    pessimistic = client.lease("db/qps", 5, mode="pessimistic")
    assert not pessimistic.acquire(timeout=0.05)
    # Wrong arguments are refused before anything is sent.
    with pytest.raises(ClientError):
        client.lease("db/qps", -1)
    client.close()


def test_refused_leases_are_client_errors(charon: Charon) -> None:
    client = Client(charon.target)
    with pytest.raises(ClientError, match="(?i)unknown|not found|no/such"):
        client.lease("no/such", 1)
    with pytest.raises(ClientError, match="lease"):
        client.lease("api/search", 1)  # a rate resource
    for wants in (-1.0, math.nan, math.inf):
        with pytest.raises(ClientError, match="wants"):
            client.lease("db/qps", wants)
    with pytest.raises(ClientError, match="mode"):
        client.lease("db/qps", 1, mode="hopeful")  # type: ignore[arg-type]
    with pytest.raises(ClientError, match="client_id"):
        client.lease("db/qps", 1, client_id="")
    with pytest.raises(ClientError, match="client_id"):
        client.lease("db/qps", 1, client_id="a\nb")
    assert holders(charon, "db/qps") == []


def test_adaptive_wants_follow_use(charon: Charon) -> None:
    client = Client(charon.target)
    with client.lease("db/qps", 40, client_id="idle", adaptive=True) as idle:
        assert idle.capacity == 40, "the first ask is for all it may want"
        # Unused, it asks for nothing at its next refresh...
        wait_until(lambda: idle.status().wants == 0, 2, "idle wants 0")
        # ... so another may have it all.
        with client.lease("db/qps", 60, client_id="busy") as busy:
            wait_until(lambda: busy.capacity == 60, 3, "busy gets it all")
            assert holders(charon, "db/qps") == [("busy", 60, 60), ("idle", 0, 0)]
            # Used again (units waited for count), it asks for more.
            deadline = time.monotonic() + 2
            while idle.status().wants == 0:
                assert time.monotonic() < deadline, idle.status()
                idle.acquire(timeout=0.02)
            assert 0 < idle.status().wants <= 40


def test_async_main_path(charon: Charon) -> None:
    async def main() -> None:
        async with aio.Client(charon.target) as client:
            async with await client.lease("db/qps", 60, client_id="a") as a:
                assert (a.capacity, a.status().source) == (60, LeaseSource.SERVER)
                async with await client.lease("db/qps", 60, client_id="b") as b:
                    deadline = time.monotonic() + 5
                    while not (a.capacity == 30 and b.capacity == 30):
                        assert time.monotonic() < deadline, (a.status(), b.status())
                        await b.changed(timeout=0.5)
                    assert holders(charon, "db/qps") == [("a", 30, 60), ("b", 30, 60)]
                    # Three tasks on one lease: never faster than 30 a second.
                    started = time.monotonic()

                    async def spend() -> int:
                        n = 0
                        while time.monotonic() - started < 0.5:
                            assert await b.acquire()
                            n += 1
                        return n

                    counts = await asyncio.gather(spend(), spend(), spend())
                    elapsed = time.monotonic() - started
                    assert 0 < sum(counts) <= 30 * elapsed + 1, (counts, elapsed)
                assert [h[0] for h in holders(charon, "db/qps")] == ["a"]
            async with await client.lease("db/short", 1) as slow:
                assert slow.try_acquire() and not slow.try_acquire()
                assert not await slow.acquire(timeout=0.01)
            assert holders(charon, "db/qps") == []
            with pytest.raises(RuntimeError):
                async with await client.lease("db/qps", 5, client_id="boom") as c:
                    assert holders(charon, "db/qps") == [("boom", 5, 5)]
                    raise RuntimeError("boom")
            assert c.released and holders(charon, "db/qps") == []
            with pytest.raises(ClientError):
                await c.acquire()
            with pytest.raises(ClientError):
                await client.lease("no/such", 1)
            with pytest.raises(ClientError):
                await client.lease("api/search", 1)
            with pytest.raises(ClientError):
                await client.lease("db/qps", math.nan)
            # Dropped without a release, or still held on close: given back.
            dropped = await client.lease("db/qps", 5, client_id="dropped")
            kept = await client.lease("db/qps", 5, client_id="kept")
            del dropped
            gc.collect()
            deadline = time.monotonic() + 2
            while [h[0] for h in holders(charon, "db/qps")] != ["kept"]:
                assert time.monotonic() < deadline, holders(charon, "db/qps")
                await asyncio.sleep(0.02)
        assert kept.released and holders(charon, "db/qps") == []

    asyncio.run(main())


def test_async_lease_without_a_server() -> None:
    async def main() -> None:
        async with aio.Client(f"127.0.0.1:{free_port()}", request_timeout=0.3) as client:
            lease = await client.lease("db/qps", 5, mode="pessimistic")
            assert lease.status().source is LeaseSource.PESSIMISTIC
            assert not await lease.acquire(timeout=0.05)
            optimistic = await client.lease("db/qps", 5, mode="optimistic")
            assert await optimistic.acquire(timeout=0.05)
            with pytest.raises(ServerError):
                await lease.release()

    asyncio.run(main())
