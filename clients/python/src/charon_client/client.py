"""The sync client: one session stream shared by every thread, back-off,
holds as context managers, transfers, degraded mode, the kill switch and
capacity leases."""

from __future__ import annotations

import threading
import time
from types import TracebackType
from typing import Optional, Sequence, Tuple, TypeVar, cast

import grpc

from . import _common as c
from ._classify import diagnosed, from_rpc_error
from ._core import Call, ClientCore, HoldCore, HoldFields, Sleep, Steps
from ._lease import LeaseCore, LeaseMode, check_args
from ._pb import capacity_pb2_grpc as cpb_grpc
from ._pb import limiter_pb2 as pb
from ._pb import limiter_pb2_grpc as pb_grpc
from ._session import Session
from ._transport import Pem
from .errors import CharonError, ClientError
from .lease import Lease, refresh
from .results import RateGrant, Stats

__all__ = ["Client", "Hold", "Lease", "MultiGrant"]

_T = TypeVar("_T")


class Client:
    """A connection to Charon, safe to share between threads.

    Every operation goes on one ``Session`` stream, pipelined, so
    that holds belong to this client and go back when it ends or dies.
    Connects lazily: a client made while the server is down works
    (degraded) and recovers by itself.

    ``target`` is ``host:port`` (or ``http://host:port``, ``https://host:port``).
    ``backoff_base`` is the back-off's base in
    seconds (paper §3.2: about ``base * 2**i`` after the i-th rejection).
    ``request_timeout`` bounds each answer (then the server counts as
    unreachable). ``fail_open`` turns degraded mode on (paper §4.3).
    ``max_in_flight`` bounds the operations waiting for an answer at once.
    ``rate_transport="unary"`` sends rate requests, charges and refunds as
    unary calls (for proxies that carry long-lived streams badly; copy
    operations always use the session, whose holds they are).

    Security, with the Rust client's names: ``token`` is the limiting API's
    bearer token (a server started with ``--api-tokens``), sent as
    ``authorization: Bearer TOKEN`` on every call. TLS is on with an
    ``https://`` target or any of ``ca`` (the PEM CA certificates to trust
    instead of gRPC's roots), ``cert`` and ``key`` (a PEM client certificate
    and its key, for a server started with ``--tls-client-ca``) and
    ``server_name`` (the name the server's certificate must carry, when it
    is not the target's host). ``ca``, ``cert`` and ``key`` are paths, or
    the PEM contents as bytes.

    Errors: a mistake in these options raises ``ClientError`` (kind
    ``settings``) here. A refused token, a certificate mistake or the wrong
    port raise ``ClientError`` at the first operation, whatever
    ``fail_open`` says: only server errors (``ServerError``: unreachable,
    timed out, unavailable) are ever turned into degraded grants, each
    counted in ``stats().degraded_grants`` and logged (at most one line
    every 10 s).
    """

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
        self._core: ClientCore[Session] = ClientCore(self.options)
        self._channel = c.open_channel(self.options, grpc.insecure_channel, grpc.secure_channel)
        self._metadata = self.options.transport.metadata()
        self._stub = pb_grpc.LimiterStub(self._channel)
        self._capacity = cpb_grpc.CapacityStub(self._channel)
        self._places = threading.BoundedSemaphore(self.options.max_in_flight)

    # -- lifecycle ---------------------------------------------------------

    def close(self) -> None:
        """Gives back the leases still held, ends the session (the server
        releases its holds) and the channel."""
        leases, session = self._core.close()
        for lease in leases:
            lease.__exit__(None, None, None)
        if session is not None:
            session.close()
        self._channel.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self,
        exc_type: Optional[type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        self.close()

    # -- switches and counters --------------------------------------------

    @property
    def kill_switch(self) -> bool:
        """While on, every rejection becomes a grant of ``min_copies``
        (paper §4.3: try a limiter on live traffic without letting it
        reject anything)."""
        return self._core.kill_switch

    @kill_switch.setter
    def kill_switch(self, on: bool) -> None:
        self._core.kill_switch = bool(on)

    def stats(self) -> Stats:
        """What this client has seen so far."""
        return self._core.stats()

    # -- operations (their rules are in ``_core``) ---------------------------

    def request_rate(
        self,
        resource: str,
        domain: str,
        copies: int = 1,
        min_copies: int = 1,
        max_wait: float = 0.0,
        dry_run: bool = False,
    ) -> RateGrant:
        """A rate-limited request: at least ``min_copies`` and
        at most ``copies`` hits, retried with back-off for up to ``max_wait``
        seconds. A rejection is a result with ``granted == 0``. ``dry_run``
        asks without recording anything."""
        steps = self._core.request_rate(resource, domain, copies, min_copies, max_wait, dry_run)
        return self._drive(steps)

    def charge(self, resource: str, domain: str, copies: int) -> pb.RateReply:
        """``charge``: a cost recorded after the fact, never
        rejected (a bucket goes into debt). Not degradable: a server error
        is raised, since the cost could not be recorded."""
        return self._drive(self._core.charge_or_refund("charge", resource, domain, copies))

    def refund(self, resource: str, domain: str, copies: int) -> pb.RateReply:
        """``refund``: tokens given back to a bucket; a client
        error on any other kind. Not degradable, as ``charge``."""
        return self._drive(self._core.charge_or_refund("refund", resource, domain, copies))

    def hold_copy(
        self,
        resource: str,
        domain: str,
        copies: int = 1,
        min_copies: int = 1,
        max_wait: float = 0.0,
        wait: float = 0.0,
    ) -> Hold:
        """Reserves copies of a copy-limited resource. The result is a
        ``Hold`` in every case (check ``success``); use it as a context
        manager so that what it still holds is released on leaving the
        block, whether normally or by an exception (paper Figure 5).

        ``wait`` (seconds) lets the reserve wait in the resource's queue on
        the server when no copy is free: released copies go to waiters in
        arrival order. The hold then says how it ended: ``waited_on_server``,
        ``queue_full``, ``result_ready``."""
        steps = self._core.hold_copy(resource, domain, copies, min_copies, max_wait, wait)
        return Hold(self, self._drive(steps))

    def seize_copy(self, transfer_id: str) -> Hold:
        """Takes over copies another client staged with ``Hold.transfer``
        (on any server). Not possible in degraded mode: an unreachable
        server is a ``ServerError``; an unknown, expired or already seized
        transfer is a ``ClientError``."""
        return Hold(self, self._drive(self._core.seize_copy(transfer_id)))

    def multi(
        self,
        domain: str,
        copy_resources: Sequence[str],
        rate_resource: Optional[str] = None,
        min_copies: int = 1,
        max_copies: int = 1,
        max_wait: float = 0.0,
    ) -> MultiGrant:
        """The pseudo-atomic request of paper §3.3 (Figure 7): the same
        number of copies, between ``min_copies`` and ``max_copies``, of every
        resource, or none at all. Copy resources are reserved in turn, each
        asking for what the one before granted and extras given back as
        counts shrink; the one rate resource comes last because hits cannot
        be given back. ``max_wait`` bounds the whole."""
        steps = self._core.multi(
            lambda fields: Hold(self, fields),
            domain,
            copy_resources,
            rate_resource,
            min_copies,
            max_copies,
            max_wait,
        )
        return MultiGrant(*self._drive(steps))

    def lease(
        self,
        resource: str,
        wants: float,
        *,
        client_id: Optional[str] = None,
        mode: LeaseMode = "safe",
        adaptive: bool = False,
    ) -> Lease:
        """Takes a capacity lease on ``resource`` (a ``kind: lease``
        resource) for ``wants`` units per second and keeps it
        refreshed in a daemon thread until released. Use the ``Lease`` as a
        context manager: leaving the block gives it back.

        ``client_id`` names the holder on the server (default
        ``<host>-<pid>-<n>``, one per lease; a restarted process that reuses
        its id takes its old lease over). ``mode`` is what to use once the
        lease has expired with no server answering: ``"safe"`` (the safe
        capacity the server last gave), ``"optimistic"`` (``wants``) or
        ``"pessimistic"`` (nothing). ``adaptive`` asks at each refresh for
        what was used since the last one (plus a fifth), at most ``wants``.

        A refused lease (unknown resource, wrong kind, NaN or negative
        wants) raises ``ClientError``; a server that cannot be reached does
        not raise: the lease starts in its mode and the refreshes go on
        trying (whatever ``fail_open`` says: the mode is the lease's own
        choice)."""
        value, cid = check_args(resource, wants, client_id, mode)
        self._core.check_open()
        timeout = self.options.request_timeout
        core = LeaseCore(resource, cid, value, mode, bool(adaptive), self.options.transport)
        error = refresh(core, self._capacity, timeout, value)
        if error is not None:
            error = self._diagnosed(error)
        if isinstance(error, ClientError):
            raise error
        lease = Lease(core, self._capacity, timeout)
        if not self._core.add_lease(lease):  # closed meanwhile
            lease.__exit__(None, None, None)
            raise ClientError("the client is closed")
        return lease

    # -- I/O: how the core's effects are carried out, blocking ----------------

    def live_generation(self) -> Optional[int]:
        """The generation of the live session, if any: holds made on an
        older one were released by the server when it ended."""
        return self._core.live_generation()

    def _drive(self, steps: Steps[_T]) -> _T:
        """Runs an operation of the core: each effect it yields is carried
        out here and its answer (or error) sent back."""
        try:
            effect = next(steps)
            while True:
                try:
                    if isinstance(effect, Sleep):
                        time.sleep(effect.seconds)
                        answer: object = None
                    elif isinstance(effect, Call):
                        answer = self._call(effect.request, effect.field, effect.extra)
                    else:
                        answer = self._rate_call(effect.request, effect.field)
                except BaseException as e:  # noqa: BLE001 - handed to the operation
                    effect = steps.throw(e)
                else:
                    effect = steps.send(answer)
        except StopIteration as stop:
            return cast(_T, stop.value)

    def _call(
        self, request: pb.SessionRequest, field: str, extra: float = 0.0
    ) -> Tuple[object, int]:
        timeout = self.options.request_timeout
        if not self._places.acquire(timeout=timeout):
            raise self._core.no_place(timeout)
        try:
            session = self._core.live_session(
                lambda generation: Session(self._stub, generation, self.options.transport)
            )
            reply = session.call(request, timeout + extra)
            return c.expect(reply, field, self.options.transport), session.generation
        except CharonError as e:
            raise self._diagnosed(e) from None
        finally:
            self._places.release()

    def _diagnosed(self, error: CharonError) -> CharonError:
        """``error``, or its client-class cause if it is a connection that
        ended without a word (see ``_classify``)."""
        return diagnosed(error, self.options.transport, self.options.request_timeout)

    def _rate_call(self, request: pb.SessionRequest, field: str) -> pb.RateReply:
        """A rate request, charge or refund: on the session, or as a unary
        call with ``rate_transport="unary"`` (same answers either way)."""
        if self.options.rate_transport == "session":
            reply = self._call(request, field)[0]
            assert isinstance(reply, pb.RateReply)
            return reply
        timeout = self.options.request_timeout
        if not self._places.acquire(timeout=timeout):
            raise self._core.no_place(timeout)
        md = self._metadata
        try:
            if field == "request":
                return self._stub.Request(request.request, timeout=timeout, metadata=md)
            if field == "charge":
                return self._stub.Charge(request.charge, timeout=timeout, metadata=md)
            return self._stub.Refund(request.refund, timeout=timeout, metadata=md)
        except grpc.RpcError as e:
            raise self._diagnosed(from_rpc_error(e, self.options.transport)) from None
        finally:
            self._places.release()


class Hold(HoldCore):
    """Copies of a resource held by a client, or the rejection of a reserve
    (then ``success`` is False and it holds nothing). A context manager:
    leaving the block releases what is still held (paper §3.2)."""

    def __init__(self, client: Client, fields: HoldFields) -> None:
        super().__init__(client._core, fields)
        self._client = client
        self._lock = threading.Lock()

    def release(self, n: int, result_ready: bool = False) -> None:
        """Gives back ``n`` of the copies still held. ``result_ready`` (a
        resource of ``wait_mode: shared_result``): the work is done, every
        caller waiting for this resource and domain is told to read its
        result instead of getting a copy."""
        with self._lock:
            self._client._drive(self._release_steps(n, result_ready))

    def release_all(self) -> None:
        """Gives back every copy still held."""
        self.release(self.copies)

    def transfer(self, n: int, ttl: float) -> str:
        """Stages ``n`` held copies for another client (on any server) to
        ``seize_copy`` within ``ttl`` seconds; returns the transfer id to
        hand over. Copies granted in degraded mode cannot be transferred."""
        with self._lock:
            return self._client._drive(self._transfer_steps(n, ttl))

    def __enter__(self) -> Hold:
        return self

    def __exit__(
        self,
        exc_type: Optional[type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        with self._lock:
            self._client._drive(self._exit_steps())


class MultiGrant:
    """The result of ``Client.multi``: ``copies`` of every resource, or 0
    and nothing held. A context manager releasing every hold on exit."""

    def __init__(self, copies: int, holds: list[Hold], rate: Optional[RateGrant]) -> None:
        self.copies = copies
        self.holds = holds
        """One hold per copy resource, in the order given."""
        self.rate = rate
        """The rate resource's grant, if there was one."""

    @property
    def success(self) -> bool:
        return self.copies > 0

    def release_all(self) -> None:
        for hold in self.holds:
            hold.__exit__(None, None, None)

    def __enter__(self) -> MultiGrant:
        return self

    def __exit__(
        self,
        exc_type: Optional[type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        self.release_all()
