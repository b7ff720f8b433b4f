"""The HTTP/1.1 server: asyncio streams, requests parsed by ``httptools``, routes of
:mod:`inferwire.transports.httpapp`.

Why httptools: it binds llhttp, Node.js's parser, the one uvicorn uses: maintained, fast (C),
and strict where request smuggling lives (Content-Length with Transfer-Encoding, a duplicate
Content-Length, bad chunk sizes are all parse errors). h11 would be the sans-IO choice, but it
parses in Python, which on this machine costs more than the rest of a small request together.
What llhttp leaves to its user, this module does: header and body size limits, timeouts (a
whole head within ``Limits.header_timeout_s``), refusing transfer codings other than chunked,
and a lingering close after a refusal so that the client reads it.

Responses are written by hand: a status line and a few headers. A stream is sent with chunked
transfer encoding, one chunk per codec frame (SSE events for the JSON codecs); a stream that
fails on the server ends the connection without the last chunk, so the client sees it as
truncated.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass
from http import HTTPStatus
from typing import ClassVar, Final

import httptools

from inferwire.codecs.schema_registry import SchemaRegistry

from ..base import Server
from ..common import aclose_quietly, log_failure
from ..compression import Compression
from ..httpapp import HttpApp, Response, error
from ..openai_api import OpenAIOptions
from ..timing import TRAILER, now_ns

MAX_HEADER_BYTES: Final = 16 * 1024
"""Request line and headers together; over it: 431 (nginx's large_client_header_buffers is
4 x 8 KiB, Node's default 16 KiB)."""
KEEPALIVE_TIMEOUT_S: Final = 75.0
"""How long an idle connection is kept (nginx's keepalive_timeout)."""
LINGER_S: Final = 2.0
"""After a refusal, how long the rest of the request is read and dropped before closing
(nginx's lingering_time, 30 s, shortened: only what was already in flight matters)."""
LINGER_IDLE_S: Final = 0.5
"""... and how long with nothing arriving (nginx's lingering_timeout, 5 s)."""
_log = logging.getLogger(__name__)
READ_BYTES: Final = 256 * 1024
"""Most bytes one read takes (and the stream reader's buffer limit)."""


@dataclass(slots=True)
class _Request:
    method: str
    url: bytes
    headers: dict[str, str]
    body: bytes
    keep_alive: bool
    received_ns: int


class _RequestReader:
    """httptools callbacks: collects complete requests; over a limit it records the status
    to answer with instead of raising (an exception in a callback is re-wrapped by httptools).

    A refused message is never added to ``done``, and nothing after it is parsed: the requests
    before it are answered first, then the refusal, then the connection closes."""

    def __init__(self, max_body_bytes: int) -> None:
        self.parser = httptools.HttpRequestParser(self)
        self.max_body_bytes = max_body_bytes
        self.done: list[_Request] = []
        self.refused: int | None = None
        self.refusal = ""
        self.in_message = False
        self.in_head = False
        self.head_started_s = 0.0
        self.heads_completed = 0
        self._reset()

    def _reset(self) -> None:
        self.url = b""
        self.headers: dict[str, str] = {}
        self.body: list[bytes] = []
        self.header_bytes = 0
        self.head_read_bytes = 0
        self.body_bytes = 0

    def refuse(self, status: int, message: str) -> None:
        """Answer ``status`` in place of the message being parsed (the first refusal wins)."""
        if self.refused is None:
            self.refused = status
            self.refusal = message

    def feed(self, data: bytes) -> None:
        """Parse ``data``; a parse error becomes a refusal (400, or 501 for a transfer coding
        or an upgrade this server does not implement)."""
        if self.refused is not None:
            return
        head_before, in_head_before = self.heads_completed, self.in_head
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self.refuse(501, "upgrade is not supported")
        except httptools.HttpParserError as exc:
            # a request carrying both Content-Length and Transfer-Encoding is malformed
            # (RFC 9112 6.3): 400; a transfer coding we do not know: 501 (6.1)
            text = str(exc)
            status = 501 if "Transfer-Encoding" in text and "Length" not in text else 400
            self.refuse(status, f"bad request: {exc}")
        # httptools buffers a header line until it ends, so the head is also bounded here, by
        # the bytes of whole reads that fell inside it (a head that never ends is refused after
        # at most MAX_HEADER_BYTES + one read)
        if self.in_head and in_head_before and self.heads_completed == head_before:
            self.head_read_bytes += len(data)
            if self.head_read_bytes > MAX_HEADER_BYTES:
                self.refuse(431, "headers too large")

    def on_message_begin(self) -> None:
        self.in_message = True
        self.in_head = True
        self.head_started_s = time.monotonic()
        self._reset()

    def on_url(self, url: bytes) -> None:
        self.url += url
        self.header_bytes += len(url)
        if self.header_bytes > MAX_HEADER_BYTES:
            self.refuse(431, "headers too large")

    def on_header(self, name: bytes, value: bytes) -> None:
        self.header_bytes += len(name) + len(value) + 4
        if self.header_bytes > MAX_HEADER_BYTES:
            self.refuse(431, "headers too large")
            return
        key = name.decode("latin-1").lower()
        text = value.decode("latin-1")
        self.headers[key] = f"{self.headers[key]}, {text}" if key in self.headers else text

    def on_headers_complete(self) -> None:
        self.in_head = False
        self.heads_completed += 1
        coding = self.headers.get("transfer-encoding")
        if coding is not None:
            if self.parser.get_http_version() == "1.0":
                # RFC 9112 6.1: Transfer-Encoding in HTTP/1.0 is faulty framing
                self.refuse(400, "bad request: Transfer-Encoding in an HTTP/1.0 request")
            elif coding.strip().lower() != "chunked":
                # llhttp accepts any codings that end in chunked ("gzip, chunked"); we decode
                # none of them, and a body read as if they were not there is altered data
                self.refuse(501, f"transfer coding {coding!r} is not implemented")
        length = self.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > self.max_body_bytes:
            self.refuse(413, "body too large")

    def on_body(self, body: bytes) -> None:
        self.body_bytes += len(body)
        if self.body_bytes > self.max_body_bytes:
            self.refuse(413, "body too large")
        elif self.refused is None:
            self.body.append(body)

    def on_message_complete(self) -> None:
        self.in_message = False
        if self.refused is not None:
            return
        self.done.append(
            _Request(
                self.parser.get_method().decode("latin-1"),
                self.url,
                self.headers,
                b"".join(self.body),
                self.parser.should_keep_alive(),
                now_ns(),
            )
        )


def _head(status: int, content_type: str, extra: str) -> bytes:
    reason = HTTPStatus(status).phrase
    return f"HTTP/1.1 {status} {reason}\r\ncontent-type: {content_type}\r\n{extra}\r\n".encode(
        "latin-1"
    )


class Http1Server(Server):
    transport: ClassVar[str] = "http1"

    def __init__(
        self,
        *args: object,
        registry: SchemaRegistry | None = None,
        openai: OpenAIOptions | None = None,
        compression: Compression | None = None,
        allow_client_shm: bool = False,
        **kwargs: object,
    ) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.app = HttpApp(
            self.service,
            self.codec,
            registry=registry,
            metrics=self.metrics,
            tracer=self.tracer,
            openai=openai,
            compression=compression,
            allow_client_shm=allow_client_shm,
        )

    async def start(self) -> tuple[str, int]:
        return await self._serve_streams(self._handle, READ_BYTES)

    async def stop(self) -> None:
        await super().stop()
        self.app.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._track()
        requests = _RequestReader(self.limits.max_message_bytes)
        try:
            while True:
                while not requests.done and requests.refused is None:
                    try:
                        async with asyncio.timeout(self._read_timeout_s(requests)):
                            data = await reader.read(READ_BYTES)
                    except TimeoutError:
                        if not requests.in_head:
                            raise
                        requests.refuse(408, "request head too slow")
                        break
                    if not data:
                        return
                    requests.feed(data)
                if not requests.done:
                    assert requests.refused is not None
                    refusal = error(requests.refused, requests.refusal)
                    if self.metrics is not None:
                        refusal.meter = self.metrics.start("unary")
                    await self._write_last(reader, writer, refusal)
                    return
                request = requests.done.pop(0)
                if "websocket" in request.headers.get("upgrade", "").lower():
                    # RFC 6455: from the handshake on, the connection is the WebSocket's
                    from ..websocket import WebSocketEndpoint  # imported on the first upgrade

                    endpoint = WebSocketEndpoint(self.app.openai, self.limits)
                    url = request.url.decode("latin-1")
                    await endpoint.upgrade(reader, writer, request.method, url, request.headers)
                    return
                response = self.app.handle(
                    request.method,
                    request.url.decode("latin-1"),
                    request.headers,
                    request.body,
                    request.received_ns,
                )
                if not await self._write(writer, response, request.keep_alive):
                    return
        except (OSError, TimeoutError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass  # the client went away (or the server stops): its stream was closed
        except Exception as exc:
            # a failure mid-answer: the connection closes (a stream is seen as truncated),
            # the server goes on
            log_failure(_log, "http1: connection failed", exc)
        finally:
            await aclose_quietly(writer)

    def _read_timeout_s(self, requests: _RequestReader) -> float:
        """Inside a head: what is left of ``header_timeout_s`` from its first byte (a total,
        as a client sending a byte a second never trips a per-read timeout); inside a body:
        ``timeout_s`` per read; between requests: the keep-alive timeout."""
        if requests.in_head:
            deadline_s = requests.head_started_s + self.limits.header_timeout_s
            return max(deadline_s - time.monotonic(), 0.0)
        return self.limits.timeout_s if requests.in_message else KEEPALIVE_TIMEOUT_S

    async def _write_last(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, response: Response
    ) -> None:
        """Send a refusal, then close without losing it: bounded in time, as its client may
        not be reading.

        Closing with unread bytes in the receive buffer (the rest of a refused body or head)
        makes the kernel send a reset, and a reset can destroy the answer before the client
        reads it. So, as nginx's lingering close does, the write side is shut first and what
        the client still sends is read and dropped, for a short while."""
        async with asyncio.timeout(self.limits.timeout_s):
            await self._write(writer, response, False)
        if writer.can_write_eof():
            writer.write_eof()
        with contextlib.suppress(TimeoutError, OSError):
            async with asyncio.timeout(LINGER_S):
                while await asyncio.wait_for(reader.read(READ_BYTES), LINGER_IDLE_S):
                    pass

    async def _write(self, writer: asyncio.StreamWriter, response: Response, keep: bool) -> bool:
        """Send ``response``; False when the connection must close after it."""
        meter = response.meter
        if meter is None:
            return await self._send(writer, response, keep)
        try:
            keep = await self._send(writer, response, keep)
        except BaseException as exc:
            if writer.transport.is_closing():
                # the peer went away: uvloop's transport then refuses the next write with a
                # RuntimeError (asyncio's, with a ConnectionResetError from drain)
                meter.finish("cancelled")
            else:
                meter.failed(exc)
            raise
        meter.answered(response.status)
        return keep

    async def _send(self, writer: asyncio.StreamWriter, response: Response, keep: bool) -> bool:
        """:meth:`_write`, with the meter's writes and without its end."""
        meter = response.meter
        connection = "" if keep else "connection: close\r\n"
        connection += "".join(f"{name}: {value}\r\n" for name, value in response.headers)
        if response.stream is None:
            head = _head(
                response.status,
                response.content_type,
                f"content-length: {len(response.body)}\r\n{connection}",
            )
            writer.write(head)
            writer.write(response.body)
            await writer.drain()
            if meter is not None:
                meter.written(len(head) + len(response.body))
            return keep
        extra = f"transfer-encoding: chunked\r\ncache-control: no-cache\r\n{connection}"
        stamps = response.stamps
        if stamps is not None:
            extra += f"trailer: {TRAILER}\r\n"
        head = _head(response.status, response.content_type, extra)
        writer.write(head)
        if meter is not None:
            meter.written(len(head))
        async with contextlib.aclosing(response.stream) as frames:
            async for frame in frames:
                if frame:  # an empty chunk would end the body
                    chunk = b"%x\r\n%b\r\n" % (len(frame), frame)
                    writer.write(chunk)
                    await writer.drain()
                    if meter is not None:
                        meter.written(len(chunk))
                if stamps is not None:
                    stamps.written()
        last = b"0\r\n\r\n"
        if stamps is not None:
            last = f"0\r\n{TRAILER}: {stamps.pack_text()}\r\n\r\n".encode("ascii")
        writer.write(last)
        await writer.drain()
        if meter is not None:
            meter.written(len(last))
        return keep
