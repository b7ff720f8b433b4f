"""The two ends of one token stream, sans-IO, shared by every transport.

A server turns the service's chunks into bytes with :class:`ChunkWriter` (timed or not: the
stamps object decides, not a second loop); :func:`stream_frames` is its whole loop, one piece of
bytes per batch of due chunks, and :func:`stream_messages` the loop of a transport that sends
one message per chunk (gRPC's ``Generate``). A client turns bytes (or, on gRPC, messages) back
into chunks with :class:`ChunkReader`: codec errors become the transport's
:class:`ProtocolError`, chunks are counted and, when timed, stamped, and an ending without the
codec's end marker is a :class:`StreamTruncatedError`, never a short complete stream. The socket
loops around them stay in the transports and do I/O only.

Both server loops stamp the stream's frontend times (its ``stamps``,
:mod:`~inferwire.transports.request_stamps`): when the first and the last chunk came from the
service, and when the write that carried the last chunk returned (the transport asks for the
next piece once it has written one); and hand the stream's stamps to its meter, which feeds
them to the vLLM-named histograms when the request ends.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, Sequence
from typing import TYPE_CHECKING

import inferwire.codecs as ic
from inferwire.codecs.framing import BytesLike, StreamDecoder, StreamEncoder

from .errors import ProtocolError, StreamTruncatedError
from .service import MAX_BATCH_CHUNKS, SimulatedService, TokenStream
from .timing import ServerStamps, StreamTiming, now_ns

if TYPE_CHECKING:
    from .metrics import RequestMeter


class ChunkWriter:
    """Encodes the chunks of one stream; with ``stamps``, records when each was produced and
    when its bytes were ready (the sender calls ``stamps.written()`` after each write); with
    ``meter``, reports each batch's encode time (the sender calls ``meter.written(n)``)."""

    __slots__ = ("_encode", "_encoder", "meter", "stamps")

    def __init__(
        self,
        encoder: StreamEncoder,
        stamps: ServerStamps | None = None,
        meter: RequestMeter | None = None,
    ) -> None:
        self._encoder = encoder
        self._encode = encoder.encode
        self.stamps = stamps
        self.meter = meter

    def write(self, batch: Sequence[ic.TokenChunk]) -> bytes:
        """The bytes of ``batch``, in order, as one piece (one write, one message)."""
        encode = self._encode
        stamps = self.stamps
        meter = self.meter
        if stamps is None:
            if meter is None:
                return encode(batch[0]) if len(batch) == 1 else b"".join(map(encode, batch))
            started = now_ns()
            data = encode(batch[0]) if len(batch) == 1 else b"".join(map(encode, batch))
            meter.encoded(len(batch), now_ns() - started)
            return data
        parts = []
        encoding_ns = 0
        for chunk in batch:
            produced = now_ns()
            parts.append(encode(chunk))
            encoded = now_ns()
            stamps.encoded(produced, encoded)
            encoding_ns += encoded - produced
        if meter is not None:
            meter.encoded(len(batch), encoding_ns)
        return b"".join(parts)

    def end(self) -> bytes:
        """The stream's end marker (empty where the codec's stream shape has none)."""
        return self._encoder.end()


async def stream_frames(
    service: SimulatedService,
    stream: TokenStream,
    encoder: StreamEncoder,
    stamps: ServerStamps | None = None,
    *,
    max_chunks: int = MAX_BATCH_CHUNKS,
    end_in_last: bool = False,
    meter: RequestMeter | None = None,
) -> AsyncGenerator[bytes, None]:
    """The paced stream as the pieces a server sends: one per batch of due chunks (see
    :meth:`SimulatedService.batches`), then the end marker if the codec has one: a piece of
    its own, or with ``end_in_last`` appended to the batch that holds the stream's last chunk
    (the stream's length is known from the start, so this waits for nothing; it saves a
    message where each one costs, as on gRPC). Closing the generator ends the stream on the
    service. With ``meter``, each batch's encode time is reported to it."""
    writer = ChunkWriter(encoder, stamps, meter)
    remaining = len(stream.chunks)
    times = stream.stamps
    times.first_chunk_ns = times.last_chunk_ns = times.last_chunk_written_ns = 0
    if meter is not None:
        meter.stamps = times
    async with contextlib.aclosing(service.batches(stream, max_chunks=max_chunks)) as batches:
        async for batch in batches:
            if not times.first_chunk_ns:
                times.first_chunk_ns = now_ns()
            remaining -= len(batch)
            if remaining <= 0:
                times.last_chunk_ns = now_ns()
                if end_in_last:
                    yield writer.write(batch) + writer.end()
                    times.last_chunk_written_ns = now_ns()
                    return
                yield writer.write(batch)
                times.last_chunk_written_ns = now_ns()
                continue
            yield writer.write(batch)
    end = writer.end()
    if end:
        yield end


async def stream_messages(
    service: SimulatedService,
    stream: TokenStream,
    encoder: StreamEncoder,
    stamps: ServerStamps | None = None,
    meter: RequestMeter | None = None,
) -> AsyncGenerator[bytes, None]:
    """The paced stream as one message per chunk (``encoder``: the codec's
    :meth:`~inferwire.codecs.Codec.message_encoder`), then the end message if the codec's
    message stream has one. Each chunk goes out as soon as the service hands it over; the
    service's batches only save this loop a turn of the service's generator per chunk when
    the model outruns the wire. Closing the generator ends the stream on the service. With
    ``meter``, each chunk's encode time is reported to it (each is a write of its own)."""
    encode = encoder.encode
    remaining = len(stream.chunks)
    times = stream.stamps
    times.first_chunk_ns = times.last_chunk_ns = times.last_chunk_written_ns = 0
    if meter is not None:
        meter.stamps = times
    async with contextlib.aclosing(service.batches(stream)) as batches:
        async for batch in batches:
            if not times.first_chunk_ns:
                times.first_chunk_ns = now_ns()
            remaining -= len(batch)
            if remaining <= 0:
                times.last_chunk_ns = now_ns()
            if stamps is None and meter is None:
                for chunk in batch:
                    yield encode(chunk)
            else:
                for chunk in batch:
                    produced = now_ns()
                    message = encode(chunk)
                    encoded = now_ns()
                    if stamps is not None:
                        stamps.encoded(produced, encoded)
                    if meter is not None:
                        meter.encoded(1, encoded - produced)
                    yield message
            if remaining <= 0:
                times.last_chunk_written_ns = now_ns()
    end = encoder.end()
    if end:
        yield end


class ChunkReader:
    """Decodes one stream for a client: :meth:`feed` the bytes (or messages) as they arrive,
    :meth:`close` when the transport says the stream ended.

    ``what`` names the transport in error messages; with ``timing``, each chunk is stamped
    with when its bytes were fed and when it was decoded."""

    __slots__ = ("_decoder", "_timing", "count", "what")

    def __init__(
        self,
        decoder: StreamDecoder[ic.TokenChunk],
        what: str,
        timing: StreamTiming | None = None,
    ) -> None:
        self._decoder = decoder
        self._timing = timing
        self.what = what
        self.count = 0
        """Chunks decoded so far."""

    @classmethod
    def of_bytes(
        cls, codec: ic.Codec, max_frame_bytes: int, what: str, timing: StreamTiming | None = None
    ) -> ChunkReader:
        """For a transport that carries the codec's stream as bytes, in any split."""
        return cls(codec.stream_decoder(max_frame_bytes=max_frame_bytes), what, timing)

    @classmethod
    def of_messages(
        cls, codec: ic.Codec, max_frame_bytes: int, what: str, timing: StreamTiming | None = None
    ) -> ChunkReader:
        """For a transport that carries whole messages (gRPC): :meth:`feed` one at a time."""
        return cls(codec.message_decoder(max_frame_bytes=max_frame_bytes), what, timing)

    @property
    def finished(self) -> bool:
        """Whether the codec's end marker was read."""
        return self._decoder.finished

    def feed(self, data: BytesLike) -> list[ic.TokenChunk]:
        """The chunks ``data`` completed. Raises :class:`ProtocolError` for bytes that do not
        decode (its ``__cause__`` is the codec's error)."""
        received_ns = now_ns() if self._timing is not None else 0
        try:
            chunks = self._decoder.feed(data)
        except ic.CodecError as exc:
            raise ProtocolError(f"{self.what}: {exc}") from exc
        if self._timing is not None:
            self._timing.decoded(len(chunks), received_ns)
        self.count += len(chunks)
        return chunks

    def close(self) -> None:
        """The transport's stream ended: raises :class:`StreamTruncatedError` unless the
        codec's end marker came (or the stream shape needs none)."""
        try:
            self._decoder.close()
        except ic.IncompleteStreamError as exc:
            raise self.truncated("stream ended") from exc
        except ic.CodecError as exc:
            raise ProtocolError(f"{self.what}: {exc}") from exc

    def truncated(self, why: str) -> StreamTruncatedError:
        """The error for a stream cut short by ``why``, with the count of chunks received."""
        return StreamTruncatedError(
            f"{self.what}: {why} after {self.count} chunks", chunks_received=self.count
        )
