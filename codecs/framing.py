"""Stream framing shared by the codecs: length-prefixed binary frames, SSE and NDJSON.

Each framer is sans-IO and knows nothing of a message's format: it is given the codec's
``encode``/``decode`` functions for one message. Every stream ends with an explicit marker, so a
stream cut short is never taken for a complete one.

Binary frames are inferwire's own: one kind byte, a 4-byte big-endian payload length, the
payload. The 5-byte header has the layout of gRPC's length-prefixed message
(https://github.com/grpc/grpc/blob/master/doc/PROTOCOL-HTTP2.md) but is not gRPC's: its first
byte is a frame kind, not gRPC's compressed flag, and these frames never travel inside gRPC
(gRPC carries a codec's message stream, below). Kind 0 carries one message; kind 1 ends the
stream, and its payload is exactly 8 bytes: the number of messages sent, big-endian, which the
decoder checks. A fixed-width count rather than the schema's protobuf ``StreamEnd``: the end
frame is then checked from its header alone (length 8, nothing else), and the framing stays
independent of every message format, as the same end closes a MessagePack, FlatBuffers or
tensor stream. Any other kind byte is refused.

Transports that carry whole messages (gRPC) take a codec's *message* stream instead
(:meth:`~inferwire.codecs.Codec.message_encoder`): for a codec whose chunks are independent
messages, one unframed message per chunk, the transport's own end of call ending the stream
(:class:`MessageEncoder`); a stateful codec's stream frames, one a message, end marker included.

Server-sent events (https://html.spec.whatwg.org/multipage/server-sent-events.html): each
message is ``data: <json>\\n\\n`` and the stream ends with ``data: [DONE]\\n\\n``, exactly as
OpenAI-compatible servers send it. NDJSON: one JSON object a line, ending with the line
``{"object":"stream.end","count":N}``.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Callable
from typing import Any, Final, Generic, Literal, Protocol, TypeVar

from .errors import DecodeError, FrameTooLargeError, IncompleteStreamError

M = TypeVar("M")

BytesLike = bytes | bytearray | memoryview
"""What a decoder accepts."""

Framing = Literal["sse", "ndjson", "length-prefixed"]

DEFAULT_MAX_FRAME_BYTES: Final = 64 * 1024 * 1024
"""Largest frame a stream decoder accepts unless told otherwise (64 MiB)."""


class StreamEncoder(Protocol):
    """Sans-IO encoder of one stream: one call per chunk, then :meth:`end` once."""

    def encode(self, message: Any, /) -> bytes: ...

    def end(self) -> bytes: ...


class StreamDecoder(Protocol[M]):
    """Sans-IO decoder of one stream.

    :meth:`feed` takes bytes in any split and returns the messages they completed;
    :meth:`close` raises :class:`~inferwire.codecs.IncompleteStreamError` if the stream ended
    mid-frame or before its end marker. ``finished`` is true once the end marker was read.
    """

    @property
    def finished(self) -> bool: ...

    def feed(self, data: BytesLike, /) -> list[M]: ...

    def close(self) -> None: ...


FRAME_HEADER: Final = struct.Struct(">BI")
KIND_MESSAGE: Final = 0
KIND_END: Final = 1
_END_PAYLOAD: Final = struct.Struct(">Q")

SSE_DONE: Final = b"data: [DONE]\n\n"
NDJSON_END_PREFIX: Final = b'{"object":"stream.end","count":'


def frame(payload: bytes) -> bytes:
    """One length-prefixed message frame."""
    return FRAME_HEADER.pack(KIND_MESSAGE, len(payload)) + payload


class _CountingEncoder:
    """Holds the codec's one-message ``encode`` and how many messages went out."""

    __slots__ = ("_encode", "count")

    def __init__(self, encode: Callable[[Any], bytes]) -> None:
        self._encode = encode
        self.count = 0


class LengthPrefixedEncoder(_CountingEncoder):
    """Frames each message the codec encodes; :meth:`end` writes the count-carrying end."""

    __slots__ = ()

    def encode(self, message: object, /) -> bytes:
        payload = self._encode(message)
        self.count += 1
        return FRAME_HEADER.pack(KIND_MESSAGE, len(payload)) + payload

    def end(self) -> bytes:
        return FRAME_HEADER.pack(KIND_END, _END_PAYLOAD.size) + _END_PAYLOAD.pack(self.count)


class _BufferedDecoder:
    """Holds unconsumed bytes and the end-of-stream state shared by every stream decoder."""

    __slots__ = ("_buffer", "_decode", "_scan", "count", "finished", "max_frame_bytes")

    def __init__(
        self, decode: Callable[[bytes], Any], max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES
    ) -> None:
        if max_frame_bytes <= 0:
            raise ValueError("max_frame_bytes must be positive")
        self._decode = decode
        self._buffer = bytearray()
        self.max_frame_bytes = max_frame_bytes
        self.finished = False
        self.count = 0
        # Where a delimiter search resumes, so bytes fed one at a time are not rescanned.
        self._scan = 0

    def _check_open(self, data: BytesLike) -> None:
        if self.finished and len(data):
            raise DecodeError("bytes after the end of the stream")

    def close(self) -> None:
        if not self.finished:
            state = "mid-frame" if self._buffer else "without its end marker"
            raise IncompleteStreamError(f"stream ended {state} after {self.count} messages")


class LengthPrefixedDecoder(_BufferedDecoder, Generic[M]):
    """Reads :class:`LengthPrefixedEncoder` frames; refuses an oversized frame from its header."""

    __slots__ = ()

    def feed(self, data: BytesLike, /) -> list[M]:
        self._check_open(data)
        buffer = self._buffer
        if buffer:
            buffer += data
            view: bytes | bytearray = buffer
        else:
            # The common case: a transport hands over whole frames. Parse them in place; the
            # slices taken below are copies, so no decoder keeps a view of the caller's buffer.
            view = data if type(data) is bytes else bytes(data)
        out: list[M] = []
        pos = 0
        end = len(view)
        unpack = FRAME_HEADER.unpack_from
        while end - pos >= 5:
            kind, length = unpack(view, pos)
            if length > self.max_frame_bytes:
                raise FrameTooLargeError(length, self.max_frame_bytes)
            if kind == KIND_END and length != _END_PAYLOAD.size:
                raise DecodeError(f"end frame of {length} bytes, expected 8")
            if kind != KIND_MESSAGE and kind != KIND_END:
                raise DecodeError(f"unknown frame kind {kind:#04x}")
            start = pos + 5
            if end - start < length:
                break
            if kind == KIND_MESSAGE:
                out.append(self._decode(bytes(view[start : start + length])))
                self.count += 1
                pos = start + length
            else:
                (sent,) = _END_PAYLOAD.unpack_from(view, start)
                if sent != self.count:
                    raise DecodeError(f"stream sent {sent} messages, {self.count} arrived")
                pos = start + length
                if pos != end:
                    raise DecodeError("bytes after the end of the stream")
                self.finished = True
                break
        if view is buffer:
            del buffer[:pos]
        elif pos < end:
            buffer += view[pos:]
        return out


# SSE lines end in CRLF, LF or CR; an event ends at an empty line.
_SSE_EVENT_END: Final = re.compile(rb"(?:\r\n|\r(?!\n)|\n)(?:\r\n|\r(?!\n)|\n)")
_SSE_LINE: Final = re.compile(rb"\r\n|\r|\n")
_BOM: Final = b"\xef\xbb\xbf"


class SseEncoder(_CountingEncoder):
    """``data: <json>`` events ending with ``data: [DONE]`` (OpenAI's stream framing)."""

    __slots__ = ()

    def encode(self, message: object, /) -> bytes:
        self.count += 1
        return b"data: " + self._encode(message) + b"\n\n"

    def end(self) -> bytes:
        return SSE_DONE


class SseDecoder(_BufferedDecoder, Generic[M]):
    """Parses server-sent events per the WHATWG rules (HTML section 9.2.6, "Interpreting an event
    stream"); only ``data`` fields carry messages. The project's one SSE reader: the codecs' own
    streams and, with ``on_named_event``, any server's (the load generator's API targets), which
    may name an event (``event: error``): the hook gets each event whose name is not ``message``
    (its name and data) before its data is decoded, and may raise to end the stream."""

    __slots__ = ("_at_start", "_cr", "_on_named_event")

    def __init__(
        self,
        decode: Callable[[bytes], M],
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        *,
        on_named_event: Callable[[bytes, bytes], None] | None = None,
    ) -> None:
        super().__init__(decode, max_frame_bytes)
        self._on_named_event = on_named_event
        self._at_start = True
        # Until a CR shows up, events can only end in LF LF: a memchr-speed find, not the regex.
        self._cr = False

    def feed(self, data: BytesLike, /) -> list[M]:
        self._check_open(data)
        if type(data) is not bytes and type(data) is not bytearray:
            data = bytes(data)
        if not self._cr and b"\r" in data:
            self._cr = True
            self._scan = 0
        buffer = self._buffer
        out: list[M] = []
        if buffer or self._at_start:
            buffer += data
            view: bytes | bytearray = buffer
            if self._at_start:
                # WHATWG: one leading U+FEFF is stripped from the stream.
                if len(buffer) < len(_BOM) and _BOM.startswith(buffer):
                    return out
                if buffer.startswith(_BOM):
                    del buffer[: len(_BOM)]
                self._at_start = False
        else:
            view = data  # whole events, as transports usually hand them over: no copy
        pos = 0
        end = len(view)
        scan = self._scan
        while True:
            if self._cr:
                match = _SSE_EVENT_END.search(view, max(pos, scan))
                # A CR at the very end may be the first half of a CRLF: wait for the next byte.
                if match is None or (match.end() == end and view.endswith(b"\r")):
                    scan = max(pos, end - 3)  # an event end is at most 4 bytes (CRLF CRLF)
                    break
                event_end, after = match.start(), match.end()
            else:
                event_end = view.find(b"\n\n", max(pos, scan))
                if event_end < 0:
                    scan = max(pos, end - 1)
                    break
                after = event_end + 2
            if event_end - pos > self.max_frame_bytes:
                raise FrameTooLargeError(event_end - pos, self.max_frame_bytes)
            event = bytes(view[pos:event_end])
            payload = _sse_data(event)
            pos = after
            if self._on_named_event is not None and b"event:" in event:
                name = _sse_event_name(event)
                if name not in (b"", b"message"):
                    self._on_named_event(name, payload or b"")
            if payload is None:
                continue  # comment or an event with no data: nothing to dispatch
            if payload == b"[DONE]":
                if pos != end:
                    raise DecodeError("bytes after data: [DONE]")
                self.finished = True
                break
            out.append(self._decode(payload))
            self.count += 1
        if view is buffer:
            del buffer[:pos]
        elif pos < end:
            buffer += view[pos:]
        self._scan = max(0, scan - pos)
        # Up to 3 line-break bytes at the end (CRLF CR) may begin the blank line that ends the
        # event rather than belong to it: the limit is the same however the bytes were split.
        pending = len(buffer)
        while pending and len(buffer) - pending < 3 and buffer[pending - 1] in b"\r\n":
            pending -= 1
        if pending > self.max_frame_bytes:
            raise FrameTooLargeError(pending, self.max_frame_bytes)
        return out

    @property
    def pending(self) -> bool:
        """Whether an event has begun and not been dispatched (its blank line not seen)."""
        return bool(self._buffer.rstrip(b"\r\n"))

    def close(self) -> None:
        # Once the stream has ended, a CR at its end is a whole line ending (it can no longer
        # be the first half of a CRLF), so it may complete the last event: parse it as such.
        if not self.finished and self._buffer.endswith(b"\r"):
            self.feed(b"\n")
        super().close()


def _sse_data(event: bytes) -> bytes | None:
    """The joined ``data`` field values of one event, or ``None`` if it has none."""
    if event.startswith(b"data: ") and b"\n" not in event and b"\r" not in event:
        return event[6:]  # the common case: a single data line
    values = []
    for line in _SSE_LINE.split(event):
        if not line or line.startswith(b":"):
            continue
        name, colon, value = line.partition(b":")
        if colon and value.startswith(b" "):
            value = value[1:]
        if name == b"data":
            values.append(value)
    return b"\n".join(values) if values else None


def _sse_event_name(event: bytes) -> bytes:
    """The value of an event's last ``event`` field (b"" if none)."""
    name = b""
    for line in _SSE_LINE.split(event):
        field, colon, value = line.partition(b":")
        if field == b"event":
            name = value[1:] if colon and value.startswith(b" ") else value
    return name


class NdjsonEncoder(_CountingEncoder):
    """One JSON object a line; the last line counts the messages sent."""

    __slots__ = ()

    def encode(self, message: object, /) -> bytes:
        self.count += 1
        return self._encode(message) + b"\n"

    def end(self) -> bytes:
        return NDJSON_END_PREFIX + str(self.count).encode() + b"}\n"


class NdjsonDecoder(_BufferedDecoder, Generic[M]):
    __slots__ = ()

    def feed(self, data: BytesLike, /) -> list[M]:
        self._check_open(data)
        buffer = self._buffer
        buffer += data
        out: list[M] = []
        pos = 0
        while (newline := buffer.find(b"\n", max(pos, self._scan))) >= 0:
            if newline - pos > self.max_frame_bytes:
                raise FrameTooLargeError(newline - pos, self.max_frame_bytes)
            line = bytes(buffer[pos:newline]).removesuffix(b"\r")  # CRLF lines too
            pos = newline + 1
            if line.startswith(NDJSON_END_PREFIX):
                count = line[len(NDJSON_END_PREFIX) :]
                if not count.endswith(b"}") or not count[:-1].isdigit():
                    raise DecodeError(f"malformed NDJSON end line {line[:64]!r}")
                if int(count[:-1]) != self.count + len(out):
                    raise DecodeError(
                        f"stream sent {int(count[:-1])} messages, {self.count + len(out)} arrived"
                    )
                if pos != len(buffer):
                    raise DecodeError("bytes after the end of the stream")
                self.finished = True
                break
            out.append(self._decode(line))
        self.count += len(out)
        self._scan = len(buffer) - pos
        del buffer[:pos]
        if len(buffer) > self.max_frame_bytes:
            raise FrameTooLargeError(len(buffer), self.max_frame_bytes)
        return out


class MessageEncoder(_CountingEncoder):
    """One unframed message per chunk, for a transport that frames messages itself (gRPC): its
    end of call ends the stream, so :meth:`end` has nothing to add."""

    __slots__ = ()

    def encode(self, message: object, /) -> bytes:
        self.count += 1
        return self._encode(message)

    def end(self) -> bytes:
        return b""


class MessageDecoder(Generic[M]):
    """Reads what :class:`MessageEncoder` wrote: each :meth:`feed` is exactly one message.

    The transport's end of call is the stream's end, so :meth:`close` has nothing to check; a
    message over ``max_frame_bytes`` is refused before it is decoded."""

    __slots__ = ("_decode", "count", "finished", "max_frame_bytes")

    def __init__(
        self, decode: Callable[[BytesLike], M], max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES
    ) -> None:
        if max_frame_bytes <= 0:
            raise ValueError("max_frame_bytes must be positive")
        self._decode = decode
        self.max_frame_bytes = max_frame_bytes
        self.count = 0
        self.finished = False

    def feed(self, data: BytesLike, /) -> list[M]:
        if self.finished:
            raise DecodeError("a message after the end of the stream")
        size = data.nbytes if type(data) is memoryview else len(data)
        if size > self.max_frame_bytes:
            raise FrameTooLargeError(size, self.max_frame_bytes)
        message = self._decode(data)
        self.count += 1
        return [message]

    def close(self) -> None:
        self.finished = True


def framed_encoder(framing: Framing, encode: Callable[[Any], bytes]) -> StreamEncoder:
    """A stream encoder of ``framing`` around a one-message ``encode``: the framing alone, for
    what is not a codec's message (a codec's own stream is
    :meth:`~inferwire.codecs.Codec.stream_encoder`)."""
    if framing == "sse":
        return SseEncoder(encode)
    if framing == "ndjson":
        return NdjsonEncoder(encode)
    return LengthPrefixedEncoder(encode)


def framed_decoder(
    framing: Framing, decode: Callable[[bytes], M], max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES
) -> StreamDecoder[M]:
    """A stream decoder of ``framing`` around a one-message ``decode`` (a codec's own is
    :meth:`~inferwire.codecs.Codec.stream_decoder`)."""
    if framing == "sse":
        return SseDecoder(decode, max_frame_bytes)
    if framing == "ndjson":
        return NdjsonDecoder(decode, max_frame_bytes)
    return LengthPrefixedDecoder(decode, max_frame_bytes)
