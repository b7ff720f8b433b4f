"""``http2``: HTTP/2 with ``h2`` on both ends, h2c (prior knowledge) or TLS with ALPN ``h2``.

h2 is sans-IO; this module is the socket loop around it. The routes are those of HTTP/1.1
(:mod:`inferwire.transports.httpapp`). Flow control is real in both directions:

* sending, a stream writes no more than its window and the connection's, and waits for a
  WINDOW_UPDATE, so a slow reader stalls only its own stream (RFC 9113, section 5.2);
* receiving, the client acknowledges a stream's data (opening its window again) only once the
  consumer has taken the chunks decoded from it, so a consumer that stops reading stops the
  server's sending for that stream alone.

A request whose body passes the limit is answered 413 and reset; a stream reset by the peer
cancels its handler.

The server defends itself against hostile peers where h2 leaves that to the application (the
frame-level checks are in :mod:`inferwire.transports.h2guard`):

* Rapid Reset (CVE-2023-44487): no more than ``MAX_CONCURRENT_STREAMS`` handlers run at once,
  counting those of reset streams until they have ended; a stream past that is refused
  (RST_STREAM REFUSED_STREAM), and a peer that resets or is refused faster than
  ``RESET_RATE_PER_S`` (after a burst of ``RESET_BURST``) is sent GOAWAY(ENHANCE_YOUR_CALM);
* a peer that does not read: h2's own answers (PING and SETTINGS ACKs) and our refusals queued
  while the socket is backed up are capped at ``CONTROL_BYTES_CAP``; a sender that waits on a
  backed-up socket or on a stream window gives up after the limits' ``timeout_s`` (the stream is
  reset, or the connection closed when the whole socket is stuck).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import time
from collections.abc import AsyncIterator
from typing import Any, ClassVar, Final

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.settings
import orjson

import inferwire.codecs as ic

from . import h2guard
from .base import Client, Server
from .common import BACKLOG, error_detail
from .errors import (
    CancelledByPeerError,
    ConnectError,
    MessageTooLargeError,
    ProtocolError,
    RemoteError,
    StreamTruncatedError,
    TransportTimeoutError,
)
from .httpapp import HttpApp, Response, error
from .service import GenerateRequest
from .timing import TRAILER, StreamTiming, now_ns, unpack_text

_log = logging.getLogger(__name__)

MAX_CONCURRENT_STREAMS: Final = 256
WINDOW_BYTES: Final = 1 << 20
"""Initial stream window we advertise: 1 MiB (h2's default 64 KiB would stall a fast stream
on loopback every few frames)."""
MAX_HEADER_LIST_BYTES: Final = 16 * 1024
MAX_HEADER_BLOCK_BYTES: Final = 2 * MAX_HEADER_LIST_BYTES
"""Largest compressed header block (HEADERS + CONTINUATION) taken in: HPACK never makes a
block much larger than the header list it decodes to, so twice the list limit is generous."""
MAX_IDLE_FRAMES: Final = 10_000
"""PING, SETTINGS, PRIORITY and empty DATA frames in a row, with no request moving forward."""
RESET_BURST: Final = 1000
RESET_RATE_PER_S: Final = 100.0
"""Streams the peer may reset (or have refused) in a burst, and per second after it: far more
than a client that cancels what it no longer needs, far fewer than a Rapid Reset attack."""
CONTROL_BYTES_CAP: Final = 1 << 20
"""Bytes of PING/SETTINGS ACKs and refusals queued to a peer that is not reading."""
CLOSE_GRACE_S: Final = 2.0
"""How long a GOAWAY may take to leave before the connection is dropped regardless."""


class _Writer:
    """Transport writes with back-pressure: ``wait`` blocks while the socket buffer is full
    (for at most ``timeout_s``, if given)."""

    def __init__(self, transport: asyncio.Transport, timeout_s: float | None = None) -> None:
        self.transport = transport
        self.timeout_s = timeout_s
        self._resumed = asyncio.Event()
        self._resumed.set()
        self.closed = False

    @property
    def paused(self) -> bool:
        return not self._resumed.is_set()

    def pause(self) -> None:
        self._resumed.clear()

    def resume(self) -> None:
        self._resumed.set()

    async def wait(self) -> None:
        if not self._resumed.is_set():
            try:
                async with asyncio.timeout(self.timeout_s):
                    await self._resumed.wait()
            except TimeoutError as exc:
                raise _PeerNotReadingError("http2: the peer stopped reading") from exc


class _PeerNotReadingError(TransportTimeoutError):
    """The socket stayed backed up for the whole timeout: the connection, not a stream, is
    stuck."""


class _FlowControl:
    """Per-stream events a sender waits on for window space."""

    def __init__(self, timeout_s: float) -> None:
        self.window_events: dict[int, asyncio.Event] = {}
        self.closed: set[int] = set()
        self.timeout_s = timeout_s

    def reset(self, stream_id: int) -> None:
        """The peer reset the stream: its sender stops waiting and stops sending."""
        self.closed.add(stream_id)
        self.opened(stream_id)

    def forget(self, stream_id: int) -> None:
        self.window_events.pop(stream_id, None)
        self.closed.discard(stream_id)

    def opened(self, stream_id: int | None) -> None:
        if stream_id:
            event = self.window_events.get(stream_id)
            if event is not None:
                event.set()
        else:  # connection window or initial window change: wake every sender
            for event in self.window_events.values():
                event.set()

    async def send(
        self,
        conn: h2.connection.H2Connection,
        flush: Any,
        writer: _Writer,
        stream_id: int,
        data: bytes,
        end_stream: bool = False,
    ) -> None:
        if len(data) <= min(
            conn.local_flow_control_window(stream_id), conn.max_outbound_frame_size
        ):
            conn.send_data(stream_id, data, end_stream=end_stream)  # the common case: one frame
            flush()
            await writer.wait()
            return
        view = memoryview(data)
        while True:
            window = conn.local_flow_control_window(stream_id)
            size = min(window, len(view), conn.max_outbound_frame_size)
            if size <= 0 and view:
                event = self.window_events.setdefault(stream_id, asyncio.Event())
                event.clear()
                try:
                    async with asyncio.timeout(self.timeout_s):
                        await event.wait()  # a WINDOW_UPDATE, or the stream's reset
                except TimeoutError as exc:
                    raise TransportTimeoutError("http2: no window to send in") from exc
                if writer.closed:
                    raise ConnectionResetError("connection lost")
                if stream_id in self.closed:
                    raise h2.exceptions.StreamClosedError(stream_id)
                continue
            last = size == len(view)
            conn.send_data(stream_id, view[:size].tobytes(), end_stream=end_stream and last)
            flush()
            view = view[size:]
            await writer.wait()
            if last:
                return


class _ServerStream:
    __slots__ = ("body", "body_bytes", "headers", "refused", "task")

    def __init__(self, headers: dict[str, str]) -> None:
        self.headers = headers
        self.body: list[bytes] = []
        self.body_bytes = 0
        self.refused = False
        self.task: asyncio.Task[None] | None = None


class _H2ServerProtocol(asyncio.Protocol):
    def __init__(self, server: Http2Server) -> None:
        self.server = server
        self.conn = h2.connection.H2Connection(
            # outbound checks off: we build every header we send; inbound stay on (peers lie)
            h2.config.H2Configuration(
                client_side=False,
                header_encoding=None,
                validate_outbound_headers=False,
                normalize_outbound_headers=False,
            )
        )
        self.streams: dict[int, _ServerStream] = {}
        self.flow = _FlowControl(server.limits.timeout_s)
        self.writer: _Writer | None = None
        self.guard = h2guard.FrameGuard(
            max_frame_bytes=self.conn.local_settings.max_frame_size,
            max_header_block_bytes=MAX_HEADER_BLOCK_BYTES,
            max_idle_frames=MAX_IDLE_FRAMES,
        )
        self.handlers: set[asyncio.Task[None]] = set()
        self.handlers_peak = 0
        self.resets = 0
        """Streams the peer reset, or that were refused: for the Rapid Reset budget."""
        self._reset_credit = float(RESET_BURST)
        self._reset_credit_at = time.monotonic()
        self.control_bytes_unread = 0
        """Bytes of control frames queued since the socket last drained below its high mark."""
        self.outbound_peak = 0
        """Largest write buffer seen (bytes): what a peer that does not read costs us."""
        self.shut_code: h2.errors.ErrorCodes | None = None
        """The GOAWAY code the server closed with, if it closed on the peer."""
        self._eof_sent = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.writer = _Writer(transport, self.server.limits.timeout_s)
        self.server.protocols.add(self)
        self.conn.local_settings = h2.settings.Settings(
            client=False,
            initial_values={
                h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: MAX_CONCURRENT_STREAMS,
                h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: WINDOW_BYTES,
                h2.settings.SettingCodes.MAX_HEADER_LIST_SIZE: MAX_HEADER_LIST_BYTES,
            },
        )
        # h2 applies the list limit to its decoder only when a change of it is acknowledged,
        # and initial values are no change: without this it would decode up to its 64 KiB
        self.conn.decoder.max_header_list_size = MAX_HEADER_LIST_BYTES
        self.conn.initiate_connection()
        self.conn.increment_flow_control_window(WINDOW_BYTES * 16)
        self.flush()

    def _writable(self) -> bool:
        return not self.transport.is_closing() and not self._eof_sent

    def flush(self) -> None:
        data = self.conn.data_to_send()
        if data and self._writable():
            self.transport.write(data)
            self._note_buffer()

    def _note_buffer(self) -> None:
        size = self.transport.get_write_buffer_size()
        if size > self.outbound_peak:
            self.outbound_peak = size
            self.server.outbound_peak = max(self.server.outbound_peak, size)

    def _write_control(self, data: bytes) -> None:
        """Write frames the peer's frames made us queue; capped while the peer is not
        reading (a PING or SETTINGS flood: CVE-2019-9512, CVE-2019-9515)."""
        if not data or not self._writable():
            return
        assert self.writer is not None
        if self.writer.paused:
            self.control_bytes_unread += len(data)
            if self.control_bytes_unread > CONTROL_BYTES_CAP:
                self._log_abuse("control frames queued to a peer that does not read")
                self.shut_code = h2.errors.ErrorCodes.ENHANCE_YOUR_CALM
                self.transport.abort()  # a GOAWAY would only queue behind the rest
                return
        self.transport.write(data)
        self._note_buffer()

    def pause_writing(self) -> None:
        assert self.writer is not None
        self.writer.pause()

    def resume_writing(self) -> None:
        assert self.writer is not None
        self.control_bytes_unread = 0
        self.writer.resume()

    def _log_abuse(self, what: str) -> None:
        peer = self.transport.get_extra_info("peername")
        _log.warning("http2: closing the connection from %s: %s", peer, what)

    def _shut(self, code: h2.errors.ErrorCodes, what: str, *, goaway: bool = True) -> None:
        """GOAWAY with ``code`` (unless h2 queued one already), then end the connection."""
        if not self._writable():
            return
        self._log_abuse(what)
        self.shut_code = code
        for task in self.handlers:
            task.cancel()
        if goaway:
            with contextlib.suppress(h2.exceptions.H2Error):
                self.conn.close_connection(error_code=code)
        self.flush()
        assert self.writer is not None
        if self.writer.paused:  # the GOAWAY would only wait behind what the peer does not read
            self.transport.abort()
            return
        # Half-close, and discard what the peer still sends until it closes too: closing with
        # unread input would send a TCP reset, and the peer could lose the GOAWAY with it.
        if self.transport.can_write_eof():
            self.transport.write_eof()
            self._eof_sent = True
        else:
            self.transport.close()
        asyncio.get_running_loop().call_later(CLOSE_GRACE_S, self.transport.abort)

    def connection_lost(self, exc: Exception | None) -> None:
        self.server.protocols.discard(self)
        for task in self.handlers:
            task.cancel()
        if self.writer is not None:
            self.writer.closed = True
            self.writer.resume()
        self.flow.opened(None)

    def data_received(self, data: bytes) -> None:
        if self.shut_code is not None:
            return  # closing: discarded
        try:
            self.guard.feed(data)  # before h2: it would buffer a whole frame to judge it
        except h2guard.GuardError as exc:
            self._shut(exc.error_code, str(exc))
            return
        try:
            events = self.conn.receive_data(data)
        except h2.exceptions.ProtocolError as exc:
            # h2 queued a GOAWAY: PROTOCOL_ERROR, FRAME_SIZE_ERROR, or ENHANCE_YOUR_CALM for a
            # header list over MAX_HEADER_LIST_SIZE (an HPACK bomb is refused as it inflates)
            code = getattr(exc, "error_code", h2.errors.ErrorCodes.PROTOCOL_ERROR)
            self._shut(code, f"h2: {exc}", goaway=False)
            return
        self._write_control(self.conn.data_to_send())  # h2's own answers: ACKs
        for event in events:
            if self.shut_code is not None:
                return
            self._event(event)
        self.flush()

    def _event(self, event: h2.events.Event) -> None:
        if isinstance(event, h2.events.RequestReceived):
            if len(self.handlers) >= MAX_CONCURRENT_STREAMS:
                # handlers of reset streams still ending count too: h2 already forgot them
                self._refuse(event.stream_id)
                return
            headers = {
                bytes(k).decode("latin-1").lower(): bytes(v).decode("latin-1")
                for k, v in event.headers or ()
            }
            self.streams[event.stream_id] = _ServerStream(headers)
            if event.stream_ended is not None:
                self._dispatch(event.stream_id)
        elif isinstance(event, h2.events.DataReceived):
            stream = self.streams.get(event.stream_id)
            self.conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            if stream is None or event.data is None:
                return
            stream.body_bytes += len(event.data)
            if stream.body_bytes > self.server.limits.max_message_bytes:
                if not stream.refused:
                    stream.refused = True
                    stream.body = []
                    self._spawn(event.stream_id, self._answer_refused(event.stream_id))
            elif not stream.refused:
                stream.body.append(event.data)
        elif isinstance(event, h2.events.StreamEnded):
            stream = self.streams.get(event.stream_id)
            if stream is not None and not stream.refused:
                self._dispatch(event.stream_id)
        elif isinstance(event, h2.events.StreamReset):
            stream = self.streams.pop(event.stream_id, None)
            if stream is not None and stream.task is not None:
                stream.task.cancel()
            self.flow.forget(event.stream_id)
            if event.remote_reset:
                self._count_reset()
        elif isinstance(event, h2.events.WindowUpdated):
            self.flow.opened(event.stream_id)
        elif isinstance(event, h2.events.RemoteSettingsChanged):
            self.flow.opened(None)
        elif isinstance(event, h2.events.ConnectionTerminated):
            self.transport.close()

    def _refuse(self, stream_id: int) -> None:
        """RST_STREAM(REFUSED_STREAM): not processed, safe to retry (RFC 9113, 8.7)."""
        with contextlib.suppress(h2.exceptions.H2Error):
            self.conn.reset_stream(stream_id, h2.errors.ErrorCodes.REFUSED_STREAM)
        self._write_control(self.conn.data_to_send())
        self._count_reset()

    def _count_reset(self) -> None:
        """Spend one of the peer's reset budget (a token bucket); GOAWAY when it is gone."""
        self.resets += 1
        now = time.monotonic()
        self._reset_credit = min(
            float(RESET_BURST),
            self._reset_credit + (now - self._reset_credit_at) * RESET_RATE_PER_S,
        )
        self._reset_credit_at = now
        self._reset_credit -= 1.0
        if self._reset_credit < 0:
            self._shut(
                h2.errors.ErrorCodes.ENHANCE_YOUR_CALM,
                f"{self.resets} streams reset or refused (Rapid Reset, CVE-2023-44487)",
            )

    def _spawn(self, stream_id: int, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self.handlers.add(task)
        task.add_done_callback(self.handlers.discard)
        if len(self.handlers) > self.handlers_peak:
            self.handlers_peak = len(self.handlers)
            self.server.handlers_peak = max(self.server.handlers_peak, self.handlers_peak)
        stream = self.streams.get(stream_id)
        if stream is not None:
            stream.task = task

    def _dispatch(self, stream_id: int) -> None:
        stream = self.streams[stream_id]
        h = stream.headers
        try:
            response = self.server.app.handle(
                h.get(":method", ""), h.get(":path", ""), h, b"".join(stream.body), now_ns()
            )
        except Exception:
            _log.exception("http2: stream %d failed", stream_id)
            self.streams.pop(stream_id, None)
            self._reset(stream_id, h2.errors.ErrorCodes.INTERNAL_ERROR)
            return
        body = response.body
        if response.stream is None and len(body) <= min(
            self.conn.local_flow_control_window(stream_id), self.conn.max_outbound_frame_size
        ):
            # a unary answer that fits the window goes out now, without a task per request
            self.streams.pop(stream_id, None)
            self.conn.send_headers(
                stream_id,
                [
                    (":status", str(response.status)),
                    ("content-type", response.content_type),
                    ("content-length", str(len(body))),
                ],
                end_stream=not body,
            )
            if body:
                self.conn.send_data(stream_id, body, end_stream=True)
            return  # data_received flushes
        self._spawn(stream_id, self._respond(stream_id, response))

    async def _answer_refused(self, stream_id: int) -> None:
        with contextlib.suppress(h2.exceptions.H2Error, OSError, TransportTimeoutError):
            await self._send(stream_id, error(413, "body too large"))
            # a complete response before the request ended: RST_STREAM(NO_ERROR), RFC 9113 8.1
            self.conn.reset_stream(stream_id, h2.errors.ErrorCodes.NO_ERROR)
            self.flush()

    async def _respond(self, stream_id: int, response: Response) -> None:
        try:
            await self._send(stream_id, response)
        except (h2.exceptions.H2Error, OSError, asyncio.CancelledError):
            # the stream was reset or the connection lost: nothing left to answer
            self._reset(stream_id, h2.errors.ErrorCodes.CANCEL)
        except _PeerNotReadingError:
            _log.info("http2: stream %d: the peer stopped reading; closing", stream_id)
            self.transport.abort()
        except TransportTimeoutError:
            # its reader stopped opening the window: this stream alone ends
            _log.info(
                "http2: stream %d: no window for %.1f s; reset", stream_id, self.flow.timeout_s
            )
            self._reset(stream_id, h2.errors.ErrorCodes.CANCEL)
        except Exception:
            # a failure mid-answer: reset the stream, so the client sees it fail at once
            # rather than wait for a timeout; the connection and its other streams go on
            _log.exception("http2: stream %d failed", stream_id)
            self._reset(stream_id, h2.errors.ErrorCodes.INTERNAL_ERROR)
        finally:
            self.streams.pop(stream_id, None)
            self.flow.forget(stream_id)

    def _reset(self, stream_id: int, code: h2.errors.ErrorCodes) -> None:
        with contextlib.suppress(h2.exceptions.H2Error):
            if not self.transport.is_closing():
                self.conn.reset_stream(stream_id, code)
                self.flush()

    async def _send(self, stream_id: int, response: Response) -> None:
        assert self.writer is not None
        headers = [
            (":status", str(response.status)),
            ("content-type", response.content_type),
        ]
        if response.stream is None:
            headers.append(("content-length", str(len(response.body))))
            self.conn.send_headers(stream_id, headers, end_stream=not response.body)
            self.flush()
            if response.body:
                await self.flow.send(
                    self.conn, self.flush, self.writer, stream_id, response.body, True
                )
            return
        stamps = response.stamps
        self.conn.send_headers(stream_id, headers)
        self.flush()
        async with contextlib.aclosing(response.stream) as frames:
            async for frame in frames:
                if self.writer.closed:
                    raise ConnectionResetError("connection lost")
                if frame:
                    await self.flow.send(self.conn, self.flush, self.writer, stream_id, frame)
                if stamps is not None:
                    stamps.written()
        if stamps is not None:
            self.conn.send_headers(stream_id, [(TRAILER, stamps.pack_text())], end_stream=True)
        else:
            self.conn.end_stream(stream_id)
        self.flush()


class Http2Server(Server):
    transport: ClassVar[str] = "http2"

    def __init__(
        self, *args: object, registry: ic.SchemaRegistry | None = None, **kwargs: object
    ) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.app = HttpApp(self.service, self.codec, registry=registry)
        self.protocols: set[_H2ServerProtocol] = set()
        self.handlers_peak = 0
        """Most stream handlers one connection ran at once (at most MAX_CONCURRENT_STREAMS)."""
        self.outbound_peak = 0
        """Largest write buffer of any connection, in bytes."""
        if self.ssl_context is not None:
            self.ssl_context.set_alpn_protocols(["h2"])

    async def start(self) -> tuple[str, int]:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(
            lambda: _H2ServerProtocol(self),
            self.host,
            self.port,
            ssl=self.ssl_context,
            backlog=BACKLOG,
        )
        return self._bound(server)

    async def stop(self) -> None:
        for protocol in list(self.protocols):
            protocol.transport.abort()
        await super().stop()


class _NotProcessedError(StreamTruncatedError):
    """The server's GOAWAY says it never processed this stream: safe to send again."""


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


class _H2ClientProtocol(asyncio.Protocol):
    def __init__(self, timeout_s: float) -> None:
        self.conn = h2.connection.H2Connection(
            h2.config.H2Configuration(
                client_side=True,
                header_encoding=None,
                validate_outbound_headers=False,
                normalize_outbound_headers=False,
            )
        )
        self.streams: dict[int, _ClientStream] = {}
        self.flow = _FlowControl(timeout_s)
        self.writer: _Writer | None = None
        self.failure: Exception | None = None
        self.draining = False
        self.lost = asyncio.Event()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.writer = _Writer(transport)
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

    def connection_lost(self, exc: Exception | None) -> None:
        if self.writer is not None:
            self.writer.closed = True
            self.writer.resume()
        self._fail_all(StreamTruncatedError(f"http2: connection lost ({exc!r})"))
        self.lost.set()

    def data_received(self, data: bytes) -> None:
        try:
            events = self.conn.receive_data(data)
        except h2.exceptions.ProtocolError as exc:
            self.flush()
            self.transport.close()
            self._fail_all(ProtocolError(f"http2: {exc}"))
            return
        for event in events:
            stream_id = getattr(event, "stream_id", None)
            stream = self.streams.get(stream_id) if stream_id else None
            if isinstance(event, h2.events.ResponseReceived) and stream is not None:
                stream.headers = {
                    bytes(k).decode("latin-1"): bytes(v).decode("latin-1")
                    for k, v in event.headers or ()
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
                    bytes(k).decode("latin-1"): bytes(v).decode("latin-1")
                    for k, v in event.headers or ()
                }
            elif isinstance(event, h2.events.StreamEnded) and stream is not None:
                stream.complete = True
                stream.event.set()
            elif isinstance(event, h2.events.StreamReset) and stream is not None:
                if not (stream.complete and event.error_code == h2.errors.ErrorCodes.NO_ERROR):
                    stream.failure = CancelledByPeerError(
                        f"http2: stream reset by the server ({event.error_code!r})"
                    )
                stream.event.set()
                self.flow.reset(event.stream_id)  # a sender waiting for window stops waiting
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
                            stream.failure = _NotProcessedError(
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
    """One connection, every request a stream on it; opened on first use."""

    transport: ClassVar[str] = "http2"

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self._protocol: _H2ClientProtocol | None = None
        self.connections_opened = 0
        self._connecting = asyncio.Lock()
        authority = f"[{self.host}]" if ":" in self.host else self.host
        self._authority = f"{authority}:{self.port}"
        self._scheme = "https" if self.ssl_context is not None else "http"
        if self.ssl_context is not None:
            self.ssl_context.set_alpn_protocols(["h2"])

    async def _connection(self) -> _H2ClientProtocol:
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
                            lambda: _H2ClientProtocol(self.limits.timeout_s),
                            self.host,
                            self.port,
                            ssl=self.ssl_context,
                            server_hostname=self.host if self.ssl_context else None,
                        )
                except TimeoutError as exc:
                    raise TransportTimeoutError(f"http2: connect to {self._authority}") from exc
                except (OSError, ssl.SSLError) as exc:
                    raise ConnectError(f"http2: connect to {self._authority}: {exc}") from exc
                if self.ssl_context is not None:
                    sslobj = transport.get_extra_info("ssl_object")
                    if sslobj is None or sslobj.selected_alpn_protocol() != "h2":
                        transport.close()
                        raise ConnectError("http2: the server did not agree to h2 over ALPN")
                self._protocol = protocol
                self.connections_opened += 1
            return protocol

    async def _open(
        self, path: str, content_type: str, accept: str, body: bytes
    ) -> tuple[_H2ClientProtocol, int, _ClientStream]:
        if len(body) > self.limits.max_message_bytes:
            raise MessageTooLargeError(f"request of {len(body)} bytes is over the limit")
        protocol = await self._connection()
        conn = protocol.conn
        try:
            stream_id = conn.get_next_available_stream_id()
            stream = _ClientStream()
            protocol.streams[stream_id] = stream
            conn.send_headers(
                stream_id,
                [
                    (":method", "POST"),
                    (":scheme", self._scheme),
                    (":authority", self._authority),
                    (":path", path),
                    ("content-type", content_type),
                    ("accept", accept),
                    ("content-length", str(len(body))),
                ],
            )
            assert protocol.writer is not None
            await protocol.flow.send(conn, protocol.flush, protocol.writer, stream_id, body, True)
        except h2.exceptions.StreamClosedError:
            # the server answered (and closed the stream) before taking the whole body, as it
            # does with 413: its answer is what the caller reads next
            if stream.headers is None and stream.failure is None:
                stream.failure = ProtocolError("http2: stream closed before the request was sent")
        except h2.exceptions.H2Error as exc:
            raise ProtocolError(f"http2: {exc}") from exc
        except ConnectionResetError as exc:
            raise StreamTruncatedError("http2: connection lost while sending") from exc
        return protocol, stream_id, stream

    async def _wait(self, stream: _ClientStream) -> None:
        try:
            async with asyncio.timeout(self.limits.timeout_s):
                await stream.event.wait()
        except TimeoutError as exc:
            raise TransportTimeoutError("http2: read timed out") from exc
        stream.event.clear()

    async def _headers(self, stream: _ClientStream) -> int:
        while stream.headers is None:
            if stream.failure is not None:
                raise stream.failure
            await self._wait(stream)
        return int(stream.headers.get(":status", "0"))

    def _ack(self, protocol: _H2ClientProtocol, stream_id: int, stream: _ClientStream) -> None:
        if stream.unacked and not protocol.transport.is_closing():
            with contextlib.suppress(h2.exceptions.H2Error):
                protocol.conn.acknowledge_received_data(stream.unacked, stream_id)
                protocol.flush()
        stream.unacked = 0

    async def _body(
        self, protocol: _H2ClientProtocol, stream_id: int, stream: _ClientStream
    ) -> bytes:
        size = 0
        parts: list[bytes] = []
        while True:
            if stream.data:
                size += sum(map(len, stream.data))
                parts += stream.data
                stream.data = []
                if size > self.limits.max_message_bytes:
                    raise MessageTooLargeError("http2: response over the limit")
                self._ack(protocol, stream_id, stream)
            if stream.complete:
                return b"".join(parts)
            if stream.failure is not None:
                raise stream.failure
            await self._wait(stream)

    def _finish(self, protocol: _H2ClientProtocol, stream_id: int, stream: _ClientStream) -> None:
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
    ) -> tuple[_H2ClientProtocol, int, _ClientStream, int]:
        """Open a stream and read its response headers; a stream the server's GOAWAY says it
        never processed is sent once more, on a new connection (RFC 9113 6.8)."""
        for attempt in (1, 2):
            protocol, stream_id, stream = await self._open(path, content_type, accept, body)
            if timing is not None:
                timing.request_sent_ns = now_ns()
            try:
                return protocol, stream_id, stream, await self._headers(stream)
            except _NotProcessedError:
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
        try:
            return self.codec.decode(body, ic.InferResponse)
        except ic.CodecError as exc:
            raise ProtocolError(f"http2: {exc}") from exc

    async def generate(
        self, request: GenerateRequest, *, timing: StreamTiming | None = None
    ) -> AsyncIterator[ic.TokenChunk]:
        obj = {**request.to_json_obj(), "stream": True}
        if timing is not None:
            obj["timing"] = True
            timing.request_start_ns = now_ns()
        body = orjson.dumps(obj)
        protocol, stream_id, stream, status = await self._start(
            "/v1/chat/completions", "application/json", self.codec.stream_media_type, body, timing
        )
        count = 0
        try:
            if status != 200:
                raise RemoteError(
                    status, error_detail(await self._body(protocol, stream_id, stream))
                )
            decoder = self.codec.stream_decoder(max_frame_bytes=self.limits.max_message_bytes)
            while True:
                if stream.data:
                    data = b"".join(stream.data) if len(stream.data) > 1 else stream.data[0]
                    stream.data = []
                    received = now_ns() if timing is not None else 0
                    try:
                        chunks = decoder.feed(data)
                    except ic.CodecError as exc:
                        raise ProtocolError(f"http2: {exc}") from exc
                    if timing is not None:
                        timing.decoded(len(chunks), received)
                    for chunk in chunks:
                        count += 1
                        yield chunk
                    self._ack(protocol, stream_id, stream)  # consumed: open the window
                    continue
                if stream.complete:
                    break
                if stream.failure is not None:
                    if isinstance(stream.failure, StreamTruncatedError):
                        stream.failure.chunks_received = count
                    raise stream.failure
                await self._wait(stream)
            try:
                decoder.close()
            except ic.IncompleteStreamError as exc:
                raise StreamTruncatedError(
                    f"http2: stream ended after {count} chunks", chunks_received=count
                ) from exc
            if timing is not None:
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
