"""``tcp``: the floor. asyncio streams carrying the codec's own stream bytes, nothing else.

Wire, on one connection, one request at a time::

    request    op (1 byte: b"G" generate, b"I" infer), length (4 bytes, big-endian), body
               generate body: the request as JSON; infer body: the codec's InferRequest
    response   status (1 byte: 0 ok, 1 error), then
               ok, generate: the codec's stream (its framing and end marker)
               ok, infer:    length (4 bytes, big-endian), the codec's InferResponse
               error:        length (4 bytes, big-endian), a JSON error body

A timed stream (the request asks for ``timing``) wraps each write of the codec's stream in a
4-byte big-endian length, then sends a zero length and one more length-prefixed block: the
per-chunk timestamps (:mod:`inferwire.transports.timing`). Untimed streams carry no wrapping.

A server that fails mid-stream closes the connection, so the client sees a truncated stream,
never a short complete one. A request longer than the limit is answered with an error and the
connection closed (its body is never read).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import struct
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any, ClassVar, Final

import orjson

import inferwire.codecs as ic
from inferwire.serving import error_body

from .base import Client, Server
from .common import (
    ErrorMap,
    aclose_quietly,
    connect_tcp,
    error_detail,
    log_failure,
    map_exceptions,
)
from .errors import (
    BadRequestError,
    MessageTooLargeError,
    ProtocolError,
    RemoteError,
    TransportTimeoutError,
)
from .service import GenerateRequest, TokenStream
from .streams import ChunkReader, stream_frames
from .timing import TRACEPARENT, ServerStamps, StreamTiming, asks_server, now_ns, unpack

if TYPE_CHECKING:
    from .metrics import RequestMeter

_HEAD: Final = struct.Struct(">cI")
_LEN: Final = struct.Struct(">I")
OP_GENERATE: Final = b"G"
OP_INFER: Final = b"I"
OK: Final = b"\x00"
ERROR: Final = b"\x01"
_log = logging.getLogger(__name__)
_READ_BYTES: Final = 256 * 1024
_JOIN_BELOW: Final = 64 * 1024


class TcpServer(Server):
    transport: ClassVar[str] = "tcp"

    async def start(self) -> tuple[str, int]:
        return await self._serve_streams(self._handle, _READ_BYTES)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._track()
        try:
            while await self._one(reader, writer):
                pass
        except (OSError, asyncio.IncompleteReadError, TimeoutError, asyncio.CancelledError):
            pass  # the client went away (or the server stops): its stream was closed by _one
        except Exception as exc:
            # a failure mid-answer: the connection closes (a stream is seen as truncated),
            # the server goes on
            log_failure(_log, "tcp: connection failed", exc)
        finally:
            await aclose_quietly(writer)

    async def _one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        """Serve one request; False when the connection should close."""
        head = await reader.read(_HEAD.size)  # idle keep-alive: no timeout until a request
        if not head:
            return False
        if len(head) < _HEAD.size:
            async with asyncio.timeout(self.limits.timeout_s):
                head += await reader.readexactly(_HEAD.size - len(head))
        op, length = _HEAD.unpack(head)
        if length > self.limits.max_message_bytes:
            meter = None if self.metrics is None else self.metrics.start("unary")
            await _answer_error(writer, 413, f"request of {length} bytes is over the limit", meter)
            return False
        async with asyncio.timeout(self.limits.timeout_s):
            body = await reader.readexactly(length)
        received_ns = now_ns()
        meter = None if self.metrics is None else self.metrics.start("unary", received_ns)
        try:
            return await self._answer(op, body, writer, received_ns, meter)
        except BaseException as exc:
            if meter is not None:
                meter.failed(exc)  # a no-op if the answer was complete
            raise

    async def _answer(
        self,
        op: bytes,
        body: bytes,
        writer: asyncio.StreamWriter,
        received_ns: int,
        meter: RequestMeter | None,
    ) -> bool:
        """Answer one request; False when the connection should close."""
        if op == OP_GENERATE:
            if ic.TokenChunk not in self.codec.types:
                await _answer_error(writer, 406, f"codec {self.codec.name!r} has no streams", meter)
                return True
            try:
                obj = orjson.loads(body)
                request = GenerateRequest.from_json_obj(obj)
                stream = self.service.open(request)  # a bad request is refused before a stream
            except (orjson.JSONDecodeError, BadRequestError) as exc:
                await _answer_error(writer, 400, str(exc), meter)
                return True
            writer.write(OK)
            if meter is not None:
                meter.kind = "stream"  # a refusal is a unary answer, as on every transport
                meter.written(len(OK))
            await self._stream(stream, writer, received_ns, obj, meter)
            return True
        if op == OP_INFER:
            try:
                response = self.service.infer(self.codec.decode(body, ic.InferRequest))
                payload = self.codec.encode(response)
            except (ic.CodecError, BadRequestError) as exc:
                await _answer_error(writer, 400, str(exc), meter)
                return True
            _write(writer, OK + _LEN.pack(len(payload)), payload)
            await writer.drain()
            if meter is not None:
                meter.written(len(OK) + _LEN.size + len(payload))
                meter.finish("ok")
            return True
        await _answer_error(writer, 400, f"unknown operation {op!r}", meter)
        return False

    async def _stream(
        self,
        stream: TokenStream,
        writer: asyncio.StreamWriter,
        received_ns: int,
        obj: Any,
        meter: RequestMeter | None = None,
    ) -> None:
        """One write per batch of due chunks; a timed stream wraps each in a length and ends
        with a zero length and the stamps (see the module docstring). ``obj``: the request's
        JSON object, whose ``traceparent`` a traced server reads."""
        stamps = None
        if stream.request.timing:
            stamps = ServerStamps(received_ns)
            stamps.parsed()
        encoder = self.codec.stream_encoder()
        if self.tracer is None:
            frames = stream_frames(self.service, stream, encoder, stamps, meter=meter)
        else:
            trace = self.tracer.server_request(
                obj.get(TRACEPARENT), received_ns, stamps, stream.request.workload, stream.stamps
            )
            frames = trace.frames(
                stream_frames(self.service, stream, encoder, trace.stamps, meter=meter)
            )
        async with contextlib.aclosing(frames):
            async for frame in frames:
                if writer.is_closing():
                    # the peer went away while the frame was made: uvloop's write on a closed
                    # transport raises RuntimeError, asyncio's drops the bytes; either is a
                    # stream the client left, not a server error
                    raise ConnectionResetError("tcp: the client went away mid-stream")
                writer.write(frame if stamps is None else _LEN.pack(len(frame)) + frame)
                await writer.drain()
                if stamps is not None:
                    stamps.written()
                if meter is not None:
                    meter.written(len(frame) if stamps is None else _LEN.size + len(frame))
        if stamps is not None:
            timing = stamps.pack()
            writer.write(_LEN.pack(0) + _LEN.pack(len(timing)) + timing)
            await writer.drain()
            if meter is not None:
                meter.written(2 * _LEN.size + len(timing))
        if meter is not None:
            meter.finish("ok")


def infer_wire_bytes(
    codec: ic.Codec, request: ic.InferRequest, response: ic.InferResponse
) -> tuple[int, int]:
    """The bytes one infer round trip puts on the wire with ``codec``: the request (head and
    body) and its answer (status, length, body). A raw echo of these counts is the floor the
    bench compares a ``tcp`` round trip with."""
    answer = len(OK) + _LEN.size + len(codec.encode(response))
    return _HEAD.size + len(codec.encode(request)), answer


def _error_status(body: bytes) -> int:
    """The HTTP-style status an error body carries (``{"error": {"code": 413}}``), else 500."""
    try:
        code = orjson.loads(body)["error"]["code"]
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return 500
    return code if isinstance(code, int) and 400 <= code < 600 else 500


def _write(writer: asyncio.StreamWriter, head: bytes, body: bytes) -> None:
    """One write (one segment) for a small message; a large body is not copied to join it."""
    if len(body) < _JOIN_BELOW:
        writer.write(head + body)
    else:
        writer.write(head)
        writer.write(body)


async def _answer_error(
    writer: asyncio.StreamWriter, status: int, message: str, meter: RequestMeter | None = None
) -> None:
    body = error_body(status, message)
    data = ERROR + _LEN.pack(len(body)) + body
    writer.write(data)
    if meter is not None:
        meter.written(len(data))
        meter.answered(status)  # the request was refused, whether or not the answer arrives
    await writer.drain()


_CLOSED_UNDER_US: Final[ErrorMap] = {RuntimeError: ProtocolError}


class TcpClient(Client):
    """One connection, opened on first use and reused; requests take turns on it."""

    transport: ClassVar[str] = "tcp"

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self._conn: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        self._lock = asyncio.Lock()

    async def _connection(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if self._conn is not None and (self._conn[1].is_closing() or self._conn[0].at_eof()):
            await self._drop()  # the server closed it while idle (it restarted, or went away)
        if self._conn is None:
            self._conn = await connect_tcp(
                self.host,
                self.port,
                ssl_context=self.ssl_context,
                timeout_s=self.limits.timeout_s,
                limit=_READ_BYTES,
            )
        return self._conn

    async def _drop(self) -> None:
        if self._conn is not None:
            await aclose_quietly(self._conn[1])
            self._conn = None

    async def _send(
        self, op: bytes, body: bytes, timing: StreamTiming | None = None
    ) -> asyncio.StreamReader:
        if len(body) > self.limits.max_message_bytes:
            raise MessageTooLargeError(f"request of {len(body)} bytes is over the limit")
        reader, writer = await self._connection()
        # the server can close the connection between the check in _connection() and the
        # write: uvloop then refuses the write with a RuntimeError ("the handler is closed")
        with map_exceptions("tcp send", _CLOSED_UNDER_US):
            if timing is not None:
                timing.request_write_ns = now_ns()
            _write(writer, _HEAD.pack(op, len(body)), body)
            await writer.drain()
            if timing is not None:
                timing.request_sent_ns = now_ns()
            status = await reader.readexactly(1)
            if status == ERROR:
                (length,) = _LEN.unpack(await reader.readexactly(4))
                body = await reader.readexactly(min(length, 1 << 16))
                await self._drop()
                raise RemoteError(_error_status(body), error_detail(body))
        if status != OK:
            await self._drop()
            raise ProtocolError(f"tcp: bad status byte {status!r}")
        return reader

    async def infer(self, request: ic.InferRequest) -> ic.InferResponse:
        payload = self.codec.encode(request)
        async with self._lock:
            try:
                async with asyncio.timeout(self.limits.timeout_s):
                    reader = await self._send(OP_INFER, payload)
                    with map_exceptions("tcp infer"):
                        (length,) = _LEN.unpack(await reader.readexactly(4))
                        if length > self.limits.max_message_bytes:
                            raise MessageTooLargeError(f"response of {length} bytes")
                        body = await reader.readexactly(length)
                        return self.codec.decode(body, ic.InferResponse)
            except BaseException as exc:
                await self._drop()
                _raise_timeout(exc, "tcp infer")
                raise

    async def generate(
        self, request: GenerateRequest, *, timing: StreamTiming | None = None
    ) -> AsyncIterator[ic.TokenChunk]:
        limit = self.limits.max_message_bytes
        stamped = asks_server(timing)
        if timing is not None:
            timing.request_start_ns = now_ns()
            body = _request_body(request, timing)
            timing.request_encoded_ns = now_ns()
        else:
            body = request.to_json()
        async with self._lock:
            done = False
            stream = ChunkReader.of_bytes(self.codec, limit, "tcp", timing)
            try:
                async with asyncio.timeout(self.limits.timeout_s) as deadline:
                    reader = await self._send(OP_GENERATE, body, timing)
                    read = _read_block if stamped else _read_any
                    loop = asyncio.get_running_loop()
                    while not stream.finished:
                        deadline.reschedule(loop.time() + self.limits.timeout_s)
                        with map_exceptions("tcp stream"):
                            data = await read(reader, limit)
                        if data is None:  # a timed stream's blocks end before its stamps
                            break
                        if not data:
                            raise stream.truncated("connection closed")
                        chunks = stream.feed(data)
                        deadline.reschedule(None)  # the consumer's pace is not our timeout
                        for chunk in chunks:
                            yield chunk
                    deadline.reschedule(loop.time() + self.limits.timeout_s)
                    stream.close()
                    if timing is not None and stamped:
                        with map_exceptions("tcp stream"):
                            if await read(reader, limit) is not None:
                                raise ProtocolError("tcp: a timed stream goes on after its end")
                            (length,) = _LEN.unpack(await reader.readexactly(4))
                            timing.set_server(unpack(await reader.readexactly(min(length, limit))))
                done = True
            except TimeoutError as exc:
                _raise_timeout(exc, f"tcp generate, after {stream.count} chunks")
                raise
            finally:
                if not done:
                    await self._drop()  # mid-stream: the connection cannot be reused

    async def close(self) -> None:
        await self._drop()


def _request_body(request: GenerateRequest, timing: StreamTiming) -> bytes:
    """The JSON of a request the client stamps: with ``timing`` if it asks for the server's
    stamps, with ``traceparent`` if it is traced (a field older servers ignore)."""
    obj = request.to_json_obj()
    if timing.server_stamps:
        obj["timing"] = True
    if timing.traceparent:
        obj[TRACEPARENT] = timing.traceparent
    return orjson.dumps(obj)


async def _read_any(reader: asyncio.StreamReader, limit: int) -> bytes:
    """What arrived of an untimed stream (empty: the connection closed, or was reset)."""
    try:
        return await reader.read(_READ_BYTES)
    except OSError:
        return b""  # a reset: reported as a truncated stream, like a close


async def _read_block(reader: asyncio.StreamReader, limit: int) -> bytes | None:
    """The next length-prefixed block of a timed stream; None at its zero-length end marker,
    empty when the connection closed mid-block."""
    try:
        (length,) = _LEN.unpack(await reader.readexactly(4))
        if length > limit:
            raise ProtocolError(f"tcp: block of {length} bytes")
        return await reader.readexactly(length) if length else None
    except (OSError, asyncio.IncompleteReadError):
        return b""


def _raise_timeout(exc: BaseException, what: str) -> None:
    """``asyncio.timeout`` raises the builtin ``TimeoutError``: make it the package's own."""
    if isinstance(exc, TimeoutError) and not isinstance(exc, TransportTimeoutError):
        raise TransportTimeoutError(f"{what}: timed out") from exc
