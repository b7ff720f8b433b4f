"""Content codings (gzip, br, zstd) on the HTTP servers and clients, and gRPC's gzip and deflate.

Checked here: ``Accept-Encoding`` negotiation (q-values, ``identity``, ``*``, unknown codings);
each coding round-trips a unary body and a stream through our HTTP/1.1 client, and through
clients nobody here wrote (curl ``--compressed`` on both servers, httpx over HTTP/2); a stream's
first event is decoded before the server has sent the rest (the service holds the stream after
its first chunk until the client has it: an ordering check, no clock); zip bombs of every coding
are refused with :class:`DecompressionLimitError` having decoded no more than the limit (the
decoded count and tracemalloc's peak say so); corrupt and truncated bodies are
:class:`ContentEncodingError`; a server with compression survives a client's bomb; gRPC's gzip and
deflate shrink what crosses a socket both ways, and a compressed gRPC bomb is refused by the
decoded size.

Servers run in the test's event loop on 127.0.0.1 (:func:`tests.helpers.faults.serving`'s way).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import shutil
import threading
import tracemalloc
import zlib
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Coroutine, Iterator
from dataclasses import dataclass
from typing import Any, Final, TypeVar

import brotli  # type: ignore[import-untyped]
import httpx
import numpy as np
import orjson
import pytest
import zstandard

import inferwire.codecs as ic
import inferwire.transports as it
from inferwire._runtime import loops
from inferwire._runtime.arguments import CommandError
from inferwire.transports import compression as cz
from inferwire.transports import serve
from inferwire.transports.http1.pool import HttpPool, Origin
from inferwire.transports.openai_api import chat_request_body
from inferwire.transports.service import MAX_BATCH_CHUNKS, TokenStream
from inferwire.workloads import token_stream_source
from tests.helpers.faults import MESSAGES, fake_server, read_http1_request

T = TypeVar("T")
JSON: Final = "application/json"

CODINGS: Final = ("gzip", "br", "zstd")
TIMEOUT_S: Final = 60.0
"""Bound on one test's event loop work: one that fires is a hang, on a busy 2-core machine."""
CURL: Final = shutil.which("curl")
needs_curl = pytest.mark.skipif(
    CURL is None, reason="curl is not installed: apt-get install curl (with brotli and zstd)"
)
LIMIT: Final = 4 << 20
"""The decoders' limit in the bomb tests: small, so a bomb is cheap to make and to refuse."""
STREAM: Final = it.GenerateRequest(workload="stream-16")
UNARY_BODY: Final = orjson.dumps(
    {
        "messages": MESSAGES,
        "workload": "stream-256",
        "stream": False,
        "inferwire": {"extensions": True},  # the service's own id: the same bytes every time
    }
)


def run(coro: Coroutine[Any, Any, T]) -> T:
    return loops.run(asyncio.wait_for(coro, TIMEOUT_S), "asyncio")


def expected_chunks(request: it.GenerateRequest = STREAM) -> list[ic.TokenChunk]:
    return list(it.SimulatedService(token_stream_source).chunks(request))


# -- negotiation --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("accept", "chosen"),
    [
        (None, None),  # no field: no coding (RFC 9110 allows any; a silent client may not decode)
        ("", None),  # empty: identity only (12.5.3)
        ("gzip", "gzip"),
        ("GZip", "gzip"),
        ("x-gzip", "gzip"),  # 8.4.1.3
        ("gzip, br", "gzip"),  # equal weights: our order
        ("gzip, deflate, br, zstd", "zstd"),  # curl --compressed
        ("br;q=0.5, gzip", "gzip"),  # the client's weights first
        ("zstd;q=0.8, br;q=0.8", "zstd"),
        ("br;q=0.9, gzip;q=0.8", "br"),
        ("gzip;q=0, br;q=0, zstd;q=0", None),
        ("*", "zstd"),
        ("*;q=0.5, gzip", "gzip"),
        ("*, zstd;q=0", "gzip"),
        ("*;q=0", None),
        ("identity", None),
        ("identity;q=0", None),  # nothing acceptable: sent without a coding (12.5.3)
        ("identity;q=0, gzip", "gzip"),
        ("gzip;q=0.5, identity", None),  # identity weighed above
        ("gzip;q=0.5, identity;q=0.4", "gzip"),
        ("compress, deflate", None),  # none offered
        ("gzip;q=2", None),  # a weight out of range says nothing sure
        ("gzip;q=abc, br", "br"),
        ("gzip;level=9;q=0.3, br;q=0.2", "gzip"),  # parameters other than q ignored
        (" , ,gzip , ", "gzip"),
    ],
)
def test_negotiation(accept: str | None, chosen: str | None) -> None:
    assert cz.negotiate(accept) == chosen


def test_negotiation_offers_only_what_the_server_has() -> None:
    assert cz.negotiate("zstd, gzip;q=0.1", ("gzip",)) == "gzip"
    assert cz.negotiate("zstd", ("gzip",)) is None


@pytest.mark.parametrize(
    ("field", "coding"),
    [(None, None), ("identity", None), ("GZIP", "gzip"), ("x-gzip", "gzip"), ("br", "br")],
)
def test_content_coding(field: str | None, coding: str | None) -> None:
    assert cz.content_coding(field) == coding


@pytest.mark.parametrize("field", ["compress", "gzip, br", "exi"])
def test_a_content_coding_not_decoded_is_refused(field: str) -> None:
    with pytest.raises(cz.ContentEncodingError):
        cz.content_coding(field)


# -- compressors and decoders --------------------------------------------------------------


def sse_events() -> list[bytes]:
    """The events of a stream as the server frames them (inferwire's SSE, one per chunk)."""
    encoder = ic.get("orjson", extensions=True).stream_encoder()
    return [encoder.encode(c) for c in expected_chunks(it.GenerateRequest(workload="stream-256"))]


@pytest.mark.parametrize("coding", CODINGS)
def test_each_event_decodes_as_it_arrives(coding: str) -> None:
    """Flushed per write: the bytes of event n decode to exactly event n, with nothing held
    back, and the coding's end decodes to nothing more."""
    compressor = cz.Compression().stream_compressor(coding)
    decoder = cz.Decoder(coding, max_piece_bytes=LIMIT)
    events = sse_events()
    wire = 0
    for event in events:
        piece = compressor.compress(event)
        wire += len(piece)
        assert decoder.feed(piece) == event
    assert decoder.feed(compressor.finish()) == b""
    decoder.close()
    assert wire < sum(map(len, events)) / 2  # the window spans the events


@pytest.mark.parametrize("coding", [*CODINGS, "deflate"])
def test_a_body_decodes_whatever_its_pieces(coding: str) -> None:
    body = b"".join(sse_events())
    whole: bytes
    if coding == "br":
        whole = brotli.compress(body)
    elif coding == "zstd":
        whole = zstandard.ZstdCompressor().compress(body)
    else:
        whole = zlib.compress(body, wbits=31 if coding == "gzip" else 15)
    rng = random.Random(7)
    for sizes in ([1], [len(whole)], [rng.randint(1, 300) for _ in range(64)]):
        decoder = cz.Decoder(coding, max_piece_bytes=LIMIT)
        out, at, i = [], 0, 0
        while at < len(whole):
            size = sizes[i % len(sizes)]
            out.append(decoder.feed(whole[at : at + size]))
            at, i = at + size, i + 1
        decoder.close()
        assert b"".join(out) == body


def test_gzip_members_in_a_row_and_zstd_frames_in_a_row_decode() -> None:
    gz = cz.Decoder("gzip", max_piece_bytes=LIMIT)
    assert gz.feed(zlib.compress(b"one ", wbits=31) + zlib.compress(b"two", wbits=31)) == b"one two"
    gz.close()
    zs = cz.Decoder("zstd", max_piece_bytes=LIMIT)
    frames = zstandard.ZstdCompressor().compress(b"one ") + zstandard.ZstdCompressor().compress(
        b"two"
    )
    assert zs.feed(frames) == b"one two"
    zs.close()


@pytest.fixture(scope="module")
def bombs() -> dict[str, bytes]:
    """Tens of bytes (br), 2 KiB (zstd) and 64 KiB (gzip) that each decode to 64 MiB of zeros,
    16 times the limit."""
    size = 64 << 20
    zeros = bytes(size)
    made = {
        "gzip": zlib.compress(zeros, 9, wbits=31),
        "br": brotli.compress(zeros, quality=5),
        "zstd": zstandard.ZstdCompressor(level=3).compress(zeros),
    }
    del zeros
    return made


@pytest.mark.parametrize("by", ["size", "ratio"])
@pytest.mark.parametrize("coding", CODINGS)
def test_a_zip_bomb_is_refused_having_decoded_no_more_than_the_limit(
    bombs: dict[str, bytes], coding: str, by: str
) -> None:
    bomb = bombs[coding]
    if by == "size":  # the ratio out of the way: the size limit alone
        decoder = cz.Decoder(coding, max_piece_bytes=LIMIT, max_ratio=1e12)
        bound = LIMIT
    else:  # refused by 1000:1 once past the floor, far below the size limit
        decoder = cz.Decoder(coding, max_piece_bytes=1 << 30, ratio_floor_bytes=1 << 20)
        bound = 1 << 20
    # one step's overshoot (the module docstring): zstd a slice's blocks, br a buffer block
    slack = {"zstd": 2_400_000, "br": 360 << 10, "gzip": 1}[coding]
    tracemalloc.start()
    try:
        with pytest.raises(cz.DecompressionLimitError):
            decoder.feed(bomb)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert decoder.produced_bytes <= bound + slack
    assert peak <= 2 * (bound + slack) + (1 << 20)  # its pieces and their join, no more


@pytest.mark.parametrize("coding", CODINGS)
def test_corrupt_truncated_and_overlong_data_are_content_encoding_errors(coding: str) -> None:
    compressor = cz.Compression().stream_compressor(coding)
    body = b"".join(compressor.compress(e) for e in sse_events()) + compressor.finish()
    corrupt = bytearray(body)
    for at in range(10, len(corrupt), 7):
        corrupt[at] ^= 0x5A
    assert _decode_error(coding, bytes(corrupt))
    truncated = cz.Decoder(coding, max_piece_bytes=LIMIT)
    truncated.feed(body[: len(body) // 2])
    with pytest.raises(cz.ContentEncodingError, match="ended inside"):
        truncated.close()
    # after the end: another gzip member or zstd frame would be decoded, garbage is not one
    assert _decode_error(coding, body + b"garbage!")


def _decode_error(coding: str, data: bytes) -> bool:
    """Whether ``data`` as a whole body is refused with a ContentEncodingError."""
    decoder = cz.Decoder(coding, max_piece_bytes=LIMIT)
    try:
        decoder.feed(data)
        decoder.close()
    except cz.ContentEncodingError:
        return True
    return False


# -- our servers and clients --------------------------------------------------------------


class GatedService(it.SimulatedService):
    """Hands over a stream's first chunk, then holds the rest until :attr:`gate` is set."""

    def __init__(self) -> None:
        super().__init__(token_stream_source)
        self.gate = asyncio.Event()

    async def batches(
        self, stream: TokenStream, *, max_chunks: int = MAX_BATCH_CHUNKS
    ) -> AsyncGenerator[list[ic.TokenChunk], None]:
        chunks = list(stream.chunks)
        self.active_streams += 1
        try:
            yield chunks[:1]
            await self.gate.wait()
            for at in range(1, len(chunks), max_chunks):
                yield chunks[at : at + max_chunks]
        finally:
            self.active_streams -= 1


@dataclass
class Served:
    address: str
    service: it.SimulatedService
    server: it.Server


@contextlib.asynccontextmanager
async def serving(
    transport: str,
    *,
    service: it.SimulatedService | None = None,
    compression: cz.Compression | None = cz.Compression(),  # noqa: B008 (frozen)
    limits: it.Limits | None = None,
) -> AsyncIterator[Served]:
    service = service or it.SimulatedService(token_stream_source)
    options: dict[str, Any] = {} if compression is None else {"compression": compression}
    server = it.server_class(transport)(
        service, ic.get("orjson", extensions=True), limits=limits or it.Limits(), **options
    )
    host, port = await server.start()
    try:
        yield Served(f"{host}:{port}", service, server)
    finally:
        await server.stop()


def pool(address: str, accept_encoding: str | None = None) -> HttpPool:
    headers = () if accept_encoding is None else (("accept-encoding", accept_encoding),)
    return HttpPool(Origin.parse(f"http://{address}"), headers=headers)


async def post(pool_: HttpPool, body: bytes) -> tuple[int, dict[str, str], bytes, int]:
    """Status, headers, decoded body, and the body's bytes as they crossed the socket."""
    response = await pool_.request("POST", "/v1/chat/completions", body)
    data = await response.read(64 << 20)
    return response.status, dict(response.headers), data, response.wire_bytes


@pytest.mark.parametrize("coding", CODINGS)
def test_our_client_round_trips_a_stream_and_a_unary_body(coding: str) -> None:
    async def go() -> None:
        async with serving("http1") as srv:
            client: Any = it.connect("http1", srv.address, accept_encoding=coding)
            async with client:
                assert [c async for c in client.generate(STREAM)] == expected_chunks()
                streamed_wire = client.pool.wire_bytes
                assert streamed_wire < sum(map(len, sse_events()[:16])) / 2
                request = _zeros_request(4096)
                response = await client.infer(request)  # KServe JSON: "0.0," 4096 times
                assert response.outputs[0].data.tolist() == request.inputs[0].data.tolist()
                assert client.pool.wire_bytes - streamed_wire < 4096
            # a unary body, its coding checked where it crosses
            identity = pool(srv.address)
            coded = pool(srv.address, coding)
            try:
                status, headers, plain_body, _ = await post(identity, UNARY_BODY)
                assert status == 200
                assert "content-encoding" not in headers
                status, headers, body, wire = await post(coded, UNARY_BODY)
                assert (status, headers.get("content-encoding")) == (200, coding)
                assert headers.get("vary") == "accept-encoding"
                assert body == plain_body
                assert wire < len(body)
            finally:
                await identity.close()
                await coded.close()

    run(go())


def test_a_body_of_megabytes_is_compressed_off_the_loop_and_decodes() -> None:
    """A body from ``OFF_LOOP_BYTES`` is compressed in a worker thread (sent as a stream of
    one piece, so chunked): our client on HTTP/1.1 and httpx on HTTP/2 get it whole."""
    data = np.arange(200_000, dtype=np.float32) / 7  # "0.14285715," and so on: 2.4 MB of JSON
    tensor = ic.Tensor(name="x", datatype="FP32", shape=(data.size,), data=data)
    body = ic.get("orjson", extensions=True).encode(
        ic.InferRequest(model="m", id="big", inputs=(tensor,))
    )
    url_path = "/v2/models/m/infer"

    async def go() -> None:
        async with serving("http1") as srv:
            conn = pool(srv.address, "gzip")
            try:
                response = await conn.request("POST", url_path, body)
                assert response.headers.get("content-encoding") == "gzip", response.headers
                assert "content-length" not in response.headers
                decoded = await response.read(64 << 20)
                assert len(decoded) > cz.OFF_LOOP_BYTES
                assert response.wire_bytes < len(decoded) / 2
                answer = orjson.loads(decoded)
                assert answer["outputs"][0]["data"] == data.tolist()
            finally:
                await conn.close()
        async with (
            serving("http2") as srv,
            httpx.AsyncClient(http1=False, http2=True, timeout=TIMEOUT_S) as http,
        ):
            got = await http.post(
                f"http://{srv.address}{url_path}",
                content=body,
                headers={"accept-encoding": "gzip", "content-type": JSON},
            )
            assert got.headers["content-encoding"] == "gzip"
            assert orjson.loads(got.content)["outputs"][0]["data"] == data.tolist()

    run(go())


@pytest.mark.parametrize("coding", CODINGS)
def test_httpx_over_http2_decodes_our_body_and_stream(coding: str) -> None:
    run(_http2_round_trip(coding))


async def _http2_round_trip(coding: str) -> None:
    """httpx over HTTP/2 (h2, prior knowledge) against our HTTP/2 server, decoding itself
    (our HTTP/2 client asks for no coding)."""
    async with (
        serving("http2") as srv,
        httpx.AsyncClient(http1=False, http2=True, timeout=TIMEOUT_S) as http,
    ):
        url = f"http://{srv.address}/v1/chat/completions"
        plain = await http.post(url, content=UNARY_BODY, headers={"accept-encoding": "identity"})
        coded = await http.post(url, content=UNARY_BODY, headers={"accept-encoding": coding})
        assert coded.headers["content-encoding"] == coding
        assert coded.content == plain.content
        assert len(coded.content) > int(coded.headers["content-length"])
        stream_body = chat_request_body(STREAM)
        plain_sse = await http.post(
            url, content=stream_body, headers={"accept-encoding": "identity"}
        )
        async with http.stream(
            "POST", url, content=stream_body, headers={"accept-encoding": coding}
        ) as streamed:
            assert streamed.headers["content-encoding"] == coding
            decoded = b"".join([piece async for piece in streamed.aiter_bytes()])
        assert decoded == plain_sse.content


@pytest.mark.parametrize("coding", CODINGS)
def test_the_first_event_is_decoded_before_the_server_sends_the_last(coding: str) -> None:
    """The service holds the stream after its first chunk until the client has decoded it: a
    compressor that held the event back would leave the client waiting forever (the test's
    timeout); the order is the check, no clock."""

    async def go() -> None:
        service = GatedService()
        async with serving("http1", service=service) as srv:
            client: Any = it.connect("http1", srv.address, accept_encoding=coding)
            async with client:
                chunks = client.generate(STREAM)
                first = await anext(chunks)
                assert not service.gate.is_set()  # the server has sent the first event only
                service.gate.set()
                rest = [c async for c in chunks]
                assert [first, *rest] == expected_chunks()
                assert client.pool.wire_bytes < sum(map(len, sse_events())) / 4

    run(go())


# -- curl --------------------------------------------------------------------------------


async def _curl(*args: str) -> asyncio.subprocess.Process:
    assert CURL is not None
    return await asyncio.create_subprocess_exec(
        CURL,
        "-sS",
        "--max-time",
        "60",
        "-H",
        "content-type: application/json",
        *args,
        stdout=asyncio.subprocess.PIPE,
    )


@needs_curl
@pytest.mark.parametrize("transport", ["http1", "http2"])
def test_curl_compressed_decodes_our_sse_stream_and_unary_body(transport: str) -> None:
    """``curl --compressed`` (it asks for deflate, gzip, br and zstd, and gets zstd); then each
    coding asked for alone. The stream: curl prints its first event before the server sends
    the second (the gated service), then the rest; the bytes are the uncompressed answer's."""

    async def go() -> None:
        service = GatedService()
        async with serving(transport, service=service) as srv:
            url = f"http://{srv.address}/v1/chat/completions"
            h2 = ["--http2-prior-knowledge"] if transport == "http2" else []
            stream_body = chat_request_body(STREAM).decode()
            plain = await _curl(
                *h2, "-H", "accept-encoding: identity", "-d", UNARY_BODY.decode(), url
            )
            plain_unary, _ = await plain.communicate()
            service.gate.set()
            plain = await _curl(*h2, "-H", "accept-encoding: identity", "-d", stream_body, url)
            plain_sse, _ = await plain.communicate()
            assert plain_sse.endswith(b"data: [DONE]\n\n")
            for chosen in (None, *CODINGS):
                asked = [] if chosen is None else ["-H", f"accept-encoding: {chosen}"]
                unary = await _curl(
                    *h2, "--compressed", *asked, "-D", "-", "-d", UNARY_BODY.decode(), url
                )
                out, _ = await unary.communicate()
                head, _, body = out.partition(b"\r\n\r\n")
                assert f"content-encoding: {chosen or 'zstd'}".encode() in head.lower()
                assert body == plain_unary
                service.gate = asyncio.Event()
                streamed = await _curl(*h2, "--compressed", "-N", *asked, "-d", stream_body, url)
                assert streamed.stdout is not None
                first = await streamed.stdout.readuntil(b"\n\n")  # the first event, alone
                assert not service.gate.is_set()
                service.gate.set()
                rest = await streamed.stdout.read()
                assert await streamed.wait() == 0
                assert first + rest == plain_sse

    run(go())


# -- hostile peers ------------------------------------------------------------------------


def _gzip_request(body: bytes, coding: str = "gzip") -> bytes:
    return (
        "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        f"content-encoding: {coding}\r\ncontent-length: {len(body)}\r\n\r\n"
    ).encode() + body


def test_a_server_refuses_a_clients_bomb_and_unknown_codings_and_serves_on(
    bombs: dict[str, bytes],
) -> None:
    async def go() -> None:
        limits = it.Limits(max_message_bytes=LIMIT)
        compression = cz.Compression(max_request_bytes=LIMIT)
        async with serving("http1", compression=compression, limits=limits) as srv:
            conn = pool(srv.address)
            try:
                for coding in CODINGS:
                    response = await conn.request(
                        "POST",
                        "/v1/chat/completions",
                        bombs[coding],
                        headers=f"content-encoding: {coding}\r\n",
                    )
                    assert response.status == 413
                    await response.read(1 << 20)
                compressed = zlib.compress(chat_request_body(STREAM), wbits=31)
                response = await conn.request(
                    "POST", "/v1/chat/completions", compressed, headers="content-encoding: gzip\r\n"
                )
                assert response.status == 200  # a compressed request decoded
                await response.read(1 << 20)
                response = await conn.request(
                    "POST", "/v1/chat/completions", b"{}", headers="content-encoding: compress\r\n"
                )
                assert response.status == 415
                assert "gzip" in response.headers["accept-encoding"]
                await response.read(1 << 20)
            finally:
                await conn.close()
            async with it.connect("http1", srv.address) as client:
                assert [c async for c in client.generate(STREAM)] == expected_chunks()

    run(go())


@pytest.mark.parametrize("coding", CODINGS)
def test_our_client_refuses_a_servers_bomb_and_corrupt_stream(
    bombs: dict[str, bytes], coding: str
) -> None:
    """A server that answers a stream with a bomb, or with a stream whose bytes are corrupt:
    the client raises our typed errors, bounded by its limits."""
    sent = {"bomb": bombs[coding]}
    good = cz.Compression().stream_compressor(coding)
    body = b"".join(good.compress(e) for e in sse_events()) + good.finish()
    sent["corrupt"] = body[:40] + bytes(b ^ 0x33 for b in body[40:80]) + body[80:]
    sent["truncated"] = body[: len(body) // 2]

    def handler(payload: bytes) -> Callable[[asyncio.StreamReader, asyncio.StreamWriter], Any]:
        async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await read_http1_request(reader)
            writer.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                + f"content-encoding: {coding}\r\ncontent-length: {len(payload)}\r\n\r\n".encode()
                + payload
            )
            await writer.drain()

        return answer

    async def go() -> None:
        for case, payload in sent.items():
            async with fake_server(handler(payload)) as fake:
                client = it.connect(
                    "http1",
                    fake.address,
                    accept_encoding=coding,
                    limits=it.Limits(max_message_bytes=LIMIT),
                )
                async with client:
                    expected = (
                        cz.DecompressionLimitError if case == "bomb" else cz.ContentEncodingError
                    )
                    with pytest.raises(expected):
                        async for _ in client.generate(STREAM):
                            pass

    run(go())


@contextlib.contextmanager
def thread_server(compression: cz.Compression) -> Iterator[str]:
    """Our HTTP/1.1 server with ``compression`` on an event loop of its own thread, for a
    blocking client; yields its address."""
    ready = threading.Event()
    state: dict[str, Any] = {}

    async def main() -> None:
        async with serving("http1", compression=compression) as srv:
            state["address"] = srv.address
            state["loop"] = asyncio.get_running_loop()
            state["stop"] = stop = asyncio.Event()
            ready.set()
            await stop.wait()

    thread = threading.Thread(target=asyncio.run, args=(main(),), name="compression-server")
    thread.start()
    try:
        assert ready.wait(TIMEOUT_S)
        yield state["address"]
    finally:
        if "loop" in state:
            state["loop"].call_soon_threadsafe(state["stop"].set)
        thread.join(TIMEOUT_S)
        assert not thread.is_alive()


@pytest.mark.parametrize("coding", ["gzip", "deflate"])
def test_tritonclient_sends_a_compressed_request_and_decodes_the_answer(coding: str) -> None:
    """tritonclient's HTTP client compresses its request body (``deflate`` is the zlib format)
    and asks for a compressed answer: our server decodes the one and sends the other (gzip;
    it offers no deflate, so that answer is identity, which the client reads as well)."""
    import tritonclient.http as triton

    with thread_server(cz.Compression()) as address:
        client = triton.InferenceServerClient(address, network_timeout=TIMEOUT_S)
        try:
            data = np.arange(4096, dtype=np.float32)
            tensor = triton.InferInput("x", [4096], "FP32")
            tensor.set_data_from_numpy(data, binary_data=False)
            result = client.infer(
                "echo",
                [tensor],
                request_compression_algorithm=coding,
                response_compression_algorithm=coding,
            )
            assert result.as_numpy("output_0").tolist() == data.tolist()
        finally:
            client.close()


# -- serve --compress ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("transport", "choice", "message"),
    [
        ("http1", "deflate", "deflate is for grpc"),
        ("grpc", "zstd", "gzip or deflate"),
        ("tcp", "auto", "not tcp"),
    ],
)
def test_serve_refuses_a_compression_its_transport_has_not(
    transport: str, choice: str, message: str
) -> None:
    with pytest.raises(CommandError, match=message):
        serve.serve(serve.ServeOptions(transport=transport, compress=choice, no_metrics=True))


# -- gRPC --------------------------------------------------------------------------------


class CountingProxy:
    """A TCP relay that counts the bytes crossing it each way."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.up = 0
        self.down = 0
        self.server: asyncio.Server | None = None
        self.tasks: set[asyncio.Task[Any]] = set()

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        return f"127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.tasks.add(task)
        up_reader, up_writer = await asyncio.open_connection(*self.upstream)

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter, up: bool) -> None:
            while data := await src.read(65536):
                if up:
                    self.up += len(data)
                else:
                    self.down += len(data)
                dst.write(data)
                await dst.drain()
            dst.close()

        try:
            await asyncio.gather(pipe(reader, up_writer, True), pipe(up_reader, writer, False))
        except (OSError, asyncio.CancelledError):
            pass
        finally:
            for w in (writer, up_writer):
                w.close()
            self.tasks.discard(task)

    async def stop(self) -> None:
        assert self.server is not None
        self.server.close()
        for task in list(self.tasks):
            task.cancel()
        if self.tasks:
            await asyncio.wait(list(self.tasks), timeout=10)
        await self.server.wait_closed()


def _zeros_request(count: int) -> ic.InferRequest:
    data = np.zeros(count, np.float32)
    return ic.InferRequest(
        model="m", id="z", inputs=(ic.Tensor(name="x", datatype="FP32", shape=(count,), data=data),)
    )


async def _grpc_bytes(
    compression: str | None, *, server_limit: int = it.DEFAULT_MAX_MESSAGE_BYTES
) -> tuple[int, int]:
    """Bytes up and down for one compressible infer and one stream, grpc with ``compression``
    on both ends; both answers checked."""
    service = it.SimulatedService(token_stream_source)
    server_class: Any = it.server_class("grpc")  # its own options: compression
    server = server_class(
        service,
        ic.get("orjson", extensions=True),
        limits=it.Limits(max_message_bytes=server_limit),
        compression=compression,
    )
    host, port = await server.start()
    proxy = CountingProxy((host, port))
    try:
        address = await proxy.start()
        async with it.connect("grpc", address, compression=compression) as client:
            request = _zeros_request(64 << 10)
            response = await client.infer(request)
            assert response.outputs[0].data.tolist() == request.inputs[0].data.tolist()
            workload = it.GenerateRequest(workload="stream-256")
            assert [c async for c in client.generate(workload)] == expected_chunks(workload)
        return proxy.up, proxy.down
    finally:
        await proxy.stop()
        await server.stop()


def test_grpc_gzip_and_deflate_compress_both_ways() -> None:
    async def go() -> dict[str | None, tuple[int, int]]:
        return {c: await _grpc_bytes(c) for c in (None, "gzip", "deflate")}

    sizes = run(go())
    plain_up, plain_down = sizes[None]
    for coding in ("gzip", "deflate"):
        up, down = sizes[coding]
        assert up < plain_up / 4, (coding, sizes)  # 256 KiB of zeros, compressed
        assert down < plain_down / 2, (coding, sizes)


def test_a_compressed_grpc_bomb_is_refused_by_its_decoded_size() -> None:
    """A client's gzip message of a few KiB that decodes past the server's limit: grpcio's
    own bound on the decoded message, RESOURCE_EXHAUSTED, our MessageTooLargeError."""

    async def go() -> None:
        service = it.SimulatedService(token_stream_source)
        server = it.server_class("grpc")(
            service, ic.get("orjson", extensions=True), limits=it.Limits(max_message_bytes=1 << 20)
        )
        host, port = await server.start()
        proxy = CountingProxy((host, port))
        try:
            address = await proxy.start()
            async with it.connect("grpc", address, compression="gzip") as client:
                with pytest.raises(it.MessageTooLargeError):
                    await client.infer(_zeros_request(1 << 20))  # 4 MiB of zeros as JSON
            assert proxy.up < 1 << 20  # what crossed was under the limit: decoded, refused
        finally:
            await proxy.stop()
            await server.stop()

    run(go())
