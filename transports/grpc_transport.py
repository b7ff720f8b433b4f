"""``grpc``: grpcio's asyncio API, on the ``inferwire.v1.Inference`` service of ``schemas/``.

``Infer`` is unary, ``Generate`` server-streaming, ``Session`` one long-lived bidirectional
stream carrying many requests in turn. The request of ``Generate`` is always the schema's
``GenerateRequest``; what the codec decides is how the model's messages travel:

* ``protobuf`` is native: the client calls the generated ``InferenceStub`` and the messages are
  the schema's own;
* any other codec is carried as bytes through custom (de)serializers, one codec message per
  gRPC message; a stateful stream codec (``delta``) sends its stream's bytes, header and end
  marker included, one frame per gRPC message;
* on ``Session``, other codecs tag each message with one byte (``G``/``I`` requests with a
  request id; ``C`` chunk, ``E`` end, ``I`` infer response, ``X`` error).

The server decodes requests inside its handlers (not in gRPC's deserializer), so a malformed
request is ``INVALID_ARGUMENT`` rather than gRPC's generic ``INTERNAL``.
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import Any, ClassVar, Final

import grpc
import grpc.aio

import inferwire.codecs as ic
from inferwire.codecs import protobuf_codec
from inferwire.codecs.delta_codec import DeltaCodec
from inferwire.schemas import inferwire_pb2 as pb
from inferwire.schemas import inferwire_pb2_grpc as pb_grpc

from .base import Client, Server
from .errors import (
    CancelledByPeerError,
    ConnectError,
    MessageTooLargeError,
    ProtocolError,
    RemoteError,
    StreamTruncatedError,
    TransportError,
    TransportTimeoutError,
)
from .service import BadRequestError, GenerateRequest
from .timing import TRAILER, ServerStamps, StreamTiming, now_ns, unpack

TRAILER_BIN: Final = TRAILER + "-bin"
SERVICE: Final = pb.DESCRIPTOR.services_by_name["Inference"].full_name
_ID: Final = struct.Struct(">Q")


def _path(method: str) -> str:
    return f"/{SERVICE}/{method}"


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


def _stateful(codec: ic.Codec) -> bool:
    return isinstance(codec, DeltaCodec)


class GrpcServer(Server):
    transport: ClassVar[str] = "grpc"

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self._grpc: grpc.aio.Server | None = None
        self._stopped = asyncio.Event()
        self.native = isinstance(self.codec, protobuf_codec.ProtobufCodec)

    async def start(self) -> tuple[str, int]:
        server = grpc.aio.server(
            options=[*_channel_options(self.limits.max_message_bytes), ("grpc.so_reuseport", 0)]
        )
        handlers = {
            "Infer": grpc.unary_unary_rpc_method_handler(self._infer),
            "Generate": grpc.unary_stream_rpc_method_handler(self._generate),
            "Session": grpc.stream_stream_rpc_method_handler(self._session),
        }
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
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
        if server is not None:
            await server.stop(grace=1.0)
        self._stopped.set()

    # -- handlers: bytes in, bytes out ----------------------------------------------------

    def _generate_request(self, data: bytes) -> GenerateRequest:
        try:
            request = _request_from_pb(pb.GenerateRequest.FromString(data))
            self.service.chunks(request)
        except Exception as exc:  # protobuf's DecodeError, or ours
            raise BadRequestError(f"bad GenerateRequest: {exc}") from exc
        return request

    async def _infer(self, data: bytes, context: grpc.aio.ServicerContext) -> bytes:
        try:
            response = self.service.infer(self.codec.decode(data, ic.InferRequest))
            return self.codec.encode(response)
        except (ic.CodecError, BadRequestError) as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
            raise  # abort raises; this line is never reached

    async def _generate(
        self, data: bytes, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[bytes]:
        received_ns = now_ns()
        if ic.TokenChunk not in self.codec.types:
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"codec {self.codec.name!r} does not carry token streams",
            )
        try:
            request = self._generate_request(data)
        except BadRequestError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        if not request.timing:
            async for message in self._stream(request):
                yield message
            return
        stamps = ServerStamps(received_ns)
        stamps.parsed()
        async for message in self._stream(request, stamps):
            yield message
            stamps.written()  # grpc took the message: the nearest to "written" it tells
        context.set_trailing_metadata(((TRAILER_BIN, stamps.pack()),))

    async def _stream(
        self, request: GenerateRequest, stamps: ServerStamps | None = None
    ) -> AsyncGenerator[bytes, None]:
        encoder = self.codec.stream_encoder() if _stateful(self.codec) else None
        encode = encoder.encode if encoder is not None else self.codec.encode
        async with contextlib.aclosing(self.service.generate(request)) as chunks:
            if stamps is None:
                async for chunk in chunks:
                    yield encode(chunk)
            else:
                async for chunk in chunks:
                    produced = now_ns()
                    data = encode(chunk)
                    stamps.encoded(produced, now_ns())
                    yield data
        if encoder is not None:
            yield encoder.end()

    async def _session(
        self, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[bytes]:
        async for data in requests:
            if self.native:
                async for message in self._native_session_turn(data):
                    yield message
            else:
                async for message in self._tagged_session_turn(data):
                    yield message

    async def _native_session_turn(self, data: bytes) -> AsyncIterator[bytes]:
        try:
            message = pb.SessionRequest.FromString(data)
        except Exception as exc:
            raise BadRequestError(f"bad SessionRequest: {exc}") from exc
        request_id = message.request_id
        kind = message.WhichOneof("kind")
        if kind == "infer":
            request = protobuf_codec.request_from_pb(message.infer)
            response = protobuf_codec.response_to_pb(self.service.infer(request))
            yield pb.SessionResponse(request_id=request_id, infer=response).SerializeToString()
            return
        if kind != "generate":
            raise BadRequestError("a SessionRequest carries infer or generate")
        generate = _request_from_pb(message.generate)
        self.service.chunks(generate)
        count = 0
        async with contextlib.aclosing(self.service.generate(generate)) as chunks:
            async for chunk in chunks:
                count += 1
                yield pb.SessionResponse(
                    request_id=request_id, chunk=protobuf_codec.chunk_to_pb(chunk)
                ).SerializeToString()
        yield pb.SessionResponse(
            request_id=request_id, end=pb.StreamEnd(chunk_count=count)
        ).SerializeToString()

    async def _tagged_session_turn(self, data: bytes) -> AsyncIterator[bytes]:
        if len(data) < 9 or data[:1] not in (b"G", b"I"):
            raise BadRequestError("a session message is G or I, an 8-byte id, a body")
        request_id = data[1:9]
        body = data[9:]
        try:
            if data[:1] == b"I":
                response = self.service.infer(self.codec.decode(body, ic.InferRequest))
                yield b"I" + request_id + self.codec.encode(response)
                return
            request = self._generate_request(body)
        except (ic.CodecError, BadRequestError) as exc:
            yield b"X" + request_id + str(exc).encode()
            return
        count = 0
        async for message in self._stream(request):
            count += 1
            yield b"C" + request_id + message
        if _stateful(self.codec):
            count -= 1  # the stream's end marker went as one more message
        yield b"E" + request_id + _ID.pack(count)


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


class GrpcClient(Client):
    """One channel, reused by every call. ``deadline_s`` bounds each call (None: no deadline)."""

    transport: ClassVar[str] = "grpc"

    def __init__(self, *args: object, deadline_s: float | None = None, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.deadline_s = deadline_s
        target = f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"
        options = [*_channel_options(self.limits.max_message_bytes), *_RECONNECT_OPTIONS]
        if self.tls is not None:
            credentials = grpc.ssl_channel_credentials(root_certificates=self.tls.ca_pem)
            self.channel = grpc.aio.secure_channel(target, credentials, options=options)
        else:
            self.channel = grpc.aio.insecure_channel(target, options=options)
        self.native = isinstance(self.codec, protobuf_codec.ProtobufCodec)
        self._stub = pb_grpc.InferenceStub(self.channel)  # type: ignore[no-untyped-call]
        self._infer_bytes = self.channel.unary_unary(_path("Infer"))
        self._generate_bytes = self.channel.unary_stream(
            _path("Generate"), request_serializer=pb.GenerateRequest.SerializeToString
        )

    def _check_size(self, size: int) -> None:
        if size > self.limits.max_message_bytes:
            raise MessageTooLargeError(f"grpc: request of {size} bytes is over the limit")

    async def infer(self, request: ic.InferRequest) -> ic.InferResponse:
        try:
            if self.native:
                pb_request = protobuf_codec.request_to_pb(request)
                self._check_size(pb_request.ByteSize())
                message = await self._stub.Infer(pb_request, timeout=self.deadline_s)
                return protobuf_codec.response_from_pb(message)
            payload = self.codec.encode(request)
            self._check_size(len(payload))
            data = await self._infer_bytes(payload, timeout=self.deadline_s)
        except grpc.aio.AioRpcError as exc:
            raise _translate(exc, "Infer") from exc
        except asyncio.CancelledError as exc:
            if _task_cancelled():
                raise
            raise CancelledByPeerError(
                "grpc Infer: the call was cancelled (client closed)"
            ) from exc
        try:
            return self.codec.decode(data, ic.InferResponse)
        except ic.CodecError as exc:
            raise ProtocolError(f"grpc Infer: {exc}") from exc

    async def generate(
        self, request: GenerateRequest, *, timing: StreamTiming | None = None
    ) -> AsyncIterator[ic.TokenChunk]:
        if timing is not None:
            timing.request_start_ns = now_ns()
        message = _request_to_pb(request)
        if timing is not None:
            message.timing = True
        count = 0
        if self.native:
            call: Any = self._stub.Generate(message, timeout=self.deadline_s)
            convert: Callable[[Any], list[ic.TokenChunk]] = lambda m: [  # noqa: E731
                protobuf_codec.chunk_from_pb(m)
            ]
            decoder = None
        else:
            call = self._generate_bytes(message, timeout=self.deadline_s)
            if _stateful(self.codec):
                decoder = self.codec.stream_decoder(max_frame_bytes=self.limits.max_message_bytes)
                convert = decoder.feed
            else:
                decoder = None
                decode = self.codec.decode
                convert = lambda m: [decode(m, ic.TokenChunk)]  # noqa: E731
        if timing is not None:
            # grpc serializes and sends in the background: the call is started by now
            timing.request_sent_ns = now_ns()
        done = False
        try:
            async for data in call:
                received = now_ns() if timing is not None else 0
                try:
                    chunks = convert(data)
                except ic.CodecError as exc:
                    raise ProtocolError(f"grpc Generate: {exc}") from exc
                if timing is not None:
                    timing.decoded(len(chunks), received)
                for chunk in chunks:
                    count += 1
                    yield chunk
            if decoder is not None:
                try:
                    decoder.close()
                except ic.IncompleteStreamError as exc:
                    raise StreamTruncatedError(
                        f"grpc Generate: stream ended after {count} chunks", chunks_received=count
                    ) from exc
            if timing is not None:
                trailing = dict(await call.trailing_metadata() or ())
                packed = trailing.get(TRAILER_BIN)
                if not isinstance(packed, bytes):
                    raise ProtocolError("grpc Generate: the timed stream has no timing trailer")
                timing.set_server(unpack(packed))
            done = True
        except grpc.aio.AioRpcError as exc:
            raise _translate(exc, "Generate", count) from exc
        except asyncio.CancelledError as exc:
            if _task_cancelled():
                raise
            raise StreamTruncatedError(
                f"grpc Generate: the call was cancelled (client closed) after {count} chunks",
                chunks_received=count,
            ) from exc
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

    async def _write(self, message: bytes) -> None:
        try:
            await self._call.write(message)
        except grpc.aio.AioRpcError as exc:
            raise _translate(exc, "Session") from exc
        except (asyncio.CancelledError, asyncio.InvalidStateError) as exc:
            # grpc's word for a call that has ended (closed, cancelled) under the writer
            if isinstance(exc, asyncio.CancelledError) and _task_cancelled():
                raise
            raise ProtocolError("grpc Session: the session has ended") from exc

    async def _read(self, what: str, count: int = 0) -> bytes:
        try:
            data = await self._call.read()
        except grpc.aio.AioRpcError as exc:
            raise _translate(exc, what, count) from exc
        except asyncio.CancelledError as exc:
            # the call was cancelled under the reader (the session closed): a truncated
            # stream, as for Generate; only our own task's cancellation is re-raised
            if _task_cancelled():
                raise
            raise StreamTruncatedError(
                f"grpc {what}: the session was cancelled after {count} chunks",
                chunks_received=count,
            ) from exc
        if data is grpc.aio.EOF:
            raise StreamTruncatedError(f"grpc {what}: session ended", chunks_received=count)
        return bytes(data)

    async def generate(self, request: GenerateRequest) -> AsyncIterator[ic.TokenChunk]:
        async with self._lock:
            request_id, self._next_id = self._next_id, self._next_id + 1
            codec = self.client.codec
            message = _request_to_pb(request)
            native = self.client.native
            if native:
                await self._write(
                    pb.SessionRequest(request_id=request_id, generate=message).SerializeToString()
                )
            else:
                await self._write(b"G" + _ID.pack(request_id) + message.SerializeToString())
            decoder = codec.stream_decoder() if _stateful(codec) else None
            count = 0
            while True:
                data = await self._read("Session", count)
                if native:
                    response = pb.SessionResponse.FromString(data)
                    if response.request_id != request_id:
                        raise ProtocolError("grpc Session: answer to another request")
                    kind = response.WhichOneof("kind")
                    if kind == "end":
                        if response.end.chunk_count != count:
                            raise StreamTruncatedError(
                                "grpc Session: chunk count mismatch", chunks_received=count
                            )
                        return
                    count += 1
                    yield protobuf_codec.chunk_from_pb(response.chunk)
                    continue
                tag, body = data[:1], data[9:]
                if _ID.unpack_from(data, 1)[0] != request_id:
                    raise ProtocolError("grpc Session: answer to another request")
                if tag == b"X":
                    raise RemoteError("INVALID_ARGUMENT", body.decode(errors="replace"))
                if tag == b"E":
                    if _ID.unpack(body)[0] != count or (decoder and not decoder.finished):
                        raise StreamTruncatedError(
                            "grpc Session: stream incomplete", chunks_received=count
                        )
                    return
                try:
                    chunks = decoder.feed(body) if decoder else [codec.decode(body, ic.TokenChunk)]
                except ic.CodecError as exc:
                    raise ProtocolError(f"grpc Session: {exc}") from exc
                for chunk in chunks:
                    count += 1
                    yield chunk
