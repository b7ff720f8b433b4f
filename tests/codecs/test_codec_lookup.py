"""Codec lookup (``ic.names``, ``ic.get``) and the surface every codec keeps: names, errors, what
each codec carries."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import inferwire.codecs as ic

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


def test_options_make_a_new_codec() -> None:
    ndjson = ic.get("orjson", framing="ndjson")
    assert ndjson is not ic.get("orjson")
    assert ndjson.name == "orjson"
    assert ic.get("orjson", framing="ndjson") is not ndjson


def test_error_hierarchy() -> None:
    assert issubclass(ic.EncodeError, ic.CodecError)
    assert issubclass(ic.DecodeError, ic.CodecError)
    assert issubclass(ic.DecodeError, ValueError)
    assert issubclass(ic.UnknownCodecError, ic.CodecError)
    assert issubclass(ic.UnknownCodecError, KeyError)
    for specific in (
        ic.FrameTooLargeError,
        ic.IncompleteStreamError,
        ic.VerificationError,
        ic.BadMagicError,
        ic.SequenceError,
        ic.UnknownSchemaError,
    ):
        assert issubclass(specific, ic.DecodeError)
    for sequence in (ic.SequenceGapError, ic.DuplicateFrameError, ic.ReorderedFrameError):
        assert issubclass(sequence, ic.SequenceError)
    # Schema errors share a root; only an unknown id is also bad input. An unreachable registry
    # is not: the bytes may be fine, and the caller may retry.
    for schema_error in (
        ic.UnknownSchemaError,
        ic.IncompatibleSchemaError,
        ic.SchemaRegistryUnavailableError,
        ic.CorruptRegistryError,
    ):
        assert issubclass(schema_error, ic.SchemaError)
        assert issubclass(schema_error, ic.CodecError)
    for not_bad_input in (
        ic.IncompatibleSchemaError,
        ic.SchemaRegistryUnavailableError,
        ic.CorruptRegistryError,
    ):
        assert not issubclass(not_bad_input, ic.DecodeError)
    assert ic.SchemaRegistryUnavailableError.retriable
    unknown = ic.UnknownSchemaError(7)
    assert unknown.schema_id == 7
    assert "7" in str(unknown)
    gap = ic.SequenceGapError("gap", expected=3, received=5)
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
