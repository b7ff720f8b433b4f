"""Server-sent events, read as the WHATWG HTML standard defines them (section 9.2.6,
"Interpreting an event stream"), sans-IO: :meth:`SseReader.feed` takes bytes as they arrive and
returns the events they complete.

Written here rather than taken from a library: the SSE readers on PyPI (httpx-sse,
sseclient-py, aiohttp-sse-client) each sit on one HTTP client's response object, and the load
generator reads its own sockets; the format is small. Lines end in CRLF, LF or CR; a line
starting with ``:`` is a comment (the keep-alives servers send); ``data`` lines accumulate,
joined by ``\\n``; a blank line dispatches the event; ``event`` names it. Size is bounded: a
line or an event over ``max_event_bytes`` raises :class:`SseError`, so a server that never
ends a line cannot take unbounded memory.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from inferwire.transports import ProtocolError

DEFAULT_MAX_EVENT_BYTES: Final = 16 << 20


class SseError(ProtocolError):
    """An event stream that breaks the format's limits."""


@dataclass(frozen=True, slots=True)
class SseEvent:
    data: bytes
    event: str = "message"


class SseReader:
    __slots__ = ("_buffer", "_data", "_event", "_has_data", "_max", "_size", "_started")

    def __init__(self, max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES) -> None:
        self._max = max_event_bytes
        self._buffer = b""
        self._data: list[bytes] = []
        self._size = 0
        self._has_data = False
        self._event = ""
        self._started = False

    def feed(self, data: bytes) -> list[SseEvent]:
        """The events that ``data`` completes, in order."""
        buffer = self._buffer + data if self._buffer else data
        if not self._started and buffer:
            if buffer.startswith(b"\xef\xbb\xbf"):  # a leading byte order mark is dropped
                buffer = buffer[3:]
            elif len(buffer) < 3 and b"\xef\xbb\xbf".startswith(buffer):
                self._buffer = buffer
                return []
            self._started = True
        events: list[SseEvent] = []
        start = 0
        size = len(buffer)
        while start < size:
            lf = buffer.find(b"\n", start)
            cr = buffer.find(b"\r", start, lf if lf >= 0 else size)
            if cr >= 0:
                if cr == size - 1:  # a CR last: the LF of a CRLF may be in the next bytes
                    break
                end, after = cr, cr + 2 if buffer[cr + 1] == 0x0A else cr + 1
            elif lf >= 0:
                end, after = lf, lf + 1
            else:
                break
            self._line(buffer[start:end], events)
            start = after
        self._buffer = buffer[start:]
        if len(self._buffer) > self._max:
            raise SseError(f"an event-stream line of over {self._max} bytes")
        return events

    def _line(self, line: bytes, events: list[SseEvent]) -> None:
        if not line:
            if self._has_data:
                events.append(SseEvent(b"\n".join(self._data), self._event or "message"))
            self._data = []
            self._size = 0
            self._has_data = False
            self._event = ""
            return
        if line[0] == 0x3A:  # ":" a comment
            return
        name, colon, value = line.partition(b":")
        if colon and value[:1] == b" ":
            value = value[1:]
        if name == b"data":
            self._data.append(value)
            self._has_data = True
            self._size += len(value) + 1
            if self._size > self._max:
                raise SseError(f"an event of over {self._max} bytes")
        elif name == b"event":
            self._event = value.decode("utf-8", "replace")
        # "id" and "retry" concern reconnection, which a generator never does; others are ignored

    @property
    def pending(self) -> bool:
        """Whether an event has begun and not been dispatched (its blank line not seen)."""
        return self._has_data or bool(self._buffer)
