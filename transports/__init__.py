"""inferwire.transports: how bytes move. One client interface and one server per transport,
all serving the same simulated inference service.

    import inferwire.transports as it
    async with it.connect("http2", "127.0.0.1:8000", codec="protobuf") as client:
        async for chunk in client.generate(it.GenerateRequest(workload="stream-256")):
            ...

Transports: ``tcp`` (the floor), ``http1``, ``http2``, ``grpc``. Errors derive from
:class:`TransportError`. Each transport's module is imported when first asked for, so a base
install has ``tcp``; the others need ``inferwire[transports]`` (``grpc`` alone:
``inferwire[grpc]``), and without it :class:`MissingExtraError` says so. Beside them,
``EXTRA_TRANSPORTS``: ``grpclib`` (the same gRPC service on grpclib, ``inferwire[grpclib]``).
"""

from __future__ import annotations

import importlib
from typing import Any, Final

import inferwire.codecs as ic
from inferwire._runtime.arguments import split_address
from inferwire._runtime.extras import MissingExtraError, needs_extras

from .base import Client, Server
from .common import DEFAULT_LIMITS, DEFAULT_MAX_MESSAGE_BYTES, Limits, resolve_codec
from .errors import (
    BadRequestError,
    CancelledByPeerError,
    ConnectError,
    MessageTooLargeError,
    ProtocolError,
    RemoteError,
    ServiceUnavailableError,
    StreamTruncatedError,
    TransportError,
    TransportTimeoutError,
)
from .service import GenerateRequest, SimulatedService, Source, TokenStream
from .timing import StreamTiming
from .tls import ClientTls, ServerTls, make_test_certificates

__all__ = [
    "DEFAULT_MAX_MESSAGE_BYTES",
    "EXTRA_TRANSPORTS",
    "TRANSPORTS",
    "BadRequestError",
    "CancelledByPeerError",
    "Client",
    "ClientTls",
    "ConnectError",
    "GenerateRequest",
    "Limits",
    "MessageTooLargeError",
    "MissingExtraError",
    "ProtocolError",
    "RemoteError",
    "Server",
    "ServerTls",
    "ServiceUnavailableError",
    "SimulatedService",
    "Source",
    "StreamTiming",
    "StreamTruncatedError",
    "TokenStream",
    "TransportError",
    "TransportTimeoutError",
    "client_class",
    "connect",
    "make_test_certificates",
    "server_class",
    "split_address",
]

_CLASSES: Final = {
    "tcp": ("tcp", "TcpServer", "TcpClient"),
    "http1": ("http1", "Http1Server", "Http1Client"),
    "http2": ("http2", "Http2Server", "Http2Client"),
    "grpc": ("grpc_transport", "GrpcServer", "GrpcClient"),
}
TRANSPORTS: Final = tuple(_CLASSES)
_EXTRA_CLASSES: Final = {
    "grpclib": ("grpclib_transport", "GrpclibServer", "GrpclibClient"),
    "websocket": ("websocket", "WebSocketServer", "WebSocketClient"),
}
EXTRA_TRANSPORTS: Final = tuple(_EXTRA_CLASSES)
"""Transports that :func:`connect`, :func:`server_class` and ``inferwire serve`` know but
``TRANSPORTS`` leaves out: the suites and tests that run over every one of ``TRANSPORTS`` do
not run over these (each has its own tests and benchmark rows)."""


def _lookup(transport: str, index: int) -> Any:
    try:
        module, *names = _CLASSES.get(transport) or _EXTRA_CLASSES[transport]
    except KeyError:
        known = ", ".join((*TRANSPORTS, *EXTRA_TRANSPORTS))
        raise ValueError(f"unknown transport {transport!r}; choose from {known}") from None
    with needs_extras(f"the {transport} transport"):
        imported = importlib.import_module(f"{__name__}.{module}")
    return getattr(imported, names[index])


def server_class(transport: str) -> type[Server]:
    return _lookup(transport, 0)  # type: ignore[no-any-return]


def client_class(transport: str) -> type[Client]:
    return _lookup(transport, 1)  # type: ignore[no-any-return]


def connect(
    transport: str,
    address: str | tuple[str, int],
    *,
    codec: str | ic.Codec = "orjson",
    tls: ClientTls | None = None,
    limits: Limits = DEFAULT_LIMITS,
    **options: Any,
) -> Client:
    """A client for the server at ``address`` (``host:port`` or a tuple). Connections open on
    first use; ``options`` go to the transport's client (e.g. ``new_connection_per_request``
    for http1, ``deadline_s`` for grpc). A codec named here speaks inferwire's stream (a JSON
    codec with ``extensions=True``), as ``inferwire serve`` does; a codec object as it is."""
    host, port = split_address(address) if isinstance(address, str) else address
    resolved = resolve_codec(codec)
    cls = client_class(transport)
    return cls(host, port, resolved, tls=tls, limits=limits, **options)
