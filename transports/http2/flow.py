"""What both ends of an HTTP/2 connection share: h2's configuration, flow control, and write
back-pressure.

RFC 9113, section 5.2: a sender writes no more than the stream's window and the connection's,
then waits for a WINDOW_UPDATE, so a slow reader stalls only its own stream. A write to a
socket whose buffer is full waits (for at most the limits' ``timeout_s``) until it drains.
"""

from __future__ import annotations

import asyncio
from typing import Any, Final

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
from hyperframe.frame import Frame, RstStreamFrame

from ..errors import PeerNotReadingError, TransportTimeoutError
from .hpack_cache import CachingDecoder, CachingEncoder

WINDOW_BYTES: Final = 1 << 20
"""Initial stream window each end advertises: 1 MiB (h2's default 64 KiB would stall a fast
stream on loopback every few frames)."""


class Connection(h2.connection.H2Connection):
    """h2's connection, less one cost: h2 formats every frame it receives for its trace log
    (``repr(frame)``, whatever the logger), about 1 us a frame, 4-6% of a small unary call
    over both ends. ``_receive_frame`` is h2's own (the same in h2 4.1-4.4) without that
    line; tests/test_http2_fastpath.py feeds the same bytes to this and to a stock
    connection, through each of the method's branches, and checks they answer alike."""

    def _receive_frame(self, frame: Frame) -> list[h2.events.Event]:
        events: list[h2.events.Event]
        try:
            frames, events = self._frame_dispatch_table[frame.__class__](frame)
        except h2.exceptions.StreamClosedError as e:
            # closed by RST_STREAM: a stream error, answered with RST_STREAM; else the caller's
            # connection error
            if self._stream_is_closed_by_reset(e.stream_id):
                f = RstStreamFrame(e.stream_id)
                f.error_code = e.error_code
                self._prepare_for_sending([f])
                events = e._events
            else:
                raise
        except h2.exceptions.StreamIDTooLowError as e:
            # a stream closed and forgotten, or closed implicitly by a newer one: by RST_STREAM
            # a stream error, by END_STREAM or implicitly a connection error
            if self._stream_is_closed_by_reset(e.stream_id):
                f = RstStreamFrame(e.stream_id)
                f.error_code = h2.errors.ErrorCodes.STREAM_CLOSED
                self._prepare_for_sending([f])
                events = []
            elif self._stream_is_closed_by_end(e.stream_id):
                raise h2.exceptions.StreamClosedError(e.stream_id) from e
            else:
                raise
        else:
            self._prepare_for_sending(frames)
        return events


def h2_connection(*, client_side: bool) -> h2.connection.H2Connection:
    """An h2 connection with outbound checks off (we build every header we send); the inbound
    ones (peers lie) are h2's own, run by the caller through :class:`.fields.InboundFields`
    with a memory of lists that passed, so they are off in h2. Header names and values stay
    bytes. It skips h2's formatting of each received frame for its trace log (:class:`Connection`).
    Its HPACK encoder and decoder remember the blocks that leave the dynamic table as it
    was (:mod:`.hpack_cache`), set before the connection has encoded or decoded anything."""
    conn = Connection(
        h2.config.H2Configuration(
            client_side=client_side,
            header_encoding=None,
            validate_outbound_headers=False,
            normalize_outbound_headers=False,
            validate_inbound_headers=False,
            normalize_inbound_headers=False,
        )
    )
    conn.encoder = CachingEncoder()
    conn.decoder = CachingDecoder(conn.decoder.max_header_list_size)
    return conn


class Writer:
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
                raise PeerNotReadingError("http2: the peer stopped reading") from exc


class FlowControl:
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
        writer: Writer,
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
