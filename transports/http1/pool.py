"""The project's one HTTP/1.1 client: keep-alive connections to one origin, responses parsed by
``httptools`` (the parser uvicorn uses), bodies handed over piece by piece as they arrive.
inferwire's own client (:class:`~inferwire.transports.http1.client.Http1Client`) and the load
generator's API targets (:mod:`inferwire.load.endpoints`) both send through it.

Written on httptools rather than taken whole from a client library: a load generator's ceiling
is set by its own CPU per request and per chunk, and a general client's per-request machinery
(aiohttp's or httpx's) costs several times what is spent on a request here; the parser, the
hard part, is the library's. With ``max_connections`` the pool is bounded: a request that finds
every connection busy waits for one, so a generator that falls behind queues its requests (and
their latency, counted from the intended send time, shows it) instead of opening a connection
per late request.

A body in a content coding (``Content-Encoding``: gzip, br, zstd, deflate) is decoded as it
arrives, bounded (:class:`~inferwire.transports.compression.Decoder`): no piece and no body read
whole decodes to more than ``max_decoded_bytes``, and no more than 1000 times its input past a
megabyte; a bomb is :class:`~inferwire.transports.compression.DecompressionLimitError`, bytes
that do not decode :class:`~inferwire.transports.compression.ContentEncodingError`. A pool
asks for codings only when told to (an ``accept-encoding`` among its ``headers``), but decodes
whatever a server sends.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Final
from urllib.parse import urlsplit

import httptools

from ..common import (
    DEFAULT_MAX_MESSAGE_BYTES,
    ErrorMap,
    aclose_quietly,
    connect_tcp,
    error_detail,
    map_exceptions,
)
from ..compression import ContentEncodingError, Decoder, content_coding
from ..errors import MessageTooLargeError, ProtocolError, RemoteError, StreamTruncatedError
from ..timing import StreamTiming, now_ns
from .server import READ_BYTES

_ERRORS: Final[ErrorMap] = {httptools.HttpParserError: ProtocolError}
"""httptools' own exceptions, as the client meets them; socket errors are mapped in common."""
_ONE_WRITE_BYTES: Final = 64 << 10
"""A body up to this size goes out in one write with its head (one send, not two); a larger one
is written after it rather than copied onto it."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Origin:
    """Where requests go: scheme, host, port, and the path prefix of the URL given."""

    scheme: str
    host: str
    port: int
    base_path: str = ""

    @classmethod
    def parse(cls, url: str) -> Origin:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https"):
            raise ValueError(f"{url!r}: the URL must start with http:// or https://")
        if not parts.hostname:
            raise ValueError(f"{url!r} has no host")
        try:
            port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError:
            raise ValueError(f"{url!r} has a bad port") from None
        return cls(
            scheme=parts.scheme,
            host=parts.hostname,
            port=port,
            base_path=parts.path.rstrip("/"),
        )

    @property
    def authority(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        default = 443 if self.scheme == "https" else 80
        return host if self.port == default else f"{host}:{self.port}"


class _ResponseParser:
    """httptools callbacks for one connection's responses, in turn."""

    __slots__ = ("body", "complete", "headers", "headers_done", "parser", "trailers")

    def __init__(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.headers: dict[str, str] = {}
        self.trailers: dict[str, str] = {}
        self.body: list[bytes] = []
        self.headers_done = False
        self.complete = False

    def start(self) -> None:
        self.headers = {}
        self.trailers = {}
        self.body = []
        self.headers_done = False
        self.complete = False

    def on_header(self, name: bytes, value: bytes) -> None:
        target = self.trailers if self.headers_done else self.headers
        target[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        self.headers_done = True

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        self.complete = True


class PooledConnection:
    """One keep-alive connection and the parser of its responses."""

    __slots__ = ("reader", "response", "reusable", "writer")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.response = _ResponseParser()
        self.reusable = True

    async def receive(self, timeout_s: float) -> bool:
        """Read and parse once; False at the end of the connection (a reset included)."""
        with map_exceptions("http1", _ERRORS):
            try:
                async with asyncio.timeout(timeout_s):
                    data = await self.reader.read(READ_BYTES)
            except OSError as exc:
                if isinstance(exc, TimeoutError):
                    raise
                return False
            if not data:
                return False
            try:
                self.response.parser.feed_data(data)
            except httptools.HttpParserError:
                self.reusable = False
                raise
        return True


class PooledResponse:
    """A response whose headers have arrived. Its body comes piece by piece: :meth:`body` (or
    :meth:`take` and :meth:`more`, for a caller that drives the reads itself). The connection
    goes back to the pool when the body has been read whole (or :meth:`release` is called)."""

    __slots__ = (
        "_coding_error",
        "_conn",
        "_decoder",
        "_pool",
        "complete",
        "headers",
        "status",
        "wire_bytes",
    )

    def __init__(self, pool: HttpPool, conn: PooledConnection) -> None:
        self._pool = pool
        self._conn = conn
        self.status: int = conn.response.parser.get_status_code()
        self.headers = conn.response.headers
        self.complete = False
        """Whether the body ended as HTTP frames it (not by a closed connection)."""
        self.wire_bytes = 0
        """Body bytes as they came (compressed, when the body is), the chunked framing aside."""
        self._decoder: Decoder | None = None
        self._coding_error: Exception | None = None
        coded = self.headers.get("content-encoding")
        if coded is not None:
            # a coding not decoded (or whose library is missing) is raised where the body is
            # read: the connection is the caller's to release by then
            try:
                coding = content_coding(coded)
                if coding is not None:
                    self._decoder = Decoder(coding, max_piece_bytes=pool.max_decoded_bytes)
            except (ContentEncodingError, ModuleNotFoundError) as exc:
                self._coding_error = exc

    @property
    def trailers(self) -> dict[str, str]:
        return self._conn.response.trailers

    def take(self) -> bytes:
        """The body bytes parsed since the last call (b"" if none); sets :attr:`complete` once
        the response has ended."""
        parsed = self._conn.response
        pieces = parsed.body
        if parsed.complete:
            self.complete = True
        if pieces:
            parsed.body = []
            data = pieces[0] if len(pieces) == 1 else b"".join(pieces)
            self.wire_bytes += len(data)
            self._pool.wire_bytes += len(data)
        else:
            data = b""
        if self._decoder is None and self._coding_error is None:
            return data
        return self._decoded(data)

    def _decoded(self, data: bytes) -> bytes:
        """``data`` out of the body's content coding; at the body's end, the coding must end."""
        if self._coding_error is not None:
            raise self._coding_error
        decoder = self._decoder
        assert decoder is not None
        out = decoder.feed(data) if data else b""
        if self.complete:
            decoder.close()
        return out

    async def more(self) -> bool:
        """Read from the connection once; False if it closed."""
        return await self._conn.receive(self._pool.timeout_s)

    async def release(self, *, reusable: bool) -> None:
        """Hand the connection back (kept for the next request only if ``reusable`` and the
        response ended whole)."""
        conn, self._conn.reusable = self._conn, self._conn.reusable and reusable
        await self._pool.release(conn)

    async def body(self) -> AsyncIterator[bytes]:
        ok = False
        try:
            while True:
                piece = self.take()
                if piece:
                    yield piece
                if self.complete:
                    break
                if not await self.more():
                    raise StreamTruncatedError("http1: the connection closed mid-body")
            ok = True
        finally:
            await self.release(reusable=ok)

    async def read(self, limit: int) -> bytes:
        """The whole body (decoded), refused past ``limit`` bytes."""
        if self._decoder is not None:  # refused as the decoder passes it, not after
            self._decoder.max_piece_bytes = min(self._decoder.max_piece_bytes, limit)
            self._decoder.max_total_bytes = limit
        parts: list[bytes] = []
        size = 0
        async for part in self.body():
            size += len(part)
            if size > limit:
                raise MessageTooLargeError(f"a response body over {limit} bytes")
            parts.append(part)
        return b"".join(parts)

    async def fail(self) -> RemoteError:
        """The error that a non-2xx answer is, its body read (bounded) for the message."""
        try:
            body = await self.read(1 << 20)
        except (ProtocolError, MessageTooLargeError, StreamTruncatedError):
            body = b""
        return RemoteError(self.status, error_detail(body) if body else "(no body)")


class HttpPool:
    """Keep-alive connections to one origin: at most ``max_connections`` at once (unbounded
    when None), at most ``max_idle`` kept between requests; with ``new_connection_per_request``
    each request gets a connection of its own, closed after it. ``headers`` go with every
    request (an ``accept-encoding`` among them asks for compressed answers)."""

    def __init__(
        self,
        origin: Origin,
        *,
        headers: Sequence[tuple[str, str]] = (),
        ssl_context: ssl.SSLContext | None = None,
        max_connections: int | None = None,
        max_idle: int = 1024,
        new_connection_per_request: bool = False,
        timeout_s: float = 60.0,
        max_decoded_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    ) -> None:
        if origin.scheme == "https" and ssl_context is None:
            ssl_context = ssl.create_default_context()
        self.origin = origin
        self.ssl_context = ssl_context
        self.timeout_s = timeout_s
        self.max_idle = max_idle
        self.new_connection_per_request = new_connection_per_request
        self._slots = asyncio.Semaphore(max_connections) if max_connections else None
        self._idle: list[PooledConnection] = []
        self._busy: set[PooledConnection] = set()
        self.connections_opened = 0
        self.max_decoded_bytes = max_decoded_bytes
        """The most one piece of a body (or a body read whole) may decode to."""
        self.wire_bytes = 0
        """Body bytes received, as they came (compressed when they were), for every response."""
        close = [("connection", "close")] if new_connection_per_request else []
        fixed = [("host", origin.authority), *headers]
        self._head = "".join(f"{name}: {value}\r\n" for name, value in fixed)
        self._end = "".join(f"{name}: {value}\r\n" for name, value in close)

    async def _acquire(self, timing: StreamTiming | None = None) -> PooledConnection:
        if self._slots is not None:
            await self._slots.acquire()
        try:
            while self._idle:
                conn = self._idle.pop()
                if not conn.writer.is_closing() and not conn.reader.at_eof():
                    self._busy.add(conn)
                    return conn
                await aclose_quietly(conn.writer)
            opening_ns = now_ns()
            reader, writer = await connect_tcp(
                self.origin.host,
                self.origin.port,
                ssl_context=self.ssl_context,
                timeout_s=self.timeout_s,
                limit=READ_BYTES,
            )
        except BaseException:
            if self._slots is not None:
                self._slots.release()
            raise
        self.connections_opened += 1
        if timing is not None:
            timing.connect_ns = now_ns() - opening_ns
        conn = PooledConnection(reader, writer)
        self._busy.add(conn)
        return conn

    async def release(self, conn: PooledConnection) -> None:
        self._busy.discard(conn)
        if (
            conn.reusable
            and conn.response.complete
            and not self.new_connection_per_request
            and len(self._idle) < self.max_idle
            and conn.response.headers.get("connection", "").lower() != "close"
        ):
            self._idle.append(conn)
        else:
            await aclose_quietly(conn.writer)
        if self._slots is not None:
            self._slots.release()

    async def request(
        self,
        method: str,
        path: str,
        body: bytes = b"",
        *,
        content_type: str = "application/json",
        accept: str | None = None,
        headers: str = "",
        timing: StreamTiming | None = None,
    ) -> PooledResponse:
        """Send a request and read up to the end of the response's headers. ``headers`` are
        extra header lines (``"name: value\\r\\n"`` each). ``timing``, when given, is stamped:
        connection in hand (``acquired_ns``, and ``connect_ns`` if one was opened for it),
        before the write call (``request_write_ns``), request written (``request_sent_ns``),
        head arrived (``head_ns``)."""
        conn = await self._acquire(timing)
        if timing is not None:
            timing.acquired_ns = now_ns()
        try:
            accepts = f"accept: {accept}\r\n" if accept is not None else ""
            head = (
                f"{method} {self.origin.base_path}{path} HTTP/1.1\r\n{self._head}"
                f"content-type: {content_type}\r\n{accepts}content-length: {len(body)}\r\n"
                f"{self._end}{headers}\r\n"
            ).encode("latin-1")
            if timing is not None:
                timing.request_write_ns = now_ns()
            if len(body) <= _ONE_WRITE_BYTES:
                conn.writer.write(head + body)
            else:
                conn.writer.write(head)
                conn.writer.write(body)
            with map_exceptions("http1", _ERRORS):
                await conn.writer.drain()
            if timing is not None:
                timing.request_sent_ns = now_ns()
            conn.response.start()
            while not conn.response.headers_done:
                if not await conn.receive(self.timeout_s):
                    raise StreamTruncatedError("http1: the connection closed before a response")
            if timing is not None:
                timing.head_ns = now_ns()
        except BaseException:  # an error or a cancellation: the connection's state is unknown
            conn.reusable = False
            await self.release(conn)
            raise
        return PooledResponse(self, conn)

    async def close(self) -> None:
        """Close every connection, idle or busy: a body still being read ends as truncated."""
        idle, self._idle = self._idle, []
        busy, self._busy = self._busy, set()
        for conn in [*idle, *busy]:
            conn.reusable = False
            await aclose_quietly(conn.writer)
