"""The client against real `charon serve` processes: the tests taking
`make_client` run on the sync shell and again on the asyncio one."""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
import time

import pytest
from conftest import Charon, free_port
from shells import MakeClient

from charon_client import Client, ClientError, Hold, ServerError, Source, aio


def test_request_rate_grants_then_rejects_with_context(
    charon: Charon, make_client: MakeClient
) -> None:
    client = make_client(charon.target)
    assert client.request_rate("api/search", "t", copies=3).granted == 3
    two = client.request_rate("api/search", "t", copies=3)
    assert (two.granted, two.source) == (2, Source.SERVER)
    assert two.reply is not None and two.reply.remaining == 0
    rejected = client.request_rate("api/search", "t")
    # A rejection is an answer, not an exception.
    assert not rejected.success and rejected.granted == 0
    assert rejected.retry_after is not None and rejected.retry_after > 50
    # min_copies above what is left: rejected, and never a grant of less.
    assert client.request_rate("api/search", "u", copies=6, min_copies=6).granted == 0
    assert client.stats().rejections == 2


def test_dry_run_records_nothing(charon: Charon, make_client: MakeClient) -> None:
    client = make_client(charon.target)
    for _ in range(3):
        dry = client.request_rate("api/keys", "t", copies=3, dry_run=True)
        assert dry.granted == 3
    assert client.request_rate("api/keys", "t", copies=3).granted == 3
    assert client.request_rate("api/keys", "t", dry_run=True).granted == 0


def test_charge_goes_into_debt_and_refund_pays_back(
    charon: Charon, make_client: MakeClient
) -> None:
    client = make_client(charon.target)
    assert client.charge("llm/tokens", "t", 150).granted == 150
    assert client.request_rate("llm/tokens", "t").granted == 0
    refund = client.refund("llm/tokens", "t", 60)
    assert refund.granted == 60 and refund.remaining == 10
    assert client.request_rate("llm/tokens", "t", copies=10).granted == 10
    with pytest.raises(ClientError):
        client.refund("api/keys", "t", 1)  # only buckets take tokens back


def test_client_errors_are_exceptions_and_never_degraded(
    charon: Charon, make_client: MakeClient
) -> None:
    client = make_client(charon.target)
    with pytest.raises(ClientError, match="unknown resource"):
        client.request_rate("no/such", "t")
    with pytest.raises(ClientError):
        client.request_rate("api/search", "t", copies=0)
    with pytest.raises(ClientError):
        client.request_rate("api/search", "t", copies=2, min_copies=3)
    with pytest.raises(ClientError):
        client.hold_copy("api/search", "t")  # a rate resource cannot be held
    with pytest.raises(ClientError):
        client.seize_copy("not-a-transfer")
    for bad in ("", "127.0.0.1", "ftp://127.0.0.1:1", "http://127.0.0.1:1/path", "h:port"):
        with pytest.raises(ClientError) as refused:
            make_client(bad)
        assert refused.value.kind == "settings", refused.value
    assert client.stats().degraded_grants == 0
    # The session survives bad operations.
    assert client.request_rate("api/search", "t").success


def test_back_off_is_bounded_by_max_wait(charon: Charon, make_client: MakeClient) -> None:
    client = make_client(charon.target, backoff_base=0.1)
    assert client.request_rate("api/slow", "t").success
    started = time.monotonic()
    res = client.request_rate("api/slow", "t", max_wait=1.0)
    elapsed = time.monotonic() - started
    assert not res.success
    # It kept trying until max_wait ran out, and no longer.
    assert 0.95 <= elapsed < 1.6, elapsed
    assert 0.95 <= res.waited < 1.6


def test_back_off_uses_retry_after(charon: Charon, make_client: MakeClient) -> None:
    # A base of 10 s would sleep 15-25 s after the first rejection; the
    # server says 300 ms.
    client = make_client(charon.target, backoff_base=10.0)
    assert client.request_rate("api/short", "t").success
    res = client.request_rate("api/short", "t", max_wait=5)
    assert res.success
    assert 0.2 <= res.waited < 2.5, res.waited


def test_hold_released_on_leaving_the_block(charon: Charon, make_client: MakeClient) -> None:
    client = make_client(charon.target)
    with client.hold_copy("sandbox/vm", "t", copies=10) as hold:
        assert hold.success and hold.copies == 10
        hold.release(4)
        assert hold.copies == 6
        assert client.hold_copy("sandbox/vm", "t", copies=15, min_copies=10).granted == 0
    with client.hold_copy("sandbox/vm", "t", copies=15) as again:
        assert again.copies == 15


def test_hold_released_on_an_exception(charon: Charon, make_client: MakeClient) -> None:
    client = make_client(charon.target)
    with pytest.raises(RuntimeError, match="boom"):
        with client.hold_copy("sandbox/vm", "t", copies=15) as hold:
            assert hold.copies == 15
            raise RuntimeError("boom")
    assert hold.copies == 0
    with client.hold_copy("sandbox/vm", "t", copies=15) as again:
        assert again.copies == 15


def test_rejected_hold_and_waiting_for_copies(charon: Charon, make_client: MakeClient) -> None:
    client = make_client(charon.target, backoff_base=0.05)
    other = make_client(charon.target)
    held = other.hold_copy("gpu", "t", copies=3)
    rejected = client.hold_copy("gpu", "t")
    assert not rejected.success and rejected.copies == 0
    threading.Timer(0.3, held.release_all).start()
    with client.hold_copy("gpu", "t", copies=2, max_wait=5) as waited:
        assert waited.copies == 2 and waited.waited > 0.2


def test_transfer_and_seize_in_one_process(charon: Charon, make_client: MakeClient) -> None:
    a, b = make_client(charon.target), make_client(charon.target)
    with a.hold_copy("sandbox/vm", "t", copies=15) as mine:
        tid = mine.transfer(10, ttl=30)
        assert mine.copies == 5
        with b.seize_copy(tid) as theirs:
            assert (theirs.resource, theirs.domain, theirs.copies) == ("sandbox/vm", "t", 10)
        with pytest.raises(ClientError):
            b.seize_copy(tid)  # a transfer is seized once
        with pytest.raises(ClientError):
            mine.transfer(6, ttl=30)  # only 5 held


def test_kill_switch_turns_rejections_into_grants(charon: Charon, make_client: MakeClient) -> None:
    client = make_client(charon.target)
    assert client.request_rate("api/slow", "t").success
    client.kill_switch = True
    res = client.request_rate("api/slow", "t", copies=3, min_copies=2, max_wait=5)
    assert (res.granted, res.source) == (2, Source.KILL_SWITCH)
    assert res.reply is not None and res.reply.granted == 0  # the server did reject
    with client.hold_copy("gpu", "t", copies=3):
        with client.hold_copy("gpu", "t") as extra:
            assert (extra.copies, extra.source) == (1, Source.KILL_SWITCH)
    client.kill_switch = False
    assert not client.request_rate("api/slow", "t").success
    assert client.stats().kill_switch_grants == 2


def test_degraded_mode_with_the_server_stopped_then_killed(
    charon: Charon, make_client: MakeClient
) -> None:
    # A second, not less: on a loaded machine the calls before the stop
    # must still be answered by the server for the counts below to hold.
    client = make_client(charon.target, request_timeout=1.0)
    assert client.request_rate("api/slow", "t").source == Source.SERVER
    strict = make_client(charon.target, request_timeout=1.0, fail_open=False)
    assert strict.request_rate("api/search", "t").success
    charon.signal(signal.SIGSTOP)  # the port stays open; nothing answers
    try:
        res = client.request_rate("api/slow", "t", copies=5, min_copies=2)
        assert (res.granted, res.source, res.reply) == (2, Source.DEGRADED, None)
        hold = client.hold_copy("gpu", "t", copies=3)
        assert (hold.copies, hold.source) == (1, Source.DEGRADED)
        with pytest.raises(ServerError):
            hold.transfer(1, ttl=10)  # nothing is held on the server
        hold.release_all()
        with pytest.raises(ServerError):
            client.charge("llm/tokens", "t", 1)  # a cost cannot be recorded locally
        with pytest.raises(ServerError):
            strict.request_rate("api/search", "t")
    finally:
        charon.kill()
    res = client.request_rate("api/slow", "t")
    assert (res.granted, res.source) == (1, Source.DEGRADED)
    stats = client.stats()
    assert stats.degraded_grants == 3
    assert stats.server_errors == 4


def test_degraded_mode_with_no_server_at_all(make_client: MakeClient) -> None:
    client = make_client(f"127.0.0.1:{free_port()}", request_timeout=0.5)
    res = client.request_rate("api/search", "u", copies=10, min_copies=2)
    assert (res.granted, res.source) == (2, Source.DEGRADED)
    assert client.stats().degraded_grants == 1


def test_degraded_grants_are_logged_at_most_once_in_ten_seconds(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="charon_client")
    target = f"127.0.0.1:{free_port()}"
    client = Client(target, request_timeout=0.5)
    for _ in range(5):
        assert client.request_rate("api/search", "u").source is Source.DEGRADED
    assert client.stats().degraded_grants == 5
    lines = [r.getMessage() for r in caplog.records if "degraded grant" in r.getMessage()]
    # The first one is logged, naming the address and the cause; the four
    # after it within 10 s are counted for the next line.
    assert len(lines) == 1, lines
    assert target in lines[0] and "connection refused" in lines[0], lines[0]

    async def in_asyncio() -> int:
        async with aio.Client(target, request_timeout=0.5) as c:
            for _ in range(3):
                assert (await c.request_rate("api/search", "u")).degraded
            return c.stats().degraded_grants

    caplog.clear()
    assert asyncio.run(in_asyncio()) == 3
    assert len([r for r in caplog.records if "degraded grant" in r.getMessage()]) == 1


def test_multi_resource_helper(charon: Charon, make_client: MakeClient) -> None:
    client = make_client(charon.target)
    with client.multi("t", ["db/conn", "gpu"], "api/render", max_copies=8) as grant:
        assert grant.copies == 2
        assert [h.copies for h in grant.holds] == [2, 2]
        assert grant.rate is not None and grant.rate.granted == 2
        # Extras were given back on the way: 6 connections are free.
        assert client.hold_copy("db/conn", "t", copies=8).granted == 6
    # The rate resource is spent: nothing at all, and no copies kept.
    none = client.multi("t", ["db/conn", "gpu"], "api/render", max_copies=8)
    assert not none.success and none.holds == []
    with client.hold_copy("gpu", "t", copies=3) as gpus:
        assert gpus.copies == 3


def test_32_threads_share_one_client(any_store: Charon) -> None:
    # Exactness, not timeouts, is tested: on a loaded machine a call may
    # take over the default second, and its degraded grant would count.
    client = Client(any_store.target, request_timeout=10.0)
    granted = [0] * 32

    def work(i: int) -> None:
        for _ in range(10_000 // 32 + (1 if i < 10_000 % 32 else 0)):
            granted[i] += client.request_rate("api/many", "t").granted

    threads = [threading.Thread(target=work, args=(i,)) for i in range(32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stats = client.stats()
    assert stats.requests == 10_000
    assert sum(granted) == 5000  # the limit, exactly
    assert stats.rejections == 5000
    assert stats.degraded_grants == 0


def test_a_late_grant_is_released(charon: Charon, make_client: MakeClient) -> None:
    client = make_client(charon.target, request_timeout=0.3)
    other = make_client(charon.target)
    assert client.request_rate("api/search", "t").success  # the session is open
    charon.signal(signal.SIGSTOP)
    try:
        hold = client.hold_copy("gpu", "t", copies=3)
        assert hold.degraded  # no answer within 0.3 s
    finally:
        charon.signal(signal.SIGCONT)
    # The server grants the reserve it read before it stopped; the client,
    # which gave up on it, gives the 3 copies back as the reply comes in.
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        with other.hold_copy("gpu", "t", copies=3) as all_three:
            if all_three.copies == 3:
                break
        time.sleep(0.05)
    else:
        pytest.fail("the late grant was never released")
    assert client.live_generation() is not None  # the same session, still open


def test_unary_transport_gives_the_same_answers(charon: Charon, make_client: MakeClient) -> None:
    client = make_client(charon.target, rate_transport="unary")
    assert client.request_rate("api/search", "t", copies=3).granted == 3
    assert client.request_rate("api/search", "t", copies=3).granted == 2
    assert not client.request_rate("api/search", "t").success
    assert client.charge("llm/tokens", "t", 150).granted == 150
    assert client.refund("llm/tokens", "t", 60).remaining == 10
    with pytest.raises(ClientError, match="unknown resource"):
        client.request_rate("no/such", "t")
    with pytest.raises(ClientError):
        client.refund("api/keys", "t", 1)
    with pytest.raises(ClientError):
        make_client(charon.target, rate_transport="carrier-pigeon")
    assert client.live_generation() is None  # no session was needed
    unreachable = make_client(f"127.0.0.1:{free_port()}", rate_transport="unary")
    res = unreachable.request_rate("api/search", "t", copies=3, min_copies=2)
    assert (res.granted, res.source) == (2, Source.DEGRADED)


def test_a_hold_dropped_without_with_is_released(charon: Charon, make_client: MakeClient) -> None:
    client = make_client(charon.target)
    assert client.hold_copy("sandbox/vm", "t", copies=15).granted == 15  # dropped at once
    # Queued on the session before the next operation: back in time for it.
    with client.hold_copy("sandbox/vm", "t", copies=15) as again:
        assert again.copies == 15


def test_hold_copy_waits_in_the_queue_for_a_released_copy(charon: Charon) -> None:
    client = Client(charon.target)
    first = client.hold_copy("waits/sync", "a")
    assert first.success and first.waited_on_server is None
    got: list[Hold] = []
    waiter = threading.Thread(
        target=lambda: got.append(client.hold_copy("waits/sync", "b", wait=20))
    )
    waiter.start()
    time.sleep(0.2)  # it arrives first
    deadline = time.monotonic() + 10
    while True:
        # Once the waiter waits, the queue (limit 1) is full.
        full = client.hold_copy("waits/sync", "c", wait=0.001)
        if full.queue_full:
            break
        assert time.monotonic() < deadline, "the waiter never waited"
        time.sleep(0.02)
    assert not full.success and full.waited_on_server == 0.0
    time.sleep(0.05)
    first.release_all()
    waiter.join(10)
    (hold,) = got
    assert hold.success and not hold.queue_full and not hold.result_ready
    assert hold.waited_on_server is not None and hold.waited_on_server >= 0.05
    hold.release_all()
    with pytest.raises(ClientError):
        client.hold_copy("waits/sync", "b", wait=-1)
