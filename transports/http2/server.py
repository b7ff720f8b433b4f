"""The HTTP/2 server: h2 (sans-IO) on an asyncio protocol, routes of
:mod:`inferwire.transports.httpapp`, h2c (prior knowledge) or TLS with ALPN ``h2``.

A request whose body passes the limit is answered 413 and reset; a stream reset by the peer
cancels its handler.

The server defends itself against hostile peers where h2 leaves that to the application (the
frame-level checks are in :mod:`inferwire.transports.h2guard`):

* streams are counted against the advertised ``MAX_CONCURRENT_STREAMS`` as RFC 9113, section
  5.1.2 counts them: open and half-closed ones. h2 keeps that count (a stream whose response
  ended, both sides closed, leaves it at once, whatever its handler still does), and a peer that
  opens one more breaks the protocol: h2 ends the connection with GOAWAY(PROTOCOL_ERROR), the
  stream error made a connection error as section 5.4.1 allows;
* Rapid Reset (CVE-2023-44487): a stream the peer resets leaves that count at once, but its
  handler runs until the cancellation reaches it, so a peer that opens and resets streams
  could keep any number running. No more than ``MAX_HANDLERS`` (twice the stream limit: every
  stream a client may have open, and as many reset ones still ending) run at once; a stream
  past that is refused (RST_STREAM(REFUSED_STREAM): not processed, safe to retry, section 8.7),
  and a peer that resets streams faster than ``RESET_RATE_PER_S`` (after a burst of
  ``RESET_BURST``) is sent GOAWAY(ENHANCE_YOUR_CALM). Only the peer's resets spend that budget:
  a refusal is the server's doing, and refusals happen only while reset streams are ending;
* a peer that does not read: h2's own answers (PING and SETTINGS ACKs) and our refusals queued
  while the socket is backed up are capped at ``CONTROL_BYTES_CAP``; a sender that waits on a
  backed-up socket or on a stream window gives up after the limits' ``timeout_s`` (the stream is
  reset, or the connection closed when the whole socket is stuck).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any, ClassVar, Final, cast

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.settings

from inferwire.codecs.schema_registry import SchemaRegistry

from .. import h2guard
from ..base import Server
from ..common import BACKLOG, log_failure
from ..compression import Compression
from ..errors import PeerLimitError, PeerNotReadingError, TransportTimeoutError
from ..httpapp import HttpApp, Response, error
from ..metrics import outcome_of
from ..openai_api import OpenAIOptions
from ..timing import TRAILER, now_ns
from .fields import InboundFields
from .flow import WINDOW_BYTES, FlowControl, Writer, h2_connection

_log = logging.getLogger(__name__)

MAX_CONCURRENT_STREAMS: Final = 256
"""SETTINGS_MAX_CONCURRENT_STREAMS, as advertised: open and half-closed streams (RFC 9113,
5.1.2)."""
MAX_HANDLERS: Final = 2 * MAX_CONCURRENT_STREAMS
"""Stream handlers one connection may run at once: those of the streams a client may have
open, and as many again of streams it reset whose handlers have not ended yet."""
MAX_HEADER_LIST_BYTES: Final = 16 * 1024
MAX_HEADER_BLOCK_BYTES: Final = 2 * MAX_HEADER_LIST_BYTES
"""Largest compressed header block (HEADERS + CONTINUATION) taken in: HPACK never makes a
block much larger than the header list it decodes to, so twice the list limit is generous."""
MAX_IDLE_FRAMES: Final = 10_000
"""PING, SETTINGS, PRIORITY and empty DATA frames in a row, with no request moving forward."""
RESET_BURST: Final = 1000
RESET_RATE_PER_S: Final = 100.0
"""Streams the peer may reset in a burst, and per second after it: far more than a client that
cancels what it no longer needs, far fewer than a Rapid Reset attack."""
CONTROL_BYTES_CAP: Final = 1 << 20
"""Bytes of PING/SETTINGS ACKs and refusals queued to a peer that is not reading."""
CLOSE_GRACE_S: Final = 2.0
"""How long a GOAWAY may take to leave before the connection is dropped regardless."""


class _ServerStream:
    __slots__ = ("body", "body_bytes", "headers", "refused", "task")

    def __init__(self, headers: dict[str, str]) -> None:
        self.headers = headers
        self.body: list[bytes] = []
        self.body_bytes = 0
        self.refused = False
        self.task: asyncio.Task[None] | None = None


class ServerProtocol(asyncio.Protocol):
    def __init__(self, server: Http2Server) -> None:
        self.server = server
        self.conn = h2_connection(client_side=False)
        self.fields = InboundFields(client_side=False)
        self._header_dicts: dict[tuple[tuple[bytes, bytes], ...], dict[str, str]] = {}
        """Request headers as the routes take them, by checked field list (bounded like it)."""
        self.streams: dict[int, _ServerStream] = {}
        self.flow = FlowControl(server.limits.timeout_s)
        self.writer: Writer | None = None
        self.guard = h2guard.FrameGuard(
            max_frame_bytes=self.conn.local_settings.max_frame_size,
            max_header_block_bytes=MAX_HEADER_BLOCK_BYTES,
            max_idle_frames=MAX_IDLE_FRAMES,
        )
        self.handlers: set[asyncio.Task[None]] = set()
        """Stream handlers running; each leaves as its work returns (see ``_handler_done``)."""
        self.handlers_peak = 0
        self.resets = 0
        """Streams the peer reset: for the Rapid Reset budget."""
        self.refusals = 0
        """Streams refused because ``MAX_HANDLERS`` handlers were running."""
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
        # uvloop's transports implement asyncio.Transport's methods without subclassing it
        transport = cast(asyncio.Transport, transport)
        self.transport = transport
        self.writer = Writer(transport, self.server.limits.timeout_s)
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
        except PeerLimitError as exc:
            self._shut(h2.errors.ErrorCodes(exc.error_code), str(exc))
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
            # h2 has counted the stream against MAX_CONCURRENT_STREAMS (section 5.1.2); past
            # that, the handlers of streams the peer reset, still ending, are the bound
            try:
                fields = self.fields.check(event.headers, trailer=False)
            except h2.exceptions.ProtocolError as exc:
                self._malformed(exc)
                return
            if len(self.handlers) >= MAX_HANDLERS:
                self._refuse(event.stream_id)
                return
            self.streams[event.stream_id] = _ServerStream(self._header_dict(fields))
            if event.stream_ended is not None:
                self._dispatch(event.stream_id)
        elif isinstance(event, h2.events.TrailersReceived):
            try:  # the routes take no trailers, but h2 would refuse malformed ones
                self.fields.check(event.headers, trailer=True)
            except h2.exceptions.ProtocolError as exc:
                self._malformed(exc)
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

    def _malformed(self, exc: h2.exceptions.ProtocolError) -> None:
        """A field list h2's checks refuse: GOAWAY(PROTOCOL_ERROR), as h2 sends when it runs
        them itself (a malformed request made a connection error, RFC 9113 5.4.1)."""
        self._shut(h2.errors.ErrorCodes.PROTOCOL_ERROR, f"h2: {exc}")

    def _header_dict(self, fields: tuple[tuple[bytes, bytes], ...]) -> dict[str, str]:
        known = self._header_dicts.get(fields)
        if known is None:
            known = {
                bytes(k).decode("latin-1").lower(): bytes(v).decode("latin-1") for k, v in fields
            }
            if len(self._header_dicts) >= 32:
                self._header_dicts.clear()
            self._header_dicts[fields] = known
        return dict(known)  # the routes may keep or change theirs

    def _refuse(self, stream_id: int) -> None:
        """RST_STREAM(REFUSED_STREAM): not processed, safe to retry (RFC 9113, 8.7). Not the
        peer's reset, so not in its Rapid Reset budget: its resets that made the handlers
        pile up were."""
        self.refusals += 1
        with contextlib.suppress(h2.exceptions.H2Error):
            self.conn.reset_stream(stream_id, h2.errors.ErrorCodes.REFUSED_STREAM)
        self._write_control(self.conn.data_to_send())

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
                f"{self.resets} streams reset by the peer (Rapid Reset, CVE-2023-44487)",
            )

    def _spawn(self, stream_id: int, coro: Any) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(coro)
        self.handlers.add(task)
        # for a task cancelled before it started (its work never runs, so never says it is done)
        task.add_done_callback(self.handlers.discard)
        if len(self.handlers) > self.handlers_peak:
            self.handlers_peak = len(self.handlers)
            self.server.handlers_peak = max(self.server.handlers_peak, self.handlers_peak)
        stream = self.streams.get(stream_id)
        if stream is not None:
            stream.task = task
        return task

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
            self.conn.send_headers(stream_id, _fields(response, len(body)), end_stream=not body)
            if body:
                self.conn.send_data(stream_id, body, end_stream=True)
            if response.meter is not None:
                response.meter.written(len(body))
                response.meter.answered(response.status)
            return  # data_received flushes: HEADERS and DATA leave in one write
        task = self._spawn(stream_id, self._respond(stream_id, response))
        meter = response.meter
        if meter is not None:  # a task cancelled before it ran (a reset) never ends its meter
            task.add_done_callback(lambda _: meter.finish("cancelled"))

    def _handler_done(self) -> None:
        """The running handler's work has returned: it leaves the count now, not when its
        done callback runs a loop turn later. By then the peer may have read its stream's end
        and sent new requests, which that turn's socket read takes in (under h2load, hundreds
        of finished handlers were still counted and their successors refused)."""
        task = asyncio.current_task()
        if task is not None:
            self.handlers.discard(cast("asyncio.Task[None]", task))

    async def _answer_refused(self, stream_id: int) -> None:
        try:
            refusal = error(413, "body too large")
            if self.server.metrics is not None:
                refusal.meter = self.server.metrics.start("unary")
            with contextlib.suppress(h2.exceptions.H2Error, OSError, TransportTimeoutError):
                await self._send(stream_id, refusal)
                # a complete response before the request ended: RST_STREAM(NO_ERROR), 8.1
                self.conn.reset_stream(stream_id, h2.errors.ErrorCodes.NO_ERROR)
                self.flush()
        finally:
            self._handler_done()

    async def _respond(self, stream_id: int, response: Response) -> None:
        try:
            await self._send(stream_id, response)
        except (h2.exceptions.H2Error, OSError, asyncio.CancelledError):
            # the stream was reset or the connection lost: nothing left to answer
            self._reset(stream_id, h2.errors.ErrorCodes.CANCEL)
        except PeerNotReadingError:
            _log.info("http2: stream %d: the peer stopped reading; closing", stream_id)
            self.transport.abort()
        except TransportTimeoutError:
            # its reader stopped opening the window: this stream alone ends
            _log.info(
                "http2: stream %d: no window for %.1f s; reset", stream_id, self.flow.timeout_s
            )
            self._reset(stream_id, h2.errors.ErrorCodes.CANCEL)
        except Exception as exc:
            # a failure mid-answer: reset the stream, so the client sees it fail at once
            # rather than wait for a timeout; the connection and its other streams go on
            log_failure(_log, f"http2: stream {stream_id} failed", exc)
            self._reset(stream_id, h2.errors.ErrorCodes.INTERNAL_ERROR)
        finally:
            self.streams.pop(stream_id, None)
            self.flow.forget(stream_id)
            self._handler_done()

    def _reset(self, stream_id: int, code: h2.errors.ErrorCodes) -> None:
        with contextlib.suppress(h2.exceptions.H2Error):
            if not self.transport.is_closing():
                self.conn.reset_stream(stream_id, code)
                self.flush()

    async def _send(self, stream_id: int, response: Response) -> None:
        meter = response.meter
        if meter is None:
            return await self._write(stream_id, response)
        try:
            await self._write(stream_id, response)
        except BaseException as exc:
            # h2's errors here: the stream was reset, or the connection lost
            meter.finish("cancelled" if isinstance(exc, h2.exceptions.H2Error) else outcome_of(exc))
            raise
        meter.answered(response.status)

    async def _write(self, stream_id: int, response: Response) -> None:
        """:meth:`_send`, with the meter's writes (of DATA: h2 writes the frames) and without
        its end."""
        assert self.writer is not None
        meter = response.meter
        if response.stream is None:
            headers = _fields(response, len(response.body))
            self.conn.send_headers(stream_id, headers, end_stream=not response.body)
            self.flush()
            if response.body:
                await self.flow.send(self.conn, self.flush, self.writer, stream_id, response.body)
                if meter is not None:
                    meter.written(len(response.body))
                # END_STREAM on its own, after the wait on a full socket buffer, not before it:
                # a handler does not outlive its stream waiting for the peer to read
                self.conn.end_stream(stream_id)
                self.flush()
            return
        stamps = response.stamps
        self.conn.send_headers(stream_id, _fields(response, None))
        self.flush()
        async with contextlib.aclosing(response.stream) as frames:
            async for frame in frames:
                if self.writer.closed:
                    raise ConnectionResetError("connection lost")
                if frame:
                    await self.flow.send(self.conn, self.flush, self.writer, stream_id, frame)
                    if meter is not None:
                        meter.written(len(frame))
                if stamps is not None:
                    stamps.written()
        if stamps is not None:
            self.conn.send_headers(stream_id, [(TRAILER, stamps.pack_text())], end_stream=True)
        else:
            self.conn.end_stream(stream_id)
        self.flush()


def _fields(response: Response, content_length: int | None) -> list[tuple[bytes, bytes]]:
    """A response's header fields, as bytes: h2 would encode str ones on every call, and the
    HPACK encoder remembers a list of plain byte tuples (:mod:`.hpack_cache`)."""
    fields = [
        (b":status", str(response.status).encode()),
        (b"content-type", response.content_type.encode()),
    ]
    if content_length is not None:
        fields.append((b"content-length", str(content_length).encode()))
    fields += [(k.encode(), v.encode()) for k, v in response.headers]
    return fields


class Http2Server(Server):
    transport: ClassVar[str] = "http2"

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
        self.protocols: set[ServerProtocol] = set()
        self.handlers_peak = 0
        """Most stream handlers one connection ran at once (at most MAX_HANDLERS)."""
        self.outbound_peak = 0
        """Largest write buffer of any connection, in bytes."""
        if self.ssl_context is not None:
            self.ssl_context.set_alpn_protocols(["h2"])

    async def start(self) -> tuple[str, int]:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(
            lambda: ServerProtocol(self),
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
        self.app.close()
