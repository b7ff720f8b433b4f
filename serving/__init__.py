"""inferwire.serving: the codecs in the serving code people write.

The core here needs no web framework:

    import inferwire.serving as iws

    request = iws.ChatCompletionRequest.parse(body)          # bad input: iws.RequestError (400)
    codec = iws.negotiate(headers.get("accept"))             # nothing acceptable: 406
    builder = iws.ChunkBuilder(model, include_usage=request.include_usage)
    chunks = [builder.chunk(text, ids) ..., builder.finish(finish_reason="stop")]
    body = iws.stream_body(chunks, codec)                    # async iterator of bytes
    content_type = codec.stream_media_type

One helper per framework, each imported only when used (``import inferwire.serving`` imports
none of them, nor their frameworks):

- :mod:`inferwire.serving.starlette`: a ``StreamingResponse`` for Starlette and FastAPI, OpenAI
  error responses and exception handlers;
- :mod:`inferwire.serving.aiohttp`: the same for an aiohttp ``web`` handler;
- :mod:`inferwire.serving.httpx`: a client's chunks from an httpx streaming response;
- :mod:`inferwire.serving.grpc`: a (de)serializer pair for grpcio, for any codec.

Every error is a :class:`ServingError` carrying the status a server answers it with; a
corrupt or truncated stream is the codec's own :class:`~inferwire.codecs.DecodeError`.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Final

from .chunks import FINISH_REASONS, ChunkBuilder, completion_id
from .errors import (
    ChunkBuilderError,
    NotAcceptableError,
    RequestError,
    ResponseError,
    ServingError,
)
from .negotiation import (
    DEFAULT_OFFERS,
    EVENT_STREAM,
    JSON,
    negotiate,
    offered,
    parse_accept,
    quality,
    stream_quality,
)
from .request import ChatCompletionRequest, ChatMessage, StreamOptions
from .stream import (
    ResponseStreamReader,
    UsageAsOpenAI,
    error_body,
    error_of,
    reader_for,
    response_encoder,
    stream_body,
)

__all__ = [
    "DEFAULT_OFFERS",
    "EVENT_STREAM",
    "FINISH_REASONS",
    "JSON",
    "ChatCompletionRequest",
    "ChatMessage",
    "ChunkBuilder",
    "ChunkBuilderError",
    "NotAcceptableError",
    "RequestError",
    "ResponseError",
    "ResponseStreamReader",
    "ServingError",
    "StreamOptions",
    "UsageAsOpenAI",
    "completion_id",
    "error_body",
    "error_of",
    "negotiate",
    "offered",
    "parse_accept",
    "quality",
    "reader_for",
    "response_encoder",
    "stream_body",
    "stream_quality",
]

HELPERS: Final = ("starlette", "aiohttp", "httpx", "grpc")
"""The framework helpers, submodules imported on first use."""


def __getattr__(name: str) -> ModuleType:
    # `inferwire.serving.httpx` after `import inferwire.serving`: the helper (and its
    # framework) is imported here, on first use, never by the package itself
    if name in HELPERS:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
