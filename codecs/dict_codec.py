"""Codecs that go through plain dicts (:mod:`inferwire.codecs.openai`): json, orjson, msgpack.

A subclass names its library's ``dumps``/``loads``, whether tensor data travels as raw bytes,
and its stream framing. Every foreign exception is translated here, at the one boundary.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar, TypeVar, cast

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

__all__ = ["DictCodec", "Framing"]
from .errors import CodecError, DecodeError, EncodeError
from .model import EmbeddingBatch, InferRequest, InferResponse, TokenChunk

M = TypeVar("M")

# What a library or the dict layer raises on bad input; translated to the codec's own errors.
_FOREIGN = (
    KeyError,
    IndexError,
    TypeError,
    ValueError,
    AttributeError,
    OverflowError,
    RecursionError,
)


class DictCodec(Codec):
    binary: ClassVar[bool]
    """Tensor data as raw bytes (binary formats) or as arrays of numbers (JSON)."""
    decode_errors: ClassVar[tuple[type[BaseException], ...]] = ()
    """Library-specific exceptions that mean the input is not valid for the format."""

    def __init__(
        self,
        *,
        framing: Framing | None = None,
        max_depth: int = DEFAULT_MAX_DEPTH,
        max_elements: int = DEFAULT_MAX_ELEMENTS,
    ) -> None:
        self._use_framing(framing)
        self._scan, self._scan_above = limit_scan(self.binary, max_depth, max_elements)
        self.max_depth = max_depth
        self.max_elements = max_elements
        self._decode_errors: tuple[type[BaseException], ...] = (*_FOREIGN, *self.decode_errors)
        binary = self.binary
        self._to_obj: dict[type[Any], Callable[[Any], Any]] = {
            TokenChunk: lambda m: oa.chunk_to_obj(m, binary=binary),
            EmbeddingBatch: lambda m: oa.embeddings_to_obj(m, binary=binary),
            InferRequest: lambda m: oa.request_to_obj(m, binary=binary),
            InferResponse: lambda m: oa.response_to_obj(m, binary=binary),
        }
        self._from_obj: dict[type[Any], Callable[[Any], Any]] = {
            TokenChunk: oa.chunk_from_obj,
            EmbeddingBatch: lambda o: oa.embeddings_from_obj(o, binary=binary),
            InferRequest: lambda o: oa.request_from_obj(o, binary=binary),
            InferResponse: lambda o: oa.response_from_obj(o, binary=binary),
        }

    # Subclasses: the library calls.
    def dumps(self, obj: Any) -> bytes:
        raise NotImplementedError

    def loads(self, data: BytesLike) -> Any:
        raise NotImplementedError

    def encode(self, message: Any, /) -> bytes:
        to_obj = self._to_obj.get(type(message))
        if to_obj is None:
            raise EncodeError(f"codec {self.name!r} cannot encode {type(message).__name__}")
        try:
            return self.dumps(to_obj(message))
        except CodecError:
            raise
        except _FOREIGN as exc:
            raise EncodeError(f"{self.name}: {exc}") from exc

    def decode(self, data: BytesLike, type_: type[M], /) -> M:
        from_obj = self._from_obj.get(type_)
        if from_obj is None:
            raise DecodeError(f"codec {self.name!r} cannot decode into {type_!r}")
        if _nbytes(data) > self._scan_above:
            self._scan(data, self.max_depth, self.max_elements)
        try:
            return cast("M", from_obj(self.loads(data)))
        except CodecError:
            raise
        except self._decode_errors as exc:
            raise DecodeError(f"{self.name}: {type(exc).__name__}: {exc}") from exc
