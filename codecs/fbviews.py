"""Read-only views over a verified FlatBuffers buffer (:mod:`inferwire.codecs.fbverify`).

A view exposes the attribute names of the model object it stands for and reads them from the
buffer on access: arrays are ``numpy.frombuffer`` over it (no copy of tensor bytes), strings
are the ones verification decoded (checking UTF-8 is decoding, so each is decoded once).
``materialize()`` gives the plain model object, and a view compares equal to it. Everything a
later read could trip on (a tensor's datatype, shape and data length, BYTES elements, an
embedding's batch x dim) is checked when the view is made, so reads never fail.

No bounds checks here: every position read was checked by the verifier.
"""

from __future__ import annotations

import math
import struct
from typing import Any, Final, Self, overload

import numpy as np
import numpy.typing as npt

from .errors import DecodeError
from .fbverify import Buffer, Verified
from .model import (
    DATATYPES,
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
from .tensors import bytes_elements_from_raw

__all__ = [
    "VIEWS",
    "EmbeddingBatchView",
    "InferRequestView",
    "InferResponseView",
    "TensorView",
    "TokenChunkView",
    "View",
]

_U32: Final = struct.Struct("<I").unpack_from
_F64: Final = struct.Struct("<d").unpack_from
_FLOAT32: Final = np.dtype("<f4")


def _target(buf: Buffer, at: int) -> int:
    """Where the offset at ``at`` points."""
    return at + int(_U32(buf, at)[0])


def _vector(buf: Buffer, at: int) -> tuple[int, int]:
    """The (start, length) of the vector the field at ``at`` points to; (0, 0) if absent."""
    if not at:
        return 0, 0
    vector = at + _U32(buf, at)[0]
    return vector + 4, int(_U32(buf, vector)[0])


def _fields(v: Verified, table: int) -> list[int]:
    """The position of each field of a verified table (0: absent)."""
    return [table + o if o else 0 for o in v.tables[table]]


def _read_usage(buf: Buffer, v: Verified, at: int) -> Usage | None:
    if not at:
        return None
    prompt, completion = _fields(v, _target(buf, at))
    return Usage(
        prompt_tokens=_U32(buf, prompt)[0] if prompt else 0,
        completion_tokens=_U32(buf, completion)[0] if completion else 0,
    )


def _read_logprob(buf: Buffer, v: Verified, table: int) -> TokenLogprob:
    token, logprob, top = _fields(v, table)
    start, length = _vector(buf, top)
    alternatives = []
    for i in range(length):
        top_token, top_logprob = _fields(v, _target(buf, start + 4 * i))
        alternatives.append(
            new_top_logprob(
                v.strings.get(top_token, ""),
                _F64(buf, top_logprob)[0] if top_logprob else 0.0,
            )
        )
    return new_token_logprob(
        v.strings.get(token, ""),
        _F64(buf, logprob)[0] if logprob else 0.0,
        tuple(alternatives),
    )


class _Scalar:
    """An integer field, read on access (0 if absent)."""

    def __init__(self, slot: int, fmt: str) -> None:
        self.slot, self.unpack = slot, struct.Struct(fmt).unpack_from

    @overload
    def __get__(self, view: None, owner: object = None) -> Self: ...
    @overload
    def __get__(self, view: View, owner: object = None) -> int: ...
    def __get__(self, view: View | None, owner: object = None) -> Self | int:
        if view is None:
            return self
        at = view._f(self.slot)
        return int(self.unpack(view._buf, at)[0]) if at else 0


class _Str:
    """A string field ("" if absent): decoded once, by verification."""

    def __init__(self, slot: int) -> None:
        self.slot = slot

    @overload
    def __get__(self, view: None, owner: object = None) -> Self: ...
    @overload
    def __get__(self, view: View, owner: object = None) -> str: ...
    def __get__(self, view: View | None, owner: object = None) -> Self | str:
        if view is None:
            return self
        return view._v.strings.get(view._f(self.slot), "")


class View:
    """A read-only view of one verified table, over the buffer it was decoded from.

    ``_f(slot)`` is the position of a field (0: absent), from the offsets verification read.
    """

    __slots__ = ("_at", "_buf", "_offsets", "_v")

    def __init__(self, buf: Buffer, v: Verified, table: int) -> None:
        self._buf, self._v, self._at = buf, v, table
        self._offsets = v.tables[table]

    def _f(self, slot: int) -> int:
        offset = self._offsets[slot]
        return self._at + offset if offset else 0

    def materialize(self) -> Any:
        raise NotImplementedError

    def __eq__(self, other: object) -> bool:
        if isinstance(other, View):
            other = other.materialize()
        return bool(self.materialize() == other)

    __hash__ = None  # type: ignore[assignment]  # over a buffer that may be mutable

    def __repr__(self) -> str:
        return f"<{type(self).__name__} of {self.materialize()!r}>"


class TokenChunkView(View):
    __slots__ = ()
    id = _Str(0)
    model = _Str(1)
    created = _Scalar(2, "<q")
    index = _Scalar(3, "<I")
    seq = _Scalar(4, "<Q")
    text = _Str(6)

    @property
    def token_ids(self) -> tuple[int, ...]:
        start, length = _vector(self._buf, self._f(5))
        return struct.unpack_from(f"<{length}I", self._buf, start) if length else ()

    @property
    def logprobs(self) -> tuple[TokenLogprob, ...] | None:
        at = self._f(7)
        if not at:
            return None
        buf, v = self._buf, self._v
        start, length = _vector(buf, at)
        return tuple(_read_logprob(buf, v, _target(buf, start + 4 * i)) for i in range(length))

    @property
    def finish_reason(self) -> str | None:
        at = self._f(8)
        return self._v.strings[at] if at else None

    @property
    def usage(self) -> Usage | None:
        return _read_usage(self._buf, self._v, self._f(9))

    def materialize(self) -> TokenChunk:
        return new_token_chunk(
            self.id,
            self.model,
            self.created,
            self.index,
            self.seq,
            self.token_ids,
            self.text,
            self.logprobs,
            self.finish_reason,
            self.usage,
        )


class EmbeddingBatchView(View):
    __slots__ = ("_shape", "_start")
    model = _Str(0)
    _batch = _Scalar(1, "<I")
    _dim = _Scalar(2, "<I")

    def __init__(self, buf: Buffer, v: Verified, table: int) -> None:
        super().__init__(buf, v, table)
        batch, dim = self._batch, self._dim
        self._start, length = _vector(buf, self._f(3))
        if length != batch * dim:
            raise DecodeError(f"{length} floats cannot be a {batch}x{dim} matrix")
        self._shape = (batch, dim)

    @property
    def vectors(self) -> npt.NDArray[np.float32]:
        batch, dim = self._shape
        return np.frombuffer(self._buf, _FLOAT32, batch * dim, self._start).reshape(batch, dim)

    @property
    def usage(self) -> Usage | None:
        return _read_usage(self._buf, self._v, self._f(4))

    def materialize(self) -> EmbeddingBatch:
        return EmbeddingBatch(model=self.model, vectors=self.vectors, usage=self.usage)


class TensorView(View):
    """A tensor: ``datatype`` and ``shape`` are read and checked against the data at decode."""

    __slots__ = ("_bytes_elements", "_count", "_dtype", "_start", "datatype", "shape")
    name = _Str(0)

    def __init__(self, buf: Buffer, v: Verified, table: int) -> None:
        super().__init__(buf, v, table)
        self.datatype = datatype = v.strings.get(self._f(1), "")
        dtype = DATATYPES.get(datatype)
        if dtype is None:
            raise DecodeError(f"unknown tensor datatype {datatype!r}")
        dims_start, ndim = _vector(buf, self._f(2))
        if ndim > 64:  # numpy's limit
            raise DecodeError(f"a tensor of {ndim} dimensions")
        shape: tuple[int, ...] = struct.unpack_from(f"<{ndim}q", buf, dims_start)
        self.shape = shape
        self._dtype, self._count = dtype, count = dtype, math.prod(shape)
        # Checked here so that making the array later cannot fail; a non-empty array's size is
        # bounded by its data's, below, an empty one's is not.
        if (ndim and min(shape) < 0) or (
            not count and math.prod(d for d in shape if d) * dtype.itemsize >= 2**63
        ):
            raise DecodeError(f"tensor shape {list(shape)} is not a valid numpy shape")
        self._start, nbytes = _vector(buf, self._f(3))
        self._bytes_elements = None
        if datatype == "BYTES":  # checking the elements is reading them: done once, here
            if count > nbytes // 4:  # 4 bytes of length each: refuse before allocating
                raise DecodeError(f"{nbytes} bytes cannot hold {count} BYTES elements")
            raw = memoryview(buf)[self._start : self._start + nbytes]
            self._bytes_elements = bytes_elements_from_raw(raw, count).reshape(shape)
        elif count * dtype.itemsize != nbytes:
            raise DecodeError(f"{nbytes} data bytes do not hold {datatype}{list(shape)}")

    @property
    def data(self) -> npt.NDArray[Any]:
        if self._bytes_elements is not None:
            return self._bytes_elements
        flat = np.frombuffer(self._buf, self._dtype, self._count, self._start)
        return flat.reshape(self.shape)

    def materialize(self) -> Tensor:
        return Tensor(name=self.name, datatype=self.datatype, shape=self.shape, data=self.data)


class _InferView(View):
    __slots__ = ("_tensors",)
    model = _Str(0)
    id = _Str(1)

    def __init__(self, buf: Buffer, v: Verified, table: int) -> None:
        super().__init__(buf, v, table)
        start, length = _vector(buf, self._f(2))
        self._tensors = tuple(
            [TensorView(buf, v, _target(buf, start + 4 * i)) for i in range(length)]
        )


class InferRequestView(_InferView):
    __slots__ = ()

    @property
    def inputs(self) -> tuple[TensorView, ...]:
        return self._tensors

    def materialize(self) -> InferRequest:
        tensors = tuple(t.materialize() for t in self._tensors)
        return InferRequest(model=self.model, id=self.id, inputs=tensors)


class InferResponseView(_InferView):
    __slots__ = ()

    @property
    def outputs(self) -> tuple[TensorView, ...]:
        return self._tensors

    def materialize(self) -> InferResponse:
        tensors = tuple(t.materialize() for t in self._tensors)
        return InferResponse(model=self.model, id=self.id, outputs=tensors)


VIEWS: Final[dict[type[Any], tuple[str, type[View]]]] = {
    TokenChunk: ("TokenChunk", TokenChunkView),
    EmbeddingBatch: ("EmbeddingBatch", EmbeddingBatchView),
    InferRequest: ("InferRequest", InferRequestView),
    InferResponse: ("InferResponse", InferResponseView),
}
