"""aiohttp: a token stream written to a ``web.StreamResponse`` in any codec, and OpenAI error
answers. Imports aiohttp (the ``serving`` extra).

    from inferwire.serving import aiohttp as iws_aiohttp

    async def chat(request: web.Request) -> web.StreamResponse:
        chat = iws.ChatCompletionRequest.parse(await request.read())
        codec = iws_aiohttp.negotiated(request)
        return await iws_aiohttp.stream_response(request, generate(chat), codec)

    app = web.Application(middlewares=[iws_aiohttp.error_middleware])
"""

from __future__ import annotations

from collections.abc import AsyncIterable, Awaitable, Callable, Iterable, Mapping, Sequence

try:
    from aiohttp import web
except ImportError as exc:  # pragma: no cover - the message names the extra
    raise ImportError(
        "inferwire.serving.aiohttp needs aiohttp: pip install 'inferwire[serving]'"
    ) from exc

import inferwire.codecs as ic

from .errors import ServingError
from .negotiation import DEFAULT_OFFERS, JSON, negotiate
from .stream import COALESCE, error_body, error_of, stream_body

__all__ = ["error_middleware", "error_response", "negotiated", "stream_response"]

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def negotiated(request: web.Request, offers: Sequence[str | ic.Codec] = DEFAULT_OFFERS) -> ic.Codec:
    """The codec the request's ``Accept`` weighs highest among ``offers``
    (:func:`inferwire.serving.negotiate`). Raises :class:`~inferwire.serving.NotAcceptableError`."""
    return negotiate(request.headers.get("accept"), offers)


async def stream_response(
    request: web.Request,
    chunks: AsyncIterable[ic.TokenChunk] | Iterable[ic.TokenChunk],
    codec: ic.Codec,
    *,
    extensions: bool = False,
    coalesce: int = COALESCE,
    status: int = 200,
    headers: Mapping[str, str] | None = None,
) -> web.StreamResponse:
    """Writes ``chunks`` in ``codec`` (:func:`inferwire.serving.stream_body`) as the answer
    to ``request``, the chunks ready at once in one write, and ends it; returns the response
    to hand back."""
    response = web.StreamResponse(
        status=status,
        headers={
            "content-type": codec.stream_media_type,
            "cache-control": "no-cache",
            **(headers or {}),
        },
    )
    await response.prepare(request)
    async for piece in stream_body(chunks, codec, extensions=extensions, coalesce=coalesce):
        await response.write(piece)
    await response.write_eof()
    return response


def error_response(
    error: ServingError | int,
    message: str = "",
    kind: str = "invalid_request_error",
    param: str | None = None,
) -> web.Response:
    """OpenAI's error object: for a :class:`~inferwire.serving.ServingError`, its status,
    message, type and field; or ``error`` as a status with the other arguments."""
    if isinstance(error, ServingError):
        status, body = error_of(error)
    else:
        status, body = error, error_body(error, message, kind, param)
    return web.Response(body=body, status=status, content_type=JSON)


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Answers a :class:`~inferwire.serving.ServingError` raised by a handler (before its
    stream started) with its OpenAI error object and status."""
    try:
        return await handler(request)
    except ServingError as exc:
        return error_response(exc)
