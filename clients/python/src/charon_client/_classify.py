"""A failed call in the client's error model, shared by the sync and
asyncio clients: the server's own answers by their ``charon-error-class``
trailer (or their code), and gRPC's transport failures (nothing listening,
TLS, a port that speaks another protocol) by what gRPC says of them, each
with a message that names the address and what to check.

A connection that closed without a word is ambiguous: a server that died
does that, and so does a TLS port spoken to in plain text. ``diagnose``
then looks once, on a connection of its own, at what the server says at
the TLS level, so that a configuration mistake is never taken for a server
that is down (and turned into a degraded grant)."""

from __future__ import annotations

import os
import re
import socket
import ssl
import tempfile
from typing import Optional

import grpc

from ._pb import limiter_pb2 as pb
from ._transport import Transport
from .errors import CharonError, error_of

__all__ = ["diagnosed", "from_reply_error", "from_rpc_error", "from_status", "is_ambiguous"]

_PORTS = (
    "the gRPC port is 7070 and the HTTP port 7071 unless --listen and --http-listen say otherwise"
)

# The kinds of the codes a server answers without saying the class.
_CLIENT_KINDS = {
    grpc.StatusCode.INVALID_ARGUMENT: "invalid_request",
    grpc.StatusCode.OUT_OF_RANGE: "invalid_request",
    grpc.StatusCode.RESOURCE_EXHAUSTED: "invalid_request",
    grpc.StatusCode.NOT_FOUND: "not_found",
    grpc.StatusCode.FAILED_PRECONDITION: "failed_precondition",
    grpc.StatusCode.UNAUTHENTICATED: "unauthenticated",
    grpc.StatusCode.PERMISSION_DENIED: "permission_denied",
    grpc.StatusCode.UNIMPLEMENTED: "wrong_protocol",
}

_HTTP_STATUS = re.compile(r"Received http2 header with status: (\d+)")

# What gRPC's C core says of a connection that failed or ended without an
# answer (a status a server or a proxy sent says none of this).
_TRANSPORT = (
    "failed to connect to all addresses",
    "Socket closed",
    "Connection reset",
    "Broken pipe",
    "End of TCP stream",
    "handshake failed",
    "Unwrap failed",
    "GOAWAY",
    "keepalive watchdog",
    "Stream removed",
)


def _server_kind(code: Optional[grpc.StatusCode]) -> str:
    if code is grpc.StatusCode.DEADLINE_EXCEEDED:
        return "timeout"
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED, grpc.StatusCode.ABORTED):
        return "unavailable"
    return "internal"


def _kind_of_answer(code: Optional[grpc.StatusCode], klass: Optional[str]) -> str:
    client = klass == "client" if klass is not None else code in _CLIENT_KINDS
    if client:
        return _CLIENT_KINDS.get(code, "invalid_request") if code is not None else "invalid_request"
    return _server_kind(code)


def _transport_failure(
    code: Optional[grpc.StatusCode], details: str, transport: Transport
) -> Optional[CharonError]:
    """A failure of the connection (gRPC's words, not a server's), if
    ``details`` says one."""
    address = transport.address

    def err(kind: str, message: str) -> CharonError:
        return error_of(kind, message, code=code, address=address)

    if code is grpc.StatusCode.DEADLINE_EXCEEDED:
        return err("timeout", f"no answer from {address} in time ({details})")
    if code is not grpc.StatusCode.UNAVAILABLE or not any(t in details for t in _TRANSPORT):
        return None
    if "Connection refused" in details:
        return err(
            "unreachable",
            f"cannot connect to {address}: connection refused (nothing listens there: is the "
            "server running, and is this its gRPC port?)",
        )
    if "DNS resolution failed" in details or "Name or service not known" in details:
        return err("unreachable", f"cannot connect to {address}: its name does not resolve")
    if "WRONG_VERSION_NUMBER" in details or "wrong version number" in details:
        return err(
            "wrong_protocol",
            f"{address} does not speak TLS: connect in plain text (no ca=, cert=, "
            "server_name=, no https://), or to its TLS port",
        )
    if "CERTIFICATE_VERIFY_FAILED" in details or "certificate verify failed" in details:
        return err("tls", f"TLS with {address}: the server's certificate {_why_untrusted(details)}")
    if "is not in peer certificate" in details or "Hostname Verification" in details:
        return err(
            "tls",
            f"TLS with {address}: the server's certificate does not carry the name this client "
            "connects to: connect by a name it carries, or set server_name=",
        )
    if "TSI_DATA_CORRUPTED" in details or "CERTIFICATE_REQUIRED" in details:
        return err("tls", _refused_certificate(transport, "CERTIFICATE_REQUIRED" in details))
    if (
        "handshake failed" in details.lower()
        or "SSL_ERROR" in details
        or "verification check failed" in details.lower()
    ):
        return err("tls", f"TLS with {address} failed: {details}")
    return err("unavailable", f"the connection to {address} ended without an answer ({details})")


def _why_untrusted(details: str) -> str:
    text = details.lower()
    if "expired" in text:
        return "has expired: the server must be given a new certificate"
    if "not yet valid" in text:
        return "is not valid yet: check the server's certificate, or this host's clock"
    if "local issuer" in text or "self signed" in text or "self-signed" in text:
        return (
            "is not signed by a CA this client trusts (give the CA that signed it: ca=, or the "
            "CLI's --ca)"
        )
    return f"cannot be verified ({details})"


def _refused_certificate(transport: Transport, required: bool) -> str:
    if transport.cert is None or required:
        return (
            f"TLS with {transport.address}: the server requires a client certificate (mutual "
            "TLS) and this client presented none (give one: cert= and key=)"
        )
    return (
        f"TLS with {transport.address}: the server refused this client's certificate: it must "
        "be valid and signed by a CA of the server's --tls-client-ca"
    )


def from_status(
    code: Optional[grpc.StatusCode],
    details: Optional[str],
    klass: Optional[str],
    transport: Transport,
) -> CharonError:
    """A status in the error model: the server's ``charon-error-class``
    decides; without it, a transport failure by gRPC's words, else the
    code."""
    details = details or ""
    address = transport.address
    if klass is None:
        failure = _transport_failure(code, details, transport)
        if failure is not None:
            return failure
    kind = _kind_of_answer(code, klass)
    http = _HTTP_STATUS.search(details)
    if http is not None:
        # Made up by gRPC from an HTTP answer that was no gRPC answer.
        if kind == "wrong_protocol":
            message = (
                f"{address} is not a Charon gRPC port: it answered HTTP {http.group(1)} without "
                f"a gRPC status (the HTTP port? {_PORTS})"
            )
        else:
            message = f"{address} answered HTTP {http.group(1)} without a gRPC status (a proxy?)"
        return error_of(kind, message, code=code, address=address)
    if code is grpc.StatusCode.UNIMPLEMENTED:
        details = (
            f"the server at {address} does not serve this call ({details}): not a Charon "
            "server, or an older one"
        )
    return error_of(kind, details, code=code, address=address, answered=True)


def is_ambiguous(error: CharonError) -> bool:
    """Whether ``error`` is a connection that ended without a word (see the
    module): worth a ``diagnose``."""
    return error.kind == "unavailable" and error.message.startswith("the connection to ")


def from_rpc_error(e: grpc.RpcError, transport: Transport) -> CharonError:
    """A failed call or a broken stream in the error model (without the
    diagnosis, which may take a connection: see ``diagnose``)."""
    code: Optional[grpc.StatusCode] = None
    details: Optional[str] = None
    klass: Optional[str] = None
    trailers: object = ()
    if isinstance(e, (grpc.aio.AioRpcError, grpc.Call)):
        code, details, trailers = e.code(), e.details(), e.trailing_metadata()
    for key, value in trailers or ():  # type: ignore[attr-defined]
        if key == "charon-error-class":
            klass = value if isinstance(value, str) else bytes(value).decode()
    return from_status(code, details or str(e), klass, transport)


def from_reply_error(e: pb.Error, transport: Transport) -> CharonError:
    """An ``Error`` message on the session stream (one bad operation never
    ends the session): its code, the one a unary call would get, picks the
    kind; a server that predates the code gives only the class."""
    # `class` is a Python keyword: the field is only reachable by name.
    client = getattr(e, "class") == pb.Error.CLIENT
    try:
        code: Optional[grpc.StatusCode] = _CODES[e.code] if e.code else None
    except KeyError:
        code = grpc.StatusCode.UNKNOWN
    if code is None:
        code = grpc.StatusCode.INVALID_ARGUMENT if client else grpc.StatusCode.UNAVAILABLE
    return from_status(code, e.message, "client" if client else "server", transport)


_CODES = {c.value[0]: c for c in grpc.StatusCode}

_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00"


def diagnosed(error: CharonError, transport: Transport, timeout: float) -> CharonError:
    """``error``, or its client-class cause if it is a connection that ended
    without a word (see the module). Blocking: the asyncio client runs it
    in a thread."""
    if not is_ambiguous(error):
        return error
    cause = diagnose(transport, timeout)
    if cause is None:
        return error
    cause.code = error.code
    return cause


def diagnose(transport: Transport, timeout: float) -> Optional[CharonError]:
    """The client-class cause of an ambiguous failure, if there is one,
    found within ``timeout`` seconds on a connection of its own; None: the
    server looks like one that stopped or broke (a server error, as it
    was). Blocking: the asyncio client runs it in a thread."""
    try:
        sock = socket.create_connection(transport.host_port, timeout=max(timeout, 0.1))
    except OSError:
        return None
    try:
        if transport.tls:
            return _refused_after_handshake(sock, transport)
        return _speaks_tls(sock, transport)
    finally:
        sock.close()


def _context(transport: Optional[Transport]) -> ssl.SSLContext:
    """A TLS client accepting any server certificate (the client's own
    connection checked it already), presenting the client's certificate."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    ctx.set_alpn_protocols(["h2"])
    if transport is not None and transport.cert is not None and transport.key is not None:
        with tempfile.TemporaryDirectory(prefix="charon-client-") as d:
            cert, key = os.path.join(d, "cert.pem"), os.path.join(d, "key.pem")
            for path, data in ((cert, transport.cert), (key, transport.key)):
                with open(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600), "wb") as f:
                    f.write(data)
            ctx.load_cert_chain(cert, key)
    return ctx


def _refused_after_handshake(sock: socket.socket, transport: Transport) -> Optional[CharonError]:
    try:
        ctx = _context(transport)
        with ctx.wrap_socket(sock, server_hostname=transport.host_port[0]) as tls:
            tls.sendall(_PREFACE)
            tls.recv(64)
    except ssl.SSLError as e:
        reason = f"{e.reason or ''} {e}"
        if "CERTIFICATE_REQUIRED" in reason:
            return error_of("tls", _refused_certificate(transport, True), address=transport.address)
        if "ALERT" in reason:
            return error_of(
                "tls", _refused_certificate(transport, False), address=transport.address
            )
    except OSError:
        return None
    return None


def _speaks_tls(sock: socket.socket, transport: Transport) -> Optional[CharonError]:
    try:
        with _context(None).wrap_socket(sock, server_hostname=transport.host_port[0]):
            pass
    except ssl.SSLError as e:
        reason = f"{e.reason or ''} {e}"
        if "ALERT" not in reason:
            return None  # not TLS: the plain-text server closed on a ClientHello
    except OSError:
        return None
    return error_of(
        "wrong_protocol",
        f"{transport.address} speaks TLS, and this client plain text: connect with https:// and "
        "the CA that signed the server's certificate (ca=)",
        address=transport.address,
    )
