"""``protobuf``: Protocol Buffers (schemas/inferwire.proto) on the upb backend.

Encode builds the message from the model values (what serving code pays per message; the
benchmarks time a prebuilt message's ``SerializeToString`` beside it). Tensor and embedding
data travel as raw little-endian ``bytes`` fields, as KServe's ``raw_input_contents`` does.
What decode accepts, as the protobuf encoding guide specifies and every runtime does: a field
number the schema does not know is skipped (a newer writer's field); a known field number sent
with another wire type is treated the same way, so the field keeps its default (the registry
refuses a schema that changes a field's type, so only a foreign or corrupt writer sends one); a
singular field sent twice keeps its last value. Groups and messages nest at most 100 deep
(upb's limit), and ``max_elements`` bounds the repeated entries a message may hold before any
Python object is built for them.

Token chunks are marshalled in C by default, :mod:`inferwire.codecs._protobuf_accel`
(codecs/_protobuf_accel.c): upb parses a one-token chunk of ``stream-256`` in 0.19 us and
serializes it in 0.18 us, but building its upb message from the model objects took 0.71 us and
the model objects from the parsed message 1.0 us, in Python: most of the codec's ~1.1 us encode
and ~1.3 us decode, and of the gRPC per-message figure. The extension writes the bytes upb
writes, byte for byte, straight from the model objects, and reads that canonical encoding
straight into them. upb stays the reference (``ProtobufCodec(marshal="upb")``) and the
fallback: the extension hands back every chunk it does not take (a subclass, a value of
another type or out of range) and every message it does not read as upb wrote it (an unknown
or repeated field, fields out of order, unpacked ``token_ids``, invalid UTF-8, truncation, a
broken element budget), and upb then encodes or decodes it (merge rules included) or raises,
with the same errors as ever. Embeddings and tensor messages always take upb's path.
``INFERWIRE_PURE_PYTHON=1`` in the environment, read at import, leaves the extension unused, as
for the delta and FlatBuffers codecs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar, Final, Literal, Protocol, TypeVar, cast

import numpy as np
from google.protobuf import message as pb_message
from google.protobuf.internal import api_implementation

from inferwire.schemas import inferwire_pb2 as pb

from . import extensions
from .base import (
    DEFAULT_MAX_DEPTH,
    DEFAULT_MAX_ELEMENTS,
    BytesLike,
    Codec,
    StreamEncoder,
    check_limits,
)
from .base import nbytes as _nbytes
from .errors import CodecError, DecodeError, ElementBudgetError, EncodeError
from .model import (
    EmbeddingBatch,
    InferRequest,
    InferResponse,
    Tensor,
    TokenChunk,
    TokenLogprob,
    TopLogprob,
    Usage,
    new_token_chunk,
    new_token_logprob,
    new_top_logprob,
)
from .tensors import bytes_elements_from_raw, bytes_elements_to_raw, checked_dtype, checked_layout

M = TypeVar("M")

BACKEND = api_implementation.Type()
# The pure-Python backend is 10-50x slower: numbers measured on it would mislead every table.
if BACKEND != "upb":
    raise ImportError(
        f"protobuf is running its {BACKEND!r} backend; inferwire measures upb "
        "(unset PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION, install protobuf>=4.21)"
    )


# --- the compiled marshalling of token chunks ----------------------------------------------


class _Accelerator(Protocol):
    """What the C extension provides (codecs/_protobuf_accel.c; its stub has the details)."""

    API_VERSION: int

    def encode_chunk(self, chunk: object, /) -> bytes | None: ...
    def decode_chunk(self, data: object, max_elements: int, /) -> TokenChunk | None: ...


_ACCEL_API_VERSION: Final = 1


def _load_accelerator() -> _Accelerator | None:
    """The C extension, bound to the model classes; None when absent, stale or turned off."""
    accel: _Accelerator | None = extensions.load(
        "_protobuf_accel",
        _ACCEL_API_VERSION,
        lambda module: module.configure(TokenChunk, TokenLogprob, TopLogprob, Usage),
        "marshalling through upb's messages",
    )
    return accel


_accel = _load_accelerator()

ProtobufMarshal = Literal["compiled", "upb"]
MARSHALS: Final[tuple[ProtobufMarshal, ...]] = ("compiled", "upb")


def accelerated() -> bool:
    """Whether the compiled marshalling of token chunks is built and in use by default."""
    return _accel is not None


def compiled() -> _Accelerator | None:
    """The C extension the codec marshals token chunks with by default (its ``encode_chunk``
    and ``decode_chunk``, each None for what it hands back to upb), or None where it is not
    used."""
    return _accel


def _usage_pb(usage: Usage) -> pb.Usage:
    return pb.Usage(prompt_tokens=usage.prompt_tokens, completion_tokens=usage.completion_tokens)


def _usage(msg: Any) -> Usage:
    return Usage(prompt_tokens=msg.prompt_tokens, completion_tokens=msg.completion_tokens)


def chunk_to_pb(chunk: TokenChunk) -> pb.TokenChunk:
    msg = _chunk_body_to_pb(chunk)
    msg.id = chunk.id
    msg.model = chunk.model
    msg.created = chunk.created
    msg.index = chunk.index
    return msg


def _chunk_head_to_pb(chunk: TokenChunk) -> pb.TokenChunk:
    """Fields 1-4 of ``chunk``'s message: what every chunk of one stream repeats."""
    return pb.TokenChunk(id=chunk.id, model=chunk.model, created=chunk.created, index=chunk.index)


def _chunk_body_to_pb(chunk: TokenChunk) -> pb.TokenChunk:
    """Fields 5-10 of ``chunk``'s message: what changes from chunk to chunk."""
    msg = pb.TokenChunk(
        seq=chunk.seq,
        token_ids=chunk.token_ids,
        text=chunk.text,
        finish_reason=chunk.finish_reason,
    )
    if chunk.logprobs is not None:
        content = msg.logprobs.content
        msg.logprobs.SetInParent()  # present even when empty
        for lp in chunk.logprobs:
            content.add(
                token=lp.token,
                logprob=lp.logprob,
                top=[pb.TopLogprob(token=t.token, logprob=t.logprob) for t in lp.top],
            )
    if chunk.usage is not None:
        msg.usage.CopyFrom(_usage_pb(chunk.usage))
    return msg


# upb's repeated fields iterate through the old sequence protocol (item by item until an
# IndexError, formatted anew each time): a slice is one C call that makes a list, which cuts a
# one-token chunk's decode by 7% (callgrind).
def chunk_from_pb(msg: pb.TokenChunk) -> TokenChunk:
    return new_token_chunk(
        msg.id,
        msg.model,
        msg.created,
        msg.index,
        msg.seq,
        tuple(msg.token_ids[:]),
        msg.text,
        tuple(
            [
                new_token_logprob(
                    lp.token,
                    lp.logprob,
                    tuple([new_top_logprob(t.token, t.logprob) for t in lp.top[:]]),
                )
                for lp in msg.logprobs.content[:]
            ]
        )
        if msg.HasField("logprobs")
        else None,
        msg.finish_reason if msg.HasField("finish_reason") else None,
        _usage(msg.usage) if msg.HasField("usage") else None,
    )


def tensor_to_pb(tensor: Tensor) -> pb.Tensor:
    checked_dtype(tensor)
    data = tensor.data
    raw = (
        bytes_elements_to_raw(data)
        if tensor.datatype == "BYTES"
        else np.ascontiguousarray(data).tobytes()
    )
    return pb.Tensor(
        name=tensor.name, datatype=tensor.datatype, shape=tensor.shape, raw_contents=raw
    )


def tensor_from_pb(msg: pb.Tensor) -> Tensor:
    shape = tuple(msg.shape)
    dtype, count = checked_layout(msg.datatype, shape)
    raw = msg.raw_contents
    if msg.datatype == "BYTES":
        data = bytes_elements_from_raw(raw, count)
    else:
        if len(raw) != count * dtype.itemsize:
            raise DecodeError(
                f"tensor {msg.name!r}: {len(raw)} bytes, shape {shape} of {msg.datatype} "
                f"needs {count * dtype.itemsize}"
            )
        data = np.frombuffer(raw, dtype=dtype)
    return Tensor(name=msg.name, datatype=msg.datatype, shape=shape, data=data.reshape(shape))


def embeddings_to_pb(batch: EmbeddingBatch) -> pb.EmbeddingBatch:
    vectors = batch.vectors
    if vectors.ndim != 2 or vectors.dtype != np.float32:
        raise EncodeError("vectors must be a float32 matrix (batch x dim)")
    msg = pb.EmbeddingBatch(
        model=batch.model,
        batch=vectors.shape[0],
        dim=vectors.shape[1],
        vectors=np.ascontiguousarray(vectors, dtype="<f4").tobytes(),
    )
    if batch.usage is not None:
        msg.usage.CopyFrom(_usage_pb(batch.usage))
    return msg


def embeddings_from_pb(msg: pb.EmbeddingBatch) -> EmbeddingBatch:
    if len(msg.vectors) != msg.batch * msg.dim * 4:
        raise DecodeError(
            f"embedding batch: {len(msg.vectors)} bytes for {msg.batch}x{msg.dim} float32"
        )
    vectors = np.frombuffer(msg.vectors, dtype="<f4").reshape(msg.batch, msg.dim)
    usage = _usage(msg.usage) if msg.HasField("usage") else None
    return EmbeddingBatch(model=msg.model, vectors=vectors, usage=usage)


def request_to_pb(request: InferRequest) -> pb.InferRequest:
    return pb.InferRequest(
        model=request.model, id=request.id, inputs=[tensor_to_pb(t) for t in request.inputs]
    )


def request_from_pb(msg: pb.InferRequest) -> InferRequest:
    return InferRequest(
        model=msg.model, id=msg.id, inputs=tuple([tensor_from_pb(t) for t in msg.inputs])
    )


def response_to_pb(response: InferResponse) -> pb.InferResponse:
    return pb.InferResponse(
        model=response.model, id=response.id, outputs=[tensor_to_pb(t) for t in response.outputs]
    )


def response_from_pb(msg: pb.InferResponse) -> InferResponse:
    return InferResponse(
        model=msg.model, id=msg.id, outputs=tuple([tensor_from_pb(t) for t in msg.outputs])
    )


def _chunk_elements(msg: Any, budget: int) -> int:
    count = len(msg.token_ids)
    if msg.HasField("logprobs"):
        content = msg.logprobs.content
        count += len(content)
        for lp in content:  # stops as soon as the budget is broken: one entry is enough
            if count > budget:
                break
            count += len(lp.top)
    return count


def _tensors_elements(tensors: Any, budget: int) -> int:
    count = len(tensors)
    for tensor in tensors:  # stops as soon as the budget is broken
        if count > budget:
            break
        count += len(tensor.shape)
    return count


# The repeated entries of a parsed message, counted in upb's arena before the model is built.
ELEMENTS: dict[type[Any], Any] = {
    TokenChunk: _chunk_elements,
    EmbeddingBatch: lambda msg, budget: 1,
    InferRequest: lambda msg, budget: _tensors_elements(msg.inputs, budget),
    InferResponse: lambda msg, budget: _tensors_elements(msg.outputs, budget),
}

TO_PB: dict[type[Any], Any] = {
    TokenChunk: chunk_to_pb,
    EmbeddingBatch: embeddings_to_pb,
    InferRequest: request_to_pb,
    InferResponse: response_to_pb,
}
FROM_PB: dict[type[Any], tuple[Any, Any]] = {
    TokenChunk: (pb.TokenChunk, chunk_from_pb),
    EmbeddingBatch: (pb.EmbeddingBatch, embeddings_from_pb),
    InferRequest: (pb.InferRequest, request_from_pb),
    InferResponse: (pb.InferResponse, response_from_pb),
}


class _ChunkMessages:
    """The codec's message stream (:meth:`ProtobufCodec.message_encoder`). A chunk the compiled
    path takes is its bytes in one call. On upb's path, the chunks of one stream share their
    first four fields (id, model, created, index), so their bytes are serialized once a stream
    and each message is those bytes and then the serialization of the chunk's other fields.
    Protobuf reads concatenated messages as one (its merge rule), and upb writes fields in
    field-number order, so each message is byte for byte what :meth:`ProtobufCodec.encode`
    writes, at two thirds of its cost on that path (building and serializing the four repeated
    fields is a third of it; callgrind, a one-token chunk)."""

    __slots__ = ("_codec", "_fast", "_head", "_head_key", "count")

    def __init__(self, codec: ProtobufCodec) -> None:
        self._codec = codec
        self._fast = codec._encode_chunk
        self._head_key: tuple[str, str, int, int] | None = None
        self._head = b""
        self.count = 0

    def encode(self, message: Any, /) -> bytes:
        fast = self._fast
        if fast is not None:
            data = fast(message)
            if data is not None:
                self.count += 1
                return data
        if type(message) is not TokenChunk:
            self.count += 1
            return self._codec.encode(message)
        try:
            key = (message.id, message.model, message.created, message.index)
            if key != self._head_key:
                self._head = _chunk_head_to_pb(message).SerializeToString()
                self._head_key = key
            body: bytes = _chunk_body_to_pb(message).SerializeToString()
        except (TypeError, ValueError, OverflowError, pb_message.EncodeError) as exc:
            raise EncodeError(f"protobuf: {exc}") from exc
        self.count += 1
        return self._head + body

    def end(self) -> bytes:
        return b""


class ProtobufCodec(Codec):
    name: ClassVar[str] = "protobuf"
    media_type: ClassVar[str] = "application/x-protobuf"
    stream_media_type: ClassVar[str] = "application/vnd.inferwire.frames+protobuf"

    def __init__(
        self,
        *,
        marshal: ProtobufMarshal | None = None,
        max_elements: int = DEFAULT_MAX_ELEMENTS,
        extensions: bool = True,
    ) -> None:
        """``marshal``: how token chunks become bytes and back, ``"compiled"`` (the C
        extension, with upb's path as its fallback), ``"upb"`` (through upb's messages only),
        or None: compiled when the extension is built. The bytes and values are the same either
        way; other messages always go through upb's."""
        check_limits(DEFAULT_MAX_DEPTH, max_elements)
        self._use_extensions(extensions)
        if marshal is None:
            marshal = "compiled" if _accel is not None else "upb"
        if marshal not in MARSHALS:
            raise ValueError(f"marshal must be one of {', '.join(MARSHALS)}, not {marshal!r}")
        if marshal == "compiled" and _accel is None:
            raise ValueError(
                "the compiled protobuf marshalling is not built, or INFERWIRE_PURE_PYTHON is set"
            )
        self.marshal: ProtobufMarshal = marshal
        fast = _accel if marshal == "compiled" else None
        self._encode_chunk = fast.encode_chunk if fast is not None else None
        self._decode_chunk = fast.decode_chunk if fast is not None else None
        self.max_elements = max_elements
        self._decoders = {type_: self._one_decoder(type_) for type_ in FROM_PB}

    def encode(self, message: Any, /) -> bytes:
        fast = self._encode_chunk
        if fast is not None:
            data = fast(message)
            if data is not None:
                return data
        to_pb = TO_PB.get(type(message))
        if to_pb is None:
            raise EncodeError(f"codec {self.name!r} cannot encode {type(message).__name__}")
        try:
            return cast("bytes", to_pb(message).SerializeToString())
        except CodecError:
            raise
        except (TypeError, ValueError, OverflowError, pb_message.EncodeError) as exc:
            raise EncodeError(f"protobuf: {exc}") from exc

    def decode(self, data: BytesLike, type_: type[M], /) -> M:
        decode_one = self._decoders.get(type_)
        if decode_one is None:
            raise DecodeError(f"codec {self.name!r} cannot decode into {type_!r}")
        return cast("M", decode_one(data))

    def _one_decoder(self, type_: type[Any], *, reuse: bool = False) -> Callable[[BytesLike], Any]:
        """:meth:`decode` of ``type_``, bound once: a stream decoder calls it per frame. With
        ``reuse``, each frame is parsed into one message object kept by this function, which
        saves upb a new message and arena a frame (a sixth of parsing a one-token chunk):
        only for a stream's decoder, which one reader uses, and for token chunks, whose
        values are all copied out of the message before the next frame. A token chunk the
        compiled path reads never reaches upb."""
        message_class, from_pb = FROM_PB[type_]
        from_string = message_class.FromString
        if reuse:
            held = message_class()
            parse_into = held.ParseFromString

            def from_string(data: BytesLike) -> Any:
                parse_into(data)
                return held

        elements = ELEMENTS[type_]
        budget = self.max_elements

        def decode_one(data: BytesLike) -> Any:
            try:
                msg = from_string(data)
                # Every entry takes a byte or more: shorter input cannot break the budget.
                if _nbytes(data) > budget and elements(msg, budget) > budget:
                    raise ElementBudgetError(budget)
                return from_pb(msg)
            except CodecError:
                raise
            except (pb_message.DecodeError, TypeError, ValueError, OverflowError) as exc:
                raise DecodeError(f"protobuf: {exc}") from exc

        fast = self._decode_chunk if type_ is TokenChunk else None
        if fast is None:
            return decode_one
        upb_decode = decode_one

        def decode_chunk(data: BytesLike) -> Any:
            chunk = fast(data, budget)
            return chunk if chunk is not None else upb_decode(data)

        return decode_chunk

    def decode_function(self, type_: type[Any] | None = None, /) -> Callable[[BytesLike], Any]:
        """A stream's one-message decoder (a fresh one per stream: see ``reuse``)."""
        message_type = self.default_stream_type if type_ is None else type_
        if message_type is TokenChunk:
            return self._one_decoder(TokenChunk, reuse=True)
        decode_one = self._decoders.get(message_type)
        return decode_one if decode_one is not None else super().decode_function(type_)

    def message_encoder(self) -> StreamEncoder:
        return _ChunkMessages(self)
