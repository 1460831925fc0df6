"""The sync client: one session stream shared by every thread, back-off,
holds as context managers, transfers, degraded mode, the kill switch and
capacity leases."""

from __future__ import annotations

import logging
import random
import threading
import time
import weakref
from types import TracebackType
from typing import Callable, Optional, Sequence, Tuple, TypeVar

import grpc

from . import _common as c
from ._backoff import next_sleep
from ._classify import diagnosed, from_rpc_error
from ._lease import LeaseCore, LeaseMode, check_args
from ._pb import capacity_pb2_grpc as cpb_grpc
from ._pb import limiter_pb2 as pb
from ._pb import limiter_pb2_grpc as pb_grpc
from ._session import Session
from ._transport import Pem
from .errors import CharonError, ClientError, ServerError
from .lease import Lease, refresh
from .results import RateGrant, Source, Stats

__all__ = ["Client", "Hold", "Lease", "MultiGrant"]

log = logging.getLogger("charon_client")

_T = TypeVar("_T")


class Client:
    """A connection to Charon, safe to share between threads.

    Every operation goes on one ``Session`` stream (SPEC §3), pipelined, so
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
        self._channel = c.open_channel(self.options, grpc.insecure_channel, grpc.secure_channel)
        self._metadata = self.options.transport.metadata()
        self._degraded_log = c.DegradedLog()
        self._stub = pb_grpc.LimiterStub(self._channel)
        self._capacity = cpb_grpc.CapacityStub(self._channel)
        self._leases: weakref.WeakSet[Lease] = weakref.WeakSet()
        self._lock = threading.Lock()
        self._session: Optional[Session] = None
        self._generation = 0
        self._places = threading.BoundedSemaphore(self.options.max_in_flight)
        self._kill_switch = False
        self._counters = c.Counters()
        self._closed = False

    # -- lifecycle ---------------------------------------------------------

    def close(self) -> None:
        """Gives back the leases still held, ends the session (the server
        releases its holds) and the channel."""
        with self._lock:
            self._closed = True
            leases = list(self._leases)
        for lease in leases:
            lease.__exit__(None, None, None)
        with self._lock:
            session, self._session = self._session, None
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
        return self._kill_switch

    @kill_switch.setter
    def kill_switch(self, on: bool) -> None:
        self._kill_switch = bool(on)

    def stats(self) -> Stats:
        """What this client has seen so far."""
        return self._counters.snapshot()

    # -- operations ----------------------------------------------------------

    def request_rate(
        self,
        resource: str,
        domain: str,
        copies: int = 1,
        min_copies: int = 1,
        max_wait: float = 0.0,
        dry_run: bool = False,
    ) -> RateGrant:
        """A rate-limited request (SPEC §2, §10): at least ``min_copies`` and
        at most ``copies`` hits, retried with back-off for up to ``max_wait``
        seconds. A rejection is a result with ``granted == 0``. ``dry_run``
        asks without recording anything."""
        c.check_amount(copies, min_copies)
        c.check_max_wait(max_wait)
        self._counters.add("requests")
        started = time.monotonic()
        req = c.rate_request(resource, domain, copies, min_copies, dry_run)

        def attempt() -> Tuple[bool, pb.RateReply]:
            reply = self._rate_call(pb.SessionRequest(request=req), "request")
            assert isinstance(reply, pb.RateReply)
            return reply.granted > 0, reply

        ending, reply = self._until_granted(max_wait, attempt, _retry_after)
        return _rate_grant(ending, reply, min_copies, time.monotonic() - started)

    def charge(self, resource: str, domain: str, copies: int) -> pb.RateReply:
        """``charge`` (SPEC §10): a cost recorded after the fact, never
        rejected (a bucket goes into debt). Not degradable: a server error
        is raised, since the cost could not be recorded."""
        return self._charge_or_refund("charge", resource, domain, copies)

    def refund(self, resource: str, domain: str, copies: int) -> pb.RateReply:
        """``refund`` (SPEC §10): tokens given back to a bucket; a client
        error on any other kind. Not degradable, as ``charge``."""
        return self._charge_or_refund("refund", resource, domain, copies)

    def _charge_or_refund(self, op: str, resource: str, domain: str, copies: int) -> pb.RateReply:
        req = c.charge_request(resource, domain, copies)
        try:
            reply = self._rate_call(_charge_op(op, req), op)
        except ServerError:
            self._counters.add("server_errors")
            raise
        assert isinstance(reply, pb.RateReply)
        return reply

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
        c.check_amount(copies, min_copies)
        c.check_max_wait(max_wait)
        c.check_wait(wait)
        self._counters.add("reserves")
        started = time.monotonic()
        req = c.reserve_request(resource, domain, copies, min_copies, wait)

        def attempt() -> Tuple[bool, Tuple[pb.ReserveReply, int]]:
            reply, generation = self._call_gen(
                pb.SessionRequest(reserve=req), "reserve", extra=wait
            )
            assert isinstance(reply, pb.ReserveReply)
            return reply.granted > 0, (reply, generation)

        ending, answer = self._until_granted(max_wait, attempt, lambda _a: None)
        waited = time.monotonic() - started
        if ending == "granted" and answer is not None:
            reply, generation = answer
            groups = [g.name for g in reply.groups]
            return Hold(
                self,
                resource,
                domain,
                groups,
                reply.granted,
                Source.SERVER,
                generation,
                reply,
                waited,
            )
        reply_or_none = answer[0] if answer is not None else None
        if ending == "rejected":
            return Hold(self, resource, domain, [], 0, Source.SERVER, None, reply_or_none, waited)
        source = Source.DEGRADED if ending == "degraded" else Source.KILL_SWITCH
        return Hold(self, resource, domain, [], min_copies, source, None, reply_or_none, waited)

    def seize_copy(self, transfer_id: str) -> Hold:
        """Takes over copies another client staged with ``Hold.transfer``
        (on any server). Not possible in degraded mode: an unreachable
        server is a ``ServerError``; an unknown, expired or already seized
        transfer is a ``ClientError``."""
        reply, generation = self._call_gen(
            pb.SessionRequest(seize=pb.SeizeRequest(transfer_id=transfer_id)), "seize"
        )
        assert isinstance(reply, pb.SeizeReply)
        return Hold(
            self,
            reply.resource,
            reply.domain,
            list(reply.groups),
            reply.copies,
            Source.SERVER,
            generation,
            None,
            0.0,
        )

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
        c.check_amount(max_copies, min_copies)
        c.check_max_wait(max_wait)
        started = time.monotonic()
        n = max_copies
        holds: list[Hold] = []

        def left() -> float:
            return max(max_wait - (time.monotonic() - started), 0.0)

        try:
            for resource in copy_resources:
                hold = self.hold_copy(resource, domain, n, min_copies, left())
                if not hold.success:
                    _release_all(holds)
                    return MultiGrant(0, [], None)
                holds.append(hold)
                _shrink(holds, hold.copies)
                n = hold.copies
            rate: Optional[RateGrant] = None
            if rate_resource is not None:
                rate = self.request_rate(rate_resource, domain, n, min_copies, left())
                if not rate.success:
                    _release_all(holds)
                    return MultiGrant(0, [], None)
                _shrink(holds, rate.granted)
                n = rate.granted
            return MultiGrant(n, holds, rate)
        except BaseException:
            _release_all(holds)
            raise

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
        resource, SPEC §12) for ``wants`` units per second and keeps it
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
        with self._lock:
            if self._closed:
                raise ClientError("the client is closed")
        timeout = self.options.request_timeout
        core = LeaseCore(resource, cid, value, mode, bool(adaptive), self.options.transport)
        error = refresh(core, self._capacity, timeout, value)
        if error is not None:
            error = self._diagnosed(error)
        if isinstance(error, ClientError):
            raise error
        lease = Lease(core, self._capacity, timeout)
        with self._lock:
            closed = self._closed
            if not closed:
                self._leases.add(lease)
        if closed:  # closed meanwhile
            lease.__exit__(None, None, None)
            raise ClientError("the client is closed")
        return lease

    # -- plumbing ----------------------------------------------------------

    def _live_session(self) -> Session:
        with self._lock:
            if self._closed:
                raise ClientError("the client is closed")
            if self._session is None or self._session.closed:
                self._generation += 1
                self._session = Session(self._stub, self._generation, self.options.transport)
            return self._session

    def live_generation(self) -> Optional[int]:
        """The generation of the live session, if any: holds made on an
        older one were released by the server when it ended."""
        with self._lock:
            if self._session is None or self._session.closed:
                return None
            return self._session.generation

    def _call_gen(
        self, request: pb.SessionRequest, field: str, extra: float = 0.0
    ) -> Tuple[object, int]:
        timeout = self.options.request_timeout
        if not self._places.acquire(timeout=timeout):
            raise self._no_place(timeout)
        try:
            session = self._live_session()
            reply = session.call(request, timeout + extra)
            return c.expect(reply, field, self.options.transport), session.generation
        except CharonError as e:
            raise self._diagnosed(e) from None
        finally:
            self._places.release()

    def _no_place(self, timeout: float) -> ServerError:
        return ServerError(
            f"no place in flight within {timeout} s ({self.options.max_in_flight} operations "
            f"already wait for {self.options.transport.address})",
            kind="timeout",
            address=self.options.transport.address,
        )

    def _diagnosed(self, error: CharonError) -> CharonError:
        """``error``, or its client-class cause if it is a connection that
        ended without a word (see ``_classify``)."""
        return diagnosed(error, self.options.transport, self.options.request_timeout)

    def _call(self, request: pb.SessionRequest, field: str) -> object:
        return self._call_gen(request, field)[0]

    def _rate_call(self, request: pb.SessionRequest, field: str) -> pb.RateReply:
        """A rate request, charge or refund: on the session, or as a unary
        call with ``rate_transport="unary"`` (same answers either way)."""
        if self.options.rate_transport == "session":
            reply = self._call(request, field)
            assert isinstance(reply, pb.RateReply)
            return reply
        timeout = self.options.request_timeout
        if not self._places.acquire(timeout=timeout):
            raise self._no_place(timeout)
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

    def _until_granted(
        self,
        max_wait: float,
        attempt: Callable[[], Tuple[bool, _T]],
        retry_after: Callable[[_T], Optional[float]],
    ) -> Tuple[str, Optional[_T]]:
        """Runs ``attempt`` until granted, or the kill switch grants, or
        ``max_wait`` runs out. A server error ends it at once (SPEC §5: not
        retried on the same server) and degraded mode may grant. Returns
        ``granted``, ``rejected``, ``kill_switch`` or ``degraded`` and the
        last answer."""
        started = time.monotonic()
        rejections = 0
        while True:
            try:
                granted, answer = attempt()
            except ServerError as e:
                self._counters.add("server_errors")
                if not self.options.fail_open:
                    raise
                self._counters.add("degraded_grants")
                self._degraded_log.note(e)
                return "degraded", None
            if granted:
                return "granted", answer
            if self._kill_switch:
                self._counters.add("kill_switch_grants")
                return "kill_switch", answer
            rejections += 1
            sleep = next_sleep(
                self.options.backoff_base,
                rejections,
                max_wait,
                time.monotonic() - started,
                random.random(),
                retry_after(answer),
            )
            if sleep is None:
                self._counters.add("rejections")
                return "rejected", answer
            time.sleep(sleep)


def _rate_grant(
    ending: str, reply: Optional[pb.RateReply], min_copies: int, waited: float
) -> RateGrant:
    """How a rate request ended, as the grant the caller sees."""
    if ending == "granted" and reply is not None:
        return RateGrant(reply.granted, Source.SERVER, reply, waited)
    if ending == "rejected":
        return RateGrant(0, Source.SERVER, reply, waited)
    source = Source.DEGRADED if ending == "degraded" else Source.KILL_SWITCH
    return RateGrant(min_copies, source, reply, waited)


def _retry_after(reply: Optional[pb.RateReply]) -> Optional[float]:
    if reply is None or not reply.HasField("retry_after_ms"):
        return None
    return reply.retry_after_ms / 1000.0


def _charge_op(op: str, req: pb.ChargeRequest) -> pb.SessionRequest:
    if op == "refund":
        return pb.SessionRequest(refund=req)
    return pb.SessionRequest(charge=req)


class Hold:
    """Copies of a resource held by a client, or the rejection of a reserve
    (then ``success`` is False and it holds nothing). A context manager:
    leaving the block releases what is still held (paper §3.2)."""

    def __init__(
        self,
        client: Client,
        resource: str,
        domain: str,
        groups: Sequence[str],
        copies: int,
        source: Source,
        generation: Optional[int],
        reply: Optional[pb.ReserveReply],
        waited: float,
    ) -> None:
        self._client = client
        self.resource = resource
        self.domain = domain
        self.groups: list[str] = list(groups)
        """The group set the copies are held under (named in releases)."""
        self.granted = copies
        """Copies granted by the reserve (or seized)."""
        self.copies = copies
        """Copies still held."""
        self.source = source
        self.reply = reply
        """The server's reply to the reserve (limits and counts), if any."""
        self.waited = waited
        """Seconds spent waiting for the grant, back-off included."""
        self._generation = generation
        self._lock = threading.Lock()

    @property
    def success(self) -> bool:
        """Whether the reserve was granted."""
        return self.granted > 0

    @property
    def degraded(self) -> bool:
        """Granted by the client alone: nothing is held on the server."""
        return self.source is Source.DEGRADED

    @property
    def queue_full(self) -> bool:
        """Rejected at once: too many callers already wait for the resource
        (run the fallback, e.g. serve a stale cache entry)."""
        return self.reply is not None and self.reply.queue_full

    @property
    def result_ready(self) -> bool:
        """No copy because a holder finished the work this caller waited to
        do (``wait_mode: shared_result``): read its result instead."""
        return self.reply is not None and self.reply.result_ready

    @property
    def waited_on_server(self) -> Optional[float]:
        """Seconds the reserve waited in the resource's queue on the server
        (None unless it was allowed to wait; 0.0: answered at once)."""
        if self.reply is None or not self.reply.HasField("waited_ms"):
            return None
        return self.reply.waited_ms / 1000.0

    def _on_live_session(self) -> bool:
        return self._generation is not None and self._client.live_generation() == self._generation

    def __del__(self) -> None:
        # A hold dropped without ``with`` nor release (as a Rust ``Hold``
        # dropped): its copies are released in the background rather than
        # held until the session ends. No lock is taken (this may run in
        # the middle of any code); an attribute read is atomic.
        try:
            session = self._client._session
            if (
                self.copies > 0
                and self._generation is not None
                and session is not None
                and not session.closed
                and session.generation == self._generation
            ):
                release = c.release_request(self.resource, self.domain, self.copies, self.groups)
                session.send_detached(release)
        except Exception:  # noqa: BLE001, S110 - never raise from __del__
            pass

    def release(self, n: int, result_ready: bool = False) -> None:
        """Gives back ``n`` of the copies still held. ``result_ready`` (a
        resource of ``wait_mode: shared_result``): the work is done, every
        caller waiting for this resource and domain is told to read its
        result instead of getting a copy."""
        with self._lock:
            if n < 0 or n > self.copies:
                raise ClientError(f"cannot release {n} copies; this hold has {self.copies}")
            if n == 0:
                return
            if self._generation is not None and self._on_live_session():
                req = c.release_request(self.resource, self.domain, n, self.groups, result_ready)
                self._client._call(pb.SessionRequest(release=req), "release")
            # Else degraded, kill-switched, or the session ended (the server
            # released them then): nothing to tell the server.
            self.copies -= n

    def release_all(self) -> None:
        """Gives back every copy still held."""
        self.release(self.copies)

    def transfer(self, n: int, ttl: float) -> str:
        """Stages ``n`` held copies for another client (on any server) to
        ``seize_copy`` within ``ttl`` seconds; returns the transfer id to
        hand over. Copies granted in degraded mode cannot be transferred."""
        with self._lock:
            if n < 1 or n > self.copies:
                raise ClientError(f"cannot transfer {n} copies; this hold has {self.copies}")
            if not self._on_live_session():
                raise ServerError(
                    "these copies are not held on a live session (degraded, or the session ended)"
                )
            req = c.transfer_request(self.resource, self.domain, n, self.groups, ttl)
            reply = self._client._call(pb.SessionRequest(transfer=req), "transfer")
            assert isinstance(reply, pb.TransferReply)
            self.copies -= n
            return reply.transfer_id

    def __enter__(self) -> Hold:
        return self

    def __exit__(
        self,
        exc_type: Optional[type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        try:
            self.release_all()
        except Exception as e:  # noqa: BLE001 - never mask the block's own exception
            log.warning(
                "release of %d copies of %s on leaving the block failed (%s); "
                "they go back when the session ends",
                self.copies,
                self.resource,
                e,
            )

    def __repr__(self) -> str:
        return (
            f"Hold({self.resource!r}, {self.domain!r}, copies={self.copies}, "
            f"granted={self.granted}, source={self.source.value})"
        )


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
        _release_all(self.holds)

    def __enter__(self) -> MultiGrant:
        return self

    def __exit__(
        self,
        exc_type: Optional[type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        for hold in self.holds:
            hold.__exit__(exc_type, exc, tb)


def _shrink(holds: Sequence[Hold], n: int) -> None:
    for hold in holds:
        extra = hold.copies - n
        if extra > 0:
            hold.release(extra)


def _release_all(holds: Sequence[Hold]) -> None:
    for hold in holds:
        hold.__exit__(None, None, None)
