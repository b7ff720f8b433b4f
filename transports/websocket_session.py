"""The server side of one WebSocket connection (the wire: :mod:`.websocket`): reads and
writes over asyncio streams around websockets' Sans-I/O protocol, every write bounded by
``Limits.timeout_s`` of drain, and one chat request's stream from its message to the close.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import AsyncGenerator
from typing import TYPE_CHECKING, Any, Final, Protocol

import orjson

import inferwire.codecs as ic
from inferwire._runtime.extras import needs_extras
from inferwire.codecs.framing import MessageEncoder
from inferwire.serving import error_body

from . import openai_bodies as ob
from .common import Limits
from .errors import BadRequestError, MessageTooLargeError, PeerNotReadingError, TransportError
from .http_response import JSON
from .openai_api import ApiError, parse_request
from .request_stamps import metrics_object
from .service import TokenStream
from .streams import stream_frames
from .timing import TRACEPARENT, ServerStamps, now_ns
from .websocket_wire import (
    DONE,
    CloseCode,
    FramedMessages,
    Message,
    Messages,
    data_frame,
    timing_message,
)

with needs_extras("the websocket transport"):
    from websockets.datastructures import Headers
    from websockets.protocol import State
    from websockets.server import ServerProtocol

if TYPE_CHECKING:
    from inferwire.codecs.framing import StreamEncoder

    from .metrics import RequestMeter, ServerMetrics
    from .openai_api import OpenAIApi
    from .service import SimulatedService

__all__ = ["ChatSession", "ServerConnection"]

_log = logging.getLogger("inferwire.transports.websocket")
READ_BYTES: Final = 256 * 1024
CLOSE_TIMEOUT_S: Final = 5.0
"""How long the server waits for the client's close frame after its own, then closes
(websockets' own default is 10 s; an answer has been delivered whole by then)."""
IDLE_TIMEOUT_S: Final = 75.0
"""How long a connection that serves more than one request (infer, a chat session) waits for
its next request (the http1 server's keep-alive)."""


class ServerConnection:
    """One accepted WebSocket connection of the server: the protocol's reads and writes over
    asyncio streams, every write bounded by ``Limits.timeout_s`` of drain."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        protocol: ServerProtocol,
        limits: Limits,
    ) -> None:
        self.reader = reader
        self.writer = writer
        self.protocol = protocol
        self.limits = limits
        self.messages = Messages(protocol)
        self.pending: deque[Message] = deque()
        self.ended = asyncio.Event()
        """The client closed (its close frame or the connection's end), or failed the
        protocol: nothing more will be read, and nothing but control frames written."""
        self.answered = True
        """No answer is being written: a session's next request may come (see :meth:`watch`)."""
        self._eof_sent = False

    async def drain(self) -> None:
        if not self.writer.transport.get_write_buffer_size():
            return  # nothing waits: no need to ask the loop (a few microseconds a write)
        try:
            async with asyncio.timeout(self.limits.timeout_s):
                await self.writer.drain()
        except TimeoutError as exc:
            self.writer.transport.abort()  # what it holds will never go: free it now
            raise PeerNotReadingError(
                f"websocket: the client read nothing for {self.limits.timeout_s:g} s"
            ) from exc

    async def write(self, data: bytes) -> None:
        self.writer.write(data)
        await self.drain()

    async def flush(self) -> None:
        """Write what the protocol has to send (pongs, close frames, the end of the stream)."""
        for data in self.protocol.data_to_send():
            if data:
                self.writer.write(data)
            elif not self._eof_sent:
                self._eof_sent = True
                if self.writer.can_write_eof():
                    self.writer.write_eof()
        await self.drain()

    async def receive(self, timeout_s: float | None) -> list[Message]:
        """The messages of the next read ([] once :attr:`ended`). A limit or protocol broken
        by the client ends the connection, with the protocol's close frame written."""
        if self.pending:
            out = list(self.pending)
            self.pending.clear()
            return out
        if self.ended.is_set():
            return []
        async with asyncio.timeout(timeout_s):
            try:
                data = await self.reader.read(READ_BYTES)
            except OSError:
                data = b""  # a reset: as the end of the connection
        try:
            if not data:
                self.protocol.receive_eof()
                self.ended.set()
                messages = []
            else:
                messages = self.messages.feed(data)
        except TransportError as exc:
            # the client broke a limit or the protocol: an error object, then the close frame
            # the protocol queued with the code that says which
            self.ended.set()
            status = 413 if isinstance(exc, MessageTooLargeError) else 400
            self.writer.write(data_frame(error_body(status, str(exc)), text=True))
            await self.flush()
            raise
        if self.messages.close is not None:
            self.ended.set()
        try:
            await self.flush()
        except asyncio.CancelledError:
            # a watcher stopped after an answer: what it read is the session's next request
            self.pending.extend(messages)
            raise
        return messages

    async def next_message(self, timeout_s: float, *, idle: bool = False) -> Message | None:
        """The next whole message, None once the client closed (a broken limit or protocol:
        after its close frame and the error object before it are written) or sent nothing
        for ``timeout_s`` (then closed with 1001, going away, if ``idle`` between requests,
        else 1008 and an error object)."""
        while not self.pending:
            try:
                messages = await self.receive(timeout_s)
            except TimeoutError:
                why = f"no request in {timeout_s:g} s"
                if idle:
                    self.protocol.send_close(CloseCode.GOING_AWAY, why)
                    await self.flush()
                    await self.closing()
                else:
                    await self.refuse(408, why)
                return None
            except TransportError as exc:
                _log.info("websocket: %s", exc)  # the client's fault, told in its close frame
                return None
            if not messages and self.ended.is_set():
                return None
            self.pending.extend(messages)
        return self.pending.popleft()

    async def refuse(
        self,
        status: int,
        message: str,
        meter: RequestMeter | None = None,
        *,
        code: int = CloseCode.POLICY_VIOLATION,
        kind: str = "invalid_request_error",
        param: str | None = None,
    ) -> None:
        """Answer with an error object, close with ``code``, and see the close through."""
        data = data_frame(error_body(status, message, kind, param), text=True)
        if self.protocol.state is State.OPEN:
            self.protocol.send_close(code, _reason(message))
            data += b"".join(self.protocol.data_to_send())
        self.writer.write(data)
        if meter is not None:
            meter.written(len(data))
            meter.answered(status)
        await self.drain()
        await self.closing()

    async def closing(self) -> None:
        """After the server's close frame: wait (``CLOSE_TIMEOUT_S`` at most) for the
        client's, which the protocol answers by ending the connection."""
        with contextlib.suppress(TimeoutError, TransportError):
            async with asyncio.timeout(CLOSE_TIMEOUT_S):
                while not self.ended.is_set():
                    await self.receive(None)

    async def watch(self) -> None:
        """While a stream is written: read what the client sends, so that its pings are
        answered and its close (or its going away) seen. A data message before the answer is
        whole (:attr:`answered`) is out of place: one request at a time. After it, in a
        session, it is the next request: kept in :attr:`pending`, and the watch ends."""
        with contextlib.suppress(Exception):
            while not self.ended.is_set():
                messages = await self.receive(None)
                if not messages:
                    continue
                if self.answered:
                    self.pending.extend(messages)
                    return
                self.protocol.fail(CloseCode.POLICY_VIOLATION, "one request at a time")
                self.ended.set()
                await self.flush()


def _own_failure(exc: BaseException) -> bool:
    """Whether a stream failed for a reason of the server's own (not the client's going
    away, not its not reading, not a cancellation)."""
    return isinstance(exc, Exception) and not isinstance(exc, (OSError, TimeoutError))


def _reason(message: str) -> str:
    """A close reason: at most 123 bytes of UTF-8 (RFC 6455 5.5: a control frame's payload
    is 125 bytes, two of them the code)."""
    encoded = message.encode()
    if len(encoded) <= 123:
        return message
    return encoded[:120].decode(errors="ignore") + "..."


class Endpoint(Protocol):
    """What a session reads of its :class:`~inferwire.transports.websocket.WebSocketEndpoint`
    (a protocol here, so that this module does not import the one that imports it)."""

    api: OpenAIApi
    service: SimulatedService
    codec: ic.Codec
    metrics: ServerMetrics | None
    limits: Limits
    json_name: str


class ChatSession:
    """One chat request and its stream on an accepted connection."""

    def __init__(
        self,
        endpoint: Endpoint,
        conn: ServerConnection,
        codec_name: str | None,
        headers: Headers,
        *,
        keep: bool = False,
    ) -> None:
        self.endpoint = endpoint
        self.conn = conn
        self.codec_name = codec_name
        self.headers: Headers | None = headers
        self.keep = keep
        """A session: the connection stays open after ``[DONE]`` for the next request."""

    async def run(self) -> None:
        """The connection's request (a session's requests, in turn, until the client closes
        it or is idle)."""
        timeout_s = self.endpoint.limits.timeout_s
        while await self._one(timeout_s):
            timeout_s = IDLE_TIMEOUT_S
            self.headers = None  # the handshake's headers were the first request's
        await self.conn.closing()

    async def _one(self, timeout_s: float) -> bool:
        """Serve the next request; whether the connection is open for another."""
        endpoint, conn = self.endpoint, self.conn
        message = await conn.next_message(timeout_s, idle=timeout_s == IDLE_TIMEOUT_S)
        if message is None:
            return False
        received_ns = now_ns()
        is_text, payload = message
        if not is_text:
            text = "the request is a text message: the chat completion request's JSON"
            await self._refuse(400, text, received_ns, code=CloseCode.UNSUPPORTED_DATA)
            return False
        try:
            obj = orjson.loads(payload)
            if isinstance(obj, dict) and "stream" not in obj:
                obj["stream"] = True  # a WebSocket's answer is a stream
            request = parse_request(obj, chat=True, models=endpoint.service.models)
            if not request.stream:
                raise ApiError("a WebSocket answer is a stream: leave out stream", param="stream")
            stream = endpoint.service.open(request.generate)
            stream.stamps.received_ns = received_ns
        except orjson.JSONDecodeError as exc:
            await self._refuse(400, f"the request is not JSON: {exc}", received_ns)
            return False
        except ApiError as exc:
            await self._refuse(exc.status, str(exc), received_ns, kind=exc.kind, param=exc.param)
            return False
        except BadRequestError as exc:
            await self._refuse(400, str(exc), received_ns)
            return False
        await self._stream(stream, obj, request.extensions, request.include_usage, received_ns)
        return self.keep and not conn.ended.is_set()

    async def _refuse(self, status: int, message: str, received_ns: int, **how: Any) -> None:
        metrics = self.endpoint.metrics
        meter = None if metrics is None else metrics.start("unary", received_ns)
        await self.conn.refuse(status, message, meter, **how)

    def _encoder(
        self, stream: TokenStream, extensions: bool, include_usage: bool
    ) -> tuple[StreamEncoder, str, str]:
        """The stream's encoder (its bytes WebSocket frames), the codec that writes the chunks,
        and the answer's id."""
        endpoint = self.endpoint
        name = self.codec_name or endpoint.json_name
        codec = endpoint.codec if name == endpoint.codec.name else ic.get(name, extensions=True)
        first_id = stream.chunks[0].id
        if codec.media_type != JSON:
            return FramedMessages(codec.message_encoder(), text=False), name, first_id
        if extensions:  # inferwire's chunks, whatever the server codec's own option
            inferwire_chunks = ic.get(name, extensions=True).message_encoder()
            return FramedMessages(inferwire_chunks, text=True), name, first_id
        # OpenAI's chunks: a fresh id, usage where OpenAI puts it (openai_api, the same rule)
        identity = ob.Identity.fresh(first_id)
        openai_chunks = ic.get(name, extensions=False).message_encoder()
        usage_extra = None
        if endpoint.api.options.per_request_metrics:
            stamps = stream.stamps

            def usage_extra(usage: ic.Usage) -> dict[str, Any]:
                return {"metrics": metrics_object(stamps, usage.completion_tokens)}

        encoder = ob.UsageAsOpenAI(
            FramedMessages(openai_chunks, text=True),
            FramedMessages(MessageEncoder(orjson.dumps), text=True),
            include_usage=include_usage,
            usage_extra=usage_extra,
        )
        return ob.Relabeled(encoder, identity), name, identity.id

    async def _stream(
        self,
        stream: TokenStream,
        obj: dict[str, Any],
        extensions: bool,
        include_usage: bool,
        received_ns: int,
    ) -> None:
        endpoint, conn = self.endpoint, self.conn
        encoder, encoded_by, answer_id = self._encoder(stream, extensions, include_usage)
        stamps = None
        if stream.request.timing:
            stamps = ServerStamps(received_ns)
            stamps.parsed()
        metrics = endpoint.metrics
        meter = None if metrics is None else metrics.start("stream", received_ns, encoded_by)
        service = endpoint.service
        tracer = endpoint.api.tracer
        if tracer is None:
            frames = stream_frames(service, stream, encoder, stamps, meter=meter)
        else:
            header = None if self.headers is None else self.headers.get(TRACEPARENT)
            traceparent = header or obj.get(TRACEPARENT)
            trace = tracer.server_request(
                traceparent, received_ns, stamps, stream.request.workload, stream.stamps, answer_id
            )
            frames = trace.frames(
                stream_frames(service, stream, encoder, trace.stamps, meter=meter)
            )
        conn.answered = False
        watcher = asyncio.ensure_future(conn.watch())
        outcome = "cancelled"
        try:
            await self._send(frames, stamps, meter)
            outcome = "ok"
            if self.keep:  # the next request is the session's loop's to read
                watcher.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watcher
                return
            with contextlib.suppress(TimeoutError):  # the client's close, then its end
                await asyncio.wait_for(asyncio.shield(watcher), CLOSE_TIMEOUT_S)
        except BaseException as exc:
            if isinstance(exc, Exception):
                outcome = "error"
            if meter is not None:
                meter.failed(exc)  # a no-op once the answer was whole
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
            if _own_failure(exc) and not conn.ended.is_set():
                # say so while the connection still carries it (after the chunks so far)
                with contextlib.suppress(Exception):
                    await conn.refuse(500, "the stream failed", code=CloseCode.INTERNAL_ERROR)
            raise
        finally:
            watcher.cancel()
            self._record(stream, answer_id, outcome)

    async def _send(
        self,
        frames: AsyncGenerator[bytes, None],
        stamps: ServerStamps | None,
        meter: RequestMeter | None,
    ) -> None:
        """Write the stream's frames as they come, then the stamps (a timed stream),
        ``[DONE]`` and the close frame (1000; none in a session)."""
        conn = self.conn
        async with contextlib.aclosing(frames):
            async for piece in frames:
                if conn.ended.is_set():
                    raise ConnectionResetError("websocket: the client closed mid-stream")
                await conn.write(piece)
                if stamps is not None:
                    stamps.written()
                if meter is not None:
                    meter.written(len(piece))
        tail = b""
        if stamps is not None:
            tail = data_frame(timing_message(stamps.pack_text()), text=True)
        if conn.ended.is_set():
            raise ConnectionResetError("websocket: the client closed mid-stream")
        tail += data_frame(DONE, text=True)
        conn.answered = True  # from here, a message from the client is its next request
        if not self.keep:
            conn.protocol.send_close(CloseCode.NORMAL_CLOSURE)
            tail += b"".join(conn.protocol.data_to_send())
        await conn.write(tail)
        if meter is not None:
            meter.written(len(tail))
            meter.finish("ok")

    def _record(self, stream: TokenStream, answer_id: str, outcome: str) -> None:
        """The answer's ``--stamps-file`` line, if the server writes one."""
        stamps_file = self.endpoint.api.options.stamps_file
        if stamps_file is None:
            return
        usage = stream.chunks[-1].usage
        tokens = (
            usage.completion_tokens
            if usage is not None
            else sum(len(c.token_ids) for c in stream.chunks)
        )
        stamps_file.write(stream.stamps.line(answer_id, outcome, tokens, stream=True))
