"""Content codings on our HTTP/2 client (``accept_encoding``) against our HTTP/2 server
(``serve --compress``), and against a hostile HTTP/2 server.

Checked here: for gzip, br and zstd, a stream asked for compressed decodes to the very chunks
the uncompressed one carries, its first event decoded while the server still holds the rest (the
gated service: an ordering check, no clock), and fewer bytes cross the socket than for the
uncompressed stream; a unary body likewise (``inferwire load --transport http2
--accept-encoding`` opens this client: tests/load/test_load_http2_compression.py). A server's zip
bomb is :class:`DecompressionLimitError` (stream and unary body), corrupt, truncated or unknown
codings are :class:`ContentEncodingError`.

curl ``--http2-prior-knowledge --compressed`` on our HTTP/2 server is in
``test_compression.py`` (``test_curl_compressed_decodes_our_sse_stream_and_unary_body``).
"""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import Awaitable, Callable
from typing import Any, Final

import brotli  # type: ignore[import-untyped]
import h2.config
import h2.connection
import h2.events
import pytest
import zstandard

import inferwire.codecs as ic
import inferwire.transports as it
from inferwire.transports import compression as cz
from tests.helpers.faults import fake_server
from tests.transports.test_compression import (
    CODINGS,
    STREAM,
    GatedService,
    _zeros_request,
    expected_chunks,
    run,
    serving,
)

LIMIT: Final = 4 << 20
"""The client's message limit in the hostile cases: a bomb decodes to four times it."""


async def _streamed_bytes(client: Any, consume: Callable[[], Awaitable[object]]) -> int:
    """Bytes that cross the client's socket while ``consume`` runs."""
    before = client.received_bytes
    await consume()
    return int(client.received_bytes - before)


@pytest.mark.parametrize("coding", CODINGS)
def test_our_http2_client_decodes_a_compressed_stream_and_body(coding: str) -> None:
    async def go() -> None:
        service = GatedService()
        async with serving("http2", service=service) as srv:
            coded: Any = it.connect("http2", srv.address, accept_encoding=coding)
            plain: Any = it.connect("http2", srv.address)
            async with coded, plain:
                assert coded.accept_encoding == coding
                before = coded.received_bytes
                chunks = coded.generate(STREAM)
                first = await anext(chunks)
                assert not service.gate.is_set()  # the server has sent the first event only
                service.gate.set()
                rest = [c async for c in chunks]
                assert [first, *rest] == expected_chunks()
                coded_stream = coded.received_bytes - before
                await plain.infer(_zeros_request(1))  # the connection's preamble out of the count

                async def plain_stream() -> None:
                    assert [c async for c in plain.generate(STREAM)] == expected_chunks()

                assert coded_stream < await _streamed_bytes(plain, plain_stream) / 2

                request = _zeros_request(4096)  # KServe JSON: "0.0," 4096 times
                answers: list[ic.InferResponse] = []

                async def infer(client: Any) -> Callable[[], Awaitable[object]]:
                    async def call() -> None:
                        answers.append(await client.infer(request))

                    return call

                coded_unary = await _streamed_bytes(coded, await infer(coded))
                plain_unary = await _streamed_bytes(plain, await infer(plain))
                assert answers[0] == answers[1]
                assert answers[0].outputs[0].data.tolist() == request.inputs[0].data.tolist()
                assert coded_unary < plain_unary / 4

    run(go())


def _h2_answer(coding: str, payload: bytes, media: str) -> Any:
    """A server that answers every request with ``payload`` in ``coding``, as it is."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=False, header_encoding=None)
        )
        conn.initiate_connection()
        writer.write(conn.data_to_send())
        while data := await reader.read(65536):
            for event in conn.receive_data(data):
                if isinstance(event, h2.events.StreamEnded):
                    headers = [(":status", "200"), ("content-type", media)]
                    conn.send_headers(event.stream_id, [*headers, ("content-encoding", coding)])
                    for start in range(0, len(payload), 8192):
                        conn.send_data(event.stream_id, payload[start : start + 8192])
                    conn.end_stream(event.stream_id)
            writer.write(conn.data_to_send())
            await writer.drain()

    return answer


async def _call(client: it.Client, kind: str) -> None:
    if kind == "stream":
        async for _ in client.generate(STREAM):
            pass
    else:
        await client.infer(_zeros_request(1))


def test_our_http2_client_refuses_a_servers_bomb_and_bad_codings() -> None:
    """Bombs of 16 MiB of zeros (tens of KiB on the wire) against a 4 MiB limit, as a stream
    and as a unary body; then a corrupt stream, one cut inside its compressed data, and a
    coding the client does not decode: each our typed error, and nothing decoded past it."""
    zeros = bytes(16 << 20)
    bombs = {
        "gzip": zlib.compress(zeros, 9, wbits=31),
        "br": brotli.compress(zeros, quality=5),
        "zstd": zstandard.ZstdCompressor(level=3).compress(zeros),
    }
    del zeros
    good = cz.Compression().stream_compressor("gzip")
    events = ic.get("orjson", extensions=True).stream_encoder()
    body = b"".join(good.compress(events.encode(c)) for c in expected_chunks()) + good.finish()
    corrupt = body[:40] + bytes(b ^ 0x33 for b in body[40:80]) + body[80:]
    cases: list[tuple[str, bytes, str, type[Exception]]] = [
        *((coding, bomb, "stream", cz.DecompressionLimitError) for coding, bomb in bombs.items()),
        *((coding, bomb, "unary", cz.DecompressionLimitError) for coding, bomb in bombs.items()),
        ("gzip", corrupt, "stream", cz.ContentEncodingError),
        ("gzip", body[: len(body) // 2], "stream", cz.ContentEncodingError),
        ("gzip", body[: len(body) // 2], "unary", cz.ContentEncodingError),
        ("compress", body, "stream", cz.ContentEncodingError),
    ]
    limits = it.Limits(max_message_bytes=LIMIT)

    async def go() -> None:
        for coding, payload, kind, expected in cases:
            media = "text/event-stream" if kind == "stream" else "application/json"
            async with fake_server(_h2_answer(coding, payload, media)) as fake:
                client = it.connect("http2", fake.address, accept_encoding=coding, limits=limits)
                async with client:
                    with pytest.raises(expected):
                        await _call(client, kind)

    run(go())
