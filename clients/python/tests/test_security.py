"""Secured servers and every mistake a user can make, through real
`charon serve` processes, sync and asyncio: a token-protected server
refuses a client without its token (a client error: no grant, no degraded
grant) and serves it with the token; TLS and mutual TLS; and for each
mistake (wrong port, HTTP port, wrong token, missing client certificate,
wrong CA, expired certificate, plain text to TLS, TLS to plain text,
unknown resource, server down) the class of the error and whether a
client that fails open degraded. Only the server class may degrade.

Set CHARON_MISTAKES_TABLE=FILE to have the messages written there as a
Markdown table (docs/errors.md shows it)."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from dataclasses import dataclass
from typing import Any, Iterator, Optional

import pytest
from conftest import Charon, free_port
from pki import Leaf, Pki

from charon_client import CharonError, Client, ClientError, ServerError, Source, aio

LIMITS = """
resources:
  - { name: api/x, kind: rate, tiers: [ { limit: 1000, window: 1s } ] }
  - { name: other/x, kind: rate, tiers: [ { limit: 1000, window: 1s } ] }
"""

TOKENS = b"""
- { name: app, secret: s3cret-app, namespaces: [api] }
"""

TLS_ARGS = ["--tls-cert", "{dir}/tls.pem", "--tls-key", "{dir}/tls.key"]


@dataclass
class Fleet:
    """The servers of the mistakes, started once for the module."""

    pki: Pki
    other: Pki
    client_cert: Leaf
    plain: Charon
    tls: Charon
    mtls: Charon
    tokens: Charon
    tokens_tls: Charon
    tokens_mtls: Charon
    expiring: Charon
    expires_at: float
    down_target: str = ""

    def close(self) -> None:
        for c in (
            self.plain,
            self.tls,
            self.mtls,
            self.tokens,
            self.tokens_tls,
            self.tokens_mtls,
            self.expiring,
        ):
            c.close()


def tls_files(leaf: Leaf) -> dict[str, bytes]:
    return {"tls.pem": leaf.cert, "tls.key": leaf.key}


@pytest.fixture(scope="module")
def fleet() -> Iterator[Fleet]:
    pki, other = Pki(), Pki("another CA")
    client_cert = pki.client()
    # A certificate that expires a few seconds from now: the server takes
    # it (it is valid at start) and serves it on after it lapses.
    expiring_leaf = pki.server("charon expiring", valid_for=4.0)
    expires_at = time.time() + 4.0
    started: list[Charon] = []
    try:
        expiring = Charon(LIMITS, TLS_ARGS, tls_files(expiring_leaf), pki.probe())
        started.append(expiring)
        plain = Charon(LIMITS, [])
        started.append(plain)
        tls = Charon(LIMITS, TLS_ARGS, tls_files(pki.server()), pki.probe())
        started.append(tls)
        mtls = Charon(
            LIMITS,
            [*TLS_ARGS, "--tls-client-ca", "{dir}/ca.pem"],
            {**tls_files(pki.server()), "ca.pem": pki.ca},
            pki.probe(client_cert),
        )
        started.append(mtls)
        tokens = Charon(LIMITS, ["--api-tokens", "{dir}/tokens.yaml"], {"tokens.yaml": TOKENS})
        started.append(tokens)
        token_args = ["--api-tokens", "{dir}/tokens.yaml"]
        tokens_tls = Charon(
            LIMITS,
            [*token_args, *TLS_ARGS],
            {"tokens.yaml": TOKENS, **tls_files(pki.server())},
            pki.probe(),
        )
        started.append(tokens_tls)
        tokens_mtls = Charon(
            LIMITS,
            [*token_args, *TLS_ARGS, "--tls-client-ca", "{dir}/ca.pem"],
            {"tokens.yaml": TOKENS, **tls_files(pki.server()), "ca.pem": pki.ca},
            pki.probe(client_cert),
        )
        started.append(tokens_mtls)
    except BaseException:
        for c in started:
            c.close()
        raise
    f = Fleet(
        pki,
        other,
        client_cert,
        plain,
        tls,
        mtls,
        tokens,
        tokens_tls,
        tokens_mtls,
        expiring,
        expires_at,
    )
    yield f
    f.close()


@dataclass
class Outcome:
    """What one client call came to."""

    error: Optional[CharonError]
    source: Optional[Source]
    degraded_grants: int

    @property
    def klass(self) -> str:
        return self.error.error_class if self.error is not None else "-"

    @property
    def kind(self) -> str:
        return self.error.kind if self.error is not None else "-"

    def message(self) -> str:
        return str(self.error) if self.error is not None else f"granted ({self.source})"


def call_sync(target: str, fail_open: bool, resource: str, **kw: Any) -> Outcome:
    client = Client(target, fail_open=fail_open, request_timeout=3.0, **kw)
    try:
        g = client.request_rate(resource, "d")
        return Outcome(None, g.source, client.stats().degraded_grants)
    except CharonError as e:
        return Outcome(e, None, client.stats().degraded_grants)
    finally:
        client.close()


def call_aio(target: str, fail_open: bool, resource: str, **kw: Any) -> Outcome:
    async def go() -> Outcome:
        client = aio.Client(target, fail_open=fail_open, request_timeout=3.0, **kw)
        try:
            g = await client.request_rate(resource, "d")
            return Outcome(None, g.source, client.stats().degraded_grants)
        except CharonError as e:
            return Outcome(e, None, client.stats().degraded_grants)
        finally:
            await client.close()

    return asyncio.run(go())


def mistakes(f: Fleet) -> list[tuple[str, str, str, dict[str, Any], str, str]]:
    """(mistake, target, resource, client options, class, kind)."""
    pki, other = f.pki, f.other
    cert = {"cert": f.client_cert.cert, "key": f.client_cert.key}
    return [
        ("wrong port", f"127.0.0.1:{free_port()}", "api/x", {}, "server", "unreachable"),
        ("HTTP port", f"127.0.0.1:{f.plain.http_port}", "api/x", {}, "client", "wrong_protocol"),
        ("no token", f.tokens.target, "api/x", {}, "client", "unauthenticated"),
        ("wrong token", f.tokens.target, "api/x", {"token": "nope"}, "client", "unauthenticated"),
        (
            "token not allowed the namespace",
            f.tokens.target,
            "other/x",
            {"token": "s3cret-app"},
            "client",
            "permission_denied",
        ),
        ("missing client certificate", f.mtls.target, "api/x", {"ca": pki.ca}, "client", "tls"),
        (
            "client certificate of another CA",
            f.mtls.target,
            "api/x",
            {"ca": pki.ca, **_leaf_kw(other.client())},
            "client",
            "tls",
        ),
        ("wrong CA", f.tls.target, "api/x", {"ca": other.ca}, "client", "tls"),
        ("expired certificate", f.expiring.target, "api/x", {"ca": pki.ca}, "client", "tls"),
        ("plain text to TLS", f.tls.target, "api/x", {}, "client", "wrong_protocol"),
        ("TLS to plain text", f.plain.target, "api/x", {"ca": pki.ca}, "client", "wrong_protocol"),
        ("unknown resource", f.plain.target, "no/such", {}, "client", "not_found"),
        ("server down", f.down_target, "api/x", {}, "server", "unreachable"),
        # And the right settings, served.
        ("(token given)", f.tokens.target, "api/x", {"token": "s3cret-app"}, "-", "-"),
        ("(TLS with its CA)", f.tls.target, "api/x", {"ca": pki.ca}, "-", "-"),
        ("(mutual TLS)", f.mtls.target, "api/x", {"ca": pki.ca, **cert}, "-", "-"),
    ]


def _leaf_kw(leaf: Leaf) -> dict[str, Any]:
    return {"cert": leaf.cert, "key": leaf.key}


def test_every_mistake_has_its_class_and_only_server_errors_degrade(fleet: Fleet) -> None:
    # A server that was there and is gone: its port refuses.
    down = Charon(LIMITS, [])
    fleet.down_target = down.target
    down.proc.send_signal(signal.SIGKILL)  # type: ignore[union-attr]
    down.proc.wait()  # type: ignore[union-attr]
    down.close()
    # The expiring certificate has lapsed (the server serves it on).
    while time.time() < fleet.expires_at + 0.5:
        time.sleep(0.1)
    rows = []
    for mistake, target, resource, kw, klass, kind in mistakes(fleet):
        for flavour, call in (("sync", call_sync), ("asyncio", call_aio)):
            lenient = call(target, True, resource, **kw)
            strict = call(target, False, resource, **kw)
            what = f"{mistake} ({flavour})"
            if klass == "-":
                assert lenient.error is None and lenient.source is Source.SERVER, (what, lenient)
                assert strict.error is None, (what, strict.message())
                continue
            # The strict client says what is wrong, with the class and kind.
            assert strict.error is not None, what
            assert (strict.klass, strict.kind) == (klass, kind), (what, strict.message())
            assert strict.error.address, what
            if klass == "client":
                # Never degraded: raised at once, whatever fail_open says.
                assert isinstance(lenient.error, ClientError), (what, lenient.message())
                assert lenient.degraded_grants == 0, what
            else:
                assert isinstance(strict.error, ServerError), what
                assert lenient.error is None and lenient.source is Source.DEGRADED, what
                assert lenient.degraded_grants == 1, what
            if flavour == "sync":
                degraded = "yes" if klass == "server" else "no"
                rows.append((mistake, strict.message(), klass, degraded))
    out = os.environ.get("CHARON_MISTAKES_TABLE")
    if out:
        with open(out, "w") as f:
            f.write("| mistake | Python client | class | degraded (fail_open) |\n")
            f.write("| --- | --- | --- | --- |\n")
            for r in rows:
                f.write("| " + " | ".join(x.replace("|", "\\|") for x in r) + " |\n")


@pytest.mark.parametrize("transport", ["plain", "tls", "mtls"])
def test_a_token_protected_server_refuses_without_the_token_and_serves_with_it(
    fleet: Fleet, transport: str
) -> None:
    server = {"plain": fleet.tokens, "tls": fleet.tokens_tls, "mtls": fleet.tokens_mtls}
    target = server[transport].target
    tls: dict[str, Any] = {}
    if transport != "plain":
        tls["ca"] = fleet.pki.ca
    if transport == "mtls":
        tls.update(cert=fleet.client_cert.cert, key=fleet.client_cert.key)
    for fail_open in (True, False):
        with Client(target, fail_open=fail_open, **tls) as c:
            with pytest.raises(ClientError) as refused:
                c.request_rate("api/x", "d")
            assert refused.value.kind == "unauthenticated", refused.value
            with pytest.raises(ClientError):
                c.hold_copy("api/x", "d")
            assert c.stats().degraded_grants == 0

    async def refused_in_asyncio() -> None:
        async with aio.Client(target, **tls) as c:
            with pytest.raises(ClientError):
                await c.request_rate("api/x", "d")
            assert c.stats().degraded_grants == 0
            assert c.stats().requests == 1

    asyncio.run(refused_in_asyncio())
    with Client(target, token="s3cret-app", **tls) as c:
        assert c.request_rate("api/x", "d").source is Source.SERVER
        assert c.charge("api/x", "d", 1).granted == 1
    with Client(target, token="s3cret-app", rate_transport="unary", **tls) as c:
        assert c.request_rate("api/x", "d").source is Source.SERVER

    async def served_in_asyncio() -> None:
        async with aio.Client(target, token="s3cret-app", **tls) as c:
            assert (await c.request_rate("api/x", "d")).source is Source.SERVER

    asyncio.run(served_in_asyncio())


def test_tls_and_mutual_tls_serve_with_their_settings(fleet: Fleet, tmp_path: Any) -> None:
    pki = fleet.pki
    # Paths work as well as PEM bytes, and https:// turns TLS on.
    ca = tmp_path / "ca.pem"
    ca.write_bytes(pki.ca)
    with Client(f"https://{fleet.tls.target}", ca=str(ca)) as c:
        assert c.request_rate("api/x", "d").source is Source.SERVER
    # The name the certificate must carry, when the target is not it.
    with Client(fleet.tls.target, ca=pki.ca, server_name="localhost") as c:
        assert c.request_rate("api/x", "d").source is Source.SERVER
    with Client(fleet.tls.target, ca=pki.ca, server_name="elsewhere.example") as c:
        with pytest.raises(ClientError) as wrong_name:
            c.request_rate("api/x", "d")
        assert wrong_name.value.kind == "tls", wrong_name.value
    cert = fleet.client_cert
    with Client(fleet.mtls.target, ca=pki.ca, cert=cert.cert, key=cert.key) as c:
        assert c.request_rate("api/x", "d").source is Source.SERVER

    async def aio_mtls() -> None:
        async with aio.Client(fleet.mtls.target, ca=pki.ca, cert=cert.cert, key=cert.key) as c:
            assert (await c.request_rate("api/x", "d")).source is Source.SERVER

    asyncio.run(aio_mtls())
    # Settings that cannot be used: refused when the client is made.
    for bad in (
        {"cert": cert.cert},
        {"ca": b"not pem"},
        {"ca": str(tmp_path / "missing.pem")},
        {"token": "two\nlines"},
    ):
        with pytest.raises(ClientError) as refused:
            Client(fleet.tls.target, **bad)
        assert refused.value.kind == "settings", (bad, refused.value)
