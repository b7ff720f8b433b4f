"""Codec lookup (``ic.names``, ``ic.get``) and the surface every codec keeps: names, errors, what
each codec carries."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import inferwire.codecs as ic
from inferwire.codecs.errors import (
    BadMagicError,
    CorruptRegistryError,
    DuplicateFrameError,
    IncompatibleSchemaError,
    ReorderedFrameError,
    SchemaError,
    SchemaRegistryUnavailableError,
    SequenceError,
    SequenceGapError,
    VerificationError,
)

NAMES = ic.names()
JSON_CODECS = ["json", "orjson", "msgspec-json"]

CHUNK = ic.TokenChunk(id="c", model="m", created=1, index=0, seq=0, token_ids=(1,), text="a")
TENSOR = ic.Tensor(name="t", datatype="FP32", shape=(1,), data=np.ones(1, np.float32))
EMBEDDINGS = ic.EmbeddingBatch(model="m", vectors=np.ones((1, 2), np.float32))
REQUEST = ic.InferRequest(model="m", id="r", inputs=(TENSOR,))


def test_names_are_the_registered_codecs_in_a_stable_order() -> None:
    assert ic.names() == [
        "json",
        "orjson",
        "msgpack",
        "msgspec-json",
        "msgspec-msgpack",
        "protobuf",
        "flatbuffers",
        "tensor",
        "delta",
    ]
    assert ic.names() is not ic.names()  # a copy: callers cannot change the codec list


@pytest.mark.parametrize("name", NAMES)
def test_get_returns_one_shared_codec_per_name(name: str) -> None:
    codec = ic.get(name)
    assert isinstance(codec, ic.Codec)
    assert codec.name == name
    assert ic.get(name) is codec
    assert name in repr(codec)
    assert codec.media_type
    assert codec.stream_media_type
    assert codec.types
    assert codec.types <= {ic.TokenChunk, ic.EmbeddingBatch, ic.InferRequest, ic.InferResponse}


@pytest.mark.parametrize("name", NAMES)
def test_stream_media_type_names_the_framing(name: str) -> None:
    codec = ic.get(name)
    if name in JSON_CODECS:
        assert codec.media_type == "application/json"
        assert codec.stream_media_type == "text/event-stream"
    elif name == "delta":  # its own framing: a header naming the schema, then varint frames
        assert codec.media_type == codec.stream_media_type == "application/vnd.inferwire.delta"
    else:
        assert codec.stream_media_type.startswith("application/vnd.inferwire.frames+")


def test_what_each_codec_carries() -> None:
    everything = {ic.TokenChunk, ic.EmbeddingBatch, ic.InferRequest, ic.InferResponse}
    expected = {"tensor": everything - {ic.TokenChunk}, "delta": {ic.TokenChunk}}
    for name in NAMES:
        assert ic.get(name).types == expected.get(name, everything), name


@pytest.mark.parametrize("name", ["", "JSON", "proto", "json ", "avro"])
def test_unknown_codec_name(name: str) -> None:
    with pytest.raises(ic.UnknownCodecError) as info:
        ic.get(name)
    assert isinstance(info.value, KeyError)
    assert isinstance(info.value, ic.CodecError)
    message = str(info.value)
    assert repr(name) in message
    for known in NAMES:
        assert known in message
    with pytest.raises(ic.UnknownCodecError):
        ic.get(name, framing="ndjson")


TOP_LEVEL = [
    "Codec",
    "CodecError",
    "DecodeError",
    "EmbeddingBatch",
    "EncodeError",
    "FrameTooLargeError",
    "IncompleteStreamError",
    "InferRequest",
    "InferResponse",
    "Message",
    "Tensor",
    "TokenChunk",
    "TokenLogprob",
    "TopLogprob",
    "UnknownCodecError",
    "UnknownSchemaError",
    "Usage",
    "get",
    "names",
    "names_for",
]


def test_the_top_level_is_what_a_user_of_a_codec_needs() -> None:
    assert ic.__all__ == TOP_LEVEL
    for name in TOP_LEVEL:
        assert getattr(ic, name) is not None
    # the rest lives in submodules
    for gone in ("SchemaRegistry", "StreamVerifier", "StreamEncoder", "BytesLike", "DATATYPES"):
        assert not hasattr(ic, gone), gone


def test_what_left_the_top_level_is_in_its_submodule() -> None:
    from inferwire.codecs import base, errors, framing, integrity, model, schema_registry

    assert framing.DEFAULT_MAX_FRAME_BYTES == 64 * 1024 * 1024
    assert (base.DEFAULT_MAX_DEPTH, base.DEFAULT_MAX_ELEMENTS) == (512, 1 << 18)
    assert "FP32" in model.DATATYPES
    assert issubclass(errors.SequenceGapError, ic.DecodeError)
    for module, name in [
        (framing, "StreamEncoder"),
        (framing, "StreamDecoder"),
        (framing, "BytesLike"),
        (integrity, "StreamVerifier"),
        (schema_registry, "SchemaRegistry"),
        (schema_registry, "CachingResolver"),
    ]:
        assert hasattr(module, name), name


def test_the_same_options_give_the_same_codec() -> None:
    ndjson = ic.get("orjson", framing="ndjson")
    assert ndjson is not ic.get("orjson")
    assert ndjson.name == "orjson"
    assert ndjson.framing == "ndjson"
    assert ic.get("orjson", framing="ndjson") is ndjson
    assert ic.get("orjson", extensions=True, framing="ndjson") is not ndjson
    # the order of the options does not matter, their types do
    both = ic.get("orjson", framing="ndjson", extensions=True)
    assert ic.get("orjson", extensions=True, framing="ndjson") is both
    with pytest.raises(ValueError, match="extensions must be True or False"):
        ic.get("orjson", extensions=1)


def test_an_option_that_is_an_object_gives_a_new_codec() -> None:
    from inferwire.codecs.schema_registry import SchemaRegistry

    registry = SchemaRegistry()
    first = ic.get("delta", registry=registry)
    assert ic.get("delta", registry=registry) is not first  # the registry may change


@pytest.mark.parametrize("name", NAMES)
def test_a_shared_codec_gives_each_stream_its_own_encoder_and_decoder(name: str) -> None:
    codec = ic.get(name, extensions=True)
    assert codec.stream_encoder() is not codec.stream_encoder()
    assert codec.stream_decoder() is not codec.stream_decoder()
    assert codec.message_decoder() is not codec.message_decoder()


@pytest.mark.parametrize("name", JSON_CODECS)
def test_a_decode_function_numbers_only_its_own_stream(name: str) -> None:
    # without extensions a chunk's seq is its place in the stream: each function counts anew
    codec = ic.get(name)
    data = codec.encode(CHUNK)
    first, second = codec.decode_function(), codec.decode_function(ic.TokenChunk)
    assert [first(data).seq, first(data).seq, second(data).seq] == [0, 1, 0]
    assert (
        ic.get(name, extensions=True).decode_function()(ic.get(name, extensions=True).encode(CHUNK))
        == CHUNK
    )


@pytest.mark.parametrize("name", NAMES)
def test_every_codec_takes_the_extensions_option(name: str) -> None:
    assert ic.get(name, extensions=True).extensions is True
    if name in JSON_CODECS:
        assert ic.get(name).extensions is False
        assert ic.get(name, extensions=False).extensions is False
    else:
        assert ic.get(name).extensions is True
        with pytest.raises(ValueError, match="always carries"):
            ic.get(name, extensions=False)


def test_error_hierarchy() -> None:
    assert issubclass(ic.EncodeError, ic.CodecError)
    assert issubclass(ic.DecodeError, ic.CodecError)
    assert issubclass(ic.DecodeError, ValueError)
    assert issubclass(ic.UnknownCodecError, ic.CodecError)
    assert issubclass(ic.UnknownCodecError, KeyError)
    for specific in (
        ic.FrameTooLargeError,
        ic.IncompleteStreamError,
        VerificationError,
        BadMagicError,
        SequenceError,
        ic.UnknownSchemaError,
    ):
        assert issubclass(specific, ic.DecodeError)
    for sequence in (SequenceGapError, DuplicateFrameError, ReorderedFrameError):
        assert issubclass(sequence, SequenceError)
    # Schema errors share a root; only an unknown id is also bad input. An unreachable registry
    # is not: the bytes may be fine, and the caller may retry.
    for schema_error in (
        ic.UnknownSchemaError,
        IncompatibleSchemaError,
        SchemaRegistryUnavailableError,
        CorruptRegistryError,
    ):
        assert issubclass(schema_error, SchemaError)
        assert issubclass(schema_error, ic.CodecError)
    for not_bad_input in (
        IncompatibleSchemaError,
        SchemaRegistryUnavailableError,
        CorruptRegistryError,
    ):
        assert not issubclass(not_bad_input, ic.DecodeError)
    assert SchemaRegistryUnavailableError.retriable
    unknown = ic.UnknownSchemaError(7)
    assert unknown.schema_id == 7
    assert "7" in str(unknown)
    gap = SequenceGapError("gap", expected=3, received=5)
    assert (gap.expected, gap.received) == (3, 5)
    error = ic.FrameTooLargeError(2**32 - 1, 1024)
    assert (error.declared_bytes, error.max_frame_bytes) == (2**32 - 1, 1024)
    assert str(2**32 - 1) in str(error)


# Values that are not a top-level message of the model.
NOT_MESSAGES = [
    pytest.param({}, id="dict"),
    pytest.param(None, id="none"),
    pytest.param("text", id="str"),
    pytest.param(b"bytes", id="bytes"),
    pytest.param([CHUNK], id="list-of-chunk"),
    pytest.param(TENSOR, id="tensor"),
    pytest.param(ic.Usage(prompt_tokens=1, completion_tokens=1), id="usage"),
    pytest.param(ic.TokenLogprob(token="a", logprob=0.0), id="token-logprob"),
    pytest.param(np.ones(3, np.float32), id="ndarray"),
]


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("value", NOT_MESSAGES)
def test_encoding_a_value_that_is_not_a_message(name: str, value: Any) -> None:
    codec = ic.get(name)
    with pytest.raises(ic.EncodeError):
        codec.encode(value)
    encoder = codec.stream_encoder()
    with pytest.raises(ic.EncodeError):
        encoder.encode(value)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("message", [CHUNK, EMBEDDINGS, REQUEST], ids=lambda m: type(m).__name__)
def test_encoding_a_model_type_the_codec_does_not_carry(name: str, message: Any) -> None:
    codec = ic.get(name)
    if type(message) in codec.types:
        assert codec.encode(message)
    else:
        with pytest.raises(ic.EncodeError, match=type(message).__name__):
            codec.encode(message)
        with pytest.raises(ic.EncodeError, match=type(message).__name__):
            codec.stream_encoder().encode(message)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize(
    "type_", [dict, str, ic.Tensor, ic.Usage, ic.TokenLogprob, ic.Codec], ids=lambda t: t.__name__
)
def test_decoding_into_a_type_the_codec_does_not_carry(name: str, type_: type[Any]) -> None:
    codec = ic.get(name)
    message = CHUNK if ic.TokenChunk in codec.types else EMBEDDINGS
    data = codec.encode(message)
    with pytest.raises(ic.DecodeError):
        codec.decode(data, type_)
    frame = codec.stream_encoder().encode(message)
    # refused when the decoder is made (it knows its codec cannot) or at the first frame
    with pytest.raises(ic.DecodeError):  # noqa: PT012
        decoder = codec.stream_decoder(type_)
        decoder.feed(frame)


def test_tensor_codec_cannot_decode_token_chunks() -> None:
    codec = ic.get("tensor")
    with pytest.raises(ic.DecodeError):
        codec.decode(codec.encode(REQUEST), ic.TokenChunk)
