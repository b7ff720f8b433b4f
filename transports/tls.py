"""TLS material for servers and clients, as PEM bytes (what gRPC takes) with ``ssl`` contexts
made from them (what asyncio takes).

:func:`make_test_certificates` makes a throwaway CA and a server certificate for loopback at run
time with ``trustme``, so no key is ever committed.
"""

from __future__ import annotations

import os
import ssl
import tempfile
from dataclasses import dataclass
from pathlib import Path

from inferwire._runtime.extras import needs_extras

LOOPBACK_NAMES = ("127.0.0.1", "::1", "localhost")


@dataclass(frozen=True, slots=True)
class ServerTls:
    cert_chain_pem: bytes
    key_pem: bytes

    def ssl_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        # load_cert_chain reads files only: write them where only we can read, then remove
        with tempfile.TemporaryDirectory(prefix="inferwire-tls-") as folder:
            cert = Path(folder, "cert.pem")
            key = Path(folder, "key.pem")
            cert.write_bytes(self.cert_chain_pem)
            key.touch(mode=0o600)
            key.write_bytes(self.key_pem)
            context.load_cert_chain(cert, key)
        return context

    @classmethod
    def from_files(
        cls, certfile: str | os.PathLike[str], keyfile: str | os.PathLike[str]
    ) -> ServerTls:
        return cls(Path(certfile).read_bytes(), Path(keyfile).read_bytes())


@dataclass(frozen=True, slots=True)
class ClientTls:
    ca_pem: bytes

    def ssl_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cadata=self.ca_pem.decode("ascii"))
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        return context

    @classmethod
    def from_file(cls, cafile: str | os.PathLike[str]) -> ClientTls:
        return cls(Path(cafile).read_bytes())


def make_test_certificates(names: tuple[str, ...] = LOOPBACK_NAMES) -> tuple[ServerTls, ClientTls]:
    """A fresh CA and a server certificate for ``names``. Needs ``trustme`` (the
    ``transports`` extra; without it, :class:`MissingExtraError` says so)."""
    with needs_extras("making TLS test certificates"):
        import trustme
    ca = trustme.CA()
    cert = ca.issue_cert(*names)
    chain = b"".join(blob.bytes() for blob in cert.cert_chain_pems)
    return ServerTls(chain, cert.private_key_pem.bytes()), ClientTls(ca.cert_pem.bytes())
