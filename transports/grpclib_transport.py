"""``grpclib``: the ``inferwire.v1.Inference`` service of ``schemas/`` on grpclib, the
pure-Python gRPC (asyncio and h2) that some Python services choose over grpcio.

The same service, the same messages and the same methods as ``grpc``
(:mod:`inferwire.transports.grpc_transport`), so each end speaks to the other's:

* ``Infer`` carries the codec's ``InferRequest`` and ``InferResponse``;
* ``Generate`` sends the codec's *message stream*, one chunk (or delta frame) a message: with
  ``protobuf`` exactly the schema's ``stream TokenChunk``;
* ``GenerateBatched`` one ``StreamBytes`` per batch of due chunks
  (:mod:`inferwire.transports.grpc_envelope`); a client asks for it with ``batched=True``;
* ``Session`` the schema's envelopes, many requests in turn on one bidirectional call.

The messages are the codec's bytes, so grpclib runs here with a codec that passes bytes
through (:class:`~.grpclib_wire.RawCodec`) rather than its protobuf one, as grpcio runs with
identity (de)serializers; ``schemas/inferwire_grpc.py`` holds the stubs grpclib's protoc plugin
makes of the same service, for a grpclib user who wants the schema's messages.

Both ends refuse a message over ``Limits.max_message_bytes`` before reading it
(``RESOURCE_EXHAUSTED`` / :class:`MessageTooLargeError`), which grpclib itself does not
(:mod:`inferwire.transports.grpclib_wire`); the server checks each connection's frame headers
before h2 sees them, as the ``http2`` server does (:mod:`inferwire.transports.h2guard`). The
client is :mod:`.grpclib_client`'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import weakref
from collections.abc import AsyncGenerator, AsyncIterator
from typing import TYPE_CHECKING, Any, ClassVar, Final

from google.protobuf import message as protobuf_message

import inferwire.codecs as ic
from inferwire._runtime.extras import needs_extras
from inferwire.schemas import inferwire_pb2 as pb

from . import grpc_envelope as envelope
from . import grpclib_wire as wire
from . import h2guard
from .base import Server
from .common import BACKLOG, log_failure
from .errors import (
    BadRequestError,
    MessageTooLargeError,
    PeerLimitError,
    ProtocolError,
    ServiceUnavailableError,
)
from .grpc_envelope import RequestKind, ResponseKind
from .grpclib_client import GrpclibClient, GrpclibSession
from .grpclib_standard import GrpclibStandard
from .service import TokenStream
from .streams import stream_frames, stream_messages
from .timing import TRACEPARENT, ServerStamps, now_ns

with needs_extras("the grpclib transport"):
    import grpclib.const
    import grpclib.exceptions
    import grpclib.protocol
    import grpclib.server
    from grpclib.const import Cardinality, Status

if TYPE_CHECKING:
    from .metrics import RequestMeter
    from .tracing import ServerTrace

__all__ = ["GrpclibClient", "GrpclibServer", "GrpclibSession"]
_log = logging.getLogger(__name__)
BATCH_CHUNKS: Final = 256
"""Most chunks one ``GenerateBatched`` message carries: grpcio's bound (``grpc_transport``)."""
MAX_FRAME_BYTES: Final = 16_384
"""SETTINGS_MAX_FRAME_SIZE, which grpclib leaves at its initial value (RFC 9113, 6.5.2)."""
MAX_HEADER_BLOCK_BYTES: Final = 32 * 1024
MAX_IDLE_FRAMES: Final = 10_000
"""The ``http2`` server's bounds (:mod:`inferwire.transports.http2.server`), on the same
checks: a header block's compressed size, frames in a row that move no request forward."""


class _GuardedProtocol(grpclib.protocol.H2Protocol):
    """grpclib's HTTP/2 connection with :mod:`~inferwire.transports.h2guard`'s checks before
    h2 sees the bytes: h2 buffers a whole frame before it compares its length with the limit,
    so without them one frame header declaring 16 MiB costs 16 MiB of memory and holds the
    connection until they come. A peer past a limit gets a GOAWAY with the guard's code and
    the connection is closed (the ``http2`` server's answer)."""

    guard: h2guard.FrameGuard | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self.guard = h2guard.FrameGuard(
            max_frame_bytes=MAX_FRAME_BYTES,
            max_header_block_bytes=MAX_HEADER_BLOCK_BYTES,
            max_idle_frames=MAX_IDLE_FRAMES,
        )

    def data_received(self, data: bytes) -> None:
        guard = self.guard
        if guard is None:
            return  # shut: what follows is discarded
        try:
            guard.feed(data)
        except PeerLimitError as exc:
            self.guard = None
            _log.info("grpclib: closing a connection: %s", exc)
            connection = self.connection
            with contextlib.suppress(Exception):  # the GOAWAY is a courtesy
                connection._connection.close_connection(error_code=exc.error_code)
                connection.flush()
            self.processor.close(str(exc))
            return
        super().data_received(data)


class _GrpclibServer(grpclib.server.Server):
    """grpclib's server on guarded connections (:class:`_GuardedProtocol`), keeping them so
    that a stop can end them: grpclib's ``close`` cancels their handlers but leaves them open
    (as Python 3.11's ``Server.close``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.protocols: weakref.WeakSet[grpclib.protocol.H2Protocol] = weakref.WeakSet()

    def _protocol_factory(self) -> grpclib.protocol.H2Protocol:
        made = super()._protocol_factory()  # registers the connection's request handler
        protocol = _GuardedProtocol(made.handler, made.config, made.h2_config)
        self.protocols.add(protocol)
        return protocol


def _listen_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket (made here, so that the port it got is known: grpclib's server
    does not say). Its protocol is named: asyncio and grpclib set TCP_NODELAY only on sockets
    whose ``proto`` is IPPROTO_TCP, and without it a unary call waits out the peer's delayed
    ACK (about 40 ms on Linux)."""
    family, kind, proto, _, address = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP, flags=socket.AI_PASSIVE
    )[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(BACKLOG)
    except BaseException:
        sock.close()
        raise
    return sock


class GrpclibServer(Server):
    """The service on grpclib. Answers with the status codes of ``grpc``'s server: a bad
    request ``INVALID_ARGUMENT``, a message over the limit ``RESOURCE_EXHAUSTED``, a codec that
    carries no token streams ``FAILED_PRECONDITION``, a stream the service could not finish
    ``UNAVAILABLE``. Beside the ``Inference`` service it serves the standard health and
    reflection services (:mod:`.grpclib_standard`), as ``grpc``'s server does; not the KServe
    one, which ``grpc``'s server adds."""

    transport: ClassVar[str] = "grpclib"

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self._grpclib: _GrpclibServer | None = None
        self._stopped = asyncio.Event()
        self.standard = GrpclibStandard(
            [wire.SERVICE], max_message_bytes=self.limits.max_message_bytes
        )
        """Health and reflection; health says ``NOT_SERVING`` from the start of :meth:`stop`."""

    def __mapping__(self) -> dict[str, grpclib.const.Handler]:
        """The methods, as grpclib's generated ``InferenceBase`` maps them."""
        handler = grpclib.const.Handler
        return {
            wire.path("Infer"): handler(self._infer, Cardinality.UNARY_UNARY, bytes, bytes),
            wire.path("Generate"): handler(self._generate, Cardinality.UNARY_STREAM, bytes, bytes),
            wire.path("GenerateBatched"): handler(
                self._generate_batched, Cardinality.UNARY_STREAM, bytes, bytes
            ),
            wire.path("Session"): handler(self._session, Cardinality.STREAM_STREAM, bytes, bytes),
        }

    async def start(self) -> tuple[str, int]:
        server = _GrpclibServer([self, self.standard], codec=wire.RawCodec())
        context = self.ssl_context
        if context is not None:
            context.set_alpn_protocols(["h2"])  # grpcio's clients insist on it (RFC 7540, 3.3)
        sock = _listen_socket(self.host, self.port)
        try:
            await server.start(sock=sock, ssl=context, backlog=BACKLOG)
        except BaseException:
            sock.close()
            raise
        self._grpclib = server
        sockname = sock.getsockname()
        self.address = (sockname[0], sockname[1])
        return self.address

    async def serve_forever(self) -> None:
        if self._grpclib is None:
            await self.start()
        await self._stopped.wait()

    async def stop(self) -> None:
        """Stop listening, cancel the calls in progress (their clients see them fail) and end
        every connection. Health turns ``NOT_SERVING`` first, and its watchers are told before
        their calls end."""
        server, self._grpclib = self._grpclib, None
        await self.standard.stopping()  # the watches send NOT_SERVING before close ends them
        if server is not None:
            server.close()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(server.wait_closed(), 5.0)
            for protocol in list(server.protocols):
                protocol.processor.close("server stopped")
        self._stopped.set()

    # -- handlers: bytes in, bytes out ----------------------------------------------------

    async def _request(self, stream: grpclib.server.Stream[Any, Any]) -> bytes:
        """The call's one request message; a refused one is a GRPCError with its status."""
        data = await self._next(stream)
        if data is None:
            raise grpclib.exceptions.GRPCError(Status.INVALID_ARGUMENT, "no request message")
        return data

    async def _next(self, stream: grpclib.server.Stream[Any, Any]) -> bytes | None:
        try:
            return await wire.read_message(
                stream._stream, self.limits.max_message_bytes, "grpclib request"
            )
        except MessageTooLargeError as exc:
            raise grpclib.exceptions.GRPCError(Status.RESOURCE_EXHAUSTED, str(exc)) from exc
        except (ProtocolError, wire.CutShortError) as exc:
            raise grpclib.exceptions.GRPCError(Status.INVALID_ARGUMENT, str(exc)) from exc

    def _checked(self, message: bytes) -> bytes:
        """``message`` unless it is over the limit, which the peer would refuse anyway."""
        if len(message) > self.limits.max_message_bytes:
            raise grpclib.exceptions.GRPCError(
                Status.RESOURCE_EXHAUSTED,
                f"grpclib: an answer of {len(message)} bytes is over the limit",
            )
        return message

    def _open(self, data: bytes) -> TokenStream:
        """The stream a ``GenerateRequest`` asks for. Raises :class:`BadRequestError`."""
        if ic.TokenChunk not in self.codec.types:
            raise BadRequestError(f"codec {self.codec.name!r} does not carry token streams")
        try:
            request = wire.request_from_pb(pb.GenerateRequest.FromString(data))
        except (protobuf_message.DecodeError, BadRequestError) as exc:
            raise BadRequestError(f"bad GenerateRequest: {exc}") from exc
        return self.service.open(request)

    def _answer(self, data: bytes) -> bytes:
        """The codec's ``InferResponse`` to the codec's ``InferRequest`` in ``data``."""
        try:
            return self.codec.encode(self.service.infer(self.codec.decode(data, ic.InferRequest)))
        except ic.CodecError as exc:
            raise BadRequestError(str(exc)) from exc

    def _refused(self, received_ns: int) -> None:
        if self.metrics is not None:
            self.metrics.answered("unary", "bad_request", received_ns)

    async def _infer(self, stream: grpclib.server.Stream[Any, Any]) -> None:
        received_ns = now_ns()
        try:
            data = await self._request(stream)
        except grpclib.exceptions.GRPCError:
            self._refused(received_ns)
            raise
        meter = None if self.metrics is None else self.metrics.start("unary", received_ns)
        try:
            answer = self._checked(self._answer(data))
        except BadRequestError as exc:
            if meter is not None:
                meter.finish("bad_request")
            raise grpclib.exceptions.GRPCError(Status.INVALID_ARGUMENT, str(exc)) from exc
        except BaseException:
            if meter is not None:
                meter.finish("error")
            raise
        await stream.send_message(answer)
        if meter is not None:
            meter.written(len(answer))
            meter.finish("ok")

    async def _opened(
        self, stream: grpclib.server.Stream[Any, Any]
    ) -> tuple[TokenStream, ServerStamps | None, int, RequestMeter | None]:
        """The stream a generate call asks for, its stamps if it asked for timing, when it was
        received, and its meter; a request that cannot be served is a GRPCError."""
        received_ns = now_ns()
        try:
            data = await self._request(stream)
            if ic.TokenChunk not in self.codec.types:
                raise grpclib.exceptions.GRPCError(
                    Status.FAILED_PRECONDITION,
                    f"codec {self.codec.name!r} does not carry token streams",
                )
            try:
                token_stream = self._open(data)
            except BadRequestError as exc:
                raise grpclib.exceptions.GRPCError(Status.INVALID_ARGUMENT, str(exc)) from exc
        except grpclib.exceptions.GRPCError:
            self._refused(received_ns)
            raise
        stamps = None
        if token_stream.request.timing:
            stamps = ServerStamps(received_ns)
            stamps.parsed()
        meter = None if self.metrics is None else self.metrics.start("stream", received_ns)
        return token_stream, stamps, received_ns, meter

    def _trace(
        self,
        stream: grpclib.server.Stream[Any, Any],
        token_stream: TokenStream,
        stamps: ServerStamps | None,
        received_ns: int,
    ) -> ServerTrace:
        """A traced server's trace of a stream, parented by the call's ``traceparent``."""
        assert self.tracer is not None
        metadata = stream.metadata
        return self.tracer.server_request(
            None if metadata is None else metadata.get(TRACEPARENT),
            received_ns,
            stamps,
            token_stream.request.workload,
            token_stream.stamps,
        )

    async def _send_all(
        self,
        stream: grpclib.server.Stream[Any, Any],
        messages: AsyncGenerator[bytes, None],
        stamps: ServerStamps | None,
        meter: RequestMeter | None,
    ) -> None:
        """Send ``messages``, then the trailers (the timing trailer if asked for)."""
        send = stream.send_message
        try:
            async with contextlib.aclosing(messages):
                async for message in messages:
                    await send(self._checked(message))
                    if stamps is not None:
                        stamps.written()
                    if meter is not None:
                        meter.written(len(message))
        except ServiceUnavailableError as exc:
            if meter is not None:
                meter.failed(exc)
            log_failure(_log, "grpclib: stream failed", exc)
            raise grpclib.exceptions.GRPCError(Status.UNAVAILABLE, str(exc)) from exc
        except BaseException as exc:
            if meter is not None:
                meter.failed(exc)
            raise
        if stamps is not None:
            await stream.send_trailing_metadata(metadata={wire.TRAILER_BIN: stamps.pack()})
        if meter is not None:
            meter.finish("ok")

    async def _generate(self, stream: grpclib.server.Stream[Any, Any]) -> None:
        token_stream, stamps, received_ns, meter = await self._opened(stream)
        encoder = self.codec.message_encoder()
        if self.tracer is None:
            messages = stream_messages(self.service, token_stream, encoder, stamps, meter=meter)
        else:
            trace = self._trace(stream, token_stream, stamps, received_ns)
            messages = trace.frames(
                stream_messages(self.service, token_stream, encoder, trace.stamps, meter=meter)
            )
        await self._send_all(stream, messages, stamps, meter)

    async def _generate_batched(self, stream: grpclib.server.Stream[Any, Any]) -> None:
        token_stream, stamps, received_ns, meter = await self._opened(stream)
        trace = None
        if self.tracer is not None:
            trace = self._trace(stream, token_stream, stamps, received_ns)
        pieces = stream_frames(
            self.service,
            token_stream,
            self.codec.stream_encoder(),
            stamps if trace is None else trace.stamps,
            max_chunks=BATCH_CHUNKS,
            end_in_last=True,
            meter=meter,
        )
        if trace is not None:
            pieces = trace.frames(pieces)
        await self._send_all(stream, _stream_bytes(pieces), stamps, meter)

    async def _session(self, stream: grpclib.server.Stream[Any, Any]) -> None:
        while (data := await self._next(stream)) is not None:
            try:
                request_id, kind, body = envelope.read(data, "grpclib Session")
            except ProtocolError as exc:
                self._refused(now_ns())
                raise grpclib.exceptions.GRPCError(Status.INVALID_ARGUMENT, str(exc)) from exc
            meter = None if self.metrics is None else self.metrics.start("unary")
            try:
                async for message in self._session_turn(request_id, kind, body, meter):
                    await stream.send_message(self._checked(message))
                    if meter is not None:
                        meter.written(len(message))
            except BaseException as exc:
                if meter is not None:
                    meter.failed(exc)
                raise
            if meter is not None:
                meter.finish("ok")  # a no-op after a refusal

    async def _session_turn(
        self, request_id: int, kind: int, body: bytes, meter: RequestMeter | None = None
    ) -> AsyncIterator[bytes]:
        """The answers to one request of a session; a refused request is answered with an
        ``error`` and the session goes on."""
        try:
            if kind == RequestKind.INFER:
                yield envelope.write(request_id, ResponseKind.INFER, self._answer(body))
                return
            if kind != RequestKind.GENERATE:
                raise BadRequestError(f"a SessionRequest carries infer or generate, not {kind}")
            token_stream = self._open(body)
        except BadRequestError as exc:
            if meter is not None:
                meter.finish("bad_request")
            yield envelope.write(request_id, ResponseKind.ERROR, str(exc).encode())
            return
        if meter is not None:
            meter.kind = "stream"
        messages = stream_messages(
            self.service, token_stream, self.codec.message_encoder(), None, meter=meter
        )
        async with contextlib.aclosing(messages):
            async for message in messages:
                yield envelope.write(request_id, ResponseKind.CHUNK, message)
        yield envelope.write_end(request_id, len(token_stream.chunks))


async def _stream_bytes(pieces: AsyncGenerator[bytes, None]) -> AsyncGenerator[bytes, None]:
    """Each piece of the codec's stream bytes in a ``StreamBytes``."""
    async with contextlib.aclosing(pieces):
        async for piece in pieces:
            yield envelope.write_stream_bytes(piece)
