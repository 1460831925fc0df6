"""The two error classes of SPEC §5. A rejection is never one of them: it
is an ordinary answer whose ``granted`` is 0."""

from __future__ import annotations

import grpc

from ._pb import limiter_pb2 as pb

__all__ = ["CharonError", "ClientError", "ServerError"]


class CharonError(Exception):
    """Base of both classes, so that callers can catch either at once."""


class ClientError(CharonError):
    """The request is wrong (unknown resource, wrong kind, copies not held,
    a bad transfer id, invalid numbers): retrying it will not help."""


class ServerError(CharonError):
    """The server or its store failed, or could not be reached, and degraded
    mode is off or cannot apply (transfer, seize, charge, refund): do not
    retry on this server at once."""


_CLIENT_CODES = frozenset(
    {
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.OUT_OF_RANGE,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
    }
)


def from_status(
    code: grpc.StatusCode | None, details: str | None, klass: str | None
) -> CharonError:
    """Classifies a gRPC status as the Rust client does: the server's
    ``charon-error-class`` trailer decides; without it, the code does."""
    message = details or ""
    if klass is not None:
        client = klass == "client"
    else:
        client = code in _CLIENT_CODES
    if client:
        return ClientError(message)
    name = code.name if code is not None else "UNKNOWN"
    return ServerError(f"{name}: {message}")


def from_reply_error(e: pb.Error) -> CharonError:
    """An ``Error`` message on the session stream (one bad operation never
    ends the session)."""
    # `class` is a Python keyword: the field is only reachable by name.
    klass: int = getattr(e, "class")
    if klass == pb.Error.CLIENT:
        return ClientError(e.message)
    return ServerError(e.message)
