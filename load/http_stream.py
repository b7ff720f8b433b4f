"""A small HTTP/1.1 client for the load generator's API targets: a bounded keep-alive pool of
asyncio connections, responses parsed by ``httptools`` (the parser uvicorn uses), bodies
handed over piece by piece as they arrive.

Written on httptools rather than taken whole from a client library: the generator's ceiling
is set by its own CPU per request and per chunk, and a general client's per-request machinery
(aiohttp's or httpx's) costs several times what the load generator spends on a request here;
the parser, the hard part, is the library's. The pool is bounded (``max_connections``): a
request that finds every connection busy waits for one, so a generator that falls behind
queues its requests (and their latency, counted from the intended send time, shows it) instead
of opening a connection per late request.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Final
from urllib.parse import urlsplit

import httptools

from inferwire.transports import (
    MessageTooLargeError,
    ProtocolError,
    RemoteError,
    StreamTruncatedError,
)
from inferwire.transports.common import (
    ErrorMap,
    aclose_quietly,
    connect_tcp,
    error_detail,
    map_exceptions,
)

READ_BYTES: Final = 1 << 16
MAX_HEADER_BYTES: Final = 64 << 10
_ERRORS: Final[ErrorMap] = {httptools.HttpParserError: ProtocolError}


@dataclass(frozen=True, slots=True, kw_only=True)
class Origin:
    """Where requests go: scheme, host, port, and the path prefix of the URL given."""

    scheme: str
    host: str
    port: int
    base_path: str

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


class _Parse:
    """httptools callbacks for one response at a time."""

    __slots__ = ("body", "complete", "headers", "headers_done", "parser")

    def __init__(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.headers: dict[str, str] = {}
        self.body: list[bytes] = []
        self.headers_done = False
        self.complete = False

    def reset(self) -> None:
        self.headers = {}
        self.body = []
        self.headers_done = False
        self.complete = False

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        self.headers_done = True

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        self.complete = True


class _Connection:
    __slots__ = ("parse", "reader", "writer")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.parse = _Parse()

    async def receive(self, timeout_s: float) -> bool:
        """Read and parse once; False at the end of the connection."""
        with map_exceptions("http1", _ERRORS):
            try:
                async with asyncio.timeout(timeout_s):
                    data = await self.reader.read(READ_BYTES)
            except ConnectionError:
                return False
            if not data:
                return False
            self.parse.parser.feed_data(data)
        return True


class Response:
    """A response whose headers have arrived; :meth:`body` gives the rest as it comes."""

    def __init__(self, pool: HttpPool, conn: _Connection) -> None:
        self._pool = pool
        self._conn = conn
        self.status = conn.parse.parser.get_status_code()
        self.headers = conn.parse.headers
        self.complete = False
        """Whether the body ended as HTTP frames it (not by a closed connection)."""

    async def body(self) -> AsyncIterator[bytes]:
        conn = self._conn
        parse = conn.parse
        ok = False
        try:
            while True:
                if parse.body:
                    pieces, parse.body = parse.body, []
                    yield pieces[0] if len(pieces) == 1 else b"".join(pieces)
                if parse.complete:
                    break
                if not await conn.receive(self._pool.timeout_s):
                    raise StreamTruncatedError("the connection closed mid-body")
            self.complete = True
            ok = True
        finally:
            await self._pool.release(conn, reusable=ok)

    async def read(self, limit: int) -> bytes:
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
        except (ProtocolError, MessageTooLargeError):
            body = b""
        return RemoteError(self.status, error_detail(body) if body else "(no body)")


class HttpPool:
    """Keep-alive connections to one origin, at most ``max_connections`` at once."""

    def __init__(
        self,
        origin: Origin,
        *,
        headers: Sequence[tuple[str, str]] = (),
        ssl_context: ssl.SSLContext | None = None,
        max_connections: int = 1024,
        timeout_s: float = 60.0,
    ) -> None:
        if origin.scheme == "https" and ssl_context is None:
            ssl_context = ssl.create_default_context()
        self.origin = origin
        self.ssl_context = ssl_context if origin.scheme == "https" else None
        self.timeout_s = timeout_s
        self._slots = asyncio.Semaphore(max_connections)
        self._idle: list[_Connection] = []
        self._all: set[_Connection] = set()
        self.connections_opened = 0
        fixed = [("host", origin.authority), *headers]
        self._head = "".join(f"{name}: {value}\r\n" for name, value in fixed)

    async def _acquire(self) -> _Connection:
        await self._slots.acquire()
        try:
            while self._idle:
                conn = self._idle.pop()
                if not conn.writer.is_closing() and not conn.reader.at_eof():
                    return conn
                self._all.discard(conn)
                await aclose_quietly(conn.writer)
            reader, writer = await connect_tcp(
                self.origin.host,
                self.origin.port,
                ssl_context=self.ssl_context,
                timeout_s=self.timeout_s,
                limit=READ_BYTES,
            )
        except BaseException:
            self._slots.release()
            raise
        self.connections_opened += 1
        conn = _Connection(reader, writer)
        self._all.add(conn)
        return conn

    async def release(self, conn: _Connection, *, reusable: bool) -> None:
        if reusable and conn.parse.headers.get("connection", "").lower() != "close":
            self._idle.append(conn)
        else:
            self._all.discard(conn)
            await aclose_quietly(conn.writer)
        self._slots.release()

    async def request(
        self, method: str, path: str, body: bytes = b"", content_type: str = "application/json"
    ) -> Response:
        """Send a request and read up to the end of the response's headers."""
        conn = await self._acquire()
        try:
            head = (
                f"{method} {self.origin.base_path}{path} HTTP/1.1\r\n{self._head}"
                f"content-type: {content_type}\r\ncontent-length: {len(body)}\r\n\r\n"
            )
            conn.writer.write(head.encode("latin-1") + body)
            with map_exceptions("http1", _ERRORS):
                await conn.writer.drain()
            conn.parse.reset()
            while not conn.parse.headers_done:
                if not await conn.receive(self.timeout_s):
                    raise StreamTruncatedError("the connection closed before a response")
        except BaseException:
            await self.release(conn, reusable=False)
            raise
        return Response(self, conn)

    async def close(self) -> None:
        conns, self._all, self._idle = self._all, set(), []
        for conn in conns:
            await aclose_quietly(conn.writer)
