"""Certificates for TLS and mutual-TLS servers, made at run time (the
`cryptography` package): a CA, server certificates for 127.0.0.1 and
localhost with a chosen validity, client certificates, as PEM bytes."""

from __future__ import annotations

import datetime
import ipaddress
import os
import ssl
import tempfile
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc)


@dataclass(frozen=True)
class Leaf:
    """A certificate and its key, PEM."""

    cert: bytes
    key: bytes


class Pki:
    """A CA of its own; two of them do not trust each other."""

    def __init__(self, name: str = "charon python test CA") -> None:
        self._key = ec.generate_private_key(ec.SECP256R1())
        now = _now()
        self._cert = (
            x509.CertificateBuilder()
            .subject_name(_name(name))
            .issuer_name(_name(name))
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=365))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .sign(self._key, hashes.SHA256())
        )
        self.ca = self._cert.public_bytes(serialization.Encoding.PEM)

    def _leaf(
        self,
        cn: str,
        server: bool,
        not_before: datetime.datetime,
        not_after: datetime.datetime,
    ) -> Leaf:
        key = ec.generate_private_key(ec.SECP256R1())
        builder = (
            x509.CertificateBuilder()
            .subject_name(_name(cn))
            .issuer_name(self._cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(not_before)
            .not_valid_after(not_after)
        )
        if server:
            builder = builder.add_extension(
                x509.SubjectAlternativeName(
                    [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
                ),
                critical=False,
            ).add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), False)
        else:
            builder = builder.add_extension(
                x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), False
            )
        cert = builder.sign(self._key, hashes.SHA256())
        return Leaf(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))

    def server(self, cn: str = "charon python test server", valid_for: float = 86400.0) -> Leaf:
        """A server certificate for 127.0.0.1 and localhost, valid from an
        hour ago for ``valid_for`` more seconds."""
        now = _now()
        return self._leaf(
            cn,
            True,
            now - datetime.timedelta(hours=1),
            now + datetime.timedelta(seconds=valid_for),
        )

    def client(self, cn: str = "charon python test client") -> Leaf:
        now = _now()
        return self._leaf(
            cn, False, now - datetime.timedelta(hours=1), now + datetime.timedelta(days=1)
        )

    def probe(self, client: Leaf | None = None) -> ssl.SSLContext:
        """An HTTPS client trusting this CA (for /readyz), presenting
        ``client`` (a server that requires a client certificate)."""
        ctx = ssl.create_default_context(cadata=self.ca.decode())
        if client is not None:
            with tempfile.TemporaryDirectory(prefix="charon-py-pki-") as d:
                cert, key = os.path.join(d, "c.pem"), os.path.join(d, "c.key")
                for path, data in ((cert, client.cert), (key, client.key)):
                    with open(path, "wb") as f:
                        f.write(data)
                ctx.load_cert_chain(cert, key)
        return ctx
