"""The FlatBuffers codec's compiled encoder (codecs/_flatbuffers_accel.c) against its reference,
the official ``flatbuffers.Builder`` (``flatbuffers_codec.encode_reference``).

Every property is differential. For every workload's messages and for fuzzed models (unicode
and empty strings, every datatype, zero-length and 0-d tensors, optional fields absent and
present, the ends of every integer range, NaN and -0.0), the compiled bytes are the reference's
byte for byte; they pass the verifier; they decode to what the reference's bytes decode to, and
to the model. Values the extension does not take (other types, subclasses, BYTES tensors,
values out of range) are handed back (``None``) and the codec then gives exactly what the
reference gives: the same bytes or an :class:`EncodeError`. The extension itself never raises
on a bad message and never crashes; under ``-X dev`` (debug allocator hooks that catch a write
past a buffer's end) it writes the same bytes; and a loop of encodes does not grow memory.

tests/codecs/test_flatbuffers.py and tests/codecs/test_flatbuffers_cpp.py (the C++ verifier and
reader) run on the codec's default, the compiled encoder.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import struct
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import inferwire.codecs as ic
from inferwire import workloads
from inferwire.codecs import flatbuffers_codec as fbc
from inferwire.codecs.errors import EncodeError
from inferwire.codecs.fbverify import verify_envelope
from inferwire.codecs.flatbuffers_codec import FlatbuffersCodec
from inferwire.codecs.model import (
    DATATYPES,
    EmbeddingBatch,
    InferRequest,
    InferResponse,
    Tensor,
    TokenChunk,
    TokenLogprob,
    TopLogprob,
    Usage,
)
from tests.codecs.accel_helpers import assert_nothing_kept, assert_same_under_dev_mode

ACCEL: Any = importlib.import_module("inferwire.codecs._flatbuffers_accel")
PAYLOAD_OF = {
    TokenChunk: "TokenChunk",
    EmbeddingBatch: "EmbeddingBatch",
    InferRequest: "InferRequest",
    InferResponse: "InferResponse",
}
NUMERIC = [d for d in DATATYPES if d != "BYTES"]
WORKLOAD_MESSAGES = [
    pytest.param(name, i, id=f"{name}-{i}")
    for name in workloads.names()
    for i in range(len(workloads.get(name).messages()))
    # every message of the small streams, a sample of the long ones (the same code paths)
    if i < 64 or i % 97 == 0
]


def configure() -> None:
    """Bind the extension to the model, as the codec does at import."""
    ACCEL.configure(
        TokenChunk,
        TokenLogprob,
        TopLogprob,
        Usage,
        EmbeddingBatch,
        Tensor,
        InferRequest,
        InferResponse,
        np.ndarray,
    )


@pytest.fixture(autouse=True, scope="module")
def _extension_on() -> Iterator[None]:
    """The extension in use even under INFERWIRE_PURE_PYTHON: these tests compare it."""
    configure()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(fbc, "_accel", ACCEL)
        yield


def fast_codec() -> FlatbuffersCodec:
    return FlatbuffersCodec(builder="compiled")


REFERENCE = FlatbuffersCodec(builder="reference")


def canonical(value: Any) -> Any:
    """A model object as nested tuples that compare floats by their bits (NaN == NaN, -0.0 !=
    0.0) and arrays by dtype, shape and bytes: what "decodes equal" means here."""
    if isinstance(value, float):
        return ("float", struct.pack("<d", value))
    if isinstance(value, np.ndarray):
        if value.dtype.hasobject:
            return ("objects", value.shape, tuple(value.reshape(-1).tolist()))
        return ("array", value.dtype.str, value.shape, np.ascontiguousarray(value).tobytes())
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return (
            type(value).__name__,
            *(canonical(getattr(value, f.name)) for f in dataclasses.fields(value)),
        )
    if isinstance(value, tuple | list):
        return tuple(canonical(v) for v in value)
    return value


def check_same_as_reference(message: Any, *, taken: bool = True) -> bytes:
    """The compiled bytes of ``message`` (taken by the extension unless ``taken`` is False):
    equal to the reference's, verified, decoding to the reference's decode and the model."""
    fast = ACCEL.encode(message)
    reference = fbc.encode_reference(message)
    if not taken:
        assert fast is None
        assert fast_codec().encode(message) == reference  # the fallback: the reference's bytes
        return reference
    assert fast is not None, "the extension handed back a message it should take"
    assert type(fast) is bytes
    assert fast == reference  # byte for byte: the same layout as flatbuffers.Builder
    type_ = type(message)
    verify_envelope(fast, PAYLOAD_OF[type_])
    decoded = fast_codec().decode(fast, type_).materialize()
    expected = REFERENCE.decode(reference, type_).materialize()
    assert canonical(decoded) == canonical(expected) == canonical(message)
    return fast


# -- the extension is there and chosen ----------------------------------------------------


def test_the_extension_is_built_and_used_by_default() -> None:
    """CI runs the tests on a fresh install: this proves the extension was compiled."""
    assert ACCEL.API_VERSION == fbc._ACCEL_API_VERSION
    assert ACCEL.__file__.endswith((".so", ".pyd"))
    if os.environ.get("INFERWIRE_PURE_PYTHON", "") in ("", "0"):
        assert fbc._load_accelerator() is ACCEL
        assert fbc.accelerated()
        assert FlatbuffersCodec().builder == "compiled"
    assert fast_codec()._fast is ACCEL.encode
    assert REFERENCE._fast is None
    by_name = ic.get("flatbuffers", builder="reference")
    assert isinstance(by_name, FlatbuffersCodec)
    assert by_name.builder == "reference"


def test_a_builder_is_named_or_refused() -> None:
    with pytest.raises(ValueError, match="builder must be one of"):
        FlatbuffersCodec(builder="fast")  # type: ignore[arg-type]


def test_without_the_extension_compiled_is_refused_and_the_default_is_the_reference(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(fbc, "_accel", None)
    assert FlatbuffersCodec().builder == "reference"
    with pytest.raises(ValueError, match="not built"):
        FlatbuffersCodec(builder="compiled")
    chunk = workloads.get("stream-16").messages()[0]
    assert fbc.encode_message(chunk) == fbc.encode_reference(chunk)


# -- every workload ------------------------------------------------------------------------


@pytest.mark.parametrize(("workload", "index"), WORKLOAD_MESSAGES)
def test_every_workload_message_is_the_references_bytes(workload: str, index: int) -> None:
    check_same_as_reference(workloads.get(workload).messages()[index])


@pytest.mark.parametrize("workload", workloads.names(kind="stream"))
def test_a_stream_is_framed_the_same(workload: str) -> None:
    messages = workloads.get(workload).messages()
    frames = {}
    for codec in (fast_codec(), REFERENCE):
        encoder = codec.stream_encoder()
        frames[codec.builder] = [encoder.encode(m) for m in messages] + [encoder.end()]
    assert frames["compiled"] == frames["reference"]
    decoder = fast_codec().stream_decoder(TokenChunk)
    out = [c for frame in frames["compiled"] for c in decoder.feed(frame)]
    decoder.close()
    assert out == messages


# -- fuzzed models -------------------------------------------------------------------------

u32s = st.integers(0, 2**32 - 1)
texts = st.text(max_size=12)  # hypothesis leaves out lone surrogates: those are bad values
floats = st.floats(allow_nan=True, allow_infinity=True)
float32s = st.floats(width=32, allow_nan=True, allow_infinity=True)
tops = st.builds(TopLogprob, token=texts, logprob=floats)
sequences = st.sampled_from([tuple, list])
logprob_entries = st.builds(
    TokenLogprob, token=texts, logprob=floats, top=st.lists(tops, max_size=6).map(tuple)
)
usages = st.none() | st.builds(Usage, prompt_tokens=u32s, completion_tokens=u32s)
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
    usage=usages,
)


@st.composite
def numeric_arrays(draw: st.DrawFn, datatype: str) -> np.ndarray[Any, Any]:
    dtype = DATATYPES[datatype]
    shape = tuple(draw(st.lists(st.integers(0, 4), max_size=3)))
    count = int(np.prod(shape, dtype=np.int64))
    raw = draw(st.binary(min_size=count * dtype.itemsize, max_size=count * dtype.itemsize))
    if datatype == "BOOL":  # numpy's bool is one byte holding 0 or 1
        raw = bytes(b & 1 for b in raw)
    return np.frombuffer(raw, dtype=dtype).reshape(shape).copy()


@st.composite
def tensors(draw: st.DrawFn, datatypes: list[str] = NUMERIC) -> Tensor:
    datatype = draw(st.sampled_from(datatypes))
    if datatype == "BYTES":
        elements = draw(st.lists(st.binary(max_size=6), max_size=4))
        data = np.empty(len(elements), dtype=object)
        data[:] = elements
    else:
        data = draw(numeric_arrays(datatype))
    return Tensor(name=draw(texts), datatype=datatype, shape=data.shape, data=data)


def infer_messages(datatypes: list[str]) -> st.SearchStrategy[InferRequest | InferResponse]:
    many = st.tuples(sequences, st.lists(tensors(datatypes), max_size=5)).map(lambda p: p[0](p[1]))
    return st.builds(InferRequest, model=texts, id=texts, inputs=many) | st.builds(
        InferResponse, model=texts, id=texts, outputs=many
    )


@st.composite
def embeddings(draw: st.DrawFn) -> EmbeddingBatch:
    batch, dim = draw(st.integers(0, 5)), draw(st.integers(0, 40))
    values = draw(st.lists(float32s, min_size=batch * dim, max_size=batch * dim))
    vectors = np.array(values, dtype=np.float32).reshape(batch, dim)
    return EmbeddingBatch(model=draw(texts), vectors=vectors, usage=draw(usages))


@settings(max_examples=150)
@given(chunk=chunks)
def test_any_chunk_is_the_references_bytes(chunk: TokenChunk) -> None:
    check_same_as_reference(chunk)


@settings(max_examples=200)
@given(message=infer_messages(NUMERIC))
def test_any_tensor_message_of_every_numeric_datatype_is_the_references_bytes(
    message: InferRequest | InferResponse,
) -> None:
    check_same_as_reference(message)


@settings(max_examples=100)
@given(embedding=embeddings())
def test_any_embedding_batch_is_the_references_bytes(embedding: EmbeddingBatch) -> None:
    check_same_as_reference(embedding)


@settings(max_examples=50)
@given(message=infer_messages(["BYTES", "FP32"]))
def test_bytes_tensors_are_handed_to_the_reference(message: InferRequest | InferResponse) -> None:
    """BYTES elements are Python objects in an object array: the reference writes them."""
    tensors_ = message.inputs if isinstance(message, InferRequest) else message.outputs
    check_same_as_reference(message, taken=not any(t.datatype == "BYTES" for t in tensors_))


def _vtables(data: bytes, payload: str) -> tuple[int, int]:
    """How many vtables the tables of ``data`` point to, and their uint16 entries in all (the
    extension keeps each whole as its key)."""
    tables = verify_envelope(data, payload).tables
    vtables = {at - struct.unpack_from("<i", data, at)[0] for at in tables}
    return len(vtables), sum(struct.unpack_from("<H", data, v)[0] // 2 for v in vtables)


MANY_LOGPROBS = TokenChunk(
    id="c",
    model="m",
    created=1,
    index=0,
    seq=1,
    token_ids=tuple(range(100)),
    text="t",
    logprobs=tuple(
        TokenLogprob(
            token="x" * (i % 7),
            logprob=-float(i),
            top=tuple(TopLogprob(token="y" * (j % 5), logprob=-1.0) for j in range(i % 40)),
        )
        for i in range(45)
    ),
)
# tensors with each field present or absent: more distinct vtables than a workload's message
VARIED_REQUEST = InferRequest(
    model="m",
    id="r",
    inputs=tuple(
        Tensor(name=name, datatype=datatype, shape=data.shape, data=data)
        for datatype in NUMERIC
        for name in ("", "n")
        for shape in ((), (0,), (2,))
        for data in [np.zeros(shape, dtype=DATATYPES[datatype])]
    ),
)


def test_many_tables_and_vtables_past_the_stack_room() -> None:
    """More offsets than the 32 kept on the stack, more vtables and key entries than its first
    room (6 vtables, 34 entries): the heap paths, byte for byte."""
    assert MANY_LOGPROBS.logprobs is not None
    assert len(MANY_LOGPROBS.logprobs) > 32
    # over the 4 KiB a chunk is built in on the stack: measured, then written
    assert len(check_same_as_reference(MANY_LOGPROBS)) > 4096
    data = check_same_as_reference(VARIED_REQUEST)
    assert len(VARIED_REQUEST.inputs) > 32
    vtables, keys = _vtables(data, "InferRequest")
    assert vtables > 6
    assert keys > 34


def test_numpy_float_logprobs_are_taken() -> None:
    """numpy.float64 is a float: its stored value, the bits struct.pack writes."""
    chunk = _chunk(
        logprobs=(
            TokenLogprob(
                token="a",
                logprob=np.float64(-0.125),
                top=(TopLogprob(token="b", logprob=np.float64("nan")),),
            ),
        )
    )
    check_same_as_reference(chunk)


# The integers the extension reads from the int object itself (one or two 30-bit digits) and
# those it converts through the C API (more digits), at each boundary, with either sign.
DIGIT_BOUNDARIES = [0, 1, 2**30 - 1, 2**30, 2**32 - 1, 2**32, 2**60 - 1, 2**60, 2**63 - 1]
SIGNED = sorted({v for b in DIGIT_BOUNDARIES for v in (b, -b)} | {-(2**63)})


@pytest.mark.parametrize("created", SIGNED)
def test_created_at_every_digit_boundary_is_the_references(created: int) -> None:
    check_same_as_reference(_chunk(created=created))


@pytest.mark.parametrize("value", [*DIGIT_BOUNDARIES, 2**63, 2**64 - 1])
def test_seq_and_ids_at_every_digit_boundary_are_the_references_or_handed_back(
    value: int,
) -> None:
    """seq is a uint64: taken up to 2**64 - 1; index, token ids and usage are uint32: past
    2**32 - 1 handed back, and the reference refuses them."""
    check_same_as_reference(_chunk(seq=value))
    in_u32 = value <= 2**32 - 1
    for chunk in (
        _chunk(index=value),
        _chunk(token_ids=(value, 1)),
        _chunk(usage=Usage(prompt_tokens=value, completion_tokens=value)),
    ):
        if in_u32:
            check_same_as_reference(chunk)
        else:
            assert ACCEL.encode(chunk) is None
            with pytest.raises(EncodeError):
                fast_codec().encode(chunk)


@pytest.mark.parametrize("value", [-1, -(2**30), -(2**30) - 1, -(2**60), -(2**63)])
def test_negative_unsigned_fields_are_handed_back(value: int) -> None:
    for chunk in (_chunk(seq=value), _chunk(index=value), _chunk(token_ids=(value,))):
        assert ACCEL.encode(chunk) is None
        with pytest.raises(EncodeError):
            fast_codec().encode(chunk)


# -- what the extension hands back ---------------------------------------------------------


class Text(str):
    pass


class Array(np.ndarray[Any, Any]):
    pass


def _chunk(**changes: Any) -> TokenChunk:
    base = TokenChunk(
        id="c",
        model="m",
        created=5,
        index=1,
        seq=2,
        token_ids=(1, 2),
        text="hi",
        logprobs=(
            TokenLogprob(token="h", logprob=-0.5, top=(TopLogprob(token="h", logprob=-0.5),)),
        ),
        finish_reason="stop",
        usage=Usage(prompt_tokens=1, completion_tokens=2),
    )
    return dataclasses.replace(base, **changes)


def _request(*tensors_: Tensor, **changes: Any) -> InferRequest:
    return dataclasses.replace(InferRequest(model="m", id="r", inputs=tensors_), **changes)


def _tensor(data: Any, datatype: str = "FP32", **changes: Any) -> Tensor:
    shape = getattr(data, "shape", ())
    return dataclasses.replace(
        Tensor(name="x", datatype=datatype, shape=shape, data=data), **changes
    )


def _unset(type_: type[Any]) -> Any:
    return object.__new__(type_)  # no slot set: reading one is AttributeError in Python


IMAGE = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
HANDED_BACK = {
    # values the reference encodes (other types that Python's struct and str accept)
    "bool-created": _chunk(created=True),
    "list-shape": _request(_tensor(IMAGE, shape=[2, 3, 4])),
    "str-subclass-text": _chunk(text=Text("hi")),
    "non-contiguous": _request(_tensor(IMAGE[:, :, ::2])),
    "fortran-order": _request(_tensor(np.asfortranarray(IMAGE))),
    "array-subclass": _request(_tensor(IMAGE.view(Array))),
    "non-contiguous-vectors": EmbeddingBatch(
        model="m", vectors=np.zeros((4, 6), np.float32)[:, ::2]
    ),
    "int-logprob": _chunk(logprobs=(TokenLogprob(token="a", logprob=-1),)),
    "zero-float-created": _chunk(created=0.0),
    # values the reference refuses
    "created-overflow": _chunk(created=2**63),
    "created-underflow": _chunk(created=-(2**63) - 1),
    "index-negative": _chunk(index=-1),
    "index-overflow": _chunk(index=2**32),
    "seq-negative": _chunk(seq=-1),
    "seq-overflow": _chunk(seq=2**64),
    "float-seq": _chunk(seq=1.5),
    "token-id-overflow": _chunk(token_ids=(1, 2**32)),
    "token-id-negative": _chunk(token_ids=(-1,)),
    "token-id-str": _chunk(token_ids=("1",)),
    "token-ids-generator": _chunk(token_ids=iter((1, 2))),
    "text-bytes": _chunk(text=b"bytes"),
    "id-int": _chunk(id=7),
    "model-none": _chunk(model=None),
    "lone-surrogate": _chunk(text="a\ud800b"),
    "surrogate-in-top": _chunk(
        logprobs=(
            TokenLogprob(token="a", logprob=-1.0, top=(TopLogprob(token="\udfff", logprob=0.0),)),
        )
    ),
    "finish-bytes": _chunk(finish_reason=b"stop"),
    "usage-dict": _chunk(usage={"prompt_tokens": 1}),
    "usage-negative": _chunk(usage=Usage(prompt_tokens=-1, completion_tokens=0)),
    "usage-overflow": _chunk(usage=Usage(prompt_tokens=0, completion_tokens=2**32)),
    "logprob-str": _chunk(logprobs=(TokenLogprob(token="a", logprob="x"),)),  # type: ignore[arg-type]
    "logprobs-of-tops": _chunk(logprobs=(TopLogprob(token="a", logprob=0.0),)),
    "top-of-logprobs": _chunk(
        logprobs=(
            TokenLogprob(token="a", logprob=0.0, top=(TokenLogprob(token="a", logprob=0.0),)),  # type: ignore[arg-type]
        )
    ),
    "top-none": _chunk(logprobs=(TokenLogprob(token="a", logprob=0.0, top=None),)),  # type: ignore[arg-type]
    "unset-chunk": _unset(TokenChunk),
    "unset-usage": _chunk(usage=_unset(Usage)),
    "unset-logprob": _chunk(logprobs=(_unset(TokenLogprob),)),
    "unset-tensor": _request(_unset(Tensor)),
    "unset-embedding": _unset(EmbeddingBatch),
    "unset-request": _unset(InferRequest),
    "float64-vectors": EmbeddingBatch(model="m", vectors=np.zeros((1, 2))),  # type: ignore[arg-type]
    "1d-vectors": EmbeddingBatch(model="m", vectors=np.zeros(3, np.float32)),
    "list-vectors": EmbeddingBatch(model="m", vectors=[[1.0]]),  # type: ignore[arg-type]
    "big-endian-vectors": EmbeddingBatch(model="m", vectors=np.zeros((1, 2), ">f4")),
    "unknown-datatype": _request(_tensor(np.zeros(1, np.uint8), "FP8")),
    "datatype-with-nul": _request(_tensor(IMAGE, "FP32\x00")),
    "datatype-lowercase": _request(_tensor(IMAGE, "fp32")),
    "datatype-not-str": _request(_tensor(IMAGE, datatype=32)),  # type: ignore[arg-type]
    "dtype-mismatch": _request(_tensor(IMAGE, "FP64")),
    "signedness-mismatch": _request(_tensor(np.zeros(2, np.int32), "UINT32")),
    "bool-as-uint8": _request(_tensor(np.zeros(2, np.uint8), "BOOL")),
    "big-endian-data": _request(_tensor(np.zeros(2, ">f4"))),
    "shape-mismatch": _request(_tensor(IMAGE, shape=(2, 3, 5))),
    "shape-rank-mismatch": _request(_tensor(IMAGE, shape=(24,))),
    "shape-str": _request(_tensor(IMAGE, shape="234")),
    "data-bytes": _request(_tensor(b"\x00" * 4, shape=(1,))),
    "data-memoryview": _request(_tensor(memoryview(IMAGE), shape=(2, 3, 4))),  # type: ignore[arg-type]
    "str-in-bytes-tensor": _request(_tensor(np.array(["text"], dtype=object), "BYTES")),
    "tensor-not-a-tensor": _request(IMAGE),  # type: ignore[arg-type]
    "inputs-dict": _request(inputs={"x": _tensor(IMAGE)}),
    "not-a-message": "not a message",
    "bare-tensor": _tensor(IMAGE),
    "a-model-class": TokenChunk,
    "none": None,
}


@pytest.mark.parametrize("name", HANDED_BACK)
def test_what_the_extension_does_not_take_goes_to_the_reference(name: str) -> None:
    """Handed back untouched (None, no exception), then the codec gives what the reference
    gives: the same bytes, or an EncodeError."""
    message = HANDED_BACK[name]
    assert ACCEL.encode(message) is None
    try:
        expected: bytes | type[EncodeError] = fbc.encode_reference(message)
    except EncodeError:
        expected = EncodeError
    if expected is EncodeError:
        with pytest.raises(EncodeError):
            fast_codec().encode(message)
    else:
        assert fast_codec().encode(message) == expected


fields = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    floats,
    st.text(max_size=4),
    st.binary(max_size=4),
    st.lists(st.integers(-5, 2**33), max_size=3).map(tuple),
    st.builds(dict),
)


@settings(max_examples=300)
@given(
    type_=st.sampled_from([TokenChunk, TokenLogprob, Usage, EmbeddingBatch, Tensor, InferRequest]),
    values=st.lists(fields, min_size=10, max_size=10),
)
def test_any_field_of_any_type_is_the_reference_or_its_error(
    type_: type[Any], values: list[Any]
) -> None:
    """Arbitrary values in every field of a chunk, and of its parts inside a valid chunk: the
    extension returns the reference's bytes or None, never raises; the codec does as the
    reference does."""
    names = [f.name for f in dataclasses.fields(type_)]
    part = type_(**dict(zip(names, values, strict=False)))
    if type_ is TokenLogprob:
        message: Any = _chunk(logprobs=(part,))
    elif type_ is Usage:
        message = _chunk(usage=part)
    elif type_ is Tensor:
        message = _request(part)
    else:
        message = part
    fast = ACCEL.encode(message)
    try:
        expected: bytes | None = fbc.encode_reference(message)
    except EncodeError:
        expected = None
    if fast is not None:
        assert fast == expected
    if expected is None:
        with pytest.raises(EncodeError):
            fast_codec().encode(message)
    else:
        assert fast_codec().encode(message) == expected


def test_configure_refuses_what_is_not_the_model() -> None:
    with pytest.raises(TypeError):
        ACCEL.configure(TokenChunk)
    unslotted = dataclasses.make_dataclass(
        "Unslotted", [(f.name, object, None) for f in dataclasses.fields(TokenChunk)]
    )
    with pytest.raises(TypeError, match="not a slot"):
        ACCEL.configure(unslotted, *[TokenChunk] * 7, np.ndarray)
    # a failed configure leaves the module unconfigured, not half-bound
    with pytest.raises(TypeError, match="configure"):
        ACCEL.encode(_chunk())
    configure()
    assert ACCEL.encode(_chunk()) == fbc.encode_reference(_chunk())


# -- memory and the debug allocator --------------------------------------------------------


def test_no_memory_grows_over_a_loop_of_encodes() -> None:
    """tracemalloc sees the extension's allocations (PyMem and bytes objects): none is kept."""
    messages = [
        workloads.get("stream-16-top5").messages()[3],
        HANDED_BACK["created-overflow"],  # handed back: nothing left behind either
        *workloads.get("embed-1x384").messages(),
    ]
    chunk = messages[0]
    messages += [MANY_LOGPROBS, VARIED_REQUEST]  # past the stack room: the heap paths
    held = [*messages, chunk.text, chunk.logprobs, messages[2].vectors]  # and inner values

    def loop(times: int) -> None:
        for _ in range(times):
            for m in messages:
                ACCEL.encode(m)

    assert_nothing_kept(loop, held, warm=50, times=2000)


DEV_MODE_SCRIPT = """
import numpy as np
from inferwire import workloads
from inferwire.codecs import flatbuffers_codec as fbc
assert fbc._accel is not None
for name in workloads.names():
    for m in workloads.get(name).messages()[:40]:
        assert fbc._accel.encode(m) == fbc.encode_reference(m), name
print("same")
"""


def test_the_same_bytes_under_dev_mode() -> None:
    assert_same_under_dev_mode(DEV_MODE_SCRIPT)
