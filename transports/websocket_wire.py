"""The WebSocket transport's sans-IO half: the frames the server writes, whole messages out of
the frames websockets' protocol parses, the codec a subprotocol names, and what a close code
tells a client. No I/O here; :mod:`.websocket` runs it over asyncio streams.

What the wire carries (RFC 6455): see :mod:`.websocket`. Parsing what arrives, the opening
handshake, control frames (a ping is answered with a pong, section 5.5.2), the closing
handshake and the size limit are websockets' Sans-I/O protocol's (``websockets.protocol``);
this module joins fragments into messages, checks text for UTF-8 (section 8.1, which that layer
leaves to its asyncio one) and writes the server's data frames itself (:func:`data_frame`).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any, Final

import orjson

import inferwire.codecs as ic
from inferwire._runtime.extras import needs_extras
from inferwire.codecs.framing import StreamEncoder

from .errors import MessageTooLargeError, ProtocolError, RemoteError, TransportError

with needs_extras("the websocket transport"):
    from websockets.exceptions import PayloadTooBig
    from websockets.exceptions import ProtocolError as LibraryProtocolError
    from websockets.frames import Close, CloseCode, Opcode
    from websockets.protocol import Protocol, State
    from websockets.typing import Subprotocol

__all__ = [
    "CHAT_PATH",
    "DONE",
    "SUBPROTOCOL_PREFIX",
    "TIMING_KEY",
    "CloseCode",
    "FramedMessages",
    "Message",
    "Messages",
    "ServerMessages",
    "close_error",
    "data_frame",
    "error_status",
    "subprotocol",
]

CHAT_PATH: Final = "/v1/chat/completions"
SUBPROTOCOL_PREFIX: Final = "inferwire."
"""``Sec-WebSocket-Protocol: inferwire.<codec>`` asks for a codec's messages."""
DONE: Final = b"[DONE]"
"""The last data message of a stream, as OpenAI's last server-sent event is ``data: [DONE]``."""
TIMING_KEY: Final = "x-inferwire-timing"
"""The key of the text message that carries a timed stream's server stamps, before
``[DONE]`` (only to a request that asked with ``"timing": true``)."""
_TIMING_PREFIX: Final = b'{"' + TIMING_KEY.encode() + b'":'
_ERROR_PREFIX: Final = b'{"error":'

_TEXT: Final = 0x81
"""FIN and the text opcode: every frame the server writes is a whole message (section 5.2)."""
_BINARY: Final = 0x82
_DATA: Final = frozenset((_TEXT, _BINARY))
_TEXT_HEADS: Final = tuple(bytes((_TEXT, size)) for size in range(126))
"""The two-byte header of each short frame, made once: most chunks are short."""
_BINARY_HEADS: Final = tuple(bytes((_BINARY, size)) for size in range(126))
_MEDIUM: Final = struct.Struct(">BBH")
_LONG: Final = struct.Struct(">BBQ")

Message = tuple[bool, Any]
"""A whole message: whether it is text, and its payload (bytes or bytearray)."""


def subprotocol(codec_name: str) -> Subprotocol:
    return Subprotocol(SUBPROTOCOL_PREFIX + codec_name)


def data_frame(payload: bytes, *, text: bool) -> bytes:
    """One unfragmented, unmasked data frame (RFC 6455 section 5.2; a server never masks,
    5.1). Written here rather than by the library's ``Frame.serialize``, whose generality
    (extensions, masking, checks) costs more than the rest of a small message's trip: this is
    a 2-10 byte header joined to the payload."""
    size = len(payload)
    if size < 126:
        return (_TEXT_HEADS if text else _BINARY_HEADS)[size] + payload
    first = _TEXT if text else _BINARY
    if size < 65536:
        return _MEDIUM.pack(first, 126, size) + payload
    return _LONG.pack(first, 127, size) + payload


class FramedMessages:
    """A stream encoder whose bytes are WebSocket frames: each message of ``messages`` (a
    codec's :meth:`~inferwire.codecs.Codec.message_encoder`, or plain objects) one data frame,
    text or binary; :meth:`end` frames the codec's end message, if its stream has one (a
    stateful codec's). ``[DONE]`` is the transport's, written after it."""

    __slots__ = ("_encode", "_end", "_heads", "_text")

    def __init__(self, messages: StreamEncoder, *, text: bool) -> None:
        self._encode = messages.encode
        self._end = messages.end
        self._text = text
        self._heads = _TEXT_HEADS if text else _BINARY_HEADS

    def encode(self, message: Any, /) -> bytes:
        payload = self._encode(message)
        size = len(payload)
        if size < 126:  # data_frame's short case, inline: once per chunk
            return self._heads[size] + payload
        return data_frame(payload, text=self._text)

    def end(self) -> bytes:
        last = self._end()
        return data_frame(last, text=self._text) if last else b""


class Messages:
    """Whole messages out of the frames that ``protocol`` (websockets' Sans-I/O connection,
    either side, after its handshake) parses: fragments joined (the protocol bounds a
    message's total at its ``max_size``, and fails the connection with 1009 beyond it), text
    checked as UTF-8 (else the connection fails with 1007, RFC 6455 section 8.1). What the
    protocol has to send in answer (a pong, a close) waits in its ``data_to_send()``.

    :meth:`feed` raises :class:`MessageTooLargeError` or :class:`ProtocolError` when the
    peer broke a limit or the protocol; the close frame that says so is then queued too."""

    __slots__ = ("_parts", "_text", "close", "protocol")

    def __init__(self, protocol: Protocol) -> None:
        self.protocol = protocol
        self._parts: list[Any] = []
        self._text = False
        self.close: Close | None = None
        """The peer's close frame, once it came."""

    def feed(self, data: bytes) -> list[Message]:
        protocol = self.protocol
        protocol.receive_data(data)
        return self.frames(protocol.events_received())

    def frames(self, events: Sequence[Any]) -> list[Message]:
        """The messages ``events`` (frames the protocol parsed) complete."""
        out: list[Message] = []
        for frame in events:
            opcode = frame.opcode
            if opcode is Opcode.TEXT or opcode is Opcode.BINARY:
                if frame.fin:
                    out.append((opcode is Opcode.TEXT, frame.data))
                else:
                    self._text = opcode is Opcode.TEXT
                    self._parts = [frame.data]
            elif opcode is Opcode.CONT:
                self._parts.append(frame.data)
                if frame.fin:
                    out.append((self._text, b"".join(self._parts)))
                    self._parts = []
            elif opcode is Opcode.CLOSE:
                self.close = self.protocol.close_rcvd
        failure = self.protocol.parser_exc
        if failure is not None and not isinstance(failure, EOFError):
            raise _ours(failure)
        for text, payload in out:
            if text:
                self._check_text(payload)
        return out

    def _check_text(self, payload: Any) -> None:
        try:
            payload.decode()
        except UnicodeDecodeError as exc:
            reason = f"invalid UTF-8 at byte {exc.start} of a text message"
            self.protocol.fail(CloseCode.INVALID_DATA, reason)
            raise ProtocolError(f"websocket: {reason}") from exc


class ServerMessages(Messages):
    """A client's :class:`Messages`, with the data frames a server writes parsed here.

    Written by hand for one shape only, a whole (FIN), unmasked text or binary frame with no
    reserved bits (what :func:`data_frame` writes, and all a server sends a stream in unless
    it fragments): its header is two to ten bytes, and websockets' general parser (a
    generator per frame, its checks and a ``Frame`` object) costs about three times what the
    rest of a small chunk's trip through the client does (4.3 us a frame, measured on the
    ``stream-256`` benchmark). Every other frame (control frames, fragments, a masked or
    reserved-bit frame, one over the size limit, anything once a close came) goes whole to
    the library, so the protocol's checks and state machine see all they act on: a data frame
    changes no state of theirs outside a fragmented message, which this path never takes.

    With ``join_binary``, the binary messages of one :meth:`feed` that follow each other come
    out as one, their payloads joined: for a codec whose messages are pieces of one byte
    stream (a stateful codec's), decoded in one call as a byte-stream transport's are."""

    __slots__ = ("_buffer", "_join", "_limit")

    def __init__(self, protocol: Protocol, limit: int, *, join_binary: bool = False) -> None:
        super().__init__(protocol)
        self._buffer = bytearray()
        self._limit = limit
        self._join = join_binary

    def feed(self, data: bytes) -> list[Message]:
        buffer = bytes(self._buffer) + data if self._buffer else data
        limit = self._limit
        protocol = self.protocol
        # the library's state changes only when it is given a frame: checked again then
        ours = protocol.current_size is None and protocol.state is State.OPEN
        out: list[Message] = []
        run: list[bytes] = []  # binary payloads to join (join_binary)
        join = self._join
        start, size = 0, len(buffer)
        while size - start >= 2:
            first, length = buffer[start], buffer[start + 1]
            head = 2
            if length >= 126:
                if length & 0x80:  # masked: never a server's frame (RFC 6455 5.1)
                    super().feed(buffer[start : start + 2])  # the library refuses its header
                    raise ProtocolError("websocket: a masked frame from the server")
                head = 4 if length == 126 else 10
                if size - start < head:
                    break
                length = int.from_bytes(buffer[start + 2 : start + head])
            end = start + head + length
            if not (ours and length <= limit and first in _DATA):
                # the library's: whole, or its header alone when it is over the limit (the
                # library refuses it from the header, as it would before reading the payload)
                if length > limit:
                    end = start + head
                if end > size:
                    break
                if run:
                    out.append((False, b"".join(run)))
                    run = []
                out += super().feed(buffer[start:end])
                start = end
                ours = protocol.current_size is None and protocol.state is State.OPEN
                continue
            if end > size:
                break
            payload = buffer[start + head : end]
            start = end
            if first == _TEXT:
                if not payload.isascii():  # ASCII is UTF-8, and the check is much cheaper
                    self._check_text(payload)
                if run:
                    out.append((False, b"".join(run)))
                    run = []
                out.append((True, payload))
            elif join:
                run.append(payload)
            else:
                out.append((False, payload))
        if run:
            out.append((False, run[0] if len(run) == 1 else b"".join(run)))
        self._buffer = bytearray(buffer[start:]) if start < size else bytearray()
        return out


def _ours(exc: Exception) -> TransportError:
    """What the protocol's own parse failure is to us (it has queued the close frame)."""
    if isinstance(exc, PayloadTooBig):
        return MessageTooLargeError(f"websocket: {exc}")
    if isinstance(exc, LibraryProtocolError):
        return ProtocolError(f"websocket: {exc}")
    return ProtocolError(f"websocket: the peer's bytes failed to parse: {exc!r}")


def is_timing(payload: Any) -> bool:
    return bytes(payload[: len(_TIMING_PREFIX)]) == _TIMING_PREFIX


def timing_message(packed_text: str) -> bytes:
    return orjson.dumps({TIMING_KEY: packed_text})


def timing_of(payload: Any) -> str:
    """The packed stamps of a timing message."""
    try:
        value = orjson.loads(payload)[TIMING_KEY]
    except (orjson.JSONDecodeError, KeyError, TypeError) as exc:
        raise ProtocolError("websocket: a malformed timing message") from exc
    if not isinstance(value, str):
        raise ProtocolError("websocket: a malformed timing message")
    return value


def is_special(payload: Any) -> bool:
    """Whether a text message is an error object or the stamps, not a chunk (one call)."""
    return bool(payload.startswith((_ERROR_PREFIX, _TIMING_PREFIX)))


def is_error(payload: Any) -> bool:
    """Whether a text message is an error object (``{"error": ...}``, as the server writes it
    with orjson: never the first key of a chunk or a response)."""
    return bytes(payload[: len(_ERROR_PREFIX)]) == _ERROR_PREFIX


def error_status(payload: Any) -> tuple[int, str]:
    """The status and message of an OpenAI error object (500 and the text if it is not one)."""
    try:
        error = orjson.loads(payload)["error"]
        code, message = error["code"], error["message"]
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return 500, bytes(payload[:200]).decode(errors="replace")
    status = code if isinstance(code, int) and 400 <= code < 600 else 500
    return status, str(message)


_REMOTE_STATUS: Final = {
    CloseCode.POLICY_VIOLATION: 400,
    CloseCode.UNSUPPORTED_DATA: 400,
    CloseCode.INTERNAL_ERROR: 500,
    CloseCode.TRY_AGAIN_LATER: 503,
}


def close_error(close: Close | None, what: str) -> TransportError:
    """What a close that came before the answer was whole means to a client: ``None`` is a
    connection that ended without a close frame. A truncated stream is the caller's to say
    (it knows how far the stream got); this is the error of the close itself."""
    if close is None:
        return ProtocolError(f"{what}: the connection closed without a close frame")
    code = close.code
    if code == CloseCode.MESSAGE_TOO_BIG:
        return MessageTooLargeError(f"{what}: the server closed with {close}")
    if code in _REMOTE_STATUS:
        return RemoteError(_REMOTE_STATUS[CloseCode(code)], f"closed with {close}")
    return ProtocolError(f"{what}: the server closed with {close}")


def codec_choice(offers: Sequence[str], carries: type[Any]) -> str | None:
    """The first codec the client offers (``inferwire.<name>``, registered) that carries
    ``carries``; None when it offers none of ours."""
    registered = set(ic.names())
    for offer in offers:
        name = offer.removeprefix(SUBPROTOCOL_PREFIX)
        known = offer.startswith(SUBPROTOCOL_PREFIX) and name in registered
        if known and carries in ic.get(name, extensions=True).types:
            return name
    return None
