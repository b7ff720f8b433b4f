"""inferwire.codecs: one small, typed API over every wire format inferwire measures.

    import inferwire.codecs as ic
    codec = ic.get("protobuf")
    data = codec.encode(chunk)
    chunk2 = codec.decode(data, ic.TokenChunk)

Each codec lives in a module of its own; adding one is adding a module and a line in
``_FACTORIES``. Codecs whose library is missing fail at :func:`get` with a message that says
what to install, never at import of this package.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any, Final, cast

from .base import DEFAULT_MAX_DEPTH, DEFAULT_MAX_ELEMENTS, Codec
from .errors import (
    AlteredStreamError,
    BadMagicError,
    CodecError,
    CorruptRegistryError,
    DecodeError,
    DepthLimitError,
    DuplicateFrameError,
    ElementBudgetError,
    EncodeError,
    FrameTooLargeError,
    IncompatibleSchemaError,
    IncompleteStreamError,
    ReorderedFrameError,
    SchemaError,
    SchemaRegistryUnavailableError,
    SequenceError,
    SequenceGapError,
    UnknownCodecError,
    UnknownSchemaError,
    VerificationError,
)
from .framing import DEFAULT_MAX_FRAME_BYTES, BytesLike, StreamDecoder, StreamEncoder
from .integrity import StreamVerifier
from .model import (
    DATATYPES,
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
from .schema_registry import (
    CachingResolver,
    Compatibility,
    RegisteredSchema,
    Schema,
    SchemaRegistry,
    SchemaResolver,
)

__all__ = [
    "DATATYPES",
    "DEFAULT_MAX_DEPTH",
    "DEFAULT_MAX_ELEMENTS",
    "DEFAULT_MAX_FRAME_BYTES",
    "AlteredStreamError",
    "BadMagicError",
    "BytesLike",
    "CachingResolver",
    "Codec",
    "CodecError",
    "Compatibility",
    "CorruptRegistryError",
    "DecodeError",
    "DepthLimitError",
    "DuplicateFrameError",
    "ElementBudgetError",
    "EmbeddingBatch",
    "EncodeError",
    "FrameTooLargeError",
    "IncompatibleSchemaError",
    "IncompleteStreamError",
    "InferRequest",
    "InferResponse",
    "Message",
    "RegisteredSchema",
    "ReorderedFrameError",
    "Schema",
    "SchemaError",
    "SchemaRegistry",
    "SchemaRegistryUnavailableError",
    "SchemaResolver",
    "SequenceError",
    "SequenceGapError",
    "StreamDecoder",
    "StreamEncoder",
    "StreamVerifier",
    "Tensor",
    "TokenChunk",
    "TokenLogprob",
    "TopLogprob",
    "UnknownCodecError",
    "UnknownSchemaError",
    "Usage",
    "VerificationError",
    "get",
    "names",
    "names_for",
]

# name -> (module, class): imported on first use so one missing optional library does not
# break the others.
_FACTORIES: Final[dict[str, tuple[str, str]]] = {
    "json": ("json_codec", "JsonCodec"),
    "orjson": ("orjson_codec", "OrjsonCodec"),
    "msgpack": ("msgpack_codec", "MsgpackCodec"),
    "msgspec-json": ("msgspec_codec", "MsgspecJsonCodec"),
    "msgspec-msgpack": ("msgspec_codec", "MsgspecMsgpackCodec"),
    "protobuf": ("protobuf_codec", "ProtobufCodec"),
    "flatbuffers": ("flatbuffers_codec", "FlatbuffersCodec"),
    "tensor": ("tensor_codec", "TensorCodec"),
    "delta": ("delta_codec", "DeltaCodec"),
}
_instances: dict[str, Codec] = {}


def names() -> list[str]:
    """The registered codec names, in a stable order."""
    return list(_FACTORIES)


def _codec_class(name: str) -> Callable[..., Codec]:
    try:
        module_name, class_name = _FACTORIES[name]
    except KeyError:
        raise UnknownCodecError(
            f"unknown codec {name!r}; registered: {', '.join(_FACTORIES)}"
        ) from None
    module = importlib.import_module(f"{__name__}.{module_name}")
    factory: Callable[..., Codec] = getattr(module, class_name)
    return factory


def get(name: str, **options: Any) -> Codec:
    """The codec registered as ``name``; with options (e.g. ``framing="ndjson"``), a new one.

    Raises :class:`UnknownCodecError` for a name that is not registered.
    """
    if options:
        return _codec_class(name)(**options)
    codec = _instances.get(name)
    if codec is None:
        codec = _instances[name] = _codec_class(name)()
    return codec


def names_for(media_type: str) -> list[str]:
    """The names of the codecs whose unary body or stream is ``media_type`` (parameters and
    case ignored), in registry order: the reverse of :attr:`Codec.media_type` and
    :attr:`Codec.stream_media_type`. ``text/event-stream`` is every JSON codec's stream, and
    ``application/json`` their body; a type no codec writes gives ``[]``."""
    wanted = media_type.split(";", 1)[0].strip().lower()
    found = []
    for name in _FACTORIES:
        codec_class = cast("type[Codec]", _codec_class(name))
        if wanted in (codec_class.media_type, codec_class.stream_media_type):
            found.append(name)
    return found
