"""The HTTP/1.1 client: a keep-alive pool of asyncio stream connections (or one connection per
request), responses parsed by ``httptools``; a stream's chunked body is read through the
codec's stream decoder, and a body that ends without the codec's end marker is a truncated
stream, never a complete one.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import ClassVar, Final

import httptools

import inferwire.codecs as ic

from ..base import Client
from ..common import ErrorMap, aclose_quietly, connect_tcp, error_detail, map_exceptions, translate
from ..errors import MessageTooLargeError, ProtocolError, RemoteError, StreamTruncatedError
from ..openai_api import chat_request_body
from ..service import GenerateRequest
from ..streams import ChunkReader
from ..timing import TRACEPARENT, TRAILER, StreamTiming, asks_server, now_ns, unpack_text
from .server import READ_BYTES

_ERRORS: Final[ErrorMap] = {httptools.HttpParserError: ProtocolError}
"""httptools' own exceptions, as the client meets them; socket errors are mapped in common."""


class _ResponseReader:
    """httptools callbacks for one connection's responses, in turn."""

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


class _Connection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.response = _ResponseReader()
        self.reusable = True

    async def receive(self, timeout_s: float) -> bool:
        """Read and parse once; False at end of connection (a reset included)."""
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


class Http1Client(Client):
    """A keep-alive pool (idle connections reused, a new one when none is idle), or with
    ``new_connection_per_request`` one connection per request, closed after it."""

    transport: ClassVar[str] = "http1"

    def __init__(
        self,
        *args: object,
        new_connection_per_request: bool = False,
        max_idle: int = 100,
        **kwargs: object,
    ) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.new_connection_per_request = new_connection_per_request
        self.max_idle = max_idle
        self._idle: list[_Connection] = []
        self._busy: set[_Connection] = set()
        self.connections_opened = 0
        authority = f"[{self.host}]" if ":" in self.host else self.host
        self._host_header = f"host: {authority}:{self.port}\r\n"

    async def _acquire(self) -> _Connection:
        while self._idle:
            conn = self._idle.pop()
            if not conn.writer.is_closing() and not conn.reader.at_eof():
                self._busy.add(conn)
                return conn
            await aclose_quietly(conn.writer)
        reader, writer = await connect_tcp(
            self.host,
            self.port,
            ssl_context=self.ssl_context,
            timeout_s=self.limits.timeout_s,
            limit=READ_BYTES,
        )
        self.connections_opened += 1
        conn = _Connection(reader, writer)
        self._busy.add(conn)
        return conn

    async def _release(self, conn: _Connection, ok: bool) -> None:
        self._busy.discard(conn)
        if (
            ok
            and conn.reusable
            and not self.new_connection_per_request
            and len(self._idle) < self.max_idle
            and conn.response.headers.get("connection", "").lower() != "close"
        ):
            self._idle.append(conn)
        else:
            await aclose_quietly(conn.writer)

    async def _send(
        self,
        path: str,
        content_type: str,
        accept: str,
        body: bytes,
        timing: StreamTiming | None = None,
    ) -> tuple[_Connection, int]:
        """Send a request and read up to the end of the response's headers."""
        if len(body) > self.limits.max_message_bytes:
            raise MessageTooLargeError(f"request of {len(body)} bytes is over the limit")
        conn = await self._acquire()
        try:
            close = "connection: close\r\n" if self.new_connection_per_request else ""
            if timing is not None and timing.traceparent:
                close += f"{TRACEPARENT}: {timing.traceparent}\r\n"
            conn.writer.write(
                (
                    f"POST {path} HTTP/1.1\r\n{self._host_header}content-type: {content_type}\r\n"
                    f"accept: {accept}\r\ncontent-length: {len(body)}\r\n{close}\r\n"
                ).encode("latin-1")
            )
            conn.writer.write(body)
            await conn.writer.drain()
            if timing is not None:
                timing.request_sent_ns = now_ns()
            conn.response.start()
            while not conn.response.headers_done:
                if not await conn.receive(self.limits.timeout_s):
                    raise StreamTruncatedError("http1: connection closed before a response")
        except Exception as exc:
            await aclose_quietly(conn.writer)
            ours = translate(exc, "http1", _ERRORS)
            if ours is exc:
                raise
            raise ours from exc
        except BaseException:  # cancelled: the connection is in an unknown state
            await aclose_quietly(conn.writer)
            raise
        status = conn.response.parser.get_status_code()
        return conn, status

    async def _fail(self, conn: _Connection, status: int) -> None:
        """Read an error answer's body and raise it as :class:`RemoteError`."""
        try:
            while not conn.response.complete and await conn.receive(self.limits.timeout_s):
                pass
        finally:
            await self._release(conn, conn.response.complete)
        raise RemoteError(status, error_detail(b"".join(conn.response.body)))

    async def infer(self, request: ic.InferRequest) -> ic.InferResponse:
        payload = self.codec.encode(request)
        path = f"/v2/models/{request.model}/infer"
        media = self.codec.media_type
        conn, status = await self._send(path, media, media, payload)
        if status != 200:
            await self._fail(conn, status)
        ok = False
        try:
            size = 0
            while not conn.response.complete:
                if not await conn.receive(self.limits.timeout_s):
                    raise StreamTruncatedError("http1: connection closed mid-response")
                size = sum(map(len, conn.response.body))
                if size > self.limits.max_message_bytes:
                    raise MessageTooLargeError(f"response over {self.limits.max_message_bytes}")
            with map_exceptions("http1"):
                response = self.codec.decode(b"".join(conn.response.body), ic.InferResponse)
            ok = True
            return response
        finally:
            await self._release(conn, ok)

    async def generate(
        self, request: GenerateRequest, *, timing: StreamTiming | None = None
    ) -> AsyncIterator[ic.TokenChunk]:
        if timing is not None:
            timing.request_start_ns = now_ns()
        body = chat_request_body(request, timing=asks_server(timing))
        if timing is not None:
            timing.request_encoded_ns = now_ns()
        conn, status = await self._send(
            "/v1/chat/completions", "application/json", self.codec.stream_media_type, body, timing
        )
        if status != 200:
            await self._fail(conn, status)
        stream = ChunkReader.of_bytes(self.codec, self.limits.max_message_bytes, "http1", timing)
        ok = False
        try:
            pending = conn.response.body
            while True:
                if pending:
                    conn.response.body = []
                    for chunk in stream.feed(b"".join(pending) if len(pending) > 1 else pending[0]):
                        yield chunk
                if conn.response.complete:
                    break
                if not await conn.receive(self.limits.timeout_s):
                    raise stream.truncated("connection closed")
                pending = conn.response.body
            if not stream.finished:
                raise stream.truncated("the body ended without the stream's end")
            if timing is not None and timing.server_stamps:
                trailer = conn.response.trailers.get(TRAILER)
                if trailer is None:
                    raise ProtocolError("http1: the timed stream has no timing trailer")
                timing.set_server(unpack_text(trailer))
            ok = True
        finally:
            await self._release(conn, ok)

    async def close(self) -> None:
        """Close every connection, idle or busy: a stream still being read ends as
        truncated, and its server stops generating it."""
        idle, self._idle = self._idle, []
        busy, self._busy = self._busy, set()
        for conn in [*idle, *busy]:
            conn.reusable = False
            await aclose_quietly(conn.writer)
