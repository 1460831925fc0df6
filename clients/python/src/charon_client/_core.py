"""The sans-I/O core shared by the sync client (``client.py``) and the
asyncio one (``aio.py``): request building, argument checks, the back-off
loop with the kill switch and degraded mode (and their counting and
logging), the holds' bookkeeping, ``multi``, and the session's generation.

Each operation is a generator of *effects* (``Call``, ``RateCall``,
``Sleep``): it yields what it needs done and receives the answer (or has
the error thrown into it). A shell runs it with ``drive``: the sync one
with blocking calls and ``time.sleep``, the asyncio one with ``await``.
So an operation's rule, and every parameter it takes, is written once,
here; a shell only says how to wait and how to talk to the server.
"""

from __future__ import annotations

import logging
import random
import threading
import time
import weakref
from dataclasses import dataclass
from typing import (
    Any,
    Callable,
    Generator,
    Generic,
    NamedTuple,
    Optional,
    Protocol,
    Sequence,
    Tuple,
    TypeVar,
    Union,
)

from . import _common as c
from ._backoff import next_sleep
from ._pb import limiter_pb2 as pb
from .errors import ClientError, ServerError
from .results import RateGrant, Source, Stats

log = logging.getLogger("charon_client")

_T = TypeVar("_T")
_H = TypeVar("_H", bound="HoldCore")


@dataclass(frozen=True)
class Call:
    """One operation on the session; the answer is ``(reply, generation)``:
    the reply's expected field and the session it was answered on."""

    request: pb.SessionRequest
    field: str


@dataclass(frozen=True)
class RateCall:
    """A rate request, charge or refund, on the session or as a unary call
    (``rate_transport``); the answer is the ``pb.RateReply``."""

    request: pb.SessionRequest
    field: str


@dataclass(frozen=True)
class Sleep:
    """Waits ``seconds`` (the back-off); the answer is ``None``."""

    seconds: float


Effect = Union[Call, RateCall, Sleep]
# An operation: yields effects, is sent their answers, returns its result.
Steps = Generator[Effect, Any, _T]


class SessionLike(Protocol):
    """What the core reads of a session (sync ``Session`` or ``AioSession``)."""

    @property
    def closed(self) -> bool: ...

    generation: int

    def send_detached(self, release: pb.ReleaseRequest) -> None: ...


_S = TypeVar("_S", bound=SessionLike)


class HoldFields(NamedTuple):
    """What a reserve (or seize) gave, from which a shell makes its ``Hold``."""

    resource: str
    domain: str
    groups: Sequence[str]
    copies: int
    source: Source
    generation: Optional[int]
    reply: Optional[pb.ReserveReply]
    waited: float


class ClientCore(Generic[_S]):
    """A client's state without I/O: options, counters, switches, the live
    session and its generation, the leases to give back on close. Its lock
    only guards quick bookkeeping (never held across I/O), so the asyncio
    shell may take it too."""

    def __init__(self, options: c.Options) -> None:
        self.options = options
        self.degraded_log = c.DegradedLog()
        self.counters = c.Counters()
        self.kill_switch = False
        self.lock = threading.Lock()
        self.session: Optional[_S] = None
        self.generation = 0
        self.closed = False
        self.leases: weakref.WeakSet[Any] = weakref.WeakSet()

    # -- bookkeeping -------------------------------------------------------

    def stats(self) -> Stats:
        return self.counters.snapshot()

    def check_open(self) -> None:
        with self.lock:
            if self.closed:
                raise ClientError("the client is closed")

    def close(self) -> Tuple[list[Any], Optional[_S]]:
        """Marks the client closed; returns the leases to give back and the
        session to end."""
        with self.lock:
            self.closed = True
            leases = list(self.leases)
            session, self.session = self.session, None
        return leases, session

    def add_lease(self, lease: Any) -> bool:
        """Registers a lease to give back on close; False if the client was
        closed meanwhile (then the caller gives it back at once)."""
        with self.lock:
            if self.closed:
                return False
            self.leases.add(lease)
            return True

    def live_session(self, new: Callable[[int], _S]) -> _S:
        """The live session, or a new one (``new(generation)``) if it ended."""
        with self.lock:
            if self.closed:
                raise ClientError("the client is closed")
            if self.session is None or self.session.closed:
                self.generation += 1
                self.session = new(self.generation)
            return self.session

    def live_generation(self) -> Optional[int]:
        with self.lock:
            if self.session is None or self.session.closed:
                return None
            return self.session.generation

    def no_place(self, timeout: float) -> ServerError:
        return ServerError(
            f"no place in flight within {timeout} s ({self.options.max_in_flight} operations "
            f"already wait for {self.options.transport.address})",
            kind="timeout",
            address=self.options.transport.address,
        )

    # -- operations ----------------------------------------------------------

    def request_rate(
        self,
        resource: str,
        domain: str,
        copies: int,
        min_copies: int,
        max_wait: float,
        dry_run: bool,
    ) -> Steps[RateGrant]:
        c.check_amount(copies, min_copies)
        c.check_max_wait(max_wait)
        self.counters.add("requests")
        started = time.monotonic()
        req = c.rate_request(resource, domain, copies, min_copies, dry_run)

        def attempt() -> Steps[Tuple[bool, pb.RateReply]]:
            reply = yield RateCall(pb.SessionRequest(request=req), "request")
            assert isinstance(reply, pb.RateReply)
            return reply.granted > 0, reply

        ending, reply = yield from self.until_granted(max_wait, attempt, _retry_after)
        return _rate_grant(ending, reply, min_copies, time.monotonic() - started)

    def charge_or_refund(
        self, op: str, resource: str, domain: str, copies: int
    ) -> Steps[pb.RateReply]:
        req = c.charge_request(resource, domain, copies)
        request = pb.SessionRequest(refund=req) if op == "refund" else pb.SessionRequest(charge=req)
        try:
            reply = yield RateCall(request, op)
        except ServerError:
            self.counters.add("server_errors")
            raise
        assert isinstance(reply, pb.RateReply)
        return reply

    def hold_copy(
        self,
        resource: str,
        domain: str,
        copies: int,
        min_copies: int,
        max_wait: float,
    ) -> Steps[HoldFields]:
        c.check_amount(copies, min_copies)
        c.check_max_wait(max_wait)
        self.counters.add("reserves")
        started = time.monotonic()
        req = c.reserve_request(resource, domain, copies, min_copies)

        def attempt() -> Steps[Tuple[bool, Tuple[pb.ReserveReply, int]]]:
            reply, generation = yield Call(pb.SessionRequest(reserve=req), "reserve")
            assert isinstance(reply, pb.ReserveReply)
            return reply.granted > 0, (reply, generation)

        ending, answer = yield from self.until_granted(max_wait, attempt, lambda _a: None)
        waited = time.monotonic() - started
        if ending == "granted" and answer is not None:
            reply, generation = answer
            groups = [g.name for g in reply.groups]
            return HoldFields(
                resource, domain, groups, reply.granted, Source.SERVER, generation, reply, waited
            )
        reply_or_none = answer[0] if answer is not None else None
        if ending == "rejected":
            return HoldFields(resource, domain, [], 0, Source.SERVER, None, reply_or_none, waited)
        source = Source.DEGRADED if ending == "degraded" else Source.KILL_SWITCH
        return HoldFields(resource, domain, [], min_copies, source, None, reply_or_none, waited)

    def seize_copy(self, transfer_id: str) -> Steps[HoldFields]:
        request = pb.SessionRequest(seize=pb.SeizeRequest(transfer_id=transfer_id))
        reply, generation = yield Call(request, "seize")
        assert isinstance(reply, pb.SeizeReply)
        return HoldFields(
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
        new_hold: Callable[[HoldFields], _H],
        domain: str,
        copy_resources: Sequence[str],
        rate_resource: Optional[str],
        min_copies: int,
        max_copies: int,
        max_wait: float,
    ) -> Steps[Tuple[int, list[_H], Optional[RateGrant]]]:
        """The pseudo-atomic request of paper §3.3 (Figure 7); ``new_hold``
        makes the shell's ``Hold`` of each reserve."""
        c.check_amount(max_copies, min_copies)
        c.check_max_wait(max_wait)
        started = time.monotonic()
        n = max_copies
        holds: list[_H] = []

        def left() -> float:
            return max(max_wait - (time.monotonic() - started), 0.0)

        try:
            for resource in copy_resources:
                fields = yield from self.hold_copy(resource, domain, n, min_copies, left())
                hold = new_hold(fields)
                if not hold.success:
                    yield from release_all(holds)
                    return 0, [], None
                holds.append(hold)
                yield from _shrink(holds, hold.copies)
                n = hold.copies
            rate: Optional[RateGrant] = None
            if rate_resource is not None:
                rate = yield from self.request_rate(
                    rate_resource, domain, n, min_copies, left(), False
                )
                if not rate.success:
                    yield from release_all(holds)
                    return 0, [], None
                yield from _shrink(holds, rate.granted)
                n = rate.granted
            return n, holds, rate
        except BaseException:
            yield from release_all(holds)
            raise

    def until_granted(
        self,
        max_wait: float,
        attempt: Callable[[], Steps[Tuple[bool, _T]]],
        retry_after: Callable[[_T], Optional[float]],
    ) -> Steps[Tuple[str, Optional[_T]]]:
        """Runs ``attempt`` until granted, or the kill switch grants, or
        ``max_wait`` runs out. A server error ends it at once (not retried
        on the same server) and degraded mode may grant. Returns
        ``granted``, ``rejected``, ``kill_switch`` or ``degraded`` and the
        last answer."""
        started = time.monotonic()
        rejections = 0
        while True:
            try:
                granted, answer = yield from attempt()
            except ServerError as e:
                self.counters.add("server_errors")
                if not self.options.fail_open:
                    raise
                self.counters.add("degraded_grants")
                self.degraded_log.note(e)
                return "degraded", None
            if granted:
                return "granted", answer
            if self.kill_switch:
                self.counters.add("kill_switch_grants")
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
                self.counters.add("rejections")
                return "rejected", answer
            yield Sleep(sleep)


class HoldCore:
    """A hold's state and rules (the shells' ``Hold`` add the lock and the
    waiting): copies of a resource held by a client, or the rejection of a
    reserve (then ``success`` is False and it holds nothing)."""

    def __init__(self, core: ClientCore[Any], fields: HoldFields) -> None:
        self._core = core
        self.resource = fields.resource
        self.domain = fields.domain
        self.groups: list[str] = list(fields.groups)
        """The group set the copies are held under (named in releases)."""
        self.granted = fields.copies
        """Copies granted by the reserve (or seized)."""
        self.copies = fields.copies
        """Copies still held."""
        self.source = fields.source
        self.reply = fields.reply
        """The server's reply to the reserve (limits and counts), if any."""
        self.waited = fields.waited
        """Seconds spent waiting for the grant, back-off included."""
        self._generation = fields.generation

    @property
    def success(self) -> bool:
        """Whether the reserve was granted."""
        return self.granted > 0

    @property
    def degraded(self) -> bool:
        """Granted by the client alone: nothing is held on the server."""
        return self.source is Source.DEGRADED

    def _on_live_session(self) -> bool:
        return self._generation is not None and self._core.live_generation() == self._generation

    def __del__(self) -> None:
        # A hold dropped without ``with`` nor release (as a Rust ``Hold``
        # dropped): its copies are released in the background rather than
        # held until the session ends. No lock is taken (this may run in
        # the middle of any code); an attribute read is atomic.
        try:
            session = self._core.session
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

    def _release_steps(self, n: int) -> Steps[None]:
        if n < 0 or n > self.copies:
            raise ClientError(f"cannot release {n} copies; this hold has {self.copies}")
        if n == 0:
            return
        if self._generation is not None and self._on_live_session():
            req = c.release_request(self.resource, self.domain, n, self.groups)
            yield Call(pb.SessionRequest(release=req), "release")
        # Else degraded, kill-switched, or the session ended (the server
        # released them then): nothing to tell the server.
        self.copies -= n

    def _transfer_steps(self, n: int, ttl: float) -> Steps[str]:
        if n < 1 or n > self.copies:
            raise ClientError(f"cannot transfer {n} copies; this hold has {self.copies}")
        if not self._on_live_session():
            raise ServerError(
                "these copies are not held on a live session (degraded, or the session ended)"
            )
        req = c.transfer_request(self.resource, self.domain, n, self.groups, ttl)
        reply, _generation = yield Call(pb.SessionRequest(transfer=req), "transfer")
        assert isinstance(reply, pb.TransferReply)
        self.copies -= n
        return reply.transfer_id

    def _exit_steps(self) -> Steps[None]:
        """Releases what is still held on leaving a block; a failure is
        logged, never raised (it must not mask the block's own exception)."""
        try:
            yield from self._release_steps(self.copies)
        except Exception as e:  # noqa: BLE001
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


def _shrink(holds: Sequence[HoldCore], n: int) -> Steps[None]:
    for hold in holds:
        extra = hold.copies - n
        if extra > 0:
            yield from hold._release_steps(extra)


def release_all(holds: Sequence[HoldCore]) -> Steps[None]:
    for hold in holds:
        yield from hold._exit_steps()


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
