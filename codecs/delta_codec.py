"""``delta``: a token stream sent once in full, then only what changes, with a schema id.

A stream of :class:`TokenChunk` repeats its id, model, created time and choice index in every
message; this codec sends them once. Byte by byte:

Header (first bytes of a stream)::

    0x00                 magic byte (the Confluent wire convention)
    4 bytes              schema id, big-endian: the registry resolves it to the writer's
                         schema (``schemas/delta_v*.proto``)
    varint N, N bytes    a ``Header`` message: id, model, created, index, base_seq

Each chunk::

    varint L + 1         frame length plus one (0 is the end marker)
    L bytes              a ``Frame`` message, protobuf wire format:
      08 <varint>          seq - base_seq: absolute, so a duplicated frame cannot pass as the
                           next one (a delta from the previous frame could)
      12 <len> <varints>   token ids, packed
      18 <varint>          text ref: k > 0 is entry k - 1 of the stream's string table
      22 <len> <utf-8>     text, when sent literally (it then joins the table)
      28 01                has_logprobs (absent: no logprobs; present with none: empty)
      32 <len> <Logprob>   per token: token ref or literal, logprob (double, exact), whether
                           top[0] repeats the token, then the other top refs/literals and
                           their logprobs (packed doubles)
      3a <len> <utf-8>     finish reason, on the last frame
      42 <len> <Usage>     usage (schema version 2), on the last frame

End::

    00 <varint>          end marker and the number of chunks sent, which the decoder checks

The string table: a literal of 1 to 32 characters joins the table (up to 4,096 entries per
stream) in the order the frame lists strings: the text, then per logprob its token and its top
alternatives. Word pieces repeat (Zipf), so most strings after the first few frames cost one
or two bytes.

A decoder checks each frame's sequence number: a number already delivered is a
:class:`DuplicateFrameError`; one past the next is a :class:`SequenceGapError`, unless the
missing frame comes right after it (:class:`ReorderedFrameError`).

Unary ``encode``/``decode`` carry one chunk as a header and one frame.

The steady state of a stream (each frame the next, with the shapes this encoder writes) runs in
a small C extension, :mod:`inferwire.codecs._delta_accel`, when it is built. This module stays
the reference and the fallback: the extension hands back, untouched, every chunk or frame it
does not take, and the code here then writes or reads it (and raises its errors). The bytes
and the chunks are the same either way. ``INFERWIRE_PURE_PYTHON=1`` in the environment, read
at import, leaves the extension unused; so does ``DeltaCodec(pure_python=True)``.
"""

from __future__ import annotations

import functools
import math
import os
import struct
import warnings
from collections.abc import Callable
from importlib import resources
from typing import Any, ClassVar, Final, Protocol, TypeVar, cast

from . import compat, pbwire
from .base import DEFAULT_MAX_DEPTH, DEFAULT_MAX_ELEMENTS, BytesLike, Codec, check_limits
from .errors import (
    BadMagicError,
    CodecError,
    DecodeError,
    DuplicateFrameError,
    EncodeError,
    FrameTooLargeError,
    IncompatibleSchemaError,
    IncompleteStreamError,
    ReorderedFrameError,
    SequenceGapError,
)
from .framing import DEFAULT_MAX_FRAME_BYTES, StreamDecoder, StreamEncoder
from .model import (
    TokenChunk,
    TokenLogprob,
    TopLogprob,
    Usage,
    new_token_chunk,
    new_token_logprob,
    new_top_logprob,
)
from .schema_registry import CachingResolver, Schema, SchemaRegistry, SchemaResolver

M = TypeVar("M")

MAGIC: Final = 0
SUBJECT: Final = "inferwire.delta"
MAX_TABLE_ENTRIES: Final = 4096
MAX_INTERNED_CHARS: Final = 32
_ID: Final = struct.Struct(">I")
_UINT32: Final = 1 << 32
_END: Final = b"\x00"


class _Accelerator(Protocol):
    """What the C extension provides (codecs/_delta_accel.c; its stub has the details)."""

    API_VERSION: int

    def encode_frame(
        self,
        chunk: object,
        base: tuple[str, str, int, int],
        next_seq: int,
        offset: int,
        index: dict[str, int],
        strings: list[str],
        carries_usage: bool,
        /,
    ) -> bytes | None: ...

    def decode_frames(
        self,
        data: bytes,
        pos: int,
        header: tuple[str, str, int, int, int],
        strings: list[str],
        count: int,
        usage_known: bool,
        max_frame_bytes: int,
        out: list[TokenChunk],
        /,
    ) -> int: ...


_ACCEL_API_VERSION: Final = 1


def _load_accelerator() -> _Accelerator | None:
    """The C extension, bound to the model classes; None when absent, stale or turned off."""
    if os.environ.get("INFERWIRE_PURE_PYTHON", "") not in ("", "0"):
        return None
    try:
        from . import _delta_accel
    except ImportError:
        return None  # not built (a pure-Python install): this module does all the work
    try:
        if getattr(_delta_accel, "API_VERSION", None) != _ACCEL_API_VERSION:
            raise TypeError("its API version differs")
        _delta_accel.configure(
            TokenChunk, TokenLogprob, TopLogprob, Usage, MAX_TABLE_ENTRIES, MAX_INTERNED_CHARS
        )
    except (TypeError, ValueError) as exc:  # loud in tests (warnings are errors there)
        warnings.warn(
            f"inferwire.codecs._delta_accel is stale ({exc}); using the pure-Python delta "
            "codec. Rebuild it: pip install -e . (or make venv).",
            RuntimeWarning,
            stacklevel=2,
        )
        return None
    return _delta_accel


_accel = _load_accelerator()


def accelerated() -> bool:
    """Whether new delta encoders and decoders use the C extension."""
    return _accel is not None


def _schema_file(name: str) -> Schema:
    return Schema(resources.files("inferwire.schemas").joinpath(name).read_bytes())


DELTA_V1: Final = _schema_file("delta_v1.binpb")
DELTA_V2: Final = _schema_file("delta_v2.binpb")


def default_registry() -> SchemaRegistry:
    """A registry holding both delta schema versions under ``inferwire.delta`` (ids 1, 2)."""
    registry = SchemaRegistry()
    registry.register(SUBJECT, DELTA_V1)
    registry.register(SUBJECT, DELTA_V2)
    return registry


def _carries_usage(schema: Schema) -> bool:
    frame = compat.messages(schema.parsed()).get("inferwire.delta.Frame")
    return frame is not None and any(f.number == 8 and f.name == "usage" for f in frame.field)


class _Table:
    """The per-stream string table; both ends apply the same rule, in the same order."""

    __slots__ = ("index", "strings")

    def __init__(self) -> None:
        self.strings: list[str] = []
        self.index: dict[str, int] = {}

    def ref(self, text: str) -> int:
        """The ref of ``text`` (0: send it literally, and it joins the table if it may)."""
        found = self.index.get(text)
        if found is not None:
            return found + 1
        if 0 < len(text) <= MAX_INTERNED_CHARS and len(self.strings) < MAX_TABLE_ENTRIES:
            self.index[text] = len(self.strings)
            self.strings.append(text)
        return 0

    def add(self, text: str) -> None:
        if 0 < len(text) <= MAX_INTERNED_CHARS and len(self.strings) < MAX_TABLE_ENTRIES:
            self.strings.append(text)

    def resolve(self, ref: int, literal: str | None) -> str:
        """A field's string: table entry ``ref`` if nonzero, else its literal, which joins
        the table (absent literal: the empty string)."""
        if ref:
            return self.get(ref)
        if literal is None:
            return ""
        self.add(literal)
        return literal

    def get(self, ref: int) -> str:
        if ref > len(self.strings):
            raise DecodeError(f"string ref {ref} past the table's {len(self.strings)} entries")
        return self.strings[ref - 1]


_varint = pbwire.varint
_SMALL: Final = tuple(bytes((i,)) for i in range(128))

_DOUBLE = pbwire.DOUBLE.pack


def _same_float(a: float, b: float) -> bool:
    return a == b and (a != 0.0 or math.copysign(1.0, a) == math.copysign(1.0, b))


_MAX_EXACT: Final = 1 << 53
_MAX_SCALE: Final = 22
_POW10: Final = tuple(10.0**k for k in range(_MAX_SCALE + 1))  # all exact doubles
_POW10_INT: Final = tuple(10**k for k in range(_MAX_SCALE + 1))


def _decimal(value: float) -> tuple[int, int] | None:
    """``value`` as (mantissa, scale) with value == mantissa / 10**scale exactly, or None.

    ``repr`` gives the shortest decimal that reads back to the same double; dividing its digits
    by a power of ten, both exact doubles, rounds correctly to that same double.
    """
    text = repr(value)
    whole, dot, fraction = text.partition(".")
    if not dot or "e" in fraction or len(fraction) > _MAX_SCALE:
        return None  # nan, inf, exponent notation, or too many places
    if fraction == "0":
        fraction = ""
    mantissa = int(whole + fraction)
    if mantissa == 0 or abs(mantissa) >= _MAX_EXACT:
        return None  # zero keeps its sign only as a double
    return mantissa, len(fraction)


def _ref_or_literal(table: _Table, text: str) -> tuple[int, bytes]:
    """The table ref of ``text`` (0 if new: it joins the table) and its UTF-8 if new."""
    found = table.index.get(text)
    if found is not None:
        return found + 1, b""
    raw = text.encode()  # first: text that cannot be encoded must not join the table
    table.ref(text)
    return 0, raw


def _logprob(table: _Table, lp: TokenLogprob) -> bytes:
    ref, raw = _ref_or_literal(table, lp.token)
    out = b"\x08" + _varint(ref) if ref else b"\x12" + _varint(len(raw)) + raw if raw else b""
    decimal = _decimal(lp.logprob)
    if decimal is None:
        out += b"\x19" + _DOUBLE(lp.logprob)
    else:
        out += b"\x40" + _varint(pbwire.zigzag(decimal[0])) + b"\x48" + _SMALL[decimal[1]]
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
    return out + _top_logprobs(values)


def _top_logprobs(values: list[float]) -> bytes:
    """The alternatives' logprobs as decimals over one common scale, else as doubles."""
    mantissas = []
    scales = []
    for value in values:
        decimal = _decimal(value)
        if decimal is None:
            break
        mantissas.append(decimal[0])
        scales.append(decimal[1])
    else:
        scale = max(scales)
        packed = bytearray()
        for mantissa, own_scale in zip(mantissas, scales, strict=True):
            mantissa *= _POW10_INT[scale - own_scale]
            if abs(mantissa) >= _MAX_EXACT:
                break
            packed += _varint(pbwire.zigzag(mantissa))
        else:
            return b"\x52" + _varint(len(packed)) + packed + b"\x58" + _SMALL[scale]
    doubles = struct.pack(f"<{len(values)}d", *values)
    return b"\x3a" + _varint(len(doubles)) + doubles


class DeltaStreamEncoder:
    """Sans-IO encoder of one response's chunks; see the module docstring for the bytes."""

    __slots__ = (
        "_accel",
        "_base",
        "_base_seq",
        "_broken",
        "_next_seq",
        "_schema_id",
        "_table",
        "_usage",
        "count",
    )

    def __init__(self, schema_id: int, *, carries_usage: bool, pure_python: bool = False) -> None:
        self._accel = None if pure_python else _accel
        self._schema_id = schema_id
        self._usage = carries_usage
        self._base: tuple[str, str, int, int] | None = None
        self._base_seq = 0
        self._next_seq = 0
        self._table = _Table()
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
        return bytes((MAGIC,)) + _ID.pack(self._schema_id) + _varint(len(body)) + body

    def encode(self, chunk: Any, /) -> bytes:
        base = self._base
        accel = self._accel
        if accel is not None and base is not None and not self._broken:
            # Any next chunk of the same response, compiled. None: it changed nothing, and the
            # Python paths below take the chunk exactly as they would without it.
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
            if not 0 <= chunk.index < _UINT32:
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
                chunk, base, seq, offset, table.index, table.strings, self._usage
            )
            if compiled is not None:
                self._next_seq = seq + 1
                self.count += 1
                return head + compiled
        frame = b"\x08" + _varint(offset) if offset else b""
        token_ids = chunk.token_ids
        if token_ids:
            if min(token_ids) < 0 or max(token_ids) >= _UINT32:
                raise EncodeError("token ids are uint32")
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
        if chunk.logprobs is not None:
            frame += b"\x28\x01" + b"".join(
                [
                    b"\x32" + _varint(len(body)) + body
                    for body in [_logprob(table, lp) for lp in chunk.logprobs]
                ]
            )
        if chunk.finish_reason is not None:
            raw = chunk.finish_reason.encode()
            frame += b"\x3a" + _varint(len(raw)) + raw
        if chunk.usage is not None:
            if not (
                0 <= chunk.usage.prompt_tokens < _UINT32
                and 0 <= chunk.usage.completion_tokens < _UINT32
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


def _int64(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


def _utf8(data: bytes, start: int, end: int) -> str:
    try:
        return data[start:end].decode()
    except UnicodeDecodeError as exc:
        raise DecodeError(f"invalid UTF-8 in a delta frame: {exc}") from exc


def _read_len(data: bytes, pos: int, end: int) -> tuple[int, int]:
    length, pos = pbwire.read_varint(data, pos, end)
    if pos + length > end:
        raise DecodeError("field overruns its frame")
    return pos, pos + length


def _parse_header(data: bytes) -> tuple[str, str, int, int, int]:
    id_ = model = ""
    created = index = base_seq = 0
    pos, end = 0, len(data)
    read = pbwire.read_varint
    while pos < end:
        tag, pos = read(data, pos, end)
        field, wire = tag >> 3, tag & 7
        if field in (1, 2) and wire == pbwire.LEN:
            start, pos = _read_len(data, pos, end)
            if field == 1:
                id_ = _utf8(data, start, pos)
            else:
                model = _utf8(data, start, pos)
        elif field in (3, 4, 5) and wire == pbwire.VARINT:
            value, pos = read(data, pos, end)
            if field == 3:
                created = _int64(value)
            elif field == 4:
                if value >= _UINT32:
                    raise DecodeError("index over 32 bits")
                index = value
            else:
                base_seq = value
        else:
            pos = pbwire.skip(data, pos, end, wire)
    return id_, model, created, index, base_seq


def _from_decimal(mantissa: int, scale: int) -> float:
    if scale > _MAX_SCALE or abs(mantissa) >= _MAX_EXACT:
        raise DecodeError(f"decimal {mantissa}e-{scale} is outside the exact range")
    return mantissa / _POW10[scale]


def _parse_logprob(data: bytes, pos: int, end: int, table: _Table) -> TokenLogprob:
    token_ref = 0
    token: str | None = None
    logprob = 0.0
    top_is_token = False
    refs: list[int] = []
    literals: list[str] = []
    logprobs: list[float] = []
    mantissa = scale = top_scale = 0
    mantissas: list[int] = []
    read = pbwire.read_varint
    while pos < end:
        tag = data[pos]  # keys of fields 1-15 are one byte: dispatch on the byte itself
        if tag < 128:
            pos += 1
        else:
            tag, pos = read(data, pos, end)
        if tag == 0x08:
            token_ref, pos = read(data, pos, end)
        elif tag == 0x12:
            start, pos = _read_len(data, pos, end)
            token = _utf8(data, start, pos)
        elif tag == 0x40:
            value, pos = read(data, pos, end)
            mantissa = pbwire.unzigzag(value)
        elif tag == 0x48:
            scale, pos = read(data, pos, end)
        elif tag == 0x2A:
            start, pos = _read_len(data, pos, end)
            refs += pbwire.read_packed_varints(data, start, pos)
        elif tag == 0x52:
            start, pos = _read_len(data, pos, end)
            mantissas += map(pbwire.unzigzag, pbwire.read_packed_varints(data, start, pos))
        elif tag == 0x58:
            top_scale, pos = read(data, pos, end)
        elif tag == 0x32:
            start, pos = _read_len(data, pos, end)
            literals.append(_utf8(data, start, pos))
        elif tag == 0x20:
            flag, pos = read(data, pos, end)
            top_is_token = bool(flag)
        elif tag == 0x19:
            if pos + 8 > end:
                raise DecodeError("truncated logprob")
            (logprob,) = pbwire.DOUBLE.unpack_from(data, pos)
            pos += 8
        elif tag == 0x3A:
            start, pos = _read_len(data, pos, end)
            logprobs += pbwire.read_packed_doubles(data, start, pos)
        elif tag == 0x39:
            if pos + 8 > end:
                raise DecodeError("truncated top logprob")
            logprobs.append(pbwire.DOUBLE.unpack_from(data, pos)[0])
            pos += 8
        elif tag == 0x28:
            ref, pos = read(data, pos, end)
            refs.append(ref)
        elif tag == 0x50:
            value, pos = read(data, pos, end)
            mantissas.append(pbwire.unzigzag(value))
        else:
            pos = pbwire.skip(data, pos, end, tag & 7)
    # Strings resolve in the table's order whatever the field order: the token, then its
    # alternatives.
    token = table.resolve(token_ref, token)
    if mantissa:
        logprob = _from_decimal(mantissa, scale)
    if mantissas:
        if logprobs:
            raise DecodeError("top logprobs sent both as doubles and as decimals")
        logprobs = [_from_decimal(m, top_scale) for m in mantissas]
    if len(refs) != len(logprobs):
        raise DecodeError(f"{len(refs)} top tokens but {len(logprobs)} top logprobs")
    top = [new_top_logprob(token, logprob)] if top_is_token else []
    literal = iter(literals)
    for ref, top_logprob in zip(refs, logprobs, strict=True):
        if ref:
            top_token = table.get(ref)
        else:
            next_literal = next(literal, None)
            if next_literal is None:
                raise DecodeError("top token literal missing")
            top_token = next_literal
            table.add(top_token)
        top.append(new_top_logprob(top_token, top_logprob))
    if next(literal, None) is not None:
        raise DecodeError("more top token literals than refs")
    return new_token_logprob(token, logprob, tuple(top))


def _parse_frame(
    data: bytes,
    pos: int,
    end: int,
    header: tuple[str, str, int, int, int],
    table: _Table,
    usage_known: bool,
    in_sequence: Callable[[int], bool],
) -> TokenChunk | None:
    """The chunk of the frame in ``data[pos:end]``. Fields may come in any order; strings
    resolve in the table's order (text first, then each logprob), as the encoder assigned them.
    One-byte varints are read inline: they are most keys and values here. ``None`` when
    ``in_sequence`` holds the frame back (it may be the first of a swapped pair)."""
    offset = 0
    token_ids: list[int] = []
    text_ref = 0
    text: str | None = None
    has_logprobs = False
    logprob_spans: list[tuple[int, int]] = []
    finish_reason: str | None = None
    usage: Usage | None = None
    read = pbwire.read_varint
    while pos < end:
        tag = data[pos]
        if tag < 128:
            pos += 1
        else:
            tag, pos = read(data, pos, end)
        if tag == 0x08:  # seq offset
            offset = data[pos] if pos < end else -1
            if 0 <= offset < 128:
                pos += 1
            else:
                offset, pos = read(data, pos, end)
        elif tag == 0x12:  # token ids, packed
            start, pos = _read_len(data, pos, end)
            token_ids += pbwire.read_packed_varints(data, start, pos)
        elif tag == 0x18:  # text ref
            text_ref = data[pos] if pos < end else -1
            if 0 <= text_ref < 128:
                pos += 1
            else:
                text_ref, pos = read(data, pos, end)
        elif tag == 0x22:  # text literal
            start, pos = _read_len(data, pos, end)
            text = _utf8(data, start, pos)
        elif tag == 0x10:  # token id, unpacked
            token_id, pos = read(data, pos, end)
            token_ids.append(token_id)
        elif tag == 0x28:
            flag, pos = read(data, pos, end)
            has_logprobs = bool(flag)
        elif tag == 0x32:
            start, pos = _read_len(data, pos, end)
            logprob_spans.append((start, pos))
        elif tag == 0x3A:
            start, pos = _read_len(data, pos, end)
            finish_reason = _utf8(data, start, pos)
        elif tag == 0x42 and usage_known:
            start, pos = _read_len(data, pos, end)
            usage = _parse_usage(data, start, pos)
        else:
            pos = pbwire.skip(data, pos, end, tag & 7)
    if token_ids and max(token_ids) >= _UINT32:
        raise DecodeError("token id over 32 bits")
    id_, model, created, index, base_seq = header
    # Order before strings: a frame out of turn raises (or is held) before it can touch the
    # string table, so a gap is reported as a gap, not as a bad string ref.
    if not in_sequence(base_seq + offset):
        return None
    text = table.resolve(text_ref, text)
    logprobs = None
    if has_logprobs or logprob_spans:
        logprobs = tuple([_parse_logprob(data, a, b, table) for a, b in logprob_spans])
    return new_token_chunk(
        id_,
        model,
        created,
        index,
        base_seq + offset,
        tuple(token_ids),
        text,
        logprobs,
        finish_reason,
        usage,
    )


def _parse_usage(data: bytes, pos: int, end: int) -> Usage:
    prompt = completion = 0
    while pos < end:
        tag, pos = pbwire.read_varint(data, pos, end)
        field, wire = tag >> 3, tag & 7
        if field in (1, 2) and wire == pbwire.VARINT:
            value, pos = pbwire.read_varint(data, pos, end)
            if field == 1:
                if value >= _UINT32:
                    raise DecodeError("usage count over 32 bits")
                prompt = value
            else:
                if value >= _UINT32:
                    raise DecodeError("usage count over 32 bits")
                completion = value
        else:
            pos = pbwire.skip(data, pos, end, wire)
    return Usage(prompt_tokens=prompt, completion_tokens=completion)


class DeltaStreamDecoder:
    """Sans-IO decoder of one delta stream: bytes in any split, chunks out, in order or an error.

    If the schema registry cannot be reached while the header is read, the
    :class:`SchemaRegistryUnavailableError` is raised and every byte is kept: feed more (or
    ``b""``) to try again.
    """

    def __init__(self, codec: DeltaCodec, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> None:
        if max_frame_bytes <= 0:
            raise ValueError("max_frame_bytes must be positive")
        self._codec = codec
        self._accel = None if codec.pure_python else _accel
        self._buffer = bytearray()
        self._header: tuple[str, str, int, int, int] | None = None
        self._usage_known = False
        self._table = _Table()
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
                        self.max_frame_bytes,
                        out,
                    )
                    if pos == end:
                        break
                    # the frame at pos is not the extension's to take: the general path reads it
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
                chunk = _parse_frame(
                    view,
                    body,
                    frame_end,
                    header,
                    table,
                    self._usage_known,
                    functools.partial(self._in_sequence, delivered_now=delivered),
                )
                pos = frame_end
                if chunk is not None:
                    out.append(chunk)
        finally:
            self.count += len(out)
            if pos < end:
                buffer += view[pos:]
        return out

    def _read_header(self) -> int:
        buffer = self._buffer
        if len(buffer) < 1:
            return 0
        if buffer[0] != MAGIC:
            raise BadMagicError(f"delta stream starts with {buffer[0]:#04x}, expected 0x00")
        if len(buffer) < 5:
            return 0
        (schema_id,) = _ID.unpack_from(buffer, 1)
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
        self._header = _parse_header(bytes(buffer[start : start + length]))
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
            raise SequenceGapError(
                f"frame {missing} is missing (next was {received})",
                expected=missing,
                received=received,
            )
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
            missing, received = self._pending_gap
            raise SequenceGapError(
                f"frame {missing} is missing (next was {received})",
                expected=missing,
                received=received,
            )
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
            missing, received = self._pending_gap
            raise SequenceGapError(
                f"frame {missing} is missing (next was {received})",
                expected=missing,
                received=received,
            )
        if not self.finished:
            state = "mid-frame" if self._buffer else "without its end marker"
            if self._header is None:
                state = "before its header was complete"
            raise IncompleteStreamError(f"delta stream ended {state} after {self.count} chunks")


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


class DeltaCodec(Codec):
    """The delta codec, writing with ``schema`` and resolving writers' ids via ``resolver``.

    ``registry`` (by default one holding both delta versions) gives the id the encoder writes;
    a decoder reads with ``schema`` (its reader schema) after checking that the writer's
    schema, found by id through ``resolver`` (by default a cache in front of ``registry``), is
    compatible with it.

    ``pure_python=True`` keeps its encoders and decoders off the C extension (see the module
    docstring): the reference path, for tests and benchmarks.
    """

    name: ClassVar[str] = "delta"
    media_type: ClassVar[str] = "application/vnd.inferwire.delta"
    stream_media_type: ClassVar[str] = "application/vnd.inferwire.delta"
    types: ClassVar[frozenset[type[Any]]] = frozenset({TokenChunk})

    def __init__(
        self,
        *,
        schema: Schema = DELTA_V2,
        registry: SchemaRegistry | None = None,
        resolver: SchemaResolver | None = None,
        subject: str = SUBJECT,
        pure_python: bool = False,
        max_elements: int = DEFAULT_MAX_ELEMENTS,
    ) -> None:
        check_limits(DEFAULT_MAX_DEPTH, max_elements)
        self.max_elements = max_elements
        self.pure_python = pure_python
        self.registry = default_registry() if registry is None else registry
        self.schema = schema
        self.schema_id = self.registry.register(subject, schema)
        self.resolver = CachingResolver(self.registry) if resolver is None else resolver
        self._carries_usage = _carries_usage(schema)
        self._reader = compat.messages(schema.parsed())
        self._compatible: dict[int, bool] = {}

    def reader_for(self, schema_id: int) -> bool:
        """Check the writer's schema against ours; whether frames may carry usage."""
        if schema_id not in self._compatible:
            writer = self.resolver.resolve(schema_id)  # Unknown/Unavailable propagate
            messages = compat.messages(writer.parsed())
            if not {"inferwire.delta.Header", "inferwire.delta.Frame"} <= messages.keys():
                # compat.check compares shared messages only: an unrelated schema shares none
                raise IncompatibleSchemaError(
                    f"schema {schema_id} is not a delta schema (no inferwire.delta.Frame)"
                )
            violations = compat.check(messages, self._reader, reader_is_newer=False)
            if violations:
                raise IncompatibleSchemaError(
                    f"writer schema {schema_id} cannot be read with this reader schema: "
                    + "; ".join(map(str, violations)),
                    tuple(violations),
                )
            self._compatible[schema_id] = True
        return self._carries_usage

    def stream_encoder(self) -> StreamEncoder:
        return DeltaStreamEncoder(
            self.schema_id, carries_usage=self._carries_usage, pure_python=self.pure_python
        )

    def stream_decoder(
        self, type_: type[Any] | None = None, /, *, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES
    ) -> StreamDecoder[Any]:
        if type_ not in (None, TokenChunk):
            raise DecodeError(f"codec 'delta' cannot decode into {type_!r}")
        return DeltaStreamDecoder(self, max_frame_bytes)

    def encode(self, message: Any, /) -> bytes:
        encoder = DeltaStreamEncoder(
            self.schema_id, carries_usage=self._carries_usage, pure_python=self.pure_python
        )
        return encoder.encode(message)

    def decode(self, data: BytesLike, type_: type[M], /) -> M:
        if type_ is not TokenChunk:
            raise DecodeError(f"codec 'delta' cannot decode into {type_!r}")
        decoder = DeltaStreamDecoder(self)
        chunks = decoder.feed(data)
        if len(chunks) != 1 or decoder._buffer or decoder._pending_gap is not None:
            raise DecodeError("a unary delta message is a header and exactly one frame")
        return cast("M", chunks[0])
