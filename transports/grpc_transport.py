"""``grpc``: grpcio's asyncio API, on the ``inferwire.v1.Inference`` service of ``schemas/``.

``Infer`` is unary, ``Generate`` and ``GenerateBatched`` server-streaming, ``Session`` one
long-lived bidirectional stream carrying many requests in turn. The request of both generates
is always the schema's ``GenerateRequest``; the model's messages are the codec's bytes, carried
through generic (bytes in, bytes out) handlers and calls:

* ``Generate`` sends a token stream as the codec's *message stream*
  (:meth:`inferwire.codecs.Codec.message_encoder`), one gRPC message each: with a codec whose
  chunks are independent (``protobuf``, the JSON and MessagePack codecs) one chunk a message,
  so that with ``protobuf`` ``Generate`` is exactly the schema's ``stream TokenChunk``; with a
  stateful one (``delta``) one frame a message, header and end marker included. It is the
  one-chunk-per-message reference, and what a gRPC client of the schema expects;
* ``GenerateBatched`` sends one message per batch of due chunks: the codec's *stream* bytes of
  the batch (what ``tcp`` writes at once), in a ``StreamBytes``, the end marker with the last
  (:mod:`inferwire.transports.grpc_envelope`). Each gRPC message costs tens of microseconds on
  each end whatever it holds, so when the model outruns the wire this is the difference
  between paying that per token and per batch; paced, a batch holds the one chunk that is due,
  sent as soon as it is, so neither waits for the other. A client asks for it with
  ``batched=True`` (``it.connect("grpc", address, batched=True)``);
* ``Infer`` carries the codec's ``InferRequest`` and ``InferResponse``;
* ``Session`` wraps each in the schema's envelopes (:mod:`inferwire.transports.grpc_envelope`).

Compression (``compression="gzip"`` or ``"deflate"`` on :class:`GrpcServer` and
:class:`GrpcClient`): grpcio's own message compression (gRPC's doc/compression.md). The server's
compresses its answers for a client that accepts the coding (grpcio's do, all of them), the
client's its requests; either end decodes whatever the other sends, and grpcio bounds the
decoded message by ``grpc.max_receive_message_length`` (the limits' ``max_message_bytes``), so
a bomb is ``RESOURCE_EXHAUSTED`` (:class:`MessageTooLargeError`), never a decoded gigabyte.

The client decodes with the codec, so every decode limit of the codec holds on gRPC as on the
other transports. The server decodes requests inside its handlers (not in gRPC's
deserializer), so a malformed request is ``INVALID_ARGUMENT`` rather than gRPC's ``INTERNAL``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Iterator
from typing import TYPE_CHECKING, Any, ClassVar, Final

import grpc
import grpc.aio
from google.protobuf import message as protobuf_message

import inferwire.codecs as ic
from inferwire.schemas import inferwire_pb2 as pb

from . import grpc_envelope as envelope
from . import kserve_grpc
from .base import Client, Server
from .common import log_failure, translate
from .errors import (
    BadRequestError,
    CancelledByPeerError,
    ConnectError,
    MessageTooLargeError,
    ProtocolError,
    RemoteError,
    ServiceUnavailableError,
    StreamTruncatedError,
    TransportError,
    TransportTimeoutError,
)
from .grpc_envelope import RequestKind, ResponseKind
from .grpc_standard import StandardServices
from .service import GenerateRequest, TokenStream
from .streams import ChunkReader, stream_frames, stream_messages
from .timing import TRACEPARENT, TRAILER, ServerStamps, StreamTiming, now_ns, unpack

if TYPE_CHECKING:
    from .metrics import RequestMeter
    from .tracing import ServerTrace

TRAILER_BIN: Final = TRAILER + "-bin"
_log = logging.getLogger(__name__)
BATCH_CHUNKS: Final = 256
"""Most chunks one ``GenerateBatched`` message carries. The other transports write at most
``MAX_BATCH_CHUNKS`` (32, about 8 KiB of SSE) at once, a socket write being cheap; a gRPC
message costs tens of microseconds on each end whatever it holds, so here everything that is
due goes at once up to a bound of its own (256 chunks: some 70 KiB of SSE, 400 KiB with top-5
logprobs, far inside the 4 MiB message limit). Paced, a batch holds what is due, one chunk,
whatever the bound."""
INFERENCE: Final = pb.DESCRIPTOR.services_by_name["Inference"]
SERVICE: Final = INFERENCE.full_name


def _path(method: str) -> str:
    return f"/{SERVICE}/{method}"


GRPC_CODINGS: Final = ("gzip", "deflate")
"""The message codings grpcio implements (and ``identity``)."""


def grpc_compression(name: str | None) -> grpc.Compression:
    """grpcio's value for a coding's name (None: no compression)."""
    if name is None:
        return grpc.Compression.NoCompression
    if name not in GRPC_CODINGS:
        raise ValueError(f"grpc compression must be one of {', '.join(GRPC_CODINGS)}, not {name!r}")
    return grpc.Compression.Gzip if name == "gzip" else grpc.Compression.Deflate


def _channel_options(max_message_bytes: int) -> list[tuple[str, Any]]:
    return [
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_send_message_length", max_message_bytes),
    ]


_RECONNECT_OPTIONS: Final[list[tuple[str, Any]]] = [
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
]
"""A lost connection is retried within a second, not after grpc's default backoff (1 s growing
1.6x to 2 minutes, gRPC's doc/connection-backoff.md), during which every call fails at once
although the server may be back: a server restarted mid-run would look down for minutes. The
connect timeout (min_reconnect_backoff, 20 s) stays, for slow links."""


def _request_from_pb(message: pb.GenerateRequest) -> GenerateRequest:
    return GenerateRequest(
        workload=message.workload,
        seed=message.seed,
        max_tokens=message.max_tokens or None,
        prompt_tokens=message.prompt_tokens,
        model=message.model,
        timing=message.timing,
    )


def _request_to_pb(request: GenerateRequest) -> pb.GenerateRequest:
    return pb.GenerateRequest(
        workload=request.workload,
        seed=request.seed,
        max_tokens=request.max_tokens or 0,
        prompt_tokens=request.prompt_tokens,
        model=request.model,
        timing=request.timing,
    )


class GrpcServer(Server):
    """``compression``: ``"gzip"`` or ``"deflate"`` for the answers' messages (None: none).
    ``allow_client_shm``: whether KServe clients may register shared memory regions
    (``serve --allow-client-shm``, :mod:`.kserve_shm`); :meth:`stop` unmaps them."""

    transport: ClassVar[str] = "grpc"

    def __init__(
        self,
        *args: object,
        compression: str | None = None,
        allow_client_shm: bool = False,
        **kwargs: object,
    ) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.compression = grpc_compression(compression)
        self.allow_client_shm = allow_client_shm
        self._kserve: kserve_grpc.KServeGrpc | None = None
        self._grpc: grpc.aio.Server | None = None
        self._stopped = asyncio.Event()
        self._standard: StandardServices | None = None

    async def start(self) -> tuple[str, int]:
        server = grpc.aio.server(
            options=[*_channel_options(self.limits.max_message_bytes), ("grpc.so_reuseport", 0)],
            compression=self.compression,
        )
        handlers = {
            "Infer": grpc.unary_unary_rpc_method_handler(self._infer),
            "Generate": grpc.unary_stream_rpc_method_handler(self._generate),
            "GenerateBatched": grpc.unary_stream_rpc_method_handler(self._generate_batched),
            "Session": grpc.stream_stream_rpc_method_handler(self._session),
        }
        # KServe v2 / Open Inference Protocol
        kserve = kserve_grpc.KServeGrpc(
            self.service, metrics=self.metrics, allow_client_shm=self.allow_client_shm
        )
        self._kserve = kserve
        server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(SERVICE, handlers), kserve.handler())
        )
        self._standard = StandardServices([INFERENCE, kserve_grpc.DESCRIPTOR])
        await self._standard.add(server)  # health and reflection
        target = f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"
        if self.tls is not None:
            credentials = grpc.ssl_server_credentials([(self.tls.key_pem, self.tls.cert_chain_pem)])
            port = server.add_secure_port(target, credentials)
        else:
            port = server.add_insecure_port(target)
        if port == 0:
            raise ConnectError(f"grpc: cannot bind {target}")
        await server.start()
        self._grpc = server
        self.address = (self.host, port)
        return self.address

    async def serve_forever(self) -> None:
        # our own event, not grpc's wait_for_termination: cancelling that one breaks a later
        # stop() (grpc's shutdown then raises CancelledError)
        if self._grpc is None:
            await self.start()
        await self._stopped.wait()

    async def stop(self) -> None:
        server, self._grpc = self._grpc, None
        if self._standard is not None:
            await self._standard.stopping()
        if server is not None:
            await server.stop(grace=1.0)
        if self._kserve is not None:  # after the calls that may still read a region
            self._kserve.close()
        self._stopped.set()

    # -- handlers: bytes in, bytes out ----------------------------------------------------

    def _open(self, data: bytes) -> TokenStream:
        """The stream a ``GenerateRequest`` asks for. Raises :class:`BadRequestError`."""
        if ic.TokenChunk not in self.codec.types:
            raise BadRequestError(f"codec {self.codec.name!r} does not carry token streams")
        try:
            request = _request_from_pb(pb.GenerateRequest.FromString(data))
        except (protobuf_message.DecodeError, BadRequestError) as exc:
            raise BadRequestError(f"bad GenerateRequest: {exc}") from exc
        return self.service.open(request)

    def _answer(self, data: bytes) -> bytes:
        """The codec's ``InferResponse`` to the codec's ``InferRequest`` in ``data``."""
        try:
            return self.codec.encode(self.service.infer(self.codec.decode(data, ic.InferRequest)))
        except ic.CodecError as exc:
            raise BadRequestError(str(exc)) from exc

    def _messages(
        self,
        stream: TokenStream,
        stamps: ServerStamps | None = None,
        meter: RequestMeter | None = None,
    ) -> AsyncGenerator[bytes, None]:
        """The gRPC messages of one stream: one chunk (or delta frame) a message."""
        encoder = self.codec.message_encoder()
        return stream_messages(self.service, stream, encoder, stamps, meter=meter)

    async def _infer(self, data: bytes, context: grpc.aio.ServicerContext) -> bytes:
        meter = None if self.metrics is None else self.metrics.start("unary")
        try:
            answer = self._answer(data)
        except BadRequestError as exc:
            if meter is not None:
                meter.finish("bad_request")
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
            raise  # abort raises; this line is never reached
        except Exception:
            if meter is not None:
                meter.finish("error")
            raise
        if meter is not None:
            meter.written(len(answer))  # what grpc sends when this returns
            meter.finish("ok")
        return answer

    def _refused(self, received_ns: int) -> None:
        if self.metrics is not None:
            self.metrics.answered("unary", "bad_request", received_ns)

    async def _opened(
        self, data: bytes, context: grpc.aio.ServicerContext
    ) -> tuple[TokenStream, ServerStamps | None, int, RequestMeter | None]:
        """The stream a generate RPC asks for, its stamps if it asked for timing, when it was
        received, and its meter if the server records metrics; a request that cannot be
        served is aborted with its status."""
        received_ns = now_ns()
        if ic.TokenChunk not in self.codec.types:
            self._refused(received_ns)
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"codec {self.codec.name!r} does not carry token streams",
            )
        try:
            stream = self._open(data)
        except BadRequestError as exc:
            self._refused(received_ns)
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
            raise  # abort raises; this line is never reached
        stamps = None
        if stream.request.timing:
            stamps = ServerStamps(received_ns)
            stamps.parsed()
        meter = None if self.metrics is None else self.metrics.start("stream", received_ns)
        return stream, stamps, received_ns, meter

    def _trace(
        self,
        context: grpc.aio.ServicerContext,
        stream: TokenStream,
        stamps: ServerStamps | None,
        received_ns: int,
    ) -> ServerTrace:
        """A traced server's trace of a stream, parented by the call's ``traceparent``."""
        assert self.tracer is not None
        metadata = dict(context.invocation_metadata() or ())
        return self.tracer.server_request(
            metadata.get(TRACEPARENT), received_ns, stamps, stream.request.workload, stream.stamps
        )

    @staticmethod
    def _send_stamps(context: grpc.aio.ServicerContext, stamps: ServerStamps | None) -> None:
        if stamps is not None:
            context.set_trailing_metadata(((TRAILER_BIN, stamps.pack()),))

    # The two generates write with context.write (grpc's reader/writer API) rather than being
    # async generators themselves: grpc would otherwise drive one more generator per message
    # (its loop over the handler's, which loops over ours).

    async def _generate(self, data: bytes, context: grpc.aio.ServicerContext) -> None:
        stream, stamps, received_ns, meter = await self._opened(data, context)
        if self.tracer is None:
            messages = self._messages(stream, stamps, meter)
        else:
            trace = self._trace(context, stream, stamps, received_ns)
            messages = trace.frames(self._messages(stream, trace.stamps, meter))
        write = context.write
        try:
            async with contextlib.aclosing(messages):
                async for message in messages:
                    await write(message)
                    if stamps is not None:
                        stamps.written()  # grpc sent the message: the nearest to "written"
                    if meter is not None:
                        meter.written(len(message))
        except ServiceUnavailableError as exc:
            await self._unavailable(context, exc, meter)
        except BaseException as exc:
            if meter is not None:
                meter.failed(exc)
            raise
        self._send_stamps(context, stamps)
        if meter is not None:
            meter.finish("ok")

    async def _generate_batched(self, data: bytes, context: grpc.aio.ServicerContext) -> None:
        stream, stamps, received_ns, meter = await self._opened(data, context)
        encoder = self.codec.stream_encoder()
        trace = None
        if self.tracer is not None:
            trace = self._trace(context, stream, stamps, received_ns)
        pieces = stream_frames(
            self.service,
            stream,
            encoder,
            stamps if trace is None else trace.stamps,
            max_chunks=BATCH_CHUNKS,
            end_in_last=True,
            meter=meter,
        )
        if trace is not None:
            pieces = trace.frames(pieces)
        try:
            async with contextlib.aclosing(pieces):
                async for piece in pieces:
                    message = envelope.write_stream_bytes(piece)
                    await context.write(message)
                    if stamps is not None:
                        stamps.written()
                    if meter is not None:
                        meter.written(len(message))
        except ServiceUnavailableError as exc:
            await self._unavailable(context, exc, meter)
        except BaseException as exc:
            if meter is not None:
                meter.failed(exc)
            raise
        self._send_stamps(context, stamps)
        if meter is not None:
            meter.finish("ok")

    @staticmethod
    async def _unavailable(
        context: grpc.aio.ServicerContext, exc: ServiceUnavailableError, meter: RequestMeter | None
    ) -> None:
        """The service could not finish the stream: ``UNAVAILABLE`` (a client may retry), and
        one line in the log (:func:`~inferwire.transports.common.log_failure`)."""
        if meter is not None:
            meter.failed(exc)
        log_failure(_log, "grpc: stream failed", exc)
        await context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))

    async def _session(
        self, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[bytes]:
        async for data in requests:
            try:
                request_id, kind, body = envelope.read(data, "grpc Session")
            except ProtocolError as exc:
                self._refused(now_ns())
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
            meter = None if self.metrics is None else self.metrics.start("unary")
            try:
                async for message in self._session_turn(request_id, kind, body, meter):
                    yield message
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
            stream = self._open(body)
        except BadRequestError as exc:
            if meter is not None:
                meter.finish("bad_request")
            yield envelope.write(request_id, ResponseKind.ERROR, str(exc).encode())
            return
        if meter is not None:
            meter.kind = "stream"
        messages = self._messages(stream, None, meter)
        async with contextlib.aclosing(messages):
            async for message in messages:
                yield envelope.write(request_id, ResponseKind.CHUNK, message)
        yield envelope.write_end(request_id, len(stream.chunks))


def _translate(exc: grpc.aio.AioRpcError, what: str, count: int = 0) -> TransportError:
    code = exc.code()
    detail = exc.details() or ""
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return TransportTimeoutError(f"grpc {what}: deadline exceeded")
    if code == grpc.StatusCode.CANCELLED:
        return CancelledByPeerError(f"grpc {what}: cancelled: {detail}")
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        return MessageTooLargeError(f"grpc {what}: {detail}")
    if code == grpc.StatusCode.UNAVAILABLE:
        if count:
            return StreamTruncatedError(
                f"grpc {what}: connection lost after {count} chunks: {detail}",
                chunks_received=count,
            )
        return ConnectError(f"grpc {what}: unavailable: {detail}")
    return RemoteError(code.name, detail)


def _task_cancelled() -> bool:
    """Whether a CancelledError is our task being cancelled (to be re-raised), rather than
    grpc cancelling the call under us (a closed channel), which is a transport error."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


@contextlib.contextmanager
def _mapped(what: str, stream: ChunkReader | None = None) -> Iterator[None]:
    """The client's one error boundary: grpc's status errors by code, a call cancelled under
    us (the channel or session closed; our own task's cancellation passes), codec errors."""
    try:
        yield
    except grpc.aio.AioRpcError as exc:
        raise _translate(exc, what, 0 if stream is None else stream.count) from exc
    except asyncio.CancelledError as exc:
        if _task_cancelled():
            raise
        if stream is None:
            raise CancelledByPeerError(f"grpc {what}: the call was cancelled") from exc
        raise stream.truncated("the call was cancelled") from exc
    except asyncio.InvalidStateError as exc:  # grpc's word for a call that has already ended
        raise ProtocolError(f"grpc {what}: the call has ended") from exc
    except Exception as exc:
        ours = translate(exc, f"grpc {what}")
        if ours is exc:
            raise
        raise ours from exc


class GrpcClient(Client):
    """One channel, reused by every call. ``deadline_s`` bounds each call (None: no deadline).
    ``batched``: :meth:`generate` calls ``GenerateBatched`` (one message per batch of due
    chunks) rather than ``Generate`` (one per chunk). ``compression``: ``"gzip"`` or
    ``"deflate"`` for the requests' messages (None: none); answers are decoded whatever they
    are in."""

    transport: ClassVar[str] = "grpc"

    def __init__(
        self,
        *args: object,
        deadline_s: float | None = None,
        batched: bool = False,
        compression: str | None = None,
        **kwargs: object,
    ) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        if type(batched) is not bool:
            raise ValueError("batched must be True or False")
        coding = grpc_compression(compression)
        self.deadline_s = deadline_s
        self.batched = batched
        target = f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"
        options = [*_channel_options(self.limits.max_message_bytes), *_RECONNECT_OPTIONS]
        if self.tls is not None:
            credentials = grpc.ssl_channel_credentials(root_certificates=self.tls.ca_pem)
            self.channel = grpc.aio.secure_channel(
                target, credentials, options=options, compression=coding
            )
        else:
            self.channel = grpc.aio.insecure_channel(target, options=options, compression=coding)
        self._infer_bytes = self.channel.unary_unary(_path("Infer"))
        self._method = "GenerateBatched" if batched else "Generate"
        self._what = f"grpc {self._method}"
        self._generate_bytes = self.channel.unary_stream(
            _path(self._method), request_serializer=pb.GenerateRequest.SerializeToString
        )

    def _check_size(self, size: int) -> None:
        if size > self.limits.max_message_bytes:
            raise MessageTooLargeError(f"grpc: request of {size} bytes is over the limit")

    def _reader(self, timing: StreamTiming | None = None) -> ChunkReader:
        # batched: the codec's stream bytes, in pieces; else its message stream
        reader = ChunkReader.of_bytes if self.batched else ChunkReader.of_messages
        return reader(self.codec, self.limits.max_message_bytes, self._what, timing)

    async def infer(self, request: ic.InferRequest) -> ic.InferResponse:
        payload = self.codec.encode(request)
        self._check_size(len(payload))
        with _mapped("Infer"):
            data = await self._infer_bytes(payload, timeout=self.deadline_s)
            return self.codec.decode(data, ic.InferResponse)

    async def generate(
        self, request: GenerateRequest, *, timing: StreamTiming | None = None
    ) -> AsyncIterator[ic.TokenChunk]:
        metadata = None
        if timing is not None:
            timing.request_start_ns = now_ns()
        message = _request_to_pb(request)
        if timing is not None:
            message.timing = timing.server_stamps
            timing.request_encoded_ns = now_ns()  # grpc serializes it when it sends it
            if timing.traceparent:
                metadata = ((TRACEPARENT, timing.traceparent),)
        stream = self._reader(timing)
        if timing is not None:
            timing.request_write_ns = now_ns()  # grpc writes in the background, from here
        call = self._generate_bytes(message, timeout=self.deadline_s, metadata=metadata)
        if timing is not None:
            # grpc serializes and sends in the background: the call is started by now
            timing.request_sent_ns = now_ns()
        done = False
        what = self._what
        batched = self.batched
        try:
            with _mapped(self._method, stream):
                async for data in call:
                    if batched:
                        data = envelope.read_stream_bytes(data, what)
                    for chunk in stream.feed(data):
                        yield chunk
                stream.close()
                if timing is not None and timing.server_stamps:
                    trailing = dict(await call.trailing_metadata() or ())
                    packed = trailing.get(TRAILER_BIN)
                    if not isinstance(packed, bytes):
                        raise ProtocolError(f"{what}: the timed stream has no timing trailer")
                    timing.set_server(unpack(packed))
            done = True
        finally:
            if not done:
                call.cancel()

    def session(self) -> GrpcSession:
        """A long-lived bidirectional stream; requests on it take turns."""
        return GrpcSession(self)

    async def close(self) -> None:
        await self.channel.close(grace=None)


class GrpcSession:
    """Many requests over one ``Session`` call. Use as an async context manager."""

    def __init__(self, client: GrpcClient) -> None:
        self.client = client
        self._call: Any = client.channel.stream_stream(_path("Session"))(timeout=client.deadline_s)
        self._lock = asyncio.Lock()
        self._next_id = 1

    async def __aenter__(self) -> GrpcSession:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        with contextlib.suppress(grpc.aio.AioRpcError, asyncio.InvalidStateError):
            await self._call.done_writing()
        self._call.cancel()

    async def _read(self, request_id: int, stream: ChunkReader) -> tuple[int, bytes]:
        """The next answer to ``request_id``: (its kind, its bytes)."""
        with _mapped("Session", stream):
            data = await self._call.read()
        if data is grpc.aio.EOF:
            raise stream.truncated("session ended")
        answered, kind, body = envelope.read(bytes(data), "grpc Session")
        if answered != request_id:
            raise ProtocolError("grpc Session: answer to another request")
        return kind, body

    async def generate(self, request: GenerateRequest) -> AsyncIterator[ic.TokenChunk]:
        async with self._lock:
            request_id, self._next_id = self._next_id, self._next_id + 1
            codec = self.client.codec
            stream = ChunkReader.of_messages(
                codec, self.client.limits.max_message_bytes, "grpc Session"
            )
            message = _request_to_pb(request).SerializeToString()
            with _mapped("Session", stream):
                await self._call.write(envelope.write(request_id, RequestKind.GENERATE, message))
            while True:
                kind, body = await self._read(request_id, stream)
                if kind == ResponseKind.CHUNK:
                    for chunk in stream.feed(body):
                        yield chunk
                elif kind == ResponseKind.END:
                    if envelope.read_end(body, "grpc Session") != stream.count:
                        raise stream.truncated("chunk count mismatch")
                    stream.close()
                    return
                elif kind == ResponseKind.ERROR:
                    raise RemoteError("INVALID_ARGUMENT", body.decode(errors="replace"))
                else:
                    raise ProtocolError(f"grpc Session: answer of kind {kind} to a generate")
