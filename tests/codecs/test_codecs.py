"""Every codec x every payload: round trips, the float and integer rules, and bad input.

Round trips are checked on the seeded workloads and, with hypothesis, over the whole model.
Bad input (every strict prefix, single-byte corruptions) must give a ``DecodeError`` or a
well-formed value: never another exception type.
"""

from __future__ import annotations

import dataclasses
import math
import random
import re
import struct
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import inferwire.codecs as ic
from inferwire import workloads
from inferwire.codecs.model import DATATYPES
from inferwire.codecs.tensor_codec import ALIGNMENT, TensorCodec

NAMES = ic.names()
JSON_CODECS = [n for n in NAMES if ic.get(n, extensions=True).media_type == "application/json"]
BINARY_CODECS = [n for n in NAMES if n not in JSON_CODECS]
CHUNK_CODECS = [n for n in NAMES if ic.TokenChunk in ic.get(n, extensions=True).types]
TENSOR_CODECS = [n for n in NAMES if ic.InferRequest in ic.get(n, extensions=True).types]


def _carries(codec: str, workload: str) -> bool:
    return type(workloads.get(workload).messages()[0]) in ic.get(codec, extensions=True).types


PAIRS = [(c, w) for w in workloads.names() for c in NAMES if _carries(c, w)]
STREAM_PAIRS = [(c, w) for c, w in PAIRS if workloads.get(w).kind == "stream"]
UNARY_PAIRS = [(c, w) for c, w in PAIRS if workloads.get(w).kind != "stream"]


def as_model(value: Any) -> Any:
    """A zero-copy view as the plain model object it stands for; anything else as is."""
    return value.materialize() if hasattr(value, "materialize") else value


def float_bits(message: Any) -> list[bytes]:
    """The bits of every logprob, in order: ``==`` cannot tell -0.0 from 0.0, nor NaNs apart."""
    out = []
    for lp in message.logprobs or ():
        out.append(struct.pack("<d", lp.logprob))
        out += [struct.pack("<d", t.logprob) for t in lp.top]
    return out


def _check_tensor(tensor: Any) -> None:
    assert type(tensor) is ic.Tensor
    assert type(tensor.name) is str
    assert tensor.datatype in DATATYPES
    assert type(tensor.shape) is tuple
    assert all(type(d) is int and d >= 0 for d in tensor.shape)
    assert isinstance(tensor.data, np.ndarray)
    assert tensor.data.dtype == DATATYPES[tensor.datatype]
    assert tensor.data.shape == tensor.shape
    if tensor.datatype == "BYTES":
        assert all(type(e) is bytes for e in tensor.data.flat)


def check_well_formed(value: Any) -> None:
    """Every field of a decoded value has its declared type (a view is read through)."""
    message = as_model(value)
    if isinstance(message, ic.TokenChunk):
        for text in (message.id, message.model, message.text):
            assert type(text) is str
        for number in (message.created, message.index, message.seq):
            assert type(number) is int
        assert type(message.token_ids) is tuple
        assert all(type(t) is int for t in message.token_ids)
        if message.logprobs is not None:
            assert type(message.logprobs) is tuple
            for lp in message.logprobs:
                assert type(lp.token) is str
                assert type(lp.logprob) is float
                assert type(lp.top) is tuple
                assert all(type(t.token) is str and type(t.logprob) is float for t in lp.top)
        assert message.finish_reason is None or type(message.finish_reason) is str
    elif isinstance(message, ic.EmbeddingBatch):
        assert type(message.model) is str
        assert message.vectors.dtype == np.float32
        assert message.vectors.ndim == 2
    elif isinstance(message, ic.InferRequest | ic.InferResponse):
        assert type(message.model) is str
        assert type(message.id) is str
        tensors = message.inputs if isinstance(message, ic.InferRequest) else message.outputs
        assert type(tensors) is tuple
        for tensor in tensors:
            _check_tensor(tensor)
    else:
        pytest.fail(f"decoded a {type(message).__name__}")
    usage = getattr(message, "usage", None)
    if usage is not None:
        assert type(usage.prompt_tokens) is int
        assert type(usage.completion_tokens) is int


def round_trip(codec: ic.Codec, message: Any) -> Any:
    decoded = codec.decode(codec.encode(message), type(message))
    check_well_formed(decoded)
    return decoded


# -- the workloads -------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "workload"), PAIRS)
def test_every_workload_message_round_trips(name: str, workload: str) -> None:
    codec = ic.get(name, extensions=True)
    for message in workloads.get(workload).messages():
        decoded = round_trip(codec, message)
        assert decoded == message
        assert as_model(decoded) == message
        if isinstance(message, ic.TokenChunk):
            assert float_bits(as_model(decoded)) == float_bits(message)


@pytest.mark.parametrize(("name", "workload"), PAIRS)
@pytest.mark.parametrize("form", [bytes, bytearray, memoryview])
def test_decode_accepts_any_bytes_like(name: str, workload: str, form: type[Any]) -> None:
    codec = ic.get(name, extensions=True)
    message = workloads.get(workload).messages()[-1]
    assert codec.decode(form(codec.encode(message)), type(message)) == message


def encode_stream(codec: ic.Codec, messages: list[Any]) -> list[bytes]:
    """The frames of a stream, its end marker last."""
    encoder = codec.stream_encoder()
    return [*(encoder.encode(m) for m in messages), encoder.end()]


def random_splits(data: bytes, rng: random.Random, largest: int) -> Iterator[bytes]:
    pos = 0
    while pos < len(data):
        size = rng.randint(1, largest)
        yield data[pos : pos + size]
        pos += size


@pytest.mark.parametrize(("name", "workload"), STREAM_PAIRS)
def test_every_stream_workload_round_trips(name: str, workload: str) -> None:
    codec = ic.get(name, extensions=True)
    messages = workloads.get(workload).messages()
    frames = encode_stream(codec, messages)
    data = b"".join(frames)
    feeds = {
        "frame by frame": frames,
        "all at once": [data],
        "random splits": list(random_splits(data, random.Random(workload), 4096)),
    }
    for how, pieces in feeds.items():
        decoder = codec.stream_decoder(ic.TokenChunk)
        decoded = []
        for piece in pieces:
            decoded += decoder.feed(piece)
        assert decoder.finished, how
        decoder.close()
        assert decoded == messages, how
        assert [float_bits(as_model(c)) for c in decoded] == [float_bits(m) for m in messages]


@pytest.mark.parametrize(("name", "workload"), UNARY_PAIRS)
def test_unary_workloads_stream_too(name: str, workload: str) -> None:
    codec = ic.get(name, extensions=True)
    (message,) = workloads.get(workload).messages()
    decoder = codec.stream_decoder(type(message))
    decoded = []
    for frame in encode_stream(codec, [message, message]):
        decoded += decoder.feed(frame)
    decoder.close()
    assert decoded == [message, message]


# -- the whole model, with hypothesis ------------------------------------------------------

texts = st.text(max_size=12)
u32 = st.integers(0, 2**32 - 1)
finite = st.floats(allow_nan=False, allow_infinity=False)
SIGNALING_NAN = struct.unpack("<d", b"\x01\x00\x00\x00\x00\x00\xf0\x7f")[0]
# hypothesis draws non-finite values rarely inside nested lists: offer them directly too
any_float = st.floats() | st.sampled_from([math.nan, -math.nan, SIGNALING_NAN, math.inf, -math.inf])


def token_logprobs(floats: st.SearchStrategy[float]) -> st.SearchStrategy[ic.TokenLogprob]:
    top = st.builds(ic.TopLogprob, token=texts, logprob=floats)
    return st.builds(
        ic.TokenLogprob, token=texts, logprob=floats, top=st.lists(top, max_size=3).map(tuple)
    )


def token_chunks(floats: st.SearchStrategy[float] = finite) -> st.SearchStrategy[ic.TokenChunk]:
    """Chunks within the ranges every codec carries (uint32 ids, int64 created, ...)."""
    return st.builds(
        ic.TokenChunk,
        id=texts,
        model=texts,
        created=st.integers(-(2**63), 2**63 - 1),
        index=u32,
        seq=st.integers(0, 2**64 - 1),
        token_ids=st.lists(u32, max_size=6).map(tuple),
        text=st.text(),
        logprobs=st.none() | st.lists(token_logprobs(floats), max_size=3).map(tuple),
        finish_reason=st.none() | texts,
        usage=st.none() | st.builds(ic.Usage, prompt_tokens=u32, completion_tokens=u32),
    )


shapes = hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=3)
bytes_elements = st.binary(max_size=6) | st.text(max_size=4).map(str.encode)


@st.composite
def tensors(draw: st.DrawFn) -> ic.Tensor:
    datatype = draw(st.sampled_from(sorted(DATATYPES)))
    shape = draw(shapes)
    if datatype == "BYTES":
        count = math.prod(shape)
        data = np.empty(count, dtype=object)
        data[:] = draw(st.lists(bytes_elements, min_size=count, max_size=count))
        data = data.reshape(shape)
    else:
        data = draw(hnp.arrays(DATATYPES[datatype], shape))
    return ic.Tensor(name=draw(texts), datatype=datatype, shape=shape, data=data)


tensor_lists = st.lists(tensors(), max_size=3).map(tuple)
infer_messages = st.builds(ic.InferRequest, model=texts, id=texts, inputs=tensor_lists) | st.builds(
    ic.InferResponse, model=texts, id=texts, outputs=tensor_lists
)
embedding_batches = st.builds(
    ic.EmbeddingBatch,
    model=texts,
    vectors=hnp.arrays(
        np.float32, st.tuples(st.integers(1, 3), st.integers(0, 5)), elements=st.floats(width=32)
    ),
    usage=st.none() | st.builds(ic.Usage, prompt_tokens=u32, completion_tokens=u32),
)


def json_carries(message: Any) -> bool:
    """JSON has no NaN or infinities, and carries BYTES elements as UTF-8 text only."""
    if isinstance(message, ic.EmbeddingBatch):
        return bool(np.isfinite(message.vectors).all())
    tensors = message.inputs if isinstance(message, ic.InferRequest) else message.outputs
    for tensor in tensors:
        if tensor.datatype == "BYTES":
            try:
                for element in tensor.data.flat:
                    element.decode()
            except UnicodeDecodeError:
                return False
        elif tensor.data.dtype.kind == "f" and not np.isfinite(tensor.data).all():
            return False
    return True


@pytest.mark.parametrize("name", CHUNK_CODECS)
@given(chunk=token_chunks())
def test_any_token_chunk_round_trips(name: str, chunk: ic.TokenChunk) -> None:
    decoded = as_model(round_trip(ic.get(name, extensions=True), chunk))
    assert decoded == chunk
    assert float_bits(decoded) == float_bits(chunk)


@st.composite
def token_streams(
    draw: st.DrawFn, floats: st.SearchStrategy[float] = finite, max_chunks: int = 5
) -> list[ic.TokenChunk]:
    """The chunks of one response, as every stream encoder takes them (the delta codec
    requires it): one id, model, created time and choice index, and consecutive sequence
    numbers from anywhere."""
    steps = draw(st.lists(token_chunks(floats), max_size=max_chunks))
    if not steps:
        return []
    first = steps[0]
    start = draw(st.integers(0, 2**64 - len(steps)))
    return [
        dataclasses.replace(
            step,
            id=first.id,
            model=first.model,
            created=first.created,
            index=first.index,
            seq=start + offset,
        )
        for offset, step in enumerate(steps)
    ]


@pytest.mark.parametrize("name", CHUNK_CODECS)
@settings(max_examples=40)
@given(chunks=token_streams(), data=st.data())
def test_any_token_stream_round_trips_in_any_split(
    name: str, chunks: list[ic.TokenChunk], data: st.DataObject
) -> None:
    codec = ic.get(name, extensions=True)
    stream = b"".join(encode_stream(codec, chunks))
    points = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=12), label="splits"))
    decoder = codec.stream_decoder(ic.TokenChunk)
    decoded = []
    for start, end in zip([0, *points], [*points, len(stream)], strict=True):
        decoded += decoder.feed(stream[start:end])
    decoder.close()
    assert [as_model(c) for c in decoded] == chunks
    assert [float_bits(as_model(c)) for c in decoded] == [float_bits(c) for c in chunks]


@pytest.mark.parametrize("name", TENSOR_CODECS)
@settings(max_examples=60)
@given(message=infer_messages | embedding_batches)
def test_any_tensor_message_round_trips(name: str, message: Any) -> None:
    codec = ic.get(name, extensions=True)
    if name in JSON_CODECS and not json_carries(message):
        with pytest.raises(ic.EncodeError):
            codec.encode(message)
    else:
        assert round_trip(codec, message) == message


@pytest.mark.parametrize("name", TENSOR_CODECS)
@pytest.mark.parametrize("datatype", sorted(DATATYPES))
def test_every_datatype_at_its_extremes(name: str, datatype: str) -> None:
    dtype = DATATYPES[datatype]
    if datatype == "BYTES":
        values: list[Any] = [b"", b"a", "é😊".encode(), b"\x00" * 5]
    elif dtype.kind == "b":
        values = [True, False]
    elif dtype.kind in "iu":
        info = np.iinfo(dtype)
        values = [info.min, info.max, 0, 1, info.max - 1]
    else:
        info_f = np.finfo(dtype)
        values = [info_f.min, info_f.max, info_f.tiny, info_f.smallest_subnormal, -0.0, 0.1]
    data = np.array(values, dtype=dtype)
    tensor = ic.Tensor(name="x", datatype=datatype, shape=data.shape, data=data)
    for shaped in (
        tensor,
        ic.Tensor(name="x", datatype=datatype, shape=(1, len(values)), data=data.reshape(1, -1)),
    ):
        request = ic.InferRequest(model="m", id="r", inputs=(shaped,))
        assert round_trip(ic.get(name, extensions=True), request) == request


@pytest.mark.parametrize("name", TENSOR_CODECS)
@pytest.mark.parametrize("order", ["fortran", "strided", "big-endian-copy"])
def test_tensor_data_in_any_memory_layout(name: str, order: str) -> None:
    base = np.arange(24, dtype=np.float32).reshape(4, 6)
    data = {
        "fortran": np.asfortranarray(base),
        "strided": base[::2, ::3],
        "big-endian-copy": base.astype(">f4").astype("<f4"),
    }[order]
    tensor = ic.Tensor(name="x", datatype="FP32", shape=data.shape, data=data)
    request = ic.InferRequest(model="m", id="r", inputs=(tensor,))
    assert round_trip(ic.get(name, extensions=True), request) == request


@pytest.mark.parametrize("name", TENSOR_CODECS)
@pytest.mark.parametrize(
    ("datatype", "shape", "data"),
    [
        pytest.param("FP32", (2,), np.zeros(2, np.float64), id="dtype-mismatch"),
        pytest.param("FP32", (2,), np.zeros(2, ">f4"), id="big-endian"),
        pytest.param("FP32", (3,), np.zeros(2, np.float32), id="shape-mismatch"),
        pytest.param("FP32", (2, 1), np.zeros(2, np.float32), id="rank-mismatch"),
        pytest.param("FP8", (2,), np.zeros(2, np.uint8), id="unknown-datatype"),
        pytest.param("BYTES", (1,), np.array(["text"], dtype=object), id="str-in-bytes"),
    ],
)
def test_a_tensor_that_contradicts_itself_is_an_encode_error(
    name: str, datatype: str, shape: tuple[int, ...], data: Any
) -> None:
    tensor = ic.Tensor(name="x", datatype=datatype, shape=shape, data=data)
    with pytest.raises(ic.EncodeError):
        ic.get(name, extensions=True).encode(ic.InferRequest(model="m", id="r", inputs=(tensor,)))


@pytest.mark.parametrize("name", TENSOR_CODECS)
@pytest.mark.parametrize(
    "vectors",
    [
        pytest.param(np.zeros((2, 3), np.float64), id="float64"),
        pytest.param(np.zeros(3, np.float32), id="vector"),
        pytest.param(np.zeros((1, 2, 3), np.float32), id="rank-3"),
    ],
)
def test_embeddings_must_be_a_float32_matrix(name: str, vectors: Any) -> None:
    with pytest.raises(ic.EncodeError):
        ic.get(name, extensions=True).encode(ic.EmbeddingBatch(model="m", vectors=vectors))


@pytest.mark.parametrize("name", TENSOR_CODECS)
def test_an_empty_embedding_batch_round_trips_or_is_refused(name: str) -> None:
    # JSON rows carry the dimension, so a batch of zero rows cannot say it: a codec may refuse.
    batch = ic.EmbeddingBatch(model="m", vectors=np.zeros((0, 4), np.float32))
    try:
        data = ic.get(name, extensions=True).encode(batch)
    except ic.EncodeError:
        assert name not in ("protobuf", "flatbuffers", "tensor")
    else:
        assert ic.get(name, extensions=True).decode(data, ic.EmbeddingBatch) == batch


# -- floats ------------------------------------------------------------------------------


def _chunk_with_logprob(value: float) -> ic.TokenChunk:
    return ic.TokenChunk(
        id="c",
        model="m",
        created=1,
        index=0,
        seq=1,
        token_ids=(7,),
        text="a",
        logprobs=(
            ic.TokenLogprob(
                token="a", logprob=value, top=(ic.TopLogprob(token="b", logprob=value),)
            ),
        ),
    )


def _significant_digits(number: str) -> str:
    mantissa = re.split("[eE]", number)[0].lstrip("-").replace(".", "")
    return mantissa.strip("0") or "0"


@pytest.mark.parametrize("name", JSON_CODECS)
@given(value=finite)
def test_json_writes_the_shortest_text_that_reads_back_to_the_same_double(
    name: str, value: float
) -> None:
    codec = ic.get(name, extensions=True)
    chunk = _chunk_with_logprob(value)
    data = codec.encode(chunk)
    written = re.findall(rb'"logprob":(-?[0-9][0-9.eE+-]*)', data)
    assert len(written) == 2
    for text in written:
        assert struct.pack("<d", float(text)) == struct.pack("<d", value)
        assert len(_significant_digits(text.decode())) == len(_significant_digits(repr(value)))
    assert float_bits(as_model(codec.decode(data, ic.TokenChunk))) == float_bits(chunk)


NON_FINITE = [
    pytest.param(math.nan, id="nan"),
    pytest.param(-math.nan, id="-nan"),
    pytest.param(SIGNALING_NAN, id="signaling-nan"),
    pytest.param(math.inf, id="inf"),
    pytest.param(-math.inf, id="-inf"),
]


@pytest.mark.parametrize("name", CHUNK_CODECS)
@pytest.mark.parametrize("value", NON_FINITE)
def test_non_finite_floats(name: str, value: float) -> None:
    """JSON has no text for them: refused. Binary formats keep the exact bits."""
    codec = ic.get(name, extensions=True)
    chunk = _chunk_with_logprob(value)
    if name in JSON_CODECS:
        with pytest.raises(ic.EncodeError):
            codec.encode(chunk)
        with pytest.raises(ic.EncodeError):
            codec.stream_encoder().encode(chunk)
    else:
        assert float_bits(as_model(round_trip(codec, chunk))) == float_bits(chunk)


@pytest.mark.parametrize("name", [n for n in CHUNK_CODECS if n in BINARY_CODECS])
@given(chunk=token_chunks(any_float))
def test_binary_codecs_keep_every_float_bit(name: str, chunk: ic.TokenChunk) -> None:
    assert float_bits(as_model(round_trip(ic.get(name, extensions=True), chunk))) == float_bits(
        chunk
    )


# -- integers and text ---------------------------------------------------------------------

# The token ids each codec carries: JSON numbers have no limit (stdlib json, msgspec) or a
# 64-bit one (orjson); MessagePack integers are 64-bit; protobuf, FlatBuffers and the delta
# codec (a protobuf Frame) use uint32.
TOKEN_ID_RANGE = {
    "json": (-math.inf, math.inf),
    "msgspec-json": (-math.inf, math.inf),
    "orjson": (-(2**63), 2**64 - 1),
    "msgpack": (-(2**63), 2**64 - 1),
    "msgspec-msgpack": (-(2**63), 2**64 - 1),
    "protobuf": (0, 2**32 - 1),
    "flatbuffers": (0, 2**32 - 1),
    "delta": (0, 2**32 - 1),
}
TOKEN_IDS = [
    -(2**64),
    -(2**63) - 1,
    -(2**63),
    -1,
    0,
    2**32 - 1,
    2**32,
    2**63,
    2**64 - 1,
    2**64,
    2**70,
]


def test_token_id_ranges_cover_every_chunk_codec() -> None:
    assert set(TOKEN_ID_RANGE) == set(CHUNK_CODECS)


@pytest.mark.parametrize("name", CHUNK_CODECS)
@pytest.mark.parametrize("token_id", TOKEN_IDS)
def test_token_ids_each_codec_carries(name: str, token_id: int) -> None:
    codec = ic.get(name, extensions=True)
    chunk = ic.TokenChunk(
        id="c", model="m", created=1, index=0, seq=0, token_ids=(5, token_id), text="a"
    )
    low, high = TOKEN_ID_RANGE[name]
    if low <= token_id <= high:
        assert round_trip(codec, chunk) == chunk
    else:
        with pytest.raises(ic.EncodeError):
            codec.encode(chunk)
        with pytest.raises(ic.EncodeError):
            codec.stream_encoder().encode(chunk)


INT_FIELDS = ["created", "index", "seq", "token_ids", "prompt_tokens", "completion_tokens"]
# Just past each width a format uses (int32, uint32, int64, uint64): found by hypothesis only
# by luck, so each is checked on every field too.
INT_BOUNDARIES = [
    -(2**63) - 1,
    -(2**63),
    -(2**31) - 1,
    -1,
    2**31,
    2**32 - 1,
    2**32,
    2**63 - 1,
    2**63,
    2**64 - 1,
    2**64,
]


def _check_integer(codec: ic.Codec, field: str, value: int) -> None:
    """A chunk with ``value`` in ``field`` round trips, or encoding it is refused: never wraps."""
    chunk = ic.TokenChunk(id="c", model="m", created=1, index=0, seq=0, token_ids=(1,), text="a")
    if field == "token_ids":
        chunk = ic.TokenChunk(**{**_fields(chunk), "token_ids": (value,)})
    elif field in ("prompt_tokens", "completion_tokens"):
        usage = ic.Usage(**{"prompt_tokens": 1, "completion_tokens": 1, field: value})
        chunk = ic.TokenChunk(**{**_fields(chunk), "usage": usage})
    else:
        chunk = ic.TokenChunk(**{**_fields(chunk), field: value})
    try:
        data = codec.encode(chunk)
    except ic.EncodeError:
        return  # a value out of the format's range: refused, never wrapped
    assert codec.decode(data, ic.TokenChunk) == chunk


@pytest.mark.parametrize("name", CHUNK_CODECS)
@given(field=st.sampled_from(INT_FIELDS), value=st.integers(-(2**70), 2**70))
def test_any_integer_round_trips_or_is_an_encode_error(name: str, field: str, value: int) -> None:
    _check_integer(ic.get(name, extensions=True), field, value)


@pytest.mark.parametrize("name", CHUNK_CODECS)
@pytest.mark.parametrize("field", INT_FIELDS)
def test_integers_at_each_width_round_trip_or_are_encode_errors(name: str, field: str) -> None:
    for value in INT_BOUNDARIES:
        _check_integer(ic.get(name, extensions=True), field, value)


def _fields(chunk: ic.TokenChunk) -> dict[str, Any]:
    return {name: getattr(chunk, name) for name in chunk.__slots__}


@pytest.mark.parametrize("name", CHUNK_CODECS)
@pytest.mark.parametrize("field", ["id", "model", "text", "finish_reason"])
def test_text_that_is_not_unicode_scalar_values_is_an_encode_error(name: str, field: str) -> None:
    base = ic.TokenChunk(id="c", model="m", created=1, index=0, seq=0, token_ids=(1,), text="a")
    chunk = ic.TokenChunk(**{**_fields(base), field: "lone \ud800 surrogate"})
    with pytest.raises(ic.EncodeError):
        ic.get(name, extensions=True).encode(chunk)


@pytest.mark.parametrize("name", JSON_CODECS)
def test_json_codecs_refuse_bytes_elements_that_are_not_utf8(name: str) -> None:
    data = np.array([b"ok", b"\xff\xfe"], dtype=object)
    tensor = ic.Tensor(name="x", datatype="BYTES", shape=(2,), data=data)
    with pytest.raises(ic.EncodeError):
        ic.get(name, extensions=True).encode(ic.InferResponse(model="m", id="r", outputs=(tensor,)))


@pytest.mark.parametrize("name", JSON_CODECS)
def test_json_text_is_utf8_without_escapes(name: str) -> None:
    chunk = ic.TokenChunk(
        id="c", model="m", created=1, index=0, seq=0, token_ids=(1,), text=" café 東京 😊"
    )
    assert " café 東京 😊".encode() in ic.get(name, extensions=True).encode(chunk)


# -- bad input -----------------------------------------------------------------------------

SMALL_CHUNK = ic.TokenChunk(
    id="chatcmpl-1",
    model="m",
    created=1_732_924_800,
    index=0,
    seq=3,
    token_ids=(42, 70_000),
    text=" café",
    logprobs=(
        ic.TokenLogprob(
            token=" caf",
            logprob=-0.25,
            top=(
                ic.TopLogprob(token=" caf", logprob=-0.25),
                ic.TopLogprob(token="x", logprob=-3.5),
            ),
        ),
        ic.TokenLogprob(token="é", logprob=-1.0),
    ),
    finish_reason="length",
    usage=ic.Usage(prompt_tokens=10, completion_tokens=2),
)
SMALL_MESSAGES = [
    SMALL_CHUNK,
    ic.EmbeddingBatch(
        model="e",
        vectors=np.arange(6, dtype=np.float32).reshape(2, 3),
        usage=ic.Usage(prompt_tokens=3, completion_tokens=0),
    ),
    ic.InferRequest(
        model="r",
        id="q",
        inputs=(
            ic.Tensor(name="a", datatype="INT32", shape=(2,), data=np.array([1, -2], "<i4")),
            ic.Tensor(name="s", datatype="BYTES", shape=(2,), data=np.array([b"ab", b""], object)),
        ),
    ),
    ic.InferResponse(
        model="r",
        id="q",
        outputs=(ic.Tensor(name="o", datatype="FP16", shape=(1, 2), data=np.ones((1, 2), "<f2")),),
    ),
]
SMALL_PAIRS = [
    pytest.param(n, m, id=f"{n}-{type(m).__name__}")
    for n in NAMES
    for m in SMALL_MESSAGES
    if type(m) in ic.get(n, extensions=True).types
]
# Protobuf has no end marker: a prefix cut at a field boundary is a valid, shorter message.
PREFIX_MAY_DECODE = {"protobuf"}


def _decode_or_decode_error(codec: ic.Codec, data: bytes, type_: type[Any]) -> Any:
    """The decoded value, or None for a DecodeError; any other exception fails the test."""
    try:
        decoded = codec.decode(data, type_)
        check_well_formed(decoded)
    except ic.DecodeError:
        return None
    except Exception as exc:  # the property under test: nothing else escapes a codec
        pytest.fail(f"{codec.name}: {type(exc).__name__}: {exc} for {data[:80]!r}")
    return decoded


def _check_prefix(codec: ic.Codec, data: bytes, end: int, message: Any) -> None:
    decoded = _decode_or_decode_error(codec, data[:end], type(message))
    if codec.name not in PREFIX_MAY_DECODE:
        assert decoded is None, f"{codec.name} decoded a {end}-byte prefix of {len(data)}"


@pytest.mark.parametrize(("name", "message"), SMALL_PAIRS)
def test_every_strict_prefix_is_a_decode_error(name: str, message: Any) -> None:
    codec = ic.get(name, extensions=True)
    data = codec.encode(message)
    for end in range(len(data)):
        _check_prefix(codec, data, end, message)


def sample_positions(size: int, count: int, seed: str) -> list[int]:
    """Positions in ``range(size)``: both ends, then seeded random ones."""
    ends = {*range(min(size, 8)), *range(max(0, size - 8), size)}
    rng = random.Random(seed)
    return sorted(ends | {rng.randrange(size) for _ in range(count)})


@pytest.mark.parametrize(("name", "workload"), PAIRS)
def test_sampled_prefixes_of_workload_messages(name: str, workload: str) -> None:
    codec = ic.get(name, extensions=True)
    message = workloads.get(workload).messages()[-1]
    data = codec.encode(message)
    count = 24 if len(data) < 100_000 or name not in JSON_CODECS else 6
    for end in sample_positions(len(data), count, workload):
        _check_prefix(codec, data, end, message)


CORRUPTION_MASKS = (0x01, 0x20, 0x80, 0xFF)


@pytest.mark.parametrize(("name", "message"), SMALL_PAIRS)
def test_single_byte_corruptions_decode_or_raise_decode_error(name: str, message: Any) -> None:
    codec = ic.get(name, extensions=True)
    data = codec.encode(message)
    for pos in range(len(data)):
        for mask in CORRUPTION_MASKS:
            corrupt = bytearray(data)
            corrupt[pos] ^= mask
            _decode_or_decode_error(codec, bytes(corrupt), type(message))


@pytest.mark.parametrize(("name", "workload"), UNARY_PAIRS)
def test_sampled_corruptions_of_workload_messages(name: str, workload: str) -> None:
    codec = ic.get(name, extensions=True)
    (message,) = workloads.get(workload).messages()
    data = bytearray(codec.encode(message))
    count = 24 if len(data) < 100_000 or name not in JSON_CODECS else 4
    for pos in sample_positions(len(data), count, workload):
        data[pos] ^= 0xFF
        _decode_or_decode_error(codec, bytes(data), type(message))
        data[pos] ^= 0xFF


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\x00",
        b"\xff" * 64,
        b"null",
        b"[]",
        b"{}",
        b'"text"',
        b"IWT\x01\xff\xff\xff\xff",
        b"IWT\x01\x02\x00\x00\x00{}",
    ],
    ids=repr,
)
def test_garbage_is_a_decode_error_or_a_well_formed_value(name: str, data: bytes) -> None:
    codec = ic.get(name, extensions=True)
    for type_ in codec.types:
        _decode_or_decode_error(codec, data, type_)


# -- the tensor codec: zero copy both ways -------------------------------------------------


def _arrays(message: Any) -> list[np.ndarray[Any, Any]]:
    if isinstance(message, ic.EmbeddingBatch):
        return [message.vectors]
    return [t.data for t in message.inputs]


@pytest.mark.parametrize("workload", workloads.names("tensor") + workloads.names("embeddings"))
def test_tensor_codec_parts_are_views_of_the_arrays(workload: str) -> None:
    codec = ic.get("tensor", extensions=True)
    assert isinstance(codec, TensorCodec)
    (message,) = workloads.get(workload).messages()
    parts = codec.encode_parts(message)
    assert b"".join(parts) == codec.encode(message)
    assert len(parts[0]) % ALIGNMENT == 0  # the first tensor starts aligned
    for part, array in zip(parts[1:], _arrays(message), strict=True):
        assert np.shares_memory(np.frombuffer(part, np.uint8), array)


@pytest.mark.parametrize("workload", workloads.names("tensor") + workloads.names("embeddings"))
def test_tensor_codec_decodes_without_copying(workload: str) -> None:
    codec = ic.get("tensor", extensions=True)
    (message,) = workloads.get(workload).messages()
    data = bytearray(codec.encode(message))
    decoded = codec.decode(data, type(message))
    assert decoded == message
    base = np.frombuffer(data, np.uint8)
    for array in _arrays(decoded):
        assert np.shares_memory(array, base)
        assert (array.ctypes.data - base.ctypes.data) % ALIGNMENT == 0
