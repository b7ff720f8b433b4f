"""Hostile input to every codec: nesting at the depth limit, the decoded-element budget, length
headers that lie, and the numbers and text policy on the decode side (the encode side is in
test_codecs.py). Expected everywhere: a value, or a ``DecodeError`` subclass that names the
limit, with memory bounded by the limit rather than by what the header claims.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

import msgpack
import pytest

import inferwire.codecs as ic
from inferwire.codecs import pbwire
from inferwire.codecs.base import DEFAULT_MAX_DEPTH, DEFAULT_MAX_ELEMENTS
from inferwire.codecs.errors import DepthLimitError, ElementBudgetError
from inferwire.schemas import inferwire_pb2 as pb
from tests.codecs.accel_helpers import peak_memory

JSON_TEXT = ["json", "orjson", "msgspec-json"]
MSGPACK = ["msgpack", "msgspec-msgpack"]
SCANNED = JSON_TEXT + MSGPACK
CHUNK = ic.TokenChunk(
    id="chatcmpl-1", model="m", created=1, index=0, seq=0, token_ids=(7,), text="hi"
)


def with_extra(name: str, extra: bytes) -> bytes:
    """The chunk, encoded by ``name``, with one more (unknown) key whose encoded value is
    ``extra``: unknown keys are skipped, so only the limits can refuse it."""
    data = ic.get(name, extensions=True).encode(CHUNK)
    if name in JSON_TEXT:
        assert data.endswith(b"}")
        return data[:-1] + b',"zz":' + extra + b"}"
    obj = msgpack.unpackb(data)
    assert len(obj) < 15
    body = b"".join(_packb(k) + _packb(v) for k, v in obj.items())
    return bytes([0x80 | (len(obj) + 1)]) + body + _packb("zz") + extra


def _packb(value: Any) -> bytes:
    packed = msgpack.packb(value)
    assert isinstance(packed, bytes)
    return packed


def nested(name: str, depth: int) -> bytes:
    """``depth`` nested arrays, innermost empty."""
    if name in JSON_TEXT:
        return b"[" * depth + b"]" * depth
    return b"\x91" * (depth - 1) + b"\x90"


def depth_of(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + max((depth_of(v) for v in value.values()), default=0)
    if isinstance(value, list | tuple):
        return 1 + max((depth_of(v) for v in value), default=0)
    return 0


# -- depth -----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", SCANNED)
@pytest.mark.parametrize("limit", [16, DEFAULT_MAX_DEPTH])
def test_depth_at_the_limit_minus_one_the_limit_and_past_it(name: str, limit: int) -> None:
    codec = ic.get(name, max_depth=limit, extensions=True)
    # the chunk object is level 1: its unknown key's arrays start at level 2
    for depth in (limit - 1, limit):
        assert codec.decode(with_extra(name, nested(name, depth - 1)), ic.TokenChunk) == CHUNK
    with pytest.raises(DepthLimitError) as info:
        codec.decode(with_extra(name, nested(name, limit)), ic.TokenChunk)
    assert info.value.max_depth == limit


@pytest.mark.parametrize("name", SCANNED)
def test_far_past_the_depth_limit_is_refused_without_recursion(name: str) -> None:
    data = with_extra(name, nested(name, 1_000_000))
    with peak_memory(1 << 20), pytest.raises(DepthLimitError):
        ic.get(name, extensions=True).decode(data, ic.TokenChunk)


@pytest.mark.parametrize("name", SCANNED)
def test_brackets_inside_strings_do_not_count(name: str) -> None:
    text = "[" * 5000 + "{" * 5000
    chunk = ic.TokenChunk(**{**_fields(CHUNK), "text": text})
    codec = ic.get(name, max_depth=8, extensions=True)
    assert codec.decode(codec.encode(chunk), ic.TokenChunk) == chunk


def test_the_decoded_model_is_never_deeper_than_its_schema() -> None:
    """Whatever the input nests, what a codec returns is the model, 5 levels at most."""
    full = ic.TokenChunk(
        **{
            **_fields(CHUNK),
            "logprobs": (
                ic.TokenLogprob(
                    token="a", logprob=-1.0, top=(ic.TopLogprob(token="a", logprob=-1.0),)
                ),
            ),
            "usage": ic.Usage(prompt_tokens=1, completion_tokens=1),
        }
    )
    for name in SCANNED:
        codec = ic.get(name, extensions=True)
        data = codec.encode(full)
        data = data[:-1] + b',"zz":' + nested(name, 300) + b"}" if name in JSON_TEXT else data
        decoded = codec.decode(data, ic.TokenChunk)
        assert decoded == full
        assert depth_of(_as_tree(decoded)) <= 5


def _fields(chunk: ic.TokenChunk) -> dict[str, Any]:
    return {f: getattr(chunk, f) for f in chunk.__dataclass_fields__}


def _as_tree(value: Any) -> Any:
    if hasattr(value, "__dataclass_fields__"):
        return {f: _as_tree(getattr(value, f)) for f in value.__dataclass_fields__}
    if isinstance(value, tuple):
        return [_as_tree(v) for v in value]
    return value


def test_protobuf_nesting_stops_at_upb_limit_of_100() -> None:
    codec = ic.get("protobuf", extensions=True)
    data = codec.encode(CHUNK)
    start, end = pbwire.key(100, 3), pbwire.key(100, 4)  # an unknown group, nested

    def groups(depth: int) -> bytes:
        return data + start * depth + end * depth

    assert codec.decode(groups(99), ic.TokenChunk) == CHUNK
    assert codec.decode(groups(100), ic.TokenChunk) == CHUNK
    with pytest.raises(ic.DecodeError):
        codec.decode(groups(101), ic.TokenChunk)


# -- element budget --------------------------------------------------------------------------


def _array(name: str, items: list[bytes]) -> bytes:
    if name in JSON_TEXT:
        return b"[" + b",".join(items) + b"]"
    return b"\xdd" + struct.pack(">I", len(items)) + b"".join(items)


@pytest.mark.parametrize("name", SCANNED)
def test_a_megabyte_of_empty_containers_is_refused_before_it_is_built(name: str) -> None:
    empty = b"[]" if name in JSON_TEXT else b"\x80"  # JSON empty lists, msgpack empty maps
    data = with_extra(name, _array(name, [empty] * (1 << 20 if name in MSGPACK else 350_000)))
    assert len(data) >= 1_000_000
    with peak_memory(2 << 20), pytest.raises(ElementBudgetError) as info:
        ic.get(name, extensions=True).decode(data, ic.TokenChunk)
    assert info.value.max_elements == DEFAULT_MAX_ELEMENTS


@pytest.mark.parametrize("name", SCANNED)
def test_the_element_budget_is_exact_and_configurable(name: str) -> None:
    base = ic.get(name, extensions=True).encode(CHUNK)
    elements = _elements(msgpack.unpackb(base) if name in MSGPACK else _json(base))
    # the unknown key and its array are 2 elements; each item one more
    items = 40
    data = with_extra(name, _array(name, [b"0"] * items))
    total = elements + 2 + items
    assert ic.get(name, max_elements=total, extensions=True).decode(data, ic.TokenChunk) == CHUNK
    with pytest.raises(ElementBudgetError):
        ic.get(name, max_elements=total - 1, extensions=True).decode(data, ic.TokenChunk)


def _json(data: bytes) -> Any:
    import json

    return json.loads(data)


def _elements(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + sum(1 + _elements(v) for v in value.values())
    if isinstance(value, list):
        return 1 + sum(_elements(v) for v in value)
    return 1


def test_protobuf_counts_repeated_entries_against_the_budget() -> None:
    many = ic.TokenChunk(**{**_fields(CHUNK), "token_ids": tuple(range(200, 1200))})
    codec = ic.get("protobuf", max_elements=500, extensions=True)
    data = codec.encode(many)
    assert len(data) > 500
    with pytest.raises(ElementBudgetError):
        codec.decode(data, ic.TokenChunk)
    assert (
        ic.get("protobuf", max_elements=1000, extensions=True).decode(data, ic.TokenChunk) == many
    )


def test_a_megabyte_of_empty_protobuf_logprobs_is_refused() -> None:
    # logprobs { content { } content { } ... }: two bytes per TokenLogprob object
    content = pbwire.length_delimited(1, b"") * 500_000
    data = ic.get("protobuf", extensions=True).encode(CHUNK) + pbwire.length_delimited(8, content)
    probe = pb.TokenChunk.FromString(data)
    assert len(probe.logprobs.content) == 500_000  # field 8 is logprobs: the input means it
    with pytest.raises(ElementBudgetError):
        ic.get("protobuf", extensions=True).decode(data, ic.TokenChunk)


@pytest.mark.parametrize("pure_python", [False, True])
def test_delta_frames_longer_than_the_budget_are_refused_from_their_length(
    pure_python: bool,
) -> None:
    codec = ic.get("delta", pure_python=pure_python, max_elements=4096, extensions=True)
    encoder = codec.stream_encoder()
    first = encoder.encode(CHUNK)
    decoder = codec.stream_decoder()
    decoder.feed(first)
    # a frame length of 1 MiB + 1, and nothing after it: refused from the header
    with pytest.raises(ic.FrameTooLargeError):
        decoder.feed(pbwire.varint((1 << 20) + 1))


# -- length headers that lie -----------------------------------------------------------------


LYING: dict[str, Callable[[], bytes]] = {
    "msgpack array32 of 2**32-1": lambda: b"\xdd\xff\xff\xff\xff" + b"\x90" * 16,
    "msgpack map32 of 2**32-1": lambda: b"\xdf\xff\xff\xff\xff" + b"\xa1a\x90" * 8,
    "msgpack str32 of 4 GiB": lambda: b"\xdb\xff\xff\xff\xffabc",
    "msgpack bin32 of 4 GiB": lambda: b"\xc6\xff\xff\xff\xffabc",
}


@pytest.mark.parametrize("name", MSGPACK)
@pytest.mark.parametrize("case", sorted(LYING))
def test_msgpack_lying_headers_are_refused_from_the_header(name: str, case: str) -> None:
    data = with_extra(name, LYING[case]())
    with peak_memory(1 << 20), pytest.raises(ic.DecodeError):
        ic.get(name, extensions=True).decode(data, ic.TokenChunk)
    with peak_memory(1 << 20), pytest.raises(ic.DecodeError):
        ic.get(name, extensions=True).decode(LYING[case](), ic.TokenChunk)


@pytest.mark.parametrize("length", [2**31, 2**32 - 1, 2**63])
def test_protobuf_lengths_past_the_input_are_refused(length: int) -> None:
    for field in (1, 6, 8):  # id (string), token_ids (packed), logprobs (message)
        data = pbwire.key(field, 2) + pbwire.varint(length) + b"abc"
        with peak_memory(1 << 20), pytest.raises(ic.DecodeError):
            ic.get("protobuf", extensions=True).decode(data, ic.TokenChunk)


@pytest.mark.parametrize("name", ic.names())
def test_a_frame_claiming_four_gibibytes_is_refused_from_its_header(name: str) -> None:
    codec = ic.get(name, extensions=True)
    decoder = codec.stream_decoder()
    if name == "delta":
        decoder.feed(codec.stream_encoder().encode(CHUNK))
        claim = pbwire.varint((4 << 30) + 1)
    elif codec.framing == "length-prefixed":
        claim = struct.pack(">I", 0xFFFFFFFF)
    else:  # SSE: a line that never ends is bounded by the same limit
        pytest.skip("text framing has no length header (its line limit is tested in test_framing)")
    with peak_memory(1 << 20), pytest.raises(ic.FrameTooLargeError):
        decoder.feed(claim + b"\x00" * 64)


# -- numbers and text, decode side -----------------------------------------------------------

CHUNK_JSON = (
    '{"id":"x","object":"chat.completion.chunk","created":1,"model":"m","seq":0,'
    '"choices":[{"index":0,"delta":{"content":%s},"logprobs":%s,"finish_reason":null,'
    '"token_ids":[7]}]}'
)
LOGPROB = '{"content":[{"token":"a","logprob":%s,"bytes":[97],"top_logprobs":[]}]}'


def _json_chunk(text: str = '"a"', logprob: str | None = None) -> bytes:
    return (CHUNK_JSON % (text, "null" if logprob is None else LOGPROB % logprob)).encode()


@pytest.mark.parametrize("name", JSON_TEXT)
@pytest.mark.parametrize("number", ["1e400", "-1e400", "NaN", "Infinity", "-Infinity"])
def test_json_numbers_past_a_double_are_refused_never_infinity(name: str, number: str) -> None:
    with pytest.raises(ic.DecodeError):
        ic.get(name, extensions=True).decode(_json_chunk(logprob=number), ic.TokenChunk)


@pytest.mark.parametrize("name", JSON_TEXT)
def test_json_negative_zero_keeps_its_sign(name: str) -> None:
    chunk = ic.get(name, extensions=True).decode(_json_chunk(logprob="-0.0"), ic.TokenChunk)
    assert chunk.logprobs is not None
    assert struct.pack("<d", chunk.logprobs[0].logprob) == struct.pack("<d", -0.0)


@pytest.mark.parametrize("name", JSON_TEXT)
@pytest.mark.parametrize("escape", ["\\ud800", "\\udfff", "a\\ud83d", "\\ude00b"])
def test_json_lone_surrogate_escapes_are_refused(name: str, escape: str) -> None:
    with pytest.raises(ic.DecodeError):
        ic.get(name, extensions=True).decode(_json_chunk(text=f'"{escape}"'), ic.TokenChunk)


@pytest.mark.parametrize("name", JSON_TEXT)
def test_json_a_surrogate_pair_is_one_character(name: str) -> None:
    chunk = ic.get(name, extensions=True).decode(
        _json_chunk(text='"\\ud83d\\ude00"'), ic.TokenChunk
    )
    assert chunk.text == "\U0001f600"


@pytest.mark.parametrize("name", JSON_TEXT)
def test_json_raw_control_characters_are_refused_escaped_nul_is_text(name: str) -> None:
    with pytest.raises(ic.DecodeError):
        ic.get(name, extensions=True).decode(_json_chunk(text='"a\x00b"'), ic.TokenChunk)
    assert (
        ic.get(name, extensions=True).decode(_json_chunk(text='"a\\u0000b"'), ic.TokenChunk).text
        == "a\x00b"
    )


@pytest.mark.parametrize(
    "name", [n for n in ic.names() if ic.TokenChunk in ic.get(n, extensions=True).types]
)
def test_nul_is_text_like_any_other_character(name: str) -> None:
    codec = ic.get(name, extensions=True)
    chunk = ic.TokenChunk(**{**_fields(CHUNK), "text": "a\x00b", "id": "\x00"})
    if name == "delta":
        encoder, decoder = codec.stream_encoder(), codec.stream_decoder()
        (decoded,) = decoder.feed(encoder.encode(chunk) + encoder.end())
    else:
        decoded = codec.decode(codec.encode(chunk), ic.TokenChunk)
    assert decoded == chunk


# two bytes each, to stand in for "hi": not UTF-8, overlong "/", cut short, half a surrogate
INVALID_UTF8 = [b"\xff\xfe", b"\xc0\xaf", b"a\xe2", b"\xed\xa0"]


def _text_bytes_swapped(name: str, raw: bytes) -> bytes:
    """The chunk encoded by ``name`` with its text field's bytes ("hi") replaced by ``raw``
    (same length, so every length header stays right)."""
    data = ic.get(name, extensions=True).encode(CHUNK)
    assert data.count(b"hi") == 1
    return data.replace(b"hi", raw)


@pytest.mark.parametrize("name", [*JSON_TEXT, *MSGPACK, "protobuf", "flatbuffers"])
@pytest.mark.parametrize("raw", INVALID_UTF8)
def test_invalid_utf8_is_refused_by_every_codec(name: str, raw: bytes) -> None:
    data = _text_bytes_swapped(name, raw)
    with pytest.raises(ic.DecodeError):
        ic.get(name, extensions=True).decode(
            data, ic.TokenChunk
        )  # the FlatBuffers verifier reads text too


def test_invalid_utf8_in_a_delta_stream_is_refused() -> None:
    for pure in (False, True):
        codec = ic.get("delta", pure_python=pure, extensions=True)
        data = codec.stream_encoder().encode(CHUNK)
        assert data.count(b"hi") == 1
        for raw in INVALID_UTF8:
            with pytest.raises(ic.DecodeError):
                codec.stream_decoder().feed(data.replace(b"hi", raw))


def test_duplicate_keys_the_last_one_wins_in_every_keyed_format() -> None:
    """The documented policy: a key sent twice keeps its last value, as every one of these
    parsers does by itself and as protobuf does for a singular field sent twice."""
    for name in JSON_TEXT:
        data = (
            ic.get(name, extensions=True)
            .encode(CHUNK)
            .replace(b'{"id":"chatcmpl-1"', b'{"id":"a","id":"b"')
        )
        assert ic.get(name, extensions=True).decode(data, ic.TokenChunk).id == "b"
    for name in MSGPACK:
        obj = msgpack.unpackb(ic.get(name, extensions=True).encode(CHUNK))
        body = b"".join(msgpack.packb(k) + msgpack.packb(v) for k, v in obj.items())
        data = bytes([0x80 | (len(obj) + 1)]) + msgpack.packb("id") + msgpack.packb("a") + body
        data = data.replace(msgpack.packb("chatcmpl-1"), msgpack.packb("b" * 10))
        assert ic.get(name, extensions=True).decode(data, ic.TokenChunk).id == "b" * 10
    data = ic.get("protobuf", extensions=True).encode(CHUNK) + pbwire.length_delimited(1, b"last")
    assert ic.get("protobuf", extensions=True).decode(data, ic.TokenChunk).id == "last"


# -- protobuf policy -------------------------------------------------------------------------


def test_protobuf_unknown_fields_are_skipped() -> None:
    data = ic.get("protobuf", extensions=True).encode(CHUNK)
    extra = (
        pbwire.key(99, 0)
        + pbwire.varint(5)
        + pbwire.length_delimited(100, b"anything")
        + pbwire.key(101, 5)
        + b"\x00" * 4
        + pbwire.key(102, 1)
        + b"\x00" * 8
    )
    assert ic.get("protobuf", extensions=True).decode(extra + data + extra, ic.TokenChunk) == CHUNK


def test_protobuf_a_known_field_with_the_wrong_wire_type_is_skipped_as_unknown() -> None:
    data = ic.get("protobuf", extensions=True).encode(CHUNK)
    # id (field 1, a string) sent as a varint: the id sent as a string after it still counts
    assert (
        ic.get("protobuf", extensions=True).decode(pbwire.key(1, 0) + b"\x07" + data, ic.TokenChunk)
        == CHUNK
    )
    # and if it is the only id, the field keeps its default, as every protobuf reader does
    alone = pb.TokenChunk.FromString(data)
    alone.ClearField("id")
    decoded = ic.get("protobuf", extensions=True).decode(
        pbwire.key(1, 0) + b"\x07" + alone.SerializeToString(), ic.TokenChunk
    )
    assert decoded.id == ""


@pytest.mark.parametrize(
    "bad",
    [
        pytest.param(pbwire.key(1, 2) + b"\x05ab", id="length past the end"),
        pytest.param(pbwire.key(1, 6), id="wire type 6"),
        pytest.param(pbwire.key(1, 7), id="wire type 7"),
        pytest.param(pbwire.key(100, 4), id="end group without a start"),
        pytest.param(b"\x00\x01", id="field number 0"),
        pytest.param(pbwire.key(1, 0) + b"\xff" * 11, id="varint of 11 bytes"),
    ],
)
def test_protobuf_malformed_wire_data_is_refused(bad: bytes) -> None:
    data = ic.get("protobuf", extensions=True).encode(CHUNK)
    with pytest.raises(ic.DecodeError):
        ic.get("protobuf", extensions=True).decode(data + bad, ic.TokenChunk)


# -- options ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", SCANNED)
@pytest.mark.parametrize("option", [{"max_depth": 0}, {"max_elements": 0}, {"max_depth": 1.5}])
def test_limits_that_cannot_be_met_are_refused(name: str, option: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="positive"):
        ic.get(name, **option)


def test_the_tensor_header_is_held_to_the_json_limits() -> None:
    from inferwire.codecs.tensor_codec import MAGIC

    header = b'{"model_name":"m","id":"r","inputs":[],"zz":' + b"[]," * 400_000 + b"[]}"
    data = MAGIC + struct.pack("<I", len(header)) + header
    with peak_memory(2 << 20), pytest.raises(ElementBudgetError):
        ic.get("tensor", extensions=True).decode(data, ic.InferRequest)
    deep = b'{"model_name":"m","id":"r","inputs":[],"zz":' + nested("json", 600) + b"}"
    with pytest.raises(DepthLimitError):
        ic.get("tensor", extensions=True).decode(
            MAGIC + struct.pack("<I", len(deep)) + deep, ic.InferRequest
        )
    shallow = b'{"model_name":"m","id":"r","inputs":[],"zz":' + nested("json", 500) + b"}"
    request = ic.get("tensor", extensions=True).decode(
        MAGIC + struct.pack("<I", len(shallow)) + shallow, ic.InferRequest
    )
    assert request == ic.InferRequest(model="m", id="r", inputs=())


@pytest.mark.parametrize("name", [*JSON_TEXT, "protobuf"])
def test_a_memoryview_of_wide_items_is_measured_in_bytes(name: str) -> None:
    """``len`` of a memoryview of 8-byte items is an eighth of its bytes: the limits must not
    take it for short input that cannot break them."""
    if name == "protobuf":
        data = b""
        for last in range(1000, 1008):  # a length that is a whole number of 8-byte items
            many = ic.TokenChunk(**{**_fields(CHUNK), "token_ids": tuple(range(200, last))})
            data = ic.get(name, extensions=True).encode(many)
            if len(data) % 8 == 0:
                break
        view = memoryview(data).cast("Q")
        codec = ic.get(
            name, max_elements=500, extensions=True
        )  # 800+ token ids, ~1,650 bytes, ~206 items
        assert len(view) < 500 < len(many.token_ids)
        with pytest.raises(ElementBudgetError):
            codec.decode(view, ic.TokenChunk)
        return
    deep = b"[" * 256 + b"]" * 256
    with pytest.raises(DepthLimitError):
        ic.get(name, max_depth=64, extensions=True).decode(
            memoryview(deep).cast("Q"), ic.TokenChunk
        )
