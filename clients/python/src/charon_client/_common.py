"""What the sync and asyncio clients share: their options, argument
checks, the wire messages, reply unpacking, the counters and the log of
degraded grants."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Callable, Optional, Sequence, Tuple, TypeVar, Union

from ._classify import from_reply_error
from ._pb import limiter_pb2 as pb
from ._transport import Pem, Transport, transport_of
from .errors import CharonError, ClientError, ServerError
from .results import Stats

log = logging.getLogger("charon_client")


@dataclass(frozen=True)
class Options:
    """How a client talks to Charon and behaves when it cannot (see the
    ``Client`` constructors for each field's meaning)."""

    transport: Transport
    backoff_base: float = 1.0
    request_timeout: float = 1.0
    fail_open: bool = True
    max_in_flight: int = 256
    keepalive: float = 20.0
    rate_transport: str = "session"

    @property
    def target(self) -> str:
        """The server's ``host:port``."""
        return self.transport.target

    def channel_options(self) -> list[Tuple[str, Union[str, int]]]:
        """HTTP/2 keep-alive, so that a server that stops answering is
        noticed (and its session dropped) within about ``keepalive``; the
        server name TLS expects, if set."""
        half_ms = max(int(self.keepalive * 500), 1000)
        return [
            ("grpc.keepalive_time_ms", half_ms),
            ("grpc.keepalive_timeout_ms", half_ms),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.max_pings_without_data", 0),
            *self.transport.channel_options(),
        ]


def options(
    target: str,
    *,
    backoff_base: float,
    request_timeout: float,
    fail_open: bool,
    max_in_flight: int,
    keepalive: float,
    rate_transport: str,
    token: Optional[str],
    ca: Optional[Pem],
    cert: Optional[Pem],
    key: Optional[Pem],
    server_name: Optional[str],
) -> Options:
    """The options of a client (sync or asyncio), checked: a mistake in
    them is a ``ClientError`` of kind ``settings`` here, before anything is
    sent."""
    return Options(
        transport_of(target, token, ca, cert, key, server_name),
        backoff_base,
        request_timeout,
        fail_open,
        max(max_in_flight, 1),
        keepalive,
        check_transport(rate_transport),
    )


_Channel = TypeVar("_Channel")


def open_channel(
    options: Options,
    insecure: Callable[..., _Channel],
    secure: Callable[..., _Channel],
) -> _Channel:
    """The client's channel: ``insecure`` or, under TLS, ``secure`` (the
    ``grpc`` or the ``grpc.aio`` functions), with the keep-alive and server
    name options."""
    transport = options.transport
    credentials = transport.credentials()
    if credentials is None:
        return insecure(transport.target, options=options.channel_options())
    return secure(transport.target, credentials, options=options.channel_options())


# The least time between two log lines about degraded grants: a server that
# is down must not flood the application's log with a line per request,
# nor go unnoticed.
DEGRADED_LOG_EVERY = 10.0


class DegradedLog:
    """Logs degraded grants at WARNING, at most one line every
    ``DEGRADED_LOG_EVERY`` seconds, saying how many went unlogged since."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last: Optional[float] = None
        self._unlogged = 0

    def note(self, error: CharonError) -> None:
        now = time.monotonic()
        with self._lock:
            if self._last is not None and now - self._last < DEGRADED_LOG_EVERY:
                self._unlogged += 1
                return
            self._last, unlogged, self._unlogged = now, self._unlogged, 0
        log.warning(
            "degraded grant: the server could not answer, min_copies granted locally: %s "
            "(%d more degraded grants since the last line; at most one line every %g s)",
            error,
            unlogged,
            DEGRADED_LOG_EVERY,
        )


def check_transport(rate_transport: str) -> str:
    if rate_transport not in ("session", "unary"):
        raise ClientError(f'rate_transport must be "session" or "unary" (got {rate_transport!r})')
    return rate_transport


def check_amount(copies: int, min_copies: int) -> None:
    """The same rule as the server's (an explicit 0 is a client error),
    checked before anything is sent so that degraded mode never grants a
    request the server would refuse."""
    if copies < 1 or min_copies < 1 or min_copies > copies:
        raise ClientError(
            f"need 1 <= min_copies <= copies (got copies {copies}, min_copies {min_copies})"
        )


def check_max_wait(max_wait: float) -> None:
    if not max_wait >= 0:
        raise ClientError(f"max_wait must be a number of seconds >= 0 (got {max_wait})")


def rate_request(
    resource: str, domain: str, copies: int, min_copies: int, dry_run: bool
) -> pb.RateRequest:
    return pb.RateRequest(
        resource=resource, domain=domain, copies=copies, min_copies=min_copies, dry_run=dry_run
    )


def check_wait(wait: float) -> None:
    if not 0 <= wait <= 3600:
        raise ClientError(f"wait must be a number of seconds from 0 to 3600 (got {wait})")


def reserve_request(
    resource: str, domain: str, copies: int, min_copies: int, wait: float = 0.0
) -> pb.ReserveRequest:
    req = pb.ReserveRequest(resource=resource, domain=domain, copies=copies, min_copies=min_copies)
    wait_ms = int(round(wait * 1000))
    if wait_ms > 0:
        req.wait_ms = wait_ms
    return req


def release_request(
    resource: str, domain: str, copies: int, groups: Sequence[str], result_ready: bool = False
) -> pb.ReleaseRequest:
    return pb.ReleaseRequest(
        resource=resource,
        domain=domain,
        copies=copies,
        groups=list(groups),
        result_ready=result_ready,
    )


def transfer_request(
    resource: str, domain: str, copies: int, groups: Sequence[str], ttl: float
) -> pb.TransferRequest:
    if not ttl > 0:
        raise ClientError(f"ttl must be a number of seconds > 0 (got {ttl})")
    return pb.TransferRequest(
        resource=resource,
        domain=domain,
        copies=copies,
        groups=list(groups),
        ttl_ms=max(int(ttl * 1000), 1),
    )


def charge_request(resource: str, domain: str, copies: int) -> pb.ChargeRequest:
    if copies < 1:
        raise ClientError(f"copies must be at least 1 (got {copies})")
    return pb.ChargeRequest(resource=resource, domain=domain, copies=copies)


def expect(reply: pb.SessionReply, field: str, transport: Transport) -> object:
    """The result of ``reply`` if it is ``field``; its error as an
    exception; anything else is a server error (a confused server)."""
    which = reply.WhichOneof("result")
    if which == "error":
        raise from_reply_error(reply.error, transport)
    if which != field:
        raise ServerError(
            f"unexpected reply {which!r} to a {field!r} operation",
            kind="internal",
            address=transport.address,
        )
    result: object = getattr(reply, field)
    return result


class Counters:
    """Thread-safe counters behind ``Client.stats()``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values: dict[str, int] = {}

    def add(self, name: str) -> None:
        with self._lock:
            self._values[name] = self._values.get(name, 0) + 1

    def snapshot(self) -> Stats:
        with self._lock:
            return Stats(**self._values)


def release_of_late_grant(
    request: pb.SessionRequest, reply: pb.SessionReply
) -> Optional[pb.ReleaseRequest]:
    """The release that gives back what a reply no one waits for any more
    granted: a reserve or a seize whose caller gave up (no answer within
    ``request_timeout``, so it may have granted ``min_copies`` in degraded
    mode). Without it those copies would stay held until the session ends."""
    which = reply.WhichOneof("result")
    if which == "reserve" and request.WhichOneof("op") == "reserve" and reply.reserve.granted > 0:
        return release_request(
            request.reserve.resource,
            request.reserve.domain,
            reply.reserve.granted,
            [g.name for g in reply.reserve.groups],
        )
    if which == "seize" and reply.seize.copies > 0:
        s = reply.seize
        return release_request(s.resource, s.domain, s.copies, s.groups)
    return None
