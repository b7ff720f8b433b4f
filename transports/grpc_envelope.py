"""The ``Session`` RPC's envelopes, written and read with any codec inside them.

``Session`` carries many requests on one bidirectional call, each message wrapped in the
schema's ``SessionRequest`` / ``SessionResponse`` (``schemas/inferwire.proto``): a request id
and one field of a oneof. The envelope is protobuf whatever the codec; the model messages in it
(an ``InferRequest``, a ``TokenChunk``, an ``InferResponse``) are the codec's bytes, placed as
length-delimited fields. With the ``protobuf`` codec the whole message is therefore exactly the
schema's, readable by any gRPC client of the proto; with another codec those fields hold that
codec's bytes, as ``Generate`` and ``Infer`` carry them. Written and read here by hand because
the generated classes would parse the fields as protobuf.

A ``chunk`` field holds one message of the codec's message stream (a stateful codec's header,
frames and end marker included); ``end`` is a ``StreamEnd`` counting the chunks sent; ``error``
answers a request the server refused, and the session goes on.

``GenerateBatched`` answers with ``StreamBytes`` messages: field 1 holds the codec's *stream*
bytes of one batch of due chunks (SSE, NDJSON or length-prefixed frames, as ``tcp`` writes
them), the last batch ending with the codec's end marker. The codec's own framing, not one of
ours around each chunk: the client feeds the bytes to the codec's stream decoder, whose end
marker (with its count, where the framing has one) proves the stream whole, as on every other
transport. The one-field wrapper costs three or four bytes a batch and keeps the method's
messages what the schema says they are.
"""

from __future__ import annotations

from enum import IntEnum
from typing import Final

from inferwire.codecs import DecodeError, pbwire

from .errors import ProtocolError

_REQUEST_ID: Final = pbwire.key(1, pbwire.VARINT)
_END_COUNT: Final = pbwire.key(1, pbwire.VARINT)
_STREAM_DATA: Final = pbwire.key(1, pbwire.LEN)


class RequestKind(IntEnum):
    """``SessionRequest.kind``: the field number of each member of the oneof."""

    INFER = 2
    GENERATE = 3


class ResponseKind(IntEnum):
    """``SessionResponse.kind``: the field number of each member of the oneof."""

    INFER = 2
    CHUNK = 3
    END = 4
    ERROR = 5


def write(request_id: int, field: int, payload: bytes) -> bytes:
    """One envelope: the request id, then ``payload`` as length-delimited field ``field``."""
    return _REQUEST_ID + pbwire.varint(request_id) + pbwire.length_delimited(field, payload)


def write_end(request_id: int, chunk_count: int) -> bytes:
    """The ``end`` of one request's stream: a ``StreamEnd`` with the chunks sent."""
    return write(request_id, ResponseKind.END, _END_COUNT + pbwire.varint(chunk_count))


def read(data: bytes, what: str) -> tuple[int, int, bytes]:
    """(request id, field number of the oneof member, its bytes) of one envelope.

    Fields may come in any order (protobuf's rule; the last of a repeated one wins). Raises
    :class:`ProtocolError` for bytes that are not an envelope with exactly one member."""
    request_id = 0
    member: tuple[int, bytes] | None = None
    pos, end = 0, len(data)
    try:
        while pos < end:
            tag, pos = pbwire.read_varint(data, pos, end)
            field, wire_type = tag >> 3, tag & 7
            if field == 1 and wire_type == pbwire.VARINT:
                request_id, pos = pbwire.read_varint(data, pos, end)
            elif field in (2, 3, 4, 5) and wire_type == pbwire.LEN:
                length, pos = pbwire.read_varint(data, pos, end)
                if length > end - pos:
                    raise ProtocolError(f"{what}: envelope field longer than the message")
                member = (field, data[pos : pos + length])
                pos += length
            else:
                pos = pbwire.skip(data, pos, end, wire_type)
    except DecodeError as exc:
        raise ProtocolError(f"{what}: bad session envelope: {exc}") from exc
    if member is None:
        raise ProtocolError(f"{what}: session envelope without a request or an answer")
    return request_id, member[0], member[1]


def read_end(payload: bytes, what: str) -> int:
    """The chunk count of a ``StreamEnd``."""
    count = 0
    pos, end = 0, len(payload)
    try:
        while pos < end:
            tag, pos = pbwire.read_varint(payload, pos, end)
            if tag == 8:  # field 1, varint
                count, pos = pbwire.read_varint(payload, pos, end)
            else:
                pos = pbwire.skip(payload, pos, end, tag & 7)
    except DecodeError as exc:
        raise ProtocolError(f"{what}: bad StreamEnd: {exc}") from exc
    return count


def write_stream_bytes(data: bytes) -> bytes:
    """A ``StreamBytes`` holding ``data``."""
    return _STREAM_DATA + pbwire.varint(len(data)) + data


def read_stream_bytes(message: bytes, what: str) -> bytes:
    """The ``data`` of a ``StreamBytes`` (empty if absent, the last if repeated: protobuf's
    rules; other fields are skipped). Raises :class:`ProtocolError` for bytes that are not
    one."""
    data = b""
    pos, end = 0, len(message)
    try:
        while pos < end:
            tag, pos = pbwire.read_varint(message, pos, end)
            if tag == 0x0A:  # field 1, length-delimited
                length, pos = pbwire.read_varint(message, pos, end)
                if length > end - pos:
                    raise ProtocolError(f"{what}: StreamBytes data longer than the message")
                data = message[pos : pos + length]
                pos += length
            else:
                pos = pbwire.skip(message, pos, end, tag & 7)
    except DecodeError as exc:
        raise ProtocolError(f"{what}: bad StreamBytes: {exc}") from exc
    return data
