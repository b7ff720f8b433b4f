"""The FlatBuffers codec, its verifier and its zero-copy views.

Round trips of every model type; views that share memory with the input; and bad input:
every prefix, byte corruptions, hand-made buffers with hostile offsets, and buffers whose
offsets fan out to shared tables, which the verifier's work budget must refuse.
"""

from __future__ import annotations

import importlib
import math
import struct
import threading
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import flatbuffers
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inferwire.codecs.errors import DecodeError, EncodeError, VerificationError
from inferwire.codecs.fbverify import FILE_IDENTIFIER, PAYLOAD_TYPES, SCHEMA, verify_envelope
from inferwire.codecs.flatbuffers_codec import (
    EmbeddingBatchView,
    FlatbuffersCodec,
    InferRequestView,
    InferResponseView,
    TensorView,
    TokenChunkView,
)
from inferwire.codecs.model import (
    EmbeddingBatch,
    InferRequest,
    InferResponse,
    Tensor,
    TokenChunk,
    TokenLogprob,
    TopLogprob,
    Usage,
)

# The modules flatc generated, one per table (and the union's), as fb.TokenChunk etc.
fb = SimpleNamespace(
    **{
        name: importlib.import_module(f"inferwire.schemas.fb.{name}")
        for name in [*SCHEMA, "Payload"]
    }
)
PAYLOAD = fb.Payload.Payload

CODEC = FlatbuffersCodec()


def tensor(name: str, datatype: str, data: Any) -> Tensor:
    return Tensor(name=name, datatype=datatype, shape=data.shape, data=data)


def bytes_array(elements: list[bytes], shape: tuple[int, ...]) -> np.ndarray[Any, Any]:
    array = np.empty(len(elements), dtype=object)
    array[:] = elements
    return array.reshape(shape)


FULL_CHUNK = TokenChunk(
    id="chatcmpl-7",
    model="meta-llama/Llama-3.1-8B-Instruct",
    created=-(2**63),
    index=2**32 - 1,
    seq=2**64 - 1,
    token_ids=(0, 42, 128_000, 2**32 - 1),
    text=" café 東京 😊",
    logprobs=(
        TokenLogprob(
            token=" café",
            logprob=-0.25,
            top=(TopLogprob(token=" café", logprob=-0.25), TopLogprob(token="😊", logprob=-9.5)),
        ),
        TokenLogprob(token="東京", logprob=-0.0),
    ),
    finish_reason="stop",
    usage=Usage(prompt_tokens=2**32 - 1, completion_tokens=0),
)
EMPTY_CHUNK = TokenChunk(id="", model="", created=0, index=0, seq=0, token_ids=(), text="")
MESSAGES: dict[str, Any] = {
    "chunk-full": FULL_CHUNK,
    "chunk-empty": EMPTY_CHUNK,
    "chunk-empty-logprobs": TokenChunk(
        id="c",
        model="m",
        created=1,
        index=0,
        seq=1,
        token_ids=(7,),
        text="a",
        logprobs=(),
        finish_reason="",
        usage=Usage(prompt_tokens=0, completion_tokens=0),
    ),
    "embedding-1x384": EmbeddingBatch(
        model="e5",
        vectors=np.linspace(-1, 1, 384, dtype=np.float32).reshape(1, 384),
        usage=Usage(prompt_tokens=5, completion_tokens=0),
    ),
    "embedding-0x4": EmbeddingBatch(model="e5", vectors=np.zeros((0, 4), np.float32)),
    "embedding-3x0": EmbeddingBatch(model="e5", vectors=np.zeros((3, 0), np.float32)),
    "request-image": InferRequest(
        model="resnet50",
        id="req-1",
        inputs=(tensor("input", "FP32", np.arange(3 * 8 * 8, dtype="<f4").reshape(1, 3, 8, 8)),),
    ),
    "request-mixed": InferRequest(
        model="m",
        id="r",
        inputs=(
            tensor("half", "FP16", np.array([[1.5, -0.0], [np.inf, 65504]], "<f2")),
            tensor("words", "BYTES", bytes_array([b"", b"\x00\xff", "é".encode(), b"ab"], (2, 2))),
            tensor("flags", "BOOL", np.array([True, False, True])),
            tensor("ids", "INT64", np.array([-(2**63), 2**63 - 1], "<i8")),
            tensor("scalar", "UINT8", np.array(7, np.uint8)),
            tensor("empty", "FP64", np.zeros((0, 3), "<f8")),
        ),
    ),
    "request-no-inputs": InferRequest(model="m", id="r", inputs=()),
    "response": InferResponse(
        model="m",
        id="r",
        outputs=(
            tensor("logits", "FP32", np.array([[0.5, -1.25]], "<f4")),
            tensor("label", "BYTES", bytes_array([b"cat"], (1,))),
        ),
    ),
}
VIEW_TYPES = {
    TokenChunk: TokenChunkView,
    EmbeddingBatch: EmbeddingBatchView,
    InferRequest: InferRequestView,
    InferResponse: InferResponseView,
}


def encoded(name: str) -> bytes:
    return CODEC.encode(MESSAGES[name])


def decodes_or_decode_error(data: Any, type_: type[Any]) -> None:
    """Decoding and materializing ``data`` gives a value or a DecodeError, nothing else."""
    try:
        view = CODEC.decode(data, type_)
        assert type(view.materialize()) is type_
    except DecodeError:
        pass


# -- round trips and the view API ---------------------------------------------------------


@pytest.mark.parametrize("name", MESSAGES)
def test_round_trip(name: str) -> None:
    message = MESSAGES[name]
    view = CODEC.decode(CODEC.encode(message), type(message))
    assert type(view) is VIEW_TYPES[type(message)]
    assert view == message
    assert message == view  # the model's __eq__ defers to the view
    materialized = view.materialize()
    assert type(materialized) is type(message)
    assert materialized == message
    assert view == CODEC.decode(CODEC.encode(message), type(message))  # view == view


def test_views_have_the_model_attributes() -> None:
    view = CODEC.decode(encoded("chunk-full"), TokenChunk)
    for field in TokenChunk.__slots__:
        assert getattr(view, field) == getattr(FULL_CHUNK, field), field
    assert type(view.token_ids) is tuple
    assert math.copysign(1.0, view.logprobs[1].logprob) == -1.0  # type: ignore[index]  # -0.0 keeps its sign
    request = CODEC.decode(encoded("request-mixed"), InferRequest)
    assert all(type(t) is TensorView for t in request.inputs)  # type: ignore[comparison-overlap]
    words = request.inputs[1]
    assert (words.name, words.datatype, words.shape) == ("words", "BYTES", (2, 2))
    assert words.data.tolist() == [[b"", b"\x00\xff"], ["é".encode(), b"ab"]]
    assert request.inputs[4].data.shape == ()
    assert "TokenChunkView" in repr(view)
    with pytest.raises(TypeError):
        hash(view)


def test_absent_and_empty_are_told_apart() -> None:
    empty = CODEC.decode(encoded("chunk-empty"), TokenChunk)
    assert (empty.logprobs, empty.finish_reason, empty.usage) == (None, None, None)
    present = CODEC.decode(encoded("chunk-empty-logprobs"), TokenChunk)
    assert present.logprobs == ()
    assert present.finish_reason == ""
    assert present.usage == Usage(prompt_tokens=0, completion_tokens=0)


@pytest.mark.parametrize("value", [-0.0, math.inf, -math.inf, math.nan, 5e-324])
def test_logprob_bits_are_exact(value: float) -> None:
    chunk = TokenChunk(
        id="c",
        model="m",
        created=1,
        index=0,
        seq=0,
        token_ids=(1,),
        text="a",
        logprobs=(
            TokenLogprob(token="a", logprob=value, top=(TopLogprob(token="b", logprob=value),)),
        ),
    )
    (lp,) = CODEC.decode(CODEC.encode(chunk), TokenChunk).logprobs  # type: ignore[misc]
    bits = struct.pack("<d", value)
    assert struct.pack("<d", lp.logprob) == bits
    assert struct.pack("<d", lp.top[0].logprob) == bits


u32s = st.integers(0, 2**32 - 1)
logprobs = st.floats(allow_nan=False)  # NaN != NaN: its bits are checked above
top_logprobs = st.builds(TopLogprob, token=st.text(max_size=8), logprob=logprobs)
chunks = st.builds(
    TokenChunk,
    id=st.text(max_size=8),
    model=st.text(max_size=8),
    created=st.integers(-(2**63), 2**63 - 1),
    index=u32s,
    seq=st.integers(0, 2**64 - 1),
    token_ids=st.lists(u32s, max_size=5).map(tuple),
    text=st.text(),
    logprobs=st.none()
    | st.lists(
        st.builds(
            TokenLogprob,
            token=st.text(max_size=8),
            logprob=logprobs,
            top=st.lists(top_logprobs, max_size=3).map(tuple),
        ),
        max_size=3,
    ).map(tuple),
    finish_reason=st.none() | st.text(max_size=8),
    usage=st.none() | st.builds(Usage, prompt_tokens=u32s, completion_tokens=u32s),
)


@given(chunk=chunks)
def test_any_chunk_round_trips(chunk: TokenChunk) -> None:
    data = CODEC.encode(chunk)
    assert CODEC.decode(data, TokenChunk) == chunk
    assert CODEC.decode(bytearray(data), TokenChunk).materialize() == chunk  # type: ignore[attr-defined]


def test_the_generated_reader_agrees() -> None:
    """The hand-written slot tables read what flatc's own Python reads."""
    data = encoded("chunk-full")
    assert fb.Envelope.Envelope.EnvelopeBufferHasIdentifier(data, 0, size_prefixed=True)
    envelope = fb.Envelope.Envelope.GetRootAs(data, 4)
    assert envelope.PayloadType() == PAYLOAD.TokenChunk
    chunk = fb.TokenChunk.TokenChunk()
    table = envelope.Payload()
    chunk.Init(table.Bytes, table.Pos)
    assert chunk.Text().decode() == FULL_CHUNK.text
    assert chunk.Seq() == FULL_CHUNK.seq
    assert tuple(chunk.TokenIdsAsNumpy()) == FULL_CHUNK.token_ids
    assert chunk.Logprobs(0).Top(1).Logprob() == -9.5
    assert chunk.Usage().PromptTokens() == 2**32 - 1


class _CountingBuilder:
    def StartObject(self, count: int) -> None:  # noqa: N802  (the flatbuffers API's name)
        self.count = count


def test_the_slot_tables_match_the_generated_code() -> None:
    for table, fields in SCHEMA.items():
        builder = _CountingBuilder()
        getattr(fb, table).Start(builder)
        assert builder.count == len(fields), table
    members = {v: k for k, v in vars(PAYLOAD).items() if not k.startswith("_") and k != "NONE"}
    assert members == PAYLOAD_TYPES


# -- zero copy ----------------------------------------------------------------------------


@pytest.mark.parametrize("form", [bytes, bytearray, memoryview])
def test_arrays_are_read_only_views_of_the_input(form: Callable[[bytes], Any]) -> None:
    image = tensor("x", "FP32", np.random.default_rng(1).random((1, 3, 224, 224), np.float32))
    data = form(CODEC.encode(InferRequest(model="m", id="r", inputs=(image,))))
    view = CODEC.decode(data, InferRequest)
    array = view.inputs[0].data
    whole = np.frombuffer(data, np.uint8)
    assert np.shares_memory(array, whole)
    assert not array.flags.writeable
    # aligned within the buffer, so the numbers can be read in place
    assert (array.ctypes.data - whole.ctypes.data) % 16 == 0
    assert view.materialize().inputs[0] == image  # type: ignore[attr-defined]
    embedding = CODEC.decode(form(encoded("embedding-1x384")), EmbeddingBatch)
    assert np.shares_memory(embedding.vectors, np.frombuffer(embedding._buf, np.uint8))  # type: ignore[attr-defined]
    assert not embedding.vectors.flags.writeable


def test_a_builder_reused_across_messages_leaks_nothing() -> None:
    small = MESSAGES["chunk-full"]
    expected: list[bytes] = []
    thread = threading.Thread(target=lambda: expected.append(FlatbuffersCodec().encode(small)))
    thread.start()
    thread.join()
    CODEC.encode(MESSAGES["request-image"])  # leaves other bytes in this thread's builder
    assert CODEC.encode(small) == expected[0]


# -- encode errors ------------------------------------------------------------------------


def _chunk(**changes: Any) -> TokenChunk:
    base = {name: getattr(EMPTY_CHUNK, name) for name in TokenChunk.__slots__}
    return TokenChunk(**{**base, **changes})


@pytest.mark.parametrize(
    "message",
    [
        pytest.param("not a message", id="str"),
        pytest.param(tensor("x", "FP32", np.zeros(1, np.float32)), id="bare-tensor"),
        pytest.param(_chunk(created=2**63), id="created-overflow"),
        pytest.param(_chunk(index=-1), id="index-negative"),
        pytest.param(_chunk(seq=2**64), id="seq-overflow"),
        pytest.param(_chunk(token_ids=(2**32,)), id="token-id-overflow"),
        pytest.param(_chunk(text=b"bytes"), id="text-bytes"),
        pytest.param(_chunk(text="\ud800"), id="lone-surrogate"),
        pytest.param(_chunk(usage=Usage(prompt_tokens=-1, completion_tokens=0)), id="usage"),
        pytest.param(_chunk(logprobs=(TokenLogprob(token="a", logprob="x"),)), id="logprob-str"),  # type: ignore[arg-type]
        pytest.param(EmbeddingBatch(model="m", vectors=np.zeros((1, 2))), id="float64-vectors"),  # type: ignore[arg-type]
        pytest.param(EmbeddingBatch(model="m", vectors=[[1.0]]), id="list-vectors"),  # type: ignore[arg-type]
        pytest.param(
            InferRequest(model="m", id="r", inputs=(tensor("x", "FP8", np.zeros(1, np.uint8)),)),
            id="unknown-datatype",
        ),
        pytest.param(
            InferRequest(
                model="m",
                id="r",
                inputs=(Tensor(name="x", datatype="INT8", shape=(3,), data=np.zeros(2, np.int8)),),
            ),
            id="shape-mismatch",
        ),
        pytest.param(
            InferRequest(
                model="m", id="r", inputs=(tensor("x", "BYTES", np.array(["text"], dtype=object)),)
            ),
            id="str-in-bytes",
        ),
    ],
)
def test_bad_values_are_encode_errors(message: Any) -> None:
    with pytest.raises(EncodeError):
        CODEC.encode(message)


# -- bad input: prefixes and corruptions ----------------------------------------------------

SMALL = ["chunk-full", "chunk-empty-logprobs", "embedding-1x384", "request-mixed", "response"]


@pytest.mark.parametrize("name", SMALL)
def test_every_strict_prefix_is_a_decode_error(name: str) -> None:
    data = encoded(name)
    for end in range(len(data)):
        with pytest.raises(DecodeError):
            CODEC.decode(data[:end], type(MESSAGES[name]))


@pytest.mark.parametrize("name", SMALL)
def test_single_byte_corruptions(name: str) -> None:
    data = encoded(name)
    type_ = type(MESSAGES[name])
    step = 1 if len(data) < 600 else 3
    for pos in range(0, len(data), step):
        for value in (0x00, 0xFF, data[pos] ^ 0x01, data[pos] ^ 0x80):
            corrupt = bytearray(data)
            corrupt[pos] = value
            decodes_or_decode_error(bytes(corrupt), type_)


@settings(max_examples=300)
@given(
    name=st.sampled_from(SMALL),
    patches=st.lists(st.tuples(st.integers(0, 2**16), st.integers(0, 255)), min_size=1, max_size=6),
)
def test_random_corruptions(name: str, patches: list[tuple[int, int]]) -> None:
    corrupt = bytearray(encoded(name))
    for pos, value in patches:
        corrupt[pos % len(corrupt)] = value
    decodes_or_decode_error(bytes(corrupt), type(MESSAGES[name]))


@pytest.mark.parametrize(
    "data",
    [b"", b"\x00" * 12, b"\xff" * 64, b"IWF1" * 4, 1234, "text", memoryview(b"x" * 32)[::2]],
    # a memoryview's repr is its address: ids the same in every process (pytest-xdist)
    ids=lambda data: "strided memoryview" if isinstance(data, memoryview) else repr(data),
)
def test_garbage_is_a_decode_error(data: Any) -> None:
    with pytest.raises(DecodeError):
        CODEC.decode(data, TokenChunk)


@pytest.mark.parametrize("wrong", [EmbeddingBatch, InferRequest, InferResponse, Tensor, str])
def test_asking_for_another_type_is_a_decode_error(wrong: type[Any]) -> None:
    with pytest.raises(DecodeError):
        CODEC.decode(encoded("chunk-full"), wrong)


# -- hand-patched buffers -------------------------------------------------------------------


def u32(data: bytes, at: int) -> int:
    return int(struct.unpack_from("<I", data, at)[0])


def patched(data: bytes, at: int, fmt: str, value: int) -> bytes:
    out = bytearray(data)
    struct.pack_into(fmt, out, at, value)
    return bytes(out)


def field_at(data: bytes, slot: int) -> int:
    """Where field ``slot`` of the payload of a TokenChunk buffer is."""
    verified = verify_envelope(data, "TokenChunk")
    offset = verified.tables[verified.payload][slot]
    assert offset
    return verified.payload + offset


TEXT = 6  # TokenChunk.text's slot


def _refused(data: bytes) -> None:
    with pytest.raises(VerificationError):
        CODEC.decode(data, TokenChunk)


@pytest.mark.parametrize("offset", [0, 0x7FFF_FFFF, 0xFFFF_FFFF, 0x8000_0000])
def test_bad_offsets_are_refused(offset: int) -> None:
    data = encoded("chunk-full")
    _refused(patched(data, 4, "<I", offset))  # the root offset
    _refused(patched(data, field_at(data, TEXT), "<I", offset))


def test_bad_vtables_are_refused() -> None:
    data = encoded("chunk-full")
    table = verify_envelope(data, "TokenChunk").payload
    _refused(patched(data, table, "<i", table + 4))  # vtable before the buffer's start
    _refused(patched(data, table, "<i", -len(data)))  # after its end (a negative soffset)
    _refused(patched(data, table, "<i", -(2**31)))
    vtable = table - struct.unpack_from("<i", data, table)[0]
    for size in (0, 2, 3, 0xFFFF):
        _refused(patched(data, vtable, "<H", size))
    _refused(patched(data, vtable + 2, "<H", 0xFFFF))  # the table's inline size
    _refused(patched(data, vtable + 2, "<H", 2))
    _refused(patched(data, vtable + 4 + 2 * TEXT, "<H", 0xFFF0))  # field outside the table
    _refused(patched(data, vtable + 4 + 2 * TEXT, "<H", 2))  # field inside the soffset


def test_bad_strings_are_refused() -> None:
    data = encoded("chunk-full")
    string = field_at(data, TEXT) + u32(data, field_at(data, TEXT))
    length = u32(data, string)
    _refused(patched(data, string, "<I", len(data)))  # overruns the buffer
    _refused(patched(data, string, "<I", 0xFFFF_FFFF))
    _refused(patched(data, string + 4 + length, "<B", ord("A")))  # no NUL terminator
    _refused(patched(data, string + 4, "<B", 0xFF))  # not UTF-8
    _refused(patched(data, string + 4, "<B", 0xC3))  # a truncated UTF-8 sequence
    assert CODEC.decode(patched(data, string + 4, "<B", ord("X")), TokenChunk).text[0] == "X"


def test_bad_envelopes_are_refused() -> None:
    data = encoded("chunk-full")
    _refused(data + b"\x00")  # the size prefix no longer matches
    _refused(patched(data, 0, "<I", len(data)))
    _refused(patched(data, 8, "<4s", b"IWF2"))  # type: ignore[arg-type]
    envelope = 4 + u32(data, 4)
    vtable = envelope - struct.unpack_from("<i", data, envelope)[0]
    payload_type = envelope + struct.unpack_from("<H", data, vtable + 4)[0]
    for value in (0, 2, 9, 255):
        with pytest.raises(DecodeError):
            CODEC.decode(patched(data, payload_type, "<B", value), TokenChunk)


# -- hand-built buffers ---------------------------------------------------------------------


def envelope(
    build: Callable[[Any], int], payload_type: int, *, size_prefixed: bool = True
) -> bytes:
    builder = flatbuffers.Builder(1024)
    payload = build(builder)
    fb.Envelope.Start(builder)
    fb.Envelope.AddPayloadType(builder, payload_type)
    fb.Envelope.AddPayload(builder, payload)
    finish = builder.FinishSizePrefixed if size_prefixed else builder.Finish
    finish(fb.Envelope.End(builder), file_identifier=FILE_IDENTIFIER)
    return bytes(builder.Output())


def offsets_vector(builder: Any, offsets: list[int]) -> int:
    builder.StartVector(4, len(offsets), 4)
    for offset in reversed(offsets):
        builder.PrependUOffsetTRelative(offset)
    return int(builder.EndVector())


def test_a_buffer_without_the_size_prefix_is_refused_as_such() -> None:
    """FlatBuffers builders write no size prefix unless asked (``Finish``, not
    ``FinishSizePrefixed``): such a buffer, ours without its first four bytes or one built
    with ``Finish``, is refused with an error that says what is missing, not a size mismatch."""

    def build(b: Any) -> int:
        text = b.CreateString("hi")
        fb.TokenChunk.Start(b)
        fb.TokenChunk.AddText(b, text)
        fb.TokenChunk.AddSeq(b, 3)
        return int(fb.TokenChunk.End(b))

    built = envelope(build, PAYLOAD.TokenChunk)
    assert CODEC.decode(built, TokenChunk).text == "hi"
    unprefixed = [encoded("chunk-full")[4:], envelope(build, PAYLOAD.TokenChunk)[4:]]
    unprefixed.append(envelope(build, PAYLOAD.TokenChunk, size_prefixed=False))
    for data in unprefixed:
        assert data[4:8] == FILE_IDENTIFIER
        with pytest.raises(VerificationError, match=r"no size prefix.*size-prefixed"):
            CODEC.decode(data, TokenChunk)
    # a size-prefixed buffer of the wrong size is still told as one
    with pytest.raises(VerificationError, match="declares"):
        CODEC.decode(built + b"\x00", TokenChunk)


def shared_logprobs(tokens: int, alternatives: int) -> bytes:
    """A chunk of ``tokens`` logprobs that are all one table, whose ``alternatives`` top
    entries are all one table: a walk visits tokens x alternatives tables."""

    def build(b: Any) -> int:
        token = b.CreateString("t")
        fb.TopLogprob.Start(b)
        fb.TopLogprob.AddToken(b, token)
        top = fb.TopLogprob.End(b)
        tops = offsets_vector(b, [top] * alternatives)
        fb.TokenLogprob.Start(b)
        fb.TokenLogprob.AddToken(b, token)
        fb.TokenLogprob.AddTop(b, tops)
        logprob = fb.TokenLogprob.End(b)
        logprobs = offsets_vector(b, [logprob] * tokens)
        fb.TokenChunk.Start(b)
        fb.TokenChunk.AddLogprobs(b, logprobs)
        return int(fb.TokenChunk.End(b))

    return envelope(build, PAYLOAD.TokenChunk)


def test_shared_tables_are_read_within_the_budget() -> None:
    view = CODEC.decode(shared_logprobs(3, 2), TokenChunk)
    assert len(view.logprobs) == 3  # type: ignore[arg-type]
    assert view.logprobs[2].top == (TopLogprob(token="t", logprob=0.0),) * 2  # type: ignore[index]


def test_a_fan_out_of_shared_tables_is_refused() -> None:
    data = shared_logprobs(2000, 2000)  # 4 million tables from a 16 kB buffer
    assert len(data) < 20_000
    with pytest.raises(VerificationError, match="fan out"):
        CODEC.decode(data, TokenChunk)


def _shared_leaves(count: int) -> bytes:
    """A chunk of ``count`` logprobs that are all one empty table: a linear walk."""

    def build(b: Any) -> int:
        fb.TokenLogprob.Start(b)
        logprobs = offsets_vector(b, [fb.TokenLogprob.End(b)] * count)
        fb.TokenChunk.Start(b)
        fb.TokenChunk.AddLogprobs(b, logprobs)
        return int(fb.TokenChunk.End(b))

    return envelope(build, PAYLOAD.TokenChunk)


def test_the_item_budget_and_depth_limit_are_enforced() -> None:
    data = _shared_leaves(5000)
    assert CODEC.decode(data, TokenChunk).logprobs == (TokenLogprob(token="", logprob=0.0),) * 5000
    with pytest.raises(VerificationError, match="more than 1000"):
        FlatbuffersCodec(max_items=1000).decode(data, TokenChunk)
    with pytest.raises(VerificationError, match="deeper"):
        FlatbuffersCodec(max_depth=3).decode(encoded("chunk-full"), TokenChunk)
    assert FlatbuffersCodec(max_depth=4).decode(encoded("chunk-full"), TokenChunk) == FULL_CHUNK


def test_a_shared_table_with_children_is_bounded_by_the_buffer_size() -> None:
    """Each of 5000 references to one tensor walks its string and vector: 15000 items from 20 kB,
    more than a buffer of that size can hold without sharing, so it is refused."""

    def build(b: Any) -> int:
        datatype, data = b.CreateString("FP32"), b.CreateByteVector(b"\x00" * 4)
        fb.Tensor.Start(b)
        fb.Tensor.AddDatatype(b, datatype)
        fb.Tensor.AddData(b, data)
        inputs = offsets_vector(b, [fb.Tensor.End(b)] * 5000)
        fb.InferRequest.Start(b)
        fb.InferRequest.AddInputs(b, inputs)
        return int(fb.InferRequest.End(b))

    with pytest.raises(VerificationError, match="fan out"):
        CODEC.decode(envelope(build, PAYLOAD.InferRequest), InferRequest)


def test_a_table_read_as_two_types_is_refused() -> None:
    def build(b: Any) -> int:
        fb.TokenLogprob.Start(b)
        logprob = fb.TokenLogprob.End(b)
        logprobs = offsets_vector(b, [logprob])
        fb.TokenChunk.Start(b)
        fb.TokenChunk.AddLogprobs(b, logprobs)
        fb.TokenChunk.AddUsage(b, logprob)  # the same table as a Usage
        return int(fb.TokenChunk.End(b))

    with pytest.raises(VerificationError, match="also a"):
        CODEC.decode(envelope(build, PAYLOAD.TokenChunk), TokenChunk)


def test_older_and_newer_writers_are_read() -> None:
    def older(b: Any) -> int:  # a vtable of the first two slots only
        model = b.CreateString("m")
        b.StartObject(2)
        fb.TokenChunk.AddModel(b, model)
        return int(b.EndObject())

    def newer(b: Any) -> int:  # a slot this schema does not know
        text = b.CreateString("hi")
        b.StartObject(12)
        fb.TokenChunk.AddText(b, text)
        b.PrependUint64Slot(11, 99, 0)
        return int(b.EndObject())

    assert CODEC.decode(envelope(older, 1), TokenChunk) == _chunk(model="m")
    assert CODEC.decode(envelope(newer, 1), TokenChunk) == _chunk(text="hi")


def _tensor_request(datatype: str, shape: list[int], data: bytes) -> bytes:
    def build(b: Any) -> int:
        datatype_offset = b.CreateString(datatype)
        data_offset = b.CreateByteVector(data)
        b.StartVector(8, len(shape), 8)
        for dim in reversed(shape):
            b.PrependInt64(dim)
        shape_offset = b.EndVector()
        fb.Tensor.Start(b)
        fb.Tensor.AddDatatype(b, datatype_offset)
        fb.Tensor.AddShape(b, shape_offset)
        fb.Tensor.AddData(b, data_offset)
        inputs = offsets_vector(b, [fb.Tensor.End(b)])
        fb.InferRequest.Start(b)
        fb.InferRequest.AddInputs(b, inputs)
        return int(fb.InferRequest.End(b))

    return envelope(build, PAYLOAD.InferRequest)


@pytest.mark.parametrize(
    ("datatype", "shape", "data"),
    [
        pytest.param("FP8", [1], b"\x00", id="unknown-datatype"),
        pytest.param("", [1], b"\x00", id="no-datatype"),
        pytest.param("FP32", [4], b"\x00" * 12, id="short-data"),
        pytest.param("FP32", [2], b"\x00" * 12, id="long-data"),
        pytest.param("INT8", [-1, -2], b"\x00" * 2, id="negative-dims"),
        pytest.param("INT8", [0, 2**62, 2**62], b"", id="too-large-for-numpy"),
        pytest.param("INT8", [1] * 65, b"\x00", id="65-dims"),
        pytest.param("BYTES", [2**40], b"\x00" * 8, id="bytes-count-over-data"),
        pytest.param("BYTES", [1], b"\x09\x00\x00\x00ab", id="bytes-element-overruns"),
    ],
)
def test_tensors_that_contradict_themselves_are_decode_errors(
    datatype: str, shape: list[int], data: bytes
) -> None:
    with pytest.raises(DecodeError):
        CODEC.decode(_tensor_request(datatype, shape, data), InferRequest)


def test_an_embedding_of_the_wrong_size_is_a_decode_error() -> None:
    def build(b: Any) -> int:
        b.StartVector(4, 3, 4)
        for value in (1.0, 2.0, 3.0):
            b.PrependFloat32(value)
        vectors = b.EndVector()
        fb.EmbeddingBatch.Start(b)
        fb.EmbeddingBatch.AddBatch(b, 2)
        fb.EmbeddingBatch.AddDim(b, 2)
        fb.EmbeddingBatch.AddVectors(b, vectors)
        return int(fb.EmbeddingBatch.End(b))

    with pytest.raises(DecodeError, match="2x2"):
        CODEC.decode(envelope(build, PAYLOAD.EmbeddingBatch), EmbeddingBatch)


# -- streams --------------------------------------------------------------------------------


def test_a_stream_round_trips_byte_by_byte() -> None:
    chunks = [MESSAGES["chunk-full"], MESSAGES["chunk-empty"], MESSAGES["chunk-empty-logprobs"]]
    encoder = CODEC.stream_encoder()
    data = b"".join(encoder.encode(c) for c in chunks) + encoder.end()
    decoder = CODEC.stream_decoder(TokenChunk)
    decoded = []
    for i in range(len(data)):
        decoded += decoder.feed(data[i : i + 1])
    decoder.close()
    assert decoded == chunks
    assert CODEC.stream_media_type == "application/vnd.inferwire.frames+flatbuffers"
    truncated = CODEC.stream_decoder(TokenChunk)
    truncated.feed(data[:-3])
    with pytest.raises(DecodeError):
        truncated.close()
