"""The delta codec's encoder: a response's chunks in, the bytes of its frames out.

:class:`DeltaStreamEncoder` is the reference: it writes every chunk the format carries and
refuses, with an :class:`EncodeError`, what it cannot. Given the C extension, it offers each
chunk to it first and writes only those it hands back (see :mod:`inferwire.codecs.delta_codec`).
"""

from __future__ import annotations

import math
import struct
from typing import Any, Final, Protocol

from . import pbwire
from .delta_wire import (
    MAGIC,
    MAGIC_FLOAT32,
    MAX_EXACT,
    MAX_SCALE,
    SCHEMA_ID,
    UINT32,
    StringTable,
    decimal_size,
    to_decimal,
    to_float32,
)
from .errors import CodecError, EncodeError
from .model import TokenChunk, TokenLogprob

__all__ = ["DeltaStreamEncoder", "FrameEncoder"]


class FrameEncoder(Protocol):
    """What the encoder asks of the C extension (its stub in codecs/_delta_accel.pyi).

    ``encode_frame`` returns the bytes of the chunk's frame, its table entries added, or
    ``None``, having changed nothing, for a chunk it leaves to the Python path.
    """

    def encode_frame(
        self,
        chunk: object,
        base: tuple[str, str, int, int],
        next_seq: int,
        offset: int,
        index: dict[str, int],
        strings: list[str],
        carries_usage: bool,
        float32: bool,
        /,
    ) -> bytes | None: ...


_END: Final = b"\x00"
_varint = pbwire.varint
_SMALL: Final = tuple(bytes((i,)) for i in range(128))
_DOUBLE = pbwire.DOUBLE.pack
_POW10_INT: Final = tuple(10**k for k in range(MAX_SCALE + 1))


def _same_float(a: float, b: float) -> bool:
    return a == b and (a != 0.0 or math.copysign(1.0, a) == math.copysign(1.0, b))


def _ref_or_literal(table: StringTable, text: str) -> tuple[int, bytes]:
    """The table ref of ``text`` (0 if new: it joins the table) and its UTF-8 if new."""
    found = table.index.get(text)
    if found is not None:
        return found + 1, b""
    raw = text.encode()  # first: text that cannot be encoded must not join the table
    table.ref(text)
    return 0, raw


def _value(value: float, float32: bool) -> bytes:
    """A logprob's value field: a decimal where one is exact, else a double; with ``float32``
    (wire format 1) the shortest of decimal, float32 and double, a tie to the first."""
    decimal = to_decimal(value)
    size = 9 if decimal is None else decimal_size(*decimal)  # a double: 19 <8 bytes>
    if float32 and size > 5:  # 65 <4 bytes>
        packed = to_float32(value)
        if packed is not None:
            return b"\x65" + packed
    if decimal is None or (float32 and size > 9):
        return b"\x19" + _DOUBLE(value)
    return b"\x40" + _varint(pbwire.zigzag(decimal[0])) + b"\x48" + _SMALL[decimal[1]]


def _logprob(table: StringTable, lp: TokenLogprob, float32: bool) -> bytes:
    ref, raw = _ref_or_literal(table, lp.token)
    out = b"\x08" + _varint(ref) if ref else b"\x12" + _varint(len(raw)) + raw if raw else b""
    out += _value(lp.logprob, float32)
    top = lp.top
    if top and top[0].token == lp.token and _same_float(top[0].logprob, lp.logprob):
        out += b"\x20\x01"
        top = top[1:]
    if not top:
        return out
    refs = bytearray()
    literals = []
    values = []
    for alternative in top:
        ref, raw = _ref_or_literal(table, alternative.token)
        if ref < 128:
            refs.append(ref)
        else:
            refs += _varint(ref)
        if not ref:
            literals.append(b"\x32" + _varint(len(raw)) + raw)
        values.append(alternative.logprob)
    out += b"\x2a" + _varint(len(refs)) + refs + b"".join(literals)
    return out + _top_logprobs(values, float32)


def _common_scale(values: list[float]) -> tuple[bytes, int] | None:
    """The alternatives' logprobs as zigzag varints over one common scale, and that scale; None
    when one of them is no decimal or its mantissa outgrows 2**53 at that scale."""
    mantissas = []
    scales = []
    for value in values:
        decimal = to_decimal(value)
        if decimal is None:
            return None
        mantissas.append(decimal[0])
        scales.append(decimal[1])
    scale = max(scales)
    packed = bytearray()
    for mantissa, own_scale in zip(mantissas, scales, strict=True):
        mantissa *= _POW10_INT[scale - own_scale]
        if abs(mantissa) >= MAX_EXACT:
            return None
        packed += _varint(pbwire.zigzag(mantissa))
    return bytes(packed), scale


def _top_logprobs(values: list[float], float32: bool) -> bytes:
    """The alternatives' logprobs as one group: decimals over one common scale, else doubles;
    with ``float32`` the shortest of those and float32s, a tie to the first."""
    decimals = _common_scale(values)
    best = None
    if decimals is not None:
        packed, scale = decimals
        best = b"\x52" + _varint(len(packed)) + packed + b"\x58" + _SMALL[scale]
    if float32:
        singles = []
        for value in values:
            single = to_float32(value)
            if single is None:
                break
            singles.append(single)
        else:
            size = 4 * len(values)
            if best is None or 1 + len(_varint(size)) + size < len(best):
                best = b"\x6a" + _varint(size) + b"".join(singles)
    doubles_size = 8 * len(values)
    if best is None or (float32 and 1 + len(_varint(doubles_size)) + doubles_size < len(best)):
        doubles = struct.pack(f"<{len(values)}d", *values)
        best = b"\x3a" + _varint(doubles_size) + doubles
    return best


class DeltaStreamEncoder:
    """Sans-IO encoder of one response's chunks; the bytes are described in
    :mod:`inferwire.codecs.delta_wire`."""

    __slots__ = (
        "_accel",
        "_base",
        "_base_seq",
        "_broken",
        "_float32",
        "_next_seq",
        "_schema_id",
        "_table",
        "_usage",
        "count",
    )

    def __init__(
        self,
        schema_id: int,
        *,
        carries_usage: bool,
        float32: bool = False,
        accelerator: FrameEncoder | None = None,
    ) -> None:
        self._accel = accelerator
        self._schema_id = schema_id
        self._usage = carries_usage
        # wire format 1 (schema version 3): float32 logprobs and the shorter frame shapes
        self._float32 = float32
        self._base: tuple[str, str, int, int] | None = None
        self._base_seq = 0
        self._next_seq = 0
        self._table = StringTable()
        self._broken = False
        self.count = 0

    def _header(self, chunk: TokenChunk | None) -> bytes:
        body = b""
        if chunk is not None:
            body = b"".join(
                [
                    pbwire.length_delimited(1, chunk.id.encode()),
                    pbwire.length_delimited(2, chunk.model.encode()),
                    b"\x18"
                    + _varint(chunk.created & 0xFFFFFFFFFFFFFFFF),  # int64: two's complement
                    b"\x20" + _varint(chunk.index),
                    b"\x28" + _varint(chunk.seq),
                ]
            )
        magic = MAGIC_FLOAT32 if self._float32 else MAGIC
        return bytes((magic,)) + SCHEMA_ID.pack(self._schema_id) + _varint(len(body)) + body

    def encode(self, chunk: Any, /) -> bytes:
        base = self._base
        accel = self._accel
        if accel is not None and base is not None and not self._broken:
            # Any next chunk of the same response, compiled. None: it changed nothing, and the
            # Python path below takes the chunk exactly as it would without it.
            table = self._table
            try:
                frame = accel.encode_frame(
                    chunk,
                    base,
                    self._next_seq,
                    self.count,  # the frame's seq offset: next_seq - base_seq
                    table.index,
                    table.strings,
                    self._usage,
                    self._float32,
                )
            except Exception:
                self._broken = True  # out of memory midway: the table may be ahead
                raise
            if frame is not None:
                self._next_seq += 1
                self.count += 1
                return frame
        if type(chunk) is not TokenChunk:
            raise EncodeError(f"codec 'delta' cannot encode {type(chunk).__name__}")
        if self._broken:
            raise EncodeError("an earlier chunk failed to encode: start a new stream")
        if chunk.usage is not None and not self._usage:
            raise EncodeError("this delta schema version cannot carry usage (version 2 can)")
        try:
            return self._encode(chunk)
        except Exception as exc:
            # the string table may hold entries the peer never saw: this stream cannot go on
            self._broken = True
            if isinstance(exc, CodecError):
                raise
            if isinstance(
                exc, (TypeError, ValueError, OverflowError, AttributeError, struct.error)
            ):
                raise EncodeError(f"delta: {exc}") from exc
            raise

    def _encode(self, chunk: TokenChunk) -> bytes:
        head = b""
        base = self._base
        if base is None:
            if not -(1 << 63) <= chunk.created < 1 << 63:
                raise EncodeError("created does not fit in int64")
            if not 0 <= chunk.index < UINT32:
                raise EncodeError("index is a uint32")
            head = self._header(chunk)
            self._base = base = (chunk.id, chunk.model, chunk.created, chunk.index)
            self._base_seq = self._next_seq = chunk.seq
        elif (
            chunk.id != base[0]
            or chunk.model != base[1]
            or chunk.created != base[2]
            or chunk.index != base[3]
        ):
            raise EncodeError(
                "a delta stream carries one response: id, model, created and index must not change"
            )
        seq = chunk.seq
        if seq != self._next_seq:
            raise EncodeError(
                f"chunk seq {seq}, expected {self._next_seq}: "
                "a delta stream is numbered without gaps"
            )
        offset = seq - self._base_seq
        accel = self._accel
        if accel is not None and head:  # any later chunk was offered to it by encode()
            table = self._table
            compiled = accel.encode_frame(
                chunk, base, seq, offset, table.index, table.strings, self._usage, self._float32
            )
            if compiled is not None:
                self._next_seq = seq + 1
                self.count += 1
                return head + compiled
        frame = b"\x08" + _varint(offset) if offset else b""
        token_ids = chunk.token_ids
        if token_ids:
            if min(token_ids) < 0 or max(token_ids) >= UINT32:
                raise EncodeError("token ids are uint32")
            if len(token_ids) == 1 and self._float32:
                frame += b"\x10" + _varint(token_ids[0])  # one id: unpacked is a byte shorter
            else:
                ids = b"".join([_varint(i) for i in token_ids])
                frame += b"\x12" + _varint(len(ids)) + ids
        # the text's table ref, inline: this is the one string every frame has
        text = chunk.text
        table = self._table
        found = table.index.get(text)
        if found is not None:
            frame += b"\x18" + _varint(found + 1)
        elif text:
            raw = text.encode()
            table.ref(text)
            frame += b"\x22" + _varint(len(raw)) + raw
        logprobs = chunk.logprobs
        if logprobs is not None:
            float32 = self._float32
            # a Logprob entry says there are logprobs: format 1 flags only an empty list
            if not (float32 and logprobs):
                frame += b"\x28\x01"
            frame += b"".join(
                [
                    b"\x32" + _varint(len(body)) + body
                    for body in [_logprob(table, lp, float32) for lp in logprobs]
                ]
            )
        if chunk.finish_reason is not None:
            raw = chunk.finish_reason.encode()
            frame += b"\x3a" + _varint(len(raw)) + raw
        if chunk.usage is not None:
            if not (
                0 <= chunk.usage.prompt_tokens < UINT32
                and 0 <= chunk.usage.completion_tokens < UINT32
            ):
                raise EncodeError("usage counts are uint32")
            usage = (
                b"\x08"
                + _varint(chunk.usage.prompt_tokens)
                + b"\x10"
                + _varint(chunk.usage.completion_tokens)
            )
            frame += b"\x42" + _varint(len(usage)) + usage
        self._next_seq = seq + 1
        self.count += 1
        return head + _varint(len(frame) + 1) + frame

    def end(self) -> bytes:
        head = self._header(None) if self._base is None else b""
        return head + _END + _varint(self.count)
