"""The delta codec's C extension (codecs/_delta_accel.c) against its pure-Python reference.

Every property is differential: the same chunks encoded by both paths give the same bytes; the
same bytes (whole, split, damaged, or written by another protobuf writer) decode by both paths
to the same chunks, or to the same error after the same chunks. The extension itself is also
fed hostile arguments directly: it must hand back what it cannot take, never crash.

tests/codecs/test_delta.py runs whole on both paths as well (its ``path`` fixture).
"""

from __future__ import annotations

import dataclasses
import importlib
import itertools
import math
import os
import struct
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import inferwire.codecs as ic
from inferwire import workloads
from inferwire.codecs import delta_codec, delta_wire
from inferwire.codecs.delta_codec import DELTA_V1, DELTA_V2, DeltaCodec
from inferwire.codecs.errors import IncompatibleSchemaError
from tests.codecs.accel_helpers import CHUNK_CLASSES_IT_CANNOT_FILL, run_child

ACCEL: Any = importlib.import_module("inferwire.codecs._delta_accel")
MiB = 1024 * 1024
STREAM_WORKLOADS = workloads.names(kind="stream")


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


def codecs(**options: Any) -> tuple[DeltaCodec, DeltaCodec]:
    """(accelerated, pure Python), sharing one registry."""
    registry = delta_codec.default_registry()
    return DeltaCodec(registry=registry, **options), DeltaCodec(
        registry=registry, pure_python=True, **options
    )


FAST, PURE = codecs()  # schema version 3: wire format 1, float32 logprobs
FAST_V2, PURE_V2 = codecs(schema=DELTA_V2)  # wire format 0, as readers before version 3 read
FAST_V1, PURE_V1 = codecs(schema=DELTA_V1)


# -- the extension is there ---------------------------------------------------------------------


def test_the_extension_is_built_and_used_by_default() -> None:
    """CI runs the tests on a fresh install: this proves the extension was compiled."""
    assert ACCEL.API_VERSION == delta_codec._ACCEL_API_VERSION
    assert ACCEL.__file__.endswith((".so", ".pyd"))
    if os.environ.get("INFERWIRE_PURE_PYTHON", "") in ("", "0"):
        assert delta_codec._load_accelerator() is ACCEL
    assert delta_codec.accelerated()
    assert FAST.stream_encoder()._accel is ACCEL  # type: ignore[attr-defined]
    assert FAST.stream_decoder()._accel is ACCEL  # type: ignore[attr-defined]
    assert PURE.stream_encoder()._accel is None  # type: ignore[attr-defined]
    assert PURE.stream_decoder()._accel is None  # type: ignore[attr-defined]


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class WiderChunk:
    """TokenChunk's fields and one more: the extension would leave that one unset."""

    id: str
    model: str
    created: int
    index: int
    seq: int
    token_ids: tuple[int, ...]
    text: str
    logprobs: Any
    finish_reason: Any
    usage: Any
    extra: int


@pytest.mark.parametrize(
    "classes",
    [
        (WiderChunk, ic.TokenLogprob, ic.TopLogprob, ic.Usage),  # a field it does not know
        *CHUNK_CLASSES_IT_CANNOT_FILL[1:],
    ],
)
def test_configure_refuses_classes_it_cannot_fill(classes: tuple[Any, ...]) -> None:
    with pytest.raises((TypeError, AttributeError)):
        ACCEL.configure(*classes, 4096, 32)
    # and the module is left unusable until configured again, not half-bound
    with pytest.raises(RuntimeError):
        ACCEL.encode_frame(None, ("r", "m", 0, 0), 0, 0, {}, [], True, True)
    ACCEL.configure(
        ic.TokenChunk,
        ic.TokenLogprob,
        ic.TopLogprob,
        ic.Usage,
        delta_codec.MAX_TABLE_ENTRIES,
        delta_codec.MAX_INTERNED_CHARS,
    )


# -- strategies -------------------------------------------------------------------------------


class Text(str):
    """A str subclass: the extension takes exact types only and hands this back."""


class Number(int):
    pass


class Real(float):
    pass


SPECIAL_FLOATS = [
    -0.0,
    0.0,
    math.nan,
    -math.nan,
    struct.unpack("<d", struct.pack("<Q", 0x7FF0_0000_0000_0001))[0],
    math.inf,
    -math.inf,
    5e-324,
    -1e-310,
    1.7976931348623157e308,
    -0.25,
    -12.3456789,
    -0.12345678901234568,
    0.30000000000000004,
    -1.2345678901234567e-05,
    1e-22,
    1.5e-22,
    -9007199254740991.0,
    9007199254740992.0,
    -123456789012345.67,
    1e16,
    1e22,
    123.0,
    -1 / 3,
]
short_decimals = st.builds(
    lambda mantissa, scale: mantissa / 10**scale,
    st.integers(-(10**15), 10**15),
    st.integers(0, 22),
)
floats = st.floats() | short_decimals | st.sampled_from(SPECIAL_FLOATS)
# Strings that repeat (the table), that must not be interned, that cannot be encoded.
PIECES = ["", " the", "é", "東京", "😊", "👩‍👩‍👧", "\x00", "x" * 32, "y" * 33, "lone \ud800"]
texts = st.sampled_from(PIECES) | st.text(max_size=40)
u32 = st.integers(0, 2**32 - 1)


@st.composite
def token_logprobs(draw: st.DrawFn) -> ic.TokenLogprob:
    token, logprob = draw(texts), draw(floats)
    top = draw(st.lists(st.builds(ic.TopLogprob, token=texts, logprob=floats), max_size=6))
    if draw(st.booleans()):  # OpenAI's usual case: the sampled token is the first alternative
        top.insert(0, ic.TopLogprob(token=token, logprob=logprob))
    return ic.TokenLogprob(token=token, logprob=logprob, top=tuple(top))


@st.composite
def responses(draw: st.DrawFn, max_chunks: int = 8) -> list[ic.TokenChunk]:
    count = draw(st.integers(0, max_chunks))
    base = ic.TokenChunk(
        id=draw(texts.filter(str.isprintable)),
        model=draw(texts.filter(str.isprintable)),
        created=draw(st.integers(-(2**63), 2**63 - 1)),
        index=draw(u32),
        seq=0,
        token_ids=(),
        text="",
    )
    start = draw(st.integers(0, 2**64 - 1 - count) | st.integers(0, 3))
    return [
        dataclasses.replace(
            base,
            seq=start + i,
            token_ids=tuple(draw(st.lists(u32, max_size=8))),
            text=draw(texts),
            logprobs=draw(st.none() | st.lists(token_logprobs(), max_size=3).map(tuple)),
            finish_reason=draw(st.none() | texts),
            usage=draw(st.none() | st.builds(ic.Usage, prompt_tokens=u32, completion_tokens=u32)),
        )
        for i in range(count)
    ]


def _odd(draw: st.DrawFn, chunk: ic.TokenChunk) -> Any:
    """The chunk with one value a caller may pass that the encoder takes or refuses in Python."""
    odd = draw(
        st.sampled_from(
            [
                "id-equal-not-same",
                "id-subclass",
                "text-subclass",
                "token-id-bool",
                "token-id-subclass",
                "token-id-negative",
                "token-id-too-large",
                "token-ids-list",
                "seq-ahead",
                "seq-float",
                "created-other",
                "index-bool",
                "logprob-int",
                "logprob-subclass",
                "logprobs-list",
                "top-list",
                "usage-too-large",
                "not-a-chunk",
            ]
        )
    )
    token_ids = chunk.token_ids or (1,)
    lp = ic.TokenLogprob(token="t", logprob=-0.5, top=(ic.TopLogprob(token="u", logprob=-1.0),))
    odd_list: Any = list(lp.top)
    table: dict[str, dict[str, Any] | None] = {
        "id-equal-not-same": {"id": "".join(list(chunk.id))},
        "id-subclass": {"id": Text(chunk.id)},
        "text-subclass": {"text": Text(chunk.text)},
        "token-id-bool": {"token_ids": (True, *token_ids)},
        "token-id-subclass": {"token_ids": (Number(7), *token_ids)},
        "token-id-negative": {"token_ids": (-1,)},
        "token-id-too-large": {"token_ids": (2**32,)},
        "token-ids-list": {"token_ids": list(token_ids)},
        "seq-ahead": {"seq": chunk.seq + 1},
        "seq-float": {"seq": float(chunk.seq)},
        "created-other": {"created": chunk.created ^ 1},
        "index-bool": {"index": bool(chunk.index)},
        "logprob-int": {"logprobs": (dataclasses.replace(lp, logprob=-3),)},
        "logprob-subclass": {"logprobs": (dataclasses.replace(lp, logprob=Real(-0.5)),)},
        "logprobs-list": {"logprobs": [lp]},
        "top-list": {"logprobs": (dataclasses.replace(lp, top=odd_list),)},
        "usage-too-large": {"usage": ic.Usage(prompt_tokens=2**32, completion_tokens=0)},
        "not-a-chunk": None,
    }
    changes = table[odd]
    if changes is None:
        return ic.Usage(prompt_tokens=1, completion_tokens=2)
    return dataclasses.replace(chunk, **changes)


@st.composite
def odd_responses(draw: st.DrawFn) -> list[Any]:
    """A response where some chunks carry a value of another type or out of range."""
    chunks: list[Any] = draw(responses())
    for i in range(len(chunks)):
        if draw(st.integers(0, 3)) == 0:
            chunks[i] = _odd(draw, chunks[i])
    return chunks


# -- encoding: the same bytes, the same errors -------------------------------------------------


def encode_outcomes(codec: DeltaCodec, chunks: Sequence[Any]) -> list[Any]:
    """Each chunk's bytes or error (type and message), then the end marker's."""
    encoder = codec.stream_encoder()
    out: list[Any] = []
    for chunk in [*chunks, None]:
        try:
            out.append(encoder.end() if chunk is None else encoder.encode(chunk))
        except ic.EncodeError as exc:
            out.append((type(exc), str(exc)))
    return out


@settings(max_examples=200)
@given(chunks=responses())
def test_any_response_encodes_to_the_same_bytes(chunks: list[ic.TokenChunk]) -> None:
    assert encode_outcomes(FAST, chunks) == encode_outcomes(PURE, chunks)
    assert encode_outcomes(FAST_V2, chunks) == encode_outcomes(PURE_V2, chunks)
    without_usage = [dataclasses.replace(c, usage=None) for c in chunks]
    assert encode_outcomes(FAST_V1, chunks) == encode_outcomes(PURE_V1, chunks)
    assert encode_outcomes(FAST_V1, without_usage) == encode_outcomes(PURE_V1, without_usage)


@settings(max_examples=200)
@given(chunks=odd_responses())
def test_odd_values_encode_or_fail_the_same(chunks: list[Any]) -> None:
    assert encode_outcomes(FAST, chunks) == encode_outcomes(PURE, chunks)
    assert encode_outcomes(FAST_V2, chunks) == encode_outcomes(PURE_V2, chunks)


@pytest.mark.parametrize("workload", STREAM_WORKLOADS)
def test_every_stream_workload_encodes_to_the_same_bytes(workload: str) -> None:
    chunks = workloads.get(workload).messages()
    assert encode_outcomes(FAST, chunks) == encode_outcomes(PURE, chunks)
    assert encode_outcomes(FAST_V2, chunks) == encode_outcomes(PURE_V2, chunks)
    assert [FAST.encode(c) for c in chunks[:8]] == [PURE.encode(c) for c in chunks[:8]]


def test_the_string_table_fills_up_the_same_way() -> None:
    count = delta_codec.MAX_TABLE_ENTRIES + 50
    words = [f"w{i}" for i in range(count)]
    base = ic.TokenChunk(id="r", model="m", created=0, index=0, seq=0, token_ids=(), text="")
    chunks = [
        dataclasses.replace(
            base,
            seq=i,
            text=word,
            logprobs=(ic.TokenLogprob(token=word, logprob=-1.0, top=_tops(words, i)),),
        )
        for i, word in enumerate([*words, *words[::-1]])
    ]
    for fast_codec, pure_codec in ((FAST, PURE), (FAST_V2, PURE_V2)):
        fast = encode_outcomes(fast_codec, chunks)
        assert fast == encode_outcomes(pure_codec, chunks)
        stream = b"".join(fast)
        assert decode_outcome(FAST, [stream]) == decode_outcome(PURE, [stream])


def _tops(words: list[str], i: int) -> tuple[ic.TopLogprob, ...]:
    return tuple(ic.TopLogprob(token=words[(i * 7 + k) % len(words)], logprob=-2.0) for k in (1, 2))


@settings(max_examples=200)
@given(value=floats)
def test_the_decimal_form_of_a_float_is_the_same(value: float) -> None:
    assert ACCEL.decimal(value) == delta_wire.to_decimal(value)


# -- decoding: the same chunks, the same errors ------------------------------------------------


def comparable(chunk: ic.TokenChunk) -> tuple[Any, ...]:
    """The chunk with each logprob as its bits: NaN equals itself, -0.0 differs from 0.0."""
    logprobs = None
    if chunk.logprobs is not None:
        logprobs = [
            (lp.token, _bits(lp.logprob), [(t.token, _bits(t.logprob)) for t in lp.top])
            for lp in chunk.logprobs
        ]
    assert type(chunk) is ic.TokenChunk
    assert type(chunk.token_ids) is tuple
    assert chunk.logprobs is None or type(chunk.logprobs) is tuple
    return (dataclasses.replace(chunk, logprobs=None), logprobs)


def _bits(value: float) -> bytes:
    assert type(value) is float
    return struct.pack("<d", value)


def decode_outcome(
    codec: DeltaCodec, pieces: Sequence[bytes], max_frame_bytes: int = MiB
) -> tuple[list[Any], Any]:
    """The chunks delivered, piece by piece, then close()'s outcome or the error that stopped
    the stream (its type, message and sequence numbers). A reader without the float32 fields
    refuses a format-1 stream with an IncompatibleSchemaError, not a DecodeError."""
    decoder = codec.stream_decoder(ic.TokenChunk, max_frame_bytes=max_frame_bytes)
    delivered: list[Any] = []
    try:
        for piece in pieces:
            delivered += [comparable(c) for c in decoder.feed(piece)]
        decoder.close()
    except (ic.DecodeError, IncompatibleSchemaError) as exc:
        seq = (getattr(exc, "expected", None), getattr(exc, "received", None))
        return delivered, (type(exc), str(exc), seq)
    except Exception as exc:  # the property under test: nothing else escapes
        pytest.fail(f"{type(exc).__name__}: {exc} from {codec.pure_python=}")
    return delivered, None


def same_decoding(pieces: Sequence[bytes], max_frame_bytes: int = MiB) -> tuple[list[Any], Any]:
    fast = decode_outcome(FAST, pieces, max_frame_bytes)
    assert fast == decode_outcome(PURE, pieces, max_frame_bytes)
    # and readers of the other versions: version 2 refuses format 1 (float32 logprobs) and
    # reads format 0 whole; version 1 also skips the usage it does not know
    for fast_codec, pure_codec in ((FAST_V2, PURE_V2), (FAST_V1, PURE_V1)):
        assert decode_outcome(fast_codec, pieces, max_frame_bytes) == decode_outcome(
            pure_codec, pieces, max_frame_bytes
        )
    return fast


def split_at(data: bytes, points: Sequence[int]) -> list[bytes]:
    bounds = [0, *sorted(points), len(data)]
    return [data[a:b] for a, b in itertools.pairwise(bounds)]


@settings(max_examples=100)
@given(chunks=responses(), data=st.data())
def test_any_stream_decodes_the_same_in_any_split(
    chunks: list[ic.TokenChunk], data: st.DataObject
) -> None:
    frames = [f for f in encode_outcomes(PURE, chunks) if isinstance(f, bytes)]
    stream = b"".join(frames)
    points = data.draw(st.lists(st.integers(0, len(stream)), max_size=12), label="splits")
    delivered, error = same_decoding(split_at(stream, points))
    if len(frames) == len(chunks) + 1:  # every chunk encoded
        assert error is None
        assert delivered == [comparable(c) for c in chunks]
    same_decoding(frames)


@pytest.mark.parametrize("workload", STREAM_WORKLOADS)
def test_every_stream_workload_decodes_the_same(workload: str) -> None:
    chunks = workloads.get(workload).messages()
    for writer in (PURE, PURE_V2):  # wire formats 1 and 0
        frames = encode_outcomes(writer, chunks)
        delivered, error = same_decoding(frames)
        assert error is None
        assert delivered == [comparable(c) for c in chunks if isinstance(c, ic.TokenChunk)]
        same_decoding([b"".join(frames)])


@st.composite
def damaged_streams(draw: st.DrawFn) -> bytes:
    """A workload's stream, or a drawn one, with bytes flipped, cut, inserted, or frames
    dropped, repeated and swapped."""
    writer = draw(st.sampled_from([PURE, PURE_V2]))
    if draw(st.booleans()):
        workload = draw(st.sampled_from(["stream-16", "stream-16-top5", "stream-256-multi"]))
        frames = encode_outcomes(writer, workloads.get(workload).messages())
    else:
        frames = [f for f in encode_outcomes(writer, draw(responses())) if isinstance(f, bytes)]
    head, *rest = frames
    if len(rest) > 2 and draw(st.booleans()):
        i = draw(st.integers(0, len(rest) - 2))
        kind = draw(st.sampled_from(["drop", "repeat", "swap"]))
        if kind == "drop":
            del rest[i]
        elif kind == "repeat":
            rest.insert(draw(st.integers(i, len(rest))), rest[i])
        else:
            rest[i], rest[i + 1] = rest[i + 1], rest[i]
    damaged = bytearray(head + b"".join(rest))
    for _ in range(draw(st.integers(0, 4))):
        pos = draw(st.integers(0, max(len(damaged) - 1, 0)))
        edit = draw(st.sampled_from(["flip", "cut", "insert"]))
        if edit == "flip" and damaged:
            damaged[pos] ^= draw(st.integers(1, 255))
        elif edit == "cut":
            del damaged[pos : pos + draw(st.integers(1, 8))]
        else:
            damaged[pos:pos] = draw(st.binary(min_size=1, max_size=8))
    return bytes(damaged)


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(stream=damaged_streams(), data=st.data())
def test_damaged_streams_fail_the_same_way(stream: bytes, data: st.DataObject) -> None:
    same_decoding([stream])
    points = data.draw(st.lists(st.integers(0, len(stream)), max_size=6), label="splits")
    same_decoding(split_at(stream, points))
    same_decoding([stream], max_frame_bytes=data.draw(st.integers(1, 300), label="max"))


def test_every_single_byte_corruption_fails_the_same_way() -> None:
    base = ic.TokenChunk(id="r", model="m", created=5, index=1, seq=3, token_ids=(), text="")
    lp = ic.TokenLogprob(
        token=" caf",
        logprob=-0.25,
        top=(
            ic.TopLogprob(token=" caf", logprob=-0.25),
            ic.TopLogprob(token="東", logprob=-1.5),
            ic.TopLogprob(token="", logprob=math.nan),
        ),
    )
    # float32 values (format 1: the logprob in 4 bytes, the alternatives packed as float32)
    f32 = ic.TokenLogprob(
        token="東",
        logprob=-2.299999952316284,
        top=(
            ic.TopLogprob(token=" caf", logprob=-0.10000000149011612),
            ic.TopLogprob(token="京", logprob=-7.123456954956055),
        ),
    )
    chunks = [
        dataclasses.replace(base, token_ids=(42, 70_000), text=" café", logprobs=(lp,)),
        dataclasses.replace(base, seq=4, token_ids=(7,), text=" caf", logprobs=()),
        dataclasses.replace(base, seq=5, token_ids=(2**32 - 1,), text="東", logprobs=(lp, f32)),
        dataclasses.replace(
            base,
            seq=6,
            text=" café",
            finish_reason="length",
            usage=ic.Usage(prompt_tokens=10, completion_tokens=5),
        ),
    ]
    stream = b"".join(encode_outcomes(PURE, chunks))
    for pos in range(len(stream)):
        for mask in (0x01, 0x02, 0x08, 0x40, 0x80, 0xFF):
            corrupt = bytearray(stream)
            corrupt[pos] ^= mask
            same_decoding([bytes(corrupt)])
        same_decoding([stream[:pos]])


def _key(number: int, wire: int) -> bytes:
    return _varint(number << 3 | wire)


def _varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


@st.composite
def fields(draw: st.DrawFn, depth: int = 0) -> bytes:
    """Protobuf fields with the Frame's and Logprob's numbers, in any order and number."""
    out = bytearray()
    for _ in range(draw(st.integers(0, 6))):
        number = draw(st.integers(1, 13))
        wire = draw(st.sampled_from([0, 1, 2, 5]))
        out += _key(number, wire)
        if wire == 0:
            out += _varint(draw(st.integers(0, 40) | st.integers(0, 2**64 - 1)))
        elif wire == 1:
            out += draw(st.binary(min_size=8, max_size=8))
        elif wire == 5:
            out += draw(st.binary(min_size=4, max_size=4))
        else:
            inner = fields(depth + 1) if depth < 1 else st.binary(max_size=12)
            payload = draw(inner | st.binary(max_size=12))
            out += _varint(len(payload)) + payload
    return bytes(out)


@settings(max_examples=300)
@given(bodies=st.lists(fields(), max_size=4), ended=st.booleans(), magic=st.sampled_from([0, 1]))
def test_frames_of_random_fields_decode_the_same(
    bodies: list[bytes], ended: bool, magic: int
) -> None:
    frames = [
        _varint(len(body) + 1) + body
        for body in ((b"\x08" + _varint(i) if i else b"") + b for i, b in enumerate(bodies))
    ]
    head = bytes((magic,)) + struct.pack(">I", FAST.schema_id) + b"\x00"
    stream = head + b"".join(frames) + (b"\x00" + _varint(len(frames)) if ended else b"")
    same_decoding([stream])


# -- the extension alone, fed anything ----------------------------------------------------------


HEADERS = [
    ("r", "m", 0, 0, 0),
    ("r", "m", -5, 3, 2**64 - 1),
    ("r", "m", 0, 0, 10**30),  # not from any header, but it must not matter
]


@settings(max_examples=500)
@given(
    data=st.binary(max_size=120),
    pos=st.integers(0, 130),
    header=st.sampled_from(HEADERS),
    strings=st.lists(st.sampled_from(["a", "東", "", "x" * 40]), max_size=4),
    count=st.integers(0, 3) | st.integers(0, 2**64 - 1),
    float32=st.booleans(),
    max_frame_bytes=st.integers(1, 200) | st.just(2**70),
)
def test_decode_frames_takes_any_bytes(
    data: bytes,
    pos: int,
    header: tuple[str, str, int, int, int],
    strings: list[str],
    count: int,
    float32: bool,
    max_frame_bytes: int,
) -> None:
    out: list[ic.TokenChunk] = []
    before = list(strings)
    args = (header, strings, count, True, float32, max_frame_bytes, out)
    if pos > len(data):
        with pytest.raises(ValueError, match="pos"):
            ACCEL.decode_frames(data, pos, *args)
        return
    stop = ACCEL.decode_frames(data, pos, *args)
    assert pos <= stop <= len(data)
    assert strings[: len(before)] == before  # the table only grows
    for i, chunk in enumerate(out):
        comparable(chunk)
        assert chunk.seq == header[4] + count + i
        assert all(type(t) is int and 0 <= t < 2**32 for t in chunk.token_ids)
    if not out:
        assert stop == pos
        assert strings == before


@pytest.mark.parametrize(
    "arguments",
    [
        ("not bytes", 0, HEADERS[0], [], 0, True, True, 10, []),
        (b"", 0, ("too", "short"), [], 0, True, True, 10, []),
        (b"", 0, HEADERS[0], ("not", "a list"), 0, True, True, 10, []),
        (b"", -1, HEADERS[0], [], 0, True, True, 10, []),
        (b"", 0, HEADERS[0], [], -1, True, True, 10, []),
        (b"", 0, HEADERS[0], [], 0, True, True, 10),
        (b"", 0, HEADERS[0], [], 0, True, 10, []),  # the API version 1 arguments
    ],
)
def test_decode_frames_refuses_arguments_of_the_wrong_shape(arguments: tuple[Any, ...]) -> None:
    with pytest.raises((TypeError, ValueError, OverflowError)):
        ACCEL.decode_frames(*arguments)


@pytest.mark.parametrize(
    "chunk",
    [
        None,
        1,
        "chunk",
        ic.Usage(prompt_tokens=1, completion_tokens=1),
        object.__new__(ic.TokenChunk),  # no slot set
    ],
    ids=["none", "int", "str", "usage", "unset-slots"],
)
def test_encode_frame_hands_back_what_is_not_a_chunk(chunk: Any) -> None:
    index: dict[str, int] = {}
    strings: list[str] = []
    base = ("r", "m", 0, 0)
    assert ACCEL.encode_frame(chunk, base, 0, 0, index, strings, True, True) is None
    assert (index, strings) == ({}, [])


def test_encode_frame_hands_back_a_chunk_of_another_response_untouched() -> None:
    chunk = ic.TokenChunk(id="r", model="m", created=0, index=0, seq=5, token_ids=(1,), text="new")
    for base, next_seq, offset in [
        (("other", "m", 0, 0), 5, 0),
        (("r", "other", 0, 0), 5, 0),
        (("r", "m", 1, 0), 5, 0),
        (("r", "m", 0, 1), 5, 0),
        (("r", "m", 0, 0), 6, 0),  # seq not the next
        (("r", "m", 0, 0), 5, -1),  # an offset no varint holds
        (("r", "m", 0, 0), 5, 2**64),
    ]:
        index: dict[str, int] = {}
        strings: list[str] = []
        assert ACCEL.encode_frame(chunk, base, next_seq, offset, index, strings, True, True) is None
        assert (index, strings) == ({}, [])
    frame = ACCEL.encode_frame(chunk, ("r", "m", 0, 0), 5, 0, {}, [], True, False)
    assert frame == b"\x09\x12\x01\x01\x22\x03new"  # format 0: token ids packed
    frame = ACCEL.encode_frame(chunk, ("r", "m", 0, 0), 5, 0, {}, [], True, True)
    assert frame == b"\x08\x10\x01\x22\x03new"  # format 1: a single id unpacked


_REBINDING_KEY = r"""
import sys
import inferwire.codecs as ic
from inferwire.codecs import _delta_accel as accel, delta_codec

accel.configure(
    ic.TokenChunk, ic.TokenLogprob, ic.TopLogprob, ic.Usage,
    delta_codec.MAX_TABLE_ENTRIES, delta_codec.MAX_INTERNED_CHARS,
)
KEY = sys.argv[1]  # "hit", the text; or "w", each Logprob's token


def chunk() -> ic.TokenChunk:
    top = tuple(ic.TopLogprob(token=f"t{i}", logprob=-0.5 * i) for i in range(40))
    logprobs = tuple(ic.TokenLogprob(token="w", logprob=-1.25, top=top) for _ in range(30))
    return ic.TokenChunk(
        id="r", model="m", created=0, index=0, seq=3, token_ids=(1, 2, 3), text="hit",
        logprobs=logprobs, finish_reason="stop",
    )


victim = chunk()
done = []


class Key(str):
    # A table key as the Python path interns it (any str subclass a caller passed). Its
    # __eq__ runs inside the extension's dict lookup of an equal exact str.
    __hash__ = str.__hash__

    def __eq__(self, other: object) -> bool:
        if not done:
            done.append(True)
            set_ = object.__setattr__  # past frozen=True
            set_(victim, "token_ids", ["not", "ints", None])  # checked before this lookup
            if KEY == "w":  # mid-way through the Logprobs
                lp = victim.logprobs[0]
                set_(lp.top[1], "token", 7)
                set_(lp.top[1], "logprob", "not a float")
                set_(lp, "top", [])
                set_(lp, "logprob", None)
                set_(victim, "logprobs", None)  # the last reference to the tuple walked
        return str.__eq__(self, other)


base = ("r", "m", 0, 0)
got = accel.encode_frame(victim, base, 3, 3, {Key(KEY): 0}, [KEY], True, True)
# written from the values the chunk had when the call began
want = accel.encode_frame(chunk(), base, 3, 3, {KEY: 0}, [KEY], True, True)
print(got == want, done)
"""


@pytest.mark.parametrize("key", ["hit", "w"])
def test_encode_frame_survives_a_key_that_rebinds_the_chunk_during_lookup(key: str) -> None:
    """A string-table lookup can run Python code (a str subclass's __eq__) that rebinds the
    chunk's slots: the extension reads the chunk once, before any lookup, and holds what it
    read. (It used to read slots again after lookups: a list taken for a tuple, a freed tuple.)
    """
    assert run_child("-c", _REBINDING_KEY, key).split() == ["True", "[True]"]
