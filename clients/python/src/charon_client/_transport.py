"""How a client reaches its server, shared by the sync and asyncio
clients: the target, TLS and mutual TLS (a CA, a client certificate and
its key, the server name to expect) and the bearer token, with the Rust
client's names (``ClientOptions::token``, ``ClientTls`` and the CLI's
``--ca``, ``--cert``, ``--key``, ``--server-name``, ``--token``)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Optional, Tuple, Union

import grpc

from .errors import ClientError

__all__ = ["Pem", "Transport", "transport_of"]

Pem = Union[str, "os.PathLike[str]", bytes]
"""A PEM file's path, or its contents as bytes."""


def _settings_error(message: str) -> ClientError:
    return ClientError(message, kind="settings")


def _pem(value: Optional[Pem], what: str) -> Optional[bytes]:
    """The PEM bytes of ``value``: bytes as they are, a path read."""
    if value is None:
        return None
    if isinstance(value, bytes):
        data = value
    else:
        try:
            with open(value, "rb") as f:
                data = f.read()
        except OSError as e:
            raise _settings_error(f"{what}: cannot read {os.fspath(value)}: {e}") from None
    if b"-----BEGIN" not in data:
        raise _settings_error(f"{what}: not PEM (no -----BEGIN line)")
    return data


@dataclass(frozen=True)
class Transport:
    """Where the server is and how to talk to it."""

    address: str
    """The target as given, as errors name it."""
    target: str
    """``host:port`` for gRPC."""
    tls: bool
    ca: Optional[bytes] = field(default=None, repr=False)
    cert: Optional[bytes] = field(default=None, repr=False)
    key: Optional[bytes] = field(default=None, repr=False)
    server_name: Optional[str] = None
    token: Optional[str] = field(default=None, repr=False)

    @property
    def host_port(self) -> Tuple[str, int]:
        """The server's host and port, for a connection of its own."""
        host, _, port = self.target.rpartition(":")
        return host.strip("[]"), int(port)

    def credentials(self) -> Optional[grpc.ChannelCredentials]:
        """TLS credentials, or None for plain text."""
        if not self.tls:
            return None
        return grpc.ssl_channel_credentials(
            root_certificates=self.ca, private_key=self.key, certificate_chain=self.cert
        )

    def channel_options(self) -> list[Tuple[str, Union[str, int]]]:
        if self.server_name is None:
            return []
        return [("grpc.ssl_target_name_override", self.server_name)]

    def metadata(self) -> Optional[Tuple[Tuple[str, str], ...]]:
        """``authorization: Bearer TOKEN`` on every call, or nothing."""
        if self.token is None:
            return None
        return (("authorization", f"Bearer {self.token}"),)


def transport_of(
    target: str,
    token: Optional[str],
    ca: Optional[Pem],
    cert: Optional[Pem],
    key: Optional[Pem],
    server_name: Optional[str],
) -> Transport:
    """Checks and loads the settings: ``target`` is ``host:port``,
    ``http://host:port`` or ``https://host:port``; TLS is on for
    ``https://`` and whenever ``ca``, ``cert`` or ``server_name`` is
    given (as the CLI's ``--ca``). ``ca`` absent with TLS: gRPC's own
    roots. ``cert`` and ``key`` go together."""
    if not isinstance(target, str) or not target:
        raise _settings_error(f"target must be host:port (got {target!r})")
    scheme, sep, rest = target.partition("://")
    if not sep:
        scheme, rest = "", target
    if scheme not in ("", "http", "https") or not rest or "/" in rest.rstrip("/"):
        raise _settings_error(
            f"target must be host:port, http://host:port or https://host:port (got {target!r})"
        )
    host_port = rest.rstrip("/")
    host, colon, port = host_port.rpartition(":")
    if not colon or not host or not port.isdigit():
        raise _settings_error(f"target must name a host and a port (got {target!r})")
    if (cert is None) != (key is None):
        raise _settings_error("a client certificate needs its key, and a key its certificate")
    if token is not None and (
        not token or any(not (" " <= ch <= "~") for ch in token) or token != token.strip()
    ):
        raise _settings_error("the token must be printable ASCII without spaces at either end")
    tls = scheme == "https" or ca is not None or cert is not None or server_name is not None
    return Transport(
        address=target,
        target=host_port,
        tls=tls,
        ca=_pem(ca, "ca"),
        cert=_pem(cert, "cert"),
        key=_pem(key, "key"),
        server_name=server_name,
        token=token,
    )
