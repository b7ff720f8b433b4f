"""Stream framing (codecs/framing.py): any split, any prefix, end markers, frame limits, SSE.

A stream decoder is sans-IO: what it returns must not depend on how the bytes were split, a
strict prefix of a stream is "need more bytes" until ``close()``, which then raises, and a
frame over ``max_frame_bytes`` is refused from what has arrived, before it is buffered whole.

Most binary codecs share one framing (a kind byte and a 4-byte length); the delta codec frames
its own stream (a header with a schema id, then varint lengths). The properties are checked on
every codec; the byte layouts only where they apply.
"""

from __future__ import annotations

import dataclasses
import itertools
import random
import struct
from collections.abc import Iterable
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import inferwire.codecs as ic
from inferwire import workloads
from inferwire.codecs.base import DEFAULT_MAX_ELEMENTS
from inferwire.codecs.delta_codec import DeltaCodec
from inferwire.codecs.framing import (
    DEFAULT_MAX_FRAME_BYTES,
    BytesLike,
    LengthPrefixedEncoder,
    StreamDecoder,
)
from tests.codecs.accel_helpers import peak_memory

NAMES = ic.names()
JSON_CODECS = [n for n in NAMES if ic.get(n, extensions=True).media_type == "application/json"]
BINARY_CODECS = [n for n in NAMES if n not in JSON_CODECS]
MiB = 1024 * 1024


def codec_of(spec: str) -> ic.Codec:
    """``name`` or ``name/ndjson``: a registered codec, or a JSON codec with NDJSON framing."""
    name, _, framing = spec.partition("/")
    return (
        ic.get(name, framing=framing, extensions=True) if framing else ic.get(name, extensions=True)
    )


# Every stream framing there is: SSE and NDJSON for each JSON codec, length-prefixed for the rest.
FRAMED = NAMES + [f"{n}/ndjson" for n in JSON_CODECS]


def _framing(spec: str) -> str:
    if spec.endswith("/ndjson"):
        return "ndjson"
    return "sse" if spec in JSON_CODECS else "length-prefixed"


# The bytes a frame adds around its payload: what max_frame_bytes does not count.
FRAME_OVERHEAD = {"sse": 2, "ndjson": 1, "length-prefixed": 5}  # "\n\n", "\n", kind + length


def shared_length_prefixed(codec: ic.Codec) -> bool:
    """Whether the codec's streams use framing.py's binary frames: kind byte, 4-byte length,
    and an end frame carrying an 8-byte count. (The delta codec has its own.)"""
    return isinstance(codec.stream_encoder(), LengthPrefixedEncoder)


SHARED_LP_CODECS = [n for n in BINARY_CODECS if shared_length_prefixed(ic.get(n, extensions=True))]


def varint(value: int) -> bytes:
    """A protobuf base-128 varint, as the delta codec writes its lengths."""
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def read_varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


def as_delta(codec: ic.Codec) -> DeltaCodec:
    assert isinstance(codec, DeltaCodec), codec
    return codec


def delta_header(codec: ic.Codec, body: bytes = b"") -> bytes:
    """A delta stream's header: magic 0x00, the 4-byte big-endian schema id, a Header message."""
    return b"\x00" + struct.pack(">I", as_delta(codec).schema_id) + varint(len(body)) + body


def length_claims(codec: ic.Codec, size: int) -> dict[str, bytes]:
    """For each length field of the codec's framing, the first bytes of a stream in which that
    field declares a payload of ``size`` bytes."""
    if shared_length_prefixed(codec):
        return {
            "message frame": struct.pack(">BI", 0, size),
            "end frame": struct.pack(">BI", 1, size),
        }
    return {
        "header": delta_header(codec)[:5] + varint(size),
        "frame": delta_header(codec) + varint(size + 1),  # a delta frame sends length + 1
    }


def frame_prefix(codec: ic.Codec, size: int) -> bytes:
    """The bytes before a message frame's payload of ``size`` bytes, mid-stream."""
    if shared_length_prefixed(codec):
        return struct.pack(">BI", 0, size)
    return varint(size + 1)


def payload_sizes(spec: str, frames: list[bytes]) -> list[int]:
    """The size of each payload a stream's length fields declare (max_frame_bytes limits each)."""
    codec = codec_of(spec)
    if isinstance(codec, DeltaCodec):
        stream = b"".join(frames)
        header_size, pos = read_varint(stream, 5)
        sizes = [header_size]
        pos += header_size
        while (declared := read_varint(stream, pos))[0]:
            sizes.append(declared[0] - 1)
            pos = declared[1] + declared[0] - 1
        return sizes
    overhead = FRAME_OVERHEAD[_framing(spec)]
    return [len(f) - overhead for f in frames[:-1]]


def small_messages(codec: ic.Codec, count: int = 4) -> list[Any]:
    """A few small messages the codec carries: token chunks (one response's first chunks and
    its last, with finish reason and usage, numbered on), else tensor responses."""
    if ic.TokenChunk in codec.types:
        chunks: list[Any] = workloads.get("stream-16-top5").messages()
        last = dataclasses.replace(chunks[-1], seq=chunks[count - 1].seq)
        return [*chunks[: count - 1], last]
    return [
        ic.InferResponse(
            model="m",
            id=f"r{i}",
            outputs=(
                ic.Tensor(name="o", datatype="INT64", shape=(2,), data=np.array([i, -i], "<i8")),
            ),
        )
        for i in range(count)
    ]


def frames_of(codec: ic.Codec, messages: list[Any]) -> list[bytes]:
    encoder = codec.stream_encoder()
    return [*(encoder.encode(m) for m in messages), encoder.end()]


def feed_all(decoder: StreamDecoder[Any], pieces: Iterable[BytesLike]) -> list[Any]:
    out: list[Any] = []
    for piece in pieces:
        out += decoder.feed(piece)
    return out


def split_at(data: bytes, points: Iterable[int]) -> list[bytes]:
    bounds = [0, *sorted(points), len(data)]
    return [data[a:b] for a, b in itertools.pairwise(bounds)]


def _type(codec: ic.Codec) -> type[Any]:
    return ic.TokenChunk if ic.TokenChunk in codec.types else ic.InferResponse


# -- any split -----------------------------------------------------------------------------


@pytest.mark.parametrize("spec", FRAMED)
@settings(max_examples=50)
@given(data=st.data())
def test_a_stream_decodes_the_same_in_any_split(spec: str, data: st.DataObject) -> None:
    codec = codec_of(spec)
    if ic.TokenChunk in codec.types:
        workload = data.draw(st.sampled_from(["stream-16", "stream-16-top5"]), label="workload")
        messages = workloads.get(workload).messages()
    else:
        messages = small_messages(codec, 6)
    stream = b"".join(frames_of(codec, messages))
    points = data.draw(st.lists(st.integers(0, len(stream)), max_size=30), label="split points")
    decoder = codec.stream_decoder(_type(codec))
    assert feed_all(decoder, split_at(stream, points)) == messages
    assert decoder.finished
    decoder.close()


@pytest.mark.parametrize("spec", FRAMED)
def test_a_stream_fed_one_byte_at_a_time(spec: str) -> None:
    codec = codec_of(spec)
    messages = (
        workloads.get("stream-16-top5").messages()
        if ic.TokenChunk in codec.types
        else small_messages(codec)
    )
    stream = b"".join(frames_of(codec, messages))
    decoder = codec.stream_decoder(_type(codec))
    view = memoryview(stream)
    assert feed_all(decoder, (view[i : i + 1] for i in range(len(stream)))) == messages
    decoder.close()


@pytest.mark.parametrize("spec", FRAMED)
@pytest.mark.parametrize("form", [bytearray, memoryview])
def test_feed_accepts_any_bytes_like(spec: str, form: type[Any]) -> None:
    codec = codec_of(spec)
    messages = small_messages(codec)
    decoder = codec.stream_decoder(_type(codec))
    assert feed_all(decoder, [form(f) for f in frames_of(codec, messages)]) == messages
    decoder.close()


# -- prefixes: "need more" until close() -----------------------------------------------------


def _check_split(codec: ic.Codec, messages: list[Any], frames: list[bytes], at: int) -> None:
    """A decoder fed ``stream[:at]`` holds what it completed and refuses to close; the rest
    completes it."""
    stream = b"".join(frames)
    frame_ends = np.cumsum([len(f) for f in frames[:-1]])
    complete = int(np.searchsorted(frame_ends, at, side="right"))
    decoder = codec.stream_decoder(_type(codec))
    assert decoder.feed(stream[:at]) == messages[:complete]
    assert not decoder.finished
    with pytest.raises(ic.IncompleteStreamError):
        decoder.close()
    assert decoder.feed(stream[at:]) == messages[complete:]
    assert decoder.finished
    decoder.close()


@pytest.mark.parametrize("spec", FRAMED)
def test_every_strict_prefix_of_a_stream_needs_more(spec: str) -> None:
    codec = codec_of(spec)
    messages = small_messages(codec)
    frames = frames_of(codec, messages)
    for at in range(sum(map(len, frames))):
        _check_split(codec, messages, frames, at)


@pytest.mark.parametrize("spec", FRAMED)
@pytest.mark.parametrize("workload", ["stream-256-top5", "stream-256-multi"])
def test_sampled_prefixes_of_a_long_stream_need_more(spec: str, workload: str) -> None:
    codec = codec_of(spec)
    if ic.TokenChunk not in codec.types:
        return
    messages = workloads.get(workload).messages()
    frames = frames_of(codec, messages)
    size = sum(map(len, frames))
    rng = random.Random(workload)
    for at in {0, 1, size - 2, size - 1, *(rng.randrange(size) for _ in range(12))}:
        _check_split(codec, messages, frames, at)


@pytest.mark.parametrize("spec", FRAMED)
def test_an_empty_stream(spec: str) -> None:
    codec = codec_of(spec)
    decoder = codec.stream_decoder(_type(codec))
    with pytest.raises(ic.IncompleteStreamError):
        decoder.close()
    assert decoder.feed(codec.stream_encoder().end()) == []
    assert decoder.finished
    decoder.close()
    assert decoder.feed(b"") == []


@pytest.mark.parametrize("spec", FRAMED)
def test_bytes_after_the_end_marker_are_a_decode_error(spec: str) -> None:
    codec = codec_of(spec)
    messages = small_messages(codec, 2)
    frames = frames_of(codec, messages)
    stream = b"".join(frames)
    for extra in (b"\n", b"\x00", frames[0]):
        with pytest.raises(ic.DecodeError):
            codec.stream_decoder(_type(codec)).feed(stream + extra)
        decoder = codec.stream_decoder(_type(codec))
        assert decoder.feed(stream) == messages
        with pytest.raises(ic.DecodeError):
            decoder.feed(extra)


@pytest.mark.parametrize("spec", FRAMED)
def test_single_byte_corruptions_of_a_stream(spec: str) -> None:
    codec = codec_of(spec)
    stream = b"".join(frames_of(codec, small_messages(codec, 3)))
    for pos in range(len(stream)):
        for mask in (0x01, 0x80, 0xFF):
            corrupt = bytearray(stream)
            corrupt[pos] ^= mask
            decoder = codec.stream_decoder(_type(codec), max_frame_bytes=MiB)
            try:
                decoder.feed(corrupt)
                decoder.close()
            except ic.DecodeError:
                pass
            except Exception as exc:  # nothing but a DecodeError may escape
                pytest.fail(f"{spec}: byte {pos} ^ {mask:#x}: {type(exc).__name__}: {exc}")


# -- frame limits ----------------------------------------------------------------------------


LENGTH_FIELDS = [
    (n, field) for n in BINARY_CODECS for field in length_claims(ic.get(n, extensions=True), 0)
]


@pytest.mark.parametrize(("name", "field"), LENGTH_FIELDS)
def test_a_length_claiming_4_gib_is_refused_without_allocating(name: str, field: str) -> None:
    codec = ic.get(name, extensions=True)
    decoder = codec.stream_decoder(_type(codec))
    with peak_memory(MiB), pytest.raises(ic.FrameTooLargeError) as info:
        decoder.feed(length_claims(codec, 2**32 - 1)[field])
    assert info.value.declared_bytes == 2**32 - 1
    # the delta codec's frames are token chunks: its element budget bounds them lower
    limit = DEFAULT_MAX_ELEMENTS if name == "delta" else DEFAULT_MAX_FRAME_BYTES
    assert info.value.max_frame_bytes == limit
    assert 64 * MiB == DEFAULT_MAX_FRAME_BYTES


@pytest.mark.parametrize("name", BINARY_CODECS)
def test_an_oversized_length_is_refused_as_soon_as_it_is_whole(name: str) -> None:
    codec = ic.get(name, extensions=True)
    messages = small_messages(codec, 2)
    decoder = codec.stream_decoder(_type(codec))
    claim = frame_prefix(codec, 2**32 - 1)
    assert decoder.feed(b"".join(frames_of(codec, messages)[:-1]) + claim[:2]) == messages
    with pytest.raises(ic.FrameTooLargeError):
        decoder.feed(claim[2:])


@pytest.mark.parametrize(("name", "field"), [(n, f) for n, f in LENGTH_FIELDS if f != "end frame"])
def test_the_default_limit_is_64_mib(name: str, field: str) -> None:
    """64 MiB, but for the delta codec: its frames hold token chunks, one element per byte or
    more, so its element budget is the lower bound."""
    codec = ic.get(name, extensions=True)
    limit = DEFAULT_MAX_ELEMENTS if name == "delta" else 64 * MiB
    at_limit = length_claims(codec, limit)[field]
    assert codec.stream_decoder(_type(codec)).feed(at_limit) == []  # needs more, no error
    with pytest.raises(ic.FrameTooLargeError):
        codec.stream_decoder(_type(codec)).feed(length_claims(codec, limit + 1)[field])


@pytest.mark.parametrize("spec", FRAMED)
@settings(max_examples=25)
@given(data=st.data())
def test_max_frame_bytes_holds_in_any_split(spec: str, data: st.DataObject) -> None:
    """A frame of exactly the limit passes, one byte more is refused, however it arrives."""
    codec = codec_of(spec)
    (message,) = small_messages(codec, 1)
    frames = frames_of(codec, [message])
    stream = b"".join(frames)
    size = max(payload_sizes(spec, frames))
    points = data.draw(st.lists(st.integers(0, len(stream)), max_size=8), label="split points")
    pieces = split_at(stream, points)
    decoder = codec.stream_decoder(_type(codec), max_frame_bytes=size)
    assert feed_all(decoder, pieces) == [message]
    decoder.close()
    decoder = codec.stream_decoder(_type(codec), max_frame_bytes=size - 1)
    with pytest.raises(ic.FrameTooLargeError):
        feed_all(decoder, pieces)


@pytest.mark.parametrize("spec", [s for s in FRAMED if _framing(s) != "length-prefixed"])
@pytest.mark.parametrize("piece", [1, 100, 5000])
def test_text_framing_refuses_to_buffer_past_the_limit_without_a_delimiter(
    spec: str, piece: int
) -> None:
    codec = codec_of(spec)
    decoder = codec.stream_decoder(_type(codec), max_frame_bytes=4096)
    junk = (b"data: " if _framing(spec) == "sse" else b"") + b"x" * 8192
    pieces = [junk[i : i + piece] for i in range(0, len(junk), piece)]
    crossing = (4096 + 1 + piece - 1) // piece - 1  # the piece that takes the buffer past 4096
    for before in pieces[:crossing]:
        assert decoder.feed(before) == []
    with pytest.raises(ic.FrameTooLargeError):
        decoder.feed(pieces[crossing])


@pytest.mark.parametrize("spec", FRAMED)
@pytest.mark.parametrize("limit", [0, -1])
def test_max_frame_bytes_must_be_positive(spec: str, limit: int) -> None:
    codec = codec_of(spec)
    with pytest.raises(ValueError, match="positive"):
        codec.stream_decoder(_type(codec), max_frame_bytes=limit)


# -- framing.py's length-prefixed frames (the delta codec's own: tests/codecs/test_delta.py) --


def _binary_stream(name: str) -> tuple[ic.Codec, list[Any], list[bytes]]:
    codec = ic.get(name, extensions=True)
    messages = small_messages(codec, 2)
    return codec, messages, frames_of(codec, messages)


@pytest.mark.parametrize("name", SHARED_LP_CODECS)
def test_length_prefixed_frames_are_kind_length_payload(name: str) -> None:
    codec, messages, frames = _binary_stream(name)
    for frame, message in zip(frames, messages, strict=False):
        assert frame[0] == 0
        assert struct.unpack(">I", frame[1:5])[0] == len(frame) - 5
        assert frame[5:] == codec.encode(message)
    assert frames[-1] == b"\x01\x00\x00\x00\x08" + struct.pack(">Q", len(messages))


@pytest.mark.parametrize("name", SHARED_LP_CODECS)
@pytest.mark.parametrize("count", [0, 1, 3, 2**64 - 1])
def test_an_end_frame_counting_other_than_what_arrived(name: str, count: int) -> None:
    codec, _, frames = _binary_stream(name)
    end = b"\x01\x00\x00\x00\x08" + struct.pack(">Q", count)
    with pytest.raises(ic.DecodeError, match="messages"):
        codec.stream_decoder(_type(codec)).feed(b"".join(frames[:-1]) + end)


@pytest.mark.parametrize("name", SHARED_LP_CODECS)
@pytest.mark.parametrize("length", [0, 7, 9, 16])
def test_an_end_frame_of_the_wrong_length(name: str, length: int) -> None:
    codec, _, frames = _binary_stream(name)
    end = b"\x01" + struct.pack(">I", length) + b"\x00" * length
    with pytest.raises(ic.DecodeError):
        codec.stream_decoder(_type(codec)).feed(b"".join(frames[:-1]) + end)


@pytest.mark.parametrize("name", SHARED_LP_CODECS)
@pytest.mark.parametrize("kind", [2, 0x7F, 0x80, 0xFF])
def test_an_unknown_frame_kind(name: str, kind: int) -> None:
    codec, _, frames = _binary_stream(name)
    with pytest.raises(ic.DecodeError, match="kind"):
        codec.stream_decoder(_type(codec)).feed(bytes([kind]) + frames[0][1:])


@pytest.mark.parametrize("name", SHARED_LP_CODECS)
def test_a_frame_that_is_not_a_message(name: str) -> None:
    codec = ic.get(name, extensions=True)
    with pytest.raises(ic.DecodeError):
        codec.stream_decoder(_type(codec)).feed(b"\x00\x00\x00\x00\x03\xff\xff\xff")


# -- server-sent events (https://html.spec.whatwg.org/multipage/server-sent-events.html) -----


def _sse_parts(name: str) -> tuple[ic.Codec, list[Any], list[bytes]]:
    """A JSON codec, its messages, and each message's JSON payload."""
    codec = ic.get(name, extensions=True)
    messages = small_messages(codec, 3)
    return codec, messages, [codec.encode(m) for m in messages]


def _decode_sse(codec: ic.Codec, stream: bytes, pieces: int = 1) -> list[Any]:
    decoder = codec.stream_decoder(ic.TokenChunk)
    size = -(-len(stream) // pieces)
    out = feed_all(decoder, [stream[i : i + size] for i in range(0, len(stream), size)])
    decoder.close()
    return out


@pytest.mark.parametrize("name", JSON_CODECS)
def test_sse_frames_are_what_openai_sends(name: str) -> None:
    codec, messages, payloads = _sse_parts(name)
    frames = frames_of(codec, messages)
    assert frames[:-1] == [b"data: " + p + b"\n\n" for p in payloads]
    assert frames[-1] == b"data: [DONE]\n\n"


@pytest.mark.parametrize("name", JSON_CODECS)
@pytest.mark.parametrize("eol", [b"\n", b"\r\n", b"\r"], ids=["LF", "CRLF", "CR"])
def test_sse_line_endings(name: str, eol: bytes) -> None:
    codec, messages, payloads = _sse_parts(name)
    stream = b"".join(b"data: " + p + eol + eol for p in [*payloads, b"[DONE]"])
    for pieces in (1, 7, len(stream)):
        assert _decode_sse(codec, stream, pieces) == messages


@pytest.mark.parametrize("name", JSON_CODECS)
def test_sse_comments_and_other_fields_are_ignored(name: str) -> None:
    codec, messages, payloads = _sse_parts(name)
    stream = b": connected\n\n" + b"".join(
        b": ping\nevent: completion\nid: %d\nretry: 1000\nfoo: bar\ndata: %s\n\n" % (i, p)
        for i, p in enumerate(payloads)
    )
    stream += b": keep-alive\n\nevent: done\ndata: [DONE]\n\n"
    assert _decode_sse(codec, stream) == messages
    assert _decode_sse(codec, stream, len(stream)) == messages


@pytest.mark.parametrize("name", JSON_CODECS)
def test_sse_data_without_a_space_and_with_two(name: str) -> None:
    codec, messages, payloads = _sse_parts(name)
    # One space after the colon is removed; a second is the value's (JSON whitespace here).
    stream = b"data:%s\n\ndata:  %s\n\ndata:%s\n\ndata:[DONE]\n\n" % tuple(payloads)
    assert _decode_sse(codec, stream) == messages


@pytest.mark.parametrize("name", JSON_CODECS)
def test_sse_multi_line_data_is_joined_with_newlines(name: str) -> None:
    codec, messages, payloads = _sse_parts(name)
    # A line feed between JSON tokens is whitespace, so the payload splits into data lines there.
    split = [p.replace(b',"choices":', b',\ndata: "choices":\r\ndata:') for p in payloads]
    assert all(p.count(b"\ndata") == 2 for p in split)
    stream = b"".join(b"data: " + p + b"\n\n" for p in split) + b"data: [DONE]\n\n"
    assert _decode_sse(codec, stream) == messages
    assert _decode_sse(codec, stream, len(stream)) == messages


@pytest.mark.parametrize("name", JSON_CODECS)
def test_sse_stream_without_done_is_incomplete(name: str) -> None:
    codec, messages, payloads = _sse_parts(name)
    decoder = codec.stream_decoder(ic.TokenChunk)
    assert decoder.feed(b"".join(b"data: " + p + b"\n\n" for p in payloads)) == messages
    with pytest.raises(ic.IncompleteStreamError):
        decoder.close()


@pytest.mark.parametrize("name", JSON_CODECS)
@pytest.mark.parametrize("event", [b"data: {}", b"data: [DONE", b"data: ", b"data", b"data: null"])
def test_sse_data_that_is_not_a_chunk_is_a_decode_error(name: str, event: bytes) -> None:
    with pytest.raises(ic.DecodeError):
        ic.get(name, extensions=True).stream_decoder(ic.TokenChunk).feed(event + b"\n\n")


_EOLS = (b"\n", b"\r\n", b"\r")


@st.composite
def sse_streams(draw: st.DrawFn, payloads: list[bytes]) -> bytes:
    """The events of ``payloads`` then ``[DONE]``, with any line endings, comments and fields.

    A CR ending followed by an empty line ending in LF would read as one CRLF, so that pair is
    never drawn.
    """
    out = bytearray()
    for payload in [*payloads, b"[DONE]"]:
        lines = draw(
            st.lists(st.sampled_from([b": ping", b"event: completion", b"id: 42", b"retry: 5"]))
        )
        lines.append(b"data:" + draw(st.sampled_from([b" ", b""])) + payload)
        lines += draw(st.lists(st.sampled_from([b": trailer", b"id: 43"]), max_size=2))
        lines.append(b"")  # the blank line that dispatches the event
        for line in lines:
            allowed = _EOLS[1:] if not line and out.endswith(b"\r") else _EOLS
            out += line + draw(st.sampled_from(allowed))
    return bytes(out)


@pytest.mark.parametrize("name", JSON_CODECS)
@settings(max_examples=50)
@given(data=st.data())
def test_sse_any_line_endings_comments_fields_and_splits(name: str, data: st.DataObject) -> None:
    codec, messages, payloads = _sse_parts(name)
    stream = data.draw(sse_streams(payloads), label="stream")
    points = data.draw(st.lists(st.integers(0, len(stream)), max_size=20), label="split points")
    decoder = codec.stream_decoder(ic.TokenChunk)
    assert feed_all(decoder, split_at(stream, points)) == messages
    decoder.close()


# -- NDJSON ----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", JSON_CODECS)
def test_ndjson_is_one_object_a_line_ending_with_a_count(name: str) -> None:
    codec = ic.get(name, framing="ndjson", extensions=True)
    assert codec.name == name
    messages = small_messages(codec, 3)
    frames = frames_of(codec, messages)
    assert frames[:-1] == [codec.encode(m) + b"\n" for m in messages]
    assert frames[-1] == b'{"object":"stream.end","count":3}\n'


@pytest.mark.parametrize("name", JSON_CODECS)
@pytest.mark.parametrize(
    "end",
    [
        b'{"object":"stream.end","count":2}\n',
        b'{"object":"stream.end","count":4}\n',
        b'{"object":"stream.end","count":-3}\n',
        b'{"object":"stream.end","count":3 }\n',
        b'{"object":"stream.end","count":"3"}\n',
        b'{"object":"stream.end","count":}\n',
    ],
)
def test_ndjson_end_line_must_count_what_arrived(name: str, end: bytes) -> None:
    codec = ic.get(name, framing="ndjson", extensions=True)
    messages = small_messages(codec, 3)
    stream = b"".join(frames_of(codec, messages)[:-1]) + end
    with pytest.raises(ic.DecodeError):
        codec.stream_decoder(ic.TokenChunk).feed(stream)


@pytest.mark.parametrize("name", JSON_CODECS)
def test_ndjson_accepts_crlf_lines(name: str) -> None:
    codec = ic.get(name, framing="ndjson", extensions=True)
    messages = small_messages(codec, 3)
    stream = b"".join(f.replace(b"\n", b"\r\n") for f in frames_of(codec, messages)[:-1])
    decoder = codec.stream_decoder(ic.TokenChunk)
    assert decoder.feed(stream + b'{"object":"stream.end","count":3}\n') == messages
    decoder.close()


@pytest.mark.parametrize("spec", FRAMED)
def test_decoders_and_encoders_hold_no_state_between_streams(spec: str) -> None:
    codec = codec_of(spec)
    messages = small_messages(codec, 2)
    assert frames_of(codec, messages) == frames_of(codec, messages)
    stream = b"".join(frames_of(codec, messages))
    first, second = codec.stream_decoder(_type(codec)), codec.stream_decoder(_type(codec))
    assert first.feed(stream) == messages
    assert second.feed(stream) == messages
