"""``msgspec-json`` and ``msgspec-msgpack``: typed msgspec Structs of the same wire objects.

The Structs mirror :mod:`inferwire.codecs.openai` field for field, so ``msgspec-json`` writes
the same OpenAI/KServe JSON as ``json`` (floats in msgspec's shortest form) and
``msgspec-msgpack`` the same MessagePack as ``msgpack``. msgspec validates types while it
decodes, so no separate check pass is needed.
"""

from __future__ import annotations

import itertools
import math
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
    TokenLogprob,
    Usage,
    new_token_chunk,
    new_token_logprob,
    new_top_logprob,
)

M = TypeVar("M")


class TopLogprobS(msgspec.Struct):
    token: str
    logprob: float
    bytes: list[int]


class TokenLogprobS(msgspec.Struct):
    token: str
    logprob: float
    bytes: list[int]
    top_logprobs: list[TopLogprobS]


class LogprobsS(msgspec.Struct):
    content: list[TokenLogprobS]


class DeltaS(msgspec.Struct, kw_only=True, omit_defaults=True):
    role: str | None = None
    content: str


class ChoiceS(msgspec.Struct):
    index: int
    delta: DeltaS
    logprobs: LogprobsS | None
    finish_reason: str | None
    token_ids: list[int]


class OpenAIChoiceS(msgspec.Struct):
    """:class:`ChoiceS` without inferwire's ``token_ids``: the choice vLLM writes."""

    index: int
    delta: DeltaS
    logprobs: LogprobsS | None
    finish_reason: str | None


class AnyDeltaS(msgspec.Struct):
    role: str | None = None
    content: str | None = None


class AnyChoiceS(msgspec.Struct, kw_only=True):
    """A choice as any OpenAI-compatible server may write it (see :mod:`.openai`)."""

    index: int
    delta: AnyDeltaS
    logprobs: LogprobsS | None = None
    finish_reason: str | None = None
    token_ids: list[int] = msgspec.field(default_factory=list)


class UsageS(msgspec.Struct):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class ChunkS(msgspec.Struct, kw_only=True, omit_defaults=True):
    id: str
    object: str
    created: int
    model: str
    seq: int
    choices: list[ChoiceS]
    usage: UsageS | None = None


class OpenAIChunkS(msgspec.Struct, kw_only=True, omit_defaults=True):
    """:class:`ChunkS` without inferwire's ``seq``: the chunk vLLM writes."""

    id: str
    object: str
    created: int
    model: str
    choices: list[OpenAIChoiceS]
    usage: UsageS | None = None


class AnyChunkS(msgspec.Struct, kw_only=True):
    id: str
    object: str
    created: int
    model: str
    seq: int | None = None
    choices: list[AnyChoiceS]
    usage: UsageS | None = None


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


def _finite(value: float) -> float:
    if not math.isfinite(value):  # msgspec would write null in JSON
        raise EncodeError(f"non-finite float {value!r} cannot be carried")
    return value


def _usage_s(usage: Usage | None) -> UsageS | None:
    if usage is None:
        return None
    return UsageS(
        usage.prompt_tokens, usage.completion_tokens, usage.prompt_tokens + usage.completion_tokens
    )


def _usage(usage: UsageS | None) -> Usage | None:
    if usage is None:
        return None
    return Usage(prompt_tokens=usage.prompt_tokens, completion_tokens=usage.completion_tokens)


def _any(value: float) -> float:
    return value


def _logprobs_s(chunk: TokenChunk, number: Any) -> LogprobsS | None:
    logprobs = chunk.logprobs
    if logprobs is None:
        return None
    return LogprobsS(
        [
            TokenLogprobS(
                lp.token,
                number(lp.logprob),
                list(lp.token.encode()),
                [TopLogprobS(t.token, number(t.logprob), list(t.token.encode())) for t in lp.top],
            )
            for lp in logprobs
        ]
    )


def chunk_to_struct(chunk: TokenChunk, *, binary: bool = False) -> ChunkS:
    # MessagePack carries any double bit for bit; JSON has no text for NaN or infinities.
    number = _any if binary else _finite
    return ChunkS(
        id=chunk.id,
        object=oa.CHUNK_OBJECT,
        created=chunk.created,
        model=chunk.model,
        seq=chunk.seq,
        choices=[
            ChoiceS(
                chunk.index,
                DeltaS(role="assistant" if chunk.seq == 0 else None, content=chunk.text),
                _logprobs_s(chunk, number),
                chunk.finish_reason,
                list(chunk.token_ids),
            )
        ],
        usage=_usage_s(chunk.usage),
    )


def chunk_to_openai_struct(chunk: TokenChunk) -> OpenAIChunkS:
    """:func:`chunk_to_struct` without inferwire's extensions (JSON only)."""
    return OpenAIChunkS(
        id=chunk.id,
        object=oa.CHUNK_OBJECT,
        created=chunk.created,
        model=chunk.model,
        choices=[
            OpenAIChoiceS(
                chunk.index,
                DeltaS(role="assistant" if chunk.seq == 0 else None, content=chunk.text),
                _logprobs_s(chunk, _finite),
                chunk.finish_reason,
            )
        ],
        usage=_usage_s(chunk.usage),
    )


def _logprobs(logprobs: LogprobsS | None) -> tuple[TokenLogprob, ...] | None:
    if logprobs is None:
        return None
    return tuple(
        [
            new_token_logprob(
                lp.token,
                lp.logprob,
                tuple([new_top_logprob(t.token, t.logprob) for t in lp.top_logprobs]),
            )
            for lp in logprobs.content
        ]
    )


def chunk_from_struct(s: ChunkS) -> TokenChunk:
    if s.object != oa.CHUNK_OBJECT:
        raise DecodeError(f"not a {oa.CHUNK_OBJECT}: object={s.object!r}")
    if len(s.choices) != 1:
        raise DecodeError(f"expected one choice, got {len(s.choices)}")
    choice = s.choices[0]
    return new_token_chunk(
        s.id,
        s.model,
        s.created,
        choice.index,
        s.seq,
        tuple(choice.token_ids),
        choice.delta.content,
        _logprobs(choice.logprobs),
        choice.finish_reason,
        _usage(s.usage),
    )


def chunk_from_any_struct(s: AnyChunkS, position: int) -> TokenChunk:
    """The chunk of an OpenAI-compatible server, at ``position`` in its stream (see the
    :mod:`.openai` module docstring)."""
    if s.object != oa.CHUNK_OBJECT:
        raise DecodeError(f"not a {oa.CHUNK_OBJECT}: object={s.object!r}")
    if not s.choices:
        raise DecodeError(
            "a chunk without choices (the usage chunk of stream_options.include_usage) "
            "carries no tokens"
        )
    if len(s.choices) != 1:
        raise DecodeError(f"expected one choice, got {len(s.choices)}")
    choice = s.choices[0]
    return new_token_chunk(
        s.id,
        s.model,
        s.created,
        choice.index,
        position if s.seq is None else s.seq,
        tuple(choice.token_ids),
        choice.delta.content or "",
        _logprobs(choice.logprobs),
        choice.finish_reason,
        _usage(s.usage),
    )


def _tensor_struct(t: Tensor, binary: bool) -> Any:
    obj = oa.tensor_to_obj(t, binary=binary)
    return (TensorBinS if binary else TensorJsonS)(**obj)


def _tensor(s: TensorJsonS | TensorBinS, binary: bool) -> Tensor:
    return oa.tensor_from_obj(
        {"name": s.name, "shape": s.shape, "datatype": s.datatype, "data": s.data}, binary=binary
    )


class _MsgspecCodec(Codec):
    binary: ClassVar[bool]

    def __init__(self, *, max_depth: int, max_elements: int, extensions: bool = True) -> None:
        self._scan, self._scan_above = limit_scan(self.binary, max_depth, max_elements)
        self.max_depth = max_depth
        self.max_elements = max_elements
        self.extensions = oa.checked_extensions(self.name, self.binary, extensions)
        binary = self.binary
        self._to_struct: dict[type[Any], Any] = {
            TokenChunk: (lambda c: chunk_to_struct(c, binary=binary))
            if extensions
            else chunk_to_openai_struct,
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
            if extensions
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
            obj["object"], [item(**d) for d in obj["data"]], obj["model"], _usage_s(batch.usage)
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
            usage=_usage(s.usage),
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

    def _decoder_of(self, type_: type[Any] | None) -> Callable[[BytesLike], Any]:
        if self.extensions or (type_ or self.default_stream_type) is not TokenChunk:
            return super()._decoder_of(type_)
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
        extensions: bool = True,
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
        extensions: bool = True,
    ) -> None:
        self._encoder = msgspec.msgpack.Encoder()
        super().__init__(max_depth=max_depth, max_elements=max_elements, extensions=extensions)

    def _make_decoder(self, struct: type[Any]) -> Any:
        return msgspec.msgpack.Decoder(struct)

    def _dumps(self, obj: Any) -> bytes:
        return self._encoder.encode(obj)
