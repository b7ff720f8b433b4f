"""inferwire.codecs: one small, typed API over every wire format inferwire measures.

    import inferwire.codecs as ic
    codec = ic.get("protobuf")
    data = codec.encode(chunk)
    chunk2 = codec.decode(data, ic.TokenChunk)
    encoder = codec.stream_encoder()        # one stream: encoder.encode(chunk), encoder.end()

The top level holds what a user of a codec needs: :func:`get`, :func:`names`,
:func:`names_for`, the :class:`Codec` surface, the model types, and the error root with the
errors a caller acts on. The rest is in submodules: the stream encoder and decoder protocols
and framing in :mod:`.framing`, the stream checks (``StreamVerifier``) in :mod:`.integrity`,
the schema registry in :mod:`.schema_registry`, every error in :mod:`.errors`, the decode
limits in :mod:`.base`.

The JSON codecs (``json``, ``orjson``, ``msgspec-json``) write OpenAI's chunk by default, the
bytes an OpenAI-compatible server sends; ``get(name, extensions=True)`` adds inferwire's
``seq`` and ``token_ids``, which a stream needs to prove itself whole (every binary codec
carries them, and every codec takes the option).

Each codec lives in a module of its own; adding one is adding a module and a line in
``_FACTORIES``. Codecs whose library is missing fail at :func:`get` with a message that says
what to install, never at import of this package.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any, Final, cast

from .base import Codec
from .errors import (
    CodecError,
    DecodeError,
    EncodeError,
    FrameTooLargeError,
    IncompleteStreamError,
    UnknownCodecError,
    UnknownSchemaError,
)
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

__all__ = [
    "Codec",
    "CodecError",
    "DecodeError",
    "EmbeddingBatch",
    "EncodeError",
    "FrameTooLargeError",
    "IncompleteStreamError",
    "InferRequest",
    "InferResponse",
    "Message",
    "Tensor",
    "TokenChunk",
    "TokenLogprob",
    "TopLogprob",
    "UnknownCodecError",
    "UnknownSchemaError",
    "Usage",
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
_instances: dict[object, Codec] = {}
# Option values a cached codec may be keyed by: values that cannot change. An object (a
# registry, a resolver) may, so a codec built with one is built anew each time.
_PLAIN: Final = (str, int, float, bool, bytes, type(None))


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
    """The codec registered as ``name``, built with ``options`` (e.g. ``framing="ndjson"``,
    ``extensions=True``).

    A codec never changes once built, so the same name and options give the same instance
    (options of plain values: an option that is an object, such as a schema registry, gives
    a new codec each call). Raises :class:`UnknownCodecError` for a name that is not
    registered.
    """
    if all(type(value) in _PLAIN for value in options.values()):
        # the type is part of the key: extensions=1 must not find the codec of extensions=True
        key = (name, *sorted((k, type(v), v) for k, v in options.items()))
        codec = _instances.get(key)
        if codec is None:
            codec = _instances[key] = _codec_class(name)(**options)
        return codec
    return _codec_class(name)(**options)


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
