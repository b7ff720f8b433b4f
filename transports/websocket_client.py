"""The WebSocket transport's client (the wire: :mod:`.websocket`): websockets' Sans-I/O
``ClientProtocol`` over asyncio streams.

``generate`` runs each stream on a session (``/v1/chat/completions?session=1``): a
connection kept open after ``[DONE]`` for the next stream, as a realtime client keeps one, one
stream at a time on each (concurrent streams open more; an idle one is reused). It offers the
subprotocol ``inferwire.<codec>``, sends the chat request as one text message and reads the
codec's messages through a :class:`~.streams.ChunkReader`: a stream is complete at ``[DONE]``
(and, for a stateful codec, its end frame); anything less is a :class:`StreamTruncatedError`
(or the error the close code or error object says). With ``new_connection_per_request`` each
stream has a connection of its own, which the server closes after ``[DONE]`` (1000, checked):
then the closing handshake's last step, waiting for the server to end the TCP connection (RFC
6455 7.1.1: the server closes first), runs in the background, so a stream's consumer does not
wait for it. ``infer`` keeps one connection on ``/v2/models/{model}/infer`` and takes turns on
it.

The server's data frames are parsed by :class:`~.websocket_wire.ServerMessages` (see there
why), everything else by websockets' protocol.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import Any, ClassVar, Final

import inferwire.codecs as ic
from inferwire._runtime.arguments import authority
from inferwire._runtime.extras import needs_extras

from .base import Client
from .common import aclose_quietly, connect_tcp, map_exceptions
from .errors import (
    ConnectError,
    MessageTooLargeError,
    ProtocolError,
    RemoteError,
    StreamTruncatedError,
    TransportError,
    TransportTimeoutError,
)
from .http_response import JSON
from .openai_api import chat_request_body
from .service import GenerateRequest
from .streams import ChunkReader
from .timing import TRACEPARENT, StreamTiming, asks_server, now_ns, unpack_text
from .websocket_wire import (
    CHAT_PATH,
    DONE,
    CloseCode,
    Message,
    ServerMessages,
    close_error,
    error_status,
    is_error,
    is_special,
    is_timing,
    subprotocol,
    timing_of,
)

with needs_extras("the websocket transport"):
    from websockets.client import ClientProtocol
    from websockets.exceptions import InvalidStatus
    from websockets.http11 import Response
    from websockets.uri import parse_uri

__all__ = ["WebSocketClient"]

READ_BYTES: Final = 256 * 1024
CLOSE_TIMEOUT_S: Final = 5.0
"""How long a closing connection waits for the server to end it before closing it itself."""
SESSION_PATH: Final = CHAT_PATH + "?session=1"
SESSION_IDLE_S: Final = 30.0
"""A session idle longer is not reused: under the server's idle timeout (75 s on inferwire's
servers), as HTTP clients keep their keep-alive expiry under the servers'."""
MAX_HEAD_BYTES: Final = 64 * 1024
"""The longest handshake response head read before it is refused."""


class _Connection:
    """One client connection after its handshake."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        protocol: ClientProtocol,
        limit: int,
        join_binary: bool,
    ) -> None:
        self.reader = reader
        self.writer = writer
        self.protocol = protocol
        self.messages = ServerMessages(protocol, limit, join_binary=join_binary)
        self.pending: list[Message] = []
        self.ended = False
        """The server's close frame came, or the connection ended."""
        self.idle_since = 0.0
        """When its last stream ended (a session's, on the loop's clock)."""
        self._eof_sent = False

    def flush(self) -> None:
        """Write what the protocol has to send (a pong, a close frame), without waiting: a
        few control frames, which never back up."""
        for data in self.protocol.data_to_send():
            if self._eof_sent or self.writer.is_closing():
                return
            if data:
                self.writer.write(data)
            else:
                self._eof_sent = True
                if self.writer.can_write_eof():
                    self.writer.write_eof()

    async def send(self, payload: bytes, *, text: bool) -> None:
        if text:
            self.protocol.send_text(payload)
        else:
            self.protocol.send_binary(payload)
        self.flush()
        await self.writer.drain()

    async def receive(self) -> list[Message]:
        """The messages of the next read; [] once :attr:`ended`."""
        if self.pending:
            out, self.pending = self.pending, []
            return out
        if self.ended:
            return []
        try:
            data = await self.reader.read(READ_BYTES)
        except OSError:
            data = b""  # a reset: as the end of the connection
        try:
            if not data:
                self.protocol.receive_eof()
                self.ended = True
                return []
            messages = self.messages.feed(data)
        except TransportError:
            self.ended = True
            raise
        finally:
            self.flush()
        if self.messages.close is not None:
            self.ended = True
        return messages

    async def wait_closed(self) -> None:
        """The rest of the closing handshake: the server ends the connection (bounded)."""
        with contextlib.suppress(Exception):
            async with asyncio.timeout(CLOSE_TIMEOUT_S):
                while await self.reader.read(READ_BYTES):
                    pass  # a server's bytes after its close frame are discarded (RFC 6455 1.4)
        await aclose_quietly(self.writer)

    async def close(self) -> None:
        """Start the closing handshake (1000) and see it through."""
        with contextlib.suppress(Exception):
            if self.protocol.close_sent is None and not self.ended:
                self.protocol.send_close(CloseCode.NORMAL_CLOSURE)
                self.flush()
        await self.wait_closed()

    def abort(self) -> None:
        self.writer.transport.abort()


class WebSocketClient(Client):
    """Sessions for streams, reused one stream at a time; one connection kept for ``infer``
    calls, which take turns on it. With ``new_connection_per_request``, a new connection for
    each stream and each call, closed after it: the cost of a connection's setup."""

    transport: ClassVar[str] = "websocket"

    def __init__(self, *args: Any, new_connection_per_request: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.new_connection_per_request = new_connection_per_request
        self._text = self.codec.media_type == JSON
        """Whether the codec's messages are text (a JSON codec's) or binary."""
        self._joinable = not self._text and self.codec.stream_shape == "stateful"
        """Whether the codec's messages are pieces of its byte stream (a stateful codec's), so
        that those of one read are decoded in one call, as a byte-stream transport's are."""
        self._unary: _Connection | None = None
        self._unary_path = ""
        self._lock = asyncio.Lock()
        self._streams: set[_Connection] = set()
        self._idle: list[_Connection] = []
        """Sessions whose last stream ended whole, for the next stream."""
        self._closing: set[asyncio.Task[None]] = set()

    async def _open(self, path: str, headers: Sequence[tuple[str, str]] = ()) -> _Connection:
        """Connect and complete the opening handshake on ``path`` (within the timeout)."""
        scheme = "wss" if self.ssl_context else "ws"
        uri = parse_uri(f"{scheme}://{authority(self.host, self.port)}{path}")
        protocol = ClientProtocol(
            uri,
            subprotocols=[subprotocol(self.codec.name)],
            max_size=self.limits.max_message_bytes,
        )
        request = protocol.connect()
        for name, value in headers:
            request.headers[name] = value
        reader, writer = await connect_tcp(
            self.host,
            self.port,
            ssl_context=self.ssl_context,
            timeout_s=self.limits.timeout_s,
            limit=READ_BYTES,
        )
        chat = path.startswith(CHAT_PATH)
        conn = _Connection(
            reader, writer, protocol, self.limits.max_message_bytes, chat and self._joinable
        )
        try:
            protocol.send_request(request)
            conn.flush()
            rest = await self._handshake(reader, protocol, path)
            if rest:
                with map_exceptions(f"websocket handshake on {path}"):
                    conn.pending = conn.messages.feed(rest)
        except BaseException:
            conn.abort()
            raise
        return conn

    async def _handshake(
        self, reader: asyncio.StreamReader, protocol: ClientProtocol, path: str
    ) -> bytes:
        """Read the server's handshake response; the bytes that came after its head (frames,
        for :class:`ServerMessages`: the protocol is given the head alone, so that its own
        parser holds no part of a frame)."""
        what = f"websocket handshake on {path}"
        head: bytearray | None = bytearray()
        rest = b""
        with map_exceptions(what):
            while True:
                data = await reader.read(READ_BYTES)
                if not data:
                    protocol.receive_eof()
                    raise ConnectError(f"{what}: the server closed the connection")
                if head is not None:
                    head += data
                    end = head.find(b"\r\n\r\n")
                    if end < 0:
                        if len(head) > MAX_HEAD_BYTES:
                            raise ProtocolError(f"{what}: a response head over {MAX_HEAD_BYTES}")
                        continue
                    data, rest = bytes(head[: end + 4]), bytes(head[end + 4 :])
                    head = None
                protocol.receive_data(data)
                events = protocol.events_received()
                if not events and protocol.handshake_exc is None and rest:
                    # not a 101: the response's body follows its head, and is the protocol's
                    protocol.receive_data(rest)
                    events, rest = protocol.events_received(), b""
                failure = protocol.handshake_exc
                if failure is not None:
                    if isinstance(failure, InvalidStatus):
                        response = failure.response
                        detail = response.body.decode(errors="replace").strip()
                        raise RemoteError(response.status_code, detail or response.reason_phrase)
                    raise ProtocolError(f"{what}: {failure}") from failure
                if events:
                    break
        assert isinstance(events[0], Response)
        wanted = subprotocol(self.codec.name)
        if protocol.subprotocol != wanted:
            raise ProtocolError(f"{what}: the server did not take the subprotocol {wanted}")
        return rest

    async def infer(self, request: ic.InferRequest) -> ic.InferResponse:
        payload = self.codec.encode(request)
        if len(payload) > self.limits.max_message_bytes:
            raise MessageTooLargeError(f"request of {len(payload)} bytes is over the limit")
        path = f"/v2/models/{request.model}/infer"
        async with self._lock:
            try:
                async with asyncio.timeout(self.limits.timeout_s):
                    conn = await self._unary_connection(path)
                    with map_exceptions("websocket infer"):
                        await conn.send(payload, text=self._text)
                        messages = await conn.receive()
                        while not messages and not conn.ended:
                            messages = await conn.receive()
                    if not messages:
                        raise close_error(conn.messages.close, "websocket infer")
                    if len(messages) > 1:
                        raise ProtocolError("websocket infer: more than one answer to a request")
                    text, answer = messages[0]
                    if text and is_error(answer):
                        status, detail = error_status(answer)
                        if status == 413:
                            raise MessageTooLargeError(f"websocket infer: {detail}")
                        raise RemoteError(status, detail)
                    if text != self._text:
                        raise ProtocolError("websocket infer: an answer of the other message type")
                    with map_exceptions("websocket infer"):
                        response = self.codec.decode(answer, ic.InferResponse)
                    if self.new_connection_per_request:
                        self._unary = None
                        self._background(conn.close())
                    return response
            except BaseException as exc:
                await self._drop_unary()
                _raise_timeout(exc, "websocket infer")
                raise

    async def _unary_connection(self, path: str) -> _Connection:
        if self._unary is not None and (self._unary.ended or self._unary_path != path):
            await self._drop_unary()
        if self._unary is None:
            self._unary = await self._open(path)
            self._unary_path = path
        return self._unary

    async def _drop_unary(self) -> None:
        if self._unary is not None:
            self._unary.abort()
            await aclose_quietly(self._unary.writer)
            self._unary = None

    async def generate(
        self, request: GenerateRequest, *, timing: StreamTiming | None = None
    ) -> AsyncIterator[ic.TokenChunk]:
        if timing is not None:
            timing.request_start_ns = now_ns()
        session = not self.new_connection_per_request
        traceparent = None if timing is None else timing.traceparent
        body = chat_request_body(
            request, timing=asks_server(timing), traceparent=traceparent if session else None
        )
        if timing is not None:
            timing.request_encoded_ns = now_ns()
        limit = self.limits.max_message_bytes
        if len(body) > limit:
            raise MessageTooLargeError(f"request of {len(body)} bytes is over the limit")
        stream = ChunkReader.of_messages(self.codec, limit, "websocket", timing)
        conn: _Connection | None = None
        clean = False
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.limits.timeout_s) as deadline:
                if session:
                    conn = self._idle_session() or await self._open(SESSION_PATH)
                else:
                    headers = [(TRACEPARENT, traceparent)] if traceparent else []
                    conn = await self._open(CHAT_PATH, headers)
                self._streams.add(conn)
                if timing is not None:
                    timing.request_write_ns = now_ns()
                with map_exceptions("websocket send"):
                    await conn.send(body, text=True)
                if timing is not None:
                    timing.request_sent_ns = now_ns()
                done = False
                while not done:
                    deadline.reschedule(loop.time() + self.limits.timeout_s)
                    with map_exceptions("websocket stream"):
                        messages = await conn.receive()
                    if not messages and conn.ended:
                        raise self._ended(conn, stream)
                    deadline.reschedule(None)  # the consumer's pace is not our timeout
                    for index, (text, payload) in enumerate(messages):
                        if text and payload == DONE:
                            if index + 1 < len(messages):
                                raise ProtocolError("websocket: a message after [DONE]")
                            stream.close()
                            done = True
                        elif text != self._text or (text and is_special(payload)):
                            self._other(text, payload, stream, timing)
                        else:
                            for chunk in stream.feed(payload):
                                yield chunk
                if not session:
                    deadline.reschedule(loop.time() + self.limits.timeout_s)
                    await self._closed_normally(conn)
                clean = True
        except TimeoutError as exc:
            _raise_timeout(exc, f"websocket generate, after {stream.count} chunks")
            raise
        finally:
            if conn is not None:
                self._streams.discard(conn)
                if not clean:
                    conn.abort()  # mid-stream: the server stops the stream
                elif session:
                    conn.idle_since = loop.time()
                    self._idle.append(conn)
                else:
                    self._background(conn.wait_closed())

    def _idle_session(self) -> _Connection | None:
        """The session idle the shortest, if it has been idle under ``SESSION_IDLE_S``
        (others are closed: the server may be closing them)."""
        now = asyncio.get_running_loop().time()
        while self._idle:
            conn = self._idle.pop()
            fresh = now - conn.idle_since < SESSION_IDLE_S
            if fresh and not conn.ended and not conn.pending and not conn.writer.is_closing():
                return conn
            self._background(conn.close())
        return None

    def _other(
        self, text: bool, payload: Any, stream: ChunkReader, timing: StreamTiming | None
    ) -> None:
        """A message that is not the codec's: an error object, the server's stamps, or a
        breach of the protocol."""
        if text and is_error(payload):
            status, detail = error_status(payload)
            if status == 413:
                raise MessageTooLargeError(f"websocket: the server refused: {detail}")
            if stream.count:
                raise StreamTruncatedError(
                    f"websocket: the server failed the stream after {stream.count} chunks: "
                    f"{detail}",
                    chunks_received=stream.count,
                )
            raise RemoteError(status, detail)
        if text and is_timing(payload):
            if timing is not None:
                timing.set_server(unpack_text(timing_of(payload)))
            return
        kind = "text" if text else "binary"
        raise ProtocolError(f"websocket: a {kind} message in a {self.codec.name} stream")

    async def _closed_normally(self, conn: _Connection) -> None:
        """After ``[DONE]``: the server's close frame, 1000, which the protocol answers."""
        while not conn.ended:
            with map_exceptions("websocket close"):
                if await conn.receive():
                    raise ProtocolError("websocket: a message after [DONE]")
        close = conn.messages.close
        if close is None or close.code != CloseCode.NORMAL_CLOSURE:
            raise close_error(close, "websocket: after [DONE]")

    @staticmethod
    def _ended(conn: _Connection, stream: ChunkReader) -> TransportError:
        """The error of a connection that ended before ``[DONE]``."""
        close = conn.messages.close
        if close is None or close.code in (
            CloseCode.NORMAL_CLOSURE,
            CloseCode.GOING_AWAY,
            CloseCode.INTERNAL_ERROR,
        ):
            why = "connection closed" if close is None else f"the server closed with {close}"
            return stream.truncated(why)
        return close_error(close, "websocket")

    def _background(self, closing: Any) -> None:
        task = asyncio.ensure_future(closing)
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    async def close(self) -> None:
        """Close every connection: a stream still being read ends as truncated."""
        for conn in list(self._streams):
            conn.abort()
        idle, self._idle = self._idle, []
        for conn in idle:
            self._background(conn.close())
        if self._unary is not None:
            unary, self._unary = self._unary, None
            await unary.close()
        if self._closing:
            await asyncio.wait(list(self._closing), timeout=CLOSE_TIMEOUT_S + 1)


def _raise_timeout(exc: BaseException, what: str) -> None:
    if isinstance(exc, TimeoutError) and not isinstance(exc, TransportTimeoutError):
        raise TransportTimeoutError(f"{what}: timed out") from exc
