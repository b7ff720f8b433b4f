"""The official ``flatbuffers.Builder`` writing our schema's ``Envelope``: the reference path
of the ``flatbuffers`` codec (:mod:`inferwire.codecs.flatbuffers_codec`), which the compiled
encoder (codecs/_flatbuffers_accel.c) repeats step for step, so both write the same bytes, and
the fallback for every message the extension hands back.

The builder is pure Python, a method call and a ``struct.pack`` per scalar: kept because it is
the library's own path (what the codec tables call ``flatbuffers (builder)``), the one the
differential tests hold the compiled encoder to.
"""

from __future__ import annotations

import importlib
import struct
import threading
from collections.abc import Callable
from typing import Any, Final

import flatbuffers
import numpy as np
import numpy.typing as npt
from flatbuffers.builder import BuilderSizeError

from .errors import EncodeError
from .fbverify import FILE_IDENTIFIER
from .model import (
    EmbeddingBatch,
    InferRequest,
    InferResponse,
    Message,
    Tensor,
    TokenChunk,
    TokenLogprob,
    TopLogprob,
    Usage,
)
from .tensors import bytes_elements_to_raw, checked_dtype

# A Python bytes object's data is 16-byte aligned (CPython's allocator), so a larger alignment
# inside the buffer would not hold in memory; 16 suits SIMD loads and every numpy dtype.
DATA_ALIGNMENT: Final = 16

# What bad values raise inside the builder; translated at the encode boundary.
_ENCODE_ERRORS: Final = (TypeError, ValueError, AttributeError, OverflowError, struct.error)


def _generated(table: str) -> Any:
    """A module flatc generated from inferwire.fbs (untyped, so ``Any``)."""
    return importlib.import_module(f"inferwire.schemas.fb.{table}")


_fb_envelope, _fb_chunk, _fb_logprob, _fb_top, _fb_usage = (
    _generated(t) for t in ("Envelope", "TokenChunk", "TokenLogprob", "TopLogprob", "Usage")
)
_fb_embedding, _fb_tensor, _fb_request, _fb_response = (
    _generated(t) for t in ("EmbeddingBatch", "Tensor", "InferRequest", "InferResponse")
)
_PAYLOAD: Final[Any] = _generated("Payload").Payload
Envelope: Final[Any] = _fb_envelope.Envelope
"""flatc's reader of the root table (size-prefixed: ``Envelope.GetRootAs(data, 4)``)."""


# --- encoding -----------------------------------------------------------------------------


def _string(b: Any, value: object, what: str) -> int:
    if type(value) is not str:
        raise EncodeError(f"{what} must be str, not {type(value).__name__}")
    return int(b.CreateString(value))


def _text(b: Any, value: object, what: str) -> int:
    """A required string: empty is left out (0), as it reads back the same."""
    return _string(b, value, what) if value != "" else 0


def _raw_vector(b: Any, raw: bytes | memoryview, elem_size: int, alignment: int) -> int:
    """A vector of ``raw`` bytes in one copy, written as ``Builder.CreateNumpyVector`` does."""
    b.StartVector(elem_size, len(raw) // elem_size, alignment)
    head = b.head - len(raw)
    b.head = head
    # Through a memoryview: a bytearray slice assignment is ~10x slower than memcpy here.
    with memoryview(b.Bytes) as target:
        target[head : head + len(raw)] = raw
    return int(b.EndVector())


def _offset_vector(b: Any, start_vector: Callable[[Any, int], int], offsets: list[int]) -> int:
    start_vector(b, len(offsets))
    for offset in reversed(offsets):
        b.PrependUOffsetTRelative(offset)
    return int(b.EndVector())


def _array_bytes(array: npt.NDArray[Any]) -> memoryview:
    return np.ascontiguousarray(array).reshape(-1).view(np.uint8).data


def _add_float(b: Any, slot: int, value: float) -> None:
    # Always written: the generated Add skips the default 0.0, which would lose -0.0's sign.
    b.PrependFloat64(value)
    b.Slot(slot)


def _usage(b: Any, usage: Usage | None) -> int:
    if usage is None:
        return 0
    _fb_usage.Start(b)
    _fb_usage.AddPromptTokens(b, usage.prompt_tokens)
    _fb_usage.AddCompletionTokens(b, usage.completion_tokens)
    return int(_fb_usage.End(b))


def _top_logprob(b: Any, top: TopLogprob) -> int:
    token = _string(b, top.token, "top logprob token")
    _fb_top.Start(b)
    _fb_top.AddToken(b, token)
    _add_float(b, 1, top.logprob)
    return int(_fb_top.End(b))


def _token_logprob(b: Any, lp: TokenLogprob) -> int:
    top = [_top_logprob(b, t) for t in lp.top]
    top_vector = _offset_vector(b, _fb_logprob.StartTopVector, top) if top else 0
    token = _string(b, lp.token, "logprob token")
    _fb_logprob.Start(b)
    _fb_logprob.AddToken(b, token)
    _add_float(b, 1, lp.logprob)
    _fb_logprob.AddTop(b, top_vector)
    return int(_fb_logprob.End(b))


def _chunk(b: Any, c: TokenChunk) -> int:
    logprobs = 0
    if c.logprobs is not None:  # present even when empty: "requested, none in this step"
        offsets = [_token_logprob(b, lp) for lp in c.logprobs]
        logprobs = _offset_vector(b, _fb_chunk.StartLogprobsVector, offsets)
    ids = c.token_ids
    token_ids = _raw_vector(b, struct.pack(f"<{len(ids)}I", *ids), 4, 4) if ids else 0
    finish = 0 if c.finish_reason is None else _string(b, c.finish_reason, "finish_reason")
    id_, model = _text(b, c.id, "id"), _text(b, c.model, "model")
    text, usage = _text(b, c.text, "text"), _usage(b, c.usage)
    fb = _fb_chunk
    fb.Start(b)
    fb.AddId(b, id_)
    fb.AddModel(b, model)
    fb.AddCreated(b, c.created)
    fb.AddIndex(b, c.index)
    fb.AddSeq(b, c.seq)
    fb.AddTokenIds(b, token_ids)
    fb.AddText(b, text)
    fb.AddLogprobs(b, logprobs)
    fb.AddFinishReason(b, finish)
    fb.AddUsage(b, usage)
    return int(fb.End(b))


def _embedding(b: Any, e: EmbeddingBatch) -> int:
    vectors = e.vectors
    if not isinstance(vectors, np.ndarray) or vectors.ndim != 2 or vectors.dtype != np.float32:
        raise EncodeError("vectors must be a float32 matrix (batch x dim)")
    data = _raw_vector(b, _array_bytes(vectors), 4, DATA_ALIGNMENT) if vectors.size else 0
    model, usage = _text(b, e.model, "model"), _usage(b, e.usage)
    _fb_embedding.Start(b)
    _fb_embedding.AddModel(b, model)
    _fb_embedding.AddBatch(b, vectors.shape[0])
    _fb_embedding.AddDim(b, vectors.shape[1])
    _fb_embedding.AddVectors(b, data)
    _fb_embedding.AddUsage(b, usage)
    return int(_fb_embedding.End(b))


def _tensor(b: Any, t: Tensor) -> int:
    checked_dtype(t)
    data, shape = t.data, tuple(t.shape)
    raw = bytes_elements_to_raw(data) if t.datatype == "BYTES" else _array_bytes(data)
    data_vector = _raw_vector(b, raw, 1, DATA_ALIGNMENT) if len(raw) else 0
    shape_vector = _raw_vector(b, struct.pack(f"<{len(shape)}q", *shape), 8, 8) if shape else 0
    name, datatype = _text(b, t.name, "tensor name"), _string(b, t.datatype, "datatype")
    _fb_tensor.Start(b)
    _fb_tensor.AddName(b, name)
    _fb_tensor.AddDatatype(b, datatype)
    _fb_tensor.AddShape(b, shape_vector)
    _fb_tensor.AddData(b, data_vector)
    return int(_fb_tensor.End(b))


def _infer(b: Any, fb: Any, m: InferRequest | InferResponse) -> int:
    tensors = m.inputs if isinstance(m, InferRequest) else m.outputs
    offsets = [_tensor(b, t) for t in tensors]
    start = fb.StartInputsVector if isinstance(m, InferRequest) else fb.StartOutputsVector
    vector = _offset_vector(b, start, offsets) if offsets else 0
    model, id_ = _text(b, m.model, "model"), _text(b, m.id, "id")
    fb.Start(b)
    fb.AddModel(b, model)
    fb.AddId(b, id_)
    (fb.AddInputs if isinstance(m, InferRequest) else fb.AddOutputs)(b, vector)
    return int(fb.End(b))


_BUILDERS: Final[dict[type[Any], tuple[int, Callable[[Any, Any], int]]]] = {
    TokenChunk: (_PAYLOAD.TokenChunk, _chunk),
    EmbeddingBatch: (_PAYLOAD.EmbeddingBatch, _embedding),
    InferRequest: (_PAYLOAD.InferRequest, lambda b, m: _infer(b, _fb_request, m)),
    InferResponse: (_PAYLOAD.InferResponse, lambda b, m: _infer(b, _fb_response, m)),
}


def _size_hint(message: Message) -> int:
    """Bytes to have up front, so large arrays are not copied again as the builder grows."""
    if isinstance(message, EmbeddingBatch):
        return 512 + int(message.vectors.nbytes)
    if isinstance(message, InferRequest | InferResponse):
        tensors = message.inputs if isinstance(message, InferRequest) else message.outputs
        return 512 + sum(256 + int(t.data.nbytes) for t in tensors)
    return 4096


# Each thread reuses one builder (up to 16 MiB): a fresh buffer per message costs more than the
# copies into it (a new 600 kB bytearray measured ~400 us against ~30 us reused: allocator page
# faults). The builder writes every byte of its output, so nothing of an earlier message leaks.
_LOCAL: Final = threading.local()
_KEEP_BUILDER_BYTES: Final = 16 * 1024 * 1024


def _take_builder(size_hint: int) -> Any:
    builder = getattr(_LOCAL, "builder", None)
    _LOCAL.builder = None  # in use
    if builder is None or len(builder.Bytes) < size_hint:
        return flatbuffers.Builder(size_hint)
    builder.Clear()
    return builder


def _give_back(builder: Any) -> None:
    if len(builder.Bytes) <= _KEEP_BUILDER_BYTES:
        _LOCAL.builder = builder


def encode_reference(message: Message) -> bytes:
    """The size-prefixed ``Envelope`` of ``message``, written by the official
    ``flatbuffers.Builder``: the reference the compiled encoder is tested against. Raises
    :class:`EncodeError`."""
    entry = _BUILDERS.get(type(message))
    if entry is None:
        raise EncodeError(f"flatbuffers cannot encode {type(message).__name__}")
    payload_type, build = entry
    try:
        b = _take_builder(_size_hint(message))
        try:
            payload = build(b, message)
            _fb_envelope.Start(b)
            _fb_envelope.AddPayloadType(b, payload_type)
            _fb_envelope.AddPayload(b, payload)
            b.FinishSizePrefixed(_fb_envelope.End(b), file_identifier=FILE_IDENTIFIER)
            with memoryview(b.Bytes) as output:
                return bytes(output[b.Head() :])
        finally:
            _give_back(b)
    except EncodeError:
        raise
    except (*_ENCODE_ERRORS, BuilderSizeError) as exc:
        raise EncodeError(f"flatbuffers: {type(exc).__name__}: {exc}") from exc
