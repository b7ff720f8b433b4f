"""httpx: a client's token chunks from a streaming response, in whatever codec the server
chose (by the response's content type). Imports httpx (the ``serving`` extra).

    from inferwire.serving import httpx as iws_httpx

    headers = {"accept": iws_httpx.accept("delta")}
    async with client.stream("POST", url, json=body, headers=headers) as response:
        async for chunk in iws_httpx.aiter_chunks(response):
            ...

An error status is a :class:`~inferwire.serving.ResponseError` with the server's OpenAI error
message; a corrupt stream is the codec's :class:`~inferwire.codecs.DecodeError`, and a stream
cut short (the connection closed, or ended before the codec's end marker) its
:class:`~inferwire.codecs.IncompleteStreamError`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

try:
    import httpx
except ImportError as exc:  # pragma: no cover - the message names the extra
    raise ImportError(
        "inferwire.serving.httpx needs httpx: pip install 'inferwire[serving]'"
    ) from exc

import orjson

import inferwire.codecs as ic
from inferwire.codecs.framing import DEFAULT_MAX_FRAME_BYTES

from .errors import ResponseError
from .stream import ResponseStreamReader, reader_for

__all__ = ["accept", "aiter_chunks", "iter_chunks"]


def accept(*codecs: str | ic.Codec) -> str:
    """An ``Accept`` value asking for the streams of ``codecs``, in order of preference (each
    a lower weight than the one before it)."""
    types = dict.fromkeys(
        (ic.get(c) if isinstance(c, str) else c).stream_media_type for c in codecs
    )
    return ", ".join(
        media if i == 0 else f"{media};q={max(1, 10 - i) / 10:.1f}" for i, media in enumerate(types)
    )


def _message(body: bytes) -> str:
    try:
        error = orjson.loads(body)["error"]
        return error if isinstance(error, str) else str(error["message"])
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return body[:200].decode(errors="replace")


def _error(response: httpx.Response, body: bytes) -> ResponseError:
    content_type = response.headers.get("content-type", "")
    return ResponseError(
        f"HTTP {response.status_code}: {_message(body)}",
        status=response.status_code,
        content_type=content_type,
    )


def _reader(
    response: httpx.Response, codec: str | ic.Codec | None, max_frame_bytes: int
) -> ResponseStreamReader:
    return reader_for(
        response.headers.get("content-type", ""), codec, max_frame_bytes=max_frame_bytes
    )


def _cut(exc: httpx.TransportError) -> ic.IncompleteStreamError:
    return ic.IncompleteStreamError(f"the stream ended before its end marker: {exc}")


async def aiter_chunks(
    response: httpx.Response,
    codec: str | ic.Codec | None = None,
    *,
    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
) -> AsyncIterator[ic.TokenChunk]:
    """The chunks of a streaming response (``AsyncClient.stream``), decoded as its content
    type says (by ``codec`` when it streams that type); see the module docstring."""
    if response.status_code >= 400:
        raise _error(response, await response.aread())
    reader = _reader(response, codec, max_frame_bytes)
    try:
        async for data in response.aiter_bytes():
            for chunk in reader.feed(data):
                yield chunk
    except httpx.TransportError as exc:
        raise _cut(exc) from exc
    reader.close()


def iter_chunks(
    response: httpx.Response,
    codec: str | ic.Codec | None = None,
    *,
    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
) -> Iterator[ic.TokenChunk]:
    """:func:`aiter_chunks` for a ``Client.stream`` response."""
    if response.status_code >= 400:
        raise _error(response, response.read())
    reader = _reader(response, codec, max_frame_bytes)
    try:
        for data in response.iter_bytes():
            yield from reader.feed(data)
    except httpx.TransportError as exc:
        raise _cut(exc) from exc
    reader.close()
