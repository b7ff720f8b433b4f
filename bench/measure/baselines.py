"""What each codec is compared with: the same work without the codec API, and the library alone.

For every codec three levels are timed on the same message:

- ``codec``: ``codec.encode(m)`` / ``codec.decode(b, T)``, the public API;
- ``direct``: the same conversion and library call, written out with no API layer (no registry,
  no type dispatch, no error translation): the wrapper's own cost is ``codec / direct``. The
  hostile-input limits are work, not API: input long enough to need the scan is scanned here
  too, and the stdlib json level checks its logprobs are finite as its codec does;
- ``library``: the library's call alone on data already in its native form (the prepared dict,
  a prebuilt protobuf message or Struct, the bytes to parse): what is left if conversion from
  and to the model values were free. ``library / codec`` is the library's share of the work.

``protobuf`` marshals token chunks in C by default (no upb message at all): its ``direct`` level
is that compiled path, as the codec's is, while its ``library`` level stays upb's call on a
prebuilt message, so a library share over 100% there means the compiled path does the whole
conversion in less time than upb takes to serialize or parse alone.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import msgpack
import numpy as np
import orjson

import inferwire.codecs as ic
from inferwire.codecs import (
    EmbeddingBatch,
    InferRequest,
    InferResponse,
    Message,
    TokenChunk,
    json_codec,
    msgspec_codec,
    protobuf_codec,
    tensor_codec,
)
from inferwire.codecs import flatbuffers_codec as fbc
from inferwire.codecs import openai as oa
from inferwire.codecs.base import DEFAULT_MAX_DEPTH, DEFAULT_MAX_ELEMENTS, limit_scan

_TO_OBJ: dict[type[Any], Callable[[Any, bool], Any]] = {
    TokenChunk: lambda m, binary: oa.chunk_to_obj(m, binary=binary),
    EmbeddingBatch: lambda m, binary: oa.embeddings_to_obj(m, binary=binary),
    InferRequest: lambda m, binary: oa.request_to_obj(m, binary=binary),
    InferResponse: lambda m, binary: oa.response_to_obj(m, binary=binary),
}
_FROM_OBJ: dict[type[Any], Callable[[Any, bool], Any]] = {
    TokenChunk: lambda o, binary: oa.chunk_from_obj(o),
    EmbeddingBatch: lambda o, binary: oa.embeddings_from_obj(o, binary=binary),
    InferRequest: lambda o, binary: oa.request_from_obj(o, binary=binary),
    InferResponse: lambda o, binary: oa.response_from_obj(o, binary=binary),
}


@dataclass(frozen=True, slots=True, kw_only=True)
class Baseline:
    """The ``direct`` and ``library`` levels of one codec (see the module docstring)."""

    direct_encode: Callable[[Message], bytes]
    direct_decode: Callable[[bytes, type[Any]], Any]
    prepare: Callable[[Message], Any]
    """The message in the library's native form, built once, outside the timing."""
    library_encode: Callable[[Any], Any]
    library_decode: Callable[[bytes, type[Any]], Any]
    library_output_ok: Callable[[Any, bytes], bool] = lambda out, encoded: bytes(out) == encoded
    """Whether the library level's output is the codec's encoding (or its payload part)."""


def _scanned(parse: Callable[[bytes], Any], binary: bool) -> Callable[[bytes], Any]:
    """``parse`` behind the same limit scan the codecs run (see ``DictCodec``)."""
    check, above = limit_scan(binary, DEFAULT_MAX_DEPTH, DEFAULT_MAX_ELEMENTS)

    def scanned(data: bytes) -> Any:
        if len(data) > above:
            check(data, DEFAULT_MAX_DEPTH, DEFAULT_MAX_ELEMENTS)
        return parse(data)

    return scanned


def _dict_baseline(
    dumps: Callable[[Any], bytes],
    loads: Callable[[bytes], Any],
    binary: bool,
    from_obj: dict[type[Any], Callable[[Any, bool], Any]] = _FROM_OBJ,
) -> Baseline:
    guarded = _scanned(loads, binary)
    return Baseline(
        direct_encode=lambda m: dumps(_TO_OBJ[type(m)](m, binary)),
        direct_decode=lambda b, t: from_obj[t](guarded(b), binary),
        prepare=lambda m: _TO_OBJ[type(m)](m, binary),
        library_encode=dumps,
        library_decode=lambda b, t: loads(b),
    )


def _msgspec_baseline(name: str) -> Baseline:
    # the codec's own Structs and msgspec coders, with inferwire's extensions as the suite
    # times the codec: the conversion is the codec's, only its API layer is left out
    codec = cast(
        "msgspec_codec.MsgspecJsonCodec | msgspec_codec.MsgspecMsgpackCodec",
        ic.get(name, extensions=True),
    )
    encoder = codec._dumps
    decoders = codec._decoders
    to_struct = codec._to_struct
    from_struct = codec._from_struct
    guarded = {t: _scanned(d.decode, codec.binary) for t, d in decoders.items()}
    return Baseline(
        direct_encode=lambda m: encoder(to_struct[type(m)](m)),
        direct_decode=lambda b, t: from_struct[t][1](guarded[t](b)),
        prepare=lambda m: to_struct[type(m)](m),
        library_encode=encoder,
        library_decode=lambda b, t: decoders[t].decode(b),
    )


def _protobuf_direct_encode(message: Any) -> bytes:
    # the codec's path: token chunks through the compiled marshalling where it is used
    fast = protobuf_codec.compiled()
    data = None if fast is None else fast.encode_chunk(message)
    if data is not None:
        return data
    return cast("bytes", protobuf_codec.TO_PB[type(message)](message).SerializeToString())


def _protobuf_direct_decode(data: bytes, type_: type[Any]) -> Any:
    fast = protobuf_codec.compiled() if type_ is TokenChunk else None
    chunk = None if fast is None else fast.decode_chunk(data, DEFAULT_MAX_ELEMENTS)
    if chunk is not None:
        return chunk
    message_class, from_pb = protobuf_codec.FROM_PB[type_]
    msg = message_class.FromString(data)
    budget = DEFAULT_MAX_ELEMENTS  # the element count is work, not API (see the docstring)
    if len(data) > budget and protobuf_codec.ELEMENTS[type_](msg, budget) > budget:
        raise ValueError("over the element budget")
    return from_pb(msg)


def _tensor_direct_decode(data: bytes, type_: type[Any]) -> Any:
    return tensor_codec.decode_message(data, type_)


def _fb_library_decode(data: bytes, type_: type[Any]) -> Any:
    # the generated accessor alone: no verification, no view object
    return fbc.Envelope.GetRootAs(data, 4).PayloadType()  # after the size prefix


BASELINES: dict[str, Baseline] = {
    "json": _dict_baseline(
        json_codec.dumps,
        json_codec.loads,
        False,
        {**_FROM_OBJ, TokenChunk: lambda o, binary: oa.chunk_from_obj(o, oa.finite_float)},
    ),
    "orjson": _dict_baseline(orjson.dumps, orjson.loads, False),
    "msgpack": _dict_baseline(
        lambda o: msgpack.packb(o, use_bin_type=True),
        lambda b: msgpack.unpackb(b, raw=False, strict_map_key=True),
        True,
    ),
    "msgspec-json": _msgspec_baseline("msgspec-json"),
    "msgspec-msgpack": _msgspec_baseline("msgspec-msgpack"),
    "protobuf": Baseline(
        direct_encode=_protobuf_direct_encode,
        direct_decode=_protobuf_direct_decode,
        prepare=lambda m: protobuf_codec.TO_PB[type(m)](m),
        library_encode=lambda pb: pb.SerializeToString(),
        library_decode=lambda b, t: protobuf_codec.FROM_PB[t][0].FromString(b),
    ),
    "flatbuffers": Baseline(
        direct_encode=fbc.encode_message,
        direct_decode=fbc.decode_message,
        prepare=lambda m: fbc.encode_message(m),
        # building is the library call itself: bytes() of a finished builder's output
        library_encode=bytes,
        library_decode=_fb_library_decode,
    ),
    "tensor": Baseline(
        direct_encode=lambda m: b"".join(tensor_codec.encode_parts(m)),
        direct_decode=_tensor_direct_decode,
        prepare=lambda m: m,
        # the floor of any tensor encoding: one copy of the array bytes
        library_encode=lambda m: _raw_bytes(m),
        library_decode=lambda b, t: np.frombuffer(b, dtype=np.uint8),
        library_output_ok=lambda out, encoded: encoded.endswith(out),
    ),
}


def _raw_bytes(message: Any) -> bytes:
    tensors = (
        message.inputs
        if isinstance(message, InferRequest)
        else (message.outputs if isinstance(message, InferResponse) else None)
    )
    if tensors is None:
        return bytes(message.vectors.tobytes())
    return b"".join(t.data.tobytes() for t in tensors)


def read_all(message: Any) -> int:
    """Touch every field a client would read; returns a checksum so nothing is optimized out.

    Arrays are read at their first and last element: a zero-copy view must then be valid
    end to end, and the sum over every element would time numpy, not the codec.
    """
    if isinstance(message, TokenChunk) or hasattr(message, "token_ids"):
        total = len(message.id) + len(message.model) + message.created + message.index
        total += message.seq + sum(message.token_ids) + len(message.text)
        if message.logprobs is not None:
            for lp in message.logprobs:
                total += len(lp.token) + int(lp.logprob)
                for top in lp.top:
                    total += len(top.token) + int(top.logprob)
        if message.finish_reason is not None:
            total += len(message.finish_reason)
        if message.usage is not None:
            total += message.usage.prompt_tokens + message.usage.completion_tokens
        return int(total)
    if hasattr(message, "vectors"):
        vectors = message.vectors
        return len(message.model) + int(vectors.flat[0] != vectors.flat[-1])
    tensors = message.inputs if hasattr(message, "inputs") else message.outputs
    total = len(message.model) + len(message.id)
    for tensor in tensors:
        data = tensor.data
        total += len(tensor.name) + len(tensor.datatype) + len(tensor.shape)
        if data.size:
            total += int(data.flat[0] == data.flat[-1])
    return total
