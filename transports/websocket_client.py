"""The WebSocket transport's client (the wire: :mod:`.websocket`): websockets' Sans-I/O
``ClientProtocol`` over asyncio streams.

``generate`` opens a connection on ``/v1/chat/completions`` per stream (the server closes it
after ``[DONE]``), offering the subprotocol ``inferwire.<codec>``, sends the chat request as
one text message and reads the codec's messages through a :class:`~.streams.ChunkReader`: a
stream is complete at ``[DONE]`` (and, for a stateful codec, its end frame) followed by the
server's close 1000; anything less is a :class:`StreamTruncatedError` (or the error the close
code or error object says). The closing handshake's last step, waiting for the server to end
the TCP connection (RFC 6455 7.1.1: the server closes first), runs in the background, so a
stream's consumer does not wait for it. ``infer`` keeps one connection on
``/v2/models/{model}/infer`` and takes turns on it.
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
    Messages,
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


class _Connection:
    """One client connection after its handshake."""

    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, protocol: ClientProtocol
    ) -> None:
        self.reader = reader
        self.writer = writer
        self.protocol = protocol
        self.messages = Messages(protocol)
        self.pending: list[Message] = []
        self.ended = False
        """The server's close frame came, or the connection ended."""
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
    """A connection per stream; one kept for ``infer`` calls, which take turns on it (with
    ``new_connection_per_request``, a new one for each, closed after it: the cost of a
    connection's setup)."""

    transport: ClassVar[str] = "websocket"

    def __init__(self, *args: Any, new_connection_per_request: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.new_connection_per_request = new_connection_per_request
        self._text = self.codec.media_type == JSON
        """Whether the codec's messages are text (a JSON codec's) or binary."""
        self._unary: _Connection | None = None
        self._unary_path = ""
        self._lock = asyncio.Lock()
        self._streams: set[_Connection] = set()
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
        conn = _Connection(reader, writer, protocol)
        try:
            protocol.send_request(request)
            conn.flush()
            events = await self._handshake(reader, protocol, path)
            conn.pending = conn.messages.frames(events)
        except BaseException:
            conn.abort()
            raise
        return conn

    async def _handshake(
        self, reader: asyncio.StreamReader, protocol: ClientProtocol, path: str
    ) -> list[Any]:
        """Read the server's handshake response; the frames that came with it, if any."""
        what = f"websocket handshake on {path}"
        with map_exceptions(what):
            while True:
                data = await reader.read(READ_BYTES)
                if not data:
                    protocol.receive_eof()
                    raise ConnectError(f"{what}: the server closed the connection")
                protocol.receive_data(data)
                events = protocol.events_received()
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
        return events[1:]

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
        body = chat_request_body(request, timing=asks_server(timing))
        if timing is not None:
            timing.request_encoded_ns = now_ns()
        limit = self.limits.max_message_bytes
        if len(body) > limit:
            raise MessageTooLargeError(f"request of {len(body)} bytes is over the limit")
        headers = []
        if timing is not None and timing.traceparent:
            headers.append((TRACEPARENT, timing.traceparent))
        stream = ChunkReader.of_messages(self.codec, limit, "websocket", timing)
        conn: _Connection | None = None
        clean = False
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.limits.timeout_s) as deadline:
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
                deadline.reschedule(loop.time() + self.limits.timeout_s)
                await self._closed_normally(conn)
                clean = True
        except TimeoutError as exc:
            _raise_timeout(exc, f"websocket generate, after {stream.count} chunks")
            raise
        finally:
            if conn is not None:
                self._streams.discard(conn)
                if clean:
                    self._background(conn.wait_closed())
                else:
                    conn.abort()  # mid-stream: the server stops the stream

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
        if self._unary is not None:
            unary, self._unary = self._unary, None
            await unary.close()
        if self._closing:
            await asyncio.wait(list(self._closing), timeout=CLOSE_TIMEOUT_S + 1)


def _raise_timeout(exc: BaseException, what: str) -> None:
    if isinstance(exc, TimeoutError) and not isinstance(exc, TransportTimeoutError):
        raise TransportTimeoutError(f"{what}: timed out") from exc
