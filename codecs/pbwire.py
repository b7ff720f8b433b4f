"""Protocol Buffers wire primitives, for the frames the delta codec writes and reads by hand.

https://protobuf.dev/programming-guides/encoding/. Building a upb message from Python costs
more than the whole frame is worth at one token per frame, so the delta codec encodes and
parses its few fields directly; the bytes are ordinary protobuf (any runtime reads them with
schemas/delta_v*.proto) and unknown fields are skipped by wire type, which is what lets an
older reader take a newer writer's frames.
"""

from __future__ import annotations

import struct
from typing import Final

from .errors import DecodeError, EncodeError

VARINT: Final = 0
I64: Final = 1
LEN: Final = 2
I32: Final = 5

_SMALL: Final = tuple(bytes((i,)) for i in range(128))
MAX_VARINT_BYTES: Final = 10
DOUBLE: Final = struct.Struct("<d")


def varint(value: int) -> bytes:
    """The base-128 varint of a non-negative integer below 2**64."""
    if value < 128:
        if value < 0:
            raise EncodeError(f"varint of negative {value}")
        return _SMALL[value]
    # Unrolled for the sizes token ids and decimal mantissas take; a loop costs more.
    if value < 1 << 14:
        return bytes((value & 0x7F | 0x80, value >> 7))
    if value < 1 << 21:
        return bytes((value & 0x7F | 0x80, value >> 7 & 0x7F | 0x80, value >> 14))
    if value < 1 << 28:
        return bytes(
            (value & 0x7F | 0x80, value >> 7 & 0x7F | 0x80, value >> 14 & 0x7F | 0x80, value >> 21)
        )
    if value >= 1 << 64:
        raise EncodeError(f"{value} does not fit in 64 bits")
    out = bytearray()
    while value >= 128:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def zigzag(value: int) -> int:
    """sint64 mapping: small magnitudes, either sign, stay short."""
    return (value << 1) ^ (value >> 63)


def unzigzag(value: int) -> int:
    return (value >> 1) ^ -(value & 1)


def read_varint(data: bytes, pos: int, end: int) -> tuple[int, int]:
    """The varint at ``pos`` and the position after it; DecodeError if cut or over 10 bytes."""
    if pos + 2 < end:  # one to three bytes, unrolled: most keys, lengths and token ids
        byte = data[pos]
        if byte < 128:
            return byte, pos + 1
        second = data[pos + 1]
        if second < 128:
            return byte & 0x7F | second << 7, pos + 2
        third = data[pos + 2]
        if third < 128:
            return byte & 0x7F | (second & 0x7F) << 7 | third << 14, pos + 3
    result = 0
    shift = 0
    start = pos
    limit = min(end, pos + MAX_VARINT_BYTES)
    while pos < limit:
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 128:
            if result >= 1 << 64:
                raise DecodeError("varint over 64 bits")
            return result, pos
        shift += 7
    if pos - start < MAX_VARINT_BYTES:
        raise DecodeError("truncated varint")
    raise DecodeError("varint longer than 10 bytes")


def key(field: int, wire_type: int) -> bytes:
    return varint(field << 3 | wire_type)


def length_delimited(field: int, payload: bytes) -> bytes:
    return key(field, LEN) + varint(len(payload)) + payload


def skip(data: bytes, pos: int, end: int, wire_type: int) -> int:
    """The position after a field of ``wire_type`` whose key ended at ``pos``."""
    if wire_type == VARINT:
        return read_varint(data, pos, end)[1]
    if wire_type == I64:
        pos += 8
    elif wire_type == LEN:
        length, pos = read_varint(data, pos, end)
        pos += length
    elif wire_type == I32:
        pos += 4
    else:  # groups (3, 4) are proto2-only and never written here
        raise DecodeError(f"unsupported wire type {wire_type}")
    if pos > end:
        raise DecodeError("field overruns its message")
    return pos


def read_packed_varints(data: bytes, pos: int, end: int) -> list[int]:
    out = []
    while pos < end:
        byte = data[pos]
        if byte < 128:
            out.append(byte)
            pos += 1
        else:
            value, pos = read_varint(data, pos, end)
            out.append(value)
    return out


def read_packed_doubles(data: bytes, pos: int, end: int) -> list[float]:
    count, rest = divmod(end - pos, 8)
    if rest:
        raise DecodeError("packed doubles of a length not a multiple of 8")
    return list(struct.unpack_from(f"<{count}d", data, pos))
