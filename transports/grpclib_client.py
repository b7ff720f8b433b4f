"""The ``grpclib`` transport's client (:mod:`inferwire.transports.grpclib_transport`): one
grpclib channel, ``Infer``, ``Generate`` (or ``GenerateBatched``) and ``Session`` calls, and the
one boundary where grpclib's and h2's errors become the package's own."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from types import TracebackType
from typing import ClassVar

import inferwire.codecs as ic
from inferwire._runtime.extras import needs_extras

from . import grpc_envelope as envelope
from . import grpclib_wire as wire
from .base import Client
from .common import translate
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
from .grpc_envelope import RequestKind, ResponseKind
from .service import GenerateRequest
from .streams import ChunkReader
from .timing import TRACEPARENT, StreamTiming, now_ns, unpack

with needs_extras("the grpclib transport"):
    import grpclib.client
    import grpclib.exceptions
    import h2.exceptions
    from grpclib.const import Cardinality, Status


def _from_status(exc: grpclib.exceptions.GRPCError, what: str, count: int) -> TransportError:
    """A status as ``grpc``'s client reports it (grpc_transport._translate)."""
    detail = exc.message or ""
    if exc.status is Status.DEADLINE_EXCEEDED:
        return TransportTimeoutError(f"{what}: deadline exceeded")
    if exc.status is Status.CANCELLED:
        return CancelledByPeerError(f"{what}: cancelled: {detail}")
    if exc.status is Status.RESOURCE_EXHAUSTED:
        return MessageTooLargeError(f"{what}: {detail}")
    if exc.status is Status.UNAVAILABLE:
        if count:
            return StreamTruncatedError(
                f"{what}: connection lost after {count} chunks: {detail}", chunks_received=count
            )
        return ConnectError(f"{what}: unavailable: {detail}")
    return RemoteError(exc.status.name, detail)


class _Mapped:
    """The client's one error boundary around a call: grpclib's status errors by code, a
    stream cut short (RST_STREAM, a lost connection, EOF inside a message) as
    :class:`StreamTruncatedError` on a stream, grpclib's and h2's protocol errors, and what
    :func:`~inferwire.transports.common.translate` maps (timeouts, sockets, codec errors).
    Our own task's cancellation passes."""

    __slots__ = ("call", "reader", "what")

    def __init__(self, what: str, reader: ChunkReader | None = None) -> None:
        self.what = what
        self.reader = reader
        self.call: grpclib.client.Stream[bytes, bytes] | None = None
        """The call, once made: whether its wrapper woke the task (see `wire.uncancel`)."""

    def __enter__(self) -> _Mapped:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if isinstance(exc, Exception):
            wrapper = getattr(self.call, "_wrapper", None)
            if wrapper is not None and wrapper.cancelled:
                wire.uncancel()
            ours = self._translate(exc)
            if ours is not exc:
                raise ours from exc

    def _translate(self, exc: Exception) -> Exception:
        what, reader = self.what, self.reader
        if isinstance(exc, TransportError):
            return exc
        if isinstance(exc, grpclib.exceptions.GRPCError):
            return _from_status(exc, what, 0 if reader is None else reader.count)
        if isinstance(exc, (grpclib.exceptions.StreamTerminatedError, wire.CutShortError)):
            if reader is not None:
                return reader.truncated(str(exc))
            return ProtocolError(f"{what}: {exc}")
        if isinstance(exc, TimeoutError):  # grpclib's deadline, raised in place of a cancel
            return TransportTimeoutError(f"{what}: deadline exceeded")
        if isinstance(exc, h2.exceptions.StreamClosedError) and reader is not None:
            return reader.truncated(f"stream closed: {exc}")
        # grpclib's protocol errors, h2's, and what grpclib's parsing of a malformed answer
        # lets out (a header it indexes that is not there)
        if isinstance(
            exc,
            (grpclib.exceptions.ProtocolError, h2.exceptions.H2Error, KeyError, AssertionError),
        ):
            return ProtocolError(f"{what}: {exc!r}")
        return translate(exc, what)


class GrpclibClient(Client):
    """One grpclib channel (one HTTP/2 connection), made on first use in the running loop and
    reused by every call; grpclib reconnects when it is lost. ``deadline_s`` bounds each call
    (None: no deadline; the connect is bounded by ``Limits.timeout_s``). ``batched``:
    :meth:`generate` calls ``GenerateBatched`` rather than ``Generate``."""

    transport: ClassVar[str] = "grpclib"

    def __init__(
        self,
        *args: object,
        deadline_s: float | None = None,
        batched: bool = False,
        **kwargs: object,
    ) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        if type(batched) is not bool:
            raise ValueError("batched must be True or False")
        self.deadline_s = deadline_s
        self.batched = batched
        if self.ssl_context is not None:
            self.ssl_context.set_alpn_protocols(["h2"])  # gRPC over TLS is h2 by ALPN
        self._channel: grpclib.client.Channel | None = None
        self._method = "GenerateBatched" if batched else "Generate"
        self._generate_path = wire.path(self._method)
        self._what = f"grpclib {self._method}"

    async def _connected(self) -> grpclib.client.Channel:
        """The channel, connected: grpclib connects inside a call with no bound, so it is
        connected here first, bounded (when its own check, ``_connected``, says it is not)."""
        channel = self._channel
        if channel is None:
            channel = self._channel = grpclib.client.Channel(
                self.host, self.port, codec=wire.RawCodec(), ssl=self.ssl_context
            )
        if not channel._connected:
            where = f"grpclib: connect to {self.host}:{self.port}"
            try:
                async with asyncio.timeout(self.limits.timeout_s):
                    await channel.__connect__()
            except TimeoutError as exc:
                raise TransportTimeoutError(f"{where}: timed out") from exc
            except OSError as exc:  # refused, unreachable, TLS (ssl.SSLError is an OSError)
                raise ConnectError(f"{where}: {exc}") from exc
        return channel

    def _check_size(self, size: int) -> None:
        if size > self.limits.max_message_bytes:
            raise MessageTooLargeError(f"grpclib: request of {size} bytes is over the limit")

    async def infer(self, request: ic.InferRequest) -> ic.InferResponse:
        payload = self.codec.encode(request)
        self._check_size(len(payload))
        channel = await self._connected()
        limit = self.limits.max_message_bytes
        with _Mapped("grpclib Infer") as mapped:
            call = mapped.call = channel.request(
                wire.path("Infer"), Cardinality.UNARY_UNARY, bytes, bytes, timeout=self.deadline_s
            )
            async with call:
                await call.send_message(payload, end=True)
                await call.recv_initial_metadata()
                with call._wrapper:
                    data = await wire.read_message(call._stream, limit, "grpclib Infer")
                if data is None:
                    raise ProtocolError("grpclib Infer: the call ended without an answer")
            return self.codec.decode(data, ic.InferResponse)

    async def generate(
        self, request: GenerateRequest, *, timing: StreamTiming | None = None
    ) -> AsyncIterator[ic.TokenChunk]:
        metadata = None
        if timing is not None:
            timing.request_start_ns = now_ns()
        message = wire.request_to_pb(request)
        if timing is not None:
            message.timing = timing.server_stamps
            if timing.traceparent:
                metadata = ((TRACEPARENT, timing.traceparent),)
        payload = message.SerializeToString()
        self._check_size(len(payload))
        if timing is not None:
            timing.request_encoded_ns = now_ns()
        what, batched = self._what, self.batched
        limit = self.limits.max_message_bytes
        reader = (ChunkReader.of_bytes if batched else ChunkReader.of_messages)(
            self.codec, limit, what, timing
        )
        channel = await self._connected()
        with _Mapped(what, reader) as mapped:
            call = mapped.call = channel.request(
                self._generate_path,
                Cardinality.UNARY_STREAM,
                bytes,
                bytes,
                timeout=self.deadline_s,
                metadata=metadata,
            )
            async with call:
                if timing is not None:
                    timing.request_write_ns = now_ns()
                await call.send_message(payload, end=True)
                if timing is not None:
                    timing.request_sent_ns = now_ns()
                await call.recv_initial_metadata()
                h2_stream, wrapper = call._stream, call._wrapper
                while True:
                    with wrapper:
                        data = await wire.read_message(h2_stream, limit, what)
                    if data is None:
                        break
                    if batched:
                        data = envelope.read_stream_bytes(data, what)
                    for chunk in reader.feed(data):
                        yield chunk
                await call.recv_trailing_metadata()  # the status: a GRPCError unless OK
                reader.close()
                if timing is not None and timing.server_stamps:
                    trailing = call.trailing_metadata
                    packed = None if trailing is None else trailing.get(wire.TRAILER_BIN)
                    if not isinstance(packed, bytes):
                        raise ProtocolError(f"{what}: the timed stream has no timing trailer")
                    timing.set_server(unpack(packed))

    def session(self) -> GrpclibSession:
        """A long-lived bidirectional stream; requests on it take turns."""
        return GrpclibSession(self)

    async def close(self) -> None:
        channel, self._channel = self._channel, None
        if channel is not None:
            channel.close()
            await asyncio.sleep(0)  # the transport closes its socket on the loop's next turn


class GrpclibSession:
    """Many requests over one ``Session`` call. Use as an async context manager."""

    def __init__(self, client: GrpclibClient) -> None:
        self.client = client
        self._call: grpclib.client.Stream[bytes, bytes] | None = None
        self._lock = asyncio.Lock()
        self._next_id = 1
        self._answering = False
        """Whether the server's headers came (with its first answer)."""

    async def __aenter__(self) -> GrpclibSession:
        channel = await self.client._connected()
        call = channel.request(
            wire.path("Session"),
            Cardinality.STREAM_STREAM,
            bytes,
            bytes,
            timeout=self.client.deadline_s,
        )
        await call.__aenter__()
        with _Mapped("grpclib Session") as mapped:
            mapped.call = call
            await call.send_request()
        self._call = call
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """End the call as ``grpc``'s session does: done writing, then cancelled."""
        call, self._call = self._call, None
        if call is None:
            return
        with contextlib.suppress(Exception):
            await call.end()
        with contextlib.suppress(Exception):
            await call.cancel()
        with contextlib.suppress(Exception):
            await call.__aexit__(None, None, None)  # releases the stream

    async def generate(self, request: GenerateRequest) -> AsyncIterator[ic.TokenChunk]:
        async with self._lock:
            call = self._call
            if call is None:
                raise ProtocolError("grpclib Session: the session is not open")
            request_id, self._next_id = self._next_id, self._next_id + 1
            codec, limits = self.client.codec, self.client.limits
            reader = ChunkReader.of_messages(codec, limits.max_message_bytes, "grpclib Session")
            body = wire.request_to_pb(request).SerializeToString()
            with _Mapped("grpclib Session", reader) as mapped:
                mapped.call = call
                await call.send_message(envelope.write(request_id, RequestKind.GENERATE, body))
                while True:
                    kind, data = await self._read(call, request_id, reader)
                    if kind == ResponseKind.CHUNK:
                        for chunk in reader.feed(data):
                            yield chunk
                    elif kind == ResponseKind.END:
                        if envelope.read_end(data, "grpclib Session") != reader.count:
                            raise reader.truncated("chunk count mismatch")
                        reader.close()
                        return
                    elif kind == ResponseKind.ERROR:
                        raise RemoteError("INVALID_ARGUMENT", data.decode(errors="replace"))
                    else:
                        raise ProtocolError(f"grpclib Session: answer of kind {kind} to a generate")

    async def _read(
        self, call: grpclib.client.Stream[bytes, bytes], request_id: int, reader: ChunkReader
    ) -> tuple[int, bytes]:
        """The next answer to ``request_id``: (its kind, its bytes)."""
        if not self._answering:
            await call.recv_initial_metadata()  # a GRPCError if the server refused the call
            self._answering = True
        with call._wrapper:
            data = await wire.read_message(
                call._stream, self.client.limits.max_message_bytes, "grpclib Session"
            )
        if data is None:
            call._maybe_raise()  # the server ended the call: its status, if it says why
            raise reader.truncated("session ended")
        answered, kind, body = envelope.read(data, "grpclib Session")
        if answered != request_id:
            raise ProtocolError("grpclib Session: answer to another request")
        return kind, body
