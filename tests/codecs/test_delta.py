"""The delta codec (codecs/delta_codec.py): a response's fixed fields once, then what changes.

Frame-level faults (a gap, a duplicate, a swap, a bad end marker, a bad string ref) are built
by cutting an encoded stream along the layout codecs/delta_wire.py documents:

    header  magic (0x01 for schema version 3, the default; 0x00 before it), 4-byte big-endian
            schema id, varint N, N bytes of a ``Header`` message
    frame   varint L + 1, L bytes of a ``Frame`` message (a length of 0 is the end marker)
    end     0x00, varint count of the chunks sent

Schema evolution, the resolver's faults and its cache are at the end of the file. Every test
runs twice: on the C extension's path and on the pure-Python one (the ``path`` fixture).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import itertools
import math
import struct
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from hypothesis import given, settings
from hypothesis import strategies as st

import inferwire.codecs as ic
from inferwire import workloads
from inferwire.codecs import delta_codec
from inferwire.codecs.delta_codec import DELTA_V1, DELTA_V2, DELTA_V3, DeltaCodec
from inferwire.codecs.errors import (
    BadMagicError,
    DuplicateFrameError,
    IncompatibleSchemaError,
    ReorderedFrameError,
    SchemaRegistryUnavailableError,
    SequenceGapError,
)
from inferwire.codecs.framing import BytesLike
from inferwire.codecs.schema_registry import (
    CachingResolver,
    Compatibility,
    Schema,
    SchemaRegistry,
    SchemaResolver,
)

MiB = 1024 * 1024
CODEC = DeltaCodec()  # schema version 3, the default registry (v1 is id 1, v2 id 2, v3 id 3)


@pytest.fixture(autouse=True, scope="module", params=["accelerated", "pure-python"])
def path(request: pytest.FixtureRequest) -> Iterator[str]:
    """The encoders and decoders made within: with the C extension, or without it."""
    if request.param == "accelerated" and not delta_codec.accelerated():
        pytest.skip("the C extension is not built, or INFERWIRE_PURE_PYTHON is set")
    with pytest.MonkeyPatch.context() as patch:
        if request.param == "pure-python":
            patch.setattr(delta_codec, "_accel", None)
        yield request.param


STREAM_WORKLOADS = workloads.names(kind="stream")
SMALL_WORKLOADS = [w for w in STREAM_WORKLOADS if len(workloads.get(w).messages()) <= 256]
LARGE_WORKLOADS = [w for w in STREAM_WORKLOADS if w not in SMALL_WORKLOADS]


# -- the documented layout -------------------------------------------------------------------


def varint(value: int) -> bytes:
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


def frame(body: bytes) -> bytes:
    """One frame: its length plus one, then the Frame message."""
    return varint(len(body) + 1) + body


def end_marker(count: int) -> bytes:
    return b"\x00" + varint(count)


def header(schema_id: int = CODEC.schema_id, body: bytes = b"", magic: int = 0x01) -> bytes:
    """A header as CODEC writes it (magic 0x01: wire format 1, schema version 3)."""
    return bytes((magic,)) + struct.pack(">I", schema_id) + varint(len(body)) + body


@dataclasses.dataclass(frozen=True)
class Parts:
    """A delta stream cut along its layout; ``frames`` hold each frame whole (length first)."""

    header: bytes
    frames: list[bytes]
    end: bytes

    @property
    def header_body(self) -> bytes:
        return self.header[5 + len(varint(len(self.header) - 5)) :]

    @property
    def bodies(self) -> list[bytes]:
        return [f[read_varint(f, 0)[1] :] for f in self.frames]

    def join(self, frames: Iterable[bytes] | None = None, end: bytes | None = None) -> bytes:
        frames = self.frames if frames is None else frames
        return self.header + b"".join(frames) + (self.end if end is None else end)


def split_stream(stream: bytes, *, ended: bool = True) -> Parts:
    """Cut ``stream`` into header, frames and end, checking the layout on the way."""
    assert stream[0] in (0x00, 0x01), "magic byte"
    size, pos = read_varint(stream, 5)
    pos += size
    head = stream[:pos]
    frames = []
    while pos < len(stream):
        length, body = read_varint(stream, pos)
        if length == 0:
            break
        frames.append(stream[pos : body + length - 1])
        pos = body + length - 1
    end = stream[pos:]
    if ended:
        assert end == end_marker(len(frames))
    else:
        assert end == b""
    return Parts(head, frames, end)


def encode_frames(codec: ic.Codec, chunks: Sequence[ic.TokenChunk]) -> list[bytes]:
    encoder = codec.stream_encoder()
    return [*(encoder.encode(c) for c in chunks), encoder.end()]


def encode_stream(codec: ic.Codec, chunks: Sequence[ic.TokenChunk]) -> bytes:
    return b"".join(encode_frames(codec, chunks))


def decode_pieces(codec: ic.Codec, pieces: Iterable[BytesLike]) -> list[ic.TokenChunk]:
    """Feed every piece, then close: the stream must be whole."""
    decoder = codec.stream_decoder(ic.TokenChunk)
    out: list[ic.TokenChunk] = []
    for piece in pieces:
        out += decoder.feed(piece)
    assert decoder.finished
    decoder.close()
    return out


def split_at(data: bytes, points: Iterable[int]) -> list[bytes]:
    bounds = [0, *sorted(points), len(data)]
    return [data[a:b] for a, b in itertools.pairwise(bounds)]


def one_byte_at_a_time(data: bytes) -> list[memoryview]:
    view = memoryview(data)
    return [view[i : i + 1] for i in range(len(data))]


def comparable(chunk: ic.TokenChunk) -> tuple[Any, ...]:
    """The chunk with each logprob as its bits: NaN equals itself, -0.0 differs from 0.0."""
    logprobs = None
    if chunk.logprobs is not None:
        logprobs = [
            (lp.token, _bits(lp.logprob), [(t.token, _bits(t.logprob)) for t in lp.top])
            for lp in chunk.logprobs
        ]
    return (dataclasses.replace(chunk, logprobs=None), logprobs)


def _bits(value: float) -> bytes:
    return struct.pack("<d", value)


def assert_same_chunks(decoded: Sequence[ic.TokenChunk], chunks: Sequence[ic.TokenChunk]) -> None:
    assert [comparable(c) for c in decoded] == [comparable(c) for c in chunks]


def check_well_formed(chunk: Any) -> None:
    assert type(chunk) is ic.TokenChunk
    for text in (chunk.id, chunk.model, chunk.text):
        assert type(text) is str
    for number in (chunk.created, chunk.index, chunk.seq):
        assert type(number) is int
    assert type(chunk.token_ids) is tuple
    assert all(type(t) is int and 0 <= t < 2**32 for t in chunk.token_ids)
    if chunk.logprobs is not None:
        assert type(chunk.logprobs) is tuple
        for lp in chunk.logprobs:
            assert type(lp.token) is str
            assert type(lp.logprob) is float
            assert type(lp.top) is tuple
            assert all(type(t.token) is str and type(t.logprob) is float for t in lp.top)
    assert chunk.finish_reason is None or type(chunk.finish_reason) is str
    if chunk.usage is not None:
        assert type(chunk.usage.prompt_tokens) is int
        assert type(chunk.usage.completion_tokens) is int


def decode_or_decode_error(codec: ic.Codec, pieces: Sequence[bytes]) -> list[ic.TokenChunk]:
    """The chunks of a stream that decodes whole, or [] for a DecodeError: nothing else."""
    decoder = codec.stream_decoder(ic.TokenChunk, max_frame_bytes=MiB)
    out: list[ic.TokenChunk] = []
    try:
        for piece in pieces:
            out += decoder.feed(piece)
        decoder.close()
    except ic.DecodeError:
        return []
    except Exception as exc:  # the property under test: nothing else escapes
        pytest.fail(f"{type(exc).__name__}: {exc} for {b''.join(pieces)[:80]!r}")
    for chunk in out:
        check_well_formed(chunk)
    return out


BASE = ic.TokenChunk(
    id="chatcmpl-7", model="m-1", created=1_732_924_800, index=0, seq=0, token_ids=(), text=""
)


def response(*steps: dict[str, Any], start: int = 0, base: ic.TokenChunk = BASE) -> list[Any]:
    """One response's chunks: ``base`` with each step's changes, numbered from ``start``."""
    return [dataclasses.replace(base, seq=start + i, **step) for i, step in enumerate(steps)]


def lp(token: str, logprob: float, *top: tuple[str, float]) -> ic.TokenLogprob:
    return ic.TokenLogprob(
        token=token, logprob=logprob, top=tuple(ic.TopLogprob(token=t, logprob=v) for t, v in top)
    )


@functools.cache
def workload_stream(name: str) -> tuple[list[ic.TokenChunk], bytes]:
    chunks = [c for c in workloads.get(name).messages() if isinstance(c, ic.TokenChunk)]
    assert len(chunks) == len(workloads.get(name).messages())
    return chunks, encode_stream(CODEC, chunks)


# A small response that exercises every field: multi-token steps, an empty text, strings that
# repeat (the table), logprobs absent, empty and with alternatives, finish reason and usage.
SMALL = response(
    {"token_ids": (42, 70_000), "text": " café", "logprobs": (lp(" caf", -0.25, (" caf", -0.25)),)},
    {"token_ids": (7,), "text": "", "logprobs": ()},
    {"token_ids": (), "text": " café"},
    {
        "token_ids": (2**32 - 1, 0),
        "text": "東京",
        "logprobs": (lp("東", -1.5, ("東", -1.5), (" caf", -3.0)), lp("京", -0.0)),
        "finish_reason": "length",
        "usage": ic.Usage(prompt_tokens=10, completion_tokens=5),
    },
)


def test_the_stream_has_the_documented_layout() -> None:
    encoder = CODEC.stream_encoder()
    first = encoder.encode(SMALL[0])
    assert first[0] == 0x01
    assert struct.unpack(">I", first[1:5]) == (CODEC.schema_id,) == (3,)
    later = [encoder.encode(c) for c in SMALL[1:]]
    for one in later:  # after the header, one frame per chunk
        length, body = read_varint(one, 0)
        assert length == len(one) - body + 1
    assert encoder.end() == end_marker(len(SMALL))
    parts = split_stream(first + b"".join(later) + encoder.end())
    assert len(parts.frames) == len(SMALL)
    assert parts.frames[1:] == later


def test_an_empty_stream_is_a_header_and_the_end_marker() -> None:
    end = CODEC.stream_encoder().end()
    assert split_stream(end) == Parts(header(), [], end_marker(0))
    assert decode_pieces(CODEC, [end]) == []
    assert decode_pieces(CODEC, one_byte_at_a_time(end)) == []


# -- round trips -----------------------------------------------------------------------------


@pytest.mark.parametrize("workload", SMALL_WORKLOADS)
@settings(max_examples=20)
@given(data=st.data())
def test_every_small_stream_workload_round_trips_in_any_split(
    workload: str, data: st.DataObject
) -> None:
    chunks, stream = workload_stream(workload)
    points = data.draw(st.lists(st.integers(0, len(stream)), max_size=60), label="splits")
    assert_same_chunks(decode_pieces(CODEC, split_at(stream, points)), chunks)


@pytest.mark.parametrize("workload", LARGE_WORKLOADS)
@settings(max_examples=3)
@given(data=st.data())
def test_every_large_stream_workload_round_trips_in_any_split(
    workload: str, data: st.DataObject
) -> None:
    chunks, stream = workload_stream(workload)
    points = data.draw(st.lists(st.integers(0, len(stream)), max_size=200), label="splits")
    assert_same_chunks(decode_pieces(CODEC, split_at(stream, points)), chunks)


@pytest.mark.parametrize("workload", ["stream-16-top5", "stream-256-multi"])
def test_a_workload_stream_fed_one_byte_at_a_time(workload: str) -> None:
    chunks, stream = workload_stream(workload)
    assert_same_chunks(decode_pieces(CODEC, one_byte_at_a_time(stream)), chunks)


def test_the_workloads_hold_what_the_delta_codec_must_carry() -> None:
    """Multi-token steps, logprobs with alternatives, and usage on the last chunk."""
    multi, _ = workload_stream("stream-256-multi")
    assert max(len(c.token_ids) for c in multi) > 1
    top5, _ = workload_stream("stream-16-top5")
    assert all(c.logprobs and c.logprobs[0].top for c in top5)
    assert all(workload_stream(w)[0][-1].usage is not None for w in SMALL_WORKLOADS)


def _double(bits: int) -> float:
    value: float = struct.unpack("<d", struct.pack("<Q", bits))[0]
    return value


SPECIAL_FLOATS = {
    "-0.0": -0.0,
    "0.0": 0.0,
    "nan": math.nan,
    "-nan": -math.nan,
    "signaling-nan": _double(0x7FF0_0000_0000_0001),
    "nan-with-payload": _double(0xFFF8_0000_DEAD_BEEF),
    "inf": math.inf,
    "-inf": -math.inf,
    "smallest-subnormal": 5e-324,
    "subnormal": -1e-310,
    "smallest-normal": 2.2250738585072014e-308,
    "largest": 1.7976931348623157e308,
    "short-decimal": -0.25,
    "short-decimal-2": -1.5,
    "openai-like": -12.3456789,
    "16-digits": -0.1234567890123456,
    "17-digits": -0.12345678901234568,
    "17-digits-2": 0.30000000000000004,
    "exponent-notation": -1.2345678901234567e-05,
    "scale-22": 1e-22,
    "scale-23": 1.5e-22,
    "2**53-1": -9007199254740991.0,
    "2**53": 9007199254740992.0,
    "mantissa-past-2**53": -123456789012345.67,
    "1e22": 1e22,
    "a-third": -1 / 3,
}


@pytest.mark.parametrize("value", list(SPECIAL_FLOATS.values()), ids=list(SPECIAL_FLOATS))
def test_every_logprob_keeps_its_exact_bits(value: float) -> None:
    """Short decimals travel as mantissa / 10^scale, the rest as doubles: both exact."""
    chunks = response(
        # top[0] repeats the token (sent once), then others with the same and other values
        {"logprobs": (lp("a", value, ("a", value), ("b", value), ("c", -0.5)),)},
        {"logprobs": (lp("a", value), lp("b", -0.001, ("b", -0.001), ("c", value)))},
        # the same token with the opposite zero, or another NaN, is not the token repeated
        {"logprobs": (lp("a", value, ("a", -value), ("a", value)),)},
    )
    stream = encode_stream(CODEC, chunks)
    assert_same_chunks(decode_pieces(CODEC, [stream]), chunks)
    assert_same_chunks(decode_pieces(CODEC, one_byte_at_a_time(stream)), chunks)
    for chunk in chunks:
        assert_same_chunks([CODEC.decode(CODEC.encode(chunk), ic.TokenChunk)], [chunk])


short_decimals = st.builds(
    lambda mantissa, scale: mantissa / 10**scale,
    st.integers(-(10**15), 10**15),
    st.integers(0, 22),
)
any_float = st.floats() | short_decimals | st.sampled_from(list(SPECIAL_FLOATS.values()))


@settings(max_examples=200)
@given(values=st.lists(any_float, min_size=1, max_size=6))
def test_any_logprobs_keep_their_exact_bits(values: list[float]) -> None:
    token, *top = values
    chunks = response(
        {"logprobs": (lp("t", token, *((f"a{i}", v) for i, v in enumerate(top))),)},
        {"logprobs": (lp("t", token, ("t", token), *(("a0", v) for v in top)),)},
    )
    assert_same_chunks(decode_pieces(CODEC, [encode_stream(CODEC, chunks)]), chunks)


# Strings that repeat (and so go through the string table), and ones that must not be interned.
PIECES = ["", " the", "é", "東京", "😊", "👩‍👩‍👧", "\x00", " ", "x" * 32, "y" * 33, "\ufeff"]
texts = st.sampled_from(PIECES) | st.text(max_size=40)
u32 = st.integers(0, 2**32 - 1)


@st.composite
def token_logprobs(draw: st.DrawFn) -> ic.TokenLogprob:
    token, logprob = draw(texts), draw(any_float)
    top = draw(st.lists(st.builds(ic.TopLogprob, token=texts, logprob=any_float), max_size=5))
    if draw(st.booleans()):  # OpenAI's usual case: the sampled token is the first alternative
        top.insert(0, ic.TopLogprob(token=token, logprob=logprob))
    return ic.TokenLogprob(token=token, logprob=logprob, top=tuple(top))


@st.composite
def responses(draw: st.DrawFn, max_chunks: int = 8) -> list[ic.TokenChunk]:
    """One response's chunks: fixed fields drawn once, consecutive seq from anywhere."""
    count = draw(st.integers(0, max_chunks))
    base = ic.TokenChunk(
        id=draw(texts),
        model=draw(texts),
        created=draw(st.integers(-(2**63), 2**63 - 1)),
        index=draw(u32),
        seq=0,
        token_ids=(),
        text="",
    )
    steps = [
        {
            "token_ids": tuple(draw(st.lists(u32, max_size=8))),
            "text": draw(texts),
            "logprobs": draw(st.none() | st.lists(token_logprobs(), max_size=3).map(tuple)),
            "finish_reason": draw(st.none() | texts),
            "usage": draw(
                st.none() | st.builds(ic.Usage, prompt_tokens=u32, completion_tokens=u32)
            ),
        }
        for _ in range(count)
    ]
    start = draw(st.integers(0, 2**64 - 1 - count) | st.integers(0, 3))
    return response(*steps, start=start, base=base)


@settings(max_examples=80)
@given(chunks=responses(), data=st.data())
def test_any_response_round_trips_in_any_split(
    chunks: list[ic.TokenChunk], data: st.DataObject
) -> None:
    stream = encode_stream(CODEC, chunks)
    points = data.draw(st.lists(st.integers(0, len(stream)), max_size=20), label="splits")
    assert_same_chunks(decode_pieces(CODEC, split_at(stream, points)), chunks)


CASES = {
    "multi-token steps": response(
        {"token_ids": tuple(range(8)), "text": " a b c d e f g h"},
        {"token_ids": (0, 2**32 - 1, 127, 128, 16_383, 16_384), "text": "x"},
    ),
    "empty text steps": response(
        {"token_ids": (1,), "text": ""},
        {"token_ids": (), "text": ""},
        {"token_ids": (2,), "text": "", "finish_reason": ""},
    ),
    "multi-byte utf-8": response(
        {"text": "é"}, {"text": "東京"}, {"text": "😊"}, {"text": "👩‍👩‍👧"}, {"text": "é"}
    ),
    "logprobs none, empty, without and with alternatives": response(
        {"logprobs": None},
        {"logprobs": ()},
        {"logprobs": (lp("a", -1.0),)},
        {"logprobs": (lp("a", -1.0, ("a", -1.0)),)},
        {"logprobs": (lp("", -1.0, ("", -2.0)),)},
        {"logprobs": None},
    ),
    "strings over 32 characters are never interned": response(
        {"text": "x" * 32}, {"text": "y" * 33}, {"text": "x" * 32}, {"text": "y" * 33}
    ),
    "a string as text, token and alternative": response(
        {"text": "ab", "logprobs": (lp("ab", -1.0, ("ab", -1.0), ("ab", -2.0)),)},
        {"text": "ab", "logprobs": (lp("ab", -1.0, ("cd", -1.0), ("ab", -2.0)),)},
        {"text": "cd", "logprobs": (lp("cd", -1.0, ("ab", -1.0)),)},
    ),
    "seq starting anywhere": response({"text": "a"}, {"text": "b"}, start=2**64 - 2),
    "finish reason and usage on every chunk": response(
        *[
            {"finish_reason": "stop", "usage": ic.Usage(prompt_tokens=i, completion_tokens=i)}
            for i in range(3)
        ]
    ),
    "one chunk": response({"token_ids": (1,), "text": "a"}),
    "every field": SMALL,
}


@pytest.mark.parametrize("chunks", list(CASES.values()), ids=list(CASES))
def test_each_case_round_trips_whole_and_one_byte_at_a_time(chunks: list[ic.TokenChunk]) -> None:
    """Fed a byte at a time, every multi-byte character is split across feeds."""
    stream = encode_stream(CODEC, chunks)
    assert_same_chunks(decode_pieces(CODEC, [stream]), chunks)
    assert_same_chunks(decode_pieces(CODEC, one_byte_at_a_time(stream)), chunks)
    assert_same_chunks(decode_pieces(CODEC, encode_frames(CODEC, chunks)), chunks)


def test_the_string_table_stops_growing_at_its_limit() -> None:
    count = delta_codec.MAX_TABLE_ENTRIES + 100
    texts = [f"w{i}" for i in range(count)]
    # the first strings fill the table; later ones stay literal however often they repeat
    chunks = response(*({"text": t} for t in [*texts, *texts[::-1]]))
    assert_same_chunks(decode_pieces(CODEC, [encode_stream(CODEC, chunks)]), chunks)


def test_unary_encode_is_a_header_and_one_frame() -> None:
    for chunk in SMALL:
        data = CODEC.encode(chunk)
        parts = split_stream(data, ended=False)
        assert len(parts.frames) == 1
        for form in (bytes, bytearray, memoryview):
            decoded = CODEC.decode(form(data), ic.TokenChunk)
            assert_same_chunks([decoded], [chunk])


@pytest.mark.parametrize(
    "data",
    [
        pytest.param(header(), id="header-only"),
        pytest.param(CODEC.encode(SMALL[0]) + frame(b"\x08\x01"), id="two-frames"),
        pytest.param(CODEC.encode(SMALL[0])[:-1], id="cut"),
        pytest.param(CODEC.encode(SMALL[0]) + b"\x05", id="trailing-byte"),
    ],
)
def test_unary_decode_is_exactly_one_chunk(data: bytes) -> None:
    with pytest.raises(ic.DecodeError):
        CODEC.decode(data, ic.TokenChunk)


# -- the encoder takes one response, in order ----------------------------------------------

MISUSES = {
    "another id": {"id": "other"},
    "another model": {"model": "other"},
    "another created": {"created": BASE.created + 1},
    "another index": {"index": 1},
    "a seq skipped": {"seq": 2},
    "a seq repeated": {"seq": 0},
    "a seq back": {"seq": -1},
    "usage too large": {"usage": ic.Usage(prompt_tokens=2**64, completion_tokens=0)},
    "a token id too large": {"token_ids": (2**32,)},
    "a lone surrogate in the text": {"text": "lone \ud800"},
    "a lone surrogate in a logprob": {"logprobs": (lp("new", -1.0, ("\udfff", -1.0)),)},
}


@pytest.mark.parametrize("change", list(MISUSES.values()), ids=list(MISUSES))
def test_a_chunk_that_does_not_continue_the_response_is_an_encode_error(
    change: dict[str, Any],
) -> None:
    # one token and the same id and model objects: the encoder's steady-state path
    chunks = response(
        {"token_ids": (1,), "text": "a"},
        {"token_ids": (2,), "text": "b"},
        {"token_ids": (3,), "text": "b"},
        {"token_ids": (4,), "text": "a"},
    )
    encoder = CODEC.stream_encoder()
    sent = encoder.encode(chunks[0])
    with pytest.raises(ic.EncodeError):
        encoder.encode(dataclasses.replace(chunks[1], **change))
    # Whatever the encoder does next, its bytes never say something else than what it took
    # (its string table included): it refuses to go on, or the stream decodes to the chunks
    # it accepted.
    try:
        rest = b"".join([encoder.encode(c) for c in chunks[1:]]) + encoder.end()
    except ic.EncodeError:
        return
    assert_same_chunks(decode_pieces(CODEC, [sent + rest]), chunks)


# -- prefixes: "need more" until close() -------------------------------------------------------


def test_every_strict_prefix_needs_more_then_close_raises() -> None:
    stream = encode_stream(CODEC, SMALL)
    parts = split_stream(stream)
    frame_ends = []
    at = len(parts.header)
    for one in parts.frames:
        at += len(one)
        frame_ends.append(at)
    for at in range(len(stream)):
        complete = sum(1 for end in frame_ends if end <= at)
        decoder = CODEC.stream_decoder(ic.TokenChunk)
        assert decoder.feed(stream[:at]) == SMALL[:complete], at
        assert not decoder.finished
        with pytest.raises(ic.IncompleteStreamError):
            decoder.close()
        assert decoder.feed(stream[at:]) == SMALL[complete:]
        assert decoder.finished
        decoder.close()


@pytest.mark.parametrize(
    "data",
    [
        pytest.param(b"", id="empty"),
        pytest.param(b"\x00", id="magic"),
        pytest.param(b"\x00\x00\x00\x00", id="part-of-the-id"),
        pytest.param(header()[:5], id="magic-and-id"),
        pytest.param(header()[:5] + b"\x85", id="cut-header-length"),
        pytest.param(header()[:5] + b"\x05\x0a\x01", id="cut-header"),
    ],
)
def test_a_stream_shorter_than_its_header_is_incomplete(data: bytes) -> None:
    for pieces in ([data], one_byte_at_a_time(data)):
        decoder = CODEC.stream_decoder(ic.TokenChunk)
        for piece in pieces:
            assert decoder.feed(piece) == []
        with pytest.raises(ic.IncompleteStreamError):
            decoder.close()


# -- corruptions -----------------------------------------------------------------------------


def test_single_byte_corruptions_decode_or_raise_decode_error() -> None:
    stream = encode_stream(CODEC, SMALL)
    for pos in range(len(stream)):
        for mask in (0x01, 0x02, 0x40, 0x80, 0xFF):
            corrupt = bytearray(stream)
            corrupt[pos] ^= mask
            decode_or_decode_error(CODEC, [bytes(corrupt)])


@settings(max_examples=150)
@given(data=st.data())
def test_random_damage_decodes_or_raises_decode_error(data: st.DataObject) -> None:
    _, stream = workload_stream("stream-16-top5")
    damaged = bytearray(stream)
    for _ in range(data.draw(st.integers(1, 4), label="edits")):
        pos = data.draw(st.integers(0, len(damaged) - 1), label="at")
        edit = data.draw(st.sampled_from(["flip", "cut", "insert"]), label="edit")
        if edit == "flip":
            damaged[pos] ^= data.draw(st.integers(1, 255), label="mask")
        elif edit == "cut":
            del damaged[pos : pos + data.draw(st.integers(1, 8), label="length")]
        else:
            damaged[pos:pos] = data.draw(st.binary(min_size=1, max_size=8), label="bytes")
    decode_or_decode_error(CODEC, [bytes(damaged)])


@st.composite
def protobuf_fields(draw: st.DrawFn, nested: bool = True) -> bytes:
    """A run of protobuf fields with the Frame's and Logprob's numbers (and a few more)."""
    out = bytearray()
    for _ in range(draw(st.integers(0, 6))):
        number = draw(st.integers(1, 12))
        wire = draw(st.sampled_from([0, 1, 2, 5]))
        out += varint(number << 3 | wire)
        if wire == 0:
            out += varint(draw(st.integers(0, 40) | st.integers(0, 2**64 - 1)))
        elif wire == 1:
            out += draw(st.binary(min_size=8, max_size=8))
        elif wire == 5:
            out += draw(st.binary(min_size=4, max_size=4))
        else:
            inner = protobuf_fields(nested=False) if nested else st.binary(max_size=12)
            payload = draw(inner | st.binary(max_size=12))
            out += varint(len(payload)) + payload
    return bytes(out)


@settings(max_examples=100)
@given(bodies=st.lists(protobuf_fields(), max_size=4), ended=st.booleans())
def test_frames_of_random_fields_decode_or_raise_decode_error(
    bodies: list[bytes], ended: bool
) -> None:
    # each frame numbered in turn (a seq field first; a later one in the body may override it)
    frames = [frame((b"\x08" + varint(i) if i else b"") + body) for i, body in enumerate(bodies)]
    stream = header() + b"".join(frames) + (end_marker(len(frames)) if ended else b"")
    for chunk in decode_or_decode_error(CODEC, [stream]):
        check_well_formed(chunk)


# -- sequence numbers: gaps, duplicates, reorders ----------------------------------------------

# Streams to drop, repeat and swap frames of. Where later frames refer to strings an earlier
# frame added to the table (top-5 logprobs, repeated texts), a missing or late frame must still
# be reported as what it is, not as a bad string ref.
SEQUENCE_STREAMS = ["stream-16", "stream-16-top5", "stream-256-multi", "repeated texts"]


@functools.cache
def sequence_stream(name: str) -> tuple[list[ic.TokenChunk], bytes]:
    if name == "repeated texts":
        chunks = response(*({"token_ids": (i,), "text": "abcd"[i // 2]} for i in range(8)))
        return chunks, encode_stream(CODEC, chunks)
    return workload_stream(name)


def feed_until_error(
    codec: ic.Codec, pieces: Iterable[bytes], error: type[ic.DecodeError]
) -> tuple[list[ic.TokenChunk], ic.DecodeError]:
    decoder = codec.stream_decoder(ic.TokenChunk)
    delivered: list[ic.TokenChunk] = []
    with pytest.raises(error) as info:  # noqa: PT012
        for piece in pieces:
            delivered += decoder.feed(piece)
        decoder.close()
    return delivered, info.value


@pytest.mark.parametrize("workload", SEQUENCE_STREAMS)
def test_a_dropped_frame_is_a_sequence_gap(workload: str) -> None:
    """Strings the dropped frame added to the table must not hide the gap behind a bad ref."""
    chunks, stream = sequence_stream(workload)
    parts = split_stream(stream)
    for i in range(len(parts.frames) - 1):
        pieces = [parts.header, *parts.frames[:i], *parts.frames[i + 1 :], parts.end]
        delivered, error = feed_until_error(CODEC, pieces, SequenceGapError)
        assert delivered == chunks[:i], i
        assert isinstance(error, SequenceGapError)
        assert (error.expected, error.received) == (chunks[i].seq, chunks[i + 1].seq)


@pytest.mark.parametrize("workload", SEQUENCE_STREAMS)
def test_a_dropped_last_frame_is_caught_by_the_end_marker(workload: str) -> None:
    _, stream = sequence_stream(workload)
    parts = split_stream(stream)
    with pytest.raises(ic.DecodeError):
        decode_pieces(CODEC, [parts.join(parts.frames[:-1])])


@pytest.mark.parametrize("workload", SEQUENCE_STREAMS)
def test_a_repeated_frame_is_a_duplicate(workload: str) -> None:
    chunks, stream = sequence_stream(workload)
    parts = split_stream(stream)
    for i in range(len(parts.frames)):
        for again in sorted({i + 1, len(parts.frames)}):  # right after it, and at the end
            frames = [*parts.frames[:again], parts.frames[i], *parts.frames[again:]]
            delivered, error = feed_until_error(
                CODEC, [parts.header, *frames, parts.end], DuplicateFrameError
            )
            assert delivered == chunks[:again]
            assert isinstance(error, DuplicateFrameError)
            assert error.received == chunks[i].seq
            assert error.expected == chunks[0].seq + again


@pytest.mark.parametrize("workload", SEQUENCE_STREAMS)
def test_two_swapped_frames_are_reordered(workload: str) -> None:
    """Refs to strings of the frame that comes late must not hide the swap behind a bad ref."""
    chunks, stream = sequence_stream(workload)
    parts = split_stream(stream)
    for i in range(len(parts.frames) - 1):
        frames = list(parts.frames)
        frames[i], frames[i + 1] = frames[i + 1], frames[i]
        delivered, error = feed_until_error(
            CODEC, [parts.header, *frames, parts.end], ReorderedFrameError
        )
        assert delivered == chunks[:i], i
        assert isinstance(error, ReorderedFrameError)
        assert (error.expected, error.received) == (chunks[i].seq, chunks[i + 1].seq)


def test_two_dropped_frames_are_a_gap() -> None:
    _, stream = workload_stream("stream-16")
    parts = split_stream(stream)
    frames = [*parts.frames[:3], *parts.frames[5:]]
    _, error = feed_until_error(CODEC, [parts.join(frames)], SequenceGapError)
    assert isinstance(error, SequenceGapError)
    assert (error.expected, error.received) == (3, 5)


# -- header, end marker and string table faults ----------------------------------------------


@pytest.mark.parametrize("whole", [False, True], ids=["first-byte", "whole-stream"])
def test_a_wrong_magic_byte(whole: bool) -> None:
    stream = encode_stream(CODEC, SMALL)
    for magic in range(2, 256):  # 0: format 0; 1: format 1 (float32 logprobs)
        data = bytes([magic]) + (stream[1:] if whole else b"")
        with pytest.raises(BadMagicError):
            CODEC.stream_decoder(ic.TokenChunk).feed(data)


@pytest.mark.parametrize("schema_id", [0, 4, 0x100, 2**31, 2**32 - 1])
def test_an_unknown_schema_id(schema_id: int) -> None:
    parts = split_stream(encode_stream(CODEC, SMALL))
    stream = header(schema_id, parts.header_body) + b"".join(parts.frames) + parts.end
    for decode in (
        lambda: CODEC.stream_decoder(ic.TokenChunk).feed(stream),
        lambda: CODEC.decode(header(schema_id) + frame(b""), ic.TokenChunk),
    ):
        with pytest.raises(ic.UnknownSchemaError) as info:
            decode()
        assert isinstance(info.value, ic.DecodeError)
        assert info.value.schema_id == schema_id


@pytest.mark.parametrize("count", [0, 3, 5, 2**64 - 1])
def test_an_end_marker_counting_other_than_what_arrived(count: int) -> None:
    parts = split_stream(encode_stream(CODEC, SMALL))
    assert len(parts.frames) == 4
    with pytest.raises(ic.DecodeError):
        decode_pieces(CODEC, [parts.join(end=end_marker(count))])


@pytest.mark.parametrize(
    "extra",
    [b"\x00", b"\x01", b"\x00\x00", header(), encode_stream(CODEC, SMALL[:1])],
    ids=["zero", "empty-frame", "end-again", "header", "stream"],
)
def test_bytes_after_the_end_are_a_decode_error(extra: bytes) -> None:
    stream = encode_stream(CODEC, SMALL)
    with pytest.raises(ic.DecodeError):
        CODEC.stream_decoder(ic.TokenChunk).feed(stream + extra)
    decoder = CODEC.stream_decoder(ic.TokenChunk)
    assert decoder.feed(stream) == SMALL
    assert decoder.feed(b"") == []
    with pytest.raises(ic.DecodeError):
        decoder.feed(extra)


def key(number: int, wire: int) -> bytes:
    return varint(number << 3 | wire)


def field(number: int, payload: bytes) -> bytes:
    return key(number, 2) + varint(len(payload)) + payload


LOGPROB_REF = field(6, key(1, 0) + varint(9))  # a Logprob whose token is table entry 8
TOP_REF = field(6, field(2, b"a") + field(5, varint(9)) + field(7, struct.pack("<d", -1.0)))
BAD_REFS = {
    "text ref, empty table": [key(3, 0) + b"\x01"],
    "text ref past the table": [field(4, b"a"), key(1, 0) + b"\x01" + key(3, 0) + b"\x02"],
    "huge text ref": [key(3, 0) + varint(2**64 - 1)],
    "logprob token ref": [key(5, 0) + b"\x01" + LOGPROB_REF],
    "top token ref": [key(5, 0) + b"\x01" + TOP_REF],
}


@pytest.mark.parametrize("bodies", list(BAD_REFS.values()), ids=list(BAD_REFS))
def test_a_string_ref_past_the_table_is_a_decode_error(bodies: list[bytes]) -> None:
    stream = header() + b"".join(map(frame, bodies)) + end_marker(len(bodies))
    with pytest.raises(ic.DecodeError, match="ref"):
        decode_pieces(CODEC, [stream])


def test_a_header_naming_a_schema_that_is_not_a_delta_schema_is_refused() -> None:
    """A shared registry holds other subjects' schemas: an id naming one is no delta stream."""
    registry = delta_codec.default_registry()
    other = descriptor_pb2.FileDescriptorSet()
    file = other.file.add(name="other.proto", package="other", syntax="proto3")
    file.message_type.add(name="Thing").field.add(
        name="x",
        number=1,
        type=descriptor_pb2.FieldDescriptorProto.TYPE_STRING,
        label=descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL,
    )
    other_id = registry.register("other", Schema(other.SerializeToString()))
    codec = DeltaCodec(registry=registry)
    parts = split_stream(encode_stream(codec, SMALL))
    stream = header(other_id, parts.header_body) + b"".join(parts.frames) + parts.end
    with pytest.raises((IncompatibleSchemaError, ic.UnknownSchemaError)):
        codec.stream_decoder(ic.TokenChunk).feed(stream)


# -- the bytes are protobuf: cross-checked with the protobuf runtime ----------------------------


def message_classes(schema: Schema, *, packed: bool = True) -> dict[str, Any]:
    """The schema's message classes, built by protobuf from its descriptor set (``packed=False``:
    repeated scalars written one element a field, as proto2 writers do)."""
    descriptor_set = schema.parsed()
    pool = descriptor_pool.DescriptorPool()
    for file in descriptor_set.file:
        for message in file.message_type:
            for one in message.field:
                if one.label == one.LABEL_REPEATED and one.type not in (
                    one.TYPE_MESSAGE,
                    one.TYPE_STRING,
                    one.TYPE_BYTES,
                ):
                    one.options.packed = packed
        pool.Add(file)
    return {
        name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"inferwire.delta.{name}"))
        for name in ("Header", "Frame", "Logprob", "Usage")
    }


PB = message_classes(DELTA_V3)


def test_the_header_and_frames_parse_with_protobuf() -> None:
    chunks = response(
        {"token_ids": (5, 2**32 - 1), "text": "first"},
        {"token_ids": (6,), "text": "東京", "logprobs": (lp("東京", -0.25, ("x", -1.0)),)},
        {"token_ids": (), "text": "first", "finish_reason": "stop"},
        start=41,
    )
    parts = split_stream(encode_stream(CODEC, chunks))
    head = PB["Header"].FromString(parts.header_body)
    assert (head.id, head.model, head.created, head.index, head.base_seq) == (
        BASE.id,
        BASE.model,
        BASE.created,
        BASE.index,
        41,
    )
    first, second, third = (PB["Frame"].FromString(b) for b in parts.bodies)
    assert (first.seq, list(first.token_ids), first.text, first.text_ref) == (
        0,
        [5, 2**32 - 1],
        "first",
        0,
    )
    assert (second.seq, list(second.token_ids), second.text) == (1, [6], "東京")
    assert not second.has_logprobs  # format 1 flags only an empty list: a Logprob follows
    (logprob,) = second.logprobs
    assert logprob.token_ref == 2  # "東京", the table's second entry, just sent as the text
    # a short decimal travels as mantissa / 10^scale
    assert (logprob.logprob_mantissa, logprob.logprob_scale) == (-25, 2)
    assert third.seq == 2
    assert third.text_ref == 1  # "first" again: table entry 0
    assert third.finish_reason == "stop"
    assert not third.HasField("usage")


def test_a_logprob_that_is_no_short_decimal_travels_as_a_double() -> None:
    value = -0.12345678901234568
    parts = split_stream(encode_stream(CODEC, response({"logprobs": (lp("a", value),)})))
    (logprob,) = PB["Frame"].FromString(parts.bodies[0]).logprobs
    assert logprob.logprob == value
    assert logprob.logprob_mantissa == 0


def _frame_by_protobuf(classes: dict[str, Any], **fields: Any) -> bytes:
    """A Frame serialized by protobuf, one field at a time in reverse number order."""
    parts = [
        classes["Frame"](**{name: value}).SerializeToString() for name, value in fields.items()
    ]
    return b"".join(reversed(parts))


@pytest.mark.parametrize("packed", [True, False], ids=["packed", "unpacked"])
def test_frames_written_by_protobuf_decode(packed: bool) -> None:
    classes = message_classes(DELTA_V2, packed=packed)
    logprob = classes["Logprob"]
    first = _frame_by_protobuf(
        classes, token_ids=[1, 2**32 - 1, 300], text="hello", has_logprobs=True
    )
    second = _frame_by_protobuf(
        classes,
        seq=1,
        token_ids=[7],
        text_ref=1,
        logprobs=[
            logprob(token="t", logprob=-0.5),
            logprob(
                token_ref=1,
                logprob_mantissa=-125,
                logprob_scale=3,
                top_is_token=True,
                top_refs=[0, 2, 0],
                top_tokens=["u", "v"],
                top_logprobs=[-1.0, -2.0, -3.0],
            ),
        ],
        finish_reason="stop",
        usage=classes["Usage"](prompt_tokens=3, completion_tokens=2),
    )
    unknown = key(15, 0) + varint(99) + field(16, b"future")  # fields a later version may add
    head = classes["Header"](id="r", model="m", created=-5, index=3, base_seq=10)
    stream = (
        header(CODEC.schema_id, head.SerializeToString())
        + frame(first)
        + frame(unknown + second + unknown)
        + end_marker(2)
    )
    base = ic.TokenChunk(id="r", model="m", created=-5, index=3, seq=0, token_ids=(), text="")
    expected = response(
        {"token_ids": (1, 2**32 - 1, 300), "text": "hello", "logprobs": ()},
        {
            "token_ids": (7,),
            "text": "hello",
            "logprobs": (
                lp("t", -0.5),
                lp("hello", -0.125, ("hello", -0.125), ("u", -1.0), ("t", -2.0), ("v", -3.0)),
            ),
            "finish_reason": "stop",
            "usage": ic.Usage(prompt_tokens=3, completion_tokens=2),
        },
        start=10,
        base=base,
    )
    assert_same_chunks(decode_pieces(CODEC, [stream]), expected)


# -- schema evolution: version 1 and version 2 share a registry ---------------------------------


def codecs_sharing(registry: SchemaRegistry) -> tuple[DeltaCodec, DeltaCodec]:
    return DeltaCodec(schema=DELTA_V1, registry=registry), DeltaCodec(
        schema=DELTA_V2, registry=registry
    )


def without_usage(chunks: Iterable[ic.TokenChunk]) -> list[ic.TokenChunk]:
    return [dataclasses.replace(c, usage=None) for c in chunks]


def test_the_default_registry_holds_every_version() -> None:
    registry = delta_codec.default_registry()
    assert registry.versions(delta_codec.SUBJECT) == [1, 2, 3]
    assert registry.version(delta_codec.SUBJECT, 1).schema == DELTA_V1
    assert registry.version(delta_codec.SUBJECT, 2).schema == DELTA_V2
    assert registry.version(delta_codec.SUBJECT).schema == DELTA_V3
    v1, v2 = codecs_sharing(registry)
    v3 = DeltaCodec(registry=registry)
    assert (v1.schema_id, v2.schema_id, v3.schema_id) == (1, 2, 3)
    assert registry.versions(delta_codec.SUBJECT) == [1, 2, 3]  # the codecs added nothing


@pytest.mark.parametrize("workload", ["stream-16", "stream-16-top5", "stream-256-multi"])
def test_each_version_reads_the_other(workload: str) -> None:
    v1, v2 = codecs_sharing(delta_codec.default_registry())
    chunks, _ = workload_stream(workload)
    assert chunks[-1].usage is not None
    # a v1 reader skips what it does not know: the usage
    new_stream = encode_stream(v2, chunks)
    assert new_stream[1:5] == struct.pack(">I", 2)
    assert_same_chunks(decode_pieces(v1, [new_stream]), without_usage(chunks))
    assert_same_chunks(decode_pieces(v1, one_byte_at_a_time(new_stream)), without_usage(chunks))
    # a v2 reader reads v1 streams whole
    old_stream = encode_stream(v1, without_usage(chunks))
    assert old_stream[1:5] == struct.pack(">I", 1)
    assert_same_chunks(decode_pieces(v2, [old_stream]), without_usage(chunks))
    # and each reads its own
    assert_same_chunks(decode_pieces(v2, [new_stream]), chunks)
    assert_same_chunks(decode_pieces(v1, [old_stream]), without_usage(chunks))


def test_unary_messages_cross_versions() -> None:
    v1, v2 = codecs_sharing(delta_codec.default_registry())
    last = SMALL[-1]
    assert v1.decode(v2.encode(last), ic.TokenChunk) == dataclasses.replace(last, usage=None)
    plain = dataclasses.replace(last, usage=None)
    assert v2.decode(v1.encode(plain), ic.TokenChunk) == plain


def test_a_v1_encoder_cannot_carry_usage() -> None:
    v1, _ = codecs_sharing(delta_codec.default_registry())
    with pytest.raises(ic.EncodeError, match="usage"):
        v1.encode(SMALL[-1])
    encoder = v1.stream_encoder()
    for chunk in SMALL[:-1]:
        encoder.encode(chunk)
    with pytest.raises(ic.EncodeError, match="usage"):
        encoder.encode(SMALL[-1])


@pytest.mark.parametrize("mode", list(Compatibility))
def test_every_mode_accepts_v2_after_v1(mode: Compatibility) -> None:
    registry = SchemaRegistry(compatibility=mode)
    v1, v2 = codecs_sharing(registry)
    assert registry.versions(delta_codec.SUBJECT) == [1, 2]
    stream = encode_stream(v2, SMALL)
    assert_same_chunks(decode_pieces(v1, [stream]), without_usage(SMALL))
    assert_same_chunks(
        decode_pieces(v2, [encode_stream(v1, without_usage(SMALL))]), without_usage(SMALL)
    )


# v1 after v2 drops the Usage message and Frame.usage without reserving its number: what a
# reader of the new version still needs (BACKWARD) is gone; an old reader (FORWARD) is fine.
V1_AFTER_V2 = {
    Compatibility.BACKWARD: False,
    Compatibility.BACKWARD_TRANSITIVE: False,
    Compatibility.FULL: False,
    Compatibility.FULL_TRANSITIVE: False,
    Compatibility.FORWARD: True,
    Compatibility.FORWARD_TRANSITIVE: True,
    Compatibility.NONE: True,
}


@pytest.mark.parametrize(("mode", "accepted"), list(V1_AFTER_V2.items()))
def test_v1_after_v2_is_checked_against_the_mode(mode: Compatibility, accepted: bool) -> None:
    registry = SchemaRegistry(compatibility=mode)
    v2 = DeltaCodec(schema=DELTA_V2, registry=registry)
    if not accepted:
        with pytest.raises(IncompatibleSchemaError) as info:
            DeltaCodec(schema=DELTA_V1, registry=registry)
        assert "FIELD_REMOVED_NOT_RESERVED" in str(info.value)
        assert "MESSAGE_REMOVED" in str(info.value)
        assert registry.versions(delta_codec.SUBJECT) == [1]
        return
    v1 = DeltaCodec(schema=DELTA_V1, registry=registry)
    assert (v2.schema_id, v1.schema_id) == (1, 2)
    assert_same_chunks(decode_pieces(v1, [encode_stream(v2, SMALL)]), without_usage(SMALL))


def test_a_writer_schema_the_reader_cannot_read_is_refused() -> None:
    """A stream written with a schema that retyped a field (registered under NONE) is refused
    by the reader, naming the rule, rather than misread."""
    descriptor_set = DELTA_V2.parsed()
    (frame_message,) = [m for m in descriptor_set.file[0].message_type if m.name == "Frame"]
    (token_ids,) = [f for f in frame_message.field if f.name == "token_ids"]
    token_ids.type = token_ids.TYPE_UINT64
    retyped = Schema(descriptor_set.SerializeToString())
    registry = delta_codec.default_registry()
    registry.set_compatibility(delta_codec.SUBJECT, Compatibility.NONE)
    writer = DeltaCodec(schema=retyped, registry=registry)
    assert writer.schema_id == 4
    reader = DeltaCodec(registry=registry)
    with pytest.raises(IncompatibleSchemaError, match="FIELD_TYPE_CHANGED") as info:
        reader.stream_decoder(ic.TokenChunk).feed(encode_stream(writer, SMALL))
    assert info.value.violations


# -- the resolver: unreachable, then back; and the cache in front of it -------------------------


class Switchable:
    """A resolver that can be taken down: what a registry over the network does."""

    def __init__(self, source: SchemaResolver) -> None:
        self.source = source
        self.up = True
        self.asked = 0

    def resolve(self, schema_id: int, /) -> Schema:
        self.asked += 1
        if not self.up:
            raise SchemaRegistryUnavailableError("registry unreachable")
        return self.source.resolve(schema_id)


def _frame_by_frame(stream: bytes) -> list[bytes]:
    parts = split_stream(stream)
    return [parts.header, *parts.frames, parts.end]


FEEDS: dict[str, Callable[[bytes], list[bytes]]] = {
    "all at once": lambda stream: [stream],
    "frame by frame": _frame_by_frame,
    "byte by byte": lambda stream: [bytes(b) for b in one_byte_at_a_time(stream)],
}


@pytest.mark.parametrize("feed", list(FEEDS.values()), ids=list(FEEDS))
def test_an_unreachable_registry_loses_no_bytes(feed: Callable[[bytes], list[bytes]]) -> None:
    registry = delta_codec.default_registry()
    remote = Switchable(registry)
    writer = DeltaCodec(registry=registry)
    reader = DeltaCodec(registry=registry, resolver=remote)
    stream = encode_stream(writer, SMALL)
    remote.up = False
    decoder = reader.stream_decoder(ic.TokenChunk)
    failures = 0
    for piece in feed(stream):
        try:
            assert decoder.feed(piece) == []
        except SchemaRegistryUnavailableError:
            failures += 1
    assert failures >= 1
    assert remote.asked == failures  # once the header was whole, every feed asked again
    assert not decoder.finished
    with pytest.raises(SchemaRegistryUnavailableError):
        decoder.feed(b"")  # still down
    remote.up = True
    assert_same_chunks(decoder.feed(b""), SMALL)
    assert decoder.finished
    decoder.close()


def test_an_unreachable_registry_is_not_cached() -> None:
    remote = Switchable(delta_codec.default_registry())
    resolver = CachingResolver(remote)
    remote.up = False
    for _ in range(3):
        with pytest.raises(SchemaRegistryUnavailableError):
            resolver.resolve(2)
    remote.up = True
    assert resolver.resolve(2) == DELTA_V2
    assert resolver.resolve(2) == DELTA_V2
    assert (resolver.lookups, remote.asked) == (4, 4)


class Counting:
    """A resolver over a dict, counting what it is asked."""

    def __init__(self, schemas: dict[int, Schema] | None = None) -> None:
        self.schemas = dict(schemas or {})
        self.asked: list[int] = []

    def resolve(self, schema_id: int, /) -> Schema:
        self.asked.append(schema_id)
        try:
            return self.schemas[schema_id]
        except KeyError:
            raise ic.UnknownSchemaError(schema_id) from None


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_an_unknown_id_is_looked_up_once_over_many_streams_and_frames() -> None:
    registry = delta_codec.default_registry()
    source = Counting({1: DELTA_V1, 2: DELTA_V2, 3: DELTA_V3})
    resolver = CachingResolver(source)
    codec = DeltaCodec(registry=registry, resolver=resolver)
    parts = split_stream(encode_stream(codec, SMALL))
    stream = header(77, parts.header_body) + b"".join(parts.frames) + parts.end
    for _ in range(20):  # streams
        with pytest.raises(ic.UnknownSchemaError):
            codec.stream_decoder(ic.TokenChunk).feed(stream)
    decoder = codec.stream_decoder(ic.TokenChunk)
    for piece in [header(77, parts.header_body), *parts.frames]:  # frames of one stream
        with pytest.raises(ic.UnknownSchemaError):
            decoder.feed(piece)
    assert source.asked == [77]
    assert resolver.lookups == 1
    # known ids are cached as well
    for _ in range(5):
        assert decode_pieces(codec, [parts.join()]) == SMALL
        assert codec.decode(CODEC.encode(SMALL[0]), ic.TokenChunk) == SMALL[0]
    assert source.asked == [77, 3]


def test_found_schemas_are_cached() -> None:
    source = Counting({1: DELTA_V1, 2: DELTA_V2})
    resolver = CachingResolver(source, clock=Clock())
    for _ in range(10):
        assert resolver.resolve(1) == DELTA_V1
        assert resolver.resolve(2) == DELTA_V2
    assert source.asked == [1, 2]
    assert resolver.lookups == 2


def test_an_unknown_id_is_asked_again_after_its_ttl() -> None:
    clock = Clock()
    source = Counting()
    resolver = CachingResolver(source, negative_ttl_s=30.0, clock=clock)
    with pytest.raises(ic.UnknownSchemaError):
        resolver.resolve(5)
    source.schemas[5] = DELTA_V1  # registered meanwhile: unseen until the entry expires
    clock.now += 29.9
    with pytest.raises(ic.UnknownSchemaError):
        resolver.resolve(5)
    assert source.asked == [5]
    clock.now += 0.1
    assert resolver.resolve(5) == DELTA_V1
    clock.now += 1000.0
    assert resolver.resolve(5) == DELTA_V1  # found ones do not expire
    assert source.asked == [5, 5]


def test_the_negative_cache_is_bounded() -> None:
    source = Counting()
    resolver = CachingResolver(source, max_negative=3, clock=Clock())
    for schema_id in range(100, 110):
        with pytest.raises(ic.UnknownSchemaError):
            resolver.resolve(schema_id)
    assert resolver.lookups == 10
    for schema_id in (107, 108, 109):  # the newest are kept
        with pytest.raises(ic.UnknownSchemaError):
            resolver.resolve(schema_id)
    assert resolver.lookups == 10
    with pytest.raises(ic.UnknownSchemaError):
        resolver.resolve(100)  # the oldest were let go
    assert resolver.lookups == 11


@settings(max_examples=50)
@given(ids=st.lists(st.integers(0, 2**32 - 1), max_size=60), bound=st.integers(1, 8))
def test_a_peer_spraying_ids_costs_at_most_one_lookup_each_while_cached(
    ids: list[int], bound: int
) -> None:
    source = Counting({1: DELTA_V1})
    resolver = CachingResolver(source, max_negative=bound, clock=Clock())
    for schema_id in ids:
        with contextlib.suppress(ic.UnknownSchemaError):
            resolver.resolve(schema_id)
    assert resolver.lookups == len(source.asked) <= len(ids)
    # an id asked twice in a row is looked up once
    assert all(a != b for a, b in zip(source.asked, source.asked[1:], strict=False))
