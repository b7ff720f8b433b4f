"""The protobuf codec's compiled marshalling (codecs/_protobuf_accel.c) against its reference,
the codec's path through upb's messages (``ProtobufCodec(marshal="upb")``).

Every property is differential. For every chunk of every token-stream workload and for fuzzed
chunks (unicode and empty strings, the ends of every integer range, NaN payloads, -0.0,
logprobs absent and empty, finish_reason absent and empty, usage zero), the compiled bytes are
upb's byte for byte and the compiled decode is upb's. Values the extension does not take are
handed back (``None``) and the codec gives exactly what the upb path gives: the same bytes, or
the same error. For hostile input (every truncation, single-byte damage, random bytes,
encodings upb reads but does not write: fields unpacked, out of order, repeated or unknown),
the codec's result, a chunk or an error's type and message, is the upb path's; where the input
is not upb's canonical encoding, the extension hands it back. It never raises on bad input,
never crashes, keeps no memory, and writes the same bytes under ``-X dev``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import importlib
import itertools
import os
import random
import struct
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import inferwire.codecs as ic
from inferwire import workloads
from inferwire.codecs import protobuf_codec as pc
from inferwire.codecs.base import DEFAULT_MAX_ELEMENTS
from inferwire.codecs.errors import ElementBudgetError
from inferwire.codecs.model import TokenChunk, TokenLogprob, TopLogprob, Usage
from inferwire.codecs.pbwire import I32, I64, LEN, VARINT, key, length_delimited, varint
from inferwire.codecs.protobuf_codec import ProtobufCodec
from tests.codecs.accel_helpers import (
    CHUNK_CLASSES_IT_CANNOT_FILL,
    assert_nothing_kept,
    assert_same_under_dev_mode,
)

ACCEL: Any = importlib.import_module("inferwire.codecs._protobuf_accel")
BUDGET = DEFAULT_MAX_ELEMENTS


def configure() -> None:
    """Bind the extension to the model, as the codec does at import."""
    ACCEL.configure(TokenChunk, TokenLogprob, TopLogprob, Usage)


@pytest.fixture(autouse=True, scope="module")
def _extension_on() -> Iterator[None]:
    """The extension in use even under INFERWIRE_PURE_PYTHON: these tests compare it."""
    configure()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(pc, "_accel", ACCEL)
        yield


def fast_codec(**options: Any) -> ProtobufCodec:
    return ProtobufCodec(marshal="compiled", **options)


UPB = ProtobufCodec(marshal="upb")


def canonical(value: Any) -> Any:
    """A model object as nested tuples that compare floats by their bits (NaN == NaN, -0.0 !=
    0.0) and keep each value's type: what "decodes equal" means here."""
    if isinstance(value, float):
        return ("float", struct.pack("<d", value))
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return (
            type(value).__name__,
            *(canonical(getattr(value, f.name)) for f in dataclasses.fields(value)),
        )
    if isinstance(value, tuple | list):
        return (type(value).__name__, *(canonical(v) for v in value))
    return (type(value).__name__, value)


def outcome(call: Any, *args: Any) -> tuple[Any, ...]:
    """What ``call(*args)`` gives: its value (bytes, or a chunk made canonical) or the type
    and message of what it raised."""
    try:
        result = call(*args)
    except Exception as exc:  # the comparison is of any error, whatever its type
        return ("raised", type(exc), str(exc))
    return ("returned", result if isinstance(result, bytes) else canonical(result))


def decoded_by(codec: ProtobufCodec, data: Any) -> tuple[Any, ...]:
    return outcome(codec.decode, data, TokenChunk)


def check_taken(chunk: Any) -> bytes:
    """The compiled bytes of ``chunk``, which the extension must take: upb's bytes, decoding
    (compiled, taken too) to upb's decode and to the chunk itself."""
    fast = ACCEL.encode_chunk(chunk)
    reference = pc.chunk_to_pb(chunk).SerializeToString()
    assert fast is not None, "the extension handed back a chunk it should take"
    assert type(fast) is bytes
    assert fast == reference  # byte for byte
    assert fast_codec().encode(chunk) == reference
    back = ACCEL.decode_chunk(fast, BUDGET)
    assert back is not None, "the extension handed back upb's own encoding"
    assert type(back) is TokenChunk
    expected = UPB.decode(reference, TokenChunk)
    assert canonical(back) == canonical(expected) == canonical(_as_model(chunk))
    return fast


def _as_model(chunk: TokenChunk) -> TokenChunk:
    """``chunk`` as a decoder gives it back: tuples where it may hold lists."""
    logprobs = chunk.logprobs
    if logprobs is not None:
        logprobs = tuple(dataclasses.replace(lp, top=tuple(lp.top)) for lp in logprobs)
    return dataclasses.replace(chunk, token_ids=tuple(chunk.token_ids), logprobs=logprobs)


def _chunk(**fields: Any) -> TokenChunk:
    base: dict[str, Any] = {
        "id": "chatcmpl-1",
        "model": "m",
        "created": 1_700_000_000,
        "index": 0,
        "seq": 3,
        "token_ids": (42,),
        "text": " to",
    }
    return TokenChunk(**{**base, **fields})


# -- the extension is there and chosen ----------------------------------------------------


def test_the_extension_is_built_and_used_by_default() -> None:
    """CI runs the tests on a fresh install: this proves the extension was compiled."""
    assert ACCEL.API_VERSION == pc._ACCEL_API_VERSION
    assert ACCEL.__file__.endswith((".so", ".pyd"))
    if os.environ.get("INFERWIRE_PURE_PYTHON", "") in ("", "0"):
        assert pc._load_accelerator() is ACCEL
        assert pc.accelerated()
        assert ProtobufCodec().marshal == "compiled"
    assert fast_codec()._encode_chunk is ACCEL.encode_chunk
    assert fast_codec()._decode_chunk is ACCEL.decode_chunk
    assert UPB._encode_chunk is None
    assert UPB._decode_chunk is None
    by_name = ic.get("protobuf", marshal="upb")
    assert isinstance(by_name, ProtobufCodec)
    assert by_name.marshal == "upb"


def test_a_marshal_is_named_or_refused() -> None:
    with pytest.raises(ValueError, match="marshal must be one of"):
        ProtobufCodec(marshal="python")  # type: ignore[arg-type]


def test_without_the_extension_compiled_is_refused_and_the_default_is_upb(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(pc, "_accel", None)
    assert ProtobufCodec().marshal == "upb"
    with pytest.raises(ValueError, match="not built"):
        ProtobufCodec(marshal="compiled")


@pytest.mark.parametrize(
    "classes", [*CHUNK_CLASSES_IT_CANNOT_FILL, (TokenChunk, TokenLogprob, TopLogprob)]
)
def test_configure_refuses_classes_it_cannot_fill(classes: tuple[Any, ...]) -> None:
    with pytest.raises((TypeError, AttributeError)):
        ACCEL.configure(*classes)
    # and the module is unusable until configured again, not half-bound
    with pytest.raises(RuntimeError):
        ACCEL.encode_chunk(_chunk())
    with pytest.raises(RuntimeError):
        ACCEL.decode_chunk(b"", BUDGET)
    configure()
    assert ACCEL.encode_chunk(_chunk()) == UPB.encode(_chunk())


# -- every workload ------------------------------------------------------------------------


@pytest.mark.parametrize("workload", workloads.names(kind="stream"))
def test_every_workload_chunk_is_upbs_bytes_and_decodes_as_upb_does(workload: str) -> None:
    for chunk in workloads.get(workload).messages():
        check_taken(chunk)


@pytest.mark.parametrize("workload", workloads.names(kind="stream"))
def test_a_stream_and_a_message_stream_are_the_same(workload: str) -> None:
    messages = workloads.get(workload).messages()
    fast = fast_codec()
    for make in ("stream_encoder", "message_encoder"):
        encoders = [getattr(codec, make)() for codec in (fast, UPB)]
        out = [[e.encode(m) for m in messages] + [e.end()] for e in encoders]
        assert out[0] == out[1], make
    stream = UPB.stream_encoder()
    inputs = {
        "stream_decoder": [stream.encode(m) for m in messages] + [stream.end()],
        "message_decoder": [UPB.encode(m) for m in messages],
    }
    for make, frames in inputs.items():
        decoded = []
        for codec in (fast, UPB):
            decoder = getattr(codec, make)(TokenChunk)
            got = [c for frame in frames for c in decoder.feed(frame)]
            decoder.close()
            decoded.append(got)
        assert decoded[0] == decoded[1] == messages, make


def test_the_message_stream_mixes_both_paths_to_the_same_bytes() -> None:
    """A chunk handed back in the middle of a stream takes upb's head-and-body path."""
    messages = workloads.get("stream-16-top5").messages()
    odd = dataclasses.replace(messages[5], text=None)  # type: ignore[arg-type]  # upb: unset
    mixed = [*messages[:5], odd, *messages[6:]]
    assert ACCEL.encode_chunk(odd) is None
    encoders = [fast_codec().message_encoder(), UPB.message_encoder()]
    out = [[e.encode(m) for m in mixed] for e in encoders]
    assert out[0] == out[1]
    assert encoders[0].count == encoders[1].count == len(mixed)  # type: ignore[attr-defined]


# -- fuzzed chunks -------------------------------------------------------------------------

u32s = st.integers(0, 2**32 - 1)
texts = st.text(max_size=12)  # hypothesis leaves out lone surrogates: those are bad values
floats = st.floats(allow_nan=True, allow_infinity=True) | st.sampled_from([0.0, -0.0])
sequences = st.sampled_from([tuple, list])
tops = st.builds(TopLogprob, token=texts, logprob=floats)
logprob_entries = st.builds(
    TokenLogprob,
    token=texts,
    logprob=floats,
    top=st.tuples(sequences, st.lists(tops, max_size=6)).map(lambda p: p[0](p[1])),
)
chunks = st.builds(
    TokenChunk,
    id=texts,
    model=texts,
    created=st.integers(-(2**63), 2**63 - 1),
    index=u32s,
    seq=st.integers(0, 2**64 - 1),
    token_ids=st.tuples(sequences, st.lists(u32s, max_size=40)).map(lambda p: p[0](p[1])),
    text=st.text(),
    logprobs=st.none()
    | st.tuples(sequences, st.lists(logprob_entries, max_size=5)).map(lambda p: p[0](p[1])),
    finish_reason=st.none() | texts,
    usage=st.none() | st.builds(Usage, prompt_tokens=u32s, completion_tokens=u32s),
)


@settings(max_examples=400)
@given(chunk=chunks)
def test_any_chunk_is_upbs_bytes_and_decodes_as_upb_does(chunk: TokenChunk) -> None:
    check_taken(chunk)


def _nan(bits: int) -> float:
    value: float = struct.unpack("<d", struct.pack("<Q", bits))[0]
    return value


NAMES = "\u4f60\u597d \U0001d11e \U0001f600 caf\u00e9 \x00 \uffff"
EDGES: dict[str, TokenChunk] = {
    "all-defaults": TokenChunk(id="", model="", created=0, index=0, seq=0, token_ids=(), text=""),
    "largest": _chunk(created=2**63 - 1, index=2**32 - 1, seq=2**64 - 1, token_ids=(2**32 - 1, 0)),
    "smallest-created": _chunk(created=-(2**63)),
    "created-minus-one": _chunk(created=-1),
    "varint-widths": _chunk(token_ids=(0, 127, 128, 16383, 16384, 2**21, 2**28, 2**31)),
    "non-ascii-and-astral": _chunk(id=NAMES, model=NAMES, text=NAMES, finish_reason=NAMES),
    "logprobs-empty": _chunk(logprobs=()),
    "logprobs-none": _chunk(logprobs=None),
    "top-empty": _chunk(logprobs=(TokenLogprob(token="a", logprob=-1.0, top=()),)),
    "entries-all-defaults": _chunk(
        logprobs=(TokenLogprob(token="", logprob=0.0, top=(TopLogprob(token="", logprob=0.0),)),)
    ),
    "special-floats": _chunk(
        logprobs=tuple(
            TokenLogprob(token="t", logprob=v, top=(TopLogprob(token="u", logprob=v),))
            for v in (
                -0.0,
                float("inf"),
                float("-inf"),
                5e-324,
                _nan(0x7FF8000000000000),
                _nan(0x7FF4000000000001),  # signalling, with a payload
                _nan(0xFFF8000000000123),  # negative, with a payload
            )
        )
    ),
    "finish-empty": _chunk(finish_reason=""),
    "finish-none": _chunk(finish_reason=None),
    "usage-zero": _chunk(usage=Usage(prompt_tokens=0, completion_tokens=0)),
    "usage-largest": _chunk(usage=Usage(prompt_tokens=2**32 - 1, completion_tokens=2**32 - 1)),
    "lists": _chunk(
        token_ids=[1, 2, 3],
        logprobs=[TokenLogprob(token="a", logprob=-1.0, top=[TopLogprob(token="b", logprob=-2.0)])],  # type: ignore[arg-type]
    ),
    # lengths of two and three varint bytes, and past the extension's stack buffer
    "long-text": _chunk(text="x" * 200),
    "longer-text": _chunk(text="\u00e9" * 20000),
    "many-logprobs": _chunk(
        token_ids=tuple(range(300)),
        logprobs=tuple(
            TokenLogprob(
                token="t" * (i % 9),
                logprob=-i / 7,
                top=tuple(TopLogprob(token="u" * j, logprob=-j / 3) for j in range(i % 20)),
            )
            for i in range(300)
        ),
    ),
}


@pytest.mark.parametrize("name", EDGES)
def test_values_at_the_edges_are_upbs_bytes(name: str) -> None:
    check_taken(EDGES[name])


def test_nan_payloads_and_negative_zero_keep_their_bits() -> None:
    chunk = EDGES["special-floats"]
    back = fast_codec().decode(fast_codec().encode(chunk), TokenChunk)
    assert back.logprobs is not None
    assert chunk.logprobs is not None
    for sent, got in zip(chunk.logprobs, back.logprobs, strict=True):
        assert struct.pack("<d", got.logprob) == struct.pack("<d", sent.logprob)
        assert struct.pack("<d", got.top[0].logprob) == struct.pack("<d", sent.top[0].logprob)


def test_finish_reason_and_logprobs_keep_absent_apart_from_empty() -> None:
    codec = fast_codec()
    for field, values in (("finish_reason", (None, "")), ("logprobs", (None, ()))):
        for value in values:
            back = codec.decode(codec.encode(_chunk(**{field: value})), TokenChunk)
            assert getattr(back, field) == value
            assert type(getattr(back, field)) is type(value)


# -- what the extension does not take ------------------------------------------------------


class SubChunk(TokenChunk):
    __slots__ = ()


class SubLogprob(TokenLogprob):
    __slots__ = ()


class Text(str):
    __slots__ = ()


class Number(int):
    pass


HANDED_BACK: dict[str, Any] = {
    "subclass": SubChunk(
        **{f.name: getattr(_chunk(), f.name) for f in dataclasses.fields(_chunk())}
    ),
    "str-subclass": _chunk(text=Text("x")),
    "int-subclass": _chunk(seq=Number(3)),
    "bool-seq": _chunk(seq=True),
    "bytes-id": _chunk(id=b"raw"),
    "invalid-utf8-bytes": _chunk(id=b"\xff"),
    "text-none": _chunk(text=None),
    "lone-surrogate": _chunk(text="\ud800"),
    "lone-surrogate-in-top": _chunk(
        logprobs=(
            TokenLogprob(token="a", logprob=0.5, top=(TopLogprob(token="\udfff", logprob=1.0),)),
        )
    ),
    "created-overflow": _chunk(created=2**63),
    "created-underflow": _chunk(created=-(2**63) - 1),
    "index-negative": _chunk(index=-1),
    "index-overflow": _chunk(index=2**32),
    "seq-negative": _chunk(seq=-1),
    "seq-overflow": _chunk(seq=2**64),
    "seq-float": _chunk(seq=3.0),
    "token-id-negative": _chunk(token_ids=(1, -1)),
    "token-id-overflow": _chunk(token_ids=(2**32,)),
    "token-id-bool": _chunk(token_ids=(True,)),
    "token-id-numpy": _chunk(token_ids=(np.uint32(7),)),
    "token-ids-range": _chunk(token_ids=range(3)),
    "token-ids-str": _chunk(token_ids="abc"),
    "token-ids-none": _chunk(token_ids=None),
    "logprob-int": _chunk(logprobs=(TokenLogprob(token="a", logprob=-1),)),
    "logprob-numpy": _chunk(logprobs=(TokenLogprob(token="a", logprob=np.float64(-1.5)),)),
    "logprob-str": _chunk(logprobs=(TokenLogprob(token="a", logprob="x"),)),  # type: ignore[arg-type]
    "logprob-subclass": _chunk(logprobs=(SubLogprob(token="a", logprob=-1.0),)),
    "top-of-logprobs": _chunk(
        logprobs=(
            TokenLogprob(token="a", logprob=-1.0, top=(TokenLogprob(token="b", logprob=-2.0),)),  # type: ignore[arg-type]
        )
    ),
    "top-none": _chunk(logprobs=(TokenLogprob(token="a", logprob=-1.0, top=None),)),  # type: ignore[arg-type]
    "logprobs-generator-like": _chunk(logprobs=iter(())),
    "logprobs-dict": _chunk(logprobs={}),
    "logprob-entry-none": _chunk(logprobs=(None,)),
    "finish-int": _chunk(finish_reason=5),
    "usage-dict": _chunk(usage={"prompt_tokens": 1}),
    "usage-negative": _chunk(usage=Usage(prompt_tokens=-1, completion_tokens=0)),
    "usage-overflow": _chunk(usage=Usage(prompt_tokens=0, completion_tokens=2**32)),
    "unset-slots": object.__new__(TokenChunk),
    "not-a-chunk": "not a message",
    "none": None,
    "a-model-class": TokenChunk,
    "embedding": workloads.get("embed-1x384").messages()[0],
}


@pytest.mark.parametrize("name", HANDED_BACK)
def test_what_the_extension_does_not_take_goes_to_upb(name: str) -> None:
    """Handed back untouched (None, no exception); then the codec, and its message stream,
    give what the upb path gives: the same bytes, or the same error."""
    message = HANDED_BACK[name]
    assert ACCEL.encode_chunk(message) is None
    assert outcome(fast_codec().encode, message) == outcome(UPB.encode, message)
    if type(message) in (TokenChunk, SubChunk):
        fast_stream, upb_stream = fast_codec().message_encoder(), UPB.message_encoder()
        assert outcome(fast_stream.encode, message) == outcome(upb_stream.encode, message)


field_values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    floats,
    st.text(max_size=4),
    st.binary(max_size=4),
    st.lists(st.integers(-5, 2**33), max_size=3).map(tuple),
    st.builds(dict),
)


@settings(max_examples=400)
@given(
    type_=st.sampled_from([TokenChunk, TokenLogprob, TopLogprob, Usage]),
    values=st.lists(field_values, min_size=10, max_size=10),
)
def test_any_field_of_any_type_is_upbs_bytes_or_its_error(
    type_: type[Any], values: list[Any]
) -> None:
    """Arbitrary values in every field of a chunk, and of its parts inside a valid chunk: the
    extension returns upb's bytes or None, never raises; the codec does as the upb path."""
    names = [f.name for f in dataclasses.fields(type_)]
    part = type_(**dict(zip(names, values, strict=False)))
    if type_ is TokenLogprob:
        message: Any = _chunk(logprobs=(part,))
    elif type_ is TopLogprob:
        message = _chunk(logprobs=(TokenLogprob(token="a", logprob=-1.0, top=(part,)),))
    elif type_ is Usage:
        message = _chunk(usage=part)
    else:
        message = part
    fast = ACCEL.encode_chunk(message)
    expected = outcome(UPB.encode, message)
    if fast is not None:
        assert ("returned", fast) == expected
    assert outcome(fast_codec().encode, message) == expected


# -- hostile and non-canonical input -------------------------------------------------------


def _samples() -> list[bytes]:
    """Valid messages of every shape: some of each workload, and the edges."""
    out = [
        UPB.encode(m)
        for name in workloads.names(kind="stream")
        for m in workloads.get(name).messages()[:3]
    ]
    return out + [UPB.encode(c) for n, c in EDGES.items() if not n.startswith(("long", "many"))]


SAMPLES = _samples()


def check_same_decode(data: Any, *, fast: ProtobufCodec | None = None) -> tuple[Any, ...]:
    """The codec's result for ``data`` (a chunk, or an error's type and message), which must
    be the upb path's, as ``decode`` and as a stream's one-message decoder."""
    codec = fast or fast_codec()
    upb = UPB if fast is None else ProtobufCodec(marshal="upb", max_elements=fast.max_elements)
    expected = decoded_by(upb, data)
    assert decoded_by(codec, data) == expected
    assert outcome(codec.decode_function(TokenChunk), data) == outcome(
        upb.decode_function(TokenChunk), data
    )
    return expected


def test_every_truncation_of_a_valid_message_decodes_as_upb_does() -> None:
    for data in SAMPLES:
        for cut in range(len(data)):
            check_same_decode(data[:cut])


def test_every_single_byte_damage_decodes_as_upb_does() -> None:
    for data in SAMPLES[::3]:
        for at, change in itertools.product(range(len(data)), (0x00, 0x01, 0x80, 0xFF)):
            damaged = bytearray(data)
            damaged[at] = change if change in (0x00, 0xFF) else damaged[at] ^ change
            check_same_decode(bytes(damaged))


@settings(max_examples=500)
@given(data=st.binary(max_size=64))
def test_random_bytes_decode_as_upb_does(data: bytes) -> None:
    check_same_decode(data)


@st.composite
def wire_messages(draw: st.DrawFn, depth: int = 0) -> bytes:
    """Random fields of any number and wire type, nested: what upb reads and the schema
    allows (and not), far beyond what upb writes."""
    parts = []
    for _ in range(draw(st.integers(0, 5))):
        number = draw(st.integers(1, 12))
        wire = draw(st.sampled_from([VARINT, I64, LEN, I32]))
        if wire == VARINT:
            payload = varint(draw(st.sampled_from([0, 1, 127, 128, 2**32 - 1, 2**32, 2**64 - 1])))
        elif wire == I64:
            payload = draw(st.binary(min_size=8, max_size=8))
        elif wire == I32:
            payload = draw(st.binary(min_size=4, max_size=4))
        else:
            inner = (
                draw(wire_messages(depth + 1))
                if depth < 3 and draw(st.booleans())
                else draw(st.text(max_size=4).map(str.encode) | st.binary(max_size=4))
            )
            payload = varint(len(inner)) + inner
        parts.append(key(number, wire) + payload)
    return b"".join(parts)


@settings(max_examples=500)
@given(data=wire_messages())
def test_random_fields_decode_as_upb_does(data: bytes) -> None:
    check_same_decode(data)


def _fields(data: bytes) -> list[bytes]:
    """The top-level fields of a message upb wrote (its keys are one byte), each whole."""
    out, pos = [], 0
    while pos < len(data):
        start, wire = pos, data[pos] & 7
        pos += 1
        if wire == VARINT:
            while data[pos] & 0x80:
                pos += 1
            pos += 1
        elif wire == LEN:
            length, shift = 0, 0
            while True:
                byte = data[pos]
                pos += 1
                length |= (byte & 0x7F) << shift
                shift += 7
                if byte < 0x80:
                    break
            pos += length
        else:
            pos += 8
        out.append(data[start:pos])
    return out


@settings(max_examples=300)
@given(index=st.integers(0, len(SAMPLES) - 1), data=st.data())
def test_fields_reordered_repeated_or_dropped_decode_as_upb_does(
    index: int, data: st.DataObject
) -> None:
    """Protobuf's merge rules: the last of a repeated singular field wins, submessages merge,
    repeated fields append. The extension hands back all of it but the dropped fields."""
    fields = _fields(SAMPLES[index])
    picked = data.draw(st.lists(st.sampled_from(fields), max_size=12) if fields else st.just([]))
    message = b"".join(picked)
    keys = [f[0] for f in picked]
    canonical_order = keys == sorted(set(keys)) and all(keys.count(k) == 1 for k in keys)
    result = check_same_decode(message)
    if not canonical_order:
        assert ACCEL.decode_chunk(message, BUDGET) is None, message.hex()
    else:
        assert result[0] == "returned"


def _s(field: int, text: bytes) -> bytes:
    return length_delimited(field, text)


def _double(field: int, value: float) -> bytes:
    return key(field, I64) + struct.pack("<d", value)


TOP = _s(1, b"x") + _double(2, -1.0)
ENTRY = _s(1, b"a") + _double(2, -0.5) + _s(3, TOP)
NOT_CANONICAL: dict[str, bytes] = {
    "token-ids-unpacked": key(6, VARINT) + varint(5),
    "token-ids-packed-then-unpacked": _s(6, varint(1)) + key(6, VARINT) + varint(2),
    "token-ids-twice-packed": _s(6, varint(1)) + _s(6, varint(2)),
    "token-ids-empty-packed": _s(6, b""),
    "token-id-over-uint32": _s(6, varint(2**32 + 5)),
    "index-over-uint32": key(4, VARINT) + varint(2**32 + 1),
    "usage-over-uint32": _s(10, key(1, VARINT) + varint(2**33)),
    "out-of-order": key(5, VARINT) + varint(1) + _s(1, b"id"),
    "id-twice": _s(1, b"a") + _s(1, b"b"),
    "message-twice": _s(1, b"a")
    + key(5, VARINT)
    + varint(1)
    + _s(1, b"a")
    + key(5, VARINT)
    + varint(2),
    "logprobs-twice": _s(8, _s(1, ENTRY)) + _s(8, _s(1, ENTRY)),
    "usage-twice": _s(10, key(1, VARINT) + varint(1)) + _s(10, key(2, VARINT) + varint(2)),
    "unknown-varint": key(11, VARINT) + varint(7),
    "unknown-len": _s(1, b"a") + _s(15, b"xyz"),
    "unknown-fixed32": key(12, I32) + b"\x00\x00\x00\x00",
    "unknown-group": key(13, 3) + key(13, 4),
    "unknown-inside-top": _s(8, _s(1, _s(1, b"a") + _s(3, TOP + key(9, VARINT) + varint(1)))),
    "unknown-inside-usage": _s(10, key(3, VARINT) + varint(1)),
    "wrong-wire-type-id": key(1, VARINT) + varint(3),
    "wrong-wire-type-logprob": _s(8, _s(1, key(2, I32) + b"\x00\x00\x80\x3f")),
    "wrong-wire-type-created": key(3, I64) + b"\x01" * 8,
    "default-seq-written": key(5, VARINT) + varint(0),
    "default-id-written": _s(1, b""),
    "default-created-written": key(3, VARINT) + varint(0),
    "default-usage-field-written": _s(10, key(1, VARINT) + varint(0)),
    "default-logprob-written": _s(8, _s(1, _s(1, b"a") + _double(2, 0.0))),
    "default-top-token-written": _s(8, _s(1, _s(3, _s(1, b"") + _double(2, -1.0)))),
    "top-fields-reversed": _s(8, _s(1, _s(3, _double(2, -1.0) + _s(1, b"x")))),
    "entry-fields-reversed": _s(8, _s(1, _s(3, TOP) + _s(1, b"a"))),
    "top-between-entry-fields": _s(8, _s(1, _s(1, b"a") + _s(3, TOP) + _double(2, -0.5))),
    "two-byte-key": b"\x8a\x00" + b"\x01a",
    "field-zero": b"\x00\x00",
    "eleven-byte-varint": key(5, VARINT) + b"\x81" + b"\x80" * 9 + b"\x00",
    "varint-past-64-bits": key(5, VARINT) + b"\xff" * 9 + b"\x7f",
    "invalid-utf8-id": _s(1, b"\xff"),
    "invalid-utf8-finish": _s(9, b"\xc3"),
    "invalid-utf8-top": _s(8, _s(1, _s(3, _s(1, b"\xed\xa0\x80")))),
    "length-past-the-end": _s(7, b"abc")[:-1],
    "length-past-the-submessage": _s(8, b"\x0a\x05\x0a\x01a"),
    "logprob-cut": _s(8, _s(1, key(2, I64) + b"\x00\x00")),
    # upb reads a length in at most 5 bytes (and below 2**31): longer is corrupt to it
    "six-byte-length-id": key(1, LEN) + b"\x81\x80\x80\x80\x80\x00" + b"a",
    "six-byte-length-token-ids": key(6, LEN) + b"\x81\x80\x80\x80\x80\x00" + b"\x05",
    "six-byte-length-logprobs": key(8, LEN) + b"\x80\x80\x80\x80\x80\x00",
    "length-over-int32": key(7, LEN) + varint(2**31) + b"a",
}


@pytest.mark.parametrize("name", NOT_CANONICAL)
def test_what_upb_does_not_write_is_handed_back_and_decodes_as_upb_does(name: str) -> None:
    data = NOT_CANONICAL[name]
    assert ACCEL.decode_chunk(data, BUDGET) is None
    check_same_decode(data)


def test_a_non_minimal_varint_of_the_same_value_decodes_the_same() -> None:
    """Taken or not, the value is upb's."""
    check_same_decode(key(5, VARINT) + b"\x81\x00")
    check_same_decode(_s(6, b"\x81\x80\x00"))
    check_same_decode(key(1, LEN) + b"\x81\x80\x80\x80\x00" + b"a")  # a 5-byte length


def test_a_bytearray_rewritten_during_the_decode_gives_no_id_upb_could_not() -> None:
    """The token ids are read twice (counted, then built), and between the two an allocation
    can run a collection whose ``__del__`` rewrites the bytearray in place (it cannot resize
    it: the buffer is held). Whatever the decode returns keeps every id a uint32."""
    ids = bytes.fromhex("ffffff7f8101")  # 2**28 - 1, 129
    rewritten = bytes.fromhex("ffffffff1f01")  # the same length: 2**33 - 1, 1
    entry = _s(1, b"a")
    message = bytearray(_s(6, ids) + _s(8, _s(1, entry)))

    rewrites = 0

    class Rewriter:
        def __del__(self) -> None:
            nonlocal rewrites
            rewrites += 1
            message[2:8] = rewritten

    thresholds = gc.get_threshold()
    try:
        for _ in range(50):
            message[2:8] = ids
            gc.collect(0)  # the youngest only: a full collection of a big heap, 50 times, is 30 s
            gc.set_threshold(1, 1000, 1000)
            cycle = Rewriter()
            cycle.self = cycle  # type: ignore[attr-defined]
            del cycle
            chunk = ACCEL.decode_chunk(message, BUDGET)
            gc.set_threshold(*thresholds)
            assert chunk is None or all(token_id < 2**32 for token_id in chunk.token_ids)
    finally:
        gc.set_threshold(*thresholds)
    assert rewrites == 50  # each cycle was collected, during the decode or after it


def test_an_empty_message_is_the_default_chunk() -> None:
    assert check_same_decode(b"")[0] == "returned"
    assert ACCEL.decode_chunk(b"", BUDGET) == UPB.decode(b"", TokenChunk)


# -- the element budget --------------------------------------------------------------------

BUDGET_CHUNK = _chunk(
    token_ids=tuple(range(10)),
    logprobs=tuple(
        TokenLogprob(token="a", logprob=-1.0, top=(TopLogprob(token="b", logprob=-2.0),) * 2)
        for _ in range(3)
    ),
)  # 10 token ids, 3 entries, 6 alternatives: 19 elements


@pytest.mark.parametrize("budget", [1, 9, 10, 12, 13, 18, 19, 20])
def test_the_element_budget_is_upbs(budget: int) -> None:
    data = UPB.encode(BUDGET_CHUNK)
    fast = fast_codec(max_elements=budget)
    result = check_same_decode(data, fast=fast)
    taken = ACCEL.decode_chunk(data, budget)
    if budget >= 19:
        assert result[0] == "returned"
        assert taken == BUDGET_CHUNK
    else:
        assert result[:2] == ("raised", ElementBudgetError)
        assert taken is None
    with pytest.raises(ElementBudgetError) if budget < 19 else contextlib.nullcontext():
        fast.stream_decoder(TokenChunk).feed(fast.stream_encoder().encode(BUDGET_CHUNK))


# -- the inputs decode takes ---------------------------------------------------------------


def _released() -> memoryview:
    view = memoryview(b"\x0a\x01a")
    view.release()
    return view


DATA = UPB.encode(workloads.get("stream-16-top5").messages()[2])
INPUTS: dict[str, Any] = {
    "bytes": DATA,
    "bytearray": bytearray(DATA),
    "memoryview": memoryview(DATA),
    "memoryview-of-bytearray": memoryview(bytearray(DATA)),
    "memoryview-slice": memoryview(b"!!" + DATA + b"??")[2:-2],
    "memoryview-cast": memoryview(DATA[: len(DATA) // 4 * 4]).cast("I"),
    "memoryview-2d": memoryview(DATA[:16]).cast("B", (4, 4)),
    "memoryview-strided": memoryview(DATA)[::2],
    "memoryview-released": _released(),
    "bytes-subclass": type("B", (bytes,), {})(DATA),
    "bytearray-subclass": type("BA", (bytearray,), {})(DATA),
    "array": np.frombuffer(DATA, dtype=np.uint8),
    "str": "text",
    "none": None,
    "int": 5,
}


@pytest.mark.parametrize("name", INPUTS)
def test_every_kind_of_input_decodes_as_upb_does(name: str) -> None:
    check_same_decode(INPUTS[name])


@pytest.mark.parametrize("name", ["bytearray", "memoryview", "memoryview-slice"])
def test_bytearray_and_memoryview_are_taken(name: str) -> None:
    taken = ACCEL.decode_chunk(INPUTS[name], BUDGET)
    assert taken is not None
    assert taken == UPB.decode(DATA, TokenChunk)


def test_decode_chunk_refuses_arguments_of_the_wrong_shape() -> None:
    with pytest.raises(TypeError):
        ACCEL.decode_chunk(DATA)
    with pytest.raises(TypeError):
        ACCEL.decode_chunk(DATA, "many")
    assert ACCEL.decode_chunk(DATA, -1) is None  # a budget nothing meets: upb's to refuse
    assert ACCEL.decode_chunk(DATA, 2**80) is not None


# -- memory and the debug allocator --------------------------------------------------------


def test_no_memory_grows_over_a_loop() -> None:
    """tracemalloc sees the extension's allocations (PyMem, bytes, the model objects): none
    is kept, whether a chunk is taken, handed back or refused half way."""
    chunks = [
        workloads.get("stream-16-top5").messages()[3],
        EDGES["many-logprobs"],
        EDGES["longer-text"],
        HANDED_BACK["lone-surrogate-in-top"],
        HANDED_BACK["usage-overflow"],
    ]
    datas = [
        *(UPB.encode(c) for c in chunks[:3]),
        *NOT_CANONICAL.values(),
        SAMPLES[5][:-3],
    ]
    held = [*chunks, *datas]

    def loop(times: int) -> None:
        for _ in range(times):
            for c in chunks:
                ACCEL.encode_chunk(c)
            for d in datas:
                ACCEL.decode_chunk(d, BUDGET)
                ACCEL.decode_chunk(d, 3)

    assert_nothing_kept(loop, held, warm=20, times=300)


DEV_MODE_SCRIPT = """
import random
import inferwire.codecs as ic
from inferwire import workloads
from inferwire.codecs import protobuf_codec as pc
assert pc._accel is not None
upb = pc.ProtobufCodec(marshal="upb")
rng = random.Random(7)
for name in workloads.names(kind="stream"):
    for m in workloads.get(name).messages()[:40]:
        data = upb.encode(m)
        assert pc._accel.encode_chunk(m) == data, name
        assert pc._accel.decode_chunk(data, 1 << 20) == m, name
        for cut in range(len(data)):
            pc._accel.decode_chunk(data[:cut], 1 << 20)
        for _ in range(20):
            damaged = bytearray(data)
            damaged[rng.randrange(len(data))] = rng.randrange(256)
            pc._accel.decode_chunk(damaged, 1 << 20)
print("same")
"""


def test_the_same_bytes_under_dev_mode() -> None:
    assert_same_under_dev_mode(DEV_MODE_SCRIPT)


def test_random_damage_of_long_messages_decodes_as_upb_does() -> None:
    """The heap paths: messages past the stack buffer, damaged at seeded places."""
    rng = random.Random(20240601)
    for chunk in (EDGES["many-logprobs"], EDGES["longer-text"]):
        data = UPB.encode(chunk)
        check_same_decode(data)
        # 100 seeded damages and 50 cuts a message (twice that took 26 s of the test
        # command); the short messages are damaged at every byte in the test above
        for _ in range(100):
            damaged = bytearray(data)
            damaged[rng.randrange(len(data))] = rng.randrange(256)
            check_same_decode(bytes(damaged))
        for cut in sorted(rng.sample(range(len(data)), 50)):
            check_same_decode(data[:cut])
