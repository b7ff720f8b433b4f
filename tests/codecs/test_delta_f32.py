"""The delta codec's wire format 1 (schema version 3): logprobs as float32 values.

Engines compute logprobs in float32. A value a float32 holds exactly travels in 4 bytes; each
value (and each group of alternatives) takes the shortest lossless form of decimal, float32
and double, a tie going to the first, so short decimals keep their encoding. Every property is
checked on the C extension's path and the pure-Python one, which must write the same bytes.

The format's guard: a stream of format 1 starts with magic byte 0x01. Readers before version
3 refuse any other magic than 0x00 (BadMagicError), and a reader schema without the float32
fields refuses it (IncompatibleSchemaError): neither can skip the values and read 0.0.
"""

from __future__ import annotations

import dataclasses
import importlib
import math
import struct
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import pytest
from google.protobuf import descriptor_pool, message_factory
from hypothesis import given, settings
from hypothesis import strategies as st

import inferwire.codecs as ic
from inferwire import workloads
from inferwire.codecs import delta_codec, delta_wire
from inferwire.codecs.delta_codec import DELTA_V1, DELTA_V2, DELTA_V3, DeltaCodec
from inferwire.codecs.errors import IncompatibleSchemaError
from inferwire.codecs.schema_registry import Compatibility, Schema, SchemaRegistry

ACCEL: Any = importlib.import_module("inferwire.codecs._delta_accel")


@pytest.fixture(autouse=True, scope="module")
def _extension_on() -> Iterator[None]:
    """The extension in use even under INFERWIRE_PURE_PYTHON: these tests compare it."""
    ACCEL.configure(
        ic.TokenChunk,
        ic.TokenLogprob,
        ic.TopLogprob,
        ic.Usage,
        delta_codec.MAX_TABLE_ENTRIES,
        delta_codec.MAX_INTERNED_CHARS,
    )
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(delta_codec, "_accel", ACCEL)
        yield


def _pair(schema: Schema) -> tuple[DeltaCodec, DeltaCodec]:
    registry = delta_codec.default_registry()
    return DeltaCodec(schema=schema, registry=registry), DeltaCodec(
        schema=schema, registry=registry, pure_python=True
    )


FAST, PURE = _pair(DELTA_V3)
FAST_V2, PURE_V2 = _pair(DELTA_V2)
READERS = {"fast": FAST, "pure": PURE}


def _f32(value: float) -> float:
    return float(np.float32(value))


def _double(bits: int) -> float:
    value: float = struct.unpack("<d", struct.pack("<Q", bits))[0]
    return value


FLT_MAX = float(np.finfo(np.float32).max)
F32_SUBNORMAL = 2.0**-149  # the smallest float32


def bits(value: float) -> bytes:
    return struct.pack("<d", value)


def comparable(chunk: ic.TokenChunk) -> tuple[Any, ...]:
    """The chunk with each logprob as its bits: NaN equals itself, -0.0 differs from 0.0."""
    assert type(chunk) is ic.TokenChunk
    logprobs = None
    if chunk.logprobs is not None:
        logprobs = [
            (lp.token, bits(lp.logprob), [(t.token, bits(t.logprob)) for t in lp.top])
            for lp in chunk.logprobs
        ]
    return (dataclasses.replace(chunk, logprobs=None), logprobs)


def encode(codec: ic.Codec, chunks: Sequence[ic.TokenChunk]) -> bytes:
    encoder = codec.stream_encoder()
    return b"".join([*(encoder.encode(c) for c in chunks), encoder.end()])


def decode(codec: DeltaCodec, data: bytes) -> list[ic.TokenChunk]:
    decoder = codec.stream_decoder(ic.TokenChunk)
    out = decoder.feed(data)
    decoder.close()
    return out


def encode_both(chunks: Sequence[ic.TokenChunk], *, v2: bool = False) -> bytes:
    """The stream both paths write: the same bytes."""
    fast, pure = (FAST_V2, PURE_V2) if v2 else (FAST, PURE)
    data = encode(fast, chunks)
    assert data == encode(pure, chunks)
    return data


def assert_round_trip(chunks: Sequence[ic.TokenChunk], *, v2: bool = False) -> bytes:
    data = encode_both(chunks, v2=v2)
    for reader in (FAST, PURE):
        assert [comparable(c) for c in decode(reader, data)] == [comparable(c) for c in chunks]
    return data


def read_varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


def varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def frame_bodies(stream: bytes) -> list[bytes]:
    """The Frame messages of a whole stream (the layout of codecs/delta_wire.py)."""
    size, pos = read_varint(stream, 5)
    pos += size
    bodies: list[bytes] = []
    while True:
        length, body = read_varint(stream, pos)
        if length == 0:
            return bodies
        bodies.append(stream[body : body + length - 1])
        pos = body + length - 1


def _message_classes(schema: Schema) -> dict[str, Any]:
    pool = descriptor_pool.DescriptorPool()
    for file in schema.parsed().file:
        pool.Add(file)
    return {
        name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"inferwire.delta.{name}"))
        for name in ("Header", "Frame", "Logprob", "Usage")
    }


PB = _message_classes(DELTA_V3)
BASE = ic.TokenChunk(id="r", model="m", created=0, index=0, seq=0, token_ids=(1,), text="t")


def chunk_with(value: float, *top: float, token: str = "") -> ic.TokenChunk:
    lp = ic.TokenLogprob(
        token=token, logprob=value, top=tuple(ic.TopLogprob(token="a", logprob=v) for v in top)
    )
    return dataclasses.replace(BASE, logprobs=(lp,))


def logprob_message(data: bytes) -> Any:
    (body,) = frame_bodies(data)
    (logprob,) = PB["Frame"].FromString(body).logprobs
    return logprob


# -- which values are float32 -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "exact"),
    [
        (-0.0, True),
        (0.0, True),
        (math.inf, True),
        (-math.inf, True),
        (math.nan, False),  # a NaN keeps its payload only as a double
        (_double(0x7FF8000000000000), False),
        (F32_SUBNORMAL, True),
        (-3 * F32_SUBNORMAL, True),
        (F32_SUBNORMAL / 2, False),  # a double subnormal below any float32
        (5e-324, False),
        (FLT_MAX, True),
        (-FLT_MAX, True),
        (FLT_MAX * (1 + 2**-40), False),  # rounds to FLT_MAX, which is another value
        (1e39, False),  # past the largest float32
        (0.1, False),
        (_f32(0.1), True),
        (-0.3644542694091797, True),
        (-0.25, True),
        (-1 / 3, False),
    ],
)
def test_a_value_is_float32_when_one_holds_it_exactly(value: float, exact: bool) -> None:
    packed = delta_wire.to_float32(value)
    assert (packed is not None) is exact
    if packed is not None:
        assert bits(struct.unpack("<f", packed)[0]) == bits(value)
    # and both paths write (and read back) the same
    assert_round_trip([chunk_with(value, value, value)])


# -- the shortest lossless form ---------------------------------------------------------------

DECIMAL, FLOAT32, DOUBLE = 0x40, 0x65, 0x19


@pytest.mark.parametrize(
    ("value", "form", "form_v2"),
    [
        (-0.25, DECIMAL, DECIMAL),  # 4 bytes as a decimal
        (-1.25, DECIMAL, DECIMAL),  # 5 and 5: a tie keeps the decimal
        (-0.0025, DECIMAL, DECIMAL),
        (-2.5e-05, DOUBLE, DOUBLE),  # exponent notation: no decimal, and no float32
        (-0.10000000149011612, FLOAT32, DOUBLE),  # float32(-0.1): 17 digits, no decimal
        (-0.3644542694091797, FLOAT32, DECIMAL),  # 11 bytes as a decimal, 5 as a float32
        (-5.33782958984375, FLOAT32, DECIMAL),
        (-123.456, DECIMAL, DECIMAL),  # no float32: a 6-byte decimal
        (-0.1234567890123456, DOUBLE, DECIMAL),  # no float32; an 11-byte decimal, 9 double
        (-0.12345678901234568, DOUBLE, DOUBLE),
        (-0.0, FLOAT32, DOUBLE),  # zero has no decimal (its sign)
        (math.inf, FLOAT32, DOUBLE),
        (math.nan, DOUBLE, DOUBLE),
        (F32_SUBNORMAL, FLOAT32, DOUBLE),
    ],
)
def test_each_logprob_takes_the_shortest_lossless_form(
    value: float, form: int, form_v2: int
) -> None:
    chunk = dataclasses.replace(chunk_with(value), token_ids=(), text="")
    for v2, expected in ((False, form), (True, form_v2)):
        data = assert_round_trip([chunk], v2=v2)
        (body,) = frame_bodies(data)
        if v2:  # format 0 flags the logprobs
            assert body[:2] == b"\x28\x01"
            body = body[2:]
        assert body[:2] == bytes((0x32, len(body) - 2))
        logprob_body = body[2:]  # no token: the value is the only field
        assert logprob_body[0] == expected, (value, v2)
        size = {DECIMAL: len(logprob_body), FLOAT32: 5, DOUBLE: 9}[expected]
        assert len(logprob_body) == size
    message = logprob_message(encode_both([chunk]))
    if form == FLOAT32:
        assert message.HasField("logprob_f32")
        assert bits(message.logprob_f32) == bits(value)


TOP_DECIMALS, TOP_FLOAT32, TOP_DOUBLES = 0x52, 0x6A, 0x3A


@pytest.mark.parametrize(
    ("top", "form", "form_v2"),
    [
        ((-0.5, -1.25, -3.0), TOP_DECIMALS, TOP_DECIMALS),
        ((-2.973393440246582, -3.5910892486572266, -7.799610137939453), TOP_FLOAT32, TOP_DOUBLES),
        # one value of 17 digits: no shared scale, so doubles, or float32s where they hold it
        ((-0.5, -0.10000000149011612), TOP_FLOAT32, TOP_DOUBLES),
        # 16 digits: decimals of 8 bytes each at a shared scale (20 bytes), float32s (10)
        ((-0.5, -0.3644542694091797), TOP_FLOAT32, TOP_DECIMALS),
        # all float32 and short decimals: 2 + 1 + 1 + 2 bytes beat 2 + 8
        ((-0.5, -0.25), TOP_DECIMALS, TOP_DECIMALS),
        # one value no float32 holds: decimals (19 bytes) or doubles (18), the shorter
        ((-2.973393440246582, -0.1), TOP_DOUBLES, TOP_DECIMALS),
        ((-0.0, math.inf, -math.inf), TOP_FLOAT32, TOP_DOUBLES),
        ((math.nan, -1.0), TOP_DOUBLES, TOP_DOUBLES),
    ],
)
def test_the_alternatives_take_the_shortest_lossless_form_as_a_group(
    top: tuple[float, ...], form: int, form_v2: int
) -> None:
    names = {TOP_DECIMALS: "top_mantissas", TOP_FLOAT32: "top_f32", TOP_DOUBLES: "top_logprobs"}
    for v2, expected in ((False, form), (True, form_v2)):
        data = assert_round_trip([chunk_with(-9.0, *top)], v2=v2)
        fields = {f.name for f, _ in logprob_message(data).ListFields()}
        assert fields & set(names.values()) == {names[expected]}, (top, v2)


# -- round trips, bit for bit ------------------------------------------------------------------

SPECIAL = [
    -0.0,
    0.0,
    math.inf,
    -math.inf,
    math.nan,
    -math.nan,
    _double(0x7FF0000000000001),  # a signalling NaN: its payload survives as a double
    _double(0x7FF8000000000001),
    _double(0xFFF8000000000000),
    F32_SUBNORMAL,
    -F32_SUBNORMAL,
    5e-324,
    FLT_MAX,
    -FLT_MAX,
    1.7976931348623157e308,
    -9999.0,  # vLLM's stand-in for -inf
]
values = (
    st.floats(width=32)
    | st.floats(width=32, allow_nan=False).map(lambda v: -abs(v))
    | st.floats()
    | st.builds(lambda m, s: m / 10**s, st.integers(-(10**12), 10**12), st.integers(0, 22))
    | st.sampled_from(SPECIAL)
)
tokens = st.sampled_from(["", "a", " the", "東", "x" * 33])


@st.composite
def logprob_chunks(draw: st.DrawFn) -> list[ic.TokenChunk]:
    chunks = []
    for seq in range(draw(st.integers(1, 4))):
        logprobs = []
        for _ in range(draw(st.integers(0, 3))):
            token, value = draw(tokens), draw(values)
            top = [
                ic.TopLogprob(token=draw(tokens), logprob=draw(values))
                for _ in range(draw(st.integers(0, 6)))
            ]
            if draw(st.booleans()):
                top.insert(0, ic.TopLogprob(token=token, logprob=value))
            logprobs.append(ic.TokenLogprob(token=token, logprob=value, top=tuple(top)))
        chunks.append(
            dataclasses.replace(
                BASE,
                seq=seq,
                token_ids=tuple(draw(st.lists(st.integers(0, 2**32 - 1), max_size=3))),
                # none asked for, or an empty list (which format 1 still flags)
                logprobs=tuple(logprobs) or draw(st.sampled_from([(), None])),
            )
        )
    return chunks


@settings(max_examples=300)
@given(chunks=logprob_chunks())
def test_any_logprobs_round_trip_bit_for_bit_with_the_same_bytes(
    chunks: list[ic.TokenChunk],
) -> None:
    assert_round_trip(chunks)
    assert_round_trip(chunks, v2=True)  # format 0 reads back exactly too


@pytest.mark.parametrize("workload", ["stream-256-top5-f32", "stream-256-top5", "stream-256-multi"])
def test_the_workloads_round_trip_bit_for_bit(workload: str) -> None:
    chunks = [c for c in workloads.get(workload).messages() if isinstance(c, ic.TokenChunk)]
    assert_round_trip(chunks)
    assert_round_trip(chunks, v2=True)


def test_every_float32_logprob_of_the_workload_travels_in_4_bytes() -> None:
    chunks = [
        c for c in workloads.get("stream-256-top5-f32").messages() if isinstance(c, ic.TokenChunk)
    ]
    data = encode_both(chunks)
    messages = [lp for body in frame_bodies(data) for lp in PB["Frame"].FromString(body).logprobs]
    assert len(messages) == 256
    for message, chunk in zip(messages, chunks, strict=True):
        assert chunk.logprobs is not None
        (lp,) = chunk.logprobs
        if message.HasField("logprob_f32"):
            assert message.logprob_f32 == lp.logprob
        else:  # a short decimal, no longer than a float32
            assert 0 < abs(message.logprob_mantissa) < 2**13
        assert message.top_is_token
        assert list(message.top_f32) == [t.logprob for t in lp.top[1:]]
    # 4 + 4 * 4 bytes a token less than doubles: format 0 of the same stream
    assert len(encode_both(chunks, v2=True)) - len(data) >= 20 * 256


# -- versions: old streams, old readers ----------------------------------------------------------


def _lp(token: str, value: float, *top: tuple[str, float]) -> ic.TokenLogprob:
    return ic.TokenLogprob(
        token=token, logprob=value, top=tuple(ic.TopLogprob(token=t, logprob=v) for t, v in top)
    )


_PREVIOUS = ic.TokenChunk(
    id="chatcmpl-7", model="m-1", created=1_732_924_800, index=0, seq=0, token_ids=(), text=""
)
PREVIOUS_CHUNKS = [
    dataclasses.replace(
        _PREVIOUS,
        seq=0,
        token_ids=(42,),
        text=" the",
        logprobs=(_lp(" the", -0.25, (" the", -0.25), (" a", -1.5)),),
    ),
    dataclasses.replace(
        _PREVIOUS,
        seq=1,
        token_ids=(70000,),
        text=" café",
        logprobs=(
            _lp(
                " café",
                -0.3644542694091797,
                (" café", -0.3644542694091797),
                (" the", -2.973393440246582),
                ("東", -3.5910892486572266),
            ),
        ),
    ),
    dataclasses.replace(_PREVIOUS, seq=2, token_ids=(7, 8), text=" the", logprobs=()),
    dataclasses.replace(
        _PREVIOUS,
        seq=3,
        token_ids=(),
        text="",
        finish_reason="stop",
        usage=ic.Usage(prompt_tokens=12, completion_tokens=4),
    ),
]
# PREVIOUS_CHUNKS as the release before schema version 3 wrote them (schema id 2)
PREVIOUS_STREAM = bytes.fromhex(
    "00000000021b0a0a63686174636d706c2d3712036d2d311880aba9ba06200028002212012a220420746865"
    "2801321408014031480220012a01003202206152011d58013e08011203f0a204220620636166c3a92801322a"
    "080340a9b0b38aa7acf90c481020012a0201003203e69db13a100000008082c907c0000000008dba0cc00b08"
    "0212020708180128010f08033a0473746f704204080c10040004"
)


def test_a_stream_of_the_previous_release_still_decodes() -> None:
    expected = [comparable(c) for c in PREVIOUS_CHUNKS]
    for reader in (FAST, PURE, FAST_V2, PURE_V2):
        assert [comparable(c) for c in decode(reader, PREVIOUS_STREAM)] == expected
    # and a version 2 writer still writes exactly those bytes, for readers before version 3
    assert encode_both(PREVIOUS_CHUNKS, v2=True) == PREVIOUS_STREAM


def test_format_1_is_flagged_in_the_first_byte() -> None:
    data = encode_both(PREVIOUS_CHUNKS)
    assert data[0] == delta_wire.MAGIC_FLOAT32 == 0x01
    assert struct.unpack(">I", data[1:5]) == (FAST.schema_id,) == (3,)
    assert encode_both(PREVIOUS_CHUNKS, v2=True)[0] == delta_wire.MAGIC == 0x00
    # the unary form too
    assert FAST.encode(PREVIOUS_CHUNKS[1])[0] == PURE.encode(PREVIOUS_CHUNKS[1])[0] == 0x01


@pytest.mark.parametrize("schema", [DELTA_V2, DELTA_V1], ids=["v2", "v1"])
@pytest.mark.parametrize("pure_python", [False, True], ids=["fast", "pure"])
def test_a_reader_without_the_float32_fields_refuses_format_1(
    schema: Schema, pure_python: bool
) -> None:
    """It would skip the float32 fields and read every logprob as 0.0."""
    reader = DeltaCodec(schema=schema, pure_python=pure_python)
    data = encode_both(PREVIOUS_CHUNKS)
    for piece in (data, data[:1]):
        with pytest.raises(IncompatibleSchemaError, match="float32"):
            reader.stream_decoder(ic.TokenChunk).feed(piece)
    with pytest.raises(IncompatibleSchemaError):
        reader.decode(FAST.encode(PREVIOUS_CHUNKS[1]), ic.TokenChunk)


@pytest.mark.parametrize("mode", list(Compatibility))
def test_every_mode_accepts_v3_after_v2_and_v3_reads_both(mode: Compatibility) -> None:
    registry = SchemaRegistry(compatibility=mode)
    v1, v2, v3 = (DeltaCodec(schema=s, registry=registry) for s in (DELTA_V1, DELTA_V2, DELTA_V3))
    assert registry.versions(delta_codec.SUBJECT) == [1, 2, 3]
    chunks = [c for c in workloads.get("stream-16-top5").messages() if isinstance(c, ic.TokenChunk)]
    plain = [dataclasses.replace(c, usage=None) for c in chunks]
    for writer, sent in ((v1, plain), (v2, chunks), (v3, chunks)):
        data = encode(writer, sent)
        assert [comparable(c) for c in decode(v3, data)] == [comparable(c) for c in sent]


def _stream(magic: int, *bodies: bytes) -> bytes:
    head = bytes((magic,)) + struct.pack(">I", FAST.schema_id) + b"\x00"
    frames = b"".join(varint(len(body) + 1) + body for body in bodies)
    return head + frames + b"\x00" + varint(len(bodies))


def _outcome(reader: DeltaCodec, data: bytes) -> Any:
    """The chunks of a whole stream, or the package's error (nothing else may escape)."""
    try:
        return [comparable(c) for c in decode(reader, data)]
    except (ic.DecodeError, IncompatibleSchemaError) as exc:
        return type(exc), str(exc)


def test_the_float32_fields_are_read_only_in_format_1() -> None:
    """In a format-0 stream they are unknown fields, skipped as a reader before version 3
    skips them: the magic byte is what makes them count."""
    logprob = b"\x65" + struct.pack("<f", -1.5)
    body = b"\x10\x01\x32" + varint(len(logprob)) + logprob
    read = {magic: _outcome(FAST, _stream(magic, body)) for magic in (0, 1)}
    assert read == {magic: _outcome(PURE, _stream(magic, body)) for magic in (0, 1)}
    (skipped,), (kept,) = read[0], read[1]
    assert skipped[1] == [("", bits(0.0), [])]
    assert kept[1] == [("", bits(-1.5), [])]


# -- bad input: the package's errors, the same on both paths -----------------------------------


def _logprob_frame(logprob: bytes) -> bytes:
    return _stream(1, b"\x32" + varint(len(logprob)) + logprob)


F32 = struct.pack("<f", -2.5)
ONE_TOP = b"\x2a\x01\x00\x32\x01y"  # one alternative, "y", sent literally
TWO_TOP = b"\x2a\x02\x00\x00\x32\x01y\x32\x01z"


@pytest.mark.parametrize(
    "logprob",
    [
        b"\x65" + F32[:3],  # cut
        b"\x65",
        ONE_TOP + b"\x6a\x03" + F32[:3],  # packed, not a multiple of 4
        ONE_TOP + b"\x6a\x05" + F32,  # overruns the Logprob
        ONE_TOP + b"\x6d" + F32[:2],  # unpacked, cut
        TWO_TOP + b"\x6a\x04" + F32,  # two alternatives, one value
        ONE_TOP + b"\x6a\x08" + F32 + F32,  # one alternative, two values
        b"\x65" + F32 + b"\x40\x05\x48\x01",  # the logprob twice: float32 and decimal
        b"\x19" + bytes(8) + b"\x65" + F32,  # float32 and double
        ONE_TOP + b"\x6a\x04" + F32 + b"\x3a\x08" + bytes(8),  # top float32 and doubles
        ONE_TOP + b"\x52\x01\x05\x58\x01\x6d" + F32,  # top decimal and float32
    ],
)
def test_bad_float32_fields_are_decode_errors(logprob: bytes) -> None:
    data = _logprob_frame(logprob)
    for reader in (FAST, PURE):
        with pytest.raises(ic.DecodeError):
            decode(reader, data)
    assert _outcome(FAST, data) == _outcome(PURE, data)


def test_float32_fields_written_by_protobuf_decode() -> None:
    """Any protobuf writer's Logprob, float32 values packed or not, reads the same."""
    chunks = []
    for packed in (True, False):
        message = PB["Logprob"](token="x", logprob_f32=-2.5, top_refs=[0, 0], top_tokens=["y", "z"])
        message.top_f32.extend([-3.25, -0.1])
        raw = message.SerializeToString()
        if not packed:  # the repeated float one element a field, as proto2 writers send it
            packed_field = b"\x6a\x08" + struct.pack("<2f", -3.25, -0.1)
            assert packed_field in raw
            raw = raw.replace(packed_field, b"\x6d" + struct.pack("<f", -3.25) + b"\x6d")
            raw += struct.pack("<f", -0.1)
        chunks.append(raw)
    for raw in chunks:
        data = _logprob_frame(raw)
        (chunk,) = decode(FAST, data)
        assert comparable(chunk) == comparable(decode(PURE, data)[0])
        assert chunk.logprobs is not None
        (lp,) = chunk.logprobs
        assert (lp.token, lp.logprob) == ("x", -2.5)
        assert [(t.token, bits(t.logprob)) for t in lp.top] == [
            ("y", bits(-3.25)),
            ("z", bits(_f32(-0.1))),
        ]


def test_every_prefix_and_corruption_of_a_float32_stream_is_a_decode_error() -> None:
    chunks = [
        chunk_with(-0.3644542694091797, -2.973393440246582, -3.5910892486572266, token="a"),
        dataclasses.replace(chunk_with(-0.25, -5.0), seq=1),
    ]
    data = encode_both(chunks)
    first = logprob_message(encode_both(chunks[:1]))
    assert first.HasField("logprob_f32")
    assert len(first.top_f32) == 2
    for end in range(len(data)):
        for reader in (FAST, PURE):
            decoder = reader.stream_decoder(ic.TokenChunk)
            decoder.feed(data[:end])
            with pytest.raises(ic.IncompleteStreamError):
                decoder.close()
    for pos in range(len(data)):
        for mask in (0x01, 0x04, 0x80, 0xFF):
            corrupt = bytearray(data)
            corrupt[pos] ^= mask
            assert _outcome(FAST, bytes(corrupt)) == _outcome(PURE, bytes(corrupt))


# -- the extension takes the steady state of both formats itself ---------------------------------


@pytest.mark.parametrize("workload", ["stream-256-top5-f32", "stream-256-top5", "stream-256-multi"])
@pytest.mark.parametrize("float32", [True, False], ids=["format-1", "format-0"])
def test_the_extension_writes_and_reads_every_frame_of_a_workload(
    workload: str, float32: bool
) -> None:
    """No frame is handed back to the Python path: the compiled path is what is measured."""
    chunks = [c for c in workloads.get(workload).messages() if isinstance(c, ic.TokenChunk)]
    base = (chunks[0].id, chunks[0].model, chunks[0].created, chunks[0].index)
    index: dict[str, int] = {}
    strings: list[str] = []
    frames = []
    for offset, chunk in enumerate(chunks):
        frame = ACCEL.encode_frame(chunk, base, chunk.seq, offset, index, strings, True, float32)
        assert frame is not None, offset
        frames.append(frame)
    reference = encode_both(chunks, v2=not float32)
    data = b"".join(frames)
    assert reference.endswith(data + b"\x00" + varint(len(chunks)))
    out: list[ic.TokenChunk] = []
    header = (*base, chunks[0].seq)
    stop = ACCEL.decode_frames(data, 0, header, [], 0, True, float32, 2**20, out)
    assert stop == len(data)
    assert [comparable(c) for c in out] == [comparable(c) for c in chunks]
