"""The transport exceptions: one root, :class:`TransportError`, for everything that moves bytes.

Foreign exceptions (``OSError``, ``ssl.SSLError``, ``grpc.aio.AioRpcError``, h2's and
httptools' errors) are translated once, where a transport calls the library, with
``raise X from exc``. A codec error met by a transport (a peer sent bytes that do not decode)
is a :class:`ProtocolError` whose ``__cause__`` is the :class:`~inferwire.codecs.CodecError`.
"""

from __future__ import annotations

from typing import Any


class TransportError(Exception):
    """Root of every transport error."""


class ConnectError(TransportError):
    """The connection could not be made (refused, unreachable, TLS handshake failed)."""


class TransportTimeoutError(TransportError, TimeoutError):
    """A deadline passed: connect, a read, or the whole call."""


class ProtocolError(TransportError):
    """The peer broke the protocol: bytes that do not parse, a frame out of place."""


class PeerLimitError(ProtocolError):
    """An HTTP/2 peer passed one of the server's limits; ``error_code`` is the GOAWAY code to
    close with (RFC 9113, section 7)."""

    error_code: int = 0xB  # ENHANCE_YOUR_CALM


class PeerFrameTooLargeError(PeerLimitError):
    """A frame header declares more than SETTINGS_MAX_FRAME_SIZE (RFC 9113, section 4.2)."""

    error_code = 0x6  # FRAME_SIZE_ERROR


class HeaderBlockTooLargeError(PeerLimitError):
    """A header block (HEADERS and CONTINUATION frames) grew past the limit compressed."""


class IdleFloodError(PeerLimitError):
    """Too many frames in a row that moved no request forward (PING, SETTINGS, empty DATA)."""


class StreamTruncatedError(ProtocolError):
    """A stream stopped before its end marker: the connection closed or reset mid-stream.

    Never reported as a complete stream: ``chunks_received`` says how far it got."""

    def __init__(self, message: str, *, chunks_received: int = 0) -> None:
        super().__init__(message)
        self.chunks_received = chunks_received


class StreamNotProcessedError(StreamTruncatedError):
    """The server's GOAWAY says it never processed this stream: safe to send again
    (RFC 9113, section 6.8)."""


class PeerNotReadingError(TransportTimeoutError):
    """The socket stayed backed up for the whole timeout: the connection, not one stream, is
    stuck."""


class MessageTooLargeError(TransportError):
    """A message over the configured limit, refused before it was read."""


class RemoteError(TransportError):
    """The server answered with an error: ``status`` is its HTTP status (or the gRPC code's
    name), ``detail`` the server's message."""

    def __init__(self, status: int | str, detail: str, *, body: Any = None) -> None:
        super().__init__(f"server answered {status}: {detail}")
        self.status = status
        self.detail = detail
        self.body = body


class CancelledByPeerError(TransportError):
    """The server cancelled the call (gRPC ``CANCELLED``, HTTP/2 ``RST_STREAM``)."""


class ServiceUnavailableError(TransportError):
    """The service could not finish a stream for a reason outside this server: the engine
    behind a frontend went away, restarted or was overloaded (``__cause__`` says which). A
    server fails the stream as for any error, so its client sees it fail, and logs one line,
    not a traceback: nothing in this server went wrong."""


class BadRequestError(ValueError):
    """A request the service cannot answer: transports send it back as 400 /
    ``INVALID_ARGUMENT`` and keep serving. Not a :class:`TransportError`: nothing failed to
    move, the request itself is wrong."""


class NotFoundError(BadRequestError):
    """A request that names what the server does not have (a model version): HTTP 404, gRPC
    ``NOT_FOUND``."""
