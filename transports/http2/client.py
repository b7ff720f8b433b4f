"""The HTTP/2 client: one connection, every request a stream on it, h2 (sans-IO) on an asyncio
protocol; h2c (prior knowledge) or TLS with ALPN ``h2``.

Receiving, a stream's data is acknowledged (its window opened again) only once the consumer has
taken the chunks decoded from it, so a consumer that stops reading stops the server's sending
for that stream alone. A stream the server's GOAWAY says it never processed is sent once more,
on a new connection (RFC 9113, section 6.8).

With ``accept_encoding`` the client asks for compressed answers (``accept-encoding``); an answer
in a content coding (gzip, br, zstd, deflate) is decoded as its DATA frames arrive, bounded as
the HTTP/1.1 client's are (:class:`~inferwire.transports.compression.Decoder`), whether asked
for or not: a bomb is :class:`~inferwire.transports.compression.DecompressionLimitError`, bytes
that do not decode :class:`~inferwire.transports.compression.ContentEncodingError`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import ClassVar, Final, cast

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.settings

import inferwire.codecs as ic

from ..base import Client
from ..common import ErrorMap, error_detail, map_exceptions, translate
from ..compression import Decoder, content_coding
from ..errors import (
    CancelledByPeerError,
    ConnectError,
    MessageTooLargeError,
    ProtocolError,
    RemoteError,
    StreamNotProcessedError,
    StreamTruncatedError,
    TransportTimeoutError,
)
from ..openai_api import chat_request_body
from ..service import GenerateRequest
from ..streams import ChunkReader
from ..timing import TRACEPARENT, TRAILER, StreamTiming, asks_server, now_ns, unpack_text
from .fields import InboundFields
from .flow import WINDOW_BYTES, FlowControl, Writer, h2_connection

_ERRORS: Final[ErrorMap] = {h2.exceptions.H2Error: ProtocolError}
"""h2's own exceptions, as the client meets them; socket errors are mapped in common."""
_SEND_ERRORS: Final[ErrorMap] = {
    **_ERRORS,
    ConnectionResetError: StreamTruncatedError,  # FlowControl.send: the connection went
}
"""While a request is sent."""


class _ClientStream:
    __slots__ = ("complete", "data", "event", "failure", "headers", "trailers", "unacked")

    def __init__(self) -> None:
        self.headers: dict[str, str] | None = None
        self.trailers: dict[str, str] = {}
        self.data: list[bytes] = []
        self.unacked = 0
        self.complete = False
        self.failure: Exception | None = None
        self.event = asyncio.Event()


class ClientProtocol(asyncio.Protocol):
    def __init__(self, timeout_s: float) -> None:
        self.conn = h2_connection(client_side=True)
        self.fields = InboundFields(client_side=True)
        self.streams: dict[int, _ClientStream] = {}
        self.flow = FlowControl(timeout_s)
        self.writer: Writer | None = None
        self.failure: Exception | None = None
        self.draining = False
        self.received_bytes = 0
        """Bytes read from the socket: frames as they came (compressed bodies compressed)."""
        self.lost = asyncio.Event()
        self.stream_closed = asyncio.Event()
        """Set when a stream ends or is reset: a request waiting for a stream slot (the
        server's SETTINGS_MAX_CONCURRENT_STREAMS) looks again."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport's methods without subclassing it
        transport = cast(asyncio.Transport, transport)
        self.transport = transport
        self.writer = Writer(transport)
        self.conn.local_settings = h2.settings.Settings(
            client=True,
            initial_values={
                h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: WINDOW_BYTES,
                h2.settings.SettingCodes.ENABLE_PUSH: 0,
            },
        )
        self.conn.initiate_connection()
        self.conn.increment_flow_control_window(WINDOW_BYTES * 16)
        self.flush()

    def flush(self) -> None:
        data = self.conn.data_to_send()
        if data and not self.transport.is_closing():
            self.transport.write(data)

    def pause_writing(self) -> None:
        assert self.writer is not None
        self.writer.pause()

    def resume_writing(self) -> None:
        assert self.writer is not None
        self.writer.resume()

    def _fail_all(self, failure: Exception) -> None:
        self.failure = failure
        for stream in self.streams.values():
            if not stream.complete and stream.failure is None:
                stream.failure = failure
            stream.event.set()
        self.flow.opened(None)
        self.stream_closed.set()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.writer is not None:
            self.writer.closed = True
            self.writer.resume()
        self._fail_all(StreamTruncatedError(f"http2: connection lost ({exc!r})"))
        self.lost.set()

    def _protocol_error(self, exc: h2.exceptions.ProtocolError) -> None:
        self.flush()  # h2's GOAWAY
        self.transport.close()
        failure = translate(exc, "http2", _ERRORS)
        failure.__cause__ = exc
        self._fail_all(failure)

    def data_received(self, data: bytes) -> None:
        self.received_bytes += len(data)
        try:
            events = self.conn.receive_data(data)
        except h2.exceptions.ProtocolError as exc:
            self._protocol_error(exc)
            return
        for event in events:
            if isinstance(
                event,
                (
                    h2.events.ResponseReceived,
                    h2.events.TrailersReceived,
                    h2.events.InformationalResponseReceived,
                ),
            ):
                try:  # h2's checks, which it leaves to us (fields.py says why)
                    fields = self.fields.check(
                        event.headers, trailer=isinstance(event, h2.events.TrailersReceived)
                    )
                except h2.exceptions.ProtocolError as exc:
                    with contextlib.suppress(h2.exceptions.H2Error):
                        self.conn.close_connection(h2.errors.ErrorCodes.PROTOCOL_ERROR)
                    self._protocol_error(exc)
                    return
            stream_id = getattr(event, "stream_id", None)
            stream = self.streams.get(stream_id) if stream_id else None
            if isinstance(event, h2.events.ResponseReceived) and stream is not None:
                stream.headers = {
                    bytes(k).decode("latin-1"): bytes(v).decode("latin-1") for k, v in fields
                }
                stream.event.set()
            elif isinstance(event, h2.events.DataReceived):
                if stream is None:
                    self.conn.acknowledge_received_data(
                        event.flow_controlled_length, event.stream_id
                    )
                    continue
                if event.data:
                    stream.data.append(event.data)
                stream.unacked += event.flow_controlled_length
                stream.event.set()
            elif isinstance(event, h2.events.TrailersReceived) and stream is not None:
                stream.trailers = {
                    bytes(k).decode("latin-1"): bytes(v).decode("latin-1") for k, v in fields
                }
            elif isinstance(event, h2.events.StreamEnded) and stream is not None:
                stream.complete = True
                stream.event.set()
                self.stream_closed.set()
            elif isinstance(event, h2.events.StreamReset) and stream is not None:
                if not (stream.complete and event.error_code == h2.errors.ErrorCodes.NO_ERROR):
                    stream.failure = CancelledByPeerError(
                        f"http2: stream reset by the server ({event.error_code!r})"
                    )
                stream.event.set()
                self.flow.reset(event.stream_id)  # a sender waiting for window stops waiting
                self.stream_closed.set()
            elif isinstance(event, h2.events.WindowUpdated):
                self.flow.opened(event.stream_id)
            elif isinstance(event, h2.events.RemoteSettingsChanged):
                self.flow.opened(None)
            elif isinstance(event, h2.events.ConnectionTerminated):
                self.draining = True  # no new streams here: the client opens a new connection
                if event.error_code == h2.errors.ErrorCodes.NO_ERROR:
                    # graceful (RFC 9113 6.8): streams up to last_stream_id still finish;
                    # later ones were never processed
                    last = event.last_stream_id or 0
                    for stream_id, stream in self.streams.items():
                        if stream_id > last and not stream.complete:
                            stream.failure = StreamNotProcessedError(
                                "http2: the server closed the connection before this stream "
                                "(GOAWAY); it was not processed"
                            )
                            stream.event.set()
                    self.close_if_idle()
                else:
                    self._fail_all(
                        StreamTruncatedError(
                            f"http2: GOAWAY from the server ({event.error_code!r})"
                        )
                    )
                    self.transport.close()
        self.flush()

    def close_if_idle(self) -> None:
        if self.draining and not self.streams:
            self.transport.close()


class Http2Client(Client):
    """One connection, every request a stream on it; opened on first use.
    ``accept_encoding``: the ``accept-encoding`` sent (e.g. ``"zstd, gzip, br"``; None: none,
    so the server answers uncompressed)."""

    transport: ClassVar[str] = "http2"

    def __init__(self, *args: object, accept_encoding: str | None = None, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        if accept_encoding is not None and ("\r" in accept_encoding or "\n" in accept_encoding):
            raise ValueError("accept_encoding must be one header line")
        self.accept_encoding = accept_encoding
        self._protocol: ClientProtocol | None = None
        self._received_before = 0  # by the connections before the current one
        self.connections_opened = 0
        self._connecting = asyncio.Lock()
        authority = f"[{self.host}]" if ":" in self.host else self.host
        self._authority = f"{authority}:{self.port}"
        self._scheme = "https" if self.ssl_context is not None else "http"
        # header fields as bytes: h2 would encode str ones on every request, and the HPACK
        # encoder remembers a list of plain byte tuples (hpack_cache.py)
        self._fixed_fields = [
            (b":method", b"POST"),
            (b":scheme", self._scheme.encode()),
            (b":authority", self._authority.encode()),
        ]
        # after the pseudo-fields, which RFC 9113 8.3 puts first
        self._coding_fields = (
            [] if accept_encoding is None else [(b"accept-encoding", accept_encoding.encode())]
        )
        if self.ssl_context is not None:
            self.ssl_context.set_alpn_protocols(["h2"])

    async def _connection(self) -> ClientProtocol:
        async with self._connecting:
            protocol = self._protocol
            if (
                protocol is None
                or protocol.transport.is_closing()
                or protocol.failure
                or protocol.draining
            ):
                loop = asyncio.get_running_loop()
                try:
                    async with asyncio.timeout(self.limits.timeout_s):
                        transport, protocol = await loop.create_connection(
                            lambda: ClientProtocol(self.limits.timeout_s),
                            self.host,
                            self.port,
                            ssl=self.ssl_context,
                            server_hostname=self.host if self.ssl_context else None,
                        )
                except TimeoutError as exc:
                    raise TransportTimeoutError(f"http2: connect to {self._authority}") from exc
                except OSError as exc:  # refused, unreachable, TLS (ssl.SSLError is one)
                    raise ConnectError(f"http2: connect to {self._authority}: {exc}") from exc
                if self.ssl_context is not None:
                    sslobj = transport.get_extra_info("ssl_object")
                    if sslobj is None or sslobj.selected_alpn_protocol() != "h2":
                        transport.close()
                        raise ConnectError("http2: the server did not agree to h2 over ALPN")
                if self._protocol is not None:
                    self._received_before += self._protocol.received_bytes
                self._protocol = protocol
                self.connections_opened += 1
            return protocol

    @property
    def received_bytes(self) -> int:
        """Bytes read from every connection so far, HTTP/2 framing and all (a compressed
        answer counted as it crossed)."""
        current = self._protocol.received_bytes if self._protocol is not None else 0
        return self._received_before + current

    async def _open(
        self,
        path: str,
        content_type: str,
        accept: str,
        body: bytes,
        timing: StreamTiming | None = None,
    ) -> tuple[ClientProtocol, int, _ClientStream]:
        if len(body) > self.limits.max_message_bytes:
            raise MessageTooLargeError(f"request of {len(body)} bytes is over the limit")
        protocol = await self._connection()
        conn = protocol.conn
        # RFC 9113 5.1.2: past the server's limit on concurrent streams a new one would be
        # refused (h2 raises TooManyStreamsError): wait for one to close instead, as the
        # requests of a saturated HTTP/1.1 pool wait for a connection
        while conn.open_outbound_streams >= conn.remote_settings.max_concurrent_streams:
            if protocol.failure is not None:
                raise protocol.failure
            protocol.stream_closed.clear()
            with map_exceptions("http2 wait for a stream"):
                async with asyncio.timeout(self.limits.timeout_s):
                    await protocol.stream_closed.wait()
        with map_exceptions("http2", _ERRORS):
            stream_id = conn.get_next_available_stream_id()
        stream = _ClientStream()
        protocol.streams[stream_id] = stream
        headers = [
            *self._fixed_fields,
            (b":path", path.encode()),
            (b"content-type", content_type.encode()),
            (b"accept", accept.encode()),
            (b"content-length", str(len(body)).encode()),
            *self._coding_fields,
        ]
        if timing is not None and timing.traceparent:
            headers.append((TRACEPARENT.encode(), timing.traceparent.encode()))
        writer = protocol.writer
        assert writer is not None
        with map_exceptions("http2", _SEND_ERRORS):
            try:
                conn.send_headers(stream_id, headers)  # framed, not yet written
                if timing is not None:
                    timing.request_write_ns = now_ns()
                await protocol.flow.send(conn, protocol.flush, writer, stream_id, body, True)
            except h2.exceptions.StreamClosedError:
                # the server answered (and closed the stream) before taking the whole body, as
                # it does with 413: its answer is what the caller reads next
                if stream.headers is None and stream.failure is None:
                    failure = ProtocolError("http2: stream closed before the request was sent")
                    stream.failure = failure
        return protocol, stream_id, stream

    async def _wait(self, stream: _ClientStream) -> None:
        with map_exceptions("http2 read"):
            async with asyncio.timeout(self.limits.timeout_s):
                await stream.event.wait()
        stream.event.clear()

    async def _headers(self, stream: _ClientStream) -> int:
        while stream.headers is None:
            if stream.failure is not None:
                raise stream.failure
            await self._wait(stream)
        return int(stream.headers.get(":status", "0"))

    def _ack(self, protocol: ClientProtocol, stream_id: int, stream: _ClientStream) -> None:
        if stream.unacked and not protocol.transport.is_closing():
            with contextlib.suppress(h2.exceptions.H2Error):
                protocol.conn.acknowledge_received_data(stream.unacked, stream_id)
                protocol.flush()
        stream.unacked = 0

    async def _body(self, protocol: ClientProtocol, stream_id: int, stream: _ClientStream) -> bytes:
        """The whole body, decoded out of its content coding; refused past the message limit
        as it arrives (decoded by a bounded decoder, so a bomb stops at the limit)."""
        limit = self.limits.max_message_bytes
        decoder = self._decoder(stream, limit)
        size = 0
        parts: list[bytes] = []
        while True:
            if stream.data:
                data = b"".join(stream.data)
                stream.data = []
                if decoder is not None:
                    data = decoder.feed(data)
                size += len(data)
                parts.append(data)
                if size > limit:
                    raise MessageTooLargeError("http2: response over the limit")
                self._ack(protocol, stream_id, stream)
            if stream.complete:
                if decoder is not None:
                    decoder.close()
                return b"".join(parts)
            if stream.failure is not None:
                raise stream.failure
            await self._wait(stream)

    def _decoder(self, stream: _ClientStream, max_bytes: int | None = None) -> Decoder | None:
        """The decoder of the answer's content coding (None: it has none); raises
        :class:`~inferwire.transports.compression.ContentEncodingError` for one not decoded.
        ``max_bytes``: the most the whole body may decode to (a unary body's limit)."""
        assert stream.headers is not None
        coding = content_coding(stream.headers.get("content-encoding"))
        if coding is None:
            return None
        limit = self.limits.max_message_bytes
        return Decoder(coding, max_piece_bytes=limit, max_total_bytes=max_bytes)

    def _finish(self, protocol: ClientProtocol, stream_id: int, stream: _ClientStream) -> None:
        """Forget the stream; cancel it on the server if it did not end."""
        protocol.streams.pop(stream_id, None)
        protocol.flow.forget(stream_id)
        protocol.close_if_idle()
        if not stream.complete and stream.failure is None and not protocol.transport.is_closing():
            with contextlib.suppress(h2.exceptions.H2Error):
                protocol.conn.reset_stream(stream_id, h2.errors.ErrorCodes.CANCEL)
                protocol.flush()

    async def _start(
        self,
        path: str,
        content_type: str,
        accept: str,
        body: bytes,
        timing: StreamTiming | None = None,
    ) -> tuple[ClientProtocol, int, _ClientStream, int]:
        """Open a stream and read its response headers; a stream the server's GOAWAY says it
        never processed is sent once more, on a new connection (RFC 9113 6.8)."""
        for attempt in (1, 2):
            protocol, stream_id, stream = await self._open(path, content_type, accept, body, timing)
            if timing is not None:
                timing.request_sent_ns = now_ns()
            try:
                return protocol, stream_id, stream, await self._headers(stream)
            except StreamNotProcessedError:
                self._finish(protocol, stream_id, stream)
                if attempt == 2:
                    raise
            except BaseException:
                self._finish(protocol, stream_id, stream)
                raise
        raise AssertionError("unreachable")

    async def infer(self, request: ic.InferRequest) -> ic.InferResponse:
        media = self.codec.media_type
        payload = self.codec.encode(request)
        protocol, stream_id, stream, status = await self._start(
            f"/v2/models/{request.model}/infer", media, media, payload
        )
        try:
            body = await self._body(protocol, stream_id, stream)
        finally:
            self._finish(protocol, stream_id, stream)
        if status != 200:
            raise RemoteError(status, error_detail(body))
        with map_exceptions("http2"):
            return self.codec.decode(body, ic.InferResponse)

    async def generate(
        self, request: GenerateRequest, *, timing: StreamTiming | None = None
    ) -> AsyncIterator[ic.TokenChunk]:
        if timing is not None:
            timing.request_start_ns = now_ns()
        body = chat_request_body(request, timing=asks_server(timing))
        if timing is not None:
            timing.request_encoded_ns = now_ns()
        protocol, stream_id, stream, status = await self._start(
            "/v1/chat/completions", "application/json", self.codec.stream_media_type, body, timing
        )
        reader = ChunkReader.of_bytes(self.codec, self.limits.max_message_bytes, "http2", timing)
        try:
            if status != 200:
                raise RemoteError(
                    status, error_detail(await self._body(protocol, stream_id, stream))
                )
            decoder = self._decoder(stream)  # a stream has no total bound: each piece has
            while True:
                if stream.data:
                    data = b"".join(stream.data) if len(stream.data) > 1 else stream.data[0]
                    stream.data = []
                    if decoder is not None:
                        data = decoder.feed(data)
                    for chunk in reader.feed(data):
                        yield chunk
                    self._ack(protocol, stream_id, stream)  # consumed: open the window
                    continue
                if stream.complete:
                    if decoder is not None:
                        decoder.close()
                    break
                if stream.failure is not None:
                    if isinstance(stream.failure, StreamTruncatedError):
                        stream.failure.chunks_received = reader.count
                    raise stream.failure
                await self._wait(stream)
            reader.close()
            if timing is not None and timing.server_stamps:
                trailer = stream.trailers.get(TRAILER)
                if trailer is None:
                    raise ProtocolError("http2: the timed stream has no timing trailer")
                timing.set_server(unpack_text(trailer))
        finally:
            self._finish(protocol, stream_id, stream)

    async def close(self) -> None:
        protocol, self._protocol = self._protocol, None
        if protocol is None:
            return
        self._received_before += protocol.received_bytes
        if not protocol.transport.is_closing():
            with contextlib.suppress(h2.exceptions.H2Error):
                protocol.conn.close_connection()
                protocol.flush()
            protocol.transport.close()
        # wait for the close to finish: over TLS it is an exchange of close_notify, and a loop
        # that stops first leaves the socket open (a ResourceWarning at garbage collection)
        try:
            async with asyncio.timeout(2.0):
                await protocol.lost.wait()
        except TimeoutError:
            protocol.transport.abort()
