"""``websocket``: the OpenAI chat request over a WebSocket (RFC 6455), for browsers and
realtime clients, on its own server or upgraded from the ``http1`` server's connections.

Routes (``GET`` with ``Upgrade: websocket``):

``/v1/chat/completions``
    The client sends one text message: the chat completion request's JSON, as it would POST
    it (``stream`` may be left out: the answer is a stream). The server answers each chunk
    with one message, then a text ``[DONE]``, then closes with 1000 (normal closure). A timed
    request (``"timing": true``, inferwire's field) gets a text ``{"x-inferwire-timing": ...}``
    before ``[DONE]``.
``/v1/chat/completions?session=1``
    A session, as a realtime client keeps one: the same, except that after ``[DONE]`` the
    connection stays open for the client's next request (one at a time: a message before
    ``[DONE]`` is a policy violation, 1008) until the client closes it or sends nothing for
    ``IDLE_TIMEOUT_S`` (then 1001, going away). A request's ``traceparent`` goes in its JSON
    (a handshake's header applies to the first request only).
``/v2/models/{model}/infer``
    Each message is one infer request in the codec, answered by one message; the connection
    stays open for the next (the ``infer`` round trip of :class:`~.base.Client`).

The codec is the client's subprotocol, ``Sec-WebSocket-Protocol: inferwire.<codec>``: a JSON
codec's messages are text, the chunk objects of the OpenAI API (inferwire's, with ``seq`` and
``token_ids``, to a request with ``"inferwire": {"extensions": true}``, as on HTTP); any
other codec's are binary, one :meth:`~inferwire.codecs.Codec.message_encoder` message per chunk
(a stateful codec's end frame one more). Without a subprotocol: OpenAI's JSON chunks as text.
A client that offers only ``inferwire.*`` subprotocols this server does not speak is refused
with 400 in the handshake.

Errors: an OpenAI error object (``{"error": {...}}``) as a text message, then a close code:
1008 (policy violation) for a request the API refuses, 1003 for a binary request, 1009 for a
message over ``Limits.max_message_bytes`` (refused from its frame header, whole or
fragmented), 1007 for text that is not UTF-8, 1011 when the server fails mid-stream. A client
that stops reading is bounded by the socket: each write waits for the previous ones to drain,
for at most ``Limits.timeout_s``, then the connection is dropped (the stream fails); pings are
answered while a stream is written.

Library: websockets' Sans-I/O protocol (``websockets.server.ServerProtocol``, its
``ClientProtocol`` on the client side), driven by this module's asyncio streams, rather than
its asyncio server: the http1 server hands over a connection whose request it has already
parsed (the Sans-I/O protocol takes that request as it is), and its asyncio layer costs a task
wake-up and a queue per message. websockets rather than wsproto: a maintained sans-I/O core
with the message size limit built in (wsproto has none), C-accelerated unmasking, and the same
library that browsers' peers most often use in Python. The server's data frames are written by
:func:`.websocket_wire.data_frame`, and the client parses them with
:class:`.websocket_wire.ServerMessages` (see there why); other parsing, handshakes, control
frames and fragments are the library's.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, ClassVar, Final
from urllib.parse import parse_qs

import inferwire.codecs as ic
from inferwire._runtime.extras import needs_extras

from .base import Server
from .common import Limits, aclose_quietly, log_failure
from .errors import BadRequestError, MessageTooLargeError, ProtocolError
from .http_response import JSON
from .openai_api import OpenAIApi, OpenAIOptions
from .websocket_client import WebSocketClient
from .websocket_session import IDLE_TIMEOUT_S, ChatSession, ServerConnection
from .websocket_wire import CHAT_PATH, codec_choice, data_frame, subprotocol

with needs_extras("the websocket transport"):
    from websockets.datastructures import Headers
    from websockets.exceptions import NegotiationError
    from websockets.http11 import Request
    from websockets.protocol import State
    from websockets.server import ServerProtocol
    from websockets.typing import Subprotocol

__all__ = ["WebSocketClient", "WebSocketEndpoint", "WebSocketServer"]

_log = logging.getLogger(__name__)
READ_BYTES: Final = 256 * 1024
INFER_PATH: Final = re.compile(r"/v2/models/([^/?]+)/infer")


class WebSocketServer(Server):
    """The WebSocket routes of the module docstring on a listener of their own."""

    transport: ClassVar[str] = "websocket"

    def __init__(self, *args: Any, openai: OpenAIOptions | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        api = OpenAIApi(
            self.service, self.codec, metrics=self.metrics, tracer=self.tracer, options=openai
        )
        self.endpoint = WebSocketEndpoint(api, self.limits)

    async def start(self) -> tuple[str, int]:
        return await self._serve_streams(self._handle, READ_BYTES)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._track()
        await self.endpoint.serve(reader, writer)

    def write_buffer_bytes(self) -> int:
        """Bytes written to clients and not yet taken by their sockets (see
        :meth:`WebSocketEndpoint.write_buffer_bytes`)."""
        return self.endpoint.write_buffer_bytes()


class WebSocketEndpoint:
    """The WebSocket routes of one server, over ``api``'s service, codec, metrics, tracer and
    options: :meth:`serve` reads a connection's handshake itself (:class:`WebSocketServer`),
    :meth:`upgrade` takes a request another server parsed (``http1``). Each closes the
    connection when done and raises nothing a client can cause."""

    def __init__(self, api: OpenAIApi, limits: Limits) -> None:
        self.api = api
        self.service = api.service
        self.codec = api.codec
        self.metrics = api.metrics
        self.limits = limits
        json_codec = self.codec.media_type == JSON and ic.TokenChunk in self.codec.types
        self.json_name = self.codec.name if json_codec else "orjson"
        """The JSON codec of a client that names none (the HTTP routes' rule)."""
        self._writers: set[asyncio.StreamWriter] = set()

    def write_buffer_bytes(self) -> int:
        """What the open connections' transports hold, written and not yet sent: bounded per
        connection by the drain before each write (a client that stops reading is dropped
        after ``Limits.timeout_s``), which a test checks."""
        return sum(w.transport.get_write_buffer_size() for w in self._writers)

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        protocol = self._protocol(State.CONNECTING)
        await self._guarded(writer, lambda: self._handshake(reader, writer, protocol))

    async def upgrade(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        method: str,
        path: str,
        headers: Mapping[str, str],
    ) -> None:
        """Serve the connection of an upgrade request another server has read (its body
        empty, as a handshake's is); the connection is this endpoint's from here on."""
        request = Request(path, Headers(list(headers.items())), method=method)
        protocol = self._protocol(State.OPEN)  # the request is parsed: frames come next
        await self._guarded(writer, lambda: self._session(reader, writer, protocol, request, []))

    def _protocol(self, state: State) -> ServerProtocol:
        return ServerProtocol(
            state=state,
            max_size=self.limits.max_message_bytes,
            logger=_log,
        )

    async def _guarded(
        self, writer: asyncio.StreamWriter, session: Callable[[], Awaitable[None]]
    ) -> None:
        self._writers.add(writer)
        try:
            await session()
        except (OSError, TimeoutError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass  # the client went away, stopped reading, or the server stops
        except (MessageTooLargeError, ProtocolError) as exc:
            _log.info("websocket: %s", exc)  # the client's, told in the close frame
        except Exception as exc:
            log_failure(_log, "websocket: connection failed", exc)
        finally:
            self._writers.discard(writer)
            await aclose_quietly(writer)

    async def _handshake(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, protocol: ServerProtocol
    ) -> None:
        """Read the opening handshake (within ``header_timeout_s`` of the connection, as the
        http1 server's heads), then serve the session. Bytes that are not an HTTP request are
        answered 400; a head over the library's limits (8 KiB a line, 128 headers) 414/431."""
        async with asyncio.timeout(self.limits.header_timeout_s):
            while True:
                data = await reader.read(READ_BYTES)
                if not data:
                    return
                protocol.receive_data(data)
                events = protocol.events_received()
                if events:
                    break
                if protocol.handshake_exc is not None:
                    refusal = protocol.data_to_send()
                    if not any(refusal):  # not HTTP at all: the library only closes
                        cause = protocol.handshake_exc.__cause__ or protocol.handshake_exc
                        text = f"Failed to open a WebSocket connection: {cause}.\n"
                        refusal = [protocol.reject(400, text).serialize()]
                    writer.writelines(refusal)
                    await writer.drain()
                    self._refused()
                    return
        request, rest = events[0], events[1:]
        assert isinstance(request, Request)
        await self._session(reader, writer, protocol, request, rest)

    def _refused(self) -> None:
        if self.metrics is not None:
            self.metrics.answered("unary", "bad_request")

    async def _session(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        protocol: ServerProtocol,
        request: Request,
        early: list[Any],
    ) -> None:
        path, _, query = request.path.partition("?")
        model = None
        if path != CHAT_PATH:
            match = INFER_PATH.fullmatch(path)
            model = match.group(1) if match else None
        negotiation = _Negotiation(ic.InferRequest if model else ic.TokenChunk)
        # the library calls it inside accept(), as it would a select_subprotocol given to it
        protocol.select_subprotocol = negotiation.select  # type: ignore[method-assign,assignment]
        if path != CHAT_PATH and model is None:
            response = protocol.reject(404, f"no WebSocket route {path}\n")
        else:
            response = protocol.accept(request)
        if protocol.state is State.CONNECTING:
            protocol.send_response(response)
            writer.writelines(protocol.data_to_send())
        else:  # upgraded from http1: the protocol never saw the request
            writer.write(response.serialize())
        if response.status_code != 101:
            await writer.drain()
            self._refused()
            return
        conn = ServerConnection(reader, writer, protocol, self.limits)
        conn.pending.extend(conn.messages.frames(early))
        await conn.flush()
        codec = negotiation.codec
        if model is None:
            keep = parse_qs(query).get("session") in (["1"], ["true"])
            await ChatSession(self, conn, codec, request.headers, keep=keep).run()
        else:
            await self._infer(conn, codec, model)

    async def _infer(self, conn: ServerConnection, codec_name: str | None, model: str) -> None:
        """Infer requests in turn until the client closes (or is idle ``IDLE_TIMEOUT_S``)."""
        codec = ic.get(codec_name or "orjson", extensions=True)
        if codec_name == self.codec.name:
            codec = self.codec
        text = codec.media_type == JSON
        while (message := await conn.next_message(IDLE_TIMEOUT_S, idle=True)) is not None:
            meter = None if self.metrics is None else self.metrics.start("unary")
            is_text, payload = message
            if is_text != text:
                kind = "text" if text else "binary"
                await conn.refuse(400, f"{codec.name} requests are {kind} messages", meter)
                return
            try:
                infer_request = codec.decode(payload, ic.InferRequest)
                if infer_request.model != model:
                    raise BadRequestError(
                        f"the request is for model {infer_request.model!r}, "
                        f"the connection for {model!r}"
                    )
                answer = codec.encode(self.service.infer(infer_request))
            except (ic.CodecError, BadRequestError) as exc:
                await conn.refuse(400, str(exc), meter)
                return
            frame = data_frame(answer, text=text)
            await conn.write(frame)
            if meter is not None:
                meter.written(len(frame))
                meter.finish("ok")
        await conn.closing()


class _Negotiation:
    """The subprotocol of one handshake: the first ``inferwire.<codec>`` the client offers
    that carries ``carries``; none if it offers none of ours; a 400 if it offers only
    ``inferwire.*`` codecs this server cannot use there."""

    def __init__(self, carries: type[Any]) -> None:
        self.carries = carries
        self.codec: str | None = None

    def select(self, offers: Sequence[Subprotocol]) -> Subprotocol | None:
        self.codec = codec_choice(offers, self.carries)
        if self.codec is not None:
            return subprotocol(self.codec)
        ours = [offer for offer in offers if offer.startswith("inferwire.")]
        if ours:
            raise NegotiationError(
                f"no codec of this server among {', '.join(ours)} for {self.carries.__name__}"
            )
        return None
