"""The model as the plain objects OpenAI- and KServe-compatible servers put on the wire.

Shared by the dict-based codecs (``json``, ``orjson``, ``msgpack``), so that each of them
encodes exactly what a client of such a server receives:

- a :class:`TokenChunk` is an OpenAI ``chat.completion.chunk`` (``choices[0].delta.content``,
  ``choices[0].logprobs.content[i].top_logprobs``, ``usage`` on the last chunk). By default
  (``extensions=False`` in a JSON codec) the chunk has exactly the fields vLLM sends
  (``logprobs`` included, ``null`` when absent, as vLLM and OpenAI write it), and reading one
  is tolerant of what such a server leaves out: ``seq`` is then the chunk's place in its
  stream (0 read alone), ``token_ids`` empty, a missing ``logprobs`` or ``content`` null or
  empty. With ``extensions=True`` (always, in MessagePack), two fields OpenAI does not define
  ride along, as vLLM's ``return_token_ids`` does: ``choices[0].token_ids`` and the top-level
  ``seq``, which a stream needs to prove itself whole (:mod:`inferwire.codecs.integrity`);
  OpenAI clients ignore unknown fields.
- an :class:`EmbeddingBatch` is an OpenAI embeddings response (``data[i].embedding``); with
  ``binary=True`` each row is its raw float32 bytes (as ``encoding_format="base64"`` carries
  them, without the base64).
- :class:`InferRequest`/:class:`InferResponse` follow the KServe v2 JSON inference protocol;
  with ``binary=True`` a tensor's ``data`` is its raw little-endian bytes.

Decoding checks every field's type: a wrong type is a :class:`DecodeError` (raised by the
caller's boundary from the ``KeyError``/``TypeError``/``ValueError`` raised here), never a
value of the wrong type in the model.

The chunk mapping is compiled (:mod:`inferwire.codecs._openai_accel`, when it is built): on
a one-token ``stream-256`` chunk, ``chunk_from_obj`` in Python cost as much as orjson.loads
(0.69 us each) and ``chunk_to_obj`` 2.4x orjson.dumps (0.48 us against 0.20 us), so the
mapping, not the JSON library, was most of a dict codec's per-chunk cost. Compiled, they take
0.17 us and 0.33 us (what is left is allocating the dicts), and the orjson codec decodes such
a chunk in 1.1 us instead of 1.8, encodes it in 0.61 us instead of 0.78. :func:`chunk_to_obj`
and :func:`chunk_from_obj` are the compiled functions, with the signatures of their Python
references :func:`chunk_to_obj_reference` and :func:`chunk_from_obj_reference`. They take
the shapes a stream has (exact model types; exact dicts, lists and field types; the default
``number`` and no ``position``) and call the reference with the same arguments for anything
else, so the dict, the chunk or the exception is the reference's. ``INFERWIRE_PURE_PYTHON=1``
in the environment, read at import, leaves the extension unused.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Final, Protocol

import numpy as np

from . import extensions
from .errors import DecodeError, EncodeError
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

CHUNK_OBJECT: Final = "chat.completion.chunk"
Obj = dict[str, Any]


def _finite(value: float) -> float:
    # JSON has no NaN or Infinity; a codec that wrote null or NaN would change the value.
    if not math.isfinite(value):
        raise EncodeError(f"non-finite float {value!r} cannot be carried")
    return value


def _any(value: float) -> float:
    return value


def _logprob_obj(lp: TokenLogprob, number: Callable[[float], float]) -> Obj:
    return {
        "token": lp.token,
        "logprob": number(lp.logprob),
        "bytes": list(lp.token.encode()),
        "top_logprobs": [
            {"token": t.token, "logprob": number(t.logprob), "bytes": list(t.token.encode())}
            for t in lp.top
        ],
    }


def usage_obj(usage: Usage | None) -> Obj | None:
    """OpenAI's ``usage`` object (``total_tokens`` is the sum)."""
    if usage is None:
        return None
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
    }


def logprobs_content(logprobs: tuple[TokenLogprob, ...]) -> list[Obj]:
    """``logprobs.content`` of a chat completion (or of one chunk) in JSON."""
    return [_logprob_obj(lp, _finite) for lp in logprobs]


def chunk_to_obj_reference(
    chunk: TokenChunk, *, binary: bool = False, extensions: bool = True
) -> Obj:
    """The ``chat.completion.chunk`` of ``chunk`` (the reference of the compiled
    :func:`chunk_to_obj`)."""
    # MessagePack carries any double bit for bit; JSON has no text for NaN or infinities.
    number = _any if binary else _finite
    delta: Obj = (
        {"role": "assistant", "content": chunk.text} if chunk.seq == 0 else {"content": chunk.text}
    )
    logprobs = chunk.logprobs
    choice: Obj = {
        "index": chunk.index,
        "delta": delta,
        "logprobs": None
        if logprobs is None
        else {"content": [_logprob_obj(lp, number) for lp in logprobs]},
        "finish_reason": chunk.finish_reason,
    }
    obj: Obj = {
        "id": chunk.id,
        "object": CHUNK_OBJECT,
        "created": chunk.created,
        "model": chunk.model,
    }
    if extensions:  # in this order, so the bytes are what they were before the option
        choice["token_ids"] = list(chunk.token_ids)
        obj["seq"] = chunk.seq
    obj["choices"] = [choice]
    if chunk.usage is not None:
        obj["usage"] = usage_obj(chunk.usage)
    return obj


def _str(value: Any) -> str:
    if type(value) is not str:
        raise TypeError(f"expected a string, got {type(value).__name__}")
    return value


def _int(value: Any) -> int:
    if type(value) is not int:
        raise TypeError(f"expected an integer, got {type(value).__name__}")
    return value


def _float(value: Any) -> float:
    # JSON writes an integral float without a fraction in some encoders: accept ints.
    if type(value) is float:
        return value
    if type(value) is int:
        return float(value)
    raise TypeError(f"expected a number, got {type(value).__name__}")


read_number: Final = _float
"""How a logprob is read by a parser that never yields an infinity."""


def checked_extensions(codec: str, binary: bool, extensions: bool | None) -> bool:
    """``extensions`` of a codec's constructor: only the JSON codecs can leave inferwire's
    fields out (OpenAI's wire is JSON; a binary stream is inferwire's own and carries all).
    None is the format's default: OpenAI's chunk in JSON, everything in a binary format."""
    if extensions is None:
        return binary
    if type(extensions) is not bool:
        raise ValueError("extensions must be True or False")
    if binary and not extensions:
        raise ValueError(f"codec {codec!r} always carries inferwire's fields (extensions)")
    return extensions


def finite_float(value: Any) -> float:
    """:func:`_float` for text whose parser turns an out-of-range number (``1e400``) into an
    infinity: JSON has no infinities, so such a value was never the writer's."""
    number = _float(value)
    if not math.isfinite(number):
        raise ValueError(f"number out of range for a double: {number!r}")
    return number


def _usage(obj: Any) -> Usage | None:
    if obj is None:
        return None
    return Usage(
        prompt_tokens=_int(obj["prompt_tokens"]), completion_tokens=_int(obj["completion_tokens"])
    )


def _token_logprob(obj: Obj, number: Callable[[Any], float]) -> TokenLogprob:
    return new_token_logprob(
        _str(obj["token"]),
        number(obj["logprob"]),
        tuple(new_top_logprob(_str(t["token"]), number(t["logprob"])) for t in obj["top_logprobs"]),
    )


def chunk_from_obj_reference(
    obj: Obj, number: Callable[[Any], float] = _float, *, position: int | None = None
) -> TokenChunk:
    """The chunk in ``obj`` (the reference of the compiled :func:`chunk_from_obj`); ``number``
    reads each logprob (:func:`finite_float` for a parser that reads ``1e400`` as infinity).
    With a ``position`` (the chunk's place in its stream), the chunk may lack inferwire's
    extensions, as an OpenAI-compatible server writes it (see the module docstring); without,
    it must carry them."""
    if obj["object"] != CHUNK_OBJECT:
        raise DecodeError(f"not a {CHUNK_OBJECT}: object={obj['object']!r}")
    choices = obj["choices"]
    if position is not None and not choices:
        raise DecodeError(
            "a chunk without choices (the usage chunk of stream_options.include_usage) "
            "carries no tokens"
        )
    (choice,) = choices
    if position is None:
        logprobs = choice["logprobs"]
        token_ids = choice["token_ids"]
        seq = obj["seq"]
        content = choice["delta"]["content"]
    else:
        logprobs = choice.get("logprobs")
        token_ids = choice.get("token_ids") or ()
        seq = obj.get("seq", position)
        content = choice["delta"].get("content") or ""
    for token_id in token_ids:
        if type(token_id) is not int:
            raise TypeError("token_ids must be integers")
    finish_reason = choice["finish_reason"] if position is None else choice.get("finish_reason")
    return new_token_chunk(
        _str(obj["id"]),
        _str(obj["model"]),
        _int(obj["created"]),
        _int(choice["index"]),
        _int(seq),
        tuple(token_ids),
        _str(content),
        None
        if logprobs is None
        else tuple([_token_logprob(lp, number) for lp in logprobs["content"]]),
        None if finish_reason is None else _str(finish_reason),
        _usage(obj.get("usage")),
    )


# --- the compiled mapping ------------------------------------------------------------------


class _Accelerator(Protocol):
    """What the C extension provides (codecs/_openai_accel.c; its stub has the details)."""

    API_VERSION: int

    def chunk_to_obj(
        self, chunk: TokenChunk, *, binary: bool = False, extensions: bool = True
    ) -> Obj: ...

    def chunk_from_obj(
        self, obj: Obj, number: Callable[[Any], float] = _float, *, position: int | None = None
    ) -> TokenChunk: ...


_ACCEL_API_VERSION: Final = 1


def _load_accelerator() -> _Accelerator | None:
    """The C extension, bound to the model classes and the references; None when absent,
    stale or turned off."""
    accel: _Accelerator | None = extensions.load(
        "_openai_accel",
        _ACCEL_API_VERSION,
        lambda module: module.configure(
            TokenChunk,
            TokenLogprob,
            TopLogprob,
            Usage,
            chunk_to_obj_reference,
            chunk_from_obj_reference,
            _float,
        ),
        "using the pure-Python chunk mapping",
    )
    return accel


_accel = _load_accelerator()


def accelerated() -> bool:
    """Whether :func:`chunk_to_obj` and :func:`chunk_from_obj` are the compiled ones."""
    return _accel is not None


# With the references' signatures: the compiled functions hand what they do not take to them.
chunk_to_obj = chunk_to_obj_reference
chunk_from_obj = chunk_from_obj_reference
if _accel is not None:
    chunk_to_obj = _accel.chunk_to_obj
    chunk_from_obj = _accel.chunk_from_obj


def embeddings_to_obj(batch: EmbeddingBatch, *, binary: bool) -> Obj:
    vectors = batch.vectors
    if vectors.ndim != 2 or vectors.dtype != np.float32 or vectors.shape[0] == 0:
        raise EncodeError("vectors must be a non-empty float32 matrix (batch x dim)")
    if binary:
        rows: list[Any] = [np.ascontiguousarray(row).tobytes() for row in vectors]
    else:
        if not np.isfinite(vectors).all():
            raise EncodeError("non-finite float in vectors cannot be carried as JSON")
        rows = vectors.tolist()
    return {
        "object": "list",
        "data": [
            {"object": "embedding", "index": i, "embedding": row} for i, row in enumerate(rows)
        ],
        "model": batch.model,
        "usage": usage_obj(batch.usage),
    }


def embeddings_from_obj(obj: Obj, *, binary: bool) -> EmbeddingBatch:
    if obj["object"] != "list":
        raise DecodeError(f"not an embeddings list: object={obj['object']!r}")
    data = obj["data"]
    if not data:
        raise DecodeError("an embedding batch holds at least one vector")
    rows = [item["embedding"] for item in data]
    if binary:
        dim, rest = divmod(len(rows[0]), 4)
        if rest or any(len(row) != len(rows[0]) for row in rows):
            raise DecodeError("embedding rows of unequal or non-float32 byte lengths")
        vectors = np.frombuffer(b"".join(rows), dtype="<f4").reshape(len(rows), dim)
    else:
        vectors = numbers_to_array(rows, np.dtype("<f4"))
        if vectors.ndim != 2:
            raise DecodeError("embedding rows of unequal lengths")
    return EmbeddingBatch(model=_str(obj["model"]), vectors=vectors, usage=_usage(obj["usage"]))


def numbers_to_array(values: Any, dtype: np.dtype[Any]) -> np.ndarray[Any, Any]:
    """A JSON array of numbers as ``dtype``, refusing any value the cast would change."""
    try:
        inferred = np.array(values)
    except ValueError as exc:  # ragged
        raise DecodeError("array rows of unequal lengths") from exc
    kind = inferred.dtype.kind
    if inferred.size == 0:
        return inferred.astype(dtype)
    if dtype.kind == "b":
        if kind != "b":
            raise DecodeError(f"expected booleans, got {inferred.dtype}")
        return inferred
    if dtype.kind in "iu" and kind not in "iu":
        # numpy reads ints past int64 beside small ones ([2**64 - 1, 0]) as float64, losing
        # them: read integer data from the values themselves, each checked to be an int.
        if not all(type(v) is int for v in np.array(values, dtype=object).flat):
            raise DecodeError(f"expected integers for {dtype}")
        try:
            return np.array(values, dtype=dtype)
        except OverflowError as exc:
            raise DecodeError(f"integer out of range for {dtype}") from exc
    if kind not in "iu" and not (dtype.kind == "f" and kind == "f"):
        raise DecodeError(f"expected numbers for {dtype}, got {inferred.dtype}")
    with np.errstate(over="ignore", invalid="ignore"):
        cast = inferred.astype(dtype)
    if dtype.kind == "f":
        if not np.isfinite(cast).all():
            raise DecodeError(f"value out of range for {dtype}")
    elif not np.array_equal(cast, inferred):
        raise DecodeError(f"integer out of range for {dtype}")
    return cast


def tensor_to_obj(tensor: Tensor, *, binary: bool) -> Obj:
    checked_dtype(tensor)
    data = tensor.data
    payload: Any
    if tensor.datatype == "BYTES":
        if binary:
            payload = bytes_elements_to_raw(data)
        else:
            try:
                payload = [element.decode() for element in data.flat]
            except (AttributeError, UnicodeDecodeError) as exc:
                raise EncodeError("JSON carries BYTES elements as UTF-8 text only") from exc
    elif binary:
        payload = np.ascontiguousarray(data).tobytes()
    else:
        if data.dtype.kind == "f" and not np.isfinite(data).all():
            raise EncodeError("non-finite float in tensor cannot be carried as JSON")
        payload = data.ravel().tolist()
    return {
        "name": tensor.name,
        "shape": list(tensor.shape),
        "datatype": tensor.datatype,
        "data": payload,
    }


def tensor_from_obj(obj: Obj, *, binary: bool) -> Tensor:
    datatype = _str(obj["datatype"])
    shape = tuple(_int(d) for d in obj["shape"])
    dtype, count = checked_layout(datatype, shape)
    data = obj["data"]
    if datatype == "BYTES":
        if binary:
            array = bytes_elements_from_raw(data, count)
        else:
            array = np.empty(len(data), dtype=object)
            for i, element in enumerate(data):
                array[i] = _str(element).encode()
    elif binary:
        if type(data) is not bytes or len(data) != count * dtype.itemsize:
            raise DecodeError(f"tensor data is not {count} elements of {datatype}")
        array = np.frombuffer(data, dtype=dtype)
    else:
        array = numbers_to_array(data, dtype)
        if array.ndim != 1:
            raise DecodeError("KServe JSON tensor data must be a flat array")
    if array.size != count:
        raise DecodeError(f"tensor data has {array.size} elements, shape {shape} needs {count}")
    return Tensor(name=_str(obj["name"]), datatype=datatype, shape=shape, data=array.reshape(shape))


def request_to_obj(request: InferRequest, *, binary: bool) -> Obj:
    return {
        "model_name": request.model,
        "id": request.id,
        "inputs": [tensor_to_obj(t, binary=binary) for t in request.inputs],
    }


def request_from_obj(obj: Obj, *, binary: bool) -> InferRequest:
    return InferRequest(
        model=_str(obj["model_name"]),
        id=_str(obj["id"]),
        inputs=tuple([tensor_from_obj(t, binary=binary) for t in obj["inputs"]]),
    )


def response_to_obj(response: InferResponse, *, binary: bool) -> Obj:
    return {
        "model_name": response.model,
        "id": response.id,
        "outputs": [tensor_to_obj(t, binary=binary) for t in response.outputs],
    }


def response_from_obj(obj: Obj, *, binary: bool) -> InferResponse:
    return InferResponse(
        model=_str(obj["model_name"]),
        id=_str(obj["id"]),
        outputs=tuple([tensor_from_obj(t, binary=binary) for t in obj["outputs"]]),
    )
