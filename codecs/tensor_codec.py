"""``tensor``: raw tensor bytes behind a small header, in the layout of KServe v2's binary
tensor data extension, framed on its own.

The extension (``codecs/kserve.py``) puts a JSON inference header first and the raw tensor
bytes after it, each tensor's size in its ``parameters.binary_data_size``; HTTP carries the
JSON's length in the ``Inference-Header-Content-Length`` header. A codec's bytes have no
header beside them, so this codec's framing is its own: an 8-byte prefix carries that length.

    offset 0  4 bytes  magic b"IWT\\x01"
    offset 4  4 bytes  header length H, little-endian
    offset 8  H bytes  JSON header, space-padded so the first tensor starts 64-byte aligned
    then      the tensors' raw little-endian bytes, back to back, in header order

Past the prefix the bytes are an extension body: ``data[8:]`` with an
``Inference-Header-Content-Length`` of H is a request the KServe HTTP route reads as it is. The
header always names ``model_name`` and ``id`` (the extension's are optional), every tensor goes
as binary data, and an embedding batch is one FP32 output named ``embeddings`` with its usage
in the header's ``parameters``. BYTES tensors use KServe's raw form (each element a 4-byte
little-endian length, then its bytes). Decode wraps the input with ``numpy.frombuffer``: no
tensor byte is copied, and the arrays are read-only views of the caller's buffer. Encode can
hand back the parts (header, then each tensor's memory) so a transport can write them with
``writelines`` and never concatenate.
"""

from __future__ import annotations

import struct
from typing import Any, ClassVar, Final, TypeVar, cast

import numpy as np
import orjson

from .base import DEFAULT_MAX_DEPTH, DEFAULT_MAX_ELEMENTS, BytesLike, Codec, check_limits
from .errors import CodecError, DecodeError, EncodeError
from .kserve import binary_tensor_entry, load_json, read_binary_tensor
from .model import EmbeddingBatch, InferRequest, InferResponse, Tensor, Usage

M = TypeVar("M")

MAGIC: Final = b"IWT\x01"
_PREFIX: Final = struct.Struct("<4sI")
ALIGNMENT: Final = 64
EMBEDDINGS_TENSOR: Final = "embeddings"


def _usage_obj(usage: Usage | None) -> dict[str, int] | None:
    if usage is None:
        return None
    return {"prompt_tokens": usage.prompt_tokens, "completion_tokens": usage.completion_tokens}


def _header_and_tensors(message: Any) -> tuple[dict[str, Any], str, tuple[Tensor, ...]]:
    if isinstance(message, InferRequest):
        return {"model_name": message.model, "id": message.id}, "inputs", message.inputs
    if isinstance(message, InferResponse):
        return {"model_name": message.model, "id": message.id}, "outputs", message.outputs
    if isinstance(message, EmbeddingBatch):
        vectors = message.vectors
        if vectors.ndim != 2 or vectors.dtype != np.float32:
            raise EncodeError("vectors must be a float32 matrix (batch x dim)")
        tensor = Tensor(name=EMBEDDINGS_TENSOR, datatype="FP32", shape=vectors.shape, data=vectors)
        header = {"model_name": message.model, "parameters": {"usage": _usage_obj(message.usage)}}
        return header, "outputs", (tensor,)
    raise EncodeError(f"codec 'tensor' cannot encode {type(message).__name__}")


def encode_parts(message: Any) -> list[BytesLike]:
    """The encoding as buffers to write in order: prefix and header, then each tensor's memory.

    The tensor buffers are views of the message's arrays, valid while the message is.
    """
    header, key, tensors = _header_and_tensors(message)
    entries = []
    buffers: list[BytesLike] = []
    for tensor in tensors:
        entry, raw = binary_tensor_entry(tensor)
        entries.append(entry)
        buffers.append(raw)
    header[key] = entries
    text = orjson.dumps(header)
    padded = -(-(_PREFIX.size + len(text)) // ALIGNMENT) * ALIGNMENT - _PREFIX.size
    text += b" " * (padded - len(text))  # JSON allows trailing whitespace
    return [_PREFIX.pack(MAGIC, len(text)) + text, *buffers]


def _str(value: Any) -> str:
    if type(value) is not str:
        raise DecodeError(f"expected a string in the tensor header, got {type(value).__name__}")
    return value


def _int(value: Any) -> int:
    if type(value) is not int:
        raise DecodeError(f"expected an integer in the tensor header, got {value!r}")
    return value


def _read_tensors(entries: Any, data: memoryview, pos: int) -> tuple[list[Tensor], int]:
    if type(entries) is not list:
        raise DecodeError("tensor header: inputs/outputs must be a list")
    tensors = []
    for i, entry in enumerate(entries):
        tensor, pos = read_binary_tensor(entry, data, pos, f"tensor {i}")
        tensors.append(tensor)
    return tensors, pos


def decode_message(
    data: BytesLike,
    type_: type[Any],
    *,
    max_depth: int = DEFAULT_MAX_DEPTH,
    max_elements: int = DEFAULT_MAX_ELEMENTS,
) -> Any:
    """The message in ``data``; its JSON header is held to the JSON codecs' limits."""
    view = memoryview(data).cast("B")
    if len(view) < _PREFIX.size:
        raise DecodeError(f"{len(view)} bytes is shorter than the tensor prefix")
    magic, header_length = _PREFIX.unpack_from(view)
    if magic != MAGIC:
        raise DecodeError(f"not a tensor message: magic {bytes(magic)!r}")
    pos = _PREFIX.size + header_length
    if pos > len(view):
        raise DecodeError(f"header of {header_length} bytes overruns the {len(view)}-byte buffer")
    header = load_json(view[_PREFIX.size : pos], max_depth, max_elements)
    if type(header) is not dict:
        raise DecodeError("tensor header must be a JSON object")
    if type_ is EmbeddingBatch:
        tensors, pos = _read_tensors(header["outputs"], view, pos)
        if len(tensors) != 1 or tensors[0].datatype != "FP32" or len(tensors[0].shape) != 2:
            raise DecodeError("an embedding batch is one FP32 matrix")
        usage = header["parameters"]["usage"]
        result: Any = EmbeddingBatch(
            model=_str(header["model_name"]),
            vectors=tensors[0].data,
            usage=None
            if usage is None
            else Usage(
                prompt_tokens=_int(usage["prompt_tokens"]),
                completion_tokens=_int(usage["completion_tokens"]),
            ),
        )
    elif type_ is InferRequest or type_ is InferResponse:
        key = "inputs" if type_ is InferRequest else "outputs"
        tensors, pos = _read_tensors(header[key], view, pos)
        result = type_(
            model=_str(header["model_name"]), id=_str(header["id"]), **{key: tuple(tensors)}
        )
    else:
        raise DecodeError(f"codec 'tensor' cannot decode into {type_!r}")
    if pos != len(view):
        raise DecodeError(f"{len(view) - pos} bytes after the last tensor")
    return result


class TensorCodec(Codec):
    name: ClassVar[str] = "tensor"
    media_type: ClassVar[str] = "application/vnd.inferwire.tensor"
    stream_media_type: ClassVar[str] = "application/vnd.inferwire.frames+tensor"
    types: ClassVar[frozenset[type[Any]]] = frozenset({EmbeddingBatch, InferRequest, InferResponse})
    default_stream_type: ClassVar[type[Any]] = InferResponse

    def __init__(
        self,
        *,
        max_depth: int = DEFAULT_MAX_DEPTH,
        max_elements: int = DEFAULT_MAX_ELEMENTS,
        extensions: bool = True,
    ) -> None:
        check_limits(max_depth, max_elements)
        self._use_extensions(extensions)
        self.max_depth = max_depth
        self.max_elements = max_elements

    def encode_parts(self, message: Any, /) -> list[BytesLike]:
        """See :func:`encode_parts`."""
        try:
            return encode_parts(message)
        except CodecError:
            raise
        except (TypeError, ValueError, KeyError) as exc:
            raise EncodeError(f"tensor: {exc}") from exc

    def encode(self, message: Any, /) -> bytes:
        return b"".join(self.encode_parts(message))

    def decode(self, data: BytesLike, type_: type[M], /) -> M:
        try:
            return cast(
                "M",
                decode_message(
                    data, type_, max_depth=self.max_depth, max_elements=self.max_elements
                ),
            )
        except CodecError:
            raise
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            raise DecodeError(f"tensor: {type(exc).__name__}: {exc}") from exc
