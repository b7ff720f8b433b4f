"""The neutral message model: what serving code holds before encoding and after decoding.

Every codec converts between these values and bytes, so every codec is measured on the same
work. Values are frozen, slotted, keyword-only dataclasses. Objects that hold numpy arrays
compare by the arrays' dtype, shape and values (bit for bit for numeric data, so NaN == NaN
and -0.0 != 0.0: a round trip must keep the exact bits).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any, Final

import numpy as np
import numpy.typing as npt

__all__ = [
    "DATATYPES",
    "EmbeddingBatch",
    "InferRequest",
    "InferResponse",
    "Message",
    "Tensor",
    "TokenChunk",
    "TokenLogprob",
    "TopLogprob",
    "Usage",
    "arrays_equal",
    "datatype_of",
    "dtype_of",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int


@dataclass(frozen=True, slots=True, kw_only=True)
class TopLogprob:
    token: str
    logprob: float


@dataclass(frozen=True, slots=True, kw_only=True)
class TokenLogprob:
    token: str
    logprob: float
    top: tuple[TopLogprob, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class TokenChunk:
    """One step of a streamed completion (OpenAI ``chat.completion.chunk`` semantics).

    ``seq`` numbers the chunks of one response from 0; a step may carry several tokens.
    ``logprobs`` is ``None`` when not requested, else one entry per token of the step.
    """

    id: str
    model: str
    created: int
    index: int
    seq: int
    token_ids: tuple[int, ...]
    text: str
    logprobs: tuple[TokenLogprob, ...] | None = None
    finish_reason: str | None = None
    usage: Usage | None = None


# KServe v2 datatype names (https://kserve.github.io/website/latest/modelserving/data_plane/
# v2_protocol/#tensor-data-types) and the little-endian numpy dtype each travels as.
# BYTES elements are python ``bytes`` in an object array.
DATATYPES: Final[dict[str, np.dtype[Any]]] = {
    "BOOL": np.dtype("?"),
    "UINT8": np.dtype("<u1"),
    "UINT16": np.dtype("<u2"),
    "UINT32": np.dtype("<u4"),
    "UINT64": np.dtype("<u8"),
    "INT8": np.dtype("<i1"),
    "INT16": np.dtype("<i2"),
    "INT32": np.dtype("<i4"),
    "INT64": np.dtype("<i8"),
    "FP16": np.dtype("<f2"),
    "FP32": np.dtype("<f4"),
    "FP64": np.dtype("<f8"),
    "BYTES": np.dtype("O"),
}
_DATATYPE_BY_DTYPE: Final[dict[np.dtype[Any], str]] = {v: k for k, v in DATATYPES.items()}


def dtype_of(datatype: str) -> np.dtype[Any]:
    """The numpy dtype of a KServe datatype name; ``KeyError`` if it is not one."""
    return DATATYPES[datatype]


def datatype_of(array: npt.NDArray[Any]) -> str:
    """The KServe datatype name of an array's dtype; ``KeyError`` if none fits."""
    return _DATATYPE_BY_DTYPE[
        array.dtype.newbyteorder("<") if array.dtype.byteorder == ">" else array.dtype
    ]


def arrays_equal(a: Any, b: Any) -> bool:
    """Same dtype, same shape, same values (bitwise for numeric data)."""
    if not isinstance(a, np.ndarray) or not isinstance(b, np.ndarray):
        return False
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.dtype.hasobject:
        return bool(np.array_equal(a, b))
    return bool(np.ascontiguousarray(a).tobytes() == np.ascontiguousarray(b).tobytes())


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class EmbeddingBatch:
    """Embeddings of a batch of inputs: ``vectors`` is float32, shape (batch, dim)."""

    model: str
    vectors: npt.NDArray[np.float32]
    usage: Usage | None = None

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, EmbeddingBatch):
            return NotImplemented
        return (
            self.model == other.model
            and self.usage == other.usage
            and arrays_equal(self.vectors, other.vectors)
        )

    __hash__ = None  # type: ignore[assignment]  # holds a mutable array


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class Tensor:
    """A named tensor (KServe v2): ``data`` has the dtype of ``datatype`` and shape ``shape``."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    data: npt.NDArray[Any]

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Tensor):
            return NotImplemented
        return (
            self.name == other.name
            and self.datatype == other.datatype
            and self.shape == other.shape
            and arrays_equal(self.data, other.data)
        )

    __hash__ = None  # type: ignore[assignment]


@dataclass(frozen=True, slots=True, kw_only=True)
class InferRequest:
    model: str
    id: str
    inputs: tuple[Tensor, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class InferResponse:
    model: str
    id: str
    outputs: tuple[Tensor, ...]


Message = TokenChunk | EmbeddingBatch | InferRequest | InferResponse
"""Any top-level value a codec encodes."""


# Fast constructors for decoders. A frozen dataclass's __init__ sets each field through
# object.__setattr__, which costs more than parsing a small frame. Each constructor below fills
# a plain class with the same slots (its stores are CPython's specialized slot stores, not a
# call each) and then makes the object the frozen class by assigning __class__, which CPython
# allows between classes of one layout (typeobject.c, compatible_for_assignment): the same
# object (equal, hashable, frozen) at 40% of the cost of writing each slot through its
# descriptor's __set__, and 16% of __init__'s (callgrind, a stream-256 chunk: 3.4k
# instructions, 8.5k, 21k). Field order and layout are checked at import, so a new field
# cannot be missed.
_new: Callable[[type[Any]], Any] = object.__new__


def _slots_of(cls: type[Any], expected: tuple[str, ...]) -> type[Any]:
    """A plain class with ``cls``'s slots, whose instances may become ``cls`` instances."""
    names = tuple(f.name for f in fields(cls))
    if names != expected or cls.__slots__ != expected:
        raise AssertionError(f"{cls.__name__} fields {names} != fast constructor {expected}")
    plain = type(f"_{cls.__name__}Slots", (), {"__slots__": expected})
    probe = _new(plain)
    probe.__class__ = cls  # a TypeError here at import if the layouts ever differ
    return plain


_TokenChunkSlots: Final = _slots_of(
    TokenChunk,
    (
        "id",
        "model",
        "created",
        "index",
        "seq",
        "token_ids",
        "text",
        "logprobs",
        "finish_reason",
        "usage",
    ),
)
_TokenLogprobSlots: Final = _slots_of(TokenLogprob, ("token", "logprob", "top"))
_TopLogprobSlots: Final = _slots_of(TopLogprob, ("token", "logprob"))


def new_token_chunk(
    id: str,
    model: str,
    created: int,
    index: int,
    seq: int,
    token_ids: tuple[int, ...],
    text: str,
    logprobs: tuple[TokenLogprob, ...] | None,
    finish_reason: str | None,
    usage: Usage | None,
) -> TokenChunk:
    """``TokenChunk(...)`` by position, for decoders' hot paths."""
    chunk = _new(_TokenChunkSlots)
    chunk.id = id
    chunk.model = model
    chunk.created = created
    chunk.index = index
    chunk.seq = seq
    chunk.token_ids = token_ids
    chunk.text = text
    chunk.logprobs = logprobs
    chunk.finish_reason = finish_reason
    chunk.usage = usage
    chunk.__class__ = TokenChunk
    made: TokenChunk = chunk
    return made


def new_token_logprob(token: str, logprob: float, top: tuple[TopLogprob, ...]) -> TokenLogprob:
    """``TokenLogprob(...)`` by position, for decoders' hot paths."""
    entry = _new(_TokenLogprobSlots)
    entry.token = token
    entry.logprob = logprob
    entry.top = top
    entry.__class__ = TokenLogprob
    made: TokenLogprob = entry
    return made


def new_top_logprob(token: str, logprob: float) -> TopLogprob:
    """``TopLogprob(...)`` by position, for decoders' hot paths."""
    entry = _new(_TopLogprobSlots)
    entry.token = token
    entry.logprob = logprob
    entry.__class__ = TopLogprob
    made: TopLogprob = entry
    return made
