"""``msgspec-json`` and ``msgspec-msgpack``: typed msgspec Structs of the same wire objects.

The Structs mirror :mod:`inferwire.codecs.openai` field for field, so ``msgspec-json`` writes
the same OpenAI/KServe JSON as ``json`` (floats in msgspec's shortest form) and
``msgspec-msgpack`` the same MessagePack as ``msgpack``, with the same ``extensions`` (OpenAI's
chunk by default in JSON, inferwire's fields always in MessagePack). msgspec validates types
while it decodes, so no separate check pass is needed. The token chunk's Structs, with
inferwire's extensions and without, are in :mod:`.msgspec_chunks`.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any, ClassVar, TypeVar, cast

import msgspec

from . import openai as oa
from .base import (
    DEFAULT_MAX_DEPTH,
    DEFAULT_MAX_ELEMENTS,
    BytesLike,
    Codec,
    Framing,
    limit_scan,
)
from .base import nbytes as _nbytes
from .errors import CodecError, DecodeError, EncodeError
from .model import (
    EmbeddingBatch,
    InferRequest,
    InferResponse,
    Tensor,
    TokenChunk,
)
from .msgspec_chunks import (
    AnyChunkS,
    ChunkS,
    UsageS,
    chunk_from_any_struct,
    chunk_from_struct,
    chunk_to_struct,
    usage_from_s,
    usage_s,
)

M = TypeVar("M")


class EmbeddingJsonS(msgspec.Struct):
    object: str
    index: int
    embedding: list[float]


class EmbeddingBinS(msgspec.Struct):
    object: str
    index: int
    embedding: bytes


class EmbeddingsJsonS(msgspec.Struct):
    object: str
    data: list[EmbeddingJsonS]
    model: str
    usage: UsageS | None


class EmbeddingsBinS(msgspec.Struct):
    object: str
    data: list[EmbeddingBinS]
    model: str
    usage: UsageS | None


class TensorJsonS(msgspec.Struct):
    name: str
    shape: list[int]
    datatype: str
    data: list[bool | int | float | str]


class TensorBinS(msgspec.Struct):
    name: str
    shape: list[int]
    datatype: str
    data: bytes


class RequestJsonS(msgspec.Struct):
    model_name: str
    id: str
    inputs: list[TensorJsonS]


class RequestBinS(msgspec.Struct):
    model_name: str
    id: str
    inputs: list[TensorBinS]


class ResponseJsonS(msgspec.Struct):
    model_name: str
    id: str
    outputs: list[TensorJsonS]


class ResponseBinS(msgspec.Struct):
    model_name: str
    id: str
    outputs: list[TensorBinS]


def _tensor_struct(t: Tensor, binary: bool) -> Any:
    obj = oa.tensor_to_obj(t, binary=binary)
    return (TensorBinS if binary else TensorJsonS)(**obj)


def _tensor(s: TensorJsonS | TensorBinS, binary: bool) -> Tensor:
    return oa.tensor_from_obj(
        {"name": s.name, "shape": s.shape, "datatype": s.datatype, "data": s.data}, binary=binary
    )


class _MsgspecCodec(Codec):
    binary: ClassVar[bool]

    def __init__(self, *, max_depth: int, max_elements: int, extensions: bool | None) -> None:
        self._scan, self._scan_above = limit_scan(self.binary, max_depth, max_elements)
        self.max_depth = max_depth
        self.max_elements = max_elements
        self.extensions = carried = oa.checked_extensions(self.name, self.binary, extensions)
        binary = self.binary
        self._to_struct: dict[type[Any], Any] = {
            TokenChunk: lambda c: chunk_to_struct(c, binary=binary, extensions=carried),
            EmbeddingBatch: self._embeddings_struct,
            InferRequest: lambda r: (RequestBinS if binary else RequestJsonS)(
                r.model, r.id, [_tensor_struct(t, binary) for t in r.inputs]
            ),
            InferResponse: lambda r: (ResponseBinS if binary else ResponseJsonS)(
                r.model, r.id, [_tensor_struct(t, binary) for t in r.outputs]
            ),
        }
        self._from_struct: dict[type[Any], tuple[type[Any], Any]] = {
            TokenChunk: (ChunkS, chunk_from_struct)
            if carried
            else (AnyChunkS, lambda s: chunk_from_any_struct(s, 0)),
            EmbeddingBatch: (EmbeddingsBinS if binary else EmbeddingsJsonS, self._embeddings),
            InferRequest: (
                RequestBinS if binary else RequestJsonS,
                lambda s: InferRequest(
                    model=s.model_name,
                    id=s.id,
                    inputs=tuple([_tensor(t, binary) for t in s.inputs]),
                ),
            ),
            InferResponse: (
                ResponseBinS if binary else ResponseJsonS,
                lambda s: InferResponse(
                    model=s.model_name,
                    id=s.id,
                    outputs=tuple([_tensor(t, binary) for t in s.outputs]),
                ),
            ),
        }
        self._decoders = {
            type_: self._make_decoder(struct) for type_, (struct, _) in self._from_struct.items()
        }

    def _make_decoder(self, struct: type[Any]) -> Any:
        raise NotImplementedError

    def _dumps(self, obj: Any) -> bytes:
        raise NotImplementedError

    def _embeddings_struct(self, batch: EmbeddingBatch) -> Any:
        obj = oa.embeddings_to_obj(batch, binary=self.binary)
        item: type[Any] = EmbeddingBinS if self.binary else EmbeddingJsonS
        batch_struct: type[Any] = EmbeddingsBinS if self.binary else EmbeddingsJsonS
        return batch_struct(
            obj["object"], [item(**d) for d in obj["data"]], obj["model"], usage_s(batch.usage)
        )

    def _embeddings(self, s: Any) -> EmbeddingBatch:
        obj = {
            "object": s.object,
            "data": [{"embedding": d.embedding} for d in s.data],
            "model": s.model,
            "usage": None,
        }
        return EmbeddingBatch(
            model=s.model,
            vectors=oa.embeddings_from_obj(obj, binary=self.binary).vectors,
            usage=usage_from_s(s.usage),
        )

    def encode(self, message: Any, /) -> bytes:
        to_struct = self._to_struct.get(type(message))
        if to_struct is None:
            raise EncodeError(f"codec {self.name!r} cannot encode {type(message).__name__}")
        try:
            return self._dumps(to_struct(message))
        except CodecError:
            raise
        except (TypeError, ValueError, OverflowError, msgspec.EncodeError) as exc:
            raise EncodeError(f"{self.name}: {exc}") from exc

    def decode(self, data: BytesLike, type_: type[M], /) -> M:
        entry = self._from_struct.get(type_)
        if entry is None:
            raise DecodeError(f"codec {self.name!r} cannot decode into {type_!r}")
        return cast("M", self._decode(data, type_, entry[1]))

    def _decode(self, data: BytesLike, type_: type[Any], from_struct: Any) -> Any:
        if _nbytes(data) > self._scan_above:
            self._scan(data, self.max_depth, self.max_elements)
        try:
            return from_struct(self._decoders[type_].decode(data))
        except CodecError:
            raise
        except (msgspec.DecodeError, TypeError, ValueError, OverflowError, RecursionError) as exc:
            raise DecodeError(f"{self.name}: {exc}") from exc

    def decode_function(self, type_: type[Any] | None = None, /) -> Callable[[BytesLike], Any]:
        if self.extensions or (type_ or self.default_stream_type) is not TokenChunk:
            return super().decode_function(type_)
        # chunks without inferwire's seq are numbered by their place in the stream
        positions = itertools.count()

        def decode_chunk(data: BytesLike) -> TokenChunk:
            position = next(positions)
            return cast(
                "TokenChunk",
                self._decode(data, TokenChunk, lambda s: chunk_from_any_struct(s, position)),
            )

        return decode_chunk


class MsgspecJsonCodec(_MsgspecCodec):
    name: ClassVar[str] = "msgspec-json"
    media_type: ClassVar[str] = "application/json"
    stream_media_type: ClassVar[str] = "text/event-stream"
    binary: ClassVar[bool] = False
    framing: Framing = "sse"
    framings: ClassVar[tuple[Framing, ...]] = ("sse", "ndjson", "length-prefixed")

    def __init__(
        self,
        *,
        framing: Framing | None = None,
        max_depth: int = DEFAULT_MAX_DEPTH,
        max_elements: int = DEFAULT_MAX_ELEMENTS,
        extensions: bool | None = None,
    ) -> None:
        self._use_framing(framing)
        self._encoder = msgspec.json.Encoder()
        super().__init__(max_depth=max_depth, max_elements=max_elements, extensions=extensions)

    def _make_decoder(self, struct: type[Any]) -> Any:
        return msgspec.json.Decoder(struct)

    def _dumps(self, obj: Any) -> bytes:
        return self._encoder.encode(obj)


class MsgspecMsgpackCodec(_MsgspecCodec):
    name: ClassVar[str] = "msgspec-msgpack"
    media_type: ClassVar[str] = "application/vnd.msgpack"
    stream_media_type: ClassVar[str] = "application/vnd.inferwire.frames+msgpack"
    binary: ClassVar[bool] = True

    def __init__(
        self,
        *,
        max_depth: int = DEFAULT_MAX_DEPTH,
        max_elements: int = DEFAULT_MAX_ELEMENTS,
        extensions: bool | None = None,
    ) -> None:
        self._encoder = msgspec.msgpack.Encoder()
        super().__init__(max_depth=max_depth, max_elements=max_elements, extensions=extensions)

    def _make_decoder(self, struct: type[Any]) -> Any:
        return msgspec.msgpack.Decoder(struct)

    def _dumps(self, obj: Any) -> bytes:
        return self._encoder.encode(obj)
