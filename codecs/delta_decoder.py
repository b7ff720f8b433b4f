"""The delta codec's decoder: a stream's bytes in any split, its chunks out, in order or an error.

A decoder checks each frame's sequence number: a number already delivered is a
:class:`DuplicateFrameError`; one past the next is a :class:`SequenceGapError`, unless the
missing frame comes right after it (:class:`ReorderedFrameError`).

Given the C extension, the decoder hands it the complete frames at the front of its buffer, and
parses each frame it stops at with :mod:`inferwire.codecs.delta_parser` (see
:mod:`inferwire.codecs.delta_codec`).
"""

from __future__ import annotations

import functools
from typing import Protocol

from . import pbwire
from .base import BytesLike
from .delta_parser import parse_frame, parse_header
from .delta_wire import MAGIC, MAGIC_FLOAT32, SCHEMA_ID, StringTable
from .errors import (
    BadMagicError,
    DecodeError,
    DuplicateFrameError,
    FrameTooLargeError,
    IncompatibleSchemaError,
    IncompleteStreamError,
    ReorderedFrameError,
    SequenceGapError,
)
from .framing import DEFAULT_MAX_FRAME_BYTES
from .model import TokenChunk

__all__ = ["DeltaStreamDecoder", "FrameDecoder", "SchemaReader"]


class SchemaReader(Protocol):
    """What a decoder asks of its codec (a :class:`~inferwire.codecs.delta_codec.DeltaCodec`)."""

    max_elements: int
    reads_float32: bool
    """Whether the reader schema has the float32 logprob fields (wire format 1 needs them)."""

    def reader_for(self, schema_id: int, /) -> bool:
        """Check the writer's schema ``schema_id`` against the reader's; whether frames may
        carry usage."""
        ...


class FrameDecoder(Protocol):
    """What the decoder asks of the C extension (its stub in codecs/_delta_accel.pyi).

    ``decode_frames`` appends to ``out`` the chunks of the complete, in-sequence frames from
    ``pos`` on, their strings added to the table, and returns the position of the first frame
    it did not take: the Python path reads that one.
    """

    def decode_frames(
        self,
        data: bytes,
        pos: int,
        header: tuple[str, str, int, int, int],
        strings: list[str],
        count: int,
        usage_known: bool,
        float32: bool,
        max_frame_bytes: int,
        out: list[TokenChunk],
        /,
    ) -> int: ...


class DeltaStreamDecoder:
    """Sans-IO decoder of one delta stream: bytes in any split, chunks out, in order or an error.

    If the schema registry cannot be reached while the header is read, the
    :class:`SchemaRegistryUnavailableError` is raised and every byte is kept: feed more (or
    ``b""``) to try again.
    """

    def __init__(
        self,
        codec: SchemaReader,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        *,
        accelerator: FrameDecoder | None = None,
    ) -> None:
        if max_frame_bytes <= 0:
            raise ValueError("max_frame_bytes must be positive")
        self._codec = codec
        self._accel = accelerator
        self._buffer = bytearray()
        self._header: tuple[str, str, int, int, int] | None = None
        self._usage_known = False
        self._float32 = False
        self._table = StringTable()
        self._pending_gap: tuple[int, int] | None = None
        # Every decoded element (a token, a string, a logprob) takes a byte or more of its
        # frame, so a frame no longer than the element budget cannot break it: the budget is
        # enforced from each frame's length header, before its body is read.
        self.max_frame_bytes = min(max_frame_bytes, codec.max_elements)
        self.schema_id: int | None = None
        self.finished = False
        self.count = 0

    def feed(self, data: BytesLike, /) -> list[TokenChunk]:
        if self.finished and len(data):
            raise DecodeError("bytes after the end of the stream")
        buffer = self._buffer
        out: list[TokenChunk] = []
        pos = 0
        if buffer or self._header is None:
            buffer += data
            if self._header is None:
                pos = self._read_header()
                if self._header is None:
                    return out
            view = bytes(buffer)
            buffer.clear()
        else:
            # whole frames, as a transport usually hands them over: parsed in place
            view = data if type(data) is bytes else bytes(data)
        header = self._header
        end = len(view)
        table = self._table
        strings = table.strings
        accel = self._accel
        try:
            while pos < end:
                if accel is not None and self._pending_gap is None:
                    pos = accel.decode_frames(
                        view,
                        pos,
                        header,
                        strings,
                        self.count,
                        self._usage_known,
                        self._float32,
                        self.max_frame_bytes,
                        out,
                    )
                    if pos == end:
                        break
                    # the frame at pos is not the extension's to take: the Python path reads it
                length, body = _frame_length(view, pos, end, self.max_frame_bytes)
                if body is None:
                    break
                if length == 0:  # end marker: the count follows
                    try:
                        sent, after = pbwire.read_varint(view, body, end)
                    except DecodeError:
                        if end - body < pbwire.MAX_VARINT_BYTES:
                            break  # need more
                        raise
                    self._check_end(sent, len(out))
                    pos = after
                    if pos != end:
                        raise DecodeError("bytes after the end of the stream")
                    self.finished = True
                    break
                frame_end = body + length - 1
                if frame_end > end:
                    break
                delivered = len(out)
                chunk = parse_frame(
                    view,
                    body,
                    frame_end,
                    header,
                    table,
                    self._usage_known,
                    functools.partial(self._in_sequence, delivered_now=delivered),
                    self._float32,
                )
                pos = frame_end
                if chunk is not None:
                    out.append(chunk)
        finally:
            self.count += len(out)
            if pos < end:
                buffer += view[pos:]
        return out

    @property
    def waiting(self) -> bool:
        """Whether part of a frame, or a frame held back until the next one tells a gap from a
        swap, waits for more input."""
        return bool(self._buffer) or self._pending_gap is not None

    def _read_header(self) -> int:
        buffer = self._buffer
        if len(buffer) < 1:
            return 0
        magic = buffer[0]
        if magic not in (MAGIC, MAGIC_FLOAT32):
            raise BadMagicError(f"delta stream starts with {magic:#04x}, expected 0x00 or 0x01")
        if magic == MAGIC_FLOAT32 and not self._codec.reads_float32:
            # its float32 logprobs would be skipped as unknown fields and read as 0.0
            raise IncompatibleSchemaError(
                "this stream sends float32 logprobs (magic byte 0x01, schema version 3), "
                "which this reader schema does not have"
            )
        self._float32 = magic == MAGIC_FLOAT32
        if len(buffer) < 5:
            return 0
        (schema_id,) = SCHEMA_ID.unpack_from(buffer, 1)
        data = bytes(buffer[: 5 + pbwire.MAX_VARINT_BYTES])
        try:
            length, start = pbwire.read_varint(data, 5, len(data))
        except DecodeError:
            if len(data) < 5 + pbwire.MAX_VARINT_BYTES:
                return 0
            raise
        if length > self.max_frame_bytes:
            raise FrameTooLargeError(length, self.max_frame_bytes)
        if len(buffer) < start + length:
            return 0
        # Resolve before consuming anything: an unreachable registry loses no bytes.
        self._usage_known = self._codec.reader_for(schema_id)
        self.schema_id = schema_id
        self._header = parse_header(bytes(buffer[start : start + length]))
        return start + length

    def _in_sequence(self, seq: int, delivered_now: int) -> bool:
        assert self._header is not None
        expected = self._header[4] + self.count + delivered_now
        if self._pending_gap is not None:
            missing, received = self._pending_gap
            if seq == missing:
                raise ReorderedFrameError(
                    f"frame {received} arrived before frame {missing}",
                    expected=missing,
                    received=received,
                )
            raise _gap(missing, received)
        if seq == expected:
            return True
        if seq < expected:
            raise DuplicateFrameError(
                f"frame {seq} was already delivered", expected=expected, received=seq
            )
        self._pending_gap = (expected, seq)  # a gap, or a swap: the next frame tells
        return False

    def _check_end(self, sent: int, delivered_now: int) -> None:
        if self._pending_gap is not None:
            raise _gap(*self._pending_gap)
        arrived = self.count + delivered_now
        if sent > arrived:
            assert self._header is not None
            next_seq = self._header[4] + arrived
            raise SequenceGapError(
                f"stream sent {sent} chunks, {arrived} arrived: the last are missing",
                expected=next_seq,
                received=self._header[4] + sent - 1,
            )
        if sent != arrived:
            raise DecodeError(f"stream sent {sent} chunks, {arrived} arrived")

    def close(self) -> None:
        if self._pending_gap is not None:
            raise _gap(*self._pending_gap)
        if not self.finished:
            state = "mid-frame" if self._buffer else "without its end marker"
            if self._header is None:
                state = "before its header was complete"
            raise IncompleteStreamError(f"delta stream ended {state} after {self.count} chunks")


def _gap(missing: int, received: int) -> SequenceGapError:
    """A frame was held back (``received``) and the one it skipped did not come right after."""
    return SequenceGapError(
        f"frame {missing} is missing (next was {received})", expected=missing, received=received
    )


def _frame_length(data: bytes, pos: int, end: int, max_frame_bytes: int) -> tuple[int, int | None]:
    """The frame length field at ``pos`` and where the frame starts (None: need more)."""
    try:
        length, body = pbwire.read_varint(data, pos, end)
    except DecodeError:
        if end - pos < pbwire.MAX_VARINT_BYTES:
            return 0, None
        raise
    if length - 1 > max_frame_bytes:
        raise FrameTooLargeError(length - 1, max_frame_bytes)
    return length, body
