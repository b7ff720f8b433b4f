"""Codecs that go through plain dicts (:mod:`inferwire.codecs.openai`): json, orjson, msgpack.

A subclass names its library's ``dumps``/``loads``, whether tensor data travels as raw bytes,
and its stream framing. Every foreign exception is translated here, at the one boundary.
"""

from __future__ import annotations

import functools
import itertools
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
    reads_infinity: ClassVar[bool] = False
    """Whether the parser reads a number past a double's range (``1e400``) as an infinity,
    which no JSON writer meant: logprobs are then checked finite."""

    def __init__(
        self,
        *,
        framing: Framing | None = None,
        max_depth: int = DEFAULT_MAX_DEPTH,
        max_elements: int = DEFAULT_MAX_ELEMENTS,
        extensions: bool | None = None,
    ) -> None:
        """``extensions``: whether a token chunk carries inferwire's ``seq`` and
        ``token_ids`` (:attr:`Codec.extensions`); None, the format's default: OpenAI's chunk
        in JSON, everything in MessagePack (which cannot leave them out)."""
        self._use_framing(framing)
        self._scan, self._scan_above = limit_scan(self.binary, max_depth, max_elements)
        self.max_depth = max_depth
        self.max_elements = max_elements
        self.extensions = carried = oa.checked_extensions(self.name, self.binary, extensions)
        self._decode_errors: tuple[type[BaseException], ...] = (*_FOREIGN, *self.decode_errors)
        binary = self.binary
        number = self._read_number = oa.finite_float if self.reads_infinity else oa.read_number
        self._to_obj: dict[type[Any], Callable[[Any], Any]] = {
            TokenChunk: lambda m: oa.chunk_to_obj(m, binary=binary, extensions=carried),
            EmbeddingBatch: lambda m: oa.embeddings_to_obj(m, binary=binary),
            InferRequest: lambda m: oa.request_to_obj(m, binary=binary),
            InferResponse: lambda m: oa.response_to_obj(m, binary=binary),
        }
        self._from_obj: dict[type[Any], Callable[[Any], Any]] = {
            TokenChunk: oa.chunk_from_obj
            if carried and number is oa.read_number
            else functools.partial(
                oa.chunk_from_obj, number=number, position=None if carried else 0
            ),
            EmbeddingBatch: lambda o: oa.embeddings_from_obj(o, binary=binary),
            InferRequest: lambda o: oa.request_from_obj(o, binary=binary),
            InferResponse: lambda o: oa.response_from_obj(o, binary=binary),
        }
        self._decoders = {type_: self._decoding(f) for type_, f in self._from_obj.items()}

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
        decode_one = self._decoders.get(type_)
        if decode_one is None:
            raise DecodeError(f"codec {self.name!r} cannot decode into {type_!r}")
        return cast("M", decode_one(data))

    def _decoding(self, from_obj: Callable[[Any], Any]) -> Callable[[BytesLike], Any]:
        """One message through the library and ``from_obj``, held to the decode limits, every
        foreign error the codec's: bound once a type (or a stream), since a stream decoder
        calls it once a frame, where a bound method and a partial around it cost a fifth of
        orjson's decode of a one-token chunk."""
        loads, scan, scan_above = self.loads, self._scan, self._scan_above
        max_depth, max_elements = self.max_depth, self.max_elements
        decode_errors, name = self._decode_errors, self.name

        def decode_one(data: BytesLike) -> Any:
            if _nbytes(data) > scan_above:
                scan(data, max_depth, max_elements)
            try:
                return from_obj(loads(data))
            except CodecError:
                raise
            except decode_errors as exc:
                raise DecodeError(f"{name}: {type(exc).__name__}: {exc}") from exc

        return decode_one

    def decode_function(self, type_: type[Any] | None = None, /) -> Callable[[BytesLike], Any]:
        message_type = type_ or self.default_stream_type
        if self.extensions or message_type is not TokenChunk:
            decode_one = self._decoders.get(message_type)
            return decode_one if decode_one is not None else super().decode_function(type_)
        # chunks without inferwire's seq are numbered by their place in the stream
        positions = itertools.count()
        number = self._read_number
        return self._decoding(lambda o: oa.chunk_from_obj(o, number, position=next(positions)))
