"""The HTTP/1.1 client of inferwire's own service: requests over the project's one HTTP/1.1
client (:mod:`.pool`: keep-alive connections, responses parsed by ``httptools``); a stream's
chunked body is read through the
codec's stream decoder, and a body that ends without the codec's end marker is a truncated
stream, never a complete one. With ``accept_encoding`` the client asks for compressed answers
(``Accept-Encoding``); a compressed body or stream is decoded as it arrives, bounded by the
limits (:mod:`..compression`), whether asked for or not.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import ClassVar

import inferwire.codecs as ic

from ..base import Client
from ..common import map_exceptions
from ..errors import MessageTooLargeError, ProtocolError
from ..openai_api import chat_request_body
from ..service import GenerateRequest
from ..streams import ChunkReader
from ..timing import TRACEPARENT, TRAILER, StreamTiming, asks_server, now_ns, unpack_text
from .pool import HttpPool, Origin, PooledResponse


class Http1Client(Client):
    """A keep-alive pool (idle connections reused, a new one when none is idle), or with
    ``new_connection_per_request`` one connection per request, closed after it; the
    connections are the project's one HTTP/1.1 client's (:class:`.pool.HttpPool`).
    ``accept_encoding``: the ``Accept-Encoding`` sent (e.g. ``"zstd, gzip, br"``; None: none,
    so the server answers uncompressed)."""

    transport: ClassVar[str] = "http1"

    def __init__(
        self,
        *args: object,
        new_connection_per_request: bool = False,
        max_idle: int = 100,
        accept_encoding: str | None = None,
        **kwargs: object,
    ) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        if accept_encoding is not None and ("\r" in accept_encoding or "\n" in accept_encoding):
            raise ValueError("accept_encoding must be one header line")
        self.accept_encoding = accept_encoding
        self.new_connection_per_request = new_connection_per_request
        origin = Origin(
            scheme="https" if self.ssl_context else "http", host=self.host, port=self.port
        )
        self.pool = HttpPool(
            origin,
            ssl_context=self.ssl_context,
            max_idle=max_idle,
            new_connection_per_request=new_connection_per_request,
            timeout_s=self.limits.timeout_s,
            headers=() if accept_encoding is None else (("accept-encoding", accept_encoding),),
            max_decoded_bytes=self.limits.max_message_bytes,
        )

    @property
    def connections_opened(self) -> int:
        return self.pool.connections_opened

    async def _send(
        self,
        path: str,
        content_type: str,
        accept: str,
        body: bytes,
        timing: StreamTiming | None = None,
    ) -> PooledResponse:
        """Send a request and read up to the end of the response's headers."""
        if len(body) > self.limits.max_message_bytes:
            raise MessageTooLargeError(f"request of {len(body)} bytes is over the limit")
        if timing is None:
            return await self.pool.request(
                "POST", path, body, content_type=content_type, accept=accept
            )
        traced = f"{TRACEPARENT}: {timing.traceparent}\r\n" if timing.traceparent else ""
        return await self.pool.request(
            "POST",
            path,
            body,
            content_type=content_type,
            accept=accept,
            headers=traced,
            timing=timing,
        )

    async def _fail(self, response: PooledResponse) -> None:
        """Raise the error answer as :class:`RemoteError`."""
        raise await response.fail()

    async def infer(self, request: ic.InferRequest) -> ic.InferResponse:
        payload = self.codec.encode(request)
        path = f"/v2/models/{request.model}/infer"
        media = self.codec.media_type
        response = await self._send(path, media, media, payload)
        if response.status != 200:
            await self._fail(response)
        body = await response.read(self.limits.max_message_bytes)
        with map_exceptions("http1"):
            return self.codec.decode(body, ic.InferResponse)

    async def generate(
        self, request: GenerateRequest, *, timing: StreamTiming | None = None
    ) -> AsyncIterator[ic.TokenChunk]:
        if timing is not None:
            timing.request_start_ns = now_ns()
        body = chat_request_body(request, timing=asks_server(timing))
        if timing is not None:
            timing.request_encoded_ns = now_ns()
        response = await self._send(
            "/v1/chat/completions", "application/json", self.codec.stream_media_type, body, timing
        )
        if response.status != 200:
            await self._fail(response)
        stream = ChunkReader.of_bytes(self.codec, self.limits.max_message_bytes, "http1", timing)
        ok = False
        try:
            while True:
                pending = response.take()
                if pending:
                    for chunk in stream.feed(pending):
                        yield chunk
                if response.complete:
                    break
                if not await response.more():
                    raise stream.truncated("connection closed")
            if not stream.finished:
                raise stream.truncated("the body ended without the stream's end")
            if timing is not None and timing.server_stamps:
                trailer = response.trailers.get(TRAILER)
                if trailer is None:
                    raise ProtocolError("http1: the timed stream has no timing trailer")
                timing.set_server(unpack_text(trailer))
            ok = True
        finally:
            await response.release(reusable=ok)

    async def close(self) -> None:
        """Close every connection, idle or busy: a stream still being read ends as
        truncated, and its server stops generating it."""
        await self.pool.close()
