"""Starlette and FastAPI: a token stream as a ``StreamingResponse`` in any codec, and OpenAI
error answers. Imports Starlette (the ``serving`` extra); FastAPI's responses are Starlette's.

    from inferwire.serving import starlette as iws_starlette

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        chat = iws.ChatCompletionRequest.parse(await request.body())
        codec = iws_starlette.negotiated(request)
        return iws_starlette.stream_response(generate(chat), codec)

    iws_starlette.install(app)   # RequestError -> 400, NotAcceptableError -> 406, OpenAI-shaped
"""

from __future__ import annotations

from collections.abc import AsyncIterable, Iterable, Mapping, Sequence
from typing import Any

try:
    from starlette.requests import Request
    from starlette.responses import Response, StreamingResponse
except ImportError as exc:  # pragma: no cover - the message names the extra
    raise ImportError(
        "inferwire.serving.starlette needs Starlette: pip install 'inferwire[serving]'"
    ) from exc

import inferwire.codecs as ic

from .errors import ServingError
from .negotiation import DEFAULT_OFFERS, JSON, negotiate
from .stream import COALESCE, error_body, error_of, stream_body

__all__ = [
    "error_response",
    "handle_serving_error",
    "install",
    "negotiated",
    "stream_response",
]

NO_CACHE = {"cache-control": "no-cache"}
"""What OpenAI-compatible servers send with a stream (vLLM's StreamingResponse does not add it;
proxies that buffer a stream honour it)."""


def negotiated(request: Request, offers: Sequence[str | ic.Codec] = DEFAULT_OFFERS) -> ic.Codec:
    """The codec the request's ``Accept`` weighs highest among ``offers``
    (:func:`inferwire.serving.negotiate`). Raises :class:`~inferwire.serving.NotAcceptableError`."""
    return negotiate(request.headers.get("accept"), offers)


def stream_response(
    chunks: AsyncIterable[ic.TokenChunk] | Iterable[ic.TokenChunk],
    codec: ic.Codec,
    *,
    extensions: bool = False,
    coalesce: int = COALESCE,
    status_code: int = 200,
    headers: Mapping[str, str] | None = None,
) -> StreamingResponse:
    """``chunks`` streamed in ``codec`` (:func:`inferwire.serving.stream_body`: OpenAI's
    events for a JSON codec, the codec's frames otherwise, the chunks ready at once in one
    write), with its stream media type."""
    return StreamingResponse(
        stream_body(chunks, codec, extensions=extensions, coalesce=coalesce),
        status_code=status_code,
        headers={**NO_CACHE, **(headers or {})},
        media_type=codec.stream_media_type,
    )


def error_response(
    error: ServingError | int,
    message: str = "",
    kind: str = "invalid_request_error",
    param: str | None = None,
) -> Response:
    """OpenAI's error object: for a :class:`~inferwire.serving.ServingError`, its status,
    message, type and field; or ``error`` as a status with the other arguments."""
    if isinstance(error, ServingError):
        status, body = error_of(error)
    else:
        status, body = error, error_body(error, message, kind, param)
    return Response(body, status_code=status, media_type=JSON)


async def handle_serving_error(request: Request, exc: Exception) -> Response:
    """An exception handler for Starlette and FastAPI (``install`` adds it)."""
    if not isinstance(exc, ServingError):  # pragma: no cover - registered for ServingError
        raise exc
    return error_response(exc)


def install(app: Any) -> None:
    """Answer every :class:`~inferwire.serving.ServingError` a route of ``app`` (Starlette
    or FastAPI) raises with its OpenAI error object and status."""
    app.add_exception_handler(ServingError, handle_serving_error)
