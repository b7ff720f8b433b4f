"""The delta codec's frame parser: the bytes of one header or frame to values, no stream state.

Fields may come in any order and unknown ones are skipped, as protobuf readers do; every
length is checked against the frame it belongs to. What the stream's state decides (whether a
frame is the next one) is asked of the caller, before any string joins the table.
"""

from __future__ import annotations

from collections.abc import Callable

from . import pbwire
from .delta_wire import FLOAT32, UINT32, StringTable, from_decimal
from .errors import DecodeError
from .model import (
    TokenChunk,
    TokenLogprob,
    Usage,
    new_token_chunk,
    new_token_logprob,
    new_top_logprob,
)

__all__ = ["parse_frame", "parse_header"]


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


def parse_header(data: bytes) -> tuple[str, str, int, int, int]:
    """The ``Header`` message in ``data``: (id, model, created, index, base_seq)."""
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
                if value >= UINT32:
                    raise DecodeError("index over 32 bits")
                index = value
            else:
                base_seq = value
        else:
            pos = pbwire.skip(data, pos, end, wire)
    return id_, model, created, index, base_seq


def _parse_logprob(
    data: bytes, pos: int, end: int, table: StringTable, float32: bool
) -> TokenLogprob:
    """One Logprob message; ``float32``: the stream is wire format 1, whose float32 fields
    (12 and 13) are read, else skipped as unknown, as a format-0 reader skips them."""
    token_ref = 0
    token: str | None = None
    logprob = 0.0
    logprob_f32: float | None = None
    double_sent = False
    singles: list[float] = []
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
            double_sent = True
            pos += 8
        elif tag == 0x65 and float32:
            if pos + 4 > end:
                raise DecodeError("truncated float32 logprob")
            (logprob_f32,) = FLOAT32.unpack_from(data, pos)
            pos += 4
        elif tag == 0x6A and float32:
            start, pos = _read_len(data, pos, end)
            if (pos - start) % 4:
                raise DecodeError("packed float32 top logprobs of a length not a multiple of 4")
            singles += [v for (v,) in FLOAT32.iter_unpack(data[start:pos])]
        elif tag == 0x6D and float32:
            if pos + 4 > end:
                raise DecodeError("truncated float32 top logprob")
            singles.append(FLOAT32.unpack_from(data, pos)[0])
            pos += 4
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
        logprob = from_decimal(mantissa, scale)
    if logprob_f32 is not None:
        if mantissa or double_sent:
            raise DecodeError("logprob sent both as a float32 and in another form")
        logprob = logprob_f32
    if mantissas:
        if logprobs:
            raise DecodeError("top logprobs sent both as doubles and as decimals")
        logprobs = [from_decimal(m, top_scale) for m in mantissas]
    if singles:
        if logprobs:
            raise DecodeError("top logprobs sent both as float32 and in another form")
        logprobs = singles
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


def parse_frame(
    data: bytes,
    pos: int,
    end: int,
    header: tuple[str, str, int, int, int],
    table: StringTable,
    usage_known: bool,
    in_sequence: Callable[[int], bool],
    float32: bool = False,
) -> TokenChunk | None:
    """The chunk of the frame in ``data[pos:end]``. Fields may come in any order; strings
    resolve in the table's order (text first, then each logprob), as the encoder assigned them.
    One-byte varints are read inline: they are most keys and values here. ``None`` when
    ``in_sequence`` holds the frame back (it may be the first of a swapped pair). ``float32``:
    the stream is wire format 1 (see :func:`_parse_logprob`)."""
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
    if token_ids and max(token_ids) >= UINT32:
        raise DecodeError("token id over 32 bits")
    id_, model, created, index, base_seq = header
    # Order before strings: a frame out of turn raises (or is held) before it can touch the
    # string table, so a gap is reported as a gap, not as a bad string ref.
    if not in_sequence(base_seq + offset):
        return None
    text = table.resolve(text_ref, text)
    logprobs = None
    if has_logprobs or logprob_spans:
        logprobs = tuple([_parse_logprob(data, a, b, table, float32) for a, b in logprob_spans])
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
                if value >= UINT32:
                    raise DecodeError("usage count over 32 bits")
                prompt = value
            else:
                if value >= UINT32:
                    raise DecodeError("usage count over 32 bits")
                completion = value
        else:
            pos = pbwire.skip(data, pos, end, wire)
    return Usage(prompt_tokens=prompt, completion_tokens=completion)
