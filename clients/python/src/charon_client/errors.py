"""The client's one error model, the Rust client's: every failure is of
class ``client`` (``ClientError``: the request or the client's settings
are wrong; degraded mode never grants instead) or ``server``
(``ServerError``: Charon or the network to it failed; degraded mode may
grant, by the caller's ``fail_open``), with a ``kind``, the gRPC ``code``
when there is one and the ``address`` it concerns. A rejection is never an
error: it is an ordinary answer whose ``granted`` is 0."""

from __future__ import annotations

from typing import Optional

import grpc

__all__ = ["KINDS", "CharonError", "ClientError", "ServerError", "error_of"]

KINDS: dict[str, str] = {
    # The request is malformed or out of range, or refused before sending.
    "invalid_request": "client",
    # An unknown resource or transfer id.
    "not_found": "client",
    # Wrong kind of resource, copies not held.
    "failed_precondition": "client",
    # No bearer token, or one the server does not know.
    "unauthenticated": "client",
    # A valid token not allowed the resource's namespace.
    "permission_denied": "client",
    # TLS failed over certificates or settings (either side's).
    "tls": "client",
    # The address answers, but not as a Charon gRPC server over this
    # transport (an HTTP port, plain text to TLS or the reverse).
    "wrong_protocol": "client",
    # The client's own settings cannot be used (a target, a file, a token).
    "settings": "client",
    # Nothing accepts connections at the address.
    "unreachable": "server",
    # No answer in time.
    "timeout": "server",
    # The server cannot decide now (store down, no configuration yet), or
    # the connection broke.
    "unavailable": "server",
    # The server failed otherwise.
    "internal": "server",
}
"""Every kind of error and its class, as the Rust client's ``ErrorKind``."""


class CharonError(Exception):
    """Base of both classes, so that callers can catch either at once.

    ``str(e)`` is the whole line, as the Rust client and the CLI print it:
    ``client error: unknown resource "x" (NOT_FOUND from 127.0.0.1:7070)``.
    """

    error_class = "server"
    """``client`` or ``server``."""
    _default_kind = "unavailable"

    def __init__(
        self,
        message: str,
        *,
        kind: Optional[str] = None,
        code: Optional[grpc.StatusCode] = None,
        address: Optional[str] = None,
        answered: bool = False,
    ) -> None:
        self.message = message
        """The cause, without the class."""
        self.kind: str = kind or self._default_kind
        """What went wrong: one of ``KINDS``."""
        self.code = code
        """The gRPC status code, from the server or made up by gRPC for a
        transport failure (``UNAVAILABLE`` for a refused connection); None
        for an error found before anything was sent."""
        self.address = address
        """The server address the failure concerns (the client's target)."""
        text = f"{self.error_class} error: {message}"
        if answered and code is not None and address:
            text += f" ({code.name} from {address})"
        super().__init__(text)


class ClientError(CharonError):
    """The request or the client's settings are wrong (unknown resource,
    wrong kind, copies not held, a bad transfer id, invalid numbers, a
    refused token, a certificate mistake, the wrong port): retrying will
    not help, and degraded mode never grants instead."""

    error_class = "client"
    _default_kind = "invalid_request"


class ServerError(CharonError):
    """The server or its store failed, or could not be reached, and degraded
    mode is off or cannot apply (transfer, seize, charge, refund): do not
    retry on this server at once."""

    error_class = "server"
    _default_kind = "unavailable"


def error_of(
    kind: str,
    message: str,
    *,
    code: Optional[grpc.StatusCode] = None,
    address: Optional[str] = None,
    answered: bool = False,
) -> CharonError:
    """An error of ``kind``, of the class the kind belongs to."""
    cls = ClientError if KINDS.get(kind) == "client" else ServerError
    return cls(message, kind=kind, code=code, address=address, answered=answered)
