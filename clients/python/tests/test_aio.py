"""The asyncio client (grpc.aio) against real `charon serve` processes."""

from __future__ import annotations

import asyncio
import signal
import time
from typing import Awaitable, Callable

import pytest
from conftest import Charon, free_port

from charon_client import ClientError, ServerError, Source, aio


def run(charon_target: str, body: Callable[[aio.Client], Awaitable[None]], **kw: object) -> None:
    async def main() -> None:
        async with aio.Client(charon_target, **kw) as client:
            await body(client)

    asyncio.run(main())


def test_rate_charge_refund_and_dry_run(charon: Charon) -> None:
    async def body(client: aio.Client) -> None:
        assert (await client.request_rate("api/search", "t", copies=3)).granted == 3
        assert (await client.request_rate("api/search", "t", copies=3)).granted == 2
        rejected = await client.request_rate("api/search", "t")
        assert not rejected.success and rejected.retry_after is not None
        assert (await client.request_rate("api/keys", "t", copies=3, dry_run=True)).granted == 3
        assert (await client.request_rate("api/keys", "t", copies=3)).granted == 3
        assert (await client.charge("llm/tokens", "t", 150)).granted == 150
        assert (await client.refund("llm/tokens", "t", 60)).remaining == 10
        with pytest.raises(ClientError, match="unknown resource"):
            await client.request_rate("no/such", "t")

    run(charon.target, body)


def test_back_off_bounded_by_max_wait(charon: Charon) -> None:
    async def body(client: aio.Client) -> None:
        assert (await client.request_rate("api/slow", "t")).success
        started = time.monotonic()
        res = await client.request_rate("api/slow", "t", max_wait=1.0)
        elapsed = time.monotonic() - started
        assert not res.success and 0.95 <= elapsed < 1.6, elapsed

    run(charon.target, body, backoff_base=0.1)


def test_hold_released_on_exit_and_on_exception(charon: Charon) -> None:
    async def body(client: aio.Client) -> None:
        async with await client.hold_copy("sandbox/vm", "t", copies=10) as hold:
            await hold.release(4)
            assert hold.copies == 6
        with pytest.raises(RuntimeError):
            async with await client.hold_copy("sandbox/vm", "t", copies=15) as hold:
                assert hold.copies == 15
                raise RuntimeError("boom")
        async with await client.hold_copy("sandbox/vm", "t", copies=15) as again:
            assert again.copies == 15

    run(charon.target, body)


def test_transfer_and_seize(charon: Charon) -> None:
    async def body(client: aio.Client) -> None:
        async with aio.Client(charon.target) as other:
            async with await client.hold_copy("sandbox/vm", "t", copies=15) as mine:
                tid = await mine.transfer(10, ttl=30)
                async with await other.seize_copy(tid) as theirs:
                    assert (theirs.copies, mine.copies) == (10, 5)
                with pytest.raises(ClientError):
                    await other.seize_copy(tid)

    run(charon.target, body)


def test_kill_switch_and_multi(charon: Charon) -> None:
    async def body(client: aio.Client) -> None:
        async with await client.multi("t", ["db/conn", "gpu"], "api/render", max_copies=8) as g:
            assert g.copies == 2 and [h.copies for h in g.holds] == [2, 2]
        none = await client.multi("t", ["db/conn", "gpu"], "api/render", max_copies=8)
        assert not none.success and none.holds == []
        client.kill_switch = True
        res = await client.request_rate("api/render", "t", copies=2)
        assert (res.granted, res.source) == (1, Source.KILL_SWITCH)
        assert client.stats().kill_switch_grants == 1

    run(charon.target, body)


def test_degraded_mode_with_the_server_stopped(charon: Charon) -> None:
    async def body(client: aio.Client) -> None:
        assert (await client.request_rate("api/slow", "t")).success
        charon.signal(signal.SIGSTOP)
        try:
            res = await client.request_rate("api/slow", "t", copies=4, min_copies=2)
            assert (res.granted, res.source) == (2, Source.DEGRADED)
            hold = await client.hold_copy("gpu", "t", copies=3)
            assert hold.degraded and hold.copies == 1
            with pytest.raises(ServerError):
                await hold.transfer(1, ttl=10)
        finally:
            charon.kill()
        assert (await client.request_rate("api/slow", "t")).source is Source.DEGRADED
        assert client.stats().degraded_grants == 3

    run(charon.target, body, request_timeout=0.3)


def test_degraded_mode_with_no_server() -> None:
    async def body(client: aio.Client) -> None:
        res = await client.request_rate("api/search", "u", copies=10, min_copies=2)
        assert (res.granted, res.source) == (2, Source.DEGRADED)

    run(f"127.0.0.1:{free_port()}", body, request_timeout=0.5)


def test_many_tasks_share_one_client(charon: Charon) -> None:
    async def body(client: aio.Client) -> None:
        async def work() -> int:
            return sum([(await client.request_rate("api/aio", "t")).granted for _ in range(28)])

        granted = await asyncio.gather(*(work() for _ in range(50)))
        assert sum(granted) == 700  # 1,400 requests; the limit, exactly
        assert client.stats().requests == 1400

    run(charon.target, body)


def test_unary_transport(charon: Charon) -> None:
    async def body(client: aio.Client) -> None:
        assert (await client.request_rate("api/search", "t", copies=6)).granted == 5
        assert (await client.charge("llm/tokens", "t", 150)).granted == 150
        with pytest.raises(ClientError, match="unknown resource"):
            await client.request_rate("no/such", "t")
        assert client.live_generation() is None

    run(charon.target, body, rate_transport="unary")


def test_a_hold_dropped_without_async_with_is_released(charon: Charon) -> None:
    async def body(client: aio.Client) -> None:
        assert (await client.hold_copy("sandbox/vm", "t", copies=15)).granted == 15
        for _ in range(400):
            async with await client.hold_copy("sandbox/vm", "t", copies=15) as again:
                if again.copies == 15:
                    return
            await asyncio.sleep(0.05)
        pytest.fail("the dropped hold was never released")

    run(charon.target, body)


def test_hold_copy_waits_and_hears_the_result_is_ready(charon: Charon) -> None:
    async def body(client: aio.Client) -> None:
        first = await client.hold_copy("waits/aio", "x")
        assert first.success
        waiting = asyncio.ensure_future(client.hold_copy("waits/aio", "x", wait=20))
        await asyncio.sleep(0.2)  # it arrives first
        deadline = time.monotonic() + 10
        while True:
            full = await client.hold_copy("waits/aio", "y", wait=0.001)
            if full.queue_full:
                break
            assert time.monotonic() < deadline, "the waiter never waited"
            await asyncio.sleep(0.02)
        await first.release(1, result_ready=True)
        hold = await waiting
        assert not hold.success and hold.result_ready
        assert hold.waited_on_server is not None

    run(charon.target, body)
