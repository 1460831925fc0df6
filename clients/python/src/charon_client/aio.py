"""The asyncio client on ``grpc.aio``: the same operations and semantics
as ``charon_client.Client``, awaited, with holds as ``async with`` blocks.

Make the client inside the event loop that uses it (its channel belongs
to that loop); any number of tasks may share it::

    async with Client("127.0.0.1:7070") as client:
        res = await client.request_rate("api/search", "tenant-42", max_wait=5)
        async with await client.hold_copy("sandbox/vm", "t", copies=2) as vms:
            ...
        async with await client.lease("db/qps", wants=100) as lease:
            await lease.acquire()  # at the leased rate
"""

from __future__ import annotations

import asyncio
import logging
import time
from types import TracebackType
from typing import TYPE_CHECKING, Optional, Sequence, Tuple, TypeVar, cast

import grpc

from . import _common as c
from ._aio_session import AioSession
from ._classify import diagnosed, from_rpc_error, is_ambiguous
from ._core import Call, ClientCore, HoldCore, HoldFields, Sleep, Steps
from ._lease import LeaseCore, LeaseMode, check_args, first_lease, released_of
from ._pb import capacity_pb2 as cpb
from ._pb import capacity_pb2_grpc as cpb_grpc
from ._pb import limiter_pb2 as pb
from ._pb import limiter_pb2_grpc as pb_grpc
from ._transport import Pem
from .errors import CharonError, ClientError, ServerError
from .results import LeaseStatus, RateGrant, Stats

if TYPE_CHECKING:
    from ._pb.capacity_pb2_grpc import CapacityAsyncStub

__all__ = ["Client", "Hold", "Lease", "MultiGrant"]

log = logging.getLogger("charon_client")

_T = TypeVar("_T")


class Client:
    """A connection to Charon for asyncio, shared by any number of tasks;
    see ``charon_client.Client`` for the options (token and TLS included),
    the errors and the semantics."""

    def __init__(
        self,
        target: str,
        *,
        backoff_base: float = 1.0,
        request_timeout: float = 1.0,
        fail_open: bool = True,
        max_in_flight: int = 256,
        keepalive: float = 20.0,
        rate_transport: str = "session",
        token: Optional[str] = None,
        ca: Optional[Pem] = None,
        cert: Optional[Pem] = None,
        key: Optional[Pem] = None,
        server_name: Optional[str] = None,
    ) -> None:
        self.options = c.options(
            target,
            backoff_base=backoff_base,
            request_timeout=request_timeout,
            fail_open=fail_open,
            max_in_flight=max_in_flight,
            keepalive=keepalive,
            rate_transport=rate_transport,
            token=token,
            ca=ca,
            cert=cert,
            key=key,
            server_name=server_name,
        )
        self._core: ClientCore[AioSession] = ClientCore(self.options)
        self._channel = c.open_channel(
            self.options, grpc.aio.insecure_channel, grpc.aio.secure_channel
        )
        self._metadata = self.options.transport.metadata()
        self._stub = pb_grpc.LimiterStub(self._channel)
        self._capacity = cpb_grpc.CapacityStub(self._channel)
        self._places = asyncio.Semaphore(self.options.max_in_flight)

    async def close(self) -> None:
        """Gives back the leases still held, ends the session (the server
        releases its holds) and the channel."""
        leases, session = self._core.close()
        for lease in leases:
            await lease.__aexit__(None, None, None)
        if session is not None:
            await session.close()
        await self._channel.close()

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(
        self,
        exc_type: Optional[type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        await self.close()

    @property
    def kill_switch(self) -> bool:
        """While on, every rejection becomes a grant of ``min_copies``."""
        return self._core.kill_switch

    @kill_switch.setter
    def kill_switch(self, on: bool) -> None:
        self._core.kill_switch = bool(on)

    def stats(self) -> Stats:
        """What this client has seen so far."""
        return self._core.stats()

    # -- operations (their rules are in ``_core``) ---------------------------

    async def request_rate(
        self,
        resource: str,
        domain: str,
        copies: int = 1,
        min_copies: int = 1,
        max_wait: float = 0.0,
        dry_run: bool = False,
    ) -> RateGrant:
        """As ``charon_client.Client.request_rate``."""
        steps = self._core.request_rate(resource, domain, copies, min_copies, max_wait, dry_run)
        return await self._drive(steps)

    async def charge(self, resource: str, domain: str, copies: int) -> pb.RateReply:
        """As ``charon_client.Client.charge`` (never degraded)."""
        return await self._drive(self._core.charge_or_refund("charge", resource, domain, copies))

    async def refund(self, resource: str, domain: str, copies: int) -> pb.RateReply:
        """As ``charon_client.Client.refund`` (never degraded)."""
        return await self._drive(self._core.charge_or_refund("refund", resource, domain, copies))

    async def hold_copy(
        self,
        resource: str,
        domain: str,
        copies: int = 1,
        min_copies: int = 1,
        max_wait: float = 0.0,
    ) -> Hold:
        """As ``charon_client.Client.hold_copy``; the ``Hold`` is an
        ``async with`` block that releases what it still holds on exit."""
        steps = self._core.hold_copy(resource, domain, copies, min_copies, max_wait)
        return Hold(self, await self._drive(steps))

    async def seize_copy(self, transfer_id: str) -> Hold:
        """As ``charon_client.Client.seize_copy``."""
        return Hold(self, await self._drive(self._core.seize_copy(transfer_id)))

    async def multi(
        self,
        domain: str,
        copy_resources: Sequence[str],
        rate_resource: Optional[str] = None,
        min_copies: int = 1,
        max_copies: int = 1,
        max_wait: float = 0.0,
    ) -> MultiGrant:
        """As ``charon_client.Client.multi`` (paper §3.3, Figure 7)."""
        steps = self._core.multi(
            lambda fields: Hold(self, fields),
            domain,
            copy_resources,
            rate_resource,
            min_copies,
            max_copies,
            max_wait,
        )
        return MultiGrant(*await self._drive(steps))

    async def lease(
        self,
        resource: str,
        wants: float,
        *,
        client_id: Optional[str] = None,
        mode: LeaseMode = "safe",
        adaptive: bool = False,
    ) -> Lease:
        """As ``charon_client.Client.lease``; the refreshes run in a task,
        and the ``Lease`` is an ``async with`` block that gives the lease
        back on exit::

            async with await client.lease("db/qps", wants=100) as lease:
                await lease.acquire()
        """
        value, cid = check_args(resource, wants, client_id, mode)
        self._core.check_open()
        timeout = self.options.request_timeout
        core = LeaseCore(resource, cid, value, mode, bool(adaptive), self.options.transport)
        signal = _Signal()
        error = await _refresh(core, self._capacity, timeout, value, signal)
        if error is not None:
            error = await self._diagnosed(error)
        if isinstance(error, ClientError):
            raise error
        lease = Lease(core, self._capacity, timeout, signal)
        if not self._core.add_lease(lease):  # closed meanwhile
            await lease.__aexit__(None, None, None)
            raise ClientError("the client is closed")
        return lease

    # -- I/O: how the core's effects are carried out, awaited -----------------

    def live_generation(self) -> Optional[int]:
        """The generation of the live session, if any."""
        return self._core.live_generation()

    async def _drive(self, steps: Steps[_T]) -> _T:
        """Runs an operation of the core: each effect it yields is awaited
        here and its answer (or error) sent back."""
        try:
            effect = next(steps)
            while True:
                try:
                    if isinstance(effect, Sleep):
                        await asyncio.sleep(effect.seconds)
                        answer: object = None
                    elif isinstance(effect, Call):
                        answer = await self._call(effect.request, effect.field)
                    else:
                        answer = await self._rate_call(effect.request, effect.field)
                except BaseException as e:  # noqa: BLE001 - handed to the operation
                    effect = steps.throw(e)
                else:
                    effect = steps.send(answer)
        except StopIteration as stop:
            return cast(_T, stop.value)

    async def _call(self, request: pb.SessionRequest, field: str) -> Tuple[object, int]:
        timeout = self.options.request_timeout
        try:
            await asyncio.wait_for(self._places.acquire(), timeout)
        except asyncio.TimeoutError:
            raise self._core.no_place(timeout) from None
        try:
            session = self._core.live_session(
                lambda generation: AioSession(self._stub, generation, self.options.transport)
            )
            reply = await session.call(request, timeout)
            return c.expect(reply, field, self.options.transport), session.generation
        except CharonError as e:
            raise (await self._diagnosed(e)) from None
        finally:
            self._places.release()

    async def _diagnosed(self, error: CharonError) -> CharonError:
        """As the sync client's, with the look at the server in a thread."""
        if not is_ambiguous(error):
            return error
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(
            None, diagnosed, error, self.options.transport, self.options.request_timeout
        )

    async def _rate_call(self, request: pb.SessionRequest, field: str) -> pb.RateReply:
        """As the sync client's: on the session, or a unary call."""
        if self.options.rate_transport == "session":
            reply = (await self._call(request, field))[0]
            assert isinstance(reply, pb.RateReply)
            return reply
        timeout = self.options.request_timeout
        try:
            await asyncio.wait_for(self._places.acquire(), timeout)
        except asyncio.TimeoutError:
            raise self._core.no_place(timeout) from None
        md = self._metadata
        try:
            if field == "request":
                return await self._stub.Request(request.request, timeout=timeout, metadata=md)
            if field == "charge":
                return await self._stub.Charge(request.charge, timeout=timeout, metadata=md)
            return await self._stub.Refund(request.refund, timeout=timeout, metadata=md)
        except grpc.RpcError as e:
            raise await self._diagnosed(from_rpc_error(e, self.options.transport)) from None
        finally:
            self._places.release()


class Hold(HoldCore):
    """As ``charon_client.Hold``, for asyncio: ``async with`` releases what
    is still held on leaving the block, also on an exception."""

    def __init__(self, client: Client, fields: HoldFields) -> None:
        super().__init__(client._core, fields)
        self._client = client
        self._lock = asyncio.Lock()

    async def release(self, n: int) -> None:
        """Gives back ``n`` of the copies still held."""
        async with self._lock:
            await self._client._drive(self._release_steps(n))

    async def release_all(self) -> None:
        """Gives back every copy still held."""
        await self.release(self.copies)

    async def transfer(self, n: int, ttl: float) -> str:
        """As ``charon_client.Hold.transfer``."""
        async with self._lock:
            return await self._client._drive(self._transfer_steps(n, ttl))

    async def __aenter__(self) -> Hold:
        return self

    async def __aexit__(
        self,
        exc_type: Optional[type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        async with self._lock:
            await self._client._drive(self._exit_steps())


class MultiGrant:
    """As ``charon_client.MultiGrant``, an ``async with`` block."""

    def __init__(self, copies: int, holds: list[Hold], rate: Optional[RateGrant]) -> None:
        self.copies = copies
        self.holds = holds
        self.rate = rate

    @property
    def success(self) -> bool:
        return self.copies > 0

    async def __aenter__(self) -> MultiGrant:
        return self

    async def __aexit__(
        self,
        exc_type: Optional[type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        for hold in self.holds:
            await hold.__aexit__(None, None, None)


class _Signal:
    """Wakes the tasks waiting on a lease (an event replaced at each
    change, so that a waiter sees every change after it looked)."""

    def __init__(self) -> None:
        self.event = asyncio.Event()

    def notify(self) -> None:
        event, self.event = self.event, asyncio.Event()
        event.set()


async def _refresh(
    core: LeaseCore, stub: CapacityAsyncStub, timeout: float, wants: float, signal: _Signal
) -> Optional[CharonError]:
    """As ``charon_client.lease.refresh``, awaited."""
    outcome: cpb.Lease | CharonError
    try:
        outcome = first_lease(
            await stub.GetCapacity(
                core.request(wants), timeout=timeout, metadata=core.transport.metadata()
            )
        )
    except grpc.RpcError as e:
        outcome = from_rpc_error(e, core.transport)
    except CharonError as e:
        outcome = e
    except Exception as e:  # noqa: BLE001 - a closed channel, anything: a failed refresh
        outcome = ServerError(f"the refresh failed: {e!r}")
    core.apply(wants, outcome)
    signal.notify()
    if isinstance(outcome, CharonError):
        log.debug("refresh of the lease on %s failed: %s", core.resource, outcome)
        return outcome
    return None


async def _give_back(core: LeaseCore, stub: CapacityAsyncStub, timeout: float) -> bool:
    try:
        return released_of(
            await stub.ReleaseCapacity(
                core.release_request(), timeout=timeout, metadata=core.transport.metadata()
            )
        )
    except grpc.RpcError as e:
        raise from_rpc_error(e, core.transport) from None
    except ValueError as e:  # the channel was closed
        raise ServerError(f"the release failed: {e}") from None


async def _refresh_loop(
    core: LeaseCore, stub: CapacityAsyncStub, timeout: float, stop: asyncio.Event, signal: _Signal
) -> None:
    """The bottom half, as a task: refreshes every refresh interval until
    stopped. Holds no reference to the ``Lease``, so that a dropped one is
    collected; then it gives the lease back itself."""
    try:
        while True:
            try:
                await asyncio.wait_for(stop.wait(), core.refresh_interval())
                break
            except asyncio.TimeoutError:
                pass
            await _refresh(core, stub, timeout, core.next_wants(), signal)
        if core.release_on_stop and core.mark_released():
            signal.notify()
            await _give_back(core, stub, timeout)
    except Exception as e:  # noqa: BLE001 - the lease then lapses at its expiry
        log.debug("the refresher of the lease on %s ended: %r", core.resource, e)


class Lease:
    """As ``charon_client.Lease``, for asyncio: ``await acquire()``, the
    refreshes in a task, and ``async with`` gives the lease back on leaving
    the block, also on an exception."""

    def __init__(
        self, core: LeaseCore, stub: CapacityAsyncStub, timeout: float, signal: _Signal
    ) -> None:
        self._core = core
        self._stub = stub
        self._timeout = timeout
        self._signal = signal
        self._stop = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        self._task = self._loop.create_task(_refresh_loop(core, stub, timeout, self._stop, signal))

    @property
    def resource(self) -> str:
        return self._core.resource

    @property
    def client_id(self) -> str:
        """Who holds the lease, as the server knows it."""
        return self._core.client_id

    @property
    def wants(self) -> float:
        """The configured wants (with ``adaptive``, the most asked for)."""
        return self._core.wants

    @property
    def mode(self) -> str:
        return self._core.mode

    @property
    def adaptive(self) -> bool:
        return self._core.adaptive

    @property
    def capacity(self) -> float:
        """The capacity in force now (units per second)."""
        return self._core.capacity()

    @property
    def last_error(self) -> Optional[CharonError]:
        """Why the last refresh failed, if it did."""
        return self._core.last_error()

    @property
    def released(self) -> bool:
        return self._core.released

    def status(self) -> LeaseStatus:
        """As ``charon_client.Lease.status``."""
        return self._core.status()

    async def acquire(self, timeout: Optional[float] = None) -> bool:
        """Waits until the local rate allows one more unit and takes it
        (True); False if ``timeout`` seconds passed first. Raises
        ``ClientError`` once the lease is released."""
        core = self._core
        deadline = None if timeout is None else time.monotonic() + timeout
        with core.lock:
            core.count_demand_locked()
        while True:
            event = self._signal.event
            now = time.monotonic()
            with core.lock:
                wait = core.take_locked(now)
            if wait is None:
                return True
            if deadline is not None:
                if deadline <= now:
                    return False
                wait = min(wait, deadline - now)
            try:
                await asyncio.wait_for(event.wait(), None if wait == float("inf") else wait)
            except asyncio.TimeoutError:
                pass

    def try_acquire(self) -> bool:
        """Takes one unit if the local rate allows it now."""
        return self._core.try_take()

    async def changed(self, timeout: Optional[float] = None) -> bool:
        """Waits until a refresh answers or fails, or the lease is released
        (True), or ``timeout`` seconds pass (False)."""
        try:
            await asyncio.wait_for(self._signal.event.wait(), timeout)
            return True
        except asyncio.TimeoutError:
            return False

    async def release(self) -> bool:
        """As ``charon_client.Lease.release``, awaited."""
        if not self._core.mark_released():
            return False
        self._signal.notify()
        self._stop.set()
        if asyncio.current_task() is not self._task:
            # A refresh in flight must not reach the server after the release.
            await asyncio.wait({self._task}, timeout=self._timeout + 1.0)
        return await _give_back(self._core, self._stub, self._timeout)

    async def __aenter__(self) -> Lease:
        return self

    async def __aexit__(
        self,
        exc_type: Optional[type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        try:
            await self.release()
        except Exception as e:  # noqa: BLE001 - never mask the block's own exception
            log.warning(
                "release of the lease on %s on leaving the block failed (%s); "
                "it lapses at its expiry",
                self.resource,
                e,
            )

    def __del__(self) -> None:
        # Dropped without a release: the refresher gives the lease back as
        # it stops (no call here; this may run in the middle of any code).
        try:
            if not self._core.released and not self._loop.is_closed():
                self._core.release_on_stop = True
                self._loop.call_soon_threadsafe(self._stop.set)
        except Exception:  # noqa: BLE001, S110 - never raise from __del__
            pass

    def __repr__(self) -> str:
        s = self.status()
        return (
            f"Lease({self.resource!r}, client_id={self.client_id!r}, capacity={s.capacity}, "
            f"source={s.source.value}, wants={s.wants})"
        )
